//! One explored state: its machines (and their nodes), operations, the cluster lock, the
//! TalosCluster and the requests admitted but not yet committed; and how a machine's
//! removal renumbers what refers to machines after it ([`remove_machine`]).

use super::bounds::{GONE, NONE, SIDE};

// Named by doc links only.
#[cfg(doc)]
use super::bounds::{Bounds, OTHER_CLUSTER};

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

    /// In service as far as the controller can know (`workers.serving`): [`Machine::serving`],
    /// or an approved worker that would be, whose node died since the controller's probe
    /// last found it answering (no `unreachable` recorded). No decision can count that death
    /// before a probe sees it; once one has, the worker no longer counts.
    pub fn serving_as_known(&self) -> bool {
        self.approved_worker()
            && !self.deleting
            && (self.up || !self.unreachable)
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
    /// Its node runs Talos 1.13 or later (`--talos 1.13`): the world serves
    /// `ImageService/Pull` and `LifecycleService/Upgrade`, and the executor takes the
    /// upgrade path that pulls and installs first, then reboots the node itself.
    pub lifecycle: bool,
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
            | (u8::from(self.lifecycle) << 6)
    }

    pub fn from_byte(b: u8) -> Boots {
        Boots {
            boot: b & 1 != 0,
            rebooting: b & 2 != 0,
            staged: b & 4 != 0,
            upgraded: b & 8 != 0,
            unsched: b & 16 != 0,
            syncing: b & 32 != 0,
            lifecycle: b & 64 != 0,
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
            // The legacy upgrade (on Talos 1.13 the world counts the reboot of a node that
            // installed the image: `world::ModelWorld::did`).
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
        run: OpRun {
            steps: 0,
            flags: 0,
            more: 0,
        },
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
    /// More of the record's flags ([`OpRun::INSTALLING`], [`OpRun::INSTALLED`],
    /// [`OpRun::OVERDUE`]).
    pub more: u8,
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

    /// `installing`: a Talos 1.13 install (`LifecycleService/Upgrade`) was sent and its
    /// end not seen (in [`OpRun::more`]).
    pub const INSTALLING: u8 = 1;
    /// `installed`: that install ended with exit code 0 (in [`OpRun::more`]).
    pub const INSTALLED: u8 = 2;
    /// The step at hand began longer ago than its `within` (or, for a call sent, than the
    /// executor's deadline for the node to go down): time passed (`--clock`; in
    /// [`OpRun::more`]).
    pub const OVERDUE: u8 = 4;

    pub fn has(self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Whether [`OpRun::more`] has `flag`.
    pub fn has_more(self, flag: u8) -> bool {
        self.more & flag != 0
    }
}

/// The cluster's TalosEtcdBackup as the model sees it (issue 36; [`Bounds::backups`]): the
/// `fresh-backup` rules read its newest verified snapshot. Its store is outside the
/// cluster; the restore's store rules are `eval`'s and `test`'s, not the model's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backup {
    /// No TalosEtcdBackup: the cluster is backed up some other way, or not at all.
    #[default]
    None,
    /// One, with no verified snapshot yet.
    Empty,
    /// One whose newest verified snapshot was just taken.
    Fresh,
    /// One whose newest verified snapshot is older than any recovery point objective a
    /// rule would set ([`super::objects::STALE_SNAPSHOT`]).
    Stale,
}

impl Backup {
    pub fn byte(self) -> u8 {
        match self {
            Backup::None => 0,
            Backup::Empty => 1,
            Backup::Fresh => 2,
            Backup::Stale => 3,
        }
    }

    pub fn from_byte(b: u8) -> Backup {
        match b & 3 {
            0 => Backup::None,
            1 => Backup::Empty,
            2 => Backup::Fresh,
            _ => Backup::Stale,
        }
    }

    /// There is a backup, and its newest verified snapshot is not fresh (none yet, or
    /// stale): `backup.stale`.
    pub fn stale(self) -> bool {
        matches!(self, Backup::Empty | Backup::Stale)
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
    /// Approved workers not being deleted in service as far as the controller can know
    /// ([`Machine::serving_as_known`]).
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
    /// The lock's Lease went unrenewed past its duration (its holder between reconciles
    /// for longer than the Lease lasts): [`crate::runtime::controller::disruptive::may_take_over`]
    /// decides whether other work may take it then. Renewed by its holder's next reconcile.
    pub lock_expired: bool,
    pub pending: Vec<Pending>,
    pub failures: u8,
    /// People's requests admitted so far (counted against `Bounds::max_requests`).
    pub requests: u8,
    pub pdb: bool,
    /// The cluster's TalosEtcdBackup and its newest snapshot.
    pub backup: Backup,
    /// A request was committed while another was in flight (the state is not one that
    /// serialized requests reach through this path).
    pub concurrent: bool,
    /// Stable names of the machines (not part of the state's identity).
    pub names: Vec<u8>,
    /// Stable names of the operations (not part of the state's identity).
    pub op_names: Vec<u8>,
}

/// The most recycled states a thread keeps (a few hundred bytes each).
const SPARE_MAX: usize = 1024;

thread_local! {
    /// States handed back by the explorer ([`State::recycle`]): their lists' allocations
    /// are reused by [`State::fork`] (a successor is a copy of the state it came from).
    static SPARE: std::cell::RefCell<Vec<State>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl State {
    /// A state with nothing in it: no machines, operations or requests, a live cluster
    /// with count 0, the lock free, no backup. Every field is named here, once; the
    /// model's initial states and the decoder fill theirs in from it.
    pub fn blank() -> State {
        State {
            count: 0,
            schedulable: false,
            cluster: ClusterState::Live,
            machines: Vec::new(),
            ops: Vec::new(),
            lock: Lock::Free,
            lock_expired: false,
            pending: Vec::new(),
            failures: 0,
            requests: 0,
            pdb: false,
            backup: Backup::None,
            concurrent: false,
            names: Vec::new(),
            op_names: Vec::new(),
        }
    }

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

    /// Hands a state that is done with back to [`State::fork`] (on this thread; up to
    /// [`SPARE_MAX`] are kept: the explorer forgets thousands of kept successors at once,
    /// which the forks after it reuse).
    pub fn recycle(self) {
        SPARE.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < SPARE_MAX {
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
            lock_expired,
            pending,
            failures,
            requests,
            pdb,
            backup,
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
        self.lock_expired = *lock_expired;
        self.pending.clone_from(pending);
        self.failures = *failures;
        self.requests = *requests;
        self.pdb = *pdb;
        self.backup = *backup;
        self.concurrent = *concurrent;
        self.names.clone_from(names);
        self.op_names.clone_from(op_names);
    }
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
    if t.lock == Lock::Removal(i) {
        t.lock_expired = false;
    }
    t.lock = match t.lock {
        Lock::Removal(h) if h == i => Lock::Free,
        Lock::Removal(h) => Lock::Removal(shift(h)),
        other => other,
    };
    drop_machine(&mut t.pending, i);
}

/// Requests in flight after machine `i` is removed: those about it dropped, the others
/// renumbered ([`remove_machine`]).
pub fn drop_machine(pending: &mut Vec<Pending>, i: u8) {
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
    pending.retain(|p| p.req.machine() != Some(i));
    for p in pending {
        p.req = p.req.map_machine(shift);
    }
}
