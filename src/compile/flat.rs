//! The hot path's form of a row group: one flat branch program per (verb, subject, site).
//!
//! Each row's `when and not unless` becomes control flow: `and`, `or` and `not` are jumps,
//! a comparison is one instruction that reads its operands and branches, and integer
//! arithmetic writes registers. Booleans reach a register only where a bool is compared with
//! `==`/`!=`. Operands are indexes into one value array of the session: fact slots first
//! (bools as 0/1), then registers; a constant operand sits in the instruction. Each
//! instruction carries the bit set of the facts it reads, so the interpreter checks them
//! with one mask test and asks the provider only on a miss.
//!
//! The rows follow each other: a row that fires runs [`Op::Hit`] and falls through into the
//! next row; a row that does not jumps to the next row's entry; the last row is followed by
//! [`Op::End`]. Every jump goes forward, so a program always ends.
//!
//! Evaluation order is the stack machine's (the `reorder`ed `fires` expression, operands left
//! to right), so facts are asked for in the same order and only when the cheaper conditions
//! already hold, and an arithmetic error stops the row at the same point.

use super::{MAX_STACK, Text, reorder};
use crate::check::{Typed, TypedKind, ValueKind};
use crate::syntax::ast::{BinOp, UnOp};
use crate::vocab::{FACT_COUNT, FACTS, Type};

/// The length of a wide program's value array: the int and bool facts, then registers. A
/// power of two, so an index masked into range needs no bounds check. 128 since the
/// facts of a roll's width (`max_unavailable`, `roll.*`) took the int and bool facts past
/// 31, which 64 values with more than [`MAX_STACK`] registers could not hold.
pub const VALUES: usize = 128;

/// The value array a session keeps: the int and bool facts, then the registers of the
/// programs whose indexes all fall below it (nearly all: ten registers). Half of
/// [`VALUES`], so starting a session zeroes half as much (512 bytes); a program that reaches further
/// ([`FlatProgram::wide`]) runs on an array of [`VALUES`] of its own.
pub const SESSION_VALUES: usize = 64;

/// The int and bool facts: the ones that have a place in the value array (name and enum
/// facts keep their text apart).
pub const VALUE_FACTS: usize = {
    let (mut i, mut n) = (0, 0);
    while i < FACT_COUNT {
        if !matches!(FACTS[i].ty, Type::Name | Type::Enum(_)) {
            n += 1;
        }
        i += 1;
    }
    n
};

/// Where each fact slot keeps its value in the value array (`u8::MAX`: a name or enum
/// fact, which has none): the int and bool facts in slot order.
pub const VALUE_OF_SLOT: [u8; FACT_COUNT] = {
    let mut at = [u8::MAX; FACT_COUNT];
    let (mut i, mut n) = (0, 0);
    while i < FACT_COUNT {
        if !matches!(FACTS[i].ty, Type::Name | Type::Enum(_)) {
            at[i] = n;
            n += 1;
        }
        i += 1;
    }
    at
};

/// The fact slot of each value index (`u8::MAX`: a register).
pub const SLOT_OF_VALUE: [u8; VALUES] = {
    let mut slots = [u8::MAX; VALUES];
    let mut i = 0;
    while i < FACT_COUNT {
        if VALUE_OF_SLOT[i] != u8::MAX {
            slots[VALUE_OF_SLOT[i] as usize] = i as u8;
        }
        i += 1;
    }
    slots
};

/// Where the registers start in the value array (after the int and bool facts).
pub const REG_BASE: usize = VALUE_FACTS;
/// The registers a row may use. A row that needs more runs on the stack machine
/// ([`Op::Stack`]).
pub const MAX_REGS: usize = VALUES - REG_BASE;

// The checker's and this program's sets of facts read are `u64` masks, one bit per slot
// (`checked_shl(..).unwrap_or(0)` would drop a 65th fact from them, and with it the read
// it needs): a fact past 64 must widen them first. Every row the checker accepts fits the
// registers (more than `MAX_STACK`), so every accepted row runs flat.
const _: () = assert!(
    FACT_COUNT <= 64
        && MAX_REGS > MAX_STACK
        && VALUES.is_power_of_two()
        && VALUES <= 256
        && SESSION_VALUES.is_power_of_two()
        && REG_BASE < SESSION_VALUES
        && SESSION_VALUES <= VALUES
);

/// Bits of a comparison mask: which orderings of `a` against `b` make it true.
pub const LT: u8 = 1;
pub const EQ: u8 = 2;
pub const GT: u8 = 4;

/// What an instruction does. `a`, `b` and `x` are fields of [`Ins`]. The comparisons come
/// first: the interpreter tells them apart from the rest with one `<=` (`Op::CmpDiv` is the
/// last of them), and chooses their right operand rather than jumping to code for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    /// Jump to `to[0]`, `to[1]` or `to[2]` as `v[a] + d` is less than, equal to or greater
    /// than `k`. The addition is checked: `(approved - 1) == 0` is one instruction.
    CmpK,
    /// The same against `v[b] + k` (checked).
    Cmp,
    /// The same against `v[b] / 2^x + k` (the division as [`Op::DivP2`], the addition
    /// checked): `after < quorum` is one instruction.
    CmpDiv,
    /// Jump to `to[1]` when `v[a]` is not 0 (a bool fact holds), else to `to[0]`.
    Test,
    /// `v[x] = v[a] op k`, checked: overflow and division by zero stop the row.
    AddK,
    SubK,
    MulK,
    DivK,
    /// `v[x] = v[a] / 2^k` (a division by a constant power of two, 2 or more, truncated as
    /// `/` truncates): it cannot fail, and needs no hardware division.
    DivP2,
    ModK,
    /// `v[x] = v[a] op v[b]`, checked.
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    /// `v[x] = -v[a]`, checked.
    Neg,
    /// `v[x] = k`.
    Mov,
    /// `v[x] = k`, then jump to `to[0]` (a bool compared with `==`/`!=`).
    Set,
    /// Jump to `to[1]` when the texts of pair `k` of [`FlatProgram::texts`] are equal, else
    /// to `to[0]`.
    Text,
    /// Jump to `to[0]`.
    Jump,
    /// Ask for the facts of `need` now, so facts are asked in the order the expression
    /// reads them.
    Need,
    /// Row `k` of the group fires; go on with the next row.
    Hit,
    /// The last row is done.
    End,
    /// Row `k` runs its `fires` code (`FlatProgram::deep[d]`) on the stack machine; then
    /// the next row.
    Stack,
    /// An expression the checker should have rejected; evaluates to a type error.
    Invalid,
}

/// One instruction: 32 bytes, one format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ins {
    pub op: Op,
    /// Value index of the left operand.
    pub a: u8,
    /// Value index of the right operand (`Cmp` and the arithmetic without `K`).
    pub b: u8,
    /// Destination value index.
    pub x: u8,
    /// The facts this instruction reads (bit = slot), left operand's first.
    pub need: u64,
    /// The constant operand; for `Cmp`, what it adds to its right operand first.
    pub k: i64,
    /// What a comparison adds to its left operand first; for `Stack`, the index of its
    /// code in [`FlatProgram::deep`]. 32 bits, so an instruction is 32 bytes.
    pub d: i32,
    /// Jump targets (see [`Op`]).
    pub to: [u32; 3],
}

impl Ins {
    const fn op(op: Op) -> Self {
        Ins {
            op,
            a: 0,
            b: 0,
            x: 0,
            need: 0,
            k: 0,
            d: 0,
            to: [0; 3],
        }
    }
}

/// The flat program of a row group.
#[derive(Clone, Debug, Default)]
pub struct FlatProgram {
    pub ins: Vec<Ins>,
    /// The text pairs [`Op::Text`] compares.
    pub texts: Vec<(Text, Text)>,
    /// Per row, where its program starts.
    pub entries: Vec<u32>,
    /// The rows that run on the stack machine, with their `fires` code.
    pub stack_rows: Vec<u32>,
    pub deep: Vec<super::Code>,
    /// Whether an instruction reads or writes an index at or past [`SESSION_VALUES`]: the
    /// program then runs on a value array of [`VALUES`] of its own.
    pub wide: bool,
    /// Whether every row runs on the stack machine (`compile::Options { flat: false }`):
    /// the session then runs them one after the other, without the flat loop.
    pub stack_only: bool,
}

impl FlatProgram {
    /// The stack-machine code of a row compiled to [`Op::Stack`].
    pub fn stack_code(&self, row: usize) -> Option<&super::Code> {
        let i = self.stack_rows.iter().position(|&r| r as usize == row)?;
        self.deep.get(i)
    }

    /// The row whose program holds `pc`.
    pub fn row_at(&self, pc: usize) -> usize {
        self.entries
            .partition_point(|&e| e as usize <= pc)
            .saturating_sub(1)
    }

    /// Where the row after `row` starts (the `End` after the last row).
    pub fn next_entry(&self, row: usize) -> usize {
        match self.entries.get(row + 1) {
            Some(&e) => e as usize,
            None => self.ins.len().saturating_sub(1),
        }
    }
}

/// An operand while compiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    /// An int or bool fact slot.
    Fact(u8),
    Reg(u8),
    K(i64),
}

impl Src {
    fn index(self) -> u8 {
        match self {
            Src::Fact(s) => VALUE_OF_SLOT
                .get(usize::from(s))
                .copied()
                .unwrap_or(u8::MAX),
            // Registers are below MAX_REGS, so this stays below VALUES.
            Src::Reg(r) => r.saturating_add(REG_BASE as u8),
            Src::K(_) => 0,
        }
    }

    fn need(self) -> u64 {
        match self {
            Src::Fact(s) => 1u64.checked_shl(u32::from(s)).unwrap_or(0),
            _ => 0,
        }
    }
}

/// Compiles the rows of one group into one [`FlatProgram`].
pub(super) struct Flat<'s> {
    prog: FlatProgram,
    /// Label -> pc, `u32::MAX` until placed.
    labels: Vec<u32>,
    /// Interns string constants.
    compiler: &'s mut super::Compiler,
    /// Where the last label was placed: no instruction before it may be fused.
    placed: u32,
    /// Rows become branches where they fit (else every row is [`Op::Stack`]).
    branches: bool,
}

#[derive(Clone, Copy)]
struct Label(u32);

/// Too many registers: the row runs on the stack machine.
struct TooDeep;

impl<'s> Flat<'s> {
    /// `branches`: false puts every row on the stack machine ([`Op::Stack`]).
    pub(super) fn new(compiler: &'s mut super::Compiler, branches: bool) -> Self {
        Flat {
            prog: FlatProgram::default(),
            labels: Vec::new(),
            compiler,
            placed: 0,
            branches,
        }
    }

    /// Whether a label was placed at the end of the program (the last instruction is then a
    /// jump target, and is not merged into the next).
    fn at_placed(&self) -> bool {
        usize::try_from(self.placed).is_ok_and(|p| p == self.prog.ins.len())
    }

    fn pc(&mut self) -> u32 {
        self.compiler.index(self.prog.ins.len(), "instructions")
    }

    /// Appends the program of the next row (`None`: always fires).
    pub(super) fn row(&mut self, fires: Option<&Typed>) {
        let row = self.compiler.index(self.prog.entries.len(), "rows");
        let pc = self.pc();
        self.prog.entries.push(pc);
        let hit = Ins {
            k: i64::from(row),
            ..Ins::op(Op::Hit)
        };
        let Some(e) = fires else {
            self.prog.ins.push(hit);
            return;
        };
        let e = reorder(e);
        let start_ins = self.prog.ins.len();
        let start_texts = self.prog.texts.len();
        let start_labels = self.labels.len();
        let (t, next) = (self.label(), self.label());
        if e.info.depth > MAX_STACK {
            // As deep as the stack machine refuses: a type error, failing closed.
            self.prog.ins.push(Ins::op(Op::Invalid));
        } else if self.branches && self.cond(&e, t, next, 0).is_ok() {
            self.place(t);
            self.prog.ins.push(hit);
            self.place(next);
        } else {
            self.prog.ins.truncate(start_ins);
            self.prog.texts.truncate(start_texts);
            self.labels.truncate(start_labels);
            self.prog.ins.push(Ins {
                k: i64::from(row),
                d: i32::try_from(self.prog.deep.len()).unwrap_or(i32::MAX),
                ..Ins::op(Op::Stack)
            });
            self.prog.deep.push(self.compiler.code(&e));
            self.prog.stack_rows.push(row);
        }
    }

    /// Ends the program and resolves labels to program indexes.
    pub(super) fn finish(mut self) -> FlatProgram {
        self.prog.ins.push(Ins::op(Op::End));
        let labels = std::mem::take(&mut self.labels);
        let at = |l: u32| labels.get(l as usize).copied().unwrap_or(u32::MAX);
        for ins in &mut self.prog.ins {
            if matches!(
                ins.op,
                Op::CmpK | Op::Cmp | Op::CmpDiv | Op::Test | Op::Text | Op::Set | Op::Jump
            ) {
                ins.to = ins.to.map(at);
            }
        }
        thread_jumps(&mut self.prog);
        self.prog.stack_only =
            !self.prog.entries.is_empty() && self.prog.stack_rows.len() == self.prog.entries.len();
        self.prog.wide = self.prog.ins.iter().any(|i| {
            [i.a, i.b, i.x]
                .iter()
                .any(|&v| usize::from(v) >= SESSION_VALUES)
        });
        self.prog
    }

    fn label(&mut self) -> Label {
        self.labels.push(u32::MAX);
        Label(self.compiler.index(self.labels.len() - 1, "jump labels"))
    }

    fn place(&mut self, l: Label) {
        let pc = self.pc();
        self.placed = pc;
        if let Some(slot) = self.labels.get_mut(l.0 as usize) {
            *slot = pc;
        }
    }

    fn push(&mut self, ins: Ins) {
        self.prog.ins.push(ins);
    }

    fn jump(&mut self, to: Label) {
        self.push(Ins {
            to: [to.0; 3],
            ..Ins::op(Op::Jump)
        });
    }

    /// A comparison of two operands, branching to `t` or `f`.
    fn compare(&mut self, a: Src, b: Src, mask: u8, t: Label, f: Label) {
        // A constant on the left reads nothing: mirror it to the right.
        let (a, b, mask) = match (a, b) {
            (Src::K(_), Src::K(_)) | (Src::Fact(_) | Src::Reg(_), _) => (a, b, mask),
            (Src::K(_), _) => {
                let mirrored = (mask & EQ) | ((mask & LT) << 2) | ((mask & GT) >> 2);
                (b, a, mirrored)
            }
        };
        let pick = |bit: u8| if mask & bit != 0 { t.0 } else { f.0 };
        let mut ins = Ins {
            a: a.index(),
            need: a.need() | b.need(),
            to: [pick(LT), pick(EQ), pick(GT)],
            ..Ins::op(Op::CmpK)
        };
        // `v + k` or `v - k` just computed into an operand's register, and read only here
        // (each register value is read once): the comparison does the addition itself, in
        // the same order. Nothing jumps between the two (labels are placed only between
        // conditions; `placed` makes sure).
        let addend = |last: &Ins| match last.op {
            Op::AddK => Some(last.k),
            Op::SubK => last.k.checked_neg(),
            _ => None,
        };
        let mut left_need = a.need();
        // The right operand's addend (a `Cmp`'s `k`).
        let mut right = (b.index(), b.need(), 0);
        if let (Src::Reg(_), Some(last), true) = (b, self.prog.ins.last(), !self.at_placed())
            && last.x == b.index()
            && let Some(e) = addend(last)
        {
            right = (last.a, last.need, e);
            self.prog.ins.pop();
        }
        // The right operand's division by a power of two (`approved / 2`), right before.
        let mut shift = None;
        if usize::from(right.0) >= REG_BASE
            && let (Some(last), true) = (self.prog.ins.last(), !self.at_placed())
            && last.op == Op::DivP2
            && last.x == right.0
            && let Ok(n) = u8::try_from(last.k)
        {
            right = (last.a, last.need, right.2);
            shift = Some(n);
            self.prog.ins.pop();
        }
        // The left operand's addend (`d`), when its `v + k` comes before, with nothing in
        // between that could fail, ask for another fact, or touch its register (`after <
        // quorum`: `approved - 1` then `approved / 2`), and no jump target after it.
        if let Src::Reg(_) = a
            && let Some(at) = self.left_addend(a.index())
            && let Some(last) = self.prog.ins.get(at).copied()
            && let Some(d) = addend(&last).and_then(|d| i32::try_from(d).ok())
        {
            left_need = last.need;
            ins.a = last.a;
            ins.d = d;
            self.prog.ins.remove(at);
        }
        ins.need = left_need | right.1;
        match (a, b) {
            (Src::K(ka), Src::K(kb)) => {
                let ord = match ka.cmp(&kb) {
                    std::cmp::Ordering::Less => LT,
                    std::cmp::Ordering::Equal => EQ,
                    std::cmp::Ordering::Greater => GT,
                };
                self.jump(if mask & ord != 0 { t } else { f });
            }
            // `fact != 0` and `fact == 0`: a bool test.
            (Src::Fact(_), Src::K(0)) if ins.d == 0 && ins.to[0] == ins.to[2] => self.push(Ins {
                op: Op::Test,
                to: [ins.to[1], ins.to[0], ins.to[0]],
                ..ins
            }),
            (_, Src::K(k)) => self.push(Ins { k, ..ins }),
            _ => self.push(Ins {
                op: if shift.is_some() { Op::CmpDiv } else { Op::Cmp },
                b: right.0,
                x: shift.unwrap_or(0),
                k: right.2,
                ..ins
            }),
        }
    }

    /// Where the `v + k` or `v - k` that computed register `reg` is, when the comparison
    /// about to be emitted may do it instead: no label placed after it, and every
    /// instruction after it one that cannot fail, reads no other fact and does not touch
    /// `reg` (so moving the addition, and its overflow, to the comparison changes nothing
    /// but the work).
    fn left_addend(&self, reg: u8) -> Option<usize> {
        let ins = &self.prog.ins;
        let at = ins.iter().rposition(|i| i.x == reg && i.op != Op::Hit)?;
        let found = ins.get(at)?;
        if !matches!(found.op, Op::AddK | Op::SubK) || (at as u64) < u64::from(self.placed) {
            return None;
        }
        let quiet = |i: &Ins| {
            i.op == Op::DivP2
                && i.x != reg
                && i.x != found.a
                && i.a != reg
                && i.need & !found.need == 0
        };
        ins.get(at + 1..)?.iter().all(quiet).then_some(at)
    }

    /// Emits a bool expression as jumps to `t` (true) or `f` (false). `free` is the first
    /// register it may use.
    fn cond(&mut self, e: &Typed, t: Label, f: Label, free: usize) -> Result<(), TooDeep> {
        match &e.kind {
            TypedKind::Bool(b) => self.jump(if *b { t } else { f }),
            TypedKind::Unary(UnOp::Not, inner) => return self.cond(inner, f, t, free),
            TypedKind::Binary(BinOp::And, l, r) => {
                let mid = self.label();
                self.cond(l, mid, f, free)?;
                self.place(mid);
                return self.cond(r, t, f, free);
            }
            TypedKind::Binary(BinOp::Or, l, r) => {
                let mid = self.label();
                self.cond(l, t, mid, free)?;
                self.place(mid);
                return self.cond(r, t, f, free);
            }
            TypedKind::Binary(op @ (BinOp::Eq | BinOp::Ne), l, r)
                if super::is_text(l) || super::is_text(r) =>
            {
                let (t, f) = if *op == BinOp::Ne { (f, t) } else { (t, f) };
                match (self.compiler.text(l), self.compiler.text(r)) {
                    (Some(a), Some(b)) => {
                        self.prog.texts.push((a, b));
                        let k = self
                            .compiler
                            .index(self.prog.texts.len() - 1, "comparisons of text");
                        self.push(Ins {
                            k: i64::from(k),
                            to: [f.0, t.0, f.0],
                            ..Ins::op(Op::Text)
                        });
                    }
                    _ => self.push(Ins::op(Op::Invalid)),
                }
            }
            TypedKind::Binary(
                op @ (BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge),
                l,
                r,
            ) => {
                let (a, b) = self.operands(l, r, free)?;
                let mask = match op {
                    BinOp::Eq => EQ,
                    BinOp::Ne => LT | GT,
                    BinOp::Lt => LT,
                    BinOp::Le => LT | EQ,
                    BinOp::Gt => GT,
                    _ => GT | EQ,
                };
                self.compare(a, b, mask, t, f);
            }
            TypedKind::Fact(_) => {
                let a = self.value(e, free)?;
                self.compare(a, Src::K(0), LT | GT, t, f);
            }
            _ => self.push(Ins::op(Op::Invalid)),
        }
        Ok(())
    }

    /// Emits the two operands of a binary operator, left first.
    fn operands(&mut self, l: &Typed, r: &Typed, free: usize) -> Result<(Src, Src), TooDeep> {
        let a = self.value(l, free)?;
        if let Src::Fact(_) = a
            && !r.is_operand()
        {
            // The stack machine reads the left fact before evaluating the right side.
            self.push(Ins {
                a: a.index(),
                need: a.need(),
                ..Ins::op(Op::Need)
            });
        }
        // A constant on the left goes to register `free` when the right side is done.
        let next = if matches!(a, Src::Reg(_) | Src::K(_)) {
            free + 1
        } else {
            free
        };
        let b = self.value(r, next)?;
        Ok((a, b))
    }

    /// Emits an int (or bool) expression; returns where its value is.
    fn value(&mut self, e: &Typed, free: usize) -> Result<Src, TooDeep> {
        let dst = |free: usize| {
            u8::try_from(free)
                .ok()
                .filter(|_| free < MAX_REGS)
                .ok_or(TooDeep)
        };
        Ok(match &e.kind {
            TypedKind::Int(i) => Src::K(*i),
            TypedKind::Bool(b) => Src::K(i64::from(*b)),
            TypedKind::Fact(f) if e.info.kind != ValueKind::Text => Src::Fact(f.slot8()),
            TypedKind::Fact(_) | TypedKind::Unresolved => {
                self.push(Ins::op(Op::Invalid));
                Src::K(0)
            }
            TypedKind::Unary(UnOp::Neg, inner) => {
                let a = self.value(inner, free)?;
                let r = Src::Reg(dst(free)?);
                let a = self.in_value(a, r);
                self.push(Ins {
                    a: a.index(),
                    x: r.index(),
                    need: a.need(),
                    ..Ins::op(Op::Neg)
                });
                r
            }
            TypedKind::Binary(
                op @ (BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod),
                l,
                r,
            ) => {
                let (a, b) = self.operands(l, r, free)?;
                let dst = Src::Reg(dst(free)?);
                // `k op v`: the constant goes to a register first (kept in this order, so an
                // error stays the same error).
                let a = self.in_value(a, dst);
                let (op, k) = match (op, b) {
                    (BinOp::Add, Src::K(k)) => (Op::AddK, k),
                    (BinOp::Sub, Src::K(k)) => (Op::SubK, k),
                    (BinOp::Mul, Src::K(k)) => (Op::MulK, k),
                    (BinOp::Div, Src::K(k)) if k > 1 && k.count_ones() == 1 => {
                        (Op::DivP2, i64::from(k.trailing_zeros()))
                    }
                    (BinOp::Div, Src::K(k)) => (Op::DivK, k),
                    (BinOp::Mod, Src::K(k)) => (Op::ModK, k),
                    (BinOp::Add, _) => (Op::Add, 0),
                    (BinOp::Sub, _) => (Op::Sub, 0),
                    (BinOp::Mul, _) => (Op::Mul, 0),
                    (BinOp::Div, _) => (Op::Div, 0),
                    _ => (Op::Mod, 0),
                };
                self.push(Ins {
                    op,
                    a: a.index(),
                    b: b.index(),
                    x: dst.index(),
                    need: a.need() | b.need(),
                    k,
                    ..Ins::op(Op::Mov)
                });
                dst
            }
            TypedKind::Str(_) => {
                self.push(Ins::op(Op::Invalid));
                Src::K(0)
            }
            // A bool as a value: branch, then set a register.
            _ => {
                let r = Src::Reg(dst(free)?);
                let (t, f, join) = (self.label(), self.label(), self.label());
                self.cond(e, t, f, free)?;
                for (at, v) in [(t, 1), (f, 0)] {
                    self.place(at);
                    self.push(Ins {
                        x: r.index(),
                        k: v,
                        to: [join.0; 3],
                        ..Ins::op(Op::Set)
                    });
                }
                self.place(join);
                r
            }
        })
    }

    /// A constant as a left operand goes to register `r` first.
    fn in_value(&mut self, a: Src, r: Src) -> Src {
        match a {
            Src::K(k) => {
                self.push(Ins {
                    x: r.index(),
                    k,
                    ..Ins::op(Op::Mov)
                });
                r
            }
            _ => a,
        }
    }
}

/// What a branch decides on, when it reads facts only (their values do not change during a
/// session, so the same branch met again goes the same way): the instruction without its
/// targets. Branches on registers, which later instructions overwrite, have none.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Cmp {
        op: Op,
        a: u8,
        b: u8,
        x: u8,
        d: i32,
        k: i64,
    },
    Test(u8),
    Text(Text, Text),
}

fn is_fact(index: u8) -> bool {
    usize::from(index) < REG_BASE
}

/// The key of a branch, and how many ways it goes (`to[..ways]`).
fn branch_key(prog: &FlatProgram, i: &Ins) -> Option<(Key, usize)> {
    match i.op {
        Op::CmpK if is_fact(i.a) => Some((
            Key::Cmp {
                op: i.op,
                a: i.a,
                b: 0,
                x: 0,
                d: i.d,
                k: i.k,
            },
            3,
        )),
        Op::Cmp | Op::CmpDiv if is_fact(i.a) && is_fact(i.b) => Some((
            Key::Cmp {
                op: i.op,
                a: i.a,
                b: i.b,
                x: if i.op == Op::CmpDiv { i.x } else { 0 },
                d: i.d,
                k: i.k,
            },
            3,
        )),
        Op::Test if is_fact(i.a) => Some((Key::Test(i.a), 2)),
        Op::Text => {
            let &(a, b) = prog.texts.get(usize::try_from(i.k).ok()?)?;
            Some((Key::Text(a, b), 2))
        }
        _ => None,
    }
}

/// Whether an instruction can stop its row with an error (the session then goes on at the
/// next row's entry: `Session::resume`), or hands its row to the stack machine (which
/// also goes on there).
fn can_stop(i: &Ins) -> bool {
    match i.op {
        // `v[a] + d` is checked; the constant side `0 + k` cannot overflow.
        Op::CmpK => i.d != 0,
        Op::Cmp | Op::CmpDiv => i.d != 0 || i.k != 0,
        Op::Test | Op::Jump | Op::Hit | Op::End | Op::Mov | Op::Set | Op::DivP2 | Op::Need => false,
        _ => true,
    }
}

/// What is known on arriving at an instruction: branches already taken on every path that
/// arrives there, each with the set of ways (a bit each) it may have gone.
type Known = Vec<(Key, u8)>;

/// Adds what arrives by one more path: only what both know stays known.
fn meet(known: &mut [Option<Known>], at: usize, arriving: &Known) {
    let Some(slot) = known.get_mut(at) else {
        return;
    };
    match slot {
        None => *slot = Some(arriving.clone()),
        Some(k) => k.retain_mut(
            |(key, ways)| match arriving.iter().find(|(a, _)| a == key) {
                Some((_, more)) => {
                    *ways |= more;
                    true
                }
                None => false,
            },
        ),
    }
}

/// Jump threading: a branch that leads to a branch on the same facts, whose way is then
/// already decided, jumps past it (rows often start with the comparison the row before
/// made: `approved - 1 == 0` in one, `approved - 1 > 0 and ...` in the next). The skipped
/// branch reads only facts already read on every path through the edge, and cannot fail
/// where it did not fail before, so the decision, the facts asked and their order, and
/// the errors stay the same; only fewer instructions run.
///
/// One pass in program order (every jump goes forward): what is known at an instruction is
/// what every path that arrives there knows: its predecessors' edges, the program's start
/// (nothing), and, for a row's entry, the instructions of the row before that can stop it
/// (the session resumes there after an error, knowing what was known there).
fn thread_jumps(prog: &mut FlatProgram) {
    let n = prog.ins.len();
    let mut known: Vec<Option<Known>> = vec![None; n];
    if n == 0 {
        return;
    }
    known[0] = Some(Vec::new());
    for pc in 0..n {
        let Some(k) = known[pc].take() else {
            // Not reachable.
            continue;
        };
        let i = prog.ins[pc];
        if can_stop(&i) {
            let e = prog.next_entry(prog.row_at(pc));
            if e > pc {
                meet(&mut known, e, &k);
            }
        }
        match i.op {
            Op::CmpK | Op::Cmp | Op::CmpDiv | Op::Test | Op::Text => {
                let key = branch_key(prog, &i);
                let ways = key.map_or(
                    if i.op == Op::Test || i.op == Op::Text {
                        2
                    } else {
                        3
                    },
                    |(_, w)| w,
                );
                let mut to = i.to;
                for (way, slot) in to.iter_mut().enumerate().take(ways) {
                    let target = i.to[way];
                    // Each way on its own: where two lead to one place, each may be
                    // threaded further than both could.
                    let mask = 1u8 << way;
                    let mut edge = k.clone();
                    if let Some((key, _)) = key {
                        match edge.iter_mut().find(|(e, _)| *e == key) {
                            Some((_, m)) => *m &= mask,
                            None => edge.push((key, mask)),
                        }
                    }
                    let mut t = target as usize;
                    while let Some(ti) = prog.ins.get(t) {
                        let next = match ti.op {
                            Op::Jump => Some(ti.to[0]),
                            _ => branch_key(prog, ti).and_then(|(tk, tw)| {
                                let (_, m) = edge.iter().find(|(e, _)| *e == tk)?;
                                let mut goes =
                                    (0..tw).filter(|w| m & (1 << w) != 0).map(|w| ti.to[w]);
                                let first = goes.next()?;
                                goes.all(|g| g == first).then_some(first)
                            }),
                        };
                        match next {
                            Some(next) if next as usize > t => t = next as usize,
                            _ => break,
                        }
                    }
                    *slot = u32::try_from(t).unwrap_or(target);
                    meet(&mut known, t, &edge);
                }
                prog.ins[pc].to = to;
            }
            Op::Jump | Op::Set => meet(&mut known, i.to[0] as usize, &k),
            Op::End | Op::Stack | Op::Invalid => {}
            _ => meet(&mut known, pc + 1, &k),
        }
    }
}
