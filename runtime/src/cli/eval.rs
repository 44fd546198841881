//! `eval`: recorded threads run again on a changed version or binding, judged and compared;
//! `eval resume`, `eval show`, `eval list`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use super::options::{AgentArgs, GlobalOptions};
use super::output::{Table, print_json};
use crate::error::{Error, exit};
use crate::eval::compare::{Change, Report, report};
use crate::eval::plan::{Against, EvalSpec, plan};
use crate::eval::runs::{self, DEFAULT_CONCURRENCY};
use crate::eval::{experiment_id, html, junit};
use crate::ids::BundleHash;
use crate::run::catalog::Catalog;
use crate::sandbox::engine::Runtime;
use crate::spending::Budget;
use crate::store::Storage;
use crate::store::evals::{Check, Experiment, JudgeSpec};
use crate::store::records::EvalTools;
use crate::terminal;

const AFTER_HELP: &str = "\
Each recorded thread runs again from its prompt in a thread of the eval, beside it (`threads
--eval ID` lists them; `thread diff` compares one with its recorded thread). A call is asked
live when its role is named by --live or rebound by --agent/--agent-for, or when its request
(system prompt, thread so far, input) is not the one the recorded thread made; the recorded
thread's journal answers every other call. Each thread is judged by its outcome (completed,
returning 0) and the checks of --checks; a thread the recorded one passed and the eval's fails
is a regression.

Exits 0 when no thread regressed, 80 when one did, 75 when a thread of the eval has not ended
(`eval resume ID` goes on).

Examples:
  uncaged-workflow eval review-v2.yaml --workflow review --last 50 --checks checks.yaml
  uncaged-workflow eval --workflow review --agent-for reviewer=openai:gpt-4o-mini --junit eval.xml
  uncaged-workflow eval --workflow review --version 4PANMSYWZEF6T --live reviewer --json
  uncaged-workflow eval resume 01KF3Q8Z9V2N6W4C1M7R5T0YHX";

/// Run recorded threads again on a changed workflow, prompt or agent, and compare: what got
/// better, what got worse, what it cost.
#[derive(Debug, Parser)]
#[command(args_conflicts_with_subcommands = true, after_help = AFTER_HELP)]
pub struct EvalCommand {
    /// A bundle or workflow file to run the threads on (stored for the eval, not registered);
    /// none: the workflow's current version, or --version
    pub file: Option<PathBuf>,
    /// The workflow whose threads to run [default: the file's name without its extension]
    #[arg(long, value_name = "NAME", add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub workflow: Option<String>,
    /// A stored version of the workflow to run them on
    #[arg(long, value_name = "HASH", conflicts_with = "file")]
    pub version: Option<BundleHash>,
    /// These recorded threads
    #[arg(long, num_args = 1.., value_name = "ID")]
    pub threads: Vec<String>,
    /// Only threads started within this long, e.g. 7d
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub since: Option<Duration>,
    /// Only the newest N threads
    #[arg(long, value_name = "N")]
    pub last: Option<usize>,
    /// The threads of a set saved with `eval set save`
    #[arg(long, value_name = "NAME", conflicts_with_all = ["threads", "since", "last"])]
    pub set: Option<String>,
    /// A role asked again live whatever its request (repeatable)
    #[arg(long, value_name = "ROLE")]
    pub live: Vec<String>,
    #[command(flatten)]
    pub agents: AgentArgs,
    /// A tool call of a role asked live that the recorded thread never made (with the same
    /// arguments; those it made take its recorded result): `journal` fails that thread's
    /// eval, saying where it diverged; `live` makes it (approvals still apply); `deny` tells
    /// the model it was refused
    #[arg(long, value_name = "WHAT", value_enum, default_value_t = ToolsFlag::Journal)]
    pub tools: ToolsFlag,
    /// An eval file (YAML): `checks: [{name, expr}]` each finished thread must pass, each `expr`
    /// JSONata over the thread ($steps.ROLE.meta, $status, $returnCode, $tokens …); and an
    /// optional LLM `judge: {agent: BINDING, role: ROLE, instructions: TEXT}` asked which
    /// answer of each thread is better
    #[arg(long, value_name = "FILE")]
    pub checks: Option<PathBuf>,
    /// Compare with the threads of this earlier eval (where it has one that ended) rather
    /// than with the recorded threads
    #[arg(long, value_name = "EVAL")]
    pub baseline: Option<String>,
    /// Bind the agents by this config file rather than the store's config.yaml (read again by
    /// `eval resume`)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// How many threads run at once
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    #[command(flatten)]
    pub budget: EvalBudgetArgs,
    #[command(flatten)]
    pub output: ReportArgs,
    #[command(subcommand)]
    pub action: Option<EvalAction>,
}

/// `--tools`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolsFlag {
    Journal,
    Live,
    Deny,
}

impl From<ToolsFlag> for EvalTools {
    fn from(flag: ToolsFlag) -> Self {
        match flag {
            ToolsFlag::Journal => EvalTools::Journal,
            ToolsFlag::Live => EvalTools::Live,
            ToolsFlag::Deny => EvalTools::Deny,
        }
    }
}

/// What an eval may spend on the calls it asks live, over all its threads: once spent, it asks
/// nothing more, and says how far it got (`eval resume` with a larger budget goes on).
#[derive(Debug, Clone, Args)]
pub struct EvalBudgetArgs {
    /// Most tokens (in and out) the eval's live calls may use
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
    /// Most US dollars they may cost (as `prices:` in config.yaml price them)
    #[arg(long, value_name = "USD", value_parser = super::options::parse_dollars)]
    pub max_cost: Option<f64>,
    /// Most live agent calls it may make
    #[arg(long, value_name = "N")]
    pub max_agent_calls: Option<u64>,
    /// Longest it may run, from when it was made, e.g. 30m
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub max_duration: Option<Duration>,
}

impl EvalBudgetArgs {
    fn budget(&self) -> Budget {
        Budget {
            max_tokens: self.max_tokens,
            max_cost_usd: self.max_cost,
            max_agent_calls: self.max_agent_calls,
            max_duration_ms: self.max_duration.map(|d| d.as_millis() as u64),
        }
    }
}

/// How a report is given.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    /// Also write the report as JUnit XML to FILE (a test case per thread; a regression fails)
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Also write the report as one self-contained HTML page to FILE: the threads side by
    /// side where they differ, the diff of their answers, their costs
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// What to do with an eval made before.
#[derive(Debug, Subcommand)]
pub enum EvalAction {
    /// Finish an eval cut short: its threads go on from their journals, nothing answered is
    /// asked again
    Resume {
        /// The eval's id
        id: String,
        /// How many threads run at once
        #[arg(long, value_name = "N", default_value_t = DEFAULT_CONCURRENCY)]
        concurrency: usize,
        /// A larger budget: each limit given replaces the eval's
        #[command(flatten)]
        budget: EvalBudgetArgs,
        #[command(flatten)]
        output: ReportArgs,
    },
    /// Show an eval's report as its threads stand
    Show {
        /// The eval's id
        id: String,
        #[command(flatten)]
        output: ReportArgs,
    },
    /// List the evals, oldest first
    List {
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
    /// Save or list named sets of recorded threads, to eval the same threads again and again
    #[command(subcommand)]
    Set(SetAction),
}

/// `eval set`.
#[derive(Debug, Subcommand)]
pub enum SetAction {
    /// Save the ended threads of a workflow that these select as set NAME (replacing it)
    #[command(
        after_help = "Examples:\n  uncaged-workflow eval set save weekly --workflow review --since 7d\n  \
        uncaged-workflow eval review-v2.yaml --workflow review --set weekly"
    )]
    Save {
        /// The set's name
        name: String,
        /// The workflow whose threads it holds
        #[arg(long, value_name = "NAME")]
        workflow: String,
        /// These threads
        #[arg(long, num_args = 1.., value_name = "ID")]
        threads: Vec<String>,
        /// Only threads started within this long, e.g. 7d
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        since: Option<Duration>,
        /// Only the newest N threads
        #[arg(long, value_name = "N")]
        last: Option<usize>,
    },
    /// List the saved sets
    List {
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
}

/// An eval file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EvalFile {
    #[serde(default)]
    checks: Vec<Check>,
    #[serde(default)]
    judge: Option<JudgeSpec>,
}

impl EvalCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        match self.action {
            Some(EvalAction::Resume { id, concurrency, budget, output }) => {
                let id = experiment_id(&id)?;
                let mut experiment = find(&store, id)?;
                let raise = budget.budget();
                if !raise.is_empty() {
                    experiment.budget = experiment.budget.raised(&raise);
                    store.evals().put(&experiment)?;
                }
                let runtime = Runtime::new(store.home())?;
                let bundle =
                    Catalog::new(&store).load(&runtime, &experiment.workflow, experiment.hash)?;
                run(&store, &runtime, &bundle, &mut experiment, concurrency).await?;
                give(&report(&store, &experiment)?, &output)
            }
            Some(EvalAction::Show { id, output }) => {
                let experiment = find(&store, experiment_id(&id)?)?;
                give(&report(&store, &experiment)?, &output)
            }
            Some(EvalAction::List { json }) => list(&store, json),
            Some(EvalAction::Set(SetAction::Save { name, workflow, threads, since, last })) => {
                let threads = threads
                    .iter()
                    .map(|t| store.threads().resolve(t))
                    .collect::<crate::Result<Vec<_>>>()?;
                let spec = EvalSpec {
                    workflow,
                    against: Against::Current,
                    threads,
                    since_ms: since
                        .map(|d| crate::clock::now_ms().saturating_sub(d.as_millis() as u64)),
                    last,
                    set: None,
                    live: vec![],
                    request: Default::default(),
                    tools: Default::default(),
                    checks: vec![],
                    baseline: None,
                    config: None,
                    budget: Default::default(),
                    judge: None,
                };
                let set = crate::eval::plan::save_set(&store, &name, &spec)?;
                outln!(
                    "saved eval set {} of {}: {} thread(s)",
                    set.name,
                    set.workflow,
                    set.threads.len()
                )?;
                Ok(0)
            }
            Some(EvalAction::Set(SetAction::List { json })) => {
                let sets = store.evals().list_sets()?;
                if json {
                    print_json(&sets)?;
                } else if sets.is_empty() {
                    outln!("no eval sets")?;
                } else {
                    let mut table = Table::new(&["SET", "WORKFLOW", "THREADS"]);
                    for set in &sets {
                        table
                            .cell(&set.name)
                            .cell(&set.workflow)
                            .cell_fmt(format_args!("{}", set.threads.len()));
                    }
                    table.print()?;
                }
                Ok(0)
            }
            None => {
                let workflow = match (&self.workflow, &self.file) {
                    (Some(name), _) => name.clone(),
                    (None, Some(file)) => file
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .filter(|s| !s.is_empty())
                        .ok_or_else(|| Error::Usage("name the workflow with --workflow".into()))?,
                    (None, None) => {
                        return Err(Error::Usage(
                            "name the workflow with --workflow (or give a workflow file)".into(),
                        )
                        .into());
                    }
                };
                let threads = self
                    .threads
                    .iter()
                    .map(|t| store.threads().resolve(t))
                    .collect::<crate::Result<Vec<_>>>()?;
                let file = match &self.checks {
                    Some(path) => read_eval_file(path)?,
                    None => EvalFile::default(),
                };
                let spec = EvalSpec {
                    workflow,
                    against: match (self.file, self.version) {
                        (Some(file), _) => Against::File(file),
                        (None, Some(hash)) => Against::Version(hash),
                        (None, None) => Against::Current,
                    },
                    threads,
                    since_ms: self
                        .since
                        .map(|d| crate::clock::now_ms().saturating_sub(d.as_millis() as u64)),
                    last: self.last,
                    set: self.set.clone(),
                    live: self.live,
                    request: self.agents.overrides()?,
                    tools: self.tools.into(),
                    checks: file.checks,
                    baseline: self.baseline.as_deref().map(experiment_id).transpose()?,
                    config: self.config.clone(),
                    budget: self.budget.budget(),
                    judge: file.judge,
                };
                let runtime = Runtime::new(store.home())?;
                let (mut experiment, bundle) = plan(&store, &runtime, &spec).await?;
                if !self.output.json {
                    eprintln!(
                        "eval {} of {}: {} thread(s) on {}",
                        experiment.id,
                        experiment.workflow,
                        experiment.threads.len(),
                        terminal::line(&experiment.against)
                    );
                }
                run(&store, &runtime, &bundle, &mut experiment, self.concurrency).await?;
                give(&report(&store, &experiment)?, &self.output)
            }
        }
    }
}

/// Eval file `path`: its checks and its judge.
fn read_eval_file(path: &std::path::Path) -> crate::Result<EvalFile> {
    let text = crate::durable::read_text(path, "read the eval file")?
        .ok_or_else(|| Error::MissingFile { what: "the eval file", path: path.to_path_buf() })?;
    let file: EvalFile = serde_yaml::from_str(&text)
        .map_err(|e| Error::Corrupt { path: path.to_path_buf(), reason: e.to_string() })?;
    Ok(file)
}

fn find(store: &Storage, id: crate::ids::ThreadId) -> crate::Result<Experiment> {
    store.evals().get(id)?.ok_or_else(|| Error::Usage(format!("no eval {id}")))
}

/// Runs `experiment`'s threads, with a progress bar on a terminal.
async fn run(
    store: &Storage,
    runtime: &Runtime,
    bundle: &crate::sandbox::engine::LoadedBundle,
    experiment: &mut Experiment,
    concurrency: usize,
) -> crate::Result<()> {
    let bar = match std::io::stderr().is_terminal() {
        true => ProgressBar::new(experiment.threads.len() as u64),
        false => ProgressBar::hidden(),
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} threads {elapsed}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let ran = runs::run(store, runtime, bundle, experiment, concurrency, |_| bar.inc(1)).await;
    bar.finish_and_clear();
    if let Some(reason) = ran? {
        eprintln!(
            "uncaged-workflow: eval {} stopped asking: {reason}; `uncaged-workflow eval resume {} \
             --max-cost USD` (or another limit) goes on",
            experiment.id, experiment.id
        );
    }
    Ok(())
}

/// Prints `report` (and writes its JUnit file), and says by the exit code how it went.
fn give(report: &Report, output: &ReportArgs) -> anyhow::Result<i32> {
    if let Some(path) = &output.junit {
        let xml = junit::junit(report).map_err(Error::io("write the JUnit file", path))?;
        std::fs::write(path, xml).map_err(Error::io("write the JUnit file", path))?;
    }
    if let Some(path) = &output.html {
        std::fs::write(path, html::page(report))
            .map_err(Error::io("write the HTML report", path))?;
    }
    if output.json {
        print_json(report)?;
    } else {
        print_report(report)?;
    }
    let totals = &report.totals;
    Ok(if totals.regressed > 0 {
        exit::REGRESSED
    } else if totals.pending > 0 {
        exit::STATE
    } else {
        0
    })
}

fn print_report(report: &Report) -> crate::Result<()> {
    let mut table = Table::new(&[
        "RECORDED",
        "EVAL",
        "CHANGE",
        "BEFORE",
        "AFTER",
        "STEPS",
        "TOKENS",
        "LIVE",
        "DIFFERS AT",
    ]);
    let verdict = |passed: bool| if passed { "passed" } else { "failed" };
    for t in &report.threads {
        let eval_cost = t.eval_cost.clone().unwrap_or_default();
        table
            .cell_shown(t.recorded.encode(&mut [0; 26]))
            .cell(&t.thread.map_or_else(|| "-".into(), |id| id.to_string()))
            .cell(t.change.as_str())
            .cell(verdict(t.baseline.passed))
            .cell(t.eval.as_ref().map_or("-", |v| verdict(v.passed)))
            .cell_fmt(format_args!("{}→{}", t.recorded_cost.steps, eval_cost.steps))
            .cell_fmt(format_args!("{}→{}", t.recorded_cost.tokens, eval_cost.tokens))
            .cell_fmt(format_args!("{}", t.live.calls));
        match &t.difference {
            Some(d) => table.cell_fmt(format_args!("step {} ({})", d.step, d.role)),
            None => table.cell("-"),
        };
    }
    table.print()?;
    for t in report.threads.iter().filter(|t| t.change == Change::Regressed) {
        outln!("{}  {}", t.recorded, terminal::line(&junit::regression(t)))?;
        if let Some(d) = &t.difference {
            if let Some(before) = &d.recorded {
                outln!("    recorded: {}", terminal::line(&before.content))?;
            }
            if let Some(after) = &d.eval {
                let cost = after.cost_usd.map(|c| format!(", ${c:.4}")).unwrap_or_default();
                outln!(
                    "    eval:     {} ({} tokens{cost})",
                    terminal::line(&after.content),
                    after.tokens
                )?;
            }
        }
    }
    let totals = &report.totals;
    let live_cost = totals.live.cost_usd.map(|c| format!(", ${c:.4}")).unwrap_or_default();
    outln!(
        "eval {} of {} on {}: {} thread(s): {} improved, {} regressed, {} unchanged{}; {} of {} \
         passed (were {}); {} call(s) asked live ({} tokens{live_cost}), {} answered by the journal",
        report.id,
        terminal::line(&report.workflow),
        terminal::line(&report.against),
        totals.threads,
        totals.improved,
        totals.regressed,
        totals.unchanged,
        if totals.pending > 0 { format!(", {} not ended", totals.pending) } else { String::new() },
        totals.passed,
        totals.threads,
        totals.baseline_passed,
        totals.live.calls,
        totals.live.tokens,
        totals.live.answered_by_journal
    )?;
    Ok(())
}

fn list(store: &Storage, json: bool) -> anyhow::Result<i32> {
    let all = store.evals().list()?;
    if json {
        print_json(&all)?;
        return Ok(0);
    }
    if all.is_empty() {
        outln!("no evals")?;
        return Ok(0);
    }
    let mut table = Table::new(&["EVAL", "WORKFLOW", "ON", "THREADS", "FINISHED"]);
    for e in &all {
        table
            .cell(&e.id.to_string())
            .cell(&e.workflow)
            .cell(&e.against)
            .cell_fmt(format_args!("{}", e.threads.len()))
            .cell(if e.finished.is_some() { "yes" } else { "no" });
    }
    table.print()?;
    Ok(0)
}
