//! Output helpers shared by commands: aligned tables, JSON, ages, one-line summaries.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::terminal;

use crate::store::records::StepRecord;

/// How a step is numbered in listings: `[5]`, or `[5 ∥ 4-6]` for a step of a parallel group
/// (steps 4 to 6 ran together).
pub fn step_label(index: usize, step: &StepRecord) -> String {
    match step.group {
        Some(group) => format!("[{index} ∥ {}-{}]", group.first, group.last()),
        None => format!("[{index}]"),
    }
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl Serialize) -> Result<()> {
    use std::io::Write as _;
    // Written as it is serialized, not built whole first: a listing of 100,000 threads is
    // tens of megabytes of JSON.
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    serde_json::to_writer_pretty(&mut out, value)
        .map_err(|e| Error::stdout(std::io::Error::from(e)))?;
    writeln!(out).and_then(|()| out.flush()).map_err(Error::stdout)
}

/// Prints rows under a header with columns padded to their widest cell; every cell is shown
/// as one line of a terminal (see [`terminal::line`]).
pub fn print_table<S: AsRef<str>>(header: &[&str], rows: &[Vec<S>]) -> Result<()> {
    let mut table = Table::new(header);
    for cell in rows.iter().flatten() {
        table.cell(cell.as_ref());
    }
    table.print()
}

/// A table filled cell by cell, row after row, and printed with its columns padded to their
/// widest cell. Cells are escaped for a terminal as they come and kept in one buffer: a listing
/// of 100,000 threads is 600,000 cells, and none of them is an allocation of its own.
pub struct Table {
    header: Vec<String>,
    text: String,
    /// Where each cell ends in `text`.
    ends: Vec<usize>,
    widths: Vec<usize>,
    /// The column of threads' statuses, painted by status on a terminal.
    status_column: Option<usize>,
}

impl Table {
    /// An empty table under `header` (its columns).
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            text: String::new(),
            ends: Vec::new(),
            widths: header.iter().map(|h| h.chars().count()).collect(),
            status_column: None,
        }
    }

    /// Paints the cells of `column`, a thread status each, by status (on a terminal).
    pub fn status_column(&mut self, column: usize) -> &mut Table {
        self.status_column = Some(column);
        self
    }

    /// Adds the next cell: `text`, escaped as one line of a terminal.
    pub fn cell(&mut self, text: &str) -> &mut Table {
        self.text.push_str(&terminal::line(text));
        self.end_cell()
    }

    /// Adds the next cell: `text`, already made fit for a terminal ([`truncate`] does).
    pub fn cell_shown(&mut self, text: &str) -> &mut Table {
        debug_assert_eq!(terminal::line(text), text);
        self.text.push_str(text);
        self.end_cell()
    }

    /// Adds the next cell: `text` cut to `max` characters as [`truncate`] cuts it.
    pub fn cell_truncated(&mut self, text: &str, max: usize) -> &mut Table {
        match plain_cut(text, max) {
            Some((kept, ellipsis)) => {
                self.text.push_str(kept);
                if ellipsis {
                    self.text.push('…');
                }
            }
            None => self.text.push_str(&truncate_general(text, max)),
        }
        self.end_cell()
    }

    /// Adds the next cell, formatted (`format_args!`), escaped as [`Table::cell`] is.
    pub fn cell_fmt(&mut self, args: std::fmt::Arguments<'_>) -> &mut Table {
        let start = self.text.len();
        std::fmt::Write::write_fmt(&mut self.text, args).expect("writing to a String succeeds");
        if let std::borrow::Cow::Owned(escaped) = terminal::line(&self.text[start..]) {
            self.text.truncate(start);
            self.text.push_str(&escaped);
        }
        self.end_cell()
    }

    fn end_cell(&mut self) -> &mut Table {
        let start = self.ends.last().copied().unwrap_or(0);
        let column = self.ends.len() % self.widths.len();
        self.widths[column] = self.widths[column].max(width(&self.text[start..]));
        self.ends.push(self.text.len());
        self
    }

    /// Makes room for about `rows` more rows, so that a long listing is not copied as it grows.
    pub fn reserve(&mut self, rows: usize) -> &mut Table {
        self.text.reserve(rows * 24 * self.widths.len());
        self.ends.reserve(rows * self.widths.len());
        self
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Prints the table on stdout, a buffered line at a time.
    pub fn print(self) -> Result<()> {
        let columns = self.widths.len();
        // Written a piece at a time: a copy of a 100,000-row table would cost as much memory as
        // the table.
        let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        let mut row = String::new();
        let paint = self.status_column.filter(|_| terminal::colors(terminal::Stream::Stdout));
        let mut header = true;
        let mut line = |cells: &mut dyn Iterator<Item = &str>| {
            row.clear();
            for (column, cell) in cells.enumerate() {
                match terminal::Color::of_status(cell).filter(|_| !header && paint == Some(column))
                {
                    Some(color) => {
                        row.push_str(&terminal::paint(cell, color, terminal::Stream::Stdout))
                    }
                    None => row.push_str(cell),
                }
                if column + 1 < columns {
                    let pad = self.widths[column] - width(cell) + 2;
                    const SPACES: &str = "                                                ";
                    match SPACES.get(..pad) {
                        Some(spaces) => row.push_str(spaces),
                        None => row.extend(std::iter::repeat_n(' ', pad)),
                    }
                }
            }
            row.truncate(row.trim_end().len());
            row.push('\n');
            header = false;
            std::io::Write::write_all(&mut out, row.as_bytes())
        };
        let mut write = || -> std::io::Result<()> {
            line(&mut self.header.iter().map(String::as_str))?;
            let mut start = 0;
            for ends in self.ends.chunks(columns) {
                line(&mut ends.iter().map(|&end| {
                    let cell = &self.text[start..end];
                    start = end;
                    cell
                }))?;
            }
            Ok(())
        };
        write().and_then(|()| std::io::Write::flush(&mut out)).map_err(Error::stdout)
    }
}

/// How many characters `cell` shows (cells are escaped: one character, one column).
fn width(cell: &str) -> usize {
    if cell.is_ascii() { cell.len() } else { cell.chars().count() }
}

/// How long before `now_ms` the time `at_ms` was, as [`age`] writes it. A listing reads the
/// clock once for all its rows.
pub struct Age {
    pub at_ms: u64,
    pub now_ms: u64,
}

impl std::fmt::Display for Age {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.now_ms.saturating_sub(self.at_ms) / 1000;
        match secs {
            s if s < 60 => write!(f, "{s}s"),
            s if s < 3600 => write!(f, "{}m", s / 60),
            s if s < 86_400 => write!(f, "{}h", s / 3600),
            s => write!(f, "{}d", s / 86_400),
        }
    }
}

/// `42s`, `5m`, `3h`, `2d` since `timestamp_ms`.
pub fn age(timestamp_ms: u64) -> String {
    Age { at_ms: timestamp_ms, now_ms: crate::clock::now_ms() }.to_string()
}

/// `text` flattened to one line of a terminal (runs of whitespace become one space; the rest
/// escaped, see [`terminal::line`]) and cut to `max` characters, with an ellipsis if cut.
/// One pass that stops at the cut: listings call it for every thread.
pub fn truncate(text: &str, max: usize) -> String {
    match plain_cut(text, max) {
        Some((kept, false)) => kept.to_string(),
        Some((kept, true)) => format!("{kept}…"),
        None => truncate_general(text, max),
    }
}

/// [`truncate`] for a text that begins with plain words, which most do: then the cut is a
/// slice, followed by an ellipsis if `true`. `None` for any other text. Listings cut a prompt
/// for every thread, and the general path costs as much as the rest of a row.
fn plain_cut(text: &str, max: usize) -> Option<(&str, bool)> {
    let bytes = text.as_bytes();
    let plain = |s: &[u8]| {
        s.first() != Some(&b' ')
            && s.iter().all(|b| (b' '..=b'~').contains(b))
            && !s.windows(2).any(|w| w == b"  ")
    };
    if bytes.len() <= max && plain(bytes) {
        return Some((text.trim_end_matches(' '), false));
    }
    if bytes.len() > max && bytes[max] != b' ' && plain(&bytes[..=max]) {
        return Some((&text[..max.saturating_sub(1)], true));
    }
    None
}

/// [`truncate`] for any text, one character at a time.
fn truncate_general(text: &str, max: usize) -> String {
    /// The text so far, how many characters it shows, and where it ends once cut.
    struct Cut {
        out: String,
        count: usize,
        keep: usize,
        max: usize,
    }
    impl Cut {
        /// Adds `c`; true once more than `max` characters were added (the text is then cut).
        #[inline]
        fn push(&mut self, c: char) -> bool {
            if self.count + 1 == self.max {
                self.keep = self.out.len();
            }
            self.out.push(c);
            self.count += 1;
            self.count > self.max
        }
    }
    let mut cut =
        Cut { out: String::with_capacity(text.len().min(max) + 4), count: 0, keep: 0, max };
    let mut space = false;
    let mut full = false;
    for c in text.trim_start().chars() {
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if std::mem::take(&mut space) && cut.push(' ') {
            full = true;
            break;
        }
        full = if terminal::is_hidden_in_line(c) {
            let mut buf = [0u8; 4];
            terminal::line(c.encode_utf8(&mut buf)).chars().any(|c| cut.push(c))
        } else {
            cut.push(c)
        };
        if full {
            break;
        }
    }
    if full {
        cut.out.truncate(cut.keep);
        cut.out.push('…');
    }
    cut.out
}

/// `1,234 tokens in (200 cached), 56 out, $0.0012`: what agent calls cost.
pub fn usage_line(usage: &crate::store::records::Usage) -> String {
    let mut line = format!("{} tokens in", usage.input_tokens);
    if usage.cached_tokens > 0 {
        line.push_str(&format!(" ({} cached)", usage.cached_tokens));
    }
    line.push_str(&format!(", {} out", usage.output_tokens));
    if let Some(cost) = usage.cost_usd {
        line.push_str(&format!(", ${cost:.4}"));
    }
    line
}

/// The two steps a replay found different, under the line that says where (`replay`,
/// `upgrade`), each escaped for the terminal.
pub fn print_divergence(divergence: &crate::run::replay::Divergence) -> Result<()> {
    if let Some(recorded) = &divergence.recorded {
        outln!("    recorded: {}", terminal::line(recorded))?;
    }
    if let Some(replayed) = &divergence.replayed {
        outln!("    replayed: {}", terminal::line(replayed))?;
    }
    Ok(())
}

/// `cron 0 9 * * * (Europe/Paris)`, `poll ./check.sh every 5m (new-items)`.
pub fn describe_trigger(trigger: &crate::store::schedules::Trigger) -> String {
    use crate::store::schedules::Trigger;
    match trigger {
        Trigger::Cron { expression, timezone } => {
            format!("cron {expression} ({})", timezone.as_deref().unwrap_or("UTC"))
        }
        Trigger::Poll { command, every_ms, diff, .. } => format!(
            "poll {} every {} ({})",
            shlex::try_join(command.iter().map(String::as_str)).unwrap_or_default(),
            humantime::format_duration(std::time::Duration::from_millis(*every_ms)),
            diff.as_str()
        ),
        Trigger::Webhook { secret_env, map } if map.is_empty() => {
            format!("webhook (secret in ${secret_env})")
        }
        Trigger::Webhook { secret_env, map } => {
            let fields: Vec<_> = map.iter().map(|(f, p)| format!("{f}={p}")).collect();
            format!("webhook (secret in ${secret_env}; data {})", fields.join(" "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_every_column_but_the_last_and_escape_cells() {
        let mut table = Table::new(&["A", "LONG HEADER", "C"]);
        table.cell("wide cell").cell("x").cell("last  ");
        table.cell("é").cell_fmt(format_args!("{}", 42)).cell("\u{1b}]0;t");
        let mut columns = [0usize; 3];
        let mut start = 0;
        for (i, &end) in table.ends.iter().enumerate() {
            columns[i % 3] = columns[i % 3].max(width(&table.text[start..end]));
            start = end;
        }
        assert_eq!(columns, [9, 2, 10]);
        assert_eq!(table.widths, vec![9, 11, 10]);
        assert_eq!(&table.text, "wide cellxlast  é42\\u{1b}]0;t");
    }

    proptest::proptest! {
        #[test]
        fn truncate_takes_its_shortcut_only_when_it_changes_nothing(
            text in "[ a-c\t\n\u{1b}é]{0,12}", max in 0usize..10
        ) {
            proptest::prop_assert_eq!(truncate(&text, max), truncate_general(&text, max));
            let mut table = Table::new(&["PROMPT"]);
            table.cell_truncated(&text, max);
            proptest::prop_assert_eq!(table.text, truncate_general(&text, max));
        }
    }

    #[test]
    fn truncate_flattens_escapes_and_cuts_by_characters() {
        assert_eq!(truncate("  fix\n the\tbug  ", 40), "fix the bug");
        assert_eq!(truncate("héllo wörld", 8), "héllo w…");
        assert_eq!(truncate("héllo wörld", 11), "héllo wörld");
        assert_eq!(truncate("a\u{1b}[2Jb", 40), "a\\u{1b}[2Jb");
        assert_eq!(truncate("", 5), "");
        assert_eq!(truncate("abc", 0), "…");
        assert_eq!(truncate("abcd", 1), "…");
        assert_eq!(truncate("ab\u{7}", 5), "ab\\u…", "an escape counts as what it shows");
        assert_eq!(truncate(&"word ".repeat(1000), 12), "word word w…");
    }
}
