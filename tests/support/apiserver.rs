//! An in-process Kubernetes API server for tests, served over HTTP on 127.0.0.1 so the real
//! kube client code path (URLs, serialization, errors, watch) is exercised.
//!
//! What it has, each as the real API server has it:
//! - kinds: the ichor.maesh.dev/v1alpha1 TalosCluster, TalosMachine and TalosOperation;
//!   Node, Pod and Event (core/v1), Event (events.k8s.io/v1), PodDisruptionBudget
//!   (policy/v1), Lease (coordination.k8s.io/v1), Deployment, ReplicaSet and StatefulSet
//!   (apps/v1, stored only: no controller acts on them); and `GET /version`;
//! - verbs: get, list, watch, create (`generateName` too), update (PUT), merge patch, JSON
//!   patch, delete; `dryRun=All` on every write;
//! - list: `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`; a malformed one
//!   is a 400), `fieldSelector` (`=`, `==`, `!=`) on `metadata.name`, `metadata.namespace`
//!   and the fields each kind supports (pods: `spec.nodeName`, `status.phase`, …; nodes:
//!   `spec.unschedulable`; core events: `involvedObject.*`, `reason`, `source`, `type`, …;
//!   replica sets: `status.replicas`; custom resources: the `selectableFields` their
//!   CustomResourceDefinition declares, read from the CRDs `ichor-rules crds` prints, an
//!   absent field selecting as the empty string; any other field is a 400 BadRequest
//!   `field label not supported: …`; values unescaped as `fields.ParseSelector` does, `\,`,
//!   `\=` and `\\`), `limit` and `continue`; a list selecting `metadata.name`, or one of
//!   the fields above with `=`, reads only the objects with that value (an index by
//!   resource, field and value kept on every write, as the watch cache's indexers are), so
//!   its cost is that of its answer, not of the namespace ([`ApiServer::index_drift`]
//!   compares the index with a scan)
//!   (with `remainingItemCount` when there is no selector), items ordered by namespace and
//!   name; a namespaced kind listed without a namespace spans all of them;
//! - watch: from a resourceVersion it replays what changed after it, then follows; without
//!   one (or with "0") it starts with an ADDED event per object; `sendInitialEvents=true`
//!   (streaming lists) ends the initial events with the `k8s.io/initial-events-end`
//!   bookmark; a MODIFIED object that leaves a watch's selector arrives as DELETED and one
//!   that enters it as ADDED; bookmarks (`allowWatchBookmarks`) every minute;
//!   `timeoutSeconds`; a resourceVersion older than the kept history (the last 4096
//!   changes, or anything before [`ApiServer::compact`]) gets one ERROR event, 410 Expired;
//!   a watcher more than 4096 changes behind is closed;
//! - resourceVersion: a new one on every write (a write that changes nothing keeps it);
//!   409 Conflict on a stale update, patch or delete precondition; a PUT without one is a
//!   422 on kinds that require it (custom resources, Leases, PDBs); a create that carries
//!   one is refused (500, as etcd3 storage answers it);
//! - errors as `Status` objects: 404 NotFound, 409 AlreadyExists, 400 for a name or
//!   namespace that does not match the URL, 422 for a failing JSON patch or a changed uid;
//! - a PUT of a missing Lease creates it; `metadata.generation` (custom resources, pods,
//!   PDBs, apps kinds) is 1 on create and counts changes outside metadata and status; uid,
//!   creationTimestamp and deletionTimestamp are server-owned;
//! - finalizers: a delete of an object with finalizers only sets deletionTimestamp (and no
//!   finalizer may be added after that, 422); the object goes away when its last finalizer
//!   is removed; a delete answers with the object (custom resources, pods, or one that
//!   waits for finalizers) or else with a Success Status;
//! - the status subresource (custom resources, pods, nodes, PDBs, apps kinds): writes to
//!   the object ignore `status`, writes to `/status` change only `status`; a create drops
//!   the posted status (custom resources, PDBs, apps kinds), sets a pod's to `phase:
//!   Pending`, and keeps a node's;
//! - pods/eviction as the eviction REST handler decides it: a pod that is Pending,
//!   Succeeded, Failed or being deleted is evicted regardless of budgets; otherwise the
//!   PodDisruptionBudget selecting it must allow a disruption (429 TooManyRequests with a
//!   DisruptionBudget cause if not; 500 when more than one budget selects the pod); a pod
//!   that is not Ready may go while its budget is healthy or its
//!   `unhealthyPodEvictionPolicy` is AlwaysAllow; the budget is what the disruption
//!   controller would compute: an integer minAvailable counts the selected pods, a
//!   percentage or maxUnavailable the `spec.replicas` of their controllers (a ReplicaSet,
//!   or the Deployment controlling it, or a StatefulSet; pods without a controller do not
//!   count, and a controller the server does not hold allows no disruption); healthy pods
//!   are the Ready ones not being deleted; percentages round up;
//! - fault injection: added latency, failing requests with 500, dropping open watches,
//!   answers held back after they were computed ([`Faults::hold_answers`]: a write lands
//!   while a read is on its way); the most requests handled at once is recorded
//!   ([`Faults::peak_in_flight`]); and, to test that clients refuse them, answers a real API server would never give:
//!   [`Faults::paginate`] makes every list paginate at a page size the server chooses (a
//!   real server may answer `limit` with fewer items and a `continue` token), and
//!   [`Faults::rewrite_answers`] rewrites the JSON of successful GET and list answers
//!   (`items: null`, an object of another namespace or name, a wrong kind).
//!
//! Reviews: it answers TokenReview and SubjectAccessReview POSTs (201, the review with its
//! `status`, as the real server does) for the tokens and non-resource URLs a test registers
//! ([`ApiServer::add_service_account_token`], [`ApiServer::allow_non_resource`]).
//!
//! What it leaves out: authentication and authorization of its own callers, admission webhooks, namespaces as
//! objects (every namespace exists), server-side apply and strategic merge patch (both
//! answer 415), delete of a collection, subresources other than status and eviction (404),
//! garbage collection and propagation policies, schema validation and defaulting (a pod
//! gets no `qosClass`), protobuf and table output, `resourceVersionMatch` on lists (a list
//! always reads the latest state, and a continued list reads the state at the time of that
//! page, not the first page's snapshot), field selectors on events.k8s.io/v1 events beyond
//! metadata, metadata changes through `/status` (allowed for nodes and PDBs by the real
//! server), graceful pod deletion (a pod is removed at once, as if its kubelet had
//! confirmed; with finalizers it waits for them like any object), and the disruption
//! controller itself: PDB status is never written, and eviction computes the budget from
//! what the server holds at the time of the request.
//!
//! [`ApiServer::insert`] stores an object as the cluster would hold it, status included
//! (as if a controller or kubelet had written it). [`ApiServer::client`] turns off kube's
//! default retries of 429, 503 and 504 (up to 15 retries, minutes in all), which would hide
//! a refused eviction; [`ApiServer::config`] keeps them.
//!
//! The integration tests reach it as `crate::support::apiserver` (tests/support/mod.rs); the
//! benches include it with `#[path = "../tests/support/apiserver.rs"] mod apiserver;`:
//! each uses a different part of it.
//!
//! Modelled for no product path: `src/` never sends these. They are kept, and marked here,
//! because the tests of this server (tests/apiserver.rs: `generate_name_and_dry_run`,
//! `merge_patch_json_patch_and_unsupported_patches`, `label_selectors`, `field_selectors`,
//! `events_in_both_groups`, `version`, ...) pin them as the real server behaves, so a product
//! change that starts to rely on one finds it right: JSON patch, `generateName`,
//! `dryRun=All`, the `labelSelector` list parameter (label selectors themselves are used: a
//! PodDisruptionBudget's `spec.selector` at eviction), core/v1 Events and their field
//! selectors, field selectors on pods other than `spec.nodeName` and on nodes and replica
//! sets, streaming lists (`sendInitialEvents`: kube's watcher lists, then watches), and
//! `GET /version`. Everything else above is on a product path: the three custom resources
//! (with their selectable fields, `limit` and `continue`, watches and bookmarks, finalizers,
//! the status subresource), nodes, pods and their eviction (with the budgets and the
//! workload controllers a budget's percentage counts), Leases, events.k8s.io Events, merge
//! patches, and the TokenReview and SubjectAccessReview answers.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};

/// What a create keeps of a posted `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateStatus {
    /// Kept as posted (nodes, and kinds without a status subresource).
    Keep,
    /// Dropped (custom resources, PodDisruptionBudgets).
    Drop,
    /// Replaced by `{"phase": "Pending"}` (pods).
    Pending,
}

/// A kind the server knows, with the storage strategy the real server has for it.
#[derive(Clone, Copy, Debug)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a status subresource.
    pub status: bool,
    /// Keeps `metadata.generation`: 1 on create, +1 when anything but metadata and status
    /// changes, and when a delete sets deletionTimestamp.
    pub generation: bool,
    /// A PUT may leave out `metadata.resourceVersion`.
    pub unconditional_update: bool,
    /// A PUT of a missing object creates it.
    pub create_on_update: bool,
    /// A delete that removes the object answers with it (otherwise with a Success Status).
    pub returns_deleted: bool,
    pub create_status: CreateStatus,
    /// Field selector labels besides `metadata.name` and `metadata.namespace`.
    pub fields: &'static [&'static str],
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group`, or `plural` for the core group, as error messages name a resource.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

const CUSTOM: Resource = Resource {
    group: "ichor.maesh.dev",
    version: "v1alpha1",
    plural: "",
    kind: "",
    namespaced: true,
    status: true,
    generation: true,
    unconditional_update: false,
    create_on_update: false,
    returns_deleted: true,
    create_status: CreateStatus::Drop,
    fields: &[],
};

const BUILTIN: Resource = Resource {
    group: "",
    version: "v1",
    plural: "",
    kind: "",
    namespaced: true,
    status: false,
    generation: false,
    unconditional_update: true,
    create_on_update: false,
    returns_deleted: false,
    create_status: CreateStatus::Keep,
    fields: &[],
};

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

pub const RESOURCES: &[Resource] = &[
    Resource {
        plural: "talosclusters",
        kind: "TalosCluster",
        ..CUSTOM
    },
    Resource {
        plural: "talosmachines",
        kind: "TalosMachine",
        ..CUSTOM
    },
    Resource {
        plural: "talosoperations",
        kind: "TalosOperation",
        ..CUSTOM
    },
    Resource {
        plural: "talosetcdbackups",
        kind: "TalosEtcdBackup",
        ..CUSTOM
    },
    Resource {
        plural: "talosconfigpatches",
        kind: "TalosConfigPatch",
        status: false,
        ..CUSTOM
    },
    Resource {
        plural: "nodes",
        kind: "Node",
        namespaced: false,
        status: true,
        fields: &["spec.unschedulable"],
        ..BUILTIN
    },
    Resource {
        plural: "pods",
        kind: "Pod",
        status: true,
        generation: true,
        returns_deleted: true,
        create_status: CreateStatus::Pending,
        fields: POD_FIELDS,
        ..BUILTIN
    },
    Resource {
        plural: "events",
        kind: "Event",
        fields: EVENT_FIELDS,
        ..BUILTIN
    },
    Resource {
        group: "events.k8s.io",
        plural: "events",
        kind: "Event",
        ..BUILTIN
    },
    Resource {
        group: "policy",
        plural: "poddisruptionbudgets",
        kind: "PodDisruptionBudget",
        status: true,
        generation: true,
        unconditional_update: false,
        create_status: CreateStatus::Drop,
        ..BUILTIN
    },
    Resource {
        group: "apps",
        plural: "deployments",
        kind: "Deployment",
        status: true,
        generation: true,
        create_status: CreateStatus::Drop,
        ..BUILTIN
    },
    Resource {
        group: "apps",
        plural: "replicasets",
        kind: "ReplicaSet",
        status: true,
        generation: true,
        create_status: CreateStatus::Drop,
        fields: &["status.replicas"],
        ..BUILTIN
    },
    Resource {
        group: "apps",
        plural: "statefulsets",
        kind: "StatefulSet",
        status: true,
        generation: true,
        create_status: CreateStatus::Drop,
        ..BUILTIN
    },
    // Each TalosCluster's talosconfig (spec.talosConfigSecretRef): get by name only.
    Resource {
        plural: "secrets",
        kind: "Secret",
        ..BUILTIN
    },
    // The webhook's own registration: its caBundle is set by `serve --tls-secret`.
    Resource {
        group: "admissionregistration.k8s.io",
        plural: "validatingwebhookconfigurations",
        kind: "ValidatingWebhookConfiguration",
        namespaced: false,
        generation: true,
        ..BUILTIN
    },
    Resource {
        group: "coordination.k8s.io",
        plural: "leases",
        kind: "Lease",
        unconditional_update: false,
        create_on_update: true,
        ..BUILTIN
    },
];

/// How many changes watches can replay from.
const HISTORY: usize = 4096;
/// How often a watch that allows bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

type Key = (usize, String, String);

#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    res: usize,
    namespace: String,
    /// ADDED, MODIFIED or DELETED.
    kind: &'static str,
    /// The object after the change (for DELETED: its last state, with the new
    /// resourceVersion).
    object: Value,
    /// The object before the change (None for ADDED).
    old: Option<Value>,
}

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Change>,
    /// Changes up to this resourceVersion are no longer in `history`.
    compacted: u64,
    serial: u64,
    /// The field index: (resource, field label, value) -> (namespace, name) of every stored
    /// object whose field has that value, for every field a field selector may name
    /// besides metadata's ([`indexed_fields`]). Kept by [`Store::commit`], the one place
    /// `objects` changes.
    index: HashMap<IndexKey, BTreeSet<(String, String)>>,
}

/// (resource, field label, value) in the field index.
type IndexKey = (usize, &'static str, String);

/// The fields of a kind a field selector may name besides `metadata.name` and
/// `metadata.namespace`: the `selectableFields` of a custom resource's CRD, or the fields
/// a built-in kind supports.
fn indexed_fields(res: usize) -> Vec<&'static str> {
    let r = &RESOURCES[res];
    if r.group == CUSTOM.group {
        crd_selectable_fields(r.kind)
            .iter()
            .map(String::as_str)
            .collect()
    } else {
        r.fields.to_vec()
    }
}

type Index = HashMap<(usize, &'static str, String), BTreeSet<(String, String)>>;

/// Adds (or removes) the index entries of the object stored at `key`.
fn index_object(index: &mut Index, key: &Key, obj: &Value, add: bool) {
    for label in indexed_fields(key.0) {
        let entry = (key.0, label, field_value(obj, label));
        let at = (key.1.clone(), key.2.clone());
        if add {
            index.entry(entry).or_default().insert(at);
        } else if let Some(set) = index.get_mut(&entry) {
            set.remove(&at);
            if set.is_empty() {
                index.remove(&entry);
            }
        }
    }
}

/// Rewrites the JSON of an answer.
pub type Rewrite = Arc<dyn Fn(&mut Value) + Send + Sync>;

/// Injected faults.
#[derive(Default)]
pub struct Faults {
    latency_ms: AtomicU64,
    fail_next: AtomicUsize,
    fail_path: Mutex<Option<String>>,
    requests: AtomicU64,
    log: Mutex<Vec<Request>>,
    page_size: AtomicUsize,
    rewrite: Mutex<Option<(Option<String>, Rewrite)>>,
    hold: Mutex<Option<(String, Duration)>>,
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
}

/// The header [`ApiServer::test_client`] sends.
const TEST_ACTOR: &str = "x-test-actor";

/// One request as the server received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// A `watch=true` (or `watch=1`) query.
    pub watch: bool,
    /// Made by the test itself ([`ApiServer::test_client`]), not by the code under test.
    pub by_test: bool,
    /// The `fieldSelector` query, as sent (empty when none).
    pub field_selector: String,
}

impl Faults {
    /// Every request waits this long before it is served.
    pub fn set_latency(&self, d: Duration) {
        self.latency_ms.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// The next `n` requests whose path contains `path` (any path when `None`) fail with 500.
    pub fn fail_next(&self, n: usize, path: Option<&str>) {
        if let Ok(mut p) = self.fail_path.lock() {
            *p = path.map(str::to_string);
        }
        self.fail_next.store(n, Ordering::SeqCst);
    }

    /// Every list answers at most `n` items per page (with a `continue` token for the
    /// rest), whatever `limit` the client asked for, or none; 0 turns it off.
    pub fn paginate(&self, n: usize) {
        self.page_size.store(n, Ordering::SeqCst);
    }

    /// Every successful GET or list (not watch) whose path contains `path` (any path when
    /// `None`) has its JSON answer passed through `f` before it is sent.
    pub fn rewrite_answers(
        &self,
        path: Option<&str>,
        f: impl Fn(&mut Value) + Send + Sync + 'static,
    ) {
        if let Ok(mut r) = self.rewrite.lock() {
            *r = Some((path.map(str::to_string), Arc::new(f)));
        }
    }

    /// Stops rewriting answers.
    pub fn stop_rewriting(&self) {
        if let Ok(mut r) = self.rewrite.lock() {
            *r = None;
        }
    }

    fn rewriter(&self, path: &str) -> Option<Rewrite> {
        let r = self.rewrite.lock().ok()?;
        let (filter, f) = r.as_ref()?;
        filter
            .as_deref()
            .is_none_or(|p| path.contains(p))
            .then(|| f.clone())
    }

    /// Requests whose path contains `path` are answered `d` late: the answer is computed
    /// when the request arrives (the state it reads is the state then, as a real server
    /// reads it) and sent after `d`, so a write can land while a read is on its way back.
    /// `None` turns it off.
    pub fn hold_answers(&self, hold: Option<(&str, Duration)>) {
        if let Ok(mut h) = self.hold.lock() {
            *h = hold.map(|(p, d)| (p.to_string(), d));
        }
    }

    fn held(&self, path: &str) -> Option<Duration> {
        let h = self.hold.lock().ok()?;
        let (filter, d) = h.as_ref()?;
        path.contains(filter.as_str()).then_some(*d)
    }

    /// The most requests the server was handling at once (latency and held answers
    /// included), since the start or the last [`Faults::reset_peak`].
    pub fn peak_in_flight(&self) -> usize {
        self.peak_in_flight.load(Ordering::SeqCst)
    }

    pub fn reset_peak(&self) {
        self.peak_in_flight.store(0, Ordering::SeqCst);
    }

    /// How many requests the server has received.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Every request received so far, in order, and forgets them.
    pub fn take_log(&self) -> Vec<Request> {
        self.log
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    /// Whether this request is one of the injected failures (and count it if so).
    fn take_failure(&self, path: &str) -> bool {
        let Ok(filter) = self.fail_path.lock() else {
            return false;
        };
        filter.as_deref().is_none_or(|f| path.contains(f))
            && self
                .fail_next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
    }
}

pub struct Store {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<Change>,
    drop_watches: watch::Sender<u64>,
    pub faults: Faults,
    /// The tokens it authenticates and the non-resource URLs it authorizes.
    pub reviews: Reviews,
}

/// A running server; dropping it stops it and ends its watches.
pub struct ApiServer {
    pub addr: SocketAddr,
    pub store: Arc<Store>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.drop_watches();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl ApiServer {
    /// Starts a server on 127.0.0.1 with an ephemeral port.
    pub async fn start() -> ApiServer {
        let (changes, _) = broadcast::channel(HISTORY);
        let (drop_watches, _) = watch::channel(0);
        let store = Arc::new(Store {
            inner: Mutex::new(Inner {
                rv: 1000,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 1000,
                serial: 0,
                index: HashMap::new(),
            }),
            changes,
            drop_watches,
            faults: Faults::default(),
            reviews: Reviews::default(),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(store.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        ApiServer {
            addr,
            store,
            stop: Some(stop),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client config for this server (no credentials, default namespace `default`),
    /// with kube's defaults otherwise.
    pub fn config(&self) -> kube::Config {
        let url: http::Uri = self.url().parse().expect("valid url");
        kube::Config::new(url)
    }

    /// A kube client for this server, without kube's default retries: kube retries 429,
    /// 503 and 504 up to 15 times with a backoff growing from 5 ms (minutes in all), which
    /// would hide a refused eviction. Build from [`ApiServer::config`] to keep them.
    pub fn client(&self) -> kube::Client {
        let mut config = self.config();
        config.default_retry = false;
        kube::Client::try_from(config).expect("client")
    }

    /// Like [`ApiServer::client`], but its requests are marked as the test's own (a
    /// person's `kubectl`), so the request log can tell them from the code's.
    pub fn test_client(&self) -> kube::Client {
        let mut config = self.config();
        config.default_retry = false;
        config.headers.push((
            http::HeaderName::from_static(TEST_ACTOR),
            http::HeaderValue::from_static("true"),
        ));
        kube::Client::try_from(config).expect("client")
    }

    /// Closes every open watch stream (clients see the stream end and re-watch).
    pub fn drop_watches(&self) {
        self.store.drop_watches.send_modify(|n| *n += 1);
    }

    /// Forgets the change history, as an etcd compaction does: a watch from an older
    /// resourceVersion then gets 410 Expired.
    pub fn compact(&self) {
        let mut inner = self.store.inner.lock().expect("lock");
        inner.history.clear();
        inner.compacted = inner.rv;
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store.inner.lock().expect("lock").rv
    }

    /// Stores an object as the cluster would hold it, `status` included (as if its
    /// controller or kubelet had written it); fills resourceVersion, uid, creationTimestamp.
    pub fn insert(&self, object: Value) -> Value {
        let api_version = object["apiVersion"].as_str().unwrap_or("").to_string();
        let kind = object["kind"].as_str().unwrap_or("").to_string();
        let res = RESOURCES
            .iter()
            .position(|r| r.api_version() == api_version && r.kind == kind)
            .unwrap_or_else(|| panic!("unknown kind {api_version} {kind}"));
        let ns = if RESOURCES[res].namespaced {
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        let mut inner = self.store.inner.lock().expect("lock");
        match self
            .store
            .create_in(&mut inner, res, &ns, object, false, true)
        {
            Ok((_, v)) => v,
            Err(e) => panic!("insert failed: {}", e.message),
        }
    }

    /// Where the field index of list answers differs from a scan of what is stored (empty
    /// when exact): see [`Store::index_drift`].
    pub fn index_drift(&self) -> Vec<String> {
        self.store.index_drift()
    }

    /// Every stored object of a kind in a namespace (all namespaces when `None`).
    pub fn objects(&self, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let inner = self.store.inner.lock().expect("lock");
        inner
            .objects
            .iter()
            .filter(|((r, ns, _), _)| {
                RESOURCES[*r].kind == kind && namespace.is_none_or(|n| n == ns)
            })
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// An error answer: a `Status` object with this code, reason and message.
#[derive(Debug)]
pub struct Failure {
    code: StatusCode,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

impl Failure {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn bad_request(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    fn internal(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }

    /// 422 Invalid: `Kind.group "name" is invalid: <field error>`.
    fn invalid(r: &Resource, name: &str, field_error: &str) -> Failure {
        let kind = if r.group.is_empty() {
            r.kind.to_string()
        } else {
            format!("{}.{}", r.kind, r.group)
        };
        Failure::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {field_error}"),
        )
    }

    fn not_found(r: &Resource, name: &str) -> Failure {
        Failure::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", r.qualified()),
        )
    }

    fn conflict(r: &Resource, name: &str, why: &str) -> Failure {
        Failure::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                r.qualified()
            ),
        )
    }

    fn body(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

fn reply(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn fail(f: &Failure) -> Response {
    reply(f.code, &f.body())
}

fn poisoned<E>(_: E) -> Failure {
    Failure::internal("store lock poisoned")
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn is_set(v: &Value) -> bool {
    !v.is_null()
}

fn deleting(obj: &Value) -> bool {
    is_set(&obj["metadata"]["deletionTimestamp"])
}

fn finalizers(obj: &Value) -> Vec<&str> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A parsed request path.
struct Target {
    res: usize,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    let res = RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)?;
    Some(Target {
        res,
        namespace,
        name,
        sub,
    })
}

fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "gitVersion": "v1.35.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-12-17T00:00:00Z",
        "goVersion": "go1.25.5",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// Counts a request in flight while it lives.
struct InFlight<'a>(&'a Faults);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(
    State(store): State<Arc<Store>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    store.faults.requests.fetch_add(1, Ordering::SeqCst);
    let now = store.faults.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    store.faults.peak_in_flight.fetch_max(now, Ordering::SeqCst);
    let _in_flight = InFlight(&store.faults);
    let q = query(&uri);
    let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    if let Ok(mut log) = store.faults.log.lock()
        && log.len() < 100_000
    {
        log.push(Request {
            method: method.to_string(),
            path: uri.path().to_string(),
            watch: watching,
            by_test: headers.contains_key(TEST_ACTOR),
            field_selector: q.get("fieldSelector").cloned().unwrap_or_default(),
        });
    }
    let latency = store.faults.latency_ms.load(Ordering::SeqCst);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let path = uri.path();
    if store.faults.take_failure(path) {
        return fail(&Failure::internal("injected fault"));
    }
    if method == Method::GET && path == "/version" {
        return reply(StatusCode::OK, &version_info());
    }
    if method == Method::POST
        && let Some(answer) = store.reviews.answer(path, &body)
    {
        return answer;
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let answer = route(&store, &method, path, &q, content_type, &body);
    if !watching && let Some(d) = store.faults.held(path) {
        tokio::time::sleep(d).await;
    }
    answer
}

fn json_body(body: &[u8]) -> Result<Value, Failure> {
    serde_json::from_slice(body).map_err(|e| Failure::bad_request(format!("invalid JSON: {e}")))
}

fn route(
    store: &Arc<Store>,
    method: &Method,
    path: &str,
    q: &HashMap<String, String>,
    content_type: &str,
    body: &[u8],
) -> Response {
    let unknown = || {
        fail(&Failure::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        ))
    };
    let Some(t) = parse_path(path) else {
        return unknown();
    };
    let r = RESOURCES[t.res];
    // A namespaced kind is listed and watched across all namespaces without one; every
    // other request on it names a namespace, and a cluster-scoped kind never has one.
    let all_namespaces = r.namespaced && t.name.is_none() && *method == Method::GET;
    if r.namespaced != t.namespace.is_some() && !all_namespaces {
        return unknown();
    }
    let ns = t.namespace.clone().unwrap_or_default();
    let dry = q.get("dryRun").is_some_and(|d| d == "All");
    let status = |sub: Option<&str>| sub.is_none() || (sub == Some("status") && r.status);
    let result = match (method, t.name.as_deref(), t.sub.as_deref()) {
        (&Method::GET, None, None) => {
            if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
                return store.watch(t.res, t.namespace, q);
            }
            store.list(t.res, t.namespace.as_deref(), q)
        }
        (&Method::GET, Some(name), sub) if status(sub) => store.get(t.res, &ns, name),
        (&Method::POST, None, None) => {
            json_body(body).and_then(|obj| store.create(t.res, &ns, obj, dry))
        }
        (&Method::POST, Some(name), Some("eviction")) if r.plural == "pods" => {
            store.evict(&ns, name, body, dry)
        }
        (&Method::PUT, Some(name), sub) if status(sub) => {
            let mode = Mode {
                status_only: sub.is_some(),
                put: true,
                dry,
            };
            json_body(body).and_then(|obj| store.update(t.res, &ns, name, obj, mode))
        }
        (&Method::PATCH, Some(name), sub) if status(sub) => {
            let mode = Mode {
                status_only: sub.is_some(),
                put: false,
                dry,
            };
            store.patch(t.res, &ns, name, (content_type, body), mode)
        }
        (&Method::DELETE, Some(name), None) => {
            let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let dry = dry || dry_run_all(&opts);
            let key = (t.res, ns.clone(), name.to_string());
            store
                .inner
                .lock()
                .map_err(poisoned)
                .and_then(|mut inner| store.delete_in(&mut inner, &key, &opts, dry))
        }
        (_, _, Some(sub)) if !status(Some(sub)) && (sub != "eviction" || r.plural != "pods") => {
            return unknown();
        }
        _ => Err(Failure::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )),
    };
    match result {
        Ok((code, mut v)) => {
            if *method == Method::GET
                && let Some(f) = store.faults.rewriter(path)
            {
                f(&mut v);
            }
            reply(code, &v)
        }
        Err(f) => fail(&f),
    }
}

/// DeleteOptions `dryRun: ["All"]`.
fn dry_run_all(opts: &Value) -> bool {
    opts["dryRun"]
        .as_array()
        .is_some_and(|d| d.iter().any(|v| v == "All"))
}

type Reply = Result<(StatusCode, Value), Failure>;

/// How a write reaches the object.
#[derive(Clone, Copy, Debug)]
struct Mode {
    /// Through the status subresource.
    status_only: bool,
    /// A PUT (else a PATCH).
    put: bool,
    dry: bool,
}

impl Inner {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }
}

/// The parts of an object that `metadata.generation` counts: everything but metadata and
/// status.
fn generation_relevant(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("metadata");
        o.remove("status");
        o.remove("apiVersion");
        o.remove("kind");
    }
    v
}

impl Store {
    /// Stores (or, for DELETED, removes) the object at `key` and tells the watches; the
    /// resourceVersion in `object` is `inner.rv`, already advanced by the caller.
    fn commit(
        &self,
        inner: &mut Inner,
        key: &Key,
        kind: &'static str,
        object: Value,
        old: Option<Value>,
    ) {
        let previous = if kind == "DELETED" {
            inner.objects.remove(key)
        } else {
            inner.objects.insert(key.clone(), object.clone())
        };
        if let Some(p) = &previous {
            index_object(&mut inner.index, key, p, false);
        }
        if kind != "DELETED" {
            index_object(&mut inner.index, key, &object, true);
        }
        let change = Change {
            rv: inner.rv,
            res: key.0,
            namespace: key.1.clone(),
            kind,
            object,
            old,
        };
        inner.history.push_back(change.clone());
        while inner.history.len() > HISTORY {
            if let Some(c) = inner.history.pop_front() {
                inner.compacted = c.rv;
            }
        }
        let _ = self.changes.send(change);
    }

    fn get(&self, res: usize, ns: &str, name: &str) -> Reply {
        let inner = self.inner.lock().map_err(poisoned)?;
        inner
            .objects
            .get(&(res, ns.to_string(), name.to_string()))
            .cloned()
            .map(|v| (StatusCode::OK, v))
            .ok_or_else(|| Failure::not_found(&RESOURCES[res], name))
    }

    fn list(&self, res: usize, ns: Option<&str>, q: &HashMap<String, String>) -> Reply {
        let r = RESOURCES[res];
        let filter = Filter::new(res, ns.map(str::to_string), q)?;
        let limit: Option<usize> = q
            .get("limit")
            .and_then(|l| l.parse().ok())
            .filter(|l| *l > 0);
        let forced = self.faults.page_size.load(Ordering::SeqCst);
        let limit = match (limit, forced) {
            (l, 0) => l,
            (Some(l), f) => Some(l.min(f)),
            (None, f) => Some(f),
        };
        let after = match q.get("continue").filter(|c| !c.is_empty()) {
            Some(c) => Some(
                c.split_once('/')
                    .map(|(n, m)| (n.to_string(), m.to_string()))
                    .ok_or_else(|| Failure::bad_request("continue key is not valid"))?,
            ),
            None => None,
        };
        let inner = self.inner.lock().map_err(poisoned)?;
        let mut items: Vec<&Value> = Vec::new();
        let mut last: Option<&Key> = None;
        let mut remaining = 0usize;
        for (key, obj) in candidates(&inner, res, ns, &filter)
            .into_iter()
            .filter(|((_, n, m), _)| {
                after
                    .as_ref()
                    .is_none_or(|(an, am)| (n.as_str(), m.as_str()) > (an.as_str(), am.as_str()))
            })
            .filter(|(_, obj)| filter.passes(obj))
        {
            if limit.is_some_and(|l| items.len() >= l) {
                remaining += 1;
            } else {
                items.push(obj);
                last = Some(key);
            }
        }
        let mut meta = json!({ "resourceVersion": inner.rv.to_string() });
        if remaining > 0
            && let Some((_, n, m)) = last
        {
            meta["continue"] = Value::String(format!("{n}/{m}"));
            // The real server counts the rest only for a list without selectors.
            if filter.labels.is_none() && filter.fields.is_none() {
                meta["remainingItemCount"] = json!(remaining);
            }
        }
        Ok((
            StatusCode::OK,
            json!({
                "apiVersion": r.api_version(),
                "kind": format!("{}List", r.kind),
                "metadata": meta,
                "items": items,
            }),
        ))
    }

    /// Where the field index differs from what a scan of the stored objects finds: one line
    /// per difference (empty when it is exact).
    pub fn index_drift(&self) -> Vec<String> {
        let Ok(inner) = self.inner.lock() else {
            return vec!["the store's lock is poisoned".into()];
        };
        let mut scanned = Index::new();
        for (key, obj) in &inner.objects {
            index_object(&mut scanned, key, obj, true);
        }
        let mut out = Vec::new();
        for (entry, set) in &scanned {
            if inner.index.get(entry) != Some(set) {
                out.push(format!(
                    "{entry:?}: a scan finds {set:?}, the index holds {:?}",
                    inner.index.get(entry)
                ));
            }
        }
        for (entry, set) in &inner.index {
            if !scanned.contains_key(entry) {
                out.push(format!(
                    "{entry:?}: the index holds {set:?}, a scan finds nothing"
                ));
            }
        }
        out
    }

    fn create(&self, res: usize, ns: &str, obj: Value, dry: bool) -> Reply {
        let mut inner = self.inner.lock().map_err(poisoned)?;
        self.create_in(&mut inner, res, ns, obj, dry, false)
    }

    fn create_in(
        &self,
        inner: &mut Inner,
        res: usize,
        ns: &str,
        mut obj: Value,
        dry: bool,
        keep_status: bool,
    ) -> Reply {
        let r = RESOURCES[res];
        if !obj.is_object() {
            return Err(Failure::bad_request(
                "the body of the request is not an object",
            ));
        }
        if obj["metadata"].is_null() {
            obj["metadata"] = json!({});
        }
        if !obj["metadata"].is_object() {
            return Err(Failure::bad_request("metadata must be an object"));
        }
        if let Some(obj_ns) = obj["metadata"]["namespace"].as_str()
            && r.namespaced
            && !obj_ns.is_empty()
            && obj_ns != ns
        {
            return Err(Failure::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if obj["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
        {
            // etcd3 store Create; the apiserver answers it as an unclassified error.
            return Err(Failure::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "",
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let name = match obj["metadata"]["name"].as_str() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match obj["metadata"]["generateName"].as_str() {
                Some(prefix) if !prefix.is_empty() => {
                    // names.SimpleNameGenerator: the prefix (cut to 58) and 5 characters.
                    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
                    inner.serial += 1;
                    let mut n = inner.serial;
                    let mut suffix = String::new();
                    for _ in 0..5 {
                        suffix.push(char::from(ALPHABET[(n % 27) as usize]));
                        n /= 27;
                    }
                    let prefix: String = prefix.chars().take(58).collect();
                    format!("{prefix}{suffix}")
                }
                _ => {
                    return Err(Failure::invalid(
                        &r,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            },
        };
        let key = (res, ns.to_string(), name.clone());
        if inner.objects.contains_key(&key) {
            return Err(Failure::new(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", r.qualified()),
            ));
        }
        inner.serial += 1;
        let uid = format!("00000000-0000-4000-8000-{:012x}", inner.serial);
        if let Some(meta) = obj["metadata"].as_object_mut() {
            meta.insert("name".into(), name.into());
            if r.namespaced {
                meta.insert("namespace".into(), ns.into());
            } else {
                meta.remove("namespace");
            }
            meta.insert("uid".into(), uid.into());
            meta.insert("creationTimestamp".into(), now().into());
            if r.generation {
                meta.insert("generation".into(), 1.into());
            } else {
                meta.remove("generation");
            }
            meta.remove("deletionTimestamp");
            meta.remove("deletionGracePeriodSeconds");
            meta.remove("resourceVersion");
        }
        if !keep_status && let Some(o) = obj.as_object_mut() {
            match r.create_status {
                CreateStatus::Keep => {}
                CreateStatus::Drop => {
                    o.remove("status");
                }
                CreateStatus::Pending => {
                    o.insert("status".into(), json!({"phase": "Pending"}));
                }
            }
        }
        obj["apiVersion"] = r.api_version().into();
        obj["kind"] = r.kind.into();
        if dry {
            return Ok((StatusCode::CREATED, obj));
        }
        let rv = inner.next_rv();
        obj["metadata"]["resourceVersion"] = rv.to_string().into();
        self.commit(inner, &key, "ADDED", obj.clone(), None);
        Ok((StatusCode::CREATED, obj))
    }

    /// Stores `new` over the object at `key` with the server's rules for metadata, status
    /// and finalizers.
    fn write(&self, inner: &mut Inner, key: &Key, mut new: Value, mode: Mode) -> Reply {
        let r = RESOURCES[key.0];
        let name = key.2.as_str();
        let Some(old) = inner.objects.get(key).cloned() else {
            if mode.put && !mode.status_only && r.create_on_update {
                return self.create_in(inner, key.0, &key.1, new, mode.dry, false);
            }
            return Err(Failure::not_found(&r, name));
        };
        if !new.is_object() || !(new["metadata"].is_object() || new["metadata"].is_null()) {
            return Err(Failure::bad_request(
                "the body of the request is not an object",
            ));
        }
        // checkName in the REST handlers.
        let new_name = new["metadata"]["name"].as_str().unwrap_or("");
        if new_name != name {
            return Err(Failure::bad_request(format!(
                "the name of the object ({new_name}) does not match the name on the URL ({name})"
            )));
        }
        if r.namespaced
            && new["metadata"]["namespace"]
                .as_str()
                .is_some_and(|n| !n.is_empty() && n != key.1)
        {
            return Err(Failure::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        match new["metadata"]["resourceVersion"]
            .as_str()
            .filter(|v| !v.is_empty())
        {
            Some(want) if Some(want) != old["metadata"]["resourceVersion"].as_str() => {
                return Err(Failure::conflict(
                    &r,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
            None if mode.put && !r.unconditional_update => {
                return Err(Failure::invalid(
                    &r,
                    name,
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                ));
            }
            _ => {}
        }
        if let Some(uid) = new["metadata"]["uid"].as_str()
            && !uid.is_empty()
            && Some(uid) != old["metadata"]["uid"].as_str()
        {
            return Err(Failure::invalid(
                &r,
                name,
                &format!("metadata.uid: Invalid value: \"{uid}\": field is immutable"),
            ));
        }
        let mut merged = if mode.status_only {
            let mut m = old.clone();
            match new.get("status") {
                Some(s) if is_set(s) => m["status"] = s.clone(),
                _ => {
                    if let Some(o) = m.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            m
        } else {
            if r.status
                && let Some(o) = new.as_object_mut()
            {
                match old.get("status") {
                    Some(s) => {
                        o.insert("status".into(), s.clone());
                    }
                    None => {
                        o.remove("status");
                    }
                }
            }
            if is_set(&new["metadata"]["deletionTimestamp"])
                && new["metadata"]["deletionTimestamp"] != old["metadata"]["deletionTimestamp"]
                && !deleting(&old)
            {
                return Err(Failure::invalid(
                    &r,
                    name,
                    "metadata.deletionTimestamp: Invalid value: field is immutable",
                ));
            }
            if deleting(&old) {
                let before = finalizers(&old);
                let added: Vec<&str> = finalizers(&new)
                    .into_iter()
                    .filter(|f| !before.contains(f))
                    .collect();
                if !added.is_empty() {
                    return Err(Failure::invalid(
                        &r,
                        name,
                        &format!(
                            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                        ),
                    ));
                }
            }
            // Server-owned metadata.
            let generation = old["metadata"]["generation"].as_i64();
            let bump = r.generation && generation_relevant(&old) != generation_relevant(&new);
            if let Some(meta) = new["metadata"].as_object_mut() {
                for k in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "namespace",
                    "generation",
                ] {
                    match old["metadata"].get(k) {
                        Some(v) => {
                            meta.insert(k.into(), v.clone());
                        }
                        None => {
                            meta.remove(k);
                        }
                    }
                }
                if bump && let Some(g) = generation {
                    meta.insert("generation".into(), (g + 1).into());
                }
            }
            new
        };
        merged["apiVersion"] = r.api_version().into();
        merged["kind"] = r.kind.into();
        merged["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if merged == old || mode.dry {
            return Ok((StatusCode::OK, merged));
        }
        let rv = inner.next_rv();
        merged["metadata"]["resourceVersion"] = rv.to_string().into();
        if deleting(&merged) && finalizers(&merged).is_empty() {
            self.commit(inner, key, "DELETED", merged.clone(), Some(old));
        } else {
            self.commit(inner, key, "MODIFIED", merged.clone(), Some(old));
        }
        Ok((StatusCode::OK, merged))
    }

    fn update(&self, res: usize, ns: &str, name: &str, new: Value, mode: Mode) -> Reply {
        let mut inner = self.inner.lock().map_err(poisoned)?;
        self.write(
            &mut inner,
            &(res, ns.to_string(), name.to_string()),
            new,
            mode,
        )
    }

    fn patch(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        (content_type, body): (&str, &[u8]),
        mode: Mode,
    ) -> Reply {
        let mut inner = self.inner.lock().map_err(poisoned)?;
        let key = (res, ns.to_string(), name.to_string());
        let Some(mut doc) = inner.objects.get(&key).cloned() else {
            return Err(Failure::not_found(&RESOURCES[res], name));
        };
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/json-patch+json" => {
                let p: json_patch::Patch = serde_json::from_slice(body)
                    .map_err(|e| Failure::bad_request(e.to_string()))?;
                json_patch::patch(&mut doc, &p).map_err(|e| {
                    Failure::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e.to_string())
                })?;
            }
            "application/merge-patch+json" => {
                let p: Value = serde_json::from_slice(body)
                    .map_err(|e| Failure::bad_request(e.to_string()))?;
                merge_patch(&mut doc, &p);
            }
            _ => {
                return Err(Failure::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json (got {media})"
                    ),
                ));
            }
        }
        // A patch applies to the latest version unless it names a resourceVersion itself;
        // write() sees the one the patch left (the current one, unless changed).
        self.write(&mut inner, &key, doc, mode)
    }

    fn delete_in(&self, inner: &mut Inner, key: &Key, opts: &Value, dry: bool) -> Reply {
        let r = RESOURCES[key.0];
        let name = key.2.as_str();
        let Some(obj) = inner.objects.get(key).cloned() else {
            return Err(Failure::not_found(&r, name));
        };
        for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            if let Some(want) = opts["preconditions"][field].as_str() {
                let have = obj["metadata"][field].as_str().unwrap_or("");
                if want != have {
                    return Err(Failure::conflict(
                        &r,
                        name,
                        &format!(
                            "Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}"
                        ),
                    ));
                }
            }
        }
        if !finalizers(&obj).is_empty() {
            if deleting(&obj) {
                return Ok((StatusCode::OK, obj));
            }
            let mut marked = obj.clone();
            marked["metadata"]["deletionTimestamp"] = now().into();
            marked["metadata"]["deletionGracePeriodSeconds"] = 0.into();
            if let Some(g) = marked["metadata"]["generation"].as_i64() {
                marked["metadata"]["generation"] = (g + 1).into();
            }
            if dry {
                return Ok((StatusCode::OK, marked));
            }
            let rv = inner.next_rv();
            marked["metadata"]["resourceVersion"] = rv.to_string().into();
            self.commit(inner, key, "MODIFIED", marked.clone(), Some(obj));
            return Ok((StatusCode::OK, marked));
        }
        let mut gone = obj.clone();
        if !dry {
            let rv = inner.next_rv();
            gone["metadata"]["resourceVersion"] = rv.to_string().into();
            self.commit(inner, key, "DELETED", gone.clone(), Some(obj));
        }
        if r.returns_deleted {
            return Ok((StatusCode::OK, gone));
        }
        Ok((
            StatusCode::OK,
            json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {
                    "name": name,
                    "group": r.group,
                    "kind": r.plural,
                    "uid": gone["metadata"]["uid"],
                },
            }),
        ))
    }

    /// POST pods/{name}/eviction, as the eviction REST handler decides it.
    fn evict(&self, ns: &str, name: &str, body: &[u8], dry: bool) -> Reply {
        let eviction: Value = if body.is_empty() {
            json!({})
        } else {
            json_body(body)?
        };
        if let Some(n) = eviction["metadata"]["name"].as_str()
            && n != name
        {
            return Err(Failure::bad_request(
                "name in URL does not match name in Eviction object",
            ));
        }
        let opts = eviction["deleteOptions"].clone();
        let dry = dry || dry_run_all(&opts);
        let pods = resource_index("pods");
        let pdbs = resource_index("poddisruptionbudgets");
        let mut inner = self.inner.lock().map_err(poisoned)?;
        let key = (pods, ns.to_string(), name.to_string());
        let Some(pod) = inner.objects.get(&key) else {
            return Err(Failure::not_found(&RESOURCES[pods], name));
        };
        let ignores_budgets = deleting(pod)
            || matches!(
                pod["status"]["phase"].as_str(),
                Some("Pending" | "Succeeded" | "Failed")
            );
        if !ignores_budgets {
            let budgets: Vec<(&String, &Value)> = inner
                .objects
                .range((pdbs, ns.to_string(), String::new())..)
                .take_while(|((r, n, _), _)| *r == pdbs && n == ns)
                .filter(|(_, pdb)| {
                    label_selector_from(&pdb["spec"]["selector"])
                        .is_some_and(|s| selector_matches(&s, pod))
                })
                .map(|((_, _, n), pdb)| (n, pdb))
                .collect();
            if budgets.len() > 1 {
                return Err(Failure::internal(
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                ));
            }
            if let Some((pdb_name, pdb)) = budgets.first() {
                let b = budget(&inner, pods, ns, pdb);
                let unhealthy_may_go = !pod_ready(pod)
                    && (pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
                        || (b.current >= b.desired && b.desired > 0));
                if !unhealthy_may_go && b.allowed <= 0 {
                    let mut f = Failure::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    );
                    f.details = Some(json!({
                        "causes": [{
                            "reason": "DisruptionBudget",
                            "message": format!(
                                "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                                b.desired, b.current
                            ),
                        }],
                    }));
                    return Err(f);
                }
            }
        }
        self.delete_in(&mut inner, &key, &opts, dry)?;
        Ok((
            StatusCode::CREATED,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        ))
    }

    fn watch(
        self: &Arc<Self>,
        res: usize,
        ns: Option<String>,
        q: &HashMap<String, String>,
    ) -> Response {
        let r = RESOURCES[res];
        let filter = match Filter::new(res, ns, q) {
            Ok(f) => f,
            Err(e) => return fail(&e),
        };
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
        let initial_param = q.get("sendInitialEvents").map(|s| s == "true");
        if initial_param == Some(true) {
            let problem = if !bookmarks {
                Some(
                    "sendInitialEvents: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
                )
            } else if q.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan") {
                Some(
                    "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )
            } else {
                None
            };
            if let Some(p) = problem {
                return fail(&Failure::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    format!("ListOptions.meta.k8s.io \"\" is invalid: {p}"),
                ));
            }
        }
        let from: Option<u64> = match q.get("resourceVersion").map(String::as_str) {
            None | Some("" | "0") => None,
            Some(v) => match v.parse() {
                Ok(n) => Some(n),
                Err(_) => {
                    return fail(&Failure::bad_request(format!(
                        "invalid resource version: {v}"
                    )));
                }
            },
        };
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(1800);
        let send_initial = initial_param.unwrap_or(from.is_none());
        let mut first: Vec<Value> = Vec::new();
        let (rx, current) = {
            let Ok(inner) = self.inner.lock() else {
                return fail(&Failure::internal("store lock poisoned"));
            };
            if send_initial {
                for obj in inner
                    .objects
                    .range((res, String::new(), String::new())..)
                    .take_while(|((r, _, _), _)| *r == res)
                    .map(|(_, v)| v)
                    .filter(|v| filter.passes(v))
                {
                    first.push(event_line("ADDED", obj));
                }
            } else if let Some(from) = from {
                if from < inner.compacted {
                    let expired = Failure::new(
                        StatusCode::GONE,
                        "Expired",
                        format!("too old resource version: {from} ({})", inner.compacted + 1),
                    );
                    first.push(event_line("ERROR", &expired.body()));
                } else {
                    for c in inner.history.iter().filter(|c| c.rv > from) {
                        if let Some((kind, obj)) = filter.event(c) {
                            first.push(event_line(kind, &obj));
                        }
                    }
                }
            }
            (self.changes.subscribe(), inner.rv)
        };
        let expired = first.first().is_some_and(|l| l["type"] == "ERROR");
        if initial_param == Some(true) {
            first.push(event_line(
                "BOOKMARK",
                &json!({
                    "apiVersion": r.api_version(),
                    "kind": r.kind,
                    "metadata": {
                        "resourceVersion": current.to_string(),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }),
            ));
        }
        let (tx, body_rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(256);
        let dropped = self.drop_watches.subscribe();
        let follow = Follow {
            filter,
            rx,
            dropped,
            tx,
            bookmarks: bookmarks.then(|| (r.api_version(), r.kind)),
            last_rv: current,
            timeout: Duration::from_secs(timeout),
        };
        tokio::spawn(async move {
            for line in &first {
                if !send_line(&follow.tx, line).await {
                    return;
                }
            }
            if !expired {
                follow.run().await;
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(body_rx);
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| fail(&Failure::internal("watch")))
    }
}

fn resource_index(plural: &str) -> usize {
    RESOURCES
        .iter()
        .position(|r| r.plural == plural)
        .unwrap_or_default()
}

fn event_line(kind: &str, object: &Value) -> Value {
    json!({"type": kind, "object": object})
}

async fn send_line(tx: &mpsc::Sender<Result<Bytes, std::io::Error>>, line: &Value) -> bool {
    let mut s = line.to_string();
    s.push('\n');
    tx.send(Ok(Bytes::from(s))).await.is_ok()
}

/// An open watch after its first events.
struct Follow {
    filter: Filter,
    rx: broadcast::Receiver<Change>,
    dropped: watch::Receiver<u64>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    /// apiVersion and kind of bookmarks, when the client allows them.
    bookmarks: Option<(String, &'static str)>,
    last_rv: u64,
    timeout: Duration,
}

impl Follow {
    async fn run(mut self) {
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(BOOKMARK_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = self.dropped.changed() => return,
                _ = self.tx.closed() => return,
                _ = tick.tick(), if self.bookmarks.is_some() => {
                    let Some((api_version, kind)) = &self.bookmarks else { continue };
                    let bm = json!({
                        "apiVersion": api_version,
                        "kind": kind,
                        "metadata": {"resourceVersion": self.last_rv.to_string()},
                    });
                    if !send_line(&self.tx, &event_line("BOOKMARK", &bm)).await {
                        return;
                    }
                }
                c = self.rx.recv() => match c {
                    Ok(c) => {
                        self.last_rv = c.rv;
                        if let Some((kind, obj)) = self.filter.event(&c)
                            && !send_line(&self.tx, &event_line(kind, &obj)).await
                        {
                            return;
                        }
                    }
                    // A watcher that falls behind is closed, as the watch cache does.
                    Err(_) => return,
                },
            }
        }
    }
}

/// The stored objects a list with `filter` must look at, in key order (namespace, name):
/// the one object a `metadata.name=` selects (in a namespace, or of a cluster-scoped
/// kind), else those the field index holds for a `field=value` requirement, else the
/// whole range of the kind (in the namespace, if one is named, as etcd's key prefix
/// reads). Every candidate still goes through [`Filter::passes`].
fn candidates<'a>(
    inner: &'a Inner,
    res: usize,
    ns: Option<&str>,
    filter: &Filter,
) -> Vec<(&'a Key, &'a Value)> {
    let namespaced = RESOURCES[res].namespaced;
    let equal = filter.fields.iter().flatten().filter(|f| f.equal);
    for f in equal.clone() {
        if f.label == "metadata.name" && (ns.is_some() || !namespaced) {
            let key = (res, ns.unwrap_or("").to_string(), f.value.clone());
            return inner.objects.get_key_value(&key).into_iter().collect();
        }
    }
    let fields = indexed_fields(res);
    for f in equal {
        let Some(label) = fields.iter().find(|l| **l == f.label) else {
            continue;
        };
        let Some(set) = inner.index.get(&(res, *label, f.value.clone())) else {
            return Vec::new();
        };
        let from = (ns.unwrap_or("").to_string(), String::new());
        return set
            .range(from..)
            .take_while(|(n, _)| ns.is_none_or(|ns| n == ns))
            .filter_map(|(n, m)| inner.objects.get_key_value(&(res, n.clone(), m.clone())))
            .collect();
    }
    // A namespaced list reads only its namespace's range (as etcd's key prefix does).
    let from = (res, ns.unwrap_or("").to_string(), String::new());
    inner
        .objects
        .range(from..)
        .take_while(|((r, n, _), _)| *r == res && ns.is_none_or(|ns| n == ns))
        .collect()
}

/// What a list or watch selects: kind, namespace, label and field selectors.
struct Filter {
    res: usize,
    ns: Option<String>,
    labels: Option<Vec<Requirement>>,
    fields: Option<Vec<FieldRequirement>>,
}

impl Filter {
    fn new(res: usize, ns: Option<String>, q: &HashMap<String, String>) -> Result<Filter, Failure> {
        let labels = match q.get("labelSelector").filter(|s| !s.trim().is_empty()) {
            Some(s) => Some(parse_selector(s).map_err(Failure::bad_request)?),
            None => None,
        };
        let fields = match q.get("fieldSelector").filter(|s| !s.trim().is_empty()) {
            Some(s) => Some(parse_field_selector(&RESOURCES[res], s)?),
            None => None,
        };
        Ok(Filter {
            res,
            ns,
            labels,
            fields,
        })
    }

    fn passes(&self, obj: &Value) -> bool {
        self.ns
            .as_deref()
            .is_none_or(|n| obj["metadata"]["namespace"].as_str().unwrap_or("") == n)
            && self
                .labels
                .as_ref()
                .is_none_or(|s| selector_matches(s, obj))
            && self.fields.as_ref().is_none_or(|f| fields_match(f, obj))
    }

    /// The event a watch with this filter sees for a change, if any (the watch cache's
    /// conversion: leaving the selection is a DELETED, entering it an ADDED).
    fn event(&self, c: &Change) -> Option<(&'static str, Value)> {
        if c.res != self.res {
            return None;
        }
        let now_in = self.passes(&c.object);
        let was_in = c.old.as_ref().is_some_and(|o| self.passes(o));
        match (c.kind, was_in, now_in) {
            ("ADDED", _, true) => Some(("ADDED", c.object.clone())),
            ("DELETED", true, _) => Some(("DELETED", c.object.clone())),
            ("MODIFIED", true, true) => Some(("MODIFIED", c.object.clone())),
            ("MODIFIED", false, true) => Some(("ADDED", c.object.clone())),
            ("MODIFIED", true, false) => {
                let mut last = c.old.clone().unwrap_or(Value::Null);
                last["metadata"]["resourceVersion"] = c.rv.to_string().into();
                Some(("DELETED", last))
            }
            _ => None,
        }
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(doc: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !doc.is_object() {
                *doc = Value::Object(Map::new());
            }
            if let Value::Object(d) = doc {
                for (k, v) in p {
                    if v.is_null() {
                        d.remove(k);
                    } else {
                        merge_patch(d.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *doc = other.clone(),
    }
}

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq)]
pub enum Requirement {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

fn label_key_ok(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn label_value_ok(v: &str) -> bool {
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
pub fn parse_selector(s: &str) -> Result<Vec<Requirement>, String> {
    let mut out = Vec::new();
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    for p in parts.into_iter().map(str::trim) {
        let bad = || format!("unable to parse requirement: {p:?}");
        let set = |rest: &str| -> Result<Vec<String>, String> {
            let inner = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(bad)?;
            let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
            if values.iter().all(|v| label_value_ok(v)) {
                Ok(values)
            } else {
                Err(bad())
            }
        };
        let pair = |k: &str, v: &str| -> Result<(String, String), String> {
            let (k, v) = (k.trim(), v.trim());
            if label_key_ok(k) && label_value_ok(v) {
                Ok((k.into(), v.into()))
            } else {
                Err(bad())
            }
        };
        let key = |k: &str| -> Result<String, String> {
            let k = k.trim();
            if label_key_ok(k) {
                Ok(k.into())
            } else {
                Err(bad())
            }
        };
        let req = if let Some((k, v)) = p.split_once("!=") {
            let (k, v) = pair(k, v)?;
            Requirement::Ne(k, v)
        } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
            let (k, v) = pair(k, v)?;
            Requirement::Eq(k, v)
        } else if let Some((k, rest)) = p.split_once(" notin ") {
            Requirement::NotIn(key(k)?, set(rest)?)
        } else if let Some((k, rest)) = p.split_once(" in ") {
            Requirement::In(key(k)?, set(rest)?)
        } else if let Some(k) = p.strip_prefix('!') {
            Requirement::NotExists(key(k)?)
        } else {
            Requirement::Exists(key(p)?)
        };
        out.push(req);
    }
    Ok(out)
}

/// The requirements of a metav1.LabelSelector object; `None` for a null selector, which
/// selects nothing (an empty one selects everything).
pub fn label_selector_from(sel: &Value) -> Option<Vec<Requirement>> {
    if sel.is_null() {
        return None;
    }
    let mut out = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        for (k, v) in m {
            out.push(Requirement::Eq(k.clone(), v.as_str().unwrap_or("").into()));
        }
    }
    if let Some(exprs) = sel["matchExpressions"].as_array() {
        for e in exprs {
            let key = e["key"].as_str().unwrap_or("").to_string();
            let values: Vec<String> = e["values"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            out.push(match e["operator"].as_str().unwrap_or("") {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::NotExists(key),
                // Validation rejects other operators; select nothing.
                _ => return None,
            });
        }
    }
    Some(out)
}

pub fn selector_matches(reqs: &[Requirement], obj: &Value) -> bool {
    let labels = &obj["metadata"]["labels"];
    let get = |k: &str| labels.get(k).and_then(|v| v.as_str());
    reqs.iter().all(|r| match r {
        Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
        Requirement::Ne(k, v) => get(k) != Some(v.as_str()),
        Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        Requirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
        Requirement::Exists(k) => get(k).is_some(),
        Requirement::NotExists(k) => get(k).is_none(),
    })
}

/// One term of a field selector: `label=value`, `label==value` or `label!=value`.
#[derive(Clone, Debug)]
struct FieldRequirement {
    label: String,
    equal: bool,
    value: String,
}

/// The field labels a custom resource's CustomResourceDefinition declares selectable
/// (`spec.versions[].selectableFields[].jsonPath` without its leading dot), as the real
/// API server takes them from the CRD: from the CRDs `ichor-rules crds` prints, so a field
/// the CRD does not declare is refused here as it would be in a cluster.
fn crd_selectable_fields(kind: &str) -> &'static [String] {
    use ichor_rules::runtime::objects::{
        TalosCluster, TalosConfigPatch, TalosEtcdBackup, TalosMachine, TalosOperation,
    };
    use kube::CustomResourceExt;
    static FIELDS: std::sync::OnceLock<Vec<(&'static str, Vec<String>)>> =
        std::sync::OnceLock::new();
    let all = FIELDS.get_or_init(|| {
        [
            ("TalosCluster", TalosCluster::crd()),
            ("TalosMachine", TalosMachine::crd()),
            ("TalosOperation", TalosOperation::crd()),
            ("TalosEtcdBackup", TalosEtcdBackup::crd()),
            ("TalosConfigPatch", TalosConfigPatch::crd()),
        ]
        .into_iter()
        .map(|(kind, crd)| {
            let fields = crd
                .spec
                .versions
                .iter()
                .flat_map(|v| v.selectable_fields.iter().flatten())
                .map(|f| f.json_path.trim_start_matches('.').to_string())
                .collect();
            (kind, fields)
        })
        .collect()
    });
    all.iter()
        .find(|(k, _)| *k == kind)
        .map_or(&[], |(_, f)| f.as_slice())
}

/// Splits `s` at each `sep` not escaped by a backslash.
fn split_unescaped(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&s[start..]);
    out
}

/// A selector value with its escapes (`\\`, `\,`, `\=`) undone; any other escape is an
/// error, as in `fields.UnescapeValue`.
fn unescape_field_value(v: &str) -> Result<String, String> {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some(e @ ('\\' | ',' | '=')) => out.push(e),
            Some(e) => return Err(format!("invalid escape sequence: \\{e}")),
            None => return Err("unterminated escape sequence".into()),
        }
    }
    Ok(out)
}

/// The operator of a term (`!=`, `==` or `=`) at its first unescaped `!` or `=`.
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '!' if term[i..].starts_with("!=") => return Some((&term[..i], false, &term[i + 2..])),
            '=' if term[i..].starts_with("==") => return Some((&term[..i], true, &term[i + 2..])),
            '=' => return Some((&term[..i], true, &term[i + 1..])),
            _ => {}
        }
    }
    None
}

fn parse_field_selector(r: &Resource, s: &str) -> Result<Vec<FieldRequirement>, Failure> {
    let mut out = Vec::new();
    let crd_fields = crd_selectable_fields(r.kind);
    for term in split_unescaped(s, ',')
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let Some((label, equal, value)) = split_term(term) else {
            return Err(Failure::bad_request(format!(
                "invalid selector: '{s}'; can't understand '{term}'"
            )));
        };
        let label = label.trim();
        let custom = r.group == CUSTOM.group;
        let declared = if custom {
            crd_fields.iter().any(|f| f == label)
        } else {
            r.fields.contains(&label)
        };
        if !matches!(label, "metadata.name" | "metadata.namespace") && !declared {
            return Err(Failure::bad_request(format!(
                "field label not supported: {label}"
            )));
        }
        let value = unescape_field_value(value.trim())
            .map_err(|e| Failure::bad_request(format!("invalid selector: '{s}'; {e}")))?;
        out.push(FieldRequirement {
            label: label.to_string(),
            equal,
            value,
        });
    }
    Ok(out)
}

/// The value a field label has on an object, as the kind's field set renders it.
fn field_value(obj: &Value, label: &str) -> String {
    let path = if label == "source" {
        "source.component"
    } else {
        label
    };
    let mut v = obj;
    for seg in path.split('.') {
        v = &v[seg];
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null if matches!(label, "spec.unschedulable" | "spec.hostNetwork") => {
            "false".to_string()
        }
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn fields_match(reqs: &[FieldRequirement], obj: &Value) -> bool {
    reqs.iter().all(|f| {
        // A string field compares in place; others as the field set renders them.
        let mut v = obj;
        for seg in f.label.split('.') {
            v = &v[seg];
        }
        let same = match v {
            Value::String(s) if f.label != "source" => *s == f.value,
            _ => field_value(obj, &f.label) == f.value,
        };
        same == f.equal
    })
}

fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// A budget as the disruption controller would have written its status.
struct Budget {
    desired: i64,
    current: i64,
    allowed: i64,
}

fn budget(inner: &Inner, pods: usize, ns: &str, pdb: &Value) -> Budget {
    let blocked = |current| Budget {
        desired: 0,
        current,
        allowed: 0,
    };
    let Some(selector) = label_selector_from(&pdb["spec"]["selector"]) else {
        return blocked(0);
    };
    let selected: Vec<&Value> = inner
        .objects
        .range((pods, ns.to_string(), String::new())..)
        .take_while(|((r, n, _), _)| *r == pods && n == ns)
        .map(|(_, p)| p)
        .filter(|p| selector_matches(&selector, p))
        .collect();
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let current = count(
        selected
            .iter()
            .filter(|p| !deleting(p) && pod_ready(p))
            .count(),
    );
    // getExpectedPodCount: an integer minAvailable counts the selected pods; a percentage
    // and maxUnavailable count the scale of the pods' controllers.
    let spec = &pdb["spec"];
    let (expected, desired) = if is_set(&spec["maxUnavailable"]) {
        let Some(expected) = expected_scale(inner, ns, &selected) else {
            return blocked(current);
        };
        let max = int_or_percent(&spec["maxUnavailable"], expected).unwrap_or(0);
        (expected, (expected - max).max(0))
    } else if let Some(min) = spec["minAvailable"].as_i64() {
        (count(selected.len()), min)
    } else if is_set(&spec["minAvailable"]) {
        let Some(expected) = expected_scale(inner, ns, &selected) else {
            return blocked(current);
        };
        (
            expected,
            int_or_percent(&spec["minAvailable"], expected).unwrap_or(0),
        )
    } else {
        (0, 0)
    };
    // updatePdbStatus: no disruption while the budget expects no pods.
    let allowed = if expected <= 0 {
        0
    } else {
        (current - desired).max(0)
    };
    Budget {
        desired,
        current,
        allowed,
    }
}

/// The controlling ownerReference of an object.
fn controller_of(obj: &Value) -> Option<&Value> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true)
}

/// getExpectedScale: the sum of `spec.replicas` over the controllers of the pods (a
/// ReplicaSet counts as its Deployment when one controls it); pods without a controller
/// are not counted. `None` when a controller is not found, as the controller then fails
/// to sync the budget.
fn expected_scale(inner: &Inner, ns: &str, pods: &[&Value]) -> Option<i64> {
    let find = |kind: &str, owner: &Value| -> Option<&Value> {
        let res = RESOURCES
            .iter()
            .position(|r| r.group == "apps" && r.kind == kind)?;
        let obj = inner
            .objects
            .get(&(res, ns.to_string(), owner["name"].as_str()?.to_string()))?;
        (owner["apiVersion"] == "apps/v1" && obj["metadata"]["uid"] == owner["uid"]).then_some(obj)
    };
    let mut scales: BTreeMap<String, i64> = BTreeMap::new();
    for pod in pods {
        let Some(owner) = controller_of(pod) else {
            continue;
        };
        let mut controller = match owner["kind"].as_str() {
            Some(kind @ ("ReplicaSet" | "StatefulSet")) => find(kind, owner)?,
            _ => return None,
        };
        if owner["kind"] == "ReplicaSet"
            && let Some(dep) = controller_of(controller).filter(|d| d["kind"] == "Deployment")
        {
            controller = find("Deployment", dep)?;
        }
        let uid = controller["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let replicas = controller["spec"]["replicas"].as_i64().unwrap_or(1);
        scales.insert(uid, replicas);
    }
    Some(scales.values().sum())
}

/// intstr.GetScaledValueFromIntOrPercent with rounding up, as the disruption controller
/// calls it for both minAvailable and maxUnavailable.
fn int_or_percent(v: &Value, total: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            Some((pct * total + 99) / 100)
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// TokenReview and SubjectAccessReview, as the API server answers them: a POST of the
// review object, answered 201 Created with the same object and its `status` filled in.

/// Bearer tokens this server authenticates, and who may `verb` which non-resource URL.
#[derive(Default)]
pub struct Reviews {
    /// token -> the user it authenticates as (`username`, `uid`, `groups`).
    tokens: Mutex<HashMap<String, Value>>,
    /// (user or group, verb, non-resource URL) allowed; a URL ending in `*` is a prefix.
    allowed: Mutex<Vec<(String, String, String)>>,
}

impl ApiServer {
    /// Makes `token` authenticate as the ServiceAccount `namespace/name`, with the groups
    /// the API server gives ServiceAccounts.
    pub fn add_service_account_token(&self, token: &str, namespace: &str, name: &str) {
        let user = json!({
            "username": format!("system:serviceaccount:{namespace}:{name}"),
            "uid": format!("uid-{namespace}-{name}"),
            "groups": [
                "system:serviceaccounts",
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated",
            ],
            "extra": {"authentication.kubernetes.io/pod-name": [format!("{name}-0")]},
        });
        if let Ok(mut t) = self.store.reviews.tokens.lock() {
            t.insert(token.to_string(), user);
        }
    }

    /// Lets `subject` (a username or a group) `verb` the non-resource URL `url`, as a
    /// ClusterRole with `nonResourceURLs: [url]` bound to it would.
    pub fn allow_non_resource(&self, subject: &str, verb: &str, url: &str) {
        if let Ok(mut a) = self.store.reviews.allowed.lock() {
            a.push((subject.to_string(), verb.to_string(), url.to_string()));
        }
    }
}

impl Reviews {
    /// The answer to a POST of `path`, if it is a review.
    fn answer(&self, path: &str, body: &[u8]) -> Option<Response> {
        let kind = match path.trim_end_matches('/') {
            "/apis/authentication.k8s.io/v1/tokenreviews" => "TokenReview",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews" => "SubjectAccessReview",
            _ => return None,
        };
        let review = match json_body(body) {
            Ok(v) if v.is_object() => v,
            Ok(_) => return Some(fail(&Failure::bad_request("the body is not an object"))),
            Err(f) => return Some(fail(&f)),
        };
        Some(match kind {
            "TokenReview" => self.token_review(review),
            _ => self.access_review(review),
        })
    }

    fn token_review(&self, mut review: Value) -> Response {
        let token = review["spec"]["token"].as_str().unwrap_or("").to_string();
        let user = self.tokens.lock().ok().and_then(|t| t.get(&token).cloned());
        review["metadata"] = json!({"creationTimestamp": null});
        review["status"] = match user {
            Some(u) => json!({
                "authenticated": true,
                "user": u,
                "audiences": ["https://kubernetes.default.svc.cluster.local"],
            }),
            // What the API server answers a token no authenticator accepts.
            None => json!({
                "user": {},
                "error": "[invalid bearer token, token lookup failed]",
            }),
        };
        reply(StatusCode::CREATED, &review)
    }

    fn access_review(&self, mut review: Value) -> Response {
        let spec = &review["spec"];
        let user = spec["user"].as_str().unwrap_or("");
        let groups: Vec<&str> = spec["groups"]
            .as_array()
            .map(|g| g.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let invalid = |field: &str| {
            fail(&Failure::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("SubjectAccessReview.authorization.k8s.io \"\" is invalid: {field}"),
            ))
        };
        if user.is_empty() && groups.is_empty() {
            return invalid(
                "spec.user: Invalid value: \"\": at least one of user or group must be specified",
            );
        }
        let (res, non) = (
            spec["resourceAttributes"].is_object(),
            spec["nonResourceAttributes"].is_object(),
        );
        if res == non {
            return invalid(
                "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
            );
        }
        let verb = spec["nonResourceAttributes"]["verb"].as_str().unwrap_or("");
        let url = spec["nonResourceAttributes"]["path"].as_str().unwrap_or("");
        let allowed = non
            && self.allowed.lock().is_ok_and(|a| {
                a.iter().any(|(who, v, u)| {
                    (who == user || groups.contains(&who.as_str()))
                        && (v == verb || v == "*")
                        && (u == url || u.strip_suffix('*').is_some_and(|p| url.starts_with(p)))
                })
            });
        review["metadata"] = json!({"creationTimestamp": null});
        review["status"] = if allowed {
            json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"metrics-reader\" of ClusterRole \"metrics-reader\""})
        } else {
            json!({"allowed": false})
        };
        reply(StatusCode::CREATED, &review)
    }
}
