//! Deliveries of waits in PostgreSQL: the `notices` table, each claimed and settled under its
//! row's lock, so that of the `serve`s on one database one sends each.

use tokio_postgres::types::Type;

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::store::notices::{self, Attempt, Notice, NoticeBackend};
use crate::store::postgres::Postgres;

#[derive(Debug)]
pub struct PgNotices {
    pg: Postgres,
}

impl PgNotices {
    pub fn new(pg: &Postgres) -> Self {
        PgNotices { pg: pg.clone() }
    }

    fn parse(&self, text: &str) -> Result<Notice> {
        serde_json::from_str(text).map_err(|e| Error::Corrupt {
            path: format!("{}: notices", self.pg.target()).into(),
            reason: e.to_string(),
        })
    }

    /// Changes notice `key` under its row's lock: `change` gets it as kept (none if new) and
    /// says what to keep instead (none: leave it).
    fn change(
        &self,
        action: &str,
        key: &str,
        thread: ThreadId,
        change: impl FnOnce(Option<Notice>) -> Option<Notice>,
    ) -> Result<Option<Notice>> {
        let pg = &self.pg;
        let mut client = pg.dedicated()?;
        let tx = pg.wait(action, client.transaction())?;
        // A new key's row is made first, so that its lock orders two claimers of it too.
        pg.wait(
            action,
            tx.execute_typed(
                "INSERT INTO uncaged_workflow.notices (key, thread_id, notice) VALUES ($1, $2, '')
                 ON CONFLICT (key) DO NOTHING",
                &[(&key, Type::TEXT), (&thread.to_string(), Type::TEXT)],
            ),
        )?;
        let row = pg.wait(
            action,
            tx.query_typed_one(
                "SELECT notice FROM uncaged_workflow.notices WHERE key = $1 FOR UPDATE",
                &[(&key, Type::TEXT)],
            ),
        )?;
        let text: &str = row.get(0);
        let kept = if text.is_empty() { None } else { Some(self.parse(text)?) };
        let Some(new) = change(kept) else {
            // Nothing to keep: a row made just now for a key nobody claimed goes again.
            pg.wait(action, tx.rollback())?;
            return Ok(None);
        };
        let json = serde_json::to_string(&new).expect("a notice serializes");
        pg.wait(
            action,
            tx.execute_typed(
                "UPDATE uncaged_workflow.notices SET notice = $2 WHERE key = $1",
                &[(&key, Type::TEXT), (&json, Type::TEXT)],
            ),
        )?;
        pg.wait(action, tx.commit())?;
        Ok(Some(new))
    }
}

impl NoticeBackend for PgNotices {
    fn claim(
        &self,
        fresh: &Notice,
        owner: &str,
        now: u64,
        lease_ms: u64,
    ) -> Result<Option<Notice>> {
        self.change("claim a notice", &fresh.key, fresh.thread, |kept| {
            notices::claim(kept, fresh, owner, now, lease_ms)
        })
    }

    fn settle(&self, claimed: &Notice, attempt: &Attempt) -> Result<()> {
        self.change("settle a notice", &claimed.key, claimed.thread, |kept| {
            notices::settle(&kept?, claimed, attempt)
        })?;
        Ok(())
    }

    fn of_thread(&self, thread: ThreadId) -> Result<Vec<Notice>> {
        let client = self.pg.client()?;
        let rows = self.pg.wait(
            "list a thread's notices",
            client.query_typed(
                "SELECT notice FROM uncaged_workflow.notices WHERE thread_id = $1 AND notice <> ''",
                &[(&thread.to_string(), Type::TEXT)],
            ),
        )?;
        let mut all: Vec<Notice> =
            rows.iter().map(|row| self.parse(row.get(0))).collect::<Result<_>>()?;
        all.sort_by(|a, b| (a.created, &a.key).cmp(&(b.created, &b.key)));
        Ok(all)
    }
}
