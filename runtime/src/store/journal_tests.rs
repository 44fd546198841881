//! The call journal's unit tests: a log kept in memory, what a journal replays and records.

use super::*;

/// A log kept in memory, shared so a second journal can read what the first wrote.
#[derive(Debug, Clone, Default)]
struct MemoryLog(Arc<Mutex<Vec<JournalLine>>>);

impl CallLog for MemoryLog {
    fn read(&self) -> Result<Vec<JournalLine>> {
        Ok(self.0.lock().clone())
    }

    fn append(&mut self, line: &JournalLine, _durable: bool) -> Result<()> {
        self.0.lock().push(line.clone());
        Ok(())
    }
}

#[test]
fn recorded_calls_replay_and_divergent_ones_are_refused() -> Result<()> {
    let log = MemoryLog::default();
    let answer = CallResponse::Ok { value: "hi".into(), meta: None, usage: None };
    {
        let mut journal = Journal::new(Box::new(log.clone()))?;
        journal.begin_step(0);
        let (seq, replay) = journal.next_call(CallKind::Agent, "planner", "D1").unwrap();
        assert_eq!((seq, replay), (0, Replay::Fresh));
        journal.record(seq, CallKind::Agent, "planner", "D1".into(), answer.clone(), true)?;
    }
    let mut journal = Journal::new(Box::new(log.clone()))?;
    journal.begin_step(0);
    assert_eq!(
        journal.next_call(CallKind::Agent, "planner", "D1").unwrap(),
        (0, Replay::Recorded(answer))
    );
    assert_eq!(journal.next_call(CallKind::Extract, "", "D2").unwrap(), (1, Replay::Fresh));
    journal.begin_step(0);
    let divergence = journal.next_call(CallKind::Agent, "planner", "OTHER").unwrap_err();
    assert!(divergence.to_string().contains("call 0 of step 1"), "{divergence}");
    Ok(())
}

#[test]
fn a_human_answer_is_replayed_to_the_call_that_waited_for_it() -> Result<()> {
    let log = MemoryLog::default();
    let call = PendingCall {
        step: 2,
        seq: 0,
        digest: "D9".into(),
        system_prompt: None,
        input: None,
        child: None,
        tool: None,
    };
    Journal::new(Box::new(log.clone()))?.record_answer(
        &call,
        "reviewer",
        "yes".into(),
        &DecidedBy::new("t", "cli"),
    )?;
    let mut journal = Journal::new(Box::new(log))?;
    journal.begin_step(2);
    assert_eq!(
        journal.next_call(CallKind::Agent, "reviewer", "D9").unwrap(),
        (0, Replay::Recorded(CallResponse::Ok { value: "yes".into(), meta: None, usage: None }))
    );
    assert!(journal.calls_before(2).is_empty());
    assert_eq!(journal.calls_before(3).len(), 1);
    Ok(())
}
