//! Fleet scale (issue 15): live reads proportional to a cluster, not to its namespace.
//! The real kube client against the in-process API server, which filters on the CRDs'
//! declared `selectableFields` as a real one does.

use crate::support::apiserver;
use crate::support::objects;

use apiserver::ApiServer;
use ichor_rules::interp::{Facts, Lookup};
use ichor_rules::runtime::facts::{EventFacts, Expensive, SnapshotFacts, Subject};
use ichor_rules::runtime::live::{Decode, LiveReader, ReadLimit, Reads};
use ichor_rules::runtime::objects::{Snapshot, TalosMachine};
use ichor_rules::vocab::{FACTS, RUNTIME_EVENTS, Site, Subject as S};
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use std::time::Duration;

const ALL: Reads = Reads {
    machines: true,
    clusters: true,
    operations: true,
    backups: false,
};

/// A schedulable cluster of three control planes in `infra`.
fn cluster(name: &str) -> Value {
    objects::cluster(name, 3).schedulable("true").build()
}

/// An approved, unreachable machine of `cluster` in `infra`, decided at minute `minute`,
/// whose label claims cluster `a` and which carries 4,000 bytes of annotation.
fn machine(name: &str, cluster: &str, role: &str, minute: u32) -> Value {
    objects::machine(name)
        .cluster(cluster)
        .role(role)
        .label("ichor.maesh.dev/cluster", "a")
        .annotation(
            "kubectl.kubernetes.io/last-applied-configuration",
            &"x".repeat(4000),
        )
        .approved_at(&format!("2026-10-01T00:{minute:02}:00Z"))
        .status(json!({"conditions": [
            {"type": "Ready", "status": "False", "reason": "NodeUnreachable", "message": "gone"},
            {"type": "NodeReachable", "status": "False", "reason": "Timeout", "message": "no answer"}]}))
        .build()
}

/// An upgrade of `cluster` in `infra` in phase `phase`.
fn operation(name: &str, cluster: &str, phase: &str) -> Value {
    objects::operation(name, "upgrade")
        .cluster(cluster)
        .phase(phase)
        .build()
}

/// Cluster `a` (3 control planes, a worker, an operation), cluster `b` in the same
/// namespace with more of everything (its labels even claim cluster `a`), a machine
/// without a cluster, and cluster `a` in another namespace.
fn fleet(api: &ApiServer) {
    api.insert(cluster("a"));
    api.insert(cluster("b"));
    for (i, n) in ["a-1", "a-2", "a-3"].iter().enumerate() {
        api.insert(machine(n, "a", "controlplane", i as u32));
    }
    api.insert(machine("a-w", "a", "worker", 9));
    for i in 0..7 {
        api.insert(machine(&format!("b-{i}"), "b", "controlplane", i));
    }
    api.insert(machine("b-w", "b", "worker", 9));
    api.insert(machine("loose", "", "worker", 9));
    api.insert(operation("a-up", "a", "Running"));
    api.insert(operation("b-up", "b", "Pending"));
    let mut elsewhere = machine("a-1", "a", "controlplane", 0);
    elsewhere["metadata"]["namespace"] = json!("other");
    api.insert(elsewhere);
}

fn names(s: &Snapshot) -> Vec<String> {
    let mut n: Vec<String> = s.machines.iter().map(|m| m.name().to_string()).collect();
    n.sort();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_selects_declared_fields_and_refuses_others() {
    let api = ApiServer::start().await;
    fleet(&api);
    let machines: Api<TalosMachine> = Api::namespaced(api.client(), "infra");
    let got = machines
        .list(&ListParams::default().fields("spec.clusterRef.name=a"))
        .await
        .expect("a declared selectable field");
    let mut n: Vec<String> = got.items.iter().map(|m| m.name().to_string()).collect();
    n.sort();
    assert_eq!(n, ["a-1", "a-2", "a-3", "a-w"]);
    // An absent field selects as the empty string.
    let loose = machines
        .list(&ListParams::default().fields("spec.clusterRef.name="))
        .await
        .expect("empty value");
    assert_eq!(loose.items.len(), 1);
    let not_a = machines
        .list(&ListParams::default().fields("spec.clusterRef.name!=a"))
        .await
        .expect("!=");
    assert_eq!(not_a.items.len(), 9);
    // A field the CRD does not declare is refused as the real API server refuses it.
    for (plural, field) in [
        ("talosmachines", "spec.role"),
        ("talosmachines", "spec.clusterRef"),
        ("talosclusters", "spec.clusterRef.name"),
    ] {
        let err = match plural {
            "talosmachines" => machines
                .list(&ListParams::default().fields(&format!("{field}=a")))
                .await
                .map(|_| ())
                .expect_err(field),
            _ => Api::<ichor_rules::runtime::objects::TalosCluster>::namespaced(
                api.client(),
                "infra",
            )
            .list(&ListParams::default().fields(&format!("{field}=a")))
            .await
            .map(|_| ())
            .expect_err(field),
        };
        match err {
            kube::Error::Api(s) => {
                assert_eq!(s.code, 400, "{field}");
                assert_eq!(s.reason, "BadRequest", "{field}");
                assert_eq!(s.message, format!("field label not supported: {field}"));
            }
            other => panic!("{field}: {other}"),
        }
    }
    // The declaration is the CRD's: what `ichor-rules crds` prints.
    use kube::CustomResourceExt;
    for crd in [
        ichor_rules::runtime::objects::TalosMachine::crd(),
        ichor_rules::runtime::objects::TalosOperation::crd(),
        ichor_rules::runtime::objects::TalosEtcdBackup::crd(),
    ] {
        let fields: Vec<String> = crd.spec.versions[0]
            .selectable_fields
            .iter()
            .flatten()
            .map(|f| f.json_path.clone())
            .collect();
        assert_eq!(fields, [".spec.clusterRef.name"]);
    }
}

/// Every fact of every webhook and controller event about cluster `a`, computed from what
/// the reader reads for `a` alone, is what it is computed from the whole namespace: a
/// machine or operation of another cluster in the same namespace is never counted, and
/// one of `a` is never missed (the server paginates at 1, the reader decodes for
/// decisions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_read_never_counts_another_cluster_and_never_misses_its_own() {
    let api = ApiServer::start().await;
    fleet(&api);
    api.store.faults.paginate(1);
    let whole: Snapshot = ichor_rules::runtime::objects::load_snapshot(
        &api.objects("TalosMachine", Some("infra"))
            .into_iter()
            .chain(api.objects("TalosCluster", Some("infra")))
            .chain(api.objects("TalosOperation", Some("infra")))
            .map(|v| format!("---\n{}\n", serde_json::to_string(&v).expect("json")))
            .collect::<String>(),
    )
    .expect("the namespace's objects");
    for decode in [Decode::Decisions, Decode::Full] {
        let reader = LiveReader::new(api.client(), Duration::from_secs(5)).decoding(decode);
        api.store.faults.take_log();
        let part = reader.snapshot("infra", &["a"], ALL).await.expect("reads");
        assert_eq!(names(&part), ["a-1", "a-2", "a-3", "a-w"], "{decode:?}");
        assert_eq!(part.operations.len(), 1);
        assert_eq!(part.clusters.len(), 1);
        // Every LIST carried the selector: the server filtered.
        for r in api.store.faults.take_log() {
            if r.path.ends_with("/talosmachines") || r.path.ends_with("/talosoperations") {
                assert_eq!(r.field_selector, "spec.clusterRef.name=a", "{r:?}");
            }
        }
        let subject = part.machine("infra", "a-1").expect("a-1");
        let op = part.operation("infra", "a-up").expect("a-up");
        let table = crate::support::controller::rules()
            .current()
            .expect("the shipped rules");
        for &(verb, subj, site) in RUNTIME_EVENTS {
            let ev = EventFacts {
                event: (verb, subj, site),
                namespace: "infra",
                cluster: "a",
                subject: match subj {
                    S::Operation => Subject::Operation(op),
                    S::Cluster => Subject::Cluster(&part.clusters[0]),
                    _ => Subject::Machine {
                        name: "a-1",
                        view: subject,
                        counted: Some(subject),
                    },
                },
            };
            for info in FACTS {
                if !info.fact.available(verb, subj, site) {
                    continue;
                }
                let value = |snap: &Snapshot| match SnapshotFacts::new(
                    &table,
                    snap,
                    ev,
                    if site == Site::Controller {
                        Expensive::Deferred
                    } else {
                        Expensive::FromObjects
                    },
                )
                .fact(info.fact)
                {
                    Lookup::Value(v) => format!("{v:?}"),
                    Lookup::Later => "later".into(),
                };
                assert_eq!(
                    value(&part),
                    value(&whole),
                    "{decode:?} {verb:?} {subj:?} {site:?}: `{}`",
                    info.name
                );
            }
        }
    }
}

/// A server that ignored the field selector would mix clusters into a count: an answer
/// holding another cluster's object is a failed read, never a count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_another_clusters_object_refuses() {
    let api = ApiServer::start().await;
    fleet(&api);
    api.store
        .faults
        .rewrite_answers(Some("talosmachines"), |v| {
            v["items"][0]["spec"]["clusterRef"]["name"] = json!("b");
        });
    let reader = LiveReader::new(api.client(), Duration::from_secs(5)).decoding(Decode::Decisions);
    let err = reader
        .snapshot("infra", &["a"], ALL)
        .await
        .expect_err("refused");
    assert_eq!(
        err.to_string(),
        "the TalosMachines of TalosCluster `infra/a` could not be read (the answer holds TalosMachine `a-1` of TalosCluster `b`, not of `a` asked for)"
    );
}

/// The ordering guarantee of shared reads: a read sent before a request arrived is never
/// its answer. Request 1's LIST is on its way back (the state it read is the state before
/// the write) when a machine is written; requests 2 and 3 arrive after the write: they
/// share one new read, which sees the machine, and request 1 does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_read_is_never_older_than_the_request() {
    let api = ApiServer::start().await;
    fleet(&api);
    let reader = LiveReader::new(api.client(), Duration::from_secs(5)).decoding(Decode::Decisions);
    let machines_only = Reads {
        machines: true,
        clusters: false,
        operations: false,
        backups: false,
    };
    api.store
        .faults
        .hold_answers(Some(("talosmachines", Duration::from_millis(400))));
    api.store.faults.take_log();
    let first = {
        let r = reader.clone();
        tokio::spawn(async move { r.snapshot("infra", &["a"], machines_only).await })
    };
    // Request 1's LIST has been answered (state read) and is held on its way back.
    let mut waited = 0;
    while !api
        .store
        .faults
        .take_log()
        .iter()
        .any(|r| r.path.ends_with("/talosmachines"))
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
        waited += 1;
        assert!(waited < 400, "request 1 never read");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    api.insert(machine("a-4", "a", "controlplane", 4));
    let second = {
        let r = reader.clone();
        tokio::spawn(async move { r.snapshot("infra", &["a"], machines_only).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let third = {
        let r = reader.clone();
        tokio::spawn(async move { r.snapshot("infra", &["a"], machines_only).await })
    };
    let first = first.await.expect("task").expect("read 1");
    let second = second.await.expect("task").expect("read 2");
    let third = third.await.expect("task").expect("read 3");
    assert_eq!(
        names(&first),
        ["a-1", "a-2", "a-3", "a-w"],
        "read before the write"
    );
    for (n, s) in [("2", &second), ("3", &third)] {
        assert_eq!(
            names(s),
            ["a-1", "a-2", "a-3", "a-4", "a-w"],
            "request {n} arrived after the write and must see it"
        );
    }
    let lists = api
        .store
        .faults
        .take_log()
        .iter()
        .filter(|r| r.path.ends_with("/talosmachines"))
        .count();
    assert_eq!(
        lists, 1,
        "requests 2 and 3 shared one read, sent after both asked"
    );
    assert_eq!(reader.shared_reads(), (3, 1));
}

/// A burst of reads about many clusters never has more than the limit in flight toward
/// the API server, and every one of them is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_stays_within_the_read_limit() {
    let api = ApiServer::start().await;
    for c in 0..48 {
        let name = format!("c-{c:02}");
        api.insert(cluster(&name));
        api.insert(machine(&format!("{name}-m"), &name, "controlplane", 0));
    }
    api.store.faults.set_latency(Duration::from_millis(20));
    let limit = ReadLimit::new(4);
    let reader = LiveReader::new(api.client(), Duration::from_secs(10))
        .decoding(Decode::Decisions)
        .limited(limit.clone());
    api.store.faults.reset_peak();
    let tasks: Vec<_> = (0..48)
        .map(|c| {
            let r = reader.clone();
            tokio::spawn(async move {
                let name = format!("c-{c:02}");
                r.snapshot("infra", &[name.as_str()], ALL)
                    .await
                    .map(|s| s.machines.len())
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.expect("task").expect("read"), 1);
    }
    assert_eq!(limit.reads_started(), 48 * 3);
    assert!(limit.peak() <= 4, "peak {}", limit.peak());
    assert_eq!(limit.peak(), 4, "the burst did run reads concurrently");
    let at_server = api.store.faults.peak_in_flight();
    assert!(
        (2..=4).contains(&at_server),
        "the API server saw {at_server} requests at once"
    );
}

/// One machine by name (the lock takeover's question: is the removal's machine gone?) is
/// a LIST selecting `metadata.name`, which the controller is granted, not a LIST of the
/// namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_machine_is_read_by_its_name() {
    let api = ApiServer::start().await;
    fleet(&api);
    let reader = LiveReader::new(api.client(), Duration::from_secs(5));
    api.store.faults.take_log();
    let found = reader.machine("infra", "a-2").await.expect("reads");
    assert_eq!(found.map(|m| m.name().to_string()).as_deref(), Some("a-2"));
    assert!(
        reader
            .machine("infra", "gone")
            .await
            .expect("reads")
            .is_none()
    );
    let log = api.store.faults.take_log();
    assert_eq!(log.len(), 2, "{log:?}");
    for r in &log {
        assert_eq!(r.method, "GET");
        assert!(r.path.ends_with("/namespaces/infra/talosmachines"), "{r:?}");
        assert!(r.field_selector.starts_with("metadata.name="), "{r:?}");
    }
}

/// What a scan of the stored objects finds for `spec.clusterRef.name=<cluster>` in `ns`,
/// by name.
fn scanned(api: &ApiServer, kind: &str, ns: &str, cluster: &str) -> Vec<String> {
    let mut n: Vec<String> = api
        .objects(kind, Some(ns))
        .into_iter()
        .filter(|o| o["spec"]["clusterRef"]["name"].as_str().unwrap_or("") == cluster)
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    n.sort();
    n
}

/// What a `spec.clusterRef.name=<cluster>` list of `kind` in `ns` answers, by name.
async fn listed(api: &ApiServer, kind: &str, ns: &str, cluster: &str) -> Vec<String> {
    use ichor_rules::runtime::objects::TalosOperation;
    let params = ListParams::default().fields(&format!("spec.clusterRef.name={cluster}"));
    let mut n: Vec<String> = if kind == "TalosMachine" {
        Api::<TalosMachine>::namespaced(api.client(), ns)
            .list(&params)
            .await
            .expect("list machines")
            .items
            .iter()
            .map(|m| m.name().to_string())
            .collect()
    } else {
        Api::<TalosOperation>::namespaced(api.client(), ns)
            .list(&params)
            .await
            .expect("list operations")
            .items
            .iter()
            .map(|o| o.name().to_string())
            .collect()
    };
    n.sort();
    n
}

/// The test API server answers a field-selected list from an index by (resource, field,
/// value), as the real one answers from its watch cache's indexers, so the answer costs
/// what it holds rather than what the namespace holds. The index must never drift from a
/// scan: through creates, updates (PUT), merge and JSON patches, status writes, deletes
/// held by a finalizer and their release, and machines and operations moving between
/// clusters (and to no cluster), in two namespaces, every selected list (and the drift
/// check of the whole index) agrees with a scan after every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_field_index_never_drifts_from_a_scan() {
    use ichor_rules::runtime::objects::TalosOperation;
    use kube::api::{DeleteParams, Patch, PatchParams};
    let api = ApiServer::start().await;
    let clusters = ["a", "b", "c", ""];
    let namespaces = ["infra", "other"];
    // A small deterministic generator (xorshift): the same sequence on every run.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let check = |api: &ApiServer, step: &str| {
        let drift = api.index_drift();
        assert!(drift.is_empty(), "after {step}: {drift:#?}");
    };
    let mut moves = 0;
    for step in 0..200 {
        let ns = namespaces[next(2)];
        let i = next(6);
        let cluster = clusters[next(4)];
        let (kind, plural, name) = if next(3) == 0 {
            ("TalosOperation", "talosoperations", format!("op-{i}"))
        } else {
            ("TalosMachine", "talosmachines", format!("m-{i}"))
        };
        let client = api.client();
        let raw = |method: http::Method, path: String, ct: &str, body: Vec<u8>| {
            http::Request::builder()
                .method(method)
                .uri(path)
                .header("content-type", ct)
                .body(body)
                .expect("request")
        };
        let base = format!("/apis/ichor.maesh.dev/v1alpha1/namespaces/{ns}/{plural}");
        let current: Option<Value> = client
            .request::<Value>(raw(
                http::Method::GET,
                format!("{base}/{name}"),
                "application/json",
                Vec::new(),
            ))
            .await
            .ok();
        let spec = |cluster: &str| {
            if kind == "TalosMachine" {
                json!({"clusterRef": {"name": cluster}, "role": "worker", "approved": false})
            } else {
                json!({"clusterRef": {"name": cluster}, "kind": "upgrade"})
            }
        };
        let what = match (current, next(7)) {
            (None, _) => {
                let mut obj = json!({
                    "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": kind,
                    "metadata": {"name": name, "namespace": ns},
                    "spec": spec(cluster),
                });
                if cluster.is_empty() {
                    // No clusterRef at all: the field is absent, selected as "".
                    obj["spec"].as_object_mut().map(|s| s.remove("clusterRef"));
                }
                if next(2) == 0 {
                    obj["metadata"]["finalizers"] = json!(["ichor.maesh.dev/test"]);
                }
                let _: Value = client
                    .request(raw(
                        http::Method::POST,
                        base.clone(),
                        "application/json",
                        serde_json::to_vec(&obj).expect("json"),
                    ))
                    .await
                    .expect("create");
                "create"
            }
            (Some(mut obj), 0) => {
                // A PUT moving it to another cluster.
                moves += usize::from(obj["spec"]["clusterRef"]["name"] != cluster);
                obj["spec"]["clusterRef"] = json!({"name": cluster});
                let _: Value = client
                    .request(raw(
                        http::Method::PUT,
                        format!("{base}/{name}"),
                        "application/json",
                        serde_json::to_vec(&obj).expect("json"),
                    ))
                    .await
                    .expect("update");
                "update"
            }
            (Some(obj), 1) => {
                moves += usize::from(obj["spec"]["clusterRef"]["name"] != cluster);
                let patch = json!({"spec": {"clusterRef": {"name": cluster}}});
                if kind == "TalosMachine" {
                    Api::<TalosMachine>::namespaced(client, ns)
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map(|_| ())
                } else {
                    Api::<TalosOperation>::namespaced(client, ns)
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map(|_| ())
                }
                .expect("merge patch");
                "merge patch"
            }
            (Some(obj), 2) => {
                // A JSON patch removing clusterRef (to no cluster) or setting it.
                let ops = if obj["spec"]["clusterRef"].is_object() && cluster.is_empty() {
                    json!([{"op": "remove", "path": "/spec/clusterRef"}])
                } else {
                    json!([{"op": "add", "path": "/spec/clusterRef", "value": {"name": cluster}}])
                };
                moves += usize::from(obj["spec"]["clusterRef"]["name"] != cluster);
                let _: Value = client
                    .request(raw(
                        http::Method::PATCH,
                        format!("{base}/{name}"),
                        "application/json-patch+json",
                        serde_json::to_vec(&ops).expect("json"),
                    ))
                    .await
                    .expect("json patch");
                "json patch"
            }
            (Some(_), 3) => {
                // A status write (which cannot move it: spec is not written through /status).
                let body =
                    json!({"status": {"phase": "Running", "spec": {"clusterRef": {"name": "z"}}}});
                let _ = client
                    .request::<Value>(raw(
                        http::Method::PATCH,
                        format!("{base}/{name}/status"),
                        "application/merge-patch+json",
                        serde_json::to_vec(&body).expect("json"),
                    ))
                    .await;
                "status write"
            }
            (Some(obj), 4) if obj["metadata"]["deletionTimestamp"].is_string() => {
                // Release a delete held by the finalizer: the object goes.
                let patch = json!({"metadata": {"finalizers": null}});
                let _: Value = client
                    .request(raw(
                        http::Method::PATCH,
                        format!("{base}/{name}"),
                        "application/merge-patch+json",
                        serde_json::to_vec(&patch).expect("json"),
                    ))
                    .await
                    .expect("release finalizer");
                "finalizer released"
            }
            (Some(_), _) => {
                let _ = client
                    .request::<Value>(raw(
                        http::Method::DELETE,
                        format!("{base}/{name}"),
                        "application/json",
                        serde_json::to_vec(&DeleteParams::default()).expect("json"),
                    ))
                    .await
                    .expect("delete");
                "delete"
            }
        };
        let step_name = format!("step {step}: {what} of {kind} {ns}/{name}");
        check(&api, &step_name);
        for ns in namespaces {
            for cluster in clusters {
                for kind in ["TalosMachine", "TalosOperation"] {
                    assert_eq!(
                        listed(&api, kind, ns, cluster).await,
                        scanned(&api, kind, ns, cluster),
                        "after {step_name}: {kind} of cluster {cluster:?} in {ns}"
                    );
                }
            }
        }
    }
    assert!(
        moves >= 25,
        "the sequence moved objects between clusters {moves} times"
    );
}
