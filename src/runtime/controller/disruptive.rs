//! The one way disruptive work takes a cluster's lock (ADR 0010, 0137).
//!
//! Every disruptive step goes through [`acquire`]. It only serializes: whether the work may
//! run (the even count, quorum, the declared count) is decided by the rules before it (an
//! operation's `hold run operation` and `start` rules) or under it (a removal's rules), so
//! the rules text is the one place that policy lives. Work refused by the rules holds
//! nothing: an operation parked for the even count never has the lock.

use super::lock::{Acquired, LeaseLock, LockError, Renewal};
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
            // One name per work, written where its procedure is (the model names the
            // holder the same way).
            Work::RemoveControlPlane { namespace, machine } => {
                crate::runtime::exec::removal::holder(namespace, machine)
            }
            Work::Operation { namespace, name } => {
                crate::runtime::exec::operation::holder(namespace, name)
            }
        }
    }
}

/// The longest Lease name (a DNS subdomain).
const MAX_LEASE_NAME: usize = 253;

/// The name of the Lease that locks the disruptive work of the TalosCluster `cluster` in
/// `namespace`: `ichor-lock.<namespace>.<cluster>`, deterministic so every replica and a
/// restarted controller find it. A namespace never contains a dot, so two clusters never
/// share a name. When that is longer than a Lease name may be (a cluster name near its
/// own limit of 253), it is `ichor-lockh.<namespace>.<sha256 of "namespace/cluster", 32
/// hex digits>` instead: the other prefix keeps it apart from any cluster's plain name.
pub fn lock_name(namespace: &str, cluster: &str) -> String {
    let plain = format!("ichor-lock.{namespace}.{cluster}");
    if plain.len() <= MAX_LEASE_NAME {
        return plain;
    }
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{namespace}/{cluster}").as_bytes(),
    );
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("ichor-lockh.{namespace}.{hex}")
}

/// The Lease that locks a cluster's disruptive work. It lives in the operator's own
/// namespace (`Settings::lease_namespace`, where the controller's only Lease rights are),
/// named by [`lock_name`].
pub fn cluster_lock(ctx: &Context, namespace: &str, cluster: &str) -> LeaseLock {
    LeaseLock::new(
        ctx.client.clone(),
        &ctx.settings.lease_namespace,
        &lock_name(namespace, cluster),
        ctx.settings.lock_duration,
        &ctx.settings.identity,
        ctx.leases.clone(),
    )
}

/// What the previous version called a cluster's lock: `ichor-lock-<cluster>` in the
/// cluster's own namespace. Only named in messages; it is never read (see
/// [`Context::legacy_locks_until`]).
pub fn legacy_lock_name(namespace: &str, cluster: &str) -> String {
    format!("Lease {namespace}/ichor-lock-{cluster}")
}

/// Why the lock was not taken.
#[derive(Debug)]
pub enum Refused {
    /// Other work has the lock.
    Held { holder: String },
}

/// A cluster's lock, held by this work and renewed in the background while it is held.
///
/// The guard is the only way to the lock, and it ends in one of two ways, each consuming
/// it: [`Held::release`] gives the lock up (the work is over, or refused), [`Held::keep`]
/// keeps it for the same work to resume at its next reconcile (a step waits). Dropped any
/// other way (an error returned with `?`), it stops renewing and keeps the lock, as `keep`
/// does: the work resumes it, or it expires after the lock duration.
#[must_use = "a held lock is released or kept"]
pub struct Held {
    lock: LeaseLock,
    holder: String,
    renewal: Renewal,
}

impl Held {
    fn new(ctx: &Context, lock: LeaseLock, holder: String) -> Held {
        let renewal = Renewal::start(lock.clone(), holder.clone(), ctx.settings.lock_duration / 3);
        Held {
            lock,
            holder,
            renewal,
        }
    }

    /// Gives the lock up (renewing stops first).
    pub async fn release(self) -> Result<(), LockError> {
        let Held {
            lock,
            holder,
            renewal,
        } = self;
        drop(renewal);
        lock.release(&holder).await
    }

    /// Keeps the lock for this work's next reconcile; renewing stops now and that reconcile
    /// takes it up again.
    pub fn keep(self) {
        drop(self.renewal);
    }
}

/// Takes `cluster`'s lock for `work` as [`acquire`] does, and holds it: renewed until the
/// guard is released or kept. The way work takes the lock.
pub async fn hold(
    ctx: &Context,
    namespace: &str,
    cluster: &str,
    work: Work<'_>,
) -> Result<Result<Held, Refused>, ReconcileError> {
    Ok(acquire(ctx, namespace, cluster, work)
        .await?
        .map(|_| Held::new(ctx, cluster_lock(ctx, namespace, cluster), work.holder())))
}

/// Takes `cluster`'s lock for `work` (the same work resumes its own lock); a lock held by the
/// removal of a machine that is gone is stale and taken over. Nothing renews it: work
/// takes the lock through [`hold`].
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
    // Right after an upgrade from the version that kept locks in each cluster's namespace,
    // such a lock may still be held (its work resumes here under the new lock): no work
    // starts until it has expired, whoever held it.
    if let Some(left) = ctx.legacy_locks_left() {
        return Ok(Err(Refused::Held {
            holder: format!(
                "the previous version's lock {} if any (locks moved to namespace {}; it expires within {} s)",
                legacy_lock_name(namespace, cluster),
                ctx.settings.lease_namespace,
                left.as_secs().max(1)
            ),
        }));
    }
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
            let stale = match crate::runtime::exec::removal::holder_machine(&current) {
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
