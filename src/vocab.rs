//! The closed vocabulary of the language: verbs, subjects, sites, verdicts, facts (with their
//! types, costs, availability and lint domains) and built-in plan actions.
//!
//! Everything that names something a rule can say lives here, so the checker, the compiler,
//! the interpreter and the runtime agree on one list.

use std::fmt;

/// What a request or a reconcile does, derived from the transition old -> new.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// Into "approved <role> of cluster X": an update to approved, a create already approved,
    /// a role change or a move that lands on an approved machine.
    Approve,
    /// Out of "approved": `spec.approved` turned false.
    Unapprove,
    /// Out of "approved <role>": the role changed.
    Reassign,
    /// Out of "approved <role> of cluster X": `spec.clusterRef.name` changed.
    Move,
    /// A delete (admission), or a deletion in progress (controller).
    Remove,
    /// A TalosCluster's `spec.schedulable` turning "false".
    Unschedule,
    /// A TalosOperation being created.
    Start,
    /// The controller about to configure an approved machine.
    Apply,
    /// The controller about to run an operation.
    Run,
    /// A status changing something a decision reads. A TalosMachine's: Ready=False
    /// NodeUnreachable set or cleared, the Removal condition's DeadMemberRemoval marker set
    /// or cleared, or `status.removal` (the controller's record of a removal) changed. A
    /// TalosEtcdBackup's snapshots. A TalosCluster's redacted base or `Bootstrap` record.
    Report,
    /// An approved machine staying approved with its role in its cluster, whose
    /// `spec.endpoint` or `spec.hostname` changes: how the controller finds its node (drain,
    /// probes, reset) and its etcd member.
    Readdress,
    /// The controller about to run the next step of an operation's plan, under the cluster
    /// lock, from live reads: decided again before every step.
    Step,
    /// The controller about to bootstrap etcd on a control plane of a new cluster
    /// (Talos' `Bootstrap`): once per cluster, ever (issue 37).
    Bootstrap,
    /// The controller about to take a TalosEtcdBackup's snapshot, its schedule or a request
    /// due: decided, then its `plan snapshot backup` run (issue 36).
    Snapshot,
}

impl Verb {
    pub const ALL: [Verb; 14] = [
        Verb::Approve,
        Verb::Unapprove,
        Verb::Reassign,
        Verb::Move,
        Verb::Remove,
        Verb::Unschedule,
        Verb::Start,
        Verb::Apply,
        Verb::Run,
        Verb::Report,
        Verb::Readdress,
        Verb::Step,
        Verb::Bootstrap,
        Verb::Snapshot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Verb::Approve => "approve",
            Verb::Unapprove => "unapprove",
            Verb::Reassign => "reassign",
            Verb::Move => "move",
            Verb::Remove => "remove",
            Verb::Unschedule => "unschedule",
            Verb::Start => "start",
            Verb::Apply => "apply",
            Verb::Run => "run",
            Verb::Report => "report",
            Verb::Readdress => "readdress",
            Verb::Step => "step",
            Verb::Bootstrap => "bootstrap",
            Verb::Snapshot => "snapshot",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Verb groups a rule may name instead of listing verbs.
pub const VERB_GROUPS: &[(&str, &[Verb])] = &[(
    "leave",
    &[Verb::Remove, Verb::Unapprove, Verb::Reassign, Verb::Move],
)];

/// Resolves a verb word to the verbs it stands for (a verb or a group).
pub fn resolve_verb(word: &str) -> Option<Vec<Verb>> {
    if let Some(v) = Verb::ALL.iter().find(|v| v.name() == word) {
        return Some(vec![*v]);
    }
    VERB_GROUPS
        .iter()
        .find(|(g, _)| *g == word)
        .map(|(_, vs)| vs.to_vec())
}

/// Every word accepted where a verb is expected (for "did you mean").
pub fn verb_words() -> Vec<&'static str> {
    let mut words: Vec<&'static str> = Verb::ALL.iter().map(|v| v.name()).collect();
    words.extend(VERB_GROUPS.iter().map(|(g, _)| *g));
    words
}

/// The kind of thing a verb acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    /// An approved control-plane TalosMachine (a member of etcd, or about to be).
    ControlPlane,
    /// An approved worker TalosMachine.
    Worker,
    /// Any TalosMachine, approved or not.
    Machine,
    /// A TalosCluster.
    Cluster,
    /// A TalosOperation.
    Operation,
    /// A TalosConfigPatch (a change of the Talos configuration of the machines it selects).
    Patch,
    /// A TalosEtcdBackup (its status: the snapshots it took, kept and is deleting).
    Backup,
}

impl Subject {
    pub const ALL: [Subject; 7] = [
        Subject::ControlPlane,
        Subject::Worker,
        Subject::Machine,
        Subject::Cluster,
        Subject::Operation,
        Subject::Patch,
        Subject::Backup,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Subject::ControlPlane => "controlplane",
            Subject::Worker => "worker",
            Subject::Machine => "machine",
            Subject::Cluster => "cluster",
            Subject::Operation => "operation",
            Subject::Patch => "patch",
            Subject::Backup => "backup",
        }
    }

    pub fn parse(word: &str) -> Option<Subject> {
        Subject::ALL.iter().copied().find(|s| s.name() == word)
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// A TalosMachine subject (controlplane, worker or machine).
    pub fn is_machine(self) -> bool {
        matches!(
            self,
            Subject::ControlPlane | Subject::Worker | Subject::Machine
        )
    }
}

/// Where a decision is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Site {
    /// The admission webhook: synchronous, best effort, refuses before the write commits.
    Webhook,
    /// The controller: serialized under the cluster lock, authoritative.
    Controller,
}

impl Site {
    pub const ALL: [Site; 2] = [Site::Webhook, Site::Controller];

    pub fn name(self) -> &'static str {
        match self {
            Site::Webhook => "webhook",
            Site::Controller => "controller",
        }
    }

    pub fn parse(word: &str) -> Option<Site> {
        Site::ALL.iter().copied().find(|s| s.name() == word)
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// What a rule does when it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The webhook denies, the controller refuses the step.
    Refuse,
    /// Controller only: stop touching the object, set Ready=False with the reason, requeue.
    Hold,
    /// An admission warning, or a Warning event from the controller.
    Warn,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Refuse => "refuse",
            Verdict::Hold => "hold",
            Verdict::Warn => "warn",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The (verb, subject, site) events the runtime produces. A rule on any other combination
/// could never fire, so the checker rejects it; an event here that no rule or `allow`
/// covers is reported by the coverage lint.
pub const RUNTIME_EVENTS: &[(Verb, Subject, Site)] = &[
    (Verb::Remove, Subject::Machine, Site::Webhook),
    (Verb::Remove, Subject::ControlPlane, Site::Webhook),
    (Verb::Remove, Subject::Worker, Site::Webhook),
    (Verb::Remove, Subject::Cluster, Site::Webhook),
    (Verb::Approve, Subject::ControlPlane, Site::Webhook),
    (Verb::Approve, Subject::Worker, Site::Webhook),
    (Verb::Unapprove, Subject::ControlPlane, Site::Webhook),
    (Verb::Unapprove, Subject::Worker, Site::Webhook),
    (Verb::Reassign, Subject::ControlPlane, Site::Webhook),
    (Verb::Reassign, Subject::Worker, Site::Webhook),
    (Verb::Move, Subject::ControlPlane, Site::Webhook),
    (Verb::Move, Subject::Worker, Site::Webhook),
    (Verb::Unschedule, Subject::Cluster, Site::Webhook),
    (Verb::Start, Subject::Operation, Site::Webhook),
    // A status write (talosmachines/status) that changes what decisions read.
    (Verb::Report, Subject::Machine, Site::Webhook),
    // A TalosEtcdBackup's status changing (talosetcdbackups/status): its snapshots, which
    // the fresh-backup rules read and retention deletes.
    (Verb::Report, Subject::Backup, Site::Webhook),
    // A TalosCluster's status changing (talosclusters/status): the redacted base the webhook
    // dry-renders patches against, and the record of the cluster's Bootstrap.
    (Verb::Report, Subject::Cluster, Site::Webhook),
    // spec.endpoint or spec.hostname of an approved machine changing.
    (Verb::Readdress, Subject::ControlPlane, Site::Webhook),
    (Verb::Readdress, Subject::Worker, Site::Webhook),
    // A TalosConfigPatch created or updated: dry-rendered against the machines it selects.
    (Verb::Apply, Subject::Patch, Site::Webhook),
    (Verb::Apply, Subject::ControlPlane, Site::Controller),
    (Verb::Apply, Subject::Worker, Site::Controller),
    (Verb::Remove, Subject::ControlPlane, Site::Controller),
    (Verb::Run, Subject::Operation, Site::Controller),
    // The start rules again, before the controller first acts on an operation: admission
    // may have been bypassed, raced, or (before spec was immutable) edited around.
    (Verb::Start, Subject::Operation, Site::Controller),
    // Before every step of an operation's plan, under the lock.
    (Verb::Step, Subject::Operation, Site::Controller),
    // Before the controller bootstraps etcd on the first control plane of a new cluster.
    (Verb::Bootstrap, Subject::ControlPlane, Site::Controller),
    // Before the controller takes a backup's snapshot (its plan, `plan snapshot backup`).
    (Verb::Snapshot, Subject::Backup, Site::Controller),
];

/// Whether the runtime ever produces this event.
pub fn is_runtime_event(verb: Verb, subject: Subject, site: Site) -> bool {
    RUNTIME_EVENTS.contains(&(verb, subject, site))
}

/// The subjects a verb can act on at any site, for error messages.
pub fn subjects_of(verb: Verb) -> Vec<Subject> {
    let mut out: Vec<Subject> = RUNTIME_EVENTS
        .iter()
        .filter(|(v, _, _)| *v == verb)
        .map(|(_, s, _)| *s)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Closed enumerations a fact can range over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EnumKind {
    Role,
    OperationKind,
    /// What `verify`'s model did last (the fact `step`, in invariants).
    Step,
}

impl EnumKind {
    pub fn name(self) -> &'static str {
        match self {
            EnumKind::Role => "role",
            EnumKind::OperationKind => "operation kind",
            EnumKind::Step => "model step",
        }
    }

    pub fn with_article(self) -> &'static str {
        match self {
            EnumKind::Role => "a role",
            EnumKind::OperationKind => "an operation kind",
            EnumKind::Step => "a model step",
        }
    }

    /// The values a rule may compare against.
    pub fn values(self) -> &'static [&'static str] {
        match self {
            EnumKind::Role => &["controlplane", "worker"],
            EnumKind::OperationKind => OPERATION_KINDS,
            EnumKind::Step => MODEL_STEPS,
        }
    }
}

/// The TalosOperation kinds rules may name.
pub const OPERATION_KINDS: &[&str] = &[
    "upgrade",
    "kubernetes-upgrade",
    "ichor",
    "reboot",
    "reset",
    "shutdown",
    "etcd-snapshot",
    "etcd-restore",
    "rotate-ca",
    "rollback",
];

/// The type of an expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    Int,
    Bool,
    /// A name or other text (machine names, phases).
    Name,
    /// A closed enumeration; written in rules as a string literal of one of its values.
    Enum(EnumKind),
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Int => f.write_str("int"),
            Type::Bool => f.write_str("bool"),
            Type::Name => f.write_str("name"),
            Type::Enum(e) => write!(f, "{}", e.name()),
        }
    }
}

/// How costly a fact is to obtain. Cheap facts come from the one live LIST; expensive ones
/// (etcd, Talos) are fetched only when a row needs them and its cheap conditions hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    Cheap,
    Expensive,
}

/// The facts a rule can read. The discriminant is the fact's slot in the fact vector (a
/// byte: a 257th fact does not compile).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Fact {
    Approved,
    Workers,
    Count,
    Schedulable,
    Cluster,
    ClusterExists,
    ClusterDeleting,
    Transitioning,
    Machine,
    Role,
    Deleting,
    AllowDelete,
    Rank,
    MemberDead,
    NodeUnreachable,
    Operation,
    Kind,
    Target,
    TargetControlPlane,
    TargetUncounted,
    TargetExists,
    Phase,
    Failed,
    Paused,
    UnfinishedExists,
    UnfinishedName,
    UnfinishedKind,
    UnfinishedPhase,
    UnfinishedParked,
    HealthyAfter,
    MembersAfter,
    RequestByController,
    Backup,
    BackupExists,
    BackupInCluster,
    Backups,
    SnapshotTaken,
    SnapshotAge,
    SnapshotBackup,
    Patch,
    PatchSelects,
    PatchBreaks,
    PatchError,
    Bootstrapped,
    EtcdMembers,
    MaxUnavailable,
    RollInFlight,
    RollControlPlaneInFlight,
    WorkersOthersUp,
}

/// The number of fact slots (one per row of [`FACTS`], which the test below keeps in the
/// order of [`Fact`]).
pub const FACT_COUNT: usize = FACTS.len();

/// What the checker, the lints, the runtime and the guide know about a fact: the one
/// declaration each of them reads (the facts table of docs/rules.md is generated from it,
/// by [`facts_table_markdown`]).
pub struct FactInfo {
    pub fact: Fact,
    pub name: &'static str,
    pub ty: Type,
    pub cost: Cost,
    /// The live read it is computed from.
    pub read: Read,
    /// The events it can be read for, and that in words.
    pub available: Availability,
    /// The values the lints reason over.
    pub domain: Domain,
    /// What it means, for the guide.
    pub doc: &'static str,
}

macro_rules! facts {
    ($($fact:ident $name:literal $ty:expr, $cost:ident, $read:ident, $avail:ident,
       $(domain $domain:expr,)? $doc:literal;)*) => {
        /// Every fact, in slot order.
        pub const FACTS: &[FactInfo] = &[
            $(FactInfo {
                fact: Fact::$fact,
                name: $name,
                ty: $ty,
                cost: Cost::$cost,
                read: Read::$read,
                available: $avail,
                domain: domain_or!($ty $(, $domain)?),
                doc: $doc,
            },)*
        ];
    };
}

/// A fact's lint domain: the one declared, or the one of its type.
macro_rules! domain_or {
    ($ty:expr) => {
        Domain::of($ty)
    };
    ($ty:expr, $domain:expr) => {
        $domain
    };
}

/// One set of events: those whose verb, subject and site are among these (an empty list
/// stands for any).
#[derive(Clone, Copy, Debug)]
pub struct Events {
    pub verbs: &'static [Verb],
    pub subjects: &'static [Subject],
    pub sites: &'static [Site],
}

impl Events {
    fn contains(&self, verb: Verb, subject: Subject, site: Site) -> bool {
        (self.verbs.is_empty() || self.verbs.contains(&verb))
            && (self.subjects.is_empty() || self.subjects.contains(&subject))
            && (self.sites.is_empty() || self.sites.contains(&site))
    }
}

/// Where a fact can be read: the events of any of `events`; `text` says so in words (the
/// "not available" error's help, and the guide's "available in" column).
#[derive(Clone, Copy, Debug)]
pub struct Availability {
    pub events: &'static [Events],
    pub text: &'static str,
}

const MACHINE_SUBJECTS: &[Subject] = &[Subject::ControlPlane, Subject::Worker, Subject::Machine];
const LEAVE_VERBS: &[Verb] = &[Verb::Remove, Verb::Unapprove, Verb::Reassign, Verb::Move];

const EVERY_RULE: Availability = Availability {
    events: &[Events {
        verbs: &[],
        subjects: &[],
        sites: &[],
    }],
    text: "every rule",
};
const ON_MACHINES: Availability = Availability {
    events: &[Events {
        verbs: &[],
        subjects: MACHINE_SUBJECTS,
        sites: &[],
    }],
    text: "rules on `controlplane`, `worker` or `machine`",
};
const ON_MACHINES_AND_CLUSTERS: Availability = Availability {
    events: &[Events {
        verbs: &[],
        subjects: &[
            Subject::ControlPlane,
            Subject::Worker,
            Subject::Machine,
            Subject::Cluster,
        ],
        sites: &[],
    }],
    text: "rules on machines and clusters",
};
const ON_APPLY: Availability = Availability {
    events: &[Events {
        verbs: &[Verb::Apply, Verb::Bootstrap],
        subjects: MACHINE_SUBJECTS,
        sites: &[],
    }],
    text: "`apply` and `bootstrap` rules (the controller)",
};
const ON_LEAVE_CONTROLPLANE: Availability = Availability {
    events: &[Events {
        verbs: LEAVE_VERBS,
        subjects: &[Subject::ControlPlane],
        sites: &[],
    }],
    text: "`remove`, `unapprove`, `reassign` and `move` of `controlplane`",
};
const ON_OPERATIONS: Availability = Availability {
    events: &[Events {
        verbs: &[],
        subjects: &[Subject::Operation],
        sites: &[],
    }],
    text: "rules on `operation`",
};
const ON_OPERATIONS_AND_CONTROLPLANES: Availability = Availability {
    events: &[Events {
        verbs: &[],
        subjects: &[Subject::Operation, Subject::ControlPlane],
        sites: &[],
    }],
    text: "rules on `operation` or `controlplane`",
};
const ON_LEAVE_CONTROLPLANE_AND_START: Availability = Availability {
    events: &[
        Events {
            verbs: LEAVE_VERBS,
            subjects: &[Subject::ControlPlane],
            sites: &[],
        },
        Events {
            verbs: &[Verb::Start, Verb::Step],
            subjects: &[Subject::Operation],
            sites: &[],
        },
    ],
    text: "`remove`, `unapprove`, `reassign` and `move` of `controlplane`, `start operation` and `step operation`",
};
const ON_PATCH: Availability = Availability {
    events: &[Events {
        verbs: &[],
        subjects: &[Subject::Patch],
        sites: &[],
    }],
    text: "rules on `patch` (`apply patch`: a TalosConfigPatch created or updated)",
};
const ON_BOOTSTRAP: Availability = Availability {
    events: &[Events {
        verbs: &[Verb::Bootstrap],
        subjects: &[],
        sites: &[],
    }],
    text: "`bootstrap` rules (the controller)",
};
const ON_REPORT: Availability = Availability {
    events: &[Events {
        verbs: &[Verb::Report],
        subjects: &[],
        sites: &[],
    }],
    text: "`report` rules (the webhook)",
};

/// The control-plane counts a TalosCluster may declare (the CRD's enum for
/// `spec.controlPlane.count`).
pub const CONTROL_PLANE_COUNTS: &[i64] = &[1, 3, 5];

/// The values `count` can take: a declared count, or 0 when the cluster does not exist.
pub const COUNT_VALUES: &[i64] = &[0, 1, 3, 5];

/// The values the lints give a fact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Domain {
    /// `true` or `false`.
    Bool,
    /// Any text (names and enum facts: the literals a condition compares them with, and one
    /// value equal to none of them).
    Text,
    /// Any count from 0 (a machine count or a position), unbounded.
    Natural,
    /// Exactly these integers.
    Values(&'static [i64]),
}

impl Domain {
    /// The domain of a fact of this type (`count` is the one int with values of its own).
    const fn of(ty: Type) -> Domain {
        match ty {
            Type::Bool => Domain::Bool,
            Type::Name | Type::Enum(_) => Domain::Text,
            Type::Int => Domain::Natural,
        }
    }
}

/// What a fact is computed from, so the live read a decision needs is derived from the
/// facts its rows read (the webhook reads nothing else, and nothing less).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// The request's own object (or, at the controller, the object reconciled).
    Request,
    /// The LIST of the cluster's TalosMachines.
    Machines,
    /// The GET of the TalosCluster.
    Cluster,
    /// The LIST of the cluster's TalosOperations.
    Operations,
    /// The LIST of the cluster's TalosEtcdBackups (with the GET of the TalosCluster, whose
    /// network says what is inside it).
    Backups,
}

facts! {
    Approved "approved" Type::Int, Cheap, Machines, EVERY_RULE,
        "approved control planes of the cluster";
    Workers "workers" Type::Int, Cheap, Machines, EVERY_RULE,
        "approved workers of the cluster";
    Count "count" Type::Int, Cheap, Cluster, EVERY_RULE, domain Domain::Values(COUNT_VALUES),
        "spec.controlPlane.count (1, 3 or 5; 0 when the cluster does not exist)";
    Schedulable "schedulable" Type::Bool, Cheap, Cluster, EVERY_RULE,
        "spec.schedulable is not \"false\" (true when the cluster does not exist)";
    Cluster "cluster" Type::Name, Cheap, Request, EVERY_RULE, "the TalosCluster's name";
    ClusterExists "cluster.exists" Type::Bool, Cheap, Cluster, EVERY_RULE, "the TalosCluster exists";
    ClusterDeleting "cluster.deleting" Type::Bool, Cheap, Cluster, EVERY_RULE,
        "the TalosCluster is being deleted";
    Transitioning "transitioning" Type::Bool, Cheap, Machines, EVERY_RULE,
        "the approved control-plane count is even (and not zero)";
    Machine "machine" Type::Name, Cheap, Request, ON_MACHINES, "the TalosMachine's name";
    Role "role" Type::Enum(EnumKind::Role), Cheap, Request, ON_MACHINES, "spec.role";
    Deleting "deleting" Type::Bool, Cheap, Request, ON_MACHINES, "the subject is being deleted";
    AllowDelete "allow_delete" Type::Bool, Cheap, Request, ON_MACHINES_AND_CLUSTERS,
        "annotation `ichor.maesh.dev/allow-delete: \"true\"`";
    Rank "rank" Type::Int, Cheap, Machines, ON_APPLY,
        "position from 1 among approved control planes by spec.approvalDecision.at, then name (creation time without a decision time)";
    MemberDead "member.dead" Type::Bool, Expensive, Request, ON_LEAVE_CONTROLPLANE,
        "its etcd member is listed by a healthy sibling and, asked through that sibling at the address etcd lists for it (never `spec.endpoint`, which a person can edit), does not answer, fails, or sees no leader. The webhook sees only Ready=False NodeUnreachable; offline evaluation also accepts a Removal condition with reason DeadMemberRemoval. Expensive: fetched only when needed";
    NodeUnreachable "node.unreachable" Type::Bool, Cheap, Request, ON_MACHINES,
        "Ready=False with reason NodeUnreachable";
    Operation "operation" Type::Name, Cheap, Request, ON_OPERATIONS, "the TalosOperation's name";
    Kind "kind" Type::Enum(EnumKind::OperationKind), Cheap, Request, ON_OPERATIONS, "spec.kind";
    Target "target" Type::Name, Cheap, Request, ON_OPERATIONS, "spec.machine (\"\" when none)";
    TargetControlPlane "target.controlplane" Type::Bool, Cheap, Machines, ON_OPERATIONS,
        "spec.machine is an approved control plane of the operation's cluster, not being deleted (one `approved` counts)";
    TargetUncounted "target.uncounted" Type::Bool, Cheap, Machines, ON_OPERATIONS,
        "spec.machine is a machine of the operation's cluster that may still be an etcd member, since it holds the removal finalizer (which the controller puts on approved control planes only), but that `approved` does not count: it is being deleted, no longer approved, or re-roled to a worker";
    TargetExists "target.exists" Type::Bool, Cheap, Machines, ON_OPERATIONS,
        "spec.machine names a TalosMachine of the operation's cluster (false without spec.machine, and for a machine of another cluster or none at all)";
    Phase "phase" Type::Name, Cheap, Request, ON_OPERATIONS, "status.phase";
    Failed "failed" Type::Bool, Cheap, Request, ON_OPERATIONS,
        "status.failureReason is set, or status.phase is Failed";
    Paused "paused" Type::Bool, Cheap, Request, ON_OPERATIONS,
        "Paused=True for a reason no `hold run operation` rule sets (Operator, ClusterLockHeld, a shutdown, a failure): that pause stands";
    UnfinishedExists "unfinished.exists" Type::Bool, Cheap, Operations, ON_OPERATIONS_AND_CONTROLPLANES,
        "another operation of the cluster is not finished (any phase but Succeeded or Completed)";
    UnfinishedName "unfinished.name" Type::Name, Cheap, Operations, ON_OPERATIONS_AND_CONTROLPLANES,
        "its name (one not parked preferred, then the oldest)";
    UnfinishedKind "unfinished.kind" Type::Name, Cheap, Operations, ON_OPERATIONS_AND_CONTROLPLANES,
        "its spec.kind";
    UnfinishedPhase "unfinished.phase" Type::Name, Cheap, Operations, ON_OPERATIONS_AND_CONTROLPLANES,
        "its status.phase";
    UnfinishedParked "unfinished.parked" Type::Bool, Cheap, Operations, ON_OPERATIONS_AND_CONTROLPLANES,
        "it is parked by the rules: phase Paused, Paused=True with a reason a `hold run operation` rule sets (read from the rules: the shipped rules say ClusterTransitioning), and no failure";
    HealthyAfter "healthy.after" Type::Int, Expensive, Machines, ON_LEAVE_CONTROLPLANE_AND_START,
        "etcd members that stay, and answer, once the subject (a departing control plane, or an operation's target) is gone. Expensive: the controller asks each voting member a healthy sibling lists, through that sibling at the address etcd lists for it, and counts those answering as themselves with a leader and no errors (fails closed when no sibling answers); admission counts the other approved control planes not being deleted and not Ready=False NodeUnreachable";
    MembersAfter "members.after" Type::Int, Expensive, Machines, ON_LEAVE_CONTROLPLANE_AND_START,
        "etcd voting members that stay once the subject (a departing control plane, or an operation's target) is gone, answering or not (a replacement that is approved but has not joined etcd yet is not one). Expensive: the controller reads the member list through a healthy sibling (fails closed when none answers); admission counts the other approved control planes not being deleted";
    RequestByController "request.by_controller" Type::Bool, Cheap, Request, ON_REPORT,
        "the request was made by the controller's own identity: its `userInfo.username` is exactly the one `serve --controller-username` names (the chart: the controller's ServiceAccount, `system:serviceaccount:<release namespace>:<controller ServiceAccount>`). False when none is named: nothing is trusted as the controller's without its name";
    Backup "backup" Type::Name, Cheap, Request, ON_OPERATIONS,
        "spec.backupRef.name, the TalosEtcdBackup an `etcd-restore` restores from (\"\" when none)";
    BackupExists "backup.exists" Type::Bool, Cheap, Backups, ON_OPERATIONS,
        "spec.backupRef.name names a TalosEtcdBackup of the operation's cluster";
    BackupInCluster "backup.in_cluster" Type::Bool, Cheap, Backups, ON_OPERATIONS,
        "that TalosEtcdBackup's store is inside the cluster (ADR 0106 §2): its spec.store.endpoint host ends in `.svc` or `.svc.cluster.local`, or is an IP address inside the cluster's pod or service ranges (`spec.network` of the TalosCluster; Talos' defaults `10.244.0.0/16` and `10.96.0.0/12` for a range it does not declare). Not recognised: a short Service name such as `minio.minio`, or a name that resolves to a cluster address (names are not resolved)";
    Backups "backups" Type::Int, Cheap, Backups, ON_OPERATIONS,
        "TalosEtcdBackups of the operation's cluster (0: the cluster is backed up some other way, or not at all)";
    SnapshotTaken "snapshot.taken" Type::Bool, Cheap, Backups, ON_OPERATIONS,
        "some TalosEtcdBackup of the operation's cluster whose store is outside the cluster (not `backup.in_cluster`: a restore cannot use one inside) has a verified snapshot (its status.lastSnapshot, read live)";
    SnapshotAge "snapshot.age" Type::Int, Cheap, Backups, ON_OPERATIONS,
        "minutes since the newest verified snapshot of the operation's cluster in a store outside it was taken (status.lastSnapshot.time of its TalosEtcdBackups, read live, against the clock of the decision); 0 when none has one (see `snapshot.taken`), and for a time ahead of the clock";
    SnapshotBackup "snapshot.backup" Type::Name, Cheap, Backups, ON_OPERATIONS,
        "the TalosEtcdBackup holding that newest verified snapshot; when none has one, the first by name of the cluster's backups with a store outside it, else of all its backups (\"\" when it has none)";
    Patch "patch" Type::Name, Cheap, Request, ON_PATCH, "the TalosConfigPatch's name";
    PatchSelects "patch.selects" Type::Int, Cheap, Request, ON_PATCH,
        "approved machines of the cluster the patch selects (its dry render, ADR 0106 §1; 0 when the cluster is missing)";
    PatchBreaks "patch.breaks" Type::Int, Cheap, Request, ON_PATCH,
        "selected approved machines whose configuration renders without the patch and fails with it (the dry render against the redacted base the controller publishes; 0 when there is nothing to render against: the cluster missing or no base published yet)";
    PatchError "patch.error" Type::Name, Cheap, Request, ON_PATCH,
        "the first machine the patch breaks and its render error, `<machine>: <error>` (\"\" when it breaks none)";
    Bootstrapped "bootstrapped" Type::Bool, Cheap, Cluster, ON_BOOTSTRAP,
        "the TalosCluster's status records the cluster's bootstrap (`status.bootstrap`): a `Bootstrap` sent (to which machine, when; written under a resourceVersion precondition before the call, whether its answer came back or not), or etcd found running when the first control plane was configured";
    EtcdMembers "etcd.members" Type::Int, Expensive, Machines, ON_BOOTSTRAP,
        "the most etcd members any control plane of the cluster lists (approved or not, not being deleted); one whose etcd is not running (Talos answers the call with an error) counts 1 when its etcd data directory (`/var/lib/etcd`, Talos' `List`) is not empty (etcd ran there and stopped), else none; one in Talos' maintenance mode (no configuration: it fails the cluster's handshake and answers `Version` on the maintenance API) counts none. Expensive: the controller asks `EtcdMemberList` of each, live, `List` of each whose etcd is not running, and the maintenance API of each that fails the handshake; a node that answers none of them, or has no endpoint to dial, makes it unreadable, and the bootstrap is not decided. Offline (`eval`): the approved control planes when `bootstrapped`, else 0";
    MaxUnavailable "max_unavailable" Type::Int, Cheap, Request, ON_OPERATIONS,
        "spec.maxUnavailable: how many workers a roll over the cluster may take down at once (1 when omitted; what was written otherwise, even 0 or less, for a rule to refuse)";
    RollInFlight "roll.in_flight" Type::Int, Cheap, Request, ON_OPERATIONS,
        "the nodes of this roll in flight beside the target (started, not finished: `status.progress.node` and `status.progress.alongside`, the target left out); 0 before the roll starts and for an operation on one machine";
    RollControlPlaneInFlight "roll.controlplane_in_flight" Type::Bool, Cheap, Machines, ON_OPERATIONS,
        "one of those nodes in flight beside the target is a control plane (approved as one, or holding the removal finalizer: it may still be an etcd member)";
    WorkersOthersUp "workers.others_up" Type::Int, Cheap, Machines, ON_OPERATIONS,
        "approved workers of the operation's cluster, not being deleted, other than its target and the roll's nodes in flight (`roll.in_flight`), that the controller's probe does not report unreachable (Ready=False NodeUnreachable): where an unschedulable cluster's workloads can run while the target is down";
}

impl Fact {
    pub fn info(self) -> &'static FactInfo {
        &FACTS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    pub fn slot(self) -> usize {
        usize::from(self.slot8())
    }

    /// The slot as the compiled form stores it.
    pub fn slot8(self) -> u8 {
        self as u8
    }

    pub fn from_slot(slot: usize) -> Option<Fact> {
        FACTS.get(slot).map(|i| i.fact)
    }

    pub fn lookup(name: &str) -> Option<Fact> {
        FACTS.iter().find(|f| f.name == name).map(|f| f.fact)
    }

    /// Whether the runtime can provide this fact for this event.
    pub fn available(self, verb: Verb, subject: Subject, site: Site) -> bool {
        self.info()
            .available
            .events
            .iter()
            .any(|e| e.contains(verb, subject, site))
    }

    /// Where the fact is available, in words, for the "not available" error.
    pub fn availability_text(self) -> &'static str {
        self.info().available.text
    }
}

/// The facts table of the rule author's guide (docs/rules.md, under "## Facts"), generated
/// from [`FACTS`]: a test fails when the guide's copy differs (and rewrites it when
/// `UPDATE_DOCS=1` is set).
pub fn facts_table_markdown() -> String {
    let mut out = String::from("| fact | type | available in | meaning |\n|---|---|---|---|\n");
    for f in FACTS {
        let values = match f.ty {
            Type::Enum(e) => {
                let quoted: Vec<String> = e.values().iter().map(|v| format!("`\"{v}\"`")).collect();
                format!(": {}", quoted.join(", "))
            }
            _ => String::new(),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {}{values} |\n",
            f.name, f.ty, f.available.text, f.doc
        ));
    }
    out
}

impl fmt::Display for Fact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A built-in plan action. The controller's dispatch is an exhaustive `match` on it, so an
/// action added here cannot be left without an implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    LockCluster,
    DrainNode,
    EtcdForfeitLeadership,
    EtcdLeave,
    EtcdRemoveMember,
    TalosReset,
    TalosWipe,
    EventWarning,
    EventNormal,
    ReleaseFinalizer,
    EtcdHealthy,
    CordonNode,
    UncordonNode,
    TalosReboot,
    TalosShutdown,
    TalosUpgrade,
    TalosRollback,
    WaitNodeBack,
    TalosInstall,
    ConfigRender,
    TalosDryRun,
    TalosApplyConfig,
    TalosBootstrap,
    EtcdSnapshot,
    SnapshotsPrune,
}

/// Which procedures run an action: a plan of another may not name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Removals and operations (not a configuration's apply, a bootstrap or a backup's
    /// snapshot: they run under no cluster lock and have no drain, no etcd member and no
    /// events of their own).
    Any,
    /// The removal of a control plane (`plan remove controlplane`).
    Removal,
    /// An operation (`plan run operation "<kind>"`).
    Operation,
    /// A machine's configuration applied (`plan apply controlplane`, `plan apply worker`).
    Apply,
    /// The bootstrap of a new cluster's etcd (`plan bootstrap controlplane`).
    Bootstrap,
    /// A backup's snapshot (`plan snapshot backup`).
    Backup,
}

impl Scope {
    /// The procedure a plan for this verb runs.
    pub fn of(verb: Verb) -> Scope {
        match verb {
            Verb::Run => Scope::Operation,
            Verb::Apply => Scope::Apply,
            Verb::Bootstrap => Scope::Bootstrap,
            Verb::Snapshot => Scope::Backup,
            _ => Scope::Removal,
        }
    }

    pub fn admits(self, plan: Scope) -> bool {
        match self {
            Scope::Any => matches!(plan, Scope::Removal | Scope::Operation),
            _ => self == plan,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Scope::Any => "a removal's or an operation's plan",
            Scope::Removal => "the removal of a control plane (`plan remove controlplane`)",
            Scope::Operation => "an operation's plan (`plan run operation \"<kind>\"`)",
            Scope::Apply => {
                "a machine's configuration apply (`plan apply controlplane`, `plan apply worker`)"
            }
            Scope::Bootstrap => "the bootstrap of a new cluster (`plan bootstrap controlplane`)",
            Scope::Backup => "a backup's snapshot (`plan snapshot backup`)",
        }
    }
}

/// Whether a step may, or must, say how long it waits (`within 10m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    /// The step does not wait on the world: no `within`.
    None,
    /// A gate: without `within` it must pass at once; with it, it may take that long.
    Optional,
    /// It waits on the world by nature: `within` is required.
    Required,
}

/// The longest `within` a step may say (a day): a gate that waits longer is a stuck one.
pub const MAX_STEP_TIMEOUT_SECS: u64 = 24 * 3600;

impl Action {
    /// Every action, in the order of [`ACTIONS`].
    pub const ALL: [Action; 25] = [
        Action::LockCluster,
        Action::DrainNode,
        Action::EtcdForfeitLeadership,
        Action::EtcdLeave,
        Action::EtcdRemoveMember,
        Action::TalosReset,
        Action::TalosWipe,
        Action::EventWarning,
        Action::EventNormal,
        Action::ReleaseFinalizer,
        Action::EtcdHealthy,
        Action::CordonNode,
        Action::UncordonNode,
        Action::TalosReboot,
        Action::TalosShutdown,
        Action::TalosUpgrade,
        Action::TalosRollback,
        Action::WaitNodeBack,
        Action::TalosInstall,
        Action::ConfigRender,
        Action::TalosDryRun,
        Action::TalosApplyConfig,
        Action::TalosBootstrap,
        Action::EtcdSnapshot,
        Action::SnapshotsPrune,
    ];

    pub fn info(self) -> &'static ActionInfo {
        &ACTIONS[self as usize]
    }

    /// The words that name it in a plan (`etcd leave`).
    pub fn words(self) -> &'static [&'static str] {
        self.info().words
    }

    pub fn doc(self) -> &'static str {
        self.info().doc
    }

    /// Whether it disrupts the cluster (a node drained, an etcd member leaving or removed,
    /// a node reset): such steps run one at a time per cluster, under its lock.
    pub const fn disruptive(self) -> bool {
        match self {
            Action::DrainNode
            | Action::EtcdForfeitLeadership
            | Action::EtcdLeave
            | Action::EtcdRemoveMember
            | Action::TalosReset
            | Action::TalosWipe
            | Action::CordonNode
            | Action::TalosReboot
            | Action::TalosShutdown
            | Action::TalosUpgrade
            | Action::TalosRollback
            | Action::TalosInstall => true,
            Action::LockCluster
            | Action::EventWarning
            | Action::EventNormal
            | Action::ReleaseFinalizer
            | Action::EtcdHealthy
            | Action::UncordonNode
            | Action::WaitNodeBack
            | Action::ConfigRender
            | Action::TalosDryRun
            | Action::TalosApplyConfig
            | Action::TalosBootstrap
            | Action::EtcdSnapshot
            | Action::SnapshotsPrune => false,
        }
    }

    /// Whether the node comes back from it with a new boot time, which `wait node-back`
    /// waits for (the executor records the boot time before the call): a reboot, an
    /// upgrade, a rollback. A shutdown does not come back by itself; a reset comes back
    /// as another machine.
    pub const fn reboots(self) -> bool {
        match self {
            Action::TalosReboot | Action::TalosUpgrade | Action::TalosRollback => true,
            Action::LockCluster
            | Action::DrainNode
            | Action::EtcdForfeitLeadership
            | Action::EtcdLeave
            | Action::EtcdRemoveMember
            | Action::TalosReset
            | Action::TalosWipe
            | Action::EventWarning
            | Action::EventNormal
            | Action::ReleaseFinalizer
            | Action::EtcdHealthy
            | Action::CordonNode
            | Action::UncordonNode
            | Action::TalosShutdown
            | Action::WaitNodeBack
            | Action::TalosInstall
            | Action::ConfigRender
            | Action::TalosDryRun
            | Action::TalosApplyConfig
            | Action::TalosBootstrap
            | Action::EtcdSnapshot
            | Action::SnapshotsPrune => false,
        }
    }

    /// Which procedures run it.
    pub fn scope(self) -> Scope {
        self.info().scope
    }

    /// Whether a step of it may, or must, say how long it waits.
    pub fn timeout(self) -> Timeout {
        self.info().timeout
    }
}

/// A built-in plan action: the words that name it, whether it takes one free argument
/// (a reason), and whether it needs a message.
pub struct ActionInfo {
    pub action: Action,
    pub words: &'static [&'static str],
    pub argument: Option<&'static str>,
    pub needs_message: bool,
    /// Which procedures run it.
    pub scope: Scope,
    /// Whether a step of it says how long it may wait.
    pub timeout: Timeout,
    pub doc: &'static str,
}

/// Every built-in action a plan may name.
pub const ACTIONS: &[ActionInfo] = &[
    ActionInfo {
        action: Action::LockCluster,
        words: &["lock", "cluster"],
        argument: None,
        needs_message: false,
        scope: Scope::Any,
        timeout: Timeout::None,
        doc: "take the cluster's Lease lock (the same identity resumes its own lock)",
    },
    ActionInfo {
        action: Action::DrainNode,
        words: &["drain", "node"],
        argument: None,
        needs_message: false,
        scope: Scope::Any,
        timeout: Timeout::None,
        doc: "cordon the Kubernetes Node, then evict its pods honouring PodDisruptionBudgets",
    },
    ActionInfo {
        action: Action::EtcdForfeitLeadership,
        words: &["etcd", "forfeit-leadership"],
        argument: None,
        needs_message: false,
        scope: Scope::Any,
        timeout: Timeout::None,
        doc: "make the departing member give up etcd leadership if it leads",
    },
    ActionInfo {
        action: Action::EtcdLeave,
        words: &["etcd", "leave"],
        argument: None,
        needs_message: false,
        scope: Scope::Removal,
        timeout: Timeout::None,
        doc: "the departing node leaves the etcd cluster",
    },
    ActionInfo {
        action: Action::EtcdRemoveMember,
        words: &["etcd", "remove-member"],
        argument: None,
        needs_message: false,
        scope: Scope::Removal,
        timeout: Timeout::None,
        doc: "remove the departing member by ID through a healthy sibling",
    },
    ActionInfo {
        action: Action::TalosReset,
        words: &["talos", "reset"],
        argument: None,
        needs_message: false,
        scope: Scope::Any,
        timeout: Timeout::None,
        doc: "graceful Talos reset of the node, guarded against a second reset",
    },
    ActionInfo {
        action: Action::TalosWipe,
        words: &["talos", "wipe"],
        argument: None,
        needs_message: false,
        scope: Scope::Removal,
        timeout: Timeout::None,
        doc: "Talos reset of the node without leaving etcd first (not graceful), for a cluster torn down with its etcd; guarded against a second reset",
    },
    ActionInfo {
        action: Action::EventWarning,
        words: &["event", "warning"],
        argument: Some("event reason"),
        needs_message: true,
        scope: Scope::Any,
        timeout: Timeout::None,
        doc: "emit a Warning event with this reason and message",
    },
    ActionInfo {
        action: Action::EventNormal,
        words: &["event", "normal"],
        argument: Some("event reason"),
        needs_message: true,
        scope: Scope::Any,
        timeout: Timeout::None,
        doc: "emit a Normal event with this reason and message",
    },
    ActionInfo {
        action: Action::ReleaseFinalizer,
        words: &["release", "finalizer"],
        argument: None,
        needs_message: false,
        scope: Scope::Removal,
        timeout: Timeout::None,
        doc: "remove the finalizer ichor.maesh.dev/machine-removal",
    },
    ActionInfo {
        action: Action::EtcdHealthy,
        words: &["etcd", "healthy"],
        argument: None,
        needs_message: false,
        scope: Scope::Operation,
        timeout: Timeout::Optional,
        doc: "a gate: every voting etcd member answers through a healthy sibling, as itself, sees a leader and reports no errors, and none is a learner (read through the Talos API)",
    },
    ActionInfo {
        action: Action::CordonNode,
        words: &["cordon", "node"],
        argument: None,
        needs_message: false,
        scope: Scope::Operation,
        timeout: Timeout::None,
        doc: "mark the Kubernetes Node unschedulable, remembering whether an administrator had cordoned it already",
    },
    ActionInfo {
        action: Action::UncordonNode,
        words: &["uncordon", "node"],
        argument: None,
        needs_message: false,
        scope: Scope::Operation,
        timeout: Timeout::None,
        doc: "mark the Kubernetes Node schedulable again, only if this operation cordoned it (a node an administrator cordoned stays cordoned)",
    },
    ActionInfo {
        action: Action::TalosReboot,
        words: &["talos", "reboot"],
        argument: None,
        needs_message: false,
        scope: Scope::Operation,
        timeout: Timeout::None,
        doc: "Talos `Reboot` of the node, sent once: its boot time, recorded before, tells whether it already rebooted",
    },
    ActionInfo {
        action: Action::TalosShutdown,
        words: &["talos", "shutdown"],
        argument: None,
        needs_message: false,
        scope: Scope::Operation,
        timeout: Timeout::None,
        doc: "Talos `Shutdown` of the node, sent once",
    },
    ActionInfo {
        action: Action::TalosUpgrade,
        words: &["talos", "upgrade"],
        argument: None,
        needs_message: false,
        scope: Scope::Operation,
        timeout: Timeout::None,
        doc: "upgrade the node to spec.image, by the path its Talos `Version` takes: from 1.13 `ImageService/Pull`, `LifecycleService/Upgrade` (its `exit_code` read) and `Reboot`; before, the legacy `MachineService/Upgrade`. Sent once: the boot time and version tell whether it already happened",
    },
    ActionInfo {
        action: Action::TalosRollback,
        words: &["talos", "rollback"],
        argument: None,
        needs_message: false,
        scope: Scope::Operation,
        timeout: Timeout::None,
        doc: "Talos `Rollback` of the node (back to its previous image, and reboot), sent once",
    },
    ActionInfo {
        action: Action::WaitNodeBack,
        words: &["wait", "node-back"],
        argument: None,
        needs_message: false,
        scope: Scope::Operation,
        timeout: Timeout::Required,
        doc: "a gate: the node answers with a new `SystemStat.boot_time` (and, after an upgrade, the image's tag as its `Version`), and its Kubernetes Node is Ready, within the step's `within`",
    },
    ActionInfo {
        action: Action::TalosInstall,
        words: &["talos", "install"],
        argument: None,
        needs_message: false,
        scope: Scope::Operation,
        timeout: Timeout::None,
        doc: "install spec.image on the node without rebooting it, before it is cordoned or drained, so a bad image fails the operation with the node untouched: on Talos 1.13 and later (its `Version`) `ImageService/Pull`, then `LifecycleService/Upgrade` with its `exit_code` read (the `talos upgrade` after it only reboots); on an older Talos nothing (the legacy `MachineService/Upgrade` of `talos upgrade` installs). Sent once: recorded in status before and after, and an install whose end was not seen fails the operation rather than being sent again",
    },
    ActionInfo {
        action: Action::ConfigRender,
        words: &["config", "render"],
        argument: None,
        needs_message: false,
        scope: Scope::Apply,
        timeout: Timeout::None,
        doc: "render the machine's configuration: the cluster's base Secret (read live, never logged) for its role, the TalosConfigPatches selecting it in order, its identity; records the digest of the inputs (`status.config.inputs`) and the render's hash (`renderedHash`). When the node runs that hash already (`appliedHash`), the apply is over: the steps after it are skipped",
    },
    ActionInfo {
        action: Action::TalosDryRun,
        words: &["talos", "dry-run"],
        argument: None,
        needs_message: false,
        scope: Scope::Apply,
        timeout: Timeout::None,
        doc: "Talos' own check of the rendered configuration: `ApplyConfiguration` with `dry_run` (on the maintenance API when the node is in maintenance mode); a refusal stops the apply, said with Talos' words (`DryRunRefused`), and its answer (whether a reboot is needed) chooses how `talos apply-config` applies",
    },
    ActionInfo {
        action: Action::TalosApplyConfig,
        words: &["talos", "apply-config"],
        argument: None,
        needs_message: false,
        scope: Scope::Apply,
        timeout: Timeout::None,
        doc: "`ApplyConfiguration` of the rendered configuration: a node in maintenance mode gets its first one over the maintenance API (it installs and reboots into it); else a change the dry run says needs no reboot is applied `no-reboot` and recorded applied, one that needs a reboot is staged and recorded staged (the roll's reboot applies it; not staged again while it waits). Without a `talos dry-run` before it, it applies `no-reboot` (Talos refuses a change that needs a reboot)",
    },
    ActionInfo {
        action: Action::TalosBootstrap,
        words: &["talos", "bootstrap"],
        argument: None,
        needs_message: false,
        scope: Scope::Bootstrap,
        timeout: Timeout::None,
        doc: "Talos `Bootstrap` of the control plane (etcd starts on a new cluster), sent once: recorded first in the TalosCluster's `status.bootstrap` under a resourceVersion precondition (of two controllers one writes, the other sends nothing), never sent again once recorded (a lost answer is confirmed by etcd listing a member); a refusal because etcd has data records the cluster as found",
    },
    ActionInfo {
        action: Action::EtcdSnapshot,
        words: &["etcd", "snapshot"],
        argument: None,
        needs_message: false,
        scope: Scope::Backup,
        timeout: Timeout::None,
        doc: "take the backup's snapshot: from a healthy control plane (asked with `EtcdStatus`: a leader, no errors, not a learner; a follower before the leader), recorded as in progress, streamed into the store (multipart) and verified (its trailing sha256, the stored size); verified, it is recorded and becomes the last good one; failed, it is deleted from the store, reported, never counted, and the plan stops there. One whose end was not seen is deleted by the next reconcile, never counted",
    },
    ActionInfo {
        action: Action::SnapshotsPrune,
        words: &["snapshots", "prune"],
        argument: None,
        needs_message: false,
        scope: Scope::Backup,
        timeout: Timeout::None,
        doc: "retention (spec.retention: `keepLast`, `maxAge`) among the snapshots this backup recorded, never the newest and never an object it did not write: their records move to `status.pruning`, written before the first deletion, and leave it once the store deleted them",
    },
];

/// The full spelling of every action, for "did you mean".
pub fn action_spellings() -> Vec<String> {
    ACTIONS.iter().map(|a| a.words.join(" ")).collect()
}

/// The steps of `verify`'s model, as the fact `step` names them in invariants.
pub const MODEL_STEPS: &[&str] = &[
    "start",
    "admit",
    "commit",
    "conflict",
    "join",
    "hold",
    "release-hold",
    "probe",
    "lock",
    "refused",
    "drain",
    "forfeit-leadership",
    "etcd-leave",
    "remove-member",
    "event",
    "reset",
    "wipe",
    "release-finalizer",
    "operation-park",
    "operation-resume",
    "operation-refused",
    "operation-run",
    "operation-done",
    "operation-step",
    "node-down",
    "node-dies",
    "node-returns",
    "pdb",
    "teardown",
    "snapshot",
    "snapshot-ages",
    "lock-expires",
    "time-passes",
];

/// The facts of `verify`'s model: what an `invariant` may read about one explored state of
/// a cluster (and about the step that led to it). Rules cannot read them, and invariants
/// read nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ModelFact {
    Members,
    Healthy,
    MembersBefore,
    HealthyBefore,
    Count,
    Approved,
    ApprovedBefore,
    ApprovedAll,
    ApprovedAllBefore,
    Active,
    StepRank,
    Workers,
    Disruptive,
    Running,
    Unfinished,
    ClusterDeleting,
    ClusterExists,
    Schedulable,
    Transitioning,
    Step,
    StepKind,
    StepOurs,
    StepCreated,
    RemovedDead,
    ReleasedMember,
    ReleasedRunning,
    DeadMemberEventMissing,
    DeletedUnannotated,
    LeftDead,
    ResetUndrained,
    StepWarned,
    Stuck,
    OperationStuck,
    DownOthers,
    OperationLeftDown,
    OperationUndone,
    FailedTouched,
    CureBlocked,
    RollDown,
    RollMaxUnavailable,
    WorkersServing,
    WorkerTaken,
    RollBesideControlPlane,
    StepControlPlane,
    BackupStale,
    RestoreInCluster,
}

/// What the checker knows about a model fact.
pub struct ModelFactInfo {
    pub fact: ModelFact,
    pub name: &'static str,
    pub ty: Type,
    pub doc: &'static str,
}

macro_rules! model_facts {
    ($($fact:ident $name:literal $ty:expr, $doc:literal;)*) => {
        /// Every model fact.
        pub const MODEL_FACTS: &[ModelFactInfo] = &[
            $(ModelFactInfo { fact: ModelFact::$fact, name: $name, ty: $ty, doc: $doc },)*
        ];
    };
}

model_facts! {
    Members "members" Type::Int, "etcd members of the cluster";
    Healthy "healthy" Type::Int, "etcd members whose node is up and whose etcd serves";
    MembersBefore "members.before" Type::Int, "`members` before the step just taken";
    HealthyBefore "healthy.before" Type::Int, "`healthy` before the step just taken";
    Count "count" Type::Int, "spec.controlPlane.count";
    Approved "approved" Type::Int, "approved control planes not being deleted";
    ApprovedBefore "approved.before" Type::Int, "`approved` before the step just taken";
    ApprovedAll "approved.all" Type::Int,
        "control planes with spec.approved, being deleted or not (a removal leaves them until it ends)";
    ApprovedAllBefore "approved.all.before" Type::Int, "`approved.all` before the step just taken";
    Active "active" Type::Int,
        "approved control planes, not being deleted, that the controller let join (not held)";
    StepRank "step.rank" Type::Int,
        "for a `join` or `release-hold`: the machine's position among the approved control planes by approval order (as `rank`); 0 otherwise";
    Workers "workers" Type::Int, "approved workers not being deleted";
    Disruptive "disruptive" Type::Int,
        "pieces of disruptive work running: removals holding the cluster lock, and operations running (with or without it)";
    Running "running" Type::Int, "operations running";
    Unfinished "operations.unfinished" Type::Int, "operations not finished: pending, parked or running";
    ClusterDeleting "cluster.deleting" Type::Bool,
        "the TalosCluster is being deleted (or its teardown finished)";
    ClusterExists "cluster.exists" Type::Bool,
        "the TalosCluster exists (false where machines refer to a TalosCluster that is not there, and after a teardown)";
    Schedulable "schedulable" Type::Bool, "spec.schedulable is not \"false\"";
    Transitioning "transitioning" Type::Bool,
        "the number of approved control planes is even (and not zero)";
    Step "step" Type::Enum(EnumKind::Step), "the step just taken (`start` in a starting state)";
    StepKind "step.kind" Type::Enum(EnumKind::OperationKind),
        "the kind of the operation the step just taken acted on (or created)";
    StepOurs "step.ours" Type::Bool,
        "the step just taken is one of ours that changes etcd: etcd leave, remove-member, a reset or a wipe";
    StepCreated "step.created" Type::Bool,
        "the step just taken committed the creation of an operation (`step.kind` is its kind)";
    RemovedDead "removed.dead" Type::Bool,
        "the step just taken removed an etcd member whose node was down";
    ReleasedMember "released.member" Type::Bool,
        "the step just taken released a machine's removal finalizer while the machine was still an etcd member (its member left behind in etcd)";
    ReleasedRunning "released.running" Type::Bool,
        "the step just taken released a removal's finalizer while its node was still up, neither reset nor wiped, although the controller could reach it (not found dead, not reported unreachable)";
    DeadMemberEventMissing "dead_member_event.missing" Type::Bool,
        "the step just taken finished removing a dead member below the declared count without a DeadMemberRemoved Warning event";
    DeletedUnannotated "deleted.unannotated" Type::Bool,
        "the step just taken committed the deletion of the TalosCluster, or of a TalosMachine whose TalosCluster is not being deleted, without the ichor.maesh.dev/allow-delete annotation";
    LeftDead "left.dead" Type::Bool,
        "the step just taken committed a request about a machine (an un-approval, a role change, a delete) that was reported unreachable (Ready=False NodeUnreachable) when the request was decided";
    ResetUndrained "reset.undrained" Type::Bool,
        "the step just taken was a removal's reset or wipe of a node that was up, and the removal had not drained it";
    StepWarned "step.warned" Type::Bool,
        "the step just taken committed a request that admission let through with a warning";
    Stuck "stuck" Type::Bool,
        "a removal or teardown is in progress and some fair run (every controller step, commit and garbage collection that stays enabled is taken; nodes coming back and PodDisruptionBudgets lifting may happen, never obliged) never ends it nor leaves it waiting on something named: it reaches a state where the controller has nothing left to do, or a livelock";
    OperationStuck "operation.stuck" Type::Bool,
        "an operation is in progress (pending, parked or running) and some fair run (every controller step, commit and garbage collection that stays enabled is taken; nodes coming back and etcd catching up may happen, never obliged) never ends it (succeeded or failed) nor leaves it waiting on something named (a rule's refusal, the even count, a node or etcd not back yet, the lock held by other work)";
    DownOthers "down.others" Type::Int,
        "for a step in which an operation took the node of an etcd member down (a reboot, a shutdown, an upgrade, a rollback): how many other etcd members' nodes were down at that moment (0 for any other step)";
    OperationLeftDown "operation.left_down" Type::Bool,
        "the step just taken ended an upgrade (phase Succeeded) while its machine's node did not answer, its etcd member had not caught up, it was left cordoned (not cordoned before the operation), or it did not run the upgrade's version; or a roll over the cluster (a reboot or an upgrade) finished a node (went on to the next, or ended) while that node did not answer, its etcd member had not caught up, it was left cordoned or, for an upgrade, it did not run the upgrade's version";
    OperationUndone "operation.undone" Type::Bool,
        "the step just taken ended an operation on one machine (phase Succeeded), or a roll over the cluster finished a node (went on to the next, or ended), without the operation's own call of its kind having taken effect on that node: a reboot's `Reboot`, a shutdown's `Shutdown`, an upgrade's `Upgrade`, a rollback's `Rollback`, a reset's `Reset` (a machine gone or being deleted is not counted)";
    FailedTouched "failed.touched" Type::Bool,
        "the step just taken was the controller's reconcile of a failed operation (which only a person resumes) and it acted on a node: a cordon, an uncordon, a Talos call";
    CureBlocked "cure.blocked" Type::Bool,
        "the control-plane count is even, an operation waits for it to be odd (not started, not an etcd restore, the controller leaves it so), and deleting an approved control plane, which would end the even count, is refused although without the waiting operations it would be allowed";
    RollDown "roll.down" Type::Int,
        "of the unfinished rolls over the cluster, the one furthest past its spec.maxUnavailable: how many of its workers are down or cordoned (taken down by a call and not back, or their Kubernetes Node cordoned); 0 without a roll";
    RollMaxUnavailable "roll.max_unavailable" Type::Int,
        "that roll's spec.maxUnavailable (1 when not written, and without a roll)";
    WorkersServing "workers.serving" Type::Int,
        "approved workers not being deleted in service: their node up (not taken down by an operation's call and not back) and their Kubernetes Node not cordoned";
    WorkerTaken "worker.taken" Type::Bool,
        "the step just taken was an operation's reconcile that took an approved worker out of service (cordoned its Kubernetes Node, or took its node down)";
    RollBesideControlPlane "roll.beside_control_plane" Type::Bool,
        "the step just taken was the reconcile of a roll over the cluster that took one of its nodes out of service (cordoned its Kubernetes Node, or took it down) while another of its nodes was out of service too (cordoned, or down and not back), one of the two a control plane (a machine that is or was one: it may hold an etcd member)";
    StepControlPlane "step.controlplane" Type::Bool,
        "the operation the step just taken acted on is a control plane's (its spec.machine is, or was, a control plane: it may hold an etcd member) or rolls over the whole cluster (no spec.machine)";
    BackupStale "backup.stale" Type::Bool,
        "the cluster has a TalosEtcdBackup (with a store outside it) and no fresh verified snapshot: none taken yet, or the newest one older than any recovery point a rule would allow (`verify --backups`; false without a TalosEtcdBackup). A second backup, whose store is inside the cluster, has a fresh one throughout and never counts";
    RestoreInCluster "restore.in_cluster" Type::Bool,
        "the step just taken committed the creation of an etcd-restore from a TalosEtcdBackup whose store is inside the cluster (`verify --backups`: the model's restores name that one)";
}

impl ModelFact {
    pub fn info(self) -> &'static ModelFactInfo {
        &MODEL_FACTS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    pub fn lookup(name: &str) -> Option<ModelFact> {
        MODEL_FACTS.iter().find(|f| f.name == name).map(|f| f.fact)
    }
}

/// One event a rule applies to: a verb on a subject, decided at a site. The key of the
/// decision table's row groups.
pub type Event = (Verb, Subject, Site);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fact_slots_match_their_table_rows() {
        assert_eq!(FACTS.len(), FACT_COUNT);
        for (i, info) in FACTS.iter().enumerate() {
            assert_eq!(info.fact as usize, i, "{} is out of order", info.name);
            assert_eq!(Fact::lookup(info.name), Some(info.fact));
        }
    }

    #[test]
    fn model_facts_are_in_order() {
        for (i, info) in MODEL_FACTS.iter().enumerate() {
            assert_eq!(info.fact as usize, i, "{} is out of order", info.name);
            assert_eq!(ModelFact::lookup(info.name), Some(info.fact));
        }
    }

    #[test]
    fn every_fact_is_available_somewhere_and_only_where_declared() {
        for info in FACTS {
            assert!(
                RUNTIME_EVENTS
                    .iter()
                    .any(|(v, s, site)| info.fact.available(*v, *s, *site)),
                "{} is available for no event the runtime produces",
                info.name
            );
        }
        let (w, c) = (Site::Webhook, Site::Controller);
        assert!(Fact::Rank.available(Verb::Apply, Subject::ControlPlane, c));
        assert!(!Fact::Rank.available(Verb::Remove, Subject::ControlPlane, c));
        assert!(Fact::HealthyAfter.available(Verb::Start, Subject::Operation, w));
        assert!(Fact::HealthyAfter.available(Verb::Move, Subject::ControlPlane, w));
        assert!(!Fact::HealthyAfter.available(Verb::Run, Subject::Operation, c));
        assert!(!Fact::HealthyAfter.available(Verb::Remove, Subject::Worker, w));
        assert!(Fact::AllowDelete.available(Verb::Remove, Subject::Cluster, w));
        assert!(!Fact::Machine.available(Verb::Remove, Subject::Cluster, w));
        assert!(Fact::RequestByController.available(Verb::Report, Subject::Machine, w));
        assert!(!Fact::RequestByController.available(Verb::Remove, Subject::Machine, w));
        assert_eq!(Fact::Count.info().domain, Domain::Values(COUNT_VALUES));
        assert_eq!(Fact::Approved.info().domain, Domain::Natural);
        assert_eq!(Fact::Kind.info().domain, Domain::Text);
    }

    #[test]
    fn the_facts_table_has_a_row_per_fact() {
        let table = facts_table_markdown();
        assert_eq!(table.lines().count(), FACTS.len() + 2);
        assert!(table.contains("| `role` | role | rules on `controlplane`, `worker` or `machine` | spec.role: `\"controlplane\"`, `\"worker\"` |"));
    }

    #[test]
    fn actions_are_in_order() {
        assert_eq!(ACTIONS.len(), Action::ALL.len());
        for (i, a) in Action::ALL.iter().enumerate() {
            assert_eq!(ACTIONS[i].action, *a, "{a:?} is out of order");
        }
    }

    #[test]
    fn leave_is_the_four_ways_out() {
        let leave = resolve_verb("leave").expect("leave is a group");
        assert_eq!(
            leave,
            vec![Verb::Remove, Verb::Unapprove, Verb::Reassign, Verb::Move]
        );
        assert!(resolve_verb("delete").is_none());
    }
}
