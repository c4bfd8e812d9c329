//! Every syntax error of a file, not only the first: a statement with an error is blanked
//! out and the file parsed again.

use super::*;

/// The most syntax errors reported for one file.
pub(super) const MAX_SYNTAX_ERRORS: usize = 50;

/// Parses one rule file, reporting every syntax error rather than the first: a statement
/// with an error is reported, then blanked out (same length, newlines kept, so every span
/// stays true), and the file parsed again. The AST holds the statements that parsed; the
/// checker can still find their own errors.
pub fn parse_recovering(file_id: usize, text: &str) -> (File, Vec<Diagnostic>) {
    parse_recovering_with(file_id, text, true)
}

/// [`parse_recovering`] without the fast parser: pest and lowering alone (its tests compare).
#[cfg(test)]
pub(super) fn parse_with_pest(file_id: usize, text: &str) -> (File, Vec<Diagnostic>) {
    parse_recovering_with(file_id, text, false)
}

/// With `fast`, a file the hand-written parser reads ([`fast`](super::fast)) is not given to
/// pest: the same AST, without pest's parse tree. Anything else pest parses and reports.
fn parse_recovering_with(file_id: usize, text: &str, fast: bool) -> (File, Vec<Diagnostic>) {
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
    if fast && let Some(file) = super::fast::parse(text) {
        return (file, Vec::new());
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
pub(super) fn statement_starts(text: &str) -> Vec<usize> {
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
pub(super) fn statement_around(text: &str, at: usize) -> (usize, usize) {
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
pub(super) fn let_name(statement: &str) -> Option<String> {
    let rest = statement.trim_start().strip_prefix("let")?;
    let name: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    (!name.is_empty() && rest.starts_with(char::is_whitespace)).then_some(name)
}
