//! Every Kubernetes API call the operator makes, as RBAC sees it: the one list the chart's
//! ClusterRole and Role grant, verb for verb (tests/chart.rs compares them), and that the
//! controller's recorded calls must stay within.
//!
//! It comes in disjoint parts: [`WEBHOOK`], what a replica serving only the webhook calls
//! (`serve --no-controller`: the live reads of `live/` and the readiness probe of
//! `serve`), [`CONTROLLER`], what the controller adds, and [`METRICS_AUTH`], what a process
//! serving `/metrics` with authentication calls (a TokenReview and a SubjectAccessReview per
//! scrape). [`REQUIRED`] is the webhook's and the controller's calls together.
//!
//! The chart runs two Deployments, each with its own ServiceAccount, and grants each
//! exactly its role: [`webhook_role`] to the webhook pods (reads, and with certificates of
//! their own [`CERTS`]: their Secret and the caBundle; no Lease, no Talos credentials), [`controller_role`] to the controller pods. `charts/ichor-rules/files/
//! access.yaml` is these roles as RBAC rules, generated from this file (tests/chart.rs
//! fails, printing the new text, when it drifts), and the chart's templates render their
//! ClusterRoles and Roles from it.

/// Where a grant applies.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every namespace (a ClusterRole): the TalosCluster, TalosMachine and TalosOperation
    /// objects, nodes and pods live wherever the clusters are.
    Cluster,
    /// Only the operator's own namespace (the release namespace, `--lease-namespace`; a
    /// Role): the controller's leader-election Lease and the per-cluster lock Leases.
    LeaseNamespace,
}

/// One resource (or subresource) of one API group, and the verbs used on it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The API group; `""` is the core group.
    pub api_group: &'static str,
    /// The plural resource name, with `/subresource` when the call goes to one.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub scope: Scope,
}

const ICHOR: &str = "ichor.maesh.dev";
const CORE: &str = "";
const COORDINATION: &str = "coordination.k8s.io";
const EVENTS: &str = "events.k8s.io";
const AUTHENTICATION: &str = "authentication.k8s.io";
const AUTHORIZATION: &str = "authorization.k8s.io";
const ADMISSIONREGISTRATION: &str = "admissionregistration.k8s.io";

/// The API calls of the webhook alone (`serve --no-controller`), and nothing more: the live
/// reads of a decision (`LiveReader::snapshot`: a LIST of the request's namespace's
/// TalosMachines and TalosOperations, a GET of the TalosCluster; for a TalosConfigPatch, a
/// LIST of its cluster's TalosConfigPatches) and the readiness probe of
/// `serve` (a LIST of TalosClusters, `limit=1`, in every namespace).
pub const WEBHOOK: &[Access] = &[
    Access {
        api_group: ICHOR,
        resource: "talosmachines",
        verbs: &["list"],
        scope: Scope::Cluster,
    },
    Access {
        api_group: ICHOR,
        resource: "talosclusters",
        verbs: &["get", "list"],
        scope: Scope::Cluster,
    },
    Access {
        api_group: ICHOR,
        resource: "talosoperations",
        verbs: &["list"],
        scope: Scope::Cluster,
    },
    // An etcd restore's backup (`backup.exists`, `backup.in_cluster`): its spec only; the
    // Secrets it names are never read here.
    Access {
        api_group: ICHOR,
        resource: "talosetcdbackups",
        verbs: &["list"],
        scope: Scope::Cluster,
    },
    // The dry render of a written TalosConfigPatch (ADR 0106 §1): the other patches of its
    // cluster. Against the redacted base in the TalosCluster's status: no Secret read.
    Access {
        api_group: ICHOR,
        resource: "talosconfigpatches",
        verbs: &["list"],
        scope: Scope::Cluster,
    },
];

/// What the controller calls beyond [`WEBHOOK`] (its own live reads are the same LIST and
/// GET), and nothing more.
pub const CONTROLLER: &[Access] = &[
    // The watch that drives reconciles, and the removal finalizer (a merge patch guarded
    // by the resourceVersion).
    Access {
        api_group: ICHOR,
        resource: "talosmachines",
        verbs: &["watch", "patch"],
        scope: Scope::Cluster,
    },
    // Ready, NodeReachable and Removal conditions, and the removal's progress.
    Access {
        api_group: ICHOR,
        resource: "talosmachines/status",
        verbs: &["patch"],
        scope: Scope::Cluster,
    },
    // The watch, and the teardown finalizer (a merge patch guarded by the resourceVersion).
    Access {
        api_group: ICHOR,
        resource: "talosclusters",
        verbs: &["watch", "patch"],
        scope: Scope::Cluster,
    },
    // The Transitioning, BaseConfig and Teardown conditions, the redacted base and the
    // record of the cluster's Bootstrap (these two through admission: only this identity may
    // write them, rule cluster-status-only-by-controller).
    Access {
        api_group: ICHOR,
        resource: "talosclusters/status",
        verbs: &["patch"],
        scope: Scope::Cluster,
    },
    // The watch, and the reboot that rolls a staged configuration (issue 37): created,
    // through admission like a person's, never updated or deleted.
    Access {
        api_group: ICHOR,
        resource: "talosoperations",
        verbs: &["watch", "create"],
        scope: Scope::Cluster,
    },
    // The Paused condition.
    Access {
        api_group: ICHOR,
        resource: "talosoperations/status",
        verbs: &["patch"],
        scope: Scope::Cluster,
    },
    // The watch of TalosConfigPatches: a patch written re-renders its cluster's machines.
    Access {
        api_group: ICHOR,
        resource: "talosconfigpatches",
        verbs: &["watch"],
        scope: Scope::Cluster,
    },
    // The watch of TalosEtcdBackups, and their Ready and StoreInCluster conditions.
    Access {
        api_group: ICHOR,
        resource: "talosetcdbackups",
        verbs: &["watch"],
        scope: Scope::Cluster,
    },
    Access {
        api_group: ICHOR,
        resource: "talosetcdbackups/status",
        verbs: &["patch"],
        scope: Scope::Cluster,
    },
    // Node reachability, and cordoning a node before its machine leaves.
    Access {
        api_group: CORE,
        resource: "nodes",
        verbs: &["get", "patch"],
        scope: Scope::Cluster,
    },
    // The pods a drain evicts.
    Access {
        api_group: CORE,
        resource: "pods",
        verbs: &["list"],
        scope: Scope::Cluster,
    },
    // Each TalosCluster's own talosconfig (spec.talosConfigSecretRef), read live by name
    // when the controller dials that cluster's nodes (`nodes::Dialer`); never listed or
    // watched. RBAC cannot narrow this with resourceNames: each cluster names its Secret,
    // in its own namespace, after the chart is installed.
    Access {
        api_group: CORE,
        resource: "secrets",
        verbs: &["get"],
        scope: Scope::Cluster,
    },
    // Evictions honour PodDisruptionBudgets (never a plain pod delete).
    Access {
        api_group: CORE,
        resource: "pods/eviction",
        verbs: &["create"],
        scope: Scope::Cluster,
    },
    // RemovalRefused, DrainFailed, DeadMemberRemoved (events.k8s.io/v1; a repeated event
    // is a patch of its series).
    Access {
        api_group: EVENTS,
        resource: "events",
        verbs: &["create", "patch"],
        scope: Scope::Cluster,
    },
    // Leader election among the replicas, and the per-cluster lock of disruptive
    // operations: all Leases live in the operator's own namespace, none anywhere else
    // (`disruptive::lock_name` names a cluster's lock after its namespace and name).
    Access {
        api_group: COORDINATION,
        resource: "leases",
        verbs: &["get", "create", "update"],
        scope: Scope::LeaseNamespace,
    },
];

/// What a process serving `/metrics` with authentication (`--metrics-listen` without
/// `--metrics-insecure`) calls per scrape: a TokenReview of the bearer token, then a
/// SubjectAccessReview of `get` on the non-resource URL `/metrics` for its user.
pub const METRICS_AUTH: &[Access] = &[
    Access {
        api_group: AUTHENTICATION,
        resource: "tokenreviews",
        verbs: &["create"],
        scope: Scope::Cluster,
    },
    Access {
        api_group: AUTHORIZATION,
        resource: "subjectaccessreviews",
        verbs: &["create"],
        scope: Scope::Cluster,
    },
];

/// What a webhook replica managing its own certificates (`serve --tls-secret`, the
/// chart's default) calls: its Secret in the operator's namespace (read, created by the
/// first replica, replaced at rotation or repair), the Events saying why it was written
/// (about the Secret, in its namespace), and the ValidatingWebhookConfiguration whose
/// caBundle it sets (read, replaced). The chart narrows the Secret's gets and updates and
/// the configuration's to those two objects by name (`resourceNames`); a create cannot be
/// narrowed so.
pub const CERTS: &[Access] = &[
    Access {
        api_group: CORE,
        resource: "secrets",
        verbs: &["get", "create", "update"],
        scope: Scope::LeaseNamespace,
    },
    // CertificateCreated, CertificateRotated, CertificateRepaired (events.k8s.io/v1; a
    // repeated event is a patch of its series).
    Access {
        api_group: EVENTS,
        resource: "events",
        verbs: &["create", "patch"],
        scope: Scope::LeaseNamespace,
    },
    Access {
        api_group: ADMISSIONREGISTRATION,
        resource: "validatingwebhookconfigurations",
        verbs: &["get", "update"],
        scope: Scope::Cluster,
    },
];

/// What the webhook Deployment's ServiceAccount is granted: [`WEBHOOK`], with
/// authenticated metrics [`METRICS_AUTH`], and with certificates of its own [`CERTS`].
pub fn webhook_role(metrics_auth: bool, own_certs: bool) -> Vec<Access> {
    let mut out = WEBHOOK.to_vec();
    if metrics_auth {
        out.extend_from_slice(METRICS_AUTH);
    }
    if own_certs {
        out.extend_from_slice(CERTS);
    }
    out
}

/// What the controller Deployment's ServiceAccount is granted: [`REQUIRED`] (its own live
/// reads are the webhook's, its readiness probe too), and with authenticated metrics
/// [`METRICS_AUTH`].
pub fn controller_role(metrics_auth: bool) -> Vec<Access> {
    let mut out = REQUIRED.to_vec();
    if metrics_auth {
        out.extend_from_slice(METRICS_AUTH);
    }
    out
}

/// `role` as RBAC rules, one per API group and resource with its verbs in order of first
/// appearance, for `scope`.
pub fn rules_of(
    role: &[Access],
    scope: Scope,
) -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, &'static str, Vec<&'static str>)> = Vec::new();
    for a in role.iter().filter(|a| a.scope == scope) {
        match out
            .iter_mut()
            .find(|(g, r, _)| *g == a.api_group && *r == a.resource)
        {
            Some((_, _, verbs)) => {
                for v in a.verbs {
                    if !verbs.contains(v) {
                        verbs.push(v);
                    }
                }
            }
            None => out.push((a.api_group, a.resource, a.verbs.to_vec())),
        }
    }
    out
}

/// The text of `charts/ichor-rules/files/access.yaml`: each role's rules, cluster-wide
/// (the ClusterRole) and in the operator's namespace (the Role), as the chart renders them.
pub fn chart_access_yaml() -> String {
    fn list(out: &mut String, key: &str, rules: &[(&str, &str, Vec<&str>)]) {
        if rules.is_empty() {
            out.push_str(&format!("  {key}: []\n"));
            return;
        }
        out.push_str(&format!("  {key}:\n"));
        for (g, r, verbs) in rules {
            let verbs: Vec<String> = verbs.iter().map(|v| format!("{v:?}")).collect();
            out.push_str(&format!(
                "    - apiGroups: [{g:?}]\n      resources: [{r:?}]\n      verbs: [{}]\n",
                verbs.join(", ")
            ));
        }
    }
    let mut out = String::from(
        "# Generated from src/runtime/access.rs (chart_access_yaml); do not edit. tests/chart.rs\n\
         # prints the new text when the code's calls change.\n",
    );
    let roles: [(&str, Vec<Access>); 4] = [
        ("webhook", webhook_role(false, false)),
        ("controller", controller_role(false)),
        ("metricsAuth", METRICS_AUTH.to_vec()),
        ("certs", CERTS.to_vec()),
    ];
    for (name, role) in &roles {
        out.push_str(&format!("{name}:\n"));
        list(&mut out, "cluster", &rules_of(role, Scope::Cluster));
        list(
            &mut out,
            "namespace",
            &rules_of(role, Scope::LeaseNamespace),
        );
    }
    out
}

const fn concat<const N: usize>(a: &[Access], b: &[Access]) -> [Access; N] {
    assert!(a.len() + b.len() == N);
    let mut out = [a[0]; N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < b.len() {
        out[i + j] = b[j];
        j += 1;
    }
    out
}

const ALL: [Access; WEBHOOK.len() + CONTROLLER.len()] = concat(WEBHOOK, CONTROLLER);

/// The API calls of the webhook's live reads and of the controller, and nothing more:
/// [`WEBHOOK`] then [`CONTROLLER`].
pub const REQUIRED: &[Access] = &ALL;

/// Whether `REQUIRED` grants `verb` on `resource` of `api_group` in `scope` (a cluster-wide
/// grant covers the lease namespace too).
pub fn allows(api_group: &str, resource: &str, verb: &str, scope: Scope) -> bool {
    grants(REQUIRED, api_group, resource, verb, scope)
}

/// Whether `WEBHOOK` (what the chart grants with the controller off) grants `verb` on
/// `resource` of `api_group` in `scope`.
pub fn webhook_allows(api_group: &str, resource: &str, verb: &str, scope: Scope) -> bool {
    grants(WEBHOOK, api_group, resource, verb, scope)
}

fn grants(list: &[Access], api_group: &str, resource: &str, verb: &str, scope: Scope) -> bool {
    list.iter().any(|a| {
        a.api_group == api_group
            && a.resource == resource
            && a.verbs.contains(&verb)
            && (a.scope == scope || a.scope == Scope::Cluster)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn no_wildcards_and_no_repeats() {
        let mut seen = HashSet::new();
        for a in REQUIRED {
            assert!(
                !a.api_group.contains('*') && !a.resource.contains('*'),
                "{a:?}"
            );
            assert!(!a.verbs.is_empty(), "{a:?} grants nothing");
            for v in a.verbs {
                assert_ne!(*v, "*", "{a:?}");
                assert!(
                    seen.insert((a.api_group, a.resource, *v, a.scope)),
                    "{a:?} repeats `{v}`"
                );
            }
        }
    }

    #[test]
    fn cluster_grants_cover_the_lease_namespace_but_not_the_reverse() {
        assert!(allows(
            "coordination.k8s.io",
            "leases",
            "update",
            Scope::LeaseNamespace
        ));
        assert!(allows(
            ICHOR,
            "talosmachines",
            "patch",
            Scope::LeaseNamespace
        ));
        assert!(!allows(ICHOR, "talosmachines", "delete", Scope::Cluster));
        assert!(!allows(CORE, "pods", "delete", Scope::Cluster));
        // A cluster's talosconfig Secret is read by name; Secrets are never listed,
        // watched or written.
        assert!(allows(CORE, "secrets", "get", Scope::Cluster));
        for verb in ["list", "watch", "create", "update", "patch", "delete"] {
            assert!(!allows(CORE, "secrets", verb, Scope::Cluster), "{verb}");
        }
        assert!(!allows(ICHOR, "talosclusters", "update", Scope::Cluster));
    }

    #[test]
    fn required_is_the_webhook_then_the_controller() {
        assert_eq!(REQUIRED.len(), WEBHOOK.len() + CONTROLLER.len());
        assert_eq!(&REQUIRED[..WEBHOOK.len()], WEBHOOK);
        assert_eq!(&REQUIRED[WEBHOOK.len()..], CONTROLLER);
    }

    #[test]
    fn the_webhook_alone_only_reads_ichor_objects() {
        for a in WEBHOOK {
            assert_eq!(a.api_group, ICHOR, "{a:?}");
            assert_eq!(a.scope, Scope::Cluster, "{a:?}");
            assert!(!a.resource.contains('/'), "{a:?}");
            for v in a.verbs {
                assert!(["get", "list"].contains(v), "{a:?}");
            }
        }
        assert!(webhook_allows(
            ICHOR,
            "talosmachines",
            "list",
            Scope::Cluster
        ));
        assert!(webhook_allows(
            ICHOR,
            "talosclusters",
            "get",
            Scope::Cluster
        ));
        assert!(!webhook_allows(
            ICHOR,
            "talosmachines",
            "watch",
            Scope::Cluster
        ));
        assert!(!webhook_allows(
            COORDINATION,
            "leases",
            "get",
            Scope::LeaseNamespace
        ));
        assert!(allows(ICHOR, "talosmachines", "watch", Scope::Cluster));
    }
}
