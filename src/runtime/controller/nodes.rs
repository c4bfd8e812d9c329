//! The Talos API side of the controller: which node to dial for a machine, its etcd member,
//! a healthy sibling to read etcd through, and whether a departing member is dead
//! (ADR 0106 §4).

use super::Context;
use crate::runtime::objects::{Role, Snapshot, TalosCluster, TalosMachine};
use crate::runtime::secrets;
use crate::runtime::talos::{EtcdMember, TalosClient, TalosContext, TalosError, TalosTls};
use kube::Api;
use std::sync::Arc;

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
    /// Why there are no Talos credentials for the machine's cluster (see [`Dialer`]).
    #[error("no Talos API credentials: {0}")]
    NoCredentials(String),
    #[error("TalosMachine {0} has no spec.endpoint to dial")]
    NoEndpoint(String),
    #[error(transparent)]
    Talos(#[from] TalosError),
}

/// The Talos credentials of one cluster, resolved once per reconcile, with the context they
/// are used in. Every Talos call of a reconcile goes through one: a cluster's nodes are only
/// ever dialled with that cluster's credentials.
pub struct Dialer<'c> {
    pub ctx: &'c Context,
    tls: Result<Arc<TalosTls>, String>,
}

impl<'c> Dialer<'c> {
    /// The credentials for the nodes of TalosCluster `namespace/name` (`cluster`: the object,
    /// read live by the caller, `None` when it does not exist):
    ///
    /// - its `spec.talosConfigSecretRef`, when it names one: that Secret, read now (a GET of
    ///   that one Secret in the cluster's namespace), never cached and never logged;
    /// - else the talosconfig given for every cluster (`serve --talosconfig
    ///   --talosconfig-for-all-clusters`), when the operator opted into it;
    /// - else none, with why (the Removal condition's NoTalosCredentials message). Never
    ///   another cluster's.
    pub async fn for_cluster(
        ctx: &'c Context,
        namespace: &str,
        name: &str,
        cluster: Option<&TalosCluster>,
    ) -> Dialer<'c> {
        let tls = credentials(ctx, namespace, name, cluster).await;
        Dialer { ctx, tls }
    }

    /// Reads the machine's TalosCluster live, then [`Dialer::for_cluster`].
    pub async fn for_machine(ctx: &'c Context, m: &TalosMachine) -> Dialer<'c> {
        let api: Api<TalosCluster> = Api::namespaced(ctx.client.clone(), m.namespace());
        let read = tokio::time::timeout(ctx.settings.read_timeout, api.get_opt(m.cluster())).await;
        let tls = match read {
            Ok(Ok(cluster)) => credentials(ctx, m.namespace(), m.cluster(), cluster.as_ref()).await,
            Ok(Err(e)) => Err(format!(
                "TalosCluster {}/{} could not be read to find its talosConfigSecretRef ({})",
                m.namespace(),
                m.cluster(),
                api_reason(&e)
            )),
            Err(_) => Err(format!(
                "TalosCluster {}/{} could not be read to find its talosConfigSecretRef (timed out)",
                m.namespace(),
                m.cluster()
            )),
        };
        Dialer { ctx, tls }
    }

    /// Why there are no credentials, if there are none.
    pub fn missing(&self) -> Option<&str> {
        self.tls.as_ref().err().map(String::as_str)
    }
}

/// An API error in a few words, without the server's text (which may quote the request).
fn api_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("the API server answered {} {}", s.code, s.reason),
        _ => "the API server could not be reached".into(),
    }
}

/// See [`Dialer::for_cluster`]. The error is one sentence saying what is missing and how to
/// fix it; it never quotes the Secret's content.
async fn credentials(
    ctx: &Context,
    namespace: &str,
    name: &str,
    cluster: Option<&TalosCluster>,
) -> Result<Arc<TalosTls>, String> {
    let reference = cluster.and_then(|c| c.spec.talos_config_secret_ref.as_ref());
    let Some(r) = reference else {
        if let Some(all) = &ctx.talos {
            return Ok(all.clone());
        }
        return Err(match cluster {
            None => format!(
                "TalosCluster {namespace}/{name} does not exist, so no talosConfigSecretRef names \
                 its credentials (and no talosconfig is given for every cluster)"
            ),
            Some(_) => format!(
                "TalosCluster {namespace}/{name} has no spec.talosConfigSecretRef: create a Secret \
                 in namespace {namespace} holding this cluster's talosconfig (key `talosconfig`) \
                 and name it there (the controller uses one talosconfig for every cluster only \
                 with --talosconfig-for-all-clusters)"
            ),
        });
    };
    let (secret, key) = (r.name.as_str(), r.key());
    // Read as raw JSON and decoded here (`runtime::secrets`): the kube client would log
    // an answer it cannot decode, credentials and all.
    let read = tokio::time::timeout(
        ctx.settings.read_timeout,
        secrets::get(&ctx.client, namespace, secret),
    )
    .await;
    let found = match read {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            return Err(format!(
                "the Secret {namespace}/{secret} (spec.talosConfigSecretRef of TalosCluster \
                 {name}) could not be read ({e})"
            ));
        }
        Err(_) => {
            return Err(format!(
                "the Secret {namespace}/{secret} (spec.talosConfigSecretRef of TalosCluster \
                 {name}) could not be read (timed out)"
            ));
        }
    };
    let Some(found) = found else {
        return Err(format!(
            "the Secret {namespace}/{secret} named by spec.talosConfigSecretRef of TalosCluster \
             {name} does not exist: create it with the cluster's talosconfig under the key `{key}`"
        ));
    };
    let bytes = match found.value(key) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return Err(format!(
                "the Secret {namespace}/{secret} (spec.talosConfigSecretRef of TalosCluster {name}) \
                 has no key `{key}`: put the cluster's talosconfig there, or name its key in \
                 spec.talosConfigSecretRef.key"
            ));
        }
        Err(why) => {
            return Err(format!(
                "the key `{key}` of Secret {namespace}/{secret} (spec.talosConfigSecretRef of \
                 TalosCluster {name}) {why}, so it is not a talosconfig"
            ));
        }
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| {
        format!(
            "the key `{key}` of Secret {namespace}/{secret} is not UTF-8 text, so it is not a \
             talosconfig"
        )
    })?;
    // Said without the talosconfig's content: no parser detail, no context's name.
    TalosContext::parse(text, None)
        .map(|c| Arc::new(c.tls))
        .map_err(|p| {
            format!(
                "the key `{key}` of Secret {namespace}/{secret} (spec.talosConfigSecretRef of \
                 TalosCluster {name}) is not a usable talosconfig: {}",
                p.without_content()
            )
        })
}

/// A client for the machine's own node, with its cluster's credentials.
pub fn client(d: &Dialer<'_>, m: &TalosMachine) -> Result<TalosClient, NodeError> {
    let ctx = d.ctx;
    let tls = d
        .tls
        .as_deref()
        .map_err(|why| NodeError::NoCredentials(why.clone()))?;
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
    d: &Dialer<'_>,
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
        let c = match client(d, m) {
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
    d: &Dialer<'_>,
    snapshot: &Snapshot,
    departing: &TalosMachine,
    marked: bool,
) -> Deadness {
    let name = node_name(departing);
    let sibling = match healthy_sibling(d, snapshot, departing).await {
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
    let c = match client(d, departing) {
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

/// `members.after` as the controller reads it: the voting members a healthy sibling lists,
/// without the departing one, answering or not. A replacement that is approved but has not
/// joined etcd yet (or is still a learner) is not one. `Err` when no healthy sibling could
/// be asked: the fact cannot be read, and the removal waits (fails closed).
pub async fn members_after(
    d: &Dialer<'_>,
    snapshot: &Snapshot,
    departing: &TalosMachine,
) -> Result<i64, String> {
    let sibling = healthy_sibling(d, snapshot, departing).await?;
    let n = staying(&sibling, departing).count();
    Ok(i64::try_from(n).unwrap_or(i64::MAX))
}

/// The voting members a sibling lists, without the departing one.
fn staying<'a>(
    sibling: &'a Sibling<'_>,
    departing: &TalosMachine,
) -> impl Iterator<Item = &'a EtcdMember> {
    let leaving = node_name(departing);
    sibling
        .members
        .iter()
        .filter(move |m| m.hostname != leaving && !m.is_learner)
}

/// `healthy.after` as the controller reads it (the `targetEtcdClusterHealthy` check of
/// Cluster API): the members a healthy sibling lists, without the departing one, whose own
/// etcd answers with a leader. A member no approved machine dials, or that does not answer,
/// is not healthy. `Err` when no healthy sibling could be asked: the fact cannot be read,
/// and the removal waits (fails closed).
pub async fn healthy_after(
    d: &Dialer<'_>,
    snapshot: &Snapshot,
    departing: &TalosMachine,
) -> Result<i64, String> {
    let sibling = healthy_sibling(d, snapshot, departing).await?;
    let mut healthy = 0i64;
    for member in staying(&sibling, departing) {
        let machine = snapshot.machines.iter().find(|m| {
            m.namespace() == departing.namespace()
                && m.cluster() == departing.cluster()
                && node_name(m) == member.hostname
        });
        let Some(machine) = machine else { continue };
        let Ok(c) = client(d, machine) else {
            continue;
        };
        if matches!(c.etcd_status().await, Ok(s) if s.leader != 0) {
            healthy += 1;
        }
    }
    Ok(healthy)
}
