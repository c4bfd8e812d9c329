//! Lints that run on the resolved rules by enumerating the facts' domains: conditions that
//! are always or never true, divisions that can hit zero, rules subsumed by another rule of
//! the same verdict, and runtime events no rule or `allow` covers.
//!
//! The domains are explicit (see [`Fact::int_domain`]); a finding holds over every value in
//! them. A rule whose facts span more than [`MAX_ASSIGNMENTS`] combinations (or whose
//! enumeration would cost more than [`MAX_WORK`]) is not enumerated: its arithmetic is
//! decided by ranges instead ([`super::arith`]), and a warning names the rule and the lints
//! that were not run. Plan steps' guards and messages are checked for arithmetic too.
//! Nothing is skipped without a word.

use super::arith::{self, can_fail};
use super::{CheckedPlan, CheckedRule, Event, Program};
use crate::diagnostics::{Diagnostic, SourceFile};
use crate::interp::value::{EvalError, Value, eval};
use crate::syntax::ast::{Expr, ExprKind, Span};
use crate::vocab::{Fact, RUNTIME_EVENTS, Type, Verdict};

/// The most fact combinations a lint enumerates for one rule or pair of rules.
pub const MAX_ASSIGNMENTS: usize = 100_000;

/// The most operand evaluations one enumeration may cost (combinations times the size of
/// the expressions evaluated under each).
pub const MAX_WORK: usize = 4_000_000;

/// The operand evaluations all subsumption checks together may cost: a base, plus an
/// allowance per rule, so `check` stays linear in the number of rules.
fn subsumption_budget(rules: usize) -> usize {
    4_000_000 + 5_000 * rules
}

/// A value no literal in the rules equals, standing for "any other name".
const OTHER: &str = "\u{1}other";

pub(super) fn run(files: &[SourceFile], program: &Program, diags: &mut Vec<Diagnostic>) {
    let shapes: Vec<Shape<'_>> = program.rules.iter().map(Shape::of).collect();
    let witnesses: Vec<Vec<Witness<'_>>> = program
        .rules
        .iter()
        .zip(&shapes)
        .map(|(rule, shape)| lint_rule(rule, shape, diags))
        .collect();
    for rule in &program.rules {
        lint_placeholders(rule, diags);
    }
    for plan in &program.plans {
        lint_plan(plan, diags);
    }
    subsumption(files, program, &shapes, &witnesses, diags);
    coverage(files, program, diags);
}

/// Fact values under which a rule fires: the subsumption lint tries them first, since one
/// of them is nearly always enough to show another rule does not cover it.
type Witness<'a> = Vec<(Fact, Value<'a>)>;

/// How many witnesses are kept per rule.
const WITNESSES: usize = 4;

/// The facts a rule reads and the text literals it compares them with.
struct Shape<'a> {
    facts: Vec<Fact>,
    literals: Vec<&'a str>,
}

impl<'a> Shape<'a> {
    fn of(rule: &'a CheckedRule) -> Shape<'a> {
        let mut s = Shape {
            facts: Vec::new(),
            literals: Vec::new(),
        };
        for e in rule.when.iter().chain(rule.unless.iter()) {
            s.collect(e);
        }
        s
    }

    fn collect(&mut self, e: &'a Expr) {
        match &e.kind {
            ExprKind::Name(n) => {
                if let Some(f) = Fact::lookup(n)
                    && !self.facts.contains(&f)
                {
                    self.facts.push(f);
                }
            }
            ExprKind::Str(s, _) if !self.literals.contains(&s.as_str()) => {
                self.literals.push(s);
            }
            ExprKind::Unary(_, i) => self.collect(i),
            ExprKind::Binary(_, l, r) => {
                self.collect(l);
                self.collect(r);
            }
            _ => {}
        }
    }
}

/// Every combination of values for `facts`, in a fixed order.
struct Assignments<'a> {
    domains: Vec<Vec<Value<'a>>>,
    facts: Vec<Fact>,
}

impl<'a> Assignments<'a> {
    fn new(facts: &[Fact], literals: &[&'a str]) -> Option<Assignments<'a>> {
        let mut domains = Vec::new();
        for f in facts {
            let d: Vec<Value<'a>> = match f.info().ty {
                Type::Bool => vec![Value::Bool(false), Value::Bool(true)],
                Type::Int => f.int_domain().iter().map(|i| Value::Int(*i)).collect(),
                Type::Enum(kind) => kind
                    .values()
                    .iter()
                    .map(|v| Value::Str(v))
                    .chain(std::iter::once(Value::Str(OTHER)))
                    .collect(),
                Type::Name => literals
                    .iter()
                    .map(|l| Value::Str(l))
                    .chain([Value::Str(""), Value::Str(OTHER)])
                    .collect(),
            };
            domains.push(d);
        }
        let total = domains
            .iter()
            .try_fold(1usize, |acc, d| acc.checked_mul(d.len()))?;
        (total <= MAX_ASSIGNMENTS).then_some(Assignments {
            domains,
            facts: facts.to_vec(),
        })
    }

    fn total(&self) -> usize {
        self.domains.iter().map(|d| d.len()).product()
    }

    /// The combinations, when evaluating `size` operands under each stays within [`MAX_WORK`].
    fn within_work(facts: &[Fact], literals: &[&'a str], size: usize) -> Option<Self> {
        let a = Assignments::new(facts, literals)?;
        (a.total().saturating_mul(size.max(1)) <= MAX_WORK).then_some(a)
    }

    /// Assignment number `n` in words: `fact = value` for each fact.
    fn describe(&self, n: usize) -> Vec<String> {
        self.facts
            .iter()
            .filter_map(|f| self.value(n, *f).ok().map(|v| format!("{f} = {}", show(v))))
            .collect()
    }

    /// The value of `fact` in assignment number `n`.
    fn value(&self, n: usize, fact: Fact) -> Result<Value<'a>, EvalError> {
        let mut rest = n;
        for (f, d) in self.facts.iter().zip(&self.domains) {
            let v = d[rest % d.len()];
            rest /= d.len();
            if *f == fact {
                return Ok(v);
            }
        }
        Err(EvalError::Unavailable(fact))
    }
}

/// The rule's condition values under one assignment: (when, unless, fires).
fn outcome<'a>(
    rule: &'a CheckedRule,
    a: &Assignments<'a>,
    n: usize,
) -> Result<(bool, bool, bool), (EvalError, Span)> {
    let mut get = |f: Fact| a.value(n, f);
    let when = match &rule.when {
        Some(e) => eval(e, &mut get)
            .map_err(|err| (err, e.span))?
            .as_bool()
            .unwrap_or(false),
        None => true,
    };
    let unless = match &rule.unless {
        Some(e) => eval(e, &mut get)
            .map_err(|err| (err, e.span))?
            .as_bool()
            .unwrap_or(false),
        None => false,
    };
    Ok((when, unless, when && !unless))
}

/// A message's placeholders are evaluated whenever the rule fires: over the facts'
/// domains, where it fires, none may divide by zero or overflow (it would read
/// `<division by zero>` in a refusal).
fn lint_placeholders(rule: &CheckedRule, diags: &mut Vec<Diagnostic>) {
    let placeholders: Vec<&Expr> = rule
        .message
        .parts
        .iter()
        .filter_map(|p| match p {
            crate::syntax::ast::MessagePart::Placeholder(e) => Some(e),
            crate::syntax::ast::MessagePart::Text(_) => None,
        })
        .filter(|e| can_fail(e))
        .collect();
    if placeholders.is_empty() {
        return;
    }
    let mut shape = Shape::of(rule);
    for e in &placeholders {
        shape.collect(e);
    }
    let size = rule_size(rule) + placeholders.iter().map(|e| size_of(e)).sum::<usize>();
    let Some(a) = Assignments::within_work(&shape.facts, &shape.literals, size) else {
        // Too many combinations: decide by ranges where the rule fires.
        let path = fires_path(rule);
        if let Some(f) = arith::analyse(&path, &placeholders).into_iter().next() {
            diags.push(range_error(
                rule.file,
                &f,
                format!("the message of `{}` can fail with {}", rule.name, f.error),
                "compute it without the division, or guard the rule so it cannot fire then",
            ));
        }
        return;
    };
    for n in 0..a.total() {
        if !matches!(outcome(rule, &a, n), Ok((_, _, true))) {
            continue;
        }
        let mut get = |f: Fact| a.value(n, f);
        for e in &placeholders {
            if let Err(err @ (EvalError::DivisionByZero | EvalError::Overflow)) = eval(e, &mut get)
            {
                let facts = a.describe(n);
                diags.push(
                    Diagnostic::error(
                        "ichor::check::arithmetic",
                        rule.file,
                        e.span,
                        format!("the message of `{}` can fail with {err}", rule.name),
                    )
                    .label(if facts.is_empty() {
                        "always".to_string()
                    } else {
                        format!("when {}", facts.join(", "))
                    })
                    .help(
                        "compute it without the division, or guard the rule so it cannot fire then",
                    ),
                );
                return;
            }
        }
    }
    // The domains enumerated are small: an overflow needs larger values. Ranges cover them.
    let path = fires_path(rule);
    if let Some(f) = arith::analyse(&path, &placeholders)
        .into_iter()
        .find(|f| f.error == EvalError::Overflow)
    {
        diags.push(range_error(
            rule.file,
            &f,
            format!("the message of `{}` can fail with {}", rule.name, f.error),
            "compute it with smaller numbers, or guard the rule so it cannot fire then",
        ));
    }
}

/// Where a rule's message is evaluated: its `when` holds and its `unless` does not.
fn fires_path(rule: &CheckedRule) -> Vec<(&Expr, bool)> {
    rule.when
        .iter()
        .map(|e| (e, true))
        .chain(rule.unless.iter().map(|e| (e, false)))
        .collect()
}

/// An arithmetic error found by ranges: the label says which range makes it fail.
fn range_error(file: usize, f: &arith::Finding, message: String, help: &str) -> Diagnostic {
    Diagnostic::error("ichor::check::arithmetic", file, f.span, message)
        .label(f.why.clone())
        .help(help)
}

/// The operands and operators of an expression.
fn size_of(e: &Expr) -> usize {
    match &e.kind {
        ExprKind::Unary(_, i) => size_of(i) + 1,
        ExprKind::Binary(_, l, r) => size_of(l) + size_of(r) + 1,
        _ => 1,
    }
}

fn rule_size(rule: &CheckedRule) -> usize {
    rule.when
        .iter()
        .chain(rule.unless.iter())
        .map(size_of)
        .sum()
}

/// The arithmetic of a rule too large to enumerate, decided by ranges: its `when` anywhere,
/// its `unless` where the `when` holds (that is the order the table evaluates them in).
fn lint_rule_by_ranges(rule: &CheckedRule, diags: &mut Vec<Diagnostic>) {
    let parts: Vec<(Vec<(&Expr, bool)>, &Expr)> = rule
        .when
        .iter()
        .map(|w| (Vec::new(), w))
        .chain(
            rule.unless
                .iter()
                .map(|u| (rule.when.iter().map(|w| (w, true)).collect(), u)),
        )
        .collect();
    for (path, e) in parts {
        if let Some(f) = arith::analyse(&path, &[e]).into_iter().next() {
            diags.push(range_error(
                rule.file,
                &f,
                format!("`{}` can fail with {}", rule.name, f.error),
                "guard the division, e.g. `count > 0 and approved / count ...`",
            ));
            return;
        }
    }
}

/// The conditions an expression is evaluated under, and their truth.
type PathOf<'e> = Vec<(&'e Expr, bool)>;

/// Plan steps run in the controller: a guard or a message that fails stops the plan. Each
/// guard is evaluated on its own; the message where the step runs.
fn lint_plan(plan: &CheckedPlan, diags: &mut Vec<Diagnostic>) {
    for step in &plan.steps {
        let guards: Vec<(PathOf<'_>, &Expr, &str)> = step
            .when
            .iter()
            .chain(step.unless.iter())
            .map(|e| (Vec::new(), e, "guard"))
            .chain(step.message.iter().flat_map(|m| {
                m.parts.iter().filter_map(|p| match p {
                    crate::syntax::ast::MessagePart::Placeholder(e) => Some((
                        step.when
                            .iter()
                            .map(|w| (w, true))
                            .chain(step.unless.iter().map(|u| (u, false)))
                            .collect(),
                        e,
                        "message",
                    )),
                    crate::syntax::ast::MessagePart::Text(_) => None,
                })
            }))
            .filter(|(_, e, _)| can_fail(e))
            .collect();
        for (path, e, what) in guards {
            if let Some(f) = arith::analyse(&path, &[e]).into_iter().next() {
                diags.push(range_error(
                    plan.file,
                    &f,
                    format!(
                        "the {what} of step `{}` in `plan {} {}` can fail with {}",
                        step.text,
                        plan.verb.name(),
                        plan.subject.name(),
                        f.error
                    ),
                    "guard the division (`approved > 1 and workers / (approved - 1) ...`), or compute it without one",
                ));
                break;
            }
        }
    }
}

/// Overflows the enumeration cannot see (they need values past the small domains).
fn lint_rule_by_ranges_overflow(rule: &CheckedRule, diags: &mut Vec<Diagnostic>) {
    let mut found = Vec::new();
    lint_rule_by_ranges(rule, &mut found);
    diags.extend(
        found
            .into_iter()
            .filter(|d| d.message.ends_with(&EvalError::Overflow.to_string())),
    );
}

/// The warning for a rule the enumerating lints could not cover.
fn not_analysed(rule: &CheckedRule, why: String) -> Diagnostic {
    Diagnostic::warning(
        "ichor::lint::not_analysed",
        rule.file,
        rule.when.as_ref().map_or(rule.span, |w| w.span),
        format!(
            "`{}` was not checked for conditions that are always or never true, nor for subsumption: {why}",
            rule.name
        ),
    )
    .label("not analysed")
    .help("split the rule, or read fewer facts in one condition; its arithmetic was still checked, by ranges")
}

fn lint_rule<'a>(
    rule: &'a CheckedRule,
    shape: &Shape<'a>,
    diags: &mut Vec<Diagnostic>,
) -> Vec<Witness<'a>> {
    let mut witnesses = Vec::new();
    let Some(a) = Assignments::within_work(&shape.facts, &shape.literals, rule_size(rule)) else {
        let why = match Assignments::new(&shape.facts, &shape.literals) {
            None => format!(
                "its {} facts take more than {MAX_ASSIGNMENTS} combinations of values",
                shape.facts.len()
            ),
            Some(a) => format!(
                "its {} combinations of fact values times its {} operands pass {MAX_WORK} evaluations",
                a.total(),
                rule_size(rule)
            ),
        };
        diags.push(not_analysed(rule, why));
        lint_rule_by_ranges(rule, diags);
        return witnesses;
    };
    let mut fires_any = false;
    let (mut when_true, mut when_false) = (0usize, 0usize);
    let mut unless_bites = 0usize;
    for n in 0..a.total() {
        match outcome(rule, &a, n) {
            Ok((w, u, f)) => {
                if w {
                    when_true += 1;
                } else {
                    when_false += 1;
                }
                if w && u {
                    unless_bites += 1;
                }
                fires_any |= f;
                if f && witnesses.len() < WITNESSES {
                    witnesses.push(
                        a.facts
                            .iter()
                            .filter_map(|fact| a.value(n, *fact).ok().map(|v| (*fact, v)))
                            .collect(),
                    );
                }
            }
            Err((err, span)) => {
                let facts = a.describe(n);
                diags.push(
                    Diagnostic::error(
                        "ichor::check::arithmetic",
                        rule.file,
                        span,
                        format!("`{}` can fail with {err}", rule.name),
                    )
                    .label(format!("when {}", facts.join(", ")))
                    .help("guard the division, e.g. `count > 0 and approved / count ...`"),
                );
                return Vec::new();
            }
        }
    }
    let before = diags.len();
    lint_rule_by_ranges_overflow(rule, diags);
    if diags.len() > before {
        return Vec::new();
    }
    if let (Some(e), 0) = (&rule.when, when_false) {
        diags.push(
            Diagnostic::warning(
                "ichor::lint::always_true",
                rule.file,
                e.span,
                format!("the condition of `{}` is always true", rule.name),
            )
            .label("true for every value of its facts")
            .help("drop the `when`, or fix the comparison"),
        );
    } else if !fires_any {
        let span = rule.when.as_ref().map(|e| e.span).unwrap_or(rule.span);
        diags.push(
            Diagnostic::warning(
                "ichor::lint::never_true",
                rule.file,
                span,
                format!("`{}` can never {}", rule.name, rule.verdict),
            )
            .label(if when_true == 0 {
                "false for every value of its facts"
            } else {
                "its `unless` holds whenever this does"
            })
            .help("fix the condition, or remove the rule"),
        );
    }
    if let (Some(e), 0, true) = (&rule.unless, unless_bites, when_true > 0) {
        diags.push(
            Diagnostic::warning(
                "ichor::lint::unless_never",
                rule.file,
                e.span,
                format!("the exception of `{}` never applies", rule.name),
            )
            .label("never true while the `when` holds")
            .help("drop the `unless`, or fix it"),
        );
    }
    witnesses
}

fn show(v: Value<'_>) -> String {
    match v {
        Value::Str(s) if s == OTHER => "(another name)".into(),
        Value::Str(s) => format!("{s:?}"),
        v => v.to_string(),
    }
}

/// The runtime events of a rule as a bit set, for fast subset tests.
fn event_bits(rule: &CheckedRule) -> u64 {
    rule.events
        .iter()
        .filter_map(|e| RUNTIME_EVENTS.iter().position(|r| r == e))
        .fold(0u64, |acc, i| acc | (1 << (i % 64)))
}

fn subsumption(
    files: &[SourceFile],
    program: &Program,
    shapes: &[Shape<'_>],
    witnesses: &[Vec<Witness<'_>>],
    diags: &mut Vec<Diagnostic>,
) {
    let rules = &program.rules;
    let bits: Vec<u64> = rules.iter().map(event_bits).collect();
    let sizes: Vec<usize> = rules.iter().map(rule_size).collect();
    let mut budget = subsumption_budget(rules.len());
    // Per rule, whether a comparison of it was skipped once the budget ran out (a flag per
    // rule, not an entry per pair: memory stays linear).
    let mut skipped_rule = vec![false; rules.len()];
    // A rule that never fires implies everything vacuously; `implies` says no for it.
    let mut implies = |a: usize, b: usize| {
        if witnesses[a].is_empty() {
            return false;
        }
        let cost = witnesses[a].len() * sizes[b];
        if budget < cost {
            skipped_rule[a] = true;
            return false;
        }
        budget -= cost;
        !refuted_by_witness(&rules[b], &witnesses[a])
            && implies(&rules[a], &rules[b], shapes, a, b, &sizes, &mut budget).unwrap_or_else(
                || {
                    skipped_rule[a] = true;
                    false
                },
            )
    };
    for (i, a) in rules.iter().enumerate() {
        for (j, b) in rules.iter().enumerate() {
            if i == j
                || bits[i] & !bits[j] != 0
                || a.verdict != b.verdict
                || (a.verdict == Verdict::Hold && a.reason != b.reason)
            {
                continue;
            }
            // Equivalent rules subsume each other: report only the later one.
            if bits[j] & !bits[i] == 0 && j > i && implies(j, i) {
                continue;
            }
            if implies(i, j) {
                let at = files
                    .get(b.file)
                    .map(|f| format!("{}:{}", f.display_path(), f.line_col(b.span.start).0))
                    .unwrap_or_default();
                diags.push(
                    Diagnostic::warning(
                        "ichor::lint::subsumed",
                        a.file,
                        a.span,
                        format!(
                            "`{}` is subsumed by `{}`: whenever it would {}, `{}` does too",
                            a.name, b.name, a.verdict, b.name
                        ),
                    )
                    .label(format!("never decides anything `{}` does not", b.name))
                    .help(format!(
                        "remove `{}`, or narrow `{}` (at {at}) so each rule owns its case",
                        a.name, b.name
                    )),
                );
            }
        }
    }
    let skipped: Vec<usize> = (0..rules.len()).filter(|&i| skipped_rule[i]).collect();
    if let Some(&first) = skipped.first() {
        let mut names: Vec<String> = skipped
            .iter()
            .take(5)
            .map(|&i| format!("`{}`", rules[i].name))
            .collect();
        if skipped.len() > 5 {
            names.push(format!("{} more", skipped.len() - 5));
        }
        diags.push(
            Diagnostic::warning(
                "ichor::lint::not_analysed",
                rules[first].file,
                rules[first].span,
                format!(
                    "{} rule{} {} not fully checked for subsumption: {}",
                    skipped.len(),
                    if skipped.len() == 1 { "" } else { "s" },
                    if skipped.len() == 1 { "was" } else { "were" },
                    names.join(", ")
                ),
            )
            .label("not compared with every rule of its events")
            .help(format!(
                "comparing every pair of rules of the same events would cost more than {} evaluations (4,000,000 plus 5,000 per rule); fewer rules per event, or rules reading fewer facts, fit",
                subsumption_budget(rules.len())
            )),
        );
    }
}

/// Whether one of `a`'s witnesses shows that `b` does not fire where `a` does. Facts `b`
/// reads that the witness does not set take a value from their domain.
fn refuted_by_witness(b: &CheckedRule, witnesses: &[Witness<'_>]) -> bool {
    witnesses.iter().any(|w| {
        let mut get = |f: Fact| -> Result<Value<'_>, EvalError> {
            if let Some((_, v)) = w.iter().find(|(wf, _)| *wf == f) {
                return Ok(*v);
            }
            Ok(match f.info().ty {
                Type::Bool => Value::Bool(false),
                Type::Int => Value::Int(f.int_domain().first().copied().unwrap_or(0)),
                Type::Enum(_) | Type::Name => Value::Str(OTHER),
            })
        };
        let when = match &b.when {
            Some(e) => eval(e, &mut get),
            None => Ok(Value::Bool(true)),
        };
        let unless = match &b.unless {
            Some(e) => eval(e, &mut get),
            None => Ok(Value::Bool(false)),
        };
        !matches!(
            (when, unless),
            (Ok(Value::Bool(true)), Ok(Value::Bool(false)))
        )
    })
}

/// Whether rule `a` firing implies rule `b` firing, over the union of their facts; `None`
/// when that would cost more than is left of the budget (or too many combinations).
fn implies(
    a: &CheckedRule,
    b: &CheckedRule,
    shapes: &[Shape<'_>],
    ai: usize,
    bi: usize,
    sizes: &[usize],
    budget: &mut usize,
) -> Option<bool> {
    let mut facts = shapes[ai].facts.clone();
    for f in &shapes[bi].facts {
        if !facts.contains(f) {
            facts.push(*f);
        }
    }
    let mut literals = shapes[ai].literals.clone();
    for l in &shapes[bi].literals {
        if !literals.contains(l) {
            literals.push(l);
        }
    }
    let asg = Assignments::new(&facts, &literals)?;
    let cost = asg.total().saturating_mul(sizes[ai] + sizes[bi]);
    if cost > *budget {
        return None;
    }
    let mut a_fires_somewhere = false;
    for n in 0..asg.total() {
        let fa = match outcome(a, &asg, n) {
            Ok((_, _, f)) => f,
            Err(_) => {
                *budget -= (n + 1) * (sizes[ai] + sizes[bi]);
                return Some(false);
            }
        };
        if !fa {
            continue;
        }
        a_fires_somewhere = true;
        match outcome(b, &asg, n) {
            Ok((_, _, true)) => {}
            _ => {
                *budget -= (n + 1) * (sizes[ai] + sizes[bi]);
                return Some(false);
            }
        }
    }
    *budget -= cost;
    Some(a_fires_somewhere)
}

fn coverage(files: &[SourceFile], program: &Program, diags: &mut Vec<Diagnostic>) {
    if files.is_empty() {
        return;
    }
    let covered = |e: &Event| {
        program.allowed.contains(e) || program.rules.iter().any(|r| r.events.contains(e))
    };
    for (verb, subject, site) in RUNTIME_EVENTS {
        if !covered(&(*verb, *subject, *site)) {
            diags.push(
                Diagnostic::warning(
                    "ichor::lint::uncovered_event",
                    0,
                    Span::default(),
                    format!(
                        "no rule or `allow` covers `{} {}` at the {}",
                        verb.name(),
                        subject.name(),
                        site.name()
                    ),
                )
                .unlocated()
                .label("the runtime produces this")
                .help(format!(
                    "add a rule for it, or say `allow {} {} at {}` if nothing should constrain it",
                    verb.name(),
                    subject.name(),
                    site.name()
                )),
            );
        }
    }
}
