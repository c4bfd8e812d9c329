//! The dry render of a TalosConfigPatch at admission (ADR 0106 §1) at 100 selected
//! approved machines: two renders per machine.
//!
//! - criterion: `dry_render` alone (pure: the renders and the bookkeeping), 100 machines,
//!   five other patches of the cluster, for a patch that breaks none and for the seed's
//!   patch (which breaks every control plane);
//! - then the admission round trip: AdmissionReview over HTTPS to the webhook router, its
//!   live reads of the in-process API server (the TalosCluster with its redacted base, the
//!   100 machines, the patches), the renders and the rules' decision, sequentially; prints
//!   p50 and p99 and fails when p99 reaches 100 ms.
//!
//! Run: `cargo bench --bench config_admission` (`-- --quick` for a shorter run).

// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../tests/support/apiserver.rs"]
mod apiserver;
#[allow(dead_code)]
#[path = "../tests/support/https.rs"]
mod https;

use apiserver::ApiServer;
use criterion::Criterion;
use hyper::body::Bytes;
use ichor_rules::runtime::configpatch::dry_render;
use ichor_rules::runtime::live::LiveReader;
use ichor_rules::runtime::metrics::Metrics;
use ichor_rules::runtime::objects::{TalosConfigPatch, TalosMachine};
use ichor_rules::runtime::reload::{Reload, Rules};
use ichor_rules::runtime::render::Base;
use ichor_rules::runtime::tls::ReloadingCert;
use ichor_rules::runtime::webhook::{Webhook, router, serve_tls};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CP: &str = include_str!("../tests/fixtures/talos/controlplane.yaml");
const WORKER: &str = include_str!("../tests/fixtures/talos/worker.yaml");
const NS: &str = "infra";
const MACHINES: usize = 100;
const SEED: &str =
    "version: v1alpha1\ncluster:\n  apiServer:\n    extraArgs:\n      feature-gates: Foo=true\n";
const UNRELATED: &str =
    "version: v1alpha1\nmachine:\n  sysctls:\n    vm.max_map_count: \"262144\"\n";

fn cluster() -> Value {
    let base = Base::parse(CP, WORKER, true).unwrap();
    let (cp, w) = base.redacted().texts().unwrap();
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "prod", "namespace": NS},
        "spec": {"controlPlane": {"count": 3}, "schedulable": "true"},
        "status": {"redactedBase": {"digest": base.digest, "controlplane": cp, "worker": w}}
    })
}

/// 100 approved machines: three control planes, 97 workers (all selected by an empty
/// selector).
fn machines() -> Vec<Value> {
    (0..MACHINES)
        .map(|i| {
            let (name, role) = if i < 3 {
                (format!("cp-{i}"), "controlplane")
            } else {
                (format!("w-{i}"), "worker")
            };
            json!({
                "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
                "metadata": {"name": name, "namespace": NS, "labels": {"pool": "a"}},
                "spec": {"clusterRef": {"name": "prod"}, "role": role, "approved": true,
                         "hostname": name}
            })
        })
        .collect()
}

fn patch(name: &str, order: i32, strategic: &str) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosConfigPatch",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterRef": {"name": "prod"}, "order": order,
                 "selector": {"labelSelector": {"matchLabels": {"pool": "a"}}},
                 "patches": {"strategic": strategic}}
    })
}

fn others() -> Vec<Value> {
    (0..5)
        .map(|i| {
            patch(
                &format!("other-{i}"),
                i,
                &format!("version: v1alpha1\nmachine:\n  certSANs: [san-{i}.example]\n  kubelet:\n    extraArgs:\n      v{i}: \"1\"\n"),
            )
        })
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    serde_json::from_value(v.clone()).unwrap()
}

fn pct(times: &mut [Duration], p: f64) -> Duration {
    times.sort();
    let i = ((times.len() as f64 - 1.0) * p).round() as usize;
    times[i]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // criterion: the pure dry render.
    let base = Base::parse(CP, WORKER, true).unwrap().redacted();
    let ms: Vec<TalosMachine> = machines().iter().map(typed).collect();
    let os: Vec<TalosConfigPatch> = others().iter().map(typed).collect();
    let good: TalosConfigPatch = typed(&patch("new", 9, UNRELATED));
    let seed: TalosConfigPatch = typed(&patch("new", 9, SEED));
    assert_eq!(dry_render(Some(&base), &ms, &os, &good).breaks, 0);
    assert_eq!(dry_render(Some(&base), &ms, &os, &seed).breaks, 3);
    let mut c = Criterion::default().configure_from_args();
    if quick {
        c = c
            .measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_millis(500));
    }
    c.bench_function("dry_render/100 machines, accepted", |b| {
        b.iter(|| dry_render(Some(&base), &ms, &os, &good))
    });
    c.bench_function("dry_render/100 machines, the seed's patch", |b| {
        b.iter(|| dry_render(Some(&base), &ms, &os, &seed))
    });
    c.final_summary();

    // The admission round trip.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let api = ApiServer::start().await;
        api.insert(cluster());
        for m in machines() {
            api.insert(m);
        }
        for p in others() {
            api.insert(p);
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("bench-config-admission-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("rules")).unwrap();
        let ca = https::write_cert(&dir);
        for f in ["admission.rules", "removal.rules", "operations.rules"] {
            std::fs::copy(PathBuf::from("rules").join(f), dir.join("rules").join(f)).unwrap();
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
        tokio::spawn(serve_tls(listener, tls, router(state), std::future::pending()));
        let n = if quick { 60 } else { 300 };
        let mut times = Vec::with_capacity(n);
        let (mut send, _) = https::connect(addr, &ca).await;
        for i in 0..n + 10 {
            let (p, allowed) = if i % 2 == 0 {
                (patch("new", 9, UNRELATED), true)
            } else {
                (patch("new", 9, SEED), false)
            };
            let body = json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": format!("u{i}"),
                    "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": "TalosConfigPatch"},
                    "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": "talosconfigpatches"},
                    "name": "new", "namespace": NS, "operation": "CREATE",
                    "userInfo": {"username": "admin"}, "object": p, "dryRun": false
                }
            });
            let started = Instant::now();
            let (status, bytes) = https::request(
                &mut send,
                "POST",
                "/validate/talosconfigpatches",
                "application/json",
                Bytes::from(serde_json::to_vec(&body).unwrap()),
            )
            .await;
            let took = started.elapsed();
            assert_eq!(status, 200);
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(v["response"]["allowed"], allowed, "{v}");
            if i >= 10 {
                times.push(took);
            }
        }
        let p50 = pct(&mut times, 0.50);
        let p99 = pct(&mut times, 0.99);
        println!(
            "admission of a TalosConfigPatch selecting {MACHINES} approved machines (5 other patches), {n} sequential requests: p50 {:.2} ms, p99 {:.2} ms",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
        assert!(p99 < Duration::from_millis(100), "p99 {p99:?} reaches 100 ms");
    });
}
