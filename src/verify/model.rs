//! The model `verify` explores: one TalosCluster, its machines, operations, etcd membership,
//! node health, the cluster lock and the requests admitted but not yet committed.
//!
//! Every decision goes through the product's own code: a request becomes the objects an
//! AdmissionReview carries, its events come from [`request_events`] and the webhook's
//! [`decide_events`]. The removal is not modelled at all: the executor's procedure
//! ([`exec::removal::reconcile`], the controller's own code) runs against the model's world
//! ([`super::world`]), which answers what the runtime reads through I/O (etcd's membership
//! and leader, whether a node answers, the lock, whether a PodDisruptionBudget blocks a
//! drain) and applies what it changes.

use super::world::{Faults, ModelWorld};
use crate::compile::{PlanStep, Table};
use crate::interp::Decision;
use crate::runtime::decide::{
    decide_events, reconcile_machine_event, reconcile_operation_event, reconcile_start_event,
    request_events,
};
use crate::runtime::exec::{self, Outcome, Timing, Wait, run_now};
use crate::runtime::facts::Expensive;
use crate::runtime::objects::Object;
use crate::runtime::objects::{
    ALLOW_DELETE_ANNOTATION, ApprovalDecision, ClusterRef, ClusterSpec, Condition,
    ControlPlaneSpec, MachineSpec, MachineStatus, OperationSpec, OperationStatus,
    REMOVAL_FINALIZER, RemovalProgress, Role, Snapshot, TEARDOWN_FINALIZER, TalosCluster,
    TalosMachine, TalosOperation,
};
use crate::vocab::{Fact, Verb, Verdict};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::core::admission::Operation;
use std::collections::BTreeMap;

/// The longest `plan remove controlplane` the model records progress of (one bit a step).
pub const MAX_PLAN_STEPS: usize = 16;

/// Why a table cannot be explored: its plan is longer than the model can record.
pub fn unsupported(table: &Table) -> Option<String> {
    let n = table
        .plan(Verb::Remove, crate::vocab::Subject::ControlPlane)
        .map_or(0, |p| p.steps.len());
    (n > MAX_PLAN_STEPS).then(|| {
        format!(
            "`plan remove controlplane` has {n} steps; verify models plans of at most \
             {MAX_PLAN_STEPS} steps: merge steps, or split the plan's work"
        )
    })
}

/// The namespace and cluster every model object lives in.
pub const NAMESPACE: &str = "default";
pub const CLUSTER: &str = "prod";
/// The cluster a machine is moved to (`spec.clusterRef.name`), which the model does not
/// follow: a TalosCluster that is not there.
pub const OTHER_CLUSTER: &str = "staging";

/// No machine (an operation without a target, a lock nobody holds).
pub const NONE: u8 = u8::MAX;

/// The most machines, operations and requests in flight a model holds ([`Bounds::check`]):
/// their indices are bytes, [`NONE`] is not one of them, and bounds far smaller already
/// take minutes.
pub const MAX_MACHINES: usize = 64;
pub const MAX_OPERATIONS: usize = 16;
pub const MAX_IN_FLIGHT: usize = 16;

/// Each item with its index as a byte. Every list of a state is far shorter than 255 items
/// ([`Bounds::check`]), so no index is lost or wraps.
pub fn ix<T>(items: &[T]) -> impl Iterator<Item = (u8, &T)> {
    (0..NONE).zip(items)
}
/// A machine that was there and is gone (an operation's target after its removal).
pub const GONE: u8 = u8::MAX - 1;

/// The exploration's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Bounds {
    pub max_control_planes: u8,
    pub max_workers: u8,
    pub max_failures: u8,
    pub max_operations: u8,
    /// Requests admitted but not yet committed at one time (K: how many other commits may
    /// land between a request's decision and its own commit).
    pub in_flight: u8,
    /// Requests people send in one run (approve, un-approve, delete, count, schedule,
    /// delete the cluster, create an operation); `None`: unbounded. The garbage
    /// collector's deletions are not people's.
    pub max_requests: Option<u8>,
    pub depth: u32,
    /// The operations people create are rolls over the whole cluster (of
    /// [`Bounds::roll_kind`]) instead of one machine's operation.
    pub rolls: bool,
    /// A roll's `spec.maxUnavailable` (1: none written), at most [`MAX_ROLL_WIDTH`].
    pub roll_width: u8,
    /// What a roll does to each node: a reboot ([`OpKind::Roll`]) or an upgrade
    /// ([`OpKind::UpgradeRoll`]).
    pub roll_kind: RollKind,
    /// One machine's operations people create are of every kind the model runs on one
    /// machine (an upgrade, a reset, a rollback, a shutdown), not only upgrades and resets.
    pub all_kinds: bool,
}

/// The widest roll a model holds: its records of nodes in flight are the one of
/// `progress.node` and [`SIDE`] more beside it, so one past the width shows when rules let
/// too many go.
pub const MAX_ROLL_WIDTH: u8 = 2;

/// The records of a roll's nodes in flight beside `progress.node` a model keeps.
pub const SIDE: usize = 2;

/// Bounds a model cannot hold: what is wrong, and the most it can.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundsError(pub String);

impl std::fmt::Display for BoundsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BoundsError {}

impl Bounds {
    /// Whether a model can hold these bounds: its indices are bytes.
    pub fn check(&self) -> Result<(), BoundsError> {
        let machines = usize::from(self.max_control_planes) + usize::from(self.max_workers);
        let too_many = |what: &str, n: usize, max: usize| {
            BoundsError(format!(
                "{n} {what} is more than a model holds (at most {max}); lower the bound"
            ))
        };
        if self.max_control_planes == 0 {
            return Err(BoundsError(
                "a model needs at least 1 control-plane machine".to_string(),
            ));
        }
        if machines > MAX_MACHINES {
            return Err(too_many("machines", machines, MAX_MACHINES));
        }
        if self.rolls && machines > ROLL_MAX {
            return Err(BoundsError(format!(
                "{machines} machines is more than a roll over the cluster takes in a model (at \
                 most {ROLL_MAX}); lower the bound"
            )));
        }
        if self.roll_width == 0 || self.roll_width > MAX_ROLL_WIDTH {
            return Err(BoundsError(format!(
                "a roll's maxUnavailable of {} is not one a model holds (1 to {MAX_ROLL_WIDTH})",
                self.roll_width
            )));
        }
        if usize::from(self.max_operations) > MAX_OPERATIONS {
            return Err(too_many(
                "operations",
                usize::from(self.max_operations),
                MAX_OPERATIONS,
            ));
        }
        if usize::from(self.in_flight) > MAX_IN_FLIGHT {
            return Err(too_many(
                "requests in flight",
                usize::from(self.in_flight),
                MAX_IN_FLIGHT,
            ));
        }
        Ok(())
    }
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_control_planes: 6,
            max_workers: 2,
            max_failures: 1,
            max_operations: 2,
            in_flight: 1,
            max_requests: None,
            depth: 64,
            rolls: false,
            roll_width: 1,
            roll_kind: RollKind::Reboot,
            all_kinds: true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MRole {
    ControlPlane,
    Worker,
}

impl Machine {
    /// Its `spec.role` is `controlplane` (not re-roled to a worker).
    pub fn cp(&self) -> bool {
        self.role == MRole::ControlPlane && !self.reroled
    }

    /// A control plane now or before a role change (its node may hold an etcd member).
    pub fn ever_cp(&self) -> bool {
        self.role == MRole::ControlPlane
    }

    /// Approved as a control plane (`approved_role() == controlplane`), being deleted or not.
    pub fn approved_cp(&self) -> bool {
        self.cp() && self.approved && !self.moved
    }

    /// Approved as a worker: one of the workers, or a control plane re-roled to a worker.
    pub fn approved_worker(&self) -> bool {
        self.approved && !self.moved && !self.cp()
    }

    /// An approved worker, not being deleted, in service: its node up (not taken down by
    /// an operation's call) and its Kubernetes Node not cordoned, where the workloads of an
    /// unschedulable cluster run (`workers.serving`).
    pub fn serving(&self) -> bool {
        self.approved_worker()
            && !self.deleting
            && self.up
            && !self.wiped
            && !self.boots.rebooting
            && !self.boots.unsched
    }
}

/// One TalosMachine and what stands behind it (its node, its etcd member).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Machine {
    pub role: MRole,
    pub approved: bool,
    /// Approval order among approved control planes (1 = first); 0 otherwise.
    pub order: u8,
    pub deleting: bool,
    pub finalizer: bool,
    /// The controller applied it: it joined the cluster (a control plane joins etcd).
    pub joined: bool,
    pub member: bool,
    /// Its node answers.
    pub up: bool,
    /// Its node was reset or wiped: it never answers again.
    pub wiped: bool,
    /// Ready=False NodeUnreachable, as the controller's probe recorded it.
    pub unreachable: bool,
    /// Ready=False with a hold reason (over the cap).
    pub held: bool,
    /// `status.removal.memberDead`.
    pub dead: bool,
    /// `status.removal.committed`.
    pub committed: bool,
    /// A control plane re-roled to a worker (`spec.role: worker`, still approved): no
    /// longer a control plane to the counts and the controller, but its etcd member stays
    /// (and it keeps the removal finalizer) until something takes it out. (A worker re-roled
    /// to a control plane is one from then on: its `role` changes.)
    pub reroled: bool,
    /// Moved to another cluster (`spec.clusterRef.name` patched to [`OTHER_CLUSTER`]): no
    /// longer one of this cluster's machines to any count, request or controller step, but
    /// its etcd member (and its node) stay in this cluster's etcd.
    pub moved: bool,
    /// The plan steps done, by index.
    pub done: u16,
    /// `status.removal.memberId` is recorded (the machine's own member).
    pub recorded: bool,
    /// Its Kubernetes Node was drained (cordoned and emptied): the world's, not a record.
    pub cordoned: bool,
    /// `status.removal.started`: the plan step (index + 1) sent and not yet confirmed
    /// (a reset), 0 for none.
    pub started: u8,
    /// What operations did to its node (the world's, not a record).
    pub boots: Boots,
}

/// What an operation's calls did to a machine's node: the world's, not a record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Boots {
    /// Its boot time's parity: it changes each time the node comes back from a call that
    /// took it down (a reboot, a shutdown, an upgrade, a rollback).
    pub boot: bool,
    /// Taken down by such a call: when it answers again, it has a new boot time.
    pub rebooting: bool,
    /// An upgrade was installed: the next boot runs the new version.
    pub staged: bool,
    /// It runs the upgrade's version.
    pub upgraded: bool,
    /// Its Kubernetes Node is cordoned (`spec.unschedulable`).
    pub unsched: bool,
    /// Back from such a call, its node answers but its etcd member has not caught up yet
    /// (it answers no etcd call; it becomes healthy by a world move, never assumed).
    pub syncing: bool,
}

impl Machine {
    /// Its node is up and its etcd serves (when it is a member): what `healthy` counts.
    pub fn etcd_ok(&self) -> bool {
        self.up && !self.boots.syncing
    }
}

impl Boots {
    pub fn byte(self) -> u8 {
        u8::from(self.boot)
            | (u8::from(self.rebooting) << 1)
            | (u8::from(self.staged) << 2)
            | (u8::from(self.upgraded) << 3)
            | (u8::from(self.unsched) << 4)
            | (u8::from(self.syncing) << 5)
    }

    pub fn from_byte(b: u8) -> Boots {
        Boots {
            boot: b & 1 != 0,
            rebooting: b & 2 != 0,
            staged: b & 4 != 0,
            upgraded: b & 8 != 0,
            unsched: b & 16 != 0,
            syncing: b & 32 != 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    Upgrade,
    Reset,
    Restore,
    /// A reboot rolled over the whole cluster (no `spec.machine`): every approved control
    /// plane, then every approved worker, one at a time, as the controller's
    /// configuration roll creates it ([`Bounds::rolls`]).
    Roll,
    /// An upgrade rolled over the whole cluster (no `spec.machine`, `spec.image` set): the
    /// same order and the same executor as [`OpKind::Roll`], each node coming back running
    /// the new version ([`Bounds::roll_kind`]).
    UpgradeRoll,
    /// A shutdown of one machine: its node goes down and stays down (and cordoned).
    Shutdown,
    /// A rollback of one machine: its node reboots into the image it ran before.
    Rollback,
}

impl OpKind {
    pub const ALL: [OpKind; 7] = [
        OpKind::Upgrade,
        OpKind::Reset,
        OpKind::Restore,
        OpKind::Roll,
        OpKind::UpgradeRoll,
        OpKind::Shutdown,
        OpKind::Rollback,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Upgrade | OpKind::UpgradeRoll => "upgrade",
            OpKind::Reset => "reset",
            OpKind::Restore => "etcd-restore",
            OpKind::Roll => "reboot",
            OpKind::Shutdown => "shutdown",
            OpKind::Rollback => "rollback",
        }
    }

    /// It rolls over the whole cluster (no `spec.machine`).
    pub fn rolls(self) -> bool {
        matches!(self, OpKind::Roll | OpKind::UpgradeRoll)
    }

    /// Its nodes come back running a new version (`spec.image`).
    pub fn upgrades(self) -> bool {
        matches!(self, OpKind::Upgrade | OpKind::UpgradeRoll)
    }

    /// Whether `call` is the one Talos call its kind names: what an operation of the kind
    /// does to each of its nodes (`operation.undone`). An etcd restore names none here.
    pub fn does(self, call: &crate::runtime::exec::Call) -> bool {
        use crate::runtime::exec::Call;
        match self {
            OpKind::Roll => matches!(call, Call::Reboot),
            OpKind::Shutdown => matches!(call, Call::Shutdown { .. }),
            OpKind::Rollback => matches!(call, Call::Rollback),
            OpKind::Reset => matches!(call, Call::Reset { .. }),
            // The model's nodes run a Talos before 1.13: the legacy upgrade.
            OpKind::Upgrade | OpKind::UpgradeRoll => {
                matches!(call, Call::UpgradeLegacy { .. })
            }
            OpKind::Restore => false,
        }
    }

    /// Whether an operation of the kind must have done its call ([`OpKind::does`]) on
    /// each node it finishes.
    pub fn has_call(self) -> bool {
        !matches!(self, OpKind::Restore)
    }
}

/// The kind of the operations rolled over the cluster when [`Bounds::rolls`] is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RollKind {
    /// `reboot` (as the controller's configuration roll creates it): [`OpKind::Roll`].
    #[default]
    Reboot,
    /// `upgrade` to `spec.image`, control planes first, then workers:
    /// [`OpKind::UpgradeRoll`].
    Upgrade,
}

impl RollKind {
    /// The model's operation kind of such a roll.
    pub fn op_kind(self) -> OpKind {
        match self {
            RollKind::Reboot => OpKind::Roll,
            RollKind::Upgrade => OpKind::UpgradeRoll,
        }
    }
}

/// The most machines a roll over the cluster takes in the model ([`Op::order`]); a roll
/// is offered only on a cluster of at most this many approved machines.
pub const ROLL_MAX: usize = 6;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Pending,
    Parked,
    Running,
    Succeeded,
    /// A gate failed (or its target is gone): it holds nothing and never continues by
    /// itself (ADR 0137).
    Failed,
}

impl Phase {
    pub fn byte(self) -> u8 {
        self as u8
    }

    pub fn from_byte(b: u8) -> Phase {
        match b {
            0 => Phase::Pending,
            1 => Phase::Parked,
            2 => Phase::Running,
            3 => Phase::Succeeded,
            _ => Phase::Failed,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Op {
    pub kind: OpKind,
    /// The target machine's index, [`NONE`] or [`GONE`].
    pub target: u8,
    pub phase: Phase,
    /// Its `status.progress` as the executor recorded it (`exec::operation`): for a roll,
    /// its progress on the node it is at.
    pub run: OpRun,
    /// A roll's machines in the order the executor recorded (`progress.order`), [`NONE`]
    /// after the last ([`GONE`]: one removed since); all [`NONE`] before it started and
    /// for an operation on one machine.
    pub order: [u8; ROLL_MAX],
    /// A roll's machines finished (`progress.done`).
    pub done: u8,
    /// A roll's `progress.node`, as its index in `order` (the same as `done` while one node
    /// is in flight at a time).
    pub cur: u8,
    /// A roll's records of nodes in flight beside it (`progress.alongside`), each with its
    /// index in `order` ([`NONE`]: no record).
    pub side: [Side; SIDE],
    /// Its `spec.maxUnavailable` ([`Bounds::roll_width`]).
    pub width: u8,
    /// The nodes on which this operation's own call of its kind took effect (the world's
    /// record, never the product's): bit 0 for an operation on one machine, bit `n` for
    /// the `n`-th node of a roll's order ([`Op::did_on`]).
    pub did: u8,
}

/// A roll's record of a node in flight beside `progress.node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Side {
    /// The node's index in the roll's order, [`NONE`] for no record.
    pub at: u8,
    pub run: OpRun,
}

impl Side {
    pub const NONE: Side = Side {
        at: NONE,
        run: OpRun { steps: 0, flags: 0 },
    };
}

impl Op {
    /// A new operation of `kind` on `target`.
    pub fn new(kind: OpKind, target: u8) -> Op {
        Op {
            kind,
            target,
            phase: Phase::Pending,
            run: OpRun::default(),
            order: [NONE; ROLL_MAX],
            done: 0,
            cur: 0,
            side: [Side::NONE; SIDE],
            width: 1,
            did: 0,
        }
    }

    /// The bit of [`Op::did`] that stands for machine `j`: an operation on one machine
    /// has its target's; a roll, the node's position in its order (`None`: not the
    /// operation's, or not in the order).
    pub fn did_bit(&self, j: u8) -> Option<u8> {
        if self.kind.rolls() {
            let n = self.roll_order().position(|x| x == j)?;
            1u8.checked_shl(u32::try_from(n).ok()?)
        } else {
            (j == self.target).then_some(1)
        }
    }

    /// Whether this operation's own call of its kind took effect on machine `j`.
    pub fn did_on(&self, j: u8) -> bool {
        self.did_bit(j).is_some_and(|b| self.did & b != 0)
    }

    /// A roll's records beside `progress.node`.
    pub fn sides(&self) -> impl Iterator<Item = &Side> + '_ {
        self.side.iter().filter(|x| x.at != NONE)
    }

    /// The record of the roll's machine `j` while it is in flight (the operation's own
    /// for an operation on one machine).
    pub fn record_of(&self, j: u8) -> Option<OpRun> {
        if j == self.at() {
            return Some(self.run);
        }
        self.sides()
            .find(|x| self.order.get(usize::from(x.at)) == Some(&j))
            .map(|x| x.run)
    }

    /// The positions in a roll's order of the nodes it finished: started (`done` and
    /// those in flight) and not in flight.
    pub fn finished(&self) -> impl Iterator<Item = usize> + '_ {
        let len = self.roll_order().count();
        let node = usize::from(self.cur) < len;
        let started = usize::from(self.done) + usize::from(node) + self.sides().count();
        (0..started.min(len)).filter(move |&n| {
            let in_flight = (node && n == usize::from(self.cur))
                || self.sides().any(|x| usize::from(x.at) == n);
            !in_flight
        })
    }

    /// The roll's machines out of service in `s`: taken down by a call and not back, or
    /// their Kubernetes Node cordoned.
    pub fn out_of_service(&self, s: &State) -> Vec<u8> {
        self.roll_order()
            .filter(|&j| {
                s.machines
                    .get(usize::from(j))
                    .is_some_and(|m| m.boots.rebooting || m.boots.unsched)
            })
            .collect()
    }

    /// The machines a roll takes, in order.
    pub fn roll_order(&self) -> impl Iterator<Item = u8> + '_ {
        self.order.iter().copied().take_while(|&x| x != NONE)
    }

    /// The machine a roll is at (or the operation's target).
    pub fn at(&self) -> u8 {
        if self.kind.rolls() {
            self.order
                .get(usize::from(self.cur))
                .copied()
                .unwrap_or(NONE)
        } else {
            self.target
        }
    }
}

/// An operation's recorded progress on its machine, as the model keeps it: the plan steps
/// done (the executor runs them in order, so a count), and the record's flags
/// ([`OpRun::STARTED`], ...).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpRun {
    pub steps: u8,
    pub flags: u8,
}

impl OpRun {
    /// `startedAt` and the order are recorded.
    pub const STARTED: u8 = 1;
    /// `step` names the next step (it started, with its `stepStartedAt`).
    pub const IN_STEP: u8 = 2;
    /// `sent`: the destructive call was sent.
    pub const SENT: u8 = 4;
    /// `bootTime` (and `version`) recorded before the call.
    pub const BOOT_RECORDED: u8 = 8;
    /// The boot time recorded is the node's second parity ([`Boots::boot`]).
    pub const BOOT: u8 = 16;
    /// `cordoned`: this operation cordoned the node.
    pub const CORDONED: u8 = 32;
    /// `wasCordoned`: an administrator had.
    pub const WAS_CORDONED: u8 = 64;
    /// `nodeRegistered`: the node had a Kubernetes Node before the call.
    pub const REGISTERED: u8 = 128;

    pub fn has(self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lock {
    Free,
    Removal(u8),
    Operation(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClusterState {
    Live,
    Deleting,
    /// Torn down: every machine gone, the TalosCluster deleted.
    Gone,
    /// The machines refer to a TalosCluster that is not there (created before it, or
    /// left when it was deleted with its finalizer forced off): no declared count.
    Missing,
}

impl ClusterState {
    /// Deleted, or being deleted: a teardown (`cluster.deleting`).
    pub fn torn_down(self) -> bool {
        matches!(self, ClusterState::Deleting | ClusterState::Gone)
    }
}

/// A request a person (or the garbage collector) sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Req {
    Approve(u8),
    Unapprove(u8),
    /// `spec.role` of an approved control plane patched to `worker` (a `reassign`).
    Reassign(u8),
    /// `spec.clusterRef.name` of an approved machine patched to [`OTHER_CLUSTER`] (a `move`).
    Move(u8),
    /// `kubectl annotate` (allow-delete) then `kubectl delete`.
    Delete(u8),
    /// `kubectl delete` without the allow-delete annotation: a GitOps prune, say (what
    /// `machine-allow-delete` refuses).
    Prune(u8),
    /// The garbage collector deleting a machine of a deleted cluster.
    Collect(u8),
    Count(u8),
    Unschedule,
    Reschedule,
    DeleteCluster,
    /// `kubectl delete taloscluster` without the allow-delete annotation (what
    /// `cluster-allow-delete` refuses).
    PruneCluster,
    CreateOperation(OpKind, u8),
    /// Someone who may patch talosmachines/status but is not the controller writes the
    /// record a removal resumes from onto a control plane being deleted: Ready=False
    /// NodeUnreachable, the Removal condition's DeadMemberRemoval marker and a committed
    /// `status.removal` with `memberDead` (what `status-only-by-controller` refuses).
    ForgeStatus(u8),
}

impl Req {
    /// Whether the request counts against `Bounds::max_requests`: every request a person
    /// sends, not the garbage collector's deletions.
    pub fn counts(self) -> bool {
        !matches!(self, Req::Collect(_))
    }

    /// The machine the request is about, if it is about one.
    pub fn machine(self) -> Option<u8> {
        match self {
            Req::Approve(x)
            | Req::Unapprove(x)
            | Req::Reassign(x)
            | Req::Move(x)
            | Req::Delete(x)
            | Req::Prune(x)
            | Req::Collect(x)
            | Req::ForgeStatus(x) => Some(x),
            Req::Count(_)
            | Req::Unschedule
            | Req::Reschedule
            | Req::DeleteCluster
            | Req::PruneCluster
            | Req::CreateOperation(..) => None,
        }
    }

    /// The same request about machine `f(x)` (and an operation targeting `f(x)`).
    pub fn map_machine(self, f: impl Fn(u8) -> u8) -> Req {
        match self {
            Req::Approve(x) => Req::Approve(f(x)),
            Req::Unapprove(x) => Req::Unapprove(f(x)),
            Req::Reassign(x) => Req::Reassign(f(x)),
            Req::Move(x) => Req::Move(f(x)),
            Req::Delete(x) => Req::Delete(f(x)),
            Req::Prune(x) => Req::Prune(f(x)),
            Req::Collect(x) => Req::Collect(f(x)),
            Req::ForgeStatus(x) => Req::ForgeStatus(f(x)),
            Req::CreateOperation(k, x) => Req::CreateOperation(k, f(x)),
            other @ (Req::Count(_)
            | Req::Unschedule
            | Req::Reschedule
            | Req::DeleteCluster
            | Req::PruneCluster) => other,
        }
    }
}

/// A request admitted and not yet committed, with what it was decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pending {
    pub req: Req,
    /// The spec the update was decided on (resourceVersion): `approved` of the machine, or
    /// the cluster's (count, schedulable).
    pub base: (u8, bool),
    /// Admitted with a warning (`step.warned` when it commits).
    pub warned: bool,
}

/// The counts of a state the invariants' facts read ([`State::tallies`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tallies {
    pub members: usize,
    pub healthy: usize,
    pub approved_all: usize,
    pub approved_cps: usize,
    pub active: usize,
    pub workers: usize,
    /// Approved workers not being deleted in service ([`Machine::serving`]).
    pub serving: usize,
    pub running: usize,
    pub unfinished: usize,
    pub disruptive: usize,
}

/// One explored state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub count: u8,
    pub schedulable: bool,
    pub cluster: ClusterState,
    pub machines: Vec<Machine>,
    pub ops: Vec<Op>,
    pub lock: Lock,
    pub pending: Vec<Pending>,
    pub failures: u8,
    /// People's requests admitted so far (counted against `Bounds::max_requests`).
    pub requests: u8,
    pub pdb: bool,
    /// A request was committed while another was in flight (the state is not one that
    /// serialized requests reach through this path).
    pub concurrent: bool,
    /// Stable names of the machines (not part of the state's identity).
    pub names: Vec<u8>,
    /// Stable names of the operations (not part of the state's identity).
    pub op_names: Vec<u8>,
}

thread_local! {
    /// States handed back by the explorer ([`State::recycle`]): their lists' allocations
    /// are reused by [`State::fork`] (a successor is a copy of the state it came from).
    static SPARE: std::cell::RefCell<Vec<State>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl State {
    /// A copy of this state, in the allocations of a recycled state when there is one.
    pub fn fork(&self) -> State {
        match SPARE.with(|p| p.borrow_mut().pop()) {
            Some(mut t) => {
                t.copy_from(self);
                t
            }
            None => self.clone(),
        }
    }

    /// Hands a state that is done with back to [`State::fork`] (on this thread; a few
    /// are kept).
    pub fn recycle(self) {
        SPARE.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < 64 {
                p.push(self);
            }
        });
    }

    /// Makes this state equal to `s`, keeping its lists' allocations.
    pub fn copy_from(&mut self, s: &State) {
        // Every field named: one added to the state must be copied here too.
        let State {
            count,
            schedulable,
            cluster,
            machines,
            ops,
            lock,
            pending,
            failures,
            requests,
            pdb,
            concurrent,
            names,
            op_names,
        } = s;
        self.count = *count;
        self.schedulable = *schedulable;
        self.cluster = *cluster;
        self.machines.clone_from(machines);
        self.ops.clone_from(ops);
        self.lock = *lock;
        self.pending.clone_from(pending);
        self.failures = *failures;
        self.requests = *requests;
        self.pdb = *pdb;
        self.concurrent = *concurrent;
        self.names.clone_from(names);
        self.op_names.clone_from(op_names);
    }
}

/// What a transition was, for traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// A request decided on this state: committed at once, or left in flight.
    Admit {
        req: Req,
        in_flight: bool,
    },
    /// The in-flight request at this index commits (or conflicts).
    Commit(u8),
    /// The controller reconciles an approved machine (the over-cap hold, joining).
    Apply(u8),
    /// The controller probes a machine's node.
    Probe(u8),
    /// The controller reconciles a deleted control plane's removal (the reconcile ends, or
    /// stops after a status write).
    Removal(u8),
    /// That reconcile, where a call that acted lost its answer.
    RemovalLost(u8),
    /// That reconcile, where the controller crashed right after a call that acted.
    RemovalCrash(u8),
    /// That reconcile, where a call that would act was refused (nothing changed).
    RemovalRefused(u8),
    /// The controller reconciles an operation.
    Operation(u8),
    /// The controller lets a deleted TalosCluster go (no machine refers to it).
    Teardown,
    /// An operation's reconcile where an acting call lands and its answer is lost.
    OperationLost(u8),
    /// ... where the controller crashes right after an acting call.
    OperationCrash(u8),
    /// ... where an acting call is refused (nothing changed).
    OperationRefused(u8),
    NodeDies(u8),
    NodeReturns(u8),
    /// A node an upgrade took down answers again running its old version: the upgrade did
    /// not take (Talos boots the previous installation when the new one fails to boot).
    UpgradeNotTaken(u8),
    /// A node an operation's call took down answers again, its etcd member not caught up
    /// yet (one of the failures).
    NodeReturnsBehind(u8),
    /// The etcd member of a node back from an operation's call is healthy again.
    EtcdCatchesUp(u8),
    PdbBlocks,
    PdbLifts,
}

impl Move {
    /// Whether the move is one that happens without a person: the controller, the
    /// garbage collector, commits of what was admitted, and the environment recovering.
    pub fn progresses_alone(&self) -> bool {
        match self {
            Move::Admit { req, .. } => matches!(req, Req::Collect(_)),
            Move::NodeDies(_)
            | Move::UpgradeNotTaken(_)
            | Move::NodeReturnsBehind(_)
            | Move::PdbBlocks
            | Move::RemovalLost(_)
            | Move::RemovalCrash(_)
            | Move::RemovalRefused(_)
            | Move::OperationLost(_)
            | Move::OperationCrash(_)
            | Move::OperationRefused(_) => false,
            _ => true,
        }
    }
}

/// What the step did, as the invariants' transition facts read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effect {
    /// Index into [`crate::vocab::MODEL_STEPS`].
    pub step: u8,
    pub kind: Option<OpKind>,
    /// One of ours that changes etcd: leave, remove-member, reset, wipe.
    pub ours: bool,
    pub removed_dead: bool,
    /// A finalizer released while the machine was still an etcd member.
    pub left_member: bool,
    pub event_missing: bool,
    /// For a join or a lifted hold: the machine's rank by approval order.
    pub rank: u8,
    /// A committed deletion nobody meant: no allow-delete annotation, and not a machine
    /// following its deleted TalosCluster.
    pub unannotated: bool,
    /// A committed request about a machine reported unreachable when it was decided.
    pub left_dead: bool,
    /// A committed creation of an operation, of this kind.
    pub created: Option<OpKind>,
    /// A removal's reset or wipe of a node that was up, which the removal had not drained.
    pub undrained: bool,
    /// An operation took an etcd member's node down while this many other members' nodes
    /// were down (the most at any such call of the step).
    pub down_others: u8,
    /// An upgrade succeeded while its node was not back running the new version.
    pub left_down: bool,
    /// An operation succeeded on its machine, or a roll finished a node, without its
    /// kind's call having taken effect there ([`OpKind::does`], [`Op::did`]).
    pub undone: bool,
    /// A reconcile of a failed operation (no person resumed it) acted on a node: a
    /// cordon, an uncordon, a Talos call.
    pub failed_touched: bool,
    /// A removal that released its finalizer with its node still running (not reset or
    /// wiped), although the node could be reached.
    pub left_running: bool,
    /// A committed request that admission let through with a warning.
    pub warned: bool,
    /// An operation's reconcile took an approved worker out of service: it was up and
    /// uncordoned before, and is cordoned or down after ([`Machine::serving`]).
    pub worker_taken: bool,
    /// A roll's reconcile took one of its nodes out of service (cordoned it, or took it
    /// down) while another of its nodes was out of service too, one of the two a control
    /// plane ([`Op::out_of_service`]).
    pub beside_cp: bool,
}

pub fn step_index(name: &str) -> u8 {
    crate::vocab::MODEL_STEPS
        .iter()
        .position(|s| *s == name)
        .and_then(|i| u8::try_from(i).ok())
        .unwrap_or(0)
}

fn effect(name: &str) -> Effect {
    Effect {
        step: step_index(name),
        ..Effect::default()
    }
}

/// The effect of committing `p` into `t`.
fn committed(p: Pending, t: &State) -> Effect {
    Effect {
        unannotated: match p.req {
            Req::Prune(_) => t.cluster != ClusterState::Deleting,
            Req::PruneCluster => true,
            _ => false,
        },
        left_dead: p.req.machine().is_some() && p.base.0 == 1,
        created: match p.req {
            Req::CreateOperation(kind, _) => Some(kind),
            _ => None,
        },
        warned: p.warned,
        ..effect("commit")
    }
}

/// One successor of a state.
pub struct Next {
    pub mv: Move,
    pub state: State,
    pub effect: Effect,
}

/// The rules and plan steps that fired, and the decisions seen (for coverage).
#[derive(Default)]
pub struct Fired {
    pub rules: std::collections::HashSet<String>,
    pub steps: std::collections::HashSet<usize>,
}

impl Fired {
    pub fn note(&mut self, d: &Decision) {
        for f in d.refusals.iter().chain(&d.holds).chain(&d.warnings) {
            if !self.rules.contains(&f.rule) {
                self.rules.insert(f.rule.clone());
            }
        }
    }

    /// Adds what another explorer thread saw.
    pub fn merge(&mut self, other: Fired) {
        self.rules.extend(other.rules);
        self.steps.extend(other.steps);
    }
}

/// The model's view of the world the product reads through I/O.
impl State {
    /// The counts the invariants' facts read, in one pass over the machines and the
    /// operations (each the same as the method of its name).
    pub fn tallies(&self) -> Tallies {
        let mut t = Tallies::default();
        for m in &self.machines {
            t.members += usize::from(m.member);
            t.healthy += usize::from(m.member && m.etcd_ok());
            let cp = m.approved_cp();
            t.approved_all += usize::from(cp);
            t.approved_cps += usize::from(cp && !m.deleting);
            t.active += usize::from(cp && !m.deleting && m.joined && !m.held);
            t.workers += usize::from(m.approved_worker() && !m.deleting);
            t.serving += usize::from(m.serving());
        }
        for (k, o) in ix(&self.ops) {
            t.running += usize::from(o.phase == Phase::Running);
            t.unfinished += usize::from(o.phase != Phase::Succeeded);
            t.disruptive += usize::from(self.op_disrupts(k, o));
        }
        t.disruptive += usize::from(matches!(self.lock, Lock::Removal(_)));
        t
    }

    /// Of the unfinished rolls over the cluster, the one furthest past its width: how many
    /// of its workers are down or cordoned (taken down by a call and not back, or their
    /// Kubernetes Node cordoned), and its width (`roll.down`, `roll.max_unavailable`).
    pub fn roll_down(&self) -> (usize, u8) {
        self.ops
            .iter()
            .filter(|o| o.kind.rolls() && o.phase != Phase::Succeeded)
            .map(|o| {
                let down = o
                    .roll_order()
                    .filter_map(|j| self.machines.get(usize::from(j)))
                    .filter(|m| !m.ever_cp() && (m.boots.rebooting || m.boots.unsched))
                    .count();
                (down, o.width)
            })
            .max_by_key(|&(down, width)| (down.saturating_sub(usize::from(width)), down))
            .unwrap_or((0, 1))
    }

    /// Operation `k` is disruptive work under way: it holds the cluster lock, or it has
    /// touched its node (cordoned it, or sent the call that takes it down) and not ended.
    fn op_disrupts(&self, k: u8, o: &Op) -> bool {
        !matches!(o.phase, Phase::Succeeded | Phase::Failed)
            && (self.lock == Lock::Operation(k)
                || o.run.has(OpRun::CORDONED)
                || (o.run.has(OpRun::SENT) && o.run.steps != u8::MAX)
                || o.sides()
                    .any(|x| x.run.has(OpRun::CORDONED) || x.run.has(OpRun::SENT)))
    }

    pub fn members(&self) -> usize {
        self.machines.iter().filter(|m| m.member).count()
    }

    pub fn healthy(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| m.member && m.etcd_ok())
            .count()
    }

    /// etcd has a leader: a healthy majority of its members.
    pub fn has_leader(&self) -> bool {
        self.healthy() * 2 > self.members()
    }

    /// Control planes with `spec.approved`, being deleted or not.
    pub fn approved_all(&self) -> usize {
        self.machines.iter().filter(|m| m.approved_cp()).count()
    }

    pub fn approved_cps(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| m.approved_cp() && !m.deleting)
            .count()
    }

    pub fn active(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| m.approved_cp() && !m.deleting && m.joined && !m.held)
            .count()
    }

    pub fn workers(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| m.approved_worker() && !m.deleting)
            .count()
    }

    /// Approved workers in service (`workers.serving`, [`Machine::serving`]).
    pub fn serving(&self) -> usize {
        self.machines.iter().filter(|m| m.serving()).count()
    }

    pub fn running(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| o.phase == Phase::Running)
            .count()
    }

    /// Operations not finished: pending, parked or running.
    pub fn unfinished(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| o.phase != Phase::Succeeded)
            .count()
    }

    /// Removals holding the cluster lock, and operations under way ([`State::op_disrupts`]:
    /// holding it, or with their node touched; one refused at a step before it touched
    /// anything lets the lock go to other work).
    pub fn disruptive(&self) -> usize {
        let removal = usize::from(matches!(self.lock, Lock::Removal(_)));
        removal
            + ix(&self.ops)
                .filter(|(k, o)| self.op_disrupts(*k, o))
                .count()
    }

    pub fn name(&self, i: impl Into<usize>) -> String {
        let i: usize = i.into();
        match (self.machines.get(i), self.names.get(i)) {
            (Some(m), Some(n)) => match m.role {
                MRole::ControlPlane => text(Text::ControlPlane, *n).to_string(),
                MRole::Worker => text(Text::Worker, *n).to_string(),
            },
            _ => format!("machine-{i}"),
        }
    }

    pub fn op_name(&self, i: impl Into<usize>) -> String {
        let i: usize = i.into();
        match self.op_names.get(i) {
            Some(n) => text(Text::Operation, *n).to_string(),
            None => format!("op-{i}"),
        }
    }

    /// The starting states: a healthy cluster for every declared count within the bounds
    /// (that many approved control planes, all members and up); and machines whose
    /// TalosCluster is not there, with 1, 2 or 3 of them approved members.
    pub fn initial(bounds: &Bounds) -> Vec<State> {
        let mut out = Vec::new();
        let live = [1u8, 3, 5].map(|c| (ClusterState::Live, c, c));
        let missing = [1u8, 2, 3].map(|a| (ClusterState::Missing, 0, a));
        for (cluster, count, approved_cps) in live.into_iter().chain(missing) {
            if count > bounds.max_control_planes || approved_cps > bounds.max_control_planes {
                continue;
            }
            let mut machines = Vec::new();
            for i in 0..bounds.max_control_planes {
                let approved = i < approved_cps;
                machines.push(Machine {
                    role: MRole::ControlPlane,
                    approved,
                    order: if approved { i + 1 } else { 0 },
                    deleting: false,
                    finalizer: approved,
                    joined: approved,
                    member: approved,
                    up: true,
                    wiped: false,
                    unreachable: false,
                    held: false,
                    dead: false,
                    committed: false,
                    reroled: false,
                    moved: false,
                    done: 0,
                    recorded: false,
                    cordoned: false,
                    started: 0,
                    boots: Boots::default(),
                });
            }
            for _ in 0..bounds.max_workers {
                machines.push(Machine {
                    role: MRole::Worker,
                    approved: true,
                    order: 0,
                    deleting: false,
                    finalizer: false,
                    joined: true,
                    member: false,
                    up: true,
                    wiped: false,
                    unreachable: false,
                    held: false,
                    dead: false,
                    committed: false,
                    reroled: false,
                    moved: false,
                    done: 0,
                    recorded: false,
                    cordoned: false,
                    started: 0,
                    boots: Boots::default(),
                });
            }
            let mut names = Vec::new();
            let (mut cp, mut w) = (0u8, 0u8);
            for m in &machines {
                match m.role {
                    MRole::ControlPlane => {
                        cp += 1;
                        names.push(cp);
                    }
                    MRole::Worker => {
                        w += 1;
                        names.push(w);
                    }
                }
            }
            out.push(State {
                count,
                schedulable: true,
                cluster,
                machines,
                ops: Vec::new(),
                lock: Lock::Free,
                pending: Vec::new(),
                failures: 0,
                requests: 0,
                pdb: false,
                concurrent: false,
                names,
                op_names: Vec::new(),
            });
        }
        out
    }
}

// ---- objects ----------------------------------------------------------------------------

/// The strings a model's objects are named with, numbered by a byte: formatted once (every
/// state's snapshot names every machine; formatting them each time was a tenth of a run).
#[derive(Clone, Copy)]
enum Text {
    ControlPlane,
    Worker,
    Operation,
    ControlPlaneEndpoint,
    WorkerEndpoint,
}

fn text(kind: Text, n: u8) -> &'static str {
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
        pending: _,
        failures: _,
        requests: _,
        pdb: _,
        concurrent: _,
        names,
        op_names,
    } = s;
    out.clear();
    out.extend([*count, u8::from(*schedulable), *cluster as u8]);
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
        out.extend([kind as u8, target, phase.byte(), run.steps, run.flags, done]);
        out.extend(order);
        out.extend([cur, width]);
        for x in side {
            out.extend([x.at, x.run.steps, x.run.flags]);
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
    admissions: Vec<(Req, Option<Option<Verdict>>)>,
    /// Per machine: whether its reconcile decision holds it (`apply`).
    held: [Option<bool>; MAX_MACHINES],
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
}

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
            member_id: m.recorded.then(|| super::world::member_id(s, i)),
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
                image: o
                    .kind
                    .upgrades()
                    .then(|| super::world::UPGRADE_IMAGE.into()),
                backup_ref: None,
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
            Phase::Pending if ran => Some(super::world::operation_status(plan, o, &order)),
            Phase::Parked if ran => {
                let mut st = super::world::operation_status(plan, o, &order);
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
                Some(super::world::operation_status(plan, o, &order))
            }
        };
        op
    }

    pub fn snapshot(&self, s: &State) -> Snapshot {
        Snapshot {
            machines: (0..s.machines.len()).map(|i| self.machine(s, i)).collect(),
            clusters: self.cluster(s).into_iter().collect(),
            operations: (0..s.ops.len()).map(|i| self.operation(s, i)).collect(),
            backups: Vec::new(),
            patches: Vec::new(),
        }
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

fn next_op_name(s: &State) -> u8 {
    s.op_names.iter().copied().max().unwrap_or(0) + 1
}

// ---- transitions ------------------------------------------------------------------------

/// Explores transitions with one rule set.
pub struct Model<'t> {
    pub table: &'t Table,
    pub bounds: Bounds,
    pub objects: Objects<'t>,
}

/// The controller's answer for a removal, for liveness: refused by a rule (a named wait).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Removals in progress that wait, in this state, on something named: a rule's
    /// refusal outside a teardown, a fact that cannot be read, a node that does not
    /// answer, a PodDisruptionBudget, the lock held by other work, a member left behind.
    pub removals_waiting: u8,
    /// Operations in progress that wait, in this state, on something named: a rule's
    /// refusal (parked for the even count, a start or step refused), or the executor's
    /// named wait (a node or etcd not back yet, the lock held by other work).
    pub ops_waiting: u8,
    /// ADR 0137: the count is even, an operation waits for it to be odd, and removing a
    /// control plane (which would end the even count) is refused although it would be
    /// allowed without the waiting operations: they block their own cure.
    /// The control plane whose delete is so refused, and the waiting operations (a bit
    /// set of their indices).
    pub cure_blocked: Option<(u8, u64)>,
}

impl<'t> Model<'t> {
    /// A model of `table` within `bounds`, if a model can hold them ([`Bounds::check`]).
    pub fn new(table: &'t Table, bounds: Bounds) -> Result<Self, BoundsError> {
        bounds.check()?;
        let plan = table
            .plan(Verb::Remove, crate::vocab::Subject::ControlPlane)
            .map(|p| p.steps.as_slice());
        Ok(Model {
            table,
            bounds,
            objects: Objects {
                table,
                plan,
                parking_reason: table
                    .parking_reasons()
                    .first()
                    .map_or("Refused", String::as_str),
                roll_width: bounds.roll_width,
            },
        })
    }

    fn plan(&self) -> &'t [PlanStep] {
        self.objects.plan.unwrap_or(&[])
    }

    /// Decides a request as the webhook does.
    pub fn admit(&self, s: &State, snap: &Snapshot, req: Req) -> Option<Decision> {
        let (op, old, new) = self.objects.request(s, snap, req)?;
        let events = request_events(&op, NAMESPACE, old.as_ref(), new.as_ref());
        let (decision, _) = decide_events(self.table, snap, &events, Expensive::FromObjects, false);
        Some(decision)
    }

    /// [`Model::admit`]'s outcome ([`outcome`]), remembered in `memo` (it reads only the
    /// objects); `None` when the request cannot be made here.
    fn admitted(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        memo: &mut Memo,
        fired: &mut Fired,
        req: Req,
    ) -> Option<Option<Verdict>> {
        if let Some((_, v)) = memo.admissions.iter().find(|(r, _)| *r == req) {
            return *v;
        }
        let v = self.admit(s, snap.get(), req).map(|d| {
            fired.note(&d);
            outcome(&d)
        });
        memo.admissions.push((req, v));
        v
    }

    /// Every request a person could send in this state.
    pub fn requests(&self, s: &State) -> Vec<Req> {
        let mut out = Vec::new();
        self.all_requests(s, &mut out);
        if self.budget_spent(s) {
            out.retain(|r| !Req::counts(*r));
        }
        out
    }

    /// Whether people may re-role a worker to a control plane: only under a budget of
    /// requests (see `all_requests`).
    pub fn reroles_workers(&self) -> bool {
        self.bounds.max_requests.is_some()
    }

    /// Whether people have sent every request the bounds allow.
    pub fn budget_spent(&self, s: &State) -> bool {
        self.bounds.max_requests.is_some_and(|n| s.requests >= n)
    }

    fn all_requests(&self, s: &State, out: &mut Vec<Req>) {
        if s.cluster == ClusterState::Gone {
            return;
        }
        for (i, m) in ix(&s.machines) {
            if m.moved {
                // Another cluster's machine now.
                continue;
            }
            if m.deleting {
                let forged = m.unreachable && m.dead && m.committed;
                if m.finalizer && m.approved_cp() && !forged {
                    out.push(Req::ForgeStatus(i));
                }
                // Edits of a control plane whose removal is in flight: un-approved, or
                // re-roled to a worker (what `leave-while-removed` refuses). (Moved to
                // another cluster mid-removal is not sent: the model follows one cluster.)
                if m.finalizer && m.approved_cp() {
                    out.push(Req::Unapprove(i));
                    if !m.reroled {
                        out.push(Req::Reassign(i));
                    }
                }
                continue;
            }
            if !m.approved && !m.wiped {
                out.push(Req::Approve(i));
            }
            if m.approved {
                out.push(Req::Delete(i));
                // Following a deleted TalosCluster, an unannotated delete is the garbage
                // collector's (`Collect`). A machine whose TalosCluster is missing keeps
                // the gate (a typo in clusterRef must not turn it off).
                if s.cluster != ClusterState::Deleting {
                    out.push(Req::Prune(i));
                }
                if m.approved_cp() {
                    out.push(Req::Unapprove(i));
                }
                // One role change per machine, of a control plane to a worker; a worker
                // re-roled to a control plane only under a budget of requests (with any
                // number of requests it multiplies the small cluster's states by twenty),
                // which the bounds line of the report says.
                if !m.reroled && (m.role == MRole::ControlPlane || self.reroles_workers()) {
                    out.push(Req::Reassign(i));
                }
                if s.cluster != ClusterState::Deleting {
                    out.push(Req::Move(i));
                }
            }
            if s.cluster == ClusterState::Deleting {
                out.push(Req::Collect(i));
            }
        }
        if s.cluster == ClusterState::Live {
            for c in [1u8, 3, 5] {
                if c != s.count && c <= self.bounds.max_control_planes {
                    out.push(Req::Count(c));
                }
            }
            out.push(if s.schedulable {
                Req::Unschedule
            } else {
                Req::Reschedule
            });
            out.push(Req::DeleteCluster);
            out.push(Req::PruneCluster);
            let made = s.op_names.len()
                + s.pending
                    .iter()
                    .filter(|p| matches!(p.req, Req::CreateOperation(..)))
                    .count();
            if made < usize::from(self.bounds.max_operations) {
                out.push(Req::CreateOperation(OpKind::Restore, NONE));
                if self.bounds.rolls {
                    out.push(Req::CreateOperation(self.bounds.roll_kind.op_kind(), NONE));
                }
                for (i, m) in ix(&s.machines).filter(|_| !self.bounds.rolls) {
                    // An upgrade of one machine (a roll over the cluster is the same
                    // procedure on each node in turn; the model runs it on one).
                    if m.approved && !m.deleting && !m.moved {
                        out.push(Req::CreateOperation(OpKind::Upgrade, i));
                    }
                    // A control plane, or one re-roled to a worker (it may still be a member).
                    if m.ever_cp() && m.approved && !m.deleting && !m.moved {
                        out.push(Req::CreateOperation(OpKind::Reset, i));
                    }
                    // A rollback (its node back, running the image before) and a shutdown
                    // (its node down for good) of any approved machine.
                    if self.bounds.all_kinds && m.approved && !m.deleting && !m.moved {
                        out.push(Req::CreateOperation(OpKind::Rollback, i));
                        out.push(Req::CreateOperation(OpKind::Shutdown, i));
                    }
                }
            }
        }
    }

    fn base(s: &State, req: Req) -> (u8, bool) {
        // A request about a machine: whether it was reported unreachable when the request
        // was decided (`left.dead`), and its `approved` (the resourceVersion an approval or
        // an un-approval conflicts on); about the cluster: its spec.
        match req.machine() {
            Some(i) => {
                let m = s.machines.get(usize::from(i));
                (
                    u8::from(m.is_some_and(|m| m.unreachable)),
                    m.is_some_and(|m| m.approved),
                )
            }
            None => (s.count, s.schedulable),
        }
    }

    /// Applies a committed request. `None`: it conflicts (or its object is gone).
    fn commit(&self, s: &State, p: Pending) -> Option<State> {
        let mut t = s.fork();
        match p.req {
            Req::Approve(i) | Req::Unapprove(i) => {
                let next_order = s.machines.iter().map(|m| m.order).max().unwrap_or(0) + 1;
                let m = t.machines.get_mut(usize::from(i))?;
                // An approval of a machine being deleted is not sent; an un-approval is
                // (an edit mid-removal), and commits like any other.
                if m.approved != p.base.1 || (m.deleting && p.req == Req::Approve(i)) {
                    return None;
                }
                if p.req == Req::Approve(i) {
                    m.approved = true;
                    if m.role == MRole::ControlPlane {
                        m.order = next_order;
                    }
                } else {
                    // No longer applied as a control plane (its etcd member stays until
                    // someone removes it); approved again, the controller applies it again.
                    m.approved = false;
                    m.order = 0;
                    m.held = false;
                    m.joined = false;
                }
            }
            Req::Move(i) => {
                let m = t.machines.get_mut(usize::from(i))?;
                if m.approved != p.base.1 || m.deleting || m.moved {
                    return None;
                }
                // Out of this cluster: nothing here counts, applies or removes it any
                // more; only its etcd member (and its node, which may die) stays here. What
                // the model no longer reads is cleared, so that moved machines in the same
                // state are one.
                if m.member {
                    *m = Machine {
                        role: MRole::ControlPlane,
                        approved: false,
                        order: 0,
                        deleting: false,
                        finalizer: false,
                        joined: false,
                        member: true,
                        up: m.up,
                        wiped: false,
                        unreachable: false,
                        held: false,
                        dead: false,
                        committed: false,
                        reroled: false,
                        moved: true,
                        done: 0,
                        recorded: false,
                        cordoned: false,
                        started: 0,
                        boots: Boots::default(),
                    };
                } else {
                    remove_machine(&mut t, i);
                }
            }
            Req::Reassign(i) => {
                let next_order = s.machines.iter().map(|m| m.order).max().unwrap_or(0) + 1;
                let m = t.machines.get_mut(usize::from(i))?;
                if m.approved != p.base.1 || m.reroled || m.moved {
                    return None;
                }
                m.held = false;
                m.joined = false;
                if m.role == MRole::ControlPlane {
                    // No longer applied as a control plane, as for an un-approval; its etcd
                    // member and the removal finalizer stay.
                    m.reroled = true;
                    m.order = 0;
                } else {
                    // An approved control plane from now on, last in approval order, as
                    // an approval makes one.
                    m.role = MRole::ControlPlane;
                    m.order = next_order;
                    // Named among the control planes from now on, by a number none of them
                    // has (the model's names follow the role, as a decoded state's do: kept,
                    // the worker's number would name a second `cp-N`).
                    let taken = |n: u8| {
                        t.machines
                            .iter()
                            .zip(&t.names)
                            .enumerate()
                            .any(|(j, (o, x))| {
                                j != usize::from(i) && o.role == MRole::ControlPlane && *x == n
                            })
                    };
                    if let Some(n) = (1..=u8::MAX).find(|n| !taken(*n))
                        && let Some(x) = t.names.get_mut(usize::from(i))
                    {
                        *x = n;
                    }
                }
            }
            Req::Delete(i) | Req::Prune(i) | Req::Collect(i) => {
                let m = t.machines.get(usize::from(i))?;
                // The API server runs a delete's validating admission again on the object
                // as it is when the delete commits: one moved to another cluster in the
                // meantime is decided there, as that cluster's machine, which the model
                // does not follow.
                if m.deleting || m.moved {
                    return None;
                }
                if m.finalizer {
                    t.machines[usize::from(i)].deleting = true;
                } else {
                    remove_machine(&mut t, i);
                }
            }
            Req::Count(to) => {
                if (t.count, t.schedulable) != p.base || t.cluster != ClusterState::Live {
                    return None;
                }
                t.count = to;
            }
            Req::Unschedule | Req::Reschedule => {
                if (t.count, t.schedulable) != p.base || t.cluster != ClusterState::Live {
                    return None;
                }
                t.schedulable = p.req == Req::Reschedule;
            }
            Req::DeleteCluster | Req::PruneCluster => {
                if t.cluster != ClusterState::Live {
                    return None;
                }
                t.cluster = ClusterState::Deleting;
            }
            Req::ForgeStatus(i) => {
                // A merge patch of the status: no resourceVersion to conflict on.
                let m = t.machines.get_mut(usize::from(i))?;
                if !m.deleting {
                    return None;
                }
                m.unreachable = true;
                m.dead = true;
                m.committed = true;
            }
            Req::CreateOperation(kind, target) => {
                if t.cluster == ClusterState::Gone {
                    return None;
                }
                t.op_names.push(next_op_name(&t));
                t.ops.push(self.objects.new_op(kind, target));
            }
        }
        Some(t)
    }

    /// Every successor of `s`. `snap` is `s` (or a state with the same [`object_key`]) as
    /// objects, built when first needed.
    ///
    /// `memo` holds the decisions made for another state with the same objects
    /// ([`object_key`]), or none ([`Memo::clear`]); this state's are added.
    pub fn successors(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) -> Outcomes {
        let mut outcomes = Outcomes::default();
        // People: decided on this state; admitted ones commit at once or stay in flight.
        for req in self.requests(s) {
            let verdict = self.admitted(s, snap, memo, fired, req);
            let Some(verdict) = verdict else {
                continue;
            };
            if verdict == Some(Verdict::Refuse) {
                continue;
            }
            let p = Pending {
                req,
                base: Self::base(s, req),
                warned: verdict == Some(Verdict::Warn),
            };
            // Counted only under a budget (a count nobody reads would tell equal states
            // apart).
            let used = if self.bounds.max_requests.is_some() {
                s.requests.saturating_add(u8::from(req.counts()))
            } else {
                0
            };
            if let Some(mut t) = self.commit(s, p) {
                t.requests = used;
                if !s.pending.is_empty() {
                    t.concurrent = true;
                }
                out.push(Next {
                    mv: Move::Admit {
                        req,
                        in_flight: false,
                    },
                    effect: committed(p, &t),
                    state: t,
                });
            }
            if s.pending.len() < usize::from(self.bounds.in_flight) {
                let mut t = s.fork();
                t.requests = used;
                t.pending.push(p);
                out.push(Next {
                    mv: Move::Admit {
                        req,
                        in_flight: true,
                    },
                    state: t,
                    effect: effect("admit"),
                });
            }
        }
        for (kidx, p) in ix(&s.pending) {
            let k = usize::from(kidx);
            let mut rest = s.fork();
            rest.pending.remove(k);
            let (t, e) = match self.commit(&rest, *p) {
                Some(mut t) => {
                    // Committed while another request is still in flight.
                    t.concurrent |= !rest.pending.is_empty();
                    let e = committed(*p, &t);
                    (t, e)
                }
                None => (rest, effect("conflict")),
            };
            out.push(Next {
                mv: Move::Commit(kidx),
                state: t,
                effect: e,
            });
        }
        // The controller.
        if s.cluster != ClusterState::Gone {
            for (idx, m) in ix(&s.machines) {
                let i = usize::from(idx);
                if m.deleting {
                    if m.finalizer {
                        let named = self.removal(s, snap, idx, memo, fired, out);
                        outcomes.removals_waiting += u8::from(named);
                    }
                    continue;
                }
                if m.approved_cp() {
                    if let Some((t, e)) = self.apply(s, snap, i, memo, fired) {
                        out.push(Next {
                            mv: Move::Apply(idx),
                            state: t,
                            effect: e,
                        });
                    }
                    if m.up == m.unreachable {
                        let mut t = s.fork();
                        t.machines[i].unreachable = !m.up;
                        out.push(Next {
                            mv: Move::Probe(idx),
                            state: t,
                            effect: effect("probe"),
                        });
                    }
                }
            }
            // Operations the controller leaves waiting here while the count is even: not
            // an etcd restore, not started, not holding the lock (ADR 0137).
            let mut waiting: u64 = 0;
            for (kidx, o) in ix(&s.ops) {
                let (added, named) = self.operation(s, snap, kidx, memo, fired, out);
                outcomes.ops_waiting += u8::from(named);
                if !added
                    && o.kind != OpKind::Restore
                    && matches!(o.phase, Phase::Pending | Phase::Parked)
                    && s.lock != Lock::Operation(kidx)
                    && kidx < 64
                {
                    waiting |= 1 << kidx;
                }
            }
            if waiting != 0 {
                outcomes.cure_blocked = self
                    .cure_blocked(s, snap, memo, fired, waiting)
                    .map(|i| (i, waiting));
            }
            if s.cluster == ClusterState::Deleting && s.machines.iter().all(|m| m.moved) {
                let mut t = s.fork();
                t.cluster = ClusterState::Gone;
                t.ops.clear();
                t.op_names.clear();
                t.pending.clear();
                out.push(Next {
                    mv: Move::Teardown,
                    state: t,
                    effect: effect("teardown"),
                });
            }
        }
        // The environment.
        for (idx, m) in ix(&s.machines) {
            let i = usize::from(idx);
            if !m.up && !m.wiped && m.boots.rebooting {
                // Taken down by an operation's call: it comes back (not assumed: a world
                // move) with a new boot time, running what was staged.
                let mut t = s.fork();
                let b = &mut t.machines[i].boots;
                b.boot = !b.boot;
                b.rebooting = false;
                if b.staged {
                    // Within the failure budget, the upgrade does not take.
                    if s.failures < self.bounds.max_failures {
                        let mut u = t.clone();
                        u.machines[i].boots.staged = false;
                        u.machines[i].up = true;
                        u.failures += 1;
                        out.push(Next {
                            mv: Move::UpgradeNotTaken(idx),
                            state: u,
                            effect: effect("node-returns"),
                        });
                    }
                    let b = &mut t.machines[i].boots;
                    b.upgraded = true;
                    b.staged = false;
                }
                t.machines[i].up = true;
                // Within the failure budget, its etcd member has not caught up yet when
                // the node answers (it does, by a move of its own).
                if m.member && s.failures < self.bounds.max_failures {
                    let mut u = t.clone();
                    u.machines[i].boots.syncing = true;
                    u.failures += 1;
                    out.push(Next {
                        mv: Move::NodeReturnsBehind(idx),
                        state: u,
                        effect: effect("node-returns"),
                    });
                }
                out.push(Next {
                    mv: Move::NodeReturns(idx),
                    state: t,
                    effect: effect("node-returns"),
                });
                continue;
            }
            if m.up && m.boots.syncing {
                let mut t = s.fork();
                t.machines[i].boots.syncing = false;
                out.push(Next {
                    mv: Move::EtcdCatchesUp(idx),
                    state: t,
                    effect: effect("node-returns"),
                });
            }
            if !m.ever_cp() || m.wiped || !(m.approved || m.member) {
                continue;
            }
            if m.up && s.failures < self.bounds.max_failures {
                let mut t = s.fork();
                t.machines[i].up = false;
                t.failures += 1;
                out.push(Next {
                    mv: Move::NodeDies(idx),
                    state: t,
                    effect: effect("node-dies"),
                });
            }
            if !m.up {
                let mut t = s.fork();
                t.machines[i].up = true;
                out.push(Next {
                    mv: Move::NodeReturns(idx),
                    state: t,
                    effect: effect("node-returns"),
                });
            }
        }
        let draining = s
            .machines
            .iter()
            .any(|m| m.deleting && m.finalizer && !m.committed);
        if s.pdb {
            let mut t = s.fork();
            t.pdb = false;
            out.push(Next {
                mv: Move::PdbLifts,
                state: t,
                effect: effect("pdb"),
            });
        } else if draining && s.failures < self.bounds.max_failures {
            let mut t = s.fork();
            t.pdb = true;
            t.failures += 1;
            out.push(Next {
                mv: Move::PdbBlocks,
                state: t,
                effect: effect("pdb"),
            });
        }
        outcomes
    }

    /// [`Outcomes::cure_blocked`] for the operations in the bit set `waiting`: an approved
    /// control plane whose annotated delete is refused here, and allowed on the same state
    /// without those operations.
    fn cure_blocked(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        memo: &mut Memo,
        fired: &mut Fired,
        waiting: u64,
    ) -> Option<u8> {
        let approved = s.approved_cps();
        if s.cluster != ClusterState::Live || approved == 0 || !approved.is_multiple_of(2) {
            return None;
        }
        let mut without: Option<(State, Snapshot)> = None;
        for (i, m) in ix(&s.machines) {
            if !m.approved_cp() || m.deleting || m.moved {
                continue;
            }
            let req = Req::Delete(i);
            let verdict = self.admitted(s, snap, memo, fired, req);
            if verdict != Some(Some(Verdict::Refuse)) {
                continue;
            }
            let (u, usnap) = without.get_or_insert_with(|| {
                let mut u = s.fork();
                let mut k = u.ops.len();
                while k > 0 {
                    k -= 1;
                    if waiting & (1 << k) != 0 {
                        u.ops.remove(k);
                        if k < u.op_names.len() {
                            u.op_names.remove(k);
                        }
                        if let Lock::Operation(h) = u.lock
                            && usize::from(h) > k
                        {
                            u.lock = Lock::Operation(h - 1);
                        }
                    }
                }
                let usnap = self.objects.snapshot(&u);
                (u, usnap)
            });
            let alone = self.admit(u, usnap, req).map(|d| outcome(&d));
            if matches!(alone, Some(v) if v != Some(Verdict::Refuse)) {
                return Some(i);
            }
        }
        None
    }

    /// The over-cap hold and joining (`controller/machine.rs`, step 1 and 2).
    fn apply(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        i: usize,
        memo: &mut Memo,
        fired: &mut Fired,
    ) -> Option<(State, Effect)> {
        let held = match memo.held.get(i).copied().flatten() {
            Some(held) => held,
            None => {
                let snap = snap.get();
                let live = snap.machines.get(i)?;
                let events: Vec<_> = reconcile_machine_event(live).into_iter().collect();
                let (decision, _) =
                    decide_events(self.table, snap, &events, Expensive::Deferred, false);
                fired.note(&decision);
                let held = crate::runtime::controller::hold_of(&decision, "Held").is_some();
                if let Some(slot) = memo.held.get_mut(i) {
                    *slot = Some(held);
                }
                held
            }
        };
        let m = &s.machines[i];
        // Counted in a byte: the machines are at most MAX_MACHINES (Bounds::check).
        let rank = ix(&s.machines)
            .filter(|(_, x)| x.approved_cp() && !x.deleting && x.order <= m.order)
            .fold(0u8, |n, _| n.saturating_add(1));
        let mut t = s.fork();
        if held {
            if m.held {
                return None;
            }
            t.machines[i].held = true;
            return Some((t, effect("hold")));
        }
        if m.held {
            t.machines[i].held = false;
            return Some((
                t,
                Effect {
                    rank,
                    ..effect("release-hold")
                },
            ));
        }
        if !m.joined && (m.member || (m.up && !m.wiped)) {
            let tm = &mut t.machines[i];
            tm.joined = true;
            tm.member |= tm.up && !tm.wiped;
            tm.finalizer = true;
            return Some((
                t,
                Effect {
                    rank,
                    ..effect("join")
                },
            ));
        }
        None
    }

    /// One reconcile of a deleted control plane's removal: the executor's procedure
    /// ([`exec::removal::reconcile`]), run against this state's world. Its successors, in
    /// `out`: the state where the reconcile ended, each state after a status write that
    /// changed it (a controller may stop there and a new one resume), and, within the
    /// failure budget, for each call that acted, the state where its answer was lost or the
    /// controller crashed right after it. Returns whether the removal waits on something
    /// named (a refusal outside a teardown, a node, etcd, a PDB, the lock held by other
    /// work, a member left behind).
    fn removal(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        idx: u8,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) -> bool {
        let i = usize::from(idx);
        let teardown = s.cluster.torn_down();
        let arc = snap.arc();
        let Some(live) = arc.machines.get(i) else {
            return false;
        };
        let timing = Timing {
            refused_requeue: std::time::Duration::from_secs(30),
            lock_retry: std::time::Duration::from_secs(5),
            drain_retry: std::time::Duration::from_secs(15),
            reset_settle: std::time::Duration::from_secs(60),
            sent_deadline: std::time::Duration::from_secs(600),
        };
        let run = |faults: Faults, fired: &mut Fired, memo: &mut Memo| {
            let mut w = ModelWorld::new(
                s.fork(),
                idx,
                &arc,
                Some(arc.clone()),
                self.plan(),
                fired,
                memo,
            )
            .with_faults(faults);
            let outcome = run_now(exec::removal::reconcile(&mut w, self.table, &timing, live));
            let ModelWorld {
                t,
                acts,
                effect,
                stops,
                ..
            } = w;
            (t, acts, effect, stops, outcome)
        };
        let label = |t: &State, mut e: Effect| {
            if e.step == 0 {
                e.step = step_index(if t.lock == Lock::Removal(idx) {
                    "lock"
                } else {
                    "refused"
                });
            }
            e
        };
        let (t, acts, effect, stops, outcome) = run(Faults::default(), fired, memo);
        let named = match &outcome {
            Some(Ok(Outcome::Requeue {
                wait: Wait::On(_), ..
            })) => true,
            Some(Ok(Outcome::Requeue {
                wait: Wait::Refused,
                ..
            })) => !teardown,
            _ => false,
        };
        for (u, e) in stops {
            if u != *s && u != t {
                out.push(Next {
                    mv: Move::Removal(idx),
                    effect: label(&u, e),
                    state: u,
                });
            }
        }
        if t != *s {
            out.push(Next {
                mv: Move::Removal(idx),
                effect: label(&t, effect),
                state: t,
            });
        }
        if s.failures < self.bounds.max_failures {
            let moves = [
                Move::RemovalLost(idx),
                Move::RemovalCrash(idx),
                Move::RemovalRefused(idx),
            ];
            for (faults, mv) in Faults::each(acts, moves) {
                let (mut u, _, e, _, _) = run(faults, fired, memo);
                u.failures += 1;
                out.push(Next {
                    mv,
                    effect: label(&u, e),
                    state: u,
                });
            }
        }
        named
    }

    /// One reconcile of an operation: parked or resumed by the `run operation` rules; its
    /// `start` rules decided again; then its plan runs through the executor's procedure
    /// ([`exec::operation::reconcile`], as the controller runs it in the same reconcile),
    /// in this state's world. Its successors go to `out`: where the reconcile ended and,
    /// within the failure budget, for each call that acted, the state where its answer
    /// was lost, the controller crashed right after it, or it was refused. Returns whether
    /// any successor was added.
    fn operation(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        kidx: u8,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) -> (bool, bool) {
        let k = usize::from(kidx);
        let o = s.ops[k];
        let with_kind = |e: Effect| Effect {
            kind: Some(o.kind),
            ..e
        };
        match o.phase {
            Phase::Succeeded => (false, false),
            // Failed: the executor touches nothing more (ADR 0137); the controller still
            // reconciles it, and `failed-touches-nothing` holds the executor to that.
            Phase::Failed => self.run_operation(s, snap, kidx, memo, fired, out),
            Phase::Pending | Phase::Parked | Phase::Running => {
                let arc = snap.arc();
                let Some(live) = arc.operations.get(k) else {
                    return (false, false);
                };
                let mut t = s.fork();
                let events: Vec<_> = reconcile_operation_event(live).into_iter().collect();
                let (decision, _) =
                    decide_events(self.table, &arc, &events, Expensive::Deferred, false);
                fired.note(&decision);
                if crate::runtime::controller::hold_of(&decision, "Refused").is_some() {
                    if o.phase == Phase::Parked {
                        // Parked, and left so: it waits for the even count to end.
                        return (false, true);
                    }
                    t.ops[k].phase = Phase::Parked;
                    out.push(Next {
                        mv: Move::Operation(kidx),
                        state: t,
                        effect: with_kind(effect("operation-park")),
                    });
                    return (true, false);
                }
                if o.phase == Phase::Parked {
                    t.ops[k].phase = Phase::Pending;
                    out.push(Next {
                        mv: Move::Operation(kidx),
                        state: t,
                        effect: with_kind(effect("operation-resume")),
                    });
                    return (true, false);
                }
                // Started: `controller/operation.rs` runs it on (the start rules are for
                // one that has not started).
                if o.phase == Phase::Running {
                    return self.run_operation(s, snap, kidx, memo, fired, out);
                }
                // `controller/operation.rs::start_again`: the start rules again, with
                // `healthy.after` asked of etcd.
                let Some(ev) = reconcile_start_event(live) else {
                    return (false, false);
                };
                let target = (o.target != NONE && o.target != GONE)
                    .then(|| arc.machines.get(usize::from(o.target)))
                    .flatten();
                let decision = super::world::ask_and_decide(self.table, s, &arc, ev, target, fired);
                fired.note(&decision);
                if crate::runtime::controller::hold_of(&decision, "StartRefused").is_some() {
                    // Refused by a start rule, with its message: a named wait.
                    return (false, true);
                }
                self.run_operation(s, snap, kidx, memo, fired, out)
            }
        }
    }

    /// The executor's reconcile of operation `kidx` from state `s` (see
    /// [`Model::operation`]).
    fn run_operation(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        kidx: u8,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) -> (bool, bool) {
        let k = usize::from(kidx);
        let o = s.ops[k];
        let arc = snap.arc();
        let Some(live) = arc.operations.get(k) else {
            return (false, false);
        };
        let timing = model_timing();
        // The machine the world acts on: the target, or the node a roll is at.
        let at = o.at();
        let machine = if at == GONE { NONE } else { at };
        let run = |faults: Faults, fired: &mut Fired, memo: &mut Memo| {
            let mut w = ModelWorld::new(
                s.fork(),
                machine,
                &arc,
                Some(arc.clone()),
                self.plan(),
                fired,
                memo,
            )
            .with_faults(faults)
            .with_operation(kidx);
            let outcome = run_now(exec::operation::reconcile(
                &mut w, self.table, &timing, live,
            ));
            let ModelWorld {
                t, acts, effect, ..
            } = w;
            (t, acts, effect, outcome)
        };
        // What the reconcile did, for the invariants: it started running the operation
        // (`no-operation-while-even` reads that before anything else it did), or ended it.
        let label = |t: &State, mut e: Effect| {
            e.kind = Some(o.kind);
            // An approved worker in service before this reconcile, and no longer after it.
            e.worker_taken =
                s.machines.iter().zip(&t.machines).any(|(a, b)| {
                    a.serving() && !b.serving() && b.approved_worker() && !b.deleting
                });
            let now = t.ops.get(k).map_or(o.phase, |x| x.phase);
            // An upgrade that ended here left its node back, running the new version? A roll,
            // each node it finished here (as far as it is still there)?
            // Back in service too: uncordoned, unless it was cordoned before the operation
            // touched it (`wasCordoned`, known for the node the reconcile started at: the
            // model has no administrator's cordon, but an earlier failed operation leaves
            // one).
            // A machine being deleted that the roll passed without cordoning it (the
            // executor skips one no step touched: `NodeSkipped`) was not taken down by the
            // operation: if its node is down, something else did it, and its removal takes
            // it out of service anyway; nor was it upgraded by an upgrade roll, which passed
            // it (`verify --rolls --roll-kind upgrade` found the roll blamed for the old
            // version of a control plane the garbage collector was deleting).
            let back = |j: u8, upgraded: bool| {
                let cordon_kept = o.record_of(j).is_some_and(|r| r.has(OpRun::WAS_CORDONED));
                t.machines.get(usize::from(j)).is_none_or(|m| {
                    (m.deleting && !m.boots.unsched && (!upgraded || o.kind.rolls()))
                        || m.etcd_ok()
                            && !m.boots.rebooting
                            && (m.boots.upgraded || !upgraded)
                            && (!m.boots.unsched || cordon_kept)
                })
            };
            // Did what its kind says: its call took effect on each node it finished, as far
            // as the machine is still there and not being deleted (a roll passes one being
            // deleted: `NodeSkipped`).
            if let Some(x) = t.ops.get(k)
                && o.kind.has_call()
            {
                let undone = |j: u8| {
                    t.machines
                        .get(usize::from(j))
                        .is_some_and(|m| !m.deleting && !x.did_on(j))
                };
                e.undone = if o.kind.rolls() {
                    let before: Vec<usize> = o.finished().collect();
                    x.finished()
                        .filter(|n| !before.contains(n))
                        .filter_map(|n| x.order.get(n).copied())
                        .any(undone)
                } else {
                    now == Phase::Succeeded && o.phase != Phase::Succeeded && undone(o.target)
                };
            }
            match (o.kind, t.ops.get(k)) {
                (OpKind::Upgrade | OpKind::Rollback, _)
                    if now == Phase::Succeeded && o.phase != Phase::Succeeded =>
                {
                    e.left_down = t.machines.get(usize::from(o.target)).is_none()
                        || !back(o.target, o.kind.upgrades());
                }
                (kind, Some(x)) if kind.rolls() => {
                    // A node it took out of service beside another out of service, one of
                    // the two a control plane (one re-roled since it was taken is not
                    // blamed on the roll: only what this reconcile took counts).
                    let (was, now) = (o.out_of_service(s), x.out_of_service(t));
                    let cp = |j: u8| t.machines.get(usize::from(j)).is_some_and(|m| m.ever_cp());
                    e.beside_cp = now
                        .iter()
                        .filter(|j| !was.contains(j))
                        .any(|&j| now.iter().any(|&k| k != j && (cp(j) || cp(k))));
                    let before: Vec<usize> = o.finished().collect();
                    e.left_down = x
                        .finished()
                        .filter(|n| !before.contains(n))
                        .filter_map(|n| x.order.get(n).copied())
                        .any(|j| !back(j, kind.upgrades()))
                        && o.phase != Phase::Succeeded;
                }
                _ => {}
            }
            if matches!(o.phase, Phase::Pending | Phase::Parked) && now != o.phase {
                e.step = step_index("operation-run");
            } else if e.step == 0 {
                e.step = step_index(match now {
                    Phase::Succeeded => "operation-done",
                    Phase::Failed => "operation-refused",
                    _ => "operation-step",
                });
            }
            e
        };
        let (t, acts, e, outcome) = run(Faults::default(), fired, memo);
        // A failed operation's reconcile: a successor only when it did something (which
        // `failed-touches-nothing` refutes); nothing of it is faulted.
        if o.phase == Phase::Failed {
            if acts == 0 && t == *s {
                return (false, false);
            }
            let mut effect = e;
            effect.kind = Some(o.kind);
            effect.failed_touched = true;
            out.push(Next {
                mv: Move::Operation(kidx),
                effect,
                state: t,
            });
            return (true, false);
        }
        // Waiting on something named: a step rule's refusal, or the executor's named wait
        // (a node or etcd not back yet, the lock held by other work).
        let named = matches!(outcome, Some(Ok(Outcome::Requeue { .. })));
        let mut added = false;
        if t != *s {
            out.push(Next {
                mv: Move::Operation(kidx),
                effect: label(&t, e),
                state: t,
            });
            added = true;
        }
        if s.failures < self.bounds.max_failures {
            let moves = [
                Move::OperationLost(kidx),
                Move::OperationCrash(kidx),
                Move::OperationRefused(kidx),
            ];
            for (faults, mv) in Faults::each(acts, moves) {
                let (mut u, _, e, _) = run(faults, fired, memo);
                u.failures += 1;
                out.push(Next {
                    mv,
                    effect: label(&u, e),
                    state: u,
                });
                added = true;
            }
        }
        (added, named)
    }
}

/// The executor's timing in the model (its clock is the model's: only the order matters).
fn model_timing() -> Timing {
    Timing {
        refused_requeue: std::time::Duration::from_secs(30),
        lock_retry: std::time::Duration::from_secs(5),
        drain_retry: std::time::Duration::from_secs(15),
        reset_settle: std::time::Duration::from_secs(60),
        sent_deadline: std::time::Duration::from_secs(600),
    }
}

/// An admission's outcome: refused, or let through with a warning (`Warn`), or not.
fn outcome(d: &Decision) -> Option<Verdict> {
    d.verdict()
        .or_else(|| (!d.warnings.is_empty()).then_some(Verdict::Warn))
}

/// Removes machine `i`, renumbering what refers to machines after it.
pub fn remove_machine(t: &mut State, i: u8) {
    let iu = usize::from(i);
    if iu >= t.machines.len() {
        return;
    }
    t.machines.remove(iu);
    t.names.remove(iu);
    let shift = |x: u8| -> u8 {
        if x == NONE || x == GONE {
            x
        } else if x == i {
            GONE
        } else if x > i {
            x - 1
        } else {
            x
        }
    };
    for o in &mut t.ops {
        o.target = shift(o.target);
        for x in &mut o.order {
            *x = shift(*x);
        }
    }
    t.lock = match t.lock {
        Lock::Removal(h) if h == i => Lock::Free,
        Lock::Removal(h) => Lock::Removal(shift(h)),
        other => other,
    };
    t.pending.retain(|p| p.req.machine() != Some(i));
    for p in &mut t.pending {
        p.req = p.req.map_machine(shift);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The shipped rules, and small bounds with a failure, an operation and a request in
    /// flight (every kind of field a state has).
    pub(crate) fn small_model() -> (Table, Bounds) {
        let table = crate::ruleset::load(&[std::path::PathBuf::from("rules")])
            .expect("rules")
            .table
            .expect("table");
        let bounds = Bounds {
            max_control_planes: 3,
            max_workers: 1,
            max_failures: 1,
            max_operations: 1,
            in_flight: 1,
            max_requests: Some(2),
            depth: 64,
            rolls: false,
            roll_width: 1,
            roll_kind: RollKind::Reboot,
            all_kinds: false,
        };
        (table, bounds)
    }

    /// Visits the states `model` reaches from its starting states, depth first, at most
    /// `limit` of them, each with its successors (expanded afresh). The number visited.
    pub(crate) fn walk(
        model: &Model<'_>,
        bounds: &Bounds,
        limit: usize,
        mut visit: impl FnMut(&State, &[Next]),
    ) -> usize {
        let mut frontier = State::initial(bounds);
        let mut seen = std::collections::HashSet::new();
        while let Some(s) = frontier.pop() {
            if seen.len() >= limit || !seen.insert(s.clone()) {
                continue;
            }
            let mut nexts = Vec::new();
            model.successors(
                &s,
                &Lazy::new(&model.objects, &s),
                &mut Memo::default(),
                &mut Fired::default(),
                &mut nexts,
            );
            visit(&s, &nexts);
            frontier.extend(nexts.into_iter().map(|n| n.state));
        }
        seen.len()
    }

    /// What `object_key` leaves out is never read by the objects: in every state a small
    /// model reaches, changing each left-out field gives the same snapshot, the same
    /// request objects and the same decisions, so the explorer may share them between
    /// states with one key.
    #[test]
    fn states_with_one_object_key_have_the_same_objects() {
        let (table, bounds) = small_model();
        let model = Model::new(&table, bounds).expect("model");
        let mut frontier = State::initial(&bounds);
        let mut seen = std::collections::HashSet::new();
        let (mut checked, mut key_a, mut key_b) = (0, Vec::new(), Vec::new());
        while let Some(s) = frontier.pop() {
            if !seen.insert(s.clone()) || seen.len() > 3000 {
                continue;
            }
            let mut t = s.clone();
            for m in &mut t.machines {
                (m.joined, m.member, m.up, m.wiped, m.cordoned) =
                    (!m.joined, !m.member, !m.up, !m.wiped, !m.cordoned);
            }
            t.lock = if t.lock == Lock::Free {
                Lock::Removal(0)
            } else {
                Lock::Free
            };
            t.pending = vec![Pending {
                req: Req::Unschedule,
                base: (1, true),
                warned: true,
            }];
            (t.failures, t.requests) = (t.failures + 1, t.requests + 1);
            (t.pdb, t.concurrent) = (!t.pdb, !t.concurrent);
            object_key(&s, &mut key_a);
            object_key(&t, &mut key_b);
            assert_eq!(key_a, key_b, "only left-out fields were changed");
            let (sa, sb) = (model.objects.snapshot(&s), model.objects.snapshot(&t));
            assert_eq!(format!("{sa:?}"), format!("{sb:?}"), "snapshot of {s:?}");
            for req in model.requests(&s) {
                let (ra, rb) = (
                    model.objects.request(&s, &sa, req),
                    model.objects.request(&t, &sb, req),
                );
                assert_eq!(format!("{ra:?}"), format!("{rb:?}"), "{req:?} in {s:?}");
                let (da, db) = (model.admit(&s, &sa, req), model.admit(&t, &sb, req));
                assert_eq!(format!("{da:?}"), format!("{db:?}"), "{req:?} in {s:?}");
                checked += 1;
            }
            let mut nexts = Vec::new();
            model.successors(
                &s,
                &Lazy::new(&model.objects, &s),
                &mut Memo::default(),
                &mut Fired::default(),
                &mut nexts,
            );
            frontier.extend(nexts.into_iter().map(|n| n.state));
        }
        assert!(checked > 1000, "only {checked} requests compared");
    }

    /// The one-pass tallies are the counts of the methods of their names, in every state
    /// a small model reaches.
    #[test]
    fn tallies_are_the_counts() {
        let (table, bounds) = small_model();
        let model = Model::new(&table, bounds).expect("model");
        let visited = walk(&model, &bounds, 3000, |s, _| {
            let want = Tallies {
                members: s.members(),
                healthy: s.healthy(),
                approved_all: s.approved_all(),
                approved_cps: s.approved_cps(),
                active: s.active(),
                workers: s.workers(),
                serving: s.serving(),
                running: s.running(),
                unfinished: s.unfinished(),
                disruptive: s.disruptive(),
            };
            assert_eq!(s.tallies(), want, "{s:?}");
        });
        assert_eq!(visited, 3000);
    }

    /// Expanding a state with a memo of another state with the same objects gives what
    /// expanding it afresh gives.
    #[test]
    fn a_shared_memo_changes_no_successor() {
        let (table, bounds) = small_model();
        let model = Model::new(&table, bounds).expect("model");
        let mut by_key: std::collections::HashMap<Vec<u8>, State> = Default::default();
        let (mut shared, mut key) = (0, Vec::new());
        let (mut removals, mut guards) = (0usize, 0usize);
        walk(&model, &bounds, 3000, |s, fresh| {
            object_key(s, &mut key);
            if let Some(other) = by_key.get(&key) {
                let mut memo = Memo::default();
                let mut scratch = Vec::new();
                // As the explorer does: the other state's objects (built when first
                // needed) and its decisions.
                let olazy = Lazy::new(&model.objects, other);
                model.successors(
                    other,
                    &olazy,
                    &mut memo,
                    &mut Fired::default(),
                    &mut scratch,
                );
                removals += usize::from(!memo.removals.is_empty());
                guards += usize::from(!memo.guards.is_empty());
                let mut again = Vec::new();
                model.successors(s, &olazy, &mut memo, &mut Fired::default(), &mut again);
                let moves = |v: &[Next]| -> Vec<String> {
                    v.iter()
                        .map(|n| format!("{:?} {:?} {:?}", n.mv, n.state, n.effect))
                        .collect()
                };
                assert_eq!(moves(fresh), moves(&again), "{s:?} after {other:?}");
                shared += 1;
            } else {
                by_key.insert(key.clone(), s.clone());
            }
        });
        assert!(shared > 100, "only {shared} states shared a key");
        // Removal decisions and plan-step guards were among the remembered answers.
        assert!(
            removals > 10 && guards > 10,
            "remembered removals {removals}, guards {guards}"
        );
    }

    /// Bounds a model cannot hold (its indices are bytes) are an error that says the most
    /// it holds, never indices that wrap or collide with `NONE`.
    #[test]
    fn bounds_past_what_a_model_holds_are_refused() {
        assert_eq!(Bounds::default().check(), Ok(()));
        let at = |cps: u8, workers: u8| Bounds {
            max_control_planes: cps,
            max_workers: workers,
            ..Bounds::default()
        };
        assert_eq!(at(60, 4).check(), Ok(()));
        let e = at(60, 5).check().expect_err("65 machines");
        assert!(
            e.0.contains("65 machines") && e.0.contains("at most 64"),
            "{e}"
        );
        assert!(at(255, 255).check().is_err());
        assert!(at(0, 1).check().is_err());
        let ops = Bounds {
            max_operations: 17,
            ..Bounds::default()
        };
        assert!(ops.check().expect_err("ops").0.contains("operations"));
        let fly = Bounds {
            in_flight: 17,
            ..Bounds::default()
        };
        assert!(fly.check().expect_err("in flight").0.contains("in flight"));
    }

    /// `ix` numbers items from 0 as bytes and never hands out `NONE`.
    #[test]
    fn indices_are_bytes_below_none() {
        let items: Vec<u32> = (0..300).collect();
        let got: Vec<(u8, u32)> = ix(&items).map(|(i, v)| (i, *v)).collect();
        assert_eq!(got.len(), usize::from(NONE));
        assert!(got.iter().all(|(i, v)| u32::from(*i) == *v && *i != NONE));
        assert_eq!(ix(&items[..MAX_MACHINES]).count(), MAX_MACHINES);
    }
}
