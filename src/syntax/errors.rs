//! Syntax errors in words: what was expected, where, and how to fix it.

use super::*;

/// What a grammar rule is called in an error message.
pub(super) fn describe(rule: &Rule) -> String {
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
        Rule::kw_audit => "`audit`",
        Rule::kw_within => "`within`",
        Rule::within_clause => "`within` and a duration",
        Rule::duration => "a duration such as `90s`, `10m` or `1h`",
        Rule::plan_kind => "an operation kind in quotes, such as `\"reboot\"`",
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

pub(super) fn join_alternatives(items: &[String]) -> String {
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

pub(super) fn syntax_error(file: usize, text: &str, e: pest::error::Error<Rule>) -> Diagnostic {
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
pub(super) fn inside_string(text: &str, offset: usize) -> bool {
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

pub(super) fn is_operator(r: &Rule) -> bool {
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

pub(super) const CLAUSE_KEYWORDS: &[&str] = &[
    "when", "unless", "reason", "say", "at", "do", "rule", "let", "plan", "allow",
];

pub(super) fn syntax_help(expected: &[String], rest: &str) -> Option<String> {
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
            "a rule file holds `let name = expr`, `rule name ...`, `allow verb subject`, `plan verb subject` and `invariant name ...` statements"
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

pub(super) fn parse_keyword(word: &str) -> bool {
    RulesParser::parse(Rule::keyword, word).is_ok_and(|p| p.as_str().len() == word.len())
}
