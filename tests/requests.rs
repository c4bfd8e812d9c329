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
