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
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
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
    s.chars().take(256).collect()
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
    format!("{prefix:016x}{:016x}", NEXT.fetch_add(1, Ordering::Relaxed))
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
    /// Every rule that matched, enforced or audited, with its verdict (`rule: verdict`).
    pub matched: Vec<String>,
}

impl Replayed {
    /// What a record says was decided, in the same terms.
    pub fn of_record(r: &Record) -> Replayed {
        Replayed {
            verdict: r.verdict.clone(),
            deciding: r.deciding.clone(),
            warnings: r.warnings.clone(),
            would_verdict: r.would_verdict.clone(),
            matched: r
                .events
                .iter()
                .flat_map(|e| &e.matched)
                .map(|m| format!("{}: {} ({})", m.rule, m.verdict, m.mode))
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
        matched.extend(
            matched_since(&decision, before)
                .into_iter()
                .map(|m| format!("{}: {} ({})", m.rule, m.verdict, m.mode)),
        );
    }
    Ok(Replayed {
        verdict: verdict_name(decision.verdict()).into(),
        deciding: decision.deciding().iter().map(|f| f.rule.clone()).collect(),
        warnings: decision.warnings.iter().map(|f| f.rule.clone()).collect(),
        would_verdict: would_verdict(&decision).into(),
        matched,
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
    /// Records as NDJSON lines, serialised by the deciding thread: what crosses to the
    /// writer thread is one buffer, not a tree of strings the allocator would have to free
    /// across threads.
    tx: SyncSender<Vec<u8>>,
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

/// How many records wait for the sink at most, by default.
pub const DEFAULT_BUFFER: usize = 1024;

/// A drop is logged at most this often (with how many were dropped since).
const DROP_LOG_EVERY: Duration = Duration::from_secs(1);

impl Recorder {
    /// Starts the writer thread. `buffer` records may wait for the sink; past that, records
    /// are dropped.
    pub fn start(sink: Sink, buffer: usize, metrics: Arc<Metrics>) -> std::io::Result<Arc<Self>> {
        let writer = Writer::open(sink)?;
        let (tx, rx) = sync_channel(buffer.max(1));
        let thread_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("decision-records".into())
            .spawn(move || write_loop(rx, writer, thread_metrics))?;
        Ok(Arc::new(Recorder {
            tx,
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
        self.admissions.note(&record);
        self.queue(&record.id, &record);
    }

    /// Queues a controller decision ([`Recorder::record`]'s queue and drops).
    pub fn record_controller(&self, record: super::step_records::ControllerRecord) {
        self.queue(&record.decision.id, &record);
    }

    /// Queues a controller's plan step ([`Recorder::record`]'s queue and drops).
    pub fn record_step(&self, record: super::step_records::StepRecord) {
        self.queue(&record.id, &record);
    }

    /// Serialises a record on the caller's thread and queues its line.
    fn queue<T: Serialize>(&self, id: &str, record: &T) {
        let mut line = Vec::with_capacity(2048);
        if serde_json::to_writer(&mut line, record).is_err() {
            self.metrics.record_written(false);
            return;
        }
        line.push(b'\n');
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.metrics.record_dropped();
                self.unlogged_drops.fetch_add(1, Ordering::Relaxed);
                let now = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
                let last = self.last_drop_log.load(Ordering::Relaxed);
                let due =
                    last == 0 || now.saturating_sub(last) >= DROP_LOG_EVERY.as_micros() as u64;
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
            }
        }
    }
}

enum Writer {
    /// Whole lines gathered during a pass and written at its end ([`Writer::flush`]) in one
    /// call under stderr's lock, so that no log line lands inside a record.
    Stderr(Vec<u8>),
    File {
        path: PathBuf,
        /// Flushed whenever the queue is empty ([`Writer::flush`]) and before a rotation.
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
            Sink::Stderr => Writer::Stderr(Vec::with_capacity(64 * 1024)),
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

    fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        match self {
            Writer::Stderr(pending) => {
                pending.extend_from_slice(line);
                if pending.len() >= 64 * 1024 {
                    let out = std::io::stderr().lock().write_all(pending);
                    pending.clear();
                    out?;
                }
                Ok(())
            }
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
}

impl Writer {
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Writer::Stderr(pending) => {
                if pending.is_empty() {
                    return Ok(());
                }
                let out = std::io::stderr().lock().write_all(pending);
                pending.clear();
                out
            }
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
/// webhook's records go out in batches, one wake-up of this thread each, instead of one
/// wake-up per decision (a futex call on the deciding thread and a context switch). A record
/// reaches the sink at most this much later; the default queue (1,024 records) holds more
/// than 100,000 decisions a second meanwhile. An idle webhook's thread waits in `recv` and
/// costs nothing.
const BATCH_EVERY: Duration = Duration::from_millis(10);

fn write_loop(rx: Receiver<Vec<u8>>, mut writer: Writer, metrics: Arc<Metrics>) {
    let mut failing = false;
    while let Ok(line) = rx.recv() {
        write_one(&line, &mut writer, &metrics, &mut failing);
        // What queued meanwhile goes out in the same pass.
        while let Ok(line) = rx.try_recv() {
            write_one(&line, &mut writer, &metrics, &mut failing);
        }
        if let Err(e) = writer.flush() {
            if !failing {
                tracing::error!(error = %e, "writing decision records failed");
            }
            failing = true;
        }
        std::thread::sleep(BATCH_EVERY);
    }
}

/// Writes one record's line.
fn write_one(line: &[u8], writer: &mut Writer, metrics: &Metrics, failing: &mut bool) {
    match writer.write_line(line) {
        Ok(()) => {
            metrics.record_written(true);
            *failing = false;
        }
        Err(e) => {
            metrics.record_written(false);
            if !*failing {
                tracing::error!(error = %e, "writing a decision record failed");
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
}
