//! `EvalBackend`: experiments kept beside the threads.

use uncaged_workflow::store::evals::{Check, EvalPair, Experiment};

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
}
