//! `ichor-rules table`: the compiled decision table, as reviewers read it.

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, Format, colour, emit};
use crate::compile::{LetMeta, Table};
use crate::diagnostics::render_human;
use crate::ruleset::load;
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
    // The `let`s the rows and plan steps use, in definition order (kept by the compiler).
    let lets = &table.lets;
    let text = match format {
        Format::Json => {
            let mut v = to_json(table);
            v["lets"] = serde_json::json!(
                lets.iter()
                    .map(|l| serde_json::json!({
                        "name": l.name,
                        "definition": l.definition,
                        "file": l.file,
                        "line": l.line,
                    }))
                    .collect::<Vec<_>>()
            );
            serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
        }
        Format::Human => lets_text(lets) + &to_text(table, colour()),
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
                "rows": rows.iter().filter_map(|r| table.rules.get(r.rule as usize)).map(|r| {
                    let mut row = serde_json::json!(r);
                    // The message's text (placeholders as written), not its quoted source.
                    row["say"] = serde_json::json!(message_text(&r.say));
                    row
                }).collect::<Vec<_>>(),
            })
        })
        .collect();
    let plans: Vec<serde_json::Value> = table.plans.iter().map(plan_json).collect();
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
            let mode = if r.audit { " [audit]" } else { "" };
            let _ = writeln!(
                out,
                "  {} {}{mode}   ({}:{})",
                r.verdict, r.name, r.file, r.line
            );
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
        out.push_str(&plan_text(plan, &bold(&plan.header())));
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

/// The definitions, as a section before the table.
fn lets_text(lets: &[LetMeta]) -> String {
    if lets.is_empty() {
        return String::new();
    }
    let mut out = String::from("definitions the rows use\n");
    let width = lets.iter().map(|l| l.name.len()).max().unwrap_or(0);
    for l in lets {
        let _ = writeln!(
            out,
            "  let {:width$} = {}   ({}:{})",
            l.name, l.definition, l.file, l.line
        );
    }
    out.push('\n');
    out
}

/// The text of a message as written (`"a {x}" "b"`): its strings joined, quotes dropped,
/// escapes resolved; placeholders and `{{`/`}}` stay as written.
pub fn message_text(say: &str) -> String {
    let mut out = String::new();
    let mut chars = say.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue; // between adjacent strings
        }
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(other) => out.push(other),
                    None => {}
                },
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    out.push_str("{{");
                }
                '{' => {
                    // A placeholder, copied as written (it may hold strings of its own).
                    out.push('{');
                    let (mut depth, mut in_str) = (1usize, false);
                    while let Some(c) = chars.next() {
                        out.push(c);
                        match c {
                            '\\' if in_str => {
                                if let Some(n) = chars.next() {
                                    out.push(n);
                                }
                            }
                            '"' => in_str = !in_str,
                            '{' if !in_str => depth += 1,
                            '}' if !in_str => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                }
                c => out.push(c),
            }
        }
    }
    out
}

/// One plan as `table` prints it (and `explain`, for the plan a reconcile runs): `head`,
/// then each step numbered, with its `within`, its guard and what the action does.
pub fn plan_text(plan: &crate::compile::Plan, head: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{head}");
    for (i, s) in plan.steps.iter().enumerate() {
        let doc = s.action.doc();
        let guard = s
            .guard_text
            .as_ref()
            .map(|g| format!(" {g}"))
            .unwrap_or_default();
        let within = s.within_text().map(|w| format!(" {w}")).unwrap_or_default();
        let _ = writeln!(out, "  {}. {}{within}{guard}   -- {doc}", i + 1, s.text);
        if let Some(say) = &s.say {
            let _ = writeln!(out, "       say {say}");
        }
    }
    out
}

/// One plan as JSON (`table --format json`'s `plans`, and `explain --format json`'s
/// `plan`).
pub fn plan_json(p: &crate::compile::Plan) -> serde_json::Value {
    serde_json::json!({
        "verb": p.verb.name(),
        "subject": p.subject.name(),
        "kind": p.kind,
        "steps": p.steps.iter().map(|s| serde_json::json!({
            "action": s.text,
            "within": s.within_text(),
            "doc": s.action.doc(),
            "guard": s.guard_text,
            "say": s.say.as_deref().map(message_text),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::message_text;

    #[test]
    fn message_text_drops_quotes_and_joins() {
        assert_eq!(message_text(r#""a {x + 1}" "b""#), "a {x + 1}b");
        assert_eq!(
            message_text(r#""say \"hi\" {{not}}""#),
            r#"say "hi" {{not}}"#
        );
        assert_eq!(
            message_text(r#""kind {kind == "reset"} done""#),
            r#"kind {kind == "reset"} done"#
        );
    }
}
