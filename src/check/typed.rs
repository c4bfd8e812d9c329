//! The checker's one intermediate form: every expression of a rule, a plan step or a `let`,
//! after its `let`s are inlined, annotated once, bottom-up, with what the later stages ask
//! of it: the kind of value, the facts it reads, whether it can fail, whether it reads an
//! expensive fact, and the evaluation stack it needs. The compiler reads these annotations
//! (and nothing else of the syntax tree), the lints read `can_fail` from them, and the stack
//! limit the checker reports is the depth the compiler will use: computed once, in
//! [`Typed::of`], so no two stages can disagree about an expression.

use crate::syntax::ast::{BinOp, Expr, ExprKind, Span, UnOp};
use crate::vocab::{Cost, Fact, Type};

/// The kind of value an expression has, as the compiled form stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    Int,
    Bool,
    /// A name or enum fact, or a string literal: compared as text, never computed with.
    Text,
}

/// What is known of one expression (a node and everything under it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    pub kind: ValueKind,
    /// The facts read, as a bit set of slots.
    pub reads: u64,
    /// Whether evaluating it can fail: integer arithmetic (`+ - * / %` and unary `-`) can
    /// overflow or divide by zero; comparisons, logic and values cannot.
    pub can_fail: bool,
    /// Whether it reads an expensive fact (one the controller asks etcd for).
    pub expensive: bool,
    /// The evaluation stack the stack machine needs for it (intermediate values at once).
    pub depth: usize,
}

/// An annotated expression.
#[derive(Clone, Debug, PartialEq)]
pub struct Typed {
    pub kind: TypedKind,
    pub span: Span,
    pub info: Info,
}

/// An expression's shape, with its names resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum TypedKind {
    Int(i64),
    Bool(bool),
    Str(String),
    Fact(Fact),
    /// A name that is no fact of the rules: the checker reported it (or it is a model fact
    /// of an invariant, which `verify` compiles itself). Compiles to an invalid instruction,
    /// which fails closed.
    Unresolved,
    Unary(UnOp, Box<Typed>),
    Binary(BinOp, Box<Typed>, Box<Typed>),
}

/// A message, annotated: text, or an expression whose value is shown.
#[derive(Clone, Debug, PartialEq)]
pub enum TypedPart {
    Text(String),
    Value(Typed),
}

impl Typed {
    /// Annotates an expression (its `let`s already inlined). Parsing bounds the nesting, so
    /// the recursion is bounded too.
    pub fn of(e: &Expr) -> Typed {
        let leaf = |kind: ValueKind, reads: u64, expensive: bool| Info {
            kind,
            reads,
            can_fail: false,
            expensive,
            depth: 1,
        };
        let (kind, info) = match &e.kind {
            ExprKind::Int(i) => (TypedKind::Int(*i), leaf(ValueKind::Int, 0, false)),
            ExprKind::Bool(b) => (TypedKind::Bool(*b), leaf(ValueKind::Bool, 0, false)),
            ExprKind::Str(s, _) => (TypedKind::Str(s.clone()), leaf(ValueKind::Text, 0, false)),
            ExprKind::Name(n) => match Fact::lookup(n) {
                Some(f) => {
                    let info = f.info();
                    let kind = match info.ty {
                        Type::Int => ValueKind::Int,
                        Type::Bool => ValueKind::Bool,
                        Type::Name | Type::Enum(_) => ValueKind::Text,
                    };
                    let bit = 1u64.checked_shl(u32::from(f.slot8())).unwrap_or(0);
                    (
                        TypedKind::Fact(f),
                        leaf(kind, bit, info.cost == Cost::Expensive),
                    )
                }
                None => (TypedKind::Unresolved, leaf(ValueKind::Int, 0, false)),
            },
            ExprKind::Unary(op, inner) => {
                let inner = Typed::of(inner);
                let info = Info {
                    kind: match op {
                        UnOp::Not => ValueKind::Bool,
                        UnOp::Neg => ValueKind::Int,
                    },
                    can_fail: *op == UnOp::Neg || inner.info.can_fail,
                    ..inner.info
                };
                (TypedKind::Unary(*op, Box::new(inner)), info)
            }
            ExprKind::Binary(op, l, r) => {
                let (l, r) = (Typed::of(l), Typed::of(r));
                let arithmetic = matches!(
                    op,
                    BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod
                );
                let text = matches!(op, BinOp::Eq | BinOp::Ne)
                    && (l.info.kind == ValueKind::Text || r.info.kind == ValueKind::Text);
                let depth = match op {
                    BinOp::And | BinOp::Or => l.info.depth.max(r.info.depth),
                    // One instruction compares two texts.
                    _ if text => 1,
                    // A constant on the right is folded into the instruction.
                    _ if matches!(r.kind, TypedKind::Int(_)) => l.info.depth,
                    _ => l.info.depth.max(r.info.depth.saturating_add(1)),
                };
                let info = Info {
                    kind: if arithmetic {
                        ValueKind::Int
                    } else {
                        ValueKind::Bool
                    },
                    reads: l.info.reads | r.info.reads,
                    can_fail: arithmetic || l.info.can_fail || r.info.can_fail,
                    expensive: l.info.expensive || r.info.expensive,
                    depth,
                };
                (TypedKind::Binary(*op, Box::new(l), Box::new(r)), info)
            }
        };
        Typed {
            kind,
            span: e.span,
            info,
        }
    }

    /// `a and b`, annotated from its operands' annotations.
    pub fn conjoin(l: Typed, r: Typed) -> Typed {
        let info = Info {
            kind: ValueKind::Bool,
            reads: l.info.reads | r.info.reads,
            can_fail: l.info.can_fail || r.info.can_fail,
            expensive: l.info.expensive || r.info.expensive,
            depth: l.info.depth.max(r.info.depth),
        };
        Typed {
            span: l.span.to(r.span),
            kind: TypedKind::Binary(BinOp::And, Box::new(l), Box::new(r)),
            info,
        }
    }

    /// `not e`, annotated from `e`'s annotation.
    pub fn negate(e: Typed) -> Typed {
        let info = Info {
            kind: ValueKind::Bool,
            ..e.info
        };
        Typed {
            span: e.span,
            kind: TypedKind::Unary(UnOp::Not, Box::new(e)),
            info,
        }
    }

    /// An int or bool operand that needs no evaluation (a constant or an int/bool fact).
    pub fn is_operand(&self) -> bool {
        match self.kind {
            TypedKind::Int(_) | TypedKind::Bool(_) => true,
            TypedKind::Fact(_) => self.info.kind != ValueKind::Text,
            _ => false,
        }
    }
}

/// Whether evaluating the expression can fail (see [`Info::can_fail`]).
pub fn can_fail(e: &Expr) -> bool {
    Typed::of(e).info.can_fail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::parse_expr;

    fn info(src: &str) -> Info {
        Typed::of(&parse_expr(src).expect("parses")).info
    }

    #[test]
    fn can_fail_counts_negation_and_arithmetic_only() {
        assert!(info("-approved").can_fail);
        assert!(info("not (approved - 1 > 0)").can_fail);
        assert!(!info("not (approved > 0) and count == 3 or deleting").can_fail);
        assert!(!info("kind == \"reset\"").can_fail);
    }

    #[test]
    fn kinds_reads_and_cost() {
        let i = info("kind == \"reset\" and healthy.after < 2");
        assert_eq!(i.kind, ValueKind::Bool);
        assert!(i.expensive);
        let kind = Fact::lookup("kind").expect("a fact");
        let healthy = Fact::lookup("healthy.after").expect("a fact");
        assert_eq!(i.reads, 1 << kind.slot() | 1 << healthy.slot());
        assert_eq!(info("approved / 2 + 1").kind, ValueKind::Int);
        assert_eq!(info("kind").kind, ValueKind::Text);
        assert!(!info("approved > count").expensive);
        // A name that is no fact reads nothing and fails closed when compiled.
        assert_eq!(info("no.such.fact").reads, 0);
    }

    #[test]
    fn depth_is_what_the_stack_machine_needs() {
        assert_eq!(info("approved").depth, 1);
        // A constant on the right is folded into the instruction.
        assert_eq!(info("approved + 1 > 2").depth, 1);
        assert_eq!(info("approved > count").depth, 2);
        assert_eq!(info("approved > count + (approved - count)").depth, 4);
        assert_eq!(info("kind == \"reset\"").depth, 1);
        assert_eq!(info("approved > count or count > approved").depth, 2);
    }
}
