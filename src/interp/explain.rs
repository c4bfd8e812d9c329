//! The explanation of a decision: every row considered, each condition's value, the facts
//! read, the value of each `let` the rows use, and the verdict; as text and as JSON.
//!
//! The rows' decision comes from the same code `eval` runs ([`Session::matches`] runs the
//! group's flat program whether traced or not); the trace only adds the values shown.

use super::{Decision, EvalError, Facts, Interrupt, Session, TraceRow, Value};
use crate::compile::Table;
use crate::vocab::Event;
use crate::vocab::{FACTS, Fact, Read};
use serde_json::json;
use std::fmt::Write;

/// A value as an explanation keeps it (owned, typed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shown {
    Int(i64),
    Bool(bool),
    Text(String),
}

impl Shown {
    fn of(v: &Value<'_>) -> Shown {
        match v {
            Value::Int(i) => Shown::Int(*i),
            Value::Bool(b) => Shown::Bool(*b),
            Value::Str(s) => Shown::Text((*s).to_string()),
        }
    }

    /// As the rules write it: texts quoted.
    pub fn human(&self) -> String {
        match self {
            Shown::Int(i) => i.to_string(),
            Shown::Bool(b) => b.to_string(),
            Shown::Text(s) => format!("{s:?}"),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        match self {
            Shown::Int(i) => json!(i),
            Shown::Bool(b) => json!(b),
            Shown::Text(s) => json!(s),
        }
    }
}

/// A fact the session read, with its value.
#[derive(Clone, Debug)]
pub struct FactRead {
    pub fact: Fact,
    pub value: Shown,
    /// Read only to show a `let`'s value (the decision did not need it).
    pub for_lets_only: bool,
    /// A fact of the TalosCluster, which the objects do not hold: the value is what a
    /// missing cluster reads as.
    pub cluster_missing: bool,
}

/// What a `let` came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LetOutcome {
    Value(Shown),
    /// It cannot be computed for these facts (a division by zero, an overflow).
    Failed(EvalError),
    /// It reads a fact that could not be had here.
    Unread(Fact),
}

/// A `let` a row of the event uses, with its value for this request.
#[derive(Clone, Debug)]
pub struct LetRead {
    pub name: String,
    /// The expression as written.
    pub definition: String,
    pub file: String,
    pub line: usize,
    pub value: LetOutcome,
    /// It reads a fact of a TalosCluster the objects do not hold.
    pub cluster_missing: bool,
}

/// One event's part of an explanation.
pub struct EventTrace {
    pub title: String,
    pub event: Event,
    /// NAMESPACE/NAME of the event's cluster.
    pub cluster: String,
    /// The objects hold no TalosCluster of that name (and the event is not about the
    /// cluster itself).
    pub cluster_missing: bool,
    pub facts: Vec<FactRead>,
    pub rows: Vec<TraceRow>,
    /// The `let`s the rows use (transitively), in the order they are defined.
    pub lets: Vec<LetRead>,
}

/// Whether a fact is read from the TalosCluster object (so a missing cluster gives it the
/// value of "no cluster"). `cluster.exists` is exact either way.
fn from_cluster(f: Fact) -> bool {
    f.info().read == Read::Cluster && f != Fact::ClusterExists
}

/// Collects a traced session's explanation of `event`, after [`super::decide_into`] ran it:
/// the rows it recorded, the value of every `let` those rows use (evaluated by the same
/// interpreter against the same facts), and the facts read.
pub fn trace_event<'a, F: Facts<'a>>(
    session: &mut Session<'a, F>,
    title: String,
    event: Event,
    cluster: String,
    cluster_missing: bool,
) -> EventTrace {
    let table = session.table;
    let rows = session.take_trace().unwrap_or_default();
    let decided = session.asked().len();
    let mut lets = Vec::new();
    for (index, meta) in table.lets_of_rules(rows.iter().map(|r| r.rule_index)) {
        let value = match session.let_value(index) {
            Ok(Ok(v)) => LetOutcome::Value(Shown::of(&v)),
            Ok(Err(e)) => LetOutcome::Failed(e),
            Err(Interrupt::Need(f)) => LetOutcome::Unread(f),
        };
        let reads_cluster = FACTS
            .iter()
            .any(|i| meta.reads & (1 << i.fact.slot()) != 0 && from_cluster(i.fact));
        lets.push(LetRead {
            name: meta.name.clone(),
            definition: meta.definition.clone(),
            file: meta.file.clone(),
            line: meta.line,
            value,
            cluster_missing: cluster_missing && reads_cluster,
        });
    }
    let facts = session
        .asked()
        .iter()
        .enumerate()
        .map(|(i, (f, v))| FactRead {
            fact: *f,
            value: Shown::of(v),
            for_lets_only: i >= decided,
            cluster_missing: cluster_missing && from_cluster(*f),
        })
        .collect();
    EventTrace {
        title,
        event,
        cluster,
        cluster_missing,
        facts,
        rows,
        lets,
    }
}

fn mark(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "true",
        Some(false) => "false",
        None => "-",
    }
}

impl LetRead {
    fn human(&self, ev: &EventTrace) -> String {
        let mut s = match &self.value {
            LetOutcome::Value(v) => v.human(),
            LetOutcome::Failed(e) => format!("cannot be computed: {e}"),
            LetOutcome::Unread(f) => format!("not known here: it reads `{f}`, which was not read"),
        };
        let _ = write!(s, "   ({}:{})", self.file, self.line);
        if self.cluster_missing {
            let _ = write!(
                s,
                "   (from a missing cluster: the objects hold no TalosCluster {})",
                ev.cluster
            );
        }
        s
    }

    fn json(&self) -> serde_json::Value {
        let (value, error) = match &self.value {
            LetOutcome::Value(v) => (v.json(), serde_json::Value::Null),
            LetOutcome::Failed(e) => (serde_json::Value::Null, json!(e.to_string())),
            LetOutcome::Unread(f) => (
                serde_json::Value::Null,
                json!(format!(
                    "not known here: it reads `{f}`, which was not read"
                )),
            ),
        };
        json!({
            "name": self.name,
            "definition": self.definition,
            "file": self.file,
            "line": self.line,
            "value": value,
            "error": error,
            "cluster_missing": self.cluster_missing,
        })
    }
}

/// How a condition's value is shown, with why it has none.
fn condition_human(row: &TraceRow, value: Option<bool>, is_unless: bool) -> String {
    if let Some(b) = value {
        return b.to_string();
    }
    if is_unless && row.when == Some(false) {
        return "- (not evaluated: `when` is false)".to_string();
    }
    if let Some(f) = row.unread {
        return format!("- (not read: needs `{f}`)");
    }
    mark(value).to_string()
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
            let meta = table.rules.get(row.rule_index as usize);
            let status = if row.matched { "MATCH" } else { "-" };
            // A rule in audit mode matches and is recorded, and decides nothing.
            let audit = if meta.is_some_and(|m| m.audit) {
                " audit"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  [{status:^5}] {}{audit} {} ({}:{})",
                row.verdict,
                row.rule,
                meta.map(|m| m.file.as_str()).unwrap_or(""),
                meta.map(|m| m.line).unwrap_or(0)
            );
            if let Some(m) = meta {
                if let Some(w) = &m.when_text {
                    let _ = writeln!(
                        out,
                        "          when   {w}  = {}",
                        condition_human(row, row.when, false)
                    );
                }
                if let Some(u) = &m.unless_text {
                    let _ = writeln!(
                        out,
                        "          unless {u}  = {}",
                        condition_human(row, row.unless, true)
                    );
                }
            }
            if let Some(e) = &row.error {
                let _ = writeln!(out, "          error  {e} (fails closed)");
            }
        }
        if !ev.lets.is_empty() {
            let _ = writeln!(out, "  lets the rows use:");
            let name_w = ev.lets.iter().map(|l| l.name.len()).max().unwrap_or(0);
            let def_w = ev
                .lets
                .iter()
                .map(|l| l.definition.len())
                .max()
                .unwrap_or(0);
            for l in &ev.lets {
                let _ = writeln!(
                    out,
                    "    let {:name_w$} = {:def_w$}  = {}",
                    l.name,
                    l.definition,
                    l.human(ev),
                );
            }
        }
        if !ev.facts.is_empty() {
            let _ = writeln!(out, "  facts read:");
            for f in &ev.facts {
                let mut line = format!("    {:<20} = {}", f.fact.name(), f.value.human());
                if f.cluster_missing {
                    let _ = write!(
                        line,
                        "   (the objects hold no TalosCluster {}: read as missing)",
                        ev.cluster
                    );
                }
                if f.for_lets_only {
                    line.push_str("   (read only to show a let)");
                }
                let _ = writeln!(out, "{line}");
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

/// The explanation as JSON (the shape docs/rules.md documents under "explain --format
/// json"). `verdict` is the site's word: `refuse`/`allow` at the webhook,
/// `refuse`/`hold`/`proceed` at the controller.
pub fn to_json(
    table: &Table,
    header: &str,
    site: &str,
    verdict: &str,
    events: &[EventTrace],
    decision: &Decision,
    notes: &[String],
) -> serde_json::Value {
    let finding = |f: &super::Finding| {
        json!({
            "rule": f.rule,
            "verdict": f.verdict.to_string(),
            "message": f.message,
            "reason": f.reason,
        })
    };
    let events: Vec<serde_json::Value> = events
        .iter()
        .map(|ev| {
            let (verb, subject, site) = ev.event;
            let rows: Vec<serde_json::Value> = ev
                .rows
                .iter()
                .map(|row| {
                    let meta = table.rules.get(row.rule_index as usize);
                    let cond = |text: Option<&String>, value: Option<bool>, is_unless: bool| {
                        text.map(|t| {
                            let evaluated = !(is_unless && row.when == Some(false))
                                && row.unread.is_none_or(|_| value.is_some());
                            json!({ "text": t, "value": value, "evaluated": evaluated })
                        })
                    };
                    json!({
                        "rule": row.rule,
                        "verdict": row.verdict.to_string(),
                        "mode": if meta.is_some_and(|m| m.audit) { "audit" } else { "enforce" },
                        "file": meta.map(|m| m.file.as_str()),
                        "line": meta.map(|m| m.line),
                        "when": cond(meta.and_then(|m| m.when_text.as_ref()), row.when, false),
                        "unless": cond(meta.and_then(|m| m.unless_text.as_ref()), row.unless, true),
                        "matched": row.matched,
                        "error": row.error,
                        "unread": row.unread.map(|f| f.name()),
                    })
                })
                .collect();
            json!({
                "event": {
                    "verb": verb.name(),
                    "subject": subject.name(),
                    "site": site.name(),
                },
                "title": ev.title,
                "cluster": ev.cluster,
                "cluster_missing": ev.cluster_missing,
                "rows": rows,
                "lets": ev.lets.iter().map(LetRead::json).collect::<Vec<_>>(),
                "facts": ev.facts.iter().map(|f| json!({
                    "name": f.fact.name(),
                    "value": f.value.json(),
                    "for_lets_only": f.for_lets_only,
                    "cluster_missing": f.cluster_missing,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "header": header,
        "site": site,
        "verdict": verdict,
        "deciding": decision.deciding().iter().map(finding).collect::<Vec<_>>(),
        "warnings": decision.warnings.iter().map(finding).collect::<Vec<_>>(),
        "events": events,
        "notes": notes,
    })
}
