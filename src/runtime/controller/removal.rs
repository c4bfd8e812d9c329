//! The removal of an approved control plane, run with real I/O: the procedure is the
//! executor's ([`crate::runtime::exec::removal`], which `verify` explores too); this is
//! the world it runs in: the API server, the cluster lock's Lease, drains, and Talos with
//! the cluster's own credentials.

use super::world::Live;
use super::{Context, ReconcileError};
use crate::runtime::exec::trace::Traced;
use crate::runtime::exec::{self, Outcome, Timing};
use crate::runtime::objects::TalosMachine;
use kube::runtime::controller::Action;

/// The removal's decisions without I/O (`verify`'s model calls them as the controller does).
pub use crate::runtime::exec::rules::{applies, decide};

/// The intervals of a removal, from the controller's settings.
pub fn timing(ctx: &Context) -> Timing {
    Timing {
        refused_requeue: ctx.settings.refused_requeue,
        lock_retry: ctx.settings.lock_retry,
        drain_retry: ctx.settings.drain_retry,
        reset_settle: ctx.settings.reset_settle,
        sent_deadline: ctx.settings.install_deadline,
    }
}

/// One reconcile of the removal of `m`.
pub async fn run(ctx: &Context, m: &TalosMachine) -> Result<Action, ReconcileError> {
    let Some(table) = ctx.rules.current() else {
        return Err(ReconcileError::NoRules);
    };
    let mut world = Live::new(ctx, m.namespace(), Some(m.name())).recording(
        "TalosMachine",
        &m.metadata,
        "DELETE",
    );
    world.link_admission().await;
    let timing = timing(ctx);
    let (outcome, mut world) = match &ctx.steps {
        // Every step logged, for `verify --check-trace`.
        Some(log) => {
            let id = log.begin("removal", m, &timing);
            let mut traced = Traced::new(world, log, id);
            let outcome = exec::removal::reconcile(&mut traced, &table, &timing, m).await;
            log.end(id, &outcome);
            (outcome, traced.inner)
        }
        None => {
            let mut world = world;
            let outcome = exec::removal::reconcile(&mut world, &table, &timing, m).await;
            (outcome, world)
        }
    };
    // A lock still held here (an error ended the reconcile) is kept: the work resumes it,
    // or it expires after the lock duration.
    world.keep_lock();
    Ok(match outcome? {
        Outcome::Requeue { after, .. } => Action::requeue(after),
        Outcome::AwaitChange => Action::await_change(),
    })
}
