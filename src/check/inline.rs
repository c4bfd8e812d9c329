//! Inlining `let`s, within bounds.
//!
//! A rule's conditions are compiled and linted with every `let` written out. A definition
//! used twice by the next one doubles in size (`let a1 = a0 and a0`, `let a2 = a1 and a1`,
//! ...), so the written-out size can grow exponentially with the file. Before anything is
//! copied, the size and depth of each `let` written out are computed once (in one pass per
//! definition, no recursion from one definition into the next), and an expression that
//! would be larger than [`MAX_INLINED`] operands and operators, deeper than
//! [`MAX_DEPTH`](crate::syntax::MAX_DEPTH), or take the file past its budget (linear in its
//! size, see [`budget`]) is an error naming the definition, never a copy.

use super::{FileChecker, MAX_STACK};
use crate::diagnostics::{Code, Diagnostic};
use crate::syntax::MAX_DEPTH;
use crate::syntax::ast::{Expr, ExprKind};
use std::collections::HashMap;

/// The most operands and operators one condition or placeholder may have once its `let`s
/// are written out.
pub const MAX_INLINED: usize = 20_000;

/// The most operands and operators all the written-out conditions of one file may have:
/// linear in the file's length, so memory and time stay linear too.
pub fn budget(text_len: usize) -> usize {
    200_000 + 4 * text_len
}

/// Size and depth of an expression with its `let`s written out (saturating).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub size: usize,
    pub depth: usize,
}

/// What the inliner keeps between calls.
#[derive(Default)]
pub struct Expansions {
    /// Per `let`, its written-out size and depth.
    lets: HashMap<String, Stats>,
    /// Written-out nodes so far in this file.
    used: usize,
    /// Errors found while inlining, reported when the file is done.
    pub pending: Vec<Diagnostic>,
    /// Whether the file's budget ran out (reported once; later uses are refused quietly).
    over_budget: bool,
}

impl<'a> FileChecker<'a, '_> {
    /// The written-out size and depth of `e`, from the `let`s' (computed first).
    pub(super) fn expansion(&self, e: &Expr) -> Stats {
        for n in names_in(e) {
            self.let_expansion(n);
        }
        self.stats_of(e)
    }

    fn stats_of(&self, e: &Expr) -> Stats {
        match &e.kind {
            ExprKind::Name(n) => {
                let known = self.expansions.borrow().lets.get(n).copied();
                known.unwrap_or(Stats { size: 1, depth: 0 })
            }
            ExprKind::Unary(_, i) => {
                let s = self.stats_of(i);
                Stats {
                    size: s.size.saturating_add(1),
                    depth: s.depth.saturating_add(1),
                }
            }
            ExprKind::Binary(_, l, r) => {
                let (l, r) = (self.stats_of(l), self.stats_of(r));
                Stats {
                    size: l.size.saturating_add(r.size).saturating_add(1),
                    depth: l.depth.max(r.depth).saturating_add(1),
                }
            }
            _ => Stats { size: 1, depth: 0 },
        }
    }

    /// Computes the written-out stats of `root` and the `let`s it uses, dependencies first,
    /// with an explicit stack (a chain of definitions does not deepen the call stack).
    fn let_expansion(&self, root: &str) {
        if self.expansions.borrow().lets.contains_key(root) || !self.lets.contains_key(root) {
            return;
        }
        let mut started: HashMap<&str, bool> = HashMap::new();
        let mut stack: Vec<(&str, bool)> = vec![(root, false)];
        while let Some((name, deps_done)) = stack.pop() {
            if self.expansions.borrow().lets.contains_key(name) {
                continue;
            }
            let Some(info) = self.lets.get(name) else {
                continue;
            };
            if deps_done {
                let s = self.stats_of(&info.def.expr);
                self.expansions
                    .borrow_mut()
                    .lets
                    .insert(name.to_string(), s);
                continue;
            }
            if started.insert(name, true).is_some() {
                // A cycle (reported by the type check): count the name as one operand.
                continue;
            }
            stack.push((name, true));
            for d in names_in(&info.def.expr) {
                if self.lets.contains_key(d) && !self.expansions.borrow().lets.contains_key(d) {
                    stack.push((d, false));
                }
            }
        }
    }

    /// Whether `e` may be written out; if not, an error naming the largest definition it
    /// uses is kept for the end of the file.
    pub(super) fn may_inline(&self, e: &Expr) -> bool {
        let s = self.expansion(e);
        let budget = self.inline_budget;
        let used = self.expansions.borrow().used;
        let (problem, limit) = if s.depth > MAX_DEPTH {
            (
                "nests",
                format!("{} operators deep (at most {MAX_DEPTH})", s.depth),
            )
        } else if s.size > MAX_INLINED {
            (
                "expands",
                format!(
                    "to {} operands and operators (at most {MAX_INLINED})",
                    s.size
                ),
            )
        } else if used.saturating_add(s.size) > budget {
            if self.expansions.borrow().over_budget {
                return false;
            }
            self.expansions.borrow_mut().over_budget = true;
            (
                "expands",
                format!(
                    "past the file's budget of {budget} written-out operands and operators (200000, plus 4 per byte of the file); later uses are refused too"
                ),
            )
        } else {
            self.expansions.borrow_mut().used = used + s.size;
            return true;
        };
        // Name the definition that contributes most.
        let biggest = e
            .names()
            .into_iter()
            .filter_map(|(n, span)| {
                let stats = self.expansions.borrow().lets.get(n).copied()?;
                Some((n, span, stats))
            })
            .max_by_key(|(_, _, st)| (st.size, st.depth));
        let d = match biggest {
            Some((name, span, _)) => Diagnostic::error(
                Code::SyntaxTooComplex,
                self.file,
                span,
                format!("`{name}` {problem} {limit} when its definitions are written out"),
            )
            .label("written out here")
            .help(
                "every use of a `let` is a copy of its definition, so a definition that uses another twice doubles in size; use each definition once, or write the condition more directly",
            ),
            None => Diagnostic::error(
                Code::SyntaxTooComplex,
                self.file,
                e.span,
                format!("the expression {problem} {limit}"),
            )
            .label("too complex")
            .help("split it into smaller conditions"),
        };
        self.expansions.borrow_mut().pending.push(d);
        false
    }

    /// After inlining: the compiled form's evaluation stack must suffice.
    pub(super) fn check_stack(&self, e: &Expr, depth: usize) {
        if depth > MAX_STACK {
            self.expansions.borrow_mut().pending.push(
                Diagnostic::error(
                    Code::SyntaxTooComplex,
                    self.file,
                    e.span,
                    format!(
                        "the expression needs more than {MAX_STACK} intermediate values at once"
                    ),
                )
                .label("too deeply nested on the right")
                .help("rewrite `a + (b + (c + ...))` as `a + b + c + ...`, or move parts into `let`s used in separate conditions"),
            );
        }
    }

    /// Reports the errors found while inlining (once the file is checked).
    pub(super) fn report_inline_errors(&mut self) {
        let pending = std::mem::take(&mut self.expansions.borrow_mut().pending);
        self.diags.extend(pending);
    }
}

/// The names an expression reads directly (not through its `let`s), each once.
fn names_in(e: &Expr) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for (n, _) in e.names() {
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}
