//! `ichor-rules serve` against hostile inputs, as its own process over real HTTPS: rule
//! edits that must not be applied (or crash it), callers that try to grow its metrics,
//! hold its connections or forge its log lines.

use crate::support::apiserver;
use crate::support::https;
use crate::support::objects;

use apiserver::ApiServer;
use https::write_cert;
use hyper::body::Bytes;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_ichor-rules");

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("serve-hardening-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("rules")).expect("scratch dir");
    dir
}

fn shipped(name: &str) -> String {
    std::fs::read_to_string(Path::new("rules").join(name)).expect("shipped rules")
}

/// A rules folder holding the shipped rule set.
fn shipped_rules(dir: &Path) -> PathBuf {
    let rules = dir.join("rules");
    for f in ["admission.rules", "removal.rules"] {
        std::fs::write(rules.join(f), shipped(f)).expect("copy rules");
    }
    rules
}

/// An approved control plane of `prod` in `infra` (the `support::objects` defaults),
/// decided at `at`.
fn machine(name: &str, at: &str) -> Value {
    objects::machine(name).approved_at(at).build()
}

/// An API server with a cluster `prod` of three approved control planes.
async fn three_control_planes() -> ApiServer {
    let api = ApiServer::start().await;
    api.insert(objects::cluster("prod", 3).build());
    for (i, at) in [
        "2026-10-01T00:00:00Z",
        "2026-10-02T00:00:00Z",
        "2026-10-03T00:00:00Z",
    ]
    .iter()
    .enumerate()
    {
        api.insert(machine(&format!("cp-{}", i + 1), at));
    }
    api
}

/// The AdmissionReview of deleting `cp-3` (3 -> 2 control planes: refused).
fn delete_cp3(uid: &str) -> Value {
    let old = machine("cp-3", "2026-10-03T00:00:00Z");
    objects::review(uid, "DELETE", Some(&old), None).build()
}

/// `serve` as a child process, its stderr in a file.
struct Serve {
    child: https::Killed,
    listen: SocketAddr,
    ca: CertificateDer<'static>,
    log: PathBuf,
}

impl Serve {
    /// Starts `serve` on the rules folder `dir/rules` and waits until it is ready.
    async fn start(api: &ApiServer, dir: &Path, extra: &[&str]) -> Serve {
        let log = dir.join("serve.log");
        let stderr = Stdio::from(std::fs::File::create(&log).expect("log file"));
        Serve::start_with(api, dir, extra, stderr).await
    }

    /// Like [`Serve::start`], with stderr going to `stderr`.
    async fn start_with(api: &ApiServer, dir: &Path, extra: &[&str], stderr: Stdio) -> Serve {
        let ca = write_cert(dir);
        let listen = https::free_address();
        let log = dir.join("serve.log");
        let child = Command::new(BIN)
            .args(["serve", "--no-controller", "--listen", &listen.to_string()])
            .args(["--api-server", &api.url(), "--reload-interval-ms", "100"])
            // /metrics on the webhook's port, unauthenticated (local use).
            .arg("--metrics-insecure")
            .arg("--rules")
            .arg(dir.join("rules"))
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .args(extra)
            .env("RUST_LOG", "info")
            // mimalloc gives freed memory back to the system at once rather than after a
            // delay, so the resident memory the tests measure is what the server holds,
            // not what its allocator kept for reuse (which varies from run to run).
            .env("MIMALLOC_PURGE_DELAY", "0")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("serve starts");
        let serve = Serve {
            child: https::Killed(child),
            listen,
            ca,
            log,
        };
        for _ in 0..150 {
            if tokio::net::TcpStream::connect(listen).await.is_ok()
                && serve.get("/readyz").await.0 == 200
            {
                return serve;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("serve did not become ready: {}", serve.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.0.try_wait(), Ok(None))
    }

    async fn send(&self, method: &str, path: &str, body: Vec<u8>) -> (u16, String) {
        let (mut send, _) = https::connect(self.listen, &self.ca).await;
        let (status, bytes) = https::request(
            &mut send,
            method,
            path,
            "application/json",
            Bytes::from(body),
        )
        .await;
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn get(&self, path: &str) -> (u16, String) {
        self.send("GET", path, Vec::new()).await
    }

    /// Whether the review of `body` is allowed.
    async fn allowed(&self, body: &Value) -> bool {
        let (status, text) = self
            .send(
                "POST",
                "/validate/talosmachines",
                serde_json::to_vec(body).expect("json"),
            )
            .await;
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("a review");
        v["response"]["allowed"]
            .as_bool()
            .unwrap_or_else(|| panic!("no verdict in {v}"))
    }

    async fn metrics(&self) -> String {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, 200);
        text
    }

    /// Polls /metrics until `series` is at least `n` (30 s at most).
    async fn wait_metric(&self, series: &str, n: f64) {
        for _ in 0..300 {
            if metric(&self.metrics().await, series) >= Some(n) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "/metrics never showed {series} >= {n}:\n{}\nlog:\n{}",
            self.metrics().await,
            self.log()
        );
    }
}

/// The value of one metric line `name{labels} value`.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The series of an exposition (name and labels, without values or comments).
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_string())
        .collect()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// `serve` exits 2 before listening, printing why, when its rules are refused.
fn refused_at_startup(name: &str, files: &[(&str, &str)]) -> String {
    refused_at_startup_with(name, files, &[])
}

/// [`refused_at_startup`], `serve` given `extra` flags too.
fn refused_at_startup_with(name: &str, files: &[(&str, &str)], extra: &[&str]) -> String {
    let dir = scratch(name);
    write_cert(&dir);
    for (f, text) in files {
        std::fs::write(dir.join("rules").join(f), text).expect("write rules");
    }
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--api-server", "http://127.0.0.1:9"])
        .arg("--rules")
        .arg(dir.join("rules"))
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .args(extra)
        .output()
        .expect("serve runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{name}: {err}");
    assert!(
        err.contains("error: the rules are refused"),
        "{name}: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    err
}

const ARITHMETIC: &str = "rule bad-division\n  refuse remove controlplane when approved / (count - 3) > 1\n  say \"x\"\n";

#[test]
fn serve_does_not_start_on_rules_check_refuses_or_that_cover_nothing() {
    let (admission, removal) = (shipped("admission.rules"), shipped("removal.rules"));
    // An arithmetic error `check` refuses (exit 1).
    let err = refused_at_startup(
        "start-arithmetic",
        &[
            ("admission.rules", &admission),
            ("removal.rules", &removal),
            ("extra.rules", ARITHMETIC),
        ],
    );
    assert!(err.contains("ichor::check::arithmetic"), "{err}");
    assert!(
        err.contains("extra.rules:2:"),
        "the diagnostic is located: {err}"
    );
    // Empty rule files: every event uncovered, which would allow every delete.
    let err = refused_at_startup(
        "start-empty",
        &[("admission.rules", ""), ("removal.rules", "")],
    );
    assert!(err.contains("ichor::lint::uncovered_event"), "{err}");
    assert!(
        err.contains("`remove controlplane` at the webhook"),
        "{err}"
    );
    // Files with comments and no rule.
    let err = refused_at_startup("start-comments", &[("admission.rules", "# nothing\n")]);
    assert!(err.contains("uncovered"), "{err}");
    // A folder with no rule files.
    let err = refused_at_startup("start-nofiles", &[("README.md", "rules\n")]);
    assert!(err.contains("no .rules files"), "{err}");
    // The removal rules dropped: the admission rules alone leave removals uncovered.
    let err = refused_at_startup("start-halfset", &[("admission.rules", &admission)]);
    assert!(
        err.contains("`remove controlplane` at the webhook"),
        "{err}"
    );
}

/// A rule switch naming no rule (a typo in the chart's `rules.enforce`) keeps `serve` from
/// starting, naming every unknown switch: serving would leave a rule in a mode nobody
/// asked for.
#[test]
fn serve_does_not_start_on_a_switch_naming_no_rule() {
    let files = [
        ("admission.rules", shipped("admission.rules")),
        ("removal.rules", shipped("removal.rules")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(f, t)| (*f, t.as_str())).collect();
    let err = refused_at_startup_with(
        "start-unknown-switch",
        &files,
        &[
            "--audit-rule",
            "declared-count",
            "--enforce-rule",
            "declared-cuont",
        ],
    );
    assert!(
        err.contains("--enforce-rule declared-cuont: no rule has this name")
            && err.contains("rules.enforce"),
        "{err}"
    );
    assert!(!err.contains("--audit-rule declared-count"), "{err}");
}

/// `serve --audit-rule declared-count` (the chart's `rules.audit` naming a safety rule):
/// it serves as told, and never silently: the log warns of the rule from the start, and
/// the gauge counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_safety_rule_switched_to_audit_is_warned_and_counted() {
    let api = three_control_planes().await;
    let dir = scratch("audit-safety");
    shipped_rules(&dir);
    let serve = Serve::start(
        &api,
        &dir,
        &["--log-format", "text", "--audit-rule", "declared-count"],
    )
    .await;
    serve
        .wait_metric("ichor_rules_rules_audit_destructive", 1.0)
        .await;
    let log = serve.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("a safety rule is in audit mode")
            && l.contains("declared-count")
            && l.contains("remove controlplane")),
        "{log}"
    );
}

/// A refused edit keeps the serving table, readiness and decisions, and is reported:
/// counted, flagged, and logged with its diagnostics from the reload thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_keeps_the_table_and_is_reported() {
    let api = three_control_planes().await;
    let dir = scratch("reload-refused");
    let rules = shipped_rules(&dir);
    let mut serve = Serve::start(&api, &dir, &["--log-format", "text"]).await;
    assert!(
        !serve.allowed(&delete_cp3("r-0")).await,
        "3 -> 2 is refused"
    );
    let m = serve.metrics().await;
    assert_eq!(metric(&m, "ichor_rules_rules_refused"), Some(0.0), "{m}");
    assert!(metric(&m, "ichor_rules_rules_loaded_timestamp_seconds").unwrap_or(0.0) > 0.0);
    let serving = m
        .lines()
        .find(|l| l.starts_with("ichor_rules_rules_info"))
        .expect("rules info")
        .to_string();
    // Its digest is the one decision records name for these rules.
    let files = ichor_rules::ruleset::read_sources(std::slice::from_ref(&rules)).expect("rules");
    let digest = ichor_rules::runtime::records::digest(&files);
    assert!(
        serving.ends_with(&format!("digest=\"{digest}\"}} 1")),
        "{serving} vs {digest}"
    );

    // 1. An arithmetic error `check` refuses.
    std::fs::write(rules.join("extra.rules"), ARITHMETIC).expect("edit");
    let rejected = "ichor_rules_rules_reloads_total{result=\"rejected\"}";
    serve.wait_metric(rejected, 1.0).await;
    // 2. Every rule file emptied: nothing guards anything, so it is refused.
    std::fs::remove_file(rules.join("extra.rules")).expect("edit");
    std::fs::write(rules.join("admission.rules"), "").expect("edit");
    std::fs::write(rules.join("removal.rules"), "# all gone\n").expect("edit");
    serve.wait_metric(rejected, 2.0).await;
    // 3. A rule set larger than a reload reads.
    std::fs::write(
        rules.join("removal.rules"),
        "# padding\n".repeat(900 * 1024),
    )
    .expect("edit");
    for _ in 0..300 {
        if serve.log().contains("larger than 8388608 bytes") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let m = serve.metrics().await;
    assert_eq!(metric(&m, "ichor_rules_rules_refused"), Some(1.0), "{m}");
    assert!(m.contains(&serving), "the same table serves: {m}");
    assert_eq!(
        metric(&m, "ichor_rules_rules_reloads_total{result=\"ok\"}"),
        Some(0.0)
    );
    assert_eq!(serve.get("/readyz").await.0, 200, "still ready");
    assert!(
        !serve.allowed(&delete_cp3("r-1")).await,
        "the previous table still refuses 3 -> 2"
    );
    let log = serve.log();
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("new rules refused"))
        .collect();
    // (A poll may also catch the files half-written, which is refused too; a mounted
    // ConfigMap swaps them atomically.)
    assert!(refusals.len() >= 3, "{log}");
    assert_eq!(
        metric(&m, rejected),
        Some(refusals.len() as f64),
        "each refusal is counted"
    );
    assert!(
        refusals.iter().all(|l| l.contains("ichor-rules-reload")),
        "checked on the reload thread: {refusals:?}"
    );
    assert!(
        refusals[0].contains("ichor::check::arithmetic") && refusals[0].contains("extra.rules:2:"),
        "{}",
        refusals[0]
    );
    assert!(
        refusals
            .iter()
            .any(|l| l.contains("ichor::lint::uncovered_event")
                && l.contains("`remove controlplane` at the webhook"))
    );
    assert!(
        refusals
            .last()
            .is_some_and(|l| l.contains("larger than 8388608 bytes")),
        "{refusals:?}"
    );

    // A good edit serves again, and the flag clears.
    std::fs::write(rules.join("admission.rules"), shipped("admission.rules")).expect("edit");
    std::fs::write(rules.join("removal.rules"), shipped("removal.rules")).expect("edit");
    serve
        .wait_metric("ichor_rules_rules_reloads_total{result=\"ok\"}", 1.0)
        .await;
    let m = serve.metrics().await;
    assert_eq!(metric(&m, "ichor_rules_rules_refused"), Some(0.0), "{m}");
    assert!(
        serve
            .log()
            .lines()
            .any(|l| l.contains("rules reloaded") && l.contains("ichor-rules-reload"))
    );
    assert!(serve.alive());
}

/// Parenthesised conditions 2,000 deep, with `)` inside strings: the front end refuses or
/// accepts them, and serve does exactly what `check` does, without dying (it used to
/// overflow a tokio worker's stack) and answering requests meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_edit_neither_kills_serve_nor_differs_from_check() {
    let api = three_control_planes().await;
    let dir = scratch("reload-deep");
    let rules = shipped_rules(&dir);
    let mut serve = Serve::start(&api, &dir, &[]).await;
    let depth = 2000;
    let deep = format!(
        "rule deep\n  refuse remove controlplane when {}true{}\n  say \"x\"\n",
        "( \"x)\" == machine or ".repeat(depth),
        " )".repeat(depth)
    );
    let probe = dir.join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    std::fs::write(probe.join("deep.rules"), &deep).unwrap();
    for f in ["admission.rules", "removal.rules"] {
        std::fs::write(probe.join(f), shipped(f)).unwrap();
    }
    let check = Command::new(BIN)
        .arg("check")
        .arg(&probe)
        .output()
        .expect("check runs");
    let check_accepts = match check.status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("check must exit 0 or 1, got {other:?}"),
    };
    std::fs::write(rules.join("deep.rules"), &deep).unwrap();
    let started = Instant::now();
    let want = if check_accepts {
        "ichor_rules_rules_reloads_total{result=\"ok\"} 1"
    } else {
        "ichor_rules_rules_reloads_total{result=\"rejected\"} 1"
    };
    loop {
        let asked = Instant::now();
        let _ = serve.allowed(&delete_cp3("d-1")).await;
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "requests are answered while the rules reload"
        );
        if serve.metrics().await.lines().any(|l| l == want) {
            break;
        }
        assert!(serve.alive(), "serve died: {}", serve.log());
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no reload outcome: {}",
            serve.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(serve.alive());
    assert_eq!(serve.get("/readyz").await.0, 200);
}

/// No request can add a time series: kinds, operations, names, namespaces and uids of
/// any size land in fixed label values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_adds_a_time_series() {
    let api = three_control_planes().await;
    let dir = scratch("metrics");
    shipped_rules(&dir);
    let serve = Serve::start(&api, &dir, &[]).await;
    let hostile = |i: usize, size: usize| {
        let mut r = delete_cp3(&format!("h-{i}"));
        let big = format!("{i}{}", "K".repeat(size));
        let other = format!("{i}{}", "N".repeat(1024));
        r["request"]["kind"]["kind"] = json!(big);
        r["request"]["resource"]["resource"] = json!(other);
        r["request"]["name"] = json!(other);
        r["request"]["uid"] = json!(other);
        r
    };
    // Warm up: one request of each shape, so every series that can exist exists.
    assert!(!serve.allowed(&delete_cp3("w-0")).await);
    let _ = serve.allowed(&hostile(0, 10)).await;
    let mut other_group = delete_cp3("w-1");
    other_group["request"]["kind"]["group"] = json!("evil.example");
    let _ = serve.allowed(&other_group).await;
    let before = serve.metrics().await;
    let rss_before = rss_kib(serve.pid());
    for i in 1..=50 {
        let _ = serve.allowed(&hostile(i, 1024 * 1024)).await;
    }
    let after = serve.metrics().await;
    let rss_after = rss_kib(serve.pid());
    eprintln!(
        "RSS before 50 requests with a 1 MiB kind: {rss_before} KiB, after: {rss_after} KiB; /metrics {} -> {} bytes",
        before.len(),
        after.len()
    );
    assert_eq!(series(&before), series(&after), "{after}");
    assert!(
        after.len() < 16 * 1024,
        "/metrics stays small: {} bytes",
        after.len()
    );
    assert_eq!(
        metric(
            &after,
            "ichor_rules_admission_requests_total{kind=\"other\",allowed=\"true\"}"
        ),
        Some(52.0),
        "{after}"
    );
    assert!(
        rss_after < rss_before + 24 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
}

/// A log line per request carries the caller's name; a newline in it must not start a
/// line of its own (text format), nor break a JSON line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crafted_name_cannot_forge_a_log_line() {
    let forged = "1999-12-31T00:00:00.000000Z  INFO FORGED: rules reloaded rows=0";
    for format in ["text", "json"] {
        let api = three_control_planes().await;
        let dir = scratch(&format!("logs-{format}"));
        shipped_rules(&dir);
        let serve = Serve::start(&api, &dir, &["--log-format", format]).await;
        let mut r = delete_cp3("l-1");
        r["request"]["name"] = json!(format!("cp-3\n{forged}"));
        r["request"]["uid"] = json!(format!("l-1\r\n{forged}"));
        // Decided, or refused as malformed (the name is not the object's): logged either way.
        let post = |v: &Value| serde_json::to_vec(v).expect("json");
        let _ = serve.send("POST", "/validate", post(&r)).await;
        let mut k = delete_cp3("l-2");
        k["request"]["kind"]["kind"] = json!(format!("TalosMachine\n{forged}\u{1b}[2J"));
        let _ = serve.send("POST", "/validate", post(&k)).await;
        // Decided (so logged inside the request's span, uid and all).
        let mut u = delete_cp3("l-3");
        u["request"]["uid"] = json!(format!("l-3\n{forged}"));
        assert!(!serve.allowed(&u).await);
        // Malformed: the parse error quotes what it found.
        let _ = serve
            .send(
                "POST",
                "/validate",
                format!("{{\"apiVersion\":\"v1\n{forged}\",\"kind\":\"x\"}}").into_bytes(),
            )
            .await;
        // Malformed, quoting a megabyte of what it found: the log line stays short.
        let _ = serve
            .send(
                "POST",
                "/validate",
                format!(
                    "{{\"apiVersion\":\"{}\",\"kind\":\"x\"}}",
                    "A".repeat(1024 * 1024)
                )
                .into_bytes(),
            )
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let log = serve.log();
        assert!(
            log.contains("AAAA…("),
            "the long value was logged, clipped: {log}"
        );
        let longest = log.lines().map(str::len).max().unwrap_or(0);
        assert!(longest < 4096, "a log line of {longest} bytes");
        assert!(
            log.contains("FORGED"),
            "the hostile values were logged: {log}"
        );
        for line in log.lines() {
            assert!(!line.starts_with("1999-12-31"), "a forged line: {line}");
            assert!(
                !line.contains('\u{1b}'),
                "an escape sequence reached the log: {line:?}"
            );
            if format == "json" {
                serde_json::from_str::<Value>(line)
                    .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"));
            }
        }
    }
}

/// A TLS connection trusting `ca`, without HTTP on it.
async fn tls(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).expect("trust the CA");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
}

/// Writes `first`, then one byte of `trickle` every 250 ms (or nothing), until the server
/// closes the connection; returns how long it stayed open after `first`. Gives up after
/// `limit`.
async fn held<S>(stream: S, first: &[u8], trickle: &[u8], limit: Duration) -> Duration
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let _ = wr.write_all(first).await;
    let _ = wr.flush().await;
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    let mut next = 0;
    while started.elapsed() < limit {
        match tokio::time::timeout(Duration::from_millis(250), rd.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {} // an answer to an earlier request; keep stalling
            Err(_) => {
                if let Some(b) = trickle.get(next) {
                    next += 1;
                    if wr.write_all(&[*b]).await.is_err() || wr.flush().await.is_err() {
                        return started.elapsed();
                    }
                }
            }
        }
    }
    started.elapsed()
}

/// Each phase of a connection has a deadline: a client that stalls in it is disconnected
/// within its timeout (they were all held for the whole minute before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_are_closed_within_their_timeout() {
    let api = three_control_planes().await;
    let dir = scratch("timeouts");
    shipped_rules(&dir);
    let serve = Serve::start(
        &api,
        &dir,
        &[
            "--tls-handshake-timeout-ms",
            "1000",
            "--header-read-timeout-ms",
            "1500",
            "--body-read-timeout-ms",
            "1500",
            "--idle-timeout-ms",
            "2000",
        ],
    )
    .await;
    let limit = Duration::from_secs(15);
    let within = |what: &str, took: Duration, timeout_ms: u64| {
        eprintln!(
            "{what}: held {} ms (timeout {timeout_ms} ms)",
            took.as_millis()
        );
        assert!(
            took >= Duration::from_millis(timeout_ms - 200)
                && took < Duration::from_millis(timeout_ms + 1500),
            "{what}: closed after {took:?}, the timeout is {timeout_ms} ms"
        );
    };
    let head = b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
    let with_body = b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"apiVersion\":";
    let (a, b, c, d, e, f, g) = tokio::join!(
        async {
            // No TLS handshake at all.
            let tcp = tokio::net::TcpStream::connect(serve.listen).await.unwrap();
            held(tcp, b"", b"", limit).await
        },
        async {
            // A TLS ClientHello that never finishes.
            let tcp = tokio::net::TcpStream::connect(serve.listen).await.unwrap();
            held(tcp, &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01], b"", limit).await
        },
        async {
            // A request head that stops halfway.
            held(
                tls(serve.listen, &serve.ca).await.unwrap(),
                head,
                b"",
                limit,
            )
            .await
        },
        async {
            // A request head trickled a byte at a time: progress does not extend it.
            held(
                tls(serve.listen, &serve.ca).await.unwrap(),
                b"P",
                &b"OST /validate HTTP/1.1\r\nX-Slow: ".repeat(10),
                limit,
            )
            .await
        },
        async {
            // A body that stops after a few bytes.
            held(
                tls(serve.listen, &serve.ca).await.unwrap(),
                with_body,
                b"",
                limit,
            )
            .await
        },
        async {
            // A body trickled a byte at a time.
            held(
                tls(serve.listen, &serve.ca).await.unwrap(),
                with_body,
                &b"\"admission.k8s.io/v1\",".repeat(10),
                limit,
            )
            .await
        },
        async {
            // Connected, and then nothing.
            held(tls(serve.listen, &serve.ca).await.unwrap(), b"", b"", limit).await
        },
    );
    within("no TLS handshake", a, 1000);
    within("half a ClientHello", b, 1000);
    within("half a request head", c, 1500);
    within("a head trickled", d, 1500);
    within("half a body", e, 1500);
    within("a body trickled", f, 1500);
    within("an idle connection", g, 2000);
    // Idle again after an answer: the keep-alive connection is closed too.
    let mut conn = tls(serve.listen, &serve.ca).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = conn.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    within(
        "idle after an answer",
        held(conn, b"", b"", limit).await,
        2000,
    );
    // A request that keeps its deadlines is answered as before.
    assert!(!serve.allowed(&delete_cp3("t-1")).await);
    let m = serve.metrics().await;
    for (phase, n) in [
        ("handshake", 2.0),
        ("header", 2.0),
        ("body", 2.0),
        ("idle", 2.0),
    ] {
        let got = metric(
            &m,
            &format!("ichor_rules_connections_timed_out_total{{phase=\"{phase}\"}}"),
        );
        assert!(got >= Some(n), "{phase}: {got:?}\n{m}");
    }
}

/// Connections over --max-connections are closed on arrival, so holding many costs the
/// server nothing more; a freed slot serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_refused() {
    let api = three_control_planes().await;
    let dir = scratch("cap");
    shipped_rules(&dir);
    let serve = Serve::start(&api, &dir, &["--max-connections", "4"]).await;
    // Wait for the readiness probe's connection to be gone.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut holding = Vec::new();
    for _ in 0..4 {
        holding.push(tls(serve.listen, &serve.ca).await.expect("under the cap"));
    }
    let rss_before = rss_kib(serve.pid());
    let mut refused = 0;
    for _ in 0..200 {
        if let Ok(Err(_)) | Err(_) =
            tokio::time::timeout(Duration::from_secs(2), tls(serve.listen, &serve.ca)).await
        {
            refused += 1;
        }
    }
    let rss_after = rss_kib(serve.pid());
    eprintln!(
        "200 connections over a cap of 4: {refused} refused; RSS {rss_before} -> {rss_after} KiB"
    );
    assert_eq!(refused, 200, "every connection over the cap is refused");
    // One slot freed: the next connection is served.
    drop(holding.pop());
    let mut served = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(mut c) = tls(serve.listen, &serve.ca).await {
            let _ = c
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .await;
            let mut text = String::new();
            let _ = c.read_to_string(&mut text).await;
            if text.starts_with("HTTP/1.1 200") {
                let n = text
                    .lines()
                    .find_map(|l| l.strip_prefix("ichor_rules_connections_refused_total "))
                    .and_then(|v| v.trim().parse::<u64>().ok());
                assert!(n >= Some(200), "{text}");
                assert!(text.contains("ichor_rules_connections_open 4"), "{text}");
                served = true;
                break;
            }
        }
    }
    assert!(served, "a freed slot serves again");
}

fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Decoding a body costs many times its size (a 4 MiB array of zeros is 2 million JSON
/// values), so bodies are held, decoded and decided within one budget for all
/// connections: many large bodies at once cost what one costs, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_large_bodies_at_once_cost_what_one_costs() {
    let api = three_control_planes().await;
    let dir = scratch("bodies");
    shipped_rules(&dir);
    let serve = Serve::start(&api, &dir, &[]).await;
    // The array is in the request's object, which is decoded (as a DynamicObject): a field
    // the envelope does not read would be skipped without being decoded.
    let mut body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"object":{"x":["#
        .to_vec();
    while body.len() < 4 * 1024 * 1024 - 100 {
        body.extend_from_slice(b"0,");
    }
    body.extend_from_slice(b"0]}}}");
    let start = peak_kib(serve.pid());
    let (status, _) = serve.send("POST", "/validate", body.clone()).await;
    assert_eq!(status, 400);
    let one = peak_kib(serve.pid());
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (listen, ca, body) = (serve.listen, serve.ca.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let (mut send, _) = https::connect(listen, &ca).await;
            https::request(
                &mut send,
                "POST",
                "/validate",
                "application/json",
                Bytes::from(body),
            )
            .await
            .0
        }));
    }
    let mut answered = 0;
    for t in tasks {
        // A body that waited past its deadline is cut off; the others are refused (400).
        if let Ok(400) = t.await {
            answered += 1;
        }
    }
    let eight = peak_kib(serve.pid());
    eprintln!(
        "peak memory: {start} KiB at rest, {one} KiB after one 4 MiB body, {eight} KiB after 8 at once ({answered} answered)"
    );
    assert!(answered >= 1);
    assert!(
        eight - start < (one - start) * 3 / 2,
        "8 bodies at once peaked at {eight} KiB, one alone at {one} KiB (from {start} KiB)"
    );
    assert!(!serve.allowed(&delete_cp3("b-1")).await, "still deciding");
}

/// Clients that send large requests whose answers quote them (an error naming the
/// `apiVersion` found) and never read the answers: the answers waiting to be written hold
/// the requests' budget, so they cost what one costs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_nobody_reads_are_bounded_too() {
    let api = three_control_planes().await;
    let dir = scratch("unread");
    shipped_rules(&dir);
    let serve = Serve::start(&api, &dir, &[]).await;
    let quoted = format!(
        "{{\"apiVersion\":\"{}\",\"kind\":\"x\"}}",
        "A".repeat(4 * 1024 * 1024 - 100)
    );
    let request = format!(
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{quoted}",
        quoted.len()
    );
    let before = rss_kib(serve.pid());
    let mut held = Vec::new();
    for _ in 0..12 {
        let mut c = tls(serve.listen, &serve.ca).await.expect("connects");
        let request = request.clone();
        held.push(tokio::spawn(async move {
            // Written (as far as the server takes it), never read.
            let _ =
                tokio::time::timeout(Duration::from_secs(8), c.write_all(request.as_bytes())).await;
            tokio::time::sleep(Duration::from_secs(8)).await;
            drop(c);
        }));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = rss_kib(serve.pid());
    eprintln!("12 unread 4 MiB answers: RSS {before} KiB before, {during} KiB while they wait");
    // One answer held (4 MiB) and the budget's 1 MiB for the others, with the buffers and
    // the decision in progress: 7 to 13 MiB measured, idle or under load; twelve answers
    // held would be 48 MiB at least.
    assert!(
        during < before + 28 * 1024,
        "RSS grew from {before} KiB to {during} KiB"
    );
    for h in held {
        let _ = h.await;
    }
    assert!(!serve.allowed(&delete_cp3("u-1")).await, "still deciding");
}

/// A certificate rotation caught halfway (the new certificate written, its key not yet)
/// keeps the working pair serving; the whole new pair then serves without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_rotated_certificate_keeps_the_working_pair() {
    let api = three_control_planes().await;
    let dir = scratch("rotate");
    shipped_rules(&dir);
    let serve = Serve::start(&api, &dir, &["--log-format", "text"]).await;
    let next = dir.join("next");
    std::fs::create_dir_all(&next).unwrap();
    let new_ca = write_cert(&next);
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::copy(next.join("tls.crt"), dir.join("tls.crt")).unwrap();
    for _ in 0..100 {
        if serve.log().contains("new certificate rejected") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = serve.log();
    assert!(
        log.lines()
            .any(|l| l.contains("new certificate rejected") && l.contains("does not belong")),
        "{log}"
    );
    assert_eq!(
        serve.get("/healthz").await.0,
        200,
        "the old pair still serves"
    );
    std::fs::copy(next.join("tls.key"), dir.join("tls.key")).unwrap();
    let mut rotated = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if tls(serve.listen, &new_ca).await.is_ok() {
            rotated = true;
            break;
        }
    }
    assert!(rotated, "the new pair serves: {}", serve.log());
}

/// SIGTERM (a rollout, a drain): the answer in progress is still given, idle connections
/// are closed at once, and serve exits within its drain time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_answer_in_progress_and_closes_idle_connections() {
    let api = three_control_planes().await;
    let dir = scratch("drain");
    shipped_rules(&dir);
    let mut serve = Serve::start(&api, &dir, &[]).await;
    let idle = tls(serve.listen, &serve.ca).await.expect("connects");
    api.store.faults.set_latency(Duration::from_millis(1200));
    let (listen, ca) = (serve.listen, serve.ca.clone());
    let in_flight = tokio::spawn(async move {
        let (mut send, _) = https::connect(listen, &ca).await;
        let body = serde_json::to_vec(&delete_cp3("g-1")).expect("json");
        https::request(
            &mut send,
            "POST",
            "/validate/talosmachines",
            "application/json",
            Bytes::from(body),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let term = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &serve.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let closed = held(idle, b"", b"", Duration::from_secs(10)).await;
    let (status, body) = in_flight.await.expect("the request task");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let review: Value = serde_json::from_slice(&body).expect("a review");
    assert_eq!(review["response"]["allowed"], false, "{review}");
    let mut exited = None;
    for _ in 0..100 {
        if let Ok(Some(code)) = serve.child.0.try_wait() {
            exited = Some(code);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let code = exited.expect("serve exits after SIGTERM");
    eprintln!(
        "SIGTERM: idle connection closed after {} ms, exit after {} ms",
        closed.as_millis(),
        term.elapsed().as_millis()
    );
    assert!(code.success(), "{code:?}");
    assert!(
        closed < Duration::from_secs(1),
        "idle closed after {closed:?}"
    );
    assert!(term.elapsed() < Duration::from_secs(8));
}

/// A log collector that stops reading (stderr a full pipe) must not stall the answers:
/// lines are written by a thread of their own, and dropped when it cannot keep up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stderr_does_not_stall_the_answers() {
    let api = three_control_planes().await;
    let dir = scratch("stderr");
    shipped_rules(&dir);
    // stderr is a pipe nobody reads: it is full after 64 KiB.
    let serve = Serve::start_with(&api, &dir, &[], Stdio::piped()).await;
    let noisy = format!("{{\"apiVersion\":\"{}\",\"kind\":\"x\"}}", "A".repeat(2000));
    let (mut send, _) = https::connect(serve.listen, &serve.ca).await;
    let started = Instant::now();
    for _ in 0..400 {
        // Each one logs a warning of about 700 bytes: 400 fill the pipe four times over.
        let answered = tokio::time::timeout(
            Duration::from_secs(5),
            https::request(
                &mut send,
                "POST",
                "/validate",
                "application/json",
                Bytes::from(noisy.clone()),
            ),
        )
        .await;
        assert!(
            matches!(answered, Ok((400, _))),
            "a request stalled or failed after {:?}",
            started.elapsed()
        );
    }
    let decided = tokio::time::timeout(Duration::from_secs(5), serve.allowed(&delete_cp3("p-1")))
        .await
        .expect("a decision within 5 s with stderr full");
    assert!(!decided);
    eprintln!(
        "400 logged requests with stderr full: {:?}",
        started.elapsed()
    );
}

/// A failed live read is logged once per request (not once per retry or per layer), and
/// a log that is not a terminal carries no ANSI escapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_live_read_is_logged_once_without_ansi_escapes() {
    let api = three_control_planes().await;
    let dir = scratch("failed-read-log");
    shipped_rules(&dir);
    let serve = Serve::start(&api, &dir, &[]).await;
    let before = serve.log();
    api.store.faults.fail_next(1_000, None);
    assert!(!serve.allowed(&delete_cp3("failed-read-1")).await);
    api.store.faults.fail_next(0, None);
    // Lines are written by a thread of their own: give it a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = serve.log();
    let new = &log[before.len().min(log.len())..];
    // Log lines (the decision record on the same stderr is not one; it says why too).
    let failures: Vec<&str> = new
        .lines()
        .filter(|l| !l.starts_with("{\"record\":\"decision\""))
        .filter(|l| l.contains("500") || l.to_lowercase().contains("fail"))
        .collect();
    assert_eq!(failures.len(), 1, "one line for one failed read:\n{new}");
    assert_eq!(
        new.lines()
            .filter(|l| l.starts_with("{\"record\":\"decision\"") && l.contains("failed-read-1"))
            .count(),
        1,
        "one decision record:\n{new}"
    );
    assert!(failures[0].contains("live read failed"), "{new}");
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escapes in a log that is a file:\n{log}"
    );
}
