//! People's requests: those a person could send in a state, how the webhook decides
//! each (the product's own code, on the state's objects) and what a committed one
//! changes.

use super::bounds::{NAMESPACE, NONE, ix};
use super::moves::Fired;
use super::objects::{Lazy, Memo, next_op_name};
use super::state::{
    Boots, ClusterState, MRole, Machine, OpKind, Pending, Req, State, remove_machine,
};
use super::successors::Model;
use crate::interp::Decision;
use crate::runtime::decide::{decide_events, request_events};
use crate::runtime::facts::Expensive;
use crate::runtime::objects::Snapshot;
use crate::vocab::Verdict;

impl Model<'_> {
    /// Decides a request as the webhook does.
    pub fn admit(&self, s: &State, snap: &Snapshot, req: Req) -> Option<Decision> {
        let (op, old, new) = self.objects.request(s, snap, req)?;
        let events = request_events(&op, NAMESPACE, old.as_ref(), new.as_ref());
        let (decision, _) = decide_events(self.table, snap, &events, Expensive::FromObjects, false);
        Some(decision)
    }

    /// [`Model::admit`]'s outcome ([`outcome`]), remembered in `memo` (it reads only the
    /// objects); `None` when the request cannot be made here.
    pub(super) fn admitted(
        &self,
        s: &State,
        snap: &Lazy<'_>,
        memo: &mut Memo,
        fired: &mut Fired,
        req: Req,
    ) -> Option<Option<Verdict>> {
        if let Some((_, v)) = memo.admissions.iter().find(|(r, _)| *r == req) {
            return *v;
        }
        let v = self.admit(s, snap.get(), req).map(|d| {
            fired.note(&d);
            outcome(&d)
        });
        memo.admissions.push((req, v));
        v
    }

    /// Every request a person could send in this state.
    pub fn requests(&self, s: &State) -> Vec<Req> {
        let mut out = Vec::new();
        self.all_requests(s, &mut out);
        if self.budget_spent(s) {
            out.retain(|r| !Req::counts(*r));
        }
        out
    }

    /// Whether people may re-role a worker to a control plane: only under a budget of
    /// requests (see `all_requests`).
    pub fn reroles_workers(&self) -> bool {
        self.bounds.max_requests.is_some()
    }

    /// Whether people have sent every request the bounds allow.
    pub fn budget_spent(&self, s: &State) -> bool {
        self.bounds.max_requests.is_some_and(|n| s.requests >= n)
    }

    fn all_requests(&self, s: &State, out: &mut Vec<Req>) {
        if s.cluster == ClusterState::Gone {
            return;
        }
        for (i, m) in ix(&s.machines) {
            if m.moved {
                // Another cluster's machine now.
                continue;
            }
            if m.deleting {
                let forged = m.unreachable && m.dead && m.committed;
                if m.finalizer && m.approved_cp() && !forged {
                    out.push(Req::ForgeStatus(i));
                }
                // Edits of a control plane whose removal is in flight: un-approved, or
                // re-roled to a worker (what `leave-while-removed` refuses). (Moved to
                // another cluster mid-removal is not sent: the model follows one cluster.)
                if m.finalizer && m.approved_cp() {
                    out.push(Req::Unapprove(i));
                    if !m.reroled {
                        out.push(Req::Reassign(i));
                    }
                }
                continue;
            }
            if !m.approved && !m.wiped {
                out.push(Req::Approve(i));
            }
            if m.approved {
                out.push(Req::Delete(i));
                // Following a deleted TalosCluster, an unannotated delete is the garbage
                // collector's (`Collect`). A machine whose TalosCluster is missing keeps
                // the gate (a typo in clusterRef must not turn it off).
                if s.cluster != ClusterState::Deleting {
                    out.push(Req::Prune(i));
                }
                if m.approved_cp() {
                    out.push(Req::Unapprove(i));
                }
                // One role change per machine, of a control plane to a worker; a worker
                // re-roled to a control plane only under a budget of requests (with any
                // number of requests it multiplies the small cluster's states by twenty),
                // which the bounds line of the report says.
                if !m.reroled && (m.role == MRole::ControlPlane || self.reroles_workers()) {
                    out.push(Req::Reassign(i));
                }
                if s.cluster != ClusterState::Deleting {
                    out.push(Req::Move(i));
                }
            }
            if s.cluster == ClusterState::Deleting {
                out.push(Req::Collect(i));
            }
        }
        if s.cluster == ClusterState::Live {
            for c in [1u8, 3, 5] {
                if c != s.count && c <= self.bounds.max_control_planes {
                    out.push(Req::Count(c));
                }
            }
            out.push(if s.schedulable {
                Req::Unschedule
            } else {
                Req::Reschedule
            });
            out.push(Req::DeleteCluster);
            out.push(Req::PruneCluster);
            let made = s.op_names.len()
                + s.pending
                    .iter()
                    .filter(|p| matches!(p.req, Req::CreateOperation(..)))
                    .count();
            if made < usize::from(self.bounds.max_operations) {
                out.push(Req::CreateOperation(OpKind::Restore, NONE));
                if self.bounds.rolls {
                    out.push(Req::CreateOperation(self.bounds.roll_kind.op_kind(), NONE));
                }
                for (i, m) in ix(&s.machines).filter(|_| !self.bounds.rolls) {
                    // An upgrade of one machine (a roll over the cluster is the same
                    // procedure on each node in turn; the model runs it on one).
                    if m.approved && !m.deleting && !m.moved {
                        out.push(Req::CreateOperation(OpKind::Upgrade, i));
                    }
                    // A control plane, or one re-roled to a worker (it may still be a member).
                    if m.ever_cp() && m.approved && !m.deleting && !m.moved {
                        out.push(Req::CreateOperation(OpKind::Reset, i));
                    }
                    // A rollback (its node back, running the image before) and a shutdown
                    // (its node down for good) of any approved machine.
                    if self.bounds.all_kinds && m.approved && !m.deleting && !m.moved {
                        out.push(Req::CreateOperation(OpKind::Rollback, i));
                        out.push(Req::CreateOperation(OpKind::Shutdown, i));
                    }
                }
            }
        }
    }

    pub(super) fn base(s: &State, req: Req) -> (u8, bool) {
        // A request about a machine: whether it was reported unreachable when the request
        // was decided (`left.dead`), and its `approved` (the resourceVersion an approval or
        // an un-approval conflicts on); about the cluster: its spec.
        match req.machine() {
            Some(i) => {
                let m = s.machines.get(usize::from(i));
                (
                    u8::from(m.is_some_and(|m| m.unreachable)),
                    m.is_some_and(|m| m.approved),
                )
            }
            None => (s.count, s.schedulable),
        }
    }

    /// Applies a committed request. `None`: it conflicts (or its object is gone).
    pub(super) fn commit(&self, s: &State, p: Pending) -> Option<State> {
        let mut t = s.fork();
        match p.req {
            Req::Approve(i) | Req::Unapprove(i) => {
                let next_order = s.machines.iter().map(|m| m.order).max().unwrap_or(0) + 1;
                let m = t.machines.get_mut(usize::from(i))?;
                // An approval of a machine being deleted is not sent; an un-approval is
                // (an edit mid-removal), and commits like any other.
                if m.approved != p.base.1 || (m.deleting && p.req == Req::Approve(i)) {
                    return None;
                }
                if p.req == Req::Approve(i) {
                    m.approved = true;
                    if m.role == MRole::ControlPlane {
                        m.order = next_order;
                    }
                } else {
                    // No longer applied as a control plane (its etcd member stays until
                    // someone removes it); approved again, the controller applies it again.
                    m.approved = false;
                    m.order = 0;
                    m.held = false;
                    m.joined = false;
                }
            }
            Req::Move(i) => {
                let m = t.machines.get_mut(usize::from(i))?;
                if m.approved != p.base.1 || m.deleting || m.moved {
                    return None;
                }
                // Out of this cluster: nothing here counts, applies or removes it any
                // more; only its etcd member (and its node, which may die) stays here. What
                // the model no longer reads is cleared, so that moved machines in the same
                // state are one.
                if m.member {
                    *m = Machine {
                        role: MRole::ControlPlane,
                        approved: false,
                        order: 0,
                        deleting: false,
                        finalizer: false,
                        joined: false,
                        member: true,
                        up: m.up,
                        wiped: false,
                        unreachable: false,
                        held: false,
                        dead: false,
                        committed: false,
                        reroled: false,
                        moved: true,
                        done: 0,
                        recorded: false,
                        cordoned: false,
                        started: 0,
                        boots: Boots::default(),
                    };
                } else {
                    remove_machine(&mut t, i);
                }
            }
            Req::Reassign(i) => {
                let next_order = s.machines.iter().map(|m| m.order).max().unwrap_or(0) + 1;
                let m = t.machines.get_mut(usize::from(i))?;
                if m.approved != p.base.1 || m.reroled || m.moved {
                    return None;
                }
                m.held = false;
                m.joined = false;
                if m.role == MRole::ControlPlane {
                    // No longer applied as a control plane, as for an un-approval; its etcd
                    // member and the removal finalizer stay.
                    m.reroled = true;
                    m.order = 0;
                } else {
                    // An approved control plane from now on, last in approval order, as
                    // an approval makes one.
                    m.role = MRole::ControlPlane;
                    m.order = next_order;
                    // Named among the control planes from now on, by a number none of them
                    // has (the model's names follow the role, as a decoded state's do: kept,
                    // the worker's number would name a second `cp-N`).
                    let taken = |n: u8| {
                        t.machines
                            .iter()
                            .zip(&t.names)
                            .enumerate()
                            .any(|(j, (o, x))| {
                                j != usize::from(i) && o.role == MRole::ControlPlane && *x == n
                            })
                    };
                    if let Some(n) = (1..=u8::MAX).find(|n| !taken(*n))
                        && let Some(x) = t.names.get_mut(usize::from(i))
                    {
                        *x = n;
                    }
                }
            }
            Req::Delete(i) | Req::Prune(i) | Req::Collect(i) => {
                let m = t.machines.get(usize::from(i))?;
                // The API server runs a delete's validating admission again on the object
                // as it is when the delete commits: one moved to another cluster in the
                // meantime is decided there, as that cluster's machine, which the model
                // does not follow.
                if m.deleting || m.moved {
                    return None;
                }
                if m.finalizer {
                    t.machines[usize::from(i)].deleting = true;
                } else {
                    remove_machine(&mut t, i);
                }
            }
            Req::Count(to) => {
                if (t.count, t.schedulable) != p.base || t.cluster != ClusterState::Live {
                    return None;
                }
                t.count = to;
            }
            Req::Unschedule | Req::Reschedule => {
                if (t.count, t.schedulable) != p.base || t.cluster != ClusterState::Live {
                    return None;
                }
                t.schedulable = p.req == Req::Reschedule;
            }
            Req::DeleteCluster | Req::PruneCluster => {
                if t.cluster != ClusterState::Live {
                    return None;
                }
                t.cluster = ClusterState::Deleting;
            }
            Req::ForgeStatus(i) => {
                // A merge patch of the status: no resourceVersion to conflict on.
                let m = t.machines.get_mut(usize::from(i))?;
                if !m.deleting {
                    return None;
                }
                m.unreachable = true;
                m.dead = true;
                m.committed = true;
            }
            Req::CreateOperation(kind, target) => {
                if t.cluster == ClusterState::Gone {
                    return None;
                }
                t.op_names.push(next_op_name(&t));
                t.ops.push(self.objects.new_op(kind, target));
            }
        }
        Some(t)
    }
}

/// An admission's outcome: refused, or let through with a warning (`Warn`), or not.
pub(super) fn outcome(d: &Decision) -> Option<Verdict> {
    d.verdict()
        .or_else(|| (!d.warnings.is_empty()).then_some(Verdict::Warn))
}
