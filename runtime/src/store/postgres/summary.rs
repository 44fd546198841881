//! A thread's listing summary in its row of `threads`: as columns (migration 0005), written
//! whole when the thread is created and its changing part with each append, which an operator
//! can query; and packed, the same summary as one value (`listing`, migration 0007), which is
//! what a listing reads: the server sends one value a row where it sent seventeen (most of the
//! time of listing 100,000 threads was the server turning columns into messages), and the
//! client decodes it without a field name.

use tokio_postgres::Row;
use tokio_postgres::types::Type;

use crate::ids::ThreadId;
use crate::store::postgres::commit::Params;
use crate::store::records::{ThreadStatus, ThreadSummary};

/// The summary's columns, for a `SELECT` of `threads t`, in the order [`read`] takes them.
pub const COLUMNS: &str = "t.id, t.bundle, t.name, t.status, t.steps, t.started_ms, t.prompt, \
     t.return_code, t.ended_ms, t.waiting_role, t.paused_at_ms, t.schedule, t.tokens, \
     t.cost_usd, t.parent";

/// How many columns [`COLUMNS`] names.
pub const COUNT: usize = 15;

/// The layout of a packed summary, its first byte: postcard of [`ThreadSummary`] as this
/// binary declares it. Counted up when that changes; a row packed in another layout is read
/// from its columns instead.
pub const LAYOUT: u8 = 2;

/// `summary` packed, for the `listing` column.
pub fn pack(summary: &ThreadSummary) -> Vec<u8> {
    postcard::to_extend(summary, vec![LAYOUT]).expect("a summary packs")
}

/// The summary `packed` holds, if it is of this [`LAYOUT`] and reads whole.
pub fn unpack(packed: &[u8]) -> Option<ThreadSummary> {
    let (&LAYOUT, body) = packed.split_first()? else { return None };
    match postcard::take_from_bytes(body) {
        Ok((summary, [])) => Some(summary),
        _ => None,
    }
}

/// The thread id a packed summary of this [`LAYOUT`] starts with, when the rest of it does not
/// read: which row to read again from its columns.
pub fn unpack_id(packed: &[u8]) -> Option<ThreadId> {
    let (&LAYOUT, body) = packed.split_first()? else { return None };
    postcard::take_from_bytes::<ThreadId>(body).ok().map(|(id, _)| id)
}

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
            // Not a column: a row read from its columns was packed in an older layout, by a
            // binary that did not record who started a thread.
            started_by: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> ThreadSummary {
        ThreadSummary {
            thread_id: "01J0000000000000000000000A".parse().unwrap(),
            name: "solve-issue".into(),
            hash: "9HQM4RY420P4C".parse().unwrap(),
            status: ThreadStatus::Waiting,
            steps: 3,
            timestamp: 1_893_456_000_500,
            prompt: "Fix the parser: \u{1b}[31mred\u{1b}[0m".into(),
            return_code: None,
            ended: None,
            waiting_role: Some("reviewer".into()),
            paused_at: Some(1_893_456_001_000),
            schedule: Some("nightly".into()),
            tokens: 1234,
            cost_usd: Some(0.0125),
            parent: Some("01J0000000000000000000000B".parse().unwrap()),
            started_by: Some("mcp token:ci (claude-code)".into()),
        }
    }

    #[test]
    fn a_packed_summary_unpacks_to_itself() {
        let summary = summary();
        assert_eq!(unpack(&pack(&summary)), Some(summary));
    }

    #[test]
    fn another_layout_or_a_damaged_value_does_not_unpack() {
        let packed = pack(&summary());
        let mut other = packed.clone();
        other[0] = LAYOUT + 1;
        assert_eq!(unpack(&other), None, "another layout");
        assert_eq!(unpack(&packed[..packed.len() - 1]), None, "cut short");
        let mut longer = packed.clone();
        longer.push(0);
        assert_eq!(unpack(&longer), None, "trailing bytes");
        assert_eq!(unpack(&[]), None, "empty");
    }
}
