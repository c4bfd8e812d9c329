//! `ichor-rules serve`: the admission webhook over HTTPS, deciding from live reads.

use super::{EXIT_BAD_INPUT, EXIT_OK};
use crate::runtime::logs;
use crate::runtime::operator::{OperatorConfig, start};
use clap::{Args, ValueEnum};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
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
    /// Append every removal, operation, backup, configuration and bootstrap reconcile's
    /// steps to this file, one JSON object per line: the state read, each Talos call and
    /// its answer, the decision, each effect and the outcome (`ichor-rules verify RULES
    /// --check-trace FILE` checks such a log against the model). Objects read are written as
    /// read (status, spec; never a Secret: a base configuration by its digest only).
    #[arg(long, value_name = "FILE")]
    pub step_log: Option<PathBuf>,
    /// Use --talosconfig for every TalosCluster that names no `spec.talosConfigSecretRef`
    /// (an explicit opt-in; a cluster that names one always uses its own).
    #[arg(long, requires = "talosconfig")]
    pub talosconfig_for_all_clusters: bool,
    /// The controller's own username, as the API server names it in an AdmissionReview's
    /// `userInfo.username` (in a cluster: `system:serviceaccount:<namespace>:<controller
    /// ServiceAccount>`; the chart sets it). Only requests by this user may change what the
    /// rules read in a TalosMachine's status, a TalosEtcdBackup's snapshot records and a
    /// TalosCluster's redacted base and Bootstrap record (`request.by_controller`; rules
    /// `status-only-by-controller`, `backup-status-only-by-controller`,
    /// `cluster-status-only-by-controller`). Without it no request is the controller's, and
    /// every such status change is refused.
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
    /// this Secret of --lease-namespace, created, rotated 30 days before expiry or repaired
    /// (when the CA did not sign the certificate, a key is not its certificate's, or a
    /// certificate expired or lacks a name) by whichever replica gets there first and
    /// checked by the others, held in memory.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls_secret: Option<String>,
    /// The Service the API server calls (with --tls-secret): the serving certificate is
    /// for <name>, <name>.<namespace>, <name>.<namespace>.svc and
    /// <name>.<namespace>.svc.cluster.local.
    #[arg(long, requires = "tls_secret")]
    pub service_name: Option<String>,
    /// The ValidatingWebhookConfiguration whose webhooks' caBundle is set to the CA of
    /// --tls-secret, with the previous CA for a while after a change of CA (and set again
    /// when something else changes it).
    #[arg(long, requires = "tls_secret")]
    pub webhook_configuration: Option<String>,
    /// Where the webhook writes one decision record per decision, as a JSON line:
    /// `stderr`, `off`, or a file (rotated by --decision-log-max-bytes). Records wait in a
    /// queue of --decision-log-buffer; when the sink is behind they are dropped (counted in
    /// `ichor_rules_decision_records_total{outcome="dropped"}` and logged), never waited
    /// for. `ichor-rules replay` decides them again (docs/operators.md).
    #[arg(long, value_name = "stderr|off|FILE", default_value = "stderr")]
    pub decision_log: String,
    /// A --decision-log file is renamed FILE.1 (older ones FILE.2, ...) past this size.
    #[arg(long, default_value_t = 100 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub decision_log_max_bytes: u64,
    /// How many rotated --decision-log files are kept.
    #[arg(long, default_value_t = 3)]
    pub decision_log_keep: u32,
    /// How many decision records may wait for the sink before new ones are dropped.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub decision_log_buffer: u64,
    /// Run this rule in audit mode whatever its text says: evaluated and recorded (its
    /// would-be verdict in the decision record and `ichor_rules_would_refuse_total`), never
    /// refusing, holding or warning. Repeatable (the chart's `rules.audit`).
    #[arg(long, value_name = "RULE")]
    pub audit_rule: Vec<String>,
    /// Enforce this rule even when its text says `audit` (the chart's `rules.enforce`).
    /// Repeatable; a rule named by both is enforced.
    #[arg(long, value_name = "RULE")]
    pub enforce_rule: Vec<String>,
    /// The controller links its decision and step records to the admission that let the
    /// work in (a TalosMachine's deletion, a TalosOperation's creation) by asking the
    /// webhook for it at this URL (`https://HOST:PORT/admissions`: the webhook's
    /// --metrics-listen port, which answers a caller allowed `get` on the non-resource URL
    /// /admissions), with its ServiceAccount token, when this process's webhook did not
    /// decide it. A lookup that fails leaves `admission` out and says why
    /// (`admission_lookup`); it never delays a step more than --admissions-timeout-ms.
    #[arg(long, value_name = "URL", requires = "admissions_ca")]
    pub admissions_url: Option<String>,
    /// PEM CA certificate(s) that signed the webhook's serving certificate (the chart
    /// mounts `ca.crt` of the webhook's TLS Secret); the certificate must carry the host of
    /// --admissions-url. Read at each lookup, so a rotated CA is taken up.
    #[arg(long, value_name = "FILE", requires = "admissions_url")]
    pub admissions_ca: Option<PathBuf>,
    /// A DNS name whose every address (up to 16) is asked on the port of --admissions-url,
    /// each checked against the host of --admissions-url: a headless Service of the webhook
    /// pods, since each replica keeps the admissions it decided. Without it, the host of
    /// --admissions-url is asked.
    #[arg(long, value_name = "DNS-NAME", requires = "admissions_url")]
    pub admissions_peers: Option<String>,
    /// The bearer token sent to --admissions-url (read at each lookup: projected tokens
    /// rotate).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub admissions_token: PathBuf,
    /// How long a lookup at --admissions-url may take, in milliseconds, every replica
    /// included. Answers are kept a while (an admission found 60 s, none 5 s).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=30_000))]
    pub admissions_timeout_ms: u64,
}

pub fn run(args: &ServeArgs) -> u8 {
    let queue = init_logs(args.log_format);
    let code = match start(&config(args)) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("error: {}", e.message);
            for d in &e.details {
                eprintln!("  {d}");
            }
            EXIT_BAD_INPUT
        }
    };
    if let Some(q) = queue {
        q.flush(Duration::from_secs(1));
    }
    code
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

/// The operator's configuration from the flags.
fn config(a: &ServeArgs) -> OperatorConfig {
    OperatorConfig {
        rules: a.rules.clone(),
        listen: a.listen,
        tls_cert: a.tls_cert.clone(),
        tls_key: a.tls_key.clone(),
        api_server: a.api_server.clone(),
        read_timeout_ms: a.read_timeout_ms,
        max_inflight_reads: a.max_inflight_reads,
        reload_interval_ms: a.reload_interval_ms,
        max_connections: a.max_connections,
        tls_handshake_timeout_ms: a.tls_handshake_timeout_ms,
        header_read_timeout_ms: a.header_read_timeout_ms,
        body_read_timeout_ms: a.body_read_timeout_ms,
        idle_timeout_ms: a.idle_timeout_ms,
        identity: a.identity.clone(),
        lease_namespace: a.lease_namespace.clone(),
        talosconfig: a.talosconfig.clone(),
        step_log: a.step_log.clone(),
        talosconfig_for_all_clusters: a.talosconfig_for_all_clusters,
        controller_username: a.controller_username.clone(),
        no_controller: a.no_controller,
        no_webhook: a.no_webhook,
        health_listen: a.health_listen,
        metrics_listen: a.metrics_listen,
        metrics_insecure: a.metrics_insecure,
        client_ca: a.client_ca.clone(),
        tls_secret: a.tls_secret.clone(),
        service_name: a.service_name.clone(),
        webhook_configuration: a.webhook_configuration.clone(),
        decision_log: a.decision_log.clone(),
        decision_log_max_bytes: a.decision_log_max_bytes,
        decision_log_keep: a.decision_log_keep,
        decision_log_buffer: usize::try_from(a.decision_log_buffer).unwrap_or(1024),
        admissions: a.admissions_url.as_ref().map(|url| {
            crate::runtime::admission_link::LookupConfig {
                url: url.clone(),
                ca: a.admissions_ca.clone().unwrap_or_default(),
                peers: a.admissions_peers.clone(),
                token: a.admissions_token.clone(),
                timeout: Duration::from_millis(a.admissions_timeout_ms),
            }
        }),
        rule_modes: crate::runtime::reload::rule_modes(&a.audit_rule, &a.enforce_rule),
    }
}
