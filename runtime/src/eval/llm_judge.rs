//! An LLM judge: a binding of config.yaml asked, for each thread of an eval that ended, which
//! of two answers is better — its baseline's and its own (the last step of a role, or of the
//! thread). The two are shown as "Answer 1" and "Answer 2" in an order the thread's id decides,
//! so that neither side is always first; the verdict is read back to the side, kept with the
//! eval (asked once per thread), and its own tokens are counted apart from the eval's.

use std::hash::Hasher;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::agent_spec::AgentSpec;
use crate::agents::{Agent, AgentContext, AgentSet, Bound, RoleRef, Secrets};
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run_request::RunRequest;
use crate::store::Storage;
use crate::store::config::Config;
use crate::store::debug_log::DebugLog;
use crate::store::descriptor::{Descriptor, RoleSpec};
use crate::store::evals::{Experiment, JudgeSpec, Judgement};
use crate::store::records::ThreadRecord;

/// The role the judge answers as.
const ROLE: &str = "judge";

/// What the judge is told unless the eval file says what makes an answer better.
const INSTRUCTIONS: &str = "You compare two answers to the same task and say which is better: \
    more correct, more complete, more useful to the person who asked.";

/// How much of each answer the judge is shown.
const SHOWN: usize = 20_000;

/// Asks the judge of `experiment` (if it has one) about each thread that ended and has no
/// verdict yet, keeping each verdict as it comes.
pub async fn judge_all(
    store: &Storage,
    experiment: &mut Experiment,
    config: &Config,
    secrets: &Secrets,
) -> Result<()> {
    let Some(spec) = experiment.judge.clone() else { return Ok(()) };
    let judge = bind(config, secrets, &spec)?;
    let baselines = super::compare::baselines(store, experiment)?;
    for pair in experiment.threads.clone() {
        let Some(thread) = pair.thread else { continue };
        if experiment.judgements.contains_key(&pair.recorded) {
            continue;
        }
        let eval = match store.threads().read(thread) {
            Ok(record) if record.end.is_some() => record,
            Ok(_) | Err(Error::UnknownThread(_)) => continue,
            Err(e) => return Err(e),
        };
        let baseline = match baselines.get(&pair.recorded) {
            Some(&id) => store.threads().read(id)?,
            None => store.threads().read(pair.recorded)?,
        };
        let judgement = ask(&judge, &spec, &baseline, &eval).await?;
        experiment.judgements.insert(pair.recorded, judgement);
        store.evals().put(experiment)?;
    }
    Ok(())
}

/// The judge's binding: a named binding of `config`, never a person.
fn bind(config: &Config, secrets: &Secrets, spec: &JudgeSpec) -> Result<Bound> {
    let role = RoleSpec {
        name: ROLE.into(),
        description: "Compares two answers".into(),
        system_prompt: spec.instructions.clone().unwrap_or_else(|| INSTRUCTIONS.into()),
        extract_prompt: String::new(),
        schema: json!({"type": "object"}),
    };
    let descriptor = Descriptor {
        description: "an eval's judge".into(),
        max_rounds: 1,
        roles: vec![role],
        input_schema: None,
        contract: String::new(),
    };
    let request =
        RunRequest { agent: Some(AgentSpec::Named(spec.agent.clone())), ..Default::default() };
    let agents = AgentSet::resolve(config, &request, secrets, &descriptor, None)?;
    let bound = agents.for_role(ROLE).expect("the judge's role is declared").clone();
    if matches!(*bound.agent, Agent::Human) {
        return Err(Error::Usage(format!(
            "judge `{}`: a person cannot be the judge; name a model's binding",
            crate::terminal::line(&spec.agent)
        )));
    }
    Ok(bound)
}

/// The judge's verdict on `eval` against `baseline`.
async fn ask(
    judge: &Bound,
    spec: &JudgeSpec,
    baseline: &ThreadRecord,
    eval: &ThreadRecord,
) -> Result<Judgement> {
    let eval_first = eval_first(baseline.start.eval.as_ref().map_or(baseline.id(), |e| e.baseline));
    let (before, after) = (answer_of(baseline, spec), answer_of(eval, spec));
    let (first, second) = if eval_first { (&after, &before) } else { (&before, &after) };
    let prompt = format!(
        "The task both answers were given:\n\n{}\n\n# Answer 1\n\n{first}\n\n# Answer 2\n\n{second}\n\n\
         Which answer is better? Say it as JSON: {{\"better\": 1, 2, or 0 when they are as good, \
         \"reason\": \"why, in a sentence\"}}",
        cut(&baseline.start.parameters.prompt)
    );
    let context = AgentContext {
        thread_id: eval.id().to_string(),
        prompt,
        steps: Arc::new(Vec::new()),
        role: RoleRef {
            name: ROLE.into(),
            system_prompt: spec.instructions.clone().unwrap_or_else(|| INSTRUCTIONS.into()),
        },
        input: None,
    };
    let answer = judge.answer(&context, &DebugLog::tracing(), None).await.map_err(|e| {
        Error::Usage(format!("the eval's judge `{}` did not answer: {e}", judge.label))
    })?;
    let (better, reason) = verdict(&answer.content);
    let preferred = match (better, eval_first) {
        (Some(0), _) => "same",
        (Some(1), true) | (Some(2), false) => "eval",
        (Some(1), false) | (Some(2), true) => "baseline",
        _ => "unclear",
    };
    Ok(Judgement { preferred: preferred.into(), reason, eval_first, usage: answer.usage })
}

/// Whether the eval's answer is shown first for recorded thread `recorded`: half the threads
/// one way, half the other, the same on every ask.
fn eval_first(recorded: ThreadId) -> bool {
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    hasher.write(recorded.to_string().as_bytes());
    hasher.finish() & 1 == 1
}

/// The answer of `record` the judge compares: the last step of the spec's role, or of the
/// thread; its content and meta.
fn answer_of(record: &ThreadRecord, spec: &JudgeSpec) -> String {
    let step = match &spec.role {
        Some(role) => record.steps.iter().rev().find(|s| &s.role == role),
        None => record.steps.last(),
    };
    match step {
        Some(step) => cut(&format!("{}\n\nmeta: {}", step.content, step.meta)),
        None => "(no answer: the thread has no such step)".into(),
    }
}

/// The judge's `better` (0, 1 or 2) and reason, from the first JSON object in its answer.
fn verdict(content: &str) -> (Option<u64>, String) {
    let found = content.find('{').and_then(|start| {
        let end = content.rfind('}')?;
        serde_json::from_str::<Value>(content.get(start..=end)?).ok()
    });
    let better = found.as_ref().and_then(|v| v["better"].as_u64()).filter(|b| *b <= 2);
    let reason = found
        .as_ref()
        .and_then(|v| v["reason"].as_str().map(str::to_string))
        .unwrap_or_else(|| content.to_string());
    (better, reason.chars().take(500).collect())
}

fn cut(text: &str) -> String {
    text.chars().take(SHOWN).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_is_read_from_the_first_json_object() {
        assert_eq!(
            verdict("I think {\"better\": 2, \"reason\": \"tests\"} ok"),
            (Some(2), "tests".into())
        );
        assert_eq!(verdict("no idea").0, None);
        assert_eq!(verdict("{\"better\": 7}").0, None);
    }

    #[test]
    fn about_half_the_threads_show_the_eval_first() {
        let first = (0..200).filter(|_| eval_first(ThreadId::new())).count();
        assert!((60..=140).contains(&first), "{first} of 200");
    }
}
