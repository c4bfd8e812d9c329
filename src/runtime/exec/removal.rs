//! The removal of an approved control plane (ADR 0010, 0106, 0137), as one procedure over
//! a [`World`]: the controller runs it with real I/O, `verify`'s model with its world.
//!
//! On deletion of a machine with the removal finalizer: take the cluster lock (the same
//! work resumes its own lock; held by other work -> wait and retry), recount live under the
//! lock, decide the `remove controlplane` rules at the controller site (asking etcd through
//! a healthy sibling whether the member is dead, only when a rule needs it), then run the
//! plan's steps in order. Each finished step is recorded in `status.removal`, so a
//! controller that restarts at any step resumes there. Once the member has left etcd the
//! removal is committed and finishes without deciding again. A Talos reset that was started
//! is never sent a second time while the node may still be going down.

use super::etcd::{self, Deadness, Sibling, node_name};
use super::rules::{Asked, decide_asking, hold_of};
use super::{
    Call, Drained, LockOp, Node, NodeError, Note, Outcome, Timing, Wait, World, calls, unlock,
};
use crate::compile::{PlanStep, Table};
use crate::interp::Finding;
use crate::runtime::controller::status::{self, Conditions};
use crate::runtime::decide::reconcile_machine_event;
use crate::runtime::live::Reads;
use crate::runtime::objects::{RemovalProgress, Role, Snapshot, TalosMachine};
use crate::runtime::step_records::cite;
use crate::runtime::talos::{EtcdMember, EtcdStatus, TalosError};
use crate::vocab::{Action as BuiltIn, Fact, Subject, Verb, Verdict};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

/// The condition a removal reports in.
pub const REMOVAL: &str = "Removal";

/// The removal's holder name of the cluster lock (the work itself, so a restarted
/// controller or a new leader resumes it).
pub fn holder(namespace: &str, machine: &str) -> String {
    format!("{HOLDER_PREFIX}{namespace}/{machine}")
}

const HOLDER_PREFIX: &str = "remove TalosMachine ";

/// The machine (`namespace`, `name`) whose removal a lock holder's name is ([`holder`]'s
/// inverse); `None` for any other holder.
pub fn holder_machine(holder: &str) -> Option<(&str, &str)> {
    holder.strip_prefix(HOLDER_PREFIX)?.split_once('/')
}

/// How one step ended.
enum Step {
    Done,
    /// Not finished; the message goes into the Removal condition and the removal is looked
    /// at again after the wait.
    Wait {
        reason: &'static str,
        message: String,
        after: Duration,
        /// A Warning event to publish when this state begins.
        event: Option<(&'static str, String)>,
    },
}

fn progress(m: &TalosMachine) -> RemovalProgress {
    m.removal_progress().cloned().unwrap_or_default()
}

fn set_progress(m: &mut TalosMachine, p: RemovalProgress) {
    m.status.get_or_insert_with(Default::default).removal = Some(p);
}

fn requeue(after: Duration, wait: Wait) -> Outcome {
    Outcome::Requeue { after, wait }
}

fn on(reason: &str) -> Wait {
    Wait::On(reason.to_string())
}

/// One reconcile of the removal of `m` (a machine being deleted with the removal
/// finalizer), as read by the watch.
pub async fn reconcile<W: World>(
    w: &mut W,
    table: &Table,
    timing: &Timing,
    m: &TalosMachine,
) -> Result<Outcome, W::Error> {
    let (ns, name, cluster) = (m.namespace(), m.name(), m.cluster());
    let mut p = progress(m);
    // Moved to another cluster after its removal began (past admission): its member is in
    // the etcd of the cluster the removal recorded, and the finalizer goes only once that
    // etcd no longer lists it.
    if p.cluster.as_deref().is_some_and(|c| c != cluster) {
        let stopped = format!(
            "the removal stopped after: {}, because the machine was moved from TalosCluster {} to {cluster}",
            done_list(&p),
            p.cluster.as_deref().unwrap_or_default()
        );
        return release_if_not_member(w, timing, m, Some(&stopped)).await;
    }
    // Not an approved control plane any more (un-approved or re-roled after it got the
    // finalizer), and no removal started: the finalizer goes once etcd shows it is not a
    // member. A member left behind would stay in etcd's quorum while nothing counts it.
    if m.approved_role() != Some(Role::ControlPlane) && !p.committed && p.done.is_empty() {
        return release_if_not_member(w, timing, m, None).await;
    }
    // Every removal needs the Talos API (leave, remove-member, reset or wipe), with this
    // cluster's own credentials (read live, once per reconcile). Without them it would
    // drain the node and then stop: it does not start.
    if let Err(why) = w.credentials(cluster).await
        && p.done.is_empty()
    {
        let msg = format!(
            "{why}; the removal does not start without them: it would drain the node and then \
             stop before etcd"
        );
        let mut next = m.clone();
        if status::set_at(
            w.now(),
            next.conditions_mut(),
            REMOVAL,
            false,
            "NoTalosCredentials",
            &msg,
        ) {
            w.event(m, true, "NoTalosCredentials", msg.clone()).await;
        }
        w.write_status(m, &next).await?;
        return Ok(requeue(timing.refused_requeue, on("NoTalosCredentials")));
    }

    // 1. The cluster lock.
    if let Err(holder) = w.lock(cluster, LockOp::Take).await? {
        // A removal the rules refused keeps saying why: the lock held by other work is not
        // news to the person who has to approve a replacement.
        if refused(table, m) {
            return Ok(requeue(timing.lock_retry, on("ClusterLockHeld")));
        }
        let mut next = m.clone();
        let msg = format!("waiting for the cluster lock, held by {holder}");
        status::set_at(
            w.now(),
            next.conditions_mut(),
            REMOVAL,
            false,
            "ClusterLockHeld",
            &msg,
        );
        w.write_status(m, &next).await?;
        return Ok(requeue(timing.lock_retry, on("ClusterLockHeld")));
    }

    // 2. Recount live, under the lock.
    let reads = Reads {
        machines: true,
        clusters: true,
        operations: true,
        backups: false,
    };
    let snapshot = w.read(cluster, reads).await?;
    let Some(live) = snapshot.machine(ns, name) else {
        unlock(w, cluster, LockOp::Release).await?;
        return Ok(Outcome::AwaitChange);
    };
    let Some(ev) = reconcile_machine_event(live).filter(|e| e.event.0 == Verb::Remove) else {
        // No longer an approved control plane but the removal had begun: its finalizer goes
        // only once etcd says the member is gone, never on the edit alone.
        unlock(w, cluster, LockOp::Release).await?;
        let stopped = format!(
            "the removal stopped after: {}, because the machine is no longer an approved control plane",
            done_list(&p)
        );
        return release_if_not_member(w, timing, live, Some(&stopped)).await;
    };
    // The status being built; the world compares each write with what it wrote last (or
    // with `live`, the object as read).
    let mut next = live.clone();

    // The removal's condition once the plan moves on, when a step's wait still says why
    // it stopped ([`waiting_in_plan`]).
    let mut in_progress: Option<(&str, String)> = None;
    // 3. Decide, unless the removal is committed (the member already left etcd).
    if !p.committed {
        // Asked again at every decision until the removal commits: a member that answers
        // again is not removed below the count.
        let marked = live.dead_member_removal_marked() || p.member_dead;
        let unreadable = |f: Fact, why: &str| Finding {
            rule: "(live state)".into(),
            verdict: Verdict::Refuse,
            message: if why.is_empty() {
                format!("the fact `{f}` could not be read, so the removal waits")
            } else {
                format!("the etcd members cannot be counted (`{f}`), so the removal waits: {why}")
            },
            reason: Some("RemovalRefused".into()),
        };
        let Asked {
            decision,
            deadness,
            member_id,
            ..
        } = decide_asking(w, table, &snapshot, ev, Some(live), marked, &unreadable).await?;
        w.note(live, Note::Decided(&decision));
        if let Some((reason, mut message)) = hold_of(&decision, "RemovalRefused") {
            // Why `member.dead` did not bend the refusal, when it was asked (ADR 0106 §4:
            // what cannot be told leaves the refusal in place, and says so).
            match &deadness {
                Some(Deadness::CannotTell(why)) => message.push_str(&format!(
                    " (whether its etcd member is dead cannot be told, so the refusal stays: {why})"
                )),
                Some(Deadness::Alive(why)) => {
                    message.push_str(&format!(" (its etcd member is not dead: {why})"))
                }
                _ => {}
            }
            let message = cite(w, &message, &decision);
            unlock(w, cluster, LockOp::Release).await?;
            let changed = status::set_at(
                w.now(),
                next.conditions_mut(),
                REMOVAL,
                false,
                &reason,
                &message,
            );
            w.write_status(live, &next).await?;
            if changed {
                w.note(live, Note::Info(&format!("removal refused: {message}")));
                w.event(live, true, "RemovalRefused", message).await;
            }
            return Ok(requeue(timing.refused_requeue, Wait::Refused));
        }
        if let Some(found) = &deadness {
            if found.is_dead() && p.member_id.is_none() {
                p.member_id = member_id;
            }
            p.member_dead = found.is_dead();
        }
        // Whose etcd, and which member: recorded once, so later edits of the machine's
        // spec cannot point the rest of the removal elsewhere.
        p.cluster.get_or_insert_with(|| cluster.to_string());
        p.member.get_or_insert_with(|| node_name(live).to_string());
        let (reason, message) = if p.member_dead {
            (
                "DeadMemberRemoval",
                "removing a control plane whose etcd member is dead",
            )
        } else {
            (
                "RemovalInProgress",
                "removing the control plane: the removal rules let it through",
            )
        };
        let message = cite(w, message, &decision);
        // A step of the plan that waited (a blocked drain, say) says so until it is done or
        // waits on something else: saying "in progress" first and the wait again later in
        // the same reconcile would flip the condition twice each retry, and its
        // lastTransitionTime with it. The progress is recorded all the same.
        if waiting_in_plan(table, live) {
            in_progress = Some((reason, message));
        } else {
            mark_in_progress(w, &mut next, reason, &message);
        }
        set_progress(&mut next, p.clone());
        save(w, live, &mut next).await?;
    }

    // 4. The plan.
    let Some(plan) = table.plan(Verb::Remove, Subject::ControlPlane) else {
        unlock(w, cluster, LockOp::Release).await?;
        let msg = "the rules have no `plan remove controlplane`; nothing is removed until they do";
        status::set_at(
            w.now(),
            next.conditions_mut(),
            REMOVAL,
            false,
            "NoPlan",
            msg,
        );
        w.write_status(live, &next).await?;
        return Ok(requeue(timing.refused_requeue, on("NoPlan")));
    };
    let mut reset_confirmed = false;
    for (k, step) in plan.steps.iter().enumerate() {
        if p.done.iter().any(|d| d == &step.text) {
            continue;
        }
        let guard_facts = [(Fact::MemberDead, i64::from(p.member_dead))];
        let (runs, message) = match w.applies(table, &snapshot, ev, &guard_facts, k, step) {
            Ok(x) => x,
            Err(why) => {
                unlock(w, cluster, LockOp::Release).await?;
                status::set_at(
                    w.now(),
                    next.conditions_mut(),
                    REMOVAL,
                    false,
                    "RemovalRefused",
                    &why,
                );
                save(w, live, &mut next).await?;
                return Ok(requeue(timing.refused_requeue, Wait::Refused));
            }
        };
        if !runs {
            continue;
        }
        w.note(live, Note::Step(k, &step.text));
        super::step_began(w, table, k, &step.text, message.as_deref());
        let mut rec = Record {
            live,
            next: &mut next,
            p: &mut p,
            reset_confirmed,
        };
        let outcome = execute(w, timing, &snapshot, live, &mut rec, step, message).await?;
        reset_confirmed = rec.reset_confirmed;
        match &outcome {
            Step::Done => super::step_ended(w, "done", None, None),
            Step::Wait {
                reason, message, ..
            } => super::step_ended(w, "wait", Some(reason), Some(message)),
        }
        match outcome {
            Step::Done => {
                p.done.push(step.text.clone());
                p.started = None;
                p.started_at = None;
                if let Some((reason, message)) = in_progress.take() {
                    mark_in_progress(w, &mut next, reason, &message);
                }
                set_progress(&mut next, p.clone());
                save(w, live, &mut next).await?;
            }
            Step::Wait {
                reason,
                message,
                after,
                event,
            } => {
                // Against the object as read: deciding again in this reconcile already
                // rewrote `next`'s reason, so a wait that goes on would begin every time.
                let began = live.removal_reason() != Some(reason);
                status::set_at(
                    w.now(),
                    next.conditions_mut(),
                    REMOVAL,
                    false,
                    reason,
                    &message,
                );
                set_progress(&mut next, p.clone());
                save(w, live, &mut next).await?;
                if began && let Some((ev_reason, note)) = event {
                    w.event(live, true, ev_reason, note).await;
                }
                // The lock stays ours (the work resumes it); the renewal stops with this
                // reconcile, and the next one renews it again.
                unlock(w, cluster, LockOp::Keep).await?;
                return Ok(requeue(after, on(reason)));
            }
        }
    }
    unlock(w, cluster, LockOp::Release).await?;
    w.note(live, Note::Info("control plane removed"));
    Ok(Outcome::AwaitChange)
}

/// Says the removal is under way (True, with the decision's reason and message).
fn mark_in_progress<W: World>(w: &W, next: &mut TalosMachine, reason: &str, message: &str) {
    status::set_at(
        w.now(),
        next.conditions_mut(),
        REMOVAL,
        true,
        reason,
        message,
    );
}

/// Whether the removal's condition, as read, says the rules refused it: False, for a reason
/// of the rules (from the table) or the controller's default for a rule without one.
fn refused(table: &crate::compile::Table, m: &TalosMachine) -> bool {
    m.removal_state().is_some_and(|(status, reason)| {
        status == "False"
            && (table.owns_reason(reason) || matches!(reason, None | Some("RemovalRefused")))
    })
}

/// Whether the removal's condition, as read, is a wait of a step of its plan: False, for
/// none of the reasons said before the plan runs: a refusal ([`refused`]), the lock held by
/// other work, no credentials, no plan.
fn waiting_in_plan(table: &crate::compile::Table, m: &TalosMachine) -> bool {
    m.removal_state().is_some_and(|(status, reason)| {
        status == "False"
            && !refused(table, m)
            && !matches!(
                reason,
                Some("ClusterLockHeld" | "NoTalosCredentials" | "NoPlan")
            )
    })
}

fn done_list(p: &RemovalProgress) -> String {
    if p.done.is_empty() {
        "nothing".to_string()
    } else {
        p.done.join(", ")
    }
}

/// Releases the removal finalizer of a machine that is not an approved control plane only
/// when etcd, read through a healthy sibling, does not list its member (or its cluster is
/// being torn down). `stopped`: what a removal that had begun did before it stopped, said
/// in the condition while the finalizer stays.
async fn release_if_not_member<W: World>(
    w: &mut W,
    timing: &Timing,
    m: &TalosMachine,
    stopped: Option<&str>,
) -> Result<Outcome, W::Error> {
    // The cluster and member a begun removal recorded, not what the spec says now: the
    // machine may have been moved or renamed after its removal began.
    let asked = as_recorded(m);
    let reads = Reads {
        machines: true,
        clusters: true,
        operations: false,
        backups: false,
    };
    let snapshot = w.read(asked.cluster(), reads).await?;
    // A cluster being torn down goes with its etcd: a member left behind there holds
    // nothing up, and waiting for it would keep the teardown from ending.
    if snapshot
        .cluster(asked.namespace(), asked.cluster())
        .is_some_and(|c| c.deleting())
    {
        w.release_finalizer(m).await?;
        return Ok(Outcome::AwaitChange);
    }
    let member = node_name(&asked);
    // The member as this removal recorded it (its etcd ID), else by its node name.
    let recorded_id = m.removal_progress().and_then(|p| p.member_id);
    let (reason, message) = match etcd::healthy_sibling(w, &snapshot, &asked).await? {
        Ok(s)
            if recorded_id.map_or_else(
                || s.member(member).is_none(),
                |id| s.member_by_id(id).is_none(),
            ) =>
        {
            w.release_finalizer(m).await?;
            return Ok(Outcome::AwaitChange);
        }
        Ok(s) => (
            "StillEtcdMember",
            format!(
                "{} is no longer an approved control plane, but etcd (through {}) still lists its member {member}; \
                 approve it again as a control plane so that its removal runs (drain, etcd leave, reset), \
                 or remove the member by hand",
                m.name(),
                s.machine.name()
            ),
        ),
        Err(why) => (
            "EtcdUnavailable",
            format!(
                "cannot tell whether {} is still an etcd member, so its finalizer stays: {why}",
                m.name()
            ),
        ),
    };
    let message = match stopped {
        Some(stopped) => format!("{stopped}; {message}"),
        None => message,
    };
    let mut next = m.clone();
    status::set_at(
        w.now(),
        next.conditions_mut(),
        REMOVAL,
        false,
        reason,
        &message,
    );
    w.write_status(m, &next).await?;
    Ok(requeue(timing.refused_requeue, on(reason)))
}

/// The machine as its removal recorded it (the cluster and the member name, when a removal
/// began): whom to ask etcd about.
pub fn as_recorded(m: &TalosMachine) -> TalosMachine {
    let mut out = m.clone();
    if let Some(p) = m.removal_progress() {
        if let Some(c) = &p.cluster {
            out.spec.cluster_ref.name = c.clone();
        }
        if let Some(member) = &p.member {
            out.spec.hostname = Some(member.clone());
        }
    }
    out
}

/// The object as read, the status being built, and the removal's progress.
struct Record<'r> {
    live: &'r TalosMachine,
    next: &'r mut TalosMachine,
    p: &'r mut RemovalProgress,
    /// A reset (or wipe) was answered as taken in this reconcile.
    reset_confirmed: bool,
}

/// Writes the status when it differs from what was written last (the world remembers;
/// `read`: the object as read, before any write), and keeps the resourceVersion the write
/// made (a later finalizer patch is guarded by it).
async fn save<W: World>(
    w: &mut W,
    read: &TalosMachine,
    next: &mut TalosMachine,
) -> Result<(), W::Error> {
    if let Some(version) = w.write_status(read, next).await? {
        next.metadata.resource_version = Some(version);
    }
    Ok(())
}

/// The removal's member in a sibling's list.
enum Found<'s> {
    /// Listed: by the ID this removal recorded, else by the machine's node name.
    Listed(&'s EtcdMember),
    /// Not listed, and this removal knows it was a member (its recorded ID, or a step that
    /// already committed): gone.
    Gone,
    /// Neither listed nor known: whether it left cannot be told, so nothing is skipped.
    Unknown(String),
}

/// Finds the removal's member: by the ID it recorded, else by the node name. A member not
/// listed is gone only when the removal knows it was one; a name that matches nothing is
/// never taken for "already left" (a hostname that differs from the member's name would
/// otherwise skip the step and leave the member behind).
fn find_member<'s>(sibling: &'s Sibling<'_>, p: &RemovalProgress, member: &str) -> Found<'s> {
    if let Some(id) = p.member_id {
        return match sibling.member_by_id(id) {
            Some(m) => Found::Listed(m),
            None => Found::Gone,
        };
    }
    if let Some(m) = sibling.member(member) {
        return Found::Listed(m);
    }
    if p.committed {
        return Found::Gone;
    }
    let listed: Vec<&str> = sibling
        .members
        .iter()
        .map(|m| m.hostname.as_str())
        .collect();
    Found::Unknown(format!(
        "etcd (through {}) lists no member named {member} (its members: {}), and this removal \
         has not seen it as one, so whether it left cannot be told; if the node's etcd member \
         has another name, set spec.hostname to it",
        sibling.machine.name(),
        listed.join(", ")
    ))
}

/// The removal's member when etcd lists none by the machine's node name, told by the node
/// at spec.endpoint itself (`status`: its own etcd's answer): not a member (its etcd does
/// not run, or its ID is not listed) is gone; a listed member that no other machine of the
/// cluster is named as is this machine's, under another name; anything else cannot be told.
fn by_node<'s>(
    status: &Result<EtcdStatus, NodeError>,
    sibling: &'s Sibling<'_>,
    snapshot: &Snapshot,
    live: &TalosMachine,
    why: String,
) -> Found<'s> {
    match status {
        Ok(s) => match sibling.member_by_id(s.member_id) {
            None => Found::Gone,
            Some(m) => {
                let claimed = snapshot.machines.iter().any(|o| {
                    o.namespace() == live.namespace()
                        && o.cluster() == live.cluster()
                        && o.name() != live.name()
                        && node_name(o) == m.hostname
                });
                if claimed {
                    Found::Unknown(format!(
                        "{why}; the node at spec.endpoint answers as member {}, which is another \
                         machine's",
                        m.hostname
                    ))
                } else {
                    Found::Listed(m)
                }
            }
        },
        // The node answers but its etcd does not: not a running member.
        Err(NodeError::Talos(TalosError::Failed { .. })) => Found::Gone,
        Err(_) => Found::Unknown(why),
    }
}

/// The node at spec.endpoint answers as another etcd member than the removal's: nothing
/// is sent to it.
fn identity_wait(
    timing: &Timing,
    member: &str,
    want: u64,
    got: u64,
    sibling: &Sibling<'_>,
) -> Step {
    let other = sibling
        .member_by_id(got)
        .map_or_else(|| format!("{got:x}"), |m| m.hostname.clone());
    Step::Wait {
        reason: "EndpointIdentityMismatch",
        message: format!(
            "etcd leave: the node at spec.endpoint answers as etcd member {other}, not {member} \
             ({want:x}); nothing is sent to it. Point spec.endpoint at {member}'s node"
        ),
        after: timing.refused_requeue,
        event: None,
    }
}

fn talos_wait(timing: &Timing, step: &PlanStep, e: NodeError) -> Step {
    let reason = match e {
        NodeError::Talos(TalosError::Unreachable { .. }) => "NodeUnreachable",
        NodeError::NoCredentials(_) => "NoTalosCredentials",
        _ => "TalosFailed",
    };
    Step::Wait {
        reason,
        message: format!("{}: {e}", step.text),
        after: timing.drain_retry,
        event: None,
    }
}

fn no_sibling(timing: &Timing, what: &str, why: String) -> Step {
    Step::Wait {
        reason: "EtcdUnavailable",
        message: format!("{what}: no healthy sibling to check membership through ({why})"),
        after: timing.drain_retry,
        event: None,
    }
}

/// Whether plan step `step` publishes a Warning event (what the model reads of a removal's
/// past steps to know it was said).
pub fn warns(step: &PlanStep) -> bool {
    step.action == BuiltIn::EventWarning
}

/// Runs one step. Every step is idempotent: it looks before it acts.
async fn execute<W: World>(
    w: &mut W,
    timing: &Timing,
    snapshot: &Snapshot,
    live: &TalosMachine,
    rec: &mut Record<'_>,
    step: &PlanStep,
    message: Option<String>,
) -> Result<Step, W::Error> {
    let Record {
        live: read,
        next,
        p,
        reset_confirmed,
    } = rec;
    let member = p
        .member
        .clone()
        .unwrap_or_else(|| node_name(live).to_string());
    let cluster = live.cluster();
    let here = Node::Endpoint(live);
    // Exhaustive over the built-in actions: an action added to the vocabulary does not
    // compile until the executor says what it does.
    match step.action {
        BuiltIn::LockCluster => Ok(Step::Done), // taken above, before the recount
        BuiltIn::DrainNode => Ok(match w.drain(&member).await? {
            Ok(Drained::Done) => Step::Done,
            Ok(Drained::Waiting { remaining }) => Step::Wait {
                reason: "Draining",
                message: format!("draining node {member}: {remaining} pod(s) still terminating"),
                after: Duration::from_secs(2).min(timing.drain_retry),
                event: None,
            },
            Ok(Drained::Blocked { pod, message }) => {
                let text = format!(
                    "draining node {member}: evicting pod {pod} is blocked: {message}; retrying every {}s",
                    timing.drain_retry.as_secs()
                );
                Step::Wait {
                    reason: "DrainFailed",
                    message: text.clone(),
                    after: timing.drain_retry,
                    event: Some(("DrainFailed", text)),
                }
            }
            Err(e) => Step::Wait {
                reason: "DrainFailed",
                message: format!(
                    "draining node {member}: {e}; retrying every {}s",
                    timing.drain_retry.as_secs()
                ),
                after: timing.drain_retry,
                event: None,
            },
        }),
        BuiltIn::EtcdForfeitLeadership => match calls::status(w, cluster, here).await? {
            Ok(s) if s.leader != 0 && s.leader == s.member_id => {
                match calls::done(w, cluster, here, Call::EtcdForfeitLeadership).await? {
                    Ok(()) => Ok(Step::Done),
                    Err(e) => Ok(talos_wait(timing, step, e)),
                }
            }
            Ok(_) => Ok(Step::Done),
            Err(e) => Ok(talos_wait(timing, step, e)),
        },
        BuiltIn::EtcdLeave => {
            let sibling = match etcd::healthy_sibling(w, snapshot, live).await? {
                Ok(s) => s,
                Err(why) => return Ok(no_sibling(timing, "etcd leave", why)),
            };
            let found = match find_member(&sibling, p, &member) {
                // A node name etcd does not know: the node itself says which member it is.
                Found::Unknown(why) => {
                    let status = calls::status(w, cluster, here).await?;
                    by_node(&status, &sibling, snapshot, live, why)
                }
                other => other,
            };
            match found {
                Found::Listed(m) => {
                    // Recorded before the call: a leave that lands but whose answer is lost
                    // is recognised by this ID's absence when the removal resumes.
                    if p.member_id != Some(m.id) {
                        p.member_id = Some(m.id);
                        set_progress(next, p.clone());
                        save(w, read, next).await?;
                    }
                    // The node at spec.endpoint must be this member: another node would
                    // leave in its place.
                    match calls::status(w, cluster, here).await? {
                        Ok(s) if s.member_id == m.id => {}
                        Ok(s) => {
                            return Ok(identity_wait(timing, &member, m.id, s.member_id, &sibling));
                        }
                        Err(e) => return Ok(talos_wait(timing, step, e)),
                    }
                    if let Err(e) = calls::done(w, cluster, here, Call::EtcdLeaveCluster).await? {
                        return Ok(talos_wait(timing, step, e));
                    }
                }
                Found::Gone => {}
                Found::Unknown(message) => {
                    return Ok(Step::Wait {
                        reason: "EtcdMemberNotFound",
                        message: format!("etcd leave: {message}"),
                        after: timing.refused_requeue,
                        event: None,
                    });
                }
            }
            p.committed = true;
            Ok(Step::Done)
        }
        BuiltIn::EtcdRemoveMember => {
            let sibling = match etcd::healthy_sibling(w, snapshot, live).await? {
                Ok(s) => s,
                Err(why) => return Ok(no_sibling(timing, "etcd remove-member", why)),
            };
            match find_member(&sibling, p, &member) {
                Found::Listed(m) => {
                    let id = m.id;
                    if p.member_id != Some(id) {
                        p.member_id = Some(id);
                        set_progress(next, p.clone());
                        save(w, read, next).await?;
                    }
                    let call = Call::EtcdRemoveMemberById(id);
                    if let Err(e) = calls::done(w, cluster, sibling.node(), call).await? {
                        return Ok(talos_wait(timing, step, e));
                    }
                }
                Found::Gone => {}
                Found::Unknown(message) => {
                    return Ok(Step::Wait {
                        reason: "EtcdMemberNotFound",
                        message: format!("etcd remove-member: {message}"),
                        after: timing.refused_requeue,
                        event: None,
                    });
                }
            }
            p.committed = true;
            Ok(Step::Done)
        }
        action @ (BuiltIn::EventWarning | BuiltIn::EventNormal) => {
            let reason = step.argument.clone().unwrap_or_else(|| "Removal".into());
            let note = message.unwrap_or_else(|| step.text.clone());
            w.event(live, action == BuiltIn::EventWarning, &reason, note)
                .await;
            Ok(Step::Done)
        }
        action @ (BuiltIn::TalosReset | BuiltIn::TalosWipe) => {
            // A node reset (or wiped) by an earlier step of this removal is gone: a second
            // reset would only wait for it forever (a teardown after a reset).
            if p.done
                .iter()
                .any(|d| d == "talos reset" || d == "talos wipe")
            {
                return Ok(Step::Done);
            }
            let graceful = action == BuiltIn::TalosReset;
            if p.started.as_deref() == Some(step.text.as_str()) {
                // A reset may have been sent before a restart. A node that is resetting
                // stops answering; one that still answers long after did not get it.
                let since = p
                    .started_at
                    .as_ref()
                    .map(|t| w.now().duration_since(t.0).as_secs())
                    .unwrap_or(i64::MAX);
                match calls::version(w, cluster, here).await? {
                    Err(NodeError::Talos(TalosError::Unreachable { .. })) => {
                        p.committed = true;
                        return Ok(Step::Done);
                    }
                    _ if u64::try_from(since).unwrap_or(0) < timing.reset_settle.as_secs().max(1) => {
                        return Ok(Step::Wait {
                            reason: "Resetting",
                            message: format!(
                                "a Talos reset of {member} was sent {since}s ago; waiting for the node to go down before deciding whether it took"
                            ),
                            after: Duration::from_millis(500),
                            event: None,
                        });
                    }
                    _ => w.note(
                        live,
                        Note::Warn(
                            "the node still answers well after its reset was started: it did not take; sending it again",
                        ),
                    ),
                }
            }
            p.started = Some(step.text.clone());
            p.started_at = Some(Time(w.now()));
            set_progress(next, p.clone());
            save(w, read, next).await?;
            match calls::done(w, cluster, here, Call::Reset { graceful }).await? {
                Ok(()) => *reset_confirmed = true,
                // No answer: it may have taken (the node goes down as it resets). The
                // record of it stays, so the next reconcile looks before sending it again.
                Err(e @ NodeError::Talos(TalosError::Unreachable { .. })) => {
                    return Ok(talos_wait(timing, step, e));
                }
                Err(e) => {
                    // The node answered that it did not take it: it may be sent again.
                    p.started = None;
                    p.started_at = None;
                    return Ok(talos_wait(timing, step, e));
                }
            }
            // A wiped node is gone with its etcd: no deciding again (a graceful reset comes
            // after the leave, which committed already).
            p.committed = true;
            Ok(Step::Done)
        }
        // An operation's steps: the checker refuses them in a removal's plan
        // (`ichor::check::action_not_in_plan`), so only a table built past it gets here.
        BuiltIn::EtcdHealthy
        | BuiltIn::CordonNode
        | BuiltIn::UncordonNode
        | BuiltIn::TalosReboot
        | BuiltIn::TalosShutdown
        | BuiltIn::TalosUpgrade
        | BuiltIn::TalosRollback
        | BuiltIn::WaitNodeBack
        | BuiltIn::TalosInstall => Ok(Step::Wait {
            reason: "NotARemovalStep",
            message: format!(
                "`{}` is a step of an operation, not of a removal; remove it from `plan remove controlplane`",
                step.text
            ),
            after: timing.refused_requeue,
            event: None,
        }),
        // A configuration's apply's, a bootstrap's and a backup's steps: refused here by
        // the checker too (`ichor::check::action_not_in_plan`).
        BuiltIn::ConfigRender
        | BuiltIn::TalosDryRun
        | BuiltIn::TalosApplyConfig
        | BuiltIn::TalosBootstrap
        | BuiltIn::EtcdSnapshot
        | BuiltIn::SnapshotsPrune => Ok(Step::Wait {
            reason: "NotARemovalStep",
            message: format!(
                "`{}` is a step of a machine's configuration apply, of a bootstrap or of a backup's snapshot, not of a removal; remove it from `plan remove controlplane`",
                step.text
            ),
            after: timing.refused_requeue,
            event: None,
        }),
        BuiltIn::ReleaseFinalizer => {
            // A reset this removal only inferred (its node stopped answering after it may
            // have been sent, in an earlier reconcile) is checked once more: a node that
            // answers as its configured self now was down for another reason, and is
            // reset before its machine goes.
            let resets = |d: &String| d == "talos reset" || d == "talos wipe";
            if !*reset_confirmed
                && p.done.iter().any(resets)
                && calls::version(w, cluster, here).await?.is_ok()
            {
                p.done.retain(|d| !resets(d));
                p.started = None;
                p.started_at = None;
                return Ok(Step::Wait {
                    reason: "ResetDidNotTake",
                    message: format!(
                        "{member} answers as a configured node although its reset was taken as \
                         done (it had stopped answering): it is reset again before its machine goes"
                    ),
                    after: Duration::from_millis(500),
                    event: None,
                });
            }
            status::set_at(
                w.now(),
                next.conditions_mut(),
                REMOVAL,
                true,
                "RemovalComplete",
                "the control plane was removed",
            );
            save(w, read, next).await?;
            w.release_finalizer(next).await?;
            Ok(Step::Done)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_holder_names_its_machine_and_no_other_holder_does() {
        let h = holder("prod", "cp-2");
        assert_eq!(holder_machine(&h), Some(("prod", "cp-2")));
        assert_eq!(
            holder_machine(&super::super::operation::holder("prod", "cp-2")),
            None
        );
        assert_eq!(holder_machine("someone else"), None);
    }
}

/// Tests that pin what mutation testing (`cargo mutants`) found the other tests let
/// through: one removal driven against a world that answers at once from a small cluster
/// of three control planes (cp-1 leaving), its calls and writes recorded.
#[cfg(test)]
mod mutant_tests {
    use super::*;
    use crate::runtime::exec::{Reply, run_now};
    use crate::runtime::objects::{REMOVAL_FINALIZER, TalosCluster};
    use k8s_openapi::jiff::Timestamp;
    use std::sync::Arc;

    /// How a node answers a reset.
    #[derive(Clone, Copy, PartialEq)]
    enum ResetAnswer {
        Done,
        Lost,
        Refused,
    }

    struct Fake {
        now: Timestamp,
        snapshot: Arc<Snapshot>,
        /// etcd's membership, as every sibling lists it.
        members: Vec<EtcdMember>,
        /// Machines (by name) whose node answers nothing.
        down: Vec<&'static str>,
        /// The member ID the node at a machine's endpoint answers as, when not its own.
        answers_as: Vec<(&'static str, u64)>,
        /// The leader every answering member sees.
        leader: u64,
        reset: ResetAnswer,
        drained: Drained,
        /// Other work holding the cluster lock.
        held_by: Option<String>,
        credentials: Result<(), String>,
        /// Every Talos call to cp-1's endpoint fails with this.
        fails: Option<fn() -> NodeError>,
        calls: Vec<(String, Call)>,
        locks: Vec<LockOp>,
        writes: Vec<TalosMachine>,
        released: Vec<TalosMachine>,
        events: Vec<(bool, String, String)>,
    }

    fn id_of(name: &str) -> u64 {
        name.trim_start_matches("cp-").parse::<u64>().unwrap_or(99) + 100
    }

    fn member(name: &str) -> EtcdMember {
        let id = id_of(name);
        EtcdMember {
            id,
            hostname: name.into(),
            peer_urls: vec![format!("https://10.0.0.{id}:2380")],
            client_urls: vec![],
            is_learner: false,
        }
    }

    fn status(member_id: u64, leader: u64) -> EtcdStatus {
        EtcdStatus {
            member_id,
            leader,
            protocol_version: "3.5".into(),
            db_size: 0,
            db_size_in_use: 0,
            raft_index: 0,
            raft_term: 0,
            raft_applied_index: 0,
            errors: vec![],
            is_learner: false,
        }
    }

    fn unreachable() -> NodeError {
        NodeError::Talos(TalosError::Unreachable {
            endpoint: "10.0.0.1:50000".into(),
            node: None,
            detail: "connection refused".into(),
        })
    }

    fn refused() -> NodeError {
        NodeError::Talos(TalosError::Failed {
            endpoint: "10.0.0.1:50000".into(),
            node: None,
            code: tonic::Code::FailedPrecondition,
            message: "no".into(),
        })
    }

    fn cluster(count: u32) -> TalosCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": "prod", "namespace": "default"},
            "spec": {"controlPlane": {"count": count}}
        }))
        .unwrap()
    }

    fn machine(name: &str) -> TalosMachine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": "default",
                         "finalizers": [REMOVAL_FINALIZER]},
            "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true,
                     "endpoint": format!("10.0.0.{}:50000", id_of(name))}
        }))
        .unwrap()
    }

    /// cp-1 being deleted, in a cluster of `machines` control planes declared `count`.
    fn departing() -> TalosMachine {
        let mut m = machine("cp-1");
        m.metadata.deletion_timestamp = Some(Time("2026-12-05T09:00:00Z".parse().unwrap()));
        m
    }

    impl Fake {
        fn new(machines: &[&str], count: u32) -> Fake {
            let mut all = vec![departing()];
            all.extend(
                machines
                    .iter()
                    .filter(|n| **n != "cp-1")
                    .map(|n| machine(n)),
            );
            Fake {
                now: "2026-12-05T10:00:00Z".parse().unwrap(),
                snapshot: Arc::new(Snapshot {
                    machines: all,
                    clusters: vec![cluster(count)],
                    ..Snapshot::default()
                }),
                members: machines.iter().map(|n| member(n)).collect(),
                down: vec![],
                answers_as: vec![],
                leader: id_of("cp-2"),
                reset: ResetAnswer::Done,
                drained: Drained::Done,
                held_by: None,
                credentials: Ok(()),
                fails: None,
                calls: vec![],
                locks: vec![],
                writes: vec![],
                released: vec![],
                events: vec![],
            }
        }

        /// The departing machine as the API server has it now.
        fn live(&self) -> TalosMachine {
            self.snapshot.machine("default", "cp-1").unwrap().clone()
        }

        fn set_live(&mut self, m: TalosMachine) {
            let mut s = (*self.snapshot).clone();
            for x in &mut s.machines {
                if x.name() == m.name() {
                    *x = m.clone();
                }
            }
            self.snapshot = Arc::new(s);
        }

        /// Edits the departing machine's removal record as the API server has it.
        fn edit_progress(&mut self, f: impl FnOnce(&mut RemovalProgress)) {
            let mut m = self.live();
            let mut p = progress(&m);
            f(&mut p);
            set_progress(&mut m, p);
            self.set_live(m);
        }

        /// The Talos calls that act (not the reads).
        fn acts(&self) -> Vec<(String, Call)> {
            self.calls
                .iter()
                .filter(|(_, c)| !c.reads_only())
                .cloned()
                .collect()
        }

        fn reason(&self) -> Option<String> {
            self.live().removal_reason().map(str::to_string)
        }

        fn message(&self) -> String {
            self.live()
                .condition(REMOVAL)
                .and_then(|c| c.message.clone())
                .unwrap_or_default()
        }
    }

    impl World for Fake {
        type Error = ();
        fn now(&self) -> Timestamp {
            self.now
        }
        async fn credentials(&mut self, _: &str) -> Result<(), String> {
            self.credentials.clone()
        }
        async fn talos(
            &mut self,
            _: &str,
            node: Node<'_>,
            call: Call,
        ) -> Result<Result<Reply, NodeError>, ()> {
            let name = match node {
                Node::Endpoint(m) | Node::Maintenance(m) => m.name().to_string(),
                Node::Via(_, host) => {
                    // A member that left etcd has no address there any more.
                    match self.members.iter().find(|m| peer_host_of(m) == host) {
                        Some(m) => m.hostname.clone(),
                        None => return Ok(Err(unreachable())),
                    }
                }
            };
            self.calls.push((name.clone(), call.clone()));
            if self.down.contains(&name.as_str()) {
                return Ok(Err(unreachable()));
            }
            if let (Some(f), Node::Endpoint(m)) = (self.fails, node)
                && m.name() == "cp-1"
            {
                return Ok(Err(f()));
            }
            let own = self
                .answers_as
                .iter()
                .find(|(n, _)| *n == name)
                .map_or_else(|| id_of(&name), |x| x.1);
            let member = self.members.iter().any(|m| m.id == own);
            Ok(match call {
                Call::Version => Ok(Reply::Version("v1.9.0".into())),
                Call::EtcdStatus if member => Ok(Reply::Status(status(own, self.leader))),
                Call::EtcdStatus => Err(refused()),
                Call::EtcdMemberList => Ok(Reply::Members(self.members.clone())),
                Call::EtcdForfeitLeadership => Ok(Reply::Done),
                Call::EtcdLeaveCluster => {
                    self.members.retain(|m| m.id != own);
                    Ok(Reply::Done)
                }
                Call::EtcdRemoveMemberById(id) => {
                    self.members.retain(|m| m.id != id);
                    Ok(Reply::Done)
                }
                Call::Reset { .. } => match self.reset {
                    ResetAnswer::Done => {
                        self.members.retain(|m| m.id != own);
                        Ok(Reply::Done)
                    }
                    ResetAnswer::Lost => Err(unreachable()),
                    ResetAnswer::Refused => Err(refused()),
                },
                _ => Err(refused()),
            })
        }
        async fn lock(&mut self, _: &str, op: LockOp) -> Result<Result<(), String>, ()> {
            self.locks.push(op);
            Ok(match (&self.held_by, op) {
                (Some(h), LockOp::Take) => Err(h.clone()),
                _ => Ok(()),
            })
        }
        async fn read(&mut self, _: &str, _: Reads) -> Result<Arc<Snapshot>, ()> {
            Ok(self.snapshot.clone())
        }
        async fn drain(&mut self, _: &str) -> Result<Result<Drained, String>, ()> {
            Ok(Ok(self.drained.clone()))
        }
        async fn write_status(
            &mut self,
            _: &TalosMachine,
            after: &TalosMachine,
        ) -> Result<Option<String>, ()> {
            self.writes.push(after.clone());
            let mut m = after.clone();
            m.metadata.resource_version = Some(self.writes.len().to_string());
            self.set_live(m);
            Ok(Some(self.writes.len().to_string()))
        }
        async fn release_finalizer(&mut self, m: &TalosMachine) -> Result<(), ()> {
            self.released.push(m.clone());
            Ok(())
        }
        async fn event(&mut self, _: &TalosMachine, warning: bool, reason: &str, note: String) {
            self.events.push((warning, reason.to_string(), note));
        }
        fn note(&mut self, _: &TalosMachine, _: Note<'_>) {}
    }

    fn peer_host_of(m: &EtcdMember) -> String {
        etcd::peer_host(m).unwrap_or_default()
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

    /// One reconcile of the departing machine as the API server has it now.
    fn once(w: &mut Fake, table: &Table) -> Outcome {
        let m = w.live();
        run_now(reconcile(w, table, &timing(), &m))
            .expect("an immediate world")
            .expect("no world error")
    }

    /// Reconciles until the finalizer goes or `n` reconciles passed.
    fn run(w: &mut Fake, table: &Table, n: usize) -> Vec<Outcome> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(once(w, table));
            if !w.released.is_empty() {
                break;
            }
        }
        out
    }

    fn shipped() -> Table {
        crate::ruleset::shipped_table()
    }

    /// The whole removal against this world: leave, reset, finalizer.
    #[test]
    fn a_healthy_removal_leaves_resets_and_releases() {
        let table = shipped();
        let mut w = Fake::new(&["cp-1", "cp-2", "cp-3", "cp-4"], 3);
        let outs = run(&mut w, &table, 10);
        assert_eq!(
            w.released.len(),
            1,
            "{outs:?} {:?} {}",
            w.reason(),
            w.message()
        );
        assert_eq!(
            w.acts(),
            vec![
                ("cp-1".to_string(), Call::EtcdLeaveCluster),
                ("cp-1".to_string(), Call::Reset { graceful: true }),
            ]
        );
    }

    fn four() -> Fake {
        Fake::new(&["cp-1", "cp-2", "cp-3", "cp-4"], 3)
    }

    fn later(w: &mut Fake, secs: i64) {
        w.now = w
            .now
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
            .unwrap();
    }

    fn resets(w: &Fake) -> usize {
        w.acts()
            .iter()
            .filter(|(_, c)| matches!(c, Call::Reset { .. }))
            .count()
    }

    /// Without Talos credentials a removal does not start (no lock, no call), and says so
    /// with one event; a removal that already began goes on.
    #[test]
    fn without_credentials_a_removal_does_not_start_but_a_begun_one_goes_on() {
        let table = shipped();
        let mut w = four();
        w.credentials = Err("no talosconfig Secret".into());
        let out = once(&mut w, &table);
        assert_eq!(
            out,
            requeue(timing().refused_requeue, on("NoTalosCredentials"))
        );
        assert!(w.locks.is_empty() && w.calls.is_empty(), "{:?}", w.calls);
        assert_eq!(w.reason().as_deref(), Some("NoTalosCredentials"));
        once(&mut w, &table);
        assert_eq!(w.events.len(), 1, "{:?}", w.events);
        assert!(w.events[0].0 && w.events[0].1 == "NoTalosCredentials");

        let mut w = four();
        w.credentials = Err("no talosconfig Secret".into());
        w.edit_progress(|p| p.done = vec!["lock cluster".into()]);
        once(&mut w, &table);
        assert_eq!(w.locks.first(), Some(&LockOp::Take));
        assert!(
            w.acts()
                .contains(&("cp-1".to_string(), Call::EtcdLeaveCluster))
        );
    }

    /// The lock held by other work is said in the condition, unless the rules refused the
    /// removal: that refusal stays what the condition says.
    #[test]
    fn a_lock_held_elsewhere_is_said_unless_the_removal_was_refused() {
        let table = shipped();
        let mut w = four();
        w.held_by = Some("operation prod/upgrade-1".into());
        let out = once(&mut w, &table);
        assert_eq!(out, requeue(timing().lock_retry, on("ClusterLockHeld")));
        assert_eq!(w.reason().as_deref(), Some("ClusterLockHeld"));
        assert!(
            w.message().contains("operation prod/upgrade-1"),
            "{}",
            w.message()
        );

        // A refusal, for the controller's default reason or any of the rules' own, stays.
        let owned: Vec<String> = table.rule_reasons().map(str::to_string).collect();
        assert!(!owned.is_empty(), "the shipped rules name reasons");
        for reason in std::iter::once("RemovalRefused".to_string()).chain(owned) {
            let mut w = four();
            w.held_by = Some("operation prod/upgrade-1".into());
            let mut m = w.live();
            status::set_at(
                w.now,
                m.conditions_mut(),
                REMOVAL,
                false,
                &reason,
                "refused",
            );
            w.set_live(m);
            let out = once(&mut w, &table);
            assert_eq!(out, requeue(timing().lock_retry, on("ClusterLockHeld")));
            assert!(w.writes.is_empty(), "{reason}");
            assert_eq!(w.reason().as_deref(), Some(reason.as_str()));
        }
    }

    /// A removal recorded for another cluster than the machine's now asks that cluster's
    /// etcd, and says why it stopped; it never goes on in the new cluster.
    #[test]
    fn a_removal_moved_to_another_cluster_stops_and_says_so() {
        let table = shipped();
        let mut w = four();
        w.edit_progress(|p| {
            p.cluster = Some("old".into());
            p.done = vec!["lock cluster".into(), "drain node".into()];
        });
        let out = once(&mut w, &table);
        assert_eq!(
            out,
            requeue(timing().refused_requeue, on("EtcdUnavailable"))
        );
        assert!(w.acts().is_empty() && w.locks.is_empty(), "{:?}", w.acts());
        assert!(
            w.message().starts_with(
                "the removal stopped after: lock cluster, drain node, because the machine was \
                 moved from TalosCluster old to prod"
            ),
            "{}",
            w.message()
        );
        assert!(w.released.is_empty());
    }

    /// A refusal says why `member.dead` did not bend it: alive, or cannot be told.
    #[test]
    fn a_refusal_says_why_the_member_is_not_taken_for_dead() {
        let table = shipped();
        let mut w = Fake::new(&["cp-1", "cp-2", "cp-3"], 3);
        let out = once(&mut w, &table);
        assert_eq!(out, requeue(timing().refused_requeue, Wait::Refused));
        assert_eq!(w.reason().as_deref(), Some("RemovalRefused"));
        assert!(
            w.message().contains("(its etcd member is not dead: "),
            "{}",
            w.message()
        );
        assert!(w.acts().is_empty());
        assert_eq!(w.locks, vec![LockOp::Take, LockOp::Release]);
        assert_eq!(w.events.len(), 1);
        once(&mut w, &table);
        assert_eq!(w.events.len(), 1, "said once: {:?}", w.events);

        let mut w = Fake::new(&["cp-1", "cp-2", "cp-3"], 3);
        w.answers_as = vec![("cp-1", id_of("cp-3"))];
        once(&mut w, &table);
        assert!(
            w.message().contains(
                "(whether its etcd member is dead cannot be told, so the refusal stays: "
            ),
            "{}",
            w.message()
        );
    }

    /// A dead member is removed through a sibling, by the ID it was judged by, with the
    /// plan's warning; nothing is sent to the dead node.
    #[test]
    fn a_dead_member_is_removed_by_id_through_a_sibling() {
        let table = shipped();
        let mut w = Fake::new(&["cp-1", "cp-2", "cp-3"], 3);
        w.down = vec!["cp-1"];
        run(&mut w, &table, 5);
        assert_eq!(w.released.len(), 1, "{:?} {}", w.reason(), w.message());
        assert_eq!(
            w.acts(),
            vec![(
                "cp-2".to_string(),
                Call::EtcdRemoveMemberById(id_of("cp-1"))
            )]
        );
        let p = w.released[0].removal_progress().cloned().unwrap();
        assert!(p.member_dead && p.committed);
        assert_eq!(p.member_id, Some(id_of("cp-1")));
        assert!(
            w.events
                .iter()
                .any(|(warn, r, _)| *warn && r == "DeadMemberRemoved")
        );
    }

    /// A blocked drain waits on the lock it keeps, and says so with one event; pods still
    /// terminating are looked at again soon.
    #[test]
    fn a_blocked_drain_keeps_the_lock_and_warns_once() {
        let table = shipped();
        let mut w = four();
        w.drained = Drained::Blocked {
            pod: "web-0".into(),
            message: "PodDisruptionBudget".into(),
        };
        let out = once(&mut w, &table);
        assert_eq!(out, requeue(timing().drain_retry, on("DrainFailed")));
        assert_eq!(w.locks, vec![LockOp::Take, LockOp::Keep]);
        assert_eq!(w.events.len(), 1, "said when it begins: {:?}", w.events);
        let removal = |m: &TalosMachine| status::find(m.conditions(), REMOVAL).cloned();
        let since = removal(&w.live()).and_then(|c| c.last_transition_time);
        assert!(since.is_some());
        let written = w.writes.len();
        later(&mut w, 30);
        once(&mut w, &table);
        let warned: Vec<_> = w.events.iter().filter(|e| e.1 == "DrainFailed").collect();
        assert_eq!(warned.len(), 1, "{:?}", w.events);
        assert!(w.acts().is_empty());
        // The retry never says "in progress" in between: the condition stays False, and
        // since the drain first failed.
        for m in &w.writes[written..] {
            let c = removal(m).expect("the condition");
            assert_eq!(
                (c.status.as_str(), c.reason.as_deref()),
                ("False", Some("DrainFailed")),
                "{c:?}"
            );
        }
        let c = removal(&w.live()).expect("the condition");
        assert_eq!(c.last_transition_time, since, "{c:?}");

        w.drained = Drained::Waiting { remaining: 2 };
        let out = once(&mut w, &table);
        assert_eq!(out, requeue(Duration::from_secs(2), on("Draining")));
        // Once the drain is done, the removal says it is in progress again.
        w.drained = Drained::Done;
        w.released.clear();
        let before = w.writes.len();
        run(&mut w, &table, 5);
        assert!(
            w.writes[before..].iter().any(|m| removal(m).is_some_and(
                |c| c.status == "True" && c.reason.as_deref() == Some("RemovalInProgress")
            )),
            "{:?}",
            w.writes[before..].iter().map(removal).collect::<Vec<_>>()
        );
        assert_eq!(w.released.len(), 1);
    }

    /// The node at spec.endpoint must be the member that leaves: another answering there is
    /// never sent the leave.
    #[test]
    fn an_endpoint_answering_as_another_member_is_not_sent_the_leave() {
        let table = shipped();
        let mut w = four();
        w.answers_as = vec![("cp-1", id_of("cp-3"))];
        let out = once(&mut w, &table);
        assert_eq!(
            out,
            requeue(timing().refused_requeue, on("EndpointIdentityMismatch"))
        );
        assert!(w.acts().is_empty(), "{:?}", w.acts());
        assert!(
            w.message().contains("as etcd member cp-3, not cp-1"),
            "{}",
            w.message()
        );
        // The member was recorded before the call.
        assert_eq!(
            w.live().removal_progress().and_then(|p| p.member_id),
            Some(id_of("cp-1"))
        );
    }

    /// The leader forfeits its leadership before it leaves; a follower is not asked to.
    #[test]
    fn only_the_leader_forfeits_leadership() {
        let table = shipped();
        let mut w = four();
        w.leader = id_of("cp-1");
        run(&mut w, &table, 5);
        assert_eq!(
            w.acts(),
            vec![
                ("cp-1".to_string(), Call::EtcdForfeitLeadership),
                ("cp-1".to_string(), Call::EtcdLeaveCluster),
                ("cp-1".to_string(), Call::Reset { graceful: true }),
            ]
        );
        let mut w = four();
        w.leader = 0;
        once(&mut w, &table);
        assert!(
            !w.acts()
                .contains(&("cp-1".to_string(), Call::EtcdForfeitLeadership)),
            "{:?}",
            w.acts()
        );
    }

    /// A reset whose answer was lost is not sent again while the node may be going down
    /// (`reset_settle`), is sent again once that passed and the node still answers, and is
    /// taken as done once the node stops answering.
    #[test]
    fn a_reset_with_a_lost_answer_is_sent_again_only_after_it_settles() {
        let table = shipped();
        let mut w = four();
        w.reset = ResetAnswer::Lost;
        let out = once(&mut w, &table);
        assert_eq!(out, requeue(timing().drain_retry, on("NodeUnreachable")));
        assert_eq!(resets(&w), 1);
        let out = once(&mut w, &table);
        assert_eq!(out, requeue(Duration::from_millis(500), on("Resetting")));
        later(&mut w, 59);
        once(&mut w, &table);
        assert_eq!(resets(&w), 1, "not again before it settled");
        later(&mut w, 1);
        once(&mut w, &table);
        assert_eq!(resets(&w), 2, "sent again once it settled");
        w.down = vec!["cp-1"];
        run(&mut w, &table, 3);
        assert_eq!(w.released.len(), 1);
        assert_eq!(resets(&w), 2);
    }

    /// A reset the node refused is forgotten: the next reconcile sends it again at once.
    #[test]
    fn a_refused_reset_is_sent_again_at_once() {
        let table = shipped();
        let mut w = four();
        w.reset = ResetAnswer::Refused;
        let out = once(&mut w, &table);
        assert_eq!(out, requeue(timing().drain_retry, on("TalosFailed")));
        assert_eq!(w.live().removal_progress().unwrap().started, None);
        once(&mut w, &table);
        assert_eq!(resets(&w), 2);
    }

    /// Why a Talos call failed is the condition's reason.
    #[test]
    fn a_failed_talos_call_is_said_by_its_kind() {
        let table = shipped();
        for (fails, reason) in [
            (unreachable as fn() -> NodeError, "NodeUnreachable"),
            (
                || NodeError::NoCredentials("gone".into()),
                "NoTalosCredentials",
            ),
            (refused, "TalosFailed"),
        ] {
            let mut w = four();
            w.fails = Some(fails);
            let out = once(&mut w, &table);
            assert_eq!(out, requeue(timing().drain_retry, on(reason)));
            assert!(
                w.message().starts_with("etcd forfeit-leadership: "),
                "{}",
                w.message()
            );
        }
    }

    /// A reset inferred from silence is checked before the finalizer goes: a node that
    /// answers again is reset again, then released.
    #[test]
    fn an_inferred_reset_of_a_node_that_answers_is_sent_again() {
        let table = shipped();
        let mut w = four();
        w.edit_progress(|p| {
            p.done = [
                "lock cluster",
                "drain node",
                "etcd forfeit-leadership",
                "etcd leave",
                "talos reset",
            ]
            .map(String::from)
            .to_vec();
            p.committed = true;
            p.cluster = Some("prod".into());
            p.member = Some("cp-1".into());
        });
        let out = once(&mut w, &table);
        assert_eq!(
            out,
            requeue(Duration::from_millis(500), on("ResetDidNotTake"))
        );
        assert!(w.released.is_empty());
        assert!(
            !w.live()
                .removal_progress()
                .unwrap()
                .done
                .contains(&"talos reset".to_string())
        );
        once(&mut w, &table);
        assert_eq!(resets(&w), 1);
        assert_eq!(w.released.len(), 1);
        let done = &w.released[0].removal_progress().unwrap().done;
        assert_eq!(done.last().map(String::as_str), Some("talos reset"));
        assert_eq!(w.released[0].removal_reason(), Some("RemovalComplete"));
    }

    /// A cluster torn down after its node was reset: the wipe is not sent to a node that is
    /// gone.
    #[test]
    fn a_teardown_after_a_reset_does_not_wipe() {
        let table = shipped();
        let mut w = four();
        w.down = vec!["cp-1"];
        let mut s = (*w.snapshot).clone();
        s.clusters[0].metadata.deletion_timestamp = Some(Time(w.now));
        w.snapshot = Arc::new(s);
        w.edit_progress(|p| {
            p.done = [
                "lock cluster",
                "drain node",
                "etcd forfeit-leadership",
                "etcd leave",
                "talos reset",
            ]
            .map(String::from)
            .to_vec();
            p.committed = true;
        });
        once(&mut w, &table);
        assert!(w.acts().is_empty(), "{:?}", w.acts());
        assert_eq!(w.released.len(), 1);
    }

    fn with_hostname(w: &mut Fake, name: &str, hostname: &str) {
        let mut s = (*w.snapshot).clone();
        for m in &mut s.machines {
            if m.name() == name {
                m.spec.hostname = Some(hostname.into());
            }
        }
        w.snapshot = Arc::new(s);
    }

    fn add_machine(w: &mut Fake, namespace: &str, cluster: &str, name: &str, hostname: &str) {
        let mut m = machine(name);
        m.metadata.namespace = Some(namespace.into());
        m.spec.cluster_ref.name = cluster.into();
        m.spec.hostname = Some(hostname.into());
        let mut s = (*w.snapshot).clone();
        s.machines.push(m);
        w.snapshot = Arc::new(s);
    }

    /// A node name etcd does not list: the node at spec.endpoint says which member it is,
    /// unless another machine of the cluster is named as that member.
    #[test]
    fn a_member_under_another_name_is_found_by_what_its_node_answers() {
        let table = shipped();
        let mut w = four();
        with_hostname(&mut w, "cp-1", "node-a");
        // Named cp-1, but in another namespace or cluster: not this cluster's.
        add_machine(&mut w, "other", "prod", "x-1", "cp-1");
        add_machine(&mut w, "default", "staging", "x-2", "cp-1");
        run(&mut w, &table, 5);
        assert_eq!(w.released.len(), 1, "{:?} {}", w.reason(), w.message());
        assert!(
            w.acts()
                .contains(&("cp-1".to_string(), Call::EtcdLeaveCluster))
        );

        let mut w = four();
        with_hostname(&mut w, "cp-1", "node-a");
        add_machine(&mut w, "default", "prod", "x-3", "cp-1");
        let out = once(&mut w, &table);
        assert_eq!(
            out,
            requeue(timing().refused_requeue, on("EtcdMemberNotFound"))
        );
        assert!(
            w.message().contains("which is another machine's"),
            "{}",
            w.message()
        );
        assert!(w.acts().is_empty());
    }

    /// A node whose etcd does not run is no member: nothing to leave. A node that does not
    /// answer tells nothing: the removal waits.
    #[test]
    fn a_node_without_etcd_is_no_member_and_a_silent_one_tells_nothing() {
        let table = shipped();
        let before_leave = |p: &mut RemovalProgress| {
            p.done = ["lock cluster", "drain node", "etcd forfeit-leadership"]
                .map(String::from)
                .to_vec();
        };
        let mut w = four();
        with_hostname(&mut w, "cp-1", "node-a");
        w.answers_as = vec![("cp-1", 999)];
        w.edit_progress(before_leave);
        run(&mut w, &table, 5);
        assert_eq!(w.released.len(), 1, "{:?} {}", w.reason(), w.message());
        assert!(!w.acts().iter().any(|(_, c)| *c == Call::EtcdLeaveCluster));

        let mut w = four();
        with_hostname(&mut w, "cp-1", "node-a");
        w.fails = Some(unreachable);
        w.edit_progress(before_leave);
        let out = once(&mut w, &table);
        assert_eq!(
            out,
            requeue(timing().refused_requeue, on("EtcdMemberNotFound"))
        );
        assert!(w.acts().is_empty());

        // No sibling to tell whether it is a member (past the decision, which would have
        // refused): nothing is sent either.
        let mut w = four();
        w.leader = 0;
        w.edit_progress(|p| {
            before_leave(p);
            p.committed = true;
        });
        let out = once(&mut w, &table);
        assert_eq!(out, requeue(timing().drain_retry, on("EtcdUnavailable")));
        assert!(
            w.message().starts_with("etcd leave: no healthy sibling"),
            "{}",
            w.message()
        );
        assert!(w.acts().is_empty());
    }

    fn unapprove(w: &mut Fake) {
        let mut m = w.live();
        m.spec.approved = false;
        w.set_live(m);
    }

    /// A machine no longer an approved control plane whose removal never began: its
    /// finalizer goes once etcd does not list its member (by the ID a removal recorded,
    /// else by its node name), and the lock is never taken for it.
    #[test]
    fn an_unapproved_machine_goes_only_once_etcd_does_not_list_it() {
        let table = shipped();
        let mut w = four();
        unapprove(&mut w);
        let out = once(&mut w, &table);
        assert_eq!(
            out,
            requeue(timing().refused_requeue, on("StillEtcdMember"))
        );
        assert!(w.locks.is_empty() && w.acts().is_empty());
        assert!(w.released.is_empty());
        assert!(
            w.message().starts_with(
                "cp-1 is no longer an approved control plane, but etcd (through cp-2)"
            ),
            "{}",
            w.message()
        );

        let mut w = four();
        unapprove(&mut w);
        w.members.retain(|m| m.hostname != "cp-1");
        assert_eq!(once(&mut w, &table), Outcome::AwaitChange);
        assert_eq!(w.released.len(), 1);
        assert!(w.locks.is_empty());

        // Recorded by ID: a member of that ID under another name is still it; the name
        // alone is not.
        let mut w = four();
        unapprove(&mut w);
        w.members[0].hostname = "renamed".into();
        w.edit_progress(|p| {
            p.member_id = Some(id_of("cp-1"));
            p.done = vec!["lock cluster".into()];
        });
        once(&mut w, &table);
        assert!(w.released.is_empty());
        assert_eq!(w.reason().as_deref(), Some("StillEtcdMember"));
        assert!(
            w.message().starts_with(
                "the removal stopped after: lock cluster, because the machine is no longer"
            ),
            "{}",
            w.message()
        );
        let mut w = four();
        unapprove(&mut w);
        w.members[0].id = 7;
        w.edit_progress(|p| {
            p.member_id = Some(id_of("cp-1"));
            p.done = vec!["lock cluster".into()];
        });
        once(&mut w, &table);
        assert_eq!(w.released.len(), 1);

        // No sibling to ask: the finalizer stays, and that is said.
        let mut w = four();
        unapprove(&mut w);
        w.leader = 0;
        once(&mut w, &table);
        assert!(w.released.is_empty());
        assert_eq!(w.reason().as_deref(), Some("EtcdUnavailable"));

        // Its cluster being torn down: it goes without asking.
        let mut w = four();
        unapprove(&mut w);
        let mut s = (*w.snapshot).clone();
        s.clusters[0].metadata.deletion_timestamp = Some(Time(w.now));
        w.snapshot = Arc::new(s);
        once(&mut w, &table);
        assert_eq!(w.released.len(), 1);
        assert!(w.calls.is_empty());
    }

    /// A dead-member removal whose member is gone from etcd (the remove-member landed, its
    /// answer lost) is still a dead-member removal when it decides again, whatever its
    /// condition says now: it is not refused below the declared count.
    #[test]
    fn a_dead_member_removal_recorded_in_progress_is_not_refused_once_the_member_is_gone() {
        let table = shipped();
        let mut w = Fake::new(&["cp-1", "cp-2", "cp-3"], 3);
        w.down = vec!["cp-1"];
        w.members.retain(|m| m.hostname != "cp-1");
        w.edit_progress(|p| {
            p.member_dead = true;
            p.member_id = Some(id_of("cp-1"));
            p.done = vec!["lock cluster".into()];
            p.cluster = Some("prod".into());
            p.member = Some("cp-1".into());
        });
        let mut m = w.live();
        status::set_at(
            w.now,
            m.conditions_mut(),
            REMOVAL,
            false,
            "TalosFailed",
            "etcd remove-member: no answer",
        );
        w.set_live(m);
        run(&mut w, &table, 5);
        assert_eq!(w.released.len(), 1, "{:?} {}", w.reason(), w.message());
        assert!(w.acts().is_empty(), "{:?}", w.acts());
        assert!(!w.events.iter().any(|e| e.1 == "RemovalRefused"));
    }

    /// A removal moved to another cluster asks the etcd of the cluster it recorded, about
    /// the member name it recorded (not what the spec says now).
    #[test]
    fn a_moved_removal_asks_the_recorded_cluster_about_the_recorded_member() {
        let table = shipped();
        let mut w = four();
        add_machine(&mut w, "default", "old", "cp-9", "cp-9");
        w.members = vec![member("node-x"), member("cp-9")];
        w.edit_progress(|p| {
            p.cluster = Some("old".into());
            p.member = Some("node-x".into());
            p.done = vec!["lock cluster".into()];
        });
        let out = once(&mut w, &table);
        assert_eq!(
            out,
            requeue(timing().refused_requeue, on("StillEtcdMember"))
        );
        assert!(
            w.message()
                .contains("etcd (through cp-9) still lists its member node-x"),
            "{}",
            w.message()
        );
        assert!(w.released.is_empty());
        w.members.retain(|m| m.hostname != "node-x");
        assert_eq!(once(&mut w, &table), Outcome::AwaitChange);
        assert_eq!(w.released.len(), 1);
    }

    /// Only a plan's Warning event step warns (what the model reads of a removal's past
    /// steps).
    #[test]
    fn only_a_warning_event_step_warns() {
        let table = shipped();
        let plan = table
            .plan(Verb::Remove, Subject::ControlPlane)
            .expect("the shipped removal plan");
        let warning: Vec<&str> = plan
            .steps
            .iter()
            .filter(|s| warns(s))
            .map(|s| s.text.as_str())
            .collect();
        assert_eq!(warning, vec!["event warning DeadMemberRemoved"]);
        let mut normal = plan.steps[0].clone();
        normal.action = BuiltIn::EventNormal;
        assert!(!warns(&normal));
    }

    /// The member a remove-member acts on is recorded before the call, when the removal
    /// had not recorded it yet.
    #[test]
    fn a_remove_member_records_its_member_before_the_call() {
        let table = shipped();
        let mut w = Fake::new(&["cp-1", "cp-2", "cp-3"], 3);
        w.down = vec!["cp-1"];
        w.edit_progress(|p| {
            p.member_dead = true;
            p.committed = true;
            p.done = vec!["lock cluster".into()];
        });
        run(&mut w, &table, 5);
        assert_eq!(w.released.len(), 1, "{:?} {}", w.reason(), w.message());
        assert_eq!(
            w.acts(),
            vec![(
                "cp-2".to_string(),
                Call::EtcdRemoveMemberById(id_of("cp-1"))
            )]
        );
        let recorded = w
            .writes
            .iter()
            .find_map(|m| m.removal_progress()?.member_id);
        assert_eq!(recorded, Some(id_of("cp-1")));
    }
}
