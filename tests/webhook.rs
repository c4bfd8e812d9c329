//! The admission webhook end to end: real AdmissionReview v1 JSON over HTTPS (rustls, a
//! certificate made for the test), decided from live reads of the in-process API server.

use crate::support::apiserver;
use crate::support::https;
use crate::support::objects;

use apiserver::ApiServer;
use https::write_cert;
use hyper::body::Bytes;
use ichor_rules::runtime::live::LiveReader;
use ichor_rules::runtime::metrics::Metrics;
use ichor_rules::runtime::records;
use ichor_rules::runtime::reload::{Reload, Rules};
use ichor_rules::runtime::tls::ReloadingCert;
use ichor_rules::runtime::webhook::{Webhook, router, serve_tls};
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The controller's username as the harness's webhook is told it (`--controller-username`).
const CONTROLLER_USER: &str = "system:serviceaccount:ichor-system:ichor-rules-controller";

/// A `removal.rules` that drops every removal rule and allows, explicitly, each event the
/// shipped one covers (a rule set that leaves a runtime event uncovered is refused).
const ALLOW_REMOVALS: &str =
    "allow leave controlplane\nallow apply controlplane\nallow apply worker\nallow run operation\n";

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "webhook-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

struct Harness {
    api: ApiServer,
    addr: SocketAddr,
    ca: CertificateDer<'static>,
    dir: PathBuf,
    rules: Arc<Rules>,
    cert: Arc<ReloadingCert>,
    metrics: Arc<Metrics>,
}

async fn harness(name: &str, read_timeout: Duration) -> Harness {
    harness_with(name, read_timeout, None, Vec::new()).await
}

/// A harness whose webhook keeps decision records in `sink`, `buffer` of them queued.
async fn harness_with(
    name: &str,
    read_timeout: Duration,
    records: Option<(records::Sink, usize)>,
    modes: Vec<(String, bool)>,
) -> Harness {
    let api = ApiServer::start().await;
    let dir = scratch(name);
    let ca = write_cert(&dir);
    let rules_dir = dir.join("rules");
    std::fs::create_dir_all(&rules_dir).expect("rules dir");
    for f in ["admission.rules", "removal.rules"] {
        std::fs::copy(PathBuf::from("rules").join(f), rules_dir.join(f)).expect("copy rules");
    }
    let rules = Arc::new(Rules::new(vec![rules_dir]).with_modes(modes));
    assert!(matches!(rules.reload(), Reload::Replaced { .. }));
    let cert = Arc::new(
        ReloadingCert::new(dir.join("tls.crt"), dir.join("tls.key")).expect("loads the pair"),
    );
    let tls = Arc::new(cert.server_config().expect("tls config"));
    let metrics = Arc::new(Metrics::default());
    let records = records.map(|(sink, buffer)| {
        records::Recorder::start(sink, buffer, metrics.clone()).expect("the recorder starts")
    });
    let state = Arc::new(Webhook {
        rules: rules.clone(),
        reader: LiveReader::new(api.client(), read_timeout),
        metrics: metrics.clone(),
        api_ready: Default::default(),
        controller_username: Some(CONTROLLER_USER.into()),
        records,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve_tls(
        listener,
        tls,
        router(state),
        std::future::pending(),
    ));
    Harness {
        api,
        addr,
        ca,
        dir,
        rules,
        cert,
        metrics,
    }
}

/// One HTTPS request on a fresh connection; returns the status, the body and the server's
/// certificate.
async fn https(
    h: &Harness,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>, CertificateDer<'static>) {
    https_trusting(h.addr, &h.ca, method, path, content_type, body).await
}

async fn https_trusting(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>, CertificateDer<'static>) {
    let (mut send, peer) = https::connect(addr, ca).await;
    let (status, bytes) =
        https::request(&mut send, method, path, content_type, Bytes::from(body)).await;
    (status, bytes.to_vec(), peer)
}

async fn review(h: &Harness, body: &Value) -> Value {
    let (status, bytes, _) = https(
        h,
        "POST",
        "/validate/talosmachines",
        "application/json",
        serde_json::to_vec(body).expect("json"),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).expect("an AdmissionReview")
}

/// A schedulable cluster in `infra` (see `support::objects` for the defaults).
fn cluster(name: &str, count: i64) -> Value {
    objects::cluster(name, count).schedulable("true").build()
}

/// A machine of cluster `prod` in `infra` that may be deleted, decided at `at`.
fn machine(name: &str, role: &str, approved: bool, at: &str) -> Value {
    objects::machine(name)
        .role(role)
        .approved(approved)
        .allow_delete()
        .approved_at(at)
        .build()
}

async fn three_control_planes(h: &Harness) {
    h.api.insert(cluster("prod", 3));
    for (i, at) in [
        "2026-10-01T00:00:00Z",
        "2026-10-02T00:00:00Z",
        "2026-10-03T00:00:00Z",
    ]
    .iter()
    .enumerate()
    {
        h.api
            .insert(machine(&format!("cp-{}", i + 1), "controlplane", true, at));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_cases_end_to_end_over_https() {
    let h = harness("seeds", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    // ADR 0106: a healthy control plane below the declared count is refused, word for word.
    let cp3 = machine("cp-3", "controlplane", true, "2026-10-03T00:00:00Z");
    let r = review(
        &h,
        &objects::review("u-1", "DELETE", Some(&cp3), None).build(),
    )
    .await;
    assert_eq!(r["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(r["kind"], "AdmissionReview");
    assert_eq!(r["response"]["uid"], "u-1");
    assert_eq!(r["response"]["allowed"], false);
    assert_eq!(r["response"]["status"]["code"], 403);
    assert_eq!(
        r["response"]["status"]["message"],
        "node remove: control planes 3 -> 2, below the declared count of 3; either approve a replacement control plane first (then remove this one), or lower spec.controlPlane.count first (to 1, 3 or 5) if you mean to shrink the cluster"
    );
    // ADR 0054: 3 -> 4 is allowed (with the transitioning warning), 4 -> 5 is refused.
    let pending = machine("cp-4", "controlplane", false, "2026-10-04T00:00:00Z");
    let approved = machine("cp-4", "controlplane", true, "2026-10-04T00:00:00Z");
    let r = review(
        &h,
        &objects::review("u-2", "UPDATE", Some(&pending), Some(&approved)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    assert!(
        r["response"]["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("transitioning"))
    );
    h.api.insert(approved.clone());
    let fifth = machine("cp-5", "controlplane", true, "2026-10-05T00:00:00Z");
    let r = review(
        &h,
        &objects::review("u-3", "CREATE", None, Some(&fifth)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false);
    assert!(
        r["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.controlPlane.count + 1 = 4"))
    );
    // With four, removing one (3 -> 4 -> 3) is allowed.
    let r = review(
        &h,
        &objects::review("u-4", "DELETE", Some(&cp3), None).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_edits_read_nothing() {
    let h = harness("noread", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    let before = h.api.store.faults.requests();
    let old = machine("cp-1", "controlplane", true, "2026-10-01T00:00:00Z");
    let mut new = old.clone();
    new["metadata"]["labels"] = json!({"team": "infra"});
    let r = review(
        &h,
        &objects::review("u-5", "UPDATE", Some(&old), Some(&new)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true);
    assert_eq!(
        h.api.store.faults.requests(),
        before,
        "no live read for an edit without a verb"
    );
}

/// A status write (`talosmachines/status`) as the API server sends it for review: an UPDATE
/// with `subResource: status`, by `user`.
fn status_review(uid: &str, user: &str, old: &Value, new: &Value) -> Value {
    objects::review(uid, "UPDATE", Some(old), Some(new))
        .status_subresource()
        .authenticated_user(user)
        .build()
}

fn with_ready(m: &Value, status: &str, reason: &str) -> Value {
    let mut m = m.clone();
    m["status"] = json!({"conditions": [{
        "type": "Ready", "status": status, "reason": reason,
        "message": "the node at 10.0.0.3:50000 has not answered for 3m",
        "lastTransitionTime": "2026-11-30T10:00:00Z"
    }]});
    m
}

/// Issue 36: the fresh-backup rules read a TalosEtcdBackup's last snapshot and retention
/// deletes what its status names, so only the controller's own identity may change what
/// that status records (`talosetcdbackups/status`, over HTTPS); a change of its conditions
/// alone is no event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_backup_status_is_refused_and_the_controllers_own_is_not() {
    let h = harness("backup-status", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    let backup = json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosEtcdBackup",
        "metadata": {"name": "b", "namespace": "infra", "uid": "uid-b"},
        "spec": {"clusterRef": {"name": "prod"},
                 "store": {"endpoint": "https://s3.example.com", "bucket": "etcd",
                           "credentialsSecretRef": {"name": "s3"}},
                 "schedule": {"interval": "6h"}},
        "status": {"conditions": [{"type": "Snapshot", "status": "False",
                   "reason": "StoreUnreachable", "message": "the store did not answer"}]}
    });
    let mut fresh = backup.clone();
    fresh["status"]["lastSnapshot"] = json!({"time": "2026-12-06T00:00:00Z",
        "key": "b-20261206T000000Z.snapshot", "size": 4096, "sha256": "ab", "node": "cp-1"});
    let mut pruning = backup.clone();
    pruning["status"]["pruning"] = json!(["other-team/production.dump"]);
    let mut reworded = backup.clone();
    reworded["status"]["conditions"][0]["message"] = json!("edited");
    let before = h.api.store.faults.requests();
    let send = |uid: &'static str, user: &'static str, old: &Value, new: &Value| {
        objects::review(uid, "UPDATE", Some(old), Some(new))
            .status_subresource()
            .authenticated_user(user)
            .build()
    };
    for (uid, user, new) in [
        ("b-1", "admin", &fresh),
        ("b-2", "system:serviceaccount:ichor-system:default", &fresh),
        ("b-3", "admin", &pruning),
    ] {
        let body = send(uid, user, &backup, new);
        assert_eq!(body["request"]["resource"]["resource"], "talosetcdbackups");
        let r = review(&h, &body).await;
        assert_eq!(r["response"]["allowed"], false, "{user}: {r}");
        assert_eq!(r["response"]["status"]["code"], 403);
        let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
        assert!(
            msg.starts_with("only the ichor-rules controller may change the snapshots a TalosEtcdBackup's status records"),
            "{msg}"
        );
    }
    // Clearing the last snapshot is refused too.
    let r = review(&h, &send("b-4", "admin", &fresh, &backup)).await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    // The controller records its snapshots.
    for (uid, old, new) in [("b-5", &backup, &fresh), ("b-6", &fresh, &backup)] {
        let r = review(&h, &send(uid, CONTROLLER_USER, old, new)).await;
        assert_eq!(r["response"]["allowed"], true, "{r}");
    }
    // A condition's words are no event, whoever changes them.
    let r = review(&h, &send("b-7", "admin", &backup, &reworded)).await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    // Deciding who wrote a status reads nothing live.
    assert_eq!(h.api.store.faults.requests(), before);
}

/// Issue 37 (audit gap 5): the webhook dry-renders patches against a TalosCluster's
/// `status.redactedBase` and the `bootstrap` rules read its `status.bootstrap`, so only the
/// controller's own identity may set, change or clear them: real AdmissionReviews of
/// `talosclusters/status`, over HTTPS to the path the chart registers. A change of its
/// conditions alone is no event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_cluster_status_is_refused_and_the_controllers_own_is_not() {
    let h = harness("cluster-status", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    let mut published = cluster("prod", 3);
    published["metadata"]["uid"] = json!("uid-prod");
    published["status"] = json!({
        "conditions": [{"type": "Transitioning", "status": "False",
                        "reason": "StableControlPlaneCount", "message": "3 approved control plane(s)"}],
        "redactedBase": {"digest": "5f1d0c3e", "controlplane": "version: v1alpha1\n",
                         "worker": "version: v1alpha1\n"},
        "bootstrap": {"machine": "cp-1", "sentAt": "2026-10-03T00:10:00Z",
                      "by": "ichor-rules-controller-0", "confirmed": true}
    });
    let mut forged_base = published.clone();
    forged_base["status"]["redactedBase"]["controlplane"] = json!("machine: {}\n");
    let mut no_bootstrap = published.clone();
    no_bootstrap["status"]
        .as_object_mut()
        .expect("status")
        .remove("bootstrap");
    let mut no_base = published.clone();
    no_base["status"]
        .as_object_mut()
        .expect("status")
        .remove("redactedBase");
    let mut unrecorded = published.clone();
    unrecorded["status"]["bootstrap"]["machine"] = json!("cp-2");
    let mut reworded = published.clone();
    reworded["status"]["conditions"][0]["message"] = json!("edited");
    reworded["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
        .push(
            json!({"type": "BaseConfig", "status": "False", "reason": "BaseMissing",
                     "message": "forged words"}),
        );
    let before = h.api.store.faults.requests();
    let send = async |uid: &str, user: &str, old: &Value, new: &Value| -> Value {
        let body = objects::review(uid, "UPDATE", Some(old), Some(new))
            .status_subresource()
            .authenticated_user(user)
            .build();
        assert_eq!(body["request"]["resource"]["resource"], "talosclusters");
        let (status, bytes, _) = https(
            &h,
            "POST",
            "/validate/talosclusters/status",
            "application/json",
            serde_json::to_vec(&body).expect("json"),
        )
        .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        serde_json::from_slice(&bytes).expect("an AdmissionReview")
    };
    // Forged, changed or cleared by anyone but the controller (its namesake in another
    // namespace too): refused, with the rule's words.
    for (uid, user, old, new) in [
        ("c-1", "admin", &published, &forged_base),
        ("c-2", "admin", &published, &no_base),
        ("c-3", "admin", &published, &no_bootstrap),
        ("c-4", "admin", &no_bootstrap, &published),
        ("c-5", "admin", &published, &unrecorded),
        (
            "c-6",
            "system:serviceaccount:other:ichor-rules-controller",
            &published,
            &no_bootstrap,
        ),
    ] {
        let r = send(uid, user, old, new).await;
        assert_eq!(r["response"]["uid"], uid, "{r}");
        assert_eq!(r["response"]["allowed"], false, "{uid} {user}: {r}");
        assert_eq!(r["response"]["status"]["code"], 403);
        let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
        assert!(
            msg.starts_with(
                "only the ichor-rules controller may set, change or clear what TalosCluster prod's status records"
            ),
            "{msg}"
        );
    }
    // The controller publishes the base and records the Bootstrap.
    for (uid, old, new) in [
        ("c-7", &published, &forged_base),
        ("c-8", &no_bootstrap, &published),
        ("c-9", &published, &no_base),
    ] {
        let r = send(uid, CONTROLLER_USER, old, new).await;
        assert_eq!(r["response"]["allowed"], true, "{uid}: {r}");
    }
    // A condition's words are no event, whoever changes them.
    let r = send("c-10", "admin", &published, &reworded).await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    // Deciding who wrote a status reads nothing live.
    assert_eq!(h.api.store.faults.requests(), before);
}

/// Issue 13: admission reads Ready=False NodeUnreachable as `member.dead`, so a forged one
/// would bend the declared count. Only the controller's own identity may set or clear what
/// the rules read in a machine's status; other status edits are no event and read nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_status_patch_is_refused_and_the_controllers_own_is_not() {
    let h = harness("status", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    let cp3 = machine("cp-3", "controlplane", true, "2026-10-03T00:00:00Z");
    let converged = with_ready(&cp3, "True", "Converged");
    let forged = with_ready(&cp3, "False", "NodeUnreachable");
    let before = h.api.store.faults.requests();

    // Someone allowed to patch talosmachines/status marks a healthy control plane dead.
    for (uid, user) in [
        ("s-1", "admin"),
        ("s-2", "system:serviceaccount:ichor-system:default"),
        ("s-3", "system:serviceaccount:other:ichor-rules-controller"),
        ("s-4", ""),
    ] {
        let r = review(&h, &status_review(uid, user, &converged, &forged)).await;
        assert_eq!(r["response"]["uid"], uid);
        assert_eq!(r["response"]["allowed"], false, "{user}: {r}");
        assert_eq!(r["response"]["status"]["code"], 403);
        let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
        assert!(
            msg.starts_with("only the ichor-rules controller may set or clear what it and the rules read in the status of TalosMachine cp-3"),
            "{msg}"
        );
    }
    // Clearing it is refused as well (it would hide a dead member from the quorum count).
    let r = review(&h, &status_review("s-5", "admin", &forged, &converged)).await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    // The controller's record of a removal is guarded too.
    let mut record = converged.clone();
    record["status"]["removal"] = json!({"memberDead": true, "done": [], "committed": true});
    let r = review(&h, &status_review("s-6", "admin", &converged, &record)).await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let mut marked = converged.clone();
    marked["status"]["conditions"] = json!([{"type": "Removal", "status": "True",
        "reason": "DeadMemberRemoval", "message": "x"}]);
    let r = review(&h, &status_review("s-7", "admin", &converged, &marked)).await;
    assert_eq!(r["response"]["allowed"], false, "{r}");

    // The controller itself reports it.
    let r = review(
        &h,
        &status_review("s-8", CONTROLLER_USER, &converged, &forged),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    let r = review(
        &h,
        &status_review("s-9", CONTROLLER_USER, &forged, &converged),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    // A status edit that touches nothing the controller or the rules read is no event,
    // whoever makes it.
    let mut other = converged.clone();
    other["status"]["conditions"][0]["message"] = json!("converged at generation 7");
    let r = review(&h, &status_review("s-10", "admin", &converged, &other)).await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    // Issue 33: the grace timer is read too. A NodeReachable=False with an old time would
    // make the next failed probe report NodeUnreachable at once: refused.
    let mut timer = converged.clone();
    timer["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
        .push(
            json!({"type": "NodeReachable", "status": "False", "reason": "Timeout",
            "lastTransitionTime": "2020-01-01T00:00:00Z"}),
        );
    let r = review(&h, &status_review("s-10b", "admin", &converged, &timer)).await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let r = review(
        &h,
        &status_review("s-10c", CONTROLLER_USER, &converged, &timer),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    // Deciding who wrote a status reads nothing live.
    assert_eq!(h.api.store.faults.requests(), before);

    // The forged status never landed, so the delete below the count is still refused.
    let r = review(
        &h,
        &objects::review("s-11", "DELETE", Some(&converged), None).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    // Had it landed, admission would have let it through: that is what the guard protects.
    let r = review(
        &h,
        &objects::review("s-12", "DELETE", Some(&forged), None).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
}

/// Issue 13: a refusal never names another namespace's objects. Namespace `other` holds a
/// cluster of the same name, its own control planes and an unfinished operation; decisions
/// about `infra` neither count them nor name them, whether they refuse or allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_never_name_another_namespaces_objects() {
    let h = harness("namespaces", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    let mut elsewhere = cluster("prod", 3);
    elsewhere["metadata"]["namespace"] = json!("other");
    h.api.insert(elsewhere);
    for i in 1..=5 {
        let mut m = machine(
            &format!("other-secret-cp-{i}"),
            "controlplane",
            true,
            "2026-09-01T00:00:00Z",
        );
        m["metadata"]["namespace"] = json!("other");
        h.api.insert(m);
    }
    let mut op = operation("other-secret-upgrade", "upgrade", Some("other-secret-cp-1"));
    op["metadata"]["namespace"] = json!("other");
    op["status"] = json!({"phase": "Running"});
    h.api.insert(op);
    let leaks = |r: &Value| {
        let text = r.to_string();
        assert!(!text.contains("other-secret"), "{text}");
        assert!(!text.contains("\"other\""), "{text}");
    };
    // Refused below the count: counted from infra alone (3 -> 2), naming only infra's.
    let cp3 = machine("cp-3", "controlplane", true, "2026-10-03T00:00:00Z");
    let r = review(
        &h,
        &objects::review("n-1", "DELETE", Some(&cp3), None).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    assert!(
        r["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("control planes 3 -> 2")),
        "{r}"
    );
    leaks(&r);
    // Approving a fourth in infra: other's five do not count toward infra's cap.
    let pending = machine("cp-4", "controlplane", false, "2026-10-04T00:00:00Z");
    let approved = machine("cp-4", "controlplane", true, "2026-10-04T00:00:00Z");
    let r = review(
        &h,
        &objects::review("n-2", "UPDATE", Some(&pending), Some(&approved)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    leaks(&r);
    // Starting an operation in infra: other's unfinished one is not "another operation".
    let mut start = operation("infra-upgrade", "upgrade", None);
    start["metadata"]["namespace"] = json!("infra");
    let r = review(
        &h,
        &objects::review("n-3", "CREATE", None, Some(&start)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    leaks(&r);
    // A refused forged status in infra names infra's machine only.
    let forged = with_ready(&cp3, "False", "NodeUnreachable");
    let r = review(&h, &status_review("n-4", "admin", &cp3, &forged)).await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    leaks(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_live_read_refuses() {
    let h = harness("fail", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    h.api.store.faults.fail_next(1, Some("talosmachines"));
    let cp1 = machine("cp-1", "controlplane", true, "2026-10-01T00:00:00Z");
    let r = review(
        &h,
        &objects::review("u-6", "DELETE", Some(&cp1), None).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false);
    let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
    // One short sentence: what could not be read, and why; the API's own text stays in
    // the log.
    assert_eq!(
        msg,
        "the TalosMachines of TalosCluster `infra/prod` could not be read (the API server answered 500 InternalError); ichor-rules refuses rather than deciding on missing data, retry shortly"
    );
    assert!(
        h.metrics
            .render()
            .contains("ichor_rules_live_read_errors_total{reason=\"api\"} 1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_api_server_times_out_and_refuses() {
    let h = harness("slow", Duration::from_millis(100)).await;
    three_control_planes(&h).await;
    h.api.store.faults.set_latency(Duration::from_millis(400));
    let cp1 = machine("cp-1", "controlplane", true, "2026-10-01T00:00:00Z");
    let started = std::time::Instant::now();
    let r = review(
        &h,
        &objects::review("u-7", "DELETE", Some(&cp1), None).build(),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(390),
        "bounded by the read timeout"
    );
    assert_eq!(r["response"]["allowed"], false);
    assert!(
        r["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(
                "the TalosMachines of TalosCluster `infra/prod` could not be read (no answer within 100 ms)"
            ))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_with_json() {
    let h = harness("bad", Duration::from_secs(2)).await;
    for (content_type, body) in [
        ("application/json", b"{not json".to_vec()),
        (
            "application/json",
            br#"{"apiVersion":"v1","kind":"Pod"}"#.to_vec(),
        ),
        ("text/plain", b"{}".to_vec()),
        ("application/json", vec![b' '; 5 * 1024 * 1024]),
    ] {
        let (status, bytes, _) =
            https(&h, "POST", "/validate/talosmachines", content_type, body).await;
        assert_eq!(status, 400);
        let v: Value = serde_json::from_slice(&bytes).expect("a JSON error");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    assert!(
        h.metrics
            .render()
            .contains("ichor_rules_bad_requests_total 4")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_rules_edit_keeps_the_old_table() {
    let h = harness("reload", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    std::fs::write(
        h.dir.join("rules").join("removal.rules"),
        "rule quorum refuse leave controlplane when aproved < 2 say \"x\"",
    )
    .expect("break the rules");
    match h.rules.reload() {
        Reload::Rejected { reason, .. } => assert!(reason.contains("aproved"), "{reason}"),
        other => panic!("a broken edit must be rejected, got {other:?}"),
    }
    let cp3 = machine("cp-3", "controlplane", true, "2026-10-03T00:00:00Z");
    let r = review(
        &h,
        &objects::review("u-8", "DELETE", Some(&cp3), None).build(),
    )
    .await;
    assert_eq!(
        r["response"]["allowed"], false,
        "the old table still refuses 3 -> 2"
    );
    // A good edit replaces it: the removal rules dropped, every event they covered
    // explicitly allowed (an uncovered event would be refused).
    std::fs::write(h.dir.join("rules").join("removal.rules"), ALLOW_REMOVALS).expect("edit");
    assert!(matches!(h.rules.reload(), Reload::Replaced { .. }));
    let r = review(
        &h,
        &objects::review("u-9", "DELETE", Some(&cp3), None).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_serves_without_restart() {
    let h = harness("rotate", Duration::from_secs(2)).await;
    let (_, _, first) = https(&h, "GET", "/healthz", "text/plain", Vec::new()).await;
    // Modification times have a coarse grain on some filesystems.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let new_ca = write_cert(&h.dir);
    assert!(h.cert.reload_if_changed().expect("the new pair loads"));
    let (status, _, second) =
        https_trusting(h.addr, &new_ca, "GET", "/healthz", "text/plain", Vec::new()).await;
    assert_eq!(status, 200);
    assert_ne!(first, second, "new connections get the new certificate");
    // A broken pair keeps the working one.
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(h.dir.join("tls.key"), "not a key").expect("break the key");
    assert!(h.cert.reload_if_changed().is_err());
    let (status, _, third) =
        https_trusting(h.addr, &new_ca, "GET", "/healthz", "text/plain", Vec::new()).await;
    assert_eq!(status, 200);
    assert_eq!(second, third);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_requests_decide_alike() {
    let h = Arc::new(harness("concurrent", Duration::from_secs(5)).await);
    three_control_planes(&h).await;
    let cp3 = machine("cp-3", "controlplane", true, "2026-10-03T00:00:00Z");
    let mut tasks = Vec::new();
    for i in 0..48 {
        let h = h.clone();
        let cp3 = cp3.clone();
        tasks.push(tokio::spawn(async move {
            let uid = format!("c-{i}");
            let r = review(
                &h,
                &objects::review(&uid, "DELETE", Some(&cp3), None).build(),
            )
            .await;
            (uid, r)
        }));
    }
    for t in tasks {
        let (uid, r) = t.await.expect("task");
        assert_eq!(r["response"]["uid"], uid.as_str());
        assert_eq!(r["response"]["allowed"], false);
    }
    let m = h.metrics.render();
    assert!(
        m.contains("ichor_rules_decisions_total{rule=\"declared-count\",verdict=\"refuse\"} 48"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    let h = harness("health", Duration::from_secs(2)).await;
    let (status, _, _) = https(&h, "GET", "/healthz", "text/plain", Vec::new()).await;
    assert_eq!(status, 200);
    let (status, body, _) = https(&h, "GET", "/readyz", "text/plain", Vec::new()).await;
    assert_eq!(status, 503, "not ready before the API server answered");
    assert!(String::from_utf8_lossy(&body).contains("API server"));
    three_control_planes(&h).await;
    let cp1 = machine("cp-1", "controlplane", true, "2026-10-01T00:00:00Z");
    let _ = review(
        &h,
        &objects::review("u-10", "DELETE", Some(&cp1), None).build(),
    )
    .await;
    let (status, _, _) = https(&h, "GET", "/readyz", "text/plain", Vec::new()).await;
    assert_eq!(status, 200);
    let (status, body, _) = https(&h, "GET", "/metrics", "text/plain", Vec::new()).await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("ichor_rules_decision_duration_seconds_count 1"),
        "{text}"
    );
    assert!(text.contains(
        "ichor_rules_admission_requests_total{kind=\"TalosMachine\",allowed=\"false\"} 1"
    ));
}

/// The webhook answers exactly what `ichor-rules eval` answers for the same objects and
/// request: one decision code, whether the objects come from a file or from live reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_answers_what_eval_answers() {
    use ichor_rules::runtime::admission::{parse_review, respond};
    use ichor_rules::runtime::decide::{decide_events, request_events};
    use ichor_rules::runtime::facts::Expensive;
    use ichor_rules::runtime::objects::load_snapshot;
    let table = ichor_rules::ruleset::load(&[PathBuf::from("rules")])
        .expect("rules")
        .table
        .expect("the shipped rules check");
    for objects in ["objects-stream.yaml", "objects-list.yaml"] {
        let text = std::fs::read_to_string(PathBuf::from("tests/fixtures").join(objects))
            .expect("fixture");
        let snapshot = load_snapshot(&text).expect("objects load");
        let h = harness("equal", Duration::from_secs(2)).await;
        for m in &snapshot.machines {
            h.api.insert(serde_json::to_value(m).expect("json"));
        }
        for c in &snapshot.clusters {
            h.api.insert(serde_json::to_value(c).expect("json"));
        }
        for o in &snapshot.operations {
            h.api.insert(serde_json::to_value(o).expect("json"));
        }
        for review_file in [
            "review-approve-cp4-warns.json",
            "review-delete-cp1-refused.json",
            "review-delete-w1-allowed.json",
        ] {
            let body =
                std::fs::read(PathBuf::from("tests/fixtures").join(review_file)).expect("fixture");
            let req = parse_review(&body).expect("a review");
            let events = request_events(
                req.operation(),
                &req.namespace,
                req.old.as_ref(),
                req.new.as_ref(),
            );
            let (decision, _) =
                decide_events(&table, &snapshot, &events, Expensive::FromObjects, false);
            let offline = serde_json::to_value(respond(&req, &decision)).expect("json");
            let mut live = review(&h, &serde_json::from_slice(&body).expect("json")).await;
            // The webhook's answer adds the audit log's annotations; the rest is `eval`'s.
            let notes = live["response"]
                .as_object_mut()
                .and_then(|r| r.remove("auditAnnotations"));
            // (This harness keeps no records: the answer names no decision id.)
            assert!(
                notes.is_some_and(|n| n["decision-record"] == "off (--decision-log off)"
                    && n.get("decision-id").is_none()),
                "{objects} / {review_file}: {live}"
            );
            assert_eq!(live, offline, "{objects} / {review_file}");
            // The reviews were written against the stream's objects and decide there what
            // their names say, so the equality is not vacuous.
            if objects != "objects-stream.yaml" {
                continue;
            }
            let allowed = live["response"]["allowed"].as_bool();
            if review_file.contains("refused") {
                assert_eq!(allowed, Some(false), "{objects} / {review_file}: {live}");
            } else {
                assert_eq!(allowed, Some(true), "{objects} / {review_file}: {live}");
            }
            if review_file.contains("warns") {
                assert!(
                    live["response"]["warnings"].is_array(),
                    "{objects} / {review_file}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_requests_are_decided_like_any_other() {
    let h = harness("dryrun", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    let cp3 = machine("cp-3", "controlplane", true, "2026-10-03T00:00:00Z");
    let mut req = objects::review("u-11", "DELETE", Some(&cp3), None).build();
    req["request"]["dryRun"] = json!(true);
    let r = review(&h, &req).await;
    assert_eq!(r["response"]["allowed"], false);
    assert!(
        r["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("declared count of 3"))
    );
}

/// `ichor-rules serve` as its own process: it serves once ready, reloads edited rules,
/// and a broken edit keeps the previous table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serve_command_reloads_rules_and_keeps_the_last_good_table() {
    let api = ApiServer::start().await;
    let dir = scratch("serve");
    let ca = write_cert(&dir);
    let rules_dir = dir.join("rules");
    std::fs::create_dir_all(&rules_dir).expect("rules dir");
    for f in ["admission.rules", "removal.rules"] {
        std::fs::copy(PathBuf::from("rules").join(f), rules_dir.join(f)).expect("copy");
    }
    api.insert(cluster("prod", 3));
    for (i, at) in [
        "2026-10-01T00:00:00Z",
        "2026-10-02T00:00:00Z",
        "2026-10-03T00:00:00Z",
    ]
    .iter()
    .enumerate()
    {
        api.insert(machine(&format!("cp-{}", i + 1), "controlplane", true, at));
    }
    let listen = https::free_address();
    let _serve = https::Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
            .args([
                "serve",
                "--listen",
                &listen.to_string(),
                "--api-server",
                &api.url(),
            ])
            .arg("--rules")
            .arg(&rules_dir)
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .args(["--reload-interval-ms", "100", "--log-format", "json"])
            // /metrics on the webhook's port, unauthenticated (local use).
            .arg("--metrics-insecure")
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("serve starts"),
    );
    // Ready once the rules loaded and the API server answered.
    let mut ready = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(listen).await.is_ok() {
            let (status, _, _) =
                https_trusting(listen, &ca, "GET", "/readyz", "text/plain", Vec::new()).await;
            if status == 200 {
                ready = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "serve became ready");
    let cp3 = machine("cp-3", "controlplane", true, "2026-10-03T00:00:00Z");
    let body = serde_json::to_vec(&objects::review("s-1", "DELETE", Some(&cp3), None).build())
        .expect("json");
    let ask = || async {
        let (status, bytes, _) = https_trusting(
            listen,
            &ca,
            "POST",
            "/validate/talosmachines",
            "application/json",
            body.clone(),
        )
        .await;
        assert_eq!(status, 200);
        let v: Value = serde_json::from_slice(&bytes).expect("review");
        v["response"]["allowed"].as_bool()
    };
    assert_eq!(ask().await, Some(false), "3 -> 2 is refused");
    // Edit: drop the removal rules. The new table serves within a few reload intervals.
    std::fs::write(rules_dir.join("removal.rules"), ALLOW_REMOVALS).expect("edit");
    let mut reloaded = false;
    for _ in 0..50 {
        if ask().await == Some(true) {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reloaded, "the edited rules took effect without a restart");
    // A broken edit is rejected: the last good table keeps answering.
    std::fs::write(
        rules_dir.join("removal.rules"),
        "rule broken refuse remove controlplane when nope say \"x\"\n",
    )
    .expect("break");
    let mut rejected = false;
    for _ in 0..50 {
        let (_, bytes, _) =
            https_trusting(listen, &ca, "GET", "/metrics", "text/plain", Vec::new()).await;
        if String::from_utf8_lossy(&bytes)
            .contains("ichor_rules_rules_reloads_total{result=\"rejected\"} 1")
        {
            rejected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rejected, "the broken edit was counted as rejected");
    assert_eq!(ask().await, Some(true), "the last good table still decides");

    // The same process runs the controller: it leads (one replica) and reconciles.
    let mut leading = false;
    for _ in 0..100 {
        let (_, bytes, _) =
            https_trusting(listen, &ca, "GET", "/metrics", "text/plain", Vec::new()).await;
        if String::from_utf8_lossy(&bytes).contains("ichor_rules_leader 1") {
            leading = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(leading, "serve runs the controller");
    let holder = |api: &ApiServer| {
        api.objects("Lease", Some("default"))
            .into_iter()
            .find(|l| l["metadata"]["name"] == "ichor-rules-controller")
            .map(|l| l["spec"]["holderIdentity"].clone())
    };
    assert_eq!(holder(&api), Some(json!("ichor-rules")));

    // SIGTERM (how Kubernetes stops a pod): it exits cleanly and steps down.
    let mut serve = _serve;
    let pid = serve.0.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let mut exited = None;
    for _ in 0..100 {
        if let Ok(Some(code)) = serve.0.try_wait() {
            exited = Some(code);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let code = exited.expect("serve exits within 10 s of SIGTERM");
    assert!(code.success(), "{code:?}");
    assert_eq!(
        holder(&api),
        Some(Value::Null),
        "the leader lease was released"
    );
}

#[test]
fn serve_refuses_a_talosconfig_it_cannot_use_with_one_clear_line() {
    let dir = std::env::temp_dir().join(format!("ichor-talosconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    write_cert(&dir);
    std::fs::write(
        dir.join("talosconfig"),
        "context: prod\ncontexts: [not a map\n",
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-server",
            "http://127.0.0.1:9",
        ])
        .arg("--rules")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/rules"))
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .arg("--talosconfig")
        .arg(dir.join("talosconfig"))
        .arg("--talosconfig-for-all-clusters")
        .output()
        .expect("serve runs");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line in {err}"));
    assert!(
        line.contains("--talosconfig") && line.contains("talosconfig"),
        "{line}"
    );
    assert!(!err.contains("panicked"), "{err}");

    // One talosconfig for every cluster is an explicit opt-in: without it, serve does not
    // start, and says how to give each cluster its own.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-server",
            "http://127.0.0.1:9",
        ])
        .arg("--rules")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/rules"))
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .arg("--talosconfig")
        .arg(dir.join("talosconfig"))
        .output()
        .expect("serve runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line in {err}"));
    assert!(
        line.contains("--talosconfig-for-all-clusters")
            && line.contains("spec.talosConfigSecretRef"),
        "{line}"
    );
}

// ---------------------------------------------------------------------------------------
// Reads that are partial or contradict the request are failed reads: refused.
// ---------------------------------------------------------------------------------------

/// Four approved control planes of a count-3 cluster (3 -> 4 is the one transient even
/// state), and the approval of a fifth, which is past the cap of count + 1.
async fn four_control_planes_and_a_fifth(h: &Harness) -> Value {
    three_control_planes(h).await;
    h.api.insert(machine(
        "cp-4",
        "controlplane",
        true,
        "2026-10-04T00:00:00Z",
    ));
    let fifth = machine("cp-5", "controlplane", true, "2026-10-05T00:00:00Z");
    objects::review("u-5th", "CREATE", None, Some(&fifth)).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paginated_list_is_read_to_its_end() {
    let h = harness("paginate", Duration::from_secs(2)).await;
    let fifth = four_control_planes_and_a_fifth(&h).await;
    // The server answers one machine per page, whatever the client asks for.
    h.api.store.faults.paginate(1);
    h.api.store.faults.take_log();
    let r = review(&h, &fifth).await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("spec.controlPlane.count + 1 = 4"), "{msg}");
    let pages = h
        .api
        .store
        .faults
        .take_log()
        .iter()
        .filter(|r| r.path.ends_with("/talosmachines") && !r.watch)
        .count();
    assert_eq!(pages, 4, "one page per machine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_contradict_the_request_refuse() {
    type Rewrite = fn(&mut Value);
    let cases: [(&str, &str, Rewrite, &str); 10] = [
        (
            "items null",
            "talosmachines",
            |v| v["items"] = Value::Null,
            "`items` is missing or null",
        ),
        (
            "items missing",
            "talosmachines",
            |v| {
                v.as_object_mut().map(|o| o.remove("items"));
            },
            "`items` is missing or null",
        ),
        (
            "an item of another namespace",
            "talosmachines",
            |v| v["items"][0]["metadata"]["namespace"] = json!("elsewhere"),
            "of namespace `elsewhere`, not of `infra`",
        ),
        (
            "an item without a namespace",
            "talosmachines",
            |v| {
                v["items"][0]["metadata"]
                    .as_object_mut()
                    .map(|m| m.remove("namespace"));
            },
            "without a namespace",
        ),
        (
            "an item of another kind",
            "talosmachines",
            |v| v["items"][1]["kind"] = json!("TalosOperation"),
            "where a ichor.maesh.dev/v1alpha1 TalosMachine was asked for",
        ),
        (
            "a list of another kind",
            "talosmachines",
            |v| v["kind"] = json!("TalosOperationList"),
            "not a ichor.maesh.dev/v1alpha1 TalosMachineList",
        ),
        (
            "a list of another version",
            "talosmachines",
            |v| v["apiVersion"] = json!("ichor.maesh.dev/v1beta1"),
            "not a ichor.maesh.dev/v1alpha1 TalosMachineList",
        ),
        (
            "an item twice",
            "talosmachines",
            |v| {
                let first = v["items"][0].clone();
                if let Some(i) = v["items"].as_array_mut() {
                    i.push(first);
                }
            },
            "lists TalosMachine `cp-1` twice",
        ),
        (
            "a continue token that never ends",
            "talosmachines",
            |v| {
                v["items"] = json!([]);
                v["metadata"]["continue"] = json!("infra/a");
            },
            "same `continue` token twice",
        ),
        (
            "a cluster of another name",
            "talosclusters/prod",
            |v| v["metadata"]["name"] = json!("other"),
            "the answer is TalosCluster `other`, not the `prod` asked for",
        ),
    ];
    let h = harness("contradict", Duration::from_secs(2)).await;
    let fifth = four_control_planes_and_a_fifth(&h).await;
    for (case, path, rewrite, why) in cases {
        h.api.store.faults.rewrite_answers(Some(path), rewrite);
        let r = review(&h, &fifth).await;
        assert_eq!(r["response"]["allowed"], false, "{case}: {r}");
        let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
        assert!(msg.contains("could not be read"), "{case}: {msg}");
        assert!(msg.contains(why), "{case}: {msg}");
        assert!(
            msg.contains("refuses rather than deciding"),
            "{case}: {msg}"
        );
        assert_eq!(msg.lines().count(), 1, "{case}: {msg}");
    }
    // A server that keeps paginating, a new token every time, is cut off.
    let n = Arc::new(AtomicUsize::new(0));
    let pages = n.clone();
    h.api
        .store
        .faults
        .rewrite_answers(Some("talosmachines"), move |v| {
            v["items"] = json!([]);
            v["metadata"]["continue"] =
                json!(format!("infra/a{}", pages.fetch_add(1, Ordering::SeqCst)));
        });
    let r = review(&h, &fifth).await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("did not end within 200 pages"), "{msg}");
    // 200 pages were asked for. The HTTP client may send one again on a fresh connection
    // when the server closed the pooled one just as it was sent (hyper's retry of canceled
    // requests; seen once under a loaded machine), so the server may answer one or two more.
    let answered = n.load(Ordering::SeqCst);
    assert!((200..=202).contains(&answered), "{answered} pages answered");
    assert!(
        h.metrics
            .render()
            .contains("ichor_rules_live_read_errors_total{reason=\"invalid\"} 11"),
        "{}",
        h.metrics.render()
    );
    // The same answers, honest again: refused by the rule, not by the read.
    h.api.store.faults.stop_rewriting();
    let r = review(&h, &fifth).await;
    let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("spec.controlPlane.count + 1 = 4"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_cannot_name_an_object_are_not_read() {
    let h = harness("badnames", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    h.api.store.faults.take_log();
    // A clusterRef that would walk the URL path to another object.
    let mut sneaky = machine("cp-9", "controlplane", true, "2026-10-09T00:00:00Z");
    sneaky["spec"]["clusterRef"]["name"] = json!("../talosclusters/prod");
    let r = review(
        &h,
        &objects::review("u-n1", "CREATE", None, Some(&sneaky)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("not a valid object name"), "{msg}");
    // A namespace that is not one.
    let ok = machine("cp-8", "controlplane", true, "2026-10-08T00:00:00Z");
    let mut body = objects::review("u-n2", "CREATE", None, Some(&ok)).build();
    body["request"]["namespace"] = json!("infra/talosmachines/x");
    body["request"]["object"]["metadata"]["namespace"] = json!("infra/talosmachines/x");
    let r = review(&h, &body).await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let msg = r["response"]["status"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("not a valid namespace name"), "{msg}");
    assert!(
        h.api
            .store
            .faults
            .take_log()
            .iter()
            .all(|r| !r.path.contains("..") && !r.path.contains("infra/talosmachines/x")),
        "nothing was read for them"
    );
}

// ---------------------------------------------------------------------------------------
// An operation's spec never changes once created.
// ---------------------------------------------------------------------------------------

fn operation(name: &str, kind: &str, machine: Option<&str>) -> Value {
    objects::operation(name, kind).machine(machine).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_cannot_be_edited_into_what_admission_refuses() {
    let h = harness("immutable", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    // Created as a harmless reboot: allowed.
    let snapshot = operation("op-1", "reboot", None);
    let r = review(
        &h,
        &objects::review("u-i1", "CREATE", None, Some(&snapshot)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    h.api.insert(snapshot.clone());
    // Created as a reset of a control plane at the declared count: refused.
    let reset = operation("op-1", "reset", Some("cp-1"));
    let r = review(
        &h,
        &objects::review("u-i2", "CREATE", None, Some(&reset)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    // Edited from the snapshot into that reset: refused too, saying why.
    let r = review(
        &h,
        &objects::review("u-i3", "UPDATE", Some(&snapshot), Some(&reset)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    assert_eq!(
        r["response"]["status"]["message"],
        "the spec of TalosOperation infra/op-1 cannot change once it is created (spec.kind `reboot` -> `reset`, spec.machine `(none)` -> `cp-1`): the rules decided on it as it was created; create a new TalosOperation for other work"
    );
    // Status, labels and annotations change freely, with nothing read.
    let mut labelled = snapshot.clone();
    labelled["metadata"]["labels"] = json!({"team": "infra"});
    labelled["status"] = json!({"phase": "Running"});
    h.api.store.faults.take_log();
    let r = review(
        &h,
        &objects::review("u-i4", "UPDATE", Some(&snapshot), Some(&labelled)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    assert!(h.api.store.faults.take_log().is_empty());
}

/// Issue 35: a kind this operator does not execute is refused on create, over HTTPS, with
/// the rules' message saying what to do instead (never accepted and left Pending); the kinds
/// it executes are let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_operation_kinds_are_refused_at_admission_with_what_to_do() {
    let h = harness("unsupported-kinds", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    for (i, (kind, says)) in [
        ("kubernetes-upgrade", "talosctl upgrade-k8s"),
        ("rotate-ca", "talosctl rotate-ca"),
        ("ichor", "helm upgrade"),
    ]
    .into_iter()
    .enumerate()
    {
        let op = operation("op-1", kind, None);
        let uid = format!("u-k{i}");
        let r = review(
            &h,
            &objects::review(&uid, "CREATE", None, Some(&op)).build(),
        )
        .await;
        assert_eq!(r["response"]["allowed"], false, "{kind}: {r}");
        let message = r["response"]["status"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains(&format!("this operator does not execute {kind} operations"))
                && message.contains(says),
            "{kind}: {message}"
        );
    }
    for kind in ["reboot", "shutdown", "upgrade", "rollback"] {
        let op = operation("op-1", kind, None);
        let r = review(
            &h,
            &objects::review("u-ok", "CREATE", None, Some(&op)).build(),
        )
        .await;
        assert_eq!(r["response"]["allowed"], true, "{kind}: {r}");
    }
    // Issue 36: an etcd-snapshot is executed, by the backup it names; naming none, it is
    // refused saying so.
    let op = operation("op-1", "etcd-snapshot", None);
    let r = review(
        &h,
        &objects::review("u-snap", "CREATE", None, Some(&op)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let message = r["response"]["status"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("an etcd-snapshot is taken by a TalosEtcdBackup")
            && message.contains("spec.backupRef.name"),
        "{message}"
    );
}

/// A TalosEtcdBackup of cluster `prod` whose store is at `endpoint`.
fn backup(name: &str, endpoint: &str) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosEtcdBackup",
        "metadata": {"name": name, "namespace": "infra"},
        "spec": {"clusterRef": {"name": "prod"},
                 "store": {"endpoint": endpoint, "bucket": "etcd",
                           "credentialsSecretRef": {"name": "s3-keys"}},
                 "schedule": {"interval": "6h"}}
    })
}

/// Issue 36 / ADR 0106 §2, over HTTPS with the backups live in the API server: an
/// etcd-restore from a store inside the cluster (a Service name, or an address in the
/// cluster's pod or service ranges) is refused with the seed's words; one from a store
/// outside is allowed with the rules' warning saying it is done by hand; one naming no
/// backup is refused saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_restore_from_a_store_inside_the_cluster_is_refused_at_admission() {
    let h = harness("restore-in-cluster", Duration::from_secs(2)).await;
    three_control_planes(&h).await;
    h.api
        .insert(backup("in-svc", "http://minio.minio.svc:9000"));
    h.api.insert(backup("in-ip", "http://10.96.4.4:9000"));
    h.api
        .insert(backup("outside", "https://s3.backup.example.org"));
    let restore = |backup: &str| {
        let mut op = operation("restore-1", "etcd-restore", None);
        op["spec"]["backupRef"] = json!({"name": backup});
        op
    };
    for (i, name) in ["in-svc", "in-ip"].into_iter().enumerate() {
        let op = restore(name);
        let uid = format!("u-r{i}");
        let r = review(
            &h,
            &objects::review(&uid, "CREATE", None, Some(&op)).build(),
        )
        .await;
        assert_eq!(r["response"]["allowed"], false, "{name}: {r}");
        let message = r["response"]["status"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains(&format!("from TalosEtcdBackup {name} would deadlock"))
                && message
                    .contains("the backup store must live outside the cluster being restored"),
            "{name}: {message}"
        );
    }
    let op = restore("outside");
    let r = review(
        &h,
        &objects::review("u-ok", "CREATE", None, Some(&op)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    let warnings = r["response"]["warnings"].to_string();
    assert!(
        warnings.contains("this operator does not run an etcd restore itself")
            && warnings.contains("docs/operators.md"),
        "{r}"
    );
    let op = restore("nowhere");
    let r = review(
        &h,
        &objects::review("u-no", "CREATE", None, Some(&op)).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    assert!(
        r["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.backupRef.name \"nowhere\" names none")),
        "{r}"
    );
}

/// An AdmissionReview nested 60,000 levels deep (120 KB) is a 400 at once, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_review_is_refused_at_once() {
    let h = harness("deep", Duration::from_secs(2)).await;
    let body = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}1{}}}"#,
        "[".repeat(60_000),
        "]".repeat(60_000)
    );
    let started = std::time::Instant::now();
    let (status, bytes, _) = https(
        &h,
        "POST",
        "/validate/talosoperations",
        "application/json",
        body.into_bytes(),
    )
    .await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&bytes));
    let v: Value = serde_json::from_slice(&bytes).expect("a JSON error");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("nested more than 128 levels deep")),
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

/// A writer the test reads back: what a decision-record sink received.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }

    /// Waits until the record of decision `id` was written, and returns it.
    async fn record(&self, id: &str) -> records::Record {
        for _ in 0..200 {
            let log = records::read_log(&self.text()).expect("the log parses");
            if let Some(r) = log.into_iter().find(|r| r.id == id) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no record of decision {id} in:\n{}", self.text());
    }
}

/// The annotations the Kubernetes audit log gets with the answer.
fn annotation<'a>(r: &'a Value, key: &str) -> &'a str {
    r["response"]["auditAnnotations"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no audit annotation {key}: {r}"))
}

/// A TalosConfigPatch review, as the API server sends it to `/validate/talosconfigpatches`.
async fn review_patch(h: &Harness, uid: &str, patch: &Value) -> Value {
    let body = objects::review(uid, "CREATE", None, Some(patch)).build();
    let (status, bytes, _) = https(
        h,
        "POST",
        "/validate/talosconfigpatches",
        "application/json",
        serde_json::to_vec(&body).expect("json"),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).expect("an AdmissionReview")
}

/// A TalosConfigPatch of cluster `prod` selecting its control planes.
fn control_plane_patch(name: &str, strategic: &str) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosConfigPatch",
        "metadata": {"name": name, "namespace": "infra"},
        "spec": {"clusterRef": {"name": "prod"}, "selector": {"role": "controlplane"},
                 "patches": {"strategic": strategic}}
    })
}

/// A refusal over HTTPS: its answer names the deciding rule, the decision id and the rules'
/// digest for the audit log; its record holds every fact the rows read with its value and
/// the objects (and resourceVersions) it came from; decided again from those facts with
/// the same rules it gives the same verdict; no Secret's value is in any record; and
/// `replay` with an edited rule set reports exactly the one decision the edit changes.
///
/// The webhook reads no Secret: what it reads that a Secret's values were derived from is
/// the base the controller publishes, redacted, in the TalosCluster's status (from the
/// Secret `spec.baseConfigSecretRef` names), which a TalosConfigPatch's dry render reads.
/// So the records grepped include such a decision (its `patch.error` is the render of that
/// base), the Secret's values are grepped as they would leak (decoded, and as stored), and
/// a positive control shows a value reaching `patch.error` on that path is found by the
/// same grep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_recorded_and_replays() {
    use base64::Engine;
    use ichor_rules::runtime::render::Base;
    let captured = Captured::default();
    let h = harness_with(
        "records",
        Duration::from_secs(2),
        Some((records::Sink::Writer(Box::new(captured.clone())), 64)),
        Vec::new(),
    )
    .await;
    // The base Secret, each of its secret values carrying MARKER; the cluster names it and
    // carries the base as the controller publishes it (redacted, `Base::redacted`).
    const MARKER: &str = "ICHOR-SECRET-MARKER-records-5d1e";
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let (cp_yaml, worker_yaml) = (
        include_str!("fixtures/talos/controlplane.yaml").replace("SECRET-BASE", MARKER),
        include_str!("fixtures/talos/worker.yaml").replace("SECRET-BASE", MARKER),
    );
    h.api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-base", "namespace": "infra"},
        "data": {"controlplane.yaml": b64(&cp_yaml), "worker.yaml": b64(&worker_yaml)}
    }));
    let base = Base::parse(&cp_yaml, &worker_yaml, true).expect("the base");
    let (cp_redacted, worker_redacted) = base.redacted().texts().expect("redacted");
    assert!(!cp_redacted.contains(MARKER) && !worker_redacted.contains(MARKER));
    let mut prod = cluster("prod", 3);
    prod["spec"]["baseConfigSecretRef"] = json!({"name": "prod-base"});
    prod["status"] = json!({"redactedBase": {
        "digest": base.digest, "controlplane": cp_redacted, "worker": worker_redacted}});
    h.api.insert(prod);
    for (i, at) in [
        "2026-10-01T00:00:00Z",
        "2026-10-02T00:00:00Z",
        "2026-10-03T00:00:00Z",
    ]
    .iter()
    .enumerate()
    {
        h.api
            .insert(machine(&format!("cp-{}", i + 1), "controlplane", true, at));
    }
    const SECRET_VALUE: &str = "secret-talosconfig-value";
    const SECRET: &str = "c2VjcmV0LXRhbG9zY29uZmlnLXZhbHVl";
    assert_eq!(b64(SECRET_VALUE), SECRET);
    h.api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-talosconfig", "namespace": "infra"},
        "data": {"talosconfig": SECRET}
    }));
    let stored = |kind: &str, name: &str| {
        h.api
            .objects(kind, Some("infra"))
            .into_iter()
            .find(|o| o["metadata"]["name"] == name)
            .expect("stored")
    };
    let live = |kind: &str, name: &str| records::ObjectRef {
        kind: kind.to_string(),
        name: name.to_string(),
        resource_version: stored(kind, name)["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string),
    };
    // The old object as the API server sends it: the stored one, resourceVersion and all.
    let cp3 = stored("TalosMachine", "cp-3");
    let r = review(
        &h,
        &objects::review("u-1", "DELETE", Some(&cp3), None).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    assert_eq!(annotation(&r, "deciding-rules"), "declared-count");
    let files = ichor_rules::ruleset::read_sources(&[h.dir.join("rules")]).expect("rules");
    let digest = records::digest(&files);
    assert_eq!(annotation(&r, "rules-digest"), digest);
    let id = annotation(&r, "decision-id").to_string();
    assert_eq!(id.len(), 32, "{id}");
    // The same digest in /readyz.
    let (status, body, _) = https(&h, "GET", "/readyz", "text/plain", Vec::new()).await;
    assert_eq!(status, 200);
    let ready = String::from_utf8_lossy(&body).into_owned();
    assert!(ready.contains(&format!("rules {digest}")), "{ready}");

    let rec = captured.record(&id).await;
    assert_eq!(rec.site, "webhook");
    assert_eq!(rec.verdict, "refuse");
    assert_eq!(rec.deciding, vec!["declared-count".to_string()]);
    assert_eq!(rec.rules.digest, digest);
    let request = rec.request.as_ref().expect("the request");
    assert_eq!(
        (request.uid.as_str(), request.operation.as_str()),
        ("u-1", "DELETE")
    );
    assert_eq!(
        (request.kind.as_str(), request.name.as_str()),
        ("TalosMachine", "cp-3")
    );
    let remove_cp = rec
        .events
        .iter()
        .find(|e| e.verb == "remove" && e.subject == "controlplane")
        .expect("the remove controlplane event");
    let fact = |name: &str| {
        remove_cp
            .facts
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no fact {name} in {remove_cp:?}"))
    };
    assert_eq!(fact("approved").value, json!(3));
    assert_eq!(fact("count").value, json!(3));
    assert_eq!(fact("member.dead").value, json!(false));
    // Where they came from: the three machines counted, and the cluster, by resourceVersion.
    // A fact's `from` indexes the event's objects, each listed once.
    let from = |name: &str| -> Vec<records::ObjectRef> {
        fact(name)
            .from
            .iter()
            .map(|&i| remove_cp.objects[i as usize].clone())
            .collect()
    };
    let mut objects = remove_cp.objects.clone();
    objects.sort();
    objects.dedup();
    assert_eq!(objects.len(), remove_cp.objects.len(), "each object once");
    let approved_from = &from("approved");
    assert_eq!(approved_from.len(), 3, "{approved_from:?}");
    for m in ["cp-1", "cp-2", "cp-3"] {
        assert!(
            approved_from.contains(&live("TalosMachine", m)),
            "{approved_from:?}"
        );
    }
    assert!(approved_from.iter().all(|o| o.resource_version.is_some()));
    assert_eq!(from("machine"), vec![live("TalosMachine", "cp-3")]);
    assert_eq!(from("count"), vec![live("TalosCluster", "prod")]);
    let matched = &remove_cp.matched;
    assert!(
        matched
            .iter()
            .any(|m| m.rule == "declared-count" && m.verdict == "refuse" && m.mode == "enforce"),
        "{matched:?}"
    );
    assert!(rec.latency_us > 0);
    // The same rules, the recorded facts: the same decision.
    let table = h.rules.current().expect("rules");
    let again = records::replay(&table, &rec).expect("replays");
    assert_eq!(again, records::Replayed::of_record(&rec));
    assert_eq!(again.verdict, "refuse");

    // Two more decisions: an approval 3 -> 4 (allowed, warned) and a fifth (refused by
    // another rule).
    let pending = machine("cp-4", "controlplane", false, "2026-10-04T00:00:00Z");
    let approved = machine("cp-4", "controlplane", true, "2026-10-04T00:00:00Z");
    let r2 = review(
        &h,
        &objects::review("u-2", "UPDATE", Some(&pending), Some(&approved)).build(),
    )
    .await;
    assert_eq!(r2["response"]["allowed"], true, "{r2}");
    h.api.insert(approved);
    let fifth = machine("cp-5", "controlplane", true, "2026-10-05T00:00:00Z");
    let r3 = review(
        &h,
        &objects::review("u-3", "CREATE", None, Some(&fifth)).build(),
    )
    .await;
    assert_eq!(r3["response"]["allowed"], false, "{r3}");
    captured.record(annotation(&r3, "decision-id")).await;
    // A patch the dry render refuses: its decision read the base derived from the Secret.
    const API_SERVER_PATCH: &str = "version: v1alpha1\ncluster:\n  apiServer:\n    extraArgs:\n      feature-gates: Foo=true\n";
    let r4 = review_patch(&h, "u-4", &control_plane_patch("api", API_SERVER_PATCH)).await;
    assert_eq!(r4["response"]["allowed"], false, "{r4}");
    assert_eq!(annotation(&r4, "deciding-rules"), "patch-breaks-render");
    let patched = captured.record(annotation(&r4, "decision-id")).await;
    let error = patched
        .events
        .iter()
        .flat_map(|e| &e.facts)
        .find(|f| f.name == "patch.error")
        .unwrap_or_else(|| panic!("no patch.error in {patched:?}"));
    assert!(
        error.value.as_str().is_some_and(|e| e.contains(
            "kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)"
        )),
        "the render of the published base: {error:?}"
    );
    let log_text = captured.text();
    assert_eq!(records::read_log(&log_text).expect("the log").len(), 4);
    for (leak, what) in [
        (MARKER, "a value of the base Secret"),
        (SECRET_VALUE, "a Secret's value"),
        (SECRET, "a Secret's value as stored"),
        ("prod-talosconfig", "a Secret's name"),
        ("prod-base", "a Secret's name"),
    ] {
        assert!(!log_text.contains(leak), "{what} in a record: {log_text}");
    }
    let log = h.dir.join("decisions.ndjson");
    std::fs::write(&log, &log_text).expect("log");

    let replay = |rules: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
            .arg("replay")
            .arg(&log)
            .arg("--rules")
            .arg(rules)
            .args(["--format", "json"])
            .output()
            .expect("runs");
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), report)
    };
    // The rules that decided: every decision reproduced.
    let (code, report) = replay(&h.dir.join("rules"));
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["decisions"], 4, "{report}");
    assert_eq!(report["reproduced"], 4, "{report}");
    assert_eq!(report["mismatches"], json!([]));
    // Under its own rules, a record must reproduce: one whose verdict was edited, or one
    // missing a fact its rules read, is a failure (exit 1), never "cannot replay" and 0.
    let tamper = |name: &str, edit: &dyn Fn(&mut Value)| -> std::path::PathBuf {
        let mut out = String::new();
        for line in log_text.lines() {
            match serde_json::from_str::<Value>(line) {
                Ok(mut v) if v["record"] == "decision" && v["verdict"] == "refuse" => {
                    edit(&mut v);
                    out.push_str(&v.to_string());
                }
                _ => out.push_str(line),
            }
            out.push('\n');
        }
        let path = h.dir.join(name);
        std::fs::write(&path, out).expect("log");
        path
    };
    let run = |log: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
            .arg("replay")
            .arg(log)
            .arg("--rules")
            .arg(h.dir.join("rules"))
            .output()
            .expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let flipped = tamper("flipped.ndjson", &|v| v["verdict"] = json!("allow"));
    let (code, said) = run(&flipped);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains(&format!("MISMATCH {id}")), "{said}");
    let factless = tamper("factless.ndjson", &|v| {
        for e in v["events"].as_array_mut().into_iter().flatten() {
            e["facts"] = json!([]);
        }
    });
    let (code, said) = run(&factless);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!("MISMATCH {id}: cannot be decided again")),
        "{said}"
    );
    // An edit that lets a removal down to one below the declared count through.
    let edited = h.dir.join("edited");
    std::fs::create_dir_all(&edited).expect("dir");
    for f in ["admission.rules", "removal.rules"] {
        let text = std::fs::read_to_string(h.dir.join("rules").join(f)).expect("read");
        let text = text.replacen(
            "refuse remove controlplane\n  when after < count\n",
            "refuse remove controlplane\n  when after < count - 1\n",
            1,
        );
        std::fs::write(edited.join(f), text).expect("write");
    }
    let (code, report) = replay(&edited);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["compared"], 4, "{report}");
    assert_eq!(
        report["changes"],
        json!([{
            "from": "refuse", "to": "allow", "would_from": "refuse", "would_to": "allow",
            "rule": "declared-count",
            "decisions": [{
                "id": id, "what": "DELETE TalosMachine infra/cp-3 (uid u-1)",
                "from": "refuse", "to": "allow", "would_from": "refuse", "would_to": "allow"
            }]
        }]),
        "{report}"
    );
    // Without --rules, a log decided by rules other than rules/ is an error saying so.
    let cwd = h.dir.join("cwd");
    std::fs::create_dir_all(cwd.join("rules")).expect("dir");
    for f in ["admission.rules", "removal.rules"] {
        std::fs::copy(edited.join(f), cwd.join("rules").join(f)).expect("copy");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .arg("replay")
        .arg(&log)
        .current_dir(&cwd)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("was decided by rules sha256:"), "{err}");

    // The positive control: a value that does reach `patch.error` on this path (a patch's
    // own `machine.type`, which its render error quotes) is in the record, verbatim, and the
    // grep above finds it: had the base's secret values reached the render, it would have.
    let control = format!("version: v1alpha1\nmachine:\n  type: {MARKER}\n");
    let r5 = review_patch(&h, "u-5", &control_plane_patch("control", &control)).await;
    assert_eq!(r5["response"]["allowed"], false, "{r5}");
    captured.record(annotation(&r5, "decision-id")).await;
    assert!(
        captured.text().contains(MARKER),
        "the grep misses a value the record holds: {}",
        captured.text()
    );
}

/// A sink that never finishes a write: decisions are answered all the same, and the
/// records that do not fit the queue are dropped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_sink_drops_records_without_slowing_decisions() {
    struct Stuck(Arc<std::sync::atomic::AtomicBool>);
    impl std::io::Write for Stuck {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            while !self.0.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let h = harness_with(
        "stuck-sink",
        Duration::from_secs(2),
        Some((records::Sink::Writer(Box::new(Stuck(release.clone()))), 2)),
        Vec::new(),
    )
    .await;
    three_control_planes(&h).await;
    let cp3 = machine("cp-3", "controlplane", true, "2026-10-03T00:00:00Z");
    let started = std::time::Instant::now();
    let (mut named, mut unnamed) = (0, 0);
    for i in 0..12 {
        let r = review(
            &h,
            &objects::review(&format!("u-{i}"), "DELETE", Some(&cp3), None).build(),
        )
        .await;
        assert_eq!(r["response"]["allowed"], false);
        // The answer names its decision only when a log will hold the record; a dropped
        // one says so, its rules still named.
        let notes = &r["response"]["auditAnnotations"];
        assert_eq!(notes["deciding-rules"], "declared-count", "{r}");
        match (notes.get("decision-id"), notes["decision-record"].as_str()) {
            (Some(_), None) => named += 1,
            (None, Some(why)) if why.starts_with("dropped") => unnamed += 1,
            _ => panic!("{r}"),
        }
    }
    assert_eq!((named, unnamed), (3, 9));
    // Each decision took what it takes without records (the writer never returned).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let m = h.metrics.render();
    let dropped: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("ichor_rules_decision_records_total{outcome=\"dropped\"} "))
        .and_then(|v| v.parse().ok())
        .expect("the dropped counter");
    // One record in the writer, two queued: the other nine dropped.
    assert_eq!(dropped, 9.0, "{m}");
    release.store(true, Ordering::SeqCst);
}

/// A rule in audit mode, switched by the deployment (what the chart's `rules.audit` passes
/// as `--audit-rule`) or written so in the text: the delete it would refuse is allowed, its
/// would-be refusal is counted by rule and recorded with its mode, and the audit log's
/// annotations name it; switched back to enforce (`--enforce-rule` over the text's
/// `audit`), it refuses again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_rule_never_refuses_but_is_counted_and_recorded() {
    let captured = Captured::default();
    let h = harness_with(
        "audit-mode",
        Duration::from_secs(2),
        Some((records::Sink::Writer(Box::new(captured.clone())), 64)),
        vec![("declared-count".into(), true)],
    )
    .await;
    three_control_planes(&h).await;
    let cp3 = machine("cp-3", "controlplane", true, "2026-10-03T00:00:00Z");
    for uid in ["u-1", "u-2"] {
        let r = review(
            &h,
            &objects::review(uid, "DELETE", Some(&cp3), None).build(),
        )
        .await;
        assert_eq!(r["response"]["allowed"], true, "{r}");
        assert_eq!(annotation(&r, "audit-rules-matched"), "declared-count");
        assert!(
            r["response"]["auditAnnotations"]
                .get("deciding-rules")
                .is_none()
        );
        let rec = captured.record(annotation(&r, "decision-id")).await;
        assert_eq!(rec.verdict, "allow");
        assert_eq!(rec.would_verdict, "refuse");
        assert_eq!(rec.rules.audit, vec!["declared-count".to_string()]);
        let matched: Vec<_> = rec.events.iter().flat_map(|e| &e.matched).collect();
        assert!(
            matched
                .iter()
                .any(|m| m.rule == "declared-count" && m.verdict == "refuse" && m.mode == "audit"),
            "{matched:?}"
        );
        // Replayed with the recorded modes, the same.
        let table = h.rules.current().expect("rules");
        assert_eq!(
            records::replay(&table, &rec).expect("replays"),
            records::Replayed::of_record(&rec)
        );
    }
    let m = h.metrics.render();
    assert!(
        m.contains("ichor_rules_would_refuse_total{rule=\"declared-count\"} 2"),
        "{m}"
    );
    assert!(
        !m.contains("rule=\"declared-count\",verdict=\"refuse\""),
        "{m}"
    );

    // Written `audit` in the text, enforced by the deployment: it refuses.
    let h2 = harness_with(
        "audit-enforced",
        Duration::from_secs(2),
        None,
        vec![("declared-count".into(), false)],
    )
    .await;
    let removal = h2.dir.join("rules").join("removal.rules");
    let text = std::fs::read_to_string(&removal).expect("read");
    assert!(text.contains("rule declared-count\n"));
    std::fs::write(
        &removal,
        text.replacen("rule declared-count\n", "rule declared-count audit\n", 1),
    )
    .expect("write");
    assert!(matches!(h2.rules.reload(), Reload::Replaced { .. }));
    let table = h2.rules.current().expect("rules");
    let rule = table
        .rules
        .iter()
        .find(|r| r.name == "declared-count")
        .expect("the rule");
    assert!(!rule.audit, "enforced by the deployment");
    three_control_planes(&h2).await;
    let r = review(
        &h2,
        &objects::review("u-3", "DELETE", Some(&cp3), None).build(),
    )
    .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    assert_eq!(annotation(&r, "deciding-rules"), "declared-count");
}
