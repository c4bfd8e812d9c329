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
        check.stdout.starts_with("checked 3 files"),
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
