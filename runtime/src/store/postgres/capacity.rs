//! Provider limits in PostgreSQL: a row of `provider_limits` per limit, whose state one
//! transaction at a time reads and writes under a row lock, so that every worker of every
//! machine draws on one budget. (Plain statements in a transaction: it works behind a
//! transaction-pooling PgBouncer.)

use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::store::capacity::{CapacityBackend, LimitState};
use crate::store::postgres::Postgres;

/// The limits in the database.
#[derive(Debug)]
pub struct PgCapacity {
    pg: Postgres,
}

impl PgCapacity {
    pub fn new(pg: &Postgres) -> Self {
        PgCapacity { pg: pg.clone() }
    }

    fn parse(&self, name: &str, text: &str) -> Result<LimitState> {
        serde_json::from_str(text).map_err(|e| Error::Corrupt {
            path: format!("{}: provider_limits[{name}]", self.pg.target()).into(),
            reason: e.to_string(),
        })
    }
}

impl CapacityBackend for PgCapacity {
    fn update(&self, name: &str, change: &mut dyn FnMut(&mut LimitState)) -> Result<()> {
        let pg = &self.pg;
        let mut client = pg.dedicated()?;
        let tx = pg.wait("reserve capacity", client.transaction())?;
        pg.wait(
            "reserve capacity",
            tx.execute_typed(
                "INSERT INTO uncaged_workflow.provider_limits (name, state) VALUES ($1, '{}')
                 ON CONFLICT (name) DO NOTHING",
                &[(&name, Type::TEXT)],
            ),
        )?;
        let row = pg.wait(
            "reserve capacity",
            tx.query_typed_one(
                "SELECT state FROM uncaged_workflow.provider_limits WHERE name = $1 FOR UPDATE",
                &[(&name, Type::TEXT)],
            ),
        )?;
        let mut state = self.parse(name, row.get(0))?;
        let before = state.clone();
        change(&mut state);
        if state != before {
            let text = serde_json::to_string(&state).expect("a limit's state serializes");
            pg.wait(
                "reserve capacity",
                tx.execute_typed(
                    "UPDATE uncaged_workflow.provider_limits SET state = $2 WHERE name = $1",
                    &[(&name, Type::TEXT), (&text, Type::TEXT)],
                ),
            )?;
        }
        pg.wait("reserve capacity", tx.commit())
    }

    fn read(&self, name: &str) -> Result<LimitState> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            "read a limit",
            client.query_typed_opt(
                "SELECT state FROM uncaged_workflow.provider_limits WHERE name = $1",
                &[(&name, Type::TEXT)],
            ),
        )?;
        match row {
            None => Ok(LimitState::default()),
            Some(row) => self.parse(name, row.get(0)),
        }
    }
}
