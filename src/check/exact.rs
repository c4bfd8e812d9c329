//! Exact answers for the lints: can a rule's condition be true, can it be false, can one
//! rule fire where another does not, can a divisor be zero — over **every** value the
//! facts can take at run time, not over a sample.
//!
//! # What is decided, and how
//!
//! The facts' ranges: `approved`, `workers`, `rank`, `healthy.after` and `members.after` are any integer
//! from 0 up, with no upper bound; `count` is one of 0, 1, 3, 5 (the CRD allows 1, 3 or 5;
//! 0 stands for a missing cluster); bools are either; names and enum facts are any text (an
//! enum fact may also hold a value the rules do not know). Facts are taken as independent
//! of one another: a claim that holds for every combination holds in particular for the
//! combinations a real cluster can show, so "never", "always" and "subsumed" stay true.
//!
//! A condition is translated, once per value of `count`, into a formula whose atoms are
//!
//! - linear constraints `a1·x1 + … + an·xn + k ≥ 0` and `… = 0` over integers, where the
//!   `xi` are the unbounded int facts and one fresh variable per division;
//! - `b` / `not b` for a bool fact `b`;
//! - `f == "text"` / `f != "text"` for a name or enum fact `f`.
//!
//! Arithmetic is linear when every product has a constant side and every `/` and `%` has a
//! constant divisor once `count` is fixed. A division `h / d` by a constant `d ≠ 0` is the
//! fresh integer `q` with `0 ≤ h − |d|·q ≤ |d| − 1` when `h ≥ 0` and `−(|d| − 1) ≤ h − |d|·q ≤ 0`
//! when `h < 0` (truncation toward zero, as the interpreter divides), times the sign of `d`;
//! `h % d` is `h − |d|·q`. Both are exact, not approximations. A division by the constant 0
//! is a fresh unconstrained integer: the arithmetic lint runs first and proves such a
//! division is never reached (or reports it), and an unreached operand cannot change the
//! value of `and`/`or`. Integers are mathematical: values past 64 bits, where the
//! interpreter fails with an overflow instead, are the overflow lint's business.
//!
//! Satisfiability of such a formula is decided by a search over its `or`s (negation is
//! pushed to the atoms first) and, for each consistent set of atoms, Pugh's Omega test:
//! equalities are eliminated exactly (with the "mod-hat" substitution when no coefficient
//! is ±1), inequalities by Fourier–Motzkin elimination, exact where a bound has unit
//! coefficient and otherwise completed with the dark shadow and the splinters. The Omega
//! test is a decision procedure for linear integer arithmetic (Pugh, "The Omega test",
//! 1991): "unsatisfiable" means no integer values at all, however large, satisfy it.
//!
//! What falls outside — a product of two facts, a division by a fact other than `count`, an
//! equality between two name facts — is [`Undecided::Outside`], and the lints then say the
//! rule was not analysed instead of claiming anything. The search has a budget
//! ([`Undecided::TooComplex`]) for the same reason.

use crate::syntax::ast::{BinOp, Expr, ExprKind, UnOp};
use crate::value::Value;
use crate::vocab::{Domain, Fact, Type};

/// The values `count` can take (1, 3, 5 from the CRD; 0 when the cluster is missing).
pub const COUNT_VALUES: &[i64] = crate::vocab::COUNT_VALUES;

/// A value no literal in the rules equals, standing for "any other name".
pub const OTHER: &str = "\u{1}other";

/// Why a question was not answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Undecided {
    /// The condition is outside linear integer arithmetic; the text says what, in words.
    Outside(String),
    /// The search ran past its budget.
    TooComplex,
}

/// The work one question may cost, in search steps (each a node of the Omega test or a
/// branch of an `or`).
pub const QUESTION_BUDGET: usize = 200_000;

/// The int facts with no upper bound, each a variable of the linear constraints.
fn is_unbounded_int(f: Fact) -> bool {
    f.info().domain == Domain::Natural
}

/// A linear form `k + Σ c·x`, sparse.
#[derive(Clone, Debug, Default, PartialEq)]
struct Lin {
    k: i128,
    terms: Vec<(usize, i128)>,
}

fn over() -> Undecided {
    Undecided::TooComplex
}

impl Lin {
    fn constant(k: i128) -> Lin {
        Lin {
            k,
            terms: Vec::new(),
        }
    }

    fn var(v: usize) -> Lin {
        Lin {
            k: 0,
            terms: vec![(v, 1)],
        }
    }

    fn as_constant(&self) -> Option<i128> {
        self.terms.is_empty().then_some(self.k)
    }

    fn scale(&self, by: i128) -> Result<Lin, Undecided> {
        let mut out = Lin::constant(self.k.checked_mul(by).ok_or_else(over)?);
        if by != 0 {
            for (v, c) in &self.terms {
                out.terms.push((*v, c.checked_mul(by).ok_or_else(over)?));
            }
        }
        Ok(out)
    }

    fn add(&self, o: &Lin) -> Result<Lin, Undecided> {
        let mut out = self.clone();
        out.k = out.k.checked_add(o.k).ok_or_else(over)?;
        for (v, c) in &o.terms {
            match out.terms.iter_mut().find(|(w, _)| w == v) {
                Some((_, d)) => *d = d.checked_add(*c).ok_or_else(over)?,
                None => out.terms.push((*v, *c)),
            }
        }
        out.terms.retain(|(_, c)| *c != 0);
        Ok(out)
    }

    fn sub(&self, o: &Lin) -> Result<Lin, Undecided> {
        self.add(&o.scale(-1)?)
    }

    fn plus(&self, k: i128) -> Result<Lin, Undecided> {
        self.add(&Lin::constant(k))
    }
}

/// A formula in negation normal form.
#[derive(Clone, Debug)]
enum F<'a> {
    Const(bool),
    /// `lin ≥ 0`.
    Ge(Lin),
    /// `lin = 0`.
    Eq(Lin),
    Bool(Fact, bool),
    /// `fact == text` (true) or `fact != text` (false).
    Str(Fact, &'a str, bool),
    And(Vec<F<'a>>),
    Or(Vec<F<'a>>),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Bool,
    Text,
}

fn kind(e: &Expr) -> Kind {
    match &e.kind {
        ExprKind::Int(_) => Kind::Int,
        ExprKind::Bool(_) => Kind::Bool,
        ExprKind::Str(..) => Kind::Text,
        ExprKind::Name(n) => match Fact::lookup(n).map(|f| f.info().ty) {
            Some(Type::Int) => Kind::Int,
            Some(Type::Bool) => Kind::Bool,
            _ => Kind::Text,
        },
        ExprKind::Unary(UnOp::Not, _) => Kind::Bool,
        ExprKind::Unary(UnOp::Neg, _) => Kind::Int,
        ExprKind::Binary(op, _, _) => match op {
            BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod => Kind::Int,
            _ => Kind::Bool,
        },
    }
}

fn short(e: &Expr) -> String {
    let text = e.to_string();
    if text.chars().count() > 60 {
        "an operand".to_string()
    } else {
        format!("`{text}`")
    }
}

/// Translation of expressions, for one value of `count`.
struct Translate<'a> {
    count: i64,
    /// Whether an int term outside the linear fragment stands for any integer (a fresh
    /// variable) instead of stopping the translation: answers are then candidates only.
    relaxed: bool,
    /// Variable `i` is `vars[i]`: a fact, or `None` for a division's quotient.
    vars: Vec<Option<Fact>>,
    /// What the quotients are: conjoined with every question.
    defs: Vec<F<'a>>,
}

impl<'a> Translate<'a> {
    fn new(count: i64, relaxed: bool) -> Self {
        Translate {
            count,
            relaxed,
            vars: Vec::new(),
            defs: Vec::new(),
        }
    }

    fn fact_var(&mut self, f: Fact) -> usize {
        if let Some(i) = self.vars.iter().position(|v| *v == Some(f)) {
            return i;
        }
        self.vars.push(Some(f));
        self.vars.len() - 1
    }

    fn fresh(&mut self) -> usize {
        self.vars.push(None);
        self.vars.len() - 1
    }

    fn term(&mut self, e: &'a Expr) -> Result<Lin, Undecided> {
        match self.linear(e) {
            Err(Undecided::Outside(_)) if self.relaxed => Ok(Lin::var(self.fresh())),
            r => r,
        }
    }

    fn linear(&mut self, e: &'a Expr) -> Result<Lin, Undecided> {
        match &e.kind {
            ExprKind::Int(i) => Ok(Lin::constant(i128::from(*i))),
            ExprKind::Name(n) => match Fact::lookup(n) {
                Some(Fact::Count) => Ok(Lin::constant(i128::from(self.count))),
                Some(f) if is_unbounded_int(f) => Ok(Lin::var(self.fact_var(f))),
                _ => Err(Undecided::Outside(format!("`{n}` is not an int fact"))),
            },
            ExprKind::Unary(UnOp::Neg, i) => self.term(i)?.scale(-1),
            ExprKind::Binary(op @ (BinOp::Add | BinOp::Sub | BinOp::Mul), l, r) => {
                let (a, b) = (self.term(l)?, self.term(r)?);
                match op {
                    BinOp::Add => a.add(&b),
                    BinOp::Sub => a.sub(&b),
                    _ => match (a.as_constant(), b.as_constant()) {
                        (Some(k), _) => b.scale(k),
                        (_, Some(k)) => a.scale(k),
                        _ => Err(Undecided::Outside(format!(
                            "{} multiplies two facts",
                            short(e)
                        ))),
                    },
                }
            }
            ExprKind::Binary(op @ (BinOp::Div | BinOp::Mod), l, r) => {
                let h = self.term(l)?;
                let d = self
                    .term(r)?
                    .as_constant()
                    .ok_or_else(|| Undecided::Outside(format!("{} divides by a fact", short(e))))?;
                if d == 0 {
                    // Never reached: the arithmetic lint proves it first (see the module
                    // documentation); any value will do.
                    return Ok(Lin::var(self.fresh()));
                }
                if let Some(h) = h.as_constant() {
                    // i128: no overflow for 64-bit operands.
                    return Ok(Lin::constant(if *op == BinOp::Div { h / d } else { h % d }));
                }
                let m = d.abs();
                let q = self.fresh();
                let mq = Lin::var(q).scale(m)?;
                let r = h.sub(&mq)?; // h - |d|·q
                self.defs.push(F::Or(vec![
                    F::And(vec![
                        F::Ge(h.clone()),
                        F::Ge(r.clone()),
                        F::Ge(r.scale(-1)?.plus(m - 1)?),
                    ]),
                    F::And(vec![
                        F::Ge(h.scale(-1)?.plus(-1)?),
                        F::Ge(r.scale(-1)?),
                        F::Ge(r.plus(m - 1)?),
                    ]),
                ]));
                if *op == BinOp::Div {
                    Lin::var(q).scale(d.signum())
                } else {
                    Ok(r)
                }
            }
            _ => Err(Undecided::Outside(format!(
                "{} is not an integer",
                short(e)
            ))),
        }
    }

    /// The condition `e` holds (`positive`) or does not.
    fn cond(&mut self, e: &'a Expr, positive: bool) -> Result<F<'a>, Undecided> {
        match &e.kind {
            ExprKind::Bool(b) => Ok(F::Const(*b == positive)),
            ExprKind::Name(n) => match Fact::lookup(n) {
                Some(f) if f.info().ty == Type::Bool => Ok(F::Bool(f, positive)),
                _ => Err(Undecided::Outside(format!("`{n}` is not a bool fact"))),
            },
            ExprKind::Unary(UnOp::Not, i) => self.cond(i, !positive),
            ExprKind::Binary(op @ (BinOp::And | BinOp::Or), l, r) => {
                let parts = vec![self.cond(l, positive)?, self.cond(r, positive)?];
                Ok(if (*op == BinOp::And) == positive {
                    F::And(parts)
                } else {
                    F::Or(parts)
                })
            }
            ExprKind::Binary(op, l, r) => {
                let op = if positive { *op } else { negate(*op) };
                match (kind(l), kind(r)) {
                    (Kind::Int, Kind::Int) => {
                        let d = self.term(l)?.sub(&self.term(r)?)?;
                        Ok(match op {
                            BinOp::Ge => F::Ge(d),
                            BinOp::Gt => F::Ge(d.plus(-1)?),
                            BinOp::Le => F::Ge(d.scale(-1)?),
                            BinOp::Lt => F::Ge(d.scale(-1)?.plus(-1)?),
                            BinOp::Eq => F::Eq(d),
                            BinOp::Ne => {
                                F::Or(vec![F::Ge(d.plus(-1)?), F::Ge(d.scale(-1)?.plus(-1)?)])
                            }
                            _ => {
                                return Err(Undecided::Outside(format!(
                                    "{} is not a condition",
                                    short(e)
                                )));
                            }
                        })
                    }
                    (Kind::Bool, Kind::Bool) if matches!(op, BinOp::Eq | BinOp::Ne) => {
                        let same = op == BinOp::Eq;
                        Ok(F::Or(vec![
                            F::And(vec![self.cond(l, true)?, self.cond(r, same)?]),
                            F::And(vec![self.cond(l, false)?, self.cond(r, !same)?]),
                        ]))
                    }
                    (Kind::Text, Kind::Text) if matches!(op, BinOp::Eq | BinOp::Ne) => {
                        let eq = op == BinOp::Eq;
                        match (&l.kind, &r.kind) {
                            (ExprKind::Str(a, _), ExprKind::Str(b, _)) => {
                                Ok(F::Const((a == b) == eq))
                            }
                            (ExprKind::Name(n), ExprKind::Str(s, _))
                            | (ExprKind::Str(s, _), ExprKind::Name(n)) => match Fact::lookup(n) {
                                Some(f) => Ok(F::Str(f, s.as_str(), eq)),
                                None => Err(Undecided::Outside(format!("`{n}` is not a fact"))),
                            },
                            _ => Err(Undecided::Outside(format!(
                                "{} compares two names",
                                short(e)
                            ))),
                        }
                    }
                    _ => Err(Undecided::Outside(format!(
                        "{} is not a condition",
                        short(e)
                    ))),
                }
            }
            _ => Err(Undecided::Outside(format!(
                "{} is not a condition",
                short(e)
            ))),
        }
    }
}

fn negate(op: BinOp) -> BinOp {
    match op {
        BinOp::Eq => BinOp::Ne,
        BinOp::Ne => BinOp::Eq,
        BinOp::Lt => BinOp::Ge,
        BinOp::Ge => BinOp::Lt,
        BinOp::Le => BinOp::Gt,
        BinOp::Gt => BinOp::Le,
        other => other,
    }
}

/// One part of a question: an expression that must evaluate to `true` or to `false`
/// (`Truth`), or an int expression that must be zero (`Zero`).
#[derive(Clone, Copy, Debug)]
pub enum Part<'a> {
    Truth(&'a Expr, bool),
    Zero(&'a Expr),
    /// A rule with this `when` and `unless` fires (`true`) or does not.
    Fires(Option<&'a Expr>, Option<&'a Expr>, bool),
}

/// Fact values that make a question true: every fact the question reads.
pub type Model<'a> = Vec<(Fact, Value<'a>)>;

/// A budget shared by several questions.
#[derive(Debug)]
pub struct Budget {
    pub left: usize,
}

impl Budget {
    pub fn new(left: usize) -> Budget {
        Budget { left }
    }

    fn tick(&mut self) -> Result<(), Undecided> {
        self.left = self.left.checked_sub(1).ok_or(Undecided::TooComplex)?;
        Ok(())
    }
}

fn reads_count(parts: &[Part<'_>]) -> bool {
    let reads = |e: &Expr| e.reads(Fact::Count.name());
    parts.iter().any(|p| match p {
        Part::Truth(e, _) | Part::Zero(e) => reads(e),
        Part::Fires(w, u, _) => w.iter().chain(u.iter()).any(|e| reads(e)),
    })
}

/// Whether every part can hold at once, for some values of the facts; `Some` carries the
/// values (the smallest ints, bools false unless needed, names a literal or another name).
pub fn satisfiable<'a>(
    parts: &[Part<'a>],
    budget: &mut Budget,
) -> Result<Option<Model<'a>>, Undecided> {
    solve(parts, budget, false)
}

/// Like [`satisfiable`], with every int term outside the linear fragment standing for any
/// integer: `None` proves nothing, and a model is only a candidate, to be checked by
/// evaluation before anything is claimed from it.
pub fn candidate<'a>(
    parts: &[Part<'a>],
    budget: &mut Budget,
) -> Result<Option<Model<'a>>, Undecided> {
    solve(parts, budget, true)
}

fn solve<'a>(
    parts: &[Part<'a>],
    budget: &mut Budget,
    relaxed: bool,
) -> Result<Option<Model<'a>>, Undecided> {
    // Translate for every value of `count` first: an unsupported condition is said so
    // whatever `count` is.
    let counts: &[i64] = if reads_count(parts) {
        COUNT_VALUES
    } else {
        &[0]
    };
    let mut problems = Vec::new();
    for &count in counts {
        let mut t = Translate::new(count, relaxed);
        let mut all = Vec::new();
        for p in parts {
            all.push(match p {
                Part::Truth(e, truth) => t.cond(e, *truth)?,
                Part::Zero(e) => F::Eq(t.term(e)?),
                Part::Fires(w, u, true) => F::And(vec![
                    w.map_or(Ok(F::Const(true)), |w| t.cond(w, true))?,
                    u.map_or(Ok(F::Const(true)), |u| t.cond(u, false))?,
                ]),
                Part::Fires(w, u, false) => F::Or(vec![
                    w.map_or(Ok(F::Const(false)), |w| t.cond(w, false))?,
                    u.map_or(Ok(F::Const(false)), |u| t.cond(u, true))?,
                ]),
            });
        }
        all.append(&mut t.defs);
        problems.push((count, t.vars, F::And(all)));
    }
    for (count, vars, f) in problems {
        let mut search = Search {
            vars: &vars,
            budget,
        };
        if let Some(mut m) = search.solve(vec![&f], State::default())? {
            if reads_count(parts) {
                m.push((Fact::Count, Value::Int(count)));
            }
            return Ok(Some(m));
        }
    }
    Ok(None)
}

/// The atoms chosen along one branch of the search.
#[derive(Clone, Default)]
struct State<'a> {
    bools: Vec<(Fact, bool)>,
    texts: Vec<(Fact, &'a str, bool)>,
    eqs: Vec<Lin>,
    geqs: Vec<Lin>,
}

struct Search<'v, 'b> {
    vars: &'v [Option<Fact>],
    budget: &'b mut Budget,
}

impl Search<'_, '_> {
    fn solve<'a>(
        &mut self,
        mut todo: Vec<&F<'a>>,
        mut st: State<'a>,
    ) -> Result<Option<Model<'a>>, Undecided> {
        self.budget.tick()?;
        while let Some(f) = todo.pop() {
            match f {
                F::Const(true) => {}
                F::Const(false) => return Ok(None),
                F::Ge(l) => st.geqs.push(l.clone()),
                F::Eq(l) => st.eqs.push(l.clone()),
                F::Bool(fact, v) => {
                    if st.bools.contains(&(*fact, !*v)) {
                        return Ok(None);
                    }
                    st.bools.push((*fact, *v));
                }
                F::Str(fact, s, eq) => {
                    let clash = st.texts.iter().any(|(g, t, e)| {
                        g == fact && ((*eq && *e && t != s) || (t == s && e != eq))
                    });
                    if clash {
                        return Ok(None);
                    }
                    st.texts.push((*fact, s, *eq));
                }
                F::And(parts) => todo.extend(parts.iter()),
                F::Or(parts) => {
                    for p in parts {
                        let mut t = todo.clone();
                        t.push(p);
                        if let Some(m) = self.solve(t, st.clone())? {
                            return Ok(Some(m));
                        }
                    }
                    return Ok(None);
                }
            }
        }
        self.leaf(st)
    }

    /// A consistent set of atoms: decide the linear part, and find the smallest values.
    fn leaf<'a>(&mut self, st: State<'a>) -> Result<Option<Model<'a>>, Undecided> {
        let n = self.vars.len();
        let dense = |l: &Lin| -> Row {
            let mut r = vec![0i128; n + 1];
            r[0] = l.k;
            for (v, c) in &l.terms {
                r[v + 1] += c;
            }
            r
        };
        let eqs: Vec<Row> = st.eqs.iter().map(dense).collect();
        let mut geqs: Vec<Row> = st.geqs.iter().map(dense).collect();
        // Facts are never negative.
        for (i, v) in self.vars.iter().enumerate() {
            if v.is_some() {
                let mut r = vec![0i128; n + 1];
                r[i + 1] = 1;
                geqs.push(r);
            }
        }
        if !omega(eqs.clone(), geqs.clone(), self.budget)? {
            return Ok(None);
        }
        let mut model = Vec::new();
        let (mut eqs, geqs) = (eqs, geqs);
        for (i, v) in self.vars.iter().enumerate() {
            let Some(fact) = v else { continue };
            let value = smallest(&eqs, &geqs, i + 1, self.budget)?;
            let mut fix = vec![0i128; n + 1];
            fix[0] = -value;
            fix[i + 1] = 1;
            eqs.push(fix);
            let value = i64::try_from(value).map_err(|_| Undecided::TooComplex)?;
            model.push((*fact, Value::Int(value)));
        }
        for (fact, v) in &st.bools {
            if !model.iter().any(|(f, _)| f == fact) {
                model.push((*fact, Value::Bool(*v)));
            }
        }
        for (fact, s, eq) in &st.texts {
            if *eq {
                model.retain(|(f, _)| f != fact);
                model.push((*fact, Value::Str(s)));
            } else if !model.iter().any(|(f, _)| f == fact) {
                model.push((*fact, Value::Str(OTHER)));
            }
        }
        Ok(Some(model))
    }
}

/// The smallest value of variable `col` (≥ 0) in a satisfiable problem.
fn smallest(eqs: &[Row], geqs: &[Row], col: usize, budget: &mut Budget) -> Result<i128, Undecided> {
    let at_most = |hi: i128, budget: &mut Budget| -> Result<bool, Undecided> {
        let mut g = geqs.to_vec();
        let mut r = vec![0i128; geqs.first().map_or(col + 1, Vec::len).max(col + 1)];
        r[0] = hi;
        r[col] = -1;
        g.push(r);
        omega(eqs.to_vec(), g, budget)
    };
    let (mut lo, mut hi) = (0i128, 0i128);
    while !at_most(hi, budget)? {
        lo = hi + 1;
        hi = hi
            .checked_mul(2)
            .and_then(|h| h.checked_add(1))
            .ok_or_else(over)?;
        if hi > i128::from(i64::MAX) {
            return Err(Undecided::TooComplex);
        }
    }
    // The smallest is in lo..=hi.
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if at_most(mid, budget)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(lo)
}

/// A dense linear form: `r[0] + Σ r[i]·x_i`.
type Row = Vec<i128>;

fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn floor_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

/// `a mod^ m` of the Omega test: the residue of `a` in `(-m/2, m/2]`.
fn mod_hat(a: i128, m: i128) -> Result<i128, Undecided> {
    let two_a = a.checked_mul(2).ok_or_else(over)?;
    let q = floor_div(two_a.checked_add(m).ok_or_else(over)?, 2 * m);
    a.checked_sub(m.checked_mul(q).ok_or_else(over)?)
        .ok_or_else(over)
}

fn width(eqs: &[Row], geqs: &[Row]) -> usize {
    eqs.iter().chain(geqs).map(Vec::len).max().unwrap_or(1)
}

fn pad(rows: &mut [Row], w: usize) {
    for r in rows {
        r.resize(w, 0);
    }
}

/// Replaces variable `col` by the form `sub` (which does not mention it) in `row`.
fn substitute(row: &mut Row, col: usize, sub: &Row) -> Result<(), Undecided> {
    let c = row[col];
    if c == 0 {
        return Ok(());
    }
    row[col] = 0;
    for (i, s) in sub.iter().enumerate() {
        row[i] = row[i]
            .checked_add(c.checked_mul(*s).ok_or_else(over)?)
            .ok_or_else(over)?;
    }
    Ok(())
}

/// Whether integers satisfy every `row = 0` of `eqs` and `row ≥ 0` of `geqs` (Pugh's
/// Omega test).
fn omega(mut eqs: Vec<Row>, mut geqs: Vec<Row>, budget: &mut Budget) -> Result<bool, Undecided> {
    budget.tick()?;
    let w = width(&eqs, &geqs);
    pad(&mut eqs, w);
    pad(&mut geqs, w);
    // Equalities, one at a time, each eliminating a variable.
    loop {
        let mut kept = Vec::new();
        for mut e in eqs.drain(..) {
            let g = e[1..].iter().fold(0, |g, c| gcd(g, *c));
            if g == 0 {
                if e[0] != 0 {
                    return Ok(false);
                }
                continue;
            }
            if e[0] % g != 0 {
                return Ok(false);
            }
            for c in &mut e {
                *c /= g;
            }
            kept.push(e);
        }
        eqs = kept;
        let Some(mut e) = eqs.pop() else { break };
        budget.tick()?;
        let Some(k) = (1..e.len())
            .filter(|&i| e[i] != 0)
            .min_by_key(|&i| e[i].abs())
        else {
            continue;
        };
        let ak = e[k];
        if ak.abs() == 1 {
            // x_k = -ak · (e without x_k).
            let mut sub = e.clone();
            sub[k] = 0;
            for c in &mut sub {
                *c = c.checked_mul(-ak).ok_or_else(over)?;
            }
            for r in eqs.iter_mut().chain(geqs.iter_mut()) {
                substitute(r, k, &sub)?;
            }
        } else {
            // m·σ = Σ (a_i mod^ m)·x_i, whose coefficient of x_k is -sign(a_k): solve it for x_k.
            let m = ak.abs().checked_add(1).ok_or_else(over)?;
            let w = e.len() + 1;
            e.resize(w, 0);
            pad(&mut eqs, w);
            pad(&mut geqs, w);
            let mut sigma_eq = vec![0i128; w];
            for i in 0..w - 1 {
                sigma_eq[i] = mod_hat(e[i], m)?;
            }
            sigma_eq[w - 1] = -m;
            let c = sigma_eq[k]; // -sign(ak)
            let mut sub = sigma_eq;
            sub[k] = 0;
            for s in &mut sub {
                *s = s.checked_mul(-c).ok_or_else(over)?;
            }
            substitute(&mut e, k, &sub)?;
            for r in eqs.iter_mut().chain(geqs.iter_mut()) {
                substitute(r, k, &sub)?;
            }
            eqs.push(e);
        }
    }
    inequalities(geqs, budget)
}

/// The Omega test on inequalities only.
fn inequalities(geqs: Vec<Row>, budget: &mut Budget) -> Result<bool, Undecided> {
    budget.tick()?;
    // Normalise: divide by the gcd of the coefficients, rounding the constant down.
    let mut rows: Vec<Row> = Vec::new();
    for mut r in geqs {
        let g = r[1..].iter().fold(0, |g, c| gcd(g, *c));
        if g == 0 {
            if r[0] < 0 {
                return Ok(false);
            }
            continue;
        }
        r[0] = floor_div(r[0], g);
        for c in &mut r[1..] {
            *c /= g;
        }
        // Keep the tightest of rows with the same coefficients.
        match rows.iter_mut().find(|o| o[1..] == r[1..]) {
            Some(o) => o[0] = o[0].min(r[0]),
            None => rows.push(r),
        }
    }
    // Opposite rows: a contradiction, or an equality to eliminate exactly.
    for i in 0..rows.len() {
        for j in i + 1..rows.len() {
            if rows[i][1..]
                .iter()
                .zip(&rows[j][1..])
                .all(|(a, b)| *a == -*b)
            {
                let sum = rows[i][0] + rows[j][0];
                if sum < 0 {
                    return Ok(false);
                }
                if sum == 0 {
                    let e = rows[i].clone();
                    let mut rest = rows;
                    rest.swap_remove(j);
                    rest.swap_remove(i);
                    return omega(vec![e], rest, budget);
                }
            }
        }
    }
    let w = rows.first().map_or(1, Vec::len);
    // Pick the variable to eliminate: one bounded on one side only, else an exact one,
    // else the cheapest.
    let mut best: Option<(usize, bool, usize)> = None;
    for v in 1..w {
        let lower = rows.iter().filter(|r| r[v] > 0).count();
        let upper = rows.iter().filter(|r| r[v] < 0).count();
        if lower + upper == 0 {
            continue;
        }
        if lower == 0 || upper == 0 {
            best = Some((v, true, 0));
            break;
        }
        let exact = rows.iter().all(|r| r[v] <= 1) || rows.iter().all(|r| r[v] >= -1);
        let cost = lower * upper;
        let better = match best {
            None => true,
            Some((_, e, c)) => (exact && !e) || (exact == e && cost < c),
        };
        if better {
            best = Some((v, exact, cost));
        }
    }
    let Some((v, exact, _)) = best else {
        return Ok(true);
    };
    let (mut lower, mut upper, mut rest) = (Vec::new(), Vec::new(), Vec::new());
    for r in &rows {
        match r[v].signum() {
            1 => lower.push(r.clone()),
            -1 => upper.push(r.clone()),
            _ => rest.push(r.clone()),
        }
    }
    if lower.is_empty() || upper.is_empty() {
        // x_v can be taken large (or small) enough for its rows.
        return inequalities(rest, budget);
    }
    let combine = |dark: bool| -> Result<Vec<Row>, Undecided> {
        let mut out = rest.clone();
        for l in &lower {
            for u in &upper {
                let (a, b) = (l[v], -u[v]);
                let mut r = vec![0i128; w];
                for i in 0..w {
                    r[i] = b
                        .checked_mul(l[i])
                        .and_then(|x| a.checked_mul(u[i]).and_then(|y| x.checked_add(y)))
                        .ok_or_else(over)?;
                }
                if dark {
                    r[0] = r[0]
                        .checked_sub((a - 1).checked_mul(b - 1).ok_or_else(over)?)
                        .ok_or_else(over)?;
                }
                out.push(r);
            }
        }
        Ok(out)
    };
    if exact {
        return inequalities(combine(false)?, budget);
    }
    if inequalities(combine(true)?, budget)? {
        return Ok(true);
    }
    if !inequalities(combine(false)?, budget)? {
        return Ok(false);
    }
    // Splinters: an integer solution outside the dark shadow lies close to a lower bound.
    let m = upper.iter().map(|u| -u[v]).max().unwrap_or(1);
    for l in &lower {
        let a = l[v];
        let top = (m * a - a - m).div_euclid(m);
        for i in 0..=top {
            let mut e = l.clone();
            e[0] -= i;
            if omega(vec![e], rows.clone(), budget)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sat(text: &str) -> Option<Model<'static>> {
        let e: &'static Expr = Box::leak(Box::new(crate::syntax::parse_expr(text).unwrap()));
        satisfiable(&[Part::Truth(e, true)], &mut Budget::new(QUESTION_BUDGET)).unwrap()
    }

    #[test]
    fn thresholds_past_the_old_domains() {
        let m = sat("workers >= 10").unwrap();
        assert_eq!(m, vec![(Fact::Workers, Value::Int(10))]);
        assert!(sat("workers >= 10 and workers < 10").is_none());
        assert!(sat("approved > 1000000 and approved % 7 == 3").is_some());
    }

    #[test]
    fn integer_gaps_are_exact() {
        // 2x = 2y + 1 has real solutions and no integer ones.
        assert!(sat("approved * 2 == workers * 2 + 1").is_none());
        assert!(
            sat("approved * 3 >= workers * 3 + 1 and approved * 3 <= workers * 3 + 2").is_none()
        );
        let m = sat("approved * 5 == workers * 3 + 1 and workers > 0").unwrap();
        let get = |f| m.iter().find(|(g, _)| *g == f).map(|(_, v)| *v);
        let (Some(Value::Int(a)), Some(Value::Int(w))) = (get(Fact::Approved), get(Fact::Workers))
        else {
            panic!("{m:?}")
        };
        assert_eq!(a * 5, w * 3 + 1);
    }

    use proptest::prelude::*;

    /// An int expression over two unbounded facts and `count`: sums, differences, constant
    /// multiples, divisions and remainders by non-zero constants, negation.
    fn int_expr() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("approved".to_string()),
            Just("workers".to_string()),
            Just("count".to_string()),
            (0i64..20).prop_map(|k| k.to_string()),
        ];
        leaf.prop_recursive(3, 12, 2, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} + {b})")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} - {b})")),
                (inner.clone(), -4i64..5).prop_map(|(a, k)| format!("({a} * ({k}))")),
                (inner.clone(), prop_oneof![1i64..6, -5i64..0])
                    .prop_map(|(a, k)| format!("({a} / ({k}))")),
                (inner.clone(), prop_oneof![1i64..6, -5i64..0])
                    .prop_map(|(a, k)| format!("({a} % ({k}))")),
                inner.prop_map(|a| format!("(-{a})")),
            ]
        })
    }

    fn condition() -> impl Strategy<Value = String> {
        let op = prop_oneof![
            Just("<"),
            Just("<="),
            Just(">"),
            Just(">="),
            Just("=="),
            Just("!=")
        ];
        let atom = prop_oneof![
            (int_expr(), op, int_expr()).prop_map(|(a, o, b)| format!("({a} {o} {b})")),
            Just("schedulable".to_string()),
        ];
        atom.prop_recursive(2, 6, 2, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} and {b})")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} or {b})")),
                inner.prop_map(|a| format!("(not {a})")),
            ]
        })
    }

    /// The values brute force tries: every small one, and some far past every constant.
    fn values() -> Vec<i64> {
        (0..=45)
            .chain([97, 100, 101, 1_000, 1_001, 65_536, 1_000_003])
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// Against brute force: a model given is a model (evaluated by the interpreter's
        /// evaluator), and "unsatisfiable" means brute force finds nothing either.
        #[test]
        fn agrees_with_brute_force(text in condition(), truth in any::<bool>()) {
            let e: &'static Expr = Box::leak(Box::new(crate::syntax::parse_expr(&text).unwrap()));
            let answer = satisfiable(&[Part::Truth(e, truth)], &mut Budget::new(QUESTION_BUDGET));
            let answer = match answer {
                Ok(a) => a,
                Err(u) => return Err(TestCaseError::fail(format!("{text}: {u:?}"))),
            };
            let evaluate = |a: i64, w: i64, c: i64, s: bool| {
                let mut get = |f: Fact| Ok(match f {
                    Fact::Approved => Value::Int(a),
                    Fact::Workers => Value::Int(w),
                    Fact::Count => Value::Int(c),
                    _ => Value::Bool(s),
                });
                crate::value::eval(e, &mut get)
            };
            match answer {
                Some(m) => {
                    let get = |f: Fact| m.iter().find(|(g, _)| *g == f).map(|(_, v)| *v);
                    let int = |f| match get(f) { Some(Value::Int(i)) => i, _ => 0 };
                    let s = matches!(get(Fact::Schedulable), Some(Value::Bool(true)));
                    prop_assert_eq!(
                        evaluate(int(Fact::Approved), int(Fact::Workers), int(Fact::Count), s),
                        Ok(Value::Bool(truth)),
                        "{} with {:?}", text, m
                    );
                }
                None => {
                    for a in values() {
                        for w in values() {
                            for &c in COUNT_VALUES {
                                for s in [false, true] {
                                    prop_assert_ne!(
                                        evaluate(a, w, c, s),
                                        Ok(Value::Bool(truth)),
                                        "{} said unsatisfiable; approved = {}, workers = {}, count = {}",
                                        text, a, w, c
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
