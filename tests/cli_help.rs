//! CLI habits: every argument of every command is described in `--help`, and the commands
//! that read rules all take `--rules PATH` (positional paths stay for `check` and `table`).

use clap::CommandFactory;
use ichor_rules::cli::Cli;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ichor-rules");

fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let described = arg
            .get_help()
            .is_some_and(|h| !h.to_string().trim().is_empty())
            || arg
                .get_long_help()
                .is_some_and(|h| !h.to_string().trim().is_empty());
        if !described {
            out.push(format!("{path} {id}"));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_about().is_none() && sub.get_long_about().is_none() {
            out.push(format!("{path} {} (the command itself)", sub.get_name()));
        }
        undocumented(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

#[test]
fn every_argument_is_described_in_help() {
    let mut missing = Vec::new();
    undocumented(&Cli::command(), "ichor-rules", &mut missing);
    assert!(missing.is_empty(), "arguments without help: {missing:?}");
}

#[test]
fn the_commands_that_read_rules_take_rules_path() {
    let cli = Cli::command();
    for name in [
        "check", "table", "eval", "explain", "test", "verify", "serve",
    ] {
        let sub = cli
            .find_subcommand(name)
            .unwrap_or_else(|| panic!("no `{name}` command"));
        let rules = sub
            .get_arguments()
            .find(|a| a.get_long() == Some("rules"))
            .unwrap_or_else(|| panic!("`{name}` has no --rules"));
        assert!(rules.get_help().is_some(), "`{name} --rules` has no help");
    }
}

/// `--rules` and positional paths name the same rule set for `check` and `table`.
#[test]
fn check_and_table_take_rules_as_a_flag_or_positionally() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("NO_COLOR", "1")
            .output()
            .expect("runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    for cmd in ["check", "table"] {
        let positional = run(&[cmd, "rules"]);
        let flag = run(&[cmd, "--rules", "rules"]);
        assert_eq!(positional.0, 0, "{cmd}: {}", positional.1);
        assert_eq!(positional, flag, "{cmd}");
    }
    // A missing path through the flag is bad input, as positionally.
    let (code, _) = run(&["check", "--rules", "no-such-folder"]);
    assert_eq!(code, 2);
}
