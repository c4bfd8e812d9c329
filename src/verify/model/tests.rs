use super::*;
use crate::compile::Table;

/// The shipped rules, and small bounds with a failure, an operation and a request in
/// flight (every kind of field a state has).
pub(crate) fn small_model() -> (Table, Bounds) {
    let table = crate::ruleset::load(&[std::path::PathBuf::from("rules")])
        .expect("rules")
        .table
        .expect("table");
    let bounds = Bounds {
        max_control_planes: 3,
        max_workers: 1,
        max_failures: 1,
        max_operations: 1,
        in_flight: 1,
        max_requests: Some(2),
        depth: 64,
        rolls: false,
        roll_width: 1,
        roll_kind: RollKind::Reboot,
        all_kinds: false,
        backups: false,
        lifecycle: false,
        clock: false,
    };
    (table, bounds)
}

/// Visits the states `model` reaches from its starting states, depth first, at most
/// `limit` of them, each with its successors (expanded afresh). The number visited.
pub(crate) fn walk(
    model: &Model<'_>,
    bounds: &Bounds,
    limit: usize,
    visit: impl FnMut(&State, &[Next]),
) -> usize {
    walk_in(model, bounds, limit, false, visit)
}

/// [`walk`], breadth first when `breadth` (what a few steps deep is reached first).
pub(crate) fn walk_in(
    model: &Model<'_>,
    bounds: &Bounds,
    limit: usize,
    breadth: bool,
    mut visit: impl FnMut(&State, &[Next]),
) -> usize {
    let mut frontier: std::collections::VecDeque<State> = State::initial(bounds).into();
    let mut seen = std::collections::HashSet::new();
    while let Some(s) = if breadth {
        frontier.pop_front()
    } else {
        frontier.pop_back()
    } {
        if seen.len() >= limit || !seen.insert(s.clone()) {
            continue;
        }
        let mut nexts = Vec::new();
        model.successors(
            &s,
            &Lazy::new(&model.objects, &s),
            &mut Memo::default(),
            &mut Fired::default(),
            &mut nexts,
        );
        visit(&s, &nexts);
        frontier.extend(nexts.into_iter().map(|n| n.state));
    }
    seen.len()
}

/// What `object_key` leaves out is never read by the objects: in every state a small
/// model reaches, changing each left-out field gives the same snapshot, the same
/// request objects and the same decisions, so the explorer may share them between
/// states with one key.
#[test]
fn states_with_one_object_key_have_the_same_objects() {
    let (table, bounds) = small_model();
    let model = Model::new(&table, bounds).expect("model");
    let mut frontier = State::initial(&bounds);
    let mut seen = std::collections::HashSet::new();
    let (mut checked, mut key_a, mut key_b) = (0, Vec::new(), Vec::new());
    while let Some(s) = frontier.pop() {
        if !seen.insert(s.clone()) || seen.len() > 3000 {
            continue;
        }
        let mut t = s.clone();
        for m in &mut t.machines {
            (m.joined, m.member, m.up, m.wiped, m.cordoned) =
                (!m.joined, !m.member, !m.up, !m.wiped, !m.cordoned);
        }
        t.lock = if t.lock == Lock::Free {
            Lock::Removal(0)
        } else {
            Lock::Free
        };
        t.pending = vec![Pending {
            req: Req::Unschedule,
            base: (1, true),
            warned: true,
        }];
        (t.failures, t.requests) = (t.failures + 1, t.requests + 1);
        (t.pdb, t.concurrent) = (!t.pdb, !t.concurrent);
        object_key(&s, &mut key_a);
        object_key(&t, &mut key_b);
        assert_eq!(key_a, key_b, "only left-out fields were changed");
        let (sa, sb) = (model.objects.snapshot(&s), model.objects.snapshot(&t));
        assert_eq!(format!("{sa:?}"), format!("{sb:?}"), "snapshot of {s:?}");
        for req in model.requests(&s) {
            let (ra, rb) = (
                model.objects.request(&s, &sa, req),
                model.objects.request(&t, &sb, req),
            );
            assert_eq!(format!("{ra:?}"), format!("{rb:?}"), "{req:?} in {s:?}");
            let (da, db) = (model.admit(&s, &sa, req), model.admit(&t, &sb, req));
            assert_eq!(format!("{da:?}"), format!("{db:?}"), "{req:?} in {s:?}");
            checked += 1;
        }
        let mut nexts = Vec::new();
        model.successors(
            &s,
            &Lazy::new(&model.objects, &s),
            &mut Memo::default(),
            &mut Fired::default(),
            &mut nexts,
        );
        frontier.extend(nexts.into_iter().map(|n| n.state));
    }
    assert!(checked > 1000, "only {checked} requests compared");
}

/// The one-pass tallies are the counts of the methods of their names, in every state
/// a small model reaches.
#[test]
fn tallies_are_the_counts() {
    let (table, bounds) = small_model();
    let model = Model::new(&table, bounds).expect("model");
    let visited = walk(&model, &bounds, 3000, |s, _| {
        let want = Tallies {
            members: s.members(),
            healthy: s.healthy(),
            approved_all: s.approved_all(),
            approved_cps: s.approved_cps(),
            active: s.active(),
            workers: s.workers(),
            serving: s.serving(),
            running: s.running(),
            unfinished: s.unfinished(),
            disruptive: s.disruptive(),
        };
        assert_eq!(s.tallies(), want, "{s:?}");
    });
    assert_eq!(visited, 3000);
}

/// Expanding a state with a memo of another state with the same objects gives what
/// expanding it afresh gives.
#[test]
fn a_shared_memo_changes_no_successor() {
    let (table, bounds) = small_model();
    let model = Model::new(&table, bounds).expect("model");
    let mut by_key: std::collections::HashMap<Vec<u8>, State> = Default::default();
    let (mut shared, mut key) = (0, Vec::new());
    let (mut removals, mut guards) = (0usize, 0usize);
    walk(&model, &bounds, 3000, |s, fresh| {
        object_key(s, &mut key);
        if let Some(other) = by_key.get(&key) {
            let mut memo = Memo::default();
            let mut scratch = Vec::new();
            // As the explorer does: the other state's objects (built when first
            // needed) and its decisions.
            let olazy = Lazy::new(&model.objects, other);
            model.successors(
                other,
                &olazy,
                &mut memo,
                &mut Fired::default(),
                &mut scratch,
            );
            removals += usize::from(!memo.removals.is_empty());
            guards += usize::from(!memo.guards.is_empty());
            let mut again = Vec::new();
            model.successors(s, &olazy, &mut memo, &mut Fired::default(), &mut again);
            let moves = |v: &[Next]| -> Vec<String> {
                v.iter()
                    .map(|n| format!("{:?} {:?} {:?}", n.mv, n.state, n.effect))
                    .collect()
            };
            assert_eq!(moves(fresh), moves(&again), "{s:?} after {other:?}");
            shared += 1;
        } else {
            by_key.insert(key.clone(), s.clone());
        }
    });
    assert!(shared > 100, "only {shared} states shared a key");
    // Removal decisions and plan-step guards were among the remembered answers.
    assert!(
        removals > 10 && guards > 10,
        "remembered removals {removals}, guards {guards}"
    );
}

/// A crash right after an acting call, taken from the fault-free run's state after that
/// call, is the state the crash run reaches: every successor is the same as when each
/// crash is run again.
#[test]
fn a_crash_after_a_call_is_the_clean_runs_state_there() {
    let (table, bounds) = small_model();
    let model = Model::new(&table, bounds).expect("model");
    let mut crashes = 0usize;
    walk_in(&model, &bounds, 4000, true, |s, fresh| {
        let mut again = Vec::new();
        super::controller::RERUN_CRASHES.set(true);
        model.successors(
            s,
            &Lazy::new(&model.objects, s),
            &mut Memo::default(),
            &mut Fired::default(),
            &mut again,
        );
        super::controller::RERUN_CRASHES.set(false);
        let moves = |v: &[Next]| -> Vec<String> {
            v.iter()
                .map(|n| format!("{:?} {:?} {:?}", n.mv, n.state, n.effect))
                .collect()
        };
        assert_eq!(moves(fresh), moves(&again), "{s:?}");
        crashes += fresh
            .iter()
            .filter(|n| matches!(n.mv, Move::RemovalCrash(_) | Move::OperationCrash(_)))
            .count();
    });
    assert!(crashes > 100, "only {crashes} crashes explored");
}

/// Bounds a model cannot hold (its indices are bytes) are an error that says the most
/// it holds, never indices that wrap or collide with `NONE`.
#[test]
fn bounds_past_what_a_model_holds_are_refused() {
    assert_eq!(Bounds::default().check(), Ok(()));
    let at = |cps: u8, workers: u8| Bounds {
        max_control_planes: cps,
        max_workers: workers,
        ..Bounds::default()
    };
    assert_eq!(at(60, 4).check(), Ok(()));
    let e = at(60, 5).check().expect_err("65 machines");
    assert!(
        e.0.contains("65 machines") && e.0.contains("at most 64"),
        "{e}"
    );
    assert!(at(255, 255).check().is_err());
    assert!(at(0, 1).check().is_err());
    let ops = Bounds {
        max_operations: 17,
        ..Bounds::default()
    };
    assert!(ops.check().expect_err("ops").0.contains("operations"));
    let fly = Bounds {
        in_flight: 17,
        ..Bounds::default()
    };
    assert!(fly.check().expect_err("in flight").0.contains("in flight"));
}

/// `ix` numbers items from 0 as bytes and never hands out `NONE`.
#[test]
fn indices_are_bytes_below_none() {
    let items: Vec<u32> = (0..300).collect();
    let got: Vec<(u8, u32)> = ix(&items).map(|(i, v)| (i, *v)).collect();
    assert_eq!(got.len(), usize::from(NONE));
    assert!(got.iter().all(|(i, v)| u32::from(*i) == *v && *i != NONE));
    assert_eq!(ix(&items[..MAX_MACHINES]).count(), MAX_MACHINES);
}

/// The lock's expiry (issue 34): in every transition a small model makes, the lock passes
/// from one piece of work to another only when the first is over (a finished operation; a
/// removal's lock goes with its machine), as `disruptive::may_take_over` decides for the
/// controller, however long the Lease went unrenewed; and states where it expired while
/// its work was under way are reached, with other work reconciled there (so the policy is
/// exercised, not vacuous).
#[test]
fn an_expired_lock_passes_only_from_work_that_is_over() {
    let (table, bounds) = small_model();
    let model = Model::new(&table, bounds).expect("model");
    let holder = |s: &State| match s.lock {
        Lock::Free => None,
        Lock::Removal(h) => Some(format!("removal of {}", s.name(h))),
        Lock::Operation(k) => Some(format!("operation {}", s.op_name(k))),
    };
    let mut contended = 0;
    // Breadth first (the takeover a weaker policy allows is a few steps deep).
    let seen = walk_in(&model, &bounds, 60_000, true, |s, nexts| {
        let Some(before) = holder(s) else {
            return;
        };
        let over = match s.lock {
            Lock::Operation(k) => s
                .ops
                .get(usize::from(k))
                .is_none_or(|o| matches!(o.phase, Phase::Succeeded | Phase::Failed)),
            _ => false,
        };
        if s.lock_expired && !over && nexts.iter().any(|n| n.mv != Move::LockExpires) {
            contended += 1;
        }
        // Work takes the lock in its reconcile (other moves may renumber objects).
        let reconciles = nexts.iter().filter(|n| {
            matches!(
                n.mv,
                Move::Removal(_)
                    | Move::RemovalLost(_)
                    | Move::RemovalCrash(_)
                    | Move::RemovalRefused(_)
                    | Move::Operation(_)
                    | Move::OperationLost(_)
                    | Move::OperationCrash(_)
                    | Move::OperationRefused(_)
            )
        });
        for n in reconciles {
            if let Some(after) = holder(&n.state)
                && after != before
            {
                assert!(
                    over,
                    "the lock passed from {before} (under way, expired: {}) to {after} by {:?}",
                    s.lock_expired, n.mv
                );
            }
        }
    });
    assert!(seen > 1000, "{seen}");
    assert!(
        contended > 0,
        "no state where the lock expired under way work"
    );
}

/// The controller and the world see nothing of the requests in flight nor the explorer's
/// counts: in every state a small model reaches, their successors are those of the state
/// without them ([`unseen_into`]), lifted back ([`lift`]), so the explorer may run them once
/// for all the states that differ only there. Among them: a finalizer released (its
/// machine removed) while a request about a machine after it is in flight.
#[test]
fn the_controller_sees_no_request_in_flight() {
    let (table, bounds) = small_model();
    let model = Model::new(&table, bounds).expect("model");
    let (mut lifted, mut removed) = (0, 0);
    walk(&model, &bounds, 6000, |s, _| {
        let mut u = s.clone();
        unseen_into(s, &mut u);
        let run = |s: &State| {
            let mut nexts = Vec::new();
            let o = model.acting(
                s,
                &Lazy::new(&model.objects, s),
                &mut Memo::default(),
                &mut Fired::default(),
                &mut nexts,
            );
            (o, nexts)
        };
        let (direct, nexts) = run(s);
        let (unseen, from_u) = run(&u);
        assert_eq!(direct, unseen, "outcomes of {s:?}");
        assert_eq!(nexts.len(), from_u.len(), "successors of {s:?}");
        for (d, n) in nexts.iter().zip(&from_u) {
            let how = renumbering(&u, n.mv, &n.state).expect("a renumbering it can tell");
            let mut t = n.state.clone();
            lift(s, how, &mut t);
            assert_eq!(
                (d.mv, &d.state, d.effect),
                (n.mv, &t, n.effect),
                "from {s:?}"
            );
            lifted += 1;
            if matches!(how, Renumber::Removed(i) if s.pending.iter().any(|p| p.req.machine().is_some_and(|m| m > i)))
            {
                removed += 1;
            }
        }
    });
    assert!(lifted > 10_000, "{lifted} successors lifted");
    assert!(
        removed > 0,
        "no machine removed under a later one's request in flight"
    );
}

/// Control planes and workers are named apart, so two machines may share a name: the
/// machine a move removed is told by name and role.
#[test]
fn a_removed_machine_is_told_by_name_and_role() {
    let (_, bounds) = small_model();
    let mut s = State::initial(&bounds)
        .into_iter()
        .find(|s| s.machines.iter().any(|m| m.role == MRole::Worker))
        .expect("a cluster with a worker");
    let (cp, w) = (
        s.machines
            .iter()
            .find(|m| m.role == MRole::ControlPlane)
            .copied()
            .expect("a control plane"),
        s.machines
            .iter()
            .find(|m| m.role == MRole::Worker)
            .copied()
            .expect("a worker"),
    );
    s.machines = vec![cp, w];
    s.names = vec![1, 1];
    let (cp, w) = (0, 1);
    for (gone, keep) in [(w, cp), (cp, w)] {
        let mut t = s.clone();
        remove_machine(&mut t, u8::try_from(gone).expect("index"));
        let mut s2 = s.clone();
        s2.pending = vec![Pending {
            req: Req::Delete(u8::try_from(keep).expect("index")),
            base: (0, true),
            warned: false,
        }];
        let how = renumbering(&s, Move::Removal(0), &t);
        assert_eq!(
            how,
            Some(Renumber::Removed(u8::try_from(gone).expect("index")))
        );
        let mut lifted = t.clone();
        lift(&s2, how.expect("told"), &mut lifted);
        let mut direct = s2.clone();
        remove_machine(&mut direct, u8::try_from(gone).expect("index"));
        assert_eq!(lifted, direct);
    }
}
