//! Types of expressions, and which facts a name means where.

use super::*;

/// The type an expression has while checking; string literals stay literals until they
/// meet what they are compared with.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Ty {
    Known(Type),
    Literal,
    /// Already reported; suppresses follow-on errors.
    Error,
}

impl Ty {
    pub(super) fn describe(&self) -> String {
        match self {
            Ty::Known(t) => t.to_string(),
            Ty::Literal => "string".into(),
            Ty::Error => "error".into(),
        }
    }
}

impl<'a, 'd> FileChecker<'a, 'd> {
    /// Type of an expression used in a rule with these events; `None` = inside a `let`.
    pub(super) fn type_in(&mut self, e: &'a Expr, events: &[Event]) -> Ty {
        self.type_of(e, Some(events))
    }

    pub(super) fn type_of(&mut self, e: &'a Expr, events: Option<&[Event]>) -> Ty {
        match &e.kind {
            ExprKind::Int(_) => Ty::Known(Type::Int),
            ExprKind::Bool(_) => Ty::Known(Type::Bool),
            ExprKind::Str(_, placeholders) => {
                if *placeholders {
                    self.diags.push(
                        Diagnostic::error(
                            Code::PlaceholderOutsideMessage,
                            self.file,
                            e.span,
                            "`{...}` placeholders only work in messages",
                        )
                        .label("inside a condition")
                        .help("compare the values directly, or write `{{` for a literal brace"),
                    );
                    return Ty::Error;
                }
                Ty::Literal
            }
            ExprKind::Name(n) => self.type_of_name(n, e.span, events),
            ExprKind::Unary(op, inner) => {
                let t = self.type_of(inner, events);
                let want = match op {
                    UnOp::Not => Type::Bool,
                    UnOp::Neg => Type::Int,
                };
                if t == Ty::Error {
                    return Ty::Error;
                }
                if t != Ty::Known(want) {
                    let sym = if *op == UnOp::Not { "not" } else { "-" };
                    self.diags.push(
                        Diagnostic::error(
                            Code::TypeMismatch,
                            self.file,
                            inner.span,
                            format!("`{sym}` needs a {want}, this is {}", t.describe()),
                        )
                        .label(t.describe())
                        .help(if *op == UnOp::Not {
                            "`not` negates a condition; compare the value first"
                        } else {
                            "`-` negates an integer"
                        }),
                    );
                    return Ty::Error;
                }
                Ty::Known(want)
            }
            ExprKind::Binary(op, l, r) => {
                let lt = self.type_of(l, events);
                let rt = self.type_of(r, events);
                if lt == Ty::Error || rt == Ty::Error {
                    return Ty::Error;
                }
                self.type_binary(*op, l, r, lt, rt, e.span)
            }
        }
    }

    pub(super) fn type_binary(
        &mut self,
        op: BinOp,
        l: &Expr,
        r: &Expr,
        lt: Ty,
        rt: Ty,
        span: Span,
    ) -> Ty {
        let sym = op.symbol();
        match op {
            BinOp::And | BinOp::Or => {
                for (side, t) in [(l, &lt), (r, &rt)] {
                    if *t != Ty::Known(Type::Bool) {
                        self.diags.push(
                            Diagnostic::error(
                                Code::TypeMismatch,
                                self.file,
                                side.span,
                                format!("`{sym}` joins conditions, this is {}", t.describe()),
                            )
                            .label(t.describe())
                            .help("compare it first, e.g. `workers == 0`"),
                        );
                        return Ty::Error;
                    }
                }
                Ty::Known(Type::Bool)
            }
            BinOp::Lt
            | BinOp::Le
            | BinOp::Gt
            | BinOp::Ge
            | BinOp::Add
            | BinOp::Sub
            | BinOp::Mul
            | BinOp::Div
            | BinOp::Mod => {
                for (side, t) in [(l, &lt), (r, &rt)] {
                    if *t != Ty::Known(Type::Int) {
                        let what = if matches!(op, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge) {
                            "compares integers"
                        } else {
                            "is integer arithmetic"
                        };
                        self.diags.push(
                            Diagnostic::error(
                                Code::TypeMismatch,
                                self.file,
                                side.span,
                                format!("`{sym}` {what}; `{side}` is {}", t.describe()),
                            )
                            .label(t.describe())
                            .help(
                                if let Some(n) = quoted_integer(side) {
                                    format!("drop the quotes: {n} is an integer")
                                } else if t == &Ty::Known(Type::Bool) {
                                    "use `==`, `and`, `or` or `not` with bools".to_string()
                                } else {
                                    "use `==` or `!=` to compare names".to_string()
                                },
                            ),
                        );
                        return Ty::Error;
                    }
                }
                if matches!(
                    op,
                    BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod
                ) {
                    Ty::Known(Type::Int)
                } else {
                    Ty::Known(Type::Bool)
                }
            }
            BinOp::Eq | BinOp::Ne => {
                let textual = |t: &Ty| {
                    matches!(
                        t,
                        Ty::Literal | Ty::Known(Type::Name) | Ty::Known(Type::Enum(_))
                    )
                };
                let compatible = match (&lt, &rt) {
                    (Ty::Known(a), Ty::Known(b)) if a == b => true,
                    (Ty::Known(Type::Enum(a)), Ty::Known(Type::Enum(b))) => a == b,
                    (a, b) => textual(a) && textual(b),
                };
                if !compatible {
                    self.diags.push(
                        Diagnostic::error(
                            Code::TypeMismatch,
                            self.file,
                            span,
                            format!(
                                "`{sym}` compares values of one type; this compares {} with {}",
                                lt.describe(),
                                rt.describe()
                            ),
                        )
                        .label(format!("{} {sym} {}", lt.describe(), rt.describe()))
                        .help(
                            match quoted_integer(l).or_else(|| quoted_integer(r)) {
                                Some(n) => format!("drop the quotes: {n} is an integer"),
                                None => "both sides must be ints, bools, or names".to_string(),
                            },
                        ),
                    );
                    return Ty::Error;
                }
                // A literal compared with an enum must be one of its values.
                for (lit, other) in [(l, &rt), (r, &lt)] {
                    if let (ExprKind::Str(s, _), Ty::Known(Type::Enum(kind))) = (&lit.kind, other)
                        && !kind.values().contains(&s.as_str())
                    {
                        self.report_enum_value(kind.to_owned(), s, lit.span);
                        return Ty::Error;
                    }
                }
                Ty::Known(Type::Bool)
            }
        }
    }

    pub(super) fn report_enum_value(&mut self, kind: EnumKind, value: &str, span: Span) {
        let values = kind.values();
        let mut d = Diagnostic::error(
            Code::UnknownEnumValue,
            self.file,
            span,
            format!("`{value}` is not {}", kind.with_article()),
        )
        .label(format!("not {}", kind.with_article()));
        d = match did_you_mean(value, values.iter().copied()) {
            Some(s) => d.help(format!("did you mean `\"{s}\"`?")),
            None => d.help(format!(
                "{} is one of {}",
                kind.with_article(),
                backticked(values)
            )),
        };
        self.diags.push(d);
    }

    pub(super) fn type_of_name(&mut self, n: &str, span: Span, events: Option<&[Event]>) -> Ty {
        if let Some(key) = self.lets.get_key_value(n).map(|(k, _)| *k) {
            if let Some(info) = self.lets.get_mut(key) {
                info.used = true;
            }
            let ty = self.let_type(key);
            if let Some(events) = events {
                self.check_let_availability(key, span, events);
            }
            return ty;
        }
        if self.in_invariant.get() || Fact::lookup(n).is_none() {
            if let Some(mf) = ModelFact::lookup(n) {
                if let Some(events) = events
                    && !self.in_invariant.get()
                {
                    self.report_model_fact_in_rule(mf, span, events, None);
                    return Ty::Error;
                }
                return Ty::Known(mf.info().ty);
            }
            if self.in_invariant.get()
                && let Some(f) = Fact::lookup(n)
            {
                self.report_request_fact_in_invariant(f, span, None);
                return Ty::Error;
            }
        }
        let Some(fact) = Fact::lookup(n) else {
            if self.ast.broken_lets.iter().any(|b| b == n) {
                // Its `let` has a syntax error, reported already.
                return Ty::Error;
            }
            let mut candidates: Vec<&str> = FACTS.iter().map(|f| f.name).collect();
            candidates.extend(MODEL_FACTS.iter().map(|f| f.name));
            candidates.extend(self.lets.keys().copied());
            let mut d = Diagnostic::error(
                Code::UnknownName,
                self.file,
                span,
                format!("unknown fact or definition `{n}`"),
            )
            .label("not a fact or a `let`");
            d = match did_you_mean(n, candidates) {
                Some(s) => d.help(format!("did you mean `{s}`?")),
                None => d.help("facts are listed in the rule author's guide (docs/rules.md); or define it with `let`"),
            };
            self.diags.push(d);
            return Ty::Error;
        };
        if let Some(events) = events
            && !self.fact_available(fact, span, events, None)
        {
            return Ty::Error;
        }
        Ty::Known(fact.info().ty)
    }

    /// Reports a fact not available for one of the events; `via` names the `let` it came through.
    pub(super) fn fact_available(
        &mut self,
        fact: Fact,
        span: Span,
        events: &[Event],
        via: Option<&str>,
    ) -> bool {
        let missing: Vec<&Event> = events
            .iter()
            .filter(|(v, s, site)| !fact.available(*v, *s, *site))
            .collect();
        let Some((v, s, site)) = missing.first() else {
            return true;
        };
        let via = via.map(|l| format!(" (through `{l}`)")).unwrap_or_default();
        self.diags.push(
            Diagnostic::error(
                Code::FactUnavailable,
                self.file,
                span,
                format!(
                    "the fact `{}` is not available for `{} {}` at the {}{via}",
                    fact.name(),
                    v.name(),
                    s.name(),
                    site.name()
                ),
            )
            .label("not known for this request")
            .help(format!(
                "`{}` is available in {}; narrow the rule's verbs, subject or site",
                fact.name(),
                fact.availability_text()
            )),
        );
        false
    }

    /// Every fact name an expression reads, through its `let`s.
    pub(super) fn collect_names(
        &self,
        e: &'a Expr,
        out: &mut Vec<&'a str>,
        seen: &mut HashSet<&'a str>,
    ) {
        for (n, _) in e.names() {
            if let Some(info) = self.lets.get(n) {
                if seen.insert(n) {
                    self.collect_names(&info.def.expr, out, seen);
                }
            } else if !out.contains(&n) {
                out.push(n);
            }
        }
    }

    pub(super) fn collect_facts(
        &self,
        e: &'a Expr,
        out: &mut Vec<Fact>,
        seen: &mut HashSet<&'a str>,
    ) {
        for (n, _) in e.names() {
            if let Some(info) = self.lets.get(n) {
                if seen.insert(n) {
                    self.collect_facts(&info.def.expr, out, seen);
                }
            } else if let Some(f) = Fact::lookup(n)
                && !out.contains(&f)
            {
                out.push(f);
            }
        }
    }
}
