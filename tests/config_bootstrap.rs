//! Issue 37, the bootstrap: the first control plane of a new cluster is bootstrapped
//! (Talos' `Bootstrap`) once, decided by the `bootstrap controlplane` rules with facts read
//! live (`etcd.members` through every control plane's Talos API), on stand-ins whose etcd
//! never ran (a new cluster: a real etcd member starts on the bootstrapped node). Two
//! controllers racing send it once; an answer lost is never sent again; an existing
//! cluster (etcd running) is never bootstrapped.

use crate::support::apiserver::ApiServer;
use crate::support::controller::*;
use crate::support::etcd::EtcdCluster;
use crate::support::talos::TalosApi;
use base64::Engine as _;
use ichor_rules::runtime::controller::{Context, bootstrap, nodes};
use ichor_rules::runtime::live::Reads;
use ichor_rules::runtime::metrics::Metrics;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const CP: &str = include_str!("fixtures/talos/controlplane.yaml");
const WORKER: &str = include_str!("fixtures/talos/worker.yaml");
const WAIT: Duration = Duration::from_secs(40);

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Control planes cp-1..cp-3 (approved in that order) on stand-ins over `etcd`, in a
/// cluster with its base Secret; no controller yet.
async fn world(etcd: Arc<EtcdCluster>) -> (ApiServer, TalosApi) {
    let talos = TalosApi::start(etcd).await;
    let api = ApiServer::start().await;
    let mut c = cluster("prod", 3);
    c["spec"]["baseConfigSecretRef"] = json!({"name": "prod-base"});
    api.insert(c);
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-base", "namespace": NS},
        "type": "Opaque",
        "data": {"controlplane.yaml": b64(CP), "worker.yaml": b64(WORKER)}
    }));
    for i in 0..3 {
        let name = format!("cp-{}", i + 1);
        let mut m = control_plane(&name, u32::try_from(i).unwrap() + 1);
        m["spec"]["endpoint"] = json!(talos.node(i).endpoint());
        api.insert(m);
    }
    (api, talos)
}

fn controller(api: &ApiServer, talos: &TalosApi, identity: &str) -> Arc<Context> {
    Arc::new(Context::new(
        api.client(),
        rules(),
        Some(Arc::new(talos.tls())),
        fast_settings(identity),
        Arc::new(Metrics::default()),
    ))
}

fn record(api: &ApiServer) -> Value {
    get(api, "TalosCluster", "prod").unwrap()["status"]["bootstrap"].clone()
}

fn bootstrap_calls(talos: &TalosApi) -> Vec<String> {
    talos
        .calls()
        .into_iter()
        .filter(|c| c.rpc == "Bootstrap")
        .map(|c| c.node)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_is_bootstrapped_once_by_two_racing_controllers() {
    let (api, talos) = world(EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3"])).await;
    // Two replicas, both reconciling (no leader election between them).
    let _a = Running::start(controller(&api, &talos, "controller-0"));
    let _b = Running::start(controller(&api, &talos, "controller-1"));
    wait_for("the bootstrap confirmed", WAIT, || {
        record(&api)["confirmed"] == true
    })
    .await;
    let r = record(&api);
    assert_eq!(
        r["machine"], "cp-1",
        "the first approved control plane: {r}"
    );
    assert!(
        r["by"] == "controller-0" || r["by"] == "controller-1",
        "{r}"
    );
    // A real etcd runs on cp-1 alone; a few more reconciles of both send nothing more.
    let members = talos.client(0).etcd_member_list().await.unwrap();
    assert_eq!(members.len(), 1);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(bootstrap_calls(&talos), vec!["cp-1".to_string()]);
    assert_eq!(events(&api, "prod", "Bootstrapped").len(), 1);
    // Every control plane was configured first.
    for i in 0..3 {
        assert!(talos.node(i).config().is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bootstraps_decided_from_the_same_read_send_one_call() {
    let (api, talos) = world(EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3"])).await;
    let (a, b) = (
        controller(&api, &talos, "controller-0"),
        controller(&api, &talos, "controller-1"),
    );
    let reads = Reads {
        machines: true,
        clusters: true,
        operations: false,
        backups: false,
    };
    // Both read the same state: no record, no etcd; both rule sets allow it.
    let snapshot = a.reader.snapshot(NS, &["prod"], reads).await.unwrap();
    let m = snapshot.machine(NS, "cp-1").unwrap();
    let table = a.rules.current().unwrap();
    let (da, db) = (
        nodes::Dialer::for_machine(&a, m).await,
        nodes::Dialer::for_machine(&b, m).await,
    );
    let (ra, rb) = tokio::join!(
        bootstrap::reconcile(&a, &da, &table, &snapshot, m),
        bootstrap::reconcile(&b, &db, &table, &snapshot, m),
    );
    ra.unwrap();
    rb.unwrap();
    assert_eq!(bootstrap_calls(&talos), vec!["cp-1".to_string()]);
    assert_eq!(record(&api)["confirmed"], true);
    // Decided again from the old read (no record in it): etcd now lists a member, so the
    // rules refuse; and from a fresh read the record refuses it.
    bootstrap::reconcile(&a, &da, &table, &snapshot, m)
        .await
        .unwrap();
    let fresh = a.reader.snapshot(NS, &["prod"], reads).await.unwrap();
    let m2 = fresh.machine(NS, "cp-1").unwrap();
    bootstrap::reconcile(&b, &db, &table, &fresh, m2)
        .await
        .unwrap();
    assert_eq!(bootstrap_calls(&talos).len(), 1);
    // Not the first control plane: refused by the rules, nothing sent.
    let (api2, talos2) = world(EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3"])).await;
    let c = controller(&api2, &talos2, "controller-0");
    let snap2 = c.reader.snapshot(NS, &["prod"], reads).await.unwrap();
    let cp2 = snap2.machine(NS, "cp-2").unwrap();
    let d2 = nodes::Dialer::for_machine(&c, cp2).await;
    let table2 = c.rules.current().unwrap();
    bootstrap::reconcile(&c, &d2, &table2, &snap2, cp2)
        .await
        .unwrap();
    assert!(bootstrap_calls(&talos2).is_empty());
    assert!(record(&api2).is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_whose_answer_is_lost_is_not_sent_again() {
    let (api, talos) = world(EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3"])).await;
    talos.node(0).lose_bootstrap_answers();
    let _a = Running::start(controller(&api, &talos, "controller-0"));
    wait_for("the lost answer recorded", WAIT, || {
        !events(&api, "prod", "BootstrapUnconfirmed").is_empty()
    })
    .await;
    wait_for("the bootstrap confirmed by etcd", WAIT, || {
        record(&api)["confirmed"] == true
    })
    .await;
    let r = record(&api);
    assert!(
        r["message"].as_str().unwrap().contains("etcd runs"),
        "confirmed by reading etcd: {r}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(bootstrap_calls(&talos), vec!["cp-1".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_etcd_runs_is_never_bootstrapped() {
    let (api, talos) = world(EtcdCluster::start(3).await).await;
    let _a = Running::start(controller(&api, &talos, "controller-0"));
    wait_for("etcd found and recorded", WAIT, || {
        record(&api)["confirmed"] == true
    })
    .await;
    let r = record(&api);
    assert_eq!(r["machine"], "", "{r}");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("3 member(s) listed"),
        "{r}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(bootstrap_calls(&talos).is_empty());
}
