//! The one integration test binary. Each `tests/*.rs` file is a module of it, so what they
//! share (`tests/support/`: the in-process API server, the controller harness, etcd, the
//! Talos API stand-ins, the HTTPS client) is compiled once, not once per file.
//!
//! Cargo.toml sets `autotests = false`, so a new `tests/x.rs` is compiled only when it is
//! named here as `mod x;` (the test `every_test_file_is_a_module` below fails otherwise).
//! Test names are `x::test_name`; run one file's tests with
//! `cargo nextest run -E 'test(/^x::/)'` (or `cargo test --test it x::`).

// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The shared modules: each test file uses its own part of them.
#[allow(dead_code)]
mod support;

mod agree;
mod apiserver;
mod backup;
mod certs;
mod chart;
mod cli;
mod cli_help;
mod client_ca;
mod config_admission;
mod config_apply;
mod config_base;
mod config_bootstrap;
mod config_controller;
mod configmap_mount;
mod conformance;
mod controller;
mod crds;
mod credentials;
mod diagnostics;
mod docs;
mod fleet;
mod fmt;
mod front_end_limits;
mod layers;
mod lints;
mod metrics_auth;
mod operations;
mod removal;
mod render;
mod requests;
mod robust;
mod rule_tests;
mod secret_logs;
mod seeds;
mod serve_hardening;
mod step_records;
mod talos;
mod verify;
mod webhook;

/// With `autotests = false`, a test file that is not named above would never be compiled
/// or run, silently. Every `tests/*.rs` (but this root) must be a `mod` line here.
#[test]
fn every_test_file_is_a_module() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let root = std::fs::read_to_string(tests.join("it.rs")).expect("read tests/it.rs");
    let declared: std::collections::BTreeSet<String> = root
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&tests).expect("read tests/") {
        let path = entry.expect("a directory entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs") && stem != "it" && !declared.contains(stem) {
            missing.push(format!("tests/{stem}.rs"));
        }
    }
    assert!(
        missing.is_empty(),
        "{missing:?} are not compiled: add `mod <name>;` for each to tests/it.rs \
         (Cargo.toml has autotests = false; every integration test is a module of tests/it.rs)"
    );
}
