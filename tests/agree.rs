//! The compiled table agrees with the reference evaluator.
//!
//! `value::eval` walks the checked AST (lets inlined); the table runs stack-machine
//! code compiled from the same AST, with the operands of `and`/`or` reordered so cheap facts
//! go first. For random well-typed rule files and random facts, and for the shipped rules/
//! on random facts, every runtime event must produce the same hits both ways.
//!
//! The reference decision for one rule mirrors the table's documented semantics: no
//! condition means "holds"; a rule matches iff `when && !unless`; a condition that cannot be
//! evaluated (division by zero, overflow) makes `refuse`/`hold` rows match, failing closed,
//! and `warn` rows not.

use ichor_rules::check::{CheckResult, Program, check};
use ichor_rules::compile::{Options, Table, compile, compile_with};
use ichor_rules::diagnostics::{SourceFile, render_human};
use ichor_rules::interp::{Facts, Interrupt, Lookup, Session};
use ichor_rules::syntax::ast::Expr;
use ichor_rules::value::{EvalError, Value, eval};
use ichor_rules::vocab::{Cost, EnumKind, FACT_COUNT, FACTS, Fact, RUNTIME_EVENTS, Type, Verdict};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

// ---- facts ---------------------------------------------------------------------------

/// One value per fact slot.
#[derive(Clone, Debug)]
struct FactValues(Vec<Value<'static>>);

impl FactValues {
    fn get(&self, f: Fact) -> Value<'static> {
        self.0[f.slot()]
    }
}

/// Answers every fact at once.
struct Plain<'v>(&'v FactValues);

impl<'a> Facts<'a> for Plain<'_> {
    fn fact(&mut self, fact: Fact) -> Lookup<'a> {
        Lookup::Value(self.0.get(fact))
    }
}

/// Answers cheap facts at once and expensive ones `Later`, as the controller's provider does
/// before it has asked etcd.
struct Deferred<'v>(&'v FactValues);

impl<'a> Facts<'a> for Deferred<'_> {
    fn fact(&mut self, fact: Fact) -> Lookup<'a> {
        if fact.info().cost == Cost::Expensive {
            Lookup::Later
        } else {
            Lookup::Value(self.0.get(fact))
        }
    }
}

/// (rule index, verdict, failed to evaluate)
type HitKey = (u32, Verdict, bool);

/// What the reference evaluator decides for one rule.
fn reference_rule(
    when: Option<&Expr>,
    unless: Option<&Expr>,
    verdict: Verdict,
    facts: &FactValues,
) -> Result<Option<bool>, String> {
    let mut get = |f: Fact| -> Result<Value<'_>, EvalError> { Ok(facts.get(f)) };
    let as_bool = |r: Result<Value<'_>, EvalError>| -> Result<Result<bool, EvalError>, String> {
        match r {
            Ok(Value::Bool(b)) => Ok(Ok(b)),
            Ok(other) => Err(format!("condition evaluated to a non-bool {other:?}")),
            Err(e) => Ok(Err(e)),
        }
    };
    let w = match when {
        Some(e) => as_bool(eval(e, &mut get))?,
        None => Ok(true),
    };
    if w == Ok(false) {
        return Ok(None);
    }
    let u = match unless {
        Some(e) => as_bool(eval(e, &mut get))?,
        None => Ok(false),
    };
    Ok(match (w, u) {
        (Err(_), _) | (_, Err(_)) => (verdict != Verdict::Warn).then_some(true),
        (Ok(true), Ok(false)) => Some(false),
        _ => None,
    })
}

/// The reference hits of one event: the rules on it, in source order, that match.
fn reference_hits(
    program: &Program,
    event: (
        ichor_rules::vocab::Verb,
        ichor_rules::vocab::Subject,
        ichor_rules::vocab::Site,
    ),
    facts: &FactValues,
) -> Result<Vec<HitKey>, String> {
    let mut out = Vec::new();
    for (i, r) in program.rules.iter().enumerate() {
        if !r.events.contains(&event) {
            continue;
        }
        if let Some(failed) = reference_rule(r.when.as_ref(), r.unless.as_ref(), r.verdict, facts)?
        {
            out.push((i as u32, r.verdict, failed));
        }
    }
    Ok(out)
}

fn keys(hits: &[ichor_rules::interp::Hit]) -> Vec<HitKey> {
    hits.iter()
        .map(|h| (h.rule, h.verdict, h.error.is_some()))
        .collect()
}

/// The table's hits with a provider that answers everything.
fn table_hits_plain(
    table: &Table,
    event: (
        ichor_rules::vocab::Verb,
        ichor_rules::vocab::Subject,
        ichor_rules::vocab::Site,
    ),
    facts: &FactValues,
) -> Result<Vec<HitKey>, String> {
    let mut s = Session::new(table, Plain(facts));
    match s.matches(event) {
        Ok(h) => Ok(keys(&h)),
        Err(i) => Err(format!(
            "a provider that answers everything was interrupted: {i:?}"
        )),
    }
}

/// The table's hits when expensive facts come later: run, supply, run again.
fn table_hits_deferred(
    table: &Table,
    event: (
        ichor_rules::vocab::Verb,
        ichor_rules::vocab::Subject,
        ichor_rules::vocab::Site,
    ),
    facts: &FactValues,
) -> Result<Vec<HitKey>, String> {
    let mut s = Session::new(table, Deferred(facts));
    for _ in 0..=FACT_COUNT {
        match s.matches(event) {
            Ok(h) => return Ok(keys(&h)),
            Err(Interrupt::Need(f)) => {
                if f.info().cost != Cost::Expensive {
                    return Err(format!("interrupted for the cheap fact {f}"));
                }
                s.supply(f, facts.get(f));
            }
        }
    }
    Err("the session kept interrupting".into())
}

fn checked(src: &str) -> (Vec<SourceFile>, CheckResult) {
    let files = vec![SourceFile::new("gen.rules", src.to_string())];
    let result = check(&files);
    (files, result)
}

/// Compares table and reference on every runtime event.
fn agree(
    program: &Program,
    table: &Table,
    facts: &FactValues,
    src: &str,
) -> Result<(), TestCaseError> {
    for &event in RUNTIME_EVENTS {
        let want = reference_hits(program, event, facts).map_err(TestCaseError::fail)?;
        let plain = table_hits_plain(table, event, facts).map_err(TestCaseError::fail)?;
        let deferred = table_hits_deferred(table, event, facts).map_err(TestCaseError::fail)?;
        let (v, s, site) = event;
        prop_assert_eq!(
            &plain,
            &want,
            "table vs reference on `{} {}` at the {}\nfacts: {}\nsource:\n{}",
            v.name(),
            s.name(),
            site.name(),
            show_facts(program, facts),
            src
        );
        prop_assert_eq!(
            &deferred,
            &want,
            "deferred table vs reference on `{} {}` at the {}\nfacts: {}\nsource:\n{}",
            v.name(),
            s.name(),
            site.name(),
            show_facts(program, facts),
            src
        );
    }
    Ok(())
}

/// The facts the program reads, with their values, for failure messages.
fn show_facts(program: &Program, facts: &FactValues) -> String {
    fn walk(e: &Expr, out: &mut Vec<Fact>) {
        use ichor_rules::syntax::ast::ExprKind::*;
        match &e.kind {
            Name(n) => {
                if let Some(f) = Fact::lookup(n)
                    && !out.contains(&f)
                {
                    out.push(f);
                }
            }
            Unary(_, i) => walk(i, out),
            Binary(_, l, r) => {
                walk(l, out);
                walk(r, out);
            }
            _ => {}
        }
    }
    let mut used = Vec::new();
    for r in &program.rules {
        for e in r.when.iter().chain(r.unless.iter()) {
            walk(e, &mut used);
        }
    }
    used.sort();
    used.iter()
        .map(|f| format!("{f} = {:?}", facts.get(*f)))
        .collect::<Vec<_>>()
        .join(", ")
}

// ---- a generator of well-typed rule files ----------------------------------------------

const INT_FACTS_REMOVE: &[&str] = &["approved", "workers", "count"];
const INT_FACTS_APPLY: &[&str] = &["approved", "workers", "count", "rank"];
/// Bools available to every machine rule.
const COMMON_BOOLS: &[&str] = &[
    "schedulable",
    "cluster.exists",
    "cluster.deleting",
    "transitioning",
    "deleting",
    "allow_delete",
    "node.unreachable",
];
const BOOL_FACTS_REMOVE: &[&str] = &[
    "schedulable",
    "cluster.exists",
    "cluster.deleting",
    "transitioning",
    "deleting",
    "allow_delete",
    "node.unreachable",
    "member.dead",
];

#[derive(Clone, Debug)]
enum IntE {
    Name(&'static str),
    Lit(i64),
    Neg(Box<IntE>),
    /// `+`, `-`, `*`
    Bin(&'static str, Box<IntE>, Box<IntE>),
    /// `/` or `%` by a non-zero constant
    ByConst(&'static str, Box<IntE>, i64),
}

#[derive(Clone, Debug)]
enum BoolE {
    Name(&'static str),
    Lit(bool),
    Not(Box<BoolE>),
    /// `and`, `or`, `==`, `!=` between bools
    Bin(&'static str, Box<BoolE>, Box<BoolE>),
    /// `<`, `<=`, `>`, `>=`, `==`, `!=` between ints
    Cmp(&'static str, IntE, IntE),
}

/// Prints with parentheses around every compound operand (`tight`), or with only the ones
/// the documented precedence needs (`or` < `and` < `not` < comparisons < `+ -` < `* / %` <
/// unary `-`; binary operators associate to the left), so the parser's precedence is
/// exercised too.
struct Printer {
    tight: bool,
}

fn bool_prec(e: &BoolE) -> u8 {
    match e {
        BoolE::Name(_) | BoolE::Lit(_) => 9,
        BoolE::Bin("or", ..) => 1,
        BoolE::Bin("and", ..) => 2,
        BoolE::Not(_) => 3,
        BoolE::Bin(..) | BoolE::Cmp(..) => 4,
    }
}

fn int_prec(e: &IntE) -> u8 {
    match e {
        IntE::Name(_) => 9,
        IntE::Lit(i) if *i >= 0 => 9,
        IntE::Lit(_) | IntE::Neg(_) => 7,
        IntE::Bin("*", ..) | IntE::ByConst(..) => 6,
        IntE::Bin(..) => 5,
    }
}

impl Printer {
    fn int(&self, e: &IntE, out: &mut String) {
        self.int_at(e, 0, out)
    }

    fn bool(&self, e: &BoolE, out: &mut String) {
        self.bool_at(e, 0, out)
    }

    /// Writes `e` where an operand of binding strength `outer` is expected.
    fn int_at(&self, e: &IntE, outer: u8, out: &mut String) {
        let p = int_prec(e);
        let paren = if self.tight {
            outer > 0 && p < 9
        } else {
            p < outer
        };
        if paren {
            out.push('(');
        }
        match e {
            IntE::Name(n) => out.push_str(n),
            IntE::Lit(i) if *i < 0 => {
                let _ = write!(out, "-{}", -i);
            }
            IntE::Lit(i) => {
                let _ = write!(out, "{i}");
            }
            IntE::Neg(i) => {
                out.push('-');
                self.int_at(i, 7, out);
            }
            IntE::Bin(op, l, r) => {
                self.int_at(l, p, out);
                let _ = write!(out, " {op} ");
                self.int_at(r, p + 1, out);
            }
            IntE::ByConst(op, l, k) => {
                self.int_at(l, p, out);
                let _ = write!(out, " {op} ");
                self.int_at(&IntE::Lit(*k), p + 1, out);
            }
        }
        if paren {
            out.push(')');
        }
    }

    fn bool_at(&self, e: &BoolE, outer: u8, out: &mut String) {
        let p = bool_prec(e);
        let paren = if self.tight {
            outer > 0 && p < 9
        } else {
            p < outer
        };
        if paren {
            out.push('(');
        }
        match e {
            BoolE::Name(n) => out.push_str(n),
            BoolE::Lit(b) => {
                let _ = write!(out, "{b}");
            }
            BoolE::Not(i) => {
                out.push_str("not ");
                self.bool_at(i, 3, out);
            }
            BoolE::Bin(op, l, r) => {
                self.bool_at(l, p, out);
                let _ = write!(out, " {op} ");
                self.bool_at(r, p + 1, out);
            }
            BoolE::Cmp(op, l, r) => {
                self.int_at(l, p, out);
                let _ = write!(out, " {op} ");
                self.int_at(r, p + 1, out);
            }
        }
        if paren {
            out.push(')');
        }
    }
}

fn int_expr(names: Vec<&'static str>, depth: u32) -> BoxedStrategy<IntE> {
    let leaf = prop_oneof![
        3 => select(names).prop_map(IntE::Name),
        2 => (-3i64..10).prop_map(IntE::Lit),
    ];
    leaf.prop_recursive(depth, 8, 2, |inner| {
        prop_oneof![
            1 => inner.clone().prop_map(|e| IntE::Neg(Box::new(e))),
            4 => (select(vec!["+", "-", "*"]), inner.clone(), inner.clone())
                .prop_map(|(op, l, r)| IntE::Bin(op, Box::new(l), Box::new(r))),
            2 => (select(vec!["/", "%"]), inner, select(vec![-3i64, -2, -1, 1, 2, 3, 7]))
                .prop_map(|(op, l, k)| IntE::ByConst(op, Box::new(l), k)),
        ]
    })
    .boxed()
}

fn bool_expr(
    ints: Vec<&'static str>,
    bools: Vec<&'static str>,
    depth: u32,
) -> BoxedStrategy<BoolE> {
    let cmp = (
        select(vec!["<", "<=", ">", ">=", "==", "!="]),
        int_expr(ints.clone(), 2),
        int_expr(ints, 2),
    )
        .prop_map(|(op, l, r)| BoolE::Cmp(op, l, r));
    let leaf = prop_oneof![
        3 => select(bools).prop_map(BoolE::Name),
        1 => any::<bool>().prop_map(BoolE::Lit),
        4 => cmp,
    ];
    leaf.prop_recursive(depth, 12, 2, |inner| {
        prop_oneof![
            2 => inner.clone().prop_map(|e| BoolE::Not(Box::new(e))),
            5 => (select(vec!["and", "or", "==", "!="]), inner.clone(), inner)
                .prop_map(|(op, l, r)| BoolE::Bin(op, Box::new(l), Box::new(r))),
        ]
    })
    .boxed()
}

/// What a generated rule applies to.
#[derive(Clone, Copy, Debug)]
enum Head {
    Remove,
    Leave,
    UnapproveMove,
    Apply,
}

impl Head {
    fn text(self) -> &'static str {
        match self {
            Head::Remove => "remove controlplane",
            Head::Leave => "leave controlplane",
            Head::UnapproveMove => "unapprove, move controlplane",
            Head::Apply => "apply controlplane",
        }
    }

    /// Sites that keep the rule on runtime events.
    fn sites(self) -> Vec<&'static str> {
        match self {
            Head::Remove | Head::Leave => vec!["", " at webhook", " at controller"],
            Head::UnapproveMove => vec!["", " at webhook"],
            Head::Apply => vec!["", " at controller"],
        }
    }

    fn ints(self) -> Vec<&'static str> {
        let mut v = match self {
            Head::Apply => INT_FACTS_APPLY.to_vec(),
            _ => INT_FACTS_REMOVE.to_vec(),
        };
        v.push("k0");
        v
    }

    fn bools(self) -> Vec<&'static str> {
        let mut v = match self {
            Head::Apply => COMMON_BOOLS.to_vec(),
            _ => BOOL_FACTS_REMOVE.to_vec(),
        };
        v.push("b0");
        v
    }
}

#[derive(Clone, Debug)]
struct GenRule {
    head: Head,
    site: &'static str,
    verdict: &'static str,
    when: Option<BoolE>,
    unless: Option<BoolE>,
}

fn gen_rule() -> impl Strategy<Value = GenRule> {
    select(vec![
        Head::Remove,
        Head::Leave,
        Head::UnapproveMove,
        Head::Apply,
    ])
    .prop_flat_map(|head| {
        (
            select(head.sites()),
            select(vec!["refuse", "refuse", "warn", "hold"]),
            prop::option::weighted(0.85, bool_expr(head.ints(), head.bools(), 3)),
            prop::option::weighted(0.4, bool_expr(head.ints(), head.bools(), 2)),
        )
            .prop_map(move |(site, verdict, when, unless)| {
                let (site, verdict) = match (head, verdict, site) {
                    // A hold is a controller verdict; unapprove and move never reach it.
                    (Head::UnapproveMove, "hold", _) => (site, "refuse"),
                    (_, "hold", " at webhook") => ("", "hold"),
                    other => (other.2, other.1),
                };
                GenRule {
                    head,
                    site,
                    verdict,
                    when,
                    unless,
                }
            })
    })
}

#[derive(Clone, Debug)]
struct GenFile {
    tight: bool,
    k0: IntE,
    b0: BoolE,
    rules: Vec<GenRule>,
}

impl GenFile {
    fn source(&self) -> String {
        let p = Printer { tight: self.tight };
        let mut s = String::from("# generated\n");
        s.push_str("let k0 = ");
        p.int(&self.k0, &mut s);
        s.push_str("\nlet b0 = ");
        p.bool(&self.b0, &mut s);
        s.push('\n');
        for (i, r) in self.rules.iter().enumerate() {
            let _ = write!(
                s,
                "\nrule r{i}\n  {} {}{}\n",
                r.verdict,
                r.head.text(),
                r.site
            );
            if let Some(w) = &r.when {
                s.push_str("  when ");
                p.bool(w, &mut s);
                s.push('\n');
            }
            if let Some(u) = &r.unless {
                s.push_str("  unless ");
                p.bool(u, &mut s);
                s.push('\n');
            }
            if r.verdict == "hold" {
                s.push_str("  reason Held\n");
            }
            let _ = writeln!(s, "  say \"r{i}: {{machine}} with {{approved}} approved\"");
        }
        s
    }
}

fn gen_file() -> impl Strategy<Value = GenFile> {
    let common_ints = || INT_FACTS_REMOVE.to_vec();
    (
        any::<bool>(),
        int_expr(common_ints(), 1),
        bool_expr(common_ints(), COMMON_BOOLS.to_vec(), 1),
        prop::collection::vec(gen_rule(), 1..5),
    )
        .prop_map(|(tight, k0, b0, rules)| GenFile {
            tight,
            k0,
            b0,
            rules,
        })
}

/// Facts for the generated files: small ints (negative too) and random bools.
fn gen_facts() -> impl Strategy<Value = FactValues> {
    let per_fact: Vec<BoxedStrategy<Value<'static>>> = FACTS
        .iter()
        .map(|info| match info.ty {
            Type::Int => (-3i64..12).prop_map(Value::Int).boxed(),
            Type::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
            Type::Enum(EnumKind::Role) => select(vec!["controlplane", "worker"])
                .prop_map(Value::Str)
                .boxed(),
            Type::Enum(kind @ (EnumKind::OperationKind | EnumKind::Step)) => {
                select(kind.values().to_vec()).prop_map(Value::Str).boxed()
            }
            Type::Name => select(NAMES.to_vec()).prop_map(Value::Str).boxed(),
        })
        .collect();
    per_fact.prop_map(FactValues)
}

/// Names the shipped rules compare with, and others.
const NAMES: &[&str] = &[
    "",
    "a",
    "m-1",
    "Succeeded",
    "Paused",
    "reset",
    "etcd-restore",
];

// ---- the properties ---------------------------------------------------------------------

#[test]
fn generated_rules_table_agrees_with_reference() {
    static CASES: AtomicUsize = AtomicUsize::new(0);
    static COMPILED: AtomicUsize = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (gen_file(), prop::collection::vec(gen_facts(), 24));
    let result = runner.run(&strategy, |(file, fact_sets)| {
        CASES.fetch_add(1, Ordering::Relaxed);
        let src = file.source();
        let (files, result) = checked(&src);
        if result.has_errors() {
            return Ok(());
        }
        COMPILED.fetch_add(1, Ordering::Relaxed);
        let table = compile(&result.program, &files).expect("compiles");
        // The same rows with every one on the stack machine (no flat branches).
        let stack =
            compile_with(&result.program, &files, Options { flat: false }).expect("compiles");
        prop_assert_eq!(result.program.rules.len(), file.rules.len(), "{}", src);
        for facts in &fact_sets {
            agree(&result.program, &table, facts, &src)?;
            agree(&result.program, &stack, facts, &src)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (cases, compiled) = (
        CASES.load(Ordering::Relaxed),
        COMPILED.load(Ordering::Relaxed),
    );
    // Shrinking reruns cases; only a passing run's counts are meaningful, and then most
    // generated files must check.
    assert!(
        compiled * 10 >= cases * 9,
        "only {compiled} of {cases} generated files checked without errors"
    );
}

/// The generator writes well-typed files: a sample with the diagnostics of any that fail.
#[test]
fn generated_rules_mostly_check() {
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let mut failures = Vec::new();
    let mut total = 0;
    for _ in 0..64 {
        let tree = gen_file()
            .new_tree(&mut runner)
            .expect("the generator always yields a value");
        let file = proptest::strategy::ValueTree::current(&tree);
        let src = file.source();
        let (files, result) = checked(&src);
        total += 1;
        if result.has_errors() {
            failures.push(format!(
                "{src}\n{}",
                render_human(&result.diagnostics, &files, false)
            ));
        }
    }
    assert!(
        failures.len() * 10 <= total,
        "{} of {total} generated files have errors; first:\n{}",
        failures.len(),
        failures.first().map(String::as_str).unwrap_or("")
    );
}

#[test]
fn shipped_rules_table_agrees_with_reference() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
    let files = ichor_rules::ruleset::read_sources(&[root]).expect("rules/ loads");
    let result = check(&files);
    assert!(
        result.diagnostics.is_empty(),
        "{}",
        render_human(&result.diagnostics, &files, false)
    );
    let table = compile(&result.program, &files).expect("compiles");
    let stack = compile_with(&result.program, &files, Options { flat: false }).expect("compiles");
    let (rows, on_stack) = table.rows_on_stack();
    assert!(
        rows > 0 && on_stack == 0,
        "every shipped row fits the flat form"
    );
    assert_eq!(
        stack.rows_on_stack(),
        (rows, rows),
        "`flat: false` puts every row on the stack machine"
    );
    let program = result.program;
    let facts = FACTS
        .iter()
        .map(|info| match info.ty {
            Type::Int => (-2i64..10).prop_map(Value::Int).boxed(),
            Type::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
            Type::Enum(EnumKind::Role) => select(vec!["controlplane", "worker"])
                .prop_map(Value::Str)
                .boxed(),
            Type::Enum(kind @ (EnumKind::OperationKind | EnumKind::Step)) => {
                select(kind.values().to_vec()).prop_map(Value::Str).boxed()
            }
            Type::Name => select(NAMES.to_vec()).prop_map(Value::Str).boxed(),
        })
        .collect::<Vec<_>>()
        .prop_map(FactValues);
    let mut runner = TestRunner::new(Config {
        cases: 1024,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&facts, |facts| {
        agree(&program, &table, &facts, "rules/")?;
        agree(&program, &stack, &facts, "rules/ (stack machine)")
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The printer of conditions (`when_text`, the table listing) writes text that parses back
/// to the same expression.
#[test]
fn printed_conditions_parse_back_the_same() {
    fn strip(e: &Expr) -> String {
        // Debug without spans: rebuild with zero spans.
        fn zero(e: &Expr) -> Expr {
            use ichor_rules::syntax::ast::ExprKind::*;
            let kind = match &e.kind {
                Unary(op, i) => Unary(*op, Box::new(zero(i))),
                Binary(op, l, r) => Binary(*op, Box::new(zero(l)), Box::new(zero(r))),
                other => other.clone(),
            };
            Expr {
                kind,
                span: Default::default(),
            }
        }
        format!("{:?}", zero(e))
    }
    let strategy = (
        any::<bool>(),
        bool_expr(INT_FACTS_APPLY.to_vec(), BOOL_FACTS_REMOVE.to_vec(), 4),
    );
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |(tight, e)| {
        let mut src = String::new();
        Printer { tight }.bool(&e, &mut src);
        let parsed = ichor_rules::syntax::parse_expr(&src)
            .map_err(|d| TestCaseError::fail(format!("{src}: {}", d[0].message)))?;
        let printed = parsed.to_string();
        let reparsed = ichor_rules::syntax::parse_expr(&printed).map_err(|d| {
            TestCaseError::fail(format!("{src} printed as {printed}: {}", d[0].message))
        })?;
        prop_assert_eq!(
            strip(&parsed),
            strip(&reparsed),
            "{} printed as {}",
            src,
            printed
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Fact slots and the values the generators produce line up with the declared types.
#[test]
fn generated_fact_values_have_the_declared_types() {
    let mut runner = TestRunner::new(Config::with_cases(8));
    let tree = gen_facts().new_tree(&mut runner).expect("value");
    let facts = proptest::strategy::ValueTree::current(&tree);
    assert_eq!(facts.0.len(), FACT_COUNT);
    for info in FACTS {
        let v = facts.get(info.fact);
        let ok = matches!(
            (info.ty, v),
            (Type::Int, Value::Int(_))
                | (Type::Bool, Value::Bool(_))
                | (Type::Name | Type::Enum(_), Value::Str(_))
        );
        assert!(ok, "{} = {v:?}", info.name);
    }
}

/// `compile::reorder` puts the cheap operand of `and`/`or` first ("conditions are pure, so
/// the order is free"). That holds only while neither side can fail: when the cheap side
/// divides by zero (or overflows) and the expensive side already decides the `and`, the
/// reference evaluator short-circuits to "no match" while the table evaluates the failing
/// side first and fails closed. The exact lints now refuse `workers - 7` as a divisor
/// (it is zero at workers = 7); the table compiled from the rule regardless must still
/// agree with the reference evaluator, which is what this pins.
#[test]
fn reordering_keeps_the_reference_result_when_the_cheap_side_fails() {
    let src = "\
rule dead-member-ratio
  refuse remove controlplane
  when member.dead and approved / (workers - 7) > 0
  say \"{machine}\"
";
    let (files, result) = checked(src);
    // `check` refuses the rule now (the exact lints find workers = 7); the table built from
    // it anyway must still agree with the reference evaluator.
    let rendered = render_human(&result.diagnostics, &files, false);
    assert!(
        result.has_errors() && rendered.contains("division by zero"),
        "{rendered}"
    );
    let table = compile(&result.program, &files).expect("compiles");
    let mut values: Vec<Value<'static>> = FACTS
        .iter()
        .map(|info| match info.ty {
            Type::Int => Value::Int(1),
            Type::Bool => Value::Bool(false),
            _ => Value::Str(""),
        })
        .collect();
    values[Fact::Workers.slot()] = Value::Int(7);
    values[Fact::MemberDead.slot()] = Value::Bool(false);
    let facts = FactValues(values);
    let event = (
        ichor_rules::vocab::Verb::Remove,
        ichor_rules::vocab::Subject::ControlPlane,
        ichor_rules::vocab::Site::Webhook,
    );
    let want = reference_hits(&result.program, event, &facts).expect("evaluates");
    let got = table_hits_plain(&table, event, &facts).expect("evaluates");
    assert_eq!(
        got, want,
        "member.dead = false decides the `and` (reference: no match); the table evaluates \
         `approved / (workers - 7)` first, divides by zero and refuses"
    );
}

/// String literals print as Rust debug strings (`{s:?}`), so a literal brace, written `{{`
/// in the source, prints as a single `{` and reads back as a placeholder: the condition
/// `phase == "a{{b}}"` is listed (`when_text`, `ichor-rules table`) as `phase == "a{b}"`,
/// which parses as the text "a" followed by the placeholder `{b}`.
#[test]
fn printed_string_literals_parse_back_the_same() {
    for src in [
        r#"phase == "a{{b}}""#,
        r#"phase == "q\"x""#,
        r#"phase == "tab\there""#,
    ] {
        let parsed = ichor_rules::syntax::parse_expr(src).expect("parses");
        let printed = parsed.to_string();
        let reparsed = ichor_rules::syntax::parse_expr(&printed)
            .unwrap_or_else(|d| panic!("{src} printed as {printed}: {}", d[0].message));
        assert_eq!(reparsed.to_string(), printed, "{src} printed as {printed}");
        let lit = |e: &Expr| match &e.kind {
            ichor_rules::syntax::ast::ExprKind::Binary(_, _, r) => format!("{:?}", r.kind),
            other => format!("{other:?}"),
        };
        assert_eq!(lit(&reparsed), lit(&parsed), "{src} printed as {printed}");
    }
}

/// Deep arithmetic, bools compared with `==`, text comparisons and overflow take their own
/// paths, flat and on the stack machine.
/// All of them must still agree with the reference, deferred expensive facts included.
#[test]
fn deep_and_unusual_rows_agree_with_reference() {
    let src = "\
rule deep
  refuse remove controlplane
  when (approved - 1) + ((count - 1) + ((workers - 1) + ((approved - 1) + ((count - 1) + ((workers - 1) + ((approved - 1) * count)))))) > 9
  unless member.dead
  say \"deep\"

rule deep-overflow
  refuse remove controlplane
  when (approved + 1) * ((count + 1) * ((workers + 1) * ((approved + 1) * ((count + 1) * ((workers + 1) * (approved * 4611686018427387904)))))) > 1
  say \"overflow\"

rule bools-compared
  warn remove controlplane
  when (approved > count) == member.dead and (not schedulable) != (workers < 2)
  say \"bools\"

rule texts
  refuse remove controlplane
  when machine == \"m-1\" or cluster != \"a\" and -approved < -count
  unless (count - 2) / (workers - 1) > 1
  say \"texts\"
";
    // The checker reports the two rules that can fail (overflow, division by zero) as
    // errors; the table built anyway must still fail closed on them as the reference does.
    let (files, result) = checked(src);
    assert_eq!(
        result.program.rules.len(),
        4,
        "{}",
        render_human(&result.diagnostics, &files, false)
    );
    // The flat programs have more registers than the language lets an expression need
    // (`MAX_STACK` intermediate values), so every row runs flat; `flat: false` puts them on
    // the stack machine. Both must agree with the reference.
    const { assert!(ichor_rules::compile::flat::MAX_REGS > ichor_rules::compile::MAX_STACK) };
    let flat = compile(&result.program, &files).expect("compiles");
    let stack = compile_with(&result.program, &files, Options { flat: false }).expect("compiles");
    let event = (
        ichor_rules::vocab::Verb::Remove,
        ichor_rules::vocab::Subject::ControlPlane,
        ichor_rules::vocab::Site::Webhook,
    );
    let uses_stack = |table: &Table| {
        let (_, program) = table.group(event.0, event.1, event.2).expect("a group");
        program
            .ins
            .iter()
            .any(|i| i.op == ichor_rules::compile::flat::Op::Stack)
    };
    assert!(!uses_stack(&flat), "the deep rows run flat");
    assert!(
        uses_stack(&stack),
        "`flat: false` runs them on the stack machine"
    );
    let program = result.program;
    for table in [&flat, &stack] {
        let mut runner = TestRunner::new(Config {
            cases: 512,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&gen_facts(), |facts| agree(&program, table, &facts, src));
        if let Err(e) = result {
            panic!("{e}");
        }
    }
}

// ---- explain decides as eval ------------------------------------------------------------
//
// `explain` runs a traced session: the same flat program as `eval` decides the rows, and the
// trace adds each row's `when`/`unless` values and each `let`'s value (issue 11: one
// semantics). These properties hold the trace to that: for generated rule sets (lets that
// chain, arithmetic that overflows on wide facts, refuse/warn/hold rows, several verbs) and
// generated facts, on every runtime event,
// - the traced decision (verdict, deciding rules, rendered messages, warnings) and the
//   facts it had to wait for equal the untraced one's;
// - every row of the event is traced once, matched exactly when it is among the hits, and
//   its `when`/`unless` values and error are the reference evaluator's;
// - every `let` the table keeps has the reference evaluator's value (or its error).

use ichor_rules::interp::{Decision, TraceRow, decide_into};

/// Facts for the explain properties: mostly small, sometimes at the ends of i64, so that
/// arithmetic fails (overflow) as well as succeeds.
fn gen_facts_wide() -> impl Strategy<Value = FactValues> {
    let per_fact: Vec<BoxedStrategy<Value<'static>>> = FACTS
        .iter()
        .map(|info| match info.ty {
            Type::Int => prop_oneof![
                8 => (-3i64..12).prop_map(Value::Int),
                1 => select(vec![i64::MAX, i64::MIN, i64::MAX / 2, i64::MIN + 1])
                    .prop_map(Value::Int),
            ]
            .boxed(),
            Type::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
            Type::Enum(EnumKind::Role) => select(vec!["controlplane", "worker"])
                .prop_map(Value::Str)
                .boxed(),
            Type::Enum(kind @ (EnumKind::OperationKind | EnumKind::Step)) => {
                select(kind.values().to_vec()).prop_map(Value::Str).boxed()
            }
            Type::Name => select(NAMES.to_vec()).prop_map(Value::Str).boxed(),
        })
        .collect();
    per_fact.prop_map(FactValues)
}

/// A generated file with more `let`s: `k1` over facts, `k2` on `k1`, `k0` and a fact, `b1`
/// on `b0` and `k2`; some messages show `k2` and `b1`, so lets are used through messages
/// (and through each other) as well as in conditions.
fn explain_source(file: &GenFile, k1: &IntE, sel: u8) -> String {
    let p = Printer { tight: file.tight };
    let mut s = file.source();
    s.push_str("\nlet k1 = ");
    p.int(k1, &mut s);
    s.push_str("\nlet k2 = k1 - k0 + approved\nlet b1 = b0 or k2 > 3\n");
    // Say the new lets in some rules' messages (placeholders), by rewriting their `say`.
    let mut out = String::new();
    for (i, line) in s.lines().enumerate() {
        if line.starts_with("  say ") && !(i as u8).wrapping_add(sel).is_multiple_of(3) {
            let _ = writeln!(out, "{} k2={{k2}} b1={{b1}}\"", line.trim_end_matches('"'));
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

type Event = (
    ichor_rules::vocab::Verb,
    ichor_rules::vocab::Subject,
    ichor_rules::vocab::Site,
);

/// The facts waited for, the decision, and (traced) the rows.
type Decided = (Vec<Fact>, Decision, Option<Vec<TraceRow>>);

/// Decides one event as the runtime does: interrupted for a fact, supply it and run again.
/// Returns the facts waited for, the decision, and (traced) the rows.
fn decide_event(
    table: &Table,
    facts: &FactValues,
    event: Event,
    traced: bool,
    deferred: bool,
) -> Result<Decided, String> {
    fn run<'a, F: Facts<'a>>(
        mut s: Session<'a, F>,
        facts: &FactValues,
        event: Event,
        traced: bool,
    ) -> Result<Decided, String> {
        if traced {
            s = s.traced();
        }
        let mut waited = Vec::new();
        let mut decision = Decision::default();
        for _ in 0..=FACT_COUNT {
            match decide_into(&mut s, event, &mut decision) {
                Ok(()) => return Ok((waited, decision, s.take_trace())),
                Err(Interrupt::Need(f)) => {
                    waited.push(f);
                    s.supply(f, facts.get(f));
                }
            }
        }
        Err("the session kept interrupting".into())
    }
    if deferred {
        run(Session::new(table, Deferred(facts)), facts, event, traced)
    } else {
        run(Session::new(table, Plain(facts)), facts, event, traced)
    }
}

/// The reference value of a condition, as the trace shows it.
fn reference_bool(e: &Expr, facts: &FactValues) -> Result<bool, String> {
    let mut get = |f: Fact| -> Result<Value<'_>, EvalError> { Ok(facts.get(f)) };
    match eval(e, &mut get) {
        Ok(Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("a condition evaluated to {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Checks one traced row against the reference evaluator and the decision's hits.
fn check_row(
    program: &Program,
    row: &TraceRow,
    facts: &FactValues,
    ctx: &dyn Fn() -> String,
) -> Result<(), TestCaseError> {
    let r = &program.rules[row.rule_index as usize];
    prop_assert_eq!(&row.rule, &r.name, "{}", ctx());
    // A condition the decision did not need (a failed `when` fires the row before its
    // `unless` is read) may need a fact the runtime defers and never fetched: the trace
    // shows it as not read. Only an expensive fact is ever deferred.
    if let Some(f) = row.unread {
        prop_assert_eq!(
            f.info().cost,
            Cost::Expensive,
            "{} not read for {}\n{}",
            f.name(),
            r.name,
            ctx()
        );
    }
    let unread = |shown: Option<bool>, reference: Option<bool>| {
        shown.is_none() && reference.is_some() && row.unread.is_some()
    };
    let when = r.when.as_ref().map(|e| reference_bool(e, facts));
    let when_value = when.as_ref().and_then(|w| w.as_ref().ok().copied());
    if !unread(row.when, when_value) {
        prop_assert_eq!(row.when, when_value, "`when` of {}\n{}", r.name, ctx());
    }
    let unless = match &when {
        Some(Ok(false)) => None,
        _ => r.unless.as_ref().map(|e| reference_bool(e, facts)),
    };
    let unless_value = unless.as_ref().and_then(|u| u.as_ref().ok().copied());
    if !unread(row.unless, unless_value) {
        prop_assert_eq!(
            row.unless,
            unless_value,
            "`unless` of {}\n{}",
            r.name,
            ctx()
        );
    }
    let error = [&when, &unless]
        .into_iter()
        .flatten()
        .find_map(|c| c.as_ref().err().cloned());
    prop_assert_eq!(
        row.error.is_some(),
        error.is_some(),
        "error of {}: {:?} vs {:?}\n{}",
        r.name,
        row.error,
        error,
        ctx()
    );
    let fires = match &error {
        Some(_) => r.verdict != Verdict::Warn,
        None => when_value.unwrap_or(true) && !unless_value.unwrap_or(false),
    };
    prop_assert_eq!(row.matched, fires, "matched of {}\n{}", r.name, ctx());
    Ok(())
}

/// One rule set and fact vector: explain (traced) against eval (untraced) and the reference.
fn explain_agrees(
    program: &Program,
    table: &Table,
    facts: &FactValues,
    src: &str,
) -> Result<(), TestCaseError> {
    for &event in RUNTIME_EVENTS {
        let (v, s, site) = event;
        let ctx = || {
            format!(
                "on `{} {}` at the {}\nfacts: {}\nsource:\n{}",
                v.name(),
                s.name(),
                site.name(),
                show_facts(program, facts),
                src
            )
        };
        for deferred in [false, true] {
            let (w_eval, d_eval, _) =
                decide_event(table, facts, event, false, deferred).map_err(TestCaseError::fail)?;
            let (w_expl, d_expl, rows) =
                decide_event(table, facts, event, true, deferred).map_err(TestCaseError::fail)?;
            prop_assert_eq!(&w_expl, &w_eval, "facts waited for, {}", ctx());
            prop_assert_eq!(d_expl.verdict(), d_eval.verdict(), "verdict {}", ctx());
            prop_assert_eq!(&d_expl, &d_eval, "decision {}", ctx());
            let rows = rows.unwrap_or_default();
            let want: Vec<u32> = table.rows(v, s, site).iter().map(|r| r.rule).collect();
            let got: Vec<u32> = rows.iter().map(|r| r.rule_index).collect();
            prop_assert_eq!(&got, &want, "the rows traced {}", ctx());
            for row in &rows {
                check_row(program, row, facts, &ctx)?;
                // Matched rows are exactly the decision's findings.
                let named = d_eval
                    .refusals
                    .iter()
                    .chain(&d_eval.holds)
                    .chain(&d_eval.warnings)
                    .any(|f| f.rule == row.rule);
                prop_assert_eq!(row.matched, named, "{} in the decision {}", row.rule, ctx());
            }
        }
    }
    // Every let the table keeps, evaluated by the session, is the reference's value.
    prop_assert_eq!(table.lets.len(), program.lets.len());
    let mut session = Session::new(table, Plain(facts));
    for (i, l) in program.lets.iter().enumerate() {
        prop_assert_eq!(&table.lets[i].name, &l.name);
        let mut get = |f: Fact| -> Result<Value<'_>, EvalError> { Ok(facts.get(f)) };
        let want = eval(&l.expr, &mut get);
        let got = session
            .let_value(i as u32)
            .map_err(|e| TestCaseError::fail(format!("interrupted: {e:?}")))?;
        prop_assert_eq!(
            got,
            want,
            "let {} = {}\nfacts: {}\nsource:\n{}",
            l.name,
            table.lets[i].definition,
            show_facts(program, facts),
            src
        );
    }
    Ok(())
}

#[test]
fn explain_decides_as_eval_on_generated_rules() {
    static CASES: AtomicUsize = AtomicUsize::new(0);
    static COMPILED: AtomicUsize = AtomicUsize::new(0);
    static FAILED_ROWS: AtomicUsize = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        gen_file(),
        int_expr(INT_FACTS_REMOVE.to_vec(), 2),
        any::<u8>(),
        prop::collection::vec(gen_facts_wide(), 16),
    );
    let result = runner.run(&strategy, |(file, k1, sel, fact_sets)| {
        CASES.fetch_add(1, Ordering::Relaxed);
        let src = explain_source(&file, &k1, sel);
        let (files, result) = checked(&src);
        if result.has_errors() {
            return Ok(());
        }
        COMPILED.fetch_add(1, Ordering::Relaxed);
        let table = compile(&result.program, &files).expect("compiles");
        for facts in &fact_sets {
            explain_agrees(&result.program, &table, facts, &src)?;
            for &(v, s, site) in RUNTIME_EVENTS {
                let (_, _, rows) = decide_event(&table, facts, (v, s, site), true, false)
                    .map_err(TestCaseError::fail)?;
                let failed = rows.iter().flatten().filter(|r| r.error.is_some()).count();
                FAILED_ROWS.fetch_add(failed, Ordering::Relaxed);
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (cases, compiled) = (
        CASES.load(Ordering::Relaxed),
        COMPILED.load(Ordering::Relaxed),
    );
    assert!(
        compiled * 10 >= cases * 8,
        "only {compiled} of {cases} generated files checked without errors"
    );
    // The wide facts make some rows fail to evaluate, so the error paths are exercised.
    assert!(
        FAILED_ROWS.load(Ordering::Relaxed) > 0,
        "no generated row failed to evaluate"
    );
}

/// The shipped rules: explain decides as eval, and every let has the reference's value.
#[test]
fn explain_decides_as_eval_on_the_shipped_rules() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let mut files = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("rules/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "rules"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p).expect("read");
        files.push(SourceFile::new(p.display().to_string(), text));
    }
    let result = check(&files);
    assert!(!result.has_errors(), "the shipped rules check");
    let table = compile(&result.program, &files).expect("compiles");
    assert!(!table.lets.is_empty(), "the shipped rules use lets");
    let src = "(the shipped rules)";
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&gen_facts_wide(), |facts| {
        explain_agrees(&result.program, &table, &facts, src)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
