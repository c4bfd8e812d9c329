//! Bad input never panics: arbitrary text through the whole front end, and arbitrary JSON
//! through the AdmissionReview path.

use ichor_rules::diagnostics::SourceFile;
use proptest::prelude::*;

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("rule r ".to_string()),
        Just("let a = ".to_string()),
        Just("refuse remove controlplane ".to_string()),
        Just("hold apply controlplane ".to_string()),
        Just("when ".to_string()),
        Just("unless ".to_string()),
        Just("say \"x {approved} y\" ".to_string()),
        Just("reason R ".to_string()),
        Just("plan remove controlplane do lock cluster ".to_string()),
        Just("allow approve worker ".to_string()),
        Just("approved ".to_string()),
        Just("count / 0 ".to_string()),
        Just("a ".to_string()),
        Just("( ".to_string()),
        Just(") ".to_string()),
        Just("and not ".to_string()),
        Just("== \"reset\" ".to_string()),
        Just("9223372036854775807 + 1 ".to_string()),
        Just("{ ".to_string()),
        Just("\" ".to_string()),
        Just("# c\n".to_string()),
        "[ -~\n]{0,8}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_front_end_never_panics(tokens in proptest::collection::vec(token(), 0..40)) {
        let text: String = tokens.concat();
        let set = ichor_rules::ruleset::build(vec![SourceFile::new("fuzz.rules", text)]);
        // Rendering must not panic either.
        let _ = ichor_rules::diagnostics::render_human(&set.diagnostics, &set.files, false);
        let _ = ichor_rules::diagnostics::to_json(&set.diagnostics, &set.files);
    }

    #[test]
    fn reviews_never_panic(body in "[ -~]{0,200}") {
        let _ = ichor_rules::runtime::admission::parse_review(body.as_bytes());
    }
}

#[test]
fn reviews_with_wrong_shapes_are_errors() {
    for body in [
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":1}}"#,
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"ichor.maesh.dev","version":"v1alpha1","kind":"TalosMachine"},"resource":{"group":"ichor.maesh.dev","version":"v1alpha1","resource":"talosmachines"},"operation":"CREATE","userInfo":{},"object":{"apiVersion":"ichor.maesh.dev/v1alpha1","kind":"TalosMachine","metadata":{"name":"m"},"spec":{"role":"boss"}}}}"#,
    ] {
        assert!(
            ichor_rules::runtime::admission::parse_review(body.as_bytes()).is_err(),
            "{body}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Objects files and AdmissionReviews: the fixtures, mutated (pieces inserted, ranges cut,
// slices repeated into deep nesting), through the decoders and the decision, in process
// and as `ichor-rules eval` runs them. Never a panic, never slow, exit codes 0, 1 or 2.
// ---------------------------------------------------------------------------------------

mod decoders {
    use ichor_rules::runtime::admission::{immutable_spec_change, parse_review, respond};
    use ichor_rules::runtime::decide::{
        decide_events, reconcile_machine_event, reconcile_operation_event, reconcile_start_event,
        request_events,
    };
    use ichor_rules::runtime::facts::Expensive;
    use ichor_rules::runtime::objects::load_snapshot;
    use proptest::prelude::*;
    use std::path::PathBuf;
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    const OBJECTS: [&str; 2] = [
        include_str!("fixtures/objects-stream.yaml"),
        include_str!("fixtures/objects-list.yaml"),
    ];
    const REVIEWS: [&str; 3] = [
        include_str!("fixtures/review-delete-cp1-refused.json"),
        include_str!("fixtures/review-approve-cp4-warns.json"),
        include_str!("fixtures/review-delete-w1-allowed.json"),
    ];
    const YAML_PIECES: &[&str] = &[
        "[",
        "{",
        "]",
        "}",
        ": ",
        "- ",
        "\n",
        "\n  ",
        "\n- ",
        "\"",
        "'",
        "#",
        "| ",
        "> ",
        "&a ",
        "*a",
        "!!binary ",
        "!!str ",
        "---\n",
        "...\n",
        "\t",
        "null",
        "~",
        "true",
        "TalosMachin",
        "TalosOperation",
        "v1alpah1",
        "v1",
        "List",
        "namespace: other",
        "namespace: ns",
        "name: cp1",
        "99999999999999999999",
        "-1",
        "controlplane",
        "worker",
        "approved: true",
        "approved: false",
        "deletionTimestamp: \"2026-01-01T00:00:00Z\"",
        "kind: List\nitems:\n",
        "items: null",
        "metadata: {}",
        "\u{0}",
        "é",
        "\r",
        "\u{feff}",
    ];
    const JSON_PIECES: &[&str] = &[
        "[",
        "{",
        "]",
        "}",
        ",",
        ":",
        "\"",
        "\\",
        "\\u0000",
        "\\ud800",
        "null",
        "true",
        "{}",
        "[]",
        "\"TalosCluster\"",
        "\"TalosOperation\"",
        "\"DELETE\"",
        "\"UPDATE\"",
        "\"CREATE\"",
        "\"oldObject\":",
        "\"object\":",
        "\"namespace\":\"other\",",
        "1e999",
        "-0",
        "18446744073709551616",
        "\"v1alpha1\"",
        "\"admission.k8s.io/v1beta1\"",
        "é",
    ];

    /// One edit of a text, at a position given as a fraction of its length.
    #[derive(Clone, Debug)]
    enum Edit {
        Cut {
            at: usize,
            len: usize,
        },
        Insert {
            at: usize,
            piece: &'static str,
        },
        /// Repeats a slice of the text after itself: deep nesting from `[`, `- ` or `{a: `.
        Repeat {
            at: usize,
            len: usize,
            times: usize,
        },
    }

    fn edit(pieces: &'static [&'static str]) -> impl Strategy<Value = Edit> {
        prop_oneof![
            (any::<usize>(), 1..40usize).prop_map(|(at, len)| Edit::Cut { at, len }),
            (any::<usize>(), proptest::sample::select(pieces))
                .prop_map(|(at, piece)| Edit::Insert { at, piece }),
            (any::<usize>(), 1..8usize, 2..600usize).prop_map(|(at, len, times)| Edit::Repeat {
                at,
                len,
                times
            }),
        ]
    }

    fn apply(text: &str, edits: &[Edit]) -> String {
        let mut chars: Vec<char> = text.chars().collect();
        for e in edits {
            let n = chars.len();
            match *e {
                Edit::Cut { at, len } => {
                    let at = at % (n + 1);
                    chars.drain(at..(at + len).min(n));
                }
                Edit::Insert { at, piece } => {
                    let at = at % (n + 1);
                    chars.splice(at..at, piece.chars());
                }
                Edit::Repeat { at, len, times } => {
                    let at = at % (n + 1);
                    let slice: Vec<char> = chars[at..(at + len).min(n)].to_vec();
                    let repeated: Vec<char> = (0..times).flat_map(|_| slice.clone()).collect();
                    chars.splice(at..at, repeated);
                }
            }
        }
        chars.into_iter().collect()
    }

    fn table() -> &'static ichor_rules::compile::Table {
        static TABLE: OnceLock<ichor_rules::ruleset::RuleSet> = OnceLock::new();
        TABLE
            .get_or_init(|| {
                ichor_rules::ruleset::load(&[PathBuf::from("rules")]).expect("the shipped rules")
            })
            .table
            .as_ref()
            .expect("the shipped rules check clean")
    }

    /// What `eval` does with a review and an objects file, in process.
    fn decide(objects: &str, review: &[u8]) {
        let Ok(snapshot) = load_snapshot(objects) else {
            return;
        };
        let table = table();
        for m in &snapshot.machines {
            let events: Vec<_> = reconcile_machine_event(m).into_iter().collect();
            let _ = decide_events(table, &snapshot, &events, Expensive::FromObjects, true);
        }
        for o in &snapshot.operations {
            let events: Vec<_> = reconcile_operation_event(o)
                .into_iter()
                .chain(reconcile_start_event(o))
                .collect();
            let _ = decide_events(table, &snapshot, &events, Expensive::FromObjects, true);
        }
        let Ok(req) = parse_review(review) else {
            return;
        };
        if immutable_spec_change(&req).is_some() {
            return;
        }
        let events = request_events(
            req.operation(),
            &req.namespace,
            req.old.as_ref(),
            req.new.as_ref(),
        );
        let (decision, _) = decide_events(table, &snapshot, &events, Expensive::FromObjects, true);
        let _ = serde_json::to_vec(&respond(&req, &decision));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(384))]

        #[test]
        fn mutated_objects_and_reviews_never_panic_nor_stall(
            o in 0..OBJECTS.len(),
            r in 0..REVIEWS.len(),
            object_edits in proptest::collection::vec(edit(YAML_PIECES), 0..6),
            review_edits in proptest::collection::vec(edit(JSON_PIECES), 0..6),
        ) {
            let objects = apply(OBJECTS[o], &object_edits);
            let review = apply(REVIEWS[r], &review_edits);
            let started = Instant::now();
            decide(&objects, review.as_bytes());
            prop_assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
        }
    }

    proptest! {
        // Each case runs the binary twice: kept small so CI stays fast.
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn eval_exits_0_1_or_2_on_mutated_input(
            o in 0..OBJECTS.len(),
            r in 0..REVIEWS.len(),
            object_edits in proptest::collection::vec(edit(YAML_PIECES), 0..5),
            review_edits in proptest::collection::vec(edit(JSON_PIECES), 0..5),
        ) {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("robust-eval-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("scratch dir");
            let objects = dir.join("objects.yaml");
            let review = dir.join("review.json");
            std::fs::write(&objects, apply(OBJECTS[o], &object_edits)).expect("write");
            std::fs::write(&review, apply(REVIEWS[r], &review_edits)).expect("write");
            for args in [
                vec!["eval", "--objects", objects.to_str().unwrap_or(""), "--review", review.to_str().unwrap_or("")],
                vec!["eval", "--objects", objects.to_str().unwrap_or(""), "--reconcile", "ns/cp1"],
            ] {
                let started = Instant::now();
                let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
                    .args(&args)
                    .env("NO_COLOR", "1")
                    .output()
                    .expect("runs");
                let stderr = String::from_utf8_lossy(&out.stderr);
                prop_assert!(
                    matches!(out.status.code(), Some(0..=2)),
                    "{args:?}: exit {:?}\n{stderr}",
                    out.status.code()
                );
                prop_assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
                prop_assert!(started.elapsed() < Duration::from_secs(5), "{args:?}: took {:?}", started.elapsed());
            }
        }
    }
}

/// A review whose parts contradict each other is bad input, not decided: the object of
/// another kind than the request says, of another namespace, or another name, or an
/// update whose old and new objects are different objects.
#[test]
fn reviews_that_contradict_themselves_are_errors() {
    let machine = |name: &str, ns: &str| {
        serde_json::json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterRef": {"name": "c"}, "role": "controlplane", "approved": true}})
    };
    let review = |op: &str, name: &str, old: serde_json::Value, new: serde_json::Value| {
        serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "name": name, "namespace": "ns", "operation": op,
                "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": "TalosMachine"},
                "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": "talosmachines"},
                "userInfo": {}, "oldObject": old, "object": new}})
    };
    let mut cluster = machine("m", "ns");
    cluster["kind"] = serde_json::json!("TalosCluster");
    for (case, body, says) in [
        (
            "another kind",
            review("CREATE", "m", serde_json::Value::Null, cluster),
            "it is a ichor.maesh.dev/v1alpha1 TalosCluster",
        ),
        (
            "another namespace",
            review(
                "CREATE",
                "m",
                serde_json::Value::Null,
                machine("m", "other"),
            ),
            "metadata.namespace `other`",
        ),
        (
            "another name",
            review("DELETE", "m", machine("x", "ns"), serde_json::Value::Null),
            "`request.name` is `m`",
        ),
        (
            "two objects",
            review("UPDATE", "", machine("a", "ns"), machine("b", "ns")),
            "different objects",
        ),
    ] {
        let err = ichor_rules::runtime::admission::parse_review(body.to_string().as_bytes())
            .err()
            .unwrap_or_else(|| panic!("{case}: accepted"))
            .to_string();
        assert!(err.contains(says), "{case}: {err}");
    }
}
