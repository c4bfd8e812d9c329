//! Lints on the resolved rules: conditions that are always or never true, exceptions that
//! never apply, divisions that can hit zero, rules subsumed by another rule of the same
//! verdict, and runtime events no rule or `allow` covers.
//!
//! Every claim holds for **every** value a real cluster can give the facts: counts have no
//! upper bound, `count` is one of 0, 1, 3, 5. The claims are decided exactly by
//! [`super::exact`] (linear integer arithmetic, Pugh's Omega test); a "can fail" claim
//! carries fact values that make it happen, and those values are checked by evaluating the
//! rule with the interpreter's own evaluator before the claim is made. A condition outside
//! what is decided (a product of two facts, a division by a fact other than `count`, a
//! comparison of two name facts), or too costly to decide, gets an
//! `ichor::lint::not_analysed` warning that says why, never a guess. Overflow is found by
//! ranges ([`super::arith`]), with counts up to [`arith::MAX_MACHINES`].

use super::arith::{self, Path};
use super::exact::{self, Budget, Model, OTHER, Part, QUESTION_BUDGET, Undecided, satisfiable};
use super::typed::{Typed, TypedPart, can_fail};
use super::{CheckedInvariant, CheckedPlan, CheckedRule, Event, Program};
use crate::diagnostics::{Code, Diagnostic, SourceFile};
use crate::syntax::ast::Message;
use crate::syntax::ast::{BinOp, Expr, ExprKind, Span};
use crate::value::{EvalError, Value, eval};
use crate::vocab::{Domain, Fact, RUNTIME_EVENTS, Type, Verdict};

/// The most fact combinations the fallback enumeration tries for one rule, looking for
/// concrete values that make a division the exact analysis does not decide fail.
pub const MAX_ASSIGNMENTS: usize = 100_000;

/// The most operand evaluations one such enumeration may cost.
pub const MAX_WORK: usize = 4_000_000;

/// The steps all subsumption questions together may cost: a base, plus an allowance per
/// rule, so `check` stays linear in the number of rules.
fn subsumption_budget(rules: usize) -> usize {
    400_000 + 500 * rules
}

/// Which lints run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lints {
    /// Every lint: what `check` reports.
    All,
    /// What a server needs to decide whether a table may serve: the arithmetic that can
    /// fail (an error) and the coverage of the runtime's events (a reload refuses an
    /// uncovered one). The exact analyses that only warn (a rule that never fires, one that
    /// subsumes another, an `allow` a rule contradicts) are `check`'s.
    Serving,
}

pub(super) fn run(
    files: &[SourceFile],
    program: &Program,
    diags: &mut Vec<Diagnostic>,
    which: Lints,
) {
    let analyses: Vec<Analysis<'_>> = program
        .rules
        .iter()
        .map(|rule| lint_rule(rule, diags, which))
        .collect();
    for rule in &program.rules {
        lint_placeholders(rule, diags);
    }
    for plan in &program.plans {
        lint_plan(plan, diags);
    }
    for inv in &program.invariants {
        lint_invariant(inv, diags);
    }
    if which == Lints::All {
        subsumption(files, program, &analyses, diags);
        allow_contradicted(files, program, diags);
        audit_destructive(files, program, diags);
    }
    coverage(files, program, diags);
}

/// An `allow` says on purpose that nothing constrains its events; a rule on one of them
/// says the opposite. One of the two is wrong. A warning, not an error: the runtime's
/// behaviour is well defined (the rule is enforced, the `allow` only silences the
/// coverage lint), and the stricter side is the one in force; `--deny-warnings` fails CI.
/// A rule in audit mode contradicts nothing: it enforces nothing, and staging a rule on an
/// event an `allow` leaves open is what audit mode is for.
fn allow_contradicted(files: &[SourceFile], program: &Program, diags: &mut Vec<Diagnostic>) {
    for allow in &program.allows {
        for rule in program.rules.iter().filter(|r| !r.audit) {
            let both: Vec<&Event> = allow
                .events
                .iter()
                .filter(|e| rule.events.contains(e))
                .collect();
            if both.is_empty() {
                continue;
            }
            let events: Vec<String> = both
                .iter()
                .map(|(verb, subject, site)| {
                    format!(
                        "`{} {}` at the {}",
                        verb.name(),
                        subject.name(),
                        site.name()
                    )
                })
                .collect();
            let keep: Vec<String> = allow
                .events
                .iter()
                .filter(|e| !rule.events.contains(e))
                .map(|(verb, subject, site)| {
                    format!(
                        "`allow {} {} at {}`",
                        verb.name(),
                        subject.name(),
                        site.name()
                    )
                })
                .collect();
            diags.push(
                Diagnostic::warning(
                    Code::AllowContradicted,
                    allow.file,
                    allow.span,
                    format!(
                        "this `allow` says nothing constrains {}, but rule `{}` does",
                        events.join(", "),
                        rule.name
                    ),
                )
                .label(format!("contradicted by `{}`", rule.name))
                .secondary(
                    rule.file,
                    super::first_line(files, rule.file, rule.span),
                    format!("`{}` constrains it", rule.name),
                )
                .help(if keep.is_empty() {
                    format!(
                        "remove the `allow` if `{}` is meant, or remove the rule",
                        rule.name
                    )
                } else {
                    format!(
                        "narrow the `allow` to the events no rule constrains ({}), or remove the rule",
                        keep.join(", ")
                    )
                }),
            );
        }
    }
}

/// What the lints learnt of one rule.
enum Analysis<'a> {
    /// Decided: fact values under which it fires, or `None` when it never does.
    Fires(Option<Model<'a>>),
    /// Not decided: its arithmetic can fail, or it is outside what is decided (a warning
    /// already says so).
    Unknown,
}

/// The value a fact takes where a model does not say (the model's claim does not depend
/// on it): a real value of the fact's range.
fn default_value(f: Fact) -> Value<'static> {
    match f.info().ty {
        Type::Bool => Value::Bool(false),
        Type::Int => Value::Int(0),
        Type::Enum(_) | Type::Name => Value::Str(OTHER),
    }
}

/// Evaluates `e` with the facts of `m`.
fn eval_in<'a>(e: &'a Expr, m: &[(Fact, Value<'a>)]) -> Result<Value<'a>, EvalError> {
    let mut get = |f: Fact| {
        Ok(m.iter()
            .find(|(g, _)| *g == f)
            .map_or_else(|| default_value(f), |(_, v)| *v))
    };
    eval(e, &mut get)
}

/// Whether a rule with these conditions fires under `m`, evaluated as the table does:
/// the `when`, then the `unless` where the `when` holds.
fn fires_in<'a>(
    when: Option<&'a Expr>,
    unless: Option<&'a Expr>,
    m: &[(Fact, Value<'a>)],
) -> Result<bool, EvalError> {
    if let Some(w) = when
        && eval_in(w, m)? != Value::Bool(true)
    {
        return Ok(false);
    }
    match unless {
        Some(u) => Ok(eval_in(u, m)? != Value::Bool(true)),
        None => Ok(true),
    }
}

/// The parts saying a rule fires (`true`) or does not.
fn fires<'a>(rule: &'a CheckedRule, yes: bool) -> Part<'a> {
    Part::Fires(rule.when.as_ref(), rule.unless.as_ref(), yes)
}

/// Fact values in words: `workers = 12, count = 0`.
fn describe(m: &[(Fact, Value<'_>)]) -> String {
    let mut parts: Vec<String> = m
        .iter()
        .map(|(f, v)| format!("{f} = {}", show(*v)))
        .collect();
    parts.sort();
    if parts.is_empty() {
        "always".to_string()
    } else {
        format!("when {}", parts.join(", "))
    }
}

/// Why a question was not decided, in words.
fn undecided_why(u: &Undecided) -> String {
    match u {
        Undecided::Outside(what) => {
            format!("{what}, outside the linear integer arithmetic `check` decides exactly")
        }
        Undecided::TooComplex => {
            format!("deciding it would take more than {QUESTION_BUDGET} steps")
        }
    }
}

/// Every `/` and `%` in `e`, with the conditions under which evaluation reaches it
/// (`and` and `or` short-circuit, left to right).
type Reached<'e> = Vec<(Vec<(&'e Expr, bool)>, &'e Expr)>;

fn divisions<'e>(e: &'e Expr, path: &mut Vec<(&'e Expr, bool)>, out: &mut Reached<'e>) {
    match &e.kind {
        ExprKind::Binary(op @ (BinOp::And | BinOp::Or), l, r) => {
            divisions(l, path, out);
            path.push((l, *op == BinOp::And));
            divisions(r, path, out);
            path.pop();
        }
        ExprKind::Binary(op, l, r) => {
            // A division by a constant other than 0 (`approved / 2`) cannot divide by zero:
            // no question to ask of the solver.
            if matches!(op, BinOp::Div | BinOp::Mod)
                && !matches!(r.kind, ExprKind::Int(k) if k != 0)
            {
                out.push((path.clone(), e));
            }
            divisions(l, path, out);
            divisions(r, path, out);
        }
        ExprKind::Unary(_, i) => divisions(i, path, out),
        _ => {}
    }
}

/// Whether evaluating `e` where every part of `prefix` holds can divide by zero.
enum DivCheck<'a> {
    Safe,
    /// It can: the division, and fact values that make it fail (checked by evaluation).
    Fails(Span, Model<'a>),
    /// Not decided: why.
    Undecided(String),
}

/// Whether the parts hold under `m`, evaluated.
fn holds<'a>(prefix: &[Part<'a>], m: &[(Fact, Value<'a>)]) -> bool {
    prefix.iter().all(|p| match p {
        Part::Truth(x, t) => eval_in(x, m) == Ok(Value::Bool(*t)),
        Part::Fires(w, u, f) => fires_in(*w, *u, m) == Ok(*f),
        Part::Zero(x) => eval_in(x, m) == Ok(Value::Int(0)),
    })
}

fn division_by_zero<'a>(prefix: &[Part<'a>], e: &'a Expr, budget: &mut Budget) -> DivCheck<'a> {
    let mut found = Vec::new();
    divisions(e, &mut Vec::new(), &mut found);
    let mut undecided = None;
    for (path, div) in found {
        let ExprKind::Binary(_, _, divisor) = &div.kind else {
            continue;
        };
        let mut parts = prefix.to_vec();
        parts.extend(path.iter().map(|(c, t)| Part::Truth(c, *t)));
        parts.push(Part::Zero(divisor));
        match satisfiable(&parts, budget) {
            Ok(None) => {}
            Ok(Some(m)) => {
                if holds(prefix, &m) && eval_in(e, &m) == Err(EvalError::DivisionByZero) {
                    return DivCheck::Fails(div.span, m);
                }
                // Values the evaluator does not confirm (an overflow on the way): no claim.
                undecided.get_or_insert_with(|| {
                    format!("whether `{div}` can divide by zero is not decided")
                });
            }
            Err(u) => {
                // A candidate from a relaxed question, confirmed by evaluation.
                if let Ok(Some(m)) = exact::candidate(&parts, budget)
                    && holds(prefix, &m)
                    && eval_in(e, &m) == Err(EvalError::DivisionByZero)
                {
                    return DivCheck::Fails(div.span, m);
                }
                // Ranges: sound for "cannot fail".
                let path_refs: Vec<(&Expr, bool)> = prefix_path(prefix)
                    .into_iter()
                    .chain(path.iter().copied())
                    .collect();
                if arith::analyse(&path_refs, &[div])
                    .iter()
                    .all(|f| f.error != EvalError::DivisionByZero || f.span != div.span)
                {
                    continue;
                }
                if let Some(m) = enumerate_failure(prefix, e) {
                    return DivCheck::Fails(div.span, m);
                }
                undecided.get_or_insert_with(|| {
                    format!(
                        "whether `{div}` can divide by zero is not decided ({})",
                        undecided_why(&u)
                    )
                });
            }
        }
    }
    match undecided {
        Some(why) => DivCheck::Undecided(why),
        None => DivCheck::Safe,
    }
}

/// The prefix as conditions and their truth, for the range analysis (`Fires` parts as
/// their `when` and `unless`).
fn prefix_path<'a>(prefix: &[Part<'a>]) -> Vec<(&'a Expr, bool)> {
    let mut out = Vec::new();
    for p in prefix {
        match p {
            Part::Truth(e, t) => out.push((*e, *t)),
            Part::Fires(w, u, true) => {
                out.extend(w.iter().map(|w| (*w, true)));
                out.extend(u.iter().map(|u| (*u, false)));
            }
            _ => {}
        }
    }
    out
}

/// Concrete values, from small domains, under which the prefix holds and `e` divides by
/// zero: a claim backed by an example, for divisions the exact analysis does not decide.
fn enumerate_failure<'a>(prefix: &[Part<'a>], e: &'a Expr) -> Option<Model<'a>> {
    let mut shape = Shape {
        facts: Vec::new(),
        literals: Vec::new(),
    };
    for p in prefix {
        match p {
            Part::Truth(x, _) | Part::Zero(x) => shape.collect(x),
            Part::Fires(w, u, _) => {
                for x in w.iter().chain(u.iter()) {
                    shape.collect(x);
                }
            }
        }
    }
    shape.collect(e);
    let a = Assignments::within_work(&shape.facts, &shape.literals, 4 * size_of(e))?;
    for n in 0..a.total() {
        let m: Model<'a> = a
            .facts
            .iter()
            .filter_map(|f| a.value(n, *f).ok().map(|v| (*f, v)))
            .collect();
        if holds(prefix, &m) && eval_in(e, &m) == Err(EvalError::DivisionByZero) {
            return Some(m);
        }
    }
    None
}

/// Fact domains for the fallback enumeration: real values (the vocabulary's domain, an
/// unbounded count cut at 8), so what it finds is real.
fn small_int_domain(f: Fact) -> &'static [i64] {
    match f.info().domain {
        Domain::Values(values) => values,
        Domain::Natural | Domain::Bool | Domain::Text => &[0, 1, 2, 3, 4, 5, 6, 7, 8],
    }
}

/// The facts a rule reads and the text literals it compares them with.
struct Shape<'a> {
    facts: Vec<Fact>,
    literals: Vec<&'a str>,
}

impl<'a> Shape<'a> {
    fn collect(&mut self, e: &'a Expr) {
        e.walk(&mut |e| match &e.kind {
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
            _ => {}
        });
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
                Type::Int => small_int_domain(*f)
                    .iter()
                    .map(|i| Value::Int(*i))
                    .collect(),
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

/// The warning for a rule the exact lints could not decide.
fn not_analysed(rule: &CheckedRule, why: String) -> Diagnostic {
    Diagnostic::warning(
        Code::NotAnalysed,
        rule.file,
        rule.when.as_ref().map_or(rule.span, |w| w.span),
        format!(
            "`{}` was not checked for conditions that are always or never true, nor for subsumption: {why}",
            rule.name
        ),
    )
    .label("not analysed")
    .help("write the condition with sums, differences and constant multiples of facts (divide by constants or `count` only), or split the rule; its overflow was still checked, by ranges")
}

fn lint_rule<'a>(rule: &'a CheckedRule, diags: &mut Vec<Diagnostic>, which: Lints) -> Analysis<'a> {
    let mut budget = Budget::new(QUESTION_BUDGET);
    // Arithmetic first: where it can fail, the rule's truth is not a question of values.
    let mut sites: Vec<(Vec<Part<'a>>, &'a Expr)> = Vec::new();
    if let Some(w) = &rule.when {
        sites.push((Vec::new(), w));
    }
    if let Some(u) = &rule.unless {
        sites.push((rule.when.iter().map(|w| Part::Truth(w, true)).collect(), u));
    }
    let mut undecided = None;
    for (prefix, e) in &sites {
        match division_by_zero(prefix, e, &mut budget) {
            DivCheck::Safe => {}
            DivCheck::Fails(span, m) => {
                diags.push(
                    Diagnostic::error(
                        Code::Arithmetic,
                        rule.file,
                        span,
                        format!(
                            "`{}` can fail with {}",
                            rule.name,
                            EvalError::DivisionByZero
                        ),
                    )
                    .label(describe(&m))
                    .help("guard the division, e.g. `count > 0 and approved / count ...`"),
                );
                return Analysis::Unknown;
            }
            DivCheck::Undecided(why) => {
                undecided.get_or_insert(why);
            }
        }
    }
    let before = diags.len();
    lint_rule_by_ranges_overflow(rule, diags);
    if diags.len() > before {
        return Analysis::Unknown;
    }
    if let Some(why) = undecided {
        diags.push(not_analysed(rule, why));
        return Analysis::Unknown;
    }
    if which == Lints::Serving {
        return Analysis::Unknown;
    }
    match truth(rule, &mut budget) {
        Ok(t) => {
            t.report(rule, diags);
            Analysis::Fires(t.fires)
        }
        Err(u) => {
            diags.push(not_analysed(rule, undecided_why(&u)));
            Analysis::Unknown
        }
    }
}

/// The answers the truth lints need, all decided before any is reported.
struct Truth<'a> {
    /// Values where the `when` holds (`Some(vec![])` without a `when`).
    when: Option<Model<'a>>,
    /// Whether the `when` is always true (false without a `when`).
    always: bool,
    /// Values where the rule fires.
    fires: Option<Model<'a>>,
    /// Values where the `when` and the `unless` both hold (`None`: never, or no `unless`).
    unless_bites: Option<bool>,
}

fn truth<'a>(rule: &'a CheckedRule, budget: &mut Budget) -> Result<Truth<'a>, Undecided> {
    let when = match &rule.when {
        Some(w) => satisfiable(&[Part::Truth(w, true)], budget)?,
        None => Some(Vec::new()),
    };
    let always = match &rule.when {
        Some(w) => satisfiable(&[Part::Truth(w, false)], budget)?.is_none(),
        None => false,
    };
    let fires = match &rule.unless {
        None => when.clone(),
        Some(_) if when.is_none() => None,
        Some(_) => satisfiable(&[fires(rule, true)], budget)?,
    };
    let unless_bites = match (&rule.unless, &when) {
        (Some(u), Some(_)) => {
            let mut parts: Vec<Part<'a>> = rule.when.iter().map(|w| Part::Truth(w, true)).collect();
            parts.push(Part::Truth(u, true));
            Some(satisfiable(&parts, budget)?.is_some())
        }
        _ => None,
    };
    Ok(Truth {
        when,
        always,
        fires,
        unless_bites,
    })
}

impl Truth<'_> {
    fn report(&self, rule: &CheckedRule, diags: &mut Vec<Diagnostic>) {
        if let (Some(e), true) = (&rule.when, self.always) {
            diags.push(
                Diagnostic::warning(
                    Code::AlwaysTrue,
                    rule.file,
                    e.span,
                    format!("the condition of `{}` is always true", rule.name),
                )
                .label("true for every value of its facts")
                .help("drop the `when`, or fix the comparison"),
            );
        } else if self.fires.is_none() {
            let span = rule.when.as_ref().map(|e| e.span).unwrap_or(rule.span);
            diags.push(
                Diagnostic::warning(
                    Code::NeverTrue,
                    rule.file,
                    span,
                    format!("`{}` can never {}", rule.name, rule.verdict),
                )
                .label(match &self.when {
                    None => "false for every value of its facts".to_string(),
                    Some(m) => format!(
                        "its `unless` holds whenever this does (this holds e.g. {})",
                        describe(m)
                    ),
                })
                .help("fix the condition, or remove the rule"),
            );
        }
        if let (Some(e), Some(false)) = (&rule.unless, self.unless_bites) {
            diags.push(
                Diagnostic::warning(
                    Code::UnlessNever,
                    rule.file,
                    e.span,
                    format!("the exception of `{}` never applies", rule.name),
                )
                .label("never true while the `when` holds")
                .help("drop the `unless`, or fix it"),
            );
        }
    }
}

/// A message's placeholders are evaluated whenever the rule fires: where it fires, none
/// may divide by zero or overflow (it would read `<division by zero>` in a refusal).
fn lint_placeholders(rule: &CheckedRule, diags: &mut Vec<Diagnostic>) {
    let placeholders = failing_placeholders(&rule.message, rule.typed.message.as_deref());
    if placeholders.is_empty() {
        return;
    }
    let mut budget = Budget::new(QUESTION_BUDGET);
    let prefix = [fires(rule, true)];
    for e in &placeholders {
        match division_by_zero(&prefix, e, &mut budget) {
            DivCheck::Safe => {}
            DivCheck::Fails(span, m) => {
                diags.push(
                    Diagnostic::error(
                        Code::Arithmetic,
                        rule.file,
                        span,
                        format!(
                            "the message of `{}` can fail with {}",
                            rule.name,
                            EvalError::DivisionByZero
                        ),
                    )
                    .label(describe(&m))
                    .help(
                        "compute it without the division, or guard the rule so it cannot fire then",
                    ),
                );
                return;
            }
            DivCheck::Undecided(why) => {
                diags.push(
                    Diagnostic::warning(
                        Code::NotAnalysed,
                        rule.file,
                        e.span,
                        format!("the message of `{}` was not checked for division by zero: {why}", rule.name),
                    )
                    .label("not analysed")
                    .help("divide by constants or `count` only, or guard the division in the rule's condition"),
                );
                return;
            }
        }
    }
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
    Diagnostic::error(Code::Arithmetic, file, f.span, message)
        .label(f.why.clone())
        .help(help)
}

/// The operands and operators of an expression.
fn size_of(e: &Expr) -> usize {
    e.size()
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
        // The guards the checker annotated as able to fail (an unannotated one is analysed).
        let fails = |e: Option<&Typed>| e.is_none_or(|t| t.info.can_fail);
        let path: PathOf<'_> = step
            .when
            .iter()
            .map(|w| (w, true))
            .chain(step.unless.iter().map(|u| (u, false)))
            .collect();
        let guards: Vec<(PathOf<'_>, &Expr, &str)> = step
            .when
            .iter()
            .filter(|_| fails(step.typed.when.as_ref()))
            .chain(
                step.unless
                    .iter()
                    .filter(|_| fails(step.typed.unless.as_ref())),
            )
            .map(|e| (Vec::new(), e, "guard"))
            .chain(step.message.iter().flat_map(|m| {
                failing_placeholders(m, step.typed.message.as_deref())
                    .into_iter()
                    .map(|e| (path.clone(), e, "message"))
            }))
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

/// An invariant that cannot be evaluated in a state is reported violated there (`verify`
/// fails closed), which says nothing about the rules: its arithmetic is checked like a
/// rule's. `when` anywhere, `unless` where `when` holds, `ensure` where `when` holds and
/// `unless` does not, and the message where `ensure` does not hold either. The model's
/// facts are counts: a name the analysis does not know ranges over every value.
fn lint_invariant(inv: &CheckedInvariant, diags: &mut Vec<Diagnostic>) {
    let when: Vec<(&Expr, bool)> = inv.when.iter().map(|w| (w, true)).collect();
    let mut scope = when.clone();
    scope.extend(inv.unless.iter().map(|u| (u, false)));
    let mut failing = scope.clone();
    failing.push((&inv.ensure, false));
    let mut parts: Vec<(&Path<'_>, &Expr, &str)> = Vec::new();
    parts.extend(inv.when.iter().map(|w| (&[][..], w, "`when`")));
    parts.extend(inv.unless.iter().map(|u| (&when[..], u, "`unless`")));
    parts.push((&scope[..], &inv.ensure, "`ensure`"));
    if let Some(m) = &inv.message {
        for p in &m.parts {
            if let crate::syntax::ast::MessagePart::Placeholder(e) = p {
                parts.push((&failing[..], e, "message"));
            }
        }
    }
    for (path, e, what) in parts {
        if !can_fail(e) {
            continue;
        }
        if let Some(f) = arith::analyse(path, &[e]).into_iter().next() {
            diags.push(range_error(
                inv.file,
                &f,
                format!(
                    "the {what} of invariant `{}` can fail with {}",
                    inv.name, f.error
                ),
                "guard the division (`members > 0 and healthy * 2 / members ...`), or compute it without one: \
                 an invariant that cannot be evaluated is reported violated",
            ));
            return;
        }
    }
}

/// A message's placeholders that the checker annotated as able to fail (all of them when
/// the annotations do not line up with the message, which the checker never produces).
fn failing_placeholders<'m>(m: &'m Message, typed: Option<&[TypedPart]>) -> Vec<&'m Expr> {
    let placeholders = m.parts.iter().filter_map(|p| match p {
        crate::syntax::ast::MessagePart::Placeholder(e) => Some(e),
        crate::syntax::ast::MessagePart::Text(_) => None,
    });
    match typed.filter(|t| t.len() == m.parts.len()) {
        Some(t) => placeholders
            .zip(t.iter().filter_map(|p| match p {
                TypedPart::Value(v) => Some(v),
                TypedPart::Text(_) => None,
            }))
            .filter(|(_, t)| t.info.can_fail)
            .map(|(e, _)| e)
            .collect(),
        None => placeholders.collect(),
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
    analyses: &[Analysis<'_>],
    diags: &mut Vec<Diagnostic>,
) {
    let rules = &program.rules;
    let bits: Vec<u64> = rules.iter().map(event_bits).collect();
    let sizes: Vec<usize> = rules.iter().map(rule_size).collect();
    let mut budget = Budget::new(subsumption_budget(rules.len()));
    // Per rule, whether a comparison of it was left undecided (a flag per rule, not an
    // entry per pair: memory stays linear).
    let mut skipped_rule = vec![false; rules.len()];
    // Whether rule `a` firing implies rule `b` firing, for every value of the facts. A rule
    // that never fires implies everything vacuously; this says no for it.
    let mut implies = |a: usize, b: usize| {
        let Analysis::Fires(Some(witness)) = &analyses[a] else {
            return false;
        };
        if matches!(analyses[b], Analysis::Unknown) {
            return false;
        }
        let (ra, rb) = (&rules[a], &rules[b]);
        // Where `a` is known to fire, `b` does not: not subsumed, at the cost of one evaluation.
        if budget.left < sizes[b] {
            skipped_rule[a] = true;
            return false;
        }
        budget.left -= sizes[b];
        if fires_in(rb.when.as_ref(), rb.unless.as_ref(), witness) == Ok(false) {
            return false;
        }
        match satisfiable(&[fires(ra, true), fires(rb, false)], &mut budget) {
            Ok(Some(_)) => false,
            Ok(None) => true,
            Err(_) => {
                skipped_rule[a] = true;
                false
            }
        }
    };
    for (i, a) in rules.iter().enumerate() {
        for (j, b) in rules.iter().enumerate() {
            // A rule in audit mode decides nothing, so it makes no other rule redundant (a
            // staged rule subsumed by an enforced one is still reported).
            if i == j
                || b.audit
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
                diags.push(
                    Diagnostic::warning(
                        Code::Subsumed,
                        a.file,
                        a.span,
                        format!(
                            "`{}` is subsumed by `{}`: whenever it would {}, `{}` does too",
                            a.name, b.name, a.verdict, b.name
                        ),
                    )
                    .label(format!("never decides anything `{}` does not", b.name))
                    .secondary(
                        b.file,
                        super::first_line(files, b.file, b.span),
                        format!("`{}` decides it already", b.name),
                    )
                    .help(format!(
                        "remove `{}`, or narrow `{}` so each rule owns its case",
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
                Code::NotAnalysed,
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
                "comparing every pair of rules of the same events would cost more than {} steps (400,000 plus 500 per rule); fewer rules per event, or rules reading fewer facts, fit",
                subsumption_budget(rules.len())
            )),
        );
    }
}

/// The first destructive event of a rule's `events`, with its conditions' text: a control
/// plane removed or leaving (`remove`, `unapprove`, `reassign`, `move`), or an operation
/// the conditions do not narrow to kinds other than `reset` (they do not read `kind`, or
/// name `"reset"`). What [`Code::AuditDestructive`] warns of for a `refuse` in audit mode,
/// and what a reload warns of for a rule the deployment switches to audit
/// (`compile::Table::audit_destructive`).
pub fn destructive_event(
    events: impl IntoIterator<Item = (crate::vocab::Verb, crate::vocab::Subject)>,
    when: Option<&str>,
    unless: Option<&str>,
) -> Option<(crate::vocab::Verb, crate::vocab::Subject)> {
    use crate::vocab::{Subject, Verb};
    let conditions = format!("{} {}", when.unwrap_or(""), unless.unwrap_or(""));
    let may_reset = !conditions.contains("kind") || conditions.contains("\"reset\"");
    events.into_iter().find(|(verb, subject)| match subject {
        Subject::ControlPlane => matches!(
            verb,
            Verb::Remove | Verb::Unapprove | Verb::Reassign | Verb::Move
        ),
        Subject::Operation => may_reset,
        _ => false,
    })
}

/// A `refuse` in audit mode on a destructive event: a control plane removed or leaving
/// (`remove`, `unapprove`, `reassign`, `move`), or an operation the rule does not narrow
/// to kinds other than `reset` (its conditions do not read `kind`, or name `"reset"`). The
/// safety rules themselves shipped in audit mode would refuse nothing; staging a new one
/// is what audit mode is for, so a warning, not an error.
fn audit_destructive(files: &[SourceFile], program: &Program, diags: &mut Vec<Diagnostic>) {
    for rule in program
        .rules
        .iter()
        .filter(|r| r.audit && r.verdict == Verdict::Refuse)
    {
        let destructive = destructive_event(
            rule.events
                .iter()
                .map(|(verb, subject, _)| (*verb, *subject)),
            rule.when_text.as_deref(),
            rule.unless_text.as_deref(),
        );
        let Some((verb, subject)) = destructive else {
            continue;
        };
        diags.push(
            Diagnostic::warning(
                Code::AuditDestructive,
                rule.file,
                super::first_line(files, rule.file, rule.span),
                format!(
                    "rule `{}` refuses `{} {}` in audit mode: it is recorded, and refuses nothing",
                    rule.name,
                    verb.name(),
                    subject.name()
                ),
            )
            .label("in audit mode")
            .help(
                "remove `audit` once its would-be refusals (`ichor_rules_would_refuse_total`, the decision records) are the ones you want, or enforce it from the chart (`rules.enforce`)",
            ),
        );
    }
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
                    Code::UncoveredEvent,
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
