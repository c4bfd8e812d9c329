//! Every Kubernetes API call the operator makes, as RBAC sees it: the one list the chart's
//! ClusterRole and Role grant, verb for verb (tests/chart.rs compares them), and that the
//! controller's recorded calls must stay within.
//!
//! It comes in two disjoint parts: [`WEBHOOK`], what a replica serving only the webhook
//! calls (`serve --no-controller`: the live reads of `live.rs` and the readiness probe of
//! `serve`), and [`CONTROLLER`], what the controller adds. [`REQUIRED`] is both together;
//! the chart grants `REQUIRED` with the controller on and `WEBHOOK` alone with it off.

/// Where a grant applies.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every namespace (a ClusterRole): the TalosCluster, TalosMachine and TalosOperation
    /// objects, nodes, pods and the per-cluster locks live wherever the clusters are.
    Cluster,
    /// Only the release namespace (a Role): the controller's leader-election Lease.
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

/// The API calls of the webhook alone (`serve --no-controller`), and nothing more: the live
/// reads of a decision (`LiveReader::snapshot`: a LIST of the request's namespace's
/// TalosMachines and TalosOperations, a GET of the TalosCluster) and the readiness probe of
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
    // The Transitioning condition.
    Access {
        api_group: ICHOR,
        resource: "talosclusters/status",
        verbs: &["patch"],
        scope: Scope::Cluster,
    },
    Access {
        api_group: ICHOR,
        resource: "talosoperations",
        verbs: &["watch"],
        scope: Scope::Cluster,
    },
    // The Paused condition.
    Access {
        api_group: ICHOR,
        resource: "talosoperations/status",
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
    // The per-cluster lock of disruptive operations: a Lease in each TalosCluster's
    // namespace.
    Access {
        api_group: COORDINATION,
        resource: "leases",
        verbs: &["get", "create", "update"],
        scope: Scope::Cluster,
    },
    // Leader election among the replicas.
    Access {
        api_group: COORDINATION,
        resource: "leases",
        verbs: &["get", "create", "update"],
        scope: Scope::LeaseNamespace,
    },
];

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
        assert!(!allows(CORE, "secrets", "get", Scope::Cluster));
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
