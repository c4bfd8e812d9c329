//! The Talos API side of the controller: which node to dial for a machine, its etcd member,
//! a healthy sibling to read etcd through, and whether a departing member is dead
//! (ADR 0106 §4).

use super::Context;
use crate::runtime::objects::{Role, Snapshot, TalosMachine};
use crate::runtime::talos::{EtcdMember, TalosClient, TalosError};

/// The Kubernetes Node and etcd member name of a machine: `spec.hostname`, else its name.
pub fn node_name(m: &TalosMachine) -> &str {
    m.spec
        .hostname
        .as_deref()
        .filter(|h| !h.is_empty())
        .unwrap_or(m.name())
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "no Talos client credentials: give `ichor-rules serve --talosconfig` (the chart mounts the talosconfig Secret)"
    )]
    NoCredentials,
    #[error("TalosMachine {0} has no spec.endpoint to dial")]
    NoEndpoint(String),
    #[error(transparent)]
    Talos(#[from] TalosError),
}

/// A client for the machine's own node.
pub fn client(ctx: &Context, m: &TalosMachine) -> Result<TalosClient, NodeError> {
    let tls = ctx.talos.as_deref().ok_or(NodeError::NoCredentials)?;
    let endpoint = m
        .spec
        .endpoint
        .as_deref()
        .filter(|e| !e.is_empty())
        .ok_or_else(|| NodeError::NoEndpoint(format!("{}/{}", m.namespace(), m.name())))?;
    Ok(TalosClient::new(endpoint, tls, ctx.settings.talos_timeout)?)
}

/// A sibling control plane whose etcd answers with a leader, with the member list it sees.
pub struct Sibling<'s> {
    pub machine: &'s TalosMachine,
    pub client: TalosClient,
    pub members: Vec<EtcdMember>,
}

impl Sibling<'_> {
    pub fn member(&self, name: &str) -> Option<&EtcdMember> {
        self.members.iter().find(|m| m.hostname == name)
    }
}

/// The first approved control plane of the cluster other than `departing` whose etcd
/// answers with a leader (machines not being deleted first). Why none did, otherwise.
pub async fn healthy_sibling<'s>(
    ctx: &Context,
    snapshot: &'s Snapshot,
    departing: &TalosMachine,
) -> Result<Sibling<'s>, String> {
    let mut candidates: Vec<&TalosMachine> = snapshot
        .machines
        .iter()
        .filter(|m| {
            m.namespace() == departing.namespace()
                && m.cluster() == departing.cluster()
                && m.name() != departing.name()
                && m.approved_role() == Some(Role::ControlPlane)
        })
        .collect();
    candidates.sort_by_key(|m| (m.deleting(), m.name().to_string()));
    let mut why = Vec::new();
    for m in candidates {
        let c = match client(ctx, m) {
            Ok(c) => c,
            Err(e) => {
                why.push(format!("{}: {e}", m.name()));
                continue;
            }
        };
        match c.etcd_status().await {
            Ok(s) if s.leader != 0 => {}
            Ok(_) => {
                why.push(format!("{}: its etcd sees no leader", m.name()));
                continue;
            }
            Err(e) => {
                why.push(format!("{}: {e}", m.name()));
                continue;
            }
        }
        match c.etcd_member_list().await {
            Ok(members) => {
                return Ok(Sibling {
                    machine: m,
                    client: c,
                    members,
                });
            }
            Err(e) => why.push(format!("{}: {e}", m.name())),
        }
    }
    if why.is_empty() {
        why.push("no other approved control plane".into());
    }
    Err(why.join("; "))
}

/// What the controller could tell of a departing member (ADR 0106 §4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deadness {
    /// Proven dead: a healthy sibling lists it and it does not answer, or answers with no
    /// leader (or this removal already removed it as dead).
    Dead(String),
    /// It answers with a leader: alive.
    Alive(String),
    /// Nothing proves it either way (no sibling to ask, not listed, no endpoint to dial, no
    /// credentials): treated as not dead, so the declared-count refusal stays in place.
    CannotTell(String),
}

impl Deadness {
    pub fn is_dead(&self) -> bool {
        matches!(self, Deadness::Dead(_))
    }

    pub fn why(&self) -> &str {
        match self {
            Deadness::Dead(w) | Deadness::Alive(w) | Deadness::CannotTell(w) => w,
        }
    }
}

/// Whether the departing machine's etcd member is dead, and why (for logs, events and the
/// refusal's message).
///
/// Dead when a healthy sibling lists the member and the departing node is unreachable, its
/// etcd status fails, or it sees no leader. A sibling that cannot be found, a member the
/// sibling does not list, a machine with no `spec.endpoint` to dial, or missing
/// credentials: cannot tell, so not dead (nothing proves it, and the declared-count refusal
/// stands). A member that answers with a leader: alive.
///
/// `marked`: this removal already proceeded as a dead-member removal. A member etcd no
/// longer lists was then removed by it (a restart between the removal and its record), so
/// it stays dead; one that answers again is alive, whatever the record says.
pub async fn member_dead(
    ctx: &Context,
    snapshot: &Snapshot,
    departing: &TalosMachine,
    marked: bool,
) -> Deadness {
    let name = node_name(departing);
    let sibling = match healthy_sibling(ctx, snapshot, departing).await {
        Ok(s) => s,
        Err(why) => {
            return Deadness::CannotTell(format!(
                "there is no healthy sibling to read etcd through ({why})"
            ));
        }
    };
    if sibling.member(name).is_none() {
        if marked {
            return Deadness::Dead(format!(
                "etcd (through {}) no longer lists {name}: this dead-member removal removed it",
                sibling.machine.name()
            ));
        }
        return Deadness::CannotTell(format!(
            "etcd (through {}) does not list a member {name}",
            sibling.machine.name()
        ));
    }
    let c = match client(ctx, departing) {
        Ok(c) => c,
        // No address to dial is not an unreachable node: a cleared endpoint must not turn a
        // healthy control plane into a removable one.
        Err(NodeError::NoEndpoint(m)) => {
            return Deadness::CannotTell(format!(
                "TalosMachine {m} has no spec.endpoint, so its node cannot be asked; set \
                 spec.endpoint to the node's Talos API address so the controller can tell"
            ));
        }
        Err(e) => return Deadness::CannotTell(e.to_string()),
    };
    match c.etcd_status().await {
        Ok(s) if s.leader == 0 => Deadness::Dead("its etcd member sees no leader".into()),
        Ok(_) => Deadness::Alive("its etcd member answers with a leader".into()),
        Err(e @ TalosError::Unreachable { .. }) => {
            Deadness::Dead(format!("its etcd member is unreachable ({e})"))
        }
        Err(e) => Deadness::Dead(format!("its etcd status fails ({e})")),
    }
}

/// `healthy.after` as the controller reads it (the `targetEtcdClusterHealthy` check of
/// Cluster API): the members a healthy sibling lists, without the departing one, whose own
/// etcd answers with a leader. A member no approved machine dials, or that does not answer,
/// is not healthy. `Err` when no healthy sibling could be asked: the fact cannot be read,
/// and the removal waits (fails closed).
pub async fn healthy_after(
    ctx: &Context,
    snapshot: &Snapshot,
    departing: &TalosMachine,
) -> Result<i64, String> {
    let sibling = healthy_sibling(ctx, snapshot, departing).await?;
    let leaving = node_name(departing);
    let mut healthy = 0i64;
    for member in &sibling.members {
        if member.hostname == leaving || member.is_learner {
            continue;
        }
        let machine = snapshot.machines.iter().find(|m| {
            m.namespace() == departing.namespace()
                && m.cluster() == departing.cluster()
                && node_name(m) == member.hostname
        });
        let Some(machine) = machine else { continue };
        let Ok(c) = client(ctx, machine) else {
            continue;
        };
        if matches!(c.etcd_status().await, Ok(s) if s.leader != 0) {
            healthy += 1;
        }
    }
    Ok(healthy)
}
