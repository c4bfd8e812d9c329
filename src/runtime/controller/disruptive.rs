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

/// What became of the work a lock's holder names, as the work that wants the lock reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderWork {
    /// It is over: the machine whose removal it was is gone (or not being deleted), or the
    /// TalosOperation is gone or finished. Nothing runs under the lock.
    Over,
    /// It is under way: the machine being deleted, or the operation unfinished.
    Running,
    /// The holder names no work of this operator's (another tool, a writer racing, a
    /// name in another namespace): only its Lease's expiry says it is done with it.
    Unknown,
}

/// Whether other work may take a cluster's lock from its holder, whose work is `work` and
/// whose Lease has `expired` (not renewed for its duration). Work under way keeps the lock
/// however long it goes unrenewed: its holder may wait longer than the Lease lasts (a reset
/// settling, a node coming back, a controller restarted or partitioned meanwhile), and the
/// disruption it began is still there. Before, an expired Lease went to any work, so a
/// removal waiting on its node and an operation could both run (`verify` refutes
/// `one-disruption` with the lock's expiry in its model when this says otherwise). Work
/// that is over gives it up at once; a holder that names no work of ours, once expired.
/// The controller ([`acquire`]) and `verify`'s model both decide with this.
pub fn may_take_over(work: HolderWork, expired: bool) -> bool {
    match work {
        HolderWork::Over => true,
        HolderWork::Running => false,
        HolderWork::Unknown => expired,
    }
}

/// What became of the work `holder` names (read live: a GET-like LIST of its TalosMachine
/// or TalosOperation by name); a failed read fails the acquire.
async fn holder_work(
    ctx: &Context,
    namespace: &str,
    holder: &str,
) -> Result<HolderWork, ReconcileError> {
    if let Some((ns, name)) = crate::runtime::exec::removal::holder_machine(holder) {
        if ns != namespace {
            return Ok(HolderWork::Unknown);
        }
        // A machine of that name not being deleted is not being removed (one made again
        // after its removal finished): nothing runs under the lock.
        return Ok(match ctx.reader.machine(ns, name).await? {
            Some(m) if m.deleting() => HolderWork::Running,
            _ => HolderWork::Over,
        });
    }
    if let Some((ns, name)) = crate::runtime::exec::operation::holder_operation(holder) {
        if ns != namespace {
            return Ok(HolderWork::Unknown);
        }
        let api: kube::Api<crate::runtime::objects::TalosOperation> =
            kube::Api::namespaced(ctx.client.clone(), ns);
        let params = kube::api::ListParams::default().fields(&format!("metadata.name={name}"));
        let list = api.list(&params).await?;
        return Ok(
            match list
                .items
                .iter()
                .find(|o| o.metadata.name.as_deref() == Some(name))
            {
                None => HolderWork::Over,
                Some(o) if o.finished() => HolderWork::Over,
                Some(_) => HolderWork::Running,
            },
        );
    }
    Ok(HolderWork::Unknown)
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

/// Takes `cluster`'s lock for `work` (the same work resumes its own lock). A lock held by
/// other work is taken over only as [`may_take_over`] says: at once when that work is over
/// (its machine gone, its operation gone or finished), never while it is under way however
/// long its Lease went unrenewed, and once expired when its holder names no work of ours.
/// Nothing renews it: work takes the lock through [`hold`].
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
    match lock.acquire_with(&holder, false).await {
        Ok(a) => Ok(Ok(a)),
        Err(LockError::Held {
            holder: current,
            expired,
            ..
        }) => {
            let done = holder_work(ctx, namespace, &current).await?;
            if !may_take_over(done, expired) {
                return Ok(Err(Refused::Held { holder: current }));
            }
            if done == HolderWork::Over {
                // Work that finished without releasing the lock (its machine gone, its
                // operation finished): nothing is running under it.
                tracing::info!(lock = %lock.name(), stale = %current, "taking over a lock left by finished work");
                lock.release(&current).await?;
            } else {
                tracing::info!(lock = %lock.name(), expired = %current, "taking over an expired lock whose holder names no work of this operator's");
            }
            match lock.acquire_with(&holder, done != HolderWork::Over).await {
                Ok(a) => Ok(Ok(a)),
                Err(LockError::Held { holder, .. }) => Ok(Err(Refused::Held { holder })),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}
