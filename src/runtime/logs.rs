//! Log fields that a caller cannot use to forge log lines. Object names, kinds and error
//! texts come from AdmissionReviews and API answers: a newline in one would start a line
//! that looks like ours. The text format writes every field through [`escaped_fields`];
//! the JSON format is escaped by serde. Values a caller chooses are also logged through
//! [`Clipped`], so one request cannot write megabytes of log.

use std::fmt::{self, Write as _};
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// The most characters of a caller's value a log field shows.
pub const MAX_FIELD_CHARS: usize = 512;

/// Whether `c` could break or disguise a log line: control characters (newline, carriage
/// return, escape, ...), the Unicode line and paragraph separators, bidirectional
/// overrides.
fn hostile(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Writes `s` with every hostile character escaped (`\n`, `\r`, `\t`, else `\u{..}`).
pub fn write_escaped(out: &mut impl fmt::Write, s: &str) -> fmt::Result {
    let mut rest = s;
    while let Some(i) = rest.find(hostile) {
        out.write_str(&rest[..i])?;
        let c = rest[i..].chars().next().unwrap_or('\0');
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c => write!(out, "\\u{{{:x}}}", c as u32)?,
        }
        rest = &rest[i + c.len_utf8()..];
    }
    out.write_str(rest)
}

/// `s` with every hostile character escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let _ = write_escaped(&mut out, s);
    out
}

/// A caller's value for a log field: escaped, and cut after [`MAX_FIELD_CHARS`]
/// characters (saying how many bytes were left out).
pub struct Clipped<'a>(pub &'a str);

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_clipped(f, self.0, MAX_FIELD_CHARS)
    }
}

/// Writes `s` escaped, cut after `max` characters (saying how many bytes were left out).
fn write_clipped(out: &mut impl fmt::Write, s: &str, max: usize) -> fmt::Result {
    match s.char_indices().nth(max) {
        None => write_escaped(out, s),
        Some((cut, _)) => {
            write_escaped(out, &s[..cut])?;
            write!(out, "…({} more bytes)", s.len() - cut)
        }
    }
}

/// The most characters of any one field the text format writes (error texts from the
/// API server, the diagnostics of a refused reload, ...).
pub const MAX_TEXT_FIELD_CHARS: usize = 16 * 1024;

/// The text format's field formatter: `name=value` separated by spaces (the message
/// alone), every value escaped and cut after [`MAX_TEXT_FIELD_CHARS`] characters. The
/// default formatter writes `%` (Display) values raw.
pub fn escaped_fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(
        |w: &mut Writer<'_>, field: &tracing::field::Field, value: &dyn fmt::Debug| {
            let mut text = String::new();
            let _ = write!(text, "{value:?}");
            if field.name() != "message" {
                w.write_str(field.name().trim_start_matches("r#"))?;
                w.write_char('=')?;
            }
            write_clipped(w, &text, MAX_TEXT_FIELD_CHARS)
        },
    )
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_characters_are_escaped_and_long_values_clipped() {
        assert_eq!(
            escape("a\nb\r\tc\u{1b}[31m\u{2028}é"),
            "a\\nb\\r\\tc\\u{1b}[31m\\u{2028}é"
        );
        let long = "x".repeat(MAX_FIELD_CHARS + 10);
        let shown = Clipped(&long).to_string();
        assert!(shown.ends_with("…(10 more bytes)"), "{shown}");
        assert_eq!(Clipped("cp-1\nFAKE").to_string(), "cp-1\\nFAKE");
    }
}
