//! Draining a Kubernetes Node: cordon, then evict its pods through the eviction API, which
//! honours PodDisruptionBudgets. Every call is safe to repeat: a cordoned node stays
//! cordoned, an evicted pod is gone.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};

pub use crate::runtime::exec::Drained;

fn daemon_set_pod(p: &Pod) -> bool {
    p.metadata.owner_references.as_ref().is_some_and(|o| {
        o.iter()
            .any(|r| r.kind == "DaemonSet" && r.controller == Some(true))
    })
}

fn mirror_pod(p: &Pod) -> bool {
    p.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
}

fn finished(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// The pods a drain must move: not DaemonSet pods (their controller puts them back) and
/// not static (mirror) pods, which the API cannot evict.
fn evictable(p: &Pod) -> bool {
    !daemon_set_pod(p) && !mirror_pod(p)
}

/// One pass of draining `node`: cordon, then evict what is left.
pub async fn drain(client: &Client, node: &str) -> Result<Drained, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(n) = nodes.get_opt(node).await? else {
        return Ok(Drained::Done);
    };
    let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    if !cordoned {
        let body = serde_json::json!({ "spec": { "unschedulable": true } });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
    }
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    // Every page: a first page of DaemonSet pods must not read as "nothing to evict".
    let list = crate::runtime::live::list_complete(&pods, &on_node).await?;
    let mut remaining = 0usize;
    for p in list.iter().filter(|p| evictable(p)) {
        let (Some(ns), Some(name)) = (p.metadata.namespace.as_deref(), p.metadata.name.as_deref())
        else {
            continue;
        };
        if p.metadata.deletion_timestamp.is_some() {
            remaining += 1;
            continue;
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        match api.evict(name, &EvictParams::default()).await {
            Ok(_) => {
                if !finished(p) {
                    remaining += 1;
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) => {
                return Ok(Drained::Blocked {
                    pod: format!("{ns}/{name}"),
                    message: refusal(&s),
                });
            }
            Err(e) => return Err(e),
        }
    }
    if remaining == 0 {
        return Ok(Drained::Done);
    }
    // Look again: an eviction usually deletes at once or within the grace period.
    let left = crate::runtime::live::list_complete(&pods, &on_node)
        .await?
        .iter()
        .filter(|p| evictable(p) && !finished(p))
        .count();
    Ok(if left == 0 {
        Drained::Done
    } else {
        Drained::Waiting { remaining: left }
    })
}

/// What a refused eviction says: its message, and the causes the API server gave with it
/// (for a PodDisruptionBudget, `The disruption budget web needs 1 healthy pods and has 1
/// currently`: the budget by name, which the message alone does not say).
fn refusal(s: &kube::core::Status) -> String {
    let causes: Vec<&str> = s
        .details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| c.message.trim())
                .filter(|m| !m.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if causes.is_empty() {
        s.message.clone()
    } else {
        format!("{} ({})", s.message, causes.join("; "))
    }
}

/// Cordons (`on`) or uncordons the Kubernetes Node `node`; whether it was cordoned before
/// (`None`: there is no such Node). Safe to repeat.
pub async fn cordon(client: &Client, node: &str, on: bool) -> Result<Option<bool>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(n) = nodes.get_opt(node).await? else {
        return Ok(None);
    };
    let was = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    if was != on {
        let body = serde_json::json!({ "spec": { "unschedulable": on } });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
    }
    Ok(Some(was))
}

/// Whether the Kubernetes Node `node` has Ready=True (`None`: there is no such Node).
pub async fn ready(client: &Client, node: &str) -> Result<Option<bool>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(n) = nodes.get_opt(node).await? else {
        return Ok(None);
    };
    Ok(Some(
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
    ))
}
