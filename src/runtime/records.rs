//! Decision records: one NDJSON line per decision, saying what was decided, from which
//! facts (each with its value and the objects it came from), under which rules (the digest
//! of their text), by which rules, and how long it took. `ichor-rules replay` decides a
//! record again from its facts (`cli::replay`).
//!
//! The facts of a record are the ones the interpreter's session read, asked of the same
//! provider after the decision for the rest of the rows' facts
//! ([`crate::interp::Session::read_facts`]): never a second computation. Building a record
//! happens after the decision, and writing it on a thread of its own behind a bounded
//! queue ([`Recorder`]): a slow sink drops records (counted, and the drop logged), it never
//! delays an answer.
//!
//! No fact reads a Secret, and nothing of a Secret is put in a record.

use super::facts::{EventFacts, Expensive, SnapshotFacts};
use super::metrics::Metrics;
use super::objects::Snapshot;
use crate::compile::Table;
use crate::diagnostics::SourceFile;
use crate::interp::{Decision, Finding, Session, Value};
use crate::vocab::{Fact, Verdict};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The digest of a rule set's text: `sha256:` and the hex of SHA-256 over each file's name
/// (without its folder: the chart mounts the same files elsewhere) and text, in name order.
/// A record names the rules that decided it by this; `/readyz` and the metrics show the
/// serving one's.
pub fn digest(files: &[SourceFile]) -> String {
    let mut named: Vec<(String, &str)> = files
        .iter()
        .map(|f| {
            let name = f
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, &*f.text)
        })
        .collect();
    named.sort();
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    for (name, text) in named {
        h.update(name.as_bytes());
        h.update(&[0]);
        h.update(&(text.len() as u64).to_le_bytes());
        h.update(text.as_bytes());
    }
    let mut out = String::from("sha256:");
    for b in h.finish().as_ref() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A caller's text as a record keeps it: at most 256 characters.
pub fn clip(s: &str) -> String {
    clipped(s).to_string()
}

/// [`clip`] without a copy: the first 256 characters of `s`.
pub fn clipped(s: &str) -> &str {
    // No more bytes than that: no more characters.
    if s.len() <= 256 {
        return s;
    }
    match s.char_indices().nth(256) {
        Some((end, _)) => s.get(..end).unwrap_or(s),
        None => s,
    }
}

/// A new decision id: 32 hex digits, the first 16 random once per process (so replicas and
/// restarts do not collide), the last 16 a counter (no system call per decision).
pub fn decision_id() -> String {
    use std::sync::OnceLock;
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 8];
        if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
            // No randomness: the start time still tells processes apart.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            bytes = (nanos as u64).to_le_bytes();
        }
        u64::from_le_bytes(bytes)
    });
    let mut id = String::with_capacity(32);
    json::hex(&mut id, prefix, 16);
    json::hex(&mut id, NEXT.fetch_add(1, Ordering::Relaxed), 16);
    id
}

/// One decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Always `"decision"`: tells a record from a log line on a shared stream.
    pub record: String,
    pub id: String,
    /// RFC 3339, UTC.
    pub time: String,
    /// `webhook` or `controller`.
    pub site: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestInfo>,
    pub rules: RulesInfo,
    pub events: Vec<EventRecord>,
    /// What was enforced: `allow`, `refuse` or `hold`.
    pub verdict: String,
    /// The rules that decided it (the refusals, else the holds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deciding: Vec<String>,
    /// The rules that warned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The verdict had the rules in audit mode been enforced.
    pub would_verdict: String,
    /// Refused before any rule was asked (the live state could not be read, no rules
    /// loaded, an operation's spec changed): why. Such a record has no facts to replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_without_rules: Option<String>,
    /// From the request's arrival (the body read) to the answer being ready.
    pub latency_us: u64,
}

/// Who asked what, at the webhook. The caller's text, as the API server sent it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestInfo {
    pub uid: String,
    #[serde(default)]
    pub user: String,
    pub operation: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The uid of the object the request is about (`request.oldObject`'s for an UPDATE or
    /// DELETE, `request.object`'s for a CREATE); absent when the review carried none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object_uid: String,
    /// `request.dryRun`: the API server persisted nothing, whatever the verdict. Such a
    /// decision is recorded, and never kept as the admission a controller step links to.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// [`RequestInfo`] borrowed: what a webhook record is written from
/// ([`WebhookRecord`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestRef<'a> {
    pub uid: &'a str,
    pub user: &'a str,
    pub operation: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub object_uid: &'a str,
    pub dry_run: bool,
}

impl RequestInfo {
    pub fn as_ref(&self) -> RequestRef<'_> {
        RequestRef {
            uid: &self.uid,
            user: &self.user,
            operation: &self.operation,
            kind: &self.kind,
            namespace: &self.namespace,
            name: &self.name,
            object_uid: &self.object_uid,
            dry_run: self.dry_run,
        }
    }
}

/// The rules that decided.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RulesInfo {
    /// [`digest`] of their text.
    pub digest: String,
    /// The rules in audit mode when it was decided (written so, or switched by the
    /// deployment): replaying against the same text puts the same rules in audit mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit: Vec<String>,
}

/// One event of a decision, with every fact its rows read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub verb: String,
    pub subject: String,
    pub cluster: String,
    pub facts: Vec<FactRecord>,
    /// The objects the facts were read from, each once; a fact's `from` indexes this.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectRef>,
    /// The rules that matched for this event (a rule matching for two events of one
    /// request is listed at the first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matched: Vec<Matched>,
}

/// A fact and its value: an integer, a boolean or a string, as the rules read it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FactRecord {
    pub name: String,
    pub value: serde_json::Value,
    /// The objects it was computed from, as indexes into the event's `objects` (none: from
    /// the request itself, such as `request.by_controller` from its user, or from nothing,
    /// such as `cluster`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<u32>,
}

/// An object a fact was read from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectRef {
    pub kind: String,
    pub name: String,
    #[serde(
        rename = "resourceVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_version: Option<String>,
}

/// A rule that matched, and whether it was enforced or only audited.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Matched {
    pub rule: String,
    pub verdict: String,
    /// `enforce` or `audit`.
    pub mode: String,
    pub message: String,
}

/// The verdict of a decision as a record writes it.
pub fn verdict_name(v: Option<Verdict>) -> &'static str {
    match v {
        Some(Verdict::Refuse) => "refuse",
        Some(Verdict::Hold) => "hold",
        Some(Verdict::Warn) | None => "allow",
    }
}

/// What the decision would have been with its audited rules enforced.
pub fn would_verdict(d: &Decision) -> &'static str {
    let any = |v: Verdict| d.audited.iter().any(|f| f.verdict == v);
    if !d.refusals.is_empty() || any(Verdict::Refuse) {
        "refuse"
    } else if !d.holds.is_empty() || any(Verdict::Hold) {
        "hold"
    } else {
        "allow"
    }
}

/// A fact's value as JSON.
pub fn value_json(v: Value<'_>) -> serde_json::Value {
    match v {
        Value::Int(i) => serde_json::Value::from(i),
        Value::Bool(b) => serde_json::Value::Bool(b),
        Value::Str(s) => serde_json::Value::String(s.to_string()),
    }
}

/// The findings of `decision` after the first `from` of each list: what one event added.
pub fn matched_since(decision: &Decision, from: [usize; 4]) -> Vec<Matched> {
    let lists: [(&[Finding], &str); 4] = [
        (&decision.refusals, "enforce"),
        (&decision.holds, "enforce"),
        (&decision.warnings, "enforce"),
        (&decision.audited, "audit"),
    ];
    let mut out = Vec::new();
    for ((list, mode), start) in lists.into_iter().zip(from) {
        for f in list.iter().skip(start) {
            out.push(Matched {
                rule: f.rule.clone(),
                verdict: f.verdict.name().to_string(),
                mode: mode.to_string(),
                message: f.message.clone(),
            });
        }
    }
    out
}

/// How many findings each list of `d` holds (see [`matched_since`]).
pub fn lengths(d: &Decision) -> [usize; 4] {
    [
        d.refusals.len(),
        d.holds.len(),
        d.warnings.len(),
        d.audited.len(),
    ]
}

/// The record of one event after its session decided: every fact the event's rows read
/// (asked of the same session), where each came from, and what matched.
pub fn event_record<'s>(
    table: &Table,
    session: &mut Session<'s, SnapshotFacts<'s>>,
    ev: &EventFacts<'s>,
    matched: Vec<Matched>,
) -> EventRecord {
    let (verb, subject, site) = ev.event;
    let values = session.read_facts(table.facts_read(verb, subject, site));
    let provider = session.facts_mut();
    let mut seen: Vec<super::facts::Source<'s>> = Vec::new();
    let facts = values
        .into_iter()
        .map(|(fact, value)| {
            let from = provider
                .sources(fact)
                .into_iter()
                .map(|s| {
                    let at = seen.iter().position(|o| *o == s).unwrap_or_else(|| {
                        seen.push(s);
                        seen.len() - 1
                    });
                    u32::try_from(at).unwrap_or(u32::MAX)
                })
                .collect();
            FactRecord {
                name: fact.name().to_string(),
                value: value_json(value),
                from,
            }
        })
        .collect();
    EventRecord {
        verb: verb.name().to_string(),
        subject: subject.name().to_string(),
        cluster: ev.cluster.to_string(),
        facts,
        objects: seen
            .into_iter()
            .map(|(kind, name, rv)| ObjectRef {
                kind: kind.to_string(),
                name: name.to_string(),
                resource_version: rv.map(str::to_string),
            })
            .collect(),
        matched,
    }
}

/// Decides `events` as [`super::decide::decide_request_events`] does and records each
/// event. The same decision: the same sessions, the same provider.
pub fn decide_recorded(
    table: &Table,
    snapshot: &Snapshot,
    events: &[EventFacts<'_>],
    expensive: Expensive,
    by_controller: bool,
) -> (Decision, Vec<EventRecord>) {
    let mut decision = Decision::default();
    let mut records = Vec::with_capacity(events.len());
    for ev in events {
        let facts =
            SnapshotFacts::new(table, snapshot, *ev, expensive).by_controller(by_controller);
        let mut session = Session::new(table, facts);
        let before = lengths(&decision);
        super::decide::decide_event(&mut session, ev.event, &mut decision);
        let matched = matched_since(&decision, before);
        records.push(event_record(table, &mut session, ev, matched));
    }
    (decision, records)
}

/// [`decide_recorded`] with the events written as JSON straight into `out` (the bytes
/// `serde_json` writes for the [`EventRecord`]s, `[...]`), without building them: the
/// webhook's path. The same decision: the same sessions, the same provider.
pub fn decide_recorded_into(
    table: &Table,
    snapshot: &Snapshot,
    events: &[EventFacts<'_>],
    expensive: Expensive,
    by_controller: bool,
    out: &mut Vec<u8>,
) -> Decision {
    let mut decision = Decision::default();
    // The objects an event's facts came from, and one fact's: reused.
    let mut scratch = (Vec::new(), Vec::new());
    out.push(b'[');
    for (i, ev) in events.iter().enumerate() {
        let facts =
            SnapshotFacts::new(table, snapshot, *ev, expensive).by_controller(by_controller);
        let mut session = Session::new(table, facts);
        let before = lengths(&decision);
        super::decide::decide_event(&mut session, ev.event, &mut decision);
        if i > 0 {
            out.push(b',');
        }
        write_event(
            out,
            table,
            &mut session,
            ev,
            &decision,
            before,
            &mut scratch,
        );
    }
    out.push(b']');
    decision
}

/// One event as [`event_record`] and `serde_json` would write it, written directly.
fn write_event<'s>(
    out: &mut Vec<u8>,
    table: &Table,
    session: &mut Session<'s, SnapshotFacts<'s>>,
    ev: &EventFacts<'s>,
    decision: &Decision,
    before: [usize; 4],
    (seen, sources): &mut (Vec<super::facts::Source<'s>>, Vec<super::facts::Source<'s>>),
) {
    let (verb, subject, site) = ev.event;
    seen.clear();
    out.extend_from_slice(b"{\"verb\":");
    json::str(out, verb.name());
    out.extend_from_slice(b",\"subject\":");
    json::str(out, subject.name());
    out.extend_from_slice(b",\"cluster\":");
    json::str(out, ev.cluster);
    out.extend_from_slice(b",\"facts\":[");
    let values = session.read_facts(table.facts_read(verb, subject, site));
    let provider = session.facts_mut();
    for (i, (fact, value)) in values.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"name\":");
        json::str(out, fact.name());
        out.extend_from_slice(b",\"value\":");
        match value {
            Value::Int(n) => json::int(out, n),
            Value::Bool(true) => out.extend_from_slice(b"true"),
            Value::Bool(false) => out.extend_from_slice(b"false"),
            Value::Str(s) => json::str(out, s),
        }
        provider.sources_into(fact, sources);
        if !sources.is_empty() {
            out.extend_from_slice(b",\"from\":[");
            for (j, &s) in sources.iter().enumerate() {
                // The same object is nearly always the same borrowed text: that first.
                let at = seen
                    .iter()
                    .position(|o| same_source(o, &s))
                    .or_else(|| seen.iter().position(|o| *o == s))
                    .unwrap_or_else(|| {
                        seen.push(s);
                        seen.len() - 1
                    });
                if j > 0 {
                    out.push(b',');
                }
                json::int(out, i64::from(u32::try_from(at).unwrap_or(u32::MAX)));
            }
            out.push(b']');
        }
        out.push(b'}');
    }
    out.push(b']');
    if !seen.is_empty() {
        out.extend_from_slice(b",\"objects\":[");
        for (i, (kind, name, rv)) in seen.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"kind\":");
            json::str(out, kind);
            out.extend_from_slice(b",\"name\":");
            json::str(out, name);
            if let Some(rv) = rv {
                out.extend_from_slice(b",\"resourceVersion\":");
                json::str(out, rv);
            }
            out.push(b'}');
        }
        out.push(b']');
    }
    let lists: [(&[Finding], &str); 4] = [
        (&decision.refusals, "enforce"),
        (&decision.holds, "enforce"),
        (&decision.warnings, "enforce"),
        (&decision.audited, "audit"),
    ];
    let mut first = true;
    for ((list, mode), start) in lists.into_iter().zip(before) {
        for f in list.iter().skip(start) {
            out.extend_from_slice(if first {
                b",\"matched\":[{\"rule\":"
            } else {
                b",{\"rule\":"
            });
            first = false;
            json::str(out, &f.rule);
            out.extend_from_slice(b",\"verdict\":");
            json::str(out, f.verdict.name());
            out.extend_from_slice(b",\"mode\":");
            json::str(out, mode);
            out.extend_from_slice(b",\"message\":");
            json::str(out, &f.message);
            out.push(b'}');
        }
    }
    if !first {
        out.push(b']');
    }
    out.push(b'}');
}

/// Whether two sources are the very same text (equal too, then; equal sources need not be
/// the same text).
fn same_source(a: &super::facts::Source<'_>, b: &super::facts::Source<'_>) -> bool {
    let same = |x: &str, y: &str| x.as_ptr() == y.as_ptr() && x.len() == y.len();
    same(a.0, b.0)
        && same(a.1, b.1)
        && match (a.2, b.2) {
            (Some(x), Some(y)) => same(x, y),
            (None, None) => true,
            _ => false,
        }
}

/// A webhook decision's record, borrowed from what decided it, written as the line a
/// [`Record`] with the same values serialises to ([`WebhookRecord::write`]) without
/// building one.
pub struct WebhookRecord<'a> {
    pub id: &'a str,
    pub time: k8s_openapi::jiff::Timestamp,
    /// The caller's text, each field at most 256 characters ([`clipped`]).
    pub request: RequestRef<'a>,
    /// The table that decided (its digest and audit rules); none when refused without it.
    pub table: Option<&'a Table>,
    /// The events, as [`decide_recorded_into`] wrote them (`[...]`); empty: none.
    pub events: &'a [u8],
    pub decision: &'a Decision,
    pub refused_without_rules: Option<&'a str>,
    pub latency_us: u64,
}

impl WebhookRecord<'_> {
    /// The verdict it records: `refuse` when refused without the rules.
    pub fn verdict(&self) -> &'static str {
        if self.refused_without_rules.is_some() {
            "refuse"
        } else {
            verdict_name(self.decision.verdict())
        }
    }

    /// The record as one NDJSON line (with its `\n`), appended to `out`: byte for byte what
    /// `serde_json` writes for the [`Record`] of the same values (a test compares them).
    pub fn write(&self, out: &mut Vec<u8>) {
        let d = self.decision;
        out.extend_from_slice(b"{\"record\":\"decision\",\"id\":");
        json::str(out, self.id);
        out.extend_from_slice(b",\"time\":\"");
        // A timestamp's text needs no escapes.
        json::time(out, self.time);
        out.extend_from_slice(b"\",\"site\":\"webhook\",\"request\":{\"uid\":");
        let r = &self.request;
        json::str(out, r.uid);
        out.extend_from_slice(b",\"user\":");
        json::str(out, r.user);
        out.extend_from_slice(b",\"operation\":");
        json::str(out, r.operation);
        out.extend_from_slice(b",\"kind\":");
        json::str(out, r.kind);
        out.extend_from_slice(b",\"namespace\":");
        json::str(out, r.namespace);
        out.extend_from_slice(b",\"name\":");
        json::str(out, r.name);
        if !r.object_uid.is_empty() {
            out.extend_from_slice(b",\"object_uid\":");
            json::str(out, r.object_uid);
        }
        if r.dry_run {
            out.extend_from_slice(b",\"dry_run\":true");
        }
        out.extend_from_slice(b"},\"rules\":{\"digest\":");
        json::str(out, self.table.map_or("", |t| t.digest.as_str()));
        if let Some(t) = self.table {
            json::list(
                out,
                b",\"audit\":[",
                t.audit_rules().map(|r| r.name.as_str()),
            );
        }
        out.extend_from_slice(b"},\"events\":");
        if self.events.is_empty() {
            out.extend_from_slice(b"[]");
        } else {
            out.extend_from_slice(self.events);
        }
        out.extend_from_slice(b",\"verdict\":");
        json::str(out, self.verdict());
        json::list(
            out,
            b",\"deciding\":[",
            d.deciding().iter().map(|f| f.rule.as_str()),
        );
        json::list(
            out,
            b",\"warnings\":[",
            d.warnings.iter().map(|f| f.rule.as_str()),
        );
        out.extend_from_slice(b",\"would_verdict\":");
        json::str(
            out,
            if self.refused_without_rules.is_some() {
                "refuse"
            } else {
                would_verdict(d)
            },
        );
        if let Some(why) = self.refused_without_rules {
            out.extend_from_slice(b",\"refused_without_rules\":");
            json::str(out, why);
        }
        out.extend_from_slice(b",\"latency_us\":");
        json::uint(out, self.latency_us);
        out.extend_from_slice(b"}\n");
    }
}

/// JSON written by hand, the same bytes `serde_json` writes.
mod json {
    /// Whether `b` is written escaped in a JSON string.
    fn escaped(b: u8) -> bool {
        (b < 0x20) | (b == b'"') | (b == b'\\')
    }

    /// `s` as a JSON string: `"` and `\` escaped, the control characters as `\b`, `\t`,
    /// `\n`, `\f`, `\r` or `\u00XX`, everything else (non-ASCII too) as it is (a test
    /// compares it with `serde_json`). Text with nothing to escape, nearly all of it, is
    /// tested without a branch per byte and copied whole.
    pub fn str(out: &mut Vec<u8>, s: &str) {
        let bytes = s.as_bytes();
        out.reserve(bytes.len() + 2);
        out.push(b'"');
        if any_escaped(bytes) {
            escape(out, bytes);
        } else {
            out.extend_from_slice(bytes);
        }
        out.push(b'"');
    }

    /// Whether any byte of `bytes` is [`escaped`]: eight bytes at a time (a byte below
    /// 0x20, `"` or `\`, found by the word tricks of "Bit Twiddling Hacks",
    /// exact for "any"); a string under four bytes one byte at a time.
    pub(super) fn any_escaped(bytes: &[u8]) -> bool {
        const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
        const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
        let zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGH;
        let word = |w: u64| {
            (w.wrapping_sub(ONES * 0x20) & !w & HIGH)
                | zero(w ^ (ONES * u64::from(b'"')))
                | zero(w ^ (ONES * u64::from(b'\\')))
        };
        let (words, _) = bytes.as_chunks::<8>();
        // The last eight bytes (again), or the first and last four: every byte is in a word.
        let last = if let Some(w) = bytes.last_chunk::<8>() {
            u64::from_ne_bytes(*w)
        } else if let (Some(a), Some(b)) = (bytes.first_chunk::<4>(), bytes.last_chunk::<4>()) {
            u64::from(u32::from_ne_bytes(*a)) | (u64::from(u32::from_ne_bytes(*b)) << 32)
        } else {
            return bytes.iter().fold(false, |any, &b| any | escaped(b));
        };
        words
            .iter()
            .fold(word(last), |any, w| any | word(u64::from_ne_bytes(*w)))
            != 0
    }

    #[cold]
    fn escape(out: &mut Vec<u8>, bytes: &[u8]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        // Written up to `start`.
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            if !escaped(b) {
                continue;
            }
            out.extend_from_slice(bytes.get(start..i).unwrap_or_default());
            start = i + 1;
            let short = match b {
                b'"' => b'"',
                b'\\' => b'\\',
                0x08 => b'b',
                0x09 => b't',
                0x0a => b'n',
                0x0c => b'f',
                0x0d => b'r',
                _ => b'u',
            };
            if short == b'u' {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            } else {
                out.push(b'\\');
                out.push(short);
            }
        }
        out.extend_from_slice(bytes.get(start..).unwrap_or_default());
    }

    /// `n` in `width` lower-case hex digits, zero-padded.
    pub fn hex(out: &mut String, n: u64, width: u32) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for i in (0..width).rev() {
            out.push(char::from(HEX[((n >> (4 * i)) & 0xf) as usize]));
        }
    }

    /// `n` in `width` decimal digits, zero-padded.
    fn padded(out: &mut Vec<u8>, mut n: u64, width: u32) {
        let mut digits = [b'0'; 20];
        let width = (width as usize).min(digits.len());
        for d in digits.iter_mut().take(width).rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
        out.extend_from_slice(digits.get(..width).unwrap_or_default());
    }

    /// A timestamp as jiff writes it (RFC 3339 in UTC, `Z`, the fraction of a second only
    /// when there is one and without its trailing zeros; a test compares them), without the
    /// formatting machinery: days to a civil date as in Howard Hinnant's `civil_from_days`.
    pub fn time(out: &mut Vec<u8>, t: k8s_openapi::jiff::Timestamp) {
        use std::io::Write;
        let (secs, nanos) = (t.as_second(), t.subsec_nanosecond());
        // Years 1970 to 9999; jiff itself for anything else.
        let (Ok(secs), Ok(nanos)) = (u64::try_from(secs), u32::try_from(nanos)) else {
            let _ = write!(out, "{t}");
            return;
        };
        if secs >= 253_402_300_800 {
            let _ = write!(out, "{t}");
            return;
        }
        let (days, of_day) = (secs / 86_400, secs % 86_400);
        let z = days + 719_468;
        let era = z / 146_097;
        let doe = z % 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + u64::from(month <= 2);
        padded(out, year, 4);
        out.push(b'-');
        padded(out, month, 2);
        out.push(b'-');
        padded(out, day, 2);
        out.push(b'T');
        padded(out, of_day / 3600, 2);
        out.push(b':');
        padded(out, of_day / 60 % 60, 2);
        out.push(b':');
        padded(out, of_day % 60, 2);
        if nanos != 0 {
            let (mut n, mut digits) = (nanos, 9);
            while n % 10 == 0 {
                n /= 10;
                digits -= 1;
            }
            out.push(b'.');
            padded(out, u64::from(n), digits);
        }
        out.push(b'Z');
    }

    pub fn uint(out: &mut Vec<u8>, mut n: u64) {
        // Nearly all: an index into a record's objects, a count.
        if n < 10 {
            out.push(b'0' + n as u8);
            return;
        }
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        out.extend_from_slice(digits.get(at..).unwrap_or_default());
    }

    pub fn int(out: &mut Vec<u8>, n: i64) {
        if n < 0 {
            out.push(b'-');
        }
        uint(out, n.unsigned_abs());
    }

    /// `,"key":[...]` of strings (`open` is `,"key":[`); nothing when there are none.
    pub fn list<'a>(out: &mut Vec<u8>, open: &[u8], items: impl Iterator<Item = &'a str>) {
        let mut first = true;
        for item in items {
            if first {
                out.extend_from_slice(open);
                first = false;
            } else {
                out.push(b',');
            }
            str(out, item);
        }
        if !first {
            out.push(b']');
        }
    }
}

/// The facts of a record, as a session's provider: replay decides from them. A fact the
/// record does not hold is [`crate::interp::Lookup::Later`]: the decision stops there, and
/// replay says which fact was missing.
pub struct RecordedFacts<'r> {
    values: [Option<Value<'r>>; crate::vocab::FACT_COUNT],
}

impl<'r> RecordedFacts<'r> {
    /// The facts of `event`. `Err` names a fact the record holds with a value of the wrong
    /// type, or a name the vocabulary does not know.
    pub fn new(event: &'r EventRecord) -> Result<RecordedFacts<'r>, String> {
        let mut values = [None; crate::vocab::FACT_COUNT];
        for f in &event.facts {
            let fact = Fact::lookup(&f.name).ok_or_else(|| format!("unknown fact `{}`", f.name))?;
            let value = match (fact.info().ty, &f.value) {
                (crate::vocab::Type::Int, serde_json::Value::Number(n)) => {
                    n.as_i64().map(Value::Int)
                }
                (crate::vocab::Type::Bool, serde_json::Value::Bool(b)) => Some(Value::Bool(*b)),
                (
                    crate::vocab::Type::Name | crate::vocab::Type::Enum(_),
                    serde_json::Value::String(s),
                ) => Some(Value::Str(s.as_str())),
                _ => None,
            }
            .ok_or_else(|| format!("fact `{}` has a value of the wrong type", f.name))?;
            if let Some(slot) = values.get_mut(fact.slot()) {
                *slot = Some(value);
            }
        }
        Ok(RecordedFacts { values })
    }
}

impl<'r> crate::interp::Facts<'r> for RecordedFacts<'r> {
    fn fact(&mut self, fact: Fact) -> crate::interp::Lookup<'r> {
        match self.values.get(fact.slot()).copied().flatten() {
            Some(v) => crate::interp::Lookup::Value(v),
            None => crate::interp::Lookup::Later,
        }
    }
}

/// A record decided again.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Replayed {
    pub verdict: String,
    pub deciding: Vec<String>,
    pub warnings: Vec<String>,
    pub would_verdict: String,
    /// The rules behind `would_verdict` ([`would_deciding`]).
    pub would_deciding: Vec<String>,
    /// Every rule that matched, enforced or audited, with its verdict (`rule: verdict`).
    pub matched: Vec<String>,
}

/// The rules behind a would-be verdict: each rule that matched with that verdict, enforced
/// or in audit mode, once, in the order they matched (none for `allow`).
pub fn would_deciding<'m>(matched: impl Iterator<Item = &'m Matched>, would: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if would == "allow" {
        return out;
    }
    for m in matched.filter(|m| m.verdict == would) {
        if !out.contains(&m.rule) {
            out.push(m.rule.clone());
        }
    }
    out
}

fn matched_text(m: &Matched) -> String {
    format!("{}: {} ({})", m.rule, m.verdict, m.mode)
}

impl Replayed {
    /// What a record says was decided, in the same terms.
    pub fn of_record(r: &Record) -> Replayed {
        Replayed {
            verdict: r.verdict.clone(),
            deciding: r.deciding.clone(),
            warnings: r.warnings.clone(),
            would_verdict: r.would_verdict.clone(),
            would_deciding: would_deciding(
                r.events.iter().flat_map(|e| &e.matched),
                &r.would_verdict,
            ),
            matched: r
                .events
                .iter()
                .flat_map(|e| &e.matched)
                .map(matched_text)
                .collect(),
        }
    }
}

/// Why a record cannot be decided again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// Refused before the rules were asked: there is nothing to decide again.
    #[error("refused without the rules ({0})")]
    WithoutRules(String),
    #[error("event {verb} {subject}: {why}")]
    BadEvent {
        verb: String,
        subject: String,
        why: String,
    },
    /// The rules read a fact the record does not hold (a new rule reading a fact the
    /// recorded rules never read).
    #[error("the rules read `{0}`, which the record does not hold")]
    MissingFact(String),
}

/// Decides `record` again from its facts with `table` (the interpreter and the one
/// [`super::decide::decide_event`] the webhook uses).
pub fn replay(table: &Table, record: &Record) -> Result<Replayed, ReplayError> {
    if let Some(why) = &record.refused_without_rules {
        return Err(ReplayError::WithoutRules(why.clone()));
    }
    let site = match record.site.as_str() {
        "controller" => crate::vocab::Site::Controller,
        _ => crate::vocab::Site::Webhook,
    };
    let mut decision = Decision::default();
    let mut matched = Vec::new();
    for ev in &record.events {
        let bad = |why: String| ReplayError::BadEvent {
            verb: ev.verb.clone(),
            subject: ev.subject.clone(),
            why,
        };
        let verb = crate::vocab::Verb::ALL
            .into_iter()
            .find(|v| v.name() == ev.verb)
            .ok_or_else(|| bad("unknown verb".into()))?;
        let subject = crate::vocab::Subject::parse(&ev.subject)
            .ok_or_else(|| bad("unknown subject".into()))?;
        let facts = RecordedFacts::new(ev).map_err(bad)?;
        let mut session = Session::new(table, facts);
        let before = lengths(&decision);
        if let Some(fact) =
            super::decide::decide_event(&mut session, (verb, subject, site), &mut decision)
        {
            return Err(ReplayError::MissingFact(fact.name().to_string()));
        }
        matched.extend(matched_since(&decision, before));
    }
    let would = would_verdict(&decision);
    Ok(Replayed {
        verdict: verdict_name(decision.verdict()).into(),
        deciding: decision.deciding().iter().map(|f| f.rule.clone()).collect(),
        warnings: decision.warnings.iter().map(|f| f.rule.clone()).collect(),
        would_verdict: would.into(),
        would_deciding: would_deciding(matched.iter(), would),
        matched: matched.iter().map(matched_text).collect(),
    })
}

/// Reads an NDJSON log of records: blank lines and lines that are not decision records
/// (log lines on a shared stderr) are skipped; a line that says it is a record and does
/// not parse is an error naming its line.
pub fn read_log(text: &str) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if !line.starts_with('{') || !line.contains("\"record\":\"decision\"") {
            continue;
        }
        let r: Record = super::nesting::json(line.as_bytes())
            .map_err(|e| format!("line {}: not a decision record: {e}", i + 1))?;
        out.push(r);
    }
    Ok(out)
}

/// Where records go.
pub enum Sink {
    /// Standard error, one line per record (the default).
    Stderr,
    /// A file, rotated by size: past `max_bytes` it becomes `PATH.1` (the older ones
    /// `PATH.2` ... up to `keep`) and a new `PATH` is started.
    File {
        path: PathBuf,
        max_bytes: u64,
        keep: u32,
    },
    /// Any writer (tests: a slow one).
    Writer(Box<dyn Write + Send>),
}

impl Sink {
    /// `serve --decision-log`: `stderr`, `off` (`None`: no records), or a file's path.
    pub fn from_flag(flag: &str, max_bytes: u64, keep: u32) -> Option<Sink> {
        match flag {
            "off" => None,
            "stderr" | "" => Some(Sink::Stderr),
            path => Some(Sink::File {
                path: PathBuf::from(path),
                max_bytes,
                keep,
            }),
        }
    }
}

/// The queue between decisions and the sink's writer thread.
pub struct Recorder {
    /// Records as NDJSON lines, serialised by the deciding thread and appended to one
    /// buffer the writer thread takes whole: what crosses to the writer thread is bytes, not
    /// a tree of strings (nor a buffer per record) the allocator would free across threads.
    queue: Arc<Queue>,
    /// The webhook's allowed admissions of work, for the controller's records to link to
    /// (`step_records`).
    pub admissions: super::step_records::Admissions,
    /// The decisions the controller's conditions cite (`step_records::Citations`).
    pub citations: super::step_records::Citations,
    metrics: Arc<Metrics>,
    /// Records dropped since the last time a drop was logged.
    unlogged_drops: AtomicU64,
    /// When a drop was last logged (micros since `started`).
    last_drop_log: AtomicU64,
    started: Instant,
}

/// The records waiting for the sink.
struct Queue {
    pending: Mutex<Pending>,
    /// Wakes the writer thread when it waits for a record ([`Pending::idle`]).
    wake: Condvar,
    /// How many records may wait: queued and taken by the writer thread but not yet
    /// written, less the one being written (as a channel of `capacity` with the one
    /// record in the writer's hands).
    capacity: usize,
    /// Records the writer thread took and has not written yet.
    in_flight: AtomicUsize,
}

#[derive(Default)]
struct Pending {
    /// Whole lines, each ending in `\n` (a record's JSON has no raw newline).
    lines: Vec<u8>,
    count: usize,
    /// The writer thread waits for a record: the next one wakes it (and only that one: a
    /// busy webhook's records wake nobody).
    idle: bool,
    /// The [`Recorder`] is gone: the writer thread writes what is left and ends.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        // A panic while holding the lock leaves whole lines behind: still usable.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends one line; `false` (and nothing appended) when the queue is full.
    fn push(&self, line: &[u8]) -> bool {
        let mut p = self.lock();
        let waiting = p.count + self.in_flight.load(Ordering::Relaxed).saturating_sub(1);
        if waiting >= self.capacity {
            return false;
        }
        p.lines.extend_from_slice(line);
        p.count += 1;
        let wake = std::mem::take(&mut p.idle);
        drop(p);
        if wake {
            self.wake.notify_one();
        }
        true
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.wake.notify_one();
    }
}

/// How many records wait for the sink at most, by default.
pub const DEFAULT_BUFFER: usize = 1024;

/// A drop is logged at most this often (with how many were dropped since).
const DROP_LOG_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    /// The deciding thread's buffers for a record's line and a webhook decision's events:
    /// reused, so a record allocates nothing once they have grown.
    static BUFFERS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer of this thread's ([`give_buffer`] it back): empty, with the capacity an
/// earlier record left it.
pub fn take_buffer() -> Vec<u8> {
    BUFFERS
        .try_with(|b| b.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Vec::with_capacity(2048))
}

/// Returns a buffer from [`take_buffer`] for the next record on this thread (a huge one is
/// let go).
pub fn give_buffer(mut buf: Vec<u8>) {
    if buf.capacity() > 256 * 1024 {
        return;
    }
    buf.clear();
    let _ = BUFFERS.try_with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < 4 {
            b.push(buf);
        }
    });
}

impl Recorder {
    /// Starts the writer thread. `buffer` records may wait for the sink; past that, records
    /// are dropped.
    pub fn start(sink: Sink, buffer: usize, metrics: Arc<Metrics>) -> std::io::Result<Arc<Self>> {
        let writer = Writer::open(sink)?;
        let queue = Arc::new(Queue {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            capacity: buffer.max(1),
            in_flight: AtomicUsize::new(0),
        });
        let thread_metrics = metrics.clone();
        let thread_queue = queue.clone();
        std::thread::Builder::new()
            .name("decision-records".into())
            .spawn(move || write_loop(&thread_queue, writer, &thread_metrics))?;
        Ok(Arc::new(Recorder {
            queue,
            admissions: Default::default(),
            citations: Default::default(),
            metrics,
            unlogged_drops: AtomicU64::new(0),
            last_drop_log: AtomicU64::new(0),
            started: Instant::now(),
        }))
    }

    /// Queues a record; never waits. A full queue drops it (counted; logged at most once a
    /// second, with the number dropped).
    pub fn record(&self, record: Record) {
        if self.queue_serialized(&record.id, &record) {
            self.admissions.note(&record);
        }
    }

    /// Queues a webhook decision's record, written straight from what decided it
    /// ([`WebhookRecord::write`]; [`Recorder::record`]'s queue and drops). `false` when it
    /// was dropped: no log will hold it, so the answer does not name it.
    pub fn record_webhook(&self, record: &WebhookRecord<'_>) -> bool {
        let mut line = take_buffer();
        record.write(&mut line);
        let queued = self.queue_line(record.id, &line);
        give_buffer(line);
        // Kept as an admission only when a log will hold it: the controller's records
        // cite the admission by its id.
        if queued {
            self.admissions.note_request(
                record.verdict(),
                &record.request,
                record.id,
                record.table.map_or("", |t| t.digest.as_str()),
                || record.time.to_string(),
            );
        }
        queued
    }

    /// Queues a controller decision ([`Recorder::record`]'s queue and drops). `false` when
    /// it was dropped: no log will hold it, so nothing may cite it
    /// (`step_records::Citations`).
    pub fn record_controller(&self, record: super::step_records::ControllerRecord) -> bool {
        self.queue_serialized(&record.decision.id, &record)
    }

    /// Queues a controller's plan step ([`Recorder::record`]'s queue and drops).
    pub fn record_step(&self, record: super::step_records::StepRecord) {
        self.queue_serialized(&record.id, &record);
    }

    /// Serialises a record on the caller's thread and queues its line: `true` when queued.
    fn queue_serialized<T: Serialize>(&self, id: &str, record: &T) -> bool {
        let mut line = take_buffer();
        if serde_json::to_writer(&mut line, record).is_err() {
            self.metrics.record_written(false);
            give_buffer(line);
            return false;
        }
        line.push(b'\n');
        let queued = self.queue_line(id, &line);
        give_buffer(line);
        queued
    }

    /// Queues one whole line (ending in `\n`), or drops it when the queue is full: `true`
    /// when queued.
    fn queue_line(&self, id: &str, line: &[u8]) -> bool {
        if self.queue.push(line) {
            return true;
        }
        self.metrics.record_dropped();
        self.unlogged_drops.fetch_add(1, Ordering::Relaxed);
        let now = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let last = self.last_drop_log.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= DROP_LOG_EVERY.as_micros() as u64;
        if due
            && self
                .last_drop_log
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let dropped = self.unlogged_drops.swap(0, Ordering::Relaxed);
            tracing::warn!(
                dropped,
                decision = %id,
                "the decision-record sink is behind: records dropped"
            );
        }
        false
    }
}

enum Writer {
    /// A pass's lines written in one call under stderr's lock, so that no log line lands
    /// inside a record.
    Stderr,
    File {
        path: PathBuf,
        /// Flushed at the end of every pass ([`Writer::flush`]) and before a rotation.
        file: std::io::BufWriter<std::fs::File>,
        size: u64,
        max_bytes: u64,
        keep: u32,
    },
    Any(Box<dyn Write + Send>),
}

impl Writer {
    fn open(sink: Sink) -> std::io::Result<Writer> {
        Ok(match sink {
            Sink::Stderr => Writer::Stderr,
            Sink::Writer(w) => Writer::Any(w),
            Sink::File {
                path,
                max_bytes,
                keep,
            } => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)?;
                let size = file.metadata()?.len();
                Writer::File {
                    path,
                    file: std::io::BufWriter::with_capacity(64 * 1024, file),
                    size,
                    max_bytes: max_bytes.max(1),
                    keep,
                }
            }
        })
    }

    /// Writes a pass's `lines` (`count` whole lines): at once when the sink allows it (stderr;
    /// a file that will not rotate), else line by line. `in_flight` counts down as they go.
    fn write_lines(
        &mut self,
        lines: &[u8],
        count: usize,
        metrics: &Metrics,
        failing: &mut bool,
        in_flight: &AtomicUsize,
    ) {
        let whole = match self {
            Writer::Stderr => Some(std::io::stderr().lock().write_all(lines)),
            Writer::File {
                file,
                size,
                max_bytes,
                ..
            } if *size + lines.len() as u64 <= *max_bytes => {
                let out = file.write_all(lines);
                if out.is_ok() {
                    *size += lines.len() as u64;
                }
                Some(out)
            }
            Writer::File { .. } | Writer::Any(_) => None,
        };
        match whole {
            Some(out) => {
                let ok = out.is_ok();
                for _ in 0..count {
                    metrics.record_written(ok);
                }
                report(out, "writing decision records failed", failing);
                in_flight.store(0, Ordering::Relaxed);
            }
            None => {
                for line in lines.split_inclusive(|&b| b == b'\n') {
                    let out = self.write_line(line);
                    metrics.record_written(out.is_ok());
                    report(out, "writing a decision record failed", failing);
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        match self {
            Writer::Stderr => std::io::stderr().lock().write_all(line),
            Writer::Any(w) => {
                w.write_all(line)?;
                w.flush()
            }
            Writer::File {
                path,
                file,
                size,
                max_bytes,
                keep,
            } => {
                if *size > 0 && *size + line.len() as u64 > *max_bytes {
                    file.flush()?;
                    rotate(path, *keep)?;
                    *file = std::io::BufWriter::with_capacity(
                        64 * 1024,
                        std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&*path)?,
                    );
                    *size = 0;
                }
                file.write_all(line)?;
                *size += line.len() as u64;
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Writer::Stderr => Ok(()),
            Writer::Any(w) => w.flush(),
            Writer::File { file, .. } => file.flush(),
        }
    }
}

/// `PATH.(keep-1)` -> `PATH.keep`, ..., `PATH` -> `PATH.1` (none kept: `PATH` removed).
fn rotate(path: &std::path::Path, keep: u32) -> std::io::Result<()> {
    let numbered = |n: u32| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    };
    if keep == 0 {
        return std::fs::remove_file(path);
    }
    for n in (1..keep).rev() {
        let from = numbered(n);
        if from.exists() {
            std::fs::rename(&from, numbered(n + 1))?;
        }
    }
    std::fs::rename(path, numbered(1))
}

/// How long the writer thread rests after a pass before it looks at the queue again: a busy
/// webhook's records go out in batches, one wake-up of this thread and one write each,
/// instead of one wake-up per decision (a futex call on the deciding thread and a context
/// switch). A record reaches the sink at most this much later; the default queue (1,024
/// records) holds more than 100,000 decisions a second meanwhile. An idle webhook's thread
/// waits for the next record and costs nothing.
const BATCH_EVERY: Duration = Duration::from_millis(10);

fn write_loop(queue: &Queue, mut writer: Writer, metrics: &Metrics) {
    let mut failing = false;
    let mut batch: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        let count = {
            let mut p = queue.lock();
            while p.count == 0 {
                if p.closed {
                    return;
                }
                p.idle = true;
                p = queue
                    .wake
                    .wait(p)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            p.idle = false;
            std::mem::swap(&mut p.lines, &mut batch);
            queue.in_flight.store(p.count, Ordering::Relaxed);
            std::mem::take(&mut p.count)
        };
        writer.write_lines(&batch, count, metrics, &mut failing, &queue.in_flight);
        // A burst's buffer is let go rather than kept at its peak.
        if batch.capacity() > 1024 * 1024 {
            batch = Vec::with_capacity(64 * 1024);
        }
        batch.clear();
        let flushed = writer.flush();
        report(flushed, "writing decision records failed", &mut failing);
        std::thread::sleep(BATCH_EVERY);
    }
}

/// Notes a write's outcome: a failure is logged once, until a write succeeds again.
fn report(out: std::io::Result<()>, what: &str, failing: &mut bool) {
    match out {
        Ok(()) => *failing = false,
        Err(e) => {
            if !*failing {
                tracing::error!(error = %e, "{what}");
            }
            *failing = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_names_the_text_not_the_folder() {
        let a = [
            SourceFile::new("rules/a.rules", "allow remove worker\n"),
            SourceFile::new("rules/b.rules", "allow remove cluster\n"),
        ];
        let moved = [
            SourceFile::new("/etc/ichor/b.rules", "allow remove cluster\n"),
            SourceFile::new("/etc/ichor/a.rules", "allow remove worker\n"),
        ];
        let edited = [
            SourceFile::new("rules/a.rules", "allow remove worker \n"),
            SourceFile::new("rules/b.rules", "allow remove cluster\n"),
        ];
        assert_eq!(digest(&a), digest(&moved));
        assert_ne!(digest(&a), digest(&edited));
        assert!(digest(&a).starts_with("sha256:") && digest(&a).len() == 7 + 64);
    }

    /// Bad records are clear errors, never panics: a line that says it is a record and is
    /// not one names its line; a fact of the wrong type or an unknown one is named; a fact
    /// the rules read and the record lacks is named by replay; log lines are skipped.
    #[test]
    fn bad_records_are_errors_that_say_why() {
        let log = "2026-12-05 INFO decided\n{\"record\":\"decision\",\"id\":3}\n";
        assert!(
            read_log(log)
                .expect_err("bad")
                .starts_with("line 2: not a decision record")
        );
        assert_eq!(
            read_log("plain log line\n{\"level\":\"info\"}\n"),
            Ok(Vec::new())
        );
        let event = |facts: serde_json::Value| -> EventRecord {
            serde_json::from_value(serde_json::json!({
                "verb": "remove", "subject": "controlplane", "cluster": "prod", "facts": facts
            }))
            .expect("an event")
        };
        let wrong = event(serde_json::json!([{"name": "approved", "value": "three"}]));
        assert_eq!(
            RecordedFacts::new(&wrong).err().as_deref(),
            Some("fact `approved` has a value of the wrong type")
        );
        let unknown = event(serde_json::json!([{"name": "aproved", "value": 3}]));
        assert_eq!(
            RecordedFacts::new(&unknown).err().as_deref(),
            Some("unknown fact `aproved`")
        );
        let table = crate::ruleset::shipped_table();
        let record = Record {
            record: "decision".into(),
            id: "x".into(),
            time: String::new(),
            site: "webhook".into(),
            request: None,
            rules: RulesInfo::default(),
            events: vec![event(serde_json::json!([{"name": "approved", "value": 3}]))],
            verdict: "allow".into(),
            deciding: Vec::new(),
            warnings: Vec::new(),
            would_verdict: "allow".into(),
            refused_without_rules: None,
            latency_us: 0,
        };
        assert!(matches!(
            replay(&table, &record),
            Err(ReplayError::MissingFact(_))
        ));
        let mut bad_verb = record.clone();
        bad_verb.events[0].verb = "obliterate".into();
        assert_eq!(
            replay(&table, &bad_verb)
                .err()
                .map(|e| e.to_string())
                .as_deref(),
            Some("event obliterate controlplane: unknown verb")
        );
    }

    /// The webhook's records are written by hand ([`decide_recorded_into`],
    /// [`WebhookRecord::write`]): byte for byte what `serde_json` writes for the [`Record`]
    /// of the same decision, so `replay`, the tests and `docs/operators.md` read the same
    /// format. Hostile text (quotes, backslashes, every kind of control character, DEL,
    /// non-ASCII, a lone `</script>`) in the caller's fields, the objects' resourceVersions
    /// and the rules' names and messages is escaped as `serde_json` escapes it and reads
    /// back exactly; every optional field is there in one of the cases and absent in another.
    #[test]
    fn a_written_record_is_the_serialised_record() {
        use super::super::admission::parse_review;
        use super::super::decide::request_events;
        let hostile = "a\"b\\c/d\ne\rf\tg\u{0}h\u{8}i\u{c}j\u{1b}k\u{1f}l\u{7f}m ü€😀 </script>";
        let mut snapshot =
            crate::runtime::objects::load_snapshot(include_str!("../../examples/objects.yaml"))
                .expect("the example objects");
        for (i, m) in snapshot.machines.iter_mut().enumerate() {
            m.metadata.resource_version = Some(format!("{i}{hostile}"));
        }
        let review =
            parse_review(include_bytes!("../../examples/delete-cp.json")).expect("the review");
        let events = request_events(
            review.operation(),
            &review.namespace,
            review.old.as_ref(),
            review.new.as_ref(),
        );
        assert!(!events.is_empty());
        for audit in [false, true] {
            let mut table = crate::ruleset::shipped_table();
            if audit {
                assert!(table.set_audit("declared-count", true));
            }
            let (expected_decision, tree) =
                decide_recorded(&table, &snapshot, &events, Expensive::FromObjects, false);
            let mut json = Vec::new();
            let mut decision = decide_recorded_into(
                &table,
                &snapshot,
                &events,
                Expensive::FromObjects,
                false,
                &mut json,
            );
            assert_eq!(decision, expected_decision);
            assert!(tree.iter().all(|e| !e.facts.is_empty()));
            assert!(
                tree.iter()
                    .any(|e| !e.objects.is_empty() && !e.matched.is_empty())
            );
            assert_eq!(
                String::from_utf8(json.clone()).expect("UTF-8"),
                serde_json::to_string(&tree).expect("JSON")
            );
            decision.warnings.push(Finding {
                rule: hostile.into(),
                verdict: Verdict::Warn,
                message: hostile.into(),
                reason: None,
            });
            for without_rules in [None, Some(hostile)] {
                let time = k8s_openapi::jiff::Timestamp::now();
                let user = format!("{}{hostile}", "ü".repeat(300));
                // Both ways of the optional fields: present (and escaped), and absent.
                let (object_uid, dry_run) = if without_rules.is_none() {
                    (hostile, true)
                } else {
                    ("", false)
                };
                let written = WebhookRecord {
                    id: &decision_id(),
                    time,
                    request: RequestRef {
                        uid: hostile,
                        user: clipped(&user),
                        operation: "DELETE",
                        kind: "TalosMachine",
                        namespace: "in\"fra",
                        name: hostile,
                        object_uid,
                        dry_run,
                    },
                    table: without_rules.is_none().then_some(&table),
                    events: if without_rules.is_none() { &json } else { &[] },
                    decision: &decision,
                    refused_without_rules: without_rules,
                    latency_us: u64::MAX,
                };
                let mut line = Vec::new();
                written.write(&mut line);
                let record = Record {
                    record: "decision".into(),
                    id: written.id.to_string(),
                    time: time.to_string(),
                    site: "webhook".into(),
                    request: Some(RequestInfo {
                        uid: clip(hostile),
                        user: clip(&user),
                        operation: "DELETE".into(),
                        kind: "TalosMachine".into(),
                        namespace: "in\"fra".into(),
                        name: clip(hostile),
                        object_uid: object_uid.into(),
                        dry_run,
                    }),
                    rules: RulesInfo {
                        digest: if without_rules.is_none() {
                            table.digest.clone()
                        } else {
                            String::new()
                        },
                        audit: if without_rules.is_none() {
                            table.audit_rules().map(|r| r.name.clone()).collect()
                        } else {
                            Vec::new()
                        },
                    },
                    events: if without_rules.is_none() {
                        tree.clone()
                    } else {
                        Vec::new()
                    },
                    verdict: written.verdict().into(),
                    deciding: decision.deciding().iter().map(|f| f.rule.clone()).collect(),
                    warnings: decision.warnings.iter().map(|f| f.rule.clone()).collect(),
                    would_verdict: if without_rules.is_some() {
                        "refuse".into()
                    } else {
                        would_verdict(&decision).into()
                    },
                    refused_without_rules: without_rules.map(str::to_string),
                    latency_us: u64::MAX,
                };
                let mut expected = serde_json::to_vec(&record).expect("JSON");
                expected.push(b'\n');
                let text = String::from_utf8(line).expect("UTF-8");
                assert_eq!(text, String::from_utf8(expected).expect("UTF-8"));
                assert_eq!(text.matches('\n').count(), 1, "one line: {text}");
                assert_eq!(read_log(&text), Ok(vec![record.clone()]));
                let request = record.request.as_ref().expect("request");
                assert_eq!(request.user.chars().count(), 256);
                assert_eq!(request.uid, hostile);
                assert_eq!(
                    record.verdict,
                    if audit && without_rules.is_none() {
                        "allow"
                    } else {
                        "refuse"
                    }
                );
            }
        }
    }

    /// A string is written as `serde_json` writes it whatever byte needs escaping, wherever
    /// it is, in strings of every length the check reads differently (under four bytes,
    /// under eight, whole words and the rest), next to ASCII and to multi-byte characters.
    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them_anywhere() {
        for base in [
            "",
            "a",
            "abc",
            "abcdef",
            "abcdefg",
            "abcdefghijklmnopq",
            "üü",
            "üüüüüüüüü",
        ] {
            for at in 0..=base.len() {
                for b in 0u8..0x80 {
                    let mut bytes = base.as_bytes().to_vec();
                    if !base.is_char_boundary(at) {
                        continue;
                    }
                    bytes.insert(at, b);
                    let s = String::from_utf8(bytes).expect("UTF-8");
                    let mut out = Vec::new();
                    json::str(&mut out, &s);
                    assert_eq!(
                        String::from_utf8(out).expect("UTF-8"),
                        serde_json::to_string(&s).expect("JSON"),
                        "{s:?}"
                    );
                }
            }
        }
        for n in [0u64, 9, 10, 99, 100, 12_345, u64::MAX] {
            let mut out = Vec::new();
            json::uint(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }

    /// Times are written by hand as jiff writes them: every date (leap days, centuries),
    /// fractions of every length, the ends of the range, and times before 1970 (jiff's).
    #[test]
    fn times_are_written_as_jiff_writes_them() {
        use k8s_openapi::jiff::Timestamp;
        let mut cases: Vec<(i64, i32)> = vec![
            (0, 0),
            (0, 1),
            (59, 10),
            (951_782_399, 999_999_999),
            (951_782_400, 0),
            (951_868_800, 100_000_000),
            (4_107_542_399, 120_000_000),
            (4_107_542_400, 123_456_780),
            (253_402_207_200, 0),
            (253_402_207_199, 999_999_999),
            (-1, 0),
            (-1, -500_000_000),
            (-62_135_596_800, 0),
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let secs = (x % 253_402_207_200) as i64;
            let nanos = ((x >> 24) % 1_000_000_000) as i32;
            // Whole seconds, milliseconds and microseconds too.
            let nanos = match i % 4 {
                0 => 0,
                1 => nanos / 1_000_000 * 1_000_000,
                2 => nanos / 1000 * 1000,
                _ => nanos,
            };
            cases.push((secs, nanos));
        }
        for (secs, nanos) in cases {
            let t = Timestamp::new(secs, nanos).expect("a timestamp");
            let mut out = Vec::new();
            json::time(&mut out, t);
            assert_eq!(String::from_utf8(out).expect("UTF-8"), t.to_string());
        }
    }

    #[test]
    fn decision_ids_are_32_hex_digits_counting_up() {
        let (a, b) = (decision_id(), decision_id());
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(a.get(..16), b.get(..16));
        let n = |id: &str| u64::from_str_radix(id.get(16..).unwrap_or_default(), 16);
        assert!(n(&b).expect("hex") > n(&a).expect("hex"));
    }

    #[test]
    fn clipped_keeps_256_characters() {
        assert_eq!(clipped("short"), "short");
        let long = "é".repeat(300);
        assert_eq!(clipped(&long), "é".repeat(256));
        assert_eq!(clipped(&long), clip(&long));
        let exact = "x".repeat(256);
        assert_eq!(clipped(&exact), exact);
    }

    #[test]
    fn a_file_sink_rotates_by_size() {
        let dir = std::env::temp_dir().join(format!("records-rotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("decisions.ndjson");
        let mut w = Writer::open(Sink::File {
            path: path.clone(),
            max_bytes: 10,
            keep: 2,
        })
        .expect("opens");
        for line in ["aaaaaa\n", "bbbbbb\n", "cccccc\n", "dddddd\n"] {
            w.write_line(line.as_bytes()).expect("writes");
        }
        w.flush().expect("flushes");
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
        assert_eq!(read(&path), "dddddd\n");
        assert_eq!(read(&dir.join("decisions.ndjson.1")), "cccccc\n");
        assert_eq!(read(&dir.join("decisions.ndjson.2")), "bbbbbb\n");
        assert!(!dir.join("decisions.ndjson.3").exists(), "only two kept");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The rotated files of `path` that exist (`PATH`, `PATH.1`, ...), oldest first, and
    /// their text.
    fn rotated(path: &std::path::Path, up_to: u32) -> Vec<(PathBuf, String)> {
        let mut out = Vec::new();
        for n in (0..=up_to).rev() {
            let p = if n == 0 {
                path.to_path_buf()
            } else {
                let mut p = path.as_os_str().to_owned();
                p.push(format!(".{n}"));
                PathBuf::from(p)
            };
            if let Ok(text) = std::fs::read_to_string(&p) {
                out.push((p, text));
            }
        }
        out
    }

    /// The writer thread writes a pass's records in one batch: a batch that fits the file is
    /// written whole; one that crosses `--decision-log-max-bytes` rotates between two
    /// records, never inside one, as often as it must. Every file then holds whole lines and
    /// at most `max_bytes` (a single record larger than that alone in a file of its own), no
    /// record is lost or written twice, they stay in order, and only `keep` rotated files
    /// remain.
    #[test]
    fn a_batch_of_records_rotates_between_records() {
        let dir = std::env::temp_dir().join(format!("records-batch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("decisions.ndjson");
        let max_bytes = 110;
        let line = |i: usize| format!("{{\"record\":\"decision\",\"id\":\"{i:04}\"}}\n");
        // 34 bytes each: three to a file.
        assert_eq!(line(0).len(), 34);
        let batch = |range: std::ops::Range<usize>| -> (Vec<u8>, usize) {
            (
                range.clone().flat_map(|i| line(i).into_bytes()).collect(),
                range.len(),
            )
        };
        let metrics = Metrics::default();
        // One pass of the writer thread: `count` lines in one batch.
        let pass = |w: &mut Writer, lines: &[u8], count: usize| {
            let mut failing = false;
            let in_flight = AtomicUsize::new(count);
            w.write_lines(lines, count, &metrics, &mut failing, &in_flight);
            w.flush().expect("flushes");
            assert_eq!(in_flight.load(Ordering::Relaxed), 0);
            assert!(!failing);
        };
        let mut w = Writer::open(Sink::File {
            path: path.clone(),
            max_bytes,
            keep: 50,
        })
        .expect("opens");
        // Fits: written whole, no rotation.
        let (lines, count) = batch(0..2);
        pass(&mut w, &lines, count);
        assert_eq!(rotated(&path, 60).len(), 1);
        // Crosses the limit several times in one batch.
        let (lines, count) = batch(2..14);
        pass(&mut w, &lines, count);
        // A record larger than the limit, inside a batch: a file of its own.
        let big = format!(
            "{{\"record\":\"decision\",\"id\":\"big\",\"pad\":\"{}\"}}\n",
            "x".repeat(150)
        );
        let mut lines = big.clone().into_bytes();
        lines.extend(batch(14..16).0);
        pass(&mut w, &lines, 3);
        let files = rotated(&path, 60);
        let mut all = String::new();
        for (p, text) in &files {
            assert!(
                text.ends_with('\n'),
                "{} ends inside a record: {text:?}",
                p.display()
            );
            assert!(
                text.len() as u64 <= max_bytes || text == &big,
                "{} holds {} bytes: {text:?}",
                p.display(),
                text.len()
            );
            for l in text.lines() {
                assert!(
                    serde_json::from_str::<serde_json::Value>(l).is_ok(),
                    "a split record in {}: {l:?}",
                    p.display()
                );
            }
            all.push_str(text);
        }
        let mut want: String = (0..14).map(line).collect();
        want.push_str(&big);
        want.extend((14..16).map(line));
        assert_eq!(all, want, "every record once, in order");
        // 0..14: 14 records three to a file (five files); the big one alone; two more.
        assert_eq!(files.len(), 7, "{files:?}");
        assert!(
            metrics
                .render()
                .contains("ichor_rules_decision_records_total{outcome=\"written\"} 17\n"),
            "{}",
            metrics.render()
        );

        // Only `keep` rotated files remain, however many rotations one batch makes; the
        // newest records are the ones kept.
        let kept = dir.join("kept.ndjson");
        let mut w = Writer::open(Sink::File {
            path: kept.clone(),
            max_bytes,
            keep: 2,
        })
        .expect("opens");
        let (lines, count) = batch(0..20);
        pass(&mut w, &lines, count);
        let files = rotated(&kept, 10);
        assert_eq!(files.len(), 3, "PATH, PATH.1 and PATH.2: {files:?}");
        assert!(!dir.join("kept.ndjson.3").exists(), "only two kept");
        let all: String = files.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(
            all,
            (12..20).map(line).collect::<String>(),
            "the newest kept"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Through the writer thread: records queued faster than it wakes (its 10 ms rest) reach
    /// a rotating file in batches, every one of them, whole and in order.
    #[test]
    fn records_queued_in_a_burst_reach_a_rotating_file_whole() {
        let dir = std::env::temp_dir().join(format!("records-burst-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("decisions.ndjson");
        let metrics = Arc::new(Metrics::default());
        let recorder = Recorder::start(
            Sink::File {
                path: path.clone(),
                max_bytes: 1000,
                keep: 1000,
            },
            1000,
            metrics.clone(),
        )
        .expect("starts");
        let n = 400;
        for i in 0..n {
            assert!(recorder.queue_line(
                &format!("{i}"),
                format!("{{\"record\":\"decision\",\"id\":\"{i:04}\"}}\n").as_bytes()
            ));
        }
        let written = format!("ichor_rules_decision_records_total{{outcome=\"written\"}} {n}\n");
        let until = Instant::now() + Duration::from_secs(20);
        while !metrics.render().contains(&written) {
            assert!(Instant::now() < until, "{}", metrics.render());
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(recorder);
        let files = rotated(&path, 1000);
        assert!(files.len() >= 10, "{} files", files.len());
        let mut ids = Vec::new();
        for (p, text) in &files {
            assert!(
                text.len() <= 1000 && text.ends_with('\n'),
                "{}",
                p.display()
            );
            for l in text.lines() {
                let v: serde_json::Value = serde_json::from_str(l).expect("a whole record");
                ids.push(v["id"].as_str().expect("id").to_string());
            }
        }
        let want: Vec<String> = (0..n).map(|i| format!("{i:04}")).collect();
        assert_eq!(ids, want);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod drops {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A sink that never finishes a write until released.
    struct Stuck(Arc<AtomicBool>);

    impl Write for Stuck {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            while !self.0.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn dropped(m: &Metrics) -> u64 {
        m.render()
            .lines()
            .find_map(|l| {
                l.strip_prefix("ichor_rules_decision_records_total{outcome=\"dropped\"} ")
            })
            .and_then(|v| v.parse().ok())
            .expect("the dropped counter")
    }

    /// A record dropped because the sink is behind is counted, and the drop is logged with
    /// the decision and how many were dropped: at once for the first, then at most once a
    /// second with the number dropped since (a stuck sink does not flood the log).
    #[test]
    fn a_dropped_record_is_logged_and_counted() {
        let release = Arc::new(AtomicBool::new(false));
        let metrics = Arc::new(Metrics::default());
        let recorder = Recorder::start(
            Sink::Writer(Box::new(Stuck(release.clone()))),
            1,
            metrics.clone(),
        )
        .expect("the recorder starts");
        let logged = crate::runtime::logs::Logged::default();
        let log = || logged.text();
        let subscriber = || logged.subscriber();
        let burst = |from: usize| {
            for i in from..from + 10 {
                recorder.queue_line(&format!("id-{i}"), b"{}\n");
            }
        };
        // One record in the writer's hands (it never returns)...
        recorder.queue_line("id-stuck", b"{}\n");
        std::thread::sleep(Duration::from_millis(300));
        tracing::subscriber::with_default(subscriber(), || burst(0));
        // ... one waiting: the other nine dropped.
        let first = dropped(&metrics);
        assert_eq!(first, 9);
        let text = log();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("the decision-record sink is behind: records dropped"))
            .collect();
        assert_eq!(lines.len(), 1, "one line for the burst: {text}");
        assert!(
            lines[0].contains("WARN")
                && lines[0].contains("dropped=1")
                && lines[0].contains("decision=id-"),
            "{text}"
        );
        // A second later, the next drop is logged with every drop since the last line.
        std::thread::sleep(DROP_LOG_EVERY + Duration::from_millis(50));
        tracing::subscriber::with_default(subscriber(), || {
            recorder.queue_line("id-late", b"{}\n");
        });
        assert_eq!(dropped(&metrics), first + 1);
        let text = log();
        assert!(
            text.contains(&format!("dropped={first} decision=id-late")),
            "{text}"
        );
        release.store(true, Ordering::SeqCst);
    }
}
