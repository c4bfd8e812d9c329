//! Issue 37: the controller publishes the cluster's base configuration redacted in the
//! TalosCluster's status (one reconcile), and the webhook's dry render against what it
//! published refuses the seed's patch exactly as a render against the real base fails.

use crate::support::apiserver::ApiServer;
use crate::support::controller::{condition, context, get};
use crate::support::objects::{self, NAMESPACE};
use base64::Engine as _;
use ichor_rules::runtime::configpatch::{dry_render, published_base};
use ichor_rules::runtime::controller::cluster;
use ichor_rules::runtime::objects::{TalosCluster, TalosConfigPatch, TalosMachine};
use ichor_rules::runtime::render::Base;
use serde_json::json;
use std::sync::Arc;

const CP: &str = include_str!("fixtures/talos/controlplane.yaml");
const WORKER: &str = include_str!("fixtures/talos/worker.yaml");

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

async fn reconcile(api: &ApiServer) -> TalosCluster {
    let ctx = context(api, "test", None);
    let clusters = kube::Api::<TalosCluster>::namespaced(api.client(), NAMESPACE);
    let fresh = Arc::new(clusters.get("prod").await.unwrap());
    cluster::reconcile(fresh, ctx).await.unwrap();
    clusters.get("prod").await.unwrap()
}

#[tokio::test]
async fn the_controller_publishes_the_redacted_base_and_the_dry_render_uses_it() {
    let api = ApiServer::start().await;
    let mut c = objects::cluster("prod", 3).schedulable("true").build();
    c["spec"]["baseConfigSecretRef"] = json!({"name": "prod-base"});
    api.insert(c);
    // No Secret yet: said, nothing published.
    let c = reconcile(&api).await;
    let obj = get(&api, "TalosCluster", "prod").unwrap();
    assert_eq!(
        condition(&obj, "BaseConfig").unwrap()["reason"],
        "BaseSecretMissing",
        "{obj:#}"
    );
    assert!(published_base(&c).is_none());
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-base", "namespace": NAMESPACE},
        "type": "Opaque",
        "data": {"controlplane.yaml": b64(CP), "worker.yaml": b64(WORKER)}
    }));
    let c = reconcile(&api).await;
    let obj = get(&api, "TalosCluster", "prod").unwrap();
    assert_eq!(
        condition(&obj, "BaseConfig").unwrap()["reason"],
        "Published"
    );
    assert!(!obj.to_string().contains("SECRET-BASE"), "{obj:#}");
    let real = Base::parse(CP, WORKER, true).unwrap();
    let published = published_base(&c).expect("published");
    assert_eq!(published.digest, real.digest);
    assert_eq!(published.controlplane, real.redacted().controlplane);
    // The dry render against it: the seed's patch breaks the control planes, not workers.
    let machines: Vec<TalosMachine> = [("cp-1", "controlplane"), ("w-1", "worker")]
        .iter()
        .map(|(n, r)| {
            serde_json::from_value(objects::machine(n).role(r).approved(true).build()).unwrap()
        })
        .collect();
    let patch: TalosConfigPatch = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosConfigPatch",
        "metadata": {"name": "api", "namespace": NAMESPACE},
        "spec": {"clusterRef": {"name": "prod"},
                 "patches": {"strategic": "version: v1alpha1\ncluster:\n  apiServer:\n    image: x\n"}}
    }))
    .unwrap();
    let d = dry_render(Some(&published), &machines, &[], &patch);
    assert_eq!((d.selects, d.breaks), (2, 1), "{d:?}");
    assert_eq!(
        d.error,
        "cp-1: kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)"
    );
    // The same against the real base.
    assert_eq!(dry_render(Some(&real), &machines, &[], &patch), d);
}
