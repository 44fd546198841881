//! Signed one-time links in PostgreSQL: the `links` table, a use taken under the row's lock
//! (plain statements in a transaction: it works behind a transaction-pooling PgBouncer).

use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::store::links::{Consumed, Link, LinkBackend, LinkUse};
use crate::store::postgres::Postgres;

#[derive(Debug)]
pub struct PgLinks {
    pg: Postgres,
}

impl PgLinks {
    pub fn new(pg: &Postgres) -> Self {
        PgLinks { pg: pg.clone() }
    }

    fn parse(&self, text: &str) -> Result<Link> {
        serde_json::from_str(text).map_err(|e| Error::Corrupt {
            path: format!("{}: links", self.pg.target()).into(),
            reason: e.to_string(),
        })
    }

    fn select(
        &self,
        action: &str,
        sql: &str,
        params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
    ) -> Result<Vec<Link>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(action, client.query_typed(sql, params))?;
        rows.iter().map(|row| self.parse(row.get(0))).collect()
    }
}

impl LinkBackend for PgLinks {
    fn create(&self, link: &Link) -> Result<()> {
        let client = self.pg.client()?;
        let json = serde_json::to_string(link).expect("a link serializes");
        let expires = i64::try_from(link.expires).unwrap_or(i64::MAX);
        self.pg.wait(
            "keep a link",
            client.execute_typed(
                "INSERT INTO uncaged_workflow.links (hash, thread_id, link, expires_ms)
                 VALUES ($1, $2, $3, $4)",
                &[
                    (&link.hash, Type::TEXT),
                    (&link.thread.to_string(), Type::TEXT),
                    (&json, Type::TEXT),
                    (&expires, Type::INT8),
                ],
            ),
        )?;
        Ok(())
    }

    fn get(&self, hash: &str) -> Result<Option<Link>> {
        let found = self.select(
            "read a link",
            "SELECT link FROM uncaged_workflow.links WHERE hash = $1",
            &[(&hash, Type::TEXT)],
        )?;
        Ok(found.into_iter().next())
    }

    fn consume(&self, hash: &str, used: &LinkUse) -> Result<Consumed> {
        let pg = &self.pg;
        let mut client = pg.dedicated()?;
        let tx = pg.wait("use a link", client.transaction())?;
        let row = pg.wait(
            "use a link",
            tx.query_typed_opt(
                "SELECT link FROM uncaged_workflow.links WHERE hash = $1 FOR UPDATE",
                &[(&hash, Type::TEXT)],
            ),
        )?;
        let Some(row) = row else { return Ok(Consumed::Unknown) };
        let mut link = self.parse(row.get(0))?;
        if link.used.is_some() {
            return Ok(Consumed::UsedBefore(link));
        }
        link.used = Some(used.clone());
        let json = serde_json::to_string(&link).expect("a link serializes");
        pg.wait(
            "use a link",
            tx.execute_typed(
                "UPDATE uncaged_workflow.links SET link = $2, unapplied = true WHERE hash = $1",
                &[(&hash, Type::TEXT), (&json, Type::TEXT)],
            ),
        )?;
        pg.wait("use a link", tx.commit())?;
        Ok(Consumed::Taken(link))
    }

    fn applied(&self, hash: &str, outcome: &str) -> Result<()> {
        let pg = &self.pg;
        let mut client = pg.dedicated()?;
        let tx = pg.wait("mark a link applied", client.transaction())?;
        let row = pg.wait(
            "mark a link applied",
            tx.query_typed_opt(
                "SELECT link FROM uncaged_workflow.links WHERE hash = $1 FOR UPDATE",
                &[(&hash, Type::TEXT)],
            ),
        )?;
        let Some(row) = row else { return Ok(()) };
        let mut link = self.parse(row.get(0))?;
        if let Some(used) = &mut link.used {
            used.applied = true;
            used.outcome = Some(outcome.to_string());
        }
        let json = serde_json::to_string(&link).expect("a link serializes");
        pg.wait(
            "mark a link applied",
            tx.execute_typed(
                "UPDATE uncaged_workflow.links SET link = $2, unapplied = false WHERE hash = $1",
                &[(&hash, Type::TEXT), (&json, Type::TEXT)],
            ),
        )?;
        pg.wait("mark a link applied", tx.commit())
    }

    fn unapplied(&self) -> Result<Vec<Link>> {
        let mut links = self.select(
            "list unapplied links",
            "SELECT link FROM uncaged_workflow.links WHERE unapplied",
            &[],
        )?;
        links.sort_by_key(|l| l.used.as_ref().map(|u| u.at));
        Ok(links)
    }

    fn of_thread(&self, thread: ThreadId) -> Result<Vec<Link>> {
        let mut links = self.select(
            "list a thread's links",
            "SELECT link FROM uncaged_workflow.links WHERE thread_id = $1",
            &[(&thread.to_string(), Type::TEXT)],
        )?;
        links.sort_by_key(|l| l.created);
        Ok(links)
    }

    fn forget_expired(&self, cutoff: u64) -> Result<usize> {
        let client = self.pg.client()?;
        let cutoff = i64::try_from(cutoff).unwrap_or(i64::MAX);
        let forgotten = self.pg.wait(
            "forget expired links",
            client.execute_typed(
                "DELETE FROM uncaged_workflow.links WHERE expires_ms < $1 AND NOT unapplied",
                &[(&cutoff, Type::INT8)],
            ),
        )?;
        Ok(forgotten as usize)
    }
}
