//! The stack machine: rows too deep for the flat form, guards, `let` values and message
//! placeholders.

use super::{EvalError, Facts, Session, Stop};
use crate::compile::{Code, MAX_STACK, Op};
use std::sync::Arc;

/// The stack of code that needs no more (most conditions need 2 to 4).
const SMALL_STACK: usize = 8;

impl<'a, F: Facts<'a>> Session<'a, F> {
    /// The stack machine: integers only. A stack as deep as the code needs (the checker's
    /// depth, [`Code::depth`]): a small one for the usual conditions, which costs less to
    /// set up for every row. Not inlined: the flat program's loop stays small.
    #[inline(never)]
    pub(super) fn run(&mut self, code: &Code) -> Result<i64, Stop> {
        if usize::from(code.depth) <= SMALL_STACK {
            self.run_in::<SMALL_STACK>(code)
        } else {
            self.run_in::<MAX_STACK>(code)
        }
    }

    fn run_in<const N: usize>(&mut self, code: &Code) -> Result<i64, Stop> {
        let strings: &'a [Arc<str>] = &self.table.strings;
        let cache = &mut self.cache;
        let mut stack = [0i64; N];
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
                    push!(cache.value(slot));
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
