//! Benchmarks of the front end (parse, check with lints, compile; and what `serve` builds),
//! of one decision on the hot path (the shipped rules, and the two-rule file
//! `benches/two-rules/two.rules`), and of the whole `eval` path from AdmissionReview bytes to
//! response bytes.
//!
//! Targets (issue 39): one decision with its facts at hand <= 50 ns allowed and <= 80 ns
//! refused on the shipped rules, <= 20 / <= 60 ns on the two-rule file, the stack machine
//! within 2x of the flat program; the two-rule file built in <= 150 µs; 1,000 rules parsed,
//! checked and compiled as `serve` does in <= 10 ms. Timings move with the machine's load:
//! `scripts/counts.sh` guards the same decisions by instruction counts, and
//! `scripts/bench-table.sh` writes ARCHITECTURE.md's table from the last run's medians.
//!
//! Run: `cargo bench --bench decide -- --warm-up-time 1 --measurement-time 3`

// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use ichor_rules::check::{CheckResult, check};
use ichor_rules::compile::{Options, Table, compile, compile_with};
use ichor_rules::diagnostics::SourceFile;
use ichor_rules::interp::Session;
use ichor_rules::ruleset::build;
use ichor_rules::runtime::admission::{parse_review, respond};
use ichor_rules::runtime::decide::{decide_events, request_events};
use ichor_rules::runtime::facts::Expensive;
use ichor_rules::runtime::objects::{Snapshot, load_snapshot};
use std::cell::OnceCell;
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::PathBuf;

#[path = "support/fixed.rs"]
mod fixed;
#[path = "support/generated.rs"]
mod generated;
use fixed::{APPROVE_CP, FIVE_OF_THREE, REMOVE_CP, ROOT, THREE_OF_THREE, shipped, two_rules};
use generated::generated;

fn shipped_table() -> Table {
    let set = build(shipped());
    assert_eq!(set.errors(), 0, "the shipped rules check without errors");
    set.table.expect("a table")
}

/// The generated rule set, checked once: it must have no errors and compile to 1,000 rules.
fn generated_checked(distinct: bool) -> (Vec<SourceFile>, CheckResult) {
    let files = vec![generated(1000, distinct)];
    let checked = check(&files);
    let errors: Vec<_> = checked
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .collect();
    assert!(
        errors.is_empty(),
        "generated rules have errors: {errors:#?}"
    );
    assert_eq!(checked.program.rules.len(), 1000);
    let table = compile(&checked.program, &files).expect("compiles");
    assert_eq!(table.rules.len(), 1000);
    eprintln!(
        "generated 1,000 rules{}: {} bytes, {} table rows, {} warnings",
        if distinct { " (distinct)" } else { "" },
        files[0].text.len(),
        table.row_count(),
        checked.diagnostics.len()
    );
    (files, checked)
}

fn front_end(c: &mut Criterion) {
    let files = shipped();
    let mut g = c.benchmark_group("front_end");
    g.bench_function("shipped", |b| {
        b.iter(|| black_box(build(black_box(files.clone()))))
    });
    g.bench_function("check_only", |b| {
        b.iter(|| black_box(check(black_box(&files))))
    });
    // What `serve` does on a load or reload: parse, check (errors and the coverage it
    // refuses on, no other lints) and compile.
    g.bench_function("shipped_serving", |b| {
        b.iter(|| {
            black_box(ichor_rules::ruleset::build_serving(black_box(
                files.clone(),
            )))
        })
    });
    let two = two_rules();
    g.bench_function("two_rules", |b| {
        b.iter(|| black_box(build(black_box(two.clone()))))
    });
    g.bench_function("two_rules_serving", |b| {
        b.iter(|| {
            black_box(ichor_rules::ruleset::build_serving_here(black_box(
                two.clone(),
            )))
        })
    });
    g.bench_function("two_rules_check_only", |b| {
        b.iter(|| black_box(check(black_box(&two))))
    });
    let checked = check(&files);
    assert!(!checked.has_errors());
    g.bench_function("compile_only", |b| {
        b.iter(|| black_box(compile(black_box(&checked.program), &files)))
    });

    // The 1,000-rule sets are built on first use, so a filtered run skips them.
    let overlapping = OnceCell::new();
    let distinct = OnceCell::new();
    let get = |cell: &OnceCell<(Vec<SourceFile>, CheckResult)>, distinct: bool| {
        cell.get_or_init(|| generated_checked(distinct)).0.clone()
    };
    // Checking 1,000 rules runs the pairwise subsumption lint: seconds, not microseconds,
    // so these take the fewest samples criterion allows, one iteration each.
    g.sample_size(10).sampling_mode(SamplingMode::Flat);
    g.bench_function("generated_1000", |b| {
        let files = get(&overlapping, false);
        b.iter(|| black_box(build(black_box(files.clone()))))
    });
    g.bench_function("generated_1000_distinct", |b| {
        let files = get(&distinct, true);
        b.iter(|| black_box(build(black_box(files.clone()))))
    });
    g.sample_size(100).sampling_mode(SamplingMode::Auto);
    g.bench_function("generated_1000_compile_only", |b| {
        let (files, checked) = overlapping.get_or_init(|| generated_checked(false));
        b.iter(|| black_box(compile(black_box(&checked.program), files)))
    });
    // What a server does on a load or reload (on its reload thread): parse, check (errors
    // and coverage) and compile; and the check alone, as serving runs it.
    g.bench_function("generated_1000_serving", |b| {
        let (files, _) = overlapping.get_or_init(|| generated_checked(false));
        b.iter(|| {
            black_box(ichor_rules::ruleset::build_serving_here(black_box(
                files.clone(),
            )))
        })
    });
    g.bench_function("generated_1000_check_serving", |b| {
        let (files, _) = overlapping.get_or_init(|| generated_checked(false));
        b.iter(|| black_box(ichor_rules::check::check_serving(black_box(files))))
    });
    g.bench_function("generated_1000_distinct_serving", |b| {
        let files = get(&distinct, true);
        b.iter(|| {
            black_box(ichor_rules::ruleset::build_serving_here(black_box(
                files.clone(),
            )))
        })
    });
    g.finish();
}

fn decide(c: &mut Criterion) {
    let table = shipped_table();
    let (allow, refuse) = (FIVE_OF_THREE, THREE_OF_THREE);
    // The cases decide what they say they decide.
    let hits = Session::new(&table, allow)
        .matches(REMOVE_CP)
        .expect("no interrupt");
    assert!(hits.is_empty(), "5 approved, count 3: allowed");
    let mut s = Session::new(&table, refuse);
    let hits = s.matches(REMOVE_CP).expect("no interrupt");
    assert_eq!(hits.len(), 1, "3 approved, count 3: refused by one rule");
    let message = s.render(&hits[0]).expect("renders");
    assert!(message.contains("3 -> 2"), "{message}");

    // The same rules with every row on the stack machine: what the flat form buys.
    let files = shipped();
    let checked = check(&files);
    let stack = compile_with(&checked.program, &files, Options { flat: false }).expect("compiles");
    let (rows, on_stack) = stack.rows_on_stack();
    assert_eq!(rows, on_stack, "every row on the stack machine");
    for facts in [allow, refuse] {
        let flat = Session::new(&table, facts)
            .matches(REMOVE_CP)
            .expect("no interrupt");
        let deep = Session::new(&stack, facts)
            .matches(REMOVE_CP)
            .expect("no interrupt");
        assert_eq!(flat.to_vec(), deep.to_vec(), "both forms decide alike");
    }

    let mut g = c.benchmark_group("decide");
    g.bench_function("hot_allow", |b| {
        b.iter(|| black_box(Session::new(&table, black_box(allow)).matches(black_box(REMOVE_CP))))
    });
    g.bench_function("hot_refuse", |b| {
        b.iter(|| black_box(Session::new(&table, black_box(refuse)).matches(black_box(REMOVE_CP))))
    });
    g.bench_function("hot_allow_stack_machine", |b| {
        b.iter(|| black_box(Session::new(&stack, black_box(allow)).matches(black_box(REMOVE_CP))))
    });
    g.bench_function("hot_refuse_stack_machine", |b| {
        b.iter(|| black_box(Session::new(&stack, black_box(refuse)).matches(black_box(REMOVE_CP))))
    });
    g.bench_function("refuse_with_message", |b| {
        b.iter(|| {
            let mut s = Session::new(&table, black_box(refuse));
            let hits = s.matches(black_box(REMOVE_CP)).expect("no interrupt");
            let messages: Vec<String> =
                hits.iter().map(|h| s.render(h).expect("renders")).collect();
            black_box(messages)
        })
    });
    // The two-rule file (the approval cap, and the removal's count and quorum): what the
    // comparison with other policy engines decides.
    let two = fixed::table(&two_rules(), true);
    for (name, facts, event, fires) in [
        ("two_approve_allow", THREE_OF_THREE, APPROVE_CP, 0),
        ("two_approve_refuse", FIVE_OF_THREE, APPROVE_CP, 1),
        ("two_remove_allow", FIVE_OF_THREE, REMOVE_CP, 0),
        ("two_remove_refuse", THREE_OF_THREE, REMOVE_CP, 1),
    ] {
        let hits = Session::new(&two, facts)
            .matches(event)
            .expect("no interrupt");
        assert_eq!(hits.len(), fires, "{name}");
        g.bench_function(name, |b| {
            b.iter(|| black_box(Session::new(&two, black_box(facts)).matches(black_box(event))))
        });
    }
    g.finish();
}

fn machine_yaml(out: &mut String, name: &str, role: &str, second: usize) {
    write!(
        out,
        "- apiVersion: ichor.maesh.dev/v1alpha1\n  kind: TalosMachine\n  metadata:\n    \
         name: {name}\n    namespace: infra\n    creationTimestamp: \"2025-01-10T09:00:00Z\"\n  \
         spec:\n    clusterRef: {{name: prod}}\n    role: {role}\n    approved: true\n    \
         approvalDecision: {{at: \"2025-01-10T{h:02}:{m:02}:{s:02}Z\"}}\n",
        h = 9 + second / 3600,
        m = second / 60 % 60,
        s = second % 60,
    )
    .expect("writing to a String");
}

/// One cluster (count 3) with `control_planes` approved control planes `cp-1..` and
/// `workers` approved workers.
fn snapshot(control_planes: usize, workers: usize) -> Snapshot {
    let mut y = String::from(
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosCluster\nmetadata: \
         {name: prod, namespace: infra}\nspec: {controlPlane: {count: 3}, schedulable: \"true\"}\n\
         ---\napiVersion: v1\nkind: List\nitems:\n",
    );
    for i in 1..=control_planes {
        machine_yaml(&mut y, &format!("cp-{i}"), "controlplane", i);
    }
    for i in 1..=workers {
        machine_yaml(&mut y, &format!("w-{i}"), "worker", control_planes + i);
    }
    let s = load_snapshot(&y).expect("snapshot loads");
    assert_eq!(s.machines.len(), control_planes + workers);
    s
}

fn eval_once(table: &Table, snapshot: &Snapshot, body: &[u8]) -> Vec<u8> {
    let req = parse_review(body).expect("a review");
    let events = request_events(
        req.operation(),
        &req.namespace,
        req.old.as_ref(),
        req.new.as_ref(),
    );
    let (decision, _) = decide_events(table, snapshot, &events, Expensive::FromObjects, false);
    serde_json::to_vec(&respond(&req, &decision)).expect("serializes")
}

fn eval_path(c: &mut Criterion) {
    let table = shipped_table();
    let body = std::fs::read(PathBuf::from(ROOT).join("examples/delete-cp.json"))
        .expect("examples/delete-cp.json");
    let cases = [
        ("refuse_5_machines", snapshot(3, 2), false),
        ("allow_5_machines", snapshot(4, 1), true),
        ("refuse_1000_machines", snapshot(3, 997), false),
    ];
    let mut g = c.benchmark_group("eval_path");
    for (name, snap, allowed) in &cases {
        let out: serde_json::Value =
            serde_json::from_slice(&eval_once(&table, snap, &body)).expect("JSON");
        assert_eq!(out["response"]["allowed"], *allowed, "{name}: {out}");
        g.bench_function(*name, |b| {
            b.iter(|| black_box(eval_once(&table, snap, black_box(&body))))
        });
    }
    // Issue 13: a forged status write (talosmachines/status setting NodeUnreachable) is the
    // `report machine` event, decided from the request alone (no live read), against the
    // same delete of a control plane on five machines.
    let forged =
        std::fs::read(PathBuf::from(ROOT).join("tests/fixtures/review-status-forged-cp3.json"))
            .expect("tests/fixtures/review-status-forged-cp3.json");
    let snap = snapshot(3, 2);
    let out: serde_json::Value =
        serde_json::from_slice(&eval_once(&table, &snap, &forged)).expect("JSON");
    assert_eq!(out["response"]["allowed"], false, "{out}");
    g.bench_function("status_forged_refused", |b| {
        b.iter(|| black_box(eval_once(&table, &snap, black_box(&forged))))
    });
    g.finish();
}

criterion_group!(benches, front_end, decide, eval_path);
criterion_main!(benches);
