//! The command line, run as a process: `eval` and `explain` on the fixtures in
//! tests/fixtures/ (a multi-document objects stream, a `kind: List` objects file, and
//! AdmissionReview v1 JSON), `check` on the shipped rules and on broken copies, and the
//! exit-2 contract for bad input (one line on stderr naming the file, never a panic).

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ichor-rules");

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the binary from the crate root (so `rules` is the shipped rules).
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
    assert!(
        !out.stderr.contains("panicked"),
        "the binary panicked: {}",
        out.stderr
    );
    out
}

fn fixture(name: &str) -> String {
    format!("tests/fixtures/{name}")
}

const STREAM: &str = "tests/fixtures/objects-stream.yaml";
const LIST: &str = "tests/fixtures/objects-list.yaml";

fn eval_review(objects: &str, review: &str) -> Out {
    run(&[
        "eval",
        "--rules",
        "rules",
        "--objects",
        objects,
        "--review",
        &fixture(review),
    ])
}

/// Issue 13: a status patch that forges Ready=False NodeUnreachable (what admission reads as
/// `member.dead`) is refused unless it comes from the controller's own identity, and `eval`
/// decides it as the webhook does.
#[test]
fn eval_refuses_a_forged_status_patch_unless_the_controller_made_it() {
    let review = fixture("review-status-forged-cp3.json");
    // No controller named: nobody's status write of what the rules read is trusted.
    let out = run(&[
        "eval",
        "--rules",
        "rules",
        "--objects",
        STREAM,
        "--review",
        &review,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let r = &out.json()["response"];
    assert_eq!(
        r["uid"],
        request_uid("review-status-forged-cp3.json").as_str()
    );
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    let message = r["status"]["message"].as_str().expect("a message");
    assert!(
        message.starts_with(
            "only the ichor-rules controller may set or clear what it and the rules read in the status of TalosMachine cp3"
        ),
        "{message}"
    );
    // Another username than the writer's: still refused.
    let out = run(&[
        "eval",
        "--rules",
        "rules",
        "--objects",
        STREAM,
        "--review",
        &review,
        "--controller-username",
        "system:serviceaccount:ichor-system:ichor-rules-controller",
    ]);
    assert_eq!(out.json()["response"]["allowed"], false, "{}", out.stdout);
    // The writer is the controller: allowed.
    let out = run(&[
        "eval",
        "--rules",
        "rules",
        "--objects",
        STREAM,
        "--review",
        &review,
        "--controller-username",
        "system:serviceaccount:ns:node-watcher",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json()["response"]["allowed"], true, "{}", out.stdout);
    // `explain` names the rule and the fact that decided.
    let out = run(&[
        "explain",
        "--rules",
        "rules",
        "--objects",
        STREAM,
        "--review",
        &review,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("status-only-by-controller"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("request.by_controller"),
        "{}",
        out.stdout
    );
}

fn eval_reconcile(objects: &str, target: &str) -> Out {
    run(&[
        "eval",
        "--rules",
        "rules",
        "--objects",
        objects,
        "--reconcile",
        target,
    ])
}

/// The uid of a review fixture's request.
fn request_uid(review: &str) -> String {
    let text = std::fs::read_to_string(root().join(fixture(review))).expect("fixture");
    let v: Value = serde_json::from_str(&text).expect("fixture is JSON");
    v["request"]["uid"].as_str().expect("uid").to_string()
}

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A copy of the shipped rules in a scratch folder.
fn rules_copy(name: &str) -> PathBuf {
    let dir = scratch(name);
    for entry in std::fs::read_dir(root().join("rules")).expect("rules/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "rules") {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).expect("copy");
        }
    }
    dir
}

/// Exit 2, one line on stderr naming `file`, nothing on stdout.
#[track_caller]
fn assert_bad_input(out: &Out, file: &str, problem: &str) {
    assert_eq!(out.code, 2, "exit code; stderr: {}", out.stderr);
    let lines: Vec<&str> = out.stderr.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {:?}", out.stderr);
    assert!(
        lines[0].contains(file),
        "{:?} does not name {file:?}",
        lines[0]
    );
    assert!(
        lines[0].to_lowercase().contains(&problem.to_lowercase()),
        "{:?} does not say {problem:?}",
        lines[0]
    );
    assert!(out.stdout.is_empty(), "nothing on stdout: {:?}", out.stdout);
}

const DECLARED_3_TO_2: &str = "node remove: control planes 3 -> 2, below the declared count of 3; either approve a replacement control plane first (then remove this one), or lower spec.controlPlane.count first (to 1, 3 or 5) if you mean to shrink the cluster";

// ---------------------------------------------------------------------------------------
// eval --review
// ---------------------------------------------------------------------------------------

#[test]
fn eval_review_allowed() {
    let out = eval_review(STREAM, "review-delete-w1-allowed.json");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    let r = &v["response"];
    assert_eq!(
        r["uid"],
        request_uid("review-delete-w1-allowed.json").as_str()
    );
    assert_eq!(r["allowed"], true);
    assert!(r["status"].get("code").is_none_or(|c| c != 403), "{r}");
    assert!(
        r.get("warnings").is_none_or(Value::is_null),
        "no warnings: {r}"
    );
    assert!(v.get("request").is_none(), "the answer carries no request");
}

#[test]
fn eval_review_refused_reports_every_reason() {
    let out = eval_review(STREAM, "review-delete-cp1-refused.json");
    assert_eq!(out.code, 0, "a decision was made: {}", out.stderr);
    let v = out.json();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    let r = &v["response"];
    assert_eq!(
        r["uid"],
        request_uid("review-delete-cp1-refused.json").as_str()
    );
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    let message = r["status"]["message"].as_str().expect("a message");
    let lines: Vec<&str> = message.lines().collect();
    assert_eq!(lines.len(), 2, "{message}");
    assert!(
        lines[0].starts_with(
            "deleting TalosMachine cp1 needs the annotation ichor.maesh.dev/allow-delete: \"true\""
        ),
        "{message}"
    );
    assert_eq!(lines[1], DECLARED_3_TO_2);
    assert!(r.get("warnings").is_none_or(Value::is_null), "{r}");
}

#[test]
fn eval_review_allowed_with_warning() {
    let out = eval_review(STREAM, "review-approve-cp4-warns.json");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let r = &out.json()["response"];
    assert_eq!(
        r["uid"],
        request_uid("review-approve-cp4-warns.json").as_str()
    );
    assert_eq!(r["allowed"], true);
    let warnings = r["warnings"].as_array().expect("warnings present");
    assert_eq!(warnings.len(), 1, "{r}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with("approving cp4 makes 4 approved control planes for a declared count of 3"),
        "{r}"
    );
}

#[test]
fn eval_review_against_a_list_objects_file() {
    // In the List, cluster c has count 1 and three approved control planes: only the
    // annotation refuses the delete of cp1.
    let out = eval_review(LIST, "review-delete-cp1-refused.json");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let r = &out.json()["response"];
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    let message = r["status"]["message"].as_str().unwrap();
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.contains("needs the annotation"), "{message}");
}

#[test]
fn eval_review_of_another_kind_is_allowed() {
    let dir = scratch("other-kind");
    let review = dir.join("review.json");
    std::fs::write(
        &review,
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
  "uid":"u-1","kind":{"group":"","version":"v1","kind":"ConfigMap"},
  "resource":{"group":"","version":"v1","resource":"configmaps"},
  "name":"x","namespace":"ns","operation":"DELETE","userInfo":{"username":"a"},
  "object":null,
  "oldObject":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"ns"}}}}"#,
    )
    .unwrap();
    let out = run(&[
        "eval",
        "--objects",
        STREAM,
        "--review",
        review.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let r = &out.json()["response"];
    assert_eq!(r["uid"], "u-1");
    assert_eq!(r["allowed"], true);
}

#[test]
fn a_review_of_another_admission_version_is_bad_input() {
    let dir = scratch("admission-version");
    let body =
        std::fs::read_to_string(root().join(fixture("review-delete-cp1-refused.json"))).unwrap();
    for version in ["admission.k8s.io/v1beta1", "admission.k8s.io/v2"] {
        let review = dir.join("review.json");
        std::fs::write(&review, body.replace("admission.k8s.io/v1", version)).unwrap();
        let out = run(&[
            "eval",
            "--objects",
            STREAM,
            "--review",
            review.to_str().unwrap(),
        ]);
        assert_eq!(out.code, 2, "{version}: {}", out.stdout);
        assert!(out.stderr.contains("admission.k8s.io/v1"), "{}", out.stderr);
    }
}

#[test]
fn a_request_without_the_object_it_needs_is_bad_input() {
    let dir = scratch("missing-object");
    let body: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join(fixture("review-delete-cp1-refused.json"))).unwrap(),
    )
    .unwrap();
    for (op, drop) in [
        ("DELETE", "oldObject"),
        ("UPDATE", "object"),
        ("CREATE", "object"),
    ] {
        let mut r = body.clone();
        r["request"]["operation"] = Value::from(op);
        if op == "UPDATE" {
            r["request"]["object"] = r["request"]["oldObject"].clone();
        }
        if op == "CREATE" {
            r["request"]["oldObject"] = Value::Null;
        }
        r["request"][drop] = Value::Null;
        let review = dir.join("review.json");
        std::fs::write(&review, r.to_string()).unwrap();
        let out = run(&[
            "eval",
            "--objects",
            STREAM,
            "--review",
            review.to_str().unwrap(),
        ]);
        assert_eq!(out.code, 2, "{op}: {}", out.stdout);
        assert!(
            out.stderr.contains(&format!(
                "a {op} of a TalosMachine carries `request.{drop}`"
            )),
            "{}",
            out.stderr
        );
    }
}

/// A reader that goes away (`| head`) or a full disk is never a panic.
#[test]
fn a_closed_or_full_stdout_is_not_a_panic() {
    use std::process::{Command, Stdio};
    for args in [
        vec!["crds"],
        vec!["check", "rules"],
        vec!["table", "rules"],
        vec![
            "eval",
            "--objects",
            "examples/objects.yaml",
            "--review",
            "examples/delete-cp.json",
        ],
    ] {
        let mut child = Command::new(BIN)
            .args(&args)
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(out.status.code(), Some(101), "{args:?}");
        if std::path::Path::new("/dev/full").exists() {
            let out = Command::new(BIN)
                .args(&args)
                .current_dir(root())
                .stdout(std::fs::File::create("/dev/full").unwrap())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains("cannot write to standard output"),
                "{stderr}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// eval --reconcile
// ---------------------------------------------------------------------------------------

#[track_caller]
fn assert_reconcile_shape(v: &Value) {
    let mut keys: Vec<&str> = v
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    // Exactly the shape the issue states, nothing more.
    assert_eq!(keys, ["message", "reason", "rules", "verdict"], "{v}");
    assert!(v["rules"].is_array(), "{v}");
}

#[test]
fn eval_reconcile_hold() {
    let out = eval_reconcile(LIST, "ns/cp3");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_reconcile_shape(&v);
    assert_eq!(v["verdict"], "hold");
    assert_eq!(v["reason"], "ControlPlaneOverCap");
    assert_eq!(v["rules"], serde_json::json!(["over-cap"]));
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("cp3 is approved control plane number 3, past the cap of spec.controlPlane.count + 1 = 2"),
        "{v}"
    );
}

#[test]
fn eval_reconcile_proceed() {
    for target in ["ns/cp1", "ns/cp2"] {
        let out = eval_reconcile(LIST, target);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let v = out.json();
        assert_reconcile_shape(&v);
        assert_eq!(v["verdict"], "proceed", "{target}: {v}");
        assert!(v["reason"].is_null() && v["message"].is_null(), "{v}");
        assert_eq!(v["rules"], serde_json::json!([]));
    }
}

#[test]
fn eval_reconcile_refuse() {
    let out = eval_reconcile(LIST, "ns/d3");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_reconcile_shape(&v);
    assert_eq!(v["verdict"], "refuse");
    assert_eq!(v["reason"], "RemovalRefused");
    assert_eq!(v["rules"], serde_json::json!(["declared-count"]));
    assert_eq!(v["message"], DECLARED_3_TO_2);
}

#[test]
fn eval_reconcile_operation_parked() {
    let out = eval_reconcile(LIST, "ns/up-e");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_reconcile_shape(&v);
    assert_eq!(v["verdict"], "hold");
    assert_eq!(v["reason"], "ClusterTransitioning");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("waits for the control-plane count to be odd again"),
        "{v}"
    );
}

#[test]
fn eval_reconcile_from_a_stream() {
    // The stream ends in an empty document: it is skipped.
    for target in ["ns/cp1", "ns/w1", "ns/cp4", "ns/up-old"] {
        let out = eval_reconcile(STREAM, target);
        assert_eq!(out.code, 0, "{target}: {}", out.stderr);
        let v = out.json();
        assert_reconcile_shape(&v);
        assert_eq!(v["verdict"], "proceed", "{target}: {v}");
    }
}

// ---------------------------------------------------------------------------------------
// explain
// ---------------------------------------------------------------------------------------

#[test]
fn explain_review_names_rules_and_matches() {
    let out = run(&[
        "explain",
        "--objects",
        STREAM,
        "--review",
        &fixture("review-delete-cp1-refused.json"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = &out.stdout;
    for needle in [
        "MATCH",
        "machine-allow-delete",
        "declared-count",
        "quorum",
        "last-control-plane",
        "verdict: refused",
    ] {
        assert!(s.contains(needle), "explain lacks {needle:?}:\n{s}");
    }
    assert!(s.contains("cp1"), "{s}");
}

#[test]
fn explain_allowed_review() {
    let out = run(&[
        "explain",
        "--objects",
        STREAM,
        "--review",
        &fixture("review-delete-w1-allowed.json"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("machine-allow-delete"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("verdict: allowed"), "{}", out.stdout);
}

#[test]
fn explain_reconcile_names_rules_and_matches() {
    let out = run(&["explain", "--objects", LIST, "--reconcile", "ns/cp3"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = &out.stdout;
    for needle in ["MATCH", "over-cap", "verdict: hold", "ns/cp3", "rank"] {
        assert!(s.contains(needle), "explain lacks {needle:?}:\n{s}");
    }
}

/// `explain` of a reconcile shows the plan that runs once the rules let it: an operation's
/// (by its kind), a control plane's removal; in JSON as `table --format json` has it. A
/// machine with nothing to remove has no plan.
#[test]
fn explain_reconcile_shows_the_plan_that_runs() {
    const PLANS: &str = "tests/fixtures/objects-plans.yaml";
    let out = run(&[
        "explain",
        "--objects",
        PLANS,
        "--reconcile",
        "ns/reboot-cp1",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let s = &out.stdout;
    let at = s
        .find("then, once it may proceed, plan run operation \"reboot\"")
        .unwrap_or_else(|| panic!("no plan:\n{s}"));
    assert!(at > s.find("verdict: proceed").expect("the verdict"), "{s}");
    for step in [
        "  1. lock cluster",
        "  2. etcd healthy within 2m when target.controlplane or target.uncounted",
        "  6. talos reboot   -- Talos `Reboot`",
        "  9. uncordon node",
    ] {
        assert!(s[at..].contains(step), "{step:?}:\n{s}");
    }
    let out = run(&["explain", "--objects", PLANS, "--reconcile", "ns/cp4"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("plan remove controlplane")
            && out
                .stdout
                .contains("  4. etcd leave unless cluster.deleting or member.dead"),
        "{}",
        out.stdout
    );
    let out = run(&["explain", "--objects", PLANS, "--reconcile", "ns/cp2"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains("then, once"), "{}", out.stdout);
    let out = run(&[
        "explain",
        "--objects",
        PLANS,
        "--reconcile",
        "ns/reboot-cp1",
        "--format",
        "json",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_eq!(v["plan"]["kind"], "reboot", "{v}");
    assert_eq!(v["plan"]["steps"][5]["action"], "talos reboot", "{v}");
    let table = run(&["table", "--format", "json"]);
    let shipped = table.json()["plans"]
        .as_array()
        .expect("plans")
        .iter()
        .find(|p| p["kind"] == "reboot")
        .cloned()
        .expect("the reboot plan");
    assert_eq!(v["plan"], shipped);
}

/// A rule in audit mode is shown as such: it matches, and the request is still allowed.
#[test]
fn explain_shows_a_rule_in_audit_mode() {
    let args = |format: &str| {
        run(&[
            "explain",
            "--rules",
            "tests/rules/bad/audit_destructive.rules",
            "--objects",
            STREAM,
            "--review",
            &fixture("review-delete-cp1-refused.json"),
            "--format",
            format,
        ])
    };
    let out = args("human");
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("[MATCH] refuse audit declared-count"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("verdict: allowed"), "{}", out.stdout);
    let out = args("json");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    let rows: Vec<&serde_json::Value> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["rows"].as_array().unwrap())
        .collect();
    let row = rows
        .iter()
        .find(|r| r["rule"] == "declared-count")
        .expect("the audited rule's row");
    assert_eq!(row["mode"], "audit", "{row}");
    assert_eq!(row["matched"], true, "{row}");
}

#[test]
fn explain_bad_input_exits_2() {
    let out = run(&["explain", "--objects", LIST, "--reconcile", "ns/nobody"]);
    assert_bad_input(&out, LIST, "ns/nobody");
}

// ---------------------------------------------------------------------------------------
// check
// ---------------------------------------------------------------------------------------

#[test]
fn check_shipped_rules_exit_0() {
    let out = run(&["check", "rules/"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("0 errors"), "{}", out.stdout);
    // The default path is rules/.
    assert_eq!(run(&["check"]).code, 0);
}

#[test]
fn check_shipped_rules_are_warning_free() {
    let out = run(&["check", "rules", "--deny-warnings"]);
    assert_eq!(out.code, 0, "{}", out.stdout);
}

fn broken_rules(name: &str) -> PathBuf {
    let dir = scratch(name);
    std::fs::write(
        dir.join("bad.rules"),
        "rule r\n  refuse remove controlplane\n  when aproved > 1\n  say \"x {machine}\"\n",
    )
    .unwrap();
    dir
}

#[test]
fn check_broken_rules_exit_1() {
    let dir = broken_rules("broken-human");
    let out = run(&["check", dir.to_str().unwrap()]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("unknown fact or definition `aproved`"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("did you mean `approved`?"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("bad.rules:3:8"), "{}", out.stdout);
    assert!(out.stdout.contains("1 error"), "{}", out.stdout);
}

#[test]
fn check_json_format() {
    let dir = broken_rules("broken-json");
    let out = run(&["check", dir.to_str().unwrap(), "--format", "json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let v = out.json();
    assert_eq!(v["errors"], 1);
    let diags = v["diagnostics"].as_array().expect("diagnostics");
    let d = diags
        .iter()
        .find(|d| d["severity"] == "error")
        .expect("an error diagnostic");
    assert_eq!(d["code"], "ichor::check::unknown_name");
    assert_eq!(d["severity"], "error");
    assert!(d["file"].as_str().unwrap().ends_with("bad.rules"), "{d}");
    assert_eq!(d["line"], 3);
    assert_eq!(d["column"], 8);
    assert_eq!(d["message"], "unknown fact or definition `aproved`");
    for d in diags {
        for key in ["code", "severity", "file", "line", "column", "message"] {
            assert!(
                d.get(key).is_some_and(|v| !v.is_null()),
                "{key} missing in {d}"
            );
        }
    }
}

#[test]
fn check_json_format_shipped_rules_is_clean() {
    let out = run(&["check", "rules", "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_eq!(v["errors"], 0);
    assert_eq!(v["diagnostics"], serde_json::json!([]));
}

#[test]
fn deny_warnings_with_an_unused_let_exits_1() {
    let dir = rules_copy("unused-let");
    let removal = dir.join("removal.rules");
    let mut text = std::fs::read_to_string(&removal).unwrap();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let line = text.lines().count() + 1;
    text.push_str("let spare = approved + 1\n");
    std::fs::write(&removal, text).unwrap();
    let path = dir.to_str().unwrap();

    let out = run(&["check", path]);
    assert_eq!(out.code, 0, "warnings alone pass: {}", out.stdout);
    assert!(
        out.stdout.contains("`spare` is defined but never used"),
        "{}",
        out.stdout
    );

    let out = run(&["check", path, "--deny-warnings"]);
    assert_eq!(out.code, 1, "{}", out.stdout);

    let out = run(&["check", path, "--deny-warnings", "--format", "json"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    let v = out.json();
    assert_eq!(v["errors"], 0);
    let d = v["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["code"] == "ichor::lint::unused_let")
        .unwrap_or_else(|| panic!("no unused_let: {v}"));
    assert_eq!(d["severity"], "warning");
    assert!(
        d["file"].as_str().unwrap().ends_with("removal.rules"),
        "{d}"
    );
    assert_eq!(d["line"], line);
    assert_eq!(d["column"], 5);
    assert!(d["message"].as_str().unwrap().contains("spare"), "{d}");
}

#[test]
fn check_missing_path_exits_2() {
    let out = run(&["check", "no/such/rules"]);
    assert_bad_input(&out, "no/such/rules", "");
    // As JSON, stdout still says what went wrong.
    let out = run(&["check", "--format", "json", "no/such/rules"]);
    assert_eq!(out.code, 2);
    let v = out.json();
    assert_eq!(v["errors"], 1, "{v}");
    assert_eq!(
        v["diagnostics"][0]["code"], "ichor::input::unreadable",
        "{v}"
    );
    assert_eq!(v["diagnostics"][0]["file"], "no/such/rules", "{v}");
}

#[test]
fn eval_with_broken_rules_exits_2() {
    let dir = broken_rules("broken-eval");
    let out = run(&[
        "eval",
        "--rules",
        dir.to_str().unwrap(),
        "--objects",
        STREAM,
        "--reconcile",
        "ns/cp1",
    ]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    let last = out.stderr.trim_end().lines().last().unwrap_or("");
    assert!(last.contains(dir.to_str().unwrap()), "{last}");
    assert!(last.contains("error"), "{last}");
}

// ---------------------------------------------------------------------------------------
// Bad input: exit 2, one line naming the file and the problem.
// ---------------------------------------------------------------------------------------

#[test]
fn missing_objects_file() {
    let f = "tests/fixtures/no-such-objects.yaml";
    let out = eval_review(f, "review-delete-w1-allowed.json");
    assert_bad_input(&out, f, "no such file");
    let out = eval_reconcile(f, "ns/cp1");
    assert_bad_input(&out, f, "no such file");
}

#[test]
fn missing_review_file() {
    let out = eval_review(STREAM, "no-such-review.json");
    assert_bad_input(&out, "tests/fixtures/no-such-review.json", "no such file");
}

#[test]
fn malformed_objects_yaml() {
    let f = fixture("objects-malformed.yaml");
    let out = eval_review(&f, "review-delete-w1-allowed.json");
    assert_bad_input(&out, &f, "not valid YAML");
}

#[test]
fn objects_with_a_bad_field() {
    let f = fixture("objects-bad-role.yaml");
    let out = eval_reconcile(&f, "ns/cp1");
    assert_bad_input(&out, &f, "boss");
}

#[test]
fn malformed_review_json() {
    let out = eval_review(STREAM, "review-malformed.json");
    assert_bad_input(&out, "tests/fixtures/review-malformed.json", "not JSON");
}

#[test]
fn review_that_is_not_an_admission_review() {
    let out = eval_review(STREAM, "review-not-admission.json");
    assert_bad_input(
        &out,
        "tests/fixtures/review-not-admission.json",
        "not an AdmissionReview",
    );
}

#[test]
fn review_without_a_request() {
    let out = eval_review(STREAM, "review-no-request.json");
    assert_bad_input(&out, "tests/fixtures/review-no-request.json", "request");
}

#[test]
fn review_that_is_a_json_array() {
    let dir = scratch("array-review");
    let f = dir.join("review.json");
    std::fs::write(&f, "[1, 2, 3]\n").unwrap();
    let f = f.to_str().unwrap();
    let out = run(&["eval", "--objects", STREAM, "--review", f]);
    assert_bad_input(&out, f, "AdmissionReview");
}

#[test]
fn review_with_a_bad_object() {
    let dir = scratch("bad-object-review");
    let f = dir.join("review.json");
    std::fs::write(
        &f,
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
  "uid":"u-2","kind":{"group":"ichor.maesh.dev","version":"v1alpha1","kind":"TalosMachine"},
  "resource":{"group":"ichor.maesh.dev","version":"v1alpha1","resource":"talosmachines"},
  "name":"m","namespace":"ns","operation":"CREATE","userInfo":{"username":"a"},
  "object":{"apiVersion":"ichor.maesh.dev/v1alpha1","kind":"TalosMachine",
            "metadata":{"name":"m","namespace":"ns"},"spec":{"role":"boss","approved":true}},
  "oldObject":null}}"#,
    )
    .unwrap();
    let f = f.to_str().unwrap();
    let out = run(&["eval", "--objects", STREAM, "--review", f]);
    assert_bad_input(&out, f, "boss");
}

#[test]
fn unknown_object_for_reconcile() {
    let out = eval_reconcile(LIST, "ns/nobody");
    assert_bad_input(&out, LIST, "no TalosMachine or TalosOperation ns/nobody");
    // Right name, wrong namespace.
    let out = eval_reconcile(LIST, "other/cp1");
    assert_bad_input(&out, LIST, "other/cp1");
}

#[test]
fn malformed_reconcile_target() {
    for target in ["cp1", "/cp1", "ns/"] {
        let out = eval_reconcile(LIST, target);
        assert_bad_input(&out, target, "NAMESPACE/NAME");
    }
}

#[test]
fn objects_path_is_a_directory() {
    let dir = scratch("objects-dir");
    let d = dir.to_str().unwrap();
    let out = run(&["eval", "--objects", d, "--reconcile", "ns/cp1"]);
    assert_bad_input(&out, d, "");
}

#[test]
fn objects_not_utf8() {
    let dir = scratch("objects-binary");
    let f = dir.join("objects.yaml");
    std::fs::write(&f, [0xff, 0xfe, 0x00, 0x41, 0x0a]).unwrap();
    let f = f.to_str().unwrap();
    let out = run(&["eval", "--objects", f, "--reconcile", "ns/cp1"]);
    assert_bad_input(&out, f, "UTF-8");
}

#[test]
fn list_item_that_is_not_an_object() {
    let dir = scratch("list-scalar");
    let f = dir.join("objects.yaml");
    std::fs::write(&f, "apiVersion: v1\nkind: List\nitems:\n- just a string\n").unwrap();
    let f = f.to_str().unwrap();
    let out = run(&["eval", "--objects", f, "--reconcile", "ns/cp1"]);
    assert_bad_input(&out, f, "document 1");
}

#[test]
fn top_level_scalar_objects_document() {
    let dir = scratch("scalar-doc");
    let f = dir.join("objects.yaml");
    std::fs::write(&f, "---\nhello\n").unwrap();
    let f = f.to_str().unwrap();
    let out = run(&["eval", "--objects", f, "--reconcile", "ns/cp1"]);
    assert_bad_input(&out, f, "document 1");
}

#[test]
fn a_file_named_twice_is_read_once() {
    let out = run(&["check", "rules", "rules/admission.rules", "rules/"]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(
        out.stdout.contains("checked 4 files: 0 errors"),
        "{}",
        out.stdout
    );
}

/// What the CRDs' schemas enforce in a cluster is enforced on an objects file too: one
/// line naming the file and the object, exit 2.
#[test]
fn objects_the_crds_would_refuse_are_bad_input() {
    let dir = scratch("invalid-objects");
    let cluster = |spec: &str| {
        format!(
            "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosCluster\nmetadata: {{name: prod, namespace: infra}}\nspec: {spec}\n"
        )
    };
    for (text, says) in [
        (cluster("{controlPlane: {count: 2}}"), "must be 1, 3 or 5"),
        (cluster("{controlPlane: {count: 3}, schedulable: maybe}"), "\"true\" or \"false\""),
        (
            cluster("{controlPlane: {count: 3}}").replace("v1alpha1", "v1beta1"),
            "is not served",
        ),
        ("apiVersion: v1\nkind: List\nitems: 3\n".to_string(), "`items` must be a list"),
        (
            "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosOperation\nmetadata: {name: o, namespace: infra}\nspec: {clusterRef: {name: prod}, kind: explode}\n".to_string(),
            "must be one of",
        ),
    ] {
        let objects = dir.join("objects.yaml");
        std::fs::write(&objects, &text).unwrap();
        let out = run(&[
            "eval",
            "--objects",
            objects.to_str().unwrap(),
            "--review",
            &fixture("review-delete-w1-allowed.json"),
        ]);
        assert_eq!(out.code, 2, "{text}: {}", out.stdout);
        assert!(out.stderr.contains(says), "{text}: {}", out.stderr);
        assert!(out.stderr.contains("objects.yaml"), "{}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    }
}

/// Columns count characters in both outputs, on a line with non-ASCII text too.
#[test]
fn human_and_json_columns_agree_on_non_ascii_lines() {
    let dir = scratch("columns");
    let file = dir.join("uni.rules");
    std::fs::write(
        &file,
        "# «ünïcödé»\nrule r refuse remove worker when «x» say \"y\"\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let human = run(&["check", path]);
    let json = run(&["check", "--format", "json", path]);
    let d = &json.json()["diagnostics"][0];
    let (line, column) = (d["line"].as_u64().unwrap(), d["column"].as_u64().unwrap());
    assert_eq!((line, column), (2, 34), "{d}");
    assert!(
        human
            .stdout
            .contains(&format!("uni.rules:{line}:{column}]")),
        "{}",
        human.stdout
    );
}

// ---------------------------------------------------------------------------------------
// An objects file is read whole or not at all: nothing in it is silently skipped.
// ---------------------------------------------------------------------------------------

/// A typo'd kind or apiVersion, a namespaced object without its namespace, an object of
/// another kind, or one listed twice would change what is counted (a refusal would flip to
/// allowed): each is bad input naming the file and the document.
#[test]
fn objects_that_would_be_skipped_are_bad_input() {
    let stream = std::fs::read_to_string(root().join(STREAM)).expect("fixture");
    // The fixture's cp1 delete is refused: it is what a skipped object would flip.
    let out = eval_review(STREAM, "review-delete-cp1-refused.json");
    assert_eq!(out.json()["response"]["allowed"], false, "{}", out.stdout);
    let cp2 = "kind: TalosMachine\nmetadata:\n  name: cp2\n  namespace: ns\n";
    assert!(stream.contains(cp2));
    let dir = scratch("skipped-objects");
    for (case, text, says) in [
        (
            "typo'd kind",
            stream.replace(cp2, &cp2.replace("TalosMachine", "TalosMachnie")),
            "(TalosMachnie ns/cp2): `TalosMachnie` is not a kind ichor-rules reads; did you mean `TalosMachine`?",
        ),
        (
            "typo'd apiVersion",
            stream.replacen(
                &format!("apiVersion: ichor.maesh.dev/v1alpha1\n{cp2}"),
                &format!("apiVersion: ichor.maesh.dev/v1alpah1\n{cp2}"),
                1,
            ),
            "(TalosMachine ns/cp2): apiVersion `ichor.maesh.dev/v1alpah1` is not served",
        ),
        (
            "no namespace",
            stream.replace(cp2, "kind: TalosMachine\nmetadata:\n  name: cp2\n"),
            "(TalosMachine cp2): `metadata.namespace` is missing",
        ),
        (
            "another kind",
            format!(
                "{stream}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x, namespace: ns}}\n"
            ),
            "(ConfigMap ns/x): `ConfigMap` is not a kind ichor-rules reads",
        ),
        (
            "listed twice",
            format!(
                "{stream}---\napiVersion: ichor.maesh.dev/v1alpha1\n{cp2}spec: {{clusterRef: {{name: c}}, role: controlplane, approved: true}}\n"
            ),
            "TalosMachine ns/cp2 appears twice (first in document 3)",
        ),
    ] {
        let f = dir.join("objects.yaml");
        std::fs::write(&f, &text).unwrap();
        let f = f.to_str().unwrap();
        let out = run(&[
            "eval",
            "--objects",
            f,
            "--review",
            &fixture("review-delete-cp1-refused.json"),
        ]);
        assert_bad_input(&out, f, says);
        assert!(out.stderr.contains("document "), "{case}: {}", out.stderr);
    }
}

/// 60,000 levels of nesting (120 KB) are refused at once, not parsed for seconds.
#[test]
fn deeply_nested_input_is_bad_input_at_once() {
    let dir = scratch("deep");
    let objects = dir.join("objects.yaml");
    let review = dir.join("review.json");
    let cases = [
        (objects.clone(), "[".repeat(60_000)),
        (objects.clone(), format!("{}x\n", "- ".repeat(60_000))),
        (objects.clone(), "{a: ".repeat(30_000)),
        (review.clone(), "[".repeat(60_000)),
        (
            review.clone(),
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}1{}}}"#,
                "[".repeat(60_000),
                "]".repeat(60_000)
            ),
        ),
    ];
    for (file, text) in cases {
        std::fs::write(&objects, "").unwrap();
        std::fs::write(&review, "{}").unwrap();
        std::fs::write(&file, &text).unwrap();
        let started = std::time::Instant::now();
        let out = run(&[
            "eval",
            "--objects",
            objects.to_str().unwrap(),
            "--review",
            review.to_str().unwrap(),
        ]);
        let took = started.elapsed();
        assert_bad_input(
            &out,
            file.to_str().unwrap(),
            "nested more than 128 levels deep",
        );
        assert!(
            took < std::time::Duration::from_secs(2),
            "{}: took {took:?}",
            file.display()
        );
    }
}

/// Issue 33: `--apply` and `--status` files went to the YAML parser unchecked (500 KB
/// nested: 75-85 s in a release build to fail, while `--objects` refused the same at
/// once). They go through the one bounded loader now.
#[test]
fn a_deeply_nested_apply_or_status_file_is_bad_input_at_once() {
    let dir = scratch("deep-apply");
    let deep = 250_000;
    let file = dir.join("deep.yaml");
    for (shape, text) in [
        (
            "flow",
            format!(
                "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata: {{name: cp1, namespace: ns, labels: {}{}}}\n",
                "[".repeat(deep),
                "]".repeat(deep)
            ),
        ),
        ("block", format!("{}x\n", "- ".repeat(deep))),
    ] {
        std::fs::write(&file, &text).unwrap();
        let f = file.to_str().unwrap();
        for (command, flag) in [
            ("eval", "--apply"),
            ("eval", "--status"),
            ("explain", "--apply"),
            ("explain", "--status"),
        ] {
            let out = crate::support::process::output_within(
                Command::new(BIN)
                    .args([command, "--objects", STREAM, flag, f])
                    .current_dir(root())
                    .env("NO_COLOR", "1"),
                std::time::Duration::from_secs(30),
            );
            let out = Out {
                code: out.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            };
            assert_bad_input(&out, f, "nested more than 128 levels deep");
            assert!(
                out.stderr.contains("a Kubernetes object nests far less"),
                "{shape} {command} {flag}: {}",
                out.stderr
            );
        }
    }
}

/// As the webhook answers it: a TalosOperation's spec never changes once created.
#[test]
fn eval_refuses_an_operations_spec_edit() {
    let dir = scratch("op-edit");
    let review = dir.join("review.json");
    let op = |kind: &str, machine: &str| {
        serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": "op-1", "namespace": "ns"},
            "spec": {"clusterRef": {"name": "c"}, "kind": kind, "machine": machine}
        })
    };
    let body = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-edit",
            "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": "TalosOperation"},
            "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": "talosoperations"},
            "name": "op-1", "namespace": "ns", "operation": "UPDATE",
            "userInfo": {"username": "a"},
            "oldObject": op("etcd-snapshot", "cp1"),
            "object": op("reset", "cp1")
        }
    });
    std::fs::write(&review, body.to_string()).unwrap();
    let out = run(&[
        "eval",
        "--objects",
        STREAM,
        "--review",
        review.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_eq!(v["response"]["allowed"], false, "{v}");
    assert!(
        v["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.kind `etcd-snapshot` -> `reset`")),
        "{v}"
    );
}

/// As the controller decides it: an operation that has not started has its start rules
/// decided again (here, a reset of a control plane at the declared count).
#[test]
fn eval_reconcile_decides_a_pending_operations_start_again() {
    let dir = scratch("op-start");
    let objects = dir.join("objects.yaml");
    let mut text = std::fs::read_to_string(root().join(STREAM)).expect("fixture");
    text.push_str("---\napiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosOperation\nmetadata: {name: reset-cp1, namespace: ns}\nspec: {clusterRef: {name: c}, kind: reset, machine: cp1}\n");
    std::fs::write(&objects, &text).unwrap();
    let out = eval_reconcile(objects.to_str().unwrap(), "ns/reset-cp1");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_eq!(v["verdict"], "refuse", "{v}");
    assert!(
        v["rules"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r == "reset-below-count")),
        "{v}"
    );
}

/// `ichor-rules table` shows each operation kind's plan, its steps in order with their
/// timeouts, guards and what each does: an upgrade installs its image before it cordons
/// and drains the node (issue 35), in the text and in the JSON alike.
#[test]
fn table_shows_the_operation_plans_step_by_step() {
    let out = run(&["table", "rules"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let text = &out.stdout;
    for kind in ["reboot", "upgrade", "rollback", "shutdown", "reset"] {
        assert!(
            text.contains(&format!("plan run operation \"{kind}\"")),
            "{kind}: {text}"
        );
    }
    let upgrade = text
        .split("plan run operation \"upgrade\"")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("the upgrade's plan");
    let steps: Vec<&str> = upgrade
        .lines()
        .filter_map(|l| l.trim().split("   -- ").next())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        steps,
        [
            "1. lock cluster",
            "2. etcd healthy within 2m when target.controlplane or target.uncounted",
            "3. talos install",
            "4. cordon node",
            "5. drain node",
            "6. etcd forfeit-leadership when (target.controlplane or target.uncounted) and approved > 1",
            "7. talos upgrade",
            "8. wait node-back within 15m",
            "9. etcd healthy within 5m when target.controlplane or target.uncounted",
            "10. uncordon node",
        ],
        "{upgrade}"
    );
    assert!(
        upgrade.contains("LifecycleService/Upgrade"),
        "each step says what it does: {upgrade}"
    );

    let out = run(&["table", "rules", "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    let plan = v["plans"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["kind"] == "upgrade"))
        .unwrap_or_else(|| panic!("no upgrade plan: {v}"));
    let actions: Vec<&str> = plan["steps"]
        .as_array()
        .map(|s| s.iter().filter_map(|x| x["action"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        actions,
        [
            "lock cluster",
            "etcd healthy",
            "talos install",
            "cordon node",
            "drain node",
            "etcd forfeit-leadership",
            "talos upgrade",
            "wait node-back",
            "etcd healthy",
            "uncordon node",
        ]
    );
    assert_eq!(plan["steps"][7]["within"], "within 15m", "{plan}");
}

/// `check` and `table` say which rules are in audit mode (recorded, never enforced), in
/// both formats, and only those: `check` also warns of the safety rule shipped in audit.
#[test]
fn check_and_table_show_the_rules_in_audit_mode() {
    const FILE: &str = "tests/rules/bad/audit_destructive.rules";
    let out = run(&["check", FILE]);
    assert_eq!(out.code, 0, "warnings only: {}", out.stderr);
    let said = format!("{}{}", out.stdout, out.stderr);
    assert!(
        said.contains(
            "in audit mode (recorded, not enforced): declared-count, staged-worker-floor"
        ),
        "{said}"
    );
    assert!(said.contains("audit_destructive"), "{said}");
    let out = run(&["check", FILE, "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_eq!(
        v["audit"],
        serde_json::json!(["declared-count", "staged-worker-floor"]),
        "{v}"
    );
    // The shipped rules have none in audit mode: no `audit` at all.
    let out = run(&["check", "rules", "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.json().get("audit").is_none(), "{}", out.stdout);

    let out = run(&["table", FILE]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let line = |rule: &str| {
        out.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("refuse {rule}")))
            .unwrap_or_else(|| panic!("no row of {rule}:\n{}", out.stdout))
            .to_string()
    };
    assert!(
        line("declared-count").contains("declared-count [audit]"),
        "{}",
        out.stdout
    );
    assert!(
        line("staged-worker-floor").contains("[audit]"),
        "{}",
        out.stdout
    );
    let out = run(&["table", "rules"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains("[audit]"), "{}", out.stdout);
    let out = run(&["table", FILE, "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    let rows: Vec<&serde_json::Value> = v["groups"]
        .as_array()
        .unwrap_or_else(|| panic!("no groups: {v}"))
        .iter()
        .flat_map(|g| g["rows"].as_array().into_iter().flatten())
        .collect();
    for rule in ["declared-count", "staged-worker-floor"] {
        let row = rows
            .iter()
            .find(|r| r["rule"] == rule || r["name"] == rule)
            .unwrap_or_else(|| panic!("no row of {rule}: {v}"));
        assert_eq!(row["audit"], true, "{row}");
    }
    assert!(
        rows.iter()
            .filter(|r| r["audit"] == true)
            .all(|r| r["name"] == "declared-count" || r["name"] == "staged-worker-floor"),
        "{v}"
    );
}

/// `replay --rules NEW` of a log whose decisions were refused by several rules: a decision
/// is listed under each rule that decided it (the old deciding rules when it would now be
/// allowed, the new ones when it would now be refused), directions in their order
/// (refuse -> allow first), rules by name within a direction, decisions in log order; the
/// human report counts each changed decision once, and per direction.
#[test]
fn replay_groups_a_change_under_every_rule_that_decided_it() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("replay-several-rules-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("new")).expect("dir");
    std::fs::write(
        dir.join("new/new.rules"),
        "rule too-many\n  refuse remove controlplane\n  when approved > 10\n  say \"{approved} approved\"\n",
    )
    .expect("rules");
    let record = |id: &str, name: &str, approved: i64, verdict: &str, deciding: &[&str]| {
        json!({
            "record": "decision", "id": id, "time": "2026-12-05T10:00:00Z", "site": "webhook",
            "request": {"uid": format!("u-{name}"), "user": "alice", "operation": "DELETE",
                        "kind": "TalosMachine", "namespace": "infra", "name": name},
            "rules": {"digest": "sha256:0000000000000000000000000000000000000000000000000000000000000000"},
            "events": [{"verb": "remove", "subject": "controlplane", "cluster": "prod",
                        "facts": [{"name": "approved", "value": approved},
                                  {"name": "count", "value": 3}]}],
            "verdict": verdict, "deciding": deciding, "would_verdict": verdict,
            "latency_us": 10
        })
        .to_string()
    };
    let log = [
        record("d1", "cp-1", 3, "refuse", &["quorum", "declared-count"]),
        record("d2", "cp-2", 3, "refuse", &["declared-count"]),
        record("d3", "cp-3", 20, "allow", &[]),
        record("d4", "cp-4", 5, "allow", &[]),
    ]
    .join("\n");
    let path = dir.join("decisions.ndjson");
    std::fs::write(&path, log + "\n").expect("log");
    let (log_arg, rules_arg) = (
        path.to_str().expect("utf-8").to_string(),
        dir.join("new").to_str().expect("utf-8").to_string(),
    );
    let out = run(&[
        "replay", &log_arg, "--rules", &rules_arg, "--format", "json",
    ]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v = out.json();
    assert_eq!(v["decisions"], 4, "{v}");
    assert_eq!(v["compared"], 4, "{v}");
    assert_eq!(v["reproduced"], 0, "{v}");
    let change = |id: &str, name: &str, from: &str, to: &str| {
        json!({"id": id, "what": format!("DELETE TalosMachine infra/{name} (uid u-{name})"),
               "from": from, "to": to, "would_from": from, "would_to": to})
    };
    assert_eq!(
        v["changes"],
        json!([
            {"from": "refuse", "to": "allow", "would_from": "refuse", "would_to": "allow",
             "rule": "declared-count",
             "decisions": [change("d1", "cp-1", "refuse", "allow"),
                           change("d2", "cp-2", "refuse", "allow")]},
            {"from": "refuse", "to": "allow", "would_from": "refuse", "would_to": "allow",
             "rule": "quorum",
             "decisions": [change("d1", "cp-1", "refuse", "allow")]},
            {"from": "allow", "to": "refuse", "would_from": "allow", "would_to": "refuse",
             "rule": "too-many",
             "decisions": [change("d3", "cp-3", "allow", "refuse")]},
        ]),
        "{v}"
    );
    let out = run(&["replay", &log_arg, "--rules", &rules_arg]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let lines: Vec<&str> = out.stdout.lines().skip(1).collect();
    assert_eq!(
        lines,
        [
            "3 decision(s) would change:",
            "refuse -> allow (2)",
            "  declared-count (2)",
            "    d1 DELETE TalosMachine infra/cp-1 (uid u-cp-1)",
            "    d2 DELETE TalosMachine infra/cp-2 (uid u-cp-2)",
            "  quorum (1)",
            "    d1 DELETE TalosMachine infra/cp-1 (uid u-cp-1)",
            "allow -> refuse (1)",
            "  too-many (1)",
            "    d3 DELETE TalosMachine infra/cp-3 (uid u-cp-3)",
        ],
        "{}",
        out.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `replay --audit-rule` / `--enforce-rule` switch rules of the rules given as `serve`
/// switches them (a rule named by both is enforced; a name no rule has is an error, exit 2),
/// and a decision whose would-be verdict changes is reported in a direction of its own: a
/// refusal whose rule is switched to audit becomes `refuse -> allow (would refuse)`; an
/// allowed decision that a rule in audit mode now would refuse, `allow -> allow (would
/// refuse)`, which a report of the enforced verdicts alone never shows. A record decided
/// by the same rules text in other modes is compared, not reproduced; in the same modes,
/// reproduced.
#[test]
fn replay_takes_the_rollout_switches_and_reports_would_be_changes() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("replay-switches-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("new")).expect("dir");
    std::fs::write(
        dir.join("new/new.rules"),
        "rule floor\n  refuse remove controlplane\n  when approved <= 3\n  say \"{approved} approved\"\n\n\
         rule too-many audit\n  refuse remove controlplane\n  when approved > 10\n  say \"{approved} approved\"\n",
    )
    .expect("rules");
    let record = |digest: &str, id: &str, approved: i64, verdict: &str, matched: Value| {
        let deciding: Vec<&str> = matched
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["mode"] == "enforce" && m["verdict"] == "refuse")
            .filter_map(|m| m["rule"].as_str())
            .collect();
        let would = if matched
            .as_array()
            .is_some_and(|ms| ms.iter().any(|m| m["verdict"] == "refuse"))
        {
            "refuse"
        } else {
            "allow"
        };
        json!({
            "record": "decision", "id": id, "time": "2026-12-05T10:00:00Z", "site": "webhook",
            "request": {"uid": format!("u-{id}"), "user": "alice", "operation": "DELETE",
                        "kind": "TalosMachine", "namespace": "infra", "name": format!("cp-{id}")},
            "rules": {"digest": digest, "audit": ["too-many"]},
            "events": [{"verb": "remove", "subject": "controlplane", "cluster": "prod",
                        "facts": [{"name": "approved", "value": approved}],
                        "matched": matched}],
            "verdict": verdict, "deciding": deciding, "would_verdict": would,
            "latency_us": 10
        })
        .to_string()
    };
    let floor =
        json!([{"rule": "floor", "verdict": "refuse", "mode": "enforce", "message": "3 approved"}]);
    let other = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let log = [
        record(other, "d1", 3, "refuse", floor.clone()),
        record(other, "d2", 20, "allow", json!([])),
        record(other, "d3", 5, "allow", json!([])),
    ]
    .join("\n");
    let path = dir.join("decisions.ndjson");
    std::fs::write(&path, log + "\n").expect("log");
    let (log_arg, rules_arg) = (
        path.to_str().expect("utf-8").to_string(),
        dir.join("new").to_str().expect("utf-8").to_string(),
    );
    let replay = |extra: &[&str]| {
        let mut args = vec!["replay", &log_arg, "--rules", &rules_arg];
        args.extend_from_slice(extra);
        run(&args)
    };
    let change = |id: &str, from: &str, to: &str, would_from: &str, would_to: &str| {
        json!({"id": id, "what": format!("DELETE TalosMachine infra/cp-{id} (uid u-{id})"),
               "from": from, "to": to, "would_from": would_from, "would_to": would_to})
    };
    // As the text says (too-many in audit): d2 would now be refused, and is not.
    let out = replay(&["--format", "json"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v = out.json();
    assert_eq!(v["compared"], 3, "{v}");
    assert_eq!(
        v["changes"],
        json!([
            {"from": "allow", "to": "allow", "would_from": "allow", "would_to": "refuse",
             "rule": "too-many", "decisions": [change("d2", "allow", "allow", "allow", "refuse")]},
        ]),
        "{v}"
    );
    let digest = v["digest"].as_str().expect("the digest").to_string();
    // floor switched to audit: d1's refusal becomes an allow it would still refuse.
    let out = replay(&["--audit-rule", "floor", "--format", "json"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v = out.json();
    assert_eq!(
        v["changes"],
        json!([
            {"from": "refuse", "to": "allow", "would_from": "refuse", "would_to": "refuse",
             "rule": "floor", "decisions": [change("d1", "refuse", "allow", "refuse", "refuse")]},
            {"from": "allow", "to": "allow", "would_from": "allow", "would_to": "refuse",
             "rule": "too-many", "decisions": [change("d2", "allow", "allow", "allow", "refuse")]},
        ]),
        "{v}"
    );
    let out = replay(&["--audit-rule", "floor"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let lines: Vec<&str> = out.stdout.lines().skip(1).collect();
    assert_eq!(
        lines,
        [
            "2 decision(s) would change:",
            "refuse -> allow (would refuse) (1)",
            "  floor (1)",
            "    d1 DELETE TalosMachine infra/cp-d1 (uid u-d1)",
            "allow -> allow (would refuse) (1)",
            "  too-many (1)",
            "    d2 DELETE TalosMachine infra/cp-d2 (uid u-d2)",
        ],
        "{}",
        out.stdout
    );
    // too-many enforced (also when named by both, as `serve` does): d2 is now refused.
    for extra in [
        &["--enforce-rule", "too-many"][..],
        &["--audit-rule", "too-many", "--enforce-rule", "too-many"][..],
    ] {
        let mut args = extra.to_vec();
        args.extend(["--format", "json"]);
        let out = replay(&args);
        assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
        let v = out.json();
        assert_eq!(
            v["changes"],
            json!([
                {"from": "allow", "to": "refuse", "would_from": "allow", "would_to": "refuse",
                 "rule": "too-many", "decisions": [change("d2", "allow", "refuse", "allow", "refuse")]},
            ]),
            "{extra:?}: {v}"
        );
    }
    // A name no rule has: an error naming it, nothing replayed.
    for (flag, mode) in [("--audit-rule", "audit"), ("--enforce-rule", "enforce")] {
        let out = replay(&[flag, "flor"]);
        assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
        assert!(
            out.stderr
                .contains(&format!("error: --{mode}-rule flor: no rule has this name")),
            "{}",
            out.stderr
        );
        assert_eq!(out.stdout, "", "nothing replayed");
    }

    // Decided by these very rules (too-many in audit, as recorded): reproduced, with or
    // without switches that give the same modes; switched otherwise, compared.
    let too_many = json!([{"rule": "too-many", "verdict": "refuse", "mode": "audit", "message": "20 approved"}]);
    let same = [
        record(&digest, "s1", 3, "refuse", floor),
        record(&digest, "s2", 20, "allow", too_many),
    ]
    .join("\n");
    std::fs::write(&path, same + "\n").expect("log");
    for extra in [&[][..], &["--audit-rule", "too-many"][..]] {
        let mut args = extra.to_vec();
        args.extend(["--format", "json"]);
        let out = replay(&args);
        assert_eq!(out.code, 0, "{extra:?}: {}{}", out.stdout, out.stderr);
        let v = out.json();
        assert_eq!(
            (v["reproduced"].clone(), v["compared"].clone()),
            (json!(2), json!(0)),
            "{v}"
        );
    }
    let out = replay(&["--audit-rule", "floor", "--format", "json"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v = out.json();
    assert_eq!(
        (v["reproduced"].clone(), v["compared"].clone()),
        (json!(0), json!(2)),
        "{v}"
    );
    assert_eq!(
        v["changes"],
        json!([
            {"from": "refuse", "to": "allow", "would_from": "refuse", "would_to": "refuse",
             "rule": "floor", "decisions": [change("s1", "refuse", "allow", "refuse", "refuse")]},
        ]),
        "{v}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
