//! Requests in the words people use with `kubectl`: `--delete talosmachine/NS/NAME`,
//! `--apply FILE`, `--approve`, `--unapprove`, `--unschedule`. Each is turned into the
//! AdmissionReview v1 the API server sends the webhook for that `kubectl` command, built
//! from the live objects of `--objects`, and then decided exactly as `--review FILE` is.
//!
//! What the API server puts in a review, and so what is built here (docs/rules.md,
//! "Requests in kubectl words"):
//!
//! - `kind`/`requestKind`: `{group: ichor.maesh.dev, version: v1alpha1, kind}`;
//!   `resource`/`requestResource`: the plural (`talosmachines`); no `subResource` (these
//!   are writes to the object itself, not to `/status`).
//! - `name`, `namespace`; `operation` CREATE, UPDATE or DELETE.
//! - `userInfo`: the `kubectl` user of a kind cluster, `kubernetes-admin` in
//!   `system:masters` and `system:authenticated` (no rule reads it).
//! - `object`/`oldObject`: DELETE has the stored object as `oldObject` and `object: null`;
//!   CREATE has the new object (with the `metadata.uid` and `creationTimestamp` the API
//!   server gives it before admission, and no `status`: the status subresource drops it)
//!   and `oldObject: null`; UPDATE has both, the new one keeping the stored object's
//!   `status` (the status subresource ignores it in a write of the object) and its
//!   server-set metadata.
//! - `dryRun: false`; `options`: `DeleteOptions` with `propagationPolicy: Background` (what
//!   `kubectl delete` sends), `CreateOptions`/`UpdateOptions` with the field manager
//!   `kubectl` uses for that command.
//! - `uid`: a UUID derived from the request, so the same command gives the same review.

use crate::runtime::objects::{API_VERSION, GROUP, object_from_value};
use serde_json::{Value, json};
use std::path::Path;

/// The kinds a request names, as `kubectl` accepts them.
const KINDS: [(&str, &str, &[&str]); 5] = [
    (
        "TalosMachine",
        "talosmachines",
        &["talosmachine", "talosmachines", "tm"],
    ),
    (
        "TalosCluster",
        "talosclusters",
        &["taloscluster", "talosclusters", "tc"],
    ),
    (
        "TalosOperation",
        "talosoperations",
        &["talosoperation", "talosoperations", "top"],
    ),
    (
        "TalosConfigPatch",
        "talosconfigpatches",
        &["talosconfigpatch", "talosconfigpatches", "tcp"],
    ),
    (
        "TalosEtcdBackup",
        "talosetcdbackups",
        &["talosetcdbackup", "talosetcdbackups", "teb"],
    ),
];

/// `KIND/NAMESPACE/NAME`, as a request names one live object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.kind.to_lowercase(),
            self.namespace,
            self.name
        )
    }
}

/// What a request form does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Form {
    /// `kubectl delete KIND NAME -n NS`.
    Delete(Target),
    /// `kubectl patch talosmachine NAME --type merge -p '{"spec":{"approved":true,
    /// "approvalDecision":{"at":NOW}}}'`.
    Approve(Target),
    /// `kubectl patch talosmachine NAME --type merge -p '{"spec":{"approved":false}}'`.
    Unapprove(Target),
    /// `kubectl patch taloscluster NAME --type merge -p '{"spec":{"schedulable":"false"}}'`.
    Unschedule(Target),
    /// `kubectl apply -f FILE`: a create when `--objects` does not hold the object, else an
    /// update (the file's fields merged onto the live object).
    Apply(Value),
    /// `kubectl patch KIND NAME --subresource=status --type merge -p FILE's status`: an
    /// UPDATE of the status subresource of a live object (the file names it and gives the
    /// status to merge onto the live one; nothing else of the object changes).
    Status(Value),
}

impl Form {
    /// The flag that gives this form, for messages.
    pub fn flag(&self) -> &'static str {
        match self {
            Form::Delete(_) => "--delete",
            Form::Approve(_) => "--approve",
            Form::Unapprove(_) => "--unapprove",
            Form::Unschedule(_) => "--unschedule",
            Form::Apply(_) => "--apply",
            Form::Status(_) => "--status",
        }
    }
}

/// Parses `KIND/NAMESPACE/NAME` (`talosmachine/infra/cp-3`; the kind as `kubectl` takes
/// it: singular, plural, short name, `Kind`, or `kind.ichor.maesh.dev`).
pub fn parse_target(text: &str) -> Result<Target, String> {
    let parts: Vec<&str> = text.split('/').collect();
    let [kind, namespace, name] = parts[..] else {
        return Err(format!(
            "{:?}: expected KIND/NAMESPACE/NAME, e.g. talosmachine/infra/cp-3",
            clip(text)
        ));
    };
    if namespace.is_empty() || name.is_empty() {
        return Err(format!(
            "{:?}: the namespace and the name must not be empty (KIND/NAMESPACE/NAME)",
            clip(text)
        ));
    }
    let lower = kind.to_lowercase();
    let bare = lower
        .strip_suffix(&format!(".{GROUP}"))
        .unwrap_or(lower.as_str());
    let Some((kind, _, _)) = KINDS
        .iter()
        .find(|(k, _, names)| names.contains(&bare) || k.to_lowercase() == bare)
    else {
        return Err(format!(
            "{:?}: `{}` is not a kind ichor-rules decides about; use talosmachine, \
             taloscluster, talosoperation, talosconfigpatch or talosetcdbackup",
            clip(text),
            clip(kind)
        ));
    };
    Ok(Target {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// Reads the one object of an `--apply` file (YAML or JSON).
pub fn read_apply_file(path: &Path, text: &str) -> Result<Value, String> {
    use serde::Deserialize;
    let mut docs = Vec::new();
    let stream = crate::runtime::nesting::yaml(text).map_err(|e| {
        format!(
            "{}: {e}; a Kubernetes object nests far less, so this is not an object ichor-rules reads",
            path.display()
        )
    })?;
    for doc in stream {
        let v = serde_yaml::Value::deserialize(doc)
            .map_err(|e| format!("{}: not valid YAML: {e}", path.display()))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    let [doc] = &docs[..] else {
        return Err(format!(
            "{}: holds {} objects; `--apply` takes a file of exactly one object (as \
             `kubectl apply -f` of one object)",
            path.display(),
            docs.len()
        ));
    };
    let value: Value = serde_json::to_value(doc)
        .map_err(|e| format!("{}: cannot be read as an object: {e}", path.display()))?;
    // One of our kinds, at the served version. The fields are checked once merged onto
    // the live object (an update may give only what changes), as the review is parsed.
    let text = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or("");
    if !KINDS.iter().any(|(k, _, _)| *k == text("kind")) || text("apiVersion") != API_VERSION {
        object_from_value(value.clone()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(format!(
            "{}: the object has no metadata.name; give it one (a generated name cannot be \
             decided offline)",
            path.display()
        ));
    }
    Ok(value)
}

/// The live objects of an objects file as written (not as typed), so a review carries
/// every field the file has, as the API server sends the stored object. The text is one
/// [`load_snapshot`](crate::runtime::objects::load_snapshot) accepted (nothing of a text
/// nested too deep is read).
pub fn raw_objects(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    let mut out = Vec::new();
    let Ok(stream) = crate::runtime::nesting::yaml(text) else {
        return out;
    };
    for doc in stream {
        let Ok(v) = serde_yaml::Value::deserialize(doc) else {
            continue;
        };
        let Ok(v) = serde_json::to_value(&v) else {
            continue;
        };
        match v.get("items") {
            Some(Value::Array(items)) => out.extend(items.iter().cloned()),
            _ => out.push(v),
        }
    }
    out
}

fn find<'a>(objects: &'a [Value], kind: &str, namespace: &str, name: &str) -> Option<&'a Value> {
    objects.iter().find(|o| {
        o.get("kind").and_then(Value::as_str) == Some(kind)
            && o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(namespace)
            && o.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
    })
}

/// Builds the AdmissionReview v1 the API server sends for `form`, with the live objects
/// `objects` (the objects file, as [`raw_objects`] reads it). `now` is the time a create
/// or an approval records (RFC 3339).
pub fn build_review(form: &Form, objects: &[Value], now: &str) -> Result<Value, String> {
    let live = |t: &Target| {
        find(objects, t.kind, &t.namespace, &t.name)
            .cloned()
            .ok_or_else(|| {
                format!(
                    "{} {t}: the objects file holds no {} {}/{}; the request needs the live \
                     object (add it, as `kubectl get {} -n {} {} -o yaml` prints it)",
                    form.flag(),
                    t.kind,
                    t.namespace,
                    t.name,
                    t.kind.to_lowercase(),
                    t.namespace,
                    t.name
                )
            })
    };
    let only = |t: &Target, kind: &str| {
        if t.kind == kind {
            Ok(())
        } else {
            Err(format!(
                "{} {t}: only a {kind} can be {}",
                form.flag(),
                match form {
                    Form::Approve(_) => "approved",
                    Form::Unapprove(_) => "un-approved",
                    _ => "made unschedulable",
                }
            ))
        }
    };
    let (op, target, old, new) = match form {
        Form::Delete(t) => ("DELETE", t.clone(), Some(live(t)?), None),
        Form::Approve(t) | Form::Unapprove(t) => {
            only(t, "TalosMachine")?;
            let old = live(t)?;
            let mut new = old.clone();
            let approve = matches!(form, Form::Approve(_));
            if approve && old.pointer("/spec/role").is_none_or(Value::is_null) {
                return Err(format!(
                    "--approve {t}: the machine has no spec.role; set it (controlplane or \
                     worker) with `--apply` before approving"
                ));
            }
            if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("approved".into(), approve.into());
                if approve {
                    spec.insert("approvalDecision".into(), json!({ "at": now }));
                }
            }
            ("UPDATE", t.clone(), Some(old), Some(new))
        }
        Form::Unschedule(t) => {
            only(t, "TalosCluster")?;
            let old = live(t)?;
            let mut new = old.clone();
            if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("schedulable".into(), "false".into());
            }
            ("UPDATE", t.clone(), Some(old), Some(new))
        }
        Form::Status(file) => {
            let t = Target {
                kind: KINDS
                    .iter()
                    .find(|(k, _, _)| Some(*k) == file.get("kind").and_then(Value::as_str))
                    .map_or("", |(k, _, _)| *k),
                namespace: file
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_string(),
                name: file
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            };
            let old = live(&t)?;
            let Some(status) = file.get("status") else {
                return Err(format!(
                    "--status {t}: the file has no `status`; give the status to write"
                ));
            };
            let mut new = old.clone();
            if let Some(o) = new.as_object_mut() {
                let mut merged = old.get("status").cloned().unwrap_or(Value::Null);
                merge(&mut merged, status);
                o.insert("status".into(), merged);
            }
            ("UPDATE", t, Some(old), Some(new))
        }
        Form::Apply(file) => {
            let kind = file.get("kind").and_then(Value::as_str).unwrap_or("");
            let Some((kind, _, _)) = KINDS.iter().find(|(k, _, _)| *k == kind) else {
                return Err(format!(
                    "--apply: `{}` is not a kind ichor-rules decides about",
                    clip(kind)
                ));
            };
            let name = file
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let namespace = file
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default");
            let t = Target {
                kind,
                namespace: namespace.to_string(),
                name: name.to_string(),
            };
            match find(objects, kind, namespace, name) {
                Some(old) => {
                    let new = applied(old, file);
                    ("UPDATE", t, Some(old.clone()), Some(new))
                }
                None => {
                    let mut new = file.clone();
                    if let Some(o) = new.as_object_mut() {
                        o.remove("status");
                    }
                    if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                        meta.insert("namespace".into(), namespace.into());
                        meta.insert("uid".into(), uid(&["object", kind, namespace, name]).into());
                        meta.insert("creationTimestamp".into(), now.into());
                        meta.insert("generation".into(), 1.into());
                    }
                    ("CREATE", t, None, Some(new))
                }
            }
        }
    };
    let manager = match form {
        Form::Apply(_) => "kubectl-client-side-apply",
        _ => "kubectl-patch",
    };
    let mut review = envelope(op, &target, old, new, manager, now);
    if matches!(form, Form::Status(_)) {
        // A write of the status subresource, as the API server says it.
        review["request"]["subResource"] = "status".into();
        review["request"]["requestSubResource"] = "status".into();
    }
    Ok(review)
}

/// An AdmissionReview of `operation` (CREATE, UPDATE or DELETE) with these objects, as the
/// API server sends it: the form a test case gives as `review: {operation, old, new}`.
pub fn review_of(operation: &str, old: Option<Value>, new: Option<Value>) -> Result<Value, String> {
    let op = match operation.to_uppercase().as_str() {
        "CREATE" => "CREATE",
        "UPDATE" => "UPDATE",
        "DELETE" => "DELETE",
        other => {
            return Err(format!(
                "operation {:?}: expected CREATE, UPDATE or DELETE",
                clip(other)
            ));
        }
    };
    let (needs_old, needs_new) = match op {
        "CREATE" => (false, true),
        "UPDATE" => (true, true),
        _ => (true, false),
    };
    if needs_old != old.is_some() || needs_new != new.is_some() {
        return Err(format!(
            "a {op} has {}: give {}",
            match (old.is_some(), new.is_some()) {
                (true, true) => "`old` and `new`",
                (true, false) => "only `old`",
                (false, true) => "only `new`",
                (false, false) => "no object",
            },
            match op {
                "CREATE" => "`new` only",
                "UPDATE" => "`old` and `new`",
                _ => "`old` only",
            }
        ));
    }
    let Some(obj) = new.as_ref().or(old.as_ref()) else {
        return Err(format!("a {op} needs an object"));
    };
    object_from_value(obj.clone())?;
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some((kind, _, _)) = KINDS.iter().find(|(k, _, _)| *k == kind) else {
        return Err(format!(
            "`{}` is not a kind ichor-rules decides about",
            clip(kind)
        ));
    };
    let target = Target {
        kind,
        namespace: obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string(),
        name: obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    };
    Ok(envelope(
        op,
        &target,
        old,
        new,
        "kubectl-client-side-apply",
        "",
    ))
}

fn envelope(
    op: &str,
    target: &Target,
    old: Option<Value>,
    new: Option<Value>,
    manager: &str,
    now: &str,
) -> Value {
    let resource = KINDS
        .iter()
        .find(|(k, _, _)| *k == target.kind)
        .map_or("", |(_, r, _)| *r);
    let options = match op {
        "DELETE" => json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
        }),
        "CREATE" => json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "CreateOptions",
            "fieldManager": "kubectl-client-side-apply",
            "fieldValidation": "Strict",
        }),
        _ => json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "UpdateOptions",
            "fieldManager": manager,
            "fieldValidation": "Strict",
        }),
    };
    let version = API_VERSION.rsplit('/').next().unwrap_or("v1alpha1");
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid(&[op, target.kind, &target.namespace, &target.name, now]),
            "kind": {"group": GROUP, "version": version, "kind": target.kind},
            "resource": {"group": GROUP, "version": version, "resource": resource},
            "requestKind": {"group": GROUP, "version": version, "kind": target.kind},
            "requestResource": {"group": GROUP, "version": version, "resource": resource},
            "name": target.name,
            "namespace": target.namespace,
            "operation": op,
            "userInfo": {
                "username": "kubernetes-admin",
                "groups": ["system:masters", "system:authenticated"],
            },
            "object": new.unwrap_or(Value::Null),
            "oldObject": old.unwrap_or(Value::Null),
            "dryRun": false,
            "options": options,
        }
    })
}

/// An update by `kubectl apply`: the file's fields merged onto the live object (a JSON
/// merge patch: a field the file sets replaces the live one, `null` removes it, fields the
/// file leaves out stay), then what a write of the object cannot change restored: the
/// status (a subresource) and the metadata the API server owns.
fn applied(old: &Value, file: &Value) -> Value {
    let mut new = old.clone();
    merge(&mut new, file);
    if let Some(o) = new.as_object_mut() {
        match old.get("status") {
            Some(s) => {
                o.insert("status".into(), s.clone());
            }
            None => {
                o.remove("status");
            }
        }
    }
    for key in [
        "uid",
        "creationTimestamp",
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "managedFields",
    ] {
        let was = old.pointer(&format!("/metadata/{key}")).cloned();
        if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            match was {
                Some(v) => meta.insert(key.into(), v),
                None => meta.remove(key),
            };
        }
    }
    // A change of the spec is a new generation, as the API server counts it.
    if old.get("spec") != new.get("spec")
        && let Some(g) = old.pointer("/metadata/generation").and_then(Value::as_i64)
        && let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.insert("generation".into(), (g.saturating_add(1)).into());
    }
    new
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    if let Value::Object(t) = target {
        for (k, v) in patch {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// A version-4-shaped UUID derived from `parts` (FNV-1a), so a command builds the same
/// review each time it runs.
fn uid(parts: &[&str]) -> String {
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x8422_2325_cbf2_9ce4;
    for p in parts {
        for byte in p.bytes().chain([0u8]) {
            a = (a ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            b = (b ^ u64::from(byte))
                .wrapping_mul(0x0000_0100_0000_01b3)
                .rotate_left(7);
        }
    }
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-4{}-8{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// The time a request records now, as the API server writes a `metav1.Time`.
pub fn now() -> String {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let ts = k8s_openapi::jiff::Timestamp::now();
    let secs = k8s_openapi::jiff::Timestamp::from_second(ts.as_second()).unwrap_or(ts);
    serde_json::to_value(Time(secs))
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

fn clip(s: &str) -> String {
    s.chars().take(80).flat_map(char::escape_debug).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_take_the_names_kubectl_takes() {
        for k in [
            "talosmachine",
            "talosmachines",
            "tm",
            "TalosMachine",
            "talosmachines.ichor.maesh.dev",
        ] {
            let t = parse_target(&format!("{k}/infra/cp-3")).expect("parses");
            assert_eq!(t.kind, "TalosMachine");
            assert_eq!((t.namespace.as_str(), t.name.as_str()), ("infra", "cp-3"));
        }
        assert!(parse_target("pod/infra/x").is_err());
        assert!(parse_target("talosmachine/cp-3").is_err());
        assert!(parse_target("talosmachine//cp-3").is_err());
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut t = json!({"a": 1, "b": {"c": 2, "d": 3}});
        merge(&mut t, &json!({"a": null, "b": {"c": 5}, "e": [1]}));
        assert_eq!(t, json!({"b": {"c": 5, "d": 3}, "e": [1]}));
    }

    #[test]
    fn uids_are_uuid_shaped_and_differ() {
        let a = uid(&["DELETE", "x"]);
        let b = uid(&["DELETE", "y"]);
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }
}
