//! Secret contents never reach the logs (issue 33, item 5): `ichor-rules serve`, as its own
//! process against the in-process API server, is fed its Secrets in every way they can be
//! wrong (a data value that is not base64, fields of the wrong type, missing keys,
//! unparseable PEM, an unparseable talosconfig) and its whole stderr, at debug level and
//! with the kube client's own lines on, is searched for a marker planted in the key
//! material: as text, as base64 (the form a Secret's JSON carries it in) and as the list
//! of byte values a Rust `{:?}` would print.

use crate::support::apiserver;
use crate::support::controller as harness;
use crate::support::https;
use crate::support::objects;

use apiserver::ApiServer;
use base64::Engine as _;
use harness::{NS, condition, control_plane, delete, events, get, has_finalizer, wait_for};
use ichor_rules::runtime::certs::{self, CertSettings};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ichor-rules");
const MARKER: &str = "ICHOR-SECRET-MARKER-7f3a9c51e2";
const OPERATOR_NS: &str = "ichor-system";
const TLS_SECRET: &str = "guard-ichor-rules-tls";
const WAIT: Duration = Duration::from_secs(40);

fn b64(bytes: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("secret-logs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Every form the marker could take in a log line: the text, its base64 at each of the
/// three alignments (the characters that depend on the marker alone), its bytes as `{:?}`
/// prints them.
fn marker_forms() -> Vec<String> {
    let mut forms = vec![MARKER.to_string()];
    for pad in 0..3 {
        let mut bytes = vec![b'x'; pad];
        bytes.extend_from_slice(MARKER.as_bytes());
        let encoded = b64(&bytes);
        // The first 4 characters may mix in the padding, the last 4 the end.
        forms.push(encoded[4..encoded.len() - 4].to_string());
    }
    let decimal = format!("{:?}", MARKER.as_bytes());
    forms.push(decimal.trim_matches(|c| c == '[' || c == ']').to_string());
    forms
}

fn assert_no_marker(what: &str, text: &str) {
    for form in marker_forms() {
        assert!(
            !text.contains(&form),
            "{what} shows the Secret's content ({form}):\n{text}"
        );
    }
    assert!(!text.contains("panicked"), "{what}: a panic:\n{text}");
}

/// `serve` with stderr in `log`, at debug level with the kube client's lines on.
fn serve(api: &ApiServer, log: &Path, args: &[&str]) -> https::Killed {
    https::Killed(
        Command::new(BIN)
            .args(["serve", "--rules", "rules", "--api-server", &api.url()])
            .args([
                "--lease-namespace",
                OPERATOR_NS,
                "--reload-interval-ms",
                "100",
            ])
            .args(["--log-format", "text"])
            .args(args)
            .env("RUST_LOG", "debug,kube_client=trace")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(log).expect("log file")))
            .spawn()
            .expect("serve starts"),
    )
}

/// GETs of Secret `namespace/name` by the code under test, counted from the request log
/// (which this takes).
fn secret_reads(api: &ApiServer, namespace: &str, name: &str) -> usize {
    let path = format!("/api/v1/namespaces/{namespace}/secrets/{name}");
    api.store
        .faults
        .take_log()
        .iter()
        .filter(|r| r.method == "GET" && !r.by_test && r.path == path)
        .count()
}

/// Waits until the code has read Secret `namespace/name` `n` more times (or `child`
/// exited), so the answers of the fault now set have been handled.
async fn wait_reads(
    api: &ApiServer,
    child: &mut https::Killed,
    namespace: &str,
    name: &str,
    n: usize,
    log: &Path,
) {
    let _ = secret_reads(api, namespace, name);
    let mut seen = 0;
    for _ in 0..400 {
        seen += secret_reads(api, namespace, name);
        if seen >= n || !matches!(child.0.try_wait(), Ok(None)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "Secret {namespace}/{name} was read {seen} times, not {n}:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// A PEM block whose BEGIN line is malformed and carries the marker (the PEM parser's own
/// error quotes that line).
fn bad_pem(label: &str) -> String {
    format!("-----BEGIN {label} {MARKER}\nAAAA\n-----END {label}-----\n")
}

/// `serve --tls-secret` meets its certificate Secret broken in each way: at start (PEM
/// it cannot parse, behind annotations that say all is well), then while it runs, each
/// fault of the API server's answer in turn (a data value that is not base64, a value
/// that is not a string, `data` that is not a map, the certificate and key missing with
/// the CA key left). Whatever it does about them, no log line carries the key material.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_certificate_secret_never_reaches_the_logs() {
    let api = ApiServer::start().await;
    let dir = scratch("webhook");
    let names = CertSettings::service_names("guard-ichor-rules", OPERATOR_NS);
    let far = "2099-01-01T00:00:00Z";
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": TLS_SECRET, "namespace": OPERATOR_NS, "annotations": {
            certs::NOT_AFTER: far, certs::CA_NOT_AFTER: far,
            certs::DNS_NAMES: names.join(","),
        }},
        "type": "kubernetes.io/tls",
        "data": {
            "ca.crt": b64(bad_pem("CERTIFICATE")), "ca.key": b64(bad_pem("PRIVATE KEY")),
            "tls.crt": b64(bad_pem("CERTIFICATE")), "tls.key": b64(bad_pem("PRIVATE KEY")),
        }
    }));
    let args = [
        "--no-controller",
        "--tls-secret",
        TLS_SECRET,
        "--service-name",
        "guard-ichor-rules",
    ];
    let listen = https::free_address().to_string();
    let start = |log: &Path| {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--listen", listen.as_str()]);
        serve(&api, log, &a)
    };
    // At start.
    let log = dir.join("start.log");
    let mut child = start(&log);
    wait_reads(&api, &mut child, OPERATOR_NS, TLS_SECRET, 2, &log).await;
    drop(child);
    let text = std::fs::read_to_string(&log).expect("log");
    assert_no_marker("serve, starting on unparseable PEM", &text);

    // While running: a Secret of its own making first (the broken one deleted), then
    // each fault of the answer.
    {
        use k8s_openapi::api::core::v1::Secret;
        kube::Api::<Secret>::namespaced(api.test_client(), OPERATOR_NS)
            .delete(TLS_SECRET, &Default::default())
            .await
            .expect("delete the Secret");
    }
    let log = dir.join("running.log");
    let mut child = start(&log);
    let faults: Vec<(&str, Value)> = vec![
        (
            "a value that is not base64",
            json!({"ca.key": format!("{MARKER}!!")}),
        ),
        (
            "a value that is not a string",
            json!({"tls.key": {MARKER: 1}}),
        ),
        ("a list", json!({"tls.key": [b64(MARKER)]})),
        ("data that is not a map", json!(MARKER)),
        (
            "missing keys",
            json!({"ca.key": b64(format!("{MARKER}{}", bad_pem("PRIVATE KEY")))}),
        ),
        (
            "unparseable PEM",
            json!({"ca.crt": b64(bad_pem("CERTIFICATE")), "ca.key": b64(bad_pem("PRIVATE KEY")),
                   "tls.crt": b64(bad_pem("CERTIFICATE")), "tls.key": b64(bad_pem("PRIVATE KEY"))}),
        ),
    ];
    for (what, data) in faults {
        api.store.faults.rewrite_answers(
            Some(&format!("/secrets/{TLS_SECRET}")),
            move |secret: &mut Value| match (&data, secret.get_mut("data")) {
                (Value::Object(d), Some(Value::Object(stored))) if what != "missing keys" => {
                    for (k, v) in d {
                        stored.insert(k.clone(), v.clone());
                    }
                }
                _ => secret["data"] = data.clone(),
            },
        );
        wait_reads(&api, &mut child, OPERATOR_NS, TLS_SECRET, 3, &log).await;
        assert!(
            matches!(child.0.try_wait(), Ok(None)),
            "serve keeps running through {what}:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    api.store.faults.stop_rewriting();
    drop(child);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        text.contains("serving the admission webhook"),
        "it served:\n{text}"
    );
    assert_no_marker("serve, its Secret's answers broken", &text);
}

fn removal_message(api: &ApiServer) -> String {
    get(api, "TalosMachine", "cp-4")
        .and_then(|m| condition(&m, "Removal"))
        .and_then(|c| c["message"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Waits until the Removal condition of cp-4 says `said`.
async fn wait_said(api: &ApiServer, log: &Path, said: &str) {
    for _ in 0..400 {
        if removal_message(api).contains(said) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the Removal condition never said {said:?}: {}
log:
{}",
        removal_message(api),
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// Makes the controller reconcile cp-4 again (a label changes).
async fn touch(api: &ApiServer, n: usize) {
    use ichor_rules::runtime::objects::TalosMachine;
    use kube::api::{Api, Patch, PatchParams};
    Api::<TalosMachine>::namespaced(api.test_client(), NS)
        .patch(
            "cp-4",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"touched": n.to_string()}}})),
        )
        .await
        .expect("touch cp-4");
}

async fn store_talosconfig(api: &ApiServer, talosconfig: &str) {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, Patch, PatchParams};
    Api::<Secret>::namespaced(api.test_client(), NS)
        .patch(
            "prod-talos",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"talosconfig": b64(talosconfig)}})),
        )
        .await
        .expect("store the talosconfig");
}

/// The controller (`serve --no-webhook`) reads a cluster's talosconfig Secret for a
/// removal; each way the Secret is wrong is said in the Removal condition, and neither
/// the condition, the events nor a log line carries the Secret's content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talos_credentials_never_reach_the_logs() {
    let api = ApiServer::start().await;
    let dir = scratch("controller");
    api.insert(
        objects::cluster("prod", 3)
            .namespace(NS)
            .schedulable("true")
            .secret(json!({"name": "prod-talos"}))
            .build(),
    );
    for (i, n) in ["cp-1", "cp-2", "cp-3", "cp-4"].iter().enumerate() {
        api.insert(control_plane(n, u32::try_from(i).expect("small") + 1));
    }
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-talos", "namespace": NS},
        "type": "Opaque",
        "data": {"talosconfig": b64(format!("{MARKER}: [\n"))}
    }));
    let log = dir.join("controller.log");
    let steps = dir.join("steps.ndjson");
    let steps_arg = steps.to_str().expect("utf-8 path").to_string();
    let child = serve(
        &api,
        &log,
        &[
            "--no-webhook",
            "--identity",
            "controller-0",
            "--step-log",
            &steps_arg,
        ],
    );
    wait_for("the finalizer", WAIT, || has_finalizer(&api, "cp-4")).await;
    delete(&api, "TalosMachine", "cp-4").await;
    wait_said(&api, &log, "is not YAML of the talosconfig shape").await;

    // Answers the API server would never give, rewritten on their way.
    let answers: Vec<(Value, &'static str)> = vec![
        (
            json!({"talosconfig": format!("{MARKER}!!")}),
            "is not base64",
        ),
        (json!({"talosconfig": {MARKER: 1}}), "is not a string"),
        (json!(MARKER), "data that is not a map"),
        (json!({"other": b64(MARKER)}), "has no key `talosconfig`"),
    ];
    for (n, (data, said)) in answers.into_iter().enumerate() {
        api.store
            .faults
            .rewrite_answers(Some("/secrets/prod-talos"), move |s: &mut Value| {
                s["data"] = data.clone();
            });
        touch(&api, n).await;
        wait_said(&api, &log, said).await;
    }
    api.store.faults.stop_rewriting();

    // Talosconfigs it cannot use, stored.
    let pki = rcgen::generate_simple_self_signed(vec!["talos".into()]).expect("cert");
    let cert = b64(pki.cert.pem());
    let stored: Vec<(String, &'static str)> = vec![
        (
            format!("context: {MARKER}\ncontexts: {{other: {{}}}}\n"),
            "has no context of the name",
        ),
        (
            format!(
                "context: {MARKER}\ncontexts:\n  {MARKER}: {{ca: \"{MARKER}!!\", crt: x, key: y}}\n"
            ),
            "`ca` of its current context is not base64",
        ),
        (
            format!(
                "context: a\ncontexts:\n  a: {{ca: {}, crt: {cert}, key: {cert}}}\n",
                b64(bad_pem("CERTIFICATE"))
            ),
            "ca: not a PEM certificate (a BEGIN line is malformed)",
        ),
        (
            format!(
                "context: a\ncontexts:\n  a: {{ca: {cert}, crt: {cert}, key: {}}}\n",
                b64(bad_pem("PRIVATE KEY"))
            ),
            "key: not a PEM private key (a BEGIN line is malformed)",
        ),
    ];
    for (n, (talosconfig, said)) in stored.into_iter().enumerate() {
        store_talosconfig(&api, &talosconfig).await;
        touch(&api, 100 + n).await;
        wait_said(&api, &log, said).await;
    }
    let msg = removal_message(&api);
    assert!(msg.contains("Secret infra/prod-talos"), "{msg}");
    assert_no_marker("the Removal condition", &msg);
    for e in events(&api, "cp-4", "NoTalosCredentials") {
        assert_no_marker("an event", &e.to_string());
    }
    drop(child);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        text.contains("NoTalosCredentials") || text.contains("reconcil"),
        "{text}"
    );
    assert_no_marker("the controller's log", &text);
    // The step log (`serve --step-log`) recorded the removal's credential failures, and
    // none of the Secret's content.
    let steps = std::fs::read_to_string(&steps).expect("the step log");
    assert!(steps.contains("\"op\":\"credentials\""), "{steps}");
    assert_no_marker("the step log", &steps);
}

/// Issue 36: a backup store's secret access key never reaches the output of `ichor-rules
/// backup download`, whatever fails (a store nobody answers at, a bucket that does not
/// exist, an object that is not there), at debug level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stores_secret_key_never_reaches_the_output_of_a_download() {
    let s3 = crate::support::s3::S3Server::start().await;
    s3.create_bucket("etcd").await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let dead = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let dir = scratch("download");
    for (i, (endpoint, bucket)) in [
        (dead.as_str(), "etcd"),
        (s3.endpoint().as_str(), "no-such-bucket"),
        (s3.endpoint().as_str(), "etcd"),
    ]
    .into_iter()
    .enumerate()
    {
        let out = Command::new(BIN)
            .args([
                "backup",
                "download",
                "--endpoint",
                endpoint,
                "--bucket",
                bucket,
            ])
            .args(["--key", "prod/missing.snapshot", "--out"])
            .arg(dir.join(format!("{i}.snapshot")))
            .env("RUST_LOG", "debug")
            .env("AWS_ACCESS_KEY_ID", "AKIAICHORTEST")
            .env("AWS_SECRET_ACCESS_KEY", MARKER)
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{endpoint} {bucket}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert_no_marker("download stderr", &stderr);
        assert_no_marker("download stdout", &String::from_utf8_lossy(&out.stdout));
    }
}

/// Issue 37: the cluster's base configuration (its PKI and tokens) is read by the
/// controller (`serve --no-webhook`) and published redacted in the TalosCluster's status for
/// the webhook; neither that status, the BaseConfig condition (also when the base does not
/// read), nor a log line carries a secret value of the base.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_base_configuration_never_reaches_the_logs_or_the_status() {
    use ichor_rules::runtime::render::Base;
    let api = ApiServer::start().await;
    let dir = scratch("base");
    let fixture = |f: &str| {
        std::fs::read_to_string(format!("tests/fixtures/talos/{f}"))
            .expect("fixture")
            .replace("SECRET-BASE", MARKER)
    };
    let (cp, w) = (fixture("controlplane.yaml"), fixture("worker.yaml"));
    let mut cluster = objects::cluster("prod", 3)
        .namespace(NS)
        .schedulable("true")
        .build();
    cluster["spec"]["baseConfigSecretRef"] = json!({"name": "prod-base"});
    api.insert(cluster);
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-base", "namespace": NS},
        "type": "Opaque",
        "data": {"controlplane.yaml": b64(&cp), "worker.yaml": b64(&w)}
    }));
    let log = dir.join("controller.log");
    let child = serve(&api, &log, &["--no-webhook", "--identity", "controller-0"]);
    let digest = Base::parse(&cp, &w, true).expect("the base reads").digest;
    wait_for("the redacted base", WAIT, || {
        get(&api, "TalosCluster", "prod")
            .is_some_and(|c| c["status"]["redactedBase"]["digest"] == json!(digest))
    })
    .await;
    let c = get(&api, "TalosCluster", "prod").expect("prod");
    assert_no_marker("the TalosCluster", &c.to_string());
    let published = c["status"]["redactedBase"]["controlplane"]
        .as_str()
        .expect("text");
    assert!(published.contains("https://10.0.0.10:6443"), "{published}");
    assert_eq!(
        condition(&c, "BaseConfig").map(|c| c["reason"].clone()),
        Some(json!("Published"))
    );
    // A base that does not read (the marker on the broken line): said, without content.
    {
        use k8s_openapi::api::core::v1::Secret;
        use kube::api::{Api, Patch, PatchParams};
        Api::<Secret>::namespaced(api.test_client(), NS)
            .patch(
                "prod-base",
                &PatchParams::default(),
                &Patch::Merge(&json!({"data": {"controlplane.yaml": b64(format!("{cp}\nmachine: [{MARKER}\n"))}})),
            )
            .await
            .expect("store the broken base");
        use ichor_rules::runtime::objects::TalosCluster;
        Api::<TalosCluster>::namespaced(api.test_client(), NS)
            .patch(
                "prod",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"labels": {"touched": "1"}}})),
            )
            .await
            .expect("touch the cluster");
    }
    wait_for("BaseInvalid", WAIT, || {
        get(&api, "TalosCluster", "prod")
            .and_then(|c| condition(&c, "BaseConfig"))
            .is_some_and(|c| c["reason"] == "BaseInvalid")
    })
    .await;
    let c = get(&api, "TalosCluster", "prod").expect("prod");
    let msg = condition(&c, "BaseConfig").expect("BaseConfig")["message"].to_string();
    assert!(
        msg.contains("controlplane.yaml") && msg.contains("line"),
        "{msg}"
    );
    assert_no_marker("the TalosCluster after a bad base", &c.to_string());
    drop(child);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("reconcil"), "{text}");
    assert_no_marker("the controller's log", &text);
}

/// Issue 37, end to end: the controller (`serve --no-webhook`) configures a new cluster's
/// control planes from a base carrying the marker in every secret value, bootstraps it,
/// stages a change that needs a reboot and starts the roll; the marker reaches the nodes
/// (as it must) and no log line, Event, status of any object, or metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_configuration_leaves_no_secret_in_logs_events_statuses_or_metrics() {
    use crate::support::etcd::EtcdCluster;
    use crate::support::talos::TalosApi;
    let talos = TalosApi::start(EtcdCluster::unstarted(&["cp-1", "cp-2", "cp-3"])).await;
    let api = ApiServer::start().await;
    let dir = scratch("apply");
    let ca = https::write_cert(&dir);
    let fixture = |f: &str| {
        std::fs::read_to_string(format!("tests/fixtures/talos/{f}"))
            .expect("fixture")
            .replace("SECRET-BASE", MARKER)
    };
    let mut cluster = objects::cluster("prod", 3)
        .namespace(NS)
        .schedulable("true")
        .secret(json!({"name": "prod-talos"}))
        .build();
    cluster["spec"]["baseConfigSecretRef"] = json!({"name": "prod-base"});
    api.insert(cluster);
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-talos", "namespace": NS},
        "type": "Opaque",
        "data": {"talosconfig": b64(talos.talosconfig_yaml())}
    }));
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-base", "namespace": NS},
        "type": "Opaque",
        "data": {"controlplane.yaml": b64(fixture("controlplane.yaml")),
                 "worker.yaml": b64(fixture("worker.yaml"))}
    }));
    for i in 0..3 {
        let mut m = control_plane(&format!("cp-{}", i + 1), u32::try_from(i).unwrap() + 1);
        m["spec"]["endpoint"] = json!(talos.node(i).endpoint());
        api.insert(m);
    }
    let log = dir.join("controller.log");
    let metrics = https::free_address();
    let metrics_arg = metrics.to_string();
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let child = serve(
        &api,
        &log,
        &[
            "--no-webhook",
            "--identity",
            "controller-0",
            "--metrics-listen",
            &metrics_arg,
            "--metrics-insecure",
            "--tls-cert",
            crt.to_str().expect("utf-8"),
            "--tls-key",
            key.to_str().expect("utf-8"),
        ],
    );
    wait_for("configured and bootstrapped", WAIT, || {
        (0..3).all(|i| talos.node(i).config().is_some_and(|c| c.contains(MARKER)))
            && get(&api, "TalosCluster", "prod")
                .is_some_and(|c| c["status"]["bootstrap"]["confirmed"] == true)
    })
    .await;
    // A change that needs a reboot: staged, and the roll created.
    api.insert(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosConfigPatch",
        "metadata": {"name": "disk", "namespace": NS},
        "spec": {"clusterRef": {"name": "prod"}, "selector": {},
                 "patches": {"strategic": "version: v1alpha1\nmachine:\n  install:\n    disk: /dev/sdb\n"}}
    }));
    wait_for("the roll created", WAIT, || {
        !api.objects("TalosOperation", Some(NS)).is_empty()
    })
    .await;
    let (mut send, _) = https::connect(metrics, &ca).await;
    let (code, body) = https::request(
        &mut send,
        "GET",
        "/metrics",
        "text/plain",
        hyper::body::Bytes::new(),
    )
    .await;
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("TalosMachine"), "{body}");
    assert_no_marker("the metrics", &body);
    for kind in ["TalosCluster", "TalosMachine", "TalosOperation", "Event"] {
        for o in api.objects(kind, None) {
            assert_no_marker(kind, &o.to_string());
        }
    }
    assert!(!events(&api, "prod", "Bootstrapped").is_empty());
    drop(child);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("configuration applied"), "{text}");
    assert!(text.contains("bootstrapped"), "{text}");
    // The decision records share the log (`--decision-log` is stderr by default): the
    // search above covers them only if there are some. The bootstrap was decided by the
    // rules, and recorded with the facts it read.
    let records: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("{\"record\":"))
        .collect();
    assert!(
        records
            .iter()
            .any(|l| l.contains("\"record\":\"decision\"") && l.contains("\"site\":\"controller\"")),
        "no controller decision record in the log:\n{text}"
    );
    assert!(
        records.iter().any(|l| l.contains("\"verb\":\"bootstrap\"")),
        "no record of the bootstrap's decision:\n{}",
        records.join("\n")
    );
    assert_no_marker("the controller's log", &text);
}
