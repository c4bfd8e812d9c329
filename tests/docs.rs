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
