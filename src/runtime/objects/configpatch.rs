//! `TalosConfigPatch`: a change of the Talos configuration of some machines of a cluster
//! (issue 37), and the two fields of a TalosCluster it renders against.

use super::{ClusterRef, Role, TalosMachine, name_of, namespace_of, role_schema};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which machines of the cluster a patch changes: all of the given criteria hold (none
/// given: every machine of the cluster).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PatchSelector {
    /// Only machines of this role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "role_schema")]
    pub role: Option<Role>,
    /// Only these TalosMachines (by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<String>,
    /// Only TalosMachines whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
}

/// The patch itself, in Talos' two forms (applied in this order).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PatchBody {
    /// A strategic merge patch: multi-document YAML as `talosctl --config-patch` takes it
    /// (maps merge, lists append, keyed lists merge by key, `$patch: delete` deletes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 524288))]
    pub strategic: Option<String>,
    /// RFC 6902 JSON patch operations (YAML or JSON) against the `v1alpha1` machine config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 524288))]
    pub json6902: Option<String>,
}

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosConfigPatch",
    doc = "A patch of the Talos configuration of some machines of a TalosCluster, dry-rendered at admission.",
    namespaced,
    selectable = ".spec.clusterRef.name",
    shortname = "tcp",
    category = "ichor",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Order","type":"integer","jsonPath":".spec.order"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ConfigPatchSpec {
    #[serde(default)]
    pub cluster_ref: ClusterRef,
    #[serde(default)]
    pub selector: PatchSelector,
    /// Patches apply in ascending order, then by name.
    #[serde(default)]
    pub order: i32,
    #[serde(default)]
    pub patches: PatchBody,
}

impl TalosConfigPatch {
    pub fn name(&self) -> &str {
        name_of(&self.metadata)
    }

    pub fn namespace(&self) -> &str {
        namespace_of(&self.metadata)
    }

    pub fn cluster(&self) -> &str {
        &self.spec.cluster_ref.name
    }

    /// Whether the patch selects this machine (of its namespace and cluster; approved or
    /// not: the caller decides whom to render).
    pub fn selects(&self, m: &TalosMachine) -> bool {
        if m.namespace() != self.namespace() || m.cluster() != self.cluster() {
            return false;
        }
        let s = &self.spec.selector;
        if s.role.is_some() && m.spec.role != s.role {
            return false;
        }
        if !s.machines.is_empty() && !s.machines.iter().any(|n| n == m.name()) {
            return false;
        }
        match &s.label_selector {
            Some(sel) => labels_match(sel, m.metadata.labels.as_ref()),
            None => true,
        }
    }
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`: `In`, `NotIn`,
/// `Exists`, `DoesNotExist`; an unknown operator matches nothing).
pub fn labels_match(
    sel: &LabelSelector,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k));
    if let Some(ml) = &sel.match_labels
        && !ml.iter().all(|(k, v)| get(k) == Some(v))
    {
        return false;
    }
    sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or(&[]);
        match e.operator.as_str() {
            "In" => get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => get(&e.key).is_some(),
            "DoesNotExist" => get(&e.key).is_none(),
            _ => false,
        }
    })
}

/// The patches that select a machine, in the order they apply: `spec.order`, then name.
pub fn patches_for<'p>(
    patches: impl IntoIterator<Item = &'p TalosConfigPatch>,
    m: &TalosMachine,
) -> Vec<&'p TalosConfigPatch> {
    let mut out: Vec<&TalosConfigPatch> = patches.into_iter().filter(|p| p.selects(m)).collect();
    out.sort_by(|a, b| (a.spec.order, a.name()).cmp(&(b.spec.order, b.name())));
    out
}

/// The Secret holding the cluster's base configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaseConfigRef {
    /// Name of the Secret, in the TalosCluster's namespace, with the keys
    /// `controlplane.yaml` and `worker.yaml` as `talosctl gen config` writes them.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The base configuration with every secret value replaced by a placeholder, published by
/// the controller so the webhook can dry-render patches without reading Secrets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedactedBase {
    /// sha256 of the base Secret's two texts it was made from.
    pub digest: String,
    pub controlplane: String,
    pub worker: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(json: serde_json::Value) -> LabelSelector {
        serde_json::from_value(json).expect("a label selector")
    }

    fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_label_selector_matches_as_kubernetes_does() {
        let zone_a = labels(&[("zone", "a"), ("disk", "nvme")]);
        let zone_b = labels(&[("zone", "b")]);
        let by_label = selector(serde_json::json!({"matchLabels": {"zone": "a"}}));
        assert!(labels_match(&by_label, Some(&zone_a)));
        assert!(!labels_match(&by_label, Some(&zone_b)));
        assert!(!labels_match(&by_label, None));
        let in_ = selector(serde_json::json!({"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a", "c"]}]}));
        assert!(labels_match(&in_, Some(&zone_a)));
        assert!(!labels_match(&in_, Some(&zone_b)));
        let not_in = selector(serde_json::json!({"matchExpressions": [
            {"key": "zone", "operator": "NotIn", "values": ["a"]}]}));
        assert!(!labels_match(&not_in, Some(&zone_a)));
        assert!(labels_match(&not_in, Some(&zone_b)));
        assert!(labels_match(&not_in, None), "NotIn matches a missing label");
        let exists = selector(serde_json::json!({"matchExpressions": [
            {"key": "disk", "operator": "Exists"}]}));
        assert!(labels_match(&exists, Some(&zone_a)));
        assert!(!labels_match(&exists, Some(&zone_b)));
        let absent = selector(serde_json::json!({"matchExpressions": [
            {"key": "disk", "operator": "DoesNotExist"}]}));
        assert!(!labels_match(&absent, Some(&zone_a)));
        assert!(labels_match(&absent, Some(&zone_b)));
        // Every term must hold; an unknown operator matches nothing.
        let both = selector(serde_json::json!({"matchLabels": {"zone": "a"},
            "matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]}));
        assert!(!labels_match(&both, Some(&zone_a)));
        let odd = selector(serde_json::json!({"matchExpressions": [
            {"key": "zone", "operator": "Gt", "values": ["a"]}]}));
        assert!(!labels_match(&odd, Some(&zone_a)));
        // An empty selector selects every machine.
        assert!(labels_match(&selector(serde_json::json!({})), None));
    }

    #[test]
    fn patches_apply_by_order_then_name_and_only_the_selecting_ones() {
        let patch = |name: &str, order: i32, machines: &[&str]| -> TalosConfigPatch {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosConfigPatch",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"clusterRef": {"name": "c"}, "order": order,
                         "selector": {"machines": machines},
                         "patches": {"strategic": "version: v1alpha1\n"}}
            }))
            .expect("a patch")
        };
        let m: TalosMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": "cp-1", "namespace": "ns"},
            "spec": {"clusterRef": {"name": "c"}, "role": "controlplane", "approved": true}
        }))
        .expect("a machine");
        // A lower name with a higher order comes later, and so wins what both set.
        let all = [
            patch("a-late", 10, &["cp-1"]),
            patch("z-early", -5, &["cp-1"]),
            patch("m", 0, &["cp-1"]),
            patch("b", 0, &["cp-1"]),
            patch("other", 0, &["cp-2"]),
        ];
        let names: Vec<&str> = patches_for(all.iter(), &m)
            .iter()
            .map(|p| p.name())
            .collect();
        assert_eq!(names, ["z-early", "b", "m", "a-late"]);
    }
}
