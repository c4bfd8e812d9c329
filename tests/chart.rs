//! The Helm chart, rendered by a real helm: CRDs and rules that do not drift from the
//! project's, RBAC that is exactly `runtime::access::REQUIRED`, a hardened Deployment whose
//! arguments the binary accepts, the webhook configuration the server routes, and
//! certificates that actually serve the Service's name.
//!
//! helm comes from `ICHOR_HELM` (scripts/test.sh sets it after
//! `scripts/chart-tools.sh install`), else from that script's cache folder. Without it the
//! tests fail, saying how to install it: they never skip.

use ichor_rules::ruleset::{load, read_sources};
use ichor_rules::runtime::access::{self, Access, Scope};
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

/// The webhook's Service (the API server calls it); the headless one that lists the
/// webhook pods for the controller's admission lookups is not it.
fn webhook_service(objs: &[Value]) -> &Value {
    let found: Vec<&Value> = all(objs, "Service")
        .into_iter()
        .filter(|s| s["spec"]["clusterIP"] != "None")
        .collect();
    assert_eq!(found.len(), 1, "exactly one Service with a cluster IP");
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

/// The Deployment of `component` ("webhook" or "controller"), if rendered.
fn deployment<'a>(objs: &'a [Value], component: &str) -> Option<&'a Value> {
    let found: Vec<&Value> = all(objs, "Deployment")
        .into_iter()
        .filter(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == component)
        .collect();
    assert!(found.len() <= 1, "at most one {component} Deployment");
    found.first().copied()
}

fn container_of(d: &Value) -> &Value {
    let cs = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(cs.len(), 1);
    &cs[0]
}

/// The webhook's container.
fn container(objs: &[Value]) -> &Value {
    container_of(deployment(objs, "webhook").expect("a webhook Deployment"))
}

/// The controller's container, if the controller is rendered.
fn controller_container(objs: &[Value]) -> Option<&Value> {
    deployment(objs, "controller").map(container_of)
}

fn args_of(c: &Value) -> Vec<String> {
    strings(&c["args"])
}

fn args(objs: &[Value]) -> Vec<String> {
    args_of(container(objs))
}

/// The value of `--flag=value` in a container's arguments.
fn flag_of(c: &Value, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    args_of(c)
        .iter()
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
}

/// The value of `--flag=value` in the webhook's arguments.
fn flag(objs: &[Value], name: &str) -> Option<String> {
    flag_of(container(objs), name)
}

fn mount_path_of(c: &Value, volume: &str) -> Option<String> {
    c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == volume)
        .map(|m| m["mountPath"].as_str().expect("path").to_string())
}

fn mount_path(objs: &[Value], volume: &str) -> Option<String> {
    mount_path_of(container(objs), volume)
}

fn volume_of<'a>(d: &'a Value, name: &str) -> Option<&'a Value> {
    d["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == name)
}

/// A volume of the webhook's pods.
fn volume<'a>(objs: &'a [Value], name: &str) -> Option<&'a Value> {
    volume_of(
        deployment(objs, "webhook").expect("a webhook Deployment"),
        name,
    )
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
            "talosoperations.ichor.maesh.dev",
            "talosetcdbackups.ichor.maesh.dev",
            "talosconfigpatches.ichor.maesh.dev"
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
// RBAC: each Deployment's ServiceAccount is granted exactly what that role calls.

#[test]
fn the_charts_access_file_is_generated_from_access_rs() {
    let path = format!("{CHART}/files/access.yaml");
    let want = access::chart_access_yaml();
    if std::env::var_os("ICHOR_BLESS").is_some() {
        std::fs::write(&path, &want).expect("write");
    }
    let got = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        got == want,
        "{path} drifted from src/runtime/access.rs; regenerate it:\n  \
         ICHOR_BLESS=1 cargo nextest run -E 'test(/^chart::.*access_file/)'\n\
         (it must read:)\n{want}"
    );
}

type Grant = (Scope, String, String, String);

/// The one non-resource grant the chart renders: the controller's `get` on
/// `/admissions` (asking the webhook pods for admissions), as a [`Grant`].
fn admissions_grant() -> Grant {
    (
        Scope::Cluster,
        "nonResourceURLs".into(),
        "/admissions".into(),
        "get".into(),
    )
}

fn grants(rules: &Value, scope: Scope) -> Vec<Grant> {
    let mut out = Vec::new();
    for rule in rules.as_array().expect("rules") {
        let keys: BTreeSet<&str> = rule
            .as_object()
            .expect("rule")
            .keys()
            .map(String::as_str)
            .collect();
        if keys.contains("nonResourceURLs") {
            assert_eq!(keys, BTreeSet::from(["nonResourceURLs", "verbs"]), "{rule}");
            assert_eq!(scope, Scope::Cluster, "{rule}");
            for url in strings(&rule["nonResourceURLs"]) {
                for v in strings(&rule["verbs"]) {
                    out.push((scope, "nonResourceURLs".into(), url.clone(), v));
                }
            }
            continue;
        }
        assert!(
            keys.is_subset(&BTreeSet::from([
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames"
            ])),
            "unexpected rule fields {keys:?} (no nonResourceURLs)"
        );
        // Names narrow only the webhook's own Secret and webhook configuration (which
        // ones: checked against the rendering), never a create.
        if !rule["resourceNames"].is_null() {
            let resources = strings(&rule["resources"]);
            assert!(
                resources == ["secrets"] || resources == ["validatingwebhookconfigurations"],
                "resourceNames on {resources:?}"
            );
            assert!(
                !strings(&rule["verbs"]).contains(&"create".to_string()),
                "{rule}"
            );
        }
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

/// Whether the rendering runs the controller (a controller Deployment).
fn runs_controller(objs: &[Value]) -> bool {
    deployment(objs, "controller").is_some()
}

/// Whether /metrics checks tokens (no `--metrics-insecure`) in `c`.
fn metrics_authenticated(c: &Value) -> bool {
    !args_of(c).iter().any(|a| a == "--metrics-insecure")
}

fn service_account(d: &Value) -> String {
    d["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName")
        .to_string()
}

/// What the rendered ClusterRoles and Roles grant the ServiceAccount `sa` through the
/// bindings naming it; asserts none is granted twice and every binding binds one account.
fn granted_to(name: &str, objs: &[Value], sa: &str) -> BTreeSet<Grant> {
    let mut got = Vec::new();
    for (binding, role_kind, scope) in [
        ("ClusterRoleBinding", "ClusterRole", Scope::Cluster),
        ("RoleBinding", "Role", Scope::LeaseNamespace),
    ] {
        for b in all(objs, binding) {
            let subjects = b["subjects"].as_array().expect("subjects");
            assert_eq!(subjects.len(), 1, "{name}: {b}");
            if subjects[0]["name"] != sa {
                continue;
            }
            assert_eq!(subjects[0]["kind"], "ServiceAccount", "{name}");
            assert_eq!(subjects[0]["namespace"], NAMESPACE, "{name}");
            assert_eq!(b["roleRef"]["kind"], role_kind, "{name}");
            let role: Vec<&Value> = all(objs, role_kind)
                .into_iter()
                .filter(|r| r["metadata"]["name"] == b["roleRef"]["name"])
                .collect();
            assert_eq!(role.len(), 1, "{name}: {binding} binds one {role_kind}");
            if scope == Scope::LeaseNamespace {
                assert_eq!(role[0]["metadata"]["namespace"], NAMESPACE, "{name}");
                assert_eq!(b["metadata"]["namespace"], NAMESPACE, "{name}");
            }
            got.extend(grants(&role[0]["rules"], scope));
        }
    }
    let set: BTreeSet<Grant> = got.iter().cloned().collect();
    assert_eq!(got.len(), set.len(), "{name}: a verb granted twice to {sa}");
    set
}

fn assert_same(name: &str, who: &str, got: &BTreeSet<Grant>, want: &BTreeSet<Grant>) {
    let extra: Vec<_> = got.difference(want).collect();
    let missing: Vec<_> = want.difference(got).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{name}: the {who}'s RBAC differs from what it calls (src/runtime/access.rs)\n  granted but not called: {extra:?}\n  called but not granted: {missing:?}"
    );
}

#[test]
fn each_deployments_service_account_is_granted_exactly_what_it_calls() {
    let mut modes = BTreeSet::new();
    for (name, objs) in scenarios() {
        let webhook = deployment(&objs, "webhook").expect("the webhook always runs");
        let auth = metrics_authenticated(container_of(webhook));
        let wsa = service_account(webhook);
        assert_same(
            &name,
            "webhook",
            &granted_to(&name, &objs, &wsa),
            &grant_set(&access::webhook_role(auth, own_certs(&objs))),
        );
        modes.insert((runs_controller(&objs), auth));
        // The names that narrow its rights are its own Secret and webhook configuration.
        for r in all(&objs, "ClusterRole")
            .into_iter()
            .chain(all(&objs, "Role"))
        {
            for rule in r["rules"].as_array().expect("rules") {
                if rule["resourceNames"].is_null() {
                    continue;
                }
                let want = if strings(&rule["resources"]) == ["secrets"] {
                    flag(&objs, "--tls-secret").expect("own certificates")
                } else {
                    one(&objs, "ValidatingWebhookConfiguration")["metadata"]["name"]
                        .as_str()
                        .expect("name")
                        .to_string()
                };
                assert_eq!(strings(&rule["resourceNames"]), [want], "{name}");
            }
        }
        if let Some(controller) = deployment(&objs, "controller") {
            let csa = service_account(controller);
            assert_ne!(csa, wsa, "{name}: two ServiceAccounts");
            assert_eq!(metrics_authenticated(container_of(controller)), auth);
            let mut want = grant_set(&access::controller_role(auth));
            // Asking the webhook pods for admissions: no API call, a non-resource URL.
            if flag_of(container_of(controller), "--admissions-url").is_some() {
                want.insert(admissions_grant());
            }
            assert_same(&name, "controller", &granted_to(&name, &objs, &csa), &want);
        }
        // Every ServiceAccount rendered is one a Deployment runs as.
        let sas: BTreeSet<String> = all(&objs, "Deployment")
            .into_iter()
            .map(service_account)
            .collect();
        for s in all(&objs, "ServiceAccount") {
            assert!(
                sas.contains(s["metadata"]["name"].as_str().expect("name")),
                "{name}: {s}"
            );
        }
    }
    assert!(
        modes.contains(&(true, true)) && modes.contains(&(false, true)),
        "{modes:?}"
    );
}

#[test]
fn the_webhook_only_reads_and_no_lease_is_granted_outside_the_release_namespace() {
    let custom = values("custom");
    for a in [
        vec![],
        vec!["--set", "controller.enabled=false"],
        vec!["--set", "metrics.insecure=true"],
        vec!["--values", custom.as_str()],
        vec![
            "--values",
            custom.as_str(),
            "--set",
            "controller.enabled=true",
        ],
    ] {
        let objs = render(&a);
        let wsa = service_account(deployment(&objs, "webhook").expect("webhook"));
        for (scope, group, resource, verb) in granted_to("webhook", &objs, &wsa) {
            // Reads; a review per scrape; and its own certificates (its Secret in the
            // release namespace and the Events saying why it was written, the caBundle).
            let own = ((resource == "secrets" || resource == "events")
                && scope == Scope::LeaseNamespace)
                || resource == "validatingwebhookconfigurations";
            assert!(
                ["get", "list"].contains(&verb.as_str())
                    || (resource.ends_with("reviews") && verb == "create")
                    || own,
                "{a:?}: the webhook may {verb} {group}/{resource}"
            );
            assert!(scope == Scope::Cluster || own, "{a:?}: {resource}");
            assert_ne!(resource, "leases", "{a:?}");
        }
        // No Lease right in any ClusterRole: the locks and the leader Lease are in the
        // release namespace.
        for r in all(&objs, "ClusterRole") {
            for (_, _, resource, verb) in grants(&r["rules"], Scope::Cluster) {
                assert_ne!(resource, "leases", "{a:?}: cluster-wide {verb} on leases");
            }
        }
        for r in all(&objs, "Role") {
            assert_eq!(r["metadata"]["namespace"], NAMESPACE, "{a:?}");
        }
    }
    // Without the controller: no controller ServiceAccount, RBAC or Deployment.
    let objs = render(&["--set", "controller.enabled=false"]);
    assert!(!runs_controller(&objs));
    assert_eq!(all(&objs, "Deployment").len(), 1);
    assert_eq!(all(&objs, "ServiceAccount").len(), 1);
    assert_eq!(all(&objs, "ClusterRole").len(), 1);
    // The webhook's Role is for its certificates' Secret (and the Events about it) only:
    // no Lease right at all.
    for r in all(&objs, "Role") {
        for (_, group, resource, _) in grants(&r["rules"], Scope::LeaseNamespace) {
            assert!(
                resource == "secrets" || (group == "events.k8s.io" && resource == "events"),
                "{resource}"
            );
        }
    }
}

#[test]
fn no_role_or_binding_is_left_unbound() {
    for (name, objs) in scenarios() {
        let sas: BTreeSet<String> = all(&objs, "Deployment")
            .into_iter()
            .map(service_account)
            .collect();
        for (binding, role_kind) in [
            ("ClusterRoleBinding", "ClusterRole"),
            ("RoleBinding", "Role"),
        ] {
            let bound: BTreeSet<String> = all(&objs, binding)
                .into_iter()
                .map(|b| {
                    assert!(
                        sas.contains(b["subjects"][0]["name"].as_str().expect("subject")),
                        "{name}: {b}"
                    );
                    b["roleRef"]["name"].as_str().expect("name").to_string()
                })
                .collect();
            let roles: BTreeSet<String> = all(&objs, role_kind)
                .into_iter()
                .map(|r| r["metadata"]["name"].as_str().expect("name").to_string())
                .collect();
            assert_eq!(bound, roles, "{name}: every {role_kind} bound once");
            assert_eq!(all(&objs, binding).len(), roles.len(), "{name}");
        }
        let per_controller = usize::from(runs_controller(&objs));
        assert_eq!(
            all(&objs, "ClusterRole").len(),
            1 + per_controller,
            "{name}"
        );
        // The controller's Leases, the webhook's certificates: Roles in the release
        // namespace.
        assert_eq!(
            all(&objs, "Role").len(),
            per_controller + usize::from(own_certs(&objs)),
            "{name}"
        );
    }
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
        .flat_map(|k| all(objs, k))
        .map(|o| {
            assert!(
                o["metadata"]["namespace"].is_null(),
                "{o} is cluster-scoped"
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
    let names = |ns: &str| {
        BTreeSet::from([
            format!("{FULLNAME}-{ns}"),
            format!("{FULLNAME}-webhook-{ns}"),
            format!("{FULLNAME}-controller-{ns}"),
        ])
    };
    assert_eq!(na, names("team-a"));
    assert_eq!(nb, names("team-b"));
    // Each binding names the role it binds.
    for objs in [&a, &b] {
        let roles: Vec<&Value> = all(objs, "ClusterRole")
            .into_iter()
            .map(|r| &r["metadata"]["name"])
            .collect();
        for binding in all(objs, "ClusterRoleBinding") {
            assert!(roles.contains(&&binding["roleRef"]["name"]));
        }
    }
    // Long names are cut to 63 characters, and stay apart by a hash of the whole name.
    let long_ns = "a-namespace-with-a-rather-long-name-for-the-platform-team";
    let override_ = "fullnameOverride=ichor-rules-admission-webhook-for-the-fleet";
    let l1 = parse(&template_in(long_ns, &["--set", override_]).expect("renders"));
    let l2 = parse(&template_in(&format!("{long_ns}-2"), &["--set", override_]).expect("renders"));
    let (n1, n2) = (cluster_scoped_names(&l1), cluster_scoped_names(&l2));
    assert_eq!(n1.len(), 3);
    assert!(n1.is_disjoint(&n2));
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
        for d in all(&objs, "Deployment") {
            let pod = &d["spec"]["template"]["spec"];
            let psc = &pod["securityContext"];
            assert_eq!(psc["runAsNonRoot"], true, "{name}");
            assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
            if !psc["runAsUser"].is_null() {
                assert_ne!(psc["runAsUser"], 0, "{name}");
            }
            let c = container_of(d);
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
}

/// The component's Deployment's selector; asserts it selects its pods and only them.
fn selector_of<'a>(d: &'a Value, component: &str) -> &'a Value {
    let pod_labels = &d["spec"]["template"]["metadata"]["labels"];
    let selector = &d["spec"]["selector"]["matchLabels"];
    for (k, v) in selector.as_object().expect("selector") {
        assert_eq!(&pod_labels[k], v, "the selector selects the pods");
    }
    assert_eq!(selector["app.kubernetes.io/component"], component);
    selector
}

#[test]
fn two_deployments_each_spread_over_nodes_with_a_disruption_budget() {
    let objs = render(&[]);
    assert_eq!(all(&objs, "Deployment").len(), 2);
    assert_eq!(all(&objs, "PodDisruptionBudget").len(), 2);
    for component in ["webhook", "controller"] {
        let d = deployment(&objs, component).expect(component);
        assert_eq!(d["spec"]["replicas"], 2, "{component}");
        let selector = selector_of(d, component);
        let terms = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
        assert_eq!(terms[0]["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(&terms[0]["labelSelector"]["matchLabels"], selector);
        let pdbs: Vec<&Value> = all(&objs, "PodDisruptionBudget")
            .into_iter()
            .filter(|p| &p["spec"]["selector"]["matchLabels"] == selector)
            .collect();
        assert_eq!(pdbs.len(), 1, "{component}: one budget");
        assert_eq!(pdbs[0]["spec"]["maxUnavailable"], 1);
        // The rollout never takes both replicas down.
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 1);
    }
    // The two components' pods are told apart: neither selector selects the other's pods.
    let w = deployment(&objs, "webhook").expect("webhook");
    let c = deployment(&objs, "controller").expect("controller");
    assert_ne!(
        w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"],
        c["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    );
    // The Service routes to the webhook pods only.
    assert_eq!(
        &webhook_service(&objs)["spec"]["selector"],
        selector_of(w, "webhook")
    );

    let custom = render(&["--values", &values("custom")]);
    let d = deployment(&custom, "webhook").expect("webhook");
    assert_eq!(d["spec"]["replicas"], 3);
    let pref = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        pref[0]["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    let objs = render(&["--set", "controller.replicas=3"]);
    assert_eq!(
        deployment(&objs, "controller").expect("c")["spec"]["replicas"],
        3
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
        deployment(objs, "webhook").expect("webhook")["spec"]["template"]["spec"]
            ["terminationGracePeriodSeconds"]
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
    // The chart needs Kubernetes 1.32 (Chart.yaml kubeVersion; the sleep action came in
    // 1.30): an older cluster is refused by helm itself, saying so.
    let err = template(&["--kube-version", "1.29.5"]).expect_err("1.29 is too old");
    assert!(err.contains("kubeVersion"), "{err}");
    render(&["--kube-version", "1.32.0"]);
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
        // With a client CA the kubelet (no client certificate) probes the health port.
        let client_ca = flag(&objs, "--client-ca");
        for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], path, "{name}");
            if client_ca.is_some() {
                assert_eq!(get["scheme"], "HTTP", "{name}");
                assert_eq!(get["port"], "health", "{name}");
            } else {
                assert_eq!(get["scheme"], "HTTPS", "{name}");
                assert_eq!(get["port"], "https", "{name}");
            }
        }
        if let Some(ca) = client_ca {
            let (health, addr) = port_and_flag(c, "health", "--health-listen");
            assert_eq!(u64::from(addr.port()), health, "{name}");
            let dir = mount_path(&objs, "client-ca").expect("the client CA is mounted");
            assert_eq!(ca, format!("{dir}/ca.crt"), "{name}");
            assert!(volume(&objs, "client-ca").expect("volume")["configMap"]["name"].is_string());
        }
        let svc = webhook_service(&objs);
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "https", "{name}");
        for (k, v) in svc["spec"]["selector"].as_object().expect("selector") {
            assert_eq!(
                &deployment(&objs, "webhook").expect("webhook")["spec"]["template"]["metadata"]["labels"]
                    [k],
                v,
                "{name}: the Service selects the pods"
            );
        }
    }
}

/// The port a container names `name`, and the address its flag `flag` listens on.
fn port_and_flag(c: &Value, name: &str, flag: &str) -> (u64, std::net::SocketAddr) {
    let port = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no port {name}"))["containerPort"]
        .as_u64()
        .expect("containerPort");
    let addr = flag_of(c, flag)
        .unwrap_or_else(|| panic!("no {flag}"))
        .parse()
        .expect("an address");
    (port, addr)
}

/// The controller links its records to the webhook's admissions across the two
/// Deployments: it asks every webhook pod (a headless Service of them, on the metrics
/// port) at `/admissions`, checking their certificate against the webhook's CA (only
/// `ca.crt` of the TLS Secret is mounted, never a key) for the name of the webhook's
/// Service; the webhook's NetworkPolicy lets the controller pods reach that port; the
/// controller may `get` `/admissions` and nothing more is granted (checked with the rest of
/// its RBAC). Without token checks or without the webhook's records, none of it.
#[test]
fn the_controller_asks_every_webhook_pod_for_admissions() {
    for (name, objs) in [
        ("default", render(&[])),
        (
            "cert-manager",
            render(&["--set", "certManager.enabled=true"]),
        ),
    ] {
        let d = deployment(&objs, "controller").expect("controller");
        let c = container_of(d);
        let url = flag_of(c, "--admissions-url").expect("--admissions-url");
        let svc = webhook_service(&objs)["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        assert_eq!(
            url,
            format!("https://{svc}.{NAMESPACE}.svc:8080/admissions"),
            "{name}: the webhook Service's name, which its certificate carries; the metrics port"
        );
        let peers = flag_of(c, "--admissions-peers").expect("--admissions-peers");
        let headless = all(&objs, "Service")
            .into_iter()
            .find(|s| {
                format!(
                    "{}.{NAMESPACE}.svc",
                    s["metadata"]["name"].as_str().unwrap_or("")
                ) == peers
            })
            .unwrap_or_else(|| panic!("{name}: no Service {peers}"));
        assert_eq!(headless["spec"]["clusterIP"], "None", "{name}");
        let w = deployment(&objs, "webhook").expect("webhook");
        assert_eq!(
            headless["spec"]["selector"], w["spec"]["selector"]["matchLabels"],
            "{name}: the webhook pods"
        );
        assert_eq!(
            headless["spec"]["ports"],
            serde_json::json!([{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]),
            "{name}"
        );
        let ca = flag_of(c, "--admissions-ca").expect("--admissions-ca");
        let dir = mount_path_of(c, "webhook-ca").expect("the CA mounted");
        assert_eq!(ca, format!("{dir}/ca.crt"), "{name}");
        let v = volume_of(d, "webhook-ca").expect("volume");
        assert_eq!(
            v["secret"]["secretName"],
            format!("{FULLNAME}-tls"),
            "{name}"
        );
        assert_eq!(
            v["secret"]["optional"], true,
            "{name}: the webhook writes it"
        );
        assert_eq!(
            v["secret"]["items"],
            serde_json::json!([{"key": "ca.crt", "path": "ca.crt"}]),
            "{name}: the CA only, never a key"
        );
    }
    for off in [
        vec!["--set", "metrics.insecure=true"],
        vec!["--set", "webhook.decisionLog=off"],
    ] {
        let objs = render(&off);
        let c = controller_container(&objs).expect("controller");
        for f in ["--admissions-url", "--admissions-peers", "--admissions-ca"] {
            assert_eq!(flag_of(c, f), None, "{off:?}");
        }
        assert_eq!(
            all(&objs, "Service").len(),
            1,
            "{off:?}: no headless Service"
        );
        let text = template(&off).expect("renders");
        assert!(!text.contains("/admissions"), "{off:?}");
    }
}

#[test]
fn the_controller_listens_only_for_its_probes_and_metrics() {
    for (name, objs) in scenarios() {
        let Some(c) = controller_container(&objs) else {
            continue;
        };
        let a = args_of(c);
        assert!(
            a.contains(&"--no-webhook".to_string()),
            "{name}: no webhook listener"
        );
        assert!(flag_of(c, "--listen").is_none(), "{name}");
        assert!(
            flag_of(c, "--tls-cert").is_none(),
            "{name}: no serving certificate"
        );
        let names: BTreeSet<&str> = c["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| p["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, BTreeSet::from(["health", "metrics"]), "{name}");
        let (health, addr) = port_and_flag(c, "health", "--health-listen");
        assert_eq!(u64::from(addr.port()), health, "{name}");
        for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], path, "{name}");
            assert_eq!(get["scheme"], "HTTP", "{name}");
            assert_eq!(get["port"], "health", "{name}");
        }
        // No Service reaches the controller.
        for svc in all(&objs, "Service") {
            assert_eq!(
                svc["spec"]["selector"]["app.kubernetes.io/component"], "webhook",
                "{name}"
            );
        }
    }
}

#[test]
fn metrics_have_a_port_of_their_own_in_both_deployments() {
    for (name, objs) in scenarios() {
        for d in all(&objs, "Deployment") {
            let c = container_of(d);
            let (port, addr) = port_and_flag(c, "metrics", "--metrics-listen");
            assert_eq!(u64::from(addr.port()), port, "{name}");
            if let Some(listen) = flag_of(c, "--listen") {
                let l: std::net::SocketAddr = listen.parse().expect("addr");
                assert_ne!(l.port(), addr.port(), "{name}");
                assert_eq!(l.ip(), addr.ip(), "{name}: the same host");
            }
            if name == "default" {
                assert!(metrics_authenticated(c), "tokens are checked by default");
            }
        }
    }
    let objs = render(&["--set", "metrics.insecure=true,metrics.port=9100"]);
    for d in all(&objs, "Deployment") {
        let c = container_of(d);
        assert!(!metrics_authenticated(c));
        assert_eq!(
            flag_of(c, "--metrics-listen").as_deref(),
            Some("0.0.0.0:9100")
        );
    }
    // No rights to review tokens when nothing checks them.
    for r in all(&objs, "ClusterRole") {
        for (_, _, resource, _) in grants(&r["rules"], Scope::Cluster) {
            assert!(!resource.ends_with("reviews"), "{resource}");
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
    for f in [
        "--rules",
        "--tls-cert",
        "--no-webhook",
        "--no-controller",
        "--health-listen",
        "--metrics-listen",
        "--metrics-insecure",
    ] {
        assert!(known.contains(f), "serve has no {f}: {known:?}");
    }
    for (name, objs) in scenarios() {
        for d in all(&objs, "Deployment") {
            let a = args_of(container_of(d));
            assert_eq!(a[0], "serve", "{name}");
            for arg in &a[1..] {
                let flag = arg.split('=').next().expect("flag");
                assert!(flag.starts_with("--"), "{name}: {arg}");
                assert!(
                    known.contains(flag),
                    "{name}: `ichor-rules serve` has no {flag}"
                );
            }
            let once: BTreeSet<&str> = a.iter().map(|x| x.split('=').next().unwrap_or(x)).collect();
            assert_eq!(once.len(), a.len(), "{name}: a flag given twice");
        }
    }
}

/// `server.maxInflightReads` is the webhook's `--max-inflight-reads` (16 by default, as
/// `serve`'s own default), the controller's reads keep their own bound, and a value `serve`
/// would refuse is refused by the chart, saying why.
#[test]
fn max_inflight_reads_is_the_webhooks_read_limit() {
    let objs = render(&[]);
    assert_eq!(flag(&objs, "--max-inflight-reads").as_deref(), Some("16"));
    if let Some(c) = controller_container(&objs) {
        assert_eq!(flag_of(c, "--max-inflight-reads"), None);
    }
    let objs = render(&["--set", "server.maxInflightReads=64"]);
    assert_eq!(flag(&objs, "--max-inflight-reads").as_deref(), Some("64"));
    for v in ["1", "4096"] {
        let objs = render(&["--set", &format!("server.maxInflightReads={v}")]);
        assert_eq!(flag(&objs, "--max-inflight-reads").as_deref(), Some(v));
    }
    for v in ["0", "4097"] {
        let err = template(&["--set", &format!("server.maxInflightReads={v}")]).expect_err(v);
        assert!(
            err.contains(&format!("server.maxInflightReads: {v} is outside 1..4096")),
            "{v}: {err}"
        );
    }
}

fn assert_env(name: &str, c: &Value) {
    let env = c["env"].as_array().expect("env").clone();
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let e = env.iter().find(|e| e["name"] == var).expect("env var");
        assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], field, "{name}");
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
        if own_certs(&objs) {
            assert!(mount_path(&objs, "tls").is_none(), "{name}");
        } else {
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
        }
        assert!(
            args(&objs).contains(&"--no-controller".to_string()),
            "{name}"
        );
        for c in all(&objs, "Deployment").into_iter().map(container_of) {
            assert_eq!(
                flag_of(c, "--identity").as_deref(),
                Some("$(POD_NAME)"),
                "{name}"
            );
            assert_env(&name, c);
            let log_format = flag_of(c, "--log-format").expect("--log-format");
            assert!(["json", "text"].contains(&log_format.as_str()), "{name}");
            for f in ["--read-timeout-ms", "--reload-interval-ms"] {
                let v = flag_of(c, f).expect("flag");
                assert!(v.parse::<u64>().is_ok_and(|n| n > 0), "{name}: {f}={v}");
            }
            let rules = mount_path_of(c, "rules").expect("rules mounted");
            assert_eq!(
                flag_of(c, "--rules").as_deref(),
                Some(rules.as_str()),
                "{name}"
            );
        }
        if let Some(c) = controller_container(&objs) {
            assert_eq!(
                flag_of(c, "--lease-namespace").as_deref(),
                Some("$(POD_NAMESPACE)"),
                "{name}: the Leases in the release namespace"
            );
        }
    }
}

/// Whether the talosconfig shows up in a Deployment: a volume of the Secret, a mount, or
/// the flag.
fn has_talosconfig(d: &Value, secret: &str) -> bool {
    let c = container_of(d);
    let volumes = d["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    volumes
        .iter()
        .any(|v| v["secret"]["secretName"] == secret || v["name"] == "talosconfig")
        || mount_path_of(c, "talosconfig").is_some()
        || flag_of(c, "--talosconfig").is_some()
}

#[test]
fn the_talosconfig_is_never_in_the_webhook_pods() {
    let custom = values("custom");
    let with_secret = [
        "--set",
        "talos.configSecret=talos-admin",
        "--set",
        "talos.forAllClusters=true",
    ];
    let mut sets: Vec<Vec<&str>> = vec![
        with_secret.to_vec(),
        [&with_secret[..], &["--set", "controller.enabled=false"]].concat(),
        vec!["--values", custom.as_str()],
        vec![
            "--values",
            custom.as_str(),
            "--set",
            "controller.enabled=true",
        ],
        [&with_secret[..], &["--set", "metrics.insecure=true"]].concat(),
    ];
    let scenario_files: Vec<String> = scenarios()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n != "default")
        .collect();
    for f in &scenario_files {
        sets.push(vec![
            "--values",
            f.as_str(),
            "--set",
            "talos.configSecret=talos-admin",
            "--set",
            "talos.forAllClusters=true",
        ]);
    }
    for a in &sets {
        let objs = render(a);
        let webhook = deployment(&objs, "webhook").expect("webhook");
        assert!(!has_talosconfig(webhook, "talos-admin"), "{a:?}");
        match deployment(&objs, "controller") {
            // The controller has it, at the path its flag names.
            Some(controller) => {
                assert!(has_talosconfig(controller, "talos-admin"), "{a:?}");
                let c = container_of(controller);
                let v = volume_of(controller, "talosconfig").expect("volume");
                let item = v["secret"]["items"][0]["path"].as_str().expect("path");
                let dir = mount_path_of(c, "talosconfig").expect("mounted");
                assert_eq!(flag_of(c, "--talosconfig"), Some(format!("{dir}/{item}")));
            }
            // controller.enabled=false: no talosconfig anywhere.
            None => {
                for d in all(&objs, "Deployment") {
                    assert!(!has_talosconfig(d, "talos-admin"), "{a:?}");
                }
            }
        }
    }
    let custom = render(&["--values", &custom, "--set", "controller.enabled=true"]);
    let v = volume_of(deployment(&custom, "controller").expect("c"), "talosconfig")
        .expect("talosconfig volume");
    assert_eq!(v["secret"]["secretName"], "talos-admin");
    assert_eq!(v["secret"]["items"][0]["key"], "config");
    // Without the Secret, nothing is mounted.
    let default = render(&[]);
    for d in all(&default, "Deployment") {
        assert!(!has_talosconfig(d, ""), "{d}");
    }
}

#[test]
fn network_policies_admit_only_the_webhook_port_by_default() {
    let objs = render(&[]);
    let policies = all(&objs, "NetworkPolicy");
    assert_eq!(policies.len(), 2, "one per Deployment");
    for p in &policies {
        assert_eq!(p["metadata"]["namespace"], NAMESPACE);
        assert_eq!(strings(&p["spec"]["policyTypes"]), ["Ingress"]);
    }
    let of = |component: &str| -> &Value {
        policies
            .iter()
            .find(|p| {
                p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
            })
            .copied()
            .unwrap_or_else(|| panic!("no policy for the {component} pods"))
    };
    let w = deployment(&objs, "webhook").expect("webhook");
    assert_eq!(
        &of("webhook")["spec"]["podSelector"]["matchLabels"],
        &w["spec"]["selector"]["matchLabels"]
    );
    let ingress = of("webhook")["spec"]["ingress"]
        .as_array()
        .expect("ingress");
    assert_eq!(
        ingress.len(),
        2,
        "the webhook port, and the metrics port for the controller's admission lookups"
    );
    assert_eq!(
        ingress[1]["ports"],
        serde_json::json!([{"port": 8080, "protocol": "TCP"}])
    );
    let c = deployment(&objs, "controller").expect("controller");
    assert_eq!(
        ingress[1]["from"],
        serde_json::json!([{"podSelector": {"matchLabels": c["spec"]["selector"]["matchLabels"]}}]),
        "the controller pods only"
    );
    assert_eq!(
        ingress[0]["ports"],
        serde_json::json!([{"port": 8443, "protocol": "TCP"}])
    );
    assert!(
        ingress[0]["from"].is_null(),
        "the API server may come from anywhere"
    );
    // The controller's pods admit nothing.
    assert_eq!(of("controller")["spec"]["ingress"], serde_json::json!([]));

    // Peers for the webhook and metrics ports.
    let custom = render(&[
        "--values",
        &values("custom"),
        "--set",
        "controller.enabled=true",
    ]);
    for p in all(&custom, "NetworkPolicy") {
        for rule in p["spec"]["ingress"].as_array().expect("ingress") {
            assert!(rule["from"].is_array(), "{rule}");
            let port = &rule["ports"][0]["port"];
            assert!(port == 8443 || port == 8080, "{rule}");
        }
    }
    // Switched off: none.
    assert!(
        all(
            &render(&["--set", "networkPolicy.enabled=false"]),
            "NetworkPolicy"
        )
        .is_empty()
    );
    assert!(all(&render(&["--values", &values("existing")]), "NetworkPolicy").is_empty());
}

// ---------------------------------------------------------------------------------------
// The webhook configuration.

#[test]
fn webhooks_match_the_seeds_operations_and_the_servers_routes() {
    let routes = std::fs::read_to_string("src/runtime/webhook.rs").expect("source");
    for (name, objs) in scenarios() {
        let vwc = one(&objs, "ValidatingWebhookConfiguration");
        let svc = webhook_service(&objs);
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
                // Issue 37: only the controller publishes the redacted base and records the
                // cluster's Bootstrap.
                ("talosclusters/status".to_string(), ops(&["UPDATE"])),
                // ADR 0106 §1: a written TalosConfigPatch is dry-rendered (deletes are not).
                ("talosconfigpatches".to_string(), ops(&["CREATE", "UPDATE"])),
                // Issue 36: only the controller records a backup's snapshots.
                ("talosetcdbackups/status".to_string(), ops(&["UPDATE"])),
                (
                    "talosmachines".to_string(),
                    ops(&["CREATE", "DELETE", "UPDATE"])
                ),
                ("talosmachines/status".to_string(), ops(&["UPDATE"])),
                ("talosoperations".to_string(), ops(&["CREATE", "UPDATE"])),
            ],
            "{name}"
        );
        let names: BTreeSet<&str> = hooks
            .iter()
            .map(|h| h["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names.len(), 7, "{name}: webhook names are unique");
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
    let objs = render(&IN_CHART);
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
    let fresh = render(&IN_CHART);
    let other_ca = b64(one(&fresh, "Secret")["data"]["ca.crt"]
        .as_str()
        .expect("ca"));
    assert_ne!(other_ca, ca, "each install generates its own CA");
    handshake(&crt, &key, &other_ca, &svc).expect_err("a CA that did not sign it");
}

/// The chart generating the certificates at render time (not the default).
const IN_CHART: [&str; 2] = ["--set", "selfSignedCert.generateInChart=true"];

/// Whether the webhook pods keep their own certificates (`--tls-secret`).
fn own_certs(objs: &[Value]) -> bool {
    flag(objs, "--tls-secret").is_some()
}

#[test]
fn by_default_the_webhook_keeps_its_own_certificates_and_every_render_is_the_same() {
    let objs = render(&[]);
    assert!(own_certs(&objs));
    assert_eq!(flag(&objs, "--tls-secret"), Some(format!("{FULLNAME}-tls")));
    assert_eq!(
        flag(&objs, "--webhook-configuration"),
        Some(format!("{FULLNAME}-{NAMESPACE}"))
    );
    assert_eq!(
        flag(&objs, "--service-name").as_deref(),
        webhook_service(&objs)["metadata"]["name"].as_str()
    );
    assert_eq!(
        flag(&objs, "--lease-namespace").as_deref(),
        Some("$(POD_NAMESPACE)")
    );
    assert!(flag(&objs, "--tls-cert").is_none() && volume(&objs, "tls").is_none());
    assert!(
        all(&objs, "Secret").is_empty(),
        "no Secret rendered: the pods make it"
    );
    for h in one(&objs, "ValidatingWebhookConfiguration")["webhooks"]
        .as_array()
        .expect("webhooks")
    {
        assert!(
            h["clientConfig"]["caBundle"].is_null(),
            "set at run time: {h}"
        );
    }
    // The same text at every render, for every value set but the in-chart generation.
    for args in [vec![]].into_iter().chain(
        scenarios()
            .into_iter()
            .skip(1)
            .map(|(n, _)| vec!["--values".to_string(), n]),
    ) {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let (one_, two) = (
            template(&a).expect("renders"),
            template(&a).expect("renders"),
        );
        assert!(one_ == two, "{a:?}: two renders differ");
    }
    let (one_, two) = (
        template(&IN_CHART).expect("r"),
        template(&IN_CHART).expect("r"),
    );
    assert_ne!(
        one_, two,
        "the in-chart generation makes new certificates each time"
    );
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
        let svc = webhook_service(&objs)["metadata"]["name"]
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
        [
            "admission.rules",
            "invariants.rules",
            "operations.rules",
            "removal.rules"
        ]
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

/// Issue 13: the webhook trusts exactly the controller's ServiceAccount to change what the
/// rules read in a TalosMachine's status, and is registered for `talosmachines/status`
/// (and for the other statuses the rules guard: issues 36 and 37).
#[test]
fn the_webhook_knows_the_controllers_username_and_guards_machine_status() {
    let flag = |objs: &[Value]| {
        let webhook = deployment(objs, "webhook").expect("webhook");
        flag_of(container_of(webhook), "--controller-username")
    };
    let objs = render(&[]);
    let controller = deployment(&objs, "controller").expect("controller");
    let sa = controller["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the controller's ServiceAccount");
    assert_eq!(
        flag(&objs),
        Some(format!("system:serviceaccount:{NAMESPACE}:{sa}"))
    );
    let custom = render(&["--set", "webhook.controllerUsername=ops:controller"]);
    assert_eq!(flag(&custom), Some("ops:controller".to_string()));
    // Every status the rules guard (`report`): the machine's (issue 13), the backup's
    // snapshots (issue 36), the cluster's redacted base and Bootstrap record (issue 37).
    for resource in [
        "talosmachines/status",
        "talosetcdbackups/status",
        "talosclusters/status",
    ] {
        let name = format!("{}.validate.ichor.maesh.dev", resource.replace('/', "-"));
        let hook = one(&objs, "ValidatingWebhookConfiguration")["webhooks"]
            .as_array()
            .expect("webhooks")
            .iter()
            .find(|h| h["name"] == name.as_str())
            .unwrap_or_else(|| panic!("a webhook for {resource}"))
            .clone();
        assert_eq!(strings(&hook["rules"][0]["resources"]), [resource]);
        assert_eq!(strings(&hook["rules"][0]["operations"]), ["UPDATE"]);
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(
            hook["clientConfig"]["service"]["path"],
            format!("/validate/{resource}")
        );
    }
    // One talosconfig for every cluster only when asked for.
    let opted = render(&[
        "--set",
        "talos.configSecret=talos-admin",
        "--set",
        "talos.forAllClusters=true",
    ]);
    let c = container_of(deployment(&opted, "controller").expect("controller"));
    assert!(
        strings(&c["args"]).contains(&"--talosconfig-for-all-clusters".to_string()),
        "{c}"
    );
    let c = container_of(deployment(&objs, "controller").expect("controller"));
    assert!(flag_of(c, "--talosconfig").is_none(), "{c}");
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
            "serviceAccount.webhookName must name an existing",
        ),
        (
            "serviceAccount.create=false,serviceAccount.webhookName=a",
            "serviceAccount.controllerName must name an existing",
        ),
        (
            "serviceAccount.create=false,serviceAccount.webhookName=a,serviceAccount.controllerName=a",
            "the webhook and the controller must run as different ServiceAccounts",
        ),
        (
            "serviceAccount.name=guard",
            "serviceAccount.name: \"guard\" is replaced by serviceAccount.webhookName and serviceAccount.controllerName",
        ),
        (
            "metrics.port=8443",
            "metrics.port: 8443 is server.containerPort too",
        ),
        (
            "metrics.port=8081",
            "metrics.port: 8081 is server.healthPort too",
        ),
        (
            "server.healthPort=8443",
            "server.healthPort: 8443 is server.containerPort too",
        ),
        ("metrics.port=0", "metrics.port: 0 is not a port"),
        (
            "talos.configSecret=talos-admin",
            "talos.configSecret is one talosconfig for every TalosCluster: set talos.forAllClusters=true",
        ),
        (
            "controller.replicas=0",
            "controller.replicas: 0 must be at least 1",
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
        "TalosConfigPatch create, and EVERY update",
        "TalosEtcdBackup EVERY update of its status",
        // Issue 37: the controller's own status writes wait for the webhook too (no base
        // published, no Bootstrap recorded or sent).
        "EVERY update of its status (the controller's own included: no base is published and no Bootstrap is recorded",
    ] {
        assert!(flat.contains(says), "the notes lack {says:?}:\n{default}");
    }
    // Every operation the webhook configuration registers is named.
    let objs = render(&[]);
    for h in one(&objs, "ValidatingWebhookConfiguration")["webhooks"]
        .as_array()
        .expect("webhooks")
    {
        let resource = h["rules"][0]["resources"][0].as_str().expect("resource");
        let kind = match resource {
            "talosmachines" | "talosmachines/status" => "TalosMachine",
            "talosclusters" | "talosclusters/status" => "TalosCluster",
            "talosoperations" => "TalosOperation",
            "talosconfigpatches" => "TalosConfigPatch",
            "talosetcdbackups/status" => "TalosEtcdBackup",
            other => panic!("{other}"),
        };
        for op in strings(&h["rules"][0]["operations"]) {
            let word = match op.as_str() {
                "CREATE" if kind == "TalosOperation" => "creation".to_string(),
                "CREATE" => "create".to_string(),
                "UPDATE" if resource.ends_with("/status") => {
                    "EVERY update of its status".to_string()
                }
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

/// `rules.audit` and `rules.enforce` switch named rules without editing the rules: both
/// components get `--audit-rule`/`--enforce-rule` (the controller's holds follow the same
/// modes); a value that is not a rule name is refused, as is a decision log other than
/// stderr or off.
#[test]
fn the_chart_switches_rules_between_audit_and_enforce() {
    let objs = render(&[
        "--set",
        "rules.audit={declared-count,quorum}",
        "--set",
        "rules.enforce={approval-cap}",
    ]);
    let want = vec![
        "--audit-rule=declared-count".to_string(),
        "--audit-rule=quorum".to_string(),
        "--enforce-rule=approval-cap".to_string(),
    ];
    let modes = |c: &Value| -> Vec<String> {
        args_of(c)
            .into_iter()
            .filter(|a| a.starts_with("--audit-rule=") || a.starts_with("--enforce-rule="))
            .collect()
    };
    assert_eq!(modes(container(&objs)), want);
    assert_eq!(
        modes(controller_container(&objs).expect("a controller")),
        want
    );
    assert_eq!(flag(&objs, "--decision-log").as_deref(), Some("stderr"));
    // By default nothing is switched.
    let objs = render(&[]);
    assert!(modes(container(&objs)).is_empty());
    for bad in ["rules.audit={$(POD_NAME)}", "rules.enforce={a b}"] {
        let err = template(&["--set", bad]).expect_err("refused");
        assert!(err.contains("is not a rule name"), "{bad}: {err}");
    }
    let err = template(&["--set", "webhook.decisionLog=/var/log/x"]).expect_err("refused");
    assert!(err.contains("neither stderr nor off"), "{err}");
    let objs = render(&["--set", "webhook.decisionLog=off"]);
    assert_eq!(flag(&objs, "--decision-log").as_deref(), Some("off"));
    // The controller's records are switched apart from the webhook's.
    let ctl = |objs: &[Value]| {
        flag_of(
            controller_container(objs).expect("a controller"),
            "--decision-log",
        )
    };
    assert_eq!(ctl(&objs).as_deref(), Some("stderr"));
    let objs = render(&["--set", "controller.decisionLog=off"]);
    assert_eq!(ctl(&objs).as_deref(), Some("off"));
    assert_eq!(flag(&objs, "--decision-log").as_deref(), Some("stderr"));
    let err = template(&["--set", "controller.decisionLog=/var/log/x"]).expect_err("refused");
    assert!(err.contains("controller.decisionLog"), "{err}");
}

/// Issue 37: the webhook never reads the cluster's Secrets (it dry-renders patches against
/// the redacted base the controller publishes). Its one Secret is its own certificates:
/// every grant of `secrets` to its ServiceAccount other than `create` (which cannot be
/// narrowed by name) names exactly that Secret, in every rendering.
#[test]
fn the_webhook_is_granted_no_secret_but_its_own_certificates() {
    let webhook_sa = format!("{FULLNAME}-webhook");
    let tls = format!("{FULLNAME}-tls");
    for (name, objs) in scenarios() {
        let mut granted = 0;
        for (binding, role_kind) in [
            ("ClusterRoleBinding", "ClusterRole"),
            ("RoleBinding", "Role"),
        ] {
            for b in all(&objs, binding) {
                let to_webhook = b["subjects"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| s["name"] == webhook_sa.as_str()));
                if !to_webhook {
                    continue;
                }
                let role = all(&objs, role_kind)
                    .into_iter()
                    .find(|r| r["metadata"]["name"] == b["roleRef"]["name"])
                    .unwrap_or_else(|| panic!("{name}: {binding} names no {role_kind}"));
                for rule in role["rules"].as_array().into_iter().flatten() {
                    let resources = strings(&rule["resources"]);
                    if !resources.iter().any(|r| r == "secrets" || r == "*") {
                        continue;
                    }
                    let verbs = strings(&rule["verbs"]);
                    if verbs == ["create"] {
                        continue;
                    }
                    granted += 1;
                    assert_eq!(
                        strings(&rule["resourceNames"]),
                        std::slice::from_ref(&tls),
                        "{name}: {role_kind} {} grants the webhook {verbs:?} on Secrets beyond its own",
                        role["metadata"]["name"]
                    );
                    assert!(
                        verbs.iter().all(|v| v == "get" || v == "update"),
                        "{name}: {verbs:?}"
                    );
                }
            }
        }
        // With its own certificates (not cert-manager's), it does read that one.
        assert!(granted <= 1, "{name}: {granted} grants");
    }
}
