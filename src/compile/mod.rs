//! Checked program -> decision table. Rows are grouped by (verb, subject, site); each
//! condition becomes a short stack-machine program over fact slots (for explanations,
//! messages and plan guards), and each group's `when and not unless` conditions become one
//! flat branch program (see [`flat`]) that the hot path runs, so evaluating a row needs no
//! string lookups and no allocation.

use crate::check::{
    CheckedPlan, CheckedRule, Event, Program, Typed, TypedKind, TypedPart, ValueKind,
};
use crate::diagnostics::SourceFile;
use crate::syntax::ast::{BinOp, Expr, Message, Span, UnOp};
use crate::vocab::{Site, Subject, Verb, Verdict};
use serde::Serialize;
use std::sync::Arc;

pub mod flat;
pub use flat::{FlatProgram, Ins};

/// The deepest evaluation stack a condition may need (a limit of the language, which the
/// checker reports).
pub use crate::check::MAX_STACK;

/// A text operand: names only ever meet `==` and `!=`, so they never reach the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Text {
    /// A name or enum fact.
    Fact(u8),
    /// A string constant of the table.
    Const(u32),
}

/// One instruction of a compiled condition. The stack holds integers only: bools are 0 and
/// 1, and text comparisons are single instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Push the value of an int or bool fact (asked of the provider at most once per session).
    Fact(u8),
    Int(i64),
    Not,
    Neg,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// The operator with a constant right operand, applied to the top of the stack in place.
    AddK(i64),
    SubK(i64),
    MulK(i64),
    DivK(i64),
    ModK(i64),
    EqK(i64),
    NeK(i64),
    LtK(i64),
    LeK(i64),
    GtK(i64),
    GeK(i64),
    /// Push whether two texts are equal (`ne`: differ).
    TextEq {
        a: Text,
        b: Text,
        ne: bool,
    },
    /// If the top is false, jump to the target keeping it; else pop it (for `and`).
    JumpIfFalse(u32),
    /// If the top is true, jump to the target keeping it; else pop it (for `or`).
    JumpIfTrue(u32),
    /// An expression the checker should have rejected; evaluates to a type error.
    Invalid,
}

/// What a compiled expression yields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Kind {
    #[default]
    Int,
    Bool,
}

/// A compiled int or bool expression.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Code {
    pub ops: Vec<Op>,
    pub kind: Kind,
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
    Name(Text),
}

/// One row of the table: a rule's condition for one (verb, subject, site).
#[derive(Clone, Debug)]
pub struct Row {
    /// Index into [`Table::rules`].
    pub rule: u32,
    pub verdict: Verdict,
    pub when: Option<Code>,
    pub unless: Option<Code>,
    /// Where `when and not unless` starts in the group's flat program: the hot path
    /// evaluates only this.
    pub entry: u32,
}

/// What the table keeps of a rule for messages, explanations and reviewers.
#[derive(Clone, Debug, Serialize)]
pub struct RuleMeta {
    pub name: String,
    /// Evaluated and recorded, never enforced: `rule NAME audit`, or switched by the
    /// deployment ([`Table::set_audit`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub audit: bool,
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
    /// The `let`s its conditions and message use (directly or through another), as indices
    /// into [`Table::lets`], in the order they are defined.
    #[serde(skip)]
    pub lets: Vec<u32>,
}

/// A `let` that rows or plan steps use, as explanations and reviewers show it. Conditions
/// have their `let`s inlined; this is what is left of the definition, and its value can be
/// evaluated against a session's facts with [`crate::interp::Session::let_value`].
#[derive(Clone, Debug, Serialize)]
pub struct LetMeta {
    pub name: String,
    /// The expression as written.
    pub definition: String,
    pub file: String,
    pub line: usize,
    /// The whole definition in its file (`let name = expr`).
    #[serde(skip)]
    pub span: Span,
    /// The expression, `let`s inlined, compiled as a message placeholder is: a text
    /// ([`Piece::Name`]) or an int or bool program ([`Piece::Value`]).
    #[serde(skip)]
    pub value: Piece,
    /// The facts it reads, as a bit set of slots.
    #[serde(skip)]
    pub reads: u64,
}

/// A compiled plan step.
#[derive(Clone, Debug)]
pub struct PlanStep {
    pub action: crate::vocab::Action,
    pub argument: Option<String>,
    /// How long the step may wait (`within`): past it, the operation fails.
    pub within: Option<std::time::Duration>,
    pub text: String,
    pub guard_text: Option<String>,
    pub when: Option<Code>,
    pub unless: Option<Code>,
    pub message: Option<Vec<Piece>>,
    pub say: Option<String>,
    /// The `let`s its guard and message use, as indices into [`Table::lets`].
    pub lets: Vec<u32>,
}

impl PlanStep {
    /// `within 10m` as it would be written (the largest whole unit), when the step has one.
    pub fn within_text(&self) -> Option<String> {
        let secs = self.within?.as_secs();
        Some(if secs % 3600 == 0 {
            format!("within {}h", secs / 3600)
        } else if secs % 60 == 0 {
            format!("within {}m", secs / 60)
        } else {
            format!("within {secs}s")
        })
    }
}

impl Plan {
    /// `plan run operation "reboot"`, `plan remove controlplane`.
    pub fn header(&self) -> String {
        match &self.kind {
            Some(k) => format!("plan {} {} \"{k}\"", self.verb.name(), self.subject.name()),
            None => format!("plan {} {}", self.verb.name(), self.subject.name()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub verb: Verb,
    pub subject: Subject,
    /// The operation kind it runs (`plan run operation "reboot"`).
    pub kind: Option<String>,
    pub steps: Vec<PlanStep>,
}

const GROUPS: usize = Verb::ALL.len() * Subject::ALL.len() * Site::ALL.len();

/// The decision table: what the interpreter evaluates.
#[derive(Clone, Debug)]
pub struct Table {
    pub rules: Vec<RuleMeta>,
    groups: Vec<Vec<Row>>,
    /// Per group, the flat program of its rows (see [`flat`]).
    programs: Vec<FlatProgram>,
    /// Per group, the facts its rows may read (bit = fact slot), so the runtime reads from
    /// the API server only what a request's rows need.
    reads: Vec<u64>,
    pub strings: Vec<Arc<str>>,
    pub plans: Vec<Plan>,
    /// Events covered by an `allow` (for reviewers).
    pub allowed: Vec<Event>,
    /// The `invariant` statements, which `verify` proves and nothing else reads.
    pub invariants: Vec<InvariantMeta>,
    /// The `let`s that rows or plan steps use, each file's in the order it defines them.
    pub lets: Vec<LetMeta>,
    /// [`Table::parking_reasons`], computed once.
    parking: Vec<String>,
    /// The digest of the rules text this table was built from (`sha256:` and hex), set by
    /// whoever read the files (the runtime's `records::digest`); empty when unknown.
    pub digest: String,
}

/// An invariant as `verify` and reviewers read it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct InvariantMeta {
    pub name: String,
    pub file: String,
    pub line: usize,
    pub sequential: bool,
    #[serde(skip)]
    pub when: Option<Expr>,
    #[serde(skip)]
    pub unless: Option<Expr>,
    #[serde(skip)]
    pub ensure: Expr,
    #[serde(skip)]
    pub message: Option<Message>,
    pub when_text: Option<String>,
    pub unless_text: Option<String>,
    pub ensure_text: String,
    pub say: Option<String>,
}

pub fn group_index(verb: Verb, subject: Subject, site: Site) -> usize {
    (verb.index() * Subject::ALL.len() + subject.index()) * Site::ALL.len() + site.index()
}

impl Table {
    /// Switches the rule named `rule` between audit (evaluated and recorded, never
    /// enforced) and enforce, as a deployment does without editing the rules text. `false`
    /// when no rule has that name.
    pub fn set_audit(&mut self, rule: &str, audit: bool) -> bool {
        let mut found = false;
        for r in self.rules.iter_mut().filter(|r| r.name == rule) {
            r.audit = audit;
            found = true;
        }
        found
    }

    /// The rules in audit mode, in source order.
    pub fn audit_rules(&self) -> impl Iterator<Item = &RuleMeta> {
        self.rules.iter().filter(|r| r.audit)
    }

    /// The `refuse` rules in audit mode (written so, or switched by the deployment) on a
    /// destructive event, each with the first such event: the safety rules that refuse
    /// nothing as this table stands (`check::destructive_event`, the test of the
    /// `audit_destructive` lint).
    pub fn audit_destructive(&self) -> Vec<(&RuleMeta, Verb, Subject)> {
        let groups = self.groups();
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.audit && r.verdict == Verdict::Refuse)
            .filter_map(|(i, r)| {
                let events = groups.iter().filter_map(|((verb, subject, _), rows)| {
                    rows.iter()
                        .any(|row| row.rule as usize == i)
                        .then_some((*verb, *subject))
                });
                crate::check::destructive_event(
                    events,
                    r.when_text.as_deref(),
                    r.unless_text.as_deref(),
                )
                .map(|(verb, subject)| (r, verb, subject))
            })
            .collect()
    }

    /// The rows for one (verb, subject, site), in source order.
    pub fn rows(&self, verb: Verb, subject: Subject, site: Site) -> &[Row] {
        self.groups
            .get(group_index(verb, subject, site))
            .map(|g| g.as_slice())
            .unwrap_or(&[])
    }

    /// The rows of one (verb, subject, site) with their flat program.
    #[inline]
    pub fn group(
        &self,
        verb: Verb,
        subject: Subject,
        site: Site,
    ) -> Option<(&[Row], &FlatProgram)> {
        let i = group_index(verb, subject, site);
        Some((self.groups.get(i)?, self.programs.get(i)?))
    }

    /// The facts the rows of one (verb, subject, site) may read, as a bit set of slots.
    pub fn facts_read(&self, verb: Verb, subject: Subject, site: Site) -> u64 {
        self.reads
            .get(group_index(verb, subject, site))
            .copied()
            .unwrap_or(0)
    }

    pub fn plan(&self, verb: Verb, subject: Subject) -> Option<&Plan> {
        self.plans
            .iter()
            .find(|p| p.verb == verb && p.subject == subject)
    }

    /// The plan of an operation of `kind` (`plan run operation "<kind>"`).
    pub fn operation_plan(&self, kind: &str) -> Option<&Plan> {
        self.plans.iter().find(|p| {
            p.verb == Verb::Run
                && p.subject == Subject::Operation
                && p.kind.as_deref() == Some(kind)
        })
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

    /// The condition reasons the rules' holds and refusals set (and the defaults the
    /// controller gives a rule without one): a condition with one of these is the rules' to
    /// set and to clear; any other reason is a person's or another component's.
    pub fn rule_reasons(&self) -> impl Iterator<Item = &str> {
        self.rules
            .iter()
            .filter_map(|r| r.reason.as_deref())
            .chain(["Held", "Refused"])
    }

    pub fn owns_reason(&self, reason: Option<&str>) -> bool {
        reason.is_some_and(|r| self.rule_reasons().any(|x| x == r))
    }

    /// The reason the controller parks an operation with when the rows of `run operation`
    /// hold it: each holding rule's `reason`, or the controller's default `Refused` for a
    /// rule without one (deduplicated, in rule order).
    pub fn parking_reasons(&self) -> &[String] {
        &self.parking
    }

    fn parking_reasons_of_rows(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for row in self.rows(Verb::Run, Subject::Operation, Site::Controller) {
            if row.verdict != Verdict::Hold {
                continue;
            }
            let reason = self
                .rules
                .get(row.rule as usize)
                .and_then(|r| r.reason.as_deref())
                .unwrap_or("Refused");
            if !out.contains(&reason) {
                out.push(reason);
            }
        }
        out
    }

    /// Whether an operation's Paused reason is one the rules park it with
    /// ([`Table::parking_reasons`]): parked by the rules, it holds no lock and resumes by
    /// itself; any other reason is a person's or another component's pause, which stands.
    /// Derived from the rules, so renaming a rule's reason changes no behaviour.
    pub fn parks(&self, reason: Option<&str>) -> bool {
        reason.is_some_and(|r| self.parking.iter().any(|p| p == r))
    }

    pub fn row_count(&self) -> usize {
        self.groups.iter().map(|g| g.len()).sum()
    }

    /// Rows in all (a rule counts once per event it covers) and how many of them run on
    /// the stack machine rather than as flat branches.
    pub fn rows_on_stack(&self) -> (usize, usize) {
        self.programs.iter().fold((0, 0), |(all, stack), p| {
            (all + p.entries.len(), stack + p.stack_rows.len())
        })
    }

    /// The `let`s these rules use (indices into [`Table::rules`]), each once, in the order
    /// they are defined.
    pub fn lets_of_rules(&self, rules: impl IntoIterator<Item = u32>) -> Vec<(u32, &LetMeta)> {
        let mut ids: Vec<u32> = rules
            .into_iter()
            .filter_map(|r| self.rules.get(r as usize))
            .flat_map(|r| r.lets.iter().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .filter_map(|i| Some((i, self.lets.get(i as usize)?)))
            .collect()
    }
}

/// How rows are compiled.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Rows as flat branch programs (`flat.rs`) where they fit; `false` puts every row on
    /// the stack machine, which `benches/decide.rs` compares against (the flat form is kept
    /// because it pays: ARCHITECTURE.md, "Why a flat program").
    pub flat: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { flat: true }
    }
}

/// A rule set whose compiled form would need more entries of one kind than its 32-bit
/// indices number (rules, strings, `let`s, instructions, jump labels). The front end's
/// limits keep real rule sets far below; this is the error instead of an index that wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge {
    /// What there were too many of.
    pub what: &'static str,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the rule set is too large to compile: more {} than {} (split it, or remove rules)",
            self.what,
            u32::MAX
        )
    }
}

impl std::error::Error for TooLarge {}

/// Compiles a checked program. The program must have checked without errors.
pub fn compile(program: &Program, files: &[SourceFile]) -> Result<Table, TooLarge> {
    compile_with(program, files, Options::default())
}

/// [`compile`] with [`Options`].
pub fn compile_with(
    program: &Program,
    files: &[SourceFile],
    options: Options,
) -> Result<Table, TooLarge> {
    let mut c = Compiler {
        strings: Vec::new(),
        too_large: None,
    };
    let lets: Vec<LetMeta> = program
        .lets
        .iter()
        .map(|l| {
            let src = files.get(l.file);
            LetMeta {
                name: l.name.clone(),
                definition: src
                    .and_then(|f| {
                        f.text
                            .get(l.expr_span.start as usize..l.expr_span.end as usize)
                    })
                    .unwrap_or_default()
                    .to_string(),
                file: src.map(|f| f.display_path()).unwrap_or_default(),
                line: src.map_or(0, |f| f.line_col(l.span.start).0),
                span: l.span,
                value: c.placeholder(&l.typed),
                reads: l.typed.info.reads,
            }
        })
        .collect();
    // A rule's (or step's) `let` names are its own file's.
    if u32::try_from(program.lets.len()).is_err() {
        return Err(TooLarge { what: "lets" });
    }
    let let_ids = |file: usize, names: &[String]| -> Vec<u32> {
        let mut ids: Vec<u32> = program
            .lets
            .iter()
            .enumerate()
            .filter(|(_, l)| l.file == file && names.contains(&l.name))
            .filter_map(|(i, _)| u32::try_from(i).ok())
            .collect();
        ids.sort_unstable();
        ids
    };
    let Ok(_) = u32::try_from(program.rules.len()) else {
        return Err(TooLarge { what: "rules" });
    };
    let mut groups: Vec<Vec<Row>> = vec![Vec::new(); GROUPS];
    let mut reads = vec![0u64; GROUPS];
    let mut rules = Vec::with_capacity(program.rules.len());
    let mut fires = Vec::with_capacity(program.rules.len());
    for (i, r) in program.rules.iter().enumerate() {
        let t = &r.typed;
        let mut mask = 0u64;
        for e in t.when.iter().chain(t.unless.iter()) {
            mask |= e.info.reads;
        }
        for p in t.message.iter().flatten() {
            if let TypedPart::Value(e) = p {
                mask |= e.info.reads;
            }
        }
        for (verb, subject, site) in &r.events {
            reads[group_index(*verb, *subject, *site)] |= mask;
        }
        let when = t.when.as_ref().map(|e| c.code(e));
        let unless = t.unless.as_ref().map(|e| c.code(e));
        fires.push(fires_expr(t.when.as_ref(), t.unless.as_ref()));
        for (verb, subject, site) in &r.events {
            groups[group_index(*verb, *subject, *site)].push(Row {
                rule: c.index(i, "rules"),
                verdict: r.verdict,
                when: when.clone(),
                unless: unless.clone(),
                entry: 0,
            });
        }
        let mut meta = c.meta(r, files);
        meta.lets = let_ids(r.file, &r.lets);
        rules.push(meta);
    }
    let programs = groups
        .iter_mut()
        .map(|rows| {
            let mut f = flat::Flat::new(&mut c, options.flat);
            for row in rows.iter() {
                f.row(fires.get(row.rule as usize).and_then(|e| e.as_ref()));
            }
            let program = f.finish();
            for (row, entry) in rows.iter_mut().zip(&program.entries) {
                row.entry = *entry;
            }
            program
        })
        .collect();
    let plans = program
        .plans
        .iter()
        .map(|p| {
            let mut plan = c.plan(p);
            for (step, checked) in plan.steps.iter_mut().zip(&p.steps) {
                step.lets = let_ids(p.file, &checked.lets);
            }
            plan
        })
        .collect();
    if let Some(what) = c.too_large {
        return Err(TooLarge { what });
    }
    let mut table = Table {
        digest: String::new(),
        rules,
        groups,
        programs,
        reads,
        strings: c.strings,
        plans,
        allowed: program.allowed.clone(),
        lets,
        invariants: program
            .invariants
            .iter()
            .map(|i| {
                let src = files.get(i.file);
                InvariantMeta {
                    name: i.name.clone(),
                    file: src.map(|f| f.display_path()).unwrap_or_default(),
                    line: src.map_or(0, |f| f.line_col(i.span.start).0),
                    sequential: i.sequential,
                    when: i.when.clone(),
                    unless: i.unless.clone(),
                    ensure: i.ensure.clone(),
                    message: i.message.clone(),
                    when_text: i.when_text.clone(),
                    unless_text: i.unless_text.clone(),
                    ensure_text: i.ensure_text.clone(),
                    say: i.say_text.clone(),
                }
            })
            .collect(),
        parking: Vec::new(),
    };
    table.parking = table
        .parking_reasons_of_rows()
        .into_iter()
        .map(str::to_string)
        .collect();
    Ok(table)
}

struct Compiler {
    strings: Vec<Arc<str>>,
    /// What overflowed a 32-bit index, if anything did ([`TooLarge`]).
    too_large: Option<&'static str>,
}

impl Compiler {
    /// `n` as a 32-bit index of `what`; past the last one, the compile fails with
    /// [`TooLarge`] (the 0 returned then is never used).
    fn index(&mut self, n: usize, what: &'static str) -> u32 {
        u32::try_from(n).unwrap_or_else(|_| {
            self.too_large.get_or_insert(what);
            0
        })
    }

    fn meta(&mut self, r: &CheckedRule, files: &[SourceFile]) -> RuleMeta {
        let (file, line) = match files.get(r.file) {
            Some(f) => (f.display_path(), f.line_col(r.span.start).0),
            None => (String::new(), 0),
        };
        RuleMeta {
            name: r.name.clone(),
            audit: r.audit,
            verdict: r.verdict,
            head: r.head.clone(),
            file,
            line,
            span: r.span,
            when_text: r.when_text.clone(),
            unless_text: r.unless_text.clone(),
            reason: r.reason.clone(),
            say: r.say_text.clone(),
            message: self.message(r.typed.message.as_deref().unwrap_or_default()),
            lets: Vec::new(),
        }
    }

    fn plan(&mut self, p: &CheckedPlan) -> Plan {
        Plan {
            verb: p.verb,
            subject: p.subject,
            kind: p.kind.clone(),
            steps: p
                .steps
                .iter()
                .map(|s| PlanStep {
                    action: s.action,
                    argument: s.argument.clone(),
                    within: s.within.map(std::time::Duration::from_secs),
                    text: s.text.clone(),
                    guard_text: s.guard_text.clone(),
                    when: s.typed.when.as_ref().map(|e| self.code(e)),
                    unless: s.typed.unless.as_ref().map(|e| self.code(e)),
                    say: s.say_text.clone(),
                    message: s.typed.message.as_deref().map(|m| self.message(m)),
                    lets: Vec::new(),
                })
                .collect(),
        }
    }

    fn message(&mut self, m: &[TypedPart]) -> Vec<Piece> {
        m.iter()
            .map(|p| match p {
                TypedPart::Text(t) => Piece::Text(t.clone()),
                TypedPart::Value(e) => self.placeholder(e),
            })
            .collect()
    }

    /// An expression whose value is shown: a text, or an int or bool program.
    fn placeholder(&mut self, e: &Typed) -> Piece {
        match self.text(e) {
            Some(t) => Piece::Name(t),
            None => Piece::Value(self.code(e)),
        }
    }

    /// Compiles an int or bool expression.
    pub fn code(&mut self, e: &Typed) -> Code {
        let mut code = Code {
            kind: if e.info.kind == ValueKind::Bool {
                Kind::Bool
            } else {
                Kind::Int
            },
            ..Code::default()
        };
        let e = reorder(e);
        self.emit(&e, &mut code.ops);
        // What the checker annotated: whether it reads an expensive fact, the stack it needs.
        code.expensive = e.info.expensive;
        let depth = e.info.depth;
        if depth > MAX_STACK {
            code.ops = vec![Op::Invalid];
        }
        code.depth = u8::try_from(depth.min(MAX_STACK)).unwrap_or(u8::MAX);
        code
    }

    /// A text operand, when `e` is a name or enum fact or a string literal.
    fn text(&mut self, e: &Typed) -> Option<Text> {
        match &e.kind {
            TypedKind::Str(s) => Some(Text::Const(self.string(s))),
            TypedKind::Fact(f) if e.info.kind == ValueKind::Text => Some(Text::Fact(f.slot8())),
            _ => None,
        }
    }

    fn string(&mut self, s: &str) -> u32 {
        if let Some(i) = self.strings.iter().position(|x| &**x == s) {
            return self.index(i, "strings");
        }
        self.strings.push(Arc::from(s));
        self.index(self.strings.len() - 1, "strings")
    }

    /// Emits `e` (the stack it needs, and whether it reads an expensive fact, are its
    /// annotations).
    fn emit(&mut self, e: &Typed, ops: &mut Vec<Op>) {
        match &e.kind {
            TypedKind::Int(i) => {
                ops.push(Op::Int(*i));
            }
            TypedKind::Bool(b) => {
                ops.push(Op::Int(i64::from(*b)));
            }
            TypedKind::Str(_) | TypedKind::Unresolved => {
                ops.push(Op::Invalid);
            }
            TypedKind::Fact(f) => {
                if e.info.kind == ValueKind::Text {
                    // The checker typed every use: a text is only ever compared.
                    ops.push(Op::Invalid);
                } else {
                    ops.push(Op::Fact(f.slot8()));
                }
            }
            TypedKind::Unary(op, inner) => {
                self.emit(inner, ops);
                ops.push(match op {
                    UnOp::Not => Op::Not,
                    UnOp::Neg => Op::Neg,
                });
            }
            TypedKind::Binary(op @ (BinOp::And | BinOp::Or), l, r) => {
                self.emit(l, ops);
                let jump_at = ops.len();
                ops.push(Op::JumpIfFalse(0));
                self.emit(r, ops);
                let target = self.index(ops.len(), "instructions");
                ops[jump_at] = if *op == BinOp::And {
                    Op::JumpIfFalse(target)
                } else {
                    Op::JumpIfTrue(target)
                };
            }
            TypedKind::Binary(op @ (BinOp::Eq | BinOp::Ne), l, r) if is_text(l) || is_text(r) => {
                match (self.text(l), self.text(r)) {
                    (Some(a), Some(b)) => ops.push(Op::TextEq {
                        a,
                        b,
                        ne: *op == BinOp::Ne,
                    }),
                    _ => ops.push(Op::Invalid),
                }
            }
            TypedKind::Binary(op, l, r) if matches!(r.kind, TypedKind::Int(_)) => {
                let k = match &r.kind {
                    TypedKind::Int(k) => *k,
                    _ => 0,
                };
                self.emit(l, ops);
                ops.push(match op {
                    BinOp::Add => Op::AddK(k),
                    BinOp::Sub => Op::SubK(k),
                    BinOp::Mul => Op::MulK(k),
                    BinOp::Div => Op::DivK(k),
                    BinOp::Mod => Op::ModK(k),
                    BinOp::Eq => Op::EqK(k),
                    BinOp::Ne => Op::NeK(k),
                    BinOp::Lt => Op::LtK(k),
                    BinOp::Le => Op::LeK(k),
                    BinOp::Gt => Op::GtK(k),
                    BinOp::Ge => Op::GeK(k),
                    BinOp::And | BinOp::Or => Op::Invalid,
                });
            }
            TypedKind::Binary(op, l, r) => {
                self.emit(l, ops);
                self.emit(r, ops);
                ops.push(match op {
                    BinOp::Eq => Op::Eq,
                    BinOp::Ne => Op::Ne,
                    BinOp::Lt => Op::Lt,
                    BinOp::Le => Op::Le,
                    BinOp::Gt => Op::Gt,
                    BinOp::Ge => Op::Ge,
                    BinOp::Add => Op::Add,
                    BinOp::Sub => Op::Sub,
                    BinOp::Mul => Op::Mul,
                    BinOp::Div => Op::Div,
                    BinOp::Mod => Op::Mod,
                    BinOp::And | BinOp::Or => Op::Invalid,
                });
            }
        }
    }
}

/// `when and not unless`, or whichever of them exists; `None` = always.
fn fires_expr(when: Option<&Typed>, unless: Option<&Typed>) -> Option<Typed> {
    let not_unless = unless.map(|u| Typed::negate(u.clone()));
    match (when, not_unless) {
        (Some(w), Some(nu)) => Some(Typed::conjoin(w.clone(), nu)),
        (Some(w), None) => Some(w.clone()),
        (None, nu) => nu,
    }
}

/// Whether an operand is text (a name or enum fact, or a string literal).
fn is_text(e: &Typed) -> bool {
    e.info.kind == ValueKind::Text
}

/// Puts the cheap operand of `and`/`or` first, so an expensive fact is fetched only when the
/// cheap conditions already decided nothing. Conditions are pure, but an operand that can
/// fail (division by zero, overflow) would change the result if it moved, so only operands
/// that cannot fail are swapped. (`and`/`or` annotations do not depend on the operands'
/// order, so they stay true.)
fn reorder(e: &Typed) -> std::borrow::Cow<'_, Typed> {
    if needs_reorder(e) {
        std::borrow::Cow::Owned(reorder_owned(e))
    } else {
        // Most conditions are already in order: no copy.
        std::borrow::Cow::Borrowed(e)
    }
}

/// Whether [`reorder`] swaps anything in `e`.
fn needs_reorder(e: &Typed) -> bool {
    match &e.kind {
        TypedKind::Binary(op, l, r) => {
            (matches!(op, BinOp::And | BinOp::Or) && swaps(l, r))
                || needs_reorder(l)
                || needs_reorder(r)
        }
        TypedKind::Unary(_, i) => needs_reorder(i),
        _ => false,
    }
}

/// Whether the operands of an `and`/`or` change places (annotations do not change when
/// operands are reordered, so this reads the same before and after).
fn swaps(l: &Typed, r: &Typed) -> bool {
    l.info.expensive && !r.info.expensive && !l.info.can_fail && !r.info.can_fail
}

fn reorder_owned(e: &Typed) -> Typed {
    let kind = match &e.kind {
        TypedKind::Binary(op @ (BinOp::And | BinOp::Or), l, r) => {
            let (l, r) = (reorder_owned(l), reorder_owned(r));
            if swaps(&l, &r) {
                TypedKind::Binary(*op, Box::new(r), Box::new(l))
            } else {
                TypedKind::Binary(*op, Box::new(l), Box::new(r))
            }
        }
        TypedKind::Binary(op, l, r) => {
            TypedKind::Binary(*op, Box::new(reorder_owned(l)), Box::new(reorder_owned(r)))
        }
        TypedKind::Unary(op, i) => TypedKind::Unary(*op, Box::new(reorder_owned(i))),
        other => other.clone(),
    };
    Typed {
        kind,
        span: e.span,
        info: e.info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `after < quorum` (`approved - 1 < approved / 2 + 1`) is one comparison: the left
    /// operand's `- 1`, the right's `/ 2` (a shift) and `+ 1` done by the comparison itself.
    #[test]
    fn a_count_against_a_quorum_is_one_instruction() {
        let files = vec![SourceFile::new(
            "q.rules",
            "rule q\n  refuse remove controlplane\n  when approved - 1 < approved / 2 + 1\n  say \"q\"\n",
        )];
        let checked = crate::check::check_with(&files, false);
        assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
        let table = compile(&checked.program, &files).expect("compiles");
        let (_, program) = table
            .group(Verb::Remove, Subject::ControlPlane, Site::Webhook)
            .expect("the group");
        let ops: Vec<flat::Op> = program.ins.iter().map(|i| i.op).collect();
        assert_eq!(ops, [flat::Op::CmpDiv, flat::Op::Hit, flat::Op::End]);
        let cmp = program.ins[0];
        assert_eq!((cmp.d, cmp.x, cmp.k), (-1, 1, 1), "{cmp:?}");
    }

    /// A row that starts with the comparison the row before made does not make it again:
    /// the first row's branch jumps past it, to where its outcome leads.
    #[test]
    fn a_comparison_already_made_is_not_made_again() {
        let files = vec![SourceFile::new(
            "t.rules",
            "rule last\n  refuse remove controlplane\n  when approved - 1 == 0 and not cluster.deleting\n  say \"a\"\n\n\
             rule quorum\n  refuse remove controlplane\n  when approved - 1 > 0 and approved - 1 < approved / 2 + 1\n  say \"b\"\n",
        )];
        let checked = crate::check::check_with(&files, false);
        assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
        let table = compile(&checked.program, &files).expect("compiles");
        let (_, program) = table
            .group(Verb::Remove, Subject::ControlPlane, Site::Webhook)
            .expect("the group");
        let second = program.entries[1] as usize;
        let (first, again) = (program.ins[0], program.ins[second]);
        assert_eq!((first.op, first.a, first.d), (again.op, again.a, again.d));
        // less: the second row's `> 0` fails too; greater: straight to its second branch.
        assert_eq!(
            first.to[0] as usize, again.to[0] as usize,
            "{:?}",
            program.ins
        );
        assert_eq!(
            first.to[2] as usize, again.to[2] as usize,
            "{:?}",
            program.ins
        );
        // The second row's own entry still decides (the session resumes there after an
        // error in the first row).
        assert!(again.to.iter().all(|&t| t as usize > second));
    }

    /// An index past the last 32-bit one fails the compile with what overflowed, instead of
    /// wrapping or saturating into an index that exists (a jump to the wrong instruction).
    #[test]
    fn an_index_past_32_bits_is_an_error_not_a_sentinel() {
        let mut c = Compiler {
            strings: Vec::new(),
            too_large: None,
        };
        assert_eq!(c.index(7, "rules"), 7);
        assert_eq!(c.too_large, None);
        let last = usize::try_from(u32::MAX).expect("64-bit usize");
        assert_eq!(c.index(last, "instructions"), u32::MAX);
        assert_eq!(c.too_large, None);
        let _ = c.index(last + 1, "instructions");
        let _ = c.index(last + 2, "strings");
        // The first overflow is the one reported.
        assert_eq!(c.too_large, Some("instructions"));
        let e = TooLarge {
            what: "instructions",
        }
        .to_string();
        assert!(e.contains("more instructions than 4294967295"), "{e}");
    }
}
