//! `ichor-rules serve`: the admission webhook over HTTPS, deciding from live reads.

use super::{EXIT_BAD_INPUT, EXIT_OK};
use crate::runtime::controller::{Context, Settings, leader};
use crate::runtime::live::LiveReader;
use crate::runtime::metrics::Metrics;
use crate::runtime::reload::{Reload, Rules};
use crate::runtime::talos::TalosTls;
use crate::runtime::tls::ReloadingCert;
use crate::runtime::webhook::{Webhook, router, serve_tls};
use clap::{Args, ValueEnum};
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
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// PEM certificate chain (reloaded when it changes).
    #[arg(long)]
    pub tls_cert: PathBuf,
    /// PEM private key (reloaded when it changes).
    #[arg(long)]
    pub tls_key: PathBuf,
    /// The API server URL, without credentials (tests); by default the in-cluster or
    /// kubeconfig configuration.
    #[arg(long)]
    pub api_server: Option<String>,
    /// Timeout of each live read, in milliseconds (keep it well below the webhook timeout).
    #[arg(long, default_value_t = 2000)]
    pub read_timeout_ms: u64,
    /// How often the rules and the certificate are checked for changes, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub reload_interval_ms: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// This replica's identity for leader election and events (in a cluster: the pod name).
    #[arg(long, env = "POD_NAME", default_value = "ichor-rules")]
    pub identity: String,
    /// The namespace of the leader-election Lease (in a cluster: the operator's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// A talosconfig file (the mounted Secret) whose current context's CA and client
    /// certificate the controller dials the Talos API with. Without it, nodes are not
    /// probed and a removal waits at its first Talos step.
    #[arg(long)]
    pub talosconfig: Option<PathBuf>,
    /// Serve the webhook only; do not run the controller.
    #[arg(long)]
    pub no_controller: bool,
}

pub fn run(args: &ServeArgs) -> u8 {
    init_logs(args.log_format);
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
    runtime.block_on(serve(args))
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
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

async fn serve(args: &ServeArgs) -> u8 {
    let rules = Arc::new(Rules::new(args.rules.clone()));
    match rules.reload() {
        Reload::Replaced { rows } => tracing::info!(rows, "rules loaded"),
        Reload::Rejected { reason } => {
            // Keep serving (refusing everything with a verb) until a good version arrives.
            tracing::error!(%reason, "the rules do not check; every guarded request is refused until they do");
        }
        Reload::Unchanged => {}
    }
    let cert = match ReloadingCert::new(args.tls_cert.clone(), args.tls_key.clone()) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let tls = match cert.server_config() {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("error: TLS configuration: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let client = match client(args).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let metrics = Arc::new(Metrics::default());
    let state = Arc::new(Webhook {
        rules: rules.clone(),
        reader: LiveReader::new(client.clone(), Duration::from_millis(args.read_timeout_ms)),
        metrics: metrics.clone(),
        api_ready: Default::default(),
    });
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", args.listen);
            return EXIT_BAD_INPUT;
        }
    };
    tracing::info!(listen = %args.listen, "serving the admission webhook");
    let controller = if args.no_controller {
        None
    } else {
        let talos = match &args.talosconfig {
            None => None,
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
    let watcher = {
        let (rules, cert, state, metrics) =
            (rules.clone(), cert.clone(), state.clone(), metrics.clone());
        tokio::spawn(async move {
            loop {
                match rules.reload() {
                    Reload::Replaced { rows } => {
                        metrics.reload(true);
                        tracing::info!(rows, "rules reloaded");
                    }
                    Reload::Rejected { reason } => {
                        metrics.reload(false);
                        tracing::error!(%reason, "new rules rejected; the previous table keeps serving");
                    }
                    Reload::Unchanged => {}
                }
                match cert.reload_if_changed() {
                    Ok(true) => tracing::info!("serving certificate reloaded"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "new certificate rejected; the previous one keeps serving")
                    }
                }
                if !state.api_ready.load(Ordering::Relaxed) {
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
    serve_tls(listener, tls, router(state), shutdown).await;
    watcher.abort();
    if let Some((ctx, task)) = controller {
        task.abort();
        let _ = task.await;
        leader::step_down(&ctx).await;
    }
    EXIT_OK
}
