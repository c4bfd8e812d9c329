//! Decoding an answer of the API server: pure, no I/O. Each object is checked against
//! what was asked (kind, namespace, cluster, name) and the CRDs' schemas, and with
//! [`Decode::Decisions`] only the fields decisions read are kept.

use super::*;
use crate::runtime::objects::{
    API_VERSION, BackupSpec, BackupStatus, ClusterSpec, ClusterStatus, Condition,
    DECIDED_ANNOTATIONS, MACHINE_CONDITIONS_DECIDED, MachineSpec, MachineStatus,
    OPERATION_CONDITIONS_DECIDED, Object, OperationSpec, OperationStatus, TalosCluster,
    TalosEtcdBackup, TalosMachine, TalosOperation, validate_object,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// How objects of an answer are decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decode {
    /// Whole objects: the controller writes back what it reads.
    Full,
    /// Only what decisions read: name, namespace, creation and deletion times, the
    /// annotations the facts read ([`DECIDED_ANNOTATIONS`]), the spec, and of the status
    /// the phase, failure reason and the conditions the facts read
    /// ([`MACHINE_CONDITIONS_DECIDED`], [`OPERATION_CONDITIONS_DECIDED`]) without their
    /// messages. Everything else (managedFields, labels, the last-applied annotation,
    /// removal progress) is skipped while parsing, never allocated.
    Decisions,
}

/// Metadata as decisions read it: everything else is skipped while parsing.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DecisionMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    /// What a decision record names each object it read by (`runtime::records`).
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default, deserialize_with = "decided_annotations")]
    annotations: Option<BTreeMap<String, String>>,
    /// Only the removal finalizer is read (`target.uncounted`); the others are dropped.
    #[serde(default, deserialize_with = "decided_finalizers")]
    finalizers: Option<Vec<String>>,
}

impl From<DecisionMeta> for ObjectMeta {
    fn from(m: DecisionMeta) -> ObjectMeta {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            resource_version: m.resource_version,
            annotations: m.annotations,
            finalizers: m.finalizers,
            ..ObjectMeta::default()
        }
    }
}

/// Keeps the annotations of [`DECIDED_ANNOTATIONS`]; the others (a last-applied
/// configuration of any size) are skipped unread.
pub(super) fn decided_annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Keep;
    impl<'de> Visitor<'de> for Keep {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of annotations")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(Keep)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<Decided>()? {
                match key.0 {
                    Some(k) => {
                        out.insert(k.to_string(), map.next_value::<String>()?);
                    }
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(Some(out))
        }
    }
    d.deserialize_option(Keep)
}

/// Keeps the removal finalizer, the one a fact reads; the others are dropped.
pub(super) fn decided_finalizers<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<String>>, D::Error> {
    let all: Option<Vec<String>> = Option::deserialize(d)?;
    Ok(all.map(|f| {
        f.into_iter()
            .filter(|x| x == crate::runtime::objects::REMOVAL_FINALIZER)
            .collect()
    }))
}

/// An annotation key: which of [`DECIDED_ANNOTATIONS`] it is, if any (compared as read,
/// not allocated).
pub(super) struct Decided(Option<&'static str>);

impl<'de> Deserialize<'de> for Decided {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Decided, D::Error> {
        struct Key;
        impl Visitor<'_> for Key {
            type Value = Decided;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an annotation key")
            }
            fn visit_str<E>(self, s: &str) -> Result<Decided, E> {
                Ok(Decided(
                    DECIDED_ANNOTATIONS.iter().copied().find(|k| *k == s),
                ))
            }
        }
        d.deserialize_str(Key)
    }
}

/// A condition as decisions read it: type, status and reason.
#[derive(Deserialize)]
pub(super) struct DecidedCondition {
    #[serde(rename = "type")]
    type_: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    reason: Option<String>,
}

pub(super) fn keep_conditions<'de, D: Deserializer<'de>>(
    d: D,
    types: &[&str],
) -> Result<Vec<Condition>, D::Error> {
    let all: Option<Vec<DecidedCondition>> = Option::deserialize(d)?;
    Ok(all
        .unwrap_or_default()
        .into_iter()
        .filter(|c| types.contains(&c.type_.as_str()))
        .map(|c| Condition {
            type_: c.type_,
            status: c.status,
            reason: c.reason,
            message: None,
            last_transition_time: None,
        })
        .collect())
}

pub(super) fn machine_conditions<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<Condition>, D::Error> {
    keep_conditions(d, MACHINE_CONDITIONS_DECIDED)
}

pub(super) fn operation_conditions<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<Condition>, D::Error> {
    keep_conditions(d, OPERATION_CONDITIONS_DECIDED)
}

#[derive(Deserialize)]
pub(super) struct DecisionMachineStatus {
    #[serde(default, deserialize_with = "machine_conditions")]
    conditions: Vec<Condition>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DecisionBackupStatus {
    #[serde(default)]
    last_snapshot: Option<crate::runtime::objects::SnapshotRecord>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DecisionOperationStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    failure_reason: Option<String>,
    #[serde(default, deserialize_with = "operation_conditions")]
    conditions: Vec<Condition>,
}

/// One object of an answer, its parts decoded as `M`, `S`, `T` say.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Item<M, S, T> {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default = "Option::default")]
    metadata: Option<M>,
    #[serde(default = "Option::default")]
    spec: Option<S>,
    #[serde(default = "Option::default")]
    status: Option<T>,
}

/// One page of a LIST answer.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Page<I> {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: PageMeta,
    #[serde(default = "Option::default")]
    items: Option<Vec<I>>,
}

#[derive(Default, Deserialize)]
pub(super) struct PageMeta {
    #[serde(default, rename = "continue")]
    continue_: Option<String>,
}

/// What an answer must hold: objects of `kind` in `namespace`, named `name` when one was
/// asked for, of `cluster` when a cluster's objects were.
pub(super) struct Expect<'a> {
    pub(super) kind: &'static str,
    pub(super) namespace: &'a str,
    pub(super) name: Option<&'a str>,
    pub(super) cluster: Option<&'a str>,
}

/// The checks every object of an answer passes before it is typed: the kind, namespace
/// and name asked for.
pub(super) fn check_head(
    e: &Expect<'_>,
    api_version: Option<&str>,
    kind: Option<&str>,
    meta: &ObjectMeta,
) -> Result<(), String> {
    if (api_version, kind) != (Some(API_VERSION), Some(e.kind)) {
        return Err(format!(
            "the answer holds a {} {} where a {API_VERSION} {} was asked for",
            clip(api_version.unwrap_or("(no apiVersion)"), 64),
            clip(kind.unwrap_or("(no kind)"), 64),
            e.kind,
        ));
    }
    let found_name = meta.name.as_deref().unwrap_or("");
    if found_name.is_empty() {
        return Err(format!("the answer holds a {} without a name", e.kind));
    }
    if let Some(name) = e.name
        && found_name != name
    {
        return Err(format!(
            "the answer is {} `{}`, not the `{name}` asked for",
            e.kind,
            clip(found_name, 64)
        ));
    }
    match meta.namespace.as_deref() {
        Some(ns) if ns == e.namespace => Ok(()),
        Some(ns) => Err(format!(
            "the answer holds {} `{}` of namespace `{}`, not of `{}`",
            e.kind,
            clip(found_name, 64),
            clip(ns, 64),
            e.namespace
        )),
        None => Err(format!(
            "the answer holds {} `{}` without a namespace",
            e.kind,
            clip(found_name, 64)
        )),
    }
}

/// A kind a decision reads, decoded straight from the answer's bytes (never through a
/// `serde_json::Value`, which costs several times the object's size).
pub(super) trait Kind: Sized + Clone {
    const KIND: &'static str;
    fn name(&self) -> &str;
    fn cluster(&self) -> Option<&str>;
    /// One object from an answer, checked against `e`.
    fn one(body: &[u8], decode: Decode, e: &Expect<'_>) -> Result<Self, String>;
    /// One page of a LIST answer, each object checked against `e`, and its `continue`.
    fn page(
        body: &[u8],
        decode: Decode,
        e: &Expect<'_>,
    ) -> Result<(Vec<Self>, Option<String>), String>;
}

/// Decodes an answer (one object, or a page) with the metadata and status types `decode`
/// asks for, then builds the object with `build`.
macro_rules! kind_impl {
    ($ty:ty, $kind:literal, $spec:ty, $status:ty, $decided:ty,
     $cluster:path, $build:expr, $build_decided:expr) => {
        impl Kind for $ty {
            const KIND: &'static str = $kind;
            fn name(&self) -> &str {
                <$ty>::name(self)
            }
            fn cluster(&self) -> Option<&str> {
                $cluster(self)
            }
            fn one(body: &[u8], decode: Decode, e: &Expect<'_>) -> Result<Self, String> {
                match decode {
                    Decode::Full => {
                        let item: Item<ObjectMeta, $spec, $status> =
                            crate::runtime::nesting::json(body).map_err(|err| {
                                format!("the answer is not a valid {}: {err}", e.kind)
                            })?;
                        typed(item, e, $build)
                    }
                    Decode::Decisions => {
                        let item: Item<DecisionMeta, $spec, $decided> =
                            crate::runtime::nesting::json(body).map_err(|err| {
                                format!("the answer is not a valid {}: {err}", e.kind)
                            })?;
                        typed(into_meta(item), e, $build_decided)
                    }
                }
            }
            fn page(
                body: &[u8],
                decode: Decode,
                e: &Expect<'_>,
            ) -> Result<(Vec<Self>, Option<String>), String> {
                match decode {
                    Decode::Full => {
                        let page: Page<Item<ObjectMeta, $spec, $status>> = parse_page(body, e)?;
                        typed_page(page, e, |i| typed(i, e, $build))
                    }
                    Decode::Decisions => {
                        let page: Page<Item<DecisionMeta, $spec, $decided>> = parse_page(body, e)?;
                        typed_page(page, e, |i| typed(into_meta(i), e, $build_decided))
                    }
                }
            }
        }
    };
}

pub(super) fn into_meta<S, T>(i: Item<DecisionMeta, S, T>) -> Item<ObjectMeta, S, T> {
    Item {
        api_version: i.api_version,
        kind: i.kind,
        metadata: i.metadata.map(ObjectMeta::from),
        spec: i.spec,
        status: i.status,
    }
}

pub(super) fn parse_page<I: serde::de::DeserializeOwned>(
    body: &[u8],
    e: &Expect<'_>,
) -> Result<Page<I>, String> {
    crate::runtime::nesting::json(body).map_err(|err| {
        format!(
            "the answer is not a valid {API_VERSION} {}List: {}",
            e.kind,
            clip(&err.to_string(), 200)
        )
    })
}

pub(super) fn typed_page<I, K: Kind>(
    page: Page<I>,
    e: &Expect<'_>,
    each: impl Fn(I) -> Result<K, String>,
) -> Result<(Vec<K>, Option<String>), String> {
    let list_kind = format!("{}List", e.kind);
    if (page.api_version.as_deref(), page.kind.as_deref())
        != (Some(API_VERSION), Some(list_kind.as_str()))
    {
        return Err(format!(
            "the answer is a {} {}, not a {API_VERSION} {list_kind}",
            clip(page.api_version.as_deref().unwrap_or("(no apiVersion)"), 64),
            clip(page.kind.as_deref().unwrap_or("(no kind)"), 64),
        ));
    }
    let Some(items) = page.items else {
        return Err("its `items` is missing or null".into());
    };
    let objects = items.into_iter().map(each).collect::<Result<Vec<_>, _>>()?;
    let next = page.metadata.continue_.filter(|c| !c.is_empty());
    Ok((objects, next))
}

/// The checked, typed object of an item; for a cluster's objects, of that cluster (a
/// server that ignored the field selector would otherwise mix clusters into a count).
pub(super) fn typed<S, T, K: Kind>(
    item: Item<ObjectMeta, S, T>,
    e: &Expect<'_>,
    build: impl Fn(ObjectMeta, S, Option<T>) -> K,
) -> Result<K, String> {
    let meta = item.metadata.unwrap_or_default();
    check_head(e, item.api_version.as_deref(), item.kind.as_deref(), &meta)?;
    let label = |meta: &ObjectMeta| clip(meta.name.as_deref().unwrap_or(""), 64);
    let Some(spec) = item.spec else {
        return Err(format!(
            "{} `{}` of the answer has no spec",
            e.kind,
            label(&meta)
        ));
    };
    let object = build(meta, spec, item.status);
    if let (Some(want), Some(found)) = (e.cluster, object.cluster())
        && want != found
    {
        return Err(format!(
            "the answer holds {} `{}` of TalosCluster `{}`, not of `{}` asked for",
            e.kind,
            clip(object.name(), 64),
            clip(found, 64),
            clip(want, 64)
        ));
    }
    Ok(object)
}

pub(super) fn machine_cluster(m: &TalosMachine) -> Option<&str> {
    Some(m.cluster())
}

pub(super) fn operation_cluster(o: &TalosOperation) -> Option<&str> {
    Some(o.cluster())
}

pub(super) fn backup_cluster(b: &TalosEtcdBackup) -> Option<&str> {
    Some(b.cluster())
}

pub(super) fn no_cluster(_: &TalosCluster) -> Option<&str> {
    None
}

kind_impl!(
    TalosMachine,
    "TalosMachine",
    MachineSpec,
    MachineStatus,
    DecisionMachineStatus,
    machine_cluster,
    |metadata, spec, status| TalosMachine {
        metadata,
        spec,
        status
    },
    |metadata, spec, status: Option<DecisionMachineStatus>| TalosMachine {
        metadata,
        spec,
        status: status.map(|s| MachineStatus {
            conditions: s.conditions,
            removal: None,
            config: None,
        }),
    }
);

kind_impl!(
    TalosOperation,
    "TalosOperation",
    OperationSpec,
    OperationStatus,
    DecisionOperationStatus,
    operation_cluster,
    |metadata, spec, status| TalosOperation {
        metadata,
        spec,
        status
    },
    |metadata, spec, status: Option<DecisionOperationStatus>| TalosOperation {
        metadata,
        spec,
        status: status.map(|s| OperationStatus {
            phase: s.phase,
            conditions: s.conditions,
            failure_reason: s.failure_reason,
            progress: None,
        }),
    }
);

kind_impl!(
    TalosCluster,
    "TalosCluster",
    ClusterSpec,
    ClusterStatus,
    IgnoredAny,
    no_cluster,
    |metadata, spec, status| TalosCluster {
        metadata,
        spec,
        status
    },
    |metadata, spec, _: Option<IgnoredAny>| TalosCluster {
        metadata,
        spec,
        status: None
    }
);

// A decision reads a backup's spec (its store) and, of its status, its newest verified
// snapshot (`snapshot.*`).
kind_impl!(
    TalosEtcdBackup,
    "TalosEtcdBackup",
    BackupSpec,
    BackupStatus,
    DecisionBackupStatus,
    backup_cluster,
    |metadata, spec, status| TalosEtcdBackup {
        metadata,
        spec,
        status
    },
    |metadata, spec, status: Option<DecisionBackupStatus>| TalosEtcdBackup {
        metadata,
        spec,
        status: status.map(|s| BackupStatus {
            last_snapshot: s.last_snapshot,
            ..BackupStatus::default()
        }),
    }
);

/// What the CRDs' schemas enforce (the count, schedulable, the operation kind): an object
/// that breaks them is an invalid answer.
pub(super) fn validated<K: Kind>(
    o: K,
    wrap: impl Fn(K) -> Object,
    unwrap: impl Fn(Object) -> Option<K>,
) -> Result<K, String> {
    let object = wrap(o);
    validate_object(&object).map_err(|e| {
        format!(
            "{} `{}` of the answer is not valid: {}",
            K::KIND,
            clip(object.metadata().name.as_deref().unwrap_or(""), 64),
            clip(&e, 200)
        )
    })?;
    unwrap(object).ok_or_else(|| format!("the answer is not a {}", K::KIND))
}

pub(super) trait Validate: Kind {
    fn validate(self) -> Result<Self, String>;
}

impl Validate for TalosMachine {
    fn validate(self) -> Result<Self, String> {
        validated(self, Object::Machine, |o| match o {
            Object::Machine(m) => Some(m),
            _ => None,
        })
    }
}

impl Validate for TalosOperation {
    fn validate(self) -> Result<Self, String> {
        validated(self, Object::Operation, |o| match o {
            Object::Operation(m) => Some(m),
            _ => None,
        })
    }
}

impl Validate for TalosEtcdBackup {
    fn validate(self) -> Result<Self, String> {
        validated(self, Object::Backup, |o| match o {
            Object::Backup(b) => Some(b),
            _ => None,
        })
    }
}

impl Validate for TalosCluster {
    fn validate(self) -> Result<Self, String> {
        validated(self, Object::Cluster, |o| match o {
            Object::Cluster(m) => Some(m),
            _ => None,
        })
    }
}
