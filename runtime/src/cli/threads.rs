//! `threads [name]` and `threads prune`.

use std::time::Duration;

use clap::{Parser, Subcommand};
use serde::Serialize;

use super::options::GlobalOptions;
use super::output::{Age, Table, print_json};
use crate::clock::now_ms;
use crate::ids::{BundleHash, ThreadId};
use crate::run::lifecycle::{self, PruneFilter};
use crate::run::query::{self, ThreadQuery};
use crate::store::records::{EndStatus, ThreadStatus, ThreadSummary};

/// List threads, oldest first, with status, step count and age; or prune ended ones.
#[derive(Debug, Parser)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  uncaged-workflow threads --status failed --since 1d\n  \
        uncaged-workflow threads --workflow solve-issue --status waiting --status paused\n  \
        uncaged-workflow threads --limit 20 --json"
)]
pub struct ThreadsCommand {
    /// Only threads of this workflow
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub name: Option<String>,
    /// Only threads of this workflow (as the positional NAME)
    #[arg(long, value_name = "NAME", conflicts_with = "name")]
    pub workflow: Option<String>,
    /// Only threads with this status (repeatable)
    #[arg(long, value_name = "STATUS", value_parser = status_value())]
    pub status: Vec<ThreadStatus>,
    /// Only threads started within this long, e.g. 30m, 12h, 7d
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub since: Option<Duration>,
    /// At most this many threads: the newest
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Only the threads of this eval (an eval's threads are listed only so)
    #[arg(long, value_name = "EVAL")]
    pub eval: Option<String>,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<ThreadsAction>,
}

/// What to do with many threads at once.
#[derive(Debug, Subcommand)]
pub enum ThreadsAction {
    /// Remove ended threads (their records, journals and logs) that ended long enough ago.
    ///
    /// Only threads that have ended are removed: never one that runs, is paused, waits for a
    /// human or was interrupted. A removal a crash interrupts is finished by the next one.
    #[command(after_help = "Examples:\n  uncaged-workflow threads prune --older-than 30d\n  \
        uncaged-workflow threads prune --older-than 12h --status failed --workflow solve-issue --dry-run")]
    Prune {
        /// How long ago a thread must have ended, e.g. 30d, 12h, 90m
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// Only threads that ended so (repeatable) [default: completed, failed and killed]
        #[arg(long, value_name = "STATUS", value_enum)]
        status: Vec<EndedStatus>,
        /// Only threads of this workflow
        #[arg(long, value_name = "NAME")]
        workflow: Option<String>,
        /// Say what would be removed, and remove nothing
        #[arg(long)]
        dry_run: bool,
        /// Print the threads as JSON
        #[arg(long)]
        json: bool,
    },
}

/// A thread as `threads --json` prints it, borrowed from its summary (100,000 of them are
/// printed as they are serialized, none built as a JSON value first). Fields in the order of
/// their names, as they were printed from a JSON object.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Listed<'a> {
    cost_usd: Option<f64>,
    hash: BundleHash,
    name: &'a str,
    parent: Option<ThreadId>,
    prompt: &'a str,
    return_code: Option<i32>,
    schedule: Option<&'a str>,
    started_by: Option<&'a str>,
    status: ThreadStatus,
    steps: usize,
    thread_id: ThreadId,
    timestamp: u64,
    tokens: u64,
    /// The provider limit it waits for its turn in, when it runs and waits for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting_for: Option<&'a str>,
}

impl<'a> Listed<'a> {
    fn new(thread: &'a ThreadSummary, waiting_for: Option<&'a str>) -> Self {
        Listed {
            cost_usd: thread.cost_usd,
            hash: thread.hash,
            name: &thread.name,
            parent: thread.parent,
            prompt: &thread.prompt,
            return_code: thread.return_code,
            schedule: thread.schedule.as_deref(),
            started_by: thread.started_by.as_deref(),
            status: thread.status,
            steps: thread.steps,
            thread_id: thread.thread_id,
            timestamp: thread.timestamp,
            tokens: thread.tokens,
            waiting_for,
        }
    }
}

/// `--status`: a thread status by name.
fn status_value() -> impl clap::builder::TypedValueParser<Value = ThreadStatus> {
    use clap::builder::TypedValueParser as _;
    let names: Vec<&'static str> = ThreadStatus::ALL.iter().map(|s| s.as_str()).collect();
    clap::builder::PossibleValuesParser::new(names)
        .map(|name: String| ThreadStatus::named(&name).expect("a possible value names a status"))
}

/// How a thread ended, as `--status` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EndedStatus {
    Completed,
    Failed,
    Killed,
}

impl From<EndedStatus> for EndStatus {
    fn from(status: EndedStatus) -> Self {
        match status {
            EndedStatus::Completed => EndStatus::Completed,
            EndedStatus::Failed => EndStatus::Failed,
            EndedStatus::Killed => EndStatus::Killed,
        }
    }
}

impl ThreadsCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        if let Some(ThreadsAction::Prune { older_than, status, workflow, dry_run, json }) =
            self.action
        {
            let statuses = if status.is_empty() {
                vec![EndStatus::Completed, EndStatus::Failed, EndStatus::Killed]
            } else {
                status.into_iter().map(EndStatus::from).collect()
            };
            let filter = PruneFilter { older_than, statuses, workflow };
            let pruned = lifecycle::prune(&store, &filter, dry_run)?;
            if json {
                print_json(&pruned)?;
            } else {
                for thread in &pruned {
                    outln!("{} {} {}", thread.thread_id, thread.status.as_str(), thread.name)?;
                }
                let verb = if dry_run { "would remove" } else { "removed" };
                outln!("{verb} {} thread(s)", pruned.len())?;
            }
            return Ok(0);
        }
        let workflow = self.name.or(self.workflow);
        let query = ThreadQuery {
            workflow,
            statuses: self.status,
            started_after: self.since.map(|d| now_ms().saturating_sub(d.as_millis() as u64)),
            before: None,
            limit: self.limit,
            experiment: self.eval.as_deref().map(crate::eval::experiment_id).transpose()?,
        };
        // The newest N, listed oldest first.
        let page = query::threads(&store, &query)?;
        let selected = page.threads.iter().rev();
        let limit_waits = query::limit_waits(&store, &page.threads).await?;
        let waiting_for = |t: &ThreadSummary| limit_waits.get(&t.thread_id).map(String::as_str);
        if self.json {
            let list: Vec<_> = selected.map(|t| Listed::new(t, waiting_for(t))).collect();
            print_json(&list)?;
            return Ok(0);
        }
        // Which schedule started a thread, in a column shown when a schedule started any.
        let scheduled = page.threads.iter().any(|t| t.schedule.is_some());
        // Who asked for a thread from outside (an MCP client, an API caller), likewise.
        let requested = page.threads.iter().any(|t| t.started_by.is_some());
        // Which thread started a child workflow's, in a column shown when there is one.
        let children = page.threads.iter().any(|t| t.parent.is_some());
        // What threads spent, in columns shown when an agent reported tokens, or a price.
        let spent = page.threads.iter().any(|t| t.tokens > 0);
        let priced = page.threads.iter().any(|t| t.cost_usd.is_some());
        let mut header = vec!["THREAD", "WORKFLOW", "STATUS", "STEPS", "AGE"];
        header.extend(scheduled.then_some("SCHEDULE"));
        header.extend(requested.then_some("STARTED BY"));
        header.extend(children.then_some("PARENT"));
        header.extend(spent.then_some("TOKENS"));
        header.extend(priced.then_some("COST"));
        header.push("PROMPT");
        let mut table = Table::new(&header);
        table.reserve(page.threads.len());
        table.status_column(2);
        let now_ms = now_ms();
        for thread in selected {
            table.cell_shown(thread.thread_id.encode(&mut [0; 26])).cell(&thread.name);
            match waiting_for(thread) {
                Some(limit) => table.cell_fmt(format_args!("waiting for {limit}")),
                None => table.cell_shown(thread.status.as_str()),
            }
            .cell_fmt(format_args!("{}", thread.steps))
            .cell_fmt(format_args!("{}", Age { at_ms: thread.timestamp, now_ms }));
            if scheduled {
                table.cell(thread.schedule.as_deref().unwrap_or("-"));
            }
            if requested {
                table.cell(thread.started_by.as_deref().unwrap_or("-"));
            }
            if children {
                match thread.parent {
                    Some(parent) => table.cell_shown(parent.encode(&mut [0; 26])),
                    None => table.cell("-"),
                };
            }
            if spent {
                table.cell_fmt(format_args!("{}", thread.tokens));
            }
            if priced {
                match thread.cost_usd {
                    Some(cost) => table.cell_fmt(format_args!("${cost:.4}")),
                    None => table.cell("-"),
                };
            }
            table.cell_truncated(&thread.prompt, 40);
        }
        if table.is_empty() {
            outln!("no threads")?;
        } else {
            table.print()?;
        }
        Ok(0)
    }
}
