//! The one way disruptive work takes a cluster's lock (ADR 0010, 0137).
//!
//! Every disruptive step goes through [`acquire`]. It only serializes: whether the work may
//! run (the even count, quorum, the declared count) is decided by the rules before it (an
//! operation's `hold run operation` and `start` rules) or under it (a removal's rules), so
//! the rules text is the one place that policy lives. Work refused by the rules holds
//! nothing: an operation parked for the even count never has the lock.

use super::lock::{Acquired, LeaseLock, LockError};
use super::{Context, ReconcileError};

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
    /// Other work has the lock.
    Held { holder: String },
}

/// Takes `cluster`'s lock for `work` (the same work resumes its own lock); a lock held by the
/// removal of a machine that is gone is stale
/// and taken over.
pub async fn acquire(
    ctx: &Context,
    namespace: &str,
    cluster: &str,
    work: Work<'_>,
) -> Result<Result<Acquired, Refused>, ReconcileError> {
    // Whether the work may run at all (the even count, quorum, the count) is the rules'
    // to say, decided before this: `hold run operation` and the `start` rules for an
    // operation, the `remove controlplane` rules under this lock for a removal. The lock
    // only serializes.
    let lock = cluster_lock(ctx, namespace, cluster);
    let holder = work.holder();
    match lock.acquire(&holder).await {
        Ok(a) => Ok(Ok(a)),
        Err(LockError::Held {
            holder: current, ..
        }) => {
            // A removal that finished (its machine is gone) but did not get to release the
            // lock: nothing is running under it. Its machine is read live by name (a GET,
            // not a LIST of the namespace); a failed read fails the acquire.
            let stale = match current
                .strip_prefix("remove TalosMachine ")
                .and_then(|r| r.split_once('/'))
            {
                Some((ns, name)) if ns == namespace => {
                    ctx.reader.machine(ns, name).await?.is_none()
                }
                _ => false,
            };
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
