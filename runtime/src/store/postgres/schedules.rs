//! Schedules in PostgreSQL: definitions and poll states in `schedules`, the append-only firing
//! log in `schedule_firings`, and the firing lock, so that `serve` and `schedule tick` on any
//! number of machines fire each cron instant and poll item once.
//!
//! The lock is a transaction-scoped advisory lock, held by a transaction left open on a
//! connection of its own: it goes when that connection goes (the process is killed, the
//! network cut), at once, and it holds behind a transaction-pooling PgBouncer, which keeps a
//! server connection for a client while its transaction is open. What is written under the
//! lock must be durable at once, so it is written outside that transaction, fenced: taking
//! the lock counts `fire_lock.generation` up, and each write commits only while the
//! generation is still the holder's (it locks that row for share, so a new holder's count
//! waits for a write in flight, and then reads what it wrote). A process that lost the lock
//! cannot record a firing another process also records.

use tokio_postgres::SimpleQueryMessage;
use tokio_postgres::types::{Json, ToSql, Type};

use crate::error::{DatabaseFailure, Error, Result};
use crate::store::postgres::Postgres;
use crate::store::schedules::{
    FireLock, FiringEvent, FiringHistory, PollState, Schedule, ScheduleBackend,
};

/// The advisory lock key of the firing lock ("uwfire").
const FIRE_LOCK: i64 = 0x7577_6669_7265;

/// How often a process waiting for the firing lock tries it again.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// The schedules in the database.
#[derive(Debug)]
pub struct PgSchedules {
    pg: Postgres,
}

impl PgSchedules {
    pub fn new(pg: &Postgres) -> Self {
        PgSchedules { pg: pg.clone() }
    }

    /// The generation a write under `lock` is fenced by.
    fn generation(&self, lock: &FireLock) -> Result<i64> {
        match lock {
            FireLock::Database { holder, generation } if !holder.lost() => Ok(*generation),
            FireLock::Database { .. } => Err(self.lost()),
            FireLock::File(_) => Err(Error::Host("a home's firing lock used on a database".into())),
        }
    }

    fn lost(&self) -> Error {
        Error::Database {
            target: self.pg.target().to_string(),
            failure: DatabaseFailure::Unreachable,
            reason: "the firing lock was lost (its connection closed, or another process \
                     took it over)"
                .into(),
        }
    }
}

impl ScheduleBackend for PgSchedules {
    fn lock(&self) -> Result<FireLock> {
        let mut holder = self.pg.dedicated()?;
        holder.holds_transaction();
        // Tried, not waited for inside the transaction: a process waiting there would hold a
        // server connection of a pooler's few for as long as it waits.
        loop {
            // One round trip; the key is this program's constant, not input.
            let tried = self.pg.wait(
                "take the firing lock",
                holder
                    .simple_query(&format!("BEGIN; SELECT pg_try_advisory_xact_lock({FIRE_LOCK})")),
            )?;
            let taken = tried.iter().any(|message| {
                matches!(message, SimpleQueryMessage::Row(row) if row.get(0) == Some("t"))
            });
            if taken {
                break;
            }
            self.pg.wait("wait for the firing lock", holder.batch_execute("ROLLBACK"))?;
            std::thread::sleep(LOCK_RETRY);
        }
        // Counted on the shared connection, so that it commits now (the holder's transaction
        // stays open as long as the lock is held).
        let client = self.pg.client()?;
        let row = self.pg.wait(
            "take the firing lock",
            client.query_typed_one(
                "UPDATE uncaged_workflow.fire_lock SET generation = generation + 1 \
                 RETURNING generation",
                &[],
            ),
        )?;
        Ok(FireLock::Database { holder: Box::new(holder), generation: row.get(0) })
    }

    fn list(&self) -> Result<Vec<Schedule>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "list the schedules",
            client.query_typed(
                "SELECT name, definition FROM uncaged_workflow.schedules ORDER BY name",
                &[],
            ),
        )?;
        let mut schedules = Vec::new();
        for row in rows {
            let name: String = row.get(0);
            match serde_json::from_value(row.get(1)) {
                Ok(schedule) => schedules.push(schedule),
                Err(e) => tracing::warn!("schedule `{name}` left out: {e}"),
            }
        }
        Ok(schedules)
    }

    fn get(&self, name: &str) -> Result<Option<Schedule>> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            "read a schedule",
            client.query_typed_opt(
                "SELECT definition FROM uncaged_workflow.schedules WHERE name = $1",
                &[(&name, Type::TEXT)],
            ),
        )?;
        let Some(row) = row else { return Ok(None) };
        serde_json::from_value(row.get(0))
            .map(Some)
            .map_err(|e| self.pg.bad_data(format!("schedule `{name}` does not read: {e}")))
    }

    fn put(&self, schedule: &Schedule, lock: &FireLock) -> Result<()> {
        self.fenced(
            "write a schedule",
            lock,
            "INSERT INTO uncaged_workflow.schedules (name, definition) SELECT $2, $3 FROM held \
             ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition",
            &[(&schedule.name, Type::TEXT), (&Json(schedule), Type::JSONB)],
        )?;
        Ok(())
    }

    fn remove(&self, name: &str, lock: &FireLock) -> Result<bool> {
        let removed = self.fenced(
            "remove a schedule",
            lock,
            "DELETE FROM uncaged_workflow.schedules \
             WHERE name = $2 AND EXISTS (SELECT 1 FROM held)",
            &[(&name, Type::TEXT)],
        )?;
        Ok(removed > 0)
    }

    fn record(&self, name: &str, event: &FiringEvent, lock: &FireLock) -> Result<()> {
        self.fenced(
            "record a firing",
            lock,
            "INSERT INTO uncaged_workflow.schedule_firings (schedule, event) \
             SELECT $2, $3 FROM held",
            &[(&name, Type::TEXT), (&Json(event), Type::JSONB)],
        )?;
        Ok(())
    }

    fn catch_up(&self, name: &str, history: &mut FiringHistory) -> Result<()> {
        let client = self.pg.client()?;
        let after = i64::try_from(history.position()).unwrap_or(i64::MAX);
        let rows = self.pg.wait(
            "read a firing log",
            client.query_typed(
                "SELECT id, event FROM uncaged_workflow.schedule_firings \
                 WHERE schedule = $1 AND id > $2 ORDER BY id",
                &[(&name, Type::TEXT), (&after, Type::INT8)],
            ),
        )?;
        for row in rows {
            let id: i64 = row.get(0);
            match serde_json::from_value::<FiringEvent>(row.get(1)) {
                Ok(event) => history.apply_at(event, id as u64),
                Err(e) => {
                    return Err(self
                        .pg
                        .bad_data(format!("firing {id} of `{name}` does not read: {e}")));
                }
            }
        }
        Ok(())
    }

    fn poll_state(&self, name: &str) -> Result<PollState> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            "read a poll's last check",
            client.query_typed_opt(
                "SELECT poll_state FROM uncaged_workflow.schedules WHERE name = $1",
                &[(&name, Type::TEXT)],
            ),
        )?;
        let state: Option<serde_json::Value> = row.and_then(|row| row.get(0));
        // Damaged or absent: as if never checked (the firing log says what was seen).
        Ok(state.and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default())
    }

    fn set_poll_state(&self, name: &str, state: &PollState) -> Result<()> {
        let client = self.pg.client()?;
        self.pg.wait(
            "record a poll's check",
            client.execute_typed(
                "UPDATE uncaged_workflow.schedules SET poll_state = $2 WHERE name = $1",
                &[(&name, Type::TEXT), (&Json(state), Type::JSONB)],
            ),
        )?;
        Ok(())
    }
}

impl PgSchedules {
    /// Runs `write` (a statement whose parameters start at `$2`, and which writes only rows
    /// it joins with `held`) if `lock` still holds the firing lock; the rows it wrote.
    fn fenced(
        &self,
        action: &str,
        lock: &FireLock,
        write: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<u64> {
        let generation = self.generation(lock)?;
        let sql = format!(
            "WITH held AS (SELECT 1 FROM uncaged_workflow.fire_lock \
                           WHERE generation = $1 FOR SHARE), \
                  written AS ({write} RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM held), (SELECT count(*) FROM written)"
        );
        let mut all: Vec<(&(dyn ToSql + Sync), Type)> = vec![(&generation, Type::INT8)];
        all.extend(params.iter().cloned());
        let client = self.pg.client()?;
        let row = self.pg.wait(action, client.query_typed_one(&sql, &all))?;
        if !row.get::<_, bool>(0) {
            return Err(self.lost());
        }
        Ok(row.get::<_, i64>(1) as u64)
    }
}
