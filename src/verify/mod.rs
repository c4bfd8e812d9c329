//! `ichor-rules verify`: every reachable state of a small cluster, under every interleaving
//! of requests, controller steps, crashes and failures within the bounds, checked against
//! the rule set's `invariant`s, with the shortest trace to each violation.
//!
//! - [`model`]: the state and its transitions, deciding with the product's own code;
//! - [`explore`]: canonical states, breadth-first search, liveness on the explored graph;
//! - [`invariant`]: the model's facts and the invariants' evaluation;
//! - [`trace`]: counterexamples in words, and the fixtures `eval` replays.

pub mod apply;
pub mod backup;
pub mod bootstrap;
pub mod conform;
pub mod diff;
pub mod explore;
pub mod invariant;
pub mod memory;
pub mod model;
pub mod procedure;
pub mod trace;
pub mod world;

use crate::compile::Table;
use explore::{Exploration, explore_within};
use invariant::InvariantCheck;
use memory::Budget;
use model::Model;
pub use model::{Bounds, BoundsError, RollKind};

/// What a run found.
pub struct Report {
    pub bounds: Bounds,
    pub exploration: Exploration,
    pub checks: Vec<InvariantCheck>,
    pub traces: Vec<trace::Trace>,
    /// Rules of the table that no explored decision fired.
    pub rules_never_fired: Vec<String>,
    /// Plan steps (of `plan remove controlplane`) that never ran.
    pub steps_never_run: Vec<String>,
}

impl Report {
    /// Every invariant held in every state within the bounds, all of which were explored.
    pub fn verified(&self) -> bool {
        self.exploration.violations.is_empty() && self.exploration.incomplete.is_none()
    }
}

/// Explores the model with `table` within `bounds` and checks its invariants; bounds a
/// model cannot hold are an error.
pub fn verify(table: &Table, bounds: Bounds) -> Result<Report, BoundsError> {
    verify_within(table, bounds, &Budget::unlimited(), explore::threads())
}

/// [`verify`] within a memory budget (shared by the runs given the same one): a run that
/// would pass it stops first, incomplete, saying how far it got.
pub fn verify_within(
    table: &Table,
    bounds: Bounds,
    budget: &Budget,
    threads: usize,
) -> Result<Report, BoundsError> {
    let model = Model::new(table, bounds)?;
    let checks: Vec<InvariantCheck> = table.invariants.iter().map(InvariantCheck::new).collect();
    let ex = explore_within(&model, &checks, budget, threads);
    let traces = ex
        .violations
        .iter()
        .map(|v| trace::build(&model, &ex, &checks, v))
        .collect();
    let mut rules_never_fired: Vec<String> = table
        .rules
        .iter()
        .map(|r| r.name.clone())
        .filter(|n| !ex.fired.rules.contains(n))
        .collect();
    rules_never_fired.dedup();
    let steps_never_run = model
        .objects
        .plan
        .unwrap_or(&[])
        .iter()
        .enumerate()
        .filter(|(k, _)| !ex.fired.steps.contains(k))
        .map(|(_, s)| s.text.clone())
        .collect();
    Ok(Report {
        bounds,
        exploration: ex,
        checks,
        traces,
        rules_never_fired,
        steps_never_run,
    })
}
