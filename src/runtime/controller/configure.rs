//! The world a machine's configuration is applied in (`exec::apply`, issue 37) and its
//! cluster bootstrapped in (`exec::bootstrap`, driven by `bootstrap.rs`), and the driver of
//! the apply: the controller's world ([`MachineLive`]) reads the cluster's
//! base Secret live (parsed here, never logged, never copied into status, Events or the
//! step log: only its digest and the render's hash leave this module), lists the
//! cluster's TalosConfigPatches, and calls Talos' `ApplyConfiguration` on the node's mTLS
//! API with the cluster's credentials, or on its maintenance API. Every decision is the
//! procedure's.

use super::nodes;
use super::world::Live;
use super::{Context, ReconcileError};
use crate::runtime::exec::apply::{self, ApplyError, ApplyWorld, BaseError, TalosApi};
use crate::runtime::exec::bootstrap::BootstrapWorld;
use crate::runtime::exec::{Note, Outcome, World};
use crate::runtime::live::{cluster_selector, list_complete};
use crate::runtime::objects::{BootstrapRecord, TalosCluster, TalosConfigPatch, TalosMachine};
use crate::runtime::render::{Base, CONTROLPLANE_KEY, Rendered, WORKER_KEY};
use crate::runtime::secrets;
use crate::runtime::talos::{Applied, ApplyMode, TalosClient};
use std::sync::Arc;
use std::time::Duration;

/// The controller's world of one reconcile of a machine's configuration, or of its
/// cluster's bootstrap.
pub struct MachineLive<'c, 'd> {
    live: Live<'c>,
    ctx: &'c Context,
    /// The credentials of the machine's cluster, read once by the machine's reconcile.
    dialer: &'d nodes::Dialer<'c>,
}

impl<'c, 'd> MachineLive<'c, 'd> {
    pub fn new(ctx: &'c Context, dialer: &'d nodes::Dialer<'c>, namespace: &str) -> Self {
        MachineLive {
            live: Live::new(ctx, namespace, None),
            ctx,
            dialer,
        }
    }

    /// Keeps decision records of this reconcile of `m` (`--decision-log`).
    pub fn recording(mut self, m: &TalosMachine) -> Self {
        self.live = self.live.recording("TalosMachine", &m.metadata, "");
        self
    }

    fn client(&self, m: &TalosMachine, api: TalosApi) -> Result<TalosClient, String> {
        match api {
            TalosApi::Maintenance => {
                let endpoint = m.spec.endpoint.as_deref().unwrap_or_default();
                TalosClient::maintenance(endpoint, self.ctx.settings.talos_timeout)
                    .map_err(|e| e.to_string())
            }
            TalosApi::Cluster => nodes::client(self.dialer, m).map_err(|e| e.to_string()),
        }
    }
}

impl World for MachineLive<'_, '_> {
    super::world::through_live!();

    fn note(&mut self, on: &TalosMachine, note: Note<'_>) {
        // The bootstrap's decision: its audit-mode rules counted as `super::held` counts
        // them (`ichor_rules_would_refuse_total`, and a log line).
        if let Note::Decided(d) = &note {
            for f in d
                .audited
                .iter()
                .filter(|f| f.verdict != crate::vocab::Verdict::Warn)
            {
                self.ctx.metrics.would_refuse(&f.rule);
                tracing::info!(rule = %f.rule, verdict = f.verdict.name(), message = %f.message, "a rule in audit mode matched: not enforced");
            }
        }
        self.live.note(on, note);
    }

    fn journal(&mut self) -> Option<&mut crate::runtime::step_records::Journal> {
        self.live.journal()
    }
}

impl ApplyWorld for MachineLive<'_, '_> {
    async fn base(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> Result<Result<Arc<Base>, BaseError>, ReconcileError> {
        Ok(
            match secrets::get(&self.ctx.client, namespace, name).await {
                Ok(Some(raw)) => match (raw.text(CONTROLPLANE_KEY), raw.text(WORKER_KEY)) {
                    (Some(cp), Some(w)) => Base::parse(&cp, &w, true)
                        .map(Arc::new)
                        .map_err(|e| BaseError::Invalid(e.to_string())),
                    _ => Err(BaseError::Incomplete),
                },
                Ok(None) => Err(BaseError::Missing),
                Err(e) => Err(BaseError::Unreadable(e.to_string())),
            },
        )
    }

    async fn patches(
        &mut self,
        cluster: &TalosCluster,
    ) -> Result<Result<Vec<TalosConfigPatch>, String>, ReconcileError> {
        let api: kube::Api<TalosConfigPatch> =
            kube::Api::namespaced(self.ctx.client.clone(), cluster.namespace());
        let params = kube::api::ListParams::default().fields(&cluster_selector(cluster.name()));
        Ok(list_complete(&api, &params)
            .await
            .map_err(|e| e.to_string()))
    }

    async fn apply_configuration(
        &mut self,
        m: &TalosMachine,
        api: TalosApi,
        config: &Rendered,
        mode: ApplyMode,
        dry_run: bool,
    ) -> Result<Result<Applied, ApplyError>, ReconcileError> {
        let client = match self.client(m, api) {
            Ok(c) => c,
            Err(e) => return Ok(Err(ApplyError::Unavailable(e))),
        };
        Ok(client
            .apply_configuration(config.text.as_bytes(), mode, dry_run)
            .await
            .map_err(|e| ApplyError::Talos(e.to_string())))
    }
}

impl BootstrapWorld for MachineLive<'_, '_> {
    async fn record_bootstrap(
        &mut self,
        cluster: &TalosCluster,
        record: Option<&BootstrapRecord>,
        guard: bool,
    ) -> Result<bool, ReconcileError> {
        let api: kube::Api<TalosCluster> =
            kube::Api::namespaced(self.ctx.client.clone(), cluster.namespace());
        let mut body = serde_json::json!({ "status": { "bootstrap": record } });
        if guard {
            body["metadata"] = serde_json::json!({
                "resourceVersion": cluster.metadata.resource_version.clone().unwrap_or_default()
            });
        }
        match api
            .patch_status(
                cluster.name(),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&body),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn cluster_event(
        &mut self,
        on: &TalosCluster,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.ctx.event(on, warning, reason, note).await;
    }
}

/// Configures the machine `live` (read live; `next`: its status so far, which the caller
/// writes) through the executor, by the table's `plan apply <role>` (its guards read
/// `snapshot`, the machine's cluster as read); `cluster` is the live TalosCluster. Returns when to look
/// again (`None`: nothing to do until something changes). Logged to the step log (`apply`)
/// when the controller keeps one.
pub async fn configure(
    ctx: &Context,
    dialer: &nodes::Dialer<'_>,
    table: &crate::compile::Table,
    snapshot: &crate::runtime::objects::Snapshot,
    cluster: Option<&TalosCluster>,
    live: &TalosMachine,
    next: &mut TalosMachine,
) -> Result<Option<Duration>, ReconcileError> {
    let world = MachineLive::new(ctx, dialer, live.namespace());
    let outcome = match &ctx.steps {
        // Every step logged, for `verify --check-trace`, with the status left to write.
        Some(log) => {
            let begin =
                crate::runtime::exec::trace::ApplyBegin::new(table, snapshot, cluster, live, next);
            // Looked at every probe: a quiet repeat is not logged again.
            let key = format!("{}/{}", live.namespace(), live.name());
            let id = log.begin_repeatable("apply", &key, &begin, &super::removal::timing(ctx));
            let mut traced = crate::runtime::exec::trace::Traced::new(world, log, id);
            let outcome = apply::reconcile(&mut traced, table, snapshot, cluster, live, next).await;
            log.end_with_status(id, &outcome, &next.status);
            outcome
        }
        None => {
            let mut world = world;
            apply::reconcile(&mut world, table, snapshot, cluster, live, next).await
        }
    };
    Ok(match outcome? {
        Outcome::Requeue { after, .. } => Some(after),
        Outcome::AwaitChange => None,
    })
}
