//! Decision records of the controller (issue 38): one NDJSON line per decision the
//! controller takes under the rules (a removal decided, an operation's step decided again,
//! an operation's start) and one per plan step it runs, on the webhook's sink and queue
//! ([`Recorder`]: it never waits, a full queue drops).
//!
//! A controller decision is a [`Record`] (`"record": "decision"`, `"site": "controller"`)
//! with the reconcile target, the facts asked of etcd (through which node, and what it
//! answered) and the admission decision that let the object in when it is known:
//! `ichor-rules replay` decides it again like a webhook record. A plan step is a
//! [`StepRecord`] (`"record": "step"`): the step, the decision it followed, the Talos calls
//! it made with their results (the `actor_id` Talos gave an action, the boot time a node
//! answered) and how it ended; it is an effect, not a decision, and replay skips it and
//! says so.
//!
//! Everything is built in one place, [`Journal`], which the world of a reconcile supplies
//! ([`crate::runtime::exec::World::journal`]): the controller's world holds one when
//! records are on; `verify`'s model holds none, so recording costs it nothing. The
//! executor calls the journal where it decides and where a step begins and ends; the
//! controller's world tells it each Talos call. No Secret is read here, and nothing a Secret
//! holds (the Talos credentials, a store's keys, an encryption key) is ever passed in.

use super::exec::{Call, Node, NodeError, Reply};
use super::facts::{EventFacts, Expensive, SnapshotFacts};
use super::objects::Snapshot;
use super::records::{self, EventRecord, Record, Recorder, RulesInfo};
use crate::compile::Table;
use crate::interp::{Decision, Session, decide_into};
use crate::vocab::Fact;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A controller decision: a [`Record`] and what only the controller knows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControllerRecord {
    #[serde(flatten)]
    pub decision: Record,
    pub target: Target,
    /// The facts asked of etcd for this decision, in the order asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etcd: Vec<EtcdAsked>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    /// Why `admission` is absent when a kept admission of the object's name was refused
    /// (`uid-mismatch`, `no-uid`, `not-this-object`, `ambiguous`, `digest-unknown`) or the
    /// webhook of another process was asked for it (`runtime::admission_link::REASONS`:
    /// also `not-found`, `timeout`, `unauthorized`, `forbidden`, `unavailable`,
    /// `bad-answer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_lookup: Option<String>,
}

/// A plan step the controller ran: its effect and how it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Always `"step"`: replay skips it (it is no decision of the rules).
    pub record: String,
    pub id: String,
    pub time: String,
    /// Always `controller`.
    pub site: String,
    pub target: Target,
    pub rules: RulesInfo,
    /// The id of the decision of this reconcile that let the step run (none: the removal
    /// had committed and was not decided again, or that decision's record was dropped, so
    /// no log holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    pub step: StepInfo,
    /// The Talos calls the step made, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<Effect>,
    /// The last boot time the node answered during the step (seconds since the epoch):
    /// after a reboot, its new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_time: Option<u64>,
    /// `done`, `wait`, `fail`, or `interrupted` (the reconcile ended by an error first).
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    /// Why `admission` is absent, as in [`ControllerRecord::admission_lookup`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_lookup: Option<String>,
    /// From the step's start to its end in this reconcile.
    pub latency_us: u64,
}

/// The object a reconcile is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(
        rename = "resourceVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_version: Option<String>,
    /// Its `creationTimestamp`, and its `deletionTimestamp` once being deleted: an
    /// admission the record could not link (`admission_lookup` says why) is found in the
    /// webhook's log by kind, namespace, name and operation within these
    /// (`docs/operators.md`, "Following a decision to its node action").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted: Option<String>,
}

/// A plan step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepInfo {
    /// Its place in the plan (from 0).
    pub index: usize,
    pub text: String,
    /// The step's own message (its guards held), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A Talos call and what came of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    /// Talos' name of the call, with its arguments (`Reset { graceful: true }`).
    pub call: String,
    /// The node asked: a machine, or a host through a machine's Talos API.
    pub node: String,
    /// `ok`, or why it failed.
    pub result: String,
    /// What it answered, in short (members, a status, a boot time, a version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The `actor_id` Talos gave the action (Reset, Reboot, Shutdown, Upgrade): its
    /// events carry the same id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_time: Option<u64>,
}

/// A fact asked of etcd: its value, why, and the calls that told it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EtcdAsked {
    pub fact: String,
    pub value: i64,
    pub why: String,
    /// Through which node (a healthy sibling) and what it answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asked: Vec<Effect>,
}

/// The admission decision that let the object in (the webhook's record of it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    /// The webhook record's id (its `decision-id` audit annotation).
    pub decision: String,
    /// The AdmissionReview's uid.
    pub request_uid: String,
    /// The uid of the object admitted: `request.oldObject`'s for a DELETE, `request.object`'s
    /// for a CREATE (a validating webhook is asked after the API server gave the new object
    /// its uid). Empty: the review carried none (or an older webhook kept it); such an
    /// admission links to nothing ([`Admission::check`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object_uid: String,
    pub operation: String,
    /// The digest of the rules that admitted it.
    pub digest: String,
    pub time: String,
    /// The webhook that decided it authenticates its callers (`serve --client-ca`: only a
    /// client with a certificate of that CA, the API server, completes the handshake).
    /// False: anyone who can reach the webhook's port could have sent the review this
    /// admission stands for, so the link is as good as that port's network policy.
    #[serde(default)]
    pub caller_verified: bool,
}

/// The admission decisions that let a TalosMachine's deletion or a TalosOperation's
/// creation in, as this process's webhook allowed them (see `docs/operators.md`, "Decision
/// records": why this is kept in the process and not on the object), read by this
/// process's controller ([`Admissions::find`]) and answered to a controller in another
/// process (`runtime::admission_link`, [`Admissions::kept`]). Bounded: at most
/// [`ADMISSIONS_KEPT`] object names and operations, the oldest name going first, each with
/// at most [`ADMISSIONS_PER_KEY`] admissions, the oldest going first and said so
/// ([`KeptAdmissions::dropped_uids`]).
#[derive(Default)]
pub struct Admissions {
    inner: Mutex<Kept<AdmissionKey, KeptAdmissions>>,
    /// [`Admission::caller_verified`] of the admissions kept from now on.
    callers_verified: std::sync::atomic::AtomicBool,
}

/// What is kept of one object name and operation: its admissions, and whose were dropped
/// to keep them bounded. What [`choose`] is given, in both paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeptAdmissions {
    /// The oldest first, at most [`ADMISSIONS_PER_KEY`].
    pub admissions: Vec<Admission>,
    /// The object uids of admissions dropped for newer ones (at most [`DROPPED_KEPT`]):
    /// the one that let such an object's work in may be gone, so no kept one is linked to
    /// it (`ambiguous`).
    pub dropped_uids: Vec<String>,
    /// Admissions of more uids than [`DROPPED_KEPT`] were dropped: nothing is linked
    /// through this name and operation any more (`ambiguous`).
    pub overflowed: bool,
}

impl KeptAdmissions {
    /// Whether an admission of the object `uid` may have been dropped.
    pub fn dropped(&self, uid: &str) -> bool {
        self.overflowed || self.dropped_uids.iter().any(|u| u == uid)
    }

    fn drop_oldest(&mut self) {
        if self.admissions.is_empty() {
            return;
        }
        let old = self.admissions.remove(0);
        // An admission naming no object links to nothing: dropping it loses no link.
        if old.object_uid.is_empty() || self.dropped(&old.object_uid) {
            return;
        }
        if self.dropped_uids.len() >= DROPPED_KEPT {
            self.overflowed = true;
        } else {
            self.dropped_uids.push(old.object_uid);
        }
    }
}

/// A map that keeps its newest `cap` keys.
struct Kept<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
}

impl<K, V> Default for Kept<K, V> {
    fn default() -> Self {
        Kept {
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone, V> Kept<K, V> {
    fn insert(&mut self, key: K, value: V, cap: usize) {
        if self.map.insert(key.clone(), value).is_none() {
            self.order.push_back(key);
            self.evict(cap);
        }
    }

    /// The value of `key`, made when it is new (then the oldest keys past `cap` go).
    fn entry(&mut self, key: K, cap: usize) -> &mut V
    where
        V: Default,
    {
        if !self.map.contains_key(&key) {
            self.order.push_back(key.clone());
            self.evict(cap.max(1));
        }
        self.map.entry(key).or_default()
    }

    fn evict(&mut self, cap: usize) {
        while self.order.len() > cap {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

type AdmissionKey = (String, String, String, String);

/// How many object names and operations admissions are kept for.
pub const ADMISSIONS_KEPT: usize = 4096;

/// How many admissions are kept per object name and operation: a deletion's real review
/// and a few more (a retry, a forged one, a same-named predecessor's). A newer one drops
/// the oldest, and the key says whose it was ([`KeptAdmissions::dropped_uids`]).
pub const ADMISSIONS_PER_KEY: usize = 4;

// What the webhook keeps is bounded: at most 16 Ki admissions in all.
const _: () = assert!(ADMISSIONS_KEPT * ADMISSIONS_PER_KEY <= 16 * 1024);

/// How many object uids a key remembers having dropped admissions of before it says it
/// overflowed ([`KeptAdmissions::overflowed`]).
pub const DROPPED_KEPT: usize = 8;

/// The longest request or object uid an admission is kept with (the API server's are
/// 36-character UUIDs): a longer one is no API server's review, and is not kept.
pub const UID_LIMIT: usize = 128;

/// How long before its object's `deletionTimestamp` a deletion's admission may have been
/// decided, and still be the one that set it: the longest a validating webhook may take
/// (`timeoutSeconds` is at most 30), as the window of a creation.
pub const ANSWER_WINDOW_SECS: i64 = 30;

/// Whether an allowed webhook decision of this kind and operation admits work the
/// controller then does.
pub fn admits_work(kind: &str, operation: &str) -> bool {
    matches!(
        (kind, operation),
        ("TalosMachine", "DELETE") | ("TalosOperation", "CREATE")
    )
}

impl Admissions {
    /// Whether the webhook authenticates its callers (`serve --client-ca`), said by every
    /// admission kept from now on ([`Admission::caller_verified`]).
    pub fn set_callers_verified(&self, verified: bool) {
        self.callers_verified
            .store(verified, std::sync::atomic::Ordering::Relaxed);
    }

    /// Keeps `r` when it is a webhook decision that let work in (a cheap test first: the
    /// webhook calls this for every record).
    pub fn note(&self, r: &Record) {
        let Some(req) = &r.request else { return };
        self.note_request(&r.verdict, &req.as_ref(), &r.id, &r.rules.digest, || {
            r.time.clone()
        });
    }

    /// [`Admissions::note`] of a webhook decision not built as a [`Record`]
    /// ([`records::WebhookRecord`]): `time` is asked only when it is kept.
    pub fn note_request(
        &self,
        verdict: &str,
        req: &records::RequestRef<'_>,
        id: &str,
        digest: &str,
        time: impl FnOnce() -> String,
    ) {
        // A dry run changes nothing: no work follows it, and it must never stand in for
        // (nor crowd out) the admission of the request that does.
        if req.dry_run || verdict == "refuse" || !admits_work(req.kind, req.operation) {
            return;
        }
        if req.uid.len() > UID_LIMIT || req.object_uid.len() > UID_LIMIT {
            return;
        }
        let key = (
            req.kind.to_string(),
            req.namespace.to_string(),
            req.name.to_string(),
            req.operation.to_string(),
        );
        if let Ok(mut inner) = self.inner.lock() {
            let kept = inner.entry(key, ADMISSIONS_KEPT);
            // A CREATE's first admission of a uid is the API server's: the uid is made for
            // the request just before the webhook is asked, and nobody can read it before
            // the object is stored, after the webhook answered. A later review naming the
            // same uid (a retry, or one forged by someone who read the object since) is not
            // kept beside it.
            if req.operation == "CREATE"
                && !req.object_uid.is_empty()
                && kept
                    .admissions
                    .iter()
                    .any(|a| a.object_uid == req.object_uid)
            {
                return;
            }
            // A DELETE's every allowed review is kept (up to the bound): a forged one sent
            // just after the real one cannot replace it, and two that could both have set
            // the deletion are linked to neither ([`choose`]).
            let admitted = Admission {
                decision: id.to_string(),
                request_uid: req.uid.to_string(),
                object_uid: req.object_uid.to_string(),
                operation: req.operation.to_string(),
                digest: digest.to_string(),
                time: time(),
                caller_verified: self
                    .callers_verified
                    .load(std::sync::atomic::Ordering::Relaxed),
            };
            while kept.admissions.len() >= ADMISSIONS_PER_KEY {
                kept.drop_oldest();
            }
            kept.admissions.push(admitted);
        }
    }

    /// The admission of `operation` on the object `meta` of `kind`, chosen among those kept
    /// for its name by the one check of both paths ([`choose`]): so a same-named earlier
    /// object's admission is never taken for this one's, nor one of two that could both
    /// have let it in. `known`: the rule-set digests this process has loaded
    /// (`reload::Rules::loaded_digests`). `Err`: why not (`not-found` when none is kept for
    /// the name, else [`choose`]'s reason).
    pub fn find(
        &self,
        kind: &str,
        meta: &ObjectMeta,
        operation: &str,
        known: &[String],
    ) -> Result<Admission, &'static str> {
        let kept = self.kept(
            kind,
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
            operation,
        );
        choose(
            &kept.admissions,
            kept.dropped(meta.uid.as_deref().unwrap_or_default()),
            meta,
            operation,
            known,
        )
        .cloned()
    }

    /// The kept admissions of `operation` on `kind` `namespace/name`, unchecked: what the
    /// webhook answers at `/admissions` (the asking controller chooses among them,
    /// [`choose`]).
    pub fn kept(&self, kind: &str, namespace: &str, name: &str, operation: &str) -> KeptAdmissions {
        let key = (
            kind.to_string(),
            namespace.to_string(),
            name.to_string(),
            operation.to_string(),
        );
        self.inner
            .lock()
            .ok()
            .and_then(|inner| inner.map.get(&key).cloned())
            .unwrap_or_default()
    }
}

/// The one admission of `kept` that let `operation` on the object `meta` in: the one
/// check of both paths (this process's webhook, [`Admissions::find`]; the webhooks of
/// another process, asked at their `/admissions`, `runtime::admission_link`). `dropped`:
/// an admission of this object may have been dropped from what was kept
/// ([`KeptAdmissions::dropped`]). `known`: the rule-set digests this process has loaded.
///
/// The candidates are the admissions that could have let it in: of this object's uid and
/// operation, decided within its lifetime ([`Admission::candidate`]; a deletion's within
/// the [`ANSWER_WINDOW_SECS`] before its `deletionTimestamp`, so an earlier deletion
/// refused elsewhere, by another webhook or by the API server, is none). Exactly one must
/// be, none dropped, and it must name a rule set this process loaded
/// ([`Admission::check_digest`]). `Err`, as a record's `admission_lookup` says it:
/// `ambiguous` when more than one is a candidate, or one may have been dropped (a forged
/// review sent beside the real one, a flood, a retry: which one set the deletion cannot be
/// told, so none is chosen); `not-found` when none is kept; else the check's reason of the
/// admission nearest to being this object's (`not-this-object`, `no-uid`, `uid-mismatch`),
/// or the candidate's digest's (`not-this-object` for a malformed one, `digest-unknown`).
pub fn choose<'a>(
    kept: impl IntoIterator<Item = &'a Admission>,
    dropped: bool,
    meta: &ObjectMeta,
    operation: &str,
    known: &[String],
) -> Result<&'a Admission, &'static str> {
    let mut chosen: Option<&Admission> = None;
    let mut candidates = 0usize;
    let mut refused: Option<&'static str> = None;
    for a in kept {
        match a.candidate(meta, operation) {
            Ok(()) => {
                candidates += 1;
                chosen.get_or_insert(a);
            }
            Err(why) if refused.is_none_or(|r| nearness(why) > nearness(r)) => {
                refused = Some(why);
            }
            Err(_) => {}
        }
    }
    if dropped || candidates > 1 {
        return Err("ambiguous");
    }
    let a = chosen.ok_or(refused.unwrap_or("not-found"))?;
    a.check_digest(known)?;
    Ok(a)
}

/// How near an admission refused for `why` came to being the object's: the nearest one's
/// reason is the one given.
fn nearness(why: &str) -> u8 {
    match why {
        "not-this-object" => 3,
        "no-uid" => 2,
        "uid-mismatch" => 1,
        _ => 0,
    }
}

/// Whether `digest` is the form of a rule-set digest ([`records::digest`]): `sha256:`
/// and 64 lowercase hex digits.
pub fn is_rules_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

impl Admission {
    /// Whether this admission alone let `operation` on the object `meta` in
    /// ([`Admission::check`]).
    pub fn admits(&self, meta: &ObjectMeta, operation: &str, known: &[String]) -> bool {
        self.check(meta, operation, known).is_ok()
    }

    /// Whether this admission, were it the only one kept, let `operation` on the object
    /// `meta` in: [`choose`] of it alone. `Err`: why not, as a record's `admission_lookup`
    /// says it.
    pub fn check(
        &self,
        meta: &ObjectMeta,
        operation: &str,
        known: &[String],
    ) -> Result<(), &'static str> {
        choose([self], false, meta, operation, known).map(|_| ())
    }

    /// Whether this admission could have let `operation` on the object `meta` in.
    ///
    /// - It names the object's uid (`no-uid` when it names none: a review without one, or a
    ///   webhook of an older version; `uid-mismatch` when it names another object's: a
    ///   same-named object deleted and created again). The uid is what tells one object
    ///   from a same-named predecessor; names and times cannot, within a second.
    /// - It is of that operation and was decided while this object existed
    ///   (`not-this-object` otherwise): a creation within 30 s of its `creationTimestamp`
    ///   either way (the API server gives a new object its uid and creation time before it
    ///   asks a validating webhook, then the webhook may take up to its timeout), a deletion
    ///   after it, within [`ANSWER_WINDOW_SECS`] before its `deletionTimestamp` (what the
    ///   webhook's timeout allows between the review and the deletion it let through) and no
    ///   later than it (one second of slack: the API server's timestamps are whole seconds,
    ///   the webhook's are not).
    pub fn candidate(&self, meta: &ObjectMeta, operation: &str) -> Result<(), &'static str> {
        if self.object_uid.is_empty() {
            return Err("no-uid");
        }
        if meta.uid.as_deref() != Some(self.object_uid.as_str()) {
            return Err("uid-mismatch");
        }
        if self.admits_at(meta, operation).unwrap_or(false) {
            Ok(())
        } else {
            Err("not-this-object")
        }
    }

    /// Whether the rules that decided this admission are rules this process knows: a
    /// well-formed digest (`not-this-object` otherwise) of a table it loaded, now or
    /// earlier (`known`, `reload::Rules::loaded_digests`; `digest-unknown` otherwise: the
    /// webhook decided under rules this process never served).
    pub fn check_digest(&self, known: &[String]) -> Result<(), &'static str> {
        if !is_rules_digest(&self.digest) {
            Err("not-this-object")
        } else if !known.contains(&self.digest) {
            Err("digest-unknown")
        } else {
            Ok(())
        }
    }

    fn admits_at(&self, meta: &ObjectMeta, operation: &str) -> Option<bool> {
        if self.operation != operation {
            return Some(false);
        }
        let at: k8s_openapi::jiff::Timestamp = self.time.parse().ok()?;
        let slack = k8s_openapi::jiff::SignedDuration::from_secs(1);
        let answer = k8s_openapi::jiff::SignedDuration::from_secs(ANSWER_WINDOW_SECS);
        let created = meta.creation_timestamp.as_ref().map(|t| t.0);
        let deleted = meta.deletion_timestamp.as_ref().map(|t| t.0);
        let after_creation = match (operation, created) {
            // A creation is admitted once the API server stamped the object (its uid and
            // creation time), within the webhook's timeout; 30 s before it as well, as an
            // admission's clock may run ahead.
            ("CREATE", Some(c)) => {
                at <= c.checked_add(slack).ok()?.checked_add(answer).ok()?
                    && at.checked_add(answer).ok()? >= c
            }
            (_, Some(c)) => at.checked_add(slack).ok()? >= c,
            (_, None) => false,
        };
        let before_deletion = match (operation, deleted) {
            // The review that let the deletion in was answered before the API server
            // stamped it, by at most the webhook's timeout.
            ("DELETE", Some(d)) => {
                at <= d.checked_add(slack).ok()? && at.checked_add(answer).ok()? >= d
            }
            ("DELETE", None) => false,
            _ => true,
        };
        Some(after_creation && before_deletion)
    }
}

/// Where a reconcile's records are built: the target, the Talos calls since the last
/// boundary, the etcd facts of the decision being taken, the step running.
pub struct Journal {
    recorder: Arc<Recorder>,
    target: Target,
    admission: Option<Admission>,
    /// Why no admission links: the one this process's webhook kept failed the check, or
    /// the webhook of another process gave none ([`Journal::link_remote`]).
    admission_lookup: Option<&'static str>,
    /// The operation whose admission let this work in, and what of the object its check
    /// reads ([`choose`]).
    operation: String,
    meta: ObjectMeta,
    /// The rule-set digests this process has loaded, which an admission's must be one of.
    known: Vec<String>,
    /// Talos calls since the last fact, decision or step began.
    calls: Vec<Effect>,
    etcd: Vec<EtcdAsked>,
    /// The id of this reconcile's last decision, and whether its record was queued to the
    /// sink (`false`: dropped, a full queue; no log holds it).
    decided: Option<String>,
    decided_queued: bool,
    step: Option<(StepInfo, Instant)>,
    digest: String,
    audit: Vec<String>,
}

/// At most this many calls are kept for one fact or step (a step polls a node a few times
/// at most in one reconcile).
const CALLS_KEPT: usize = 64;

impl Journal {
    /// The journal of one reconcile of `meta` (a `kind`); `operation`: the admission that
    /// let this work in (`DELETE` of a TalosMachine, `CREATE` of a TalosOperation);
    /// `known`: the rule-set digests this process has loaded
    /// (`reload::Rules::loaded_digests`), which a linked admission's must be one of.
    pub fn new(
        recorder: Arc<Recorder>,
        kind: &str,
        meta: &ObjectMeta,
        operation: &str,
        known: Vec<String>,
    ) -> Self {
        // This process's webhook: what it keeps for the object's name, checked. Keeping none
        // is no reason to give (the webhook may be another process's: `link_remote`); a kept
        // one the check refuses is (a same-named predecessor's: `uid-mismatch`).
        let found = recorder.admissions.find(kind, meta, operation, &known);
        let (admission, admission_lookup) = match found {
            Ok(a) => (Some(a), None),
            Err("not-found") => (None, None),
            Err(why) => (None, Some(why)),
        };
        Journal {
            recorder,
            target: Target {
                kind: kind.to_string(),
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
                uid: meta.uid.clone().unwrap_or_default(),
                resource_version: meta.resource_version.clone(),
                created: meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
                deleted: meta.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
            },
            admission,
            admission_lookup,
            operation: operation.to_string(),
            meta: ObjectMeta {
                name: meta.name.clone(),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone(),
                creation_timestamp: meta.creation_timestamp.clone(),
                deletion_timestamp: meta.deletion_timestamp.clone(),
                ..ObjectMeta::default()
            },
            known,
            calls: Vec::new(),
            etcd: Vec::new(),
            decided: None,
            decided_queued: false,
            step: None,
            digest: String::new(),
            audit: Vec::new(),
        }
    }

    /// The admission this journal links its records to.
    pub fn admission(&self) -> Option<&Admission> {
        self.admission.as_ref()
    }

    /// Why no admission links, when one was kept for the name or another process was asked.
    pub fn admission_lookup(&self) -> Option<&'static str> {
        self.admission_lookup
    }

    /// Links this journal's records to the admission of its work through the webhook of
    /// another process (`lookup`, `serve --admissions-url`) when this process's webhook
    /// did not let it in: asked once per reconcile, within the lookup's timeout (answers
    /// are kept a while), and checked with the same [`Admission::check`]. Without a
    /// lookup, or for work no admission lets in, nothing is asked.
    pub async fn link_remote(&mut self, lookup: Option<&super::admission_link::Lookup>) {
        let Some(lookup) = lookup else { return };
        if self.admission.is_some() || !admits_work(&self.target.kind, &self.operation) {
            return;
        }
        // This process's webhook kept a candidate it could not link (two, or one of rules
        // this process never loaded): another process's answer cannot make it one.
        if matches!(self.admission_lookup, Some("ambiguous" | "digest-unknown")) {
            return;
        }
        let linked = lookup
            .find(&self.target.kind, &self.meta, &self.operation, &self.known)
            .await;
        self.admission = linked.admission;
        // The other webhook keeping nothing says less than this one's refused admission.
        self.admission_lookup = match (linked.why, self.admission_lookup) {
            (Some("not-found"), Some(here)) => Some(here),
            (why, _) => why,
        };
    }

    /// A Talos call the world made, with what came back (`actor_id`: what Talos gave the
    /// action, when the call returns one).
    pub fn talos(
        &mut self,
        node: Node<'_>,
        call: &Call,
        answer: &Result<Reply, NodeError>,
        actor_id: Option<String>,
    ) {
        if self.calls.len() >= CALLS_KEPT {
            return;
        }
        let node = match node {
            Node::Endpoint(m) => format!("TalosMachine {}", m.name()),
            Node::Via(m, host) => format!("{host} through TalosMachine {}", m.name()),
            Node::Maintenance(m) => {
                format!("TalosMachine {} over the maintenance API", m.name())
            }
        };
        let (result, answer, boot_time) = match answer {
            Ok(reply) => ("ok".to_string(), summary(reply), boot_of(reply)),
            Err(e) => (records::clip(&e.to_string()), None, None),
        };
        self.calls.push(Effect {
            call: format!("{call:?}"),
            node,
            result,
            answer,
            actor_id,
            boot_time,
        });
    }

    /// A fact the executor asked of etcd, with the calls made since the last one.
    pub fn fact(&mut self, fact: Fact, value: i64, why: &str) {
        self.etcd.push(EtcdAsked {
            fact: fact.name().to_string(),
            value,
            why: why.to_string(),
            asked: std::mem::take(&mut self.calls),
        });
    }

    /// Records a decision of `ev` (with the expensive facts `supplied`): its facts read
    /// again from the same snapshot with a session of their own, so the deciding session
    /// stays what the model runs. Returns its id.
    pub fn decision(
        &mut self,
        table: &Table,
        snapshot: &Snapshot,
        ev: EventFacts<'_>,
        supplied: &[(Fact, i64)],
        decision: &Decision,
        started: Instant,
    ) -> String {
        let mut session = Session::new(
            table,
            SnapshotFacts::new(table, snapshot, ev, Expensive::Deferred),
        );
        for (fact, v) in supplied {
            session.supply_number(*fact, *v);
        }
        // Decided again so the session holds the facts the rows read; the findings are the
        // decision's own.
        let mut again = Decision::default();
        let _ = decide_into(&mut session, ev.event, &mut again);
        let matched = records::matched_since(decision, [0; 4]);
        // A refusal that is no rule's (a fact that could not be read) has nothing to decide
        // again: replay counts it as refused without the rules.
        let without_rules = decision
            .refusals
            .iter()
            .find(|f| f.rule.starts_with('('))
            .map(|f| records::clip(&format!("{}: {}", f.rule, f.message)));
        let mut event: EventRecord = records::event_record(table, &mut session, &ev, matched);
        // A fact asked of etcd came from etcd (`etcd` says through which node), not from
        // the objects its fallback would read.
        for f in &mut event.facts {
            if supplied.iter().any(|(s, _)| s.name() == f.name) {
                f.from.clear();
            }
        }
        self.rules_of(table);
        let id = records::decision_id();
        let record = ControllerRecord {
            decision: Record {
                record: "decision".into(),
                id: id.clone(),
                time: k8s_openapi::jiff::Timestamp::now().to_string(),
                site: "controller".into(),
                request: None,
                rules: RulesInfo {
                    digest: self.digest.clone(),
                    audit: self.audit.clone(),
                },
                events: vec![event],
                verdict: records::verdict_name(decision.verdict()).into(),
                deciding: decision.deciding().iter().map(|f| f.rule.clone()).collect(),
                warnings: decision.warnings.iter().map(|f| f.rule.clone()).collect(),
                would_verdict: records::would_verdict(decision).into(),
                refused_without_rules: without_rules,
                latency_us: micros(started),
            },
            target: self.target.clone(),
            etcd: std::mem::take(&mut self.etcd),
            admission: self.admission.clone(),
            admission_lookup: self.admission_lookup.map(str::to_string),
        };
        self.calls.clear();
        self.decided_queued = self.recorder.record_controller(record);
        self.decided = Some(id.clone());
        id
    }

    fn rules_of(&mut self, table: &Table) {
        if self.digest != table.digest {
            self.digest = table.digest.clone();
            self.audit = table.audit_rules().map(|r| r.name.clone()).collect();
        }
    }

    /// Plan step `index` begins (its guards held).
    pub fn step_began(&mut self, table: &Table, index: usize, text: &str, message: Option<&str>) {
        self.end_step("interrupted", None, None);
        self.rules_of(table);
        self.calls.clear();
        self.step = Some((
            StepInfo {
                index,
                text: text.to_string(),
                message: message.map(str::to_string),
            },
            Instant::now(),
        ));
    }

    /// The step begun last ended: `done`, `wait` or `fail`, with the condition's reason
    /// and message when it did not finish.
    pub fn step_ended(&mut self, result: &str, reason: Option<&str>, message: Option<&str>) {
        self.end_step(result, reason, message);
    }

    fn end_step(&mut self, result: &str, reason: Option<&str>, message: Option<&str>) {
        let Some((step, started)) = self.step.take() else {
            return;
        };
        let effects = std::mem::take(&mut self.calls);
        let boot_time = effects.iter().rev().find_map(|e| e.boot_time);
        self.recorder.record_step(StepRecord {
            record: "step".into(),
            id: records::decision_id(),
            time: k8s_openapi::jiff::Timestamp::now().to_string(),
            site: "controller".into(),
            target: self.target.clone(),
            rules: RulesInfo {
                digest: self.digest.clone(),
                audit: self.audit.clone(),
            },
            decision: self.step_decision(),
            step,
            effects,
            boot_time,
            result: result.to_string(),
            reason: reason.map(str::to_string),
            message: message.map(str::to_string),
            admission: self.admission.clone(),
            admission_lookup: self.admission_lookup.map(str::to_string),
            latency_us: micros(started),
        });
    }
}

impl Drop for Journal {
    /// A step the reconcile left by an error (an API write failed, the controller stopped)
    /// is recorded as `interrupted`: its effects happened.
    fn drop(&mut self) {
        self.end_step("interrupted", None, None);
    }
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

fn boot_of(reply: &Reply) -> Option<u64> {
    match reply {
        Reply::BootTime(t) => Some(*t),
        _ => None,
    }
}

/// A reply in short: what a reader of the record needs to follow the decision.
fn summary(reply: &Reply) -> Option<String> {
    Some(match reply {
        Reply::Done => return None,
        Reply::Version(v) => format!("version {v}"),
        Reply::Members(ms) => {
            let listed: Vec<String> = ms
                .iter()
                .map(|m| {
                    let learner = if m.is_learner { ", learner" } else { "" };
                    format!("{} ({:x}{learner})", m.hostname, m.id)
                })
                .collect();
            format!("members: {}", listed.join(", "))
        }
        Reply::Status(s) => format!("member {:x}, leader {:x}", s.member_id, s.leader),
        Reply::BootTime(t) => format!("boot time {t}"),
        Reply::Pulled(name) => format!("pulled {name}"),
        Reply::Installed {
            exit_code,
            last_message,
        } => format!("installed: exit code {exit_code}, {last_message}"),
        Reply::Entries(n) => format!("{n} entries"),
    })
    .map(|s| records::clip(&s))
}

/// The decision each condition message of an object first cited, in this process: a
/// refusal decided again cites its first decision, so its condition is not rewritten (nor
/// its Event published again) at every reconcile. Kept here, never read back from the
/// object's status, which a person could have written. Bounded: the oldest goes first.
/// Only a decision whose record was queued to the sink is cited: one the sink dropped is
/// in no log, and the next decision whose record is queued becomes the citation.
#[derive(Default)]
pub struct Citations {
    inner: Mutex<Kept<(String, String), String>>,
}

/// How many citations are kept.
pub const CITATIONS_KEPT: usize = 4096;

impl Citations {
    /// The decision `message` of object `uid` first cited; else `id` when its record was
    /// `queued` (it becomes the citation); else none (its record was dropped: nothing is
    /// remembered, so the next decision whose record is queued is cited).
    pub fn first(&self, uid: &str, message: &str, id: &str, queued: bool) -> Option<String> {
        let Ok(mut inner) = self.inner.lock() else {
            return queued.then(|| id.to_string());
        };
        let key = (uid.to_string(), message.to_string());
        if let Some(first) = inner.map.get(&key) {
            return Some(first.clone());
        }
        if !queued {
            return None;
        }
        inner.insert(key, id.to_string(), CITATIONS_KEPT);
        Some(id.to_string())
    }
}

/// A condition's message citing its rules and the decision that set it: `message (rule r;
/// decision id)`; without a decision (its record was dropped), `message (rule r)`.
pub fn cite_as(message: &str, decision: &Decision, id: Option<&str>) -> String {
    let rules: Vec<&str> = decision
        .deciding()
        .iter()
        .map(|f| f.rule.as_str())
        .collect();
    match (rules.is_empty(), id) {
        (true, None) => message.to_string(),
        (true, Some(id)) => format!("{message} (decision {id})"),
        (false, None) => format!("{message} (rule {})", rules.join(", ")),
        (false, Some(id)) => format!("{message} (rule {}; decision {id})", rules.join(", ")),
    }
}

impl Journal {
    /// The decision a step record names: this reconcile's, when a log holds its record.
    fn step_decision(&self) -> Option<String> {
        self.decided.clone().filter(|_| self.decided_queued)
    }

    /// `message` citing the decision this reconcile recorded, or the one the same message
    /// of the same object first cited ([`Citations`]); never a decision whose record the
    /// sink dropped.
    pub fn cite(&mut self, message: &str, decision: &Decision) -> String {
        let Some(id) = self.decided.as_deref() else {
            return message.to_string();
        };
        let first =
            self.recorder
                .citations
                .first(&self.target.uid, message, id, self.decided_queued);
        cite_as(message, decision, first.as_deref())
    }
}

/// `message` citing its decision when the world keeps records; as it is otherwise (the
/// model, `--decision-log off`).
pub fn cite<W: crate::runtime::exec::World>(
    w: &mut W,
    message: &str,
    decision: &Decision,
) -> String {
    match w.journal() {
        Some(j) => j.cite(message, decision),
        None => message.to_string(),
    }
}

/// The counts of a log's lines that are step records (replay skips them and says so).
pub fn count_steps(text: &str) -> usize {
    text.lines()
        .filter(|l| l.trim_start().starts_with('{') && l.contains("\"record\":\"step\""))
        .count()
}

/// Reads the step records of an NDJSON log (tests, tools); other lines are skipped.
pub fn read_steps(text: &str) -> Result<Vec<StepRecord>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if !line.starts_with('{') || !line.contains("\"record\":\"step\"") {
            continue;
        }
        let r: StepRecord = super::nesting::json(line.as_bytes())
            .map_err(|e| format!("line {}: not a step record: {e}", i + 1))?;
        out.push(r);
    }
    Ok(out)
}

/// Reads the controller's decision records of an NDJSON log.
pub fn read_decisions(text: &str) -> Result<Vec<ControllerRecord>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if !line.starts_with('{')
            || !line.contains("\"record\":\"decision\"")
            || !line.contains("\"site\":\"controller\"")
        {
            continue;
        }
        let r: ControllerRecord = super::nesting::json(line.as_bytes())
            .map_err(|e| format!("line {}: not a controller record: {e}", i + 1))?;
        out.push(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::Finding;
    use crate::vocab::Verdict;

    fn refused(rule: &str) -> Decision {
        let mut d = Decision::default();
        d.refusals.push(Finding {
            rule: rule.into(),
            verdict: Verdict::Refuse,
            message: "no".into(),
            reason: None,
        });
        d
    }

    /// A condition cites its rules and decision once: the same message of the same object
    /// keeps its first citation (no rewrite, no new Event); another message, or another
    /// object, cites its own.
    #[test]
    fn a_standing_refusal_keeps_its_first_citation() {
        let c = Citations::default();
        let d = refused("keep-quorum");
        let first = cite_as(
            "below the count",
            &d,
            c.first("u1", "below the count", "a1", true).as_deref(),
        );
        assert_eq!(first, "below the count (rule keep-quorum; decision a1)");
        assert_eq!(
            c.first("u1", "below the count", "b2", true).as_deref(),
            Some("a1")
        );
        assert_eq!(c.first("u1", "other", "b2", true).as_deref(), Some("b2"));
        assert_eq!(
            c.first("u2", "below the count", "c3", true).as_deref(),
            Some("c3")
        );
        assert_eq!(
            cite_as("go", &Decision::default(), Some("c3")),
            "go (decision c3)"
        );
        // A dropped record's decision is never cited, nor remembered: the first one queued
        // after it is; a standing citation stays whatever the later records' fate.
        assert_eq!(c.first("u3", "below the count", "d4", false), None);
        assert_eq!(
            cite_as("below the count", &d, None),
            "below the count (rule keep-quorum)"
        );
        assert_eq!(cite_as("go", &Decision::default(), None), "go");
        assert_eq!(
            c.first("u3", "below the count", "e5", true).as_deref(),
            Some("e5")
        );
        assert_eq!(
            c.first("u3", "below the count", "f6", false).as_deref(),
            Some("e5")
        );
    }

    /// A sink that never finishes a write until released (`.1`: a write began).
    struct Stuck(
        Arc<std::sync::atomic::AtomicBool>,
        Arc<std::sync::atomic::AtomicBool>,
    );

    impl std::io::Write for Stuck {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            while !self.0.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn records_total(m: &crate::runtime::metrics::Metrics, outcome: &str) -> u64 {
        let prefix = format!("ichor_rules_decision_records_total{{outcome=\"{outcome}\"}} ");
        m.render()
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()).and_then(|v| v.parse().ok()))
            .expect("the records counter")
    }

    /// Waits (at most 10 s) for `done`.
    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let until = Instant::now() + std::time::Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < until, "waited 10 s for {what}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// A controller decision whose record the sink dropped (its queue full) is cited by no
    /// condition: its id is in no log. The condition names its rule alone; the next
    /// decision of the same refusal whose record is queued becomes the citation, and stays
    /// it.
    #[test]
    fn a_decision_whose_record_was_dropped_is_never_cited() {
        use crate::runtime::facts::{EventFacts, Subject as On};
        use crate::runtime::objects::{Snapshot, TalosCluster, TalosMachine};
        use crate::vocab::{Site, Subject, Verb};
        let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let metrics = Arc::new(crate::runtime::metrics::Metrics::default());
        let recorder = Recorder::start(
            records::Sink::Writer(Box::new(Stuck(release.clone(), writing.clone()))),
            1,
            metrics.clone(),
        )
        .expect("the recorder starts");
        let machine: TalosMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": crate::runtime::objects::API_VERSION, "kind": "TalosMachine",
            "metadata": {"name": "cp-3", "namespace": "infra", "uid": "u-cp-3"},
            "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true}
        }))
        .expect("machine");
        let cluster: TalosCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": crate::runtime::objects::API_VERSION, "kind": "TalosCluster",
            "metadata": {"name": "prod", "namespace": "infra"},
            "spec": {"controlPlane": {"count": 3}}
        }))
        .expect("cluster");
        let snapshot = Snapshot {
            machines: vec![machine.clone()],
            clusters: vec![cluster],
            ..Snapshot::default()
        };
        let ev = EventFacts {
            event: (Verb::Remove, Subject::ControlPlane, Site::Controller),
            namespace: "infra",
            cluster: "prod",
            subject: On::Machine {
                name: "cp-3",
                view: &machine,
                counted: Some(&machine),
            },
        };
        let table = crate::ruleset::shipped_table();
        let refusal = refused("declared-count");
        let decide = || {
            let mut j = Journal::new(
                recorder.clone(),
                "TalosMachine",
                &machine.metadata,
                "DELETE",
                known(),
            );
            let id = j.decision(&table, &snapshot, ev, &[], &refusal, Instant::now());
            let message = j.cite("below the count", &refusal);
            // Its steps' records name it only when a log holds it, too.
            let named = j.step_decision();
            (id, message, named)
        };
        // The writer holds one record and never finishes; one waits; the rest are dropped.
        let filler = || webhook_record("TalosMachine", "DELETE", "refuse", "2026-12-05T10:00:00Z");
        recorder.record(filler());
        wait_for("the writer stuck", || {
            writing.load(std::sync::atomic::Ordering::SeqCst)
        });
        wait_for("a record dropped", || {
            recorder.record(filler());
            records_total(&metrics, "dropped") > 0
        });
        let (dropped, message, named) = decide();
        assert_eq!(
            message, "below the count (rule declared-count)",
            "decision {dropped} was dropped"
        );
        assert_eq!(named, None, "a step names the dropped decision {dropped}");
        // The sink catches up: the next decision is written and cited, then kept.
        release.store(true, std::sync::atomic::Ordering::SeqCst);
        wait_for("the queue written", || {
            records_total(&metrics, "written") >= 2
        });
        let (written, message, named) = decide();
        assert_ne!(written, dropped);
        assert_eq!(named.as_deref(), Some(written.as_str()));
        assert_eq!(
            message,
            format!("below the count (rule declared-count; decision {written})")
        );
        let (_, again, _) = decide();
        assert_eq!(again, message, "the first citation stays");
    }

    fn meta(created: &str, deleted: Option<&str>) -> ObjectMeta {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        ObjectMeta {
            name: Some("cp-3".into()),
            namespace: Some("infra".into()),
            uid: Some("u-1".into()),
            creation_timestamp: Some(Time(created.parse().expect("time"))),
            deletion_timestamp: deleted.map(|d| Time(d.parse().expect("time"))),
            ..ObjectMeta::default()
        }
    }

    const DIGEST: &str = "sha256:4be1c0ffee4be1c0ffee4be1c0ffee4be1c0ffee4be1c0ffee4be1c0ffee4be1";

    /// The digests this process "loaded": [`DIGEST`].
    fn known() -> Vec<String> {
        vec![DIGEST.to_string()]
    }

    fn webhook_record(kind: &str, op: &str, verdict: &str, time: &str) -> Record {
        Record {
            record: "decision".into(),
            id: format!("{op}-{time}"),
            time: time.into(),
            site: "webhook".into(),
            request: Some(records::RequestInfo {
                uid: "req-1".into(),
                user: "admin".into(),
                operation: op.into(),
                kind: kind.into(),
                namespace: "infra".into(),
                name: "cp-3".into(),
                object_uid: "u-1".into(),
                dry_run: false,
            }),
            rules: RulesInfo {
                digest: DIGEST.into(),
                audit: Vec::new(),
            },
            events: Vec::new(),
            verdict: verdict.into(),
            deciding: Vec::new(),
            warnings: Vec::new(),
            would_verdict: verdict.into(),
            refused_without_rules: None,
            latency_us: 0,
        }
    }

    /// Only an allowed deletion decided while this object lived links to it: a refusal is
    /// no admission, and a deletion admitted before the object was created (a same-named
    /// predecessor) or after its deletion began is not this object's.
    #[test]
    fn an_admission_links_only_to_the_object_it_let_in() {
        let a = Admissions::default();
        let m = meta("2026-12-05T10:00:00Z", Some("2026-12-05T11:00:00Z"));
        a.note(&webhook_record(
            "TalosMachine",
            "DELETE",
            "refuse",
            "2026-12-05T10:30:00Z",
        ));
        assert_eq!(
            a.find("TalosMachine", &m, "DELETE", &known()),
            Err("not-found")
        );
        a.note(&webhook_record(
            "TalosMachine",
            "DELETE",
            "allow",
            "2026-12-05T11:00:00.400Z",
        ));
        let found = a
            .find("TalosMachine", &m, "DELETE", &known())
            .expect("linked");
        assert_eq!(found.decision, "DELETE-2026-12-05T11:00:00.400Z");
        assert_eq!(found.request_uid, "req-1");
        assert_eq!(found.digest, DIGEST);
        // The same admission naming no well-formed rule-set digest is not taken.
        let mut forged = found.clone();
        forged.digest = "sha256:ab".into();
        assert!(!forged.admits(&m, "DELETE", &known()));
        assert!(found.admits(&m, "DELETE", &known()) && !found.admits(&m, "CREATE", &known()));
        let recreated = meta("2026-12-05T12:00:00Z", Some("2026-12-05T13:00:00Z"));
        assert_eq!(
            a.find("TalosMachine", &recreated, "DELETE", &known()),
            Err("not-this-object")
        );
        let not_deleting = meta("2026-12-05T10:00:00Z", None);
        assert_eq!(
            a.find("TalosMachine", &not_deleting, "DELETE", &known()),
            Err("not-this-object")
        );
        // An update is no admission of work.
        a.note(&webhook_record(
            "TalosMachine",
            "UPDATE",
            "allow",
            "2026-12-05T10:30:00Z",
        ));
        assert_eq!(
            a.find("TalosMachine", &m, "UPDATE", &known()),
            Err("not-found")
        );
        // A creation is admitted just before the object exists.
        a.note(&webhook_record(
            "TalosOperation",
            "CREATE",
            "allow",
            "2026-12-05T09:59:59.800Z",
        ));
        let op = meta("2026-12-05T10:00:00Z", None);
        assert!(a.find("TalosOperation", &op, "CREATE", &known()).is_ok());
        // ... or just after the API server stamped it, the webhook taking its time.
        let late = meta("2026-12-05T09:59:59Z", None);
        assert!(a.find("TalosOperation", &late, "CREATE", &known()).is_ok());
    }

    /// The link is by the object's uid: a same-named object deleted and created again
    /// within the second (its times cannot tell it from its predecessor) does not inherit
    /// the predecessor's admission, and an admission naming no uid links to nothing.
    #[test]
    fn an_admission_links_only_to_the_object_of_its_uid() {
        let a = Admissions::default();
        a.note(&webhook_record(
            "TalosMachine",
            "DELETE",
            "allow",
            "2026-12-05T10:00:00.500Z",
        ));
        // The predecessor (uid u-1) was deleted at 10:00:00.5; its successor, created and
        // deleted within the same second, has the same name and the same timestamps.
        let mut successor = meta("2026-12-05T10:00:00Z", Some("2026-12-05T10:00:00Z"));
        successor.uid = Some("u-2".into());
        assert_eq!(
            a.find("TalosMachine", &successor, "DELETE", &known()),
            Err("uid-mismatch")
        );
        let predecessor = meta("2026-12-05T10:00:00Z", Some("2026-12-05T10:00:00Z"));
        assert!(
            a.find("TalosMachine", &predecessor, "DELETE", &known())
                .is_ok()
        );
        // The same for a creation.
        a.note(&webhook_record(
            "TalosOperation",
            "CREATE",
            "allow",
            "2026-12-05T10:00:00.200Z",
        ));
        let mut created = meta("2026-12-05T10:00:00Z", None);
        created.uid = Some("u-2".into());
        assert_eq!(
            a.find("TalosOperation", &created, "CREATE", &known()),
            Err("uid-mismatch")
        );
        // An admission that names no object (a review without a uid).
        let mut unnamed = webhook_record(
            "TalosMachine",
            "DELETE",
            "allow",
            "2026-12-05T10:00:00.600Z",
        );
        if let Some(r) = unnamed.request.as_mut() {
            r.object_uid.clear();
        }
        a.note(&unnamed);
        // Beside the real one it is no candidate: the real one still links.
        assert!(
            a.find("TalosMachine", &predecessor, "DELETE", &known())
                .is_ok()
        );
        // Alone, it links to nothing.
        let b = Admissions::default();
        b.note(&unnamed);
        assert_eq!(
            b.find("TalosMachine", &predecessor, "DELETE", &known()),
            Err("no-uid")
        );
    }

    /// A dry run is recorded as one, and never kept as an admission: not on its own, and
    /// not in place of the real request's admission kept before it.
    #[test]
    fn a_dry_run_is_no_admission() {
        let a = Admissions::default();
        let m = meta("2026-12-05T10:00:00Z", Some("2026-12-05T11:00:00Z"));
        let mut dry = webhook_record("TalosMachine", "DELETE", "allow", "2026-12-05T10:59:40Z");
        if let Some(r) = dry.request.as_mut() {
            r.dry_run = true;
        }
        a.note(&dry);
        assert_eq!(
            a.find("TalosMachine", &m, "DELETE", &known()),
            Err("not-found")
        );
        let real = webhook_record("TalosMachine", "DELETE", "allow", "2026-12-05T10:59:50Z");
        a.note(&real);
        let mut later_dry = dry.clone();
        later_dry.id = "dry-later".into();
        later_dry.time = "2026-12-05T10:59:55Z".into();
        a.note(&later_dry);
        let found = a
            .find("TalosMachine", &m, "DELETE", &known())
            .expect("the real one");
        assert_eq!(found.decision, real.id);
        assert_eq!(found.object_uid, "u-1");
        let line = serde_json::to_string(&dry).expect("JSON");
        assert!(line.contains("\"dry_run\":true"), "{line}");
        let line = serde_json::to_string(&real).expect("JSON");
        assert!(!line.contains("dry_run"), "{line}");
    }

    /// A CREATE's first admission of a uid stays: a later review naming the same uid (one
    /// forged by whoever read the object after it was stored, or a retry) does not replace
    /// it. Each kept admission says whether the webhook authenticated its callers.
    #[test]
    fn a_creations_first_admission_stays_and_says_whether_its_caller_was_verified() {
        let a = Admissions::default();
        let real = webhook_record(
            "TalosOperation",
            "CREATE",
            "allow",
            "2026-12-05T10:00:00.200Z",
        );
        a.note(&real);
        let mut forged = real.clone();
        forged.id = "forged".into();
        forged.time = "2026-12-05T10:00:00.400Z".into();
        a.note(&forged);
        let created = meta("2026-12-05T10:00:00Z", None);
        let found = a
            .find("TalosOperation", &created, "CREATE", &known())
            .expect("kept");
        assert_eq!(found.decision, real.id);
        assert!(!found.caller_verified);
        // A deletion's admission, kept by a webhook that authenticates its callers.
        let b = Admissions::default();
        b.set_callers_verified(true);
        let first = webhook_record("TalosMachine", "DELETE", "allow", "2026-12-05T11:00:00Z");
        b.note(&first);
        let gone = meta("2026-12-05T10:00:00Z", Some("2026-12-05T11:00:00Z"));
        let found = b
            .find("TalosMachine", &gone, "DELETE", &known())
            .expect("kept");
        assert_eq!(found.decision, first.id);
        assert!(found.caller_verified);
        let line = serde_json::to_string(&found).expect("JSON");
        assert!(line.contains("\"caller_verified\":true"), "{line}");
    }

    /// `webhook_record` of a DELETE of cp-3 (uid `uid`) decided at `time`, as if sent by
    /// `user` with request uid `request`.
    fn deletion(time: &str, uid: &str, request: &str, user: &str) -> Record {
        let mut r = webhook_record("TalosMachine", "DELETE", "allow", time);
        r.id = format!("{request}@{time}");
        if let Some(q) = r.request.as_mut() {
            q.uid = request.into();
            q.object_uid = uid.into();
            q.user = user.into();
        }
        r
    }

    /// Without `--client-ca`, anyone reaching the webhook's port may post a DELETE review
    /// of the object's uid, with a made-up user, within the second after the real one: it
    /// is kept beside the real one, not in its place, and neither is linked (which one set
    /// the deletion cannot be told), in whichever order they came. The real one alone is
    /// linked.
    #[test]
    fn a_forged_deletion_review_beside_the_real_one_links_neither() {
        let gone = meta("2026-12-05T10:00:00Z", Some("2026-12-05T11:00:00Z"));
        let real = deletion("2026-12-05T11:00:00.200Z", "u-1", "req-real", "admin");
        let forged = deletion("2026-12-05T11:00:00.700Z", "u-1", "req-forged", "mallory");
        let alone = Admissions::default();
        alone.note(&real);
        let found = alone
            .find("TalosMachine", &gone, "DELETE", &known())
            .expect("the real one alone links");
        assert_eq!(found.decision, real.id);
        assert_eq!(found.request_uid, "req-real");
        for order in [[&real, &forged], [&forged, &real]] {
            let a = Admissions::default();
            for r in order {
                a.note(r);
            }
            assert_eq!(
                a.find("TalosMachine", &gone, "DELETE", &known()),
                Err("ambiguous")
            );
            // Both are kept and answered to another process, which decides the same.
            let kept = a.kept("TalosMachine", "infra", "cp-3", "DELETE");
            assert_eq!(kept.admissions.len(), 2);
            assert_eq!(
                choose(&kept.admissions, false, &gone, "DELETE", &known()),
                Err("ambiguous")
            );
        }
        // Each passes the check alone: only the choice among them refuses the link.
        let a = Admissions::default();
        a.note(&forged);
        assert!(a.find("TalosMachine", &gone, "DELETE", &known()).is_ok());
    }

    /// A deletion allowed here but refused after (by another webhook, or by the API
    /// server) sets no `deletionTimestamp`: one decided well before the real one, outside
    /// the window the webhook's timeout allows before the deletion, is no candidate, and
    /// the real one links. One within the window is: then neither links.
    #[test]
    fn an_earlier_deletion_refused_elsewhere_is_no_candidate() {
        let gone = meta("2026-12-05T10:00:00Z", Some("2026-12-05T11:00:00Z"));
        let a = Admissions::default();
        a.note(&deletion(
            "2026-12-05T10:50:00Z",
            "u-1",
            "req-early",
            "admin",
        ));
        let real = deletion("2026-12-05T11:00:00.300Z", "u-1", "req-real", "admin");
        a.note(&real);
        let found = a
            .find("TalosMachine", &gone, "DELETE", &known())
            .expect("the real one");
        assert_eq!(found.decision, real.id);
        // Alone, the early one is not this deletion's.
        let b = Admissions::default();
        b.note(&deletion(
            "2026-12-05T10:50:00Z",
            "u-1",
            "req-early",
            "admin",
        ));
        assert_eq!(
            b.find("TalosMachine", &gone, "DELETE", &known()),
            Err("not-this-object")
        );
        // 25 s before it: the webhook could have been that slow, so it is a candidate.
        a.note(&deletion(
            "2026-12-05T10:59:35Z",
            "u-1",
            "req-slow",
            "admin",
        ));
        assert_eq!(
            a.find("TalosMachine", &gone, "DELETE", &known()),
            Err("ambiguous")
        );
    }

    /// Reviews past the bound of a name drop the oldest, and say so: the real one pushed
    /// out by later reviews (here none of them a candidate) is never silently replaced by
    /// `not-this-object`, nor by one of them; a flood of other uids' reviews overflows the
    /// name. Dry runs and refusals, however many, are never kept, so they crowd out
    /// nothing. A same-named predecessor's admissions dropped cost its successor nothing.
    #[test]
    fn a_flood_of_reviews_makes_the_link_ambiguous_never_wrong() {
        let gone = meta("2026-12-05T10:00:00Z", Some("2026-12-05T11:00:00Z"));
        let real = deletion("2026-12-05T11:00:00.200Z", "u-1", "req-real", "admin");
        // Dry runs and refusals of the same object, many more than the bound.
        let a = Admissions::default();
        a.note(&real);
        for i in 0..3 * ADMISSIONS_PER_KEY {
            let mut dry = deletion("2026-12-05T11:00:00.500Z", "u-1", &format!("dry-{i}"), "x");
            if let Some(q) = dry.request.as_mut() {
                q.dry_run = true;
            }
            a.note(&dry);
            let mut refused = deletion("2026-12-05T11:00:00.500Z", "u-1", &format!("no-{i}"), "x");
            refused.verdict = "refuse".into();
            a.note(&refused);
        }
        let kept = a.kept("TalosMachine", "infra", "cp-3", "DELETE");
        assert_eq!(kept.admissions.len(), 1, "{kept:?}");
        assert!(kept.dropped_uids.is_empty() && !kept.overflowed);
        assert_eq!(
            a.find("TalosMachine", &gone, "DELETE", &known())
                .map(|f| f.decision),
            Ok(real.id.clone())
        );
        // Allowed reviews of the same uid, decided too late to be this deletion's.
        for i in 0..ADMISSIONS_PER_KEY {
            a.note(&deletion(
                "2026-12-05T11:05:00Z",
                "u-1",
                &format!("late-{i}"),
                "x",
            ));
        }
        let kept = a.kept("TalosMachine", "infra", "cp-3", "DELETE");
        assert_eq!(kept.admissions.len(), ADMISSIONS_PER_KEY);
        assert!(kept.admissions.iter().all(|k| k.decision != real.id));
        assert_eq!(kept.dropped_uids, vec!["u-1".to_string()]);
        assert_eq!(
            a.find("TalosMachine", &gone, "DELETE", &known()),
            Err("ambiguous")
        );
        // Reviews naming ever new uids: past the uids a name remembers, it overflowed.
        let b = Admissions::default();
        b.note(&real);
        for i in 0..ADMISSIONS_PER_KEY + DROPPED_KEPT + 1 {
            b.note(&deletion(
                "2026-12-05T11:00:00.500Z",
                &format!("v-{i}"),
                "f",
                "x",
            ));
        }
        let kept = b.kept("TalosMachine", "infra", "cp-3", "DELETE");
        assert!(kept.overflowed, "{kept:?}");
        assert_eq!(kept.admissions.len(), ADMISSIONS_PER_KEY);
        assert_eq!(kept.dropped_uids.len(), DROPPED_KEPT);
        assert_eq!(
            b.find("TalosMachine", &gone, "DELETE", &known()),
            Err("ambiguous")
        );
        // A predecessor (u-0) deleted and created again, its reviews retried: they go first,
        // and only its own link is lost.
        let c = Admissions::default();
        for i in 0..ADMISSIONS_PER_KEY {
            c.note(&deletion(
                "2026-12-05T09:00:00Z",
                "u-0",
                &format!("old-{i}"),
                "admin",
            ));
        }
        c.note(&real);
        let kept = c.kept("TalosMachine", "infra", "cp-3", "DELETE");
        assert_eq!(kept.dropped_uids, vec!["u-0".to_string()]);
        assert_eq!(
            c.find("TalosMachine", &gone, "DELETE", &known())
                .map(|f| f.decision),
            Ok(real.id.clone())
        );
    }

    /// An admission links only when it names the digest of rules this process loaded: now
    /// or earlier (a reload since), never a well-formed digest of rules it never served.
    #[test]
    fn an_admission_links_only_under_rules_this_process_loaded() {
        let dir = std::env::temp_dir().join(format!("ichor-known-digests-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let shipped = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
        for f in ["admission.rules", "removal.rules"] {
            std::fs::copy(shipped.join(f), dir.join(f)).expect("copy");
        }
        let rules = crate::runtime::reload::Rules::new(vec![dir.clone()]);
        assert!(matches!(
            rules.reload(),
            crate::runtime::reload::Reload::Replaced { .. }
        ));
        let first = rules.status().digest;
        let mut text = std::fs::read_to_string(dir.join("removal.rules")).expect("read");
        text.push_str("\n# an edit\n");
        std::fs::write(dir.join("removal.rules"), text).expect("write");
        assert!(matches!(
            rules.reload(),
            crate::runtime::reload::Reload::Replaced { .. }
        ));
        let now = rules.status().digest;
        assert_ne!(first, now);
        let loaded = rules.loaded_digests();
        assert_eq!(loaded, vec![now.clone(), first.clone()]);
        let gone = meta("2026-12-05T10:00:00Z", Some("2026-12-05T11:00:00Z"));
        let under = |digest: &str| {
            let mut r = deletion("2026-12-05T11:00:00.200Z", "u-1", "req-1", "admin");
            r.rules.digest = digest.into();
            let a = Admissions::default();
            a.note(&r);
            a.find("TalosMachine", &gone, "DELETE", &loaded)
        };
        assert_eq!(under(&first).map(|f| f.digest), Ok(first.clone()));
        assert_eq!(under(&now).map(|f| f.digest), Ok(now.clone()));
        // Well-formed, of rules this process never loaded.
        assert!(is_rules_digest(DIGEST));
        assert_eq!(under(DIGEST), Err("digest-unknown"));
        // Malformed, as before.
        assert_eq!(under("sha256:ab"), Err("not-this-object"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
