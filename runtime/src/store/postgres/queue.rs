//! The work queue of a PostgreSQL store: threads waiting for a worker, workers claiming them
//! (`FOR UPDATE SKIP LOCKED`, so many workers never take the same one), requests to the
//! worker that holds a thread (kill, pause), and the workers themselves with their heartbeats.
//!
//! A thread stays `runnable` while a worker runs it and stops being so only when it comes to
//! rest (ends, pauses, waits for a person): a worker that dies leaves it runnable under a
//! lease that runs out, and the next claim takes it over.

use std::time::Duration;

use tokio_postgres::types::{Json, Type};

use crate::error::Result;
use crate::ids::{BundleHash, ThreadId};
use crate::run_request::RunRequest;
use crate::store::postgres::live::PgLive;
use crate::store::postgres::threads::PgThreads;
use crate::store::postgres::{Postgres, hostname, summary};
use crate::store::queue::{
    Activity, Claimed, ControlRequest, LiveChannel, LiveThread, Release, Scope, WorkQueue, Workers,
};
use crate::store::records::{StartRecord, ThreadRecord};

use crate::store::postgres::QUEUE_CHANNEL;

/// The channel a kill or pause request is announced on.
pub const CONTROL_CHANNEL: &str = "uncaged_workflow_control";

/// How long a notification this process sends itself may take before `LISTEN` counts as not
/// working here (it takes a millisecond on a direct connection).
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// A worker whose last heartbeat is older than this is dead. Liveness comes from heartbeats:
/// a process id alone would call a zombie, or another process that reuses the pid, alive. A
/// pid only ever says the opposite, for a worker of this machine whose process is gone (or a
/// zombie): it is dead at once, not a heartbeat later (see [`PgQueue::live_workers`]).
pub const ALIVE_WITHIN: Duration = Duration::from_secs(3);

/// Whether the worker process `pid` of machine `host` may still run, seen from machine
/// `here`: a process of another machine cannot be looked at (its heartbeats say), one of this
/// machine can.
fn may_run(host: &str, pid: i32, here: &str) -> bool {
    host != here || crate::procfs::runs(pid)
}

/// The queue of the store `pg` is connected to.
#[derive(Debug, Clone)]
pub struct PgQueue {
    pg: Postgres,
    threads: PgThreads,
    live: PgLive,
}

impl PgQueue {
    pub fn new(pg: &Postgres) -> Self {
        PgQueue { pg: pg.clone(), threads: PgThreads::new(pg), live: PgLive::new(pg) }
    }

    fn notify(&self, channel: &str, payload: &str) -> Result<()> {
        let client = self.pg.client()?;
        self.pg.wait(
            "wake the workers",
            client.execute_typed(
                "SELECT pg_notify($1, $2)",
                &[(&channel, Type::TEXT), (&payload, Type::TEXT)],
            ),
        )?;
        Ok(())
    }

    /// Listens on `channels`: each notification's channel arrives on the returned receiver,
    /// which closes if the connection is lost (callers poll as well, so nothing waits on it
    /// alone).
    ///
    /// `LISTEN` needs a session of its own, which a transaction-pooling PgBouncer does not
    /// keep (it hands the listening server connection to other clients). Whether
    /// notifications reach this process is found out by sending one to itself from the
    /// shared connection: if it has not arrived within [`PROBE_WAIT`], that is said once,
    /// the receiver closes, and this process does not listen again ([`PgQueue::wake_ups`]
    /// answers `None`). The wait is in the background: nothing starts later for it.
    pub fn listen(&self, channels: &[&str]) -> Result<tokio::sync::mpsc::UnboundedReceiver<()>> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let probe =
            format!("uncaged_workflow_probe_{}", ulid::Ulid::new().to_string().to_lowercase());
        let mut listened: Vec<&str> = channels.to_vec();
        listened.push(&probe);
        let (client, mut notes) = self.pg.listening(&listened)?;
        self.notify(&probe, "")?;
        let (pg, target) = (self.pg.clone(), self.pg.target().to_string());
        // The session lives as long as it is of use.
        self.pg.spawn(async move {
            let _client = client;
            let probed = tokio::time::timeout(PROBE_WAIT, async {
                while let Some((channel, _)) = notes.recv().await {
                    if channel == probe {
                        return true;
                    }
                }
                false
            });
            if !matches!(probed.await, Ok(true)) {
                pg.inner.no_notifications.store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    "{target}: a notification sent to this process did not arrive within \
                     {PROBE_WAIT:?}: LISTEN needs a session of its own, which a \
                     transaction-pooling connection pooler (PgBouncer) does not keep; no \
                     wake-ups, polling instead"
                );
                return;
            }
            while notes.recv().await.is_some() {
                if sender.send(()).is_err() {
                    return;
                }
            }
        });
        Ok(receiver)
    }
}

impl WorkQueue for PgQueue {
    fn workers(&self) -> Workers {
        Workers::Pool
    }

    /// Makes thread `id` runnable with `request`, and wakes the workers. A thread queued
    /// already keeps its place (a `resume` of a thread waiting for a worker).
    fn create_queued(&self, start: &StartRecord, request: &RunRequest) -> Result<ThreadRecord> {
        self.threads.create_queued(start, request)
    }

    fn enqueue(&self, id: ThreadId, _hash: BundleHash, request: &RunRequest) -> Result<()> {
        let client = self.pg.client()?;
        self.pg.wait(
            &format!("queue thread {id}"),
            client.execute_typed(
                "UPDATE uncaged_workflow.threads \
                 SET runnable = true, run_request = $2, control = NULL, \
                     queued_at = CASE WHEN runnable THEN queued_at ELSE now() END \
                 WHERE id = $1",
                &[(&id.to_string(), Type::TEXT), (&Json(request), Type::JSONB)],
            ),
        )?;
        self.notify(QUEUE_CHANNEL, &id.to_string())
    }

    /// Claims up to `max` runnable threads nobody holds (or whose holder let its lease run
    /// out), oldest first, for this process — never one of `running`, the threads it runs
    /// already: their leases may have run out while the database was out of reach, and
    /// taking them again would fence off the run at work.
    fn claim(
        &self,
        scope: Scope,
        max: usize,
        running: &[ThreadId],
        only: Option<ThreadId>,
    ) -> Result<Vec<Claimed>> {
        let running: Vec<String> = running.iter().map(ThreadId::to_string).collect();
        let bundle = match scope {
            Scope::Any => None,
            Scope::Bundle(hash) => Some(hash.to_string()),
        };
        let only = only.map(|id| id.to_string());
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "claim threads",
            client.query_typed(
                "UPDATE uncaged_workflow.threads t SET lease_owner = $1, \
                        lease_until = now() + $2::bigint * interval '1 millisecond', \
                        lease_token = t.lease_token + 1, control = NULL, activity = NULL \
                 FROM (SELECT id, lease_owner AS previous FROM uncaged_workflow.threads \
                       WHERE runnable AND (lease_owner IS NULL OR lease_until < now()) \
                             AND id <> ALL($4::text[]) \
                             AND ($5::text IS NULL OR bundle = $5) \
                             AND ($6::text IS NULL OR id = $6) \
                       ORDER BY queued_at LIMIT $3 FOR UPDATE SKIP LOCKED) c \
                 WHERE t.id = c.id \
                 RETURNING t.id, t.lease_token, t.run_request, c.previous",
                &[
                    (&self.pg.owner(), Type::TEXT),
                    (&(self.pg.lease().as_millis() as i64), Type::INT8),
                    (&(max as i64), Type::INT8),
                    (&running, Type::TEXT_ARRAY),
                    (&bundle, Type::TEXT),
                    (&only, Type::TEXT),
                ],
            ),
        )?;
        let taken: Vec<(ThreadId, i64, RunRequest, Option<String>)> = rows
            .iter()
            .filter_map(|row| {
                let id = row.get::<_, &str>(0).parse::<ThreadId>().ok()?;
                let request = row
                    .get::<_, Option<Json<RunRequest>>>(2)
                    .map(|Json(request)| request)
                    .unwrap_or_default();
                Some((id, row.get(1), request, row.get(3)))
            })
            .collect();
        if taken.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<ThreadId> = taken.iter().map(|(id, ..)| *id).collect();
        let mut records = self.threads.read_claimed(&ids)?;
        let mut claimed = Vec::with_capacity(taken.len());
        for (id, token, request, taken_from) in taken {
            // A thread whose records cannot be read cannot run here, nor anywhere: it leaves
            // the queue (and reads `interrupted`; `resume` tries again).
            let record = match records.remove(&id) {
                Some(Ok(record)) => record,
                None => continue,
                Some(Err(e)) => {
                    tracing::warn!("thread {id} leaves the queue: {e}");
                    self.release(id, token, Release::Settle)?;
                    continue;
                }
            };
            let writer = Box::new(self.threads.writer(id, token, record.clone()));
            claimed.push(Claimed { id, record, writer, request, ticket: token, taken_from });
        }
        Ok(claimed)
    }

    /// A thread settled (ended, paused, waiting) leaves the queue and its lease; one handed
    /// back stays runnable, nobody holds it, and the workers are woken to take it at once.
    fn release(&self, id: ThreadId, token: i64, how: Release) -> Result<()> {
        let client = self.pg.client()?;
        let statement = match how {
            Release::Settle => {
                "UPDATE uncaged_workflow.threads SET runnable = false, run_request = NULL, \
                     lease_owner = NULL, lease_until = NULL, activity = NULL, control = NULL \
                 WHERE id = $1 AND lease_token = $2"
            }
            Release::HandBack => {
                "UPDATE uncaged_workflow.threads SET lease_owner = NULL, lease_until = NULL, \
                     activity = NULL, control = NULL, queued_at = now() \
                 WHERE id = $1 AND lease_token = $2"
            }
        };
        self.pg.wait(
            &format!("release thread {id}"),
            client.execute_typed(statement, &[(&id.to_string(), Type::TEXT), (&token, Type::INT8)]),
        )?;
        if how == Release::HandBack {
            self.notify(QUEUE_CHANNEL, &id.to_string())?;
        }
        Ok(())
    }

    /// Clears `runnable` unless a worker (other than this process) holds the thread.
    fn withdraw(&self, id: ThreadId) -> Result<()> {
        let client = self.pg.client()?;
        self.pg.wait(
            &format!("withdraw thread {id} from the queue"),
            client.execute_typed(
                "UPDATE uncaged_workflow.threads SET runnable = false, run_request = NULL \
                 WHERE id = $1 AND (lease_owner IS NULL OR lease_owner = $2 \
                                    OR lease_until < now())",
                &[(&id.to_string(), Type::TEXT), (&self.pg.owner(), Type::TEXT)],
            ),
        )?;
        Ok(())
    }

    /// Asks the worker holding thread `id` to kill or pause it. False if no worker holds it
    /// (it is not runnable, or still waits in the queue).
    fn ask(&self, id: ThreadId, request: ControlRequest) -> Result<bool> {
        let client = self.pg.client()?;
        let asked = self.pg.wait(
            &format!("{} thread {id}", request.as_str()),
            client.execute_typed(
                "UPDATE uncaged_workflow.threads SET control = $2 \
                 WHERE id = $1 AND runnable AND lease_owner IS NOT NULL AND lease_until > now()",
                &[(&id.to_string(), Type::TEXT), (&request.as_str(), Type::TEXT)],
            ),
        )?;
        if asked == 0 {
            return Ok(false);
        }
        self.notify(CONTROL_CHANNEL, &id.to_string())?;
        Ok(true)
    }

    fn is_asked(&self, id: ThreadId) -> Result<bool> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            &format!("look whether thread {id}'s worker took its request"),
            client.query_typed_opt(
                "SELECT 1 FROM uncaged_workflow.threads WHERE id = $1 AND control IS NOT NULL",
                &[(&id.to_string(), Type::TEXT)],
            ),
        )?;
        Ok(row.is_some())
    }

    /// The requests waiting for this process's threads, taken (cleared) as they are read.
    fn requests(&self, _running: &[ThreadId]) -> Result<Vec<(ThreadId, ControlRequest)>> {
        // A row the group committer has locked this instant is skipped, not waited for (two
        // of this process's transactions waiting on each other would deadlock): its request
        // is read at the next look.
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "read kill and pause requests",
            client.query_typed(
                "UPDATE uncaged_workflow.threads t SET control = NULL \
                 FROM (SELECT id, control FROM uncaged_workflow.threads \
                     WHERE lease_owner = $1 AND control IS NOT NULL \
                     FOR UPDATE SKIP LOCKED) c \
                 WHERE t.id = c.id RETURNING t.id, c.control",
                &[(&self.pg.owner(), Type::TEXT)],
            ),
        )?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id = row.get::<_, &str>(0).parse().ok()?;
                Some((id, ControlRequest::named(row.get::<_, &str>(1))?))
            })
            .collect())
    }

    /// Registers this process as a worker running up to `max_threads` threads.
    fn register(&self, _scope: Scope, max_threads: usize) -> Result<bool> {
        let client = self.pg.client()?;
        self.pg.wait(
            "register the worker",
            client.execute_typed(
                "INSERT INTO uncaged_workflow.workers (id, host, pid, max_threads) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()",
                &[
                    (&self.pg.owner(), Type::TEXT),
                    (&hostname(), Type::TEXT),
                    (&(std::process::id() as i32), Type::INT4),
                    (&(max_threads as i32), Type::INT4),
                ],
            ),
        )?;
        Ok(true)
    }

    /// Says this worker is alive, and what its threads are doing.
    fn heartbeat(&self, activities: &[(ThreadId, Activity)]) -> Result<()> {
        let ids: Vec<String> = activities.iter().map(|(id, _)| id.to_string()).collect();
        let states: Vec<Json<Activity>> = activities.iter().map(|(_, a)| Json(a.clone())).collect();
        // One statement, through the group committer: it updates the rows of many threads,
        // which the committer's transactions lock too, and two transactions of one process
        // locking them in different orders would deadlock.
        super::block(self.pg.commit(
            "send the worker's heartbeat",
            "WITH w AS (UPDATE uncaged_workflow.workers SET heartbeat_at = now() WHERE id = $1) \
             UPDATE uncaged_workflow.threads SET activity = a.activity \
             FROM unnest($2::text[], $3::jsonb[]) AS a(id, activity) \
             WHERE threads.id = a.id AND threads.lease_owner = $1",
            vec![
                (Box::new(self.pg.owner().to_string()), Type::TEXT),
                (Box::new(ids), Type::TEXT_ARRAY),
                (Box::new(states), Type::JSONB_ARRAY),
            ],
        ))?;
        Ok(())
    }

    /// Removes this worker from the list (a clean exit).
    fn unregister(&self) -> Result<()> {
        let client = self.pg.client()?;
        self.pg.wait(
            "unregister the worker",
            client.execute_typed(
                "DELETE FROM uncaged_workflow.workers WHERE id = $1",
                &[(&self.pg.owner(), Type::TEXT)],
            ),
        )?;
        Ok(())
    }

    /// How many workers are alive: those that sent a heartbeat within [`ALIVE_WITHIN`], but
    /// for those of this machine whose process has gone. A start does not wait for a worker to
    /// take its thread, so a worker killed a moment ago must not count: on one machine with
    /// no worker service, the thread would wait for the next command to start one.
    fn live_workers(&self) -> Result<usize> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "count live workers",
            client.query_typed(
                "SELECT host, pid FROM uncaged_workflow.workers \
                 WHERE heartbeat_at > now() - $1::bigint * interval '1 millisecond'",
                &[(&(ALIVE_WITHIN.as_millis() as i64), Type::INT8)],
            ),
        )?;
        let here = hostname();
        Ok(rows.iter().filter(|row| may_run(row.get(0), row.get(1), &here)).count())
    }

    /// Whether a worker took thread `id` from the queue: it holds it under a live lease, or
    /// has run it already (it is no longer runnable).
    fn is_taken(&self, id: ThreadId) -> Result<bool> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            &format!("look whether a worker took thread {id}"),
            client.query_typed_opt(
                "SELECT 1 FROM uncaged_workflow.threads WHERE id = $1 \
                 AND (NOT runnable OR (lease_owner IS NOT NULL AND lease_until > now()))",
                &[(&id.to_string(), Type::TEXT)],
            ),
        )?;
        Ok(row.is_some())
    }

    /// Threads that are queued or held by a live lease, with their worker.
    fn live_threads(&self) -> Result<Vec<LiveThread>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "list running threads",
            client.query_typed(
                &format!(
                    "SELECT t.activity, w.host, w.pid, \
                            t.lease_owner IS NOT NULL AND t.lease_until > now(), {} \
                     FROM uncaged_workflow.threads t \
                     LEFT JOIN uncaged_workflow.workers w ON w.id = t.lease_owner \
                     WHERE t.runnable OR (t.lease_owner IS NOT NULL AND t.lease_until > now()) \
                     ORDER BY t.id",
                    summary::COLUMNS
                ),
                &[],
            ),
        )?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let held: bool = row.get(3);
                let host: Option<String> = row.get(1);
                let pid: Option<i32> = row.get(2);
                // A summary that does not read is left out, as listings leave it out.
                let summary = summary::read(row, 4)?;
                Some(LiveThread {
                    summary,
                    activity: row.get::<_, Option<Json<Activity>>>(0).map(|Json(a)| a),
                    worker: match (held, host, pid) {
                        (true, Some(host), Some(pid)) => Some((host, pid as u32)),
                        (true, _, _) => Some((String::from("?"), 0)),
                        _ => None,
                    },
                })
            })
            .collect())
    }

    /// What thread `id` is doing, as its worker last published it.
    fn activity(&self, id: ThreadId) -> Result<Option<Activity>> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            &format!("read what thread {id} does"),
            client.query_typed_opt(
                "SELECT activity FROM uncaged_workflow.threads \
                 WHERE id = $1 AND lease_owner IS NOT NULL",
                &[(&id.to_string(), Type::TEXT)],
            ),
        )?;
        Ok(row.and_then(|row| row.get::<_, Option<Json<Activity>>>(0)).map(|Json(a)| a))
    }

    fn wake_ups(&self) -> Result<Option<tokio::sync::mpsc::UnboundedReceiver<()>>> {
        if self.pg.inner.no_notifications.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        self.listen(&[QUEUE_CHANNEL, CONTROL_CHANNEL]).map(Some)
    }

    fn hold(&self) -> Option<Duration> {
        Some(self.pg.lease())
    }

    fn next_takeover(&self, within: Duration) -> Result<Option<Duration>> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            "look when a lease runs out",
            client.query_typed_one(
                "SELECT (EXTRACT(EPOCH FROM min(lease_until) - now()) * 1000)::bigint \
                 FROM uncaged_workflow.threads \
                 WHERE runnable AND lease_owner <> $1 AND lease_until > now() \
                   AND lease_until < now() + $2::bigint * interval '1 millisecond'",
                &[(&self.pg.owner(), Type::TEXT), (&(within.as_millis() as i64), Type::INT8)],
            ),
        )?;
        Ok(row.get::<_, Option<i64>>(0).map(|ms| Duration::from_millis(ms.max(0) as u64)))
    }

    /// The leases of dead workers still to run out: those whose owner is not in the list of
    /// workers, sent no heartbeat within [`ALIVE_WITHIN`], or is a process of this machine
    /// that is gone (as [`PgQueue::live_workers`] counts them).
    fn orphaned_until(&self) -> Result<Option<Duration>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "look for the leases of dead workers",
            client.query_typed(
                "SELECT (EXTRACT(EPOCH FROM t.lease_until - now()) * 1000)::bigint, \
                        w.host, w.pid, \
                        coalesce(w.heartbeat_at > now() - $2::bigint * interval '1 millisecond', \
                                 false) \
                 FROM uncaged_workflow.threads t \
                 LEFT JOIN uncaged_workflow.workers w ON w.id = t.lease_owner \
                 WHERE t.runnable AND t.lease_owner <> $1 AND t.lease_until > now()",
                &[(&self.pg.owner(), Type::TEXT), (&(ALIVE_WITHIN.as_millis() as i64), Type::INT8)],
            ),
        )?;
        let here = hostname();
        let orphaned = rows.iter().filter(|row| {
            let beating: bool = row.get(3);
            let listed = row.get::<_, Option<&str>>(1).zip(row.get::<_, Option<i32>>(2));
            !beating || listed.is_none_or(|(host, pid)| !may_run(host, pid, &here))
        });
        let last = orphaned.map(|row| row.get::<_, i64>(0)).max();
        Ok(last.map(|ms| Duration::from_millis(ms.max(0) as u64)))
    }

    fn owner(&self) -> String {
        self.pg.owner().to_string()
    }

    fn live(&self) -> Option<&dyn LiveChannel> {
        Some(&self.live)
    }
}
