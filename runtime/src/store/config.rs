//! `config.yaml`: named agent bindings, which agent serves which role, the LLM extractor, and
//! limits.
//!
//! ```yaml
//! agent: claude            # default binding for every role (else the built-in scripted agent)
//! agents:
//!   claude:
//!     kind: command
//!     command: claude-agent
//!     args: ["--model", "opus"]
//!     timeout: 600         # seconds, or a duration like 10m
//!   local:
//!     kind: openai
//!     base_url: http://localhost:11434/v1
//!     model: llama3.1
//!   demo:
//!     kind: scripted
//!     answers: answers.yaml   # relative to the config file
//!   me:
//!     kind: human
//! roles:
//!   reviewer: me
//! extractor:
//!   agent: local           # an openai binding
//!   retries: 2
//! limits:
//!   memory: 256MiB
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};
use crate::store::registry::yaml_reason;

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
    /// The LLM that extracts a role's meta when the agent's own text holds none.
    #[serde(default)]
    pub extractor: Option<ExtractorConfig>,
    /// Sandbox limits (see [`crate::limits`]), e.g. `memory: 256MiB`.
    #[serde(default)]
    pub limits: BTreeMap<String, serde_yaml::Value>,
    /// Where relative paths in the file are resolved from.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// One named agent binding: its kind and the failure policy of its calls.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AgentConfig {
    #[serde(flatten)]
    pub kind: AgentKind,
    /// Time one call may take [default: 600s for commands, 300s for openai].
    #[serde(default)]
    pub timeout: Option<Seconds>,
    /// Retries of a call that failed transiently (timeout, HTTP 429/5xx, exit status 75)
    /// [default: 2].
    #[serde(default)]
    pub retries: Option<u32>,
    /// Delay before the first retry; each next one waits twice as long [default: 1s].
    #[serde(default)]
    pub retry_delay: Option<Seconds>,
}

/// The kinds of agent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum AgentKind {
    /// Built-in, offline answers: from `answers` (YAML, per role) or from each role's schema.
    Scripted {
        #[serde(default)]
        answers: Option<PathBuf>,
        /// Wait this long before answering, to stand in for a slow agent (demos, benchmarks).
        #[serde(default)]
        delay: Option<Seconds>,
    },
    /// An external program, run without a shell.
    Command {
        command: String,
        #[serde(default)]
        args: Vec<String>,
    },
    /// An OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM, llama.cpp…).
    #[serde(rename = "openai")]
    OpenAi {
        /// e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`.
        base_url: String,
        model: String,
        /// Name of the environment variable holding the API key (none: no key is sent).
        #[serde(default)]
        api_key_env: Option<String>,
        #[serde(default)]
        temperature: Option<f64>,
        #[serde(default)]
        max_tokens: Option<u32>,
    },
    /// A person answers: on the terminal of a foreground `run`, else via `answer`.
    Human,
}

/// The LLM extractor.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtractorConfig {
    /// A binding of kind `openai` under `agents:`.
    pub agent: String,
    /// Further attempts after an answer that does not validate, each told why [default: 2].
    #[serde(default)]
    pub retries: Option<u32>,
}

/// A duration written as seconds (`90`, `0.5`) or with a unit (`500ms`, `2m`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seconds(pub Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match serde_yaml::Value::deserialize(d)? {
            serde_yaml::Value::Number(n) => n
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| Seconds(Duration::from_secs_f64(s)))
                .ok_or_else(|| {
                    serde::de::Error::custom(format!("`{n}` is not a number of seconds"))
                }),
            serde_yaml::Value::String(s) => humantime::parse_duration(&s)
                .map(Seconds)
                .map_err(|e| serde::de::Error::custom(format!("`{s}` is not a duration: {e}"))),
            other => Err(serde::de::Error::custom(format!(
                "expected seconds or a duration, got {other:?}"
            ))),
        }
    }
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
