//! Evaluates a decision table against facts. Pure: no I/O, no clock. Facts are asked for
//! only when a row needs them, at most once per session; a provider that cannot answer yet
//! (an expensive fact needing etcd) interrupts the session, and the caller supplies the value
//! and runs it again.

pub mod explain;
pub mod value;

use crate::compile::flat::{self, VALUES};
use crate::compile::{Code, FlatProgram, Kind, MAX_STACK, Op, Piece, Row, Table, Text};
use crate::vocab::Event;
use crate::vocab::{FACT_COUNT, FACTS, Fact, Type, Verdict};
use serde::Serialize;
use std::sync::Arc;
pub use value::{EvalError, Value};

/// What a fact provider answers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lookup<'a> {
    Value(Value<'a>),
    /// Not known yet: the caller must fetch it (etcd, Talos) and supply it.
    Later,
}

/// Where facts come from: a snapshot of live objects, and later etcd and Talos.
pub trait Facts<'a> {
    fn fact(&mut self, fact: Fact) -> Lookup<'a>;
}

/// Why a session stopped before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    /// Fetch this fact, [`Session::supply`] it, and run again.
    Need(Fact),
}

/// One matching row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub rule: u32,
    pub verdict: Verdict,
    /// Set when the row could not be evaluated; refuse and hold rows then match (fail closed).
    pub error: Option<EvalError>,
}

/// The matching rows of one event, in source order: a slice of [`Hit`]s. The first few are
/// kept inline, so deciding allocates nothing unless many rows match.
#[derive(Clone, Debug)]
pub struct Hits(HitsRepr);

#[derive(Clone, Debug)]
enum HitsRepr {
    Inline { len: u8, hits: [Hit; INLINE_HITS] },
    Heap(Vec<Hit>),
}

const INLINE_HITS: usize = 6;

const NO_HIT: Hit = Hit {
    rule: 0,
    verdict: Verdict::Warn,
    error: None,
};

impl Hits {
    #[inline]
    pub fn new() -> Self {
        Hits(HitsRepr::Inline {
            len: 0,
            hits: [NO_HIT; INLINE_HITS],
        })
    }

    #[inline]
    pub fn push(&mut self, hit: Hit) {
        match &mut self.0 {
            HitsRepr::Inline { len, hits } => match hits.get_mut(usize::from(*len)) {
                Some(slot) => {
                    *slot = hit;
                    *len += 1;
                }
                None => {
                    let mut v = Vec::with_capacity(INLINE_HITS * 2);
                    v.extend_from_slice(hits);
                    v.push(hit);
                    self.0 = HitsRepr::Heap(v);
                }
            },
            HitsRepr::Heap(v) => v.push(hit),
        }
    }

    #[inline]
    pub fn as_slice(&self) -> &[Hit] {
        match &self.0 {
            HitsRepr::Inline { len, hits } => hits.get(..usize::from(*len)).unwrap_or(&[]),
            HitsRepr::Heap(v) => v,
        }
    }

    pub fn to_vec(&self) -> Vec<Hit> {
        self.as_slice().to_vec()
    }
}

impl Default for Hits {
    fn default() -> Self {
        Hits::new()
    }
}

impl std::ops::Deref for Hits {
    type Target = [Hit];
    #[inline]
    fn deref(&self) -> &[Hit] {
        self.as_slice()
    }
}

impl PartialEq for Hits {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Hits {}

impl<'h> IntoIterator for &'h Hits {
    type Item = &'h Hit;
    type IntoIter = std::slice::Iter<'h, Hit>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl From<Hits> for Vec<Hit> {
    fn from(h: Hits) -> Vec<Hit> {
        match h.0 {
            HitsRepr::Heap(v) => v,
            inline @ HitsRepr::Inline { .. } => Hits(inline).to_vec(),
        }
    }
}

/// One row as the explanation shows it.
#[derive(Clone, Debug, Serialize)]
pub struct TraceRow {
    pub event: String,
    pub rule: String,
    /// Index into [`Table::rules`].
    #[serde(skip)]
    pub rule_index: u32,
    pub verdict: Verdict,
    /// The `when`'s value (`None`: no `when`, it could not be computed, or not read).
    pub when: Option<bool>,
    /// The `unless`'s value (`None` also when the `when` ruled the row out first).
    pub unless: Option<bool>,
    /// Whether the row fired in the decision.
    pub matched: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A fact a condition needs that the provider could not give yet (not read).
    #[serde(skip)]
    pub unread: Option<Fact>,
}

/// A condition's value as a trace shows it.
#[derive(Clone, Copy)]
enum Shown {
    Absent,
    Value(bool),
    Error(EvalError),
    Unread(Fact),
}

impl Shown {
    fn value(self) -> Option<bool> {
        match self {
            Shown::Value(b) => Some(b),
            _ => None,
        }
    }
}

/// Where each name or enum fact keeps its text in [`FactCache::texts`] (`u8::MAX`: not a
/// text fact).
const TEXT_SLOT: [u8; FACT_COUNT] = {
    let mut slots = [u8::MAX; FACT_COUNT];
    let (mut i, mut n) = (0, 0);
    while i < FACT_COUNT {
        if matches!(FACTS[i].ty, Type::Name | Type::Enum(_)) {
            slots[i] = n;
            n += 1;
        }
        i += 1;
    }
    slots
};

/// The number of name and enum facts.
const TEXT_FACTS: usize = {
    let (mut i, mut n) = (0, 0);
    while i < FACT_COUNT {
        if matches!(FACTS[i].ty, Type::Name | Type::Enum(_)) {
            n += 1;
        }
        i += 1;
    }
    n
};

/// The facts of a session: asked of the provider at most once, then read from here.
struct FactCache<'a, F> {
    facts: F,
    /// Int and bool facts (bools as 0/1) by slot, valid where `known` has their bit; then
    /// the registers of the flat programs (see [`flat`]). A power of two long, so an index
    /// masked into range needs no bounds check.
    vals: [i64; VALUES],
    /// Name and enum facts, valid where `known` has their bit.
    texts: [Option<&'a str>; TEXT_FACTS],
    known: u32,
    /// Every fact asked for, in order, with its value (only when tracing).
    asked: Vec<(Fact, Value<'a>)>,
    record: bool,
}

impl<'a, F: Facts<'a>> FactCache<'a, F> {
    fn store(&mut self, slot: usize, value: Value<'a>) {
        if slot >= FACT_COUNT {
            return;
        }
        match value {
            Value::Int(i) => self.vals[slot % VALUES] = i,
            Value::Bool(b) => self.vals[slot % VALUES] = i64::from(b),
            Value::Str(s) => {
                if let Some(t) = self.texts.get_mut(usize::from(TEXT_SLOT[slot])) {
                    *t = Some(s);
                }
            }
        }
        self.known |= 1 << slot;
    }

    /// Makes sure a fact is known: a bit test, or one question to the provider.
    #[inline(always)]
    fn ensure(&mut self, slot: usize) -> Result<(), Stop> {
        if self.known & (1u32 << (slot & 31)) != 0 && slot < FACT_COUNT {
            return Ok(());
        }
        self.fetch(slot)
    }

    #[inline(never)]
    fn fetch(&mut self, slot: usize) -> Result<(), Stop> {
        self.ask(slot)
    }

    /// Asks the provider for a fact and keeps the answer.
    #[inline(always)]
    fn ask(&mut self, slot: usize) -> Result<(), Stop> {
        let Some(fact) = Fact::from_slot(slot) else {
            return Err(Stop::Fail(EvalError::Type));
        };
        match self.facts.fact(fact) {
            Lookup::Value(v) => {
                self.store(slot, v);
                if self.record {
                    self.asked.push((fact, v));
                }
                Ok(())
            }
            Lookup::Later => Err(Stop::Need(fact)),
        }
    }

    /// Asks for the facts an instruction reads that are not known yet, left operand first.
    /// Inlined into the interpreter loop, with the provider.
    #[inline(always)]
    fn need(&mut self, ins: &flat::Ins) -> Result<(), Stop> {
        // `need` has the bits of `a` and `b` when they are fact slots, and no others.
        let a_bit = 1u32.checked_shl(u32::from(ins.a)).unwrap_or(0) & ins.need;
        if a_bit & !self.known != 0 {
            self.ask(usize::from(ins.a))?;
        }
        if ins.need & !a_bit & !self.known != 0 {
            self.ask(usize::from(ins.b))?;
        }
        Ok(())
    }

    fn text(&mut self, t: Text, strings: &'a [Arc<str>]) -> Result<&'a str, Stop> {
        match t {
            Text::Const(i) => match strings.get(i as usize) {
                Some(s) => Ok(&**s),
                None => Err(Stop::Fail(EvalError::Type)),
            },
            Text::Fact(slot) => {
                let slot = slot as usize;
                self.ensure(slot)?;
                let text = TEXT_SLOT
                    .get(slot)
                    .and_then(|&t| self.texts.get(usize::from(t)));
                Ok(text.copied().flatten().unwrap_or(""))
            }
        }
    }
}

/// Where a flat program stopped without an error.
enum Flow {
    End,
    /// At an [`flat::Op::Stack`] row (its `pc` in `Session::pc`).
    Stack,
}

/// Why evaluating an expression stopped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    Need(Fact),
    Fail(EvalError),
}

/// A decision in progress for one event's facts.
pub struct Session<'a, F> {
    table: &'a Table,
    cache: FactCache<'a, F>,
    pub trace: Option<Vec<TraceRow>>,
    /// Where the flat program stopped on an error.
    pc: usize,
}

impl<'a, F: Facts<'a>> Session<'a, F> {
    pub fn new(table: &'a Table, facts: F) -> Self {
        Session {
            table,
            cache: FactCache {
                facts,
                vals: [0; VALUES],
                texts: [None; TEXT_FACTS],
                known: 0,
                asked: Vec::new(),
                record: false,
            },
            trace: None,
            pc: 0,
        }
    }

    /// Records every row considered and every fact asked for.
    pub fn traced(mut self) -> Self {
        self.trace = Some(Vec::new());
        self.cache.record = true;
        self
    }

    /// Every fact asked for, in order, with its value (when traced).
    pub fn asked(&self) -> &[(Fact, Value<'a>)] {
        &self.cache.asked
    }

    /// Supplies a fact the provider answered [`Lookup::Later`] for.
    pub fn supply(&mut self, fact: Fact, value: Value<'a>) {
        self.cache.store(fact.slot(), value);
    }

    /// The matching rows of one (verb, subject, site), in source order. The hot path: no
    /// allocation unless something matches. A traced session decides with the same code
    /// (the group's flat program), then records each row's conditions for the explanation.
    pub fn matches(&mut self, event: Event) -> Result<Hits, Interrupt> {
        let (verb, subject, site) = event;
        let mut hits = Hits::new();
        if let Some((rows, program)) = self.table.group(verb, subject, site) {
            self.run_group(rows, program, &mut hits)?;
        }
        if self.trace.is_some() {
            self.trace_rows(event, &hits);
        }
        Ok(hits)
    }

    /// Records every row of `event` for the explanation: whether it matched (from `hits`,
    /// what the decision used) and the value of its `when` and `unless` (the `unless` only
    /// when the `when` did not rule the row out). A condition that needs a fact the provider
    /// cannot give yet is shown as not read; it never stops the session.
    #[cold]
    #[inline(never)]
    fn trace_rows(&mut self, event: Event, hits: &Hits) {
        let (verb, subject, site) = event;
        let table = self.table;
        let mut next = hits.iter().peekable();
        let mut out = Vec::new();
        for row in table.rows(verb, subject, site) {
            let hit = next
                .next_if(|h| h.rule == row.rule && h.verdict == row.verdict)
                .copied();
            let shown = |s: &mut Self, c: &Option<Code>| match c {
                None => Shown::Absent,
                Some(c) => match s.condition(c) {
                    Ok(Ok(b)) => Shown::Value(b),
                    Ok(Err(e)) => Shown::Error(e),
                    Err(Interrupt::Need(f)) => Shown::Unread(f),
                },
            };
            let when = shown(self, &row.when);
            let unless = match when {
                Shown::Value(false) | Shown::Unread(_) => Shown::Absent,
                _ => shown(self, &row.unless),
            };
            let unread = match (when, unless) {
                (Shown::Unread(f), _) | (_, Shown::Unread(f)) => Some(f),
                _ => None,
            };
            let error = hit.and_then(|h| h.error).or(match (when, unless) {
                (Shown::Error(e), _) | (_, Shown::Error(e)) => Some(e),
                _ => None,
            });
            out.push(TraceRow {
                event: format!("{} {} at {}", verb.name(), subject.name(), site.name()),
                rule: table
                    .rules
                    .get(row.rule as usize)
                    .map(|r| r.name.clone())
                    .unwrap_or_default(),
                rule_index: row.rule,
                verdict: row.verdict,
                when: when.value(),
                unless: unless.value(),
                matched: hit.is_some(),
                error: error.map(|e| e.to_string()),
                unread,
            });
        }
        if let Some(trace) = &mut self.trace {
            // A session run again (after supplying a fact) records the event once.
            if let Some(first) = out.first() {
                trace.retain(|r| r.event != first.event);
            }
            trace.extend(out);
        }
    }

    /// The value of the `let` [`Table::lets`]`[index]` against this session's facts: what
    /// a row that uses it computed (the same interpreter). `Err` when it cannot be computed
    /// (a division by zero, an overflow); `Interrupt` when a fact it reads cannot be had
    /// yet.
    pub fn let_value(&mut self, index: u32) -> Result<Result<Value<'a>, EvalError>, Interrupt> {
        let table = self.table;
        let Some(l) = table.lets.get(index as usize) else {
            return Ok(Err(EvalError::Type));
        };
        match &l.value {
            Piece::Name(t) => match self.cache.text(*t, &table.strings) {
                Ok(s) => Ok(Ok(Value::Str(s))),
                Err(Stop::Fail(e)) => Ok(Err(e)),
                Err(Stop::Need(f)) => Err(Interrupt::Need(f)),
            },
            Piece::Value(code) => Ok(self.condition_value(code)?.map(|v| match code.kind {
                Kind::Int => Value::Int(v),
                Kind::Bool => Value::Bool(v != 0),
            })),
            Piece::Text(_) => Ok(Err(EvalError::Type)),
        }
    }

    /// The message of a matching rule, placeholders filled in.
    pub fn render(&mut self, hit: &Hit) -> Result<String, Interrupt> {
        let table = self.table;
        let Some(rule) = table.rules.get(hit.rule as usize) else {
            return Ok(String::new());
        };
        if let Some(e) = hit.error {
            return Ok(format!(
                "rule {} could not be evaluated ({e}); refusing, to be safe",
                rule.name
            ));
        }
        self.render_pieces(&rule.message)
    }

    pub fn render_pieces(&mut self, pieces: &[Piece]) -> Result<String, Interrupt> {
        // One allocation: the text as written plus room for the values.
        let capacity = pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.len(),
                Piece::Value(_) | Piece::Name(_) => 24,
            })
            .sum();
        let mut out = String::with_capacity(capacity);
        use std::fmt::Write;
        for p in pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Name(t) => match self.cache.text(*t, &self.table.strings) {
                    Ok(s) => out.push_str(s),
                    Err(Stop::Fail(e)) => {
                        let _ = write!(out, "<{e}>");
                    }
                    Err(Stop::Need(f)) => return Err(Interrupt::Need(f)),
                },
                Piece::Value(code) => match (self.condition_value(code)?, code.kind) {
                    (Ok(v), Kind::Int) => push_int(&mut out, v),
                    (Ok(v), Kind::Bool) => out.push_str(if v != 0 { "true" } else { "false" }),
                    (Err(e), _) => {
                        let _ = write!(out, "<{e}>");
                    }
                },
            }
        }
        Ok(out)
    }

    /// Evaluates a guard (plans): true when it holds.
    pub fn guard(&mut self, code: &Code) -> Result<Result<bool, EvalError>, Interrupt> {
        self.condition(code)
    }

    #[inline]
    fn condition(&mut self, code: &Code) -> Result<Result<bool, EvalError>, Interrupt> {
        Ok(self.condition_value(code)?.map(|v| v != 0))
    }

    #[inline]
    fn condition_value(&mut self, code: &Code) -> Result<Result<i64, EvalError>, Interrupt> {
        match self.run(code) {
            Ok(v) => Ok(Ok(v)),
            Err(Stop::Fail(e)) => Ok(Err(e)),
            Err(Stop::Need(f)) => Err(Interrupt::Need(f)),
        }
    }

    /// Runs a group's flat program: every row, in order, adding the ones that fire.
    fn run_group(
        &mut self,
        rows: &[Row],
        program: &FlatProgram,
        hits: &mut Hits,
    ) -> Result<(), Interrupt> {
        let mut pc = 0;
        loop {
            let result = match self.exec(rows, program, pc, hits) {
                Ok(Flow::End) => return Ok(()),
                // A row too deep for the registers: its `fires` code on the stack machine.
                Ok(Flow::Stack) => {
                    let at = program.row_at(self.pc);
                    match program.stack_code(at) {
                        Some(code) => self.run(code).map(|v| v != 0),
                        None => Err(Stop::Fail(EvalError::Type)),
                    }
                }
                Err(e) => Err(e),
            };
            let at = program.row_at(self.pc);
            let error = match result {
                Ok(false) => None,
                Ok(true) => None,
                Err(Stop::Need(f)) => return Err(Interrupt::Need(f)),
                Err(Stop::Fail(e)) => Some(e),
            };
            // A row that could not be evaluated: refuse and hold rows match (fail closed),
            // warn rows do not.
            if let Some(row) = rows.get(at)
                && (result == Ok(true) || (error.is_some() && row.verdict != Verdict::Warn))
            {
                hits.push(Hit {
                    rule: row.rule,
                    verdict: row.verdict,
                    error,
                });
            }
            pc = program.next_entry(at);
        }
    }

    /// Runs a flat program from `pc` to its end, or to the first error (its `pc` left in
    /// `self.pc`).
    #[inline]
    fn exec(
        &mut self,
        rows: &[Row],
        program: &FlatProgram,
        mut pc: usize,
        hits: &mut Hits,
    ) -> Result<Flow, Stop> {
        use flat::Op as F;
        let cache = &mut self.cache;
        let strings: &'a [Arc<str>] = &self.table.strings;
        let ins = program.ins.as_slice();
        const M: usize = VALUES - 1;
        macro_rules! fail {
            ($e:expr) => {{
                self.pc = pc;
                return Err(Stop::Fail($e));
            }};
        }
        macro_rules! arith {
            ($i:expr, $a:expr, $f:ident, $b:expr) => {{
                let (a, b) = ($a, $b);
                match a.$f(b) {
                    Some(v) => cache.vals[usize::from($i.x) & M] = v,
                    None if b == 0 => fail!(EvalError::DivisionByZero),
                    None => fail!(EvalError::Overflow),
                }
                pc += 1;
            }};
        }
        // Every jump goes forward (see `compile::flat`), so this ends.
        loop {
            let Some(i) = ins.get(pc) else {
                fail!(EvalError::Type)
            };
            if cache.known & i.need != i.need
                && let Err(e) = cache.need(i)
            {
                self.pc = pc;
                return Err(e);
            }
            let a = cache.vals[usize::from(i.a) & M];
            macro_rules! b {
                () => {
                    cache.vals[usize::from(i.b) & M]
                };
            }
            match i.op {
                F::CmpK | F::Cmp => {
                    let Some(a) = a.checked_add(i.d) else {
                        fail!(EvalError::Overflow)
                    };
                    let b = if i.op == F::CmpK {
                        i.k
                    } else {
                        match b!().checked_add(i.k) {
                            Some(b) => b,
                            None => fail!(EvalError::Overflow),
                        }
                    };
                    // 0 less, 1 equal, 2 greater
                    let ord = usize::from(a >= b) + usize::from(a > b);
                    pc = i.to[ord] as usize;
                }
                F::Test => pc = i.to[usize::from(a != 0)] as usize,
                F::Hit => {
                    if let Some(row) = rows.get(i.k as usize) {
                        hits.push(Hit {
                            rule: row.rule,
                            verdict: row.verdict,
                            error: None,
                        });
                    }
                    pc += 1;
                }
                F::End => return Ok(Flow::End),
                F::AddK => arith!(i, a, checked_add, i.k),
                F::SubK => arith!(i, a, checked_sub, i.k),
                F::MulK => arith!(i, a, checked_mul, i.k),
                F::DivK => arith!(i, a, checked_div, i.k),
                F::ModK => arith!(i, a, checked_rem, i.k),
                F::Add => arith!(i, a, checked_add, b!()),
                F::Sub => arith!(i, a, checked_sub, b!()),
                F::Mul => arith!(i, a, checked_mul, b!()),
                F::Div => arith!(i, a, checked_div, b!()),
                F::Mod => arith!(i, a, checked_rem, b!()),
                F::Neg => match a.checked_neg() {
                    Some(v) => {
                        cache.vals[usize::from(i.x) & M] = v;
                        pc += 1;
                    }
                    None => fail!(EvalError::Overflow),
                },
                F::Mov => {
                    cache.vals[usize::from(i.x) & M] = i.k;
                    pc += 1;
                }
                F::Set => {
                    cache.vals[usize::from(i.x) & M] = i.k;
                    pc = i.to[0] as usize;
                }
                F::Text => {
                    let Some(&(ta, tb)) = program.texts.get(i.k as usize) else {
                        fail!(EvalError::Type)
                    };
                    let eq = match cache.text(ta, strings) {
                        Ok(ta) => cache.text(tb, strings).map(|tb| ta == tb),
                        Err(e) => Err(e),
                    };
                    match eq {
                        Ok(eq) => pc = i.to[usize::from(eq)] as usize,
                        Err(Stop::Fail(e)) => fail!(e),
                        Err(e) => return Err(e),
                    }
                }
                F::Jump => pc = i.to[0] as usize,
                F::Stack => {
                    self.pc = pc;
                    return Ok(Flow::Stack);
                }
                F::Need => pc += 1,
                F::Invalid => fail!(EvalError::Type),
            }
        }
    }

    /// The stack machine: integers only.
    fn run(&mut self, code: &Code) -> Result<i64, Stop> {
        let strings: &'a [Arc<str>] = &self.table.strings;
        let cache = &mut self.cache;
        let mut stack = [0i64; MAX_STACK];
        let mut sp = 0usize;
        let mut pc = 0usize;
        let ops = code.ops.as_slice();
        macro_rules! push {
            ($v:expr) => {{
                let v = $v;
                match stack.get_mut(sp) {
                    Some(slot) => *slot = v,
                    None => return Err(Stop::Fail(EvalError::Overflow)),
                }
                sp += 1;
            }};
        }
        macro_rules! pop2 {
            () => {{
                if sp < 2 {
                    return Err(Stop::Fail(EvalError::Type));
                }
                sp -= 2;
                (stack[sp], stack[sp + 1])
            }};
        }
        macro_rules! arith {
            ($f:ident) => {{
                let (l, r) = pop2!();
                match l.$f(r) {
                    Some(v) => push!(v),
                    None if r == 0 => return Err(Stop::Fail(EvalError::DivisionByZero)),
                    None => return Err(Stop::Fail(EvalError::Overflow)),
                }
            }};
        }
        macro_rules! top_k {
            ($f:expr) => {{
                let Some(top) = sp.checked_sub(1) else {
                    return Err(Stop::Fail(EvalError::Type));
                };
                stack[top] = ($f)(stack[top]).map_err(Stop::Fail)?;
            }};
        }
        macro_rules! cmp {
            ($op:tt) => {{
                let (l, r) = pop2!();
                push!(i64::from(l $op r))
            }};
        }
        while let Some(op) = ops.get(pc) {
            pc += 1;
            match *op {
                Op::Fact(slot) => {
                    let slot = slot as usize;
                    cache.ensure(slot)?;
                    push!(cache.vals[slot % VALUES]);
                }
                Op::Int(i) => push!(i),
                Op::Not => match sp.checked_sub(1) {
                    Some(top) => stack[top] = i64::from(stack[top] == 0),
                    None => return Err(Stop::Fail(EvalError::Type)),
                },
                Op::Neg => match sp.checked_sub(1) {
                    Some(top) => match stack[top].checked_neg() {
                        Some(n) => stack[top] = n,
                        None => return Err(Stop::Fail(EvalError::Overflow)),
                    },
                    None => return Err(Stop::Fail(EvalError::Type)),
                },
                Op::Add => arith!(checked_add),
                Op::Sub => arith!(checked_sub),
                Op::Mul => arith!(checked_mul),
                Op::Div => arith!(checked_div),
                Op::Mod => arith!(checked_rem),
                Op::Eq => cmp!(==),
                Op::Ne => cmp!(!=),
                Op::Lt => cmp!(<),
                Op::Le => cmp!(<=),
                Op::Gt => cmp!(>),
                Op::Ge => cmp!(>=),
                Op::AddK(k) => top_k!(|l: i64| l.checked_add(k).ok_or(EvalError::Overflow)),
                Op::SubK(k) => top_k!(|l: i64| l.checked_sub(k).ok_or(EvalError::Overflow)),
                Op::MulK(k) => top_k!(|l: i64| l.checked_mul(k).ok_or(EvalError::Overflow)),
                Op::DivK(k) => top_k!(|l: i64| match k {
                    0 => Err(EvalError::DivisionByZero),
                    _ => l.checked_div(k).ok_or(EvalError::Overflow),
                }),
                Op::ModK(k) => top_k!(|l: i64| match k {
                    0 => Err(EvalError::DivisionByZero),
                    _ => l.checked_rem(k).ok_or(EvalError::Overflow),
                }),
                Op::EqK(k) => top_k!(|l: i64| Ok::<i64, EvalError>(i64::from(l == k))),
                Op::NeK(k) => top_k!(|l: i64| Ok::<i64, EvalError>(i64::from(l != k))),
                Op::LtK(k) => top_k!(|l: i64| Ok::<i64, EvalError>(i64::from(l < k))),
                Op::LeK(k) => top_k!(|l: i64| Ok::<i64, EvalError>(i64::from(l <= k))),
                Op::GtK(k) => top_k!(|l: i64| Ok::<i64, EvalError>(i64::from(l > k))),
                Op::GeK(k) => top_k!(|l: i64| Ok::<i64, EvalError>(i64::from(l >= k))),
                Op::TextEq { a, b, ne } => {
                    let a = cache.text(a, strings)?;
                    let b = cache.text(b, strings)?;
                    push!(i64::from((a == b) != ne));
                }
                Op::JumpIfFalse(target) | Op::JumpIfTrue(target) => {
                    let want = matches!(op, Op::JumpIfTrue(_));
                    match sp.checked_sub(1) {
                        Some(top) if (stack[top] != 0) == want => pc = target as usize,
                        Some(_) => sp -= 1,
                        None => return Err(Stop::Fail(EvalError::Type)),
                    }
                }
                Op::Invalid => return Err(Stop::Fail(EvalError::Type)),
            }
        }
        match sp {
            1 => Ok(stack[0]),
            _ => Err(Stop::Fail(EvalError::Type)),
        }
    }
}

/// A rule that matched, with its message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub rule: String,
    pub verdict: Verdict,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What the table decided for a request or a reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub refusals: Vec<Finding>,
    pub holds: Vec<Finding>,
    pub warnings: Vec<Finding>,
}

impl Decision {
    /// Refusals override holds, holds override proceeding.
    pub fn verdict(&self) -> Option<Verdict> {
        if !self.refusals.is_empty() {
            Some(Verdict::Refuse)
        } else if !self.holds.is_empty() {
            Some(Verdict::Hold)
        } else {
            None
        }
    }

    /// The findings that decided (refusals, else holds).
    pub fn deciding(&self) -> &[Finding] {
        if !self.refusals.is_empty() {
            &self.refusals
        } else {
            &self.holds
        }
    }
}

/// Evaluates one event and adds what matched to `decision`, messages rendered. Rules that
/// match for several events of one request are reported once.
pub fn decide_into<'a, F: Facts<'a>>(
    session: &mut Session<'a, F>,
    event: Event,
    decision: &mut Decision,
) -> Result<(), Interrupt> {
    let hits = session.matches(event)?;
    for hit in &hits {
        let message = session.render(hit)?;
        let rule = session
            .table
            .rules
            .get(hit.rule as usize)
            .map(|r| (r.name.clone(), r.reason.clone()))
            .unwrap_or_default();
        let finding = Finding {
            rule: rule.0,
            verdict: hit.verdict,
            message,
            reason: rule.1,
        };
        let list = match hit.verdict {
            Verdict::Refuse => &mut decision.refusals,
            Verdict::Hold => &mut decision.holds,
            Verdict::Warn => &mut decision.warnings,
        };
        if !list.contains(&finding) {
            list.push(finding);
        }
    }
    Ok(())
}

/// Appends `v` in decimal: what `write!(out, "{v}")` does, without the formatting machinery.
fn push_int(out: &mut String, v: i64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    let mut n = v.unsigned_abs();
    loop {
        at -= 1;
        // `n % 10` is below 10, so the cast keeps it whole.
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        out.push('-');
    }
    // Only ASCII digits were written.
    out.push_str(std::str::from_utf8(&buf[at..]).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::push_int;

    #[test]
    fn push_int_writes_what_display_writes() {
        for v in [
            0,
            1,
            -1,
            9,
            10,
            -10,
            99,
            100,
            12_345,
            -987_654_321,
            i64::MAX,
            i64::MIN,
            i64::MIN + 1,
        ] {
            let mut out = String::from("x=");
            push_int(&mut out, v);
            assert_eq!(out, format!("x={v}"));
        }
    }
}
