//! The ichor.maesh.dev/v1alpha1 custom resources the rules decide about — their Rust types,
//! from which `ichor-rules crds` prints the CustomResourceDefinitions — and loading them
//! from YAML as `kubectl get -o yaml` prints them (a multi-document stream or a `kind: List`).

use crate::compile::Table;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

mod backup;
mod configpatch;
mod load;
mod snapshot;
pub use backup::{
    BackupSpec, BackupStatus, Cidr, ClusterNetwork, CredentialsSecretRef, EncryptionSpec, Endpoint,
    Every, RetentionSpec, SNAPSHOT_NOW_ANNOTATION, ScheduleSpec, SnapshotInProgress,
    SnapshotRecord, StoreSpec, TalosEtcdBackup, parse_duration, parse_endpoint, store_in_cluster,
    validate_backup_spec,
};
pub use configpatch::{
    BaseConfigRef, ConfigPatchSpec, PatchBody, PatchSelector, RedactedBase, TalosConfigPatch,
    labels_match, patches_for,
};
pub use load::{
    LoadError, MAX_NESTING, Object, load_snapshot, object_from_value, typed_object,
    typed_object_text, validate_object,
};
pub use snapshot::Snapshot;

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
    /// The disk Talos installs to (`machine.install.disk` of its configuration, set after
    /// every patch), e.g. `/dev/nvme0n1`; the base's (or a patch's) when omitted. A change
    /// needs a reboot: it is staged and rolled like any such change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 6, max = 256),
        regex(pattern = r"^/dev/[A-Za-z0-9._/-]+$")
    )]
    pub install_disk: Option<String>,
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
    /// The Talos configuration of the machine: the hashes (sha256) of what was rendered,
    /// applied and staged (issue 37). Never the configuration itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<MachineConfigStatus>,
}

/// The hashes of a machine's Talos configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfigStatus {
    /// sha256 of the last configuration rendered for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendered_hash: Option<String>,
    /// sha256 of the configuration last applied to its node (Talos accepted it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_hash: Option<String>,
    /// sha256 of a configuration staged on its node for its next reboot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_hash: Option<String>,
    /// Digest of the inputs it was last rendered from (the base's digest, and the name and
    /// resourceVersion of each of the cluster's TalosConfigPatches): the configuration roll
    /// waits until every machine the change reaches has rendered the same inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<String>,
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
    /// The TalosCluster whose etcd the member belongs to, recorded when the removal began:
    /// an edit of `spec.clusterRef` afterwards does not make the controller ask another
    /// cluster's etcd whether the member is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The etcd member's name (the node name), recorded when the removal began: an edit of
    /// `spec.hostname` afterwards does not lose the member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The etcd ID of the member, once etcd listed it for this removal (a dead member when
    /// the removal was decided, a live one before it left): the etcd steps act on that
    /// member and no other, and its absence from etcd's list is what says it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_id: Option<u64>,
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

    /// It carries the removal finalizer (the controller adds it to an approved control
    /// plane, and it stays until the removal, or etcd's member list, lets it go).
    pub fn holds_removal_finalizer(&self) -> bool {
        self.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == REMOVAL_FINALIZER))
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

    /// The time that orders approvals: the decision time, else the creation time.
    pub fn approval_time(&self) -> Option<&Time> {
        self.spec
            .approval_decision
            .as_ref()
            .and_then(|d| d.at.as_ref())
            .or(self.metadata.creation_timestamp.as_ref())
    }
}

/// Declares every read of a TalosMachine's status that the controller or a decision makes,
/// as accessor methods, and [`TalosMachine::status_reads`], which lists them all: the
/// status guard (the `report machine` event: only the controller may change them) compares
/// that list before and after a write, so a read added here is guarded by construction.
/// Nothing outside this module reads a machine's status any other way
/// (`status_reads_are_the_only_reads` in `tests/layers.rs` fails on one that does).
macro_rules! status_reads {
    ($(
        $(#[$doc:meta])*
        fn $name:ident(&$self:ident) -> $ty:ty $body:block
    )*) => {
        impl TalosMachine {
            $(
                $(#[$doc])*
                pub fn $name(&$self) -> $ty $body
            )*

            /// Every status read of [`status_reads!`], by name, with its value (`Debug`): what
            /// the status guard compares.
            pub fn status_reads(&self) -> Vec<(&'static str, String)> {
                vec![$((stringify!($name), format!("{:?}", self.$name()))),*]
            }

            /// Whether every status read of [`status_reads!`] reads the same in `other`
            /// (what the status guard compares, without formatting a value).
            pub fn same_status_reads(&self, other: &TalosMachine) -> bool {
                true $(&& self.$name() == other.$name())*
            }
        }

        /// The names of the status reads, for the test that every read goes through them.
        pub const STATUS_READS: &[&str] = &[$(stringify!($name)),*];
    };
}

/// A condition as read: True or not, its reason, its message, and since when.
pub type ConditionState<'a> = (bool, Option<&'a str>, Option<&'a str>, Option<&'a Time>);

/// The condition types of a TalosMachine's status that the reads below look at.
pub const MACHINE_CONDITIONS_READ: &[&str] = &[
    "Ready",
    "NodeReachable",
    "Removal",
    "Configured",
    "Maintenance",
];

status_reads! {
    /// Ready=False with reason NodeUnreachable (`node.unreachable`, and `member.dead` and
    /// `healthy.after` at admission).
    fn node_unreachable(&self) -> bool {
        self.ready_state()
            .is_some_and(|(status, reason)| status == "False" && reason == Some("NodeUnreachable"))
    }

    /// The Ready condition's status and reason: the controller lifts a hold whose reason the
    /// rules own, and a NodeUnreachable its probe set.
    fn ready_state(&self) -> Option<(&str, Option<&str>)> {
        self.condition("Ready")
            .map(|c| (c.status.as_str(), c.reason.as_deref()))
    }

    /// When the node stopped answering its probes: the NodeReachable=False condition's
    /// lastTransitionTime, which times the grace before Ready=False NodeUnreachable (ADR
    /// 0106 §3). `Some(None)` for a NodeReachable=False without a time.
    fn unreachable_since(&self) -> Option<Option<&Time>> {
        self.condition("NodeReachable")
            .filter(|c| c.status == "False")
            .map(|c| c.last_transition_time.as_ref())
    }

    /// The NodeReachable condition's status (present while probes fail).
    fn reachable_state(&self) -> Option<&str> {
        self.condition("NodeReachable").map(|c| c.status.as_str())
    }

    /// The Removal condition's reason (the DeadMemberRemoval marker; RemovalRefused, which
    /// a waiting removal keeps saying).
    fn removal_reason(&self) -> Option<&str> {
        self.condition("Removal").and_then(|c| c.reason.as_deref())
    }

    /// The Removal condition's status and reason: a removal waiting in a step of its plan
    /// keeps the condition its step set through a retry.
    fn removal_state(&self) -> Option<(&str, Option<&str>)> {
        self.condition("Removal")
            .map(|c| (c.status.as_str(), c.reason.as_deref()))
    }

    /// The Removal condition says a removal already proceeded for a dead member.
    fn dead_member_removal_marked(&self) -> bool {
        self.removal_reason() == Some("DeadMemberRemoval")
    }

    /// The controller's record of a removal (`status.removal`), which it resumes from.
    fn removal_progress(&self) -> Option<&RemovalProgress> {
        self.status.as_ref().and_then(|s| s.removal.as_ref())
    }

    /// When the Configured condition turned False: how long configuring the machine has
    /// been failing, which times its retries.
    fn configure_failing_since(&self) -> Option<&Time> {
        self.condition("Configured")
            .filter(|c| c.status == "False")
            .and_then(|c| c.last_transition_time.as_ref())
    }

    /// The Maintenance condition is True: the node answered only Talos' maintenance API
    /// (no configuration yet); its first configuration goes there.
    fn in_maintenance(&self) -> bool {
        self.condition("Maintenance").is_some_and(|c| c.status == "True")
    }

    /// The Configured condition is True: the node runs the configuration rendered for it
    /// (the bootstrap waits for it).
    fn configured(&self) -> bool {
        self.condition("Configured").is_some_and(|c| c.status == "True")
    }

    /// The Configured condition: True or not, its reason, its message, and since when
    /// (`Ready` follows it, issue 37).
    fn configured_state(&self) -> Option<ConditionState<'_>> {
        self.condition("Configured").map(|c| {
            (
                c.status == "True",
                c.reason.as_deref(),
                c.message.as_deref(),
                c.last_transition_time.as_ref(),
            )
        })
    }

    /// The hash of a configuration staged on the node for its next reboot
    /// (`status.config.stagedHash`): the controller rolls a reboot over the machines whose
    /// staged configuration is not the one applied.
    fn staged_config_hash(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.config.as_ref())
            .and_then(|c| c.staged_hash.as_deref())
    }

    /// The hash of the configuration last applied to the node (`status.config.appliedHash`):
    /// the controller applies again only when a render differs from it (a forged one would
    /// make it skip an apply, so only the controller may change it).
    fn applied_config_hash(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.config.as_ref())
            .and_then(|c| c.applied_hash.as_deref())
    }

    /// The digest of the inputs its configuration was last rendered from
    /// (`status.config.inputs`).
    fn config_inputs(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.config.as_ref())
            .and_then(|c| c.inputs.as_deref())
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
    /// The cluster's pod and service ranges (Talos' `cluster.network`): a backup store
    /// inside them is inside the cluster (ADR 0106 §2). Talos' defaults when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ClusterNetwork>,
    /// The Secret holding the cluster's base Talos configuration (`controlplane.yaml`,
    /// `worker.yaml`): read live by the controller only, never logged or copied; without it
    /// nothing is applied to the cluster's machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_config_secret_ref: Option<BaseConfigRef>,
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
    /// The base configuration, redacted (no secret value), for the webhook's dry render.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacted_base: Option<RedactedBase>,
    /// The cluster's one `Bootstrap` (issue 37): recorded before the call, under a
    /// resourceVersion precondition, so two controllers never both send it and a call whose
    /// answer was lost is never sent again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapRecord>,
}

/// The record of a cluster's `Bootstrap`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapRecord {
    /// The control plane it was sent to ("" when etcd was found running and none was sent).
    #[serde(default)]
    pub machine: String,
    /// When the controller decided to send it (before the call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<Time>,
    /// The controller that sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Talos answered it, or etcd was seen running afterwards (its answer was lost).
    #[serde(default)]
    pub confirmed: bool,
    /// What happened, in words (Talos' error when the answer was lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
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

    /// The record of the cluster's `Bootstrap`, once one was decided.
    pub fn bootstrap_record(&self) -> Option<&BootstrapRecord> {
        self.status.as_ref().and_then(|s| s.bootstrap.as_ref())
    }

    /// Whether `other`'s status holds the same as this one's in everything but its
    /// conditions (Transitioning, BaseConfig, Teardown: words no decision reads): the
    /// redacted base the webhook dry-renders TalosConfigPatches against (`redactedBase`,
    /// ADR 0106 §1) and the record of the cluster's `Bootstrap` (`bootstrap`, the fact
    /// `bootstrapped`). A status that is absent holds nothing. The fields are named one by
    /// one, so a field added to [`ClusterStatus`] does not compile until it is placed here.
    pub fn same_status_reads(&self, other: &TalosCluster) -> bool {
        fn reads(c: &TalosCluster) -> (Option<&RedactedBase>, Option<&BootstrapRecord>) {
            match &c.status {
                Some(ClusterStatus {
                    conditions: _,
                    redacted_base,
                    bootstrap,
                }) => (redacted_base.as_ref(), bootstrap.as_ref()),
                None => (None, None),
            }
        }
        reads(self) == reads(other)
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
    printcolumn = r#"{"name":"Done","type":"integer","jsonPath":".status.progress.done"}"#,
    printcolumn = r#"{"name":"Of","type":"integer","jsonPath":".status.progress.total"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.progress.node"}"#,
    printcolumn = r#"{"name":"Step","type":"string","jsonPath":".status.progress.step"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
// The spec cannot change once created: the rules decided on it when it was created (and
// the controller decides again before it runs it), so an edit would slip past them. The
// API server enforces it with this CEL transition rule; the webhook refuses it too.
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self == oldSelf",
    "message": "spec is immutable: a TalosOperation's spec cannot change once it is created; create a new TalosOperation instead"
}, {
    "rule": "self.kind != 'upgrade' || (has(self.image) && self.image != '')",
    "message": "an upgrade needs spec.image, the Talos installer image to go to (e.g. ghcr.io/siderolabs/installer:v1.12.1)"
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
    /// Without `machine`: the machines of the cluster a roll takes, by name (taken in the
    /// roll's order: approved control planes, then approved workers); empty, every approved
    /// machine. The controller's configuration roll names the machines with a staged
    /// configuration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 500))]
    pub machines: Vec<String>,
    /// The Talos installer image an `upgrade` goes to (e.g.
    /// `ghcr.io/siderolabs/installer:v1.12.1`); its tag is the version the node must report
    /// after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// The TalosEtcdBackup an `etcd-restore` restores from (same namespace and cluster),
    /// and optionally which of its snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_ref: Option<BackupRef>,
    /// Without `machine`: how many workers the roll may take down at once (1 when
    /// omitted). Control planes always go one at a time, before any worker; the
    /// `step operation` rules decide it before every step (`max_unavailable`,
    /// `roll.in_flight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_unavailable: Option<i64>,
}

/// The backup (and snapshot) an `etcd-restore` names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRef {
    /// Name of the TalosEtcdBackup.
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub name: String,
    /// The object key of the snapshot to restore; the backup's newest verified one when
    /// omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub snapshot: Option<String>,
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
    /// How far the operation's plan has come: a restarted controller resumes from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<OperationProgress>,
}

/// How far an operation has come, as the controller records it after every step. Its
/// fields are written as `null` when cleared, so the status's merge patch removes them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationProgress {
    /// Nodes done, of `total`.
    #[serde(default)]
    pub done: u32,
    #[serde(default)]
    pub total: u32,
    /// The machines it acts on, in the order it takes them (recorded once when it starts:
    /// `spec.machine`, or every approved control plane, then every approved worker, each by
    /// name), so a restarted controller continues in the same order.
    #[serde(default)]
    pub order: Vec<String>,
    /// The machine being worked on.
    #[serde(default)]
    pub node: Option<String>,
    /// The step running or waiting (as the plan writes it), and since when.
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub step_started_at: Option<Time>,
    /// When the operation started running.
    #[serde(default)]
    pub started_at: Option<Time>,
    /// The steps finished (or skipped by their guard) on the current node, as `<k>. <step>`.
    #[serde(default)]
    pub steps_done: Vec<String>,
    /// The node's boot time and Talos version before the operation's destructive call:
    /// a different boot time says the node went down and came back (so the call is not
    /// sent again), the image's tag as version says an upgrade took.
    #[serde(default)]
    pub boot_time: Option<u64>,
    #[serde(default)]
    pub version: Option<String>,
    /// The destructive call sent (a restarted controller does not send it again).
    #[serde(default)]
    pub sent: Option<String>,
    /// The image whose install (`LifecycleService/Upgrade`, Talos 1.13 and later) was sent
    /// and whose end was not seen yet: a restarted controller that finds it does not send
    /// it again (the operation fails, saying so, until a person resumes it).
    #[serde(default)]
    pub installing: Option<String>,
    /// The image installed on the node (its install ended with exit code 0), waiting for
    /// the reboot: it is not installed again.
    #[serde(default)]
    pub installed: Option<String>,
    /// The value of the annotation `ichor.maesh.dev/resume` this operation was last
    /// resumed by (a new value resumes a failed operation once more).
    #[serde(default)]
    pub resumed: Option<String>,
    /// Whether this operation cordoned the node (an administrator's cordon is left).
    #[serde(default)]
    pub cordoned: bool,
    /// An administrator had cordoned the node before this operation did anything.
    #[serde(default)]
    pub was_cordoned: bool,
    /// The node had a Kubernetes Node before the destructive call: it is back only once
    /// that Node is there and Ready again (a Node that is gone is not Ready).
    #[serde(default)]
    pub node_registered: bool,
    /// A roll's other nodes in flight beside `node` (workers, up to `spec.maxUnavailable`
    /// in all): started and not finished, each with its own record. Written empty when
    /// none, so the status's merge patch clears it.
    #[serde(default)]
    pub alongside: Vec<NodeProgress>,
}

/// One node's record of a roll, for a node in flight beside `progress.node`: the same
/// fields as `progress` keeps for that one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps_done: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_time: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installing: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed: Option<String>,
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default)]
    pub was_cordoned: bool,
    #[serde(default)]
    pub node_registered: bool,
}

impl OperationProgress {
    /// The nodes started: done, the one being worked on, and those beside it (a roll
    /// starts its nodes in `order`, so the next to start is `order[started]`).
    pub fn started(&self) -> usize {
        self.done as usize + usize::from(self.node.is_some()) + self.alongside.len()
    }

    /// The record of `node` taken out of the top-level fields (left clear).
    pub fn take_node(&mut self) -> Option<NodeProgress> {
        let node = self.node.take()?;
        Some(NodeProgress {
            node,
            step: self.step.take(),
            step_started_at: self.step_started_at.take(),
            steps_done: std::mem::take(&mut self.steps_done),
            boot_time: self.boot_time.take(),
            version: self.version.take(),
            sent: self.sent.take(),
            installing: self.installing.take(),
            installed: self.installed.take(),
            cordoned: std::mem::take(&mut self.cordoned),
            was_cordoned: std::mem::take(&mut self.was_cordoned),
            node_registered: std::mem::take(&mut self.node_registered),
        })
    }

    /// `r` as the record of the node being worked on (its top-level fields).
    pub fn put_node(&mut self, r: NodeProgress) {
        self.node = Some(r.node);
        self.step = r.step;
        self.step_started_at = r.step_started_at;
        self.steps_done = r.steps_done;
        self.boot_time = r.boot_time;
        self.version = r.version;
        self.sent = r.sent;
        self.installing = r.installing;
        self.installed = r.installed;
        self.cordoned = r.cordoned;
        self.was_cordoned = r.was_cordoned;
        self.node_registered = r.node_registered;
    }

    /// The nodes in flight (being worked on, and beside it).
    pub fn in_flight(&self) -> impl Iterator<Item = &str> {
        self.node
            .as_deref()
            .into_iter()
            .chain(self.alongside.iter().map(|r| r.node.as_str()))
    }
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

    /// spec.backupRef.name ("" when none).
    pub fn backup_name(&self) -> &str {
        self.spec
            .backup_ref
            .as_ref()
            .map_or("", |b| b.name.as_str())
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

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| find(&s.conditions, type_))
    }

    /// Paused for a reason the rules do not park with ([`Table::parks`]): by a person
    /// (Operator), the lock (ClusterLockHeld), a shutdown or a failure. The controller
    /// leaves such a pause alone.
    pub fn paused_elsewhere(&self, table: &Table) -> bool {
        self.status.as_ref().is_some_and(|s| {
            find(&s.conditions, "Paused")
                .is_some_and(|c| c.status == "True" && !table.parks(c.reason.as_deref()))
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

    /// Parked by the controller because a `hold run operation` rule held it (the shipped
    /// rules: for the even control-plane count): phase Paused, Paused=True with a reason
    /// the rules park with ([`Table::parks`], read from the rules, never a copy of their
    /// word), and no failure. Such an operation holds no lock (ADR 0137).
    pub fn parked(&self, table: &Table) -> bool {
        let paused_by_rules = self.status.as_ref().is_some_and(|s| {
            find(&s.conditions, "Paused")
                .is_some_and(|c| c.status == "True" && table.parks(c.reason.as_deref()))
        });
        self.phase() == "Paused" && paused_by_rules && !self.failed()
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

/// The CustomResourceDefinitions of the kinds, as one YAML stream.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let mut out = String::new();
    for crd in [
        TalosCluster::crd(),
        TalosMachine::crd(),
        TalosOperation::crd(),
        TalosEtcdBackup::crd(),
        TalosConfigPatch::crd(),
    ] {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
