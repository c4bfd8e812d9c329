//! The ichor.maesh.dev/v1alpha1 custom resources the rules decide about — their Rust types,
//! from which `ichor-rules crds` prints the CustomResourceDefinitions — and loading them
//! from YAML as `kubectl get -o yaml` prints them (a multi-document stream or a `kind: List`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

pub const GROUP: &str = "ichor.maesh.dev";
/// The one version the CRDs serve.
pub const API_VERSION: &str = "ichor.maesh.dev/v1alpha1";
pub const VERSION: &str = "v1alpha1";
/// The annotation a person sets to say a delete is meant.
pub const ALLOW_DELETE_ANNOTATION: &str = "ichor.maesh.dev/allow-delete";
/// The finalizer the controller keeps on approved control planes until their removal ends.
pub const REMOVAL_FINALIZER: &str = "ichor.maesh.dev/machine-removal";
/// Keeps a deleted TalosCluster (deleting, so its machines may follow it) until no
/// TalosMachine refers to it any more.
pub const TEARDOWN_FINALIZER: &str = "ichor.maesh.dev/cluster-teardown";

/// The role of a machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Hash, JsonSchema)]
pub enum Role {
    #[serde(rename = "controlplane")]
    ControlPlane,
    #[serde(rename = "worker")]
    Worker,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::ControlPlane => "controlplane",
            Role::Worker => "worker",
        }
    }
}

/// The TalosCluster an object belongs to (same namespace).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterRef {
    /// Name of the TalosCluster.
    #[serde(default)]
    pub name: String,
}

/// A status condition (metav1.Condition).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

fn find<'c>(conds: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

/// When (and so in which order) a machine was approved.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecision {
    /// The time of the approval; orders approved control planes for the count+1 cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
}

/// A machine (a Talos node) of a cluster: its role and whether it is approved to join.
/// `spec.role`: exactly `controlplane` or `worker` (the field may be absent, not null).
fn role_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": crate::vocab::EnumKind::Role.values(),
        "description": "The role of the machine: controlplane or worker."
    })
}

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosMachine",
    doc = "A Talos machine (node) of a TalosCluster; approval lets it join.",
    namespaced,
    // Decisions read a cluster's machines with `fieldSelector=spec.clusterRef.name=<name>`:
    // the API server filters on the field itself (Kubernetes >= 1.32), never on a label.
    selectable = ".spec.clusterRef.name",
    status = "MachineStatus",
    shortname = "tm",
    category = "ichor",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role"}"#,
    printcolumn = r#"{"name":"Approved","type":"boolean","jsonPath":".spec.approved"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","priority":1,"jsonPath":".spec.endpoint"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    #[serde(default)]
    pub cluster_ref: ClusterRef,
    /// controlplane or worker; absent while a discovered machine has none yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "role_schema")]
    pub role: Option<Role>,
    #[serde(default)]
    pub approved: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_decision: Option<ApprovalDecision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// What the controller observed of a machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Ready (reasons such as ControlPlaneOverCap, NodeUnreachable), NodeReachable, Removal
    /// (reasons such as RemovalApproved, DrainFailed, DeadMemberRemoval).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The removal of this control plane, step by step, so a restarted controller resumes
    /// where the last one stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removal: Option<RemovalProgress>,
}

/// How far the removal of a control plane has come.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemovalProgress {
    /// Whether the removal proceeds for a dead etcd member (decided once, under the lock).
    #[serde(default)]
    pub member_dead: bool,
    /// The plan steps finished so far, as the plan writes them (e.g. "drain node").
    #[serde(default)]
    pub done: Vec<String>,
    /// The step started last, and when. A Talos reset that was sent is not sent again
    /// while the node may be resetting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// Once an irreversible step ran (the member left etcd), the removal is committed: it
    /// finishes without deciding again.
    #[serde(default)]
    pub committed: bool,
}

fn name_of(m: &ObjectMeta) -> &str {
    m.name.as_deref().unwrap_or("")
}

fn namespace_of(m: &ObjectMeta) -> &str {
    m.namespace.as_deref().unwrap_or("default")
}

fn annotation_true(m: &ObjectMeta, key: &str) -> bool {
    m.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

impl TalosMachine {
    pub fn name(&self) -> &str {
        name_of(&self.metadata)
    }

    pub fn namespace(&self) -> &str {
        namespace_of(&self.metadata)
    }

    pub fn cluster(&self) -> &str {
        &self.spec.cluster_ref.name
    }

    pub fn deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    pub fn allow_delete(&self) -> bool {
        annotation_true(&self.metadata, ALLOW_DELETE_ANNOTATION)
    }

    /// The role it is an approved member with, if approved.
    pub fn approved_role(&self) -> Option<Role> {
        if self.spec.approved {
            self.spec.role
        } else {
            None
        }
    }

    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or(&[])
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        find(self.conditions(), type_)
    }

    /// Ready=False with reason NodeUnreachable.
    pub fn node_unreachable(&self) -> bool {
        self.condition("Ready")
            .is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("NodeUnreachable"))
    }

    /// The Removal condition says a removal already proceeded for a dead member.
    pub fn dead_member_removal_marked(&self) -> bool {
        self.condition("Removal")
            .is_some_and(|c| c.reason.as_deref() == Some("DeadMemberRemoval"))
    }

    /// The time that orders approvals: the decision time, else the creation time.
    pub fn approval_time(&self) -> Option<&Time> {
        self.spec
            .approval_decision
            .as_ref()
            .and_then(|d| d.at.as_ref())
            .or(self.metadata.creation_timestamp.as_ref())
    }
}

/// spec.schedulable: "true" or "false" (a YAML bool is accepted too).
fn schedulable_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum S {
        Str(String),
        Bool(bool),
    }
    Ok(Option::<S>::deserialize(d)?.map(|s| match s {
        S::Str(s) => s,
        S::Bool(b) => b.to_string(),
    }))
}

/// The declared control plane.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneSpec {
    /// How many control planes the cluster runs: 1, 3 or 5 (even counts exist only while a
    /// control plane is being replaced).
    #[schemars(extend("enum" = crate::vocab::CONTROL_PLANE_COUNTS))]
    pub count: i64,
}

/// A Talos Linux Kubernetes cluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosCluster",
    doc = "A Talos Linux Kubernetes cluster managed by ichor.",
    namespaced,
    status = "ClusterStatus",
    shortname = "tc",
    category = "ichor",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Count","type":"integer","jsonPath":".spec.controlPlane.count"}"#,
    printcolumn = r#"{"name":"Schedulable","type":"string","jsonPath":".spec.schedulable"}"#,
    printcolumn = r#"{"name":"Transitioning","type":"string","jsonPath":".status.conditions[?(@.type==\"Transitioning\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    pub control_plane: ControlPlaneSpec,
    /// "true" or "false": whether workloads may run on the control planes' cluster.
    #[serde(
        default,
        deserialize_with = "schedulable_string",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("enum" = ["true", "false"]))]
    pub schedulable: Option<String>,
    /// The Secret, in this TalosCluster's namespace, holding the talosconfig the controller
    /// dials this cluster's nodes with (Talos API client certificate and CA). Read live at
    /// each use, never logged; without it the controller does no Talos work for this
    /// cluster (Removal=False NoTalosCredentials), unless the operator runs with
    /// `--talosconfig-for-all-clusters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub talos_config_secret_ref: Option<SecretKeyRef>,
}

/// The key of a talosconfig Secret that [`SecretKeyRef`] reads when it names none.
pub const DEFAULT_TALOSCONFIG_KEY: &str = "talosconfig";

/// A key of a Secret in the referring object's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret (in the TalosCluster's namespace).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key holding the talosconfig; `talosconfig` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

impl SecretKeyRef {
    pub fn key(&self) -> &str {
        self.key
            .as_deref()
            .filter(|k| !k.is_empty())
            .unwrap_or(DEFAULT_TALOSCONFIG_KEY)
    }
}

/// What the controller observed of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Transitioning: True (EvenControlPlaneCount) or False (StableControlPlaneCount).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl TalosCluster {
    pub fn name(&self) -> &str {
        name_of(&self.metadata)
    }

    pub fn namespace(&self) -> &str {
        namespace_of(&self.metadata)
    }

    pub fn deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    pub fn allow_delete(&self) -> bool {
        annotation_true(&self.metadata, ALLOW_DELETE_ANNOTATION)
    }

    /// Only an explicit "false" makes a cluster unschedulable.
    pub fn schedulable(&self) -> bool {
        !matches!(self.spec.schedulable.as_deref(), Some(s) if s.trim().eq_ignore_ascii_case("false"))
    }
}

/// A one-off, disruptive operation on a cluster (an upgrade, a reboot, a reset, ...).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosOperation",
    doc = "A one-off, disruptive operation on a TalosCluster.",
    namespaced,
    selectable = ".spec.clusterRef.name",
    status = "OperationStatus",
    shortname = "top",
    category = "ichor",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.kind"}"#,
    printcolumn = r#"{"name":"Machine","type":"string","jsonPath":".spec.machine"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
// The spec cannot change once created: the rules decided on it when it was created (and
// the controller decides again before it runs it), so an edit would slip past them. The
// API server enforces it with this CEL transition rule; the webhook refuses it too.
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self == oldSelf",
    "message": "spec is immutable: a TalosOperation's spec cannot change once it is created; create a new TalosOperation instead"
}]))]
pub struct OperationSpec {
    #[serde(default)]
    pub cluster_ref: ClusterRef,
    /// What the operation does.
    #[serde(default)]
    #[schemars(extend("enum" = crate::vocab::OPERATION_KINDS))]
    pub kind: String,
    /// The machine it acts on, when it acts on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
}

/// What the controller observed of an operation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
}

/// Phases after which an operation holds nothing. Everything else, a failed operation
/// included, is unfinished (ADR 0137).
pub const FINISHED_PHASES: &[&str] = &["Succeeded", "Completed"];

impl TalosOperation {
    pub fn name(&self) -> &str {
        name_of(&self.metadata)
    }

    pub fn namespace(&self) -> &str {
        namespace_of(&self.metadata)
    }

    pub fn cluster(&self) -> &str {
        &self.spec.cluster_ref.name
    }

    pub fn phase(&self) -> &str {
        self.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending")
    }

    /// It failed: a failureReason, or phase Failed.
    pub fn failed(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.failure_reason.as_deref())
            .is_some_and(|r| !r.is_empty())
            || self.phase() == "Failed"
    }

    pub fn finished(&self) -> bool {
        FINISHED_PHASES.contains(&self.phase())
    }

    /// Paused for a reason the rules do not own: by a person (Operator), the lock
    /// (ClusterLockHeld), a shutdown or a failure. The controller leaves such a pause alone.
    pub fn paused_elsewhere(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            find(&s.conditions, "Paused").is_some_and(|c| {
                c.status == "True"
                    && !matches!(
                        c.reason.as_deref(),
                        Some("ClusterTransitioning" | "Refused")
                    )
            })
        })
    }

    /// The controller's `start` rules refused it (Accepted=False, StartRefused): it is not
    /// run until they allow it.
    pub fn start_refused(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            find(&s.conditions, "Accepted")
                .is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("StartRefused"))
        })
    }

    /// Parked by the controller for the even control-plane count: Paused with reason
    /// ClusterTransitioning and no failure. Such an operation holds no lock (ADR 0137).
    pub fn parked(&self) -> bool {
        let paused_for_transition = self.status.as_ref().is_some_and(|s| {
            find(&s.conditions, "Paused").is_some_and(|c| {
                c.status == "True" && c.reason.as_deref() == Some("ClusterTransitioning")
            })
        });
        self.phase() == "Paused" && paused_for_transition && !self.failed()
    }
}

/// The annotations the facts read (the accessors above): live reads for decisions keep
/// these and skip every other annotation unread.
pub const DECIDED_ANNOTATIONS: &[&str] = &[ALLOW_DELETE_ANNOTATION];
/// The TalosMachine conditions the facts read (`node_unreachable`,
/// `dead_member_removal_marked`): type, status and reason; a decision's read keeps no other.
pub const MACHINE_CONDITIONS_DECIDED: &[&str] = &["Ready", "Removal"];
/// The TalosOperation conditions the facts read (`paused_elsewhere`, `start_refused`,
/// `parked`).
pub const OPERATION_CONDITIONS_DECIDED: &[&str] = &["Paused", "Accepted"];

/// The live objects a decision is made against.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub machines: Vec<TalosMachine>,
    pub clusters: Vec<TalosCluster>,
    pub operations: Vec<TalosOperation>,
}

impl Snapshot {
    pub fn cluster(&self, namespace: &str, name: &str) -> Option<&TalosCluster> {
        self.clusters
            .iter()
            .find(|c| c.namespace() == namespace && c.name() == name)
    }

    pub fn machine(&self, namespace: &str, name: &str) -> Option<&TalosMachine> {
        self.machines
            .iter()
            .find(|m| m.namespace() == namespace && m.name() == name)
    }

    pub fn operation(&self, namespace: &str, name: &str) -> Option<&TalosOperation> {
        self.operations
            .iter()
            .find(|o| o.namespace() == namespace && o.name() == name)
    }
}

/// The CustomResourceDefinitions of the three kinds, as one YAML stream.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let mut out = String::new();
    for crd in [
        TalosCluster::crd(),
        TalosMachine::crd(),
        TalosOperation::crd(),
    ] {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

/// The deepest nesting an objects file or an AdmissionReview may have. Kubernetes objects
/// nest far less; a deeper input is refused before a parser sees it (libyaml's scanner is
/// quadratic in nesting depth: 60,000 levels took 13 s).
pub const MAX_NESTING: usize = 128;

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
}

impl Object {
    /// Its kind, as `kind:` spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Machine(_) => "TalosMachine",
            Object::Cluster(_) => "TalosCluster",
            Object::Operation(_) => "TalosOperation",
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Machine(m) => &m.metadata,
            Object::Cluster(c) => &c.metadata,
            Object::Operation(o) => &o.metadata,
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
             TalosMachines and TalosOperations (a stream or a `kind: List`)"
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
        other => Err(format!("`{other}` is not a kind ichor-rules decides about")),
    }?;
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
        Object::Machine(_) => {}
    }
    Ok(())
}

/// The kinds an objects file may hold, as `kubectl get -o yaml` prints them.
const KINDS: [&str; 3] = ["TalosCluster", "TalosMachine", "TalosOperation"];

/// Loads the objects of a YAML stream: several documents, or `kind: List` (or a
/// `TalosMachineList` and the like) with `items`. Every object must be one of our kinds at
/// the served version, with a name and a namespace, and appear once: anything else is bad
/// input, named by its document (and item), never silently skipped: a skipped object
/// would change what is counted, and so the decision.
pub fn load_snapshot(text: &str) -> Result<Snapshot, LoadError> {
    if let Some((line, column)) = super::nesting::yaml_too_deep(text, MAX_NESTING) {
        return Err(LoadError::TooDeep { line, column });
    }
    let mut snap = Snapshot::default();
    let mut seen: std::collections::HashMap<(&'static str, String, String), String> =
        Default::default();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
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
        assert!(op.parked());
        if let Some(s) = op.status.as_mut() {
            s.failure_reason = Some("boom".into());
        }
        assert!(!op.parked());
    }
}
