//! Decision tests for every case the seed ADRs (0010, 0054, 0106 §4, 0137) spell out, run
//! through the library API exactly as `ichor-rules eval` wires it (src/cli/eval.rs): the
//! shipped `rules/`, a snapshot loaded from a YAML stream, an AdmissionReview v1 parsed by
//! `parse_review` and answered by `respond`, or a reconcile event for the controller.
//!
//! Objects are built as JSON values by small helpers below and turned into a YAML
//! multi-document stream, so the loader the CLI uses is the one under test too.

//!
//! Every admission case also goes end to end: the objects are written to the in-process
//! API server, the same AdmissionReview is posted over HTTPS to the webhook (which reads
//! them live), and its answer must equal the offline one byte for byte.

// `&[x.clone()]` reads better than `std::slice::from_ref(&x)` among object lists.
#![allow(clippy::cloned_ref_to_slice_refs)]

#[allow(dead_code)]
#[path = "support/apiserver.rs"]
mod apiserver;
#[allow(dead_code)]
#[path = "support/https.rs"]
mod https;

use ichor_rules::compile::Table;
use ichor_rules::interp::Decision;
use ichor_rules::ruleset::{RuleSet, load};
use ichor_rules::runtime::admission::{parse_review, respond};
use ichor_rules::runtime::decide::{
    decide_events, reconcile_machine_event, reconcile_operation_event, request_events,
};
use ichor_rules::runtime::facts::Expensive::FromObjects;
use ichor_rules::runtime::objects::{Snapshot, load_snapshot};
use ichor_rules::vocab::Verdict;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::OnceLock;

// ---------------------------------------------------------------------------------------
// The shipped rules.
// ---------------------------------------------------------------------------------------

fn rules() -> &'static Table {
    static SET: OnceLock<RuleSet> = OnceLock::new();
    let set = SET.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
        load(&[dir]).expect("the shipped rules load")
    });
    set.table
        .as_ref()
        .expect("the shipped rules check without errors")
}

const NS: &str = "ns";
const T0: &str = "2026-10-01T00:00:00Z";

/// Decision time number `i` (ascending with `i`).
fn at(i: u32) -> String {
    format!("2026-10-01T{:02}:{:02}:00Z", i / 60, i % 60)
}

// ---------------------------------------------------------------------------------------
// Object builders.
// ---------------------------------------------------------------------------------------

/// A TalosCluster `name` in namespace `ns`.
fn cluster(name: &str, count: i64, schedulable: &str) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosCluster",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}")},
        "spec": {"controlPlane": {"count": count}, "schedulable": schedulable},
    })
}

/// A TalosMachine of cluster `c`.
fn machine(name: &str, role: &str, approved: bool, decision_at: Option<&str>) -> Value {
    let mut spec = json!({
        "clusterRef": {"name": "c"},
        "role": role,
        "approved": approved,
        "endpoint": format!("{name}.example:50000"),
    });
    if let Some(t) = decision_at {
        spec["approvalDecision"] = json!({"at": t});
    }
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosMachine",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                     "creationTimestamp": T0},
        "spec": spec,
    })
}

/// Approved control plane `cp{i}`, decided at time `i`.
fn cp(i: u32) -> Value {
    machine(&format!("cp{i}"), "controlplane", true, Some(&at(i)))
}

/// Approved control planes cp1..cpn.
fn cps(n: u32) -> Vec<Value> {
    (1..=n).map(cp).collect()
}

/// Approved worker `w{i}`.
fn worker(i: u32) -> Value {
    machine(&format!("w{i}"), "worker", true, Some(&at(100 + i)))
}

/// A pending (unapproved) machine.
fn pending(name: &str, role: &str) -> Value {
    machine(name, role, false, None)
}

fn with(mut v: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut v);
    v
}

/// The allow-delete annotation set.
fn allowed(v: Value) -> Value {
    with(v, |v| {
        v["metadata"]["annotations"] = json!({"ichor.maesh.dev/allow-delete": "true"});
    })
}

/// Being deleted (deletionTimestamp set, finalizer still held).
fn deleting(v: Value) -> Value {
    with(v, |v| {
        v["metadata"]["deletionTimestamp"] = json!("2026-10-02T00:00:00Z");
        v["metadata"]["finalizers"] = json!(["ichor.maesh.dev/machine-removal"]);
    })
}

/// Ready=False NodeUnreachable (ADR 0106 §3).
fn unreachable(v: Value) -> Value {
    with(v, |v| {
        v["status"] = json!({"conditions": [{
            "type": "Ready", "status": "False", "reason": "NodeUnreachable",
            "message": "the node at 10.0.0.3:50000 has not answered for 3m0s: dial tcp: i/o timeout",
        }]});
    })
}

/// A removal that already proceeded for a dead member (ADR 0106 §4 marker).
fn dead_member_removal(v: Value) -> Value {
    with(v, |v| {
        v["status"] = json!({"conditions": [{
            "type": "Removal", "status": "True", "reason": "DeadMemberRemoval",
        }]});
    })
}

fn set_spec(v: Value, key: &str, value: Value) -> Value {
    with(v, |v| v["spec"][key] = value)
}

fn in_cluster(v: Value, name: &str) -> Value {
    set_spec(v, "clusterRef", json!({"name": name}))
}

fn labelled(v: Value) -> Value {
    with(v, |v| v["metadata"]["labels"] = json!({"team": "infra"}))
}

fn without_decision(v: Value) -> Value {
    with(v, |v| {
        v["spec"]
            .as_object_mut()
            .unwrap()
            .remove("approvalDecision");
    })
}

fn created_at(v: Value, t: &str) -> Value {
    with(v, |v| v["metadata"]["creationTimestamp"] = json!(t))
}

/// A TalosOperation of cluster `c`.
fn operation(name: &str, kind: &str, phase: Option<&str>, target: Option<&str>) -> Value {
    let mut v = json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosOperation",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                     "creationTimestamp": T0},
        "spec": {"clusterRef": {"name": "c"}, "kind": kind},
    });
    if let Some(t) = target {
        v["spec"]["machine"] = json!(t);
    }
    if let Some(p) = phase {
        v["status"] = json!({"phase": p, "conditions": []});
    }
    v
}

/// Paused by `reason` (Paused=True).
fn paused(v: Value, reason: &str) -> Value {
    with(v, |v| {
        v["status"] = json!({"phase": "Paused", "conditions": [{
            "type": "Paused", "status": "True", "reason": reason,
        }]});
    })
}

/// Parked by the controller for the even count (ADR 0137).
fn parked(v: Value) -> Value {
    paused(v, "ClusterTransitioning")
}

fn failure(v: Value, reason: &str) -> Value {
    with(v, |v| v["status"]["failureReason"] = json!(reason))
}

// ---------------------------------------------------------------------------------------
// Deciding, as the CLI does.
// ---------------------------------------------------------------------------------------

/// The objects as a YAML multi-document stream, loaded as `--objects` would be.
fn snapshot(objects: &[Value]) -> Snapshot {
    let text = objects
        .iter()
        .map(|o| serde_yaml::to_string(o).expect("to YAML"))
        .collect::<Vec<_>>()
        .join("---\n");
    load_snapshot(&text).unwrap_or_else(|e| panic!("objects load: {e}\n{text}"))
}

/// An AdmissionReview v1 request for one of our objects.
fn review(op: &str, old: Option<&Value>, new: Option<&Value>) -> Value {
    let obj = new.or(old).expect("an object");
    let kind = obj["kind"].as_str().unwrap();
    let resource = format!("{}s", kind.to_lowercase());
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": resource},
            "requestKind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": kind},
            "requestResource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": resource},
            "name": obj["metadata"]["name"],
            "namespace": NS,
            "operation": op,
            "userInfo": {"username": "admin", "groups": ["system:masters"]},
            "object": new.cloned().unwrap_or(Value::Null),
            "oldObject": old.cloned().unwrap_or(Value::Null),
            "dryRun": false,
        }
    })
}

/// What the webhook decided for one request.
struct Admission {
    decision: Decision,
    /// The AdmissionReview response, as JSON.
    response: Value,
    events: usize,
}

impl Admission {
    fn allowed(&self) -> bool {
        self.response["response"]["allowed"] == json!(true)
    }

    fn rules(&self) -> Vec<&str> {
        self.decision
            .refusals
            .iter()
            .map(|f| f.rule.as_str())
            .collect()
    }

    fn message(&self) -> String {
        self.response["response"]["status"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    fn message_of(&self, rule: &str) -> &str {
        self.decision
            .refusals
            .iter()
            .find(|f| f.rule == rule)
            .map(|f| f.message.as_str())
            .unwrap_or_else(|| panic!("no refusal by {rule}: {:#?}", self.decision))
    }

    #[track_caller]
    fn assert_allowed(&self) {
        assert!(
            self.allowed() && self.decision.refusals.is_empty(),
            "expected allowed, got {:#?}",
            self.decision
        );
    }

    /// Refused by exactly these rules (in any order); every one is reported.
    #[track_caller]
    fn assert_refused_by(&self, rules: &[&str]) {
        assert!(!self.allowed(), "expected refused, got allowed");
        assert_eq!(self.response["response"]["status"]["code"], json!(403));
        let mut got = self.rules();
        got.sort_unstable();
        let mut want = rules.to_vec();
        want.sort_unstable();
        assert_eq!(got, want, "refusing rules; decision {:#?}", self.decision);
        let message = self.message();
        for f in &self.decision.refusals {
            assert!(
                message.contains(&f.message),
                "the response reports every refusal: {message:?} lacks {:?}",
                f.message
            );
        }
    }

    /// The admission warnings, as the response carries them.
    fn warnings(&self) -> Vec<String> {
        let from_response: Vec<String> = self.response["response"]["warnings"]
            .as_array()
            .map(|w| {
                w.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let from_decision: Vec<String> = self
            .decision
            .warnings
            .iter()
            .map(|f| f.message.clone())
            .collect();
        assert_eq!(
            from_response, from_decision,
            "the response carries every warning"
        );
        from_decision
    }

    #[track_caller]
    fn assert_no_warnings(&self) {
        assert!(self.warnings().is_empty(), "{:#?}", self.decision.warnings);
        assert!(
            self.response["response"]
                .get("warnings")
                .is_none_or(|w| w.is_null())
        );
    }

    #[track_caller]
    fn assert_warns(&self, fragment: &str) {
        let w = self.warnings();
        assert!(
            w.iter().any(|m| m.contains(fragment)),
            "no warning with {fragment:?}: {w:?}"
        );
    }

    #[track_caller]
    fn assert_message_contains(&self, rule: &str, fragment: &str) {
        let m = self.message_of(rule);
        assert!(m.contains(fragment), "{rule}: {m:?} lacks {fragment:?}");
    }
}

// ---------------------------------------------------------------------------------------
// The webhook over HTTPS against the in-process API server, shared by every case; each
// case gets a namespace of its own.
// ---------------------------------------------------------------------------------------

struct Live {
    rt: tokio::runtime::Runtime,
    api: apiserver::ApiServer,
    addr: std::net::SocketAddr,
    ca: rustls::pki_types::CertificateDer<'static>,
    next: std::sync::atomic::AtomicUsize,
}

fn live() -> &'static Live {
    static LIVE: OnceLock<Live> = OnceLock::new();
    LIVE.get_or_init(|| {
        use ichor_rules::runtime::{live::LiveReader, metrics::Metrics, reload::Rules};
        use ichor_rules::runtime::{tls::ReloadingCert, webhook};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("seeds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let ca = https::write_cert(&dir);
        let (api, addr) = rt.block_on(async {
            let api = apiserver::ApiServer::start().await;
            let rules = std::sync::Arc::new(Rules::new(vec![
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules"),
            ]));
            rules.reload();
            let cert = std::sync::Arc::new(
                ReloadingCert::new(dir.join("tls.crt"), dir.join("tls.key")).expect("pair"),
            );
            let tls = std::sync::Arc::new(cert.server_config().expect("tls"));
            let state = std::sync::Arc::new(webhook::Webhook {
                rules,
                reader: LiveReader::new(api.client(), std::time::Duration::from_secs(5)),
                metrics: std::sync::Arc::new(Metrics::default()),
                api_ready: Default::default(),
            });
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            tokio::spawn(webhook::serve_tls(
                listener,
                tls,
                webhook::router(state),
                std::future::pending(),
            ));
            (api, addr)
        });
        Live {
            rt,
            api,
            addr,
            ca,
            next: Default::default(),
        }
    })
}

/// Moves an object (or a review's objects) into namespace `ns`.
fn renamespace(v: &Value, ns: &str) -> Value {
    let mut v = v.clone();
    if v["metadata"].is_object() {
        v["metadata"]["namespace"] = json!(ns);
    }
    v
}

/// The webhook's answer to `review` with `objects` live in a fresh namespace.
fn webhook_answer(objects: &[Value], review: &Value) -> Value {
    let l = live();
    let ns = format!(
        "seed-{}",
        l.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    let mut deleting = Vec::new();
    for o in objects {
        let mut o = renamespace(o, &ns);
        if o["metadata"]
            .get("deletionTimestamp")
            .is_some_and(|d| !d.is_null())
        {
            // A create never carries deletionTimestamp: hold it with a finalizer, then delete.
            if o["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty())
            {
                o["metadata"]["finalizers"] = json!(["test.ichor/hold"]);
            }
            deleting.push((
                o["kind"].as_str().unwrap_or("").to_string(),
                o["metadata"]["name"].as_str().unwrap_or("").to_string(),
            ));
        }
        l.api.insert(o);
    }
    let mut review = review.clone();
    review["request"]["namespace"] = json!(ns);
    for key in ["object", "oldObject"] {
        if review["request"][key].is_object() {
            review["request"][key] = renamespace(&review["request"][key], &ns);
        }
    }
    l.rt.block_on(async {
        use ichor_rules::runtime::objects::{TalosCluster, TalosMachine, TalosOperation};
        use kube::api::DeleteParams;
        for (kind, name) in &deleting {
            let client = l.api.client();
            let dp = DeleteParams::default();
            let _ = match kind.as_str() {
                "TalosMachine" => kube::Api::<TalosMachine>::namespaced(client, &ns)
                    .delete(name, &dp)
                    .await
                    .map(|_| ()),
                "TalosCluster" => kube::Api::<TalosCluster>::namespaced(client, &ns)
                    .delete(name, &dp)
                    .await
                    .map(|_| ()),
                _ => kube::Api::<TalosOperation>::namespaced(client, &ns)
                    .delete(name, &dp)
                    .await
                    .map(|_| ()),
            };
        }
        let (mut send, _) = https::connect(l.addr, &l.ca).await;
        let (status, bytes) = https::request(
            &mut send,
            "POST",
            "/validate/talosmachines",
            "application/json",
            serde_json::to_vec(&review).expect("json").into(),
        )
        .await;
        assert_eq!(status, 200);
        serde_json::from_slice(&bytes).expect("an AdmissionReview")
    })
}

/// Decides an AdmissionReview against the live objects, as the webhook does — offline
/// through the library, and over HTTPS through the webhook; both must answer the same.
fn admit(objects: &[Value], op: &str, old: Option<&Value>, new: Option<&Value>) -> Admission {
    let snap = snapshot(objects);
    let review_json = review(op, old, new);
    let body = serde_json::to_vec(&review_json).unwrap();
    let req = parse_review(&body).unwrap_or_else(|e| panic!("review parses: {e}"));
    let events = request_events(
        req.operation(),
        &req.namespace,
        req.old.as_ref(),
        req.new.as_ref(),
    );
    let (decision, _) = decide_events(rules(), &snap, &events, FromObjects, false);
    let response = serde_json::to_value(respond(&req, &decision)).unwrap();
    assert_eq!(
        response["response"]["uid"],
        json!("705ab4f5-6393-11e8-b7cc-42010a800002")
    );
    assert_eq!(
        webhook_answer(objects, &review_json),
        response,
        "the webhook over HTTPS answers what eval answers"
    );
    Admission {
        decision,
        response,
        events: events.len(),
    }
}

fn delete(objects: &[Value], old: &Value) -> Admission {
    admit(objects, "DELETE", Some(old), None)
}

fn update(objects: &[Value], old: &Value, new: &Value) -> Admission {
    admit(objects, "UPDATE", Some(old), Some(new))
}

fn create(objects: &[Value], new: &Value) -> Admission {
    admit(objects, "CREATE", None, Some(new))
}

/// What the controller decided for one object.
struct Reconcile {
    decision: Decision,
}

impl Reconcile {
    fn verdict(&self) -> &'static str {
        match self.decision.verdict() {
            Some(Verdict::Refuse) => "refuse",
            Some(Verdict::Hold) => "hold",
            _ => "proceed",
        }
    }

    fn reason(&self) -> Option<&str> {
        self.decision
            .deciding()
            .iter()
            .find_map(|f| f.reason.as_deref())
    }

    fn rules(&self) -> Vec<&str> {
        self.decision
            .deciding()
            .iter()
            .map(|f| f.rule.as_str())
            .collect()
    }

    fn message(&self) -> String {
        self.decision
            .deciding()
            .iter()
            .map(|f| f.message.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[track_caller]
    fn assert_proceed(&self) {
        assert_eq!(self.verdict(), "proceed", "{:#?}", self.decision);
    }

    #[track_caller]
    fn assert(&self, verdict: &str, reason: Option<&str>, rules: &[&str]) {
        assert_eq!(self.verdict(), verdict, "{:#?}", self.decision);
        assert_eq!(self.reason(), reason, "{:#?}", self.decision);
        assert_eq!(self.rules(), rules, "{:#?}", self.decision);
    }
}

/// Decides a reconcile of the TalosMachine or TalosOperation `name`, as the controller
/// would offline (`member.dead` read from the objects).
fn reconcile(objects: &[Value], name: &str) -> Reconcile {
    let snap = snapshot(objects);
    let events: Vec<_> = if let Some(m) = snap.machine(NS, name) {
        reconcile_machine_event(m).into_iter().collect()
    } else if let Some(o) = snap.operation(NS, name) {
        reconcile_operation_event(o).into_iter().collect()
    } else {
        panic!("no object {name}")
    };
    let (decision, _) = decide_events(rules(), &snap, &events, FromObjects, false);
    Reconcile { decision }
}

fn objs(groups: &[&[Value]]) -> Vec<Value> {
    groups.iter().flat_map(|g| g.iter().cloned()).collect()
}

// ---------------------------------------------------------------------------------------
// ADR 0010: the allow-delete annotation is a gate, never a safety override.
// ---------------------------------------------------------------------------------------

#[test]
fn machine_delete_without_allow_delete_is_refused() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3), &[worker(1), worker(2)]]);
    let a = delete(&objects, &worker(1));
    a.assert_refused_by(&["machine-allow-delete"]);
    a.assert_message_contains(
        "machine-allow-delete",
        "deleting TalosMachine w1 needs the annotation ichor.maesh.dev/allow-delete: \"true\"",
    );
}

#[test]
fn machine_delete_with_allow_delete_is_allowed() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3), &[worker(1), worker(2)]]);
    delete(&objects, &allowed(worker(1))).assert_allowed();
}

#[test]
fn allow_delete_annotation_value_must_be_true() {
    let objects = objs(&[&[cluster("c", 3, "true")], &[worker(1), worker(2)]]);
    let w = with(worker(1), |v| {
        v["metadata"]["annotations"] = json!({"ichor.maesh.dev/allow-delete": "false"});
    });
    delete(&objects, &w).assert_refused_by(&["machine-allow-delete"]);
}

/// ADR 0010: the gate has no exception for a missing TalosCluster (a typo in clusterRef
/// must not turn it off); only a TalosCluster being deleted says it for its machines.
#[test]
fn machine_delete_needs_allow_delete_when_its_cluster_is_missing() {
    let objects = objs(&[&[worker(1)]]);
    let a = delete(&objects, &worker(1));
    a.assert_refused_by(&["machine-allow-delete"]);
    a.assert_message_contains(
        "machine-allow-delete",
        "deleting TalosMachine w1 needs the annotation ichor.maesh.dev/allow-delete: \"true\"",
    );
}

#[test]
fn pending_machine_delete_still_needs_allow_delete() {
    let p = pending("p1", "controlplane");
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3), &[p.clone()]]);
    delete(&objects, &p).assert_refused_by(&["machine-allow-delete"]);
}

#[test]
fn cluster_delete_without_allow_delete_is_refused() {
    let c = cluster("c", 3, "true");
    let objects = objs(&[&[c.clone()], &cps(3)]);
    let a = delete(&objects, &c);
    a.assert_refused_by(&["cluster-allow-delete"]);
    a.assert_message_contains(
        "cluster-allow-delete",
        "deleting TalosCluster c tears the whole cluster down and needs the annotation ichor.maesh.dev/allow-delete: \"true\"",
    );
}

#[test]
fn cluster_delete_with_allow_delete_is_allowed() {
    let c = allowed(cluster("c", 3, "true"));
    let objects = objs(&[&[c.clone()], &cps(3)]);
    delete(&objects, &c).assert_allowed();
}

/// Deleting the TalosCluster (with the annotation) says it for the machines that follow.
#[test]
fn machines_of_a_deleting_cluster_follow_it_without_annotation() {
    let c = deleting(allowed(cluster("c", 3, "true")));
    let objects = objs(&[&[c], &cps(1)]);
    delete(&objects, &cp(1)).assert_allowed();
}

/// ADR 0010: "an explicit test has to show that the annotation alone does not let the last
/// control plane go" (TestAllowDeleteDoesNotOverrideQuorum).
#[test]
fn allow_delete_does_not_override_quorum() {
    // n = 1: the last control plane.
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(1)]);
    let a = delete(&objects, &allowed(cp(1)));
    assert!(!a.allowed());
    assert!(a.rules().contains(&"last-control-plane"), "{:?}", a.rules());
    assert!(!a.rules().contains(&"machine-allow-delete"));
    // n = 2: quorum.
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2)]);
    let a = delete(&objects, &allowed(cp(2)));
    a.assert_refused_by(&["quorum"]);
}

// ---------------------------------------------------------------------------------------
// ADR 0010: the quorum table, n = 1..5 (count 1 so the declared count stays out of it
// except where n - 1 = 0).
// ---------------------------------------------------------------------------------------

fn delete_one_of(n: u32) -> Admission {
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(n)]);
    delete(&objects, &allowed(cp(n)))
}

#[test]
fn quorum_n1_refused_last_control_plane() {
    let a = delete_one_of(1);
    // After 0 is also below the declared count of 1: every matching reason is reported.
    a.assert_refused_by(&["last-control-plane", "declared-count"]);
    a.assert_message_contains(
        "last-control-plane",
        "removing cp1 would leave no control plane (control planes 1 -> 0); delete the TalosCluster to tear the cluster down",
    );
    assert!(
        !a.rules().contains(&"quorum"),
        "n=1 is the last-control-plane rule"
    );
}

#[test]
fn quorum_n2_refused_quorum() {
    let a = delete_one_of(2);
    a.assert_refused_by(&["quorum"]);
    a.assert_message_contains(
        "quorum",
        "removing cp2: control planes 2 -> 1, below the etcd quorum of 2; approve a replacement control plane first",
    );
}

#[test]
fn quorum_n3_allowed() {
    delete_one_of(3).assert_allowed();
}

#[test]
fn quorum_n4_allowed() {
    delete_one_of(4).assert_allowed();
}

#[test]
fn quorum_n5_allowed() {
    delete_one_of(5).assert_allowed();
}

#[test]
fn quorum_table_holds_for_every_n() {
    for n in 1..=5u32 {
        let quorum = n / 2 + 1;
        let holds = n >= 2 && n > quorum; // n - 1 >= quorum
        assert_eq!(delete_one_of(n).allowed(), holds, "n = {n}");
    }
}

#[test]
fn sequential_deletes_three_then_two() {
    // 3 approved: deleting one is allowed.
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(3)]);
    delete(&objects, &allowed(cp(3))).assert_allowed();
    // cp3 is gone: with 2 left, deleting another is refused.
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2)]);
    let a = delete(&objects, &allowed(cp(2)));
    a.assert_refused_by(&["quorum"]);
    a.assert_message_contains("quorum", "control planes 2 -> 1");
}

#[test]
fn sequential_deletes_while_the_first_is_still_deleting() {
    // cp3's removal is still in progress (finalizer held): it does not count.
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2), &[deleting(cp(3))]]);
    let a = delete(&objects, &allowed(cp(2)));
    a.assert_refused_by(&["quorum"]);
    a.assert_message_contains("quorum", "control planes 2 -> 1");
}

#[test]
fn unapproved_control_plane_is_deletable() {
    let p = allowed(pending("p1", "controlplane"));
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(1), &[p.clone()]]);
    delete(&objects, &p).assert_allowed();
    // Even with no approved control plane at all.
    let objects = objs(&[&[cluster("c", 1, "true")], &[p.clone()]]);
    delete(&objects, &p).assert_allowed();
}

// ---------------------------------------------------------------------------------------
// ADR 0010 / 0106 §4: the declared count.
// ---------------------------------------------------------------------------------------

const DECLARED_3_TO_2: &str = "node remove: control planes 3 -> 2, below the declared count of 3; either approve a replacement control plane first (then remove this one), or lower spec.controlPlane.count first (to 1, 3 or 5) if you mean to shrink the cluster";

#[test]
fn declared_count_refuses_three_to_two_with_the_seed_text() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3)]);
    let a = delete(&objects, &allowed(cp(2)));
    a.assert_refused_by(&["declared-count"]);
    assert_eq!(a.message_of("declared-count"), DECLARED_3_TO_2);
    assert_eq!(a.message(), DECLARED_3_TO_2);
}

#[test]
fn declared_count_allows_replacement_three_four_three() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(4)]);
    let a = delete(&objects, &allowed(cp(1)));
    a.assert_allowed();
    a.assert_no_warnings();
}

#[test]
fn dead_member_at_admission_may_go_below_the_declared_count() {
    let dead = allowed(unreachable(cp(3)));
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(2), &[dead.clone()]]);
    let a = delete(&objects, &dead);
    a.assert_allowed();
    // ADR 0106 §4: the plan says so ("does not answer, so it is removed although that
    // leaves fewer control planes than the declared 3 ... Approve a replacement afterwards").
    a.assert_warns(
        "cp3 does not answer, so it is removed although that leaves fewer control planes than the declared 3",
    );
}

#[test]
fn dead_member_never_bends_quorum() {
    // Two control planes, one unreachable: still refused (ADR 0106 §4).
    let dead = allowed(unreachable(cp(2)));
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(1), &[dead.clone()]]);
    let a = delete(&objects, &dead);
    a.assert_refused_by(&["quorum"]);
    a.assert_message_contains(
        "quorum",
        "control planes 2 -> 1, below the etcd quorum of 2",
    );
    // Same with count 1.
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(1), &[dead.clone()]]);
    delete(&objects, &dead).assert_refused_by(&["quorum"]);
}

#[test]
fn dead_member_never_bends_last_control_plane() {
    let dead = allowed(unreachable(cp(1)));
    let objects = objs(&[&[cluster("c", 1, "true")], &[dead.clone()]]);
    let a = delete(&objects, &dead);
    a.assert_refused_by(&["last-control-plane"]);
}

#[test]
fn reachable_but_not_ready_is_not_dead() {
    let notready = with(allowed(cp(3)), |v| {
        v["status"] = json!({"conditions": [{
            "type": "Ready", "status": "False", "reason": "CurrentConfigUnavailable"}]});
    });
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(2), &[notready.clone()]]);
    delete(&objects, &notready).assert_refused_by(&["declared-count"]);
}

/// ADR 0054 addendum: "does not count another control plane that is already being deleted
/// toward the declared count".
#[test]
fn stuck_deleting_control_plane_is_not_counted() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3), &[deleting(cp(4))]]);
    let a = delete(&objects, &allowed(cp(1)));
    a.assert_refused_by(&["declared-count"]);
    assert_eq!(a.message_of("declared-count"), DECLARED_3_TO_2);
}

// ---------------------------------------------------------------------------------------
// ADR 0054: the approval cap.
// ---------------------------------------------------------------------------------------

fn approve(count: i64, approved: u32) -> Admission {
    let old = pending("new", "controlplane");
    let new = set_spec(
        set_spec(old.clone(), "approved", json!(true)),
        "approvalDecision",
        json!({"at": at(50)}),
    );
    let objects = objs(&[
        &[cluster("c", count, "true")],
        &cps(approved),
        &[old.clone()],
    ]);
    update(&objects, &old, &new)
}

#[test]
fn approval_cap_count1_one_to_two_ok() {
    let a = approve(1, 1);
    a.assert_allowed();
    // ADR 0054: approving at exactly `count` succeeds; the cluster then reads
    // Transitioning until a member is removed or count is raised.
    a.assert_warns("approving new makes 2 approved control planes for a declared count of 1");
}

#[test]
fn approval_cap_count1_two_to_three_refused() {
    let a = approve(1, 2);
    a.assert_refused_by(&["approval-cap"]);
    a.assert_message_contains(
        "approval-cap",
        "approving new would make 3 approved control planes, above spec.controlPlane.count + 1 = 2",
    );
}

#[test]
fn approval_cap_count3_three_to_four_ok() {
    let a = approve(3, 3);
    a.assert_allowed();
    a.assert_warns("approving new makes 4 approved control planes for a declared count of 3");
}

#[test]
fn approval_below_count_has_no_warning() {
    let a = approve(3, 2);
    a.assert_allowed();
    a.assert_no_warnings();
}

#[test]
fn approval_cap_count3_four_to_five_refused() {
    let a = approve(3, 4);
    a.assert_refused_by(&["approval-cap"]);
    a.assert_message_contains(
        "approval-cap",
        "would make 5 approved control planes, above spec.controlPlane.count + 1 = 4",
    );
}

#[test]
fn approval_cap_count5_five_to_six_ok_six_to_seven_refused() {
    approve(5, 5).assert_allowed();
    approve(5, 6).assert_refused_by(&["approval-cap"]);
}

#[test]
fn create_already_approved_counts_as_approve() {
    let new = machine("new", "controlplane", true, None);
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2)]);
    let a = create(&objects, &new);
    a.assert_refused_by(&["approval-cap"]);
    a.assert_message_contains("approval-cap", "would make 3 approved control planes");
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(1)]);
    create(&objects, &new).assert_allowed();
}

#[test]
fn create_pending_is_not_an_approval() {
    let new = pending("new", "controlplane");
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2)]);
    let a = create(&objects, &new);
    a.assert_allowed();
    assert_eq!(a.events, 0);
}

#[test]
fn role_change_into_controlplane_counts_as_approve() {
    let old = worker(1);
    let new = set_spec(old.clone(), "role", json!("controlplane"));
    let objects = objs(&[
        &[cluster("c", 1, "true")],
        &cps(2),
        &[old.clone(), worker(2)],
    ]);
    let a = update(&objects, &old, &new);
    a.assert_refused_by(&["approval-cap"]);
    a.assert_message_contains(
        "approval-cap",
        "approving w1 would make 3 approved control planes",
    );
    // Under the cap, the same change is allowed.
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(3),
        &[old.clone(), worker(2)],
    ]);
    update(&objects, &old, &new).assert_allowed();
}

#[test]
fn move_into_another_cluster_counts_as_approve() {
    // An approved control plane of cluster "d" (3 of them, count 1) moves into "c" (2 of
    // them, count 1): it lands as a third approved control plane of "c".
    let d: Vec<Value> = (1..=3)
        .map(|i| {
            in_cluster(
                machine(&format!("d{i}"), "controlplane", true, Some(&at(i))),
                "d",
            )
        })
        .collect();
    let old = d[2].clone();
    let new = in_cluster(old.clone(), "c");
    let objects = objs(&[
        &[cluster("c", 1, "true"), cluster("d", 1, "true")],
        &cps(2),
        &d,
    ]);
    let a = update(&objects, &old, &new);
    a.assert_refused_by(&["approval-cap"]);
    a.assert_message_contains(
        "approval-cap",
        "approving d3 would make 3 approved control planes",
    );
    // With room in "c", the move is allowed.
    let objects = objs(&[
        &[cluster("c", 3, "true"), cluster("d", 1, "true")],
        &cps(3),
        &d,
    ]);
    update(&objects, &old, &new).assert_allowed();
}

#[test]
fn ordinary_edit_of_an_approved_control_plane_produces_no_decision() {
    // Even over the cap (count 1, three approved): a label edit is not an approval.
    let old = cp(3);
    let new = labelled(old.clone());
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(3)]);
    let a = update(&objects, &old, &new);
    a.assert_allowed();
    assert_eq!(a.events, 0, "ordinary edits produce no decision rows");
    a.assert_no_warnings();
}

#[test]
fn approval_with_cluster_missing_is_let_through() {
    let old = pending("new", "controlplane");
    let new = set_spec(old.clone(), "approved", json!(true));
    let objects = objs(&[&cps(3), &[old.clone()]]);
    update(&objects, &old, &new).assert_allowed();
}

#[test]
fn approval_with_cluster_deleting_is_let_through() {
    let old = pending("new", "controlplane");
    let new = set_spec(old.clone(), "approved", json!(true));
    let objects = objs(&[
        &[deleting(cluster("c", 1, "true"))],
        &cps(3),
        &[old.clone()],
    ]);
    update(&objects, &old, &new).assert_allowed();
}

#[test]
fn approving_a_worker_is_never_capped() {
    let old = pending("w9", "worker");
    let new = set_spec(old.clone(), "approved", json!(true));
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2), &[old.clone()]]);
    update(&objects, &old, &new).assert_allowed();
}

// ---------------------------------------------------------------------------------------
// ADR 0054: schedulable "false" needs a worker.
// ---------------------------------------------------------------------------------------

#[test]
fn unschedulable_transition_without_worker_refused() {
    let old = cluster("c", 3, "true");
    let new = cluster("c", 3, "false");
    let objects = objs(&[&[old.clone()], &cps(3)]);
    let a = update(&objects, &old, &new);
    a.assert_refused_by(&["unschedulable-needs-worker"]);
    a.assert_message_contains(
        "unschedulable-needs-worker",
        "setting spec.schedulable to \"false\" on TalosCluster c would leave no node for workloads: it has no approved worker; approve a worker first",
    );
}

#[test]
fn unschedulable_transition_pending_worker_does_not_count() {
    let old = cluster("c", 3, "true");
    let new = cluster("c", 3, "false");
    let objects = objs(&[&[old.clone()], &cps(3), &[pending("w1", "worker")]]);
    update(&objects, &old, &new).assert_refused_by(&["unschedulable-needs-worker"]);
}

#[test]
fn unschedulable_transition_with_worker_allowed() {
    let old = cluster("c", 3, "true");
    let new = cluster("c", 3, "false");
    let objects = objs(&[&[old.clone()], &cps(3), &[worker(1)]]);
    update(&objects, &old, &new).assert_allowed();
}

#[test]
fn already_unschedulable_cluster_edit_allowed() {
    let old = cluster("c", 3, "false");
    let new = labelled(old.clone());
    let objects = objs(&[&[old.clone()], &cps(3)]);
    let a = update(&objects, &old, &new);
    a.assert_allowed();
    assert_eq!(a.events, 0);
}

#[test]
fn cluster_created_unschedulable_allowed() {
    let new = cluster("c", 3, "false");
    create(&[], &new).assert_allowed();
}

// ---------------------------------------------------------------------------------------
// ADR 0054: the last approved worker of an unschedulable cluster.
// ---------------------------------------------------------------------------------------

fn unschedulable_with(workers: &[Value]) -> Vec<Value> {
    objs(&[&[cluster("c", 3, "false")], &cps(3), workers])
}

const LAST_WORKER: &str = "w1 is the last approved worker of TalosCluster c, which is unschedulable (spec.schedulable \"false\"); approve another worker first, or set spec.schedulable to \"true\"";

#[test]
fn last_worker_delete_refused() {
    let objects = unschedulable_with(&[worker(1)]);
    let a = delete(&objects, &allowed(worker(1)));
    a.assert_refused_by(&["last-worker"]);
    assert_eq!(a.message_of("last-worker"), LAST_WORKER);
}

#[test]
fn last_worker_unapprove_refused() {
    let old = worker(1);
    let new = set_spec(old.clone(), "approved", json!(false));
    let objects = unschedulable_with(&[old.clone()]);
    update(&objects, &old, &new).assert_refused_by(&["last-worker"]);
}

#[test]
fn last_worker_rerole_refused() {
    let old = worker(1);
    let new = set_spec(old.clone(), "role", json!("controlplane"));
    let objects = unschedulable_with(&[old.clone()]);
    // 3 control planes, count 3: the approval side is within the cap.
    update(&objects, &old, &new).assert_refused_by(&["last-worker"]);
}

#[test]
fn last_worker_move_refused() {
    let old = worker(1);
    let new = in_cluster(old.clone(), "d");
    let objects = objs(&[
        &unschedulable_with(&[old.clone()]),
        &[cluster("d", 1, "true")],
    ]);
    update(&objects, &old, &new).assert_refused_by(&["last-worker"]);
}

#[test]
fn last_worker_skipped_while_cluster_deleting() {
    let objects = objs(&[&[deleting(cluster("c", 3, "false"))], &cps(3), &[worker(1)]]);
    delete(&objects, &allowed(worker(1))).assert_allowed();
    let old = worker(1);
    let new = set_spec(old.clone(), "approved", json!(false));
    update(&objects, &old, &new).assert_allowed();
}

#[test]
fn last_worker_allowed_when_schedulable() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3), &[worker(1)]]);
    delete(&objects, &allowed(worker(1))).assert_allowed();
}

#[test]
fn last_worker_allowed_when_another_worker_exists() {
    let objects = unschedulable_with(&[worker(1), worker(2)]);
    delete(&objects, &allowed(worker(1))).assert_allowed();
}

#[test]
fn last_worker_pending_worker_not_counted() {
    let objects = unschedulable_with(&[worker(1), pending("w2", "worker")]);
    delete(&objects, &allowed(worker(1))).assert_refused_by(&["last-worker"]);
}

#[test]
fn last_worker_deleting_sibling_not_counted() {
    let objects = unschedulable_with(&[worker(1), deleting(worker(2))]);
    delete(&objects, &allowed(worker(1))).assert_refused_by(&["last-worker"]);
}

#[test]
fn last_worker_has_no_controller_twin() {
    let objects = unschedulable_with(&[deleting(worker(1))]);
    reconcile(&objects, "w1").assert_proceed();
}

// ---------------------------------------------------------------------------------------
// ADR 0137: operations.
// ---------------------------------------------------------------------------------------

#[test]
fn operation_start_refused_while_even() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(4)]);
    let a = create(&objects, &operation("up1", "upgrade", None, None));
    a.assert_refused_by(&["operation-while-transitioning"]);
    a.assert_message_contains(
        "operation-while-transitioning",
        "the cluster has an even number of approved control planes (4): the upgrade operation would run without a majority margin, so it would wait. Remove a control plane (to go back down) or approve another one (to go up), then run this again",
    );
}

#[test]
fn operation_start_while_even_exempts_etcd_restore() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(4)]);
    create(&objects, &operation("r1", "etcd-restore", None, None)).assert_allowed();
}

#[test]
fn operation_start_allowed_while_odd() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3)]);
    create(&objects, &operation("up1", "upgrade", None, None)).assert_allowed();
    create(&objects, &operation("rb1", "reboot", None, None)).assert_allowed();
}

fn start_next_with(other: Value) -> Admission {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3), &[other]]);
    create(&objects, &operation("next", "reboot", None, None))
}

#[test]
fn another_running_operation_refuses_a_new_one() {
    let a = start_next_with(operation("up1", "upgrade", Some("Running"), None));
    a.assert_refused_by(&["another-operation-unfinished"]);
    a.assert_message_contains(
        "another-operation-unfinished",
        "operation up1 (upgrade) is not finished (phase Running); resume it, or delete it, then run this again",
    );
}

#[test]
fn another_failed_operation_refuses_a_new_one() {
    let a = start_next_with(failure(
        operation("up1", "upgrade", Some("Failed"), None),
        "node cp2 did not come back",
    ));
    a.assert_refused_by(&["another-operation-unfinished"]);
    a.assert_message_contains(
        "another-operation-unfinished",
        "is not finished (phase Failed)",
    );
}

#[test]
fn another_operation_paused_by_operator_refuses_a_new_one() {
    let a = start_next_with(paused(operation("up1", "upgrade", None, None), "Operator"));
    a.assert_refused_by(&["another-operation-unfinished"]);
    a.assert_message_contains(
        "another-operation-unfinished",
        "is not finished (phase Paused)",
    );
}

#[test]
fn a_pending_operation_is_unfinished_too() {
    let a = start_next_with(operation("up1", "upgrade", None, None));
    a.assert_refused_by(&["another-operation-unfinished"]);
    a.assert_message_contains("another-operation-unfinished", "is not finished (phase");
}

#[test]
fn a_finished_operation_does_not_refuse_a_new_one() {
    start_next_with(operation("up1", "upgrade", Some("Succeeded"), None)).assert_allowed();
}

#[test]
fn an_operation_of_another_cluster_does_not_refuse() {
    start_next_with(in_cluster(
        operation("up1", "upgrade", Some("Running"), None),
        "d",
    ))
    .assert_allowed();
}

const PARKED_TEXT: &str = "waits for the control-plane count to be odd again; it resumes by itself then. Remove or approve a control plane to end the replacement";

#[test]
fn a_parked_operation_refuses_a_new_one_honestly() {
    let a = start_next_with(parked(operation("up1", "ichor", None, None)));
    a.assert_refused_by(&["another-operation-parked"]);
    a.assert_message_contains(
        "another-operation-parked",
        &format!("operation up1 (ichor) {PARKED_TEXT}"),
    );
    assert!(!a.message().contains("is not finished"), "{}", a.message());
}

#[test]
fn a_parked_operation_while_even_reports_both_reasons() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[parked(operation("up1", "ichor", None, None))],
    ]);
    let a = create(&objects, &operation("next", "upgrade", None, None));
    a.assert_refused_by(&["operation-while-transitioning", "another-operation-parked"]);
    a.assert_message_contains("another-operation-parked", PARKED_TEXT);
}

#[test]
fn a_parked_operation_that_failed_is_not_parked() {
    let a = start_next_with(failure(
        parked(operation("up1", "upgrade", None, None)),
        "boom",
    ));
    a.assert_refused_by(&["another-operation-unfinished"]);
    a.assert_message_contains(
        "another-operation-unfinished",
        "is not finished (phase Paused)",
    );
}

#[test]
fn a_parked_operation_does_not_block_removing_a_control_plane() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[parked(operation("ichor-2jfbw", "ichor", None, None))],
    ]);
    delete(&objects, &allowed(cp(4))).assert_allowed();
}

#[test]
fn a_running_operation_blocks_removing_a_control_plane() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[operation("up1", "upgrade", Some("Running"), None)],
    ]);
    let a = delete(&objects, &allowed(cp(4)));
    a.assert_refused_by(&["unfinished-operation-blocks-removal"]);
    a.assert_message_contains(
        "unfinished-operation-blocks-removal",
        "operation up1 (upgrade) is not finished (phase Running); resume it, or delete it, then remove cp4",
    );
}

#[test]
fn an_operator_paused_operation_blocks_removing_a_control_plane() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[paused(operation("up1", "upgrade", None, None), "Operator")],
    ]);
    let a = delete(&objects, &allowed(cp(4)));
    a.assert_refused_by(&["unfinished-operation-blocks-removal"]);
    a.assert_message_contains("unfinished-operation-blocks-removal", "(phase Paused)");
}

#[test]
fn an_unfinished_operation_does_not_block_removing_a_worker() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(3),
        &[worker(1), worker(2)],
        &[operation("up1", "upgrade", Some("Running"), None)],
    ]);
    delete(&objects, &allowed(worker(1))).assert_allowed();
}

#[test]
fn reset_of_a_control_plane_while_even_refused() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(4)]);
    let a = create(&objects, &operation("rs1", "reset", None, Some("cp2")));
    a.assert_refused_by(&["reset-control-plane-while-transitioning"]);
    a.assert_message_contains(
        "reset-control-plane-while-transitioning",
        "the cluster has an even number of approved control planes (4), so a reset of control plane cp2 would be parked. Remove the node instead, which ends it",
    );
}

#[test]
fn reset_of_a_worker_while_even_gets_the_general_refusal() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(4), &[worker(1)]]);
    let a = create(&objects, &operation("rs1", "reset", None, Some("w1")));
    a.assert_refused_by(&["operation-while-transitioning"]);
}

#[test]
fn reset_of_a_control_plane_while_odd_and_above_the_count_allowed() {
    // count 1, three approved: 3 -> 2 keeps quorum and the declared count.
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(3)]);
    create(&objects, &operation("rs1", "reset", None, Some("cp2"))).assert_allowed();
}

/// ADR 0106 §4: "`node reset` keeps the count check, because a reset needs the node".
#[test]
fn reset_of_a_control_plane_below_the_declared_count_refused() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3)]);
    let a = create(&objects, &operation("rs1", "reset", None, Some("cp2")));
    a.assert_refused_by(&["reset-below-count"]);
    a.assert_message_contains(
        "reset-below-count",
        "node reset: control planes 3 -> 2, below the declared count of 3; either approve a replacement control plane first (then reset this one)",
    );
}

/// The dead-member exception bends the removal's count check, not a reset's: a reset
/// needs the node.
#[test]
fn reset_of_an_unreachable_control_plane_keeps_the_count_check() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &[cp(1), cp(2), unreachable(cp(3))],
    ]);
    create(&objects, &operation("rs1", "reset", None, Some("cp3")))
        .assert_refused_by(&["reset-below-count"]);
}

#[test]
fn reset_of_the_last_control_plane_refused() {
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(1)]);
    let a = create(&objects, &operation("rs1", "reset", None, Some("cp1")));
    a.assert_refused_by(&["reset-below-count", "reset-last-control-plane"]);
    a.assert_message_contains(
        "reset-last-control-plane",
        "resetting control plane cp1 would leave no control plane (control planes 1 -> 0)",
    );
    // Two control planes: quorum (count 1, so the declared count allows 2 -> 1).
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2)]);
    let a = create(&objects, &operation("rs1", "reset", None, Some("cp1")));
    a.assert_refused_by(&["reset-control-plane-while-transitioning", "reset-quorum"]);
    a.assert_message_contains(
        "reset-quorum",
        "resetting control plane cp1: control planes 2 -> 1, below the etcd quorum of 2",
    );
}

/// ADR 0106 §4: the dead-member warning speaks of a removal that goes ahead; quorum and
/// the last control plane never bend, so it is not given with their refusals.
#[test]
fn no_dead_member_warning_when_quorum_refuses() {
    let objects = objs(&[&[cluster("c", 3, "true")], &[cp(1), unreachable(cp(2))]]);
    let a = delete(&objects, &allowed(unreachable(cp(2))));
    a.assert_refused_by(&["quorum"]);
    assert!(a.warnings().is_empty(), "{:?}", a.warnings());
}

/// A failed operation is one with a failureReason or phase Failed: never parked.
#[test]
fn run_operation_in_phase_failed_is_not_parked() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[operation("up1", "upgrade", Some("Failed"), None)],
    ]);
    reconcile(&objects, "up1").assert_proceed();
}

#[test]
fn reset_of_a_pending_control_plane_is_not_a_control_plane_reset() {
    // count 3, three approved and a pending control plane: resetting the pending one
    // takes no member away.
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(3),
        &[pending("p1", "controlplane")],
    ]);
    create(&objects, &operation("rs1", "reset", None, Some("p1"))).assert_allowed();
}

/// ADR 0137 §4: "Remove the node instead, which ends it" holds only for a machine whose
/// removal ends the even count: an approved control plane of this cluster.
#[test]
fn reset_of_a_pending_or_foreign_control_plane_while_even_gets_the_general_refusal() {
    let objects = objs(&[
        &[cluster("c", 3, "true"), cluster("d", 3, "true")],
        &cps(4),
        &[pending("p1", "controlplane"), in_cluster(cp(9), "d")],
    ]);
    for target in ["p1", "cp9"] {
        let a = create(&objects, &operation("rs1", "reset", None, Some(target)));
        a.assert_refused_by(&["operation-while-transitioning"]);
    }
}

// ---------------------------------------------------------------------------------------
// ADR 0054: the controller-side hold of the newest surplus approvals.
// ---------------------------------------------------------------------------------------

#[test]
fn over_cap_holds_the_newest_surplus_approval() {
    // count 1, three approved: the first count+1 = 2 proceed, the newest is held.
    let objects = objs(&[&[cluster("c", 1, "true")], &[cp(3), cp(1), cp(2)]]);
    let r = reconcile(&objects, "cp3");
    r.assert("hold", Some("ControlPlaneOverCap"), &["over-cap"]);
    assert!(
        r.message().contains(
            "cp3 is approved control plane number 3, past the cap of spec.controlPlane.count + 1 = 2; it is held"
        ),
        "{}",
        r.message()
    );
    reconcile(&objects, "cp1").assert_proceed();
    reconcile(&objects, "cp2").assert_proceed();
}

#[test]
fn over_cap_order_is_decision_time_not_name() {
    // "a" was approved last: it is the one held, although its name sorts first.
    let late = machine("a", "controlplane", true, Some(&at(30)));
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2), &[late]]);
    reconcile(&objects, "a").assert("hold", Some("ControlPlaneOverCap"), &["over-cap"]);
    reconcile(&objects, "cp1").assert_proceed();
    reconcile(&objects, "cp2").assert_proceed();
}

#[test]
fn over_cap_ties_broken_by_name() {
    let same = |n: &str| machine(n, "controlplane", true, Some(&at(7)));
    let objects = objs(&[
        &[cluster("c", 1, "true")],
        &[same("m-c"), same("m-a"), same("m-b")],
    ]);
    reconcile(&objects, "m-c").assert("hold", Some("ControlPlaneOverCap"), &["over-cap"]);
    reconcile(&objects, "m-a").assert_proceed();
    reconcile(&objects, "m-b").assert_proceed();
}

#[test]
fn over_cap_falls_back_to_creation_time() {
    // No decision times (created already approved by a GitOps apply): creation time orders.
    let m =
        |n: &str, t: &str| created_at(without_decision(machine(n, "controlplane", true, None)), t);
    let objects = objs(&[
        &[cluster("c", 1, "true")],
        &[
            m("z-old", "2026-09-01T00:00:00Z"),
            m("a-new", "2026-09-03T00:00:00Z"),
            m("m-mid", "2026-09-02T00:00:00Z"),
        ],
    ]);
    reconcile(&objects, "a-new").assert("hold", Some("ControlPlaneOverCap"), &["over-cap"]);
    reconcile(&objects, "z-old").assert_proceed();
    reconcile(&objects, "m-mid").assert_proceed();
}

#[test]
fn over_cap_mixes_decision_and_creation_time() {
    // cp-x has no decision time but was created before cp2's decision.
    let x = created_at(
        without_decision(machine("cp-x", "controlplane", true, None)),
        "2026-10-01T00:01:30Z",
    );
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2), &[x]]);
    reconcile(&objects, "cp2").assert("hold", Some("ControlPlaneOverCap"), &["over-cap"]);
    reconcile(&objects, "cp-x").assert_proceed();
}

#[test]
fn over_cap_count3_holds_only_past_four() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(6)]);
    for i in 1..=4 {
        reconcile(&objects, &format!("cp{i}")).assert_proceed();
    }
    reconcile(&objects, "cp5").assert("hold", Some("ControlPlaneOverCap"), &["over-cap"]);
    reconcile(&objects, "cp6").assert("hold", Some("ControlPlaneOverCap"), &["over-cap"]);
}

#[test]
fn over_cap_not_held_without_cluster() {
    let objects = cps(3);
    reconcile(&objects, "cp3").assert_proceed();
}

#[test]
fn pending_machine_is_not_reconciled_into_a_decision() {
    let objects = objs(&[
        &[cluster("c", 1, "true")],
        &cps(2),
        &[pending("p", "controlplane")],
    ]);
    let r = reconcile(&objects, "p");
    r.assert_proceed();
    assert!(r.decision.holds.is_empty() && r.decision.refusals.is_empty());
}

// ---------------------------------------------------------------------------------------
// ADR 0010 / 0106 §4: the controller's removal.
// ---------------------------------------------------------------------------------------

#[test]
fn controller_removal_refused_below_declared_count() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(2), &[deleting(cp(3))]]);
    let r = reconcile(&objects, "cp3");
    r.assert("refuse", Some("RemovalRefused"), &["declared-count"]);
    assert_eq!(r.message(), DECLARED_3_TO_2);
}

#[test]
fn controller_removal_allowed_at_count_plus_one() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3), &[deleting(cp(4))]]);
    reconcile(&objects, "cp4").assert_proceed();
}

#[test]
fn controller_removal_dead_member_marker_goes_below_count() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(2),
        &[dead_member_removal(deleting(cp(3)))],
    ]);
    reconcile(&objects, "cp3").assert_proceed();
}

#[test]
fn controller_removal_node_unreachable_goes_below_count() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(2),
        &[unreachable(deleting(cp(3)))],
    ]);
    reconcile(&objects, "cp3").assert_proceed();
}

#[test]
fn controller_removal_dead_member_never_bends_quorum() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(1),
        &[dead_member_removal(deleting(cp(2)))],
    ]);
    let r = reconcile(&objects, "cp2");
    r.assert("refuse", Some("RemovalRefused"), &["quorum"]);
    assert!(
        r.message()
            .contains("control planes 2 -> 1, below the etcd quorum of 2")
    );
    let objects = objs(&[
        &[cluster("c", 1, "true")],
        &cps(1),
        &[unreachable(deleting(cp(2)))],
    ]);
    reconcile(&objects, "cp2").assert("refuse", Some("RemovalRefused"), &["quorum"]);
}

#[test]
fn controller_removal_never_takes_the_last_control_plane() {
    let objects = objs(&[&[cluster("c", 1, "true")], &[unreachable(deleting(cp(1)))]]);
    let r = reconcile(&objects, "cp1");
    assert_eq!(r.verdict(), "refuse");
    assert!(r.rules().contains(&"last-control-plane"), "{:?}", r.rules());
    assert_eq!(r.reason(), Some("RemovalRefused"));
}

#[test]
fn controller_removal_does_not_count_other_deleting_control_planes() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(3),
        &[deleting(cp(4)), deleting(cp(5))],
    ]);
    // cp4 counts itself and the three others: 4 -> 3, fine.
    reconcile(&objects, "cp4").assert_proceed();
}

/// ADR 0010 counts the machines: a missing TalosCluster bends neither quorum nor the last
/// control plane (only deleting the TalosCluster does).
#[test]
fn quorum_and_last_control_plane_hold_without_a_cluster() {
    let two = objs(&[&cps(2)]);
    delete(&two, &allowed(cp(2))).assert_refused_by(&["quorum"]);
    let one = objs(&[&cps(1)]);
    delete(&one, &allowed(cp(1))).assert_refused_by(&["last-control-plane"]);
    // 3 -> 2 keeps quorum; with no cluster there is no declared count to keep.
    let three = objs(&[&cps(3)]);
    delete(&three, &allowed(cp(3))).assert_allowed();
    let controller = objs(&[&[cp(1)], &[deleting(cp(2))]]);
    reconcile(&controller, "cp2").assert("refuse", Some("RemovalRefused"), &["quorum"]);
}

#[test]
fn last_control_plane_follows_a_deleting_cluster() {
    let c = deleting(allowed(cluster("c", 3, "true")));
    let objects = objs(&[&[c], &cps(1)]);
    delete(&objects, &allowed(cp(1))).assert_allowed();
}

#[test]
fn controller_removal_teardown_proceeds() {
    let objects = objs(&[&[deleting(cluster("c", 3, "true"))], &[deleting(cp(1))]]);
    reconcile(&objects, "cp1").assert_proceed();
}

// ---------------------------------------------------------------------------------------
// ADR 0137: the controller parks an operation while even.
// ---------------------------------------------------------------------------------------

#[test]
fn run_operation_parked_while_even() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[operation("up1", "upgrade", Some("Running"), None)],
    ]);
    let r = reconcile(&objects, "up1");
    r.assert(
        "hold",
        Some("ClusterTransitioning"),
        &["parked-for-transition"],
    );
    assert!(
        r.message().contains(
            "operation up1 waits for the control-plane count to be odd again (4 approved control planes); it resumes by itself then. Remove or approve a control plane to end the replacement"
        ),
        "{}",
        r.message()
    );
}

#[test]
fn run_operation_parked_stays_parked_while_even() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[parked(operation("up1", "upgrade", None, None))],
    ]);
    reconcile(&objects, "up1").assert(
        "hold",
        Some("ClusterTransitioning"),
        &["parked-for-transition"],
    );
}

/// ADR 0137 §3: "the other pause reasons (operator, lock held, shutdown, failure) are
/// untouched": a failed operation is not parked (it would resume by itself later).
#[test]
fn run_failed_operation_is_not_parked() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[failure(
            operation("up1", "upgrade", Some("Failed"), None),
            "boom",
        )],
    ]);
    reconcile(&objects, "up1").assert_proceed();
}

#[test]
fn run_operator_paused_operation_is_left_paused() {
    for reason in ["Operator", "ClusterLockHeld"] {
        let objects = objs(&[
            &[cluster("c", 3, "true")],
            &cps(4),
            &[paused(operation("up1", "upgrade", None, None), reason)],
        ]);
        reconcile(&objects, "up1").assert_proceed();
    }
}

#[test]
fn run_operation_resumes_once_odd() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(3),
        &[parked(operation("up1", "upgrade", None, None))],
    ]);
    reconcile(&objects, "up1").assert_proceed();
}

#[test]
fn run_etcd_restore_not_parked_while_even() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[operation("r1", "etcd-restore", Some("Running"), None)],
    ]);
    reconcile(&objects, "r1").assert_proceed();
}

#[test]
fn finished_operation_is_not_reconciled_into_a_hold() {
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(4),
        &[operation("up1", "upgrade", Some("Succeeded"), None)],
    ]);
    reconcile(&objects, "up1").assert_proceed();
}

// ---------------------------------------------------------------------------------------
// Refusals override, and every matching reason is reported.
// ---------------------------------------------------------------------------------------

#[test]
fn every_matching_refusal_is_reported() {
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(1)]);
    let a = delete(&objects, &cp(1));
    a.assert_refused_by(&[
        "machine-allow-delete",
        "last-control-plane",
        "declared-count",
    ]);
    let message = a.message();
    assert!(
        message.contains("needs the annotation ichor.maesh.dev/allow-delete"),
        "{message}"
    );
    assert!(
        message.contains("would leave no control plane"),
        "{message}"
    );
    assert_eq!(
        message.lines().count(),
        3,
        "one line per refusal: {message}"
    );
}

#[test]
fn every_matching_refusal_is_reported_for_quorum_and_count() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(2)]);
    let a = delete(&objects, &cp(2));
    a.assert_refused_by(&["machine-allow-delete", "quorum", "declared-count"]);
    a.assert_message_contains(
        "declared-count",
        "control planes 2 -> 1, below the declared count of 3",
    );
}

#[test]
fn response_envelope_for_a_refusal() {
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3)]);
    let a = delete(&objects, &allowed(cp(1)));
    let r = &a.response;
    assert_eq!(r["apiVersion"], json!("admission.k8s.io/v1"));
    assert_eq!(r["kind"], json!("AdmissionReview"));
    assert_eq!(r["response"]["allowed"], json!(false));
    assert_eq!(r["response"]["status"]["code"], json!(403));
    assert_eq!(r["response"]["status"]["message"], json!(DECLARED_3_TO_2));
}

// ---------------------------------------------------------------------------------------
// Further seed sentences.
// ---------------------------------------------------------------------------------------

/// ADR 0054: "Lowering count below the live total is not blocked (that is how a shrink
/// starts)".
#[test]
fn lowering_count_below_the_live_total_is_not_blocked() {
    let old = cluster("c", 3, "true");
    let new = cluster("c", 1, "true");
    let objects = objs(&[&[old.clone()], &cps(3)]);
    let a = update(&objects, &old, &new);
    a.assert_allowed();
    assert_eq!(a.events, 0);
}

/// ADR 0054: the hold does not block the ordinary guarded removal of a surplus control
/// plane.
#[test]
fn a_held_surplus_control_plane_can_be_deleted() {
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(3)]);
    delete(&objects, &allowed(cp(3))).assert_allowed();
}

/// ADR 0137 §2: "Approving or rejecting a machine reads no operation and was never blocked
/// by one."
#[test]
fn approving_is_never_blocked_by_an_operation() {
    let old = pending("new", "controlplane");
    let new = set_spec(old.clone(), "approved", json!(true));
    let objects = objs(&[
        &[cluster("c", 3, "true")],
        &cps(3),
        &[
            old.clone(),
            operation("up1", "upgrade", Some("Running"), None),
        ],
    ]);
    update(&objects, &old, &new).assert_allowed();
}

/// ADR 0054: the live total stays in [count, count+1]; un-approving a control plane takes
/// a member away just as a delete does.
#[test]
fn unapproving_a_control_plane_below_the_declared_count_is_refused() {
    let old = cp(3);
    let new = set_spec(old.clone(), "approved", json!(false));
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(3)]);
    let a = update(&objects, &old, &new);
    a.assert_refused_by(&["declared-count-leave"]);
    a.assert_message_contains(
        "declared-count-leave",
        "cp3 leaving the control plane: control planes 3 -> 2, below the declared count of 3",
    );
    let objects = objs(&[&[cluster("c", 3, "true")], &cps(4)]);
    update(&objects, &old, &new).assert_allowed();
}

/// ADR 0010: quorum is about membership, whichever way a member leaves.
#[test]
fn unapproving_one_of_two_control_planes_breaks_quorum() {
    let old = cp(2);
    let new = set_spec(old.clone(), "approved", json!(false));
    let objects = objs(&[&[cluster("c", 1, "true")], &cps(2)]);
    update(&objects, &old, &new).assert_refused_by(&["quorum"]);
}
