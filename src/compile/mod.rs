//! Checked program -> decision table. Rows are grouped by (verb, subject, site); each
//! condition becomes a short stack-machine program over fact slots, so evaluating a row
//! needs no string lookups and no allocation.

use crate::check::{CheckedPlan, CheckedRule, Event, Program};
use crate::diagnostics::SourceFile;
use crate::syntax::ast::{BinOp, Expr, ExprKind, Message, MessagePart, Span, UnOp};
use crate::vocab::{Cost, Fact, Site, Subject, Verb, Verdict};
use serde::Serialize;
use std::sync::Arc;

/// The deepest evaluation stack a condition may need.
pub const MAX_STACK: usize = 32;

/// One instruction of a compiled condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Push the value of a fact (asked of the provider at most once per decision).
    Fact(u8),
    Int(i64),
    Bool(bool),
    /// Push a string constant of the table.
    Str(u32),
    Not,
    Neg,
    /// Pop two, push the result.
    Bin(BinOp),
    /// If the top is false, jump to the target keeping it; else pop it (for `and`).
    JumpIfFalse(u32),
    /// If the top is true, jump to the target keeping it; else pop it (for `or`).
    JumpIfTrue(u32),
}

/// A compiled expression.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Code {
    pub ops: Vec<Op>,
    /// The stack depth it needs (at most [`MAX_STACK`]).
    pub depth: u8,
    /// Whether it reads an expensive fact.
    pub expensive: bool,
}

/// A compiled message: text and placeholders.
#[derive(Clone, Debug)]
pub enum Piece {
    Text(String),
    Value(Code),
}

/// One row of the table: a rule's condition for one (verb, subject, site).
#[derive(Clone, Debug)]
pub struct Row {
    /// Index into [`Table::rules`].
    pub rule: u32,
    pub verdict: Verdict,
    pub when: Option<Code>,
    pub unless: Option<Code>,
}

/// What the table keeps of a rule for messages, explanations and reviewers.
#[derive(Clone, Debug, Serialize)]
pub struct RuleMeta {
    pub name: String,
    pub verdict: Verdict,
    pub head: String,
    pub file: String,
    pub line: usize,
    #[serde(skip)]
    pub span: Span,
    #[serde(rename = "when", skip_serializing_if = "Option::is_none")]
    pub when_text: Option<String>,
    #[serde(rename = "unless", skip_serializing_if = "Option::is_none")]
    pub unless_text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The message as written, placeholders included.
    pub say: String,
    #[serde(skip)]
    pub message: Vec<Piece>,
}

/// A compiled plan step.
#[derive(Clone, Debug)]
pub struct PlanStep {
    pub action: usize,
    pub argument: Option<String>,
    pub text: String,
    pub guard_text: Option<String>,
    pub when: Option<Code>,
    pub unless: Option<Code>,
    pub message: Option<Vec<Piece>>,
    pub say: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub verb: Verb,
    pub subject: Subject,
    pub steps: Vec<PlanStep>,
}

const GROUPS: usize = Verb::ALL.len() * Subject::ALL.len() * Site::ALL.len();

/// The decision table: what the interpreter evaluates.
#[derive(Clone, Debug)]
pub struct Table {
    pub rules: Vec<RuleMeta>,
    groups: Vec<Vec<Row>>,
    pub strings: Vec<Arc<str>>,
    pub plans: Vec<Plan>,
    /// Events covered by an `allow` (for reviewers).
    pub allowed: Vec<Event>,
}

pub fn group_index(verb: Verb, subject: Subject, site: Site) -> usize {
    (verb.index() * Subject::ALL.len() + subject.index()) * Site::ALL.len() + site.index()
}

impl Table {
    /// The rows for one (verb, subject, site), in source order.
    pub fn rows(&self, verb: Verb, subject: Subject, site: Site) -> &[Row] {
        self.groups
            .get(group_index(verb, subject, site))
            .map(|g| g.as_slice())
            .unwrap_or(&[])
    }

    pub fn plan(&self, verb: Verb, subject: Subject) -> Option<&Plan> {
        self.plans
            .iter()
            .find(|p| p.verb == verb && p.subject == subject)
    }

    /// Every non-empty group with its key, for printing.
    pub fn groups(&self) -> Vec<(Event, &[Row])> {
        let mut out = Vec::new();
        for verb in Verb::ALL {
            for subject in Subject::ALL {
                for site in Site::ALL {
                    let rows = self.rows(verb, subject, site);
                    if !rows.is_empty() {
                        out.push(((verb, subject, site), rows));
                    }
                }
            }
        }
        out
    }

    pub fn row_count(&self) -> usize {
        self.groups.iter().map(|g| g.len()).sum()
    }
}

/// Compiles a checked program. The program must have checked without errors.
pub fn compile(program: &Program, files: &[SourceFile]) -> Table {
    let mut c = Compiler {
        strings: Vec::new(),
    };
    let mut groups: Vec<Vec<Row>> = vec![Vec::new(); GROUPS];
    let mut rules = Vec::with_capacity(program.rules.len());
    for (i, r) in program.rules.iter().enumerate() {
        let when = r.when.as_ref().map(|e| c.code(e));
        let unless = r.unless.as_ref().map(|e| c.code(e));
        for (verb, subject, site) in &r.events {
            groups[group_index(*verb, *subject, *site)].push(Row {
                rule: u32::try_from(i).unwrap_or(u32::MAX),
                verdict: r.verdict,
                when: when.clone(),
                unless: unless.clone(),
            });
        }
        rules.push(c.meta(r, files));
    }
    let plans = program.plans.iter().map(|p| c.plan(p)).collect();
    Table {
        rules,
        groups,
        strings: c.strings,
        plans,
        allowed: program.allowed.clone(),
    }
}

struct Compiler {
    strings: Vec<Arc<str>>,
}

impl Compiler {
    fn meta(&mut self, r: &CheckedRule, files: &[SourceFile]) -> RuleMeta {
        let (file, line) = match files.get(r.file) {
            Some(f) => (f.display_path(), f.line_col(r.span.start).0),
            None => (String::new(), 0),
        };
        RuleMeta {
            name: r.name.clone(),
            verdict: r.verdict,
            head: r.head.clone(),
            file,
            line,
            span: r.span,
            when_text: r.when_text.clone(),
            unless_text: r.unless_text.clone(),
            reason: r.reason.clone(),
            say: r.say_text.clone(),
            message: self.message(&r.message),
        }
    }

    fn plan(&mut self, p: &CheckedPlan) -> Plan {
        Plan {
            verb: p.verb,
            subject: p.subject,
            steps: p
                .steps
                .iter()
                .map(|s| PlanStep {
                    action: s.action,
                    argument: s.argument.clone(),
                    text: s.text.clone(),
                    guard_text: s.guard_text.clone(),
                    when: s.when.as_ref().map(|e| self.code(e)),
                    unless: s.unless.as_ref().map(|e| self.code(e)),
                    say: s.say_text.clone(),
                    message: s.message.as_ref().map(|m| self.message(m)),
                })
                .collect(),
        }
    }

    fn message(&mut self, m: &Message) -> Vec<Piece> {
        m.parts
            .iter()
            .map(|p| match p {
                MessagePart::Text(t) => Piece::Text(t.clone()),
                MessagePart::Placeholder(e) => Piece::Value(self.code(e)),
            })
            .collect()
    }

    fn code(&mut self, e: &Expr) -> Code {
        let mut code = Code::default();
        let e = reorder(e);
        let depth = self.emit(&e, &mut code.ops, &mut code.expensive);
        code.depth = u8::try_from(depth.min(MAX_STACK)).unwrap_or(MAX_STACK as u8);
        code
    }

    fn string(&mut self, s: &str) -> u32 {
        if let Some(i) = self.strings.iter().position(|x| &**x == s) {
            return u32::try_from(i).unwrap_or(u32::MAX);
        }
        self.strings.push(Arc::from(s));
        u32::try_from(self.strings.len() - 1).unwrap_or(u32::MAX)
    }

    /// Emits `e`; returns the stack depth it needs.
    fn emit(&mut self, e: &Expr, ops: &mut Vec<Op>, expensive: &mut bool) -> usize {
        match &e.kind {
            ExprKind::Int(i) => {
                ops.push(Op::Int(*i));
                1
            }
            ExprKind::Bool(b) => {
                ops.push(Op::Bool(*b));
                1
            }
            ExprKind::Str(s, _) => {
                let i = self.string(s);
                ops.push(Op::Str(i));
                1
            }
            ExprKind::Name(n) => {
                // The checker resolved every name; an unknown one cannot reach here.
                let f = Fact::lookup(n).unwrap_or(Fact::Approved);
                if f.info().cost == Cost::Expensive {
                    *expensive = true;
                }
                ops.push(Op::Fact(u8::try_from(f.slot()).unwrap_or(0)));
                1
            }
            ExprKind::Unary(op, inner) => {
                let d = self.emit(inner, ops, expensive);
                ops.push(match op {
                    UnOp::Not => Op::Not,
                    UnOp::Neg => Op::Neg,
                });
                d
            }
            ExprKind::Binary(op @ (BinOp::And | BinOp::Or), l, r) => {
                let dl = self.emit(l, ops, expensive);
                let jump_at = ops.len();
                ops.push(Op::JumpIfFalse(0));
                let dr = self.emit(r, ops, expensive);
                let target = u32::try_from(ops.len()).unwrap_or(u32::MAX);
                ops[jump_at] = if *op == BinOp::And {
                    Op::JumpIfFalse(target)
                } else {
                    Op::JumpIfTrue(target)
                };
                dl.max(dr)
            }
            ExprKind::Binary(op, l, r) => {
                let dl = self.emit(l, ops, expensive);
                let dr = self.emit(r, ops, expensive);
                ops.push(Op::Bin(*op));
                dl.max(dr + 1)
            }
        }
    }
}

/// Puts the cheap operand of `and`/`or` first, so an expensive fact is fetched only when the
/// cheap conditions already decided nothing. Conditions are pure, but an operand that can
/// fail (division by zero, overflow) would change the result if it moved, so only operands
/// that cannot fail are swapped.
fn reorder(e: &Expr) -> Expr {
    let kind = match &e.kind {
        ExprKind::Binary(op @ (BinOp::And | BinOp::Or), l, r) => {
            let (l, r) = (reorder(l), reorder(r));
            if is_expensive(&l) && !is_expensive(&r) && !can_fail(&l) && !can_fail(&r) {
                ExprKind::Binary(*op, Box::new(r), Box::new(l))
            } else {
                ExprKind::Binary(*op, Box::new(l), Box::new(r))
            }
        }
        ExprKind::Binary(op, l, r) => {
            ExprKind::Binary(*op, Box::new(reorder(l)), Box::new(reorder(r)))
        }
        ExprKind::Unary(op, i) => ExprKind::Unary(*op, Box::new(reorder(i))),
        other => other.clone(),
    };
    Expr { kind, span: e.span }
}

/// Whether evaluating the expression can fail: integer arithmetic can overflow or divide by
/// zero; comparisons, logic and values cannot.
fn can_fail(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Unary(UnOp::Neg, _) => true,
        ExprKind::Unary(UnOp::Not, i) => can_fail(i),
        ExprKind::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod, _, _) => {
            true
        }
        ExprKind::Binary(_, l, r) => can_fail(l) || can_fail(r),
        _ => false,
    }
}

fn is_expensive(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Name(n) => Fact::lookup(n).is_some_and(|f| f.info().cost == Cost::Expensive),
        ExprKind::Unary(_, i) => is_expensive(i),
        ExprKind::Binary(_, l, r) => is_expensive(l) || is_expensive(r),
        _ => false,
    }
}
