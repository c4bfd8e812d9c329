//! Step logs: everything a procedure asked of its world and everything the world answered,
//! one JSON object per line (NDJSON), and the replay that checks such a log against the
//! executor.
//!
//! The controller writes one when `serve --step-log FILE` is given ([`Traced`] wraps its
//! world): each reconcile's lines carry its number (reconciles of different objects
//! interleave), from `begin` (the procedure, the object as the watch gave it, the timing)
//! through every read (the state read, with the objects), Talos call and answer, lock,
//! drain, status write, finalizer release, event, decision (its verdict and deciding rules)
//! and plan step, to `end` (the outcome). A reconcile cut short (the process killed) has no
//! `end`.
//!
//! [`check`] (`ichor-rules verify RULES --check-trace FILE`) replays every reconcile of a
//! log through the executor with the given rules, in a world that answers exactly what the
//! log recorded ([`Replay`]; removals, operations, backups' snapshots, machines'
//! configurations and bootstraps): the run is a behaviour of the model's controller when the
//! executor asks for the same things in the same order, decides the same, takes the same
//! steps and ends the same. The first difference is reported with its line. A reconcile
//! whose log ends early is a controller stopped there, which the model explores too. What
//! the world answered is taken as recorded: that the model's world answers the same is
//! what the conformance replay checks (`tests/conformance.rs`).

use super::apply::{self, ApplyError, ApplyWorld, BaseError, TalosApi};
use super::backup::{self, BackupTiming, BackupWorld, Failure, Stored};
use super::bootstrap::{self, BootstrapWorld};
use super::operation::{self, OperationWorld};
use super::{Call, Drained, LockOp, Node, NodeError, Note, Outcome, Reply, Timing, World, removal};
use crate::runtime::live::Reads;
use crate::runtime::objects::{
    BootstrapRecord, Snapshot, SnapshotRecord, TalosCluster, TalosConfigPatch, TalosEtcdBackup,
    TalosMachine, TalosOperation,
};
use crate::runtime::render::{Base, Rendered};
use crate::runtime::talos::{Applied, ApplyMode, TalosError};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One line of a step log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// The reconcile it belongs to.
    pub reconcile: u64,
    #[serde(flatten)]
    pub entry: Entry,
}

/// What a line records. `answer` is what the world answered: `Err` is the world's own
/// failure (an API error), which ends the reconcile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Entry {
    Begin {
        procedure: String,
        object: Value,
        timing: TimingRec,
    },
    Now {
        at: String,
    },
    Credentials {
        cluster: String,
        answer: Result<(), String>,
    },
    Talos {
        cluster: String,
        node: NodeRec,
        call: Call,
        answer: Result<Result<Reply, NodeErrorRec>, String>,
    },
    Lock {
        cluster: String,
        lock: LockOp,
        answer: Result<Result<(), String>, String>,
    },
    Read {
        cluster: String,
        reads: ReadsRec,
        answer: Result<Value, String>,
    },
    Drain {
        node: String,
        answer: Result<Result<Drained, String>, String>,
    },
    WriteStatus {
        machine: String,
        status: Value,
        answer: Result<Option<String>, String>,
    },
    ReleaseFinalizer {
        machine: String,
        answer: Result<(), String>,
    },
    Event {
        machine: String,
        warning: bool,
        reason: String,
        note: String,
    },
    Decided {
        verdict: String,
        rules: Vec<String>,
    },
    Fact {
        fact: String,
        value: i64,
    },
    Step {
        k: usize,
        text: String,
    },
    /// An operation's status written (`namespace/name`).
    WriteOperation {
        operation: String,
        status: Value,
        answer: Result<(), String>,
    },
    OperationEvent {
        operation: String,
        warning: bool,
        reason: String,
        note: String,
    },
    /// A Kubernetes Node cordoned (`on`) or uncordoned: whether it was cordoned before.
    Cordon {
        node: String,
        on: bool,
        answer: Result<Result<Option<bool>, String>, String>,
    },
    NodeReady {
        node: String,
        answer: Result<Result<Option<bool>, String>, String>,
    },
    /// A backup's status written (`namespace/name`).
    WriteBackup {
        backup: String,
        status: Value,
        answer: Result<(), String>,
    },
    BackupEvent {
        backup: String,
        warning: bool,
        reason: String,
        note: String,
    },
    /// A snapshot of `machine`'s node streamed into the backup's store as `key`.
    StreamSnapshot {
        backup: String,
        machine: String,
        key: String,
        answer: Result<Result<Stored, Failure>, String>,
    },
    /// An object of the backup's store deleted.
    DeleteObject {
        backup: String,
        key: String,
        answer: Result<Result<(), Failure>, String>,
    },
    /// A cluster's base Secret read: its digest (never its content), or why there is none.
    Base {
        secret: String,
        answer: Result<Result<String, BaseError>, String>,
    },
    /// A cluster's TalosConfigPatches listed.
    Patches {
        cluster: String,
        answer: Result<Result<Vec<TalosConfigPatch>, String>, String>,
    },
    /// A machine's configuration rendered: its sha256 (never the configuration), or why not.
    Render {
        machine: String,
        patches: Vec<String>,
        answer: Result<String, String>,
    },
    /// `ApplyConfiguration` of the configuration with this sha256 on a machine's node.
    ApplyConfiguration {
        machine: String,
        api: TalosApi,
        sha256: String,
        mode: ApplyMode,
        dry_run: bool,
        answer: Result<Result<Applied, ApplyError>, String>,
    },
    /// A TalosCluster's `status.bootstrap` written (`guard`: naming the resourceVersion
    /// read); `false`: another writer came first.
    RecordBootstrap {
        cluster: String,
        /// `None`: the record withdrawn (a Bootstrap that was never sent).
        record: Option<BootstrapRecord>,
        guard: bool,
        answer: Result<bool, String>,
    },
    ClusterEvent {
        cluster: String,
        warning: bool,
        reason: String,
        note: String,
    },
    End {
        outcome: String,
        /// The machine's status the procedure left for its reconcile's one write (`apply`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<Value>,
    },
}

impl Entry {
    /// Whether the entry records something done (a write, an event, a Talos call that
    /// changes the node, a lock, a drain, a cordon), as opposed to something read or
    /// decided.
    pub fn acts(&self) -> bool {
        match self {
            Entry::Begin { .. }
            | Entry::Now { .. }
            | Entry::Credentials { .. }
            | Entry::Read { .. }
            | Entry::NodeReady { .. }
            | Entry::Decided { .. }
            | Entry::Fact { .. }
            | Entry::Base { .. }
            | Entry::Patches { .. }
            | Entry::Render { .. }
            | Entry::End { .. } => false,
            Entry::Talos { call, .. } => !call.reads_only(),
            Entry::Lock { .. }
            | Entry::Drain { .. }
            | Entry::WriteStatus { .. }
            | Entry::ReleaseFinalizer { .. }
            | Entry::Event { .. }
            | Entry::Step { .. }
            | Entry::WriteOperation { .. }
            | Entry::OperationEvent { .. }
            | Entry::Cordon { .. }
            | Entry::WriteBackup { .. }
            | Entry::BackupEvent { .. }
            | Entry::StreamSnapshot { .. }
            | Entry::DeleteObject { .. }
            | Entry::ApplyConfiguration { .. }
            | Entry::RecordBootstrap { .. }
            | Entry::ClusterEvent { .. } => true,
        }
    }

    fn op(&self) -> &'static str {
        match self {
            Entry::Begin { .. } => "begin",
            Entry::Now { .. } => "now",
            Entry::Credentials { .. } => "credentials",
            Entry::Talos { .. } => "talos",
            Entry::Lock { .. } => "lock",
            Entry::Read { .. } => "read",
            Entry::Drain { .. } => "drain",
            Entry::WriteStatus { .. } => "write_status",
            Entry::ReleaseFinalizer { .. } => "release_finalizer",
            Entry::Event { .. } => "event",
            Entry::Decided { .. } => "decided",
            Entry::Fact { .. } => "fact",
            Entry::Step { .. } => "step",
            Entry::WriteOperation { .. } => "write_operation",
            Entry::OperationEvent { .. } => "operation_event",
            Entry::Cordon { .. } => "cordon",
            Entry::NodeReady { .. } => "node_ready",
            Entry::WriteBackup { .. } => "write_backup",
            Entry::BackupEvent { .. } => "backup_event",
            Entry::StreamSnapshot { .. } => "stream_snapshot",
            Entry::DeleteObject { .. } => "delete_object",
            Entry::Base { .. } => "base",
            Entry::Patches { .. } => "patches",
            Entry::Render { .. } => "render",
            Entry::ApplyConfiguration { .. } => "apply_configuration",
            Entry::RecordBootstrap { .. } => "record_bootstrap",
            Entry::ClusterEvent { .. } => "cluster_event",
            Entry::End { .. } => "end",
        }
    }
}

/// Which node a call went to: the machine's own endpoint, or a host through a machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeRec {
    Endpoint { machine: String },
    Via { machine: String, host: String },
    Maintenance { machine: String },
}

impl NodeRec {
    fn of(node: Node<'_>) -> NodeRec {
        match node {
            Node::Endpoint(m) => NodeRec::Endpoint { machine: key(m) },
            Node::Via(m, host) => NodeRec::Via {
                machine: key(m),
                host: host.to_string(),
            },
            Node::Maintenance(m) => NodeRec::Maintenance { machine: key(m) },
        }
    }
}

/// `namespace/name` of a machine.
fn key(m: &TalosMachine) -> String {
    format!("{}/{}", m.namespace(), m.name())
}

/// `namespace/name` of an operation.
fn op_key(o: &TalosOperation) -> String {
    format!("{}/{}", o.namespace(), o.name())
}

/// A failed Talos call, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeErrorRec {
    NoCredentials(String),
    NoEndpoint(String),
    Config(String),
    Unreachable {
        endpoint: String,
        node: Option<String>,
        detail: String,
    },
    Failed {
        endpoint: String,
        node: Option<String>,
        code: i32,
        message: String,
    },
}

impl NodeErrorRec {
    fn of(e: &NodeError) -> NodeErrorRec {
        match e {
            NodeError::NoCredentials(w) => NodeErrorRec::NoCredentials(w.clone()),
            NodeError::NoEndpoint(w) => NodeErrorRec::NoEndpoint(w.clone()),
            NodeError::Talos(TalosError::Config(w)) => NodeErrorRec::Config(w.clone()),
            NodeError::Talos(TalosError::Unreachable {
                endpoint,
                node,
                detail,
            }) => NodeErrorRec::Unreachable {
                endpoint: endpoint.clone(),
                node: node.clone(),
                detail: detail.clone(),
            },
            NodeError::Talos(TalosError::Failed {
                endpoint,
                node,
                code,
                message,
            }) => NodeErrorRec::Failed {
                endpoint: endpoint.clone(),
                node: node.clone(),
                code: *code as i32,
                message: message.clone(),
            },
        }
    }

    fn error(&self) -> NodeError {
        match self.clone() {
            NodeErrorRec::NoCredentials(w) => NodeError::NoCredentials(w),
            NodeErrorRec::NoEndpoint(w) => NodeError::NoEndpoint(w),
            NodeErrorRec::Config(w) => NodeError::Talos(TalosError::Config(w)),
            NodeErrorRec::Unreachable {
                endpoint,
                node,
                detail,
            } => NodeError::Talos(TalosError::Unreachable {
                endpoint,
                node,
                detail,
            }),
            NodeErrorRec::Failed {
                endpoint,
                node,
                code,
                message,
            } => NodeError::Talos(TalosError::Failed {
                endpoint,
                node,
                code: tonic::Code::from(code),
                message,
            }),
        }
    }
}

/// The kinds a read read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadsRec {
    pub machines: bool,
    pub clusters: bool,
    pub operations: bool,
}

impl From<Reads> for ReadsRec {
    fn from(r: Reads) -> ReadsRec {
        ReadsRec {
            machines: r.machines,
            clusters: r.clusters,
            operations: r.operations,
        }
    }
}

/// A procedure's intervals, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimingRec {
    pub refused_requeue_ms: u64,
    pub lock_retry_ms: u64,
    pub drain_retry_ms: u64,
    pub reset_settle_ms: u64,
    /// Absent from logs written before it was recorded: the controller's default then.
    #[serde(default = "default_sent_deadline_ms")]
    pub sent_deadline_ms: u64,
}

fn default_sent_deadline_ms() -> u64 {
    ms(crate::runtime::controller::Settings::default().install_deadline)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<&Timing> for TimingRec {
    fn from(t: &Timing) -> TimingRec {
        TimingRec {
            refused_requeue_ms: ms(t.refused_requeue),
            lock_retry_ms: ms(t.lock_retry),
            drain_retry_ms: ms(t.drain_retry),
            reset_settle_ms: ms(t.reset_settle),
            sent_deadline_ms: ms(t.sent_deadline),
        }
    }
}

impl From<TimingRec> for Timing {
    fn from(t: TimingRec) -> Timing {
        Timing {
            refused_requeue: Duration::from_millis(t.refused_requeue_ms),
            lock_retry: Duration::from_millis(t.lock_retry_ms),
            drain_retry: Duration::from_millis(t.drain_retry_ms),
            reset_settle: Duration::from_millis(t.reset_settle_ms),
            sent_deadline: Duration::from_millis(t.sent_deadline_ms),
        }
    }
}

/// How a reconcile ended, in the words both the log and its replay use.
pub fn outcome_text<E>(o: &Result<Outcome, E>) -> String {
    match o {
        Ok(Outcome::Requeue { after, wait }) => format!("requeue after {}ms: {wait:?}", ms(*after)),
        Ok(Outcome::AwaitChange) => "await change".into(),
        Err(_) => "error".into(),
    }
}

/// Where step logs go: one line per write, whole lines only.
///
/// A reconcile begun with [`StepLog::begin_repeatable`] (a machine's configuration, looked
/// at again every probe) is held back while it only reads: once it acts (any entry
/// [`Entry::acts`]) its lines so far are written and the rest go straight through; if it
/// ends having only read, it is written unless it is an exact repeat of the last quiet
/// reconcile logged for the same key (the same reads, answers, decisions and status, the
/// times asked excepted), whose replay would be the same. A repeat is counted, not logged.
pub struct StepLog {
    out: std::sync::Mutex<Box<dyn Write + Send>>,
    next: AtomicU64,
    held: std::sync::Mutex<HeldReconciles>,
    repeats: AtomicU64,
}

/// The quiet reconciles not written yet, and the digest of the last quiet one written per
/// key.
#[derive(Default)]
struct HeldReconciles {
    open: std::collections::HashMap<u64, Held>,
    last: std::collections::HashMap<String, Vec<u8>>,
}

/// At most this many keys remembered (machines): past it, the memory starts over, and a
/// repeat is written once more.
const REPEAT_KEYS: usize = 65_536;

/// At most this many quiet reconciles held at once.
const OPEN_HELD: usize = 4096;

struct Held {
    key: String,
    text: Vec<u8>,
    digest: ring::digest::Context,
}

impl StepLog {
    pub fn new(out: Box<dyn Write + Send>) -> StepLog {
        StepLog {
            out: std::sync::Mutex::new(out),
            next: AtomicU64::new(1),
            held: std::sync::Mutex::new(HeldReconciles::default()),
            repeats: AtomicU64::new(0),
        }
    }

    /// How many quiet reconciles were not written, each the repeat of one that was.
    pub fn repeats(&self) -> u64 {
        self.repeats.load(Ordering::Relaxed)
    }

    /// Appends to `path` (created when missing).
    pub fn open(path: &std::path::Path) -> std::io::Result<StepLog> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(StepLog::new(Box::new(f)))
    }

    fn write(&self, reconcile: u64, entry: Entry) {
        let acts = entry.acts();
        let ends = matches!(entry, Entry::End { .. });
        let line = Line { reconcile, entry };
        let Ok(mut text) = serde_json::to_vec(&line) else {
            return;
        };
        text.push(b'\n');
        if let Some(text) = self.hold(reconcile, &line.entry, text, acts, ends) {
            self.put(&text);
        }
    }

    /// Holds a line of a quiet reconcile back; `Some`: what to write now.
    fn hold(
        &self,
        reconcile: u64,
        entry: &Entry,
        text: Vec<u8>,
        acts: bool,
        ends: bool,
    ) -> Option<Vec<u8>> {
        let Ok(mut held) = self.held.lock() else {
            return Some(text);
        };
        let held = &mut *held;
        let Some(mut h) = held.open.remove(&reconcile) else {
            // Not held (any other reconcile, or one that acted): written now.
            return Some(text);
        };
        h.text.extend_from_slice(&text);
        if acts {
            // It acts: everything so far, and it is no longer a quiet one to compare with.
            held.last.remove(&h.key);
            return Some(h.text);
        }
        if !matches!(entry, Entry::Now { .. }) {
            // The entry without its reconcile's number: repeats compare by what they say.
            if let Ok(bytes) = serde_json::to_vec(entry) {
                h.digest.update(&bytes);
            }
        }
        if !ends {
            held.open.insert(reconcile, h);
            return None;
        }
        let digest = h.digest.finish().as_ref().to_vec();
        if held.last.get(&h.key) == Some(&digest) {
            self.repeats.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if held.last.len() >= REPEAT_KEYS {
            held.last.clear();
        }
        held.last.insert(h.key, digest);
        Some(h.text)
    }

    fn put(&self, text: &[u8]) {
        if let Ok(mut out) = self.out.lock() {
            // A log that cannot be written never stops the controller; it says so once
            // per failed write.
            if let Err(e) = out.write_all(text).and_then(|()| out.flush()) {
                tracing::warn!(error = %e, "the step log could not be written");
            }
        }
    }

    /// A new reconcile of `object` (the TalosMachine of a `removal`, the TalosOperation of
    /// an `operation`, the [`BackupBegin`] of a `backup`) by `procedure`: its number.
    pub fn begin<T: Serialize>(&self, procedure: &str, object: &T, timing: &Timing) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.begin_as(id, procedure, object, timing);
        id
    }

    /// [`StepLog::begin`] of a reconcile that repeats while nothing changes (`key`: what
    /// it reconciles): held back while it only reads, and not written when it is the exact
    /// repeat of the last quiet one of `key` (see [`StepLog`]).
    pub fn begin_repeatable<T: Serialize>(
        &self,
        procedure: &str,
        key: &str,
        object: &T,
        timing: &Timing,
    ) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut held) = self.held.lock() {
            if held.open.len() >= OPEN_HELD {
                // Reconciles that never ended (their tasks dropped): written as they are,
                // as a reconcile cut short is.
                let mut open: Vec<_> = held.open.drain().collect();
                open.sort_by_key(|(id, _)| *id);
                for (_, h) in open {
                    self.put(&h.text);
                }
            }
            held.open.insert(
                id,
                Held {
                    key: format!("{procedure} {key}"),
                    text: Vec::new(),
                    digest: ring::digest::Context::new(&ring::digest::SHA256),
                },
            );
        }
        self.begin_as(id, procedure, object, timing);
        id
    }

    fn begin_as<T: Serialize>(&self, id: u64, procedure: &str, object: &T, timing: &Timing) {
        self.write(
            id,
            Entry::Begin {
                procedure: procedure.into(),
                object: serde_json::to_value(object).unwrap_or(Value::Null),
                timing: timing.into(),
            },
        );
    }

    pub fn end<E>(&self, id: u64, outcome: &Result<Outcome, E>) {
        self.write(
            id,
            Entry::End {
                outcome: outcome_text(outcome),
                status: None,
            },
        );
    }

    /// [`StepLog::end`], with the status the procedure left for its caller to write.
    pub fn end_with_status<E, S: Serialize>(
        &self,
        id: u64,
        outcome: &Result<Outcome, E>,
        status: &S,
    ) {
        self.write(
            id,
            Entry::End {
                outcome: outcome_text(outcome),
                status: Some(serde_json::to_value(status).unwrap_or(Value::Null)),
            },
        );
    }
}

/// A world that logs everything it is asked and answers.
pub struct Traced<'l, W> {
    pub inner: W,
    log: &'l StepLog,
    id: u64,
}

impl<'l, W> Traced<'l, W> {
    pub fn new(inner: W, log: &'l StepLog, id: u64) -> Traced<'l, W> {
        Traced { inner, log, id }
    }
}

fn err_text<E: std::fmt::Display>(e: &E) -> String {
    e.to_string()
}

impl<W: World> World for Traced<'_, W>
where
    W::Error: std::fmt::Display,
{
    type Error = W::Error;

    fn journal(&mut self) -> Option<&mut crate::runtime::step_records::Journal> {
        self.inner.journal()
    }

    fn now(&self) -> Timestamp {
        let at = self.inner.now();
        self.log.write(self.id, Entry::Now { at: at.to_string() });
        at
    }

    async fn credentials(&mut self, cluster: &str) -> Result<(), String> {
        let answer = self.inner.credentials(cluster).await;
        self.log.write(
            self.id,
            Entry::Credentials {
                cluster: cluster.into(),
                answer: answer.clone(),
            },
        );
        answer
    }

    async fn talos(
        &mut self,
        cluster: &str,
        node: Node<'_>,
        call: Call,
    ) -> Result<Result<Reply, NodeError>, Self::Error> {
        let answer = self.inner.talos(cluster, node, call.clone()).await;
        self.log.write(
            self.id,
            Entry::Talos {
                cluster: cluster.into(),
                node: NodeRec::of(node),
                call,
                answer: match &answer {
                    Ok(Ok(r)) => Ok(Ok(r.clone())),
                    Ok(Err(e)) => Ok(Err(NodeErrorRec::of(e))),
                    Err(e) => Err(err_text(e)),
                },
            },
        );
        answer
    }

    async fn lock(&mut self, cluster: &str, op: LockOp) -> Result<Result<(), String>, Self::Error> {
        let answer = self.inner.lock(cluster, op).await;
        self.log.write(
            self.id,
            Entry::Lock {
                cluster: cluster.into(),
                lock: op,
                answer: answer.as_ref().map(Clone::clone).map_err(err_text),
            },
        );
        answer
    }

    async fn read(&mut self, cluster: &str, reads: Reads) -> Result<Arc<Snapshot>, Self::Error> {
        let answer = self.inner.read(cluster, reads).await;
        self.log.write(
            self.id,
            Entry::Read {
                cluster: cluster.into(),
                reads: reads.into(),
                answer: match &answer {
                    Ok(s) => Ok(serde_json::to_value(&**s).unwrap_or(Value::Null)),
                    Err(e) => Err(err_text(e)),
                },
            },
        );
        answer
    }

    async fn drain(&mut self, node: &str) -> Result<Result<Drained, String>, Self::Error> {
        let answer = self.inner.drain(node).await;
        self.log.write(
            self.id,
            Entry::Drain {
                node: node.into(),
                answer: answer.as_ref().map(Clone::clone).map_err(err_text),
            },
        );
        answer
    }

    async fn write_status(
        &mut self,
        before: &TalosMachine,
        after: &TalosMachine,
    ) -> Result<Option<String>, Self::Error> {
        let answer = self.inner.write_status(before, after).await;
        self.log.write(
            self.id,
            Entry::WriteStatus {
                machine: key(after),
                status: serde_json::to_value(&after.status).unwrap_or(Value::Null),
                answer: answer.as_ref().map(Clone::clone).map_err(err_text),
            },
        );
        answer
    }

    async fn release_finalizer(&mut self, m: &TalosMachine) -> Result<(), Self::Error> {
        let answer = self.inner.release_finalizer(m).await;
        self.log.write(
            self.id,
            Entry::ReleaseFinalizer {
                machine: key(m),
                answer: answer.as_ref().map(|_| ()).map_err(err_text),
            },
        );
        answer
    }

    async fn event(&mut self, on: &TalosMachine, warning: bool, reason: &str, note: String) {
        self.log.write(
            self.id,
            Entry::Event {
                machine: key(on),
                warning,
                reason: reason.into(),
                note: note.clone(),
            },
        );
        self.inner.event(on, warning, reason, note).await;
    }

    fn note(&mut self, on: &TalosMachine, note: Note<'_>) {
        if let Some(entry) = note_entry(&note) {
            self.log.write(self.id, entry);
        }
        self.inner.note(on, note);
    }
}

impl<W: OperationWorld> OperationWorld for Traced<'_, W>
where
    W::Error: std::fmt::Display,
{
    async fn write_operation(
        &mut self,
        before: &TalosOperation,
        after: &TalosOperation,
    ) -> Result<(), Self::Error> {
        let answer = self.inner.write_operation(before, after).await;
        self.log.write(
            self.id,
            Entry::WriteOperation {
                operation: op_key(after),
                status: serde_json::to_value(&after.status).unwrap_or(Value::Null),
                answer: answer.as_ref().map(|_| ()).map_err(err_text),
            },
        );
        answer
    }

    async fn operation_event(
        &mut self,
        on: &TalosOperation,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.log.write(
            self.id,
            Entry::OperationEvent {
                operation: op_key(on),
                warning,
                reason: reason.into(),
                note: note.clone(),
            },
        );
        self.inner.operation_event(on, warning, reason, note).await;
    }

    async fn node_event(&mut self, on: &TalosOperation, machine: &str, reason: &str, note: String) {
        self.log.write(
            self.id,
            Entry::OperationEvent {
                operation: op_key(on),
                warning: false,
                reason: reason.into(),
                note: note.clone(),
            },
        );
        self.inner.node_event(on, machine, reason, note).await;
    }

    async fn cordon(
        &mut self,
        node: &str,
        on: bool,
    ) -> Result<Result<Option<bool>, String>, Self::Error> {
        let answer = self.inner.cordon(node, on).await;
        self.log.write(
            self.id,
            Entry::Cordon {
                node: node.into(),
                on,
                answer: answer.as_ref().map(Clone::clone).map_err(err_text),
            },
        );
        answer
    }

    async fn node_ready(
        &mut self,
        node: &str,
    ) -> Result<Result<Option<bool>, String>, Self::Error> {
        let answer = self.inner.node_ready(node).await;
        self.log.write(
            self.id,
            Entry::NodeReady {
                node: node.into(),
                answer: answer.as_ref().map(Clone::clone).map_err(err_text),
            },
        );
        answer
    }

    fn step_took(&mut self, action: crate::vocab::Action, took: Duration) {
        self.inner.step_took(action, took);
    }

    fn ended(&mut self, op: &TalosOperation, succeeded: bool) {
        self.inner.ended(op, succeeded);
    }
}

impl<W: BackupWorld> BackupWorld for Traced<'_, W>
where
    W::Error: std::fmt::Display,
{
    async fn write_backup(
        &mut self,
        before: &TalosEtcdBackup,
        after: &TalosEtcdBackup,
    ) -> Result<(), Self::Error> {
        let answer = self.inner.write_backup(before, after).await;
        self.log.write(
            self.id,
            Entry::WriteBackup {
                backup: backup_key(after),
                status: serde_json::to_value(&after.status).unwrap_or(Value::Null),
                answer: answer.as_ref().map(|_| ()).map_err(err_text),
            },
        );
        answer
    }

    async fn backup_event(
        &mut self,
        on: &TalosEtcdBackup,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.log.write(
            self.id,
            Entry::BackupEvent {
                backup: backup_key(on),
                warning,
                reason: reason.into(),
                note: note.clone(),
            },
        );
        self.inner.backup_event(on, warning, reason, note).await;
    }

    async fn stream_snapshot(
        &mut self,
        b: &TalosEtcdBackup,
        m: &TalosMachine,
        key: &str,
    ) -> Result<Result<Stored, Failure>, Self::Error> {
        let answer = self.inner.stream_snapshot(b, m, key).await;
        self.log.write(
            self.id,
            Entry::StreamSnapshot {
                backup: backup_key(b),
                machine: m.name().into(),
                key: key.into(),
                answer: answer.as_ref().map(Clone::clone).map_err(err_text),
            },
        );
        answer
    }

    async fn delete_object(
        &mut self,
        b: &TalosEtcdBackup,
        key: &str,
    ) -> Result<Result<(), Failure>, Self::Error> {
        let answer = self.inner.delete_object(b, key).await;
        self.log.write(
            self.id,
            Entry::DeleteObject {
                backup: backup_key(b),
                key: key.into(),
                answer: answer.as_ref().map(Clone::clone).map_err(err_text),
            },
        );
        answer
    }

    fn snapshot_ended(
        &mut self,
        b: &TalosEtcdBackup,
        result: Result<&SnapshotRecord, &str>,
        took: Duration,
    ) {
        self.inner.snapshot_ended(b, result, took);
    }
}

impl<W: ApplyWorld> ApplyWorld for Traced<'_, W>
where
    W::Error: std::fmt::Display,
{
    async fn base(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> Result<Result<Arc<Base>, BaseError>, Self::Error> {
        let answer = self.inner.base(namespace, name).await;
        self.log.write(
            self.id,
            Entry::Base {
                secret: format!("{namespace}/{name}"),
                // The digest only: the base holds the cluster's secrets.
                answer: match &answer {
                    Ok(Ok(b)) => Ok(Ok(b.digest.clone())),
                    Ok(Err(e)) => Ok(Err(e.clone())),
                    Err(e) => Err(err_text(e)),
                },
            },
        );
        answer
    }

    async fn patches(
        &mut self,
        cluster: &TalosCluster,
    ) -> Result<Result<Vec<TalosConfigPatch>, String>, Self::Error> {
        let answer = self.inner.patches(cluster).await;
        self.log.write(
            self.id,
            Entry::Patches {
                cluster: format!("{}/{}", cluster.namespace(), cluster.name()),
                answer: answer.as_ref().map(Clone::clone).map_err(err_text),
            },
        );
        answer
    }

    fn render(
        &mut self,
        base: &Base,
        m: &TalosMachine,
        patches: &[&TalosConfigPatch],
    ) -> Result<Rendered, String> {
        let answer = self.inner.render(base, m, patches);
        self.log.write(
            self.id,
            Entry::Render {
                machine: key(m),
                patches: patches.iter().map(|p| p.name().to_string()).collect(),
                answer: answer
                    .as_ref()
                    .map(|r| r.sha256.clone())
                    .map_err(Clone::clone),
            },
        );
        answer
    }

    async fn apply_configuration(
        &mut self,
        m: &TalosMachine,
        api: TalosApi,
        config: &Rendered,
        mode: ApplyMode,
        dry_run: bool,
    ) -> Result<Result<Applied, ApplyError>, Self::Error> {
        let answer = self
            .inner
            .apply_configuration(m, api, config, mode, dry_run)
            .await;
        self.log.write(
            self.id,
            Entry::ApplyConfiguration {
                machine: key(m),
                api,
                sha256: config.sha256.clone(),
                mode,
                dry_run,
                answer: answer.as_ref().map(Clone::clone).map_err(err_text),
            },
        );
        answer
    }
}

/// What a machine's configuration reconcile begins from: its cluster (when there is one),
/// the machine as read, and its status so far (`next`: the reconcile's probe included).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApplyBegin {
    /// The machine's cluster as read, which the plan's guards read: recorded only when the
    /// table's `plan apply` for the machine's role has a guarded step (a snapshot changes
    /// at every probe, and a quiet repeat is logged once only when its begin is the same).
    #[serde(default, skip_serializing_if = "unread")]
    pub snapshot: Snapshot,
    pub cluster: Option<TalosCluster>,
    pub machine: TalosMachine,
    pub next: TalosMachine,
}

impl ApplyBegin {
    pub fn new(
        table: &crate::compile::Table,
        snapshot: &Snapshot,
        cluster: Option<&TalosCluster>,
        m: &TalosMachine,
        next: &TalosMachine,
    ) -> Self {
        let guarded = crate::runtime::decide::reconcile_machine_event(m)
            .and_then(|ev| table.plan(ev.event.0, ev.event.1))
            .is_some_and(|p| {
                p.steps
                    .iter()
                    .any(|s| s.when.is_some() || s.unless.is_some())
            });
        ApplyBegin {
            snapshot: if guarded {
                snapshot.clone()
            } else {
                Snapshot::default()
            },
            cluster: cluster.cloned(),
            machine: m.clone(),
            next: next.clone(),
        }
    }
}

/// A snapshot with nothing in it (none recorded).
fn unread(s: &Snapshot) -> bool {
    s.machines.is_empty()
        && s.clusters.is_empty()
        && s.operations.is_empty()
        && s.backups.is_empty()
        && s.patches.is_empty()
}

impl<W: BootstrapWorld> BootstrapWorld for Traced<'_, W>
where
    W::Error: std::fmt::Display,
{
    async fn record_bootstrap(
        &mut self,
        cluster: &TalosCluster,
        record: Option<&BootstrapRecord>,
        guard: bool,
    ) -> Result<bool, Self::Error> {
        let answer = self.inner.record_bootstrap(cluster, record, guard).await;
        self.log.write(
            self.id,
            Entry::RecordBootstrap {
                cluster: cluster_key(cluster),
                record: record.cloned(),
                guard,
                answer: answer.as_ref().map(|b| *b).map_err(err_text),
            },
        );
        answer
    }

    async fn cluster_event(
        &mut self,
        on: &TalosCluster,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.log.write(
            self.id,
            Entry::ClusterEvent {
                cluster: cluster_key(on),
                warning,
                reason: reason.into(),
                note: note.clone(),
            },
        );
        self.inner.cluster_event(on, warning, reason, note).await;
    }
}

/// A cluster's key in a log: `namespace/name`.
fn cluster_key(c: &TalosCluster) -> String {
    format!("{}/{}", c.namespace(), c.name())
}

/// What a bootstrap reconcile begins from: the cluster as read, the control plane it is
/// asked for, and the controller's identity (recorded as who sent it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BootstrapBegin {
    pub snapshot: Snapshot,
    pub machine: TalosMachine,
    pub identity: String,
}

impl BootstrapBegin {
    pub fn new(snapshot: &Snapshot, m: &TalosMachine, identity: &str) -> Self {
        BootstrapBegin {
            snapshot: snapshot.clone(),
            machine: m.clone(),
            identity: identity.to_string(),
        }
    }
}

/// A backup's key in a log: `namespace/name`.
fn backup_key(b: &TalosEtcdBackup) -> String {
    format!("{}/{}", b.namespace(), b.name())
}

/// What a backup's reconcile begins from: the backup, the cluster's operations (its
/// `etcd-snapshot` requests) and its intervals.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackupBegin {
    pub backup: TalosEtcdBackup,
    pub operations: Vec<TalosOperation>,
    pub retry_ms: u64,
    pub recheck_ms: u64,
}

impl BackupBegin {
    pub fn new(b: &TalosEtcdBackup, operations: &[TalosOperation], t: &BackupTiming) -> Self {
        BackupBegin {
            backup: b.clone(),
            operations: operations.to_vec(),
            retry_ms: u64::try_from(t.retry.as_millis()).unwrap_or(u64::MAX),
            recheck_ms: u64::try_from(t.recheck.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// The notes a log keeps (decisions, facts, steps); log lines of the controller's own are
/// not part of a run.
fn note_entry(note: &Note<'_>) -> Option<Entry> {
    match note {
        Note::Decided(d) => Some(Entry::Decided {
            verdict: match d.verdict() {
                Some(v) => v.name().to_string(),
                None => "allow".to_string(),
            },
            rules: d
                .refusals
                .iter()
                .chain(&d.holds)
                .chain(&d.warnings)
                .map(|f| f.rule.clone())
                .collect(),
        }),
        Note::Fact { fact, value, .. } => Some(Entry::Fact {
            fact: fact.to_string(),
            value: *value,
        }),
        Note::Step(k, text) => Some(Entry::Step {
            k: *k,
            text: (*text).to_string(),
        }),
        Note::Info(_) | Note::Warn(_) => None,
    }
}

/// The replay stopped: the log ended, recorded a failure of the world, or differs.
#[derive(Debug)]
pub struct Stop;

/// A world answering exactly what a log recorded, in order; the first thing asked that
/// the log did not record is the divergence.
pub struct Replay<'a> {
    lines: &'a [(usize, Entry)],
    at: std::cell::Cell<usize>,
    /// The first difference: its line and what differed.
    pub diverged: std::cell::RefCell<Option<String>>,
    /// The log ended before the executor did: a controller stopped there.
    pub cut: std::cell::Cell<bool>,
}

impl<'a> Replay<'a> {
    pub fn new(lines: &'a [(usize, Entry)]) -> Replay<'a> {
        Replay {
            lines,
            at: std::cell::Cell::new(0),
            diverged: std::cell::RefCell::new(None),
            cut: std::cell::Cell::new(false),
        }
    }

    /// The entries not yet replayed.
    pub fn rest(&self) -> &'a [(usize, Entry)] {
        self.lines.get(self.at.get()..).unwrap_or(&[])
    }

    fn differ(&self, line: usize, text: String) {
        let mut d = self.diverged.borrow_mut();
        if d.is_none() {
            *d = Some(format!("line {line}: {text}"));
        }
    }

    /// The next entry, which must be `want`'s kind and satisfy `same`.
    fn take(&self, want: &str, same: impl Fn(&Entry) -> Option<String>) -> Result<&'a Entry, Stop> {
        if self.diverged.borrow().is_some() {
            return Err(Stop);
        }
        let Some((line, entry)) = self.lines.get(self.at.get()) else {
            self.cut.set(true);
            return Err(Stop);
        };
        self.at.set(self.at.get() + 1);
        if entry.op() != want {
            self.differ(
                *line,
                format!(
                    "the run recorded `{}`, where the executor asks for `{want}`",
                    entry.op()
                ),
            );
            return Err(Stop);
        }
        if let Some(why) = same(entry) {
            self.differ(*line, why);
            return Err(Stop);
        }
        Ok(entry)
    }
}

fn differs<T: std::fmt::Debug + PartialEq>(what: &str, recorded: &T, asked: &T) -> Option<String> {
    (recorded != asked)
        .then(|| format!("the run's {what} was {recorded:?}, where the executor's is {asked:?}"))
}

impl World for Replay<'_> {
    type Error = Stop;

    fn now(&self) -> Timestamp {
        match self.take("now", |_| None) {
            Ok(Entry::Now { at }) => at.parse().unwrap_or(Timestamp::UNIX_EPOCH),
            _ => Timestamp::UNIX_EPOCH,
        }
    }

    async fn credentials(&mut self, cluster: &str) -> Result<(), String> {
        match self.take("credentials", |e| match e {
            Entry::Credentials { cluster: c, .. } => differs("cluster", c, &cluster.to_string()),
            _ => None,
        }) {
            Ok(Entry::Credentials { answer, .. }) => answer.clone(),
            _ => Err("the step log ends here".into()),
        }
    }

    async fn talos(
        &mut self,
        cluster: &str,
        node: Node<'_>,
        call: Call,
    ) -> Result<Result<Reply, NodeError>, Stop> {
        let asked = NodeRec::of(node);
        let entry = self.take("talos", |e| match e {
            Entry::Talos {
                cluster: c,
                node: n,
                call: k,
                ..
            } => differs("cluster", c, &cluster.to_string())
                .or_else(|| differs("Talos call", k, &call))
                .or_else(|| differs("node called", n, &asked)),
            _ => None,
        })?;
        match entry {
            Entry::Talos { answer, .. } => match answer {
                Ok(Ok(r)) => Ok(Ok(r.clone())),
                Ok(Err(e)) => Ok(Err(e.error())),
                Err(_) => Err(Stop),
            },
            _ => Err(Stop),
        }
    }

    async fn lock(&mut self, cluster: &str, op: LockOp) -> Result<Result<(), String>, Stop> {
        let entry = self.take("lock", |e| match e {
            Entry::Lock {
                cluster: c,
                lock: o,
                ..
            } => differs("cluster", c, &cluster.to_string()).or_else(|| differs("lock", o, &op)),
            _ => None,
        })?;
        match entry {
            Entry::Lock { answer: Ok(a), .. } => Ok(a.clone()),
            _ => Err(Stop),
        }
    }

    async fn read(&mut self, cluster: &str, reads: Reads) -> Result<Arc<Snapshot>, Stop> {
        let asked = ReadsRec::from(reads);
        let entry = self.take("read", |e| match e {
            Entry::Read {
                cluster: c,
                reads: r,
                ..
            } => differs("cluster", c, &cluster.to_string()).or_else(|| differs("read", r, &asked)),
            _ => None,
        })?;
        let line = self
            .lines
            .get(self.at.get().saturating_sub(1))
            .map_or(0, |(l, _)| *l);
        match entry {
            Entry::Read { answer: Ok(v), .. } => match serde_json::from_value(v.clone()) {
                Ok(s) => Ok(Arc::new(s)),
                Err(e) => {
                    self.differ(line, format!("the objects read cannot be read back: {e}"));
                    Err(Stop)
                }
            },
            _ => Err(Stop),
        }
    }

    async fn drain(&mut self, node: &str) -> Result<Result<Drained, String>, Stop> {
        let entry = self.take("drain", |e| match e {
            Entry::Drain { node: n, .. } => differs("node drained", n, &node.to_string()),
            _ => None,
        })?;
        match entry {
            Entry::Drain { answer: Ok(a), .. } => Ok(a.clone()),
            _ => Err(Stop),
        }
    }

    async fn write_status(
        &mut self,
        _before: &TalosMachine,
        after: &TalosMachine,
    ) -> Result<Option<String>, Stop> {
        let status = serde_json::to_value(&after.status).unwrap_or(Value::Null);
        let entry = self.take("write_status", |e| match e {
            Entry::WriteStatus {
                machine, status: s, ..
            } => differs("status written of", machine, &key(after))
                .or_else(|| differs("status written", s, &status)),
            _ => None,
        })?;
        match entry {
            Entry::WriteStatus { answer: Ok(a), .. } => Ok(a.clone()),
            _ => Err(Stop),
        }
    }

    async fn release_finalizer(&mut self, m: &TalosMachine) -> Result<(), Stop> {
        let entry = self.take("release_finalizer", |e| match e {
            Entry::ReleaseFinalizer { machine, .. } => {
                differs("finalizer released of", machine, &key(m))
            }
            _ => None,
        })?;
        match entry {
            Entry::ReleaseFinalizer { answer: Ok(()), .. } => Ok(()),
            _ => Err(Stop),
        }
    }

    async fn event(&mut self, on: &TalosMachine, warning: bool, reason: &str, note: String) {
        let _ = self.take("event", |e| match e {
            Entry::Event {
                machine,
                warning: w,
                reason: r,
                note: n,
            } => differs("event on", machine, &key(on))
                .or_else(|| differs("event's warning", w, &warning))
                .or_else(|| differs("event's reason", r, &reason.to_string()))
                .or_else(|| differs("event's note", n, &note)),
            _ => None,
        });
    }

    fn note(&mut self, _on: &TalosMachine, note: Note<'_>) {
        let Some(asked) = note_entry(&note) else {
            return;
        };
        let what = format!("`{}` record", asked.op());
        let _ = self.take(asked.op(), |e| differs(&what, e, &asked));
    }
}

impl OperationWorld for Replay<'_> {
    async fn write_operation(
        &mut self,
        _before: &TalosOperation,
        after: &TalosOperation,
    ) -> Result<(), Stop> {
        let status = serde_json::to_value(&after.status).unwrap_or(Value::Null);
        let entry = self.take("write_operation", |e| match e {
            Entry::WriteOperation {
                operation,
                status: s,
                ..
            } => differs("status written of", operation, &op_key(after))
                .or_else(|| differs("status written", s, &status)),
            _ => None,
        })?;
        match entry {
            Entry::WriteOperation { answer: Ok(()), .. } => Ok(()),
            _ => Err(Stop),
        }
    }

    async fn operation_event(
        &mut self,
        on: &TalosOperation,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let _ = self.take("operation_event", |e| match e {
            Entry::OperationEvent {
                operation,
                warning: w,
                reason: r,
                note: n,
            } => differs("event on", operation, &op_key(on))
                .or_else(|| differs("event's warning", w, &warning))
                .or_else(|| differs("event's reason", r, &reason.to_string()))
                .or_else(|| differs("event's note", n, &note)),
            _ => None,
        });
    }

    async fn cordon(&mut self, node: &str, on: bool) -> Result<Result<Option<bool>, String>, Stop> {
        let entry = self.take("cordon", |e| match e {
            Entry::Cordon { node: n, on: o, .. } => {
                differs("node cordoned", n, &node.to_string()).or_else(|| differs("cordon", o, &on))
            }
            _ => None,
        })?;
        match entry {
            Entry::Cordon { answer: Ok(a), .. } => Ok(a.clone()),
            _ => Err(Stop),
        }
    }

    async fn node_ready(&mut self, node: &str) -> Result<Result<Option<bool>, String>, Stop> {
        let entry = self.take("node_ready", |e| match e {
            Entry::NodeReady { node: n, .. } => differs("node read", n, &node.to_string()),
            _ => None,
        })?;
        match entry {
            Entry::NodeReady { answer: Ok(a), .. } => Ok(a.clone()),
            _ => Err(Stop),
        }
    }
}

impl BackupWorld for Replay<'_> {
    async fn write_backup(
        &mut self,
        _before: &TalosEtcdBackup,
        after: &TalosEtcdBackup,
    ) -> Result<(), Stop> {
        let status = serde_json::to_value(&after.status).unwrap_or(Value::Null);
        let entry = self.take("write_backup", |e| match e {
            Entry::WriteBackup {
                backup, status: s, ..
            } => differs("status written of", backup, &backup_key(after))
                .or_else(|| differs("status written", s, &status)),
            _ => None,
        })?;
        match entry {
            Entry::WriteBackup { answer: Ok(()), .. } => Ok(()),
            _ => Err(Stop),
        }
    }

    async fn backup_event(
        &mut self,
        on: &TalosEtcdBackup,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let _ = self.take("backup_event", |e| match e {
            Entry::BackupEvent {
                backup,
                warning: w,
                reason: r,
                note: n,
            } => differs("event on", backup, &backup_key(on))
                .or_else(|| differs("event's warning", w, &warning))
                .or_else(|| differs("event's reason", r, &reason.to_string()))
                .or_else(|| differs("event's note", n, &note)),
            _ => None,
        });
    }

    async fn stream_snapshot(
        &mut self,
        b: &TalosEtcdBackup,
        m: &TalosMachine,
        key: &str,
    ) -> Result<Result<Stored, Failure>, Stop> {
        let entry = self.take("stream_snapshot", |e| match e {
            Entry::StreamSnapshot {
                backup,
                machine,
                key: k,
                ..
            } => differs("snapshot of", backup, &backup_key(b))
                .or_else(|| differs("node snapshotted", machine, &m.name().to_string()))
                .or_else(|| differs("snapshot's key", k, &key.to_string())),
            _ => None,
        })?;
        match entry {
            Entry::StreamSnapshot { answer: Ok(a), .. } => Ok(a.clone()),
            _ => Err(Stop),
        }
    }

    async fn delete_object(
        &mut self,
        b: &TalosEtcdBackup,
        key: &str,
    ) -> Result<Result<(), Failure>, Stop> {
        let entry = self.take("delete_object", |e| match e {
            Entry::DeleteObject { backup, key: k, .. } => {
                differs("deletion from the store of", backup, &backup_key(b))
                    .or_else(|| differs("object deleted", k, &key.to_string()))
            }
            _ => None,
        })?;
        match entry {
            Entry::DeleteObject { answer: Ok(a), .. } => Ok(a.clone()),
            _ => Err(Stop),
        }
    }
}

impl ApplyWorld for Replay<'_> {
    async fn base(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> Result<Result<Arc<Base>, BaseError>, Stop> {
        let asked = format!("{namespace}/{name}");
        let entry = self.take("base", |e| match e {
            Entry::Base { secret, .. } => differs("base Secret read", secret, &asked),
            _ => None,
        })?;
        // The log keeps the base's digest only: the replay renders nothing from it (the
        // render's answer is recorded too).
        match entry {
            Entry::Base { answer: Ok(a), .. } => Ok(a.clone().map(|digest| {
                Arc::new(Base {
                    controlplane: Vec::new(),
                    worker: Vec::new(),
                    digest,
                })
            })),
            _ => Err(Stop),
        }
    }

    async fn patches(
        &mut self,
        cluster: &TalosCluster,
    ) -> Result<Result<Vec<TalosConfigPatch>, String>, Stop> {
        let asked = format!("{}/{}", cluster.namespace(), cluster.name());
        let entry = self.take("patches", |e| match e {
            Entry::Patches { cluster: c, .. } => differs("patches of", c, &asked),
            _ => None,
        })?;
        match entry {
            Entry::Patches { answer: Ok(a), .. } => Ok(a.clone()),
            _ => Err(Stop),
        }
    }

    fn render(
        &mut self,
        _base: &Base,
        m: &TalosMachine,
        patches: &[&TalosConfigPatch],
    ) -> Result<Rendered, String> {
        let names: Vec<String> = patches.iter().map(|p| p.name().to_string()).collect();
        match self.take("render", |e| match e {
            Entry::Render {
                machine,
                patches: p,
                ..
            } => differs("machine rendered", machine, &key(m))
                .or_else(|| differs("patches rendered", p, &names)),
            _ => None,
        }) {
            Ok(Entry::Render { answer, .. }) => answer.clone().map(|sha256| Rendered {
                text: String::new(),
                sha256,
            }),
            _ => Err("the step log ends here".into()),
        }
    }

    async fn apply_configuration(
        &mut self,
        m: &TalosMachine,
        api: TalosApi,
        config: &Rendered,
        mode: ApplyMode,
        dry_run: bool,
    ) -> Result<Result<Applied, ApplyError>, Stop> {
        let entry = self.take("apply_configuration", |e| match e {
            Entry::ApplyConfiguration {
                machine,
                api: a,
                sha256,
                mode: md,
                dry_run: d,
                ..
            } => differs("configuration applied to", machine, &key(m))
                .or_else(|| differs("Talos API", a, &api))
                .or_else(|| differs("configuration's sha256", sha256, &config.sha256))
                .or_else(|| differs("apply mode", md, &mode))
                .or_else(|| differs("dry run", d, &dry_run)),
            _ => None,
        })?;
        match entry {
            Entry::ApplyConfiguration { answer: Ok(a), .. } => Ok(a.clone()),
            _ => Err(Stop),
        }
    }
}

impl BootstrapWorld for Replay<'_> {
    async fn record_bootstrap(
        &mut self,
        cluster: &TalosCluster,
        record: Option<&BootstrapRecord>,
        guard: bool,
    ) -> Result<bool, Stop> {
        let entry = self.take("record_bootstrap", |e| match e {
            Entry::RecordBootstrap {
                cluster: c,
                record: r,
                guard: g,
                ..
            } => differs("bootstrap record of", c, &cluster_key(cluster))
                .or_else(|| {
                    // As written (a time in whole seconds, as the API server keeps it).
                    let as_written = |r: Option<&BootstrapRecord>| serde_json::to_value(r).ok();
                    differs(
                        "bootstrap record",
                        &as_written(r.as_ref()),
                        &as_written(record),
                    )
                })
                .or_else(|| differs("record's guard", g, &guard)),
            _ => None,
        })?;
        match entry {
            Entry::RecordBootstrap { answer: Ok(a), .. } => Ok(*a),
            _ => Err(Stop),
        }
    }

    async fn cluster_event(
        &mut self,
        on: &TalosCluster,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let _ = self.take("cluster_event", |e| match e {
            Entry::ClusterEvent {
                cluster,
                warning: w,
                reason: r,
                note: n,
            } => differs("event on", cluster, &cluster_key(on))
                .or_else(|| differs("event's warning", w, &warning))
                .or_else(|| differs("event's reason", r, &reason.to_string()))
                .or_else(|| differs("event's note", n, &note)),
            _ => None,
        });
    }
}

/// What [`check`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Reconciles replayed to their end.
    pub reconciles: usize,
    /// Reconciles whose log ends early (a controller stopped there).
    pub cut: usize,
    /// Lines replayed.
    pub lines: usize,
}

/// Why a log is not a behaviour of the model, or cannot be checked.
#[derive(Debug, PartialEq, Eq)]
pub enum NotABehaviour {
    /// The log cannot be read: bad input (line and why).
    Unreadable(String),
    /// The executor, given what the world answered, does otherwise: the reconcile, its
    /// object and the first difference.
    Differs(String),
}

/// Checks a step log against the executor with `table` ([`Replay`]).
pub fn check(table: &crate::compile::Table, text: &str) -> Result<Checked, NotABehaviour> {
    let mut order: Vec<u64> = Vec::new();
    let mut by: std::collections::HashMap<u64, Vec<(usize, Entry)>> = Default::default();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(raw).map_err(|e| {
            NotABehaviour::Unreadable(format!(
                "line {n} is not a step-log line ({e}); a step log is what `serve --step-log` writes"
            ))
        })?;
        let list = by.entry(line.reconcile).or_insert_with(|| {
            order.push(line.reconcile);
            Vec::new()
        });
        list.push((n, line.entry));
    }
    if order.is_empty() {
        return Err(NotABehaviour::Unreadable(
            "the step log has no line; give the file `serve --step-log` wrote".into(),
        ));
    }
    let mut checked = Checked::default();
    for id in order {
        let lines = by.remove(&id).unwrap_or_default();
        let Some((
            (
                first,
                Entry::Begin {
                    procedure,
                    object,
                    timing,
                },
            ),
            body,
        )) = lines.split_first()
        else {
            let at = lines.first().map_or(0, |(n, _)| *n);
            return Err(NotABehaviour::Unreadable(format!(
                "line {at}: reconcile {id} does not start with `begin` (the log was cut at its start?)"
            )));
        };
        let mut w = Replay::new(body);
        let timing = Timing::from(*timing);
        let unreadable = |kind: &str, e: serde_json::Error| {
            NotABehaviour::Unreadable(format!("line {first}: the object is not a {kind} ({e})"))
        };
        // The status a procedure leaves for its caller to write (`apply`), to compare with
        // the one recorded at the reconcile's end.
        let mut left: Option<Value> = None;
        let (outcome, who) = match procedure.as_str() {
            "removal" => {
                let object: TalosMachine = serde_json::from_value(object.clone())
                    .map_err(|e| unreadable("TalosMachine", e))?;
                let run = super::run_now(removal::reconcile(&mut w, table, &timing, &object));
                (run, format!("TalosMachine {}", key(&object)))
            }
            "operation" => {
                let object: TalosOperation = serde_json::from_value(object.clone())
                    .map_err(|e| unreadable("TalosOperation", e))?;
                let run = super::run_now(operation::reconcile(&mut w, table, &timing, &object));
                (run, format!("TalosOperation {}", op_key(&object)))
            }
            "backup" => {
                let begin: BackupBegin = serde_json::from_value(object.clone())
                    .map_err(|e| unreadable("TalosEtcdBackup with its operations", e))?;
                let t = BackupTiming {
                    retry: Duration::from_millis(begin.retry_ms),
                    recheck: Duration::from_millis(begin.recheck_ms),
                };
                let run = super::run_now(backup::reconcile(
                    &mut w,
                    table,
                    &t,
                    &begin.backup,
                    &begin.operations,
                ));
                (
                    run,
                    format!("TalosEtcdBackup {}", backup_key(&begin.backup)),
                )
            }
            "apply" => {
                let begin: ApplyBegin = serde_json::from_value(object.clone())
                    .map_err(|e| unreadable("TalosMachine with its cluster", e))?;
                let mut next = begin.next.clone();
                let run = super::run_now(apply::reconcile(
                    &mut w,
                    table,
                    &begin.snapshot,
                    begin.cluster.as_ref(),
                    &begin.machine,
                    &mut next,
                ));
                left = Some(serde_json::to_value(&next.status).unwrap_or(Value::Null));
                (run, format!("TalosMachine {}", key(&begin.machine)))
            }
            "bootstrap" => {
                let begin: BootstrapBegin = serde_json::from_value(object.clone())
                    .map_err(|e| unreadable("TalosMachine with its cluster's objects", e))?;
                let run = super::run_now(bootstrap::reconcile(
                    &mut w,
                    table,
                    &timing,
                    &begin.identity,
                    &begin.snapshot,
                    &begin.machine,
                ));
                (run, format!("TalosMachine {}", key(&begin.machine)))
            }
            other => {
                return Err(NotABehaviour::Unreadable(format!(
                    "line {first}: procedure `{other}` is not one this version replays \
                     (removal, operation, backup, apply, bootstrap)"
                )));
            }
        };
        let Some(outcome) = outcome else {
            return Err(NotABehaviour::Unreadable(format!(
                "line {first}: the replay of reconcile {id} did not finish"
            )));
        };
        let who = format!("reconcile {id} of {who} (line {first})");
        if let Some(d) = w.diverged.borrow().clone() {
            return Err(NotABehaviour::Differs(format!("{who}: {d}")));
        }
        checked.lines += body.len() - w.rest().len() + 1;
        if w.cut.get() {
            checked.cut += 1;
            continue;
        }
        let ended = outcome_text(&outcome);
        match w.rest() {
            [
                (
                    n,
                    Entry::End {
                        outcome: recorded,
                        status,
                    },
                ),
            ] => {
                if recorded != &ended {
                    return Err(NotABehaviour::Differs(format!(
                        "{who}: line {n}: the run ended `{recorded}`, where the executor ends `{ended}`"
                    )));
                }
                if let (Some(recorded), Some(left)) = (status, &left)
                    && recorded != left
                {
                    return Err(NotABehaviour::Differs(format!(
                        "{who}: line {n}: the run left the status {recorded}, where the executor \
                         leaves {left}"
                    )));
                }
                checked.lines += 1;
                checked.reconciles += 1;
            }
            [] => checked.cut += 1,
            [(n, e), ..] => {
                return Err(NotABehaviour::Differs(format!(
                    "{who}: line {n}: the run went on (`{}`) where the executor ended `{ended}`",
                    e.op()
                )));
            }
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A writer whose bytes the test reads.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("the buffer").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn lines(&self) -> Vec<Line> {
            let text =
                String::from_utf8(self.0.lock().expect("the buffer").clone()).expect("UTF-8");
            text.lines()
                .map(|l| serde_json::from_str(l).expect("a line"))
                .collect()
        }
    }

    fn timing() -> Timing {
        Timing {
            refused_requeue: Duration::from_millis(4),
            lock_retry: Duration::from_millis(1),
            drain_retry: Duration::from_millis(2),
            reset_settle: Duration::from_millis(3),
            sent_deadline: Duration::from_millis(3),
        }
    }

    /// A quiet reconcile of `key`: a probe answering `version`, at `at`, ending with
    /// `status`.
    fn quiet(log: &StepLog, key: &str, at: &str, version: &str, status: &str) -> u64 {
        let id = log.begin_repeatable("apply", key, &serde_json::json!({"m": key}), &timing());
        log.write(id, Entry::Now { at: at.into() });
        log.write(
            id,
            Entry::Decided {
                verdict: version.into(),
                rules: vec!["apply".into()],
            },
        );
        let done: Result<Outcome, ()> = Ok(Outcome::AwaitChange);
        log.end_with_status(id, &done, &serde_json::json!({ "s": status }));
        id
    }

    fn reconciles(lines: &[Line]) -> Vec<u64> {
        let mut ids: Vec<u64> = lines.iter().map(|l| l.reconcile).collect();
        ids.dedup();
        ids
    }

    #[test]
    fn a_quiet_repeat_is_counted_not_logged_and_anything_new_is_logged() {
        let out = Shared::default();
        let log = StepLog::new(Box::new(out.clone()));
        let first = quiet(&log, "ns/cp-1", "t1", "v1", "ok");
        // The same, asked at another time: a repeat.
        quiet(&log, "ns/cp-1", "t2", "v1", "ok");
        assert_eq!(log.repeats(), 1);
        assert_eq!(reconciles(&out.lines()), vec![first]);
        // Another machine's first is logged, whatever cp-1 did.
        let other = quiet(&log, "ns/cp-2", "t3", "v1", "ok");
        // A different answer, then a different status: logged, each.
        let answer = quiet(&log, "ns/cp-1", "t4", "v2", "ok");
        let status = quiet(&log, "ns/cp-1", "t5", "v2", "changed");
        assert_eq!(reconciles(&out.lines()), vec![first, other, answer, status]);
        // Whole reconciles, begin to end, in order.
        let lines = out.lines();
        assert!(matches!(lines[0].entry, Entry::Begin { .. }));
        assert!(matches!(lines[3].entry, Entry::End { .. }));
        assert_eq!(log.repeats(), 1);
    }

    #[test]
    fn a_reconcile_that_acts_is_written_at_once_and_the_next_quiet_one_too() {
        let out = Shared::default();
        let log = StepLog::new(Box::new(out.clone()));
        let first = quiet(&log, "ns/cp-1", "t1", "v1", "ok");
        let id = log.begin_repeatable("apply", "ns/cp-1", &serde_json::json!({}), &timing());
        log.write(id, Entry::Now { at: "t2".into() });
        assert_eq!(
            reconciles(&out.lines()),
            vec![first],
            "held while it only reads"
        );
        log.write(
            id,
            Entry::Talos {
                cluster: "ns/c".into(),
                node: NodeRec::Endpoint {
                    machine: "ns/cp-1".into(),
                },
                call: Call::Reboot,
                answer: Err("lost".into()),
            },
        );
        // Written before its end: a controller killed now leaves the call in the log.
        let lines = out.lines();
        assert_eq!(reconciles(&lines), vec![first, id]);
        assert!(matches!(
            lines.last().map(|l| &l.entry),
            Some(Entry::Talos { .. })
        ));
        log.write(id, Entry::Now { at: "t3".into() });
        assert_eq!(out.lines().len(), lines.len() + 1, "then written through");
        let done: Result<Outcome, ()> = Ok(Outcome::AwaitChange);
        log.end(id, &done);
        // The same quiet reconcile as the first is logged again after one that acted.
        let again = quiet(&log, "ns/cp-1", "t4", "v1", "ok");
        assert_eq!(reconciles(&out.lines()), vec![first, id, again]);
        assert_eq!(log.repeats(), 0);
    }

    #[test]
    fn reads_only_calls_are_exactly_the_ones_that_change_nothing() {
        for call in [
            Call::Version,
            Call::EtcdMemberList,
            Call::EtcdStatus,
            Call::SystemStat,
            Call::List {
                root: "/var/lib/etcd".into(),
            },
        ] {
            assert!(call.reads_only(), "{call:?}");
        }
        for call in [
            Call::EtcdForfeitLeadership,
            Call::EtcdLeaveCluster,
            Call::EtcdRemoveMemberById(1),
            Call::Reset { graceful: true },
            Call::Reboot,
            Call::Shutdown { force: false },
            Call::UpgradeLegacy { image: "i".into() },
            Call::Rollback,
            Call::ImagePull { image: "i".into() },
            Call::LifecycleUpgrade {
                image_name: "i".into(),
            },
            Call::Bootstrap,
        ] {
            assert!(!call.reads_only(), "{call:?}");
        }
    }
}
