#![forbid(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: under 32 concurrent admissions the webhook spent a
/// fifth of its CPU in glibc's allocator (arena locks, consolidation), and `verify` a third.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    ichor_rules::cli::run(ichor_rules::cli::Cli::parse())
}
