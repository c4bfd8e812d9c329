//! The Talos machine API client: etcd membership, leadership, reset, version and the
//! operations (reboot, shutdown, both upgrade paths, rollback, the boot time) over gRPC
//! with mutual TLS, as `talosctl` speaks it.
//!
//! The wire types come from `proto/` (a subset of Talos' own `.proto` files, generated at
//! build time). Every response carries one entry per node, and each entry may carry the
//! node's own error even when the call itself succeeded; every call here checks them. A
//! failure is either [`TalosError::Unreachable`] (no answer: dial failure, TLS refusal,
//! deadline, `Unavailable`) or [`TalosError::Failed`] (the node answered with an error).

use base64::Engine as _;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The generated protobuf types, gRPC client and gRPC server of the machine API.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    /// Talos' `common` package: per-node metadata.
    pub mod common {
        tonic::include_proto!("common");
    }
    /// The `google.rpc` status carried in the metadata.
    pub mod google {
        /// `google.rpc`.
        pub mod rpc {
            tonic::include_proto!("google.rpc");
        }
    }
    /// Talos' `machine` package: `MachineService`.
    pub mod machine {
        tonic::include_proto!("machine");
    }
}

use proto::common::Metadata;
use proto::machine as pb;
use proto::machine::image_service_client::ImageServiceClient;
use proto::machine::lifecycle_service_client::LifecycleServiceClient;
use proto::machine::machine_service_client::MachineServiceClient;

/// The port apid listens on; appended to endpoints that name none.
pub const APID_PORT: u16 = 50000;

/// The gRPC metadata key that makes apid proxy a request to one node.
pub const NODE_METADATA_KEY: &str = "node";

/// A failed Talos API call or unusable Talos configuration.
#[derive(Debug, thiserror::Error)]
pub enum TalosError {
    /// The talosconfig, the TLS material or the endpoint cannot be used.
    #[error("talos config: {0}")]
    Config(String),
    /// No answer from the node: the dial failed, TLS was refused, the deadline passed, or
    /// the node (or the proxy on its behalf) reported it unavailable.
    #[error("Talos API {} unreachable: {detail}", describe(.endpoint, .node))]
    Unreachable {
        /// The endpoint dialled (`host:port`).
        endpoint: String,
        /// The node the request was meant for, when it was proxied through the endpoint.
        node: Option<String>,
        /// Why: the dial or transport error, or the deadline.
        detail: String,
    },
    /// The node answered with an error.
    #[error("Talos API {} failed: {code:?}: {message}", describe(.endpoint, .node))]
    Failed {
        /// The endpoint dialled (`host:port`).
        endpoint: String,
        /// The node that answered, when the request was proxied through the endpoint.
        node: Option<String>,
        /// The gRPC code of the failure.
        code: Code,
        /// The node's error message.
        message: String,
    },
}

fn describe(endpoint: &str, node: &Option<String>) -> String {
    match node {
        Some(node) => format!("of node {node} (through {endpoint})"),
        None => format!("at {endpoint}"),
    }
}

impl TalosError {
    /// A stable, low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            TalosError::Config(_) => "config",
            TalosError::Unreachable { .. } => "unreachable",
            TalosError::Failed { .. } => "failed",
        }
    }

    /// Whether the node did not answer (as opposed to answering with an error).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, TalosError::Unreachable { .. })
    }
}

/// The TLS material of a talosconfig context: the cluster CA (to verify the node) and the
/// client certificate and key (to present to it), all PEM.
#[derive(Clone)]
pub struct TalosTls {
    ca: Vec<u8>,
    crt: Vec<u8>,
    key: Vec<u8>,
}

impl fmt::Debug for TalosTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TalosTls")
            .field("ca", &format_args!("{} bytes", self.ca.len()))
            .field("crt", &format_args!("{} bytes", self.crt.len()))
            .field("key", &"<redacted>")
            .finish()
    }
}

impl TalosTls {
    /// The TLS material of the current context of a talosconfig (`context:`), or of the
    /// named one.
    pub fn from_talosconfig(yaml: &str, context: Option<&str>) -> Result<TalosTls, TalosError> {
        TalosContext::from_talosconfig(yaml, context).map(|c| c.tls)
    }

    /// TLS material from PEM: the CA certificate(s), the client certificate (chain) and its
    /// private key. Talos writes Ed25519 keys with the label `ED25519 PRIVATE KEY` around
    /// PKCS#8 bytes; those are accepted too.
    pub fn from_pem(ca: &[u8], crt: &[u8], key: &[u8]) -> Result<TalosTls, TalosError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let certs = |what: &str, pem: &[u8]| -> Result<(), TalosError> {
            let mut n = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                cert.map_err(|e| {
                    TalosError::Config(format!(
                        "{what}: not a PEM certificate ({})",
                        crate::runtime::tls::pem_problem(&e)
                    ))
                })?;
                n += 1;
            }
            if n == 0 {
                return Err(TalosError::Config(format!(
                    "{what}: no PEM certificate found"
                )));
            }
            Ok(())
        };
        certs("ca", ca)?;
        certs("crt", crt)?;
        let key = normalize_key_label(key);
        PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
            TalosError::Config(format!(
                "key: not a PEM private key ({})",
                crate::runtime::tls::pem_problem(&e)
            ))
        })?;
        Ok(TalosTls {
            ca: ca.to_vec(),
            crt: crt.to_vec(),
            key,
        })
    }
}

/// Rewrites Talos' `ED25519 PRIVATE KEY` PEM label (PKCS#8 content) to `PRIVATE KEY`.
fn normalize_key_label(key: &[u8]) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(key) else {
        return key.to_vec();
    };
    text.replace("BEGIN ED25519 PRIVATE KEY", "BEGIN PRIVATE KEY")
        .replace("END ED25519 PRIVATE KEY", "END PRIVATE KEY")
        .into_bytes()
}

/// One context of a talosconfig: where to dial, which nodes it addresses, and the TLS
/// material.
#[derive(Clone, Debug)]
pub struct TalosContext {
    /// The context's name.
    pub name: String,
    /// Endpoints to dial (`host` or `host:port`).
    pub endpoints: Vec<String>,
    /// Default target nodes.
    pub nodes: Vec<String>,
    /// CA, client certificate and key.
    pub tls: TalosTls,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    contexts: BTreeMap<String, Option<RawContext>>,
}

#[derive(Deserialize)]
struct RawContext {
    #[serde(default)]
    endpoints: Vec<String>,
    #[serde(default)]
    nodes: Vec<String>,
    #[serde(default)]
    ca: Option<String>,
    #[serde(default)]
    crt: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

/// What is wrong with a talosconfig. [`ConfigProblem::detail`] names contexts and the
/// parser's detail (for the operator's own file, `serve --talosconfig`);
/// [`ConfigProblem::without_content`] quotes nothing of the talosconfig, not even a
/// context's name (for one read from a Secret, whose content is never shown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigProblem {
    /// Not YAML of the talosconfig shape (the parser's words, which may quote the text).
    NotYaml(String),
    NoCurrentContext,
    NoSuchContext {
        name: String,
        known: Vec<String>,
    },
    EmptyContext(String),
    Missing {
        context: String,
        field: &'static str,
    },
    NotBase64 {
        context: String,
        field: &'static str,
    },
    /// The TLS material (`ca: no PEM certificate found`, ...): words of ours, no content.
    Tls {
        context: String,
        what: String,
    },
}

impl ConfigProblem {
    /// The problem, naming the contexts and with the YAML parser's detail.
    pub fn detail(&self) -> String {
        match self {
            ConfigProblem::NotYaml(e) => {
                format!("talosconfig is not valid YAML of the expected shape: {e}")
            }
            ConfigProblem::NoCurrentContext => {
                "talosconfig names no current context (`context:`)".into()
            }
            ConfigProblem::NoSuchContext { name, known } => format!(
                "talosconfig has no context `{name}` (contexts: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
            ConfigProblem::EmptyContext(name) => format!("talosconfig context `{name}` is empty"),
            ConfigProblem::Missing { context, field } => {
                format!("talosconfig context `{context}` has no `{field}`")
            }
            ConfigProblem::NotBase64 { context, field } => {
                format!("talosconfig context `{context}`: `{field}` is not base64")
            }
            ConfigProblem::Tls { context, what } => {
                format!("talosconfig context `{context}`: {what}")
            }
        }
    }

    /// The problem in words that quote nothing of the talosconfig.
    pub fn without_content(&self) -> String {
        match self {
            ConfigProblem::NotYaml(_) => "it is not YAML of the talosconfig shape".into(),
            ConfigProblem::NoCurrentContext => "it names no current context (`context:`)".into(),
            ConfigProblem::NoSuchContext { .. } => {
                "it has no context of the name its `context:` gives".into()
            }
            ConfigProblem::EmptyContext(_) => "its current context is empty".into(),
            ConfigProblem::Missing { field, .. } => {
                format!("its current context has no `{field}`")
            }
            ConfigProblem::NotBase64 { field, .. } => {
                format!("the `{field}` of its current context is not base64")
            }
            ConfigProblem::Tls { what, .. } => format!("its current context's {what}"),
        }
    }
}

impl From<ConfigProblem> for TalosError {
    fn from(p: ConfigProblem) -> TalosError {
        TalosError::Config(p.detail())
    }
}

impl TalosContext {
    /// Reads a talosconfig (`context: <current>`, `contexts: {<name>: {endpoints, nodes,
    /// ca, crt, key}}` with base64 PEM) and returns the current context, or the named one.
    pub fn from_talosconfig(yaml: &str, context: Option<&str>) -> Result<TalosContext, TalosError> {
        TalosContext::parse(yaml, context).map_err(TalosError::from)
    }

    /// [`TalosContext::from_talosconfig`], saying what is wrong as a [`ConfigProblem`].
    pub fn parse(yaml: &str, context: Option<&str>) -> Result<TalosContext, ConfigProblem> {
        use serde::Deserialize;
        // The one bounded loader: nesting checked before the parser sees it.
        let raw = super::nesting::yaml(yaml)
            .map_err(|e| ConfigProblem::NotYaml(format!("{e}; a talosconfig nests far less")))
            .and_then(|de| {
                RawConfig::deserialize(de).map_err(|e| ConfigProblem::NotYaml(e.to_string()))
            })?;
        let name = match context {
            Some(name) => name.to_string(),
            None => raw
                .context
                .filter(|c| !c.is_empty())
                .ok_or(ConfigProblem::NoCurrentContext)?,
        };
        let ctx = match raw.contexts.get(&name) {
            Some(Some(ctx)) => ctx,
            Some(None) => return Err(ConfigProblem::EmptyContext(name)),
            None => {
                return Err(ConfigProblem::NoSuchContext {
                    name,
                    known: raw.contexts.keys().cloned().collect(),
                });
            }
        };
        let field =
            |what: &'static str, value: &Option<String>| -> Result<Vec<u8>, ConfigProblem> {
                let value = value
                    .as_deref()
                    .filter(|v| !v.trim().is_empty())
                    .ok_or_else(|| ConfigProblem::Missing {
                        context: name.clone(),
                        field: what,
                    })?;
                let compact: String = value.chars().filter(|c| !c.is_whitespace()).collect();
                // The decoder's error names the offending byte: not shown.
                base64::engine::general_purpose::STANDARD
                    .decode(compact.as_bytes())
                    .map_err(|_| ConfigProblem::NotBase64 {
                        context: name.clone(),
                        field: what,
                    })
            };
        let ca = field("ca", &ctx.ca)?;
        let crt = field("crt", &ctx.crt)?;
        let key = field("key", &ctx.key)?;
        let tls = TalosTls::from_pem(&ca, &crt, &key).map_err(|e| ConfigProblem::Tls {
            context: name.clone(),
            what: match e {
                TalosError::Config(m) => m,
                other => other.to_string(),
            },
        })?;
        Ok(TalosContext {
            name,
            endpoints: ctx.endpoints.clone(),
            nodes: ctx.nodes.clone(),
            tls,
        })
    }
}

/// An etcd member as a Talos node lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EtcdMember {
    /// The etcd member ID.
    pub id: u64,
    /// The member name (the node's hostname).
    pub hostname: String,
    /// Peer URLs.
    pub peer_urls: Vec<String>,
    /// Client URLs (empty until the member first started).
    pub client_urls: Vec<String>,
    /// A learner (non-voting) member.
    pub is_learner: bool,
}

/// The status of one node's etcd member.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EtcdStatus {
    /// This member's ID.
    pub member_id: u64,
    /// The leader's member ID as this member sees it; 0 when it sees no leader.
    pub leader: u64,
    /// The etcd server version.
    pub protocol_version: String,
    /// Database size in bytes.
    pub db_size: i64,
    /// Logically used database bytes.
    pub db_size_in_use: i64,
    /// Raft index.
    pub raft_index: u64,
    /// Raft term.
    pub raft_term: u64,
    /// Applied raft index.
    pub raft_applied_index: u64,
    /// Errors and alarms the member reports.
    pub errors: Vec<String>,
    /// A learner (non-voting) member.
    pub is_learner: bool,
}

impl EtcdStatus {
    /// Whether this member sees a leader.
    pub fn has_leader(&self) -> bool {
        self.leader != 0
    }

    /// Whether this member is the leader.
    pub fn is_leader(&self) -> bool {
        self.leader != 0 && self.leader == self.member_id
    }
}

/// `ApplyConfigurationRequest.Mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ApplyMode {
    /// What a dry run answers when applying needs a reboot (deprecated as a request).
    Reboot,
    /// Talos applies without a reboot when it can, and reboots when it must.
    Auto,
    /// Applied now, or refused when it needs a reboot.
    NoReboot,
    /// Kept for the next boot.
    Staged,
    Try,
}

impl ApplyMode {
    fn wire(self) -> pb::apply_configuration_request::Mode {
        use pb::apply_configuration_request::Mode as M;
        match self {
            ApplyMode::Reboot => M::Reboot,
            ApplyMode::Auto => M::Auto,
            ApplyMode::NoReboot => M::NoReboot,
            ApplyMode::Staged => M::Staged,
            ApplyMode::Try => M::Try,
        }
    }

    fn from_wire(v: i32) -> ApplyMode {
        use pb::apply_configuration_request::Mode as M;
        match M::try_from(v) {
            Ok(M::Auto) => ApplyMode::Auto,
            Ok(M::NoReboot) => ApplyMode::NoReboot,
            Ok(M::Staged) => ApplyMode::Staged,
            Ok(M::Try) => ApplyMode::Try,
            Ok(M::Reboot) | Err(_) => ApplyMode::Reboot,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ApplyMode::Reboot => "reboot",
            ApplyMode::Auto => "auto",
            ApplyMode::NoReboot => "no-reboot",
            ApplyMode::Staged => "staged",
            ApplyMode::Try => "try",
        }
    }
}

/// What stands for a dry run's details (see [`TalosClient::apply_configuration`]).
pub const DRY_RUN_DETAILS_WITHHELD: &str = "(the dry run's diff is not kept: it may carry secrets)";

/// What Talos answered to an `ApplyConfiguration`: the mode it chose (or, for a dry run,
/// would choose), its explanation (never a dry run's, which is a diff of the configuration)
/// and its validation warnings.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Applied {
    pub mode: ApplyMode,
    pub details: String,
    pub warnings: Vec<String>,
}

/// `RebootRequest.Mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebootMode {
    Default,
    Powercycle,
    /// Skip the graceful shutdown.
    Force,
}

/// The legacy `MachineService/Upgrade` request (Talos before 1.13): the node pulls the
/// installer, installs it, drains itself and reboots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LegacyUpgrade {
    /// The installer image reference.
    pub image: String,
    pub preserve: bool,
    /// Stage the upgrade for the next reboot.
    pub stage: bool,
    /// Skip Talos' own etcd checks on a control plane.
    pub force: bool,
    /// Power-cycle instead of rebooting.
    pub powercycle: bool,
}

/// How a `LifecycleService/Upgrade` stream ended: its `exit_code` (non-zero: the upgrade
/// failed, which the server does not report as an error) and its last progress message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    pub exit_code: i32,
    pub last_message: String,
}

/// The containerd instance the installer image is pulled into and installed from, as
/// `talosctl upgrade` uses by default (`--namespace system`).
fn system_containerd() -> proto::common::ContainerdInstance {
    proto::common::ContainerdInstance {
        driver: proto::common::ContainerDriver::Cri as i32,
        namespace: proto::common::ContainerdNamespace::NsSystem as i32,
    }
}

/// A Talos machine API client over one mTLS connection to one endpoint. Cheap to clone;
/// clones share the connection.
#[derive(Clone)]
pub struct TalosClient {
    inner: MachineServiceClient<Channel>,
    lifecycle: LifecycleServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    endpoint: Arc<str>,
    node: Option<Arc<str>>,
    timeout: Duration,
}

impl fmt::Debug for TalosClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TalosClient")
            .field("endpoint", &self.endpoint)
            .field("node", &self.node)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Splits `host`, `host:port`, `[v6]:port` or a bare IPv6 address into host and port.
fn split_endpoint(endpoint: &str) -> Result<(String, u16), TalosError> {
    let endpoint = endpoint.trim();
    let bad = |why: &str| TalosError::Config(format!("endpoint `{endpoint}`: {why}"));
    if endpoint.is_empty() {
        return Err(bad("empty"));
    }
    if endpoint.contains("://") || endpoint.contains('/') {
        return Err(bad("expected `host` or `host:port`, not a URL"));
    }
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| bad("the port is not a number from 1 to 65535"))
    };
    if let Some(rest) = endpoint.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(|| bad("unclosed `[`"))?;
        let p = match tail {
            "" => APID_PORT,
            t => port(
                t.strip_prefix(':')
                    .ok_or_else(|| bad("expected `:port` after `]`"))?,
            )?,
        };
        return Ok((host.to_string(), p));
    }
    if endpoint.parse::<std::net::Ipv6Addr>().is_ok() {
        return Ok((endpoint.to_string(), APID_PORT));
    }
    match endpoint.rsplit_once(':') {
        Some((host, p)) if !host.is_empty() => Ok((host.to_string(), port(p)?)),
        Some(_) => Err(bad("no host")),
        None => Ok((endpoint.to_string(), APID_PORT)),
    }
}

impl TalosClient {
    /// A client of the Talos API at `endpoint` (`host` or `host:port`; port 50000 when
    /// missing). It connects lazily, on the first call, verifying the node's certificate
    /// against the CA and the endpoint's IP or name, and presenting the client certificate.
    /// `timeout` bounds each call (and the dial). Must be called within a Tokio runtime.
    pub fn new(
        endpoint: &str,
        tls: &TalosTls,
        timeout: Duration,
    ) -> Result<TalosClient, TalosError> {
        let (host, port) = split_endpoint(endpoint)?;
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(TalosError::Config(
                "TalosClient::new needs a Tokio runtime".into(),
            ));
        }
        let tls_config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&tls.ca))
            .identity(Identity::from_pem(&tls.crt, &tls.key))
            .domain_name(host.clone());
        let channel = Endpoint::from_shared(format!("https://{authority}"))
            .map_err(|e| TalosError::Config(format!("endpoint `{endpoint}`: {e}")))?
            .tls_config(tls_config)
            .map_err(|e| TalosError::Config(format!("TLS for `{endpoint}`: {}", chain(&e))))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_lazy();
        Ok(TalosClient {
            inner: MachineServiceClient::new(channel.clone()),
            lifecycle: LifecycleServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            endpoint: authority.into(),
            node: None,
            timeout,
        })
    }

    /// A client of a node in Talos' maintenance mode (`talosctl --insecure`): before its
    /// first configuration a node serves the API with a self-signed certificate and asks
    /// for no client certificate, so this client presents none and accepts any server
    /// certificate (the handshake's signatures are still checked). Talos serves only a few
    /// calls there (`Version`, `ApplyConfiguration`); whoever answers at the endpoint gets
    /// what is sent, as with `talosctl apply-config --insecure`.
    pub fn maintenance(endpoint: &str, timeout: Duration) -> Result<TalosClient, TalosError> {
        let (host, port) = split_endpoint(endpoint)?;
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(TalosError::Config(
                "TalosClient::maintenance needs a Tokio runtime".into(),
            ));
        }
        let connector = insecure::Connector::new(&host, &authority)?;
        let channel = Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|e| TalosError::Config(format!("endpoint `{endpoint}`: {e}")))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_with_connector_lazy(connector);
        Ok(TalosClient {
            inner: MachineServiceClient::new(channel.clone()),
            lifecycle: LifecycleServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            endpoint: authority.into(),
            node: None,
            timeout,
        })
    }

    /// The same connection, with every request proxied by the endpoint's apid to `node`
    /// (gRPC metadata `node: <node>`).
    pub fn with_node(&self, node: &str) -> TalosClient {
        TalosClient {
            node: Some(node.into()),
            ..self.clone()
        }
    }

    /// The endpoint dialled, as `host:port`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The node requests are proxied to, if any.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// The node's Talos version tag, e.g. `v1.9.0`.
    pub async fn version(&self) -> Result<String, TalosError> {
        let resp = self
            .call(|mut c, r| async move { c.version(r).await }, ())
            .await?;
        let entry = self.single(resp.messages, |m| m.metadata.as_ref())?;
        Ok(entry.version.map(|v| v.tag).unwrap_or_default())
    }

    /// The etcd members, as this node's etcd lists them.
    pub async fn etcd_member_list(&self) -> Result<Vec<EtcdMember>, TalosError> {
        let req = pb::EtcdMemberListRequest { query_local: false };
        let resp = self
            .call(|mut c, r| async move { c.etcd_member_list(r).await }, req)
            .await?;
        let entry = self.single(resp.messages, |m| m.metadata.as_ref())?;
        Ok(entry
            .members
            .into_iter()
            .map(|m| EtcdMember {
                id: m.id,
                hostname: m.hostname,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                is_learner: m.is_learner,
            })
            .collect())
    }

    /// The status of this node's etcd member.
    pub async fn etcd_status(&self) -> Result<EtcdStatus, TalosError> {
        let resp = self
            .call(|mut c, r| async move { c.etcd_status(r).await }, ())
            .await?;
        let entry = self.single(resp.messages, |m| m.metadata.as_ref())?;
        let s = entry.member_status.ok_or_else(|| {
            self.failed(Code::Internal, "the status entry carries no member status")
        })?;
        Ok(EtcdStatus {
            member_id: s.member_id,
            leader: s.leader,
            protocol_version: s.protocol_version,
            db_size: s.db_size,
            db_size_in_use: s.db_size_in_use,
            raft_index: s.raft_index,
            raft_term: s.raft_term,
            raft_applied_index: s.raft_applied_index,
            errors: s.errors,
            is_learner: s.is_learner,
        })
    }

    /// Moves etcd leadership away from this node's member if it leads; returns the name of
    /// the member that gave up leadership (empty when this member did not lead).
    pub async fn etcd_forfeit_leadership(&self) -> Result<String, TalosError> {
        let resp = self
            .call(
                |mut c, r| async move { c.etcd_forfeit_leadership(r).await },
                pb::EtcdForfeitLeadershipRequest {},
            )
            .await?;
        let entry = self.single(resp.messages, |m| m.metadata.as_ref())?;
        Ok(entry.member)
    }

    /// Makes this node's etcd member leave the cluster (and stop).
    pub async fn etcd_leave_cluster(&self) -> Result<(), TalosError> {
        let resp = self
            .call(
                |mut c, r| async move { c.etcd_leave_cluster(r).await },
                pb::EtcdLeaveClusterRequest {},
            )
            .await?;
        self.check_all(&resp.messages, |m| m.metadata.as_ref())
    }

    /// Removes the etcd member `id` through this node (for members with no live node).
    pub async fn etcd_remove_member_by_id(&self, id: u64) -> Result<(), TalosError> {
        let resp = self
            .call(
                |mut c, r| async move { c.etcd_remove_member_by_id(r).await },
                pb::EtcdRemoveMemberByIdRequest { member_id: id },
            )
            .await?;
        self.check_all(&resp.messages, |m| m.metadata.as_ref())
    }

    /// Resets the node: `graceful` leaves etcd first; `reboot` reboots afterwards (else
    /// halts). System disk and user disks are wiped (Talos' default mode). Returns the
    /// `actor_id` of the reset's events.
    pub async fn reset(&self, graceful: bool, reboot: bool) -> Result<String, TalosError> {
        let req = pb::ResetRequest {
            graceful,
            reboot,
            ..Default::default()
        };
        let resp = self
            .call(|mut c, r| async move { c.reset(r).await }, req)
            .await?;
        Ok(self
            .single(resp.messages, |m| m.metadata.as_ref())?
            .actor_id)
    }

    /// Sends a machine configuration (`ApplyConfiguration`); `dry_run` asks Talos to
    /// validate it and say what applying it would do, changing nothing. The configuration
    /// holds the cluster's secrets: it is never logged, and an error carries Talos' message
    /// only.
    pub async fn apply_configuration(
        &self,
        data: &[u8],
        mode: ApplyMode,
        dry_run: bool,
    ) -> Result<Applied, TalosError> {
        let req = pb::ApplyConfigurationRequest {
            data: data.to_vec(),
            mode: mode.wire() as i32,
            dry_run,
        };
        let resp = self
            .call(
                |mut c, r| async move { c.apply_configuration(r).await },
                req,
            )
            .await?;
        let m = self.single(resp.messages, |m| m.metadata.as_ref())?;
        Ok(Applied {
            mode: ApplyMode::from_wire(m.mode),
            // A dry run's details are a diff of the configuration (Talos'
            // `configdiff.DiffConfigs`, of the whole configuration for a node in
            // maintenance mode): they carry the cluster's secrets, so they are dropped
            // here, before anything (a status, an Event, a log, a step log) can see them.
            details: if dry_run {
                DRY_RUN_DETAILS_WITHHELD.to_string()
            } else {
                m.mode_details
            },
            warnings: m.warnings,
        })
    }

    /// Bootstraps etcd on this control plane (`Bootstrap`): once per cluster, ever.
    pub async fn bootstrap(&self) -> Result<(), TalosError> {
        let resp = self
            .call(
                |mut c, r| async move { c.bootstrap(r).await },
                pb::BootstrapRequest::default(),
            )
            .await?;
        self.check_all(&resp.messages, |m| m.metadata.as_ref())
    }

    /// How many entries the directory `root` of the node holds (`MachineService/List`, not
    /// recursing: the directory itself, then its entries; counted, never kept, so a node
    /// that streams without end costs nothing but the deadline). An entry Talos could not
    /// read, or a listing of the node that reports an error, is a failure.
    pub async fn list_entries(&self, root: &str) -> Result<u64, TalosError> {
        let req = pb::ListRequest {
            root: root.to_string(),
            recurse: false,
            recursion_depth: 0,
        };
        let stream = self
            .call_on(
                self.inner.clone(),
                |mut c, r| async move { c.list(r).await },
                req,
                self.timeout,
            )
            .await?;
        let root = root.trim_end_matches('/');
        let mut entries: u64 = 0;
        let mut failed: Option<String> = None;
        self.drain_stream(stream, self.timeout, |f: pb::FileInfo| {
            if let Some(e) = self.entry_error(f.metadata.as_ref()) {
                failed.get_or_insert(e.to_string());
            } else if !f.error.is_empty() {
                failed.get_or_insert(format!("{}: {}", f.name, f.error));
            } else if f.relative_name != "." && f.name.trim_end_matches('/') != root {
                entries = entries.saturating_add(1);
            }
        })
        .await?;
        match failed {
            Some(why) => Err(self.failed(Code::Internal, &format!("listing {root}: {why}"))),
            None => Ok(entries),
        }
    }

    /// Reboots the node (`Reboot`). Talos does not cordon or drain for it: the caller does.
    /// Returns the `actor_id` of the reboot's events.
    pub async fn reboot(&self, mode: RebootMode) -> Result<String, TalosError> {
        let mode = match mode {
            RebootMode::Default => pb::reboot_request::Mode::Default,
            RebootMode::Powercycle => pb::reboot_request::Mode::Powercycle,
            RebootMode::Force => pb::reboot_request::Mode::Force,
        };
        let req = pb::RebootRequest { mode: mode as i32 };
        let resp = self
            .call(|mut c, r| async move { c.reboot(r).await }, req)
            .await?;
        Ok(self
            .single(resp.messages, |m| m.metadata.as_ref())?
            .actor_id)
    }

    /// Shuts the node down (`Shutdown`); `force` skips Talos' own cordon and drain.
    pub async fn shutdown(&self, force: bool) -> Result<String, TalosError> {
        let req = pb::ShutdownRequest { force };
        let resp = self
            .call(|mut c, r| async move { c.shutdown(r).await }, req)
            .await?;
        Ok(self
            .single(resp.messages, |m| m.metadata.as_ref())?
            .actor_id)
    }

    /// The legacy `MachineService/Upgrade` (Talos before 1.13); returns Talos' `ack`.
    pub async fn upgrade_legacy(&self, u: &LegacyUpgrade) -> Result<String, TalosError> {
        let mode = if u.powercycle {
            pb::upgrade_request::RebootMode::Powercycle
        } else {
            pb::upgrade_request::RebootMode::Default
        };
        let req = pb::UpgradeRequest {
            image: u.image.clone(),
            preserve: u.preserve,
            stage: u.stage,
            force: u.force,
            reboot_mode: mode as i32,
        };
        let resp = self
            .call(|mut c, r| async move { c.upgrade(r).await }, req)
            .await?;
        Ok(self.single(resp.messages, |m| m.metadata.as_ref())?.ack)
    }

    /// Switches the node back to its previous Talos image and reboots (`Rollback`).
    pub async fn rollback(&self) -> Result<(), TalosError> {
        let resp = self
            .call(
                |mut c, r| async move { c.rollback(r).await },
                pb::RollbackRequest {},
            )
            .await?;
        self.check_all(&resp.messages, |m| m.metadata.as_ref())
    }

    /// The node's boot time (`SystemStat.boot_time`, seconds since the epoch): a new value
    /// says the node rebooted.
    pub async fn boot_time(&self) -> Result<u64, TalosError> {
        let resp = self
            .call(|mut c, r| async move { c.system_stat(r).await }, ())
            .await?;
        Ok(self
            .single(resp.messages, |m| m.metadata.as_ref())?
            .boot_time)
    }

    /// Pulls `image_ref` into the system containerd (`ImageService/Pull`, a stream read to
    /// its end within `deadline`); the pulled image's name, for [`TalosClient::lifecycle_upgrade`].
    pub async fn image_pull(
        &self,
        image_ref: &str,
        deadline: Duration,
    ) -> Result<String, TalosError> {
        let req = pb::ImageServicePullRequest {
            containerd: Some(system_containerd()),
            image_ref: image_ref.to_string(),
        };
        let stream = self
            .call_on(
                self.images.clone(),
                |mut c, r| async move { c.pull(r).await },
                req,
                deadline,
            )
            .await?;
        let mut name = None;
        self.drain_stream(stream, deadline, |m: pb::ImageServicePullResponse| {
            if let Some(pb::image_service_pull_response::Response::Name(n)) = m.response {
                name = Some(n);
            }
        })
        .await?;
        name.filter(|n| !n.is_empty()).ok_or_else(|| {
            self.failed(
                Code::Internal,
                &format!("the pull of {image_ref} ended without naming the pulled image"),
            )
        })
    }

    /// Installs the pulled image `image_name` (`LifecycleService/Upgrade`, Talos >= 1.13):
    /// the stream is read to its end within `deadline` and its `exit_code` returned (the
    /// server does not answer a failed upgrade with an error). It neither drains nor
    /// reboots: the caller does both.
    pub async fn lifecycle_upgrade(
        &self,
        image_name: &str,
        deadline: Duration,
    ) -> Result<Installed, TalosError> {
        let req = pb::LifecycleServiceUpgradeRequest {
            containerd: Some(system_containerd()),
            source: Some(pb::InstallArtifactsSource {
                image_name: image_name.to_string(),
            }),
        };
        let stream = self
            .call_on(
                self.lifecycle.clone(),
                |mut c, r| async move { c.upgrade(r).await },
                req,
                deadline,
            )
            .await?;
        let (mut exit_code, mut last_message) = (None, String::new());
        self.drain_stream(
            stream,
            deadline,
            |m: pb::LifecycleServiceUpgradeResponse| {
                use pb::lifecycle_service_install_progress::Response;
                match m.progress.and_then(|p| p.response) {
                    Some(Response::Message(text)) => last_message = text,
                    Some(Response::ExitCode(code)) => exit_code = Some(code),
                    None => {}
                }
            },
        )
        .await?;
        let exit_code = exit_code.ok_or_else(|| {
            self.failed(
                Code::Internal,
                "the upgrade stream ended without an exit code",
            )
        })?;
        Ok(Installed {
            exit_code,
            last_message,
        })
    }

    /// Streams the node's etcd snapshot (`MachineService/EtcdSnapshot`, role
    /// `os:etcd:backup` is enough) into `sink` chunk by chunk, checking it as it passes
    /// ([`crate::runtime::snapshot::SnapshotCheck`]: its trailing sha256, as `talosctl etcd
    /// snapshot` does), and flushes `sink`. Only one chunk is held at a time. The stream
    /// is read to its end within `deadline`; a per-node error in any chunk fails it.
    pub async fn etcd_snapshot<W>(
        &self,
        sink: &mut W,
        deadline: Duration,
    ) -> Result<crate::runtime::snapshot::Checked, crate::runtime::snapshot::StreamError>
    where
        W: tokio::io::AsyncWrite + Unpin,
    {
        use crate::runtime::snapshot::{SnapshotCheck, StreamError};
        use tokio::io::AsyncWriteExt;
        let mut stream = self
            .call_on(
                self.inner.clone(),
                |mut c, r| async move { c.etcd_snapshot(r).await },
                pb::EtcdSnapshotRequest {},
                deadline,
            )
            .await?;
        let mut check = SnapshotCheck::new();
        let read = async {
            while let Some(chunk) = stream
                .message()
                .await
                .map_err(|s| StreamError::Talos(self.status_error(&s)))?
            {
                if let Some(e) = self.entry_error(chunk.metadata.as_ref()) {
                    return Err(StreamError::Talos(e));
                }
                check.update(&chunk.bytes);
                sink.write_all(&chunk.bytes)
                    .await
                    .map_err(StreamError::Write)?;
            }
            sink.flush().await.map_err(StreamError::Write)?;
            Ok(())
        };
        match tokio::time::timeout(deadline, read).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(StreamError::Talos(self.unreachable(format!(
                    "the snapshot stream did not end within {deadline:?} ({} bytes read)",
                    check.size()
                ))));
            }
        }
        Ok(check.finish()?)
    }

    /// Reads a server stream to its end within `deadline`.
    async fn drain_stream<M>(
        &self,
        mut stream: tonic::Streaming<M>,
        deadline: Duration,
        mut each: impl FnMut(M),
    ) -> Result<(), TalosError> {
        let read = async {
            while let Some(m) = stream.message().await.map_err(|s| self.status_error(&s))? {
                each(m);
            }
            Ok(())
        };
        match tokio::time::timeout(deadline, read).await {
            Ok(r) => r,
            Err(_) => Err(self.unreachable(format!(
                "the stream did not end within {deadline:?} (deadline exceeded)"
            ))),
        }
    }

    /// Sends one request with the node metadata and the deadline; maps failures.
    async fn call<Req, Resp, F, Fut>(&self, f: F, message: Req) -> Result<Resp, TalosError>
    where
        F: FnOnce(MachineServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.call_on(self.inner.clone(), f, message, self.timeout)
            .await
    }

    /// [`TalosClient::call`] on any service of the connection, within `timeout`.
    async fn call_on<C, Req, Resp, F, Fut>(
        &self,
        client: C,
        f: F,
        message: Req,
        timeout: Duration,
    ) -> Result<Resp, TalosError>
    where
        F: FnOnce(C, tonic::Request<Req>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        if let Some(node) = &self.node {
            let value = MetadataValue::try_from(&**node).map_err(|_| {
                TalosError::Config(format!("node `{node}` is not a valid gRPC metadata value"))
            })?;
            request.metadata_mut().insert(NODE_METADATA_KEY, value);
        }
        match tokio::time::timeout(timeout, f(client, request)).await {
            Err(_) => {
                Err(self.unreachable(format!("no answer within {timeout:?} (deadline exceeded)")))
            }
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(self.status_error(&status)),
        }
    }

    fn status_error(&self, status: &tonic::Status) -> TalosError {
        let mut parts = vec![status.message().to_string()];
        if let Some(source) = std::error::Error::source(status) {
            parts.push(chain(source));
        }
        let detail = dedup_segments(&parts);
        let timed_out = status.code() == Code::Cancelled
            && (has_source::<tonic::TimeoutExpired>(status)
                || status.message() == "Timeout expired");
        if timed_out {
            return self.unreachable(format!(
                "no answer within {:?} (deadline exceeded)",
                self.timeout
            ));
        }
        match status.code() {
            Code::Unavailable | Code::DeadlineExceeded => self.unreachable(detail),
            // A transport failure (dial, TLS) surfaces as Unknown with a transport source.
            Code::Unknown if std::error::Error::source(status).is_some() => {
                self.unreachable(detail)
            }
            code => TalosError::Failed {
                endpoint: self.endpoint.to_string(),
                node: self.node.as_deref().map(str::to_string),
                code,
                message: status.message().to_string(),
            },
        }
    }

    fn unreachable(&self, detail: String) -> TalosError {
        TalosError::Unreachable {
            endpoint: self.endpoint.to_string(),
            node: self.node.as_deref().map(str::to_string),
            detail,
        }
    }

    fn failed(&self, code: Code, message: &str) -> TalosError {
        TalosError::Failed {
            endpoint: self.endpoint.to_string(),
            node: self.node.as_deref().map(str::to_string),
            code,
            message: message.to_string(),
        }
    }

    /// The per-node error of one response entry, if it carries one.
    fn entry_error(&self, metadata: Option<&Metadata>) -> Option<TalosError> {
        let metadata = metadata?;
        let status = metadata.status.as_ref().filter(|s| s.code != 0);
        if metadata.error.is_empty() && status.is_none() {
            return None;
        }
        let code = status.map_or(Code::Unknown, |s| Code::from_i32(s.code));
        let message = if metadata.error.is_empty() {
            status.map(|s| s.message.clone()).unwrap_or_default()
        } else {
            metadata.error.clone()
        };
        let node = if metadata.hostname.is_empty() {
            self.node.as_deref().map(str::to_string)
        } else {
            Some(metadata.hostname.clone())
        };
        let endpoint = self.endpoint.to_string();
        Some(match code {
            Code::Unavailable | Code::DeadlineExceeded => TalosError::Unreachable {
                endpoint,
                node,
                detail: message,
            },
            code => TalosError::Failed {
                endpoint,
                node,
                code,
                message,
            },
        })
    }

    fn check_all<M>(
        &self,
        messages: &[M],
        metadata: impl Fn(&M) -> Option<&Metadata>,
    ) -> Result<(), TalosError> {
        match messages.iter().find_map(|m| self.entry_error(metadata(m))) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn single<M>(
        &self,
        messages: Vec<M>,
        metadata: impl Fn(&M) -> Option<&Metadata>,
    ) -> Result<M, TalosError> {
        self.check_all(&messages, &metadata)?;
        messages
            .into_iter()
            .next()
            .ok_or_else(|| self.failed(Code::Internal, "the response carries no entry"))
    }
}

/// Whether `e` or one of its sources is an `E`.
fn has_source<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.is::<E>() {
            return true;
        }
        next = err.source();
    }
    false
}

/// Joins error texts with `: `, keeping each `: `-separated segment once and dropping
/// tonic's generic "transport error".
fn dedup_segments(parts: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for segment in parts.iter().flat_map(|p| p.split(": ")) {
        let segment = segment.trim();
        if segment.is_empty() || segment == "transport error" || seen.contains(&segment) {
            continue;
        }
        seen.push(segment);
    }
    if seen.is_empty() {
        return "transport error".to_string();
    }
    seen.join(": ")
}

/// An error and its sources, joined with `: `.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_the_apid_port_when_missing() {
        assert_eq!(
            split_endpoint("10.0.0.5").unwrap(),
            ("10.0.0.5".into(), 50000)
        );
        assert_eq!(
            split_endpoint("10.0.0.5:50001").unwrap(),
            ("10.0.0.5".into(), 50001)
        );
        assert_eq!(
            split_endpoint("cp-1.example").unwrap(),
            ("cp-1.example".into(), 50000)
        );
        assert_eq!(
            split_endpoint("fd00::5").unwrap(),
            ("fd00::5".into(), 50000)
        );
        assert_eq!(
            split_endpoint("[fd00::5]:1234").unwrap(),
            ("fd00::5".into(), 1234)
        );
        assert_eq!(
            split_endpoint("[fd00::5]").unwrap(),
            ("fd00::5".into(), 50000)
        );
        for bad in [
            "",
            "https://10.0.0.5",
            "10.0.0.5:x",
            "10.0.0.5:70000",
            ":5",
            "[fd00::5",
        ] {
            let err = split_endpoint(bad).unwrap_err();
            assert!(matches!(err, TalosError::Config(_)), "{bad}: {err}");
        }
    }
}

/// The TLS of a maintenance-mode client: no client certificate, any server certificate.
mod insecure {
    use super::TalosError;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    /// Accepts the node's certificate whatever signed it; checks the handshake's signatures.
    #[derive(Debug)]
    struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    type Stream = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// Dials `authority` and speaks TLS (HTTP/2 by ALPN) to it, for tonic.
    #[derive(Clone)]
    pub struct Connector {
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
        authority: String,
    }

    impl Connector {
        pub fn new(host: &str, authority: &str) -> Result<Connector, TalosError> {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| TalosError::Config(format!("TLS: {e}")))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            config.alpn_protocols = vec![b"h2".to_vec()];
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| TalosError::Config(format!("endpoint host `{host}`: {e}")))?;
            Ok(Connector {
                config: Arc::new(config),
                name,
                authority: authority.to_string(),
            })
        }
    }

    impl tonic::codegen::Service<http::Uri> for Connector {
        type Response = Stream;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _uri: http::Uri) -> Self::Future {
            let this = self.clone();
            Box::pin(async move {
                let tcp = tokio::net::TcpStream::connect(&this.authority).await?;
                let tls = tokio_rustls::TlsConnector::from(this.config)
                    .connect(this.name, tcp)
                    .await?;
                Ok(hyper_util::rt::TokioIo::new(tls))
            })
        }
    }
}
