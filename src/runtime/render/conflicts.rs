//! The conflicts Talos refuses between the legacy machine config (`v1alpha1`) and a newer
//! document of the same concern (each document's `V1Alpha1ConflictValidate` in Talos'
//! `pkg/machinery/config/types`), as data: a document of `kind` present while the machine
//! config has `path` set (and, for a few, the document itself has fields set: `doc`) is
//! refused with Talos' own `message`. Complete against Talos' `main` of 2026-08-21
//! (`ad88231`): every `V1Alpha1ConflictValidate` there has its entries here, in the order
//! Talos checks them. Each entry has a test of its own in `tests/render.rs` (the
//! `conflict_entry!` table there; a test fails when an entry has none).
//!
//! "Set" is what Talos' typed config makes of the YAML (`go.yaml.in/yaml/v4` into Talos'
//! structs), read from each validation and the field's type: a pointer, map or slice is set
//! when the key is there and not null (`{}` and `[]` included), a string when not `""`, a
//! number when not 0, a `*bool` when `true`. The paths are the YAML keys of the fields
//! Talos reads, which are not always the ones its messages name: Talos' messages say
//! `.machine.controlplane.controllerManager`, the key is `machine.controlPlane`.
/// When a machine config value counts as set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Set {
    /// Present, not null and not `""` (Talos: a non-nil pointer, map or slice, a non-empty
    /// string).
    Present,
    /// A number other than 0.
    NonZero,
    /// `true`.
    True,
    /// A non-empty list, map or string (Talos: `len(...) > 0`).
    NonEmpty,
    /// A duration other than zero (`"2m"`, `"1h30m"`; a number other than 0).
    NonZeroDuration,
    /// Present and not null, `""` included (Talos: a non-nil pointer to a type that takes
    /// any string, as `cluster.controlPlane.endpoint`'s URL does `""`).
    NotNull,
    /// A list with an entry that parses as an IP address (Talos' `Resolvers()` keeps only
    /// the nameservers `netip.ParseAddr` reads, and nothing refuses the others).
    SomeAddress,
    /// A map with a field that is not null (Talos: a struct of pointers that is not its zero
    /// value, `value.IsZero`).
    SomeField,
}

/// A condition on the newer document itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The field is set as [`Set`] says.
    Set(Set),
    /// The field is this string.
    Is(&'static str),
}

impl Want {
    pub fn holds(self, v: &serde_json::Value) -> bool {
        match self {
            Want::Set(s) => s.holds(v),
            Want::Is(text) => v.as_str() == Some(text),
        }
    }
}

/// One conflict Talos refuses.
#[derive(Clone, Copy, Debug)]
pub struct Conflict {
    /// The newer document's kind.
    pub kind: &'static str,
    /// The machine config path that may not be set next to it.
    pub path: &'static [&'static str],
    pub set: Set,
    /// Fields of the newer document that must hold too (most entries: none).
    pub doc: &'static [(&'static [&'static str], Want)],
    /// Talos' error text, word for word.
    pub message: &'static str,
}

const fn c(
    kind: &'static str,
    path: &'static [&'static str],
    set: Set,
    message: &'static str,
) -> Conflict {
    Conflict {
        kind,
        path,
        set,
        doc: &[],
        message,
    }
}

/// An entry whose newer document must also have `doc` set.
const fn cd(
    kind: &'static str,
    doc: &'static [(&'static [&'static str], Want)],
    path: &'static [&'static str],
    set: Set,
    message: &'static str,
) -> Conflict {
    Conflict {
        kind,
        path,
        set,
        doc,
        message,
    }
}

/// In Talos' order within each document (the first that applies is the one reported).
pub const CONFLICTS: &[Conflict] = &[
    c(
        "KubeAPIServerConfig",
        &["cluster", "apiServer"],
        Set::Present,
        "kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)",
    ),
    c(
        "KubeAPIServerConfig",
        &["cluster", "controlPlane", "localAPIServerPort"],
        Set::NonZero,
        "kube-apiserver API port is already set in v1alpha1 config (.cluster.controlPlane.localAPIServerPort)",
    ),
    c(
        "KubeAPIServerCAConfig",
        &["cluster", "ca"],
        Set::Present,
        "kube-apiserver CA is already set in v1alpha1 config (.cluster.ca)",
    ),
    c(
        "KubeAggregatorCAConfig",
        &["cluster", "aggregatorCA"],
        Set::Present,
        "kube-apiserver aggregator CA is already set in v1alpha1 config (.cluster.aggregatorCA), please remove it and use the new KubeAggregatorCAConfig document instead",
    ),
    c(
        "KubeControllerManagerConfig",
        &["cluster", "controllerManager"],
        Set::Present,
        "kube-controller-manager config is already set in v1alpha1 config (.cluster.controllerManager)",
    ),
    c(
        "KubeControllerManagerConfig",
        &["machine", "controlPlane", "controllerManager"],
        Set::Present,
        "kube-controller-manager config is already set in v1alpha1 config (.machine.controlplane.controllerManager)",
    ),
    c(
        "KubeSchedulerConfig",
        &["cluster", "scheduler"],
        Set::Present,
        "kube-scheduler config is already set in v1alpha1 config (.cluster.scheduler)",
    ),
    c(
        "KubeSchedulerConfig",
        &["machine", "controlPlane", "scheduler"],
        Set::Present,
        "kube-scheduler config is already set in v1alpha1 config (.machine.controlplane.scheduler)",
    ),
    c(
        "KubeCoreDNSConfig",
        &["cluster", "coreDNS"],
        Set::Present,
        "CoreDNS config is already set in v1alpha1 config (.cluster.coreDNS)",
    ),
    c(
        "KubeletConfig",
        &["machine", "kubelet"],
        Set::Present,
        "kubelet config is already set in v1alpha1 config (.machine.kubelet)",
    ),
    c(
        "KubeServiceAccountConfig",
        &["cluster", "serviceAccount"],
        Set::Present,
        "service account is already set in v1alpha1 config (.cluster.serviceAccount)",
    ),
    c(
        "KubeNodeConfig",
        &["cluster", "allowSchedulingOnControlPlanes"],
        Set::Present,
        ".cluster.allowSchedulingOnControlPlanes is already set in v1alpha1 config",
    ),
    c(
        "KubeNodeConfig",
        &["cluster", "allowSchedulingOnMasters"],
        Set::Present,
        ".cluster.allowSchedulingOnMasters is already set in v1alpha1 config",
    ),
    c(
        "KubeNodeConfig",
        &["machine", "kubelet", "skipNodeRegistration"],
        Set::Present,
        ".machine.kubelet.skipNodeRegistration is already set in v1alpha1 config",
    ),
    c(
        "KubeNodeConfig",
        &["machine", "kubelet", "registerWithFQDN"],
        Set::Present,
        ".machine.kubelet.registerWithFQDN is already set in v1alpha1 config",
    ),
    c(
        "KubeNodeConfig",
        &["machine", "kubelet", "nodeIP"],
        Set::Present,
        ".machine.kubelet.nodeIP is already set in v1alpha1 config",
    ),
    c(
        "KubeNodeConfig",
        &["machine", "nodeLabels"],
        Set::Present,
        ".machine.nodeLabels is already set in v1alpha1 config",
    ),
    c(
        "KubeNodeConfig",
        &["machine", "nodeAnnotations"],
        Set::Present,
        ".machine.nodeAnnotations is already set in v1alpha1 config",
    ),
    c(
        "KubeNodeConfig",
        &["machine", "nodeTaints"],
        Set::Present,
        ".machine.nodeTaints is already set in v1alpha1 config",
    ),
    c(
        "HostnameConfig",
        &["machine", "network", "hostname"],
        Set::Present,
        "static hostname is already set in v1alpha1 config",
    ),
    c(
        "ResolverConfig",
        &["machine", "network", "searchDomains"],
        Set::Present,
        ".machine.network.searchDomains is already set in v1alpha1 config",
    ),
    c(
        "ResolverConfig",
        &["machine", "network", "nameservers"],
        Set::SomeAddress,
        ".machine.network.nameservers is already set in v1alpha1 config",
    ),
    c(
        "ResolverConfig",
        &["machine", "network", "disableSearchDomain"],
        Set::True,
        ".machine.network.disableSearchDomain is already set in v1alpha1 config",
    ),
    cd(
        "ResolverConfig",
        &[(&["hostDNS"], Want::Set(Set::SomeField))],
        &["machine", "features", "hostDNS"],
        Set::Present,
        ".machine.features.hostDNS is already set in v1alpha1 config",
    ),
    c(
        "HostnameConfig",
        &["machine", "features", "stableHostname"],
        Set::True,
        "stable hostname is already set in v1alpha1 config",
    ),
    c(
        "DiscoveryIdentityConfig",
        &["cluster", "id"],
        Set::Present,
        "cluster identity is already configured in .cluster.id/.cluster.secret of the v1alpha1 config",
    ),
    c(
        "DiscoveryIdentityConfig",
        &["cluster", "secret"],
        Set::Present,
        "cluster identity is already configured in .cluster.id/.cluster.secret of the v1alpha1 config",
    ),
    c(
        "DiscoveryServiceConfig",
        &["cluster", "discovery"],
        Set::Present,
        "discovery service is already configured in .cluster.discovery of the v1alpha1 config",
    ),
    c(
        "CRIBaseRuntimeSpecConfig",
        // An inline map (`meta.Unstructured`): `{}` leaves it nil.
        &["machine", "baseRuntimeSpecOverrides"],
        Set::NonEmpty,
        "base runtime spec overrides are already set in v1alpha1 config",
    ),
    c(
        "ImageCacheConfig",
        &["machine", "features", "imageCache"],
        Set::Present,
        "image cache config is already set in v1alpha1 config",
    ),
    c(
        "KubeAdmissionControlConfig",
        &["cluster", "apiServer", "admissionControl"],
        Set::NonEmpty,
        "admission control plugin config is already set in v1alpha1 config",
    ),
    c(
        "KubeAuditPolicyConfig",
        &["cluster", "apiServer", "auditPolicy"],
        Set::NonEmpty,
        "audit policy config is already set in v1alpha1 config",
    ),
    // Talos' own text: the authorizer document checks the admission plugins too.
    c(
        "KubeAuthorizerConfig",
        &["cluster", "apiServer", "admissionControl"],
        Set::NonEmpty,
        "admission control plugin config is already set in v1alpha1 config",
    ),
    c(
        "KubeClusterConfig",
        &["cluster", "clusterName"],
        Set::Present,
        "cluster name is already set in the v1alpha1 config (.cluster.clusterName). Please remove it and use only the new KubeClusterConfig document to avoid conflicts",
    ),
    c(
        "KubeClusterConfig",
        &["cluster", "controlPlane", "endpoint"],
        Set::NotNull,
        "cluster endpoint is already set in the v1alpha1 config (.cluster.controlPlane.endpoint). Please remove it and use only the new KubeClusterConfig document to avoid conflicts",
    ),
    c(
        "KubeCredentialProviderConfig",
        &["machine", "kubelet"],
        Set::Present,
        "cannot use KubeCredentialProviderConfig with legacy kubelet configuration (.machine.kubelet)",
    ),
    c(
        "KubeEtcdEncryptionConfig",
        &["cluster", "secretboxEncryptionSecret"],
        Set::Present,
        "etcd encryption config is already set in v1alpha1 config",
    ),
    c(
        "KubeEtcdEncryptionConfig",
        &["cluster", "aescbcEncryptionSecret"],
        Set::Present,
        "etcd encryption config is already set in v1alpha1 config",
    ),
    c(
        "KubeFlannelCNIConfig",
        &["cluster", "network"],
        Set::Present,
        "cluster network config in v1alpha1 config (.machine.cluster.network) can't be used with KubeFlannelCNIConfig document, please remove it to avoid conflicts",
    ),
    c(
        "KubePrismConfig",
        &["machine", "features", "kubePrism"],
        Set::Present,
        "KubePrism config in v1alpha1 config (.machine.features.kubePrism) can't be used with KubePrismConfig document, please remove it to avoid conflicts",
    ),
    c(
        "KubeNetworkConfig",
        &["cluster", "network"],
        Set::Present,
        "cluster network config is already set in the v1alpha1 config (.machine.cluster.network). Please remove it and use only the new KubeNetworkConfig document to avoid conflicts",
    ),
    c(
        "KubeProxyConfig",
        &["cluster", "proxy"],
        Set::Present,
        "cluster proxy config in v1alpha1 config (.machine.cluster.proxy) can't be used with KubeProxyConfig document, please remove it to avoid conflicts",
    ),
    c(
        "KubeTalosAPIAccessConfig",
        &["machine", "features", "kubernetesTalosAPIAccess"],
        Set::Present,
        ".machine.features.kubernetesTalosAPIAccess is already set in v1alpha1 config",
    ),
    c(
        "KubeSpanConfig",
        &["machine", "network", "kubespan"],
        Set::Present,
        "kubespan is already configured in v1alpha1 machine.network.kubespan",
    ),
    c(
        "TimeSyncConfig",
        &["machine", "time", "disabled"],
        Set::True,
        "time sync cannot be disabled in both v1alpha1 and new-style configuration",
    ),
    c(
        "TimeSyncConfig",
        &["machine", "time", "servers"],
        Set::NonEmpty,
        "time servers cannot be specified in both v1alpha1 and new-style configuration",
    ),
    c(
        "TimeSyncConfig",
        &["machine", "time", "bootTimeout"],
        Set::NonZeroDuration,
        "boot timeout cannot be specified in both v1alpha1 and new-style configuration",
    ),
    c(
        "UnattendedInstallConfig",
        &["machine", "install"],
        Set::Present,
        "UnattendedInstallConfig config is incompatible with v1alpha1 config (.machine.install)",
    ),
    cd(
        "VolumeConfig",
        &[
            (&["name"], Want::Is("STATE")),
            // `Encryption()` is nil for provider `none`; `luks2` is the only other.
            (&["encryption", "provider"], Want::Is("luks2")),
        ],
        &["machine", "systemDiskEncryption", "state"],
        Set::Present,
        "system disk encryption for \"STATE\" is configured in both v1alpha1.Config and VolumeConfig",
    ),
    cd(
        "VolumeConfig",
        &[
            (&["name"], Want::Is("EPHEMERAL")),
            // `Encryption()` is nil for provider `none`; `luks2` is the only other.
            (&["encryption", "provider"], Want::Is("luks2")),
        ],
        &["machine", "systemDiskEncryption", "ephemeral"],
        Set::Present,
        "system disk encryption for \"EPHEMERAL\" is configured in both v1alpha1.Config and VolumeConfig",
    ),
];

impl Set {
    pub fn holds(self, v: &serde_json::Value) -> bool {
        match self {
            Set::Present => !v.is_null() && v.as_str() != Some(""),
            Set::NonZero => v.as_f64().is_some_and(|n| n != 0.0),
            Set::True => v.as_bool() == Some(true),
            Set::NonEmpty => match v {
                serde_json::Value::Array(a) => !a.is_empty(),
                serde_json::Value::Object(m) => !m.is_empty(),
                serde_json::Value::String(t) => !t.is_empty(),
                _ => false,
            },
            Set::NonZeroDuration => match v {
                serde_json::Value::Number(n) => n.as_f64().is_some_and(|n| n != 0.0),
                // Go's duration text: digits, a point and units; zero when no digit but 0.
                serde_json::Value::String(t) => t.chars().any(|c| c.is_ascii_digit() && c != '0'),
                _ => false,
            },
            Set::NotNull => !v.is_null(),
            Set::SomeAddress => v
                .as_array()
                .is_some_and(|a| a.iter().filter_map(|e| e.as_str()).any(is_address)),
            Set::SomeField => v
                .as_object()
                .is_some_and(|m| m.values().any(|f| !f.is_null())),
        }
    }
}

/// Whether Go's `netip.ParseAddr` reads `text`: an IPv4 or IPv6 address, an IPv6 one with a
/// non-empty zone (`fe80::1%eth0`).
fn is_address(text: &str) -> bool {
    match text.split_once('%') {
        Some((addr, zone)) => !zone.is_empty() && addr.parse::<std::net::Ipv6Addr>().is_ok(),
        None => text.parse::<std::net::IpAddr>().is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::{CONFLICTS, Set, Want};
    use serde_json::json;

    #[test]
    fn what_counts_as_set() {
        assert!(Set::NonEmpty.holds(&json!(["10.0.0.1"])));
        assert!(Set::NonEmpty.holds(&json!({"a": 1})));
        assert!(!Set::NonEmpty.holds(&json!([])));
        assert!(!Set::NonEmpty.holds(&json!({})));
        assert!(!Set::NonEmpty.holds(&json!(null)));
        assert!(Set::NonZeroDuration.holds(&json!("2m")));
        assert!(Set::NonZeroDuration.holds(&json!("1h0m10s")));
        assert!(Set::NonZeroDuration.holds(&json!(30)));
        for zero in [
            json!("0s"),
            json!("0"),
            json!(""),
            json!("0m0s"),
            json!(0),
            json!(null),
        ] {
            assert!(!Set::NonZeroDuration.holds(&zero), "{zero}");
        }
        assert!(Set::Present.holds(&json!({})));
        assert!(Set::NotNull.holds(&json!("")));
        assert!(!Set::NotNull.holds(&json!(null)));
        assert!(Set::SomeAddress.holds(&json!(["dns.example", "10.0.0.1"])));
        assert!(Set::SomeAddress.holds(&json!(["fe80::1%eth0"])));
        for none in [
            json!(["dns.example"]),
            json!(["fe80::1%"]),
            json!(["10.0.0.1%eth0"]),
            json!([]),
            json!(null),
        ] {
            assert!(!Set::SomeAddress.holds(&none), "{none}");
        }
        assert!(Set::SomeField.holds(&json!({"enabled": false})));
        assert!(!Set::SomeField.holds(&json!({"enabled": null})));
        assert!(!Set::SomeField.holds(&json!({})));
        assert!(!Set::Present.holds(&json!("")));
        assert!(Want::Is("STATE").holds(&json!("STATE")));
        assert!(!Want::Is("STATE").holds(&json!("EPHEMERAL")));
    }

    /// Each (kind, path, fields of the document) is listed once: a second entry would never
    /// be reached, and its message never given.
    #[test]
    fn no_entry_shadows_another() {
        for (i, a) in CONFLICTS.iter().enumerate() {
            for b in &CONFLICTS[..i] {
                assert!(
                    !(a.kind == b.kind && a.path == b.path && a.doc == b.doc),
                    "{} {} listed twice",
                    a.kind,
                    a.path.join(".")
                );
            }
        }
    }
}
