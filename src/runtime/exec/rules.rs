//! The controller's decisions without I/O: the removal's rules with the expensive facts
//! supplied so far, a plan step's guards and message, and what a decision holds. The
//! controller calls them between its reads and writes; `verify`'s model calls the same
//! functions, so what it explores is what the controller decides.

use crate::compile::{PlanStep, Table};
use crate::interp::{Decision, Interrupt, Session, StepError, StepOutcome, decide_into};
use crate::runtime::facts::{EventFacts, Expensive, SnapshotFacts};
use crate::runtime::objects::Snapshot;
use crate::vocab::Fact;

/// Decides the removal with the facts supplied so far; `Err(fact)` when an expensive fact
/// must be fetched first. No I/O: `verify`'s model calls it as the controller does.
pub fn decide(
    table: &Table,
    snapshot: &Snapshot,
    ev: EventFacts<'_>,
    supplied: &[(Fact, i64)],
) -> Result<Decision, Fact> {
    let mut session = Session::new(
        table,
        SnapshotFacts::new(table, snapshot, ev, Expensive::Deferred),
    );
    supply(&mut session, supplied);
    let mut decision = Decision::default();
    match decide_into(&mut session, ev.event, &mut decision) {
        Ok(()) => Ok(decision),
        Err(Interrupt::Need(f)) => Err(f),
    }
}

fn supply<'a, F: crate::interp::Facts<'a>>(session: &mut Session<'a, F>, supplied: &[(Fact, i64)]) {
    for (fact, v) in supplied {
        session.supply_number(*fact, *v);
    }
}

/// Whether a plan step runs: its guards, evaluated with the removal's facts (and its
/// message when it runs), by the interpreter's [`Session::step`]. A guard that cannot be
/// evaluated stops the removal (fails closed). No I/O: `verify`'s model calls it as the
/// controller does.
pub fn applies(
    table: &Table,
    snapshot: &Snapshot,
    ev: EventFacts<'_>,
    supplied: &[(Fact, i64)],
    step: &PlanStep,
) -> Result<(bool, Option<String>), String> {
    let mut session = Session::new(
        table,
        SnapshotFacts::new(table, snapshot, ev, Expensive::Deferred),
    );
    supply(&mut session, supplied);
    match session.step(step) {
        Ok(StepOutcome { runs, message }) => Ok((runs, message)),
        Err(StepError::Guard(e)) => Err(format!(
            "the guard of `{}` could not be evaluated ({e})",
            step.text
        )),
        Err(StepError::Needs(f)) => Err(format!(
            "the guard of `{}` needs `{f}`, which the controller cannot read",
            step.text
        )),
        Err(StepError::MessageNeeds(f)) => {
            Err(format!("the message of `{}` needs `{f}`", step.text))
        }
    }
}

/// What held or refused, as a condition's (reason, message): the first reason a deciding
/// rule gives (else `default_reason`) and every deciding message; `None` when the decision
/// lets the work proceed. [`super::held`] is this with the metrics.
pub fn hold_of(
    decision: &crate::interp::Decision,
    default_reason: &str,
) -> Option<(String, String)> {
    decision.verdict()?;
    let deciding = decision.deciding();
    let reason = deciding
        .iter()
        .find_map(|f| f.reason.clone())
        .unwrap_or_else(|| default_reason.into());
    let message = deciding
        .iter()
        .map(|f| f.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    Some((reason, message))
}

/// A decision with the expensive facts it needed, asked of the world as it needed them.
pub struct Asked {
    pub decision: Decision,
    /// What `member.dead` found, when a rule asked for it.
    pub deadness: Option<super::etcd::Deadness>,
    /// The etcd ID of the member judged (when a sibling listed it).
    pub member_id: Option<u64>,
    /// The id of the decision's record, when the world keeps records.
    pub id: Option<String>,
}

/// The one "ask, supply, decide again" loop: decides `ev` with the facts supplied so far;
/// when a rule needs an expensive fact, asks the world for it (of the etcd of `departing`'s
/// cluster: `member.dead`, `healthy.after`, `members.after`) and decides again. A count
/// that cannot be read refuses with `unreadable(fact, why)` beside the other rules' findings
/// (their reasons as the objects show them); any other fact that cannot be supplied
/// refuses with `unreadable(fact, "")`. `marked`: the removal already proceeded as a
/// dead-member removal ([`super::etcd::member_dead`]).
pub async fn decide_asking<W: super::World>(
    w: &mut W,
    table: &Table,
    snapshot: &Snapshot,
    ev: EventFacts<'_>,
    departing: Option<&crate::runtime::objects::TalosMachine>,
    marked: bool,
    unreadable: &(dyn Fn(Fact, &str) -> crate::interp::Finding + Sync),
) -> Result<Asked, W::Error> {
    let started = std::time::Instant::now();
    let mut supplied: Vec<(Fact, i64)> = Vec::new();
    let mut asked = Asked {
        decision: Decision::default(),
        deadness: None,
        member_id: None,
        id: None,
    };
    // Every way out records the decision taken, once (a world without a journal: nothing).
    let recorded = |w: &mut W, mut asked: Asked, supplied: &[(Fact, i64)]| {
        if let Some(j) = w.journal() {
            asked.id = Some(j.decision(table, snapshot, ev, supplied, &asked.decision, started));
        }
        asked
    };
    loop {
        let need = match w.decide(table, snapshot, ev, &supplied) {
            Ok(d) => {
                asked.decision = d;
                return Ok(recorded(w, asked, &supplied));
            }
            Err(f) => f,
        };
        let fresh = !supplied.iter().any(|(s, _)| *s == need);
        match (need, departing) {
            (Fact::MemberDead, Some(m)) if fresh => {
                let (found, id) = super::etcd::member_dead(w, snapshot, m, marked).await?;
                let dead = found.is_dead();
                if let Some(j) = w.journal() {
                    j.fact(need, i64::from(dead), found.why());
                }
                w.note(
                    m,
                    super::Note::Fact {
                        fact: need,
                        value: i64::from(dead),
                        why: found.why(),
                    },
                );
                supplied.push((need, i64::from(dead)));
                asked.member_id = id;
                asked.deadness = Some(found);
            }
            (Fact::HealthyAfter | Fact::MembersAfter, Some(m)) if fresh => {
                match super::etcd::count(w, need, snapshot, m).await? {
                    Ok(n) => {
                        if let Some(j) = w.journal() {
                            j.fact(need, n, "counted through a healthy sibling");
                        }
                        w.note(
                            m,
                            super::Note::Fact {
                                fact: need,
                                value: n,
                                why: "counted through a healthy sibling",
                            },
                        );
                        supplied.push((need, n));
                    }
                    Err(why) => {
                        let (mut d, _) = crate::runtime::decide::decide_events(
                            table,
                            snapshot,
                            &[ev],
                            Expensive::FromObjects,
                            false,
                        );
                        d.refusals.push(unreadable(need, &why));
                        asked.decision = d;
                        return Ok(recorded(w, asked, &supplied));
                    }
                }
            }
            _ => {
                let mut d = Decision::default();
                d.refusals.push(unreadable(need, ""));
                asked.decision = d;
                return Ok(recorded(w, asked, &supplied));
            }
        }
    }
}
