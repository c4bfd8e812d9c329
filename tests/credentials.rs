//! Per-cluster Talos credentials (issue 13): each TalosCluster names the Secret holding its
//! own talosconfig (`spec.talosConfigSecretRef`), the controller reads it live and dials
//! that cluster's nodes with it and nothing else, and a cluster whose Secret is missing gets
//! `Removal=False NoTalosCredentials` naming it instead of any other credentials. Real etcd
//! behind Talos API stand-ins with their own CA, the controller in-process against the
//! in-process API server.

use crate::support::apiserver;
use crate::support::controller as harness;
use crate::support::etcd;
use crate::support::objects;
use crate::support::talos;

use apiserver::ApiServer;
use base64::Engine as _;
use etcd::EtcdCluster;
use harness::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use talos::{Pki, TalosApi};

const WAIT: Duration = Duration::from_secs(40);

fn secret(namespace: &str, name: &str, key: &str, talosconfig: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {key: base64::engine::general_purpose::STANDARD.encode(talosconfig)}
    })
}

fn cluster_with_secret(namespace: &str, name: &str, count: i64, secret: Value) -> Value {
    objects::cluster(name, count)
        .namespace(namespace)
        .schedulable("true")
        .secret(secret)
        .build()
}

fn removal(api: &ApiServer, name: &str) -> Option<(String, String, String)> {
    let m = get(api, "TalosMachine", name)?;
    let c = condition(&m, "Removal")?;
    Some((
        c["status"].as_str().unwrap_or("").into(),
        c["reason"].as_str().unwrap_or("").into(),
        c["message"].as_str().unwrap_or("").into(),
    ))
}

/// Cluster A (`infra/prod`, four control planes of a declared three) names its own Secret;
/// cluster B (`other/edge`) names another, with a talosconfig of another CA, and B's
/// credentials are also what the controller was given "for every cluster". The removal of
/// one of A's control planes waits, saying which Secret is missing, until A's own Secret
/// exists; then it runs with A's credentials, and neither B's Secret nor the credentials
/// for every cluster are ever used for A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_in_cluster_a_uses_a_credentials_and_never_b() {
    let names = ["cp-1", "cp-2", "cp-3", "cp-4"];
    let etcd = EtcdCluster::start_named(&names).await;
    let a = TalosApi::start(etcd).await;
    let b = Pki::new();
    let api = ApiServer::start().await;
    api.insert(cluster_with_secret(
        NS,
        "prod",
        3,
        json!({"name": "prod-talos", "key": "config"}),
    ));
    api.insert(cluster_with_secret(
        "other",
        "edge",
        1,
        json!({"name": "edge-talos"}),
    ));
    api.insert(secret(
        "other",
        "edge-talos",
        "talosconfig",
        &b.talosconfig("edge", &[], &[]),
    ));
    // A decoy in A's namespace under the default key name: not what A's reference names.
    api.insert(secret(
        NS,
        "prod-talos-old",
        "talosconfig",
        &b.talosconfig("edge", &[], &[]),
    ));
    for (i, n) in names.iter().enumerate() {
        let mut m = control_plane(n, u32::try_from(i).expect("small") + 1);
        m["spec"]["endpoint"] = json!(a.node(i).endpoint());
        api.insert(m);
        api.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n}, "spec": {},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
        }));
    }
    // B's credentials as the talosconfig "for every cluster": A names its own Secret, so
    // they must never be used for it, not even while A's Secret is missing.
    let _c = Running::start(context(
        &api,
        "controller-1",
        Some(Arc::new(b.client_tls())),
    ));
    wait_for("finalizers", WAIT, || {
        names.iter().all(|n| has_finalizer(&api, n))
    })
    .await;

    delete(&api, "TalosMachine", "cp-1").await;
    wait_for("NoTalosCredentials", WAIT, || {
        removal(&api, "cp-1").is_some_and(|(s, r, _)| s == "False" && r == "NoTalosCredentials")
    })
    .await;
    let (_, _, msg) = removal(&api, "cp-1").expect("removal");
    assert!(
        msg.contains("the Secret infra/prod-talos")
            && msg.contains("does not exist")
            && msg.contains("key `config`"),
        "the condition names the missing Secret and its key: {msg}"
    );
    assert!(
        !events(&api, "cp-1", "NoTalosCredentials").is_empty(),
        "a Warning event says so too"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let members: BTreeSet<String> = a.etcd.member_names().await.into_iter().collect();
    assert_eq!(members.len(), 4, "nothing left etcd without credentials");
    assert_eq!(a.by_name("cp-1").resets(), 0);
    let node = get(&api, "Node", "cp-1").expect("node");
    assert!(
        node["spec"]["unschedulable"].is_null(),
        "not drained without credentials"
    );

    // A's own Secret arrives (the key A's reference names): the removal runs with it.
    api.insert(secret(NS, "prod-talos", "config", &a.talosconfig_yaml()));
    wait_for("cp-1 removed", WAIT, || {
        get(&api, "TalosMachine", "cp-1").is_none()
    })
    .await;
    let members: BTreeSet<String> = a.etcd.member_names().await.into_iter().collect();
    assert_eq!(
        members,
        ["cp-2", "cp-3", "cp-4"]
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()
    );
    assert_eq!(
        a.by_name("cp-1").resets(),
        1,
        "reset once, with A's credentials"
    );

    // The controller read exactly A's Secret, by name: never B's, never the decoy, never a
    // list or a watch of Secrets.
    let log = api.store.faults.take_log();
    let secret_calls: Vec<&apiserver::Request> = log
        .iter()
        .filter(|r| !r.by_test && r.path.contains("/secrets"))
        .collect();
    assert!(!secret_calls.is_empty(), "the Secret is read live");
    for r in &secret_calls {
        assert_eq!(r.method, "GET", "{r:?}");
        assert!(!r.watch, "{r:?}");
        assert_eq!(
            r.path.split('?').next(),
            Some("/api/v1/namespaces/infra/secrets/prod-talos"),
            "{r:?}"
        );
    }
    assert_calls_granted(&api);
}

/// A cluster that names no Secret gets no Talos work and says so, when the controller was
/// not told to use one talosconfig for every cluster; with that opt-in, it uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_a_secret_gets_no_credentials_unless_the_operator_opted_in() {
    let names = ["cp-1", "cp-2", "cp-3", "cp-4"];
    let etcd = EtcdCluster::start_named(&names).await;
    let a = TalosApi::start(etcd).await;
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in names.iter().enumerate() {
        let mut m = control_plane(n, u32::try_from(i).expect("small") + 1);
        m["spec"]["endpoint"] = json!(a.node(i).endpoint());
        api.insert(m);
    }
    let running = Running::start(context(&api, "controller-1", None));
    wait_for("finalizers", WAIT, || {
        names.iter().all(|n| has_finalizer(&api, n))
    })
    .await;
    delete(&api, "TalosMachine", "cp-4").await;
    wait_for("NoTalosCredentials", WAIT, || {
        removal(&api, "cp-4").is_some_and(|(s, r, _)| s == "False" && r == "NoTalosCredentials")
    })
    .await;
    let (_, _, msg) = removal(&api, "cp-4").expect("removal");
    assert!(
        msg.contains("TalosCluster infra/prod has no spec.talosConfigSecretRef")
            && msg.contains("--talosconfig-for-all-clusters"),
        "{msg}"
    );
    assert_eq!(a.etcd.member_names().await.len(), 4);
    running.kill().await;

    // The operator opts into one talosconfig for every cluster: the same removal runs.
    let _c = Running::start(context(&api, "controller-2", Some(Arc::new(a.tls()))));
    wait_for("cp-4 removed", WAIT, || {
        get(&api, "TalosMachine", "cp-4").is_none()
    })
    .await;
    assert_eq!(a.etcd.member_names().await.len(), 3);
    assert_eq!(a.by_name("cp-4").resets(), 1);
}

/// What is wrong with a referenced Secret is said without its content: a missing key, and
/// a value that is not a talosconfig (whose text must not reach the condition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_secret_is_named_and_its_content_never_shown() {
    let api = ApiServer::start().await;
    api.insert(cluster_with_secret(
        NS,
        "prod",
        3,
        json!({"name": "prod-talos"}),
    ));
    // Four approved control planes of a declared three, without endpoints: no node is
    // dialled, so only the credentials decide.
    for (i, n) in ["cp-1", "cp-2", "cp-3", "cp-4"].iter().enumerate() {
        api.insert(control_plane(n, u32::try_from(i).expect("small") + 1));
    }
    api.insert(secret(NS, "prod-talos", "wrong-key", "x"));
    let _c = Running::start(context(&api, "controller-1", None));
    wait_for("finalizer", WAIT, || has_finalizer(&api, "cp-4")).await;
    delete(&api, "TalosMachine", "cp-4").await;
    wait_for("missing key", WAIT, || {
        removal(&api, "cp-4").is_some_and(|(_, r, m)| {
            r == "NoTalosCredentials" && m.contains("has no key `talosconfig`")
        })
    })
    .await;
    // Now a value that is not a talosconfig, with a "secret" in it.
    let leaked = "contexts: [\"SECRET-KEY-MATERIAL-1234\"";
    {
        use k8s_openapi::api::core::v1::Secret;
        use kube::api::{Api, Patch, PatchParams};
        let patch = json!({"data": {
            "wrong-key": null,
            "talosconfig": base64::engine::general_purpose::STANDARD.encode(leaked)
        }});
        Api::<Secret>::namespaced(api.test_client(), NS)
            .patch("prod-talos", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch the Secret");
    }
    wait_for("not a talosconfig", WAIT, || {
        removal(&api, "cp-4").is_some_and(|(_, r, m)| {
            r == "NoTalosCredentials" && m.contains("is not a usable talosconfig")
        })
    })
    .await;
    let (_, _, msg) = removal(&api, "cp-4").expect("removal");
    assert!(msg.contains("Secret infra/prod-talos"), "{msg}");
    assert!(!msg.contains("SECRET-KEY-MATERIAL"), "{msg}");
    for e in events(&api, "cp-4", "NoTalosCredentials") {
        assert!(!e.to_string().contains("SECRET-KEY-MATERIAL"), "{e}");
    }
}
