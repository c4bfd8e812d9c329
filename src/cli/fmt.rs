//! `ichor-rules fmt [PATHS] [--check]`: rewrite rule files in the canonical layout
//! (src/syntax/fmt.rs), or with `--check` say which would change, with a diff, for CI.

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, emit};
use crate::diagnostics::SourceFile;
use crate::diagnostics::render_human;
use crate::syntax::fmt::format;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct FmtArgs {
    /// Rule files or folders (a folder: its `.rules` files). Default: `rules/`.
    pub paths: Vec<PathBuf>,
    /// Change nothing: list the files that are not formatted, with a diff, and exit 1.
    #[arg(long)]
    pub check: bool,
}

/// The largest rule file `fmt` reads.
const MAX_RULES_FILE: u64 = 16 * 1024 * 1024;

fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.is_file() && f.extension().is_some_and(|x| x == "rules"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(format!("{}: no .rules files in this folder", p.display()));
            }
            out.extend(found);
        } else if p.is_file() {
            out.push(p.clone());
        } else {
            return Err(format!("{}: no such file or folder", p.display()));
        }
    }
    Ok(out)
}

/// A unified diff of two texts, line by line (three lines of context).
pub fn diff(path: &Path, old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let mut out = format!(
        "--- {}\n+++ {} (formatted)\n",
        path.display(),
        path.display()
    );
    // Longest common subsequence; rule files are small, and a huge one is shown whole.
    if a.len().saturating_mul(b.len()) > 16_000_000 {
        out.push_str(&format!("@@ -1,{} +1,{} @@\n", a.len(), b.len()));
        a.iter().for_each(|l| out.push_str(&format!("-{l}\n")));
        b.iter().for_each(|l| out.push_str(&format!("+{l}\n")));
        return out;
    }
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![0u32; (n + 1) * (m + 1)];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * (m + 1) + j] = if a[i] == b[j] {
                lcs[(i + 1) * (m + 1) + j + 1] + 1
            } else {
                lcs[(i + 1) * (m + 1) + j].max(lcs[i * (m + 1) + j + 1])
            };
        }
    }
    // The edit script: (' ' | '-' | '+', old line, new line).
    let mut ops: Vec<(char, usize, usize)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', i, j));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[(i + 1) * (m + 1) + j] >= lcs[i * (m + 1) + j + 1]) {
            ops.push(('-', i, j));
            i += 1;
        } else {
            ops.push(('+', i, j));
            j += 1;
        }
    }
    // Hunks: changes with up to three lines of context around them.
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(3);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 7 {
            end = changed[k];
            k += 1;
        }
        let end = (end + 4).min(ops.len());
        let hunk = &ops[start..end];
        let old_count = hunk.iter().filter(|o| o.0 != '+').count();
        let new_count = hunk.iter().filter(|o| o.0 != '-').count();
        out.push_str(&format!(
            "@@ -{},{old_count} +{},{new_count} @@\n",
            hunk[0].1 + 1,
            hunk[0].2 + 1
        ));
        for &(op, i, j) in hunk {
            let line = if op == '+' { b[j] } else { a[i] };
            out.push_str(&format!("{op}{line}\n"));
        }
    }
    out
}

pub fn run(args: &FmtArgs) -> u8 {
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from("rules")]
    } else {
        args.paths.clone()
    };
    let files = match files(&paths) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let mut report = String::new();
    let mut unformatted = 0;
    let mut bad = false;
    for path in &files {
        let text = match super::eval::read_text(path, MAX_RULES_FILE) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                bad = true;
                continue;
            }
        };
        let formatted = match format(&text) {
            Ok(f) => f,
            Err(diags) => {
                let files = [SourceFile::new(path.clone(), text.as_str())];
                eprint!("{}", render_human(&diags, &files, false));
                eprintln!(
                    "error: {}: does not parse, so it is not formatted; fix it first (`ichor-rules check {}`)",
                    path.display(),
                    path.display()
                );
                bad = true;
                continue;
            }
        };
        if formatted == text {
            continue;
        }
        unformatted += 1;
        if args.check {
            report.push_str(&diff(path, &text, &formatted));
        } else if let Err(e) = std::fs::write(path, &formatted) {
            eprintln!("error: {}: cannot write: {e}", path.display());
            bad = true;
        } else {
            report.push_str(&format!("formatted {}\n", path.display()));
        }
    }
    if args.check && unformatted > 0 {
        report.push_str(&format!(
            "{unformatted} of {} files are not formatted; run `ichor-rules fmt` on them\n",
            files.len()
        ));
    }
    if let Err(code) = emit(&report) {
        return code;
    }
    if bad {
        EXIT_BAD_INPUT
    } else if args.check && unformatted > 0 {
        EXIT_FINDINGS
    } else {
        EXIT_OK
    }
}
