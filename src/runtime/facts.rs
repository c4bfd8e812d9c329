//! Facts from a snapshot of live objects, for one event.
//!
//! Counting goes through ONE function, [`approved_members`], which lists the machines and
//! narrows them (same namespace and cluster, approved with the role, machines being deleted
//! left out except the subject itself). Everything counted — `approved`, `workers`,
//! `transitioning`, `rank` — derives from it.

use super::objects::{Role, Snapshot, TalosCluster, TalosEtcdBackup, TalosMachine, TalosOperation};
use crate::compile::Table;
use crate::interp::{Facts, Lookup, Value};
use crate::vocab::Event;
use crate::vocab::{Fact, Site};
use k8s_openapi::jiff::Timestamp;
use std::cmp::Ordering;

/// The subject of an event as the rules see it.
#[derive(Clone, Copy, Debug)]
pub enum Subject<'s> {
    /// A TalosMachine. `view` is the object the machine facts read (old object for a delete
    /// or a leave, new for an approve, live for a reconcile). `counted` is the state the
    /// subject is counted in (its state before the change: old object, or live); `None`
    /// when it did not exist.
    Machine {
        name: &'s str,
        view: &'s TalosMachine,
        counted: Option<&'s TalosMachine>,
    },
    /// A TalosCluster (the request's object).
    Cluster(&'s TalosCluster),
    Operation(&'s TalosOperation),
    /// A TalosConfigPatch, with its dry render against the machines it selects.
    Patch {
        name: &'s str,
        render: &'s super::configpatch::DryRender,
    },
    /// A TalosEtcdBackup (the request's object).
    Backup(&'s TalosEtcdBackup),
}

/// One event with what the facts are computed from.
#[derive(Clone, Copy, Debug)]
pub struct EventFacts<'s> {
    pub event: Event,
    pub namespace: &'s str,
    /// The TalosCluster the event is about.
    pub cluster: &'s str,
    pub subject: Subject<'s>,
}

/// How expensive facts are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expensive {
    /// From what the objects show (admission, and offline evaluation): `member.dead` is the
    /// machine's Ready=False/NodeUnreachable, or a removal already marked DeadMemberRemoval.
    FromObjects,
    /// Not answered here: the caller fetches them (the controller asks etcd).
    Deferred,
}

/// The approved members of one role of a cluster, ordered by approval time then name.
///
/// Lists `snapshot`'s machines in `namespace` with `spec.clusterRef.name == cluster`,
/// approved with `role`, not being deleted. The machine named `subject` is never taken from
/// the list: it is counted as `counted` says (its state before the change), even when it is
/// being deleted, since its own removal is the one being decided.
pub fn approved_members<'s>(
    snapshot: &'s Snapshot,
    namespace: &str,
    cluster: &str,
    role: Role,
    subject: Option<(&str, Option<&'s TalosMachine>)>,
) -> Vec<&'s TalosMachine> {
    let subject_name = subject.map(|(n, _)| n);
    let mut out: Vec<&TalosMachine> = snapshot
        .machines
        .iter()
        .filter(|m| {
            m.namespace() == namespace
                && m.cluster() == cluster
                && m.approved_role() == Some(role)
                && !m.deleting()
                && Some(m.name()) != subject_name
        })
        .collect();
    if let Some((_, Some(counted))) = subject
        && counted.cluster() == cluster
        && counted.approved_role() == Some(role)
    {
        out.push(counted);
    }
    out.sort_by(|a, b| approval_order(a, b));
    out
}

/// Older approvals first; no time at all sorts last (newest); ties by name.
fn approval_order(a: &TalosMachine, b: &TalosMachine) -> Ordering {
    match (a.approval_time(), b.approval_time()) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
    .then_with(|| a.name().cmp(b.name()))
}

/// Whether this many approved control planes is the even, transitioning state.
pub fn is_transitioning(approved: usize) -> bool {
    approved > 0 && approved.is_multiple_of(2)
}

/// The unfinished operation another one would wait on: not finished, not `exclude`;
/// one that is not parked is preferred, then the oldest, then by name.
pub fn unfinished_operation<'s>(
    table: &Table,
    snapshot: &'s Snapshot,
    namespace: &str,
    cluster: &str,
    exclude: Option<&str>,
) -> Option<&'s TalosOperation> {
    snapshot
        .operations
        .iter()
        .filter(|o| {
            o.namespace() == namespace
                && o.cluster() == cluster
                && !o.finished()
                && Some(o.name()) != exclude
        })
        .min_by(|a, b| {
            a.parked(table)
                .cmp(&b.parked(table))
                .then_with(|| {
                    a.metadata
                        .creation_timestamp
                        .cmp(&b.metadata.creation_timestamp)
                })
                .then_with(|| a.name().cmp(b.name()))
        })
}

/// Answers facts for one event from a snapshot.
pub struct SnapshotFacts<'s> {
    /// The rules deciding: what they own (the reasons they park operations with) is read
    /// from them, never copied.
    table: &'s Table,
    snapshot: &'s Snapshot,
    ev: EventFacts<'s>,
    expensive: Expensive,
    cluster: Option<Option<&'s TalosCluster>>,
    control_planes: Option<Vec<&'s TalosMachine>>,
    workers: Option<usize>,
    unfinished: Option<Option<&'s TalosOperation>>,
    by_controller: bool,
}

impl<'s> SnapshotFacts<'s> {
    pub fn new(
        table: &'s Table,
        snapshot: &'s Snapshot,
        ev: EventFacts<'s>,
        expensive: Expensive,
    ) -> Self {
        SnapshotFacts {
            table,
            snapshot,
            ev,
            expensive,
            cluster: None,
            control_planes: None,
            workers: None,
            unfinished: None,
            by_controller: false,
        }
    }

    /// Says the request was made by the controller's own identity (`request.by_controller`).
    /// Without it the fact is false: for a reconcile, and whenever the requester is not
    /// known, nothing is trusted as the controller's.
    pub fn by_controller(mut self, yes: bool) -> Self {
        self.by_controller = yes;
        self
    }

    pub fn event(&self) -> &EventFacts<'s> {
        &self.ev
    }

    fn machine(&self) -> Option<&'s TalosMachine> {
        match self.ev.subject {
            Subject::Machine { view, .. } => Some(view),
            _ => None,
        }
    }

    fn subject_key(&self) -> Option<(&'s str, Option<&'s TalosMachine>)> {
        match self.ev.subject {
            Subject::Machine { name, counted, .. } => Some((name, counted)),
            _ => None,
        }
    }

    fn cluster_obj(&mut self) -> Option<&'s TalosCluster> {
        if let Some(c) = self.cluster {
            return c;
        }
        let c = match self.ev.subject {
            Subject::Cluster(c) => Some(c),
            _ => self.snapshot.cluster(self.ev.namespace, self.ev.cluster),
        };
        self.cluster = Some(c);
        c
    }

    fn control_planes(&mut self) -> &[&'s TalosMachine] {
        if self.control_planes.is_none() {
            let key = self.subject_key();
            self.control_planes = Some(approved_members(
                self.snapshot,
                self.ev.namespace,
                self.ev.cluster,
                Role::ControlPlane,
                key,
            ));
        }
        self.control_planes.as_deref().unwrap_or(&[])
    }

    fn workers(&mut self) -> usize {
        if let Some(w) = self.workers {
            return w;
        }
        let key = self.subject_key();
        let w = approved_members(
            self.snapshot,
            self.ev.namespace,
            self.ev.cluster,
            Role::Worker,
            key,
        )
        .len();
        self.workers = Some(w);
        w
    }

    fn unfinished(&mut self) -> Option<&'s TalosOperation> {
        if let Some(u) = self.unfinished {
            return u;
        }
        let exclude = match self.ev.subject {
            Subject::Operation(o) => Some(o.name()),
            _ => None,
        };
        let u = unfinished_operation(
            self.table,
            self.snapshot,
            self.ev.namespace,
            self.ev.cluster,
            exclude,
        );
        self.unfinished = Some(u);
        u
    }

    /// What admission can tell of `members.after`: the approved control planes that stay
    /// (not the departing subject, not an operation's target, not being deleted).
    fn members_after(&mut self) -> usize {
        let leaving: Option<&str> = match self.ev.subject {
            Subject::Machine { name, .. } => Some(name),
            Subject::Operation(o) => o.spec.machine.as_deref(),
            Subject::Cluster(_) | Subject::Patch { .. } | Subject::Backup(_) => None,
        };
        self.control_planes()
            .iter()
            .filter(|m| Some(m.name()) != leaving && !m.deleting())
            .count()
    }

    /// What admission can tell of `healthy.after`: the approved control planes that stay
    /// (not the departing subject, not an operation's target, not being deleted) and do
    /// not report Ready=False NodeUnreachable.
    fn healthy_after(&mut self) -> usize {
        let leaving: Option<&str> = match self.ev.subject {
            Subject::Machine { name, .. } => Some(name),
            Subject::Operation(o) => o.spec.machine.as_deref(),
            Subject::Cluster(_) | Subject::Patch { .. } | Subject::Backup(_) => None,
        };
        self.control_planes()
            .iter()
            .filter(|m| Some(m.name()) != leaving && !m.deleting() && !m.node_unreachable())
            .count()
    }

    /// The TalosEtcdBackup of the operation's cluster that spec.backupRef names.
    fn backup(&self) -> Option<&'s TalosEtcdBackup> {
        let name = self.operation().map(|o| o.backup_name())?;
        self.snapshot
            .backup(self.ev.namespace, name)
            .filter(|b| !name.is_empty() && b.cluster() == self.ev.cluster)
    }

    /// The TalosEtcdBackups of the event's cluster.
    fn backups(&self) -> impl Iterator<Item = &'s TalosEtcdBackup> + use<'s> {
        let (namespace, cluster) = (self.ev.namespace, self.ev.cluster);
        self.snapshot
            .backups
            .iter()
            .filter(move |b| b.namespace() == namespace && b.cluster() == cluster)
    }

    /// The TalosEtcdBackups of the event's cluster whose store is outside it: the ones a
    /// restore can use (ADR 0106 §2).
    fn backups_outside(&mut self) -> impl Iterator<Item = &'s TalosEtcdBackup> + use<'s> {
        let cluster = self.cluster_obj();
        self.backups()
            .filter(move |b| b.store_in_cluster(cluster).is_none())
    }

    /// The newest verified snapshot of the event's cluster in a store outside it: its
    /// backup, and when it was taken (status.lastSnapshot; ties by the backup's name).
    fn newest_snapshot(&mut self) -> Option<(&'s TalosEtcdBackup, Timestamp)> {
        self.backups_outside()
            .filter_map(|b| {
                let t = b.status.as_ref()?.last_snapshot.as_ref()?.time.0;
                Some((b, t))
            })
            .max_by(|(a, x), (b, y)| x.cmp(y).then_with(|| b.name().cmp(a.name())))
    }

    fn patch_render(&self) -> Option<&'s super::configpatch::DryRender> {
        match self.ev.subject {
            Subject::Patch { render, .. } => Some(render),
            _ => None,
        }
    }

    fn operation(&self) -> Option<&'s TalosOperation> {
        match self.ev.subject {
            Subject::Operation(o) => Some(o),
            _ => None,
        }
    }

    /// The nodes of the operation's roll in flight beside its target (`roll.in_flight`).
    fn roll_in_flight(&self) -> Vec<&'s str> {
        let Some(o) = self.operation() else {
            return Vec::new();
        };
        let target = o.spec.machine.as_deref().unwrap_or("");
        o.status
            .as_ref()
            .and_then(|s| s.progress.as_ref())
            .map(|p| p.in_flight().filter(|n| *n != target).collect())
            .unwrap_or_default()
    }

    /// `workers.others_up`: the approved workers of the operation's cluster, not being
    /// deleted, other than its target and the roll's nodes in flight, not reported
    /// unreachable by the probe.
    fn workers_others_up(&self) -> Vec<&'s TalosMachine> {
        let Some(o) = self.operation() else {
            return Vec::new();
        };
        let target = o.spec.machine.as_deref().unwrap_or("");
        let away = self.roll_in_flight();
        approved_members(
            self.snapshot,
            self.ev.namespace,
            self.ev.cluster,
            Role::Worker,
            None,
        )
        .into_iter()
        .filter(|m| m.name() != target && !away.contains(&m.name()) && !m.node_unreachable())
        .collect()
    }

    /// Their TalosMachines, of the operation's cluster.
    fn roll_in_flight_machines(&self) -> Vec<&'s TalosMachine> {
        let (ns, cluster) = (self.ev.namespace, self.ev.cluster);
        self.roll_in_flight()
            .into_iter()
            .filter_map(|n| self.snapshot.machine(ns, n))
            .filter(|m| m.cluster() == cluster)
            .collect()
    }
}

/// An object as a decision record names it: its kind, name and resourceVersion, borrowed.
pub type Source<'s> = (&'static str, &'s str, Option<&'s str>);

fn object_ref<'s>(
    kind: &'static str,
    meta: &'s k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Source<'s> {
    (
        kind,
        meta.name.as_deref().unwrap_or(""),
        meta.resource_version.as_deref(),
    )
}

impl<'s> SnapshotFacts<'s> {
    /// The objects `fact` is computed from, for a decision record: the subject, the
    /// cluster, the machines counted, the operation waited on, the backups. Asked only
    /// after deciding, when a record is kept; the values themselves come from
    /// [`Facts::fact`], never from here.
    pub fn sources(&mut self, fact: Fact) -> Vec<Source<'s>> {
        let mut out = Vec::new();
        self.sources_into(fact, &mut out);
        out
    }

    /// [`SnapshotFacts::sources`] into `out` (cleared first): a record's writer reuses one
    /// buffer for all its facts.
    pub fn sources_into(&mut self, fact: Fact, out: &mut Vec<Source<'s>>) {
        out.clear();
        let machines = |out: &mut Vec<Source<'s>>, ms: &[&'s TalosMachine]| {
            out.extend(ms.iter().map(|m| object_ref("TalosMachine", &m.metadata)));
        };
        let subject = |s: &Self, out: &mut Vec<Source<'s>>| {
            out.push(match s.ev.subject {
                Subject::Machine { view, .. } => object_ref("TalosMachine", &view.metadata),
                Subject::Cluster(c) => object_ref("TalosCluster", &c.metadata),
                Subject::Operation(o) => object_ref("TalosOperation", &o.metadata),
                Subject::Patch { name, .. } => ("TalosConfigPatch", name, None),
                Subject::Backup(b) => object_ref("TalosEtcdBackup", &b.metadata),
            });
        };
        let cluster = |s: &mut Self, out: &mut Vec<Source<'s>>| {
            if let Some(c) = s.cluster_obj() {
                out.push(object_ref("TalosCluster", &c.metadata));
            }
        };
        match fact {
            Fact::Cluster | Fact::RequestByController => {}
            Fact::Approved
            | Fact::Transitioning
            | Fact::Rank
            | Fact::MembersAfter
            | Fact::HealthyAfter
            | Fact::TargetControlPlane => {
                self.control_planes();
                machines(out, self.control_planes.as_deref().unwrap_or(&[]));
            }
            Fact::Workers => {
                let key = self.subject_key();
                machines(
                    out,
                    &approved_members(
                        self.snapshot,
                        self.ev.namespace,
                        self.ev.cluster,
                        Role::Worker,
                        key,
                    ),
                );
            }
            Fact::EtcdMembers => {
                cluster(self, out);
                self.control_planes();
                machines(out, self.control_planes.as_deref().unwrap_or(&[]));
            }
            Fact::Count
            | Fact::Schedulable
            | Fact::ClusterExists
            | Fact::ClusterDeleting
            | Fact::Bootstrapped => cluster(self, out),
            Fact::Machine
            | Fact::Role
            | Fact::Deleting
            | Fact::AllowDelete
            | Fact::MemberDead
            | Fact::NodeUnreachable
            | Fact::Operation
            | Fact::Kind
            | Fact::Target
            | Fact::Phase
            | Fact::Failed
            | Fact::Paused
            | Fact::Backup
            | Fact::Patch
            | Fact::PatchSelects
            | Fact::PatchBreaks
            | Fact::PatchError
            | Fact::MaxUnavailable
            | Fact::RollInFlight => subject(self, out),
            Fact::WorkersOthersUp => {
                subject(self, out);
                for m in self.workers_others_up() {
                    out.push(object_ref("TalosMachine", &m.metadata));
                }
            }
            Fact::RollControlPlaneInFlight => {
                subject(self, out);
                for m in self.roll_in_flight_machines() {
                    out.push(object_ref("TalosMachine", &m.metadata));
                }
            }
            Fact::TargetExists | Fact::TargetUncounted => {
                subject(self, out);
                let target = self.operation().and_then(|o| o.spec.machine.as_deref());
                if let Some(m) = target.and_then(|t| self.snapshot.machine(self.ev.namespace, t)) {
                    out.push(object_ref("TalosMachine", &m.metadata));
                }
            }
            Fact::UnfinishedExists
            | Fact::UnfinishedName
            | Fact::UnfinishedKind
            | Fact::UnfinishedPhase
            | Fact::UnfinishedParked => {
                if let Some(o) = self.unfinished() {
                    out.push(object_ref("TalosOperation", &o.metadata));
                }
            }
            Fact::BackupExists | Fact::BackupInCluster => {
                subject(self, out);
                if let Some(b) = self.backup() {
                    out.push(object_ref("TalosEtcdBackup", &b.metadata));
                }
                if fact == Fact::BackupInCluster {
                    cluster(self, out);
                }
            }
            Fact::Backups | Fact::SnapshotTaken | Fact::SnapshotAge | Fact::SnapshotBackup => {
                out.extend(
                    self.backups()
                        .map(|b| object_ref("TalosEtcdBackup", &b.metadata)),
                );
            }
        }
        if out.len() > 1 {
            out.sort();
            out.dedup();
        }
    }
}

fn int(n: usize) -> Value<'static> {
    Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

impl<'s> Facts<'s> for SnapshotFacts<'s> {
    fn fact(&mut self, fact: Fact) -> Lookup<'s> {
        let v = match fact {
            Fact::Approved => int(self.control_planes().len()),
            Fact::Workers => int(self.workers()),
            Fact::Count => Value::Int(self.cluster_obj().map_or(0, |c| c.spec.control_plane.count)),
            Fact::Schedulable => Value::Bool(self.cluster_obj().is_none_or(|c| c.schedulable())),
            Fact::Cluster => Value::Str(self.ev.cluster),
            Fact::ClusterExists => Value::Bool(self.cluster_obj().is_some()),
            Fact::ClusterDeleting => Value::Bool(self.cluster_obj().is_some_and(|c| c.deleting())),
            Fact::Transitioning => Value::Bool(is_transitioning(self.control_planes().len())),
            Fact::Machine => Value::Str(self.machine().map_or("", |m| m.name())),
            Fact::Role => Value::Str(
                self.machine()
                    .and_then(|m| m.spec.role)
                    .map_or("", |r| r.name()),
            ),
            Fact::Deleting => Value::Bool(match self.ev.subject {
                Subject::Machine { view, .. } => view.deleting(),
                Subject::Cluster(c) => c.deleting(),
                Subject::Operation(o) => o.metadata.deletion_timestamp.is_some(),
                Subject::Backup(b) => b.metadata.deletion_timestamp.is_some(),
                Subject::Patch { .. } => false,
            }),
            Fact::AllowDelete => Value::Bool(match self.ev.subject {
                Subject::Machine { view, .. } => view.allow_delete(),
                Subject::Cluster(c) => c.allow_delete(),
                Subject::Operation(_) | Subject::Patch { .. } | Subject::Backup(_) => false,
            }),
            Fact::Rank => {
                let name = self.machine().map(|m| m.name());
                let pos = self
                    .control_planes()
                    .iter()
                    .position(|m| Some(m.name()) == name);
                int(pos.map_or(0, |p| p + 1))
            }
            Fact::MemberDead => match self.expensive {
                Expensive::Deferred if self.ev.event.2 == Site::Controller => {
                    return Lookup::Later;
                }
                _ => Value::Bool(self.machine().is_some_and(|m| {
                    m.node_unreachable()
                        || (self.ev.event.2 == Site::Controller && m.dead_member_removal_marked())
                })),
            },
            Fact::NodeUnreachable => {
                Value::Bool(self.machine().is_some_and(|m| m.node_unreachable()))
            }
            Fact::Operation => Value::Str(self.operation().map_or("", |o| o.name())),
            Fact::Kind => Value::Str(self.operation().map_or("", |o| o.spec.kind.as_str())),
            Fact::Target => Value::Str(
                self.operation()
                    .and_then(|o| o.spec.machine.as_deref())
                    .unwrap_or(""),
            ),
            // One of the machines `approved` counts: removing it ends an even count.
            Fact::TargetControlPlane => {
                let target = self.operation().and_then(|o| o.spec.machine.as_deref());
                Value::Bool(
                    target.is_some_and(|t| self.control_planes().iter().any(|m| m.name() == t)),
                )
            }
            Fact::TargetUncounted => {
                let (ns, cluster) = (self.ev.namespace, self.ev.cluster);
                let target = self
                    .operation()
                    .and_then(|o| o.spec.machine.as_deref())
                    .and_then(|t| self.snapshot.machine(ns, t))
                    .filter(|m| m.cluster() == cluster);
                // The controller puts the removal finalizer on approved control planes only,
                // and takes it off once etcd shows the machine is no member: a machine that
                // holds it and that `approved` does not count (being deleted, un-approved,
                // or re-roled to a worker) may still be a member. (One moved to another
                // cluster is not among this cluster's machines at all: `target.exists`.)
                Value::Bool(target.is_some_and(|m| {
                    m.holds_removal_finalizer()
                        && (m.deleting() || m.approved_role() != Some(Role::ControlPlane))
                }))
            }
            Fact::TargetExists => {
                let (ns, cluster) = (self.ev.namespace, self.ev.cluster);
                let target = self.operation().and_then(|o| o.spec.machine.as_deref());
                Value::Bool(
                    target
                        .and_then(|t| self.snapshot.machine(ns, t))
                        .is_some_and(|m| m.cluster() == cluster),
                )
            }
            Fact::Phase => Value::Str(self.operation().map_or("", |o| o.phase())),
            Fact::Failed => Value::Bool(self.operation().is_some_and(|o| o.failed())),
            Fact::Paused => {
                let table = self.table;
                Value::Bool(self.operation().is_some_and(|o| o.paused_elsewhere(table)))
            }
            Fact::UnfinishedExists => Value::Bool(self.unfinished().is_some()),
            Fact::UnfinishedName => Value::Str(self.unfinished().map_or("", |o| o.name())),
            Fact::UnfinishedKind => {
                Value::Str(self.unfinished().map_or("", |o| o.spec.kind.as_str()))
            }
            Fact::UnfinishedPhase => Value::Str(self.unfinished().map_or("", |o| o.phase())),
            Fact::UnfinishedParked => {
                let table = self.table;
                Value::Bool(self.unfinished().is_some_and(|o| o.parked(table)))
            }
            // The controller asks etcd, for a departing control plane and for the target
            // of an operation alike.
            Fact::HealthyAfter => match self.expensive {
                Expensive::Deferred if self.ev.event.2 == Site::Controller => {
                    return Lookup::Later;
                }
                _ => int(self.healthy_after()),
            },
            // The controller reads etcd's member list; admission counts the machines.
            Fact::MembersAfter => match self.expensive {
                Expensive::Deferred if self.ev.event.2 == Site::Controller => {
                    return Lookup::Later;
                }
                _ => int(self.members_after()),
            },
            Fact::RequestByController => Value::Bool(self.by_controller),
            Fact::Backup => Value::Str(self.operation().map_or("", |o| o.backup_name())),
            Fact::BackupExists => Value::Bool(self.backup().is_some()),
            Fact::BackupInCluster => {
                let backup = self.backup();
                let cluster = self.cluster_obj();
                Value::Bool(backup.is_some_and(|b| b.store_in_cluster(cluster).is_some()))
            }
            Fact::Backups => int(self.backups().count()),
            Fact::SnapshotTaken => Value::Bool(self.newest_snapshot().is_some()),
            Fact::SnapshotAge => int(self.newest_snapshot().map_or(0, |(_, t)| {
                let minutes = Timestamp::now().duration_since(t).as_secs() / 60;
                usize::try_from(minutes.max(0)).unwrap_or(usize::MAX)
            })),
            Fact::SnapshotBackup => Value::Str(match self.newest_snapshot() {
                Some((b, _)) => b.name(),
                None => self
                    .backups_outside()
                    .map(|b| b.name())
                    .min()
                    .or_else(|| self.backups().map(|b| b.name()).min())
                    .unwrap_or(""),
            }),
            Fact::Patch => Value::Str(match self.ev.subject {
                Subject::Patch { name, .. } => name,
                _ => "",
            }),
            Fact::PatchSelects => int(self.patch_render().map_or(0, |r| r.selects)),
            Fact::PatchBreaks => int(self.patch_render().map_or(0, |r| r.breaks)),
            Fact::PatchError => Value::Str(self.patch_render().map_or("", |r| r.error.as_str())),
            Fact::Bootstrapped => Value::Bool(
                self.cluster_obj()
                    .is_some_and(|c| c.bootstrap_record().is_some()),
            ),
            // The controller asks every control plane's etcd; offline, the objects say only
            // whether a bootstrap was recorded.
            Fact::EtcdMembers => match self.expensive {
                Expensive::Deferred if self.ev.event.2 == Site::Controller => {
                    return Lookup::Later;
                }
                _ => {
                    let recorded = self
                        .cluster_obj()
                        .is_some_and(|c| c.bootstrap_record().is_some());
                    int(if recorded {
                        self.control_planes().len()
                    } else {
                        0
                    })
                }
            },
            Fact::MaxUnavailable => Value::Int(
                self.operation()
                    .map_or(1, |o| o.spec.max_unavailable.unwrap_or(1)),
            ),
            Fact::RollInFlight => int(self.roll_in_flight().len()),
            Fact::WorkersOthersUp => int(self.workers_others_up().len()),
            Fact::RollControlPlaneInFlight => {
                Value::Bool(self.roll_in_flight_machines().into_iter().any(|m| {
                    m.approved_role() == Some(Role::ControlPlane) || m.holds_removal_finalizer()
                }))
            }
        };
        Lookup::Value(v)
    }
}
