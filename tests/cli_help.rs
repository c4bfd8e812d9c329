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

/// `completions bash|zsh|fish` prints a script each shell accepts: bash and zsh parse it
/// (`-n`), fish when installed; every subcommand is in it.
#[test]
fn completions_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout).into_owned();
        for sub in [
            "check",
            "table",
            "eval",
            "explain",
            "serve",
            "verify",
            "completions",
        ] {
            assert!(script.contains(sub), "{shell} script lacks `{sub}`");
        }
        let path =
            std::env::temp_dir().join(format!("ichor-completions-{}-{shell}", std::process::id()));
        std::fs::write(&path, &script).expect("write");
        // Syntax check with the shell itself, where it is installed.
        if let Ok(status) = Command::new(shell).arg("-n").arg(&path).status() {
            assert!(status.success(), "{shell} -n rejects the script");
        }
        let _ = std::fs::remove_file(&path);
    }
    let out = Command::new(BIN)
        .args(["completions", "powershell-nope"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

/// The LICENSE file is the license Cargo.toml names.
#[test]
fn the_license_file_matches_cargo_toml() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        manifest
            .lines()
            .any(|l| l.trim() == "license = \"Apache-2.0\""),
        "Cargo.toml's license changed: update LICENSE and this test"
    );
    let license = std::fs::read_to_string(root.join("LICENSE")).expect("a LICENSE file");
    assert!(license.trim_start().starts_with("Apache License"));
    assert!(license.contains("Version 2.0, January 2004"));
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
}

/// The README keeps its two commands first and says how to install.
#[test]
fn the_readme_says_how_to_install() {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .expect("README.md");
    let first = readme
        .find("cargo run --release -- check rules/")
        .expect("first command");
    let second = readme.find("bash scripts/test.sh").expect("second command");
    let install = readme
        .find("cargo install --path .")
        .expect("cargo install");
    assert!(first < second && second < install);
}

/// `table` shows the `let` definitions its rows use; its JSON gives each message as text.
#[test]
fn table_shows_the_lets_and_json_messages_are_text() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("NO_COLOR", "1")
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = run(&["table", "rules"]);
    assert!(text.starts_with("definitions the rows use\n"), "{text}");
    // (Names are padded to the longest one's width.)
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("let quorum ")
                && l.contains(" = approved / 2 + 1   (rules/removal.rules:")),
        "{text}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&run(&["table", "rules", "--format", "json"])).expect("json");
    let lets = v["lets"].as_array().expect("lets");
    assert!(
        lets.iter()
            .any(|l| l["name"] == "after" && l["definition"] == "approved - 1")
    );
    for group in v["groups"].as_array().expect("groups") {
        for row in group["rows"].as_array().expect("rows") {
            let say = row["say"].as_str().expect("say");
            assert!(!say.starts_with('"'), "{say}");
            assert!(!say.contains("\\\""), "escapes resolved: {say}");
        }
    }
    // A quoted word inside a message is written `\"false\"` in the rules: plain quotes here.
    assert!(
        v.to_string().contains(r#"(spec.schedulable \"false\")"#),
        "{v}"
    );
}
