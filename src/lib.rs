//! ichor-rules: the safety rules of a Talos Linux cluster operator, written in a small typed
//! language, compiled into a decision table and evaluated by one interpreter at the admission
//! webhook and in the controller.
//!
//! Data flows `syntax` (text -> AST) -> `check` (names, types, lints) -> `compile` (decision
//! table) -> `interp` (decisions) <- facts <- `runtime` (objects, snapshots, requests).

pub mod check;
pub mod cli;
pub mod compile;
pub mod diagnostics;
pub mod interp;
pub mod ruleset;
pub mod runtime;
pub mod syntax;
pub mod verify;
pub mod vocab;
