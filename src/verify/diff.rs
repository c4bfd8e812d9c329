//! `ichor-rules diff OLD NEW`: where two rule sets decide differently, over the states the
//! model reaches with either of them.
//!
//! Every explored state (of the old rules' exploration, then of the new one's) is decided
//! with both tables: each request a person could send (as the webhook decides it), and the
//! controller's decisions (the over-cap hold, a removal, parking an operation). Differences
//! are grouped by decision and direction, with one witness per group.

use super::explore::{decode, explore};
use super::invariant::InvariantCheck;
use super::model::{Bounds, BoundsError, Model, State};
use super::trace::{describe, objects_yaml, review_json, summary};
use crate::compile::Table;
use crate::runtime::controller::hold_of;
use crate::runtime::decide::{reconcile_machine_event, reconcile_operation_event};
use crate::vocab::{Verb, Verdict};
use std::collections::{BTreeMap, HashSet};

/// One group of differences.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Group {
    /// What is decided, e.g. "remove controlplane at the webhook".
    pub decision: String,
    /// "more permissive" (the old rules refused or held, the new ones let it through) or
    /// "stricter".
    pub direction: &'static str,
    pub old: String,
    pub new: String,
    pub states: usize,
    /// One state where it differs, and the request (for an admission).
    pub witness_state: String,
    pub witness_request: Option<String>,
    #[serde(skip)]
    pub fixture: Option<(String, String)>,
}

pub struct DiffReport {
    pub bounds: Bounds,
    pub states: usize,
    pub groups: Vec<Group>,
}

fn verdict_name(v: Option<Verdict>) -> String {
    match v {
        Some(v) => v.name().to_string(),
        None => "allow".to_string(),
    }
}

fn direction(old: Option<Verdict>, new: Option<Verdict>) -> &'static str {
    let rank = |v: Option<Verdict>| match v {
        Some(Verdict::Refuse) => 2,
        Some(Verdict::Hold) => 1,
        _ => 0,
    };
    if rank(new) < rank(old) {
        "more permissive"
    } else {
        "stricter"
    }
}

struct Collector {
    groups: BTreeMap<(String, String, String), Group>,
}

impl Collector {
    fn note(
        &mut self,
        decision: String,
        old: Option<Verdict>,
        new: Option<Verdict>,
        s: &State,
        request: Option<String>,
        fixture: impl FnOnce() -> Option<(String, String)>,
    ) {
        if old == new {
            return;
        }
        let key = (decision.clone(), verdict_name(old), verdict_name(new));
        if let Some(g) = self.groups.get_mut(&key) {
            g.states += 1;
            return;
        }
        self.groups.insert(
            key,
            Group {
                decision,
                direction: direction(old, new),
                old: verdict_name(old),
                new: verdict_name(new),
                states: 1,
                witness_state: summary(s),
                witness_request: request,
                fixture: fixture(),
            },
        );
    }
}

/// The controller's removal decision for machine `i`, with etcd's answers from the model.
fn removal_verdict(
    table: &Table,
    s: &State,
    snap: &crate::runtime::objects::Snapshot,
    i: usize,
) -> Option<Option<Verdict>> {
    let live = snap.machines.get(i)?;
    let ev = reconcile_machine_event(live).filter(|e| e.event.0 == Verb::Remove)?;
    let d = super::world::ask_and_decide(
        table,
        s,
        snap,
        ev,
        Some(live),
        &mut super::model::Fired::default(),
    );
    Some(d.verdict())
}

fn compare(old: &Model<'_>, new: &Model<'_>, s: &State, c: &mut Collector) {
    let snap = old.objects.snapshot(s);
    for req in old.requests(s) {
        let (Some(a), Some(b)) = (old.admit(s, &snap, req), new.admit(s, &snap, req)) else {
            continue;
        };
        let refused = |d: &crate::interp::Decision| {
            (d.verdict() == Some(Verdict::Refuse)).then_some(Verdict::Refuse)
        };
        let (va, vb) = (refused(&a), refused(&b));
        if va == vb {
            continue;
        }
        let decision = match old.objects.request(s, &snap, req) {
            Some((op, o, n)) => {
                let evs = crate::runtime::decide::request_events(
                    &op,
                    super::model::NAMESPACE,
                    o.as_ref(),
                    n.as_ref(),
                );
                let words: Vec<String> = evs
                    .iter()
                    .map(|e| format!("{} {}", e.event.0.name(), e.event.1.name()))
                    .collect();
                if words.is_empty() {
                    "a request".to_string()
                } else {
                    format!("{} at the webhook", words.join(" + "))
                }
            }
            None => "a request".to_string(),
        };
        c.note(decision, va, vb, s, Some(describe(s, req)), || {
            old.objects.request(s, &snap, req).map(|(op, o, n)| {
                (
                    objects_yaml(&snap),
                    review_json(1, req, &op, o.as_ref(), n.as_ref()),
                )
            })
        });
    }
    for i in 0..s.machines.len() {
        let Some(live) = snap.machines.get(i) else {
            continue;
        };
        if let Some(ev) = reconcile_machine_event(live) {
            if ev.event.0 == Verb::Remove {
                let (a, b) = (
                    removal_verdict(old.table, s, &snap, i),
                    removal_verdict(new.table, s, &snap, i),
                );
                if let (Some(a), Some(b)) = (a, b) {
                    let name = s.name(i);
                    c.note(
                        "remove controlplane at the controller".into(),
                        a,
                        b,
                        s,
                        Some(format!("the removal of {name}")),
                        || None,
                    );
                }
            } else {
                let d = |t: &Table| {
                    let (d, _) = crate::runtime::decide::decide_events(
                        t,
                        &snap,
                        &[ev],
                        crate::runtime::facts::Expensive::Deferred,
                        false,
                    );
                    hold_of(&d, "Held").map(|_| Verdict::Hold)
                };
                let name = s.name(i);
                c.note(
                    format!("apply {} at the controller", ev.event.1.name()),
                    d(old.table),
                    d(new.table),
                    s,
                    Some(format!("applying {name}")),
                    || None,
                );
            }
        }
    }
    for o in &snap.operations {
        if let Some(ev) = reconcile_operation_event(o) {
            let d = |t: &Table| {
                let (d, _) = crate::runtime::decide::decide_events(
                    t,
                    &snap,
                    &[ev],
                    crate::runtime::facts::Expensive::Deferred,
                    false,
                );
                hold_of(&d, "Refused").map(|_| Verdict::Hold)
            };
            c.note(
                "run operation at the controller".into(),
                d(old.table),
                d(new.table),
                s,
                Some(format!("running {}", o.name())),
                || None,
            );
        }
    }
}

/// Compares two tables over the states either reaches within `bounds`.
pub fn diff(old: &Table, new: &Table, bounds: Bounds) -> Result<DiffReport, BoundsError> {
    let (mo, mn) = (Model::new(old, bounds)?, Model::new(new, bounds)?);
    let mut c = Collector {
        groups: BTreeMap::new(),
    };
    let mut seen: HashSet<Box<[u8]>> = HashSet::new();
    let checks: Vec<InvariantCheck> = Vec::new();
    for m in [&mo, &mn] {
        let ex = explore(m, &checks);
        for key in ex.keys.iter() {
            if !seen.insert(key.into()) {
                continue;
            }
            let Some(s) = decode(key) else { continue };
            compare(&mo, &mn, &s, &mut c);
        }
    }
    Ok(DiffReport {
        bounds,
        states: seen.len(),
        groups: c.groups.into_values().collect(),
    })
}
