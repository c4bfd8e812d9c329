//! The rule author's guide stays true: every fact, verb, subject, action and diagnostic code
//! the code knows is documented in docs/rules.md.

use ichor_rules::diagnostics::Code;
use ichor_rules::vocab::{ACTIONS, FACTS, MODEL_FACTS, Subject, Verb};

fn guide() -> String {
    std::fs::read_to_string("docs/rules.md").expect("docs/rules.md exists")
}

#[test]
fn every_fact_is_documented() {
    let g = guide();
    for f in FACTS {
        assert!(
            g.contains(&format!("| `{}` |", f.name)),
            "docs/rules.md lacks the fact `{}`",
            f.name
        );
    }
}

/// The model's facts table (what invariants read) names every model fact, backticked in a
/// row's first column.
#[test]
fn every_model_fact_is_documented() {
    let g = guide();
    let start = g
        .find("the **model's facts**")
        .expect("the model facts section");
    let table: Vec<&str> = g[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect();
    for f in MODEL_FACTS {
        assert!(
            table.iter().any(|row| row
                .split('|')
                .nth(1)
                .is_some_and(|names| names.contains(&format!("`{}`", f.name)))),
            "docs/rules.md's model facts table lacks `{}`",
            f.name
        );
    }
}

#[test]
fn every_verb_subject_and_action_is_documented() {
    let g = guide();
    for v in Verb::ALL {
        assert!(
            g.contains(&format!("`{}`", v.name())),
            "verb `{}` undocumented",
            v.name()
        );
    }
    for s in Subject::ALL {
        assert!(
            g.contains(&format!("`{}`", s.name())),
            "subject `{}` undocumented",
            s.name()
        );
    }
    for a in ACTIONS {
        let words = a.words.join(" ");
        assert!(
            g.contains(&format!("`{words}")),
            "action `{words}` undocumented"
        );
    }
}

/// Every event the runtime produces (`RUNTIME_EVENTS`: verb, subject, site) has a row in
/// the guide's table "Verbs and where they happen" that says when (issue 37: `report
/// backup` had none).
#[test]
fn every_runtime_event_has_a_row_in_the_verbs_table() {
    let g = guide();
    let table = g
        .split("## Verbs and where they happen")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/rules.md has the section \"Verbs and where they happen\"");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.split(" | ").map(|c| c.trim_matches(['|', ' '])).collect())
        .collect();
    assert!(rows.len() > 10, "{rows:?}");
    for &(verb, subject, site) in ichor_rules::vocab::RUNTIME_EVENTS {
        let named = |cell: &str, word: &str| cell.split(", ").any(|w| w == format!("`{word}`"));
        assert!(
            rows.iter().any(|r| r.len() >= 4
                && named(r[0], verb.name())
                && named(r[1], subject.name())
                && r[2] == site.name()
                && !r[3].trim().is_empty()),
            "docs/rules.md, \"Verbs and where they happen\", has no row for `{} {}` at the {}",
            verb.name(),
            subject.name(),
            site.name()
        );
    }
}

/// Every code the tools can report (`Code::ALL`, the one list) has a row in the guide's
/// table of diagnostic codes.
#[test]
fn every_diagnostic_code_is_documented() {
    let g = guide();
    for c in Code::ALL {
        assert!(
            g.contains(&format!("| `{c}` |")),
            "docs/rules.md lacks a row for the code `{c}`"
        );
    }
}

/// The ```rules blocks of the guide: each is a whole rule file.
fn rules_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut current {
            None if line.trim_end() == "```rules" => current = Some((i + 2, String::new())),
            Some(_) if line.trim_end() == "```" => blocks.extend(current.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "an unclosed ```rules block");
    blocks
}

#[test]
fn every_rules_example_in_the_guide_checks() {
    use ichor_rules::diagnostics::SourceFile;
    use ichor_rules::ruleset::build;
    let blocks = rules_blocks(&guide());
    assert!(
        blocks.len() >= 9,
        "one example per construct; found {}",
        blocks.len()
    );
    for (line, body) in blocks {
        let set = build(vec![SourceFile::new(
            format!("docs/rules.md:{line}"),
            body.clone(),
        )]);
        let errors: Vec<String> = set
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| format!("{}: {}", d.code, d.message))
            .collect();
        assert!(
            errors.is_empty(),
            "the example at docs/rules.md:{line} does not check: {errors:?}\n{body}"
        );
        let findings: Vec<&str> = set
            .diagnostics
            .iter()
            .map(|d| d.code.as_str())
            .filter(|c| *c != Code::UncoveredEvent.as_str())
            .collect();
        assert!(
            findings.is_empty(),
            "the example at docs/rules.md:{line} draws {findings:?}"
        );
    }
}

#[test]
fn the_operators_guide_names_every_metric_and_every_granted_resource() {
    use ichor_rules::runtime::access::REQUIRED;
    use ichor_rules::runtime::metrics::Metrics;
    let g = std::fs::read_to_string("docs/operators.md").expect("docs/operators.md exists");
    let rendered = Metrics::default().render();
    let names: Vec<&str> = rendered
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(names.len() >= 5, "{names:?}");
    for n in names {
        assert!(
            g.contains(&format!("`{n}`")),
            "docs/operators.md lacks the metric `{n}`"
        );
    }
    for a in REQUIRED {
        assert!(
            g.contains(&format!("`{}`", a.resource)),
            "docs/operators.md lacks the resource `{}`",
            a.resource
        );
    }
}

/// The operator's guide lists exactly the API calls the chart grants (`access::REQUIRED`).
#[test]
fn the_operators_guide_lists_exactly_the_granted_calls() {
    use ichor_rules::runtime::access::REQUIRED;
    use std::collections::BTreeSet;
    let text = std::fs::read_to_string("docs/operators.md").expect("docs/operators.md exists");
    let start = text
        .find("The ClusterRole grants, and nothing else:")
        .expect("the grants table");
    let mut documented = BTreeSet::new();
    for line in text[start..]
        .lines()
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let group = match cells[1].trim_matches('`') {
            "core" => "",
            g => g,
        };
        let verbs = cells[3].split(" (").next().unwrap_or("");
        for resource in cells[2].split(", ") {
            for verb in verbs.split(", ") {
                documented.insert((
                    group.to_string(),
                    resource.trim_matches('`').to_string(),
                    verb.to_string(),
                ));
            }
        }
    }
    let granted: BTreeSet<_> = REQUIRED
        .iter()
        .flat_map(|a| {
            a.verbs.iter().map(|v| {
                (
                    a.api_group.to_string(),
                    a.resource.to_string(),
                    v.to_string(),
                )
            })
        })
        .collect();
    assert_eq!(documented, granted, "docs/operators.md's grants table");
}

/// The guide's facts table is the one `vocab::facts_table_markdown` generates from the
/// vocabulary (names, types, where each is available, meanings). Regenerate it with
/// `UPDATE_DOCS=1 cargo nextest run -E 'test(/facts_table/)'`.
#[test]
fn the_facts_table_is_the_vocabulary() {
    let text = guide();
    let want = ichor_rules::vocab::facts_table_markdown();
    let header = "| fact | type | available in | meaning |";
    let start = text
        .find(header)
        .expect("docs/rules.md has the facts table");
    let len: usize = text[start..]
        .lines()
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.len() + 1)
        .sum();
    let end = (start + len).min(text.len());
    let have = &text[start..end];
    if have == want {
        return;
    }
    if std::env::var("UPDATE_DOCS").is_ok_and(|v| v == "1") {
        let updated = format!("{}{want}{}", &text[..start], &text[end..]);
        std::fs::write("docs/rules.md", updated).expect("docs/rules.md is writable");
        return;
    }
    let differ: Vec<String> = have
        .lines()
        .zip(want.lines())
        .filter(|(h, w)| h != w)
        .map(|(h, w)| format!("docs: {h}\nvocab: {w}"))
        .collect();
    panic!(
        "docs/rules.md's facts table differs from src/vocab.rs (regenerate it with UPDATE_DOCS=1):\n{}\n({} rows in the guide, {} in the vocabulary)",
        differ.join("\n"),
        have.lines().count(),
        want.lines().count()
    );
}

/// ARCHITECTURE.md's table of instructions per decision is the committed budgets
/// (benches/counts/budgets.txt), as `scripts/counts.sh --update` writes both: never typed
/// by hand, never out of date.
#[test]
fn architecture_counts_are_the_budgets() {
    let arch = std::fs::read_to_string("ARCHITECTURE.md").expect("ARCHITECTURE.md");
    let budgets = std::fs::read_to_string("benches/counts/budgets.txt").expect("budgets");
    let start = arch
        .find("<!-- counts:begin -->")
        .expect("the counts table's markers");
    let end = arch
        .find("<!-- counts:end -->")
        .expect("the counts table's markers");
    let rows: Vec<(String, String)> = arch[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_string(), cells[2].to_string())
        })
        .collect();
    let wanted: Vec<(String, String)> = budgets
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, count) = l.split_once(' ').expect("`name count`");
            (name.to_string(), count.trim().to_string())
        })
        .collect();
    assert!(!wanted.is_empty(), "budgets.txt has budgets");
    assert_eq!(
        rows, wanted,
        "ARCHITECTURE.md's instruction counts differ from benches/counts/budgets.txt: run \
         `bash scripts/counts.sh --update` (it writes both)"
    );
}
