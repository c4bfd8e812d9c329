#![forbid(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    ichor_rules::cli::run(ichor_rules::cli::Cli::parse())
}
