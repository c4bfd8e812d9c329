//! The human-readable explanation of a decision: every row considered, each condition's
//! value, the facts asked for, and the verdict.

use super::{Decision, TraceRow, Value};
use crate::compile::Table;
use crate::vocab::Fact;
use std::fmt::Write;

/// One event's part of an explanation.
pub struct EventTrace {
    pub title: String,
    pub facts: Vec<(Fact, String)>,
    pub rows: Vec<TraceRow>,
}

impl EventTrace {
    pub fn new(title: String, asked: &[(Fact, Value<'_>)], rows: Vec<TraceRow>) -> EventTrace {
        EventTrace {
            title,
            facts: asked
                .iter()
                .map(|(f, v)| {
                    let shown = match v {
                        Value::Str(s) => format!("{s:?}"),
                        v => v.to_string(),
                    };
                    (*f, shown)
                })
                .collect(),
            rows,
        }
    }
}

fn mark(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "true",
        Some(false) => "false",
        None => "-",
    }
}

/// Renders the explanation. `verdict_line` is the site's own wording of the outcome.
pub fn render(
    table: &Table,
    header: &str,
    events: &[EventTrace],
    decision: &Decision,
    verdict_line: &str,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{header}");
    if events.is_empty() {
        let _ = writeln!(
            out,
            "\nno verb: this change does not touch what the rules guard, so nothing was read or evaluated"
        );
    }
    for ev in events {
        let _ = writeln!(out, "\n{}", ev.title);
        if ev.rows.is_empty() {
            let _ = writeln!(out, "  no rules for this event");
            continue;
        }
        for row in &ev.rows {
            let meta = table.rules.iter().find(|r| r.name == row.rule);
            let status = if row.matched { "MATCH" } else { "-" };
            let _ = writeln!(
                out,
                "  [{status:^5}] {} {} ({}:{})",
                row.verdict,
                row.rule,
                meta.map(|m| m.file.as_str()).unwrap_or(""),
                meta.map(|m| m.line).unwrap_or(0)
            );
            if let Some(m) = meta {
                if let Some(w) = &m.when_text {
                    let _ = writeln!(out, "          when   {w}  = {}", mark(row.when));
                }
                if let Some(u) = &m.unless_text {
                    let shown = if row.unless.is_none() && row.when == Some(false) {
                        "- (not evaluated: `when` is false)".to_string()
                    } else {
                        mark(row.unless).to_string()
                    };
                    let _ = writeln!(out, "          unless {u}  = {shown}");
                }
            }
            if let Some(e) = &row.error {
                let _ = writeln!(out, "          error  {e} (fails closed)");
            }
        }
        if !ev.facts.is_empty() {
            let _ = writeln!(out, "  facts read:");
            for (f, v) in &ev.facts {
                let _ = writeln!(out, "    {:<20} = {v}", f.name());
            }
        }
    }
    let _ = writeln!(out, "\n{verdict_line}");
    for f in decision.deciding() {
        let _ = writeln!(out, "  - {}: {}", f.rule, f.message);
    }
    if !decision.warnings.is_empty() {
        let _ = writeln!(out, "warnings:");
        for f in &decision.warnings {
            let _ = writeln!(out, "  - {}: {}", f.rule, f.message);
        }
    }
    out
}
