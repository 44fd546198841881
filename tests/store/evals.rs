//! `EvalBackend`: experiments kept beside the threads.

use uncaged_workflow::store::evals::{Check, EvalPair, EvalSet, Experiment, JudgeSpec, Judgement};

use super::*;

fn experiment(hash: BundleHash) -> Experiment {
    Experiment {
        id: ThreadId::new(),
        created: 5,
        workflow: "contract".into(),
        hash,
        against: "flow.yaml".into(),
        live: vec!["reviewer".into()],
        tools: uncaged_workflow::store::records::EvalTools::Live,
        request: RunRequest { max_rounds: Some(4), ..Default::default() },
        checks: vec![Check { name: "approved".into(), expression: "$x = 1".into() }],
        baseline: Some(ThreadId::new()),
        config: Some("/etc/uncaged/eval.yaml".into()),
        budget: uncaged_workflow::store::records::Budget {
            max_tokens: Some(9),
            ..Default::default()
        },
        judge: Some(JudgeSpec {
            agent: "critic".into(),
            role: Some("review".into()),
            instructions: None,
        }),
        judgements: [(
            ThreadId::new(),
            Judgement {
                preferred: "eval".into(),
                reason: "it tests".into(),
                eval_first: true,
                usage: None,
            },
        )]
        .into(),
        threads: vec![EvalPair { recorded: ThreadId::new(), thread: None }],
        finished: None,
    }
}

contract! {
    /// An experiment is kept whole, replaced in place as its threads are made, and listed
    /// oldest first; an unknown id is none.
    fn experiments_are_kept_replaced_and_listed(store: &Storage) -> Result<()> {
        ensure!(store.evals().list()?.is_empty());
        let mut first = experiment(hash(1));
        store.evals().put(&first)?;
        let second = experiment(hash(2));
        store.evals().put(&second)?;
        ensure!(store.evals().get(first.id)?.as_ref() == Some(&first));
        first.threads[0].thread = Some(ThreadId::new());
        first.finished = Some(9);
        store.evals().put(&first)?;
        ensure!(store.evals().get(first.id)?.as_ref() == Some(&first));
        let ids: Vec<ThreadId> = store.evals().list()?.iter().map(|e| e.id).collect();
        // By id: a ULID orders by the millisecond it was made in.
        let mut made = vec![first.id, second.id];
        made.sort();
        ensure!(ids == made, "{ids:?}");
        ensure!(store.evals().get(ThreadId::new())?.is_none());
        Ok(())
    }

    /// A set of threads is kept by name, replaced when saved again, listed by name.
    fn eval_sets_are_kept_by_name(store: &Storage) -> Result<()> {
        ensure!(store.evals().list_sets()?.is_empty() && store.evals().get_set("weekly")?.is_none());
        let mut weekly = EvalSet { name: "weekly".into(), workflow: "contract".into(), threads: vec![ThreadId::new()], created: 3 };
        store.evals().put_set(&weekly)?;
        let nightly = EvalSet { name: "nightly".into(), ..weekly.clone() };
        store.evals().put_set(&nightly)?;
        weekly.threads.push(ThreadId::new());
        store.evals().put_set(&weekly)?;
        ensure!(store.evals().get_set("weekly")?.as_ref() == Some(&weekly));
        let names: Vec<String> = store.evals().list_sets()?.into_iter().map(|s| s.name).collect();
        ensure!(names == ["nightly", "weekly"], "{names:?}");
        ensure!(store.evals().get_set("../weekly")?.is_none());
        Ok(())
    }
}
