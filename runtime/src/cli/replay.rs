//! `replay <bundle.wasm | flow.yaml> [--workflow NAME] [--threads ID…] [--since D] [--last N]`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use super::options::GlobalOptions;
use super::output::print_json;
use crate::error::exit;
use crate::limits::Limits;
use crate::run::catalog::Catalog;
use crate::run::query::{self, ThreadQuery};
use crate::run::replay::{self, Verdict};
use crate::sandbox::engine::Runtime;
use crate::terminal;

const AFTER_HELP: &str = "\
Exits 0 when every thread replays, 79 when one diverges: run it in CI before `add`.

Examples:
  uncaged-workflow replay review.yaml --last 50
  uncaged-workflow replay target/wasm32-wasip2/release/solve_issue.wasm --workflow solve-issue
  uncaged-workflow replay review.yaml --threads 01M8AV 01M8AW --json";

/// Replay recorded threads of a workflow through a bundle that is not registered yet, offline:
/// their call journals answer every call, no agent is asked, no thread changes.
///
/// Each thread is compatible when the bundle makes the calls it recorded, with the same
/// requests, and yields the steps it recorded; else it diverges at the first step that
/// differs, shown in a few lines. The bundle may differ in anything else.
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct ReplayCommand {
    /// The bundle to check: a `.wasm` component, or a workflow file (`.yaml`, `.yml`, `.json`)
    pub file: PathBuf,
    /// The workflow whose threads are replayed [default: the file's name, without extension]
    #[arg(long, value_name = "NAME", add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub workflow: Option<String>,
    /// Only these threads (ids, or prefixes of them)
    #[arg(long, num_args = 1.., value_name = "ID")]
    pub threads: Vec<String>,
    /// Only threads started within this long (`7d`, `12h`)
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub since: Option<Duration>,
    /// Only the newest N threads
    #[arg(long, value_name = "N")]
    pub last: Option<usize>,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

impl ReplayCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let workflow = match &self.workflow {
            Some(name) => name.clone(),
            None => self
                .file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .filter(|s| !s.is_empty())
                .ok_or_else(|| crate::Error::Usage("name the workflow with --workflow".into()))?,
        };
        let ids = match self.threads.is_empty() {
            false => self
                .threads
                .iter()
                .map(|t| store.threads().resolve(t))
                .collect::<crate::Result<Vec<_>>>()?,
            true => {
                let since =
                    self.since.map(|d| crate::clock::now_ms().saturating_sub(d.as_millis() as u64));
                let query = ThreadQuery {
                    workflow: Some(workflow.clone()),
                    started_after: since,
                    limit: self.last,
                    ..ThreadQuery::default()
                };
                let mut ids: Vec<_> =
                    query::threads(&store, &query)?.threads.iter().map(|t| t.thread_id).collect();
                ids.reverse();
                ids
            }
        };
        let runtime = Runtime::new(store.home())?;
        let limits = Limits::resolve(&store.config()?.limits, &Default::default())?;
        let bundle = Catalog::load_file(&runtime, &workflow, &self.file, &limits).await?;
        let started = std::time::Instant::now();
        let mut report = Vec::new();
        for id in ids {
            let verdict = replay::replay_thread(&store, &runtime, &limits, &bundle, id).await?;
            report.push((id, verdict));
        }
        let diverged = report.iter().filter(|(_, v)| matches!(v, Verdict::Diverges(_))).count();
        if self.json {
            let threads: Vec<_> = report
                .iter()
                .map(|(id, verdict)| json!({"thread": id.to_string(), "result": verdict}))
                .collect();
            print_json(&json!({
                "bundle": bundle.hash.to_string(), "workflow": workflow,
                "compatible": report.len() - diverged, "diverged": diverged, "threads": threads,
            }))?;
        } else {
            for (id, verdict) in &report {
                match verdict {
                    Verdict::Compatible { steps } => {
                        outln!("{id}  compatible ({steps} steps)")?;
                    }
                    Verdict::Diverges(d) => {
                        outln!("{id}  diverges at step {}: {}", d.step, terminal::line(&d.reason))?;
                        super::output::print_divergence(d)?;
                    }
                }
            }
            let steps: usize = report
                .iter()
                .map(|(_, v)| match v {
                    Verdict::Compatible { steps } => *steps,
                    Verdict::Diverges(d) => d.step,
                })
                .sum();
            outln!(
                "{} of {} thread(s) of {workflow} replay through {} ({steps} steps in {} ms)",
                report.len() - diverged,
                report.len(),
                bundle.hash,
                started.elapsed().as_millis()
            )?;
        }
        Ok(if diverged > 0 { exit::DIVERGED } else { 0 })
    }
}
