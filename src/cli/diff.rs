//! `ichor-rules diff OLD NEW`: what a rule edit changes, decision by decision, over the
//! states the model reaches with either rule set.

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, Format, emit};
use crate::diagnostics::render_human;
use crate::ruleset::load;
use crate::verify::diff::diff;
use clap::Args;
use std::fmt::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The rules before the edit (a file or folder).
    pub old: PathBuf,
    /// The rules after the edit.
    pub new: PathBuf,
    /// Control-plane machines in the model.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=12))]
    pub max_control_planes: u8,
    /// Approved workers in the model.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=6))]
    pub max_workers: u8,
    /// Node failures in one run of the model.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=4))]
    pub max_failures: u8,
    /// TalosOperations created in one run of the model.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=4))]
    pub max_operations: u8,
    /// Output format: `human` (text) or `json`.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// Write each group's witness (objects.yaml + review.json, for `eval`) to DIR/group-N/.
    #[arg(long, value_name = "DIR")]
    pub emit_fixtures: Option<PathBuf>,
}

pub fn run(args: &DiffArgs) -> u8 {
    let mut tables = Vec::new();
    for p in [&args.old, &args.new] {
        let set = match load(std::slice::from_ref(p)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_BAD_INPUT;
            }
        };
        match set.table {
            Some(t) => {
                if let Some(why) = crate::verify::model::unsupported(&t) {
                    eprintln!("error: {}: {why}", p.display());
                    return EXIT_BAD_INPUT;
                }
                tables.push(t)
            }
            None => {
                eprint!("{}", render_human(&set.diagnostics, &set.files, false));
                eprintln!("error: {}: the rules have errors", p.display());
                return EXIT_BAD_INPUT;
            }
        }
    }
    let bounds = crate::verify::Bounds {
        max_control_planes: args.max_control_planes,
        max_workers: args.max_workers,
        max_failures: args.max_failures,
        max_operations: args.max_operations,
        in_flight: 0,
        max_requests: None,
        depth: 64,
        rolls: false,
        roll_width: 1,
        roll_kind: crate::verify::RollKind::Reboot,
        all_kinds: false,
        backups: false,
        lifecycle: false,
        clock: false,
    };
    let report = match diff(&tables[0], &tables[1], bounds) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    if let Some(dir) = &args.emit_fixtures {
        for (k, g) in report.groups.iter().enumerate() {
            let Some((objects, review)) = &g.fixture else {
                continue;
            };
            let d = dir.join(format!("group-{}", k + 1));
            let written = std::fs::create_dir_all(&d)
                .and_then(|()| std::fs::write(d.join("objects.yaml"), objects))
                .and_then(|()| std::fs::write(d.join("review.json"), review));
            if let Err(e) = written {
                eprintln!("error: {}: {e}", d.display());
                return EXIT_BAD_INPUT;
            }
        }
    }
    let text = match args.format {
        Format::Json => {
            serde_json::to_string_pretty(&serde_json::json!({
                "result": if report.groups.is_empty() { "equivalent" } else { "different" },
                "bounds": report.bounds,
                "states": report.states,
                "groups": report.groups,
            }))
            .unwrap_or_default()
                + "\n"
        }
        Format::Human => {
            let mut out = String::new();
            let _ = writeln!(
                out,
                "diff {} {}: {} states compared",
                args.old.display(),
                args.new.display(),
                report.states
            );
            if report.groups.is_empty() {
                let _ = writeln!(out, "equivalent: every decision is the same in every state");
            }
            for (k, g) in report.groups.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "\n{}. {}: {} -> {} ({}), in {} state(s)\n   for example: {}\n   in: {}",
                    k + 1,
                    g.decision,
                    g.old,
                    g.new,
                    g.direction,
                    g.states,
                    g.witness_request.as_deref().unwrap_or(""),
                    g.witness_state
                );
            }
            out
        }
    };
    if let Err(code) = emit(&text) {
        return code;
    }
    if report.groups.is_empty() {
        EXIT_OK
    } else {
        EXIT_FINDINGS
    }
}
