//! Agents: the execution capability behind a role, bound by the host from `config.yaml` and
//! CLI flags — never by the bundle.

pub mod command;
pub mod scripted;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::config::{AgentConfig, Config};
use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::thread_log::StepRecord;

pub use command::CommandAgent;
pub use scripted::ScriptedAgent;

/// What an agent is told: the thread so far and the role it answers as. This is also the JSON
/// a `command` agent reads on stdin.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentContext {
    pub thread_id: String,
    pub prompt: String,
    pub steps: Vec<StepRecord>,
    pub role: RoleRef,
}

/// The role an agent answers as.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleRef {
    pub name: String,
    pub system_prompt: String,
}

/// An agent's answer: its text, and the structured meta if the agent gave one itself.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentAnswer {
    pub content: String,
    pub meta: Option<serde_json::Value>,
}

/// Why an agent gave no answer. Becomes the WIT `agent-error` the bundle sees.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentFailure {
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Failed(String),
    #[error("{0}")]
    Timeout(String),
}

/// A bound agent.
#[derive(Debug)]
pub enum Agent {
    Scripted(ScriptedAgent),
    Command(CommandAgent),
}

impl Agent {
    /// Asks the agent.
    pub async fn answer(&self, context: &AgentContext) -> Result<AgentAnswer, AgentFailure> {
        match self {
            Agent::Scripted(agent) => agent.answer(context),
            Agent::Command(agent) => agent.answer(context).await,
        }
    }

    fn from_config(
        name: &str,
        config: &AgentConfig,
        base_dir: &Path,
        descriptor: &Descriptor,
        cwd: Option<&Path>,
    ) -> Result<Agent> {
        Ok(match config {
            AgentConfig::Scripted { answers } => {
                let file = answers.as_ref().map(|path| base_dir.join(path));
                Agent::Scripted(
                    ScriptedAgent::new(file.as_deref(), descriptor).map_err(|reason| {
                        Error::InvalidAgent { binding: name.to_string(), reason }
                    })?,
                )
            }
            AgentConfig::Command { command, args, timeout } => Agent::Command(CommandAgent::new(
                command.clone(),
                args.clone(),
                *timeout,
                cwd.map(Path::to_path_buf),
            )),
        })
    }
}

/// Agent choices given on the command line (`--agent`, `--agent-for role=A`), and the
/// directory they were given in.
#[derive(Debug, Clone, Default)]
pub struct AgentFlags {
    /// `--agent`: the binding for every role not bound more specifically.
    pub default: Option<String>,
    /// `--agent-for role=A`, in order; a later one for the same role wins.
    pub for_roles: Vec<(String, String)>,
    /// Where command agents run, and what relative paths in specs are relative to.
    pub cwd: Option<std::path::PathBuf>,
}

impl AgentFlags {
    /// Makes relative paths in `scripted:FILE` and `command:./PROGRAM` specs absolute against
    /// `cwd`, so the specs mean the same in a worker started elsewhere.
    pub fn absolutize(mut self, cwd: &Path) -> Self {
        let fix = |spec: &mut String| *spec = absolutize_spec(spec, cwd);
        if let Some(spec) = &mut self.default {
            fix(spec);
        }
        for (_, spec) in &mut self.for_roles {
            fix(spec);
        }
        self.cwd = Some(cwd.to_path_buf());
        self
    }
}

fn absolutize_spec(spec: &str, cwd: &Path) -> String {
    if let Some(path) = spec.strip_prefix("scripted:") {
        return format!("scripted:{}", cwd.join(path).display());
    }
    if let Some(command_line) = spec.strip_prefix("command:")
        && let Some(mut words) = shlex::split(command_line)
        && let Some(program) = words.first_mut()
        && program.contains('/')
        && !program.starts_with('/')
    {
        *program = cwd.join(&*program).display().to_string();
        let quoted = shlex::try_join(words.iter().map(String::as_str)).unwrap_or_default();
        return format!("command:{quoted}");
    }
    spec.to_string()
}

/// The agents of one thread, by role.
#[derive(Debug, Clone)]
pub struct AgentSet {
    default: Bound,
    by_role: BTreeMap<String, Bound>,
}

/// An agent with the name it was bound by, for logs and progress.
#[derive(Debug, Clone)]
pub struct Bound {
    pub label: String,
    pub agent: Arc<Agent>,
}

impl AgentSet {
    /// Resolves bindings. Precedence for a role: `--agent-for`, then `roles:` in the config,
    /// then `--agent`, then `agent:` in the config, then the built-in scripted agent.
    ///
    /// The descriptor supplies the roles' schemas, from which the scripted agent answers when
    /// it has no answers file, and lets a binding for a role the bundle lacks be refused.
    pub fn resolve(config: &Config, flags: &AgentFlags, descriptor: &Descriptor) -> Result<Self> {
        let default_spec =
            flags.default.as_deref().or(config.agent.as_deref()).unwrap_or("scripted");
        let cwd = flags.cwd.as_deref();
        let default = bind(config, default_spec, descriptor, cwd)?;
        let mut by_role = BTreeMap::new();
        for (role, spec) in &config.roles {
            by_role.insert(role.clone(), bind(config, spec, descriptor, cwd)?);
        }
        for (role, spec) in &flags.for_roles {
            if descriptor.role(role).is_none() {
                let known: Vec<_> = descriptor.roles.iter().map(|r| r.name.as_str()).collect();
                return Err(Error::InvalidAgent {
                    binding: format!("{role}={spec}"),
                    reason: format!(
                        "the workflow has no role `{role}` (roles: {})",
                        known.join(", ")
                    ),
                });
            }
            by_role.insert(role.clone(), bind(config, spec, descriptor, cwd)?);
        }
        Ok(AgentSet { default, by_role })
    }

    /// The agent bound to `role`.
    pub fn for_role(&self, role: &str) -> &Bound {
        self.by_role.get(role).unwrap_or(&self.default)
    }
}

/// Parses an agent spec: a name from `agents:` in the config, `scripted`, `scripted:FILE` or
/// `command:PROGRAM [ARGS]` (split like a shell would, but never run by one).
fn bind(config: &Config, spec: &str, descriptor: &Descriptor, cwd: Option<&Path>) -> Result<Bound> {
    let invalid = |reason: String| Error::InvalidAgent { binding: spec.to_string(), reason };
    let agent = if let Some(agent) = config.agents.get(spec) {
        Agent::from_config(spec, agent, &config.base_dir, descriptor, cwd)?
    } else if spec == "scripted" {
        Agent::Scripted(ScriptedAgent::new(None, descriptor).map_err(invalid)?)
    } else if let Some(path) = spec.strip_prefix("scripted:") {
        Agent::Scripted(ScriptedAgent::new(Some(Path::new(path)), descriptor).map_err(invalid)?)
    } else if let Some(command_line) = spec.strip_prefix("command:") {
        let mut words = shlex::split(command_line)
            .filter(|w| !w.is_empty())
            .ok_or_else(|| invalid("cannot split the command line (unbalanced quotes?)".into()))?;
        if words.is_empty() {
            return Err(invalid("no program given after `command:`".into()));
        }
        let program = words.remove(0);
        Agent::Command(CommandAgent::new(program, words, None, cwd.map(Path::to_path_buf)))
    } else {
        return Err(invalid(
            "not defined under `agents:` in config.yaml, and not `scripted`, `scripted:FILE` or \
             `command:PROGRAM [ARGS]`"
                .into(),
        ));
    };
    Ok(Bound { label: spec.to_string(), agent: Arc::new(agent) })
}

/// Parses `role=AGENT` from `--agent-for`.
pub fn parse_role_binding(text: &str) -> std::result::Result<(String, String), String> {
    match text.split_once('=') {
        Some((role, agent)) if !role.is_empty() && !agent.is_empty() => {
            Ok((role.to_string(), agent.to_string()))
        }
        _ => Err(format!("expected ROLE=AGENT, got `{text}`")),
    }
}
