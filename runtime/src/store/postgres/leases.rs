//! The leases this process holds on threads of a PostgreSQL store: a token per thread that
//! fences every write, and one task that renews them all.

use std::sync::atomic::Ordering;

use tokio_postgres::types::Type;

use crate::ids::ThreadId;
use crate::store::postgres::Postgres;

/// The leases this process holds, by thread, kept alive by one renewal task.
#[derive(Debug, Clone)]
pub struct Leases {
    pg: Postgres,
}

impl Leases {
    pub(super) fn of(pg: &Postgres) -> Self {
        Leases { pg: pg.clone() }
    }

    /// The token this process holds thread `id` under.
    pub fn token(&self, id: ThreadId) -> Option<i64> {
        self.pg.inner.held.lock().get(&id).copied()
    }

    pub(super) fn hold(&self, id: ThreadId, token: i64) {
        self.pg.inner.held.lock().insert(id, token);
        if !self.pg.inner.renewing.swap(true, Ordering::SeqCst) {
            self.pg.spawn(renew(self.pg.clone()));
        }
    }

    pub(super) fn release(&self, id: ThreadId) {
        self.pg.inner.held.lock().remove(&id);
    }

    pub(super) fn lost(&self, id: ThreadId) {
        tracing::warn!("lost the lease on thread {id}: another process took it over");
        self.release(id);
    }
}

/// Renews every lease this process holds, three times per lease length, for as long as the
/// process lives. One statement renews them all; a lease another process took meanwhile is
/// not renewed (its token changed), and the next append to it finds out.
async fn renew(pg: Postgres) {
    let mut ticks = tokio::time::interval(pg.lease() / 3);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let (ids, tokens): (Vec<String>, Vec<i64>) =
            pg.inner.held.lock().iter().map(|(id, token)| (id.to_string(), *token)).unzip();
        if ids.is_empty() {
            continue;
        }
        // On the shared connection, not through the group committer: a renewal must never
        // wait behind a batch. A thread whose row a batch of this process has locked at this
        // instant is skipped (waiting on it could deadlock the two), and renewed next tick.
        // This runs on the driver's own thread, which must never wait on itself: a lost
        // connection is left for the next synchronous use to open again.
        let renewed = pg
            .current_client()
            .execute_typed(
                "UPDATE uncaged_workflow.threads \
                     SET lease_until = now() + $3::bigint * interval '1 millisecond' \
                     FROM (SELECT t.id FROM uncaged_workflow.threads t \
                           JOIN unnest($1::text[], $2::bigint[]) AS held(id, token) \
                             ON t.id = held.id AND t.lease_token = held.token \
                           FOR UPDATE OF t SKIP LOCKED) renewable \
                     WHERE threads.id = renewable.id",
                &[
                    (&ids, Type::TEXT_ARRAY),
                    (&tokens, Type::INT8_ARRAY),
                    (&lease_ms(&pg), Type::INT8),
                ],
            )
            .await
            .map_err(|e| pg.error("renew leases", &e));
        if let Err(e) = renewed {
            tracing::warn!("{e}");
        }
    }
}

/// The lease length in milliseconds, as statements take it.
pub(super) fn lease_ms(pg: &Postgres) -> i64 {
    pg.lease().as_millis() as i64
}
