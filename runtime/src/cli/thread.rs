//! `thread <id>`, `thread start`, `thread rm <id>` and `thread diff <a> <b>`.

use clap::{Parser, Subcommand};
use serde_json::{Value, json};

use super::options::GlobalOptions;
use super::output::{print_json, truncate};
use crate::run::events::EndView;
use crate::run::lifecycle;
use crate::store::records::{PauseReason, Paused};
use crate::terminal;

/// Show a thread's state and steps, or delete it.
#[derive(Debug, Parser)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ThreadCommand {
    /// The thread's id (a ULID), or a prefix of it only one thread has
    #[arg(required = true, add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
    pub id: Option<String>,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<ThreadAction>,
}

/// What to do with a thread other than show it.
#[derive(Debug, Subcommand)]
pub enum ThreadAction {
    /// Delete a thread's files (not while it runs)
    Rm {
        /// The thread's id
        #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
        id: String,
    },
    /// Compare two threads step by step (a fork and its original, say): the same, changed
    /// (role, content, meta), only in one
    Diff {
        /// The first thread
        #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
        a: String,
        /// The second thread
        #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
        b: String,
        /// Print the comparison as JSON
        #[arg(long)]
        json: bool,
    },
    /// Create a thread without running it; prints its id. Drive it with `step` or `resume`.
    Start {
        /// The workflow
        #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
        name: String,
        #[command(flatten)]
        prompt: super::options::PromptArgs,
        #[command(flatten)]
        run: Box<super::options::RunArgs>,
        #[command(flatten)]
        trigger: super::options::TriggerArgs,
    },
}

impl ThreadCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        match self.action {
            Some(ThreadAction::Start { name, prompt, run, trigger }) => {
                let start = lifecycle::StartRequest {
                    name,
                    prompt: prompt.text()?,
                    trigger_data: trigger.value()?,
                    request: run.request()?,
                    origin: Default::default(),
                };
                let checked = lifecycle::check_start(&store, &start)?;
                let created = lifecycle::create(&store, start, checked)?;
                let (mut writer, record) = lifecycle::open(&store, created.id())?;
                writer.append_pause(Paused::by(PauseReason::Start))?;
                outln!("{}", record.id())?;
                Ok(0)
            }
            Some(ThreadAction::Diff { a, b, json }) => {
                let a = store.threads().read(store.threads().resolve(&a)?)?;
                let b = store.threads().read(store.threads().resolve(&b)?)?;
                print_diff(&a, &b, json)?;
                Ok(0)
            }
            Some(ThreadAction::Rm { id }) => {
                let id = store.threads().resolve(&id)?;
                lifecycle::remove(&store, id)?;
                outln!("deleted thread {id}")?;
                Ok(0)
            }
            None => {
                let id = store.threads().resolve(self.id.as_deref().unwrap_or_default())?;
                let thread = store.threads().read(id)?;
                let children = crate::run::query::children_of(&store, &thread)?;
                let turns = crate::run::query::turns(&store, &thread)?;
                let waiting_for = crate::run::control::waiting_for(&store, &thread).await?;
                let decisions = crate::run::waits::decisions(&store, &thread)?;
                let notices = crate::reach::notifier::deliveries(&store, id)?;
                if self.json {
                    let steps: Vec<Value> = thread
                        .steps
                        .iter()
                        .zip(&turns.by_step)
                        .map(|(step, turns)| {
                            let mut step = json!(step);
                            if !turns.is_empty() {
                                step["turns"] = json!(turns);
                            }
                            step
                        })
                        .collect();
                    let children: Vec<_> = children
                        .iter()
                        .map(|c| json!({"threadId": c.thread_id, "name": c.name, "status": c.status}))
                        .collect();
                    print_json(&json!({
                        "start": thread.start, "status": thread.status(), "steps": steps,
                        "inProgress": turns.in_progress,
                        "waitingFor": waiting_for,
                        "paused": thread.paused,
                        "end": thread.end.as_ref().map(EndView::from),
                        "usage": thread.usage(),
                        "upgrades": thread.upgrades,
                        "retries": thread.retries,
                        "children": children,
                        "decisions": decisions,
                        "notifications": notices,
                    }))?;
                    return Ok(0);
                }
                let start = &thread.start;
                outln!(
                    "thread {}  {} {}  {}",
                    start.thread_id,
                    start.name,
                    thread.version(),
                    thread.status().as_str()
                )?;
                outln!("prompt: {}", terminal::block(&start.parameters.prompt))?;
                outln!("max rounds: {}", start.max_rounds())?;
                if let Some(schedule) = &start.schedule {
                    outln!(
                        "started by schedule {} ({})",
                        schedule.name,
                        terminal::line(&schedule.firing)
                    )?;
                }
                if let Some(by) = &start.started_by {
                    outln!("started by {}", terminal::line(&by.line()))?;
                }
                if let Some(fork) = &start.forked_from {
                    outln!("forked from {} at step {}", fork.thread_id, fork.step)?;
                }
                for upgrade in &thread.upgrades {
                    outln!(
                        "upgraded from {} to {} after step {}",
                        upgrade.from,
                        upgrade.to,
                        upgrade.at_step
                    )?;
                }
                for retry in &thread.retries {
                    let reason = terminal::line(&retry.retry.reason);
                    outln!(
                        "retried after step {} (it had failed: {reason})",
                        retry.retry.from_step
                    )?;
                }
                if let Some(parent) = &start.parent {
                    let role = terminal::line(&parent.role);
                    outln!("child of thread {} (its step `{role}`)", parent.thread_id)?;
                }
                if let Some(limit) = &waiting_for {
                    let limit = terminal::line(limit);
                    outln!("waiting for its turn in provider limit {limit}")?;
                }
                if let Some((child, role, _)) = thread.waited_child() {
                    let role = terminal::line(role);
                    outln!("waiting for its child thread {child} (step `{role}`)")?;
                }
                for child in &children {
                    outln!(
                        "child thread {}  {}  {}",
                        child.thread_id,
                        child.name,
                        child.status.as_str()
                    )?;
                }
                if let Some(usage) = thread.usage() {
                    outln!("usage: {}", super::output::usage_line(&usage))?;
                }
                for notice in &notices {
                    let to = notice.recipient.as_deref().map(|r| format!(" to {r}"));
                    let error = notice.last_error.as_deref().map(|e| format!(": {e}"));
                    let line = format!(
                        "notified {} through {}{} ({}, {} attempt(s){})",
                        notice.kind,
                        notice.channel,
                        to.unwrap_or_default(),
                        notice.state.as_str(),
                        notice.attempts,
                        error.unwrap_or_default()
                    );
                    outln!("{}", terminal::line(&line))?;
                }
                for decision in &decisions {
                    let line = format!(
                        "step {} decided ({}) by {} through {}",
                        decision.step + 1,
                        decision.decision,
                        decision.by.who,
                        decision.by.via
                    );
                    outln!("{}", terminal::line(&line))?;
                }
                for (i, step) in thread.steps.iter().enumerate() {
                    outln!()?;
                    let label = super::output::step_label(i + 1, step);
                    let agent = step.agent.as_deref().map_or(String::new(), |a| format!("  ({a}"));
                    let cost = step
                        .usage
                        .as_ref()
                        .map_or(String::new(), |u| format!(", {}", super::output::usage_line(u)));
                    let took = match (&step.agent, step.duration_ms) {
                        (Some(_), Some(ms)) => format!(", {ms} ms{cost})"),
                        (Some(_), None) => format!("{cost})"),
                        _ => String::new(),
                    };
                    let head = format!("{label} {}{agent}{took}  {}", step.role, step.meta);
                    outln!("{}", terminal::line(&head))?;
                    for line in step.content.lines() {
                        outln!("    {}", terminal::line(line))?;
                    }
                    print_turns(&turns.by_step[i])?;
                }
                for call in &turns.in_progress {
                    outln!()?;
                    outln!("in progress (not answered yet):")?;
                    print_turns(&call.turns)?;
                }
                if let Some(end) = &thread.end {
                    outln!()?;
                    outln!(
                        "{} ({}): {}",
                        end.end.status.as_str(),
                        end.end.return_code,
                        terminal::block(&end.end.summary)
                    )?;
                }
                Ok(0)
            }
        }
    }
}

/// Prints how threads `a` and `b` differ, step by step.
/// A durable agent's turns, under its step: what the model said, and each tool call with its
/// arguments, where it stands, how long it took, and the head of its result.
fn print_turns(turns: &[crate::store::call_loop::TurnView]) -> crate::error::Result<()> {
    for turn in turns {
        let said = turn.content.as_deref().map(|c| truncate(c.trim(), 100)).unwrap_or_default();
        outln!("    turn {} ({} ms): {}", turn.turn, turn.duration_ms, terminal::line(&said))?;
        for call in &turn.tool_calls {
            let status = serde_json::to_value(call.status).unwrap_or_default();
            let took = call.duration_ms.map_or(String::new(), |ms| format!(", {ms} ms"));
            let line = format!(
                "      {} {}  {}{took}",
                call.tool,
                truncate(&call.arguments, 120),
                status.as_str().unwrap_or_default()
            );
            outln!("{}", terminal::line(&line))?;
            if let Some(result) = &call.result {
                let first = result.lines().next().unwrap_or_default();
                outln!("        → {}", terminal::line(&truncate(first, 120)))?;
            }
        }
    }
    Ok(())
}

fn print_diff(
    a: &crate::store::records::ThreadRecord,
    b: &crate::store::records::ThreadRecord,
    json: bool,
) -> anyhow::Result<()> {
    use crate::run::diff::{StepDiff, diff};
    let steps = diff(a, b);
    let count = |f: fn(&StepDiff) -> bool| steps.iter().filter(|s| f(s)).count();
    let (same, changed) = (
        count(|s| matches!(s, StepDiff::Same { .. })),
        count(|s| matches!(s, StepDiff::Changed { .. })),
    );
    let (only_a, only_b) = (
        count(|s| matches!(s, StepDiff::OnlyInA { .. })),
        count(|s| matches!(s, StepDiff::OnlyInB { .. })),
    );
    if json {
        print_json(&json!({
            "a": a.id().to_string(), "b": b.id().to_string(), "steps": steps,
            "same": same, "changed": changed, "onlyInA": only_a, "onlyInB": only_b,
        }))?;
        return Ok(());
    }
    let head = |t: &crate::store::records::ThreadRecord| {
        format!("{} ({} {}, {})", t.id(), t.start.name, t.start.hash, t.status().as_str())
    };
    outln!("A: {}", head(a))?;
    outln!("B: {}", head(b))?;
    let shown = |step: &crate::store::records::StepRecord| {
        let text = format!("{} {}", step.meta, step.content.replace('\n', " "));
        let cut: String = text.chars().take(100).collect();
        terminal::line(&cut).into_owned()
    };
    for step in &steps {
        match step {
            StepDiff::Same { index, role } => {
                outln!("  [{index}] {:<12} same", terminal::line(role))?;
            }
            StepDiff::Changed { index, fields, a, b } => {
                outln!(
                    "  [{index}] {:<12} changed: {}",
                    terminal::line(&a.role),
                    fields.join(", ")
                )?;
                outln!("      A: {} {}", terminal::line(&a.role), shown(a))?;
                outln!("      B: {} {}", terminal::line(&b.role), shown(b))?;
            }
            StepDiff::OnlyInA { index, step } => {
                outln!(
                    "  [{index}] {:<12} only in A: {}",
                    terminal::line(&step.role),
                    shown(step)
                )?;
            }
            StepDiff::OnlyInB { index, step } => {
                outln!(
                    "  [{index}] {:<12} only in B: {}",
                    terminal::line(&step.role),
                    shown(step)
                )?;
            }
        }
    }
    outln!("{same} same, {changed} changed, {only_a} only in A, {only_b} only in B")?;
    Ok(())
}
