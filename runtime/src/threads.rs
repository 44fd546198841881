//! Thread lifecycle on disk: creating a thread, opening one to continue it, forking one, and
//! the agent bindings a thread carries from process to process.

use std::collections::BTreeMap;
use std::path::Path;

use crate::agent::{AgentFlags, AgentSet};
use crate::catalog::LoadedBundle;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::{BundleHash, ThreadId};
use crate::journal::read_calls;
use crate::limits::Limits;
use crate::thread_log::{
    ForkedFrom, Parameters, RunParameters, StartRecord, StepRecord, ThreadRecord, ThreadWriter,
    find_thread, now_ms, read_thread,
};

/// What a new thread is.
#[derive(Debug, Clone)]
pub struct NewThread {
    pub name: String,
    pub hash: BundleHash,
    pub prompt: String,
    pub max_rounds: u32,
    /// Agent choices, already made absolute (see [`AgentFlags::absolutize`]).
    pub agents: AgentFlags,
    /// `--limit` overrides.
    pub limits: BTreeMap<String, String>,
    /// Steps it starts with (a fork's prefix).
    pub steps: Vec<StepRecord>,
    pub forked_from: Option<ForkedFrom>,
}

/// Creates a thread's files (start record and initial steps) and holds its run lock.
pub fn create(home: &Home, new: NewThread) -> Result<(ThreadWriter, ThreadRecord)> {
    let id = ThreadId::new();
    let start = StartRecord {
        name: new.name,
        hash: new.hash,
        thread_id: id.to_string(),
        parameters: Parameters {
            prompt: new.prompt,
            options: RunParameters {
                max_rounds: new.max_rounds,
                agent: new.agents.default.clone(),
                agent_for: new.agents.for_roles.iter().cloned().collect(),
                cwd: new.agents.cwd.clone(),
                limits: new.limits,
            },
        },
        timestamp: now_ms(),
        forked_from: new.forked_from,
    };
    let writer = ThreadWriter::create(home, &start, &new.steps)?;
    let record = read_thread(writer.path())?;
    Ok((writer, record))
}

/// Creates a thread of workflow `name` after checking all that can be checked before a thread
/// exists — the bundle's integrity, the agent bindings, the limits, max rounds against the
/// hard cap — so that a mistake is reported without leaving a thread behind.
pub fn start_new(
    home: &Home,
    name: &str,
    prompt: &str,
    max_rounds: Option<u32>,
    agents: AgentFlags,
    limits: BTreeMap<String, String>,
) -> Result<(ThreadWriter, ThreadRecord)> {
    let catalog = crate::catalog::Catalog::new(home);
    // One read of the registry serves both the name and the bundle's integrity record.
    let registry = catalog.registry().load()?;
    let entry =
        registry.workflows.get(name).ok_or_else(|| Error::UnknownWorkflow(name.to_string()))?;
    catalog.store().load(&registry, name, entry.hash)?;
    let descriptor = catalog.store().descriptor(entry.hash)?;
    AgentSet::resolve(&Config::load(&home.config_file())?, &agents, &descriptor)?;
    let max_rounds = self::max_rounds(home, max_rounds, descriptor.max_rounds, &limits)?;
    create(
        home,
        NewThread {
            name: name.to_string(),
            hash: entry.hash,
            prompt: prompt.to_string(),
            max_rounds,
            agents,
            limits,
            steps: vec![],
            forked_from: None,
        },
    )
}

/// Opens thread `id` to continue it: takes its run lock and refuses an ended thread.
pub fn open(home: &Home, id: ThreadId) -> Result<(ThreadWriter, ThreadRecord)> {
    let (_, path) = find_thread(home, id)?;
    let (writer, record) = ThreadWriter::open(&path)?;
    if let Some(end) = &record.end {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: end.end.status.as_str(),
            reason: "it has ended; `fork` it to continue from one of its steps".into(),
        });
    }
    Ok((writer, record))
}

/// Reads thread `id`.
pub fn read(home: &Home, id: ThreadId) -> Result<ThreadRecord> {
    let (_, path) = find_thread(home, id)?;
    read_thread(&path)
}

/// Where a fork starts.
#[derive(Debug, Clone)]
pub enum ForkAt {
    /// Keep the first N steps.
    Steps(usize),
    /// Keep the steps before the last occurrence of this role.
    BeforeRole(String),
    /// Keep every step.
    All,
}

/// How many of `original`'s steps a fork keeps.
pub fn fork_point(original: &ThreadRecord, at: &ForkAt) -> Result<usize> {
    let id = original.start.thread_id.clone();
    match at {
        ForkAt::All => Ok(original.steps.len()),
        ForkAt::Steps(n) if *n <= original.steps.len() => Ok(*n),
        ForkAt::Steps(n) => Err(Error::ThreadState {
            id,
            status: "too short",
            reason: format!("it has {} steps; cannot fork at {n}", original.steps.len()),
        }),
        ForkAt::BeforeRole(role) => {
            original.steps.iter().rposition(|s| &s.role == role).ok_or_else(|| Error::ThreadState {
                id,
                status: "without that role",
                reason: format!("no step of role `{role}` to fork before"),
            })
        }
    }
}

/// Creates a fork of `original` keeping its first `keep` steps and the journal of those
/// steps; the original's files are only read.
pub fn fork(
    home: &Home,
    original: &ThreadRecord,
    keep: usize,
    agents: AgentFlags,
) -> Result<(ThreadWriter, ThreadRecord)> {
    let start = &original.start;
    let options = &start.parameters.options;
    let inherited = AgentFlags {
        default: agents.default.or_else(|| options.agent.clone()),
        for_roles: merge(&options.agent_for, agents.for_roles),
        cwd: agents.cwd.or_else(|| options.cwd.clone()),
    };
    let (writer, record) = create(
        home,
        NewThread {
            name: start.name.clone(),
            hash: start.hash,
            prompt: start.parameters.prompt.clone(),
            max_rounds: options.max_rounds,
            agents: inherited,
            limits: options.limits.clone(),
            steps: original.steps[..keep].to_vec(),
            forked_from: Some(ForkedFrom { thread_id: start.thread_id.clone(), step: keep }),
        },
    )?;
    let from = home.thread_calls_file(start.hash, original.id());
    let calls: Vec<_> = read_calls(&from)?.into_iter().filter(|c| c.step < keep).collect();
    if !calls.is_empty() {
        let to = home.thread_calls_file(start.hash, record.id());
        let mut text = String::new();
        for call in calls {
            text.push_str(&serde_json::to_string(&call).expect("call records serialize"));
            text.push('\n');
        }
        crate::durable::write_atomic(&to, text.as_bytes())?;
    }
    Ok((writer, record))
}

/// The agents of a thread: what it recorded at its start, overridden by `flags`.
pub fn agents_for(
    home: &Home,
    record: &ThreadRecord,
    bundle: &LoadedBundle,
    flags: &AgentFlags,
) -> Result<AgentSet> {
    let options = &record.start.parameters.options;
    let merged = AgentFlags {
        default: flags.default.clone().or_else(|| options.agent.clone()),
        for_roles: merge(&options.agent_for, flags.for_roles.clone()),
        cwd: flags.cwd.clone().or_else(|| options.cwd.clone()),
    };
    let config = Config::load(&home.config_file())?;
    AgentSet::resolve(&config, &merged, &bundle.descriptor)
}

/// The limits of a thread: defaults, then config.yaml, then what the thread recorded.
pub fn limits_for(home: &Home, record: &ThreadRecord) -> Result<Limits> {
    let config = Config::load(&home.config_file())?;
    Limits::resolve(&config.limits, &record.start.parameters.options.limits)
}

/// The max rounds of a new thread: `asked` if given (and within the hard cap), else the
/// bundle's default, capped.
pub fn max_rounds(
    home: &Home,
    asked: Option<u32>,
    default: u32,
    overrides: &BTreeMap<String, String>,
) -> Result<u32> {
    let config = Config::load(&home.config_file())?;
    let cap = Limits::resolve(&config.limits, overrides)?.max_rounds;
    match asked {
        Some(asked) if asked > cap => Err(Error::RoundsOverCap { asked, cap }),
        Some(asked) => Ok(asked),
        None => Ok(default.min(cap)),
    }
}

fn merge(
    recorded: &BTreeMap<String, String>,
    overrides: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let mut all = recorded.clone();
    all.extend(overrides);
    all.into_iter().collect()
}

/// The directory to record for a new thread: the current one.
pub fn current_dir() -> Result<std::path::PathBuf> {
    std::env::current_dir().map_err(Error::io("read the current directory", Path::new(".")))
}
