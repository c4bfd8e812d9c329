//! The command line: one module per subcommand; `main` only wires.

mod backup;
mod check;
mod crds;
mod diff;
mod eval;
mod fmt;
mod outcome;
mod replay;
mod request;
mod serve;
mod table;
mod test;
mod verify;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit codes shared by every subcommand.
pub const EXIT_OK: u8 = 0;
/// `check` found errors (or warnings with `--deny-warnings`).
pub const EXIT_FINDINGS: u8 = 1;
/// Bad usage or unreadable input.
pub const EXIT_BAD_INPUT: u8 = 2;

/// The user a rule test case that says `byController: true` is made by (the controller's
/// ServiceAccount as the chart names it in namespace `ichor-system`), decided as a webhook
/// whose `serve --controller-username` names it (`request.by_controller`).
pub const TEST_CONTROLLER_USERNAME: &str =
    "system:serviceaccount:ichor-system:ichor-rules-controller";

#[derive(Parser, Debug)]
#[command(
    name = "ichor-rules",
    version,
    about = "Safety rules for Talos Linux clusters: check, print, and evaluate them"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Human,
    Json,
}

// Parsed once per process: the size of its largest variant (serve's many flags) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Parse, type-check and lint rule files (files or folders; default `rules/`).
    Check {
        /// Rule files or folders (a folder means its `.rules` files); default `rules/`.
        paths: Vec<PathBuf>,
        /// Rule files or folders, as every command takes them (with the paths above).
        #[arg(long = "rules", value_name = "PATH")]
        rules: Vec<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Fail (exit 1) on warnings too.
        #[arg(long)]
        deny_warnings: bool,
    },
    /// Print the compiled decision table for reviewers.
    Table {
        /// Rule files or folders (a folder means its `.rules` files); default `rules/`.
        paths: Vec<PathBuf>,
        /// Rule files or folders, as every command takes them (with the paths above).
        #[arg(long = "rules", value_name = "PATH")]
        rules: Vec<PathBuf>,
        /// Output format (`human` is the text table).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Decide an AdmissionReview (as the webhook answers) or a reconcile (as the controller
    /// decides) against a file of objects, and print the decision as JSON.
    Eval(eval::EvalArgs),
    /// Like `eval`, but print every row considered, each condition's value, the facts read,
    /// each `let` the rows use with its value, and the verdict (`--format json`: the same,
    /// as one JSON document).
    Explain(eval::ExplainArgs),
    /// Serve the admission webhook over HTTPS, deciding from live reads of the API server.
    Serve(serve::ServeArgs),
    /// Prove the rule set's invariants over every small cluster within the bounds (every
    /// interleaving of requests, controller steps, crashes and failures), or print the
    /// shortest counterexample. Exit 0: verified; 1: a violation; 2: bad usage or rules
    /// with errors.
    Verify(verify::VerifyArgs),
    /// Compare two rule sets over the states the model reaches: every decision that
    /// changed, grouped, with a witness. Exit 0: equivalent; 1: different; 2: bad input.
    Diff(diff::DiffArgs),
    /// Decide every record of a decision log (`serve --decision-log`) again from the facts
    /// it holds: with the rules that decided it (the same digest; every verdict must
    /// reproduce, else exit 1), or with proposed rules (`--rules NEW`: the decisions that
    /// would change, by direction and rule). Exit 2: bad input, or records decided by rules
    /// other than `rules/` without `--rules`.
    Replay(replay::ReplayArgs),
    /// Run the rule tests (YAML cases next to the rules, default `rules/tests`) through the
    /// same code as `eval`. Exit 0: every case passed; 1: a case failed (or coverage is
    /// below --fail-under); 2: bad usage, a bad test file, or rules with errors.
    Test(test::TestArgs),
    /// Rewrite rule files in the one canonical layout (comments kept). With --check, change
    /// nothing: print a diff of each file that is not formatted and exit 1. Exit 2: a file
    /// that cannot be read or does not parse.
    Fmt(fmt::FmtArgs),
    /// Print the CustomResourceDefinitions of TalosCluster, TalosMachine, TalosOperation
    /// and TalosEtcdBackup (YAML, one document each).
    Crds,
    /// etcd backups offline: `download` one snapshot from a backup's store to a file and
    /// check it (the keys come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    Backup(backup::BackupArgs),
    /// Print a shell completion script: `ichor-rules completions bash > /etc/bash_completion.d/ichor-rules`
    /// (zsh: a file `_ichor-rules` on `$fpath`; fish: `~/.config/fish/completions/ichor-rules.fish`).
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: CompletionShell,
    },
}

/// The shells `completions` writes scripts for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// The completion script for `shell`, generated from the command line's own definition.
pub fn completion_script(shell: CompletionShell) -> Vec<u8> {
    use clap::CommandFactory;
    let shell = match shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "ichor-rules", &mut out);
    out
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    let code = match cli.command {
        Command::Check {
            paths,
            rules,
            format,
            deny_warnings,
        } => check::run(
            &default_paths([paths, rules].concat()),
            format,
            deny_warnings,
        ),
        Command::Table {
            paths,
            rules,
            format,
        } => table::run(&default_paths([paths, rules].concat()), format),
        Command::Eval(args) => eval::run(&args, false),
        Command::Explain(args) => eval::run_explain(&args.eval, args.format),
        Command::Crds => crds::run(),
        Command::Backup(args) => backup::run(&args),
        Command::Completions { shell } => {
            match emit(&String::from_utf8_lossy(&completion_script(shell))) {
                Ok(()) => EXIT_OK,
                Err(code) => code,
            }
        }
        Command::Test(args) => test::run(&args),
        Command::Fmt(args) => fmt::run(&args),
        Command::Diff(args) => diff::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Verify(args) => {
            let paths = default_paths([args.paths.clone(), args.rules.clone()].concat());
            verify::run(&args, &paths)
        }
        Command::Serve(args) => serve::run(&args),
    };
    ExitCode::from(code)
}

fn default_paths(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    if paths.is_empty() {
        vec![PathBuf::from("rules")]
    } else {
        paths
    }
}

/// Writes to standard output. A reader that went away (`| head`) ends the output quietly;
/// any other failure (a full disk) is one line on stderr and exit 2. Never a panic, which
/// `print!` would be.
fn emit(text: &str) -> Result<(), u8> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => {
            eprintln!("error: cannot write to standard output: {e}");
            Err(EXIT_BAD_INPUT)
        }
    }
}

/// Whether to colour output written to stdout.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none() && std::io::stdout().is_terminal()
}
