//! How `check` and the rendering of its diagnostics scale with the size of a rule set
//! (issue 10: a 700 KB rule set took 5 s and 1.4 MB 19 s; 20,000 warnings took 33 s to
//! render). Each group runs one size and four times it: the times should grow about 4x,
//! not 16x.
//!
//! Run: `cargo bench --bench check_scaling -- --warm-up-time 1 --measurement-time 3`

// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use ichor_rules::diagnostics::{SourceFile, render_human};
use ichor_rules::ruleset::build;
use std::hint::black_box;

/// `copies` distinct variants of a handful of realistic rules on the same events.
fn rule_set(copies: usize) -> String {
    let mut out = String::from(
        "let after = approved - 1\nlet quorum = approved / 2 + 1\nlet teardown = not cluster.exists or cluster.deleting\n",
    );
    for i in 0..copies {
        out.push_str(&format!(
            "rule last-{i}\n  refuse leave controlplane\n  when after == 0 and cluster != \"c{i}\"\n  unless cluster.deleting\n  say \"removing {{machine}} leaves no control plane\"\n\n\
             rule quorum-{i}\n  refuse leave controlplane\n  when after > 0 and after < quorum and cluster != \"c{i}\"\n  unless cluster.deleting\n  say \"below the quorum of {{quorum}}\"\n\n\
             rule count-{i}\n  refuse remove controlplane\n  when after < count and cluster != \"c{i}\"\n  unless teardown or member.dead\n  say \"below the declared count of {{count}}\"\n\n\
             rule cap-{i}\n  refuse approve controlplane\n  when approved > count and cluster != \"c{i}\"\n  unless teardown\n  say \"{{approved + 1}} above {{count + 1}}\"\n\n"
        ));
    }
    out
}

fn check_scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("check");
    g.sampling_mode(SamplingMode::Flat).sample_size(10);
    for copies in [100, 400] {
        let text = rule_set(copies);
        g.bench_with_input(BenchmarkId::from_parameter(text.len()), &text, |b, text| {
            b.iter(|| black_box(build(vec![SourceFile::new("x.rules", text.as_str())])))
        });
    }
    g.finish();
}

fn render_scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("render");
    g.sampling_mode(SamplingMode::Flat).sample_size(10);
    for n in [5_000, 20_000] {
        let text: String = (0..n)
            .map(|i| format!("let unused{i} = approved + {i}\n"))
            .collect();
        let set = build(vec![SourceFile::new("x.rules", text)]);
        g.bench_with_input(BenchmarkId::from_parameter(n), &set, |b, set| {
            b.iter(|| black_box(render_human(&set.diagnostics, &set.files, false)))
        });
    }
    g.finish();
}

criterion_group!(benches, check_scaling, render_scaling);
criterion_main!(benches);
