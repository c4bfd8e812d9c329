//! Loading a rule set from files and folders, and turning it into a table.

use crate::check::{CheckResult, Lints, check_linting};
use crate::compile::{Table, compile};
use crate::diagnostics::{Code, Diagnostic, SourceFile};
use std::path::{Path, PathBuf};

/// A rule set read from disk: its files, what the checker found, and the table when it
/// checked without errors.
pub struct RuleSet {
    pub files: Vec<SourceFile>,
    pub diagnostics: Vec<Diagnostic>,
    pub table: Option<Table>,
}

impl RuleSet {
    pub fn errors(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }

    pub fn warnings(&self) -> usize {
        self.diagnostics.len() - self.errors()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: no .rules files found", path.display())]
    Empty { path: PathBuf },
    /// A file that is not UTF-8 text, with where its first bad byte is.
    #[error(
        "{}: line {line}, column {column} (byte {offset}): not UTF-8 text; rule files are \
         UTF-8: save it as UTF-8 (a binary or another encoding is not a rule file)",
        path.display()
    )]
    NotUtf8 {
        path: PathBuf,
        line: usize,
        column: usize,
        offset: usize,
    },
    /// The files together are larger than the reader was allowed to read.
    #[error("{}: the rule files are larger than {limit} bytes in all", path.display())]
    TooLarge { path: PathBuf, limit: u64 },
}

impl LoadError {
    /// The file or folder that could not be read.
    pub fn path(&self) -> &Path {
        match self {
            LoadError::Io { path, .. }
            | LoadError::Empty { path }
            | LoadError::NotUtf8 { path, .. }
            | LoadError::TooLarge { path, .. } => path,
        }
    }
}

/// The most bytes of rule files read in all: source positions are 32-bit ([`Span`]), so
/// a larger set is [`LoadError::TooLarge`], not a set whose positions saturate.
///
/// [`Span`]: crate::span::Span
pub const MAX_SOURCE_BYTES: u64 = u32::MAX as u64;

/// The `.rules` files of each path (a file, or a folder read non-recursively), sorted. A
/// file named twice (`rules rules/admission.rules`) is read once.
pub fn read_sources(paths: &[PathBuf]) -> Result<Vec<SourceFile>, LoadError> {
    read_sources_within(paths, MAX_SOURCE_BYTES)
}

/// Like [`read_sources`], but never reads more than `limit` bytes in all: a larger set is
/// [`LoadError::TooLarge`] (a server reloading rules bounds its memory with it).
pub fn read_sources_within(paths: &[PathBuf], limit: u64) -> Result<Vec<SourceFile>, LoadError> {
    let limit = limit.min(MAX_SOURCE_BYTES);
    let mut files = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut left = limit;
    let mut read_once = |p: &Path, files: &mut Vec<SourceFile>| -> Result<(), LoadError> {
        let key = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if seen.insert(key) {
            let file = read_one(p, left).map_err(|e| match e {
                LoadError::TooLarge { path, .. } => LoadError::TooLarge { path, limit },
                e => e,
            })?;
            left -= file.text.len() as u64;
            files.push(file);
        }
        Ok(())
    };
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|source| LoadError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|source| LoadError::Io {
                    path: path.clone(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "rules") && p.is_file())
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(LoadError::Empty { path: path.clone() });
            }
            for p in found {
                read_once(&p, &mut files)?;
            }
        } else {
            read_once(path, &mut files)?;
        }
    }
    Ok(files)
}

/// Reads one file of at most `limit` bytes (a file growing while it is read included).
fn read_one(path: &Path, limit: u64) -> Result<SourceFile, LoadError> {
    use std::io::Read;
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(LoadError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let good = &e.as_bytes()[..offset];
        let line = good.iter().filter(|b| **b == b'\n').count() + 1;
        let start = good.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        // Characters, not bytes, before the bad byte on its line (the prefix is UTF-8).
        let column = String::from_utf8_lossy(&good[start..]).chars().count() + 1;
        LoadError::NotUtf8 {
            path: path.to_path_buf(),
            line,
            column,
            offset,
        }
    })?;
    Ok(SourceFile::new(path, text))
}

/// Checks (with lints) and compiles source files; the table exists only when there are no
/// errors.
pub fn build(files: Vec<SourceFile>) -> RuleSet {
    build_with(files, true)
}

/// The stack the front end runs on. Every stage is bounded (see
/// [`MAX_NESTING`](crate::syntax::MAX_NESTING) and [`MAX_DEPTH`](crate::syntax::MAX_DEPTH)):
/// the deepest input they accept was measured to need under 400 KiB in a debug build and
/// under 64 KiB in release (`check` with lints, `compile` and rendering), so this leaves a
/// wide margin whatever thread calls [`build`] (a tokio worker has 2 MiB). Only the pages
/// used are ever committed.
pub const FRONT_END_STACK: usize = 16 << 20;

/// What `serve` builds on a load or a reload: like [`build`], with only the lints that
/// decide whether a table may serve ([`Lints::Serving`]: arithmetic errors and the coverage
/// of the runtime's events), not the exact analyses that only warn (`check` runs those).
pub fn build_serving(files: Vec<SourceFile>) -> RuleSet {
    build_linting(files, Some(Lints::Serving))
}

/// [`build_serving`] on the calling thread, which must have [`FRONT_END_STACK`] of stack
/// (`serve`'s reload thread has more): no thread started for it.
pub fn build_serving_here(files: Vec<SourceFile>) -> RuleSet {
    build_here(files, Some(Lints::Serving))
}

/// Like [`build`]; without lints when `lints` is false (errors still stop the table).
///
/// Runs where the stack is known to be enough: on the calling thread when it has
/// [`FRONT_END_HERE`] of stack left (a program's main thread), else on a thread of its own
/// with [`FRONT_END_STACK`] (starting one costs more than checking a small file), so the
/// caller's stack size does not matter. Either way a bug that panics becomes an error
/// diagnostic (no table) instead of taking the caller down.
pub fn build_with(files: Vec<SourceFile>, lints: bool) -> RuleSet {
    build_linting(files, lints.then_some(Lints::All))
}

/// The stack left on the calling thread that lets [`build_with`] run there: ten times what
/// the deepest accepted input needs in a debug build (see [`FRONT_END_STACK`]).
pub const FRONT_END_HERE: usize = 4 << 20;

fn build_linting(files: Vec<SourceFile>, lints: Option<Lints>) -> RuleSet {
    let kept = files.clone();
    if stacker::remaining_stack().is_some_and(|left| left >= FRONT_END_HERE) {
        return std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| build_here(files, lints)))
            .unwrap_or_else(|_| internal_error(kept));
    }
    let worker = std::thread::Builder::new()
        .name("ichor-rules-check".into())
        .stack_size(FRONT_END_STACK)
        .spawn(move || build_here(files, lints));
    match worker {
        Ok(handle) => handle.join().unwrap_or_else(|_| internal_error(kept)),
        // No thread to be had: the stages are bounded, so run here.
        Err(_) => build_here(kept, lints),
    }
}

/// What a front end that panicked (a bug) answers: an error, and no table.
fn internal_error(files: Vec<SourceFile>) -> RuleSet {
    RuleSet {
        diagnostics: vec![
            Diagnostic::error(
                Code::Internal,
                0,
                crate::syntax::ast::Span::default(),
                "the rules could not be checked: the checker failed (a bug in ichor-rules)",
            )
            .unlocated()
            .label("internal error")
            .help("please report it with the rule files; no table was built"),
        ],
        files,
        table: None,
    }
}

fn build_here(files: Vec<SourceFile>, lints: Option<Lints>) -> RuleSet {
    let CheckResult {
        program,
        diagnostics,
    } = check_linting(&files, lints);
    let mut diagnostics = diagnostics;
    let table = if diagnostics.iter().any(|d| d.is_error()) {
        None
    } else {
        match compile(&program, &files) {
            Ok(table) => Some(table),
            Err(e) => {
                diagnostics.push(
                    Diagnostic::error(
                        Code::CompileTooLarge,
                        0,
                        crate::syntax::ast::Span::default(),
                        e.to_string(),
                    )
                    .unlocated()
                    .label("too large to compile")
                    .help("split the rule set, or remove rules; no table was built"),
                );
                None
            }
        }
    };
    RuleSet {
        files,
        diagnostics,
        table,
    }
}

/// Reads, checks and compiles the rule set at `paths`.
pub fn load(paths: &[PathBuf]) -> Result<RuleSet, LoadError> {
    Ok(build(read_sources(paths)?))
}

/// The shipped rules' table, for the unit tests of modules that decide with one.
#[cfg(test)]
#[allow(clippy::expect_used)]
pub(crate) fn shipped_table() -> crate::compile::Table {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
    load(std::slice::from_ref(&root))
        .expect("the shipped rules load")
        .table
        .expect("the shipped rules compile")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that is not UTF-8 is an error naming where, never a panic or a lossy read.
    #[test]
    fn a_file_that_is_not_utf8_says_where() {
        let dir = std::env::temp_dir().join(format!("ichor-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let p = dir.join("bad.rules");
        std::fs::write(&p, b"rule r\n  refuse remove m\xc3\xa4chine \xff\xfe\n").expect("write");
        let e = read_sources(std::slice::from_ref(&p)).expect_err("not UTF-8");
        assert!(
            matches!(
                e,
                LoadError::NotUtf8 {
                    line: 2,
                    column: 25,
                    offset: 32,
                    ..
                }
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains("line 2, column 25") && text.contains("UTF-8"),
            "{text}"
        );
        assert_eq!(e.path(), p.as_path());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
