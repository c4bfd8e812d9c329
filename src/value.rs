//! Runtime values and the reference evaluator of expressions over facts.
//!
//! The reference evaluator walks the AST (with `let`s already inlined by the checker). The
//! lints enumerate it over the facts' domains, and the property tests compare it with the
//! compiled table; the hot path never uses it.

use crate::syntax::ast::{BinOp, Expr, ExprKind, UnOp};
use crate::vocab::Fact;
use std::fmt;

/// A value: ints, bools, and text borrowed from the snapshot or the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    Int(i64),
    Bool(bool),
    Str(&'a str),
}

impl Value<'_> {
    pub fn as_bool(self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

impl fmt::Display for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Str(s) => f.write_str(s),
        }
    }
}

/// Why an expression could not be evaluated. The checker rules out type errors; division by
/// zero and overflow are left, and a decision fails closed on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("division by zero")]
    DivisionByZero,
    #[error("integer overflow")]
    Overflow,
    #[error("type error")]
    Type,
    #[error("the fact `{0}` is not available")]
    Unavailable(Fact),
}

/// Applies a binary operator to two evaluated operands (not `and`/`or`, which short-circuit).
pub fn binary<'a>(op: BinOp, l: Value<'a>, r: Value<'a>) -> Result<Value<'a>, EvalError> {
    use Value::*;
    Ok(match (op, l, r) {
        (BinOp::Eq, a, b) => Bool(a == b),
        (BinOp::Ne, a, b) => Bool(a != b),
        (BinOp::Lt, Int(a), Int(b)) => Bool(a < b),
        (BinOp::Le, Int(a), Int(b)) => Bool(a <= b),
        (BinOp::Gt, Int(a), Int(b)) => Bool(a > b),
        (BinOp::Ge, Int(a), Int(b)) => Bool(a >= b),
        (BinOp::Add, Int(a), Int(b)) => Int(a.checked_add(b).ok_or(EvalError::Overflow)?),
        (BinOp::Sub, Int(a), Int(b)) => Int(a.checked_sub(b).ok_or(EvalError::Overflow)?),
        (BinOp::Mul, Int(a), Int(b)) => Int(a.checked_mul(b).ok_or(EvalError::Overflow)?),
        (BinOp::Div, Int(_), Int(0)) | (BinOp::Mod, Int(_), Int(0)) => {
            return Err(EvalError::DivisionByZero);
        }
        (BinOp::Div, Int(a), Int(b)) => Int(a.checked_div(b).ok_or(EvalError::Overflow)?),
        (BinOp::Mod, Int(a), Int(b)) => Int(a.checked_rem(b).ok_or(EvalError::Overflow)?),
        _ => return Err(EvalError::Type),
    })
}

/// Evaluates an expression whose names are all facts.
pub fn eval<'a>(
    e: &'a Expr,
    fact: &mut dyn FnMut(Fact) -> Result<Value<'a>, EvalError>,
) -> Result<Value<'a>, EvalError> {
    match &e.kind {
        ExprKind::Int(i) => Ok(Value::Int(*i)),
        ExprKind::Bool(b) => Ok(Value::Bool(*b)),
        ExprKind::Str(s, _) => Ok(Value::Str(s)),
        ExprKind::Name(n) => match Fact::lookup(n) {
            Some(f) => fact(f),
            None => Err(EvalError::Type),
        },
        ExprKind::Unary(UnOp::Not, inner) => match eval(inner, fact)? {
            Value::Bool(b) => Ok(Value::Bool(!b)),
            _ => Err(EvalError::Type),
        },
        ExprKind::Unary(UnOp::Neg, inner) => match eval(inner, fact)? {
            Value::Int(i) => Ok(Value::Int(i.checked_neg().ok_or(EvalError::Overflow)?)),
            _ => Err(EvalError::Type),
        },
        ExprKind::Binary(BinOp::And, l, r) => match eval(l, fact)? {
            Value::Bool(false) => Ok(Value::Bool(false)),
            Value::Bool(true) => match eval(r, fact)? {
                v @ Value::Bool(_) => Ok(v),
                _ => Err(EvalError::Type),
            },
            _ => Err(EvalError::Type),
        },
        ExprKind::Binary(BinOp::Or, l, r) => match eval(l, fact)? {
            Value::Bool(true) => Ok(Value::Bool(true)),
            Value::Bool(false) => match eval(r, fact)? {
                v @ Value::Bool(_) => Ok(v),
                _ => Err(EvalError::Type),
            },
            _ => Err(EvalError::Type),
        },
        ExprKind::Binary(op, l, r) => {
            let l = eval(l, fact)?;
            let r = eval(r, fact)?;
            binary(*op, l, r)
        }
    }
}
