//! `ichor-rules crds`: the CustomResourceDefinitions the chart ships, as the API server will
//! read them.

use serde_json::Value;
use std::process::Command;

fn crds() -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .arg("crds")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).expect("yaml");
            serde_json::to_value(v).expect("json")
        })
        .collect()
}

fn crd<'a>(all: &'a [Value], plural: &str) -> &'a Value {
    all.iter()
        .find(|c| c["spec"]["names"]["plural"] == plural)
        .unwrap_or_else(|| panic!("no CRD for {plural}"))
}

fn schema(c: &Value) -> &Value {
    &c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

fn columns(c: &Value) -> Vec<String> {
    c["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| p["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn four_namespaced_kinds_with_status_subresources() {
    let all = crds();
    assert_eq!(all.len(), 5);
    for (plural, kind, short) in [
        ("talosclusters", "TalosCluster", "tc"),
        ("talosmachines", "TalosMachine", "tm"),
        ("talosoperations", "TalosOperation", "top"),
        ("talosetcdbackups", "TalosEtcdBackup", "teb"),
    ] {
        let c = crd(&all, plural);
        assert_eq!(c["apiVersion"], "apiextensions.k8s.io/v1");
        assert_eq!(c["metadata"]["name"], format!("{plural}.ichor.maesh.dev"));
        assert_eq!(c["spec"]["group"], "ichor.maesh.dev");
        assert_eq!(c["spec"]["scope"], "Namespaced");
        assert_eq!(c["spec"]["names"]["kind"], kind);
        assert_eq!(c["spec"]["names"]["shortNames"][0], short);
        let v = &c["spec"]["versions"][0];
        assert_eq!(v["name"], "v1alpha1");
        assert_eq!(v["served"], true);
        assert_eq!(v["storage"], true);
        assert!(
            v["subresources"]["status"].is_object(),
            "{plural} has a status subresource"
        );
    }
}

#[test]
fn schemas_validate_the_closed_values() {
    let all = crds();
    let cluster = schema(crd(&all, "talosclusters"));
    let count = &cluster["properties"]["spec"]["properties"]["controlPlane"]["properties"]["count"];
    assert_eq!(count["enum"], serde_json::json!([1, 3, 5]));
    assert_eq!(
        count["enum"],
        serde_json::json!(ichor_rules::vocab::CONTROL_PLANE_COUNTS),
        "the CRD's counts are the vocabulary's"
    );
    assert!(
        count.get("default").is_none(),
        "a default outside the enum is invalid"
    );
    let sched = &cluster["properties"]["spec"]["properties"]["schedulable"];
    assert_eq!(sched["enum"], serde_json::json!(["true", "false"]));

    let machine = schema(crd(&all, "talosmachines"));
    let role = &machine["properties"]["spec"]["properties"]["role"];
    // Exactly the two roles: no `null` among them, and not nullable.
    assert_eq!(role["enum"], serde_json::json!(["controlplane", "worker"]));
    assert_eq!(
        role["enum"],
        serde_json::json!(ichor_rules::vocab::EnumKind::Role.values()),
        "the CRD's roles are the vocabulary's"
    );
    assert!(role.get("nullable").is_none(), "{role}");
    let spec = &machine["properties"]["spec"]["properties"];
    for field in [
        "clusterRef",
        "approved",
        "approvalDecision",
        "endpoint",
        "hostname",
    ] {
        assert!(spec.get(field).is_some(), "TalosMachine spec.{field}");
    }

    let op = schema(crd(&all, "talosoperations"));
    let kinds: Vec<&str> = op["properties"]["spec"]["properties"]["kind"]["enum"]
        .as_array()
        .expect("kind is an enum")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        kinds,
        ichor_rules::vocab::OPERATION_KINDS,
        "the CRD and the rules agree on kinds"
    );
}

#[test]
fn printer_columns_show_what_a_person_wants() {
    let all = crds();
    let m = columns(crd(&all, "talosmachines"));
    for c in ["Cluster", "Role", "Approved", "Ready", "Age"] {
        assert!(m.iter().any(|x| x == c), "TalosMachine column {c}: {m:?}");
    }
    let c = columns(crd(&all, "talosclusters"));
    for x in ["Count", "Schedulable", "Transitioning"] {
        assert!(c.iter().any(|y| y == x), "TalosCluster column {x}: {c:?}");
    }
    let o = columns(crd(&all, "talosoperations"));
    for x in ["Kind", "Phase", "Cluster"] {
        assert!(o.iter().any(|y| y == x), "TalosOperation column {x}: {o:?}");
    }
}

#[test]
fn objects_round_trip_through_the_types() {
    use ichor_rules::runtime::objects::TalosMachine;
    let json = serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosMachine",
        "metadata": {"name": "cp-1", "namespace": "infra"},
        "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true,
                 "approvalDecision": {"at": "2026-10-26T12:00:00Z"}},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "NodeUnreachable"}]}
    });
    let m: TalosMachine = serde_json::from_value(json.clone()).expect("valid");
    assert!(m.node_unreachable());
    let back = serde_json::to_value(&m).expect("serializes");
    assert_eq!(back["apiVersion"], "ichor.maesh.dev/v1alpha1");
    assert_eq!(back["kind"], "TalosMachine");
    assert_eq!(
        back["spec"]["approvalDecision"]["at"],
        "2026-10-26T12:00:00Z"
    );
}

/// A TalosOperation's spec never changes once created: the API server refuses the edit
/// (a CEL transition rule on `spec`), so an admitted operation cannot be edited into one
/// the rules would refuse. Only the operation's spec: the others' specs change freely.
#[test]
fn an_operations_spec_is_immutable() {
    let all = crds();
    let rules = |plural: &str| {
        schema(crd(&all, plural))["properties"]["spec"]["x-kubernetes-validations"].clone()
    };
    assert_eq!(
        rules("talosoperations")[0]["rule"],
        "self == oldSelf",
        "{}",
        rules("talosoperations")
    );
    assert!(
        rules("talosoperations")[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec is immutable")),
    );
    assert!(rules("talosmachines").is_null());
    assert!(rules("talosclusters").is_null());
}

/// Issue 37: TalosConfigPatch is namespaced, selectable by its cluster like the others, and
/// its selector's role is the closed enum; TalosCluster names its base Secret.
#[test]
fn the_config_patch_kind_and_the_base_secret() {
    let all = crds();
    let c = crd(&all, "talosconfigpatches");
    assert_eq!(c["spec"]["scope"], "Namespaced");
    assert_eq!(c["spec"]["names"]["kind"], "TalosConfigPatch");
    assert_eq!(c["spec"]["names"]["shortNames"][0], "tcp");
    let v = &c["spec"]["versions"][0];
    assert_eq!(
        v["selectableFields"][0]["jsonPath"],
        ".spec.clusterRef.name"
    );
    let spec = &schema(c)["properties"]["spec"]["properties"];
    assert_eq!(
        spec["selector"]["properties"]["role"]["enum"],
        serde_json::json!(["controlplane", "worker"])
    );
    assert!(spec["selector"]["properties"]["labelSelector"].is_object());
    assert!(spec["patches"]["properties"]["strategic"].is_object());
    assert!(spec["patches"]["properties"]["json6902"].is_object());
    assert_eq!(spec["order"]["type"], "integer");
    let cluster = schema(crd(&all, "talosclusters"));
    assert!(
        cluster["properties"]["spec"]["properties"]["baseConfigSecretRef"]["properties"]["name"]
            .is_object()
    );
    assert!(cluster["properties"]["status"]["properties"]["redactedBase"].is_object());
}
