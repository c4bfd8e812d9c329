//! ADR 0106 §1 end to end: a TalosConfigPatch written is dry-rendered by the webhook (real
//! AdmissionReview v1 over HTTPS, live reads of the in-process API server) against the
//! redacted base in the TalosCluster's status, and refused by the rule
//! `patch-breaks-render` when it breaks a machine's render that did not fail without it.

use crate::support::apiserver::ApiServer;
use crate::support::https;
use crate::support::objects::{self, NAMESPACE};
use hyper::body::Bytes;
use ichor_rules::runtime::live::LiveReader;
use ichor_rules::runtime::metrics::Metrics;
use ichor_rules::runtime::reload::{Reload, Rules};
use ichor_rules::runtime::render::Base;
use ichor_rules::runtime::tls::ReloadingCert;
use ichor_rules::runtime::webhook::{Webhook, router, serve_tls};
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const CP: &str = include_str!("fixtures/talos/controlplane.yaml");
const WORKER: &str = include_str!("fixtures/talos/worker.yaml");
pub(crate) const SEED_ERROR: &str =
    "kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)";

pub(crate) struct Harness {
    pub(crate) api: ApiServer,
    addr: SocketAddr,
    ca: CertificateDer<'static>,
    dir: PathBuf,
}

async fn harness(name: &str) -> Harness {
    harness_on(ApiServer::start().await, name).await
}

/// The webhook over HTTPS, reading `api` live.
pub(crate) async fn harness_on(api: ApiServer, name: &str) -> Harness {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("config-admission-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    let ca = https::write_cert(&dir);
    for e in std::fs::read_dir("rules").unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "rules") {
            std::fs::copy(&p, dir.join("rules").join(p.file_name().unwrap())).unwrap();
        }
    }
    let rules = Arc::new(Rules::new(vec![dir.join("rules")]));
    assert!(matches!(rules.reload(), Reload::Replaced { .. }));
    let cert = Arc::new(ReloadingCert::new(dir.join("tls.crt"), dir.join("tls.key")).unwrap());
    let tls = Arc::new(cert.server_config().unwrap());
    let state = Arc::new(Webhook {
        rules,
        reader: LiveReader::new(api.client(), Duration::from_secs(5)),
        metrics: Arc::new(Metrics::default()),
        api_ready: Default::default(),
        controller_username: None,
        records: None,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_tls(
        listener,
        tls,
        router(state),
        std::future::pending(),
    ));
    Harness { api, addr, ca, dir }
}

pub(crate) async fn review(
    h: &Harness,
    operation: &str,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Value {
    let body = objects::review("uid-1", operation, old, new).build();
    let (mut send, _) = https::connect(h.addr, &h.ca).await;
    let (status, bytes) = https::request(
        &mut send,
        "POST",
        "/validate/talosconfigpatches",
        "application/json",
        Bytes::from(serde_json::to_vec(&body).unwrap()),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    let response = v["response"].clone();
    // `eval` decides the same review from the same objects (an objects file holding the
    // API server's TalosClusters, TalosMachines and TalosConfigPatches) as the webhook did
    // from its live reads: one implementation of the dry render.
    let offline = eval_offline(h, &body);
    assert_eq!(
        offline["allowed"], response["allowed"],
        "eval: {offline}\nwebhook: {response}"
    );
    assert_eq!(
        offline["status"]["message"], response["status"]["message"],
        "eval: {offline}\nwebhook: {response}"
    );
    response
}

/// `ichor-rules eval --objects F --review R` on the API server's objects: its response.
fn eval_offline(h: &Harness, body: &Value) -> Value {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let docs: Vec<String> = ["TalosCluster", "TalosMachine", "TalosConfigPatch"]
        .iter()
        .flat_map(|k| h.api.objects(k, None))
        .map(|o| serde_json::to_string(&o).unwrap())
        .collect();
    let objects = h.dir.join(format!("objects-{n}.yaml"));
    std::fs::write(&objects, docs.join("\n---\n")).unwrap();
    let review = h.dir.join(format!("review-{n}.json"));
    std::fs::write(&review, serde_json::to_vec(body).unwrap()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .arg("eval")
        .arg("--rules")
        .arg(h.dir.join("rules"))
        .arg("--objects")
        .arg(&objects)
        .arg("--review")
        .arg(&review)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "eval did not answer a review ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v["response"].clone()
}

/// The cluster `prod` with the redacted base the controller publishes (`published`).
fn cluster(published: bool) -> Value {
    let mut c = objects::cluster("prod", 3).schedulable("true").build();
    if published {
        let base = Base::parse(CP, WORKER, true).unwrap();
        let (cp, w) = base.redacted().texts().unwrap();
        c["status"] =
            json!({"redactedBase": {"digest": base.digest, "controlplane": cp, "worker": w}});
    }
    c
}

async fn machines(h: &Harness) {
    for (name, role, approved) in [
        ("cp-1", "controlplane", true),
        ("cp-2", "controlplane", true),
        ("cp-3", "controlplane", true),
        ("w-1", "worker", true),
        ("w-2", "worker", false),
    ] {
        h.api
            .insert(objects::machine(name).role(role).approved(approved).build());
    }
}

pub(crate) fn patch(name: &str, selector: Value, strategic: &str) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosConfigPatch",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "clusterRef": {"name": "prod"},
            "selector": selector,
            "patches": {"strategic": strategic}
        }
    })
}

pub(crate) const API_SERVER_PATCH: &str =
    "version: v1alpha1\ncluster:\n  apiServer:\n    extraArgs:\n      feature-gates: Foo=true\n";
pub(crate) const UNRELATED: &str =
    "version: v1alpha1\nmachine:\n  sysctls:\n    vm.max_map_count: \"262144\"\n";

pub(crate) fn message(r: &Value) -> String {
    r["status"]["message"].as_str().unwrap_or("").to_string()
}

/// The seed's case: refused, with Talos' words, the machine and the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_case_is_refused_with_the_render_error_and_the_machine() {
    let h = harness("seed").await;
    h.api.insert(cluster(true));
    machines(&h).await;
    let p = patch("api", json!({"role": "controlplane"}), API_SERVER_PATCH);
    let r = review(&h, "CREATE", None, Some(&p)).await;
    assert_eq!(r["allowed"], false, "{r}");
    let m = message(&r);
    assert!(m.contains(SEED_ERROR), "{m}");
    assert!(m.contains("cp-1: "), "names the first machine: {m}");
    assert!(m.contains("3 approved machine(s)"), "{m}");
    assert!(m.contains("TalosConfigPatch api"), "{m}");
    // No secret of the base in the answer; no Secret read by the webhook.
    assert!(!m.contains("SECRET-BASE"));
    let log = h.api.store.faults.take_log();
    assert!(!log.is_empty());
    assert!(
        log.iter().all(|r| !r.path.contains("/secrets")),
        "the webhook read a Secret: {:?}",
        log.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    // Selecting the workers only (whose base has no KubeAPIServerConfig): allowed.
    let w = patch("api", json!({"role": "worker"}), API_SERVER_PATCH);
    let r = review(&h, "CREATE", None, Some(&w)).await;
    assert_eq!(r["allowed"], true, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrelated_patch_and_unchecked_cases_are_allowed() {
    let h = harness("allowed").await;
    h.api.insert(cluster(true));
    machines(&h).await;
    let ok = patch("sysctl", json!({}), UNRELATED);
    assert_eq!(review(&h, "CREATE", None, Some(&ok)).await["allowed"], true);
    // Delete is not checked.
    let bad = patch("api", json!({}), API_SERVER_PATCH);
    assert_eq!(
        review(&h, "DELETE", Some(&bad), None).await["allowed"],
        true
    );
    // A patch selecting only an unapproved machine renders nothing.
    let pending = patch(
        "api",
        json!({"machines": ["w-2"]}),
        "version: v1alpha1\nmachine:\n  type: controlplane\n",
    );
    assert_eq!(
        review(&h, "CREATE", None, Some(&pending)).await["allowed"],
        true
    );
    // The same selecting an approved worker: refused (machine.type is the role's).
    let w1 = patch(
        "api",
        json!({"machines": ["w-1"]}),
        "version: v1alpha1\nmachine:\n  type: controlplane\n",
    );
    let r = review(&h, "CREATE", None, Some(&w1)).await;
    assert_eq!(r["allowed"], false);
    assert!(
        message(&r).contains("w-1: machine.type is `controlplane`"),
        "{}",
        message(&r)
    );
    // By label.
    let by_label = patch(
        "api",
        json!({"labelSelector": {"matchLabels": {"pool": "a"}}}),
        API_SERVER_PATCH,
    );
    assert_eq!(
        review(&h, "CREATE", None, Some(&by_label)).await["allowed"],
        true,
        "no machine has the label"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_to_render_against_is_no_check() {
    let h = harness("nobase").await;
    machines(&h).await;
    let bad = patch("api", json!({}), API_SERVER_PATCH);
    // The cluster missing.
    assert_eq!(
        review(&h, "CREATE", None, Some(&bad)).await["allowed"],
        true
    );
    // No redacted base published yet.
    h.api.insert(cluster(false));
    assert_eq!(
        review(&h, "CREATE", None, Some(&bad)).await["allowed"],
        true
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_already_failing_does_not_block_and_an_update_replaces_the_old_version() {
    let h = harness("already").await;
    h.api.insert(cluster(true));
    machines(&h).await;
    // cp-1 already fails (another patch sets cluster.apiServer on it alone).
    h.api.insert(patch(
        "old-bad",
        json!({"machines": ["cp-1"]}),
        API_SERVER_PATCH,
    ));
    let only_cp1 = patch(
        "more",
        json!({"machines": ["cp-1"]}),
        "version: v1alpha1\ncluster:\n  apiServer:\n    image: x\n",
    );
    let r = review(&h, "CREATE", None, Some(&only_cp1)).await;
    assert_eq!(r["allowed"], true, "cp-1 failed without it: {r}");
    let all = patch("more", json!({"role": "controlplane"}), API_SERVER_PATCH);
    let r = review(&h, "CREATE", None, Some(&all)).await;
    assert_eq!(r["allowed"], false);
    assert!(
        message(&r).contains("2 approved machine(s)") && message(&r).contains("cp-2: "),
        "{}",
        message(&r)
    );
    // The fix of old-bad itself is not blocked: its update is rendered without its old
    // version, and the new one renders.
    let old = patch("old-bad", json!({"machines": ["cp-1"]}), API_SERVER_PATCH);
    let fixed = patch("old-bad", json!({"machines": ["cp-1"]}), UNRELATED);
    assert_eq!(
        review(&h, "UPDATE", Some(&old), Some(&fixed)).await["allowed"],
        true
    );
    // An update of a good patch into a bad one is refused.
    h.api.insert(patch("good", json!({}), UNRELATED));
    let good = patch("good", json!({}), UNRELATED);
    let worse = patch("good", json!({"role": "controlplane"}), API_SERVER_PATCH);
    let r = review(&h, "UPDATE", Some(&good), Some(&worse)).await;
    assert_eq!(r["allowed"], false);
    assert!(
        message(&r).contains("cp-2: ") && message(&r).contains(SEED_ERROR),
        "{}",
        message(&r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_that_does_not_parse_is_refused_with_where() {
    let h = harness("parse").await;
    h.api.insert(cluster(true));
    machines(&h).await;
    let p = patch("broken", json!({}), "version: v1alpha1\nmachine: [\n");
    let r = review(&h, "CREATE", None, Some(&p)).await;
    assert_eq!(r["allowed"], false);
    let m = message(&r);
    assert!(m.contains("not valid YAML") && m.contains("line"), "{m}");
    assert!(m.contains("4 approved machine(s)"), "{m}");
}
