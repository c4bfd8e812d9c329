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

/// A `Bootstrap` Talos refused without acting: the record is withdrawn (a Warning Event
/// says why), the rules decide again, and the next one bootstraps the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_talos_refused_without_acting_is_withdrawn_and_sent_again() {
    let (api, talos) = world(EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3"])).await;
    talos.node(0).refuse_bootstraps(1);
    let _a = Running::start(controller(&api, &talos, "controller-0"));
    wait_for("the refusal said", WAIT, || {
        !events(&api, "prod", "BootstrapNotSent").is_empty()
    })
    .await;
    wait_for("the bootstrap confirmed", WAIT, || {
        record(&api)["confirmed"] == true
    })
    .await;
    let said = events(&api, "prod", "BootstrapNotSent");
    let note = said[0]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("not ready to be bootstrapped") && note.contains("decides again"),
        "{said:?}"
    );
    assert_eq!(
        bootstrap_calls(&talos),
        vec!["cp-1".to_string(), "cp-1".to_string()]
    );
    assert!(talos.node(0).bootstraps() == 2);
    let r = record(&api);
    assert_eq!(r["machine"], "cp-1", "{r}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(bootstrap_calls(&talos).len(), 2, "never a third");
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

/// A cluster whose etcd stopped on every control plane that has it, and whose first
/// control plane is new (no etcd data): no member answers, but `List` finds data in the
/// others' etcd directories, so the new one is never bootstrapped beside them (a second
/// etcd cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_etcd_stopped_with_its_data_is_never_bootstrapped() {
    let etcd = EtcdCluster::start_named(&["cp-1", "cp-2", "cp-3"]).await;
    etcd.kill_and_wipe(0);
    etcd.kill(1);
    etcd.kill(2);
    assert!(!etcd.has_data(0) && etcd.has_data(1) && etcd.has_data(2));
    let (api, talos) = world(etcd).await;
    let _a = Running::start(controller(&api, &talos, "controller-0"));
    wait_for("etcd data found and recorded", WAIT, || {
        record(&api)["confirmed"] == true
    })
    .await;
    let r = record(&api);
    assert_eq!(r["machine"], "", "{r}");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("1 member(s) listed, or an etcd data directory not empty"),
        "{r}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(bootstrap_calls(&talos).is_empty());
    assert!(
        talos
            .calls()
            .iter()
            .any(|c| c.rpc == "List" && c.node == "cp-2")
    );
    assert!(!talos.etcd.has_data(0), "nothing started on cp-1");
}

/// The bootstrap on the executor, logged (`serve --step-log`, procedure `bootstrap`): two
/// racing controllers' logs both replay as written (`verify --check-trace`); the one that
/// sent `Bootstrap`, with Talos' answer changed to a failure, is not a behaviour: the
/// executor records the bootstrap unconfirmed where the run recorded it confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstraps_step_logs_replay_and_a_changed_answer_is_refuted() {
    let (api, talos) = world(EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3"])).await;
    let logs = [step_log_path("bootstrap-a"), step_log_path("bootstrap-b")];
    let tls = || Some(Arc::new(talos.tls()));
    let a = Running::start(context_logged(&api, "controller-0", tls(), &logs[0]));
    let b = Running::start(context_logged(&api, "controller-1", tls(), &logs[1]));
    wait_for("the bootstrap confirmed", WAIT, || {
        record(&api)["confirmed"] == true
    })
    .await;
    // The sender writes the confirmed record before it logs the write: wait for that line,
    // so the reconcile that sent `Bootstrap` is in the log past its answer (a log cut after
    // the call is a controller stopped there, a behaviour whatever Talos answered).
    wait_for("the sender's confirmed record logged", WAIT, || {
        logs.iter().any(|l| {
            let text = std::fs::read_to_string(l).unwrap_or_default();
            text.split_once("\"call\":\"Bootstrap\"")
                .is_some_and(|(_, after)| {
                    after.lines().any(|x| {
                        x.contains("\"op\":\"record_bootstrap\"")
                            && x.contains("\"confirmed\":true")
                    })
                })
        })
    })
    .await;
    a.kill().await;
    b.kill().await;
    assert_eq!(bootstrap_calls(&talos), vec!["cp-1".to_string()]);
    let texts: Vec<String> = logs
        .iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect();
    for t in &texts {
        let (code, said) = check_step_log_text("bootstrap-as-written", t);
        assert_eq!(code, Some(0), "{said}");
    }
    let sent: Vec<&String> = texts
        .iter()
        .filter(|t| t.contains("\"call\":\"Bootstrap\""))
        .collect();
    assert_eq!(sent.len(), 1, "one controller sent it");
    let text = sent[0];
    assert!(text.contains("\"procedure\":\"bootstrap\""));
    assert!(text.contains("\"op\":\"record_bootstrap\""));
    let mut done = false;
    let failed: String = text
        .lines()
        .map(|l| {
            if done || !l.contains("\"call\":\"Bootstrap\"") {
                return l.to_string();
            }
            done = true;
            let mut v: Value = serde_json::from_str(l).unwrap();
            v["answer"] = json!({"Ok": {"Err": {"unreachable": {
                "endpoint": "10.0.0.1:50000", "node": null, "detail": "connection reset"}}}});
            v.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(done);
    let (code, said) = check_step_log_text("bootstrap-failed", &failed);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("bootstrap record"), "{said}");
}

/// The bootstrap's decision is recorded (issue 38, `--decision-log`): on a cluster whose
/// etcd runs, the refusal with its deciding rule and the `etcd.members` the controller
/// read; on a new cluster, the allow that let `Bootstrap` be sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstraps_decisions_are_recorded() {
    use ichor_rules::runtime::records::{Recorder, Sink};
    use ichor_rules::runtime::step_records::read_decisions;
    for (name, etcd, rule) in [
        (
            "running",
            EtcdCluster::start(3).await,
            Some("bootstrap-etcd-exists"),
        ),
        (
            "new",
            EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3"]),
            None,
        ),
    ] {
        let (api, talos) = world(etcd).await;
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "decisions-bootstrap-{name}-{}.ndjson",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let metrics = Arc::new(Metrics::default());
        let sink = Sink::File {
            path: path.clone(),
            max_bytes: 1 << 30,
            keep: 1,
        };
        let recorder = Recorder::start(sink, 4096, metrics.clone()).expect("the recorder");
        let ctx = Context::new(
            api.client(),
            rules(),
            Some(Arc::new(talos.tls())),
            fast_settings("controller-0"),
            metrics,
        )
        .with_records(recorder);
        let _c = Running::start(Arc::new(ctx));
        let bootstrap_decision = || {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            read_decisions(&text)
                .unwrap_or_default()
                .into_iter()
                .map(|r| serde_json::to_value(&r).unwrap())
                .find(|r| r["target"]["name"] == "cp-1" && r.to_string().contains("\"bootstrap\""))
        };
        wait_for("the bootstrap's decision recorded", WAIT, || {
            bootstrap_decision().is_some()
        })
        .await;
        let r = bootstrap_decision().unwrap();
        assert_eq!(r["target"]["name"], "cp-1", "{r}");
        let text = r.to_string();
        match rule {
            Some(rule) => {
                assert!(text.contains(rule), "{text}");
                assert!(text.contains("etcd.members"), "{text}");
            }
            None => {
                assert!(!text.contains("bootstrap-etcd-exists"), "{text}");
                wait_for("the bootstrap confirmed", WAIT, || {
                    record(&api)["confirmed"] == true
                })
                .await;
            }
        }
    }
}

/// The stand-in's `Bootstrap` picks its etcd ports when etcd starts: a port the unstarted
/// member was given, taken by someone else meanwhile (CI saw it: the etcd never started,
/// the bootstrap was never confirmed), does not stop the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_starts_etcd_though_the_port_first_picked_was_taken() {
    let etcd = EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3"]);
    let before = etcd.client_url(0);
    let port: u16 = before.rsplit(':').next().unwrap().parse().unwrap();
    // Held by another socket for the whole start, as an ephemeral client port would be.
    let _held = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    etcd.bootstrap(0).await.unwrap();
    assert_ne!(etcd.client_url(0), before);
    assert!(etcd.has_data(0));
}

/// A spare control plane, not approved and never configured, sits in Talos' maintenance
/// mode: it fails the cluster's mTLS handshake and answers only the maintenance API. It
/// runs no etcd, so it counts no member and the new cluster is bootstrapped on cp-1 as
/// without it (the audit of issue 37: it made `etcd.members` unreadable, and the bootstrap
/// waited for good). The spare is left as it was: in maintenance, no configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_control_plane_in_maintenance_mode_does_not_hold_the_bootstrap_up() {
    let etcd = EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3", "cp-4"]);
    let (api, talos) = world(etcd).await;
    talos.node(3).maintenance();
    let mut spare = machine("cp-4", "controlplane", false, 4);
    spare["spec"]["endpoint"] = json!(talos.node(3).endpoint());
    api.insert(spare);
    let _a = Running::start(controller(&api, &talos, "controller-0"));
    wait_for("the bootstrap confirmed", WAIT, || {
        record(&api)["confirmed"] == true
    })
    .await;
    let r = record(&api);
    assert_eq!(r["machine"], "cp-1", "{r}");
    assert_eq!(bootstrap_calls(&talos), vec!["cp-1".to_string()]);
    assert!(talos.node(3).in_maintenance());
    assert!(talos.node(3).config().is_none());
}
