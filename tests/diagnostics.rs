//! Diagnostics as people see them: one rule file per diagnostic code under tests/rules/bad,
//! clean variations under tests/rules/ok, each rendered and snapshotted (tests/snapshots/).
//!
//! Every bad file names what it must produce in its header:
//!
//! ```text
//! # expect: ichor::check::unknown_name `aproved`
//! ```
//!
//! a code, and optionally (in backticks) the exact source text the diagnostic points at.
//! `each_bad_file_produces_exactly_its_codes` checks those, so the snapshots are not the
//! only check. Accept new snapshots with
//! `INSTA_UPDATE=always cargo nextest run -E 'test(/^diagnostics::/)'`.

use ichor_rules::diagnostics::{Code, Diagnostic, SourceFile, render_human};
use ichor_rules::ruleset::{RuleSet, build, load};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn manifest_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    dir.canonicalize().unwrap_or(dir)
}

/// `tests/rules/bad/x.rules`, with forward slashes, so snapshots hold no absolute paths.
fn relative(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let rel = path.strip_prefix(manifest_dir()).unwrap_or(&path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn build_one(path: &Path) -> (String, RuleSet) {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let rel = relative(path);
    (rel.clone(), build(vec![SourceFile::new(rel, text)]))
}

/// The rendered diagnostics, then one summary line (and, when it compiled, the table's
/// rows), so a snapshot of a clean file still says something.
fn report(set: &RuleSet) -> String {
    let mut out = render_human(&set.diagnostics, &set.files, false);
    out.push_str(&format!(
        "-- {} error(s), {} warning(s)\n",
        set.errors(),
        set.warnings()
    ));
    if let Some(table) = &set.table {
        for ((verb, subject, site), rows) in table.groups() {
            let names: Vec<&str> = rows
                .iter()
                .map(|r| table.rules[r.rule as usize].name.as_str())
                .collect();
            out.push_str(&format!(
                "{} {} at {}: {}\n",
                verb.name(),
                subject.name(),
                site.name(),
                names.join(", ")
            ));
        }
    }
    out
}

#[test]
fn bad_files_snapshot() {
    insta::glob!("rules/bad/*.rules", |path| {
        let (_, set) = build_one(path);
        insta::assert_snapshot!(report(&set));
    });
}

#[test]
fn ok_files_snapshot() {
    insta::glob!("rules/ok/*.rules", |path| {
        let (_, set) = build_one(path);
        insta::assert_snapshot!(report(&set));
    });
}

fn rule_files(dir: &str) -> Vec<PathBuf> {
    let dir = manifest_dir().join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "rules"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .rules files in {}", dir.display());
    files
}

/// One `# expect:` line: a code and, optionally, the text its span covers.
#[derive(Debug)]
struct Expect {
    code: String,
    span_text: Option<String>,
}

fn expectations(text: &str) -> Vec<Expect> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("# expect:"))
        .map(|rest| {
            let rest = rest.trim();
            match rest.split_once(' ') {
                Some((code, snippet)) => {
                    let snippet = snippet.trim();
                    let inner = snippet
                        .strip_prefix('`')
                        .and_then(|s| s.strip_suffix('`'))
                        .unwrap_or_else(|| panic!("expected `text` after the code: {rest}"));
                    Expect {
                        code: code.to_string(),
                        span_text: Some(inner.to_string()),
                    }
                }
                None => Expect {
                    code: rest.to_string(),
                    span_text: None,
                },
            }
        })
        .collect()
}

fn span_text<'t>(set: &'t RuleSet, d: &Diagnostic) -> &'t str {
    set.files[d.file]
        .text
        .get(d.span.start as usize..d.span.end as usize)
        .unwrap_or("<span out of range>")
}

#[test]
fn each_bad_file_produces_exactly_its_codes() {
    let mut failures = Vec::new();
    for path in rule_files("tests/rules/bad") {
        let text = std::fs::read_to_string(&path).expect("readable");
        let expects = expectations(&text);
        let (rel, set) = build_one(&path);
        assert!(!expects.is_empty(), "{rel} has no `# expect:` line");
        let want: BTreeSet<&str> = expects.iter().map(|e| e.code.as_str()).collect();
        let got: BTreeSet<&str> = set.diagnostics.iter().map(|d| d.code.as_str()).collect();
        if want != got {
            failures.push(format!("{rel}: expected {want:?}, got {got:?}"));
            continue;
        }
        for e in &expects {
            let Some(snippet) = &e.span_text else {
                continue;
            };
            let spans: Vec<&str> = set
                .diagnostics
                .iter()
                .filter(|d| d.code == e.code.as_str())
                .map(|d| span_text(&set, d))
                .collect();
            if !spans.contains(&snippet.as_str()) {
                failures.push(format!(
                    "{rel}: {} should point at `{snippet}`, points at {spans:?}",
                    e.code
                ));
            }
        }
        // A file with an error never yields a table; one with only warnings does.
        let has_error = set.diagnostics.iter().any(|d| d.is_error());
        if has_error == set.table.is_some() {
            failures.push(format!(
                "{rel}: errors = {has_error} but table present = {}",
                set.table.is_some()
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Every code a rule file can produce (`Code::ALL`, the one list, less the codes about
/// reading files or bugs) has a bad file, so a snapshot, that produces it (so deleting one,
/// or adding a code without one, is noticed).
#[test]
fn bad_files_cover_every_code() {
    let mut seen = BTreeSet::new();
    for path in rule_files("tests/rules/bad") {
        let (_, set) = build_one(&path);
        seen.extend(set.diagnostics.iter().map(|d| d.code));
    }
    let missing: Vec<&str> = Code::ALL
        .iter()
        .filter(|c| c.from_rules() && !seen.contains(*c))
        .map(|c| c.as_str())
        .collect();
    assert!(missing.is_empty(), "no bad file produces {missing:?}");
}

/// The house style of diagnostics: a lowercase message without a final period, a span inside
/// the file, and a help line (syntax errors may lack one: see the report of the test run).
#[test]
fn diagnostics_follow_the_house_style() {
    let mut failures = Vec::new();
    for path in rule_files("tests/rules/bad") {
        let (rel, set) = build_one(&path);
        for d in &set.diagnostics {
            let first = d.message.chars().next();
            if first.is_some_and(|c| c.is_uppercase()) {
                failures.push(format!(
                    "{rel}: {}: message not lowercase: {}",
                    d.code, d.message
                ));
            }
            if d.message.ends_with('.') {
                failures.push(format!("{rel}: {}: message ends with a period", d.code));
            }
            let len = set.files[d.file].text.len() as u32;
            if d.span.start > d.span.end || d.span.end > len {
                failures.push(format!("{rel}: {}: span {:?} out of range", d.code, d.span));
            }
            if d.code != Code::SyntaxExpected && d.help.is_none() {
                failures.push(format!("{rel}: {}: no help line", d.code));
            }
            if d.label.is_empty() {
                failures.push(format!("{rel}: {}: no label", d.code));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn ok_files_are_clean() {
    for path in rule_files("tests/rules/ok") {
        let (rel, set) = build_one(&path);
        assert!(
            set.diagnostics.is_empty(),
            "{rel}:\n{}",
            render_human(&set.diagnostics, &set.files, false)
        );
        assert!(set.table.is_some(), "{rel} did not compile");
    }
}

#[test]
fn shipped_rules_check_clean() {
    let set = load(&[manifest_dir().join("rules")]).expect("rules/ loads");
    assert!(
        set.diagnostics.is_empty(),
        "rules/ has diagnostics:\n{}",
        render_human(&set.diagnostics, &set.files, false)
    );
    let table = set.table.expect("rules/ compiles");
    assert!(table.row_count() > 0);
    assert_eq!(
        set.files.len(),
        4,
        "admission.rules, invariants.rules, operations.rules and removal.rules"
    );
}
