//! `ichor-rules eval` and `explain`: one decision, offline, with the code the operator runs.

use super::outcome::{self, Outcome};
use super::request::{Form, build_review, now, parse_target, raw_objects, read_apply_file};
use super::{EXIT_BAD_INPUT, EXIT_OK, Format, emit};
use crate::diagnostics::render_human;
use crate::interp::Decision;
use crate::interp::explain;
use crate::ruleset::load;
use crate::runtime::admission::{refuse, respond};
use crate::runtime::objects::load_snapshot;
use crate::vocab::Verdict;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).args([
    "review", "reconcile", "delete", "apply", "approve", "unapprove", "unschedule", "status"
])))]
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
    /// `kubectl delete`: the DELETE review of this live object (from `--objects`), e.g.
    /// `talosmachine/infra/cp-3`.
    #[arg(long, value_name = "KIND/NAMESPACE/NAME")]
    pub delete: Option<String>,
    /// `kubectl apply -f FILE` (one object): an UPDATE when `--objects` holds the object
    /// (the file's fields merged onto it), else a CREATE.
    #[arg(long, value_name = "FILE")]
    pub apply: Option<PathBuf>,
    /// Approve a TalosMachine: the UPDATE that sets spec.approved to true and
    /// spec.approvalDecision.at to now.
    #[arg(long, value_name = "talosmachine/NAMESPACE/NAME")]
    pub approve: Option<String>,
    /// Un-approve a TalosMachine: the UPDATE that sets spec.approved to false.
    #[arg(long, value_name = "talosmachine/NAMESPACE/NAME")]
    pub unapprove: Option<String>,
    /// Make a TalosCluster unschedulable: the UPDATE that sets spec.schedulable to "false".
    #[arg(long, value_name = "taloscluster/NAMESPACE/NAME")]
    pub unschedule: Option<String>,
    /// A write of the status subresource (`kubectl patch --subresource=status`): FILE names
    /// a live object (kind, metadata) and gives the `status` merged onto its status.
    #[arg(long, value_name = "FILE")]
    pub status: Option<PathBuf>,
    /// Print the AdmissionReview the request builds (JSON) instead of deciding it.
    #[arg(long)]
    pub print_review: bool,
    /// The controller's username, as `serve --controller-username` names it to the
    /// webhook: a review whose `userInfo.username` is exactly this has
    /// `request.by_controller`. Without it, no review is the controller's.
    #[arg(long, value_name = "USER")]
    pub controller_username: Option<String>,
}

/// `explain`'s arguments: `eval`'s, and the output format.
#[derive(Args, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub eval: EvalArgs,
    /// Output format: `human` text, or `json` (one document; its shape is in docs/rules.md,
    /// "explain --format json").
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
}

/// What to print.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Eval,
    Explain(Format),
}

/// One clear line, exit 2.
fn bad(msg: impl std::fmt::Display) -> u8 {
    eprintln!("error: {msg}");
    EXIT_BAD_INPUT
}

/// The largest objects file `eval` reads: far more objects than a namespace holds.
pub(super) const MAX_OBJECTS_FILE: u64 = 64 * 1024 * 1024;

/// Reads at most `limit` bytes of `path`; a longer file is bad input, not a long wait.
pub(super) fn read(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
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

/// Reads a text file of at most `limit` bytes.
pub(super) fn read_text(path: &Path, limit: u64) -> Result<String, String> {
    String::from_utf8(read(path, limit)?).map_err(|_| format!("{}: not UTF-8 text", path.display()))
}

/// The request form of the arguments, if one is given (`--review` and `--reconcile` are
/// not forms).
fn form(args: &EvalArgs) -> Result<Option<Form>, String> {
    let target = |flag: &str, t: &str| parse_target(t).map_err(|e| format!("{flag} {e}"));
    Ok(Some(if let Some(t) = &args.delete {
        Form::Delete(target("--delete", t)?)
    } else if let Some(t) = &args.approve {
        Form::Approve(target("--approve", t)?)
    } else if let Some(t) = &args.unapprove {
        Form::Unapprove(target("--unapprove", t)?)
    } else if let Some(t) = &args.unschedule {
        Form::Unschedule(target("--unschedule", t)?)
    } else if let Some(path) = &args.apply {
        let text = read_text(path, crate::runtime::webhook::MAX_BODY as u64)?;
        Form::Apply(read_apply_file(path, &text)?)
    } else if let Some(path) = &args.status {
        let text = read_text(path, crate::runtime::webhook::MAX_BODY as u64)?;
        Form::Status(read_apply_file(path, &text)?)
    } else {
        return Ok(None);
    }))
}

pub fn run(args: &EvalArgs, explain: bool) -> u8 {
    run_as(
        args,
        if explain {
            Mode::Explain(Format::Human)
        } else {
            Mode::Eval
        },
    )
}

/// `explain` in the given format.
pub fn run_explain(args: &EvalArgs, format: Format) -> u8 {
    run_as(args, Mode::Explain(format))
}

fn run_as(args: &EvalArgs, mode: Mode) -> u8 {
    let explain = mode != Mode::Eval;
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
    let objects_text = match read_text(&args.objects, MAX_OBJECTS_FILE) {
        Ok(t) => t,
        Err(e) => return bad(e),
    };
    let snapshot = match load_snapshot(&objects_text) {
        Ok(s) => s,
        Err(e) => return bad(format!("{}: {e}", args.objects.display())),
    };
    let form = match form(args) {
        Ok(f) => f,
        Err(e) => return bad(e),
    };
    if args.print_review && form.is_none() {
        return bad(
            "--print-review prints the review a request form builds: give --delete, --apply, \
             --approve, --unapprove, --unschedule or --status",
        );
    }
    let body = if let Some(form) = &form {
        let review = match build_review(form, &raw_objects(&objects_text), &now()) {
            Ok(r) => r,
            Err(e) => return bad(e),
        };
        let text = match serde_json::to_string_pretty(&review) {
            Ok(t) => t,
            Err(e) => return bad(format!("cannot write the review: {e}")),
        };
        if args.print_review {
            return match emit(&(text + "\n")) {
                Ok(()) => EXIT_OK,
                Err(code) => code,
            };
        }
        Some((text.into_bytes(), form.flag().to_string()))
    } else if let Some(review) = &args.review {
        // The webhook reads no more of a body than this either.
        match read(review, crate::runtime::webhook::MAX_BODY as u64) {
            Ok(b) => Some((b, review.display().to_string())),
            Err(e) => return bad(e),
        }
    } else {
        None
    };
    if let Some((body, source)) = body {
        let outcome = match outcome::admission_as(
            table,
            &snapshot,
            &body,
            explain,
            args.controller_username
                .as_deref()
                .filter(|u| !u.is_empty()),
        ) {
            Ok(o) => o,
            Err(e) => return bad(format!("{source}: {e}")),
        };
        return answer_admission(table, &outcome, mode);
    }
    let Some(target) = &args.reconcile else {
        return bad(
            "give --review FILE, a request (--delete, --apply, --approve, --unapprove, --unschedule) or --reconcile NAMESPACE/NAME",
        );
    };
    let Some((ns, name)) = target
        .split_once('/')
        .filter(|(n, m)| !n.is_empty() && !m.is_empty())
    else {
        return bad(format!("--reconcile {target:?}: expected NAMESPACE/NAME"));
    };
    let outcome = match outcome::reconcile(table, &snapshot, ns, name, explain) {
        Ok(o) => o,
        Err(e) => return bad(format!("{}: {e}", args.objects.display())),
    };
    let plan = reconcile_plan(table, &snapshot, &outcome, ns, name);
    answer_reconcile(table, &outcome, plan, mode)
}

/// The plan a reconcile runs once its rules let it: an operation's (`plan run operation
/// "<kind>"`), or a machine's removal (`plan remove <role>`, when the reconcile decides
/// one). None when the rules hold none for it.
fn reconcile_plan<'t>(
    table: &'t crate::compile::Table,
    snapshot: &crate::runtime::objects::Snapshot,
    outcome: &Outcome,
    ns: &str,
    name: &str,
) -> Option<&'t crate::compile::Plan> {
    use crate::vocab::{Site, Verb};
    if let Some(op) = snapshot.operation(ns, name) {
        return table.operation_plan(&op.spec.kind);
    }
    outcome
        .kinds
        .iter()
        .find(|(v, _, site)| *v == Verb::Remove && *site == Site::Controller)
        .and_then(|(v, s, _)| table.plan(*v, *s))
}

/// `note: ...` lines.
fn notes_text(outcome: &Outcome) -> String {
    outcome
        .notes
        .iter()
        .map(|n| format!("note: {n}\n"))
        .collect()
}

fn print(text: &str) -> u8 {
    match emit(text) {
        Ok(()) => EXIT_OK,
        Err(code) => code,
    }
}

/// The JSON explanation, printed.
fn print_json(value: &serde_json::Value) -> u8 {
    match serde_json::to_string_pretty(value) {
        Ok(s) => print(&(s + "\n")),
        Err(e) => bad(format!("cannot write the explanation: {e}")),
    }
}

fn answer_admission(table: &crate::compile::Table, outcome: &Outcome, mode: Mode) -> u8 {
    let Some(req) = &outcome.request else {
        return bad("internal: an admission outcome without its request");
    };
    if mode == Mode::Explain(Format::Json) {
        let mut v = explain::to_json(
            table,
            &outcome.header,
            "webhook",
            match (&outcome.not_by_rule, outcome.decision.refusals.is_empty()) {
                (None, true) => "allow",
                _ => "refuse",
            },
            &outcome.traces,
            &outcome.decision,
            &outcome.notes,
        );
        v["refused_not_by_rule"] = serde_json::json!(outcome.not_by_rule);
        return print_json(&v);
    }
    let explain = mode != Mode::Eval;
    if let Some(message) = &outcome.not_by_rule {
        let text = if explain {
            format!(
                "{}\nverdict: refused (not by a rule): {message}\n",
                outcome.header
            )
        } else {
            match serde_json::to_string_pretty(&refuse(req, message.clone())) {
                Ok(s) => s + "\n",
                Err(e) => return bad(format!("cannot write the response: {e}")),
            }
        };
        return print(&text);
    }
    if explain {
        let line = if outcome.decision.refusals.is_empty() {
            "verdict: allowed".to_string()
        } else {
            "verdict: refused (every matching refusal is reported)".to_string()
        };
        let mut text = explain::render(
            table,
            &outcome.header,
            &outcome.traces,
            &outcome.decision,
            &line,
        );
        text.push_str(&notes_text(outcome));
        return print(&text);
    }
    // The response stays an AdmissionReview; notes go to stderr.
    eprint!("{}", notes_text(outcome));
    match serde_json::to_string_pretty(&respond(req, &outcome.decision)) {
        Ok(s) => print(&(s + "\n")),
        Err(e) => bad(format!("cannot write the response: {e}")),
    }
}

/// The plan's lines under an explanation: what runs once the verdict is proceed, each
/// step decided again before it runs.
fn plan_lines(plan: &crate::compile::Plan) -> String {
    let head = format!(
        "then, once it may proceed, {} (the rules decided again before each step, and a \
         step with `when`/`unless` run only when it says so):",
        plan.header()
    );
    super::table::plan_text(plan, &head)
}

fn answer_reconcile(
    table: &crate::compile::Table,
    outcome: &Outcome,
    plan: Option<&crate::compile::Plan>,
    mode: Mode,
) -> u8 {
    if mode == Mode::Explain(Format::Json) {
        let mut notes = outcome.notes.clone();
        if outcome.member_dead_offline {
            notes.insert(0, MEMBER_DEAD_OFFLINE.to_string());
        }
        let mut v = explain::to_json(
            table,
            &outcome.header,
            "controller",
            verdict_word(&outcome.decision),
            &outcome.traces,
            &outcome.decision,
            &notes,
        );
        v["refused_not_by_rule"] = serde_json::Value::Null;
        v["plan"] = plan.map_or(serde_json::Value::Null, super::table::plan_json);
        return print_json(&v);
    }
    if mode != Mode::Eval {
        let line = format!("verdict: {}", verdict_word(&outcome.decision));
        let mut text = explain::render(
            table,
            &outcome.header,
            &outcome.traces,
            &outcome.decision,
            &line,
        );
        if let Some(plan) = plan {
            text.push('\n');
            text.push_str(&plan_lines(plan));
        }
        if outcome.member_dead_offline {
            text.push_str(&format!("note: {MEMBER_DEAD_OFFLINE}\n"));
        }
        text.push_str(&notes_text(outcome));
        return print(&text);
    }
    eprint!("{}", notes_text(outcome));
    match serde_json::to_string_pretty(&reconcile_json(&outcome.decision)) {
        Ok(s) => print(&(s + "\n")),
        Err(e) => bad(format!("cannot write the decision: {e}")),
    }
}

const MEMBER_DEAD_OFFLINE: &str =
    "offline, `member.dead` is read from the machine's conditions; the controller asks etcd";

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
