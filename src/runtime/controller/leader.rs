//! Leader election on a Lease: every replica serves the webhook, one reconciles. The
//! leader renews its Lease every third of its duration; if it cannot, it stops
//! reconciling before the Lease can expire, so two leaders never act at once.

use super::lock::{Acquired, LeaseLock, LockError};
use super::{CONTROLLER_NAME, Context};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The name of the leader-election Lease (in `Settings::lease_namespace`).
pub const LEADER_LEASE: &str = "ichor-rules-controller";

/// The annotation a leader of this version writes on the leader Lease: its cluster locks
/// live in the operator's namespace. A leader Lease without it was last held by a version
/// that kept them in each cluster's namespace.
pub const LOCKS_ANNOTATION: &str = "ichor.maesh.dev/cluster-locks";

/// The value of [`LOCKS_ANNOTATION`].
pub const LOCKS_IN_OPERATOR_NAMESPACE: &str = "operator-namespace";

/// Campaigns for leadership forever; while leader, runs the controllers. `leading` tells
/// the metrics and readiness whether this replica reconciles.
pub async fn run(ctx: Arc<Context>, leading: Arc<AtomicBool>) {
    let s = &ctx.settings;
    let lock = LeaseLock::new(
        ctx.client.clone(),
        &s.lease_namespace,
        LEADER_LEASE,
        s.leader_duration,
        &s.identity,
        ctx.leases.clone(),
    )
    .annotated(LOCKS_ANNOTATION, LOCKS_IN_OPERATOR_NAMESPACE);
    let retry = (s.leader_duration / 3).max(Duration::from_millis(100));
    loop {
        // Who led before: a leader of the previous version may have left cluster locks in
        // the clusters' namespaces, renewed until it stopped leading (before this replica
        // can take over). They are honoured until they have expired.
        let legacy = match lock.annotation(LOCKS_ANNOTATION).await {
            Ok(Some(a)) => a.as_deref() != Some(LOCKS_IN_OPERATOR_NAMESPACE),
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(error = %e, "leader election");
                tokio::time::sleep(retry).await;
                continue;
            }
        };
        match lock.acquire(&s.identity).await {
            Ok(how) => {
                if legacy && how == Acquired::Taken {
                    ctx.hold_for_legacy_locks(Instant::now() + s.lock_duration);
                    tracing::warn!(
                        wait_s = s.lock_duration.as_secs(),
                        "the previous leader kept cluster locks in the clusters' namespaces: no disruptive work starts until they have expired"
                    );
                }
                tracing::info!(identity = %s.identity, resumed = how == Acquired::Resumed, "leading: the controller runs");
                leading.store(true, Ordering::Relaxed);
                ctx.metrics.set_leading(true);
                let controllers = tokio::spawn(super::run(ctx.clone()));
                hold(&lock, &s.identity, s.leader_duration, retry).await;
                controllers.abort();
                let _ = controllers.await;
                leading.store(false, Ordering::Relaxed);
                ctx.metrics.set_leading(false);
                tracing::warn!(identity = %s.identity, "leadership lost: the controller stopped");
            }
            Err(LockError::Held { holder, .. }) => {
                tracing::debug!(%holder, "another replica leads");
            }
            Err(e) => tracing::warn!(error = %e, "leader election"),
        }
        tokio::time::sleep(retry).await;
    }
}

/// Renews until renewing fails for longer than is safe; returns when leadership is lost.
async fn hold(lock: &LeaseLock, identity: &str, duration: Duration, every: Duration) {
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(every).await;
        match lock.renew(identity).await {
            Ok(()) => last_ok = Instant::now(),
            Err(LockError::Lost { holder, .. }) => {
                tracing::warn!(%holder, "another replica took the leader lease");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "renewing the leader lease failed");
                // Stop before the lease could have expired for others.
                if last_ok.elapsed() + every >= duration {
                    return;
                }
            }
        }
    }
}

/// Gives leadership up (on shutdown), so another replica takes over at once.
pub async fn step_down(ctx: &Context) {
    let s = &ctx.settings;
    let lock = LeaseLock::new(
        ctx.client.clone(),
        &s.lease_namespace,
        LEADER_LEASE,
        s.leader_duration,
        CONTROLLER_NAME,
        ctx.leases.clone(),
    );
    if let Err(e) = lock.release(&s.identity).await {
        tracing::warn!(error = %e, "releasing the leader lease");
    }
}
