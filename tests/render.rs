//! The render library (`runtime::render`): Talos' strategic merge and JSON patches, the
//! identity, validation with Talos' conflict table, deterministic bytes and their sha256,
//! hostile input bounded, and the redacted base failing exactly when the real one does.

use crate::support::talos::{CONFLICTING_KINDS, talos_checks};
use ichor_rules::runtime::render::required::{Present, REQUIRED_FIELDS, Required};
use ichor_rules::runtime::render::{
    self, Base, Identity, Patch, RenderError, Role, conflicts::CONFLICTS, conflicts::Conflict,
    conflicts::Set, conflicts::Want,
};
use proptest::prelude::*;

const CP: &str = include_str!("fixtures/talos/controlplane.yaml");
const WORKER: &str = include_str!("fixtures/talos/worker.yaml");

fn base() -> Base {
    Base::parse(CP, WORKER, true).unwrap()
}

fn strategic(text: &str) -> Patch {
    Patch::parse("TalosConfigPatch ns/p", Some(text), None).unwrap()
}

fn json(text: &str) -> Patch {
    Patch::parse("TalosConfigPatch ns/p", None, Some(text)).unwrap()
}

fn cp(patches: &[&Patch]) -> Result<render::Rendered, RenderError> {
    render::render(&base(), Role::ControlPlane, patches, Identity::default())
}

fn yaml(r: &render::Rendered) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(&r.text)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .collect()
}

fn machine_config(r: &render::Rendered) -> serde_json::Value {
    yaml(r)
        .into_iter()
        .find(|d| d.get("version").is_some())
        .unwrap()
}

#[test]
fn the_base_renders_for_both_roles_deterministically() {
    for role in [Role::ControlPlane, Role::Worker] {
        let a = render::render(&base(), role, &[], Identity::default()).unwrap();
        let b = render::render(&base(), role, &[], Identity::default()).unwrap();
        assert_eq!(a.text, b.text, "same inputs, same bytes");
        assert_eq!(a.sha256.len(), 64);
        let digest = ring::digest::digest(&ring::digest::SHA256, a.text.as_bytes());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(a.sha256, hex, "the hash is the sha256 of the bytes");
        assert_eq!(machine_config(&a)["machine"]["type"], role.name());
    }
    let cp = render::render(&base(), Role::ControlPlane, &[], Identity::default()).unwrap();
    let w = render::render(&base(), Role::Worker, &[], Identity::default()).unwrap();
    assert_ne!(cp.sha256, w.sha256);
}

#[test]
fn a_different_input_gives_a_different_hash() {
    let a = cp(&[]).unwrap();
    let b = cp(&[&strategic(
        "version: v1alpha1\nmachine:\n  sysctls:\n    net.ipv4.ip_forward: \"1\"\n",
    )])
    .unwrap();
    assert_ne!(a.sha256, b.sha256);
    let ident = render::render(
        &base(),
        Role::ControlPlane,
        &[],
        Identity {
            hostname: Some("cp-1"),
            install_disk: None,
        },
    )
    .unwrap();
    assert_ne!(a.sha256, ident.sha256);
}

/// The seed's case (ADR 0106 §1): `cluster.apiServer` set while the base carries a
/// `KubeAPIServerConfig` document.
#[test]
fn the_seed_case_is_refused_with_talos_words() {
    let p = strategic(
        "cluster:\n  apiServer:\n    extraArgs:\n      feature-gates: Foo=true\nversion: v1alpha1\n",
    );
    let err = cp(&[&p]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)"
    );
    assert_eq!(err.reason(), "ConfigConflict");
    // A worker's base has no KubeAPIServerConfig: the same patch renders there.
    render::render(&base(), Role::Worker, &[&p], Identity::default()).unwrap();
}

/// A minimal machine config with none of the conflict table's paths set.
const MINIMAL: &str = "version: v1alpha1
machine:
  type: controlplane
  token: SECRET-BASE-t
  ca:
    crt: SECRET-BASE-c
    key: SECRET-BASE-k
cluster:
  controlPlane:
    endpoint: https://10.0.0.10:6443
";

fn nest(path: &[&str], leaf: serde_json::Value) -> serde_json::Value {
    path.iter()
        .rev()
        .fold(leaf, |v, k| serde_json::json!({ *k: v }))
}

/// A value that counts as set for `set`.
fn leaf(set: Set) -> serde_json::Value {
    match set {
        Set::Present => serde_json::json!({"image": "x"}),
        Set::NonZero => serde_json::json!(6444),
        Set::True => serde_json::json!(true),
        Set::NonEmpty => serde_json::json!(["x"]),
        Set::NonZeroDuration => serde_json::json!("2m"),
        Set::NotNull => serde_json::json!("x"),
        Set::SomeAddress => serde_json::json!(["10.0.0.1"]),
        Set::SomeField => serde_json::json!({"enabled": true}),
    }
}

/// A value that counts as set at a conflict's path (a path every base sets keeps its
/// scalar's type, so that the patch merges).
fn conflict_leaf(c: &Conflict) -> serde_json::Value {
    if render::REQUIRED.contains(&c.path) {
        serde_json::json!("https://10.0.0.11:6443")
    } else {
        leaf(c.set)
    }
}

/// The newer document of a conflict, with the fields its entry asks of it.
fn conflict_doc(c: &Conflict) -> serde_json::Value {
    // The fields Talos requires of the kind, then the ones the entry asks.
    let mut doc = complete(c.kind);
    for (path, want) in c.doc {
        let v = match want {
            Want::Set(set) => leaf(*set),
            Want::Is(text) => serde_json::json!(text),
        };
        let mut at = &mut doc;
        for (i, p) in path.iter().enumerate() {
            if i + 1 == path.len() {
                at[*p] = v.clone();
            } else {
                at = &mut at[*p];
            }
        }
    }
    doc
}

/// The machine config without `cluster.controlPlane.endpoint` when `kind` is the document
/// that may hold it instead (`KubeClusterConfig`): else every such document would conflict
/// with the endpoint already.
fn lean_text(kind: &str) -> String {
    if kind == render::ENDPOINT_DOCUMENT.0 {
        MINIMAL.replace(
            "  controlPlane:\n    endpoint: https://10.0.0.10:6443\n",
            "",
        )
    } else {
        MINIMAL.to_string()
    }
}

fn lean_base(kind: &str) -> Base {
    let text = lean_text(kind);
    Base::parse(&text, &text.replace("controlplane", "worker"), true).unwrap()
}

/// A configuration made by hand (not by the render library): [`lean_text`] with `path` set
/// to `v`, and `doc` after it.
fn by_hand(
    kind: &str,
    path: &[&str],
    v: Option<&serde_json::Value>,
    doc: Option<&serde_json::Value>,
) -> String {
    let mut v1: serde_json::Value = serde_yaml::from_str(&lean_text(kind)).unwrap();
    if let Some(v) = v {
        set_at(&mut v1, path, v.clone());
    }
    let mut text = serde_yaml::to_string(&v1).unwrap();
    if let Some(doc) = doc {
        text.push_str("---\n");
        text.push_str(&serde_yaml::to_string(doc).unwrap());
    }
    text
}

/// A patch setting `path` of the machine config to `v`.
fn set_patch(path: &[&str], v: &serde_json::Value) -> Patch {
    let mut v1 = nest(path, v.clone());
    v1["version"] = "v1alpha1".into();
    strategic(&serde_json::to_string(&v1).unwrap())
}

fn cp_on(base: &Base, patches: &[&Patch]) -> Result<render::Rendered, RenderError> {
    render::render(base, Role::ControlPlane, patches, Identity::default())
}

/// The test of one entry of the conflict table: the table holds `kind` next to `path` once,
/// with `message` (Talos' words, written out again here from Talos' source); each of `set`
/// at `path` next to the document is refused with it; each of `unset` (values Talos' typed
/// config reads as unset) is not; the document alone, the path alone, and (for an entry
/// asking fields of the document) the document without them render. The Talos stand-in
/// (`support::talos::talos_checks`, its own reading of Talos' source) says the same of the
/// same configurations made by hand: refused with these words alone, or accepted.
fn conflict_entry(
    kind: &str,
    path: &[&str],
    message: &str,
    set: &[serde_json::Value],
    unset: &[serde_json::Value],
) {
    let at = path.join(".");
    let entries: Vec<&Conflict> = CONFLICTS
        .iter()
        .filter(|c| c.kind == kind && c.path == path)
        .collect();
    assert_eq!(entries.len(), 1, "{kind} next to {at}: in the table once");
    let c = entries[0];
    assert_eq!(c.message, message, "{kind} next to {at}: Talos' words");
    let lean = lean_base(kind);
    let doc = conflict_doc(c);
    let document = strategic(&serde_json::to_string(&doc).unwrap());
    for v in set {
        let err = cp_on(&lean, &[&set_patch(path, v), &document])
            .map(|r| r.text)
            .unwrap_err();
        assert_eq!(
            err,
            RenderError::Conflict {
                kind: c.kind,
                message: c.message
            },
            "{kind} next to {at}: {v}"
        );
        assert_eq!(err.to_string(), message);
        assert_eq!(err.reason(), "ConfigConflict");
    }
    for v in unset {
        cp_on(&lean, &[&set_patch(path, v), &document])
            .unwrap_or_else(|e| panic!("{kind} next to {at}: {v} is unset for Talos: {e}"));
    }
    // Without the conflicting half: the document alone, the path alone.
    cp_on(&lean, &[&document]).unwrap_or_else(|e| panic!("{kind} alone: {e}"));
    let full = Base::parse(MINIMAL, &MINIMAL.replace("controlplane", "worker"), true).unwrap();
    cp_on(&full, &[&set_patch(path, &set[0])]).unwrap_or_else(|e| panic!("{at} alone: {e}"));
    // The document without a field its entry asks of it is no conflict (a required
    // `name`: naming another volume).
    let mut partials = Vec::new();
    for (p, _) in c.doc {
        let mut partial = doc.clone();
        if *p == ["name"] {
            partial["name"] = "IMAGECACHE".into();
        } else {
            remove_at(&mut partial, p);
        }
        let patch = strategic(&serde_json::to_string(&partial).unwrap());
        cp_on(&lean, &[&set_patch(path, &set[0]), &patch])
            .unwrap_or_else(|e| panic!("{kind} without {}, next to {at}: {e}", p.join(".")));
        partials.push(partial);
    }
    // The stand-in, on the same cases.
    for v in set {
        assert_eq!(
            talos_checks(&by_hand(kind, path, Some(v), Some(&doc))),
            Err(vec![message.to_string()]),
            "the stand-in: {kind} next to {at}: {v}"
        );
    }
    for v in unset {
        assert_eq!(
            talos_checks(&by_hand(kind, path, Some(v), Some(&doc))),
            Ok(()),
            "the stand-in: {kind} next to {at}: {v}"
        );
    }
    for (v, d) in [(None, Some(&doc)), (Some(&set[0]), None)]
        .into_iter()
        .chain(partials.iter().map(|p| (Some(&set[0]), Some(p))))
    {
        assert_eq!(
            talos_checks(&by_hand(kind, path, v, d)),
            Ok(()),
            "the stand-in: {kind} / {at}: {v:?} {d:?}"
        );
    }
}

/// One `#[test]` per entry of the conflict table (`conflicts::CONFLICTS`), in its order:
/// the kind, the machine config path, Talos' words, values Talos counts as set there and
/// values it does not (from the field's Go type: a pointer, map or slice is set once it is
/// there and not null, `{}`, `[]` and `false` included; a string once not `""`; a number
/// once not 0). `CONFLICT_TESTS` lists them, so that a table entry without its test fails
/// `every_conflict_entry_has_its_own_test`.
macro_rules! conflict_entries {
    ($(
        $(#[$doc:meta])*
        $name:ident: $kind:literal, [$($p:literal),+], $message:literal,
            set [$($set:tt),+], unset [$($unset:tt),*];
    )+) => {
        $(
            $(#[$doc])*
            #[test]
            fn $name() {
                conflict_entry(
                    $kind,
                    &[$($p),+],
                    $message,
                    &[$(serde_json::json!($set)),+],
                    &[$(serde_json::json!($unset)),*],
                );
            }
        )+
        /// The entries the tests above cover, in the order they are written.
        const CONFLICT_TESTS: &[(&str, &[&str])] = &[$(($kind, &[$($p),+])),+];
    };
}

conflict_entries! {
    /// `k8s/apiserver.go`
    conflict_kube_apiserver_config_cluster_api_server:
        "KubeAPIServerConfig", ["cluster", "apiServer"],
        "kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)",
        set [{"image": "x"}, {}], unset [];
    conflict_kube_apiserver_config_local_api_server_port:
        "KubeAPIServerConfig", ["cluster", "controlPlane", "localAPIServerPort"],
        "kube-apiserver API port is already set in v1alpha1 config (.cluster.controlPlane.localAPIServerPort)",
        set [6444], unset [0];
    /// `k8s/apiserver_ca.go`
    conflict_kube_apiserver_ca_config_cluster_ca:
        "KubeAPIServerCAConfig", ["cluster", "ca"],
        "kube-apiserver CA is already set in v1alpha1 config (.cluster.ca)",
        set [{"crt": "c"}, {}], unset [];
    /// `k8s/aggregator_ca.go`
    conflict_kube_aggregator_ca_config_cluster_aggregator_ca:
        "KubeAggregatorCAConfig", ["cluster", "aggregatorCA"],
        "kube-apiserver aggregator CA is already set in v1alpha1 config (.cluster.aggregatorCA), please remove it and use the new KubeAggregatorCAConfig document instead",
        set [{"crt": "c"}, {}], unset [];
    /// `k8s/controller_manager.go`
    conflict_kube_controller_manager_config_cluster_controller_manager:
        "KubeControllerManagerConfig", ["cluster", "controllerManager"],
        "kube-controller-manager config is already set in v1alpha1 config (.cluster.controllerManager)",
        set [{"image": "x"}, {}], unset [];
    /// Talos' words say `controlplane`; the field is `MachineControlPlane`,
    /// `yaml:"controlPlane"`.
    conflict_kube_controller_manager_config_machine_control_plane:
        "KubeControllerManagerConfig", ["machine", "controlPlane", "controllerManager"],
        "kube-controller-manager config is already set in v1alpha1 config (.machine.controlplane.controllerManager)",
        set [{"disabled": true}, {}], unset [];
    /// `k8s/scheduler.go`
    conflict_kube_scheduler_config_cluster_scheduler:
        "KubeSchedulerConfig", ["cluster", "scheduler"],
        "kube-scheduler config is already set in v1alpha1 config (.cluster.scheduler)",
        set [{"image": "x"}, {}], unset [];
    conflict_kube_scheduler_config_machine_control_plane:
        "KubeSchedulerConfig", ["machine", "controlPlane", "scheduler"],
        "kube-scheduler config is already set in v1alpha1 config (.machine.controlplane.scheduler)",
        set [{"disabled": true}, {}], unset [];
    /// `k8s/coredns.go`
    conflict_kube_core_dns_config_cluster_core_dns:
        "KubeCoreDNSConfig", ["cluster", "coreDNS"],
        "CoreDNS config is already set in v1alpha1 config (.cluster.coreDNS)",
        set [{"disabled": true}, {}], unset [];
    /// `k8s/kubelet.go`
    conflict_kubelet_config_machine_kubelet:
        "KubeletConfig", ["machine", "kubelet"],
        "kubelet config is already set in v1alpha1 config (.machine.kubelet)",
        set [{"image": "x"}, {}], unset [];
    /// `k8s/service_account.go`
    conflict_kube_service_account_config_cluster_service_account:
        "KubeServiceAccountConfig", ["cluster", "serviceAccount"],
        "service account is already set in v1alpha1 config (.cluster.serviceAccount)",
        set [{"key": "k"}, {}], unset [];
    /// `k8s/node.go`: `*bool` fields, so `false` is set.
    conflict_kube_node_config_allow_scheduling_on_control_planes:
        "KubeNodeConfig", ["cluster", "allowSchedulingOnControlPlanes"],
        ".cluster.allowSchedulingOnControlPlanes is already set in v1alpha1 config",
        set [true, false], unset [];
    conflict_kube_node_config_allow_scheduling_on_masters:
        "KubeNodeConfig", ["cluster", "allowSchedulingOnMasters"],
        ".cluster.allowSchedulingOnMasters is already set in v1alpha1 config",
        set [true, false], unset [];
    conflict_kube_node_config_skip_node_registration:
        "KubeNodeConfig", ["machine", "kubelet", "skipNodeRegistration"],
        ".machine.kubelet.skipNodeRegistration is already set in v1alpha1 config",
        set [true, false], unset [];
    conflict_kube_node_config_register_with_fqdn:
        "KubeNodeConfig", ["machine", "kubelet", "registerWithFQDN"],
        ".machine.kubelet.registerWithFQDN is already set in v1alpha1 config",
        set [true, false], unset [];
    conflict_kube_node_config_node_ip:
        "KubeNodeConfig", ["machine", "kubelet", "nodeIP"],
        ".machine.kubelet.nodeIP is already set in v1alpha1 config",
        set [{"validSubnets": ["10.0.0.0/8"]}, {}], unset [];
    /// `map[string]string`: `{}` is a map, not nil.
    conflict_kube_node_config_node_labels:
        "KubeNodeConfig", ["machine", "nodeLabels"],
        ".machine.nodeLabels is already set in v1alpha1 config",
        set [{"a": "b"}, {}], unset [];
    conflict_kube_node_config_node_annotations:
        "KubeNodeConfig", ["machine", "nodeAnnotations"],
        ".machine.nodeAnnotations is already set in v1alpha1 config",
        set [{"a": "b"}, {}], unset [];
    conflict_kube_node_config_node_taints:
        "KubeNodeConfig", ["machine", "nodeTaints"],
        ".machine.nodeTaints is already set in v1alpha1 config",
        set [{"a": "b:NoSchedule"}, {}], unset [];
    /// `network/hostname.go`: `Hostname() != ""`.
    conflict_hostname_config_machine_network_hostname:
        "HostnameConfig", ["machine", "network", "hostname"],
        "static hostname is already set in v1alpha1 config",
        set ["cp-1"], unset [""];
    /// `network/resolver.go`: `SearchDomains().IsPresent()` (a non-nil slice, `[]` too).
    conflict_resolver_config_search_domains:
        "ResolverConfig", ["machine", "network", "searchDomains"],
        ".machine.network.searchDomains is already set in v1alpha1 config",
        set [["example.org"], []], unset [];
    /// `Resolvers() != nil`: at least one nameserver `netip.ParseAddr` reads.
    conflict_resolver_config_nameservers:
        "ResolverConfig", ["machine", "network", "nameservers"],
        ".machine.network.nameservers is already set in v1alpha1 config",
        set [["10.0.0.1"], ["dns.example", "fe80::1%eth0"]], unset [[], ["dns.example"]];
    conflict_resolver_config_disable_search_domain:
        "ResolverConfig", ["machine", "network", "disableSearchDomain"],
        ".machine.network.disableSearchDomain is already set in v1alpha1 config",
        set [true], unset [false];
    /// Only when the document's `hostDNS` is not its zero value.
    conflict_resolver_config_host_dns:
        "ResolverConfig", ["machine", "features", "hostDNS"],
        ".machine.features.hostDNS is already set in v1alpha1 config",
        set [{"enabled": true}, {}], unset [];
    /// `AutoHostname() != AutoHostnameKindAddr`: `stableHostname: true`.
    conflict_hostname_config_stable_hostname:
        "HostnameConfig", ["machine", "features", "stableHostname"],
        "stable hostname is already set in v1alpha1 config",
        set [true], unset [false];
    /// `cluster/discovery_identity.go`: strings.
    conflict_discovery_identity_config_cluster_id:
        "DiscoveryIdentityConfig", ["cluster", "id"],
        "cluster identity is already configured in .cluster.id/.cluster.secret of the v1alpha1 config",
        set ["abc"], unset [""];
    conflict_discovery_identity_config_cluster_secret:
        "DiscoveryIdentityConfig", ["cluster", "secret"],
        "cluster identity is already configured in .cluster.id/.cluster.secret of the v1alpha1 config",
        set ["abc"], unset [""];
    /// `cluster/discovery_service.go`
    conflict_discovery_service_config_cluster_discovery:
        "DiscoveryServiceConfig", ["cluster", "discovery"],
        "discovery service is already configured in .cluster.discovery of the v1alpha1 config",
        set [{"enabled": true}, {}], unset [];
    /// `cri/base_runtime_spec.go`: `.Object != nil` of an inline map, which `{}` leaves nil.
    conflict_cri_base_runtime_spec_config_overrides:
        "CRIBaseRuntimeSpecConfig", ["machine", "baseRuntimeSpecOverrides"],
        "base runtime spec overrides are already set in v1alpha1 config",
        set [{"process": {"cwd": "/"}}], unset [{}];
    /// `cri/image_cache.go`
    conflict_image_cache_config_machine_features_image_cache:
        "ImageCacheConfig", ["machine", "features", "imageCache"],
        "image cache config is already set in v1alpha1 config",
        set [{"localEnabled": true}, {}], unset [];
    /// `k8s/admission_control.go`: `len(...) > 0`.
    conflict_kube_admission_control_config_admission_control:
        "KubeAdmissionControlConfig", ["cluster", "apiServer", "admissionControl"],
        "admission control plugin config is already set in v1alpha1 config",
        set [[{"name": "PodSecurity", "configuration": {"a": "b"}}]], unset [[]];
    /// `k8s/audit_policy.go`: `len(.Object) > 0`.
    conflict_kube_audit_policy_config_audit_policy:
        "KubeAuditPolicyConfig", ["cluster", "apiServer", "auditPolicy"],
        "audit policy config is already set in v1alpha1 config",
        set [{"apiVersion": "audit.k8s.io/v1"}], unset [{}];
    /// `k8s/authorization.go`: Talos checks the admission plugins, in the admission
    /// document's words.
    conflict_kube_authorizer_config_admission_control:
        "KubeAuthorizerConfig", ["cluster", "apiServer", "admissionControl"],
        "admission control plugin config is already set in v1alpha1 config",
        set [[{"name": "PodSecurity", "configuration": {"a": "b"}}]], unset [[]];
    /// `k8s/cluster.go`
    conflict_kube_cluster_config_cluster_name:
        "KubeClusterConfig", ["cluster", "clusterName"],
        "cluster name is already set in the v1alpha1 config (.cluster.clusterName). Please remove it and use only the new KubeClusterConfig document to avoid conflicts",
        set ["prod"], unset [""];
    /// A `*Endpoint` whose YAML is a URL: `""` parses, and is set.
    conflict_kube_cluster_config_endpoint:
        "KubeClusterConfig", ["cluster", "controlPlane", "endpoint"],
        "cluster endpoint is already set in the v1alpha1 config (.cluster.controlPlane.endpoint). Please remove it and use only the new KubeClusterConfig document to avoid conflicts",
        set ["https://10.0.0.11:6443", ""], unset [];
    /// `k8s/credential_provider.go`
    conflict_kube_credential_provider_config_machine_kubelet:
        "KubeCredentialProviderConfig", ["machine", "kubelet"],
        "cannot use KubeCredentialProviderConfig with legacy kubelet configuration (.machine.kubelet)",
        set [{"image": "x"}, {}], unset [];
    /// `k8s/etcd_encryption.go`: strings.
    conflict_kube_etcd_encryption_config_secretbox:
        "KubeEtcdEncryptionConfig", ["cluster", "secretboxEncryptionSecret"],
        "etcd encryption config is already set in v1alpha1 config",
        set ["s"], unset [""];
    conflict_kube_etcd_encryption_config_aescbc:
        "KubeEtcdEncryptionConfig", ["cluster", "aescbcEncryptionSecret"],
        "etcd encryption config is already set in v1alpha1 config",
        set ["s"], unset [""];
    /// `k8s/flannel.go`
    conflict_kube_flannel_cni_config_cluster_network:
        "KubeFlannelCNIConfig", ["cluster", "network"],
        "cluster network config in v1alpha1 config (.machine.cluster.network) can't be used with KubeFlannelCNIConfig document, please remove it to avoid conflicts",
        set [{"dnsDomain": "cluster.local"}, {}], unset [];
    /// `k8s/kubeprism.go`
    conflict_kube_prism_config_machine_features_kube_prism:
        "KubePrismConfig", ["machine", "features", "kubePrism"],
        "KubePrism config in v1alpha1 config (.machine.features.kubePrism) can't be used with KubePrismConfig document, please remove it to avoid conflicts",
        set [{"enabled": true}, {}], unset [];
    /// `k8s/network.go`
    conflict_kube_network_config_cluster_network:
        "KubeNetworkConfig", ["cluster", "network"],
        "cluster network config is already set in the v1alpha1 config (.machine.cluster.network). Please remove it and use only the new KubeNetworkConfig document to avoid conflicts",
        set [{"dnsDomain": "cluster.local"}, {}], unset [];
    /// `k8s/proxy.go`
    conflict_kube_proxy_config_cluster_proxy:
        "KubeProxyConfig", ["cluster", "proxy"],
        "cluster proxy config in v1alpha1 config (.machine.cluster.proxy) can't be used with KubeProxyConfig document, please remove it to avoid conflicts",
        set [{"disabled": true}, {}], unset [];
    /// `k8s/talos_api_access.go`
    conflict_kube_talos_api_access_config:
        "KubeTalosAPIAccessConfig", ["machine", "features", "kubernetesTalosAPIAccess"],
        ".machine.features.kubernetesTalosAPIAccess is already set in v1alpha1 config",
        set [{"enabled": true}, {}], unset [];
    /// `network/kubespan.go`
    conflict_kube_span_config_machine_network_kubespan:
        "KubeSpanConfig", ["machine", "network", "kubespan"],
        "kubespan is already configured in v1alpha1 machine.network.kubespan",
        set [{"enabled": true}, {}], unset [];
    /// `network/time_sync.go`: `Disabled()` (a `*bool` read as its value), `len(Servers())
    /// > 0`, `BootTimeout() != 0`.
    conflict_time_sync_config_disabled:
        "TimeSyncConfig", ["machine", "time", "disabled"],
        "time sync cannot be disabled in both v1alpha1 and new-style configuration",
        set [true], unset [false];
    conflict_time_sync_config_servers:
        "TimeSyncConfig", ["machine", "time", "servers"],
        "time servers cannot be specified in both v1alpha1 and new-style configuration",
        set [["time.cloudflare.com"]], unset [[]];
    conflict_time_sync_config_boot_timeout:
        "TimeSyncConfig", ["machine", "time", "bootTimeout"],
        "boot timeout cannot be specified in both v1alpha1 and new-style configuration",
        set ["2m", "1h0m10s"], unset ["0s", "0m0s"];
    /// `runtime/unattended_install.go`
    conflict_unattended_install_config_machine_install:
        "UnattendedInstallConfig", ["machine", "install"],
        "UnattendedInstallConfig config is incompatible with v1alpha1 config (.machine.install)",
        set [{"disk": "/dev/sda"}, {}], unset [];
    /// `block/volume_config.go`: a STATE or EPHEMERAL volume whose `Encryption()` is not
    /// nil (provider `luks2`), next to the legacy encryption of the same partition.
    conflict_volume_config_state_encryption:
        "VolumeConfig", ["machine", "systemDiskEncryption", "state"],
        "system disk encryption for \"STATE\" is configured in both v1alpha1.Config and VolumeConfig",
        set [{"provider": "luks2"}, {}], unset [];
    conflict_volume_config_ephemeral_encryption:
        "VolumeConfig", ["machine", "systemDiskEncryption", "ephemeral"],
        "system disk encryption for \"EPHEMERAL\" is configured in both v1alpha1.Config and VolumeConfig",
        set [{"provider": "luks2"}, {}], unset [];
}

/// Every entry of the conflict table has its test above, and every test its entry: the
/// same (kind, path) pairs in the same order (the order decides which message Talos gives
/// first).
#[test]
fn every_conflict_entry_has_its_own_test() {
    let table: Vec<(&str, &[&str])> = CONFLICTS.iter().map(|c| (c.kind, c.path)).collect();
    assert_eq!(
        CONFLICT_TESTS.len(),
        CONFLICTS.len(),
        "one test per entry of conflicts::CONFLICTS"
    );
    assert_eq!(CONFLICT_TESTS.to_vec(), table);
    // The kinds Talos checks, as the stand-in knows them (from Talos' source), are the
    // table's.
    let kinds: std::collections::BTreeSet<&str> = CONFLICTS.iter().map(|c| c.kind).collect();
    let stand_in: std::collections::BTreeSet<&str> = CONFLICTING_KINDS.iter().copied().collect();
    assert_eq!(kinds, stand_in);
}

/// Talos' multi-document Kubernetes contract keeps the endpoint in a `KubeClusterConfig`
/// document and no `cluster.controlPlane`: such a base renders; one with the endpoint in
/// neither place does not.
#[test]
fn the_endpoint_may_live_in_a_kube_cluster_config_document() {
    let multidoc = |endpoint: &str| {
        format!(
            "version: v1alpha1
machine:
  type: controlplane
  token: SECRET-BASE-t
  ca:
    crt: SECRET-BASE-c
    key: SECRET-BASE-k
cluster: {{}}
---
apiVersion: v1alpha1
kind: KubeClusterConfig
clusterName: prod
endpoint: {endpoint}
"
        )
    };
    let text = multidoc("https://10.0.0.10:6443");
    let base = Base::parse(&text, &text.replace("controlplane", "worker"), true).unwrap();
    render::render(&base, Role::ControlPlane, &[], Identity::default())
        .expect("the endpoint in KubeClusterConfig is enough");
    let text = multidoc("\"\"");
    let err = Base::parse(&text, &text.replace("controlplane", "worker"), true)
        .and_then(|base| render::render(&base, Role::ControlPlane, &[], Identity::default()))
        .unwrap_err();
    // Talos' own words for the document's empty endpoint.
    assert!(
        err.to_string()
            .contains("document KubeClusterConfig: endpoint must be specified (`endpoint`"),
        "{err}"
    );
}

#[test]
fn maps_merge_scalars_replace_lists_append() {
    let p = strategic(
        "version: v1alpha1
machine:
  install:
    wipe: true
    image: \"\"
  certSANs: [a.example]
  kubelet:
    extraArgs:
      rotate-server-certificates: \"true\"
cluster:
  clusterName: renamed
",
    );
    let m = machine_config(&cp(&[&p]).unwrap());
    assert_eq!(
        m["machine"]["install"]["wipe"], true,
        "false is replaced by true"
    );
    assert_eq!(
        m["machine"]["install"]["disk"], "/dev/sda",
        "untouched keys stay"
    );
    assert_eq!(
        m["machine"]["install"]["image"], "ghcr.io/siderolabs/installer:v1.14.3",
        "a zero value (\"\") changes nothing, as in Talos"
    );
    assert_eq!(m["machine"]["certSANs"], serde_json::json!(["a.example"]));
    assert_eq!(
        m["machine"]["kubelet"]["image"],
        "ghcr.io/siderolabs/kubelet:v1.35.0"
    );
    assert_eq!(
        m["machine"]["kubelet"]["extraArgs"]["rotate-server-certificates"],
        "true"
    );
    assert_eq!(m["cluster"]["clusterName"], "renamed");
    // Lists append.
    let twice = strategic("version: v1alpha1\nmachine:\n  certSANs: [b.example]\n");
    let m = machine_config(&cp(&[&p, &twice]).unwrap());
    assert_eq!(
        m["machine"]["certSANs"],
        serde_json::json!(["a.example", "b.example"])
    );
}

/// What a zero value in a patch does (docs/operators.md, the merge): `false` replaces the
/// base's `true` (and `true` a `false`); `0` and `""` keep the base's value, and land where
/// the base has none; `null` changes nothing and adds nothing; an `extraArgs` argument is
/// set whatever it holds; an empty replaced list keeps the base's. Where Talos' typed merge
/// does otherwise (a `0` or `""` through a pointer field such as `kubespan.mtu`, an empty
/// replaced list) the docs say so: these assertions pin the project's own behaviour.
#[test]
fn zero_values_in_a_patch() {
    let set = strategic(
        "version: v1alpha1
machine:
  network:
    kubespan:
      enabled: true
      mtu: 1420
  sysctls:
    a: \"1\"
cluster:
  controllerManager:
    extraArgs:
      bind-address: 0.0.0.0
",
    );
    let zero = strategic(
        "version: v1alpha1
machine:
  kubelet:
    defaultRuntimeSeccompProfileEnabled: false
  network:
    kubespan:
      enabled: false
      mtu: 0
  install:
    image: \"\"
    wipe: true
  sysctls:
    a: \"\"
    b: \"\"
    c: null
  features: null
cluster:
  clusterName: \"\"
  controlPlane:
    localAPIServerPort: 0
    endpoint: null
  controllerManager:
    extraArgs:
      bind-address: \"\"
  network:
    podSubnets: []
  discovery:
    enabled: false
",
    );
    let m = machine_config(&cp(&[&set, &zero]).unwrap());
    // `false` replaces `true`, `true` replaces `false`.
    assert_eq!(
        m["machine"]["kubelet"]["defaultRuntimeSeccompProfileEnabled"],
        false
    );
    assert_eq!(m["machine"]["network"]["kubespan"]["enabled"], false);
    assert_eq!(m["cluster"]["discovery"]["enabled"], false);
    assert_eq!(m["machine"]["install"]["wipe"], true);
    // `0` and `""` keep the base's value...
    assert_eq!(m["machine"]["network"]["kubespan"]["mtu"], 1420);
    assert_eq!(
        m["machine"]["install"]["image"],
        "ghcr.io/siderolabs/installer:v1.14.3"
    );
    assert_eq!(m["cluster"]["clusterName"], "demo");
    assert_eq!(m["machine"]["sysctls"]["a"], "1");
    // ...and land where the base has none (a 0 port is no conflict with the
    // KubeAPIServerConfig document: Talos counts it unset).
    assert_eq!(m["machine"]["sysctls"]["b"], "");
    assert_eq!(m["cluster"]["controlPlane"]["localAPIServerPort"], 0);
    // `null` changes nothing and adds nothing.
    assert_eq!(m["machine"]["features"], serde_json::json!({"rbac": true}));
    assert_eq!(
        m["cluster"]["controlPlane"]["endpoint"],
        "https://10.0.0.10:6443"
    );
    assert!(m["machine"]["sysctls"].get("c").is_none(), "{m}");
    // An argument is set whatever it holds.
    assert_eq!(
        m["cluster"]["controllerManager"]["extraArgs"]["bind-address"],
        ""
    );
    // An empty replaced list keeps the base's.
    assert_eq!(
        m["cluster"]["network"]["podSubnets"],
        serde_json::json!(["10.244.0.0/16"])
    );
}

#[test]
fn keyed_lists_merge_by_their_key_and_replaced_lists_are_replaced() {
    let p = strategic(
        "version: v1alpha1
machine:
  network:
    interfaces:
      - interface: eth0
        mtu: 9000
        vlans:
          - vlanId: 10
            dhcp: true
      - interface: eth1
        dhcp: false
      - deviceSelector:
          hardwareAddr: \"aa:*\"
        dhcp: true
cluster:
  network:
    podSubnets: [10.10.0.0/16]
",
    );
    let again = strategic(
        "version: v1alpha1
machine:
  network:
    interfaces:
      - interface: eth0
        vlans:
          - vlanId: 10
            mtu: 1400
          - vlanId: 20
      - deviceSelector:
          hardwareAddr: \"aa:*\"
        mtu: 1500
",
    );
    let m = machine_config(&cp(&[&p, &again]).unwrap());
    let ifs = m["machine"]["network"]["interfaces"].as_array().unwrap();
    assert_eq!(
        ifs.len(),
        3,
        "eth0 merged, eth1 and the selector appended once: {ifs:?}"
    );
    assert_eq!(ifs[0]["interface"], "eth0");
    assert_eq!(ifs[0]["dhcp"], true);
    assert_eq!(ifs[0]["mtu"], 9000);
    let vlans = ifs[0]["vlans"].as_array().unwrap();
    assert_eq!(vlans.len(), 2, "vlans merge by vlanId: {vlans:?}");
    assert_eq!(vlans[0]["mtu"], 1400);
    assert_eq!(vlans[0]["dhcp"], true);
    assert_eq!(ifs[2]["mtu"], 1500, "merged by deviceSelector");
    assert_eq!(
        m["cluster"]["network"]["podSubnets"],
        serde_json::json!(["10.10.0.0/16"])
    );
    assert_eq!(
        m["cluster"]["network"]["serviceSubnets"],
        serde_json::json!(["10.96.0.0/12"])
    );
}

#[test]
fn admission_control_merges_by_name() {
    let base = Base::parse(
        &format!("{MINIMAL}  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        configuration:\n          a: 1\n"),
        &MINIMAL.replace("controlplane", "worker"),
        true,
    )
    .unwrap();
    let p = strategic(
        "version: v1alpha1\ncluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        configuration:\n          b: 2\n      - name: Other\n",
    );
    let r = render::render(&base, Role::ControlPlane, &[&p], Identity::default()).unwrap();
    let ac = machine_config(&r)["cluster"]["apiServer"]["admissionControl"].clone();
    assert_eq!(ac.as_array().unwrap().len(), 2);
    assert_eq!(ac[0]["configuration"], serde_json::json!({"a": 1, "b": 2}));
}

#[test]
fn patch_delete_removes_keys_items_and_documents() {
    let p = strategic(
        "version: v1alpha1
machine:
  nodeLabels:
    node.kubernetes.io/exclude-from-external-load-balancers:
      $patch: delete
  network:
    interfaces:
      - interface: eth0
        $patch: delete
---
apiVersion: v1alpha1
kind: KubeAPIServerConfig
$patch: delete
",
    );
    let r = cp(&[&p]).unwrap();
    let m = machine_config(&r);
    assert_eq!(m["machine"]["nodeLabels"], serde_json::json!({}));
    assert_eq!(m["machine"]["network"]["interfaces"], serde_json::json!([]));
    assert!(!r.text.contains("KubeAPIServerConfig"), "{}", r.text);
    // With the document gone, cluster.apiServer is allowed (the seed's fix).
    let api = strategic("version: v1alpha1\ncluster:\n  apiServer:\n    image: x\n");
    cp(&[&p, &api]).unwrap();
}

#[test]
fn deleting_what_is_not_there_is_an_error_naming_the_path() {
    let p =
        strategic("version: v1alpha1\nmachine:\n  network:\n    hostname:\n      $patch: delete\n");
    let e = cp(&[&p]).unwrap_err().to_string();
    assert!(
        e.contains("machine.network.hostname") && e.contains("not there"),
        "{e}"
    );
    let p = strategic(
        "version: v1alpha1\nmachine:\n  network:\n    interfaces:\n      - interface: eth9\n        $patch: delete\n",
    );
    let e = cp(&[&p]).unwrap_err().to_string();
    assert!(
        e.contains("machine.network.interfaces") && e.contains("no item"),
        "{e}"
    );
    // A whole document that is not there: skipped, as Talos does (its strategic patcher
    // appends no delete selector).
    let p = strategic("apiVersion: v1alpha1\nkind: KubeletConfig\n$patch: delete\n");
    assert_eq!(cp(&[&p]).unwrap().text, cp(&[]).unwrap().text);
}

/// The document of `kind` in a render.
fn document(r: &render::Rendered, kind: &str) -> serde_json::Value {
    yaml(r)
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {}", r.text))
}

#[test]
fn newer_documents_merge_as_talos_merges_them() {
    // Replaced whole (`merge:"replace"`), each row of the table (the merge alone: some of
    // these documents conflict with the fixture's machine config).
    for (kind, path) in render::merge::REPLACED {
        let (first, second) = if matches!(
            *path,
            ["ingress"] | ["configuration"] | ["pod"] | ["overrides"]
        ) {
            (serde_json::json!({"a": "1"}), serde_json::json!({"b": "2"}))
        } else {
            (
                serde_json::json!(["10.1.0.0/16"]),
                serde_json::json!(["10.2.0.0/16"]),
            )
        };
        let with = |v: &serde_json::Value| {
            let mut d = if *kind == render::merge::MACHINE_CONFIG {
                serde_json::json!({"version": "v1alpha1"})
            } else {
                complete(kind)
            };
            set_at(&mut d, path, v.clone());
            d.as_object().unwrap().clone()
        };
        let mut docs = vec![with(&first)];
        render::merge::merge_documents(&mut docs, &[with(&second)], "p").unwrap();
        let mut got = &serde_json::Value::Object(docs[0].clone());
        for p in *path {
            got = &got[*p];
        }
        assert_eq!(*got, second, "{kind} {}: replaced whole", path.join("."));
    }
    // Every `extraArgs`: an argument replaces the base's whole, a list too, "" included.
    let doc = |v: serde_json::Value| {
        serde_json::json!({"apiVersion": "v1alpha1", "kind": "KubeletConfig", "extraArgs": v})
            .as_object()
            .unwrap()
            .clone()
    };
    let mut docs = vec![doc(
        serde_json::json!({"feature-gates": ["A=true", "B=true"], "v": "2", "keep": "x"}),
    )];
    render::merge::merge_documents(
        &mut docs,
        &[doc(
            serde_json::json!({"feature-gates": ["C=true"], "v": ""}),
        )],
        "p",
    )
    .unwrap();
    assert_eq!(
        docs[0]["extraArgs"],
        serde_json::json!({"feature-gates": ["C=true"], "v": "", "keep": "x"})
    );
    // The machine config's too.
    let p =
        strategic("version: v1alpha1\nmachine:\n  kubelet:\n    extraArgs:\n      rotate: [a]\n");
    let q =
        strategic("version: v1alpha1\nmachine:\n  kubelet:\n    extraArgs:\n      rotate: [b]\n");
    let r = cp(&[&p, &q]).unwrap();
    assert_eq!(
        machine_config(&r)["machine"]["kubelet"]["extraArgs"]["rotate"],
        serde_json::json!(["b"])
    );
    // An extension's config files by mount path: merged.
    let ext = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut\nconfigFiles:\n  - {content: a, mountPath: /etc/a}\n  - {content: b, mountPath: /etc/b}\n";
    let p = strategic(
        "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut\nconfigFiles:\n  - {content: A, mountPath: /etc/a}\n  - {content: c, mountPath: /etc/c}\n",
    );
    let r = cp(&[&strategic(ext), &p]).unwrap();
    assert_eq!(
        document(&r, "ExtensionServiceConfig")["configFiles"],
        serde_json::json!([
            {"content": "A", "mountPath": "/etc/a"},
            {"content": "b", "mountPath": "/etc/b"},
            {"content": "c", "mountPath": "/etc/c"}
        ])
    );
    // Image verification rules by image pattern: replaced, the others kept.
    let iv = "apiVersion: v1alpha1\nkind: ImageVerificationConfig\nrules:\n  - {imagePattern: 'a/*', deny: true, skip: false}\n  - {imagePattern: 'b/*', skip: true}\n";
    let p = strategic(
        "apiVersion: v1alpha1\nkind: ImageVerificationConfig\nrules:\n  - {imagePattern: 'a/*', skip: true}\n",
    );
    let r = cp(&[&strategic(iv), &p]).unwrap();
    assert_eq!(
        document(&r, "ImageVerificationConfig")["rules"],
        serde_json::json!([{"imagePattern": "a/*", "skip": true}, {"imagePattern": "b/*", "skip": true}])
    );
}

#[test]
fn a_map_does_not_merge_into_a_scalar() {
    let p = strategic("version: v1alpha1\nmachine:\n  install: /dev/sdb\n");
    let e = cp(&[&p]).unwrap_err();
    assert_eq!(e.reason(), "PatchDoesNotMerge");
    let t = e.to_string();
    assert!(
        t.contains("TalosConfigPatch ns/p") && t.contains("machine.install") && t.contains("a map"),
        "{t}"
    );
}

#[test]
fn a_new_document_is_appended_without_its_markers() {
    let p = strategic(
        "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut\nenvironment: [A=1]\nconfigFiles:\n  - content: x\n    $patch: delete\n",
    );
    let r = cp(&[&p]).unwrap();
    assert!(
        r.text.contains("kind: ExtensionServiceConfig") && !r.text.contains("$patch"),
        "{}",
        r.text
    );
    // Named documents are told apart by name.
    let q = strategic(
        "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: other\nenvironment: [B=2]\n",
    );
    let r = cp(&[&p, &q]).unwrap();
    assert_eq!(r.text.matches("kind: ExtensionServiceConfig").count(), 2);
}

#[test]
fn json_patches_apply_to_the_machine_config() {
    let p = json(
        "- op: add\n  path: /machine/sysctls\n  value: {vm.max_map_count: \"262144\"}\n- op: replace\n  path: /cluster/clusterName\n  value: j\n",
    );
    let m = machine_config(&cp(&[&p]).unwrap());
    assert_eq!(m["machine"]["sysctls"]["vm.max_map_count"], "262144");
    assert_eq!(m["cluster"]["clusterName"], "j");
    let bad = json("[{\"op\": \"remove\", \"path\": \"/machine/nope\"}]");
    let e = cp(&[&bad]).unwrap_err().to_string();
    assert!(
        e.contains("operation 0 (remove at /machine/nope) failed"),
        "{e}"
    );
    let e = Patch::parse("p", None, Some("{op: frobnicate}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("RFC 6902"), "{e}");
}

#[test]
fn a_json_patch_may_not_read_secrets() {
    for ops in [
        "[{op: test, path: /machine/token, value: x}]",
        "[{op: test, path: /machine/ca, value: {}}]",
        "[{op: test, path: /cluster, value: {}}]",
        "[{op: copy, from: /cluster/secret, path: /machine/network/hostname}]",
        "[{op: move, from: /cluster/ca/key, path: /machine/x}]",
    ] {
        let e = cp(&[&json(ops)]).unwrap_err().to_string();
        assert!(e.contains("reads the cluster's secrets"), "{ops}: {e}");
    }
    // Reading something else is fine.
    cp(&[&json(
        "[{op: test, path: /machine/type, value: controlplane}]",
    )])
    .unwrap();
}

#[test]
fn the_identity_goes_where_the_configuration_keeps_it() {
    let r = render::render(
        &base(),
        Role::ControlPlane,
        &[],
        Identity {
            hostname: Some("cp-1"),
            install_disk: Some("/dev/nvme0n1"),
        },
    )
    .unwrap();
    let docs = yaml(&r);
    let hn = docs.iter().find(|d| d["kind"] == "HostnameConfig").unwrap();
    assert_eq!(hn["hostname"], "cp-1");
    assert_eq!(hn["auto"], "off");
    let m = machine_config(&r);
    assert!(
        m["machine"]["network"].get("hostname").is_none(),
        "not in v1alpha1 next to HostnameConfig"
    );
    assert_eq!(m["machine"]["install"]["disk"], "/dev/nvme0n1");
    // Without a HostnameConfig document, machine.network.hostname.
    let b = Base::parse(MINIMAL, &MINIMAL.replace("controlplane", "worker"), true).unwrap();
    let r = render::render(
        &b,
        Role::Worker,
        &[],
        Identity {
            hostname: Some("w-1"),
            install_disk: None,
        },
    )
    .unwrap();
    assert_eq!(machine_config(&r)["machine"]["network"]["hostname"], "w-1");
}

#[test]
fn validation_names_what_is_wrong() {
    let e = cp(&[&strategic("apiVersion: v1alpha1\nkind: KubeletConfg\n")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`KubeletConfg` is not a Talos configuration document kind"),
        "{e}"
    );
    let e = cp(&[&strategic("apiVersion: v1alpha1\nkind: kubeletconfig\n")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("did you mean `KubeletConfig`"), "{e}");
    let e = cp(&[&strategic("version: v1alpha1\nmachine:\n  type: worker\n")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("machine.type is `worker` but the machine's role is `controlplane`"),
        "{e}"
    );
    let e = cp(&[&strategic("apiVersion: v1alpha1\nkind: UserVolumeConfig\n")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "document UserVolumeConfig: name is required (`name` in a UserVolumeConfig document"
        ),
        "{e}"
    );
    let e = cp(&[&json("[{op: remove, path: /machine/token}]")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("lacks the required `machine.token`"), "{e}");
    let e = cp(&[&strategic("version: v1alpha2\n")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("document"), "{e}");
    let e = Patch::parse("p", Some("- a\n- b\n"), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a mapping"), "{e}");
    let e = Patch::parse("p", Some("a: [\n"), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not valid YAML") && e.contains("line"), "{e}");
}

#[test]
fn hostile_patches_are_bounded() {
    // Deep nesting: refused before the parser.
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let e = Patch::parse("p", Some(&deep), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nested more than"), "{e}");
    // Too big.
    let big = format!(
        "version: v1alpha1\nmachine:\n  x: \"{}\"\n",
        "a".repeat(render::MAX_TEXT_BYTES)
    );
    let e = Patch::parse("p", Some(&big), None).unwrap_err().to_string();
    assert!(e.contains("bytes, more than"), "{e}");
    // Too many documents.
    let many = "version: v1alpha1\n---\n".repeat(render::MAX_DOCUMENTS + 1);
    assert!(
        Patch::parse("p", Some(&many), None)
            .unwrap_err()
            .to_string()
            .contains("YAML documents")
    );
    // A YAML bomb (billion laughs): refused or bounded, never expanded.
    let mut bomb = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 0..9u8 {
        let (p, n) = ((b'a' + i) as char, (b'b' + i) as char);
        bomb.push_str(&format!(
            "{n}: &{n} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
        ));
    }
    let started = std::time::Instant::now();
    let r = Patch::parse("p", Some(&bomb), None);
    assert!(r.is_err(), "the bomb was expanded");
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    // Copies doubling the document: stopped at the bound.
    let mut ops = String::from("[{op: add, path: /machine/x, value: [[1,2,3,4,5,6,7,8]]}");
    for _ in 0..40 {
        ops.push_str(", {op: copy, from: /machine/x, path: /machine/x/-}");
    }
    ops.push(']');
    let e = cp(&[&json(&ops)]).unwrap_err().to_string();
    assert!(e.contains("more than") && e.contains("values"), "{e}");
    // Too many operations.
    let ops = format!(
        "[{}]",
        vec!["{op: add, path: /machine/y, value: 1}"; render::MAX_JSON_OPS + 1].join(",")
    );
    assert!(
        Patch::parse("p", None, Some(&ops))
            .unwrap_err()
            .to_string()
            .contains("operations, more than")
    );
}

#[test]
fn base_errors_show_no_content() {
    let bad = format!("{CP}\nmachine: [SECRET-BASE-oops\n");
    let e = Base::parse(&bad, WORKER, true).unwrap_err().to_string();
    assert!(!e.contains("SECRET-BASE"), "{e}");
    assert!(e.contains("controlplane.yaml") && e.contains("line"), "{e}");
}

#[test]
fn the_redacted_base_holds_no_secret_and_keeps_its_digest() {
    let real = base();
    let red = real.redacted();
    let (c, w) = red.texts().unwrap();
    assert!(
        !c.contains("SECRET-BASE") && !w.contains("SECRET-BASE"),
        "{c}"
    );
    assert!(c.contains(render::PLACEHOLDER));
    assert_eq!(red.digest, real.digest);
    // Read back (as the webhook does) it is the same base.
    let back = Base::parse(&c, &w, false).unwrap();
    assert_eq!(back.controlplane, red.controlplane);
    // Every string left is one of the base's non-secret values.
    assert!(c.contains("https://10.0.0.10:6443") && c.contains("kube-apiserver:v1.35.0"));
}

fn outcome(base: &Base, role: Role, patches: &[&Patch]) -> Result<(), String> {
    render::render(
        base,
        role,
        patches,
        Identity {
            hostname: Some("m-1"),
            install_disk: Some("/dev/vda"),
        },
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

#[test]
fn the_redacted_render_fails_exactly_when_the_real_one_does_on_the_conflict_table() {
    let real = base();
    let red = real.redacted();
    for c in CONFLICTS {
        let mut v1 = nest(c.path, conflict_leaf(c));
        v1["version"] = "v1alpha1".into();
        let doc = conflict_doc(c);
        let a = strategic(&serde_json::to_string(&v1).unwrap());
        let b = strategic(&serde_json::to_string(&doc).unwrap());
        for role in [Role::ControlPlane, Role::Worker] {
            for ps in [vec![&a], vec![&b], vec![&a, &b]] {
                let r = outcome(&real, role, &ps);
                assert_eq!(
                    r,
                    outcome(&red, role, &ps),
                    "{} / {}",
                    c.kind,
                    c.path.join(".")
                );
            }
        }
    }
}

/// Fragments of patches, some reading or selecting on secrets, some breaking the render.
fn fragment() -> impl Strategy<Value = Patch> {
    let strategic_parts = prop::sample::select(vec![
        "version: v1alpha1\ncluster:\n  apiServer:\n    image: x\n",
        "version: v1alpha1\nmachine:\n  token: SECRET-BASE-machine-token.0123456789abcdef\n",
        "version: v1alpha1\nmachine:\n  token:\n    $patch: delete\n",
        "version: v1alpha1\nmachine:\n  ca:\n    key:\n      $patch: delete\n",
        "version: v1alpha1\nmachine:\n  acceptedCAs:\n    - crt: SECRET-BASE-machine-ca-crt\n      $patch: delete\n",
        "version: v1alpha1\nmachine:\n  acceptedCAs:\n    - crt: other\n",
        "version: v1alpha1\ncluster:\n  ca: {crt: x}\n",
        "version: v1alpha1\ncluster:\n  ca: x\n",
        "version: v1alpha1\nmachine:\n  token: [a]\n",
        "apiVersion: v1alpha1\nkind: KubeAPIServerConfig\n$patch: delete\n",
        "apiVersion: v1alpha1\nkind: KubeAPIServerCAConfig\n",
        "apiVersion: v1alpha1\nkind: KubeletConfig\n",
        "apiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete\n",
        "version: v1alpha1\nmachine:\n  network:\n    hostname: h\n",
        "version: v1alpha1\nmachine:\n  type: worker\n",
        "version: v1alpha1\nmachine:\n  kubelet:\n    $patch: delete\n",
        "version: v1alpha1\nmachine:\n  nodeLabels: {a: b}\n",
        "apiVersion: v1alpha1\nkind: KubeNodeConfig\n",
    ]);
    let json_parts = prop::sample::select(vec![
        "[{op: test, path: /machine/token, value: SECRET-BASE-machine-token.0123456789abcdef}]",
        "[{op: test, path: /machine/token, value: ichor-redacted}]",
        "[{op: test, path: /cluster/clusterName, value: demo}]",
        "[{op: copy, from: /cluster/token, path: /machine/network/hostname}]",
        "[{op: copy, from: /cluster/clusterName, path: /machine/type}]",
        "[{op: remove, path: /cluster/secret}]",
        "[{op: replace, path: /machine/ca/crt, value: x}]",
        "[{op: remove, path: /cluster/apiServer}]",
        "[{op: add, path: /cluster/apiServer, value: {}}]",
        "[{op: move, from: /machine/install, path: /machine/installed}]",
    ]);
    prop_oneof![
        strategic_parts.prop_map(strategic),
        json_parts.prop_map(json),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn the_redacted_render_fails_exactly_when_the_real_one_does_on_generated_patches(
        patches in prop::collection::vec(fragment(), 0..4),
        worker in any::<bool>(),
    ) {
        let real = base();
        let red = real.redacted();
        let role = if worker { Role::Worker } else { Role::ControlPlane };
        let refs: Vec<&Patch> = patches.iter().collect();
        let r = outcome(&real, role, &refs);
        prop_assert_eq!(&r, &outcome(&red, role, &refs));
        if let Err(e) = &r {
            prop_assert!(!e.contains("SECRET-BASE"), "a render error carries a secret: {}", e);
        }
    }
}

/// The install disk of a TalosMachine (`spec.installDisk`) is its identity: set after every
/// patch, in the controller's render and the webhook's dry render alike (one function).
#[test]
fn a_machines_install_disk_is_its_identity() {
    use ichor_rules::runtime::configpatch::{parse_patch, render_machine};
    use ichor_rules::runtime::objects::{TalosConfigPatch, TalosMachine};
    let m: TalosMachine = serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "cp-1", "namespace": "infra"},
        "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true,
                 "hostname": "cp-1", "installDisk": "/dev/nvme0n1"}
    }))
    .unwrap();
    let p: TalosConfigPatch = serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosConfigPatch",
        "metadata": {"name": "disk", "namespace": "infra"},
        "spec": {"clusterRef": {"name": "prod"}, "selector": {},
                 "patches": {"strategic": "version: v1alpha1\nmachine:\n  install:\n    disk: /dev/sdb\n"}}
    }))
    .unwrap();
    let parsed = parse_patch(&p);
    let r = render_machine(&base(), &m, &[(&p, &parsed)]).unwrap();
    let v1 = &yaml(&r)[0];
    assert_eq!(v1["machine"]["install"]["disk"], "/dev/nvme0n1");
    // Without it, the patch's (else the base's).
    let mut plain = m.clone();
    plain.spec.install_disk = None;
    let r = render_machine(&base(), &plain, &[(&p, &parsed)]).unwrap();
    assert_eq!(yaml(&r)[0]["machine"]["install"]["disk"], "/dev/sdb");
    let r = render_machine(&base(), &plain, &[]).unwrap();
    assert_eq!(yaml(&r)[0]["machine"]["install"]["disk"], "/dev/sda");
}

/// Sets `path` in `doc` to `v`, making the maps on the way (a value in the way replaced).
fn set_at(doc: &mut serde_json::Value, path: &[&str], v: serde_json::Value) {
    let (last, init) = path.split_last().unwrap();
    let mut at = doc;
    for p in init {
        if !at.get(*p).is_some_and(serde_json::Value::is_object) {
            at[*p] = serde_json::json!({});
        }
        at = at.get_mut(*p).unwrap();
    }
    at[*last] = v;
}

fn remove_at(doc: &mut serde_json::Value, path: &[&str]) {
    let (last, init) = path.split_last().unwrap();
    let mut at = &mut *doc;
    for p in init {
        match at.get_mut(*p) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(m) = at.as_object_mut() {
        m.remove(*last);
    }
}

/// A document of `kind` holding every field the table requires of it (each entry's first
/// path).
fn complete(kind: &str) -> serde_json::Value {
    let mut doc = serde_json::json!({"apiVersion": "v1alpha1", "kind": kind});
    for r in REQUIRED_FIELDS.iter().filter(|r| r.kind == kind) {
        if !r.paths.iter().any(|p| {
            let mut v = &doc;
            p.iter().all(|k| match v.get(*k) {
                Some(next) => {
                    v = next;
                    true
                }
                None => false,
            }) && r.present.holds(v)
        }) {
            set_at(&mut doc, r.paths[0], r.present.example());
        }
    }
    doc
}

/// The control plane's base with `doc` in place of its documents of the same kind.
fn base_with(doc: &serde_json::Value) -> String {
    let kind = doc["kind"].as_str().unwrap();
    let mut docs = render::parse_documents(CP, "controlplane.yaml", true).unwrap();
    docs.retain(|d| d.get("kind").and_then(|k| k.as_str()) != Some(kind));
    docs.push(doc.as_object().unwrap().clone());
    render::to_yaml(&docs).unwrap()
}

/// The required-field error Talos' checks (as the stand-in and the render run them) give
/// a configuration holding `doc`.
fn required_error(doc: &serde_json::Value) -> Option<String> {
    let e = render::validate_text(&base_with(doc)).err()?.to_string();
    e.contains("Talos refuses it without").then_some(e)
}

fn row(r: &Required) -> String {
    format!("{} {} ({})", r.kind, r.paths_text(), r.message)
}

#[test]
fn every_required_field_is_refused_with_talos_message_when_missing() {
    for r in REQUIRED_FIELDS {
        assert!(
            render::KNOWN_KINDS.contains(&r.kind),
            "{}: not a known kind",
            row(r)
        );
        let full = complete(r.kind);
        assert_eq!(
            required_error(&full),
            None,
            "{}: the complete document",
            row(r)
        );
        // Without it (every alternative): refused with Talos' words and the path.
        let mut without = full.clone();
        for p in r.paths {
            remove_at(&mut without, p);
        }
        let e = required_error(&without).unwrap_or_else(|| panic!("{}: accepted without", row(r)));
        assert!(
            e.contains(r.message) && e.contains(&r.paths_text()) && e.contains(r.kind),
            "{}: {e}",
            row(r)
        );
        // Present but empty or wrong (a string field as "", a list as []): refused too.
        let wrong = match r.present {
            Present::Text | Present::OneOf(_) => Some(serde_json::json!("")),
            Present::List => Some(serde_json::json!([])),
            Present::Map => Some(serde_json::json!({})),
            Present::NonZero | Present::Range(..) => Some(serde_json::json!(0)),
            Present::Value => None,
        };
        if let Some(wrong) = wrong {
            let mut doc = without.clone();
            for p in r.paths {
                set_at(&mut doc, p, wrong.clone());
            }
            let e = required_error(&doc).unwrap_or_else(|| panic!("{}: accepted empty", row(r)));
            assert!(e.contains(r.message), "{}: {e}", row(r));
        }
        // Any one alternative is enough.
        for p in r.paths.iter().filter(|_| r.paths.len() > 1) {
            let mut doc = full.clone();
            for q in r.paths.iter().filter(|q| *q != p) {
                remove_at(&mut doc, q);
            }
            set_at(&mut doc, p, r.present.example());
            assert_eq!(
                required_error(&doc),
                None,
                "{}: with {}",
                row(r),
                p.join(".")
            );
        }
        // Waived where the same document says so.
        if let Some((path, values)) = r.unless {
            for v in values {
                let mut doc = without.clone();
                let v = match v {
                    render::required::Scalar::Bool(b) => serde_json::json!(b),
                    render::required::Scalar::Str(s) => serde_json::json!(s),
                };
                set_at(&mut doc, path, v.clone());
                assert_eq!(required_error(&doc), None, "{}: with {v}", row(r));
            }
        }
    }
}

#[test]
fn a_named_document_missing_a_field_is_named_as_talos_names_it() {
    let e = cp(&[&strategic(
        "apiVersion: v1alpha1\nkind: VLANConfig\nname: eth0.10\nvlanID: 10\n",
    )])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("document VLANConfig/eth0.10: parent must be specified (`parent`"),
        "{e}"
    );
}

#[test]
fn the_redacted_render_fails_exactly_when_the_real_one_does_on_required_fields() {
    // Each required field missing or empty in the base itself (secrets among them: an
    // empty private key stays empty when redacted), and present.
    for r in REQUIRED_FIELDS {
        let full = complete(r.kind);
        let mut empty = full.clone();
        for p in r.paths {
            set_at(&mut empty, p, serde_json::json!(""));
        }
        let mut without = full.clone();
        for p in r.paths {
            remove_at(&mut without, p);
        }
        for doc in [&full, &empty, &without] {
            let real = Base::parse(&base_with(doc), WORKER, true).unwrap();
            let red = real.redacted();
            assert_eq!(
                outcome(&real, Role::ControlPlane, &[]),
                outcome(&red, Role::ControlPlane, &[]),
                "{}: {doc}",
                row(r)
            );
        }
    }
}

#[test]
fn the_newer_documents_secrets_are_redacted() {
    let docs = "apiVersion: v1alpha1\nkind: WireguardConfig\nname: wg0\nprivateKey: SECRET-BASE-wg\n\
        peers:\n  - publicKey: pub\n    presharedKey: SECRET-BASE-psk\n---\n\
        apiVersion: v1alpha1\nkind: HCloudVIPConfig\nname: 10.0.0.1\nlink: eth0\napiToken: SECRET-BASE-hc\n---\n\
        apiVersion: v1alpha1\nkind: DiscoveryIdentityConfig\nclusterID: SECRET-BASE-id\nclusterSecret: SECRET-BASE-cs\n---\n\
        apiVersion: v1alpha1\nkind: RegistryAuthConfig\nname: r.io\nusername: u\npassword: SECRET-BASE-pw\nauth: SECRET-BASE-auth\nidentityToken: SECRET-BASE-it\n---\n\
        apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://s.example/?jointoken=SECRET-BASE-jt\n";
    let text = format!("{CP}\n---\n{docs}");
    let real = Base::parse(&text, WORKER, true).unwrap();
    let (c, _) = real.redacted().texts().unwrap();
    assert!(!c.contains("SECRET-BASE"), "{c}");
    assert!(
        c.contains("publicKey: pub"),
        "what is not secret stays: {c}"
    );
}
