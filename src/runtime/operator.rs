//! The composition root of `serve`: the first load of the rules, the runtime, the
//! certificates, the webhook, health and metrics servers, the controller and its leader
//! election, the reload thread, and the shutdown, wired together from an
//! [`OperatorConfig`]. The CLI parses flags into that configuration and prints what
//! [`start`] returns; nothing here knows about flags or exit codes.

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
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What the operator runs with (`ichor-rules serve --help` documents each setting under
/// its flag's name).
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    pub rules: Vec<PathBuf>,
    pub listen: SocketAddr,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub api_server: Option<String>,
    pub read_timeout_ms: u64,
    pub max_inflight_reads: u64,
    pub reload_interval_ms: u64,
    pub max_connections: u64,
    pub tls_handshake_timeout_ms: u64,
    pub header_read_timeout_ms: u64,
    pub body_read_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub identity: String,
    pub lease_namespace: String,
    pub talosconfig: Option<PathBuf>,
    /// `serve --step-log`.
    pub step_log: Option<PathBuf>,
    pub talosconfig_for_all_clusters: bool,
    pub controller_username: Option<String>,
    pub no_controller: bool,
    pub no_webhook: bool,
    pub health_listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub metrics_insecure: bool,
    pub client_ca: Option<PathBuf>,
    pub tls_secret: Option<String>,
    pub service_name: Option<String>,
    pub webhook_configuration: Option<String>,
    /// `serve --decision-log`: `stderr`, `off`, or a file.
    pub decision_log: String,
    pub decision_log_max_bytes: u64,
    pub decision_log_keep: u32,
    pub decision_log_buffer: usize,
    /// `serve --audit-rule` (`true`) and `--enforce-rule` (`false`).
    pub rule_modes: Vec<(String, bool)>,
    /// `serve --admissions-url` and its companions: where the controller asks a webhook
    /// in another process for the admissions its records link to.
    pub admissions: Option<crate::runtime::admission_link::LookupConfig>,
}

/// Why the operator did not start (or stopped): one sentence, and the lines that explain
/// it (the diagnostics of refused rules).
#[derive(Debug)]
pub struct StartError {
    pub message: String,
    pub details: Vec<String>,
}

impl StartError {
    pub fn new(message: impl Into<String>) -> StartError {
        StartError {
            message: message.into(),
            details: Vec::new(),
        }
    }
}

/// Runs the operator until SIGTERM or Ctrl-C. The first load of the rules decides whether
/// to start at all: rules `check` refuses, or that leave a runtime event uncovered, are
/// never served, not even until a better version comes.
pub fn start(args: &OperatorConfig) -> Result<(), StartError> {
    let rules = Arc::new(Rules::new(args.rules.clone()).with_modes(args.rule_modes.clone()));
    match on_reload_thread(|| rules.reload()) {
        // Warnings (a safety rule in audit mode) are logged by the reload itself.
        Ok(Reload::Replaced { rows, warnings }) => {
            tracing::info!(rows, warnings = warnings.len(), "rules loaded")
        }
        Ok(Reload::Rejected {
            reason,
            diagnostics,
        }) => {
            return Err(StartError {
                message: format!("the rules are refused: {}", logs::escape(&reason)),
                details: diagnostics.iter().map(|d| logs::escape(d)).collect(),
            });
        }
        Ok(Reload::Unchanged) => {
            return Err(StartError::new("no rules loaded"));
        }
        Err(e) => {
            return Err(StartError::new(format!("loading the rules: {e}")));
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return Err(StartError::new(format!("cannot start the runtime: {e}")));
        }
    };
    runtime.block_on(serve(args, rules))
}

async fn client(args: &OperatorConfig) -> Result<kube::Client, String> {
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
fn serving_cert(args: &OperatorConfig) -> Result<Option<Arc<ReloadingCert>>, String> {
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
fn managed_cert_settings(args: &OperatorConfig, secret: &str) -> certs::CertSettings {
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
        // Every replica reads the Secret every `keeper_interval`: twelve of them (two
        // minutes by default) for all to serve a new pair before the old CA leaves the
        // caBundle.
        overlap: keeper_interval(args) * 12,
        identity: args.identity.clone(),
    }
}

/// How often a replica reads its certificates' Secret again: every five reload intervals
/// (10 s by default), a GET of the Secret and of the webhook configuration.
fn keeper_interval(args: &OperatorConfig) -> Duration {
    Duration::from_millis(args.reload_interval_ms.max(100)) * 5
}

/// The pair at start: retried for half a minute (the API server may be a moment away),
/// then given up on (the pod restarts, visibly).
async fn first_pair(
    client: &kube::Client,
    s: &certs::CertSettings,
) -> Result<certs::Pair, certs::CertError> {
    let mut tries = 0;
    loop {
        match certs::ensure(client, s, None).await {
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

/// Keeps the operator's certificates: every `every` reads the Secret again (it is
/// rotated or repaired there when due), publishes the bundle it says to trust (again each
/// time: an upgrade or a GitOps sync may have emptied it), and serves a new pair only once
/// a bundle that trusts it is published, so this replica is never unverifiable.
async fn keep_certificates(
    client: kube::Client,
    s: certs::CertSettings,
    cert: Arc<ReloadingCert>,
    mut serving: certs::Pair,
    every: Duration,
) {
    let what = format!("Secret {}/{}", s.namespace, s.secret);
    let mut latest = serving.clone();
    let mut published = s.webhook_configuration.is_none();
    loop {
        if let Some(name) = &s.webhook_configuration
            && !published
        {
            match certs::patch_ca_bundle(&client, name, &latest.bundle_pem).await {
                Ok(_) => published = true,
                Err(e) => tracing::warn!(error = %e, "setting the caBundle; retrying"),
            }
        }
        let new_pair = latest.cert_pem != serving.cert_pem || latest.key_pem != serving.key_pem;
        if new_pair && published {
            match cert.replace(&latest.cert_pem, &latest.key_pem, &what) {
                Ok(()) => {
                    tracing::info!("serving the webhook's new certificate");
                    serving = latest.clone();
                }
                Err(e) => {
                    tracing::error!(error = %e, "the new certificate is unusable; the previous one keeps serving")
                }
            }
        }
        tokio::time::sleep(if published {
            every
        } else {
            every.min(Duration::from_secs(2))
        })
        .await;
        match certs::ensure(&client, &s, Some(&serving.ca_pem)).await {
            Ok(next) => {
                latest = next;
                published = s.webhook_configuration.is_none();
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

async fn serve(args: &OperatorConfig, rules: Arc<Rules>) -> Result<(), StartError> {
    let metrics = Arc::new(Metrics::default());
    metrics.rules_status(&rules.status());
    let cert = match serving_cert(args) {
        Ok(c) => c,
        Err(e) => {
            return Err(StartError::new(e.to_string()));
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
                    return Err(StartError::new(e.to_string()));
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
                        return Err(StartError::new(e.to_string()));
                    }
                },
                Err(e) => {
                    return Err(StartError::new(format!("--tls-secret: {e}")));
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
            return Err(StartError::new(format!("--client-ca: {e}")));
        }
    };
    let tls = match cert
        .as_ref()
        .map(|c| c.server_config_verifying(client_ca.clone()))
        .transpose()
    {
        Ok(c) => c.map(Arc::new),
        Err(e) => {
            return Err(StartError::new(format!("TLS configuration: {e}")));
        }
    };
    // The metrics port's TLS: the serving certificate, or one made up for this process
    // (scrapers of a controller-only process verify its name no better than a Service's).
    let metrics_tls = match (&args.metrics_listen, &tls) {
        (None, _) => None,
        (Some(_), Some(_)) => match cert.as_ref().map(|c| c.server_config()).transpose() {
            Ok(c) => c.map(Arc::new),
            Err(e) => {
                return Err(StartError::new(format!("TLS configuration: {e}")));
            }
        },
        (Some(_), None) => match crate::runtime::tls::self_signed_config(&args.identity) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                return Err(StartError::new(format!(
                    "a certificate for --metrics-listen: {e}"
                )));
            }
        },
    };
    let client = match client(args).await {
        Ok(c) => c,
        Err(e) => {
            return Err(StartError::new(e.to_string()));
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
        records: match super::records::Sink::from_flag(
            &args.decision_log,
            args.decision_log_max_bytes,
            args.decision_log_keep,
        ) {
            None => None,
            Some(sink) => Some(
                super::records::Recorder::start(sink, args.decision_log_buffer, metrics.clone())
                    .map_err(|e| {
                        StartError::new(format!("--decision-log {}: {e}", args.decision_log))
                    })?,
            ),
        },
    });
    // Only the API server gets through a webhook that asks for a client certificate: its
    // admissions are the API server's, and the link says so.
    if let Some(records) = &state.records {
        records
            .admissions
            .set_callers_verified(client_ca.is_some() && tls.is_some());
    }
    let listener = match tls.as_ref() {
        _ if args.no_webhook => None,
        None => None,
        Some(_) => Some(
            bind(args.listen, "the webhook")
                .await
                .map_err(StartError::new)?,
        ),
    };
    let health_listener = match args.health_listen {
        None => None,
        Some(a) => Some(bind(a, "--health-listen").await.map_err(StartError::new)?),
    };
    let metrics_listener = match args.metrics_listen {
        None => None,
        Some(a) => Some(bind(a, "--metrics-listen").await.map_err(StartError::new)?),
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
                return Err(StartError::new(format!(
                    "--talosconfig {} would be used for the nodes of every TalosCluster; \
                     say that is meant with --talosconfig-for-all-clusters, or drop it and give \
                     each TalosCluster its own Secret in spec.talosConfigSecretRef",
                    path.display()
                )));
            }
            Some(path) => match std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|y| TalosTls::from_talosconfig(&y, None).map_err(|e| e.to_string()))
            {
                Ok(t) => Some(Arc::new(t)),
                Err(e) => {
                    return Err(StartError::new(format!(
                        "--talosconfig {}: {e}",
                        path.display()
                    )));
                }
            },
        };
        let settings = Settings {
            identity: args.identity.clone(),
            lease_namespace: args.lease_namespace.clone(),
            read_timeout: Duration::from_millis(args.read_timeout_ms),
            ..Settings::default()
        };
        let mut ctx = Context::new(
            client.clone(),
            rules.clone(),
            talos,
            settings,
            metrics.clone(),
        );
        // The controller's decisions and steps go to the webhook's sink, through its queue.
        if let Some(records) = &state.records {
            ctx = ctx.with_records(records.clone());
        }
        if let Some(cfg) = &args.admissions {
            match crate::runtime::admission_link::Lookup::new(cfg.clone(), metrics.clone()) {
                Ok(lookup) => ctx = ctx.with_admission_lookup(Arc::new(lookup)),
                Err(e) => {
                    return Err(StartError::new(format!("--admissions-url {e}")));
                }
            }
        }
        if let Some(path) = &args.step_log {
            match crate::runtime::exec::trace::StepLog::open(path) {
                Ok(log) => ctx = ctx.with_step_log(Arc::new(log)),
                Err(e) => {
                    return Err(StartError::new(format!(
                        "--step-log {}: {e}; give a file this process may append to",
                        path.display()
                    )));
                }
            }
        }
        let ctx = Arc::new(ctx);
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
                Reload::Replaced { rows, warnings } => {
                    metrics.reload(true);
                    tracing::info!(rows, warnings = warnings.len(), "rules reloaded");
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
            return Err(StartError::new(format!(
                "{e} ({RELOAD_STACK} bytes of stack)"
            )));
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
            keeper_interval(args),
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
            metrics_auth::Access::Reviewed(Box::new(metrics_auth::Reviewer::new(client.clone())))
        };
        tracing::info!(listen = %args.metrics_listen.map(|a| a.to_string()).unwrap_or_default(), "serving /metrics");
        let app = metrics_auth::metrics_router(
            metrics.clone(),
            access,
            !args.no_webhook,
            state.records.clone(),
        );
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
    Ok(())
}
