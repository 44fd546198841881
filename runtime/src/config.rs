//! `config.yaml`: named agent bindings, which agent serves which role, and limits.
//!
//! ```yaml
//! agent: claude            # default binding for every role (else the built-in scripted agent)
//! agents:
//!   claude:
//!     kind: command
//!     command: claude-agent
//!     args: ["--model", "opus"]
//!     timeout: 600         # seconds
//!   demo:
//!     kind: scripted
//!     answers: answers.yaml   # relative to the config file
//! roles:
//!   reviewer: demo
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::registry::yaml_reason;

/// The whole of `config.yaml`. Every field is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Binding used for roles that nothing else binds.
    #[serde(default)]
    pub agent: Option<String>,
    /// Named bindings.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentConfig>,
    /// Role name → binding.
    #[serde(default)]
    pub roles: BTreeMap<String, String>,
    /// Sandbox limits (see [`crate::limits`]), e.g. `memory: 256MiB`.
    #[serde(default)]
    pub limits: BTreeMap<String, serde_yaml::Value>,
    /// Where relative paths in the file are resolved from.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// One named agent binding.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum AgentConfig {
    /// Built-in, offline answers: from `answers` (YAML, per role) or from each role's schema.
    Scripted {
        #[serde(default)]
        answers: Option<PathBuf>,
    },
    /// An external program, run without a shell.
    Command {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        /// Seconds before the program is killed.
        #[serde(default)]
        timeout: Option<u64>,
    },
}

impl Config {
    /// Reads `path`; a missing file is the empty config.
    pub fn load(path: &Path) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(e) => return Err(Error::io("read config", path)(e)),
        };
        let mut config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            serde_yaml::from_str(&text)
                .map_err(|e| Error::Corrupt { path: path.to_path_buf(), reason: yaml_reason(&e) })?
        };
        config.base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(config)
    }
}
