//! The hot path's form of a row group: one flat branch program per (verb, subject, site).
//!
//! Each row's `when and not unless` becomes control flow: `and`, `or` and `not` are jumps,
//! a comparison is one instruction that reads its two operands (a fact slot, a register or
//! a constant) and branches, and integer arithmetic writes registers. Booleans reach a
//! register only where a bool is compared with `==`/`!=`. Every jump goes forward, so a
//! row's program always ends, at a [`Ins::Done`].
//!
//! Evaluation order is the stack machine's (the `reorder`ed `fires` expression, operands left
//! to right), so facts are asked for in the same order and only when the cheaper conditions
//! already hold, and an arithmetic error stops the row at the same point.

use super::{MAX_STACK, Text, reorder};
use crate::syntax::ast::{BinOp, Expr, ExprKind, UnOp};
use crate::vocab::{Fact, Type};

/// The registers a row may use.
pub const MAX_REGS: usize = MAX_STACK;

/// An operand: read in place, nothing pushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    /// An int or bool fact (bools as 0/1), asked of the provider at most once per session.
    Fact(u8),
    Reg(u8),
    K(i64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

/// Bits of a comparison mask: which orderings of `a` against `b` make it true.
pub const LT: u8 = 1;
pub const EQ: u8 = 2;
pub const GT: u8 = 4;

/// One instruction. Targets are indexes into the group's program, always past this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ins {
    /// Jump to `t` when the ordering of `a` against `b` is in `mask`, else to `f`.
    Cmp {
        a: Src,
        b: Src,
        mask: u8,
        t: u32,
        f: u32,
    },
    /// Jump to `t` when the texts are equal, else to `f`.
    Text {
        a: Text,
        b: Text,
        t: u32,
        f: u32,
    },
    /// `dst = a op b`, checked: overflow and division by zero stop the row.
    Arith {
        op: Arith,
        dst: u8,
        a: Src,
        b: Src,
    },
    /// `dst = -a`, checked.
    Neg {
        dst: u8,
        a: Src,
    },
    /// `dst = v`, then jump to `next` (a bool compared with `==`/`!=`).
    Set {
        dst: u8,
        v: i64,
        next: u32,
    },
    Jump(u32),
    /// Ask for a fact now, so facts are asked in the order the expression reads them.
    Need(u8),
    /// The row's result.
    Done(bool),
    /// An expression the checker should have rejected; evaluates to a type error.
    Invalid,
}

/// Compiles rows into one program, each row starting at the entry [`Flat::row`] returns.
pub struct Flat<'s> {
    ins: Vec<Ins>,
    /// Label -> pc, `u32::MAX` until placed.
    labels: Vec<u32>,
    /// Interns string constants.
    compiler: &'s mut super::Compiler,
}

#[derive(Clone, Copy)]
struct Label(u32);

/// Too many registers: the row is compiled to [`Ins::Invalid`], as the stack machine does.
struct TooDeep;

impl<'s> Flat<'s> {
    pub(super) fn new(compiler: &'s mut super::Compiler) -> Self {
        Flat {
            ins: Vec::new(),
            labels: Vec::new(),
            compiler,
        }
    }

    /// Appends the program of a row (`None`: always fires); returns its entry.
    pub fn row(&mut self, fires: Option<&Expr>) -> u32 {
        let entry = u32::try_from(self.ins.len()).unwrap_or(u32::MAX);
        let Some(e) = fires else {
            self.ins.push(Ins::Done(true));
            return entry;
        };
        let e = reorder(e);
        let start_ins = self.ins.len();
        let start_labels = self.labels.len();
        let ok = if super::stack_depth(&e) > MAX_STACK {
            Err(TooDeep)
        } else {
            let (t, f) = (self.label(), self.label());
            let r = self.cond(&e, t, f, 0);
            self.place(t);
            self.ins.push(Ins::Done(true));
            self.place(f);
            self.ins.push(Ins::Done(false));
            r
        };
        if ok.is_err() {
            self.ins.truncate(start_ins);
            self.labels.truncate(start_labels);
            self.ins.push(Ins::Invalid);
        }
        entry
    }

    /// Resolves labels to program indexes; call once, after the last row.
    pub fn finish(mut self) -> Vec<Ins> {
        let labels = std::mem::take(&mut self.labels);
        let at = |l: u32| labels.get(l as usize).copied().unwrap_or(u32::MAX);
        for ins in &mut self.ins {
            match ins {
                Ins::Cmp { t, f, .. } | Ins::Text { t, f, .. } => {
                    *t = at(*t);
                    *f = at(*f);
                }
                Ins::Set { next, .. } | Ins::Jump(next) => *next = at(*next),
                _ => {}
            }
        }
        self.ins
    }

    fn label(&mut self) -> Label {
        self.labels.push(u32::MAX);
        Label(u32::try_from(self.labels.len() - 1).unwrap_or(u32::MAX))
    }

    fn place(&mut self, l: Label) {
        let pc = u32::try_from(self.ins.len()).unwrap_or(u32::MAX);
        if let Some(slot) = self.labels.get_mut(l.0 as usize) {
            *slot = pc;
        }
    }

    /// Emits a bool expression as jumps to `t` (true) or `f` (false). `free` is the first
    /// register it may use.
    fn cond(&mut self, e: &Expr, t: Label, f: Label, free: usize) -> Result<(), TooDeep> {
        match &e.kind {
            ExprKind::Bool(b) => self.ins.push(Ins::Jump(if *b { t.0 } else { f.0 })),
            ExprKind::Unary(UnOp::Not, inner) => return self.cond(inner, f, t, free),
            ExprKind::Binary(BinOp::And, l, r) => {
                let mid = self.label();
                self.cond(l, mid, f, free)?;
                self.place(mid);
                return self.cond(r, t, f, free);
            }
            ExprKind::Binary(BinOp::Or, l, r) => {
                let mid = self.label();
                self.cond(l, t, mid, free)?;
                self.place(mid);
                return self.cond(r, t, f, free);
            }
            ExprKind::Binary(op @ (BinOp::Eq | BinOp::Ne), l, r)
                if super::is_text(l) || super::is_text(r) =>
            {
                let (t, f) = if *op == BinOp::Ne { (f, t) } else { (t, f) };
                match (self.compiler.text(l), self.compiler.text(r)) {
                    (Some(a), Some(b)) => self.ins.push(Ins::Text {
                        a,
                        b,
                        t: t.0,
                        f: f.0,
                    }),
                    _ => self.ins.push(Ins::Invalid),
                }
            }
            ExprKind::Binary(
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
                self.ins.push(Ins::Cmp {
                    a,
                    b,
                    mask,
                    t: t.0,
                    f: f.0,
                });
            }
            ExprKind::Name(_) => {
                let a = self.value(e, free)?;
                self.ins.push(Ins::Cmp {
                    a,
                    b: Src::K(0),
                    mask: LT | GT,
                    t: t.0,
                    f: f.0,
                });
            }
            _ => self.ins.push(Ins::Invalid),
        }
        Ok(())
    }

    /// Emits the two operands of a binary operator, left first.
    fn operands(&mut self, l: &Expr, r: &Expr, free: usize) -> Result<(Src, Src), TooDeep> {
        let a = self.value(l, free)?;
        if let Src::Fact(slot) = a
            && !is_operand(r)
        {
            // The stack machine reads the left fact before evaluating the right side.
            self.ins.push(Ins::Need(slot));
        }
        let next = if matches!(a, Src::Reg(_)) {
            free + 1
        } else {
            free
        };
        let b = self.value(r, next)?;
        Ok((a, b))
    }

    /// Emits an int (or bool) expression; returns where its value is.
    fn value(&mut self, e: &Expr, free: usize) -> Result<Src, TooDeep> {
        let reg = |free: usize| u8::try_from(free).ok().filter(|_| free < MAX_REGS);
        Ok(match &e.kind {
            ExprKind::Int(i) => Src::K(*i),
            ExprKind::Bool(b) => Src::K(i64::from(*b)),
            ExprKind::Name(n) => match Fact::lookup(n) {
                Some(f) if matches!(f.info().ty, Type::Int | Type::Bool) => {
                    Src::Fact(u8::try_from(f.slot()).unwrap_or(u8::MAX))
                }
                _ => {
                    self.ins.push(Ins::Invalid);
                    Src::K(0)
                }
            },
            ExprKind::Unary(UnOp::Neg, inner) => {
                let a = self.value(inner, free)?;
                let dst = reg(free).ok_or(TooDeep)?;
                self.ins.push(Ins::Neg { dst, a });
                Src::Reg(dst)
            }
            ExprKind::Binary(
                op @ (BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod),
                l,
                r,
            ) => {
                let (a, b) = self.operands(l, r, free)?;
                let dst = reg(free).ok_or(TooDeep)?;
                let op = match op {
                    BinOp::Add => Arith::Add,
                    BinOp::Sub => Arith::Sub,
                    BinOp::Mul => Arith::Mul,
                    BinOp::Div => Arith::Div,
                    _ => Arith::Mod,
                };
                self.ins.push(Ins::Arith { op, dst, a, b });
                Src::Reg(dst)
            }
            ExprKind::Str(..) => {
                self.ins.push(Ins::Invalid);
                Src::K(0)
            }
            // A bool as a value: branch, then set a register.
            _ => {
                let dst = reg(free).ok_or(TooDeep)?;
                let (t, f, join) = (self.label(), self.label(), self.label());
                self.cond(e, t, f, free)?;
                self.place(t);
                self.ins.push(Ins::Set {
                    dst,
                    v: 1,
                    next: join.0,
                });
                self.place(f);
                self.ins.push(Ins::Set {
                    dst,
                    v: 0,
                    next: join.0,
                });
                self.place(join);
                Src::Reg(dst)
            }
        })
    }
}

/// Whether an expression is read in place (emits no instruction).
fn is_operand(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Int(_) | ExprKind::Bool(_) => true,
        ExprKind::Name(n) => {
            Fact::lookup(n).is_some_and(|f| matches!(f.info().ty, Type::Int | Type::Bool))
        }
        _ => false,
    }
}
