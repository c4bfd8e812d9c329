//! The model's view of the world the product reads through I/O: a state's counts (what
//! the invariants' facts read), its objects' names, and the states an exploration starts
//! from.

use super::bounds::{Bounds, ix};
use super::objects::{Text, text};
use super::state::{
    Backup, Boots, ClusterState, Lock, MRole, Machine, Op, OpRun, Phase, State, Tallies,
};

/// The model's view of the world the product reads through I/O.
impl State {
    /// The counts the invariants' facts read, in one pass over the machines and the
    /// operations (each the same as the method of its name).
    pub fn tallies(&self) -> Tallies {
        let mut t = Tallies::default();
        for m in &self.machines {
            t.members += usize::from(m.member);
            t.healthy += usize::from(m.member && m.etcd_ok());
            let cp = m.approved_cp();
            t.approved_all += usize::from(cp);
            t.approved_cps += usize::from(cp && !m.deleting);
            t.active += usize::from(cp && !m.deleting && m.joined && !m.held);
            t.workers += usize::from(m.approved_worker() && !m.deleting);
            t.serving += usize::from(m.serving_as_known());
        }
        for (k, o) in ix(&self.ops) {
            t.running += usize::from(o.phase == Phase::Running);
            t.unfinished += usize::from(o.phase != Phase::Succeeded);
            t.disruptive += usize::from(self.op_disrupts(k, o));
        }
        t.disruptive += usize::from(matches!(self.lock, Lock::Removal(_)));
        t
    }

    /// Of the unfinished rolls over the cluster, the one furthest past its width: how many
    /// of its workers are down or cordoned (taken down by a call and not back, or their
    /// Kubernetes Node cordoned), and its width (`roll.down`, `roll.max_unavailable`).
    pub fn roll_down(&self) -> (usize, u8) {
        self.ops
            .iter()
            .filter(|o| o.kind.rolls() && o.phase != Phase::Succeeded)
            .map(|o| {
                let down = o
                    .roll_order()
                    .filter_map(|j| self.machines.get(usize::from(j)))
                    .filter(|m| !m.ever_cp() && (m.boots.rebooting || m.boots.unsched))
                    .count();
                (down, o.width)
            })
            .max_by_key(|&(down, width)| (down.saturating_sub(usize::from(width)), down))
            .unwrap_or((0, 1))
    }

    /// Operation `k` is disruptive work under way: it holds the cluster lock, or it has
    /// touched its node (cordoned it, or sent the call that takes it down) and not ended.
    fn op_disrupts(&self, k: u8, o: &Op) -> bool {
        !matches!(o.phase, Phase::Succeeded | Phase::Failed)
            && (self.lock == Lock::Operation(k)
                || o.run.has(OpRun::CORDONED)
                || (o.run.has(OpRun::SENT) && o.run.steps != u8::MAX)
                || o.sides()
                    .any(|x| x.run.has(OpRun::CORDONED) || x.run.has(OpRun::SENT)))
    }

    pub fn members(&self) -> usize {
        self.machines.iter().filter(|m| m.member).count()
    }

    pub fn healthy(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| m.member && m.etcd_ok())
            .count()
    }

    /// etcd has a leader: a healthy majority of its members.
    pub fn has_leader(&self) -> bool {
        self.healthy() * 2 > self.members()
    }

    /// Control planes with `spec.approved`, being deleted or not.
    pub fn approved_all(&self) -> usize {
        self.machines.iter().filter(|m| m.approved_cp()).count()
    }

    pub fn approved_cps(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| m.approved_cp() && !m.deleting)
            .count()
    }

    pub fn active(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| m.approved_cp() && !m.deleting && m.joined && !m.held)
            .count()
    }

    pub fn workers(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| m.approved_worker() && !m.deleting)
            .count()
    }

    /// Approved workers in service as far as the controller can know (`workers.serving`,
    /// [`Machine::serving_as_known`]).
    pub fn serving(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| m.serving_as_known())
            .count()
    }

    pub fn running(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| o.phase == Phase::Running)
            .count()
    }

    /// Operations not finished: pending, parked or running.
    pub fn unfinished(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| o.phase != Phase::Succeeded)
            .count()
    }

    /// Removals holding the cluster lock, and operations under way ([`State::op_disrupts`]:
    /// holding it, or with their node touched; one refused at a step before it touched
    /// anything lets the lock go to other work).
    pub fn disruptive(&self) -> usize {
        let removal = usize::from(matches!(self.lock, Lock::Removal(_)));
        removal
            + ix(&self.ops)
                .filter(|(k, o)| self.op_disrupts(*k, o))
                .count()
    }

    pub fn name(&self, i: impl Into<usize>) -> String {
        let i: usize = i.into();
        match (self.machines.get(i), self.names.get(i)) {
            (Some(m), Some(n)) => match m.role {
                MRole::ControlPlane => text(Text::ControlPlane, *n).to_string(),
                MRole::Worker => text(Text::Worker, *n).to_string(),
            },
            _ => format!("machine-{i}"),
        }
    }

    pub fn op_name(&self, i: impl Into<usize>) -> String {
        let i: usize = i.into();
        match self.op_names.get(i) {
            Some(n) => text(Text::Operation, *n).to_string(),
            None => format!("op-{i}"),
        }
    }

    /// The starting states: a healthy cluster for every declared count within the bounds
    /// (that many approved control planes, all members and up); and machines whose
    /// TalosCluster is not there, with 1, 2 or 3 of them approved members.
    pub fn initial(bounds: &Bounds) -> Vec<State> {
        let mut out = Vec::new();
        let live = [1u8, 3, 5].map(|c| (ClusterState::Live, c, c));
        let missing = [1u8, 2, 3].map(|a| (ClusterState::Missing, 0, a));
        for (cluster, count, approved_cps) in live.into_iter().chain(missing) {
            if count > bounds.max_control_planes || approved_cps > bounds.max_control_planes {
                continue;
            }
            let mut machines = Vec::new();
            for i in 0..bounds.max_control_planes {
                let approved = i < approved_cps;
                machines.push(Machine {
                    role: MRole::ControlPlane,
                    approved,
                    order: if approved { i + 1 } else { 0 },
                    deleting: false,
                    finalizer: approved,
                    joined: approved,
                    member: approved,
                    up: true,
                    wiped: false,
                    unreachable: false,
                    held: false,
                    dead: false,
                    committed: false,
                    reroled: false,
                    moved: false,
                    done: 0,
                    recorded: false,
                    cordoned: false,
                    started: 0,
                    boots: Boots {
                        lifecycle: bounds.lifecycle,
                        ..Boots::default()
                    },
                });
            }
            for _ in 0..bounds.max_workers {
                machines.push(Machine {
                    role: MRole::Worker,
                    approved: true,
                    order: 0,
                    deleting: false,
                    finalizer: false,
                    joined: true,
                    member: false,
                    up: true,
                    wiped: false,
                    unreachable: false,
                    held: false,
                    dead: false,
                    committed: false,
                    reroled: false,
                    moved: false,
                    done: 0,
                    recorded: false,
                    cordoned: false,
                    started: 0,
                    boots: Boots {
                        lifecycle: bounds.lifecycle,
                        ..Boots::default()
                    },
                });
            }
            let mut names = Vec::new();
            let (mut cp, mut w) = (0u8, 0u8);
            for m in &machines {
                match m.role {
                    MRole::ControlPlane => {
                        cp += 1;
                        names.push(cp);
                    }
                    MRole::Worker => {
                        w += 1;
                        names.push(w);
                    }
                }
            }
            out.push(State {
                count,
                schedulable: true,
                cluster,
                machines,
                // The backup's snapshot is taken, and ages, by moves of their own.
                backup: if bounds.backups {
                    Backup::Empty
                } else {
                    Backup::None
                },
                names,
                ..State::blank()
            });
        }
        out
    }
}
