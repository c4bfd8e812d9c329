//! Rules that reload when their files change. A new table replaces the serving one only if
//! it checks without errors: a broken edit never opens the gate.

use crate::compile::Table;
use crate::ruleset::{build_with, read_sources};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

/// The serving table and where it comes from.
pub struct Rules {
    paths: Vec<PathBuf>,
    table: RwLock<Option<Arc<Table>>>,
    fingerprint: Mutex<Option<u64>>,
}

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files did not change.
    Unchanged,
    /// A new table serves.
    Replaced { rows: usize },
    /// The files changed but do not check (or cannot be read); the old table keeps serving.
    Rejected { reason: String },
}

impl Rules {
    pub fn new(paths: Vec<PathBuf>) -> Rules {
        Rules {
            paths,
            table: RwLock::new(None),
            fingerprint: Mutex::new(None),
        }
    }

    /// The table serving now, if one ever loaded.
    pub fn current(&self) -> Option<Arc<Table>> {
        self.table.read().ok().and_then(|t| t.clone())
    }

    /// Reads the files; builds and swaps in a new table when they changed and check clean.
    pub fn reload(&self) -> Reload {
        let files = match read_sources(&self.paths) {
            Ok(f) => f,
            Err(e) => {
                return Reload::Rejected {
                    reason: e.to_string(),
                };
            }
        };
        let mut h = DefaultHasher::new();
        for f in &files {
            f.path.hash(&mut h);
            f.text.hash(&mut h);
        }
        let fp = h.finish();
        if let Ok(last) = self.fingerprint.lock()
            && *last == Some(fp)
        {
            return Reload::Unchanged;
        }
        let set = build_with(files, false);
        let outcome = match set.table {
            Some(table) => {
                let rows = table.row_count();
                if let Ok(mut t) = self.table.write() {
                    *t = Some(Arc::new(table));
                }
                Reload::Replaced { rows }
            }
            None => {
                let first: Vec<String> = set
                    .diagnostics
                    .iter()
                    .filter(|d| d.is_error())
                    .take(3)
                    .map(|d| {
                        let (line, col) = set
                            .files
                            .get(d.file)
                            .map(|f| f.line_col(d.span.start))
                            .unwrap_or((0, 0));
                        let path = set
                            .files
                            .get(d.file)
                            .map(|f| f.display_path())
                            .unwrap_or_default();
                        format!("{path}:{line}:{col}: {}", d.message)
                    })
                    .collect();
                Reload::Rejected {
                    reason: format!("{} error(s): {}", set.errors(), first.join("; ")),
                }
            }
        };
        // A rejected version is remembered too, so it is reported once, not every poll.
        if let Ok(mut last) = self.fingerprint.lock() {
            *last = Some(fp);
        }
        outcome
    }
}
