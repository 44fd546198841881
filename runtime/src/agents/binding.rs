//! Binding agents to roles: the specs a run request names (`--agent`, `--agent-for`) and
//! those of `config.yaml`, resolved into the agents of one thread, with the secrets of the
//! process that asked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use uncaged_workflow_declarative::{STATUS_ROLE, USER_ROLE};

use super::extract::LlmExtractor;
use super::{Agent, AgentProcesses, Bound, CommandAgent, OpenAiAgent, RetryPolicy, ScriptedAgent};
use crate::agent_spec::AgentSpec;
use crate::error::{Error, Result};
use crate::run_request::RunRequest;
use crate::store::config::{AgentConfig, AgentKind, Config};
use crate::store::descriptor::Descriptor;
use crate::store::limiter::Caller;

/// Values of the environment variables that bindings name for their secrets, taken from the
/// environment of the command a user ran and handed to the worker over its socket — never
/// written to disk. Their values are redacted from everything agents return.
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Secrets(BTreeMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl Secrets {
    /// The variables `config`'s bindings name, from this process's environment (those unset
    /// are left out: the binding that needs one says so when it is used).
    pub fn from_env(config: &Config) -> Self {
        // The API keys of openai bindings, and what their tool servers are given.
        let names = config.agents.values().flat_map(|a| match &a.kind {
            AgentKind::OpenAi { api_key_env, tools, .. } => api_key_env
                .iter()
                .map(String::as_str)
                .chain(tools.values().flat_map(|t| t.variables()))
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        });
        Secrets(
            names.filter_map(|var| std::env::var(&var).ok().map(|value| (var, value))).collect(),
        )
    }

    /// The value of `var`.
    pub fn get(&self, var: &str) -> Option<&str> {
        self.0.get(var).map(String::as_str)
    }

    /// `text` with every secret value replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_string();
        // Short values would redact ordinary words; no real key is that short.
        for value in self.0.values().filter(|v| v.len() >= MIN_SECRET_LEN) {
            if text.contains(value.as_str()) {
                text = text.replace(value.as_str(), "[redacted]");
            }
        }
        text
    }
}

/// The shortest secret value redacted.
const MIN_SECRET_LEN: usize = 6;

/// The agents of one thread, by role, and the LLM extractor if one is configured.
#[derive(Debug, Clone)]
pub struct AgentSet {
    /// The roles the bundle declares: the only ones an agent may be asked for.
    roles: BTreeSet<String>,
    default: Bound,
    by_role: BTreeMap<String, Bound>,
    extractor: Option<Arc<LlmExtractor>>,
}

impl AgentSet {
    /// Resolves bindings. Precedence for a role: `--agent-for`, then `roles:` in the config,
    /// then `--agent`, then `agent:` in the config, then the built-in scripted agent — except
    /// for the `$user` role of a declarative DAG, which a person answers unless it is bound.
    ///
    /// The descriptor supplies the roles' schemas, from which the scripted agent answers when
    /// it has no answers file, and lets a binding for a role the bundle lacks be refused.
    /// `caller` says for whom the calls are made, when they are a thread's: the provider limits
    /// their bindings name then hold them back (a check of the bindings makes no call).
    pub fn resolve(
        config: &Config,
        request: &RunRequest,
        secrets: &Secrets,
        descriptor: &Descriptor,
        caller: Option<&Caller>,
    ) -> Result<Self> {
        let secrets = Arc::new(secrets.clone());
        let prices = Arc::new(config.prices.clone());
        let binder = Binder {
            config,
            descriptor,
            cwd: request.cwd.as_deref(),
            secrets: &secrets,
            prices,
            approve: &request.approve,
            caller,
            bound: Default::default(),
        };
        let default = match (&request.agent, &config.agent) {
            (Some(spec), _) => binder.bind(spec, false)?,
            (None, Some(text)) => binder.bind(&configured(text)?, true)?,
            (None, None) => binder.bind(&AgentSpec::Scripted { answers: None }, false)?,
        };
        let mut by_role = BTreeMap::new();
        for (role, text) in &config.roles {
            by_role.insert(role.clone(), binder.bind(&configured(text)?, true)?);
        }
        for (role, spec) in &request.agent_for {
            if descriptor.role(role).is_none() {
                let known: Vec<_> = descriptor.roles.iter().map(|r| r.name.as_str()).collect();
                return Err(Error::InvalidAgent {
                    binding: format!("{role}={spec}"),
                    reason: format!(
                        "the workflow has no role `{role}` (roles: {})",
                        known.join(", ")
                    ),
                    in_config: false,
                });
            }
            by_role.insert(role.clone(), binder.bind(spec, false)?);
        }
        // A declarative DAG with the `ask_user` policy asks a person what to do about a failed
        // step: the role a person answers unless bound otherwise.
        if descriptor.role(USER_ROLE).is_some() && !by_role.contains_key(USER_ROLE) {
            by_role.insert(USER_ROLE.to_string(), binder.bind(&AgentSpec::Human, false)?);
        }
        let extractor = match &config.extractor {
            None => None,
            Some(extractor) => {
                let bound = binder.bind(&configured(&extractor.agent)?, true)?;
                let Agent::OpenAi(agent) = &*bound.agent else {
                    return Err(Error::InvalidAgent {
                        binding: extractor.agent.clone(),
                        reason: "the extractor must be a binding of kind `openai`".into(),
                        in_config: true,
                    });
                };
                Some(Arc::new(LlmExtractor {
                    agent: agent.clone(),
                    label: bound.label.clone(),
                    policy: bound.policy,
                    retries: extractor.retries.unwrap_or(2),
                    prices: binder.prices.clone(),
                }))
            }
        };
        // `$status` steps of a declarative DAG are records the interpreter writes; no agent
        // answers for them.
        let roles =
            descriptor.roles.iter().map(|r| r.name.clone()).filter(|r| r != STATUS_ROLE).collect();
        Ok(AgentSet { roles, default, by_role, extractor })
    }

    /// The same agents, listing the process groups they start in `processes`.
    pub fn with_processes(mut self, processes: Arc<AgentProcesses>) -> Self {
        for bound in std::iter::once(&mut self.default).chain(self.by_role.values_mut()) {
            bound.processes = Some(processes.clone());
        }
        self
    }

    /// The agent bound to `role`, if the bundle declares the role.
    pub fn for_role(&self, role: &str) -> Option<&Bound> {
        self.roles.contains(role).then(|| self.by_role.get(role).unwrap_or(&self.default))
    }

    /// The LLM extractor, if configured.
    pub fn extractor(&self) -> Option<&Arc<LlmExtractor>> {
        self.extractor.as_ref()
    }
}

/// Turns specs into bound agents.
struct Binder<'a> {
    config: &'a Config,
    descriptor: &'a Descriptor,
    cwd: Option<&'a Path>,
    secrets: &'a Arc<Secrets>,
    prices: Arc<crate::store::config::Prices>,
    /// Tools a person approves before each call, beside the bindings' own (`--approve`).
    approve: &'a [String],
    /// For whom the calls are made (see [`AgentSet::resolve`]).
    caller: Option<&'a Caller>,
    /// The bindings of config.yaml bound so far: roles bound to one binding share one agent
    /// in a thread (its tool servers, started once for all of them).
    bound: std::cell::RefCell<BTreeMap<String, Bound>>,
}

impl Binder<'_> {
    /// Binds an agent spec: a name from `agents:` in the config (which may name a binding
    /// `human`, say, over the built-in one), `scripted`, `scripted:FILE`, `human`, or
    /// `command:PROGRAM [ARGS]` (never run by a shell). `in_config` says where the spec was
    /// written, for the error if it is wrong.
    fn bind(&self, spec: &AgentSpec, in_config: bool) -> Result<Bound> {
        let label = spec.to_string();
        let invalid =
            |reason: String| Error::InvalidAgent { binding: label.clone(), reason, in_config };
        let cwd = self.cwd.map(Path::to_path_buf);
        if let Some(config) = self.config.agents.get(&label) {
            if let Some(bound) = self.bound.borrow().get(&label) {
                return Ok(bound.clone());
            }
            let bound = self.bind_config(&label, config)?;
            self.bound.borrow_mut().insert(label, bound.clone());
            return Ok(bound);
        }
        let agent = match spec {
            AgentSpec::Scripted { answers } => {
                let agent = ScriptedAgent::new(answers.as_deref(), self.descriptor);
                Agent::Scripted(if in_config {
                    agent.map_err(in_binding(&invalid))?
                } else {
                    agent?
                })
            }
            AgentSpec::Human => Agent::Human,
            AgentSpec::Command { program, args } => Agent::Command(
                CommandAgent::new(program.clone(), args.clone(), None, cwd).map_err(invalid)?,
            ),
            AgentSpec::Named(_) => {
                return Err(invalid(
                    "not defined under `agents:` in config.yaml, and not `scripted`, \
                     `scripted:FILE`, `human` or `command:PROGRAM [ARGS]`"
                        .into(),
                ));
            }
        };
        Ok(Bound {
            label,
            agent: Arc::new(agent),
            policy: RetryPolicy::default(),
            secrets: self.secrets.clone(),
            processes: None,
            prices: self.prices.clone(),
        })
    }

    fn bind_config(&self, name: &str, config: &AgentConfig) -> Result<Bound> {
        let invalid = |reason: String| Error::InvalidAgent {
            binding: name.to_string(),
            reason,
            in_config: true,
        };
        let timeout = config.timeout.map(|t| t.0);
        let agent = match &config.kind {
            AgentKind::Scripted { answers, delay } => {
                let file = answers.as_ref().map(|path| self.config.base_dir.join(path));
                let agent = ScriptedAgent::new(file.as_deref(), self.descriptor)
                    .map_err(in_binding(&invalid))?;
                Agent::Scripted(agent.with_delay(delay.map(|d| d.0)))
            }
            AgentKind::Command { command, args } => Agent::Command(
                CommandAgent::new(
                    command.clone(),
                    args.clone(),
                    timeout,
                    self.cwd.map(Path::to_path_buf),
                )
                .map_err(invalid)?,
            ),
            AgentKind::OpenAi { .. } => Agent::OpenAi(
                OpenAiAgent::from_config(
                    &config.kind,
                    timeout,
                    self.secrets,
                    self.cwd,
                    &self.config.provider_limits,
                    self.caller,
                )
                .map_err(invalid)?
                .approving(self.approve),
            ),
            AgentKind::Human => Agent::Human,
            AgentKind::A2a { url, token_env, skill } => Agent::A2a(super::a2a::A2aAgent {
                url: url.clone(),
                token_env: token_env.clone(),
                skill: skill.clone(),
                timeout: timeout.unwrap_or(super::a2a::DEFAULT_TIMEOUT),
            }),
        };
        let defaults = RetryPolicy::default();
        let policy = RetryPolicy {
            max_retries: config.retries.unwrap_or(defaults.max_retries),
            initial_delay: config.retry_delay.map_or(defaults.initial_delay, |d| d.0),
        };
        Ok(Bound {
            label: name.to_string(),
            agent: Arc::new(agent),
            policy,
            secrets: self.secrets.clone(),
            processes: None,
            prices: self.prices.clone(),
        })
    }
}

/// A binding written in config.yaml whose file (scripted answers) is missing or does not parse
/// is a bad binding in config.yaml (exit 65), as the exit-code table says; only a file named on
/// the command line that is missing is "not found" (66).
fn in_binding(invalid: &impl Fn(String) -> Error) -> impl Fn(Error) -> Error + '_ {
    move |e| match e {
        Error::MissingFile { .. } | Error::Corrupt { .. } => invalid(e.to_string()),
        other => other,
    }
}

/// An agent spec written in config.yaml (`agent:`, `roles:`, the extractor's `agent:`).
fn configured(text: &str) -> Result<AgentSpec> {
    text.parse().map_err(|reason| Error::InvalidAgent {
        binding: text.to_string(),
        reason,
        in_config: true,
    })
}

/// Parses an agent spec given on the command line, and checks what can be checked where it
/// was given: the program of a `command:` spec exists (relative to the current directory) and
/// is executable. Names of config bindings are checked when the config is read.
pub fn parse_agent_spec(text: &str) -> std::result::Result<AgentSpec, String> {
    let spec: AgentSpec = text.parse()?;
    if let AgentSpec::Command { program, .. } = &spec {
        super::command::find_program(program, None)?;
    }
    Ok(spec)
}

/// Parses `ROLE=AGENT` from `--agent-for` (the agent checked as by [`parse_agent_spec`]).
pub fn parse_role_binding(text: &str) -> std::result::Result<(String, AgentSpec), String> {
    match text.split_once('=') {
        Some((role, agent)) if !role.is_empty() && !agent.is_empty() => {
            Ok((role.to_string(), parse_agent_spec(agent)?))
        }
        _ => Err(format!("expected ROLE=AGENT, got `{text}`")),
    }
}
