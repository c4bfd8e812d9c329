//! The common case, fast: a hand-written parser for rule files that parse, building the very
//! AST that pest and [`Lower`](super::lower::Lower) build, in one pass with no parse tree.
//!
//! It is an accelerator, not a second grammar: it follows `grammar/rules.pest` (the same
//! ordered choices, the same keyword and word rules, the same implicit trivia) and gives up
//! (`None`) at the first thing that would not parse, or that lowering would report (an
//! integer too large, an expression too long or too deep). Then pest parses the file, and
//! every syntax error and its wording comes from there. So it never changes a diagnostic:
//! a file either parses here to the same AST, or is parsed as before.
//!
//! `tests` below compare the two on every rule file of the repository and on generated
//! token soups; a change to the grammar that this does not follow fails
//! `the_grammar_is_the_one_mirrored` (update both, and the fingerprint there).

use super::ast::*;
use super::{MAX_DEPTH, MAX_EXPRESSION_PARTS};

/// The grammar's `keyword` rule: words that are never names, verbs or rule names.
pub(super) const KEYWORDS: &[&str] = &[
    "let",
    "rule",
    "allow",
    "plan",
    "invariant",
    "ensure",
    "do",
    "refuse",
    "hold",
    "warn",
    "at",
    "when",
    "unless",
    "reason",
    "say",
    "within",
    "and",
    "or",
    "not",
    "true",
    "false",
];

/// Parses a whole file, or `None` when pest must (see the module's note).
pub(super) fn parse(text: &str) -> Option<File> {
    let mut p = Parser {
        b: text.as_bytes(),
        text,
        pos: 0,
        last_end: 0,
    };
    let mut items = Vec::new();
    loop {
        p.skip();
        if p.pos == p.b.len() {
            return Some(File {
                items,
                broken_lets: Vec::new(),
            });
        }
        let start = p.pos;
        let item = if p.kw("let") {
            Item::Let(p.let_def(start)?)
        } else if p.kw("rule") {
            Item::Rule(Box::new(p.rule_def(start)?))
        } else if p.kw("allow") {
            Item::Allow(p.allow_def(start)?)
        } else if p.kw("plan") {
            Item::Plan(p.plan_def(start)?)
        } else if p.kw("invariant") {
            Item::Invariant(Box::new(p.invariant_def(start)?))
        } else {
            return None;
        };
        items.push(item);
    }
}

fn ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn word_char(b: u8) -> bool {
    ident_char(b) || b == b'-'
}

/// One element of an expression as pest lists it: operators and operands in source order.
enum Part {
    Prefix(UnOp, Span),
    Infix(BinOp),
    Operand(Expr, usize),
}

impl Part {
    /// The binding power pest's Pratt parser gives it (`lower::PRATT`, steps of 10).
    fn power(&self) -> u32 {
        match self {
            Part::Prefix(UnOp::Not, _) => 30,
            Part::Prefix(UnOp::Neg, _) => 70,
            Part::Infix(op) => infix_power(*op),
            Part::Operand(..) => 0,
        }
    }
}

fn infix_power(op: BinOp) -> u32 {
    match op {
        BinOp::Or => 10,
        BinOp::And => 20,
        BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 40,
        BinOp::Add | BinOp::Sub => 50,
        BinOp::Mul | BinOp::Div | BinOp::Mod => 60,
    }
}

struct Parser<'a> {
    b: &'a [u8],
    text: &'a str,
    pos: usize,
    /// Where the last token ended (a statement's span ends there, not after trivia).
    last_end: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    /// The grammar's `WHITESPACE`: spaces, tabs, newlines, carriage returns and comments.
    fn skip(&mut self) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' | b'\n' | b'\r' => self.pos += 1,
                b'#' => {
                    self.pos = match memchr_newline(&self.b[self.pos..]) {
                        Some(i) => self.pos + i,
                        None => self.b.len(),
                    }
                }
                _ => return,
            }
        }
    }

    /// A token that ends at `end`.
    fn token(&mut self, end: usize) -> Span {
        let span = Span::new(self.pos, end);
        self.pos = end;
        self.last_end = end;
        span
    }

    /// `"kw" ~ !ident_char` (the grammar's `kw_*` and word operators).
    fn kw(&mut self, kw: &str) -> bool {
        if self.b[self.pos..].starts_with(kw.as_bytes())
            && !ident_char(self.at(self.pos + kw.len()))
        {
            self.token(self.pos + kw.len());
            true
        } else {
            false
        }
    }

    /// A literal punctuation token.
    fn punct(&mut self, s: &str) -> Option<Span> {
        self.b[self.pos..]
            .starts_with(s.as_bytes())
            .then(|| self.token(self.pos + s.len()))
    }

    /// The end of the run of word characters from `from`.
    fn run_end(&self, from: usize) -> usize {
        let mut i = from;
        while i < self.b.len() && word_char(self.b[i]) {
            i += 1;
        }
        i
    }

    /// The grammar's `keyword`: a reserved word not followed by a word character. (No
    /// keyword is a prefix of another, so this is the run of word characters being one.)
    fn keyword_here(&self) -> bool {
        let word = &self.b[self.pos..self.run_end(self.pos)];
        KEYWORDS.iter().any(|k| k.as_bytes() == word)
    }

    /// `!keyword ~ ASCII_ALPHA ~ (ASCII_ALPHANUMERIC | "_" | "-")*`: a rule name, verb,
    /// subject, site or action word.
    fn word(&mut self) -> Option<Ident> {
        if !self.peek()?.is_ascii_alphabetic() || self.keyword_here() {
            return None;
        }
        let start = self.pos;
        let span = self.token(self.run_end(start));
        Some(Ident {
            name: self.text[start..self.pos].to_string(),
            span,
        })
    }

    /// The grammar's `name`: a fact or a `let`, maybe dotted.
    fn name(&mut self) -> Option<Span> {
        if !self.peek()?.is_ascii_alphabetic() || self.keyword_here() {
            return None;
        }
        let mut i = self.pos + 1;
        loop {
            while i < self.b.len() && ident_char(self.b[i]) {
                i += 1;
            }
            if self.at(i) == b'.' && self.at(i + 1).is_ascii_alphabetic() {
                i += 2;
            } else {
                break;
            }
        }
        Some(self.token(i))
    }

    fn ident_of(&self, span: Span) -> Ident {
        Ident {
            name: self.text[span.start as usize..span.end as usize].to_string(),
            span,
        }
    }

    fn statement_span(&self, start: usize) -> Span {
        Span::new(start, self.last_end)
    }

    fn let_def(&mut self, start: usize) -> Option<LetDef> {
        self.skip();
        let name = self.name()?;
        let name = self.ident_of(name);
        self.skip();
        // `equals = @{ "=" ~ !"=" }`
        if self.peek() != Some(b'=') || self.at(self.pos + 1) == b'=' {
            return None;
        }
        self.token(self.pos + 1);
        self.skip();
        let expr = self.expr()?;
        Some(LetDef {
            name,
            expr,
            span: self.statement_span(start),
        })
    }

    fn verdict(&mut self) -> Option<Ident> {
        let start = self.pos;
        (self.kw("refuse") || self.kw("hold") || self.kw("warn"))
            .then(|| self.ident_of(Span::new(start, self.pos)))
    }

    fn verb_list(&mut self) -> Option<Vec<Ident>> {
        let mut verbs = vec![self.word()?];
        loop {
            self.skip();
            if self.punct(",").is_none() {
                return Some(verbs);
            }
            self.skip();
            verbs.push(self.word()?);
        }
    }

    /// `[at site]`, after trivia.
    fn site(&mut self) -> Option<Option<Ident>> {
        if !self.kw("at") {
            return Some(None);
        }
        self.skip();
        let site = self.word()?;
        self.skip();
        Some(Some(site))
    }

    /// `[kw expr]`, after trivia; the trivia after it skipped.
    fn clause(&mut self, kw: &str) -> Option<Option<Expr>> {
        if !self.kw(kw) {
            return Some(None);
        }
        self.skip();
        let e = self.expr()?;
        self.skip();
        Some(Some(e))
    }

    /// `[say string+]`, after trivia.
    fn say(&mut self) -> Option<Option<Message>> {
        if !self.kw("say") {
            return Some(None);
        }
        self.skip();
        let mut parts = Vec::new();
        let mut span = self.string(Some(&mut parts))?.0;
        loop {
            self.skip();
            if self.peek() != Some(b'"') {
                break;
            }
            span = span.to(self.string(Some(&mut parts))?.0);
        }
        Some(Some(Message { parts, span }))
    }

    fn rule_def(&mut self, start: usize) -> Option<RuleDef> {
        self.skip();
        let name = self.word()?;
        self.skip();
        let audit = self.kw("audit");
        self.skip();
        let verdict = self.verdict()?;
        self.skip();
        let verbs = self.verb_list()?;
        let subject = self.word()?;
        self.skip();
        let site = self.site()?;
        let when = self.clause("when")?;
        let unless = self.clause("unless")?;
        let reason = if self.kw("reason") {
            self.skip();
            let r = self.word()?;
            self.skip();
            Some(r)
        } else {
            None
        };
        let say = self.say()?;
        Some(RuleDef {
            name,
            audit,
            verdict,
            verbs,
            subject,
            site,
            when,
            unless,
            reason,
            say,
            span: self.statement_span(start),
        })
    }

    fn allow_def(&mut self, start: usize) -> Option<AllowDef> {
        self.skip();
        let verbs = self.verb_list()?;
        let subject = self.word()?;
        self.skip();
        let site = self.site()?;
        Some(AllowDef {
            verbs,
            subject,
            site,
            span: self.statement_span(start),
        })
    }

    fn invariant_def(&mut self, start: usize) -> Option<InvariantDef> {
        self.skip();
        let name = self.word()?;
        self.skip();
        let sequential = self.kw("sequential");
        self.skip();
        let when = self.clause("when")?;
        let unless = self.clause("unless")?;
        let ensure = Some(self.clause("ensure")??);
        let say = self.say()?;
        Some(InvariantDef {
            name,
            sequential,
            when,
            unless,
            ensure,
            say,
            span: self.statement_span(start),
        })
    }

    fn plan_def(&mut self, start: usize) -> Option<PlanDef> {
        self.skip();
        let verb = self.word()?;
        self.skip();
        let subject = self.word()?;
        // `plan_kind`: `"` (ASCII_ALPHANUMERIC | "-" | "_")* `"`, its name unquoted.
        self.skip();
        let kind = if self.peek() == Some(b'"') {
            let open = self.pos;
            let mut i = open + 1;
            while i < self.b.len()
                && (self.b[i].is_ascii_alphanumeric() || self.b[i] == b'-' || self.b[i] == b'_')
            {
                i += 1;
            }
            if self.at(i) != b'"' {
                return None;
            }
            let span = self.token(i + 1);
            Some(Ident {
                name: self.text[open + 1..i].to_string(),
                span,
            })
        } else {
            None
        };
        let mut steps = Vec::new();
        loop {
            self.skip();
            let step_start = self.pos;
            if !self.kw("do") {
                break;
            }
            self.skip();
            let mut words = vec![self.word()?];
            loop {
                self.skip();
                match self.word() {
                    Some(w) => words.push(w),
                    None => break,
                }
            }
            let within = self.within()?;
            let when = self.clause("when")?;
            let unless = self.clause("unless")?;
            let say = self.say()?;
            steps.push(Step {
                words,
                within,
                when,
                unless,
                say,
                span: self.statement_span(step_start),
            });
        }
        Some(PlanDef {
            verb,
            subject,
            kind,
            steps,
            span: self.statement_span(start),
        })
    }

    /// `within_clause`: `within` and a `duration` (`ASCII_DIGIT+ ~ ("s" | "m" | "h") ~
    /// !ident_char`), or nothing; `None` when `within` is not followed by a duration.
    fn within(&mut self) -> Option<Option<Within>> {
        self.skip();
        let start = self.pos;
        if !self.kw("within") {
            return Some(None);
        }
        self.skip();
        let digits = self.pos;
        let mut i = digits;
        while self.at(i).is_ascii_digit() {
            i += 1;
        }
        let unit = self.at(i);
        if i == digits || !matches!(unit, b's' | b'm' | b'h') || ident_char(self.at(i + 1)) {
            return None;
        }
        let scale: u64 = match unit {
            b'h' => 3600,
            b'm' => 60,
            _ => 1,
        };
        let secs = self.text[digits..i]
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale));
        self.token(i + 1);
        Some(Some(Within {
            secs,
            span: self.statement_span(start),
        }))
    }

    /// A string literal from its opening quote: its span, its text (placeholders left
    /// out) and whether it has a placeholder. With `parts`, its text and placeholders are
    /// appended there (a message's parts; adjacent text merged), placeholders lowered.
    fn string(&mut self, mut parts: Option<&mut Vec<MessagePart>>) -> Option<(Span, String, bool)> {
        let start = self.pos;
        if self.peek() != Some(b'"') {
            return None;
        }
        self.pos += 1;
        let mut text = String::new();
        let mut has_placeholder = false;
        let push = |parts: &mut Option<&mut Vec<MessagePart>>, text: &mut String, s: &str| {
            text.push_str(s);
            if let Some(parts) = parts.as_deref_mut() {
                match parts.last_mut() {
                    Some(MessagePart::Text(t)) => t.push_str(s),
                    _ => parts.push(MessagePart::Text(s.to_string())),
                }
            }
        };
        loop {
            let b = self.peek()?;
            match b {
                b'"' => {
                    self.pos += 1;
                    break;
                }
                b'\\' => {
                    let s = match self.at(self.pos + 1) {
                        b'"' => "\"",
                        b'\\' => "\\",
                        b'n' => "\n",
                        b't' => "\t",
                        _ => return None,
                    };
                    push(&mut parts, &mut text, s);
                    self.pos += 2;
                }
                b'{' if self.at(self.pos + 1) == b'{' => {
                    push(&mut parts, &mut text, "{");
                    self.pos += 2;
                }
                b'}' => {
                    if self.at(self.pos + 1) != b'}' {
                        return None;
                    }
                    push(&mut parts, &mut text, "}");
                    self.pos += 2;
                }
                b'{' => {
                    self.pos += 1;
                    self.skip();
                    let e = self.expr()?;
                    self.skip();
                    if self.peek() != Some(b'}') {
                        return None;
                    }
                    self.pos += 1;
                    has_placeholder = true;
                    if let Some(parts) = parts.as_deref_mut() {
                        parts.push(MessagePart::Placeholder(e));
                    }
                }
                b'\n' => return None,
                _ => {
                    let from = self.pos;
                    while let Some(b) = self.peek() {
                        if matches!(b, b'"' | b'\\' | b'{' | b'}' | b'\n') {
                            break;
                        }
                        self.pos += 1;
                    }
                    // Stopped at ASCII: a character boundary.
                    let s = self.text.get(from..self.pos)?;
                    push(&mut parts, &mut text, s);
                }
            }
        }
        self.last_end = self.pos;
        Some((Span::new(start, self.pos), text, has_placeholder))
    }

    /// An expression where lowering checks its depth (a clause, a `let`, a placeholder).
    fn expr(&mut self) -> Option<Expr> {
        let (e, depth) = self.expr_depth()?;
        (depth <= MAX_DEPTH).then_some(e)
    }

    /// `prefix* ~ primary ~ (infix ~ prefix* ~ primary)*`, then pest's Pratt parser over
    /// the parts.
    fn expr_depth(&mut self) -> Option<(Expr, usize)> {
        let mut parts = Vec::new();
        loop {
            loop {
                let start = self.pos;
                let op = if self.kw("not") {
                    UnOp::Not
                } else if self.punct("-").is_some() {
                    UnOp::Neg
                } else {
                    break;
                };
                parts.push(Part::Prefix(op, Span::new(start, self.pos)));
                self.skip();
            }
            let (e, d) = self.primary()?;
            parts.push(Part::Operand(e, d));
            self.skip();
            let Some(op) = self.infix() else { break };
            parts.push(Part::Infix(op));
            self.skip();
        }
        if parts.len() > MAX_EXPRESSION_PARTS {
            return None;
        }
        let mut parts = parts.into_iter().peekable();
        pratt(&mut parts, 0)
    }

    fn infix(&mut self) -> Option<BinOp> {
        if self.kw("or") {
            return Some(BinOp::Or);
        }
        if self.kw("and") {
            return Some(BinOp::And);
        }
        let (op, len) = match (self.peek()?, self.at(self.pos + 1)) {
            (b'=', b'=') => (BinOp::Eq, 2),
            (b'!', b'=') => (BinOp::Ne, 2),
            (b'<', b'=') => (BinOp::Le, 2),
            (b'>', b'=') => (BinOp::Ge, 2),
            (b'<', _) => (BinOp::Lt, 1),
            (b'>', _) => (BinOp::Gt, 1),
            (b'+', _) => (BinOp::Add, 1),
            (b'-', _) => (BinOp::Sub, 1),
            (b'*', _) => (BinOp::Mul, 1),
            (b'/', _) => (BinOp::Div, 1),
            (b'%', _) => (BinOp::Mod, 1),
            _ => return None,
        };
        self.token(self.pos + len);
        Some(op)
    }

    /// `name | int | paren | string | kw_true | kw_false`, and its depth.
    fn primary(&mut self) -> Option<(Expr, usize)> {
        let start = self.pos;
        let b = self.peek()?;
        if b.is_ascii_alphabetic() {
            if let Some(span) = self.name() {
                let name = self.text[start..self.pos].to_string();
                return Some((
                    Expr {
                        kind: ExprKind::Name(name),
                        span,
                    },
                    0,
                ));
            }
            let kind = if self.kw("true") {
                ExprKind::Bool(true)
            } else if self.kw("false") {
                ExprKind::Bool(false)
            } else {
                return None;
            };
            let span = Span::new(start, self.pos);
            return Some((Expr { kind, span }, 0));
        }
        if b.is_ascii_digit() {
            let mut i = start;
            while i < self.b.len() && self.b[i].is_ascii_digit() {
                i += 1;
            }
            let next = self.at(i);
            if next.is_ascii_alphabetic() || next == b'_' {
                return None;
            }
            let value = self.text[start..i].parse::<i64>().ok()?;
            let span = self.token(i);
            return Some((
                Expr {
                    kind: ExprKind::Int(value),
                    span,
                },
                0,
            ));
        }
        if b == b'(' {
            self.token(start + 1);
            self.skip();
            let (mut e, depth) = self.expr_depth()?;
            self.skip();
            self.punct(")")?;
            e.span = Span::new(start, self.pos);
            return Some((e, depth));
        }
        if b == b'"' {
            let (span, text, has_placeholder) = self.string(None)?;
            return Some((
                Expr {
                    kind: ExprKind::Str(text, has_placeholder),
                    span,
                },
                0,
            ));
        }
        None
    }
}

/// pest's Pratt parser (`pratt_parser.rs`: `expr`, `nud`, `led`, `lbp`) over the parts,
/// with lowering's nodes; `None` where lowering would report a tree too deep.
fn pratt(
    parts: &mut std::iter::Peekable<std::vec::IntoIter<Part>>,
    rbp: u32,
) -> Option<(Expr, usize)> {
    let (mut lhs, mut depth) = match parts.next()? {
        Part::Prefix(op, span) => {
            let p = if op == UnOp::Not { 30 } else { 70 };
            let (rhs, d) = pratt(parts, p - 1)?;
            let span = span.to(rhs.span);
            node(ExprKind::Unary(op, Box::new(rhs)), span, d + 1)?
        }
        Part::Operand(e, d) => (e, d),
        Part::Infix(..) => return None,
    };
    while rbp < parts.peek().map_or(0, Part::power) {
        let Some(Part::Infix(op)) = parts.next() else {
            return None;
        };
        let (rhs, rd) = pratt(parts, infix_power(op))?;
        let span = lhs.span.to(rhs.span);
        (lhs, depth) = node(
            ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
            span,
            depth.max(rd) + 1,
        )?;
    }
    Some((lhs, depth))
}

/// Lowering's node: a tree deeper than [`MAX_DEPTH`] is an error there, so pest must parse.
fn node(kind: ExprKind, span: Span, depth: usize) -> Option<(Expr, usize)> {
    (depth <= MAX_DEPTH).then_some((Expr { kind, span }, depth))
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What pest and lowering make of `text` (no fast path).
    fn by_pest(text: &str) -> Option<File> {
        let (file, errors) = super::super::recover::parse_with_pest(0, text);
        errors.is_empty().then_some(file)
    }

    /// The fast parser agrees with pest wherever it answers, and answers on `must`.
    fn agrees(text: &str, must: bool) {
        // As `parse_recovering` calls it: after the nesting scan.
        let fast = super::super::depth::too_deep(text)
            .is_none()
            .then(|| parse(text))
            .flatten();
        if must {
            assert!(fast.is_some(), "the fast parser gave up on:\n{text}");
        }
        if let Some(fast) = fast {
            let slow = by_pest(text);
            assert_eq!(Some(fast), slow, "the parsers disagree on:\n{text}");
        }
    }

    fn rule_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() && !matches!(name, "target" | ".git" | "node_modules") {
                rule_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rules") {
                out.push(p);
            }
        }
    }

    #[test]
    fn agrees_with_pest_on_every_rule_file_in_the_repository() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        rule_files(root, &mut files);
        assert!(files.len() > 20, "{files:?}");
        let mut fast = 0;
        for f in &files {
            let text = std::fs::read_to_string(f).expect("readable");
            agrees(&text, false);
            fast += usize::from(parse(&text).is_some());
            // Every prefix of a file, cut at each line: most of them do not parse.
            let mut cut = 0;
            for line in text.split_inclusive('\n') {
                cut += line.len();
                agrees(&text[..cut], false);
                agrees(&text[..cut - line.len() / 2], false);
            }
        }
        // The shipped rules, and most test files, take the fast path.
        for f in ["admission.rules", "removal.rules", "invariants.rules"] {
            let text = std::fs::read_to_string(root.join("rules").join(f)).expect("readable");
            agrees(&text, true);
        }
        assert!(fast * 2 > files.len(), "{fast} of {}", files.len());
    }

    #[test]
    fn agrees_with_pest_on_the_corners_of_the_grammar() {
        for text in [
            "",
            "  # only a comment",
            "let a = 1\n",
            "let a.b = x.y.z",
            "let a = not-x",
            "let a = true-x",
            "let a = when-x",
            "let a = a and-b or-c",
            "let a = nothing or notx and not_y",
            "let a = - - 1 * -x",
            "let a = not a == b and c or d",
            "let a = a == not b < c and d",
            "let a = not not a or b",
            "let a = 1 < 2 < 3 == 4 != 5 <= 6 >= 7 > 8",
            "let a = 1 + 2 - 3 * 4 / 5 % 6",
            "let a = ((a)) + (b * (c - d))",
            "let a = \"x {b} {{c}} \\\" \\\\ \\n \\t\" == \"\"",
            "let a = 9223372036854775807",
            "let a = 9223372036854775808",
            "let a = 1x",
            "let a = 1_",
            "let a = a.1",
            "let a == 1",
            "let a =1\r\nlet b\t=\t2 # c\nlet c = 3#",
            "let when = 1",
            "let whenever = 1",
            "rule r refuse remove worker",
            "rule r-1_x refuse remove , unapprove ,approve controlplane at webhook when a unless b reason R-x say \"m {a + 1}\" \"n\" \"{{o}}\"",
            "rule r warn leave worker at controller say \"a\"\"b\"",
            "rule r hold apply controlplane at controller reason X",
            "rule r refuse remove worker at-x",
            "rule r refuse remove worker when-x",
            "rule when refuse remove worker",
            "rule r refuse when worker",
            "rule r refuse remove worker say \"a\" say \"b\"",
            "rule r refuse remove worker say \"{a\"",
            "rule r refuse remove worker say \"a}\"",
            "rule r refuse remove worker say \"a\nb\"",
            "rule r refuse remove worker say \"\\x\"",
            "rule r refuse remove worker say \"é {  a  } ü\"",
            "allow remove worker",
            "allow remove, approve worker at webhook",
            "allow remove worker at",
            "plan remove controlplane\n  do lock cluster\n  do drain node unless member.dead\n  do event warning X when member.dead say \"x\"",
            "plan remove controlplane",
            "plan remove controlplane do",
            "plan remove controlplane do x y-z when a unless b say \"s\" do w",
            "invariant i ensure a",
            "rule r audit refuse remove worker say \"s\"",
            "rule audit refuse remove worker say \"s\"",
            "rule audit audit warn remove worker say \"s\"",
            "rule r audit audit refuse remove worker say \"s\"",
            "rule r audit remove worker say \"s\"",
            "invariant sequential ensure a",
            "invariant i sequential when a unless b ensure c say \"d\"",
            "invariant i when a",
            "invariant i ensure a ensure b",
            "rule r refuse remove worker when a <",
            "rule r refuse remove worker when a = b",
            "rule r refuse remove worker when (a",
            "rule r refuse remove worker when a)",
            "let a = \"{\"x\"}\"",
            "let a = \"{not}\"",
            "let a = {a}",
            "ru le",
            "let a = 1 let b = 2 rule r refuse remove worker allow x y plan a b invariant i ensure 1",
        ] {
            agrees(text, false);
        }
        assert!(parse("let a = 9223372036854775808").is_none());
        assert!(parse("rule r refuse remove worker when a and b say \"c {d}\"").is_some());
    }

    /// Token soups from the grammar's own vocabulary: wherever the fast parser answers, it
    /// answers as pest does.
    #[test]
    fn agrees_with_pest_on_token_soups() {
        use proptest::prelude::*;
        const TOKENS: &[&str] = &[
            "let ",
            "rule ",
            "allow ",
            "plan ",
            "invariant ",
            "ensure ",
            "do ",
            "refuse ",
            "hold ",
            "warn ",
            "at ",
            "when ",
            "unless ",
            "reason ",
            "say ",
            "and",
            "or",
            "not",
            "true",
            "false",
            "sequential",
            "a",
            "b.c",
            "x-y",
            "r_1",
            " ",
            "\n",
            "# c\n",
            "=",
            "==",
            "!=",
            "<",
            "<=",
            ">",
            ">=",
            "+",
            "-",
            "*",
            "/",
            "%",
            "(",
            ")",
            ",",
            "1",
            "42",
            "\"t\"",
            "\"{a}\"",
            "\"{{\"",
            "\"",
            "{",
            "}",
            "\\",
            ".",
            "-x",
            "é",
        ];
        let soup = proptest::collection::vec(proptest::sample::select(TOKENS), 0..24)
            .prop_map(|ts| ts.concat());
        let valid_prefix = proptest::sample::select(
            &[
                "let a = ",
                "rule r refuse remove worker when ",
                "rule r refuse remove worker say \"",
                "plan remove controlplane do x ",
                "invariant i ensure ",
                "",
            ][..],
        );
        proptest!(ProptestConfig::with_cases(4000), |(p in valid_prefix, s in soup)| {
            agrees(&format!("{p}{s}"), false);
        });
    }

    /// Whole files built from the grammar (every statement and clause, expressions of every
    /// operator, prefix and operand, strings with escapes and placeholders, comments and
    /// odd trivia between any two tokens): nearly all parse, so the fast parser answers,
    /// and its tree must be pest's, spans included.
    #[test]
    fn agrees_with_pest_on_generated_files() {
        use proptest::prelude::*;
        use proptest::sample::select;
        fn expr() -> BoxedStrategy<String> {
            let leaf = prop_oneof![
                select(
                    &[
                        "approved",
                        "count",
                        "member.dead",
                        "cluster.exists",
                        "a_b",
                        "x1.y2.z3",
                        "nothing",
                        "notx",
                        "order",
                        "android",
                        "true",
                        "false",
                        "true-x"
                    ][..]
                )
                .prop_map(str::to_string),
                (0i64..1_000_000).prop_map(|i| i.to_string()),
                select(
                    &[
                        "\"s\"",
                        "\"\"",
                        "\"a\\\"b\\\\c\\nd\\te\"",
                        "\"{{x}} é ü\"",
                        "\"v {approved + 1}\""
                    ][..]
                )
                .prop_map(str::to_string),
            ];
            leaf.prop_recursive(4, 24, 3, |inner| {
                prop_oneof![
                    (
                        inner.clone(),
                        select(
                            &[
                                "or", "and", "==", "!=", "<=", ">=", "<", ">", "+", "-", "*", "/",
                                "%"
                            ][..]
                        ),
                        inner.clone(),
                        select(&[" ", "", "  ", "\n "][..])
                    )
                        .prop_map(|(l, op, r, ws)| {
                            let ws = if op.chars().all(char::is_alphabetic) && ws.is_empty() {
                                " "
                            } else {
                                ws
                            };
                            format!("{l}{ws}{op}{ws}{r}")
                        }),
                    (select(&["not ", "- ", "-", "not("][..]), inner.clone()).prop_map(|(p, e)| {
                        if p == "not(" {
                            format!("not({e})")
                        } else {
                            format!("{p}{e}")
                        }
                    }),
                    inner.prop_map(|e| format!("( {e})")),
                ]
            })
            .boxed()
        }
        let pick = |xs: &'static [&'static str]| select(xs).prop_map(str::to_string).boxed();
        let trivia = pick(&[" ", "\n", "\t", " # comment\n", "\r\n", "  \n\n  "]);
        let words = pick(&["remove", "approve", "leave", "unapprove", "apply", "start"]);
        let subject = pick(&["controlplane", "worker", "machine", "cluster", "operation"]);
        let message = (expr(), pick(&["", " \"more\"", "\"tail {count}\""]))
            .prop_map(|(e, more)| format!("\"m {{{e}}} {{{{lit}}}}\"{more}"))
            .boxed();
        let rule = (
            (
                pick(&["r", "r-1", "r_x", "when-x", "sequential", "audit"]),
                pick(&["refuse", "hold", "warn", "audit refuse", "audit warn"]),
            ),
            (
                words.clone(),
                proptest::option::of(words.clone()),
                subject.clone(),
            ),
            (
                proptest::option::of(pick(&["webhook", "controller"])),
                proptest::option::of(expr()),
                proptest::option::of(expr()),
            ),
            (
                proptest::option::of(pick(&["Reason", "R-x_1"])),
                proptest::option::of(message.clone()),
            ),
            trivia.clone(),
        )
            .prop_map(
                |((name, verdict), (v1, v2, subj), (site, when, unless), (reason, say), t)| {
                    let mut s = format!("rule{t}{name}{t}{verdict} {v1}");
                    if let Some(v2) = v2 {
                        s += &format!("{t},{t}{v2}");
                    }
                    s += &format!(" {subj}");
                    if let Some(site) = site {
                        s += &format!("{t}at {site}");
                    }
                    if let Some(w) = when {
                        s += &format!("{t}when {w}");
                    }
                    if let Some(u) = unless {
                        s += &format!("{t}unless{t}{u}");
                    }
                    if let Some(r) = reason {
                        s += &format!(" reason {r}");
                    }
                    if let Some(m) = say {
                        s += &format!("{t}say {m}");
                    }
                    s
                },
            );
        let item = prop_oneof![
            rule,
            (pick(&["a", "b.c", "after"]), expr(), trivia.clone())
                .prop_map(|(n, e, t)| format!("let {n}{t}={t}{e}")),
            (
                words.clone(),
                subject.clone(),
                proptest::option::of(pick(&["webhook", "controller"]))
            )
                .prop_map(|(v, s, site)| match site {
                    Some(site) => format!("allow {v}, leave {s} at {site}"),
                    None => format!("allow {v} {s}"),
                }),
            (
                words,
                subject,
                proptest::collection::vec(
                    (
                        proptest::option::of(expr()),
                        proptest::option::of(message.clone())
                    ),
                    0..3
                )
            )
                .prop_map(|(v, s, steps)| {
                    let mut out = format!("plan {v} {s}");
                    for (i, (when, say)) in steps.into_iter().enumerate() {
                        out += &format!("\n  do lock cluster-{i} x");
                        if let Some(w) = when {
                            out += &format!(" when {w}");
                        }
                        if let Some(m) = say {
                            out += &format!(" say {m}");
                        }
                    }
                    out
                }),
            (
                proptest::bool::ANY,
                proptest::option::of(expr()),
                expr(),
                proptest::option::of(message)
            )
                .prop_map(|(seq, when, ensure, say)| {
                    let mut s = format!("invariant inv{}", if seq { " sequential" } else { "" });
                    if let Some(w) = when {
                        s += &format!(" when {w}");
                    }
                    s += &format!(" ensure {ensure}");
                    if let Some(m) = say {
                        s += &format!(" say {m}");
                    }
                    s
                }),
        ];
        let file = (proptest::collection::vec((item, trivia), 0..6)).prop_map(|items| {
            items
                .into_iter()
                .map(|(i, t)| format!("{i}{t}"))
                .collect::<String>()
        });
        let answered = std::cell::Cell::new(0u32);
        proptest!(ProptestConfig::with_cases(3000), |(text in file)| {
            if parse(&text).is_some() {
                answered.set(answered.get() + 1);
            }
            agrees(&text, false);
        });
        // Most generated files parse: the comparison is of trees, not of refusals.
        assert!(answered.get() > 1500, "{} of 3000 answered", answered.get());
    }

    /// The keyword list above is the grammar's.
    #[test]
    fn keywords_are_the_grammars() {
        let grammar = include_str!("../../grammar/rules.pest");
        let line = grammar
            .lines()
            .find(|l| l.starts_with("keyword = "))
            .expect("the grammar has a keyword rule");
        let words: Vec<&str> = line
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|w| w.chars().all(|c| c.is_ascii_alphabetic()))
            .collect();
        assert_eq!(words, KEYWORDS);
    }

    /// The fast parser mirrors `grammar/rules.pest` as it is: a change there must be made
    /// here too (or checked to need nothing), and then this fingerprint updated.
    #[test]
    fn the_grammar_is_the_one_mirrored() {
        let grammar = include_str!("../../grammar/rules.pest");
        // The rules only, without comments and blank lines (rewording a comment is free).
        let rules: String = grammar
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        // FNV-1a, 64 bits.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in rules.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        assert_eq!(
            h, 0x803a_c86f_8dde_3fd4,
            "grammar/rules.pest changed: src/syntax/fast.rs mirrors it (it parses files that \
             parse, pest reports errors). Make the same change there, run its tests, then set \
             this fingerprint to {h:#x}"
        );
    }
}
