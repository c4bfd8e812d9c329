//! The controller's reconciles in the model: the over-cap hold and joining, a control
//! plane's removal and an operation, each run by the executor's own procedure
//! against the model's world ([`ModelWorld`]).

use super::bounds::{GONE, NONE, ix};
use super::moves::{Effect, Fired, Move, Next, effect, step_index};
use super::objects::{Lazy, Memo};
use super::state::{Lock, Machine, OpKind, OpRun, Phase, State};
use super::successors::Model;
use crate::runtime::decide::{
    decide_events, reconcile_machine_event, reconcile_operation_event, reconcile_start_event,
};
use crate::runtime::exec::{self, Outcome, Timing, Wait, run_now};
use crate::runtime::facts::Expensive;
use crate::verify::world::{self, Faults, ModelWorld};

impl Model<'_> {
    /// The over-cap hold and joining (`controller/machine.rs`, step 1 and 2).
    pub(super) fn apply(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        i: usize,
        memo: &mut Memo,
        fired: &mut Fired,
    ) -> Option<(State, Effect)> {
        let held = match memo.held.get(i).copied().flatten() {
            Some(held) => held,
            None => {
                let snap = snap.get();
                let live = snap.machines.get(i)?;
                let events: Vec<_> = reconcile_machine_event(live).into_iter().collect();
                let (decision, _) =
                    decide_events(self.table, snap, &events, Expensive::Deferred, false);
                fired.note(&decision);
                let held = crate::runtime::controller::hold_of(&decision, "Held").is_some();
                if let Some(slot) = memo.held.get_mut(i) {
                    *slot = Some(held);
                }
                held
            }
        };
        let m = &s.machines[i];
        // Counted in a byte: the machines are at most MAX_MACHINES (Bounds::check).
        let rank = ix(&s.machines)
            .filter(|(_, x)| x.approved_cp() && !x.deleting && x.order <= m.order)
            .fold(0u8, |n, _| n.saturating_add(1));
        let mut t = s.fork();
        if held {
            if m.held {
                return None;
            }
            t.machines[i].held = true;
            return Some((t, effect("hold")));
        }
        if m.held {
            t.machines[i].held = false;
            return Some((
                t,
                Effect {
                    rank,
                    ..effect("release-hold")
                },
            ));
        }
        if !m.joined && (m.member || (m.up && !m.wiped)) {
            let tm = &mut t.machines[i];
            tm.joined = true;
            tm.member |= tm.up && !tm.wiped;
            tm.finalizer = true;
            return Some((
                t,
                Effect {
                    rank,
                    ..effect("join")
                },
            ));
        }
        None
    }

    /// One reconcile of a deleted control plane's removal: the executor's procedure
    /// ([`exec::removal::reconcile`]), run against this state's world. Its successors, in
    /// `out`: the state where the reconcile ended, each state after a status write that
    /// changed it (a controller may stop there and a new one resume), and, within the
    /// failure budget, for each call that acted, the state where its answer was lost or the
    /// controller crashed right after it. Returns whether the removal waits on something
    /// named (a refusal outside a teardown, a node, etcd, a PDB, the lock held by other
    /// work, a member left behind).
    pub(super) fn removal(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        idx: u8,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) -> bool {
        let i = usize::from(idx);
        let teardown = s.cluster.torn_down();
        let arc = snap.arc();
        let Some(live) = arc.machines.get(i) else {
            return false;
        };
        let timing = Timing {
            refused_requeue: std::time::Duration::from_secs(30),
            lock_retry: std::time::Duration::from_secs(5),
            drain_retry: std::time::Duration::from_secs(15),
            reset_settle: std::time::Duration::from_secs(60),
            sent_deadline: std::time::Duration::from_secs(600),
        };
        let faulting = s.failures < self.bounds.max_failures;
        let run = |faults: Faults, fired: &mut Fired, memo: &mut Memo| {
            let mut w = ModelWorld::new(
                s.fork(),
                idx,
                &arc,
                Some(arc.clone()),
                self.plan(),
                fired,
                memo,
            )
            .with_faults(faults)
            .keeping_landed(faulting && faults == Faults::default() && crashes_from_landed());
            let outcome = run_now(exec::removal::reconcile(&mut w, self.table, &timing, live));
            let ModelWorld {
                t,
                acts,
                effect,
                stops,
                landed,
                ..
            } = w;
            (t, acts, effect, stops, landed, outcome)
        };
        let label = |t: &State, mut e: Effect| {
            if e.step == 0 {
                e.step = step_index(if t.lock == Lock::Removal(idx) {
                    "lock"
                } else {
                    "refused"
                });
            }
            e
        };
        let (t, acts, effect, stops, landed, outcome) = run(Faults::default(), fired, memo);
        let named = match &outcome {
            Some(Ok(Outcome::Requeue {
                wait: Wait::On(_), ..
            })) => true,
            Some(Ok(Outcome::Requeue {
                wait: Wait::Refused,
                ..
            })) => !teardown,
            _ => false,
        };
        for (u, e) in stops {
            if u != *s && u != t {
                out.push(Next {
                    mv: Move::Removal(idx),
                    effect: label(&u, e),
                    state: u,
                });
            }
        }
        if t != *s {
            out.push(Next {
                mv: Move::Removal(idx),
                effect: label(&t, effect),
                state: t,
            });
        }
        if faulting {
            let moves = [
                Move::RemovalLost(idx),
                Move::RemovalCrash(idx),
                Move::RemovalRefused(idx),
            ];
            for (faults, mv) in Faults::each(acts, moves) {
                let (mut u, e) = match faults
                    .crash
                    .and_then(|n| landed.as_ref()?.get(usize::from(n)))
                {
                    Some((u, e)) => (u.clone(), *e),
                    None => {
                        let (u, _, e, _, _, _) = run(faults, fired, memo);
                        (u, e)
                    }
                };
                u.failures += 1;
                out.push(Next {
                    mv,
                    effect: label(&u, e),
                    state: u,
                });
            }
        }
        named
    }

    /// One reconcile of an operation: parked or resumed by the `run operation` rules; its
    /// `start` rules decided again; then its plan runs through the executor's procedure
    /// ([`exec::operation::reconcile`], as the controller runs it in the same reconcile),
    /// in this state's world. Its successors go to `out`: where the reconcile ended and,
    /// within the failure budget, for each call that acted, the state where its answer
    /// was lost, the controller crashed right after it, or it was refused. Returns whether
    /// any successor was added.
    pub(super) fn operation(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        kidx: u8,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) -> (bool, bool) {
        let k = usize::from(kidx);
        let o = s.ops[k];
        let with_kind = |e: Effect| Effect {
            kind: Some(o.kind),
            ..e
        };
        match o.phase {
            Phase::Succeeded => (false, false),
            // Failed: the executor touches nothing more (ADR 0137); the controller still
            // reconciles it, and `failed-touches-nothing` holds the executor to that.
            Phase::Failed => self.run_operation(s, snap, kidx, memo, fired, out),
            Phase::Pending | Phase::Parked | Phase::Running => {
                let arc = snap.arc();
                let Some(live) = arc.operations.get(k) else {
                    return (false, false);
                };
                let mut t = s.fork();
                let events: Vec<_> = reconcile_operation_event(live).into_iter().collect();
                let (decision, _) =
                    decide_events(self.table, &arc, &events, Expensive::Deferred, false);
                fired.note(&decision);
                if crate::runtime::controller::hold_of(&decision, "Refused").is_some() {
                    if o.phase == Phase::Parked {
                        // Parked, and left so: it waits for the even count to end.
                        return (false, true);
                    }
                    t.ops[k].phase = Phase::Parked;
                    out.push(Next {
                        mv: Move::Operation(kidx),
                        state: t,
                        effect: with_kind(effect("operation-park")),
                    });
                    return (true, false);
                }
                if o.phase == Phase::Parked {
                    t.ops[k].phase = Phase::Pending;
                    out.push(Next {
                        mv: Move::Operation(kidx),
                        state: t,
                        effect: with_kind(effect("operation-resume")),
                    });
                    return (true, false);
                }
                // Started: `controller/operation.rs` runs it on (the start rules are for
                // one that has not started).
                if o.phase == Phase::Running {
                    return self.run_operation(s, snap, kidx, memo, fired, out);
                }
                // `controller/operation.rs::start_again`: the start rules again, with
                // `healthy.after` asked of etcd.
                let Some(ev) = reconcile_start_event(live) else {
                    return (false, false);
                };
                let target = (o.target != NONE && o.target != GONE)
                    .then(|| arc.machines.get(usize::from(o.target)))
                    .flatten();
                let decision = world::ask_and_decide(self.table, s, &arc, ev, target, fired);
                fired.note(&decision);
                if crate::runtime::controller::hold_of(&decision, "StartRefused").is_some() {
                    // Refused by a start rule, with its message: a named wait.
                    return (false, true);
                }
                self.run_operation(s, snap, kidx, memo, fired, out)
            }
        }
    }

    /// The executor's reconcile of operation `kidx` from state `s` (see
    /// [`Model::operation`]).
    fn run_operation(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        kidx: u8,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) -> (bool, bool) {
        let k = usize::from(kidx);
        let o = s.ops[k];
        let arc = snap.arc();
        let Some(live) = arc.operations.get(k) else {
            return (false, false);
        };
        let timing = model_timing();
        // The machine the world acts on: the target, or the node a roll is at.
        let at = o.at();
        let machine = if at == GONE { NONE } else { at };
        // Faults are explored for an operation that has not failed, within the budget.
        let faulting = s.failures < self.bounds.max_failures && o.phase != Phase::Failed;
        let run = |faults: Faults, fired: &mut Fired, memo: &mut Memo| {
            let mut w = ModelWorld::new(
                s.fork(),
                machine,
                &arc,
                Some(arc.clone()),
                self.plan(),
                fired,
                memo,
            )
            .with_faults(faults)
            .with_operation(kidx)
            .keeping_landed(faulting && faults == Faults::default() && crashes_from_landed());
            let outcome = run_now(exec::operation::reconcile(
                &mut w, self.table, &timing, live,
            ));
            let ModelWorld {
                t,
                acts,
                effect,
                landed,
                ..
            } = w;
            (t, acts, effect, landed, outcome)
        };
        // What the reconcile did, for the invariants: it started running the operation
        // (`no-operation-while-even` reads that before anything else it did), or ended it.
        let label = |t: &State, mut e: Effect| {
            e.kind = Some(o.kind);
            e.control_plane = o.kind.rolls()
                || s.machines
                    .get(usize::from(o.target))
                    .is_some_and(Machine::ever_cp);
            // An approved worker in service before this reconcile, and no longer after it.
            e.worker_taken =
                s.machines.iter().zip(&t.machines).any(|(a, b)| {
                    a.serving() && !b.serving() && b.approved_worker() && !b.deleting
                });
            let now = t.ops.get(k).map_or(o.phase, |x| x.phase);
            // An upgrade that ended here left its node back, running the new version? A roll,
            // each node it finished here (as far as it is still there)?
            // Back in service too: uncordoned, unless it was cordoned before the operation
            // touched it (`wasCordoned`, known for the node the reconcile started at: the
            // model has no administrator's cordon, but an earlier failed operation leaves
            // one).
            // A machine being deleted that the roll passed without cordoning it (the
            // executor skips one no step touched: `NodeSkipped`) was not taken down by the
            // operation: if its node is down, something else did it, and its removal takes
            // it out of service anyway; nor was it upgraded by an upgrade roll, which passed
            // it (`verify --rolls --roll-kind upgrade` found the roll blamed for the old
            // version of a control plane the garbage collector was deleting).
            let back = |j: u8, upgraded: bool| {
                let cordon_kept = o.record_of(j).is_some_and(|r| r.has(OpRun::WAS_CORDONED));
                t.machines.get(usize::from(j)).is_none_or(|m| {
                    (m.deleting && !m.boots.unsched && (!upgraded || o.kind.rolls()))
                        || m.etcd_ok()
                            && !m.boots.rebooting
                            && (m.boots.upgraded || !upgraded)
                            && (!m.boots.unsched || cordon_kept)
                })
            };
            // Did what its kind says: its call took effect on each node it finished, as far
            // as the machine is still there and not being deleted (a roll passes one being
            // deleted: `NodeSkipped`).
            if let Some(x) = t.ops.get(k)
                && o.kind.has_call()
            {
                let undone = |j: u8| {
                    t.machines
                        .get(usize::from(j))
                        .is_some_and(|m| !m.deleting && !x.did_on(j))
                };
                e.undone = if o.kind.rolls() {
                    let before: Vec<usize> = o.finished().collect();
                    x.finished()
                        .filter(|n| !before.contains(n))
                        .filter_map(|n| x.order.get(n).copied())
                        .any(undone)
                } else {
                    now == Phase::Succeeded && o.phase != Phase::Succeeded && undone(o.target)
                };
            }
            match (o.kind, t.ops.get(k)) {
                (OpKind::Upgrade | OpKind::Rollback, _)
                    if now == Phase::Succeeded && o.phase != Phase::Succeeded =>
                {
                    e.left_down = t.machines.get(usize::from(o.target)).is_none()
                        || !back(o.target, o.kind.upgrades());
                }
                (kind, Some(x)) if kind.rolls() => {
                    // A node it took out of service beside another out of service, one of
                    // the two a control plane (one re-roled since it was taken is not
                    // blamed on the roll: only what this reconcile took counts).
                    let (was, now) = (o.out_of_service(s), x.out_of_service(t));
                    let cp = |j: u8| t.machines.get(usize::from(j)).is_some_and(|m| m.ever_cp());
                    e.beside_cp = now
                        .iter()
                        .filter(|j| !was.contains(j))
                        .any(|&j| now.iter().any(|&k| k != j && (cp(j) || cp(k))));
                    let before: Vec<usize> = o.finished().collect();
                    e.left_down = x
                        .finished()
                        .filter(|n| !before.contains(n))
                        .filter_map(|n| x.order.get(n).copied())
                        .any(|j| !back(j, kind.upgrades()))
                        && o.phase != Phase::Succeeded;
                }
                _ => {}
            }
            if matches!(o.phase, Phase::Pending | Phase::Parked) && now != o.phase {
                e.step = step_index("operation-run");
            } else if e.step == 0 {
                e.step = step_index(match now {
                    Phase::Succeeded => "operation-done",
                    Phase::Failed => "operation-refused",
                    _ => "operation-step",
                });
            }
            e
        };
        let (t, acts, e, landed, outcome) = run(Faults::default(), fired, memo);
        // A failed operation's reconcile: a successor only when it did something (which
        // `failed-touches-nothing` refutes); nothing of it is faulted.
        if o.phase == Phase::Failed {
            if acts == 0 && t == *s {
                return (false, false);
            }
            let mut effect = e;
            effect.kind = Some(o.kind);
            effect.failed_touched = true;
            out.push(Next {
                mv: Move::Operation(kidx),
                effect,
                state: t,
            });
            return (true, false);
        }
        // Waiting on something named: a step rule's refusal, or the executor's named wait
        // (a node or etcd not back yet, the lock held by other work).
        let named = matches!(outcome, Some(Ok(Outcome::Requeue { .. })));
        let mut added = false;
        if t != *s {
            out.push(Next {
                mv: Move::Operation(kidx),
                effect: label(&t, e),
                state: t,
            });
            added = true;
        }
        if faulting {
            let moves = [
                Move::OperationLost(kidx),
                Move::OperationCrash(kidx),
                Move::OperationRefused(kidx),
            ];
            for (faults, mv) in Faults::each(acts, moves) {
                let (mut u, e) = match faults
                    .crash
                    .and_then(|n| landed.as_ref()?.get(usize::from(n)))
                {
                    Some((u, e)) => (u.clone(), *e),
                    None => {
                        let (u, _, e, _, _) = run(faults, fired, memo);
                        (u, e)
                    }
                };
                u.failures += 1;
                out.push(Next {
                    mv,
                    effect: label(&u, e),
                    state: u,
                });
                added = true;
            }
        }
        (added, named)
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: run each crash again instead of taking the fault-free run's state after
    /// the call (`ModelWorld::landed`), to show the two agree.
    pub(super) static RERUN_CRASHES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a crash right after an acting call is taken from the fault-free run's
/// `landed` states rather than run again.
fn crashes_from_landed() -> bool {
    #[cfg(test)]
    {
        !RERUN_CRASHES.get()
    }
    #[cfg(not(test))]
    {
        true
    }
}

/// The executor's timing in the model (its clock is the model's: only the order matters).
fn model_timing() -> Timing {
    Timing {
        refused_requeue: std::time::Duration::from_secs(30),
        lock_retry: std::time::Duration::from_secs(5),
        drain_retry: std::time::Duration::from_secs(15),
        reset_settle: std::time::Duration::from_secs(60),
        sent_deadline: std::time::Duration::from_secs(600),
    }
}
