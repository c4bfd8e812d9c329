//! The AST: plain Rust types with spans. Nothing here knows about pest.

use std::fmt;

pub use crate::span::Span;

/// A word with where it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// One parsed rule file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct File {
    pub items: Vec<Item>,
    /// Names of `let`s left out because their statement has a syntax error: the checker
    /// does not report them as unknown where they are used.
    pub broken_lets: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Let(LetDef),
    Rule(Box<RuleDef>),
    Allow(AllowDef),
    Plan(PlanDef),
    Invariant(Box<InvariantDef>),
}

/// `invariant name [sequential] [when e] [unless e] ensure e [say "..."]`: a property
/// `verify` proves over the model's facts.
#[derive(Clone, Debug, PartialEq)]
pub struct InvariantDef {
    pub name: Ident,
    /// Checked only where requests are admitted and committed one at a time.
    pub sequential: bool,
    pub when: Option<Expr>,
    pub unless: Option<Expr>,
    pub ensure: Option<Expr>,
    pub say: Option<Message>,
    pub span: Span,
}

/// `let name = expr`.
#[derive(Clone, Debug, PartialEq)]
pub struct LetDef {
    pub name: Ident,
    pub expr: Expr,
    pub span: Span,
}

/// `rule name <verdict> <verbs> <subject> [at site] [when e] [unless e] [reason R] [say "..."]`.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleDef {
    pub name: Ident,
    /// `rule NAME audit`: evaluated and recorded, never enforced.
    pub audit: bool,
    pub verdict: Ident,
    pub verbs: Vec<Ident>,
    pub subject: Ident,
    pub site: Option<Ident>,
    pub when: Option<Expr>,
    pub unless: Option<Expr>,
    pub reason: Option<Ident>,
    pub say: Option<Message>,
    pub span: Span,
}

/// `allow <verbs> <subject> [at site]`.
#[derive(Clone, Debug, PartialEq)]
pub struct AllowDef {
    pub verbs: Vec<Ident>,
    pub subject: Ident,
    pub site: Option<Ident>,
    pub span: Span,
}

/// `plan <verb> <subject> ["kind"]` and its steps.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanDef {
    pub verb: Ident,
    pub subject: Ident,
    /// The operation kind it runs (`plan run operation "reboot"`), without its quotes.
    pub kind: Option<Ident>,
    pub steps: Vec<Step>,
    pub span: Span,
}

/// `within <n><s|m|h>`: how long a step may wait, as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Within {
    /// Seconds; `None` when the number does not fit.
    pub secs: Option<u64>,
    pub span: Span,
}

/// `do <action words> [within d] [when e] [unless e] [say "..."]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub words: Vec<Ident>,
    pub within: Option<Within>,
    pub when: Option<Expr>,
    pub unless: Option<Expr>,
    pub say: Option<Message>,
    pub span: Span,
}

/// A message: text with typed `{expr}` placeholders.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub parts: Vec<MessagePart>,
    pub span: Span,
}

/// Escapes text so that it reads back as the same string literal body.
pub fn escape_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '{' => out.push_str("{{"),
            '}' => out.push_str("}}"),
            c => out.push(c),
        }
    }
    out
}

impl Message {
    /// The message as one string literal, placeholders as written: `"below {count}"`.
    pub fn source_text(&self) -> String {
        let body: String = self
            .parts
            .iter()
            .map(|p| match p {
                MessagePart::Text(t) => escape_text(t),
                MessagePart::Placeholder(e) => format!("{{{e}}}"),
            })
            .collect();
        format!("\"{body}\"")
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum MessagePart {
    Text(String),
    Placeholder(Expr),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

/// The one subexpression walker: every analysis that only collects or tests something of
/// the nodes of an expression (the names, facts and strings it reads, its size, whether an
/// expensive fact is among them) goes through these, instead of a `match` of its own.
/// Analyses whose result depends on the shape (types, evaluation, the conditions that
/// guard a division) keep their `match`. Parsing bounds the nesting (see `depth.rs`), so
/// the recursion is bounded too.
impl Expr {
    /// The direct subexpressions, left to right.
    pub fn children(&self) -> impl Iterator<Item = &Expr> {
        let (a, b): (Option<&Expr>, Option<&Expr>) = match &self.kind {
            ExprKind::Unary(_, i) => (Some(i), None),
            ExprKind::Binary(_, l, r) => (Some(l), Some(r)),
            _ => (None, None),
        };
        a.into_iter().chain(b)
    }

    /// Calls `f` on this expression and every subexpression: a node before its children,
    /// left to right.
    pub fn walk<'e>(&'e self, f: &mut impl FnMut(&'e Expr)) {
        f(self);
        for c in self.children() {
            c.walk(f);
        }
    }

    /// Whether `pred` holds of this expression or any subexpression (stops at the first).
    pub fn any(&self, pred: &mut impl FnMut(&Expr) -> bool) -> bool {
        pred(self) || self.children().any(|c| c.any(pred))
    }

    /// Every name (fact or `let`) the expression reads directly, with its span, in order
    /// and with repeats.
    pub fn names(&self) -> Vec<(&str, Span)> {
        let mut out = Vec::new();
        self.walk(&mut |e| {
            if let ExprKind::Name(n) = &e.kind {
                out.push((n.as_str(), e.span));
            }
        });
        out
    }

    /// Whether the expression reads the name `name` directly.
    pub fn reads(&self, name: &str) -> bool {
        self.any(&mut |e| matches!(&e.kind, ExprKind::Name(n) if n == name))
    }

    /// The number of operands and operators.
    pub fn size(&self) -> usize {
        let mut n = 0usize;
        self.walk(&mut |_| n = n.saturating_add(1));
        n
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Int(i64),
    Bool(bool),
    /// A string literal; its placeholders, if any, are an error outside messages.
    Str(String, bool),
    /// A fact or a `let`.
    Name(String),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Not,
    Neg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Or => "or",
            BinOp::And => "and",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "%",
        }
    }

    /// Binding strength, for printing with the fewest parentheses.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 4,
            BinOp::Add | BinOp::Sub => 5,
            BinOp::Mul | BinOp::Div | BinOp::Mod => 6,
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_expr(f, self, 0)
    }
}

fn write_expr(f: &mut fmt::Formatter<'_>, e: &Expr, outer: u8) -> fmt::Result {
    match &e.kind {
        ExprKind::Int(i) => write!(f, "{i}"),
        ExprKind::Bool(b) => write!(f, "{b}"),
        ExprKind::Str(s, _) => write!(f, "\"{}\"", escape_text(s)),
        ExprKind::Name(n) => f.write_str(n),
        ExprKind::Unary(UnOp::Not, inner) => {
            let paren = outer > 3;
            if paren {
                f.write_str("(")?;
            }
            f.write_str("not ")?;
            write_expr(f, inner, 3)?;
            if paren {
                f.write_str(")")?;
            }
            Ok(())
        }
        ExprKind::Unary(UnOp::Neg, inner) => {
            f.write_str("-")?;
            write_expr(f, inner, 7)
        }
        ExprKind::Binary(op, l, r) => {
            let p = op.precedence();
            let paren = p < outer;
            if paren {
                f.write_str("(")?;
            }
            write_expr(f, l, p)?;
            write!(f, " {} ", op.symbol())?;
            write_expr(f, r, p + 1)?;
            if paren {
                f.write_str(")")?;
            }
            Ok(())
        }
    }
}
