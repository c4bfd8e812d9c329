//! The Talos machine configuration of a machine, rendered: the cluster's base for the
//! machine's role, then the patches that select it in order (each a strategic merge, then
//! RFC 6902 JSON patches against the `v1alpha1` document), then the machine's identity
//! (hostname, install disk); validated; its bytes deterministic and their sha256 recorded.
//!
//! Pure: no I/O. Every input is hostile (a patch is anyone's YAML; the base is the
//! cluster's secrets): sizes, document counts, nesting and JSON patch operations are
//! bounded, every error says what, where and how to fix it, and no error, log or value
//! outside [`Rendered`] carries a value of the base (its errors name paths and lines, never
//! contents). [`Base::redacted`] is the same base with every secret value replaced by a
//! placeholder: a render against it fails exactly when one against the real base does
//! (`tests/render.rs` proves it on the conflict table and on generated patches), which is
//! what lets the webhook dry-render without reading Secrets.
//!
//! Merge semantics: [`merge`]; Talos' conflicts between the legacy `v1alpha1` blocks and
//! newer documents: [`conflicts::CONFLICTS`].

pub mod conflicts;
pub mod merge;
pub mod required;

pub use crate::runtime::objects::Role;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The largest YAML text (a base file, a patch) a render reads.
pub const MAX_TEXT_BYTES: usize = 512 * 1024;
/// The most documents one text may hold.
pub const MAX_DOCUMENTS: usize = 100;
/// The most RFC 6902 operations one patch may hold.
pub const MAX_JSON_OPS: usize = 256;
/// The most values (maps, lists and scalars) a rendered configuration may hold.
pub const MAX_VALUES: usize = 200_000;
/// What a secret value reads as in a redacted base.
pub const PLACEHOLDER: &str = "ichor-redacted";

/// A document: a YAML mapping.
pub type Document = Map<String, Value>;

/// Why a render failed. The text says what, where and how to fix it; it never carries a
/// value of the base.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// An input could not be read (its size, its YAML, its shape).
    #[error("{source_name}: {message}")]
    Input {
        source_name: String,
        message: String,
    },
    /// A patch does not merge into the configuration.
    #[error("{source_name}: document {document}, at {path}: {message}")]
    Merge {
        source_name: String,
        document: String,
        path: String,
        message: String,
    },
    /// The rendered configuration is not one Talos accepts.
    #[error("{0}")]
    Invalid(String),
    /// A conflict Talos refuses (its own words).
    #[error("{message}")]
    Conflict {
        kind: &'static str,
        message: &'static str,
    },
}

impl RenderError {
    pub(crate) fn input(source: &str, message: &str) -> Self {
        RenderError::Input {
            source_name: source.to_string(),
            message: message.to_string(),
        }
    }

    pub(crate) fn merge(source: &str, document: &str, path: &str, message: &str) -> Self {
        RenderError::Merge {
            source_name: source.to_string(),
            document: document.to_string(),
            path: path.to_string(),
            message: message.to_string(),
        }
    }

    /// A short stable word for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            RenderError::Input { .. } => "InvalidInput",
            RenderError::Merge { .. } => "PatchDoesNotMerge",
            RenderError::Invalid(_) => "InvalidConfig",
            RenderError::Conflict { .. } => "ConfigConflict",
        }
    }
}

/// Keys whose values are the cluster's secrets (PKI, tokens, encryption secrets, the
/// cluster id): redacted, never selected on, never tested or copied by a JSON patch.
pub fn secret_key(k: &str) -> bool {
    matches!(
        k,
        "crt"
            | "key"
            | "token"
            | "secret"
            | "id"
            | "secretboxEncryptionSecret"
            | "aescbcEncryptionSecret"
            | "bootstrapToken"
            | "password"
            // Newer documents' and the machine config's other secrets: Wireguard keys,
            // the service-account issuer's key, a cloud API token, the discovery
            // identity, registry credentials, disk-encryption passphrases, SideroLink's
            // join URL (its token rides in the query).
            | "privateKey"
            | "presharedKey"
            | "apiToken"
            | "clusterID"
            | "clusterSecret"
            | "identityToken"
            | "auth"
            | "passphrase"
            | "apiUrl"
    )
}

/// Parses a YAML stream of documents (empty documents skipped). `secret`: the text is the
/// base, so an error says where, never what was there.
pub fn parse_documents(
    text: &str,
    source: &str,
    secret: bool,
) -> Result<Vec<Document>, RenderError> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(RenderError::input(
            source,
            &format!(
                "{} bytes, more than the {MAX_TEXT_BYTES} a configuration text may have; split it",
                text.len()
            ),
        ));
    }
    let de = crate::runtime::nesting::yaml(text)
        .map_err(|e| RenderError::input(source, &e.to_string()))?;
    let mut docs = Vec::new();
    for (i, doc) in de.enumerate() {
        if i >= MAX_DOCUMENTS {
            return Err(RenderError::input(
                source,
                &format!(
                    "more than {MAX_DOCUMENTS} YAML documents; a machine configuration has far fewer"
                ),
            ));
        }
        let value = Value::deserialize(doc).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!("line {}, column {}: ", l.line(), l.column()))
                .unwrap_or_default();
            if secret {
                RenderError::input(
                    source,
                    &format!("{at}not valid YAML (the base Secret's key; fix it there)"),
                )
            } else {
                RenderError::input(source, &format!("{at}not valid YAML: {e}"))
            }
        })?;
        match value {
            Value::Null => {}
            Value::Object(m) => docs.push(m),
            other => {
                return Err(RenderError::input(
                    source,
                    &format!(
                        "YAML document {} is {}, not a mapping; each document is a Talos configuration document",
                        i + 1,
                        match other {
                            Value::Array(_) => "a list",
                            _ => "a scalar",
                        }
                    ),
                ));
            }
        }
    }
    Ok(docs)
}

/// The cluster's base configuration: `controlplane.yaml` and `worker.yaml` as `talosctl gen
/// config` writes them.
#[derive(Clone, Debug, PartialEq)]
pub struct Base {
    pub controlplane: Vec<Document>,
    pub worker: Vec<Document>,
    /// sha256 (hex) of the two texts as read: which base a redacted copy was made from.
    pub digest: String,
}

/// The keys of the base Secret (and of the redacted copy).
pub const CONTROLPLANE_KEY: &str = "controlplane.yaml";
pub const WORKER_KEY: &str = "worker.yaml";

impl Base {
    /// Reads the two texts (`secret`: they are the real base, so errors show no content).
    pub fn parse(controlplane: &str, worker: &str, secret: bool) -> Result<Base, RenderError> {
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        h.update(controlplane.as_bytes());
        h.update(&[0]);
        h.update(worker.as_bytes());
        Ok(Base {
            controlplane: parse_documents(controlplane, CONTROLPLANE_KEY, secret)?,
            worker: parse_documents(worker, WORKER_KEY, secret)?,
            digest: hex(h.finish().as_ref()),
        })
    }

    pub fn for_role(&self, role: Role) -> &[Document] {
        match role {
            Role::ControlPlane => &self.controlplane,
            Role::Worker => &self.worker,
        }
    }

    /// The same documents with every secret value (every string under a [`secret_key`])
    /// replaced by [`PLACEHOLDER`]; the digest stays the real base's.
    pub fn redacted(&self) -> Base {
        let red = |docs: &[Document]| -> Vec<Document> {
            docs.iter()
                .map(|d| {
                    d.iter()
                        .map(|(k, v)| (k.clone(), redact(k, v, false)))
                        .collect()
                })
                .collect()
        };
        Base {
            controlplane: red(&self.controlplane),
            worker: red(&self.worker),
            digest: self.digest.clone(),
        }
    }

    /// The redacted texts (published in the TalosCluster's `status.redactedBase`, which the
    /// webhook reads).
    pub fn texts(&self) -> Result<(String, String), RenderError> {
        Ok((to_yaml(&self.controlplane)?, to_yaml(&self.worker)?))
    }
}

fn redact(key: &str, v: &Value, under_secret: bool) -> Value {
    let secret = under_secret || secret_key(key);
    match v {
        // An empty value stays empty: that it is empty is no secret, and a render that
        // fails for it must fail on the redacted base too.
        Value::String(s) if secret && !s.is_empty() => Value::String(PLACEHOLDER.to_string()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), redact(k, v, secret)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|i| redact(key, i, secret)).collect()),
        other => other.clone(),
    }
}

/// One patch: a strategic merge (multi-document YAML) and/or RFC 6902 operations against
/// the `v1alpha1` document, read once.
#[derive(Clone, Debug, PartialEq)]
pub struct Patch {
    /// Where it came from (e.g. `TalosConfigPatch ns/name`), for errors.
    pub source: String,
    pub strategic: Vec<Document>,
    pub json: Vec<json_patch::PatchOperation>,
}

impl Patch {
    pub fn parse(
        source: &str,
        strategic: Option<&str>,
        json: Option<&str>,
    ) -> Result<Patch, RenderError> {
        let strategic = match strategic {
            Some(t) => parse_documents(t, &format!("{source}: spec.patches.strategic"), false)?,
            None => Vec::new(),
        };
        let json = match json {
            Some(t) => parse_json_ops(t, &format!("{source}: spec.patches.json6902"))?,
            None => Vec::new(),
        };
        Ok(Patch {
            source: source.to_string(),
            strategic,
            json,
        })
    }
}

fn parse_json_ops(
    text: &str,
    source: &str,
) -> Result<Vec<json_patch::PatchOperation>, RenderError> {
    let docs = parse_documents_raw(text, source)?;
    let ops: Vec<json_patch::PatchOperation> = serde_json::from_value(docs).map_err(|e| {
        RenderError::input(
            source,
            &format!("not a list of RFC 6902 operations ({e}); write e.g. `[{{op: add, path: /machine/sysctls, value: {{}}}}]`"),
        )
    })?;
    if ops.len() > MAX_JSON_OPS {
        return Err(RenderError::input(
            source,
            &format!(
                "{} operations, more than {MAX_JSON_OPS}; use a strategic merge patch",
                ops.len()
            ),
        ));
    }
    Ok(ops)
}

fn parse_documents_raw(text: &str, source: &str) -> Result<Value, RenderError> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(RenderError::input(
            source,
            &format!("more than {MAX_TEXT_BYTES} bytes"),
        ));
    }
    let de = crate::runtime::nesting::yaml(text)
        .map_err(|e| RenderError::input(source, &e.to_string()))?;
    let mut out = Value::Null;
    for (i, doc) in de.enumerate() {
        if i > 0 {
            return Err(RenderError::input(
                source,
                "one YAML document (a list of operations) expected",
            ));
        }
        out = Value::deserialize(doc)
            .map_err(|e| RenderError::input(source, &format!("not valid YAML: {e}")))?;
    }
    Ok(out)
}

/// The machine's own part of its configuration, from its TalosMachine.
#[derive(Clone, Copy, Debug, Default)]
pub struct Identity<'a> {
    pub hostname: Option<&'a str>,
    pub install_disk: Option<&'a str>,
}

/// A rendered configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The multi-document YAML sent to Talos.
    pub text: String,
    /// sha256 (hex) of `text`.
    pub sha256: String,
}

impl Rendered {
    /// The render's digest only (what may appear in status, Events and logs).
    pub fn hash(&self) -> &str {
        &self.sha256
    }
}

/// Renders a machine's configuration: `base` for `role`, the patches in order, the identity;
/// then validates it.
pub fn render(
    base: &Base,
    role: Role,
    patches: &[&Patch],
    identity: Identity<'_>,
) -> Result<Rendered, RenderError> {
    let mut docs: Vec<Document> = base.for_role(role).to_vec();
    for patch in patches {
        merge::merge_documents(&mut docs, &patch.strategic, &patch.source)?;
        if !patch.json.is_empty() {
            apply_json(&mut docs, &patch.json, &patch.source)?;
        }
    }
    apply_identity(&mut docs, identity);
    validate(&docs, role)?;
    let text = to_yaml(&docs)?;
    let sha256 = hex(ring::digest::digest(&ring::digest::SHA256, text.as_bytes()).as_ref());
    Ok(Rendered { text, sha256 })
}

fn machine_config_index(docs: &[Document]) -> Option<usize> {
    docs.iter()
        .position(|d| !d.contains_key("kind") && d.contains_key("version"))
}

/// Whether a JSON pointer goes through a secret key, or points at a value holding one.
fn touches_secret(doc: &Value, pointer: &json_patch::jsonptr::Pointer) -> bool {
    if pointer.tokens().any(|t| secret_key(&t.decoded())) {
        return true;
    }
    fn holds(v: &Value) -> bool {
        match v {
            Value::Object(m) => m.iter().any(|(k, v)| secret_key(k) || holds(v)),
            Value::Array(items) => items.iter().any(holds),
            _ => false,
        }
    }
    doc.pointer(pointer.as_str()).is_some_and(holds)
}

fn apply_json(
    docs: &mut [Document],
    ops: &[json_patch::PatchOperation],
    source: &str,
) -> Result<(), RenderError> {
    use json_patch::PatchOperation as Op;
    let source = format!("{source}: spec.patches.json6902");
    let Some(i) = machine_config_index(docs) else {
        return Err(RenderError::input(
            &source,
            "JSON patches apply to the `v1alpha1` machine config document, and the configuration has none",
        ));
    };
    let mut doc = Value::Object(std::mem::take(&mut docs[i]));
    let mut result = Ok(());
    for (n, op) in ops.iter().enumerate() {
        let read = match op {
            Op::Test(t) => Some(("test", t.path.as_ref())),
            Op::Copy(c) => Some(("copy from", c.from.as_ref())),
            Op::Move(m) => Some(("move from", m.from.as_ref())),
            _ => None,
        };
        if let Some((what, ptr)) = read
            && touches_secret(&doc, ptr)
        {
            result = Err(RenderError::input(
                &source,
                &format!(
                    "operation {n} ({what} {}) reads the cluster's secrets (PKI, tokens), which a patch may not read; remove it",
                    ptr.as_str()
                ),
            ));
            break;
        }
        if let Err(e) = json_patch::patch(&mut doc, std::slice::from_ref(op)) {
            result = Err(RenderError::input(
                &source,
                &format!(
                    "operation {n} ({} at {}) failed: {}",
                    op_name(op),
                    op.path().as_str(),
                    e.kind
                ),
            ));
            break;
        }
        if matches!(op, Op::Copy(_) | Op::Add(_) | Op::Replace(_))
            && count_values(&doc) > MAX_VALUES
        {
            result = Err(RenderError::input(
                &source,
                &format!(
                    "operation {n} makes the configuration hold more than {MAX_VALUES} values"
                ),
            ));
            break;
        }
    }
    match doc {
        Value::Object(m) => docs[i] = m,
        _ => {
            if result.is_ok() {
                result = Err(RenderError::input(
                    &source,
                    "the operations replaced the machine config with something that is not a mapping",
                ));
            }
        }
    }
    result
}

fn op_name(op: &json_patch::PatchOperation) -> &'static str {
    use json_patch::PatchOperation as Op;
    match op {
        Op::Add(_) => "add",
        Op::Remove(_) => "remove",
        Op::Replace(_) => "replace",
        Op::Move(_) => "move",
        Op::Copy(_) => "copy",
        Op::Test(_) => "test",
    }
}

fn count_values(v: &Value) -> usize {
    // Iterative: a deep value must not recurse.
    let mut stack = vec![v];
    let mut n = 0usize;
    while let Some(v) = stack.pop() {
        n += 1;
        match v {
            Value::Object(m) => stack.extend(m.values()),
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    n
}

fn apply_identity(docs: &mut [Document], identity: Identity<'_>) {
    if let Some(hostname) = identity.hostname.filter(|h| !h.is_empty()) {
        // Talos refuses a static hostname in the machine config next to a HostnameConfig
        // document, so the hostname goes where the configuration keeps it.
        if let Some(doc) = docs
            .iter_mut()
            .find(|d| d.get("kind").and_then(Value::as_str) == Some("HostnameConfig"))
        {
            doc.insert("hostname".into(), Value::String(hostname.to_string()));
            doc.insert("auto".into(), Value::String("off".into()));
        } else if let Some(i) = machine_config_index(docs) {
            set_path(&mut docs[i], &["machine", "network", "hostname"], hostname);
        }
    }
    if let Some(disk) = identity.install_disk.filter(|d| !d.is_empty())
        && let Some(i) = machine_config_index(docs)
    {
        set_path(&mut docs[i], &["machine", "install", "disk"], disk);
    }
}

fn set_path(doc: &mut Document, path: &[&str], value: &str) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut map = doc;
    for p in parents {
        let entry = map
            .entry(p.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        let Value::Object(m) = entry else { return };
        map = m;
    }
    map.insert(last.to_string(), Value::String(value.to_string()));
}

/// Every document kind Talos knows (besides the `v1alpha1` machine config), `apiVersion:
/// v1alpha1`.
pub const KNOWN_KINDS: &[&str] = &[
    "BGPInstanceConfig",
    "BlackholeRouteConfig",
    "BondConfig",
    "BridgeConfig",
    "CRIBaseRuntimeSpecConfig",
    "CRICustomizationConfig",
    "ContainerConfig",
    "DHCPv4Config",
    "DHCPv6Config",
    "DiscoveryIdentityConfig",
    "DiscoveryServiceConfig",
    "DummyLinkConfig",
    "EnvironmentConfig",
    "EtcFileConfig",
    "EthernetConfig",
    "EventSinkConfig",
    "ExistingVolumeConfig",
    "ExtensionServiceConfig",
    "ExternalVolumeConfig",
    "FilesystemScrubConfig",
    "FilesystemTrimConfig",
    "HCloudVIPConfig",
    "HTTPProbeConfig",
    "HostnameConfig",
    "ImageCacheConfig",
    "ImageVerificationConfig",
    "KernelModuleConfig",
    "KmsgLogConfig",
    "KubeAPIServerCAConfig",
    "KubeAPIServerConfig",
    "KubeAdmissionControlConfig",
    "KubeAggregatorCAConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeClusterConfig",
    "KubeControllerManagerConfig",
    "KubeCoreDNSConfig",
    "KubeCredentialProviderConfig",
    "KubeEtcdEncryptionConfig",
    "KubeExternalManifestConfig",
    "KubeFlannelCNIConfig",
    "KubeInlineManifestConfig",
    "KubeNetworkConfig",
    "KubeNodeConfig",
    "KubePrismConfig",
    "KubeProxyConfig",
    "KubeSchedulerConfig",
    "KubeServiceAccountConfig",
    "KubeSpanConfig",
    "KubeSpanEndpointsConfig",
    "KubeStaticPodConfig",
    "KubeTalosAPIAccessConfig",
    "KubeletConfig",
    "LVMLogicalVolumeConfig",
    "LVMVolumeGroupConfig",
    "Layer2VIPConfig",
    "LinkAliasConfig",
    "LinkConfig",
    "NetworkDefaultActionConfig",
    "NetworkRuleConfig",
    "OOMConfig",
    "PCIDriverRebindConfig",
    "RAIDArrayConfig",
    "RawVolumeConfig",
    "RegistryAuthConfig",
    "RegistryMirrorConfig",
    "RegistryTLSConfig",
    "ResolverConfig",
    "RoutingRuleConfig",
    "SecurityProfileConfig",
    "SideroLinkConfig",
    "StaticHostConfig",
    "SwapVolumeConfig",
    "SysctlConfig",
    "SysfsConfig",
    "TCPProbeConfig",
    "TimeSyncConfig",
    "TrustedRootsConfig",
    "UdevRulesConfig",
    "UnattendedInstallConfig",
    "UserVolumeConfig",
    "VLANConfig",
    "VRFConfig",
    "VethConfig",
    "VolumeConfig",
    "WatchdogTimerConfig",
    "WireguardConfig",
    "ZswapConfig",
];

/// Where a configuration of Talos' multi-document Kubernetes contract keeps the cluster's
/// endpoint instead of `cluster.controlPlane.endpoint`: the `KubeClusterConfig` document's
/// `endpoint` (Talos refuses the two together, see [`conflicts`]).
pub const ENDPOINT_DOCUMENT: (&str, &str) = ("KubeClusterConfig", "endpoint");

/// Fields the machine config must have (`cluster.controlPlane.endpoint` unless the
/// endpoint is in its [`ENDPOINT_DOCUMENT`]).
pub const REQUIRED: &[&[&str]] = &[
    &["machine", "type"],
    &["machine", "token"],
    &["machine", "ca"],
    &["cluster", "controlPlane", "endpoint"],
];

fn at<'v>(doc: &'v Document, path: &[&str]) -> Option<&'v Value> {
    let (first, rest) = path.split_first()?;
    let mut v = doc.get(*first)?;
    for p in rest {
        v = v.get(*p)?;
    }
    Some(v)
}

fn validate(docs: &[Document], role: Role) -> Result<(), RenderError> {
    let mut machine = None;
    let mut seen = std::collections::BTreeSet::new();
    for (i, d) in docs.iter().enumerate() {
        let n = i + 1;
        let Some(id) = merge::document_id(d) else {
            return Err(RenderError::Invalid(format!(
                "document {n} has neither `version: v1alpha1` nor `apiVersion` and `kind`; every document must be a Talos configuration document"
            )));
        };
        if !seen.insert(id.clone()) {
            return Err(RenderError::Invalid(format!("document {id} appears twice")));
        }
        match d.get("kind").and_then(Value::as_str) {
            None => {
                if d.get("version").and_then(Value::as_str) != Some("v1alpha1") {
                    return Err(RenderError::Invalid(format!(
                        "document {n}: the machine config's `version` must be `v1alpha1`"
                    )));
                }
                if machine.is_some() {
                    return Err(RenderError::Invalid(
                        "two machine config (`version: v1alpha1`) documents".into(),
                    ));
                }
                machine = Some(d);
            }
            Some(kind) => {
                if !KNOWN_KINDS.contains(&kind) {
                    return Err(RenderError::Invalid(format!(
                        "document {n}: `{kind}` is not a Talos configuration document kind{}",
                        suggest(kind)
                            .map(|s| format!(" (did you mean `{s}`?)"))
                            .unwrap_or_default()
                    )));
                }
                if d.get("apiVersion").and_then(Value::as_str) != Some("v1alpha1") {
                    return Err(RenderError::Invalid(format!(
                        "document {kind}: `apiVersion` must be `v1alpha1`"
                    )));
                }
                if let Some(r) = required::first_missing(kind, d) {
                    // As Talos names it: `Kind/name`, or `Kind`.
                    let shown = match d.get("name").and_then(Value::as_str) {
                        Some(n) if !n.is_empty() => format!("{kind}/{n}"),
                        _ => kind.to_string(),
                    };
                    return Err(RenderError::Invalid(format!(
                        "document {shown}: {} ({} in a {kind} document; Talos refuses it without)",
                        r.message,
                        r.paths_text()
                    )));
                }
            }
        }
    }
    let Some(machine) = machine else {
        return Err(RenderError::Invalid(
            "no machine config (`version: v1alpha1`) document; the base must hold the one `talosctl gen config` writes".into(),
        ));
    };
    let endpoint_elsewhere = docs.iter().any(|d| {
        d.get("kind").and_then(Value::as_str) == Some(ENDPOINT_DOCUMENT.0)
            && d.get(ENDPOINT_DOCUMENT.1)
                .and_then(Value::as_str)
                .is_some_and(|e| !e.is_empty())
    });
    for path in REQUIRED {
        if endpoint_elsewhere && *path == ["cluster", "controlPlane", "endpoint"] {
            continue;
        }
        if at(machine, path).is_none_or(Value::is_null) {
            return Err(RenderError::Invalid(format!(
                "the machine config lacks the required `{}`",
                path.join(".")
            )));
        }
    }
    match at(machine, &["machine", "type"]).and_then(Value::as_str) {
        Some(t) if t == role.name() => {}
        other => {
            return Err(RenderError::Invalid(format!(
                "machine.type is `{}` but the machine's role is `{}`; a patch must not change machine.type",
                other.unwrap_or("(not a string)"),
                role.name()
            )));
        }
    }
    for d in docs {
        let Some(kind) = d.get("kind").and_then(Value::as_str) else {
            continue;
        };
        if let Some(c) = conflicts::CONFLICTS.iter().find(|c| {
            c.kind == kind
                && c.doc
                    .iter()
                    .all(|(path, want)| at(d, path).is_some_and(|v| want.holds(v)))
                && at(machine, c.path).is_some_and(|v| c.set.holds(v))
        }) {
            return Err(RenderError::Conflict {
                kind: c.kind,
                message: c.message,
            });
        }
    }
    Ok(())
}

/// Validates a whole configuration text as the render validates its result (the YAML, the
/// documents, `machine.type`, the required fields, the conflict table). The Talos stand-in
/// of the tests does not use it: it checks with code of its own.
pub fn validate_text(text: &str) -> Result<Role, RenderError> {
    let docs = parse_documents(text, "the configuration", true)?;
    let role = machine_config_index(&docs)
        .and_then(|i| at(&docs[i], &["machine", "type"]))
        .and_then(Value::as_str)
        .and_then(|t| match t {
            "controlplane" => Some(Role::ControlPlane),
            "worker" => Some(Role::Worker),
            _ => None,
        })
        .ok_or_else(|| {
            RenderError::Invalid("machine.type must be `controlplane` or `worker`".into())
        })?;
    validate(&docs, role)?;
    Ok(role)
}

fn suggest(kind: &str) -> Option<&'static str> {
    let lower = kind.to_ascii_lowercase();
    KNOWN_KINDS
        .iter()
        .find(|k| {
            k.to_ascii_lowercase() == lower || k.to_ascii_lowercase() == format!("{lower}config")
        })
        .copied()
}

/// The documents as one YAML stream, byte for byte the same for the same documents.
pub fn to_yaml(docs: &[Document]) -> Result<String, RenderError> {
    let mut out = String::new();
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(
            &serde_yaml::to_string(d)
                .map_err(|e| RenderError::Invalid(format!("could not write YAML: {e}")))?,
        );
    }
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
