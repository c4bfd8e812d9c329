//! Webhook round trip: HTTPS request -> live reads from the in-process API server ->
//! decision -> response, against `ichor-rules serve` running as its own process, with 10,
//! 100, 1,000 and 10,000 machines in the namespace. Prints p50 and p99 of sequential
//! requests, requests per second at 32 concurrent clients, the server's peak resident
//! memory (VmHWM), and the share of the round trip spent evaluating rules.
//!
//! Run: `cargo bench --bench webhook` (`-- --quick` for fewer requests).

#[allow(dead_code)]
#[path = "../tests/support/apiserver.rs"]
mod apiserver;
#[allow(dead_code)]
#[path = "../tests/support/https.rs"]
mod https;

use apiserver::ApiServer;
use hyper::body::Bytes;
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

async fn connect(addr: SocketAddr, ca: &CertificateDer<'static>) -> https::Sender {
    https::connect(addr, ca).await.0
}

async fn post(send: &mut https::Sender, body: &Bytes) -> Value {
    let (_, bytes) = https::request(
        send,
        "POST",
        "/validate/talosmachines",
        "application/json",
        body.clone(),
    )
    .await;
    serde_json::from_slice(&bytes).expect("json")
}

fn machine(i: usize) -> Value {
    let role = if i < 3 { "controlplane" } else { "worker" };
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": format!("m-{i:05}"), "namespace": "infra"},
        "spec": {"clusterRef": {"name": "prod"}, "role": role, "approved": true,
                 "approvalDecision": {"at": "2026-10-01T00:00:00Z"}}
    })
}

fn delete_review() -> Bytes {
    let old = json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "m-00002", "namespace": "infra",
                     "annotations": {"ichor.maesh.dev/allow-delete": "true"}},
        "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true}
    });
    Bytes::from(
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "bench", "name": "m-00002", "namespace": "infra", "operation": "DELETE",
                "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": "TalosMachine"},
                "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": "talosmachines"},
                "userInfo": {"username": "bench"}, "object": null, "oldObject": old, "dryRun": false
            }
        })
        .to_string(),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Rule evaluation alone (no I/O) for the same request and snapshot.
fn decide_only(snapshot: &ichor_rules::runtime::objects::Snapshot, body: &Bytes) -> Duration {
    use ichor_rules::runtime::admission::parse_review;
    use ichor_rules::runtime::decide::{decide_events, request_events};
    use ichor_rules::runtime::facts::Expensive;
    let table = ichor_rules::ruleset::load(&[PathBuf::from("rules")])
        .expect("rules")
        .table
        .expect("table");
    let req = parse_review(body).expect("review");
    let events = request_events(
        req.operation(),
        &req.namespace,
        req.old.as_ref(),
        req.new.as_ref(),
    );
    let n = 200;
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(decide_events(
            &table,
            snapshot,
            &events,
            Expensive::FromObjects,
            false,
        ));
    }
    start.elapsed() / n
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `cargo bench` passes `--bench`; any other filter argument is ignored.
    let dir = std::env::temp_dir().join(format!("ichor-webhook-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let ca = https::write_cert(&dir);

    let api = ApiServer::start().await;
    api.insert(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "prod", "namespace": "infra"},
        "spec": {"controlPlane": {"count": 3}, "schedulable": "true"}
    }));
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr")
    };
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .args(["serve", "--rules", "rules", "--listen", &listen.to_string()])
        .args(["--api-server", &api.url()])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start ichor-rules serve");
    let pid = child.id();
    // Wait until it serves.
    let mut ready = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(listen).await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "ichor-rules serve did not start");

    let body = delete_review();
    let (sequential, seconds) = if quick { (100, 1) } else { (500, 3) };
    println!(
        "machines  p50       p99       rps(32 clients)  decide-only  decide/p50  server VmHWM"
    );
    let mut inserted = 0;
    for n in [10usize, 100, 1_000, 10_000] {
        while inserted < n {
            api.insert(machine(inserted));
            inserted += 1;
        }
        let mut send = connect(listen, &ca).await;
        let first = post(&mut send, &body).await;
        assert_eq!(
            first["response"]["allowed"], false,
            "3 -> 2 below count 3 is refused"
        );
        let mut lat = Vec::with_capacity(sequential);
        for _ in 0..sequential {
            let t = Instant::now();
            let _ = post(&mut send, &body).await;
            lat.push(t.elapsed());
        }
        lat.sort();
        let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
        // 32 concurrent clients, one keep-alive connection each.
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let body = body.clone();
            let ca = ca.clone();
            tasks.push(tokio::spawn(async move {
                let mut send = connect(listen, &ca).await;
                let mut done = 0u64;
                while Instant::now() < deadline {
                    let _ = post(&mut send, &body).await;
                    done += 1;
                }
                done
            }));
        }
        let started = Instant::now();
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("client");
        }
        let rps = total as f64 / started.elapsed().as_secs_f64();
        let snapshot = ichor_rules::runtime::objects::Snapshot {
            machines: api
                .objects("TalosMachine", Some("infra"))
                .into_iter()
                .filter_map(|v| serde_json::from_value(v).ok())
                .collect(),
            clusters: api
                .objects("TalosCluster", Some("infra"))
                .into_iter()
                .filter_map(|v| serde_json::from_value(v).ok())
                .collect(),
            operations: Vec::new(),
        };
        let decide = decide_only(&snapshot, &body);
        println!(
            "{n:>8}  {:>7.3}ms {:>7.3}ms {:>10.0}       {:>8.1}µs   {:>6.2}%     {} MiB",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            rps,
            decide.as_secs_f64() * 1e6,
            decide.as_secs_f64() / p50.as_secs_f64() * 100.0,
            vm_hwm_kib(pid) / 1024
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
