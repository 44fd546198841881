//! Every thread's listing summary, for `threads`, `ps` and the web view: the `threads` table
//! read as its rows arrive, on the driver's thread where the connection is (each row let go
//! once read: 100,000 rows held at once cost more in page faults than in reading them), and
//! put in order by the caller rather than by the server (a sequential scan, not a walk of the
//! primary key's index).

use futures::TryStreamExt;
use tokio_postgres::Client;
use tokio_postgres::types::{ToSql, Type};

use crate::error::Result;
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

/// The summaries of every row of `threads`.
async fn read(client: &Client) -> std::result::Result<Vec<ThreadSummary>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {}, t.lease_owner IS NOT NULL AND t.lease_until > now(), t.runnable \
         FROM uncaged_workflow.threads t",
        summary::COLUMNS
    );
    let none: [(&(dyn ToSql + Sync), Type); 0] = [];
    let rows = client.query_typed_raw(&sql, none).await?;
    futures::pin_mut!(rows);
    let mut summaries = Vec::new();
    while let Some(row) = rows.try_next().await? {
        let Some(mut summary) = summary::read(&row, 0) else { continue };
        let (held, runnable): (bool, bool) = (row.get(summary::COUNT), row.get(summary::COUNT + 1));
        if !summary.status.is_ended() {
            if held {
                summary.status = ThreadStatus::Running;
            } else if runnable {
                summary.status = ThreadStatus::Queued;
            }
        }
        summaries.push(summary);
    }
    Ok(summaries)
}
