//! The controller's world: what the executor's procedures ([`crate::runtime::exec`]) do,
//! done with real I/O: the API server, the cluster lock's Lease, drains, and Talos with
//! each cluster's own credentials (read live, once per reconcile).

use super::disruptive::{self, Held, Refused, Work};
use super::nodes::{self, Dialer};
use super::{Context, ReconcileError};
use crate::runtime::exec::{Call, Drained, LockOp, Node, NodeError, Note, Reply, World};
use crate::runtime::live::Reads;
use crate::runtime::objects::{Snapshot, TalosMachine};
use crate::runtime::talos::{LegacyUpgrade, RebootMode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::sync::Arc;

/// The parts of a `World` (in an `impl World for …`) that a procedure's world takes from
/// its [`Live`] (a field `live`) unchanged: the clock, credentials, Talos, the lock, reads,
/// drains, the machine's status and finalizer, Events and decisions. Each world writes
/// its own `note` (and `journal` when it keeps one).
macro_rules! through_live {
    () => {
        type Error = $crate::runtime::controller::ReconcileError;

        fn now(&self) -> ::k8s_openapi::jiff::Timestamp {
            self.live.now()
        }

        async fn credentials(&mut self, cluster: &str) -> Result<(), String> {
            self.live.credentials(cluster).await
        }

        async fn talos(
            &mut self,
            cluster: &str,
            node: $crate::runtime::exec::Node<'_>,
            call: $crate::runtime::exec::Call,
        ) -> Result<
            Result<$crate::runtime::exec::Reply, $crate::runtime::exec::NodeError>,
            $crate::runtime::controller::ReconcileError,
        > {
            self.live.talos(cluster, node, call).await
        }

        async fn lock(
            &mut self,
            cluster: &str,
            op: $crate::runtime::exec::LockOp,
        ) -> Result<Result<(), String>, $crate::runtime::controller::ReconcileError> {
            self.live.lock(cluster, op).await
        }

        async fn read(
            &mut self,
            cluster: &str,
            reads: $crate::runtime::live::Reads,
        ) -> Result<
            ::std::sync::Arc<$crate::runtime::objects::Snapshot>,
            $crate::runtime::controller::ReconcileError,
        > {
            self.live.read(cluster, reads).await
        }

        async fn drain(
            &mut self,
            node: &str,
        ) -> Result<
            Result<$crate::runtime::exec::Drained, String>,
            $crate::runtime::controller::ReconcileError,
        > {
            self.live.drain(node).await
        }

        async fn write_status(
            &mut self,
            before: &$crate::runtime::objects::TalosMachine,
            after: &$crate::runtime::objects::TalosMachine,
        ) -> Result<Option<String>, $crate::runtime::controller::ReconcileError> {
            self.live.write_status(before, after).await
        }

        async fn release_finalizer(
            &mut self,
            m: &$crate::runtime::objects::TalosMachine,
        ) -> Result<(), $crate::runtime::controller::ReconcileError> {
            self.live.release_finalizer(m).await
        }

        async fn event(
            &mut self,
            on: &$crate::runtime::objects::TalosMachine,
            warning: bool,
            reason: &str,
            note: String,
        ) {
            self.live.event(on, warning, reason, note).await;
        }

        fn decide(
            &mut self,
            table: &$crate::compile::Table,
            snapshot: &$crate::runtime::objects::Snapshot,
            ev: $crate::runtime::facts::EventFacts<'_>,
            supplied: &[($crate::vocab::Fact, i64)],
        ) -> Result<$crate::interp::Decision, $crate::vocab::Fact> {
            self.live.decide(table, snapshot, ev, supplied)
        }
    };
}

pub(crate) use through_live;

/// The controller's world of one reconcile in `namespace`.
pub struct Live<'c> {
    ctx: &'c Context,
    namespace: String,
    /// The work that takes the cluster lock (none: this reconcile takes no lock).
    work: Option<Owned>,
    /// Each cluster's credentials, read once per reconcile.
    dialers: HashMap<String, Dialer<'c>>,
    held: Option<Held>,
    /// What this reconcile last wrote of the machine's status (each write compares with it).
    written: Option<TalosMachine>,
    /// This reconcile's decision records, when records are on ([`Live::recording`]).
    journal: Option<crate::runtime::step_records::Journal>,
}

/// The work of a reconcile, by name ([`Work`] borrows it when the lock is taken).
enum Owned {
    /// The removal of this machine.
    Removal(String),
    /// This TalosOperation.
    Operation(String),
}

impl<'c> Live<'c> {
    pub fn new(ctx: &'c Context, namespace: &str, removing: Option<&str>) -> Live<'c> {
        Live {
            ctx,
            namespace: namespace.to_string(),
            work: removing.map(|m| Owned::Removal(m.to_string())),
            dialers: HashMap::new(),
            held: None,
            written: None,
            journal: None,
        }
    }

    /// Keeps decision records of this reconcile of `meta` (a `kind`), when the context has
    /// a recorder; `admitted_by`: the operation whose admission let this work in.
    pub fn recording(mut self, kind: &str, meta: &ObjectMeta, admitted_by: &str) -> Self {
        self.journal = self.ctx.records.as_ref().map(|r| {
            crate::runtime::step_records::Journal::new(
                r.clone(),
                kind,
                meta,
                admitted_by,
                self.ctx.rules.loaded_digests(),
            )
        });
        self
    }

    /// Links this reconcile's records to the admission of its work when this process's
    /// webhook did not decide it: asks the webhook of another process
    /// ([`Context::admission_lookup`]), within the lookup's timeout.
    pub async fn link_admission(&mut self) {
        if let Some(j) = self.journal.as_mut() {
            j.link_remote(self.ctx.admission_lookup.as_deref()).await;
        }
    }

    /// The world of one reconcile of the operation `namespace/name`: the cluster lock is
    /// taken in the operation's name.
    pub fn for_operation(ctx: &'c Context, namespace: &str, name: &str) -> Live<'c> {
        Live {
            work: Some(Owned::Operation(name.to_string())),
            ..Live::new(ctx, namespace, None)
        }
    }

    /// Keeps a lock still held (an error ended the reconcile): the work resumes it, or it
    /// expires after the lock duration.
    pub fn keep_lock(&mut self) {
        if let Some(h) = self.held.take() {
            h.keep();
        }
    }

    /// A Talos client for `m`'s own node, with its cluster's credentials (for a call that
    /// is no [`Call`]: a snapshot's stream).
    pub async fn client(
        &mut self,
        m: &TalosMachine,
    ) -> Result<crate::runtime::talos::TalosClient, NodeError> {
        let d = self.dialer(m.cluster()).await;
        nodes::client(d, m)
    }

    async fn dialer(&mut self, cluster: &str) -> &Dialer<'c> {
        if !self.dialers.contains_key(cluster) {
            let d = Dialer::for_named(self.ctx, &self.namespace, cluster).await;
            self.dialers.insert(cluster.to_string(), d);
        }
        // (inserted above)
        #[allow(clippy::expect_used)]
        self.dialers.get(cluster).expect("inserted above")
    }
}

impl World for Live<'_> {
    type Error = ReconcileError;

    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    async fn credentials(&mut self, cluster: &str) -> Result<(), String> {
        match self.dialer(cluster).await.missing() {
            Some(why) => Err(why.to_string()),
            None => Ok(()),
        }
    }

    async fn talos(
        &mut self,
        cluster: &str,
        node: Node<'_>,
        call: Call,
    ) -> Result<Result<Reply, NodeError>, ReconcileError> {
        let d = self.dialer(cluster).await;
        let client = match node {
            Node::Endpoint(m) => nodes::client(d, m),
            Node::Via(m, host) => nodes::client(d, m).map(|c| c.with_node(host)),
            Node::Maintenance(m) => nodes::maintenance_client(d, m),
        };
        let c = match client {
            Ok(c) => c,
            Err(e) => {
                let answer = Err(e);
                if let Some(j) = &mut self.journal {
                    j.talos(node, &call, &answer, None);
                }
                return Ok(answer);
            }
        };
        // The call as asked, for the record (a Call holds no secret: names, ids, images).
        let asked = self.journal.as_ref().map(|_| call.clone());
        // The `actor_id` Talos gives an action, for the record.
        let mut actor: Option<String> = None;
        let mut acted = |a: String| {
            actor = Some(a);
            Reply::Done
        };
        let answer = match call {
            Call::Version => c.version().await.map(Reply::Version),
            Call::EtcdMemberList => c.etcd_member_list().await.map(Reply::Members),
            Call::EtcdStatus => c.etcd_status().await.map(Reply::Status),
            Call::EtcdForfeitLeadership => c.etcd_forfeit_leadership().await.map(|_| Reply::Done),
            Call::EtcdLeaveCluster => c.etcd_leave_cluster().await.map(|_| Reply::Done),
            Call::EtcdRemoveMemberById(id) => {
                c.etcd_remove_member_by_id(id).await.map(|_| Reply::Done)
            }
            Call::Reset { graceful } => c.reset(graceful, true).await.map(&mut acted),
            Call::Reboot => c.reboot(RebootMode::Default).await.map(&mut acted),
            Call::Shutdown { force } => c.shutdown(force).await.map(&mut acted),
            Call::UpgradeLegacy { image } => {
                let u = LegacyUpgrade {
                    image,
                    preserve: false,
                    stage: false,
                    force: false,
                    powercycle: false,
                };
                c.upgrade_legacy(&u).await.map(|_| Reply::Done)
            }
            Call::Rollback => c.rollback().await.map(|_| Reply::Done),
            Call::SystemStat => c.boot_time().await.map(Reply::BootTime),
            Call::ImagePull { image } => c
                .image_pull(&image, self.ctx.settings.install_deadline)
                .await
                .map(Reply::Pulled),
            Call::Bootstrap => c.bootstrap().await.map(|()| Reply::Done),
            Call::List { root } => c.list_entries(&root).await.map(Reply::Entries),
            Call::LifecycleUpgrade { image_name } => c
                .lifecycle_upgrade(&image_name, self.ctx.settings.install_deadline)
                .await
                .map(|i| Reply::Installed {
                    exit_code: i.exit_code,
                    last_message: i.last_message,
                }),
        };
        let answer = answer.map_err(NodeError::from);
        if let (Some(j), Some(call)) = (&mut self.journal, asked) {
            j.talos(node, &call, &answer, actor.filter(|a| !a.is_empty()));
        }
        Ok(answer)
    }

    async fn lock(
        &mut self,
        cluster: &str,
        op: LockOp,
    ) -> Result<Result<(), String>, ReconcileError> {
        match op {
            LockOp::Take => {
                let work = match &self.work {
                    Some(Owned::Removal(machine)) => Work::RemoveControlPlane {
                        namespace: &self.namespace,
                        machine,
                    },
                    Some(Owned::Operation(name)) => Work::Operation {
                        namespace: &self.namespace,
                        name,
                    },
                    None => {
                        return Ok(Err("(no work of this reconcile takes the lock)".into()));
                    }
                };
                match disruptive::hold(self.ctx, &self.namespace, cluster, work).await? {
                    Ok(h) => {
                        if let Some(old) = self.held.replace(h) {
                            old.keep();
                        }
                        Ok(Ok(()))
                    }
                    Err(Refused::Held { holder }) => Ok(Err(holder)),
                }
            }
            LockOp::Release => {
                if let Some(h) = self.held.take() {
                    h.release().await?;
                }
                Ok(Ok(()))
            }
            LockOp::Keep => {
                if let Some(h) = self.held.take() {
                    h.keep();
                }
                Ok(Ok(()))
            }
        }
    }

    async fn read(&mut self, cluster: &str, reads: Reads) -> Result<Arc<Snapshot>, ReconcileError> {
        Ok(Arc::new(
            self.ctx
                .reader
                .snapshot(&self.namespace, &[cluster], reads)
                .await?,
        ))
    }

    async fn drain(&mut self, node: &str) -> Result<Result<Drained, String>, ReconcileError> {
        Ok(super::drain::drain(&self.ctx.client, node)
            .await
            .map_err(|e| e.to_string()))
    }

    async fn write_status(
        &mut self,
        before: &TalosMachine,
        after: &TalosMachine,
    ) -> Result<Option<String>, ReconcileError> {
        let base = match &self.written {
            Some(w) if w.name() == after.name() => w,
            _ => before,
        };
        let version = super::status::write(&self.ctx.client, base, after).await?;
        let mut wrote = after.clone();
        if let Some(v) = &version {
            wrote.metadata.resource_version = Some(v.clone());
        }
        self.written = Some(wrote);
        Ok(version)
    }

    async fn release_finalizer(&mut self, m: &TalosMachine) -> Result<(), ReconcileError> {
        Ok(super::finalizer::set_removal(self.ctx, m, false).await?)
    }

    async fn event(&mut self, on: &TalosMachine, warning: bool, reason: &str, note: String) {
        self.ctx.event(on, warning, reason, note).await;
    }

    fn journal(&mut self) -> Option<&mut crate::runtime::step_records::Journal> {
        self.journal.as_mut()
    }

    fn note(&mut self, on: &TalosMachine, note: Note<'_>) {
        let machine = format!("{}/{}", on.namespace(), on.name());
        match note {
            Note::Decided(d) => {
                if let Some(verdict) = d.verdict() {
                    for f in d.deciding() {
                        self.ctx.metrics.decision(&f.rule, verdict.name());
                    }
                }
            }
            Note::Fact { fact, value, why } => {
                tracing::info!(%machine, %fact, value, %why, "etcd asked");
            }
            Note::Step(_, text) => tracing::debug!(%machine, step = %text, "plan step"),
            Note::Info(text) => tracing::info!(%machine, "{text}"),
            Note::Warn(text) => tracing::warn!(%machine, "{text}"),
        }
    }
}
