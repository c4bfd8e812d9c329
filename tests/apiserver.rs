//! The in-process Kubernetes API server (tests/support/apiserver.rs), driven through the real
//! kube client: every test asserts a behaviour the real API server has.

use crate::support::apiserver;
use crate::support::objects;

use apiserver::ApiServer;
use ichor_rules::runtime::objects::{Role, TalosMachine};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, Preconditions,
    WatchEvent, WatchParams,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::fmt::Debug;
use std::time::{Duration, Instant};
use tokio_stream::{Stream, StreamExt};

const NS: &str = "default";

fn from_json<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

/// A pending worker of `prod` in [`NS`] with exactly `labels`.
fn machine(name: &str, labels: Value) -> TalosMachine {
    let mut m = objects::machine(name)
        .namespace(NS)
        .role("worker")
        .approved(false)
        .build();
    m["metadata"]["labels"] = labels;
    from_json(m)
}

/// A pod as the cluster holds it once its kubelet reports it Running and Ready.
fn running_pod(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn pdb(name: &str, budget: Value, app: &str) -> PodDisruptionBudget {
    let mut spec = json!({"selector": {"matchLabels": {"app": app}}});
    if let (Some(s), Some(b)) = (spec.as_object_mut(), budget.as_object()) {
        s.extend(b.clone());
    }
    from_json(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }))
}

/// The code and reason of a failed call, which must be an API error.
fn api_error<T: Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn names<K: ResourceExt>(items: &[K]) -> Vec<String> {
    items.iter().map(|o| o.name_any()).collect()
}

fn rv<K: ResourceExt>(o: &K) -> String {
    o.resource_version().expect("resourceVersion")
}

/// The next non-bookmark event, within a second.
async fn next_event<K, S>(stream: &mut S) -> WatchEvent<K>
where
    S: Stream<Item = Result<WatchEvent<K>, kube::Error>> + Unpin,
{
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(1), stream.next())
            .await
            .expect("an event within a second")
            .expect("stream still open")
            .expect("event");
        if !matches!(ev, WatchEvent::Bookmark(_)) {
            return ev;
        }
    }
}

fn event_summary<K: ResourceExt>(ev: &WatchEvent<K>) -> (String, String) {
    match ev {
        WatchEvent::Added(o) => ("ADDED".into(), o.name_any()),
        WatchEvent::Modified(o) => ("MODIFIED".into(), o.name_any()),
        WatchEvent::Deleted(o) => ("DELETED".into(), o.name_any()),
        WatchEvent::Bookmark(b) => ("BOOKMARK".into(), b.metadata.resource_version.clone()),
        WatchEvent::Error(e) => ("ERROR".into(), e.reason.clone()),
    }
}

fn ev(kind: &str, name: &str) -> (String, String) {
    (kind.into(), name.into())
}

#[tokio::test]
async fn talos_machine_create_get_list_replace_delete() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    let mut posted = machine("m1", json!({"tier": "worker"}));
    posted.status = Some(from_json(
        json!({"conditions": [{"type": "Ready", "status": "True"}]}),
    ));
    let created = api.create(&PostParams::default(), &posted).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.status, None, "a create drops status");
    assert_eq!(created.spec.role, Some(Role::Worker));

    let got = api.get("m1").await.unwrap();
    assert_eq!(got, created);
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&list.items), ["m1"]);
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert!(list_rv >= rv(&created).parse().unwrap());

    let mut changed = got.clone();
    changed.spec.approved = true;
    let replaced = api
        .replace("m1", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert!(replaced.spec.approved);
    assert_ne!(rv(&replaced), rv(&created));
    assert_eq!(replaced.metadata.generation, Some(2), "spec change");
    assert_eq!(replaced.metadata.uid, created.metadata.uid);

    let mut relabelled = replaced.clone();
    relabelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("zone".into(), "a".into());
    let relabelled = api
        .replace("m1", &PostParams::default(), &relabelled)
        .await
        .unwrap();
    assert_eq!(relabelled.metadata.generation, Some(2), "metadata only");

    // An update that changes nothing keeps the resourceVersion.
    let same = api
        .replace("m1", &PostParams::default(), &relabelled)
        .await
        .unwrap();
    assert_eq!(rv(&same), rv(&relabelled));

    let gone = api.delete("m1", &DeleteParams::default()).await.unwrap();
    let gone = gone
        .left()
        .expect("a custom resource delete answers with the object");
    assert_eq!(gone.name_any(), "m1");
    assert_eq!(api_error(api.get("m1").await), (404, "NotFound".into()));
    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn generate_name_and_dry_run() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    let mut m = machine("", json!({}));
    m.metadata.name = None;
    m.metadata.generate_name = Some("tm-".into());
    let created = api.create(&PostParams::default(), &m).await.unwrap();
    assert!(created.name_any().starts_with("tm-"));
    assert_eq!(created.name_any().len(), "tm-".len() + 5);

    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let would = api.create(&dry, &machine("dry", json!({}))).await.unwrap();
    assert_eq!(would.name_any(), "dry");
    assert_eq!(
        api_error(api.get("dry").await).0,
        404,
        "dry run stores nothing"
    );
    let dp = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    api.delete(&created.name_any(), &dp).await.unwrap();
    api.get(&created.name_any()).await.unwrap();
}

#[tokio::test]
async fn pod_create_get_list_replace_delete() {
    let server = ApiServer::start().await;
    let api: Api<Pod> = Api::namespaced(server.client(), NS);
    let posted: Pod = from_json(running_pod("p1", json!({"app": "web"})));
    let created = api.create(&PostParams::default(), &posted).await.unwrap();
    let status = created.status.clone().unwrap();
    assert_eq!(
        status.phase.as_deref(),
        Some("Pending"),
        "a created pod is Pending"
    );
    assert_eq!(status.conditions, None);
    assert_eq!(created.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(api.get("p1").await.unwrap(), created);
    assert_eq!(
        names(&api.list(&ListParams::default()).await.unwrap().items),
        ["p1"]
    );
    // Across all namespaces too.
    let all: Api<Pod> = Api::all(server.client());
    assert_eq!(
        names(&all.list(&ListParams::default()).await.unwrap().items),
        ["p1"]
    );

    // Pods allow an update without resourceVersion.
    let mut unconditional = created.clone();
    unconditional.metadata.resource_version = None;
    unconditional
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("note".into(), "x".into());
    let replaced = api
        .replace("p1", &PostParams::default(), &unconditional)
        .await
        .unwrap();
    assert_eq!(replaced.annotations()["note"], "x");
    assert_eq!(
        replaced.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "an update ignores status"
    );

    let gone = api.delete("p1", &DeleteParams::default()).await.unwrap();
    let gone = gone.left().expect("a pod delete answers with the pod");
    assert_eq!(gone.name_any(), "p1");
    assert_eq!(api_error(api.get("p1").await).0, 404);
}

#[tokio::test]
async fn node_create_get_list_replace_delete() {
    let server = ApiServer::start().await;
    let api: Api<Node> = Api::all(server.client());
    let posted: Node = from_json(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/control-plane": ""}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }));
    let created = api.create(&PostParams::default(), &posted).await.unwrap();
    assert_eq!(created.metadata.namespace, None, "nodes are cluster-scoped");
    assert!(
        created.status.as_ref().unwrap().conditions.is_some(),
        "a node keeps the status it is created with"
    );
    assert_eq!(api.get("n1").await.unwrap(), created);
    assert_eq!(
        names(&api.list(&ListParams::default()).await.unwrap().items),
        ["n1"]
    );

    let mut cordoned = created.clone();
    cordoned.spec.get_or_insert_default().unschedulable = Some(true);
    let replaced = api
        .replace("n1", &PostParams::default(), &cordoned)
        .await
        .unwrap();
    assert_eq!(replaced.spec.unwrap().unschedulable, Some(true));
    let list = api
        .list(&ListParams::default().fields("spec.unschedulable=true"))
        .await
        .unwrap();
    assert_eq!(names(&list.items), ["n1"]);

    let gone = api.delete("n1", &DeleteParams::default()).await.unwrap();
    let status = gone.right().expect("a node delete answers with a Status");
    assert_eq!(status.details.unwrap().name, "n1");
    assert_eq!(api_error(api.get("n1").await).0, 404);
}

#[tokio::test]
async fn lease_create_get_list_replace_delete() {
    let server = ApiServer::start().await;
    let api: Api<Lease> = Api::namespaced(server.client(), NS);
    let lease = |holder: &str| -> Lease {
        from_json(json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "ichor-controller", "namespace": NS},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
        }))
    };
    let created = api
        .create(&PostParams::default(), &lease("a"))
        .await
        .unwrap();
    assert_eq!(api.get("ichor-controller").await.unwrap(), created);
    assert_eq!(
        names(&api.list(&ListParams::default()).await.unwrap().items),
        ["ichor-controller"]
    );

    // Leases require the resourceVersion on update.
    assert_eq!(
        api_error(
            api.replace("ichor-controller", &PostParams::default(), &lease("b"))
                .await
        ),
        (422, "Invalid".into())
    );
    let mut taken = lease("b");
    taken.metadata.resource_version = created.metadata.resource_version.clone();
    let replaced = api
        .replace("ichor-controller", &PostParams::default(), &taken)
        .await
        .unwrap();
    assert_eq!(replaced.spec.unwrap().holder_identity.as_deref(), Some("b"));
    // Two candidates racing from the same version: the second loses.
    let mut stale = lease("c");
    stale.metadata.resource_version = created.metadata.resource_version.clone();
    assert_eq!(
        api_error(
            api.replace("ichor-controller", &PostParams::default(), &stale)
                .await
        ),
        (409, "Conflict".into())
    );

    let gone = api
        .delete("ichor-controller", &DeleteParams::default())
        .await
        .unwrap();
    let status = gone.right().expect("a lease delete answers with a Status");
    assert_eq!(status.details.unwrap().name, "ichor-controller");
    // A PUT of a missing Lease creates it.
    let recreated = api
        .replace("ichor-controller", &PostParams::default(), &lease("d"))
        .await
        .unwrap();
    assert_eq!(
        recreated.spec.unwrap().holder_identity.as_deref(),
        Some("d")
    );
}

#[tokio::test]
async fn not_found_already_exists_and_conflicts() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    assert_eq!(
        api_error(api.get("missing").await),
        (404, "NotFound".into())
    );
    assert_eq!(
        api_error(api.delete("missing", &DeleteParams::default()).await).0,
        404
    );
    assert_eq!(
        api_error(
            api.patch("missing", &PatchParams::default(), &Patch::Merge(json!({})))
                .await
        )
        .0,
        404
    );
    // Another namespace holds nothing.
    let other: Api<TalosMachine> = Api::namespaced(server.client(), "other");
    let first = api
        .create(&PostParams::default(), &machine("m1", json!({})))
        .await
        .unwrap();
    assert_eq!(api_error(other.get("m1").await).0, 404);
    assert_eq!(
        api_error(
            api.create(&PostParams::default(), &machine("m1", json!({})))
                .await
        ),
        (409, "AlreadyExists".into())
    );

    let mut a = first.clone();
    a.spec.approved = true;
    api.replace("m1", &PostParams::default(), &a).await.unwrap();
    let mut b = first.clone();
    b.spec.hostname = Some("late".into());
    assert_eq!(
        api_error(api.replace("m1", &PostParams::default(), &b).await),
        (409, "Conflict".into())
    );
    // Custom resources refuse an update without resourceVersion.
    b.metadata.resource_version = None;
    assert_eq!(
        api_error(api.replace("m1", &PostParams::default(), &b).await),
        (422, "Invalid".into())
    );
    // A name that does not match the URL.
    let mut renamed = api.get("m1").await.unwrap();
    renamed.metadata.name = Some("m2".into());
    assert_eq!(
        api_error(api.replace("m1", &PostParams::default(), &renamed).await),
        (400, "BadRequest".into())
    );
    // A delete with a stale resourceVersion precondition.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: first.metadata.resource_version.clone(),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_error(api.delete("m1", &dp).await),
        (409, "Conflict".into())
    );
    api.get("m1").await.unwrap();
}

#[tokio::test]
async fn merge_patch_json_patch_and_unsupported_patches() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    let created = api
        .create(
            &PostParams::default(),
            &machine("m1", json!({"a": "1", "b": "2"})),
        )
        .await
        .unwrap();
    let pp = PatchParams::default();

    let merged = api
        .patch(
            "m1",
            &pp,
            &Patch::Merge(json!({
                "metadata": {"labels": {"a": null, "c": "3"}},
                "spec": {"approved": true},
            })),
        )
        .await
        .unwrap();
    let labels: Vec<_> = merged
        .labels()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(labels, [("b", "2"), ("c", "3")]);
    assert!(merged.spec.approved);
    assert_eq!(merged.metadata.generation, Some(2));
    assert_ne!(rv(&merged), rv(&created));

    let patch: json_patch::Patch = from_json(json!([
        {"op": "test", "path": "/spec/approved", "value": true},
        {"op": "replace", "path": "/spec/role", "value": "controlplane"},
        {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}},
    ]));
    let jsonpatched = api
        .patch("m1", &pp, &Patch::Json::<()>(patch))
        .await
        .unwrap();
    assert_eq!(jsonpatched.spec.role, Some(Role::ControlPlane));
    assert_eq!(jsonpatched.annotations()["x"], "y");

    // A failing test operation leaves the object alone.
    let failing: json_patch::Patch = from_json(json!([
        {"op": "test", "path": "/spec/approved", "value": false},
        {"op": "replace", "path": "/spec/role", "value": "worker"},
    ]));
    assert_eq!(
        api_error(api.patch("m1", &pp, &Patch::Json::<()>(failing)).await),
        (422, "Invalid".into())
    );
    assert_eq!(api.get("m1").await.unwrap(), jsonpatched);

    // A patch that names a stale resourceVersion conflicts.
    let stale = Patch::Merge(json!({
        "metadata": {"resourceVersion": rv(&created)},
        "spec": {"approved": false},
    }));
    assert_eq!(
        api_error(api.patch("m1", &pp, &stale).await),
        (409, "Conflict".into())
    );
    // A patch that changes nothing keeps the resourceVersion.
    let noop = api
        .patch(
            "m1",
            &pp,
            &Patch::Merge(json!({"spec": {"approved": true}})),
        )
        .await
        .unwrap();
    assert_eq!(rv(&noop), rv(&jsonpatched));

    let apply = PatchParams::apply("ichor-test");
    let applied = api
        .patch("m1", &apply, &Patch::Apply(machine("m1", json!({}))))
        .await;
    assert_eq!(api_error(applied), (415, "UnsupportedMediaType".into()));
    let strategic = api
        .patch(
            "m1",
            &pp,
            &Patch::Strategic(json!({"spec": {"approved": false}})),
        )
        .await;
    assert_eq!(api_error(strategic).0, 415);
}

#[tokio::test]
async fn status_subresource() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    let created = api
        .create(&PostParams::default(), &machine("m1", json!({})))
        .await
        .unwrap();

    // replace_status changes only status: the spec change in the body is ignored.
    let mut body = created.clone();
    body.spec.approved = true;
    body.status = Some(from_json(json!({"conditions": [
        {"type": "Ready", "status": "False", "reason": "NodeUnreachable"}
    ]})));
    let replaced = api
        .replace_status("m1", &PostParams::default(), &body)
        .await
        .unwrap();
    assert!(!replaced.spec.approved);
    assert!(replaced.node_unreachable());
    assert_eq!(
        replaced.metadata.generation,
        Some(1),
        "status is not counted"
    );
    assert_eq!(api.get_status("m1").await.unwrap(), replaced);

    // A stale resourceVersion conflicts on /status too.
    assert_eq!(
        api_error(
            api.replace_status("m1", &PostParams::default(), &body)
                .await
        ),
        (409, "Conflict".into())
    );

    let patched = api
        .patch_status(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "spec": {"approved": true},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            })),
        )
        .await
        .unwrap();
    assert!(!patched.spec.approved);
    assert_eq!(patched.condition("Ready").unwrap().status, "True");

    // A spec write ignores status.
    let mut spec_write = patched.clone();
    spec_write.spec.approved = true;
    spec_write.status = None;
    let written = api
        .replace("m1", &PostParams::default(), &spec_write)
        .await
        .unwrap();
    assert!(written.spec.approved);
    assert_eq!(written.status, patched.status);
    let merged = api
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": []}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.status, patched.status);
    assert_eq!(rv(&merged), rv(&written), "nothing changed");

    // Kinds without a status subresource have no /status.
    let leases: Api<Lease> = Api::namespaced(server.client(), NS);
    assert_eq!(api_error(leases.get_status("x").await).0, 404);
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    let mut m = machine("m1", json!({}));
    m.metadata.finalizers = Some(vec!["ichor.maesh.dev/machine-removal".into()]);
    api.create(&PostParams::default(), &m).await.unwrap();

    let marked = api.delete("m1", &DeleteParams::default()).await.unwrap();
    let marked = marked
        .left()
        .expect("a pending delete answers with the object");
    assert!(marked.metadata.deletion_timestamp.is_some());
    let held = api.get("m1").await.unwrap();
    assert!(held.deleting());
    assert_eq!(
        held.metadata.deletion_timestamp,
        marked.metadata.deletion_timestamp
    );
    // Deleting again changes nothing.
    api.delete("m1", &DeleteParams::default()).await.unwrap();
    assert_eq!(api.get("m1").await.unwrap(), held);
    // Updates still work, but no finalizer may be added.
    let labelled = api
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert!(labelled.deleting());
    let more = Patch::Merge(json!({"metadata": {"finalizers": [
        "ichor.maesh.dev/machine-removal", "other/finalizer"
    ]}}));
    assert_eq!(
        api_error(api.patch("m1", &PatchParams::default(), &more).await),
        (422, "Invalid".into())
    );

    let released = api
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(released.finalizers().is_empty());
    assert_eq!(api_error(api.get("m1").await), (404, "NotFound".into()));
}

#[tokio::test]
async fn label_selectors() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    for (name, labels) in [
        ("a", json!({"tier": "cp", "zone": "z1"})),
        ("b", json!({"tier": "worker", "zone": "z2"})),
        ("c", json!({"tier": "worker"})),
        ("d", json!({})),
    ] {
        api.create(&PostParams::default(), &machine(name, labels))
            .await
            .unwrap();
    }
    let select = async |selector: &str| {
        let list = api
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap();
        names(&list.items)
    };
    assert_eq!(select("tier=worker").await, ["b", "c"]);
    assert_eq!(select("tier==worker").await, ["b", "c"]);
    assert_eq!(select("tier!=worker").await, ["a", "d"]);
    assert_eq!(select("zone in (z1, z2)").await, ["a", "b"]);
    assert_eq!(select("zone notin (z1)").await, ["b", "c", "d"]);
    assert_eq!(select("zone").await, ["a", "b"]);
    assert_eq!(select("!zone").await, ["c", "d"]);
    assert_eq!(select("tier=worker,zone").await, ["b"]);
    assert_eq!(select("tier in (cp),!zone").await, Vec::<String>::new());
    assert_eq!(
        api_error(api.list(&ListParams::default().labels("tier in cp")).await),
        (400, "BadRequest".into())
    );
}

#[tokio::test]
async fn field_selectors() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    for (name, node) in [("p1", Some("n1")), ("p2", Some("n2")), ("p3", None)] {
        let mut p = running_pod(name, json!({}));
        match node {
            Some(n) => p["spec"]["nodeName"] = n.into(),
            None => {
                p["spec"].as_object_mut().unwrap().remove("nodeName");
            }
        }
        server.insert(p);
    }
    let select = async |selector: &str| {
        let list = pods
            .list(&ListParams::default().fields(selector))
            .await
            .unwrap();
        names(&list.items)
    };
    assert_eq!(select("spec.nodeName=n1").await, ["p1"]);
    assert_eq!(select("spec.nodeName!=n1").await, ["p2", "p3"]);
    assert_eq!(select("spec.nodeName=").await, ["p3"]);
    assert_eq!(select("metadata.name=p2").await, ["p2"]);
    assert_eq!(
        select("status.phase=Running,spec.nodeName=n2").await,
        ["p2"]
    );
    assert_eq!(
        api_error(
            pods.list(&ListParams::default().fields("spec.priority=1"))
                .await
        ),
        (400, "BadRequest".into())
    );

    let machines: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    for name in ["m1", "m2"] {
        machines
            .create(&PostParams::default(), &machine(name, json!({})))
            .await
            .unwrap();
    }
    let m1 = machines
        .list(&ListParams::default().fields("metadata.name=m1"))
        .await
        .unwrap();
    assert_eq!(names(&m1.items), ["m1"]);
    assert_eq!(
        api_error(
            machines
                .list(&ListParams::default().fields("spec.role=worker"))
                .await
        )
        .0,
        400,
        "custom resources select on metadata fields only"
    );
}

#[tokio::test]
async fn limit_and_continue() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &machine(&format!("m{i}"), json!({})),
        )
        .await
        .unwrap();
    }
    let mut seen = Vec::new();
    let mut remaining = Vec::new();
    let mut lp = ListParams::default().limit(2);
    loop {
        let page = api.list(&lp).await.unwrap();
        assert!(page.items.len() <= 2);
        seen.extend(names(&page.items));
        remaining.push(page.metadata.remaining_item_count);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = ListParams::default().limit(2).continue_token(&token),
            None => break,
        }
    }
    assert_eq!(seen, ["m0", "m1", "m2", "m3", "m4"]);
    assert_eq!(remaining, [Some(3), Some(1), None]);

    // A selector narrows each page, and the last page has no continue token.
    let page = api
        .list(&ListParams::default().limit(10).fields("metadata.name!=m0"))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 4);
    assert!(page.metadata.continue_.is_none_or(|c| c.is_empty()));
}

#[tokio::test]
async fn watch_from_a_resource_version_sees_changes_in_order() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    api.create(&PostParams::default(), &machine("before", json!({})))
        .await
        .unwrap();
    let from = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    // Changes made before the watch starts are replayed from `from`.
    api.create(&PostParams::default(), &machine("m1", json!({})))
        .await
        .unwrap();
    let wp = WatchParams::default().timeout(10);
    let stream = api.watch(&wp, &from).await.unwrap();
    let mut stream = std::pin::pin!(stream);
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("ADDED", "m1")
    );

    // And live ones follow.
    api.patch(
        "m1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"approved": true}})),
    )
    .await
    .unwrap();
    let m2 = api
        .create(&PostParams::default(), &machine("m2", json!({})))
        .await
        .unwrap();
    api.delete("m1", &DeleteParams::default()).await.unwrap();
    let modified = next_event(&mut stream).await;
    match &modified {
        WatchEvent::Modified(m) => assert!(m.spec.approved),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    let added = next_event(&mut stream).await;
    match &added {
        WatchEvent::Added(m) => assert_eq!(rv(m), rv(&m2)),
        other => panic!("expected ADDED, got {other:?}"),
    }
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("DELETED", "m1")
    );

    // A finalizer turns the delete into MODIFIED (deletionTimestamp), then DELETED.
    api.patch(
        "m2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["x/y"]}})),
    )
    .await
    .unwrap();
    api.delete("m2", &DeleteParams::default()).await.unwrap();
    api.patch(
        "m2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("MODIFIED", "m2")
    );
    match next_event(&mut stream).await {
        WatchEvent::Modified(m) => assert!(m.deleting()),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("DELETED", "m2")
    );
}

#[tokio::test]
async fn watch_without_a_resource_version_starts_with_the_current_objects() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    for name in ["a", "b"] {
        api.create(&PostParams::default(), &machine(name, json!({})))
            .await
            .unwrap();
    }
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let stream = api
        .watch(&WatchParams::default().timeout(10), "0")
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("ADDED", "b")
    );
    api.create(&PostParams::default(), &machine("c", json!({})))
        .await
        .unwrap();
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("ADDED", "c")
    );

    // Streaming lists: the initial events end with the initial-events-end bookmark.
    let streaming = api
        .watch(&WatchParams::default().timeout(10).initial_events(), "")
        .await
        .unwrap();
    let mut streaming = std::pin::pin!(streaming);
    let mut seen = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(1), streaming.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match ev {
            WatchEvent::Added(m) => seen.push(m.name_any()),
            WatchEvent::Bookmark(b) => {
                assert_eq!(
                    b.metadata.annotations.get("k8s.io/initial-events-end"),
                    Some(&"true".to_string())
                );
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["b", "c"]);
}

#[tokio::test]
async fn watch_with_a_selector_sees_objects_enter_and_leave_it() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    api.create(&PostParams::default(), &machine("m1", json!({"team": "b"})))
        .await
        .unwrap();
    let wp = WatchParams::default().labels("team=a").timeout(10);
    let rv_now = server.resource_version().to_string();
    let stream = api.watch(&wp, &rv_now).await.unwrap();
    let mut stream = std::pin::pin!(stream);
    let label = |team: &str| Patch::Merge(json!({"metadata": {"labels": {"team": team}}}));
    api.patch("m1", &PatchParams::default(), &label("a"))
        .await
        .unwrap();
    api.patch("m1", &PatchParams::default(), &label("b"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &machine("m2", json!({"team": "a"})))
        .await
        .unwrap();
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("ADDED", "m1")
    );
    match next_event(&mut stream).await {
        WatchEvent::Deleted(m) => {
            assert_eq!(m.labels()["team"], "a", "the last state the watch selected");
        }
        other => panic!("expected DELETED, got {other:?}"),
    }
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("ADDED", "m2")
    );
}

#[tokio::test]
async fn drop_watches_ends_the_stream() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    let stream = api
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    api.create(&PostParams::default(), &machine("m1", json!({})))
        .await
        .unwrap();
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("ADDED", "m1")
    );
    server.drop_watches();
    let end = tokio::time::timeout(Duration::from_secs(1), stream.next())
        .await
        .expect("the stream ends at once");
    assert!(end.is_none(), "no more events: {end:?}");
    // A new watch works.
    let again = api
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .unwrap();
    let mut again = std::pin::pin!(again);
    assert_eq!(
        event_summary(&next_event(&mut again).await),
        ev("ADDED", "m1")
    );
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_is_expired() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    let m = api
        .create(&PostParams::default(), &machine("m1", json!({})))
        .await
        .unwrap();
    api.patch(
        "m1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"approved": true}})),
    )
    .await
    .unwrap();
    server.compact();
    let stream = api
        .watch(&WatchParams::default().timeout(10), &rv(&m))
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    match next_event(&mut stream).await {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    let end = tokio::time::timeout(Duration::from_secs(1), stream.next())
        .await
        .unwrap();
    assert!(end.is_none());
}

#[tokio::test]
async fn eviction_without_a_budget_deletes_the_pod() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    server.insert(running_pod("p1", json!({"app": "web"})));
    let status = pods.evict("p1", &EvictParams::default()).await.unwrap();
    assert_eq!(status.code, 201);
    assert_eq!(api_error(pods.get("p1").await).0, 404);
    assert_eq!(
        api_error(pods.evict("p1", &EvictParams::default()).await).0,
        404
    );
}

#[tokio::test]
async fn eviction_honours_min_available() {
    let server = ApiServer::start().await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client, NS);
    pdbs.create(
        &PostParams::default(),
        &pdb("web", json!({"minAvailable": 2}), "web"),
    )
    .await
    .unwrap();
    server.insert(running_pod("w1", json!({"app": "web"})));
    server.insert(running_pod("w2", json!({"app": "web"})));
    server.insert(running_pod("other", json!({"app": "db"})));

    let refused = pods.evict("w1", &EvictParams::default()).await;
    match refused {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (429, "TooManyRequests"));
            let cause = &s.details.unwrap().causes[0];
            assert_eq!(cause.reason, "DisruptionBudget");
            assert!(
                cause
                    .message
                    .contains("needs 2 healthy pods and has 2 currently")
            );
        }
        other => panic!("expected 429, got {other:?}"),
    }
    pods.get("w1").await.unwrap();
    // Pods the budget does not select are not held.
    pods.evict("other", &EvictParams::default()).await.unwrap();

    // Another healthy pod lets one go.
    server.insert(running_pod("w3", json!({"app": "web"})));
    pods.evict("w1", &EvictParams::default()).await.unwrap();
    assert_eq!(api_error(pods.get("w1").await).0, 404);
    assert_eq!(
        api_error(pods.evict("w2", &EvictParams::default()).await).0,
        429
    );

    // A pod that is not Ready does not count; a Pending one is evicted regardless.
    let mut unready = running_pod("w4", json!({"app": "web"}));
    unready["status"]["conditions"][0]["status"] = "False".into();
    server.insert(unready);
    assert_eq!(
        api_error(pods.evict("w2", &EvictParams::default()).await).0,
        429
    );
    // The budget is healthy (2 of 2), so the unready pod may go.
    pods.evict("w4", &EvictParams::default()).await.unwrap();
    let created = pods
        .create(
            &PostParams::default(),
            &from_json(running_pod("w5", json!({"app": "web"}))),
        )
        .await
        .unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    pods.evict("w5", &EvictParams::default()).await.unwrap();

    // Two budgets selecting one pod: the eviction API refuses to choose.
    pdbs.create(
        &PostParams::default(),
        &pdb("web2", json!({"minAvailable": 0}), "web"),
    )
    .await
    .unwrap();
    assert_eq!(
        api_error(pods.evict("w2", &EvictParams::default()).await),
        (500, "InternalError".into())
    );
}

#[tokio::test]
async fn eviction_honours_max_unavailable_against_the_controller_scale() {
    let server = ApiServer::start().await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    let sets: Api<StatefulSet> = Api::namespaced(client, NS);
    let sts = sets
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": "db", "namespace": NS},
                "spec": {
                    "replicas": 3,
                    "serviceName": "db",
                    "selector": {"matchLabels": {"app": "db"}},
                    "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": []}},
                },
            })),
        )
        .await
        .unwrap();
    let owned = |name: &str| {
        let mut p = running_pod(name, json!({"app": "db"}));
        p["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": "db",
            "uid": sts.metadata.uid,
            "controller": true,
        }]);
        p
    };
    for name in ["db-0", "db-1", "db-2"] {
        server.insert(owned(name));
    }
    pdbs.create(
        &PostParams::default(),
        &pdb("db", json!({"maxUnavailable": 1}), "db"),
    )
    .await
    .unwrap();

    pods.evict("db-0", &EvictParams::default()).await.unwrap();
    // Two of the three replicas left: no more disruption until the replacement is Ready.
    assert_eq!(
        api_error(pods.evict("db-1", &EvictParams::default()).await),
        (429, "TooManyRequests".into())
    );
    server.insert(owned("db-0"));
    pods.evict("db-1", &EvictParams::default()).await.unwrap();

    // Bare pods have no controller scale: a maxUnavailable budget expects none of them
    // and allows no disruption.
    server.insert(running_pod("bare", json!({"app": "bare"})));
    pdbs.create(
        &PostParams::default(),
        &pdb("bare", json!({"maxUnavailable": 1}), "bare"),
    )
    .await
    .unwrap();
    assert_eq!(
        api_error(pods.evict("bare", &EvictParams::default()).await).0,
        429
    );
}

#[tokio::test]
async fn injected_latency_delays_every_request() {
    let server = ApiServer::start().await;
    let api: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    api.list(&ListParams::default()).await.unwrap();
    let latency = Duration::from_millis(100);
    server.store.faults.set_latency(latency);
    let started = Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(started.elapsed() >= latency, "{:?}", started.elapsed());
    server.store.faults.set_latency(Duration::ZERO);
    let started = Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(started.elapsed() < latency, "{:?}", started.elapsed());
}

#[tokio::test]
async fn injected_failures_hit_exactly_n_matching_requests() {
    let server = ApiServer::start().await;
    let machines: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    let before = server.store.faults.requests();
    server.store.faults.fail_next(2, Some("/talosmachines"));
    // Other paths are served.
    pods.list(&ListParams::default()).await.unwrap();
    for _ in 0..2 {
        assert_eq!(
            api_error(machines.list(&ListParams::default()).await),
            (500, "InternalError".into())
        );
    }
    machines.list(&ListParams::default()).await.unwrap();
    assert_eq!(server.store.faults.requests() - before, 4);

    // Without a path, any request fails.
    server.store.faults.fail_next(1, None);
    assert_eq!(api_error(pods.list(&ListParams::default()).await).0, 500);
    pods.list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn version() {
    let server = ApiServer::start().await;
    let info = server.client().apiserver_version().await.unwrap();
    assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "35"));
}

#[tokio::test]
async fn eviction_counts_a_deployment_through_its_replica_set() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    let dep = server.insert(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}},
    }));
    let rs = server.insert(json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": NS, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
            "uid": dep["metadata"]["uid"], "controller": true,
        }]},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}},
    }));
    for name in ["web-1-a", "web-1-b"] {
        let mut p = running_pod(name, json!({"app": "web"}));
        p["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
            "uid": rs["metadata"]["uid"], "controller": true,
        }]);
        server.insert(p);
    }
    server.insert(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}},
    }));
    // 50% of the Deployment's 2 replicas must stay: one may go, then none.
    pods.evict("web-1-a", &EvictParams::default())
        .await
        .unwrap();
    assert_eq!(
        api_error(pods.evict("web-1-b", &EvictParams::default()).await),
        (429, "TooManyRequests".into())
    );
}

#[tokio::test]
async fn events_in_both_groups() {
    let server = ApiServer::start().await;
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(server.client(), NS);
    let event = |name: &str, about: &str| -> k8s_openapi::api::core::v1::Event {
        from_json(json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": NS},
            "involvedObject": {"kind": "TalosMachine", "name": about, "namespace": NS},
            "reason": "RemovalApproved",
            "type": "Normal",
            "source": {"component": "ichor-controller"},
        }))
    };
    core.create(&PostParams::default(), &event("e1", "m1"))
        .await
        .unwrap();
    core.create(&PostParams::default(), &event("e2", "m2"))
        .await
        .unwrap();
    let about_m1 = core
        .list(&ListParams::default().fields("involvedObject.name=m1,source=ichor-controller"))
        .await
        .unwrap();
    assert_eq!(names(&about_m1.items), ["e1"]);

    let new: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(server.client(), NS);
    let created = new
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": "e3", "namespace": NS},
                "eventTime": "2026-01-01T00:00:00.000000Z",
                "reportingController": "ichor.maesh.dev/controller",
                "reportingInstance": "ichor-0",
                "action": "Remove",
                "reason": "RemovalApproved",
                "type": "Normal",
                "regarding": {"kind": "TalosMachine", "name": "m1", "namespace": NS},
            })),
        )
        .await
        .unwrap();
    assert_eq!(created.reason.as_deref(), Some("RemovalApproved"));
    assert_eq!(
        names(&new.list(&ListParams::default()).await.unwrap().items),
        ["e3"]
    );
}

#[tokio::test]
async fn watches_and_lists_keep_to_their_namespace() {
    let server = ApiServer::start().await;
    let here: Api<TalosMachine> = Api::namespaced(server.client(), NS);
    let there: Api<TalosMachine> = Api::namespaced(server.client(), "other");
    let everywhere: Api<TalosMachine> = Api::all(server.client());
    let stream = here
        .watch(&WatchParams::default().timeout(10), "0")
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    let mut elsewhere = machine("x", json!({}));
    elsewhere.metadata.namespace = Some("other".into());
    there
        .create(&PostParams::default(), &elsewhere)
        .await
        .unwrap();
    here.create(&PostParams::default(), &machine("y", json!({})))
        .await
        .unwrap();
    assert_eq!(
        event_summary(&next_event(&mut stream).await),
        ev("ADDED", "y")
    );
    assert_eq!(
        names(&here.list(&ListParams::default()).await.unwrap().items),
        ["y"]
    );
    assert_eq!(
        names(&there.list(&ListParams::default()).await.unwrap().items),
        ["x"]
    );
    let all = everywhere.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        names(&all.items),
        ["y", "x"],
        "ordered by namespace, then name"
    );
    // A body naming another namespace than the URL is refused.
    assert_eq!(
        api_error(here.create(&PostParams::default(), &elsewhere).await),
        (400, "BadRequest".into())
    );
}

/// `kube::runtime`'s watcher (what the controllers build on) lists, then watches, and
/// re-lists after a dropped watch: every change reaches it.
#[tokio::test]
async fn kube_runtime_watcher_sees_changes_and_survives_a_dropped_watch() {
    use kube::runtime::watcher::{self, Event};
    let server = ApiServer::start().await;
    let api: kube::Api<TalosMachine> = kube::Api::namespaced(server.client(), "infra");
    let machine = |name: &str| -> TalosMachine {
        serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": "infra"},
            "spec": {"clusterRef": {"name": "prod"}, "role": "worker"}
        }))
        .expect("valid")
    };
    api.create(&PostParams::default(), &machine("before"))
        .await
        .expect("create");
    let mut stream = std::pin::pin!(watcher::watcher(api.clone(), watcher::Config::default()));
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut created_after = false;
    let mut dropped = false;
    while Instant::now() < deadline {
        let next = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("the watcher keeps producing")
            .expect("stream open")
            .expect("no watcher error");
        match next {
            Event::InitApply(m) | Event::Apply(m) => seen.push(m.name_any()),
            Event::InitDone if !created_after => {
                created_after = true;
                api.create(&PostParams::default(), &machine("after"))
                    .await
                    .expect("create");
            }
            _ => {}
        }
        if seen.contains(&"after".to_string()) && !dropped {
            dropped = true;
            server.drop_watches();
            api.create(&PostParams::default(), &machine("after-drop"))
                .await
                .expect("create");
        }
        if seen.contains(&"after-drop".to_string()) {
            break;
        }
    }
    for name in ["before", "after", "after-drop"] {
        assert!(seen.iter().any(|s| s == name), "{name} not seen: {seen:?}");
    }
}
