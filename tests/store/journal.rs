//! `CallLog`: the call journal of a thread, as the store keeps it — appended, read back,
//! released while the thread waits — and the journal built on it.

use super::*;

contract! {
    /// A fork's prefix keeps the calls its steps made: the journal hands them back.
    fn the_journal_keeps_the_calls_a_thread_was_created_with(store: &Storage) -> Result<()> {
        let calls = [call(0, "first answer")];
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
        log.append(&call(0, "quick"), false)?;
        log.append(&CallRecord { seq: 1, ..call(0, "kept") }, true)?;
        log.release();
        let read = log.read()?;
        ensure!(read.len() == 2 && read[1].seq == 1, "{read:?}");
        let again = threads.call_log(hash(13), id)?.read()?;
        ensure!(again == read, "{again:?}");
        let journal = threads.journal(hash(13), id)?;
        ensure!(journal.calls_before(1).len() == 2);
        drop(writer);
        Ok(())
    }
}
