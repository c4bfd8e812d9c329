//! `/metrics` on a port of its own, for bearer tokens the API server vouches for
//! (TokenReview) whose user may `get` the non-resource URL `/metrics`
//! (SubjectAccessReview); and `serve`'s two roles apart: the webhook alone
//! (`--no-controller`) and the controller alone (`--no-webhook`, its probes on
//! `--health-listen`). Everything runs as the real `ichor-rules serve` process against the
//! in-process API server, over real TLS.

use crate::support::apiserver;

use crate::support::https;

use apiserver::ApiServer;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_ichor-rules");
const PROMETHEUS: &str = "system:serviceaccount:monitoring:prometheus";

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("metrics-auth-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// Accepts any server certificate: the controller's metrics port serves one made up at
/// start (scrapers authenticate with their token, not by the server's name).
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

pub(crate) fn client_config(ca: Option<&CertificateDer<'static>>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let config = match ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.clone()).expect("trust");
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
            .with_no_client_auth(),
    };
    Arc::new(config)
}

/// One `GET path` (with a bearer token if given) over a new connection, TLS when `tls` is
/// given: the status code and the body.
pub(crate) async fn get(
    addr: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    req.push_str("\r\n");
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    match tls {
        Some(config) => {
            let mut s = tokio_rustls::TlsConnector::from(config.clone())
                .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            s.write_all(req.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let _ = s.read_to_string(&mut text).await;
        }
        None => {
            let mut s = tcp;
            s.write_all(req.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let _ = s.read_to_string(&mut text).await;
        }
    }
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Polls until `GET path` answers `want`.
async fn wait_status(
    addr: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
    path: &str,
    token: Option<&str>,
    want: u16,
) -> String {
    let mut last = Err("never tried".to_string());
    for _ in 0..150 {
        last = get(addr, tls, path, token).await;
        if let Ok((code, body)) = &last
            && *code == want
        {
            return body.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("GET {path} on {addr} never answered {want}: last {last:?}");
}

/// The API server with a token for Prometheus (allowed to get /metrics) and one for an
/// application (not allowed).
async fn api_with_tokens() -> ApiServer {
    let api = ApiServer::start().await;
    api.add_service_account_token("tok-prometheus", "monitoring", "prometheus");
    api.add_service_account_token("tok-app", "shop", "frontend");
    api.allow_non_resource(PROMETHEUS, "get", "/metrics");
    api.add_service_account_token("tok-controller", "ichor-system", "controller");
    api.allow_non_resource(
        "system:serviceaccount:ichor-system:controller",
        "get",
        "/admissions",
    );
    api
}

fn reviews(api: &ApiServer) -> (usize, usize) {
    let log = api.store.faults.take_log();
    let count = |p: &str| {
        log.iter()
            .filter(|r| r.method == "POST" && r.path.ends_with(p))
            .count()
    };
    (count("/tokenreviews"), count("/subjectaccessreviews"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_401_without_a_token_403_without_the_permission_and_200_with_it() {
    let api = api_with_tokens().await;
    let dir = scratch("webhook");
    let ca = https::write_cert(&dir);
    let (listen, metrics) = (https::free_address(), https::free_address());
    let _serve = https::Killed(
        Command::new(BIN)
            .args(["serve", "--no-controller", "--rules", "rules"])
            .args(["--listen", &listen.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .args(["--api-server", &api.url()])
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts"),
    );
    let tls = client_config(Some(&ca));
    // Health stays open, on the webhook's port.
    wait_status(listen, Some(&tls), "/healthz", None, 200).await;
    let _ = api.store.faults.take_log();

    let (code, _) = get(metrics, Some(&tls), "/metrics", None)
        .await
        .expect("get");
    assert_eq!(code, 401, "no token");
    assert_eq!(reviews(&api), (0, 0), "nothing to review without a token");
    let (code, _) = get(metrics, Some(&tls), "/metrics", Some("not-a-token"))
        .await
        .expect("get");
    assert_eq!(code, 401, "a token the API server does not authenticate");
    assert_eq!(reviews(&api), (1, 0));
    let (code, body) = get(metrics, Some(&tls), "/metrics", Some("tok-app"))
        .await
        .expect("get");
    assert_eq!(
        code, 403,
        "authenticated, but not allowed to get /metrics: {body}"
    );
    assert!(
        body.contains("system:serviceaccount:shop:frontend"),
        "{body}"
    );
    assert_eq!(reviews(&api), (1, 1));
    let (code, body) = get(metrics, Some(&tls), "/metrics", Some("tok-prometheus"))
        .await
        .expect("get");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("# TYPE ichor_rules_decisions_total counter"),
        "{body}"
    );
    assert_eq!(reviews(&api), (1, 1));
    // Outcomes are kept a while: the next scrapes cost no review.
    for token in ["tok-prometheus", "tok-app"] {
        let _ = get(metrics, Some(&tls), "/metrics", Some(token)).await;
    }
    assert_eq!(reviews(&api), (0, 0));
    // The webhook's port has no /metrics any more.
    let (code, _) = get(listen, Some(&tls), "/metrics", Some("tok-prometheus"))
        .await
        .expect("get");
    assert_eq!(code, 404);
    // ... and the metrics port nothing but /metrics and the webhook's /admissions, each
    // for the users allowed that URL: a token allowed /metrics is not allowed /admissions.
    let (code, _) = get(metrics, Some(&tls), "/readyz", Some("tok-prometheus"))
        .await
        .expect("get");
    assert_eq!(code, 404);
    let query = "/admissions?kind=TalosMachine&namespace=infra&name=cp-4&operation=DELETE";
    let (code, body) = get(metrics, Some(&tls), query, Some("tok-prometheus"))
        .await
        .expect("get");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("may not get /admissions"), "{body}");
    let (code, body) = get(metrics, Some(&tls), query, Some("tok-controller"))
        .await
        .expect("get");
    assert_eq!((code, body.as_str()), (200, "{\"admissions\":[]}"));
    let (code, body) = get(
        metrics,
        Some(&tls),
        "/admissions?name=cp-4",
        Some("tok-controller"),
    )
    .await
    .expect("get");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("`kind` is missing"), "{body}");
    let (code, _) = get(metrics, Some(&tls), "/metrics", Some("tok-controller"))
        .await
        .expect("get");
    assert_eq!(
        code, 403,
        "a token allowed /admissions is not allowed /metrics"
    );
}

/// The controller alone: no webhook listener and no serving certificate; its probes over
/// plain HTTP on --health-listen, its metrics (with a certificate made up at start) on
/// --metrics-listen, token checked; and it leads and reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_alone_listens_only_for_its_probes_and_metrics() {
    let api = api_with_tokens().await;
    let (listen, health, metrics) = (
        https::free_address(),
        https::free_address(),
        https::free_address(),
    );
    let _serve = https::Killed(
        Command::new(BIN)
            .args(["serve", "--no-webhook", "--rules", "rules"])
            .args(["--listen", &listen.to_string()])
            .args(["--health-listen", &health.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .args(["--api-server", &api.url()])
            .args([
                "--identity",
                "controller-0",
                "--lease-namespace",
                "ichor-system",
            ])
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts"),
    );
    wait_status(health, None, "/healthz", None, 200).await;
    wait_status(health, None, "/readyz", None, 200).await;
    let (code, _) = get(health, None, "/metrics", None).await.expect("get");
    assert_eq!(code, 404, "the health port serves only the probes");
    assert!(
        tokio::net::TcpStream::connect(listen).await.is_err(),
        "no webhook listener"
    );
    let tls = client_config(None);
    let (code, _) = get(metrics, Some(&tls), "/metrics", None)
        .await
        .expect("get");
    assert_eq!(code, 401);
    let (code, _) = get(metrics, Some(&tls), "/metrics", Some("tok-app"))
        .await
        .expect("get");
    assert_eq!(code, 403);
    // No webhook here: no admissions to answer.
    let (code, _) = get(
        metrics,
        Some(&tls),
        "/admissions?kind=TalosMachine&namespace=infra&name=cp-4&operation=DELETE",
        Some("tok-controller"),
    )
    .await
    .expect("get");
    assert_eq!(code, 404);
    let mut leading = false;
    for _ in 0..100 {
        let (code, body) = get(metrics, Some(&tls), "/metrics", Some("tok-prometheus"))
            .await
            .expect("get");
        assert_eq!(code, 200);
        if body.contains("ichor_rules_leader 1") {
            leading = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(leading, "the controller leads");
    let lease = api
        .objects("Lease", Some("ichor-system"))
        .into_iter()
        .find(|l| l["metadata"]["name"] == "ichor-rules-controller")
        .expect("the leader Lease");
    assert_eq!(lease["spec"]["holderIdentity"], "controller-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_insecure_serves_anyone_for_local_use() {
    let api = ApiServer::start().await;
    let dir = scratch("insecure");
    let ca = https::write_cert(&dir);
    let (listen, metrics) = (https::free_address(), https::free_address());
    let _serve = https::Killed(
        Command::new(BIN)
            .args(["serve", "--no-controller", "--rules", "rules"])
            .args(["--listen", &listen.to_string()])
            .args([
                "--metrics-listen",
                &metrics.to_string(),
                "--metrics-insecure",
            ])
            .args(["--api-server", &api.url()])
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts"),
    );
    let tls = client_config(Some(&ca));
    let body = wait_status(metrics, Some(&tls), "/metrics", None, 200).await;
    assert!(body.contains("ichor_rules_"), "{body}");
    // The admissions are never served to anyone: not served at all.
    let (code, _) = get(
        metrics,
        Some(&tls),
        "/admissions?kind=TalosMachine&namespace=infra&name=cp-4&operation=DELETE",
        None,
    )
    .await
    .expect("get");
    assert_eq!(code, 404);
    let log = api.store.faults.take_log();
    assert!(
        !log.iter().any(|r| r.path.ends_with("reviews")),
        "no review when insecure"
    );
}

#[test]
fn serve_says_what_is_missing_for_each_role() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args([
                "serve",
                "--rules",
                "rules",
                "--api-server",
                "http://127.0.0.1:9",
            ])
            .args(args)
            .output()
            .expect("serve runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--tls-cert and --tls-key (or --tls-secret) are required to serve the webhook (or --no-webhook"),
        "{err}"
    );
    let (code, err) = run(&["--tls-cert", "x.crt"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--tls-cert is given without --tls-key"),
        "{err}"
    );
    let (code, err) = run(&["--no-webhook", "--no-controller"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // The controller's admission lookups: over HTTPS, with the webhook's CA.
    let (code, err) = run(&[
        "--no-webhook",
        "--admissions-url",
        "http://ichor-rules.ichor-system.svc:8080/admissions",
        "--admissions-ca",
        "ca.crt",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--admissions-url \"http://ichor-rules.ichor-system.svc:8080/admissions\": the webhook is asked over HTTPS only"),
        "{err}"
    );
    let (code, err) = run(&[
        "--no-webhook",
        "--admissions-url",
        "https://ichor-rules.ichor-system.svc:8080/admissions",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--admissions-ca"), "{err}");
}

/// A flood of distinct bad tokens on `/metrics` (issue 33, item 6): each token never seen
/// before needs a review permit, so the API server reviews at most the permits' burst and
/// refill however many tokens come (the rest are answered 429, try again); a scraper let
/// in before the flood keeps its metrics without a review; and a good token that arrives
/// while the permits are out gets 429, never 401, and its metrics once a permit is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_tokens_costs_few_reviews_and_locks_no_scraper_out() {
    use ichor_rules::runtime::metrics_auth::{UNKNOWN_REVIEW_BURST, UNKNOWN_REVIEWS_PER_SECOND};
    let api = api_with_tokens().await;
    let late: Vec<String> = (0..5).map(|i| format!("tok-late-{i}")).collect();
    for t in &late {
        api.add_service_account_token(t, "monitoring", "prometheus");
    }
    let dir = scratch("flood");
    let ca = https::write_cert(&dir);
    let (listen, metrics) = (https::free_address(), https::free_address());
    let _serve = https::Killed(
        Command::new(BIN)
            .args(["serve", "--no-controller", "--rules", "rules"])
            .args(["--listen", &listen.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .args(["--api-server", &api.url()])
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts"),
    );
    let tls = client_config(Some(&ca));
    wait_status(listen, Some(&tls), "/healthz", None, 200).await;
    wait_status(metrics, Some(&tls), "/metrics", Some("tok-prometheus"), 200).await;
    let _ = reviews(&api);

    let started = std::time::Instant::now();
    let flood = |tokens: Vec<String>| {
        let tls = tls.clone();
        async move {
            let mut set = tokio::task::JoinSet::new();
            for t in tokens {
                let tls = tls.clone();
                set.spawn(async move {
                    get(metrics, Some(&tls), "/metrics", Some(&t))
                        .await
                        .expect("get")
                        .0
                });
            }
            let mut codes = std::collections::BTreeMap::new();
            while let Some(code) = set.join_next().await {
                *codes.entry(code.expect("joined")).or_insert(0usize) += 1;
            }
            codes
        }
    };
    let mut codes = std::collections::BTreeMap::new();
    for wave in 0..30 {
        let tokens = (0..10).map(|i| format!("bad-{wave}-{i}")).collect();
        for (c, n) in flood(tokens).await {
            *codes.entry(c).or_insert(0) += n;
        }
    }
    assert!(
        codes.keys().all(|c| *c == 401 || *c == 429),
        "only 401 and 429: {codes:?}"
    );
    assert!(codes.get(&429).is_some_and(|n| *n > 0), "{codes:?}");
    // Prometheus, let in before the flood, is not locked out, and costs no review.
    let (code, body) = get(metrics, Some(&tls), "/metrics", Some("tok-prometheus"))
        .await
        .expect("get");
    assert_eq!(code, 200, "{body}");
    let (token_reviews, _) = reviews(&api);
    let bound = UNKNOWN_REVIEW_BURST as usize
        + UNKNOWN_REVIEWS_PER_SECOND as usize * (started.elapsed().as_secs() as usize + 1);
    assert!(
        token_reviews <= bound,
        "300 bad tokens cost {token_reviews} TokenReviews, more than the permits ({bound}) in {:?}",
        started.elapsed()
    );

    // A good token never seen before, right after the permits are used up: 429, not 401.
    let mut limited = None;
    for (n, t) in late.iter().enumerate() {
        let _ = flood((0..15).map(|i| format!("more-bad-{n}-{i}")).collect()).await;
        let (code, body) = get(metrics, Some(&tls), "/metrics", Some(t))
            .await
            .expect("get");
        assert!(code == 429 || code == 200, "{t}: {code} {body}");
        if code == 429 {
            limited = Some(t.clone());
            break;
        }
    }
    let limited = limited.expect("a good token arriving with no permit left is answered 429");
    // ... and its metrics once a permit is back: never a cached refusal.
    let mut answered = Vec::new();
    for _ in 0..50 {
        let (code, _) = get(metrics, Some(&tls), "/metrics", Some(&limited))
            .await
            .expect("get");
        answered.push(code);
        if code == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answered.last(), Some(&200), "{answered:?}");
    assert!(!answered.contains(&401), "{answered:?}");
}
