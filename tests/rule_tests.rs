//! `ichor-rules test`, run as the built binary on the shipped suite (rules/tests/) and on
//! test files written here: passes, failures with their diff, no vacuous passes, bad test
//! files (exit 2 with file:line), --run, the three formats, coverage and --fail-under.

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ichor-rules");

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> Out {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(root())
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs");
    let out = Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    out
}

/// Writes a test file (in a folder of its own, next to copies of two fixtures) and returns
/// its path.
fn test_file(name: &str, text: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rule-tests-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for f in ["objects-stream.yaml", "review-delete-cp1-refused.json"] {
        std::fs::copy(root().join("tests/fixtures").join(f), dir.join(f)).expect("copy");
    }
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).expect("write");
    path.display().to_string()
}

const OBJECTS: &str = r#"
objects:
  c:
    apiVersion: ichor.maesh.dev/v1alpha1
    kind: TalosCluster
    metadata: {name: c, namespace: ns}
    spec: {controlPlane: {count: 3}, schedulable: "true"}
  cps:
    - apiVersion: ichor.maesh.dev/v1alpha1
      kind: TalosMachine
      metadata: {name: cp1, namespace: ns, creationTimestamp: "2026-10-01T00:00:00Z"}
      spec: {clusterRef: {name: c}, role: controlplane, approved: true, approvalDecision: {at: "2026-10-01T00:01:00Z"}}
    - apiVersion: ichor.maesh.dev/v1alpha1
      kind: TalosMachine
      metadata: {name: cp2, namespace: ns, creationTimestamp: "2026-10-01T00:00:00Z"}
      spec: {clusterRef: {name: c}, role: controlplane, approved: true, approvalDecision: {at: "2026-10-01T00:02:00Z"}}
    - apiVersion: ichor.maesh.dev/v1alpha1
      kind: TalosMachine
      metadata: {name: cp3, namespace: ns, creationTimestamp: "2026-10-01T00:00:00Z",
                 annotations: {ichor.maesh.dev/allow-delete: "true"}}
      spec: {clusterRef: {name: c}, role: controlplane, approved: true, approvalDecision: {at: "2026-10-01T00:03:00Z"}}
  cp4-pending:
    apiVersion: ichor.maesh.dev/v1alpha1
    kind: TalosMachine
    metadata: {name: cp4, namespace: ns, creationTimestamp: "2026-10-01T00:00:00Z"}
    spec: {clusterRef: {name: c}, role: controlplane, approved: false}
"#;

/// How many cases the shipped suite holds (the JSON report says).
fn shipped_cases() -> usize {
    let out = run(&["test", "--format", "json"]);
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    v["cases"].as_array().map_or(0, Vec::len)
}

#[test]
fn the_shipped_suite_passes_and_says_what_decided_each_case() {
    let out = run(&["test"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let total = shipped_cases();
    assert!(total >= 149, "the seed suite: {total} cases");
    assert!(
        out.stdout
            .contains(&format!("{total} cases: {total} passed, 0 failed")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(
            "ok    machine delete without allow delete is refused (refuse by machine-allow-delete)"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("(allow: by `allow approve worker at webhook`)"),
        "{}",
        out.stdout
    );
    // A folder without test files means its tests/ folder: `test rules/` is the same suite.
    let again = run(&["test", "rules/", "--rules", "rules/"]);
    assert_eq!(again.code, 0);
    assert_eq!(again.stdout, out.stdout);
    // rules/tests/ is not part of the rule set: check and table are unchanged by it.
    let check = run(&["check", "--deny-warnings", "rules/"]);
    assert_eq!(check.code, 0, "{}", check.stdout);
    assert!(
        check.stdout.starts_with("checked 4 files"),
        "{}",
        check.stdout
    );
}

#[test]
fn a_failing_case_is_exit_1_with_the_difference() {
    let path = test_file(
        "failing",
        &format!(
            "{OBJECTS}
cases:
  - name: deleting cp1 is fine
    objects: [c, cps]
    delete: talosmachine/ns/cp1
    expect: {{verdict: allow}}
  - name: wrong rules
    objects: [c, cps]
    delete: talosmachine/ns/cp1
    expect:
      verdict: refuse
      rules: [machine-allow-delete, quorum]
      messages: [needs the annotation, no such fragment]
  - name: passes
    objects: [c, cps]
    delete: talosmachine/ns/cp3
    expect: {{verdict: refuse, rules: [declared-count], messages: ['control planes 3 -> 2']}}
"
        ),
    );
    let out = run(&["test", &path]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let s = &out.stdout;
    assert!(
        s.contains(&format!("FAIL  deleting cp1 is fine ({path}:")),
        "{s}"
    );
    assert!(
        s.contains(
            "verdict: expected allow, decided refuse by declared-count, machine-allow-delete"
        ),
        "{s}"
    );
    assert!(
        s.contains("rules: expected machine-allow-delete, quorum, decided by declared-count, machine-allow-delete (missing: quorum; not expected: declared-count)"),
        "{s}"
    );
    assert!(
        s.contains("messages: none contains \"no such fragment\""),
        "{s}"
    );
    assert!(!s.contains("none contains \"needs the annotation\""), "{s}");
    assert!(s.contains("ok    passes (refuse by declared-count)"), "{s}");
    assert!(
        s.contains("3 cases: 1 passed, 2 failed, 0 filtered out"),
        "{s}"
    );
    // JSON: the same, per case, with the review that was decided.
    let out = run(&["test", &path, "--format", "json"]);
    assert_eq!(out.code, 1);
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["failed"], json!(2));
    assert_eq!(v["cases"][0]["status"], json!("fail"));
    assert_eq!(v["cases"][0]["actual"]["verdict"], json!("refuse"));
    assert_eq!(
        v["cases"][0]["review"]["request"]["operation"],
        json!("DELETE")
    );
    assert_eq!(v["cases"][2]["status"], json!("pass"));
    // JUnit: a failure element per failing case.
    let out = run(&["test", &path, "--format", "junit"]);
    assert_eq!(out.code, 1);
    assert!(out.stdout.starts_with("<?xml"), "{}", out.stdout);
    assert_eq!(out.stdout.matches("<failure ").count(), 2, "{}", out.stdout);
    assert_eq!(
        out.stdout.matches("<testcase ").count(),
        3,
        "{}",
        out.stdout
    );
}

#[test]
fn no_vacuous_pass() {
    let path = test_file(
        "vacuous",
        &format!(
            "{OBJECTS}
cases:
  - name: a label edit is allowed
    objects: [c, cps]
    apply:
      apiVersion: ichor.maesh.dev/v1alpha1
      kind: TalosMachine
      metadata: {{name: cp1, namespace: ns, labels: {{team: infra}}}}
    expect: {{verdict: allow}}
  - name: a label edit is no event
    objects: [c, cps]
    apply:
      apiVersion: ichor.maesh.dev/v1alpha1
      kind: TalosMachine
      metadata: {{name: cp1, namespace: ns, labels: {{team: infra}}}}
    expect: {{verdict: allow, events: 0}}
  - name: approving cp4 is allowed, and rules looked
    objects: [c, cps, cp4-pending]
    approve: talosmachine/ns/cp4
    expect: {{verdict: allow, warnings: ['the cluster is transitioning']}}
"
        ),
    );
    let out = run(&["test", &path]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let s = &out.stdout;
    assert!(s.contains("FAIL  a label edit is allowed"), "{s}");
    assert!(
        s.contains("vacuous: no rule decided this case: it produces no event"),
        "{s}"
    );
    assert!(
        s.contains("ok    a label edit is no event (allow: no event"),
        "{s}"
    );
    assert!(
        s.contains("ok    approving cp4 is allowed, and rules looked (allow: evaluated approval-cap, approval-makes-even; none refused or held)"),
        "{s}"
    );
}

#[test]
fn files_and_reviews_and_reconciles() {
    let path = test_file(
        "files",
        "cases:
  - name: a recorded review
    objects: objects-stream.yaml
    review: review-delete-cp1-refused.json
    expect:
      verdict: refuse
      rules: [machine-allow-delete, declared-count]
  - name: an inline review
    objects: [objects-stream.yaml]
    review:
      operation: DELETE
      old:
        apiVersion: ichor.maesh.dev/v1alpha1
        kind: TalosMachine
        metadata: {name: w1, namespace: ns, annotations: {ichor.maesh.dev/allow-delete: 'true'}}
        spec: {clusterRef: {name: c}, role: worker, approved: true}
    expect: {verdict: allow}
  - name: the controller applies cp1
    objects: objects-stream.yaml
    reconcile: ns/cp1
    expect: {verdict: proceed}
  - name: a forged NodeUnreachable, as a status write
    objects: objects-stream.yaml
    status:
      apiVersion: ichor.maesh.dev/v1alpha1
      kind: TalosMachine
      metadata: {name: cp1, namespace: ns}
      status: {conditions: [{type: Ready, status: 'False', reason: NodeUnreachable}]}
    expect: {verdict: refuse, rules: [status-only-by-controller]}
",
    );
    let out = run(&["test", &path]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("4 cases: 4 passed"), "{}", out.stdout);
}

#[test]
fn bad_test_files_are_exit_2_with_file_and_line() {
    for (name, body, says) in [
        (
            "unknown-key",
            "cases:\n  - name: x\n    delete: tm/ns/cp1\n    expect: {verdict: refuse, rules: [a]}\n    expext: {}\n",
            ":5:5: cases[0]: unknown field `expext`",
        ),
        (
            "no-rules",
            "cases:\n  - name: refused\n    objects: objects-stream.yaml\n    delete: tm/ns/cp1\n    expect: {verdict: refuse}\n",
            ":2: case \"refused\": expect.verdict `refuse` names the rules that must decide it",
        ),
        (
            "two-requests",
            "cases:\n  - name: both\n    objects: objects-stream.yaml\n    delete: tm/ns/cp1\n    approve: tm/ns/cp4\n    expect: {verdict: allow}\n",
            "this one gives delete, approve",
        ),
        (
            "hold-at-webhook",
            "cases:\n  - name: h\n    objects: objects-stream.yaml\n    delete: tm/ns/cp1\n    expect: {verdict: hold, rules: [x]}\n",
            "is the controller's",
        ),
        (
            "unknown-set",
            "objects:\n  base: objects-stream.yaml\ncases:\n  - name: s\n    objects: [bsae]\n    delete: tm/ns/cp1\n    expect: {verdict: allow}\n",
            "did you mean `base`?",
        ),
        (
            "missing-object",
            "cases:\n  - name: m\n    objects: objects-stream.yaml\n    delete: tm/ns/nope\n    expect: {verdict: allow}\n",
            "holds no TalosMachine ns/nope",
        ),
        (
            "node-alone",
            "cases:\n  - name: n\n    reconcile: ns/cp1\n    node: cp1\n    objects: objects-stream.yaml\n    expect: {verdict: proceed}\n",
            "`node` names the machine a step works on",
        ),
        (
            "step-target",
            "cases:\n  - name: s\n    step: reboot\n    objects: objects-stream.yaml\n    expect: {verdict: proceed}\n",
            "expected NAMESPACE/NAME of a TalosOperation",
        ),
        (
            "step-allow",
            "cases:\n  - name: s\n    step: ns/reboot\n    objects: objects-stream.yaml\n    expect: {verdict: allow}\n",
            "is the webhook's",
        ),
        (
            "step-no-operation",
            "cases:\n  - name: s\n    step: ns/nope\n    objects: objects-stream.yaml\n    expect: {verdict: proceed}\n",
            "no TalosOperation ns/nope",
        ),
        (
            "duplicate",
            "cases:\n  - name: d\n    reconcile: ns/cp1\n    objects: objects-stream.yaml\n    expect: {verdict: proceed}\n  - name: d\n    reconcile: ns/cp1\n    objects: objects-stream.yaml\n    expect: {verdict: proceed}\n",
            "two cases are named \"d\"",
        ),
    ] {
        let path = test_file(name, body);
        let out = run(&["test", &path]);
        assert_eq!(out.code, 2, "{name}: {}{}", out.stdout, out.stderr);
        assert!(out.stderr.contains(&path), "{name}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{name}: {}", out.stderr);
    }
    let out = run(&["test", "no/such/tests"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("no/such/tests"), "{}", out.stderr);
}

#[test]
fn run_filters_cases_by_name() {
    let out = run(&["test", "--run", "quorum"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let summary = out.stdout.lines().last().expect("a summary");
    let ran: usize = summary
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("count");
    let total = shipped_cases();
    assert!(ran > 0 && ran < total, "{summary}");
    assert!(
        summary.contains(&format!("{} filtered out", total - ran)),
        "{summary}"
    );
    for line in out.stdout.lines().filter(|l| l.starts_with("  ok")) {
        assert!(line.contains("quorum"), "{line}");
    }
    let out = run(&["test", "--run", "allow*refused"]);
    assert_eq!(out.code, 0);
    assert!(
        out.stdout
            .contains("ok    machine delete without allow delete is refused"),
        "{}",
        out.stdout
    );
    let out = run(&["test", "--run", "no case is called this"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("no case matches"), "{}", out.stderr);
}

#[test]
fn coverage_per_rule_and_branch_with_fail_under() {
    let out = run(&["test", "--coverage", "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    let rules = v["coverage"]["rules"].as_array().expect("rules");
    let quorum = rules
        .iter()
        .find(|r| r["rule"] == json!("quorum"))
        .expect("quorum");
    assert!(quorum["fired"].as_u64() > Some(0));
    assert_eq!(quorum["when_true"], json!(true));
    assert_eq!(quorum["when_false"], json!(true));
    let pct = v["coverage"]["percent"].as_f64().expect("percent");
    assert!(pct > 50.0 && pct < 100.0, "{pct}");
    // One case covers one branch: the percentage says how much is left.
    let path = test_file(
        "one-case",
        &format!(
            "{OBJECTS}
cases:
  - name: one
    objects: [c, cps]
    delete: talosmachine/ns/cp3
    expect: {{verdict: refuse, rules: [declared-count]}}
"
        ),
    );
    let out = run(&["test", &path, "--coverage"]);
    assert_eq!(out.code, 0);
    assert!(out.stdout.contains("coverage: "), "{}", out.stdout);
    assert!(out.stdout.contains("declared-count"), "{}", out.stdout);
    let out = run(&["test", &path, "--fail-under", "90"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stderr.contains("is below --fail-under 90%"),
        "{}",
        out.stderr
    );
    let out = run(&["test", &path, "--fail-under", "1"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = run(&["test", &path, "--fail-under", "120"]);
    assert_eq!(out.code, 2);
}

// ---------------------------------------------------------------------------------------
// JUnit is XML 1.0.
// ---------------------------------------------------------------------------------------

/// An element of a parsed XML document: its name and its attributes (values decoded).
type Element = (String, Vec<(String, String)>);

/// Whether XML 1.0 allows `c` in a document (production [2] Char).
fn xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// A careful check that `text` is a well-formed XML 1.0 document of the shape a JUnit
/// report has (a declaration, elements, attributes, text, references; no DTD, comments or
/// CDATA): every character allowed, every reference known and to an allowed character,
/// every attribute quoted and once per element, every element closed by its own name, one
/// root. Returns the elements, in document order.
fn parse_xml(text: &str) -> Result<Vec<Element>, String> {
    if let Some((at, c)) = text.char_indices().find(|(_, c)| !xml_char(*c)) {
        return Err(format!("byte {at}: {c:?} is not an XML 1.0 character"));
    }
    let mut rest = text;
    if let Some(r) = rest.strip_prefix("<?xml ") {
        let end = r.find("?>").ok_or("an unclosed XML declaration")?;
        rest = &r[end + 2..];
    }
    let name_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
    let reference = |r: &str| -> Result<(char, usize), String> {
        let end = r
            .find(';')
            .ok_or_else(|| format!("an unterminated reference at {r:.20?}"))?;
        let body = &r[1..end];
        let c = match body {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let n = if let Some(h) = body.strip_prefix("#x") {
                    u32::from_str_radix(h, 16)
                } else if let Some(d) = body.strip_prefix('#') {
                    d.parse()
                } else {
                    return Err(format!("an unknown entity &{body};"));
                };
                let c = n.ok().and_then(char::from_u32);
                c.filter(|c| xml_char(*c))
                    .ok_or_else(|| format!("&{body}; refers to no XML character"))?
            }
        };
        Ok((c, end + 1))
    };
    let mut elements = Vec::new();
    let mut open: Vec<String> = Vec::new();
    let mut roots = 0;
    loop {
        // Text up to the next tag.
        let lt = rest.find('<').unwrap_or(rest.len());
        let text_part = &rest[..lt];
        if open.is_empty() && !text_part.trim().is_empty() {
            return Err(format!("text outside the root: {text_part:.40?}"));
        }
        if text_part.contains("]]>") {
            return Err("`]]>` in text".into());
        }
        let mut t = text_part;
        while let Some(amp) = t.find('&') {
            let (_, n) = reference(&t[amp..])?;
            t = &t[amp + n..];
        }
        rest = &rest[lt..];
        if rest.is_empty() {
            break;
        }
        if let Some(r) = rest.strip_prefix("</") {
            let n = r.find(|c| !name_char(c)).unwrap_or(r.len());
            let name = &r[..n];
            let r = r[n..].trim_start();
            let r = r.strip_prefix('>').ok_or("a closing tag without `>`")?;
            match open.pop() {
                Some(o) if o == name => {}
                o => return Err(format!("</{name}> closes {o:?}")),
            }
            rest = r;
            continue;
        }
        let r = &rest[1..];
        let n = r.find(|c| !name_char(c)).unwrap_or(r.len());
        if n == 0 {
            return Err(format!("a tag without a name at {rest:.20?}"));
        }
        let name = r[..n].to_string();
        let mut r = &r[n..];
        let mut attrs: Vec<(String, String)> = Vec::new();
        let closed = loop {
            let spaced = r.starts_with([' ', '\t', '\n', '\r']);
            r = r.trim_start_matches([' ', '\t', '\n', '\r']);
            if let Some(x) = r.strip_prefix("/>") {
                r = x;
                break true;
            }
            if let Some(x) = r.strip_prefix('>') {
                r = x;
                break false;
            }
            if !spaced {
                return Err(format!(
                    "<{name}>: no space before an attribute at {r:.20?}"
                ));
            }
            let an = r.find(|c| !name_char(c)).unwrap_or(r.len());
            if an == 0 {
                return Err(format!("<{name}>: a bad attribute at {r:.20?}"));
            }
            let attr = r[..an].to_string();
            let x = r[an..]
                .trim_start()
                .strip_prefix('=')
                .ok_or("an attribute without `=`")?;
            let x = x.trim_start();
            let quote = x
                .chars()
                .next()
                .filter(|q| *q == '"' || *q == '\'')
                .ok_or("an unquoted attribute")?;
            let x = &x[1..];
            let end = x.find(quote).ok_or("an unterminated attribute")?;
            let raw = &x[..end];
            if raw.contains('<') {
                return Err(format!("<{name} {attr}>: `<` in an attribute value"));
            }
            let mut value = String::new();
            let mut v = raw;
            while let Some(amp) = v.find('&') {
                value.push_str(&v[..amp]);
                let (c, n) = reference(&v[amp..])?;
                value.push(c);
                v = &v[amp + n..];
            }
            value.push_str(v);
            if attrs.iter().any(|(a, _)| *a == attr) {
                return Err(format!("<{name}>: attribute {attr} twice"));
            }
            attrs.push((attr, value));
            r = &x[end + 1..];
        };
        if open.is_empty() {
            roots += 1;
        }
        elements.push((name.clone(), attrs));
        if !closed {
            open.push(name);
        }
        rest = r;
    }
    if let Some(o) = open.last() {
        return Err(format!("<{o}> is never closed"));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(elements)
}

#[test]
fn the_xml_check_refuses_what_xml_forbids() {
    assert!(
        parse_xml("<?xml version=\"1.0\"?>\n<a x=\"1\"><b y='&lt;&#10;'/>t&amp;</a>\n").is_ok()
    );
    for bad in [
        "<a>\u{FFFE}</a>",
        "<a x=\"\u{1}\"/>",
        "<a>&#xFFFF;</a>",
        "<a>&#1;</a>",
        "<a><b></a></b>",
        "<a x=\"1\" x=\"2\"/>",
        "<a>&nbsp;</a>",
        "<a x=\"<\"/>",
        "<a/><b/>",
        "<a>",
    ] {
        assert!(parse_xml(bad).is_err(), "{bad:?} passed");
    }
}

/// Issue 33: case names holding U+FFFE, U+FFFF or a C0 control were written into the
/// JUnit report as they were, which no XML parser reads.
#[test]
fn junit_is_well_formed_xml_whatever_the_case_names_hold() {
    let path = test_file(
        "junit-chars",
        &format!(
            "{OBJECTS}
cases:
  - name: \"odd \\uFFFE \\uFFFF \\x01 <&'\\\"> \\t tab\"
    objects: [c, cps]
    delete: talosmachine/ns/cp3
    expect: {{verdict: refuse, rules: [declared-count]}}
  - name: \"fails \\uFFFF\\r\\n\\x1B\"
    objects: [c, cps]
    delete: talosmachine/ns/cp3
    expect: {{verdict: allow}}
"
        ),
    );
    let out = run(&["test", &path, "--format", "junit"]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let elements = parse_xml(&out.stdout).unwrap_or_else(|e| panic!("{e}:\n{}", out.stdout));
    let names: Vec<&str> = elements
        .iter()
        .filter(|(e, _)| e == "testcase")
        .filter_map(|(_, a)| a.iter().find(|(k, _)| k == "name").map(|(_, v)| v.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            "odd \\u{fffe} \\u{ffff} \\u{1} <&'\"> \t tab",
            "fails \\u{ffff}\r\n\\u{1b}"
        ],
        "{}",
        out.stdout
    );
    assert_eq!(
        elements.iter().filter(|(e, _)| e == "failure").count(),
        1,
        "{}",
        out.stdout
    );
}

// ---------------------------------------------------------------------------------------
// Size.
// ---------------------------------------------------------------------------------------

/// Runs the binary as [`run`] does, failing if it has not finished within `limit`.
fn run_within(args: &[&str], limit: std::time::Duration) -> Out {
    let out = crate::support::process::output_within(
        Command::new(BIN)
            .args(args)
            .current_dir(root())
            .env("NO_COLOR", "1"),
        limit,
    );
    let out = Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    out
}

/// Issue 33: loading a test file searched the whole text for each case's line, so the
/// cases of one file took quadratic time (10,000 cases: 249 s in a debug build; 20,000:
/// about four times that). Every case is loaded and checked whether `--run` selects it or
/// not, so 20,000 cases of which one runs measure the loading: now about a second.
#[test]
fn twenty_thousand_cases_load_in_linear_time() {
    let mut text = format!("{OBJECTS}\ncases:\n");
    for i in 0..20_000 {
        text.push_str(&format!(
            "  - name: case {i}\n    objects: [c, cps]\n    delete: talosmachine/ns/cp3\n    expect: {{verdict: refuse, rules: [declared-count]}}\n"
        ));
    }
    let path = test_file("twenty-thousand", &text);
    let out = run_within(
        &["test", &path, "--run", "case 19999"],
        std::time::Duration::from_secs(120),
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("1 cases: 1 passed, 0 failed, 19999 filtered out"),
        "{}",
        out.stdout
    );
    // A bad case among them is still found, with its line.
    let bad = text.replacen(
        "  - name: case 15000\n    objects: [c, cps]\n    delete: talosmachine/ns/cp3\n    expect: {verdict: refuse, rules: [declared-count]}\n",
        "  - name: case 15000\n    objects: [c, cps]\n    delete: talosmachine/ns/cp3\n    expect: {verdict: refuse}\n",
        1,
    );
    assert_ne!(bad, text);
    let path = test_file("twenty-thousand-bad", &bad);
    let out = run_within(
        &["test", &path, "--run", "case 19999"],
        std::time::Duration::from_secs(120),
    );
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    let at = bad.find("  - name: case 15000\n").expect("the case");
    let line = 1 + bad[..at].matches('\n').count();
    assert!(
        out.stderr
            .contains(&format!("{path}:{line}: case \"case 15000\"")),
        "{}",
        out.stderr
    );
}

/// Issue 33: the nesting check guarded `--objects` only; a deeply nested test file, or an
/// `apply:`/`status:` file one names, went to the YAML parser as it was (500 KB: 75-85 s in
/// a release build, over 200 s in a debug one, to fail). Every input now goes through the
/// one bounded loader, and is refused at once, naming the file, line and column.
#[test]
fn a_deeply_nested_test_file_or_file_it_names_is_refused_at_once() {
    let deep = 250_000;
    let flow = format!("{}{}", "[".repeat(deep), "]".repeat(deep));
    let object = format!(
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata: {{name: cp1, namespace: ns, labels: {flow}}}\n"
    );
    let limit = std::time::Duration::from_secs(30);
    // The test file itself: flow, block, and an inline object nested too deep.
    for (name, text, at) in [
        ("deep-flow", format!("cases: {flow}\n"), ":1:134:"),
        (
            "deep-block",
            format!("cases:\n{}x\n", "- ".repeat(deep)),
            ":2:",
        ),
        (
            "deep-inline",
            format!(
                "cases:\n  - name: inline\n    objects: objects-stream.yaml\n    apply: {{apiVersion: ichor.maesh.dev/v1alpha1, kind: TalosMachine, metadata: {{name: cp1, namespace: ns, labels: {flow}}}}}\n    expect: {{verdict: allow}}\n"
            ),
            ":4:",
        ),
    ] {
        let path = test_file(name, &text);
        let out = run_within(&["test", &path], limit);
        assert_eq!(out.code, 2, "{name}: {}{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains(&format!("{path}{at}"))
                && out.stderr.contains("nested more than 128 levels deep")
                && out.stderr.contains("a test file nests far less"),
            "{name}: {}",
            out.stderr
        );
    }
    // The files a case names: its request (apply, status) and its objects.
    for (key, file) in [
        ("apply", "deep-apply.yaml"),
        ("status", "deep-status.yaml"),
        ("objects", "deep-objects.yaml"),
    ] {
        let verdict = if key == "status" {
            "refuse, rules: [x]"
        } else {
            "allow"
        };
        let request = if key == "objects" {
            "delete: talosmachine/ns/cp1".to_string()
        } else {
            format!("{key}: {file}")
        };
        let objects = if key == "objects" {
            file
        } else {
            "objects-stream.yaml"
        };
        let path = test_file(
            &format!("names-{key}"),
            &format!(
                "cases:\n  - name: names a deep file\n    objects: {objects}\n    {request}\n    expect: {{verdict: {verdict}}}\n"
            ),
        );
        let dir = std::path::Path::new(&path).parent().expect("dir");
        std::fs::write(dir.join(file), &object).expect("write");
        let out = run_within(&["test", &path], limit);
        assert_eq!(out.code, 2, "{key}: {}{}", out.stdout, out.stderr);
        assert!(
            out.stderr
                .contains(&format!("{path}:2: case \"names a deep file\": "))
                && out.stderr.contains(file)
                && out.stderr.contains("line 3, column ")
                && out.stderr.contains("nested more than 128 levels deep"),
            "{key}: {}",
            out.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------
// A missing TalosCluster.
// ---------------------------------------------------------------------------------------

/// Issue 33: a case whose TalosCluster was missing (here: in another namespace) passed
/// silently, the cluster read as missing. It fails now unless it says `clusterMissing:
/// true`, and the report says the cluster is missing either way.
#[test]
fn a_missing_cluster_fails_the_case_unless_it_is_declared() {
    let case = |declared: &str, cluster_ns: &str| {
        format!(
            "objects:
  c:
    apiVersion: ichor.maesh.dev/v1alpha1
    kind: TalosCluster
    metadata: {{name: c, namespace: {cluster_ns}}}
    spec: {{controlPlane: {{count: 3}}, schedulable: \"true\"}}
  w1:
    apiVersion: ichor.maesh.dev/v1alpha1
    kind: TalosMachine
    metadata: {{name: w1, namespace: ns, annotations: {{ichor.maesh.dev/allow-delete: 'true'}}}}
    spec: {{clusterRef: {{name: c}}, role: worker, approved: true}}
cases:
  - name: deleting a worker
    objects: [c, w1]{declared}
    delete: talosmachine/ns/w1
    expect: {{verdict: allow}}
"
        )
    };
    // The cluster is in another namespace: read as missing, and not declared.
    let path = test_file("cluster-elsewhere", &case("", "other"));
    let out = run(&["test", &path]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains(&format!("FAIL  deleting a worker ({path}:")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(
            "- cluster: the objects hold no TalosCluster ns/c, so it was read as missing"
        ) && out.stdout.contains("write `clusterMissing: true`"),
        "{}",
        out.stdout
    );
    let json = run(&["test", &path, "--format", "json"]);
    let v: Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(v["cases"][0]["status"], json!("fail"));
    assert_eq!(v["cases"][0]["actual"]["missing_clusters"], json!(["ns/c"]));
    // Declared: it passes, and the human report still says the cluster is missing.
    let path = test_file(
        "cluster-declared-missing",
        &case("\n    clusterMissing: true", "other"),
    );
    let out = run(&["test", &path]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("ok    deleting a worker")
            && out
                .stdout
                .contains("note: the objects hold no TalosCluster ns/c: it is read as missing")
            && out.stdout.contains("(`clusterMissing: true`)"),
        "{}",
        out.stdout
    );
    // Declared, but the cluster is there: the declaration is wrong.
    let path = test_file(
        "cluster-declared-present",
        &case("\n    clusterMissing: true", "ns"),
    );
    let out = run(&["test", &path]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("- cluster: the case says `clusterMissing: true`, and the objects hold every TalosCluster"),
        "{}",
        out.stdout
    );
    // Present and not declared: an ordinary pass, no note.
    let path = test_file("cluster-present", &case("", "ns"));
    let out = run(&["test", &path]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(!out.stdout.contains("note:"), "{}", out.stdout);
}
