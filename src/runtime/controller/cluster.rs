//! The TalosCluster's Transitioning condition, from the live count of approved control
//! planes (ADR 0010): True/EvenControlPlaneCount while even, False/StableControlPlaneCount
//! when odd. spec.controlPlane.count is the declared state and never even; the live count
//! passes through 2 or 4 during a replacement.
//!
//! And its teardown (ADR 0010: deleting the TalosCluster is the one way to remove its last
//! control plane): every TalosCluster carries the finalizer `ichor.maesh.dev/cluster-teardown`,
//! so a deleted one stays, deleting, while TalosMachines still refer to it. The rules let
//! those machines follow it (no allow-delete annotation, no quorum or count refusal), and
//! the finalizer goes once the last of them is gone. Until then the condition `Teardown`
//! (True, `WaitingForMachines`) names them.

use super::status::{self, Conditions};
use super::{Context, ReconcileError, finalizer};
use crate::runtime::facts::{approved_members, is_transitioning};
use crate::runtime::live::Reads;
use crate::runtime::objects::{Role, TEARDOWN_FINALIZER, TalosCluster};
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
        operations: true,
        backups: false,
    };
    let snapshot = ctx.reader.snapshot(&ns, &[&name], reads).await?;
    let Some(live) = snapshot.cluster(&ns, &name) else {
        return Ok(Action::await_change());
    };
    let approved = approved_members(&snapshot, &ns, &name, Role::ControlPlane, None).len();
    let (on, reason, message) = transitioning(approved);
    let mut next = live.clone();
    let mut changed = status::set(next.conditions_mut(), "Transitioning", on, reason, &message);
    // The redacted base for the webhook's dry render (issue 37).
    if !live.deleting() {
        let published = super::base::publish(&ctx.client, live).await;
        changed |= match &published.condition {
            Some((on, reason, message)) => {
                status::set(next.conditions_mut(), "BaseConfig", *on, reason, message)
            }
            None => status::remove(next.conditions_mut(), "BaseConfig"),
        };
        let redacted = match published.redacted {
            super::base::Publish::Set(r) => Some(Some(r)),
            super::base::Publish::Clear => Some(None),
            super::base::Publish::Keep => None,
        };
        if let Some(r) = redacted {
            let st = next.status.get_or_insert_with(Default::default);
            if st.redacted_base != r {
                st.redacted_base = r;
                changed = true;
            }
        }
    }
    let finalized = finalizer::holds(&live.metadata, TEARDOWN_FINALIZER);
    // The machines that still refer to it, being deleted or not, approved or not.
    let remaining: Vec<&str> = snapshot
        .machines
        .iter()
        .filter(|m| m.namespace() == ns && m.cluster() == name)
        .map(|m| m.name())
        .collect();
    if live.deleting() && finalized && !remaining.is_empty() {
        let message = format!(
            "the TalosCluster is being deleted and waits for its {} TalosMachine(s) to be deleted: {}; \
             delete them (kubectl -n {ns} delete talosmachine {}): the rules let them follow the cluster",
            remaining.len(),
            remaining.join(", "),
            remaining.join(" "),
        );
        changed |= status::set(
            next.conditions_mut(),
            "Teardown",
            true,
            "WaitingForMachines",
            &message,
        );
    }
    // The finalizer patch below is guarded by the resourceVersion: after a status write, the
    // one that write produced (the one read would conflict, 409, on every first reconcile).
    let mut current = live.clone();
    if changed && let Some(version) = status::write(&ctx.client, live, &next).await? {
        current.metadata.resource_version = Some(version);
    }
    if live.deleting() {
        if finalized && remaining.is_empty() {
            finalizer::set(&ctx, &current, TEARDOWN_FINALIZER, false).await?;
            tracing::info!(cluster = %format!("{ns}/{name}"), "torn down: no TalosMachine refers to it any more");
        }
        // Each machine's deletion triggers this through the watch.
        return Ok(Action::await_change());
    }
    if !finalized {
        finalizer::set(&ctx, &current, TEARDOWN_FINALIZER, true).await?;
    }
    // A staged configuration: the reboot that rolls it (issue 37).
    let base_digest = next
        .status
        .as_ref()
        .and_then(|s| s.redacted_base.as_ref())
        .map(|b| b.digest.as_str());
    let again = super::roll::ensure(&ctx, &snapshot, live, base_digest).await;
    // Machines' changes trigger this through the watch; the requeue is a safety net.
    // A base Secret is read again every `base_recheck` (its changes come to no watch).
    let recheck = if live.spec.base_config_secret_ref.is_some() {
        ctx.settings.base_recheck
    } else {
        Duration::from_secs(300)
    };
    Ok(Action::requeue(again.map_or(recheck, |a| a.min(recheck))))
}
