//! Diagnostics: every error and warning the front end finds, with a stable code, a span,
//! a label and a help line. The source text is attached only when printing.

use crate::syntax::ast::Span;
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource};
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

/// One finding in one file.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// Stable code, such as `ichor::check::unknown_fact`.
    pub code: &'static str,
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
}

impl Diagnostic {
    pub fn error(code: &'static str, file: usize, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Error,
            file,
            span,
            message: message.into(),
            label: String::new(),
            help: None,
            located: true,
        }
    }

    /// A finding about the rule set as a whole, not a place in it.
    pub fn unlocated(mut self) -> Self {
        self.located = false;
        self
    }

    pub fn warning(
        code: &'static str,
        file: usize,
        span: Span,
        message: impl Into<String>,
    ) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, file, span, message)
        }
    }

    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
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
            .collect();
        SourceFile {
            path: path.into(),
            text,
            line_starts,
        }
    }

    pub fn display_path(&self) -> String {
        self.path.display().to_string()
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: u32) -> (usize, usize) {
        let offset = (offset as usize).min(self.text.len());
        let off32 = u32::try_from(offset).unwrap_or(u32::MAX);
        let line = self.line_starts.partition_point(|s| *s <= off32).max(1);
        let line_start = self.line_starts.get(line - 1).map_or(0, |s| *s as usize);
        let col = self
            .text
            .get(line_start..offset)
            .map(|s| s.chars().count())
            .unwrap_or(0)
            + 1;
        (line, col)
    }
}

/// A diagnostic joined with its source, so miette can render it.
struct Rendered<'a> {
    diag: &'a Diagnostic,
    src: CharColumns,
}

/// A named source whose columns count characters, as `--format json` does (miette's own
/// count bytes, which differ on a line with non-ASCII text).
struct CharColumns {
    inner: NamedSource<Arc<str>>,
    text: Arc<str>,
}

impl miette::SourceCode for CharColumns {
    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let contents = self
            .inner
            .read_span(span, context_lines_before, context_lines_after)?;
        let start = contents.span().offset();
        let line_start = self
            .text
            .get(..start)
            .and_then(|before| before.rfind('\n'))
            .map_or(0, |i| i + 1);
        let column = self
            .text
            .get(line_start..start)
            .map_or(contents.column(), |s| s.chars().count());
        Ok(Box::new(miette::MietteSpanContents::new_named(
            self.inner.name().to_string(),
            contents.data(),
            *contents.span(),
            contents.line(),
            column,
            contents.line_count(),
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
        Some(Box::new(self.diag.code))
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
        Some(Box::new(std::iter::once(LabeledSpan::new(
            label,
            span.start as usize,
            span.len(),
        ))))
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
        let (line, col) = file.line_col(d.span.start);
        let src = CharColumns {
            inner: NamedSource::new(file.display_path(), file.text.clone()),
            text: file.text.clone(),
        };
        let r = Rendered { diag: d, src };
        if handler.render_report(&mut out, &r).is_err() {
            out.push_str(&format!(
                "{}:{line}:{col}: {}: {}\n",
                file.display_path(),
                d.code,
                d.message
            ));
        }
        out.push('\n');
    }
    out
}

/// The machine-readable form of one diagnostic, for CI.
#[derive(Serialize)]
pub struct JsonDiagnostic<'a> {
    pub code: &'static str,
    pub severity: Severity,
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<&'a str>,
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
