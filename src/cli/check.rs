//! `ichor-rules check`: diagnostics for people or for CI.

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, Format, colour};
use crate::diagnostics::{render_human, to_json};
use crate::ruleset::{build, read_sources};
use std::path::PathBuf;

pub fn run(paths: &[PathBuf], format: Format, deny_warnings: bool) -> u8 {
    let files = match read_sources(paths) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let set = build(files);
    let (errors, warnings) = (set.errors(), set.warnings());
    match format {
        Format::Json => {
            let out = serde_json::json!({
                "files": set.files.iter().map(|f| f.display_path()).collect::<Vec<_>>(),
                "errors": errors,
                "warnings": warnings,
                "diagnostics": to_json(&set.diagnostics, &set.files),
            });
            println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        }
        Format::Human => {
            print!("{}", render_human(&set.diagnostics, &set.files, colour()));
            let rows = set.table.as_ref().map_or(0, |t| t.row_count());
            println!(
                "checked {} file{}: {errors} error{}, {warnings} warning{}{}",
                set.files.len(),
                plural(set.files.len()),
                plural(errors),
                plural(warnings),
                if errors == 0 {
                    format!(", {rows} table row{}", plural(rows))
                } else {
                    String::new()
                }
            );
        }
    }
    if errors > 0 || (deny_warnings && warnings > 0) {
        EXIT_FINDINGS
    } else {
        EXIT_OK
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
