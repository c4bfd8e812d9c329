//! The one executor of plans: what the controller does after a decision, written once, with
//! no I/O of its own.
//!
//! A plan's procedure ([`removal::reconcile`]; the operations and backups to come) is a
//! function of what it is given (the table, the object reconciled, the time) and of what the
//! world answers: every read, Talos call, drain, status write, event and lock goes through
//! a [`World`]. The controller's world does real I/O (`controller::removal`: the API
//! server, Talos, etcd); `verify`'s model answers from its own state of the world (nodes,
//! etcd, the API server, clocks, failures) and never says what the controller does. What
//! the model explores is therefore this code, step for step.
//!
//! The etcd measurements (`member.dead`, `healthy.after`, `members.after`) and the search
//! for a healthy sibling are procedures of the same kind ([`etcd`]): the controller and the
//! model ask the same Talos calls and judge the answers with the same functions.

pub mod apply;
pub mod backup;
pub mod bootstrap;
pub mod etcd;
pub mod operation;
pub mod removal;
pub mod rules;
pub mod trace;

use crate::interp::Decision;
use crate::runtime::live::Reads;
use crate::runtime::objects::{Snapshot, TalosMachine};
use crate::runtime::talos::{EtcdMember, EtcdStatus, TalosError};
use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;
use std::time::Duration;

/// Why a Talos call could not be made or did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Why there are no Talos credentials for the machine's cluster.
    #[error("no Talos API credentials: {0}")]
    NoCredentials(String),
    #[error("TalosMachine {0} has no spec.endpoint to dial")]
    NoEndpoint(String),
    #[error(transparent)]
    Talos(#[from] TalosError),
}

/// Where a drain stands.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Drained {
    /// Cordoned and no pod left to evict (or there is no such Node).
    Done,
    /// Evictions were accepted; pods are still terminating.
    Waiting { remaining: usize },
    /// An eviction was refused (a PodDisruptionBudget, or an API error on that pod).
    Blocked { pod: String, message: String },
}

/// Which node a Talos call goes to.
#[derive(Clone, Copy, Debug)]
pub enum Node<'a> {
    /// The machine's own node, at its `spec.endpoint`.
    Endpoint(&'a TalosMachine),
    /// The node at `host` (as etcd lists a member), through this machine's Talos API
    /// (`node: <host>`).
    Via(&'a TalosMachine, &'a str),
    /// The machine's own node, at its `spec.endpoint`, over Talos' maintenance API (no
    /// client certificate, `talosctl --insecure`): only a node with no configuration yet
    /// answers there.
    Maintenance(&'a TalosMachine),
}

/// A Talos machine-API call (the names are Talos' own: `../shared/TALOS-API.md`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Call {
    Version,
    EtcdMemberList,
    EtcdStatus,
    EtcdForfeitLeadership,
    EtcdLeaveCluster,
    EtcdRemoveMemberById(u64),
    /// `Reset`: graceful (leaves etcd first) or not, and reboot.
    Reset {
        graceful: bool,
    },
    /// `Reboot` (mode DEFAULT): the node neither cordons nor drains for it.
    Reboot,
    /// `Shutdown`; `force` skips the node's own cordon and drain.
    Shutdown {
        force: bool,
    },
    /// The legacy `MachineService/Upgrade` to this installer image (Talos before 1.13):
    /// the node installs, drains itself and reboots.
    UpgradeLegacy {
        image: String,
    },
    /// `Rollback`: back to the previous Talos image, and reboot.
    Rollback,
    /// `SystemStat`, for its `boot_time`.
    SystemStat,
    /// `ImageService/Pull` of this image reference into the system containerd.
    ImagePull {
        image: String,
    },
    /// `LifecycleService/Upgrade` from this pulled image name (Talos 1.13 and later): it
    /// installs, and neither drains nor reboots.
    LifecycleUpgrade {
        image_name: String,
    },
    /// `Bootstrap`: starts etcd on a new cluster's first control plane.
    Bootstrap,
    /// `MachineService/List` of this directory: how many entries it holds.
    List {
        root: String,
    },
}

impl Call {
    /// Whether the call only asks (a version, members, a status, a boot time, a listing)
    /// and never changes the node.
    pub fn reads_only(&self) -> bool {
        match self {
            Call::Version
            | Call::EtcdMemberList
            | Call::EtcdStatus
            | Call::SystemStat
            | Call::List { .. } => true,
            Call::EtcdForfeitLeadership
            | Call::EtcdLeaveCluster
            | Call::EtcdRemoveMemberById(_)
            | Call::Reset { .. }
            | Call::Reboot
            | Call::Shutdown { .. }
            | Call::UpgradeLegacy { .. }
            | Call::Rollback
            | Call::ImagePull { .. }
            | Call::LifecycleUpgrade { .. }
            | Call::Bootstrap => false,
        }
    }

    /// Talos' name of the call.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Version => "Version",
            Call::EtcdMemberList => "EtcdMemberList",
            Call::EtcdStatus => "EtcdStatus",
            Call::EtcdForfeitLeadership => "EtcdForfeitLeadership",
            Call::EtcdLeaveCluster => "EtcdLeaveCluster",
            Call::EtcdRemoveMemberById(_) => "EtcdRemoveMemberByID",
            Call::Reset { .. } => "Reset",
            Call::Reboot => "Reboot",
            Call::Shutdown { .. } => "Shutdown",
            Call::UpgradeLegacy { .. } => "Upgrade",
            Call::Rollback => "Rollback",
            Call::SystemStat => "SystemStat",
            Call::ImagePull { .. } => "ImageService/Pull",
            Call::LifecycleUpgrade { .. } => "LifecycleService/Upgrade",
            Call::Bootstrap => "Bootstrap",
            Call::List { .. } => "List",
        }
    }

    /// Whether the call changes the cluster (etcd's membership or the node itself: a
    /// reset, a reboot, a shutdown, an installed image). Pulling an image changes neither.
    pub fn acts(&self) -> bool {
        matches!(
            self,
            Call::EtcdLeaveCluster
                | Call::EtcdRemoveMemberById(_)
                | Call::Reset { .. }
                | Call::Reboot
                | Call::Shutdown { .. }
                | Call::UpgradeLegacy { .. }
                | Call::Rollback
                | Call::LifecycleUpgrade { .. }
                | Call::Bootstrap
        )
    }
}

/// What a Talos call answered.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Reply {
    Version(String),
    Members(Vec<EtcdMember>),
    Status(EtcdStatus),
    Done,
    /// `SystemStat.boot_time` (seconds since the epoch).
    BootTime(u64),
    /// The name `ImageService/Pull` gave the pulled image.
    Pulled(String),
    /// How `LifecycleService/Upgrade`'s stream ended (non-zero `exit_code`: it failed).
    Installed {
        exit_code: i32,
        last_message: String,
    },
    /// How many entries a directory holds (`List`).
    Entries(u64),
}

/// A lock operation on the cluster lock, for the work being reconciled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LockOp {
    /// Take it (the same work resumes its own lock).
    Take,
    /// Give it up: the work is over, or refused.
    Release,
    /// Keep it for this work's next reconcile (a step waits).
    Keep,
}

/// What a procedure tells the world besides its effects: log lines and metrics. The
/// model ignores them; the controller logs them.
#[derive(Debug)]
pub enum Note<'a> {
    /// The rules decided (the controller counts the deciding rules in its metrics).
    Decided(&'a Decision),
    /// A fact was read from etcd.
    Fact {
        fact: crate::vocab::Fact,
        value: i64,
        why: &'a str,
    },
    /// Plan step `k` runs (its guards hold).
    Step(usize, &'a str),
    /// Something worth a log line.
    Info(&'a str),
    Warn(&'a str),
}

/// Everything a procedure does to the world, and everything it learns from it. The
/// controller implements it with I/O; `verify`'s model with its state. `Error` ends the
/// reconcile at once (an API error; in the model, a crash): nothing after it happens, and
/// the next reconcile resumes from what was recorded.
#[allow(async_fn_in_trait)]
pub trait World {
    type Error;

    /// The time now (the controller's clock).
    fn now(&self) -> Timestamp;

    /// The Talos credentials of `cluster`: `Err(why)` when there are none.
    async fn credentials(&mut self, cluster: &str) -> Result<(), String>;

    /// One Talos call, with `cluster`'s credentials.
    async fn talos(
        &mut self,
        cluster: &str,
        node: Node<'_>,
        call: Call,
    ) -> Result<Result<Reply, NodeError>, Self::Error>;

    /// The cluster lock of `cluster`, for the work reconciled: `Ok(Err(holder))` when other
    /// work holds it.
    async fn lock(&mut self, cluster: &str, op: LockOp) -> Result<Result<(), String>, Self::Error>;

    /// A live read of one cluster's objects.
    async fn read(&mut self, cluster: &str, reads: Reads) -> Result<Arc<Snapshot>, Self::Error>;

    /// One pass of draining the Kubernetes Node `node`.
    async fn drain(&mut self, node: &str) -> Result<Result<Drained, String>, Self::Error>;

    /// Writes `after`'s status when it differs from what this world last wrote of the
    /// object in this reconcile (else from `before`, the object as read); the
    /// resourceVersion the write made, when it wrote.
    async fn write_status(
        &mut self,
        before: &TalosMachine,
        after: &TalosMachine,
    ) -> Result<Option<String>, Self::Error>;

    /// Removes the removal finalizer (a patch guarded by `m`'s resourceVersion).
    async fn release_finalizer(&mut self, m: &TalosMachine) -> Result<(), Self::Error>;

    /// Publishes an Event on `on`.
    async fn event(&mut self, on: &TalosMachine, warning: bool, reason: &str, note: String);

    /// A log line or a metric.
    fn note(&mut self, on: &TalosMachine, note: Note<'_>);

    /// Where this reconcile's decision records are built (`runtime::step_records`): the
    /// controller's world has one when records are on; `verify`'s model has none, so
    /// recording costs it nothing.
    fn journal(&mut self) -> Option<&mut crate::runtime::step_records::Journal> {
        None
    }

    /// Decides `ev` with the facts supplied so far ([`rules::decide`]). A world may
    /// remember decisions it was asked before on the same objects (`verify`'s model does);
    /// it never decides otherwise.
    fn decide(
        &mut self,
        table: &crate::compile::Table,
        snapshot: &Snapshot,
        ev: crate::runtime::facts::EventFacts<'_>,
        supplied: &[(crate::vocab::Fact, i64)],
    ) -> Result<Decision, crate::vocab::Fact> {
        rules::decide(table, snapshot, ev, supplied)
    }

    /// Whether plan step `k` runs, and its message ([`rules::applies`]); remembered like
    /// [`World::decide`].
    fn applies(
        &mut self,
        table: &crate::compile::Table,
        snapshot: &Snapshot,
        ev: crate::runtime::facts::EventFacts<'_>,
        supplied: &[(crate::vocab::Fact, i64)],
        k: usize,
        step: &crate::compile::PlanStep,
    ) -> Result<(bool, Option<String>), String> {
        let _ = k;
        rules::applies(table, snapshot, ev, supplied, step)
    }
}

/// How a reconcile ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Look again after this long, for this reason.
    Requeue { after: Duration, wait: Wait },
    /// Nothing to do until the object changes.
    AwaitChange,
}

/// Why a reconcile waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The rules refused (or a fact they need could not be read).
    Refused,
    /// On something in the world, named by this condition reason (a node, etcd, a
    /// PodDisruptionBudget, the lock held by other work, a member left behind).
    On(String),
}

/// The intervals a procedure waits for.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub refused_requeue: Duration,
    pub lock_retry: Duration,
    pub drain_retry: Duration,
    pub reset_settle: Duration,
    /// How long a node that was sent an operation's destructive call may go on answering
    /// with its old boot time (a legacy upgrade installs before it reboots) before the
    /// operation fails, the call not sent again by itself.
    pub sent_deadline: Duration,
}

/// Typed Talos calls over [`World::talos`]: a reply of another kind than the call's is the
/// world's mistake, said as a failed call (never a panic).
pub(crate) mod calls {
    use super::*;

    fn mismatch(call: &Call) -> NodeError {
        NodeError::Talos(TalosError::Config(format!(
            "the answer to {} was not of its kind",
            call.name()
        )))
    }

    pub async fn status<W: World>(
        w: &mut W,
        cluster: &str,
        node: Node<'_>,
    ) -> Result<Result<EtcdStatus, NodeError>, W::Error> {
        Ok(match w.talos(cluster, node, Call::EtcdStatus).await? {
            Ok(Reply::Status(s)) => Ok(s),
            Ok(_) => Err(mismatch(&Call::EtcdStatus)),
            Err(e) => Err(e),
        })
    }

    pub async fn members<W: World>(
        w: &mut W,
        cluster: &str,
        node: Node<'_>,
    ) -> Result<Result<Vec<EtcdMember>, NodeError>, W::Error> {
        Ok(match w.talos(cluster, node, Call::EtcdMemberList).await? {
            Ok(Reply::Members(m)) => Ok(m),
            Ok(_) => Err(mismatch(&Call::EtcdMemberList)),
            Err(e) => Err(e),
        })
    }

    /// A call answered with nothing but success.
    pub async fn done<W: World>(
        w: &mut W,
        cluster: &str,
        node: Node<'_>,
        call: Call,
    ) -> Result<Result<(), NodeError>, W::Error> {
        Ok(w.talos(cluster, node, call).await?.map(|_| ()))
    }

    pub async fn boot_time<W: World>(
        w: &mut W,
        cluster: &str,
        node: Node<'_>,
    ) -> Result<Result<u64, NodeError>, W::Error> {
        Ok(match w.talos(cluster, node, Call::SystemStat).await? {
            Ok(Reply::BootTime(t)) => Ok(t),
            Ok(_) => Err(mismatch(&Call::SystemStat)),
            Err(e) => Err(e),
        })
    }

    pub async fn pull<W: World>(
        w: &mut W,
        cluster: &str,
        node: Node<'_>,
        image: &str,
    ) -> Result<Result<String, NodeError>, W::Error> {
        let call = Call::ImagePull {
            image: image.to_string(),
        };
        Ok(match w.talos(cluster, node, call.clone()).await? {
            Ok(Reply::Pulled(name)) => Ok(name),
            Ok(_) => Err(mismatch(&call)),
            Err(e) => Err(e),
        })
    }

    /// `LifecycleService/Upgrade`: its exit code and last message.
    pub async fn install<W: World>(
        w: &mut W,
        cluster: &str,
        node: Node<'_>,
        image_name: &str,
    ) -> Result<Result<(i32, String), NodeError>, W::Error> {
        let call = Call::LifecycleUpgrade {
            image_name: image_name.to_string(),
        };
        Ok(match w.talos(cluster, node, call.clone()).await? {
            Ok(Reply::Installed {
                exit_code,
                last_message,
            }) => Ok((exit_code, last_message)),
            Ok(_) => Err(mismatch(&call)),
            Err(e) => Err(e),
        })
    }

    pub async fn version<W: World>(
        w: &mut W,
        cluster: &str,
        node: Node<'_>,
    ) -> Result<Result<String, NodeError>, W::Error> {
        Ok(match w.talos(cluster, node, Call::Version).await? {
            Ok(Reply::Version(v)) => Ok(v),
            Ok(_) => Err(mismatch(&Call::Version)),
            Err(e) => Err(e),
        })
    }
}

/// Runs a procedure whose world answers at once (`verify`'s model): polled once, it has
/// finished; `None` if it waited on something (a world that is not immediate).
pub fn run_now<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// Plan step `k` begins (its guards held): said to the world's journal, when it has one.
pub(crate) fn step_began<W: World>(
    w: &mut W,
    table: &crate::compile::Table,
    k: usize,
    text: &str,
    message: Option<&str>,
) {
    if let Some(j) = w.journal() {
        j.step_began(table, k, text, message);
    }
}

/// The step begun last ended (`done`, `wait`, `fail`): said to the world's journal.
pub(crate) fn step_ended<W: World>(
    w: &mut W,
    result: &str,
    reason: Option<&str>,
    message: Option<&str>,
) {
    if let Some(j) = w.journal() {
        j.step_ended(result, reason, message);
    }
}

/// Gives the cluster lock up ([`LockOp::Release`]) or keeps it for the work's next
/// reconcile ([`LockOp::Keep`]).
pub(crate) async fn unlock<W: World>(w: &mut W, cluster: &str, op: LockOp) -> Result<(), W::Error> {
    w.lock(cluster, op).await.map(|_| ())
}
