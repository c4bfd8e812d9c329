//! Diagnostics: every error and warning the front end finds, with a stable code, a span,
//! a label and a help line. The source text is attached only when printing.

use crate::span::Span;
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan};
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// Declares the diagnostic codes: each variant, its stable text, and whether some rule text
/// can produce it (the others come from reading files or from a bug, not from a rule).
macro_rules! codes {
    ($($(#[doc = $doc:literal])* $variant:ident $text:literal $from_rules:literal;)*) => {
        /// Every diagnostic code the tools report. The text is stable (CI scripts match on it);
        /// [`Code::ALL`] lets tests check that each is documented and has a snapshot.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Code {
            /// Every code, in declaration order.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The stable text, such as `ichor::check::unknown_fact`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $text,)*
                }
            }

            /// Whether a rule file can produce it (so a bad file under `tests/rules/bad`
            /// must); the others are about reading files, or a bug.
            pub const fn from_rules(self) -> bool {
                match self {
                    $(Code::$variant => $from_rules,)*
                }
            }
        }
    };
}

codes! {
    /// The parser expected something else here.
    SyntaxExpected "ichor::syntax::expected" true;
    /// An integer literal does not fit in 64 bits.
    SyntaxIntTooLarge "ichor::syntax::int_too_large" true;
    /// An expression nests too deep or has too many parts.
    SyntaxTooComplex "ichor::syntax::too_complex" true;
    UnknownName "ichor::check::unknown_name" true;
    FactUnavailable "ichor::check::fact_unavailable" true;
    TypeMismatch "ichor::check::type_mismatch" true;
    NotACondition "ichor::check::not_a_condition" true;
    UnknownEnumValue "ichor::check::unknown_enum_value" true;
    PlaceholderOutsideMessage "ichor::check::placeholder_outside_message" true;
    UnknownVerb "ichor::check::unknown_verb" true;
    UnknownSubject "ichor::check::unknown_subject" true;
    UnknownSite "ichor::check::unknown_site" true;
    ImpossibleEvent "ichor::check::impossible_event" true;
    HoldAtWebhook "ichor::check::hold_at_webhook" true;
    HoldNeedsReason "ichor::check::hold_needs_reason" true;
    BadReason "ichor::check::bad_reason" true;
    MissingMessage "ichor::check::missing_message" true;
    DuplicateRule "ichor::check::duplicate_rule" true;
    DuplicateLet "ichor::check::duplicate_let" true;
    DuplicatePlan "ichor::check::duplicate_plan" true;
    LetShadowsFact "ichor::check::let_shadows_fact" true;
    CyclicLet "ichor::check::cyclic_let" true;
    UnknownAction "ichor::check::unknown_action" true;
    PlanNotAtController "ichor::check::plan_not_at_controller" true;
    PlanGroup "ichor::check::plan_group" true;
    /// A plan with disruptive steps that does not take the cluster lock first.
    PlanWithoutLock "ichor::check::plan_without_lock" true;
    /// An operation's plan without its kind, with a kind that is none, or a kind on a plan
    /// that is not an operation's.
    PlanKind "ichor::check::plan_kind" true;
    /// A step's `within`: on an action that does not wait, missing on one that must, zero
    /// or longer than a day.
    StepTimeout "ichor::check::step_timeout" true;
    /// A step of one procedure in the plan of another (`etcd leave` in an operation).
    ActionNotInPlan "ichor::check::action_not_in_plan" true;
    /// `wait node-back` with no step before it that takes the node down and back (a
    /// reboot, an upgrade, a rollback): it would pass at once.
    WaitWithoutReboot "ichor::check::wait_without_reboot" true;
    Arithmetic "ichor::check::arithmetic" true;
    UnusedLet "ichor::lint::unused_let" true;
    AlwaysTrue "ichor::lint::always_true" true;
    NeverTrue "ichor::lint::never_true" true;
    UnlessNever "ichor::lint::unless_never" true;
    Subsumed "ichor::lint::subsumed" true;
    NotAnalysed "ichor::lint::not_analysed" true;
    AllowContradicted "ichor::lint::allow_contradicted" true;
    UncoveredEvent "ichor::lint::uncovered_event" true;
    /// A `refuse` on a destructive event (a control plane removed or leaving, an operation
    /// that may reset one) in audit mode: it refuses nothing.
    AuditDestructive "ichor::lint::audit_destructive" true;
    /// A rule file could not be read.
    InputUnreadable "ichor::input::unreadable" false;
    /// The compiled form would need more entries than its 32-bit indices hold (no rule text
    /// within the front end's size limits gets there).
    CompileTooLarge "ichor::compile::too_large" false;
    /// A bug: the checker passed what the compiler cannot build.
    Internal "ichor::internal" false;
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl PartialEq<str> for Code {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Code {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// One finding in one file.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// Stable code, such as `ichor::check::unknown_fact`.
    pub code: Code,
    pub severity: Severity,
    /// Index into the rule set's source files.
    pub file: usize,
    pub span: Span,
    /// Short, lowercase, user input in backticks, no final period.
    pub message: String,
    /// The text on the label under the span.
    pub label: String,
    /// How to fix it.
    pub help: Option<String>,
    /// False for a finding about the rule set as a whole (no place in a file to point at).
    pub located: bool,
    /// Other places it is about (the first definition of a duplicate, the rule that subsumes
    /// this one), shown under the primary label: not written into the help text.
    pub secondary: Vec<Label>,
}

/// A secondary label: a place in a rule file and what it has to do with the diagnostic.
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    /// Index into the rule set's source files (may differ from the diagnostic's).
    pub file: usize,
    pub span: Span,
    pub message: String,
}

impl Diagnostic {
    pub fn error(code: Code, file: usize, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Error,
            file,
            span,
            message: message.into(),
            label: String::new(),
            help: None,
            located: true,
            secondary: Vec::new(),
        }
    }

    /// A finding about the rule set as a whole, not a place in it.
    pub fn unlocated(mut self) -> Self {
        self.located = false;
        self
    }

    pub fn warning(code: Code, file: usize, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, file, span, message)
        }
    }

    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Adds a secondary label: another place, in `file`, the diagnostic is about.
    pub fn secondary(mut self, file: usize, span: Span, message: impl Into<String>) -> Self {
        self.secondary.push(Label {
            file,
            span,
            message: message.into(),
        });
        self
    }

    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// One rule file's text, shared by the diagnostics that point into it.
#[derive(Clone, Debug)]
pub struct SourceFile {
    pub path: PathBuf,
    pub text: Arc<str>,
    /// Byte offsets where lines start, for line numbers in O(log n).
    line_starts: Arc<[u32]>,
    /// Per line, whether it is ASCII (its columns are byte offsets: no counting).
    line_ascii: Arc<[bool]>,
}

impl SourceFile {
    pub fn new(path: impl Into<PathBuf>, text: impl Into<Arc<str>>) -> SourceFile {
        let text: Arc<str> = text.into();
        let line_starts = std::iter::once(0)
            .chain(
                text.bytes()
                    .enumerate()
                    .filter(|(_, b)| *b == b'\n')
                    .map(|(i, _)| u32::try_from(i + 1).unwrap_or(u32::MAX)),
            )
            .collect::<Arc<[u32]>>();
        let line_ascii = line_starts
            .iter()
            .enumerate()
            .map(|(i, start)| {
                let end = line_starts.get(i + 1).map_or(text.len(), |e| *e as usize);
                text.as_bytes()
                    .get(*start as usize..end)
                    .is_some_and(|l| l.is_ascii())
            })
            .collect();
        SourceFile {
            path: path.into(),
            text,
            line_starts,
            line_ascii,
        }
    }

    /// The 0-based line holding a byte offset.
    fn line_of(&self, offset: usize) -> usize {
        let off32 = u32::try_from(offset).unwrap_or(u32::MAX);
        self.line_starts
            .partition_point(|s| *s <= off32)
            .saturating_sub(1)
    }

    /// Where 0-based line `line` starts, and where it ends (after its newline, if any).
    fn line_bounds(&self, line: usize) -> (usize, usize) {
        let start = self.line_starts.get(line).map_or(0, |s| *s as usize);
        let end = self
            .line_starts
            .get(line + 1)
            .map_or(self.text.len(), |s| *s as usize);
        (start.min(self.text.len()), end.min(self.text.len()))
    }

    /// Characters from the start of line `line` to `offset` (in that line).
    fn chars_before(&self, line: usize, offset: usize) -> usize {
        let (start, _) = self.line_bounds(line);
        let offset = offset.max(start);
        if self.line_ascii.get(line).copied().unwrap_or(false) {
            return offset - start;
        }
        self.text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count())
    }

    pub fn display_path(&self) -> String {
        self.path.display().to_string()
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: u32) -> (usize, usize) {
        let offset = (offset as usize).min(self.text.len());
        let line = self.line_of(offset);
        (line + 1, self.chars_before(line, offset) + 1)
    }
}

/// A diagnostic joined with its source, so miette can render it.
struct Rendered<'a> {
    diag: &'a Diagnostic,
    src: CharColumns<'a>,
}

/// The lines longest shown with the source: a longer line is reported without it (miette
/// cannot lay out columns past 65,535, and nobody reads such a line in a terminal).
const MAX_SHOWN_LINE: usize = 4096;

/// A rule file for miette, read through its line index: reading the lines around a span
/// costs what they hold, not the file before them (so rendering many diagnostics stays
/// linear), and columns count characters, as `--format json` does.
struct CharColumns<'a> {
    name: String,
    file: &'a SourceFile,
}

impl CharColumns<'_> {
    /// The 0-based lines a span and its context cover.
    fn lines(&self, span: &miette::SourceSpan, context: usize) -> (usize, usize) {
        let len = self.file.text.len();
        let start = span.offset().min(len);
        let end = span.offset().saturating_add(span.len()).min(len);
        let first = self.file.line_of(start);
        let last = self.file.line_of(end.saturating_sub(1).max(start));
        let lines = self.file.line_starts.len();
        (
            first.saturating_sub(context),
            last.saturating_add(context).min(lines.saturating_sub(1)),
        )
    }

    /// Whether miette can show the span with `context` lines around it.
    fn showable(&self, span: &miette::SourceSpan, context: usize) -> bool {
        let (first, last) = self.lines(span, context);
        (first..=last).all(|l| {
            let (s, e) = self.file.line_bounds(l);
            e - s <= MAX_SHOWN_LINE
        })
    }
}

impl miette::SourceCode for CharColumns<'_> {
    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let text = &self.file.text;
        let offset = span.offset();
        if offset > text.len() {
            return Err(miette::MietteError::OutOfBounds);
        }
        let end = offset.saturating_add(span.len()).min(text.len());
        let first = self.file.line_of(offset);
        let (window, line) = if context_lines_before == 0 && context_lines_after == 0 {
            // Just the span: where it starts is what is asked.
            ((offset, end), first)
        } else {
            let from = first.saturating_sub(context_lines_before);
            let last = self.file.line_of(end.saturating_sub(1).max(offset));
            let to = last
                .saturating_add(context_lines_after)
                .min(self.file.line_starts.len().saturating_sub(1));
            (
                (self.file.line_bounds(from).0, self.file.line_bounds(to).1),
                from,
            )
        };
        let data = text
            .get(window.0..window.1)
            .ok_or(miette::MietteError::OutOfBounds)?;
        let column = self.file.chars_before(line, window.0);
        let line_count = data.matches('\n').count();
        Ok(Box::new(miette::MietteSpanContents::new_named(
            self.name.clone(),
            data.as_bytes(),
            (window.0, window.1 - window.0).into(),
            line,
            column,
            line_count,
        )))
    }
}

impl fmt::Debug for Rendered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diag.message)
    }
}

impl fmt::Display for Rendered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diag.message)
    }
}

impl std::error::Error for Rendered<'_> {}

impl miette::Diagnostic for Rendered<'_> {
    fn code<'b>(&'b self) -> Option<Box<dyn fmt::Display + 'b>> {
        Some(Box::new(self.diag.code.as_str()))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diag.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'b>(&'b self) -> Option<Box<dyn fmt::Display + 'b>> {
        self.diag
            .help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.diag
            .located
            .then_some(&self.src as &dyn miette::SourceCode)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if !self.diag.located {
            return None;
        }
        let span = self.diag.span;
        let label = if self.diag.label.is_empty() {
            None
        } else {
            Some(self.diag.label.clone())
        };
        let primary = LabeledSpan::new_primary_with_span(label, (span.start as usize, span.len()));
        let file = self.diag.file;
        let secondary = self
            .diag
            .secondary
            .iter()
            .filter(move |l| l.file == file)
            .map(|l| {
                LabeledSpan::new(Some(l.message.clone()), l.span.start as usize, l.span.len())
            });
        Some(Box::new(std::iter::once(primary).chain(secondary)))
    }
}

/// Renders diagnostics for people: miette's graphical report, colour only when asked.
pub fn render_human(diags: &[Diagnostic], files: &[SourceFile], colour: bool) -> String {
    let theme = if colour {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme).with_width(100);
    let mut out = String::new();
    for d in diags {
        let Some(file) = files.get(d.file) else {
            continue;
        };
        let src = CharColumns {
            name: file.display_path(),
            file,
        };
        let span = miette::SourceSpan::from((d.span.start as usize, d.span.len()));
        let mut done = false;
        if !d.located || src.showable(&span, CONTEXT_LINES) {
            let r = Rendered { diag: d, src };
            let mut one = String::new();
            // miette is not ours: should it panic on some input, show the plain form.
            let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handler.render_report(&mut one, &r)
            }));
            if let Ok(Ok(())) = rendered {
                out.push_str(&one);
                done = true;
            }
        }
        if !done {
            render_plain(&mut out, d, file);
        }
        // Secondary labels in another file than the primary one: a line each, with its place.
        for l in d.secondary.iter().filter(|l| l.file != d.file) {
            if let Some(f) = files.get(l.file) {
                out.push_str(&note_line(l, f));
            }
        }
        out.push('\n');
    }
    out
}

/// The lines of context miette shows around a span (its default).
const CONTEXT_LINES: usize = 1;

/// A diagnostic without the source: code, message, place, label and help.
fn render_plain(out: &mut String, d: &Diagnostic, file: &SourceFile) {
    let (line, col) = file.line_col(d.span.start);
    let sign = match d.severity {
        Severity::Error => "×",
        Severity::Warning => "⚠",
    };
    out.push_str(&format!("{}\n\n  {sign} {}\n", d.code, d.message));
    if d.located {
        let (first, _) = file.line_bounds(line - 1);
        let (_, end) = file.line_bounds(line - 1);
        let width = file
            .text
            .get(first..end)
            .map_or(0, |l| l.trim_end().chars().count());
        out.push_str(&format!(
            "   ╭─[{}:{line}:{col}]\n   │ {} (line {line} is {width} characters long; not shown)\n   ╰────\n",
            file.display_path(),
            if d.label.is_empty() { "here" } else { &d.label },
        ));
    }
    for l in d.secondary.iter().filter(|l| l.file == d.file) {
        out.push_str(&note_line(l, file));
    }
    if let Some(help) = &d.help {
        out.push_str(&format!("  help: {help}\n"));
    }
}

/// A secondary label as one line of plain text, with its place in `file`.
fn note_line(l: &Label, file: &SourceFile) -> String {
    let (line, col) = file.line_col(l.span.start);
    format!(
        "  note: {}: {}:{line}:{col}\n",
        l.message,
        file.display_path()
    )
}

/// The machine-readable form of one diagnostic, for CI.
#[derive(Serialize)]
pub struct JsonDiagnostic<'a> {
    pub code: Code,
    pub severity: Severity,
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<&'a str>,
    /// The secondary labels, each with its own place (absent when there are none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<JsonLabel<'a>>,
}

/// A secondary label in the machine-readable form.
#[derive(Serialize)]
pub struct JsonLabel<'a> {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub message: &'a str,
}

pub fn to_json<'a>(diags: &'a [Diagnostic], files: &[SourceFile]) -> Vec<JsonDiagnostic<'a>> {
    diags
        .iter()
        .map(|d| {
            let (path, (line, column), (end_line, end_column)) = match files.get(d.file) {
                Some(f) => (
                    f.display_path(),
                    f.line_col(d.span.start),
                    f.line_col(d.span.end),
                ),
                None => (String::new(), (0, 0), (0, 0)),
            };
            JsonDiagnostic {
                code: d.code,
                severity: d.severity,
                file: path,
                line,
                column,
                end_line,
                end_column,
                message: &d.message,
                help: d.help.as_deref(),
                labels: d
                    .secondary
                    .iter()
                    .filter_map(|l| {
                        let f = files.get(l.file)?;
                        let (line, column) = f.line_col(l.span.start);
                        let (end_line, end_column) = f.line_col(l.span.end);
                        Some(JsonLabel {
                            file: f.display_path(),
                            line,
                            column,
                            end_line,
                            end_column,
                            message: &l.message,
                        })
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The closest candidate by edit distance, if it is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let mut best: Option<(&str, usize)> = None;
    for c in candidates {
        let d = edit_distance(word, c);
        if best.is_none_or(|(_, bd)| d < bd) {
            best = Some((c, d));
        }
    }
    let (c, d) = best?;
    let limit = (word.chars().count().max(c.chars().count()) / 3).max(1);
    (d <= limit).then_some(c)
}

/// Edit distance over characters where swapping two neighbours counts as one edit
/// (optimal string alignment), so `cuont` is one typo away from `count`.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let (n, m) = (a.len(), b.len());
    let mut d = vec![vec![0usize; m + 1]; n + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=n {
        for j in 1..=m {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[n][m]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let facts = ["approved", "workers", "count"];
        assert_eq!(did_you_mean("aproved", facts), Some("approved"));
        assert_eq!(did_you_mean("cuont", facts), Some("count"));
        assert_eq!(did_you_mean("zebra", facts), None);
    }

    #[test]
    fn line_and_column_are_one_based_characters() {
        let f = SourceFile::new("x.rules", "ab\ncdé f");
        assert_eq!(f.line_col(0), (1, 1));
        assert_eq!(f.line_col(3), (2, 1));
        // é is two bytes: the space after it is the 4th character
        assert_eq!(f.line_col(7), (2, 4));
    }
}
