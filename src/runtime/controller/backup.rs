//! TalosEtcdBackups (issue 36): the controller checks each backup's spec (`Ready=False
//! InvalidSpec`, every problem listed, with how to fix it) and says whether its store is
//! inside the cluster it backs up (the warning condition `StoreInCluster`, ADR 0106 §2:
//! `True` with why, removed once the endpoint moves out; `Ready` is not affected by it).
//!
//! And the etcd restore the rules let start: the operator does not run it (it runs inside
//! the cluster being restored), so the operation stays `Pending` with the rules' own words
//! on how to restore by hand ([`manual_procedure`]).

use super::status::{self, Conditions};
use super::{Context, ReconcileError};
use crate::runtime::decide::{decide_events, reconcile_start_event};
use crate::runtime::exec::backup::BackupTiming;
use crate::runtime::facts::Expensive;
use crate::runtime::live::Reads;
use crate::runtime::objects::{Snapshot, TalosEtcdBackup, TalosOperation, validate_backup_spec};
use kube::runtime::controller::Action;
use std::sync::Arc;
use std::time::Duration;

/// The condition a backup whose store is inside its cluster carries (ADR 0106 §2).
pub const STORE_IN_CLUSTER: &str = "StoreInCluster";

/// A backup's readiness condition (a TalosEtcdBackup's, not a TalosMachine's: no decision
/// reads it, so it is none of the machine status reads the status guard covers).
const READY: &str = "Ready";

/// How often a backup is looked at again when nothing about it changes (its cluster's
/// network may have).
const RECHECK: Duration = Duration::from_secs(300);

/// Sets the conditions of `b` from its spec and its cluster; returns whether anything
/// changed. Pure: the reconcile reads and writes around it.
pub fn judge(b: &mut TalosEtcdBackup, snapshot: &Snapshot) -> bool {
    let cluster = snapshot.cluster(b.namespace(), b.cluster());
    let errors = validate_backup_spec(&b.spec);
    let in_cluster = b.store_in_cluster(cluster);
    let mut changed = false;
    if errors.is_empty() {
        if cluster.is_none() {
            let message = format!(
                "TalosCluster {} is not in namespace {}; spec.clusterRef.name must name the cluster to back up",
                b.cluster(),
                b.namespace()
            );
            changed |= status::set(
                b.conditions_mut(),
                READY,
                false,
                "ClusterNotFound",
                &message,
            );
        } else {
            changed |= status::set(
                b.conditions_mut(),
                READY,
                true,
                "SpecValid",
                "the spec is valid",
            );
        }
    } else {
        let message = format!(
            "the spec has {} problem{}: {}; no snapshot is taken until it is fixed",
            errors.len(),
            if errors.len() == 1 { "" } else { "s" },
            errors.join("; ")
        );
        changed |= status::set(b.conditions_mut(), READY, false, "InvalidSpec", &message);
    }
    match in_cluster {
        Some(why) => {
            let message = format!(
                "the store is inside TalosCluster {}: {why}. A restore from it would deadlock (ADR 0106 §2): \
                 the backup store must live outside the cluster being restored, so an etcd-restore \
                 from this backup is refused. Snapshots are still taken; move spec.store.endpoint \
                 to a store outside the cluster",
                b.cluster()
            );
            changed |= status::set(
                b.conditions_mut(),
                STORE_IN_CLUSTER,
                true,
                "StoreInCluster",
                &message,
            );
        }
        None => changed |= status::remove(b.conditions_mut(), STORE_IN_CLUSTER),
    }
    changed
}

pub async fn reconcile(
    b: Arc<TalosEtcdBackup>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let reads = Reads {
        machines: false,
        clusters: true,
        operations: true,
        backups: true,
    };
    let snapshot = ctx
        .reader
        .snapshot(b.namespace(), &[b.cluster()], reads)
        .await?;
    // The live object (the watch's copy may be older).
    let Some(live) = snapshot.backup(b.namespace(), b.name()) else {
        return Ok(Action::await_change());
    };
    let mut next = live.clone();
    let was_in_cluster = live
        .condition(STORE_IN_CLUSTER)
        .is_some_and(|c| c.status == "True");
    let was_invalid = live
        .condition(READY)
        .is_some_and(|c| c.reason.as_deref() == Some("InvalidSpec"));
    if judge(&mut next, &snapshot) {
        status::write(&ctx.client, live, &next).await?;
        let backup = format!("{}/{}", next.namespace(), next.name());
        if let Some(c) = next.condition(STORE_IN_CLUSTER).filter(|_| !was_in_cluster) {
            let message = c.message.clone().unwrap_or_default();
            tracing::warn!(%backup, "backup store inside the cluster");
            ctx.event(&next, true, STORE_IN_CLUSTER, message).await;
        }
        if let Some(c) = next
            .condition(READY)
            .filter(|c| c.reason.as_deref() == Some("InvalidSpec") && !was_invalid)
        {
            let message = c.message.clone().unwrap_or_default();
            tracing::warn!(%backup, %message, "backup spec invalid");
            ctx.event(&next, true, "InvalidSpec", message).await;
        }
    }
    // A sound spec of an existing cluster: its snapshots, through the one executor.
    let ready = next.condition(READY).is_some_and(|c| c.status == "True");
    if !ready {
        return Ok(Action::requeue(RECHECK));
    }
    let Some(table) = ctx.rules.current() else {
        return Err(ReconcileError::NoRules);
    };
    let timing = BackupTiming {
        retry: ctx.settings.backup_retry,
        recheck: RECHECK,
    };
    let world = super::backup_world::BackupLive::new(&ctx, next.namespace());
    let outcome = match &ctx.steps {
        // Every step logged, for `verify --check-trace`.
        Some(log) => {
            let begin =
                crate::runtime::exec::trace::BackupBegin::new(&next, &snapshot.operations, &timing);
            let id = log.begin("backup", &begin, &super::removal::timing(&ctx));
            let mut traced = crate::runtime::exec::trace::Traced::new(world, log, id);
            let outcome = crate::runtime::exec::backup::reconcile(
                &mut traced,
                &table,
                &timing,
                &next,
                &snapshot.operations,
            )
            .await;
            log.end(id, &outcome);
            outcome?
        }
        None => {
            let mut world = world;
            crate::runtime::exec::backup::reconcile(
                &mut world,
                &table,
                &timing,
                &next,
                &snapshot.operations,
            )
            .await?
        }
    };
    Ok(match outcome {
        crate::runtime::exec::Outcome::Requeue { after, .. } => Action::requeue(after),
        crate::runtime::exec::Outcome::AwaitChange => Action::requeue(RECHECK),
    })
}

/// For an operation the start rules let through and whose kind the rules give no plan
/// (an etcd restore): the rules' warnings about its start, which say how to do it by
/// hand; `None` when it has a plan, or no warning speaks of it.
pub fn manual_procedure(
    table: &crate::compile::Table,
    snapshot: &Snapshot,
    o: &TalosOperation,
) -> Option<String> {
    if table.operation_plan(&o.spec.kind).is_some() {
        return None;
    }
    let ev = reconcile_start_event(o)?;
    let (decision, _) = decide_events(table, snapshot, &[ev], Expensive::FromObjects, false);
    if decision.verdict().is_some() || decision.warnings.is_empty() {
        return None;
    }
    let messages: Vec<&str> = decision
        .warnings
        .iter()
        .map(|w| w.message.as_str())
        .collect();
    Some(messages.join("; "))
}

/// Marks an operation that is to be done by hand (`Accepted=True`, reason
/// `ManualProcedure`, the rules' words), once, with a Warning event; it stays `Pending`.
/// Returns whether the status changed.
pub async fn mark_manual(ctx: &Context, next: &mut TalosOperation, message: &str) -> bool {
    let changed = status::set(
        next.conditions_mut(),
        "Accepted",
        true,
        "ManualProcedure",
        message,
    );
    if changed {
        let operation = format!("{}/{}", next.namespace(), next.name());
        tracing::info!(%operation, "operation left to be done by hand");
        ctx.event(&*next, true, "ManualProcedure", message.to_string())
            .await;
    }
    changed
}

/// An `etcd-snapshot` TalosOperation the start rules let through: it asks its backup
/// (spec.backupRef) for a snapshot now. Once running (phase Running), the backup's
/// controller takes one for it, through the backup's own procedure; the operation ends
/// Succeeded when the backup records a verified snapshot made for it, Failed (with the
/// backup's words) when the backup served it and the snapshot failed.
pub async fn snapshot_operation(
    ctx: &Context,
    snapshot: &Snapshot,
    live: &TalosOperation,
    next: &mut TalosOperation,
) -> Result<Action, ReconcileError> {
    use crate::runtime::exec::backup::{SNAPSHOT, operation_token};
    let token = operation_token(live);
    let name = live.backup_name().to_string();
    let operation = format!("{}/{}", live.namespace(), live.name());
    let Some(b) = snapshot
        .backup(live.namespace(), &name)
        .filter(|b| b.cluster() == live.cluster())
    else {
        let msg = format!(
            "TalosEtcdBackup {name} of TalosCluster {} is gone, so no snapshot is taken for this \
             operation; create the operation again naming an existing backup",
            live.cluster()
        );
        return end_snapshot_operation(ctx, live, next, false, "BackupNotFound", msg).await;
    };
    let st = b.status.as_ref();
    let made = st.and_then(|s| {
        s.snapshots
            .iter()
            .chain(s.last_snapshot.iter())
            .find(|r| r.request.as_deref() == Some(token.as_str()))
    });
    if let Some(r) = made {
        let msg = format!(
            "TalosEtcdBackup {name} took snapshot {} for this operation and verified it: {} bytes, \
             sha256 {}, from {}",
            r.key, r.size, r.sha256, r.node
        );
        return end_snapshot_operation(ctx, live, next, true, "Succeeded", msg).await;
    }
    let served = st.and_then(|s| s.last_request.as_deref()) == Some(token.as_str());
    let in_flight = st.and_then(|s| s.in_progress.as_ref()).is_some();
    if served && !in_flight {
        let why = b
            .condition(SNAPSHOT)
            .filter(|c| c.status == "False")
            .and_then(|c| c.message.clone())
            .unwrap_or_else(|| "the backup gave no reason".into());
        let msg =
            format!("TalosEtcdBackup {name} did not take a snapshot for this operation: {why}");
        return end_snapshot_operation(ctx, live, next, false, "SnapshotFailed", msg).await;
    }
    if live.phase() != "Running" {
        next.status.get_or_insert_with(Default::default).phase = Some("Running".into());
        let msg = format!("a snapshot is asked of TalosEtcdBackup {name}");
        status::set(
            next.conditions_mut(),
            "Running",
            true,
            "SnapshotRequested",
            &msg,
        );
        tracing::info!(%operation, backup = %name, "snapshot asked of the backup");
        ctx.event(live, false, "SnapshotRequested", msg).await;
    }
    status::write(&ctx.client, live, next).await?;
    Ok(Action::requeue(ctx.settings.parked_requeue))
}

async fn end_snapshot_operation(
    ctx: &Context,
    live: &TalosOperation,
    next: &mut TalosOperation,
    ok: bool,
    reason: &str,
    message: String,
) -> Result<Action, ReconcileError> {
    let s = next.status.get_or_insert_with(Default::default);
    s.phase = Some(if ok { "Succeeded" } else { "Failed" }.into());
    if !ok {
        s.failure_reason = Some(message.clone());
    }
    status::set(next.conditions_mut(), "Running", false, reason, &message);
    status::write(&ctx.client, live, next).await?;
    ctx.event(live, !ok, reason, message).await;
    ctx.metrics
        .operation(&live.spec.kind, if ok { "succeeded" } else { "failed" });
    Ok(Action::await_change())
}
