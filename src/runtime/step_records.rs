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
    /// (`uid-mismatch`, `no-uid`, `not-this-object`) or the webhook of another process was
    /// asked for it (`runtime::admission_link::REASONS`: also `not-found`, `timeout`,
    /// `unauthorized`, `forbidden`, `unavailable`, `bad-answer`).
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
/// process (`runtime::admission_link`, [`Admissions::kept`]). Bounded: the oldest goes
/// first.
#[derive(Default)]
pub struct Admissions {
    inner: Mutex<Kept<AdmissionKey, Admission>>,
    /// [`Admission::caller_verified`] of the admissions kept from now on.
    callers_verified: std::sync::atomic::AtomicBool,
}

/// A map that keeps its newest `cap` entries.
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
            while self.order.len() > cap {
                if let Some(old) = self.order.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
    }
}

type AdmissionKey = (String, String, String, String);

/// How many admissions are kept.
pub const ADMISSIONS_KEPT: usize = 4096;

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
        // (nor replace) the admission of the request that does.
        if req.dry_run || verdict == "refuse" || !admits_work(req.kind, req.operation) {
            return;
        }
        let key = (
            req.kind.to_string(),
            req.namespace.to_string(),
            req.name.to_string(),
            req.operation.to_string(),
        );
        if let Ok(mut inner) = self.inner.lock() {
            // A CREATE's first admission of a uid is the API server's: the uid is made for
            // the request just before the webhook is asked, and nobody can read it before
            // the object is stored, after the webhook answered. A later review naming the
            // same uid (a retry, or one forged by someone who read the object since) never
            // replaces it.
            if req.operation == "CREATE"
                && !req.object_uid.is_empty()
                && inner
                    .map
                    .get(&key)
                    .is_some_and(|a| a.object_uid == req.object_uid)
            {
                return;
            }
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
            inner.insert(key, admitted, ADMISSIONS_KEPT);
        }
    }

    /// The admission of `operation` on the object `meta` of `kind`, checked against the
    /// object itself ([`Admission::check`]), so a same-named earlier object's admission is
    /// never taken for this one's. `Err`: why not (`not-found` when none is kept for the
    /// name, else the check's reason: `uid-mismatch`, `no-uid`, `not-this-object`).
    pub fn find(
        &self,
        kind: &str,
        meta: &ObjectMeta,
        operation: &str,
    ) -> Result<Admission, &'static str> {
        let key = (
            kind.to_string(),
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
            operation.to_string(),
        );
        let found = self
            .inner
            .lock()
            .ok()
            .and_then(|inner| inner.map.get(&key).cloned())
            .ok_or("not-found")?;
        found.check(meta, operation).map(|()| found)
    }

    /// The kept admission of `operation` on `kind` `namespace/name`, unchecked: what the
    /// webhook answers at `/admissions` (the asking controller checks it against the
    /// object, [`Admission::check`]).
    pub fn kept(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        operation: &str,
    ) -> Option<Admission> {
        let key = (
            kind.to_string(),
            namespace.to_string(),
            name.to_string(),
            operation.to_string(),
        );
        self.inner.lock().ok()?.map.get(&key).cloned()
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
    /// Whether this admission let `operation` on the object `meta` in ([`Admission::check`]).
    pub fn admits(&self, meta: &ObjectMeta, operation: &str) -> bool {
        self.check(meta, operation).is_ok()
    }

    /// Whether this admission let `operation` on the object `meta` in: the one check of
    /// both paths (this process's webhook, [`Admissions::find`]; another process's, asked
    /// at its `/admissions`, `runtime::admission_link`). `Err`: why not, as a record's
    /// `admission_lookup` says it.
    ///
    /// - It names the object's uid (`no-uid` when it names none: a review without one, or a
    ///   webhook of an older version; `uid-mismatch` when it names another object's: a
    ///   same-named object deleted and created again). The uid is what tells one object
    ///   from a same-named predecessor; names and times cannot, within a second.
    /// - It is of that operation, names a well-formed rule-set digest, and was decided while
    ///   this object existed (`not-this-object` otherwise): a creation within 30 s of its
    ///   `creationTimestamp` either way (the API server gives a new object its uid and
    ///   creation time before it asks a validating webhook, then the webhook may take up to
    ///   its timeout), a deletion after it and no later than its `deletionTimestamp` (one
    ///   second of slack: the API server's timestamps are whole seconds, the webhook's are
    ///   not).
    pub fn check(&self, meta: &ObjectMeta, operation: &str) -> Result<(), &'static str> {
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

    fn admits_at(&self, meta: &ObjectMeta, operation: &str) -> Option<bool> {
        if self.operation != operation || !is_rules_digest(&self.digest) {
            return Some(false);
        }
        let at: k8s_openapi::jiff::Timestamp = self.time.parse().ok()?;
        let slack = k8s_openapi::jiff::SignedDuration::from_secs(1);
        let created = meta.creation_timestamp.as_ref().map(|t| t.0);
        let deleted = meta.deletion_timestamp.as_ref().map(|t| t.0);
        let after_creation = match (operation, created) {
            // A creation is admitted once the API server stamped the object (its uid and
            // creation time), within the webhook's timeout; 30 s before it as well, as an
            // admission's clock may run ahead.
            ("CREATE", Some(c)) => {
                let answer = k8s_openapi::jiff::SignedDuration::from_secs(30);
                at <= c.checked_add(slack).ok()?.checked_add(answer).ok()?
                    && at.checked_add(answer).ok()? >= c
            }
            (_, Some(c)) => at.checked_add(slack).ok()? >= c,
            (_, None) => false,
        };
        let before_deletion = match (operation, deleted) {
            ("DELETE", Some(d)) => at <= d.checked_add(slack).ok()?,
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
    /// reads ([`Admission::admits`]).
    operation: String,
    meta: ObjectMeta,
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
    /// let this work in (`DELETE` of a TalosMachine, `CREATE` of a TalosOperation).
    pub fn new(recorder: Arc<Recorder>, kind: &str, meta: &ObjectMeta, operation: &str) -> Self {
        // This process's webhook: what it keeps for the object's name, checked. Keeping none
        // is no reason to give (the webhook may be another process's: `link_remote`); a kept
        // one the check refuses is (a same-named predecessor's: `uid-mismatch`).
        let (admission, admission_lookup) = match recorder.admissions.find(kind, meta, operation) {
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
        let linked = lookup
            .find(&self.target.kind, &self.meta, &self.operation)
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
        assert_eq!(a.find("TalosMachine", &m, "DELETE"), Err("not-found"));
        a.note(&webhook_record(
            "TalosMachine",
            "DELETE",
            "allow",
            "2026-12-05T11:00:00.400Z",
        ));
        let found = a.find("TalosMachine", &m, "DELETE").expect("linked");
        assert_eq!(found.decision, "DELETE-2026-12-05T11:00:00.400Z");
        assert_eq!(found.request_uid, "req-1");
        assert_eq!(found.digest, DIGEST);
        // The same admission naming no well-formed rule-set digest is not taken.
        let mut forged = found.clone();
        forged.digest = "sha256:ab".into();
        assert!(!forged.admits(&m, "DELETE"));
        assert!(found.admits(&m, "DELETE") && !found.admits(&m, "CREATE"));
        let recreated = meta("2026-12-05T12:00:00Z", Some("2026-12-05T13:00:00Z"));
        assert_eq!(
            a.find("TalosMachine", &recreated, "DELETE"),
            Err("not-this-object")
        );
        let not_deleting = meta("2026-12-05T10:00:00Z", None);
        assert_eq!(
            a.find("TalosMachine", &not_deleting, "DELETE"),
            Err("not-this-object")
        );
        // An update is no admission of work.
        a.note(&webhook_record(
            "TalosMachine",
            "UPDATE",
            "allow",
            "2026-12-05T10:30:00Z",
        ));
        assert_eq!(a.find("TalosMachine", &m, "UPDATE"), Err("not-found"));
        // A creation is admitted just before the object exists.
        a.note(&webhook_record(
            "TalosOperation",
            "CREATE",
            "allow",
            "2026-12-05T09:59:59.800Z",
        ));
        let op = meta("2026-12-05T10:00:00Z", None);
        assert!(a.find("TalosOperation", &op, "CREATE").is_ok());
        // ... or just after the API server stamped it, the webhook taking its time.
        let late = meta("2026-12-05T09:59:59Z", None);
        assert!(a.find("TalosOperation", &late, "CREATE").is_ok());
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
            a.find("TalosMachine", &successor, "DELETE"),
            Err("uid-mismatch")
        );
        let predecessor = meta("2026-12-05T10:00:00Z", Some("2026-12-05T10:00:00Z"));
        assert!(a.find("TalosMachine", &predecessor, "DELETE").is_ok());
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
            a.find("TalosOperation", &created, "CREATE"),
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
        assert_eq!(
            a.find("TalosMachine", &predecessor, "DELETE"),
            Err("no-uid")
        );
    }

    /// A dry run is recorded as one, and never kept as an admission: not on its own, and
    /// not in place of the real request's admission kept before it.
    #[test]
    fn a_dry_run_is_no_admission() {
        let a = Admissions::default();
        let m = meta("2026-12-05T10:00:00Z", Some("2026-12-05T11:00:00Z"));
        let mut dry = webhook_record("TalosMachine", "DELETE", "allow", "2026-12-05T10:30:00Z");
        if let Some(r) = dry.request.as_mut() {
            r.dry_run = true;
        }
        a.note(&dry);
        assert_eq!(a.find("TalosMachine", &m, "DELETE"), Err("not-found"));
        let real = webhook_record("TalosMachine", "DELETE", "allow", "2026-12-05T10:40:00Z");
        a.note(&real);
        let mut later_dry = dry.clone();
        later_dry.id = "dry-later".into();
        later_dry.time = "2026-12-05T10:50:00Z".into();
        a.note(&later_dry);
        let found = a.find("TalosMachine", &m, "DELETE").expect("the real one");
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
        let found = a.find("TalosOperation", &created, "CREATE").expect("kept");
        assert_eq!(found.decision, real.id);
        assert!(!found.caller_verified);
        // A DELETE's newest admission is kept (the real one comes after any forged before
        // it, and its time is checked against the deletion).
        let b = Admissions::default();
        b.set_callers_verified(true);
        let first = webhook_record("TalosMachine", "DELETE", "allow", "2026-12-05T11:00:00Z");
        b.note(&first);
        let mut second = first.clone();
        second.id = "second".into();
        b.note(&second);
        let gone = meta("2026-12-05T10:00:00Z", Some("2026-12-05T11:00:00Z"));
        let found = b.find("TalosMachine", &gone, "DELETE").expect("kept");
        assert_eq!(found.decision, "second");
        assert!(found.caller_verified);
        let line = serde_json::to_string(&found).expect("JSON");
        assert!(line.contains("\"caller_verified\":true"), "{line}");
    }
}
