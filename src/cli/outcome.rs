//! One decision, offline, as `eval`, `explain` and `test` make it: an AdmissionReview
//! decided as the webhook answers it, or a reconcile as the controller decides it. The three
//! commands share this code, so a test case passes only when `eval` decides the same.

use crate::compile::Table;
use crate::interp::Decision;
use crate::interp::explain::EventTrace;
use crate::runtime::admission::{Request, immutable_spec_change, parse_review};
use crate::runtime::decide::{
    decide_events, decide_request_events, reconcile_machine_event, reconcile_operation_event,
    reconcile_start_event, request_events,
};
use crate::runtime::facts::{EventFacts, Expensive, Subject as FactSubject};
use crate::runtime::objects::Snapshot;

/// What was decided, and how.
pub struct Outcome {
    /// One line naming the request or the reconcile.
    pub header: String,
    pub decision: Decision,
    /// Per event, the rows considered (only when traced).
    pub traces: Vec<EventTrace>,
    /// The events the request or reconcile produced (0: an ordinary edit, or nothing for
    /// the controller to decide).
    pub events: usize,
    /// The events themselves (verb, subject, site).
    pub kinds: Vec<crate::check::Event>,
    /// A refusal made by the webhook itself, not by a rule (a TalosOperation's spec edit).
    pub not_by_rule: Option<String>,
    /// What the reader should know about the objects (a TalosCluster that is not there).
    pub notes: Vec<String>,
    /// The TalosClusters (`namespace/name`) the events name and the objects do not hold:
    /// read as missing. `test` fails a case with one unless it says the cluster is missing.
    pub missing_clusters: Vec<String>,
    /// A reconcile of a control plane: `member.dead` came from the objects, not from etcd.
    pub member_dead_offline: bool,
    /// The parsed request, for the AdmissionReview response (admission only).
    pub request: Option<Request>,
}

/// The events' clusters the objects do not hold (`namespace/name`, each once), and a note
/// on each: a TalosCluster the objects do not hold is read as missing (`cluster.exists`
/// false, `count` 0), which is a decision the reader should see was made on purpose, not by
/// a typo in `clusterRef` or a forgotten object.
fn missing_clusters(snapshot: &Snapshot, events: &[EventFacts<'_>], out: &mut Missing) {
    for ev in events {
        if matches!(ev.subject, FactSubject::Cluster(_)) {
            continue;
        }
        let name = format!("{}/{}", ev.namespace, ev.cluster);
        if snapshot.cluster(ev.namespace, ev.cluster).is_none() && !out.clusters.contains(&name) {
            out.notes.push(format!(
                "the objects hold no TalosCluster {name}: it is read as missing \
                 (cluster.exists = false, count = 0, schedulable = true); add it to the \
                 objects file if the cluster exists"
            ));
            out.clusters.push(name);
        }
    }
}

/// Missing clusters and their notes.
#[derive(Default)]
struct Missing {
    clusters: Vec<String>,
    notes: Vec<String>,
}

/// Decides an AdmissionReview body as the webhook does, knowing the controller's username
/// as `serve --controller-username` names it to the webhook: a review by that user has
/// `request.by_controller` (with `None`, no request is the controller's).
pub fn admission_as(
    table: &Table,
    snapshot: &Snapshot,
    body: &[u8],
    trace: bool,
    controller_username: Option<&str>,
) -> Result<Outcome, String> {
    let req = parse_review(body).map_err(|e| e.to_string())?;
    let header = format!(
        "webhook: {} {} {}/{} (uid {})",
        format!("{:?}", req.operation()).to_uppercase(),
        req.inner.kind.kind,
        req.namespace,
        req.inner.name,
        req.uid()
    );
    // As the webhook: an operation's spec never changes, whatever the rules say.
    if let Some(message) = immutable_spec_change(&req) {
        return Ok(Outcome {
            header,
            decision: Decision::default(),
            traces: Vec::new(),
            events: 0,
            kinds: Vec::new(),
            not_by_rule: Some(message),
            notes: Vec::new(),
            missing_clusters: Vec::new(),
            member_dead_offline: false,
            request: Some(req),
        });
    }
    // As the webhook: a TalosConfigPatch written is dry-rendered against the machines it
    // selects (here from the objects: the TalosCluster's published redacted base, its
    // machines and its other patches), the result the facts of its `apply patch` event.
    let config_patch = match crate::runtime::configpatch::from_request(&req) {
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            return Ok(Outcome {
                header,
                decision: Decision::default(),
                traces: Vec::new(),
                events: 0,
                kinds: Vec::new(),
                not_by_rule: Some(e),
                notes: Vec::new(),
                missing_clusters: Vec::new(),
                member_dead_offline: false,
                request: Some(req),
            });
        }
        None => None,
    };
    let dry = config_patch.as_ref().map(|p| {
        crate::runtime::configpatch::dry_render_of(
            snapshot.cluster(p.namespace(), p.cluster()),
            &snapshot.machines,
            &snapshot.patches,
            p,
        )
    });
    let events = match (&config_patch, &dry) {
        (Some(p), Some(d)) => vec![crate::runtime::configpatch::patch_event(
            &req.namespace,
            p,
            d,
        )],
        _ => request_events(
            req.operation(),
            &req.namespace,
            req.old.as_ref(),
            req.new.as_ref(),
        ),
    };
    let mut notes = Vec::new();
    if let (Some(p), Some(d)) = (&config_patch, &dry)
        && !d.rendered
        && let Some(c) = snapshot.cluster(p.namespace(), p.cluster())
    {
        let published = c.status.as_ref().and_then(|s| s.redacted_base.as_ref());
        notes.push(format!(
            "TalosCluster {}/{} {} in the objects: nothing to render the patch against, so \
             it breaks nothing (as the webhook decides then)",
            p.namespace(),
            p.cluster(),
            if published.is_some() {
                "has a published base (status.redactedBase) that does not parse"
            } else {
                "has no published base (status.redactedBase) yet"
            }
        ));
    }
    let (decision, traces) = decide_request_events(
        table,
        snapshot,
        &events,
        Expensive::FromObjects,
        trace,
        req.by_controller(controller_username),
    );
    let mut missing = Missing::default();
    missing_clusters(snapshot, &events, &mut missing);
    notes.extend(missing.notes);
    let count = events.len();
    let kinds = events.iter().map(|e| e.event).collect();
    drop(events);
    Ok(Outcome {
        header,
        decision,
        traces,
        events: count,
        kinds,
        not_by_rule: None,
        notes,
        missing_clusters: missing.clusters,
        member_dead_offline: false,
        request: Some(req),
    })
}

/// Decides a reconcile of the TalosMachine or TalosOperation `ns/name` as the controller
/// does. `Err` when the objects hold neither.
/// The `step operation` rules of the running operation `ns/name` on the machine it works
/// on (`node`; by default `spec.machine`), as the controller decides them before each step
/// (the etcd counts from the objects, as admission reads them).
pub fn step(
    table: &Table,
    snapshot: &Snapshot,
    ns: &str,
    name: &str,
    node: Option<&str>,
    trace: bool,
) -> Result<Outcome, String> {
    let Some(o) = snapshot.operation(ns, name) else {
        return Err(format!("no TalosOperation {ns}/{name}"));
    };
    let Some(node) = node.or(o.spec.machine.as_deref()).filter(|n| !n.is_empty()) else {
        return Err(format!(
            "TalosOperation {ns}/{name} names no spec.machine: say which machine the step \
             works on (`node: NAME`)"
        ));
    };
    let view = crate::runtime::decide::operation_on(o, node);
    let events: Vec<EventFacts<'_>> = crate::runtime::decide::step_operation_event(&view)
        .into_iter()
        .collect();
    if events.is_empty() {
        return Err(format!(
            "TalosOperation {ns}/{name} has finished: it takes no more steps"
        ));
    }
    let (decision, traces) = decide_events(table, snapshot, &events, Expensive::FromObjects, trace);
    let mut missing = Missing::default();
    missing_clusters(snapshot, &events, &mut missing);
    Ok(Outcome {
        header: format!("controller: step of {ns}/{name} on {node}"),
        decision,
        traces,
        events: events.len(),
        kinds: events.iter().map(|e| e.event).collect(),
        not_by_rule: None,
        notes: missing.notes,
        missing_clusters: missing.clusters,
        member_dead_offline: false,
        request: None,
    })
}

pub fn reconcile(
    table: &Table,
    snapshot: &Snapshot,
    ns: &str,
    name: &str,
    trace: bool,
) -> Result<Outcome, String> {
    let events: Vec<EventFacts<'_>> = if let Some(m) = snapshot.machine(ns, name) {
        reconcile_machine_event(m).into_iter().collect()
    } else if let Some(o) = snapshot.operation(ns, name) {
        reconcile_operation_event(o).into_iter().collect()
    } else {
        return Err(format!("no TalosMachine or TalosOperation {ns}/{name}"));
    };
    let (mut decision, mut traces) =
        decide_events(table, snapshot, &events, Expensive::FromObjects, trace);
    let mut count = events.len();
    let mut kinds: Vec<crate::check::Event> = events.iter().map(|e| e.event).collect();
    let mut missing = Missing::default();
    missing_clusters(snapshot, &events, &mut missing);
    // As the controller: an operation that has not started, and is not held, has its
    // start rules decided again.
    if decision.verdict().is_none()
        && snapshot.machine(ns, name).is_none()
        && let Some(o) = snapshot.operation(ns, name)
    {
        let start: Vec<_> = reconcile_start_event(o).into_iter().collect();
        let (d, t) = decide_events(table, snapshot, &start, Expensive::FromObjects, trace);
        decision.refusals.extend(d.refusals);
        decision.holds.extend(d.holds);
        decision.warnings.extend(d.warnings);
        traces.extend(t);
        count += start.len();
        kinds.extend(start.iter().map(|e| e.event));
        missing_clusters(snapshot, &start, &mut missing);
    }
    let member_dead_offline = events
        .iter()
        .any(|e| e.event.1 == crate::vocab::Subject::ControlPlane);
    Ok(Outcome {
        header: format!("controller: reconcile {ns}/{name}"),
        decision,
        traces,
        events: count,
        kinds,
        not_by_rule: None,
        notes: missing.notes,
        missing_clusters: missing.clusters,
        member_dead_offline,
        request: None,
    })
}
