//! Talos' strategic merge over untyped documents (the facts from Talos' own
//! `pkg/machinery/config/merge` and `configpatcher`, reimplemented):
//!
//! - documents are matched by (apiVersion, kind, name); the machine config (`version:
//!   v1alpha1`, no kind) is one document; a patch document with no match is appended;
//! - maps merge key by key; a scalar replaces the base's unless it is `""` or `0` (Talos
//!   skips the zero value of a plain field; `false` always replaces); `null` changes
//!   nothing. Talos merges its typed documents, so a `""` or `0` through a pointer field
//!   (`kubespan.mtu`, `apiPort`) replaces there, and keeps the base's here;
//!   docs/operators.md lists every such difference;
//! - lists append, except the keyed lists ([`KEYED_LISTS`]: an item with the same key
//!   merges into the base's, or replaces it) and the replaced values ([`REPLACED`]), in the
//!   machine config and the newer documents alike;
//! - an argument of an `extraArgs` map ([`ARGS`]) replaces the base's whole (a list of
//!   values too; `""` is set);
//! - `$patch: delete` deletes: a whole document (at its top level; one that is not there is
//!   skipped, as in Talos), a map key (`key: {$patch: delete}`), or the list items whose
//!   `key: value` the item names; deleting a key or items that are not there is an error
//!   (Talos' too for a map's key or an item; a field of its typed struct it zeroes, set or
//!   not: docs/operators.md);
//! - a map, a list and a scalar never merge into one another (an error names the path).

use super::{RenderError, secret_key};
use serde_json::{Map, Value};

/// The machine config's name in [`KEYED_LISTS`] and [`REPLACED`]; any other document is
/// named by its `kind`.
pub const MACHINE_CONFIG: &str = "v1alpha1";

/// How a keyed list's item with the same key as one of the base's lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyed {
    /// Merged into the base's item.
    Merge,
    /// In place of the base's item.
    Replace,
}

/// Lists merged item by item on a key (Talos' own `Merge` of `NetworkDeviceList`,
/// `VlanList`, `AdmissionPluginConfigList`, `ConfigFileList` and `ImageVerificationRules`):
/// the document, the path (`*` is any list item), the keys (the first one an item has
/// deciding) and what a matching item does.
pub const KEYED_LISTS: &[(&str, &[&str], &[&str], Keyed)] = &[
    (
        MACHINE_CONFIG,
        &["machine", "network", "interfaces"],
        &["interface", "deviceSelector"],
        Keyed::Merge,
    ),
    (
        MACHINE_CONFIG,
        &["machine", "network", "interfaces", "*", "vlans"],
        &["vlanId"],
        Keyed::Merge,
    ),
    (
        MACHINE_CONFIG,
        &["cluster", "apiServer", "admissionControl"],
        &["name"],
        Keyed::Merge,
    ),
    (
        "ExtensionServiceConfig",
        &["configFiles"],
        &["mountPath"],
        Keyed::Merge,
    ),
    (
        "ImageVerificationConfig",
        &["rules"],
        &["imagePattern"],
        Keyed::Replace,
    ),
];

/// Values a patch replaces whole (Talos' `merge:"replace"`), by document.
pub const REPLACED: &[(&str, &[&str])] = &[
    (MACHINE_CONFIG, &["cluster", "network", "podSubnets"]),
    (MACHINE_CONFIG, &["cluster", "network", "serviceSubnets"]),
    (MACHINE_CONFIG, &["cluster", "apiServer", "auditPolicy"]),
    ("CRIBaseRuntimeSpecConfig", &["overrides"]),
    ("KubeAuditPolicyConfig", &["configuration"]),
    ("KubeAuthenticationConfig", &["configuration"]),
    ("KubeCredentialProviderConfig", &["configuration"]),
    ("KubeNetworkConfig", &["podSubnets"]),
    ("KubeNetworkConfig", &["serviceSubnets"]),
    ("KubeStaticPodConfig", &["pod"]),
    ("BGPInstanceConfig", &["advertise"]),
    ("BGPInstanceConfig", &["importRoutes"]),
    ("BGPInstanceConfig", &["neighbors"]),
    ("NetworkRuleConfig", &["ingress"]),
    ("NetworkRuleConfig", &["portSelector", "ports"]),
];

/// The maps of arguments (Talos' `meta.Args`: every `extraArgs`, in the machine config and
/// the Kubernetes component documents): a patch's argument replaces the base's whole, a
/// list of values included (Talos' `maps.Copy`), and an empty one is set as it is.
pub const ARGS: &str = "extraArgs";

pub(super) const DELETE: &str = "$patch";

fn path_is(path: &[String], pattern: &[&str]) -> bool {
    path.len() == pattern.len() && path.iter().zip(pattern).all(|(p, q)| *q == "*" || p == q)
}

fn dotted(path: &[String]) -> String {
    if path.is_empty() {
        "(the document)".to_string()
    } else {
        path.join(".")
    }
}

fn is_delete(v: &Value) -> bool {
    matches!(v, Value::Object(m) if m.get(DELETE).and_then(Value::as_str) == Some("delete"))
}

fn shape(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "a map",
        Value::Array(_) => "a list",
        Value::Null => "null",
        _ => "a scalar",
    }
}

/// The identity of a document: `v1alpha1` for the machine config, else
/// `apiVersion/kind[/name]`.
pub fn document_id(doc: &Map<String, Value>) -> Option<String> {
    if let Some(kind) = doc.get("kind").and_then(Value::as_str) {
        let api = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let mut id = format!("{api}/{kind}");
        if let Some(name) = doc.get("name").and_then(Value::as_str) {
            id.push('/');
            id.push_str(name);
        }
        return Some(id);
    }
    doc.get("version")
        .and_then(Value::as_str)
        .map(|v| v.to_string())
}

/// A value as it lands where nothing was: its `$patch` markers dropped.
pub(super) fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| k.as_str() != DELETE && !is_delete(v))
                .map(|(k, v)| (k.clone(), clean(v)))
                .collect(),
        ),
        Value::Array(items) => {
            Value::Array(items.iter().filter(|i| !is_delete(i)).map(clean).collect())
        }
        other => other.clone(),
    }
}

/// Merges the patch documents into the base's, in order.
pub fn merge_documents(
    base: &mut Vec<Map<String, Value>>,
    patch: &[Map<String, Value>],
    source: &str,
) -> Result<(), RenderError> {
    for doc in patch {
        let Some(id) = document_id(doc) else {
            return Err(RenderError::input(
                source,
                "a patch document needs `version: v1alpha1` (the machine config) or `apiVersion` and `kind` (another document)",
            ));
        };
        let at = base
            .iter()
            .position(|d| document_id(d).as_deref() == Some(&id));
        let whole_delete = doc.get(DELETE).and_then(Value::as_str) == Some("delete");
        match (at, whole_delete) {
            (Some(i), true) => {
                base.remove(i);
            }
            // As Talos: a delete of a document that is not there is skipped.
            (None, true) => {}
            (Some(i), false) => {
                let mut path = Vec::new();
                let kind = doc
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or(MACHINE_CONFIG)
                    .to_string();
                merge_map(&mut base[i], doc, &mut path, &kind, source, &id)?;
            }
            (None, false) => {
                if let Value::Object(m) = clean(&Value::Object(doc.clone())) {
                    base.push(m);
                }
            }
        }
    }
    Ok(())
}

fn merge_map(
    left: &mut Map<String, Value>,
    right: &Map<String, Value>,
    path: &mut Vec<String>,
    kind: &str,
    source: &str,
    doc: &str,
) -> Result<(), RenderError> {
    for (k, rv) in right {
        if k == DELETE {
            continue;
        }
        path.push(k.clone());
        if is_delete(rv) {
            if left.remove(k).is_none() {
                return Err(RenderError::merge(
                    source,
                    doc,
                    &dotted(path),
                    "`$patch: delete` names a key that is not there",
                ));
            }
        } else {
            match left.get_mut(k) {
                None | Some(Value::Null) => {
                    if !rv.is_null() {
                        left.insert(k.clone(), clean(rv));
                    }
                }
                Some(lv) => merge_value(lv, rv, path, kind, source, doc)?,
            }
        }
        path.pop();
    }
    Ok(())
}

fn merge_value(
    left: &mut Value,
    right: &Value,
    path: &mut Vec<String>,
    kind: &str,
    source: &str,
    doc: &str,
) -> Result<(), RenderError> {
    if right.is_null() {
        return Ok(());
    }
    // An argument of an `extraArgs` map: replaced whole, whatever it holds.
    if path.len() >= 2 && path[path.len() - 2] == ARGS {
        *left = clean(right);
        return Ok(());
    }
    if REPLACED.iter().any(|(k, p)| *k == kind && path_is(path, p)) {
        let empty = match right {
            Value::Array(a) => a.is_empty(),
            Value::Object(m) => m.is_empty(),
            _ => false,
        };
        if !empty {
            *left = clean(right);
        }
        return Ok(());
    }
    match (&mut *left, right) {
        (Value::Object(l), Value::Object(r)) => merge_map(l, r, path, kind, source, doc),
        (Value::Array(l), Value::Array(r)) => {
            let keys = KEYED_LISTS
                .iter()
                .find(|(k, p, _, _)| *k == kind && path_is(path, p))
                .map(|(_, _, keys, how)| (*keys, *how));
            merge_list(l, r, keys, path, kind, source, doc)
        }
        (Value::Object(_) | Value::Array(_), _) | (_, Value::Object(_) | Value::Array(_)) => {
            Err(RenderError::merge(
                source,
                doc,
                &dotted(path),
                &format!(
                    "the base has {} here and the patch {}; they do not merge",
                    shape(left),
                    shape(right)
                ),
            ))
        }
        (l, r) => {
            let zero = match r {
                Value::String(s) => s.is_empty(),
                Value::Number(n) => n.as_f64() == Some(0.0),
                _ => false,
            };
            if !zero {
                *l = r.clone();
            }
            Ok(())
        }
    }
}

fn merge_list(
    left: &mut Vec<Value>,
    right: &[Value],
    keys: Option<(&[&str], Keyed)>,
    path: &mut Vec<String>,
    kind: &str,
    source: &str,
    doc: &str,
) -> Result<(), RenderError> {
    for item in right {
        if is_delete(item) {
            let Value::Object(m) = item else { continue };
            let mut selector = m.iter().filter(|(k, _)| k.as_str() != DELETE);
            let (Some((k, v)), None) = (selector.next(), selector.next()) else {
                return Err(RenderError::merge(
                    source,
                    doc,
                    &dotted(path),
                    "a list item with `$patch: delete` names the items to delete by exactly one `key: value`",
                ));
            };
            if secret_key(k) {
                return Err(RenderError::merge(
                    source,
                    doc,
                    &dotted(path),
                    &format!("`$patch: delete` cannot select list items by the secret field `{k}`"),
                ));
            }
            let before = left.len();
            left.retain(|l| l.get(k) != Some(v));
            if left.len() == before {
                return Err(RenderError::merge(
                    source,
                    doc,
                    &dotted(path),
                    &format!("`$patch: delete` names `{k}` items, and no item of the list matches"),
                ));
            }
            continue;
        }
        let existing = keys.and_then(|(keys, _)| {
            let key = keys.iter().find(|k| {
                item.get(**k)
                    .is_some_and(|v| !v.is_null() && v.as_str() != Some(""))
            })?;
            let want = item.get(*key)?;
            left.iter_mut().find(|l| l.get(*key) == Some(want))
        });
        match existing {
            Some(l) if keys.is_some_and(|(_, how)| how == Keyed::Replace) => *l = clean(item),
            Some(l) => {
                path.push("*".to_string());
                let r = merge_value(l, item, path, kind, source, doc);
                path.pop();
                r?;
            }
            None => left.push(clean(item)),
        }
    }
    Ok(())
}
