//! The conflicts Talos refuses between the legacy machine config (`v1alpha1`) and a newer
//! document of the same concern (each document's `V1Alpha1ConflictValidate` in Talos'
//! `pkg/machinery/config/types`), as data: a document of `kind` present while the machine
//! config has `path` set is refused with Talos' own `message`. Each entry has its test
//! (`tests/render.rs`, `every_conflict_is_refused_with_talos_message`).

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
}

/// One conflict Talos refuses.
#[derive(Clone, Copy, Debug)]
pub struct Conflict {
    /// The newer document's kind.
    pub kind: &'static str,
    /// The machine config path that may not be set next to it.
    pub path: &'static [&'static str],
    pub set: Set,
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
        &["machine", "controlplane", "controllerManager"],
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
        &["machine", "controlplane", "scheduler"],
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
        Set::Present,
        ".machine.network.nameservers is already set in v1alpha1 config",
    ),
    c(
        "ResolverConfig",
        &["machine", "network", "disableSearchDomain"],
        Set::True,
        ".machine.network.disableSearchDomain is already set in v1alpha1 config",
    ),
];

impl Set {
    pub fn holds(self, v: &serde_json::Value) -> bool {
        match self {
            Set::Present => !v.is_null() && v.as_str() != Some(""),
            Set::NonZero => v.as_f64().is_some_and(|n| n != 0.0),
            Set::True => v.as_bool() == Some(true),
        }
    }
}
