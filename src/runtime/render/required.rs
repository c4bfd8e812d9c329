//! The fields Talos requires in each newer configuration document, as data: a document of
//! `kind` without any of `paths` present as [`Present`] says is refused with Talos' own
//! `message` (each document's `Validate` in Talos' `pkg/machinery/config/types`, as a plain
//! `ApplyConfiguration` runs it: not strict, nothing defaulted first). Read from Talos'
//! `main` of 2026-08-21 (`ad88231`).
//!
//! Kept to what a document must hold whatever else it says, plus three whose condition is
//! a field of the same document (`unless`): the control-plane components' `image` unless
//! `enabled: false`, and a user volume's disk selector and size, which a `directory` (and,
//! for the size, a `disk`) volume does not need. Left to Talos (its dry run reports them):
//! requirements that depend on another field's value in other ways (a DHCP `duidRaw` for a
//! `duid` client identifier, a webhook authorizer's `webhook`, encryption keys once
//! encryption is set), requirements on each element of a list (a mirror's endpoint URLs,
//! Wireguard peers' public keys), the syntax of values (addresses, URLs, CEL expressions,
//! priorities, reserved VRF tables), and the checks across documents (discovery,
//! KubeSpan, host DNS). Each entry has its test (`tests/render.rs`,
//! `every_required_field_is_refused_with_talos_message_when_missing`).

use serde_json::Value;

/// What a required field must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Present {
    /// A string other than `""`.
    Text,
    /// Any value but null (Talos: a non-nil pointer or value).
    Value,
    /// A number other than 0.
    NonZero,
    /// A list with at least one entry.
    List,
    /// A map with at least one entry.
    Map,
    /// An integer in this range (both ends included).
    Range(i64, i64),
    /// One of these strings.
    OneOf(&'static [&'static str]),
}

impl Present {
    pub fn holds(self, v: &Value) -> bool {
        match self {
            Present::Text => v.as_str().is_some_and(|s| !s.is_empty()),
            Present::Value => !v.is_null(),
            Present::NonZero => v.as_f64().is_some_and(|n| n != 0.0),
            Present::List => v.as_array().is_some_and(|l| !l.is_empty()),
            Present::Map => v.as_object().is_some_and(|m| !m.is_empty()),
            Present::Range(lo, hi) => v.as_i64().is_some_and(|n| (lo..=hi).contains(&n)),
            Present::OneOf(allowed) => v.as_str().is_some_and(|s| allowed.contains(&s)),
        }
    }

    /// A value that satisfies it (for tests and examples).
    pub fn example(self) -> Value {
        match self {
            Present::Text => Value::String("example".into()),
            Present::Value => Value::String("example".into()),
            Present::NonZero => Value::from(1),
            Present::List => Value::Array(vec![Value::String("example".into())]),
            Present::Map => serde_json::json!({ "example": "example" }),
            Present::Range(lo, _) => Value::from(lo),
            Present::OneOf(allowed) => Value::String(allowed.first().copied().unwrap_or("").into()),
        }
    }
}

/// A value of a field of the same document that waives the requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scalar {
    Bool(bool),
    Str(&'static str),
}

impl Scalar {
    pub fn is(self, v: &Value) -> bool {
        match self {
            Scalar::Bool(b) => v.as_bool() == Some(b),
            Scalar::Str(s) => v.as_str() == Some(s),
        }
    }
}

/// One requirement: a document of `kind` must have one of `paths` present as `present`
/// says, unless the field `unless.0` is one of `unless.1`.
#[derive(Clone, Copy, Debug)]
pub struct Required {
    pub kind: &'static str,
    pub paths: &'static [&'static [&'static str]],
    pub present: Present,
    pub unless: Option<(&'static [&'static str], &'static [Scalar])>,
    /// Talos' words when it is missing.
    pub message: &'static str,
}

use Present::{List, Map, NonZero, OneOf, Range, Text};

macro_rules! one {
    ($kind:literal, [$($p:literal),+], $present:expr, $msg:literal) => {
        Required {
            kind: $kind,
            paths: &[&[$($p),+]],
            present: $present,
            unless: None,
            message: $msg,
        }
    };
    ($kind:literal, [$($p:literal),+], $present:expr, unless [$($u:literal),+] in $vals:expr, $msg:literal) => {
        Required {
            kind: $kind,
            paths: &[&[$($p),+]],
            present: $present,
            unless: Some((&[$($u),+], $vals)),
            message: $msg,
        }
    };
}

/// Every requirement, by kind in Talos' source order.
pub const REQUIRED_FIELDS: &[Required] = &[
    // block
    one!("ExistingVolumeConfig", ["name"], Text, "name is required"),
    one!(
        "ExistingVolumeConfig",
        ["discovery", "volumeSelector", "match"],
        Text,
        "volume selector is required"
    ),
    one!("ExternalVolumeConfig", ["name"], Text, "name is required"),
    one!(
        "ExternalVolumeConfig",
        ["filesystemType"],
        OneOf(&["virtiofs"]),
        "invalid filesystem type: none"
    ),
    one!(
        "ExternalVolumeConfig",
        ["mount", "virtiofs"],
        Present::Value,
        "virtiofs mount spec is required"
    ),
    one!(
        "ExternalVolumeConfig",
        ["mount", "virtiofs", "tag"],
        Text,
        "virtiofs tag is required"
    ),
    one!("RawVolumeConfig", ["name"], Text, "name is required"),
    one!(
        "RawVolumeConfig",
        ["provisioning", "diskSelector", "match"],
        Text,
        "disk selector is required"
    ),
    Required {
        kind: "RawVolumeConfig",
        paths: &[&["provisioning", "minSize"], &["provisioning", "maxSize"]],
        present: Present::Value,
        unless: None,
        message: "min size or max size is required",
    },
    one!("SwapVolumeConfig", ["name"], Text, "name is required"),
    one!(
        "SwapVolumeConfig",
        ["provisioning", "diskSelector", "match"],
        Text,
        "disk selector is required"
    ),
    Required {
        kind: "SwapVolumeConfig",
        paths: &[&["provisioning", "minSize"], &["provisioning", "maxSize"]],
        present: Present::Value,
        unless: None,
        message: "min size or max size is required",
    },
    one!("UserVolumeConfig", ["name"], Text, "name is required"),
    one!("UserVolumeConfig", ["provisioning", "diskSelector", "match"], Text,
        unless ["volumeType"] in &[Scalar::Str("directory")], "disk selector is required"),
    Required {
        kind: "UserVolumeConfig",
        paths: &[&["provisioning", "minSize"], &["provisioning", "maxSize"]],
        present: Present::Value,
        unless: Some((
            &["volumeType"],
            &[Scalar::Str("disk"), Scalar::Str("directory")],
        )),
        message: "min size or max size is required",
    },
    one!(
        "VolumeConfig",
        ["name"],
        OneOf(&[
            "STATE",
            "EPHEMERAL",
            "IMAGECACHE",
            "ETCD",
            "CRI",
            "KUBELET",
            "LOG"
        ]),
        "only [\"STATE\" \"EPHEMERAL\" \"IMAGECACHE\" \"ETCD\" \"CRI\" \"KUBELET\" \"LOG\"] volumes are supported"
    ),
    // cluster
    one!(
        "DiscoveryIdentityConfig",
        ["clusterID"],
        Text,
        "clusterID is required"
    ),
    one!(
        "DiscoveryIdentityConfig",
        ["clusterSecret"],
        Text,
        "clusterSecret is required"
    ),
    one!("DiscoveryServiceConfig", ["name"], Text, "name is required"),
    one!(
        "DiscoveryServiceConfig",
        ["endpoint"],
        Text,
        "endpoint is required"
    ),
    // container, cri
    one!("ContainerConfig", ["name"], Text, "name is required"),
    one!("ContainerConfig", ["image"], Text, "image is required"),
    one!(
        "CRICustomizationConfig",
        ["name"],
        Text,
        "invalid name: name cannot be empty: \"\""
    ),
    one!(
        "RegistryAuthConfig",
        ["name"],
        Text,
        "name must be specified"
    ),
    one!(
        "RegistryMirrorConfig",
        ["name"],
        Text,
        "name must be specified"
    ),
    one!(
        "RegistryTLSConfig",
        ["name"],
        Text,
        "name must be specified"
    ),
    // k8s
    one!(
        "KubeAdmissionControlConfig",
        ["name"],
        Text,
        "admission control plugin name is required"
    ),
    one!(
        "KubeAggregatorCAConfig",
        ["issuingCA"],
        Present::Value,
        "issuing CA is not set"
    ),
    one!(
        "KubeAggregatorCAConfig",
        ["issuingCA", "cert"],
        Text,
        "issuing CA: certificate is required"
    ),
    one!(
        "KubeAggregatorCAConfig",
        ["issuingCA", "key"],
        Text,
        "issuing CA: key is required"
    ),
    one!(
        "KubeAPIServerConfig",
        ["image"],
        Text,
        "kube-apiserver image cannot be empty"
    ),
    one!(
        "KubeAuthorizerConfig",
        ["name"],
        Text,
        "authorizer name is required"
    ),
    one!(
        "KubeAuthorizerConfig",
        ["type"],
        Text,
        "authorizer type is required"
    ),
    one!(
        "KubeClusterConfig",
        ["clusterName"],
        Text,
        "clusterName must be specified"
    ),
    one!(
        "KubeClusterConfig",
        ["endpoint"],
        Text,
        "endpoint must be specified"
    ),
    one!("KubeControllerManagerConfig", ["image"], Text,
        unless ["enabled"] in &[Scalar::Bool(false)], "kube-controller-manager image cannot be empty"),
    one!(
        "KubeEtcdEncryptionConfig",
        ["config"],
        Map,
        "etcd encryption config is required"
    ),
    one!(
        "KubeExternalManifestConfig",
        ["name"],
        Text,
        "manifest name is required"
    ),
    one!(
        "KubeExternalManifestConfig",
        ["url"],
        Text,
        "manifest URL is required"
    ),
    one!(
        "KubeFlannelCNIConfig",
        ["backendType"],
        Text,
        "flannel backend type must be specified"
    ),
    one!(
        "KubeInlineManifestConfig",
        ["name"],
        Text,
        "manifest name is required"
    ),
    one!(
        "KubeletConfig",
        ["image"],
        Text,
        "kubelet image cannot be empty"
    ),
    one!(
        "KubePrismConfig",
        ["port"],
        Range(1, 65_535),
        "invalid port 0: must be in range 1-65535"
    ),
    one!(
        "KubeNetworkConfig",
        ["podSubnets"],
        List,
        "pod subnets: at least one subnet must be specified"
    ),
    one!(
        "KubeNetworkConfig",
        ["serviceSubnets"],
        List,
        "service subnets: at least one subnet must be specified"
    ),
    one!("KubeProxyConfig", ["image"], Text,
        unless ["enabled"] in &[Scalar::Bool(false)], "proxy image cannot be empty"),
    one!("KubeSchedulerConfig", ["image"], Text,
        unless ["enabled"] in &[Scalar::Bool(false)], "scheduler image cannot be empty"),
    one!(
        "KubeServiceAccountConfig",
        ["issuer", "privateKey"],
        Text,
        "service issuer private key is required"
    ),
    one!(
        "KubeServiceAccountConfig",
        ["issuer", "issuerURL"],
        Text,
        "service issuer URL is required"
    ),
    one!(
        "KubeStaticPodConfig",
        ["name"],
        Text,
        "static pod name is required"
    ),
    one!(
        "KubeStaticPodConfig",
        ["pod"],
        Map,
        "static pod spec is required"
    ),
    // network
    one!(
        "BGPInstanceConfig",
        ["name"],
        Text,
        "name must be specified"
    ),
    one!(
        "BGPInstanceConfig",
        ["localASN"],
        NonZero,
        "localASN must be specified"
    ),
    one!(
        "BlackholeRouteConfig",
        ["name"],
        Text,
        "name must be specified"
    ),
    one!("BondConfig", ["name"], Text, "name must be specified"),
    one!(
        "BondConfig",
        ["links"],
        List,
        "at least one link must be specified"
    ),
    one!(
        "BondConfig",
        ["bondMode"],
        Present::Value,
        "bond mode must be specified"
    ),
    one!("BridgeConfig", ["name"], Text, "name must be specified"),
    one!("DHCPv4Config", ["name"], Text, "name must be specified"),
    one!("DHCPv6Config", ["name"], Text, "name must be specified"),
    one!("DummyLinkConfig", ["name"], Text, "name must be specified"),
    one!("EthernetConfig", ["name"], Text, "name is required"),
    one!("HCloudVIPConfig", ["name"], Text, "name must be specified"),
    one!("HCloudVIPConfig", ["link"], Text, "link must be specified"),
    one!(
        "HCloudVIPConfig",
        ["apiToken"],
        Text,
        "apiToken must be specified"
    ),
    Required {
        kind: "HostnameConfig",
        paths: &[&["auto"], &["hostname"]],
        present: Present::Value,
        unless: None,
        message: "either 'auto' or 'hostname' must be set",
    },
    one!("HTTPProbeConfig", ["name"], Text, "probe name is required"),
    one!(
        "HTTPProbeConfig",
        ["url"],
        Text,
        "HTTP probe URL is required"
    ),
    one!("Layer2VIPConfig", ["name"], Text, "name must be specified"),
    one!("Layer2VIPConfig", ["link"], Text, "link must be specified"),
    one!("LinkConfig", ["name"], Text, "name must be specified"),
    one!("LinkAliasConfig", ["name"], Text, "name must be specified"),
    one!(
        "LinkAliasConfig",
        ["selector", "match"],
        Text,
        "link selector is required"
    ),
    one!(
        "RoutingRuleConfig",
        ["name"],
        Text,
        "name must be specified"
    ),
    one!("NetworkRuleConfig", ["name"], Text, "name is required"),
    one!(
        "NetworkRuleConfig",
        ["portSelector", "ports"],
        List,
        "portSelector.ports is required"
    ),
    one!("StaticHostConfig", ["name"], Text, "name is required"),
    one!(
        "StaticHostConfig",
        ["hostnames"],
        List,
        "at least one hostname is required"
    ),
    one!("TCPProbeConfig", ["name"], Text, "probe name is required"),
    one!(
        "TCPProbeConfig",
        ["endpoint"],
        Text,
        "TCP probe endpoint is required"
    ),
    one!("VethConfig", ["name"], Text, "name must be specified"),
    one!(
        "VethConfig",
        ["peer", "name"],
        Text,
        "peer name must be specified"
    ),
    one!("VLANConfig", ["name"], Text, "name must be specified"),
    one!(
        "VLANConfig",
        ["vlanID"],
        Range(1, 4094),
        "vlanID must be specified and between 1 and 4094"
    ),
    one!("VLANConfig", ["parent"], Text, "parent must be specified"),
    one!("VRFConfig", ["name"], Text, "name must be specified"),
    one!("WireguardConfig", ["name"], Text, "name must be specified"),
    one!(
        "WireguardConfig",
        ["privateKey"],
        Text,
        "wireguard private key must be specified"
    ),
    // runtime
    one!(
        "EtcFileConfig",
        ["name"],
        Text,
        "user etc file name cannot be empty"
    ),
    one!(
        "EventSinkConfig",
        ["endpoint"],
        Text,
        "event sink endpoint: missing port in address"
    ),
    one!("ExtensionServiceConfig", ["name"], Text, "name is required"),
    Required {
        kind: "ExtensionServiceConfig",
        paths: &[&["configFiles"], &["environment"]],
        present: List,
        unless: None,
        message: "no config files found for the extension",
    },
    one!("KernelModuleConfig", ["name"], Text, "name is required"),
    one!("KmsgLogConfig", ["name"], Text, "name is required"),
    one!("KmsgLogConfig", ["url"], Text, "url is required"),
    one!(
        "UnattendedInstallConfig",
        ["provisioning", "diskSelector", "match"],
        Text,
        "provisioning.volumeSelector.match is required"
    ),
    one!(
        "WatchdogTimerConfig",
        ["device"],
        Text,
        "watchdog device: empty value"
    ),
    // siderolink
    one!("SideroLinkConfig", ["apiUrl"], Text, "apiUrl is required"),
    // storage
    one!("LVMLogicalVolumeConfig", ["name"], Text, "name is required"),
    one!(
        "LVMLogicalVolumeConfig",
        ["provisioning", "volumeGroup"],
        Text,
        "provisioning.volumeGroup is required"
    ),
    one!(
        "LVMLogicalVolumeConfig",
        ["provisioning", "maxSize"],
        Present::Value,
        "provisioning.maxSize is required"
    ),
    one!("LVMVolumeGroupConfig", ["name"], Text, "name is required"),
    one!(
        "LVMVolumeGroupConfig",
        ["provisioning", "volumeSelector", "match"],
        Text,
        "provisioning.volumeSelector.match is required"
    ),
    one!("RAIDArrayConfig", ["name"], Text, "name is required"),
    one!(
        "RAIDArrayConfig",
        ["provisioning", "volumeSelector", "match"],
        Text,
        "provisioning.volumeSelector.match is required"
    ),
];

fn at<'v>(doc: &'v serde_json::Map<String, Value>, path: &[&str]) -> Option<&'v Value> {
    let (first, rest) = path.split_first()?;
    let mut v = doc.get(*first)?;
    for p in rest {
        v = v.get(*p)?;
    }
    Some(v)
}

impl Required {
    /// Whether `doc` (a document of this entry's kind) lacks what the entry requires.
    pub fn missing_in(&self, doc: &serde_json::Map<String, Value>) -> bool {
        if let Some((path, values)) = self.unless
            && at(doc, path).is_some_and(|v| values.iter().any(|s| s.is(v)))
        {
            return false;
        }
        !self
            .paths
            .iter()
            .any(|p| at(doc, p).is_some_and(|v| self.present.holds(v)))
    }

    /// The paths, as a reader writes them (`` `a.b` or `c` ``).
    pub fn paths_text(&self) -> String {
        self.paths
            .iter()
            .map(|p| format!("`{}`", p.join(".")))
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

/// The first requirement `doc` (a document of `kind`) does not meet.
pub fn first_missing(
    kind: &str,
    doc: &serde_json::Map<String, Value>,
) -> Option<&'static Required> {
    REQUIRED_FIELDS
        .iter()
        .find(|r| r.kind == kind && r.missing_in(doc))
}
