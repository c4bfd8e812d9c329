//! The seed ADRs' cases (0010, 0054, 0106 §4, 0137) are the shipped rules' test suite:
//! `rules/tests/*.yaml`, readable by reviewers, run by `ichor-rules test` through the same
//! code as `eval`. This test runs the built binary on them (every case must pass), and
//! sends every admission case's AdmissionReview over HTTPS to the webhook, with the case's
//! objects written to the in-process API server (which the webhook reads live): its answer
//! must equal the one `ichor-rules test` decided offline, byte for byte.

use crate::support::apiserver;
use crate::support::https;

use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_ichor-rules");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `ichor-rules test rules/tests --format json`, run from the crate root.
fn report() -> &'static Value {
    static REPORT: OnceLock<Value> = OnceLock::new();
    REPORT.get_or_init(|| {
        let out = std::process::Command::new(BIN)
            .args([
                "test",
                "rules/tests",
                "--rules",
                "rules",
                "--format",
                "json",
            ])
            .current_dir(root())
            .output()
            .expect("the binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("a JSON report ({e}); stderr: {stderr}"));
        assert_eq!(
            out.status.code(),
            Some(0),
            "every seed case passes; failures: {:#}",
            json!(report["cases"].as_array().map(|c| {
                c.iter()
                    .filter(|c| c["status"] != json!("pass"))
                    .collect::<Vec<_>>()
            }))
        );
        report
    })
}

#[test]
fn every_seed_case_passes_through_ichor_rules_test() {
    let r = report();
    let cases = r["cases"].as_array().expect("cases");
    // The seed suite as moved out of this file: 149 decisions, over every ADR.
    assert!(cases.len() >= 149, "{} cases", cases.len());
    assert_eq!(r["failed"], json!(0));
    assert_eq!(r["passed"], json!(cases.len()));
    for c in cases {
        assert_eq!(c["status"], json!("pass"), "{c:#}");
        let verdict = &c["actual"]["verdict"];
        if verdict == &json!("refuse") || verdict == &json!("hold") {
            assert!(
                c["actual"]["rules"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty()),
                "decided by a rule: {c:#}"
            );
        }
    }
    for file in [
        "adr-0010-allow-delete",
        "adr-0010-quorum",
        "adr-0010-declared-count",
        "adr-0054-approval-cap",
        "adr-0054-last-worker",
        "adr-0054-over-cap-hold",
        "adr-0106-controller-removal",
        "adr-0137-operations",
        "adr-0137-parked-operations",
    ] {
        assert!(
            cases
                .iter()
                .any(|c| c["file"].as_str().is_some_and(|f| f.contains(file))),
            "{file}"
        );
    }
}

#[test]
fn the_webhook_over_https_answers_what_ichor_rules_test_decided() {
    let r = report();
    let mut checked = 0;
    for c in r["cases"].as_array().expect("cases") {
        if c["review"].is_null() {
            continue;
        }
        let objects = c["objects"].as_array().expect("objects");
        assert_eq!(
            webhook_answer(objects, &c["review"]),
            c["response"],
            "case {:?} ({}:{}): the webhook over HTTPS answers what `ichor-rules test` decided",
            c["name"],
            c["file"],
            c["line"]
        );
        checked += 1;
    }
    assert!(checked >= 100, "{checked} admission cases sent over HTTPS");
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
                // The cases that say `byController: true` are this user's.
                controller_username: Some(ichor_rules::cli::TEST_CONTROLLER_USERNAME.into()),
                records: None,
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
            &format!(
                "/validate/{}",
                review["request"]["resource"]["resource"]
                    .as_str()
                    .unwrap_or("talosmachines")
            ),
            "application/json",
            serde_json::to_vec(&review).expect("json").into(),
        )
        .await;
        assert_eq!(status, 200);
        let mut answer: Value = serde_json::from_slice(&bytes).expect("an AdmissionReview");
        // What the webhook adds for the audit log, and `eval` does not: the decision's
        // record (its id, or why there is none) and the rules' digest on every decision,
        // the refusing rules on a refusal.
        let notes = answer["response"]
            .as_object_mut()
            .and_then(|r| r.remove("auditAnnotations"));
        if let Some(notes) = notes {
            // This webhook keeps no records: no id to name, and the answer says why.
            assert!(notes.get("decision-id").is_none(), "{notes}");
            assert_eq!(
                notes["decision-record"], "off (--decision-log off)",
                "{notes}"
            );
            assert!(
                notes["rules-digest"]
                    .as_str()
                    .is_some_and(|d| d.starts_with("sha256:")),
                "{notes}"
            );
            assert_eq!(
                notes.get("deciding-rules").is_some(),
                answer["response"]["allowed"] == false,
                "{notes}"
            );
        }
        answer
    })
}
