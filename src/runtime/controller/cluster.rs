//! The TalosCluster's Transitioning condition, from the live count of approved control
//! planes (ADR 0010): True/EvenControlPlaneCount while even, False/StableControlPlaneCount
//! when odd. spec.controlPlane.count is the declared state and never even; the live count
//! passes through 2 or 4 during a replacement.

use super::status::{self, Conditions};
use super::{Context, ReconcileError};
use crate::runtime::facts::{approved_members, is_transitioning};
use crate::runtime::live::Reads;
use crate::runtime::objects::{Role, TalosCluster};
use kube::runtime::controller::Action;
use std::sync::Arc;
use std::time::Duration;

/// The condition for this many approved control planes: (status, reason, message).
pub fn transitioning(approved: usize) -> (bool, &'static str, String) {
    if is_transitioning(approved) {
        (
            true,
            "EvenControlPlaneCount",
            format!(
                "{approved} approved control planes: a replacement is under way; other disruptive work waits until the count is odd"
            ),
        )
    } else {
        (
            false,
            "StableControlPlaneCount",
            format!("{approved} approved control plane(s)"),
        )
    }
}

pub async fn reconcile(c: Arc<TalosCluster>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let (ns, name) = (c.namespace().to_string(), c.name().to_string());
    let reads = Reads {
        machines: true,
        clusters: true,
        operations: false,
    };
    let snapshot = ctx.reader.snapshot(&ns, &[&name], reads).await?;
    let Some(live) = snapshot.cluster(&ns, &name) else {
        return Ok(Action::await_change());
    };
    let approved = approved_members(&snapshot, &ns, &name, Role::ControlPlane, None).len();
    let (on, reason, message) = transitioning(approved);
    let mut next = live.clone();
    if status::set(next.conditions_mut(), "Transitioning", on, reason, &message) {
        let st = next.status.clone().unwrap_or_default();
        match status::patch_status::<TalosCluster>(&ctx.client, &ns, &name, &st).await {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Machines' changes trigger this through the watch; the requeue is a safety net.
    Ok(Action::requeue(Duration::from_secs(300)))
}
