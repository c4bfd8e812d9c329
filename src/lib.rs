//! ichor-rules: the safety rules of a Talos Linux cluster operator, written in a small typed
//! language, compiled into a decision table and evaluated by one interpreter at the admission
//! webhook and in the controller.
//!
//! Data flows `syntax` (text -> AST) -> `check` (names, types, lints) -> `compile` (decision
//! table) -> `interp` (decisions) <- facts <- `runtime` (objects, snapshots, requests).
//! See ARCHITECTURE.md.
//!
//! # The language as a library
//!
//! With `default-features = false` this crate is the rules language alone (no kube,
//! k8s-openapi, tokio, axum, hyper or tonic). Its entry point is three calls:
//!
//! - compile a rule set: [`load`] (files and folders) or [`build`] (sources in memory)
//!   give a [`RuleSet`] with its diagnostics and, when it checks clean, its [`Table`];
//! - decide an event from facts: [`decide`] with your [`Facts`] for one [`Event`];
//! - render the message: each [`Finding`] of the [`Decision`] carries its rule's message,
//!   placeholders filled from the same facts ([`Session::render`] renders one hit).
//!
//! The modules below are public for the command line, the tests and the benches; they are
//! not a stable interface.
//!
//! The `runtime` feature (on by default) adds the operator: `runtime` (webhook,
//! controller, live reads), `cli` and `verify`.

#![forbid(unsafe_code)]

pub mod check;
pub mod compile;
pub mod diagnostics;
pub mod interp;
pub mod ruleset;
pub mod span;
pub mod syntax;
pub mod value;
pub mod vocab;

#[cfg(feature = "runtime")]
pub mod cli;
#[cfg(feature = "runtime")]
pub mod runtime;
#[cfg(feature = "runtime")]
pub mod verify;

pub use check::Event;
pub use compile::Table;
pub use diagnostics::{Diagnostic, SourceFile};
pub use interp::{Decision, Facts, Finding, Interrupt, Lookup, Session};
pub use ruleset::{LoadError, RuleSet, build, load};

/// Decides one event of a compiled table from `facts`: every matching row's finding, its
/// message rendered. `Err(Interrupt::Need(fact))` when a row needs a fact that `facts`
/// answered [`Lookup::Later`] (an expensive one): fetch it and decide again with it
/// answered, or leave the refusal in place (fail closed). To keep what was evaluated
/// across such a fetch, use a [`Session`] ([`Session::supply`], [`interp::decide_into`]).
pub fn decide<'a, F: Facts<'a>>(
    table: &'a Table,
    event: Event,
    facts: F,
) -> Result<Decision, Interrupt> {
    let mut session = Session::new(table, facts);
    let mut decision = Decision::default();
    interp::decide_into(&mut session, event, &mut decision)?;
    Ok(decision)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::Value;
    use crate::vocab::{Fact, Site, Subject, Verb, Verdict};

    /// The entry point alone: rules text -> table -> a decision with its message rendered.
    #[test]
    fn compile_decide_render() {
        let text = "rule last\n  refuse remove controlplane when approved - 1 == 0\n  say \"{machine} is the last control plane\"\n";
        let set = build(vec![SourceFile::new("t.rules", text)]);
        let Some(table) = set.table.as_ref() else {
            panic!("{:?}", set.diagnostics);
        };
        struct One(i64);
        impl<'a> Facts<'a> for One {
            fn fact(&mut self, fact: Fact) -> Lookup<'a> {
                match fact {
                    Fact::Approved => Lookup::Value(Value::Int(self.0)),
                    Fact::Machine => Lookup::Value(Value::Str("cp-1")),
                    _ => Lookup::Later,
                }
            }
        }
        let event = (Verb::Remove, Subject::ControlPlane, Site::Webhook);
        let refused = decide(table, event, One(1)).unwrap_or_default();
        assert_eq!(refused.verdict(), Some(Verdict::Refuse));
        assert_eq!(
            refused.deciding()[0].message,
            "cp-1 is the last control plane"
        );
        let allowed = decide(table, event, One(3)).unwrap_or_default();
        assert_eq!(allowed.verdict(), None);
    }
}
