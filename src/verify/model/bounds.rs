//! The exploration's bounds, and the constants every part of the model shares: the
//! namespace and cluster its objects live in, the indices that stand for no machine
//! ([`NONE`], [`GONE`]), and the most a model holds.

use super::state::{ROLL_MAX, RollKind};
use crate::compile::Table;
use crate::vocab::Verb;

// Named by doc links only.
#[cfg(doc)]
use super::state::OpKind;

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
    /// The cluster has a TalosEtcdBackup (issue 36), with no snapshot at first: the
    /// snapshot is taken (its schedule, or a person asking for one) and ages, by moves of
    /// their own, at any time.
    pub backups: bool,
    /// The nodes run Talos 1.13 or later (`--talos 1.13`): an upgrade takes the executor's
    /// `ImageService/Pull` + `LifecycleService/Upgrade` path (its stream's exit code read,
    /// then the node cordoned, drained and rebooted by the controller) instead of the
    /// legacy `MachineService/Upgrade`.
    pub lifecycle: bool,
    /// Time passes (`--clock`): the step an operation is at may outlast its `within` (a
    /// world move, [`super::moves::Move::TimePasses`], once per step), so a gate that does
    /// not pass fails the operation.
    pub clock: bool,
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
            backups: false,
            lifecycle: false,
            clock: false,
        }
    }
}
