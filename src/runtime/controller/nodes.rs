//! The Talos API side of the controller: the credentials of a cluster, and the client for a
//! machine's node. What is asked of etcd through them, and how the answers are judged, is
//! the executor's (`runtime::exec::etcd`), shared with `verify`'s model.

use super::Context;
use crate::runtime::objects::{TalosCluster, TalosMachine};
use crate::runtime::secrets;
use crate::runtime::talos::{TalosClient, TalosContext, TalosTls};
use kube::Api;
use std::sync::Arc;

pub use crate::runtime::exec::NodeError;
pub use crate::runtime::exec::etcd::{
    Deadness, MemberHealth, Sibling, judge_member, node_name, peer_host,
};

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
        Dialer::for_named(ctx, m.namespace(), m.cluster()).await
    }

    /// Reads TalosCluster `namespace/cluster` live, then [`Dialer::for_cluster`].
    pub async fn for_named(ctx: &'c Context, namespace: &str, cluster: &str) -> Dialer<'c> {
        let api: Api<TalosCluster> = Api::namespaced(ctx.client.clone(), namespace);
        let read = tokio::time::timeout(ctx.settings.read_timeout, api.get_opt(cluster)).await;
        let tls = match read {
            Ok(Ok(found)) => credentials(ctx, namespace, cluster, found.as_ref()).await,
            Ok(Err(e)) => Err(format!(
                "TalosCluster {namespace}/{cluster} could not be read to find its talosConfigSecretRef ({})",
                api_reason(&e)
            )),
            Err(_) => Err(format!(
                "TalosCluster {namespace}/{cluster} could not be read to find its talosConfigSecretRef (timed out)"
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
    Ok(TalosClient::new(
        endpoint(m)?,
        tls,
        ctx.settings.talos_timeout,
    )?)
}

/// The address `m`'s node is dialled at: its `spec.endpoint`, which must not be empty.
fn endpoint(m: &TalosMachine) -> Result<&str, NodeError> {
    m.spec
        .endpoint
        .as_deref()
        .filter(|e| !e.is_empty())
        .ok_or_else(|| NodeError::NoEndpoint(format!("{}/{}", m.namespace(), m.name())))
}

/// A client of `m`'s node over Talos' maintenance API (no client certificate): only a
/// node with no configuration yet answers there.
pub fn maintenance_client(d: &Dialer<'_>, m: &TalosMachine) -> Result<TalosClient, NodeError> {
    Ok(TalosClient::maintenance(
        endpoint(m)?,
        d.ctx.settings.talos_timeout,
    )?)
}
