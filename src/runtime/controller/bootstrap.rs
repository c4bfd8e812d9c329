//! The driver of a new cluster's bootstrap (issue 37): the procedure is
//! [`crate::runtime::exec::bootstrap`] (decided by the `bootstrap controlplane` rules,
//! recorded before `Bootstrap` is sent, so of two controllers only one sends it); the
//! controller runs it in its world ([`super::configure::MachineLive`]: the API server, Talos
//! with the cluster's credentials), with its decision recorded (`--decision-log`) and its
//! steps logged (`--step-log`, procedure `bootstrap`).

use super::configure::MachineLive;
use super::{Context, ReconcileError, nodes};
use crate::runtime::exec::{Outcome, bootstrap, trace};
use crate::runtime::objects::{Snapshot, TalosMachine};
use std::time::Duration;

/// Bootstraps the cluster of `live` (a configured, approved control plane; `snapshot`: its
/// cluster as read) when the rules let it; returns when to look again (`None`: nothing
/// left to do here).
pub async fn reconcile(
    ctx: &Context,
    dialer: &nodes::Dialer<'_>,
    table: &crate::compile::Table,
    snapshot: &Snapshot,
    live: &TalosMachine,
) -> Result<Option<Duration>, ReconcileError> {
    let world = MachineLive::new(ctx, dialer, live.namespace()).recording(live);
    let timing = super::removal::timing(ctx);
    let identity = ctx.settings.identity.as_str();
    // A cluster whose bootstrap is confirmed asks the world nothing more: its reconciles
    // (every probe of every control plane) are not logged.
    let confirmed = snapshot
        .cluster(live.namespace(), live.cluster())
        .and_then(|c| c.bootstrap_record())
        .is_some_and(|r| r.confirmed);
    let outcome = match ctx.steps.as_ref().filter(|_| !confirmed) {
        // Every step logged, for `verify --check-trace`.
        Some(log) => {
            let begin = trace::BootstrapBegin::new(snapshot, live, identity);
            let id = log.begin("bootstrap", &begin, &timing);
            let mut traced = trace::Traced::new(world, log, id);
            let outcome =
                bootstrap::reconcile(&mut traced, table, &timing, identity, snapshot, live).await;
            log.end(id, &outcome);
            outcome
        }
        None => {
            let mut world = world;
            bootstrap::reconcile(&mut world, table, &timing, identity, snapshot, live).await
        }
    }?;
    Ok(match outcome {
        Outcome::Requeue { after, .. } => Some(after),
        Outcome::AwaitChange => None,
    })
}
