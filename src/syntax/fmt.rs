//! `ichor-rules fmt`: one canonical layout of a rule file, comments kept.
//!
//! The formatter rewrites only the space between tokens: the token stream of its output is
//! the token stream of its input, so the formatted file means exactly what the original
//! meant (tests/fmt.rs compares the compiled tables). Comments are not in the parse tree
//! (`WHITESPACE` holds them); they are read back from the gaps between tokens and keep
//! their place: a comment after a token on its line stays after it, a comment on its own
//! line stays on its own line before the token that followed it.
//!
//! The layout (docs/rules.md, "Formatting"):
//!
//! ```text
//! let NAME = EXPR                      consecutive `let`s align their `=` and comments
//!
//! rule NAME [audit]
//!   VERDICT VERBS SUBJECT [at SITE]
//!   when EXPR
//!   unless EXPR
//!   reason REASON
//!   say "first string"
//!       "next string"
//!
//! allow VERBS SUBJECT [at SITE]
//!
//! plan VERB SUBJECT
//!   do WORDS        [when EXPR] [unless EXPR]   guards aligned within the plan
//!      say "..."
//!
//! invariant NAME [sequential]
//!   when EXPR / unless EXPR / ensure EXPR / say "..."
//! ```
//!
//! Tokens are separated by one space (none inside parentheses, after a unary `-` or before
//! a comma); strings are kept as written. Statements are separated by one blank line;
//! consecutive `let`s (and `allow`s) keep whether the source had a blank line between them.

use super::{Rule, RulesParser};
use pest::Parser;
use pest::iterators::Pair;

/// A step whose `do WORDS` is wider than this is left out of its plan's guard column
/// (its guard follows after one space), so one long step does not push the others right.
const MAX_ALIGNED_STEP: usize = 32;

/// The widest line a clause is wrapped to.
const MAX_WIDTH: usize = 100;

/// A token of the source: its rule and its byte range.
struct Token {
    rule: Rule,
    start: usize,
    end: usize,
}

/// A comment in the gap before a token.
struct Comment {
    text: String,
    /// On the same line as the token before it.
    trailing: bool,
    /// An empty line precedes it.
    blank_before: bool,
}

/// One output line: its code, and a comment after it.
#[derive(Clone)]
struct Line {
    code: String,
    comment: Option<String>,
    /// Part of a group of `let` lines that align.
    let_group: bool,
}

/// Formats a rule file. `Err` holds the parse diagnostics of a file that does not parse
/// (nothing is formatted then).
pub fn format(text: &str) -> Result<String, Vec<crate::diagnostics::Diagnostic>> {
    // The checked parse first: it refuses input nested too deep for the parse tree walk.
    super::parse(0, text)?;
    let pairs = RulesParser::parse(Rule::file, text).map_err(|_| Vec::new())?;
    let mut tokens = Vec::new();
    for p in pairs {
        collect(p, &mut tokens);
    }
    let mut lead: Vec<Vec<Comment>> = Vec::with_capacity(tokens.len() + 1);
    let mut tail_blank = Vec::with_capacity(tokens.len() + 1);
    let mut prev = 0;
    for t in &tokens {
        let gap = &text[prev..t.start];
        lead.push(comments(gap, prev == 0));
        // An empty line between the gap's last comment and the token.
        tail_blank.push(gap.rfind('#').is_some_and(|c| {
            gap[c..]
                .find('\n')
                .is_some_and(|nl| blank_line_in(&gap[c + nl..]))
        }));
        prev = t.end;
    }
    lead.push(comments(&text[prev..], prev == 0));
    tail_blank.push(false);
    let mut f = Formatter {
        text,
        tokens: &tokens,
        lead,
        tail_blank,
        lines: Vec::new(),
        cur: String::new(),
        cur_comment: None,
        at_start: true,
        indent: 0,
        cont: 4,
        broken: false,
        next: 0,
    };
    f.file(&tokens);
    Ok(f.finish())
}

/// The leaf tokens of the parse tree, in order. A string is one token (kept as written).
fn collect(p: Pair<'_, Rule>, out: &mut Vec<Token>) {
    let rule = p.as_rule();
    if rule == Rule::EOI {
        return;
    }
    let span = p.as_span();
    let mut inner = p.into_inner().peekable();
    if rule == Rule::string || inner.peek().is_none() {
        out.push(Token {
            rule,
            start: span.start(),
            end: span.end(),
        });
        return;
    }
    for c in inner {
        collect(c, out);
    }
}

/// The comments of a gap between two tokens (the gap holds only spaces and comments).
fn comments(gap: &str, file_start: bool) -> Vec<Comment> {
    let mut out = Vec::new();
    let mut newlines = 0usize;
    let mut rest = gap;
    let mut first = true;
    while let Some(at) = rest.find(['#', '\n']) {
        if rest.as_bytes()[at] == b'\n' {
            newlines += 1;
            rest = &rest[at + 1..];
            continue;
        }
        let end = rest[at..].find('\n').map_or(rest.len(), |e| at + e);
        out.push(Comment {
            text: rest[at..end].trim_end().to_string(),
            trailing: first && newlines == 0 && !file_start,
            blank_before: newlines >= 2,
        });
        first = false;
        newlines = 0;
        rest = &rest[end..];
    }
    out
}

/// Whether a gap holds an empty line: two newlines with only spaces (`\r` too) between
/// them. A comment line is not empty, however short: a bare `#` ends a run of newlines as
/// `# text` does (else `\n#\n` would count as a blank line and `\r\n#\r\n` would not,
/// and formatting a CRLF file would not be idempotent).
fn blank_line_in(gap: &str) -> bool {
    let mut newlines = 0;
    let mut in_comment = false;
    for c in gap.chars() {
        match c {
            '#' => {
                in_comment = true;
                newlines = 0;
            }
            '\n' => {
                in_comment = false;
                newlines += 1;
                if newlines >= 2 {
                    return true;
                }
            }
            c if !in_comment && !c.is_whitespace() => newlines = 0,
            _ if in_comment => newlines = 0,
            _ => {}
        }
    }
    false
}

struct Formatter<'a> {
    text: &'a str,
    tokens: &'a [Token],
    lead: Vec<Vec<Comment>>,
    /// Per token, an empty line between its gap's last comment and it.
    tail_blank: Vec<bool>,
    lines: Vec<Line>,
    cur: String,
    cur_comment: Option<String>,
    /// Nothing but indentation on the current line yet.
    at_start: bool,
    /// The indentation of the current line.
    indent: usize,
    /// Where a line broken by a comment continues.
    cont: usize,
    /// A comment ended the line: the next token starts a new one.
    broken: bool,
    /// The next token to write.
    next: usize,
}

impl Formatter<'_> {
    fn flush(&mut self) {
        if !self.at_start || self.cur_comment.is_some() {
            let code = self.cur.trim_end().to_string();
            self.lines.push(Line {
                code,
                comment: self.cur_comment.take(),
                let_group: false,
            });
        }
        self.cur.clear();
        self.at_start = true;
    }

    /// Starts a new line at `indent` (continuation lines of a broken one at `cont`).
    fn newline(&mut self, indent: usize, cont: usize) {
        self.flush();
        self.indent = indent;
        self.cont = cont;
        self.cur = " ".repeat(indent);
        self.broken = false;
    }

    fn blank(&mut self) {
        self.flush();
        if self
            .lines
            .last()
            .is_some_and(|l| !l.code.is_empty() || l.comment.is_some())
        {
            self.lines.push(Line {
                code: String::new(),
                comment: None,
                let_group: false,
            });
        }
        self.cur = " ".repeat(self.indent);
    }

    /// The comments before token `i`, placed.
    fn place_comments(&mut self, i: usize, top_level: bool) {
        let comments = std::mem::take(&mut self.lead[i]);
        for c in comments {
            if c.trailing {
                if self.at_start && self.cur_comment.is_none() {
                    if let Some(last) = self.lines.last_mut().filter(|l| l.comment.is_none()) {
                        last.comment = Some(c.text);
                    } else {
                        self.cur_comment = Some(c.text);
                        self.flush();
                        self.cur = " ".repeat(self.indent);
                    }
                } else {
                    self.cur_comment = Some(c.text);
                    self.flush();
                    self.cur = " ".repeat(self.indent);
                    self.broken = true;
                }
            } else {
                let mid_line = !self.at_start;
                self.flush();
                if c.blank_before && (top_level || !mid_line) {
                    self.blank();
                }
                let at = if mid_line { self.cont } else { self.indent };
                self.lines.push(Line {
                    code: format!("{}{}", " ".repeat(at), c.text),
                    comment: None,
                    let_group: false,
                });
                self.cur = " ".repeat(self.indent);
                self.broken = mid_line || self.broken;
            }
        }
    }

    /// Writes token `i` (with one space before it unless `tight`).
    fn token(&mut self, tight: bool) {
        let i = self.next;
        self.next += 1;
        self.place_comments(i, false);
        if self.broken {
            self.flush();
            self.cur = " ".repeat(self.cont);
            self.broken = false;
        } else if !self.at_start && !tight {
            self.cur.push(' ');
        }
        let t = &self.tokens[i];
        self.cur.push_str(&self.text[t.start..t.end]);
        self.at_start = false;
    }

    /// Writes the tokens up to (not including) `end`, spaced as an expression.
    fn run(&mut self, end: usize) {
        while self.next < end {
            let i = self.next;
            let prev = i.checked_sub(1).map(|p| self.tokens[p].rule);
            let rule = self.tokens[i].rule;
            let tight = matches!(prev, Some(Rule::open_paren | Rule::op_neg))
                || matches!(rule, Rule::close_paren | Rule::comma);
            self.token(tight);
        }
    }

    /// The spacing `run` uses before token `i`: whether it is written without a space.
    fn tight(&self, i: usize) -> bool {
        let prev = i.checked_sub(1).map(|p| self.tokens[p].rule);
        matches!(prev, Some(Rule::open_paren | Rule::op_neg))
            || matches!(self.tokens[i].rule, Rule::close_paren | Rule::comma)
    }

    /// Like `run`, for a clause's keyword and expression: a line longer than
    /// [`MAX_WIDTH`] is broken before an `and`/`or` outside parentheses (as late as fits),
    /// continuing at column `cont`. A clause with a comment inside is not rewrapped.
    fn run_wrapped(&mut self, end: usize, cont: usize) {
        let start = self.next;
        if (start + 1..end).any(|k| !self.lead[k].is_empty()) || !self.at_start {
            self.run(end);
            return;
        }
        // Segments: the keyword and the operands up to the first break point, then each
        // `and`/`or` at depth 0 with what follows it.
        let mut segments: Vec<(usize, usize)> = Vec::new();
        let mut depth = 0i32;
        let mut seg_start = start;
        for k in start..end {
            match self.tokens[k].rule {
                Rule::open_paren => depth += 1,
                Rule::close_paren => depth -= 1,
                Rule::op_and | Rule::op_or if depth == 0 && k > start + 1 => {
                    segments.push((seg_start, k));
                    seg_start = k;
                }
                _ => {}
            }
        }
        segments.push((seg_start, end));
        let width = |f: &Self, (a, b): (usize, usize)| -> usize {
            (a..b)
                .map(|k| {
                    let t = &f.tokens[k];
                    t.end - t.start + usize::from(k > a && !f.tight(k))
                })
                .sum()
        };
        let mut col = self.cur.chars().count();
        for (n, seg) in segments.iter().enumerate() {
            let w = width(self, *seg);
            if n > 0 && col + 1 + w > MAX_WIDTH {
                self.flush();
                self.cur = " ".repeat(cont);
                col = cont;
            } else if n > 0 {
                col += 1;
            }
            self.run(seg.1);
            col += w;
        }
    }

    /// The index of the first token at or after `i` whose rule is one of `rules`, or `end`.
    fn find(&self, from: usize, end: usize, rules: &[Rule]) -> usize {
        (from..end)
            .find(|&k| rules.contains(&self.tokens[k].rule))
            .unwrap_or(end)
    }

    fn file(&mut self, tokens: &[Token]) {
        // Items start at their keyword; a keyword token that starts an item is one of
        // these (in expressions and clauses these keywords cannot appear).
        let starts: Vec<usize> = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                matches!(
                    t.rule,
                    Rule::kw_let
                        | Rule::kw_rule
                        | Rule::kw_allow
                        | Rule::kw_plan
                        | Rule::kw_invariant
                )
            })
            .map(|(k, _)| k)
            .collect();
        let mut prev_kind: Option<Rule> = None;
        for (n, &s) in starts.iter().enumerate() {
            let end = starts.get(n + 1).copied().unwrap_or(tokens.len());
            let kind = tokens[s].rule;
            if let Some(p) = prev_kind {
                let gap_start = tokens[s - 1].end;
                let gap = &self.text[gap_start..tokens[s].start];
                let same_group = p == kind && matches!(kind, Rule::kw_let | Rule::kw_allow);
                let own_line_comments = self.lead[s].iter().any(|c| !c.trailing);
                // Trailing comments of the previous item's last token first.
                let trailing: Vec<Comment> = {
                    let all = std::mem::take(&mut self.lead[s]);
                    let (t, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(|c| c.trailing);
                    self.lead[s] = rest;
                    t
                };
                for c in trailing {
                    if self.at_start
                        && let Some(last) = self.lines.last_mut().filter(|l| l.comment.is_none())
                    {
                        last.comment = Some(c.text);
                        continue;
                    }
                    self.cur_comment = Some(c.text);
                }
                self.flush();
                let first_blank = self.lead[s].first().is_some_and(|c| c.blank_before);
                let blank = if own_line_comments {
                    first_blank || (!same_group && blank_line_in(gap))
                } else if same_group {
                    blank_line_in(gap)
                } else {
                    true
                };
                self.indent = 0;
                if blank {
                    self.blank();
                }
                // The first own-line comment's blank line is the separator just written.
                if let Some(c) = self.lead[s].first_mut() {
                    c.blank_before = false;
                }
            }
            self.indent = 0;
            self.cur.clear();
            self.at_start = true;
            self.place_comments_top(s);
            self.next = s;
            match kind {
                Rule::kw_let => self.let_def(end),
                Rule::kw_rule => self.rule_def(end),
                Rule::kw_allow => self.allow_def(end),
                Rule::kw_plan => self.plan_def(end),
                _ => self.invariant_def(end),
            }
            prev_kind = Some(kind);
        }
        // Comments after the last token (or of a file with no statement).
        let last = tokens.len();
        let comments = std::mem::take(&mut self.lead[last]);
        for c in comments {
            if c.trailing {
                if let Some(l) = self.lines.last_mut().filter(|l| l.comment.is_none())
                    && self.at_start
                {
                    l.comment = Some(c.text);
                    continue;
                }
                self.cur_comment = Some(c.text);
                self.flush();
            } else {
                self.flush();
                if c.blank_before {
                    self.blank();
                }
                self.lines.push(Line {
                    code: c.text,
                    comment: None,
                    let_group: false,
                });
            }
        }
        self.flush();
    }

    /// Own-line comments before an item, at column 0, keeping their blank lines.
    fn place_comments_top(&mut self, s: usize) {
        let comments = std::mem::take(&mut self.lead[s]);
        let any = !comments.is_empty();
        for c in comments {
            if c.blank_before {
                self.blank();
                self.cur.clear();
            }
            self.lines.push(Line {
                code: c.text,
                comment: None,
                let_group: false,
            });
        }
        if any && self.tail_blank[s] {
            self.blank();
            self.cur.clear();
        }
        self.at_start = true;
    }

    fn let_def(&mut self, end: usize) {
        self.newline(0, 4);
        self.run(end);
        self.flush();
        if let Some(l) = self.lines.last_mut()
            && l.code.starts_with("let ")
        {
            l.let_group = true;
        }
    }

    fn allow_def(&mut self, end: usize) {
        self.newline(0, 4);
        self.run(end);
        self.flush();
    }

    /// Clause keywords of a rule or an invariant, each on a line of its own.
    fn clauses(&mut self, end: usize, head_end: usize) {
        let clause_kw = [
            Rule::kw_when,
            Rule::kw_unless,
            Rule::kw_reason,
            Rule::kw_say,
            Rule::kw_ensure,
        ];
        let mut at = head_end;
        while at < end {
            let next = self.find(at + 1, end, &clause_kw);
            self.newline(2, 6);
            if self.tokens[at].rule == Rule::kw_say {
                self.say(at, next, 2);
            } else if matches!(
                self.tokens[at].rule,
                Rule::kw_when | Rule::kw_unless | Rule::kw_ensure
            ) {
                // `when ` is the clause keyword and its space: continuation lines start
                // under the expression.
                let kw = self.tokens[at].end - self.tokens[at].start;
                self.run_wrapped(next, 2 + kw + 1);
            } else {
                self.run(next);
            }
            at = next;
        }
    }

    /// `say` and its strings, one string a line, under the first.
    fn say(&mut self, at: usize, end: usize, indent: usize) {
        self.next = at;
        self.token(false);
        let mut first = true;
        while self.next < end {
            if !first {
                self.newline(indent + 4, indent + 4);
            }
            self.token(false);
            first = false;
        }
    }

    fn rule_def(&mut self, end: usize) {
        self.newline(0, 4);
        // `rule NAME [audit]`
        let audit = self
            .tokens
            .get(self.next + 2)
            .is_some_and(|t| t.rule == Rule::kw_audit);
        self.run(self.next + if audit { 3 } else { 2 });
        let clause_kw = [
            Rule::kw_when,
            Rule::kw_unless,
            Rule::kw_reason,
            Rule::kw_say,
        ];
        let head_end = self.find(self.next, end, &clause_kw);
        // The verdict line.
        self.newline(2, 6);
        self.run(head_end);
        self.clauses(end, head_end);
        self.flush();
    }

    fn invariant_def(&mut self, end: usize) {
        self.newline(0, 4);
        let clause_kw = [
            Rule::kw_when,
            Rule::kw_unless,
            Rule::kw_ensure,
            Rule::kw_say,
        ];
        let head_end = self.find(self.next, end, &clause_kw);
        self.run(head_end);
        self.clauses(end, head_end);
        self.flush();
    }

    fn plan_def(&mut self, end: usize) {
        self.newline(0, 4);
        let first_do = self.find(self.next, end, &[Rule::kw_do]);
        self.run(first_do);
        // Steps, with their guards aligned: the widest `do WORDS` of the plan, plus one.
        let mut steps = Vec::new();
        let mut at = first_do;
        while at < end {
            let next = self.find(at + 1, end, &[Rule::kw_do]);
            steps.push((at, next));
            at = next;
        }
        let guard_kw = [Rule::kw_when, Rule::kw_unless, Rule::kw_say];
        let words_width = |f: &Self, s: usize, e: usize| -> usize {
            let w_end = f.find(s, e, &guard_kw);
            2 + (s..w_end)
                .map(|k| f.tokens[k].end - f.tokens[k].start + 1)
                .sum::<usize>()
                .saturating_sub(1)
        };
        let column = steps
            .iter()
            .filter(|&&(s, e)| {
                let g = self.find(s, e, &guard_kw);
                g < e && self.tokens[g].rule != Rule::kw_say
            })
            .map(|&(s, e)| words_width(self, s, e))
            .filter(|&w| w <= MAX_ALIGNED_STEP)
            .max()
            .unwrap_or(0)
            + 1;
        for (s, e) in steps {
            self.newline(2, 9);
            let g = self.find(s, e, &guard_kw);
            self.run(g);
            let mut at = g;
            while at < e {
                let next = self.find(at + 1, e, &guard_kw);
                if self.tokens[at].rule == Rule::kw_say {
                    self.newline(5, 9);
                    self.say(at, next, 5);
                } else {
                    if !self.broken && !self.at_start && self.lead[at].is_empty() {
                        let width = self.cur.chars().count();
                        if width < column {
                            self.cur.push_str(&" ".repeat(column - width - 1));
                        }
                    }
                    self.run(next);
                }
                at = next;
            }
        }
        self.flush();
    }

    fn finish(mut self) -> String {
        self.flush();
        // Align consecutive `let` lines: their `=`, then their comments.
        let mut k = 0;
        while k < self.lines.len() {
            if !self.lines[k].let_group {
                k += 1;
                continue;
            }
            let mut e = k;
            while e < self.lines.len() && self.lines[e].let_group {
                e += 1;
            }
            let names: Vec<Option<(String, String)>> = self.lines[k..e]
                .iter()
                .map(|l| {
                    let rest = l.code.strip_prefix("let ")?;
                    let (name, expr) = rest.split_once(" = ")?;
                    Some((name.to_string(), expr.to_string()))
                })
                .collect();
            let width = names
                .iter()
                .flatten()
                .map(|(n, _)| n.len())
                .max()
                .unwrap_or(0);
            for (l, n) in self.lines[k..e].iter_mut().zip(&names) {
                if let Some((name, expr)) = n {
                    l.code = format!("let {name:<width$} = {expr}");
                }
            }
            let col = self.lines[k..e]
                .iter()
                .filter(|l| l.comment.is_some())
                .map(|l| l.code.len())
                .max()
                .unwrap_or(0);
            for l in &mut self.lines[k..e] {
                if l.comment.is_some() {
                    let pad = col - l.code.len();
                    l.code.push_str(&" ".repeat(pad));
                }
            }
            k = e;
        }
        let mut out = String::new();
        for l in &self.lines {
            out.push_str(&l.code);
            if let Some(c) = &l.comment {
                if !l.code.is_empty() {
                    out.push_str("  ");
                }
                out.push_str(c);
            }
            out.push('\n');
        }
        // No blank lines at the end; an empty file stays empty.
        while out.ends_with("\n\n") {
            out.pop();
        }
        if out.trim().is_empty() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::format;

    #[test]
    fn canonical_layout_with_comments() {
        let messy = "# head\n\nlet  a=approved-1 # left\nlet quorum = approved/2+1\nrule   r refuse remove,unapprove controlplane when a<quorum and not( cluster.deleting )   unless -1 > a reason RemovalRefused say \"x {a}\" \"y\"\nallow approve worker\n";
        let want = "# head\n\nlet a      = approved - 1  # left\nlet quorum = approved / 2 + 1\n\nrule r\n  refuse remove, unapprove controlplane\n  when a < quorum and not (cluster.deleting)\n  unless -1 > a\n  reason RemovalRefused\n  say \"x {a}\"\n      \"y\"\n\nallow approve worker\n";
        let got = format(messy).expect("formats");
        assert_eq!(got, want);
        assert_eq!(format(&got).expect("formats"), got, "idempotent");
    }

    #[test]
    fn comments_inside_a_statement_stay_where_they_were() {
        let text = "rule r\n  refuse remove controlplane\n  when approved > 1 # why\n    and workers > 0\n  # before the message\n  say \"m\"\n";
        let got = format(text).expect("formats");
        assert!(got.contains("when approved > 1  # why\n"), "{got}");
        assert!(
            got.contains("  # before the message\n  say \"m\"\n"),
            "{got}"
        );
        assert_eq!(format(&got).expect("formats"), got);
    }

    #[test]
    fn a_syntax_error_is_not_formatted() {
        assert!(format("rule r refuse").is_err());
    }
}
