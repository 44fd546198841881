//! An experiment's threads compared with the threads they re-ran (or, with a baseline eval,
//! with that eval's threads): each judged, and the pair
//! said improved (the recorded thread failed, the eval's passes), regressed (the other way),
//! or unchanged; where their steps first differ; what each cost; and what the eval spent on
//! the calls it asked live. Read from the threads whenever it is asked, so it is never out of
//! step with them.

use serde::Serialize;

use super::judge::{Verdict, judge};
use crate::error::Result;
use crate::ids::{BundleHash, ThreadId};
use crate::run::diff::{StepDiff, diff};
use crate::spending::Usage;
use crate::store::Storage;
use crate::store::evals::Experiment;
use crate::store::journal::{CallKind, CallResponse};
use crate::store::records::{StepRecord, ThreadRecord};

/// How long a step's text is shown where two differ.
const SHOWN: usize = 400;

/// How a thread of an eval compares with the thread it re-ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// The baseline (the recorded thread, or an earlier eval's) failed its judges; this eval's
    /// passes.
    Improved,
    /// The baseline passed; this eval's fails.
    Regressed,
    /// Both pass, or both fail.
    Unchanged,
    /// The eval's thread has not ended (not run yet, cut short, or waiting for a person).
    Pending,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Improved => "improved",
            Change::Regressed => "regressed",
            Change::Unchanged => "unchanged",
            Change::Pending => "pending",
        }
    }
}

/// What a thread cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    pub steps: usize,
    pub tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// From its start to its end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// What the eval's thread spent on calls asked live (not answered by the recorded journal).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Live {
    pub calls: usize,
    pub tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Calls the recorded thread's journal answered.
    pub answered_by_journal: usize,
}

/// The first step where two threads differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Difference {
    /// 1-based.
    pub step: usize,
    /// The role there: the eval's, or the recorded thread's where the eval has no such step.
    pub role: String,
    /// What differs: `role`, `content`, `meta`, or `missing` (one thread has no such step).
    pub fields: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<Shown>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval: Option<Shown>,
}

/// A step as a difference shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shown {
    pub role: String,
    /// Its content, cut to a few hundred characters.
    pub content: String,
    pub meta: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// What the step's calls cost.
    pub tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// One recorded thread and the eval's thread for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadResult {
    pub recorded: ThreadId,
    /// The thread this one is compared with: the recorded thread, or the thread of the
    /// earlier eval (`--baseline`) that re-ran it.
    pub baseline_thread: ThreadId,
    pub thread: Option<ThreadId>,
    /// The start of the prompt.
    pub prompt: String,
    pub change: Change,
    pub baseline: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval: Option<Verdict>,
    /// Where the two threads' steps first differ; none when they are the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference: Option<Difference>,
    pub recorded_cost: Cost,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_cost: Option<Cost>,
    pub live: Live,
    /// What the LLM judge said, when the eval has one and asked it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge: Option<crate::store::evals::Judgement>,
}

/// Every thread of an experiment, and the totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub id: ThreadId,
    pub workflow: String,
    pub hash: BundleHash,
    pub against: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub live_roles: Vec<String>,
    pub created: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished: Option<u64>,
    /// The earlier eval compared with, if not the recorded threads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<ThreadId>,
    pub totals: Totals,
    pub threads: Vec<ThreadResult>,
}

/// An experiment in numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub threads: usize,
    /// The eval's threads that pass their judges.
    pub passed: usize,
    /// The recorded threads that pass them.
    pub baseline_passed: usize,
    pub improved: usize,
    pub regressed: usize,
    pub unchanged: usize,
    pub pending: usize,
    /// Pairs whose steps differ somewhere.
    pub differing: usize,
    pub recorded: Cost,
    pub eval: Cost,
    pub live: Live,
    /// The LLM judge's verdicts, when the eval has a judge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge: Option<JudgeTotals>,
}

/// What the LLM judge said, in numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JudgeTotals {
    /// Threads whose eval answer it preferred…
    pub eval: usize,
    /// …whose baseline's…
    pub baseline: usize,
    /// …neither…
    pub same: usize,
    /// …or whose verdict could not be read.
    pub unclear: usize,
    /// What asking it cost (not counted in the eval's own spend).
    pub tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// Experiment `experiment` as its threads stand now.
pub fn report(store: &Storage, experiment: &Experiment) -> Result<Report> {
    let earlier = baselines(store, experiment)?;
    let mut threads = Vec::with_capacity(experiment.threads.len());
    for pair in &experiment.threads {
        let recorded = match earlier.get(&pair.recorded) {
            Some(&id) => store.threads().read(id)?,
            None => store.threads().read(pair.recorded)?,
        };
        let eval = match pair.thread {
            Some(id) => match store.threads().read(id) {
                Ok(record) => Some(record),
                Err(crate::Error::UnknownThread(_)) => None,
                Err(e) => return Err(e),
            },
            None => None,
        };
        let live = match &eval {
            Some(record) => live(store, record)?,
            None => Live::default(),
        };
        threads.push(compare(experiment, &recorded, eval.as_ref(), pair.thread, live));
    }
    let mut totals = Totals { threads: threads.len(), ..Totals::default() };
    for t in &threads {
        totals.passed += usize::from(t.eval.as_ref().is_some_and(|v| v.passed));
        totals.baseline_passed += usize::from(t.baseline.passed);
        match t.change {
            Change::Improved => totals.improved += 1,
            Change::Regressed => totals.regressed += 1,
            Change::Unchanged => totals.unchanged += 1,
            Change::Pending => totals.pending += 1,
        }
        totals.differing += usize::from(t.difference.is_some());
        add(&mut totals.recorded, &t.recorded_cost);
        if let Some(cost) = &t.eval_cost {
            add(&mut totals.eval, cost);
        }
        totals.live.calls += t.live.calls;
        totals.live.tokens += t.live.tokens;
        totals.live.answered_by_journal += t.live.answered_by_journal;
        totals.live.cost_usd = sum(totals.live.cost_usd, t.live.cost_usd);
        if let Some(judgement) = &t.judge {
            let judged = totals.judge.get_or_insert_with(JudgeTotals::default);
            match judgement.preferred.as_str() {
                "eval" => judged.eval += 1,
                "baseline" => judged.baseline += 1,
                "same" => judged.same += 1,
                _ => judged.unclear += 1,
            }
            if let Some(usage) = &judgement.usage {
                judged.tokens += usage.input_tokens + usage.output_tokens;
                judged.cost_usd = sum(judged.cost_usd, usage.cost_usd);
            }
        }
    }
    Ok(Report {
        id: experiment.id,
        workflow: experiment.workflow.clone(),
        hash: experiment.hash,
        against: experiment.against.clone(),
        live_roles: experiment.live.clone(),
        created: experiment.created,
        finished: experiment.finished,
        baseline: experiment.baseline,
        totals,
        threads,
    })
}

/// The thread of the earlier eval each recorded thread is compared with, where the experiment
/// has a baseline eval and that eval's thread for it ended (the recorded thread is the
/// baseline of the others).
pub(crate) fn baselines(
    store: &Storage,
    experiment: &Experiment,
) -> Result<std::collections::HashMap<ThreadId, ThreadId>> {
    let Some(id) = experiment.baseline else { return Ok(Default::default()) };
    let earlier = store
        .evals()
        .get(id)?
        .ok_or_else(|| crate::Error::Usage(format!("no eval {id} to compare with")))?;
    let mut ended = std::collections::HashMap::new();
    for pair in &earlier.threads {
        let Some(thread) = pair.thread else { continue };
        match store.threads().read(thread) {
            Ok(record) if record.end.is_some() => {
                ended.insert(pair.recorded, thread);
            }
            Ok(_) | Err(crate::Error::UnknownThread(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(ended)
}

/// One pair compared.
fn compare(
    experiment: &Experiment,
    recorded: &ThreadRecord,
    eval: Option<&ThreadRecord>,
    thread: Option<ThreadId>,
    live: Live,
) -> ThreadResult {
    let baseline = judge(recorded, &experiment.checks);
    let judged = eval.filter(|e| e.end.is_some()).map(|e| judge(e, &experiment.checks));
    let change = match &judged {
        None => Change::Pending,
        Some(v) if v.passed && !baseline.passed => Change::Improved,
        Some(v) if !v.passed && baseline.passed => Change::Regressed,
        Some(_) => Change::Unchanged,
    };
    let recorded_id = recorded.start.eval.as_ref().map_or(recorded.id(), |e| e.baseline);
    ThreadResult {
        recorded: recorded_id,
        baseline_thread: recorded.id(),
        thread,
        prompt: recorded.start.parameters.prompt.chars().take(120).collect(),
        change,
        baseline,
        eval: judged,
        difference: eval.and_then(|e| difference(recorded, e)),
        recorded_cost: cost(recorded),
        eval_cost: eval.map(cost),
        live,
        judge: experiment.judgements.get(&recorded_id).cloned(),
    }
}

/// Where the steps of `recorded` and `eval` first differ.
fn difference(recorded: &ThreadRecord, eval: &ThreadRecord) -> Option<Difference> {
    let first = diff(recorded, eval).into_iter().find(|d| !matches!(d, StepDiff::Same { .. }))?;
    Some(match first {
        StepDiff::Same { .. } => unreachable!("found a step that is not the same"),
        StepDiff::Changed { index, fields, a, b } => Difference {
            step: index,
            role: b.role.clone(),
            fields,
            recorded: Some(shown(&a)),
            eval: Some(shown(&b)),
        },
        StepDiff::OnlyInA { index, step } => Difference {
            step: index,
            role: step.role.clone(),
            fields: vec!["missing"],
            recorded: Some(shown(&step)),
            eval: None,
        },
        StepDiff::OnlyInB { index, step } => Difference {
            step: index,
            role: step.role.clone(),
            fields: vec!["missing"],
            recorded: None,
            eval: Some(shown(&step)),
        },
    })
}

fn shown(step: &StepRecord) -> Shown {
    let mut content: String = step.content.chars().take(SHOWN).collect();
    if content.len() < step.content.len() {
        content.push('…');
    }
    let usage = step.usage.as_ref();
    Shown {
        role: step.role.clone(),
        content,
        meta: step.meta.clone(),
        agent: step.agent.clone(),
        tokens: usage.map_or(0, |u| u.input_tokens + u.output_tokens),
        cost_usd: usage.and_then(|u| u.cost_usd),
    }
}

fn cost(record: &ThreadRecord) -> Cost {
    let usage = record.usage();
    Cost {
        steps: record.steps.len(),
        tokens: usage.as_ref().map_or(0, |u| u.input_tokens + u.output_tokens),
        cost_usd: usage.and_then(|u| u.cost_usd),
        duration_ms: record
            .end
            .as_ref()
            .map(|e| e.timestamp.saturating_sub(record.start.timestamp)),
    }
}

/// What thread `record` of an eval spent on calls its agents answered (its journal says
/// which the recorded thread's journal answered instead).
fn live(store: &Storage, record: &ThreadRecord) -> Result<Live> {
    let (usage, answered_by_journal) = live_usage(store, record)?;
    Ok(Live {
        calls: usage.calls as usize,
        tokens: usage.input_tokens + usage.output_tokens,
        cost_usd: usage.cost_usd,
        answered_by_journal,
    })
}

/// The usage of the calls thread `record` of an eval asked live (each counted as a call), and
/// how many calls the recorded thread's journal answered.
pub(crate) fn live_usage(store: &Storage, record: &ThreadRecord) -> Result<(Usage, usize)> {
    let journal = store.threads().journal(record.start.hash, record.id())?;
    let (mut usage, mut answered_by_journal) = (Usage::default(), 0);
    for call in journal.calls().filter(|c| c.kind == CallKind::Agent) {
        if call.recorded_in.is_some() {
            answered_by_journal += 1;
            continue;
        }
        match &call.response {
            CallResponse::Ok { usage: Some(spent), .. } => {
                usage.add(&Usage { calls: 1, ..spent.clone() });
            }
            _ => usage.calls += 1,
        }
    }
    Ok((usage, answered_by_journal))
}

fn add(total: &mut Cost, more: &Cost) {
    total.steps += more.steps;
    total.tokens += more.tokens;
    total.cost_usd = sum(total.cost_usd, more.cost_usd);
    total.duration_ms = match (total.duration_ms, more.duration_ms) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
}

fn sum(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}
