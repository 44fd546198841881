//! Schedules in PostgreSQL: definitions and poll states in `schedules`, the append-only firing
//! log in `schedule_firings`, and the firing lock as a session advisory lock, so that `serve`
//! and `schedule tick` on any number of machines fire each cron instant and poll item once.
//!
//! The lock is held by a connection of its own, and everything written under it (firings,
//! definitions) is written through that connection: if the session ends — the process is
//! killed, the network cut — the lock is gone and so is the only way to write under it, so a
//! process that lost the lock cannot record a firing another process also records.

use tokio_postgres::Client;
use tokio_postgres::types::Json;

use crate::error::{Error, Result};
use crate::store::postgres::Postgres;
use crate::store::schedules::{
    FireLock, FiringEvent, FiringHistory, PollState, Schedule, ScheduleBackend,
};

/// The advisory lock key of the firing lock ("uwfire").
const FIRE_LOCK: i64 = 0x7577_6669_7265;

/// The schedules in the database.
#[derive(Debug)]
pub struct PgSchedules {
    pg: Postgres,
}

impl PgSchedules {
    pub fn new(pg: &Postgres) -> Self {
        PgSchedules { pg: pg.clone() }
    }

    /// The session holding the firing lock.
    fn session<'a>(&self, lock: &'a FireLock) -> Result<&'a Client> {
        match lock {
            FireLock::Database(client) if !client.is_closed() => Ok(client),
            FireLock::Database(_) => Err(Error::Database {
                target: self.pg.target().to_string(),
                failure: crate::error::DatabaseFailure::Unreachable,
                reason: "the connection holding the firing lock was lost".into(),
            }),
            FireLock::File(_) => Err(Error::Host("a home's firing lock used on a database".into())),
        }
    }
}

impl ScheduleBackend for PgSchedules {
    fn lock(&self) -> Result<FireLock> {
        let client = self.pg.dedicated()?;
        self.pg.wait(
            "take the firing lock",
            client.execute("SELECT pg_advisory_lock($1)", &[&FIRE_LOCK]),
        )?;
        Ok(FireLock::Database(client))
    }

    fn list(&self) -> Result<Vec<Schedule>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "list the schedules",
            client.query("SELECT name, definition FROM schedules ORDER BY name", &[]),
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
            client.query_opt("SELECT definition FROM schedules WHERE name = $1", &[&name]),
        )?;
        let Some(row) = row else { return Ok(None) };
        serde_json::from_value(row.get(0))
            .map(Some)
            .map_err(|e| self.pg.bad_data(format!("schedule `{name}` does not read: {e}")))
    }

    fn put(&self, schedule: &Schedule, lock: &FireLock) -> Result<()> {
        let client = self.session(lock)?;
        self.pg.wait(
            "write a schedule",
            client.execute(
                "INSERT INTO schedules (name, definition) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition",
                &[&schedule.name, &Json(schedule)],
            ),
        )?;
        Ok(())
    }

    fn remove(&self, name: &str, lock: &FireLock) -> Result<bool> {
        let client = self.session(lock)?;
        let removed = self.pg.wait(
            "remove a schedule",
            client.execute("DELETE FROM schedules WHERE name = $1", &[&name]),
        )?;
        Ok(removed > 0)
    }

    fn record(&self, name: &str, event: &FiringEvent, lock: &FireLock) -> Result<()> {
        let client = self.session(lock)?;
        self.pg.wait(
            "record a firing",
            client.execute(
                "INSERT INTO schedule_firings (schedule, event) VALUES ($1, $2)",
                &[&name, &Json(event)],
            ),
        )?;
        Ok(())
    }

    fn catch_up(&self, name: &str, history: &mut FiringHistory) -> Result<()> {
        let client = self.pg.client()?;
        let after = i64::try_from(history.position()).unwrap_or(i64::MAX);
        let rows = self.pg.wait(
            "read a firing log",
            client.query(
                "SELECT id, event FROM schedule_firings WHERE schedule = $1 AND id > $2
                 ORDER BY id",
                &[&name, &after],
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
            client.query_opt("SELECT poll_state FROM schedules WHERE name = $1", &[&name]),
        )?;
        let state: Option<serde_json::Value> = row.and_then(|row| row.get(0));
        // Damaged or absent: as if never checked (the firing log says what was seen).
        Ok(state.and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default())
    }

    fn set_poll_state(&self, name: &str, state: &PollState) -> Result<()> {
        let client = self.pg.client()?;
        self.pg.wait(
            "record a poll's check",
            client.execute(
                "UPDATE schedules SET poll_state = $2 WHERE name = $1",
                &[&name, &Json(state)],
            ),
        )?;
        Ok(())
    }
}
