//! Text -> AST. pest's types stay inside this module: one `fn` per grammar rule turns the
//! parse tree into the plain AST of [`ast`], and syntax errors become [`Diagnostic`]s that
//! say what was expected in words.

pub mod ast;
pub mod depth;
pub mod fmt;

use crate::diagnostics::{Code, Diagnostic};
use ast::*;
use pest::Parser;
use pest::iterators::{Pair, Pairs};
use pest::pratt_parser::{Assoc, Op, PrattParser};
use std::sync::LazyLock;

#[derive(pest_derive::Parser)]
#[grammar = "../grammar/rules.pest"]
struct RulesParser;

/// Parses one rule file. On a syntax error the file yields no AST and one diagnostic (pest
/// stops at the first syntax error); lowering problems (an integer too large) are collected.
pub fn parse(file_id: usize, text: &str) -> Result<File, Vec<Diagnostic>> {
    let (file, errors) = parse_recovering(file_id, text);
    if errors.is_empty() {
        Ok(file)
    } else {
        Err(errors)
    }
}

/// The most syntax errors reported for one file.
const MAX_SYNTAX_ERRORS: usize = 50;

/// Parses one rule file, reporting every syntax error rather than the first: a statement
/// with an error is reported, then blanked out (same length, newlines kept, so every span
/// stays true), and the file parsed again. The AST holds the statements that parsed; the
/// checker can still find their own errors.
pub fn parse_recovering(file_id: usize, text: &str) -> (File, Vec<Diagnostic>) {
    let empty = || File {
        items: Vec::new(),
        broken_lets: Vec::new(),
    };
    if let Some(deep) = depth::too_deep(text) {
        let d = Diagnostic::error(
            Code::SyntaxTooComplex,
            file_id,
            Span::new(deep.at, deep.at + deep.len),
            format!("the expression nests deeper than {MAX_NESTING} levels"),
        )
        .label(format!("level {}", MAX_NESTING + 1))
        .help("parentheses, `{placeholders}`, `not` and unary `-` each nest one level; split the condition into `let` definitions");
        return (empty(), vec![d]);
    }
    let mut errors = Vec::new();
    let mut broken_lets = Vec::new();
    let mut blanked: Option<String> = None;
    loop {
        let current = blanked.as_deref().unwrap_or(text);
        match RulesParser::parse(Rule::file, current) {
            Ok(pairs) => {
                let mut lower = Lower {
                    file: file_id,
                    errors: Vec::new(),
                };
                let mut file = lower.file(pairs);
                file.broken_lets = broken_lets;
                errors.extend(lower.errors);
                return (file, errors);
            }
            Err(e) => {
                let at = match e.location {
                    pest::error::InputLocation::Pos(p) => p,
                    pest::error::InputLocation::Span((p, _)) => p,
                };
                errors.push(syntax_error(file_id, current, e));
                let (start, end) = statement_around(current, at);
                if errors.len() >= MAX_SYNTAX_ERRORS || start >= end {
                    return (empty(), errors);
                }
                if let Some(name) = let_name(&current[start..end]) {
                    broken_lets.push(name);
                }
                let mut bytes = current.as_bytes().to_vec();
                for b in &mut bytes[start..end] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                // Whole characters were replaced by ASCII spaces: still UTF-8.
                match String::from_utf8(bytes) {
                    Ok(s) => blanked = Some(s),
                    Err(_) => return (empty(), errors),
                }
            }
        }
    }
}

/// Where statements start: lines whose first word is `let`, `rule`, `allow` or `plan`.
fn statement_starts(text: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut line = 0;
    for l in text.split_inclusive('\n') {
        let indent = l.len() - l.trim_start().len();
        let word: String = l[indent..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect();
        if matches!(
            word.as_str(),
            "let" | "rule" | "allow" | "plan" | "invariant"
        ) {
            starts.push(line + indent);
        }
        line += l.len();
    }
    starts
}

/// The statement holding a syntax error at `at`: from the statement start before it to
/// the next one. An error found at a statement's first word (the one before it ended too
/// soon) belongs to the statement before.
fn statement_around(text: &str, at: usize) -> (usize, usize) {
    let starts = statement_starts(text);
    if starts.contains(&at) {
        let start = starts.iter().rev().find(|&&s| s < at).copied().unwrap_or(0);
        return (start, at);
    }
    let start = starts
        .iter()
        .rev()
        .find(|&&s| s <= at)
        .copied()
        .unwrap_or(0);
    let end = starts
        .iter()
        .find(|&&s| s > at)
        .copied()
        .unwrap_or(text.len());
    (start, end)
}

/// The name a broken `let` statement defines, when its first words say it.
fn let_name(statement: &str) -> Option<String> {
    let rest = statement.trim_start().strip_prefix("let")?;
    let name: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    (!name.is_empty() && rest.starts_with(char::is_whitespace)).then_some(name)
}

/// Parses a standalone expression (used by tests and by `--set`-style tools).
pub fn parse_expr(text: &str) -> Result<Expr, Vec<Diagnostic>> {
    // An expression is parsed as the body of a `let`, so spans line up with `text` after
    // the prefix is subtracted.
    const PREFIX: &str = "let x = ";
    let whole = format!("{PREFIX}{text}");
    let file = parse(0, &whole).map_err(|ds| {
        ds.into_iter()
            .map(|mut d| {
                d.span = shift(d.span, PREFIX.len());
                d
            })
            .collect::<Vec<_>>()
    })?;
    match file.items.into_iter().next() {
        Some(Item::Let(l)) => Ok(shift_expr(l.expr, PREFIX.len())),
        _ => Err(vec![Diagnostic::error(
            Code::SyntaxExpected,
            0,
            Span::default(),
            "expected an expression",
        )]),
    }
}

fn shift(s: Span, by: usize) -> Span {
    let by = u32::try_from(by).unwrap_or(0);
    Span {
        start: s.start.saturating_sub(by),
        end: s.end.saturating_sub(by),
    }
}

fn shift_expr(mut e: Expr, by: usize) -> Expr {
    e.span = shift(e.span, by);
    e.kind = match e.kind {
        ExprKind::Unary(op, inner) => ExprKind::Unary(op, Box::new(shift_expr(*inner, by))),
        ExprKind::Binary(op, l, r) => ExprKind::Binary(
            op,
            Box::new(shift_expr(*l, by)),
            Box::new(shift_expr(*r, by)),
        ),
        other => other,
    };
    e
}

pub use depth::MAX_NESTING;
/// The most operands and operators one expression may have.
pub const MAX_EXPRESSION_PARTS: usize = 1000;
/// The deepest expression tree, counted in operators from the root to the deepest operand
/// (`a + b * c` is 2 deep), before and after `let`s are inlined. Every later stage (checker,
/// lints, compiler, printing) walks expressions recursively: this bounds their stack.
pub const MAX_DEPTH: usize = 256;

static PRATT: LazyLock<PrattParser<Rule>> = LazyLock::new(|| {
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

struct Lower {
    file: usize,
    errors: Vec<Diagnostic>,
}

fn span_of(p: &Pair<'_, Rule>) -> Span {
    let s = p.as_span();
    Span::new(s.start(), s.end())
}

/// The span of a statement without the whitespace and comments pest keeps after its last
/// token (a statement ends where its last part ends).
fn statement_span(p: &Pair<'_, Rule>) -> Span {
    Span::new(p.as_span().start(), last_token_end(p))
}

/// Where the last token inside a pair ends (pest spans can include trailing trivia).
fn last_token_end(p: &Pair<'_, Rule>) -> usize {
    // Children come in source order: the last one ends last.
    match p.clone().into_inner().next_back() {
        Some(last) if p.as_rule() != Rule::string => last_token_end(&last),
        _ => p.as_span().end(),
    }
}

fn ident(p: Pair<'_, Rule>) -> Ident {
    Ident {
        span: span_of(&p),
        name: p.as_str().to_string(),
    }
}

impl Lower {
    fn file(&mut self, mut pairs: Pairs<'_, Rule>) -> File {
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

    fn let_def(&mut self, p: Pair<'_, Rule>) -> LetDef {
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

    fn rule_def(&mut self, p: Pair<'_, Rule>) -> RuleDef {
        let span = statement_span(&p);
        let empty = Ident {
            name: String::new(),
            span,
        };
        let mut rule = RuleDef {
            name: empty.clone(),
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

    fn invariant_def(&mut self, p: Pair<'_, Rule>) -> InvariantDef {
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

    fn allow_def(&mut self, p: Pair<'_, Rule>) -> AllowDef {
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

    fn plan_def(&mut self, p: Pair<'_, Rule>) -> PlanDef {
        let span = statement_span(&p);
        let empty = Ident {
            name: String::new(),
            span,
        };
        let mut plan = PlanDef {
            verb: empty.clone(),
            subject: empty,
            steps: Vec::new(),
            span,
        };
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::verb => plan.verb = ident(c),
                Rule::subject => plan.subject = ident(c),
                Rule::step => plan.steps.push(self.step(c)),
                _ => {}
            }
        }
        plan
    }

    fn step(&mut self, p: Pair<'_, Rule>) -> Step {
        let mut step = Step {
            words: Vec::new(),
            when: None,
            unless: None,
            say: None,
            span: statement_span(&p),
        };
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::action_word => step.words.push(ident(c)),
                Rule::when_clause => step.when = self.clause_expr(c),
                Rule::unless_clause => step.unless = self.clause_expr(c),
                Rule::say_clause => step.say = Some(self.say(c)),
                _ => {}
            }
        }
        step
    }

    fn clause_expr(&mut self, p: Pair<'_, Rule>) -> Option<Expr> {
        p.into_inner()
            .find(|c| c.as_rule() == Rule::expr)
            .map(|e| self.expr(e))
    }

    fn say(&mut self, p: Pair<'_, Rule>) -> Message {
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
    fn string_parts(&mut self, p: Pair<'_, Rule>, parts: &mut Vec<MessagePart>) {
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

    fn expr(&mut self, p: Pair<'_, Rule>) -> Expr {
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
    fn expr_depth(&mut self, p: Pair<'_, Rule>) -> (Expr, usize) {
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

fn self_primary(
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

fn verb_list(p: Pair<'_, Rule>) -> Vec<Ident> {
    p.into_inner()
        .filter(|c| c.as_rule() == Rule::verb)
        .map(ident)
        .collect()
}

fn site(p: Pair<'_, Rule>) -> Option<Ident> {
    p.into_inner()
        .find(|c| c.as_rule() == Rule::site_name)
        .map(ident)
}

/// What a grammar rule is called in an error message.
fn describe(rule: &Rule) -> String {
    let s: &str = match rule {
        Rule::EOI => "end of file",
        Rule::file
        | Rule::let_def
        | Rule::rule_def
        | Rule::allow_def
        | Rule::plan_def
        | Rule::invariant_def => "`let`, `rule`, `allow`, `plan` or `invariant`",
        Rule::ensure_clause | Rule::kw_ensure => "`ensure`",
        Rule::kw_invariant => "`invariant`",
        Rule::kw_sequential => "`sequential`",
        Rule::step => "a step (`do ...`)",
        Rule::verdict => "a verdict (`refuse`, `hold` or `warn`)",
        Rule::verb_list | Rule::verb => "a verb",
        Rule::subject => "a subject",
        Rule::site => "`at`",
        Rule::site_name => "a site (`webhook` or `controller`)",
        Rule::when_clause => "`when`",
        Rule::unless_clause => "`unless`",
        Rule::reason_clause => "`reason`",
        Rule::say_clause => "`say`",
        Rule::action_word => "a word",
        Rule::rule_name => "a rule name",
        Rule::expr | Rule::paren => "an expression",
        Rule::int => "an integer",
        Rule::name => "a name",
        Rule::string => "a string",
        Rule::str_text | Rule::str_escape | Rule::placeholder => "text",
        Rule::op_or => "`or`",
        Rule::op_and => "`and`",
        Rule::op_not => "`not`",
        Rule::op_neg | Rule::op_sub => "`-`",
        Rule::op_eq => "`==`",
        Rule::op_ne => "`!=`",
        Rule::op_le => "`<=`",
        Rule::op_ge => "`>=`",
        Rule::op_lt => "`<`",
        Rule::op_gt => "`>`",
        Rule::op_add => "`+`",
        Rule::op_mul => "`*`",
        Rule::op_div => "`/`",
        Rule::op_mod => "`%`",
        Rule::equals => "`=`",
        Rule::comma => "`,`",
        Rule::open_paren => "`(`",
        Rule::close_paren => "`)`",
        Rule::open_brace => "`{`",
        Rule::close_brace => "`}`",
        Rule::quote => "`\"`",
        Rule::kw_let => "`let`",
        Rule::kw_rule => "`rule`",
        Rule::kw_allow => "`allow`",
        Rule::kw_plan => "`plan`",
        Rule::kw_do => "`do`",
        Rule::kw_refuse => "`refuse`",
        Rule::kw_hold => "`hold`",
        Rule::kw_warn => "`warn`",
        Rule::kw_at => "`at`",
        Rule::kw_when => "`when`",
        Rule::kw_unless => "`unless`",
        Rule::kw_reason => "`reason`",
        Rule::kw_say => "`say`",
        Rule::kw_true => "`true`",
        Rule::kw_false => "`false`",
        Rule::keyword => "a keyword",
        Rule::WHITESPACE => "whitespace",
        Rule::item => "`let`, `rule`, `allow` or `plan`",
        Rule::word => "a word",
        Rule::prefix | Rule::primary => "an expression",
        Rule::infix => "an operator",
        Rule::ident_char => "a letter or digit",
    };
    s.to_string()
}

fn join_alternatives(items: &[String]) -> String {
    let mut items: Vec<&String> = items.iter().collect();
    items.sort();
    items.dedup();
    match items.len() {
        0 => String::new(),
        1 => items[0].clone(),
        n => {
            let head: Vec<&str> = items[..n - 1].iter().map(|s| s.as_str()).collect();
            format!("{} or {}", head.join(", "), items[n - 1])
        }
    }
}

fn syntax_error(file: usize, text: &str, e: pest::error::Error<Rule>) -> Diagnostic {
    use pest::error::{ErrorVariant, InputLocation};
    let (start, end) = match e.location {
        InputLocation::Pos(p) => (p, p),
        InputLocation::Span((s, e)) => (s, e),
    };
    // Point at the offending token (up to the next whitespace), or at the end of input.
    let rest = text.get(start..).unwrap_or("");
    let token_len = rest
        .char_indices()
        .find(|(_, c)| c.is_whitespace())
        .map_or(rest.len(), |(i, _)| i);
    let end = end.max(start + token_len);
    let found = if rest.is_empty() {
        "the end of the file".to_string()
    } else if token_len == 0 {
        "the end of the line".to_string()
    } else {
        format!("`{}`", &rest[..token_len.min(rest.len())])
    };
    let span = Span::new(start, end);
    match e.variant {
        ErrorVariant::ParsingError {
            positives,
            negatives,
        } => {
            let in_string = positives.contains(&Rule::quote)
                && (rest.is_empty() || rest.starts_with('\n') || rest.starts_with('\r'))
                && inside_string(text, start);
            if in_string {
                return Diagnostic::error(
                    Code::SyntaxExpected,
                    file,
                    span,
                    "unterminated string",
                )
                .label("the string is still open here")
                .help("close it with `\"` before the end of the line; split a long message into adjacent strings: say \"...\" \"...\"");
            }
            let operators = positives.iter().filter(|r| is_operator(r)).count();
            let mut expected: Vec<String> = positives
                .iter()
                .filter(|r| operators < 3 || !is_operator(r))
                .map(describe)
                .collect();
            if operators >= 3 {
                expected.push("an operator".into());
            }
            let unexpected: Vec<String> = negatives.iter().map(describe).collect();
            let message = if !expected.is_empty() {
                format!("expected {}, found {found}", join_alternatives(&expected))
            } else if !unexpected.is_empty() {
                format!("unexpected {}", join_alternatives(&unexpected))
            } else {
                format!("unexpected {found}")
            };
            let help = syntax_help(&expected, rest);
            let mut d = Diagnostic::error(Code::SyntaxExpected, file, span, message).label("here");
            if let Some(h) = help {
                d = d.help(h);
            }
            d
        }
        ErrorVariant::CustomError { message } => {
            Diagnostic::error(Code::SyntaxExpected, file, span, message).label("here")
        }
    }
}

/// Whether `offset` is inside a string opened earlier on its line (an odd number of
/// unescaped quotes before it; comments are skipped).
fn inside_string(text: &str, offset: usize) -> bool {
    let line_start = text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let mut open = false;
    let mut escaped = false;
    for c in text[line_start..offset.min(text.len())].chars() {
        match c {
            '#' if !open => return false,
            '\\' if open && !escaped => {
                escaped = true;
                continue;
            }
            '"' if !escaped => open = !open,
            _ => {}
        }
        escaped = false;
    }
    open
}

fn is_operator(r: &Rule) -> bool {
    matches!(
        r,
        Rule::op_or
            | Rule::op_and
            | Rule::op_eq
            | Rule::op_ne
            | Rule::op_le
            | Rule::op_ge
            | Rule::op_lt
            | Rule::op_gt
            | Rule::op_add
            | Rule::op_sub
            | Rule::op_mul
            | Rule::op_div
            | Rule::op_mod
            | Rule::infix
    )
}

const CLAUSE_KEYWORDS: &[&str] = &[
    "when", "unless", "reason", "say", "at", "do", "rule", "let", "plan", "allow",
];

fn syntax_help(expected: &[String], rest: &str) -> Option<String> {
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    let expects = |s: &str| expected.iter().any(|e| e.contains(s));
    if rest.starts_with("&&") {
        return Some("use `and`: conditions join with `and`, `or` and `not`".into());
    }
    if rest.starts_with("||") {
        return Some("use `or`: conditions join with `and`, `or` and `not`".into());
    }
    if rest.starts_with('!') && !rest.starts_with("!=") {
        return Some("use `not`: `not cluster.deleting`".into());
    }
    if rest.starts_with('=') && !rest.starts_with("==") && !expects("`=`") {
        return Some("did you mean `==`? a single `=` only defines a `let`".into());
    }
    if expects("an expression") || expects("a name") {
        if expects("an expression") && CLAUSE_KEYWORDS.contains(&word.as_str()) {
            return Some(format!(
                "`{word}` starts the next clause, so the expression before it is incomplete"
            ));
        }
        if !word.is_empty() && parse_keyword(&word) {
            return Some(format!(
                "`{word}` is a keyword; it cannot be used as a name here"
            ));
        }
    }
    if expects("`=`") {
        return Some("a definition reads `let name = expression`".into());
    }
    if expects("`let`") && expects("`rule`") {
        return Some(
            "a rule file holds `let name = expr`, `rule name ...`, `allow verb subject` and `plan verb subject` statements"
                .into(),
        );
    }
    if expected.iter().any(|e| e.starts_with("a verdict")) {
        return Some("a rule reads `rule name refuse|hold|warn <verb> <subject> when ...`".into());
    }
    if CLAUSE_KEYWORDS.contains(&word.as_str()) {
        return Some(format!(
            "`{word}` starts the next clause or statement, so the one before it is incomplete"
        ));
    }
    if expects("`)`") {
        return Some("close the `(` opened earlier in this expression".into());
    }
    if expects("`\"`") && expected.len() == 1 {
        return Some("a message is text in double quotes: say \"...\"".into());
    }
    if expects("a verb") || expects("a subject") {
        return Some(format!(
            "a rule reads `rule name refuse|hold|warn <verb>[, <verb>] <subject> [at webhook|controller] ...`; the verbs are {}",
            crate::vocab::verb_words().join(", ")
        ));
    }
    if expects("a name") && expects("an integer") {
        return Some(
            "an operand goes here: a fact or `let` name, a number, a string, `true`/`false`, `(`, or `not`/`-` before one"
                .into(),
        );
    }
    if expects("an operator") || expects("an expression") {
        return Some(
            "an expression joins facts, `let` names, numbers and strings with operators: `approved - 1 < count and not cluster.deleting`"
                .into(),
        );
    }
    if rest.is_empty() {
        return Some("the file ends in the middle of a statement; finish it".into());
    }
    Some(
        "see the rule author's guide (docs/rules.md) for the shape of `let`, `rule`, `allow` and `plan`"
            .into(),
    )
}

fn parse_keyword(word: &str) -> bool {
    RulesParser::parse(Rule::keyword, word).is_ok_and(|p| p.as_str().len() == word.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expr(s: &str) -> String {
        match parse_expr(s) {
            Ok(e) => e.to_string(),
            Err(d) => format!("error: {}", d[0].message),
        }
    }

    #[test]
    fn every_syntax_error_has_a_help_line_and_all_are_reported() {
        for text in [
            "rule",
            "rule r refuse remove worker say x",
            "rule r refuse remove worker when (approved == 1 say \"x\"",
            "allow leave",
            "plan",
            "let a =",
            "rule r refuse remove worker when approved === 1 say \"x\"",
            "rule r hold apply controlplane reason say \"x\"",
            "refuse",
            "rule r refuse remove worker when approved 1 say \"x\"",
        ] {
            let (_, ds) = parse_recovering(0, text);
            assert!(!ds.is_empty(), "{text}");
            for d in &ds {
                assert!(d.help.is_some(), "{text}: {} has no help", d.message);
            }
        }
        let two = "rule a refuse remove worker when say \"x\"\nrule b refuse remove worker when workers << 1 say \"y\"\nrule c refuse remove worker when workers < 1 say \"z\"\n";
        let (file, ds) = parse_recovering(0, two);
        assert_eq!(ds.len(), 2, "{ds:#?}");
        assert_eq!(file.items.len(), 1, "rule c parsed");
    }

    #[test]
    fn precedence_follows_arithmetic_then_comparison_then_logic() {
        assert_eq!(expr("approved / 2 + 1"), "approved / 2 + 1");
        assert_eq!(expr("a + b * c"), "a + b * c");
        assert_eq!(expr("(a + b) * c"), "(a + b) * c");
        assert_eq!(expr("not a == b and c or d"), "not a == b and c or d");
        assert_eq!(expr("a or b and c"), "a or b and c");
        assert_eq!(expr("(a or b) and c"), "(a or b) and c");
        assert_eq!(expr("a - b - c"), "a - b - c");
        assert_eq!(expr("a - (b - c)"), "a - (b - c)");
        assert_eq!(expr("-a + 1"), "-a + 1");
    }

    #[test]
    fn not_binds_looser_than_comparison() {
        let e = parse_expr("not after < count").expect("parses");
        match e.kind {
            ExprKind::Unary(UnOp::Not, inner) => {
                assert!(matches!(inner.kind, ExprKind::Binary(BinOp::Lt, _, _)))
            }
            other => panic!("expected not at the top, got {other:?}"),
        }
    }

    #[test]
    fn spans_cover_the_source_text() {
        let src = "let after = approved - 1";
        let f = parse(0, src).expect("parses");
        let Item::Let(l) = &f.items[0] else {
            panic!("not a let")
        };
        assert_eq!(
            &src[l.expr.span.start as usize..l.expr.span.end as usize],
            "approved - 1"
        );
        assert_eq!(
            &src[l.name.span.start as usize..l.name.span.end as usize],
            "after"
        );
    }

    #[test]
    fn a_rule_with_every_clause() {
        let src = r#"
# comment
rule declared-count   # trailing comment
  refuse remove, unapprove controlplane at webhook
  when after < count
  unless member.dead
  reason RemovalRefused
  say "below {count}; " "braces {{ok}}"
"#;
        let f = parse(0, src).expect("parses");
        let Item::Rule(r) = &f.items[0] else {
            panic!("not a rule")
        };
        assert_eq!(r.name.name, "declared-count");
        assert_eq!(r.verdict.name, "refuse");
        assert_eq!(
            r.verbs.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
            ["remove", "unapprove"]
        );
        assert_eq!(r.subject.name, "controlplane");
        assert_eq!(r.site.as_ref().map(|s| s.name.as_str()), Some("webhook"));
        assert_eq!(
            r.reason.as_ref().map(|s| s.name.as_str()),
            Some("RemovalRefused")
        );
        let say = r.say.as_ref().expect("message");
        assert_eq!(say.parts.len(), 3);
        assert_eq!(say.parts[0], MessagePart::Text("below ".into()));
        assert_eq!(say.parts[2], MessagePart::Text("; braces {ok}".into()));
    }

    #[test]
    fn plans_split_steps_on_do() {
        let src = r#"
plan remove controlplane
  do lock cluster
  do drain node unless member.dead
  do event warning DeadMemberRemoved when member.dead say "x"
"#;
        let f = parse(0, src).expect("parses");
        let Item::Plan(p) = &f.items[0] else {
            panic!("not a plan")
        };
        assert_eq!(p.steps.len(), 3);
        assert_eq!(p.steps[2].words.len(), 3);
        assert!(p.steps[1].unless.is_some());
        assert!(p.steps[2].say.is_some());
    }

    #[test]
    fn syntax_errors_say_what_was_expected_in_words() {
        let err = parse(0, "let after approved - 1").expect_err("missing =");
        assert_eq!(err.len(), 1);
        assert!(
            err[0].message.contains("expected `=`"),
            "{}",
            err[0].message
        );
        assert!(!err[0].message.contains("equals"), "{}", err[0].message);

        let err = parse(0, "rule r refuse remove controlplane when after <").expect_err("dangling");
        assert!(
            err[0].message.contains("an expression") || err[0].message.contains("a name"),
            "{}",
            err[0].message
        );
    }

    #[test]
    fn huge_integers_are_reported_not_panicked() {
        let err = parse(0, "let x = 99999999999999999999").expect_err("too big");
        assert_eq!(err[0].code, Code::SyntaxIntTooLarge);
    }

    #[test]
    fn absurd_nesting_and_length_are_errors_not_crashes() {
        let deep = format!("let x = {}1{}", "(".repeat(10_000), ")".repeat(10_000));
        let err = parse(0, &deep).expect_err("too deep");
        assert_eq!(err[0].code, Code::SyntaxTooComplex);
        let long = format!("let x = 1{}", " + 1".repeat(5_000));
        let err = parse(0, &long).expect_err("too long");
        assert_eq!(err[0].code, Code::SyntaxTooComplex);
        let nots = format!("let x = {}true", "not ".repeat(5_000));
        assert!(parse(0, &nots).is_err());
    }

    #[test]
    fn keywords_are_not_names() {
        assert!(parse(0, "let when = 1").is_err());
        assert!(parse(0, "let whenever = 1").is_ok());
    }
}
