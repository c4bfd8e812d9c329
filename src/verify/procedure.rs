//! What the procedures explored beside the cluster model share ([`super::backup`],
//! [`super::bootstrap`], [`super::apply`]): the controller stopping, a violation with the
//! steps to it, a report, and the parts of a [`crate::runtime::exec::World`] such a model
//! does not use.

/// Why a run of a procedure's world stopped: the controller crashed (or lost an answer).
#[derive(Debug)]
pub struct Crashed;

impl std::fmt::Display for Crashed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the controller stopped")
    }
}

/// A violation: the invariant, and the steps that led there, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub trace: Vec<String>,
    pub why: String,
}

/// What an exploration of a procedure found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub states: usize,
    pub reconciles: usize,
    /// The first violation of each invariant found (the shortest: breadth-first).
    pub violations: Vec<Violation>,
}

impl Report {
    /// Records a violation of `invariant`, unless one is recorded already.
    pub fn violate(&mut self, invariant: &'static str, trace: &[String], why: String) {
        if !self.violations.iter().any(|v| v.invariant == invariant) {
            self.violations.push(Violation {
                invariant,
                trace: trace.to_vec(),
                why,
            });
        }
    }
}

/// The parts of a `World` (in an `impl World for … { type Error = Crashed; … }`) that a
/// procedure's model does not use: no lock, no drain, no TalosMachine status or finalizer,
/// no Events or notes; credentials always there. `$what` names the model in the answers.
macro_rules! unused_world_parts {
    ($what:literal) => {
        async fn credentials(&mut self, _cluster: &str) -> Result<(), String> {
            Ok(())
        }

        async fn lock(
            &mut self,
            _cluster: &str,
            _op: $crate::runtime::exec::LockOp,
        ) -> Result<Result<(), String>, $crate::verify::procedure::Crashed> {
            Ok(Err(concat!("the ", $what, " model takes no lock").into()))
        }

        async fn drain(
            &mut self,
            _node: &str,
        ) -> Result<
            Result<$crate::runtime::exec::Drained, String>,
            $crate::verify::procedure::Crashed,
        > {
            Ok(Err(concat!("the ", $what, " model drains nothing").into()))
        }

        async fn write_status(
            &mut self,
            _before: &$crate::runtime::objects::TalosMachine,
            _after: &$crate::runtime::objects::TalosMachine,
        ) -> Result<Option<String>, $crate::verify::procedure::Crashed> {
            Ok(None)
        }

        async fn release_finalizer(
            &mut self,
            _m: &$crate::runtime::objects::TalosMachine,
        ) -> Result<(), $crate::verify::procedure::Crashed> {
            Ok(())
        }

        async fn event(
            &mut self,
            _on: &$crate::runtime::objects::TalosMachine,
            _warning: bool,
            _reason: &str,
            _note: String,
        ) {
        }

        fn note(
            &mut self,
            _on: &$crate::runtime::objects::TalosMachine,
            _note: $crate::runtime::exec::Note<'_>,
        ) {
        }
    };
}

pub(crate) use unused_world_parts;

/// The shipped rules (`rules/`) with `edit` made to the text of every file, compiled: a
/// weakened copy for the tests that show `verify` refutes it.
#[cfg(test)]
pub(crate) fn shipped_edited(edit: impl Fn(&str) -> String) -> crate::compile::Table {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
    let files = crate::ruleset::read_sources(std::slice::from_ref(&root))
        .expect("the shipped rules")
        .into_iter()
        .map(|f| {
            let text = edit(&f.text);
            crate::diagnostics::SourceFile::new(f.path.clone(), text)
        })
        .collect();
    crate::ruleset::build(files)
        .table
        .expect("the edited rules compile")
}
