//! The rule author's guide stays true: every fact, verb, subject, action and diagnostic code
//! the code knows is documented in docs/rules.md.

use ichor_rules::vocab::{ACTIONS, FACTS, Subject, Verb};
use std::path::Path;

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

fn codes_in(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("readable").flatten() {
        let p = entry.path();
        if p.is_dir() {
            codes_in(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&p).expect("utf-8");
            for (i, _) in text.match_indices("\"ichor::") {
                let rest = &text[i + 1..];
                let end = rest.find('"').unwrap_or(rest.len());
                out.push(rest[..end].to_string());
            }
        }
    }
}

#[test]
fn every_diagnostic_code_is_documented() {
    let g = guide();
    let mut codes = Vec::new();
    codes_in(Path::new("src"), &mut codes);
    codes.sort();
    codes.dedup();
    assert!(codes.len() > 20, "found only {codes:?}");
    for c in codes {
        assert!(
            g.contains(&format!("`{c}`")),
            "docs/rules.md lacks the code `{c}`"
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
            .map(|d| d.code)
            .filter(|c| *c != "ichor::lint::uncovered_event")
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
