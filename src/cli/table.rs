//! `ichor-rules table`: the compiled decision table, as reviewers read it.

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, Format, colour, emit};
use crate::compile::Table;
use crate::diagnostics::render_human;
use crate::ruleset::load;
use crate::vocab::ACTIONS;
use std::fmt::Write;
use std::path::PathBuf;

pub fn run(paths: &[PathBuf], format: Format) -> u8 {
    let set = match load(paths) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let Some(table) = &set.table else {
        eprint!("{}", render_human(&set.diagnostics, &set.files, false));
        eprintln!("error: the rules have errors; no table was built");
        return EXIT_FINDINGS;
    };
    let text = match format {
        Format::Json => serde_json::to_string_pretty(&to_json(table)).unwrap_or_default() + "\n",
        Format::Human => to_text(table, colour()),
    };
    match emit(&text) {
        Ok(()) => EXIT_OK,
        Err(code) => code,
    }
}

/// The table as JSON: groups of rows, plans, and the events `allow` covers.
pub fn to_json(table: &Table) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = table
        .groups()
        .into_iter()
        .map(|((verb, subject, site), rows)| {
            serde_json::json!({
                "verb": verb.name(),
                "subject": subject.name(),
                "site": site.name(),
                "rows": rows.iter().filter_map(|r| table.rules.get(r.rule as usize)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let plans: Vec<serde_json::Value> = table
        .plans
        .iter()
        .map(|p| {
            serde_json::json!({
                "verb": p.verb.name(),
                "subject": p.subject.name(),
                "steps": p.steps.iter().map(|s| serde_json::json!({
                    "action": s.text,
                    "doc": ACTIONS.get(s.action).map(|a| a.doc),
                    "guard": s.guard_text,
                    "say": s.say,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let allowed: Vec<String> = table
        .allowed
        .iter()
        .map(|(v, s, site)| format!("{} {} at {}", v.name(), s.name(), site.name()))
        .collect();
    serde_json::json!({
        "groups": groups,
        "plans": plans,
        "allowed": allowed,
        "invariants": table.invariants,
    })
}

/// The table as text, one group after another, rows in evaluation order.
pub fn to_text(table: &Table, colour: bool) -> String {
    let bold = |s: &str| {
        if colour {
            format!("\x1b[1m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    };
    let mut out = String::new();
    for ((verb, subject, site), rows) in table.groups() {
        let _ = writeln!(
            out,
            "{}",
            bold(&format!(
                "{} {} at the {}",
                verb.name(),
                subject.name(),
                site.name()
            ))
        );
        for row in rows {
            let Some(r) = table.rules.get(row.rule as usize) else {
                continue;
            };
            let _ = writeln!(out, "  {} {}   ({}:{})", r.verdict, r.name, r.file, r.line);
            if let Some(w) = &r.when_text {
                let _ = writeln!(out, "      when   {w}");
            }
            if let Some(u) = &r.unless_text {
                let _ = writeln!(out, "      unless {u}");
            }
            if let Some(reason) = &r.reason {
                let _ = writeln!(out, "      reason {reason}");
            }
            let _ = writeln!(out, "      say    {}", r.say);
        }
        out.push('\n');
    }
    if !table.allowed.is_empty() {
        let _ = writeln!(out, "{}", bold("allowed without rules"));
        for (v, s, site) in &table.allowed {
            let _ = writeln!(out, "  {} {} at the {}", v.name(), s.name(), site.name());
        }
        out.push('\n');
    }
    for plan in &table.plans {
        let _ = writeln!(
            out,
            "{}",
            bold(&format!(
                "plan {} {}",
                plan.verb.name(),
                plan.subject.name()
            ))
        );
        for (i, s) in plan.steps.iter().enumerate() {
            let doc = ACTIONS.get(s.action).map(|a| a.doc).unwrap_or("");
            let guard = s
                .guard_text
                .as_ref()
                .map(|g| format!(" {g}"))
                .unwrap_or_default();
            let _ = writeln!(out, "  {}. {}{guard}   -- {doc}", i + 1, s.text);
            if let Some(say) = &s.say {
                let _ = writeln!(out, "       say {say}");
            }
        }
        out.push('\n');
    }
    if !table.invariants.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            bold("invariants (proved by `ichor-rules verify`)")
        );
        for i in &table.invariants {
            let seq = if i.sequential { " (sequential)" } else { "" };
            let _ = writeln!(out, "  invariant {}{seq}   ({}:{})", i.name, i.file, i.line);
            if let Some(w) = &i.when_text {
                let _ = writeln!(out, "      when   {w}");
            }
            if let Some(u) = &i.unless_text {
                let _ = writeln!(out, "      unless {u}");
            }
            let _ = writeln!(out, "      ensure {}", i.ensure_text);
            if let Some(say) = &i.say {
                let _ = writeln!(out, "      say    {say}");
            }
        }
        out.push('\n');
    }
    out
}
