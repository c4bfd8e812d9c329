//! Requests in kubectl words (`eval`/`explain` `--delete`, `--apply`, `--approve`,
//! `--unapprove`, `--unschedule`), run as the built binary: the AdmissionReview each builds
//! matches the real ones of tests/fixtures/ and examples/ field for field (the uid aside,
//! and the time an approval records), and is decided as the same review given with
//! `--review`.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
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

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("requests-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

fn read_json(path: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join(path)).expect("read")).expect("json")
}

/// The objects of tests/fixtures/objects-stream.yaml, with `live` in place of the object
/// of the same kind and name (added when absent): the state the real review was sent in.
fn objects_with(live: Option<&Value>) -> Vec<Value> {
    use serde::Deserialize;
    let text =
        std::fs::read_to_string(root().join("tests/fixtures/objects-stream.yaml")).expect("stream");
    let mut objects: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            serde_json::to_value(serde_yaml::Value::deserialize(d).expect("yaml")).expect("json")
        })
        .filter(|v| !v.is_null())
        .collect();
    if let Some(live) = live {
        let same = |o: &Value| {
            o["kind"] == live["kind"] && o["metadata"]["name"] == live["metadata"]["name"]
        };
        objects.retain(|o| !same(o));
        objects.push(live.clone());
    }
    objects
}

fn write_objects(dir: &Path, objects: &[Value]) -> String {
    let text = objects
        .iter()
        .map(|o| serde_yaml::to_string(o).expect("yaml"))
        .collect::<Vec<_>>()
        .join("---\n");
    let path = dir.join("objects.yaml");
    std::fs::write(&path, text).expect("write");
    path.display().to_string()
}

/// The review a request form builds.
fn built(objects: &str, form: &[&str]) -> Value {
    let mut args = vec!["eval", "--objects", objects, "--print-review"];
    args.extend_from_slice(form);
    let out = run(&args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).expect("a review")
}

/// Field for field: everything of the real review's request equals the built one's, but
/// the uid; the built options carry every real option (kubectl adds its field manager and
/// the propagation policy on top).
#[track_caller]
fn assert_matches(built: &Value, real: &Value, masked: &[&str]) {
    let (mut b, mut r) = (built.clone(), real.clone());
    for v in [&mut b, &mut r] {
        v["request"]["uid"] = Value::Null;
        for p in masked {
            if let Some(x) = v.pointer_mut(p) {
                *x = Value::Null;
            }
        }
    }
    let (bo, ro) = (
        b["request"]["options"].take(),
        r["request"]["options"].take(),
    );
    if let Some(ro) = ro.as_object() {
        for (k, v) in ro {
            assert_eq!(bo.get(k), Some(v), "options.{k}");
        }
    }
    let keys = |v: &Value| {
        let mut k: Vec<String> = v["request"]
            .as_object()
            .expect("request")
            .keys()
            .cloned()
            .collect();
        k.sort();
        k
    };
    assert_eq!(keys(&b), keys(&r), "the same request fields");
    assert_eq!(b, r, "the same review, field for field");
    let uid = built["request"]["uid"].as_str().expect("a uid");
    assert_eq!(uid.len(), 36, "a UUID: {uid}");
}

#[test]
fn delete_builds_the_real_delete_review() {
    let real = read_json("tests/fixtures/review-delete-w1-allowed.json");
    let dir = tmp("delete");
    let objects = write_objects(&dir, &objects_with(Some(&real["request"]["oldObject"])));
    let b = built(&objects, &["--delete", "talosmachine/ns/w1"]);
    assert_matches(&b, &real, &[]);
    // And it is decided as the real one is (uids aside).
    let by_words = run(&[
        "eval",
        "--objects",
        &objects,
        "--delete",
        "talosmachines/ns/w1",
    ]);
    let by_review = run(&[
        "eval",
        "--objects",
        &objects,
        "--review",
        "tests/fixtures/review-delete-w1-allowed.json",
    ]);
    assert_eq!(by_words.code, 0, "{}", by_words.stderr);
    let strip = |o: &Out| {
        let mut v: Value = serde_json::from_str(&o.stdout).expect("json");
        v["response"]["uid"] = Value::Null;
        v
    };
    assert_eq!(strip(&by_words), strip(&by_review));
    assert_eq!(strip(&by_words)["response"]["allowed"], json!(true));
}

#[test]
fn delete_of_the_example_matches_the_readme_review_and_is_refused() {
    let real = read_json("examples/delete-cp.json");
    let b = built(
        "examples/objects.yaml",
        &["--delete", "talosmachine/infra/cp-3"],
    );
    // examples/delete-cp.json is a shortened review: every field it has is the built one's.
    for (k, v) in real["request"].as_object().expect("request") {
        if k == "uid" || k == "userInfo" {
            continue;
        }
        if k == "oldObject" {
            // The example's object carries the allow-delete annotation; the objects file's
            // live cp-3 does not, and the built review sends the live object.
            let mut live = v.clone();
            live["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("annotations");
            assert_eq!(b["request"][k], live, "oldObject");
            continue;
        }
        assert_eq!(&b["request"][k], v, "request.{k}");
    }
    assert!(b["request"]["userInfo"]["username"].is_string());
    let out = run(&[
        "eval",
        "--objects",
        "examples/objects.yaml",
        "--delete",
        "talosmachine/infra/cp-3",
    ]);
    assert_eq!(out.code, 0);
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["response"]["allowed"], json!(false));
    let message = v["response"]["status"]["message"]
        .as_str()
        .expect("message");
    assert!(
        message.contains("below the declared count of 3"),
        "{message}"
    );
    assert!(message.contains("needs the annotation"), "{message}");
}

#[test]
fn approve_builds_the_real_approval_review() {
    let real = read_json("tests/fixtures/review-approve-cp4-warns.json");
    let dir = tmp("approve");
    let objects = write_objects(&dir, &objects_with(Some(&real["request"]["oldObject"])));
    let b = built(&objects, &["--approve", "talosmachine/ns/cp4"]);
    let at = b["request"]["object"]["spec"]["approvalDecision"]["at"]
        .as_str()
        .expect("an approval time");
    assert!(
        at.ends_with('Z') && at.len() == 20,
        "RFC 3339 seconds: {at}"
    );
    assert_matches(&b, &real, &["/request/object/spec/approvalDecision/at"]);
    // The same warning as the real one.
    let out = run(&["eval", "--objects", &objects, "--approve", "tm/ns/cp4"]);
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["response"]["allowed"], json!(true));
    let real_out = run(&[
        "eval",
        "--objects",
        &objects,
        "--review",
        "tests/fixtures/review-approve-cp4-warns.json",
    ]);
    let rv: Value = serde_json::from_str(&real_out.stdout).expect("json");
    assert!(
        rv["response"]["warnings"]
            .as_array()
            .is_some_and(|w| !w.is_empty())
    );
    assert_eq!(v["response"]["warnings"], rv["response"]["warnings"]);
}

#[test]
fn apply_of_an_existing_object_is_the_real_update() {
    let real = read_json("tests/fixtures/review-approve-cp4-warns.json");
    let dir = tmp("apply-update");
    let objects = write_objects(&dir, &objects_with(Some(&real["request"]["oldObject"])));
    let file = dir.join("cp4.yaml");
    std::fs::write(
        &file,
        serde_yaml::to_string(&real["request"]["object"]).expect("yaml"),
    )
    .expect("write");
    let b = built(&objects, &["--apply", file.to_str().expect("utf-8")]);
    assert_matches(&b, &real, &[]);
    assert_eq!(
        b["request"]["options"]["fieldManager"],
        json!("kubectl-client-side-apply")
    );
}

#[test]
fn apply_merges_the_file_onto_the_live_object_and_keeps_its_status() {
    let dir = tmp("apply-merge");
    let mut live = objects_with(None)
        .into_iter()
        .find(|o| o["metadata"]["name"] == json!("cp3"))
        .expect("cp3");
    live["status"] =
        json!({"conditions": [{"type": "Ready", "status": "False", "reason": "NodeUnreachable"}]});
    live["metadata"]["uid"] = json!("uid-cp3");
    let objects = write_objects(&dir, &objects_with(Some(&live)));
    // Only what changes: a move to another cluster; status in the file is ignored.
    let file = dir.join("move.yaml");
    std::fs::write(
        &file,
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata:\n  name: cp3\n  namespace: ns\nspec:\n  clusterRef: {name: other}\nstatus: {}\n",
    )
    .expect("write");
    let b = built(&objects, &["--apply", file.to_str().expect("utf-8")]);
    let r = &b["request"];
    assert_eq!(r["operation"], json!("UPDATE"));
    assert_eq!(r["object"]["spec"]["clusterRef"]["name"], json!("other"));
    assert_eq!(
        r["object"]["spec"]["role"],
        json!("controlplane"),
        "fields the file leaves out stay"
    );
    assert_eq!(
        r["object"]["status"], live["status"],
        "the status subresource is kept"
    );
    assert_eq!(r["object"]["metadata"]["uid"], json!("uid-cp3"));
    assert_eq!(r["oldObject"], live);
    // A move out of the cluster is a `move controlplane`: explain shows it.
    let out = run(&[
        "explain",
        "--objects",
        &objects,
        "--apply",
        file.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("move controlplane at the webhook"),
        "{}",
        out.stdout
    );
}

#[test]
fn apply_of_a_new_object_is_a_create() {
    let dir = tmp("apply-create");
    let objects = write_objects(&dir, &objects_with(None));
    let file = dir.join("op.yaml");
    std::fs::write(
        &file,
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosOperation\nmetadata:\n  name: up1\n  namespace: ns\nspec:\n  clusterRef: {name: c}\n  kind: upgrade\nstatus:\n  phase: Running\n",
    )
    .expect("write");
    let b = built(&objects, &["--apply", file.to_str().expect("utf-8")]);
    let r = &b["request"];
    assert_eq!(r["operation"], json!("CREATE"));
    assert_eq!(r["oldObject"], Value::Null);
    assert_eq!(r["kind"]["kind"], json!("TalosOperation"));
    assert_eq!(r["resource"]["resource"], json!("talosoperations"));
    assert_eq!(r["options"]["kind"], json!("CreateOptions"));
    assert!(r["object"].get("status").is_none(), "a create drops status");
    assert!(r["object"]["metadata"]["uid"].is_string());
    assert!(r["object"]["metadata"]["creationTimestamp"].is_string());
    let out = run(&[
        "explain",
        "--objects",
        &objects,
        "--apply",
        file.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("start operation at the webhook"),
        "{}",
        out.stdout
    );
}

#[test]
fn unapprove_and_unschedule_are_updates_of_one_field() {
    let dir = tmp("unapprove");
    let objects = write_objects(&dir, &objects_with(None));
    let b = built(&objects, &["--unapprove", "talosmachine/ns/w1"]);
    assert_eq!(b["request"]["operation"], json!("UPDATE"));
    assert_eq!(b["request"]["object"]["spec"]["approved"], json!(false));
    assert_eq!(b["request"]["oldObject"]["spec"]["approved"], json!(true));
    let b = built(&objects, &["--unschedule", "taloscluster/ns/c"]);
    assert_eq!(
        b["request"]["object"]["spec"]["schedulable"],
        json!("false")
    );
    assert_eq!(b["request"]["kind"]["kind"], json!("TalosCluster"));
    // The last worker of an unschedulable cluster cannot leave: the shipped rules refuse.
    let out = run(&["explain", "--objects", &objects, "--unschedule", "tc/ns/c"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("unschedule cluster at the webhook"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_missing_taloscluster_is_said() {
    let dir = tmp("missing-cluster");
    let objects: Vec<Value> = objects_with(None)
        .into_iter()
        .filter(|o| o["kind"] != json!("TalosCluster"))
        .collect();
    let objects = write_objects(&dir, &objects);
    let out = run(&[
        "explain",
        "--objects",
        &objects,
        "--delete",
        "talosmachine/ns/cp1",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .contains("note: the objects hold no TalosCluster ns/c"),
        "{}",
        out.stdout
    );
    let out = run(&[
        "eval",
        "--objects",
        &objects,
        "--delete",
        "talosmachine/ns/cp1",
    ]);
    assert_eq!(out.code, 0);
    assert!(
        out.stderr.contains("no TalosCluster ns/c"),
        "{}",
        out.stderr
    );
    let _: Value = serde_json::from_str(&out.stdout).expect("stdout stays an AdmissionReview");
    let out = run(&["explain", "--objects", &objects, "--reconcile", "ns/cp1"]);
    assert!(
        out.stdout.contains("no TalosCluster ns/c"),
        "{}",
        out.stdout
    );
    // With the cluster there, no note.
    let full = write_objects(&tmp("with-cluster"), &objects_with(None));
    let out = run(&[
        "explain",
        "--objects",
        &full,
        "--delete",
        "talosmachine/ns/cp1",
    ]);
    assert!(!out.stdout.contains("no TalosCluster"), "{}", out.stdout);
}

#[test]
fn bad_request_words_are_exit_2_with_a_clear_line() {
    for (args, says) in [
        (
            vec!["--delete", "pod/ns/x"],
            "not a kind ichor-rules decides about",
        ),
        (
            vec!["--delete", "talosmachine/x"],
            "expected KIND/NAMESPACE/NAME",
        ),
        (
            vec!["--delete", "talosmachine/ns/nope"],
            "holds no TalosMachine ns/nope",
        ),
        (
            vec!["--approve", "taloscluster/ns/c"],
            "only a TalosMachine can be approved",
        ),
        (
            vec!["--unschedule", "talosmachine/ns/cp1"],
            "only a TalosCluster",
        ),
        (vec!["--apply", "no/such/file.yaml"], "no/such/file.yaml"),
        (
            vec!["--apply", "tests/fixtures/objects-stream.yaml"],
            "exactly one object",
        ),
        (
            vec!["--reconcile", "ns/cp1", "--print-review"],
            "--print-review",
        ),
    ] {
        let mut a = vec!["eval", "--objects", "tests/fixtures/objects-stream.yaml"];
        a.extend(args.iter().copied());
        let out = run(&a);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stdout);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {}", out.stderr);
    }
    // Two requests at once is bad usage too.
    let out = run(&[
        "eval",
        "--objects",
        "tests/fixtures/objects-stream.yaml",
        "--delete",
        "tm/ns/cp1",
        "--approve",
        "tm/ns/cp4",
    ]);
    assert_eq!(out.code, 2);
}

#[test]
fn status_is_a_write_of_the_status_subresource() {
    let dir = tmp("status");
    let objects = write_objects(&dir, &objects_with(None));
    let file = dir.join("unreachable.yaml");
    std::fs::write(
        &file,
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata: {name: cp1, namespace: ns}\nstatus:\n  conditions:\n  - {type: Ready, status: \"False\", reason: NodeUnreachable}\n",
    )
    .expect("write");
    let b = built(&objects, &["--status", file.to_str().expect("utf-8")]);
    let r = &b["request"];
    assert_eq!(r["operation"], json!("UPDATE"));
    assert_eq!(r["subResource"], json!("status"));
    assert_eq!(r["requestSubResource"], json!("status"));
    assert_eq!(r["resource"]["resource"], json!("talosmachines"));
    assert_eq!(
        r["object"]["spec"], r["oldObject"]["spec"],
        "only the status changes"
    );
    assert_eq!(r["object"]["metadata"], r["oldObject"]["metadata"]);
    assert_eq!(
        r["object"]["status"]["conditions"][0]["reason"],
        json!("NodeUnreachable")
    );
    // The shipped rules let only the controller write what decisions read.
    let out = run(&[
        "explain",
        "--objects",
        &objects,
        "--status",
        file.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("report machine at the webhook"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("verdict: refused"), "{}", out.stdout);
    // A status write needs the live object.
    let missing = dir.join("missing.yaml");
    std::fs::write(
        &missing,
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata: {name: nope, namespace: ns}\nstatus: {}\n",
    )
    .expect("write");
    let out = run(&[
        "eval",
        "--objects",
        &objects,
        "--status",
        missing.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains("holds no TalosMachine ns/nope"),
        "{}",
        out.stderr
    );
}

// ---------------------------------------------------------------------------------------
// explain: each `let`'s value, and --format json
// ---------------------------------------------------------------------------------------

/// A rule set whose `let`s are defined in another order than they are used: `spare` uses
/// `base`, which is defined after it; `other` is used only by a rule of another event; and
/// `spare` cannot be computed for three approved control planes (a division by zero its
/// rule guards).
const LETS_RULES: &str = r#"
let other = workers + 1
let spare = workers / (base - 2)
let base  = approved - 1

rule spare-ratio
  refuse leave controlplane
  when approved > 3 and spare > 1
  say "{machine}: {spare} workers per spare control plane"

rule base-floor
  refuse leave controlplane
  when base < 2
  say "{machine} would leave {base} control planes"

rule other-cap
  refuse approve worker
  when other > 100
  say "too many workers"
"#;

fn lets_rules(dir: &Path) -> String {
    let path = dir.join("lets.rules");
    std::fs::write(&path, LETS_RULES).expect("write rules");
    path.display().to_string()
}

/// The lines of the `lets the rows use:` section of one event's explanation.
fn let_lines<'s>(stdout: &'s str, event: &str) -> Vec<&'s str> {
    let at = stdout
        .find(event)
        .unwrap_or_else(|| panic!("no event {event:?} in:\n{stdout}"));
    let rest = &stdout[at..];
    let end = rest[1..].find("\n\n").map_or(rest.len(), |e| e + 1);
    let section = &rest[..end];
    match section.find("  lets the rows use:\n") {
        None => Vec::new(),
        Some(s) => section[s..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("    let "))
            .collect(),
    }
}

#[test]
fn explain_shows_each_let_the_rows_use_with_its_value_in_definition_order() {
    let dir = tmp("explain-lets");
    let rules = lets_rules(&dir);
    let out = run(&[
        "explain",
        "--rules",
        &rules,
        "--objects",
        "examples/objects.yaml",
        "--delete",
        "talosmachine/infra/cp-3",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // The delete of an approved control plane: `remove machine` (no rules here) and
    // `remove controlplane` (a `leave`), whose rows use `spare` and `base` (not `other`).
    let lines = let_lines(&out.stdout, "remove controlplane at the webhook");
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    // Definition order: `spare` (line 3) before `base` (line 4), though `base-floor` and
    // `spare`'s own definition use `base`.
    assert!(
        lines[0].starts_with("    let spare = workers / (base - 2)  = "),
        "{}",
        out.stdout
    );
    assert!(
        lines[0].contains("= cannot be computed: division by zero"),
        "a let that fails is said to fail, never shown as 0:\n{}",
        out.stdout
    );
    assert!(lines[0].contains(&format!("({rules}:3)")), "{}", out.stdout);
    assert!(
        lines[1].starts_with("    let base  = approved - 1"),
        "{}",
        out.stdout
    );
    assert!(
        lines[1].ends_with(&format!("= 2   ({rules}:4)")),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("let other"), "{}", out.stdout);
    // The rule that reads `spare` is guarded, so its row did not fail.
    assert!(
        !out.stdout.contains("error  division by zero"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("verdict: allowed"), "{}", out.stdout);

    // The shipped rules on the README's delete: `after` and `quorum` in removal.rules'
    // order, `teardown` after them.
    let out = run(&[
        "explain",
        "--objects",
        "examples/objects.yaml",
        "--review",
        "examples/delete-cp.json",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lines = let_lines(&out.stdout, "remove controlplane at the webhook");
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap_or(""))
        .collect();
    assert_eq!(names, ["after", "quorum", "teardown"], "{}", out.stdout);
    assert!(lines[0].contains("= approved - 1"), "{}", out.stdout);
    assert!(
        lines[0].contains(" = 2   (rules/removal.rules:8)"),
        "{}",
        out.stdout
    );
    assert!(
        lines[1].contains(" = 2   (rules/removal.rules:9)"),
        "{}",
        out.stdout
    );
    assert!(
        lines[2].contains(" = false   (rules/removal.rules:14)"),
        "{}",
        out.stdout
    );
}

/// The JSON explanation of one request.
fn explain_json(args: &[&str]) -> Value {
    let mut all = vec!["explain", "--format", "json"];
    all.extend_from_slice(args);
    let out = run(&all);
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", out.stdout))
}

fn event<'v>(explained: &'v Value, verb: &str, subject: &str) -> &'v Value {
    explained["events"]
        .as_array()
        .expect("events")
        .iter()
        .find(|e| e["event"]["verb"] == verb && e["event"]["subject"] == subject)
        .unwrap_or_else(|| panic!("no `{verb} {subject}` event in {explained:#}"))
}

/// The webhook's response to the same request, through `eval`.
fn eval_response(args: &[&str]) -> Value {
    let mut all = vec!["eval"];
    all.extend_from_slice(args);
    let out = run(&all);
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str::<Value>(&out.stdout).expect("an AdmissionReview")["response"].clone()
}

#[test]
fn explain_json_has_the_documented_shape_and_eval_s_decision() {
    let args = [
        "--objects",
        "examples/objects.yaml",
        "--review",
        "examples/delete-cp.json",
    ];
    let x = explain_json(&args);
    for key in [
        "header",
        "site",
        "verdict",
        "refused_not_by_rule",
        "deciding",
        "warnings",
        "events",
        "notes",
    ] {
        assert!(x.get(key).is_some(), "no {key:?} in {x:#}");
    }
    assert_eq!(x["site"], "webhook");
    assert_eq!(x["verdict"], "refuse");
    assert_eq!(x["refused_not_by_rule"], Value::Null);
    // The deciding rules and messages are eval's.
    let response = eval_response(&args);
    assert_eq!(response["allowed"], false);
    let deciding = x["deciding"].as_array().expect("deciding");
    assert_eq!(deciding.len(), 1, "{x:#}");
    assert_eq!(deciding[0]["rule"], "declared-count");
    assert_eq!(deciding[0]["verdict"], "refuse");
    assert_eq!(deciding[0]["reason"], "RemovalRefused");
    let message = deciding[0]["message"].as_str().expect("message");
    assert!(message.contains("control planes 3 -> 2"), "{message}");
    assert!(
        response["status"]["message"]
            .as_str()
            .expect("eval's message")
            .contains(message),
        "{response:#}"
    );
    let ev = event(&x, "remove", "controlplane");
    assert_eq!(ev["event"]["site"], "webhook");
    assert_eq!(ev["cluster"], "infra/prod");
    assert_eq!(ev["cluster_missing"], false);
    let rows = ev["rows"].as_array().expect("rows");
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["rule"] == name)
            .unwrap_or_else(|| panic!("no row {name} in {ev:#}"))
    };
    let declared = row("declared-count");
    assert_eq!(declared["matched"], true);
    assert_eq!(declared["verdict"], "refuse");
    assert_eq!(declared["file"], "rules/removal.rules");
    assert_eq!(
        declared["when"],
        serde_json::json!({"text": "after < count", "value": true, "evaluated": true})
    );
    assert_eq!(declared["unless"]["value"], false);
    assert_eq!(declared["error"], Value::Null);
    let last = row("last-control-plane");
    assert_eq!(last["matched"], false);
    assert_eq!(last["when"]["value"], false);
    assert_eq!(
        last["unless"],
        serde_json::json!({"text": "cluster.deleting", "value": null, "evaluated": false})
    );
    let lets = ev["lets"].as_array().expect("lets");
    let names: Vec<&str> = lets.iter().filter_map(|l| l["name"].as_str()).collect();
    assert_eq!(names, ["after", "quorum", "teardown"]);
    assert_eq!(
        lets[0],
        serde_json::json!({
            "name": "after", "definition": "approved - 1", "file": "rules/removal.rules",
            "line": 8, "value": 2, "error": null, "cluster_missing": false,
        })
    );
    assert_eq!(lets[2]["value"], false);
    let fact = |name: &str| {
        ev["facts"]
            .as_array()
            .expect("facts")
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no fact {name} in {ev:#}"))
            .clone()
    };
    assert_eq!(fact("approved")["value"], 3);
    assert_eq!(fact("count")["value"], 3);
    assert_eq!(fact("cluster.deleting")["value"], false);
    assert_eq!(fact("count")["cluster_missing"], false);
}

#[test]
fn explain_json_of_the_request_forms_and_a_let_that_fails() {
    let dir = tmp("explain-json-forms");
    let rules = lets_rules(&dir);
    // --delete: the let that cannot be computed is null with its error, never 0.
    let x = explain_json(&[
        "--rules",
        &rules,
        "--objects",
        "examples/objects.yaml",
        "--delete",
        "talosmachine/infra/cp-3",
    ]);
    assert!(
        x["header"]
            .as_str()
            .is_some_and(|h| h.starts_with("webhook: DELETE TalosMachine infra/cp-3")),
        "{x:#}"
    );
    assert_eq!(x["verdict"], "allow");
    assert_eq!(x["deciding"], serde_json::json!([]));
    let ev = event(&x, "remove", "controlplane");
    let lets = ev["lets"].as_array().expect("lets");
    assert_eq!(lets.len(), 2, "{ev:#}");
    assert_eq!(lets[0]["name"], "spare");
    assert_eq!(lets[0]["value"], Value::Null);
    assert_eq!(lets[0]["error"], "division by zero");
    assert_eq!(lets[1]["name"], "base");
    assert_eq!(lets[1]["value"], 2);
    assert_eq!(lets[1]["line"], 4);
    assert_eq!(
        event(&x, "remove", "machine")["lets"],
        serde_json::json!([])
    );

    // --apply: un-approving cp-3 is an UPDATE, the `unapprove controlplane` event (a
    // `leave` too). Three approved: base = 2, base-floor does not refuse; the same
    // decision as eval.
    let apply = dir.join("unapprove.yaml");
    std::fs::write(
        &apply,
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata:\n  name: cp-3\n  namespace: infra\nspec:\n  approved: false\n",
    )
    .expect("write");
    let apply = apply.display().to_string();
    let args = [
        "--rules",
        &rules,
        "--objects",
        "examples/objects.yaml",
        "--apply",
        &apply,
    ];
    let x = explain_json(&args);
    assert!(
        x["header"]
            .as_str()
            .is_some_and(|h| h.starts_with("webhook: UPDATE TalosMachine infra/cp-3")),
        "{x:#}"
    );
    let ev = event(&x, "unapprove", "controlplane");
    let base_floor = ev["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["rule"] == "base-floor")
        .expect("the base-floor row");
    assert_eq!(base_floor["when"]["value"], false);
    assert_eq!(x["verdict"], "allow");
    assert_eq!(eval_response(&args)["allowed"], true);

    // With one control plane fewer, base-floor refuses, in explain and eval alike.
    let objects: Vec<Value> = serde_yaml::Deserializer::from_str(
        &std::fs::read_to_string(root().join("examples/objects.yaml")).expect("objects"),
    )
    .map(|d| {
        use serde::Deserialize;
        serde_json::to_value(serde_yaml::Value::deserialize(d).expect("yaml")).expect("json")
    })
    .flat_map(|v| match v["items"].as_array() {
        Some(items) => items.clone(),
        None => vec![v],
    })
    .filter(|o| o["metadata"]["name"] != "cp-2")
    .collect();
    let two = write_objects(&dir, &objects);
    let args = ["--rules", &rules, "--objects", &two, "--apply", &apply];
    let x = explain_json(&args);
    assert_eq!(x["verdict"], "refuse", "{x:#}");
    assert_eq!(x["deciding"][0]["rule"], "base-floor");
    assert_eq!(
        x["deciding"][0]["message"],
        "cp-3 would leave 1 control planes"
    );
    let response = eval_response(&args);
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("cp-3 would leave 1 control planes")),
        "{response:#}"
    );
    let lets = event(&x, "unapprove", "controlplane")["lets"].clone();
    assert_eq!(lets[1]["name"], "base");
    assert_eq!(lets[1]["value"], 1);
    // workers / (base - 2) = 0 / -1: computed now.
    assert_eq!(lets[0]["value"], 0);
    assert_eq!(lets[0]["error"], Value::Null);
}

#[test]
fn explain_marks_facts_and_lets_of_a_missing_taloscluster() {
    let dir = tmp("explain-missing-cluster");
    let objects: Vec<Value> = objects_with(None)
        .into_iter()
        .filter(|o| o["kind"] != json!("TalosCluster"))
        .collect();
    let objects = write_objects(&dir, &objects);
    let args = ["--objects", &objects, "--delete", "talosmachine/ns/cp1"];
    let x = explain_json(&args);
    let ev = event(&x, "remove", "controlplane");
    assert_eq!(ev["cluster"], "ns/c");
    assert_eq!(ev["cluster_missing"], true);
    let facts = ev["facts"].as_array().expect("facts");
    let count = facts
        .iter()
        .find(|f| f["name"] == "count")
        .expect("count is read");
    assert_eq!(count["value"], 0);
    assert_eq!(count["cluster_missing"], true, "{ev:#}");
    // Facts not read from the TalosCluster are not marked.
    let approved = facts
        .iter()
        .find(|f| f["name"] == "approved")
        .expect("approved is read");
    assert_eq!(approved["cluster_missing"], false);
    let lets = ev["lets"].as_array().expect("lets");
    let by_name = |n: &str| {
        lets.iter()
            .find(|l| l["name"] == n)
            .unwrap_or_else(|| panic!("no let {n} in {ev:#}"))
    };
    // `teardown` reads cluster.deleting (from the cluster): marked; `after` does not.
    assert_eq!(by_name("teardown")["cluster_missing"], true);
    assert_eq!(by_name("teardown")["value"], true);
    assert_eq!(by_name("after")["cluster_missing"], false);
    assert!(
        x["notes"].as_array().expect("notes").iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.contains("no TalosCluster ns/c"))),
        "{x:#}"
    );
    // The text says so at the fact and at the let.
    let out = run(&[
        "explain",
        "--objects",
        &objects,
        "--delete",
        "talosmachine/ns/cp1",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .lines()
            .any(|l| l.trim_start().starts_with("count")
                && l.contains("= 0")
                && l.contains("the objects hold no TalosCluster ns/c: read as missing")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.lines().any(|l| l.contains("let teardown")
            && l.contains("(from a missing cluster: the objects hold no TalosCluster ns/c)")),
        "{}",
        out.stdout
    );
    // With the cluster there, nothing is marked.
    let full = write_objects(&tmp("explain-with-cluster"), &objects_with(None));
    let x = explain_json(&["--objects", &full, "--delete", "talosmachine/ns/cp1"]);
    let ev = event(&x, "remove", "controlplane");
    assert_eq!(ev["cluster_missing"], false);
    assert!(
        ev["facts"]
            .as_array()
            .expect("facts")
            .iter()
            .all(|f| f["cluster_missing"] == false),
        "{ev:#}"
    );
}

#[test]
fn explain_json_of_a_reconcile_is_the_controller_s_decision() {
    let args = [
        "--objects",
        "tests/fixtures/objects-list.yaml",
        "--reconcile",
        "ns/cp3",
    ];
    let x = explain_json(&args);
    assert_eq!(x["site"], "controller");
    let out = run(&["eval", args[0], args[1], args[2], args[3]]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let decided: Value = serde_json::from_str(&out.stdout).expect("eval's JSON");
    assert_eq!(x["verdict"], decided["verdict"], "{x:#}");
    let rules: Vec<Value> = x["deciding"]
        .as_array()
        .expect("deciding")
        .iter()
        .map(|f| f["rule"].clone())
        .collect();
    assert_eq!(Value::from(rules), decided["rules"]);
    assert_eq!(x["verdict"], "hold");
    assert_eq!(
        event(&x, "apply", "controlplane")["event"]["site"],
        "controller"
    );
}
