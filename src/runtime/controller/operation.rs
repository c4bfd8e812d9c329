//! TalosOperations and the even count (ADR 0137): while the approved control-plane count
//! is even, an operation is parked (phase Paused, Paused=True reason ClusterTransitioning,
//! no lock held) and looked at again every `parked_requeue`; once the count is odd it
//! resumes by itself. The rules decide (`hold run operation`); an etcd restore is a
//! recovery and is not parked.
//!
//! Once no rule parks it and its start rules let it through, the operation runs: its
//! kind's plan, step by step, through the one executor ([`crate::runtime::exec::operation`]),
//! in [`super::operation_world::OperationLive`] (the cluster lock taken for the operation
//! itself, through [`super::disruptive`]).

use super::status::{self, Conditions};
use super::{Context, ReconcileError, held};
use crate::runtime::decide::{decide_events, reconcile_operation_event, reconcile_start_event};
use crate::runtime::facts::Expensive;
use crate::runtime::live::Reads;
use crate::runtime::objects::TalosOperation;
use kube::runtime::controller::Action;
use std::sync::Arc;

/// Whether a Paused reason is one the rules set (so the controller may clear it), rather
/// than a person's or another component's (Operator, ClusterLockHeld, …), which it leaves.
fn rule_reason(table: &crate::compile::Table, reason: Option<&str>) -> bool {
    table.owns_reason(reason)
}

/// Before the controller first acts on an operation that has not started, its `start`
/// rules are decided again at the controller (the same table as admission). Refused (or
/// held), it is marked `Accepted=False` (reason `StartRefused`, the rules' messages), a
/// Warning event says why, and it is not run: decided again every `parked_requeue`. Once
/// they allow it, a former refusal is cleared (`Accepted=True`, `StartAllowed`).
fn unreadable(why: &str) -> crate::interp::Decision {
    let mut d = crate::interp::Decision::default();
    d.refusals.push(crate::interp::Finding {
        rule: "(live state)".into(),
        verdict: crate::vocab::Verdict::Refuse,
        message: format!("{why}, so the operation waits"),
        reason: None,
    });
    d
}

/// `Some(requeue)` when the start rules refuse (or hold); `None` when the operation may
/// run (it has started already, or they allow it now).
async fn start_again(
    ctx: &Context,
    table: &crate::compile::Table,
    snapshot: &crate::runtime::objects::Snapshot,
    next: &mut TalosOperation,
) -> Option<Action> {
    let ev = reconcile_start_event(next)?;
    // `healthy.after` is asked of etcd (the members that stay once the target is reset),
    // as for a removal, through the one loop that asks for expensive facts; what cannot be
    // read refuses.
    let target = next
        .spec
        .machine
        .as_deref()
        .and_then(|t| snapshot.machine(next.namespace(), t));
    let cannot = |f: crate::vocab::Fact, why: &str| crate::interp::Finding {
        rule: "(live state)".into(),
        verdict: crate::vocab::Verdict::Refuse,
        message: if why.is_empty() {
            format!("the fact `{f}` could not be read, so the operation waits")
        } else {
            format!("the healthy etcd members cannot be counted ({why}), so the operation waits")
        },
        reason: None,
    };
    let mut world = super::world::Live::new(ctx, next.namespace(), None).recording(
        "TalosOperation",
        &next.metadata,
        "CREATE",
    );
    world.link_admission().await;
    let asked = crate::runtime::exec::rules::decide_asking(
        &mut world, table, snapshot, ev, target, false, &cannot,
    )
    .await;
    let decision = match asked {
        Ok(a) => a.decision,
        Err(e) => unreadable(&format!("etcd could not be asked ({e})")),
    };
    let refused = held(ctx, &decision, "StartRefused")
        .map(|(_, message)| crate::runtime::step_records::cite(&mut world, &message, &decision));
    let was_refused = next.start_refused();
    match refused {
        Some(message) => {
            if status::set(
                next.conditions_mut(),
                "Accepted",
                false,
                "StartRefused",
                &message,
            ) {
                let operation = format!("{}/{}", next.namespace(), next.name());
                tracing::warn!(%operation, %message, "start refused at the controller");
                ctx.event(&*next, true, "StartRefused", message).await;
            }
            Some(Action::requeue(ctx.settings.parked_requeue))
        }
        None => {
            if was_refused {
                status::set(
                    next.conditions_mut(),
                    "Accepted",
                    true,
                    "StartAllowed",
                    "the start rules allow the operation now",
                );
            }
            None
        }
    }
}

pub async fn reconcile(
    o: Arc<TalosOperation>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let (ns, name) = (o.namespace().to_string(), o.name().to_string());
    let reads = Reads {
        machines: true,
        clusters: true,
        operations: true,
        backups: true,
    };
    let snapshot = ctx.reader.snapshot(&ns, &[o.cluster()], reads).await?;
    let Some(live) = snapshot.operation(&ns, &name) else {
        return Ok(Action::await_change());
    };
    let Some(table) = ctx.rules.current() else {
        return Err(ReconcileError::NoRules);
    };
    let events: Vec<_> = reconcile_operation_event(live).into_iter().collect();
    if events.is_empty() {
        return Ok(Action::await_change());
    }
    // A failed operation is not parked nor resumed by itself: its failure stands (ADR
    // 0137), until a person asks for a resume (the annotation ichor.maesh.dev/resume with
    // a new value); the next reconcile then decides the run and step rules again.
    if live.failed() {
        if let Some(asked) = crate::runtime::exec::operation::resume_asked(live) {
            let mut next = live.clone();
            crate::runtime::exec::operation::resume(&mut next, &asked);
            status::write(&ctx.client, live, &next).await?;
            ctx.event(
                live,
                false,
                "Resumed",
                format!("resumed by the annotation ichor.maesh.dev/resume={asked}"),
            )
            .await;
            return Ok(Action::requeue(ctx.settings.lock_retry));
        }
        return Ok(Action::await_change());
    }
    let mut next = live.clone();
    // Paused by someone else: that pause stands, whatever the count.
    let paused = status::find(next.conditions_mut(), "Paused")
        .filter(|c| c.status == "True")
        .map(|c| c.reason.clone());
    if let Some(reason) = &paused
        && !rule_reason(&table, reason.as_deref())
    {
        return Ok(Action::await_change());
    }
    let started = std::time::Instant::now();
    let (decision, _) = decide_events(&table, &snapshot, &events, Expensive::Deferred, false);
    // A park, and the decision that ends one, are recorded (`--decision-log`) and the
    // park's condition cites its decision; the allow of every reconcile of an operation
    // never parked is not (its start and steps are, by the executor).
    let parking = decision.verdict() == Some(crate::vocab::Verdict::Hold);
    let mut journal = ctx
        .records
        .as_ref()
        .filter(|_| parking || paused.is_some())
        .map(|r| {
            crate::runtime::step_records::Journal::new(
                r.clone(),
                "TalosOperation",
                &live.metadata,
                "CREATE",
                ctx.rules.loaded_digests(),
            )
        });
    if let Some(j) = journal.as_mut() {
        j.link_remote(ctx.admission_lookup.as_deref()).await;
        for ev in &events {
            j.decision(&table, &snapshot, *ev, &[], &decision, started);
        }
    }
    let requeue = match held(&ctx, &decision, "Refused") {
        Some((reason, message)) => {
            let message = match journal.as_mut() {
                Some(j) => j.cite(&message, &decision),
                None => message,
            };
            status::set(next.conditions_mut(), "Paused", true, &reason, &message);
            next.status.get_or_insert_with(Default::default).phase = Some("Paused".into());
            Action::requeue(ctx.settings.parked_requeue)
        }
        None => {
            if paused.is_some() {
                status::set(
                    next.conditions_mut(),
                    "Paused",
                    false,
                    "Resumed",
                    "what held the operation is over (the control-plane count is odd again); it resumes",
                );
                next.status.get_or_insert_with(Default::default).phase = Some("Pending".into());
                tracing::info!(operation = %format!("{ns}/{name}"), "resumed");
            }
            match start_again(&ctx, &table, &snapshot, &mut next).await {
                Some(refused) => refused,
                // Issue 36: a snapshot asked of a backup, taken by the backup's controller.
                None if live.spec.kind == crate::runtime::exec::backup::SNAPSHOT_KIND => {
                    return super::backup::snapshot_operation(&ctx, &snapshot, live, &mut next)
                        .await;
                }
                // Issue 36: allowed, but the rules give its kind no plan (an etcd restore):
                // it stays Pending with their words on doing it by hand, decided again.
                None if let Some(how) =
                    super::backup::manual_procedure(&table, &snapshot, &next) =>
                {
                    super::backup::mark_manual(&ctx, &mut next, &how).await;
                    Action::requeue(ctx.settings.parked_requeue)
                }
                None => {
                    if let Some(v) = status::write(&ctx.client, live, &next).await? {
                        next.metadata.resource_version = Some(v);
                    }
                    return run(&ctx, &table, &next).await;
                }
            }
        }
    };
    status::write(&ctx.client, live, &next).await?;
    Ok(requeue)
}

/// Runs the operation's plan: one reconcile of the executor's procedure.
async fn run(
    ctx: &Context,
    table: &crate::compile::Table,
    o: &TalosOperation,
) -> Result<Action, ReconcileError> {
    let mut world = super::operation_world::OperationLive::new(ctx, o);
    world.link_admission().await;
    let timing = super::removal::timing(ctx);
    let (outcome, mut world) = match &ctx.steps {
        // Every step logged, for `verify --check-trace`.
        Some(log) => {
            let id = log.begin("operation", o, &timing);
            let mut traced = crate::runtime::exec::trace::Traced::new(world, log, id);
            let outcome =
                crate::runtime::exec::operation::reconcile(&mut traced, table, &timing, o).await;
            log.end(id, &outcome);
            (outcome, traced.inner)
        }
        None => {
            let mut world = world;
            let outcome =
                crate::runtime::exec::operation::reconcile(&mut world, table, &timing, o).await;
            (outcome, world)
        }
    };
    // A lock still held here (an error ended the reconcile) is kept: the operation resumes
    // it, or it expires after the lock duration.
    world.keep_lock();
    Ok(match outcome? {
        crate::runtime::exec::Outcome::Requeue { after, .. } => Action::requeue(after),
        crate::runtime::exec::Outcome::AwaitChange => Action::await_change(),
    })
}
