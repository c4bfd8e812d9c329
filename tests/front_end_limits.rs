//! Rule edits can never crash, exhaust or silently weaken the front end (issue 10 §1): deep
//! nesting, exponential `let`s, lines past what the renderer lays out, analyses that
//! would give up, and the time `check` takes on large files. Every case goes through the
//! command line (`check`, `table`, `eval`) as a user runs it, and the nesting cases also
//! through `ruleset::build` on a small stack, as a server's reload calls it.

use ichor_rules::diagnostics::SourceFile;
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
    assert!(
        !out.stderr.contains("panicked") && !out.stderr.contains("overflow"),
        "the binary crashed: {}",
        out.stderr
    );
    out
}

/// A scratch folder holding one rule file with `text`.
fn rules_dir(name: &str, text: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("limits-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(dir.join("x.rules"), text).expect("write rules");
    dir
}

/// `check`, `table` and `eval` on a rule folder.
fn every_entry_point(dir: &Path) -> [Out; 3] {
    let d = dir.to_str().expect("utf-8 path");
    [
        run(&["check", d]),
        run(&["table", d]),
        run(&[
            "eval",
            "--rules",
            d,
            "--objects",
            "tests/fixtures/objects-stream.yaml",
            "--review",
            "tests/fixtures/review-delete-cp1-refused.json",
        ]),
    ]
}

/// `check` and `table` exit 1 on rules with errors; `eval` exits 2 (its rules are bad
/// input), all three with the diagnostic.
const EXITS: [i32; 3] = [1, 1, 2];

fn assert_refused_everywhere(name: &str, text: &str, code: &str, words: &str) {
    let dir = rules_dir(name, text);
    for ((what, out), exit) in ["check", "table", "eval"]
        .iter()
        .zip(every_entry_point(&dir))
        .zip(EXITS)
    {
        assert_eq!(
            out.code, exit,
            "{what} {name}: {}{}",
            out.stdout, out.stderr
        );
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(all.contains(code), "{what} {name}: {all}");
        assert!(all.contains(words), "{what} {name}: {all}");
    }
}

/// `( "x)" == machine or ( "x)" == machine or … true ) … )`: the quotes hide every `)`
/// from a count of bytes.
fn hidden_nesting(levels: usize) -> String {
    let mut s = String::from("true");
    for _ in 0..levels {
        s = format!("( \"x)\" == machine or {s} )");
    }
    format!("rule r\n  refuse remove controlplane\n  when {s}\n  say \"x\"\n")
}

#[test]
fn nesting_hidden_in_strings_is_an_error_in_every_entry_point() {
    for levels in [65, 2_000, 5_000] {
        assert_refused_everywhere(
            &format!("hidden-{levels}"),
            &hidden_nesting(levels),
            "ichor::syntax::too_complex",
            "nests deeper than 64 levels",
        );
    }
}

#[test]
fn placeholders_and_prefix_operators_count_as_nesting() {
    let mut s = String::from("1");
    for _ in 0..3_000 {
        s = format!("\"a{{{s}}}\" == machine");
    }
    let placeholders = format!("rule r\n  refuse remove controlplane\n  say \"{{{s}}}\"\n");
    assert_refused_everywhere(
        "placeholders",
        &placeholders,
        "ichor::syntax::too_complex",
        "nests deeper",
    );
    let nots = format!(
        "rule r\n  refuse remove controlplane\n  when {}true\n  say \"x\"\n",
        "not ".repeat(3_000)
    );
    assert_refused_everywhere("nots", &nots, "ichor::syntax::too_complex", "nests deeper");
    let negs = format!(
        "rule r\n  refuse remove controlplane\n  when {}1 > 0\n  say \"x\"\n",
        "- ".repeat(3_000)
    );
    assert_refused_everywhere("negs", &negs, "ichor::syntax::too_complex", "nests deeper");
}

#[test]
fn parentheses_in_comments_and_strings_are_text() {
    let text = format!(
        "# {}\nrule r\n  refuse remove controlplane\n  when approved > 1 and machine != \"{}\"\n  say \"x (\"\n",
        "(".repeat(65),
        "(".repeat(100)
    );
    let dir = rules_dir("comment", &text);
    let out = run(&["check", dir.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("0 errors"), "{}", out.stdout);
}

#[test]
fn long_chains_are_bounded_in_depth_not_crashed() {
    // Within the nesting limit, a left-leaning chain still builds a deep tree.
    let text = format!(
        "rule r\n  refuse remove controlplane\n  when {}cluster.deleting\n  say \"x\"\n",
        "cluster.deleting or ".repeat(300)
    );
    assert_refused_everywhere(
        "chain",
        &text,
        "ichor::syntax::too_complex",
        "more than 256 operators deep",
    );
    // Deep through `let`s: each is shallow, together they are not.
    let mut lets = String::from("let l0 = approved > 1\n");
    for i in 1..64 {
        lets.push_str(&format!(
            "let l{i} = l{}{}\n",
            i - 1,
            " or approved > 1".repeat(8)
        ));
    }
    lets.push_str("rule r\n  refuse remove controlplane\n  when l63\n  say \"x\"\n");
    assert_refused_everywhere(
        "let-chain",
        &lets,
        "ichor::syntax::too_complex",
        "`l63` nests",
    );
    // `a + (b + (c + ...))` needs one stack slot per level: more than the compiled form has.
    let mut right = String::from("approved");
    for _ in 0..40 {
        right = format!("approved + ({right})");
    }
    let text = format!("rule r\n  refuse remove controlplane\n  when {right} > 1\n  say \"x\"\n");
    assert_refused_everywhere(
        "right-deep",
        &text,
        "ichor::syntax::too_complex",
        "intermediate values",
    );
}

/// The front end runs on its own thread with a known stack, so the deepest input is an
/// error even when `ruleset::build` is called from a thread with a small stack (a tokio
/// worker has 2 MiB; this one has 256 KiB).
#[test]
fn build_on_a_small_stack_never_overflows() {
    let inputs = vec![
        hidden_nesting(64),
        hidden_nesting(5_000),
        format!("let x = {}1{}", "(".repeat(64), ")".repeat(64)),
        format!(
            "rule r\n  refuse remove controlplane\n  when {}cluster.deleting\n  say \"x\"\n",
            "cluster.deleting or ".repeat(256)
        ),
    ];
    let handle = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            inputs
                .into_iter()
                .map(|text| {
                    let set = ichor_rules::ruleset::build(vec![SourceFile::new("x.rules", text)]);
                    let _ =
                        ichor_rules::diagnostics::render_human(&set.diagnostics, &set.files, false);
                    set.diagnostics
                        .iter()
                        .filter(|d| d.is_error())
                        .map(|d| d.code.as_str())
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
        .expect("thread");
    let codes = handle.join().expect("no overflow, no panic");
    assert!(codes[0].is_empty(), "64 levels are fine: {:?}", codes[0]);
    assert_eq!(codes[1], ["ichor::syntax::too_complex"]);
    assert!(
        !codes[2].contains(&"ichor::syntax::too_complex"),
        "{:?}",
        codes[2]
    );
    assert!(
        codes[3].is_empty(),
        "256 operators deep are fine: {:?}",
        codes[3]
    );
}

#[test]
fn exponential_lets_are_an_error_naming_the_let() {
    for depth in [20, 30, 60] {
        let mut text = String::from("let a0 = approved > 1\n");
        for i in 1..depth {
            text.push_str(&format!("let a{i} = a{} and a{}\n", i - 1, i - 1));
        }
        text.push_str(&format!(
            "rule r\n  refuse remove controlplane\n  when a{}\n  say \"x\"\n",
            depth - 1
        ));
        assert_refused_everywhere(
            &format!("lets-{depth}"),
            &text,
            "ichor::syntax::too_complex",
            &format!("`a{}` expands to", depth - 1),
        );
    }
    // The same through a plan step's guard and a message placeholder.
    let mut text = String::from("let a0 = approved > 1\n");
    for i in 1..25 {
        text.push_str(&format!("let a{i} = a{} and a{}\n", i - 1, i - 1));
    }
    text.push_str("plan remove controlplane\n  do lock cluster when a24\n");
    assert_refused_everywhere(
        "lets-plan",
        &text,
        "ichor::syntax::too_complex",
        "`a24` expands",
    );
}

/// Moderately shared `let`s fit one rule, but not a thousand copies of it: the total
/// written out is bounded by the file's size, so memory stays linear in it.
#[test]
fn the_written_out_size_of_a_file_is_bounded_by_its_length() {
    let mut text = String::from("let a0 = approved > 1\n");
    for i in 1..13 {
        text.push_str(&format!("let a{i} = a{} and a{}\n", i - 1, i - 1));
    }
    for r in 0..200 {
        text.push_str(&format!(
            "rule r{r}\n  refuse remove controlplane\n  when a12 and machine != \"m{r}\"\n  say \"x\"\n"
        ));
    }
    let dir = rules_dir("budget", &text);
    let out = run(&["check", dir.to_str().unwrap(), "--format", "json"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    let errors: Vec<&serde_json::Value> = v["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .filter(|d| d["severity"] == "error")
        .collect();
    assert_eq!(errors.len(), 1, "reported once: {errors:#?}");
    assert_eq!(errors[0]["code"], "ichor::syntax::too_complex");
    let message = errors[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`a12` expands past the file's budget"),
        "{message}"
    );
}

#[test]
fn diagnostics_past_column_65535_render_plainly() {
    let text = format!(
        "rule r refuse remove controlplane when{}aproved > 1 say \"x\"\n",
        " ".repeat(70_000)
    );
    let dir = rules_dir("wide", &text);
    for ((what, out), exit) in ["check", "table", "eval"]
        .iter()
        .zip(every_entry_point(&dir))
        .zip(EXITS)
    {
        assert_eq!(out.code, exit, "{what}: {}{}", out.stdout, out.stderr);
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(
            all.contains("unknown fact or definition `aproved`"),
            "{what}: {all}"
        );
        assert!(all.contains("x.rules:1:70039"), "{what}: {all}");
        assert!(all.contains("not shown"), "{what}: {all}");
        assert!(all.contains("did you mean `approved`?"), "{what}: {all}");
    }
}

/// `check --format json` on one rule file: exit code and diagnostics (code, message).
fn check_json(name: &str, text: &str) -> (i32, Vec<(String, String, String)>) {
    let dir = rules_dir(name, text);
    let out = run(&["check", dir.to_str().unwrap(), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    let diags = v["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .map(|d| {
            let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
            (s("severity"), s("code"), s("message"))
        })
        .filter(|(_, code, _)| code != "ichor::lint::uncovered_event")
        .collect();
    (out.code, diags)
}

const MANY_FACTS: &str = "approved * workers >= 0 and schedulable and cluster.exists
       and not cluster.deleting and not transitioning and not deleting and allow_delete
       and not node.unreachable and not member.dead and machine != \"x\"";

#[test]
fn a_rule_outside_the_exact_analysis_is_still_checked_for_arithmetic() {
    let text = format!(
        "rule big\n  refuse remove controlplane\n  when approved * 100 / count < 100 and {MANY_FACTS}\n  say \"x\"\n"
    );
    let (code, diags) = check_json("many-facts", &text);
    assert_eq!(code, 1, "{diags:#?}");
    assert!(
        diags.iter().any(|(s, c, m)| s == "error"
            && c == "ichor::check::arithmetic"
            && m == "`big` can fail with division by zero"),
        "{diags:#?}"
    );
    // Guarded, in the condition and for the message: no error, and still a word about
    // what was not analysed.
    let text = format!(
        "rule big\n  refuse remove controlplane\n  when count > 0 and approved * 100 / count < 100 and {MANY_FACTS}\n  say \"{{approved * 100 / count}}%\"\n"
    );
    let (code, diags) = check_json("many-facts-guarded", &text);
    assert_eq!(code, 0, "{diags:#?}");
    assert!(
        diags
            .iter()
            .any(|(_, c, m)| c == "ichor::lint::not_analysed" && m.contains("`big`")),
        "{diags:#?}"
    );
    // The message is checked where the rule fires, also by ranges.
    let text = format!(
        "rule big\n  refuse remove controlplane\n  when {MANY_FACTS}\n  say \"{{approved * 100 / count}}%\"\n"
    );
    let (code, diags) = check_json("many-facts-message", &text);
    assert_eq!(code, 1, "{diags:#?}");
    assert!(
        diags.iter().any(|(_, c, m)| c == "ichor::check::arithmetic"
            && m == "the message of `big` can fail with division by zero"),
        "{diags:#?}"
    );
}

#[test]
fn plan_steps_are_checked_for_arithmetic() {
    let (code, diags) = check_json(
        "step-guard",
        "plan remove controlplane\n  do lock cluster\n  do drain node when workers / (approved - 1) >= 1\n",
    );
    assert_eq!(code, 1, "{diags:#?}");
    assert!(
        diags.iter().any(|(_, c, m)| c == "ichor::check::arithmetic"
            && m == "the guard of step `drain node` in `plan remove controlplane` can fail with division by zero"),
        "{diags:#?}"
    );
    let (code, diags) = check_json(
        "step-message",
        "plan remove controlplane\n  do event warning DeadMemberRemoved when member.dead say \"{workers / (approved - 1)}\"\n",
    );
    assert_eq!(code, 1, "{diags:#?}");
    assert!(
        diags.iter().any(|(_, c, m)| c == "ichor::check::arithmetic"
            && m.starts_with("the message of step `event warning DeadMemberRemoved`")),
        "{diags:#?}"
    );
    // Guarded: the message runs only where the guard holds.
    let (code, diags) = check_json(
        "step-guarded",
        "plan remove controlplane\n  do lock cluster\n  do event warning DeadMemberRemoved when approved > 1 say \"{workers / (approved - 1)}\"\n  do drain node unless approved < 2 or workers / (approved - 1) >= 1\n",
    );
    assert_eq!(code, 0, "{diags:#?}");
}

#[test]
fn a_plan_for_a_verb_group_is_an_error() {
    let (code, diags) = check_json("plan-leave", "plan leave controlplane\n  do lock cluster\n");
    assert_eq!(code, 1, "{diags:#?}");
    assert!(
        diags.iter().any(|(_, c, m)| c == "ichor::check::plan_group"
            && m == "a plan is for one verb, not the group `leave`"),
        "{diags:#?}"
    );
}

/// The fastest of three runs, in seconds.
fn fastest(mut f: impl FnMut()) -> f64 {
    (0..3)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Rendering 4 times as many diagnostics of a 4 times larger file takes about 4 times as
/// long, not 16 (miette used to rescan the file from its start for each one). Ratios of the
/// fastest of three runs, with a margin a noisy machine cannot cross: linear is 4, the old
/// quadratic rendering was 16 and more.
#[test]
fn rendering_diagnostics_is_linear() {
    let set = |n: usize| {
        let text: String = (0..n)
            .map(|i| format!("let unused{i} = approved + {i}\n"))
            .collect();
        ichor_rules::ruleset::build(vec![SourceFile::new("x.rules", text)])
    };
    let (small, large) = (set(1_000), set(4_000));
    assert!(small.warnings() >= 1_000 && large.warnings() >= 4_000);
    let render = |s: &ichor_rules::ruleset::RuleSet| {
        std::hint::black_box(ichor_rules::diagnostics::render_human(
            &s.diagnostics,
            &s.files,
            false,
        ));
    };
    let (t1, t4) = (fastest(|| render(&small)), fastest(|| render(&large)));
    assert!(
        t4 < 10.0 * t1 + 0.05,
        "4x the diagnostics took {:.1}x as long ({t1:.3}s -> {t4:.3}s)",
        t4 / t1
    );
}

/// A file that is not UTF-8 is bad input: exit 2, the file named, in both formats.
#[test]
fn a_rule_file_that_is_not_utf8_is_bad_input() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("limits-not-utf8");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(
        dir.join("x.rules"),
        b"rule r refuse remove controlplane when approved > 1 say \"x\xff\xfe\"\n",
    )
    .expect("write");
    let d = dir.to_str().unwrap();
    let out = run(&["check", d]);
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("x.rules"), "{}", out.stderr);
    assert!(out.stderr.contains("UTF-8"), "{}", out.stderr);
    let out = run(&["check", d, "--format", "json"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(v["diagnostics"][0]["code"], "ichor::input::unreadable");
    assert_eq!(run(&["table", d]).code, 2);
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Pieces of hostile rule files: deep nesting of every kind, doubling `let`s, lines
    /// past 65,535 columns, NUL bytes, invalid UTF-8, and ordinary statements between them.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"rule r refuse remove controlplane when approved > 1 say \"x {approved}\"\n".to_vec()),
            Just(b"plan remove controlplane do lock cluster do drain node when workers / (approved - 1) > 0\n".to_vec()),
            Just(b"let a = approved * 100 / count\n".to_vec()),
            (1usize..3_000, 0usize..6).prop_map(|(n, kind)| {
                let (open, close): (&str, &str) = match kind {
                    0 => ("(", ")"),
                    1 => ("( \"x)\" == machine or ", " )"),
                    2 => ("not ", ""),
                    3 => ("- ", ""),
                    4 => ("\"{", "}\""),
                    _ => ("# (", "\n"),
                };
                format!("let d = {}true{}\n", open.repeat(n), close.repeat(n)).into_bytes()
            }),
            (1usize..40).prop_map(|d| {
                let mut s = String::from("let a0 = approved > 1\n");
                for i in 1..d {
                    s.push_str(&format!("let a{i} = a{} and a{}\n", i - 1, i - 1));
                }
                s.push_str(&format!(
                    "rule big refuse remove controlplane when a{} say \"x\"\n",
                    d - 1
                ));
                s.into_bytes()
            }),
            (60_000usize..80_000).prop_map(|n| format!(
                "rule w refuse remove controlplane when{}aproved > 1 say \"x\"\n",
                " ".repeat(n)
            )
            .into_bytes()),
            Just(b"rule n\0 refuse remove worker when\0 approved > 1 say \"\0\"\n".to_vec()),
            Just(vec![0xff, 0xfe, b'\n']),
            Just(vec![b'"', 0xc3, b'"', b'\n']),
            proptest::collection::vec(any::<u8>(), 0..64),
        ]
    }

    proptest! {
        // Each case runs the binary twice: few cases, bounded time in CI.
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn hostile_rule_files_exit_0_1_or_2(pieces in proptest::collection::vec(piece(), 1..5)) {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("limits-fuzz");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("scratch dir");
            std::fs::write(dir.join("x.rules"), pieces.concat()).expect("write");
            let d = dir.to_str().expect("utf-8 path");
            for args in [vec!["check", d], vec!["check", d, "--format", "json"], vec!["table", d]] {
                // `run` fails on a panic or a stack overflow in the output.
                let out = run(&args);
                prop_assert!(
                    [0, 1, 2].contains(&out.code),
                    "{args:?} exited {} (a signal is -1): {}",
                    out.code,
                    out.stderr
                );
            }
        }
    }
}
