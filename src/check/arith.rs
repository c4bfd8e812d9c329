//! Can this arithmetic fail? Decided two ways, both here:
//!
//! - [`can_fail`](super::typed::can_fail): whether an expression does anything that can
//!   fail at all (integer arithmetic, negation included), one of the annotations of
//!   [`Typed`](super::typed::Typed). The compiler reads it before it reorders operands;
//!   the lints read it to know what to analyse.
//! - [`analyse`]: interval reasoning over the facts' ranges, along the path that reaches
//!   each operation (`count > 0 and approved / count > 1` divides only where `count` is at
//!   least 1). It scales to any number of facts, and is sound: an operation it passes can
//!   never fail at run time; one it flags may fail for some values in the facts' ranges
//!   (the lints confirm those by enumeration where the facts are few enough).

use crate::syntax::ast::{BinOp, Expr, ExprKind, Span, UnOp};
use crate::value::EvalError;
use crate::vocab::{Fact, Type};

/// The most machines (control planes, workers) a cluster is assumed to have, for the
/// ranges of the counting facts.
pub const MAX_MACHINES: i64 = 1 << 20;

/// An integer range, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub lo: i128,
    pub hi: i128,
}

impl Range {
    fn new(lo: i128, hi: i128) -> Range {
        Range { lo, hi }
    }

    fn point(k: i64) -> Range {
        Range::new(i128::from(k), i128::from(k))
    }

    fn contains(self, k: i128) -> bool {
        self.lo <= k && k <= self.hi
    }

    fn meet(self, o: Range) -> Option<Range> {
        let r = Range::new(self.lo.max(o.lo), self.hi.min(o.hi));
        (r.lo <= r.hi).then_some(r)
    }

    fn hull(self, o: Range) -> Range {
        Range::new(self.lo.min(o.lo), self.hi.max(o.hi))
    }

    fn fits(self) -> bool {
        self.lo >= i128::from(i64::MIN) && self.hi <= i128::from(i64::MAX)
    }

    fn clamp(self) -> Range {
        let (min, max) = (i128::from(i64::MIN), i128::from(i64::MAX));
        Range::new(self.lo.clamp(min, max), self.hi.clamp(min, max))
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{} to {}", self.lo, self.hi)
        }
    }
}

/// The range of an int fact at run time.
pub fn fact_range(f: Fact) -> Range {
    match f {
        // spec.controlPlane.count: 1, 3 or 5, and 0 when the cluster is missing.
        Fact::Count => Range::new(0, 5),
        _ => Range::new(0, i128::from(MAX_MACHINES)),
    }
}

/// An operation that may fail, with the range that makes it fail.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub span: Span,
    pub error: EvalError,
    /// Why, in words: "`count` can be 0 (it ranges over 0 to 5)".
    pub why: String,
}

/// What the analysis knows of a value.
#[derive(Clone, Copy, Debug)]
enum Abs {
    Int(Range),
    /// Whether it can be true, and whether it can be false.
    Bool(bool, bool),
    Text,
}

/// What holds on the path to an operation: narrowed ranges of facts and expressions.
#[derive(Clone, Debug, Default)]
struct Env<'e> {
    narrowed: Vec<(&'e Expr, Range)>,
}

/// How many narrowing steps one analysis may take (alternating `and`/`or` can make
/// narrowing exponential); past it, conditions stop narrowing, which only ever adds
/// findings, never hides one.
const NARROWING_BUDGET: usize = 20_000;

struct Analysis {
    findings: Vec<Finding>,
    budget: usize,
}

/// A condition an operation is reached under: the expression, and whether it holds.
pub type Path<'e> = [(&'e Expr, bool)];

/// The operations in `exprs` that may fail when evaluated where every condition of `path`
/// has its truth value (evaluation is left to right, `and`/`or` short-circuit).
pub fn analyse(path: &Path<'_>, exprs: &[&Expr]) -> Vec<Finding> {
    let mut a = Analysis {
        findings: Vec::new(),
        budget: NARROWING_BUDGET,
    };
    let mut env = Some(Env::default());
    for (cond, truth) in path {
        env = env.and_then(|env| a.narrow(cond, *truth, &env));
    }
    // A path that cannot be taken reaches nothing.
    if let Some(env) = env {
        for e in exprs {
            a.eval(e, &env);
        }
    }
    a.findings
}

/// Structural equality, spans ignored (inlined `let`s are equal wherever they are used).
fn same(a: &Expr, b: &Expr) -> bool {
    match (&a.kind, &b.kind) {
        (ExprKind::Int(x), ExprKind::Int(y)) => x == y,
        (ExprKind::Bool(x), ExprKind::Bool(y)) => x == y,
        (ExprKind::Str(x, _), ExprKind::Str(y, _)) => x == y,
        (ExprKind::Name(x), ExprKind::Name(y)) => x == y,
        (ExprKind::Unary(o, x), ExprKind::Unary(p, y)) => o == p && same(x, y),
        (ExprKind::Binary(o, xl, xr), ExprKind::Binary(p, yl, yr)) => {
            o == p && same(xl, yl) && same(xr, yr)
        }
        _ => false,
    }
}

fn describe(e: &Expr) -> String {
    let text = e.to_string();
    if text.len() > 60 {
        "the operand".to_string()
    } else {
        format!("`{text}`")
    }
}

impl Analysis {
    fn found(&mut self, span: Span, error: EvalError, why: String) {
        if !self.findings.iter().any(|f| f.span == span) {
            self.findings.push(Finding { span, error, why });
        }
    }

    /// The range of an int expression without recording findings (for narrowing).
    fn range(&mut self, e: &Expr, env: &Env<'_>) -> Option<Range> {
        let saved = self.findings.len();
        let r = match self.eval(e, env) {
            Abs::Int(r) => Some(r),
            _ => None,
        };
        self.findings.truncate(saved);
        r
    }

    fn eval(&mut self, e: &Expr, env: &Env<'_>) -> Abs {
        let v = self.eval_plain(e, env);
        if let Abs::Int(r) = v
            && let Some((_, n)) = env.narrowed.iter().rev().find(|(x, _)| same(x, e))
        {
            return Abs::Int(r.meet(*n).unwrap_or(r));
        }
        v
    }

    fn eval_plain(&mut self, e: &Expr, env: &Env<'_>) -> Abs {
        match &e.kind {
            ExprKind::Int(k) => Abs::Int(Range::point(*k)),
            ExprKind::Bool(b) => Abs::Bool(*b, !*b),
            ExprKind::Str(..) => Abs::Text,
            ExprKind::Name(n) => match Fact::lookup(n).map(|f| (f, f.info().ty)) {
                Some((f, Type::Int)) => Abs::Int(fact_range(f)),
                Some((_, Type::Bool)) => Abs::Bool(true, true),
                Some(_) => Abs::Text,
                // An invariant's names are the model's facts: its ints are counts (of
                // machines, members, operations, a rank) within the model's bounds.
                None => match crate::vocab::ModelFact::lookup(n).map(|f| f.info().ty) {
                    Some(Type::Int) => Abs::Int(Range::new(0, i128::from(MAX_MACHINES))),
                    Some(Type::Bool) => Abs::Bool(true, true),
                    Some(_) => Abs::Text,
                    // Every name is a fact once `let`s are inlined; anything else may be
                    // anything.
                    None => Abs::Int(Range::new(i128::from(i64::MIN), i128::from(i64::MAX))),
                },
            },
            ExprKind::Unary(UnOp::Not, i) => match self.eval(i, env) {
                Abs::Bool(t, f) => Abs::Bool(f, t),
                other => other,
            },
            ExprKind::Unary(UnOp::Neg, i) => match self.eval(i, env) {
                Abs::Int(r) => {
                    let out = Range::new(-r.hi, -r.lo);
                    if !out.fits() {
                        self.found(
                            e.span,
                            EvalError::Overflow,
                            format!("past 64 bits: {} ranges over {r}", describe(i)),
                        );
                    }
                    Abs::Int(out.clamp())
                }
                other => other,
            },
            ExprKind::Binary(op @ (BinOp::And | BinOp::Or), l, r) => {
                let and = *op == BinOp::And;
                let (lt, lf) = match self.eval(l, env) {
                    Abs::Bool(t, f) => (t, f),
                    _ => (true, true),
                };
                // The right side runs only when the left did not decide.
                let goes_on = if and { lt } else { lf };
                let (rt, rf) = if goes_on {
                    match self.narrow(l, and, env) {
                        Some(env) => match self.eval(r, &env) {
                            Abs::Bool(t, f) => (t, f),
                            _ => (true, true),
                        },
                        None => (false, false),
                    }
                } else {
                    (false, false)
                };
                if and {
                    (lt && rt, lf || rf)
                } else {
                    (lt || rt, lf && rf)
                }
                .into_bool()
            }
            ExprKind::Binary(op, l, r) => {
                let (a, b) = (self.eval(l, env), self.eval(r, env));
                match (a, b) {
                    (Abs::Int(a), Abs::Int(b)) => self.binary(*op, a, b, l, r, e.span),
                    _ => Abs::Bool(true, true),
                }
            }
        }
    }

    fn binary(&mut self, op: BinOp, a: Range, b: Range, l: &Expr, r: &Expr, span: Span) -> Abs {
        let corners = |f: fn(i128, i128) -> i128| {
            let c = [f(a.lo, b.lo), f(a.lo, b.hi), f(a.hi, b.lo), f(a.hi, b.hi)];
            Range::new(
                c.iter().copied().min().unwrap_or(0),
                c.iter().copied().max().unwrap_or(0),
            )
        };
        let checked = |this: &mut Self, out: Range| {
            if !out.fits() {
                this.found(
                    span,
                    EvalError::Overflow,
                    format!(
                        "past 64 bits when {} ranges over {a} and {} over {b}",
                        describe(l),
                        describe(r)
                    ),
                );
            }
            Abs::Int(out.clamp())
        };
        match op {
            BinOp::Add => checked(self, Range::new(a.lo + b.lo, a.hi + b.hi)),
            BinOp::Sub => checked(self, Range::new(a.lo - b.hi, a.hi - b.lo)),
            BinOp::Mul => checked(self, corners(|x, y| x.saturating_mul(y))),
            BinOp::Div | BinOp::Mod => {
                if b.contains(0) {
                    self.found(
                        span,
                        EvalError::DivisionByZero,
                        format!("{} can be 0 (it ranges over {b})", describe(r)),
                    );
                }
                // The divisor without zero: below it and above it.
                let parts = [
                    Range::new(b.lo, b.hi.min(-1)),
                    Range::new(b.lo.max(1), b.hi),
                ];
                let mut out: Option<Range> = None;
                for d in parts.into_iter().filter(|d| d.lo <= d.hi) {
                    let q = if op == BinOp::Div {
                        if a.contains(i128::from(i64::MIN)) && d.contains(-1) {
                            self.found(
                                span,
                                EvalError::Overflow,
                                format!("{} can be {}", describe(l), i64::MIN),
                            );
                        }
                        let c = [a.lo / d.lo, a.lo / d.hi, a.hi / d.lo, a.hi / d.hi];
                        Range::new(
                            c.iter().copied().min().unwrap_or(0),
                            c.iter().copied().max().unwrap_or(0),
                        )
                    } else {
                        let m = d.lo.abs().max(d.hi.abs()) - 1;
                        if a.contains(i128::from(i64::MIN)) && d.contains(-1) {
                            self.found(
                                span,
                                EvalError::Overflow,
                                format!("{} can be {}", describe(l), i64::MIN),
                            );
                        }
                        Range::new(if a.lo < 0 { -m } else { 0 }, if a.hi > 0 { m } else { 0 })
                    };
                    out = Some(out.map_or(q, |o| o.hull(q)));
                }
                Abs::Int(out.unwrap_or(Range::new(0, 0)).clamp())
            }
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne => {
                let (lt, eq, gt) = (a.lo < b.hi, a.lo <= b.hi && b.lo <= a.hi, a.hi > b.lo);
                // Whether the comparison can be true, and whether it can be false.
                let single = a.lo == a.hi && b.lo == b.hi;
                match op {
                    BinOp::Lt => Abs::Bool(lt, a.hi >= b.lo),
                    BinOp::Le => Abs::Bool(a.lo <= b.hi, gt),
                    BinOp::Gt => Abs::Bool(gt, a.lo <= b.hi),
                    BinOp::Ge => Abs::Bool(a.hi >= b.lo, lt),
                    BinOp::Eq => Abs::Bool(eq, !(single && a.lo == b.lo)),
                    _ => Abs::Bool(!(single && a.lo == b.lo), eq),
                }
            }
            BinOp::And | BinOp::Or => Abs::Bool(true, true),
        }
    }

    /// What holds once `cond` is known to be `truth`; `None` when it cannot be.
    fn narrow<'e>(&mut self, cond: &'e Expr, truth: bool, env: &Env<'e>) -> Option<Env<'e>> {
        if self.budget == 0 {
            return Some(env.clone());
        }
        self.budget -= 1;
        match &cond.kind {
            ExprKind::Bool(b) => (*b == truth).then(|| env.clone()),
            ExprKind::Unary(UnOp::Not, i) => self.narrow(i, !truth, env),
            ExprKind::Binary(op @ (BinOp::And | BinOp::Or), l, r) => {
                // `and` true and `or` false: both sides have that truth.
                if (*op == BinOp::And) == truth {
                    let env = self.narrow(l, truth, env)?;
                    return self.narrow(r, truth, &env);
                }
                // Otherwise: the left decides, or the left does not and the right does.
                let first = self.narrow(l, truth, env);
                let second = self
                    .narrow(l, !truth, env)
                    .and_then(|env| self.narrow(r, truth, &env));
                match (first, second) {
                    (Some(a), Some(b)) => Some(join(&a, &b)),
                    (a, b) => a.or(b),
                }
            }
            ExprKind::Binary(op, l, r)
                if matches!(
                    op,
                    BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne
                ) =>
            {
                let (Some(a), Some(b)) = (self.range(l, env), self.range(r, env)) else {
                    return Some(env.clone());
                };
                // The comparison that holds.
                let op = if truth { *op } else { negate(*op) };
                let (na, nb) = match op {
                    BinOp::Lt => (
                        Range::new(a.lo, a.hi.min(b.hi - 1)),
                        Range::new(b.lo.max(a.lo + 1), b.hi),
                    ),
                    BinOp::Le => (
                        Range::new(a.lo, a.hi.min(b.hi)),
                        Range::new(b.lo.max(a.lo), b.hi),
                    ),
                    BinOp::Gt => (
                        Range::new(a.lo.max(b.lo + 1), a.hi),
                        Range::new(b.lo, b.hi.min(a.hi - 1)),
                    ),
                    BinOp::Ge => (
                        Range::new(a.lo.max(b.lo), a.hi),
                        Range::new(b.lo, b.hi.min(a.hi)),
                    ),
                    BinOp::Eq => {
                        let m = a.meet(b)?;
                        (m, m)
                    }
                    _ => (not_point(a, b), not_point(b, a)),
                };
                if na.lo > na.hi || nb.lo > nb.hi {
                    return None;
                }
                let mut env = env.clone();
                for (e, was, now) in [(&**l, a, na), (&**r, b, nb)] {
                    if now != was && !matches!(e.kind, ExprKind::Int(_)) {
                        env.narrowed.push((e, now));
                    }
                }
                Some(env)
            }
            _ => Some(env.clone()),
        }
    }
}

trait IntoBool {
    fn into_bool(self) -> Abs;
}

impl IntoBool for (bool, bool) {
    fn into_bool(self) -> Abs {
        Abs::Bool(self.0, self.1)
    }
}

fn negate(op: BinOp) -> BinOp {
    match op {
        BinOp::Lt => BinOp::Ge,
        BinOp::Le => BinOp::Gt,
        BinOp::Gt => BinOp::Le,
        BinOp::Ge => BinOp::Lt,
        BinOp::Eq => BinOp::Ne,
        BinOp::Ne => BinOp::Eq,
        other => other,
    }
}

/// `a` where it differs from `b`, when `b` is one value at an end of `a`.
fn not_point(a: Range, b: Range) -> Range {
    if b.lo != b.hi {
        return a;
    }
    if a.lo == b.lo {
        Range::new(a.lo + 1, a.hi)
    } else if a.hi == b.lo {
        Range::new(a.lo, a.hi - 1)
    } else {
        a
    }
}

/// What holds on either of two paths: ranges narrowed on both, joined.
fn join<'e>(a: &Env<'e>, b: &Env<'e>) -> Env<'e> {
    let mut out = Env::default();
    for (e, ra) in &a.narrowed {
        if let Some((_, rb)) = b.narrowed.iter().rev().find(|(x, _)| same(x, e)) {
            out.narrowed.push((e, ra.hull(*rb)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::parse_expr;

    fn fails(guards: &[(&str, bool)], e: &str) -> Vec<EvalError> {
        let parsed: Vec<(Expr, bool)> = guards
            .iter()
            .map(|(g, t)| (parse_expr(g).expect("guard parses"), *t))
            .collect();
        let path: Vec<(&Expr, bool)> = parsed.iter().map(|(g, t)| (g, *t)).collect();
        let e = parse_expr(e).expect("parses");
        analyse(&path, &[&e]).into_iter().map(|f| f.error).collect()
    }

    #[test]
    fn division_by_a_fact_that_can_be_zero() {
        assert_eq!(
            fails(&[], "approved * 100 / count < 100"),
            [EvalError::DivisionByZero]
        );
        assert_eq!(fails(&[], "count > 0 and approved * 100 / count < 100"), []);
        assert_eq!(fails(&[("count != 0", true)], "approved / count"), []);
        assert_eq!(fails(&[("count == 0", false)], "approved / count"), []);
        assert_eq!(
            fails(&[("count == 0", true)], "approved / count"),
            [EvalError::DivisionByZero]
        );
        assert_eq!(fails(&[], "count == 0 or approved / count > 1"), []);
        assert_eq!(fails(&[], "not (count < 1) and approved / count > 1"), []);
        assert_eq!(
            fails(&[], "workers / (approved - 1) >= 1"),
            [EvalError::DivisionByZero]
        );
        assert_eq!(
            fails(&[], "approved > 1 and workers / (approved - 1) >= 1"),
            []
        );
        assert_eq!(fails(&[], "approved / 2 + 1"), []);
    }

    #[test]
    fn overflow_past_the_facts_ranges() {
        assert_eq!(fails(&[], "approved * 1000"), []);
        assert_eq!(
            fails(&[], "approved * approved * approved * approved"),
            [EvalError::Overflow]
        );
        assert_eq!(
            fails(&[], "9223372036854775807 + count"),
            [EvalError::Overflow]
        );
        assert_eq!(fails(&[], "-approved"), []);
    }
}
