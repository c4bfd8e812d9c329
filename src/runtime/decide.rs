//! From a request or a reconcile to events, and from events to a decision. The webhook, the
//! controller and the CLI all go through here, so they decide with the same code.

use super::facts::{EventFacts, Expensive, SnapshotFacts, Subject};
use super::objects::{
    Object, Role, Snapshot, TalosCluster, TalosEtcdBackup, TalosMachine, TalosOperation,
};
use crate::compile::Table;
use crate::interp::Facts;
use crate::interp::explain::{EventTrace, trace_event};
use crate::interp::{Decision, Finding, Interrupt, Session, decide_into};
use crate::vocab::{Event, Fact, Site, Subject as S, Verb, Verdict};
use kube::core::admission::Operation;

fn role_subject(r: Role) -> S {
    match r {
        Role::ControlPlane => S::ControlPlane,
        Role::Worker => S::Worker,
    }
}

/// The events of a TalosMachine request. Verbs come from the transition of "approved
/// <role> of cluster X": ordinary edits produce none.
pub fn machine_events<'s>(
    op: &Operation,
    namespace: &'s str,
    old: Option<&'s TalosMachine>,
    new: Option<&'s TalosMachine>,
) -> Vec<EventFacts<'s>> {
    let mut out = Vec::new();
    let member = |m: &TalosMachine| m.approved_role().map(|r| (r, m.cluster().to_string()));
    match op {
        Operation::Delete => {
            let Some(old) = old.or(new) else { return out };
            let subject = Subject::Machine {
                name: old.name(),
                view: old,
                counted: Some(old),
            };
            out.push(EventFacts {
                event: (Verb::Remove, S::Machine, Site::Webhook),
                namespace,
                cluster: old.cluster(),
                subject,
            });
            if let Some(r) = old.approved_role() {
                out.push(EventFacts {
                    event: (Verb::Remove, role_subject(r), Site::Webhook),
                    namespace,
                    cluster: old.cluster(),
                    subject,
                });
            }
        }
        Operation::Create => {
            let Some(new) = new else { return out };
            if let Some(r) = new.approved_role() {
                out.push(EventFacts {
                    event: (Verb::Approve, role_subject(r), Site::Webhook),
                    namespace,
                    cluster: new.cluster(),
                    subject: Subject::Machine {
                        name: new.name(),
                        view: new,
                        counted: None,
                    },
                });
            }
        }
        Operation::Update => {
            let (Some(old), Some(new)) = (old, new) else {
                return out;
            };
            let (mo, mn) = (member(old), member(new));
            // An event about the machine as it is (its old self, counted as it is).
            let of_old = |verb: Verb, r: Role| EventFacts {
                event: (verb, role_subject(r), Site::Webhook),
                namespace,
                cluster: old.cluster(),
                subject: Subject::Machine {
                    name: old.name(),
                    view: old,
                    counted: Some(old),
                },
            };
            if mo == mn {
                // Still the same approved member: a change of how the controller finds its
                // node and etcd member is the one edit the rules see.
                if let Some(r) = old.approved_role()
                    && (old.spec.endpoint != new.spec.endpoint
                        || old.spec.hostname != new.spec.hostname)
                {
                    out.push(of_old(Verb::Readdress, r));
                }
                return out;
            }
            if let Some(r) = old.approved_role() {
                let verb = if !new.spec.approved {
                    Verb::Unapprove
                } else if new.spec.role != Some(r) {
                    Verb::Reassign
                } else {
                    Verb::Move
                };
                out.push(of_old(verb, r));
            }
            if let Some(r) = new.approved_role() {
                out.push(EventFacts {
                    event: (Verb::Approve, role_subject(r), Site::Webhook),
                    namespace,
                    cluster: new.cluster(),
                    subject: Subject::Machine {
                        name: new.name(),
                        view: new,
                        counted: Some(old),
                    },
                });
            }
        }
        Operation::Connect => {}
    }
    out
}

/// The `report machine` event of a TalosMachine request whose status changes what the
/// controller or a decision reads ([`TalosMachine::status_reads`]: Ready's status and
/// reason, NodeReachable and the time it turned False, the Removal condition's reason,
/// `status.removal`): an update (through `talosmachines/status` or otherwise) or a create
/// carrying such a status. Any other status change (a message, another condition) is no
/// event.
pub fn status_event<'s>(
    op: &Operation,
    namespace: &'s str,
    old: Option<&'s TalosMachine>,
    new: Option<&'s TalosMachine>,
) -> Option<EventFacts<'s>> {
    let new = status_changed(op, old, new, TalosMachine::same_status_reads)?;
    Some(EventFacts {
        event: (Verb::Report, S::Machine, Site::Webhook),
        namespace,
        cluster: new.cluster(),
        subject: Subject::Machine {
            name: new.name(),
            view: new,
            counted: old,
        },
    })
}

/// The object a create or an update leaves whose status reads (`same`) differ from the old
/// object's, or from an empty status on a create: what a `report` event is about.
fn status_changed<'s, T: Default>(
    op: &Operation,
    old: Option<&'s T>,
    new: Option<&'s T>,
    same: impl Fn(&T, &T) -> bool,
) -> Option<&'s T> {
    let new = match op {
        Operation::Create | Operation::Update => new?,
        Operation::Delete | Operation::Connect => return None,
    };
    let changed = match old {
        Some(old) => !same(old, new),
        None => !same(&T::default(), new),
    };
    changed.then_some(new)
}

/// The `report backup` event of a TalosEtcdBackup request whose status changes anything
/// but its conditions ([`TalosEtcdBackup::same_status_reads`]): an update (through
/// `talosetcdbackups/status` or otherwise) or a create carrying such a status. A restore of
/// a backup (`etcd-restore`) is decided as an operation.
pub fn backup_status_event<'s>(
    op: &Operation,
    namespace: &'s str,
    old: Option<&'s TalosEtcdBackup>,
    new: Option<&'s TalosEtcdBackup>,
) -> Option<EventFacts<'s>> {
    let new = status_changed(op, old, new, TalosEtcdBackup::same_status_reads)?;
    Some(EventFacts {
        event: (Verb::Report, S::Backup, Site::Webhook),
        namespace,
        cluster: new.cluster(),
        subject: Subject::Backup(new),
    })
}

/// The `report cluster` event of a TalosCluster request whose status changes anything but
/// its conditions ([`TalosCluster::same_status_reads`]: the redacted base the webhook
/// dry-renders patches against, the record of the cluster's `Bootstrap`), set, changed or
/// cleared: an update (through `talosclusters/status` or otherwise) or a create carrying
/// such a status.
pub fn cluster_status_event<'s>(
    op: &Operation,
    namespace: &'s str,
    old: Option<&'s TalosCluster>,
    new: Option<&'s TalosCluster>,
) -> Option<EventFacts<'s>> {
    let new = status_changed(op, old, new, TalosCluster::same_status_reads)?;
    Some(EventFacts {
        event: (Verb::Report, S::Cluster, Site::Webhook),
        namespace,
        cluster: new.name(),
        subject: Subject::Cluster(new),
    })
}

/// The events of a TalosCluster request: `unschedule` on the transition into "false",
/// `remove` on delete (a change of its status is [`cluster_status_event`]).
pub fn cluster_events<'s>(
    op: &Operation,
    namespace: &'s str,
    old: Option<&'s TalosCluster>,
    new: Option<&'s TalosCluster>,
) -> Vec<EventFacts<'s>> {
    match (op, old, new) {
        (Operation::Update, Some(old), Some(new)) if old.schedulable() && !new.schedulable() => {
            vec![EventFacts {
                event: (Verb::Unschedule, S::Cluster, Site::Webhook),
                namespace,
                cluster: new.name(),
                subject: Subject::Cluster(new),
            }]
        }
        (Operation::Delete, old, new) => match old.or(new) {
            Some(c) => vec![EventFacts {
                event: (Verb::Remove, S::Cluster, Site::Webhook),
                namespace,
                cluster: c.name(),
                subject: Subject::Cluster(c),
            }],
            None => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// The events of a TalosOperation request: `start` on create.
pub fn operation_events<'s>(
    op: &Operation,
    namespace: &'s str,
    new: Option<&'s TalosOperation>,
) -> Vec<EventFacts<'s>> {
    match (op, new) {
        (Operation::Create, Some(o)) => vec![EventFacts {
            event: (Verb::Start, S::Operation, Site::Webhook),
            namespace,
            cluster: o.cluster(),
            subject: Subject::Operation(o),
        }],
        _ => Vec::new(),
    }
}

/// The events of any request about one of our objects.
pub fn request_events<'s>(
    op: &Operation,
    namespace: &'s str,
    old: Option<&'s Object>,
    new: Option<&'s Object>,
) -> Vec<EventFacts<'s>> {
    let kind = new.or(old);
    match kind {
        Some(Object::Machine(_)) => {
            let m = |o: Option<&'s Object>| match o {
                Some(Object::Machine(m)) => Some(m),
                _ => None,
            };
            let mut events = machine_events(op, namespace, m(old), m(new));
            events.extend(status_event(op, namespace, m(old), m(new)));
            events
        }
        Some(Object::Cluster(_)) => {
            let c = |o: Option<&'s Object>| match o {
                Some(Object::Cluster(c)) => Some(c),
                _ => None,
            };
            let mut events = cluster_events(op, namespace, c(old), c(new));
            events.extend(cluster_status_event(op, namespace, c(old), c(new)));
            events
        }
        Some(Object::Operation(_)) => {
            let o = match new {
                Some(Object::Operation(o)) => Some(o),
                _ => None,
            };
            operation_events(op, namespace, o)
        }
        Some(Object::Backup(_)) => {
            let b = |o: Option<&'s Object>| match o {
                Some(Object::Backup(b)) => Some(b),
                _ => None,
            };
            backup_status_event(op, namespace, b(old), b(new))
                .into_iter()
                .collect()
        }
        // A TalosConfigPatch's `apply patch` event carries its dry render
        // (`configpatch::patch_event`).
        Some(Object::Patch(_)) | None => Vec::new(),
    }
}

/// What the controller is about to do with an object, as an event: `remove` for an
/// approved control plane being deleted, `apply` for an approved machine, `run` for an
/// unfinished operation. `None` when the controller has nothing to decide.
pub fn reconcile_machine_event<'s>(m: &'s TalosMachine) -> Option<EventFacts<'s>> {
    let role = m.approved_role()?;
    let verb = if m.deleting() {
        Verb::Remove
    } else {
        Verb::Apply
    };
    let event = (verb, role_subject(role), Site::Controller);
    crate::vocab::is_runtime_event(event.0, event.1, event.2).then_some(EventFacts {
        event,
        namespace: m.namespace(),
        cluster: m.cluster(),
        subject: Subject::Machine {
            name: m.name(),
            view: m,
            counted: Some(m),
        },
    })
}

/// The `bootstrap` rules, decided before the controller bootstraps etcd on `m` (an
/// approved control plane of a new cluster). `None` for any other machine.
pub fn bootstrap_event<'s>(m: &'s TalosMachine) -> Option<EventFacts<'s>> {
    (m.approved_role() == Some(Role::ControlPlane) && !m.deleting()).then_some(EventFacts {
        event: (Verb::Bootstrap, S::ControlPlane, Site::Controller),
        namespace: m.namespace(),
        cluster: m.cluster(),
        subject: Subject::Machine {
            name: m.name(),
            view: m,
            counted: Some(m),
        },
    })
}

/// The `snapshot backup` rules, decided before the controller takes a snapshot of `b`;
/// its plan's guards read the same event.
pub fn snapshot_event(b: &TalosEtcdBackup) -> EventFacts<'_> {
    EventFacts {
        event: (Verb::Snapshot, S::Backup, Site::Controller),
        namespace: b.namespace(),
        cluster: b.cluster(),
        subject: Subject::Backup(b),
    }
}

pub fn reconcile_operation_event<'s>(o: &'s TalosOperation) -> Option<EventFacts<'s>> {
    (!o.finished()).then_some(EventFacts {
        event: (Verb::Run, S::Operation, Site::Controller),
        namespace: o.namespace(),
        cluster: o.cluster(),
        subject: Subject::Operation(o),
    })
}

/// The `step operation` rules, decided before each step of a running operation on the node
/// it works on (`o` as [`operation_on`] gives it). `None` once it finished.
pub fn step_operation_event<'s>(o: &'s TalosOperation) -> Option<EventFacts<'s>> {
    (!o.finished()).then_some(EventFacts {
        event: (Verb::Step, S::Operation, Site::Controller),
        namespace: o.namespace(),
        cluster: o.cluster(),
        subject: Subject::Operation(o),
    })
}

/// The operation as the rules see it while it works on `machine`: its target (`target`,
/// `target.controlplane`, ...) is that machine; for a roll over the cluster, each node in
/// turn.
pub fn operation_on(o: &TalosOperation, machine: &str) -> TalosOperation {
    let mut view = o.clone();
    view.spec.machine = Some(machine.to_string());
    view
}

/// The start rules again, at the controller, for an operation that has not started yet
/// (phase Pending, not failed): decided with the spec it has now and the state of now,
/// before the controller first acts on it. Admission decided them on create, but it can be
/// bypassed (the webhook down with a lax failure policy, a race between two creates) or,
/// before spec was immutable, edited around. `None` once the operation started.
pub fn reconcile_start_event<'s>(o: &'s TalosOperation) -> Option<EventFacts<'s>> {
    (!o.finished() && !o.failed() && o.phase() == "Pending").then_some(EventFacts {
        event: (Verb::Start, S::Operation, Site::Controller),
        namespace: o.namespace(),
        cluster: o.cluster(),
        subject: Subject::Operation(o),
    })
}

/// Decides one event of a request into `decision`. A fact that cannot be had fails closed: a
/// refusal naming it (returned too). The one way a request's event is decided: from a
/// snapshot ([`decide_request_events`]), and from a record's facts (`replay`).
pub fn decide_event<'a, F: Facts<'a>>(
    session: &mut Session<'a, F>,
    event: Event,
    decision: &mut Decision,
) -> Option<Fact> {
    let Err(Interrupt::Need(fact)) = decide_into(session, event, decision) else {
        return None;
    };
    decision.refusals.push(Finding {
        rule: LIVE_STATE.into(),
        verdict: Verdict::Refuse,
        message: format!(
            "the fact `{fact}` could not be read, so the request is refused rather than decided on missing data"
        ),
        reason: None,
    });
    Some(fact)
}

/// The name a refusal for a fact that could not be read goes by (no rule has it).
pub const LIVE_STATE: &str = "(live state)";

/// Decides a list of events against a snapshot. With `trace`, also returns what each event
/// considered. An expensive fact that cannot be had here fails closed: a refusal naming it.
pub fn decide_events(
    table: &Table,
    snapshot: &Snapshot,
    events: &[EventFacts<'_>],
    expensive: Expensive,
    trace: bool,
) -> (Decision, Vec<EventTrace>) {
    decide_request_events(table, snapshot, events, expensive, trace, false)
}

/// [`decide_events`] for a request whose requester is known: `by_controller` is the fact
/// `request.by_controller` (the request was made by the controller's own identity).
pub fn decide_request_events(
    table: &Table,
    snapshot: &Snapshot,
    events: &[EventFacts<'_>],
    expensive: Expensive,
    trace: bool,
    by_controller: bool,
) -> (Decision, Vec<EventTrace>) {
    let mut decision = Decision::default();
    let mut traces = Vec::new();
    for ev in events {
        let facts =
            SnapshotFacts::new(table, snapshot, *ev, expensive).by_controller(by_controller);
        let mut session = Session::new(table, facts);
        if trace {
            session = session.traced();
        }
        decide_event(&mut session, ev.event, &mut decision);
        if trace {
            let (verb, subject, site) = ev.event;
            let cluster_missing = !matches!(ev.subject, Subject::Cluster(_))
                && snapshot.cluster(ev.namespace, ev.cluster).is_none();
            traces.push(trace_event(
                &mut session,
                format!(
                    "{} {} at the {} (cluster {:?})",
                    verb.name(),
                    subject.name(),
                    site.name(),
                    ev.cluster
                ),
                ev.event,
                format!("{}/{}", ev.namespace, ev.cluster),
                cluster_missing,
            ));
        }
    }
    (decision, traces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::objects::{BootstrapRecord, ClusterSpec, ClusterStatus, RedactedBase};

    fn cluster(status: Option<ClusterStatus>) -> TalosCluster {
        let mut c = TalosCluster::new("c", ClusterSpec::default());
        c.metadata.namespace = Some("ns".into());
        c.status = status;
        c
    }

    fn base(digest: &str) -> RedactedBase {
        RedactedBase {
            digest: digest.into(),
            controlplane: "version: v1alpha1\n".into(),
            worker: "version: v1alpha1\n".into(),
        }
    }

    fn record(machine: &str, confirmed: bool) -> BootstrapRecord {
        BootstrapRecord {
            machine: machine.into(),
            confirmed,
            ..Default::default()
        }
    }

    fn condition(type_: &str, status: &str, message: &str) -> crate::runtime::objects::Condition {
        serde_json::from_value(serde_json::json!({
            "type": type_, "status": status, "reason": "R", "message": message
        }))
        .expect("a condition")
    }

    /// The events of a TalosCluster request, by verb and subject.
    fn events(
        op: Operation,
        old: Option<&TalosCluster>,
        new: Option<&TalosCluster>,
    ) -> Vec<String> {
        let (old, new) = (
            old.cloned().map(Object::Cluster),
            new.cloned().map(Object::Cluster),
        );
        request_events(&op, "ns", old.as_ref(), new.as_ref())
            .iter()
            .map(|e| {
                format!(
                    "{} {} at {}",
                    e.event.0.name(),
                    e.event.1.name(),
                    e.event.2.name()
                )
            })
            .collect()
    }

    /// Issue 37: setting, changing or clearing the redacted base or the bootstrap record is
    /// `report cluster`; a change of the conditions alone, or of nothing, is no event.
    #[test]
    fn a_cluster_status_change_decisions_read_is_report_cluster() {
        let full = ClusterStatus {
            conditions: vec![condition("Transitioning", "False", "3 approved")],
            redacted_base: Some(base("d1")),
            bootstrap: Some(record("cp1", true)),
        };
        let with = |f: &dyn Fn(&mut ClusterStatus)| {
            let mut s = full.clone();
            f(&mut s);
            cluster(Some(s))
        };
        let published = cluster(Some(full.clone()));
        let report = vec!["report cluster at webhook".to_string()];
        let changes: Vec<(&str, TalosCluster)> = vec![
            (
                "another digest",
                with(&|s| s.redacted_base = Some(base("d2"))),
            ),
            (
                "another base text",
                with(&|s| {
                    if let Some(b) = s.redacted_base.as_mut() {
                        b.controlplane = "machine: {}\n".into();
                    }
                }),
            ),
            ("the base cleared", with(&|s| s.redacted_base = None)),
            ("the record cleared", with(&|s| s.bootstrap = None)),
            (
                "another machine",
                with(&|s| s.bootstrap = Some(record("cp2", true))),
            ),
            (
                "unconfirmed",
                with(&|s| s.bootstrap = Some(record("cp1", false))),
            ),
            ("no status at all", cluster(None)),
        ];
        for (what, new) in &changes {
            assert_eq!(
                events(Operation::Update, Some(&published), Some(new)),
                report,
                "{what}"
            );
            // And back: set where there was none, or changed back.
            assert_eq!(
                events(Operation::Update, Some(new), Some(&published)),
                report,
                "{what}, undone"
            );
        }
        // Conditions alone (Transitioning, BaseConfig, Teardown), or nothing, are no event.
        let reworded = with(&|s| {
            s.conditions = vec![
                condition("Transitioning", "True", "edited"),
                condition("BaseConfig", "False", "forged words"),
                condition("Teardown", "True", "forged words"),
            ]
        });
        assert!(events(Operation::Update, Some(&published), Some(&reworded)).is_empty());
        assert!(events(Operation::Update, Some(&published), Some(&published)).is_empty());
        // An empty status holds what no status holds.
        assert!(
            events(
                Operation::Update,
                Some(&cluster(None)),
                Some(&cluster(Some(ClusterStatus::default())))
            )
            .is_empty()
        );
        // A create carrying such a status is one; without, none.
        assert_eq!(events(Operation::Create, None, Some(&published)), report);
        let conditions_only = cluster(Some(ClusterStatus {
            conditions: full.conditions.clone(),
            ..Default::default()
        }));
        assert!(events(Operation::Create, None, Some(&conditions_only)).is_empty());
        assert!(events(Operation::Create, None, Some(&cluster(None))).is_empty());
        // A delete is `remove cluster`, never a report.
        assert_eq!(
            events(Operation::Delete, Some(&published), None),
            vec!["remove cluster at webhook".to_string()]
        );
    }

    /// A write that both unschedules the cluster and changes its status is both events, and
    /// `report cluster` is about the cluster as written.
    #[test]
    fn report_cluster_comes_with_the_clusters_other_events() {
        let old = cluster(Some(ClusterStatus {
            bootstrap: Some(record("cp1", true)),
            ..Default::default()
        }));
        let mut new = cluster(None);
        new.spec.schedulable = Some("false".into());
        assert_eq!(
            events(Operation::Update, Some(&old), Some(&new)),
            vec![
                "unschedule cluster at webhook".to_string(),
                "report cluster at webhook".to_string()
            ]
        );
        let ev = cluster_status_event(&Operation::Update, "ns", Some(&old), Some(&new))
            .expect("an event");
        assert_eq!(ev.cluster, "c");
        assert!(matches!(ev.subject, Subject::Cluster(c) if c.bootstrap_record().is_none()));
        assert!(crate::vocab::is_runtime_event(
            ev.event.0, ev.event.1, ev.event.2
        ));
    }
}
