//! Objects from text: an objects file (`eval`, `test`) or an AdmissionReview's objects,
//! checked as the CRDs' schemas and the API server would.

use super::{
    API_VERSION, ObjectMeta, Snapshot, TalosCluster, TalosConfigPatch, TalosEtcdBackup,
    TalosMachine, TalosOperation,
};
use serde::Deserialize;

pub use crate::runtime::nesting::MAX_NESTING;

/// Why an objects file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "line {line}, column {column}: nested more than {MAX_NESTING} levels deep; Kubernetes objects nest far less, so this is not an objects file ichor-rules can read"
    )]
    TooDeep { line: usize, column: usize },
    #[error("document {doc}: not valid YAML: {source}")]
    Yaml {
        doc: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("document {doc}{what}: {message}")]
    Object {
        doc: usize,
        what: String,
        message: String,
    },
}

/// One of our objects, typed.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Machine(TalosMachine),
    Cluster(TalosCluster),
    Operation(TalosOperation),
    Backup(TalosEtcdBackup),
    Patch(TalosConfigPatch),
}

impl Object {
    /// Its kind, as `kind:` spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Machine(_) => "TalosMachine",
            Object::Cluster(_) => "TalosCluster",
            Object::Operation(_) => "TalosOperation",
            Object::Backup(_) => "TalosEtcdBackup",
            Object::Patch(_) => "TalosConfigPatch",
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Machine(m) => &m.metadata,
            Object::Cluster(c) => &c.metadata,
            Object::Operation(o) => &o.metadata,
            Object::Backup(b) => &b.metadata,
            Object::Patch(p) => &p.metadata,
        }
    }
}

/// Turns a JSON/YAML object into one of our kinds. Any other apiVersion or kind is an
/// error that says what was found and, for a likely typo, what was meant.
pub fn object_from_value(value: serde_json::Value) -> Result<Object, String> {
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).unwrap_or("");
    let clip = |s: &str| {
        s.chars()
            .take(80)
            .flat_map(char::escape_debug)
            .collect::<String>()
    };
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let Some(known) = KINDS.into_iter().find(|k| *k == kind) else {
        let hint = match crate::diagnostics::did_you_mean(kind, KINDS) {
            Some(k) if !kind.is_empty() => format!("did you mean `{k}`? "),
            _ => String::new(),
        };
        let found = if kind.is_empty() {
            "it has no `kind`".to_string()
        } else {
            format!("`{}` is not a kind ichor-rules reads", clip(kind))
        };
        return Err(format!(
            "{found}; {hint}an objects file holds only {API_VERSION} TalosClusters, \
             TalosMachines, TalosOperations, TalosEtcdBackups and TalosConfigPatches (a \
             stream or a `kind: List`)"
        ));
    };
    if api_version != API_VERSION {
        let found = if api_version.is_empty() {
            "it has no `apiVersion`".to_string()
        } else {
            format!("apiVersion `{}` is not served", clip(api_version))
        };
        return Err(format!(
            "{found}; the CRDs serve {known} as apiVersion {API_VERSION}"
        ));
    }
    typed_object(known, value)
}

/// Turns a JSON object into the named kind.
pub fn typed_object(kind: &str, value: serde_json::Value) -> Result<Object, String> {
    fn de<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }
    let object = match kind {
        "TalosMachine" => de(value).map(Object::Machine),
        "TalosCluster" => de(value).map(Object::Cluster),
        "TalosOperation" => de(value).map(Object::Operation),
        "TalosEtcdBackup" => de(value).map(Object::Backup),
        "TalosConfigPatch" => de(value).map(Object::Patch),
        other => Err(format!("`{other}` is not a kind ichor-rules decides about")),
    }?;
    validate_object(&object)?;
    Ok(object)
}

/// Turns the JSON text of an object into the named kind, as [`typed_object`] turns a value,
/// in one typed parse (no value tree first). `namespace` fills in a namespace the object
/// omits (or leaves null), before the object is validated: what a namespaced request's
/// objects may do.
pub fn typed_object_text(
    kind: &str,
    text: &str,
    namespace: Option<&str>,
) -> Result<Object, String> {
    fn de<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }
    let mut object = match kind {
        "TalosMachine" => de(text).map(Object::Machine),
        "TalosCluster" => de(text).map(Object::Cluster),
        "TalosOperation" => de(text).map(Object::Operation),
        "TalosEtcdBackup" => de(text).map(Object::Backup),
        "TalosConfigPatch" => de(text).map(Object::Patch),
        other => Err(format!("`{other}` is not a kind ichor-rules decides about")),
    }?;
    if let Some(namespace) = namespace {
        let meta = match &mut object {
            Object::Machine(m) => &mut m.metadata,
            Object::Cluster(c) => &mut c.metadata,
            Object::Operation(o) => &mut o.metadata,
            Object::Backup(b) => &mut b.metadata,
            Object::Patch(p) => &mut p.metadata,
        };
        if meta.namespace.is_none() {
            meta.namespace = Some(namespace.to_string());
        }
    }
    validate_object(&object)?;
    Ok(object)
}

/// What the CRDs' schemas enforce in a cluster, enforced on objects read from files (and
/// on the objects of a review, which the API server validated before asking, and of live
/// reads).
pub fn validate_object(object: &Object) -> Result<(), String> {
    match object {
        Object::Cluster(c) => {
            let count = c.spec.control_plane.count;
            if ![1, 3, 5].contains(&count) {
                return Err(format!(
                    "spec.controlPlane.count is {count}; it must be 1, 3 or 5"
                ));
            }
            if let Some(s) = c.spec.schedulable.as_deref()
                && s != "true"
                && s != "false"
            {
                return Err(format!(
                    "spec.schedulable is {s:?}; it must be \"true\" or \"false\""
                ));
            }
            if let Some(r) = &c.spec.talos_config_secret_ref {
                if r.name.is_empty() || r.name.len() > 253 {
                    return Err(
                        "spec.talosConfigSecretRef.name must name a Secret (1 to 253 characters)"
                            .into(),
                    );
                }
                if r.key
                    .as_ref()
                    .is_some_and(|k| k.is_empty() || k.len() > 253)
                {
                    return Err(
                        "spec.talosConfigSecretRef.key must be 1 to 253 characters, or omitted (then `talosconfig`)"
                            .into(),
                    );
                }
            }
        }
        Object::Operation(o) => {
            let kind = o.spec.kind.as_str();
            if !crate::vocab::OPERATION_KINDS.contains(&kind) {
                return Err(format!(
                    "spec.kind is {kind:?}; it must be one of {}",
                    crate::vocab::OPERATION_KINDS.join(", ")
                ));
            }
        }
        Object::Machine(_) | Object::Backup(_) | Object::Patch(_) => {}
    }
    Ok(())
}

/// The kinds an objects file may hold, as `kubectl get -o yaml` prints them.
const KINDS: [&str; 5] = [
    "TalosCluster",
    "TalosMachine",
    "TalosOperation",
    "TalosEtcdBackup",
    "TalosConfigPatch",
];

/// Loads the objects of a YAML stream: several documents, or `kind: List` (or a
/// `TalosMachineList` and the like) with `items`. Every object must be one of our kinds at
/// the served version, with a name and a namespace, and appear once: anything else is bad
/// input, named by its document (and item), never silently skipped: a skipped object
/// would change what is counted, and so the decision.
pub fn load_snapshot(text: &str) -> Result<Snapshot, LoadError> {
    let docs = crate::runtime::nesting::yaml(text).map_err(
        |crate::runtime::nesting::TooDeep { line, column }| LoadError::TooDeep { line, column },
    )?;
    let mut snap = Snapshot::default();
    let mut seen: std::collections::HashMap<(&'static str, String, String), String> =
        Default::default();
    for (i, doc) in docs.enumerate() {
        let doc_no = i + 1;
        let value = serde_yaml::Value::deserialize(doc).map_err(|source| LoadError::Yaml {
            doc: doc_no,
            source,
        })?;
        if value.is_null() {
            continue;
        }
        let json: serde_json::Value =
            serde_json::to_value(&value).map_err(|e| LoadError::Object {
                doc: doc_no,
                what: String::new(),
                message: format!("cannot be read as an object: {e}"),
            })?;
        let doc_kind = json.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        let is_list = doc_kind == "List"
            || KINDS
                .iter()
                .any(|k| doc_kind.strip_suffix("List") == Some(k));
        let items: Vec<(String, serde_json::Value)> = if is_list {
            match json.get("items") {
                Some(serde_json::Value::Array(items)) => items
                    .iter()
                    .enumerate()
                    .map(|(n, item)| (format!(", item {}", n + 1), item.clone()))
                    .collect(),
                _ => {
                    return Err(LoadError::Object {
                        doc: doc_no,
                        what: format!(" ({doc_kind})"),
                        message: "`items` must be a list of objects".into(),
                    });
                }
            }
        } else if json.get("items").is_some() {
            let hint = match crate::diagnostics::did_you_mean(doc_kind, ["List"]) {
                Some(_) => "did you mean `List`? ",
                None => "",
            };
            return Err(LoadError::Object {
                doc: doc_no,
                what: describe(&json),
                message: format!(
                    "a document with `items` is a `kind: List` (or a TalosMachineList, \
                     TalosClusterList or TalosOperationList); {hint}its kind is `{}`",
                    doc_kind
                        .chars()
                        .take(80)
                        .flat_map(char::escape_debug)
                        .collect::<String>()
                ),
            });
        } else {
            vec![(String::new(), json)]
        };
        for (at, item) in items {
            if !item.is_object() {
                return Err(LoadError::Object {
                    doc: doc_no,
                    what: at,
                    message: "expected a Kubernetes object (a mapping with apiVersion and kind)"
                        .into(),
                });
            }
            let what = format!("{at}{}", describe(&item));
            let bad = |message: String| LoadError::Object {
                doc: doc_no,
                what: what.clone(),
                message,
            };
            let object = object_from_value(item).map_err(bad)?;
            let kind = object.kind();
            let (ns, name) = (
                object.metadata().namespace.clone(),
                object.metadata().name.clone(),
            );
            let name = name.filter(|n| !n.is_empty()).ok_or_else(|| {
                bad("`metadata.name` is missing; every object needs its name".into())
            })?;
            let ns = ns.filter(|n| !n.is_empty()).ok_or_else(|| {
                bad(format!(
                    "`metadata.namespace` is missing; a {kind} is namespaced, and without it \
                     the object would count in no namespace (`kubectl get -o yaml` prints it)"
                ))
            })?;
            let here = format!("document {doc_no}{at}");
            if let Some(first) = seen.insert((kind, ns.clone(), name.clone()), here) {
                return Err(bad(format!(
                    "{kind} {ns}/{name} appears twice (first in {first}); each object must \
                     appear once, or it would be counted twice"
                )));
            }
            match object {
                Object::Machine(m) => snap.machines.push(m),
                Object::Cluster(c) => snap.clusters.push(c),
                Object::Operation(o) => snap.operations.push(o),
                Object::Backup(b) => snap.backups.push(b),
                Object::Patch(p) => snap.patches.push(p),
            }
        }
    }
    Ok(snap)
}

fn describe(v: &serde_json::Value) -> String {
    let s = |path: &[&str]| {
        path.iter()
            .try_fold(v, |v, k| v.get(k))
            .and_then(|v| v.as_str())
            .map(|s| {
                s.chars()
                    .take(80)
                    .flat_map(char::escape_debug)
                    .collect::<String>()
            })
    };
    let kind = s(&["kind"]).unwrap_or_else(|| "object".into());
    let name = s(&["metadata", "name"]).unwrap_or_else(|| "?".into());
    match s(&["metadata", "namespace"]) {
        Some(ns) => format!(" ({kind} {ns}/{name})"),
        None => format!(" ({kind} {name})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::objects::Role;

    #[test]
    fn every_object_is_ours_named_namespaced_and_once() {
        let m = |meta: &str| {
            format!(
                "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata: {meta}\nspec: {{role: worker}}\n"
            )
        };
        for (text, says) in [
            ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: ns}\n".to_string(),
             "document 1 (ConfigMap ns/x): `ConfigMap` is not a kind ichor-rules reads"),
            (m("{name: a, namespace: ns}").replace("TalosMachine", "TalosMachin"),
             "did you mean `TalosMachine`?"),
            (m("{name: a, namespace: ns}").replace("v1alpha1", "v1alpah1"),
             "apiVersion `ichor.maesh.dev/v1alpah1` is not served"),
            (m("{name: a, namespace: ns}").replace("kind: TalosMachine\n", ""),
             "it has no `kind`"),
            (m("{name: a}"), "document 1 (TalosMachine a): `metadata.namespace` is missing"),
            (m("{namespace: ns}"), "`metadata.name` is missing"),
            (format!("{}---\n{}", m("{name: a, namespace: ns}"), m("{name: a, namespace: ns}")),
             "document 2 (TalosMachine ns/a): TalosMachine ns/a appears twice (first in document 1)"),
            ("apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: s}}\n".to_string(),
             "document 1, item 1 (Secret s)"),
            ("apiVersion: v1\nkind: List\nitems: null\n".to_string(), "`items` must be a list"),
            ("apiVersion: v1\nkind: Lisst\nitems: []\n".to_string(), "did you mean"),
        ] {
            let err = load_snapshot(&text).expect_err(&text).to_string();
            assert!(err.contains(says), "{text}\n{err}");
        }
    }

    #[test]
    fn nesting_is_capped_before_parsing() {
        let started = std::time::Instant::now();
        let err = load_snapshot(&"[".repeat(60_000)).expect_err("too deep");
        assert!(matches!(err, LoadError::TooDeep { line: 1, .. }), "{err}");
        assert!(
            err.to_string().contains("nested more than 128 levels"),
            "{err}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn loads_streams_and_lists() {
        let text = r#"
apiVersion: ichor.maesh.dev/v1alpha1
kind: TalosCluster
metadata: {name: c, namespace: ns}
spec: {controlPlane: {count: 3}, schedulable: false}
---
apiVersion: v1
kind: List
items:
- apiVersion: ichor.maesh.dev/v1alpha1
  kind: TalosMachine
  metadata: {name: cp1, namespace: ns}
  spec: {clusterRef: {name: c}, role: controlplane, approved: true}
"#;
        let s = load_snapshot(text).expect("loads");
        assert_eq!(s.clusters.len(), 1);
        assert!(!s.clusters[0].schedulable());
        assert_eq!(s.machines.len(), 1);
        assert_eq!(s.machines[0].approved_role(), Some(Role::ControlPlane));
    }

    #[test]
    fn a_bad_field_names_the_document_and_object() {
        let text = "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata: {name: m}\nspec: {role: boss}\n";
        let err = load_snapshot(text).expect_err("bad role").to_string();
        assert!(err.contains("document 1 (TalosMachine m)"), "{err}");
        assert!(err.contains("boss"), "{err}");
    }

    #[test]
    fn parked_needs_paused_transitioning_and_no_failure() {
        let mut op: TalosOperation = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "u"},
            "spec": {"clusterRef": {"name": "c"}, "kind": "upgrade"},
            "status": {"phase": "Paused", "conditions": [
                {"type": "Paused", "status": "True", "reason": "ClusterTransitioning"}]}
        }))
        .expect("valid");
        assert!(op.parked(&crate::ruleset::shipped_table()));
        if let Some(s) = op.status.as_mut() {
            s.failure_reason = Some("boom".into());
        }
        assert!(!op.parked(&crate::ruleset::shipped_table()));
    }
}
