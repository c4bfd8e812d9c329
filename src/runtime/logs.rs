//! Log fields that a caller cannot use to forge log lines. Object names, kinds and error
//! texts come from AdmissionReviews and API answers: a newline in one would start a line
//! that looks like ours. The text format writes every field through [`escaped_fields`];
//! the JSON format is escaped by serde. Values a caller chooses are also logged through
//! [`Clipped`], so one request cannot write megabytes of log. Lines are written by a
//! thread of their own ([`Queue`]): a stalled stderr drops lines, it never stalls answers.

use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
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

/// The most bytes of log lines waiting to be written; past it, lines are dropped (and
/// counted) rather than making the threads that answer requests wait.
pub const MAX_QUEUED_BYTES: usize = 8 * 1024 * 1024;

/// Log lines dropped because stderr did not keep up.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

enum Queued {
    Line(Vec<u8>),
    Flushed(mpsc::Sender<()>),
}

/// A log writer that never blocks its caller: lines go to a thread of their own that writes
/// them to stderr. When stderr stalls (a full pipe, a stuck log collector), the queue grows
/// to [`MAX_QUEUED_BYTES`] and further lines are dropped and counted in [`DROPPED`]; the
/// webhook keeps answering.
#[derive(Clone)]
pub struct Queue {
    lines: mpsc::SyncSender<Queued>,
    queued: Arc<AtomicUsize>,
}

impl Queue {
    /// Starts the writing thread; `None` if it cannot be started (then write directly).
    pub fn start() -> Option<Queue> {
        let (lines, waiting) = mpsc::sync_channel::<Queued>(64 * 1024);
        let queued = Arc::new(AtomicUsize::new(0));
        let counted = queued.clone();
        std::thread::Builder::new()
            .name("ichor-rules-log".into())
            .spawn(move || {
                let mut err = std::io::stderr();
                for q in waiting {
                    match q {
                        Queued::Line(line) => {
                            let _ = err.write_all(&line);
                            counted.fetch_sub(line.len(), Ordering::Relaxed);
                        }
                        Queued::Flushed(done) => {
                            let _ = err.flush();
                            let _ = done.send(());
                        }
                    }
                }
            })
            .ok()?;
        Some(Queue { lines, queued })
    }

    /// Waits (at most `within`) until the lines queued so far are written.
    pub fn flush(&self, within: std::time::Duration) {
        let (done, flushed) = mpsc::channel();
        if self.lines.try_send(Queued::Flushed(done)).is_ok() {
            let _ = flushed.recv_timeout(within);
        }
    }
}

impl std::io::Write for Queue {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let queued = self.queued.fetch_add(buf.len(), Ordering::Relaxed);
        let sent = queued + buf.len() <= MAX_QUEUED_BYTES
            && self.lines.try_send(Queued::Line(buf.to_vec())).is_ok();
        if !sent {
            self.queued.fetch_sub(buf.len(), Ordering::Relaxed);
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Queue {
    type Writer = Queue;

    fn make_writer(&'a self) -> Queue {
        self.clone()
    }
}

/// What is logged, collected for a unit test's `tracing` subscriber
/// ([`Logged::subscriber`]); [`Logged::text`] reads it back.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Logged(Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl Logged {
    /// A plain-text subscriber writing here.
    pub(crate) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(self.clone())
            .finish()
    }

    /// Everything logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

#[cfg(test)]
impl std::io::Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logged {
    type Writer = Logged;
    fn make_writer(&'a self) -> Logged {
        self.clone()
    }
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
