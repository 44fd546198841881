//! Text for a terminal. Everything a bundle or an agent wrote — step contents, metas, role names,
//! descriptions, summaries, log lines quoted in errors — is untrusted, and a terminal obeys the
//! escape sequences in what it prints (set the title, hide text, erase lines, move the cursor).
//! Human output shows such characters escaped; `--json` output stays exact (JSON escapes them).

use std::borrow::Cow;

/// `text` for one line of a terminal: every control character (newlines and tabs too) and every
/// invisible format character that can reorder or hide text is shown escaped, as `\u{1b}`.
pub fn line(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// `text` for a block of lines: as [`line`], but newlines and tabs are kept.
pub fn block(text: &str) -> Cow<'_, str> {
    escape(text, true)
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
