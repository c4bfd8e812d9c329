//! An operation on one machine (issue 35), as one procedure over an [`OperationWorld`]:
//! the controller runs it with real I/O; `verify`'s model is to run it with its world.
//!
//! Once the start rules let an operation through (and no `hold run operation` rule parks
//! it), the procedure takes the cluster lock and runs its kind's plan
//! (`plan run operation "<kind>"`) on `spec.machine`, step by step. Before every step it
//! reads the cluster again, under the lock, and decides the `step operation` rules
//! (asking etcd through a healthy sibling when a rule needs it): refused, the step waits
//! and the condition says why. Each finished step is recorded in `status.progress`, so a
//! restarted controller resumes at the step it stopped at. A destructive call (reboot,
//! shutdown, upgrade, rollback, reset) is sent once: the node's boot time and version,
//! recorded before it, tell a restarted controller whether it already happened. A gate
//! that does not pass within its `within` fails the operation (phase Failed, a
//! failureReason, a condition naming the node, the step and what was seen); the operation
//! never continues by itself (ADR 0137).

use super::etcd::{self, MemberHealth, node_name};
use super::rules::{Asked, decide_asking, hold_of};
use super::{
    Call, Drained, LockOp, Node, NodeError, Note, Outcome, Timing, Wait, World, calls, unlock,
};
use crate::compile::{PlanStep, Table};
use crate::interp::Finding;
use crate::runtime::controller::status::{self, Conditions};
use crate::runtime::decide::{operation_on, reconcile_operation_event, step_operation_event};
use crate::runtime::live::Reads;
use crate::runtime::objects::{OperationProgress, Role, Snapshot, TalosMachine, TalosOperation};
use crate::runtime::step_records::cite;
use crate::runtime::talos::TalosError;
use crate::vocab::{Action as BuiltIn, Fact, Verdict};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

/// The condition an operation reports its progress in.
pub const RUNNING: &str = "Running";

/// What an operation needs of the world beyond what a removal does: its own status, its
/// events, and the Kubernetes Node's cordon and readiness.
#[allow(async_fn_in_trait)]
pub trait OperationWorld: World {
    /// Writes `after`'s status when it differs from `before` (the object as read, or as
    /// this world last wrote it).
    async fn write_operation(
        &mut self,
        before: &TalosOperation,
        after: &TalosOperation,
    ) -> Result<(), Self::Error>;

    /// Publishes an Event on the operation.
    async fn operation_event(
        &mut self,
        on: &TalosOperation,
        warning: bool,
        reason: &str,
        note: String,
    );

    /// Publishes a Normal Event on the operation about one of its machines (`NodeStarted`,
    /// `NodeFinished`, `NodeSkipped`). The controller's world names the machine as the
    /// Event's related object, so the Events of different machines with the same reason
    /// are not folded into one series (which keeps only the first one's note).
    async fn node_event(&mut self, on: &TalosOperation, machine: &str, reason: &str, note: String) {
        let _ = machine;
        self.operation_event(on, false, reason, note).await;
    }

    /// Cordons (`on`) or uncordons the Kubernetes Node `node`: whether it was cordoned
    /// before (`None`: there is no such Node).
    async fn cordon(
        &mut self,
        node: &str,
        on: bool,
    ) -> Result<Result<Option<bool>, String>, Self::Error>;

    /// Whether the Kubernetes Node `node` is Ready (`None`: there is no such Node).
    async fn node_ready(&mut self, node: &str)
    -> Result<Result<Option<bool>, String>, Self::Error>;

    /// A step finished after `took` (metrics; a model has none).
    fn step_took(&mut self, action: BuiltIn, took: Duration) {
        let _ = (action, took);
    }

    /// The operation ended, `succeeded` or not (metrics; a model has none).
    fn ended(&mut self, op: &TalosOperation, succeeded: bool) {
        let _ = (op, succeeded);
    }
}

/// The annotation a person sets on a failed operation to resume it; each new value resumes
/// it once (e.g. the time: `kubectl annotate talosoperation X ichor.maesh.dev/resume="$(date -u +%FT%TZ)" --overwrite`).
pub const RESUME_ANNOTATION: &str = "ichor.maesh.dev/resume";

/// The resume a person asked for on a failed operation: the annotation's value, when it is
/// not the one it was last resumed by.
pub fn resume_asked(op: &TalosOperation) -> Option<String> {
    if !op.failed() {
        return None;
    }
    let value = op
        .metadata
        .annotations
        .as_ref()?
        .get(RESUME_ANNOTATION)?
        .trim()
        .to_string();
    let last = op
        .status
        .as_ref()
        .and_then(|s| s.progress.as_ref())
        .and_then(|p| p.resumed.clone());
    (!value.is_empty() && Some(&value) != last.as_ref()).then_some(value)
}

/// Resumes a failed operation (ADR 0137: never by itself, only by a person's explicit
/// action): phase Running, the failure cleared, the failed step started again with a fresh
/// timeout. Nothing is skipped: the rules decide every step again, the failed gate first.
pub fn resume(next: &mut TalosOperation, asked: &str) {
    let mut p = progress(next);
    p.resumed = Some(asked.to_string());
    p.step_started_at = None;
    // A call whose outcome could not be told (`InstallUnknown`, `SentUnknown`): the person
    // who resumes asks for it to be sent again. A resume of any other failure keeps the
    // records, so a call that took is not sent again.
    if let Some(reason) = next
        .condition(RUNNING)
        .filter(|c| c.status == "False")
        .and_then(|c| c.reason.as_deref())
        && let Some((_, forget)) = UNKNOWN_OUTCOMES.iter().find(|(r, _)| *r == reason)
    {
        forget(&mut p);
    }
    let s = next.status.get_or_insert_with(Default::default);
    s.phase = Some("Running".into());
    // Written empty (a merge patch would keep an absent field): not a failure any more.
    s.failure_reason = Some(String::new());
    set_progress(next, &p);
    let msg = format!(
        "resumed by the annotation {RESUME_ANNOTATION}={asked}: the failed step runs again, and \
         the rules decide every step again"
    );
    status::set(next.conditions_mut(), RUNNING, false, "Resumed", &msg);
}

/// The failure of a destructive call sent and not known to have taken (the node still
/// answers with its old boot time past the deadline); a resume sends it again.
pub const SENT_UNKNOWN: &str = "SentUnknown";

/// The failure of a Talos 1.13 install sent whose end was not seen; a resume sends it
/// again.
pub const INSTALL_UNKNOWN: &str = "InstallUnknown";

/// Forgets the record of a call sent, so that it is sent again.
type Forget = fn(&mut OperationProgress);

/// The failures of a call sent whose outcome cannot be read back, each with the record a
/// person's resume forgets so that the call is sent again ([`resume`]).
const UNKNOWN_OUTCOMES: [(&str, Forget); 2] = [
    (INSTALL_UNKNOWN, |p| p.installing = None),
    (SENT_UNKNOWN, |p| p.sent = None),
];

/// The failure `reason` (one of [`UNKNOWN_OUTCOMES`]): `what` happened and whether the call
/// took cannot be told, so it is not sent again by itself; once the person has done
/// `first`, their resume of `op` sends it again.
fn outcome_unknown(reason: &'static str, what: String, first: &str, op: &TalosOperation) -> Step {
    Step::Fail {
        reason,
        message: format!(
            "{what}: whether it took cannot be told, so it is not sent again by itself. Once \
             {first}, resume the operation (`kubectl annotate talosoperation {} \
             {RESUME_ANNOTATION}=\"$(date -u +%FT%TZ)\" --overwrite`) to send it again",
            op.name()
        ),
    }
}

/// Whether plan step `step` sends the operation's destructive call once (a reboot, a
/// shutdown, an upgrade, a rollback, a reset): the one `progress.sent` names.
pub fn sends_once(step: &PlanStep) -> bool {
    matches!(
        step.action,
        BuiltIn::TalosReboot
            | BuiltIn::TalosShutdown
            | BuiltIn::TalosUpgrade
            | BuiltIn::TalosRollback
            | BuiltIn::TalosReset
    )
}

/// The holder of the cluster lock for an operation.
pub fn holder(namespace: &str, name: &str) -> String {
    format!("{HOLDER_PREFIX}{namespace}/{name}")
}

const HOLDER_PREFIX: &str = "TalosOperation ";

/// The operation (`namespace`, `name`) a lock holder's name is ([`holder`]'s inverse);
/// `None` for any other holder.
pub fn holder_operation(holder: &str) -> Option<(&str, &str)> {
    holder.strip_prefix(HOLDER_PREFIX)?.split_once('/')
}

/// Which upgrade path a node takes, from its Talos version tag: `LifecycleService/Upgrade`
/// from 1.13 on (as `talosctl upgrade` does: above `1.13.0-alpha.2`), the legacy
/// `MachineService/Upgrade` before. A tag that cannot be read takes the legacy path, which
/// every Talos before 1.18 serves.
pub fn lifecycle_path(tag: &str) -> bool {
    let t = tag.trim().trim_start_matches('v');
    let (core, pre) = match t.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (t, None),
    };
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) else {
        return false;
    };
    let patch = parts.next().flatten().unwrap_or(0);
    match (major, minor) {
        (1, m) if m > 13 => true,
        (1, 13) => {
            patch > 0
                || match pre {
                    None => true,
                    Some(p) => !matches!(p, "alpha.0" | "alpha.1" | "alpha.2"),
                }
        }
        (m, _) => m >= 2,
    }
}

/// The tag of an image reference (`ghcr.io/siderolabs/installer:v1.12.1` -> `v1.12.1`;
/// a digest is left out).
pub fn image_tag(image: &str) -> Option<&str> {
    let image = image.split('@').next().unwrap_or(image);
    let (_, tag) = image.rsplit_once(':')?;
    (!tag.is_empty() && !tag.contains('/')).then_some(tag)
}

/// How one step ended.
enum Step {
    Done,
    /// Not yet: say why in the condition, look again after `after`.
    Wait {
        reason: &'static str,
        message: String,
        after: Duration,
    },
    /// A gate failed (its timeout passed, or what it read can never pass): the operation
    /// fails and touches nothing more.
    Fail {
        reason: &'static str,
        message: String,
    },
}

fn requeue(after: Duration, wait: Wait) -> Outcome {
    Outcome::Requeue { after, wait }
}

fn progress(o: &TalosOperation) -> OperationProgress {
    o.status
        .as_ref()
        .and_then(|s| s.progress.clone())
        .unwrap_or_default()
}

fn set_progress(o: &mut TalosOperation, p: &OperationProgress) {
    o.status.get_or_insert_with(Default::default).progress = Some(p.clone());
}

fn set_phase(o: &mut TalosOperation, phase: &str) {
    o.status.get_or_insert_with(Default::default).phase = Some(phase.into());
}

fn key(k: usize, step: &PlanStep) -> String {
    format!("{}. {}", k + 1, step.text)
}

/// One reconcile of an operation the rules let run (not parked, its start allowed), as
/// read by the watch.
pub async fn reconcile<W: OperationWorld>(
    w: &mut W,
    table: &Table,
    timing: &Timing,
    op: &TalosOperation,
) -> Result<Outcome, W::Error> {
    if op.finished() || op.failed() {
        return Ok(Outcome::AwaitChange);
    }
    let (ns, name, cluster) = (op.namespace(), op.name(), op.cluster());
    let mut next = op.clone();
    let Some(plan) = table.operation_plan(&op.spec.kind) else {
        let msg = format!(
            "the rules have no `plan run operation \"{}\"`; nothing runs until they do",
            op.spec.kind
        );
        status::set_at(
            w.now(),
            next.conditions_mut(),
            RUNNING,
            false,
            "NoPlan",
            &msg,
        );
        w.write_operation(op, &next).await?;
        return Ok(requeue(timing.refused_requeue, Wait::On("NoPlan".into())));
    };
    if let Err(why) = w.credentials(cluster).await {
        let msg = format!("{why}; the operation does not run without them");
        status::set_at(
            w.now(),
            next.conditions_mut(),
            RUNNING,
            false,
            "NoTalosCredentials",
            &msg,
        );
        w.write_operation(op, &next).await?;
        return Ok(requeue(
            timing.refused_requeue,
            Wait::On("NoTalosCredentials".into()),
        ));
    }
    // 1. The cluster lock (the operation resumes its own).
    if let Err(holder) = w.lock(cluster, LockOp::Take).await? {
        let msg = format!("waiting for the cluster lock, held by {holder}");
        status::set_at(
            w.now(),
            next.conditions_mut(),
            RUNNING,
            false,
            "ClusterLockHeld",
            &msg,
        );
        w.write_operation(op, &next).await?;
        return Ok(requeue(
            timing.lock_retry,
            Wait::On("ClusterLockHeld".into()),
        ));
    }
    let mut p = progress(op);
    let reads = Reads {
        machines: true,
        clusters: true,
        operations: true,
        backups: false,
    };
    if p.started_at.is_none() || p.order.is_empty() {
        let snapshot = w.read(cluster, reads).await?;
        p.started_at = Some(Time(w.now()));
        p.order = order(op, &snapshot);
        p.total = u32::try_from(p.order.len()).unwrap_or(u32::MAX);
        p.done = 0;
        p.node = p.order.first().cloned();
        p.alongside = Vec::new();
    }
    if p.node.is_none() {
        // A record without its node (none is written so): the next in flight, or of the order.
        next_in_flight(&mut p);
    }
    let rolling = op.spec.machine.as_deref().is_none_or(str::is_empty);
    // A roll's nodes in flight that waited in this reconcile, and the first wait (what the
    // reconcile ends with once every node in flight waits and no other may start).
    let mut waited = 0usize;
    let mut first_wait: Option<(Duration, Wait, bool)> = None;
    // Each step: read again under the lock, decide again, then act.
    loop {
        let Some(target) = p.node.clone() else {
            let snapshot = w.read(cluster, reads).await?;
            let Some(live) = snapshot.operation(ns, name) else {
                unlock(w, cluster, LockOp::Release).await?;
                return Ok(Outcome::AwaitChange);
            };
            let before = live.clone();
            let mut next = live.clone();
            return succeed(w, &before, &mut next, &mut p).await;
        };
        let snapshot = w.read(cluster, reads).await?;
        let Some(live) = snapshot.operation(ns, name) else {
            unlock(w, cluster, LockOp::Release).await?;
            return Ok(Outcome::AwaitChange);
        };
        if live.finished() || live.failed() {
            unlock(w, cluster, LockOp::Release).await?;
            return Ok(Outcome::AwaitChange);
        }
        // The status being built on what was read (the world writes only differences).
        let before = live.clone();
        let mut next = live.clone();
        set_phase(&mut next, "Running");
        // A roll over the cluster passes a machine that is gone, or being deleted before
        // any step touched it (its removal waits for this operation's lock): the roll goes
        // on without it. A named machine that is gone fails the operation below.
        let gone = snapshot
            .machine(ns, &target)
            .filter(|m| m.cluster() == cluster)
            .is_none_or(|m| m.deleting() && p.steps_done.is_empty());
        if rolling && gone {
            let msg = format!(
                "{target}: the machine is gone or being deleted; the roll goes on without it"
            );
            w.node_event(live, &target, "NodeSkipped", msg).await;
            next_node(&mut p);
            set_progress(&mut next, &p);
            w.write_operation(&before, &next).await?;
            continue;
        }
        let Some(m) = snapshot
            .machine(ns, &target)
            .filter(|m| m.cluster() == cluster)
        else {
            let msg = format!(
                "{target} is not a TalosMachine of TalosCluster {cluster}: the operation \
                 does not run; point spec.machine at one of this cluster's machines"
            );
            return fail(w, &before, &mut next, &mut p, "TargetNotFound", msg).await;
        };
        let Some((k, step)) = plan
            .steps
            .iter()
            .enumerate()
            .find(|(k, s)| !p.steps_done.contains(&key(*k, s)))
        else {
            // This node is done: the next one, from a clean record.
            let msg = format!("{target}: every step of the plan ran");
            w.node_event(live, &target, "NodeFinished", msg).await;
            next_node(&mut p);
            set_progress(&mut next, &p);
            w.write_operation(&before, &next).await?;
            continue;
        };
        // The rules see the node being worked on as the operation's target (`target`,
        // `target.controlplane`, ...): for a roll over the cluster, each node in turn; and
        // its progress as this reconcile has it (`roll.in_flight`: what it wrote last, which
        // a read from a cache may not show yet).
        let mut seen = live.clone();
        set_progress(&mut seen, &p);
        let view = operation_on(&seen, &target);
        let live = &view;
        // 2. The step rules, decided again under the lock from live reads.
        let Some(ev) = step_operation_event(live) else {
            unlock(w, cluster, LockOp::Release).await?;
            return Ok(Outcome::AwaitChange);
        };
        let unreadable = |f: Fact, why: &str| Finding {
            rule: "(live state)".into(),
            verdict: Verdict::Refuse,
            message: if why.is_empty() {
                format!("the fact `{f}` could not be read, so the step waits")
            } else {
                format!("the etcd members cannot be counted (`{f}`), so the step waits: {why}")
            },
            reason: None,
        };
        let Asked { decision, .. } =
            decide_asking(w, table, &snapshot, ev, Some(m), false, &unreadable).await?;
        w.note(m, Note::Decided(&decision));
        if let Some((_, message)) = hold_of(&decision, "StepRefused") {
            let message = cite(w, &format!("{}: {message}", step.text), &decision);
            let began = status::set_at(
                w.now(),
                next.conditions_mut(),
                RUNNING,
                false,
                "StepRefused",
                &message,
            );
            set_progress(&mut next, &p);
            w.write_operation(&before, &next).await?;
            if began {
                w.operation_event(live, true, "StepRefused", message).await;
            }
            // Nothing done to the node yet (only the lock taken, gates read): the lock goes
            // to other work meanwhile.
            let touched = p.cordoned
                || p.sent.is_some()
                || p.installing.is_some()
                || p.installed.is_some()
                || p.steps_done
                    .iter()
                    .any(|d| !d.ends_with(". lock cluster") && !d.ends_with(". etcd healthy"));
            let keep = touched || !p.alongside.is_empty();
            if rolling {
                first_wait.get_or_insert((timing.refused_requeue, Wait::Refused, keep));
                waited += 1;
                if other_node(w, table, &snapshot, &next, &mut p, waited).await? == Some(true) {
                    set_progress(&mut next, &p);
                    w.write_operation(&before, &next).await?;
                    continue;
                }
            }
            let (after, wait, keep) =
                first_wait.unwrap_or((timing.refused_requeue, Wait::Refused, keep));
            unlock(
                w,
                cluster,
                if keep { LockOp::Keep } else { LockOp::Release },
            )
            .await?;
            return Ok(requeue(after, wait));
        }
        // 3. The step's own guard.
        let Some(run_ev) = reconcile_operation_event(live) else {
            unlock(w, cluster, LockOp::Release).await?;
            return Ok(Outcome::AwaitChange);
        };
        let (runs, message) = match w.applies(table, &snapshot, run_ev, &[], k, step) {
            Ok(x) => x,
            Err(why) => {
                status::set_at(
                    w.now(),
                    next.conditions_mut(),
                    RUNNING,
                    false,
                    "StepRefused",
                    &why,
                );
                w.write_operation(&before, &next).await?;
                unlock(w, cluster, LockOp::Keep).await?;
                return Ok(requeue(timing.refused_requeue, Wait::Refused));
            }
        };
        if !runs {
            p.steps_done.push(key(k, step));
            p.step = None;
            p.step_started_at = None;
            set_progress(&mut next, &p);
            w.write_operation(&before, &next).await?;
            continue;
        }
        let this = key(k, step);
        if p.step.as_deref() != Some(this.as_str()) || p.step_started_at.is_none() {
            p.step = Some(this);
            p.step_started_at = Some(Time(w.now()));
            let msg = format!("{target}: {}", step.text);
            status::set_at(
                w.now(),
                next.conditions_mut(),
                RUNNING,
                true,
                "StepRunning",
                &msg,
            );
            set_progress(&mut next, &p);
            w.write_operation(&before, &next).await?;
            if k == 0 {
                w.node_event(live, &target, "NodeStarted", format!("{target}: started"))
                    .await;
            }
        }
        w.note(m, Note::Step(k, &step.text));
        super::step_began(w, table, k, &step.text, message.as_deref());
        let mut rec = Record {
            before: &before,
            next: &mut next,
            p: &mut p,
        };
        let outcome = execute(w, timing, &snapshot, m, &mut rec, step, message).await?;
        match &outcome {
            Step::Done => super::step_ended(w, "done", None, None),
            Step::Wait {
                reason, message, ..
            } => super::step_ended(w, "wait", Some(reason), Some(message)),
            Step::Fail { reason, message } => {
                super::step_ended(w, "fail", Some(reason), Some(message))
            }
        }
        match outcome {
            Step::Done => {
                if let Some(since) = &p.step_started_at {
                    let secs = w.now().duration_since(since.0).as_secs();
                    let took = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
                    w.step_took(step.action, took);
                }
                p.steps_done.push(key(k, step));
                p.step = None;
                p.step_started_at = None;
                set_progress(&mut next, &p);
                w.write_operation(&before, &next).await?;
            }
            Step::Wait {
                reason,
                message,
                after,
            } => {
                let message = format!("{target}: {}: {message}", step.text);
                status::set_at(
                    w.now(),
                    next.conditions_mut(),
                    RUNNING,
                    false,
                    reason,
                    &message,
                );
                set_progress(&mut next, &p);
                w.write_operation(&before, &next).await?;
                if rolling {
                    first_wait.get_or_insert((after, Wait::On(reason.into()), true));
                    waited += 1;
                    if other_node(w, table, &snapshot, &next, &mut p, waited).await? == Some(true) {
                        set_progress(&mut next, &p);
                        w.write_operation(&before, &next).await?;
                        continue;
                    }
                }
                let (after, wait, _) = first_wait.unwrap_or((after, Wait::On(reason.into()), true));
                unlock(w, cluster, LockOp::Keep).await?;
                return Ok(requeue(after, wait));
            }
            Step::Fail { reason, message } => {
                let message = format!("{target}: {}: {message}", step.text);
                return fail(w, &before, &mut next, &mut p, reason, message).await;
            }
        }
    }
}

async fn succeed<W: OperationWorld>(
    w: &mut W,
    before: &TalosOperation,
    next: &mut TalosOperation,
    p: &mut OperationProgress,
) -> Result<Outcome, W::Error> {
    p.done = p.total;
    p.node = None;
    p.step = None;
    p.step_started_at = None;
    set_progress(next, p);
    set_phase(next, "Succeeded");
    let msg = format!(
        "every step of the plan ran on {} of {} machine(s): {}",
        p.done,
        p.total,
        p.order.join(", ")
    );
    status::set_at(
        w.now(),
        next.conditions_mut(),
        RUNNING,
        false,
        "Succeeded",
        &msg,
    );
    w.write_operation(before, next).await?;
    w.operation_event(before, false, "Succeeded", msg).await;
    w.ended(before, true);
    unlock(w, before.cluster(), LockOp::Release).await?;
    Ok(Outcome::AwaitChange)
}

/// The node being worked on is done: on to the first other node in flight, or else the
/// next of the order, from a clean record of steps.
fn next_node(p: &mut OperationProgress) {
    *p = OperationProgress {
        done: p.done + 1,
        order: std::mem::take(&mut p.order),
        total: p.total,
        started_at: p.started_at.take(),
        resumed: p.resumed.take(),
        alongside: std::mem::take(&mut p.alongside),
        ..OperationProgress::default()
    };
    next_in_flight(p);
}

/// With no node being worked on: the first of those in flight beside it, or else the next
/// of the order (none: every node is done).
fn next_in_flight(p: &mut OperationProgress) {
    if p.alongside.is_empty() {
        p.node = p.order.get(p.started()).cloned();
    } else {
        let r = p.alongside.remove(0);
        p.put_node(r);
    }
}

/// A roll's node waits (the `waited`-th in this reconcile): work on another meanwhile.
/// `Some(true)`: `p` now works on another node, the next in flight beside it that has not
/// waited in this reconcile, or else the next of the order, started beside those in flight
/// because the `step operation` rules let its first step run now (decided with the nodes
/// in flight, as `roll.in_flight` counts them; how many may go at once is theirs to say).
/// `Some(false)` or `None`: none, the reconcile ends with the first wait.
async fn other_node<W: OperationWorld>(
    w: &mut W,
    table: &Table,
    snapshot: &Snapshot,
    next: &TalosOperation,
    p: &mut OperationProgress,
    waited: usize,
) -> Result<Option<bool>, W::Error> {
    if waited < 1 + p.alongside.len() {
        // The node that waited goes last; the first beside it is worked on.
        if let Some(r) = p.take_node() {
            p.alongside.push(r);
        }
        let r = p.alongside.remove(0);
        p.put_node(r);
        return Ok(Some(true));
    }
    let Some(cand) = p.order.get(p.started()).cloned() else {
        return Ok(None);
    };
    let (ns, cluster) = (next.namespace(), next.cluster());
    let Some(m) = snapshot
        .machine(ns, &cand)
        .filter(|m| m.cluster() == cluster && !m.deleting())
    else {
        // Gone or going: not started beside the others (the roll passes it in its turn).
        return Ok(Some(false));
    };
    let mut seen = next.clone();
    set_progress(&mut seen, p);
    let view = operation_on(&seen, &cand);
    let Some(ev) = step_operation_event(&view) else {
        return Ok(None);
    };
    let unreadable = |f: Fact, _: &str| Finding {
        rule: "(live state)".into(),
        verdict: Verdict::Refuse,
        message: format!("the fact `{f}` could not be read, so {cand} does not start yet"),
        reason: None,
    };
    let Asked { decision, .. } =
        decide_asking(w, table, snapshot, ev, Some(m), false, &unreadable).await?;
    if hold_of(&decision, "StepRefused").is_some() {
        return Ok(Some(false));
    }
    if let Some(r) = p.take_node() {
        p.alongside.push(r);
    }
    p.node = Some(cand);
    Ok(Some(true))
}

/// The machines an operation acts on, in order: `spec.machine`; without it, every approved
/// control plane of the cluster not being deleted, then every approved worker, each by
/// name (one at a time: control planes first, as a roll over a cluster goes), narrowed to
/// `spec.machines` when it names any.
fn order(op: &TalosOperation, snapshot: &Snapshot) -> Vec<String> {
    if let Some(m) = op.spec.machine.as_deref().filter(|m| !m.is_empty()) {
        return vec![m.to_string()];
    }
    let of = |role: Role| {
        let mut names: Vec<String> = snapshot
            .machines
            .iter()
            .filter(|m| {
                m.namespace() == op.namespace()
                    && m.cluster() == op.cluster()
                    && !m.deleting()
                    && m.approved_role() == Some(role)
            })
            .map(|m| m.name().to_string())
            .collect();
        names.sort();
        names
    };
    let mut out = of(Role::ControlPlane);
    out.extend(of(Role::Worker));
    if !op.spec.machines.is_empty() {
        out.retain(|m| op.spec.machines.contains(m));
    }
    out
}

/// Fails the operation: phase Failed, the failureReason and the condition say what was
/// seen; a Warning event; the lock goes (nothing more is done to any node).
async fn fail<W: OperationWorld>(
    w: &mut W,
    before: &TalosOperation,
    next: &mut TalosOperation,
    p: &mut OperationProgress,
    reason: &'static str,
    message: String,
) -> Result<Outcome, W::Error> {
    set_progress(next, p);
    set_phase(next, "Failed");
    next.status
        .get_or_insert_with(Default::default)
        .failure_reason = Some(message.clone());
    status::set_at(
        w.now(),
        next.conditions_mut(),
        RUNNING,
        false,
        reason,
        &message,
    );
    w.write_operation(before, next).await?;
    w.operation_event(before, true, reason, message).await;
    w.ended(before, false);
    unlock(w, before.cluster(), LockOp::Release).await?;
    Ok(Outcome::AwaitChange)
}

/// The operation as read, the status being built on it, and its progress.
struct Record<'a> {
    before: &'a TalosOperation,
    next: &'a mut TalosOperation,
    p: &'a mut OperationProgress,
}

/// How long the step has been running, against its `within`.
fn overdue(w: &impl World, p: &OperationProgress, step: &PlanStep) -> Option<Duration> {
    let within = step.within?;
    let since = p.step_started_at.as_ref()?;
    let secs = w.now().duration_since(since.0).as_secs();
    let elapsed = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    (elapsed >= within).then_some(within)
}

/// A gate that has not passed: wait, or fail once its `within` is over.
fn gate(
    w: &impl World,
    timing: &Timing,
    p: &OperationProgress,
    step: &PlanStep,
    reason: &'static str,
    seen: String,
) -> Step {
    match (step.within, overdue(w, p, step)) {
        (None, _) => Step::Fail {
            reason,
            message: format!("did not pass: {seen}"),
        },
        (Some(_), Some(within)) => Step::Fail {
            reason,
            message: format!("did not pass within {}s: {seen}", within.as_secs()),
        },
        (Some(_), None) => Step::Wait {
            reason,
            message: seen,
            after: timing.drain_retry.min(Duration::from_secs(2)),
        },
    }
}

fn talos_wait(timing: &Timing, e: NodeError) -> Step {
    let reason = match e {
        NodeError::Talos(TalosError::Unreachable { .. }) => "NodeUnreachable",
        NodeError::NoCredentials(_) => "NoTalosCredentials",
        _ => "TalosFailed",
    };
    Step::Wait {
        reason,
        message: e.to_string(),
        after: timing.drain_retry,
    }
}

/// Every voting member of etcd answers as itself with a leader and no errors, and none is
/// a learner: asked through a healthy sibling of `m` (or `m` itself, the only control
/// plane) at the address etcd lists for each member.
async fn etcd_healthy<W: World>(
    w: &mut W,
    snapshot: &Snapshot,
    m: &TalosMachine,
) -> Result<Result<(), String>, W::Error> {
    let sibling = match etcd::healthy_sibling(w, snapshot, m).await? {
        Ok(s) => s,
        Err(why) => {
            // The only control plane: read etcd through it.
            match calls::members(w, m.cluster(), Node::Endpoint(m)).await? {
                Ok(members) if m.approved_role() == Some(Role::ControlPlane) => etcd::Sibling {
                    machine: m,
                    members,
                },
                Ok(_) => {
                    return Ok(Err(format!(
                        "no control plane to read etcd through ({why})"
                    )));
                }
                Err(e) => return Ok(Err(format!("etcd cannot be read: {why}; {e}"))),
            }
        }
    };
    let mut bad = Vec::new();
    let mut leaders: Vec<(String, u64)> = Vec::new();
    for member in &sibling.members {
        if member.is_learner {
            bad.push(format!("member {} is a learner", member.hostname));
            continue;
        }
        match etcd::ask_member_leader(w, m.cluster(), &sibling, member).await? {
            (MemberHealth::Healthy, leader) => {
                if let Some(l) = leader {
                    leaders.push((member.hostname.clone(), l));
                }
            }
            (
                MemberHealth::Impaired(why)
                | MemberHealth::Dead(why)
                | MemberHealth::CannotTell(why),
                _,
            ) => bad.push(why),
        }
    }
    if let Err(why) = etcd::one_leader(&leaders) {
        bad.push(why);
    }
    Ok(if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "etcd (through {}) is not healthy: {}",
            sibling.machine.name(),
            bad.join("; ")
        ))
    })
}

/// The destructive call of a step, once: recorded before it is sent, with the node's boot
/// time and version, so a restarted controller that finds the boot time changed knows it
/// took (and one that finds the node down knows it may have).
async fn send_once<W: OperationWorld>(
    w: &mut W,
    timing: &Timing,
    m: &TalosMachine,
    rec: &mut Record<'_>,
    step: &PlanStep,
) -> Result<Step, W::Error> {
    let op = rec.before;
    let p = &mut *rec.p;
    let cluster = m.cluster();
    let here = Node::Endpoint(m);
    if p.sent.as_deref() == Some(step.text.as_str()) {
        // Sent before (this reconcile or an earlier one, its answer lost or its record of
        // being done): it took once the node is down or back with a new boot time. A node
        // that still answers with the old boot time may not have got it, or may still be
        // on its way down (a legacy upgrade installs before it reboots): which, cannot be
        // told, so the call is never sent again by itself. Past `sent_deadline` the
        // operation fails saying so, and a person's resume sends it again.
        return Ok(match calls::boot_time(w, cluster, here).await? {
            Err(NodeError::Talos(TalosError::Unreachable { .. })) => Step::Done,
            Ok(t) if Some(t) != p.boot_time => Step::Done,
            Ok(_) if !past(w, p, timing.sent_deadline) => Step::Wait {
                reason: "Sent",
                message: format!(
                    "`{}` was sent; waiting for the node to go down (it still answers with the \
                     boot time it had before; after {}s without going down the operation fails \
                     and it is not sent again by itself)",
                    step.text,
                    timing.sent_deadline.as_secs()
                ),
                after: Duration::from_millis(500),
            },
            Ok(_) => outcome_unknown(
                SENT_UNKNOWN,
                format!(
                    "`{}` was sent to the node and, {}s later, it still answers with the boot \
                     time it had before (its answer was lost, or the controller stopped right \
                     after it; a node may also be slow to go down)",
                    step.text,
                    timing.sent_deadline.as_secs()
                ),
                "you have looked at the node (`talosctl dmesg`, `talosctl version`)",
                op,
            ),
            Err(e) => talos_wait(timing, e),
        });
    }
    // Before: the boot time and version to compare with afterwards.
    let boot = match calls::boot_time(w, cluster, here).await? {
        Ok(t) => t,
        Err(e) => return Ok(talos_wait(timing, e)),
    };
    let version = match calls::version(w, cluster, here).await? {
        Ok(v) => v,
        Err(e) => return Ok(talos_wait(timing, e)),
    };
    // Whether a Kubernetes Node must come back Ready afterwards.
    let node = node_name(m).to_string();
    match w.node_ready(&node).await? {
        Ok(seen) => p.node_registered |= seen.is_some(),
        Err(e) => {
            return Ok(Step::Wait {
                reason: "NodeUnreadable",
                message: format!("the Kubernetes Node {node} cannot be read ({e})"),
                after: timing.drain_retry,
            });
        }
    }
    p.boot_time = Some(boot);
    p.version = Some(version.clone());
    let call = match step.action {
        BuiltIn::TalosReboot => Call::Reboot,
        BuiltIn::TalosShutdown => Call::Shutdown { force: false },
        BuiltIn::TalosRollback => Call::Rollback,
        BuiltIn::TalosReset => Call::Reset { graceful: true },
        BuiltIn::TalosUpgrade => {
            let image = match upgrade_image(op) {
                Ok(i) => i.to_string(),
                Err(fail) => return Ok(fail),
            };
            if lifecycle_path(&version) {
                // Talos >= 1.13: installed (pulled, its exit code read) by the plan's `talos
                // install` before the node was cordoned; a plan without that step installs
                // here, with the same records. Then the controller reboots the node.
                if p.installed.as_deref() != Some(image.as_str()) {
                    let mut again = Record {
                        before: rec.before,
                        next: &mut *rec.next,
                        p: &mut *p,
                    };
                    match install(w, timing, m, &mut again, &image).await? {
                        Step::Done => {}
                        other => return Ok(other),
                    }
                }
                Call::Reboot
            } else {
                Call::UpgradeLegacy { image }
            }
        }
        _ => return Ok(Step::Done),
    };
    // Recorded before it is sent: a call that lands but whose answer is lost is told by
    // the boot time when the operation resumes.
    p.sent = Some(step.text.clone());
    p.step_started_at = Some(Time(w.now()));
    set_progress(rec.next, p);
    w.write_operation(rec.before, rec.next).await?;
    match calls::done(w, cluster, here, call).await? {
        Ok(()) => Ok(Step::Done),
        // No answer: it may have taken; the record stays, and the next look tells.
        Err(e @ NodeError::Talos(TalosError::Unreachable { .. })) => Ok(talos_wait(timing, e)),
        Err(e) => {
            p.sent = None;
            Ok(talos_wait(timing, e))
        }
    }
}

/// The installer image of an upgrade, with a tag (the version the node must come back
/// with): otherwise the operation fails, saying what to do.
fn upgrade_image(op: &TalosOperation) -> Result<&str, Step> {
    let Some(image) = op.spec.image.as_deref().filter(|i| !i.is_empty()) else {
        return Err(Step::Fail {
            reason: "NoImage",
            message: "an upgrade needs spec.image, the Talos installer image to go to; create \
                      the operation again with it"
                .into(),
        });
    };
    if image_tag(image).is_none() {
        return Err(Step::Fail {
            reason: "NoImage",
            message: format!(
                "spec.image {image} names no tag, so the version the node must come back with is \
                 unknown; name the image with its tag (…/installer:v1.x.y)"
            ),
        });
    }
    Ok(image)
}

/// The `talos install` step: on a node of Talos 1.13 or later, spec.image pulled and
/// installed without a reboot ([`install`]), before the node is cordoned or drained; on an
/// older Talos nothing (the legacy `MachineService/Upgrade` installs when `talos upgrade`
/// sends it).
async fn install_once<W: OperationWorld>(
    w: &mut W,
    timing: &Timing,
    m: &TalosMachine,
    rec: &mut Record<'_>,
) -> Result<Step, W::Error> {
    let image = match upgrade_image(rec.before) {
        Ok(i) => i.to_string(),
        Err(fail) => return Ok(fail),
    };
    if rec.p.installed.as_deref() == Some(image.as_str()) {
        return Ok(Step::Done);
    }
    if rec.p.installing.is_none() {
        let version = match calls::version(w, m.cluster(), Node::Endpoint(m)).await? {
            Ok(v) => v,
            Err(e) => return Ok(talos_wait(timing, e)),
        };
        if !lifecycle_path(&version) {
            return Ok(Step::Done);
        }
    }
    install(w, timing, m, rec, &image).await
}

/// Talos 1.13 and later: `ImageService/Pull` of `image`, then `LifecycleService/Upgrade`
/// of the pulled name, its stream's `exit_code` read; it neither drains nor reboots.
/// Recorded before it is sent (`progress.installing`) and after it ended
/// (`progress.installed`), so it is sent once: an install whose end was not seen (the
/// controller stopped while it ran, or its stream broke) is not sent again by itself,
/// since whether it installed cannot be read back; the operation fails saying so, with the
/// node not yet cordoned, and a person's resume sends it again.
async fn install<W: OperationWorld>(
    w: &mut W,
    timing: &Timing,
    m: &TalosMachine,
    rec: &mut Record<'_>,
    image: &str,
) -> Result<Step, W::Error> {
    let (cluster, here) = (m.cluster(), Node::Endpoint(m));
    if rec.p.installed.as_deref() == Some(image) {
        return Ok(Step::Done);
    }
    if let Some(sent) = rec.p.installing.as_deref() {
        return Ok(outcome_unknown(
            INSTALL_UNKNOWN,
            format!(
                "LifecycleService/Upgrade of {sent} was sent to the node and its end was not seen \
                 (the controller stopped, or the stream broke, while it ran)"
            ),
            "the node's install is over",
            rec.before,
        ));
    }
    let pulled = match calls::pull(w, cluster, here, image).await? {
        Ok(n) => n,
        Err(e) => return Ok(talos_wait(timing, e)),
    };
    rec.p.installing = Some(image.to_string());
    set_progress(rec.next, rec.p);
    w.write_operation(rec.before, rec.next).await?;
    let answer = calls::install(w, cluster, here, &pulled).await?;
    // What the stream said: the install is over, one way or the other, unless no answer
    // came (it may still run, or have installed: the record stays).
    if !matches!(
        answer,
        Err(NodeError::Talos(TalosError::Unreachable { .. }))
    ) {
        rec.p.installing = None;
    }
    Ok(match answer {
        Ok((0, _)) => {
            rec.p.installed = Some(image.to_string());
            Step::Done
        }
        Ok((code, last)) => Step::Fail {
            reason: "UpgradeFailed",
            message: format!(
                "LifecycleService/Upgrade of {image} ended with exit code {code} ({last}); the \
                 node was not rebooted"
            ),
        },
        Err(e) => talos_wait(timing, e),
    })
}

fn past(w: &impl World, p: &OperationProgress, bound: Duration) -> bool {
    p.step_started_at.as_ref().is_some_and(|t| {
        let secs = w.now().duration_since(t.0).as_secs();
        u64::try_from(secs).unwrap_or(0) >= bound.as_secs().max(1)
    })
}

/// Runs one step. Every step looks before it acts, so running it twice is safe.
#[allow(clippy::too_many_arguments)]
async fn execute<W: OperationWorld>(
    w: &mut W,
    timing: &Timing,
    snapshot: &Snapshot,
    m: &TalosMachine,
    rec: &mut Record<'_>,
    step: &PlanStep,
    message: Option<String>,
) -> Result<Step, W::Error> {
    let op = rec.before;
    let node = node_name(m).to_string();
    let cluster = m.cluster();
    let here = Node::Endpoint(m);
    // Exhaustive over the built-in actions: an action added to the vocabulary does not
    // compile until the operation's procedure says what it does.
    match step.action {
        BuiltIn::LockCluster => Ok(Step::Done),
        BuiltIn::EtcdHealthy => Ok(match etcd_healthy(w, snapshot, m).await? {
            Ok(()) => Step::Done,
            Err(seen) => gate(w, timing, rec.p, step, "EtcdUnhealthy", seen),
        }),
        BuiltIn::CordonNode => match w.cordon(&node, true).await? {
            Ok(was) => {
                rec.p.node_registered |= was.is_some();
                // An administrator's cordon (there before this operation cordoned) stays.
                if !rec.p.cordoned {
                    let was = was.unwrap_or(false);
                    rec.p.was_cordoned = was;
                    rec.p.cordoned = !was;
                }
                Ok(Step::Done)
            }
            Err(e) => Ok(Step::Wait {
                reason: "CordonFailed",
                message: format!("cordoning node {node}: {e}"),
                after: timing.drain_retry,
            }),
        },
        BuiltIn::DrainNode => Ok(match w.drain(&node).await? {
            Ok(Drained::Done) => Step::Done,
            Ok(Drained::Waiting { remaining }) => Step::Wait {
                reason: "Draining",
                message: format!("draining node {node}: {remaining} pod(s) still terminating"),
                after: Duration::from_secs(2).min(timing.drain_retry),
            },
            Ok(Drained::Blocked { pod, message }) => Step::Wait {
                reason: "DrainFailed",
                message: format!("draining node {node}: evicting pod {pod} is blocked: {message}"),
                after: timing.drain_retry,
            },
            Err(e) => Step::Wait {
                reason: "DrainFailed",
                message: format!("draining node {node}: {e}"),
                after: timing.drain_retry,
            },
        }),
        BuiltIn::EtcdForfeitLeadership => match calls::status(w, cluster, here).await? {
            Ok(s) if s.is_leader() => {
                match calls::done(w, cluster, here, Call::EtcdForfeitLeadership).await? {
                    Ok(()) => Ok(Step::Done),
                    Err(e) => Ok(talos_wait(timing, e)),
                }
            }
            Ok(_) => Ok(Step::Done),
            Err(e) => Ok(talos_wait(timing, e)),
        },
        BuiltIn::TalosReboot
        | BuiltIn::TalosShutdown
        | BuiltIn::TalosUpgrade
        | BuiltIn::TalosRollback
        | BuiltIn::TalosReset => send_once(w, timing, m, rec, step).await,
        BuiltIn::TalosInstall => install_once(w, timing, m, rec).await,
        BuiltIn::WaitNodeBack => {
            let p = &*rec.p;
            let seen = match calls::boot_time(w, cluster, here).await? {
                Err(e) => format!("the node does not answer ({e})"),
                Ok(t) if Some(t) == p.boot_time => {
                    format!(
                        "the node answers with its boot time of before ({t}): it has not rebooted"
                    )
                }
                Ok(_) => {
                    let want = upgrade_tag(op);
                    let version = match calls::version(w, cluster, here).await? {
                        Ok(v) => v,
                        Err(e) => {
                            let seen = format!("the node does not tell its version ({e})");
                            return Ok(gate(w, timing, p, step, "NodeNotBack", seen));
                        }
                    };
                    match want {
                        Some(tag) if tag != version => {
                            format!("the node came back running {version}, not {tag}")
                        }
                        _ => match w.node_ready(&node).await? {
                            Ok(Some(false)) => format!("the Kubernetes Node {node} is not Ready"),
                            Ok(None) if p.node_registered => format!(
                                "the Kubernetes Node {node} is gone (it was there before the \
                                 call): it is not back until it registers again and is Ready"
                            ),
                            // A node that never had a Kubernetes Node: its boot time and
                            // version are all there is to wait for.
                            Ok(_) => return Ok(Step::Done),
                            Err(e) => format!("the Kubernetes Node {node} cannot be read ({e})"),
                        },
                    }
                }
            };
            Ok(gate(w, timing, p, step, "NodeNotBack", seen))
        }
        BuiltIn::UncordonNode => {
            if !rec.p.cordoned || rec.p.was_cordoned {
                return Ok(Step::Done);
            }
            match w.cordon(&node, false).await? {
                Ok(_) => {
                    rec.p.cordoned = false;
                    Ok(Step::Done)
                }
                Err(e) => Ok(Step::Wait {
                    reason: "UncordonFailed",
                    message: format!("uncordoning node {node}: {e}"),
                    after: timing.drain_retry,
                }),
            }
        }
        action @ (BuiltIn::EventWarning | BuiltIn::EventNormal) => {
            let reason = step.argument.clone().unwrap_or_else(|| "Operation".into());
            let note = message.unwrap_or_else(|| step.text.clone());
            w.operation_event(op, action == BuiltIn::EventWarning, &reason, note)
                .await;
            Ok(Step::Done)
        }
        // A removal's steps: the checker refuses them in an operation's plan
        // (`ichor::check::action_not_in_plan`), so only a table built past it gets here.
        BuiltIn::EtcdLeave
        | BuiltIn::EtcdRemoveMember
        | BuiltIn::TalosWipe
        | BuiltIn::ReleaseFinalizer => Ok(Step::Fail {
            reason: "NotAnOperationStep",
            message: format!(
                "`{}` is a step of a removal, not of an operation; remove it from the plan",
                step.text
            ),
        }),
        // A configuration's apply's, a bootstrap's and a backup's steps: refused here by
        // the checker too (`ichor::check::action_not_in_plan`).
        BuiltIn::ConfigRender
        | BuiltIn::TalosDryRun
        | BuiltIn::TalosApplyConfig
        | BuiltIn::TalosBootstrap
        | BuiltIn::EtcdSnapshot
        | BuiltIn::SnapshotsPrune => Ok(Step::Fail {
            reason: "NotAnOperationStep",
            message: format!(
                "`{}` is a step of a machine's configuration apply, of a bootstrap or of a backup's snapshot, not of an operation; remove it from the plan",
                step.text
            ),
        }),
    }
}

/// The tag an upgrade must come back with (none for other kinds).
fn upgrade_tag(op: &TalosOperation) -> Option<String> {
    if op.spec.kind != "upgrade" {
        return None;
    }
    op.spec
        .image
        .as_deref()
        .and_then(image_tag)
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upgrade_path_follows_talosctl() {
        for (tag, lifecycle) in [
            ("v1.12.4", false),
            ("v1.9.5", false),
            ("v1.13.0-alpha.2", false),
            ("v1.13.0-beta.0", true),
            ("v1.13.0", true),
            ("v1.13.2", true),
            ("v1.14.0", true),
            ("v2.0.0", true),
            ("", false),
            ("garbage", false),
        ] {
            assert_eq!(lifecycle_path(tag), lifecycle, "{tag}");
        }
    }

    #[test]
    fn an_image_tag_is_after_the_last_colon() {
        assert_eq!(
            image_tag("ghcr.io/siderolabs/installer:v1.12.1"),
            Some("v1.12.1")
        );
        assert_eq!(
            image_tag("registry:5000/installer:v1.13.0"),
            Some("v1.13.0")
        );
        assert_eq!(image_tag("registry:5000/installer"), None);
        assert_eq!(image_tag("installer:v1.2@sha256:abc"), Some("v1.2"));
    }
}

/// Tests that pin what mutation testing (`cargo mutants`) found the other tests let
/// through, in the pure parts of an operation: resuming, the order of a roll, time bounds,
/// the installer image.
#[cfg(test)]
mod mutant_tests {
    use super::*;
    use crate::runtime::exec::{Call, Drained, LockOp, Node, Note, Reply, World};
    use crate::runtime::objects::{Condition, NodeProgress, TalosMachine};
    use k8s_openapi::jiff::Timestamp;
    use std::sync::Arc;

    fn op(spec: serde_json::Value, status: serde_json::Value) -> TalosOperation {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": "op-1", "namespace": "default"},
            "spec": spec,
            "status": status,
        }))
        .unwrap()
    }

    fn failed_with(resumed: Option<&str>, annotation: Option<&str>) -> TalosOperation {
        let mut o = op(
            serde_json::json!({"clusterRef": {"name": "prod"}, "kind": "reboot"}),
            serde_json::json!({"phase": "Failed", "progress": {"resumed": resumed}}),
        );
        if let Some(a) = annotation {
            o.metadata.annotations = Some([(RESUME_ANNOTATION.to_string(), a.to_string())].into());
        }
        o
    }

    #[test]
    fn a_resume_is_asked_once_per_new_value_of_a_failed_operation() {
        assert_eq!(
            resume_asked(&failed_with(None, Some(" t1 "))).as_deref(),
            Some("t1")
        );
        assert_eq!(
            resume_asked(&failed_with(Some("t0"), Some("t1"))).as_deref(),
            Some("t1")
        );
        assert_eq!(resume_asked(&failed_with(Some("t1"), Some("t1"))), None);
        assert_eq!(resume_asked(&failed_with(None, Some("  "))), None);
        assert_eq!(resume_asked(&failed_with(None, None)), None);
        let mut running = failed_with(None, Some("t1"));
        running.status.as_mut().unwrap().phase = Some("Running".into());
        assert_eq!(resume_asked(&running), None);
    }

    fn failed_by(reason: &str, status: &str) -> TalosOperation {
        let mut o = failed_with(None, Some("t1"));
        let p = o.status.as_mut().unwrap().progress.as_mut().unwrap();
        p.sent = Some("3. talos reboot".into());
        p.installing = Some("2. talos install".into());
        p.step_started_at = Some(Time(Timestamp::UNIX_EPOCH));
        o.status.as_mut().unwrap().failure_reason = Some("it failed".into());
        o.status.as_mut().unwrap().conditions.push(Condition {
            type_: RUNNING.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some("it failed".into()),
            last_transition_time: None,
        });
        o
    }

    /// A resume forgets a call sent only when the failure was that its outcome is unknown,
    /// and only the record of that call.
    #[test]
    fn a_resume_sends_again_only_a_call_whose_outcome_is_unknown() {
        let mut o = failed_by(SENT_UNKNOWN, "False");
        resume(&mut o, "t1");
        let p = progress(&o);
        assert_eq!((p.sent, p.installing.is_some()), (None, true));
        assert_eq!(p.resumed.as_deref(), Some("t1"));
        assert_eq!(p.step_started_at, None);
        let s = o.status.as_ref().unwrap();
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.failure_reason.as_deref(), Some(""));
        let c = o.condition(RUNNING).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("Resumed"))
        );

        let mut o = failed_by(INSTALL_UNKNOWN, "False");
        resume(&mut o, "t1");
        let p = progress(&o);
        assert_eq!((p.sent.is_some(), p.installing), (true, None));

        for (reason, status) in [("GateFailed", "False"), (SENT_UNKNOWN, "True")] {
            let mut o = failed_by(reason, status);
            resume(&mut o, "t1");
            let p = progress(&o);
            assert!(
                p.sent.is_some() && p.installing.is_some(),
                "{reason} {status}"
            );
        }
    }

    fn step(action: BuiltIn, within: Option<u64>) -> PlanStep {
        PlanStep {
            action,
            argument: None,
            within: within.map(Duration::from_secs),
            text: "a step".into(),
            guard_text: None,
            when: None,
            unless: None,
            message: None,
            say: None,
            lets: vec![],
        }
    }

    #[test]
    fn the_destructive_calls_are_the_ones_sent_once() {
        for a in [
            BuiltIn::TalosReboot,
            BuiltIn::TalosShutdown,
            BuiltIn::TalosUpgrade,
            BuiltIn::TalosRollback,
            BuiltIn::TalosReset,
        ] {
            assert!(sends_once(&step(a, None)), "{a:?}");
        }
        for a in [
            BuiltIn::DrainNode,
            BuiltIn::EtcdHealthy,
            BuiltIn::TalosInstall,
            BuiltIn::WaitNodeBack,
        ] {
            assert!(!sends_once(&step(a, None)), "{a:?}");
        }
    }

    #[test]
    fn an_operation_holder_names_its_operation_and_no_other_holder_does() {
        let h = holder("prod", "upgrade-1");
        assert_eq!(holder_operation(&h), Some(("prod", "upgrade-1")));
        assert_eq!(
            holder_operation(&super::super::removal::holder("prod", "cp-2")),
            None
        );
        assert_eq!(holder_operation("someone"), None);
    }

    #[test]
    fn the_upgrade_path_boundaries() {
        for (tag, lifecycle) in [
            ("v1.13.1-alpha.1", true),
            ("1.13", true),
            ("v0.14.0", false),
            ("v1.13.0-alpha.0", false),
            ("v3.1", true),
        ] {
            assert_eq!(lifecycle_path(tag), lifecycle, "{tag}");
        }
    }

    #[test]
    fn an_image_without_a_tag_has_none() {
        assert_eq!(image_tag("installer:"), None);
        assert_eq!(image_tag("installer"), None);
        assert_eq!(image_tag("installer:v1@sha256:abc"), Some("v1"));
    }

    #[test]
    fn an_upgrade_needs_an_image_with_a_tag() {
        let up = |image: Option<&str>| {
            op(
                serde_json::json!({"clusterRef": {"name": "prod"}, "kind": "upgrade", "image": image}),
                serde_json::json!({}),
            )
        };
        let o = up(Some("ghcr.io/siderolabs/installer:v1.13.0"));
        assert_eq!(
            upgrade_image(&o).ok(),
            Some("ghcr.io/siderolabs/installer:v1.13.0")
        );
        assert_eq!(upgrade_tag(&o).as_deref(), Some("v1.13.0"));
        for image in [None, Some(""), Some("ghcr.io/siderolabs/installer")] {
            assert!(
                matches!(
                    upgrade_image(&up(image)),
                    Err(Step::Fail {
                        reason: "NoImage",
                        ..
                    })
                ),
                "{image:?}"
            );
        }
        let mut reboot = up(Some("ghcr.io/siderolabs/installer:v1.13.0"));
        reboot.spec.kind = "reboot".into();
        assert_eq!(upgrade_tag(&reboot), None);
    }

    fn machine(ns: &str, name: &str, cluster: &str, role: &str, approved: bool) -> TalosMachine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterRef": {"name": cluster}, "role": role, "approved": approved}
        }))
        .unwrap()
    }

    /// A roll goes over the cluster's approved control planes, then its approved workers,
    /// each by name, none being deleted, narrowed to spec.machines; spec.machine alone is
    /// itself.
    #[test]
    fn the_order_is_control_planes_then_workers_of_the_cluster() {
        let mut deleting = machine("default", "cp-0", "prod", "controlplane", true);
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let snapshot = Snapshot {
            machines: vec![
                machine("default", "w-1", "prod", "worker", true),
                machine("default", "cp-3", "prod", "controlplane", true),
                machine("default", "cp-1", "prod", "controlplane", true),
                machine("other", "cp-2", "prod", "controlplane", true),
                machine("default", "cp-4", "staging", "controlplane", true),
                machine("default", "cp-5", "prod", "controlplane", false),
                deleting,
            ],
            ..Snapshot::default()
        };
        let roll = |machine: Option<&str>, machines: &[&str]| {
            order(
                &op(
                    serde_json::json!({"clusterRef": {"name": "prod"}, "kind": "reboot",
                                       "machine": machine, "machines": machines}),
                    serde_json::json!({}),
                ),
                &snapshot,
            )
        };
        assert_eq!(roll(None, &[]), vec!["cp-1", "cp-3", "w-1"]);
        assert_eq!(roll(Some(""), &[]), vec!["cp-1", "cp-3", "w-1"]);
        assert_eq!(roll(None, &["w-1", "cp-3"]), vec!["cp-3", "w-1"]);
        assert_eq!(roll(Some("cp-9"), &[]), vec!["cp-9"]);
    }

    /// The next node: one more done, the roll's own fields kept, the node's record clean;
    /// the first in flight beside it is worked on next, else the next of the order.
    #[test]
    fn the_next_node_keeps_the_roll_and_forgets_the_node() {
        let at = Some(Time(Timestamp::UNIX_EPOCH));
        let mut p = OperationProgress {
            done: 1,
            total: 3,
            order: vec!["a".into(), "b".into(), "c".into()],
            node: Some("b".into()),
            step: Some("2. drain node".into()),
            steps_done: vec!["1. lock cluster".into()],
            sent: Some("x".into()),
            started_at: at.clone(),
            resumed: Some("t1".into()),
            ..OperationProgress::default()
        };
        next_node(&mut p);
        assert_eq!((p.done, p.total), (2, 3));
        assert_eq!(p.order.len(), 3);
        assert_eq!(p.node.as_deref(), Some("c"));
        assert_eq!(
            (p.started_at, p.resumed.as_deref()),
            (at.clone(), Some("t1"))
        );
        assert!(p.step.is_none() && p.steps_done.is_empty() && p.sent.is_none());

        let mut p = OperationProgress {
            done: 0,
            total: 3,
            order: vec!["a".into(), "b".into(), "c".into()],
            node: Some("a".into()),
            ..OperationProgress::default()
        };
        p.alongside.push(NodeProgress {
            node: "b".into(),
            step: Some("3. talos reboot".into()),
            ..NodeProgress::default()
        });
        next_node(&mut p);
        assert_eq!(p.node.as_deref(), Some("b"));
        assert_eq!(p.step.as_deref(), Some("3. talos reboot"));
        assert!(p.alongside.is_empty());
        assert_eq!(p.done, 1);
    }

    /// A world that only tells the time.
    struct Clock(Timestamp);

    impl World for Clock {
        type Error = ();
        fn now(&self) -> Timestamp {
            self.0
        }
        async fn credentials(&mut self, _: &str) -> Result<(), String> {
            Ok(())
        }
        async fn talos(
            &mut self,
            _: &str,
            _: Node<'_>,
            _: Call,
        ) -> Result<Result<Reply, NodeError>, ()> {
            Err(())
        }
        async fn lock(&mut self, _: &str, _: LockOp) -> Result<Result<(), String>, ()> {
            Err(())
        }
        async fn read(&mut self, _: &str, _: Reads) -> Result<Arc<Snapshot>, ()> {
            Err(())
        }
        async fn drain(&mut self, _: &str) -> Result<Result<Drained, String>, ()> {
            Err(())
        }
        async fn write_status(
            &mut self,
            _: &TalosMachine,
            _: &TalosMachine,
        ) -> Result<Option<String>, ()> {
            Err(())
        }
        async fn release_finalizer(&mut self, _: &TalosMachine) -> Result<(), ()> {
            Err(())
        }
        async fn event(&mut self, _: &TalosMachine, _: bool, _: &str, _: String) {}
        fn note(&mut self, _: &TalosMachine, _: Note<'_>) {}
    }

    fn at(secs: i64) -> Clock {
        Clock(Timestamp::from_second(1_000_000 + secs).unwrap())
    }

    fn started() -> OperationProgress {
        OperationProgress {
            step_started_at: Some(Time(Timestamp::from_second(1_000_000).unwrap())),
            ..OperationProgress::default()
        }
    }

    /// A step is overdue once exactly its `within` passed; a call sent is past its bound
    /// once exactly that passed (at least a second).
    #[test]
    fn time_bounds_pass_at_their_exact_end() {
        let s = step(BuiltIn::WaitNodeBack, Some(60));
        let p = started();
        assert_eq!(overdue(&at(59), &p, &s), None);
        assert_eq!(overdue(&at(60), &p, &s), Some(Duration::from_secs(60)));
        assert_eq!(
            overdue(&at(600), &p, &step(BuiltIn::WaitNodeBack, None)),
            None
        );
        assert_eq!(overdue(&at(600), &OperationProgress::default(), &s), None);

        assert!(!past(&at(59), &p, Duration::from_secs(60)));
        assert!(past(&at(60), &p, Duration::from_secs(60)));
        assert!(!past(&at(0), &p, Duration::ZERO));
        assert!(past(&at(1), &p, Duration::ZERO));
        assert!(!past(
            &at(600),
            &OperationProgress::default(),
            Duration::from_secs(60)
        ));
    }

    fn timing() -> Timing {
        Timing {
            refused_requeue: Duration::from_secs(30),
            lock_retry: Duration::from_secs(5),
            drain_retry: Duration::from_secs(10),
            reset_settle: Duration::from_secs(60),
            sent_deadline: Duration::from_secs(600),
        }
    }

    /// A gate that has not passed fails at once without a `within`, waits within it, and
    /// fails once it is over.
    #[test]
    fn a_gate_waits_only_within_its_bound() {
        let p = started();
        let fails = |s: Step| match s {
            Step::Fail { reason, message } => Some((reason, message)),
            _ => None,
        };
        let (reason, message) = fails(gate(
            &at(0),
            &timing(),
            &p,
            &step(BuiltIn::EtcdHealthy, None),
            "Unhealthy",
            "x".into(),
        ))
        .expect("fails");
        assert_eq!((reason, message.as_str()), ("Unhealthy", "did not pass: x"));
        let s = step(BuiltIn::EtcdHealthy, Some(60));
        assert!(matches!(
            gate(&at(10), &timing(), &p, &s, "Unhealthy", "x".into()),
            Step::Wait { reason: "Unhealthy", after, .. } if after == Duration::from_secs(2)
        ));
        let (_, message) =
            fails(gate(&at(60), &timing(), &p, &s, "Unhealthy", "x".into())).expect("fails");
        assert_eq!(message, "did not pass within 60s: x");
    }

    #[test]
    fn a_failed_talos_call_waits_by_its_kind() {
        let unreachable = NodeError::Talos(TalosError::Unreachable {
            endpoint: "e".into(),
            node: None,
            detail: "d".into(),
        });
        let failed = NodeError::Talos(TalosError::Failed {
            endpoint: "e".into(),
            node: None,
            code: tonic::Code::Internal,
            message: "m".into(),
        });
        for (e, want) in [
            (unreachable, "NodeUnreachable"),
            (
                NodeError::NoCredentials("none".into()),
                "NoTalosCredentials",
            ),
            (failed, "TalosFailed"),
        ] {
            assert!(
                matches!(talos_wait(&timing(), e), Step::Wait { reason, .. } if reason == want),
                "{want}"
            );
        }
    }
}
