//! `ichor-rules fmt`, run as the built binary: the shipped rules are formatted, `--check`
//! exits 1 with a diff, formatting keeps every comment, and (a property test over generated
//! rule sets laid out at random, with comments anywhere a comment can go) the formatted
//! text formats to itself and compiles to the same table as the original.

use proptest::prelude::*;
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
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    out
}

fn dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fmt-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    d
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn the_shipped_rules_are_formatted() {
    let out = run(&["fmt", "--check", "rules/"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(out.stdout, "");
    let out = run(&["fmt", "--check", "charts/ichor-rules/rules/"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
}

const MESSY: &str = "# the header\n\nlet   a=approved-1 # left after\nlet quorum =approved/2+1\nrule   q refuse remove,unapprove controlplane   when a<quorum and not(cluster.deleting)\n  # why there is an exception\n  unless -1>a reason   RemovalRefused say \"x {a}\"\n \"y\"\nallow approve worker\n# the end\n";

#[test]
fn check_exits_1_with_a_diff_and_fmt_rewrites_keeping_comments() {
    let d = dir("check");
    let file = d.join("messy.rules");
    std::fs::write(&file, MESSY).expect("write");
    let out = run(&["fmt", "--check", s(&file)]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains(&format!("--- {}", s(&file))),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("-let   a=approved-1 # left after"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("+let a      = approved - 1  # left after"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("1 of 1 files are not formatted"),
        "{}",
        out.stdout
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        MESSY,
        "--check changes nothing"
    );
    let out = run(&["fmt", s(&file)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("formatted"), "{}", out.stdout);
    let formatted = std::fs::read_to_string(&file).expect("read");
    assert_eq!(
        formatted,
        "# the header\n\nlet a      = approved - 1  # left after\nlet quorum = approved / 2 + 1\n\nrule q\n  refuse remove, unapprove controlplane\n  when a < quorum and not (cluster.deleting)\n  # why there is an exception\n  unless -1 > a\n  reason RemovalRefused\n  say \"x {a}\"\n      \"y\"\n\nallow approve worker\n# the end\n"
    );
    let out = run(&["fmt", "--check", s(&file)]);
    assert_eq!(out.code, 0, "{}", out.stdout);
}

#[test]
fn a_file_that_does_not_parse_is_exit_2_and_left_alone() {
    let d = dir("broken");
    let file = d.join("broken.rules");
    std::fs::write(&file, "rule r refuse\n").expect("write");
    let out = run(&["fmt", s(&file)]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("does not parse"), "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "rule r refuse\n"
    );
    let out = run(&["fmt", "no/such/rules"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("no/such/rules"), "{}", out.stderr);
}

// ---------------------------------------------------------------------------------------
// Generated rule sets.
// ---------------------------------------------------------------------------------------

/// A token or a place where layout may go.
#[derive(Clone, Debug)]
enum Piece {
    Tok(String),
    /// Between two tokens: any whitespace (and, maybe, a comment).
    Gap,
}

fn int_fact() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["approved", "workers", "count"])
}

fn operand() -> impl Strategy<Value = Vec<Piece>> {
    prop_oneof![
        int_fact().prop_map(|f| vec![Piece::Tok(f.into())]),
        (0u8..9).prop_map(|n| vec![Piece::Tok(n.to_string())]),
        (int_fact(), prop::sample::select(vec!["+", "-"]), 0u8..4).prop_map(|(f, op, n)| vec![
            Piece::Tok(f.into()),
            Piece::Gap,
            Piece::Tok(op.into()),
            Piece::Gap,
            Piece::Tok(n.to_string()),
        ]),
        (int_fact(), 0u8..4).prop_map(|(f, n)| vec![
            Piece::Tok("-".into()),
            Piece::Tok(n.to_string()),
            Piece::Gap,
            Piece::Tok("+".into()),
            Piece::Gap,
            Piece::Tok(f.into()),
        ]),
    ]
}

fn comparison() -> impl Strategy<Value = Vec<Piece>> {
    prop_oneof![
        (
            operand(),
            prop::sample::select(vec!["<", "<=", ">", ">=", "==", "!="]),
            operand()
        )
            .prop_map(|(mut a, op, b)| {
                a.extend([Piece::Gap, Piece::Tok(op.into()), Piece::Gap]);
                a.extend(b);
                a
            }),
        prop::sample::select(vec!["schedulable", "cluster.exists", "cluster.deleting"])
            .prop_map(|b| vec![Piece::Tok(b.into())]),
    ]
}

fn condition() -> impl Strategy<Value = Vec<Piece>> {
    let leaf = comparison();
    leaf.prop_recursive(3, 12, 2, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(vec!["and", "or"]),
                inner.clone()
            )
                .prop_map(|(mut a, op, b)| {
                    a.extend([Piece::Gap, Piece::Tok(op.into()), Piece::Gap]);
                    a.extend(b);
                    a
                }),
            inner.clone().prop_map(|a| {
                let mut v = vec![Piece::Tok("not".into()), Piece::Gap, Piece::Tok("(".into())];
                v.push(Piece::Gap);
                v.extend(a);
                v.extend([Piece::Gap, Piece::Tok(")".into())]);
                v
            }),
        ]
    })
}

fn message() -> impl Strategy<Value = Vec<Piece>> {
    prop::collection::vec(
        prop::sample::select(vec![
            "\"refused at {approved}\"",
            "\"with {count + 1} # not a comment\"",
            "\"{{braces}} and \\\"quotes\\\"\"",
            "\"plain\"",
        ]),
        1..4,
    )
    .prop_map(|strings| {
        let mut v = vec![Piece::Tok("say".into())];
        for s in strings {
            v.push(Piece::Gap);
            v.push(Piece::Tok(s.into()));
        }
        v
    })
}

/// One statement: a `let`, a rule, an `allow` or a plan.
fn statement(n: usize) -> impl Strategy<Value = Vec<Piece>> {
    let name = format!("r{n}");
    let let_name = format!("l{n}");
    let rule = (
        prop::sample::select(vec![
            "refuse remove controlplane",
            "refuse unapprove , reassign controlplane",
            "warn approve controlplane",
            "refuse remove worker at webhook",
            "refuse unschedule cluster",
        ]),
        prop::option::of(condition()),
        prop::option::of(condition()),
        any::<bool>(),
        message(),
    )
        .prop_map(move |(head, when, unless, reason, say)| {
            let mut v = vec![
                Piece::Tok("rule".into()),
                Piece::Gap,
                Piece::Tok(name.clone()),
            ];
            for w in head.split(' ') {
                v.push(Piece::Gap);
                v.push(Piece::Tok(w.into()));
            }
            for (kw, e) in [("when", when), ("unless", unless)] {
                if let Some(e) = e {
                    v.extend([Piece::Gap, Piece::Tok(kw.into()), Piece::Gap]);
                    v.extend(e);
                }
            }
            if reason {
                v.extend([
                    Piece::Gap,
                    Piece::Tok("reason".into()),
                    Piece::Gap,
                    Piece::Tok("SomeReason".into()),
                ]);
            }
            v.push(Piece::Gap);
            v.extend(say);
            v
        });
    let let_def = operand().prop_map(move |e| {
        let mut v = vec![
            Piece::Tok("let".into()),
            Piece::Gap,
            Piece::Tok(let_name.clone()),
            Piece::Gap,
            Piece::Tok("=".into()),
            Piece::Gap,
        ];
        v.extend(e);
        v
    });
    prop_oneof![4 => rule, 2 => let_def]
}

fn rule_set() -> impl Strategy<Value = Vec<Piece>> {
    (1usize..7)
        .prop_flat_map(|k| (0..k).map(statement).collect::<Vec<_>>())
        .prop_map(|stmts| {
            let mut v = Vec::new();
            for s in stmts {
                v.push(Piece::Gap);
                v.extend(s);
            }
            v.push(Piece::Gap);
            v
        })
}

/// Lays the pieces out: each gap becomes one of several layouts, some with a comment.
fn layout(pieces: &[Piece], choices: &[u8]) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut comments = Vec::new();
    let mut c = choices.iter().cycle();
    for (i, p) in pieces.iter().enumerate() {
        match p {
            Piece::Tok(t) => out.push_str(t),
            Piece::Gap => {
                let choice = *c.next().unwrap_or(&0) % 9;
                // A token followed by no gap (`-1`) is written tight.
                match choice {
                    0..=2 => out.push(' '),
                    3 => out.push_str("   "),
                    4 => out.push('\n'),
                    5 => out.push_str("\n\n  "),
                    6 => out.push_str("\t \n "),
                    7 => {
                        let text = format!("# comment {i} after");
                        out.push_str(&format!(" {text}\n"));
                        comments.push(text);
                    }
                    _ => {
                        let text = format!("# comment {i} on its line");
                        out.push_str(&format!("\n{text}\n"));
                        comments.push(text);
                    }
                }
            }
        }
    }
    (out, comments)
}

/// `table --format json` of one rule file, with source lines left out (formatting moves
/// them; nothing else may change).
fn table(file: &Path) -> Value {
    let out = run(&["table", "--format", "json", s(file)]);
    assert!(
        out.code == 0 || out.code == 1,
        "{}{}",
        out.stdout,
        out.stderr
    );
    let mut v: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("table JSON ({e}): {}{}", out.stdout, out.stderr));
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("line");
                m.remove("file");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn formatting_is_idempotent_keeps_comments_and_meaning(
        pieces in rule_set(),
        choices in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let (text, comments) = layout(&pieces, &choices);
        let d = dir("prop");
        let original = d.join("original.rules");
        std::fs::write(&original, &text).expect("write");
        let check = run(&["check", s(&original)]);
        prop_assert!(check.code == 0 || check.code == 1, "{}{}", check.stdout, check.stderr);
        let formatted = d.join("formatted.rules");
        std::fs::write(&formatted, &text).expect("write");
        let out = run(&["fmt", s(&formatted)]);
        prop_assert_eq!(out.code, 0, "{}\n{}", text, out.stderr);
        let once = std::fs::read_to_string(&formatted).expect("read");
        for c in &comments {
            prop_assert!(once.contains(c.as_str()), "{c:?} lost:\n{text}\n---\n{once}");
        }
        let again = run(&["fmt", "--check", s(&formatted)]);
        prop_assert_eq!(again.code, 0, "not idempotent:\n{}\n---\n{}\n{}", text, once, again.stdout);
        prop_assert_eq!(table(&original), table(&formatted), "{}\n---\n{}", text, once);
        // The same statements laid out differently, without comments, format alike.
        let (plain_a, _) = layout(&pieces, &[0]);
        let (plain_b, _) = layout(&pieces, &choices.iter().map(|c| c % 7).filter(|c| *c != 5).collect::<Vec<_>>());
        let a = d.join("a.rules");
        let b = d.join("b.rules");
        std::fs::write(&a, &plain_a).expect("write");
        std::fs::write(&b, &plain_b).expect("write");
        prop_assert_eq!(run(&["fmt", s(&a)]).code, 0);
        prop_assert_eq!(run(&["fmt", s(&b)]).code, 0);
        prop_assert_eq!(
            std::fs::read_to_string(&a).expect("read"),
            std::fs::read_to_string(&b).expect("read"),
            "one canonical layout"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Line endings and bare comments.
// ---------------------------------------------------------------------------------------

/// Issue 33: a bare `#` line between two statements of a CRLF file was kept hugging the
/// next statement, which, read back with LF endings, counted as a blank line: the second
/// `fmt` changed the file again, so `fmt` then `fmt --check` exited 1.
#[test]
fn a_crlf_file_with_a_bare_comment_line_formats_once_and_for_all() {
    let d = dir("crlf-bare");
    let rules = "rule a\r\n  refuse remove machine\r\n  when true\r\n#\r\nrule b\r\n  refuse remove machine\r\n  when true\r\n";
    for (name, text) in [
        ("bare.rules", rules.to_string()),
        ("spaces.rules", rules.replace("#\r\n", "#   \r\n")),
        ("lf.rules", rules.replace("\r\n", "\n")),
    ] {
        let file = d.join(name);
        std::fs::write(&file, &text).expect("write");
        let out = run(&["fmt", s(&file)]);
        assert_eq!(out.code, 0, "{name}: {}", out.stderr);
        let once = std::fs::read_to_string(&file).expect("read");
        assert_eq!(
            once,
            "rule a\n  refuse remove machine\n  when true\n#\nrule b\n  refuse remove machine\n  when true\n",
            "{name}"
        );
        let again = run(&["fmt", "--check", s(&file)]);
        assert_eq!(again.code, 0, "{name}: not idempotent:\n{}", again.stdout);
    }
}

/// Lays the pieces out with comments that are only `#` (maybe followed by spaces), comment
/// blocks holding a bare `#` line, blank lines around them, and LF or CRLF endings.
fn layout_bare(pieces: &[Piece], choices: &[u8], crlf: bool) -> String {
    let mut out = String::new();
    let mut c = choices.iter().cycle();
    for (i, p) in pieces.iter().enumerate() {
        match p {
            Piece::Tok(t) => out.push_str(t),
            Piece::Gap => out.push_str(&match *c.next().unwrap_or(&0) % 12 {
                0 => " ".to_string(),
                1 => "\n".to_string(),
                2 => "\n\n".to_string(),
                3 => " #\n".to_string(),
                4 => "\n#\n".to_string(),
                5 => "\n#   \n".to_string(),
                6 => "\n\n#\n\n".to_string(),
                7 => format!(" # c{i}\n"),
                8 => format!("\n# c{i}\n#\n# d{i}\n"),
                9 => format!("\n\n# c{i}\n\n"),
                10 => "\n#\n\n".to_string(),
                _ => " #   \n".to_string(),
            }),
        }
    }
    if crlf {
        out = out.replace('\n', "\r\n");
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// fmt(fmt(x)) == fmt(x) with bare comments anywhere, and a CRLF file formats as the
    /// same file with LF endings does.
    #[test]
    fn formatting_bare_comments_and_crlf_is_idempotent(
        pieces in rule_set(),
        choices in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let d = dir("prop-bare");
        let mut formatted = Vec::new();
        for crlf in [false, true] {
            let text = layout_bare(&pieces, &choices, crlf);
            let file = d.join(if crlf { "crlf.rules" } else { "lf.rules" });
            std::fs::write(&file, &text).expect("write");
            let out = run(&["fmt", s(&file)]);
            prop_assert_eq!(out.code, 0, "{:?}\n{}", text, out.stderr);
            let once = std::fs::read_to_string(&file).expect("read");
            let again = run(&["fmt", "--check", s(&file)]);
            prop_assert_eq!(again.code, 0, "not idempotent:\n{:?}\n---\n{}\n{}", text, once, again.stdout);
            formatted.push(once);
        }
        prop_assert_eq!(&formatted[0], &formatted[1], "CRLF formats as LF does");
    }
}
