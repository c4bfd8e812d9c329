//! Conformance: the model's behaviours, taken by a real run.
//!
//! A walk of the model (seeded, random among the moves a real run can replay) or a
//! counterexample is replayed against the real controller, the webhook's decision, the
//! Talos stand-in and a real etcd (`tests/conformance.rs`). After every move both sides are
//! reduced to the same [`View`] (the objects as the API server holds them, etcd's
//! membership, which nodes answer, cordons, the cluster lock's holder) by the same
//! functions, and the real view must be the view of one of the model's successors by that
//! move from the same state: every real step is one the model allows, and the walk goes on
//! from the model state it matched.
//!
//! What a real run cannot be made to do here is not replayed: a request left in flight, an
//! answer lost or a controller crashed after an acting call, a node coming back, a
//! PodDisruptionBudget, operations (the model's operations are not executed by the product
//! yet) and the joining of new machines. [`replayable`] says which moves are.

use super::model::{Lazy, Memo, Model, Move, Next, Req, State};
use crate::compile::PlanStep;
use crate::runtime::controller::disruptive::Work;
use crate::runtime::objects::TalosMachine;
use std::collections::BTreeMap;

/// What one machine is, as both sides are compared: its object as the API server holds it
/// (as far as the model keeps it) and what stands behind it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineView {
    pub approved: bool,
    pub control_plane: bool,
    pub cluster: String,
    pub deleting: bool,
    pub finalizer: bool,
    /// `status.removal`: the plan steps done (bits by index), the step started (index + 1,
    /// 0 for none), committed, memberDead, and whether a member ID is recorded.
    pub done: u16,
    pub started: u8,
    pub committed: bool,
    pub dead: bool,
    pub recorded: bool,
    /// etcd lists a member of its name.
    pub member: bool,
    /// Its node's Talos API answers (running and not reset).
    pub answers: bool,
    /// Its node was reset or wiped.
    pub wiped: bool,
    /// Its Kubernetes Node is cordoned.
    pub cordoned: bool,
}

/// A whole run's state as both sides are compared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// By machine name.
    pub machines: BTreeMap<String, MachineView>,
    /// The declared control-plane count (`None`: no TalosCluster).
    pub count: Option<i64>,
    /// The names etcd lists as members (a member outlives its machine's object when a
    /// removal leaves it behind).
    pub members: std::collections::BTreeSet<String>,
    /// The cluster lock's holder identity (`None`: free).
    pub lock: Option<String>,
}

/// The part of a [`MachineView`] its object says (the same function reads the model's
/// objects and the API server's): `plan` is the removal plan the progress names steps of.
pub fn object_view(plan: &[PlanStep], m: &TalosMachine) -> MachineView {
    let mut v = MachineView {
        approved: m.spec.approved,
        control_plane: m.spec.role == Some(crate::runtime::objects::Role::ControlPlane),
        cluster: m.spec.cluster_ref.name.clone(),
        deleting: m.deleting(),
        finalizer: crate::runtime::controller::finalizer::has_removal(m),
        ..MachineView::default()
    };
    if let Some(p) = super::world::progress(plan, m) {
        (v.done, v.started, v.committed, v.dead, v.recorded) =
            (p.done, p.started, p.committed, p.dead, p.recorded);
    }
    v
}

/// The view of a model state.
pub fn model_view(model: &Model<'_>, s: &State) -> View {
    let plan = model.objects.plan.unwrap_or(&[]);
    let mut machines = BTreeMap::new();
    let mut members = std::collections::BTreeSet::new();
    for (i, m) in s.machines.iter().enumerate() {
        if m.member {
            members.insert(s.name(i));
        }
        let object = model.objects.machine(s, i);
        let mut v = object_view(plan, &object);
        v.member = m.member;
        v.answers = m.up && !m.wiped;
        v.wiped = m.wiped;
        v.cordoned = m.cordoned || m.boots.unsched;
        machines.insert(s.name(i), v);
    }
    let lock = match s.lock {
        super::model::Lock::Free => None,
        super::model::Lock::Removal(h) => Some(
            Work::RemoveControlPlane {
                namespace: super::model::NAMESPACE,
                machine: &s.name(h),
            }
            .holder(),
        ),
        super::model::Lock::Operation(k) => Some(
            Work::Operation {
                namespace: super::model::NAMESPACE,
                name: &s.op_name(k),
            }
            .holder(),
        ),
    };
    View {
        machines,
        count: model.objects.cluster(s).map(|c| c.spec.control_plane.count),
        members,
        lock,
    }
}

/// Whether a real run here can take the move.
pub fn replayable(mv: &Move) -> bool {
    match mv {
        Move::Admit {
            req,
            in_flight: false,
        } => replayable_request(*req),
        Move::Removal(_) | Move::NodeDies(_) => true,
        _ => false,
    }
}

/// The requests a real run here sends.
pub fn replayable_request(req: Req) -> bool {
    matches!(
        req,
        Req::Approve(_) | Req::Unapprove(_) | Req::Delete(_) | Req::Prune(_) | Req::Count(_)
    )
}

/// Every successor of `s`.
pub fn successors(model: &Model<'_>, s: &State) -> Vec<Next> {
    let mut out = Vec::new();
    model.successors(
        s,
        &Lazy::new(&model.objects, s),
        &mut Memo::default(),
        &mut super::model::Fired::default(),
        &mut out,
    );
    out
}

/// The requests of `s` a real run can send that the model refuses (the webhook must refuse
/// them too).
pub fn refused(model: &Model<'_>, s: &State) -> Vec<Req> {
    let snap = model.objects.snapshot(s);
    model
        .requests(s)
        .into_iter()
        .filter(|r| replayable_request(*r))
        .filter(|r| {
            model
                .admit(s, &snap, *r)
                .is_some_and(|d| d.verdict() == Some(crate::vocab::Verdict::Refuse))
        })
        .collect()
}

/// The starting state of a walk: a live cluster of `count` approved control planes (as
/// [`State::initial`] makes them).
pub fn start(model: &Model<'_>, count: u8) -> Option<State> {
    State::initial(&model.bounds)
        .into_iter()
        .find(|s| s.cluster == super::model::ClusterState::Live && s.count == count)
}

/// The successors by `mv` whose view is `real`: the model states a real step that ended in
/// `real` may be (a reconcile that stopped after a status write is one of them).
pub fn matching<'a>(model: &Model<'_>, nexts: &'a [Next], mv: Move, real: &View) -> Vec<&'a Next> {
    nexts
        .iter()
        .filter(|n| n.mv == mv && &model_view(model, &n.state) == real)
        .collect()
}

/// The machines whose removal the controller would reconcile in `s` (deleted, with the
/// removal finalizer) but for which the model has no successor: the model says such a
/// reconcile changes nothing (it waits), and a real one must change nothing either.
pub fn waiting_removals(s: &State, nexts: &[Next]) -> Vec<u8> {
    (0..s.machines.len())
        .filter_map(|i| u8::try_from(i).ok())
        .filter(|&i| {
            let m = &s.machines[usize::from(i)];
            m.deleting && m.finalizer && !nexts.iter().any(|n| n.mv == Move::Removal(i))
        })
        .collect()
}

/// A violated invariant: its name, its message, and the moves from the start to it (each
/// with the state it led to).
pub struct Counterexample {
    pub invariant: String,
    pub message: String,
    pub path: Vec<(Move, State)>,
}

/// The shortest story from `start` that breaks one of `checks`, through replayable moves
/// only, at most `depth` moves long: the counterexamples a real run can replay (the
/// explorer's own may start elsewhere or take moves a real run here cannot).
pub fn counterexample(
    model: &Model<'_>,
    checks: &[super::invariant::InvariantCheck],
    start: &State,
    depth: usize,
) -> Option<Counterexample> {
    use super::invariant::{Facts, Outcome};
    let broken = |f: &Facts, concurrent: bool| {
        checks.iter().find_map(|c| match c.holds(f, concurrent) {
            Outcome::Broken(m) => Some((c.meta.name.clone(), m)),
            Outcome::Holds { .. } => None,
        })
    };
    let mut seen = std::collections::HashSet::new();
    let mut layer: Vec<(State, Vec<(Move, State)>)> = vec![(start.clone(), Vec::new())];
    seen.insert(start.clone());
    for _ in 0..depth {
        let mut next_layer = Vec::new();
        for (s, path) in &layer {
            let before = Facts::of_state(s);
            for n in successors(model, s) {
                if !replayable(&n.mv) {
                    continue;
                }
                let mut p = path.clone();
                p.push((n.mv, n.state.clone()));
                let found = broken(
                    &Facts::of_transition(&before, &n.state, &n.effect),
                    n.state.concurrent,
                )
                .or_else(|| broken(&Facts::of_state(&n.state), n.state.concurrent));
                if let Some((invariant, message)) = found {
                    return Some(Counterexample {
                        invariant,
                        message,
                        path: p,
                    });
                }
                if seen.insert(n.state.clone()) {
                    next_layer.push((n.state, p));
                }
            }
        }
        layer = next_layer;
    }
    None
}

/// A move in words, with the machines' names.
pub fn describe(s: &State, mv: &Move) -> String {
    let name = |i: &u8| s.name(*i);
    match mv {
        Move::Admit { req, .. } => match req {
            Req::Approve(i) => format!("approve {}", name(i)),
            Req::Unapprove(i) => format!("un-approve {}", name(i)),
            Req::Delete(i) => format!("delete {}", name(i)),
            Req::Prune(i) => format!("prune {}", name(i)),
            Req::Count(n) => format!("declare {n} control planes"),
            other => format!("{other:?}"),
        },
        Move::Removal(i) => format!("the controller reconciles {}", name(i)),
        Move::NodeDies(i) => format!("{}'s node dies", name(i)),
        other => format!("{other:?}"),
    }
}

/// Two views side by side, field by field where they differ.
pub fn differences(model: &View, real: &View) -> Vec<String> {
    let mut out = Vec::new();
    if model.count != real.count {
        out.push(format!(
            "count: model {:?}, real {:?}",
            model.count, real.count
        ));
    }
    if model.members != real.members {
        out.push(format!(
            "etcd members: model {:?}, real {:?}",
            model.members, real.members
        ));
    }
    if model.lock != real.lock {
        out.push(format!(
            "lock: model {:?}, real {:?}",
            model.lock, real.lock
        ));
    }
    let names: std::collections::BTreeSet<&String> =
        model.machines.keys().chain(real.machines.keys()).collect();
    for n in names {
        match (model.machines.get(n), real.machines.get(n)) {
            (Some(a), Some(b)) if a != b => {
                out.push(format!(
                    "{n}: model {a:?}\n{:>w$}real  {b:?}",
                    "",
                    w = n.len() + 2
                ));
            }
            (Some(_), None) => out.push(format!("{n}: in the model only")),
            (None, Some(_)) => out.push(format!("{n}: in the real run only")),
            _ => {}
        }
    }
    out
}

/// A small seeded generator (xorshift64*): walks are reproducible from their seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // splitmix64 of the seed: near seeds start far apart.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        if n == 0 {
            0
        } else {
            usize::try_from(x % u64::try_from(n).unwrap_or(u64::MAX)).unwrap_or(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_of(table: &crate::compile::Table) -> Model<'_> {
        Model::new(
            table,
            super::super::model::Bounds {
                max_control_planes: 3,
                max_workers: 0,
                max_failures: 1,
                max_operations: 0,
                in_flight: 0,
                max_requests: Some(4),
                depth: 32,
                rolls: false,
                roll_width: 1,
                roll_kind: crate::verify::RollKind::Reboot,
                all_kinds: false,
                backups: false,
                lifecycle: false,
                clock: false,
            },
        )
        .expect("model")
    }

    /// The view of the model's own objects round-trips what the model state keeps: two
    /// different states of a walk have different views unless they differ only in what
    /// the view leaves out (the exploration's bookkeeping).
    #[test]
    fn every_replayable_step_changes_the_view_or_is_a_wait() {
        let table = crate::ruleset::load(&[std::path::PathBuf::from("rules")])
            .expect("rules")
            .table
            .expect("table");
        let model = model_of(&table);
        let s0 = start(&model, 3).expect("a start");
        let mut frontier = vec![s0];
        let mut seen = std::collections::HashSet::new();
        let mut moves = 0;
        while let Some(s) = frontier.pop() {
            if seen.len() > 400 || !seen.insert(s.clone()) {
                continue;
            }
            let before = model_view(&model, &s);
            for n in successors(&model, &s) {
                if !replayable(&n.mv) {
                    continue;
                }
                moves += 1;
                let after = model_view(&model, &n.state);
                let same_world = {
                    let (mut a, mut b) = (s.clone(), n.state.clone());
                    (a.requests, a.failures, a.concurrent) = (0, 0, false);
                    (b.requests, b.failures, b.concurrent) = (0, 0, false);
                    a == b
                };
                assert!(
                    after != before || same_world,
                    "{} changed the state but not its view",
                    describe(&s, &n.mv)
                );
                frontier.push(n.state);
            }
        }
        assert!(moves > 50, "the walk took {moves} moves");
    }

    #[test]
    fn the_generator_is_seeded_and_spreads() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<usize> = (0..64).map(|_| a.below(5)).collect();
        let ys: Vec<usize> = (0..64).map(|_| b.below(5)).collect();
        assert_eq!(xs, ys);
        for k in 0..5 {
            assert!(xs.contains(&k), "{k} never drawn: {xs:?}");
        }
        assert_eq!(Rng::new(1).below(0), 0);
    }
}
