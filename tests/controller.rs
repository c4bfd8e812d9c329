//! The controller against the in-process API server (no Talos needed): the
//! ControlPlaneOverCap hold, the removal finalizer, Transitioning, parked operations, the
//! cluster lock and leader election.

use crate::support::apiserver;
use crate::support::controller as harness;
use crate::support::https;
use crate::support::objects;

use apiserver::ApiServer;
use harness::*;
use ichor_rules::runtime::controller::disruptive::{self, Refused, Work};
use ichor_rules::runtime::controller::leader;
use ichor_rules::runtime::controller::lock::{Acquired, LeaseLock, LockError};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn the_newest_approvals_past_the_cap_are_held_and_released_when_count_rises() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 1));
    // Cap = count + 1 = 2. cp-c is the newest by decision time; cp-b and cp-c tie on
    // nothing, so the order is by time.
    api.insert(control_plane("cp-a", 1));
    api.insert(control_plane("cp-b", 2));
    api.insert(control_plane("cp-c", 3));
    let _c = Running::start(context(&api, "test", None));

    wait_for("cp-c held", WAIT, || {
        cond(&api, "TalosMachine", "cp-c", "Ready")
            == Some(("False".into(), "ControlPlaneOverCap".into()))
    })
    .await;
    wait_for("finalizers on the two within the cap", WAIT, || {
        has_finalizer(&api, "cp-a") && has_finalizer(&api, "cp-b")
    })
    .await;
    // Held: nothing applied, no finalizer, and the message says why.
    assert!(!has_finalizer(&api, "cp-c"));
    for m in ["cp-a", "cp-b"] {
        assert_eq!(cond(&api, "TalosMachine", m, "Ready"), None, "{m}");
    }
    let held = get(&api, "TalosMachine", "cp-c").expect("cp-c");
    let msg = condition(&held, "Ready").expect("Ready")["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(msg.contains("number 3") && msg.contains("= 2"), "{msg}");

    // Raising the declared count lifts the hold.
    patch_spec(
        &api,
        "TalosCluster",
        "prod",
        json!({"controlPlane": {"count": 3}}),
    )
    .await;
    wait_for("cp-c released and finalized", WAIT, || {
        cond(&api, "TalosMachine", "cp-c", "Ready").is_none() && has_finalizer(&api, "cp-c")
    })
    .await;
}

/// A hold's Ready=False goes when the hold lifts, whatever the rule calls its reason: the
/// controller asks the table which reasons are the rules' (not a literal in Rust).
#[tokio::test]
async fn a_hold_with_a_renamed_reason_is_cleared_when_it_lifts() {
    use ichor_rules::runtime::controller::Context;
    use ichor_rules::runtime::metrics::Metrics;
    use ichor_rules::runtime::reload::{Reload, Rules};
    let dir = std::env::temp_dir().join(format!("ichor-hold-reason-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    for f in ["admission.rules", "removal.rules"] {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .join(f),
        )
        .expect("rules/");
        let text = text.replace("reason ControlPlaneOverCap", "reason PastTheCap");
        std::fs::write(dir.join(f), text).expect("write");
    }
    let rules = Arc::new(Rules::new(vec![dir]));
    assert!(matches!(rules.reload(), Reload::Replaced { .. }));
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 1));
    api.insert(control_plane("cp-a", 1));
    api.insert(control_plane("cp-b", 2));
    api.insert(control_plane("cp-c", 3));
    let ctx = Arc::new(Context::new(
        api.client(),
        rules,
        None,
        fast_settings("test"),
        Arc::new(Metrics::default()),
    ));
    let _c = Running::start(ctx);
    wait_for("cp-c held", WAIT, || {
        cond(&api, "TalosMachine", "cp-c", "Ready") == Some(("False".into(), "PastTheCap".into()))
    })
    .await;
    patch_spec(
        &api,
        "TalosCluster",
        "prod",
        json!({"controlPlane": {"count": 3}}),
    )
    .await;
    wait_for("the hold lifted and its condition gone", WAIT, || {
        cond(&api, "TalosMachine", "cp-c", "Ready").is_none() && has_finalizer(&api, "cp-c")
    })
    .await;
}

/// The over-cap hold in audit mode (`serve --audit-rule over-cap`, the chart's
/// `rules.audit`): the newest approval past the cap is not held (it gets its finalizer as
/// the others do), and its would-be hold is counted by rule.
#[tokio::test]
async fn a_hold_in_audit_mode_holds_nothing_and_is_counted() {
    use ichor_rules::runtime::controller::Context;
    use ichor_rules::runtime::metrics::Metrics;
    use ichor_rules::runtime::reload::{Reload, Rules};
    let rules = Arc::new(
        Rules::new(vec![
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rules"),
        ])
        .with_modes(vec![("over-cap".into(), true)]),
    );
    assert!(matches!(rules.reload(), Reload::Replaced { .. }));
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 1));
    api.insert(control_plane("cp-a", 1));
    api.insert(control_plane("cp-b", 2));
    api.insert(control_plane("cp-c", 3));
    let metrics = Arc::new(Metrics::default());
    let ctx = Arc::new(Context::new(
        api.client(),
        rules,
        None,
        fast_settings("test"),
        metrics.clone(),
    ));
    let _c = Running::start(ctx);
    wait_for("all three finalized, none held", WAIT, || {
        ["cp-a", "cp-b", "cp-c"]
            .iter()
            .all(|m| has_finalizer(&api, m))
    })
    .await;
    assert_eq!(cond(&api, "TalosMachine", "cp-c", "Ready"), None);
    let m = metrics.render();
    assert!(
        m.lines()
            .any(|l| l.starts_with("ichor_rules_would_refuse_total{rule=\"over-cap\"} ")),
        "{m}"
    );
    assert!(!m.contains("rule=\"over-cap\",verdict=\"hold\""), "{m}");
}

#[tokio::test]
async fn ties_in_approval_time_are_ordered_by_name_and_creation_time_fills_in() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 1));
    api.insert(control_plane("cp-b", 5));
    api.insert(control_plane("cp-a", 5));
    // No decision time: its creation time (now) is later than both decisions.
    let mut late = control_plane("cp-0", 0);
    late["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("approvalDecision");
    api.insert(late);
    let _c = Running::start(context(&api, "test", None));
    wait_for("cp-0 held", WAIT, || {
        cond(&api, "TalosMachine", "cp-0", "Ready")
            == Some(("False".into(), "ControlPlaneOverCap".into()))
    })
    .await;
    wait_for("the tie resolved by name", WAIT, || {
        has_finalizer(&api, "cp-a") && has_finalizer(&api, "cp-b")
    })
    .await;
}

/// A TalosCluster's first reconcile writes its Transitioning condition and then its
/// teardown finalizer: the finalizer's patch is guarded by the resourceVersion the status
/// write produced, so one reconcile does both (it used to conflict, 409, every first time,
/// and only a retry finished it). The same for a deleted cluster whose finalizer goes.
#[tokio::test]
async fn a_new_cluster_gets_its_condition_and_finalizer_in_one_reconcile() {
    use ichor_rules::runtime::controller::cluster;
    use ichor_rules::runtime::objects::TalosCluster;
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    let ctx = context(&api, "test", None);
    let clusters = kube::Api::<TalosCluster>::namespaced(api.client(), "infra");
    let fresh = Arc::new(clusters.get("prod").await.expect("get"));
    cluster::reconcile(fresh, ctx.clone())
        .await
        .expect("one reconcile writes the status and the finalizer");
    let obj = get(&api, "TalosCluster", "prod").expect("prod");
    assert_eq!(
        obj["metadata"]["finalizers"],
        json!([ichor_rules::runtime::objects::TEARDOWN_FINALIZER]),
        "{obj:#}"
    );
    assert!(condition(&obj, "Transitioning").is_some(), "{obj:#}");
    // Deleted with no machine left: its condition changes (teardown) and the finalizer goes,
    // in one reconcile again.
    clusters
        .delete("prod", &Default::default())
        .await
        .expect("delete");
    let fresh = Arc::new(clusters.get("prod").await.expect("get"));
    assert!(fresh.metadata.deletion_timestamp.is_some());
    cluster::reconcile(fresh, ctx)
        .await
        .expect("one reconcile of the deleted cluster");
    assert!(
        get(&api, "TalosCluster", "prod").is_none(),
        "the cluster is gone"
    );
}

#[tokio::test]
async fn transitioning_follows_the_live_count() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    let _c = Running::start(context(&api, "test", None));
    wait_for("stable at 3", WAIT, || {
        cond(&api, "TalosCluster", "prod", "Transitioning")
            == Some(("False".into(), "StableControlPlaneCount".into()))
    })
    .await;
    api.insert(control_plane("cp-4", 9));
    wait_for("even at 4", WAIT, || {
        cond(&api, "TalosCluster", "prod", "Transitioning")
            == Some(("True".into(), "EvenControlPlaneCount".into()))
    })
    .await;
    patch_spec(&api, "TalosMachine", "cp-4", json!({"approved": false})).await;
    wait_for("stable again at 3", WAIT, || {
        cond(&api, "TalosCluster", "prod", "Transitioning")
            == Some(("False".into(), "StableControlPlaneCount".into()))
    })
    .await;
}

#[tokio::test]
async fn operations_park_while_even_and_resume_by_themselves_when_odd() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3", "cp-4"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    api.insert(operation("upgrade-1", "upgrade"));
    api.insert(operation("restore-1", "etcd-restore"));
    // Paused by a person: stays paused whatever the count.
    let mut by_hand = operation("reboot-1", "reboot");
    by_hand["status"] = json!({"phase": "Paused", "conditions": [
        {"type": "Paused", "status": "True", "reason": "Operator", "message": "wait"}]});
    api.insert(by_hand);
    // Failed ones are left as they are (ADR 0137 §3): neither parked nor resumed.
    let mut failed = operation("reboot-2", "reboot");
    failed["status"] = json!({"phase": "Running", "failureReason": "boom"});
    api.insert(failed);
    let mut failed_parked = operation("reboot-3", "reboot");
    failed_parked["status"] = json!({"phase": "Paused", "failureReason": "boom", "conditions": [
        {"type": "Paused", "status": "True", "reason": "ClusterTransitioning", "message": "even"}]});
    api.insert(failed_parked);
    let _c = Running::start(context(&api, "test", None));

    wait_for("upgrade parked", WAIT, || {
        cond(&api, "TalosOperation", "upgrade-1", "Paused")
            == Some(("True".into(), "ClusterTransitioning".into()))
    })
    .await;
    let op = get(&api, "TalosOperation", "upgrade-1").expect("op");
    assert_eq!(op["status"]["phase"], "Paused");
    // Parked holds no lock.
    assert!(lock_leases(&api).is_empty(), "{:?}", lock_leases(&api));
    // A restore is a recovery: never parked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cond(&api, "TalosOperation", "restore-1", "Paused"), None);

    patch_spec(&api, "TalosMachine", "cp-4", json!({"approved": false})).await;
    wait_for("upgrade resumed", WAIT, || {
        cond(&api, "TalosOperation", "upgrade-1", "Paused")
            == Some(("False".into(), "Resumed".into()))
    })
    .await;
    let op = get(&api, "TalosOperation", "upgrade-1").expect("op");
    assert_eq!(op["status"]["phase"], "Pending");
    assert_eq!(
        cond(&api, "TalosOperation", "reboot-1", "Paused"),
        Some(("True".into(), "Operator".into()))
    );
    assert_eq!(cond(&api, "TalosOperation", "reboot-2", "Paused"), None);
    let op = get(&api, "TalosOperation", "reboot-3").expect("op");
    assert_eq!(op["status"]["phase"], "Paused", "{op}");
    assert_eq!(
        cond(&api, "TalosOperation", "reboot-3", "Paused"),
        Some(("True".into(), "ClusterTransitioning".into()))
    );
}

/// ADR 0010: deleting the TalosCluster is the way to tear it down; it stays, deleting (so
/// the rules let its machines follow it), until no TalosMachine refers to it.
#[tokio::test]
async fn a_deleted_cluster_waits_for_its_machines_then_goes() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    api.insert(machine("w-1", "worker", true, 1));
    api.insert(machine("p-1", "controlplane", false, 2));
    let mut other = machine("w-9", "worker", true, 3);
    other["spec"]["clusterRef"]["name"] = json!("other");
    api.insert(other);
    let _c = Running::start(context(&api, "test", None));
    let finalized = |api: &ApiServer| {
        get(api, "TalosCluster", "prod").is_some_and(|c| {
            c["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "ichor.maesh.dev/cluster-teardown"))
        })
    };
    wait_for("the teardown finalizer", WAIT, || finalized(&api)).await;

    delete(&api, "TalosCluster", "prod").await;
    wait_for("Teardown waits for the machines", WAIT, || {
        cond(&api, "TalosCluster", "prod", "Teardown")
            == Some(("True".into(), "WaitingForMachines".into()))
    })
    .await;
    let c = get(&api, "TalosCluster", "prod").expect("still there");
    let msg = condition(&c, "Teardown").expect("Teardown")["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        msg.contains("2 TalosMachine(s)") && msg.contains("p-1, w-1"),
        "{msg}"
    );
    assert!(!msg.contains("w-9"), "{msg}");

    delete(&api, "TalosMachine", "w-1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        get(&api, "TalosCluster", "prod").is_some(),
        "p-1 still refers to it"
    );
    delete(&api, "TalosMachine", "p-1").await;
    wait_for("the cluster gone", WAIT, || {
        get(&api, "TalosCluster", "prod").is_none()
    })
    .await;
    assert!(get(&api, "TalosMachine", "w-9").is_some());
}

/// Without Talos API credentials a removal would drain the node and then stop before
/// etcd: it does not start, and says why.
#[tokio::test]
async fn a_removal_without_talos_credentials_does_not_start() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3", "cp-4"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    api.insert(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "cp-4"}, "spec": {},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
    }));
    let _c = Running::start(context(&api, "test", None));
    wait_for("finalizers", WAIT, || has_finalizer(&api, "cp-4")).await;
    delete(&api, "TalosMachine", "cp-4").await;
    wait_for("the removal says why it waits", WAIT, || {
        cond(&api, "TalosMachine", "cp-4", "Removal")
            == Some(("False".into(), "NoTalosCredentials".into()))
    })
    .await;
    let node = get(&api, "Node", "cp-4").expect("node");
    assert!(node["spec"]["unschedulable"].is_null(), "drained: {node}");
    assert!(
        lock_leases(&api)
            .iter()
            .all(|l| l["spec"]["holderIdentity"].is_null())
    );
    assert_eq!(events(&api, "cp-4", "NoTalosCredentials").len(), 1);
    assert!(get(&api, "TalosMachine", "cp-4").is_some());
}

/// A control plane being deleted (its removal under way, held by its finalizer).
async fn being_deleted(api: &ApiServer, name: &str, order: u32) {
    let mut m = control_plane(name, order);
    m["metadata"]["finalizers"] = json!(["ichor.maesh.dev/machine-removal"]);
    api.insert(m);
    delete(api, "TalosMachine", name).await;
}

/// Its finalizer released: the machine is gone.
async fn finalizer_released(api: &ApiServer, name: &str) {
    use ichor_rules::runtime::objects::TalosMachine;
    use kube::api::{Api, Patch, PatchParams};
    Api::<TalosMachine>::namespaced(api.test_client(), NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("finalizer released");
    assert!(get(api, "TalosMachine", name).is_none());
}

#[tokio::test]
async fn the_cluster_lock_serializes_work_and_resumes_its_own() {
    let api = ApiServer::start().await;
    let ctx = context(&api, "test", None);
    being_deleted(&api, "cp-1", 0).await;
    for (i, n) in ["cp-2", "cp-3"].iter().enumerate() {
        api.insert(control_plane(n, i as u32 + 1));
    }
    let a = Work::RemoveControlPlane {
        namespace: NS,
        machine: "cp-1",
    };
    let b = Work::RemoveControlPlane {
        namespace: NS,
        machine: "cp-2",
    };
    let got = disruptive::acquire(&ctx, NS, "prod", a).await.expect("api");
    assert!(matches!(got, Ok(Acquired::Taken)), "{got:?}");
    // The same work again (a restarted controller): resumed.
    let got = disruptive::acquire(&ctx, NS, "prod", a).await.expect("api");
    assert!(matches!(got, Ok(Acquired::Resumed)), "{got:?}");
    // Other work waits.
    match disruptive::acquire(&ctx, NS, "prod", b).await.expect("api") {
        Err(Refused::Held { holder }) => assert_eq!(holder, "remove TalosMachine infra/cp-1"),
        other => panic!("expected held, got {other:?}"),
    }
    // The holder's machine is gone (its removal finished but did not release): stale.
    finalizer_released(&api, "cp-1").await;
    let got = disruptive::acquire(&ctx, NS, "prod", b).await.expect("api");
    assert!(matches!(got, Ok(Acquired::Taken)), "{got:?}");
}

/// Issue 34: the lock's expiry. Work under way keeps the cluster's lock however long its
/// Lease goes unrenewed (a removal waiting on its resetting node, an operation waiting for
/// its node to come back, the controller restarted meanwhile): an expired Lease was taken
/// by any other work, so two disruptions ran at once (`verify` refutes `one-disruption`
/// when the lock's expiry is explored with that policy). Work that is over gives the lock
/// up at once; a holder that names no work of this operator's, once its Lease expired.
#[tokio::test]
async fn an_expired_lock_stays_with_work_under_way() {
    use ichor_rules::runtime::controller::disruptive::{HolderWork, may_take_over};
    use ichor_rules::runtime::controller::lock::LeaseLock;
    assert!(!may_take_over(HolderWork::Running, true));
    assert!(may_take_over(HolderWork::Over, false));
    assert!(may_take_over(HolderWork::Unknown, true));
    assert!(!may_take_over(HolderWork::Unknown, false));
    let api = ApiServer::start().await;
    let mut settings = fast_settings("test");
    settings.lock_duration = Duration::from_secs(1);
    let ctx = Arc::new(ichor_rules::runtime::controller::Context::new(
        api.client(),
        rules(),
        None,
        settings,
        Arc::new(ichor_rules::runtime::metrics::Metrics::default()),
    ));
    being_deleted(&api, "cp-1", 0).await;
    api.insert(control_plane("cp-2", 1));
    api.insert(operation("op-1", "reboot"));
    let removal = Work::RemoveControlPlane {
        namespace: NS,
        machine: "cp-1",
    };
    let op = Work::Operation {
        namespace: NS,
        name: "op-1",
    };
    let expired = || tokio::time::sleep(Duration::from_millis(1300));
    // A removal under way, its Lease expired: the operation waits.
    let got = disruptive::acquire(&ctx, NS, "prod", removal)
        .await
        .expect("api");
    assert!(matches!(got, Ok(Acquired::Taken)), "{got:?}");
    expired().await;
    match disruptive::acquire(&ctx, NS, "prod", op)
        .await
        .expect("api")
    {
        Err(Refused::Held { holder }) => assert_eq!(holder, "remove TalosMachine infra/cp-1"),
        other => panic!("expected held, got {other:?}"),
    }
    // The removal resumes its own lock.
    let got = disruptive::acquire(&ctx, NS, "prod", removal)
        .await
        .expect("api");
    assert!(matches!(got, Ok(Acquired::Resumed)), "{got:?}");
    // Its machine gone: the operation takes the lock at once, expired or not.
    finalizer_released(&api, "cp-1").await;
    let got = disruptive::acquire(&ctx, NS, "prod", op)
        .await
        .expect("api");
    assert!(matches!(got, Ok(Acquired::Taken)), "{got:?}");
    // An unfinished operation, its Lease expired: a removal waits.
    being_deleted(&api, "cp-3", 2).await;
    let other = Work::RemoveControlPlane {
        namespace: NS,
        machine: "cp-3",
    };
    expired().await;
    match disruptive::acquire(&ctx, NS, "prod", other)
        .await
        .expect("api")
    {
        Err(Refused::Held { holder }) => assert_eq!(holder, "TalosOperation infra/op-1"),
        other => panic!("expected held, got {other:?}"),
    }
    // The operation finished (without releasing): taken at once.
    {
        use ichor_rules::runtime::objects::TalosOperation;
        use kube::api::{Api, Patch, PatchParams};
        Api::<TalosOperation>::namespaced(api.test_client(), NS)
            .patch_status(
                "op-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
            )
            .await
            .expect("op-1 finished");
    }
    let got = disruptive::acquire(&ctx, NS, "prod", other)
        .await
        .expect("api");
    assert!(matches!(got, Ok(Acquired::Taken)), "{got:?}");
    // A holder naming no work of ours: waited for until its Lease expires, then taken.
    let lock = LeaseLock::new(
        api.client(),
        "ichor-system",
        &disruptive::lock_name(NS, "prod"),
        Duration::from_secs(1),
        "someone",
        Arc::default(),
    );
    lock.release("remove TalosMachine infra/cp-3")
        .await
        .expect("release");
    assert_eq!(
        lock.acquire("another tool").await.expect("taken"),
        Acquired::Taken
    );
    match disruptive::acquire(&ctx, NS, "prod", other)
        .await
        .expect("api")
    {
        Err(Refused::Held { holder }) => assert_eq!(holder, "another tool"),
        other => panic!("expected held, got {other:?}"),
    }
    expired().await;
    let got = disruptive::acquire(&ctx, NS, "prod", other)
        .await
        .expect("api");
    assert!(matches!(got, Ok(Acquired::Taken)), "{got:?}");
}

/// The even count is the rules' to decide (`hold run operation`, which exempts an etcd
/// restore), not the lock's: the lock only serializes, so a rules edit is the one place
/// the policy changes.
#[tokio::test]
async fn the_even_count_is_decided_by_the_rules_not_by_the_lock() {
    use ichor_rules::runtime::decide::{decide_events, reconcile_operation_event};
    use ichor_rules::runtime::facts::Expensive;
    use ichor_rules::runtime::objects::{Snapshot, TalosMachine, TalosOperation};
    let api = ApiServer::start().await;
    let ctx = context(&api, "test", None);
    let mut snapshot = Snapshot::default();
    for (i, n) in ["cp-1", "cp-2", "cp-3", "cp-4"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
        let m: TalosMachine =
            serde_json::from_value(control_plane(n, i as u32)).expect("a machine");
        snapshot.machines.push(m);
    }
    let table = ctx.rules.current().expect("rules");
    for (kind, held) in [("upgrade", true), ("etcd-restore", false)] {
        let op: TalosOperation = serde_json::from_value(operation("op-1", kind)).expect("op");
        let events: Vec<_> = reconcile_operation_event(&op).into_iter().collect();
        let (d, _) = decide_events(&table, &snapshot, &events, Expensive::Deferred, false);
        assert_eq!(!d.holds.is_empty(), held, "{kind}: {d:?}");
        if held {
            assert_eq!(d.holds[0].rule, "parked-for-transition");
        }
    }
    // The lock itself takes no side: the work the rules let through gets it.
    let op = Work::Operation {
        namespace: NS,
        name: "restore-1",
    };
    let got = disruptive::acquire(&ctx, NS, "prod", op)
        .await
        .expect("api");
    assert!(matches!(got, Ok(Acquired::Taken)), "{got:?}");
}

/// Issue 35: an operation of a kind this operator does not execute, created before the
/// rule that refuses it (or past a webhook that was down), is not left Pending without a
/// word: the controller decides its start rules again and reports the rules' own message
/// (Accepted=False StartRefused, and a Warning event); it never runs.
#[tokio::test]
async fn an_old_operation_of_an_unsupported_kind_gets_the_rules_message() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    api.insert(operation("k8s-1", "kubernetes-upgrade"));
    let _c = Running::start(context(&api, "test", None));
    wait_for("start refused", WAIT, || {
        cond(&api, "TalosOperation", "k8s-1", "Accepted")
            == Some(("False".into(), "StartRefused".into()))
    })
    .await;
    let op = get(&api, "TalosOperation", "k8s-1").expect("op");
    let message = condition(&op, "Accepted").expect("Accepted")["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        message.contains("this operator does not execute kubernetes-upgrade operations")
            && message.contains("talosctl upgrade-k8s"),
        "{message}"
    );
    assert_ne!(op["status"]["phase"], "Running", "{op}");
    assert!(lock_leases(&api).is_empty(), "{:?}", lock_leases(&api));
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_a_lost_one_is_reported() {
    let api = ApiServer::start().await;
    let short = LeaseLock::new(
        api.client(),
        NS,
        "l",
        Duration::from_secs(1),
        "a",
        Arc::default(),
    );
    assert_eq!(short.acquire("a").await.expect("a"), Acquired::Taken);
    assert!(matches!(
        short.acquire("b").await,
        Err(LockError::Held { .. })
    ));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(short.acquire("b").await.expect("b"), Acquired::Taken);
    assert!(matches!(
        short.renew("a").await,
        Err(LockError::Lost { .. })
    ));
    short.release("a").await.expect("not a's to release: no-op");
    assert_eq!(short.holder().await.expect("h"), Some("b".into()));
    short.release("b").await.expect("release");
    assert_eq!(short.holder().await.expect("h"), None);
}

/// Issue 34: two leaders from clock skew. The holder keeps renewing a Lease, but its clock
/// runs an hour behind the other replica's, so every `renewTime` it writes looks an hour old
/// there. Expiry is measured on the reader's own clock from the record it saw: a Lease that
/// keeps being renewed is never taken, whatever the timestamps say; once the renewals stop,
/// it is taken after one whole duration.
#[tokio::test]
async fn clock_skew_never_makes_two_holders() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, PostParams};
    let api = ApiServer::start().await;
    let hour_ago = || {
        jiff::Timestamp::now()
            .checked_sub(jiff::SignedDuration::from_secs(3600))
            .expect("time")
            .to_string()
    };
    api.insert(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "skewed", "namespace": NS},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 1,
                 "acquireTime": hour_ago(), "renewTime": hour_ago()}
    }));
    let leases: Api<Lease> = Api::namespaced(api.client(), NS);
    let b = LeaseLock::new(
        api.client(),
        NS,
        "skewed",
        Duration::from_secs(1),
        "replica-b",
        Arc::default(),
    );
    // "a" renews every 300 ms, with its clock an hour behind.
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert!(
            matches!(b.acquire("b").await, Err(LockError::Held { .. })),
            "taken while renewed"
        );
        assert_eq!(b.holder().await.expect("h"), Some("a".into()));
        let mut lease = leases.get("skewed").await.expect("lease");
        let spec = lease.spec.as_mut().expect("spec");
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            hour_ago().parse().expect("time"),
        ));
        leases
            .replace("skewed", &PostParams::default(), &lease)
            .await
            .expect("renew");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The renewals stop: taken after one whole duration of the same record.
    assert!(matches!(b.acquire("b").await, Err(LockError::Held { .. })));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(b.acquire("b").await.expect("b"), Acquired::Taken);
}

#[tokio::test]
async fn one_replica_leads_and_another_takes_over_when_it_stops() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    let a = context(&api, "replica-a", None);
    let b = context(&api, "replica-b", None);
    let (la, lb) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let ta = tokio::spawn(leader::run(a.clone(), la.clone()));
    wait_for("a leads", WAIT, || la.load(Ordering::Relaxed)).await;
    let tb = tokio::spawn(leader::run(b.clone(), lb.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!lb.load(Ordering::Relaxed), "two leaders");
    // The leader reconciles: the cluster gets its condition.
    wait_for("the leader reconciles", WAIT, || {
        cond(&api, "TalosCluster", "prod", "Transitioning").is_some()
    })
    .await;
    ta.abort();
    let _ = ta.await;
    leader::step_down(&a).await;
    wait_for("b takes over", WAIT, || lb.load(Ordering::Relaxed)).await;
    tb.abort();
}

#[tokio::test]
async fn concurrent_approvals_past_the_cap_hold_the_newest_and_never_join_more_than_count_plus_one()
{
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    let _c = Running::start(context(&api, "test", None));
    wait_for("three finalized", WAIT, || {
        ["cp-1", "cp-2", "cp-3"]
            .iter()
            .all(|n| has_finalizer(&api, n))
    })
    .await;
    // Two approvals at once, past the webhook (each alone was within count + 1 = 4).
    let (a, b) = (control_plane("cp-4", 10), control_plane("cp-5", 11));
    let create = |v: serde_json::Value| {
        let c = api.test_client();
        async move {
            let m: ichor_rules::runtime::objects::TalosMachine =
                serde_json::from_value(v).expect("machine");
            kube::Api::<ichor_rules::runtime::objects::TalosMachine>::namespaced(c, NS)
                .create(&Default::default(), &m)
                .await
                .expect("create")
        }
    };
    tokio::join!(create(a), create(b));
    wait_for("the newest held", WAIT, || {
        cond(&api, "TalosMachine", "cp-5", "Ready")
            == Some(("False".into(), "ControlPlaneOverCap".into()))
    })
    .await;
    wait_for("cp-4 joins", WAIT, || has_finalizer(&api, "cp-4")).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let joined: Vec<String> = api
        .objects("TalosMachine", Some(NS))
        .iter()
        .filter(|m| {
            m["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
        })
        .map(|m| m["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        joined,
        ["cp-1", "cp-2", "cp-3", "cp-4"],
        "never more than count + 1"
    );
    assert_eq!(
        cond(&api, "TalosMachine", "cp-5", "Ready"),
        Some(("False".into(), "ControlPlaneOverCap".into())),
        "still held after several requeues"
    );
    assert_calls_granted(&api);
}

/// `serve --no-controller`, as the chart runs it with controller.enabled=false, calls only
/// what `access::WEBHOOK` grants (the chart's whole RBAC in that mode): its readiness probe
/// and the live reads of its decisions, and no Lease (no leader election).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_alone_calls_only_the_webhook_grants() {
    use ichor_rules::runtime::access::webhook_allows;
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, name) in ["cp-1", "cp-2", "cp-3"].iter().enumerate() {
        api.insert(control_plane(name, i as u32 + 1));
    }
    api.insert(operation("upgrade-1", "upgrade"));
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("webhook-only-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let ca = https::write_cert(&dir);
    let listen = https::free_address();
    let _serve = https::Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
            .args(["serve", "--no-controller", "--listen", &listen.to_string()])
            .args(["--api-server", &api.url(), "--rules", "rules"])
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .args(["--reload-interval-ms", "100"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("serve starts"),
    );
    let call = |method: &'static str, path: &'static str, body: Vec<u8>| {
        let ca = ca.clone();
        async move {
            let (mut send, _) = https::connect(listen, &ca).await;
            https::request(
                &mut send,
                method,
                path,
                "application/json",
                hyper::body::Bytes::from(body),
            )
            .await
        }
    };
    let mut ready = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(listen).await.is_ok()
            && call("GET", "/readyz", Vec::new()).await.0 == 200
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "serve --no-controller became ready");
    let review = |kind: &str, resource: &str, op: &str, obj: serde_json::Value| {
        let uid = format!("{kind}-{op}");
        let (old, new) = if op == "DELETE" {
            (Some(&obj), None)
        } else {
            (None, Some(&obj))
        };
        let r = objects::review(&uid, op, old, new).build();
        assert_eq!(
            (
                &r["request"]["kind"]["kind"],
                &r["request"]["resource"]["resource"]
            ),
            (&json!(kind), &json!(resource)),
            "the review's kind and resource"
        );
        serde_json::to_vec(&r).expect("json")
    };
    // A control-plane delete (3 -> 2: refused after reading the machines and the
    // cluster), a new control plane, and an operation.
    for (path, body) in [
        (
            "/validate/talosmachines",
            review(
                "TalosMachine",
                "talosmachines",
                "DELETE",
                control_plane("cp-3", 3),
            ),
        ),
        (
            "/validate/talosmachines",
            review(
                "TalosMachine",
                "talosmachines",
                "CREATE",
                control_plane("cp-4", 4),
            ),
        ),
        (
            "/validate/talosoperations",
            review(
                "TalosOperation",
                "talosoperations",
                "CREATE",
                operation("reboot-1", "reboot"),
            ),
        ),
    ] {
        let (status, bytes) = call("POST", path, body).await;
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&bytes));
    }
    // A few more reload rounds: a controller, were one running, would have campaigned.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = assert_calls_within(&api, webhook_allows, "the webhook-only chart");
    for needed in [("talosclusters", "list"), ("talosmachines", "list")] {
        assert!(
            seen.contains(&(
                "ichor.maesh.dev".to_string(),
                needed.0.to_string(),
                needed.1.to_string()
            )),
            "{needed:?} not called: {seen:?}"
        );
    }
}

/// The start rules are decided again at the controller before it acts on an operation that
/// has not started (admission may have been bypassed, raced, or edited around): refused, it
/// is marked Accepted=False (StartRefused) with the rules' messages and a Warning event,
/// stays Pending, and is decided again until the rules allow it.
#[tokio::test]
async fn an_operation_the_start_rules_refuse_is_not_run() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    // A reset of a control plane at the declared count, as if admission never saw it.
    let mut reset = operation("reset-1", "reset");
    reset["spec"]["machine"] = json!("cp-1");
    api.insert(reset);
    let _c = Running::start(context(&api, "test", None));
    wait_for("start refused", WAIT, || {
        cond(&api, "TalosOperation", "reset-1", "Accepted")
            == Some(("False".into(), "StartRefused".into()))
    })
    .await;
    let op = get(&api, "TalosOperation", "reset-1").expect("op");
    let msg = condition(&op, "Accepted").expect("Accepted")["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(msg.contains("below the declared count of 3"), "{msg}");
    assert!(
        op["status"]["phase"].is_null() || op["status"]["phase"] == "Pending",
        "{op}"
    );
    wait_for("one Warning event", WAIT, || {
        !events(&api, "reset-1", "StartRefused").is_empty()
    })
    .await;
    // Decided again every parked_requeue, with no new event while nothing changes.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(events(&api, "reset-1", "StartRefused").len(), 1);
    // With the count lowered, the declared count no longer refuses; `healthy.after` is then
    // asked of etcd, which this controller cannot reach (no Talos credentials): the start
    // stays refused, now for that, and the reason says so (fails closed).
    patch_spec(
        &api,
        "TalosCluster",
        "prod",
        json!({"controlPlane": {"count": 1}}),
    )
    .await;
    wait_for("refused for the etcd count", WAIT, || {
        get(&api, "TalosOperation", "reset-1")
            .and_then(|op| condition(&op, "Accepted"))
            .and_then(|c| c["message"].as_str().map(str::to_string))
            .is_some_and(|m| {
                m.contains("healthy etcd members cannot be counted")
                    && !m.contains("declared count")
            })
    })
    .await;
    assert_eq!(
        cond(&api, "TalosOperation", "reset-1", "Accepted"),
        Some(("False".into(), "StartRefused".into()))
    );
}

/// The controller reads through the same reader as the webhook: an answer that
/// contradicts the request (a machine of another namespace in the list) is a failed read,
/// and nothing is decided on it until the answers are consistent again.
#[tokio::test]
async fn the_controller_decides_nothing_on_a_contradictory_read() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3", "cp-4"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    api.store
        .faults
        .rewrite_answers(Some(&format!("namespaces/{NS}/talosmachines")), |v| {
            v["items"][0]["metadata"]["namespace"] = json!("elsewhere");
        });
    let _c = Running::start(context(&api, "test", None));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(cond(&api, "TalosCluster", "prod", "Transitioning"), None);
    api.store.faults.stop_rewriting();
    wait_for("even at 4", WAIT, || {
        cond(&api, "TalosCluster", "prod", "Transitioning")
            == Some(("True".into(), "EvenControlPlaneCount".into()))
    })
    .await;
}

/// A drain reads every page of the pods on its node: with the API server answering one pod
/// per page, a first page holding only a DaemonSet pod does not read as "nothing to evict".
#[tokio::test]
async fn a_drain_reads_every_page_of_the_pods_on_its_node() {
    use ichor_rules::runtime::controller::drain::{Drained, drain};
    let api = ApiServer::start().await;
    api.insert(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let pod = |ns: &str, name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}})
    };
    let mut ds = pod("a-system", "agent");
    ds["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
        "name": "agent", "uid": "u-1", "controller": true}]);
    api.insert(ds);
    api.insert(pod("b-apps", "web-1"));
    api.insert(pod("b-apps", "web-2"));
    api.store.faults.paginate(1);
    let client = api.client();
    let mut outcome = drain(&client, "n1").await.expect("drain");
    for _ in 0..10 {
        if matches!(outcome, Drained::Done) {
            break;
        }
        outcome = drain(&client, "n1").await.expect("drain");
    }
    assert!(matches!(outcome, Drained::Done), "{outcome:?}");
    let left: Vec<String> = api
        .objects("Pod", None)
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(left, ["agent"], "only the DaemonSet pod stays");
}

/// Every Lease the controller uses is in the operator's namespace: the cluster lock is named
/// after the cluster's namespace and name there, and nothing is written in the cluster's
/// namespace.
#[tokio::test]
async fn cluster_locks_live_in_the_operators_namespace_named_per_cluster() {
    let api = ApiServer::start().await;
    for (i, n) in ["cp-1", "cp-2", "cp-3"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    let ctx = context(&api, "test", None);
    let work = Work::Operation {
        namespace: NS,
        name: "upgrade-1",
    };
    let got = disruptive::acquire(&ctx, NS, "prod", work)
        .await
        .expect("api");
    assert!(matches!(got, Ok(Acquired::Taken)), "{got:?}");
    assert!(api.objects("Lease", Some(NS)).is_empty(), "nothing in {NS}");
    let locks = lock_leases(&api);
    assert_eq!(locks.len(), 1, "{locks:?}");
    assert_eq!(locks[0]["metadata"]["name"], "ichor-lock.infra.prod");
    assert_eq!(locks[0]["metadata"]["namespace"], OPERATOR_NS);
    assert_eq!(
        locks[0]["spec"]["holderIdentity"],
        "TalosOperation infra/upgrade-1"
    );
    // The same cluster name in another namespace has a lock of its own.
    let other = Work::Operation {
        namespace: "infra-2",
        name: "upgrade-1",
    };
    let got = disruptive::acquire(&ctx, "infra-2", "prod", other)
        .await
        .expect("api");
    assert!(matches!(got, Ok(Acquired::Taken)), "{got:?}");
    assert_eq!(lock_leases(&api).len(), 2);
    // Names are deterministic, never shared, and within a Lease name's 253 characters.
    assert_eq!(disruptive::lock_name("a-b", "c"), "ichor-lock.a-b.c");
    assert_ne!(
        disruptive::lock_name("a-b", "c"),
        disruptive::lock_name("a", "b-c")
    );
    let long = "c".repeat(250);
    let (l1, l2) = (
        disruptive::lock_name(NS, &long),
        disruptive::lock_name(NS, &format!("{long}x")),
    );
    assert!(l1.len() <= 253 && l2.len() <= 253, "{l1} {l2}");
    assert_ne!(l1, l2);
    assert_eq!(l1, disruptive::lock_name(NS, &long));
    assert!(l1.starts_with("ichor-lockh.infra."), "{l1}");
}

/// An upgrade from the version that kept each cluster's lock in the cluster's namespace
/// (`ichor-lock-<cluster>`, renewed by the old leader until it stopped): the new leader
/// sees the old leader Lease (no version mark) and starts no disruptive work until such a
/// lock has expired, without reading or writing anything outside its own namespace. The
/// next leader (of this version) does not wait.
#[tokio::test]
async fn a_lock_the_previous_version_held_is_honoured_until_it_expires() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    let ago = |s: i64| {
        jiff::Timestamp::now()
            .checked_sub(jiff::SignedDuration::from_secs(s))
            .expect("time")
            .to_string()
    };
    // The previous version's leader Lease, no longer renewed (its pod is gone: the new
    // replica takes it once it has seen it unrenewed for its duration), and its lock of
    // cluster prod, renewed moments before it stopped.
    api.insert(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": leader::LEADER_LEASE, "namespace": OPERATOR_NS,
                     "annotations": {"ichor.maesh.dev/controller": "ichor-rules-old"}},
        "spec": {"holderIdentity": "ichor-rules-old", "leaseDurationSeconds": 2,
                 "acquireTime": ago(600), "renewTime": ago(20)}
    }));
    let old_lock = api.insert(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ichor-lock-prod", "namespace": NS},
        "spec": {"holderIdentity": "remove TalosMachine infra/cp-1", "leaseDurationSeconds": 6,
                 "acquireTime": ago(30), "renewTime": ago(0)}
    }));
    let ctx = context(&api, "replica-new", None);
    let lock_duration = ctx.settings.lock_duration;
    let leading = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(leader::run(ctx.clone(), leading.clone()));
    wait_for("the new replica leads", WAIT, || {
        leading.load(Ordering::Relaxed)
    })
    .await;
    let took_over = std::time::Instant::now();
    let work = Work::Operation {
        namespace: NS,
        name: "upgrade-1",
    };
    match disruptive::acquire(&ctx, NS, "prod", work)
        .await
        .expect("api")
    {
        Err(Refused::Held { holder }) => {
            assert!(
                holder.contains("previous version") && holder.contains("infra/ichor-lock-prod"),
                "{holder}"
            );
        }
        other => panic!("the old lock is not honoured: {other:?}"),
    }
    assert!(
        lock_leases(&api).is_empty(),
        "no new lock while the old may be held"
    );
    // Once it has expired, the work takes the new lock.
    let mut taken = None;
    while took_over.elapsed() < lock_duration + Duration::from_secs(5) {
        if let Ok(a) = disruptive::acquire(&ctx, NS, "prod", work)
            .await
            .expect("api")
        {
            taken = Some(took_over.elapsed());
            assert_eq!(a, Acquired::Taken);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = taken.expect("the work never got the lock");
    assert!(
        after + Duration::from_millis(500) >= lock_duration,
        "taken {after:?} after the takeover, before the old lock could expire ({lock_duration:?})"
    );
    // The old lock was only waited out: never written (nor read: no right to).
    let still = api.objects("Lease", Some(NS));
    assert_eq!(still.len(), 1);
    assert_eq!(
        still[0]["metadata"]["resourceVersion"],
        old_lock["metadata"]["resourceVersion"]
    );
    // The leader Lease now says where this version keeps its locks.
    let lease = api
        .objects("Lease", Some(OPERATOR_NS))
        .into_iter()
        .find(|l| l["metadata"]["name"] == leader::LEADER_LEASE)
        .expect("leader lease");
    assert_eq!(
        lease["metadata"]["annotations"][leader::LOCKS_ANNOTATION],
        leader::LOCKS_IN_OPERATOR_NAMESPACE
    );
    task.abort();
    let _ = task.await;
    leader::step_down(&ctx).await;
    // The next leader of this version finds the lock at once (held by the work above,
    // still under way).
    api.insert(operation("upgrade-1", "upgrade"));
    let next = context(&api, "replica-next", None);
    let leading = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(leader::run(next.clone(), leading.clone()));
    wait_for("the next replica leads", WAIT, || {
        leading.load(Ordering::Relaxed)
    })
    .await;
    let other = Work::Operation {
        namespace: NS,
        name: "upgrade-2",
    };
    match disruptive::acquire(&next, NS, "prod", other)
        .await
        .expect("api")
    {
        Err(Refused::Held { holder }) => assert_eq!(holder, "TalosOperation infra/upgrade-1"),
        got => panic!("{got:?}"),
    }
    task.abort();
}

/// A status field the controller clears (a staged configuration now applied, a removal
/// step now done) leaves the object: the status write is a merge patch, which keeps any
/// field it does not name, so the write names the cleared ones with `null`. Through the
/// real kube client and the test API server's RFC 7386 merge.
#[tokio::test]
async fn a_status_field_the_controller_clears_leaves_the_object() {
    use ichor_rules::runtime::controller::status;
    use ichor_rules::runtime::objects::TalosMachine;
    let api = ApiServer::start().await;
    let mut m = control_plane("cp-a", 1);
    m["status"] = json!({
        "config": {"appliedHash": "old", "stagedHash": "new", "renderedHash": "new"},
        "removal": {"memberDead": false, "done": ["drain node"], "started": "reset node",
                    "startedAt": "2026-12-05T10:00:00Z", "committed": true}
    });
    api.insert(m);
    let client = api.test_client();
    let machines: kube::Api<TalosMachine> = kube::Api::namespaced(client.clone(), NS);
    let live = machines.get("cp-a").await.expect("read");
    let mut next = live.clone();
    {
        let s = next.status.as_mut().expect("status");
        let c = s.config.as_mut().expect("config");
        c.applied_hash = c.staged_hash.take();
        let r = s.removal.as_mut().expect("removal");
        r.done.push("reset node".into());
        r.started = None;
        r.started_at = None;
    }
    status::write(&client, &live, &next).await.expect("write");
    let stored = get(&api, "TalosMachine", "cp-a").expect("cp-a");
    let s = &stored["status"];
    assert_eq!(s["config"]["appliedHash"], "new", "{s}");
    assert!(s["config"].get("stagedHash").is_none(), "{s}");
    assert!(s["removal"].get("started").is_none(), "{s}");
    assert!(s["removal"].get("startedAt").is_none(), "{s}");
    assert_eq!(
        s["removal"]["done"],
        json!(["drain node", "reset node"]),
        "{s}"
    );
    // Read back, it is what the controller meant to write.
    let back = machines.get("cp-a").await.expect("read");
    assert_eq!(back.status, next.status);
}
