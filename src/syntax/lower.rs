//! pest's parse tree -> the AST with spans (operators by precedence climbing), with the
//! limits on expression size and depth.

use super::*;

pub(super) static PRATT: LazyLock<PrattParser<Rule>> = LazyLock::new(|| {
    PrattParser::new()
        .op(Op::infix(Rule::op_or, Assoc::Left))
        .op(Op::infix(Rule::op_and, Assoc::Left))
        .op(Op::prefix(Rule::op_not))
        .op(Op::infix(Rule::op_eq, Assoc::Left)
            | Op::infix(Rule::op_ne, Assoc::Left)
            | Op::infix(Rule::op_lt, Assoc::Left)
            | Op::infix(Rule::op_le, Assoc::Left)
            | Op::infix(Rule::op_gt, Assoc::Left)
            | Op::infix(Rule::op_ge, Assoc::Left))
        .op(Op::infix(Rule::op_add, Assoc::Left) | Op::infix(Rule::op_sub, Assoc::Left))
        .op(Op::infix(Rule::op_mul, Assoc::Left)
            | Op::infix(Rule::op_div, Assoc::Left)
            | Op::infix(Rule::op_mod, Assoc::Left))
        .op(Op::prefix(Rule::op_neg))
});

pub(super) struct Lower {
    pub(super) file: usize,
    pub(super) errors: Vec<Diagnostic>,
}

pub(super) fn span_of(p: &Pair<'_, Rule>) -> Span {
    let s = p.as_span();
    Span::new(s.start(), s.end())
}

/// The span of a statement without the whitespace and comments pest keeps after its last
/// token (a statement ends where its last part ends).
pub(super) fn statement_span(p: &Pair<'_, Rule>) -> Span {
    Span::new(p.as_span().start(), last_token_end(p))
}

/// Where the last token inside a pair ends (pest spans can include trailing trivia).
pub(super) fn last_token_end(p: &Pair<'_, Rule>) -> usize {
    // Children come in source order: the last one ends last.
    match p.clone().into_inner().next_back() {
        Some(last) if p.as_rule() != Rule::string => last_token_end(&last),
        _ => p.as_span().end(),
    }
}

pub(super) fn ident(p: Pair<'_, Rule>) -> Ident {
    Ident {
        span: span_of(&p),
        name: p.as_str().to_string(),
    }
}

impl Lower {
    pub(super) fn file(&mut self, mut pairs: Pairs<'_, Rule>) -> File {
        let mut items = Vec::new();
        let Some(file) = pairs.next() else {
            return File {
                items,
                broken_lets: Vec::new(),
            };
        };
        for p in file.into_inner() {
            match p.as_rule() {
                Rule::let_def => items.push(Item::Let(self.let_def(p))),
                Rule::rule_def => items.push(Item::Rule(Box::new(self.rule_def(p)))),
                Rule::allow_def => items.push(Item::Allow(self.allow_def(p))),
                Rule::plan_def => items.push(Item::Plan(self.plan_def(p))),
                Rule::invariant_def => items.push(Item::Invariant(Box::new(self.invariant_def(p)))),
                _ => {}
            }
        }
        File {
            items,
            broken_lets: Vec::new(),
        }
    }

    pub(super) fn let_def(&mut self, p: Pair<'_, Rule>) -> LetDef {
        let span = statement_span(&p);
        let mut name = None;
        let mut expr = None;
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::name => name = Some(ident(c)),
                Rule::expr => expr = Some(self.expr(c)),
                _ => {}
            }
        }
        LetDef {
            name: name.unwrap_or_else(|| Ident {
                name: String::new(),
                span,
            }),
            expr: expr.unwrap_or(Expr {
                kind: ExprKind::Bool(false),
                span,
            }),
            span,
        }
    }

    pub(super) fn rule_def(&mut self, p: Pair<'_, Rule>) -> RuleDef {
        let span = statement_span(&p);
        let empty = Ident {
            name: String::new(),
            span,
        };
        let mut rule = RuleDef {
            name: empty.clone(),
            audit: false,
            verdict: empty.clone(),
            verbs: Vec::new(),
            subject: empty,
            site: None,
            when: None,
            unless: None,
            reason: None,
            say: None,
            span,
        };
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::rule_name => rule.name = ident(c),
                Rule::kw_audit => rule.audit = true,
                Rule::verdict => rule.verdict = ident(c),
                Rule::verb_list => rule.verbs = verb_list(c),
                Rule::subject => rule.subject = ident(c),
                Rule::site => rule.site = site(c),
                Rule::when_clause => rule.when = self.clause_expr(c),
                Rule::unless_clause => rule.unless = self.clause_expr(c),
                Rule::reason_clause => {
                    rule.reason = c
                        .into_inner()
                        .find(|x| x.as_rule() == Rule::action_word)
                        .map(ident)
                }
                Rule::say_clause => rule.say = Some(self.say(c)),
                _ => {}
            }
        }
        rule
    }

    pub(super) fn invariant_def(&mut self, p: Pair<'_, Rule>) -> InvariantDef {
        let span = statement_span(&p);
        let mut inv = InvariantDef {
            name: Ident {
                name: String::new(),
                span,
            },
            sequential: false,
            when: None,
            unless: None,
            ensure: None,
            say: None,
            span,
        };
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::rule_name => inv.name = ident(c),
                Rule::kw_sequential => inv.sequential = true,
                Rule::when_clause => inv.when = self.clause_expr(c),
                Rule::unless_clause => inv.unless = self.clause_expr(c),
                Rule::ensure_clause => inv.ensure = self.clause_expr(c),
                Rule::say_clause => inv.say = Some(self.say(c)),
                _ => {}
            }
        }
        inv
    }

    pub(super) fn allow_def(&mut self, p: Pair<'_, Rule>) -> AllowDef {
        let span = statement_span(&p);
        let mut allow = AllowDef {
            verbs: Vec::new(),
            subject: Ident {
                name: String::new(),
                span,
            },
            site: None,
            span,
        };
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::verb_list => allow.verbs = verb_list(c),
                Rule::subject => allow.subject = ident(c),
                Rule::site => allow.site = site(c),
                _ => {}
            }
        }
        allow
    }

    pub(super) fn plan_def(&mut self, p: Pair<'_, Rule>) -> PlanDef {
        let span = statement_span(&p);
        let empty = Ident {
            name: String::new(),
            span,
        };
        let mut plan = PlanDef {
            verb: empty.clone(),
            subject: empty,
            kind: None,
            steps: Vec::new(),
            span,
        };
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::verb => plan.verb = ident(c),
                Rule::subject => plan.subject = ident(c),
                Rule::plan_kind => {
                    let quoted = ident(c);
                    plan.kind = Some(Ident {
                        name: quoted.name.trim_matches('"').to_string(),
                        span: quoted.span,
                    });
                }
                Rule::step => plan.steps.push(self.step(c)),
                _ => {}
            }
        }
        plan
    }

    pub(super) fn step(&mut self, p: Pair<'_, Rule>) -> Step {
        let mut step = Step {
            words: Vec::new(),
            within: None,
            when: None,
            unless: None,
            say: None,
            span: statement_span(&p),
        };
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::action_word => step.words.push(ident(c)),
                Rule::within_clause => {
                    let span = span_of(&c);
                    step.within = c
                        .into_inner()
                        .find(|d| d.as_rule() == Rule::duration)
                        .map(|d| Within { span, ..within(&d) })
                }
                Rule::when_clause => step.when = self.clause_expr(c),
                Rule::unless_clause => step.unless = self.clause_expr(c),
                Rule::say_clause => step.say = Some(self.say(c)),
                _ => {}
            }
        }
        step
    }

    pub(super) fn clause_expr(&mut self, p: Pair<'_, Rule>) -> Option<Expr> {
        p.into_inner()
            .find(|c| c.as_rule() == Rule::expr)
            .map(|e| self.expr(e))
    }

    pub(super) fn say(&mut self, p: Pair<'_, Rule>) -> Message {
        let span = span_of(&p);
        let mut parts = Vec::new();
        let mut text_span = None::<Span>;
        for s in p.into_inner().filter(|c| c.as_rule() == Rule::string) {
            let sp = span_of(&s);
            text_span = Some(text_span.map_or(sp, |t| t.to(sp)));
            self.string_parts(s, &mut parts);
        }
        Message {
            parts,
            span: text_span.unwrap_or(span),
        }
    }

    /// Appends the parts of one string literal, merging adjacent text.
    pub(super) fn string_parts(&mut self, p: Pair<'_, Rule>, parts: &mut Vec<MessagePart>) {
        for c in p.into_inner() {
            let text = match c.as_rule() {
                Rule::str_text => c.as_str().to_string(),
                Rule::str_escape => match c.as_str() {
                    "\\\"" => "\"".into(),
                    "\\\\" => "\\".into(),
                    "\\n" => "\n".into(),
                    "\\t" => "\t".into(),
                    "{{" => "{".into(),
                    _ => "}".into(),
                },
                Rule::placeholder => {
                    if let Some(e) = c.into_inner().find(|x| x.as_rule() == Rule::expr) {
                        let e = self.expr(e);
                        parts.push(MessagePart::Placeholder(e));
                    }
                    continue;
                }
                _ => continue,
            };
            match parts.last_mut() {
                Some(MessagePart::Text(t)) => t.push_str(&text),
                _ => parts.push(MessagePart::Text(text)),
            }
        }
    }

    pub(super) fn expr(&mut self, p: Pair<'_, Rule>) -> Expr {
        let (e, depth) = self.expr_depth(p);
        if depth > MAX_DEPTH {
            self.errors.push(
                Diagnostic::error(
                    Code::SyntaxTooComplex,
                    self.file,
                    e.span,
                    format!("the expression nests more than {MAX_DEPTH} operators deep"),
                )
                .label("too deep")
                .help("split it into `let` definitions, each a few levels deep"),
            );
        }
        e
    }

    /// An expression and its depth (see [`MAX_DEPTH`]). A subtree deeper than that is
    /// replaced by `false` as it is built, so no deeper tree ever exists; the caller reports.
    pub(super) fn expr_depth(&mut self, p: Pair<'_, Rule>) -> (Expr, usize) {
        if p.clone().into_inner().count() > MAX_EXPRESSION_PARTS {
            let span = span_of(&p);
            self.errors.push(
                Diagnostic::error(
                    Code::SyntaxTooComplex,
                    self.file,
                    span,
                    format!("the expression has more than {MAX_EXPRESSION_PARTS} parts"),
                )
                .label("too long")
                .help("split the condition into `let` definitions"),
            );
            return (
                Expr {
                    kind: ExprKind::Bool(false),
                    span,
                },
                1,
            );
        }
        let errors = std::cell::RefCell::new(Vec::new());
        let file = self.file;
        // A node deeper than the limit stands for its subtree, which is dropped here.
        let node = |kind: ExprKind, span: Span, depth: usize| {
            if depth > MAX_DEPTH {
                (
                    Expr {
                        kind: ExprKind::Bool(false),
                        span,
                    },
                    depth,
                )
            } else {
                (Expr { kind, span }, depth)
            }
        };
        let out = PRATT
            .map_primary(|primary| self_primary(file, &errors, primary))
            .map_prefix(|op, (rhs, d): (Expr, usize)| {
                let span = span_of(&op).to(rhs.span);
                let op = if op.as_rule() == Rule::op_not {
                    UnOp::Not
                } else {
                    UnOp::Neg
                };
                node(ExprKind::Unary(op, Box::new(rhs)), span, d + 1)
            })
            .map_infix(|(lhs, ld): (Expr, usize), op, (rhs, rd): (Expr, usize)| {
                let span = lhs.span.to(rhs.span);
                let op = match op.as_rule() {
                    Rule::op_or => BinOp::Or,
                    Rule::op_and => BinOp::And,
                    Rule::op_eq => BinOp::Eq,
                    Rule::op_ne => BinOp::Ne,
                    Rule::op_lt => BinOp::Lt,
                    Rule::op_le => BinOp::Le,
                    Rule::op_gt => BinOp::Gt,
                    Rule::op_ge => BinOp::Ge,
                    Rule::op_add => BinOp::Add,
                    Rule::op_sub => BinOp::Sub,
                    Rule::op_mul => BinOp::Mul,
                    Rule::op_div => BinOp::Div,
                    _ => BinOp::Mod,
                };
                node(
                    ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
                    span,
                    ld.max(rd) + 1,
                )
            })
            .parse(p.into_inner());
        self.errors.extend(errors.into_inner());
        out
    }
}

pub(super) fn self_primary(
    file: usize,
    errors: &std::cell::RefCell<Vec<Diagnostic>>,
    p: Pair<'_, Rule>,
) -> (Expr, usize) {
    let span = span_of(&p);
    let kind = match p.as_rule() {
        Rule::int => match p.as_str().parse::<i64>() {
            Ok(i) => ExprKind::Int(i),
            Err(_) => {
                errors.borrow_mut().push(
                    Diagnostic::error(
                        Code::SyntaxIntTooLarge,
                        file,
                        span,
                        format!("integer `{}` is too large", p.as_str()),
                    )
                    .label("does not fit in 64 bits")
                    .help("integers range from -9223372036854775808 to 9223372036854775807"),
                );
                ExprKind::Int(0)
            }
        },
        Rule::kw_true => ExprKind::Bool(true),
        Rule::kw_false => ExprKind::Bool(false),
        Rule::name => ExprKind::Name(p.as_str().to_string()),
        Rule::string => {
            let mut text = String::new();
            let mut has_placeholder = false;
            for c in p.into_inner() {
                match c.as_rule() {
                    Rule::str_text => text.push_str(c.as_str()),
                    Rule::str_escape => text.push_str(match c.as_str() {
                        "\\\"" => "\"",
                        "\\\\" => "\\",
                        "\\n" => "\n",
                        "\\t" => "\t",
                        "{{" => "{",
                        _ => "}",
                    }),
                    Rule::placeholder => has_placeholder = true,
                    _ => {}
                }
            }
            ExprKind::Str(text, has_placeholder)
        }
        Rule::paren => {
            let inner = p.into_inner().find(|c| c.as_rule() == Rule::expr);
            match inner {
                Some(e) => {
                    let mut l = Lower {
                        file,
                        errors: Vec::new(),
                    };
                    let (mut e, depth) = l.expr_depth(e);
                    errors.borrow_mut().extend(l.errors);
                    e.span = span;
                    return (e, depth);
                }
                None => ExprKind::Bool(false),
            }
        }
        _ => ExprKind::Bool(false),
    };
    (Expr { kind, span }, 0)
}

pub(super) fn verb_list(p: Pair<'_, Rule>) -> Vec<Ident> {
    p.into_inner()
        .filter(|c| c.as_rule() == Rule::verb)
        .map(ident)
        .collect()
}

pub(super) fn site(p: Pair<'_, Rule>) -> Option<Ident> {
    p.into_inner()
        .find(|c| c.as_rule() == Rule::site_name)
        .map(ident)
}

/// A `duration` token (`90s`, `10m`, `1h`) in seconds; `None` when it does not fit.
fn within(d: &Pair<'_, Rule>) -> Within {
    let text = d.as_str();
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    let scale: u64 = match unit {
        "h" => 3600,
        "m" => 60,
        _ => 1,
    };
    Within {
        secs: digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale)),
        span: span_of(d),
    }
}
