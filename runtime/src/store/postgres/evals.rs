//! Evals in PostgreSQL: the `evals` table, one row per experiment, its definition as JSON; and
//! `eval_sets`, one row per named set of threads.

use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::store::evals::{EvalBackend, EvalSet, Experiment};
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

/// The value a row's JSON holds (of `table`, keyed `key`).
fn parse<T: serde::de::DeserializeOwned>(table: &str, key: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::Corrupt {
        path: format!("{table} row {key}").into(),
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
        rows.first().map(|row| parse("evals", &id, row.get(0))).transpose()
    }

    fn list(&self) -> Result<Vec<Experiment>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "list the evals",
            client
                .query_typed("SELECT id, experiment FROM uncaged_workflow.evals ORDER BY id", &[]),
        )?;
        rows.iter().map(|row| parse("evals", row.get(0), row.get(1))).collect()
    }

    fn put_set(&self, set: &EvalSet) -> Result<()> {
        let client = self.pg.client()?;
        let json = serde_json::to_string(set).expect("a set serializes");
        self.pg.wait(
            "keep an eval set",
            client.execute_typed(
                "INSERT INTO uncaged_workflow.eval_sets (name, set_json) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET set_json = EXCLUDED.set_json",
                &[(&set.name, Type::TEXT), (&json, Type::TEXT)],
            ),
        )?;
        Ok(())
    }

    fn get_set(&self, name: &str) -> Result<Option<EvalSet>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "read an eval set",
            client.query_typed(
                "SELECT set_json FROM uncaged_workflow.eval_sets WHERE name = $1",
                &[(&name, Type::TEXT)],
            ),
        )?;
        rows.first().map(|row| parse("eval_sets", name, row.get(0))).transpose()
    }

    fn list_sets(&self) -> Result<Vec<EvalSet>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "list the eval sets",
            client.query_typed(
                "SELECT name, set_json FROM uncaged_workflow.eval_sets ORDER BY name",
                &[],
            ),
        )?;
        rows.iter().map(|row| parse("eval_sets", row.get(0), row.get(1))).collect()
    }
}
