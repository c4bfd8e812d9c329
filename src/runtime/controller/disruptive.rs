//! The one way disruptive work takes a cluster's lock (ADR 0010, 0137).
//!
//! Every disruptive step goes through [`acquire`]: it recounts the approved control planes
//! live and refuses while the count is even, unless the work is what completes the
//! transition (the removal of a control plane). Work that is refused here holds nothing:
//! an operation parked for the even count never has the lock.

use super::lock::{Acquired, LeaseLock, LockError};
use super::{Context, ReconcileError};
use crate::runtime::facts::{approved_members, is_transitioning};
use crate::runtime::live::Reads;
use crate::runtime::objects::Role;

/// Disruptive work on a cluster. Its holder identity names the work itself, so a restarted
/// controller (or a new leader) resumes its own lock, and two different pieces of work are
/// serialized even inside one controller.
#[derive(Clone, Copy, Debug)]
pub enum Work<'a> {
    /// The removal of a control plane (ADR 0010): it ends an even count, so it may run then.
    RemoveControlPlane {
        namespace: &'a str,
        machine: &'a str,
    },
    /// A TalosOperation.
    Operation { namespace: &'a str, name: &'a str },
}

impl Work<'_> {
    pub fn holder(&self) -> String {
        match self {
            Work::RemoveControlPlane { namespace, machine } => {
                format!("remove TalosMachine {namespace}/{machine}")
            }
            Work::Operation { namespace, name } => format!("TalosOperation {namespace}/{name}"),
        }
    }

    /// Whether this work completes an even-count transition rather than running inside it.
    pub fn completes_transition(&self) -> bool {
        matches!(self, Work::RemoveControlPlane { .. })
    }
}

/// The Lease that locks a cluster's disruptive work, in the cluster's namespace.
pub fn cluster_lock(ctx: &Context, namespace: &str, cluster: &str) -> LeaseLock {
    LeaseLock::new(
        ctx.client.clone(),
        namespace,
        &format!("ichor-lock-{cluster}"),
        ctx.settings.lock_duration,
        &ctx.settings.identity,
    )
}

/// Why the lock was not taken.
#[derive(Debug)]
pub enum Refused {
    /// The live approved control-plane count is even and the work does not end it.
    Transitioning { approved: usize },
    /// Other work has the lock.
    Held { holder: String },
}

/// Takes `cluster`'s lock for `work`: refuses while the live count is even unless the work
/// completes the transition; a lock held by the removal of a machine that is gone is stale
/// and taken over.
pub async fn acquire(
    ctx: &Context,
    namespace: &str,
    cluster: &str,
    work: Work<'_>,
) -> Result<Result<Acquired, Refused>, ReconcileError> {
    let reads = Reads {
        machines: true,
        clusters: false,
        operations: false,
    };
    let live = ctx.reader.snapshot(namespace, &[], reads).await?;
    let approved = approved_members(&live, namespace, cluster, Role::ControlPlane, None).len();
    if is_transitioning(approved) && !work.completes_transition() {
        return Ok(Err(Refused::Transitioning { approved }));
    }
    let lock = cluster_lock(ctx, namespace, cluster);
    let holder = work.holder();
    match lock.acquire(&holder).await {
        Ok(a) => Ok(Ok(a)),
        Err(LockError::Held {
            holder: current, ..
        }) => {
            // A removal that finished (its machine is gone) but did not get to release the
            // lock: nothing is running under it.
            let stale = current
                .strip_prefix("remove TalosMachine ")
                .and_then(|r| r.split_once('/'))
                .is_some_and(|(ns, name)| ns == namespace && live.machine(ns, name).is_none());
            if stale {
                tracing::info!(lock = %lock.name(), stale = %current, "taking over a lock left by a finished removal");
                lock.release(&current).await?;
                return match lock.acquire(&holder).await {
                    Ok(a) => Ok(Ok(a)),
                    Err(LockError::Held { holder, .. }) => Ok(Err(Refused::Held { holder })),
                    Err(e) => Err(e.into()),
                };
            }
            Ok(Err(Refused::Held { holder: current }))
        }
        Err(e) => Err(e.into()),
    }
}
