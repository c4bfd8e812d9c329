//! The model's world: what the executor's procedures ([`crate::runtime::exec`]) ask of the
//! world, answered from a model [`State`]: etcd's membership and leader, which nodes
//! answer, the cluster lock, the PodDisruptionBudget, the API server's objects. It holds
//! no copy of what the controller does: the controller's procedure runs here as it runs in
//! the cluster, and this only says what each call finds and what it changes.
//!
//! Faults are the world's too: a Talos call that acts (etcd leave, remove-member, a reset)
//! may land and then lose its answer (the caller sees no answer), or land and the
//! controller crash right after it (nothing after it happens; what was recorded stays).

use super::model::{
    Effect, Fired, GONE, Lock, MRole, Memo, NONE, Op, OpRun, Phase, ROLL_MAX, SIDE, Side, State,
    remove_machine, step_index,
};
use crate::compile::PlanStep;
use crate::runtime::exec::{Call, Drained, LockOp, Node, NodeError, Note, Reply, World};
use crate::runtime::live::Reads;
use crate::runtime::objects::{
    NodeProgress, OperationProgress, OperationStatus, Snapshot, TalosMachine, TalosOperation,
};
use crate::runtime::talos::{EtcdMember, EtcdStatus, TalosError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;

/// The model's clock: later than any time its objects record (a reset started at time 0
/// has had every settle time to take).
pub fn now() -> Timestamp {
    Timestamp::from_second(1_767_225_600 + 100_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The image an upgrade of the model goes to, and the version its nodes run before and
/// after: Talos 1.12 (the legacy upgrade path), or 1.13 (`LifecycleService`, in a run whose
/// nodes run it: [`super::model::Boots::lifecycle`]). Each stays within its path.
pub const UPGRADE_IMAGE: &str = "ghcr.io/siderolabs/installer:v1.12.1";
const VERSION_BEFORE: &str = "v1.12.0";
const VERSION_AFTER: &str = "v1.12.1";
pub const UPGRADE_IMAGE_LIFECYCLE: &str = "ghcr.io/siderolabs/installer:v1.13.1";
const VERSION_BEFORE_LIFECYCLE: &str = "v1.13.0";
const VERSION_AFTER_LIFECYCLE: &str = "v1.13.1";

/// The image an upgrade goes to in a cluster whose nodes run Talos 1.13 (`lifecycle`) or
/// 1.12.
pub fn upgrade_image(lifecycle: bool) -> &'static str {
    if lifecycle {
        UPGRADE_IMAGE_LIFECYCLE
    } else {
        UPGRADE_IMAGE
    }
}

/// When the step at hand began, as the model records it: now, or (time passed,
/// [`OpRun::OVERDUE`]) a day before, longer than any `within` and the executor's deadline
/// for a call sent.
fn step_began(overdue: bool) -> Timestamp {
    let now = now();
    if overdue {
        Timestamp::from_second(now.as_second() - 86_400).unwrap_or(now)
    } else {
        now
    }
}

/// The first step of `plan` that sends a destructive call (what `progress.sent` names:
/// the executor's to say).
fn destructive_step(plan: &[PlanStep]) -> Option<&PlanStep> {
    plan.iter()
        .find(|st| crate::runtime::exec::operation::sends_once(st))
}

/// The status of a running (or ended) operation of the model, from what the model keeps
/// of it ([`Op`]: its phase, its record on the node it is at ([`OpRun`]), a roll's
/// `done` of `order` finished, the node it is at and the records of those in flight
/// beside it): what `exec::operation` wrote, read back by it exactly as written
/// ([`operation_run`] is its inverse on everything the procedure reads).
pub fn operation_status(plan: &[PlanStep], o: &Op, order: &[String]) -> OperationStatus {
    let (phase, r) = (o.phase, o.run);
    let roll = o.kind.rolls();
    let started = r.has(OpRun::STARTED);
    let order: Vec<String> = if started { order.to_vec() } else { Vec::new() };
    // One machine's operation keeps "its node is done" as `steps == u8::MAX`.
    let done = if phase == Phase::Succeeded {
        order.len()
    } else if r.steps == u8::MAX {
        usize::from(o.done) + 1
    } else {
        usize::from(o.done)
    };
    let node_done = r.steps == u8::MAX || phase == Phase::Succeeded;
    let at = if roll && phase != Phase::Succeeded {
        usize::from(o.cur)
    } else {
        done
    };
    let mut rec = node_record(plan, if node_done { OpRun::default() } else { r });
    let alongside = if roll && phase != Phase::Succeeded {
        o.sides()
            .filter_map(|x| {
                let node = order.get(usize::from(x.at))?.clone();
                Some(NodeProgress {
                    node,
                    ..node_record(plan, x.run)
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let progress = OperationProgress {
        done: u32::try_from(done).unwrap_or(u32::MAX),
        total: u32::try_from(order.len()).unwrap_or(0),
        node: order.get(at).cloned(),
        step: rec.step.take(),
        step_started_at: rec.step_started_at.take(),
        started_at: started.then(|| Time(now())),
        steps_done: std::mem::take(&mut rec.steps_done),
        order,
        boot_time: rec.boot_time,
        version: rec.version.take(),
        sent: rec.sent.take(),
        installing: rec.installing.take(),
        installed: rec.installed.take(),
        resumed: None,
        cordoned: rec.cordoned,
        was_cordoned: rec.was_cordoned,
        node_registered: rec.node_registered,
        alongside,
    };
    OperationStatus {
        phase: Some(
            match phase {
                Phase::Pending => "Pending",
                Phase::Parked => "Paused",
                Phase::Running => "Running",
                Phase::Succeeded => "Succeeded",
                Phase::Failed => "Failed",
            }
            .into(),
        ),
        conditions: Vec::new(),
        failure_reason: (phase == Phase::Failed).then(|| "failed".to_string()),
        progress: Some(progress),
    }
}

/// One node's record (its name left empty) from the model's [`OpRun`] of it.
fn node_record(plan: &[PlanStep], r: OpRun) -> NodeProgress {
    let steps = usize::from(r.steps);
    let key = |k: usize| format!("{}. {}", k + 1, plan.get(k).map_or("", |s| s.text.as_str()));
    NodeProgress {
        node: String::new(),
        step: r.has(OpRun::IN_STEP).then(|| key(steps)),
        step_started_at: r
            .has(OpRun::IN_STEP)
            .then(|| Time(step_began(r.has_more(OpRun::OVERDUE)))),
        steps_done: (0..steps).map(key).collect(),
        boot_time: r
            .has(OpRun::BOOT_RECORDED)
            .then(|| 1 + u64::from(r.has(OpRun::BOOT))),
        version: r
            .has(OpRun::BOOT_RECORDED)
            .then(|| VERSION_BEFORE.to_string()),
        sent: r
            .has(OpRun::SENT)
            .then(|| destructive_step(plan).map(|st| st.text.clone()))
            .flatten(),
        installing: r
            .has_more(OpRun::INSTALLING)
            .then(|| UPGRADE_IMAGE_LIFECYCLE.to_string()),
        installed: r
            .has_more(OpRun::INSTALLED)
            .then(|| UPGRADE_IMAGE_LIFECYCLE.to_string()),
        cordoned: r.has(OpRun::CORDONED),
        was_cordoned: r.has(OpRun::WAS_CORDONED),
        node_registered: r.has(OpRun::REGISTERED),
    }
}

/// The model's [`OpRun`] of one node's record (`started`: the operation's `startedAt`).
fn run_of(r: &NodeProgress, started: bool) -> OpRun {
    let flag = |on: bool, f: u8| if on { f } else { 0 };
    OpRun {
        steps: u8::try_from(r.steps_done.len()).unwrap_or(u8::MAX - 1),
        flags: flag(started, OpRun::STARTED)
            | flag(r.step.is_some(), OpRun::IN_STEP)
            | flag(r.sent.is_some(), OpRun::SENT)
            | flag(r.boot_time.is_some(), OpRun::BOOT_RECORDED)
            | flag(r.boot_time == Some(2), OpRun::BOOT)
            | flag(r.cordoned, OpRun::CORDONED)
            | flag(r.was_cordoned, OpRun::WAS_CORDONED)
            | flag(r.node_registered, OpRun::REGISTERED),
        more: flag(r.installing.is_some(), OpRun::INSTALLING)
            | flag(r.installed.is_some(), OpRun::INSTALLED)
            | flag(
                r.step_started_at.as_ref().is_some_and(|t| t.0 != now()),
                OpRun::OVERDUE,
            ),
    }
}

/// What the model keeps of an operation's status ([`operation_run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpRecord {
    pub phase: Phase,
    /// Its record on the node it is at.
    pub run: OpRun,
    /// A roll's nodes finished.
    pub done: u8,
    /// A roll's node it is at, as its index in the order.
    pub cur: u8,
    /// A roll's records of the nodes in flight beside it.
    pub side: [Side; SIDE],
}

/// What the model keeps of an operation's status: its phase, its progress on the node it
/// is at ([`OpRun`]), how many of its machines are done, and a roll's nodes in flight.
/// `roll`: the operation rolls over the cluster (its progress on each node is its own);
/// one machine's operation keeps "done" as `steps == u8::MAX`.
pub fn operation_run(status: &OperationStatus, roll: bool) -> Option<OpRecord> {
    let failed = status
        .failure_reason
        .as_deref()
        .is_some_and(|r| !r.is_empty());
    let phase = match status.phase.as_deref() {
        _ if failed => Phase::Failed,
        Some("Running") => Phase::Running,
        Some("Succeeded") => Phase::Succeeded,
        Some("Failed") => Phase::Failed,
        Some("Paused") => Phase::Parked,
        _ if status.progress.is_some() => Phase::Pending,
        _ => return None,
    };
    let mut p = status.progress.clone().unwrap_or_default();
    let started = p.started_at.is_some();
    let position = |name: &str| {
        p.order
            .iter()
            .position(|n| n == name)
            .and_then(|k| u8::try_from(k).ok())
    };
    let cur = p
        .node
        .as_deref()
        .and_then(position)
        .unwrap_or_else(|| u8::try_from(p.done).unwrap_or(u8::MAX));
    let mut side = [Side::NONE; SIDE];
    if roll {
        for (slot, r) in side.iter_mut().zip(&p.alongside) {
            *slot = Side {
                at: position(&r.node).unwrap_or(NONE),
                run: run_of(r, false),
            };
        }
    }
    let top = p.take_node().unwrap_or_default();
    let mut run = run_of(&top, started);
    let done = if roll {
        u8::try_from(p.done).unwrap_or(u8::MAX)
    } else {
        if p.done >= 1 {
            run.steps = u8::MAX;
        }
        0
    };
    Some(OpRecord {
        phase,
        run,
        done,
        cur,
        side,
    })
}

/// The controller crashed: the reconcile ends here.
#[derive(Debug)]
pub struct Crash;

/// Which acting call (counted from 0 in one reconcile) fails, and how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// It lands, and its answer is lost.
    pub lose: Option<u8>,
    /// It lands, and the controller crashes right after.
    pub crash: Option<u8>,
    /// It does not land: the node (or etcd, refusing a reconfiguration it judges unsafe)
    /// answers with an error, and nothing changed.
    pub refuse: Option<u8>,
}

impl Faults {
    /// The faults explored at each of the `acts` acting calls of a reconcile (within the
    /// failure budget), each with the move that names it: its answer lost, the controller
    /// crashed right after it, or it refused. One list for removals and operations alike.
    pub fn each<M: Copy>(
        acts: u8,
        [lost, crash, refused]: [M; 3],
    ) -> impl Iterator<Item = (Faults, M)> {
        (0..acts).flat_map(move |n| {
            [
                (
                    Faults {
                        lose: Some(n),
                        ..Faults::default()
                    },
                    lost,
                ),
                (
                    Faults {
                        crash: Some(n),
                        ..Faults::default()
                    },
                    crash,
                ),
                (
                    Faults {
                        refuse: Some(n),
                        ..Faults::default()
                    },
                    refused,
                ),
            ]
        })
    }
}

/// The etcd member ID of machine `i` of `t`: stable for the machine (from its stable name).
pub fn member_id(t: &State, i: usize) -> u64 {
    let role = t
        .machines
        .get(i)
        .map_or(0, |m| u64::from(m.role == MRole::Worker));
    let n = t.names.get(i).map_or(200 + i as u64, |n| u64::from(*n));
    1 + (role << 8) + n
}

/// The host part of an endpoint (`host:port`).
fn host(endpoint: &str) -> &str {
    endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h)
}

/// One reconcile's world: a state being changed.
pub struct ModelWorld<'a> {
    /// The world, as it is now.
    pub t: State,
    /// The machine whose removal is reconciled (its lock).
    idx: u8,
    /// The objects as the API server holds them when the reconcile reads them.
    snap: &'a Snapshot,
    /// The same, shared, for the reconcile's read (none: this world is not read).
    shared: Option<Arc<Snapshot>>,
    /// The plan, to record progress by step.
    plan: &'a [PlanStep],
    faults: Faults,
    /// Acting calls made so far.
    pub acts: u8,
    /// What happened, as the invariants read it.
    pub effect: Effect,
    /// The state after each status write that changed it: a controller may stop there.
    pub stops: Vec<(State, Effect)>,
    /// When kept (a fault-free run whose faults are explored next): the state and effect
    /// right after each acting call landed, in order. The world is deterministic, so a
    /// controller that crashed right after call `n` left exactly `landed[n]`: the crash
    /// need not be run again.
    pub landed: Option<Vec<(State, Effect)>>,
    /// Warning events published, by reason.
    events: Vec<String>,
    /// The snapshot's index of the machine whose finalizer was released.
    released: Option<usize>,
    fired: &'a mut Fired,
    /// Decisions already made on these objects.
    memo: &'a mut Memo,
    /// The operation reconciled (its index), when this world runs one: the lock is taken
    /// in its name, its status writes are its progress, and its decisions are not the
    /// removal's to remember.
    op: Option<u8>,
}

impl<'a> ModelWorld<'a> {
    pub fn new(
        t: State,
        idx: u8,
        snap: &'a Snapshot,
        shared: Option<Arc<Snapshot>>,
        plan: &'a [PlanStep],
        fired: &'a mut Fired,
        memo: &'a mut Memo,
    ) -> ModelWorld<'a> {
        ModelWorld {
            t,
            idx,
            snap,
            shared,
            plan,
            faults: Faults::default(),
            acts: 0,
            effect: Effect::default(),
            stops: Vec::new(),
            landed: None,
            events: Vec::new(),
            released: None,
            fired,
            memo,
            op: None,
        }
    }

    /// This world running the operation `k` (its machine is the world's `idx`).
    pub fn with_operation(self, k: u8) -> ModelWorld<'a> {
        ModelWorld {
            op: Some(k),
            ..self
        }
    }

    /// Whether machine `j` is the one this world's work acts on: the removed machine, the
    /// operation's target, or any node of a roll over the cluster (a call to a sibling
    /// asks etcd; it acts on no node).
    fn acts_on(&self, j: usize) -> bool {
        let roll = self
            .op
            .and_then(|k| self.t.ops.get(usize::from(k)))
            .is_some_and(|o| o.kind.rolls());
        roll || usize::from(self.idx) == j
    }

    /// The machine whose Kubernetes Node is named `node`.
    fn by_node(&self, node: &str) -> Option<usize> {
        (0..self.snap.machines.len())
            .find(|&k| crate::runtime::exec::etcd::node_name(&self.snap.machines[k]) == node)
            .and_then(|k| self.shifted(k))
    }

    /// The machine `m` names: its index in the state (the snapshot's machines are the
    /// state's, in order, until a finalizer release ends the reconcile).
    /// This world with these faults.
    pub fn with_faults(self, faults: Faults) -> ModelWorld<'a> {
        ModelWorld { faults, ..self }
    }

    /// This world keeping the state after each acting call that landed (`landed`), when
    /// `keep`.
    pub fn keeping_landed(self, keep: bool) -> ModelWorld<'a> {
        ModelWorld {
            landed: keep.then(Vec::new),
            ..self
        }
    }

    fn index(&self, m: &TalosMachine) -> Option<usize> {
        let n = self.snap.machines.len();
        let k = (0..n)
            .find(|&i| std::ptr::eq(&self.snap.machines[i], m))
            .or_else(|| (0..n).find(|&i| self.snap.machines[i].name() == m.name()))?;
        self.shifted(k)
    }

    /// The state's index of the snapshot's machine `k` (none once its finalizer went).
    fn shifted(&self, k: usize) -> Option<usize> {
        match self.released {
            Some(r) if k == r => None,
            Some(r) if k > r => Some(k - 1),
            _ => Some(k),
        }
    }

    /// The machine whose node listens at `h` (its spec.endpoint's host).
    fn at_host(&self, h: &str) -> Option<usize> {
        let k = (0..self.snap.machines.len()).find(|&i| {
            self.snap.machines[i]
                .spec
                .endpoint
                .as_deref()
                .is_some_and(|e| host(e) == h)
        })?;
        self.shifted(k)
    }

    fn step(&mut self, name: &str) {
        self.effect.step = step_index(name);
    }

    fn unreachable(&self, i: usize) -> NodeError {
        NodeError::Talos(TalosError::Unreachable {
            endpoint: format!("{}:50000", self.t.name(i)),
            node: None,
            detail: "the node does not answer".into(),
        })
    }

    fn failed(&self, i: usize, code: tonic::Code, why: &str) -> NodeError {
        NodeError::Talos(TalosError::Failed {
            endpoint: format!("{}:50000", self.t.name(i)),
            node: None,
            code,
            message: why.into(),
        })
    }

    fn leader(&self) -> u64 {
        if !self.t.has_leader() {
            return 0;
        }
        (0..self.t.machines.len())
            .find(|&i| self.t.machines[i].member && self.t.machines[i].etcd_ok())
            .map_or(0, |i| member_id(&self.t, i))
    }

    fn members(&self) -> Vec<EtcdMember> {
        (0..self.t.machines.len())
            .filter(|&i| self.t.machines[i].member)
            .map(|i| {
                let m = self.snap.machines.get(i);
                let endpoint = m.and_then(|m| m.spec.endpoint.as_deref()).unwrap_or("");
                EtcdMember {
                    id: member_id(&self.t, i),
                    hostname: m.map_or_else(|| self.t.name(i), |m| m.name().to_string()),
                    peer_urls: vec![format!("https://{}:2380", host(endpoint))],
                    client_urls: Vec::new(),
                    is_learner: false,
                }
            })
            .collect()
    }

    /// The world's record of what an operation's own calls did: `call`, of the kind of
    /// the operation reconciled, took effect on machine `j` (`operation.undone` reads it).
    /// On Talos 1.13 an upgrade's work is the reboot of a node that installed its image
    /// (`staged`): the controller reboots it itself.
    fn did(&mut self, j: usize, call: &Call, staged: bool) {
        if let Some(o) = self.op.and_then(|k| self.t.ops.get_mut(usize::from(k)))
            && (o.kind.does(call) || (staged && o.kind.upgrades() && matches!(call, Call::Reboot)))
            && let Some(bit) = u8::try_from(j).ok().and_then(|j| o.did_bit(j))
        {
            o.did |= bit;
        }
    }

    /// What a call to the node of machine `j` answers, and what it changes.
    fn call(&mut self, j: usize, call: Call) -> Result<Reply, NodeError> {
        let m = self.t.machines[j];
        if !m.up {
            return Err(self.unreachable(j));
        }
        let not_member =
            |w: &Self| w.failed(j, tonic::Code::FailedPrecondition, "etcd is not running");
        let etcd_call = matches!(
            call,
            Call::EtcdStatus
                | Call::EtcdMemberList
                | Call::EtcdForfeitLeadership
                | Call::EtcdLeaveCluster
                | Call::EtcdRemoveMemberById(_)
        );
        if etcd_call && m.member && m.boots.syncing {
            return Err(self.failed(
                j,
                tonic::Code::Unavailable,
                "etcd is not ready: the member is catching up",
            ));
        }
        match call {
            // An operation's calls: the node goes down now and answers again (a world
            // move, never assumed) with a new boot time, running the upgrade's version
            // after an upgrade, the one before after a rollback.
            Call::SystemStat => Ok(Reply::BootTime(1 + u64::from(m.boots.boot))),
            Call::Version => Ok(Reply::Version(
                match (m.boots.lifecycle, m.boots.upgraded) {
                    (false, false) => VERSION_BEFORE,
                    (false, true) => VERSION_AFTER,
                    (true, false) => VERSION_BEFORE_LIFECYCLE,
                    (true, true) => VERSION_AFTER_LIFECYCLE,
                }
                .into(),
            )),
            Call::Reboot | Call::Shutdown { .. } | Call::UpgradeLegacy { .. } | Call::Rollback => {
                let drained = m.cordoned;
                let tm = &mut self.t.machines[j];
                tm.up = false;
                tm.boots.rebooting = true;
                match call {
                    Call::UpgradeLegacy { .. } => tm.boots.staged = true,
                    Call::Rollback => {
                        tm.boots.staged = false;
                        tm.boots.upgraded = false;
                    }
                    _ => {}
                }
                // A member taken down: the majority it leaves is `healthy-majority`'s, and
                // the other members down at that moment are `one-member-down`'s.
                self.effect.ours |= m.member;
                if m.member {
                    let others = (0..self.t.machines.len())
                        .filter(|&k| {
                            k != j && self.t.machines[k].member && !self.t.machines[k].etcd_ok()
                        })
                        .count();
                    let others = u8::try_from(others).unwrap_or(u8::MAX);
                    self.effect.down_others = self.effect.down_others.max(others);
                }
                self.effect.undrained |= self.acts_on(j) && !drained;
                self.did(j, &call, m.boots.staged);
                self.step("node-down");
                Ok(Reply::Done)
            }
            // Nodes of the model run a Talos before 1.13: the legacy upgrade path.
            // The model's clusters exist: their etcd was bootstrapped long ago.
            Call::Bootstrap => Err(self.failed(
                j,
                tonic::Code::FailedPrecondition,
                "etcd is already running on the node",
            )),
            // Their etcd data directories hold data (the cluster's etcd).
            Call::List { .. } => Ok(Reply::Entries(1)),
            // Talos 1.12 serves neither; 1.13 pulls (into its containerd: nothing the
            // model follows) and installs the pulled image without a reboot: the next boot
            // runs it. A failed install (its stream's non-zero exit code) is the refused
            // fault's (`talos`).
            Call::ImagePull { .. } | Call::LifecycleUpgrade { .. } if !m.boots.lifecycle => {
                Err(self.failed(
                    j,
                    tonic::Code::Unimplemented,
                    "the node runs Talos v1.12: LifecycleService is not served",
                ))
            }
            Call::ImagePull { image } => Ok(Reply::Pulled(image)),
            Call::LifecycleUpgrade { .. } => {
                self.t.machines[j].boots.staged = true;
                Ok(Reply::Installed {
                    exit_code: 0,
                    last_message: "upgrade successful".into(),
                })
            }
            Call::EtcdStatus => {
                if !m.member {
                    return Err(not_member(self));
                }
                Ok(Reply::Status(EtcdStatus {
                    member_id: member_id(&self.t, j),
                    leader: self.leader(),
                    protocol_version: "3.5.0".into(),
                    db_size: 0,
                    db_size_in_use: 0,
                    raft_index: 0,
                    raft_term: 0,
                    raft_applied_index: 0,
                    errors: Vec::new(),
                    is_learner: false,
                }))
            }
            Call::EtcdMemberList => {
                if !m.member {
                    return Err(not_member(self));
                }
                if !self.t.has_leader() {
                    return Err(self.failed(j, tonic::Code::DeadlineExceeded, "no leader"));
                }
                Ok(Reply::Members(self.members()))
            }
            Call::EtcdForfeitLeadership => {
                if !m.member {
                    return Err(not_member(self));
                }
                self.step("forfeit-leadership");
                Ok(Reply::Done)
            }
            Call::EtcdLeaveCluster => {
                if !m.member {
                    return Err(not_member(self));
                }
                if !self.t.has_leader() {
                    return Err(self.failed(j, tonic::Code::DeadlineExceeded, "no leader"));
                }
                self.t.machines[j].member = false;
                self.effect.ours = true;
                self.step("etcd-leave");
                Ok(Reply::Done)
            }
            Call::EtcdRemoveMemberById(id) => {
                if !m.member {
                    return Err(not_member(self));
                }
                if !self.t.has_leader() {
                    return Err(self.failed(j, tonic::Code::DeadlineExceeded, "no leader"));
                }
                let Some(k) = (0..self.t.machines.len())
                    .find(|&k| self.t.machines[k].member && member_id(&self.t, k) == id)
                else {
                    return Err(self.failed(j, tonic::Code::NotFound, "member not found"));
                };
                self.effect.removed_dead |= !self.t.machines[k].up;
                self.t.machines[k].member = false;
                self.effect.ours = true;
                self.step("remove-member");
                Ok(Reply::Done)
            }
            Call::Reset { graceful } => {
                if graceful && m.member {
                    // A graceful reset leaves etcd first; that needs a leader.
                    if !self.t.has_leader() {
                        return Err(self.failed(j, tonic::Code::DeadlineExceeded, "no leader"));
                    }
                    self.t.machines[j].member = false;
                }
                let drained = m.cordoned;
                let tm = &mut self.t.machines[j];
                tm.up = false;
                tm.wiped = true;
                tm.unreachable = false;
                self.effect.ours |= m.member;
                self.effect.undrained |= self.acts_on(j) && !drained;
                self.did(j, &call, false);
                self.step(if graceful { "reset" } else { "wipe" });
                Ok(Reply::Done)
            }
        }
    }

    /// Records a status written for machine `i`: its removal's progress.
    fn record(&mut self, i: usize, after: &TalosMachine) {
        let Some(p) = progress(self.plan, after) else {
            return;
        };
        let m = &mut self.t.machines[i];
        (m.done, m.started, m.committed, m.dead, m.recorded) =
            (p.done, p.started, p.committed, p.dead, p.recorded);
    }
}

impl crate::runtime::exec::operation::OperationWorld for ModelWorld<'_> {
    async fn write_operation(
        &mut self,
        _before: &TalosOperation,
        after: &TalosOperation,
    ) -> Result<(), Crash> {
        let (Some(k), Some(status)) = (self.op, &after.status) else {
            return Ok(());
        };
        let roll = self
            .t
            .ops
            .get(usize::from(k))
            .is_some_and(|o| o.kind.rolls());
        let Some(rec) = operation_run(status, roll) else {
            return Ok(());
        };
        // A roll's order, as machine indices (a name no machine has any more: gone).
        let mut order = [NONE; ROLL_MAX];
        if roll && let Some(p) = &status.progress {
            for (slot, name) in order.iter_mut().zip(&p.order) {
                *slot = (0..self.t.machines.len())
                    .find(|&j| self.t.name(j) == *name)
                    .and_then(|j| u8::try_from(j).ok())
                    .unwrap_or(GONE);
            }
        }
        if let Some(o) = self.t.ops.get_mut(usize::from(k)) {
            o.phase = rec.phase;
            o.run = rec.run;
            if roll {
                o.order = order;
                o.done = rec.done;
                o.cur = rec.cur;
                o.side = rec.side;
            }
        }
        Ok(())
    }

    async fn operation_event(
        &mut self,
        _on: &TalosOperation,
        warning: bool,
        reason: &str,
        _note: String,
    ) {
        if warning {
            self.events.push(reason.to_string());
        }
    }

    async fn cordon(
        &mut self,
        node: &str,
        on: bool,
    ) -> Result<Result<Option<bool>, String>, Crash> {
        let Some(j) = self.by_node(node) else {
            return Ok(Ok(None));
        };
        let m = &mut self.t.machines[j];
        let was = m.boots.unsched;
        m.boots.unsched = on;
        if !on {
            // Back in service: workloads come back to it.
            m.cordoned = false;
        }
        Ok(Ok(Some(was)))
    }

    async fn node_ready(&mut self, node: &str) -> Result<Result<Option<bool>, String>, Crash> {
        Ok(Ok(self.by_node(node).and_then(|j| {
            let m = self.t.machines[j];
            m.joined.then_some(m.up && !m.wiped)
        })))
    }
}

/// A removal's progress as the model keeps it: the plan steps done (bits by index), the
/// step started (index + 1; 0 for none), committed, memberDead, and whether a member ID
/// is recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub done: u16,
    pub started: u8,
    pub committed: bool,
    pub dead: bool,
    pub recorded: bool,
}

/// What `m`'s `status.removal` records, in the model's terms (`None`: no record); the
/// conformance replay reads the API server's objects with it too.
pub fn progress(plan: &[PlanStep], m: &TalosMachine) -> Option<Progress> {
    let p = m.removal_progress()?;
    let mut done = 0u16;
    for (k, st) in plan.iter().enumerate() {
        if p.done.iter().any(|d| d == &st.text) && k < 16 {
            done |= 1 << k;
        }
    }
    let started = plan
        .iter()
        .position(|st| p.started.as_deref() == Some(st.text.as_str()))
        .and_then(|k| u8::try_from(k + 1).ok())
        .unwrap_or(0);
    Some(Progress {
        done,
        started,
        committed: p.committed,
        dead: p.member_dead,
        recorded: p.member_id.is_some(),
    })
}

impl World for ModelWorld<'_> {
    type Error = Crash;

    fn now(&self) -> Timestamp {
        now()
    }

    async fn credentials(&mut self, _cluster: &str) -> Result<(), String> {
        Ok(())
    }

    async fn talos(
        &mut self,
        _cluster: &str,
        node: Node<'_>,
        call: Call,
    ) -> Result<Result<Reply, NodeError>, Crash> {
        let j = match node {
            Node::Endpoint(m) => self.index(m),
            Node::Via(via, h) => match self.index(via) {
                Some(v) if !self.t.machines[v].up => return Ok(Err(self.unreachable(v))),
                Some(_) => self.at_host(h),
                None => None,
            },
            // Every node of the model has its configuration: none answers there.
            Node::Maintenance(_) => None,
        };
        let Some(j) = j else {
            return Ok(Err(NodeError::Talos(TalosError::Unreachable {
                endpoint: "nowhere".into(),
                node: None,
                detail: "no node answers there".into(),
            })));
        };
        let acts = call.acts();
        let install = matches!(call, Call::LifecycleUpgrade { .. });
        let refusing = acts && self.faults.refuse == Some(self.acts);
        let undo = refusing.then(|| (self.t.clone(), self.effect));
        let answer = self.call(j, call);
        if acts && answer.is_ok() {
            let n = self.acts;
            self.acts = self.acts.saturating_add(1);
            if let Some(landed) = &mut self.landed
                && undo.is_none()
            {
                landed.push((self.t.clone(), self.effect));
            }
            if let Some((t, effect)) = undo {
                (self.t, self.effect) = (t, effect);
                // An install that fails ends its stream with a non-zero exit code.
                if install {
                    return Ok(Ok(Reply::Installed {
                        exit_code: 1,
                        last_message: "failed to install the image: nothing changed".into(),
                    }));
                }
                return Ok(Err(self.failed(
                    j,
                    tonic::Code::FailedPrecondition,
                    "refused: nothing changed",
                )));
            }
            if self.faults.crash == Some(n) {
                return Err(Crash);
            }
            if self.faults.lose == Some(n) {
                return Ok(Err(self.unreachable(j)));
            }
        }
        Ok(answer)
    }

    async fn lock(&mut self, _cluster: &str, op: LockOp) -> Result<Result<(), String>, Crash> {
        let mine = match self.op {
            Some(k) => Lock::Operation(k),
            None => Lock::Removal(self.idx),
        };
        // Other work's lock is taken over as the controller's `acquire` decides: work of
        // this model is over only as a finished operation (a removal's lock goes with its
        // machine); the Lease's expiry is the state's.
        use crate::runtime::controller::disruptive::{HolderWork, may_take_over};
        let held_by_other = match self.t.lock {
            Lock::Free => None,
            l if l == mine => None,
            Lock::Removal(_) => Some(HolderWork::Running),
            Lock::Operation(k) => Some(match self.t.ops.get(usize::from(k)).map(|o| o.phase) {
                Some(super::model::Phase::Succeeded | super::model::Phase::Failed) | None => {
                    HolderWork::Over
                }
                Some(_) => HolderWork::Running,
            }),
        };
        let take_over = held_by_other.is_some_and(|work| may_take_over(work, self.t.lock_expired));
        match op {
            LockOp::Take => match self.t.lock {
                Lock::Free => {
                    self.t.lock = mine;
                    self.t.lock_expired = false;
                    if self.op.is_none() {
                        self.step("lock");
                    }
                    Ok(Ok(()))
                }
                // Renewed by its holder.
                l if l == mine => {
                    self.t.lock_expired = false;
                    Ok(Ok(()))
                }
                _ if take_over => {
                    self.t.lock = mine;
                    self.t.lock_expired = false;
                    if self.op.is_none() {
                        self.step("lock");
                    }
                    Ok(Ok(()))
                }
                // The holders' names are the product's (`exec::{removal, operation}::holder`).
                Lock::Removal(h) => Ok(Err(crate::runtime::exec::removal::holder(
                    super::model::NAMESPACE,
                    &self.t.name(h),
                ))),
                Lock::Operation(k) => Ok(Err(crate::runtime::exec::operation::holder(
                    super::model::NAMESPACE,
                    &self.t.op_name(k),
                ))),
            },
            LockOp::Release => {
                if self.t.lock == mine {
                    self.t.lock = Lock::Free;
                    self.t.lock_expired = false;
                }
                Ok(Ok(()))
            }
            LockOp::Keep => Ok(Ok(())),
        }
    }

    async fn read(&mut self, _cluster: &str, _reads: Reads) -> Result<Arc<Snapshot>, Crash> {
        self.shared.clone().ok_or(Crash)
    }

    async fn drain(&mut self, node: &str) -> Result<Result<Drained, String>, Crash> {
        if self.t.pdb {
            return Ok(Ok(Drained::Blocked {
                pod: "default/app-0".into(),
                message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            }));
        }
        // The Kubernetes Node of that name is cordoned and empty.
        if let Some(j) = self.by_node(node) {
            self.t.machines[j].cordoned = true;
            self.t.machines[j].boots.unsched = true;
        }
        self.step("drain");
        Ok(Ok(Drained::Done))
    }

    async fn write_status(
        &mut self,
        _before: &TalosMachine,
        after: &TalosMachine,
    ) -> Result<Option<String>, Crash> {
        if let Some(i) = self.index(after) {
            let was = self.t.machines[i];
            self.record(i, after);
            if self.t.machines[i] != was {
                self.stops.push((self.t.clone(), self.effect));
            }
        }
        Ok(None)
    }

    async fn release_finalizer(&mut self, m: &TalosMachine) -> Result<(), Crash> {
        let Some(i) = self.index(m) else {
            return Ok(());
        };
        let x = self.t.machines[i];
        let below = self.t.count > 0
            && self.t.cluster != super::model::ClusterState::Deleting
            && x.dead
            && self.t.approved_cps() < usize::from(self.t.count);
        // Said: a Warning event of the plan's published in this reconcile or an earlier one
        // (whatever the rules call its reason: the word is theirs).
        let warned =
            !self.events.is_empty()
                || self.plan.iter().enumerate().any(|(k, st)| {
                    x.done & (1 << k) != 0 && crate::runtime::exec::removal::warns(st)
                });
        // The plan's own release (the machine is still an approved control plane: its
        // removal ran), or the release of one that no longer is (nothing of the plan ran).
        let by_plan = x.approved_cp();
        self.effect.event_missing = by_plan && below && !warned;
        self.effect.left_member = x.member;
        // Its node still up, never reset nor wiped (either takes it down), although the
        // controller could reach it: neither found dead nor reported unreachable.
        self.effect.left_running = by_plan && x.up && !x.dead && !x.unreachable;
        self.step("release-finalizer");
        if let Ok(k) = u8::try_from(i) {
            remove_machine(&mut self.t, k);
            self.released = Some(i);
        }
        Ok(())
    }

    async fn event(&mut self, _on: &TalosMachine, warning: bool, reason: &str, _note: String) {
        if warning {
            self.events.push(reason.to_string());
        }
    }

    fn note(&mut self, _on: &TalosMachine, note: Note<'_>) {
        match note {
            Note::Decided(d) => self.fired.note(d),
            // The removal plan's steps (an operation's plan is another).
            Note::Step(k, _) if self.op.is_none() => {
                self.fired.steps.insert(k);
            }
            _ => {}
        }
    }

    // Decisions depend on the objects alone (and the facts supplied): remembered for the
    // states that share this one's objects ([`super::model::object_key`]). Only the
    // reconciled machine's removal is decided here.
    fn decide(
        &mut self,
        table: &crate::compile::Table,
        snapshot: &Snapshot,
        ev: crate::runtime::facts::EventFacts<'_>,
        supplied: &[(crate::vocab::Fact, i64)],
    ) -> Result<crate::interp::Decision, crate::vocab::Fact> {
        if self.op.is_some() {
            return crate::runtime::exec::rules::decide(table, snapshot, ev, supplied);
        }
        let idx = self.idx;
        if let Some((_, _, d)) = self
            .memo
            .removals
            .iter()
            .find(|(i, s, _)| *i == idx && s.as_slice() == supplied)
        {
            return d.clone();
        }
        let d = crate::runtime::exec::rules::decide(table, snapshot, ev, supplied);
        self.memo.removals.push((idx, supplied.to_vec(), d.clone()));
        d
    }

    fn applies(
        &mut self,
        table: &crate::compile::Table,
        snapshot: &Snapshot,
        ev: crate::runtime::facts::EventFacts<'_>,
        supplied: &[(crate::vocab::Fact, i64)],
        k: usize,
        step: &PlanStep,
    ) -> Result<(bool, Option<String>), String> {
        if self.op.is_some() {
            return crate::runtime::exec::rules::applies(table, snapshot, ev, supplied, step);
        }
        let (idx, k8) = (self.idx, u8::try_from(k).unwrap_or(u8::MAX));
        if let Some((_, _, _, r)) = self
            .memo
            .guards
            .iter()
            .find(|(i, j, s, _)| *i == idx && *j == k8 && s.as_slice() == supplied)
        {
            return r.clone();
        }
        let r = crate::runtime::exec::rules::applies(table, snapshot, ev, supplied, step);
        self.memo
            .guards
            .push((idx, k8, supplied.to_vec(), r.clone()));
        r
    }
}

/// A decision with the expensive facts it needs asked of this state's world, through the
/// executor's one loop ([`crate::runtime::exec::rules::decide_asking`]): what the
/// controller decides on this state (`departing`: the machine whose etcd is asked about).
/// A fact that cannot be read refuses.
pub fn ask_and_decide(
    table: &crate::compile::Table,
    s: &State,
    snap: &Snapshot,
    ev: crate::runtime::facts::EventFacts<'_>,
    departing: Option<&TalosMachine>,
    fired: &mut Fired,
) -> crate::interp::Decision {
    let mut memo = Memo::default();
    let mut w = ModelWorld::new(
        s.fork(),
        super::model::NONE,
        snap,
        None,
        &[],
        fired,
        &mut memo,
    );
    let marked = departing.is_some_and(|m| {
        m.dead_member_removal_marked() || m.removal_progress().is_some_and(|p| p.member_dead)
    });
    let refuse = |f: crate::vocab::Fact, why: &str| crate::interp::Finding {
        rule: "(live state)".into(),
        verdict: crate::vocab::Verdict::Refuse,
        message: format!("`{f}` could not be read {why}"),
        reason: None,
    };
    let asked = crate::runtime::exec::run_now(crate::runtime::exec::rules::decide_asking(
        &mut w, table, snap, ev, departing, marked, &refuse,
    ));
    match asked {
        Some(Ok(a)) => a.decision,
        _ => {
            let mut d = crate::interp::Decision::default();
            d.refusals
                .push(refuse(crate::vocab::Fact::MemberDead, "(no answer)"));
            d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::{Bounds, ClusterState, Lazy, Memo, Model, Move, Next, State};
    use super::*;

    fn model_of(table: &crate::compile::Table) -> (Model<'_>, State) {
        let bounds = Bounds {
            max_control_planes: 3,
            max_workers: 0,
            max_failures: 1,
            max_operations: 0,
            in_flight: 0,
            max_requests: None,
            depth: 64,
            rolls: false,
            roll_width: 1,
            roll_kind: crate::verify::RollKind::Reboot,
            all_kinds: false,
            backups: false,
            lifecycle: false,
            clock: false,
        };
        let model = Model::new(table, bounds).expect("model");
        let s = State::initial(&bounds)
            .into_iter()
            .find(|s| s.count == 3 && s.cluster == ClusterState::Live)
            .expect("a healthy cluster of three");
        (model, s)
    }

    fn removals(model: &Model<'_>, s: &State) -> Vec<Next> {
        let mut out = Vec::new();
        model.successors(
            s,
            &Lazy::new(&model.objects, s),
            &mut Memo::default(),
            &mut Fired::default(),
            &mut out,
        );
        out.retain(|n| {
            matches!(
                n.mv,
                Move::Removal(0) | Move::RemovalLost(0) | Move::RemovalCrash(0)
            )
        });
        out
    }

    fn bit(model: &Model<'_>, text: &str) -> u16 {
        let k = model
            .objects
            .plan
            .unwrap_or(&[])
            .iter()
            .position(|st| st.text == text)
            .expect("a step of the shipped plan");
        1 << k
    }

    /// A reset this removal took as done because its node had stopped answering (it may
    /// have been sent before a crash) is checked again before the finalizer goes: the node
    /// answers as itself now, so it is reset, never released running (a hole `verify`
    /// found once the model ran the controller's own procedure with crashes between its
    /// record and its call).
    #[test]
    fn a_reset_inferred_from_silence_is_checked_before_the_finalizer_goes() {
        let table = crate::ruleset::shipped_table();
        let (model, mut s) = model_of(&table);
        let before_reset = [
            "lock cluster",
            "drain node",
            "etcd forfeit-leadership",
            "etcd leave",
        ]
        .iter()
        .fold(0, |d, t| d | bit(&model, t));
        let m = &mut s.machines[0];
        m.deleting = true;
        m.member = false;
        m.committed = true;
        m.cordoned = true;
        m.done = before_reset | bit(&model, "talos reset");
        let nexts = removals(&model, &s);
        assert!(!nexts.is_empty());
        for n in &nexts {
            // The machine is still there, and the reset is to be done again.
            let m = n.state.machines.first().expect("machine 0");
            assert!(m.deleting, "{:?} released it: {m:?}", n.mv);
            if m.up {
                assert_eq!(m.done & bit(&model, "talos reset"), 0, "{:?}: {m:?}", n.mv);
            }
        }
        // The reconcile after that sends the reset, and then the machine goes.
        let again = nexts
            .iter()
            .find(|n| matches!(n.mv, Move::Removal(0)))
            .expect("a reconcile");
        let last = removals(&model, &again.state);
        assert!(
            last.iter().any(|n| matches!(n.mv, Move::Removal(0))
                && n.state.machines.len() == 2
                && !n.effect.left_running),
            "{:?}",
            last.iter()
                .map(|n| (n.mv, n.state.machines.len()))
                .collect::<Vec<_>>()
        );
    }

    /// Calls whose answers are lost (they took: a member left, a node went down) do not
    /// strand the removal: the record of a reset stays until the node is seen down, and the
    /// removal ends (before, a lost answer to a reset cleared its record, and the removal
    /// sent it again to a node that never answers again, forever).
    #[test]
    fn a_lost_answer_to_a_reset_does_not_strand_the_removal() {
        let table = crate::ruleset::shipped_table();
        let (model, mut s) = model_of(&table);
        // Two stay of a declared one: the rules let the removal through.
        s.count = 1;
        s.machines[0].deleting = true;
        let mut state = s;
        // Follow the reconciles, taking the lost answer whenever there is one.
        for _ in 0..6 {
            let nexts = removals(&model, &state);
            let Some(n) = nexts
                .iter()
                .find(|n| matches!(n.mv, Move::RemovalLost(0)))
                .or_else(|| {
                    nexts
                        .iter()
                        .rev()
                        .find(|n| matches!(n.mv, Move::Removal(0)))
                })
            else {
                break;
            };
            state = n.state.clone();
            if state.machines.len() == 2 {
                return;
            }
        }
        panic!("the removal did not end: {state:?}");
    }

    /// A reboot rolled over the whole cluster runs through the executor node by node in
    /// the model: each approved control plane in turn, one down at a time, each back (its
    /// etcd member caught up) before the next goes down; and once it failed, nothing more
    /// is done for it.
    #[test]
    fn a_roll_over_the_cluster_reboots_each_node_once_one_at_a_time() {
        use super::super::model::{Op, OpKind};
        let table = crate::ruleset::shipped_table();
        let bounds = Bounds {
            max_control_planes: 3,
            max_workers: 0,
            max_failures: 0,
            max_operations: 1,
            in_flight: 0,
            max_requests: None,
            depth: 64,
            rolls: true,
            roll_width: 1,
            roll_kind: crate::verify::RollKind::Reboot,
            all_kinds: false,
            backups: false,
            lifecycle: false,
            clock: false,
        };
        let model = Model::new(&table, bounds).expect("model");
        let mut state = State::initial(&bounds)
            .into_iter()
            .find(|s| s.count == 3 && s.cluster == ClusterState::Live)
            .expect("a healthy cluster of three");
        state.ops.push(Op::new(OpKind::Roll, NONE));
        state.op_names.push(1);
        let mut downs: Vec<usize> = Vec::new();
        for _ in 0..200 {
            if state.ops[0].phase == Phase::Succeeded {
                break;
            }
            let mut out = Vec::new();
            model.successors(
                &state,
                &Lazy::new(&model.objects, &state),
                &mut Memo::default(),
                &mut Fired::default(),
                &mut out,
            );
            // The controller first; else the world's recovery (a node back, etcd caught up).
            let next = out
                .iter()
                .find(|n| matches!(n.mv, Move::Operation(0)))
                .or_else(|| {
                    out.iter()
                        .find(|n| matches!(n.mv, Move::NodeReturns(_) | Move::EtcdCatchesUp(_)))
                })
                .unwrap_or_else(|| {
                    panic!(
                        "stuck at {state:?}: {:?}",
                        out.iter().map(|n| n.mv).collect::<Vec<_>>()
                    )
                });
            for (j, m) in next.state.machines.iter().enumerate() {
                if !m.up && state.machines[j].up {
                    downs.push(j);
                }
            }
            let down = next.state.machines.iter().filter(|m| !m.etcd_ok()).count();
            assert!(down <= 1, "two down at once: {:?}", next.state);
            assert!(!next.effect.undrained, "{:?}", next.mv);
            state = next.state.clone();
        }
        let o = state.ops[0];
        assert_eq!(o.phase, Phase::Succeeded, "{state:?}");
        assert_eq!(downs, [0, 1, 2], "each control plane once, in order");
        assert_eq!(o.roll_order().collect::<Vec<_>>(), [0, 1, 2]);
        assert!(
            state
                .machines
                .iter()
                .all(|m| m.boots.boot && m.etcd_ok() && !m.boots.unsched)
        );

        // Failed at the second node: a reconcile of it touches nothing.
        let mut failed = state.clone();
        failed.ops[0].phase = Phase::Failed;
        failed.ops[0].done = 1;
        failed.ops[0].cur = 1;
        failed.ops[0].run = OpRun {
            steps: 1,
            flags: OpRun::STARTED,
            more: 0,
        };
        let mut out = Vec::new();
        model.successors(
            &failed,
            &Lazy::new(&model.objects, &failed),
            &mut Memo::default(),
            &mut Fired::default(),
            &mut out,
        );
        assert!(
            !out.iter().any(|n| matches!(n.mv, Move::Operation(0))),
            "{:?}",
            out.iter().map(|n| n.mv).collect::<Vec<_>>()
        );
    }

    /// The model of one machine's upgrade of control plane 0 in a healthy cluster of three
    /// (`lifecycle`: its nodes run Talos 1.13; `clock`: time passes), with a failure.
    fn upgrade_of(
        table: &crate::compile::Table,
        lifecycle: bool,
        clock: bool,
    ) -> (Model<'_>, State) {
        use super::super::model::{Op, OpKind};
        let bounds = Bounds {
            max_control_planes: 3,
            max_workers: 0,
            max_failures: 1,
            max_operations: 1,
            in_flight: 0,
            max_requests: None,
            depth: 64,
            rolls: false,
            roll_width: 1,
            roll_kind: crate::verify::RollKind::Reboot,
            all_kinds: false,
            backups: false,
            lifecycle,
            clock,
        };
        let model = Model::new(table, bounds).expect("model");
        let mut state = State::initial(&bounds)
            .into_iter()
            .find(|s| s.count == 3 && s.cluster == ClusterState::Live)
            .expect("a healthy cluster of three");
        state.ops.push(Op::new(OpKind::Upgrade, 0));
        state.op_names.push(1);
        (model, state)
    }

    fn all_next(model: &Model<'_>, s: &State) -> Vec<Next> {
        let mut out = Vec::new();
        model.successors(
            s,
            &Lazy::new(&model.objects, s),
            &mut Memo::default(),
            &mut Fired::default(),
            &mut out,
        );
        out
    }

    /// The controller's reconcile of the operation; else the world's recovery (a node
    /// back, etcd caught up).
    fn drive<'n>(out: &'n [Next], s: &State) -> &'n Next {
        out.iter()
            .find(|n| matches!(n.mv, Move::Operation(0)) && n.state != *s)
            .or_else(|| {
                out.iter()
                    .find(|n| matches!(n.mv, Move::NodeReturns(_) | Move::EtcdCatchesUp(_)))
            })
            .unwrap_or_else(|| {
                panic!(
                    "stuck at {s:?}: {:?}",
                    out.iter().map(|n| n.mv).collect::<Vec<_>>()
                )
            })
    }

    /// On Talos 1.13 the model's upgrade takes the executor's `LifecycleService` path: the
    /// image is pulled and installed (the node keeps running) before the node is cordoned
    /// (a crash right after the install finds it installed and uncordoned);
    /// the controller then reboots it, drained, and it comes back running the new version.
    /// An install whose stream ends with a non-zero exit code (the refused fault there)
    /// fails the operation with the node never taken down; one whose answer is lost, or
    /// after which the controller crashes, is not sent again: the next reconcile fails
    /// the operation, the node still up. On Talos 1.12 no image is pulled.
    #[test]
    fn a_talos_1_13_upgrade_installs_before_it_cordons_and_a_failed_install_reboots_nothing() {
        let table = crate::ruleset::shipped_table();
        let (model, mut state) = upgrade_of(&table, true, false);
        let (mut failed_install, mut unseen_install) = (0, 0);
        let mut installed_up = false;
        for _ in 0..200 {
            if state.ops[0].phase == Phase::Succeeded {
                break;
            }
            let out = all_next(&model, &state);
            for n in &out {
                let (a, b) = (state.machines[0], n.state.machines[0]);
                // Never down without the new image installed first, nor undrained.
                let controller = matches!(
                    n.mv,
                    Move::Operation(0)
                        | Move::OperationLost(0)
                        | Move::OperationCrash(0)
                        | Move::OperationRefused(0)
                );
                if controller && a.up && !b.up {
                    assert!(b.boots.staged, "rebooted uninstalled: {:?}", n.mv);
                    assert!(!n.effect.undrained, "{:?}", n.mv);
                }
                let installing = !state.ops[0].run.has_more(OpRun::INSTALLED)
                    && !state.ops[0].run.has_more(OpRun::INSTALLING);
                match n.mv {
                    // The stream's exit code 1: failed, nothing installed, node up.
                    Move::OperationRefused(0)
                        if installing && n.state.ops[0].phase == Phase::Failed =>
                    {
                        assert!(b.up && !b.boots.staged && b.boots.boot == a.boots.boot);
                        failed_install += 1;
                    }
                    // Its end not seen: recorded as installing; the next reconcile fails
                    // the operation and the node is never taken down.
                    Move::OperationLost(0) | Move::OperationCrash(0)
                        if n.state.ops[0].run.has_more(OpRun::INSTALLING) =>
                    {
                        let after = all_next(&model, &n.state);
                        let next = after
                            .iter()
                            .find(|x| matches!(x.mv, Move::Operation(0)))
                            .expect("a reconcile");
                        assert_eq!(next.state.ops[0].phase, Phase::Failed, "{:?}", next.state);
                        assert!(next.state.machines[0].up);
                        unseen_install += 1;
                        // Crashed right after the install: it ran on the node, up and not
                        // cordoned yet.
                        if matches!(n.mv, Move::OperationCrash(0)) {
                            assert!(b.up && b.boots.staged && !b.boots.unsched, "{b:?}");
                            installed_up = true;
                        }
                    }
                    _ => {}
                }
            }
            state = drive(&out, &state).state.clone();
        }
        assert_eq!(state.ops[0].phase, Phase::Succeeded, "{state:?}");
        assert!(state.machines[0].boots.upgraded && state.machines[0].up);
        assert!(installed_up, "the image was installed while the node ran");
        assert!(failed_install > 0, "a failed install was explored");
        assert!(
            unseen_install > 0,
            "an install whose end was not seen was explored"
        );

        // Talos 1.12: the legacy `Upgrade` installs and reboots in one call.
        let (model, mut state) = upgrade_of(&table, false, false);
        for _ in 0..200 {
            if state.ops[0].phase == Phase::Succeeded {
                break;
            }
            let out = all_next(&model, &state);
            let next = drive(&out, &state);
            assert!(!next.state.ops[0].run.has_more(OpRun::INSTALLED));
            assert!(!next.state.machines[0].boots.staged || !next.state.machines[0].up);
            state = next.state.clone();
        }
        assert_eq!(state.ops[0].phase, Phase::Succeeded, "{state:?}");
    }

    /// With the clock, time passes at a gate with a `within` (an environment move, never
    /// the controller's progress): the node taken down by the upgrade does not come back
    /// within `wait node-back`'s 15m, and the executor fails the operation (phase Failed,
    /// a failureReason); a reconcile of it after that touches nothing. Without the clock
    /// time never passes.
    #[test]
    fn with_the_clock_a_gate_that_does_not_pass_in_time_fails_the_operation() {
        let table = crate::ruleset::shipped_table();
        for clock in [false, true] {
            let (model, mut state) = upgrade_of(&table, false, clock);
            // Up to the node taken down by the upgrade, the operation waiting for it.
            for _ in 0..200 {
                if !state.machines[0].up {
                    break;
                }
                let out = all_next(&model, &state);
                state = drive(&out, &state).state.clone();
            }
            assert!(!state.machines[0].up, "{state:?}");
            let out = all_next(&model, &state);
            let passes: Vec<&Next> = out
                .iter()
                .filter(|n| matches!(n.mv, Move::TimePasses(0)))
                .collect();
            if !clock {
                assert!(passes.is_empty());
                continue;
            }
            assert_eq!(passes.len(), 1);
            assert!(!Move::TimePasses(0).progresses_alone());
            let late = passes[0].state.clone();
            assert!(late.ops[0].run.has_more(OpRun::OVERDUE));
            let out = all_next(&model, &late);
            // Once per step.
            assert!(!out.iter().any(|n| matches!(n.mv, Move::TimePasses(0))));
            let failed = out
                .iter()
                .find(|n| matches!(n.mv, Move::Operation(0)))
                .expect("a reconcile");
            assert_eq!(
                failed.state.ops[0].phase,
                Phase::Failed,
                "{:?}",
                failed.state
            );
            let status = model
                .objects
                .snapshot(&failed.state)
                .operations
                .first()
                .and_then(|o| o.status.clone())
                .expect("a status");
            assert!(status.failure_reason.is_some_and(|r| !r.is_empty()));
            // The node comes back later: the failed operation does nothing more.
            let back = all_next(&model, &failed.state)
                .into_iter()
                .find(|n| matches!(n.mv, Move::NodeReturns(0)))
                .expect("the node comes back");
            let after = all_next(&model, &back.state);
            assert!(
                after
                    .iter()
                    .filter(|n| matches!(n.mv, Move::Operation(0)))
                    .all(|n| !n.effect.failed_touched && n.state.machines == back.state.machines),
                "{:?}",
                after.iter().map(|n| n.mv).collect::<Vec<_>>()
            );
        }
    }
}
