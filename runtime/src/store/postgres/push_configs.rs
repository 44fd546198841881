//! A2A push configs in PostgreSQL: the `push_configs` table, a row per config.

use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::store::postgres::Postgres;
use crate::store::push_configs::{PushConfig, PushConfigBackend, check_id};

#[derive(Debug)]
pub struct PgPushConfigs {
    pg: Postgres,
}

impl PgPushConfigs {
    pub fn new(pg: &Postgres) -> Self {
        PgPushConfigs { pg: pg.clone() }
    }

    fn rows(&self, action: &str, sql: &str, thread: Option<String>) -> Result<Vec<PushConfig>> {
        let client = self.pg.client()?;
        let rows = match &thread {
            Some(thread) => {
                self.pg.wait(action, client.query_typed(sql, &[(thread, Type::TEXT)]))?
            }
            None => self.pg.wait(action, client.query_typed(sql, &[]))?,
        };
        let mut found: Vec<PushConfig> = rows
            .iter()
            .map(|row| {
                serde_json::from_str(row.get(0)).map_err(|e| Error::Corrupt {
                    path: format!("{}: push_configs", self.pg.target()).into(),
                    reason: e.to_string(),
                })
            })
            .collect::<Result<_>>()?;
        found.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        Ok(found)
    }
}

impl PushConfigBackend for PgPushConfigs {
    fn put(&self, config: &PushConfig) -> Result<()> {
        check_id(&config.id).map_err(Error::Usage)?;
        let client = self.pg.client()?;
        let json = serde_json::to_string(config).expect("a push config serializes");
        self.pg.wait(
            "keep a push config",
            client.execute_typed(
                "INSERT INTO uncaged_workflow.push_configs (thread_id, id, config)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (thread_id, id) DO UPDATE SET config = EXCLUDED.config",
                &[
                    (&config.thread.to_string(), Type::TEXT),
                    (&config.id, Type::TEXT),
                    (&json, Type::TEXT),
                ],
            ),
        )?;
        Ok(())
    }

    fn of_thread(&self, thread: ThreadId) -> Result<Vec<PushConfig>> {
        self.rows(
            "list a task's push configs",
            "SELECT config FROM uncaged_workflow.push_configs WHERE thread_id = $1",
            Some(thread.to_string()),
        )
    }

    fn delete(&self, thread: ThreadId, id: &str) -> Result<bool> {
        let client = self.pg.client()?;
        let deleted = self.pg.wait(
            "forget a push config",
            client.execute_typed(
                "DELETE FROM uncaged_workflow.push_configs WHERE thread_id = $1 AND id = $2",
                &[(&thread.to_string(), Type::TEXT), (&id, Type::TEXT)],
            ),
        )?;
        Ok(deleted > 0)
    }

    fn all(&self) -> Result<Vec<PushConfig>> {
        self.rows("list push configs", "SELECT config FROM uncaged_workflow.push_configs", None)
    }
}
