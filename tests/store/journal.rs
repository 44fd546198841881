//! `CallLog`: the call journal of a thread, as the store keeps it — appended, read back,
//! released while the thread waits — and the journal built on it.

use super::*;

contract! {
    /// A fork's prefix keeps the calls its steps made: the journal hands them back.
    fn the_journal_keeps_the_calls_a_thread_was_created_with(store: &Storage) -> Result<()> {
        let calls = [JournalLine::Call(call(0, "first answer"))];
        let (writer, record) =
            store.threads().create(&start_record(hash(1)), &[step("planner", "p")], &calls)?;
        drop(writer);
        let journal = store.threads().journal(hash(1), record.id())?;
        ensure!(journal.calls_before(1) == calls, "{:?}", journal.calls_before(1));
        ensure!(journal.calls_before(0).is_empty());
        Ok(())
    }

    /// A call log hands back what was appended to it, once released and opened again too; a
    /// journal opened on it answers the recorded call.
    fn a_call_log_keeps_what_is_appended(store: &Storage) -> Result<()> {
        let threads = store.threads();
        let (writer, record) = threads.create(&start_record(hash(13)), &[], &[])?;
        let id = record.id();
        let mut log = threads.call_log(hash(13), id)?;
        ensure!(log.read()?.is_empty());
        log.append(&JournalLine::Call(call(0, "quick")), false)?;
        log.append(&JournalLine::Call(CallRecord { seq: 1, ..call(0, "kept") }), true)?;
        log.release();
        let read = log.read()?;
        ensure!(
            read.len() == 2 && matches!(&read[1], JournalLine::Call(c) if c.seq == 1),
            "{read:?}"
        );
        let again = threads.call_log(hash(13), id)?.read()?;
        ensure!(again == read, "{again:?}");
        let journal = threads.journal(hash(13), id)?;
        ensure!(journal.calls_before(1).len() == 2);
        drop(writer);
        Ok(())
    }

    /// A durable agent's turns, tool calls and a person's decision are kept with their call,
    /// in order, the ones written without a sync going with the next synced one; a journal
    /// opened on them hands the call's loop back, counts what its turns cost while the call is
    /// unanswered, and knows the decision.
    fn a_journal_keeps_an_agent_calls_loop(store: &Storage) -> Result<()> {
        let threads = store.threads();
        let (writer, record) = threads.create(&start_record(hash(14)), &[], &[])?;
        let id = record.id();
        let usage = uncaged_workflow::store::records::Usage {
            input_tokens: 100,
            output_tokens: 20,
            ..Default::default()
        };
        let call_id = "call_1".to_string();
        let entries = [
            LoopEntry::Offered { tools: vec!["fs__read_text_file".into()] },
            LoopEntry::Model {
                content: Some("reading".into()),
                tool_calls: vec![ToolCall {
                    id: call_id.clone(),
                    name: "fs__read_text_file".into(),
                    arguments: r#"{"path":"a"}"#.into(),
                }],
                usage: Some(usage.clone()),
                duration_ms: 5,
            },
            LoopEntry::ToolStarted { call_id: call_id.clone() },
        ];
        let mut log = threads.call_log(hash(14), id)?;
        for (i, entry) in entries.iter().enumerate() {
            let line = LoopRecord { step: 0, seq: 0, entry: entry.clone(), timestamp: 7 };
            log.append(&JournalLine::Loop(line), i == entries.len() - 1)?;
        }
        log.release();
        let journal = threads.journal(hash(14), id)?;
        let read: Vec<LoopEntry> = journal.loop_of(0).entries();
        ensure!(read == entries, "{read:?}");
        ensure!(journal.spent().tokens() == 120, "{:?}", journal.spent());
        let pending = uncaged_workflow::store::records::PendingCall {
            step: 0,
            seq: 0,
            digest: "d".into(),
            system_prompt: None,
            input: None,
            child: None,
            tool: None,
        };
        ensure!(!journal.decided(&pending, &call_id));
        let mut journal = journal;
        journal.record_decision(&pending, &call_id, Decision::Redo, &by())?;
        let again = threads.journal(hash(14), id)?;
        ensure!(again.decided(&pending, &call_id));
        ensure!(again.loop_of(0).entries().len() == 4);
        // Who decided is read back with the decision.
        let decided = again.loop_of(0).entries().pop();
        ensure!(
            matches!(&decided, Some(LoopEntry::Decision { by: Some(b), .. }) if *b == by()),
            "{decided:?}"
        );
        // A fork keeps the loop with its step.
        ensure!(again.calls_before(1).len() == 4);
        drop(writer);
        Ok(())
    }
}
