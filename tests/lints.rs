//! The lints never claim what a real cluster can contradict: the user's two examples from
//! issue 14, through the CLI as a user runs it (`check --deny-warnings`, then `eval` with
//! more workers than the old lint domains held).

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ichor-rules");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Out {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(root())
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The shipped rules plus `extra`, in a fresh folder; the shipped `allow approve worker`
/// goes, since `extra` constrains that event.
fn rules_with(name: &str, extra: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ichor-lints-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    for entry in std::fs::read_dir(root().join("rules")).expect("rules/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|x| x == "rules") {
            let text = std::fs::read_to_string(&path).expect("read");
            let text: Vec<&str> = text
                .lines()
                .filter(|l| l.trim() != "allow approve worker")
                .collect();
            std::fs::write(dir.join(path.file_name().expect("name")), text.join("\n"))
                .expect("write");
        }
    }
    std::fs::write(dir.join("extra.rules"), extra).expect("write");
    dir
}

/// A cluster of three control planes and `workers` approved workers, plus one pending.
fn objects(dir: &Path, workers: usize) -> PathBuf {
    let mut text = String::from(
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosCluster\nmetadata: {name: c, namespace: ns}\nspec:\n  controlPlane: {count: 3}\n  schedulable: \"true\"\n",
    );
    let machine = |name: &str, role: &str, approved: bool| {
        format!(
            "---\napiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata: {{name: {name}, namespace: ns, creationTimestamp: \"2026-10-01T00:00:00Z\"}}\nspec:\n  clusterRef: {{name: c}}\n  role: {role}\n  approved: {approved}\n  endpoint: 10.0.0.1:50000\n"
        )
    };
    for i in 1..=3 {
        text.push_str(&machine(&format!("cp{i}"), "controlplane", true));
    }
    for i in 1..=workers {
        text.push_str(&machine(&format!("w{i}"), "worker", true));
    }
    text.push_str(&machine("pending", "worker", false));
    let path = dir.join("objects.yaml");
    std::fs::write(&path, text).expect("write");
    path
}

#[test]
fn a_threshold_past_small_counts_is_not_never_true_and_does_refuse() {
    let dir = rules_with(
        "cap-ten",
        "rule worker-cap\n  refuse approve worker\n  when workers >= 10\n  say \"at most ten workers ({workers} now)\"\n",
    );
    let d = dir.to_str().expect("utf-8");
    let out = run(&["check", d, "--deny-warnings"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(!out.stdout.contains("never"), "{}", out.stdout);
    // What `check` did not claim is real: with 12 workers, approving one more is refused.
    let many = objects(&dir, 12);
    let out = run(&[
        "eval",
        "--rules",
        d,
        "--objects",
        many.to_str().expect("utf-8"),
        "--approve",
        "talosmachine/ns/pending",
    ]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["response"]["allowed"], false, "{}", out.stdout);
    assert!(
        out.stdout.contains("at most ten workers (12 now)"),
        "{}",
        out.stdout
    );
    // And with 9, it is not.
    let few = objects(&dir, 9);
    let out = run(&[
        "eval",
        "--rules",
        d,
        "--objects",
        few.to_str().expect("utf-8"),
        "--approve",
        "talosmachine/ns/pending",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["response"]["allowed"], true, "{}", out.stdout);
}

#[test]
fn an_exact_count_does_not_subsume_a_cap_but_the_reverse_is_said() {
    let dir = rules_with(
        "exactly-four",
        "rule worker-exactly-four\n  refuse approve worker\n  when workers == 4\n  say \"four\"\n\n\
         rule worker-cap\n  refuse approve worker\n  when workers >= 4\n  say \"at most four\"\n",
    );
    let out = run(&["check", dir.to_str().expect("utf-8"), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    let subsumed: Vec<&str> = v["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .filter(|d| d["code"] == "ichor::lint::subsumed")
        .filter_map(|d| d["message"].as_str())
        .collect();
    assert_eq!(
        subsumed,
        vec![
            "`worker-exactly-four` is subsumed by `worker-cap`: whenever it would refuse, `worker-cap` does too"
        ],
        "{}",
        out.stdout
    );
}

#[test]
fn a_can_fail_claim_names_values_past_the_old_domains() {
    // Divides by zero only at 10 workers: the old lint domains (0..4) never saw it.
    let dir = rules_with(
        "zero-at-ten",
        "rule spread\n  warn approve worker\n  when approved / (workers - 10) > 1\n  say \"spread\"\n",
    );
    let out = run(&["check", dir.to_str().expect("utf-8")]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("`spread` can fail with division by zero"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("workers = 10"), "{}", out.stdout);
}
