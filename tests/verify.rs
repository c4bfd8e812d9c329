//! `ichor-rules verify` as a user runs it: the shipped rules verify; weakened copies of them
//! (the mutants a reviewer must catch) each yield a counterexample of the right invariant;
//! every admission step of a counterexample, written with `--emit-fixtures`, is decided by
//! `ichor-rules eval` exactly as the trace says; bad usage is exit 2.
//!
//! Bounds are kept small here (the tests run a debug build); the CLI's defaults and the
//! figures at larger bounds are in the closing notes and docs/rules.md.

use serde_json::Value;
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
    assert!(!out.stderr.contains("panicked"), "panicked: {}", out.stderr);
    out
}

/// A copy of rules/ in a fresh folder, with `edit` applied to one file's text.
fn mutant(name: &str, file: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ichor-verify-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut files: Vec<String> = std::fs::read_dir(root().join("rules"))
        .expect("rules/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.ends_with(".rules"))
        .collect();
    files.sort();
    assert!(files.iter().any(|f| f == file), "no rules/{file}");
    for f in &files {
        let text = std::fs::read_to_string(root().join("rules").join(f)).expect("rules/");
        let text = if f == file {
            let edited = edit(&text);
            assert_ne!(edited, text, "the edit of {name} changed nothing");
            edited
        } else {
            text
        };
        std::fs::write(dir.join(f), text).expect("write");
    }
    dir
}

/// Edits one file of a mutant made by [`mutant`] again.
fn edit_too(dir: &Path, file: &str, edit: impl Fn(&str) -> String) {
    let text = std::fs::read_to_string(dir.join(file)).expect("mutant");
    let edited = edit(&text);
    assert_ne!(edited, text, "the edit of {file} changed nothing");
    std::fs::write(dir.join(file), edited).expect("write");
}

/// Removes the guards a reset's plan has before its destructive call (`step-healthy-majority`
/// and `step-member-down` no longer decide a reset's steps, and the first `etcd healthy` gate of each plan goes):
/// since operations run on the executor in the model, these refuse an unsafe reset at its
/// step too (defence in depth), so a test of a reset's `start` rule alone takes them away.
fn without_step_guards(dir: &Path) {
    edit_too(dir, "operations.rules", |t| {
        let mut t = t.to_string();
        for rule in ["rule step-healthy-majority\n", "rule step-member-down\n"] {
            let at = t.find(rule).expect("the step rule");
            let when = at + t[at..].find("\n  say ").expect("its message");
            t = format!("{}\n  unless kind == \"reset\"{}", &t[..when], &t[when..]);
        }
        t.replace(
            "  do etcd healthy within 2m  when target.controlplane or target.uncounted\n",
            "",
        )
    });
}

/// Removes the statement that starts with `head` (up to the next blank line).
fn without(text: &str, head: &str) -> String {
    let start = text.find(head).unwrap_or_else(|| panic!("no `{head}`"));
    let end = text[start..]
        .find("\n\n")
        .map_or(text.len(), |e| start + e + 1);
    format!("{}{}", &text[..start], &text[end..])
}

fn verify(rules: &Path, cps: &str, extra: &[&str]) -> (Out, Value) {
    let rules = rules.to_str().expect("utf-8 path");
    let mut args = vec![
        "verify",
        rules,
        "--max-control-planes",
        cps,
        "--format",
        "json",
    ];
    // Small bounds, unless `extra` names the flag.
    for (flag, value) in [
        ("--max-workers", "0"),
        ("--max-failures", "0"),
        ("--max-operations", "0"),
        ("--in-flight", "0"),
    ] {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend(extra);
    let out = run(&args);
    let json: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", out.stdout, out.stderr));
    (out, json)
}

/// The words of each step of the first violation's counterexample.
fn step_texts(json: &Value) -> Vec<&str> {
    json["violations"][0]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["text"].as_str())
        .collect()
}

/// `verify` exited 1 and the only invariant violated is `invariant`.
#[track_caller]
fn refuted_only_by(out: &Out, json: &Value, invariant: &str) {
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(
        violated(json),
        vec![invariant.to_string()],
        "{}",
        out.stdout
    );
}

/// `verify` exited 0 and no invariant is violated.
#[track_caller]
fn holds(out: &Out, json: &Value) {
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(violated(json).is_empty(), "{}", out.stdout);
}

fn violated(json: &Value) -> Vec<String> {
    json["violations"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|x| x["invariant"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_shipped_rules_verify_and_say_what_they_explored() {
    let (out, json) = verify(&root().join("rules"), "3", &[]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert_eq!(json["result"], "verified");
    assert!(
        json["states"].as_u64().unwrap_or(0) > 10_000,
        "{}",
        json["states"]
    );
    assert!(json["transitions"].as_u64() > json["states"].as_u64());
    assert_eq!(json["cut"], Value::Null, "no bound cut exploration short");
    // Every invariant is reported with the interleavings it was checked under.
    let inv = json["invariants"].as_array().expect("invariants");
    assert!(inv.len() >= 8);
    let worker = inv
        .iter()
        .find(|i| i["name"] == "worker-while-unschedulable")
        .expect("the sequential invariant");
    assert_eq!(worker["checked_under"], "serialized requests");
    assert!(json["coverage"]["rules_never_fired"].is_array());
    // The human report says the same in words.
    let human = run(&[
        "verify",
        "rules",
        "--max-control-planes",
        "2",
        "--max-workers",
        "0",
        "--max-failures",
        "0",
        "--max-operations",
        "0",
        "--in-flight",
        "0",
    ]);
    assert_eq!(human.code, 0, "{}", human.stdout);
    for needle in [
        "bounds: 2 control-plane machines",
        "distinct states and",
        "transitions in",
        "rules that never fired:",
        "verified: every invariant holds",
    ] {
        assert!(human.stdout.contains(needle), "{needle}:\n{}", human.stdout);
    }
}

#[test]
fn a_depth_bound_that_cuts_exploration_is_said() {
    // Issue 34: a run the depth bound cut is incomplete (exit 2), never "verified": the
    // states beyond it, and where the cut-off ones lead (liveness), are unproved.
    let (out, json) = verify(&root().join("rules"), "2", &["--depth", "3"]);
    assert_eq!(out.code, 2, "{}", out.stdout);
    assert_eq!(json["result"], "incomplete", "{json}");
    let cut = json["cut"].as_str().expect("the cut is reported");
    assert!(cut.starts_with("depth 3 reached in "), "{cut}");
    assert!(out.stderr.contains("nothing was proved"), "{}", out.stderr);
    // With room enough, the same bounds verify.
    let (out, json) = verify(&root().join("rules"), "2", &[]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert_eq!(json["result"], "verified", "{json}");
    assert!(json["cut"].is_null(), "{json}");
}

#[test]
fn deleting_the_quorum_rule_loses_a_healthy_majority() {
    let dir = mutant("quorum", "removal.rules", |t| without(t, "rule quorum\n"));
    let (out, json) = verify(&dir, "2", &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "healthy-majority", "{}", out.stdout);
    let steps = json["violations"][0]["steps"].as_array().expect("steps");
    assert!(
        steps
            .iter()
            .any(|s| s["text"].as_str().unwrap_or("").contains("etcd leave")),
        "{}",
        out.stdout
    );
}

/// A removal that releases its finalizer with the machine still in etcd leaves a member
/// behind: without `etcd remove-member`, a dead member is never taken out of etcd.
#[test]
fn a_removal_that_leaves_its_member_in_etcd_is_refuted() {
    let dir = mutant("left-behind", "removal.rules", |t| {
        t.replacen(
            "  do etcd remove-member      when not cluster.deleting and member.dead\n",
            "",
            1,
        )
    });
    let (out, json) = verify(&dir, "3", &["--max-failures", "1"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"no-member-left-behind".to_string()),
        "{}",
        out.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn weakening_the_declared_count_drops_below_it() {
    let dir = mutant("count", "removal.rules", |t| {
        t.replacen(
            "refuse remove controlplane\n  when after < count\n",
            "refuse remove controlplane\n  when after < count - 1\n",
            1,
        )
    });
    let (out, json) = verify(&dir, "3", &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"count-kept".to_string()),
        "{}",
        out.stdout
    );
}

/// `verify` verifies with the rules in audit mode ignored (they are evaluated and recorded,
/// and refuse nothing), so it shows what enforcing them would still have to catch: the
/// declared-count rule staged in audit is a weakening like its removal, and `verify`
/// finds the count broken.
#[test]
fn verify_ignores_a_rule_in_audit_mode() {
    let dir = mutant("audit", "removal.rules", |t| {
        t.replacen("rule declared-count\n", "rule declared-count audit\n", 1)
    });
    let text = std::fs::read_to_string(dir.join("removal.rules")).expect("copied");
    assert!(
        text.contains("rule declared-count audit\n"),
        "the edit applies"
    );
    let (out, json) = verify(&dir, "3", &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"count-kept".to_string()),
        "{}",
        out.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_last_control_plane_rule_without_the_teardown_exception_never_ends_a_teardown() {
    let dir = mutant("teardown", "removal.rules", |t| {
        t.replacen(
            "  when after == 0\n  unless cluster.deleting\n",
            "  when after == 0\n",
            1,
        )
    });
    let (out, json) = verify(&dir, "1", &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json), ["removals-finish"], "{}", out.stdout);
}

#[test]
fn without_the_over_cap_hold_a_control_plane_past_the_cap_joins() {
    let dir = mutant("overcap", "removal.rules", |t| {
        without(t, "rule over-cap\n").replacen(
            "allow apply worker",
            "allow apply worker\nallow apply controlplane",
            1,
        )
    });
    let (out, json) = verify(&dir, "3", &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"cap-kept".to_string()),
        "{}",
        out.stdout
    );
}

/// The even count is kept from operations twice: the `run operation` hold parks them, and
/// the start rules, decided again at the controller before it acts, refuse them. Only a
/// rule set that drops both lets one run (dropping one is not a weakening the product shows).
#[test]
fn an_operation_that_is_neither_parked_nor_refused_runs_while_even() {
    let dir = mutant("even", "removal.rules", |t| {
        without(t, "rule parked-for-transition\n").replacen(
            "allow apply worker",
            "allow apply worker\nallow run operation",
            1,
        )
    });
    let admission = std::fs::read_to_string(dir.join("admission.rules")).expect("copied");
    std::fs::write(
        dir.join("admission.rules"),
        without(&admission, "rule operation-while-transitioning\n"),
    )
    .expect("write");
    let (out, json) = verify(&dir, "2", &["--max-operations", "1"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"no-operation-while-even".to_string()),
        "{}",
        out.stdout
    );
}

/// Every admission of a counterexample, written out, is decided by `eval` as the trace
/// says: allowed, with the same live objects and request.
#[test]
fn emitted_fixtures_replay_through_eval() {
    let dir = mutant("fixtures", "removal.rules", |t| {
        t.replacen(
            "refuse remove controlplane\n  when after < count\n",
            "refuse remove controlplane\n  when after < count - 1\n",
            1,
        )
    });
    let out_dir = dir.join("fixtures");
    let rules = dir.to_str().expect("path");
    let fx = out_dir.to_str().expect("path");
    let out = run(&[
        "verify",
        rules,
        "--max-control-planes",
        "3",
        "--max-workers",
        "0",
        "--max-failures",
        "0",
        "--max-operations",
        "0",
        "--in-flight",
        "0",
        "--emit-fixtures",
        fx,
    ]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(replay(&dir, &out_dir) > 0, "no admission step was written");
}

/// Runs every `step-N` fixture under `fixtures` through `eval --rules rules`: each must be
/// allowed, as the trace says. Returns how many there were, with the reviews' texts.
fn replay(rules: &Path, fixtures: &Path) -> usize {
    let rules = rules.to_str().expect("path");
    let mut steps = Vec::new();
    let mut stack = vec![fixtures.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("fixtures written") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                if p.join("review.json").exists() {
                    steps.push(p.clone());
                }
                stack.push(p);
            }
        }
    }
    for s in &steps {
        let objects = s.join("objects.yaml");
        let review = s.join("review.json");
        let e = run(&[
            "eval",
            "--rules",
            rules,
            "--objects",
            objects.to_str().expect("path"),
            "--review",
            review.to_str().expect("path"),
        ]);
        assert_eq!(e.code, 0, "{}: {}{}", s.display(), e.stdout, e.stderr);
        let v: Value = serde_json::from_str(&e.stdout).expect("JSON");
        assert_eq!(
            v["response"]["allowed"],
            true,
            "{}: {}",
            s.display(),
            e.stdout
        );
    }
    steps.len()
}

/// Without the allow-delete gates a delete nobody meant (a GitOps prune without the
/// annotation) goes through; `deletes-meant` refutes both, with the prune in the story and
/// its review replaying through `eval`. With them, the prune is refused (the gates fire).
#[test]
fn without_the_allow_delete_gates_a_prune_deletes() {
    for (rule, target) in [
        ("rule machine-allow-delete\n", "talosmachine"),
        ("rule cluster-allow-delete\n", "taloscluster"),
    ] {
        let dir = mutant(&format!("prune-{target}"), "admission.rules", |t| {
            without(t, rule)
        });
        let fixtures = dir.join("fixtures");
        let fx = fixtures.to_str().expect("path");
        let (out, json) = verify(&dir, "1", &["--max-workers", "1", "--emit-fixtures", fx]);
        assert_eq!(out.code, 1, "{}", out.stdout);
        assert_eq!(violated(&json)[0], "deletes-meant", "{}", out.stdout);
        let steps = step_texts(&json);
        assert!(
            steps
                .iter()
                .any(|s| s.contains(&format!("kubectl delete {target} "))
                    && s.contains("without the allow-delete annotation")),
            "{steps:?}"
        );
        assert!(replay(&dir, &fixtures) > 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
    // The gate stays where the TalosCluster is missing (a typo in clusterRef must not turn
    // it off): a `machine-allow-delete` that bends there too is refuted from such a state.
    let dir = mutant("prune-missing", "admission.rules", |t| {
        let i = t.find("rule machine-allow-delete").expect("rule");
        format!(
            "{}{}",
            &t[..i],
            t[i..].replacen(
                "unless cluster.deleting",
                "unless not cluster.exists or cluster.deleting",
                1
            )
        )
    });
    let (out, json) = verify(&dir, "1", &["--max-workers", "1"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "deletes-meant", "{}", out.stdout);
    let start = json["violations"][0]["start"].as_str().unwrap_or_default();
    assert!(start.contains("no TalosCluster"), "{start}");
    let _ = std::fs::remove_dir_all(&dir);

    let (out, json) = verify(&root().join("rules"), "1", &[]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    let never: Vec<&str> = json["coverage"]["rules_never_fired"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for rule in ["machine-allow-delete", "cluster-allow-delete"] {
        assert!(!never.contains(&rule), "{rule} never fired: {never:?}");
    }
}

/// Un-approving a control plane below the declared count leaves its member in etcd with
/// nothing managing it; without `declared-count-leave` (or with it weakened) verify says so
/// through `approved-count-kept`, an invariant of serialized requests.
#[test]
fn an_unapproval_below_the_declared_count_is_refuted() {
    let deleted = mutant("unapprove", "removal.rules", |t| {
        without(t, "rule declared-count-leave\n")
    });
    let weakened = mutant("unapprove-weak", "removal.rules", |t| {
        let i = t.find("rule declared-count-leave").expect("rule");
        format!(
            "{}{}",
            &t[..i],
            t[i..].replacen("when after < count\n", "when after < count - 1\n", 1)
        )
    });
    for dir in [deleted, weakened] {
        let (out, json) = verify(&dir, "3", &[]);
        assert_eq!(out.code, 1, "{}", out.stdout);
        assert_eq!(violated(&json)[0], "approved-count-kept", "{}", out.stdout);
        assert!(
            step_texts(&json)
                .iter()
                .any(|s| s.contains("(spec.approved: false)")),
            "{}",
            out.stdout
        );
        let inv = json["invariants"].as_array().expect("invariants");
        let kept = inv
            .iter()
            .find(|i| i["name"] == "approved-count-kept")
            .expect("approved-count-kept is reported");
        assert_eq!(kept["checked_under"], "serialized requests");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A move (`spec.clusterRef.name` changed) takes a machine out of the cluster's counts as
/// an un-approval does, while its etcd member stays: with `move` dropped from
/// `declared-count-leave`, verify finds the patch below the count, and its review replays.
#[test]
fn a_move_below_the_declared_count_is_refuted() {
    leaving_below_the_count_is_refuted(
        "move",
        "refuse unapprove, reassign controlplane\n",
        "(spec.clusterRef.name: staging)",
    );
}

/// `declared-count-leave` with `verbs` (one of its verbs dropped) is refuted through
/// `approved-count-kept`, with a step whose words hold `step`, and the admissions of the
/// counterexample replay through `eval`.
fn leaving_below_the_count_is_refuted(name: &str, verbs: &str, step: &str) {
    let dir = mutant(name, "removal.rules", |t| {
        t.replacen("refuse unapprove, reassign, move controlplane\n", verbs, 1)
    });
    let fixtures = dir.join("fixtures");
    let fx = fixtures.to_str().expect("path");
    let (out, json) = verify(&dir, "3", &["--emit-fixtures", fx]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "approved-count-kept", "{}", out.stdout);
    assert!(
        step_texts(&json).iter().any(|s| s.contains(step)),
        "{}",
        out.stdout
    );
    assert!(replay(&dir, &fixtures) > 0, "no admission step was written");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Found by `verify` once people could move machines: a reset created for cp-2, then cp-2
/// moved to another cluster; no count of this cluster includes it, but its member is in
/// this cluster's etcd. `reset-target-not-in-cluster` keeps the reset from starting. Since
/// operations run on the executor in the model, the executor's own check (a target that
/// is not a TalosMachine of the operation's cluster fails the operation, `TargetNotFound`)
/// keeps the majority too, even with the step guards gone: the rule is the webhook's early
/// answer and the controller's start refusal, and defence in depth.
#[test]
fn without_reset_target_not_in_cluster_the_executor_still_keeps_a_moved_member() {
    let dir = mutant("reset-moved", "admission.rules", |t| {
        without(t, "rule reset-target-not-in-cluster\n")
    });
    without_step_guards(&dir);
    let bounds = [
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--in-flight",
        "1",
        "--max-requests",
        "4",
        "--depth",
        "7",
    ];
    let (out, json) = verify(&dir, "3", &bounds);
    assert!(violated(&json).is_empty(), "{}", out.stdout);
    // Cut at the depth: incomplete, never "verified".
    assert_eq!(out.code, 2, "{}", out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The over-cap hold keeps a control plane past count+1 out of etcd, so only
/// `approval-cap-kept` sees the approval itself go through: deleting `approval-cap`, or
/// weakening it by one, is refuted with the approval in the story; the shipped rules hold.
#[test]
fn an_approval_past_the_cap_is_refuted() {
    let deleted = mutant("cap-del", "admission.rules", |t| {
        without(t, "rule approval-cap\n")
    });
    let weakened = mutant("cap-weak", "admission.rules", |t| {
        let i = t.find("rule approval-cap\n").expect("rule");
        format!(
            "{}{}",
            &t[..i],
            t[i..].replacen("when approved > count\n", "when approved > count + 1\n", 1)
        )
    });
    for dir in [deleted, weakened] {
        let (out, json) = verify(&dir, "3", &["--max-workers", "1"]);
        assert_eq!(out.code, 1, "{}", out.stdout);
        assert_eq!(violated(&json), ["approval-cap-kept"], "{}", out.stdout);
        let texts = step_texts(&json);
        assert!(
            texts
                .last()
                .is_some_and(|t| t.contains("(spec.approved: true)")),
            "{texts:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A role change takes a control plane out of the approved ones as an un-approval does
/// (`leave` covers both). With `reassign` dropped from `declared-count-leave`, verify finds
/// the `spec.role: worker` patch below the count, and its review replays through `eval`.
#[test]
fn a_role_change_below_the_declared_count_is_refuted() {
    leaving_below_the_count_is_refuted(
        "reassign",
        "refuse unapprove, move controlplane\n",
        "(spec.role: worker)",
    );
    // The shipped rule refuses the same patch.
    let (out, _) = verify(&root().join("rules"), "3", &[]);
    assert_eq!(out.code, 0, "{}", out.stdout);
}

/// A worker re-roled to a control plane leaves the workers (`leave worker` covers it):
/// with `reassign` dropped from `last-worker`, verify finds the `spec.role: controlplane`
/// patch of the last worker of an unschedulable cluster (under a budget of requests, the
/// only bounds that re-role workers, as the bounds line says), and its review replays.
#[test]
fn a_worker_re_roled_away_from_an_unschedulable_cluster_is_refuted() {
    let dir = mutant("last-worker-reassign", "admission.rules", |t| {
        t.replacen(
            "refuse leave worker at webhook\n",
            "refuse remove, unapprove, move worker at webhook\n",
            1,
        )
    });
    let fixtures = dir.join("fixtures");
    let fx = fixtures.to_str().expect("path");
    let budget = ["--max-workers", "1", "--max-requests", "2"];
    let (out, json) = verify(&dir, "2", &[&budget[..], &["--emit-fixtures", fx]].concat());
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(
        violated(&json),
        ["worker-while-unschedulable"],
        "{}",
        out.stdout
    );
    let texts = step_texts(&json);
    assert!(
        texts
            .last()
            .is_some_and(|t| t.contains("(spec.role: controlplane)")),
        "{texts:?}"
    );
    assert!(replay(&dir, &fixtures) > 0, "no admission step was written");
    // The shipped rule refuses the same patch; without a budget no worker is re-roled,
    // and the bounds say so.
    let (out, _) = verify(&root().join("rules"), "2", &budget);
    assert_eq!(out.code, 0, "{}", out.stdout);
    let human = run(&[
        "verify",
        dir.to_str().expect("path"),
        "--max-control-planes",
        "2",
        "--max-workers",
        "1",
    ]);
    assert_eq!(human.code, 0, "{}", human.stdout);
    assert!(
        human
            .stdout
            .contains("no worker re-roled to a control plane"),
        "{}",
        human.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whoever may patch talosmachines/status could forge the record a removal resumes from
/// (a committed removal of a dead member) onto a healthy control plane being deleted: the
/// controller would then take a live member out of etcd. `status-only-by-controller`
/// refuses it; without the rule verify finds the story, and the forged request, written
/// out as a status-subresource review, is allowed by the mutant and refused by the
/// shipped rules.
#[test]
fn without_the_status_guard_a_forged_removal_record_loses_a_healthy_member() {
    let dir = mutant("status-guard", "admission.rules", |t| {
        without(t, "rule status-only-by-controller\n")
    });
    let fx = dir.join("fixtures");
    let (out, json) = verify(&dir, "3", &["--emit-fixtures", fx.to_str().expect("path")]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    let texts = step_texts(&json);
    let forged = texts
        .iter()
        .position(|s| s.contains("--subresource=status"))
        .unwrap_or_else(|| panic!("no forged status in {texts:?}"));
    assert!(
        texts[forged..]
            .iter()
            .any(|s| s.contains("etcd remove-member")),
        "{texts:?}"
    );
    let step = fx.join(format!("step-{}", forged + 1));
    let review = step.join("review.json");
    let text = std::fs::read_to_string(&review).expect("the forged step is written");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["request"]["subResource"], "status", "{text}");
    let decide = |rules: &Path| -> Value {
        let e = run(&[
            "eval",
            "--rules",
            rules.to_str().expect("path"),
            "--objects",
            step.join("objects.yaml").to_str().expect("path"),
            "--review",
            review.to_str().expect("path"),
        ]);
        assert_eq!(e.code, 0, "{}{}", e.stdout, e.stderr);
        serde_json::from_str(&e.stdout).expect("JSON")
    };
    assert_eq!(decide(&dir)["response"]["allowed"], true);
    let shipped = decide(&root().join("rules"));
    assert_eq!(shipped["response"]["allowed"], false);
    assert!(
        shipped["response"]["status"]["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("only the ichor-rules controller may set or clear"),
        "{shipped}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_usage_and_broken_rules_are_exit_2() {
    // No invariants to prove.
    let out = run(&["verify", "rules/admission.rules", "rules/removal.rules"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("no `invariant`"), "{}", out.stderr);
    // Rules with errors.
    let dir = mutant("broken", "invariants.rules", |t| {
        format!("{t}\ninvariant bad\n  ensure machine == \"cp-1\"\n")
    });
    let out = run(&["verify", dir.to_str().expect("path")]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("belongs to one request"),
        "{}",
        out.stderr
    );
    // A plan longer than the model records: said, not mis-explored.
    let dir = mutant("long-plan", "removal.rules", |t| {
        t.replacen(
            "  do release finalizer\n",
            &format!(
                "{}  do release finalizer\n",
                "  do event normal Step say \"x\"\n".repeat(12)
            ),
            1,
        )
    });
    let out = run(&["verify", dir.to_str().expect("path")]);
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("at most 16 steps"), "{}", out.stderr);
    // Bounds out of range.
    let out = run(&["verify", "rules", "--max-control-planes", "99"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
}

#[test]
fn check_and_table_read_invariants() {
    let out = run(&["check", "rules/"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let out = run(&["table", "rules/"]);
    assert!(
        out.stdout.contains("invariant healthy-majority"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("invariant worker-while-unschedulable (sequential)")
    );
    // A model fact in a rule, and a misspelt step, are errors with a span.
    let dir = mutant("facts", "admission.rules", |t| {
        format!("{t}\nrule uses-model\n  refuse remove machine\n  when members > 1\n  say \"x\"\n")
    });
    let out = run(&["check", dir.to_str().expect("path")]);
    assert_eq!(out.code, 1);
    assert!(
        out.stdout.contains("a fact of `verify`'s model"),
        "{}",
        out.stdout
    );
    let dir = mutant("step", "invariants.rules", |t| {
        format!("{t}\ninvariant typo\n  when step == \"etcd-leaf\"\n  ensure members > 0\n")
    });
    let out = run(&["check", dir.to_str().expect("path")]);
    assert_eq!(out.code, 1);
    assert!(
        out.stdout.contains("did you mean `\"etcd-leave\"`"),
        "{}",
        out.stdout
    );
}

/// The hole the shipped rules had (issue 12): count 1, three members, one dead; deleting a
/// healthy one was allowed and left a two-member etcd with one live member. Without the
/// `healthy-quorum` rule that closes it, `verify` finds a healthy majority lost by a
/// delete and an etcd leave. (Since machines without a TalosCluster are starting states
/// too, the shortest such story starts there: a replacement approved but not yet joined,
/// which only `healthy-quorum`'s etcd count catches when there is no declared count.)
#[test]
fn without_healthy_quorum_a_dead_member_and_a_delete_lose_the_majority() {
    let dir = mutant("hole", "removal.rules", |t| {
        without(t, "rule healthy-quorum\n")
    });
    let (out, json) = verify(&dir, "3", &["--max-failures", "1", "--depth", "9"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "healthy-majority", "{}", out.stdout);
    let message = json["violations"][0]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(" healthy of ") && message.contains("to 1 healthy of"),
        "{message}"
    );
    let texts = step_texts(&json);
    assert!(texts.iter().any(|t| t.contains("etcd leave")), "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t.contains("annotate+delete talosmachine")),
        "{texts:?}"
    );
}

/// Found by `verify` with 5 machines and 2 failures, then pinned with 4 and 1: two control
/// planes deleted at once, a replacement joins, and the node of the second one dies before
/// the first leaves. `healthy-quorum` compared the members that answer with a majority of
/// the approved control planes, which leave out the one being deleted although it is still
/// an etcd member: 3 healthy of 4 went to 2 of 3. With the majority of etcd's own
/// membership (`members.after + 1`), the same bounds verify.
#[test]
fn healthy_quorum_counts_etcds_members_not_the_approved_ones() {
    let dir = mutant("approved-majority", "removal.rules", |t| {
        let old = t.replace(
            "healthy.after < (members.after + 1) / 2 + 1",
            "healthy.after < quorum",
        );
        assert_ne!(old, t, "the shipped rule compares with etcd's membership");
        old
    });
    let bounds = ["--max-failures", "1", "--max-requests", "3"];
    let (out, json) = verify(&dir, "4", &bounds);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "healthy-majority", "{}", out.stdout);
    let message = json["violations"][0]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("from 3 healthy of 4 members to 2 healthy of 3"),
        "{message}"
    );
    let texts = step_texts(&json);
    assert_eq!(
        texts
            .iter()
            .filter(|t| t.contains("annotate+delete talosmachine"))
            .count(),
        2,
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t.contains("dies")), "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("etcd leave")), "{texts:?}");
    shipped_hold_within_depth("4", &bounds);
}

/// The same for a reset (found with 4 machines, a failure and an operation): a control plane
/// being deleted, still an etcd member, dies; a reset of another one was counted against the
/// approved control planes only and took etcd from 3 healthy of 4 to 2 of 3.
#[test]
fn reset_healthy_quorum_counts_etcds_members_too() {
    let dir = mutant("approved-majority-reset", "admission.rules", |t| {
        let old = t.replace(
            "healthy.after < (members.after + 1) / 2 + 1",
            "healthy.after < approved / 2 + 1",
        );
        assert_ne!(old, t, "the shipped rule compares with etcd's membership");
        old
    });
    without_step_guards(&dir);
    let bounds = [
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "4",
        "--depth",
        "8",
    ];
    let (out, json) = verify(&dir, "4", &bounds);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "healthy-majority", "{}", out.stdout);
    let texts = step_texts(&json);
    assert!(texts.iter().any(|t| t.contains("kind reset")), "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("dies")), "{texts:?}");
    shipped_hold_within_depth("4", &bounds);
}

/// Found by `verify` with 6 control-plane machines: count 5, a sixth approved, and a
/// member deleted before the sixth joined etcd: the leave took etcd to 4 members. Without
/// `replacement-not-joined` (the controller counting etcd's own members), `verify` tells
/// that story; with it, the same bounds verify. The request budget is said as a cut.
#[test]
fn without_replacement_not_joined_a_removal_outruns_its_replacement() {
    let dir = mutant("joined", "removal.rules", |t| {
        without(t, "rule replacement-not-joined\n")
    });
    let bounds = ["--max-requests", "2"];
    let (out, json) = verify(&dir, "6", &bounds);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "count-kept", "{}", out.stdout);
    let message = json["violations"][0]["message"].as_str().unwrap_or("");
    // (count 3 or count 5: the shortest story starts from either)
    assert!(
        message.contains("from 5 to 4 members, below the declared count of 5")
            || message.contains("from 3 to 2 members, below the declared count of 3"),
        "{message}"
    );
    let texts = step_texts(&json);
    assert!(
        texts.iter().any(|t| t.contains("spec.approved: true")),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t.contains("etcd leave")), "{texts:?}");
    let (out, json) = verify(&root().join("rules"), "6", &bounds);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert_eq!(json["runs"][0]["bounds"]["max_requests"], 2, "{json}");
    let cut = json["cut"].as_str().unwrap_or("");
    assert!(
        cut.contains("the budget of 2 request(s) by people was spent in"),
        "{cut}"
    );
}

/// Machines whose TalosCluster is not there are among the starting states: there the
/// declared count is 0 and `declared-count` bends (a teardown), so `last-control-plane` is
/// what keeps the last member. Without it, `verify` finds the story from such a state.
#[test]
fn without_last_control_plane_machines_without_a_cluster_lose_etcd() {
    let dir = mutant("lastcp", "removal.rules", |t| {
        without(t, "rule last-control-plane\n")
    });
    let (out, json) = verify(&dir, "2", &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "healthy-majority", "{}", out.stdout);
    let start = json["violations"][0]["start"].as_str().unwrap_or("");
    assert!(start.contains("no TalosCluster"), "{}", out.stdout);
    // The shipped rules keep it.
    let (out, _) = verify(&root().join("rules"), "2", &[]);
    assert_eq!(out.code, 0, "{}", out.stdout);
}

/// `diff`: edits equal in meaning (a reordered `and`, a `let` written out) are equivalent;
/// a weakened count is "more permissive" with a witness `eval` reproduces.
#[test]
fn diff_tells_equivalent_edits_from_weakenings() {
    let old = mutant("diff-old", "admission.rules", |t| format!("{t}\n"));
    let reordered = mutant("diff-reordered", "removal.rules", |t| {
        t.replacen(
            "when after > 0 and after < quorum",
            "when after < quorum and after > 0",
            1,
        )
        .replacen("  when after == 0\n", "  when approved - 1 == 0\n", 1)
    });
    let args = |a: &Path, b: &Path, extra: &[&str]| {
        let mut v = vec![
            "diff".to_string(),
            a.display().to_string(),
            b.display().to_string(),
            "--max-workers".into(),
            "0".into(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let same = args(&old, &reordered, &[]);
    let out = run(&same.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(out.stdout.contains("equivalent"), "{}", out.stdout);

    let weaker = mutant("diff-weaker", "removal.rules", |t| {
        t.replacen(
            "refuse remove controlplane\n  when after < count\n",
            "refuse remove controlplane\n  when after < count - 1\n",
            1,
        )
    });
    let fx = weaker.join("witness");
    let diff = args(
        &old,
        &weaker,
        &[
            "--format",
            "json",
            "--emit-fixtures",
            fx.to_str().expect("path"),
        ],
    );
    let out = run(&diff.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.code, 1, "{}", out.stdout);
    let json: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let groups = json["groups"].as_array().expect("groups");
    assert!(
        groups
            .iter()
            .any(|g| g["direction"] == "more permissive" && g["old"] == "refuse"),
        "{}",
        out.stdout
    );
    // The admission witness: refused by the old rules, allowed by the new ones.
    let k = groups
        .iter()
        .position(|g| {
            g["decision"]
                .as_str()
                .unwrap_or("")
                .ends_with("at the webhook")
        })
        .expect("an admission group");
    let d = fx.join(format!("group-{}", k + 1));
    let eval = |rules: &Path| {
        let e = run(&[
            "eval",
            "--rules",
            rules.to_str().expect("path"),
            "--objects",
            d.join("objects.yaml").to_str().expect("path"),
            "--review",
            d.join("review.json").to_str().expect("path"),
        ]);
        assert_eq!(e.code, 0, "{}{}", e.stdout, e.stderr);
        let v: Value = serde_json::from_str(&e.stdout).expect("JSON");
        v["response"]["allowed"].as_bool().expect("allowed")
    };
    assert!(!eval(&old));
    assert!(eval(&weaker));
}

/// The controller takes the cluster lock before it recounts and runs a removal, whatever
/// the plan says; a plan that drops `do lock cluster` would claim less than that, so it is
/// an error (exit 2, naming the code), never a rule set `verify` reports as verified.
#[test]
fn a_removal_plan_without_the_lock_is_an_error_not_verified() {
    let dir = mutant("nolock", "removal.rules", |t| {
        let lock = t
            .find("  do lock cluster\n")
            .expect("the shipped plan takes the lock");
        format!("{}{}", &t[..lock], &t[lock + "  do lock cluster\n".len()..])
    });
    let rules = dir.to_str().expect("utf-8 path");
    let out = run(&["verify", rules, "--max-control-planes", "2"]);
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("ichor::check::plan_without_lock")
            || out.stdout.contains("ichor::check::plan_without_lock"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
}

/// One operation at a time: without `another-operation-unfinished` a second operation is
/// created while the first is unfinished, and without `another-operation-parked` one is
/// created while another waits parked for the even count; `one-operation` refutes both
/// (for serialized requests: the lock, not admission, keeps two from running at once).
/// The second operation created while the first is parked is an etcd restore, the one kind
/// the even count does not refuse; the model has no TalosEtcdBackup, so a restore is
/// refused at its start (`restore-names-backup`), and the mutants let it start, as the
/// rules do for a restore from a backup outside the cluster.
#[test]
fn without_the_unfinished_operation_rules_operations_queue_up() {
    for (rule, parked) in [
        ("rule another-operation-unfinished\n", false),
        ("rule another-operation-parked\n", true),
    ] {
        let dir = mutant(&format!("ops-{parked}"), "admission.rules", |t| {
            without(&without(t, rule), "rule restore-names-backup\n")
        });
        let (out, json) = verify(&dir, "2", &["--max-operations", "2"]);
        assert_eq!(out.code, 1, "{}", out.stdout);
        assert_eq!(violated(&json)[0], "one-operation", "{}", out.stdout);
        let steps = step_texts(&json);
        let creates = steps
            .iter()
            .filter(|s| s.starts_with("kubectl create talosoperation"))
            .count();
        assert_eq!(creates, 2, "{steps:?}");
        assert_eq!(
            steps.iter().any(|s| s.contains("parks operation")),
            parked,
            "{steps:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// While the count is even a new operation is refused (ADR 0137 §4), not created to be
/// parked at once: without `operation-while-transitioning`, or without the control-plane
/// reset's own rule, `no-new-operation-while-even` refutes it.
#[test]
fn without_the_even_count_refusals_operations_are_created_to_wait() {
    // A control plane's reset below the quorum is refused anyway: it takes four machines
    // (count 3, a fourth approved) to be allowed but for the even count.
    for (rule, kind, cps) in [
        ("rule operation-while-transitioning\n", "upgrade", "2"),
        (
            "rule reset-control-plane-while-transitioning\n",
            "reset",
            "4",
        ),
    ] {
        let dir = mutant(&format!("even-create-{kind}"), "admission.rules", |t| {
            without(t, rule)
        });
        let (out, json) = verify(&dir, cps, &["--max-operations", "1", "--max-requests", "3"]);
        assert_eq!(out.code, 1, "{}", out.stdout);
        let v = violated(&json);
        assert!(
            v.contains(&"no-new-operation-while-even".to_string()),
            "{}",
            out.stdout
        );
        let trace = json["violations"]
            .as_array()
            .and_then(|v| {
                v.iter()
                    .find(|x| x["invariant"] == "no-new-operation-while-even")
            })
            .expect("the violation");
        let last = trace["steps"]
            .as_array()
            .and_then(|s| s.last())
            .and_then(|s| s["text"].as_str())
            .unwrap_or_default();
        assert!(
            last.starts_with("kubectl create talosoperation") && last.contains(kind),
            "{last}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The line of the removal plan that starts with `step` (after `  do `), removed.
fn without_step(text: &str, step: &str) -> String {
    let head = format!("  do {step}");
    let start = text.find(&head).unwrap_or_else(|| panic!("no `{head}`"));
    let end = text[start..]
        .find('\n')
        .map_or(text.len(), |e| start + e + 1);
    format!("{}{}", &text[..start], &text[end..])
}

/// A removal drains its node before resetting it, and ends with its node reset (or, in a
/// teardown, wiped): without the drain `drained-before-reset` refutes it; without the reset,
/// or the teardown's wipe, `nodes-reset` does (the TalosMachine would go while its node
/// runs on, configured).
#[test]
fn a_removal_that_skips_the_drain_or_the_reset_is_refuted() {
    for (step, invariant, cps) in [
        ("drain node", "drained-before-reset", "3"),
        ("talos reset", "nodes-reset", "3"),
        ("talos wipe", "nodes-reset", "1"),
    ] {
        let dir = mutant(
            &format!("skip-{}", step.replace(' ', "-")),
            "removal.rules",
            |t| without_step(t, step),
        );
        let (out, json) = verify(&dir, cps, &[]);
        assert_eq!(out.code, 1, "{step}: {}", out.stdout);
        assert!(
            violated(&json).contains(&invariant.to_string()),
            "{step}: {}",
            out.stdout
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// An etcd restore is a recovery: parking it for the even count (a `parked-for-transition`
/// without its exemption) is refuted by `restore-not-parked`. (The model has no
/// TalosEtcdBackup, so a restore is refused at its start, `restore-names-backup`; the
/// mutant lets it start, as the rules do for a restore from a backup outside the cluster.)
#[test]
fn an_etcd_restore_parked_for_the_even_count_is_refuted() {
    let dir = mutant("restore-parked", "removal.rules", |t| {
        t.replacen(
            "  unless kind == \"etcd-restore\" or kind == \"etcd-snapshot\" or failed or paused\n",
            "  unless kind == \"etcd-snapshot\" or failed or paused\n",
            1,
        )
    });
    edit_too(&dir, "admission.rules", |t| {
        without(t, "rule restore-names-backup\n")
    });
    let (out, json) = verify(&dir, "2", &["--max-operations", "1"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json), ["restore-not-parked"], "{}", out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Found by `verify` with 5 control-plane machines, operations and a request in flight:
/// two approvals admitted on the same snapshot leave count 3 with five approved control
/// planes of which three are etcd members; a reset of one of the three, counted against the
/// approved ones only, took etcd to 2 members. `reset-replacement-not-joined` (the
/// controller counting etcd's own members before it runs the reset) closes it.
#[test]
fn without_reset_replacement_not_joined_a_reset_outruns_two_concurrent_approvals() {
    let dir = mutant("reset-joined", "admission.rules", |t| {
        without(t, "rule reset-replacement-not-joined\n")
    });
    let bounds = [
        "--max-operations",
        "1",
        "--in-flight",
        "1",
        "--max-requests",
        "3",
        "--depth",
        "6",
    ];
    let (out, json) = verify(&dir, "5", &bounds);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "count-kept", "{}", out.stdout);
    let message = json["violations"][0]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("from 3 to 2 members, below the declared count of 3"),
        "{message}"
    );
    let texts = step_texts(&json);
    assert_eq!(
        texts
            .iter()
            .filter(|t| t.starts_with("kubectl patch") && t.contains("spec.approved: true"))
            .count(),
        2,
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t.contains("kind reset")), "{texts:?}");
    shipped_hold_within_depth("5", &bounds);
}

/// Found by `verify` with 3 control-plane machines, a failure, operations and a request in
/// flight: count 1, a delete of cp-1 in flight, a reset of cp-1 admitted, cp-2 un-approved
/// (all on the same counts), then cp-2's node dies: the reset of cp-1, a control plane
/// being deleted that no count includes, took etcd from 2 healthy of 3 to 1 of 2. (A
/// control plane re-roled to a worker is uncounted the same way; BFS may find either.)
/// `reset-uncounted-control-plane` refuses a reset of such a machine.
#[test]
fn without_reset_uncounted_control_plane_a_reset_of_a_deleted_member_loses_the_majority() {
    let dir = mutant("reset-uncounted", "admission.rules", |t| {
        without(t, "rule reset-uncounted-control-plane\n")
    });
    without_step_guards(&dir);
    let bounds = [
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--in-flight",
        "1",
        "--max-requests",
        "4",
        "--depth",
        "7",
    ];
    let (out, json) = verify(&dir, "3", &bounds);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(violated(&json)[0], "healthy-majority", "{}", out.stdout);
    // The reset is of a control plane no count includes: one being deleted, or (since
    // the model re-roles control planes too) one patched to `spec.role: worker`.
    let texts = step_texts(&json);
    let reset = texts
        .iter()
        .find_map(|t| t.split("kind reset, machine ").nth(1))
        .and_then(|t| t.split(')').next())
        .unwrap_or_else(|| panic!("no reset in {texts:?}"));
    assert!(
        texts.iter().any(|t| {
            t.contains(&format!("annotate+delete talosmachine {reset} "))
                || t.contains(&format!("talosmachine {reset} (spec.role: worker)"))
        }),
        "{reset} is neither deleted nor re-roled: {texts:?}"
    );
    assert!(texts.iter().any(|t| t.contains("dies")), "{texts:?}");
    shipped_hold_within_depth("3", &bounds);
}

/// ADR 0137's own bug: an operation waiting for the even count blocked the removal that
/// ends it. Without the `run operation` hold the controller refuses to start the operation
/// instead of parking it (it still does not run), and the webhook then refuses every
/// control plane's removal because of it; keeping the hold but dropping the parked
/// exemption from `unfinished-operation-blocks-removal` does the same.
/// `waiting-operation-not-blocking` refutes both, and the shipped rules keep it.
#[test]
fn an_operation_waiting_for_the_even_count_never_blocks_its_cure() {
    let unparked = mutant("cure-unparked", "removal.rules", |t| {
        without(t, "rule parked-for-transition\n")
    });
    let unexempt = mutant("cure-unexempt", "removal.rules", |t| {
        t.replacen(
            "when unfinished.exists and not unfinished.parked\n  unless teardown",
            "when unfinished.exists\n  unless teardown",
            1,
        )
    });
    for dir in [&unparked, &unexempt] {
        let (out, json) = verify(dir, "4", &["--max-operations", "1", "--max-requests", "3"]);
        refuted_only_by(&out, &json, "waiting-operation-not-blocking");
        let steps = step_texts(&json);
        assert!(
            steps
                .iter()
                .any(|s| s.starts_with("kubectl create talosoperation")),
            "{steps:?}"
        );
        assert!(
            steps.iter().any(|s| s.contains("spec.approved: true")),
            "{steps:?}"
        );
        // The last state's refused removal is named, with the rule and the operation.
        let blocked = json["violations"][0]["blocked"].as_str().unwrap_or("");
        assert!(
            blocked.starts_with("kubectl annotate+delete talosmachine cp-")
                && blocked.contains("refused here by unfinished-operation-blocks-removal")
                && blocked.ends_with("without op-1 it would be allowed"),
            "{blocked}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
    let (out, _) = verify(
        &root().join("rules"),
        "4",
        &["--max-operations", "1", "--max-requests", "3"],
    );
    assert_eq!(out.code, 0, "{}", out.stdout);
}

/// The warnings are part of what the rules promise: approving past the declared count says
/// the cluster is now transitioning (ADR 0054), and deleting an unreachable control plane
/// below the count says so (ADR 0106 §4). Without the warning rule, the invariant that
/// asks for it refutes the rules, with the approval (or the delete) as the last step.
#[test]
fn dropping_a_warning_the_adrs_ask_for_is_refuted() {
    for (file, rule, invariant, cps, failures, last) in [
        (
            "admission.rules",
            "rule approval-makes-even\n",
            "approval-past-count-said",
            "2",
            "0",
            "spec.approved: true",
        ),
        (
            "removal.rules",
            "rule dead-member-below-count\n",
            "dead-delete-said",
            "3",
            "1",
            "delete talosmachine",
        ),
    ] {
        let dir = mutant(invariant, file, |t| without(t, rule));
        let (out, json) = verify(&dir, cps, &["--max-failures", failures]);
        assert_eq!(out.code, 1, "{}", out.stdout);
        assert_eq!(
            violated(&json),
            vec![invariant.to_string()],
            "{}",
            out.stdout
        );
        let steps = step_texts(&json);
        assert!(steps.last().is_some_and(|s| s.contains(last)), "{steps:?}");
        let listed = json["invariants"]
            .as_array()
            .and_then(|v| v.iter().find(|i| i["name"] == invariant))
            .map(|i| i["checked_under"].clone());
        assert_eq!(listed, Some("serialized requests".into()), "{}", out.stdout);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The rule-owned reasons of the shipped rules (`reason X`), each with a renamed twin.
fn renamed_reasons() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for f in ["admission.rules", "removal.rules", "operations.rules"] {
        let text = std::fs::read_to_string(root().join("rules").join(f)).expect("rules/");
        for line in text.lines() {
            if let Some(r) = line.trim().strip_prefix("reason ")
                && !out.iter().any(|(o, _)| o == r.trim())
            {
                out.push((r.trim().to_string(), format!("Renamed{}", r.trim())));
            }
        }
    }
    assert!(
        out.iter().any(|(o, _)| o == "ClusterTransitioning"),
        "{out:?}"
    );
    out
}

/// Replaces each whole word `old` of `text` by its twin.
fn rename_words(text: &str, names: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (old, new) in names {
        let mut next = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(old.as_str()) {
            let before = rest[..i].chars().next_back();
            let after = rest[i + old.len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            next.push_str(&rest[..i]);
            next.push_str(if word(before) || word(after) {
                old
            } else {
                new
            });
            rest = &rest[i + old.len()..];
        }
        next.push_str(rest);
        out = next;
    }
    out
}

/// Issue 34: the rules own their words. Every reason the shipped rules set is renamed, in
/// the rules and in the shipped suite's objects and expectations alike: every case decides
/// as before, and `verify` explores exactly the same states and verifies (a parked
/// operation is recognised by the reason the rules park it with, not by a copy of the word
/// `ClusterTransitioning`: with that copy, the renamed `parked-for-transition` brought back
/// ADR 0137's own bug, an operation waiting for the even count blocking the removal that
/// ends it).
#[test]
fn renaming_every_rule_owned_reason_changes_no_behaviour() {
    let names = renamed_reasons();
    let dir = std::env::temp_dir().join(format!("ichor-renamed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("rules/tests")).expect("temp dir");
    for f in [
        "admission.rules",
        "removal.rules",
        "operations.rules",
        "invariants.rules",
    ] {
        let text = std::fs::read_to_string(root().join("rules").join(f)).expect("rules/");
        std::fs::write(dir.join("rules").join(f), rename_words(&text, &names)).expect("write");
    }
    for e in std::fs::read_dir(root().join("rules/tests")).expect("rules/tests") {
        let p = e.expect("entry").path();
        let text = std::fs::read_to_string(&p).expect("test file");
        let name = p.file_name().expect("name");
        std::fs::write(
            dir.join("rules/tests").join(name),
            rename_words(&text, &names),
        )
        .expect("write");
    }
    let renamed = dir.join("rules");
    let suite = run(&[
        "test",
        renamed.join("tests").to_str().expect("utf-8"),
        "--rules",
        renamed.to_str().expect("utf-8"),
    ]);
    assert_eq!(suite.code, 0, "{}\n{}", suite.stdout, suite.stderr);
    assert!(suite.stdout.contains(" 0 failed"), "{}", suite.stdout);
    // The parked operation of ADR 0137 is parked by its renamed reason.
    let parked = std::fs::read_to_string(renamed.join("tests/adr-0137-parked-operations.yaml"))
        .expect("renamed test file");
    assert!(parked.contains("RenamedClusterTransitioning"), "{parked}");

    let bounds = ["--max-operations", "1", "--max-requests", "3"];
    let (out, json) = verify(&renamed, "4", &bounds);
    assert_eq!(out.code, 0, "{}", out.stdout);
    let (original, json0) = verify(&root().join("rules"), "4", &bounds);
    assert_eq!(original.code, 0, "{}", original.stdout);
    assert_eq!(json["states"], json0["states"]);
    assert_eq!(json["transitions"], json0["transitions"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A size as `verify` writes it in words (`1.0 MiB`, `832 KiB`, `39 MiB`), in bytes.
fn bytes_of(words: &str) -> u64 {
    let (n, unit) = words.trim().split_once(' ').expect("a number and a unit");
    let n: f64 = n.parse().expect("a number");
    let scale = match unit {
        "bytes" => 1u64,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => panic!("unit {other}"),
    };
    (n * scale as f64) as u64
}

/// Issue 33: `verify` ran out of memory on bounds it accepts (12 control-plane machines):
/// killed by the kernel (137) or aborted on a failed allocation (134). It now stops before
/// its memory budget (`--max-memory`) is passed, exit 2, saying how far it got and what
/// to lower.
#[test]
fn verify_stops_within_its_memory_budget_and_says_how_far_it_got() {
    let rules = root().join("rules");
    // A budget below what the process needs to start: it stops at once.
    let (out, json) = verify(&rules, "12", &["--max-workers", "1", "--max-memory", "1M"]);
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert_eq!(json["result"], "incomplete", "{}", out.stdout);
    assert!(out.stderr.contains("nothing was proved"), "{}", out.stderr);
    let cut = json["cut"].as_str().expect("the cut is said").to_string();
    for says in [
        "the memory budget of 1.0 MiB (--max-memory) would be passed: ",
        " in use and ",
        " more needed to go on and finish, with ",
        " distinct states numbered (to depth ",
        "nothing was proved; lower the bounds (--max-control-planes, ",
        "or --depth, or raise --max-memory",
    ] {
        assert!(cut.contains(says), "{says:?} in {cut}");
    }
    let words = |after: &str, before: &str| {
        let at = cut.find(after).expect(after) + after.len();
        let end = cut[at..].find(before).expect(before) + at;
        cut[at..end].to_string()
    };
    let used = bytes_of(&words("would be passed: ", " in use"));
    let needed = bytes_of(&words(" in use and ", " more needed"));
    let states: u64 = words("finish, with ", " distinct").parse().expect("states");
    assert!(used > 1 << 20, "{cut}");
    // The human report says it too.
    let human = run(&[
        "verify",
        rules.to_str().expect("path"),
        "--max-control-planes",
        "12",
        "--max-memory",
        "1M",
    ]);
    assert_eq!(human.code, 2);
    assert!(
        human
            .stdout
            .contains("the memory budget of 1.0 MiB (--max-memory) would be passed")
            && human
                .stdout
                .contains("not verified: an exploration stopped before its bounds"),
        "{}",
        human.stdout
    );
    // Room for some exploration: it explores, and stops within the budget (its peak
    // resident memory, watched from outside, stays below it).
    let budget = used + needed + (48 << 20);
    let (out, peak) = crate::support::process::watched(
        Command::new(BIN)
            .args([
                "verify",
                rules.to_str().expect("path"),
                "--max-control-planes",
                "12",
                "--max-workers",
                "1",
                "--max-memory",
                &budget.to_string(),
                "--format",
                "json",
            ])
            .current_dir(root()),
        std::time::Duration::from_secs(600),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["result"], "incomplete");
    let explored = json["states"].as_u64().expect("states");
    assert!(explored > states, "{explored} states, {states} at once");
    assert!(
        json["cut"]
            .as_str()
            .is_some_and(|c| c.contains(&format!("{explored} distinct states numbered"))),
        "{stdout}"
    );
    if let Some(peak) = peak {
        assert!(peak <= budget, "peak {peak} bytes, budget {budget}");
    }
}

/// Issue 33: each invariant cost memory in every remembered outcome (its message, rendered
/// for every set of facts that broke it): 1,000 invariants broken in every state took
/// 608 MB on 3 control-plane machines (1.38 GB with a worker), where the rules alone take
/// 70 MB. Outcomes are now two bits per invariant, and a message is written only for a
/// violation reported: within a budget far below the old cost, every one is reported.
#[test]
fn a_thousand_broken_invariants_fit_in_the_memory_of_none() {
    let dir = mutant("thousand", "invariants.rules", |text| {
        let mut text = text.to_string();
        for i in 0..1000 {
            text.push_str(&format!(
                "\ninvariant never-{i}\n  ensure count < 0\n  say \"count {{count}} is not below zero ({i})\"\n"
            ));
        }
        text
    });
    let (out, json) = verify(&dir, "3", &["--max-memory", "400M"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(json["result"], "violated");
    assert!(json["cut"].is_null(), "{}", json["cut"]);
    let names = violated(&json);
    assert_eq!(
        names.iter().filter(|n| n.starts_with("never-")).count(),
        1000,
        "{names:?}"
    );
    let first = json["violations"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["invariant"] == "never-0"))
        .expect("never-0");
    assert!(
        first["message"]
            .as_str()
            .is_some_and(|m| m.contains("is not below zero (0)")),
        "{first}"
    );
}

/// ADR 0106 §4: a dead member removed below the declared count is said with a Warning
/// event. Without the plan's `event warning` step `dead-member-event` is refuted; with the
/// event's reason renamed it holds (the word is the rules', the model reads none).
#[test]
fn the_dead_member_event_is_the_plans_whatever_its_name() {
    let step = "  do event warning DeadMemberRemoved when not cluster.deleting and member.dead and after < count\n";
    let dir = mutant("no-dead-event", "removal.rules", |t| t.replace(step, ""));
    let bounds = ["--max-failures", "1", "--max-requests", "2"];
    let (out, json) = verify(&dir, "3", &bounds);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).iter().any(|v| v == "dead-member-event"),
        "{}",
        out.stdout
    );
    let dir = mutant("renamed-dead-event", "removal.rules", |t| {
        t.replace(
            "event warning DeadMemberRemoved",
            "event warning DeadMemberGone",
        )
    });
    let (out, _) = verify(&dir, "3", &bounds);
    assert_eq!(out.code, 0, "{}", out.stdout);
}

/// A worker re-roled to a control plane is named among the control planes (`cp-N`, a
/// number none has): with the worker's own number it was a second `cp-1`, and the
/// counterexample through it could not be replayed (exit 2 where the rules are refuted).
#[test]
fn a_counterexample_through_a_re_roled_worker_replays() {
    let dir = mutant("rerole-replay", "removal.rules", |t| {
        without(t, "rule replacement-not-joined\n")
    });
    let (out, json) = verify(&dir, "3", &["--max-workers", "1", "--max-requests", "2"]);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert!(
        !out.stderr.contains("could not be replayed"),
        "{}",
        out.stderr
    );
    assert!(
        violated(&json).iter().any(|v| v == "count-kept"),
        "{}",
        out.stdout
    );
    let texts = step_texts(&json);
    assert!(
        texts
            .iter()
            .any(|t| t.contains("worker-1 (spec.role: controlplane)")),
        "{texts:?}"
    );
}

/// Operations run on the executor in the model: an upgrade whose plan does not drain the
/// node takes it down undrained (`drained-before-down`); without `step-healthy-majority`
/// (and its gate), an upgrade of a control plane takes the majority down
/// (`healthy-majority`); the gate alone is defence in depth.
#[test]
fn an_operations_plan_without_its_drain_or_its_etcd_guards_is_refuted() {
    let bounds = [
        "--max-workers",
        "0",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "2",
    ];
    let upgrade = "plan run operation \"upgrade\"\n";
    let no_drain = mutant("op-drain", "operations.rules", |t| {
        let start = t.find(upgrade).expect("the upgrade plan");
        let drain = start + t[start..].find("  do drain node\n").expect("its drain");
        format!("{}{}", &t[..drain], &t[drain + "  do drain node\n".len()..])
    });
    let (out, json) = verify(&no_drain, "3", &bounds);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"drained-before-down".to_string()),
        "{}",
        out.stdout
    );
    assert!(
        step_texts(&json)
            .iter()
            .any(|s| s.contains("takes the node down") || s.contains("runs operation")),
        "{}",
        out.stdout
    );

    let gate = "  do etcd healthy within 2m  when target.controlplane or target.uncounted\n";
    let no_guards = mutant("op-guards", "operations.rules", |t| {
        without(
            &without(t, "rule step-healthy-majority\n"),
            "rule step-member-down\n",
        )
        .replace(gate, "")
    });
    let (out, json) = verify(&no_guards, "3", &bounds);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"healthy-majority".to_string()),
        "{}",
        out.stdout
    );
    // Without the step rules alone, the only control plane of a count-1 cluster is taken
    // down (its gate passes: the one member is healthy until the call; with either rule,
    // the etcd counts it reads cannot be asked of a sibling, and the step waits); without
    // the gate alone, the rules refuse every unsafe step.
    let rule_only = mutant("op-rule-only", "operations.rules", |t| {
        without(
            &without(t, "rule step-healthy-majority\n"),
            "rule step-member-down\n",
        )
    });
    let (out, json) = verify(&rule_only, "3", &bounds);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"healthy-majority".to_string()),
        "{}",
        out.stdout
    );
    let gate_only = mutant("op-gate-only", "operations.rules", |t| t.replace(gate, ""));
    let (out, json) = verify(&gate_only, "3", &bounds);
    holds(&out, &json);
}

/// Issue 35: with `--talos 1.13` the model's nodes serve `ImageService/Pull` and
/// `LifecycleService/Upgrade`, and an upgrade takes the executor's path for them (pull,
/// install, its exit code read, then cordon, drain and the controller's own reboot), with
/// the install's faults (exit code 1, its answer lost, a crash after it): every invariant
/// holds with the shipped rules, and an upgrade plan without its drain reboots the node
/// undrained on that path too (`drained-before-down`). With `--clock` time passes at a
/// gate (a failed gate fails the operation): the shipped rules hold, `failed-touches-
/// nothing` and `operations-finish` among them.
#[test]
fn the_talos_1_13_upgrade_path_and_the_clock_are_explored() {
    let bounds = [
        "--max-workers",
        "0",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "2",
    ];
    let shipped = root().join("rules");
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        bounds
            .iter()
            .copied()
            .chain(extra.iter().copied())
            .collect()
    };
    let (out, json) = verify(&shipped, "3", &with(&["--talos", "1.13"]));
    holds(&out, &json);
    let (out, json) = verify(&shipped, "3", &with(&["--clock"]));
    holds(&out, &json);
    let (out, json) = verify(&shipped, "3", &with(&["--talos", "1.13", "--clock"]));
    holds(&out, &json);

    let upgrade = "plan run operation \"upgrade\"\n";
    let no_drain = mutant("op-drain-1-13", "operations.rules", |t| {
        let start = t.find(upgrade).expect("the upgrade plan");
        let drain = start + t[start..].find("  do drain node\n").expect("its drain");
        format!("{}{}", &t[..drain], &t[drain + "  do drain node\n".len()..])
    });
    let (out, json) = verify(&no_drain, "3", &with(&["--talos", "1.13"]));
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"drained-before-down".to_string()),
        "{}",
        out.stdout
    );
}

/// Issue 35: the gates after an upgrade's call each carry weight. Without `wait node-back`
/// an upgrade that did not take (the node boots its old version) succeeds; without the
/// `etcd healthy` gate after it, an upgrade succeeds while its etcd member has not caught
/// up: `upgrade-ends-back` refutes both. Without `step-member-down`, a call refused (or a
/// drain blocked) and then another node dying let the call go out with two control planes
/// down: `one-member-down` refutes it. (The first `etcd healthy` gate is defence in depth
/// behind the step rules: `an_operations_plan_without_its_drain_or_its_etcd_guards_is_refuted`.)
#[test]
fn each_gate_after_an_upgrades_call_and_the_one_down_rule_are_refuted_when_dropped() {
    let bounds = [
        "--max-workers",
        "0",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "2",
    ];
    let upgrade = "plan run operation \"upgrade\"\n";
    for (name, step, move_words) in [
        ("op-back", "wait node-back", "running its old version"),
        (
            "op-healthy-after",
            "etcd healthy within 5m",
            "answers again",
        ),
    ] {
        let dir = mutant(name, "operations.rules", |t| {
            let start = t.find(upgrade).expect("the upgrade plan");
            format!("{}{}", &t[..start], without_step(&t[start..], step))
        });
        let (out, json) = verify(&dir, "3", &bounds);
        assert_eq!(out.code, 1, "{name}: {}", out.stdout);
        assert_eq!(
            violated(&json),
            vec!["upgrade-ends-back".to_string()],
            "{name}: {}",
            out.stdout
        );
        let steps = step_texts(&json);
        assert!(
            steps.iter().any(|s| s.contains(move_words)),
            "{name}: {steps:?}"
        );
        assert!(
            steps.last().is_some_and(|s| s.contains("finishes")),
            "{name}: {steps:?}"
        );
    }
    let dir = mutant("op-member-down", "operations.rules", |t| {
        without(t, "rule step-member-down\n")
    });
    let five = [
        "--max-failures",
        "2",
        "--max-operations",
        "1",
        "--max-requests",
        "1",
    ];
    let (out, json) = verify(&dir, "5", &five);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        violated(&json).contains(&"one-member-down".to_string()),
        "{}",
        out.stdout
    );
    assert!(
        step_texts(&json).iter().any(|s| s.contains("dies")),
        "{}",
        out.stdout
    );
    // With the rule, the same bounds verify.
    let (out, json) = verify(&root().join("rules"), "5", &five);
    holds(&out, &json);
}

/// A reboot rolled over the whole cluster (`--rolls`: as the controller's configuration
/// roll creates it, no `spec.machine`) runs through the executor node by node in the model.
/// Each gate of the reboot plan that keeps a roll safe is refuted when dropped: without
/// `wait node-back` or the `etcd healthy` after it, the roll finishes a node (and takes
/// the next) before it is back or its etcd member caught up (`upgrade-ends-back`); without
/// the drain, a node goes down undrained (`drained-before-down`); without the uncordon, the
/// roll leaves each node cordoned (`upgrade-ends-back`). The shipped rules verify
/// under the same bounds.
#[test]
fn each_gate_of_a_roll_over_the_cluster_is_refuted_when_dropped() {
    let bounds = [
        "--rolls",
        "--max-workers",
        "1",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "1",
    ];
    let reboot = "plan run operation \"reboot\"\n";
    // A node left cordoned is out of service: the roll takes the next control plane
    // beside it (`roll-control-plane-alone`) as it finishes it (`upgrade-ends-back`).
    for (name, step, invariants) in [
        ("roll-back", "wait node-back", &["upgrade-ends-back"][..]),
        (
            "roll-healthy-after",
            "etcd healthy within 5m",
            &["upgrade-ends-back"],
        ),
        ("roll-drain", "drain node", &["drained-before-down"]),
        (
            "roll-uncordon",
            "uncordon node",
            &["upgrade-ends-back", "roll-control-plane-alone"],
        ),
    ] {
        let dir = mutant(name, "operations.rules", |t| {
            let start = t.find(reboot).expect("the reboot plan");
            format!("{}{}", &t[..start], without_step(&t[start..], step))
        });
        let (out, json) = verify(&dir, "3", &bounds);
        assert_eq!(out.code, 1, "{name}: {}", out.stdout);
        assert_eq!(violated(&json), invariants, "{name}: {}", out.stdout);
        let steps = step_texts(&json);
        assert!(
            steps.iter().any(|s| s.contains("a roll over the cluster")),
            "{name}: {steps:?}"
        );
    }
    let (out, json) = verify(&root().join("rules"), "3", &bounds);
    holds(&out, &json);
}

/// The default suite's roll run (3 control planes, a worker, a failure, one roll, two
/// requests) verifies: a roll that passes a machine being deleted, untouched, whose node
/// died on its own (the cluster deleted under the roll, the garbage collector deleting the
/// machine) has not left down a node it took down (`upgrade-ends-back` counts only the
/// nodes the roll cordoned). Before, the model counted that dead node against the roll.
#[test]
fn a_roll_passing_a_dying_machine_being_deleted_is_not_blamed_for_it() {
    let bounds = [
        "--rolls",
        "--max-workers",
        "1",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "2",
    ];
    let (out, json) = verify(&root().join("rules"), "3", &bounds);
    holds(&out, &json);
    // The exploration reached the cluster's deletion under a running roll.
    assert!(json["states"].as_u64().unwrap_or(0) > 50_000, "{json}");
}

/// A roll with `spec.maxUnavailable: 2` over three control planes and three workers
/// (`--rolls --max-unavailable 2`): the shipped rules verify (never more than two workers
/// down or cordoned at once, the control plane alone and first). Without
/// `step-max-unavailable` the executor's offer of the next worker is let through while two
/// are in flight, and a third goes down beside them: `roll-width-kept` refutes it, the
/// counterexample a roll over the cluster.
#[test]
fn a_roll_wider_than_max_unavailable_is_refuted() {
    let bounds = [
        "--rolls",
        "--max-unavailable",
        "2",
        "--max-workers",
        "3",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "1",
    ];
    let (out, json) = verify(&root().join("rules"), "3", &bounds);
    holds(&out, &json);
    let dir = mutant("roll-width", "operations.rules", |t| {
        without(t, "rule step-max-unavailable\n")
    });
    let (out, json) = verify(&dir, "3", &bounds);
    refuted_only_by(&out, &json, "roll-width-kept");
    let steps = step_texts(&json);
    assert!(
        steps.iter().any(|s| s.contains("a roll over the cluster")),
        "{steps:?}"
    );
}

/// The bootstrap is explored with the rules verified (issue 37): without
/// `bootstrap-etcd-exists`, a cluster whose first control plane was replaced gets a second
/// etcd, and `verify` says so, in words and in JSON, and exits 1.
#[test]
fn a_bootstrap_rule_dropped_is_refuted_by_the_bootstrap_exploration() {
    let dir = mutant("no-bootstrap-etcd-exists", "admission.rules", |t| {
        without(t, "rule bootstrap-etcd-exists\n")
    });
    let (out, json) = verify(&dir, "1", &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert_eq!(json["result"], "violated");
    let bootstrap = json["procedures"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "bootstrap"))
        .expect("the bootstrap exploration");
    assert_eq!(bootstrap["violations"][0]["invariant"], "bootstrap-once");
    let steps = bootstrap["violations"][0]["steps"].to_string();
    assert!(steps.contains("etcd runs on cp-2 and cp-3"), "{steps}");
    // The cluster's runs found nothing: the verdict is the procedure's.
    assert!(violated(&json).is_empty(), "{json}");
    let human = run(&[
        "verify",
        dir.to_str().expect("utf-8"),
        "--max-control-planes",
        "1",
        "--max-workers",
        "0",
        "--max-failures",
        "0",
        "--max-operations",
        "0",
        "--in-flight",
        "0",
    ]);
    assert_eq!(human.code, 1);
    assert!(
        human
            .stdout
            .contains("VIOLATED: bootstrap-once (bootstrap)"),
        "{}",
        human.stdout
    );
    assert!(!human.stdout.contains("\nverified:"), "{}", human.stdout);
    // The shipped rules: both procedures hold, in JSON too.
    let (out, json) = verify(&root().join("rules"), "1", &[]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    let names: Vec<&str> = json["procedures"]
        .as_array()
        .expect("procedures")
        .iter()
        .filter_map(|p| {
            p["violations"]
                .as_array()
                .filter(|v| v.is_empty())
                .and(p["name"].as_str())
        })
        .collect();
    assert_eq!(names, ["backup", "bootstrap", "apply"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The apply and the bootstrap are plans of the rules verified (issue 37): `verify` runs
/// the text's `plan apply controlplane` and `plan bootstrap controlplane`, so a plan
/// without Talos' dry run before its apply, or without its `talos bootstrap`, is refuted by
/// its procedure's exploration, and `verify` exits 1 (the shipped plans hold:
/// `a_bootstrap_rule_dropped_is_refuted_by_the_bootstrap_exploration`).
#[test]
fn an_apply_or_bootstrap_plan_weakened_is_refuted_by_its_exploration() {
    let procedure = |json: &Value, name: &str| -> Vec<String> {
        json["procedures"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == name))
            .and_then(|p| p["violations"].as_array())
            .map(|v| {
                v.iter()
                    .filter_map(|v| v["invariant"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    for (name, file, edit, which, invariant) in [
        (
            "apply-without-dry-run",
            "removal.rules",
            "  do talos dry-run\n",
            "apply",
            "dry-run-first",
        ),
        (
            "apply-without-apply-config",
            "removal.rules",
            "  do talos apply-config\n",
            "apply",
            "apply-ends",
        ),
        (
            "bootstrap-without-its-call",
            "admission.rules",
            "  do talos bootstrap\n",
            "bootstrap",
            "bootstrap-ends",
        ),
    ] {
        let dir = mutant(name, file, |t| t.replace(edit, ""));
        let (out, json) = verify(&dir, "1", &[]);
        assert_eq!(out.code, 1, "{name}: {}", out.stdout);
        let found = procedure(&json, which);
        assert!(found.iter().any(|v| v == invariant), "{name}: {found:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// An upgrade rolled over the whole cluster (`--rolls --roll-kind upgrade`: no
/// `spec.machine`, control planes first, then workers) runs through the executor in the
/// model as a reboot roll does, each node coming back with the new version: the shipped
/// rules verify, and dropping each gate of the upgrade plan is refuted under the roll.
/// Without `wait node-back` the counterexample is an upgrade that did not take (the node
/// answers again running its old version, which the `etcd healthy` gate after the call
/// does not see): the version is what that gate checks for an upgrade.
#[test]
fn each_gate_of_an_upgrade_rolled_over_the_cluster_is_refuted_when_dropped() {
    let bounds = [
        "--rolls",
        "--roll-kind",
        "upgrade",
        "--max-workers",
        "1",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "1",
    ];
    let (out, json) = verify(&root().join("rules"), "3", &bounds);
    holds(&out, &json);
    let run = &json["runs"][0]["bounds"];
    assert_eq!(run["roll_kind"], "upgrade", "{json}");
    assert_eq!(run["rolls"], true, "{json}");
    assert!(json["states"].as_u64().unwrap_or(0) > 2_000, "{json}");
    let upgrade = "plan run operation \"upgrade\"\n";
    for (name, step, invariants, says) in [
        (
            "upgrade-roll-back",
            "wait node-back",
            &["upgrade-ends-back"][..],
            "running its old version",
        ),
        (
            "upgrade-roll-healthy-after",
            "etcd healthy within 5m",
            &["upgrade-ends-back"],
            "not caught up",
        ),
        (
            "upgrade-roll-drain",
            "drain node",
            &["drained-before-down"],
            "over the cluster",
        ),
        (
            "upgrade-roll-uncordon",
            "uncordon node",
            &["upgrade-ends-back", "roll-control-plane-alone"],
            "over the cluster",
        ),
    ] {
        let dir = mutant(name, "operations.rules", |t| {
            let start = t.find(upgrade).expect("the upgrade plan");
            format!("{}{}", &t[..start], without_step(&t[start..], step))
        });
        let (out, json) = verify(&dir, "3", &bounds);
        assert_eq!(out.code, 1, "{name}: {}", out.stdout);
        assert_eq!(violated(&json), invariants, "{name}: {}", out.stdout);
        let steps = step_texts(&json);
        assert!(
            steps
                .iter()
                .any(|s| s.contains("kind upgrade, no machine: a roll over the cluster")),
            "{name}: {steps:?}"
        );
        assert!(steps.iter().any(|s| s.contains(says)), "{name}: {steps:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `--roll-kind` needs `--rolls`, and takes `reboot` or `upgrade` only.
#[test]
fn a_roll_kind_without_rolls_or_of_another_kind_is_bad_usage() {
    let rules = root().join("rules");
    let rules = rules.to_str().expect("utf-8 path");
    let out = run(&["verify", rules, "--roll-kind", "upgrade"]);
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("--rolls"), "{}", out.stderr);
    let out = run(&["verify", rules, "--rolls", "--roll-kind", "reset"]);
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("reboot, upgrade"), "{}", out.stderr);
    let help = run(&["verify", "--help"]);
    assert!(help.stdout.contains("--roll-kind"), "{}", help.stdout);
}

/// A roll's control planes go alone (`roll-control-plane-alone`): with
/// `--max-unavailable 2` the executor offers the first worker while the last control plane
/// waits for its node, and without `step-beside-control-plane` the worker is cordoned and
/// taken down beside it. Without `step-control-plane-alone` the shipped rules still
/// verify: every node in flight beside a control plane of the roll precedes it in the
/// order the executor recorded at the start, control planes first, so it was an approved
/// control plane then and still is one or holds the removal finalizer, which
/// `roll.controlplane_in_flight` reads: `step-beside-control-plane` refuses every step
/// that rule would. Without both, a control plane goes beside another whose call was
/// refused (left cordoned, waiting to send it again): refuted.
#[test]
fn the_control_planes_of_a_roll_go_alone() {
    let wide = |workers: &'static str, failures: &'static str| {
        [
            "--rolls",
            "--max-unavailable",
            "2",
            "--max-workers",
            workers,
            "--max-failures",
            failures,
            "--max-operations",
            "1",
            "--max-requests",
            "1",
        ]
    };
    let (out, json) = verify(&root().join("rules"), "3", &wide("1", "1"));
    holds(&out, &json);
    let beside = mutant("roll-beside", "operations.rules", |t| {
        without(t, "rule step-beside-control-plane\n")
    });
    let (out, json) = verify(&beside, "3", &wide("1", "0"));
    refuted_only_by(&out, &json, "roll-control-plane-alone");
    let steps = step_texts(&json);
    assert!(
        steps.iter().any(|s| s.contains("a roll over the cluster")),
        "{steps:?}"
    );
    let alone = mutant("roll-alone", "operations.rules", |t| {
        without(t, "rule step-control-plane-alone\n")
    });
    let (out, json) = verify(&alone, "3", &wide("1", "1"));
    holds(&out, &json);
    edit_too(&alone, "operations.rules", |t| {
        without(t, "rule step-beside-control-plane\n")
    });
    let (out, json) = verify(&alone, "3", &wide("0", "1"));
    refuted_only_by(&out, &json, "roll-control-plane-alone");
    let steps = step_texts(&json);
    assert!(steps.iter().any(|s| s.contains("was refused")), "{steps:?}");
    for dir in [beside, alone] {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// An unschedulable cluster keeps a worker in service while its workers roll two at a
/// time (`--max-unavailable 2`, two workers): `step-last-worker` counts the roll's other
/// nodes in flight as gone (`workers.others_up`), so the second worker waits while the
/// first is away. Written
/// as before rolls went wide (`workers <= 1`), the rule lets the second go too:
/// `worker-in-service-while-unschedulable` refutes it, and only with the wider roll (one
/// at a time it verifies); without the rule at all, likewise.
#[test]
fn an_unschedulable_cluster_keeps_a_worker_in_service_under_a_wide_roll() {
    let bounds = |width: &'static str| {
        [
            "--rolls",
            "--max-unavailable",
            width,
            "--max-workers",
            "2",
            "--max-failures",
            "0",
            "--max-operations",
            "1",
            "--max-requests",
            "2",
        ]
    };
    let (out, json) = verify(&root().join("rules"), "3", &bounds("2"));
    holds(&out, &json);
    let narrow = mutant("last-worker-narrow", "operations.rules", |t| {
        let narrowed = t.replace("and workers.others_up == 0", "and workers <= 1");
        assert_ne!(narrowed, t, "the rule as shipped");
        narrowed
    });
    let gone = mutant("last-worker-gone", "operations.rules", |t| {
        without(t, "rule step-last-worker\n")
    });
    for dir in [&narrow, &gone] {
        let (out, json) = verify(dir, "3", &bounds("2"));
        refuted_only_by(&out, &json, "worker-in-service-while-unschedulable");
        let steps = step_texts(&json);
        assert!(
            steps
                .iter()
                .any(|s| s.contains("spec.schedulable: \"false\"")),
            "{steps:?}"
        );
    }
    let (out, json) = verify(&narrow, "3", &bounds("1"));
    holds(&out, &json);
    for dir in [narrow, gone] {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Workers die too, and the controller probes them as it probes control planes: a roll of
/// an unschedulable cluster with two workers, one at a time, where one worker dies. Once the
/// probe has recorded that death, `step-last-worker` (reading `workers.others_up`) keeps
/// the other in service; without the rule the roll takes it, and
/// `worker-in-service-while-unschedulable` refutes that, its counterexample the death, the
/// probe, then the roll. A death no probe has seen yet is no decision's fault: the shipped
/// rules verify (before workers.serving counted what the controller can know, they did not).
#[test]
fn a_dead_worker_the_probe_reported_is_not_counted_in_service_by_a_roll() {
    let bounds = [
        "--rolls",
        "--max-workers",
        "2",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "2",
    ];
    let (out, json) = verify(&root().join("rules"), "3", &bounds);
    holds(&out, &json);
    assert!(
        !out.stdout
            .contains("vacuous   worker-in-service-while-unschedulable"),
        "{}",
        out.stdout
    );
    let gone = mutant("last-worker-dead", "operations.rules", |t| {
        without(t, "rule step-last-worker\n")
    });
    let (out, json) = verify(&gone, "3", &bounds);
    refuted_only_by(&out, &json, "worker-in-service-while-unschedulable");
    let steps = step_texts(&json);
    let at = |what: &str| steps.iter().position(|s| s.contains(what));
    let (died, probed) = (at("dies"), at("Ready=False NodeUnreachable"));
    assert!(
        died.is_some() && probed.is_some() && died < probed,
        "{steps:#?}"
    );
    // Without the failure, one worker at a time never takes the last: the same mutant holds.
    let mut none = bounds;
    none[4] = "0";
    let (out, _) = verify(&gone, "3", &none);
    assert_eq!(out.code, 0, "{}", out.stdout);
    let _ = std::fs::remove_dir_all(&gone);
}

/// An upgrade roll under the default suite's roll bounds (3 control planes, a worker, a
/// failure, 2 requests) verifies: a roll that passes a control plane being deleted (the
/// cluster deleted under it, the garbage collector deleting the machine), untouched, has
/// not left it running its old version. Before, `upgrade-ends-back` blamed the roll for it.
#[test]
fn an_upgrade_roll_passing_a_machine_being_deleted_is_not_blamed_for_its_version() {
    let bounds = [
        "--rolls",
        "--roll-kind",
        "upgrade",
        "--max-workers",
        "1",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "2",
    ];
    let (out, json) = verify(&root().join("rules"), "3", &bounds);
    holds(&out, &json);
    assert!(json["states"].as_u64().unwrap_or(0) > 50_000, "{json}");
}

/// The shipped rules hold under `bounds` at `size`: no violation within the depth the
/// bounds cut at (a depth cut proves nothing beyond it, so the run is then incomplete,
/// exit 2, never "verified"; exit 0 when nothing was cut).
fn shipped_hold_within_depth(size: &str, bounds: &[&str]) {
    let (out, json) = verify(&root().join("rules"), size, bounds);
    assert!(violated(&json).is_empty(), "{}", out.stdout);
    let cut = json["cut"].as_str().is_some_and(|c| c.contains("depth"));
    assert_eq!(out.code, if cut { 2 } else { 0 }, "{}", out.stdout);
}

/// The plan `run operation "<kind>"` of `text` without its step that starts with `step`.
fn plan_without(text: &str, kind: &str, step: &str) -> String {
    let head = format!("plan run operation \"{kind}\"\n");
    let start = text.find(&head).unwrap_or_else(|| panic!("no plan {kind}"));
    let end = start + text[start..].find("\n\n").unwrap_or(text.len() - start);
    assert!(
        text[start..end].contains(&format!("  do {step}")),
        "the {kind} plan has no `{step}`"
    );
    format!("{}{}", &text[..start], without_step(&text[start..], step))
}

/// Issue 35: one machine's rollback and shutdown run through the executor in the model as
/// its upgrade and reset do (every run with bounds given creates them; the default suite in
/// a run of its own). Each step whose absence breaks a safety invariant is refuted when
/// dropped, the invariant named: without the drain, a node goes down undrained (a reset's
/// node is reset undrained too); a rollback without `wait node-back` (a worker's: a control
/// plane's `etcd healthy` gate after the call waits for it anyway), the `etcd healthy` gate
/// after its call, its cordon (the drain cordons the node, but the operation did not record
/// it as its own, so it never uncordons it) or its uncordon succeeds with its node not back
/// in service (`upgrade-ends-back`), as does an upgrade of one machine without its cordon
/// or its uncordon. A reset of one of three control planes is refused
/// below the declared count, so its run takes two requests (an approval first).
#[test]
fn each_step_of_a_rollback_shutdown_or_reset_is_refuted_when_dropped() {
    let bounds = |workers: &'static str, requests: &'static str| {
        [
            "--max-workers",
            workers,
            "--max-failures",
            "1",
            "--max-operations",
            "1",
            "--max-requests",
            requests,
        ]
    };
    let one = bounds("1", "1");
    let reset = bounds("0", "2");
    for (kind, step, invariants, bounds) in [
        ("rollback", "drain node", &["drained-before-down"][..], &one),
        ("rollback", "cordon node", &["upgrade-ends-back"], &one),
        ("rollback", "wait node-back", &["upgrade-ends-back"], &one),
        (
            "rollback",
            "etcd healthy within 5m",
            &["upgrade-ends-back"],
            &one,
        ),
        ("rollback", "uncordon node", &["upgrade-ends-back"], &one),
        ("shutdown", "drain node", &["drained-before-down"], &one),
        ("upgrade", "cordon node", &["upgrade-ends-back"], &one),
        ("upgrade", "uncordon node", &["upgrade-ends-back"], &one),
        (
            "reset",
            "drain node",
            &["drained-before-down", "drained-before-reset"],
            &reset,
        ),
    ] {
        let name = format!("{kind}-{}", step.replace(' ', "-"));
        let dir = mutant(&name, "operations.rules", |t| plan_without(t, kind, step));
        let (out, json) = verify(&dir, "3", bounds);
        assert_eq!(out.code, 1, "{name}: {}", out.stdout);
        assert_eq!(violated(&json), invariants, "{name}: {}", out.stdout);
        let steps = step_texts(&json);
        assert!(
            steps
                .iter()
                .any(|s| s.contains(&format!("(kind {kind}, machine"))),
            "{name}: {steps:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    // The same bounds verify with the shipped rules.
    for bounds in [&one, &reset] {
        let (out, json) = verify(&root().join("rules"), "3", bounds);
        holds(&out, &json);
    }
}

/// Issue 35: an operation does what its kind says (`operation-does-its-work`). A plan
/// whose Talos call does not run would otherwise succeed: a shutdown's or a reset's
/// without it, or a reboot roll's or a rollback's with it guarded away from workers,
/// leaves every gate passing (the node never went down, so `wait node-back` sees it answer
/// and its member healthy), and before the invariant `verify` said verified. Each is
/// refuted now, on the bounds each kind's other steps are refuted on. (A reboot's or a
/// rollback's plan without its call at all is refused by `check`, its `wait node-back`
/// having nothing to wait for: `ichor::check::wait_without_reboot`. An upgrade without
/// its call never succeeds: `wait node-back` waits for the new version, and fails the
/// operation past its `within` in a real run.)
#[test]
fn an_operation_plan_without_its_talos_call_is_refuted() {
    let bounds = |workers: &'static str, requests: &'static str, rolls: bool| {
        let mut b = vec![
            "--max-workers",
            workers,
            "--max-failures",
            "1",
            "--max-operations",
            "1",
            "--max-requests",
            requests,
        ];
        if rolls {
            b.insert(0, "--rolls");
        }
        b
    };
    // The call guarded so that a worker's operation skips it.
    let guarded = |t: &str, kind: &str, call: &str| {
        let head = format!("plan run operation \"{kind}\"\n");
        let start = t.find(&head).unwrap_or_else(|| panic!("no plan {kind}"));
        let line = format!("  do {call}\n");
        let at = start + t[start..].find(&line).expect("the plan's call");
        format!(
            "{}  do {call} when target.controlplane\n{}",
            &t[..at],
            &t[at + line.len()..]
        )
    };
    for (kind, call, bounds, skip) in [
        ("reboot", "talos reboot", bounds("1", "1", true), true),
        ("rollback", "talos rollback", bounds("1", "1", false), true),
        ("shutdown", "talos shutdown", bounds("1", "1", false), false),
        ("reset", "talos reset", bounds("0", "2", false), false),
    ] {
        let name = format!("{kind}-without-its-call");
        let dir = mutant(&name, "operations.rules", |t| {
            if skip {
                guarded(t, kind, call)
            } else {
                plan_without(t, kind, call)
            }
        });
        let (out, json) = verify(&dir, "3", &bounds);
        assert_eq!(out.code, 1, "{name}: {}", out.stdout);
        assert!(
            violated(&json)
                .iter()
                .any(|v| v == "operation-does-its-work"),
            "{name}: {:?}\n{}",
            violated(&json),
            out.stdout
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    // The same bounds verify with the shipped rules (the single-machine ones are
    // `each_step_of_a_rollback_shutdown_or_reset_is_refuted_when_dropped`'s).
    let (out, json) = verify(&root().join("rules"), "3", &bounds("1", "1", true));
    holds(&out, &json);
}

/// Defence in depth in the rollback, shutdown and reset plans, pinned: the first `etcd
/// healthy` gate and the step rules (`step-healthy-majority`, `step-member-down`) each keep
/// a control plane from going down beside another member down. Without both, for that kind
/// alone, a rollback or a shutdown takes etcd below its majority with two members down
/// (`healthy-majority`, `one-member-down`); without either one, the other refuses every
/// unsafe step and the same bounds verify. A reset's start and step rules of
/// admission.rules (quorum, healthy majority, declared count) cover it without both (as
/// `without_step_guards` shows for its start rules). A shutdown's or a reset's cordon is
/// covered by its drain (which cordons the node; neither plan uncordons), and `etcd
/// forfeit-leadership` keeps etcd available (no election when the leader goes down), which
/// no safety invariant states: the verified mutants drop those steps too.
#[test]
fn the_first_gate_and_the_step_rules_of_a_rollback_shutdown_or_reset_back_each_other_up() {
    let bounds = [
        "--max-workers",
        "0",
        "--max-failures",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "2",
    ];
    let gate = "etcd healthy within 2m";
    // The step rules no longer decide the steps of `kind`.
    let exempt = |t: &str, kind: &str| {
        let mut t = t.to_string();
        for rule in ["rule step-healthy-majority\n", "rule step-member-down\n"] {
            let at = t.find(rule).expect("the step rule");
            let when = at + t[at..].find("\n  say ").expect("its message");
            t = format!("{}\n  unless kind == \"{kind}\"{}", &t[..when], &t[when..]);
        }
        t
    };
    for kind in ["rollback", "shutdown"] {
        let dir = mutant(&format!("{kind}-unguarded"), "operations.rules", |t| {
            plan_without(&exempt(t, kind), kind, gate)
        });
        let mut bounds = bounds;
        bounds[7] = "1";
        let (out, json) = verify(&dir, "3", &bounds);
        assert_eq!(out.code, 1, "{kind}: {}", out.stdout);
        assert_eq!(
            violated(&json),
            ["healthy-majority", "one-member-down"],
            "{kind}: {}",
            out.stdout
        );
        assert!(
            step_texts(&json)
                .iter()
                .any(|s| s.contains(&format!("(kind {kind}, machine"))),
            "{kind}: {}",
            out.stdout
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    // Each mutant drops one of the two guards and the steps no invariant needs; a reset
    // drops both (its admission rules stand), so it is made two approvals deep.
    let cordon = |t: &str, kind: &str| {
        let t = plan_without(t, kind, "etcd forfeit-leadership");
        if kind == "rollback" {
            t
        } else {
            plan_without(&t, kind, "cordon node")
        }
    };
    let mut verified: Vec<(String, PathBuf, &str)> = Vec::new();
    for kind in ["rollback", "shutdown"] {
        let name = format!("{kind}-rules-only");
        let dir = mutant(&name, "operations.rules", |t| {
            cordon(&exempt(t, kind), kind)
        });
        verified.push((name, dir, "1"));
        let name = format!("{kind}-gate-only");
        let dir = mutant(&name, "operations.rules", |t| {
            cordon(&plan_without(t, kind, gate), kind)
        });
        verified.push((name, dir, "1"));
    }
    let dir = mutant("reset-unguarded", "operations.rules", |t| {
        cordon(&plan_without(&exempt(t, "reset"), "reset", gate), "reset")
    });
    verified.push(("reset-unguarded".into(), dir, "2"));
    for (name, dir, requests) in verified {
        let mut bounds = bounds;
        bounds[7] = requests;
        let (out, json) = verify(&dir, "3", &bounds);
        assert_eq!(out.code, 0, "{name}: {}", out.stdout);
        assert!(violated(&json).is_empty(), "{name}: {}", out.stdout);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// ADR 0106 §2 in the model (`--backups`): beside the backup outside the cluster, one whose
/// store is inside it, with a fresh verified snapshot throughout, which the model's etcd
/// restores name. Without `restore-store-in-cluster` a restore from it is created: refuted
/// by `restore-store-outside`. The shipped rules hold on the same bounds and refuse it.
/// (That the in-cluster snapshot never counts as the fresh one is the shipped run of
/// `without_the_fresh_backup_rules_disruptive_work_starts_without_a_snapshot`:
/// `fresh-backup-none-yet` fires there although the in-cluster backup has a fresh one.)
#[test]
fn without_restore_store_in_cluster_a_restore_from_an_in_cluster_store_is_refuted() {
    let bounds = ["--backups", "--max-operations", "1", "--max-requests", "1"];
    let dir = mutant("restore-in-cluster", "admission.rules", |t| {
        without(t, "rule restore-store-in-cluster\n")
    });
    let (out, json) = verify(&dir, "1", &bounds);
    refuted_only_by(&out, &json, "restore-store-outside");
    let steps = step_texts(&json);
    assert!(
        steps
            .iter()
            .any(|s| s.contains("kubectl create talosoperation")),
        "{steps:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let (out, json) = verify(&root().join("rules"), "1", &bounds);
    holds(&out, &json);
    let never = json["coverage"]["rules_never_fired"].to_string();
    assert!(!never.contains("\"restore-store-in-cluster\""), "{never}");
}

/// Issue 36: with a TalosEtcdBackup in the model (`--backups`: no snapshot at first, then
/// taken and ageing at any time), an upgrade, reset or rollback of a control plane starts
/// only with a fresh snapshot. Without `fresh-backup` a stale snapshot lets one start;
/// without `fresh-backup-none-yet`, no snapshot at all does: each is refuted by
/// `fresh-snapshot-before-disruption`, its counterexample naming the backup's snapshot;
/// and an upgrade rolled over the cluster exempted from them is refuted the same way. The
/// shipped rules hold on the same bounds, and the rules fired include both.
#[test]
fn without_the_fresh_backup_rules_disruptive_work_starts_without_a_snapshot() {
    let bounds = [
        "--backups",
        "--max-workers",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "2",
    ];
    for (rule, stale) in [("fresh-backup", true), ("fresh-backup-none-yet", false)] {
        let name = format!("without-{rule}");
        let dir = mutant(&name, "operations.rules", |t| {
            without(t, &format!("rule {rule}\n"))
        });
        let (out, json) = verify(&dir, "3", &bounds);
        assert_eq!(out.code, 1, "{name}: {}", out.stdout);
        assert_eq!(
            violated(&json),
            vec!["fresh-snapshot-before-disruption".to_string()],
            "{name}: {}",
            out.stdout
        );
        let steps = step_texts(&json);
        assert_eq!(
            steps
                .iter()
                .any(|s| s.contains("grows older than the rules allow")),
            stale,
            "{name}: {steps:#?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    // An upgrade rolled over the cluster names no machine, and touches its control planes:
    // `touches_control_plane` without `target == ""` lets it start on a stale snapshot.
    let rolls = [
        "--backups",
        "--rolls",
        "--roll-kind",
        "upgrade",
        "--max-workers",
        "1",
        "--max-operations",
        "1",
        "--max-requests",
        "2",
    ];
    let dir = mutant("fresh-backup-not-for-rolls", "operations.rules", |t| {
        let guard = "(target.controlplane or target.uncounted or target == \"\")";
        assert!(t.contains(guard), "the roll's guard");
        t.replace(guard, "(target.controlplane or target.uncounted)")
    });
    let (out, json) = verify(&dir, "3", &rolls);
    refuted_only_by(&out, &json, "fresh-snapshot-before-disruption");
    let _ = std::fs::remove_dir_all(&dir);
    let (out, json) = verify(&root().join("rules"), "3", &rolls);
    holds(&out, &json);
    let (out, json) = verify(&root().join("rules"), "3", &bounds);
    holds(&out, &json);
    let never = json["coverage"]["rules_never_fired"].to_string();
    assert!(never.starts_with('['), "{}", out.stdout);
    assert!(
        !never.contains("\"fresh-backup\"") && !never.contains("\"fresh-backup-none-yet\""),
        "{never}"
    );
}
