//! The controller: the authoritative half. It evaluates the same table as the webhook, at
//! the controller site, against live uncached reads (the watch only says *which* object to
//! look at), and carries out the removal plan with built-in actions.
//!
//! - [`machine`]: the ControlPlaneOverCap hold, the removal finalizer, reachability probes;
//! - [`removal`]: the removal of a control plane under the cluster lock, step by step;
//! - [`plan`]: the removal's decisions and plan-step guards, without I/O (`verify` calls
//!   them too); [`finalizer`]: the one place finalizers are added and removed;
//!   [`status`]: conditions and the one status write;
//! - [`cluster`]: the Transitioning condition from the live count;
//! - [`operation`]: parking operations while the count is even, resuming them when odd;
//! - [`lock`]: Leases as locks; [`disruptive`] is the ONE way disruptive work takes a
//!   cluster's lock (a [`disruptive::Held`] guard, released or kept exactly once); [`leader`]: one replica reconciles.

pub mod backup;
pub mod backup_world;
pub mod base;
pub mod bootstrap;
pub mod cluster;
pub mod configure;
pub mod disruptive;
pub mod drain;
pub mod finalizer;
pub mod leader;
pub mod lock;
pub mod machine;
pub mod nodes;
pub mod operation;
pub mod operation_world;
pub use crate::runtime::exec::rules as plan;
pub mod removal;
pub mod roll;
pub mod status;
pub mod world;

pub use plan::hold_of;

use super::live::{LiveError, LiveReader};
use super::metrics::Metrics;
use super::objects::{TalosCluster, TalosConfigPatch, TalosMachine, TalosOperation};
use super::reload::Rules;
use super::talos::TalosTls;
use futures::StreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The controller's name on events and locks.
pub const CONTROLLER_NAME: &str = "ichor-rules";

/// Intervals and identities. The defaults are the seeds' figures; tests shorten them.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This instance (the pod name in a cluster).
    pub identity: String,
    /// Where the leader-election Lease lives.
    pub lease_namespace: String,
    /// A held (ControlPlaneOverCap) machine is looked at again after this.
    pub over_cap_requeue: Duration,
    /// A blocked drain is retried after this (a fixed wait, not a growing backoff).
    pub drain_retry: Duration,
    /// A refused removal is decided again after this.
    pub refused_requeue: Duration,
    /// A removal waiting for a cluster lock held by other work tries again after this.
    pub lock_retry: Duration,
    /// A parked operation is looked at again after this.
    pub parked_requeue: Duration,
    /// How often a converged machine's node is probed through the Talos API.
    pub probe_interval: Duration,
    /// How long a node may not answer before Ready=False NodeUnreachable.
    pub unreachable_grace: Duration,
    /// A cluster lock not renewed for this long is free again.
    pub lock_duration: Duration,
    /// The leader-election Lease's duration.
    pub leader_duration: Duration,
    /// A failed reconcile is retried after this.
    pub error_requeue: Duration,
    /// A Talos reset that may have been sent (its answer lost, or the controller stopped
    /// right after it) is sent again only if the node still answers normally this long
    /// after it was started: a graceful reset can take minutes before the node goes down.
    pub reset_settle: Duration,
    /// Each live read.
    pub read_timeout: Duration,
    /// Each Talos API call.
    pub talos_timeout: Duration,
    /// An installer image pull, and the install of an upgrade (streams read to their end);
    /// also how long a node sent an operation's destructive call may go on answering with
    /// its old boot time (a legacy upgrade installs first) before the operation fails
    /// rather than send it again.
    pub install_deadline: Duration,
    /// A backup's failed snapshot is tried again after this (or at its next scheduled
    /// time, when sooner).
    pub backup_retry: Duration,
    /// A snapshot's whole stream, from the node into the store.
    pub snapshot_deadline: Duration,
    /// A configuration roll starts once no machine of the cluster was newly staged for
    /// this long, so one roll takes every machine a change staged.
    pub roll_settle: Duration,
    /// How often a TalosCluster with a base Secret reads it again: a change of the Secret
    /// (which the controller may `get` but neither list nor watch) is published as a new
    /// digest, and that re-renders the cluster's machines.
    pub base_recheck: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            identity: CONTROLLER_NAME.into(),
            lease_namespace: "default".into(),
            over_cap_requeue: Duration::from_secs(15),
            drain_retry: Duration::from_secs(15),
            refused_requeue: Duration::from_secs(30),
            lock_retry: Duration::from_secs(5),
            parked_requeue: Duration::from_secs(30),
            probe_interval: Duration::from_secs(120),
            unreachable_grace: Duration::from_secs(60),
            lock_duration: Duration::from_secs(120),
            leader_duration: Duration::from_secs(15),
            error_requeue: Duration::from_secs(5),
            reset_settle: Duration::from_secs(600),
            read_timeout: Duration::from_secs(5),
            talos_timeout: Duration::from_secs(10),
            install_deadline: Duration::from_secs(600),
            backup_retry: Duration::from_secs(300),
            snapshot_deadline: Duration::from_secs(1800),
            roll_settle: Duration::from_secs(30),
            base_recheck: Duration::from_secs(60),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub reader: LiveReader,
    pub rules: Arc<Rules>,
    /// Client credentials for the Talos API (from the talosconfig Secret). Without them,
    /// probes are skipped and Talos steps of a removal wait with a clear condition.
    pub talos: Option<Arc<TalosTls>>,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    recorder: Recorder,
    /// Until when no disruptive work starts: set by [`leader::run`] when this replica
    /// takes the leader Lease from a version that kept cluster locks in each cluster's
    /// namespace (one lock duration, the longest such a lock outlives its last renewal).
    legacy_locks_until: std::sync::Mutex<Option<Instant>>,
    /// What this replica has seen of the Leases it locks with, and when, on its own clock
    /// (`lock::Observations`): expiry never compares clocks of two replicas.
    pub leases: Arc<lock::Observations>,
    /// Where each reconcile's steps are logged (`serve --step-log`), for
    /// `verify --check-trace`.
    pub steps: Option<Arc<crate::runtime::exec::trace::StepLog>>,
    /// Where the controller's decision records go (`serve --decision-log`: the webhook's
    /// queue and sink, `runtime::step_records`).
    pub records: Option<Arc<crate::runtime::records::Recorder>>,
    /// Where the admissions decided by a webhook in another process are asked
    /// (`serve --admissions-url`, `runtime::admission_link`).
    pub admission_lookup: Option<Arc<crate::runtime::admission_link::Lookup>>,
}

impl Context {
    pub fn new(
        client: Client,
        rules: Arc<Rules>,
        talos: Option<Arc<TalosTls>>,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Context {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_NAME.into(),
                instance: Some(settings.identity.clone()),
            },
        );
        Context {
            reader: LiveReader::new(client.clone(), settings.read_timeout),
            client,
            rules,
            talos,
            settings,
            metrics,
            recorder,
            legacy_locks_until: std::sync::Mutex::new(None),
            leases: Arc::default(),
            steps: None,
            records: None,
            admission_lookup: None,
        }
    }

    /// Logs every reconcile's steps to `log` ([`crate::runtime::exec::trace`]).
    pub fn with_step_log(mut self, log: Arc<crate::runtime::exec::trace::StepLog>) -> Context {
        self.steps = Some(log);
        self
    }

    /// Keeps decision records of the controller's decisions and steps in `records`.
    pub fn with_records(mut self, records: Arc<crate::runtime::records::Recorder>) -> Context {
        self.records = Some(records);
        self
    }

    /// Asks `lookup` for the admissions this process's webhook did not decide (the chart's
    /// webhook Deployment decides them), to link the records to.
    pub fn with_admission_lookup(
        mut self,
        lookup: Arc<crate::runtime::admission_link::Lookup>,
    ) -> Context {
        self.admission_lookup = Some(lookup);
        self
    }

    /// Holds disruptive work back until `until` (see [`Context::legacy_locks_left`]).
    pub fn hold_for_legacy_locks(&self, until: Instant) {
        if let Ok(mut u) = self.legacy_locks_until.lock() {
            *u = Some(until);
        }
    }

    /// How long locks the previous version may still hold in a cluster's namespace keep
    /// disruptive work back; `None` once they have all expired (or there were none).
    pub fn legacy_locks_left(&self) -> Option<Duration> {
        let until = (*self.legacy_locks_until.lock().ok()?)?;
        until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    }

    /// Publishes an event about an object; a failure to publish is logged, never fatal.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.event_about(object, None, warning, reason, note).await;
    }

    /// [`Context::event`] with a related object (`secondary`: the Event's `related`), which
    /// is part of what the recorder folds repeated Events by: Events of the same reason
    /// about different related objects stay apart, each with its note.
    pub async fn event_about<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        secondary: Option<k8s_openapi::api::core::v1::ObjectReference>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary,
        };
        if let Err(e) = self.recorder.publish(&ev, &object.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "publishing an event failed");
        }
    }
}

/// What held or refused, as a condition's (reason, message): the first reason a deciding
/// rule gives (else `default_reason`) and every deciding message. Counts the deciding rules
/// in the metrics, and the rules in audit mode that would have refused or held
/// (`ichor_rules_would_refuse_total`, and a log line: they neither refuse nor hold). `None`
/// when the decision lets the work proceed.
pub fn held(
    ctx: &Context,
    decision: &crate::interp::Decision,
    default_reason: &str,
) -> Option<(String, String)> {
    for f in decision
        .audited
        .iter()
        .filter(|f| f.verdict != crate::vocab::Verdict::Warn)
    {
        ctx.metrics.would_refuse(&f.rule);
        tracing::info!(rule = %f.rule, verdict = f.verdict.name(), message = %f.message, "a rule in audit mode matched: not enforced");
    }
    let verdict = decision.verdict()?;
    for f in decision.deciding() {
        ctx.metrics.decision(&f.rule, verdict.name());
    }
    hold_of(decision, default_reason)
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Live(#[from] LiveError),
    #[error("API: {0}")]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error("no rules are loaded; nothing is decided until they check clean")]
    NoRules,
}

fn error_policy<K>(obj: Arc<K>, err: &ReconcileError, ctx: Arc<Context>) -> Action
where
    K: Resource<DynamicType = ()>,
{
    let r = ObjectRef::from_obj(&*obj);
    tracing::warn!(object = %r, error = %err, "reconcile failed; retrying");
    Action::requeue(ctx.settings.error_requeue)
}

async fn timed<F>(kind: &'static str, ctx: &Context, fut: F) -> Result<Action, ReconcileError>
where
    F: Future<Output = Result<Action, ReconcileError>>,
{
    let started = Instant::now();
    let out = fut.await;
    ctx.metrics.reconcile(kind, out.is_ok(), started.elapsed());
    out
}

/// The machines' cluster, as an object reference for the cluster controller.
fn cluster_of(m: TalosMachine) -> Option<ObjectRef<TalosCluster>> {
    let ns = m.metadata.namespace.clone()?;
    let name = m.spec.cluster_ref.name.clone();
    (!name.is_empty()).then(|| ObjectRef::new(&name).within(&ns))
}

/// The backup an `etcd-snapshot` operation asks a snapshot of, for the backup controller.
fn backup_of(o: TalosOperation) -> Option<ObjectRef<crate::runtime::objects::TalosEtcdBackup>> {
    if o.spec.kind != crate::runtime::exec::backup::SNAPSHOT_KIND {
        return None;
    }
    let ns = o.metadata.namespace.clone()?;
    let name = o.backup_name();
    (!name.is_empty()).then(|| ObjectRef::new(name).within(&ns))
}

/// The machines of a cluster, as the machine controller's cache knows them: which machines
/// a change of their cluster or of one of its patches makes reconcile (the reconcile reads
/// everything live).
fn machines_of(
    store: &kube::runtime::reflector::Store<TalosMachine>,
    namespace: &str,
    cluster: &str,
) -> Vec<ObjectRef<TalosMachine>> {
    store
        .state()
        .iter()
        .filter(|m| m.namespace() == namespace && m.cluster() == cluster)
        .map(|m| ObjectRef::from_obj(&**m))
        .collect()
}

/// Runs the three controllers until the returned future is dropped (leadership lost) or
/// the watches end.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let machines: Api<TalosMachine> = Api::all(client.clone());
    let clusters: Api<TalosCluster> = Api::all(client.clone());
    let operations: Api<TalosOperation> = Api::all(client.clone());
    let operations_for_backups = operations.clone();
    let backups: Api<crate::runtime::objects::TalosEtcdBackup> = Api::all(client.clone());
    let wc = watcher::Config::default();

    let patches: Api<TalosConfigPatch> = Api::all(client.clone());
    let machine_ctl = {
        let ctx = ctx.clone();
        let ctl = Controller::new(machines.clone(), wc.clone());
        let (by_patch, by_cluster) = (ctl.store(), ctl.store());
        // The base digest each cluster published last: a cluster change re-renders its
        // machines only when its base changed (its other changes follow the machines').
        let digests: std::sync::Mutex<std::collections::HashMap<(String, String), String>> =
            std::sync::Mutex::default();
        ctl
            // A TalosConfigPatch created, changed or deleted: the machines of its cluster
            // render again (each reconcile picks the patches that select it).
            .watches(patches, wc.clone(), move |p: TalosConfigPatch| {
                machines_of(&by_patch, p.namespace(), p.cluster())
            })
            // The base Secret changed: the cluster publishes its new digest.
            .watches(clusters.clone(), wc.clone(), move |c: TalosCluster| {
                let digest = c
                    .status
                    .as_ref()
                    .and_then(|s| s.redacted_base.as_ref())
                    .map(|b| b.digest.clone())
                    .unwrap_or_default();
                let key = (c.namespace().to_string(), c.name().to_string());
                let changed = digests
                    .lock()
                    .map(|mut d| {
                        d.insert(key, digest.clone())
                            .is_some_and(|old| old != digest)
                    })
                    .unwrap_or(false);
                if changed {
                    machines_of(&by_cluster, c.namespace(), c.name())
                } else {
                    Vec::new()
                }
            })
            .run(
                |m, ctx: Arc<Context>| async move {
                    timed("TalosMachine", &ctx, machine::reconcile(m, ctx.clone())).await
                },
                error_policy,
                ctx,
            )
            .for_each(|_| futures::future::ready(()))
    };
    let cluster_ctl = {
        let ctx = ctx.clone();
        Controller::new(clusters, wc.clone())
            .watches(machines, wc.clone(), cluster_of)
            .run(
                |c, ctx: Arc<Context>| async move {
                    timed("TalosCluster", &ctx, cluster::reconcile(c, ctx.clone())).await
                },
                error_policy,
                ctx,
            )
            .for_each(|_| futures::future::ready(()))
    };
    let operation_ctl = {
        let ctx = ctx.clone();
        Controller::new(operations, wc.clone())
            .run(
                |o, ctx: Arc<Context>| async move {
                    timed("TalosOperation", &ctx, operation::reconcile(o, ctx.clone())).await
                },
                error_policy,
                ctx,
            )
            .for_each(|_| futures::future::ready(()))
    };
    let backup_ctl = {
        let ctx = ctx.clone();
        Controller::new(backups, wc.clone())
            .watches(operations_for_backups, wc, backup_of)
            .run(
                |b, ctx: Arc<Context>| async move {
                    timed("TalosEtcdBackup", &ctx, backup::reconcile(b, ctx.clone())).await
                },
                error_policy,
                ctx,
            )
            .for_each(|_| futures::future::ready(()))
    };
    tokio::join!(machine_ctl, cluster_ctl, operation_ctl, backup_ctl);
}
