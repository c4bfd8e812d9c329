//! The world an operation runs in (`exec::operation`): the controller's world of a removal
//! ([`Live`]: the API server, drains, Talos with each cluster's credentials), with the
//! cluster lock taken for the operation itself, the operation's own status writes and
//! events, and the Kubernetes Node's cordon and readiness.

use super::world::Live;
use super::{Context, ReconcileError};
use crate::runtime::exec::operation::OperationWorld;
use crate::runtime::exec::{Note, World};
use crate::runtime::objects::{TalosMachine, TalosOperation};

/// The controller's world of one reconcile of the operation `namespace/name`.
pub struct OperationLive<'c> {
    /// The controller's world, its lock taken in the operation's name.
    live: Live<'c>,
    ctx: &'c Context,
    namespace: String,
    name: String,
    /// What this reconcile last wrote of the operation (each write compares with it).
    written: Option<TalosOperation>,
}

impl<'c> OperationLive<'c> {
    /// The world of one reconcile of `op`, keeping its decision records when the context
    /// has a recorder.
    pub fn new(ctx: &'c Context, op: &TalosOperation) -> OperationLive<'c> {
        let (namespace, name) = (op.namespace(), op.name());
        OperationLive {
            live: Live::for_operation(ctx, namespace, name).recording(
                "TalosOperation",
                &op.metadata,
                "CREATE",
            ),
            ctx,
            namespace: namespace.to_string(),
            name: name.to_string(),
            written: None,
        }
    }

    /// Links this reconcile's records to the operation's admission ([`Live::link_admission`]).
    pub async fn link_admission(&mut self) {
        self.live.link_admission().await;
    }

    /// Keeps a lock still held (an error ended the reconcile): the operation resumes it,
    /// or it expires after the lock duration.
    pub fn keep_lock(&mut self) {
        self.live.keep_lock();
    }
}

impl World for OperationLive<'_> {
    super::world::through_live!();

    fn journal(&mut self) -> Option<&mut crate::runtime::step_records::Journal> {
        self.live.journal()
    }

    fn note(&mut self, on: &TalosMachine, note: Note<'_>) {
        let operation = format!("{}/{}", self.namespace, self.name);
        match note {
            Note::Decided(d) => self.live.note(on, Note::Decided(d)),
            Note::Fact { fact, value, why } => {
                tracing::info!(%operation, machine = %on.name(), %fact, value, %why, "etcd asked");
            }
            Note::Step(_, text) => {
                tracing::info!(%operation, machine = %on.name(), step = %text, "operation step")
            }
            Note::Info(text) => tracing::info!(%operation, machine = %on.name(), "{text}"),
            Note::Warn(text) => tracing::warn!(%operation, machine = %on.name(), "{text}"),
        }
    }
}

impl OperationWorld for OperationLive<'_> {
    async fn write_operation(
        &mut self,
        before: &TalosOperation,
        after: &TalosOperation,
    ) -> Result<(), ReconcileError> {
        let base = match &self.written {
            Some(w) if w.name() == after.name() => w,
            _ => before,
        };
        let version = super::status::write(&self.ctx.client, base, after).await?;
        let mut wrote = after.clone();
        if let Some(v) = version {
            wrote.metadata.resource_version = Some(v);
        }
        self.written = Some(wrote);
        Ok(())
    }

    async fn operation_event(
        &mut self,
        on: &TalosOperation,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.ctx.event(on, warning, reason, note).await;
    }

    async fn node_event(&mut self, on: &TalosOperation, machine: &str, reason: &str, note: String) {
        let related = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(<TalosMachine as kube::Resource>::api_version(&()).into()),
            kind: Some(<TalosMachine as kube::Resource>::kind(&()).into()),
            namespace: Some(on.namespace().to_string()),
            name: Some(machine.to_string()),
            ..Default::default()
        };
        self.ctx
            .event_about(on, Some(related), false, reason, note)
            .await;
    }

    async fn cordon(
        &mut self,
        node: &str,
        on: bool,
    ) -> Result<Result<Option<bool>, String>, ReconcileError> {
        Ok(super::drain::cordon(&self.ctx.client, node, on)
            .await
            .map_err(|e| e.to_string()))
    }

    fn step_took(&mut self, action: crate::vocab::Action, took: std::time::Duration) {
        self.ctx.metrics.operation_step(action, took);
    }

    fn ended(&mut self, op: &TalosOperation, succeeded: bool) {
        let result = if succeeded { "succeeded" } else { "failed" };
        self.ctx.metrics.operation(&op.spec.kind, result);
    }

    async fn node_ready(
        &mut self,
        node: &str,
    ) -> Result<Result<Option<bool>, String>, ReconcileError> {
        Ok(super::drain::ready(&self.ctx.client, node)
            .await
            .map_err(|e| e.to_string()))
    }
}
