//! The Helm chart, rendered by a real helm: CRDs and rules that do not drift from the
//! project's, RBAC that is exactly `runtime::access::REQUIRED`, a hardened Deployment whose
//! arguments the binary accepts, the webhook configuration the server routes, and
//! certificates that actually serve the Service's name.
//!
//! helm comes from `ICHOR_HELM` (scripts/test.sh sets it after
//! `scripts/chart-tools.sh install`), else from that script's cache folder. Without it the
//! tests fail, saying how to install it: they never skip.

use ichor_rules::ruleset::{load, read_sources};
use ichor_rules::runtime::access::{Access, REQUIRED, Scope, WEBHOOK};
use ichor_rules::runtime::tls::ReloadingCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const CHART: &str = "charts/ichor-rules";
const RELEASE: &str = "guard";
const NAMESPACE: &str = "ichor-system";
/// The resource name prefix for RELEASE (`<release>-<chart>`).
const FULLNAME: &str = "guard-ichor-rules";

/// Flags the controller adds to `serve`. The chart passes them already; until the binary
/// knows every one of them, it must know none (they arrive together).
const CONTROLLER_FLAGS: &[&str] = &[
    "--identity",
    "--lease-namespace",
    "--talosconfig",
    "--no-controller",
];

fn helm() -> PathBuf {
    if let Some(p) = std::env::var_os("ICHOR_HELM") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "ICHOR_HELM={} is not a file", p.display());
        return p;
    }
    let dir = match (
        std::env::var_os("ICHOR_TOOLS_DIR"),
        std::env::var_os("HOME"),
    ) {
        (Some(d), _) => PathBuf::from(d),
        (None, Some(h)) => PathBuf::from(h).join(".cache/ichor-rules/chart-tools"),
        (None, None) => PathBuf::from("target/chart-tools"),
    };
    let p = dir.join("bin/helm");
    assert!(
        p.is_file(),
        "helm is not installed (no ICHOR_HELM, nothing at {}): run `bash scripts/chart-tools.sh install`, \
         or `bash scripts/test.sh`, which installs it and sets ICHOR_HELM",
        p.display()
    );
    p
}

/// `helm template` with extra arguments; the output, or helm's error text.
fn template(args: &[&str]) -> Result<String, String> {
    template_in(NAMESPACE, args)
}

/// `helm template` of RELEASE into `namespace`.
fn template_in(namespace: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm())
        .args(["template", RELEASE, CHART, "--namespace", namespace])
        .args(args)
        .output()
        .expect("helm runs");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("utf-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn parse(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).expect("yaml");
            serde_json::to_value(v).expect("json")
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The chart's objects rendered with `args`.
fn render(args: &[&str]) -> Vec<Value> {
    parse(&template(args).unwrap_or_else(|e| panic!("helm template {args:?}: {e}")))
}

fn values(name: &str) -> String {
    format!("{CHART}/ci/{name}-values.yaml")
}

/// Default values, then every value set the CI renders.
fn scenarios() -> Vec<(String, Vec<Value>)> {
    let mut out = vec![("default".to_string(), render(&[]))];
    let mut files: Vec<PathBuf> = std::fs::read_dir(format!("{CHART}/ci"))
        .expect("the chart has ci/ value sets")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 4, "ci/ holds the non-default value sets");
    for f in files {
        let path = f.to_string_lossy().into_owned();
        out.push((path.clone(), render(&["--values", &path])));
    }
    out
}

fn all<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let found = all(objs, kind);
    assert_eq!(found.len(), 1, "exactly one {kind}");
    found[0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("not a string: {s}"))
                .to_string()
        })
        .collect()
}

fn container(objs: &[Value]) -> &Value {
    let d = one(objs, "Deployment");
    let cs = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(cs.len(), 1);
    &cs[0]
}

fn args(objs: &[Value]) -> Vec<String> {
    strings(&container(objs)["args"])
}

/// The value of `--flag=value` in the container's arguments.
fn flag(objs: &[Value], name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    args(objs)
        .iter()
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
}

fn mount_path(objs: &[Value], volume: &str) -> Option<String> {
    container(objs)["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == volume)
        .map(|m| m["mountPath"].as_str().expect("path").to_string())
}

fn volume<'a>(objs: &'a [Value], name: &str) -> Option<&'a Value> {
    one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == name)
}

fn b64(s: &str) -> Vec<u8> {
    fn val(c: u8) -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    }
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= val(*c) << (18 - 6 * i);
        }
        let take = chunk.len() * 6 / 8;
        out.extend_from_slice(&n.to_be_bytes()[1..=take]);
    }
    out
}

// ---------------------------------------------------------------------------------------
// What the chart carries must not drift from the project.

#[test]
fn the_charts_crds_are_exactly_ichor_rules_crds() {
    let out = Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .arg("crds")
        .output()
        .expect("runs");
    assert!(out.status.success());
    let generated = String::from_utf8(out.stdout).expect("utf-8");
    let shipped = std::fs::read_to_string(format!("{CHART}/crds/ichor-rules.yaml"))
        .expect("the chart ships crds/ichor-rules.yaml");
    assert!(
        shipped == generated,
        "the chart's CRDs drifted from the code; regenerate them:\n  \
         cargo run -q -- crds > {CHART}/crds/ichor-rules.yaml"
    );
    // helm installs them from crds/ (never templated, never deleted with the release).
    let with = render(&["--include-crds"]);
    let crds = all(&with, "CustomResourceDefinition");
    let names: BTreeSet<&str> = crds
        .iter()
        .map(|c| c["metadata"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "talosclusters.ichor.maesh.dev",
            "talosmachines.ichor.maesh.dev",
            "talosoperations.ichor.maesh.dev"
        ])
    );
    assert!(all(&render(&[]), "CustomResourceDefinition").is_empty());
}

#[test]
fn the_charts_rules_are_a_copy_of_rules() {
    let project = read_sources(&[PathBuf::from("rules")]).expect("rules/ loads");
    let chart = read_sources(&[PathBuf::from(format!("{CHART}/rules"))]).expect("chart rules");
    let names = |fs: &[ichor_rules::diagnostics::SourceFile]| -> Vec<String> {
        fs.iter()
            .map(|f| {
                f.path
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    };
    assert_eq!(names(&chart), names(&project), "the same files");
    for (c, p) in chart.iter().zip(&project) {
        assert!(
            c.text == p.text,
            "{} drifted from {}; copy it: cp rules/*.rules {CHART}/rules/",
            c.path.display(),
            p.path.display()
        );
    }
}

// ---------------------------------------------------------------------------------------
// RBAC: exactly REQUIRED with the controller, exactly WEBHOOK without it.

type Grant = (Scope, String, String, String);

fn grants(rules: &Value, scope: Scope) -> Vec<Grant> {
    let mut out = Vec::new();
    for rule in rules.as_array().expect("rules") {
        let keys: BTreeSet<&str> = rule
            .as_object()
            .expect("rule")
            .keys()
            .map(String::as_str)
            .collect();
        assert!(
            keys.is_subset(&BTreeSet::from(["apiGroups", "resources", "verbs"])),
            "unexpected rule fields {keys:?} (no nonResourceURLs, no resourceNames)"
        );
        for g in strings(&rule["apiGroups"]) {
            for r in strings(&rule["resources"]) {
                for v in strings(&rule["verbs"]) {
                    for s in [&g, &r, &v] {
                        assert!(!s.contains('*'), "wildcard in {rule}");
                    }
                    out.push((scope, g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

fn required() -> BTreeSet<Grant> {
    grant_set(REQUIRED)
}

fn grant_set(list: &[Access]) -> BTreeSet<Grant> {
    list.iter()
        .flat_map(|a| {
            a.verbs.iter().map(move |v| {
                (
                    a.scope,
                    a.api_group.to_string(),
                    a.resource.to_string(),
                    v.to_string(),
                )
            })
        })
        .collect()
}

/// Whether the rendering runs the controller (no `--no-controller`).
fn runs_controller(objs: &[Value]) -> bool {
    !args(objs).iter().any(|a| a == "--no-controller")
}

/// The ClusterRole's and (if any) the Role's grants; asserts none is granted twice.
fn granted(name: &str, objs: &[Value]) -> BTreeSet<Grant> {
    let mut got = grants(&one(objs, "ClusterRole")["rules"], Scope::Cluster);
    for role in all(objs, "Role") {
        assert_eq!(role["metadata"]["namespace"], NAMESPACE, "{name}");
        got.extend(grants(&role["rules"], Scope::LeaseNamespace));
    }
    let set: BTreeSet<Grant> = got.iter().cloned().collect();
    assert_eq!(got.len(), set.len(), "{name}: a verb granted twice");
    set
}

#[test]
fn rbac_grants_exactly_the_required_api_calls() {
    let mut modes = BTreeSet::new();
    for (name, objs) in scenarios() {
        let controller = runs_controller(&objs);
        modes.insert(controller);
        let (want, list) = if controller {
            (required(), "REQUIRED")
        } else {
            (grant_set(WEBHOOK), "WEBHOOK")
        };
        let got_set = granted(&name, &objs);
        let extra: Vec<_> = got_set.difference(&want).collect();
        let missing: Vec<_> = want.difference(&got_set).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "{name}: the chart's RBAC differs from runtime::access::{list}\n  granted but not required: {extra:?}\n  required but not granted: {missing:?}"
        );

        // Each role is bound to the pods' ServiceAccount, in the release namespace.
        let sa = one(&objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"].clone();
        let cluster_role = one(&objs, "ClusterRole");
        let mut pairs = vec![("ClusterRoleBinding", cluster_role)];
        if controller {
            pairs.push(("RoleBinding", one(&objs, "Role")));
        }
        for (binding, target) in pairs {
            let b = one(&objs, binding);
            assert_eq!(b["roleRef"]["kind"], target["kind"], "{name}");
            assert_eq!(b["roleRef"]["name"], target["metadata"]["name"], "{name}");
            let subjects = b["subjects"].as_array().expect("subjects");
            assert_eq!(subjects.len(), 1, "{name}");
            assert_eq!(subjects[0]["kind"], "ServiceAccount");
            assert_eq!(subjects[0]["name"], sa, "{name}");
            assert_eq!(subjects[0]["namespace"], NAMESPACE, "{name}");
        }
        match all(&objs, "ServiceAccount").as_slice() {
            [] => assert_eq!(sa, "platform-guard", "{name}: an existing ServiceAccount"),
            [s] => assert_eq!(s["metadata"]["name"], sa, "{name}"),
            more => panic!("{name}: {} ServiceAccounts", more.len()),
        }
    }
    assert_eq!(
        modes,
        BTreeSet::from([false, true]),
        "the value sets render both the controller on and off"
    );
}

#[test]
fn no_other_role_or_binding_is_rendered() {
    for (name, objs) in scenarios() {
        let controller = runs_controller(&objs);
        for kind in ["ClusterRole", "ClusterRoleBinding"] {
            assert_eq!(all(&objs, kind).len(), 1, "{name}: {kind}");
        }
        // The leader-election Role only where a controller campaigns.
        for kind in ["Role", "RoleBinding"] {
            assert_eq!(
                all(&objs, kind).len(),
                usize::from(controller),
                "{name}: {kind}"
            );
        }
    }
}

#[test]
fn without_the_controller_only_the_webhooks_live_reads_are_granted() {
    let custom = values("custom");
    for a in [
        vec!["--set", "controller.enabled=false"],
        vec![
            "--values",
            custom.as_str(),
            "--set",
            "controller.enabled=false",
        ],
    ] {
        let objs = render(&a);
        assert!(!runs_controller(&objs), "{a:?}");
        assert!(all(&objs, "Role").is_empty(), "{a:?}: no leader election");
        assert!(all(&objs, "RoleBinding").is_empty(), "{a:?}");
        let got = granted("webhook only", &objs);
        assert_eq!(got, grant_set(WEBHOOK), "{a:?}");
        // Only reads, and none of the controller's objects.
        for (_, group, resource, verb) in &got {
            assert_eq!(group, "ichor.maesh.dev", "{resource}");
            assert!(
                ["get", "list"].contains(&verb.as_str()),
                "{resource} {verb}"
            );
        }
    }
    // With the controller on, the same release grants every controller call too.
    let objs = render(&[]);
    assert!(runs_controller(&objs));
    assert_eq!(granted("default", &objs), required());
    assert!(required().is_superset(&grant_set(WEBHOOK)));
    assert!(required().len() > grant_set(WEBHOOK).len());
}

// ---------------------------------------------------------------------------------------
// Cluster-scoped objects carry the namespace in their name.

const CLUSTER_SCOPED: &[&str] = &[
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
];

fn cluster_scoped_names(objs: &[Value]) -> BTreeSet<String> {
    CLUSTER_SCOPED
        .iter()
        .map(|k| {
            let o = one(objs, k);
            assert!(
                o["metadata"]["namespace"].is_null(),
                "{k} is cluster-scoped"
            );
            o["metadata"]["name"].as_str().expect("name").to_string()
        })
        .collect()
}

#[test]
fn the_same_release_in_two_namespaces_does_not_collide() {
    let a = parse(&template_in("team-a", &[]).expect("renders"));
    let b = parse(&template_in("team-b", &[]).expect("renders"));
    let (na, nb) = (cluster_scoped_names(&a), cluster_scoped_names(&b));
    assert_eq!(na, BTreeSet::from([format!("{FULLNAME}-team-a")]));
    assert_eq!(nb, BTreeSet::from([format!("{FULLNAME}-team-b")]));
    // The binding names the role it binds.
    for objs in [&a, &b] {
        assert_eq!(
            one(objs, "ClusterRoleBinding")["roleRef"]["name"],
            one(objs, "ClusterRole")["metadata"]["name"]
        );
    }
    // Long names are cut to 63 characters, and stay apart by a hash of the whole name.
    let long_ns = "a-namespace-with-a-rather-long-name-for-the-platform-team";
    let override_ = "fullnameOverride=ichor-rules-admission-webhook-for-the-fleet";
    let l1 = parse(&template_in(long_ns, &["--set", override_]).expect("renders"));
    let l2 = parse(&template_in(&format!("{long_ns}-2"), &["--set", override_]).expect("renders"));
    let (n1, n2) = (cluster_scoped_names(&l1), cluster_scoped_names(&l2));
    assert_eq!(n1.len(), 1);
    assert_ne!(n1, n2);
    for n in n1.iter().chain(&n2) {
        assert!(n.len() <= 63, "{n}: {} characters", n.len());
        assert!(!n.ends_with('-'), "{n}");
        assert!(
            n.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
            "{n}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The Deployment.

#[test]
fn every_rendering_is_hardened() {
    for (name, objs) in scenarios() {
        let pod = &one(&objs, "Deployment")["spec"]["template"]["spec"];
        let psc = &pod["securityContext"];
        assert_eq!(psc["runAsNonRoot"], true, "{name}");
        assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        if !psc["runAsUser"].is_null() {
            assert_ne!(psc["runAsUser"], 0, "{name}");
        }
        let c = container(&objs);
        let sc = &c["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{name}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(sc["privileged"], false, "{name}");
        assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{name}");
        assert!(sc["capabilities"]["add"].is_null(), "{name}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        for key in ["cpu", "memory"] {
            assert!(
                c["resources"]["requests"][key].is_string(),
                "{name}: request {key}"
            );
            assert!(
                c["resources"]["limits"][key].is_string(),
                "{name}: limit {key}"
            );
        }
        assert!(
            pod["hostNetwork"].is_null() && pod["hostPID"].is_null(),
            "{name}"
        );
        // Every volume but the scratch /tmp is mounted read-only.
        for m in c["volumeMounts"].as_array().expect("mounts") {
            if m["name"] != "tmp" {
                assert_eq!(m["readOnly"], true, "{name}: {m}");
            }
        }
    }
}

#[test]
fn two_replicas_spread_over_nodes_with_a_disruption_budget() {
    let objs = render(&[]);
    let d = one(&objs, "Deployment");
    assert_eq!(d["spec"]["replicas"], 2);
    let pod_labels = &d["spec"]["template"]["metadata"]["labels"];
    let selector = &d["spec"]["selector"]["matchLabels"];
    for (k, v) in selector.as_object().expect("selector") {
        assert_eq!(&pod_labels[k], v, "the selector selects the pods");
    }
    let terms = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(terms[0]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(&terms[0]["labelSelector"]["matchLabels"], selector);

    let pdb = one(&objs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], selector);
    // The rollout never takes both replicas down.
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 1);

    let custom = render(&["--values", &values("custom")]);
    let d = one(&custom, "Deployment");
    assert_eq!(d["spec"]["replicas"], 3);
    let pref = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        pref[0]["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    let existing = render(&["--values", &values("existing")]);
    assert!(all(&existing, "PodDisruptionBudget").is_empty());
}

#[test]
fn the_listen_address_follows_the_container_port() {
    let objs = render(&[]);
    assert_eq!(flag(&objs, "--listen").as_deref(), Some("0.0.0.0:8443"));
    assert_eq!(container(&objs)["ports"][0]["containerPort"], 8443);
    // Another containerPort moves the listen address with it.
    let objs = render(&["--set", "server.containerPort=9000"]);
    assert_eq!(flag(&objs, "--listen").as_deref(), Some("0.0.0.0:9000"));
    assert_eq!(container(&objs)["ports"][0]["containerPort"], 9000);
    // An explicit address on that port is kept (IPv6 here).
    let objs = render(&["--set", "server.listen=[::]:8443"]);
    assert_eq!(flag(&objs, "--listen").as_deref(), Some("[::]:8443"));
}

#[test]
fn a_terminating_pod_keeps_serving_before_it_gets_sigterm() {
    let sleep_of =
        |objs: &[Value]| container(objs)["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64();
    let grace_of = |objs: &[Value]| {
        one(objs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("terminationGracePeriodSeconds")
    };
    let objs = render(&[]);
    assert_eq!(sleep_of(&objs), Some(10), "the default preStop sleep");
    assert!(
        container(&objs)["lifecycle"]["preStop"]["exec"].is_null(),
        "the sleep action, no shell needed"
    );
    assert_eq!(grace_of(&objs), 30);
    // Every rendering leaves time after the sleep for the requests in flight.
    for (name, objs) in scenarios() {
        let sleep = sleep_of(&objs).unwrap_or(0);
        assert!(grace_of(&objs) > sleep, "{name}");
    }
    let objs = render(&["--set", "preStopSleepSeconds=20"]);
    assert_eq!(sleep_of(&objs), Some(20));
    // 0 means no hook at all (a sleep of 0 s is refused before Kubernetes 1.32).
    let objs = render(&["--set", "preStopSleepSeconds=0"]);
    assert!(container(&objs)["lifecycle"].is_null());
    // The sleep action needs Kubernetes 1.30: older clusters are told how to do without.
    let err = template(&["--kube-version", "1.29.5"]).expect_err("1.29 has no sleep action");
    assert!(
        err.contains("needs Kubernetes 1.30 or later") && err.contains("preStopSleepSeconds=0"),
        "{err}"
    );
    let objs = render(&["--kube-version", "1.29.5", "--set", "preStopSleepSeconds=0"]);
    assert!(container(&objs)["lifecycle"].is_null());
    render(&["--kube-version", "1.30.0"]);
}

#[test]
fn probes_use_the_https_port_the_server_listens_on() {
    for (name, objs) in scenarios() {
        let c = container(&objs);
        let port = &c["ports"][0];
        assert_eq!(port["name"], "https", "{name}");
        let container_port = port["containerPort"].as_u64().expect("containerPort");
        let listen = flag(&objs, "--listen").expect("--listen");
        let addr: std::net::SocketAddr = listen
            .parse()
            .unwrap_or_else(|e| panic!("{name}: --listen={listen}: {e}"));
        assert_eq!(
            u64::from(addr.port()),
            container_port,
            "{name}: --listen={listen}"
        );
        for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], path, "{name}");
            assert_eq!(get["scheme"], "HTTPS", "{name}");
            assert_eq!(get["port"], "https", "{name}");
        }
        let svc = one(&objs, "Service");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "https", "{name}");
        for (k, v) in svc["spec"]["selector"].as_object().expect("selector") {
            assert_eq!(
                &one(&objs, "Deployment")["spec"]["template"]["metadata"]["labels"][k],
                v,
                "{name}: the Service selects the pods"
            );
        }
    }
}

/// The long flags `ichor-rules serve --help` lists.
fn serve_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .args(["serve", "--help"])
        .output()
        .expect("runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.trim_end_matches(',').to_string())
        .collect()
}

#[test]
fn the_binary_accepts_every_argument_the_chart_passes() {
    let known = serve_flags();
    assert!(
        known.contains("--rules") && known.contains("--tls-cert"),
        "{known:?}"
    );
    let has_controller: Vec<&&str> = CONTROLLER_FLAGS
        .iter()
        .filter(|f| known.contains(**f))
        .collect();
    let controller_landed = !has_controller.is_empty();
    if controller_landed {
        assert_eq!(
            has_controller.len(),
            CONTROLLER_FLAGS.len(),
            "serve knows {has_controller:?} but not all of {CONTROLLER_FLAGS:?}"
        );
    } else {
        eprintln!(
            "note: `ichor-rules serve` does not have the controller flags {CONTROLLER_FLAGS:?} yet; \
             the chart passes them already"
        );
    }
    for (name, objs) in scenarios() {
        let a = args(&objs);
        assert_eq!(a[0], "serve", "{name}");
        for arg in &a[1..] {
            let flag = arg.split('=').next().expect("flag");
            assert!(flag.starts_with("--"), "{name}: {arg}");
            assert!(
                known.contains(flag) || (!controller_landed && CONTROLLER_FLAGS.contains(&flag)),
                "{name}: `ichor-rules serve` has no {flag}"
            );
        }
        let once: BTreeSet<&str> = a.iter().map(|x| x.split('=').next().unwrap_or(x)).collect();
        assert_eq!(once.len(), a.len(), "{name}: a flag given twice");
    }
}

#[test]
fn arguments_point_at_what_is_mounted() {
    for (name, objs) in scenarios() {
        let rules = mount_path(&objs, "rules").expect("rules mounted");
        assert_eq!(
            flag(&objs, "--rules").as_deref(),
            Some(rules.as_str()),
            "{name}"
        );
        let tls = mount_path(&objs, "tls").expect("tls mounted");
        assert_eq!(
            flag(&objs, "--tls-cert"),
            Some(format!("{tls}/tls.crt")),
            "{name}"
        );
        assert_eq!(
            flag(&objs, "--tls-key"),
            Some(format!("{tls}/tls.key")),
            "{name}"
        );
        assert_eq!(
            flag(&objs, "--identity").as_deref(),
            Some("$(POD_NAME)"),
            "{name}"
        );
        assert_eq!(
            flag(&objs, "--lease-namespace").as_deref(),
            Some("$(POD_NAMESPACE)"),
            "{name}"
        );
        let env = container(&objs)["env"].as_array().expect("env").clone();
        for (var, field) in [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
        ] {
            let e = env.iter().find(|e| e["name"] == var).expect("env var");
            assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], field, "{name}");
        }
        let log_format = flag(&objs, "--log-format").expect("--log-format");
        assert!(["json", "text"].contains(&log_format.as_str()), "{name}");
        for f in ["--read-timeout-ms", "--reload-interval-ms"] {
            let v = flag(&objs, f).expect("flag");
            assert!(v.parse::<u64>().is_ok_and(|n| n > 0), "{name}: {f}={v}");
        }
    }
}

#[test]
fn the_controller_switch_and_the_talosconfig() {
    let default = render(&[]);
    assert!(!args(&default).contains(&"--no-controller".to_string()));
    assert_eq!(flag(&default, "--talosconfig"), None);
    assert!(volume(&default, "talosconfig").is_none());
    assert!(mount_path(&default, "talosconfig").is_none());

    let custom = render(&["--values", &values("custom")]);
    assert!(args(&custom).contains(&"--no-controller".to_string()));
    let v = volume(&custom, "talosconfig").expect("talosconfig volume");
    assert_eq!(v["secret"]["secretName"], "talos-admin");
    assert_eq!(v["secret"]["items"][0]["key"], "config");
    let item = v["secret"]["items"][0]["path"].as_str().expect("path");
    let dir = mount_path(&custom, "talosconfig").expect("mounted");
    assert_eq!(
        flag(&custom, "--talosconfig"),
        Some(format!("{dir}/{item}")),
        "the flag names the mounted file"
    );
    assert_eq!(dir, "/etc/ichor-rules/talos");
}

// ---------------------------------------------------------------------------------------
// The webhook configuration.

#[test]
fn webhooks_match_the_seeds_operations_and_the_servers_routes() {
    let routes = std::fs::read_to_string("src/runtime/webhook.rs").expect("source");
    for (name, objs) in scenarios() {
        let vwc = one(&objs, "ValidatingWebhookConfiguration");
        let svc = one(&objs, "Service");
        let hooks = vwc["webhooks"].as_array().expect("webhooks");
        let mut seen = Vec::new();
        for h in hooks {
            assert_eq!(h["failurePolicy"], "Fail", "{name}");
            assert_eq!(h["sideEffects"], "None", "{name}");
            assert_eq!(strings(&h["admissionReviewVersions"]), ["v1"], "{name}");
            let t = h["timeoutSeconds"].as_u64().expect("timeoutSeconds");
            assert!((1..=30).contains(&t), "{name}");
            // The live read times out well before the API server gives up on us.
            let read_ms: u64 = flag(&objs, "--read-timeout-ms")
                .expect("flag")
                .parse()
                .expect("n");
            assert!(
                read_ms < t * 1000,
                "{name}: read timeout {read_ms} ms vs webhook {t} s"
            );
            let svc_ref = &h["clientConfig"]["service"];
            assert_eq!(svc_ref["name"], svc["metadata"]["name"], "{name}");
            assert_eq!(svc_ref["namespace"], NAMESPACE, "{name}");
            assert_eq!(svc_ref["port"], svc["spec"]["ports"][0]["port"], "{name}");
            let path = svc_ref["path"].as_str().expect("path");
            assert!(
                routes.contains(&format!(".route(\"{path}\", post(validate))")),
                "{name}: the server does not route {path}"
            );
            let rules = h["rules"].as_array().expect("rules");
            assert_eq!(rules.len(), 1);
            let r = &rules[0];
            assert_eq!(strings(&r["apiGroups"]), ["ichor.maesh.dev"]);
            assert_eq!(strings(&r["apiVersions"]), ["v1alpha1"]);
            assert_eq!(r["scope"], "Namespaced");
            let resources = strings(&r["resources"]);
            assert_eq!(resources.len(), 1);
            assert_eq!(path, format!("/validate/{}", resources[0]));
            let mut ops = strings(&r["operations"]);
            ops.sort();
            seen.push((resources[0].clone(), ops));
        }
        seen.sort();
        let ops = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            seen,
            vec![
                ("talosclusters".to_string(), ops(&["DELETE", "UPDATE"])),
                (
                    "talosmachines".to_string(),
                    ops(&["CREATE", "DELETE", "UPDATE"])
                ),
                ("talosoperations".to_string(), ops(&["CREATE", "UPDATE"])),
            ],
            "{name}"
        );
        let names: BTreeSet<&str> = hooks
            .iter()
            .map(|h| h["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names.len(), 3, "{name}: webhook names are unique");
    }
}

fn excludes_release_namespace(selector: &Value) -> bool {
    selector["matchExpressions"].as_array().is_some_and(|es| {
        es.iter().any(|e| {
            e["key"] == "kubernetes.io/metadata.name"
                && e["operator"] == "NotIn"
                && e["values"] == serde_json::json!([NAMESPACE])
        })
    })
}

#[test]
fn the_release_namespace_is_always_excluded_and_a_users_selector_is_kept() {
    for (name, objs) in scenarios() {
        for h in one(&objs, "ValidatingWebhookConfiguration")["webhooks"]
            .as_array()
            .expect("webhooks")
        {
            assert!(
                excludes_release_namespace(&h["namespaceSelector"]),
                "{name}: {h}"
            );
        }
    }
    let custom = render(&["--values", &values("custom")]);
    for h in one(&custom, "ValidatingWebhookConfiguration")["webhooks"]
        .as_array()
        .expect("webhooks")
    {
        let sel = &h["namespaceSelector"];
        assert_eq!(sel["matchLabels"]["ichor.maesh.dev/guarded"], "true");
        let exprs = sel["matchExpressions"].as_array().expect("expressions");
        assert_eq!(exprs.len(), 2);
        assert!(exprs.iter().any(|e| e["key"] == "environment"
            && e["operator"] == "In"
            && e["values"] == serde_json::json!(["prod", "staging"])));
        assert_eq!(h["timeoutSeconds"], 5);
    }
    // Even a user's own expression on the namespace name cannot drop the exclusion.
    let objs = render(&[
        "--set",
        "webhook.namespaceSelector.matchExpressions[0].key=kubernetes.io/metadata.name",
        "--set",
        "webhook.namespaceSelector.matchExpressions[0].operator=In",
        "--set",
        "webhook.namespaceSelector.matchExpressions[0].values[0]=ichor-system",
    ]);
    let h = &one(&objs, "ValidatingWebhookConfiguration")["webhooks"][0];
    assert!(excludes_release_namespace(&h["namespaceSelector"]));
}

// ---------------------------------------------------------------------------------------
// Certificates.

/// Completes a TLS handshake in memory between the server configuration the webhook
/// serves with and a client that trusts `ca` and dials `name`, as the API server does.
fn handshake(cert_pem: &[u8], key_pem: &[u8], ca_pem: &[u8], name: &str) -> Result<(), String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chart-tls-{name}"));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("tls.crt"), cert_pem).expect("write");
    std::fs::write(dir.join("tls.key"), key_pem).expect("write");
    let cert = Arc::new(
        ReloadingCert::new(dir.join("tls.crt"), dir.join("tls.key"))
            .map_err(|e| format!("the server cannot load the pair: {e}"))?,
    );
    let server_config = Arc::new(cert.server_config().map_err(|e| e.to_string())?);

    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let server_name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let mut client = rustls::ClientConnection::new(Arc::new(client_config), server_name)
        .map_err(|e| e.to_string())?;
    let mut server = rustls::ServerConnection::new(server_config).map_err(|e| e.to_string())?;
    for _ in 0..10 {
        let mut buf = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut buf).map_err(|e| e.to_string())?;
        }
        server
            .read_tls(&mut buf.as_slice())
            .map_err(|e| e.to_string())?;
        server
            .process_new_packets()
            .map_err(|e| format!("server: {e}"))?;
        let mut buf = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut buf).map_err(|e| e.to_string())?;
        }
        client
            .read_tls(&mut buf.as_slice())
            .map_err(|e| e.to_string())?;
        client
            .process_new_packets()
            .map_err(|e| format!("client: {e}"))?;
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
    }
    Err("the handshake did not finish".to_string())
}

#[test]
fn the_generated_certificate_serves_the_service_name_under_the_ca_bundle() {
    let objs = render(&[]);
    let secret = one(&objs, "Secret");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let tls_volume = volume(&objs, "tls").expect("tls volume");
    assert_eq!(
        tls_volume["secret"]["secretName"],
        secret["metadata"]["name"]
    );
    let data = &secret["data"];
    let field = |k: &str| b64(data[k].as_str().unwrap_or_else(|| panic!("{k}")));
    let (crt, key, ca) = (field("tls.crt"), field("tls.key"), field("ca.crt"));
    for h in one(&objs, "ValidatingWebhookConfiguration")["webhooks"]
        .as_array()
        .expect("webhooks")
    {
        assert_eq!(
            h["clientConfig"]["caBundle"], data["ca.crt"],
            "caBundle is the CA"
        );
    }
    let vwc = one(&objs, "ValidatingWebhookConfiguration");
    assert!(vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_null());
    // The API server dials <service>.<namespace>.svc.
    let svc = format!("{FULLNAME}.{NAMESPACE}.svc");
    handshake(&crt, &key, &ca, &svc).unwrap_or_else(|e| panic!("{svc}: {e}"));
    handshake(&crt, &key, &ca, &format!("{svc}.cluster.local")).expect("the FQDN");
    // The name check is real: another name, or another CA, fails.
    let other = handshake(&crt, &key, &ca, &format!("other.{NAMESPACE}.svc"))
        .expect_err("a name the certificate does not carry");
    assert!(other.contains("client"), "{other}");
    let fresh = render(&[]);
    let other_ca = b64(one(&fresh, "Secret")["data"]["ca.crt"]
        .as_str()
        .expect("ca"));
    assert_ne!(other_ca, ca, "each install generates its own CA");
    handshake(&crt, &key, &other_ca, &svc).expect_err("a CA that did not sign it");
}

/// The serving Certificate: the one whose Secret the pods mount.
fn serving_certificate(objs: &[Value]) -> &Value {
    let secret = &volume(objs, "tls").expect("tls volume")["secret"]["secretName"];
    let found: Vec<&Value> = all(objs, "Certificate")
        .into_iter()
        .filter(|c| &c["spec"]["secretName"] == secret)
        .collect();
    assert_eq!(found.len(), 1, "one Certificate writes the mounted Secret");
    found[0]
}

#[test]
fn cert_manager_issues_the_certificate_and_injects_the_ca() {
    for (values_name, own_issuer) in [
        ("cert-manager", true),
        ("cert-manager-issuer", false),
        ("long-names", true),
    ] {
        let objs = render(&["--values", &values(values_name)]);
        assert!(
            all(&objs, "Secret").is_empty(),
            "{values_name}: cert-manager writes it"
        );
        let cert = serving_certificate(&objs);
        assert_eq!(cert["apiVersion"], "cert-manager.io/v1");
        let cert_name = cert["metadata"]["name"].as_str().expect("name");
        assert_eq!(cert["metadata"]["namespace"], NAMESPACE);
        let spec = &cert["spec"];
        let tls_volume = volume(&objs, "tls").expect("tls volume");
        assert_eq!(
            spec["secretName"], tls_volume["secret"]["secretName"],
            "{values_name}"
        );
        let dns = strings(&spec["dnsNames"]);
        let svc = one(&objs, "Service")["metadata"]["name"]
            .as_str()
            .expect("svc")
            .to_string();
        assert!(dns.contains(&format!("{svc}.{NAMESPACE}.svc")), "{dns:?}");
        // The DNS names carry the names; a commonName (64 bytes at most) would not fit
        // a long release and namespace.
        assert!(spec["commonName"].is_null(), "{values_name}: {spec}");
        assert!(dns.iter().all(|d| d.len() <= 253), "{dns:?}");
        assert!(strings(&spec["usages"]).contains(&"server auth".to_string()));
        // PKCS#8, which rustls reads for every key type.
        assert_eq!(spec["privateKey"]["encoding"], "PKCS8");
        let vwc = one(&objs, "ValidatingWebhookConfiguration");
        assert_eq!(
            vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!("{NAMESPACE}/{cert_name}")
        );
        for h in vwc["webhooks"].as_array().expect("webhooks") {
            assert!(
                h["clientConfig"]["caBundle"].is_null(),
                "the cainjector fills it"
            );
        }
        let issuers = all(&objs, "Issuer");
        if own_issuer {
            assert_own_ca_chain(values_name, &objs, cert);
        } else {
            assert!(issuers.is_empty());
            assert_eq!(all(&objs, "Certificate").len(), 1, "only the serving one");
            assert_eq!(spec["privateKey"]["rotationPolicy"], "Always");
            assert_eq!(spec["issuerRef"]["name"], "cluster-ca");
            assert_eq!(spec["issuerRef"]["kind"], "ClusterIssuer");
            assert_eq!(spec["duration"], "2160h");
        }
        assert_eq!(spec["issuerRef"]["group"], "cert-manager.io");
    }
}

/// With no issuerRef: self-signed Issuer -> CA Certificate (its own Secret, long-lived,
/// key kept) -> CA Issuer -> serving Certificate. A renewal of the serving certificate
/// keeps the CA, so the injected caBundle stays valid.
fn assert_own_ca_chain(name: &str, objs: &[Value], serving: &Value) {
    let issuer = |n: &Value| -> &Value {
        let found: Vec<&Value> = all(objs, "Issuer")
            .into_iter()
            .filter(|i| &i["metadata"]["name"] == n)
            .collect();
        assert_eq!(found.len(), 1, "{name}: Issuer {n}");
        found[0]
    };
    assert_eq!(all(objs, "Issuer").len(), 2, "{name}");
    assert_eq!(all(objs, "Certificate").len(), 2, "{name}");
    for o in all(objs, "Issuer")
        .into_iter()
        .chain(all(objs, "Certificate"))
    {
        assert_eq!(o["apiVersion"], "cert-manager.io/v1", "{name}");
        assert_eq!(o["metadata"]["namespace"], NAMESPACE, "{name}");
    }
    // The serving certificate comes from a CA Issuer, never a self-signed one.
    let sref = &serving["spec"]["issuerRef"];
    assert_eq!(sref["kind"], "Issuer", "{name}");
    let ca_issuer = issuer(&sref["name"]);
    assert!(ca_issuer["spec"]["selfSigned"].is_null(), "{name}");
    let ca_secret = &ca_issuer["spec"]["ca"]["secretName"];
    assert!(ca_secret.is_string(), "{name}: a CA Issuer");
    assert_ne!(
        ca_secret, &serving["spec"]["secretName"],
        "{name}: the CA has its own Secret"
    );
    // That Secret is written by the CA Certificate.
    let ca: Vec<&Value> = all(objs, "Certificate")
        .into_iter()
        .filter(|c| &c["spec"]["secretName"] == ca_secret)
        .collect();
    assert_eq!(ca.len(), 1, "{name}");
    let ca = &ca[0]["spec"];
    assert_eq!(ca["isCA"], true, "{name}");
    let cn = ca["commonName"].as_str().expect("a CA has a subject");
    assert!(!cn.is_empty() && cn.len() <= 64, "{name}: {cn}");
    assert_eq!(ca["privateKey"]["rotationPolicy"], "Never", "{name}");
    let hours = |d: &Value| -> u64 {
        d.as_str()
            .and_then(|d| d.strip_suffix('h'))
            .and_then(|h| h.parse().ok())
            .unwrap_or_else(|| panic!("{name}: duration {d}"))
    };
    assert!(
        hours(&ca["duration"]) >= 5 * hours(&serving["spec"]["duration"]),
        "{name}: the CA outlives many serving certificates"
    );
    // ... and the CA Certificate is signed by the self-signed Issuer.
    assert_eq!(ca["issuerRef"]["kind"], "Issuer", "{name}");
    let root = issuer(&ca["issuerRef"]["name"]);
    assert!(root["spec"]["selfSigned"].is_object(), "{name}");
    assert_ne!(root["metadata"]["name"], ca_issuer["metadata"]["name"]);
    // The serving key may rotate: the CA does not change with it.
    assert_eq!(serving["spec"]["privateKey"]["rotationPolicy"], "Always");
}

// ---------------------------------------------------------------------------------------
// The rules ConfigMap.

/// Writes a ConfigMap's data into a folder and loads it as the pods do.
fn load_configmap(cm: &Value, name: &str) -> ichor_rules::ruleset::RuleSet {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chart-rules-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    for (k, v) in cm["data"].as_object().expect("data") {
        std::fs::write(dir.join(k), v.as_str().expect("text")).expect("write");
    }
    load(&[dir]).expect("loads")
}

#[test]
fn the_rules_configmap_carries_the_shipped_rules_and_they_check() {
    let objs = render(&[]);
    let cm = one(&objs, "ConfigMap");
    assert_eq!(
        volume(&objs, "rules").expect("rules volume")["configMap"]["name"],
        cm["metadata"]["name"]
    );
    let keys: Vec<&String> = cm["data"].as_object().expect("data").keys().collect();
    assert_eq!(
        keys,
        ["admission.rules", "invariants.rules", "removal.rules"]
    );
    for k in keys {
        let shipped = std::fs::read_to_string(Path::new("rules").join(k)).expect("rules/");
        assert_eq!(
            cm["data"][k],
            shipped.as_str(),
            "{k} is carried byte for byte"
        );
    }
    let set = load_configmap(cm, "default");
    let project = load(&[PathBuf::from("rules")]).expect("rules/");
    assert_eq!(set.errors(), 0);
    assert_eq!(
        set.table.expect("a table").row_count(),
        project.table.expect("a table").row_count()
    );
}

#[test]
fn own_rules_inline_or_from_an_existing_configmap() {
    let custom = render(&["--values", &values("custom")]);
    let cm = one(&custom, "ConfigMap");
    let keys: Vec<&String> = cm["data"].as_object().expect("data").keys().collect();
    assert_eq!(
        keys,
        ["site.rules"],
        "inline rules replace the shipped ones"
    );
    let set = load_configmap(cm, "inline");
    assert_eq!(set.errors(), 0, "the example inline rules check");
    assert!(set.table.is_some());

    let existing = render(&["--values", &values("existing")]);
    assert!(
        all(&existing, "ConfigMap").is_empty(),
        "no ConfigMap of ours"
    );
    assert_eq!(
        volume(&existing, "rules").expect("rules volume")["configMap"]["name"],
        "site-rules"
    );
}

// ---------------------------------------------------------------------------------------
// Values the chart refuses, with a message that says why.

#[test]
fn bad_values_fail_the_rendering_with_a_reason() {
    for (set, says) in [
        ("rules.inline.site\\.txt=x", "must end in .rules"),
        (
            "webhook.namespaceSelector.matchField=x",
            "only matchLabels and matchExpressions",
        ),
        (
            "podAntiAffinity=sometimes",
            "neither \"required\" nor \"preferred\"",
        ),
        (
            "serviceAccount.create=false",
            "serviceAccount.name must name an existing",
        ),
        (
            "webhook.timeoutSeconds=0",
            "webhook.timeoutSeconds: 0 is outside 1..30",
        ),
        (
            "webhook.timeoutSeconds=31",
            "webhook.timeoutSeconds: 31 is outside 1..30",
        ),
        (
            "server.readTimeoutMs=10000",
            "server.readTimeoutMs: 10000 must be below webhook.timeoutSeconds (10 s)",
        ),
        (
            "server.logFormat=yaml",
            "server.logFormat: \"yaml\" is neither \"text\" nor \"json\"",
        ),
        (
            "server.listen=0.0.0.0:9443",
            "server.listen: \"0.0.0.0:9443\" must listen on server.containerPort (8443)",
        ),
        (
            "server.containerPort=70000",
            "server.containerPort: 70000 is not a port",
        ),
        (
            "selfSignedCert.validityDays=0",
            "selfSignedCert.validityDays: 0 must be at least 1",
        ),
        (
            "server.maxConnections=0",
            "server.maxConnections: 0 is outside 1..65536",
        ),
        (
            "server.idleTimeoutMs=0",
            "server.idleTimeoutMs: 0 must be at least 1",
        ),
        (
            "server.bodyReadTimeoutMs=0",
            "server.bodyReadTimeoutMs: 0 must be at least 1",
        ),
        (
            "preStopSleepSeconds=-1",
            "preStopSleepSeconds: -1 must be 0 (no preStop hook) or more",
        ),
        (
            "terminationGracePeriodSeconds=10",
            "terminationGracePeriodSeconds: 10 must be larger than preStopSleepSeconds (10)",
        ),
    ] {
        let err = template(&["--set", set]).expect_err(set);
        assert!(err.contains(says), "--set {set}: {err}");
    }
    // The limits themselves are accepted.
    for set in [
        "webhook.timeoutSeconds=1,server.readTimeoutMs=500",
        "webhook.timeoutSeconds=30",
        "server.logFormat=text",
        "selfSignedCert.validityDays=1",
        "server.listen=0.0.0.0:8443",
    ] {
        template(&["--set", set]).unwrap_or_else(|e| panic!("--set {set}: {e}"));
    }
}

// ---------------------------------------------------------------------------------------
// NOTES.txt

/// The notes `helm install` prints, rendered without a cluster.
fn notes(args: &[&str]) -> String {
    let out = Command::new(helm())
        .args([
            "install",
            RELEASE,
            CHART,
            "--namespace",
            NAMESPACE,
            "--dry-run=client",
        ])
        .args(args)
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let start = text.find("NOTES:").expect("helm prints the notes");
    text[start..].to_string()
}

#[test]
fn the_notes_list_every_write_refused_while_the_webhook_is_down() {
    let default = notes(&[]);
    let flat = default.split_whitespace().collect::<Vec<_>>().join(" ");
    for says in [
        "TalosMachine create, delete, and EVERY update",
        "TalosCluster delete, and EVERY update",
        "TalosOperation creation, and EVERY update",
    ] {
        assert!(flat.contains(says), "the notes lack {says:?}:\n{default}");
    }
    // Every operation the webhook configuration registers is named.
    let objs = render(&[]);
    for h in one(&objs, "ValidatingWebhookConfiguration")["webhooks"]
        .as_array()
        .expect("webhooks")
    {
        let kind = match h["rules"][0]["resources"][0].as_str().expect("resource") {
            "talosmachines" => "TalosMachine",
            "talosclusters" => "TalosCluster",
            "talosoperations" => "TalosOperation",
            other => panic!("{other}"),
        };
        for op in strings(&h["rules"][0]["operations"]) {
            let word = match op.as_str() {
                "CREATE" if kind == "TalosOperation" => "creation".to_string(),
                "CREATE" => "create".to_string(),
                "UPDATE" => "EVERY update".to_string(),
                _ => "delete".to_string(),
            };
            let line = flat
                .split(" - ")
                .find(|l| l.starts_with(kind))
                .unwrap_or_else(|| panic!("no line for {kind}"));
            assert!(line.contains(&word), "{kind} {op}: {line}");
        }
    }
    // The commands name the objects as rendered.
    assert!(
        default.contains(&format!(
            "kubectl get validatingwebhookconfiguration {FULLNAME}-{NAMESPACE}"
        )),
        "{default}"
    );
    // "On different nodes" only where the anti-affinity requires it.
    assert!(
        default.contains("(2 wanted, on different nodes)"),
        "{default}"
    );
    let preferred = notes(&["--set", "podAntiAffinity=preferred"]);
    assert!(preferred.contains("(2 wanted):"), "{preferred}");
    assert!(!preferred.contains("different nodes"), "{preferred}");
}

// ---------------------------------------------------------------------------------------
// What the values and the operator's guide tell.

/// `text` with its line breaks and comment markers folded into single spaces.
fn flat(text: &str) -> String {
    text.split_whitespace()
        .filter(|w| *w != "#")
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_values_and_the_guide_explain_shutdown_and_switching_off_cert_manager() {
    let values = flat(&std::fs::read_to_string(format!("{CHART}/values.yaml")).expect("values"));
    let guide = flat(&std::fs::read_to_string("docs/operators.md").expect("guide"));
    for (what, text) in [("values.yaml", &values), ("docs/operators.md", &guide)] {
        for says in [
            "preStopSleepSeconds",
            "terminationGracePeriodSeconds",
            "Kubernetes 1.30",
            "delete secret",
        ] {
            assert!(text.contains(says), "{what} lacks {says:?}");
        }
    }
    // The commented defaults are the rendered ones.
    assert!(values.contains("preStopSleepSeconds: 10"));
    assert!(values.contains("terminationGracePeriodSeconds: 30"));
    assert!(
        values.contains("Switching from true to false: first delete the Secret cert-manager wrote, kubectl -n <namespace> delete secret <fullname>-tls"),
        "values.yaml: certManager.enabled"
    );
    assert!(
        guide.contains("Switching `certManager.enabled` from `true` to `false`**: delete the Secret cert-manager wrote first, `kubectl -n ichor-system delete secret ichor-rules-tls`"),
        "docs/operators.md: switching cert-manager off"
    );
    // The guide names the cluster-scoped objects as the chart renders them.
    let objs = parse(&template_in("ichor-system", &[]).expect("renders"));
    let vwc = one(&objs, "ValidatingWebhookConfiguration")["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    assert_eq!(vwc, format!("{FULLNAME}-ichor-system"));
    assert!(guide.contains("validatingwebhookconfiguration ichor-rules-ichor-system"));
    assert!(!guide.contains("validatingwebhookconfiguration ichor-rules "));
    assert!(!guide.contains("validatingwebhookconfiguration ichor-rules`"));
}
