//! The exploration rate of `ichor-rules verify`: the shipped rules over the model of a
//! cluster of up to three control planes (about 46,000 states), as `verify` explores it.
//! Report states per second from the median.

// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use ichor_rules::ruleset::load;
use ichor_rules::verify::{Bounds, verify};
use std::path::PathBuf;
use std::time::Duration;

fn explore(c: &mut Criterion) {
    let set =
        load(&[PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules")]).expect("rules/ loads");
    let table = set.table.expect("rules/ compiles");
    let bounds = Bounds {
        max_control_planes: 3,
        max_workers: 0,
        max_failures: 0,
        max_operations: 0,
        in_flight: 0,
        max_requests: None,
        depth: 64,
        rolls: false,
        roll_width: 1,
        roll_kind: ichor_rules::verify::RollKind::Reboot,
        all_kinds: false,
        backups: false,
        lifecycle: false,
        clock: false,
    };
    let states = verify(&table, bounds)
        .expect("bounds a model holds")
        .exploration
        .keys
        .len();
    let mut g = c.benchmark_group("verify");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.throughput(criterion::Throughput::Elements(states as u64));
    g.bench_function("shipped rules, 3 control planes", |b| {
        b.iter(|| {
            let r = verify(&table, bounds).expect("bounds a model holds");
            assert!(r.verified());
            r.exploration.keys.len()
        })
    });
    g.finish();
}

criterion_group!(benches, explore);
criterion_main!(benches);
