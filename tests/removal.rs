//! Removals of control planes end to end: the controller (in-process) against the
//! in-process API server and a Talos API stand-in per node backed by a REAL etcd cluster
//! (Debian `etcd-server`, on 127.0.0.1). Every scenario asserts etcd's real membership at
//! the end.

use crate::support::apiserver;
use crate::support::controller as harness;
use crate::support::etcd;
use crate::support::talos;

use apiserver::ApiServer;
use etcd::EtcdCluster;
use harness::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use talos::TalosApi;

const WAIT: Duration = Duration::from_secs(40);

/// A cluster `prod` of `names` control planes: etcd members, Talos stand-ins, TalosMachines
/// (approved in order, endpoint = the stand-in, hostname = the member name) and Nodes.
struct World {
    api: ApiServer,
    talos: TalosApi,
    /// Each controller's step log (`serve --step-log`): checked against the model
    /// (`verify --check-trace`) when the scenario ends without a failure.
    logs: std::sync::Mutex<Vec<std::path::PathBuf>>,
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        for log in self.logs.lock().expect("logs").iter() {
            assert_step_log_checks(log);
        }
    }
}

impl World {
    async fn start(names: &[&str], count: i64) -> World {
        let etcd = EtcdCluster::start_named(names).await;
        let talos = TalosApi::start(etcd).await;
        let api = ApiServer::start().await;
        api.insert(cluster("prod", count));
        let w = World {
            api,
            talos,
            logs: Default::default(),
        };
        for (i, n) in names.iter().enumerate() {
            w.add_objects(n, i);
        }
        w
    }

    fn add_objects(&self, name: &str, index: usize) {
        let mut m = control_plane(name, u32::try_from(index).expect("small") + 1);
        m["spec"]["endpoint"] = json!(self.talos.node(index).endpoint());
        self.api.insert(m);
        self.api.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name},
            "spec": {},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
        }));
    }

    /// A fourth (fifth, …) control plane joins etcd and is approved.
    async fn add_control_plane(&mut self, name: &str) {
        let i = self.talos.etcd.add_member(name).await;
        self.talos.add_node(i).await;
        self.add_objects(name, i);
    }

    fn controller(&self) -> Running {
        Running::start(self.ctx("controller-1"))
    }

    fn ctx(&self, identity: &str) -> Arc<ichor_rules::runtime::controller::Context> {
        let log = step_log_path(identity);
        self.logs.lock().expect("logs").push(log.clone());
        context_logged(&self.api, identity, Some(Arc::new(self.talos.tls())), &log)
    }

    async fn members(&self) -> BTreeSet<String> {
        self.talos.etcd.member_names().await.into_iter().collect()
    }

    fn machine(&self, name: &str) -> Option<Value> {
        get(&self.api, "TalosMachine", name)
    }

    fn removal(&self, name: &str) -> Option<(String, String, String)> {
        let m = self.machine(name)?;
        let c = condition(&m, "Removal")?;
        Some((
            c["status"].as_str().unwrap_or("").into(),
            c["reason"].as_str().unwrap_or("").into(),
            c["message"].as_str().unwrap_or("").into(),
        ))
    }

    fn done_steps(&self, name: &str) -> usize {
        self.machine(name)
            .and_then(|m| m["status"]["removal"]["done"].as_array().map(|a| a.len()))
            .unwrap_or(0)
    }

    async fn finalized(&self, names: &[&str]) {
        wait_for("finalizers", WAIT, || {
            names.iter().all(|n| has_finalizer(&self.api, n))
        })
        .await;
    }
}

/// A Ready pod `apps/web-1` (label app=web) running on `node`.
fn web_pod_on(node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "apps", "labels": {"app": "web"}},
        "spec": {"nodeName": node, "containers": [{"name": "web", "image": "nginx"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// The PodDisruptionBudget `apps/web` lets the pod go now (minAvailable 0).
async fn lift_budget(w: &World) {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::api::{Api, PostParams};
    let mut pdb = get(&w.api, "PodDisruptionBudget", "web").expect("pdb");
    pdb["spec"]["minAvailable"] = json!(0);
    let api: Api<PodDisruptionBudget> = Api::namespaced(w.api.test_client(), "apps");
    let pdb: PodDisruptionBudget = serde_json::from_value(pdb).expect("pdb");
    api.replace("web", &PostParams::default(), &pdb)
        .await
        .expect("replace pdb");
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn healthy(w: &World, n: usize) {
    w.talos
        .etcd
        .wait_healthy(n)
        .await
        .unwrap_or_else(|e| panic!("etcd not healthy with {n} members: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacement_three_to_four_to_three() {
    let started = Instant::now();
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    // 3 -> 4: a replacement joins.
    w.add_control_plane("cp-4").await;
    w.finalized(&["cp-4"]).await;
    wait_for("Transitioning while 4", WAIT, || {
        cond(&w.api, "TalosCluster", "prod", "Transitioning")
            == Some(("True".into(), "EvenControlPlaneCount".into()))
    })
    .await;
    // 4 -> 3: the oldest goes.
    assert_calls_granted(&w.api);
    let removal_started = Instant::now();
    delete(&w.api, "TalosMachine", "cp-1").await;
    wait_for("cp-1 removed", WAIT, || w.machine("cp-1").is_none()).await;
    let removal_took = removal_started.elapsed();
    let log = w.api.store.faults.take_log();
    for r in log.iter().filter(|r| !r.by_test) {
        if let Some((g, res, verb)) = harness::rbac_of(r) {
            assert!(
                ichor_rules::runtime::access::allows(&g, &res, &verb, harness::scope_of(r)),
                "not granted: {r:?}"
            );
        }
    }
    let calls = log.iter().filter(|r| !r.by_test && !r.watch).count();
    println!(
        "removal of cp-1: {:.2} s, {calls} API calls by the controller (all reconciles, all kinds)",
        removal_took.as_secs_f64()
    );
    assert_eq!(w.members().await, set(&["cp-2", "cp-3", "cp-4"]));
    healthy(&w, 3).await;
    assert_eq!(w.talos.by_name("cp-1").resets(), 1, "reset exactly once");
    for n in ["cp-2", "cp-3", "cp-4"] {
        assert_eq!(w.talos.by_name(n).resets(), 0, "{n}");
    }
    let node = get(&w.api, "Node", "cp-1").expect("node");
    assert_eq!(node["spec"]["unschedulable"], true, "cordoned");
    wait_for("stable again", WAIT, || {
        cond(&w.api, "TalosCluster", "prod", "Transitioning")
            == Some(("False".into(), "StableControlPlaneCount".into()))
    })
    .await;
    // The lock was released.
    let leases = harness::lock_leases(&w.api);
    assert!(
        leases.iter().all(|l| l["spec"]["holderIdentity"].is_null()),
        "{leases:?}"
    );
    println!(
        "replacement 3 -> 4 -> 3 took {:.1} s (etcd start included)",
        started.elapsed().as_secs_f64()
    );
    assert_calls_granted(&w.api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_below_the_declared_count_is_refused_and_changes_nothing() {
    let w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    delete(&w.api, "TalosMachine", "cp-2").await;
    wait_for("refused", WAIT, || {
        w.removal("cp-2")
            .is_some_and(|(s, r, _)| s == "False" && r == "RemovalRefused")
    })
    .await;
    let (_, _, msg) = w.removal("cp-2").expect("removal");
    assert!(
        msg.contains("node remove: control planes 3 -> 2, below the declared count of 3"),
        "{msg}"
    );
    // Refused again at each retry, but one event for one refusal.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(events(&w.api, "cp-2", "RemovalRefused").len(), 1);
    assert!(has_finalizer(&w.api, "cp-2"));
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3"]));
    assert_eq!(w.talos.by_name("cp-2").resets(), 0);
    let node = get(&w.api, "Node", "cp-2").expect("node");
    assert!(node["spec"]["unschedulable"].is_null(), "not cordoned");
    // No lock is kept while refused: each retry takes it only to recount and decide.
    wait_for("the lock free between retries", WAIT, || {
        harness::lock_leases(&w.api)
            .iter()
            .all(|l| l["spec"]["holderIdentity"].is_null())
    })
    .await;
}

/// ADR 0106 §4: what cannot be told leaves the refusal in place. A healthy control plane
/// whose `spec.endpoint` was cleared cannot be asked, and that is not "dead": removing it
/// below the declared count stays refused, and the refusal says why.
/// A replacement that is approved but has not joined etcd yet is not a member: the
/// removal it should make safe waits (RemovalRefused, rule `replacement-not-joined`, with
/// etcd's own member count) until etcd lists it, then goes on. etcd never has fewer
/// members than the declared count. (`ichor-rules verify` found this with 6 control-plane
/// machines: count 5, a sixth approved, one removed before the sixth joined.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_waits_for_its_replacement_to_join_etcd() {
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    // cp-4 is approved; its node has not joined etcd (nothing answers at its endpoint).
    let mut cp4 = control_plane("cp-4", 4);
    cp4["spec"]["endpoint"] = json!("127.0.0.1:9");
    w.api.insert(cp4);
    delete(&w.api, "TalosMachine", "cp-1").await;
    wait_for("refused until cp-4 joins", WAIT, || {
        w.removal("cp-1").is_some_and(|(s, r, m)| {
            s == "False" && r == "RemovalRefused" && m.contains("has not joined etcd yet")
        })
    })
    .await;
    let (_, _, msg) = w.removal("cp-1").expect("removal");
    assert!(
        msg.contains("would leave 2 etcd members, below the declared count of 3"),
        "{msg}"
    );
    assert!(
        !msg.contains("node remove:"),
        "declared-count does not refuse: {msg}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3"]));
    assert_eq!(
        w.talos.by_name("cp-1").resets(),
        0,
        "nothing was done to cp-1"
    );
    // cp-4 joins etcd: the removal goes on, and ends at 3 members.
    let i = w.talos.etcd.add_member("cp-4").await;
    let endpoint = w.talos.add_node(i).await.endpoint();
    patch_spec(
        &w.api,
        "TalosMachine",
        "cp-4",
        json!({"endpoint": endpoint}),
    )
    .await;
    wait_for("cp-1 removed", WAIT, || w.machine("cp-1").is_none()).await;
    assert_eq!(w.members().await, set(&["cp-2", "cp-3", "cp-4"]));
    healthy(&w, 3).await;
}

/// Issue 33, item 1: a healthy control plane whose `spec.endpoint` was pointed at an address
/// nothing answers on (past admission, which now refuses it) is not "dead". The controller
/// reports it NodeUnreachable after the grace, and a delete below the declared count follows;
/// the controller asks its member through a healthy sibling, at the address etcd lists for
/// it, finds it answering, and refuses: nothing is removed, reset or left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_edit_does_not_make_a_healthy_member_dead() {
    let w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    patch_spec(
        &w.api,
        "TalosMachine",
        "cp-2",
        json!({"endpoint": "127.0.0.1:9"}),
    )
    .await;
    wait_for("cp-2 reported NodeUnreachable", WAIT, || {
        w.machine("cp-2")
            .and_then(|m| condition(&m, "Ready"))
            .is_some_and(|c| c["reason"] == "NodeUnreachable")
    })
    .await;
    delete(&w.api, "TalosMachine", "cp-2").await;
    wait_for("refused", WAIT, || {
        w.removal("cp-2")
            .is_some_and(|(s, r, _)| s == "False" && r == "RemovalRefused")
    })
    .await;
    let (_, _, msg) = w.removal("cp-2").expect("removal");
    assert!(
        msg.contains("node remove: control planes 3 -> 2, below the declared count of 3"),
        "{msg}"
    );
    assert!(
        msg.contains("its etcd member is not dead") && msg.contains("answers with a leader"),
        "the refusal says the member answers: {msg}"
    );
    // Still refused a while later; etcd and the node untouched, by the stand-ins' own record.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(w.removal("cp-2").expect("removal").1, "RemovalRefused");
    assert!(has_finalizer(&w.api, "cp-2"));
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3"]));
    healthy(&w, 3).await;
    for rpc in [
        "EtcdRemoveMemberByID",
        "EtcdLeaveCluster",
        "Reset",
        "EtcdForfeitLeadership",
    ] {
        let calls: Vec<_> = w
            .talos
            .calls()
            .into_iter()
            .filter(|c| c.rpc == rpc)
            .collect();
        assert!(calls.is_empty(), "{rpc} was called: {calls:?}");
    }
    // The member was asked through a sibling, as itself (not at the edited address).
    assert!(
        w.talos
            .calls()
            .iter()
            .any(|c| c.rpc == "EtcdStatus" && c.node == "cp-2" && c.via != "cp-2"),
        "{:?}",
        w.talos.calls()
    );
    assert!(events(&w.api, "cp-2", "DeadMemberRemoved").is_empty());
    let node = get(&w.api, "Node", "cp-2").expect("node");
    assert!(node["spec"]["unschedulable"].is_null(), "not cordoned");
}

/// ADR 0106 §4 with the same evidence: a member whose node is really gone is dead when
/// asked through a sibling, whatever its `spec.endpoint` says (here: pointed at a healthy
/// sibling's stand-in, which answers as another member).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_pointed_at_a_live_node_is_still_dead() {
    let w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    w.talos.etcd.kill(w.talos.by_name("cp-3").index());
    w.talos.by_name("cp-3").stop().await;
    patch_spec(
        &w.api,
        "TalosMachine",
        "cp-3",
        json!({"endpoint": w.talos.by_name("cp-1").endpoint()}),
    )
    .await;
    delete(&w.api, "TalosMachine", "cp-3").await;
    wait_for("cp-3 removed", WAIT, || w.machine("cp-3").is_none()).await;
    assert_eq!(w.members().await, set(&["cp-1", "cp-2"]));
    healthy(&w, 2).await;
    // Removed by ID through a sibling; nothing was reset (not cp-1, which its endpoint named).
    assert_eq!(w.talos.by_name("cp-1").resets(), 0);
    assert_eq!(
        w.talos.calls().iter().filter(|c| c.rpc == "Reset").count(),
        0
    );
    // Removed by ID through a sibling (a call that timed out on a loaded machine may be
    // sent again), never through the live node its endpoint named.
    let removes: Vec<_> = w
        .talos
        .calls()
        .into_iter()
        .filter(|c| c.rpc == "EtcdRemoveMemberByID")
        .collect();
    assert!(!removes.is_empty());
    assert!(removes.iter().all(|c| c.via != "cp-3"), "{removes:?}");
    assert_eq!(w.talos.calls_to("EtcdLeaveCluster", "cp-1"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_with_no_endpoint_is_not_dead_and_stays_refused_below_count() {
    let w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    patch_spec(&w.api, "TalosMachine", "cp-2", json!({"endpoint": null})).await;
    assert!(
        w.machine("cp-2").expect("cp-2")["spec"]["endpoint"].is_null(),
        "the endpoint was cleared"
    );
    delete(&w.api, "TalosMachine", "cp-2").await;
    wait_for("refused", WAIT, || {
        w.removal("cp-2")
            .is_some_and(|(s, r, _)| s == "False" && r == "RemovalRefused")
    })
    .await;
    let (_, _, msg) = w.removal("cp-2").expect("removal");
    assert!(
        msg.contains("node remove: control planes 3 -> 2, below the declared count of 3"),
        "{msg}"
    );
    assert!(
        msg.contains("its etcd member is not dead"),
        "the refusal says why the member is not taken as dead: {msg}"
    );
    // Still refused a while later: nothing was done to etcd or the node.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, reason, _) = w.removal("cp-2").expect("removal");
    assert_eq!(reason, "RemovalRefused");
    assert!(has_finalizer(&w.api, "cp-2"));
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3"]));
    assert_eq!(w.talos.by_name("cp-2").resets(), 0);
    assert!(events(&w.api, "cp-2", "DeadMemberRemoved").is_empty());
    let node = get(&w.api, "Node", "cp-2").expect("node");
    assert!(node["spec"]["unschedulable"].is_null(), "not cordoned");
}

/// Issue 33, item 2: a control plane whose removal has begun (here: waiting on a drain
/// blocked by a budget) is un-approved, then moved to another cluster, past admission
/// (which now refuses both). The controller never releases its finalizer while etcd (of the
/// cluster the removal recorded) lists its member, and says what to do; approved again in
/// its cluster, the removal runs to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_mid_removal_keeps_the_finalizer_while_etcd_lists_the_member() {
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    w.add_control_plane("cp-4").await;
    w.api.insert(web_pod_on("cp-4"));
    w.api.insert(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }));
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3", "cp-4"]).await;
    delete(&w.api, "TalosMachine", "cp-4").await;
    wait_for("the removal began (drain blocked)", WAIT, || {
        w.removal("cp-4")
            .is_some_and(|(_, r, _)| r == "DrainFailed")
    })
    .await;
    assert!(w.done_steps("cp-4") >= 1, "a step is recorded");
    let recorded = w.machine("cp-4").expect("cp-4")["status"]["removal"].clone();
    assert_eq!(recorded["cluster"], "prod", "{recorded}");
    assert_eq!(recorded["member"], "cp-4", "{recorded}");

    patch_spec(&w.api, "TalosMachine", "cp-4", json!({"approved": false})).await;
    wait_for("kept, saying why", WAIT, || {
        w.removal("cp-4")
            .is_some_and(|(s, r, _)| s == "False" && r == "StillEtcdMember")
    })
    .await;
    let (_, _, msg) = w.removal("cp-4").expect("removal");
    assert!(
        msg.contains("the removal stopped after") && msg.contains("still lists its member cp-4"),
        "{msg}"
    );
    // Moved away too: the controller still asks the etcd of prod, which lists it.
    patch_spec(
        &w.api,
        "TalosMachine",
        "cp-4",
        json!({"clusterRef": {"name": "elsewhere"}}),
    )
    .await;
    wait_for("kept after the move", WAIT, || {
        w.removal("cp-4").is_some_and(|(_, r, m)| {
            r == "StillEtcdMember" && m.contains("moved from TalosCluster prod")
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(has_finalizer(&w.api, "cp-4"));
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3", "cp-4"]));
    assert_eq!(w.talos.by_name("cp-4").resets(), 0);

    // Back in prod and approved: the removal resumes and ends (the budget lifted).
    patch_spec(
        &w.api,
        "TalosMachine",
        "cp-4",
        json!({"clusterRef": {"name": "prod"}, "approved": true}),
    )
    .await;
    lift_budget(&w).await;
    wait_for("cp-4 removed", WAIT, || w.machine("cp-4").is_none()).await;
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3"]));
    assert_eq!(w.talos.by_name("cp-4").resets(), 1);
    healthy(&w, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_deleted_at_once_are_serialized_and_never_go_below_count() {
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    w.add_control_plane("cp-4").await;
    {
        let c = w.controller();
        w.finalized(&["cp-1", "cp-2", "cp-3", "cp-4"]).await;
        c.kill().await;
    }

    // Watch etcd's real membership the whole time.
    let lowest = Arc::new(AtomicUsize::new(usize::MAX));
    let watcher = {
        let (etcd, lowest) = (w.talos.etcd.clone(), lowest.clone());
        tokio::spawn(async move {
            loop {
                let n = etcd.member_names().await.len();
                if n > 0 {
                    lowest.fetch_min(n, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // Both at once, past the webhook (the controller sees both deleting when it starts):
    // with 4 and each other going, each would leave 2.
    delete(&w.api, "TalosMachine", "cp-1").await;
    delete(&w.api, "TalosMachine", "cp-4").await;
    let _c = w.controller();
    wait_for("both refused", WAIT, || {
        ["cp-1", "cp-4"]
            .iter()
            .all(|n| w.removal(n).is_some_and(|(_, r, _)| r == "RemovalRefused"))
    })
    .await;
    assert_eq!(w.members().await.len(), 4);

    // A replacement arrives: now each removal keeps 3, one after the other.
    w.add_control_plane("cp-5").await;
    let mut holders = BTreeSet::new();
    let start = Instant::now();
    while w.machine("cp-1").is_some() || w.machine("cp-4").is_some() {
        assert!(start.elapsed() < WAIT, "removals did not finish");
        // At most one removal runs: the lock has one holder.
        let running: Vec<String> = ["cp-1", "cp-4"]
            .iter()
            .filter(|n| {
                w.removal(n)
                    .is_some_and(|(s, r, _)| s == "True" && r == "RemovalInProgress")
                    && w.done_steps(n) > 1
            })
            .map(|n| n.to_string())
            .collect();
        assert!(running.len() <= 1, "two removals ran at once: {running:?}");
        for l in harness::lock_leases(&w.api) {
            if let Some(h) = l["spec"]["holderIdentity"].as_str() {
                holders.insert(h.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    watcher.abort();
    assert_eq!(w.members().await, set(&["cp-2", "cp-3", "cp-5"]));
    healthy(&w, 3).await;
    assert!(
        lowest.load(Ordering::SeqCst) >= 3,
        "etcd went down to {} members",
        lowest.load(Ordering::SeqCst)
    );
    assert!(
        holders
            .iter()
            .all(|h| h.starts_with("remove TalosMachine infra/")),
        "{holders:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_removed_below_count_keeping_quorum() {
    let w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    // cp-3 dies: its etcd is killed and its Talos API does not answer.
    w.talos.etcd.kill(w.talos.by_name("cp-3").index());
    w.talos.by_name("cp-3").stop().await;
    delete(&w.api, "TalosMachine", "cp-3").await;
    wait_for("cp-3 removed", WAIT, || w.machine("cp-3").is_none()).await;
    assert_eq!(w.members().await, set(&["cp-1", "cp-2"]));
    healthy(&w, 2).await;
    let ev = events(&w.api, "cp-3", "DeadMemberRemoved");
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["type"], "Warning");
    let note = ev[0]["note"].as_str().unwrap_or("");
    assert!(
        note.contains("below the declared count of 3") && note.contains("approve a replacement"),
        "{note}"
    );
    // No drain for a node whose kubelet is gone, no reset of a node that does not answer.
    let node = get(&w.api, "Node", "cp-3").expect("node");
    assert!(
        node["spec"]["unschedulable"].is_null(),
        "drained a dead node"
    );
    assert_eq!(w.talos.by_name("cp-3").resets(), 0);

    // Quorum never bends: a second dead member of the two left is not removed.
    w.talos.etcd.kill(w.talos.by_name("cp-2").index());
    w.talos.by_name("cp-2").stop().await;
    delete(&w.api, "TalosMachine", "cp-2").await;
    wait_for("refused for quorum", WAIT, || {
        w.removal("cp-2")
            .is_some_and(|(_, r, m)| r == "RemovalRefused" && m.contains("quorum"))
    })
    .await;
    assert!(w.machine("cp-2").is_some());
    assert_calls_granted(&w.api);
}

/// ADR 0010: deleting the TalosCluster is the one way to remove the last control plane.
/// The deleted cluster stays until its machines are gone; they follow it without quorum
/// or count refusals, without a drain, and their nodes are wiped (no graceful etcd leave:
/// the last member could not leave).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_cluster_is_torn_down_with_all_its_control_planes() {
    let w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    wait_for("the teardown finalizer", WAIT, || {
        get(&w.api, "TalosCluster", "prod").is_some_and(|c| {
            c["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "ichor.maesh.dev/cluster-teardown"))
        })
    })
    .await;
    delete(&w.api, "TalosCluster", "prod").await;
    wait_for("the cluster waits for its machines", WAIT, || {
        cond(&w.api, "TalosCluster", "prod", "Teardown")
            == Some(("True".into(), "WaitingForMachines".into()))
    })
    .await;
    for n in ["cp-1", "cp-2", "cp-3"] {
        delete(&w.api, "TalosMachine", n).await;
    }
    wait_for("every machine and the cluster gone", WAIT, || {
        ["cp-1", "cp-2", "cp-3"]
            .iter()
            .all(|n| w.machine(n).is_none())
            && get(&w.api, "TalosCluster", "prod").is_none()
    })
    .await;
    for n in ["cp-1", "cp-2", "cp-3"] {
        assert_eq!(w.talos.by_name(n).resets(), 1, "{n} wiped exactly once");
        let node = get(&w.api, "Node", n).expect("node");
        assert!(node["spec"]["unschedulable"].is_null(), "{n} drained");
        assert!(
            events(&w.api, n, "RemovalRefused").is_empty(),
            "{n} refused"
        );
    }
    assert_calls_granted(&w.api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_at_each_step_is_resumed_by_a_fresh_one() {
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    w.add_control_plane("cp-4").await;
    {
        let c = w.controller();
        w.finalized(&["cp-1", "cp-2", "cp-3", "cp-4"]).await;
        c.kill().await;
    }
    delete(&w.api, "TalosMachine", "cp-4").await;
    // Each round: a fresh controller (a new process: new context, same identity) runs
    // until one more step is recorded, then is killed.
    let mut rounds = 0;
    let mut seen = 0;
    // Rounds whose fresh controller found steps another had recorded, and resumed there.
    let mut resumed = 0;
    while w.machine("cp-4").is_some() {
        rounds += 1;
        assert!(rounds < 30, "no progress after {rounds} restarts");
        let c = Running::start(w.ctx("controller-1"));
        let before = w.done_steps("cp-4");
        resumed += usize::from(before > 0);
        let start = Instant::now();
        while w.machine("cp-4").is_some() && w.done_steps("cp-4") == before {
            assert!(start.elapsed() < WAIT, "stuck after {before} steps");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        seen = seen.max(w.done_steps("cp-4"));
        c.kill().await;
    }
    // A round may finish more than one quick step before its kill lands (on a loaded
    // machine, all that are left: the removal then ends in that round), so how many steps
    // were seen depends on timing; at least one fresh controller must have resumed what
    // another began, after a step was recorded.
    assert!(
        seen >= 1 && resumed >= 1,
        "no fresh controller resumed a begun removal ({seen} steps seen, {rounds} rounds)"
    );
    assert!(rounds >= 2, "killed only {rounds} times");
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3"]));
    healthy(&w, 3).await;
    assert_eq!(w.talos.by_name("cp-4").resets(), 1, "reset exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_blocked_by_a_budget_waits_then_completes() {
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    w.add_control_plane("cp-4").await;
    w.api.insert(web_pod_on("cp-4"));
    w.api.insert(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }));
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3", "cp-4"]).await;
    delete(&w.api, "TalosMachine", "cp-4").await;
    wait_for("DrainFailed", WAIT, || {
        w.removal("cp-4")
            .is_some_and(|(s, r, _)| s == "False" && r == "DrainFailed")
    })
    .await;
    let (_, _, msg) = w.removal("cp-4").expect("removal");
    assert!(msg.contains("apps/web-1"), "{msg}");
    // Retried every drain_retry (300 ms here): still one event for one blocked stretch.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(events(&w.api, "cp-4", "DrainFailed").len(), 1);
    assert_eq!(w.members().await.len(), 4, "nothing past the drain ran");
    let node = get(&w.api, "Node", "cp-4").expect("node");
    assert_eq!(node["spec"]["unschedulable"], true, "cordoned first");

    // The budget allows it now: the removal goes on by itself.
    lift_budget(&w).await;
    wait_for("cp-4 removed", WAIT, || w.machine("cp-4").is_none()).await;
    assert!(get(&w.api, "Pod", "web-1").is_none(), "evicted");
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3"]));
    healthy(&w, 3).await;
    assert_calls_granted(&w.api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_node_says_so_with_the_likely_new_address() {
    let w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    // The Kubernetes Node of cp-2 reports another address than the one dialled.
    let mut node = get(&w.api, "Node", "cp-2").expect("node");
    node["status"]["addresses"] = json!([{"type": "InternalIP", "address": "10.0.0.9"}]);
    {
        use k8s_openapi::api::core::v1::Node;
        use kube::api::{Api, PostParams};
        let api: Api<Node> = Api::all(w.api.test_client());
        let n: Node = serde_json::from_value(node).expect("node");
        api.replace_status("cp-2", &PostParams::default(), &n)
            .await
            .expect("node status");
    }
    let spec_before = w.machine("cp-2").expect("cp-2")["spec"].clone();
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    let endpoint = w.talos.by_name("cp-2").endpoint();
    w.talos.by_name("cp-2").stop().await;
    wait_for("NodeReachable=False", WAIT, || {
        cond(&w.api, "TalosMachine", "cp-2", "NodeReachable").is_some_and(|(s, _)| s == "False")
    })
    .await;
    wait_for("Ready=False NodeUnreachable after the grace", WAIT, || {
        cond(&w.api, "TalosMachine", "cp-2", "Ready")
            == Some(("False".into(), "NodeUnreachable".into()))
    })
    .await;
    let m = w.machine("cp-2").expect("cp-2");
    let msg = condition(&m, "Ready").expect("Ready")["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let port = endpoint.rsplit(':').next().expect("port");
    assert!(
        msg.contains(&format!("the node at {endpoint} has not answered for")),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(
            "spec.endpoint may need updating to 10.0.0.9:{port}"
        )),
        "{msg}"
    );
    assert_eq!(m["spec"], spec_before, "spec is never edited");
    // The others are fine.
    assert_eq!(cond(&w.api, "TalosMachine", "cp-1", "Ready"), None);
    // Back: the conditions go.
    w.talos.by_name("cp-2").start_again().await;
    wait_for("reachable again", WAIT, || {
        cond(&w.api, "TalosMachine", "cp-2", "Ready").is_none()
            && cond(&w.api, "TalosMachine", "cp-2", "NodeReachable").is_none()
    })
    .await;
}

/// The chart grants exactly what the code calls: a removal with a blocked drain, events,
/// Transitioning, a parked operation and leader election together use every grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calls_made_are_exactly_the_calls_granted() {
    use base64::Engine as _;
    use ichor_rules::runtime::access::REQUIRED;
    use ichor_rules::runtime::controller::leader;
    use std::sync::atomic::AtomicBool;
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    w.add_control_plane("cp-4").await;
    w.api.insert(web_pod_on("cp-4"));
    w.api.insert(operation("upgrade-1", "upgrade"));
    // The cluster's own talosconfig Secret (the `get` on secrets).
    w.api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-talos", "namespace": NS},
        "data": {"talosconfig": base64::engine::general_purpose::STANDARD
            .encode(w.talos.talosconfig_yaml())}
    }));
    patch_spec(
        &w.api,
        "TalosCluster",
        "prod",
        json!({"talosConfigSecretRef": {"name": "prod-talos"}}),
    )
    .await;
    // The cluster's base configuration (issue 37): the controller reads it (the same `get`
    // on secrets) and lists the cluster's TalosConfigPatches to configure its machines.
    w.api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-base", "namespace": NS},
        "type": "Opaque",
        "data": {
            "controlplane.yaml": base64::engine::general_purpose::STANDARD
                .encode(include_str!("fixtures/talos/controlplane.yaml")),
            "worker.yaml": base64::engine::general_purpose::STANDARD
                .encode(include_str!("fixtures/talos/worker.yaml")),
        }
    }));
    patch_spec(
        &w.api,
        "TalosCluster",
        "prod",
        json!({"baseConfigSecretRef": {"name": "prod-base"}}),
    )
    .await;
    let ctx = w.ctx("replica-a");
    let leading = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(leader::run(ctx.clone(), leading.clone()));
    w.finalized(&["cp-1", "cp-2", "cp-3", "cp-4"]).await;
    wait_for("parked", WAIT, || {
        cond(&w.api, "TalosOperation", "upgrade-1", "Paused").is_some()
    })
    .await;
    // A change that needs a reboot (the install disk) on cp-1, once configured: staged,
    // then the reboot that rolls it is created (the `create` on talosoperations).
    wait_for("cp-1 configured", WAIT, || {
        w.machine("cp-1")
            .is_some_and(|m| m["status"]["config"]["appliedHash"].is_string())
    })
    .await;
    w.api.insert(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosConfigPatch",
        "metadata": {"name": "disk", "namespace": NS},
        "spec": {"clusterRef": {"name": "prod"}, "selector": {"machines": ["cp-1"]},
                 "patches": {"strategic": "version: v1alpha1\nmachine:\n  install:\n    disk: /dev/sdb\n"}}
    }));
    wait_for("the configuration roll created", WAIT, || {
        w.api
            .objects("TalosOperation", Some(NS))
            .iter()
            .any(|o| o["metadata"]["labels"]["ichor.maesh.dev/configuration-roll"] == "true")
    })
    .await;
    // A backup's conditions (the patch of talosetcdbackups/status).
    w.api
        .insert(crate::backup::backup("prod-etcd", "https://s3.example.org"));
    wait_for("the backup judged", WAIT, || {
        cond(&w.api, "TalosEtcdBackup", "prod-etcd", "Ready").is_some()
    })
    .await;
    delete(&w.api, "TalosMachine", "cp-4").await;
    wait_for("cp-4 removed", WAIT, || w.machine("cp-4").is_none()).await;
    // A repeated event is a patch of the first one's series.
    let m: ichor_rules::runtime::objects::TalosMachine =
        serde_json::from_value(w.machine("cp-1").expect("cp-1")).expect("machine");
    ctx.event(&m, false, "Checked", "twice".into()).await;
    ctx.event(&m, false, "Checked", "twice".into()).await;
    task.abort();
    let _ = task.await;
    leader::step_down(&ctx).await;
    let used = assert_calls_granted(&w.api);
    let mut unused = Vec::new();
    for a in REQUIRED {
        for v in a.verbs {
            let call = (
                a.api_group.to_string(),
                a.resource.to_string(),
                v.to_string(),
            );
            if !used.contains(&call) {
                unused.push(call);
            }
        }
    }
    assert!(unused.is_empty(), "granted but never called: {unused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unapproved_former_control_plane_keeps_its_finalizer_while_etcd_lists_it() {
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    // cp-9 was approved (it gets the finalizer) but never joined etcd.
    let mut ghost = control_plane("cp-9", 9);
    ghost["spec"]["endpoint"] = json!(w.talos.node(0).endpoint());
    w.api.insert(ghost);
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3", "cp-9"]).await;
    patch_spec(&w.api, "TalosMachine", "cp-9", json!({"approved": false})).await;
    delete(&w.api, "TalosMachine", "cp-9").await;
    // cp-4 joined etcd, then is un-approved and deleted.
    w.add_control_plane("cp-4").await;
    w.finalized(&["cp-4"]).await;
    patch_spec(&w.api, "TalosMachine", "cp-4", json!({"approved": false})).await;
    delete(&w.api, "TalosMachine", "cp-4").await;
    // Not a member: it goes. Still a member: it stays, saying why.
    wait_for("cp-9 released", WAIT, || w.machine("cp-9").is_none()).await;
    wait_for("cp-4 kept", WAIT, || {
        w.removal("cp-4")
            .is_some_and(|(s, r, _)| s == "False" && r == "StillEtcdMember")
    })
    .await;
    let (_, _, msg) = w.removal("cp-4").expect("removal");
    assert!(msg.contains("still lists its member cp-4"), "{msg}");
    assert!(has_finalizer(&w.api, "cp-4"));
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3", "cp-4"]));
    // Approved again, its removal runs to the end.
    patch_spec(&w.api, "TalosMachine", "cp-4", json!({"approved": true})).await;
    wait_for("cp-4 removed", WAIT, || w.machine("cp-4").is_none()).await;
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3"]));
    healthy(&w, 3).await;
    assert_calls_granted(&w.api);
}

/// Issue 34: a control plane whose spec.hostname is not its etcd member's name. etcd lists
/// no member by that name, and that is never taken for "already left": the node at its
/// endpoint says which member it is (one no other machine is named as), the removal records
/// that member's ID and makes that node leave, by the stand-ins' own record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostname_that_is_not_the_members_name_does_not_skip_the_leave() {
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    w.add_control_plane("cp-4").await;
    patch_spec(
        &w.api,
        "TalosMachine",
        "cp-4",
        json!({"hostname": "cp-4.example"}),
    )
    .await;
    let _c = w.controller();
    w.finalized(&["cp-1", "cp-2", "cp-3", "cp-4"]).await;
    delete(&w.api, "TalosMachine", "cp-4").await;
    wait_for("cp-4 removed", WAIT, || w.machine("cp-4").is_none()).await;
    assert_eq!(w.members().await, set(&["cp-1", "cp-2", "cp-3"]));
    healthy(&w, 3).await;
    assert_eq!(w.talos.calls_to("EtcdLeaveCluster", "cp-4"), 1);
    assert_eq!(w.talos.by_name("cp-4").resets(), 1);
    for other in ["cp-1", "cp-2", "cp-3"] {
        assert_eq!(w.talos.calls_to("EtcdLeaveCluster", other), 0, "{other}");
        assert_eq!(w.talos.by_name(other).resets(), 0, "{other}");
    }
}

/// `verify --check-trace` on the controller's own step log of a removal: the log as written
/// is a behaviour of the model; the same log with one recorded answer changed (etcd listing
/// the departing member's leave as not done), one decision changed, or cut in the middle of
/// a reconcile is judged as such; a line that is not a step-log line is bad input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_step_log_is_checked_against_the_model() {
    let mut w = World::start(&["cp-1", "cp-2", "cp-3"], 3).await;
    let log = step_log_path("traced");
    let c = Running::start(context_logged(
        &w.api,
        "traced",
        Some(Arc::new(w.talos.tls())),
        &log,
    ));
    w.finalized(&["cp-1", "cp-2", "cp-3"]).await;
    w.add_control_plane("cp-4").await;
    w.finalized(&["cp-4"]).await;
    delete(&w.api, "TalosMachine", "cp-1").await;
    wait_for("cp-1 removed", WAIT, || w.machine("cp-1").is_none()).await;
    // The release is logged once its answer is in.
    wait_for("the release logged", WAIT, || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("\"op\":\"release_finalizer\""))
    })
    .await;
    c.kill().await;
    let text = std::fs::read_to_string(&log).expect("the step log");
    let check = check_step_log_text;
    let (code, said) = check("as-written", &text);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("a behaviour of the model"), "{said}");
    for op in [
        "\"op\":\"release_finalizer\"",
        "\"call\":\"EtcdLeaveCluster\"",
        "\"op\":\"drain\"",
    ] {
        assert!(text.contains(op), "the log records {op}");
    }

    // A decision recorded otherwise than the rules decide it.
    let decided = text
        .lines()
        .position(|l| l.contains("\"op\":\"decided\"") && l.contains("\"verdict\":\"allow\""))
        .expect("an allowed decision");
    let tampered: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == decided {
                l.replace("\"verdict\":\"allow\"", "\"verdict\":\"refuse\"")
            } else {
                l.to_string()
            }
        })
        .collect();
    let (code, said) = check("decision", &(tampered.join("\n") + "\n"));
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!("line {}:", decided + 1)) && said.contains("decided"),
        "{said}"
    );

    // etcd answering that the departing member is a learner's ID elsewhere: the executor
    // then asks otherwise than the run did.
    let listed = text
        .lines()
        .position(|l| {
            l.contains("\"call\":\"EtcdMemberList\"") && l.contains("\"hostname\":\"cp-1\"")
        })
        .expect("a member list naming cp-1");
    let tampered: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == listed {
                l.replace("\"hostname\":\"cp-1\"", "\"hostname\":\"cp-9\"")
            } else {
                l.to_string()
            }
        })
        .collect();
    let (code, said) = check("answer", &(tampered.join("\n") + "\n"));
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("not a behaviour of the model"), "{said}");

    // Cut in the middle of the reconcile that released the finalizer: a controller stopped
    // there, which the model explores.
    let release = text
        .lines()
        .position(|l| l.contains("\"op\":\"release_finalizer\""))
        .expect("a release");
    let cut: Vec<&str> = text.lines().take(release).collect();
    let (code, said) = check("cut", &(cut.join("\n") + "\n"));
    assert_eq!(code, Some(0), "{said}");
    assert!(!said.contains(" 0 cut short"), "{said}");

    // Not a step log.
    let (code, said) = check("garbage", &format!("{}\n{{\"nonsense\": 1}}\n", cut[0]));
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("line 2"), "{said}");
}
