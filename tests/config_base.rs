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

/// A base the controller can no longer render from is no longer published: the webhook's
/// dry render does not judge patches against a base the machines are not rendered from
/// (audit of issue 37). A Secret that could not be read (the API server failing) keeps
/// the last base read; the condition says which.
#[tokio::test]
async fn a_base_that_no_longer_reads_is_withdrawn_from_the_status() {
    use k8s_openapi::api::core::v1::Secret;
    let api = ApiServer::start().await;
    let mut c = objects::cluster("prod", 3).schedulable("true").build();
    c["spec"]["baseConfigSecretRef"] = json!({"name": "prod-base"});
    api.insert(c);
    let secrets = kube::Api::<Secret>::namespaced(api.client(), NAMESPACE);
    let secret = |cp: &str| -> Secret {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "prod-base", "namespace": NAMESPACE},
            "type": "Opaque",
            "data": {"controlplane.yaml": b64(cp), "worker.yaml": b64(WORKER)}
        }))
        .unwrap()
    };
    let pp = kube::api::PostParams::default();
    secrets.create(&pp, &secret(CP)).await.unwrap();
    let reason = |api: &ApiServer| {
        let obj = get(api, "TalosCluster", "prod").unwrap();
        condition(&obj, "BaseConfig").map(|c| c["reason"].as_str().unwrap_or("").to_string())
    };
    let c = reconcile(&api).await;
    assert!(published_base(&c).is_some());
    assert_eq!(reason(&api).as_deref(), Some("Published"));
    // Broken: not YAML. Withdrawn, and the condition says why (naming no content).
    let put = |s: Secret| {
        let secrets = secrets.clone();
        async move {
            let mut s = s;
            s.metadata.resource_version = secrets
                .get("prod-base")
                .await
                .unwrap()
                .metadata
                .resource_version;
            secrets
                .replace("prod-base", &Default::default(), &s)
                .await
                .unwrap();
        }
    };
    put(secret("machine: [unclosed\n")).await;
    let c = reconcile(&api).await;
    assert!(published_base(&c).is_none(), "{:?}", c.status);
    assert_eq!(reason(&api).as_deref(), Some("BaseInvalid"));
    let raw = get(&api, "TalosCluster", "prod").unwrap();
    assert!(raw["status"].get("redactedBase").is_none(), "{raw:#}");
    // Mended: published again, the same digest as the first time.
    put(secret(CP)).await;
    let c = reconcile(&api).await;
    let real = Base::parse(CP, WORKER, true).unwrap();
    assert_eq!(
        published_base(&c).map(|b| b.digest),
        Some(real.digest.clone())
    );
    // Unreadable for a while (the API server failing): the last base read stays.
    api.store.faults.fail_next(100, Some("/secrets/prod-base"));
    let c = reconcile(&api).await;
    api.store.faults.fail_next(0, None);
    assert_eq!(reason(&api).as_deref(), Some("BaseSecretUnreadable"));
    assert_eq!(published_base(&c).map(|b| b.digest), Some(real.digest));
    // Gone: withdrawn.
    secrets
        .delete("prod-base", &Default::default())
        .await
        .unwrap();
    let c = reconcile(&api).await;
    assert!(published_base(&c).is_none());
    assert_eq!(reason(&api).as_deref(), Some("BaseSecretMissing"));
    // Back, then the reference dropped from the spec: withdrawn, and no BaseConfig at all.
    secrets.create(&pp, &secret(CP)).await.unwrap();
    assert!(published_base(&reconcile(&api).await).is_some());
    let clusters = kube::Api::<TalosCluster>::namespaced(api.client(), NAMESPACE);
    clusters
        .patch(
            "prod",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"baseConfigSecretRef": null}})),
        )
        .await
        .unwrap();
    let c = reconcile(&api).await;
    assert!(published_base(&c).is_none());
    assert_eq!(reason(&api), None);
}
