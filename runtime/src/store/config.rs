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
//!     stream: true         # its text reaches followers as it grows
//!     limit: openai-main   # its calls draw from this limit
//!     tools:               # MCP servers whose tools the model may call
//!       fs:
//!         command: node
//!         args: ["server-filesystem/dist/index.js", "."]
//!         approve: [write_file]   # a person says yes before each call
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
//!   memory: 256MiB         # a sandbox limit (see crate::limits)
//!   openai-main:           # a provider limit, shared by every thread of every worker
//!     requests_per_minute: 500
//!     tokens_per_minute: 90000
//!     concurrent: 20
//! store: postgres://flows@db.internal/flows   # else the home directory keeps everything
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

use crate::duration::Seconds;
use crate::error::{Error, Result};
use crate::store::capacity::ProviderLimit;
use crate::store::registry::yaml_reason;
pub use crate::store::serve_config::{McpConfig, ServeConfig, TelemetryConfig};
use crate::store::tool_servers::ToolServer;

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
    /// Sandbox limits (see [`crate::limits`]), e.g. `memory: 256MiB`; an entry whose value is
    /// a mapping is a provider limit instead (see [`Config::provider_limits`]).
    #[serde(default)]
    pub limits: BTreeMap<String, serde_yaml::Value>,
    /// The provider limits of `limits:`, by name, read from it at load.
    #[serde(skip)]
    pub provider_limits: BTreeMap<String, ProviderLimit>,
    /// The store: a `postgres://` connection string, when `--store` and
    /// `UNCAGED_WORKFLOW_STORE` do not give one (the home directory otherwise).
    #[serde(default)]
    pub store: Option<String>,
    /// `serve`: where it listens, and where its token is.
    #[serde(default)]
    pub serve: ServeConfig,
    /// What tokens cost, by model: each step's and each thread's cost.
    #[serde(default)]
    pub prices: Prices,
    /// What each workflow's threads may spend unless a run says otherwise, by workflow.
    #[serde(default)]
    pub budgets: BTreeMap<String, BudgetConfig>,
    /// Where traces go (see [`crate::telemetry`]).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// The MCP server (`serve`'s `/mcp`, `uncaged-workflow mcp`): which workflows it offers as
    /// tools, and how long a call waits for its thread's end.
    #[serde(default)]
    pub mcp: McpConfig,
    /// Where waits on people are sent (see [`crate::store::notify_config`]).
    #[serde(default)]
    pub notify: crate::store::notify_config::NotifyConfig,
    /// Where relative paths in the file are resolved from.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// The `store:` of the config file at `path`, read on its own: a mistake elsewhere in the
/// file must not stop the commands that never read the rest (`threads`, `thread`); those that
/// do report it when they load the whole file.
pub fn store_url(path: &Path) -> Option<String> {
    string_at(path, &["store"])
}

/// The string at `keys` in the config file at `path`, if the file parses and has one there.
fn string_at(path: &Path, keys: &[&str]) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut value: &serde_yaml::Value = &serde_yaml::from_str(&text).ok()?;
    for key in keys {
        value = value.get(key)?;
    }
    value.as_str().map(str::to_string)
}

/// `telemetry.otlp_endpoint` of the config file at `path`, read on its own (as [`store_url`]
/// is): traces are set up before the command loads, and reports mistakes in, the whole file.
pub fn otlp_endpoint(path: &Path) -> Option<String> {
    string_at(path, &["telemetry", "otlp_endpoint"])
}

/// A workflow's default budget in `budgets:` (see [`crate::spending::Budget`]).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// US dollars.
    #[serde(default)]
    pub max_cost: Option<f64>,
    #[serde(default)]
    pub max_agent_calls: Option<u64>,
    #[serde(default)]
    pub max_duration: Option<Seconds>,
}

impl BudgetConfig {
    pub fn budget(&self) -> crate::spending::Budget {
        crate::spending::Budget {
            max_tokens: self.max_tokens,
            max_cost_usd: self.max_cost,
            max_agent_calls: self.max_agent_calls,
            max_duration_ms: self.max_duration.map(|d| d.0.as_millis() as u64),
        }
    }
}

/// `prices:` in config.yaml: model name → price.
pub type Prices = BTreeMap<String, Price>;

/// A model's price, in US dollars per million tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Input tokens served from the prompt cache [default: the input price].
    #[serde(default)]
    pub cached_input: Option<f64>,
}

impl Price {
    /// What `usage` costs at this price, in dollars.
    pub fn cost(&self, usage: &crate::store::records::Usage) -> f64 {
        let cached = usage.cached_tokens.min(usage.input_tokens);
        let fresh = usage.input_tokens - cached;
        (fresh as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + usage.output_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

/// One named agent binding: its kind and the failure policy of its calls. (Read by hand,
/// not with `#[serde(flatten)]`, which would hide from an error which key of the binding is
/// wrong.)
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub kind: AgentKind,
    /// Time one call may take [default: 600s for commands, 300s for openai].
    pub timeout: Option<Seconds>,
    /// Retries of a call that failed transiently (timeout, HTTP 429/5xx, exit status 75)
    /// [default: 2].
    pub retries: Option<u32>,
    /// Delay before the first retry; each next one waits twice as long [default: 1s].
    pub retry_delay: Option<Seconds>,
}

/// The kinds of agent.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentKind {
    /// Built-in, offline answers: from `answers` (YAML, per role) or from each role's schema.
    Scripted {
        answers: Option<PathBuf>,
        /// Wait this long before answering, to stand in for a slow agent (demos, benchmarks).
        delay: Option<Seconds>,
    },
    /// An external program, run without a shell.
    Command { command: String, args: Vec<String> },
    /// An OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM, llama.cpp…);
    /// with `tools`, a durable agent that calls the tools of MCP servers between its turns.
    OpenAi {
        /// e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`.
        base_url: String,
        model: String,
        /// Name of the environment variable holding the API key (none: no key is sent).
        api_key_env: Option<String>,
        temperature: Option<f64>,
        max_tokens: Option<u32>,
        /// Read each answer as a stream, its text published to followers as it grows.
        stream: bool,
        /// The most model turns one agent call may take with its tools [default: 20].
        max_turns: Option<u32>,
        /// The MCP servers whose tools the model may call, by name.
        tools: BTreeMap<String, ToolServer>,
        /// The provider limit (under `limits:`) its calls draw from.
        limit: Option<String>,
    },
    /// A person answers: on the terminal of a foreground `run`, else via `answer`.
    Human,
    /// Another agent, over A2A: its base URL (the agent card is under it), the environment
    /// variable holding its bearer token, the skill to ask for.
    A2a { url: String, token_env: Option<String>, skill: Option<String> },
}

/// The model turns an agent call with tools may take unless its binding says.
pub const DEFAULT_MAX_TURNS: u32 = 20;

impl<'de> Deserialize<'de> for AgentConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_map(BindingVisitor)
    }
}

/// Reads a binding's keys one at a time, each value as its own type: a deserializer that
/// tracks paths (see [`Config::load`]) then names the key whose value is wrong.
struct BindingVisitor;

impl<'de> serde::de::Visitor<'de> for BindingVisitor {
    type Value = AgentConfig;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an agent binding (a mapping with `kind`)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<AgentConfig, A::Error> {
        use serde::de::Error as _;
        let (mut kind, mut timeout, mut retries, mut retry_delay) = (None, None, None, None);
        let (mut answers, mut delay, mut command, mut args) = (None, None, None, None);
        let (mut base_url, mut model, mut api_key_env, mut temperature, mut max_tokens) =
            (None, None, None, None, None);
        let (mut stream, mut max_turns, mut tools) = (false, None, BTreeMap::new());
        let (mut limit, mut url, mut token_env, mut skill) = (None, None, None, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "kind" => kind = Some(map.next_value::<String>()?),
                "timeout" => timeout = map.next_value()?,
                "retries" => retries = map.next_value()?,
                "retry_delay" => retry_delay = map.next_value()?,
                "answers" => answers = map.next_value()?,
                "delay" => delay = map.next_value()?,
                "command" => command = Some(map.next_value::<String>()?),
                "args" => args = Some(map.next_value::<Vec<String>>()?),
                "base_url" => base_url = Some(map.next_value::<String>()?),
                "model" => model = Some(map.next_value::<String>()?),
                "api_key_env" => api_key_env = map.next_value()?,
                "temperature" => temperature = map.next_value()?,
                "max_tokens" => max_tokens = map.next_value()?,
                "stream" => stream = map.next_value()?,
                "max_turns" => max_turns = map.next_value()?,
                "tools" => tools = map.next_value::<BTreeMap<String, ToolServer>>()?,
                "limit" => limit = Some(map.next_value::<String>()?),
                "url" => url = Some(map.next_value::<String>()?),
                "token_env" => token_env = map.next_value::<Option<String>>()?,
                "skill" => skill = map.next_value::<Option<String>>()?,
                // Keys that belong to no kind are refused with a suggestion before this runs.
                other => return Err(A::Error::unknown_field(other, &[])),
            }
        }
        let kind = kind.ok_or_else(|| A::Error::missing_field("kind"))?;
        let kind = match kind.as_str() {
            "scripted" => AgentKind::Scripted { answers, delay },
            "command" => AgentKind::Command {
                command: command.ok_or_else(|| A::Error::missing_field("command"))?,
                args: args.unwrap_or_default(),
            },
            "openai" => {
                for (name, server) in &tools {
                    server.check().map_err(|e| A::Error::custom(format!("tools.{name}: {e}")))?;
                }
                if max_turns == Some(0) {
                    return Err(A::Error::custom("`max_turns` must be at least 1"));
                }
                AgentKind::OpenAi {
                    base_url: base_url.ok_or_else(|| A::Error::missing_field("base_url"))?,
                    model: model.ok_or_else(|| A::Error::missing_field("model"))?,
                    api_key_env,
                    temperature,
                    max_tokens,
                    stream,
                    max_turns,
                    tools,
                    limit,
                }
            }
            "human" => AgentKind::Human,
            "a2a" => {
                let url: String = url.ok_or_else(|| A::Error::missing_field("url"))?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(A::Error::custom(format!(
                        "url `{url}`: expected the agent's http(s):// address"
                    )));
                }
                if let Some(var) = token_env.as_deref() {
                    crate::env_name::check(var).map_err(A::Error::custom)?;
                }
                AgentKind::A2a { url, token_env, skill }
            }
            other => {
                return Err(A::Error::custom(format!(
                    "`kind: {other}` is no kind of agent (scripted, command, openai, human, a2a)"
                )));
            }
        };
        Ok(AgentConfig { kind, timeout, retries, retry_delay })
    }
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

impl Config {
    /// The URL and OAuth settings of the tool server named `name` in the bindings that name
    /// one: the server `tools login NAME` signs in to. Bindings that give the name to servers
    /// at different URLs are ambiguous (`BINDING.NAME` picks one).
    pub fn oauth_server(
        &self,
        name: &str,
    ) -> std::result::Result<(String, super::tool_servers::OAuthSettings), String> {
        let (binding, server) = match name.split_once('.') {
            Some((binding, server)) => (Some(binding), server),
            None => (None, name),
        };
        let mut found: Vec<(&str, &ToolServer)> = Vec::new();
        for (bound, agent) in &self.agents {
            if binding.is_some_and(|b| b != bound) {
                continue;
            }
            if let AgentKind::OpenAi { tools, .. } = &agent.kind
                && let Some(tool) = tools.get(server)
            {
                found.push((bound, tool));
            }
        }
        let shown = crate::terminal::line(name);
        let Some((_, first)) = found.first() else {
            return Err(format!("no binding in config.yaml has a tool server `{shown}`"));
        };
        if found.iter().any(|(_, s)| s.url != first.url) {
            let names: Vec<String> = found.iter().map(|(b, _)| format!("{b}.{server}")).collect();
            return Err(format!(
                "tool server `{shown}` is at different URLs in several bindings: name one of {}",
                names.join(", ")
            ));
        }
        match (&first.url, &first.oauth) {
            (Some(url), Some(settings)) => Ok((url.clone(), settings.clone())),
            _ => Err(format!(
                "tool server `{shown}` does not sign in with OAuth (give it a `url` and `oauth:`)"
            )),
        }
    }

    /// Reads `path`; a missing file is the empty config.
    pub fn load(path: &Path) -> Result<Self> {
        let Some(text) = crate::durable::read_text(path, "read config")? else {
            return Ok(Config::default());
        };
        let corrupt = |reason: String| Error::Corrupt { path: path.to_path_buf(), reason };
        let mut config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            let value: serde_yaml::Value =
                serde_yaml::from_str(&text).map_err(|e| corrupt(yaml_reason(&e)))?;
            check_keys(&value).map_err(corrupt)?;
            // A value of the wrong type is named by its whole path: `agents.reviewer.timeout`.
            serde_path_to_error::deserialize(value).map_err(|e| {
                let path = e.path().to_string();
                let reason = yaml_reason(e.inner());
                corrupt(if path == "." { reason } else { format!("{path}: {reason}") })
            })?
        };
        let bindings = config.agents.iter().filter_map(|(binding, agent)| match &agent.kind {
            AgentKind::OpenAi { limit: Some(limit), .. } => {
                Some((binding.as_str(), limit.as_str()))
            }
            _ => None,
        });
        config.provider_limits =
            crate::store::capacity::configured(&config.limits, bindings).map_err(corrupt)?;
        config.limits.retain(|name, _| !config.provider_limits.contains_key(name));
        // Limits are checked here too, so that a mistake names the file and the key.
        crate::limits::Limits::resolve(&config.limits, &Default::default()).map_err(
            |e| match e {
                Error::InvalidLimit { key, reason } => corrupt(format!("limits.{key}: {reason}")),
                other => other,
            },
        )?;
        config.notify.check().map_err(corrupt)?;
        config.serve.check().map_err(corrupt)?;
        config.base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(config)
    }
}

/// Keys of the top level.
const TOP_KEYS: &[&str] = &[
    "agent",
    "agents",
    "roles",
    "extractor",
    "limits",
    "serve",
    "prices",
    "budgets",
    "store",
    "telemetry",
    "mcp",
    "notify",
];
const MCP_KEYS: &[&str] = &["workflows", "wait", "task_after", "poll"];
const TELEMETRY_KEYS: &[&str] = &["otlp_endpoint"];
const BUDGET_KEYS: &[&str] = &["max_tokens", "max_cost", "max_agent_calls", "max_duration"];
const PRICE_KEYS: &[&str] = &["input", "output", "cached_input"];
const SERVE_KEYS: &[&str] = &[
    "listen",
    "token_env",
    "max_connections",
    "header_timeout",
    "idle_timeout",
    "max_body_bytes",
    "public_url",
];
/// Keys every agent binding may have, and those of each kind.
const BINDING_KEYS: &[&str] = &["kind", "timeout", "retries", "retry_delay"];
const KIND_KEYS: &[(&str, &[&str])] = &[
    ("scripted", &["answers", "delay"]),
    ("command", &["command", "args"]),
    (
        "openai",
        &[
            "base_url",
            "model",
            "api_key_env",
            "temperature",
            "max_tokens",
            "stream",
            "max_turns",
            "tools",
            "limit",
        ],
    ),
    ("human", &[]),
    ("a2a", &["url", "token_env", "skill"]),
];
const EXTRACTOR_KEYS: &[&str] = &["agent", "retries"];

/// Refuses a key the file may not have, naming where it is and the closest valid key: a
/// misspelt `api_key_envv` or `timout` would otherwise be ignored, and requests would go out
/// without a key or with the default timeout.
fn check_keys(value: &serde_yaml::Value) -> std::result::Result<(), String> {
    let Some(top) = value.as_mapping() else { return Ok(()) };
    known(top, TOP_KEYS, "")?;
    if let Some(agents) = top.get("agents").and_then(|a| a.as_mapping()) {
        for (name, binding) in agents {
            let Some(binding) = binding.as_mapping() else { continue };
            let name = name.as_str().unwrap_or("?");
            let kind = binding.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
            let Some((_, kind_keys)) = KIND_KEYS.iter().find(|(k, _)| *k == kind) else {
                // serde names the unknown kind, with the valid ones.
                continue;
            };
            let valid: Vec<&str> = BINDING_KEYS.iter().chain(kind_keys.iter()).copied().collect();
            known(binding, &valid, &format!("agents.{name}."))?;
            if let Some(tools) = binding.get("tools").and_then(|t| t.as_mapping()) {
                for (server, keys) in tools {
                    if let Some(keys) = keys.as_mapping() {
                        let at = format!("agents.{name}.tools.{}.", server.as_str().unwrap_or("?"));
                        known(keys, super::tool_servers::KEYS, &at)?;
                    }
                }
            }
        }
    }
    if let Some(extractor) = top.get("extractor").and_then(|e| e.as_mapping()) {
        known(extractor, EXTRACTOR_KEYS, "extractor.")?;
    }
    if let Some(serve) = top.get("serve").and_then(|s| s.as_mapping()) {
        known(serve, SERVE_KEYS, "serve.")?;
    }
    if let Some(mcp) = top.get("mcp").and_then(|m| m.as_mapping()) {
        known(mcp, MCP_KEYS, "mcp.")?;
    }
    if let Some(telemetry) = top.get("telemetry").and_then(|t| t.as_mapping()) {
        known(telemetry, TELEMETRY_KEYS, "telemetry.")?;
    }
    if let Some(budgets) = top.get("budgets").and_then(|b| b.as_mapping()) {
        for (workflow, budget) in budgets {
            if let Some(budget) = budget.as_mapping() {
                let workflow = workflow.as_str().unwrap_or("?");
                known(budget, BUDGET_KEYS, &format!("budgets.{workflow}."))?;
            }
        }
    }
    if let Some(prices) = top.get("prices").and_then(|p| p.as_mapping()) {
        for (model, price) in prices {
            if let Some(price) = price.as_mapping() {
                let model = model.as_str().unwrap_or("?");
                known(price, PRICE_KEYS, &format!("prices.{model}."))?;
            }
        }
    }
    if let Some(limits) = top.get("limits").and_then(|l| l.as_mapping()) {
        // A mapping is a provider limit, whose keys `capacity::configured` checks.
        let sandbox: serde_yaml::Mapping = limits
            .iter()
            .filter(|(_, v)| !v.is_mapping())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let valid: Vec<&str> = crate::limits::KEYS.split(", ").collect();
        known(&sandbox, &valid, "limits.")?;
    }
    Ok(())
}

fn known(
    mapping: &serde_yaml::Mapping,
    valid: &[&str],
    at: &str,
) -> std::result::Result<(), String> {
    for key in mapping.keys() {
        let key = key.as_str().unwrap_or("?");
        if !valid.contains(&key) {
            let hint = crate::error::closest(key, valid)
                .map_or_else(String::new, |near| format!("; did you mean `{at}{near}`?"));
            return Err(format!(
                "unknown key `{at}{key}`{hint} (valid here: {})",
                valid.join(", ")
            ));
        }
    }
    Ok(())
}
