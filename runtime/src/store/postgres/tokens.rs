//! API tokens in PostgreSQL: the `api_tokens` table, one row per token (its hash only).

use tokio_postgres::Row;
use tokio_postgres::types::Type;

use crate::error::Result;
use crate::store::postgres::Postgres;
use crate::store::tokens::{ApiToken, TokenBackend, taken};

/// The tokens in the database.
#[derive(Debug)]
pub struct PgTokens {
    pg: Postgres,
}

impl PgTokens {
    pub fn new(pg: &Postgres) -> Self {
        PgTokens { pg: pg.clone() }
    }
}

fn token(row: &Row) -> ApiToken {
    ApiToken {
        name: row.get(0),
        hash: row.get(1),
        read_only: row.get(2),
        created: row.get::<_, i64>(3).max(0) as u64,
    }
}

impl TokenBackend for PgTokens {
    fn add(&self, token: &ApiToken) -> Result<()> {
        let client = self.pg.client()?;
        let created = i64::try_from(token.created).unwrap_or(i64::MAX);
        let added = self.pg.wait(
            "add a token",
            client.execute_typed(
                "INSERT INTO uncaged_workflow.api_tokens (name, hash, read_only, created_ms)
                 VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING",
                &[
                    (&token.name, Type::TEXT),
                    (&token.hash, Type::TEXT),
                    (&token.read_only, Type::BOOL),
                    (&created, Type::INT8),
                ],
            ),
        )?;
        if added == 0 {
            return Err(taken(&token.name));
        }
        Ok(())
    }

    fn list(&self) -> Result<Vec<ApiToken>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "list the tokens",
            client.query_typed(
                "SELECT name, hash, read_only, created_ms FROM uncaged_workflow.api_tokens \
                 ORDER BY name",
                &[],
            ),
        )?;
        Ok(rows.iter().map(token).collect())
    }

    fn revoke(&self, name: &str) -> Result<bool> {
        let client = self.pg.client()?;
        let removed = self.pg.wait(
            "revoke a token",
            client.execute_typed(
                "DELETE FROM uncaged_workflow.api_tokens WHERE name = $1",
                &[(&name, Type::TEXT)],
            ),
        )?;
        Ok(removed > 0)
    }

    fn find(&self, hash: &str) -> Result<Option<ApiToken>> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            "look up a token",
            client.query_typed_opt(
                "SELECT name, hash, read_only, created_ms FROM uncaged_workflow.api_tokens \
                 WHERE hash = $1",
                &[(&hash, Type::TEXT)],
            ),
        )?;
        Ok(row.as_ref().map(token))
    }
}
