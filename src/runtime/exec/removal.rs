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
        if m.removal_reason() == Some("RemovalRefused") {
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
        status::set_at(
            w.now(),
            next.conditions_mut(),
            REMOVAL,
            true,
            reason,
            &message,
        );
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
                set_progress(&mut next, p.clone());
                save(w, live, &mut next).await?;
            }
            Step::Wait {
                reason,
                message,
                after,
                event,
            } => {
                let began = next.removal_reason() != Some(reason);
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
