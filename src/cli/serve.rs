//! `ichor-rules serve`: the admission webhook over HTTPS, deciding from live reads.

use super::{EXIT_BAD_INPUT, EXIT_OK};
use crate::runtime::certs;
use crate::runtime::controller::{Context, Settings, leader};
use crate::runtime::live::{Decode, LiveReader, ReadLimit};
use crate::runtime::logs;
use crate::runtime::metrics::Metrics;
use crate::runtime::metrics_auth;
use crate::runtime::reload::{RELOAD_STACK, Reload, Reloader, Rules, on_reload_thread};
use crate::runtime::server::{Limits, serve_tls_with};
use crate::runtime::talos::TalosTls;
use crate::runtime::tls::ReloadingCert;
use crate::runtime::webhook::{Webhook, health_router, router, webhook_router};
use clap::{Args, ValueEnum};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Rule files or folders (in the cluster: the mounted ConfigMap), reloaded on change.
    #[arg(long, default_value = "rules")]
    pub rules: Vec<PathBuf>,
    /// Address to serve the webhook on (HTTPS; also /healthz and /readyz).
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// PEM certificate chain (reloaded when it changes). Required unless --no-webhook.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (reloaded when it changes). Required unless --no-webhook.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// The API server URL, without credentials (tests); by default the in-cluster or
    /// kubeconfig configuration.
    #[arg(long)]
    pub api_server: Option<String>,
    /// Timeout of each live read, in milliseconds (keep it well below the webhook timeout).
    #[arg(long, default_value_t = 2000)]
    pub read_timeout_ms: u64,
    /// The most live reads (a LIST to its end, or a GET) the webhook has in flight toward
    /// the API server at once; more wait for a turn within their read timeout, so a burst
    /// of admissions cannot become a burst of LISTs. Decisions about one cluster share a
    /// read sent after they arrived.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_inflight_reads: u64,
    /// How often the rules and the certificate are checked for changes, in milliseconds.
    /// Rules are read, checked (lints on) and compiled on a thread of their own (64 MiB
    /// stack), never on the threads answering requests. A version is applied only when
    /// `ichor-rules check` accepts it and every event the runtime produces is covered by a
    /// rule or an `allow`; otherwise the previous table keeps serving, and at startup
    /// `serve` exits (code 2) printing why.
    #[arg(long, default_value_t = 2000)]
    pub reload_interval_ms: u64,
    /// The most HTTPS connections open at once; one more is closed as soon as it is
    /// accepted (the API server keeps a few per replica).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_connections: u64,
    /// Time a TLS handshake may take, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_handshake_timeout_ms: u64,
    /// Time a request head may take once its first byte arrived, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_ms: u64,
    /// Time a request body may take once its head was read, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_read_timeout_ms: u64,
    /// Time an open connection may wait for its next request (after the handshake or
    /// the previous answer), in milliseconds.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// This replica's identity for leader election and events (in a cluster: the pod name).
    #[arg(long, env = "POD_NAME", default_value = "ichor-rules")]
    pub identity: String,
    /// The namespace of the leader-election Lease (in a cluster: the operator's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// A talosconfig file whose current context's CA and client certificate the controller
    /// dials the nodes of EVERY TalosCluster without a `spec.talosConfigSecretRef` with.
    /// Only with --talosconfig-for-all-clusters, which says that is meant: one credential
    /// for every cluster is a compromise of all of them when it leaks. By default each
    /// TalosCluster names its own talosconfig Secret (`spec.talosConfigSecretRef`), and a
    /// cluster without one gets no Talos work (Removal=False NoTalosCredentials).
    #[arg(long)]
    pub talosconfig: Option<PathBuf>,
    /// Use --talosconfig for every TalosCluster that names no `spec.talosConfigSecretRef`
    /// (an explicit opt-in; a cluster that names one always uses its own).
    #[arg(long, requires = "talosconfig")]
    pub talosconfig_for_all_clusters: bool,
    /// The controller's own username, as the API server names it in an AdmissionReview's
    /// `userInfo.username` (in a cluster: `system:serviceaccount:<namespace>:<controller
    /// ServiceAccount>`; the chart sets it). Only requests by this user may change what the
    /// rules read in a TalosMachine's status (`request.by_controller`; rule
    /// `status-only-by-controller`). Without it no request is the controller's, and every
    /// such status change is refused.
    #[arg(long, env = "ICHOR_CONTROLLER_USERNAME")]
    pub controller_username: Option<String>,
    /// Serve the webhook only; do not run the controller.
    #[arg(long)]
    pub no_controller: bool,
    /// Run the controller only: no webhook listener (`--listen` is not bound, no
    /// certificate is needed). Its probes are served by --health-listen.
    #[arg(long, conflicts_with = "no_controller")]
    pub no_webhook: bool,
    /// Serve /healthz and /readyz over plain HTTP on this address too (the controller's
    /// probes; nothing else is served there).
    #[arg(long)]
    pub health_listen: Option<SocketAddr>,
    /// Serve /metrics over HTTPS on this address, and nowhere else. Each scrape's bearer
    /// token must be authenticated by the API server (TokenReview) and allowed `get` on the
    /// non-resource URL /metrics (SubjectAccessReview): 401 without a valid token, 403
    /// without the permission. The certificate is --tls-cert/--tls-key, or without them one
    /// generated at start.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve /metrics to anyone (local use): on --metrics-listen without the token check,
    /// or, without --metrics-listen, on the webhook's port. Without this flag or
    /// --metrics-listen, /metrics is not served.
    #[arg(long)]
    pub metrics_insecure: bool,
    /// PEM CA certificate(s): the webhook port completes a TLS handshake only with a client
    /// presenting a certificate one of them signed (the API server's, when its
    /// AdmissionConfiguration names a kubeconfig with a client certificate for this
    /// webhook); anyone else is refused in the handshake. Probes then go to
    /// --health-listen (a kubelet presents no certificate). Read at start.
    #[arg(long)]
    pub client_ca: Option<PathBuf>,
    /// Serve the webhook with certificates the operator manages itself, instead of
    /// --tls-cert/--tls-key: a CA and a serving certificate for --service-name kept in
    /// this Secret of --lease-namespace, created (or rotated 30 days before expiry) by
    /// whichever replica gets there first and read back by the others, held in memory.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls_secret: Option<String>,
    /// The Service the API server calls (with --tls-secret): the serving certificate is
    /// for <name>, <name>.<namespace>, <name>.<namespace>.svc and
    /// <name>.<namespace>.svc.cluster.local.
    #[arg(long, requires = "tls_secret")]
    pub service_name: Option<String>,
    /// The ValidatingWebhookConfiguration whose webhooks' caBundle is set to the CA of
    /// --tls-secret (and set again when something else changes it).
    #[arg(long, requires = "tls_secret")]
    pub webhook_configuration: Option<String>,
}

pub fn run(args: &ServeArgs) -> u8 {
    let queue = init_logs(args.log_format);
    let code = start(args);
    if let Some(q) = queue {
        q.flush(Duration::from_secs(1));
    }
    code
}

fn start(args: &ServeArgs) -> u8 {
    // The first load decides whether to start at all: rules `check` refuses, or that leave
    // a runtime event uncovered, are never served, not even until a better version comes.
    let rules = Arc::new(Rules::new(args.rules.clone()));
    match on_reload_thread(|| rules.reload()) {
        Ok(Reload::Replaced { rows }) => tracing::info!(rows, "rules loaded"),
        Ok(Reload::Rejected {
            reason,
            diagnostics,
        }) => {
            eprintln!("error: the rules are refused: {}", logs::escape(&reason));
            for d in diagnostics {
                eprintln!("  {}", logs::escape(&d));
            }
            return EXIT_BAD_INPUT;
        }
        Ok(Reload::Unchanged) => {
            eprintln!("error: no rules loaded");
            return EXIT_BAD_INPUT;
        }
        Err(e) => {
            eprintln!("error: loading the rules: {e}");
            return EXIT_BAD_INPUT;
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    runtime.block_on(serve(args, rules))
}

/// Logs to stderr through a [`logs::Queue`] (returned, to be flushed at exit), so a stalled
/// stderr never stalls the threads answering requests.
fn init_logs(format: LogFormat) -> Option<logs::Queue> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // The kube client logs every failed request at ERROR on its own; ichor-rules logs each
    // failed read once, with what it was for ("live read failed: refusing"). Its line is
    // kept only when RUST_LOG names kube_client itself.
    let names_kube = std::env::var("RUST_LOG").is_ok_and(|v| v.contains("kube_client"));
    let filter = match "kube_client::client::builder=off".parse() {
        Ok(d) if !names_kube => filter.add_directive(d),
        _ => filter,
    };
    let queue = logs::Queue::start();
    let writer = match &queue {
        Some(q) => tracing_subscriber::fmt::writer::BoxMakeWriter::new(q.clone()),
        None => tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr),
    };
    // Thread names show where work ran (rules are checked on `ichor-rules-reload`).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_thread_names(true)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        // Field values are escaped: a name with a newline cannot forge a line.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .fmt_fields(logs::escaped_fields())
            .try_init(),
    };
    queue
}

async fn client(args: &ServeArgs) -> Result<kube::Client, String> {
    match &args.api_server {
        Some(url) => {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| format!("--api-server {url:?}: {e}"))?;
            kube::Client::try_from(kube::Config::new(uri)).map_err(|e| e.to_string())
        }
        None => kube::Client::try_default()
            .await
            .map_err(|e| format!("no Kubernetes configuration: {e}")),
    }
}

/// The serving certificate: `--tls-cert` and `--tls-key` together, or neither.
fn serving_cert(args: &ServeArgs) -> Result<Option<Arc<ReloadingCert>>, String> {
    match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => ReloadingCert::new(c.clone(), k.clone())
            .map(|c| Some(Arc::new(c)))
            .map_err(|e| e.to_string()),
        (None, None) if args.no_webhook || args.tls_secret.is_some() => Ok(None),
        (None, None) => Err(
            "--tls-cert and --tls-key (or --tls-secret) are required to serve the webhook (or --no-webhook to run only the controller)"
                .into(),
        ),
        (Some(_), None) => Err("--tls-cert is given without --tls-key".into()),
        (None, Some(_)) => Err("--tls-key is given without --tls-cert".into()),
    }
}

/// Where `--tls-secret` keeps the certificates, and for which names.
fn managed_cert_settings(args: &ServeArgs, secret: &str) -> certs::CertSettings {
    let day = Duration::from_secs(24 * 3600);
    let service = args
        .service_name
        .clone()
        .unwrap_or_else(|| "ichor-rules".into());
    certs::CertSettings {
        namespace: args.lease_namespace.clone(),
        secret: secret.to_string(),
        webhook_configuration: args.webhook_configuration.clone(),
        dns_names: certs::CertSettings::service_names(&service, &args.lease_namespace),
        validity: day * 365,
        ca_validity: day * 3650,
        renew_before: day * 30,
    }
}

/// The pair at start: retried for half a minute (the API server may be a moment away),
/// then given up on (the pod restarts, visibly).
async fn first_pair(
    client: &kube::Client,
    s: &certs::CertSettings,
) -> Result<certs::Pair, certs::CertError> {
    let mut tries = 0;
    loop {
        match certs::ensure(client, s).await {
            Ok(p) => return Ok(p),
            Err(e) if tries < 15 => {
                tracing::warn!(error = %e, "the webhook's certificate: retrying");
                tries += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Keeps the operator's certificates: sets the caBundle, then every `every` reads the
/// Secret again (rotating it when due) and serves what it holds.
async fn keep_certificates(
    client: kube::Client,
    s: certs::CertSettings,
    cert: Arc<ReloadingCert>,
    mut pair: certs::Pair,
    every: Duration,
) {
    let mut bundle_set = false;
    loop {
        if let Some(name) = &s.webhook_configuration
            && !bundle_set
        {
            match certs::patch_ca_bundle(&client, name, &pair.ca_pem).await {
                Ok(_) => bundle_set = true,
                Err(e) => tracing::warn!(error = %e, "setting the caBundle; retrying"),
            }
        }
        tokio::time::sleep(if bundle_set {
            every
        } else {
            every.min(Duration::from_secs(2))
        })
        .await;
        match certs::ensure(&client, &s).await {
            Ok(next) if next != pair => {
                let what = format!("Secret {}/{}", s.namespace, s.secret);
                match cert.replace(&next.cert_pem, &next.key_pem, &what) {
                    Ok(()) => tracing::info!("serving the webhook's new certificate"),
                    Err(e) => {
                        tracing::error!(error = %e, "the new certificate is unusable; the previous one keeps serving")
                    }
                }
                if next.ca_pem != pair.ca_pem {
                    bundle_set = false;
                }
                pair = next;
            }
            Ok(_) => {
                // Someone (a helm upgrade) may have reset the caBundle: check it again.
                bundle_set = false;
            }
            Err(e) => tracing::warn!(error = %e, "reading the webhook's certificate"),
        }
    }
}

/// Binds `addr` for `what`, or says why not.
async fn bind(addr: SocketAddr, what: &str) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} ({what}): {e}"))
}

async fn serve(args: &ServeArgs, rules: Arc<Rules>) -> u8 {
    let metrics = Arc::new(Metrics::default());
    metrics.rules_status(&rules.status());
    let cert = match serving_cert(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    // The operator's own certificates: agreed on with the other replicas through the
    // Secret before anything listens.
    let managed = match args.tls_secret.as_ref().filter(|_| !args.no_webhook) {
        None => None,
        Some(secret) => {
            let settings = managed_cert_settings(args, secret);
            let client = match client(args).await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return EXIT_BAD_INPUT;
                }
            };
            match first_pair(&client, &settings).await {
                Ok(pair) => match ReloadingCert::from_pem(
                    &pair.cert_pem,
                    &pair.key_pem,
                    &format!("Secret {}/{secret}", settings.namespace),
                ) {
                    Ok(c) => Some((Arc::new(c), settings, pair, client)),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return EXIT_BAD_INPUT;
                    }
                },
                Err(e) => {
                    eprintln!("error: --tls-secret: {e}");
                    return EXIT_BAD_INPUT;
                }
            }
        }
    };
    let cert = cert.or_else(|| managed.as_ref().map(|m| m.0.clone()));
    let client_ca = match args
        .client_ca
        .as_ref()
        .map(crate::runtime::tls::load_client_ca)
    {
        None => None,
        Some(Ok(roots)) => Some(roots),
        Some(Err(e)) => {
            eprintln!("error: --client-ca: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let tls = match cert
        .as_ref()
        .map(|c| c.server_config_verifying(client_ca.clone()))
        .transpose()
    {
        Ok(c) => c.map(Arc::new),
        Err(e) => {
            eprintln!("error: TLS configuration: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    // The metrics port's TLS: the serving certificate, or one made up for this process
    // (scrapers of a controller-only process verify its name no better than a Service's).
    let metrics_tls = match (&args.metrics_listen, &tls) {
        (None, _) => None,
        (Some(_), Some(_)) => match cert.as_ref().map(|c| c.server_config()).transpose() {
            Ok(c) => c.map(Arc::new),
            Err(e) => {
                eprintln!("error: TLS configuration: {e}");
                return EXIT_BAD_INPUT;
            }
        },
        (Some(_), None) => match crate::runtime::tls::self_signed_config(&args.identity) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                eprintln!("error: a certificate for --metrics-listen: {e}");
                return EXIT_BAD_INPUT;
            }
        },
    };
    let client = match client(args).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let state = Arc::new(Webhook {
        rules: rules.clone(),
        reader: LiveReader::new(client.clone(), Duration::from_millis(args.read_timeout_ms))
            .decoding(Decode::Decisions)
            .limited(ReadLimit::new(
                usize::try_from(args.max_inflight_reads).unwrap_or(ReadLimit::DEFAULT),
            )),
        metrics: metrics.clone(),
        api_ready: Default::default(),
        controller_username: args.controller_username.clone().filter(|u| !u.is_empty()),
    });
    let listener = match tls.as_ref() {
        _ if args.no_webhook => None,
        None => None,
        Some(_) => match bind(args.listen, "the webhook").await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_BAD_INPUT;
            }
        },
    };
    let health_listener = match args.health_listen {
        None => None,
        Some(a) => match bind(a, "--health-listen").await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_BAD_INPUT;
            }
        },
    };
    let metrics_listener = match args.metrics_listen {
        None => None,
        Some(a) => match bind(a, "--metrics-listen").await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_BAD_INPUT;
            }
        },
    };
    if listener.is_some() {
        tracing::info!(listen = %args.listen, "serving the admission webhook");
    }
    let controller = if args.no_controller {
        None
    } else {
        let talos = match &args.talosconfig {
            None => None,
            Some(path) if !args.talosconfig_for_all_clusters => {
                eprintln!(
                    "error: --talosconfig {} would be used for the nodes of every TalosCluster; \
                     say that is meant with --talosconfig-for-all-clusters, or drop it and give \
                     each TalosCluster its own Secret in spec.talosConfigSecretRef",
                    path.display()
                );
                return EXIT_BAD_INPUT;
            }
            Some(path) => match std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|y| TalosTls::from_talosconfig(&y, None).map_err(|e| e.to_string()))
            {
                Ok(t) => Some(Arc::new(t)),
                Err(e) => {
                    eprintln!("error: --talosconfig {}: {e}", path.display());
                    return EXIT_BAD_INPUT;
                }
            },
        };
        let settings = Settings {
            identity: args.identity.clone(),
            lease_namespace: args.lease_namespace.clone(),
            read_timeout: Duration::from_millis(args.read_timeout_ms),
            ..Settings::default()
        };
        let ctx = Arc::new(Context::new(
            client.clone(),
            rules.clone(),
            talos,
            settings,
            metrics.clone(),
        ));
        let leading = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = {
            let (ctx, leading) = (ctx.clone(), leading.clone());
            tokio::spawn(async move { leader::run(ctx, leading).await })
        };
        Some((ctx, task))
    };
    let interval = Duration::from_millis(args.reload_interval_ms.max(100));
    // Rules and certificate are polled on their own thread: parsing, checking and
    // compiling never run on the workers answering requests.
    let reloader = {
        let (rules, cert, metrics) = (rules.clone(), cert.clone(), metrics.clone());
        Reloader::start(interval, move || {
            match rules.reload() {
                Reload::Replaced { rows } => {
                    metrics.reload(true);
                    tracing::info!(rows, "rules reloaded");
                }
                Reload::Rejected {
                    reason,
                    diagnostics,
                } => {
                    metrics.reload(false);
                    tracing::error!(
                        %reason,
                        ?diagnostics,
                        "new rules refused; the previous table keeps serving"
                    );
                }
                Reload::Unchanged => {}
            }
            metrics.rules_status(&rules.status());
            match cert.as_ref().map(|c| c.reload_if_changed()) {
                Some(Ok(true)) => tracing::info!("serving certificate reloaded"),
                Some(Ok(false)) | None => {}
                Some(Err(e)) => {
                    tracing::error!(error = %e, "new certificate rejected; the previous one keeps serving")
                }
            }
        })
    };
    let reloader = match reloader {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e} ({RELOAD_STACK} bytes of stack)");
            return EXIT_BAD_INPUT;
        }
    };
    let watcher = {
        let state = state.clone();
        tokio::spawn(async move {
            while !state.api_ready.load(Ordering::Relaxed) {
                let api: kube::Api<crate::runtime::objects::TalosCluster> =
                    kube::Api::all(state.reader.client().clone());
                let probe = tokio::time::timeout(
                    Duration::from_secs(5),
                    api.list(&kube::api::ListParams::default().limit(1)),
                )
                .await;
                if matches!(probe, Ok(Ok(_))) {
                    state.api_ready.store(true, Ordering::Relaxed);
                }
                tokio::time::sleep(interval).await;
            }
        })
    };
    // Kubernetes stops a pod with SIGTERM: finish the requests in flight, step down.
    let shutdown = async {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        tracing::info!("shutting down");
    };
    let limits = Limits {
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        handshake_timeout: Duration::from_millis(args.tls_handshake_timeout_ms),
        header_timeout: Duration::from_millis(args.header_read_timeout_ms),
        body_timeout: Duration::from_millis(args.body_read_timeout_ms),
        idle_timeout: Duration::from_millis(args.idle_timeout_ms),
    };
    let keeper = managed.map(|(cert, settings, pair, client)| {
        tokio::spawn(keep_certificates(
            client,
            settings,
            cert,
            pair,
            // Every five reload intervals (10 s by default): a GET of the Secret and of
            // the webhook configuration.
            Duration::from_millis(args.reload_interval_ms.max(100)) * 5,
        ))
    });
    // The side servers (health, metrics) stop with the main one.
    let (stop_side, side_stopped) = tokio::sync::watch::channel(false);
    let side_stop = move || {
        let mut rx = side_stopped.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let mut side = Vec::new();
    if let Some(l) = health_listener {
        tracing::info!(listen = %args.health_listen.map(|a| a.to_string()).unwrap_or_default(), "serving /healthz and /readyz over HTTP");
        let app = health_router(state.clone());
        let stop = side_stop();
        side.push(tokio::spawn(async move {
            let _ = axum::serve(l, app).with_graceful_shutdown(stop).await;
        }));
    }
    if let (Some(l), Some(t)) = (metrics_listener, metrics_tls) {
        let access = if args.metrics_insecure {
            tracing::warn!("/metrics is served without authentication (--metrics-insecure)");
            metrics_auth::Access::Open
        } else {
            metrics_auth::Access::Reviewed(metrics_auth::Reviewer::new(client.clone()))
        };
        tracing::info!(listen = %args.metrics_listen.map(|a| a.to_string()).unwrap_or_default(), "serving /metrics");
        let app = metrics_auth::metrics_router(metrics.clone(), access);
        let (limits, metrics, stop) = (limits.clone(), metrics.clone(), side_stop());
        side.push(tokio::spawn(async move {
            serve_tls_with(l, t, app, limits, metrics, stop).await;
        }));
    }
    match (listener, tls) {
        (Some(l), Some(t)) => {
            // Without a port of their own, metrics are on the webhook's only when asked.
            let app = if args.metrics_listen.is_none() && args.metrics_insecure {
                router(state)
            } else {
                webhook_router(state)
            };
            serve_tls_with(l, t, app, limits, metrics, shutdown).await;
        }
        _ => shutdown.await,
    }
    if let Some(k) = keeper {
        k.abort();
    }
    let _ = stop_side.send(true);
    for s in side {
        let _ = tokio::time::timeout(crate::runtime::server::DRAIN, s).await;
    }
    drop(reloader);
    watcher.abort();
    if let Some((ctx, task)) = controller {
        task.abort();
        let _ = task.await;
        leader::step_down(&ctx).await;
    }
    EXIT_OK
}
