//! Controller reconciles against the in-process API server: latency (p50, p99) and API
//! calls per reconcile, for 1 cluster x 5 machines and 100 clusters x 5 machines (each
//! cluster in its own namespace, and all in one namespace), and the same ten machines
//! reconciled in a namespace of 10 and of 10,000 machines (the ratio of the two p50s is
//! printed; the target is at most 2). Steady state: finalizers are in place, nothing is
//! held, no Talos probe (no credentials).
//!
//! Run: `cargo bench --bench reconcile` (`-- --quick` for fewer passes).

// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../tests/support/apiserver.rs"]
mod apiserver;

use apiserver::ApiServer;
use ichor_rules::runtime::controller::{Context, Settings, cluster, machine};
use ichor_rules::runtime::metrics::Metrics;
use ichor_rules::runtime::objects::{TalosCluster, TalosMachine};
use ichor_rules::runtime::reload::Rules;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn objects(api: &ApiServer, clusters: usize, one_namespace: bool) {
    for c in 0..clusters {
        let ns = if one_namespace {
            "infra".to_string()
        } else {
            format!("team-{c:03}")
        };
        let name = format!("prod-{c:03}");
        api.insert(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"controlPlane": {"count": 3}, "schedulable": "true"}
        }));
        for i in 0..5 {
            let role = if i < 3 { "controlplane" } else { "worker" };
            api.insert(json!({
                "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
                "metadata": {"name": format!("{name}-m{i}"), "namespace": ns},
                "spec": {"clusterRef": {"name": name}, "role": role, "approved": true,
                         "hostname": format!("{name}-m{i}"),
                         "approvalDecision": {"at": format!("2026-10-01T00:0{i}:00Z")}}
            }));
        }
    }
}

/// Every object of one kind, as a watch delivers them.
async fn all<K>(api: &ApiServer) -> Vec<Arc<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(api.client())
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .map(Arc::new)
        .collect()
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Figures {
    p50: Duration,
    p99: Duration,
    calls: f64,
}

async fn measure<F, Fut>(api: &ApiServer, passes: usize, n: usize, mut one: F) -> Figures
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut times = Vec::with_capacity(passes * n);
    let before = api.store.faults.requests();
    for _ in 0..passes {
        for i in 0..n {
            let t = Instant::now();
            one(i).await;
            times.push(t.elapsed());
        }
    }
    let calls = (api.store.faults.requests() - before) as f64 / (passes * n) as f64;
    times.sort();
    Figures {
        p50: pct(&times, 0.5),
        p99: pct(&times, 0.99),
        calls,
    }
}

async fn scenario(clusters: usize, one_namespace: bool, passes: usize) {
    let api = ApiServer::start().await;
    objects(&api, clusters, one_namespace);
    let rules = Arc::new(Rules::new(vec![
        concat!(env!("CARGO_MANIFEST_DIR"), "/rules").into(),
    ]));
    rules.reload();
    let ctx = Arc::new(Context::new(
        api.client(),
        rules,
        None,
        Settings::default(),
        Arc::new(Metrics::default()),
    ));
    let machines: Vec<Arc<TalosMachine>> = all(&api).await;
    let clusters_objs: Vec<Arc<TalosCluster>> = all(&api).await;
    // First pass: finalizers and conditions are written once.
    for m in &machines {
        machine::reconcile(m.clone(), ctx.clone())
            .await
            .expect("reconcile");
    }
    // The machines' pass wrote to their clusters: reconcile each cluster as it is now.
    for c in &clusters_objs {
        let (ns, name) = (
            c.metadata.namespace.clone().unwrap_or_default(),
            c.metadata.name.clone().unwrap_or_default(),
        );
        let fresh = Api::<TalosCluster>::namespaced(api.client(), &ns)
            .get(&name)
            .await
            .expect("get");
        cluster::reconcile(Arc::new(fresh), ctx.clone())
            .await
            .expect("reconcile");
    }
    // The objects as a watch delivers them after that pass (finalizers and conditions set,
    // the resourceVersions current): reconciling the stale copies would conflict (409).
    let machines: Vec<Arc<TalosMachine>> = all(&api).await;
    let clusters_objs: Vec<Arc<TalosCluster>> = all(&api).await;
    let m = measure(&api, passes, machines.len(), |i| {
        let (m, ctx) = (machines[i].clone(), ctx.clone());
        async move {
            machine::reconcile(m, ctx).await.expect("reconcile");
        }
    })
    .await;
    let c = measure(&api, passes, clusters_objs.len(), |i| {
        let (c, ctx) = (clusters_objs[i].clone(), ctx.clone());
        async move {
            cluster::reconcile(c, ctx).await.expect("reconcile");
        }
    })
    .await;
    let layout = if one_namespace {
        "one namespace"
    } else {
        "a namespace each"
    };
    println!(
        "{clusters:>3} cluster(s) x 5 machines ({layout}): TalosMachine p50 {:.2} ms p99 {:.2} ms, {:.1} API calls; TalosCluster p50 {:.2} ms p99 {:.2} ms, {:.1} API calls",
        m.p50.as_secs_f64() * 1e3,
        m.p99.as_secs_f64() * 1e3,
        m.calls,
        c.p50.as_secs_f64() * 1e3,
        c.p99.as_secs_f64() * 1e3,
        c.calls,
    );
}

/// A TalosMachine reconcile in one namespace holding `total` machines (five per cluster):
/// the same ten machines (two clusters) are reconciled whatever the namespace holds, so
/// the figures compare the cost of a reconcile by namespace size alone. Returns the p50.
async fn namespace_of(total: usize, passes: usize) -> Duration {
    let api = ApiServer::start().await;
    objects(&api, total / 5, true);
    let rules = Arc::new(Rules::new(vec![
        concat!(env!("CARGO_MANIFEST_DIR"), "/rules").into(),
    ]));
    rules.reload();
    let ctx = Arc::new(Context::new(
        api.client(),
        rules,
        None,
        Settings::default(),
        Arc::new(Metrics::default()),
    ));
    let sample: Vec<Arc<TalosMachine>> = Api::<TalosMachine>::namespaced(api.client(), "infra")
        .list(&ListParams::default().fields("spec.clusterRef.name=prod-000"))
        .await
        .expect("list")
        .items
        .into_iter()
        .chain(
            Api::<TalosMachine>::namespaced(api.client(), "infra")
                .list(&ListParams::default().fields("spec.clusterRef.name=prod-001"))
                .await
                .expect("list")
                .items,
        )
        .map(Arc::new)
        .collect();
    assert_eq!(sample.len(), 10);
    for m in &sample {
        machine::reconcile(m.clone(), ctx.clone())
            .await
            .expect("reconcile");
    }
    // Fresh copies after the first pass (as a watch delivers them), or the stale ones
    // conflict (409).
    let api_m = Api::<TalosMachine>::namespaced(api.client(), "infra");
    let mut fresh = Vec::with_capacity(sample.len());
    for m in &sample {
        let name = m.metadata.name.clone().unwrap_or_default();
        fresh.push(Arc::new(api_m.get(&name).await.expect("get")));
    }
    let sample = fresh;
    let f = measure(&api, passes, sample.len(), |i| {
        let (m, ctx) = (sample[i].clone(), ctx.clone());
        async move {
            machine::reconcile(m, ctx).await.expect("reconcile");
        }
    })
    .await;
    println!(
        "{total:>6} machines in one namespace ({} clusters): TalosMachine p50 {:.2} ms p99 {:.2} ms, {:.1} API calls",
        total / 5,
        f.p50.as_secs_f64() * 1e3,
        f.p99.as_secs_f64() * 1e3,
        f.calls,
    );
    f.p50
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `cargo bench` passes `--bench`; a filter is not supported.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let passes = if quick { 3 } else { 20 };
        // Reads are of the reconciled machine's cluster (`spec.clusterRef.name` selected),
        // so a reconcile costs what its cluster holds, not what its namespace holds.
        let small = namespace_of(10, passes * 10).await;
        let large = namespace_of(10_000, passes * 10).await;
        println!(
            "a reconcile in a namespace of 10,000 machines takes {:.2}x one in a namespace of 10 (target: within 2x)",
            large.as_secs_f64() / small.as_secs_f64()
        );
        scenario(1, false, passes * 10).await;
        scenario(100, false, passes).await;
        scenario(100, true, passes).await;
    });
}
