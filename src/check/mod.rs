//! AST -> checked program: names, types, availability of facts per verb and site, the shape
//! of rules and plans, and the lints. Every finding is collected; nothing stops at the first.

mod arith;
mod events;
mod exact;
mod inline;
mod items;
mod lets;
mod lints;
mod typed;
mod types;

use types::Ty;

pub use lints::{Lints, destructive_event};
pub use typed::{Info, Typed, TypedKind, TypedPart, ValueKind, can_fail};

use crate::diagnostics::{Code, Diagnostic, SourceFile, did_you_mean};
use crate::syntax::ast::*;
use crate::vocab::{
    ACTIONS, Action, ActionInfo, EnumKind, FACTS, Fact, MODEL_FACTS, ModelFact, Site, Subject,
    Type, Verb, Verdict, action_spellings, is_runtime_event, resolve_verb, subjects_of, verb_words,
};
use std::collections::{HashMap, HashSet};

/// The deepest evaluation stack a condition may need: more intermediate values at once is
/// an error of the checker (the compiled form is sized for it).
pub const MAX_STACK: usize = 32;

/// How deep `let`s may refer to each other (deeper chains could exhaust the stack).
const MAX_LET_DEPTH: usize = 64;

/// A (verb, subject, site) triple: the key of a row group.
pub use crate::vocab::Event;

/// A rule, resolved: its events, its conditions with every `let` inlined.
#[derive(Clone, Debug)]
pub struct CheckedRule {
    pub name: String,
    /// `rule NAME audit`: evaluated and recorded, never enforced.
    pub audit: bool,
    pub file: usize,
    pub span: Span,
    pub verdict: Verdict,
    pub events: Vec<Event>,
    /// The verbs and subject as written (`leave worker`), for reviewers.
    pub head: String,
    pub when: Option<Expr>,
    pub unless: Option<Expr>,
    /// The conditions as written, for reviewers.
    pub when_text: Option<String>,
    pub unless_text: Option<String>,
    pub reason: Option<String>,
    pub message: Message,
    /// The message as written, on one line.
    pub say_text: String,
    /// The `let`s its conditions and message use, directly or through another `let`.
    pub lets: Vec<String>,
    /// `when`, `unless` and the message, annotated: what the compiler reads.
    pub typed: Annotated,
}

/// A rule's or a plan step's conditions and message, annotated once by the checker
/// ([`Typed`]): the compiler and the lints read these, never the syntax tree's names.
#[derive(Clone, Debug, Default)]
pub struct Annotated {
    pub when: Option<Typed>,
    pub unless: Option<Typed>,
    pub message: Option<Vec<TypedPart>>,
}

/// A plan step, resolved.
#[derive(Clone, Debug)]
pub struct CheckedStep {
    pub action: Action,
    pub argument: Option<String>,
    /// How long it may wait (`within`), in seconds.
    pub within: Option<u64>,
    pub when: Option<Expr>,
    pub unless: Option<Expr>,
    pub text: String,
    /// The guard as written (`when ...` / `unless ...`), for reviewers.
    pub guard_text: Option<String>,
    pub say_text: Option<String>,
    pub message: Option<Message>,
    pub span: Span,
    /// The `let`s its guard and message use, directly or through another `let`.
    pub lets: Vec<String>,
    /// The guard and the message, annotated: what the compiler reads.
    pub typed: Annotated,
}

#[derive(Clone, Debug)]
pub struct CheckedPlan {
    pub verb: Verb,
    pub subject: Subject,
    /// The operation kind it runs (an operation's plan).
    pub kind: Option<String>,
    pub file: usize,
    pub span: Span,
    pub steps: Vec<CheckedStep>,
}

/// An invariant, resolved: its conditions over model facts with every `let` inlined.
#[derive(Clone, Debug)]
pub struct CheckedInvariant {
    pub name: String,
    pub file: usize,
    pub span: Span,
    pub sequential: bool,
    pub when: Option<Expr>,
    pub unless: Option<Expr>,
    pub ensure: Expr,
    /// The conditions as written, for reviewers.
    pub when_text: Option<String>,
    pub unless_text: Option<String>,
    pub ensure_text: String,
    pub message: Option<Message>,
    pub say_text: Option<String>,
}

/// A `let` that a rule or a plan step uses, resolved: for explanations and reviewers
/// (conditions have every `let` inlined, so nothing else reads these).
#[derive(Clone, Debug)]
pub struct CheckedLet {
    pub name: String,
    pub file: usize,
    /// The whole definition (`let name = expr`).
    pub span: Span,
    /// The expression as written.
    pub expr_span: Span,
    /// The expression with every `let` it uses inlined.
    pub expr: Expr,
    /// The same, annotated: what the compiler reads.
    pub typed: Typed,
}

/// An `allow` statement, resolved.
#[derive(Clone, Debug)]
pub struct CheckedAllow {
    pub file: usize,
    pub span: Span,
    pub events: Vec<Event>,
}

/// What the compiler needs: rules, allowances, plans and invariants, all resolved.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub rules: Vec<CheckedRule>,
    pub allowed: Vec<Event>,
    /// Each `allow` statement: where it is, and the events it names.
    pub allows: Vec<CheckedAllow>,
    pub plans: Vec<CheckedPlan>,
    pub invariants: Vec<CheckedInvariant>,
    /// The `let`s the rules and plan steps use, each file's in the order it defines them.
    pub lets: Vec<CheckedLet>,
}

/// The result of checking a rule set.
#[derive(Debug, Default)]
pub struct CheckResult {
    pub program: Program,
    pub diagnostics: Vec<Diagnostic>,
}

impl CheckResult {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.is_error())
    }
}

/// Parses and checks a rule set (several files form one table), lints included.
pub fn check(files: &[SourceFile]) -> CheckResult {
    check_with(files, true)
}

/// Parses and checks a rule set; `lints: false` skips the lints.
pub fn check_with(files: &[SourceFile], lints: bool) -> CheckResult {
    check_linting(files, lints.then_some(Lints::All))
}

/// Parses and checks a rule set as a server loading it does: errors, the lints that are
/// errors (arithmetic that can fail) and the coverage of the runtime's events, which decide
/// whether the table may serve; not the exact analyses that only warn (`check` runs them).
pub fn check_serving(files: &[SourceFile]) -> CheckResult {
    check_linting(files, Some(Lints::Serving))
}

pub(crate) fn check_linting(files: &[SourceFile], lints: Option<Lints>) -> CheckResult {
    let mut diags = Vec::new();
    let mut parsed = Vec::new();
    for (i, f) in files.iter().enumerate() {
        // Every syntax error, and the statements that parsed, so their own errors are
        // found too (no table is built while any error stands).
        let (ast, ds) = crate::syntax::parse_recovering(i, &f.text);
        diags.extend(ds);
        parsed.push((i, ast));
    }
    let mut program = Program::default();
    let mut rule_names: HashMap<String, (usize, Span)> = HashMap::new();
    let mut plan_keys: HashMap<(Verb, Subject, Option<String>), (usize, Span)> = HashMap::new();
    for (file, ast) in &parsed {
        let mut c = FileChecker::new(*file, &files[*file], ast, &mut diags);
        c.check_lets();
        for item in &ast.items {
            match item {
                Item::Rule(r) => {
                    if let Some(d) = claim_name(&mut rule_names, *file, &r.name, false) {
                        c.diags.push(d);
                    }
                    if let Some(rule) = c.check_rule(r) {
                        program.rules.push(rule);
                    }
                }
                Item::Allow(a) => {
                    let events = c.events(&a.verbs, &a.subject, a.site.as_ref(), None);
                    program.allows.push(CheckedAllow {
                        file: *file,
                        span: a.span,
                        events: events.clone(),
                    });
                    program.allowed.extend(events);
                }
                Item::Invariant(inv) => {
                    if let Some(d) = claim_name(&mut rule_names, *file, &inv.name, true) {
                        c.diags.push(d);
                    }
                    if let Some(checked) = c.check_invariant(inv) {
                        program.invariants.push(checked);
                    }
                }
                Item::Plan(p) => {
                    if let Some(plan) = c.check_plan(p) {
                        let key = (plan.verb, plan.subject, plan.kind.clone());
                        if let std::collections::hash_map::Entry::Vacant(slot) =
                            plan_keys.entry(key.clone())
                        {
                            slot.insert((*file, p.span));
                            program.plans.push(plan);
                        } else if let Some((first_file, first_span)) = plan_keys.get(&key) {
                            c.diags.push(
                                Diagnostic::error(
                                    Code::DuplicatePlan,
                                    *file,
                                    p.verb.span.to(p.subject.span),
                                    format!(
                                        "a plan for `{} {}{}` is defined twice",
                                        plan.verb.name(),
                                        plan.subject.name(),
                                        plan.kind
                                            .as_deref()
                                            .map(|k| format!(" \"{k}\""))
                                            .unwrap_or_default()
                                    ),
                                )
                                .label("second plan")
                                .secondary(
                                    *first_file,
                                    first_line(files, *first_file, *first_span),
                                    "the first plan",
                                )
                                .help("one plan per verb and subject; merge the steps into one"),
                            );
                        }
                    }
                }
                Item::Let(_) => {}
            }
        }
        program.lets.extend(c.used_lets(&program));
        c.report_unused_lets();
        c.report_inline_errors();
    }
    if let Some(which) = lints
        && !diags.iter().any(|d| d.is_error())
    {
        lints::run(files, &program, &mut diags, which);
    }
    diags.sort_by(|a, b| {
        (a.file, a.span.start, a.severity).cmp(&(b.file, b.span.start, b.severity))
    });
    CheckResult {
        program,
        diagnostics: diags,
    }
}

/// The first line of a span (a rule's or a plan's head), for a secondary label that points
/// at a whole item without drawing all of it.
pub(crate) fn first_line(files: &[SourceFile], file: usize, span: Span) -> Span {
    let text = files.get(file).map_or("", |f| &f.text);
    let from = span.start as usize;
    let rest = text.get(from..span.end as usize).unwrap_or("");
    let len = rest.find('\n').unwrap_or(rest.len());
    let len = rest[..len].trim_end().len();
    Span::new(from, from + len)
}

/// Rules and invariants share one namespace across the rule set: the first definition of
/// a name claims it; a second one is a `duplicate_rule` error pointing at the first.
fn claim_name(
    names: &mut HashMap<String, (usize, Span)>,
    file: usize,
    name: &Ident,
    invariant: bool,
) -> Option<Diagnostic> {
    let Some((pf, ps)) = names.get(&name.name) else {
        names.insert(name.name.clone(), (file, name.span));
        return None;
    };
    let (message, help) = if invariant {
        (
            format!("the name `{}` is defined twice", name.name),
            "rule and invariant names are unique across the rule set; rename one",
        )
    } else {
        (
            format!("the rule `{}` is defined twice", name.name),
            "rule names are unique across the rule set; rename one",
        )
    };
    Some(
        Diagnostic::error(Code::DuplicateRule, file, name.span, message)
            .label("second definition")
            .secondary(*pf, *ps, "first defined here")
            .help(help),
    )
}

struct LetInfo<'a> {
    def: &'a LetDef,
    ty: Option<Ty>,
    used: bool,
}

struct FileChecker<'a, 'd> {
    file: usize,
    ast: &'a File,
    lets: HashMap<&'a str, LetInfo<'a>>,
    diags: &'d mut Vec<Diagnostic>,
    /// Lets being typed right now, for cycle detection.
    visiting: Vec<&'a str>,
    /// Cycles already reported, so each is reported once.
    reported_cycles: HashSet<&'a str>,
    /// Set when inlining met a chain of `let`s deeper than [`MAX_LET_DEPTH`].
    inline_too_deep: std::cell::Cell<bool>,
    /// The written-out size of each `let`, and what inlining used of the file's budget.
    expansions: std::cell::RefCell<inline::Expansions>,
    /// See [`inline::budget`].
    inline_budget: usize,
    /// Set while an `invariant` is checked: names are the model's facts.
    in_invariant: std::cell::Cell<bool>,
}

impl<'a, 'd> FileChecker<'a, 'd> {
    fn new(file: usize, src: &SourceFile, ast: &'a File, diags: &'d mut Vec<Diagnostic>) -> Self {
        let mut lets: HashMap<&'a str, LetInfo<'a>> = HashMap::new();
        for item in &ast.items {
            if let Item::Let(l) = item {
                if let Some(prev) = lets.get(l.name.name.as_str()) {
                    diags.push(
                        Diagnostic::error(
                            Code::DuplicateLet,
                            file,
                            l.name.span,
                            format!("`{}` is defined twice", l.name.name),
                        )
                        .label("second definition")
                        .secondary(file, prev.def.name.span, "first defined here")
                        .help("remove or rename one of the two definitions"),
                    );
                    continue;
                }
                if let Some(f) = ModelFact::lookup(&l.name.name)
                    && Fact::lookup(&l.name.name).is_none()
                {
                    diags.push(
                        Diagnostic::error(
                            Code::LetShadowsFact,
                            file,
                            l.name.span,
                            format!(
                                "`{}` is a fact of `verify`'s model; a `let` cannot redefine it",
                                f.name()
                            ),
                        )
                        .label("already a fact")
                        .help("choose another name for the definition"),
                    );
                    continue;
                }
                if let Some(f) = Fact::lookup(&l.name.name) {
                    diags.push(
                        Diagnostic::error(
                            Code::LetShadowsFact,
                            file,
                            l.name.span,
                            format!("`{}` is a fact; a `let` cannot redefine it", f.name()),
                        )
                        .label("already a fact")
                        .help("choose another name for the definition"),
                    );
                    continue;
                }
                lets.insert(
                    l.name.name.as_str(),
                    LetInfo {
                        def: l,
                        ty: None,
                        used: false,
                    },
                );
            }
        }
        FileChecker {
            file,
            ast,
            lets,
            diags,
            visiting: Vec::new(),
            reported_cycles: HashSet::new(),
            inline_too_deep: std::cell::Cell::new(false),
            expansions: std::cell::RefCell::default(),
            inline_budget: inline::budget(src.text.len()),
            in_invariant: std::cell::Cell::new(false),
        }
    }
}

fn is_condition_reason(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
}

fn backticked(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
    match quoted.len() {
        0 => String::new(),
        1 => quoted[0].clone(),
        n => format!("{} and {}", quoted[..n - 1].join(", "), quoted[n - 1]),
    }
}

/// The integer a string literal spells (`"4"`), for the "drop the quotes" help.
fn quoted_integer(e: &Expr) -> Option<i64> {
    match &e.kind {
        ExprKind::Str(s, _) => s.trim().parse().ok(),
        _ => None,
    }
}
