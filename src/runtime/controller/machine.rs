//! Reconciling a TalosMachine: the removal of a deleted control plane, else (in this
//! order) the ControlPlaneOverCap hold, the removal finalizer, and reachability probes.

use super::status::{self, Conditions};
use super::{Context, ReconcileError, finalizer, held, nodes, removal};
use crate::runtime::decide::{decide_events, reconcile_machine_event};
use crate::runtime::facts::Expensive;
use crate::runtime::live::Reads;
use crate::runtime::objects::{Role, TalosMachine};
use crate::runtime::talos::{TalosClient, TalosError};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use std::sync::Arc;
use std::time::Duration;

pub async fn reconcile(m: Arc<TalosMachine>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let (ns, name) = (m.namespace().to_string(), m.name().to_string());
    // The watch only said which machine to look at: read it and its siblings live (the
    // removal reads again, operations included, under the lock).
    let reads = Reads {
        machines: true,
        clusters: true,
        operations: false,
        backups: false,
    };
    let snapshot = ctx.reader.snapshot(&ns, &[m.cluster()], reads).await?;
    let Some(live) = snapshot.machine(&ns, &name) else {
        return Ok(Action::await_change());
    };
    if live.deleting() {
        if finalizer::has_removal(live) {
            return removal::run(&ctx, live).await;
        }
        return Ok(Action::await_change());
    }
    let Some(table) = ctx.rules.current() else {
        return Err(ReconcileError::NoRules);
    };
    let mut next = live.clone();

    // 1. Before anything else: the cap on approved control planes (ADR 0054).
    let events: Vec<_> = reconcile_machine_event(live).into_iter().collect();
    let started = std::time::Instant::now();
    let (decision, _) = decide_events(&table, &snapshot, &events, Expensive::Deferred, false);
    // A hold, and the decision that lifts one, are recorded (`--decision-log`) and the
    // hold's condition cites its decision; the allow of every periodic reconcile is not.
    let holding = decision.verdict() == Some(crate::vocab::Verdict::Hold);
    let was_held = live
        .ready_state()
        .is_some_and(|(status, reason)| status == "False" && table.owns_reason(reason));
    let mut journal = ctx
        .records
        .as_ref()
        .filter(|_| holding || was_held)
        .map(|r| {
            crate::runtime::step_records::Journal::new(
                r.clone(),
                "TalosMachine",
                &live.metadata,
                "",
                ctx.rules.loaded_digests(),
            )
        });
    if let Some(j) = journal.as_mut() {
        for ev in &events {
            j.decision(&table, &snapshot, *ev, &[], &decision, started);
        }
    }
    if let Some((reason, message)) = held(&ctx, &decision, "Held") {
        let message = match journal.as_mut() {
            Some(j) => j.cite(&message, &decision),
            None => message,
        };
        if status::set(next.conditions_mut(), "Ready", false, &reason, &message) {
            tracing::info!(machine = %format!("{ns}/{name}"), %reason, "held");
        }
        status::write(&ctx.client, live, &next).await?;
        return Ok(Action::requeue(ctx.settings.over_cap_requeue));
    }
    // A hold that lifted: the Ready=False it set goes, whatever the rule called its reason
    // (the table says which reasons are the rules'; NodeUnreachable is the probe's).
    if next
        .ready_state()
        .is_some_and(|(status, reason)| status == "False" && table.owns_reason(reason))
    {
        status::remove(next.conditions_mut(), "Ready");
    }

    // 2. The removal finalizer on approved control planes.
    if live.approved_role() == Some(Role::ControlPlane) && !finalizer::has_removal(live) {
        finalizer::set_removal(&ctx, live, true).await?;
    }

    // 3. Reachability of an approved machine's node.
    // With the cluster's own credentials (read live); without any, nothing is probed.
    let requeue = if live.approved_role().is_some() {
        let dialer = nodes::Dialer::for_machine(&ctx, live).await;
        match dialer.missing() {
            None => {
                let again = probe(&dialer, live, &mut next).await;
                // 4. Its Talos configuration (issue 37, `exec::apply`), once its node answers.
                let cluster = snapshot.cluster(&ns, live.cluster());
                if next.reachable_state() == Some("False") {
                    again
                } else {
                    let configured = super::configure::configure(
                        &ctx, &dialer, &table, &snapshot, cluster, live, &mut next,
                    )
                    .await?;
                    ready_follows_configured(&mut next);
                    match configured {
                        Some(retry) => again.min(retry),
                        // 5. Configured: the bootstrap of a new cluster, when the rules let it.
                        None if next.configured()
                            && live.approved_role() == Some(Role::ControlPlane) =>
                        {
                            super::bootstrap::reconcile(&ctx, &dialer, &table, &snapshot, live)
                                .await?
                                .map_or(again, |b| again.min(b))
                        }
                        None => again,
                    }
                }
            }
            Some(why) => {
                tracing::debug!(machine = %live.name(), %why, "not probed: no Talos credentials");
                ctx.settings.probe_interval
            }
        }
    } else {
        ctx.settings.probe_interval
    };
    status::write(&ctx.client, live, &next).await?;
    Ok(Action::requeue(requeue))
}

/// `Ready` follows the configuration (issue 37): True (reason `Configured`) once the node
/// runs the configuration rendered for it, with what was applied and since when; False
/// with the `Configured` condition's reason and words while it does not (a failed apply, a
/// refusal of Talos' dry run, a reboot still to come). Runs only for a machine neither held
/// nor unreachable (those set Ready themselves), and only when its cluster's configuration
/// is managed (a `Configured` condition exists).
fn ready_follows_configured(next: &mut TalosMachine) {
    let Some((ok, reason, message, since)) = next.configured_state() else {
        return;
    };
    let reason = if ok {
        "Configured".to_string()
    } else {
        reason.unwrap_or("NotConfigured").to_string()
    };
    let message = match (ok, since) {
        (true, Some(t)) => format!("{} (since {})", message.unwrap_or_default(), t.0),
        _ => message.unwrap_or_default().to_string(),
    };
    status::set(next.conditions_mut(), "Ready", ok, &reason, &message);
}

/// Probes the node through the Talos API and records what it found (ADR 0106 §3). Returns
/// when to probe again.
async fn probe(
    dialer: &nodes::Dialer<'_>,
    live: &TalosMachine,
    next: &mut TalosMachine,
) -> Duration {
    let ctx = dialer.ctx;
    let client = match nodes::client(dialer, live) {
        Ok(c) => c,
        Err(nodes::NodeError::NoEndpoint(_)) => return ctx.settings.probe_interval,
        Err(e) => {
            tracing::warn!(error = %e, "cannot probe");
            return ctx.settings.probe_interval;
        }
    };
    match client.version().await {
        Ok(_) => {
            status::remove(next.conditions_mut(), "NodeReachable");
            status::remove(next.conditions_mut(), "Maintenance");
            if next
                .ready_state()
                .is_some_and(|(_, reason)| reason == Some("NodeUnreachable"))
            {
                status::remove(next.conditions_mut(), "Ready");
            }
            ctx.settings.probe_interval
        }
        // A node in Talos' maintenance mode (no configuration yet) does not complete the
        // cluster's mTLS handshake; it answers the maintenance API.
        Err(e)
            if e.is_unreachable()
                && let Some(endpoint) = live.spec.endpoint.as_deref()
                && let Ok(m) = TalosClient::maintenance(endpoint, ctx.settings.talos_timeout)
                && m.version().await.is_ok() =>
        {
            status::remove(next.conditions_mut(), "NodeReachable");
            status::set(
                next.conditions_mut(),
                "Maintenance",
                true,
                "MaintenanceMode",
                &format!(
                    "the node at {endpoint} is in Talos' maintenance mode (not configured yet): its first configuration goes over the maintenance API"
                ),
            );
            ctx.settings.probe_interval
        }
        Err(e) => {
            let endpoint = live.spec.endpoint.clone().unwrap_or_default();
            let detail = match &e {
                TalosError::Unreachable { detail, .. } => detail.clone(),
                other => other.to_string(),
            };
            let already = next.unreachable_since().is_some();
            if !already {
                status::set(
                    next.conditions_mut(),
                    "NodeReachable",
                    false,
                    "ProbeFailed",
                    &format!("the node at {endpoint} did not answer: {detail}"),
                );
            }
            let since = next
                .unreachable_since()
                .flatten()
                .map(|t| t.0)
                .unwrap_or_else(Timestamp::now);
            let down_for = Timestamp::now().duration_since(since);
            let down = Duration::from_secs(u64::try_from(down_for.as_secs()).unwrap_or(0));
            if down >= ctx.settings.unreachable_grace {
                let mut message = format!(
                    "the node at {endpoint} has not answered for {}: {detail}",
                    human(down)
                );
                if let Some(hint) = new_address(ctx, live, &endpoint).await {
                    message.push_str(&format!("; spec.endpoint may need updating to {hint}"));
                }
                status::set(
                    next.conditions_mut(),
                    "Ready",
                    false,
                    "NodeUnreachable",
                    &message,
                );
                ctx.settings.probe_interval
            } else {
                // Look again when the grace period ends.
                (ctx.settings.unreachable_grace - down).max(Duration::from_millis(100))
            }
        }
    }
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// The InternalIP the machine's Kubernetes Node reports, when it differs from the host
/// dialled (with the dialled port).
async fn new_address(ctx: &Context, m: &TalosMachine, endpoint: &str) -> Option<String> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = nodes.get_opt(nodes::node_name(m)).await.ok().flatten()?;
    let ip = node
        .status?
        .addresses?
        .into_iter()
        .find(|a| a.type_ == "InternalIP")?
        .address;
    let (host, port) = split_host_port(endpoint);
    if ip == host {
        return None;
    }
    Some(match port {
        Some(p) if ip.contains(':') => format!("[{ip}]:{p}"),
        Some(p) => format!("{ip}:{p}"),
        None => ip,
    })
}

fn split_host_port(endpoint: &str) -> (&str, Option<&str>) {
    if let Some(rest) = endpoint.strip_prefix('[')
        && let Some((host, tail)) = rest.split_once(']')
    {
        return (host, tail.strip_prefix(':'));
    }
    match endpoint.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, Some(p)),
        _ => (endpoint, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port() {
        assert_eq!(
            split_host_port("10.0.0.1:50000"),
            ("10.0.0.1", Some("50000"))
        );
        assert_eq!(split_host_port("10.0.0.1"), ("10.0.0.1", None));
        assert_eq!(
            split_host_port("[fd00::1]:50000"),
            ("fd00::1", Some("50000"))
        );
        assert_eq!(split_host_port("fd00::1"), ("fd00::1", None));
        assert_eq!(human(Duration::from_secs(75)), "1m15s");
        assert_eq!(human(Duration::from_secs(7300)), "2h1m");
    }
}
