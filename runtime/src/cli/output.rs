//! Output helpers shared by commands: aligned tables, JSON, ages, one-line summaries, and the
//! JSON line of a step.

use serde::Serialize;

use super::terminal;
use crate::error::Result;

use crate::ids::ThreadId;
use crate::store::records::StepRecord;

/// A step as `run --json`, `resume --json`, `fork --json`, `answer --json` and `step` print
/// it, one object per line: `{"thread", "index", "step": {role, content, meta, timestamp},
/// "agent", "durationMs"}` (`index` counts from 1; `durationMs` is the step's wall time).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepLine<'a> {
    pub thread: ThreadId,
    pub index: usize,
    pub step: &'a StepRecord,
    pub agent: &'a str,
    pub duration_ms: u64,
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("output values serialize");
    outln!("{text}")
}

/// Prints rows under a header with columns padded to their widest cell; every cell is shown
/// as one line of a terminal (see [`terminal::line`]).
pub fn print_table(header: &[&str], rows: &[Vec<String>]) -> Result<()> {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| terminal::line(cell).into_owned()).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    // One write for the whole table: a listing of 100,000 threads is 100,000 lines.
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let start = out.len();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.truncate(start + out[start..].trim_end().len());
        out.push('\n');
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
    outln!("{}", out.trim_end_matches('\n'))
}

/// `42s`, `5m`, `3h`, `2d` since `timestamp_ms`.
pub fn age(timestamp_ms: u64) -> String {
    let secs = crate::clock::now_ms().saturating_sub(timestamp_ms) / 1000;
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `text` flattened to one line of a terminal (escaped, see [`terminal::line`]) and cut to `max`
/// characters, with an ellipsis if cut.
pub fn truncate(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let flat = terminal::line(&flat).into_owned();
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}
