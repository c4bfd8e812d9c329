//! The decisions the decision benches and the instruction-count guard measure: facts at
//! hand (fixed values, as if already read) and the tables they decide with. Shared by
//! `benches/decide.rs` and `benches/counts/main.rs` (`#[path]`), so both measure the same.

use ichor_rules::compile::{Options, Table, compile_with};
use ichor_rules::diagnostics::SourceFile;
use ichor_rules::interp::{Facts, Lookup, Value};
use ichor_rules::ruleset::read_sources;
use ichor_rules::vocab::{Fact, Site, Subject, Verb};
use std::path::PathBuf;

pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The event every removal case decides.
pub const REMOVE_CP: (Verb, Subject, Site) = (Verb::Remove, Subject::ControlPlane, Site::Webhook);
/// The event the approval cases decide.
pub const APPROVE_CP: (Verb, Subject, Site) = (Verb::Approve, Subject::ControlPlane, Site::Webhook);

/// Facts at hand: fixed values, as if already read.
#[derive(Clone, Copy)]
pub struct Fixed {
    pub approved: i64,
    pub count: i64,
}

/// 5 approved, count 3: a removal is allowed (4 left), an approval refused (above 3).
pub const FIVE_OF_THREE: Fixed = Fixed {
    approved: 5,
    count: 3,
};
/// 3 approved, count 3: a removal is refused (2 left), an approval allowed.
pub const THREE_OF_THREE: Fixed = Fixed {
    approved: 3,
    count: 3,
};

impl<'a> Facts<'a> for Fixed {
    fn fact(&mut self, fact: Fact) -> Lookup<'a> {
        Lookup::Value(match fact {
            Fact::Approved => Value::Int(self.approved),
            Fact::Workers => Value::Int(2),
            Fact::WorkersOthersUp => Value::Int(1),
            Fact::Count => Value::Int(self.count),
            Fact::Rank | Fact::HealthyAfter | Fact::MembersAfter => Value::Int(self.approved),
            Fact::Schedulable | Fact::ClusterExists => Value::Bool(true),
            Fact::Transitioning => Value::Bool(self.approved % 2 == 0),
            Fact::Cluster => Value::Str("prod"),
            Fact::Machine => Value::Str("cp-3"),
            Fact::Role => Value::Str("controlplane"),
            Fact::Operation
            | Fact::Kind
            | Fact::Target
            | Fact::Phase
            | Fact::UnfinishedName
            | Fact::UnfinishedKind
            | Fact::UnfinishedPhase
            | Fact::Backup
            | Fact::SnapshotBackup
            | Fact::Patch
            | Fact::PatchError => Value::Str(""),
            Fact::PatchSelects
            | Fact::PatchBreaks
            | Fact::Backups
            | Fact::SnapshotAge
            | Fact::EtcdMembers
            | Fact::RollInFlight => Value::Int(0),
            Fact::MaxUnavailable => Value::Int(1),
            Fact::ClusterDeleting
            | Fact::Deleting
            | Fact::AllowDelete
            | Fact::MemberDead
            | Fact::NodeUnreachable
            | Fact::TargetControlPlane
            | Fact::TargetUncounted
            | Fact::TargetExists
            | Fact::Failed
            | Fact::Paused
            | Fact::UnfinishedExists
            | Fact::UnfinishedParked
            | Fact::RequestByController
            | Fact::BackupExists
            | Fact::BackupInCluster
            | Fact::SnapshotTaken
            | Fact::Bootstrapped
            | Fact::RollControlPlaneInFlight => Value::Bool(false),
        })
    }
}

/// The shipped rules, read once.
pub fn shipped() -> Vec<SourceFile> {
    read_sources(&[PathBuf::from(ROOT).join("rules")]).expect("rules/ is readable")
}

/// The two-rule file: the approval cap, and the removal's count and quorum.
pub fn two_rules() -> Vec<SourceFile> {
    read_sources(&[PathBuf::from(ROOT).join("benches/two-rules/two.rules")])
        .expect("benches/two-rules/two.rules is readable")
}

/// Checks (no lints) and compiles `files`; `flat: false` puts every row on the stack
/// machine.
pub fn table(files: &[SourceFile], flat: bool) -> Table {
    let checked = ichor_rules::check::check_with(files, false);
    assert!(!checked.has_errors(), "the rules check without errors");
    compile_with(&checked.program, files, Options { flat }).expect("compiles")
}
