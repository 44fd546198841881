//! Every thread's listing summary, for `threads`, `ps` and the web view: the `threads` table
//! read as its rows arrive, on the driver's thread where the connection is (each row let go
//! once read: 100,000 rows held at once cost more in page faults than in reading them), and
//! put in order by the caller rather than by the server (a sequential scan, not a walk of the
//! primary key's index).
//!
//! A row's packed summary is what is read (see [`summary`]); the few rows without one in this
//! binary's layout (written before migration 0007, or by a process of an older version), or
//! with one damaged after the id it starts with, are read again, by id, from their columns.

use futures::TryStreamExt;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use crate::error::Result;
use crate::ids::ThreadId;
use crate::store::postgres::{Postgres, summary};
use crate::store::records::{ThreadStatus, ThreadSummary};

/// Every thread's summary, oldest first; one that does not read is said and left out.
pub(super) fn summaries(pg: &Postgres) -> Result<Vec<ThreadSummary>> {
    let client = pg.client()?;
    let reading = pg.spawn(async move { read(&client).await });
    let mut summaries =
        pg.wait("list threads", async { reading.await.expect("the listing is not aborted") })?;
    summaries.sort_unstable_by_key(|summary| summary.thread_id);
    Ok(summaries)
}

/// Whether a row's thread runs now (a live lease) and whether it is queued: the last two
/// columns of both reads.
const LIVE: &str = "t.lease_owner IS NOT NULL AND t.lease_until > now(), t.runnable";

/// The summaries of every row of `threads`.
async fn read(client: &Client) -> std::result::Result<Vec<ThreadSummary>, tokio_postgres::Error> {
    // The id comes only with a row whose packed summary is missing or of another layout.
    let sql = format!(
        "SELECT t.listing, CASE WHEN t.listing IS NULL OR get_byte(t.listing, 0) <> {layout} \
                THEN t.id END, {LIVE} \
         FROM uncaged_workflow.threads t",
        layout = summary::LAYOUT
    );
    let none: [(&(dyn ToSql + Sync), Type); 0] = [];
    let rows = client.query_typed_raw(&sql, none).await?;
    futures::pin_mut!(rows);
    let mut summaries = Vec::new();
    let mut unpacked = Vec::new();
    let mut damaged: Vec<ThreadId> = Vec::new();
    while let Some(row) = rows.try_next().await? {
        if let Some(id) = row.get::<_, Option<String>>(1) {
            unpacked.push(id);
            continue;
        }
        let packed: &[u8] = row.get(0);
        match summary::unpack(packed) {
            Some(summary) => summaries.push(live(summary, &row, 2)),
            // Damaged after its id: listed from its columns, which every append keeps too.
            None => match summary::unpack_id(packed) {
                Some(id) => {
                    tracing::warn!(
                        "thread {id}: its packed summary in the database does not read; \
                         listed from its columns"
                    );
                    damaged.push(id);
                }
                None => tracing::warn!(
                    "a thread's packed summary in the database does not read, not even its \
                     id; left out"
                ),
            },
        }
    }
    // A damaged value may name a thread listed already: it is listed once.
    if !damaged.is_empty() {
        let listed: std::collections::HashSet<ThreadId> =
            summaries.iter().map(|s| s.thread_id).collect();
        unpacked.extend(damaged.iter().filter(|id| !listed.contains(id)).map(ThreadId::to_string));
    }
    if !unpacked.is_empty() {
        // A row gone meanwhile is not listed, one changed is listed as it is now: as a
        // listing a moment later would show them.
        let sql = format!(
            "SELECT {}, {LIVE} FROM uncaged_workflow.threads t WHERE t.id = ANY($1)",
            summary::COLUMNS
        );
        let ids: [(&(dyn ToSql + Sync), Type); 1] = [(&unpacked, Type::TEXT_ARRAY)];
        let rows = client.query_typed_raw(&sql, ids).await?;
        futures::pin_mut!(rows);
        while let Some(row) = rows.try_next().await? {
            if let Some(summary) = summary::read(&row, 0) {
                summaries.push(live(summary, &row, summary::COUNT));
            }
        }
    }
    Ok(summaries)
}

/// `summary`, stored at rest, with the status its lease and queue place (`row`'s columns from
/// `first` on, as [`LIVE`] reads them) give it now.
fn live(mut summary: ThreadSummary, row: &Row, first: usize) -> ThreadSummary {
    let (held, runnable): (bool, bool) = (row.get(first), row.get(first + 1));
    if !summary.status.is_ended() {
        if held {
            summary.status = ThreadStatus::Running;
        } else if runnable {
            summary.status = ThreadStatus::Queued;
        }
    }
    summary
}
