//! The model ([`Model`]) and every successor of a state: people's requests (decided on
//! it, committed at once or left in flight), commits of what is in flight, the
//! controller's reconciles ([`super::controller`]) and the world's moves
//! ([`super::environment`]: a node dies or returns, etcd catches up, a PodDisruptionBudget
//! blocks or lifts, the lock expires, the backup's snapshot is taken or ages).

use super::bounds::{Bounds, BoundsError, ix};
use super::moves::{Fired, Move, Next, committed, effect};
use super::objects::{Lazy, Memo, Objects};
use super::requests::outcome;
use super::state::{ClusterState, Lock, OpKind, Pending, Phase, Req, State, drop_machine};
use crate::compile::{PlanStep, Table};
use crate::runtime::objects::Snapshot;
use crate::vocab::{Verb, Verdict};

// Named by doc links only.
#[cfg(doc)]
use super::objects::object_key;

/// Explores transitions with one rule set.
pub struct Model<'t> {
    pub table: &'t Table,
    pub bounds: Bounds,
    pub objects: Objects<'t>,
}

/// The controller's answer for a removal, for liveness: refused by a rule (a named wait).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Removals in progress that wait, in this state, on something named: a rule's
    /// refusal outside a teardown, a fact that cannot be read, a node that does not
    /// answer, a PodDisruptionBudget, the lock held by other work, a member left behind.
    pub removals_waiting: u8,
    /// Operations in progress that wait, in this state, on something named: a rule's
    /// refusal (parked for the even count, a start or step refused), or the executor's
    /// named wait (a node or etcd not back yet, the lock held by other work).
    pub ops_waiting: u8,
    /// ADR 0137: the count is even, an operation waits for it to be odd, and removing a
    /// control plane (which would end the even count) is refused although it would be
    /// allowed without the waiting operations: they block their own cure.
    /// The control plane whose delete is so refused, and the waiting operations (a bit
    /// set of their indices).
    pub cure_blocked: Option<(u8, u64)>,
}

impl<'t> Model<'t> {
    /// A model of `table` within `bounds`, if a model can hold them ([`Bounds::check`]).
    pub fn new(table: &'t Table, bounds: Bounds) -> Result<Self, BoundsError> {
        bounds.check()?;
        let plan = table
            .plan(Verb::Remove, crate::vocab::Subject::ControlPlane)
            .map(|p| p.steps.as_slice());
        Ok(Model {
            table,
            bounds,
            objects: Objects {
                table,
                plan,
                parking_reason: table
                    .parking_reasons()
                    .first()
                    .map_or("Refused", String::as_str),
                roll_width: bounds.roll_width,
                fresh_at: k8s_openapi::jiff::Timestamp::now(),
                backup: super::objects::outside_backup(super::bounds::NAMESPACE, 3),
            },
        })
    }

    pub(super) fn plan(&self) -> &'t [PlanStep] {
        self.objects.plan.unwrap_or(&[])
    }

    /// Every successor of `s`. `snap` is `s` (or a state with the same [`object_key`]) as
    /// objects, built when first needed.
    ///
    /// `memo` holds the decisions made for another state with the same objects
    /// ([`object_key`]), or none ([`Memo::clear`]); this state's are added.
    pub fn successors(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) -> Outcomes {
        self.people(s, snap, memo, fired, out);
        self.acting(s, snap, memo, fired, out)
    }

    /// The successors of `s` by people: requests decided on it (committed at once or left
    /// in flight), and commits of the requests in flight.
    pub fn people(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) {
        // People: decided on this state; admitted ones commit at once or stay in flight.
        for req in self.requests(s) {
            let verdict = self.admitted(s, snap, memo, fired, req);
            let Some(verdict) = verdict else {
                continue;
            };
            if verdict == Some(Verdict::Refuse) {
                continue;
            }
            let p = Pending {
                req,
                base: Self::base(s, req),
                warned: verdict == Some(Verdict::Warn),
            };
            // Counted only under a budget (a count nobody reads would tell equal states
            // apart).
            let used = if self.bounds.max_requests.is_some() {
                s.requests.saturating_add(u8::from(req.counts()))
            } else {
                0
            };
            if let Some(mut t) = self.commit(s, p) {
                t.requests = used;
                if !s.pending.is_empty() {
                    t.concurrent = true;
                }
                out.push(Next {
                    mv: Move::Admit {
                        req,
                        in_flight: false,
                    },
                    effect: committed(p, &t),
                    state: t,
                });
            }
            if s.pending.len() < usize::from(self.bounds.in_flight) {
                let mut t = s.fork();
                t.requests = used;
                t.pending.push(p);
                out.push(Next {
                    mv: Move::Admit {
                        req,
                        in_flight: true,
                    },
                    state: t,
                    effect: effect("admit"),
                });
            }
        }
        for (kidx, p) in ix(&s.pending) {
            let k = usize::from(kidx);
            let mut rest = s.fork();
            rest.pending.remove(k);
            let (t, e) = match self.commit(&rest, *p) {
                Some(mut t) => {
                    // Committed while another request is still in flight.
                    t.concurrent |= !rest.pending.is_empty();
                    let e = committed(*p, &t);
                    (t, e)
                }
                None => (rest, effect("conflict")),
            };
            out.push(Next {
                mv: Move::Commit(kidx),
                state: t,
                effect: e,
            });
        }
    }

    /// The successors of `s` by the controller and the world. They read nothing of `s`
    /// that [`unseen`] clears (requests in flight have not reached the API server; the
    /// counts are the explorer's), so they are those of `unseen(s)`, [`lift`]ed.
    pub fn acting(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        memo: &mut Memo,
        fired: &mut Fired,
        out: &mut Vec<Next>,
    ) -> Outcomes {
        let mut outcomes = Outcomes::default();
        // The controller.
        if s.cluster != ClusterState::Gone {
            for (idx, m) in ix(&s.machines) {
                let i = usize::from(idx);
                if m.deleting {
                    if m.finalizer {
                        let named = self.removal(s, snap, idx, memo, fired, out);
                        outcomes.removals_waiting += u8::from(named);
                    }
                    continue;
                }
                if m.approved_cp()
                    && let Some((t, e)) = self.apply(s, snap, i, memo, fired)
                {
                    out.push(Next {
                        mv: Move::Apply(idx),
                        state: t,
                        effect: e,
                    });
                }
                // The controller probes every approved machine's node (a worker's too:
                // `workers.others_up` reads what it recorded).
                if (m.approved_cp() || m.approved_worker()) && m.up == m.unreachable {
                    let mut t = s.fork();
                    t.machines[i].unreachable = !m.up;
                    out.push(Next {
                        mv: Move::Probe(idx),
                        state: t,
                        effect: effect("probe"),
                    });
                }
            }
            // Operations the controller leaves waiting here while the count is even: not
            // an etcd restore, not started, not holding the lock (ADR 0137).
            let mut waiting: u64 = 0;
            for (kidx, o) in ix(&s.ops) {
                let (added, named) = self.operation(s, snap, kidx, memo, fired, out);
                outcomes.ops_waiting += u8::from(named);
                if !added
                    && o.kind != OpKind::Restore
                    && matches!(o.phase, Phase::Pending | Phase::Parked)
                    && s.lock != Lock::Operation(kidx)
                    && kidx < 64
                {
                    waiting |= 1 << kidx;
                }
            }
            if waiting != 0 {
                outcomes.cure_blocked = self
                    .cure_blocked(s, snap, memo, fired, waiting)
                    .map(|i| (i, waiting));
            }
            if s.cluster == ClusterState::Deleting && s.machines.iter().all(|m| m.moved) {
                let mut t = s.fork();
                t.cluster = ClusterState::Gone;
                t.ops.clear();
                t.op_names.clear();
                t.pending.clear();
                out.push(Next {
                    mv: Move::Teardown,
                    state: t,
                    effect: effect("teardown"),
                });
            }
        }
        // The world.
        self.environment(s, out);
        outcomes
    }

    /// [`Outcomes::cure_blocked`] for the operations in the bit set `waiting`: an approved
    /// control plane whose annotated delete is refused here, and allowed on the same state
    /// without those operations.
    fn cure_blocked(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        memo: &mut Memo,
        fired: &mut Fired,
        waiting: u64,
    ) -> Option<u8> {
        let approved = s.approved_cps();
        if s.cluster != ClusterState::Live || approved == 0 || !approved.is_multiple_of(2) {
            return None;
        }
        let mut without: Option<(State, Snapshot)> = None;
        for (i, m) in ix(&s.machines) {
            if !m.approved_cp() || m.deleting || m.moved {
                continue;
            }
            let req = Req::Delete(i);
            let verdict = self.admitted(s, snap, memo, fired, req);
            if verdict != Some(Some(Verdict::Refuse)) {
                continue;
            }
            let (u, usnap) = without.get_or_insert_with(|| {
                let mut u = s.fork();
                let mut k = u.ops.len();
                while k > 0 {
                    k -= 1;
                    if waiting & (1 << k) != 0 {
                        u.ops.remove(k);
                        if k < u.op_names.len() {
                            u.op_names.remove(k);
                        }
                        if let Lock::Operation(h) = u.lock
                            && usize::from(h) > k
                        {
                            u.lock = Lock::Operation(h - 1);
                        }
                    }
                }
                let usnap = self.objects.snapshot(&u);
                (u, usnap)
            });
            let alone = self.admit(u, usnap, req).map(|d| outcome(&d));
            if matches!(alone, Some(v) if v != Some(Verdict::Refuse)) {
                return Some(i);
            }
        }
        None
    }
}

/// `s` as the controller and the world see it: no request in flight (the API server has
/// not seen them), no count of requests made, not marked concurrent (both the explorer's
/// bookkeeping). Written into `out`, keeping its lists' allocations.
pub fn unseen_into(s: &State, out: &mut State) {
    out.copy_from(s);
    out.pending.clear();
    out.requests = 0;
    out.concurrent = false;
}

/// What a move of the controller or the world did to the machines, as the requests in
/// flight must follow it ([`lift`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renumber {
    /// The same machines in the same order.
    Same,
    /// Machine `i` removed ([`super::state::remove_machine`]).
    Removed(u8),
    /// A teardown: nothing is in flight any more.
    Cleared,
}

/// How `t0`, the successor of `s0` by `mv`, renumbers the machines of `s0`; `None` when
/// that cannot be told (the requests in flight could not follow).
///
/// Moves of the controller and the world never add machines nor reorder them; one may
/// remove one (a released finalizer). A machine is known by its name and role (control
/// planes and workers are named apart).
pub fn renumbering(s0: &State, mv: Move, t0: &State) -> Option<Renumber> {
    if mv == Move::Teardown {
        return Some(Renumber::Cleared);
    }
    if t0.machines.len() == s0.machines.len() {
        return Some(Renumber::Same);
    }
    if t0.machines.len() + 1 != s0.machines.len() {
        return None;
    }
    let id = |s: &State, j: usize| (s.names.get(j).copied(), s.machines.get(j).map(|m| m.role));
    let without = |k: usize| {
        (0..s0.machines.len())
            .filter(|j| *j != k)
            .enumerate()
            .all(|(n, j)| id(s0, j) == id(t0, n))
    };
    let mut removed = (0..s0.machines.len()).filter(|k| without(*k));
    match (removed.next(), removed.next()) {
        (Some(k), None) => u8::try_from(k).ok().map(Renumber::Removed),
        _ => None,
    }
}

/// Makes `t`, a copy of a successor of `unseen(s)` ([`Model::acting`]), the same
/// successor of `s`: `s`'s requests in flight, renumbered as the move renumbered the
/// machines (`how`, from [`renumbering`]), and `s`'s counts.
pub fn lift(s: &State, how: Renumber, t: &mut State) {
    t.requests = s.requests;
    t.concurrent = s.concurrent;
    lift_pending(&s.pending, how, &mut t.pending);
}

/// The requests in flight `pending` after a move that renumbered the machines as `how`
/// says, written into `out`: those of a removed machine gone, the others following it.
pub fn lift_pending(pending: &[Pending], how: Renumber, out: &mut Vec<Pending>) {
    out.clear();
    match how {
        Renumber::Same => out.extend_from_slice(pending),
        Renumber::Removed(i) => {
            out.extend_from_slice(pending);
            drop_machine(out, i);
        }
        Renumber::Cleared => {}
    }
}
