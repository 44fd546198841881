//! Text for a terminal. Everything a bundle or an agent wrote — step contents, metas, role names,
//! descriptions, summaries, log lines quoted in errors — is untrusted, and a terminal obeys the
//! escape sequences in what it prints (set the title, hide text, erase lines, move the cursor).
//! Human output shows such characters escaped; `--json` output stays exact (JSON escapes them).
//!
//! Colour, too, is for a terminal only: `--color auto` (the default) paints when the output is
//! a terminal and `NO_COLOR` is not set; `always` and `never` say it outright.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU8, Ordering};

/// When to paint output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless `NO_COLOR` is set.
    #[default]
    Auto,
    Always,
    Never,
}

/// The process's choice, as [`set_color`] made it: 0 auto, 1 always, 2 never.
static COLOR: AtomicU8 = AtomicU8::new(0);

/// Sets when [`paint`] paints, for the whole process (the binary does, from `--color`).
pub fn set_color(choice: ColorChoice) {
    let value = match choice {
        ColorChoice::Auto => 0,
        ColorChoice::Always => 1,
        ColorChoice::Never => 2,
    };
    COLOR.store(value, Ordering::Relaxed);
}

/// Which stream a text goes to: whether it is a terminal decides `auto`.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Whether text for `stream` is painted.
pub fn colors(stream: Stream) -> bool {
    match COLOR.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let terminal = match stream {
                Stream::Stdout => std::io::stdout().is_terminal(),
                Stream::Stderr => std::io::stderr().is_terminal(),
            };
            terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        }
    }
}

/// The colours output uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Color {
    Red,
    Green,
    Yellow,
    Blue,
    Magenta,
    Cyan,
    /// Dim, for what matters less (an agent, a duration).
    Dim,
    Bold,
}

impl Color {
    fn code(self) -> &'static str {
        match self {
            Color::Red => "31",
            Color::Green => "32",
            Color::Yellow => "33",
            Color::Blue => "34",
            Color::Magenta => "35",
            Color::Cyan => "36",
            Color::Dim => "2",
            Color::Bold => "1",
        }
    }

    /// The colour of a thread's status.
    pub fn of_status(status: &str) -> Option<Color> {
        Some(match status {
            "completed" => Color::Green,
            "failed" => Color::Red,
            "killed" | "interrupted" => Color::Yellow,
            "running" | "queued" => Color::Cyan,
            "paused" | "waiting" => Color::Magenta,
            _ => return None,
        })
    }
}

/// `text` (already fit for a terminal) in `color`, if `stream` is painted.
pub fn paint(text: &str, color: Color, stream: Stream) -> Cow<'_, str> {
    if colors(stream) {
        Cow::Owned(format!("\u{1b}[{}m{text}\u{1b}[0m", color.code()))
    } else {
        Cow::Borrowed(text)
    }
}

/// `text` for one line of a terminal: every control character (newlines and tabs too) and every
/// invisible format character that can reorder or hide text is shown escaped, as `\u{1b}`.
pub fn line(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// `text` for a block of lines: as [`line`], but newlines and tabs are kept.
pub fn block(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

/// `text` escaped for HTML text and attribute values, its control characters and the invisible
/// ones that reorder or hide text shown escaped as the web view and a terminal show them.
pub fn html(text: &str) -> String {
    let shown = block(text);
    let mut out = String::with_capacity(shown.len());
    for c in shown.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` cut to its first `max` characters, with `…` where it was cut.
pub fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        Some((at, _)) => std::borrow::Cow::Owned(format!("{}…", &text[..at])),
        None => std::borrow::Cow::Borrowed(text),
    }
}

/// Whether [`line`] shows `c` escaped.
pub fn is_hidden_in_line(c: char) -> bool {
    c.is_control() || is_invisible_format(c)
}

fn escape(text: &str, keep_layout: bool) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        let layout = c == '\n' || c == '\t';
        is_hidden_in_line(c) && !(keep_layout && layout)
    };
    // Printable ASCII, by far the common case, needs no look at each character.
    if text.bytes().all(|b| (b' '..=b'~').contains(&b)) || !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Format characters that change how the text around them shows: bidirectional overrides and
/// isolates ("Trojan Source"), zero-width characters, the BOM.
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}' | '\u{FEFF}' | '\u{061C}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_not_obeyed() {
        let osc = "\u{1b}]0;owned\u{7}title";
        assert_eq!(line(osc), "\\u{1b}]0;owned\\u{7}title");
        assert_eq!(line("a\nb\tc\r"), "a\\u{a}b\\u{9}c\\u{d}");
        assert_eq!(block("a\nb\tc\r"), "a\nb\tc\\u{d}");
        assert_eq!(line("\u{9b}2K"), "\\u{9b}2K", "C1 controls too");
        assert_eq!(line("abc\u{202E}fed"), "abc\\u{202e}fed");
        assert!(matches!(line("plain é 日本"), Cow::Borrowed(_)));
    }
}
