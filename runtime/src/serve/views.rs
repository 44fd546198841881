//! What the web view shows, as JSON built from the library (never from CLI output): the
//! workflows with their versions and roles, the schedules, the threads, and one thread with
//! its routing, steps, timeline, agent at work and debug log.
//!
//! Every string here may come from a bundle, an agent or a poll command: it is data for the
//! page to put in text nodes, never markup.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use crate::clock::now_ms;
use crate::error::Result;
use crate::ids::ThreadId;
use crate::run::control;
use crate::run::events::PsEntry;
use crate::run::query::{self, ThreadQuery};
use crate::schedule::{self, ScheduleStatus};
use crate::store::Storage;
use crate::store::debug_log::DebugLine;
use crate::store::records::{ThreadStatus, ThreadSummary};

/// The most debug-log lines a thread page shows (the newest).
pub const LOG_LINES: usize = 500;

/// The most threads a listing returns (the newest).
pub const MAX_THREADS: usize = 1000;

/// A registered workflow.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowView {
    pub name: String,
    pub hash: String,
    pub since: u64,
    pub description: String,
    pub declarative: bool,
    /// Where it is as a whole: `active`, `paused`, `executing`, `completed`, `failed`, `ready`.
    pub phase: &'static str,
    pub roles: Vec<RoleView>,
    /// The JSON Schema of the data its threads take, if it declares one: the start form's
    /// fields.
    #[serde(rename = "inputSchema", skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<serde_json::Value>,
    /// Earlier versions, most recent first.
    pub history: Vec<(String, u64)>,
}

/// A role of a workflow.
#[derive(Debug, Serialize)]
pub struct RoleView {
    pub name: String,
    pub description: String,
}

/// Every registered workflow.
pub fn workflows(store: &Storage) -> Result<Vec<WorkflowView>> {
    let registry = store.registry().load()?;
    let bundles = store.bundles();
    let phases = crate::schedule::phase::phases(store)?;
    let mut out = Vec::new();
    for (name, entry) in &registry.workflows {
        let descriptor = bundles.descriptor(entry.hash).ok();
        let declarative = bundles
            .load(&registry, name, entry.hash)
            .ok()
            .is_some_and(|b| crate::declarative::source_of(&b.bytes).is_some());
        out.push(WorkflowView {
            name: name.clone(),
            hash: entry.hash.to_string(),
            since: entry.timestamp,
            description: descriptor.as_ref().map(|d| d.description.clone()).unwrap_or_default(),
            declarative,
            phase: phases.get(name).map_or("ready", |p| p.as_str()),
            input_schema: descriptor.as_ref().and_then(|d| d.input_schema.clone()),
            roles: descriptor
                .map(|d| {
                    d.roles
                        .into_iter()
                        .map(|r| RoleView { name: r.name, description: r.description })
                        .collect()
                })
                .unwrap_or_default(),
            history: entry.history.iter().map(|v| (v.hash.to_string(), v.timestamp)).collect(),
        });
    }
    Ok(out)
}

/// The schedules' firing logs as read so far, shared by the server's requests and watchers.
pub type SharedHistories = Arc<parking_lot::Mutex<schedule::Histories>>;

/// Every schedule with its next firing; `histories` keeps the firing logs read so far.
pub fn schedules(store: &Storage, histories: &SharedHistories) -> Result<Vec<ScheduleStatus>> {
    schedule::statuses_with(store, now_ms(), &mut histories.lock())
}

/// Threads, newest first, of one workflow and one status if given.
pub fn threads(
    store: &Storage,
    workflow: Option<&str>,
    status: Option<ThreadStatus>,
) -> Result<Vec<ThreadSummary>> {
    let query = ThreadQuery {
        workflow: workflow.map(str::to_string),
        statuses: status.into_iter().collect(),
        limit: Some(MAX_THREADS),
        ..ThreadQuery::default()
    };
    Ok(query::threads(store, &query)?.threads)
}

/// One thread, whole.
pub async fn thread(store: &Storage, id: ThreadId) -> Result<Value> {
    let record = store.threads().read(id)?;
    let status = record.status();
    let hash = record.start.hash;
    // Each step's duration: from the step before it (the thread's start for the first) to its
    // own record; the steps of a parallel group share their start.
    let mut steps = Vec::new();
    let turns = query::turns(store, &record)?;
    let mut group_start = record.start.timestamp;
    let mut previous = record.start.timestamp;
    for (i, step) in record.steps.iter().enumerate() {
        let index = i + 1;
        let began = match step.group {
            Some(group) if group.first == index => {
                group_start = previous;
                group_start
            }
            Some(_) => group_start,
            None => previous,
        };
        // The duration the worker recorded (a group step's own call); the gap since the step
        // before for records older than it.
        let duration = step.duration_ms.unwrap_or(step.timestamp.saturating_sub(began));
        steps.push(json!({
            "index": index, "role": step.role, "content": step.content, "meta": step.meta,
            "timestamp": step.timestamp, "began": step.timestamp.saturating_sub(duration),
            "durationMs": duration, "group": step.group, "agent": step.agent,
            "usage": step.usage, "turns": turns.by_step[i],
        }));
        previous = step.timestamp;
    }
    let working: Option<PsEntry> = if status == ThreadStatus::Running {
        control::ps(store).await?.into_iter().find(|p| p.thread_id == id)
    } else {
        None
    };
    let log: Vec<DebugLine> = store.threads().debug_tail(hash, id, LOG_LINES)?;
    // The threads its steps started as child workflows.
    let children: Vec<Value> = query::children_of(store, &record)?
        .into_iter()
        .map(|c| json!({"threadId": c.thread_id, "name": c.name, "status": c.status}))
        .collect();
    // What a person's answer must hold, for a thread that waits for one.
    let expected = match status {
        ThreadStatus::Waiting => {
            crate::run::answer::answer_shape(store, &record)?.map(|s| s.example())
        }
        _ => None,
    };
    Ok(json!({
        "start": record.start,
        "status": status,
        "steps": steps,
        "paused": record.paused,
        "inProgress": turns.in_progress,
        "end": record.end.as_ref().map(crate::run::events::EndView::from),
        "working": working,
        "routing": routing(store, &record.start.name, record.version(), &record.steps),
        "expected": expected,
        "usage": record.usage(),
        "upgrades": record.upgrades,
        "retries": record.retries,
        "children": children,
        "decisions": crate::run::waits::decisions(store, &record)?,
        "notifications": crate::reach::notifier::deliveries(store, record.id())?,
        "log": log,
        "now": now_ms(),
    }))
}

/// How the thread's workflow routes: a declarative bundle's `graph` or `steps`, or for a code
/// bundle the transitions the thread actually took.
fn routing(
    store: &Storage,
    name: &str,
    hash: crate::ids::BundleHash,
    steps: &[crate::store::records::StepRecord],
) -> Value {
    let definition = store.registry().load().ok().and_then(|registry| {
        let bundle = store.bundles().load(&registry, name, hash).ok()?;
        let source = crate::declarative::source_of(&bundle.bytes)?;
        crate::declarative::source::parse(&bundle.path, &source).ok()
    });
    if let Some(definition) = definition {
        return json!({"kind": "declared", "routing": definition.routing});
    }
    // Transitions taken, with how often: $START → first role → … (→ $END if it ended).
    let mut taken: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut from = uncaged_workflow_declarative::START.to_string();
    for step in steps {
        *taken.entry((from.clone(), step.role.clone())).or_default() += 1;
        from = step.role.clone();
    }
    let edges: Vec<Value> =
        taken.into_iter().map(|((f, t), n)| json!({"from": f, "to": t, "count": n})).collect();
    json!({"kind": "taken", "edges": edges, "last": from})
}
