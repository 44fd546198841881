//! Evals in PostgreSQL: the `evals` table, one row per experiment, its definition as JSON.

use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::store::evals::{EvalBackend, Experiment};
use crate::store::postgres::Postgres;

/// The experiments in the database.
#[derive(Debug)]
pub struct PgEvals {
    pg: Postgres,
}

impl PgEvals {
    pub fn new(pg: &Postgres) -> Self {
        PgEvals { pg: pg.clone() }
    }
}

/// The experiment a row's JSON holds.
fn parse(id: &str, text: &str) -> Result<Experiment> {
    serde_json::from_str(text).map_err(|e| Error::Corrupt {
        path: format!("evals row {id}").into(),
        reason: e.to_string(),
    })
}

impl EvalBackend for PgEvals {
    fn put(&self, experiment: &Experiment) -> Result<()> {
        let client = self.pg.client()?;
        let json = serde_json::to_string(experiment).expect("an experiment serializes");
        self.pg.wait(
            "keep an eval",
            client.execute_typed(
                "INSERT INTO uncaged_workflow.evals (id, experiment) VALUES ($1, $2)
                 ON CONFLICT (id) DO UPDATE SET experiment = EXCLUDED.experiment",
                &[(&experiment.id.to_string(), Type::TEXT), (&json, Type::TEXT)],
            ),
        )?;
        Ok(())
    }

    fn get(&self, id: ThreadId) -> Result<Option<Experiment>> {
        let client = self.pg.client()?;
        let id = id.to_string();
        let rows = self.pg.wait(
            "read an eval",
            client.query_typed(
                "SELECT experiment FROM uncaged_workflow.evals WHERE id = $1",
                &[(&id, Type::TEXT)],
            ),
        )?;
        rows.first().map(|row| parse(&id, row.get(0))).transpose()
    }

    fn list(&self) -> Result<Vec<Experiment>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "list the evals",
            client
                .query_typed("SELECT id, experiment FROM uncaged_workflow.evals ORDER BY id", &[]),
        )?;
        rows.iter().map(|row| parse(row.get(0), row.get(1))).collect()
    }
}
