//! Agents: the execution capability behind a role, bound by the host from `config.yaml` and
//! CLI flags — never by the bundle — and the failure policy every call goes through.

pub mod command;
pub mod openai;
pub mod scripted;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{AgentConfig, AgentKind, Config};
use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::extract::LlmExtractor;
use crate::thread_log::{InfoLog, StepRecord};

pub use command::CommandAgent;
pub use openai::OpenAiAgent;
pub use scripted::ScriptedAgent;

/// Log tag of agent call attempts.
const TAG_ATTEMPT: &str = "AGT9RY5E";

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

impl AgentContext {
    /// The thread rendered for a reader (a model or a person): the task, each step so far,
    /// and whose turn it is.
    pub fn render(&self) -> String {
        let mut text = format!("# Task\n\n{}\n", self.prompt.trim());
        for (i, step) in self.steps.iter().enumerate() {
            text.push_str(&format!(
                "\n# Step {}: {}\n\n{}\n",
                i + 1,
                step.role,
                step.content.trim()
            ));
        }
        text.push_str(&format!(
            "\n# Your turn\n\nYou are the {}. Answer as the {}.\n",
            self.role.name, self.role.name
        ));
        text
    }
}

/// An agent's answer: its text, and the structured meta if the agent gave one itself.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentAnswer {
    pub content: String,
    pub meta: Option<serde_json::Value>,
}

/// Why an agent gave no answer. All but `Waiting` become the WIT `agent-error` the bundle sees.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentFailure {
    /// The binding cannot be used (program missing, no key…). Not retried.
    #[error("{0}")]
    Unavailable(String),
    /// The agent ran and failed. Retried if `transient`.
    #[error("{message}")]
    Failed { message: String, transient: bool },
    /// No answer in time. Retried.
    #[error("{0}")]
    Timeout(String),
    /// A person must answer and nobody is at a terminal: the thread waits for `answer`.
    #[error("waiting for a human answer")]
    Waiting,
}

impl AgentFailure {
    /// A permanent failure.
    pub fn failed(message: impl Into<String>) -> Self {
        AgentFailure::Failed { message: message.into(), transient: false }
    }

    /// Is a retry worth it?
    pub fn is_transient(&self) -> bool {
        matches!(self, AgentFailure::Timeout(_) | AgentFailure::Failed { transient: true, .. })
    }
}

/// A bound agent.
#[derive(Debug)]
pub enum Agent {
    Scripted(ScriptedAgent),
    Command(CommandAgent),
    OpenAi(OpenAiAgent),
    /// Answered by a person, through the host (see [`crate::human`]).
    Human,
}

impl Agent {
    /// Asks the agent once. A `Human` agent is answered by the host, not here.
    pub async fn answer(&self, context: &AgentContext) -> Result<AgentAnswer, AgentFailure> {
        match self {
            Agent::Scripted(agent) => {
                if let Some(delay) = agent.delay() {
                    tokio::time::sleep(delay).await;
                }
                agent.answer(context)
            }
            Agent::Command(agent) => agent.answer(context).await,
            Agent::OpenAi(agent) => agent.answer(context).await,
            Agent::Human => Err(AgentFailure::Waiting),
        }
    }
}

/// Retries of transient failures, with exponential backoff (factor 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub initial_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_retries: 2, initial_delay: Duration::from_secs(1) }
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

/// The agents of one thread, by role, and the LLM extractor if one is configured.
#[derive(Debug, Clone)]
pub struct AgentSet {
    default: Bound,
    by_role: BTreeMap<String, Bound>,
    extractor: Option<Arc<LlmExtractor>>,
}

/// An agent with the name it was bound by (for logs and progress) and its failure policy.
#[derive(Debug, Clone)]
pub struct Bound {
    pub label: String,
    pub agent: Arc<Agent>,
    pub policy: RetryPolicy,
}

impl Bound {
    /// Asks the agent under its failure policy (see [`with_retries`]).
    pub async fn answer(
        &self,
        context: &AgentContext,
        info: &InfoLog,
    ) -> Result<AgentAnswer, AgentFailure> {
        let what = format!("role `{}`: agent `{}`", context.role.name, self.label);
        with_retries(self.policy, info, &what, || self.agent.answer(context)).await
    }
}

/// Runs `call` until it succeeds, fails permanently, or has failed transiently
/// `policy.max_retries + 1` times, waiting `initial_delay`, then twice as long, between
/// attempts. Every failed attempt is written to the thread's debug log.
pub async fn with_retries<T, F, Fut>(
    policy: RetryPolicy,
    info: &InfoLog,
    what: &str,
    mut call: F,
) -> Result<T, AgentFailure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, AgentFailure>>,
{
    let mut delay = policy.initial_delay;
    let attempts = policy.max_retries + 1;
    let mut attempt = 1;
    loop {
        let started = Instant::now();
        let failure = match call().await {
            Ok(value) => return Ok(value),
            Err(AgentFailure::Waiting) => return Err(AgentFailure::Waiting),
            Err(failure) => failure,
        };
        let ms = started.elapsed().as_millis();
        let retry = failure.is_transient() && attempt < attempts;
        info.write(
            "warn",
            TAG_ATTEMPT,
            &format!(
                "{what} attempt {attempt}/{attempts} failed after {ms} ms ({}): {failure}{}",
                if failure.is_transient() { "transient" } else { "permanent" },
                if retry {
                    format!("; retrying in {}", humantime::format_duration(delay))
                } else {
                    String::new()
                }
            ),
        );
        if !retry {
            return Err(match failure {
                AgentFailure::Failed { message, transient } if attempt > 1 => {
                    AgentFailure::Failed {
                        message: format!("{message} (after {attempt} attempts)"),
                        transient,
                    }
                }
                AgentFailure::Timeout(message) if attempt > 1 => {
                    AgentFailure::Timeout(format!("{message} (after {attempt} attempts)"))
                }
                other => other,
            });
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
        attempt += 1;
    }
}

impl AgentSet {
    /// Resolves bindings. Precedence for a role: `--agent-for`, then `roles:` in the config,
    /// then `--agent`, then `agent:` in the config, then the built-in scripted agent.
    ///
    /// The descriptor supplies the roles' schemas, from which the scripted agent answers when
    /// it has no answers file, and lets a binding for a role the bundle lacks be refused.
    pub fn resolve(config: &Config, flags: &AgentFlags, descriptor: &Descriptor) -> Result<Self> {
        let binder = Binder { config, descriptor, cwd: flags.cwd.as_deref() };
        let default_spec =
            flags.default.as_deref().or(config.agent.as_deref()).unwrap_or("scripted");
        let default = binder.bind(default_spec)?;
        let mut by_role = BTreeMap::new();
        for (role, spec) in &config.roles {
            by_role.insert(role.clone(), binder.bind(spec)?);
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
            by_role.insert(role.clone(), binder.bind(spec)?);
        }
        let extractor = match &config.extractor {
            None => None,
            Some(extractor) => {
                let bound = binder.bind(&extractor.agent)?;
                let Agent::OpenAi(agent) = &*bound.agent else {
                    return Err(Error::InvalidAgent {
                        binding: extractor.agent.clone(),
                        reason: "the extractor must be a binding of kind `openai`".into(),
                    });
                };
                Some(Arc::new(LlmExtractor {
                    agent: agent.clone(),
                    label: bound.label.clone(),
                    policy: bound.policy,
                    retries: extractor.retries.unwrap_or(2),
                }))
            }
        };
        Ok(AgentSet { default, by_role, extractor })
    }

    /// The agent bound to `role`.
    pub fn for_role(&self, role: &str) -> &Bound {
        self.by_role.get(role).unwrap_or(&self.default)
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
}

impl Binder<'_> {
    /// Parses an agent spec: a name from `agents:` in the config, `scripted`, `scripted:FILE`,
    /// `human`, or `command:PROGRAM [ARGS]` (split like a shell would, but never run by one).
    fn bind(&self, spec: &str) -> Result<Bound> {
        let invalid = |reason: String| Error::InvalidAgent { binding: spec.to_string(), reason };
        let cwd = self.cwd.map(Path::to_path_buf);
        if let Some(config) = self.config.agents.get(spec) {
            return self.bind_config(spec, config);
        }
        let agent = if spec == "scripted" {
            Agent::Scripted(ScriptedAgent::new(None, self.descriptor).map_err(invalid)?)
        } else if let Some(path) = spec.strip_prefix("scripted:") {
            Agent::Scripted(
                ScriptedAgent::new(Some(Path::new(path)), self.descriptor).map_err(invalid)?,
            )
        } else if spec == "human" {
            Agent::Human
        } else if let Some(command_line) = spec.strip_prefix("command:") {
            let mut words =
                shlex::split(command_line).filter(|w| !w.is_empty()).ok_or_else(|| {
                    invalid("cannot split the command line (unbalanced quotes?)".into())
                })?;
            if words.is_empty() {
                return Err(invalid("no program given after `command:`".into()));
            }
            let program = words.remove(0);
            Agent::Command(CommandAgent::new(program, words, None, cwd))
        } else {
            return Err(invalid(
                "not defined under `agents:` in config.yaml, and not `scripted`, `scripted:FILE`, \
                 `human` or `command:PROGRAM [ARGS]`"
                    .into(),
            ));
        };
        Ok(Bound {
            label: spec.to_string(),
            agent: Arc::new(agent),
            policy: RetryPolicy::default(),
        })
    }

    fn bind_config(&self, name: &str, config: &AgentConfig) -> Result<Bound> {
        let invalid = |reason: String| Error::InvalidAgent { binding: name.to_string(), reason };
        let timeout = config.timeout.map(|t| t.0);
        let agent = match &config.kind {
            AgentKind::Scripted { answers, delay } => {
                let file = answers.as_ref().map(|path| self.config.base_dir.join(path));
                let agent =
                    ScriptedAgent::new(file.as_deref(), self.descriptor).map_err(invalid)?;
                Agent::Scripted(agent.with_delay(delay.map(|d| d.0)))
            }
            AgentKind::Command { command, args } => Agent::Command(CommandAgent::new(
                command.clone(),
                args.clone(),
                timeout,
                self.cwd.map(Path::to_path_buf),
            )),
            AgentKind::OpenAi { .. } => {
                Agent::OpenAi(OpenAiAgent::from_config(&config.kind, timeout).map_err(invalid)?)
            }
            AgentKind::Human => Agent::Human,
        };
        let defaults = RetryPolicy::default();
        let policy = RetryPolicy {
            max_retries: config.retries.unwrap_or(defaults.max_retries),
            initial_delay: config.retry_delay.map_or(defaults.initial_delay, |d| d.0),
        };
        Ok(Bound { label: name.to_string(), agent: Arc::new(agent), policy })
    }
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
