//! OAuth credentials in PostgreSQL: the `tool_credentials` table, one row per server URL, so
//! that the workers of every machine use (and refresh) what one `tools login` got.

use tokio_postgres::types::Type;

use crate::clock::now_ms;
use crate::error::Result;
use crate::store::credentials::CredentialBackend;
use crate::store::postgres::Postgres;

/// The credentials in the database.
#[derive(Debug)]
pub struct PgCredentials {
    pg: Postgres,
}

impl PgCredentials {
    pub fn new(pg: &Postgres) -> Self {
        PgCredentials { pg: pg.clone() }
    }
}

impl CredentialBackend for PgCredentials {
    fn read(&self, url: &str) -> Result<Option<String>> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            "read the credentials of a tool server",
            client.query_typed_opt(
                "SELECT credentials FROM uncaged_workflow.tool_credentials WHERE url = $1",
                &[(&url, Type::TEXT)],
            ),
        )?;
        Ok(row.map(|row| row.get(0)))
    }

    fn write(&self, url: &str, credentials: &str) -> Result<()> {
        let client = self.pg.client()?;
        let now = i64::try_from(now_ms()).unwrap_or(i64::MAX);
        self.pg.wait(
            "keep the credentials of a tool server",
            client.execute_typed(
                "INSERT INTO uncaged_workflow.tool_credentials (url, credentials, updated_ms)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (url) DO UPDATE SET credentials = $2, updated_ms = $3",
                &[(&url, Type::TEXT), (&credentials, Type::TEXT), (&now, Type::INT8)],
            ),
        )?;
        Ok(())
    }

    fn remove(&self, url: &str) -> Result<bool> {
        let client = self.pg.client()?;
        let removed = self.pg.wait(
            "forget the credentials of a tool server",
            client.execute_typed(
                "DELETE FROM uncaged_workflow.tool_credentials WHERE url = $1",
                &[(&url, Type::TEXT)],
            ),
        )?;
        Ok(removed > 0)
    }
}
