//! The bootstrap of a new cluster's etcd (issue 37), as one procedure over a
//! [`BootstrapWorld`]: the controller runs it with real I/O (`controller::configure`'s
//! world); `verify --check-trace` replays it from a step log.
//!
//! Once the first approved control plane's configuration is applied, the procedure asks
//! the `bootstrap controlplane` rules whether to send Talos' `Bootstrap` to it, with the
//! facts read live (`etcd.members`: `EtcdMemberList` of every control plane of the cluster,
//! asked only when a rule needs it; `bootstrapped`: the record on the TalosCluster). The
//! decision is recorded (the world's journal, `--decision-log`). Allowed, it runs the steps
//! of the table's `plan bootstrap controlplane` in order, each whose `when`/`unless` guards
//! hold (a table with no such plan bootstraps nothing, and the controller logs why). The
//! one step of a bootstrap is `talos bootstrap`, sent at most once per reconcile: it first records
//! the bootstrap in the TalosCluster's status (`status.bootstrap`), with a merge patch
//! naming the resourceVersion it read: of two controllers deciding at once, one write wins
//! and the other gets a conflict and sends nothing. Only then is `Bootstrap` sent. A call
//! whose answer is lost is never sent again: the record stays, the rules refuse every
//! later bootstrap, and the procedure confirms it by reading etcd (a member listed on any
//! control plane). Talos itself refuses a second bootstrap on a node whose etcd data
//! directory is not empty.

use super::{Call, Node, NodeError, Note, Outcome, Reply, Timing, Wait, World, calls};
use crate::runtime::decide::bootstrap_event;
use crate::runtime::objects::{BootstrapRecord, Role, Snapshot, TalosCluster, TalosMachine};
use crate::runtime::talos::TalosError;
use crate::vocab::{Action as BuiltIn, Fact, Subject, Verb};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

/// What the bootstrap needs of the world beyond the [`World`].
#[allow(async_fn_in_trait)]
pub trait BootstrapWorld: World {
    /// Writes `record` as `cluster`'s `status.bootstrap` (`None`: removes it). With
    /// `guard`, the write names the resourceVersion read: `Ok(false)` when another writer
    /// came first (a conflict).
    async fn record_bootstrap(
        &mut self,
        cluster: &TalosCluster,
        record: Option<&BootstrapRecord>,
        guard: bool,
    ) -> Result<bool, Self::Error>;

    /// Publishes an Event on the TalosCluster.
    async fn cluster_event(&mut self, on: &TalosCluster, warning: bool, reason: &str, note: String);
}

/// The control planes of the cluster that may run etcd: every TalosMachine of it with the
/// role controlplane, approved or not, not being deleted.
fn control_planes<'s>(snapshot: &'s Snapshot, m: &TalosMachine) -> Vec<&'s TalosMachine> {
    snapshot
        .machines
        .iter()
        .filter(|o| {
            o.namespace() == m.namespace()
                && o.cluster() == m.cluster()
                && o.spec.role == Some(Role::ControlPlane)
                && !o.deleting()
        })
        .collect()
}

/// Where Talos keeps a node's etcd data (`constants.EtcdDataPath`): Talos refuses a
/// `Bootstrap` where it is not empty.
pub const ETCD_DATA: &str = "/var/lib/etcd";

/// `etcd.members`, asked live: the most members any control plane's etcd lists; a control
/// plane whose etcd is not running (Talos answers the call with an error) counts 1 when its
/// etcd data directory is not empty (`List` of [`ETCD_DATA`]: etcd ran there, and stopped),
/// else none. One that fails the cluster's handshake but answers Talos' maintenance API
/// (`Version`) is in maintenance mode, with no configuration: none. A node that answers
/// neither, or cannot be dialled (no endpoint, no credentials), makes the count unreadable:
/// `Ok(Err(why))`.
pub async fn etcd_members<W: World>(
    w: &mut W,
    snapshot: &Snapshot,
    m: &TalosMachine,
) -> Result<Result<i64, String>, W::Error> {
    let mut most = 0u64;
    for cp in control_planes(snapshot, m) {
        match calls::members(w, m.cluster(), Node::Endpoint(cp)).await? {
            Ok(list) => most = most.max(u64::try_from(list.len()).unwrap_or(u64::MAX)),
            // The node answered: its etcd is not running (or not yet). Has it data?
            Err(NodeError::Talos(TalosError::Failed { .. })) => {
                let call = Call::List {
                    root: ETCD_DATA.into(),
                };
                match w.talos(m.cluster(), Node::Endpoint(cp), call).await? {
                    Ok(Reply::Entries(0)) => {}
                    Ok(Reply::Entries(_)) => most = most.max(1),
                    Ok(_) => {
                        return Ok(Err(format!(
                            "{}: the answer to List was not of its kind",
                            cp.name()
                        )));
                    }
                    Err(e) => {
                        return Ok(Err(format!(
                            "{}: its etcd is not running and {ETCD_DATA} could not be listed: {e}",
                            cp.name()
                        )));
                    }
                }
            }
            // No handshake with the cluster's credentials. A node in Talos' maintenance
            // mode answers so, and answers its maintenance API: it has no configuration
            // yet, so it runs no etcd and is a member of nothing (an unconfigured spare
            // must not hold the bootstrap up). Asked live, not taken from its condition.
            Err(e @ NodeError::Talos(TalosError::Unreachable { .. })) => {
                match w
                    .talos(m.cluster(), Node::Maintenance(cp), Call::Version)
                    .await?
                {
                    Ok(Reply::Version(_)) => {}
                    _ => return Ok(Err(format!("{} did not answer: {e}", cp.name()))),
                }
            }
            Err(e @ NodeError::NoEndpoint(_)) => {
                return Ok(Err(format!(
                    "{}: {e}; a control plane of the cluster that cannot be asked may run \
                     etcd: give it its spec.endpoint, or delete the TalosMachine if it is \
                     not a node of this cluster",
                    cp.name()
                )));
            }
            Err(e @ NodeError::NoCredentials(_)) => {
                return Ok(Err(format!("{}: {e}", cp.name())));
            }
            Err(e) => return Ok(Err(format!("{} did not answer: {e}", cp.name()))),
        }
    }
    Ok(Ok(i64::try_from(most).unwrap_or(i64::MAX)))
}

/// The record of a cluster found with etcd (none sent): confirmed, naming no machine.
fn found(identity: &str, message: String) -> BootstrapRecord {
    BootstrapRecord {
        machine: String::new(),
        sent_at: None,
        by: Some(identity.to_string()),
        confirmed: true,
        message: Some(message),
    }
}

fn again(after: Duration, why: &str) -> Outcome {
    Outcome::Requeue {
        after,
        wait: Wait::On(why.into()),
    }
}

/// Bootstraps the cluster of `live` (a configured, approved control plane; `snapshot`: its
/// cluster as read) when the rules let it. `identity`: this controller's, recorded as who
/// sent it. `AwaitChange`: nothing left to do here.
pub async fn reconcile<W: BootstrapWorld>(
    w: &mut W,
    table: &crate::compile::Table,
    timing: &Timing,
    identity: &str,
    snapshot: &Snapshot,
    live: &TalosMachine,
) -> Result<Outcome, W::Error> {
    let Some(cluster) = snapshot.cluster(live.namespace(), live.cluster()) else {
        return Ok(Outcome::AwaitChange);
    };
    let retry = timing.refused_requeue;
    match cluster.bootstrap_record() {
        Some(r) if r.confirmed => return Ok(Outcome::AwaitChange),
        // Sent (or about to be when the controller stopped), its answer lost: confirmed by
        // etcd, never sent again.
        Some(r) => {
            if r.machine != live.name() {
                return Ok(Outcome::AwaitChange);
            }
            return Ok(match etcd_members(w, snapshot, live).await? {
                Ok(n) if n > 0 => {
                    let mut done = r.clone();
                    done.confirmed = true;
                    done.message = Some(format!(
                        "etcd runs: {n} member(s) listed after the Bootstrap sent to {}",
                        r.machine
                    ));
                    w.record_bootstrap(cluster, Some(&done), false).await?;
                    w.note(live, Note::Info("bootstrap confirmed by etcd"));
                    Outcome::AwaitChange
                }
                _ => {
                    unconfirmed(w, cluster, live, r).await?;
                    again(retry, "BootstrapUnconfirmed")
                }
            });
        }
        None => {}
    }
    let Some(ev) = bootstrap_event(live) else {
        return Ok(Outcome::AwaitChange);
    };
    let Some(plan) = table.plan(Verb::Bootstrap, Subject::ControlPlane) else {
        w.note(
            live,
            Note::Warn(
                "the rules have no `plan bootstrap controlplane`; nothing is bootstrapped until they do",
            ),
        );
        return Ok(again(retry, "NoPlan"));
    };
    // Ask, supply, decide: `etcd.members` is read only when a rule needs it.
    let started = std::time::Instant::now();
    let mut supplied: Vec<(Fact, i64)> = Vec::new();
    let decision = loop {
        match w.decide(table, snapshot, ev, &supplied) {
            Ok(d) => break d,
            Err(Fact::EtcdMembers) if supplied.is_empty() => {
                match etcd_members(w, snapshot, live).await? {
                    Ok(n) => {
                        let why = "the most members any control plane's etcd lists";
                        if let Some(j) = w.journal() {
                            j.fact(Fact::EtcdMembers, n, why);
                        }
                        w.note(
                            live,
                            Note::Fact {
                                fact: Fact::EtcdMembers,
                                value: n,
                                why,
                            },
                        );
                        supplied.push((Fact::EtcdMembers, n));
                    }
                    Err(why) => {
                        let said =
                            format!("bootstrap not decided: etcd.members cannot be read ({why})");
                        w.note(live, Note::Warn(&said));
                        return Ok(again(retry, "EtcdMembersUnreadable"));
                    }
                }
            }
            Err(f) => {
                let said =
                    format!("bootstrap not decided: a fact the controller cannot read ({f})");
                w.note(live, Note::Warn(&said));
                return Ok(again(retry, "FactUnreadable"));
            }
        }
    };
    // The decision, recorded (it cites no condition: the bootstrap sets none).
    if let Some(j) = w.journal() {
        j.decision(table, snapshot, ev, &supplied, &decision, started);
    }
    w.note(live, Note::Decided(&decision));
    if let Some((_, why)) = super::rules::hold_of(&decision, "BootstrapRefused") {
        let said = format!("not bootstrapped: {why}");
        w.note(live, Note::Info(&said));
        // etcd runs already (an existing cluster, or one bootstrapped by hand): recorded,
        // so it is not asked again on every reconcile.
        if let Some((_, n)) = supplied.iter().find(|(_, n)| *n > 0) {
            let found = found(
                identity,
                format!(
                    "etcd already ran ({n} member(s) listed, or an etcd data directory not empty) when {} was configured: no Bootstrap sent",
                    live.name()
                ),
            );
            w.record_bootstrap(cluster, Some(&found), true).await?;
        }
        return Ok(Outcome::AwaitChange);
    }
    // Allowed: the plan's steps, in order, each whose guards hold.
    let mut sent = false;
    for (k, step) in plan.steps.iter().enumerate() {
        let runs = match w.applies(table, snapshot, ev, &supplied, k, step) {
            Ok((runs, _)) => runs,
            Err(why) => {
                let said = format!("bootstrap step `{}` not decided: {why}", step.text);
                w.note(live, Note::Warn(&said));
                return Ok(again(retry, "StepRefused"));
            }
        };
        if !runs {
            continue;
        }
        w.note(live, Note::Step(k, &step.text));
        match step.action {
            BuiltIn::TalosBootstrap if sent => {
                // Sent once per cluster, ever: a second `talos bootstrap` of the plan sends
                // nothing.
                w.note(live, Note::Info("bootstrap sent already: not sent again"));
            }
            BuiltIn::TalosBootstrap => {
                if let Some(outcome) = send(w, timing, identity, cluster, live).await? {
                    return Ok(outcome);
                }
                sent = true;
            }
            // Another procedure's steps: the checker refuses them in `plan bootstrap`
            // (`ichor::check::action_not_in_plan`), so only a table built past it gets here.
            BuiltIn::LockCluster
            | BuiltIn::DrainNode
            | BuiltIn::EtcdForfeitLeadership
            | BuiltIn::EtcdLeave
            | BuiltIn::EtcdRemoveMember
            | BuiltIn::TalosReset
            | BuiltIn::TalosWipe
            | BuiltIn::EventWarning
            | BuiltIn::EventNormal
            | BuiltIn::ReleaseFinalizer
            | BuiltIn::EtcdHealthy
            | BuiltIn::CordonNode
            | BuiltIn::UncordonNode
            | BuiltIn::TalosReboot
            | BuiltIn::TalosShutdown
            | BuiltIn::TalosUpgrade
            | BuiltIn::TalosRollback
            | BuiltIn::WaitNodeBack
            | BuiltIn::TalosInstall
            | BuiltIn::ConfigRender
            | BuiltIn::TalosDryRun
            | BuiltIn::TalosApplyConfig
            | BuiltIn::EtcdSnapshot
            | BuiltIn::SnapshotsPrune => {
                let said = format!(
                    "`{}` is not a step of a bootstrap; remove it from `plan bootstrap controlplane`",
                    step.text
                );
                w.note(live, Note::Warn(&said));
                return Ok(again(retry, "NotABootstrapStep"));
            }
        }
    }
    Ok(Outcome::AwaitChange)
}

/// `talos bootstrap`: the record first, guarded, so only one controller ever sends it;
/// then Talos' `Bootstrap`. `None`: sent and answered, on to the plan's next step.
async fn send<W: BootstrapWorld>(
    w: &mut W,
    timing: &Timing,
    identity: &str,
    cluster: &TalosCluster,
    live: &TalosMachine,
) -> Result<Option<Outcome>, W::Error> {
    let retry = timing.refused_requeue;
    // Record first, guarded, so only one controller ever sends it.
    let mut r = BootstrapRecord {
        machine: live.name().to_string(),
        sent_at: Some(Time(w.now())),
        by: Some(identity.to_string()),
        confirmed: false,
        message: None,
    };
    if !w.record_bootstrap(cluster, Some(&r), true).await? {
        w.note(
            live,
            Note::Info("bootstrap recorded by another writer first: not sent"),
        );
        return Ok(Some(again(timing.lock_retry, "BootstrapRecordedElsewhere")));
    }
    Ok(
        match calls::done(w, live.cluster(), Node::Endpoint(live), Call::Bootstrap).await? {
            Ok(()) => {
                r.confirmed = true;
                r.message = Some(format!("Talos bootstrapped etcd on {}", live.name()));
                w.record_bootstrap(cluster, Some(&r), false).await?;
                w.note(live, Note::Info("bootstrapped"));
                let note = format!("etcd bootstrapped on {}", live.name());
                w.cluster_event(cluster, false, "Bootstrapped", note).await;
                None
            }
            // Talos refused it because the node's etcd data directory is not empty: etcd ran
            // there, the cluster is not new. Recorded as found (never sent again).
            Err(NodeError::Talos(TalosError::Failed {
                code: tonic::Code::AlreadyExists,
                message,
                ..
            })) => {
                let found = found(
                    identity,
                    format!(
                        "Talos refused the Bootstrap of {} ({message}): etcd ran there, so the \
                     cluster is not new; no Bootstrap is sent",
                        live.name()
                    ),
                );
                w.record_bootstrap(cluster, Some(&found), false).await?;
                let said = format!("bootstrap refused by Talos: {message}");
                w.note(live, Note::Warn(&said));
                Some(Outcome::AwaitChange)
            }
            // Never sent (nothing to dial with), or refused by Talos before it acted: the
            // record is withdrawn, so the rules decide again once the cause is gone.
            Err(e) if !maybe_acted(&e) => {
                w.record_bootstrap(cluster, None, false).await?;
                let message = format!(
                    "Bootstrap was not sent to {} or Talos refused it without acting ({e}); \
                 the controller decides again in {}s",
                    live.name(),
                    retry.as_secs()
                );
                w.note(live, Note::Warn(&message));
                w.cluster_event(cluster, true, "BootstrapNotSent", message)
                    .await;
                Some(again(retry, "BootstrapNotSent"))
            }
            Err(e) => {
                // Maybe it acted: never sent again; etcd will tell.
                let message = format!(
                    "Bootstrap sent to {} did not answer cleanly ({e}); it is not sent again: \
                 the controller confirms it once etcd lists a member",
                    live.name()
                );
                r.message = Some(message.clone());
                w.record_bootstrap(cluster, Some(&r), false).await?;
                let said = format!("bootstrap answer lost or refused: {e}");
                w.note(live, Note::Warn(&said));
                w.cluster_event(cluster, true, "BootstrapUnconfirmed", message)
                    .await;
                Some(again(retry, "BootstrapUnconfirmed"))
            }
        },
    )
}

/// How long a recorded Bootstrap may go unconfirmed (no control plane's etcd lists a
/// member) before the record says what a person should do: etcd starts within seconds of a
/// Bootstrap that reached its node.
pub const UNCONFIRMED_AFTER: Duration = Duration::from_secs(120);

/// Whether a failed `Bootstrap` may have acted on the node. Only a call that was never
/// made (no credentials, no endpoint, an unusable configuration) or one Talos refused
/// with an answer that says it did nothing (the etcd data directory is not empty, the
/// request is not allowed, the call is unknown) certainly did not; a call with no answer,
/// or an answer that may come after the work began, may have.
pub fn maybe_acted(e: &NodeError) -> bool {
    use tonic::Code;
    match e {
        NodeError::NoCredentials(_) | NodeError::NoEndpoint(_) => false,
        NodeError::Talos(TalosError::Config(_)) => false,
        NodeError::Talos(TalosError::Failed { code, .. }) => !matches!(
            code,
            Code::InvalidArgument
                | Code::FailedPrecondition
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::Unimplemented
        ),
        NodeError::Talos(TalosError::Unreachable { .. }) => true,
    }
}

/// A recorded Bootstrap that etcd does not confirm: once [`UNCONFIRMED_AFTER`] has passed
/// since it was recorded, the record says (once) what happened and what a person does
/// about it, and a Warning Event says the same. The controller never sends it again: the
/// call may have reached the node (its answer lost, or the controller stopped right after
/// recording it), and only a person can look at the node.
async fn unconfirmed<W: BootstrapWorld>(
    w: &mut W,
    cluster: &TalosCluster,
    live: &TalosMachine,
    r: &BootstrapRecord,
) -> Result<(), W::Error> {
    let since = r
        .sent_at
        .as_ref()
        .and_then(|t| w.now().duration_since(t.0).try_into().ok())
        .unwrap_or(Duration::ZERO);
    if since < UNCONFIRMED_AFTER {
        return Ok(());
    }
    let at = r
        .sent_at
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    let message = format!(
        "Bootstrap was recorded for {m} at {at}, and after {wait} s no control plane's etcd \
         lists a member: the call may never have reached the node (the controller stopped \
         between recording and sending it, or the node did not take it). The controller never \
         sends it again. If `talosctl -n {m} service etcd` shows etcd waiting to be \
         bootstrapped, run `talosctl -n {m} bootstrap` once; Talos refuses it where etcd has \
         data",
        m = live.name(),
        wait = UNCONFIRMED_AFTER.as_secs(),
    );
    // Said once.
    if r.message.as_deref() == Some(message.as_str()) {
        return Ok(());
    }
    let mut said = r.clone();
    said.message = Some(message.clone());
    w.record_bootstrap(cluster, Some(&said), false).await?;
    w.note(live, Note::Warn(&message));
    w.cluster_event(cluster, true, "BootstrapUnconfirmed", message)
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_camel_case_and_omits_what_is_unknown() {
        let r = BootstrapRecord {
            machine: "cp-1".into(),
            sent_at: None,
            by: Some("controller-0".into()),
            confirmed: false,
            message: None,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"machine": "cp-1", "by": "controller-0", "confirmed": false})
        );
    }
}
