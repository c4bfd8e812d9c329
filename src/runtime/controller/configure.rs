//! Applying a machine's Talos configuration (issue 37): for an approved machine the rules
//! let through (a held one never gets here), render it (the cluster's base Secret, the
//! TalosConfigPatches that select it in order, its identity); when the render's hash
//! differs from what was applied, ask Talos first (`ApplyConfiguration` with `dry_run`),
//! then apply: without a reboot when Talos says none is needed; a change that needs one is
//! staged on the node (it takes effect at its next reboot, which a `reboot` TalosOperation
//! the controller creates rolls one node at a time: `roll.rs`). The `Configured` condition says what was applied or why not,
//! with Talos' own message; a failure is retried, later each time (the time since the
//! failure began, between 5 s and 5 min). The configuration holds the cluster's secrets:
//! only its hash appears in status, conditions and logs.

use super::Context;
use super::nodes;
use super::status::{self, Conditions};
use crate::runtime::configpatch::{parse_patch, render_machine};
use crate::runtime::live::{cluster_selector, list_complete};
use crate::runtime::objects::{
    MachineConfigStatus, TalosCluster, TalosConfigPatch, TalosMachine, patches_for,
};
use crate::runtime::render::{Base, CONTROLPLANE_KEY, WORKER_KEY};
use crate::runtime::secrets;
use crate::runtime::talos::ApplyMode;
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

/// The digest of what a cluster's machines are rendered from: the base's digest, and the
/// name and resourceVersion of each of the cluster's TalosConfigPatches (all of them, so
/// every machine of the cluster records the same digest for the same inputs). A machine
/// records it at each render (`status.config.inputs`); the roll (`roll.rs`) compares it.
pub(super) fn inputs_digest(base_digest: &str, patches: &[TalosConfigPatch]) -> String {
    let mut names: Vec<String> = patches
        .iter()
        .map(|p| {
            format!(
                "{} {}\n",
                p.name(),
                p.metadata.resource_version.as_deref().unwrap_or_default()
            )
        })
        .collect();
    names.sort();
    let text = format!("{base_digest}\n{}", names.concat());
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn short(hash: &str) -> &str {
    &hash[..12.min(hash.len())]
}

/// When to try a failed step again: as long as it has been failing, within 5 s and 5 min.
fn backoff(next: &TalosMachine) -> Duration {
    let since = next
        .configure_failing_since()
        .and_then(|t| Timestamp::now().duration_since(t.0).try_into().ok())
        .unwrap_or(Duration::ZERO);
    since.clamp(Duration::from_secs(5), Duration::from_secs(300))
}

fn config_status(next: &mut TalosMachine) -> &mut MachineConfigStatus {
    next.status
        .get_or_insert_with(Default::default)
        .config
        .get_or_insert_with(Default::default)
}

/// Configures the machine; returns when to look again (`None`: nothing to do until
/// something changes). `cluster` is the live TalosCluster.
pub async fn configure(
    ctx: &Context,
    dialer: &nodes::Dialer<'_>,
    cluster: Option<&TalosCluster>,
    live: &TalosMachine,
    next: &mut TalosMachine,
) -> Option<Duration> {
    let cluster = cluster?;
    let base_ref = cluster.spec.base_config_secret_ref.as_ref()?;
    let ns = live.namespace();
    let fail = |next: &mut TalosMachine, reason: &str, message: String| {
        status::set(next.conditions_mut(), "Configured", false, reason, &message);
        tracing::info!(machine = %format!("{ns}/{}", live.name()), %reason, "not configured");
        Some(backoff(next))
    };
    // The base, read live (never logged).
    let base = match secrets::get(&ctx.client, ns, &base_ref.name).await {
        Ok(Some(raw)) => match (raw.text(CONTROLPLANE_KEY), raw.text(WORKER_KEY)) {
            (Some(cp), Some(w)) => match Base::parse(&cp, &w, true) {
                Ok(b) => b,
                Err(e) => {
                    return fail(
                        next,
                        "BaseInvalid",
                        format!("the base Secret {ns}/{} does not read: {e}", base_ref.name),
                    );
                }
            },
            _ => {
                return fail(
                    next,
                    "BaseInvalid",
                    format!(
                        "the base Secret {ns}/{} lacks {CONTROLPLANE_KEY} or {WORKER_KEY}",
                        base_ref.name
                    ),
                );
            }
        },
        Ok(None) => {
            return fail(
                next,
                "BaseSecretMissing",
                format!("the base Secret {ns}/{} does not exist", base_ref.name),
            );
        }
        Err(e) => {
            return fail(
                next,
                "BaseSecretUnreadable",
                format!(
                    "the base Secret {ns}/{} could not be read: {e}",
                    base_ref.name
                ),
            );
        }
    };
    // The patches of the cluster, in order.
    let api: kube::Api<TalosConfigPatch> = kube::Api::namespaced(ctx.client.clone(), ns);
    let params = kube::api::ListParams::default().fields(&cluster_selector(cluster.name()));
    let patches = match list_complete(&api, &params).await {
        Ok(p) => p,
        Err(e) => {
            return fail(
                next,
                "PatchesUnreadable",
                format!(
                    "the TalosConfigPatches of TalosCluster {ns}/{} could not be read: {e}",
                    cluster.name()
                ),
            );
        }
    };
    config_status(next).inputs = Some(inputs_digest(&base.digest, &patches));
    let selected = patches_for(patches.iter(), live);
    let parsed: Vec<_> = selected.iter().map(|p| parse_patch(p)).collect();
    let pairs: Vec<_> = selected.iter().copied().zip(parsed.iter()).collect();
    let rendered = match render_machine(&base, live, &pairs) {
        Ok(r) => r,
        Err(e) => {
            return fail(
                next,
                "RenderFailed",
                format!("its configuration does not render: {e}"),
            );
        }
    };
    config_status(next).rendered_hash = Some(rendered.sha256.clone());
    if live.applied_config_hash() == Some(rendered.sha256.as_str()) {
        status::set(
            next.conditions_mut(),
            "Configured",
            true,
            "Applied",
            &format!("configuration {} applied", short(&rendered.sha256)),
        );
        return None;
    }
    // A node in maintenance mode gets its first configuration over the maintenance API
    // (`talosctl apply-config --insecure`): it installs it and reboots into it.
    let maintenance = next.in_maintenance();
    let client = if maintenance {
        let endpoint = live.spec.endpoint.as_deref().unwrap_or_default();
        match crate::runtime::talos::TalosClient::maintenance(endpoint, ctx.settings.talos_timeout)
        {
            Ok(c) => c,
            Err(e) => return fail(next, "NodeUnavailable", e.to_string()),
        }
    } else {
        match nodes::client(dialer, live) {
            Ok(c) => c,
            Err(e) => return fail(next, "NodeUnavailable", e.to_string()),
        }
    };
    let data = rendered.text.as_bytes();
    // Talos' own check first.
    let dry = match client
        .apply_configuration(data, ApplyMode::Auto, true)
        .await
    {
        Ok(d) => d,
        Err(e) => {
            return fail(
                next,
                "DryRunRefused",
                format!(
                    "Talos refused configuration {}: {e}",
                    short(&rendered.sha256)
                ),
            );
        }
    };
    if maintenance {
        return match client
            .apply_configuration(data, ApplyMode::Auto, false)
            .await
        {
            Ok(applied) => {
                let hash = rendered.sha256.clone();
                let c = config_status(next);
                c.applied_hash = Some(hash.clone());
                c.staged_hash = None;
                status::remove(next.conditions_mut(), "Maintenance");
                status::set(
                    next.conditions_mut(),
                    "Configured",
                    true,
                    "Applied",
                    &format!(
                        "first configuration {} applied over the maintenance API: the node installs it and reboots ({})",
                        short(&hash),
                        applied.details
                    ),
                );
                tracing::info!(machine = %format!("{ns}/{}", live.name()), hash = %short(&hash), "first configuration applied over the maintenance API");
                None
            }
            Err(e) => fail(
                next,
                "ApplyFailed",
                format!(
                    "Talos (maintenance mode) did not apply configuration {}: {e}",
                    short(&rendered.sha256)
                ),
            ),
        };
    }
    let needs_reboot = dry.mode == ApplyMode::Reboot;
    let mode = if needs_reboot {
        ApplyMode::Staged
    } else {
        ApplyMode::NoReboot
    };
    match client.apply_configuration(data, mode, false).await {
        Ok(applied) => {
            let hash = rendered.sha256.clone();
            if needs_reboot {
                config_status(next).staged_hash = Some(hash.clone());
                status::set(
                    next.conditions_mut(),
                    "Configured",
                    false,
                    "RebootRequired",
                    &format!(
                        "configuration {} needs a reboot: it is staged on the node and takes effect at its next reboot, which the controller rolls with a `reboot` TalosOperation, one node at a time; Talos: {}",
                        short(&hash),
                        applied.details
                    ),
                );
                tracing::info!(machine = %format!("{ns}/{}", live.name()), hash = %short(&hash), "configuration staged: a reboot applies it");
                Some(backoff(next))
            } else {
                let c = config_status(next);
                c.applied_hash = Some(hash.clone());
                c.staged_hash = None;
                status::set(
                    next.conditions_mut(),
                    "Configured",
                    true,
                    "Applied",
                    &format!(
                        "configuration {} applied without a reboot ({})",
                        short(&hash),
                        applied.details
                    ),
                );
                tracing::info!(machine = %format!("{ns}/{}", live.name()), hash = %short(&hash), "configuration applied");
                None
            }
        }
        Err(e) => fail(
            next,
            "ApplyFailed",
            format!(
                "Talos did not apply configuration {}: {e}",
                short(&rendered.sha256)
            ),
        ),
    }
}
