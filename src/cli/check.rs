//! `ichor-rules check`: diagnostics for people or for CI.

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, Format, colour, emit};
use crate::diagnostics::{render_human, to_json};
use crate::ruleset::{build, read_sources};
use std::path::PathBuf;

pub fn run(paths: &[PathBuf], format: Format, deny_warnings: bool) -> u8 {
    let files = match read_sources(paths) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            if format == Format::Json {
                // CI reading stdout still gets JSON that says what went wrong.
                let out = serde_json::json!({
                    "files": [],
                    "errors": 1,
                    "warnings": 0,
                    "diagnostics": [{
                        "code": crate::diagnostics::Code::InputUnreadable.as_str(),
                        "severity": "error",
                        "file": e.path().display().to_string(),
                        "line": 0,
                        "column": 0,
                        "message": e.to_string(),
                    }],
                });
                let _ = emit(&(serde_json::to_string_pretty(&out).unwrap_or_default() + "\n"));
            }
            return EXIT_BAD_INPUT;
        }
    };
    let set = build(files);
    let (errors, warnings) = (set.errors(), set.warnings());
    let text = match format {
        Format::Json => {
            let mut out = serde_json::json!({
                "files": set.files.iter().map(|f| f.display_path()).collect::<Vec<_>>(),
                "errors": errors,
                "warnings": warnings,
                "diagnostics": to_json(&set.diagnostics, &set.files),
            });
            // The rules in audit mode (recorded, not enforced), when there are any.
            let audit: Vec<&str> = set
                .table
                .iter()
                .flat_map(|t| t.audit_rules())
                .map(|r| r.name.as_str())
                .collect();
            if !audit.is_empty() {
                out["audit"] = serde_json::json!(audit);
            }
            serde_json::to_string_pretty(&out).unwrap_or_default() + "\n"
        }
        Format::Human => {
            let rows = set.table.as_ref().map_or(0, |t| t.row_count());
            let audit: Vec<&str> = set
                .table
                .iter()
                .flat_map(|t| t.audit_rules())
                .map(|r| r.name.as_str())
                .collect();
            let audit = if audit.is_empty() {
                String::new()
            } else {
                format!(
                    "; in audit mode (recorded, not enforced): {}",
                    audit.join(", ")
                )
            };
            format!(
                "{}checked {} file{}: {errors} error{}, {warnings} warning{}{}{audit}\n",
                render_human(&set.diagnostics, &set.files, colour()),
                set.files.len(),
                plural(set.files.len()),
                plural(errors),
                plural(warnings),
                if errors == 0 {
                    format!(", {rows} table row{}", plural(rows))
                } else {
                    String::new()
                }
            )
        }
    };
    if let Err(code) = emit(&text) {
        return code;
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
