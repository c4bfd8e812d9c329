//! A backup in flight, explored (issue 36): the product's own snapshot procedure
//! (`exec::backup::reconcile`, the one the controller runs) in a model world of one
//! control plane and one S3 store, reconciled again and again with a fault at any of its
//! acting calls: a status write, the snapshot streamed into the store, an object deleted.
//! A fault is a crash right after the call acted (or, the same to the procedure, its answer
//! lost), a crash before it acted, or a refusal (the stream failing its check, the store
//! refusing a deletion). Every state reached is checked:
//!
//! - `counted-verified`: every snapshot the status counts (the last good one,
//!   `lastSnapshot`, and each kept one, `snapshots`) is an object stored whole in the
//!   store: a failed or interrupted snapshot is never counted, and retention never deletes
//!   one still counted. (This exploration found that retention deleting first and writing
//!   the status after left the record of a deleted snapshot in `snapshots` after a crash in
//!   between; retention now records what it deletes in `pruning` before deleting it.)
//! - `interrupted-cleaned`: after a reconcile that ended (no crash), with no snapshot in
//!   progress, every object of the backup in the store is one it counts or one recorded as
//!   being deleted (`pruning`, left there by a refused deletion): an upload cut by a crash
//!   is deleted by the next reconcile, never left behind and never counted, and what
//!   retention chose is never forgotten in the store.
//!
//! - `snapshot-taken`: a reconcile in which nothing fails (a snapshot is due at each one)
//!   ends with a verified snapshot begun in it.
//! - `retention-kept`: a reconcile that took a snapshot and ended counts no more snapshots
//!   than `keepLast`.
//!
//! The procedure is the rules' `plan snapshot backup` of the table under test (its steps
//! run by the executor), so a weakened plan is refuted by the last two; its resume and
//! verification live in Rust, and `Mutant` makes the procedure's world misbehave to show
//! the first two can fail. This is its own small exploration beside the cluster model.

use super::procedure::{Crashed, unused_world_parts};
use crate::compile::Table;
use crate::runtime::exec::backup::{BackupTiming, BackupWorld, Failure, Stored, reconcile};
use crate::runtime::exec::{Call, Node, NodeError, Reply, World, run_now};
use crate::runtime::live::Reads;
use crate::runtime::objects::{
    ClusterRef, MachineSpec, Role, Snapshot, TalosEtcdBackup, TalosMachine,
};
use crate::runtime::talos::EtcdStatus;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// What a fault does to the acting call it hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The call acts, then the controller stops (or its answer is lost).
    CrashAfter,
    /// The controller stops before the call acts.
    CrashBefore,
    /// The call fails without acting: the stream fails its check (nothing is left under
    /// its key, as the store's upload is aborted), or the store refuses a deletion.
    Refused,
}

const FAULTS: [Fault; 3] = [Fault::CrashAfter, Fault::CrashBefore, Fault::Refused];

/// A misbehaving world, to show that the invariants can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// The status write drops `inProgress`: as if the procedure streamed without first
    /// recording the snapshot as in progress.
    NoInProgress,
    /// A stream that failed its check answers stored: as if the procedure counted a
    /// snapshot it did not verify.
    CountUnverified,
    /// The status write drops `pruning`: as if retention deleted without first recording
    /// what it deletes.
    NoPruningRecord,
}

/// The world's state between reconciles: the backup as last written, and the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The backup's status, as JSON text (canonical: serde's field order).
    status: String,
    /// The store's objects: key, stored whole.
    store: BTreeMap<String, bool>,
    /// Reconciles so far (the clock: one interval each).
    step: u8,
}

struct ModelBackup<'a> {
    backup: TalosEtcdBackup,
    store: BTreeMap<String, bool>,
    now: Timestamp,
    machines: &'a Arc<Snapshot>,
    /// Acting calls made so far this reconcile, and the fault planned at one of them.
    calls: usize,
    fault: Option<(usize, Fault)>,
    mutant: Option<Mutant>,
}

impl ModelBackup<'_> {
    /// The fault (if any) at this acting call.
    fn act(&mut self) -> Option<Fault> {
        let k = self.calls;
        self.calls += 1;
        self.fault.filter(|(at, _)| *at == k).map(|(_, f)| f)
    }
}

impl World for ModelBackup<'_> {
    type Error = Crashed;

    fn now(&self) -> Timestamp {
        self.now
    }

    unused_world_parts!("backup");

    async fn talos(
        &mut self,
        _cluster: &str,
        _node: Node<'_>,
        call: Call,
    ) -> Result<Result<Reply, NodeError>, Crashed> {
        Ok(match call {
            Call::EtcdStatus => Ok(Reply::Status(EtcdStatus {
                member_id: 1,
                leader: 1,
                protocol_version: "3.5.0".into(),
                db_size: 1,
                db_size_in_use: 1,
                raft_index: 1,
                raft_term: 1,
                raft_applied_index: 1,
                errors: Vec::new(),
                is_learner: false,
            })),
            _ => Err(NodeError::NoEndpoint(
                "the backup model makes no such call".into(),
            )),
        })
    }

    async fn read(&mut self, _cluster: &str, _reads: Reads) -> Result<Arc<Snapshot>, Crashed> {
        Ok(self.machines.clone())
    }
}

impl BackupWorld for ModelBackup<'_> {
    async fn write_backup(
        &mut self,
        _before: &TalosEtcdBackup,
        after: &TalosEtcdBackup,
    ) -> Result<(), Crashed> {
        let fault = self.act();
        if fault == Some(Fault::CrashBefore) {
            return Err(Crashed);
        }
        self.backup.status = after.status.clone();
        if self.mutant == Some(Mutant::NoInProgress)
            && let Some(s) = self.backup.status.as_mut()
        {
            s.in_progress = None;
        }
        if self.mutant == Some(Mutant::NoPruningRecord)
            && let Some(s) = self.backup.status.as_mut()
        {
            s.pruning.clear();
        }
        match fault {
            Some(Fault::CrashAfter) => Err(Crashed),
            _ => Ok(()),
        }
    }

    async fn backup_event(&mut self, _on: &TalosEtcdBackup, _w: bool, _r: &str, _n: String) {}

    async fn stream_snapshot(
        &mut self,
        _b: &TalosEtcdBackup,
        _m: &TalosMachine,
        key: &str,
    ) -> Result<Result<Stored, Failure>, Crashed> {
        let stored = Stored {
            size: 4096,
            sha256: "0".repeat(64),
            encrypted: false,
            revision: Ok(1),
        };
        match self.act() {
            Some(Fault::CrashBefore) => Err(Crashed),
            Some(Fault::CrashAfter) => {
                // Stored whole, the answer never read.
                self.store.insert(key.to_string(), true);
                Err(Crashed)
            }
            Some(Fault::Refused) if self.mutant == Some(Mutant::CountUnverified) => Ok(Ok(stored)),
            Some(Fault::Refused) => Ok(Err(Failure {
                reason: "SnapshotCorrupt".into(),
                message: "the snapshot failed its check".into(),
            })),
            None => {
                self.store.insert(key.to_string(), true);
                Ok(Ok(stored))
            }
        }
    }

    async fn delete_object(
        &mut self,
        _b: &TalosEtcdBackup,
        key: &str,
    ) -> Result<Result<(), Failure>, Crashed> {
        match self.act() {
            Some(Fault::CrashBefore) => Err(Crashed),
            Some(Fault::CrashAfter) => {
                self.store.remove(key);
                Err(Crashed)
            }
            Some(Fault::Refused) => Ok(Err(Failure {
                reason: "StoreUnreachable".into(),
                message: "the store did not answer".into(),
            })),
            None => {
                self.store.remove(key);
                Ok(Ok(()))
            }
        }
    }
}

/// A violation: the invariant, and the faults of each reconcile that led there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub trace: Vec<Option<(usize, Fault)>>,
    pub why: String,
}

/// What an exploration found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackupReport {
    pub states: usize,
    pub reconciles: usize,
    pub violations: Vec<Violation>,
}

/// The cluster the backup snapshots: one approved control plane.
fn machines() -> Snapshot {
    let mut m = TalosMachine::new(
        "cp-1",
        MachineSpec {
            cluster_ref: ClusterRef {
                name: "prod".into(),
            },
            role: Some(Role::ControlPlane),
            approved: true,
            endpoint: Some("10.0.0.1".into()),
            ..MachineSpec::default()
        },
    );
    m.metadata.namespace = Some("infra".into());
    Snapshot {
        machines: vec![m],
        ..Snapshot::default()
    }
}

/// The invariants of a state reached by a reconcile that ended (`ended`) or crashed;
/// `faultless`: nothing failed in it (a snapshot is due at every reconcile, begun at `now`).
fn check(
    b: &TalosEtcdBackup,
    store: &BTreeMap<String, bool>,
    ended: bool,
    faultless: bool,
    now: Timestamp,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let status = b.status.clone().unwrap_or_default();
    let taken_now = status
        .last_snapshot
        .as_ref()
        .is_some_and(|r| r.time.0 == now);
    if faultless && !taken_now {
        out.push((
            "snapshot-taken",
            format!(
                "a reconcile with a snapshot due and nothing failing ended without a verified \
                 snapshot begun at {now} (the last one: {:?})",
                status.last_snapshot.as_ref().map(|r| &r.key)
            ),
        ));
    }
    let keep = b
        .spec
        .retention
        .as_ref()
        .and_then(|r| r.keep_last)
        .map_or(usize::MAX, |k| k as usize);
    if ended && taken_now && status.snapshots.len() > keep {
        out.push((
            "retention-kept",
            format!(
                "a reconcile took a snapshot and ended counting {} snapshots, more than \
                 spec.retention.keepLast ({keep})",
                status.snapshots.len()
            ),
        ));
    }
    // The last good one, and every one kept.
    for r in status.last_snapshot.iter().chain(&status.snapshots) {
        if store.get(&r.key) != Some(&true) {
            out.push((
                "counted-verified",
                format!(
                    "{} is counted, but no whole object is stored under it",
                    r.key
                ),
            ));
        }
    }
    if ended && status.in_progress.is_none() {
        for key in store.keys() {
            if !status.snapshots.iter().any(|r| &r.key == key) && !status.pruning.contains(key) {
                out.push((
                    "interrupted-cleaned",
                    format!(
                        "{key} is in the store, counted by nothing and in progress for nothing"
                    ),
                ));
            }
        }
    }
    out
}

/// Explores `depth` reconciles (one scheduled interval apart) of a fresh backup, with any
/// one fault at any acting call of each, breadth-first; the states are the backup's status
/// and the store. `mutant` makes the world misbehave.
pub fn explore(table: &Table, depth: u8, mutant: Option<Mutant>) -> BackupReport {
    let mut report = BackupReport::default();
    let start = crate::verify::model::outside_backup("infra", 1);
    let machines = Arc::new(machines());
    let timing = BackupTiming {
        retry: Duration::from_secs(60),
        recheck: Duration::from_secs(3600),
    };
    let epoch: Timestamp = Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
    type Path = Vec<Option<(usize, Fault)>>;
    let mut seen: HashSet<State> = HashSet::new();
    let mut queue: VecDeque<(TalosEtcdBackup, BTreeMap<String, bool>, u8, Path)> = VecDeque::new();
    queue.push_back((start, BTreeMap::new(), 0, Vec::new()));
    while let Some((b, store, step, path)) = queue.pop_front() {
        if step >= depth {
            continue;
        }
        let now = epoch
            .checked_add(Duration::from_secs(3600 * u64::from(step) + 1))
            .unwrap_or(epoch);
        // The run without a fault first: its acting calls are the ones to fault.
        let mut plans = vec![None];
        let mut i = 0;
        while i < plans.len() {
            let fault = plans[i];
            i += 1;
            let mut w = ModelBackup {
                backup: b.clone(),
                store: store.clone(),
                now,
                machines: &machines,
                calls: 0,
                fault,
                mutant,
            };
            let obj = b.clone();
            let ran = run_now(reconcile(&mut w, table, &timing, &obj, &[]));
            report.reconciles += 1;
            if fault.is_none() {
                for k in 0..w.calls {
                    for f in FAULTS {
                        plans.push(Some((k, f)));
                    }
                }
            }
            let ended = matches!(ran, Some(Ok(_)));
            let mut next_path = path.clone();
            next_path.push(fault);
            for (invariant, why) in check(&w.backup, &w.store, ended, fault.is_none(), now) {
                if !report.violations.iter().any(|v| v.invariant == invariant) {
                    report.violations.push(Violation {
                        invariant,
                        trace: next_path.clone(),
                        why,
                    });
                }
            }
            let state = State {
                status: serde_json::to_string(&w.backup.status).unwrap_or_default(),
                store: w.store.clone(),
                step: step + 1,
            };
            if seen.insert(state) {
                report.states += 1;
                queue.push_back((w.backup, w.store, step + 1, next_path));
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped rules, `operations.rules` edited by `edit`.
    fn rules(edit: impl Fn(&str) -> String) -> Table {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
        let mut files =
            crate::ruleset::read_sources(std::slice::from_ref(&root)).expect("the shipped rules");
        let f = files
            .iter_mut()
            .find(|f| f.path.ends_with("operations.rules"))
            .expect("operations.rules");
        let text = edit(&f.text);
        *f = crate::diagnostics::SourceFile::new(f.path.clone(), text);
        crate::ruleset::build(files)
            .table
            .expect("the rules compile")
    }

    fn shipped() -> Table {
        rules(str::to_string)
    }

    const PLAN: &str = "plan snapshot backup\n  do etcd snapshot\n  do snapshots prune\n";

    #[test]
    fn the_shipped_plan_is_the_one_explored() {
        let t = shipped();
        let plan = t
            .plan(crate::vocab::Verb::Snapshot, crate::vocab::Subject::Backup)
            .expect("the shipped rules have `plan snapshot backup`");
        let steps: Vec<&str> = plan.steps.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(steps, ["etcd snapshot", "snapshots prune"]);
    }

    /// Without its `etcd snapshot` step the plan runs and never takes one: refuted by
    /// `snapshot-taken` in the first reconcile, and nothing else goes wrong.
    #[test]
    fn a_snapshot_plan_without_its_snapshot_step_is_refuted() {
        let t = rules(|s| {
            assert!(s.contains(PLAN));
            s.replace(PLAN, "plan snapshot backup\n  do snapshots prune\n")
        });
        let r = explore(&t, 2, None);
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "snapshot-taken")
            .unwrap_or_else(|| panic!("{r:?}"));
        assert_eq!(v.trace, [None], "{v:?}");
        assert!(
            !r.violations.iter().any(|v| v.invariant != "snapshot-taken"),
            "{r:?}"
        );
        assert!(explore(&shipped(), 2, None).violations.is_empty());
    }

    /// Retention before the snapshot: the reconcile ends counting one more than keepLast.
    #[test]
    fn a_snapshot_plan_pruning_before_it_snapshots_is_refuted() {
        let t = rules(|s| {
            s.replace(
                PLAN,
                "plan snapshot backup\n  do snapshots prune\n  do etcd snapshot\n",
            )
        });
        let r = explore(&t, 3, None);
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "retention-kept")
            .unwrap_or_else(|| panic!("{r:?}"));
        // The second reconcile, nothing failing: the first snapshot not pruned yet.
        assert_eq!(v.trace, [None, None], "{v:?}");
    }

    /// Rules with no `plan snapshot backup`: no snapshot, the condition says why, nothing
    /// in the store, and no panic.
    #[test]
    fn rules_without_the_snapshot_plan_take_nothing_and_say_so() {
        let t = rules(|s| s.replace(PLAN, ""));
        assert!(
            t.plan(crate::vocab::Verb::Snapshot, crate::vocab::Subject::Backup)
                .is_none()
        );
        let r = explore(&t, 2, None);
        assert!(
            r.violations.iter().all(|v| v.invariant == "snapshot-taken"),
            "{r:?}"
        );
        let machines = Arc::new(machines());
        let b = crate::verify::model::outside_backup("infra", 1);
        let mut w = ModelBackup {
            backup: b.clone(),
            store: BTreeMap::new(),
            now: Timestamp::UNIX_EPOCH,
            machines: &machines,
            calls: 0,
            fault: None,
            mutant: None,
        };
        let timing = BackupTiming {
            retry: Duration::from_secs(60),
            recheck: Duration::from_secs(3600),
        };
        let ran = run_now(reconcile(&mut w, &t, &timing, &b, &[]));
        assert!(matches!(ran, Some(Ok(_))), "{ran:?}");
        assert!(w.store.is_empty());
        let c = w
            .backup
            .condition(crate::runtime::exec::backup::SNAPSHOT)
            .expect("the Snapshot condition");
        assert_eq!(c.status, "False");
        assert_eq!(c.reason.as_deref(), Some("NoPlan"));
        assert!(
            c.message
                .as_deref()
                .is_some_and(|m| m.contains("no `plan snapshot backup`")),
            "{c:?}"
        );
    }

    #[test]
    fn the_snapshot_procedure_holds_both_invariants_under_every_fault() {
        let r = explore(&shipped(), 4, None);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert!(r.states > 100, "{r:?}");
        // Every fault kind was tried at the stream (the second acting call).
        assert!(r.reconciles > r.states, "{r:?}");
    }

    #[test]
    fn a_snapshot_streamed_before_it_is_recorded_in_progress_is_left_behind() {
        let r = explore(&shipped(), 3, Some(Mutant::NoInProgress));
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "interrupted-cleaned")
            .unwrap_or_else(|| panic!("{r:?}"));
        // A crash right after the stream stored it, then a reconcile that ended.
        assert!(v.trace.contains(&Some((1, Fault::CrashAfter))), "{v:?}");
        assert!(
            !r.violations
                .iter()
                .any(|v| v.invariant == "counted-verified"),
            "{r:?}"
        );
    }

    #[test]
    fn retention_deleting_without_recording_it_first_forgets_an_object() {
        let r = explore(&shipped(), 4, Some(Mutant::NoPruningRecord));
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "interrupted-cleaned")
            .unwrap_or_else(|| panic!("{r:?}"));
        // The second snapshot's retention: a crash before (or a refusal of) the deletion.
        assert!(
            v.trace
                .iter()
                .flatten()
                .any(|(_, f)| *f != Fault::CrashAfter),
            "{v:?}"
        );
        assert!(
            !r.violations
                .iter()
                .any(|v| v.invariant == "counted-verified"),
            "{r:?}"
        );
    }

    #[test]
    fn a_snapshot_counted_without_its_check_is_refuted() {
        let r = explore(&shipped(), 2, Some(Mutant::CountUnverified));
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "counted-verified")
            .unwrap_or_else(|| panic!("{r:?}"));
        assert!(v.trace.contains(&Some((1, Fault::Refused))), "{v:?}");
    }
}
