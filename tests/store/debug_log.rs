//! `LogSink`: where a store writes a thread's debug log, and the debug log built on it.

use super::*;

contract! {
    /// A thread's debug log shows while it waits long on an agent (a store may hold lines
    /// back for its next record, but not for the whole of a long wait), and keeps its order
    /// with what it logs after.
    fn the_debug_log_shows_during_a_long_wait_and_keeps_its_order(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::debug_log::LogLevel;
        let threads = store.threads();
        let (mut writer, record) = threads.create(&start_record(hash(1)), &[], &[])?;
        let id = record.id();
        let log = threads.debug_log(hash(1), id)?;
        log.write(LogLevel::Info, "host", "asking the planner");
        log.release();
        let tail = || -> Result<Vec<String>> {
            Ok(threads.debug_tail(hash(1), id, 10)?.into_iter().map(|l| l.content).collect())
        };
        eventually("the line logged before the wait shows", || {
            Ok(tail()? == ["asking the planner"])
        })?;
        log.write(LogLevel::Info, "host", "the planner answered");
        log.flush();
        futures::executor::block_on(writer.append_steps(&[step("planner", "plan")]))?;
        let lines = tail()?;
        ensure!(lines == ["asking the planner", "the planner answered"], "{lines:?}");
        Ok(())
    }

    /// What a sink is given is read back as the log's tail, in order, released or not; it says
    /// where it writes (for the warning when it cannot).
    fn a_debug_sink_writes_whole_lines(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::debug_log::{DebugLine, LogLevel};
        let threads = store.threads();
        let (writer, record) = threads.create(&start_record(hash(14)), &[], &[])?;
        let id = record.id();
        let mut sink = threads.debug_sink(hash(14), id)?;
        ensure!(!sink.describe().is_empty());
        let line = |content: &str| {
            let mut bytes = serde_json::to_vec(&DebugLine {
                tag: "TESTTAG1".into(),
                level: LogLevel::Info,
                content: content.into(),
                timestamp: 1,
            })
            .unwrap();
            bytes.push(b'\n');
            bytes
        };
        sink.write(&[line("one"), line("two")].concat())?;
        sink.release();
        sink.write(&line("three"))?;
        drop(sink);
        eventually("the lines show", || {
            let tail: Vec<String> =
                threads.debug_tail(hash(14), id, 10)?.into_iter().map(|l| l.content).collect();
            Ok(tail == ["one", "two", "three"])
        })?;
        let last: Vec<String> =
            threads.debug_tail(hash(14), id, 1)?.into_iter().map(|l| l.content).collect();
        ensure!(last == ["three"], "{last:?}");
        drop(writer);
        Ok(())
    }
}
