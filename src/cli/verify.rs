//! `ichor-rules verify`: prove the rule set's invariants over every small cluster within
//! the bounds, or print the shortest counterexample.

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, Format, emit};
use crate::diagnostics::render_human;
use crate::ruleset::load;
use crate::verify::{Bounds, Report, verify};
use clap::Args;
use std::fmt::Write;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Rule files or folders (default `rules/`); the invariants are among them.
    pub paths: Vec<PathBuf>,
    /// Control-plane machines in the model (approved or waiting to be).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u8).range(1..=12))]
    pub max_control_planes: u8,
    /// Approved workers in the model.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=6))]
    pub max_workers: u8,
    /// Node failures (and PodDisruptionBudgets blocking a drain) in one run of the model.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=4))]
    pub max_failures: u8,
    /// TalosOperations created in one run of the model.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=4))]
    pub max_operations: u8,
    /// Requests admitted and not yet committed at one time (K: other commits may land
    /// between a request's decision and its own commit).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub in_flight: u8,
    /// Steps from a starting state after which exploration stops (reported when reached).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub depth: u32,
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// Write every admission step of each counterexample as DIR/<invariant>/step-N/
    /// (objects.yaml + review.json) for `ichor-rules eval`.
    #[arg(long, value_name = "DIR")]
    pub emit_fixtures: Option<PathBuf>,
}

pub fn run(args: &VerifyArgs, paths: &[PathBuf]) -> u8 {
    let set = match load(paths) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let Some(table) = &set.table else {
        eprint!("{}", render_human(&set.diagnostics, &set.files, false));
        eprintln!(
            "error: the rules have {} error(s); fix them (`ichor-rules check`) before verifying",
            set.errors()
        );
        return EXIT_BAD_INPUT;
    };
    if table.invariants.is_empty() {
        eprintln!(
            "error: the rules have no `invariant`, so there is nothing to verify; add the shipped \
             rules/invariants.rules (or your own `invariant` statements) to the paths"
        );
        return EXIT_BAD_INPUT;
    }
    let bounds = Bounds {
        max_control_planes: args.max_control_planes,
        max_workers: args.max_workers,
        max_failures: args.max_failures,
        max_operations: args.max_operations,
        in_flight: args.in_flight,
        depth: args.depth,
    };
    let report = verify(table, bounds);
    if let Some(dir) = &args.emit_fixtures
        && let Err(e) = write_fixtures(dir, &report)
    {
        eprintln!("error: {e}");
        return EXIT_BAD_INPUT;
    }
    let text = match args.format {
        Format::Json => {
            serde_json::to_string_pretty(&to_json(&report, paths)).unwrap_or_default() + "\n"
        }
        Format::Human => to_text(&report, paths),
    };
    if let Err(code) = emit(&text) {
        return code;
    }
    if report.traces.iter().any(|t| t.replay_error.is_some()) {
        return EXIT_BAD_INPUT;
    }
    if report.verified() {
        EXIT_OK
    } else {
        EXIT_FINDINGS
    }
}

fn slug(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn write_fixtures(dir: &Path, report: &Report) -> Result<(), String> {
    let many = report.traces.len() > 1;
    for t in &report.traces {
        let base = if many {
            dir.join(slug(&t.invariant))
        } else {
            dir.to_path_buf()
        };
        for s in &t.steps {
            let Some((objects, review)) = &s.fixture else {
                continue;
            };
            let d = base.join(format!("step-{}", s.n));
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            for (file, text) in [("objects.yaml", objects), ("review.json", review)] {
                let p = d.join(file);
                std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
            }
        }
    }
    Ok(())
}

fn bounds_text(b: &Bounds) -> String {
    format!(
        "{} control-plane machines, {} workers, count 1, 3 or 5 (and every change of it), {} failure(s), \
         {} operation(s), {} request(s) in flight, depth {}",
        b.max_control_planes, b.max_workers, b.max_failures, b.max_operations, b.in_flight, b.depth
    )
}

fn cut_text(report: &Report) -> Option<String> {
    let ex = &report.exploration;
    (ex.cut_at_depth > 0).then(|| {
        format!(
            "depth {} reached in {} states: exploration was cut there; raise --depth to go further",
            report.bounds.depth, ex.cut_at_depth
        )
    })
}

fn status(report: &Report, k: usize) -> &'static str {
    if report
        .exploration
        .violations
        .iter()
        .any(|v| v.invariant == k)
    {
        "violated"
    } else if !report.exploration.at_risk[k] {
        "vacuous"
    } else {
        "holds"
    }
}

fn interleavings(sequential: bool) -> &'static str {
    if sequential {
        "serialized requests"
    } else {
        "every interleaving"
    }
}

fn to_text(report: &Report, paths: &[PathBuf]) -> String {
    let ex = &report.exploration;
    let mut out = String::new();
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let _ = writeln!(out, "verify {}", shown.join(" "));
    let _ = writeln!(out, "bounds: {}", bounds_text(&report.bounds));
    let rate = if ex.seconds > 0.0 {
        ex.keys.len() as f64 / ex.seconds
    } else {
        0.0
    };
    let _ = writeln!(
        out,
        "explored {} distinct states and {} transitions in {:.1} s ({:.0} states/s); largest depth {}",
        ex.keys.len(),
        ex.transitions,
        ex.seconds,
        rate,
        ex.max_depth
    );
    if let Some(c) = cut_text(report) {
        let _ = writeln!(out, "{c}");
    }
    let _ = writeln!(out, "\ninvariants:");
    for (k, c) in report.checks.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {:<9} {} (checked under {}; {}:{})",
            status(report, k),
            c.meta.name,
            interleavings(c.meta.sequential),
            c.meta.file,
            c.meta.line
        );
    }
    let vacuous: Vec<&str> = report
        .checks
        .iter()
        .enumerate()
        .filter(|(k, _)| status(report, *k) == "vacuous")
        .map(|(_, c)| c.meta.name.as_str())
        .collect();
    let _ = writeln!(out, "\ncoverage:");
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let _ = writeln!(
        out,
        "  rules that never fired: {}",
        list(&report.rules_never_fired)
    );
    let _ = writeln!(
        out,
        "  plan steps that never ran: {}",
        list(&report.steps_never_run)
    );
    let _ = writeln!(
        out,
        "  invariants never at risk (vacuous within the bounds): {}",
        if vacuous.is_empty() {
            "none".to_string()
        } else {
            vacuous.join(", ")
        }
    );
    for t in &report.traces {
        let _ = writeln!(
            out,
            "\nVIOLATED: {} (checked under {})\n  {}\ncounterexample ({} steps):\n  0. start: {}",
            t.invariant,
            interleavings(t.sequential),
            t.message,
            t.steps.len(),
            t.start
        );
        for s in &t.steps {
            let _ = writeln!(out, "  {}. {}", s.n, s.text);
            if !s.rules.is_empty() {
                let _ = writeln!(out, "       decided by: {}", s.rules.join(", "));
            }
            let _ = writeln!(out, "       state: {}", s.state);
        }
        if let Some(e) = &t.replay_error {
            let _ = writeln!(
                out,
                "  error: the counterexample could not be replayed: {e}"
            );
        }
    }
    if report.verified() {
        let _ = writeln!(
            out,
            "\nverified: every invariant holds in every explored state and transition"
        );
    } else {
        let _ = writeln!(out, "\n{} invariant(s) violated", report.traces.len());
    }
    out
}

fn to_json(report: &Report, paths: &[PathBuf]) -> serde_json::Value {
    let ex = &report.exploration;
    let invariants: Vec<serde_json::Value> = report
        .checks
        .iter()
        .enumerate()
        .map(|(k, c)| {
            serde_json::json!({
                "name": c.meta.name,
                "file": c.meta.file,
                "line": c.meta.line,
                "sequential": c.meta.sequential,
                "checked_under": interleavings(c.meta.sequential),
                "status": status(report, k),
            })
        })
        .collect();
    serde_json::json!({
        "result": if report.verified() { "verified" } else { "violated" },
        "paths": paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "bounds": report.bounds,
        "states": ex.keys.len(),
        "transitions": ex.transitions,
        "largest_depth": ex.max_depth,
        "seconds": ex.seconds,
        "cut": cut_text(report),
        "invariants": invariants,
        "violations": report.traces,
        "coverage": {
            "rules_never_fired": report.rules_never_fired,
            "plan_steps_never_run": report.steps_never_run,
            "invariants_never_at_risk": report.checks.iter().enumerate()
                .filter(|(k, _)| status(report, *k) == "vacuous")
                .map(|(_, c)| c.meta.name.clone()).collect::<Vec<_>>(),
        },
    })
}
