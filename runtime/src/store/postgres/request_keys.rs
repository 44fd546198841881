//! Request keys in PostgreSQL: the `request_keys` table, whose primary key lets one request
//! of many — from any process, on any machine — claim a key.

use crate::error::Result;
use crate::store::postgres::{Postgres, commit};
use crate::store::request_keys::{Claim, RequestKey, RequestKeys};
use tokio_postgres::types::Type;

/// The request keys in the database.
#[derive(Debug)]
pub struct PgRequestKeys {
    pg: Postgres,
}

impl PgRequestKeys {
    pub fn new(pg: &Postgres) -> Self {
        PgRequestKeys { pg: pg.clone() }
    }
}

/// A key claimed, unless it was: one row back if this claim made it.
const CLAIM: &str = "INSERT INTO uncaged_workflow.request_keys \
         (scope, key, fingerprint, thread_id, created_ms) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING 1";

impl RequestKeys for PgRequestKeys {
    fn claim(&self, key: &RequestKey) -> Result<Claim> {
        let created = i64::try_from(key.created).unwrap_or(i64::MAX);
        // Through the group commit: the claims that arrive together (a burst of deliveries)
        // share a WAL flush, as the threads they then start do.
        let params: commit::Params = vec![
            (Box::new(key.scope.clone()), Type::TEXT),
            (Box::new(key.key.clone()), Type::TEXT),
            (Box::new(key.fingerprint.clone()), Type::TEXT),
            (Box::new(key.thread.to_string()), Type::TEXT),
            (Box::new(created), Type::INT8),
        ];
        let claimed = super::block(self.pg.commit("claim a request key", CLAIM, params))?.len();
        let client = self.pg.client()?;
        if claimed == 1 {
            return Ok(Claim::New);
        }
        let row = self.pg.wait(
            "read a request key",
            client.query_typed_one(
                "SELECT fingerprint, thread_id, created_ms FROM uncaged_workflow.request_keys
                 WHERE scope = $1 AND key = $2",
                &[(&key.scope, Type::TEXT), (&key.key, Type::TEXT)],
            ),
        )?;
        let thread: String = row.get(1);
        let thread = thread
            .parse()
            .map_err(|e| self.pg.bad_data(format!("request key's thread `{thread}`: {e}")))?;
        Ok(Claim::Taken(RequestKey {
            scope: key.scope.clone(),
            key: key.key.clone(),
            fingerprint: row.get(0),
            thread,
            created: row.get::<_, i64>(2).max(0) as u64,
        }))
    }

    fn forget_before(&self, cutoff: u64) -> Result<usize> {
        let client = self.pg.client()?;
        let cutoff = i64::try_from(cutoff).unwrap_or(i64::MAX);
        let forgotten = self.pg.wait(
            "forget old request keys",
            client.execute_typed(
                "DELETE FROM uncaged_workflow.request_keys WHERE created_ms < $1",
                &[(&cutoff, Type::INT8)],
            ),
        )?;
        Ok(forgotten as usize)
    }
}
