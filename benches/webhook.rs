//! Webhook round trip: HTTPS request -> live reads from the in-process API server ->
//! decision -> response, against `ichor-rules serve` running as its own process, with 10,
//! 100, 1,000 and 10,000 machines in one namespace, ten per cluster (1, 10, 100 and 1,000
//! TalosClusters). Each request deletes a control plane of one cluster (refused by the
//! rules: 3 -> 2 below the declared count), the clusters taken in turn. Prints p50 and
//! p99 of sequential requests, requests per second at 32 concurrent clients and the p50
//! and p99 of those requests (32 waiting on 2 cores: at least 32 / (req/s)), the
//! requests whose live read failed (a timeout is one), the share of the round trip spent
//! evaluating rules, the heap allocated per decision (reads and decision, measured in
//! this process with a counting allocator), and the server's peak resident memory
//! (VmHWM), which must stay under the chart's container memory limit (asserted).
//!
//! The server runs the webhook alone (`--no-controller`, as the chart's webhook replicas
//! do); `-- --with-controller` runs the controller in the same process too.
//!
//! Run: `cargo bench --bench webhook` (`-- --quick` for fewer requests). Extra `serve` flags
//! for an experiment go in `BENCH_SERVE_ARGS` (e.g. `--max-inflight-reads 64`;
//! `--decision-log off` for the cost of decision records, which are on by default, to
//! stderr); `BENCH_SERVE_BIN` serves with another build of the binary (an A/B of two
//! commits: the in-process columns stay this build's).
//!
//! `BENCH_CALLGRIND=1` serves under `valgrind --tool=callgrind` and prints, for each size,
//! the instructions the server executed per request over the sequential requests (counters
//! zeroed before them and dumped after them: one request in flight, so no read is shared
//! with another request's): a CPU-per-request figure that a busy machine does not move. It
//! counts the 32 concurrent clients' requests too (20 each, their connections opened before
//! the counters are zeroed), where requests in flight together share live reads: the figure
//! the timed CPU per request at 32 clients stands for. Timing columns mean nothing then
//! (valgrind runs the server some fifty times slower). `BENCH_MACHINES=10,1000` runs only
//! those sizes; `BENCH_CALLGRIND_KEEP=DIR` keeps the dumps in DIR (numbered in the order
//! measured: each size's sequential requests, then its 32 clients') for `callgrind_annotate`.

// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The counting allocator wraps the system allocator: the only unsafe code in the project.
#![allow(unsafe_code)]

#[allow(dead_code)]
#[path = "../tests/support/apiserver.rs"]
mod apiserver;
#[allow(dead_code)]
#[path = "../tests/support/https.rs"]
mod https;

use apiserver::ApiServer;
use hyper::body::Bytes;
use ichor_rules::runtime::live::{Decode, LiveReader, Reads};
use mimalloc::MiMalloc;
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};
use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counts what threads that ask for it allocate (the thread measuring a decision); the
/// in-process API server's threads are not counted. It wraps mimalloc, the binary's own
/// allocator, so that the clients and the API server stand-in, which share the two cores
/// with the webhook, cost what they would with it.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        unsafe { MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Requests each of the 32 concurrent clients sends under `BENCH_CALLGRIND`.
const CALLGRIND_CONCURRENT: u64 = 20;

/// Machines per cluster.
const PER_CLUSTER: usize = 10;

fn cluster_name(c: usize) -> String {
    format!("c-{c:04}")
}

fn cluster(c: usize) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": cluster_name(c), "namespace": "infra"},
        "spec": {"controlPlane": {"count": 3}, "schedulable": "true"}
    })
}

/// Machine `i` of the namespace: cluster `i / 10`, its first three control planes.
fn machine(i: usize) -> Value {
    let role = if i % PER_CLUSTER < 3 {
        "controlplane"
    } else {
        "worker"
    };
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": format!("m-{i:05}"), "namespace": "infra"},
        "spec": {"clusterRef": {"name": cluster_name(i / PER_CLUSTER)}, "role": role, "approved": true,
                 "approvalDecision": {"at": "2026-10-01T00:00:00Z"}}
    })
}

/// A review deleting the third control plane of cluster `c`.
fn delete_review(c: usize) -> Bytes {
    let name = format!("m-{:05}", c * PER_CLUSTER + 2);
    let old = json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": name, "namespace": "infra",
                     "annotations": {"ichor.maesh.dev/allow-delete": "true"}},
        "spec": {"clusterRef": {"name": cluster_name(c)}, "role": "controlplane", "approved": true}
    });
    Bytes::from(
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "bench", "name": name, "namespace": "infra", "operation": "DELETE",
                "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": "TalosMachine"},
                "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": "talosmachines"},
                "userInfo": {"username": "bench"}, "object": null, "oldObject": old, "dryRun": false
            }
        })
        .to_string(),
    )
}

/// Posts a review; whether its live read failed (a refusal that says so).
async fn post(send: &mut https::Sender, body: &Bytes) -> Result<bool, String> {
    let (_, bytes) = https::request(
        send,
        "POST",
        "/validate/talosmachines",
        "application/json",
        body.clone(),
    )
    .await;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    let message = v["response"]["status"]["message"].as_str().unwrap_or("");
    if v["response"]["allowed"] != false {
        return Err(format!("allowed: {v}"));
    }
    Ok(message.contains("could not be read"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// CPU time (user + system) a process has used so far, from `/proc/PID/stat` (in clock
/// ticks of 10 ms); `self` for this process (the clients and the API server stand-in).
fn cpu_time(pid: &str) -> Duration {
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // The fields after the command name, which is in parentheses.
            let rest = s.rsplit_once(')')?.1.to_string();
            let f: Vec<u64> = rest
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|v| v.parse().ok())
                .collect();
            Some(f.iter().sum::<u64>())
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Runs `callgrind_control OPTION PID` (the server runs under callgrind), waiting for it.
fn callgrind_control(pid: u32, option: &str) {
    let out = std::process::Command::new("callgrind_control")
        .arg(option)
        .arg(pid.to_string())
        .output()
        .expect("callgrind_control runs");
    assert!(
        out.status.success(),
        "callgrind_control {option}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Dumps kept so far (`BENCH_CALLGRIND_KEEP`).
static KEPT: AtomicU64 = AtomicU64::new(0);

/// The instructions of the newest callgrind dump in `dir` (its `totals:` line), which it
/// then deletes (the next size's dump is then the only one).
fn callgrind_total(dir: &std::path::Path) -> u64 {
    let dumps: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("callgrind.out."))
        })
        .collect();
    let mut total = 0;
    for d in &dumps {
        let text = std::fs::read_to_string(d).expect("dump");
        if let Some(line) = text
            .lines()
            .find(|l| l.starts_with("totals:") || l.starts_with("summary:"))
        {
            total += line
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse::<u64>().ok())
                .expect("a count");
        }
        // `BENCH_CALLGRIND_KEEP=DIR` keeps each dump there (for `callgrind_annotate`).
        match std::env::var_os("BENCH_CALLGRIND_KEEP") {
            Some(keep) => {
                let n = KEPT.fetch_add(1, Ordering::Relaxed);
                std::fs::copy(d, PathBuf::from(keep).join(format!("callgrind.out.{n}")))
                    .expect("keep the dump");
                std::fs::remove_file(d).expect("remove the dump");
            }
            None => std::fs::remove_file(d).expect("remove the dump"),
        }
    }
    assert!(
        !dumps.is_empty(),
        "callgrind wrote no dump in {}",
        dir.display()
    );
    total
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

/// The smallest container memory limit (`limits: memory:`) the chart's values set, in
/// MiB; `None` when it sets none (or not in Mi/Gi).
fn chart_memory_limit_mib() -> Option<u64> {
    let text = std::fs::read_to_string("charts/ichor-rules/values.yaml").ok()?;
    let mut in_limits = false;
    let mut least: Option<u64> = None;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("limits:") {
            in_limits = true;
            continue;
        }
        if in_limits && let Some(v) = t.strip_prefix("memory:") {
            let v = v.trim().trim_matches('"');
            let mib = v
                .strip_suffix("Mi")
                .and_then(|n| n.parse::<u64>().ok())
                .or_else(|| {
                    v.strip_suffix("Gi")
                        .and_then(|n| n.parse::<u64>().ok())
                        .map(|g| g * 1024)
                });
            if let Some(m) = mib {
                least = Some(least.map_or(m, |l| l.min(m)));
            }
            in_limits = false;
        } else if in_limits && !t.starts_with("cpu:") && !t.starts_with('#') && !t.is_empty() {
            in_limits = false;
        }
    }
    least
}

/// Rule evaluation alone (no I/O) for the same request and its cluster's snapshot.
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

/// The same decision with its record (each event's facts and their sources read out after
/// it, as `serve` does with a decision log) and the record's line written as the deciding
/// thread writes it, into a reused buffer: what a record adds to [`decide_only`], without
/// I/O.
fn record_only(snapshot: &ichor_rules::runtime::objects::Snapshot, body: &Bytes) -> Duration {
    use ichor_rules::runtime::admission::parse_review;
    use ichor_rules::runtime::decide::request_events;
    use ichor_rules::runtime::facts::Expensive;
    use ichor_rules::runtime::records;
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
    let (mut json, mut line) = (Vec::new(), Vec::new());
    let start = Instant::now();
    for _ in 0..n {
        json.clear();
        line.clear();
        let d = records::decide_recorded_into(
            &table,
            snapshot,
            &events,
            Expensive::FromObjects,
            false,
            &mut json,
        );
        let id = records::decision_id();
        records::WebhookRecord {
            id: &id,
            time: k8s_openapi::jiff::Timestamp::now(),
            request: records::RequestRef {
                uid: records::clipped(req.uid()),
                user: records::clipped(req.inner.user_info.username.as_deref().unwrap_or("")),
                operation: "DELETE",
                kind: records::clipped(&req.inner.kind.kind),
                namespace: records::clipped(&req.namespace),
                name: records::clipped(&req.inner.name),
                object_uid: records::clipped(req.object_uid()),
                dry_run: req.dry_run(),
            },
            table: Some(&table),
            events: &json,
            decision: &d,
            refused_without_rules: None,
            latency_us: 0,
        }
        .write(&mut line);
        std::hint::black_box(&line);
    }
    start.elapsed() / n
}

/// Heap allocated by one decision as the webhook makes it (the reads of its cluster,
/// decoded for decisions, then the rules), on a thread of its own so only its
/// allocations count: (allocations, bytes, time), the medians of `n`.
fn allocation_per_decision(api_url: String, body: Bytes, n: usize) -> (u64, u64, Duration) {
    std::thread::spawn(move || {
        use ichor_rules::runtime::admission::parse_review;
        use ichor_rules::runtime::decide::{decide_events, request_events};
        use ichor_rules::runtime::facts::Expensive;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let config = kube::Config::new(api_url.parse().expect("url"));
            let client = kube::Client::try_from(config).expect("client");
            let reader =
                LiveReader::new(client, Duration::from_secs(10)).decoding(Decode::Decisions);
            let table = ichor_rules::ruleset::load(&[PathBuf::from("rules")])
                .expect("rules")
                .table
                .expect("table");
            let mut samples = Vec::new();
            for round in 0..n + 1 {
                let t = Instant::now();
                COUNTING.with(|c| c.set(true));
                let (a0, b0) = (
                    ALLOCATIONS.load(Ordering::Relaxed),
                    ALLOCATED.load(Ordering::Relaxed),
                );
                let req = parse_review(&body).expect("review");
                let events = request_events(
                    req.operation(),
                    &req.namespace,
                    req.old.as_ref(),
                    req.new.as_ref(),
                );
                let reads = Reads::for_events(&table, &events);
                let clusters: Vec<&str> = events.iter().map(|e| e.cluster).collect();
                let snapshot = reader
                    .snapshot(&req.namespace, &clusters, reads)
                    .await
                    .expect("reads");
                let decision =
                    decide_events(&table, &snapshot, &events, Expensive::FromObjects, false);
                std::hint::black_box(decision);
                COUNTING.with(|c| c.set(false));
                // The first round also opens the connection.
                if round > 0 {
                    samples.push((
                        ALLOCATIONS.load(Ordering::Relaxed) - a0,
                        ALLOCATED.load(Ordering::Relaxed) - b0,
                        t.elapsed(),
                    ));
                }
            }
            samples.sort();
            let (a, b, _) = samples[samples.len() / 2];
            let mut times: Vec<Duration> = samples.iter().map(|s| s.2).collect();
            times.sort();
            (a, b, times[times.len() / 2])
        })
    })
    .join()
    .expect("measuring thread")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // The webhook alone, as the chart's webhook Deployment runs it; `--with-controller`
    // runs the controller in the same process too (as `serve` does by default).
    let with_controller = std::env::args().any(|a| a == "--with-controller");
    // `cargo bench` passes `--bench`; any other filter argument is ignored.
    let dir = std::env::temp_dir().join(format!("ichor-webhook-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let ca = https::write_cert(&dir);

    let api = ApiServer::start().await;
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr")
    };
    // `BENCH_SERVE_BIN`: another build of `ichor-rules` to serve (an A/B of two commits).
    let bin = std::env::var_os("BENCH_SERVE_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_ichor-rules").into());
    let callgrind = std::env::var_os("BENCH_CALLGRIND").is_some_and(|v| v != "0");
    let mut command = if callgrind {
        let mut c = std::process::Command::new("valgrind");
        c.arg("--tool=callgrind")
            .arg(format!(
                "--callgrind-out-file={}",
                dir.join("callgrind.out").display()
            ))
            .arg(&bin);
        c
    } else {
        std::process::Command::new(&bin)
    };
    let mut child = command
        .args(["serve", "--rules", "rules", "--listen", &listen.to_string()])
        .args(["--api-server", &api.url()])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .args((!with_controller).then_some("--no-controller"))
        .args(
            std::env::var("BENCH_SERVE_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start ichor-rules serve");
    let pid = child.id();
    // Wait until it serves.
    let mut ready = false;
    for _ in 0..if callgrind { 2400 } else { 100 } {
        if tokio::net::TcpStream::connect(listen).await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "ichor-rules serve did not start");
    let limit = chart_memory_limit_mib();

    let (sequential, seconds) = if quick { (200, 2) } else { (1000, 5) };
    println!(
        "machines clusters  p50       p99       rps(32 clients)  p50/p99 at 32 clients   failed reads  decide-only  +record  decide/p50  alloc/decision        reads+decide in-process  CPU/req server+bench   server VmHWM"
    );
    let mut inserted = 0;
    let mut worst_hwm = 0;
    // `BENCH_MACHINES=10,1000`: only those sizes (each of 10, 100, 1000, 10000).
    let sizes: Vec<usize> = std::env::var("BENCH_MACHINES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10, 100, 1_000, 10_000]);
    for n in sizes {
        while inserted < n {
            if inserted % PER_CLUSTER == 0 {
                api.insert(cluster(inserted / PER_CLUSTER));
            }
            api.insert(machine(inserted));
            inserted += 1;
        }
        let clusters = n / PER_CLUSTER;
        let bodies: Vec<Bytes> = (0..clusters).map(delete_review).collect();
        let mut send = connect(listen, &ca).await;
        assert_eq!(
            post(&mut send, &bodies[0]).await,
            Ok(false),
            "3 -> 2 below count 3 is refused by the rules"
        );
        if callgrind {
            callgrind_control(pid, "--zero");
        }
        let mut lat = Vec::with_capacity(sequential);
        let mut failed = 0u64;
        for i in 0..sequential {
            let t = Instant::now();
            failed += u64::from(post(&mut send, &bodies[i * 7 % clusters]).await != Ok(false));
            lat.push(t.elapsed());
        }
        if callgrind {
            callgrind_control(pid, "--dump");
            let total = callgrind_total(&dir);
            println!(
                "{n:>8} machines: {:.0} server instructions per sequential request ({total} over {sequential}; callgrind)",
                total as f64 / sequential as f64
            );
        }
        lat.sort();
        let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
        // 32 concurrent clients, one keep-alive connection each, each on its own clusters;
        // connected (TLS handshakes) before the clock and the counters start.
        let mut sends = Vec::new();
        for _ in 0..32usize {
            sends.push(connect(listen, &ca).await);
        }
        if callgrind {
            callgrind_control(pid, "--zero");
        }
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let mut tasks = Vec::new();
        for (k, mut send) in sends.into_iter().enumerate() {
            let bodies = bodies.clone();
            tasks.push(tokio::spawn(async move {
                let (mut done, mut failed) = (0u64, 0u64);
                let mut lat = Vec::new();
                // Under callgrind a fixed number of requests each (the server is some fifty
                // times slower), so that every run counts the same requests.
                while if callgrind {
                    done < CALLGRIND_CONCURRENT
                } else {
                    Instant::now() < deadline
                } {
                    let body = &bodies[(k * 31 + done as usize * 13) % bodies.len()];
                    let t = Instant::now();
                    failed += u64::from(post(&mut send, body).await != Ok(false));
                    lat.push(t.elapsed());
                    done += 1;
                }
                (done, failed, lat)
            }));
        }
        let started = Instant::now();
        let (server_cpu0, bench_cpu0) = (cpu_time(&pid.to_string()), cpu_time("self"));
        let mut total = 0;
        let mut loaded = Vec::new();
        for t in tasks {
            let (d, f, l) = t.await.expect("client");
            total += d;
            failed += f;
            loaded.extend(l);
        }
        let rps = total as f64 / started.elapsed().as_secs_f64();
        if callgrind {
            callgrind_control(pid, "--dump");
            let instructions = callgrind_total(&dir);
            println!(
                "{n:>8} machines: {:.0} server instructions per request at 32 clients ({instructions} over {total}; callgrind)",
                instructions as f64 / total.max(1) as f64
            );
        }
        // Where the two cores went under load: the webhook's process, and this one's
        // clients and API server stand-in (which a real deployment runs elsewhere).
        let per_req = |d: Duration| d.as_secs_f64() * 1e6 / total.max(1) as f64;
        let server_cpu = per_req(cpu_time(&pid.to_string()).saturating_sub(server_cpu0));
        let bench_cpu = per_req(cpu_time("self").saturating_sub(bench_cpu0));
        loaded.sort();
        let (p50_32, p99_32) = (percentile(&loaded, 0.5), percentile(&loaded, 0.99));
        let snapshot = ichor_rules::runtime::objects::Snapshot {
            machines: api
                .objects("TalosMachine", Some("infra"))
                .into_iter()
                .filter(|m| m["spec"]["clusterRef"]["name"] == "c-0000")
                .filter_map(|v| serde_json::from_value(v).ok())
                .collect(),
            clusters: vec![serde_json::from_value(cluster(0)).expect("cluster")],
            operations: Vec::new(),
            backups: Vec::new(),
            patches: Vec::new(),
        };
        let decide = decide_only(&snapshot, &bodies[0]);
        let record = record_only(&snapshot, &bodies[0]);
        let (allocs, bytes, in_process) =
            allocation_per_decision(api.url(), bodies[clusters / 2].clone(), 20);
        let hwm = vm_hwm_kib(pid) / 1024;
        worst_hwm = worst_hwm.max(hwm);
        println!(
            "{n:>8} {clusters:>8}  {:>7.3}ms {:>7.3}ms {:>10.0}       {:>7.2}ms/{:>7.2}ms   {failed:>8}      {:>8.1}µs {:>6.1}µs   {:>6.2}%    {allocs:>5} / {:>6.1} KiB   {:>8.3}ms                {server_cpu:>5.0}µs+{bench_cpu:>5.0}µs       {hwm} MiB",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            rps,
            p50_32.as_secs_f64() * 1e3,
            p99_32.as_secs_f64() * 1e3,
            decide.as_secs_f64() * 1e6,
            record.as_secs_f64() * 1e6,
            decide.as_secs_f64() / p50.as_secs_f64() * 100.0,
            bytes as f64 / 1024.0,
            in_process.as_secs_f64() * 1e3,
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    match limit {
        Some(limit) => {
            println!("server VmHWM {worst_hwm} MiB; the chart's memory limit is {limit} MiB");
            assert!(
                worst_hwm < limit,
                "the webhook's peak memory ({worst_hwm} MiB) reached the chart's memory limit ({limit} MiB): replicas would be OOM-killed under this load"
            );
        }
        None => {
            println!("server VmHWM {worst_hwm} MiB; the chart sets no memory limit to compare with")
        }
    }
}

async fn connect(addr: SocketAddr, ca: &CertificateDer<'static>) -> https::Sender {
    https::connect(addr, ca).await.0
}
