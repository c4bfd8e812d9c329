//! A state as the objects the API server would hold ([`Objects`]), built when a decision
//! first needs them ([`Lazy`]); the bytes that tell states with other objects apart
//! ([`object_key`]), and the decisions made on a state's objects, kept while states with
//! the same objects are expanded ([`Memo`]).

use super::bounds::{CLUSTER, GONE, MAX_MACHINES, NAMESPACE, NONE, OTHER_CLUSTER, ix};
use super::state::Backup;
use super::state::{ClusterState, MRole, Machine, Op, OpKind, OpRun, Phase, Req, State};
use crate::compile::{PlanStep, Table};
use crate::interp::Decision;
use crate::runtime::objects::{
    ALLOW_DELETE_ANNOTATION, ApprovalDecision, BackupSpec, BackupStatus, ClusterRef, ClusterSpec,
    Condition, ControlPlaneSpec, CredentialsSecretRef, MachineSpec, MachineStatus, Object,
    OperationSpec, OperationStatus, REMOVAL_FINALIZER, RemovalProgress, RetentionSpec, Role,
    ScheduleSpec, Snapshot, SnapshotRecord, StoreSpec, TEARDOWN_FINALIZER, TalosCluster,
    TalosEtcdBackup, TalosMachine, TalosOperation,
};
use crate::verify::world;
use crate::vocab::{Fact, Verdict};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::core::admission::Operation;
use std::collections::BTreeMap;

// Named by doc links only.
#[cfg(doc)]
use super::bounds::Bounds;
#[cfg(doc)]
use crate::verify::world::ModelWorld;

/// The strings a model's objects are named with, numbered by a byte: formatted once (every
/// state's snapshot names every machine; formatting them each time was a tenth of a run).
#[derive(Clone, Copy)]
pub(super) enum Text {
    ControlPlane,
    Worker,
    Operation,
    ControlPlaneEndpoint,
    WorkerEndpoint,
}

pub(super) fn text(kind: Text, n: u8) -> &'static str {
    static TEXTS: std::sync::LazyLock<Vec<Vec<String>>> = std::sync::LazyLock::new(|| {
        let all = |f: &dyn Fn(u8) -> String| (0..=u8::MAX).map(f).collect::<Vec<_>>();
        vec![
            all(&|n| format!("cp-{n}")),
            all(&|n| format!("worker-{n}")),
            all(&|n| format!("op-{n}")),
            all(&|n| format!("10.0.0.{n}:50000")),
            all(&|n| format!("10.0.1.{n}:50000")),
        ]
    });
    TEXTS
        .get(kind as usize)
        .and_then(|t| t.get(usize::from(n)))
        .map_or("", String::as_str)
}

fn time(seconds: i64) -> Time {
    Time(Timestamp::from_second(1_767_225_600 + seconds).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(time(0)),
    }
}

/// Builds the objects of a state as the API server would hold them.
/// The bytes of what [`Objects`] reads of a state (into `out`): two states with the same
/// key have the same objects (the snapshot, and every request's old and new object), so
/// the webhook decides every request the same in both. What only the controller's I/O
/// answers (etcd membership, nodes, the lock, the PDB) and the exploration's own
/// bookkeeping are left out. The patterns name every field, so a field added to the model
/// must be placed on one side or the other here.
pub fn object_key(s: &State, out: &mut Vec<u8>) {
    let State {
        count,
        schedulable,
        cluster,
        machines,
        ops,
        lock: _,
        lock_expired: _,
        pending: _,
        failures: _,
        requests: _,
        pdb: _,
        backup,
        concurrent: _,
        names,
        op_names,
    } = s;
    out.clear();
    out.extend([
        *count,
        u8::from(*schedulable),
        *cluster as u8,
        backup.byte(),
    ]);
    out.push(len_byte(machines));
    for (k, m) in machines.iter().enumerate() {
        let Machine {
            role,
            approved,
            order,
            deleting,
            finalizer,
            joined: _,
            member: _,
            up: _,
            wiped: _,
            unreachable,
            held,
            dead,
            committed,
            reroled,
            moved,
            done,
            recorded,
            cordoned: _,
            started,
            boots: _,
        } = *m;
        let bits: u16 = u16::from(role == MRole::Worker)
            | (u16::from(approved) << 1)
            | (u16::from(deleting) << 2)
            | (u16::from(finalizer) << 3)
            | (u16::from(unreachable) << 4)
            | (u16::from(held) << 5)
            | (u16::from(dead) << 6)
            | (u16::from(committed) << 7)
            | (u16::from(reroled) << 8)
            | (u16::from(moved) << 9)
            | (u16::from(recorded) << 10);
        out.extend(bits.to_le_bytes());
        out.push(order);
        out.extend(done.to_le_bytes());
        out.push(started);
        // (A machine without a stable name is named by its index.)
        out.extend(names.get(k).map_or([0, 0], |n| [1, *n]));
    }
    out.push(len_byte(ops));
    for (k, o) in ops.iter().enumerate() {
        let Op {
            kind,
            target,
            phase,
            run,
            order,
            done,
            cur,
            side,
            width,
            // The world's record, which no object shows.
            did: _,
        } = *o;
        out.extend([
            kind as u8,
            target,
            phase.byte(),
            run.steps,
            run.flags,
            run.more,
            done,
        ]);
        out.extend(order);
        out.extend([cur, width]);
        for x in side {
            out.extend([x.at, x.run.steps, x.run.flags, x.run.more]);
        }
        out.extend(op_names.get(k).map_or([0, 0], |n| [1, *n]));
    }
}

/// The length of a list of a state as a byte (every such list is shorter than 255 items:
/// `Bounds::check`).
pub fn len_byte<T>(items: &[T]) -> u8 {
    ix(items).last().map_or(0, |(i, _)| i + 1)
}

/// The decisions of one state's expansion that depend on its objects alone (what
/// [`object_key`] covers): kept while states with the same key are expanded one after the
/// other, so each is made once. A decision's fired rules are noted when it is made.
/// Facts the model supplies to a controller decision, with their values.
type Supplied = Vec<(Fact, i64)>;

/// Whether a plan step runs, with its message (or why its guard could not be evaluated).
type Guard = Result<(bool, Option<String>), String>;

pub struct Memo {
    /// Each request decided by the webhook: `None` when the request cannot be sent here,
    /// else its verdict.
    pub(super) admissions: Vec<(Req, Option<Option<Verdict>>)>,
    /// Per machine: whether its reconcile decision holds it (`apply`).
    pub(super) held: [Option<bool>; MAX_MACHINES],
    /// Removal decisions (the executor's, through [`ModelWorld`]): the machine and the
    /// facts supplied, and the decision (or the fact it needs next).
    pub removals: Vec<(u8, Supplied, Result<Decision, Fact>)>,
    /// Plan-step guards: the machine, the step, the facts supplied, and whether the step
    /// runs with its message (or why its guard could not be evaluated).
    pub guards: Vec<(u8, u8, Supplied, Guard)>,
}

impl Default for Memo {
    fn default() -> Self {
        Memo {
            admissions: Vec::new(),
            held: [None; MAX_MACHINES],
            removals: Vec::new(),
            guards: Vec::new(),
        }
    }
}

impl Memo {
    /// Remembers whether machine `i`'s reconcile decision holds it (for tests).
    #[cfg(test)]
    pub fn mark_held(&mut self, i: usize, held: bool) {
        if let Some(slot) = self.held.get_mut(i) {
            *slot = Some(held);
        }
    }

    /// Whether machine `i`'s reconcile decision holds it, when remembered.
    #[cfg(test)]
    pub fn held_of(&self, i: usize) -> Option<bool> {
        self.held.get(i).copied().flatten()
    }

    /// Forgets every decision (the next state has other objects).
    pub fn clear(&mut self) {
        let Memo {
            admissions,
            held,
            removals,
            guards,
        } = self;
        admissions.clear();
        *held = [None; MAX_MACHINES];
        removals.clear();
        guards.clear();
    }
}

pub struct Objects<'t> {
    /// The rules (each operation kind's plan).
    pub table: &'t Table,
    pub plan: Option<&'t [PlanStep]>,
    /// The reason the controller parks an operation with: the rules' own word
    /// ([`Table::parking_reasons`]), never a copy of it.
    pub parking_reason: &'t str,
    /// A roll's `spec.maxUnavailable` ([`Bounds::roll_width`]).
    pub roll_width: u8,
    /// When a fresh snapshot of the cluster's backup was taken ([`Backup::Fresh`]): the
    /// model's start, so its age (read against the clock of each decision) stays within
    /// minutes of 0 for any run.
    pub fresh_at: Timestamp,
    /// The cluster's TalosEtcdBackup without its status ([`outside_backup`]), built once.
    pub backup: TalosEtcdBackup,
}

/// A TalosEtcdBackup named [`BACKUP`] of the model's cluster in `namespace`, whose store is
/// outside the cluster (ADR 0106 §2), taking a snapshot every hour and keeping the last
/// `keep_last`: the model's ([`Objects::backup`]) and the backup procedure's exploration's
/// (`verify::backup`). Built, not parsed: nothing can fail and leave a model without it.
pub fn outside_backup(namespace: &str, keep_last: u32) -> TalosEtcdBackup {
    let mut b = TalosEtcdBackup::new(
        BACKUP,
        BackupSpec {
            cluster_ref: ClusterRef {
                name: CLUSTER.into(),
            },
            store: StoreSpec {
                endpoint: "https://s3.example.com".into(),
                bucket: "etcd".into(),
                prefix: Some("prod/".into()),
                region: None,
                credentials_secret_ref: CredentialsSecretRef {
                    name: "keys".into(),
                    ..CredentialsSecretRef::default()
                },
            },
            schedule: ScheduleSpec {
                interval: Some("1h".into()),
                cron: None,
            },
            retention: Some(RetentionSpec {
                keep_last: Some(keep_last),
                max_age: None,
            }),
            encryption: None,
        },
    );
    b.metadata.namespace = Some(namespace.into());
    b
}

/// When a stale snapshot was taken ([`Backup::Stale`]): older than any recovery point
/// objective a rule would set (more than 25 years).
pub const STALE_SNAPSHOT: Timestamp = Timestamp::UNIX_EPOCH;

/// The name of the cluster's TalosEtcdBackup in the model.
pub const BACKUP: &str = "nightly";

/// The name of the model's TalosEtcdBackup whose store is inside the cluster.
pub const IN_CLUSTER_BACKUP: &str = "in-cluster";

impl Objects<'_> {
    /// A new operation of `kind` on `target` (a roll as wide as the bounds say).
    pub fn new_op(&self, kind: OpKind, target: u8) -> Op {
        Op {
            width: if kind.rolls() { self.roll_width } else { 1 },
            ..Op::new(kind, target)
        }
    }
}

/// A state's objects, built the first time a decision needs them: a state whose
/// decisions are all remembered ([`Memo`]) and which has nothing for the controller to
/// decide needs none.
pub struct Lazy<'a> {
    objects: &'a Objects<'a>,
    state: &'a State,
    snap: std::cell::OnceCell<std::sync::Arc<Snapshot>>,
}

impl<'a> Lazy<'a> {
    pub fn new(objects: &'a Objects<'a>, state: &'a State) -> Lazy<'a> {
        Lazy {
            objects,
            state,
            snap: std::cell::OnceCell::new(),
        }
    }

    /// The state as objects.
    pub fn get(&self) -> &Snapshot {
        self.arc_ref()
    }

    fn arc_ref(&self) -> &std::sync::Arc<Snapshot> {
        self.snap
            .get_or_init(|| std::sync::Arc::new(self.objects.snapshot(self.state)))
    }

    /// The state as objects, shared (what a controller's read answers).
    pub fn arc(&self) -> std::sync::Arc<Snapshot> {
        self.arc_ref().clone()
    }

    /// Whether the objects were built.
    pub fn built(&self) -> bool {
        self.snap.get().is_some()
    }
}

impl Objects<'_> {
    pub fn machine(&self, s: &State, i: usize) -> TalosMachine {
        let m = &s.machines[i];
        let name = s.name(i);
        let mut meta = ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(NAMESPACE.into()),
            creation_timestamp: Some(time(0)),
            ..ObjectMeta::default()
        };
        if m.deleting {
            meta.deletion_timestamp = Some(time(1000));
            let mut a = BTreeMap::new();
            a.insert(ALLOW_DELETE_ANNOTATION.to_string(), "true".to_string());
            meta.annotations = Some(a);
        }
        if m.finalizer {
            meta.finalizers = Some(vec![REMOVAL_FINALIZER.into()]);
        }
        let role = if m.cp() {
            Role::ControlPlane
        } else {
            Role::Worker
        };
        let spec = MachineSpec {
            cluster_ref: ClusterRef {
                name: if m.moved { OTHER_CLUSTER } else { CLUSTER }.into(),
            },
            role: Some(role),
            approved: m.approved,
            approval_decision: (m.order > 0).then(|| ApprovalDecision {
                at: Some(time(i64::from(m.order))),
            }),
            // (i < MAX_MACHINES: Bounds::check)
            endpoint: Some(
                text(
                    match m.role {
                        MRole::ControlPlane => Text::ControlPlaneEndpoint,
                        MRole::Worker => Text::WorkerEndpoint,
                    },
                    u8::try_from(i + 1).unwrap_or(u8::MAX),
                )
                .to_string(),
            ),
            hostname: Some(name.clone()),
            install_disk: None,
        };
        let mut conditions = Vec::new();
        if m.unreachable {
            conditions.push(condition(
                "Ready",
                "False",
                "NodeUnreachable",
                "the node has not answered",
            ));
        } else if m.held {
            conditions.push(condition(
                "Ready",
                "False",
                "ControlPlaneOverCap",
                "held past the cap",
            ));
        }
        let in_removal = m.deleting
            && m.finalizer
            && (m.done != 0 || m.dead || m.committed || m.recorded || m.started != 0);
        if in_removal {
            let (reason, message) = if m.dead {
                (
                    "DeadMemberRemoval",
                    "removing a control plane whose etcd member is dead",
                )
            } else {
                ("RemovalInProgress", "removing the control plane")
            };
            conditions.push(condition("Removal", "True", reason, message));
        }
        let plan = self.plan.unwrap_or(&[]);
        let removal = in_removal.then(|| RemovalProgress {
            member_dead: m.dead,
            done: plan
                .iter()
                .enumerate()
                .filter(|(k, _)| m.done & (1 << k) != 0)
                .map(|(_, st)| st.text.clone())
                .collect(),
            started: usize::from(m.started)
                .checked_sub(1)
                .and_then(|k| plan.get(k))
                .map(|st| st.text.clone()),
            started_at: (m.started != 0).then(|| time(0)),
            committed: m.committed,
            // (Recorded once the rules let the removal through; the model keeps no record
            // of that moment alone: a machine being deleted is never moved nor renamed, as
            // admission refuses both, so the record only repeats the spec.)
            cluster: Some(CLUSTER.to_string()),
            member: Some(name.clone()),
            member_id: m.recorded.then(|| world::member_id(s, i)),
        });
        let mut tm = TalosMachine::new(&name, spec);
        tm.metadata = meta;
        tm.status = (!conditions.is_empty() || removal.is_some()).then_some(MachineStatus {
            conditions,
            removal,
            config: None,
        });
        tm
    }

    pub fn cluster(&self, s: &State) -> Option<TalosCluster> {
        if matches!(s.cluster, ClusterState::Gone | ClusterState::Missing) {
            return None;
        }
        let mut c = TalosCluster::new(
            CLUSTER,
            ClusterSpec {
                control_plane: ControlPlaneSpec {
                    count: i64::from(s.count),
                },
                schedulable: Some(if s.schedulable { "true" } else { "false" }.into()),
                talos_config_secret_ref: None,
                network: None,
                base_config_secret_ref: None,
            },
        );
        c.metadata.namespace = Some(NAMESPACE.into());
        c.metadata.creation_timestamp = Some(time(0));
        c.metadata.finalizers = Some(vec![TEARDOWN_FINALIZER.into()]);
        if s.cluster == ClusterState::Deleting {
            c.metadata.deletion_timestamp = Some(time(1000));
            let mut a = BTreeMap::new();
            a.insert(ALLOW_DELETE_ANNOTATION.to_string(), "true".to_string());
            c.metadata.annotations = Some(a);
        }
        Some(c)
    }

    pub fn operation(&self, s: &State, i: usize) -> TalosOperation {
        let o = &s.ops[i];
        let name = s.op_name(i);
        let name_of = |t: u8| match t {
            NONE => None,
            GONE => Some("cp-gone".to_string()),
            t => Some(s.name(t)),
        };
        let target = if o.kind.rolls() {
            None
        } else {
            name_of(o.target)
        };
        // The order the executor recorded: a roll's machines, or the one target.
        let order: Vec<String> = if o.kind.rolls() {
            o.roll_order().filter_map(name_of).collect()
        } else {
            target.iter().cloned().collect()
        };
        let mut op = TalosOperation::new(
            &name,
            OperationSpec {
                cluster_ref: ClusterRef {
                    name: CLUSTER.into(),
                },
                kind: o.kind.name().into(),
                machine: target,
                image: o.kind.upgrades().then(|| {
                    world::upgrade_image(s.machines.iter().any(|m| m.boots.lifecycle)).into()
                }),
                // With backups, a restore names the one whose store is inside the cluster
                // (ADR 0106 §2: `restore-store-in-cluster` refuses it).
                backup_ref: (o.kind == OpKind::Restore && s.backup != Backup::None).then(|| {
                    crate::runtime::objects::BackupRef {
                        name: IN_CLUSTER_BACKUP.into(),
                        snapshot: None,
                    }
                }),
                machines: Vec::new(),
                max_unavailable: (o.kind.rolls() && o.width > 1).then(|| i64::from(o.width)),
            },
        );
        op.metadata.namespace = Some(NAMESPACE.into());
        op.metadata.creation_timestamp = Some(time(
            100 + i64::from(s.op_names.get(i).copied().unwrap_or(0)),
        ));
        let plan = self
            .table
            .operation_plan(o.kind.name())
            .map_or(&[][..], |p| p.steps.as_slice());
        let ran = o.run != OpRun::default() || o.done > 0 || o.sides().next().is_some();
        op.status = match o.phase {
            // Parked or resumed once it ran: its progress is kept.
            Phase::Pending if ran => Some(world::operation_status(plan, o, &order)),
            Phase::Parked if ran => {
                let mut st = world::operation_status(plan, o, &order);
                st.conditions = vec![condition(
                    "Paused",
                    "True",
                    self.parking_reason,
                    "waits for an odd count",
                )];
                Some(st)
            }
            Phase::Pending => None,
            Phase::Parked => Some(OperationStatus {
                phase: Some("Paused".into()),
                conditions: vec![condition(
                    "Paused",
                    "True",
                    self.parking_reason,
                    "waits for an odd count",
                )],
                failure_reason: None,
                progress: None,
            }),
            Phase::Running | Phase::Succeeded | Phase::Failed => {
                Some(world::operation_status(plan, o, &order))
            }
        };
        op
    }

    pub fn snapshot(&self, s: &State) -> Snapshot {
        Snapshot {
            machines: (0..s.machines.len()).map(|i| self.machine(s, i)).collect(),
            clusters: self.cluster(s).into_iter().collect(),
            operations: (0..s.ops.len()).map(|i| self.operation(s, i)).collect(),
            backups: self
                .backup(s)
                .into_iter()
                .chain(self.in_cluster_backup(s))
                .collect(),
            patches: Vec::new(),
        }
    }

    /// Beside the cluster's backup ([`State::backup`] not `None`), one whose store is inside
    /// the cluster (ADR 0106 §2: a Service name) with a fresh verified snapshot: a restore
    /// from it deadlocks, so it never stands in for the fresh snapshot the `fresh-backup`
    /// rules ask for (`snapshot.taken`, `snapshot.age`), and a restore naming it is refused.
    fn in_cluster_backup(&self, s: &State) -> Option<TalosEtcdBackup> {
        if s.backup == Backup::None {
            return None;
        }
        let mut b = self.backup.clone();
        b.metadata.name = Some(IN_CLUSTER_BACKUP.into());
        b.spec.store.endpoint = "http://minio.minio.svc.cluster.local:9000".into();
        b.status = Some(BackupStatus {
            last_snapshot: Some(snapshot_record(self.fresh_at, "prod/in-cluster.db")),
            ..BackupStatus::default()
        });
        Some(b)
    }

    /// The cluster's TalosEtcdBackup ([`State::backup`]): a store outside the cluster, and
    /// its newest verified snapshot as the state says.
    fn backup(&self, s: &State) -> Option<TalosEtcdBackup> {
        let taken = match s.backup {
            Backup::None => return None,
            Backup::Empty => None,
            Backup::Fresh => Some(self.fresh_at),
            Backup::Stale => Some(STALE_SNAPSHOT),
        };
        let mut b = self.backup.clone();
        b.status = Some(BackupStatus {
            last_snapshot: taken.map(|t| snapshot_record(t, "prod/snapshot.db")),
            ..BackupStatus::default()
        });
        Some(b)
    }

    /// The request as the API server sends it to the webhook: operation, old and new object.
    pub fn request(
        &self,
        s: &State,
        snap: &Snapshot,
        req: Req,
    ) -> Option<(Operation, Option<Object>, Option<Object>)> {
        let machine = |i: u8| snap.machines.get(usize::from(i)).cloned();
        // An update of machine `i`'s spec: the object as it is, and with `edit` applied.
        let update = |i: u8, edit: &dyn Fn(&mut MachineSpec)| {
            let old = machine(i)?;
            let mut new = old.clone();
            edit(&mut new.spec);
            Some((
                Operation::Update,
                Some(Object::Machine(old)),
                Some(Object::Machine(new)),
            ))
        };
        Some(match req {
            Req::Approve(i) => {
                let next = s.machines.iter().map(|m| m.order).max().unwrap_or(0) + 1;
                update(i, &|spec| {
                    spec.approved = true;
                    spec.approval_decision = Some(ApprovalDecision {
                        at: Some(time(i64::from(next))),
                    });
                })?
            }
            Req::Move(i) => update(i, &|spec| spec.cluster_ref.name = OTHER_CLUSTER.into())?,
            Req::Reassign(i) => {
                let cp = s.machines.get(usize::from(i)).is_some_and(Machine::cp);
                update(i, &|spec| {
                    spec.role = Some(if cp { Role::Worker } else { Role::ControlPlane });
                })?
            }
            Req::Unapprove(i) => update(i, &|spec| spec.approved = false)?,
            Req::Delete(i) => {
                let mut old = machine(i)?;
                let mut a = old.metadata.annotations.clone().unwrap_or_default();
                a.insert(ALLOW_DELETE_ANNOTATION.to_string(), "true".to_string());
                old.metadata.annotations = Some(a);
                (Operation::Delete, Some(Object::Machine(old)), None)
            }
            Req::Collect(i) | Req::Prune(i) => {
                (Operation::Delete, Some(Object::Machine(machine(i)?)), None)
            }
            Req::ForgeStatus(i) => {
                let old = machine(i)?;
                let mut forged = s.fork();
                let m = forged.machines.get_mut(usize::from(i))?;
                (m.unreachable, m.dead, m.committed) = (true, true, true);
                let new = self.machine(&forged, usize::from(i));
                (
                    Operation::Update,
                    Some(Object::Machine(old)),
                    Some(Object::Machine(new)),
                )
            }
            Req::Count(to) => {
                let old = self.cluster(s)?;
                let mut new = old.clone();
                new.spec.control_plane.count = i64::from(to);
                (
                    Operation::Update,
                    Some(Object::Cluster(old)),
                    Some(Object::Cluster(new)),
                )
            }
            Req::Unschedule | Req::Reschedule => {
                let old = self.cluster(s)?;
                let mut new = old.clone();
                new.spec.schedulable = Some(
                    if req == Req::Unschedule {
                        "false"
                    } else {
                        "true"
                    }
                    .into(),
                );
                (
                    Operation::Update,
                    Some(Object::Cluster(old)),
                    Some(Object::Cluster(new)),
                )
            }
            Req::DeleteCluster => {
                let mut old = self.cluster(s)?;
                let mut a = BTreeMap::new();
                a.insert(ALLOW_DELETE_ANNOTATION.to_string(), "true".to_string());
                old.metadata.annotations = Some(a);
                (Operation::Delete, Some(Object::Cluster(old)), None)
            }
            Req::PruneCluster => (
                Operation::Delete,
                Some(Object::Cluster(self.cluster(s)?)),
                None,
            ),
            Req::CreateOperation(kind, target) => {
                let mut t = s.fork();
                t.ops.push(self.new_op(kind, target));
                t.op_names.push(next_op_name(s));
                let new = self.operation(&t, t.ops.len() - 1);
                (Operation::Create, None, Some(Object::Operation(new)))
            }
        })
    }
}

pub(super) fn next_op_name(s: &State) -> u8 {
    s.op_names.iter().copied().max().unwrap_or(0) + 1
}

/// A backup's last snapshot as the model's backups record it: taken at `time`, stored at
/// `key`, one byte at revision 1 (what the rules read of it is its time and its store).
fn snapshot_record(time: Timestamp, key: &str) -> SnapshotRecord {
    SnapshotRecord {
        time: Time(time),
        key: key.into(),
        size: 1,
        revision: Some(1),
        revision_unread: None,
        sha256: String::new(),
        node: String::new(),
        raft_index: None,
        encrypted: false,
        request: None,
    }
}
