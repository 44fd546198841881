//! A thread's call journal in PostgreSQL: one row per call, appended in order, fenced by
//! the lease when this process runs the thread. Calls that need not be durable alone wait
//! for the thread's next record (see [`deferred`](super::deferred)).

use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::store::journal::{CallLog, JournalLine};
use crate::store::postgres::leases::Leases;
use crate::store::postgres::{Postgres, commit, json_line};

/// A thread's call journal: rows appended in order, fenced by the lease when this process
/// runs the thread (an `answer` for a waiting thread is written by a process without one).
#[derive(Debug)]
pub(super) struct PgCalls {
    pg: Postgres,
    leases: Leases,
    id: ThreadId,
}

impl PgCalls {
    pub(super) fn new(pg: &Postgres, leases: &Leases, id: ThreadId) -> Self {
        PgCalls { pg: pg.clone(), leases: leases.clone(), id }
    }
}

impl CallLog for PgCalls {
    fn read(&self) -> Result<Vec<JournalLine>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            &format!("read the call journal of thread {}", self.id),
            client.query_typed(
                "SELECT line FROM uncaged_workflow.thread_calls WHERE thread = $1 ORDER BY seq",
                &[(&self.id.to_string(), Type::TEXT)],
            ),
        )?;
        Ok(rows.iter().filter_map(|row| serde_json::from_str(row.get::<_, &str>(0)).ok()).collect())
    }

    /// A `durable` record is committed when this returns, with the calls deferred before
    /// it; one that need not be (a scripted agent's answer) is kept until the thread's next
    /// record and written in its statement, as the home directory leaves it to the page
    /// cache: losing it only means making the call again.
    fn append(&mut self, record: &JournalLine, durable: bool) -> Result<()> {
        let line = json_line(record);
        let action = format!("append to the call journal of thread {}", self.id);
        let id = self.id.to_string();
        let Some(token) = self.leases.token(self.id) else {
            // An `answer` to a waiting thread, from a process that does not run it.
            let client = self.pg.client()?;
            let written = self.pg.wait(
                &action,
                client.execute_typed(
                    "INSERT INTO uncaged_workflow.thread_calls (thread, line) \
                     SELECT $1, $2 FROM uncaged_workflow.threads WHERE id = $1 FOR SHARE",
                    &[(&id, Type::TEXT), (&line, Type::TEXT)],
                ),
            )?;
            return match written {
                0 => Err(Error::UnknownThread(id)),
                _ => Ok(()),
            };
        };
        if !durable {
            self.pg.deferred().call(self.id, line);
            return Ok(());
        }
        // The calls before this one go with it; the log waits for the next record.
        let mut lines = self.pg.deferred().take_calls(self.id);
        lines.push(line);
        let expected = lines.len() as i64;
        let params: commit::Params = vec![
            (Box::new(id), Type::TEXT),
            (Box::new(token), Type::INT8),
            (Box::new(lines), Type::TEXT_ARRAY),
        ];
        let rows = super::block(self.pg.commit(&action, JOURNAL, params))?;
        let written: i64 = rows.first().map_or(0, |row| row.get(0));
        if written != expected {
            self.leases.lost(self.id);
            return Err(Error::LeaseLost(self.id.to_string()));
        }
        Ok(())
    }
}

/// Appends journaled calls, fenced by the lease token; counts what it wrote.
const JOURNAL: &str = "WITH c AS ( \
         INSERT INTO uncaged_workflow.thread_calls (thread, line) \
         SELECT $1, s.line \
         FROM (SELECT 1 FROM uncaged_workflow.threads \
               WHERE id = $1 AND lease_token = $2 FOR SHARE) held, \
              unnest($3::text[]) WITH ORDINALITY AS s(line, i) \
         ORDER BY s.i RETURNING 1) \
     SELECT count(*) FROM c";
