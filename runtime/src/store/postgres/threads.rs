//! Threads in PostgreSQL: the same records as the home directory's JSONL files, one row per
//! line keyed by (thread, sequence number), and a lease instead of a file lock.
//!
//! A process that runs a thread holds its lease: an owner, an expiry it keeps renewing, and a
//! token that grows by one each time anyone takes the thread. Every record it appends — steps,
//! pause markers, the end, journaled calls — is written only if the thread still carries its
//! token, in the same statement, so a process whose lease expired and was taken over (frozen,
//! cut off, then back) cannot write a single line more.

use tokio_postgres::types::Type;

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run_request::RunRequest;
use crate::store::debug_log::{DebugLine, LogSink};
use crate::store::journal::{CallLog, JournalLine};
use crate::store::postgres::debug_log::PgLog;
use crate::store::postgres::journal::PgCalls;
use crate::store::postgres::leases::{Leases, lease_ms};
use crate::store::postgres::{Postgres, QUEUE_CHANNEL, commit, json_line, listing, summary};
use crate::store::records::{
    ContinueRecord, EndRecord, PauseRecord, Paused, StartRecord, StepRecord, ThreadLines,
    ThreadRecord, ThreadSummary,
};
use crate::store::{Changes, ThreadStore, ThreadWriter};
use tokio_postgres::types::Json;

/// The threads of a PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PgThreads {
    pg: Postgres,
    leases: Leases,
}

impl PgThreads {
    /// The threads of the store `pg` is connected to.
    pub fn new(pg: &Postgres) -> Self {
        PgThreads { pg: pg.clone(), leases: Leases::of(pg) }
    }

    /// A writer for thread `id`, held under lease `token`, whose records are `record`.
    pub fn writer(&self, id: ThreadId, token: i64, mut record: ThreadRecord) -> PgWriter {
        self.leases.hold(id, token);
        record.running = true;
        PgWriter { pg: self.pg.clone(), leases: self.leases.clone(), id, token, record }
    }

    /// Reads thread `id`'s records; `None` if there is no such thread.
    pub fn read_lines(&self, id: ThreadId) -> Result<Option<ThreadRecord>> {
        let Some(stored) = self.read_after(id, -1)? else { return Ok(None) };
        let (held, queued) = (stored.held, stored.queued);
        let mut parsed = ThreadLines::default();
        stored.add_to(&mut parsed);
        self.record_of(id, parsed, held, queued).map(Some)
    }

    /// Thread `id` as its parsed `lines` make it, held by a process or `queued` or neither.
    fn record_of(
        &self,
        id: ThreadId,
        lines: ThreadLines,
        held: bool,
        queued: bool,
    ) -> Result<ThreadRecord> {
        lines
            .record(held, queued)
            .ok_or_else(|| self.pg.bad_data(format!("thread {id} has no start record")))
    }

    /// The records of threads `ids`, which this process has just claimed, in one read: the
    /// claim of many threads costs two round trips, not one per thread. A thread missing
    /// from the answer was removed meanwhile; one whose records do not read is an error of
    /// its own.
    pub fn read_claimed(
        &self,
        ids: &[ThreadId],
    ) -> Result<std::collections::HashMap<ThreadId, Result<ThreadRecord>>> {
        let names: Vec<String> = ids.iter().map(ThreadId::to_string).collect();
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "read the claimed threads",
            client.query_typed(
                "SELECT thread, seq, line FROM uncaged_workflow.thread_records \
                 WHERE thread = ANY($1) ORDER BY thread, seq",
                &[(&names, Type::TEXT_ARRAY)],
            ),
        )?;
        let mut lines: std::collections::HashMap<ThreadId, ThreadLines> = Default::default();
        for row in &rows {
            let Ok(id) = row.get::<_, &str>(0).parse::<ThreadId>() else { continue };
            let seq: i32 = row.get(1);
            lines.entry(id).or_default().push(seq as usize + 1, row.get::<_, &str>(2).as_bytes());
        }
        // Claimed just now: held by this process.
        Ok(lines
            .into_iter()
            .map(|(id, parsed)| (id, self.record_of(id, parsed, true, false)))
            .collect())
    }

    /// What was stored for thread `id` after record `after` (its sequence number; -1 for
    /// all), with whether a worker runs or is to run it: what a follower reads each poll,
    /// without reading the thread again. `None` if there is no such thread.
    pub fn read_after(&self, id: ThreadId, after: i64) -> Result<Option<Changes>> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            &format!("read thread {id}"),
            client.query_typed_opt(
                "SELECT t.lease_owner IS NOT NULL AND t.lease_until > now(), t.runnable, \
                        coalesce(array_agg(r.seq ORDER BY r.seq) \
                                 FILTER (WHERE r.seq IS NOT NULL), '{}'), \
                        coalesce(array_agg(r.line ORDER BY r.seq) \
                                 FILTER (WHERE r.seq IS NOT NULL), '{}') \
                 FROM uncaged_workflow.threads t \
                 LEFT JOIN uncaged_workflow.thread_records r ON r.thread = t.id AND r.seq > $2 \
                 WHERE t.id = $1 GROUP BY t.id",
                &[(&id.to_string(), Type::TEXT), (&(after as i32), Type::INT4)],
            ),
        )?;
        let Some(row) = row else { return Ok(None) };
        let seqs: Vec<i32> = row.get(2);
        let lines: Vec<String> = row.get(3);
        let (held, runnable): (bool, bool) = (row.get(0), row.get(1));
        let lines = seqs.into_iter().map(i64::from).zip(lines).collect();
        Ok(Some(Changes { held, queued: runnable && !held, lines }))
    }

    /// Takes thread `id`'s lease if nobody holds it (or its holder let it expire): the new
    /// token, or `None` if it is held. Its place in the queue is left as it is (see
    /// [`WorkQueue::withdraw`](crate::store::queue::WorkQueue::withdraw)).
    pub fn take(&self, id: ThreadId) -> Result<Option<i64>> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            &format!("take thread {id}"),
            client.query_typed_opt(
                "UPDATE uncaged_workflow.threads SET lease_owner = $2, \
                        lease_until = now() + $3::bigint * interval '1 millisecond', \
                        lease_token = lease_token + 1, control = NULL \
                 WHERE id = $1 AND (lease_owner IS NULL OR lease_until < now()) \
                 RETURNING lease_token",
                &[
                    (&id.to_string(), Type::TEXT),
                    (&self.pg.owner(), Type::TEXT),
                    (&lease_ms(&self.pg), Type::INT8),
                ],
            ),
        )?;
        Ok(row.map(|row| row.get(0)))
    }

    fn exists(&self, id: ThreadId) -> Result<bool> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            &format!("find thread {id}"),
            client.query_typed_opt(
                "SELECT 1 FROM uncaged_workflow.threads WHERE id = $1",
                &[(&id.to_string(), Type::TEXT)],
            ),
        )?;
        Ok(row.is_some())
    }

    /// Inserts thread `start` with `steps` and `calls`, leased to this process if `held`
    /// (under token 1), else to nobody; returns its record as created.
    fn insert(
        &self,
        start: &StartRecord,
        steps: &[StepRecord],
        calls: &[JournalLine],
        held: bool,
    ) -> Result<ThreadRecord> {
        let (mut record, params) = self.insert_params(start, steps, calls, held, None);
        let client = self.pg.client()?;
        let params = commit::borrowed(&params);
        self.pg.wait(
            &format!("create thread {}", start.thread_id),
            client.execute_typed(INSERT, &params),
        )?;
        record.running = held;
        Ok(record)
    }

    /// Creates thread `start` queued with `request` (see [`crate::store::queue::WorkQueue::create_queued`]): one
    /// statement, committed with whatever else this process commits at the moment (the
    /// starts that arrive together share a WAL flush), its notification waking the workers.
    pub(super) fn create_queued(
        &self,
        start: &StartRecord,
        request: &RunRequest,
    ) -> Result<ThreadRecord> {
        let (record, params) = self.insert_params(start, &[], &[], false, Some(request));
        let action = format!("create thread {}", start.thread_id);
        super::block(self.pg.commit(&action, INSERT_QUEUED, params))?;
        Ok(record)
    }

    /// The new thread's record, and the parameters of [`INSERT`] (or [`INSERT_QUEUED`], with
    /// `queued`, the request it is queued with).
    fn insert_params(
        &self,
        start: &StartRecord,
        steps: &[StepRecord],
        calls: &[JournalLine],
        held: bool,
        queued: Option<&RunRequest>,
    ) -> (ThreadRecord, commit::Params) {
        let id = start.thread_id;
        let mut record = ThreadRecord::created(start, steps);
        record.running = held;
        let mut lines = vec![json_line(start)];
        lines.extend(steps.iter().map(json_line));
        let calls: Vec<String> = calls.iter().map(json_line).collect();
        let summary = at_rest(&record);
        let owner = held.then(|| self.pg.owner().to_string());
        let mut params: commit::Params = vec![
            (Box::new(id.to_string()), Type::TEXT),
            (Box::new(start.hash.to_string()), Type::TEXT),
            (Box::new(owner), Type::TEXT),
            (Box::new(held.then(|| lease_ms(&self.pg))), Type::INT8),
            (Box::new(lines), Type::TEXT_ARRAY),
            (Box::new(calls), Type::TEXT_ARRAY),
        ];
        params.extend(summary::fixed(&summary));
        params.extend(summary::changing(&summary));
        params.push((Box::new(summary::pack(&summary)), Type::BYTEA));
        if let Some(request) = queued {
            params.push((Box::new(Json(request.clone())), Type::JSONB));
            params.push((Box::new(QUEUE_CHANNEL), Type::TEXT));
            record.queued = true;
        }
        (record, params)
    }
}

/// The statement that creates a thread: its row (the columns every thread has, then
/// `$more_columns` set to `$more_values`), its records and copied calls, all in one, so that it
/// appears whole or not at all; then `$last`, a SELECT from the new row `t`.
macro_rules! insert_thread {
    ($more_columns:literal, $more_values:literal, $last:literal) => {
        concat!(
            "WITH t AS ( \
                 INSERT INTO uncaged_workflow.threads \
                     (id, bundle, next_seq, lease_owner, lease_until, lease_token, \
                      name, started_ms, prompt, schedule, parent, \
                      status, steps, return_code, ended_ms, waiting_role, paused_at_ms, \
                      tokens, cost_usd, listing",
            $more_columns,
            ") VALUES ($1, $2, cardinality($5::text[]), $3, \
                         now() + $4::bigint * interval '1 millisecond', 1, \
                         $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20",
            $more_values,
            ") RETURNING id), \
             r AS ( \
                 INSERT INTO uncaged_workflow.thread_records (thread, seq, line) \
                 SELECT $1, s.i - 1, s.line \
                 FROM unnest($5::text[]) WITH ORDINALITY AS s(line, i)), \
             c AS ( \
                 INSERT INTO uncaged_workflow.thread_calls (thread, line) \
                 SELECT $1, s.line FROM unnest($6::text[]) WITH ORDINALITY AS s(line, i) \
                 ORDER BY s.i) ",
            $last
        )
    };
}

/// A new thread, already leased to the process that holds it (a NULL owner and expiry
/// otherwise).
const INSERT: &str = insert_thread!("", "", "SELECT 1 FROM t");

/// A new thread as [`INSERT`] makes it, queued for any worker with request `$21`, and the
/// workers woken (`$22`: the queue's channel; a notification goes out when the transaction
/// commits, so no worker looks for a thread that is not there yet).
const INSERT_QUEUED: &str = insert_thread!(
    ", runnable, run_request, queued_at",
    ", true, $21, now()",
    "SELECT pg_notify($22, $1) FROM t"
);

impl ThreadStore for PgThreads {
    fn create(
        &self,
        start: &StartRecord,
        steps: &[StepRecord],
        calls: &[JournalLine],
    ) -> Result<(Box<dyn ThreadWriter>, ThreadRecord)> {
        let record = self.insert(start, steps, calls, true)?;
        let writer = self.writer(start.thread_id, 1, record.clone());
        Ok((Box::new(writer), record))
    }

    /// Inserted with no lease: a worker may claim it as soon as it is queued, and a creator
    /// that dies first leaves nothing held (one statement, where create-then-release is two).
    fn create_at_rest(
        &self,
        start: &StartRecord,
        steps: &[StepRecord],
        calls: &[JournalLine],
    ) -> Result<ThreadRecord> {
        self.insert(start, steps, calls, false)
    }

    fn open(&self, id: ThreadId) -> Result<(Box<dyn ThreadWriter>, ThreadRecord)> {
        let Some(token) = self.take(id)? else {
            return Err(if self.exists(id)? {
                Error::ThreadBusy(id.to_string())
            } else {
                Error::UnknownThread(id.to_string())
            });
        };
        let Some(mut record) = self.read_lines(id)? else {
            return Err(Error::UnknownThread(id.to_string()));
        };
        record.running = true;
        let writer = self.writer(id, token, record.clone());
        Ok((Box::new(writer), record))
    }

    fn read(&self, id: ThreadId) -> Result<ThreadRecord> {
        self.read_lines(id)?.ok_or_else(|| Error::UnknownThread(id.to_string()))
    }

    fn changes(&self, id: ThreadId, after: i64) -> Result<Option<Changes>> {
        self.read_after(id, after)
    }

    fn list(&self) -> Result<Vec<ThreadId>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "list threads",
            client.query_typed("SELECT id FROM uncaged_workflow.threads ORDER BY id", &[]),
        )?;
        Ok(rows.iter().filter_map(|row| row.get::<_, String>(0).parse().ok()).collect())
    }

    /// See [`listing`](crate::store::postgres::listing).
    fn summaries(&self) -> Result<Vec<ThreadSummary>> {
        listing::summaries(&self.pg)
    }

    /// One statement deletes the thread and (by its trigger, migration 0008) its records,
    /// calls and log, unless a live process holds it: nothing is ever left half-removed.
    fn remove(&self, id: ThreadId) -> Result<()> {
        let client = self.pg.client()?;
        let removed = self.pg.wait(
            &format!("remove thread {id}"),
            client.execute_typed(
                "DELETE FROM uncaged_workflow.threads WHERE id = $1 AND NOT runnable \
                 AND (lease_owner IS NULL OR lease_until < now())",
                &[(&id.to_string(), Type::TEXT)],
            ),
        )?;
        match removed {
            0 if self.exists(id)? => Err(Error::ThreadBusy(id.to_string())),
            0 => Err(Error::UnknownThread(id.to_string())),
            _ => Ok(()),
        }
    }

    /// One statement per chunk of threads: those nobody holds or queued meanwhile go, with
    /// their records, calls and log (by the trigger, one statement per table).
    fn remove_ended(&self, ids: &[ThreadId]) -> Result<Vec<ThreadId>> {
        let mut removed = Vec::with_capacity(ids.len());
        let client = self.pg.client()?;
        for chunk in ids.chunks(REMOVE_CHUNK) {
            let names: Vec<String> = chunk.iter().map(ThreadId::to_string).collect();
            let rows = self.pg.wait(
                "remove threads",
                client.query_typed(
                    "DELETE FROM uncaged_workflow.threads WHERE id = ANY($1) AND NOT runnable \
                     AND (lease_owner IS NULL OR lease_until < now()) RETURNING id",
                    &[(&names, Type::TEXT_ARRAY)],
                ),
            )?;
            removed.extend(
                rows.iter().filter_map(|row| row.get::<_, &str>(0).parse::<ThreadId>().ok()),
            );
        }
        Ok(removed)
    }

    fn finish_removals(&self) -> Result<()> {
        Ok(())
    }

    fn call_log(&self, _hash: BundleHash, id: ThreadId) -> Result<Box<dyn CallLog>> {
        Ok(Box::new(PgCalls::new(&self.pg, &self.leases, id)))
    }

    fn debug_sink(&self, _hash: BundleHash, id: ThreadId) -> Result<Box<dyn LogSink>> {
        Ok(Box::new(PgLog::new(&self.pg, &self.leases, id)))
    }

    fn debug_tail(&self, _hash: BundleHash, id: ThreadId, max: usize) -> Result<Vec<DebugLine>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            &format!("read the debug log of thread {id}"),
            client.query_typed(
                "SELECT line FROM (SELECT seq, line FROM uncaged_workflow.thread_log \
                                   WHERE thread = $1 ORDER BY seq DESC LIMIT $2) tail \
                 ORDER BY seq",
                &[(&id.to_string(), Type::TEXT), (&(max as i64), Type::INT8)],
            ),
        )?;
        Ok(rows.iter().filter_map(|row| serde_json::from_str(row.get::<_, &str>(0)).ok()).collect())
    }
}

/// A thread held under its lease, appending fenced by its token.
#[derive(Debug)]
pub struct PgWriter {
    pg: Postgres,
    leases: Leases,
    id: ThreadId,
    token: i64,
    /// The thread as stored, to keep its listing summary current.
    record: ThreadRecord,
}

/// One statement appends a thread's records, and the calls it journaled and the lines it
/// logged since its last record (see [`deferred`](crate::store::postgres::deferred)), fenced
/// by its lease token: a call of `append_records` (migrations 0006 and 0007), which updates the
/// thread's row (next sequence number, summary, packed summary) only if it still carries the
/// token, and inserts only then, so a writer whose lease was taken over writes nothing at all.
/// The count of records written tells which it was.
const APPEND: &str = "SELECT uncaged_workflow.append_records( \
         $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

impl PgWriter {
    /// Appends `lines`, which took the thread to `self.record`, with the calls journaled
    /// since the last append, if the lease still holds; resolves once they are committed.
    /// (A failed append ends this writer's use: the thread is stopped, or taken over.)
    async fn append(&mut self, lines: Vec<String>) -> Result<()> {
        let expected = lines.len() as i64;
        let deferred = self.pg.deferred().take(self.id);
        if deferred.background {
            self.pg.logs().settled().await;
        }
        let mut params: commit::Params = vec![
            (Box::new(self.id.to_string()), Type::TEXT),
            (Box::new(self.token), Type::INT8),
            (Box::new(lines), Type::TEXT_ARRAY),
        ];
        let summary = at_rest(&self.record);
        params.extend(summary::changing(&summary));
        params.push((Box::new(deferred.calls), Type::TEXT_ARRAY));
        params.push((Box::new(deferred.log), Type::TEXT_ARRAY));
        params.push((Box::new(summary::pack(&summary)), Type::BYTEA));
        let action = format!("append to thread {}", self.id);
        let rows = self.pg.commit(&action, APPEND, params).await?;
        let written: i64 = rows.first().map_or(0, |row| row.get(0));
        if written != expected {
            self.leases.lost(self.id);
            return Err(Error::LeaseLost(self.id.to_string()));
        }
        Ok(())
    }
}

impl ThreadWriter for PgWriter {
    fn append_steps<'a>(
        &'a mut self,
        steps: &'a [StepRecord],
    ) -> futures::future::BoxFuture<'a, Result<()>> {
        self.record.steps.extend_from_slice(steps);
        self.record.paused = None;
        self.record.paused_at = None;
        Box::pin(self.append(steps.iter().map(json_line).collect()))
    }

    fn append_pause(&mut self, paused: Paused) -> Result<()> {
        let timestamp = now_ms();
        self.record.paused = Some(paused.clone());
        self.record.paused_at = Some(timestamp);
        super::block(self.append(vec![json_line(&PauseRecord { paused, timestamp })]))
    }

    fn append_continued(&mut self, by: &str) -> Result<()> {
        super::block(self.append(vec![json_line(&ContinueRecord::by(by))]))
    }

    fn append_end(&mut self, end: &EndRecord) -> Result<()> {
        self.record.end = Some(end.clone());
        super::block(self.append(vec![json_line(end)]))
    }

    fn append_upgrade(&mut self, upgrade: &crate::store::upgrades::UpgradeRecord) -> Result<()> {
        self.record.upgrades.push(upgrade.upgrade.clone());
        super::block(self.append(vec![json_line(upgrade)]))
    }

    fn append_retry(&mut self, retry: &crate::store::upgrades::RetryRecord) -> Result<()> {
        self.record.end = None;
        self.record.steps.truncate(retry.retry.from_step);
        self.record.steps.extend(retry.retry.steps.iter().cloned());
        self.record.paused = Some(Paused::by(crate::store::records::PauseReason::Pause));
        self.record.paused_at = Some(retry.timestamp);
        self.record.retries.push(retry.clone());
        super::block(self.append(vec![json_line(retry)]))
    }
}

impl Drop for PgWriter {
    /// Lets the thread go (if it is still this process's), with the calls journaled and the
    /// lines logged since its last record: another process may take it at once rather than
    /// after the lease runs out, and replays those calls rather than making them again.
    fn drop(&mut self) {
        self.leases.release(self.id);
        let deferred = self.pg.deferred().forget(self.id);
        if deferred.background {
            self.pg.logs().barrier();
        }
        let Ok(client) = self.pg.client() else { return };
        let released = self.pg.wait(
            &format!("release thread {}", self.id),
            client.execute_typed(
                "WITH released AS ( \
                     UPDATE uncaged_workflow.threads SET lease_owner = NULL, lease_until = NULL \
                     WHERE id = $1 AND lease_token = $2 RETURNING id), \
                 c AS ( \
                     INSERT INTO uncaged_workflow.thread_calls (thread, line) \
                     SELECT $1, s.line \
                     FROM released, unnest($3::text[]) WITH ORDINALITY AS s(line, i) \
                     ORDER BY s.i) \
                 INSERT INTO uncaged_workflow.thread_log (thread, line) \
                 SELECT $1, s.line FROM released, unnest($4::text[]) WITH ORDINALITY AS s(line, i) \
                 ORDER BY s.i",
                &[
                    (&self.id.to_string(), Type::TEXT),
                    (&self.token, Type::INT8),
                    (&deferred.calls, Type::TEXT_ARRAY),
                    (&deferred.log, Type::TEXT_ARRAY),
                ],
            ),
        );
        if let Err(e) = released {
            // The lease runs out by itself.
            tracing::warn!("{e}");
        }
    }
}

/// A thread's summary as stored: its state at rest. Whether a process runs it now comes from
/// its lease when it is read.
fn at_rest(record: &ThreadRecord) -> ThreadSummary {
    let mut summary = record.summary();
    summary.status = record.status_at_rest();
    summary
}

/// Threads one statement of [`ThreadStore::remove_ended`] removes.
const REMOVE_CHUNK: usize = 5000;
