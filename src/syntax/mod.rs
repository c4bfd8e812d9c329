//! Text -> AST. pest's types stay inside this module: one `fn` per grammar rule turns the
//! parse tree into the plain AST of [`ast`], and syntax errors become [`Diagnostic`]s that
//! say what was expected in words.

pub mod ast;
pub mod depth;
mod errors;
mod fast;
pub mod fmt;
mod lower;
mod recover;

use errors::syntax_error;
use lower::Lower;
pub use recover::parse_recovering;

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
