//! The options of the command line below its commands: the global options every command
//! takes, and the flag groups commands share — a new thread's prompt and trigger data, what
//! its run is asked (agents, rounds, limits, budget: parsed once into the library's
//! [`RunRequest`]), and how a command follows the thread it hands over. Commands import these;
//! these import no command (wasmtime's `RunCommon` below its commands, taken as the model).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::agent_spec::AgentSpec;
use crate::agents::binding::{parse_agent_spec, parse_role_binding};
use crate::error::{Error, Result};
use crate::home::{HOME_ENV, Home};
use crate::limits::LimitOverrides;
use crate::run::actions::Hand;
use crate::run_request::RunRequest;
use crate::store::Storage;
use crate::store::records::Budget;

/// Options every command takes.
#[derive(Debug, Args)]
pub struct GlobalOptions {
    /// Home directory of registry, bundles and threads [default: ~/.uncaged/workflow]
    #[arg(long, global = true, env = HOME_ENV, value_name = "DIR", hide_env_values = true)]
    pub home: Option<PathBuf>,

    /// Keep registry, bundles, threads and schedules in PostgreSQL (postgres://…, TLS by
    /// `?sslmode=verify-full&sslrootcert=PATH`, a client certificate by `&sslcert=…&sslkey=…`)
    /// instead of the home directory; config.yaml's `store:` when not given
    #[arg(long, global = true, env = crate::store::STORE_ENV, value_name = "URL", hide_env_values = true)]
    pub store: Option<String>,

    /// More diagnostics on stderr (-v: info, -vv: debug); RUST_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// When to colour output: on a terminal unless NO_COLOR is set (auto), always, never
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value = "auto")]
    pub color: crate::terminal::ColorChoice,
}

impl GlobalOptions {
    /// The home directory to work in.
    pub fn home(&self) -> crate::Result<Home> {
        match &self.home {
            Some(dir) => Ok(Home::new(dir)),
            None => Home::from_env(),
        }
    }

    /// The store to work on.
    pub fn store(&self) -> crate::Result<Storage> {
        let home = self.home()?;
        let url = match &self.store {
            Some(url) => Some(url.clone()),
            None => crate::store::config::store_url(&home.config_file()),
        };
        Storage::connect(&home, url.as_deref())
    }
}

/// The prompt of a new thread: given, read from standard input (`-p -`), or from a file.
#[derive(Debug, Clone, Args)]
pub struct PromptArgs {
    /// The prompt: what the thread is to do (`-` reads it from standard input)
    #[arg(short, long, required_unless_present = "prompt_file", conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the prompt from this file
    #[arg(long, value_name = "PATH")]
    pub prompt_file: Option<std::path::PathBuf>,
}

impl PromptArgs {
    /// The most a prompt read from a file or standard input may hold.
    const MAX: u64 = 16 << 20;

    /// The prompt's text.
    pub fn text(&self) -> Result<String> {
        use std::io::Read;
        let (what, reader): (std::path::PathBuf, Box<dyn Read>) =
            match (self.prompt.as_deref(), &self.prompt_file) {
                (Some("-"), _) => ("standard input".into(), Box::new(std::io::stdin())),
                (Some(text), _) => return Ok(text.to_string()),
                (None, Some(path)) => {
                    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
                        std::io::ErrorKind::NotFound => {
                            Error::MissingFile { what: "prompt file", path: path.clone() }
                        }
                        _ => Error::io("read the prompt file", path)(e),
                    })?;
                    (path.clone(), Box::new(file))
                }
                (None, None) => return Err(Error::Usage("give the prompt: -p TEXT".into())),
            };
        let mut bytes = Vec::new();
        reader
            .take(Self::MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(Error::io("read the prompt from", &what))?;
        if bytes.len() as u64 > Self::MAX {
            return Err(Error::Usage(format!(
                "the prompt in {} is over its limit of 16 MiB",
                what.display()
            )));
        }
        String::from_utf8(bytes).map_err(|_| {
            Error::Usage(format!("the prompt in {} is not UTF-8 text", what.display()))
        })
    }
}

/// Data for a thread, as a trigger would pass it.
#[derive(Debug, Clone, Args)]
pub struct TriggerArgs {
    /// JSON handed to the bundle as `run-input.trigger-data` and kept in the start record,
    /// as a schedule or a poll passes its item (at most 1 MiB); checked against the
    /// workflow's input schema (`show` prints it)
    #[arg(long, visible_alias = "data", value_name = "JSON")]
    pub trigger_data: Option<String>,
}

impl TriggerArgs {
    /// The trigger data, parsed.
    pub fn value(&self) -> crate::Result<Option<serde_json::Value>> {
        const MAX: usize = 1 << 20;
        let Some(text) = &self.trigger_data else { return Ok(None) };
        if text.len() > MAX {
            return Err(crate::Error::Usage(format!(
                "--trigger-data is {} bytes, over its limit of 1 MiB",
                text.len()
            )));
        }
        serde_json::from_str(text)
            .map(Some)
            .map_err(|e| crate::Error::Usage(format!("--trigger-data is not JSON: {e}")))
    }
}

/// Agent choices for a thread.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Agent for every role not bound more specifically (see `run --help`)
    #[arg(long, value_name = "AGENT", value_parser = parse_agent_spec)]
    pub agent: Option<AgentSpec>,
    /// Agent for one role (repeatable)
    #[arg(long, value_name = "ROLE=AGENT", value_parser = parse_role_binding)]
    pub agent_for: Vec<(String, AgentSpec)>,
    /// A durable agent's tool that a person approves before each call, in this thread, beside
    /// its binding's `approve:` (repeatable): SERVER.TOOL, or SERVER.* for all its tools
    #[arg(long, value_name = "SERVER.TOOL", value_parser = parse_tool_pattern)]
    pub approve: Vec<String>,
}

/// `--approve`: `server.tool` or `server.*`.
fn parse_tool_pattern(text: &str) -> std::result::Result<String, String> {
    match text.split_once('.') {
        Some((server, tool)) if !server.is_empty() && !tool.is_empty() => Ok(text.to_string()),
        _ => Err(format!(
            "`{}` is not SERVER.TOOL (a tool server's name in config.yaml, a dot, and one of \
             its tools, or `*` for all of them)",
            crate::terminal::line(text)
        )),
    }
}

impl AgentArgs {
    /// The run request these flags ask for (later `--agent-for` of a role winning), with
    /// relative paths made absolute against the current directory, which is its directory.
    pub fn request(&self) -> Result<RunRequest> {
        let request = RunRequest {
            agent: self.agent.clone(),
            agent_for: self.agent_for.iter().cloned().collect(),
            approve: self.approve.clone(),
            ..Default::default()
        };
        Ok(request.absolutize(&crate::run::lifecycle::current_dir()?))
    }

    /// What a run of an existing thread is asked on top of its recorded request: these
    /// flags' request if any was given, else nothing (approvals alone keep the thread's
    /// directory).
    pub fn overrides(&self) -> Result<RunRequest> {
        if self.agent.is_none() && self.agent_for.is_empty() {
            Ok(RunRequest { approve: self.approve.clone(), ..Default::default() })
        } else {
            self.request()
        }
    }
}

/// Sandbox limits for a new thread, recorded with it.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Override a sandbox limit for this thread (repeatable): cpu-per-step=5s, memory=256MiB,
    /// table-elements=N, string=4MiB, output=1MiB, max-rounds=N
    #[arg(long = "limit", value_name = "KEY=VALUE", value_parser = crate::limits::parse_limit_flag)]
    pub limits: Vec<(String, String)>,
}

impl LimitArgs {
    /// The overrides, later ones winning.
    pub fn overrides(&self) -> Result<LimitOverrides> {
        LimitOverrides::from_pairs(self.limits.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(|reason| Error::Usage(format!("--limit: {reason}")))
    }
}

/// What a new thread's run is asked: its rounds, agents, limits and budget.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Most role executions the thread may take [default: the bundle's own]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: Option<u32>,
    #[command(flatten)]
    pub agents: AgentArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

impl RunArgs {
    /// The run request these flags ask for, parsed once here.
    pub fn request(&self) -> Result<RunRequest> {
        Ok(RunRequest {
            max_rounds: self.max_rounds,
            limits: self.limits.overrides()?,
            budget: self.budget.budget(),
            ..self.agents.request()?
        })
    }
}

/// What a new thread may spend on its agents: over it, the thread pauses (reason `budget`)
/// before its next agent call, and `resume --raise-budget` continues it.
#[derive(Debug, Clone, Args)]
pub struct BudgetArgs {
    /// Most tokens (in and out) the thread's agent calls may use
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
    /// Most US dollars its agent calls may cost (as `prices:` in config.yaml price them)
    #[arg(long, value_name = "USD", value_parser = parse_dollars)]
    pub max_cost: Option<f64>,
    /// Most agent calls it may make
    #[arg(long, value_name = "N")]
    pub max_agent_calls: Option<u64>,
    /// Longest it may run, from its start, e.g. 30m, 2h
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub max_duration: Option<Duration>,
}

impl BudgetArgs {
    pub fn budget(&self) -> Budget {
        Budget {
            max_tokens: self.max_tokens,
            max_cost_usd: self.max_cost,
            max_agent_calls: self.max_agent_calls,
            max_duration_ms: self.max_duration.map(|d| d.as_millis() as u64),
        }
    }
}

/// An amount of dollars: a finite number, not negative.
pub fn parse_dollars(text: &str) -> std::result::Result<f64, String> {
    text.trim_start_matches('$')
        .parse::<f64>()
        .ok()
        .filter(|d| d.is_finite() && *d >= 0.0)
        .ok_or_else(|| format!("`{text}` is not an amount of dollars (e.g. 2.50)"))
}

/// `--raise-budget KEY=VALUE`: `tokens=N`, `cost=USD`, `agent-calls=N` or `duration=D`.
pub fn parse_budget_raise(text: &str) -> std::result::Result<Budget, String> {
    let (key, value) = text.split_once('=').ok_or_else(|| {
        format!("`{text}`: expected KEY=VALUE (tokens, cost, agent-calls, duration)")
    })?;
    let count = || value.parse::<u64>().map_err(|_| format!("`{value}` is not a whole number"));
    let mut budget = Budget::default();
    match key {
        "tokens" => budget.max_tokens = Some(count()?),
        "cost" => budget.max_cost_usd = Some(parse_dollars(value)?),
        "agent-calls" => budget.max_agent_calls = Some(count()?),
        "duration" => {
            let d = humantime::parse_duration(value).map_err(|e| format!("`{value}`: {e}"))?;
            budget.max_duration_ms = Some(d.as_millis() as u64);
        }
        other => {
            return Err(format!("no budget `{other}` (tokens, cost, agent-calls or duration)"));
        }
    }
    Ok(budget)
}

/// How to follow a thread handed to a worker.
#[derive(Debug, Clone, Args)]
pub struct FollowArgs {
    /// Print the thread id and return at once; the thread runs on in the background
    #[arg(long)]
    pub detach: bool,
    /// Print each event (work started, each step, the end) as a JSON object, one per line
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
    /// Print nothing but errors (and a human agent's questions): the exit code says how the
    /// thread ended
    #[arg(short, long)]
    pub quiet: bool,
}

impl FollowArgs {
    /// The following these flags ask for.
    pub fn how(&self) -> Follow {
        Follow { detach: self.detach, json: self.json, quiet: self.quiet }
    }
}

/// How to follow.
#[derive(Debug, Clone, Copy)]
pub struct Follow {
    /// Print the thread id and return at once.
    pub detach: bool,
    /// One JSON object per event instead of lines for humans.
    pub json: bool,
    /// Nothing on stdout.
    pub quiet: bool,
}

impl Follow {
    /// How the thread is to be handed over for this following.
    pub fn hand(self) -> Hand {
        if self.detach { Hand::Detach } else { Hand::Follow }
    }
}
