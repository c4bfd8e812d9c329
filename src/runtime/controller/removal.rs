//! The removal of an approved control plane (ADR 0010, 0106, 0137).
//!
//! On deletion of a machine with the removal finalizer: take the cluster lock through
//! [`disruptive::hold`] (the same work resumes its own lock; held by other work -> wait
//! and retry), recount live under the lock, decide the `remove controlplane` rules at the
//! controller site (asking etcd through a healthy sibling whether the member is dead, only
//! when a rule needs it), then run the plan's steps in order. Each finished step is
//! recorded in `status.removal`, so a controller that restarts at any step resumes there.
//! Once the member has left etcd the removal is committed and finishes without deciding
//! again. A Talos reset that was started is never sent a second time.

use super::disruptive::{self, Held, Refused, Work};
use super::drain::{self, Drained};
use super::nodes::{self, NodeError};
use super::status::{self, Conditions};
use super::{Context, ReconcileError, finalizer, held};
use crate::compile::PlanStep;
use crate::interp::Decision;
use crate::runtime::decide::reconcile_machine_event;
use crate::runtime::facts::Expensive;
use crate::runtime::live::Reads;
use crate::runtime::objects::{RemovalProgress, Role, Snapshot, TalosMachine};
use crate::runtime::talos::TalosError;
use crate::vocab::{Action as BuiltIn, Fact, Verb, Verdict};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use std::time::Duration;

const REMOVAL: &str = "Removal";

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

/// The removal's decisions without I/O (`verify`'s model calls them as the controller does).
pub use super::plan::{applies, decide};

pub async fn run(ctx: &Context, m: &TalosMachine) -> Result<Action, ReconcileError> {
    let (ns, name, cluster) = (m.namespace(), m.name(), m.cluster());
    let mut p = progress(m);
    // Moved to another cluster after its removal began (past admission): its member is in
    // the etcd of the cluster the removal recorded, and the finalizer goes only once that
    // etcd no longer lists it.
    if p.cluster.as_deref().is_some_and(|c| c != cluster) {
        let stopped = format!(
            "the removal stopped after: {}, because the machine was moved from TalosCluster {} to {cluster}",
            if p.done.is_empty() {
                "nothing".to_string()
            } else {
                p.done.join(", ")
            },
            p.cluster.as_deref().unwrap_or_default()
        );
        return release_if_not_member_after(ctx, m, Some(&stopped)).await;
    }
    // Not an approved control plane any more (un-approved or re-roled after it got the
    // finalizer), and no removal started: the finalizer goes once etcd shows it is not a
    // member. A member left behind would stay in etcd's quorum while nothing counts it.
    if m.approved_role() != Some(Role::ControlPlane) && !p.committed && p.done.is_empty() {
        return release_if_not_member(ctx, m).await;
    }
    let Some(table) = ctx.rules.current() else {
        return Err(ReconcileError::NoRules);
    };
    let mut next = m.clone();
    // Every removal needs the Talos API (leave, remove-member, reset or wipe), with this
    // cluster's own credentials (read live, once per reconcile). Without them it would
    // drain the node and then stop: it does not start.
    let dialer = nodes::Dialer::for_machine(ctx, m).await;
    if let Some(why) = dialer.missing()
        && p.done.is_empty()
    {
        let msg = format!(
            "{why}; the removal does not start without them: it would drain the node and then \
             stop before etcd"
        );
        if status::set(
            next.conditions_mut(),
            REMOVAL,
            false,
            "NoTalosCredentials",
            &msg,
        ) {
            ctx.event(m, true, "NoTalosCredentials", msg.clone()).await;
        }
        status::write(&ctx.client, m, &next).await?;
        return Ok(Action::requeue(ctx.settings.refused_requeue));
    }

    // 1. The cluster lock.
    let work = Work::RemoveControlPlane {
        namespace: ns,
        machine: name,
    };
    let held_lock = match disruptive::hold(ctx, ns, cluster, work).await? {
        Ok(h) => h,
        Err(Refused::Held { holder }) => {
            // A removal the rules refused keeps saying why: the lock held by other work is
            // not news to the person who has to approve a replacement.
            if next.removal_reason() == Some("RemovalRefused") {
                return Ok(Action::requeue(ctx.settings.lock_retry));
            }
            let msg = format!("waiting for the cluster lock, held by {holder}");
            status::set(
                next.conditions_mut(),
                REMOVAL,
                false,
                "ClusterLockHeld",
                &msg,
            );
            status::write(&ctx.client, m, &next).await?;
            return Ok(Action::requeue(ctx.settings.lock_retry));
        }
    };

    // 2. Recount live, under the lock.
    let reads = Reads {
        machines: true,
        clusters: true,
        operations: true,
    };
    let snapshot = ctx.reader.snapshot(ns, &[cluster], reads).await?;
    let Some(live) = snapshot.machine(ns, name) else {
        held_lock.release().await?;
        return Ok(Action::await_change());
    };
    let Some(ev) = reconcile_machine_event(live).filter(|e| e.event.0 == Verb::Remove) else {
        // No longer an approved control plane but the removal had begun: finish it.
        return finish_without_rules(ctx, live, p, held_lock).await;
    };
    next = live.clone();
    // What the API server holds of the status: each write compares with it.
    let mut written = live.clone();

    // 3. Decide, unless the removal is committed (the member already left etcd).
    if !p.committed {
        let mut dead = None;
        let mut deadness: Option<nodes::Deadness> = None;
        let mut supplied: Vec<(Fact, i64)> = Vec::new();
        let decision = loop {
            match decide(&table, &snapshot, ev, &supplied) {
                Ok(d) => break d,
                Err(Fact::MemberDead) if dead.is_none() => {
                    // Asked again at every decision until the removal commits: a member
                    // that answers again is not removed below the count.
                    let marked = live.dead_member_removal_marked() || p.member_dead;
                    let (found, id) =
                        nodes::member_dead_with_id(&dialer, &snapshot, live, marked).await;
                    if found.is_dead() && p.member_id.is_none() {
                        p.member_id = id;
                    }
                    let is_dead = found.is_dead();
                    tracing::info!(machine = %format!("{ns}/{name}"), dead = is_dead, why = %found.why(), "etcd member checked");
                    dead = Some(is_dead);
                    supplied.push((Fact::MemberDead, i64::from(is_dead)));
                    deadness = Some(found);
                }
                Err(f @ (Fact::HealthyAfter | Fact::MembersAfter))
                    if !supplied.iter().any(|(s, _)| *s == f) =>
                {
                    let counted = if f == Fact::HealthyAfter {
                        nodes::healthy_after(&dialer, &snapshot, live).await
                    } else {
                        nodes::members_after(&dialer, &snapshot, live).await
                    };
                    match counted {
                        Ok(n) => {
                            tracing::info!(machine = %format!("{ns}/{name}"), fact = %f, value = n, "etcd members counted");
                            supplied.push((f, n));
                        }
                        Err(why) => {
                            // Refused; the other rules' reasons as the objects show them.
                            let (mut d, _) = crate::runtime::decide::decide_events(
                                &table,
                                &snapshot,
                                &[ev],
                                Expensive::FromObjects,
                                false,
                            );
                            d.refusals.push(crate::interp::Finding {
                                rule: "(live state)".into(),
                                verdict: Verdict::Refuse,
                                message: format!(
                                    "the etcd members cannot be counted (`{f}`), so the removal waits: {why}"
                                ),
                                reason: Some("RemovalRefused".into()),
                            });
                            break d;
                        }
                    }
                }
                Err(f) => {
                    let mut d = Decision::default();
                    d.refusals.push(crate::interp::Finding {
                        rule: "(live state)".into(),
                        verdict: Verdict::Refuse,
                        message: format!("the fact `{f}` could not be read, so the removal waits"),
                        reason: Some("RemovalRefused".into()),
                    });
                    break d;
                }
            }
        };
        if let Some((reason, mut message)) = held(ctx, &decision, "RemovalRefused") {
            // Why `member.dead` did not bend the refusal, when it was asked (ADR 0106 §4:
            // what cannot be told leaves the refusal in place, and says so).
            match &deadness {
                Some(nodes::Deadness::CannotTell(why)) => message.push_str(&format!(
                    " (whether its etcd member is dead cannot be told, so the refusal stays: {why})"
                )),
                Some(nodes::Deadness::Alive(why)) => {
                    message.push_str(&format!(" (its etcd member is not dead: {why})"))
                }
                _ => {}
            }
            held_lock.release().await?;
            let changed = status::set(next.conditions_mut(), REMOVAL, false, &reason, &message);
            status::write(&ctx.client, live, &next).await?;
            if changed {
                tracing::info!(machine = %format!("{ns}/{name}"), %message, "removal refused");
                ctx.event(live, true, "RemovalRefused", message).await;
            }
            return Ok(Action::requeue(ctx.settings.refused_requeue));
        }
        p.member_dead = dead.unwrap_or(p.member_dead);
        // Whose etcd, and which member: recorded once, so later edits of the machine's
        // spec cannot point the rest of the removal elsewhere.
        p.cluster.get_or_insert_with(|| cluster.to_string());
        p.member
            .get_or_insert_with(|| nodes::node_name(live).to_string());
        let (reason, message) = if p.member_dead {
            (
                "DeadMemberRemoval",
                "removing a control plane whose etcd member is dead".to_string(),
            )
        } else {
            (
                "RemovalInProgress",
                "removing the control plane: the removal rules let it through".to_string(),
            )
        };
        status::set(next.conditions_mut(), REMOVAL, true, reason, &message);
        set_progress(&mut next, p.clone());
        save(ctx, &mut written, &mut next).await?;
    }

    // 4. The plan.
    let Some(plan) = table.plan(Verb::Remove, crate::vocab::Subject::ControlPlane) else {
        held_lock.release().await?;
        let msg = "the rules have no `plan remove controlplane`; nothing is removed until they do";
        status::set(next.conditions_mut(), REMOVAL, false, "NoPlan", msg);
        status::write(&ctx.client, live, &next).await?;
        return Ok(Action::requeue(ctx.settings.refused_requeue));
    };
    for step in &plan.steps {
        if p.done.iter().any(|d| d == &step.text) {
            continue;
        }
        let guard_facts = [(Fact::MemberDead, i64::from(p.member_dead))];
        let (runs, message) = match applies(&table, &snapshot, ev, &guard_facts, step) {
            Ok(x) => x,
            Err(why) => {
                held_lock.release().await?;
                status::set(
                    next.conditions_mut(),
                    REMOVAL,
                    false,
                    "RemovalRefused",
                    &why,
                );
                save(ctx, &mut written, &mut next).await?;
                return Ok(Action::requeue(ctx.settings.refused_requeue));
            }
        };
        if !runs {
            continue;
        }
        let mut rec = Record {
            written: &mut written,
            next: &mut next,
            p: &mut p,
        };
        let outcome = execute(&dialer, &snapshot, live, &mut rec, step, message).await?;
        match outcome {
            Step::Done => {
                p.done.push(step.text.clone());
                p.started = None;
                p.started_at = None;
                set_progress(&mut next, p.clone());
                save(ctx, &mut written, &mut next).await?;
            }
            Step::Wait {
                reason,
                message,
                after,
                event,
            } => {
                let began = next.removal_reason() != Some(reason);
                status::set(next.conditions_mut(), REMOVAL, false, reason, &message);
                set_progress(&mut next, p.clone());
                save(ctx, &mut written, &mut next).await?;
                if began && let Some((ev_reason, note)) = event {
                    ctx.event(live, true, ev_reason, note).await;
                }
                // The lock stays ours (the work resumes it); the renewal stops with this
                // reconcile, and the next one renews it again.
                held_lock.keep();
                return Ok(Action::requeue(after));
            }
        }
    }
    held_lock.release().await?;
    tracing::info!(machine = %format!("{ns}/{name}"), "control plane removed");
    Ok(Action::await_change())
}

async fn release_if_not_member(ctx: &Context, m: &TalosMachine) -> Result<Action, ReconcileError> {
    release_if_not_member_after(ctx, m, None).await
}

/// Releases the removal finalizer of a machine that is not an approved control plane only
/// when etcd, read through a healthy sibling, does not list its member (or its cluster is
/// being torn down). `stopped`: what a removal that had begun did before it stopped, said
/// in the condition while the finalizer stays.
async fn release_if_not_member_after(
    ctx: &Context,
    m: &TalosMachine,
    stopped: Option<&str>,
) -> Result<Action, ReconcileError> {
    // The cluster and member a begun removal recorded, not what the spec says now: the
    // machine may have been moved or renamed after its removal began.
    let asked = as_recorded(m);
    let reads = Reads {
        machines: true,
        clusters: true,
        operations: false,
    };
    let snapshot = ctx
        .reader
        .snapshot(asked.namespace(), &[asked.cluster()], reads)
        .await?;
    // A cluster being torn down goes with its etcd: a member left behind there holds
    // nothing up, and waiting for it would keep the teardown from ending.
    if snapshot
        .cluster(asked.namespace(), asked.cluster())
        .is_some_and(|c| c.deleting())
    {
        finalizer::set_removal(ctx, m, false).await?;
        return Ok(Action::await_change());
    }
    let member = nodes::node_name(&asked);
    let dialer = nodes::Dialer::for_cluster(
        ctx,
        asked.namespace(),
        asked.cluster(),
        snapshot.cluster(asked.namespace(), asked.cluster()),
    )
    .await;
    // The member as this removal recorded it (its etcd ID), else by its node name.
    let recorded_id = m.removal_progress().and_then(|p| p.member_id);
    let (reason, message) = match nodes::healthy_sibling(&dialer, &snapshot, &asked).await {
        Ok(s)
            if recorded_id.map_or_else(
                || s.member(member).is_none(),
                |id| s.member_by_id(id).is_none(),
            ) =>
        {
            finalizer::set_removal(ctx, m, false).await?;
            return Ok(Action::await_change());
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
    status::set(next.conditions_mut(), REMOVAL, false, reason, &message);
    status::write(&ctx.client, m, &next).await?;
    Ok(Action::requeue(ctx.settings.refused_requeue))
}

/// The machine as its removal recorded it (the cluster and the member name, when a removal
/// began): whom to ask etcd about.
fn as_recorded(m: &TalosMachine) -> TalosMachine {
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

/// The machine stopped being an approved control plane mid-removal (someone edited it past
/// admission, or the rules let it): its finalizer goes only once etcd says the member is
/// gone ([`release_if_not_member`]), never on the edit alone. Until then it stays, with a
/// condition saying what was done and what to do.
async fn finish_without_rules(
    ctx: &Context,
    live: &TalosMachine,
    p: RemovalProgress,
    held_lock: Held,
) -> Result<Action, ReconcileError> {
    held_lock.release().await?;
    let done = if p.done.is_empty() {
        "nothing".to_string()
    } else {
        p.done.join(", ")
    };
    let stopped = format!(
        "the removal stopped after: {done}, because the machine is no longer an approved control plane"
    );
    release_if_not_member_after(ctx, live, Some(&stopped)).await
}

/// The status as last written, the status being built, and the removal's progress.
struct Record<'r> {
    written: &'r mut TalosMachine,
    next: &'r mut TalosMachine,
    p: &'r mut RemovalProgress,
}

/// Writes the status when it differs from what was written last, and keeps the
/// resourceVersion the write made (a later finalizer patch is guarded by it).
async fn save(
    ctx: &Context,
    written: &mut TalosMachine,
    next: &mut TalosMachine,
) -> Result<(), ReconcileError> {
    if let Some(version) = status::write(&ctx.client, written, next).await? {
        next.metadata.resource_version = Some(version);
    }
    *written = next.clone();
    Ok(())
}

/// The removal's member in a sibling's list.
enum Found<'s> {
    /// Listed: by the ID this removal recorded, else by the machine's node name.
    Listed(&'s crate::runtime::talos::EtcdMember),
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
fn find_member<'s>(
    sibling: &'s nodes::Sibling<'_>,
    p: &RemovalProgress,
    member: &str,
) -> Found<'s> {
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
    status: &Result<crate::runtime::talos::EtcdStatus, crate::runtime::talos::TalosError>,
    sibling: &'s nodes::Sibling<'_>,
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
                        && nodes::node_name(o) == m.hostname
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
        Err(crate::runtime::talos::TalosError::Failed { .. }) => Found::Gone,
        Err(_) => Found::Unknown(why),
    }
}

/// The node at spec.endpoint answers as another etcd member than the removal's: nothing
/// is sent to it.
fn identity_wait(
    ctx: &Context,
    member: &str,
    want: u64,
    got: u64,
    sibling: &nodes::Sibling<'_>,
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
        after: ctx.settings.refused_requeue,
        event: None,
    }
}

fn talos_wait(ctx: &Context, step: &PlanStep, e: NodeError) -> Step {
    let reason = match e {
        NodeError::Talos(TalosError::Unreachable { .. }) => "NodeUnreachable",
        NodeError::NoCredentials(_) => "NoTalosCredentials",
        _ => "TalosFailed",
    };
    Step::Wait {
        reason,
        message: format!("{}: {e}", step.text),
        after: ctx.settings.drain_retry,
        event: None,
    }
}

/// Runs one step. Every step is idempotent: it looks before it acts.
async fn execute(
    dialer: &nodes::Dialer<'_>,
    snapshot: &Snapshot,
    live: &TalosMachine,
    rec: &mut Record<'_>,
    step: &PlanStep,
    message: Option<String>,
) -> Result<Step, ReconcileError> {
    let ctx = dialer.ctx;
    let Record { written, next, p } = rec;
    let member = p
        .member
        .clone()
        .unwrap_or_else(|| nodes::node_name(live).to_string());
    match step.action {
        BuiltIn::LockCluster => Ok(Step::Done), // taken above, before the recount
        BuiltIn::DrainNode => match drain::drain(&ctx.client, &member).await {
            Ok(Drained::Done) => Ok(Step::Done),
            Ok(Drained::Waiting { remaining }) => Ok(Step::Wait {
                reason: "Draining",
                message: format!("draining node {member}: {remaining} pod(s) still terminating"),
                after: Duration::from_secs(2).min(ctx.settings.drain_retry),
                event: None,
            }),
            Ok(Drained::Blocked { pod, message }) => {
                let text = format!(
                    "draining node {member}: evicting pod {pod} is blocked: {message}; retrying every {}s",
                    ctx.settings.drain_retry.as_secs()
                );
                Ok(Step::Wait {
                    reason: "DrainFailed",
                    message: text.clone(),
                    after: ctx.settings.drain_retry,
                    event: Some(("DrainFailed", text)),
                })
            }
            Err(e) => Ok(Step::Wait {
                reason: "DrainFailed",
                message: format!(
                    "draining node {member}: {e}; retrying every {}s",
                    ctx.settings.drain_retry.as_secs()
                ),
                after: ctx.settings.drain_retry,
                event: None,
            }),
        },
        BuiltIn::EtcdForfeitLeadership => {
            let c = match nodes::client(dialer, live) {
                Ok(c) => c,
                Err(e) => return Ok(talos_wait(ctx, step, e)),
            };
            match c.etcd_status().await {
                Ok(s) if s.leader != 0 && s.leader == s.member_id => {
                    if let Err(e) = c.etcd_forfeit_leadership().await {
                        return Ok(talos_wait(ctx, step, e.into()));
                    }
                    Ok(Step::Done)
                }
                Ok(_) => Ok(Step::Done),
                Err(e) => Ok(talos_wait(ctx, step, e.into())),
            }
        }
        BuiltIn::EtcdLeave => {
            let sibling = match nodes::healthy_sibling(dialer, snapshot, live).await {
                Ok(s) => s,
                Err(why) => {
                    return Ok(Step::Wait {
                        reason: "EtcdUnavailable",
                        message: format!(
                            "etcd leave: no healthy sibling to check membership through ({why})"
                        ),
                        after: ctx.settings.drain_retry,
                        event: None,
                    });
                }
            };
            let found = match find_member(&sibling, p, &member) {
                // A node name etcd does not know: the node itself says which member it is.
                Found::Unknown(why) => match nodes::client(dialer, live) {
                    Ok(c) => by_node(&c.etcd_status().await, &sibling, snapshot, live, why),
                    Err(_) => Found::Unknown(why),
                },
                other => other,
            };
            match found {
                Found::Listed(m) => {
                    // Recorded before the call: a leave that lands but whose answer is lost
                    // is recognised by this ID's absence when the removal resumes.
                    if p.member_id != Some(m.id) {
                        p.member_id = Some(m.id);
                        set_progress(next, p.clone());
                        save(ctx, written, next).await?;
                    }
                    let c = match nodes::client(dialer, live) {
                        Ok(c) => c,
                        Err(e) => return Ok(talos_wait(ctx, step, e)),
                    };
                    // The node at spec.endpoint must be this member: another node would
                    // leave in its place.
                    match c.etcd_status().await {
                        Ok(s) if s.member_id == m.id => {}
                        Ok(s) => {
                            return Ok(identity_wait(ctx, &member, m.id, s.member_id, &sibling));
                        }
                        Err(e) => return Ok(talos_wait(ctx, step, e.into())),
                    }
                    if let Err(e) = c.etcd_leave_cluster().await {
                        return Ok(talos_wait(ctx, step, e.into()));
                    }
                }
                Found::Gone => {}
                Found::Unknown(message) => {
                    return Ok(Step::Wait {
                        reason: "EtcdMemberNotFound",
                        message: format!("etcd leave: {message}"),
                        after: ctx.settings.refused_requeue,
                        event: None,
                    });
                }
            }
            p.committed = true;
            Ok(Step::Done)
        }
        BuiltIn::EtcdRemoveMember => {
            let sibling = match nodes::healthy_sibling(dialer, snapshot, live).await {
                Ok(s) => s,
                Err(why) => {
                    return Ok(Step::Wait {
                        reason: "EtcdUnavailable",
                        message: format!(
                            "etcd remove-member: no healthy sibling to remove it through ({why})"
                        ),
                        after: ctx.settings.drain_retry,
                        event: None,
                    });
                }
            };
            match find_member(&sibling, p, &member) {
                Found::Listed(m) => {
                    let id = m.id;
                    if p.member_id != Some(id) {
                        p.member_id = Some(id);
                        set_progress(next, p.clone());
                        save(ctx, written, next).await?;
                    }
                    if let Err(e) = sibling.client.etcd_remove_member_by_id(id).await {
                        return Ok(talos_wait(ctx, step, e.into()));
                    }
                }
                Found::Gone => {}
                Found::Unknown(message) => {
                    return Ok(Step::Wait {
                        reason: "EtcdMemberNotFound",
                        message: format!("etcd remove-member: {message}"),
                        after: ctx.settings.refused_requeue,
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
            ctx.event(live, action == BuiltIn::EventWarning, &reason, note)
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
            let c = match nodes::client(dialer, live) {
                Ok(c) => c,
                Err(e) => return Ok(talos_wait(ctx, step, e)),
            };
            if p.started.as_deref() == Some(step.text.as_str()) {
                // A reset may have been sent before a restart. A node that is resetting
                // stops answering; one that still answers long after did not get it.
                let since = p
                    .started_at
                    .as_ref()
                    .map(|t| Timestamp::now().duration_since(t.0).as_secs())
                    .unwrap_or(i64::MAX);
                match c.version().await {
                    Err(TalosError::Unreachable { .. }) => return Ok(Step::Done),
                    _ if u64::try_from(since).unwrap_or(0)
                        < ctx.settings.reset_settle.as_secs().max(1) =>
                    {
                        return Ok(Step::Wait {
                            reason: "Resetting",
                            message: format!(
                                "a Talos reset of {member} was sent {since}s ago; waiting for the node to go down before deciding whether it took"
                            ),
                            after: Duration::from_millis(500),
                            event: None,
                        });
                    }
                    _ => tracing::warn!(
                        machine = %live.name(),
                        "the node still answers well after its reset was started: it did not take; sending it again"
                    ),
                }
            }
            p.started = Some(step.text.clone());
            p.started_at = Some(Time(Timestamp::now()));
            set_progress(next, p.clone());
            save(ctx, written, next).await?;
            if let Err(e) = c.reset(graceful, true).await {
                // The node did not take it: it may be sent again.
                p.started = None;
                p.started_at = None;
                return Ok(talos_wait(ctx, step, e.into()));
            }
            // A wiped node is gone with its etcd: no deciding again (a graceful reset comes
            // after the leave, which committed already).
            p.committed = true;
            Ok(Step::Done)
        }
        BuiltIn::ReleaseFinalizer => {
            status::set(
                next.conditions_mut(),
                REMOVAL,
                true,
                "RemovalComplete",
                "the control plane was removed",
            );
            save(ctx, written, next).await?;
            finalizer::set_removal(ctx, written, false).await?;
            Ok(Step::Done)
        }
    }
}
