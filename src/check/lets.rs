//! `let` definitions: their types, their use before or without definition, the ones never
//! used, and writing them out into the conditions that use them (within limits).

use super::*;

impl<'a, 'd> FileChecker<'a, 'd> {
    pub(super) fn check_lets(&mut self) {
        let names: Vec<&'a str> = self
            .ast
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Let(l) => Some(l.name.name.as_str()),
                _ => None,
            })
            .collect();
        for n in names {
            self.let_type(n);
        }
    }

    /// The type of a `let`, computed once; cycles are reported at the `let` that closes them.
    pub(super) fn let_type(&mut self, name: &'a str) -> Ty {
        let Some(info) = self.lets.get(name) else {
            return Ty::Error;
        };
        if let Some(t) = &info.ty {
            return t.clone();
        }
        let def = info.def;
        if let Some(pos) = self.visiting.iter().position(|n| *n == name) {
            if self.reported_cycles.insert(name) {
                let mut cycle: Vec<&str> = self.visiting[pos..].to_vec();
                cycle.push(name);
                self.diags.push(
                    Diagnostic::error(
                        Code::CyclicLet,
                        self.file,
                        def.name.span,
                        format!("`{name}` is defined in terms of itself"),
                    )
                    .label(format!("cycle: {}", cycle.join(" -> ")))
                    .help("break the cycle: one of these definitions must use only facts"),
                );
            }
            return Ty::Error;
        }
        if self.visiting.len() >= MAX_LET_DEPTH {
            self.diags.push(
                Diagnostic::error(
                    Code::SyntaxTooComplex,
                    self.file,
                    def.name.span,
                    format!(
                        "definitions refer to each other more than {MAX_LET_DEPTH} levels deep"
                    ),
                )
                .label("too deep")
                .help("flatten the chain of `let`s"),
            );
            return Ty::Error;
        }
        self.visiting.push(name);
        // Lets are typed without an event: fact availability is checked where they are used.
        let ty = self.type_of(&def.expr, None);
        self.visiting.pop();
        if let Some(info) = self.lets.get_mut(name) {
            info.ty = Some(ty.clone());
        }
        ty
    }

    pub(super) fn report_unused_lets(&mut self) {
        let mut unused: Vec<&LetInfo> = self.lets.values().filter(|l| !l.used).collect();
        unused.sort_by_key(|l| l.def.span.start);
        for l in unused {
            self.diags.push(
                Diagnostic::warning(
                    Code::UnusedLet,
                    self.file,
                    l.def.name.span,
                    format!("`{}` is defined but never used", l.def.name.name),
                )
                .label("unused")
                .help("remove it, or use it in a condition or a message"),
            );
        }
    }

    pub(super) fn check_let_availability(&mut self, name: &'a str, span: Span, events: &[Event]) {
        let Some(info) = self.lets.get(name) else {
            return;
        };
        let mut facts = Vec::new();
        let mut seen = HashSet::new();
        let mut names = Vec::new();
        self.collect_names(&info.def.expr, &mut names, &mut HashSet::new());
        if self.in_invariant.get() {
            // An invariant reads the model: a request fact has no value there.
            for n in names {
                if ModelFact::lookup(n).is_none()
                    && let Some(f) = Fact::lookup(n)
                {
                    self.report_request_fact_in_invariant(f, span, Some(name));
                    break;
                }
            }
            return;
        }
        for n in names {
            if Fact::lookup(n).is_none()
                && let Some(mf) = ModelFact::lookup(n)
            {
                self.report_model_fact_in_rule(mf, span, events, Some(name));
                return;
            }
        }
        self.collect_facts(&info.def.expr, &mut facts, &mut seen);
        for f in facts {
            if !self.fact_available(f, span, events, Some(name)) {
                break;
            }
        }
    }

    /// The `let`s these conditions and this message use, directly or through another.
    pub(super) fn lets_of<'e>(
        &self,
        exprs: impl Iterator<Item = &'e Expr>,
        message: Option<&'e Message>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let placeholders = message
            .into_iter()
            .flat_map(|m| &m.parts)
            .filter_map(|p| match p {
                MessagePart::Placeholder(e) => Some(e),
                MessagePart::Text(_) => None,
            });
        for e in exprs.chain(placeholders) {
            self.collect_lets(e, &mut out);
        }
        out
    }

    pub(super) fn collect_lets(&self, e: &Expr, out: &mut Vec<String>) {
        for (n, _) in e.names() {
            if let Some(info) = self.lets.get(n)
                && !out.iter().any(|o| o == n)
            {
                out.push(n.to_string());
                self.collect_lets(&info.def.expr, out);
            }
        }
    }

    /// This file's `let`s that its checked rules and plan steps use, in the order the file
    /// defines them, each with its expression inlined (no larger than the inlined rule that
    /// uses it, which stayed within the limits, and counted in the file's budget).
    pub(super) fn used_lets(&self, program: &Program) -> Vec<CheckedLet> {
        // With an error no table is built; and a rule over the limits kept no inlining (its
        // error is still pending: reported after this).
        if self.diags.iter().any(|d| d.is_error())
            || !self.expansions.borrow().pending.is_empty()
            || self.inline_too_deep.get()
        {
            return Vec::new();
        }
        let rules = program.rules.iter().filter(|r| r.file == self.file);
        let steps = program
            .plans
            .iter()
            .filter(|p| p.file == self.file)
            .flat_map(|p| &p.steps);
        let used: HashSet<&str> = rules
            .flat_map(|r| &r.lets)
            .chain(steps.flat_map(|s| &s.lets))
            .map(String::as_str)
            .collect();
        self.ast
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Let(l) => Some(l),
                _ => None,
            })
            // The definition the file's names resolve to (a second one is an error).
            .filter(|l| {
                used.contains(l.name.name.as_str())
                    && self
                        .lets
                        .get(l.name.name.as_str())
                        .is_some_and(|info| std::ptr::eq(info.def, *l))
            })
            .map(|l| {
                // Written out within the file's budget like every condition: a chain of
                // `let`s each used once costs its length once per link, not unboundedly.
                let (expr, typed) = self.inline_typed(&l.expr);
                CheckedLet {
                    name: l.name.name.clone(),
                    file: self.file,
                    span: l.span,
                    expr_span: l.expr.span,
                    expr,
                    typed,
                }
            })
            .collect()
    }

    /// Replaces every `let` name by its definition (checked acyclic before this runs).
    pub(super) fn inline(&self, e: &Expr) -> Expr {
        self.inline_typed(e).0
    }

    /// [`inline`](Self::inline), and the result annotated ([`Typed`]): once, for the
    /// stack limit checked here and for everything after the checker.
    pub(super) fn inline_typed(&self, e: &Expr) -> (Expr, Typed) {
        // Never copy more than the limits allow (an error is reported instead).
        let inlined = if self.may_inline(e) {
            self.inline_depth(e, 0)
        } else {
            Expr {
                kind: ExprKind::Bool(false),
                span: e.span,
            }
        };
        let typed = Typed::of(&inlined);
        self.check_stack(&inlined, typed.info.depth);
        (inlined, typed)
    }

    pub(super) fn inline_depth(&self, e: &Expr, depth: usize) -> Expr {
        let kind = match &e.kind {
            ExprKind::Name(n) => match self.lets.get(n.as_str()) {
                Some(info) if depth < MAX_LET_DEPTH => {
                    let mut inner = self.inline_depth(&info.def.expr, depth + 1);
                    inner.span = e.span;
                    return inner;
                }
                Some(_) => {
                    self.inline_too_deep.set(true);
                    ExprKind::Bool(false)
                }
                None => ExprKind::Name(n.clone()),
            },
            ExprKind::Unary(op, i) => ExprKind::Unary(*op, Box::new(self.inline_depth(i, depth))),
            ExprKind::Binary(op, l, r) => ExprKind::Binary(
                *op,
                Box::new(self.inline_depth(l, depth)),
                Box::new(self.inline_depth(r, depth)),
            ),
            other => other.clone(),
        };
        Expr { kind, span: e.span }
    }

    pub(super) fn inline_message(&self, m: &Message) -> (Message, Vec<TypedPart>) {
        let mut typed = Vec::with_capacity(m.parts.len());
        let parts = m
            .parts
            .iter()
            .map(|p| match p {
                MessagePart::Text(t) => {
                    typed.push(TypedPart::Text(t.clone()));
                    MessagePart::Text(t.clone())
                }
                MessagePart::Placeholder(e) => {
                    let (e, t) = self.inline_typed(e);
                    typed.push(TypedPart::Value(t));
                    MessagePart::Placeholder(e)
                }
            })
            .collect();
        (
            Message {
                parts,
                span: m.span,
            },
            typed,
        )
    }
}
