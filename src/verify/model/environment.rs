//! The world's moves, apart from what people and the controller do: a node dies or
//! returns (with a new boot, its member behind or not, an upgrade taken or not), etcd
//! catches up, a PodDisruptionBudget blocks or lifts, the lock's Lease expires, the
//! backup's snapshot is taken or ages. None of them is a step of the controller: the
//! controller's reconciles are `controller.rs`, through the product's own executor.

use super::bounds::ix;
use super::moves::{Move, Next, effect};
use super::state::{Backup, Lock, OpRun, Phase, State};
use super::successors::Model;

impl Model<'_> {
    /// Every move of the world from `s`, appended to `out`.
    pub(super) fn environment(&self, s: &State, out: &mut Vec<Next>) {
        for (idx, m) in ix(&s.machines) {
            let i = usize::from(idx);
            if !m.up && !m.wiped && m.boots.rebooting {
                // Taken down by an operation's call: it comes back (not assumed: a world
                // move) with a new boot time, running what was staged.
                let mut t = s.fork();
                let b = &mut t.machines[i].boots;
                b.boot = !b.boot;
                b.rebooting = false;
                if b.staged {
                    // Within the failure budget, the upgrade does not take.
                    if s.failures < self.bounds.max_failures {
                        let mut u = t.clone();
                        u.machines[i].boots.staged = false;
                        u.machines[i].up = true;
                        u.failures += 1;
                        out.push(Next {
                            mv: Move::UpgradeNotTaken(idx),
                            state: u,
                            effect: effect("node-returns"),
                        });
                    }
                    let b = &mut t.machines[i].boots;
                    b.upgraded = true;
                    b.staged = false;
                }
                t.machines[i].up = true;
                // Within the failure budget, its etcd member has not caught up yet when
                // the node answers (it does, by a move of its own).
                if m.member && s.failures < self.bounds.max_failures {
                    let mut u = t.clone();
                    u.machines[i].boots.syncing = true;
                    u.failures += 1;
                    out.push(Next {
                        mv: Move::NodeReturnsBehind(idx),
                        state: u,
                        effect: effect("node-returns"),
                    });
                }
                out.push(Next {
                    mv: Move::NodeReturns(idx),
                    state: t,
                    effect: effect("node-returns"),
                });
                continue;
            }
            if m.up && m.boots.syncing {
                let mut t = s.fork();
                t.machines[i].boots.syncing = false;
                out.push(Next {
                    mv: Move::EtcdCatchesUp(idx),
                    state: t,
                    effect: effect("node-returns"),
                });
            }
            // A control plane's node, or an approved worker's, may die (a failure) and come
            // back: the controller then learns of it only by what it reads.
            if !(m.ever_cp() || m.approved_worker()) || m.wiped || !(m.approved || m.member) {
                continue;
            }
            if m.up && s.failures < self.bounds.max_failures {
                let mut t = s.fork();
                t.machines[i].up = false;
                t.failures += 1;
                out.push(Next {
                    mv: Move::NodeDies(idx),
                    state: t,
                    effect: effect("node-dies"),
                });
            }
            if !m.up {
                let mut t = s.fork();
                t.machines[i].up = true;
                out.push(Next {
                    mv: Move::NodeReturns(idx),
                    state: t,
                    effect: effect("node-returns"),
                });
            }
        }
        let draining = s
            .machines
            .iter()
            .any(|m| m.deleting && m.finalizer && !m.committed);
        if s.pdb {
            let mut t = s.fork();
            t.pdb = false;
            out.push(Next {
                mv: Move::PdbLifts,
                state: t,
                effect: effect("pdb"),
            });
        } else if draining && s.failures < self.bounds.max_failures {
            let mut t = s.fork();
            t.pdb = true;
            t.failures += 1;
            out.push(Next {
                mv: Move::PdbBlocks,
                state: t,
                effect: effect("pdb"),
            });
        }
        // The lock's Lease, held by work between its reconciles, expires (a failure): who
        // may take it then is the product's policy (`disruptive::may_take_over`).
        if s.lock != Lock::Free && !s.lock_expired && s.failures < self.bounds.max_failures {
            let mut t = s.fork();
            t.lock_expired = true;
            t.failures += 1;
            out.push(Next {
                mv: Move::LockExpires,
                state: t,
                effect: effect("lock-expires"),
            });
        }
        // Time passes (`--clock`): the step a running operation is at, a gate with a
        // `within` or a call sent (the executor's deadline for the node to go down), has
        // run longer than it may. Once per step (the executor's next step begins now), and
        // never progress: the executor's next reconcile says what comes of it.
        if self.bounds.clock {
            for (k, o) in ix(&s.ops) {
                let r = o.run;
                if o.phase != Phase::Running || !r.has(OpRun::IN_STEP) || r.has_more(OpRun::OVERDUE)
                {
                    continue;
                }
                let timed = r.has(OpRun::SENT)
                    || self
                        .table
                        .operation_plan(o.kind.name())
                        .and_then(|p| p.steps.get(usize::from(r.steps)))
                        .is_some_and(|st| st.within.is_some());
                if timed {
                    let mut t = s.fork();
                    t.ops[usize::from(k)].run.more |= OpRun::OVERDUE;
                    out.push(Next {
                        mv: Move::TimePasses(k),
                        state: t,
                        effect: effect("time-passes"),
                    });
                }
            }
        }
        // The backup's snapshot: taken (by its schedule, or on demand) when there is none or
        // it is stale; a fresh one grows stale (time passes; not a failure).
        let snapshot = match s.backup {
            Backup::None => None,
            Backup::Empty | Backup::Stale => Some((Backup::Fresh, Move::SnapshotTaken, "snapshot")),
            Backup::Fresh => Some((Backup::Stale, Move::SnapshotAges, "snapshot-ages")),
        };
        if let Some((backup, mv, step)) = snapshot {
            let mut t = s.fork();
            t.backup = backup;
            out.push(Next {
                mv,
                state: t,
                effect: effect(step),
            });
        }
    }
}
