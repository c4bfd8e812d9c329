//! Taking a TalosEtcdBackup's snapshot (issue 36), as one procedure over a
//! [`BackupWorld`]: the controller runs it with real I/O (Talos, the S3 store, the API
//! server); a model can run it with its own world.
//!
//! One reconcile of a backup whose spec is sound (1, 1b and 2 always; 3 and 4 are the step
//! `etcd snapshot`, 5 the step `snapshots prune` of the rules' `plan snapshot backup`, run
//! in its order after the `snapshot backup` rules; rules without that plan take nothing,
//! and the condition says so):
//!
//! 1. A snapshot recorded as in progress (`status.inProgress`, written before the first
//!    byte is streamed) means the controller stopped mid-snapshot: whatever is under its
//!    key is deleted and it is never counted; a new one is due at once.
//! 2. Is one due? An on-demand request (the annotation `ichor.maesh.dev/snapshot-now` with
//!    a value not served yet, or a running `etcd-snapshot` TalosOperation naming this
//!    backup), else the schedule (an interval or a cron expression, counted from the last
//!    attempt; a failed attempt is retried sooner). Not due: look again when it is.
//! 3. A healthy control plane, asked (not assumed): the first approved control plane, by
//!    name, whose etcd member answers `EtcdStatus` with a leader, no errors and not as a
//!    learner; a follower before the leader, so the leader is not loaded.
//! 4. `status.inProgress` written, then the snapshot streamed into the store (multipart,
//!    never whole in memory), checked by its trailing sha256 and the stored size. Verified,
//!    it is recorded (time, key, size, etcd revision read from the snapshot itself, sha256,
//!    raft index, node) and becomes the last good
//!    one; failed, it is deleted and reported, and the last good one stays what it was.
//! 5. Retention deletes the snapshots past `keepLast` and older than `maxAge` (with both:
//!    those neither among the last `keepLast` nor newer than `maxAge`), only among the
//!    ones this backup recorded, never the newest. Their records move from
//!    `status.snapshots` to `status.pruning` and that is written before the first deletion;
//!    a key leaves `pruning` once the store deleted it. Keys still there (a crash, a
//!    refused deletion) are deleted first by every later reconcile, before anything else.

use super::{Node, Outcome, Wait, World, calls, rules};
use crate::compile::Table;
use crate::runtime::controller::status::{self, Conditions};
use crate::runtime::decide::snapshot_event;
use crate::runtime::live::Reads;
use crate::runtime::objects::{
    Every, RetentionSpec, Role, SNAPSHOT_NOW_ANNOTATION, Snapshot, SnapshotInProgress,
    SnapshotRecord, TalosEtcdBackup, TalosMachine, TalosOperation, parse_duration,
};
use crate::vocab::{Action, Subject, Verb};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

/// The condition a backup reports its last snapshot in: True (reason `Verified`) when the
/// last one was taken and verified, False with why when it failed.
pub const SNAPSHOT: &str = "Snapshot";

/// The failures that mean the store could not be written at all (nothing is under the key).
const STORE_UNUSABLE: &[&str] = &[
    "StoreUnreachable",
    "StoreKeysRefused",
    "StoreKeysMissing",
    "BucketNotFound",
    "InvalidSpec",
    "EncryptionKeyMissing",
    "EncryptionKeyInvalid",
];

/// The operation kind that asks a backup for a snapshot now.
pub const SNAPSHOT_KIND: &str = "etcd-snapshot";

/// A snapshot stored whole and verified.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stored {
    /// Bytes in the store.
    pub size: u64,
    /// The sha256 of the etcd database (the snapshot's own trailing hash), hex.
    pub sha256: String,
    /// Encrypted in the store.
    pub encrypted: bool,
    /// The etcd revision read from the snapshot, or why it could not be.
    pub revision: Result<i64, String>,
}

/// Why something asked of the store (or of the node streaming) failed: a condition's
/// reason and message. Never carries an access key.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failure {
    pub reason: String,
    pub message: String,
}

/// What a backup's snapshot needs of the world beyond Talos calls and reads.
#[allow(async_fn_in_trait)]
pub trait BackupWorld: World {
    /// Writes `after`'s status when it differs from `before` (the object as read, or as
    /// this world last wrote it).
    async fn write_backup(
        &mut self,
        before: &TalosEtcdBackup,
        after: &TalosEtcdBackup,
    ) -> Result<(), Self::Error>;

    /// Publishes an Event on the backup.
    async fn backup_event(
        &mut self,
        on: &TalosEtcdBackup,
        warning: bool,
        reason: &str,
        note: String,
    );

    /// Streams the etcd snapshot of `m`'s node into `b`'s store as object `key`: multipart,
    /// never whole in memory, checked on the way (its trailing sha256) and by the stored
    /// size, encrypted when `b` says so. Whatever fails, nothing is left under `key`.
    async fn stream_snapshot(
        &mut self,
        b: &TalosEtcdBackup,
        m: &TalosMachine,
        key: &str,
    ) -> Result<Result<Stored, Failure>, Self::Error>;

    /// Deletes object `key` of `b`'s store (one that is not there is no error).
    async fn delete_object(
        &mut self,
        b: &TalosEtcdBackup,
        key: &str,
    ) -> Result<Result<(), Failure>, Self::Error>;

    /// A snapshot ended, verified (`Ok`: its record) or not (`Err`: its reason), after
    /// `took` (metrics; a model has none).
    fn snapshot_ended(
        &mut self,
        b: &TalosEtcdBackup,
        result: Result<&SnapshotRecord, &str>,
        took: Duration,
    ) {
        let _ = (b, result, took);
    }
}

/// The intervals of a backup's reconcile.
#[derive(Clone, Copy, Debug)]
pub struct BackupTiming {
    /// A failed snapshot is tried again after this (or at its next scheduled time, when
    /// sooner).
    pub retry: Duration,
    /// The longest a backup goes unlooked at.
    pub recheck: Duration,
}

/// Why a snapshot is taken now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// Its schedule says so.
    Scheduled,
    /// Asked for: the annotation's value, or `TalosOperation <name>`.
    Requested(String),
}

/// The on-demand request of `b` not served yet: the annotation
/// `ichor.maesh.dev/snapshot-now` with a new value, else the oldest running `etcd-snapshot`
/// operation among `operations` naming `b` (its token [`operation_token`]).
pub fn requested(b: &TalosEtcdBackup, operations: &[TalosOperation]) -> Option<String> {
    let served = b.status.as_ref().and_then(|s| s.last_request.as_deref());
    let annotation = b
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SNAPSHOT_NOW_ANNOTATION))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty() && Some(v.as_str()) != served);
    if annotation.is_some() {
        return annotation;
    }
    let mut ops: Vec<&TalosOperation> = operations
        .iter()
        .filter(|o| {
            o.namespace() == b.namespace()
                && o.spec.kind == SNAPSHOT_KIND
                && o.backup_name() == b.name()
                && o.cluster() == b.cluster()
                && o.phase() == "Running"
        })
        .collect();
    ops.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .cmp(&b.metadata.creation_timestamp)
            .then_with(|| a.name().cmp(b.name()))
    });
    ops.into_iter()
        .map(operation_token)
        .find(|t| Some(t.as_str()) != served)
}

/// How an `etcd-snapshot` operation's request is named in the backup's status
/// (`lastRequest`, and `request` of the snapshot it got): its name and uid.
pub fn operation_token(o: &TalosOperation) -> String {
    format!(
        "TalosOperation {} ({})",
        o.name(),
        o.metadata.uid.as_deref().unwrap_or("")
    )
}

/// When the next scheduled snapshot of `b` is due: at once when none was ever attempted;
/// else the schedule's next time after the last attempt, or sooner (`retry` after it) when
/// the last attempt failed.
pub fn next_due(b: &TalosEtcdBackup, every: &Every, retry: Duration) -> Option<Timestamp> {
    let Some(last) = b.status.as_ref().and_then(|s| s.last_attempt.as_ref()) else {
        return Some(Timestamp::UNIX_EPOCH);
    };
    let scheduled = every.next_after(last.0);
    let failed = b.condition(SNAPSHOT).is_some_and(|c| c.status == "False");
    let retry_at = failed.then(|| last.0.checked_add(retry).ok()).flatten();
    match (scheduled, retry_at) {
        (Some(s), Some(r)) => Some(s.min(r)),
        (s, r) => s.or(r),
    }
}

/// The keys retention deletes from `kept` (oldest first) at `now`: past the newest
/// `keepLast`, and older than `maxAge`; with both, only those that are neither. The newest
/// is always kept (a backup is never left with none by retention).
pub fn expired(kept: &[SnapshotRecord], retention: &RetentionSpec, now: Timestamp) -> Vec<String> {
    let n = kept.len();
    let max_age = retention
        .max_age
        .as_deref()
        .and_then(|a| parse_duration(a).ok());
    if retention.keep_last.is_none() && max_age.is_none() {
        return Vec::new();
    }
    kept.iter()
        .enumerate()
        .filter(|(i, r)| {
            let from_newest = n - 1 - i;
            if from_newest == 0 {
                return false;
            }
            let among_last = retention
                .keep_last
                .is_some_and(|k| from_newest < k as usize);
            let young = max_age.is_some_and(|a| {
                let age = now.duration_since(r.time.0).as_secs();
                u64::try_from(age).unwrap_or(0) < a.as_secs()
            });
            match (retention.keep_last.is_some(), max_age.is_some()) {
                (true, true) => !among_last && !young,
                (true, false) => !among_last,
                _ => !young,
            }
        })
        .map(|(_, r)| r.key.clone())
        .collect()
}

/// The object key of a snapshot of `b` begun at `at`: under the store's prefix, named by
/// the backup and the time (`<prefix><backup>-20261205T073000Z.snapshot`).
pub fn snapshot_key(b: &TalosEtcdBackup, at: Timestamp) -> String {
    let stamp = at.strftime("%Y%m%dT%H%M%SZ").to_string();
    let prefix = b.spec.store.prefix.as_deref().unwrap_or("");
    format!("{prefix}{}-{stamp}.snapshot", b.name())
}

fn set(w: &impl World, b: &mut TalosEtcdBackup, ok: bool, reason: &str, message: &str) -> bool {
    status::set_at(w.now(), b.conditions_mut(), SNAPSHOT, ok, reason, message)
}

fn st(b: &mut TalosEtcdBackup) -> &mut crate::runtime::objects::BackupStatus {
    b.status.get_or_insert_with(Default::default)
}

fn requeue(after: Duration, wait: &str) -> Outcome {
    Outcome::Requeue {
        after,
        wait: Wait::On(wait.into()),
    }
}

/// One reconcile of backup `b` (as read live; its spec sound, its cluster there), with the
/// cluster's operations (for `etcd-snapshot` requests): what was left unfinished first
/// (an interrupted snapshot, deletions retention recorded), then, when a snapshot is due,
/// the `snapshot backup` rules and the steps of the rules' `plan snapshot backup`, in order.
pub async fn reconcile<W: BackupWorld>(
    w: &mut W,
    table: &Table,
    timing: &BackupTiming,
    b: &TalosEtcdBackup,
    operations: &[TalosOperation],
) -> Result<Outcome, W::Error> {
    let Ok(every) = Every::of(&b.spec.schedule) else {
        return Ok(Outcome::AwaitChange);
    };
    let cluster = b.cluster();
    let mut before = b.clone();
    let mut next = b.clone();
    // 1. A snapshot the controller stopped in the middle of: never counted.
    let mut interrupted = false;
    if let Some(p) = b.status.as_ref().and_then(|s| s.in_progress.clone()) {
        match w.delete_object(b, &p.key).await? {
            Ok(()) => {
                st(&mut next).in_progress = None;
                let msg = format!(
                    "the snapshot {} from {} begun at {} was interrupted (the controller stopped \
                     mid-snapshot): whatever was stored under its key was deleted, and it is not \
                     counted; a new one is taken now",
                    p.key, p.node, p.started.0
                );
                w.write_backup(&before, &next).await?;
                w.backup_event(&next, true, "SnapshotInterrupted", msg)
                    .await;
                before = next.clone();
                interrupted = true;
            }
            Err(f) => {
                let msg = format!(
                    "the interrupted snapshot {} could not be deleted from the store ({}); it is \
                     not counted, and no new snapshot is taken until it is gone",
                    p.key, f.message
                );
                set(w, &mut next, false, &f.reason, &msg);
                w.write_backup(&before, &next).await?;
                return Ok(requeue(timing.retry, &f.reason));
            }
        }
    }
    // 1b. Deletions retention recorded and did not finish: made before anything else.
    if !pruning(&next).is_empty() {
        finish_pruning(w, b, &before, &mut next).await?;
        before = next.clone();
    }
    // The rules' procedure: without one, nothing is taken (and nothing guessed).
    let Some(plan) = table.plan(Verb::Snapshot, Subject::Backup) else {
        let msg = "the rules have no `plan snapshot backup`; no snapshot is taken until they do";
        if set(w, &mut next, false, "NoPlan", msg) {
            w.write_backup(&before, &next).await?;
            w.backup_event(&next, true, "NoPlan", msg.into()).await;
        }
        return Ok(requeue(timing.retry, "NoPlan"));
    };
    // 2. Due?
    let now = w.now();
    let why = match requested(&next, operations) {
        Some(r) => Why::Requested(r),
        None if interrupted => Why::Scheduled,
        None => {
            let due = next_due(&next, &every, timing.retry);
            match due {
                Some(t) if t <= now => Why::Scheduled,
                Some(t) => {
                    let secs = t.duration_since(now).as_secs();
                    let wait = Duration::from_secs(u64::try_from(secs).unwrap_or(0).max(1));
                    return Ok(requeue(wait.min(recheck(timing, &next)), "NotDue"));
                }
                None if pruning(&next).is_empty() => return Ok(Outcome::AwaitChange),
                None => return Ok(requeue(timing.retry, "PruneFailed")),
            }
        }
    };
    let request = match &why {
        Why::Requested(r) => Some(r.clone()),
        Why::Scheduled => None,
    };
    // Counted as an attempt, and the request as served, whatever comes of it.
    st(&mut next).last_attempt = Some(Time(now));
    if let Some(r) = &request {
        st(&mut next).last_request = Some(r.clone());
    }
    let asked = match &request {
        Some(r) => format!(" (asked for by {r})"),
        None => String::new(),
    };
    if let Err(why) = w.credentials(cluster).await {
        let msg = format!("no snapshot was taken{asked}: {why}");
        return failed(w, timing, &before, &mut next, "NoTalosCredentials", msg).await;
    }
    let snapshot = w
        .read(
            cluster,
            Reads {
                machines: true,
                clusters: true,
                operations: false,
                backups: false,
            },
        )
        .await?;
    // The `snapshot backup` rules, from live reads.
    let decision = w.decide(table, &snapshot, snapshot_event(&next), &[]);
    let held = match &decision {
        Ok(d) => rules::hold_of(d, "SnapshotRefused"),
        Err(f) => Some((
            "SnapshotRefused".into(),
            format!("the fact `{f}` could not be read"),
        )),
    };
    if let Some((reason, message)) = held {
        let msg = format!("no snapshot was taken{asked}: {message}");
        return failed(w, timing, &before, &mut next, &reason, msg).await;
    }
    // 3. The plan's steps, in order, each when its guards say so.
    let taking = Taking {
        asked: &asked,
        request: &request,
        now,
        snapshot: &snapshot,
    };
    for (k, step) in plan.steps.iter().enumerate() {
        let (runs, _) = match w.applies(table, &snapshot, snapshot_event(&next), &[], k, step) {
            Ok(x) => x,
            Err(why) => {
                let msg = format!("the snapshot plan stopped{asked}: {why}");
                return failed(w, timing, &before, &mut next, "StepRefused", msg).await;
            }
        };
        if !runs {
            continue;
        }
        match step.action {
            Action::EtcdSnapshot => {
                if let Some(out) = take(w, timing, b, &mut before, &mut next, &taking).await? {
                    return Ok(out);
                }
            }
            Action::SnapshotsPrune => {
                prune(w, b, &before, &mut next).await?;
                before = next.clone();
            }
            // Another procedure's steps: the checker refuses them in this plan
            // (`ichor::check::action_not_in_plan`), so only a table built past it gets here.
            Action::LockCluster
            | Action::DrainNode
            | Action::EtcdForfeitLeadership
            | Action::EtcdLeave
            | Action::EtcdRemoveMember
            | Action::TalosReset
            | Action::TalosWipe
            | Action::EventWarning
            | Action::EventNormal
            | Action::ReleaseFinalizer
            | Action::EtcdHealthy
            | Action::CordonNode
            | Action::UncordonNode
            | Action::TalosReboot
            | Action::TalosShutdown
            | Action::TalosUpgrade
            | Action::TalosRollback
            | Action::WaitNodeBack
            | Action::TalosInstall
            | Action::ConfigRender
            | Action::TalosDryRun
            | Action::TalosApplyConfig
            | Action::TalosBootstrap => {
                let msg = format!(
                    "the snapshot plan stopped{asked}: `{}` is not a step of a backup's \
                     snapshot; remove it from `plan snapshot backup`",
                    step.text
                );
                return failed(w, timing, &before, &mut next, "NotABackupStep", msg).await;
            }
        }
    }
    // The attempt recorded, whatever the plan did.
    if next != before {
        w.write_backup(&before, &next).await?;
    }
    let after = match next_due(&next, &every, timing.retry) {
        Some(t) => {
            let secs = t.duration_since(w.now()).as_secs();
            Duration::from_secs(u64::try_from(secs).unwrap_or(0).max(1))
        }
        None => timing.recheck,
    };
    Ok(requeue(after.min(recheck(timing, &next)), "NotDue"))
}

/// What the `etcd snapshot` step needs of its reconcile.
struct Taking<'a> {
    /// ` (asked for by ...)`, or nothing for a scheduled one.
    asked: &'a str,
    request: &'a Option<String>,
    /// When the reconcile began: the snapshot's time and key.
    now: Timestamp,
    snapshot: &'a Snapshot,
}

/// The `etcd snapshot` step: a healthy control plane, asked; the snapshot recorded as in
/// progress, streamed, verified and recorded. `Some`: it failed (reported, not counted) and
/// the plan stops with this outcome.
async fn take<W: BackupWorld>(
    w: &mut W,
    timing: &BackupTiming,
    b: &TalosEtcdBackup,
    before: &mut TalosEtcdBackup,
    next: &mut TalosEtcdBackup,
    t: &Taking<'_>,
) -> Result<Option<Outcome>, W::Error> {
    let (cluster, asked, now) = (b.cluster(), t.asked, t.now);
    let mut planes: Vec<&TalosMachine> = t
        .snapshot
        .machines
        .iter()
        .filter(|m| {
            m.namespace() == b.namespace()
                && m.cluster() == cluster
                && !m.deleting()
                && m.approved_role() == Some(Role::ControlPlane)
        })
        .collect();
    planes.sort_by(|a, b| a.name().cmp(b.name()));
    let mut healthy: Vec<(&TalosMachine, crate::runtime::talos::EtcdStatus)> = Vec::new();
    let mut unhealthy = Vec::new();
    for m in planes {
        match calls::status(w, cluster, Node::Endpoint(m)).await? {
            Ok(s) if s.leader == 0 => {
                unhealthy.push(format!("{}: its etcd sees no leader", m.name()))
            }
            Ok(s) if s.is_learner => {
                unhealthy.push(format!("{}: its etcd member is a learner", m.name()))
            }
            Ok(s) if !s.errors.is_empty() => unhealthy.push(format!(
                "{}: its etcd member reports {}",
                m.name(),
                s.errors.join("; ")
            )),
            Ok(s) => healthy.push((m, s)),
            Err(e) => unhealthy.push(format!("{}: {e}", m.name())),
        }
    }
    // A follower before the leader: the snapshot does not load the leader.
    healthy.sort_by_key(|(_, s)| s.is_leader());
    let Some((node, etcd)) = healthy.first() else {
        if unhealthy.is_empty() {
            unhealthy.push(format!(
                "TalosCluster {cluster} has no approved control plane"
            ));
        }
        let msg = format!(
            "no snapshot was taken{asked}: no control plane has a healthy etcd member to take it \
             from ({})",
            unhealthy.join("; ")
        );
        return failed(w, timing, before, next, "NoHealthyMember", msg)
            .await
            .map(Some);
    };
    // Recorded as in progress, then streamed, verified, recorded.
    let mut key = snapshot_key(b, now);
    let taken = next
        .status
        .as_ref()
        .map(|s| s.snapshots.as_slice())
        .unwrap_or(&[]);
    if taken.iter().any(|r| r.key == key) {
        key = key.replace(".snapshot", "-2.snapshot");
    }
    let node_name = super::etcd::node_name(node).to_string();
    st(next).in_progress = Some(SnapshotInProgress {
        key: key.clone(),
        node: node_name.clone(),
        started: Time(now),
    });
    w.write_backup(before, next).await?;
    *before = next.clone();
    let stored = w.stream_snapshot(b, node, &key).await?;
    let took = {
        let secs = w.now().duration_since(now).as_secs_f64();
        Duration::from_secs_f64(secs.max(0.0))
    };
    st(next).in_progress = None;
    let stored = match stored {
        Ok(s) => s,
        Err(f) => {
            // The world leaves nothing under the key; asked again to be sure, unless the
            // store could not be written at all (then nothing was: an unfinished multipart
            // upload is no object).
            let cleaned = if STORE_UNUSABLE.contains(&f.reason.as_str()) {
                "nothing of it is in the store".to_string()
            } else {
                match w.delete_object(b, &key).await? {
                    Ok(()) => "it was deleted from the store".to_string(),
                    Err(e) => format!("deleting it from the store failed too ({})", e.message),
                }
            };
            let last = match next.status.as_ref().and_then(|s| s.last_snapshot.as_ref()) {
                Some(l) => format!("the last good snapshot is still {} ({})", l.key, l.time.0),
                None => "there is no good snapshot yet".to_string(),
            };
            let msg = format!(
                "the snapshot {key} from {node_name}{asked} failed: {}; {cleaned}, it is not \
                 counted, and {last}",
                f.message
            );
            w.snapshot_ended(b, Err(&f.reason), took);
            return failed(w, timing, before, next, &f.reason, msg)
                .await
                .map(Some);
        }
    };
    let record = SnapshotRecord {
        time: Time(now),
        key: key.clone(),
        size: stored.size,
        revision: stored.revision.clone().ok(),
        revision_unread: stored.revision.clone().err(),
        sha256: stored.sha256.clone(),
        node: node_name.clone(),
        raft_index: Some(etcd.raft_applied_index),
        encrypted: stored.encrypted,
        request: t.request.clone(),
    };
    {
        let s = st(next);
        s.snapshots.push(record.clone());
        s.last_snapshot = Some(record.clone());
    }
    let revision = match &stored.revision {
        Ok(r) => format!("etcd revision {r}"),
        Err(why) => format!("etcd revision not read ({why})"),
    };
    let msg = format!(
        "snapshot {key} taken from {node_name}{asked} and verified: {} bytes, {revision}, sha256 {}{}, in {:.1}s",
        stored.size,
        stored.sha256,
        if stored.encrypted { ", encrypted" } else { "" },
        took.as_secs_f64()
    );
    set(w, next, true, "Verified", &msg);
    w.snapshot_ended(b, Ok(&record), took);
    w.write_backup(before, next).await?;
    w.backup_event(next, false, "SnapshotTaken", msg).await;
    *before = next.clone();
    Ok(None)
}

/// How long until the next look at most: sooner while deletions are left to retry.
fn recheck(timing: &BackupTiming, b: &TalosEtcdBackup) -> Duration {
    if pruning(b).is_empty() {
        timing.recheck
    } else {
        timing.retry.min(timing.recheck)
    }
}

/// Deletes what retention says of this backup's recorded snapshots; a deletion that fails
/// keeps its record (tried again after the next snapshot) and says so.
async fn prune<W: BackupWorld>(
    w: &mut W,
    b: &TalosEtcdBackup,
    before: &TalosEtcdBackup,
    next: &mut TalosEtcdBackup,
) -> Result<(), W::Error> {
    let Some(retention) = &b.spec.retention else {
        return Ok(());
    };
    let kept = next
        .status
        .as_ref()
        .map(|s| s.snapshots.clone())
        .unwrap_or_default();
    let expired = expired(&kept, retention, w.now());
    if expired.is_empty() {
        return Ok(());
    }
    // Recorded first: no longer counted, and not forgotten if the controller stops.
    {
        let s = st(next);
        s.snapshots.retain(|r| !expired.contains(&r.key));
        for key in expired {
            if !s.pruning.contains(&key) {
                s.pruning.push(key);
            }
        }
    }
    w.write_backup(before, next).await?;
    let before = next.clone();
    finish_pruning(w, b, &before, next).await
}

fn pruning(b: &TalosEtcdBackup) -> &[String] {
    b.status
        .as_ref()
        .map(|s| s.pruning.as_slice())
        .unwrap_or(&[])
}

/// Deletes the keys `status.pruning` records; each one the store deleted leaves the list,
/// a refused one stays (tried again by the next reconcile) and is reported.
async fn finish_pruning<W: BackupWorld>(
    w: &mut W,
    b: &TalosEtcdBackup,
    before: &TalosEtcdBackup,
    next: &mut TalosEtcdBackup,
) -> Result<(), W::Error> {
    let mut gone = Vec::new();
    let mut stuck = Vec::new();
    for key in pruning(next).to_vec() {
        match w.delete_object(b, &key).await? {
            Ok(()) => gone.push(key),
            Err(f) => stuck.push(format!("{key}: {}", f.message)),
        }
    }
    st(next).pruning.retain(|k| !gone.contains(k));
    if !gone.is_empty() {
        w.write_backup(before, next).await?;
    }
    if !gone.is_empty() {
        let msg = format!(
            "retention deleted {} snapshot(s) this backup wrote: {}",
            gone.len(),
            gone.join(", ")
        );
        w.backup_event(next, false, "SnapshotsPruned", msg).await;
    }
    if !stuck.is_empty() {
        let msg = format!(
            "retention could not delete {} snapshot(s), no longer counted and deleted by the \
             next reconcile: {}",
            stuck.len(),
            stuck.join("; ")
        );
        w.backup_event(next, true, "PruneFailed", msg).await;
    }
    Ok(())
}

/// A snapshot not taken (or not verified): the condition says why, a Warning event, and
/// the next try after `timing.retry`.
async fn failed<W: BackupWorld>(
    w: &mut W,
    timing: &BackupTiming,
    before: &TalosEtcdBackup,
    next: &mut TalosEtcdBackup,
    reason: &str,
    message: String,
) -> Result<Outcome, W::Error> {
    st(next).in_progress = None;
    set(w, next, false, reason, &message);
    w.write_backup(before, next).await?;
    w.backup_event(next, true, "SnapshotFailed", message).await;
    Ok(requeue(timing.retry, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, at: &str) -> SnapshotRecord {
        SnapshotRecord {
            time: Time(at.parse().unwrap()),
            key: key.into(),
            size: 1,
            revision: None,
            revision_unread: None,
            sha256: String::new(),
            node: String::new(),
            raft_index: None,
            encrypted: false,
            request: None,
        }
    }

    #[test]
    fn retention_keeps_the_last_n_and_the_young_and_always_the_newest() {
        let kept = [
            record("a", "2026-12-01T00:00:00Z"),
            record("b", "2026-12-03T00:00:00Z"),
            record("c", "2026-12-04T00:00:00Z"),
            record("d", "2026-12-05T00:00:00Z"),
        ];
        let now: Timestamp = "2026-12-05T01:00:00Z".parse().unwrap();
        let r = |keep_last: Option<u32>, max_age: Option<&str>| RetentionSpec {
            keep_last,
            max_age: max_age.map(str::to_string),
        };
        assert_eq!(expired(&kept, &r(Some(2), None), now), ["a", "b"]);
        assert_eq!(expired(&kept, &r(None, Some("2d")), now), ["a", "b"]);
        assert_eq!(expired(&kept, &r(None, Some("3d")), now), ["a"]);
        // Both: a snapshot goes once it is neither among the last 1 nor younger than 3d.
        assert_eq!(expired(&kept, &r(Some(1), Some("3d")), now), ["a"]);
        assert_eq!(expired(&kept, &r(Some(3), Some("1h")), now), ["a"]);
        // The newest stays, however old.
        assert_eq!(expired(&kept, &r(None, Some("1m")), now), ["a", "b", "c"]);
        assert!(expired(&kept, &r(None, None), now).is_empty());
        assert!(expired(&[], &r(Some(1), None), now).is_empty());
    }
}
