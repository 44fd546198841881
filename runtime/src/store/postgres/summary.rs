//! A thread's listing summary as columns of its row in `threads` (migration 0005): written
//! whole when the thread is created, its changing part with each append, and read back typed,
//! with no JSON to render or parse — a listing of 100,000 threads is mostly that.

use tokio_postgres::Row;
use tokio_postgres::types::Type;

use crate::store::postgres::commit::Params;
use crate::store::records::{ThreadStatus, ThreadSummary};

/// The summary's columns, for a `SELECT` of `threads t`, in the order [`read`] takes them.
pub const COLUMNS: &str = "t.id, t.bundle, t.name, t.status, t.steps, t.started_ms, t.prompt, \
     t.return_code, t.ended_ms, t.waiting_role, t.paused_at_ms, t.schedule, t.tokens, \
     t.cost_usd, t.parent";

/// How many columns [`COLUMNS`] names.
pub const COUNT: usize = 15;

/// The summary in `row`'s columns from `first` on; `None` (said) if a value does not read.
pub fn read(row: &Row, first: usize) -> Option<ThreadSummary> {
    let at = |i: usize| first + i;
    let text = |i: usize| row.try_get::<_, &str>(at(i)).ok();
    let optional_ms = |i: usize| row.try_get::<_, Option<i64>>(at(i)).ok().flatten();
    let read = || -> Option<ThreadSummary> {
        Some(ThreadSummary {
            thread_id: text(0)?.parse().ok()?,
            hash: text(1)?.parse().ok()?,
            name: text(2)?.to_string(),
            status: ThreadStatus::named(text(3)?)?,
            steps: usize::try_from(row.try_get::<_, i64>(at(4)).ok()?).ok()?,
            timestamp: u64::try_from(row.try_get::<_, i64>(at(5)).ok()?).ok()?,
            prompt: text(6)?.to_string(),
            return_code: row.try_get(at(7)).ok()?,
            ended: optional_ms(8).map(|ms| ms.max(0) as u64),
            waiting_role: row.try_get(at(9)).ok()?,
            paused_at: optional_ms(10).map(|ms| ms.max(0) as u64),
            schedule: row.try_get(at(11)).ok()?,
            tokens: row.try_get::<_, i64>(at(12)).ok()?.max(0) as u64,
            cost_usd: row.try_get(at(13)).ok()?,
            parent: match row.try_get::<_, Option<&str>>(at(14)).ok()? {
                Some(parent) => Some(parent.parse().ok()?),
                None => None,
            },
        })
    };
    let summary = read();
    if summary.is_none() {
        let id = text(0).unwrap_or("?");
        tracing::warn!("thread {id}: its summary in the database does not read; left out");
    }
    summary
}

/// What changes as a thread goes on, as parameters for `status, steps, return_code, ended_ms,
/// waiting_role, paused_at_ms, tokens, cost_usd`, in that order.
pub fn changing(summary: &ThreadSummary) -> Params {
    vec![
        (Box::new(summary.status.as_str()), Type::TEXT),
        (Box::new(summary.steps as i64), Type::INT8),
        (Box::new(summary.return_code), Type::INT4),
        (Box::new(summary.ended.map(|ms| ms as i64)), Type::INT8),
        (Box::new(summary.waiting_role.clone()), Type::TEXT),
        (Box::new(summary.paused_at.map(|ms| ms as i64)), Type::INT8),
        (Box::new(summary.tokens as i64), Type::INT8),
        (Box::new(summary.cost_usd), Type::FLOAT8),
    ]
}

/// What never changes once the thread exists (its id and bundle aside), as parameters for
/// `name, started_ms, prompt, schedule, parent`, in that order.
pub fn fixed(summary: &ThreadSummary) -> Params {
    vec![
        (Box::new(summary.name.clone()), Type::TEXT),
        (Box::new(summary.timestamp as i64), Type::INT8),
        (Box::new(summary.prompt.clone()), Type::TEXT),
        (Box::new(summary.schedule.clone()), Type::TEXT),
        (Box::new(summary.parent.map(|p| p.to_string())), Type::TEXT),
    ]
}
