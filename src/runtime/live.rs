//! Live, uncached reads from the API server: what a decision's rows need, read right now
//! through the kube client (no reflector, no informer cache), each bounded in time and in
//! size. A read that fails or times out fails the decision closed, and so does an answer
//! that is partial or contradicts the request: a LIST is read page by page to its end
//! (`limit`/`continue`), and every object in an answer must be of the kind, namespace,
//! cluster and name asked for, with the fields a decision needs. The decision never sees a
//! partial list.
//!
//! Reads are proportional to a cluster, not to its namespace: every fact is computed from
//! the objects of the event's cluster (`FactInfo.read`; the test at the end of this file
//! computes each from only that cluster's objects beside another cluster's), so a LIST
//! selects `spec.clusterRef.name` on the API server (a CRD `selectableFields` entry,
//! Kubernetes >= 1.32) and an answer is decoded straight from its bytes into the fields
//! decisions read ([`Decode::Decisions`]). Concurrent decisions about one cluster may share
//! a read sent after they asked, never one sent before; a [`ReadLimit`] bounds the reads in
//! flight.

use super::facts::{EventFacts, Subject};
use super::objects::{
    API_VERSION, BackupSpec, BackupStatus, ClusterSpec, ClusterStatus, Condition,
    DECIDED_ANNOTATIONS, MACHINE_CONDITIONS_DECIDED, MachineSpec, MachineStatus,
    OPERATION_CONDITIONS_DECIDED, Object, OperationSpec, OperationStatus, Snapshot, TalosCluster,
    TalosEtcdBackup, TalosMachine, TalosOperation, validate_object,
};
use crate::compile::Table;
use crate::vocab::{FACTS, Read};
use axum::body::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{GetParams, ListParams};
use kube::{Api, Client};
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// Which kinds a decision must read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// One LIST of each cluster's TalosMachines (`spec.clusterRef.name` selected).
    pub machines: bool,
    /// One GET of each TalosCluster the events are about.
    pub clusters: bool,
    /// One LIST of each cluster's TalosOperations (`spec.clusterRef.name` selected).
    pub operations: bool,
    /// One LIST of each cluster's TalosEtcdBackups (`spec.clusterRef.name` selected).
    pub backups: bool,
}

/// Whether any fact of `mask` is computed from `read` (the one declaration is `FACTS`).
fn any(mask: u64, read: Read) -> bool {
    FACTS
        .iter()
        .any(|f| f.read == read && mask & (1 << f.fact.slot()) != 0)
}

impl Reads {
    /// What the rows of these events may read. Events without rows read nothing.
    pub fn for_events(table: &Table, events: &[EventFacts<'_>]) -> Reads {
        let mut r = Reads::default();
        for ev in events {
            let (verb, subject, site) = ev.event;
            let mask = table.facts_read(verb, subject, site);
            r.machines |= any(mask, Read::Machines);
            // A request about a TalosCluster carries the cluster itself.
            r.clusters |= any(mask, Read::Cluster) && !matches!(ev.subject, Subject::Cluster(_));
            r.operations |= any(mask, Read::Operations);
            // Whether a backup's store is inside the cluster reads the cluster's network.
            let backups = any(mask, Read::Backups);
            r.backups |= backups;
            r.clusters |= backups && !matches!(ev.subject, Subject::Cluster(_));
        }
        r
    }

    pub fn is_empty(&self) -> bool {
        !(self.machines || self.clusters || self.operations || self.backups)
    }
}

/// Why a live read failed. `Display` is the one short sentence a refusal carries (what
/// could not be read, and why in a few words); [`LiveError::detail`] is for the log.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LiveError {
    #[error("{what} could not be read (no answer within {} ms)", timeout.as_millis())]
    Timeout { what: String, timeout: Duration },
    /// The request did not get an answer: connection refused, TLS, a broken body.
    #[error("{what} could not be read (the API server could not be reached)")]
    Api {
        what: String,
        #[source]
        source: Arc<kube::Error>,
    },
    /// The API server answered with an error status.
    #[error(
        "{what} could not be read (the API server answered {code}{})",
        short_reason(reason)
    )]
    Status {
        what: String,
        code: u16,
        reason: String,
        message: String,
    },
    /// The answer is partial, malformed, or contradicts the request.
    #[error("{what} could not be read ({why})")]
    Invalid { what: String, why: String },
}

/// A Kubernetes `reason` (CamelCase, such as `InternalError`) for a message; anything else
/// the server put there stays in the log.
fn short_reason(reason: &str) -> String {
    if !reason.is_empty() && reason.len() <= 40 && reason.chars().all(|c| c.is_ascii_alphabetic()) {
        format!(" {reason}")
    } else {
        String::new()
    }
}

/// At most `max` characters of `s`, control characters escaped: server-chosen text in a
/// message stays one short line.
fn clip(s: &str, max: usize) -> String {
    // The common case, a name as Kubernetes allows it, is copied as it is.
    if s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'\\' | b'"' | b'\''))
    {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).flat_map(char::escape_debug).collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

impl LiveError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            LiveError::Timeout { .. } => "timeout",
            LiveError::Api { .. } | LiveError::Status { .. } => "api",
            LiveError::Invalid { .. } => "invalid",
        }
    }

    /// Everything known about the failure, for the log (never for a refusal message).
    pub fn detail(&self) -> String {
        match self {
            LiveError::Timeout { .. } | LiveError::Invalid { .. } => self.to_string(),
            LiveError::Api { source, .. } => {
                let mut out = format!("{self}: {source}");
                let mut cause = std::error::Error::source(source.as_ref());
                while let Some(c) = cause {
                    out.push_str(&format!(": {c}"));
                    cause = c.source();
                }
                out
            }
            LiveError::Status {
                reason, message, ..
            } => format!(
                "{self}: reason {:?}, message {:?}",
                clip(reason, 200),
                clip(message, 1000)
            ),
        }
    }
}

/// Items asked for per page of a LIST.
const PAGE: u32 = 500;
/// The most pages one LIST may take: a server that keeps answering `continue` past this is
/// a failed read, not an endless one.
const MAX_PAGES: usize = 200;
/// The most bytes one answer of the API server may be.
const MAX_ANSWER: usize = 32 * 1024 * 1024;

/// Every object a LIST matches, read page by page to its end (`limit`/`continue`), for
/// reads outside [`LiveReader`] (the pods a drain must move): a first page is never taken
/// for the whole list. A list that repeats a `continue` token, or has not ended after
/// [`MAX_PAGES`] pages, is an error.
pub async fn list_complete<K>(api: &Api<K>, params: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let incomplete = |why: &str| {
        kube::Error::Api(Box::new(
            kube::core::Status::failure(&format!("an incomplete list: {why}"), "IncompleteList")
                .with_code(500),
        ))
    };
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut page_params = params.clone().limit(PAGE);
        if let Some(t) = &token {
            page_params = page_params.continue_token(t);
        }
        let page = api.list(&page_params).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            None => return Ok(out),
            Some(t) if token.as_deref() == Some(t.as_str()) => {
                return Err(incomplete(
                    "the API server answered the same `continue` token twice",
                ));
            }
            Some(t) => token = Some(t),
        }
    }
    Err(incomplete(&format!(
        "the list did not end within {MAX_PAGES} pages of {PAGE}"
    )))
}

/// Whether `s` is a Kubernetes object name (an RFC 1123 subdomain): anything else cannot
/// name an object, and would not make a sound URL path.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Whether `s` is a namespace name (an RFC 1123 label).
pub fn valid_namespace(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && valid_name(s)
}

/// The field every cluster-scoped LIST selects on: declared `selectableFields` on the
/// TalosMachine and TalosOperation CRDs (Kubernetes >= 1.32), so the API server filters on
/// the field the facts compare, `spec.clusterRef.name`, and not on a label a person could
/// leave out.
pub const CLUSTER_FIELD: &str = "spec.clusterRef.name";

/// `value` escaped for a field selector (`fields.EscapeValue`: `\`, `,` and `=`), so any
/// cluster name selects exactly itself.
pub fn escape_field_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The field selector of one cluster's objects.
pub fn cluster_selector(cluster: &str) -> String {
    format!("{CLUSTER_FIELD}={}", escape_field_value(cluster))
}

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

/// A bound on the reads in flight toward the API server, shared by the readers of one
/// replica: a burst of admissions waits for a turn instead of becoming a burst of LISTs
/// (which API priority and fairness would throttle, or the API server would suffer).
#[derive(Clone, Debug)]
pub struct ReadLimit {
    permits: Arc<Semaphore>,
    max: usize,
    stats: Arc<LimitStats>,
}

#[derive(Debug, Default)]
struct LimitStats {
    now: AtomicUsize,
    peak: AtomicUsize,
    started: AtomicU64,
}

/// Holds one of a [`ReadLimit`]'s turns.
struct Turn {
    _permit: OwnedSemaphorePermit,
    stats: Arc<LimitStats>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.stats.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ReadLimit {
    /// Reads in flight at once by default (`serve --max-inflight-reads`).
    pub const DEFAULT: usize = 16;

    /// At most `max` reads at once (at least one).
    pub fn new(max: usize) -> ReadLimit {
        let max = max.max(1);
        ReadLimit {
            permits: Arc::new(Semaphore::new(max)),
            max,
            stats: Arc::default(),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// The most reads that were in flight at once.
    pub fn peak(&self) -> usize {
        self.stats.peak.load(Ordering::SeqCst)
    }

    /// Reads (LISTs to their end, or GETs) sent so far.
    pub fn reads_started(&self) -> u64 {
        self.stats.started.load(Ordering::SeqCst)
    }

    async fn turn(&self) -> Option<Turn> {
        let permit = self.permits.clone().acquire_owned().await.ok()?;
        let now = self.stats.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.stats.peak.fetch_max(now, Ordering::SeqCst);
        self.stats.started.fetch_add(1, Ordering::SeqCst);
        Some(Turn {
            _permit: permit,
            stats: self.stats.clone(),
        })
    }
}

/// One read a decision may share with others.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ReadKey {
    /// The TalosMachines of one cluster (`namespace`, `spec.clusterRef.name`).
    Machines { namespace: String, cluster: String },
    /// The TalosOperations of one cluster.
    Operations { namespace: String, cluster: String },
    /// The TalosEtcdBackups of one cluster.
    Backups { namespace: String, cluster: String },
    /// One TalosCluster.
    Cluster { namespace: String, name: String },
    /// One TalosMachine, by name.
    Machine { namespace: String, name: String },
}

impl ReadKey {
    /// What is read, for a refusal: "the TalosMachines of TalosCluster `ns/name`".
    fn what(&self) -> String {
        match self {
            ReadKey::Machines { namespace, cluster } => format!(
                "the TalosMachines of TalosCluster `{namespace}/{}`",
                clip(cluster, 64)
            ),
            ReadKey::Operations { namespace, cluster } => format!(
                "the TalosOperations of TalosCluster `{namespace}/{}`",
                clip(cluster, 64)
            ),
            ReadKey::Backups { namespace, cluster } => format!(
                "the TalosEtcdBackups of TalosCluster `{namespace}/{}`",
                clip(cluster, 64)
            ),
            ReadKey::Cluster { namespace, name } => {
                format!("TalosCluster `{namespace}/{}`", clip(name, 64))
            }
            ReadKey::Machine { namespace, name } => {
                format!("TalosMachine `{namespace}/{}`", clip(name, 64))
            }
        }
    }
}

/// What a read found; shared by every decision that waited for it.
#[derive(Clone, Debug)]
enum Fetched {
    Machines(Arc<Vec<TalosMachine>>),
    Operations(Arc<Vec<TalosOperation>>),
    Backups(Arc<Vec<TalosEtcdBackup>>),
    Cluster(Option<Arc<TalosCluster>>),
    Machine(Option<Arc<TalosMachine>>),
}

type Outcome = Option<Result<Fetched, LiveError>>;

/// The reads of one key: one at a time, and the next one, not yet sent, that requests
/// arriving now wait for.
struct KeyState {
    /// Held while a read of this key runs: the next one starts when it ends.
    running: Arc<tokio::sync::Mutex<()>>,
    /// The read that has not been sent yet. Joining it is sound: it is sent after the
    /// request that joins it arrived, so it sees state at least as new as the request.
    next: Option<watch::Receiver<Outcome>>,
}

#[derive(Default)]
struct Flights {
    keys: Mutex<HashMap<ReadKey, KeyState>>,
    /// Reads asked for, and how many of them waited for a read another request asked.
    asked: AtomicU64,
    joined: AtomicU64,
}

/// Reads live state for decisions.
///
/// Every read is of one cluster: its TalosMachines and TalosOperations are LISTed with
/// `fieldSelector=spec.clusterRef.name=<cluster>` (the API server filters; the answer is
/// checked to hold only that cluster's objects), its TalosCluster is a GET. Concurrent
/// decisions about the same cluster may share a read, but only one sent after they asked
/// ([`KeyState::next`]): a decision never decides on state older than its request. Reads
/// in flight are bounded by a [`ReadLimit`].
#[derive(Clone)]
pub struct LiveReader {
    client: Client,
    timeout: Duration,
    decode: Decode,
    limit: ReadLimit,
    flights: Arc<Flights>,
}

/// Metadata as decisions read it: everything else is skipped while parsing.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DecisionMeta {
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
fn decided_annotations<'de, D: Deserializer<'de>>(
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
fn decided_finalizers<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let all: Option<Vec<String>> = Option::deserialize(d)?;
    Ok(all.map(|f| {
        f.into_iter()
            .filter(|x| x == crate::runtime::objects::REMOVAL_FINALIZER)
            .collect()
    }))
}

/// An annotation key: which of [`DECIDED_ANNOTATIONS`] it is, if any (compared as read,
/// not allocated).
struct Decided(Option<&'static str>);

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
struct DecidedCondition {
    #[serde(rename = "type")]
    type_: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    reason: Option<String>,
}

fn keep_conditions<'de, D: Deserializer<'de>>(
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

fn machine_conditions<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Condition>, D::Error> {
    keep_conditions(d, MACHINE_CONDITIONS_DECIDED)
}

fn operation_conditions<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Condition>, D::Error> {
    keep_conditions(d, OPERATION_CONDITIONS_DECIDED)
}

#[derive(Deserialize)]
struct DecisionMachineStatus {
    #[serde(default, deserialize_with = "machine_conditions")]
    conditions: Vec<Condition>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DecisionBackupStatus {
    #[serde(default)]
    last_snapshot: Option<crate::runtime::objects::SnapshotRecord>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DecisionOperationStatus {
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
struct Item<M, S, T> {
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
struct Page<I> {
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
struct PageMeta {
    #[serde(default, rename = "continue")]
    continue_: Option<String>,
}

/// What an answer must hold: objects of `kind` in `namespace`, named `name` when one was
/// asked for, of `cluster` when a cluster's objects were.
struct Expect<'a> {
    kind: &'static str,
    namespace: &'a str,
    name: Option<&'a str>,
    cluster: Option<&'a str>,
}

/// The checks every object of an answer passes before it is typed: the kind, namespace
/// and name asked for.
fn check_head(
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
trait Kind: Sized + Clone {
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
                        let item: Item<ObjectMeta, $spec, $status> = super::nesting::json(body)
                            .map_err(|err| {
                                format!("the answer is not a valid {}: {err}", e.kind)
                            })?;
                        typed(item, e, $build)
                    }
                    Decode::Decisions => {
                        let item: Item<DecisionMeta, $spec, $decided> = super::nesting::json(body)
                            .map_err(|err| {
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

fn into_meta<S, T>(i: Item<DecisionMeta, S, T>) -> Item<ObjectMeta, S, T> {
    Item {
        api_version: i.api_version,
        kind: i.kind,
        metadata: i.metadata.map(ObjectMeta::from),
        spec: i.spec,
        status: i.status,
    }
}

fn parse_page<I: serde::de::DeserializeOwned>(
    body: &[u8],
    e: &Expect<'_>,
) -> Result<Page<I>, String> {
    super::nesting::json(body).map_err(|err| {
        format!(
            "the answer is not a valid {API_VERSION} {}List: {}",
            e.kind,
            clip(&err.to_string(), 200)
        )
    })
}

fn typed_page<I, K: Kind>(
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
fn typed<S, T, K: Kind>(
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

fn machine_cluster(m: &TalosMachine) -> Option<&str> {
    Some(m.cluster())
}

fn operation_cluster(o: &TalosOperation) -> Option<&str> {
    Some(o.cluster())
}

fn backup_cluster(b: &TalosEtcdBackup) -> Option<&str> {
    Some(b.cluster())
}

fn no_cluster(_: &TalosCluster) -> Option<&str> {
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
fn validated<K: Kind>(
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

trait Validate: Kind {
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

/// What an answer said.
enum Answer {
    Found(Bytes),
    NotFound,
}

impl LiveReader {
    /// A reader of whole objects (the controller's), with its own [`ReadLimit`] of
    /// [`ReadLimit::DEFAULT`] reads in flight.
    pub fn new(client: Client, timeout: Duration) -> LiveReader {
        LiveReader {
            client,
            timeout,
            decode: Decode::Full,
            limit: ReadLimit::new(ReadLimit::DEFAULT),
            flights: Arc::default(),
        }
    }

    /// The same reader decoding as `decode` says (with reads of its own to share).
    pub fn decoding(mut self, decode: Decode) -> LiveReader {
        self.decode = decode;
        self.flights = Arc::default();
        self
    }

    /// The same reader taking its turns from `limit` (one limit for a replica's readers).
    pub fn limited(mut self, limit: ReadLimit) -> LiveReader {
        self.limit = limit;
        self
    }

    pub fn limit(&self) -> &ReadLimit {
        &self.limit
    }

    /// Reads asked for, and how many of them were answered by a read another decision
    /// asked for (sent after both asked).
    pub fn shared_reads(&self) -> (u64, u64) {
        (
            self.flights.asked.load(Ordering::SeqCst),
            self.flights.joined.load(Ordering::SeqCst),
        )
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends one request; a 2xx answer must be at most [`MAX_ANSWER`] bytes. A 404 is
    /// `NotFound`; any other status is an error.
    async fn send(
        &self,
        what: &str,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<Answer, LiveError> {
        let invalid = |why: String| LiveError::Invalid {
            what: what.to_string(),
            why,
        };
        let request = request.map_err(|e| invalid(format!("the request cannot be made: {e}")))?;
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(|source| LiveError::Api {
                what: what.to_string(),
                source: Arc::new(source),
            })?;
        let code = response.status();
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), MAX_ANSWER)
            .await
            .map_err(|e| {
                invalid(format!(
                    "the answer was cut off or is larger than {MAX_ANSWER} bytes: {e}"
                ))
            })?;
        if code == http::StatusCode::NOT_FOUND {
            return Ok(Answer::NotFound);
        }
        if !code.is_success() {
            let status: kube::core::Status = super::nesting::json(&body).unwrap_or_default();
            return Err(LiveError::Status {
                what: what.to_string(),
                code: code.as_u16(),
                reason: status.reason,
                message: if status.message.is_empty() {
                    String::from_utf8_lossy(&body[..body.len().min(1000)]).into_owned()
                } else {
                    status.message
                },
            });
        }
        Ok(Answer::Found(body))
    }

    /// Every object of `K` in `namespace` the field selector `selector` selects, read page
    /// by page to the end; each must be of `cluster` when one is named.
    async fn list_all<K: Validate>(
        &self,
        what: &str,
        url: &str,
        namespace: &str,
        selector: &str,
        cluster: Option<&str>,
    ) -> Result<Vec<K>, LiveError> {
        let invalid = |why: String| LiveError::Invalid {
            what: what.to_string(),
            why,
        };
        let request = kube::core::Request::new(url);
        let expect = Expect {
            kind: K::KIND,
            namespace,
            name: None,
            cluster,
        };
        let mut out: Vec<K> = Vec::new();
        let mut names = HashSet::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params = ListParams::default().fields(selector).limit(PAGE);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let body = match self.send(what, request.list(&params)).await? {
                Answer::Found(b) => b,
                Answer::NotFound => {
                    return Err(invalid(
                        "the API server answered 404: is the CustomResourceDefinition installed?"
                            .into(),
                    ));
                }
            };
            let (objects, next) = K::page(&body, self.decode, &expect).map_err(&invalid)?;
            drop(body);
            for o in objects {
                let o = o.validate().map_err(&invalid)?;
                if !names.insert(o.name().to_string()) {
                    return Err(invalid(format!(
                        "the answer lists {} `{}` twice",
                        K::KIND,
                        clip(o.name(), 64)
                    )));
                }
                out.push(o);
            }
            match next {
                None => return Ok(out),
                Some(t) if token.as_deref() == Some(t.as_str()) => {
                    return Err(invalid(
                        "the API server answered the same `continue` token twice".into(),
                    ));
                }
                Some(t) => token = Some(t),
            }
        }
        Err(invalid(format!(
            "the list did not end within {MAX_PAGES} pages of {PAGE}"
        )))
    }

    /// One object by name, or `None` when the API server says it does not exist.
    async fn get_one<K: Validate>(
        &self,
        what: &str,
        url: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>, LiveError> {
        if !valid_name(name) {
            return Err(LiveError::Invalid {
                what: what.to_string(),
                why: "that is not a valid object name".into(),
            });
        }
        let request = kube::core::Request::new(url).get(name, &GetParams::default());
        let expect = Expect {
            kind: K::KIND,
            namespace,
            name: Some(name),
            cluster: None,
        };
        match self.send(what, request).await? {
            Answer::NotFound => Ok(None),
            Answer::Found(body) => K::one(&body, self.decode, &expect)
                .and_then(K::validate)
                .map(Some)
                .map_err(|why| LiveError::Invalid {
                    what: what.to_string(),
                    why,
                }),
        }
    }

    /// Sends the read `key` names, bounded in time, once it has a turn of the limit.
    async fn fetch(&self, key: &ReadKey) -> Result<Fetched, LiveError> {
        let what = key.what();
        let Some(_turn) = self.limit.turn().await else {
            return Err(LiveError::Invalid {
                what,
                why: "the reader is shutting down".into(),
            });
        };
        let read = async {
            Ok(match key {
                ReadKey::Machines { namespace, cluster } => {
                    let api: Api<TalosMachine> = Api::namespaced(self.client.clone(), namespace);
                    Fetched::Machines(Arc::new(
                        self.list_all(
                            &what,
                            api.resource_url(),
                            namespace,
                            &cluster_selector(cluster),
                            Some(cluster),
                        )
                        .await?,
                    ))
                }
                ReadKey::Operations { namespace, cluster } => {
                    let api: Api<TalosOperation> = Api::namespaced(self.client.clone(), namespace);
                    Fetched::Operations(Arc::new(
                        self.list_all(
                            &what,
                            api.resource_url(),
                            namespace,
                            &cluster_selector(cluster),
                            Some(cluster),
                        )
                        .await?,
                    ))
                }
                ReadKey::Backups { namespace, cluster } => {
                    let api: Api<TalosEtcdBackup> = Api::namespaced(self.client.clone(), namespace);
                    Fetched::Backups(Arc::new(
                        self.list_all(
                            &what,
                            api.resource_url(),
                            namespace,
                            &cluster_selector(cluster),
                            Some(cluster),
                        )
                        .await?,
                    ))
                }
                ReadKey::Cluster { namespace, name } => {
                    let api: Api<TalosCluster> = Api::namespaced(self.client.clone(), namespace);
                    Fetched::Cluster(
                        self.get_one(&what, api.resource_url(), namespace, name)
                            .await?
                            .map(Arc::new),
                    )
                }
                // A LIST selecting the name, not a GET: what the controller is granted.
                ReadKey::Machine { namespace, name } => {
                    let api: Api<TalosMachine> = Api::namespaced(self.client.clone(), namespace);
                    let selector = format!("metadata.name={}", escape_field_value(name));
                    let found: Vec<TalosMachine> = self
                        .list_all(&what, api.resource_url(), namespace, &selector, None)
                        .await?;
                    if found.iter().any(|m| m.name() != name) {
                        return Err(LiveError::Invalid {
                            what: what.clone(),
                            why: "the answer holds a TalosMachine of another name".into(),
                        });
                    }
                    Fetched::Machine(found.into_iter().next().map(Arc::new))
                }
            })
        };
        match tokio::time::timeout(self.timeout, read).await {
            Ok(r) => r,
            Err(_) => Err(LiveError::Timeout {
                what,
                timeout: self.timeout,
            }),
        }
    }

    /// The read `key` names, sent after this call began: the one not yet sent, if another
    /// decision already asked for it, else a new one (sent once the read of the same key
    /// that is running, if any, has ended, and the limit gives a turn). Waiting is bounded
    /// by the read timeout.
    async fn read(&self, key: ReadKey) -> Result<Fetched, LiveError> {
        self.flights.asked.fetch_add(1, Ordering::SeqCst);
        let what = key.what();
        let rx = {
            let mut keys = self
                .flights
                .keys
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let state = keys.entry(key.clone()).or_insert_with(|| KeyState {
                running: Arc::default(),
                next: None,
            });
            match &state.next {
                Some(rx) => {
                    self.flights.joined.fetch_add(1, Ordering::SeqCst);
                    rx.clone()
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    state.next = Some(rx.clone());
                    let running = state.running.clone();
                    let reader = self.clone();
                    // Its own task: a decision that stops waiting (its client went away)
                    // does not take the read from the others waiting for it; the read
                    // ends early only when every one of them stopped waiting.
                    tokio::spawn(async move {
                        let guard = running.lock().await;
                        // Sent from here on: a request arriving now needs the next read.
                        reader.started(&key);
                        // Abandoned when no decision waits for it any more (each gave up
                        // or failed on another read): it would only load the API server.
                        tokio::select! {
                            result = reader.fetch(&key) => {
                                let _ = tx.send(Some(result));
                            }
                            () = tx.closed() => {}
                        }
                        drop(guard);
                        drop(running);
                        reader.forget_if_idle(&key);
                    });
                    rx
                }
            }
        };
        let mut rx = rx;
        let waited = tokio::time::timeout(self.timeout, rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(outcome)) => match &*outcome {
                Some(r) => r.clone(),
                None => Err(LiveError::Invalid {
                    what,
                    why: "the read ended without an answer".into(),
                }),
            },
            Ok(Err(_)) => Err(LiveError::Invalid {
                what,
                why: "the read ended without an answer".into(),
            }),
            Err(_) => Err(LiveError::Timeout {
                what,
                timeout: self.timeout,
            }),
        }
    }

    fn started(&self, key: &ReadKey) {
        let mut keys = self
            .flights
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(state) = keys.get_mut(key) {
            state.next = None;
        }
    }

    /// Drops the state of a key no read is running or waiting for.
    fn forget_if_idle(&self, key: &ReadKey) {
        let mut keys = self
            .flights
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if keys
            .get(key)
            .is_some_and(|s| s.next.is_none() && Arc::strong_count(&s.running) == 1)
        {
            keys.remove(key);
        }
    }

    /// One TalosMachine, read live by name (a LIST selecting `metadata.name`, which the
    /// controller's grants cover); `None` when it does not exist.
    pub async fn machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<TalosMachine>, LiveError> {
        let key = ReadKey::Machine {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        if !valid_namespace(namespace) {
            return Err(LiveError::Invalid {
                what: key.what(),
                why: "that is not a valid namespace name".into(),
            });
        }
        match self.read(key).await? {
            Fetched::Machine(m) => Ok(m.map(|m| (*m).clone())),
            _ => Ok(None),
        }
    }

    /// Reads what `reads` asks for about `clusters` of `namespace`, concurrently: for each
    /// cluster its TalosMachines and TalosOperations (a LIST each, selected by
    /// `spec.clusterRef.name`) and its TalosCluster (a GET). Facts are computed per
    /// cluster (`FactInfo.read`), so these are all a decision needs. A namespace or
    /// cluster name that cannot name an object is a failed read (it would not make a
    /// sound URL either).
    pub async fn snapshot(
        &self,
        namespace: &str,
        clusters: &[&str],
        reads: Reads,
    ) -> Result<Snapshot, LiveError> {
        if !reads.is_empty() && !valid_namespace(namespace) {
            return Err(LiveError::Invalid {
                what: format!("the objects of namespace `{}`", clip(namespace, 64)),
                why: "that is not a valid namespace name".into(),
            });
        }
        let mut names: Vec<&str> = clusters.to_vec();
        names.sort_unstable();
        names.dedup();
        let mut keys = Vec::new();
        for name in &names {
            let (namespace, cluster) = (namespace.to_string(), name.to_string());
            if reads.machines {
                keys.push(ReadKey::Machines {
                    namespace: namespace.clone(),
                    cluster: cluster.clone(),
                });
            }
            if reads.operations {
                keys.push(ReadKey::Operations {
                    namespace: namespace.clone(),
                    cluster: cluster.clone(),
                });
            }
            if reads.backups {
                keys.push(ReadKey::Backups {
                    namespace: namespace.clone(),
                    cluster: cluster.clone(),
                });
            }
            if reads.clusters && !name.is_empty() {
                keys.push(ReadKey::Cluster {
                    namespace,
                    name: cluster,
                });
            }
        }
        let fetched = futures::future::try_join_all(keys.into_iter().map(|k| self.read(k))).await?;
        let mut snapshot = Snapshot::default();
        for f in fetched {
            match f {
                Fetched::Machines(m) => snapshot.machines.extend(m.iter().cloned()),
                Fetched::Operations(o) => snapshot.operations.extend(o.iter().cloned()),
                Fetched::Backups(b) => snapshot.backups.extend(b.iter().cloned()),
                Fetched::Cluster(c) => snapshot.clusters.extend(c.map(|c| (*c).clone())),
                Fetched::Machine(m) => snapshot.machines.extend(m.map(|m| (*m).clone())),
            }
        }
        Ok(snapshot)
    }
}

#[cfg(test)]
mod read_declarations {
    use super::*;
    use crate::interp::{Facts, Lookup};
    use crate::runtime::facts::{EventFacts, Expensive, SnapshotFacts};
    use crate::vocab::{Fact, RUNTIME_EVENTS, Site, Subject as S};

    fn snapshot() -> Snapshot {
        let v = |j: serde_json::Value| j;
        let machine = |n: &str, minute: u32, unreachable: bool| {
            let mut m = v(serde_json::json!({
                "apiVersion": API_VERSION, "kind": "TalosMachine",
                "metadata": {"name": n, "namespace": "ns"},
                "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true,
                         "approvalDecision": {"at": format!("2026-11-01T10:{minute:02}:00Z")}}
            }));
            if unreachable {
                m["status"] = serde_json::json!({"conditions": [
                    {"type": "Ready", "status": "False", "reason": "NodeUnreachable"}]});
            }
            serde_json::from_value::<TalosMachine>(m).expect("machine")
        };
        let cluster: TalosCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION, "kind": "TalosCluster",
            "metadata": {"name": "prod", "namespace": "ns"},
            "spec": {"controlPlane": {"count": 3}, "schedulable": "false",
                     "network": {"podSubnets": ["172.20.0.0/16"]}}
        }))
        .expect("cluster");
        // Inside the cluster by its declared pod range only: `backup.in_cluster` needs the
        // cluster's read too.
        let backup: TalosEtcdBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION, "kind": "TalosEtcdBackup",
            "metadata": {"name": "b1", "namespace": "ns"},
            "spec": {"clusterRef": {"name": "prod"},
                     "store": {"endpoint": "http://172.20.1.1:9000", "bucket": "etcd",
                               "credentialsSecretRef": {"name": "s3"}},
                     "schedule": {"interval": "1h"}}
        }))
        .expect("backup");
        let op = |n: &str, phase: &str| -> TalosOperation {
            serde_json::from_value(serde_json::json!({
                "apiVersion": API_VERSION, "kind": "TalosOperation",
                "metadata": {"name": n, "namespace": "ns"},
                "spec": {"clusterRef": {"name": "prod"}, "kind": "reset", "machine": "cp-1",
                         "backupRef": {"name": "b1"}},
                "status": {"phase": phase}
            }))
            .expect("operation")
        };
        Snapshot {
            machines: vec![
                machine("cp-1", 1, false),
                machine("cp-2", 2, true),
                machine("cp-3", 3, false),
                machine("cp-4", 4, false),
            ],
            clusters: vec![cluster],
            operations: vec![op("op-1", "Pending"), op("op-2", "Running")],
            backups: vec![backup],
            patches: Vec::new(),
        }
    }

    /// The objects of another cluster in the same namespace: more control planes, an
    /// unfinished operation. A fact that read them would differ.
    fn other_cluster() -> (Vec<TalosMachine>, Vec<TalosOperation>) {
        let machines = (0..5)
            .map(|i| {
                serde_json::from_value::<TalosMachine>(serde_json::json!({
                    "apiVersion": API_VERSION, "kind": "TalosMachine",
                    "metadata": {"name": format!("x-{i}"), "namespace": "ns"},
                    "spec": {"clusterRef": {"name": "other"}, "role": "controlplane", "approved": true,
                             "approvalDecision": {"at": "2026-11-01T09:00:00Z"}}
                }))
                .expect("machine")
            })
            .collect();
        let ops = vec![
            serde_json::from_value::<TalosOperation>(serde_json::json!({
                "apiVersion": API_VERSION, "kind": "TalosOperation",
                "metadata": {"name": "op-0", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"clusterRef": {"name": "other"}, "kind": "reboot"},
                "status": {"phase": "Running"}
            }))
            .expect("operation"),
        ];
        (machines, ops)
    }

    /// Every fact, computed from only the reads its declaration names (plus the request's
    /// own object), is what it is from everything: a fact declared with too few reads
    /// would decide on an empty list.
    #[test]
    fn each_fact_needs_no_read_but_the_one_it_declares() {
        let table = crate::ruleset::shipped_table();
        // The whole namespace: the cluster's objects and another cluster's. A read is
        // always of one cluster (`spec.clusterRef.name` selected), so a fact that needed
        // another cluster's objects, or the namespace's, would differ here: such a fact
        // needs a read of its own before the webhook may use it.
        let mut full = snapshot();
        let (machines, ops) = other_cluster();
        full.machines.extend(machines);
        full.operations.extend(ops);
        let cluster_only = snapshot();
        for info in FACTS {
            let Some(&(verb, subject, site)) = RUNTIME_EVENTS
                .iter()
                .find(|(v, s, site)| info.fact.available(*v, *s, *site) && *site == Site::Webhook)
            else {
                continue;
            };
            let mut part = Snapshot::default();
            match info.read {
                Read::Machines => part.machines = cluster_only.machines.clone(),
                Read::Cluster => part.clusters = cluster_only.clusters.clone(),
                Read::Operations => part.operations = cluster_only.operations.clone(),
                Read::Backups => {
                    part.backups = cluster_only.backups.clone();
                    part.clusters = cluster_only.clusters.clone();
                }
                Read::Request => {}
            }
            let value = |snap: &Snapshot| -> String {
                let ev = match subject {
                    S::Operation => EventFacts {
                        event: (verb, subject, site),
                        namespace: "ns",
                        cluster: "prod",
                        subject: crate::runtime::facts::Subject::Operation(&full.operations[1]),
                    },
                    S::Cluster => EventFacts {
                        event: (verb, subject, site),
                        namespace: "ns",
                        cluster: "prod",
                        subject: crate::runtime::facts::Subject::Cluster(&full.clusters[0]),
                    },
                    _ => EventFacts {
                        event: (verb, subject, site),
                        namespace: "ns",
                        cluster: "prod",
                        subject: crate::runtime::facts::Subject::Machine {
                            name: "cp-1",
                            view: &full.machines[0],
                            counted: Some(&full.machines[0]),
                        },
                    },
                };
                let mut f = SnapshotFacts::new(&table, snap, ev, Expensive::FromObjects);
                match f.fact(info.fact) {
                    Lookup::Value(v) => format!("{v:?}"),
                    Lookup::Later => "later".into(),
                }
            };
            assert_eq!(
                value(&part),
                value(&full),
                "`{}` is declared as read from {:?}, but needs more",
                info.name,
                info.read
            );
            // The backup facts are not vacuous here: the backup is found, and inside the
            // cluster by its declared range.
            if matches!(info.fact, Fact::BackupExists | Fact::BackupInCluster) {
                assert_eq!(value(&full), "Bool(true)", "{}", info.name);
            }
        }
    }

    /// Objects as a cluster holds them: managedFields, labels, a last-applied annotation,
    /// conditions with messages, removal progress.
    fn rich_objects() -> (serde_json::Value, serde_json::Value, serde_json::Value) {
        use serde_json::json;
        let managed = json!([{"manager": "kubectl", "operation": "Apply", "apiVersion": API_VERSION,
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:role": {}, "f:approved": {}}}}]);
        let meta = |name: &str, extra: serde_json::Value| {
            let mut m = json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "resourceVersion": "42", "generation": 3,
                "creationTimestamp": "2026-11-01T08:00:00Z",
                "labels": {"team": "a"}, "managedFields": managed.clone(),
                "finalizers": ["ichor.maesh.dev/machine-removal"],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"x\": 1}"}});
            if let (Some(m), serde_json::Value::Object(extra)) = (m.as_object_mut(), extra) {
                for (k, v) in extra {
                    m.insert(k, v);
                }
            }
            m
        };
        let conds = |ready: &str, reason: &str| {
            json!([
            {"type": "Ready", "status": ready, "reason": reason, "message": "long words", "lastTransitionTime": "2026-11-01T08:00:00Z"},
            {"type": "NodeReachable", "status": "False", "reason": "Timeout", "message": "x"},
            {"type": "Removal", "status": "True", "reason": "DeadMemberRemoval", "message": "y"}])
        };
        let machines = json!({"apiVersion": API_VERSION, "kind": "TalosMachineList", "metadata": {"resourceVersion": "42"},
            "items": (1..=5).map(|i| json!({"apiVersion": API_VERSION, "kind": "TalosMachine",
                "metadata": meta(&format!("cp-{i}"), if i == 2 {
                    json!({"deletionTimestamp": "2026-11-02T00:00:00Z",
                           "annotations": {"ichor.maesh.dev/allow-delete": "true", "other": "x"}})
                } else { json!({}) }),
                "spec": {"clusterRef": {"name": "prod"}, "role": if i == 5 {"worker"} else {"controlplane"}, "approved": i != 4,
                         "approvalDecision": {"at": format!("2026-11-01T10:0{i}:00Z")}, "endpoint": "10.0.0.1"},
                "status": {"conditions": conds(if i == 3 {"False"} else {"True"}, if i == 3 {"NodeUnreachable"} else {"Ok"}),
                           "removal": {"memberDead": true, "done": ["drain node"], "committed": false}}
            })).collect::<Vec<_>>()});
        let ops = json!({"apiVersion": API_VERSION, "kind": "TalosOperationList", "metadata": {},
            "items": [
                {"apiVersion": API_VERSION, "kind": "TalosOperation", "metadata": meta("op-1", json!({})),
                 "spec": {"clusterRef": {"name": "prod"}, "kind": "reset", "machine": "cp-1"},
                 "status": {"phase": "Paused", "conditions": [
                     {"type": "Paused", "status": "True", "reason": "ClusterTransitioning", "message": "m"},
                     {"type": "Accepted", "status": "False", "reason": "StartRefused", "message": "m"},
                     {"type": "Progressing", "status": "True", "reason": "X"}]}},
                {"apiVersion": API_VERSION, "kind": "TalosOperation", "metadata": meta("op-2", json!({})),
                 "spec": {"clusterRef": {"name": "prod"}, "kind": "upgrade"},
                 "status": {"phase": "Running", "failureReason": "boom", "conditions": [
                     {"type": "Paused", "status": "True", "reason": "Operator"}]}}]});
        let cluster = json!({"apiVersion": API_VERSION, "kind": "TalosCluster",
            "metadata": meta("prod", json!({"annotations": {"ichor.maesh.dev/allow-delete": "true"}})),
            "spec": {"controlPlane": {"count": 3}, "schedulable": "false"},
            "status": {"conditions": [{"type": "Transitioning", "status": "False", "reason": "StableControlPlaneCount"}]}});
        (machines, ops, cluster)
    }

    fn decoded(decode: Decode) -> Snapshot {
        let (machines, ops, cluster) = rich_objects();
        let expect = |kind, name, cluster| Expect {
            kind,
            namespace: "ns",
            name,
            cluster,
        };
        let bytes = |v: &serde_json::Value| serde_json::to_vec(v).expect("json");
        let (machines, _) = TalosMachine::page(
            &bytes(&machines),
            decode,
            &expect("TalosMachine", None, Some("prod")),
        )
        .expect("machines");
        let (operations, _) = TalosOperation::page(
            &bytes(&ops),
            decode,
            &expect("TalosOperation", None, Some("prod")),
        )
        .expect("operations");
        let cluster = TalosCluster::one(
            &bytes(&cluster),
            decode,
            &expect("TalosCluster", Some("prod"), None),
        )
        .expect("cluster");
        Snapshot {
            machines,
            clusters: vec![cluster],
            operations,
            backups: Vec::new(),
            patches: Vec::new(),
        }
    }

    /// `metadata.finalizers` as an answer may hold it: a list with a non-string entry, or
    /// not a list, fails the page (the read refuses) in both decodings; `null`, an empty
    /// list and other finalizers only are no removal finalizer, and a huge list of
    /// others keeps nothing but the one a fact reads.
    #[test]
    fn malformed_finalizers_fail_the_read_and_others_are_dropped() {
        use crate::runtime::objects::REMOVAL_FINALIZER;
        use serde_json::json;
        let page = |finalizers: serde_json::Value, decode: Decode| {
            let list = json!({"apiVersion": API_VERSION, "kind": "TalosMachineList",
                "metadata": {"resourceVersion": "1"},
                "items": [{"apiVersion": API_VERSION, "kind": "TalosMachine",
                    "metadata": {"name": "cp-1", "namespace": "ns", "finalizers": finalizers},
                    "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true}}]});
            let expect = Expect {
                kind: "TalosMachine",
                namespace: "ns",
                name: None,
                cluster: Some("prod"),
            };
            TalosMachine::page(&serde_json::to_vec(&list).expect("json"), decode, &expect)
                .map(|(items, _)| items)
        };
        for decode in [Decode::Full, Decode::Decisions] {
            for bad in [
                json!([1]),
                json!(["a", {"b": 1}]),
                json!("x"),
                json!({"a": "b"}),
            ] {
                assert!(page(bad.clone(), decode).is_err(), "{bad} decoded");
            }
            let mut many: Vec<String> = (0..10_000).map(|i| format!("other/{i}")).collect();
            many.push(REMOVAL_FINALIZER.to_string());
            for (finalizers, holds) in [
                (json!(null), false),
                (json!([]), false),
                (json!(["other/x"]), false),
                (json!(many), true),
            ] {
                let items = page(finalizers.clone(), decode).expect("decodes");
                assert_eq!(items[0].holds_removal_finalizer(), holds, "{finalizers}");
            }
        }
        let items =
            page(json!(["other/x", REMOVAL_FINALIZER]), Decode::Decisions).expect("decodes");
        assert_eq!(
            items[0].metadata.finalizers.as_deref(),
            Some(&[REMOVAL_FINALIZER.to_string()][..]),
            "only the removal finalizer is kept"
        );
    }

    /// Decoding for decisions keeps everything a fact reads: every fact of every event,
    /// for every subject, is the same from whole objects and from what `Decisions` keeps.
    #[test]
    fn decoding_for_decisions_keeps_every_fact() {
        let table = crate::ruleset::shipped_table();
        let full = decoded(Decode::Full);
        let slim = decoded(Decode::Decisions);
        // Whole objects are whole (as typed_object reads them), the slim ones are not.
        let (machines, ..) = rich_objects();
        let whole =
            crate::runtime::objects::typed_object("TalosMachine", machines["items"][0].clone())
                .expect("typed");
        assert_eq!(Object::Machine(full.machines[0].clone()), whole);
        assert!(slim.machines[0].metadata.managed_fields.is_none());
        assert!(
            slim.machines[0]
                .status
                .as_ref()
                .is_some_and(|s| s.removal.is_none() && s.conditions.len() == 2)
        );
        assert_eq!(
            slim.machines[1]
                .metadata
                .annotations
                .as_ref()
                .map(|a| a.len()),
            Some(1),
            "only the annotations a fact reads"
        );
        for &(verb, subject, site) in RUNTIME_EVENTS {
            for pick in 0..5 {
                let value = |snap: &Snapshot, fact: crate::vocab::Fact| -> String {
                    let ev = EventFacts {
                        event: (verb, subject, site),
                        namespace: "ns",
                        cluster: "prod",
                        subject: match subject {
                            S::Operation => crate::runtime::facts::Subject::Operation(
                                &snap.operations[pick % 2],
                            ),
                            S::Cluster => {
                                crate::runtime::facts::Subject::Cluster(&snap.clusters[0])
                            }
                            _ => crate::runtime::facts::Subject::Machine {
                                name: snap.machines[pick].name(),
                                view: &snap.machines[pick],
                                counted: Some(&snap.machines[pick]),
                            },
                        },
                    };
                    for expensive in [Expensive::FromObjects, Expensive::Deferred] {
                        let mut f = SnapshotFacts::new(&table, snap, ev, expensive);
                        if let Lookup::Value(v) = f.fact(fact) {
                            return format!("{v:?}");
                        }
                    }
                    "later".into()
                };
                for info in FACTS {
                    if !info.fact.available(verb, subject, site) {
                        continue;
                    }
                    assert_eq!(
                        value(&slim, info.fact),
                        value(&full, info.fact),
                        "{verb:?} {subject:?} {site:?} subject {pick}: `{}`",
                        info.name
                    );
                }
            }
        }
    }

    #[test]
    fn field_selector_values_are_escaped() {
        assert_eq!(cluster_selector("prod"), "spec.clusterRef.name=prod");
        assert_eq!(cluster_selector(""), "spec.clusterRef.name=");
        assert_eq!(
            cluster_selector("a,b=c\\d"),
            "spec.clusterRef.name=a\\,b\\=c\\\\d"
        );
    }
}

#[cfg(test)]
mod clipping {
    use super::clip;

    /// What `clip` always meant: at most `max` characters, escaped as `escape_debug` does.
    fn slow(s: &str, max: usize) -> String {
        let mut out: String = s.chars().take(max).flat_map(char::escape_debug).collect();
        if s.chars().count() > max {
            out.push('…');
        }
        out
    }

    #[test]
    fn the_fast_path_for_plain_names_says_what_the_escaping_one_says() {
        for s in [
            "cp-1",
            "",
            "a\"b",
            "it's",
            "back\\slash",
            "tab\there",
            "new\nline",
            "sp ace",
            "é",
            "x".repeat(64).as_str(),
            "x".repeat(65).as_str(),
            "\u{202e}rtl",
        ] {
            assert_eq!(clip(s, 64), slow(s, 64), "{s:?}");
        }
    }
}
