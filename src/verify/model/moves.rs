//! A transition: what it was ([`Move`]), what it did as the invariants read it
//! ([`Effect`]), the successor it leads to ([`Next`]), and the rules that fired on the
//! way ([`Fired`]).

use super::state::{ClusterState, OpKind, Pending, Req, State};
use crate::interp::Decision;

// Named by doc links only.
#[cfg(doc)]
use super::state::{Machine, Op};

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
    /// The cluster's lock expires while its work is between reconciles (its holder kept it
    /// past the lock's duration without renewing it: a long wait, a stalled or partitioned
    /// controller; one of the failures): other work may take it.
    LockExpires,
    /// The cluster's backup takes a verified snapshot (its schedule, or a person asking
    /// for one).
    SnapshotTaken,
    /// The backup's newest snapshot grows older than the rules allow.
    SnapshotAges,
    /// Time passes (`--clock`): the step operation `k` is at (a gate with a `within`, or a
    /// call sent) has been running longer than it may.
    TimePasses(u8),
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
            | Move::LockExpires
            | Move::SnapshotAges
            | Move::TimePasses(_)
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
    /// The operation the step acted on is a control plane's (its target is or was one) or
    /// rolls over the whole cluster (`step.controlplane`).
    pub control_plane: bool,
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

pub(super) fn effect(name: &str) -> Effect {
    Effect {
        step: step_index(name),
        ..Effect::default()
    }
}

/// The effect of committing `p` into `t`.
pub(super) fn committed(p: Pending, t: &State) -> Effect {
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
