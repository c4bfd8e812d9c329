//! One set of builders for the objects the tests store and send: TalosCluster, TalosMachine,
//! TalosOperation (as JSON, the way the API server holds them) and the AdmissionReview v1
//! of a request about one of them.
//!
//! Every default is written here once, and a builder writes only what it is told beyond
//! them, so a test names what it depends on:
//!
//! - namespace `infra` ([`NAMESPACE`]), cluster `prod` ([`CLUSTER`]);
//! - a cluster: `spec.controlPlane.count` as given, nothing else (no `schedulable`, no
//!   credentials Secret);
//! - a machine: an approved control plane of `prod`, without `approvalDecision`,
//!   `hostname`, labels, annotations or status;
//! - an operation: `spec.clusterRef` and `spec.kind` only (no `machine`, no status);
//! - a review: user `admin`, `dryRun: false`, the object's kind, name and namespace,
//!   `object`/`oldObject` `null` when absent, no subresource.

use serde_json::{Value, json};

/// The API group and version of the ichor.maesh.dev kinds.
pub const API_VERSION: &str = "ichor.maesh.dev/v1alpha1";
/// The namespace every builder puts its object in unless told otherwise.
pub const NAMESPACE: &str = "infra";
/// The cluster every machine and operation belongs to unless told otherwise.
pub const CLUSTER: &str = "prod";

/// `metadata.<map>.<key> = value`, the map made when absent.
fn set_metadata(obj: &mut Value, map: &str, key: &str, value: &str) {
    if !obj["metadata"][map].is_object() {
        obj["metadata"][map] = json!({});
    }
    obj["metadata"][map][key] = json!(value);
}

/// A TalosCluster in [`NAMESPACE`] declaring `count` control planes.
pub fn cluster(name: &str, count: i64) -> Cluster {
    Cluster(json!({
        "apiVersion": API_VERSION, "kind": "TalosCluster",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"controlPlane": {"count": count}}
    }))
}

pub struct Cluster(Value);

impl Cluster {
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0["metadata"]["namespace"] = json!(namespace);
        self
    }

    /// `spec.schedulable` (the CRD's string enum: "true", "false").
    pub fn schedulable(mut self, value: &str) -> Self {
        self.0["spec"]["schedulable"] = json!(value);
        self
    }

    /// `spec.talosConfigSecretRef`.
    pub fn secret(mut self, reference: Value) -> Self {
        self.0["spec"]["talosConfigSecretRef"] = reference;
        self
    }

    pub fn build(self) -> Value {
        self.0
    }
}

/// A TalosMachine in [`NAMESPACE`]: an approved control plane of [`CLUSTER`].
pub fn machine(name: &str) -> Machine {
    Machine(json!({
        "apiVersion": API_VERSION, "kind": "TalosMachine",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"clusterRef": {"name": CLUSTER}, "role": "controlplane", "approved": true}
    }))
}

pub struct Machine(Value);

impl Machine {
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0["metadata"]["namespace"] = json!(namespace);
        self
    }

    pub fn cluster(mut self, cluster: &str) -> Self {
        self.0["spec"]["clusterRef"]["name"] = json!(cluster);
        self
    }

    /// `spec.role`: "controlplane" or "worker".
    pub fn role(mut self, role: &str) -> Self {
        self.0["spec"]["role"] = json!(role);
        self
    }

    pub fn approved(mut self, approved: bool) -> Self {
        self.0["spec"]["approved"] = json!(approved);
        self
    }

    /// `spec.approvalDecision.at` (an RFC 3339 time).
    pub fn approved_at(mut self, at: &str) -> Self {
        self.0["spec"]["approvalDecision"] = json!({"at": at});
        self
    }

    /// `spec.hostname`.
    pub fn hostname(mut self, hostname: &str) -> Self {
        self.0["spec"]["hostname"] = json!(hostname);
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        set_metadata(&mut self.0, "labels", key, value);
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        set_metadata(&mut self.0, "annotations", key, value);
        self
    }

    /// The `ichor.maesh.dev/allow-delete: "true"` annotation.
    pub fn allow_delete(self) -> Self {
        self.annotation("ichor.maesh.dev/allow-delete", "true")
    }

    /// The whole `status`.
    pub fn status(mut self, status: Value) -> Self {
        self.0["status"] = status;
        self
    }

    pub fn build(self) -> Value {
        self.0
    }
}

/// A TalosOperation of [`CLUSTER`] in [`NAMESPACE`] of `spec.kind` `kind`.
pub fn operation(name: &str, kind: &str) -> Operation {
    Operation(json!({
        "apiVersion": API_VERSION, "kind": "TalosOperation",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"clusterRef": {"name": CLUSTER}, "kind": kind}
    }))
}

pub struct Operation(Value);

impl Operation {
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0["metadata"]["namespace"] = json!(namespace);
        self
    }

    pub fn cluster(mut self, cluster: &str) -> Self {
        self.0["spec"]["clusterRef"]["name"] = json!(cluster);
        self
    }

    /// `spec.machine`, written even when `None` (as `null`).
    pub fn machine(mut self, machine: Option<&str>) -> Self {
        self.0["spec"]["machine"] = json!(machine);
        self
    }

    /// `status.phase`.
    pub fn phase(mut self, phase: &str) -> Self {
        self.0["status"] = json!({"phase": phase});
        self
    }

    pub fn build(self) -> Value {
        self.0
    }
}

/// The AdmissionReview v1 of `operation` (CREATE, UPDATE, DELETE) on `old` → `new` (the
/// one present names the kind, the resource, the name and the namespace; `new` first).
pub fn review(uid: &str, operation: &str, old: Option<&Value>, new: Option<&Value>) -> Review {
    let obj = new
        .or(old)
        .expect("a review needs an object or an old object");
    let kind = obj["kind"].as_str().expect("the object has a kind");
    Review(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1",
                         "resource": format!("{}s", kind.to_lowercase())},
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": new,
            "oldObject": old,
            "dryRun": false
        }
    }))
}

pub struct Review(Value);

impl Review {
    /// `request.userInfo`: `username` with the `system:authenticated` group.
    pub fn authenticated_user(mut self, username: &str) -> Self {
        self.0["request"]["userInfo"] =
            json!({"username": username, "groups": ["system:authenticated"]});
        self
    }

    /// A write to the status subresource (`subResource` and `requestSubResource`).
    pub fn status_subresource(mut self) -> Self {
        self.0["request"]["subResource"] = json!("status");
        self.0["request"]["requestSubResource"] = json!("status");
        self
    }

    pub fn build(self) -> Value {
        self.0
    }
}
