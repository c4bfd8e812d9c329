//! The bootstrap of a new cluster's etcd (issue 37): once the first approved control
//! plane's configuration is applied, the controller asks the `bootstrap controlplane` rules
//! whether to send Talos' `Bootstrap` to it, with the facts read live (`etcd.members`:
//! `EtcdMemberList` of every control plane of the cluster; `bootstrapped`: the record on
//! the TalosCluster). Allowed, it first records the bootstrap in the TalosCluster's status
//! (`status.bootstrap`), with a merge patch naming the resourceVersion it read: of two
//! controllers deciding at once, one write wins and the other gets a conflict and sends
//! nothing. Only then is `Bootstrap` sent. A call whose answer is lost is never sent
//! again: the record stays, the rules refuse every later bootstrap, and the controller
//! confirms it by reading etcd (a member listed on any control plane). Talos itself refuses
//! a second bootstrap on a node whose etcd data directory is not empty.
//!
//! The decision is the rules'; this module only reads, records and calls.

use super::Context;
use super::nodes;
use crate::runtime::decide::bootstrap_event;
use crate::runtime::exec::rules::decide;
use crate::runtime::objects::{BootstrapRecord, Role, Snapshot, TalosCluster, TalosMachine};
use crate::runtime::talos::TalosError;
use crate::vocab::Fact;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use std::time::Duration;

/// The control planes of the cluster that may run etcd: every TalosMachine of it with the
/// role controlplane, approved or not, not being deleted.
fn control_planes<'s>(snapshot: &'s Snapshot, m: &TalosMachine) -> Vec<&'s TalosMachine> {
    snapshot
        .machines
        .iter()
        .filter(|o| {
            o.namespace() == m.namespace()
                && o.cluster() == m.cluster()
                && o.spec.role == Some(Role::ControlPlane)
                && !o.deleting()
        })
        .collect()
}

/// `etcd.members`, asked live: the most members any control plane's etcd lists. A node
/// that answers with an error (its etcd is not running) lists none; one that does not
/// answer (or has no endpoint) makes the count unreadable: `Err(why)`.
pub async fn etcd_members(
    dialer: &nodes::Dialer<'_>,
    snapshot: &Snapshot,
    m: &TalosMachine,
) -> Result<i64, String> {
    let mut most = 0usize;
    for cp in control_planes(snapshot, m) {
        let client = nodes::client(dialer, cp).map_err(|e| format!("{}: {e}", cp.name()))?;
        match client.etcd_member_list().await {
            Ok(list) => most = most.max(list.len()),
            // The node answered: its etcd is not running (or not yet).
            Err(TalosError::Failed { .. }) => {}
            Err(e) => return Err(format!("{} did not answer: {e}", cp.name())),
        }
    }
    Ok(i64::try_from(most).unwrap_or(i64::MAX))
}

/// Writes `record` as the cluster's `status.bootstrap`. With `guard`, the patch names the
/// resourceVersion read (`Ok(false)`: another writer came first, 409).
async fn record(
    ctx: &Context,
    cluster: &TalosCluster,
    record: &BootstrapRecord,
    guard: bool,
) -> Result<bool, kube::Error> {
    let api: Api<TalosCluster> = Api::namespaced(ctx.client.clone(), cluster.namespace());
    let mut body = serde_json::json!({ "status": { "bootstrap": record } });
    if guard {
        body["metadata"] = serde_json::json!({
            "resourceVersion": cluster.metadata.resource_version.clone().unwrap_or_default()
        });
    }
    match api
        .patch_status(
            cluster.name(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Bootstraps the cluster of `live` (a configured, approved control plane) when the rules
/// let it; returns when to look again (`None`: nothing left to do here).
pub async fn reconcile(
    ctx: &Context,
    dialer: &nodes::Dialer<'_>,
    table: &crate::compile::Table,
    snapshot: &Snapshot,
    live: &TalosMachine,
) -> Result<Option<Duration>, kube::Error> {
    let Some(cluster) = snapshot.cluster(live.namespace(), live.cluster()) else {
        return Ok(None);
    };
    let retry = ctx.settings.refused_requeue;
    let who = format!("{}/{}", live.namespace(), live.name());
    match cluster.bootstrap_record() {
        Some(r) if r.confirmed => return Ok(None),
        // Sent, its answer lost: confirmed by etcd, never sent again.
        Some(r) => {
            if r.machine != live.name() {
                return Ok(None);
            }
            return Ok(match etcd_members(dialer, snapshot, live).await {
                Ok(n) if n > 0 => {
                    let mut done = r.clone();
                    done.confirmed = true;
                    done.message = Some(format!(
                        "etcd runs: {n} member(s) listed after the Bootstrap sent to {}",
                        r.machine
                    ));
                    record(ctx, cluster, &done, false).await?;
                    tracing::info!(machine = %who, "bootstrap confirmed by etcd");
                    None
                }
                _ => Some(retry),
            });
        }
        None => {}
    }
    let Some(ev) = bootstrap_event(live) else {
        return Ok(None);
    };
    // Ask, supply, decide: `etcd.members` is read only when a rule needs it.
    let mut supplied: Vec<(Fact, i64)> = Vec::new();
    let decision = loop {
        match decide(table, snapshot, ev, &supplied) {
            Ok(d) => break d,
            Err(Fact::EtcdMembers) if supplied.is_empty() => {
                match etcd_members(dialer, snapshot, live).await {
                    Ok(n) => supplied.push((Fact::EtcdMembers, n)),
                    Err(why) => {
                        tracing::info!(machine = %who, %why, "bootstrap not decided: etcd.members cannot be read");
                        return Ok(Some(retry));
                    }
                }
            }
            Err(f) => {
                tracing::warn!(machine = %who, fact = %f, "bootstrap not decided: a fact the controller cannot read");
                return Ok(Some(retry));
            }
        }
    };
    if let Some((_, why)) = super::held(ctx, &decision, "BootstrapRefused") {
        tracing::debug!(machine = %who, %why, "not bootstrapped");
        // etcd runs already (an existing cluster, or one bootstrapped by hand): recorded,
        // so it is not asked again on every reconcile.
        if let Some((_, n)) = supplied.iter().find(|(_, n)| *n > 0) {
            let found = BootstrapRecord {
                machine: String::new(),
                sent_at: None,
                by: Some(ctx.settings.identity.clone()),
                confirmed: true,
                message: Some(format!(
                    "etcd already ran ({n} member(s) listed) when {} was configured: no Bootstrap sent",
                    live.name()
                )),
            };
            record(ctx, cluster, &found, true).await?;
        }
        return Ok(None);
    }
    // Allowed: record first, guarded, so only one controller ever sends it.
    let mut r = BootstrapRecord {
        machine: live.name().to_string(),
        sent_at: Some(Time(Timestamp::now())),
        by: Some(ctx.settings.identity.clone()),
        confirmed: false,
        message: None,
    };
    if !record(ctx, cluster, &r, true).await? {
        tracing::info!(machine = %who, "bootstrap recorded by another writer first: not sent");
        return Ok(Some(ctx.settings.lock_retry));
    }
    let client = match nodes::client(dialer, live) {
        Ok(c) => c,
        Err(e) => {
            r.message = Some(format!(
                "recorded, but {} could not be dialled ({e}); the bootstrap is not sent again by the controller",
                live.name()
            ));
            record(ctx, cluster, &r, false).await?;
            return Ok(Some(retry));
        }
    };
    match client.bootstrap().await {
        Ok(()) => {
            r.confirmed = true;
            r.message = Some(format!("Talos bootstrapped etcd on {}", live.name()));
            record(ctx, cluster, &r, false).await?;
            tracing::info!(machine = %who, "bootstrapped");
            ctx.event(
                cluster,
                false,
                "Bootstrapped",
                format!("etcd bootstrapped on {}", live.name()),
            )
            .await;
            Ok(None)
        }
        Err(e) => {
            // Maybe it acted: never sent again; etcd will tell.
            let message = format!(
                "Bootstrap sent to {} did not answer cleanly ({e}); it is not sent again: \
                 the controller confirms it once etcd lists a member",
                live.name()
            );
            r.message = Some(message.clone());
            record(ctx, cluster, &r, false).await?;
            tracing::warn!(machine = %who, error = %e, "bootstrap answer lost or refused");
            ctx.event(cluster, true, "BootstrapUnconfirmed", message)
                .await;
            Ok(Some(retry))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_camel_case_and_omits_what_is_unknown() {
        let r = BootstrapRecord {
            machine: "cp-1".into(),
            sent_at: None,
            by: Some("controller-0".into()),
            confirmed: false,
            message: None,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"machine": "cp-1", "by": "controller-0", "confirmed": false})
        );
    }
}
