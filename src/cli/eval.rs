//! `ichor-rules eval` and `explain`: one decision, offline, with the code the operator runs.

use super::{EXIT_BAD_INPUT, EXIT_OK, emit};
use crate::diagnostics::render_human;
use crate::interp::Decision;
use crate::interp::explain;
use crate::ruleset::load;
use crate::runtime::admission::{immutable_spec_change, parse_review, refuse, respond};
use crate::runtime::decide::{
    decide_events, reconcile_machine_event, reconcile_operation_event, reconcile_start_event,
    request_events,
};
use crate::runtime::facts::{EventFacts, Expensive};
use crate::runtime::objects::{Snapshot, load_snapshot};
use crate::vocab::Verdict;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["review", "reconcile"])))]
pub struct EvalArgs {
    /// Rule files or folders.
    #[arg(long, default_value = "rules")]
    pub rules: Vec<PathBuf>,
    /// The live objects (YAML: a multi-document stream or a `kind: List`).
    #[arg(long)]
    pub objects: PathBuf,
    /// An AdmissionReview v1 request (JSON): decide it as the webhook does.
    #[arg(long)]
    pub review: Option<PathBuf>,
    /// NAMESPACE/NAME of a TalosMachine (or TalosOperation): decide as the controller does.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub reconcile: Option<String>,
}

/// One clear line, exit 2.
fn bad(msg: impl std::fmt::Display) -> u8 {
    eprintln!("error: {msg}");
    EXIT_BAD_INPUT
}

/// The largest objects file `eval` reads: far more objects than a namespace holds.
const MAX_OBJECTS_FILE: u64 = 64 * 1024 * 1024;

/// Reads at most `limit` bytes of `path`; a longer file is bad input, not a long wait.
fn read(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit + 1).read_to_end(&mut out))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if out.len() as u64 > limit {
        return Err(format!(
            "{}: larger than {limit} bytes; that is more than ichor-rules reads",
            path.display()
        ));
    }
    Ok(out)
}

pub fn run(args: &EvalArgs, explain: bool) -> u8 {
    let set = match load(&args.rules) {
        Ok(s) => s,
        Err(e) => return bad(e),
    };
    let Some(table) = &set.table else {
        eprint!("{}", render_human(&set.diagnostics, &set.files, false));
        let paths: Vec<String> = args.rules.iter().map(|p| p.display().to_string()).collect();
        return bad(format!(
            "{}: the rules have {} error(s); fix them (`ichor-rules check {}`) before evaluating",
            paths.join(", "),
            set.errors(),
            paths.join(" ")
        ));
    };
    let objects = match read(&args.objects, MAX_OBJECTS_FILE) {
        Ok(b) => b,
        Err(e) => return bad(e),
    };
    let Ok(objects_text) = String::from_utf8(objects) else {
        return bad(format!("{}: not UTF-8 text", args.objects.display()));
    };
    let snapshot = match load_snapshot(&objects_text) {
        Ok(s) => s,
        Err(e) => return bad(format!("{}: {e}", args.objects.display())),
    };
    if let Some(review) = &args.review {
        // The webhook reads no more of a body than this either.
        let body = match read(review, crate::runtime::webhook::MAX_BODY as u64) {
            Ok(b) => b,
            Err(e) => return bad(e),
        };
        let req = match parse_review(&body) {
            Ok(r) => r,
            Err(e) => return bad(format!("{}: {e}", review.display())),
        };
        let header = format!(
            "webhook: {} {} {}/{} (uid {})",
            format!("{:?}", req.operation()).to_uppercase(),
            req.inner.kind.kind,
            req.namespace,
            req.inner.name,
            req.uid()
        );
        // As the webhook: an operation's spec never changes, whatever the rules say.
        if let Some(message) = immutable_spec_change(&req) {
            let text = if explain {
                format!("{header}\nverdict: refused (not by a rule): {message}\n")
            } else {
                match serde_json::to_string_pretty(&refuse(&req, message)) {
                    Ok(s) => s + "\n",
                    Err(e) => return bad(format!("cannot write the response: {e}")),
                }
            };
            return match emit(&text) {
                Ok(()) => EXIT_OK,
                Err(code) => code,
            };
        }
        let events = request_events(
            req.operation(),
            &req.namespace,
            req.old.as_ref(),
            req.new.as_ref(),
        );
        let (decision, traces) =
            decide_events(table, &snapshot, &events, Expensive::FromObjects, explain);
        if explain {
            let line = if decision.refusals.is_empty() {
                "verdict: allowed".to_string()
            } else {
                "verdict: refused (every matching refusal is reported)".to_string()
            };
            let text = explain::render(table, &header, &traces, &decision, &line);
            if let Err(code) = emit(&text) {
                return code;
            }
        } else {
            let review = respond(&req, &decision);
            match serde_json::to_string_pretty(&review) {
                Ok(s) => {
                    if let Err(code) = emit(&(s + "\n")) {
                        return code;
                    }
                }
                Err(e) => return bad(format!("cannot write the response: {e}")),
            }
        }
        return EXIT_OK;
    }
    let Some(target) = &args.reconcile else {
        return bad("give --review FILE or --reconcile NAMESPACE/NAME");
    };
    let Some((ns, name)) = target
        .split_once('/')
        .filter(|(n, m)| !n.is_empty() && !m.is_empty())
    else {
        return bad(format!("--reconcile {target:?}: expected NAMESPACE/NAME"));
    };
    let events = match reconcile_events(&snapshot, ns, name) {
        Some(e) => e,
        None => {
            return bad(format!(
                "{}: no TalosMachine or TalosOperation {ns}/{name}",
                args.objects.display()
            ));
        }
    };
    let (mut decision, mut traces) =
        decide_events(table, &snapshot, &events, Expensive::FromObjects, explain);
    // As the controller: an operation that has not started, and is not held, has its
    // start rules decided again.
    if decision.verdict().is_none()
        && snapshot.machine(ns, name).is_none()
        && let Some(o) = snapshot.operation(ns, name)
    {
        let start: Vec<_> = reconcile_start_event(o).into_iter().collect();
        let (d, t) = decide_events(table, &snapshot, &start, Expensive::FromObjects, explain);
        decision.refusals.extend(d.refusals);
        decision.holds.extend(d.holds);
        decision.warnings.extend(d.warnings);
        traces.extend(t);
    }
    if explain {
        let header = format!("controller: reconcile {ns}/{name}");
        let line = format!("verdict: {}", verdict_word(&decision));
        let mut text = explain::render(table, &header, &traces, &decision, &line);
        if events
            .iter()
            .any(|e| e.event.1 == crate::vocab::Subject::ControlPlane)
        {
            text.push_str(
                "note: offline, `member.dead` is read from the machine's conditions; the controller asks etcd\n",
            );
        }
        return match emit(&text) {
            Ok(()) => EXIT_OK,
            Err(code) => code,
        };
    }
    match serde_json::to_string_pretty(&reconcile_json(&decision)) {
        Ok(s) => match emit(&(s + "\n")) {
            Ok(()) => EXIT_OK,
            Err(code) => code,
        },
        Err(e) => bad(format!("cannot write the decision: {e}")),
    }
}

fn reconcile_events<'s>(
    snapshot: &'s Snapshot,
    ns: &str,
    name: &str,
) -> Option<Vec<EventFacts<'s>>> {
    if let Some(m) = snapshot.machine(ns, name) {
        return Some(reconcile_machine_event(m).into_iter().collect());
    }
    snapshot
        .operation(ns, name)
        .map(|o| reconcile_operation_event(o).into_iter().collect())
}

fn verdict_word(d: &Decision) -> &'static str {
    match d.verdict() {
        Some(Verdict::Refuse) => "refuse",
        Some(Verdict::Hold) => "hold",
        _ => "proceed",
    }
}

/// The controller's decision: `{"verdict", "reason", "message", "rules", "warnings"}`.
pub fn reconcile_json(d: &Decision) -> serde_json::Value {
    let deciding = d.deciding();
    let message = if deciding.is_empty() {
        serde_json::Value::Null
    } else {
        deciding
            .iter()
            .map(|f| f.message.as_str())
            .collect::<Vec<_>>()
            .join("\n")
            .into()
    };
    serde_json::json!({
        "verdict": verdict_word(d),
        "reason": deciding.iter().find_map(|f| f.reason.clone()),
        "message": message,
        "rules": deciding.iter().map(|f| f.rule.clone()).collect::<Vec<_>>(),
    })
}
