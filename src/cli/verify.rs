//! `ichor-rules verify`: prove the rule set's invariants over every small cluster within
//! the bounds, or print the shortest counterexample.

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, Format, emit};
use crate::diagnostics::render_human;
use crate::ruleset::load;
use crate::verify::memory::{Budget, default_limit};
use crate::verify::{Bounds, Report, verify_within};
use clap::Args;
use std::fmt::Write;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Rule files or folders (default `rules/`); the invariants are among them.
    pub paths: Vec<PathBuf>,
    /// Rule files or folders, as every command takes them (with the paths above).
    #[arg(long = "rules", value_name = "PATH")]
    pub rules: Vec<PathBuf>,
    /// Control-plane machines in the model (approved or waiting to be). Without any bound
    /// flag, `verify` runs its default suite (docs/rules.md, "verify").
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=12))]
    pub max_control_planes: Option<u8>,
    /// Approved workers in the model.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=6))]
    pub max_workers: Option<u8>,
    /// Node failures (and PodDisruptionBudgets blocking a drain) in one run of the model.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=4))]
    pub max_failures: Option<u8>,
    /// TalosOperations created in one run of the model.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=4))]
    pub max_operations: Option<u8>,
    /// Requests admitted and not yet committed at one time (K: other commits may land
    /// between a request's decision and its own commit).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub in_flight: Option<u8>,
    /// Requests people send in one run (approve, un-approve, delete, change the count,
    /// unschedule or reschedule, delete the cluster, create an operation); unbounded when
    /// not given.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub max_requests: Option<u8>,
    /// The operations people create in the model are reboots (or, with `--roll-kind
    /// upgrade`, upgrades) rolled over the whole cluster (no `spec.machine`: every approved
    /// control plane, then every approved worker, one at a time, as the controller's
    /// configuration roll creates them) instead of one machine's upgrade, reset, rollback or
    /// shutdown. At most 6 machines.
    #[arg(long)]
    pub rolls: bool,
    /// The cluster has a TalosEtcdBackup, with no snapshot at first; its snapshot is taken
    /// and ages at any time (issue 36: an upgrade, reset or rollback of a control plane
    /// starts only with a fresh one, `fresh-snapshot-before-disruption`). With it, the
    /// operations people create need `--max-operations` (1 when not given).
    #[arg(long)]
    pub backups: bool,
    /// With `--rolls`: the rolls' `spec.maxUnavailable`, how many workers they may take
    /// down at once (the rules decide it: `step-max-unavailable`). 1 when not given.
    #[arg(long, requires = "rolls", value_parser = clap::value_parser!(u8).range(1..=2))]
    pub max_unavailable: Option<u8>,
    /// With `--rolls`: what the rolls do to each node, `reboot` (the default, as the
    /// controller's configuration roll) or `upgrade` (to `spec.image`, each node coming
    /// back running the new version, which `wait node-back` checks; the plan
    /// `run operation "upgrade"`).
    #[arg(long, requires = "rolls", value_enum, default_value_t = RollKindArg::Reboot)]
    pub roll_kind: RollKindArg,
    /// The Talos version the model's nodes run: `1.12` (the default; an upgrade sends the
    /// legacy `MachineService/Upgrade`) or `1.13` (an upgrade pulls with
    /// `ImageService/Pull`, installs with `LifecycleService/Upgrade` and reads its
    /// stream's exit code, then the controller cordons, drains and reboots the node).
    #[arg(long, value_enum, default_value_t = TalosArg::V1_12)]
    pub talos: TalosArg,
    /// Time passes in the model: the step an operation is at may outlast its `within`
    /// (or, for a call sent, the executor's deadline for the node to go down), once per
    /// step, so a gate that does not pass fails the operation.
    #[arg(long)]
    pub clock: bool,
    /// Steps from a starting state after which exploration stops (reported when reached).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub depth: u32,
    /// Memory the whole `verify` may use (all its runs together), such as `512M` or `4G`:
    /// an exploration that would pass it stops first, saying how far it got (exit 2,
    /// nothing proved). Default: three quarters of the memory available when it starts
    /// (MemAvailable in /proc/meminfo); no limit where that cannot be read.
    #[arg(long, value_name = "SIZE", value_parser = crate::verify::memory::parse_size)]
    pub max_memory: Option<u64>,
    /// Output format: `human` (text) or `json`.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// Write every admission step of the shortest counterexample as DIR/step-N/
    /// (objects.yaml + review.json, for `ichor-rules eval`); with several violated
    /// invariants, each one's also as DIR/<invariant>/step-N/.
    #[arg(long, value_name = "DIR")]
    pub emit_fixtures: Option<PathBuf>,
    /// Instead of exploring: check a step log the controller wrote (`serve --step-log`)
    /// against the model's controller with these rules. Every reconcile is replayed through
    /// the executor in a world that answers what the log recorded; exit 0 when the executor
    /// asks, decides and does the same at every line, 1 at the first line where it does
    /// not, 2 when the log cannot be read.
    #[arg(long, value_name = "FILE")]
    pub check_trace: Option<PathBuf>,
}

/// `verify --talos`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TalosArg {
    #[value(name = "1.12")]
    V1_12,
    #[value(name = "1.13")]
    V1_13,
}

/// `verify --roll-kind`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RollKindArg {
    Reboot,
    Upgrade,
}

impl From<RollKindArg> for crate::verify::RollKind {
    fn from(k: RollKindArg) -> Self {
        match k {
            RollKindArg::Reboot => crate::verify::RollKind::Reboot,
            RollKindArg::Upgrade => crate::verify::RollKind::Upgrade,
        }
    }
}

/// `verify --check-trace FILE`.
fn check_trace(args: &VerifyArgs, table: &crate::compile::Table, file: &std::path::Path) -> u8 {
    use crate::runtime::exec::trace::{NotABehaviour, check};
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: --check-trace {}: {e}", file.display());
            return EXIT_BAD_INPUT;
        }
    };
    let json = matches!(args.format, Format::Json);
    match check(table, &text) {
        Ok(c) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "behaviour": true,
                        "reconciles": c.reconciles,
                        "cut": c.cut,
                        "lines": c.lines,
                    })
                );
            } else {
                println!(
                    "a behaviour of the model: {} reconcile(s) replayed to their end, {} cut short \
                     (a controller stopped there), {} line(s)",
                    c.reconciles, c.cut, c.lines
                );
            }
            EXIT_OK
        }
        Err(NotABehaviour::Differs(why)) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"behaviour": false, "difference": why})
                );
            } else {
                println!("not a behaviour of the model: {why}");
            }
            EXIT_FINDINGS
        }
        Err(NotABehaviour::Unreadable(why)) => {
            eprintln!("error: --check-trace {}: {why}", file.display());
            EXIT_BAD_INPUT
        }
    }
}

pub fn run(args: &VerifyArgs, paths: &[PathBuf]) -> u8 {
    let set = match load(paths) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let Some(table) = &set.table else {
        eprint!("{}", render_human(&set.diagnostics, &set.files, false));
        eprintln!(
            "error: the rules have {} error(s); fix them (`ichor-rules check`) before verifying",
            set.errors()
        );
        return EXIT_BAD_INPUT;
    };
    if let Some(file) = &args.check_trace {
        return check_trace(args, table, file);
    }
    if let Some(why) = crate::verify::model::unsupported(table) {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    if table.invariants.is_empty() {
        eprintln!(
            "error: the rules have no `invariant`, so there is nothing to verify; add the shipped \
             rules/invariants.rules (or your own `invariant` statements) to the paths"
        );
        return EXIT_BAD_INPUT;
    }
    let bounds = suite(args);
    if let Some(e) = bounds.iter().find_map(|b| b.check().err()) {
        eprintln!("error: {e}");
        return EXIT_BAD_INPUT;
    }
    let budget = Budget::new(args.max_memory.or_else(default_limit).unwrap_or(u64::MAX));
    let budget = &budget;
    let outcomes = run_all(&bounds, |b, threads| {
        verify_within(table, *b, budget, threads)
    });
    // Every run or none: a report of the runs that finished would claim bounds that were
    // not explored.
    let runs = match all_finished(outcomes) {
        Ok(runs) => match runs.into_iter().collect::<Result<Vec<Report>, _>>() {
            Ok(runs) => runs,
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_BAD_INPUT;
            }
        },
        Err(k) => {
            let b = bounds.get(k).map(bounds_text).unwrap_or_default();
            eprintln!(
                "error: verify failed internally: the run with bounds {b} stopped with a panic \
                 (above); \
                 nothing was proved. Please report it with the rules it ran on"
            );
            return EXIT_BAD_INPUT;
        }
    };
    if let Some(dir) = &args.emit_fixtures
        && let Err(e) = write_fixtures(dir, &runs)
    {
        eprintln!("error: {e}");
        return EXIT_BAD_INPUT;
    }
    // The procedures explored beside the cluster: a backup in flight (the snapshot
    // procedure under every fault at its acting calls) and a new cluster's bootstrap (the
    // procedure, decided by these rules, raced by two controllers, under every fault at
    // its calls).
    let procedures = [
        procedure_backup(table),
        procedure_bootstrap(table),
        procedure_apply(table),
    ];
    let refuted = procedures.iter().any(|p| !p.violations.is_empty());
    let text = match args.format {
        Format::Json => {
            let mut json = to_json(&runs, paths);
            json["procedures"] = serde_json::json!(
                procedures
                    .iter()
                    .map(|p| serde_json::json!({
                        "name": p.name,
                        "states": p.states,
                        "reconciles": p.reconciles,
                        "invariants": p.invariants,
                        "violations": p.violations.iter().map(|(i, why, steps)| serde_json::json!({
                            "invariant": i, "why": why, "steps": steps,
                        })).collect::<Vec<_>>(),
                    }))
                    .collect::<Vec<_>>()
            );
            // A procedure's violation refutes the rules as a cluster's does.
            if refuted && json["result"] != "violated" {
                json["result"] = "violated".into();
            }
            serde_json::to_string_pretty(&json).unwrap_or_default() + "\n"
        }
        Format::Human => to_text(&runs, paths, &procedures),
    };
    if let Err(code) = emit(&text) {
        return code;
    }
    if refuted {
        return EXIT_FINDINGS;
    }
    // A counterexample that could not be replayed on concrete states is a bug of the model
    // (said in its trace above). The rules are refuted when another violation's
    // counterexample replays; when none does, nothing is shown, so nothing is claimed.
    let (replayed, unreplayed) =
        runs.iter()
            .flat_map(|r| &r.traces)
            .fold((0, 0), |(ok, bad), t| {
                if t.replay_error.is_some() {
                    (ok, bad + 1)
                } else {
                    (ok + 1, bad)
                }
            });
    if unreplayed > 0 {
        eprintln!(
            "error: {unreplayed} counterexample(s) could not be replayed on concrete states (a \
             bug of the model, said in the trace)"
        );
        if replayed == 0 {
            return EXIT_BAD_INPUT;
        }
        return EXIT_FINDINGS;
    }
    // A run that could not explore its bounds proved nothing (said in its cut above); a
    // counterexample it found is still one.
    if result_word(&runs) == "incomplete" {
        eprintln!("error: an exploration stopped before its bounds; nothing was proved");
        return EXIT_BAD_INPUT;
    }
    if runs.iter().all(Report::verified) {
        EXIT_OK
    } else {
        EXIT_FINDINGS
    }
}

/// Reconciles of the backup in flight explored after the cluster's runs.
const BACKUP_RECONCILES: u8 = 4;

/// A procedure explored beside the cluster model, as `verify` reports it.
struct Procedure {
    name: &'static str,
    /// What was explored, in words.
    what: String,
    invariants: &'static [&'static str],
    states: usize,
    reconciles: usize,
    /// Each violation: the invariant, why, and the steps to it.
    violations: Vec<(&'static str, String, Vec<String>)>,
}

impl From<crate::verify::procedure::Report> for Procedure {
    fn from(r: crate::verify::procedure::Report) -> Procedure {
        Procedure {
            name: "",
            what: String::new(),
            invariants: &[],
            states: r.states,
            reconciles: r.reconciles,
            violations: r
                .violations
                .into_iter()
                .map(|v| (v.invariant, v.why, v.trace))
                .collect(),
        }
    }
}

fn procedure_backup(table: &crate::compile::Table) -> Procedure {
    let r = crate::verify::backup::explore(table, BACKUP_RECONCILES, None);
    Procedure {
        name: "backup",
        what: format!(
            "backup in flight: the snapshot procedure (exec::backup) over {BACKUP_RECONCILES} \
             reconciles, a crash, lost answer or refusal at any of its acting calls"
        ),
        invariants: &[
            "counted-verified",
            "interrupted-cleaned",
            "snapshot-taken",
            "retention-kept",
        ],
        states: r.states,
        reconciles: r.reconciles,
        violations: r
            .violations
            .into_iter()
            .map(|v| {
                let steps = v
                    .trace
                    .iter()
                    .enumerate()
                    .map(|(k, f)| match f {
                        None => format!("reconcile {}", k + 1),
                        Some((c, f)) => format!("reconcile {}, {f:?} at acting call {c}", k + 1),
                    })
                    .collect();
                (v.invariant, v.why, steps)
            })
            .collect(),
    }
}

fn procedure_bootstrap(table: &crate::compile::Table) -> Procedure {
    let r = crate::verify::bootstrap::explore(table, BOOTSTRAP_STEPS, None);
    Procedure {
        name: "bootstrap",
        what: format!(
            "bootstrap: the bootstrap procedure (exec::bootstrap) decided by these rules, two \
             controllers (one reading a step late) over {BOOTSTRAP_STEPS} steps, from {}; a \
             crash, lost answer, unreached node or refusal at any of its calls",
            crate::verify::bootstrap::STARTS.join(", from ")
        ),
        invariants: &["bootstrap-once", "bootstrap-ends"],
        ..Procedure::from(r)
    }
}

fn procedure_apply(table: &crate::compile::Table) -> Procedure {
    let r = crate::verify::apply::explore(table, APPLY_STEPS, None);
    Procedure {
        name: "apply",
        what: format!(
            "apply: a machine's configuration applied (exec::apply, running these rules' `plan apply controlplane` and `plan apply worker`) over \
             {APPLY_STEPS} steps (reconciles, a new base, the roll's reboot), from a node \
             whose changes need no reboot, one whose changes need one and one in maintenance \
             mode, each a control plane and a worker, a crash, lost \
             answer, refusal or no node to dial at any of its calls and the status write"
        ),
        invariants: &[
            "applied-runs",
            "no-reboot-by-apply",
            "dry-run-first",
            "apply-ends",
        ],
        ..Procedure::from(r)
    }
}

/// Steps of a machine's configuration explored after the bootstrap.
const APPLY_STEPS: u8 = 5;

/// Steps of the bootstrap explored after the backup.
const BOOTSTRAP_STEPS: u8 = 5;

/// Runs `run` on every bounds of `bounds` and gives back the outcomes in their order.
///
/// The runs share the machine's cores ([`crate::verify::explore::threads`]): as many runs at a time as
/// there are cores, each on `cores / runs` threads (one in the default suite), the ones
/// with requests in flight first (the largest of the suite by far), the others in order,
/// so that the last to finish is a small one. One thread per run spends less than two on
/// the same states (one thread both expands and merges, with nothing to hand over), and
/// two runs at a time keep their visited sets in the caches better than all at once.
fn run_all<T: Send>(
    bounds: &[Bounds],
    run: impl Fn(&Bounds, usize) -> T + Sync,
) -> Vec<std::thread::Result<T>> {
    let cores = crate::verify::explore::threads();
    let per_run = (cores / bounds.len().max(1)).max(1);
    let mut order: Vec<usize> = (0..bounds.len()).collect();
    order.sort_by_key(|&k| {
        let b = &bounds[k];
        (
            std::cmp::Reverse(b.in_flight),
            std::cmp::Reverse(b.max_requests.map_or(u16::MAX, u16::from)),
        )
    });
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<std::thread::Result<T>>>> =
        bounds.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let (order, next, slots, run) = (&order, &next, &slots, &run);
    std::thread::scope(|scope| {
        for _ in 0..cores.min(bounds.len()) {
            scope.spawn(move || {
                loop {
                    let p = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&k) = order.get(p) else {
                        break;
                    };
                    // A panic is the run's outcome (reported with its bounds), not the
                    // worker's end: the other runs still go on.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run(&bounds[k], per_run)
                    }));
                    if let Some(slot) = slots.get(k)
                        && let Ok(mut slot) = slot.lock()
                    {
                        *slot = Some(outcome);
                    }
                }
            });
        }
    });
    slots
        .iter()
        .map(|slot| {
            slot.lock()
                .ok()
                .and_then(|mut s| s.take())
                .unwrap_or_else(|| Err(Box::new("the run was not started")))
        })
        .collect()
}

/// The reports of every run, or the index of the first run that panicked.
fn all_finished<T>(outcomes: Vec<std::thread::Result<T>>) -> Result<Vec<T>, usize> {
    outcomes
        .into_iter()
        .enumerate()
        .map(|(k, r)| r.map_err(|_| k))
        .collect()
}

/// The bounds to explore: the ones given (the rest from [`SINGLE`]), or, when no bound is
/// given, the default suite: one base cluster, and that base with each kind of trouble
/// (a node failure or blocked drain, a request in flight, an operation) added in turn.
fn suite(args: &VerifyArgs) -> Vec<Bounds> {
    let given = [
        args.max_control_planes,
        args.max_workers,
        args.max_failures,
        args.max_operations,
        args.in_flight,
        args.max_requests,
    ];
    let lifecycle = args.talos == TalosArg::V1_13;
    if given.iter().any(Option::is_some) || args.rolls || args.backups || lifecycle || args.clock {
        return vec![Bounds {
            max_control_planes: args.max_control_planes.unwrap_or(SINGLE.max_control_planes),
            max_workers: args.max_workers.unwrap_or(SINGLE.max_workers),
            max_failures: args.max_failures.unwrap_or(SINGLE.max_failures),
            // A roll needs an operation to roll.
            max_operations: args
                .max_operations
                .unwrap_or(if args.rolls || args.backups {
                    1
                } else {
                    SINGLE.max_operations
                }),
            in_flight: args.in_flight.unwrap_or(SINGLE.in_flight),
            max_requests: args.max_requests.or(SINGLE.max_requests),
            depth: args.depth,
            rolls: args.rolls,
            roll_width: args.max_unavailable.unwrap_or(1),
            roll_kind: args.roll_kind.into(),
            all_kinds: true,
            backups: args.backups,
            lifecycle,
            clock: args.clock,
        }];
    }
    let depth = args.depth;
    let small = Bounds { depth, ..SINGLE };
    // The defaults (6 control-plane machines, 2 workers, a failure, 2 operations,
    // a request in flight) each with a budget of requests by people.
    let large = Bounds {
        max_control_planes: 6,
        max_workers: 0,
        max_failures: 0,
        max_operations: 0,
        in_flight: 0,
        max_requests: Some(3),
        depth,
        rolls: false,
        roll_width: 1,
        roll_kind: crate::verify::RollKind::Reboot,
        all_kinds: false,
        backups: false,
        lifecycle: false,
        clock: false,
    };
    vec![
        // A small cluster under any number of requests: alone, with a failure, with a
        // request in flight.
        small,
        Bounds {
            max_workers: 0,
            max_failures: 1,
            ..small
        },
        Bounds {
            max_workers: 0,
            in_flight: 1,
            ..small
        },
        // Six control-plane machines (count 5 and its replacement, count 1 with four
        // waiting) under a budget of requests: with workers, a failure, operations, a
        // request in flight.
        Bounds {
            max_workers: 2,
            ..large
        },
        Bounds {
            max_failures: 1,
            max_requests: Some(2),
            ..large
        },
        Bounds {
            max_operations: 2,
            ..large
        },
        Bounds {
            in_flight: 1,
            max_requests: Some(2),
            ..large
        },
        // Five control planes (count 5) and two failures, as many as five members
        // tolerate, under two requests: nodes dying before, between and during removals.
        Bounds {
            max_control_planes: 5,
            max_failures: 2,
            max_requests: Some(2),
            ..large
        },
        // Four machines, a failure and three requests: two removals at once and a node
        // dying between them (where `healthy-quorum` must count etcd's own members).
        Bounds {
            max_control_planes: 4,
            max_workers: 1,
            max_failures: 1,
            max_requests: Some(3),
            ..large
        },
        // The bounds in pairs and threes, where they met in a counterexample: an operation
        // with a request in flight (two approvals on one snapshot, then a reset of a member:
        // `reset-replacement-not-joined`), and with a failure and a worker too (a reset of a
        // control plane being deleted: `reset-uncounted-control-plane`, found with four
        // requests, `tests/verify.rs` keeps that run; an upgrade of a control plane
        // re-roled to a worker while another is dead: `step-healthy-majority` counting
        // `target.uncounted`; a worker's upgrade under `step-last-worker`). Operations run
        // on the executor here, their nodes going down and coming back.
        Bounds {
            max_control_planes: 5,
            max_operations: 1,
            in_flight: 1,
            max_requests: Some(3),
            ..large
        },
        Bounds {
            max_control_planes: 3,
            max_workers: 1,
            max_failures: 1,
            max_operations: 1,
            in_flight: 1,
            max_requests: Some(3),
            ..large
        },
        // An operation on one of five control planes with two failures: a call refused or
        // a drain blocked, then another node dying before the call is sent again
        // (`step-member-down`: never two control planes down at once).
        Bounds {
            max_control_planes: 5,
            max_failures: 2,
            max_operations: 1,
            max_requests: Some(1),
            ..large
        },
        // A reboot rolled over three control planes and a worker (as the controller's
        // configuration roll creates it), with a failure (a node dying, a member lagging
        // behind its node, a call refused or lost, a drain blocked) and two requests: the
        // roll's gates between nodes.
        Bounds {
            max_control_planes: 3,
            max_workers: 1,
            max_failures: 1,
            max_operations: 1,
            max_requests: Some(2),
            rolls: true,
            ..large
        },
        // ... and over two workers of an unschedulable cluster, one of which dies: the roll
        // takes the other only while the probe has not seen that death
        // (`step-last-worker` reads `workers.others_up`; `worker-in-service-while-
        // unschedulable` counts what the controller can know).
        Bounds {
            max_control_planes: 3,
            max_workers: 2,
            max_failures: 1,
            max_operations: 1,
            max_requests: Some(2),
            rolls: true,
            ..large
        },
        // One machine's operation of every kind the model runs (a rollback and a shutdown
        // besides the upgrades and resets of the runs above) on three control planes and a
        // worker, with a failure and two requests: each plan's drain and gates.
        Bounds {
            max_control_planes: 3,
            max_workers: 1,
            max_failures: 1,
            max_operations: 1,
            max_requests: Some(2),
            all_kinds: true,
            ..large
        },
        // An upgrade of one machine on nodes running Talos 1.13 (the image pulled and
        // installed through LifecycleService, then the controller's own cordon, drain and
        // reboot), with time passing (a gate or a sent call outlasting its time fails the
        // operation), on three control planes with a failure and two requests.
        Bounds {
            max_control_planes: 3,
            max_failures: 1,
            max_operations: 1,
            max_requests: Some(2),
            lifecycle: true,
            clock: true,
            ..large
        },
        // The same cluster with a TalosEtcdBackup whose snapshot is taken and ages at any
        // time, one machine's operation of every kind and two requests, no failure: an
        // upgrade, reset or rollback of a control plane starts only with a fresh snapshot
        // (`fresh-backup`, `fresh-backup-none-yet`).
        Bounds {
            max_control_planes: 3,
            max_workers: 1,
            max_operations: 1,
            max_requests: Some(2),
            all_kinds: true,
            backups: true,
            ..large
        },
        // ... and an upgrade rolled over that cluster, which touches its control planes
        // too (a roll names no machine).
        Bounds {
            max_control_planes: 3,
            max_workers: 1,
            max_operations: 1,
            max_requests: Some(2),
            rolls: true,
            roll_kind: crate::verify::RollKind::Upgrade,
            backups: true,
            ..large
        },
    ]
}

/// The bounds of a single run, for the flags not given.
pub const SINGLE: Bounds = Bounds {
    max_control_planes: 3,
    max_workers: 1,
    max_failures: 0,
    max_operations: 0,
    in_flight: 0,
    max_requests: None,
    depth: 64,
    rolls: false,
    roll_width: 1,
    roll_kind: crate::verify::RollKind::Reboot,
    all_kinds: true,
    backups: false,
    lifecycle: false,
    clock: false,
};

fn slug(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn write_fixtures(dir: &Path, runs: &[Report]) -> Result<(), String> {
    let traces: Vec<&crate::verify::trace::Trace> = runs.iter().flat_map(|r| &r.traces).collect();
    // The shortest counterexample at DIR/step-N; with several violated invariants, each
    // one's also at DIR/<invariant>/step-N.
    let many = traces.len() > 1;
    let shortest = traces.iter().min_by_key(|t| t.steps.len()).copied();
    let mut seen = std::collections::HashSet::new();
    let mut targets: Vec<(PathBuf, &crate::verify::trace::Trace)> = Vec::new();
    if let Some(t) = shortest {
        targets.push((dir.to_path_buf(), t));
    }
    if many {
        for t in traces {
            if seen.insert(t.invariant.clone()) {
                targets.push((dir.join(slug(&t.invariant)), t));
            }
        }
    }
    for (base, t) in targets {
        for s in &t.steps {
            let Some((objects, review)) = &s.fixture else {
                continue;
            };
            let d = base.join(format!("step-{}", s.n));
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            for (file, text) in [("objects.yaml", objects), ("review.json", review)] {
                let p = d.join(file);
                std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
            }
        }
    }
    Ok(())
}

fn bounds_text(b: &Bounds) -> String {
    let requests = match b.max_requests {
        Some(n) => format!("at most {n} request(s) by people"),
        // The model re-roles a worker to a control plane only under a budget (see
        // `Model::reroles_workers`): never silent about it.
        None => "any number of requests by people (but no worker re-roled to a control \
                 plane: give --max-requests to explore that)"
            .to_string(),
    };
    // What the operations are and what the world does beyond the counts, when not the
    // plain case: every run says what it explored.
    let mut more = String::new();
    if b.max_operations > 0 {
        if b.rolls {
            let kind = match b.roll_kind {
                crate::verify::RollKind::Reboot => "reboots",
                crate::verify::RollKind::Upgrade => "upgrades",
            };
            more.push_str(&format!(
                ", operations are {kind} rolled over the cluster (workers {} at a time)",
                b.roll_width
            ));
        } else if b.all_kinds {
            more.push_str(", operations of every kind on one machine");
        }
    }
    if b.backups {
        more.push_str(", a TalosEtcdBackup");
    }
    if b.lifecycle {
        more.push_str(", nodes run Talos 1.13");
    }
    if b.clock {
        more.push_str(", time passes");
    }
    format!(
        "{} control-plane machines, {} workers, count 1, 3 or 5 (and every change of it), {} failure(s), \
         {} operation(s), {requests}, {} request(s) in flight, depth {}{more}",
        b.max_control_planes, b.max_workers, b.max_failures, b.max_operations, b.in_flight, b.depth
    )
}

/// The bounds that cut exploration short, in words (never silent).
fn cut_text(report: &Report) -> Option<String> {
    let ex = &report.exploration;
    let mut cuts = Vec::new();
    if let Some(why) = &ex.incomplete {
        cuts.push(why.clone());
    }
    // A depth cut is said by `incomplete` (the explorer makes it one).
    if let Some(n) = report.bounds.max_requests
        && ex.cut_by_requests > 0
    {
        cuts.push(format!(
            "the budget of {n} request(s) by people was spent in {} states: no further request \
             was explored from them (the controller, commits and failures were); raise \
             --max-requests to go further",
            ex.cut_by_requests
        ));
    }
    (!cuts.is_empty()).then(|| cuts.join("; "))
}

fn status(runs: &[Report], k: usize) -> &'static str {
    if runs
        .iter()
        .any(|r| r.exploration.violations.iter().any(|v| v.invariant == k))
    {
        "violated"
    } else if !runs
        .iter()
        .any(|r| r.exploration.at_risk.get(k).copied().unwrap_or(false))
    {
        "vacuous"
    } else {
        "holds"
    }
}

/// Rules (or steps) that never fired in any run.
fn never(lists: Vec<&Vec<String>>) -> Vec<String> {
    let Some(first) = lists.first() else {
        return Vec::new();
    };
    first
        .iter()
        .filter(|x| lists.iter().all(|l| l.contains(x)))
        .cloned()
        .collect()
}

fn interleavings(sequential: bool) -> &'static str {
    if sequential {
        "serialized requests"
    } else {
        "every interleaving"
    }
}

fn to_text(runs: &[Report], paths: &[PathBuf], procedures: &[Procedure]) -> String {
    let mut out = String::new();
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let _ = writeln!(out, "verify {}", shown.join(" "));
    for r in runs {
        let ex = &r.exploration;
        let rate = if ex.seconds > 0.0 {
            ex.keys.len() as f64 / ex.seconds
        } else {
            0.0
        };
        let _ = writeln!(out, "bounds: {}", bounds_text(&r.bounds));
        let _ = writeln!(
            out,
            "  explored {} distinct states and {} transitions in {:.1} s ({:.0} states/s); largest depth {}",
            ex.keys.len(),
            ex.transitions,
            ex.seconds,
            rate,
            ex.max_depth
        );
        if let Some(c) = cut_text(r) {
            let _ = writeln!(out, "  {c}");
        }
    }
    let Some(first) = runs.first() else {
        return out;
    };
    let _ = writeln!(out, "\ninvariants:");
    for (k, c) in first.checks.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {:<9} {} (checked under {}; {}:{})",
            status(runs, k),
            c.meta.name,
            interleavings(c.meta.sequential),
            c.meta.file,
            c.meta.line
        );
    }
    let vacuous: Vec<String> = first
        .checks
        .iter()
        .enumerate()
        .filter(|(k, _)| status(runs, *k) == "vacuous")
        .map(|(_, c)| c.meta.name.clone())
        .collect();
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let _ = writeln!(out, "\ncoverage:");
    let _ = writeln!(
        out,
        "  rules that never fired: {}",
        list(&never(runs.iter().map(|r| &r.rules_never_fired).collect()))
    );
    let _ = writeln!(
        out,
        "  plan steps that never ran: {}",
        list(&never(runs.iter().map(|r| &r.steps_never_run).collect()))
    );
    let _ = writeln!(
        out,
        "  invariants never at risk (vacuous within the bounds): {}",
        list(&vacuous)
    );
    let mut violations = 0;
    for r in runs {
        for t in &r.traces {
            violations += 1;
            let _ = writeln!(
                out,
                "\nVIOLATED: {} (checked under {}; bounds: {})\n  {}\ncounterexample ({} steps):\n  0. start: {}",
                t.invariant,
                interleavings(t.sequential),
                bounds_text(&r.bounds),
                t.message,
                t.steps.len(),
                t.start
            );
            for s in &t.steps {
                let _ = writeln!(out, "  {}. {}", s.n, s.text);
                if !s.rules.is_empty() {
                    let _ = writeln!(out, "       decided by: {}", s.rules.join(", "));
                }
                let _ = writeln!(out, "       state: {}", s.state);
            }
            if let Some(n) = t.loop_from {
                let _ = writeln!(
                    out,
                    "  a livelock: the last step is back in the state of step {n}, and the \
                     steps after it repeat forever without ending the work"
                );
            }
            if let Some(b) = &t.blocked {
                let _ = writeln!(out, "  in the last state: {b}");
            }
            if let Some(e) = &t.replay_error {
                let _ = writeln!(
                    out,
                    "  error: the counterexample could not be replayed: {e}"
                );
            }
        }
    }
    // The procedures explored beside the cluster.
    for p in procedures {
        let _ = write!(
            out,
            "\n{}: {} states, {} reconciles; ",
            p.what, p.states, p.reconciles
        );
        if p.violations.is_empty() {
            let _ = writeln!(out, "{} hold", p.invariants.join(" and "));
        }
        for (invariant, why, steps) in &p.violations {
            violations += 1;
            let _ = writeln!(
                out,
                "\nVIOLATED: {invariant} ({}): {why}\n  steps: {}",
                p.name,
                steps.join("; ")
            );
        }
    }
    if runs.iter().any(|r| r.exploration.incomplete.is_some()) {
        let _ = writeln!(
            out,
            "\nnot verified: an exploration stopped before its bounds (see its cut above)"
        );
    } else if violations == 0 {
        let _ = writeln!(
            out,
            "\nverified: every invariant holds in every explored state and transition"
        );
    } else {
        let _ = writeln!(out, "\n{violations} violation(s)");
    }
    out
}

/// `verified`, `violated`, or `incomplete` (an exploration stopped before its bounds).
fn result_word(runs: &[Report]) -> &'static str {
    if runs.iter().any(|r| !r.exploration.violations.is_empty()) {
        "violated"
    } else if runs.iter().any(|r| r.exploration.incomplete.is_some()) {
        "incomplete"
    } else {
        "verified"
    }
}

fn to_json(runs: &[Report], paths: &[PathBuf]) -> serde_json::Value {
    let Some(first) = runs.first() else {
        return serde_json::Value::Null;
    };
    let invariants: Vec<serde_json::Value> = first
        .checks
        .iter()
        .enumerate()
        .map(|(k, c)| {
            serde_json::json!({
                "name": c.meta.name,
                "file": c.meta.file,
                "line": c.meta.line,
                "sequential": c.meta.sequential,
                "checked_under": interleavings(c.meta.sequential),
                "status": status(runs, k),
            })
        })
        .collect();
    let each: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            let ex = &r.exploration;
            serde_json::json!({
                "bounds": r.bounds,
                "states": ex.keys.len(),
                "transitions": ex.transitions,
                "largest_depth": ex.max_depth,
                "seconds": ex.seconds,
                "cut": cut_text(r),
                "result": result_word(std::slice::from_ref(r)),
            })
        })
        .collect();
    let cuts: Vec<String> = runs.iter().filter_map(cut_text).collect();
    let violations: Vec<serde_json::Value> = runs
        .iter()
        .flat_map(|r| {
            r.traces.iter().map(|t| {
                let mut v = serde_json::to_value(t).unwrap_or_default();
                v["bounds"] = serde_json::to_value(r.bounds).unwrap_or_default();
                v
            })
        })
        .collect();
    serde_json::json!({
        "result": result_word(runs),
        "paths": paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "runs": each,
        "states": runs.iter().map(|r| r.exploration.keys.len()).sum::<usize>(),
        "transitions": runs.iter().map(|r| r.exploration.transitions).sum::<u64>(),
        "seconds": runs.iter().map(|r| r.exploration.seconds).fold(0.0, f64::max),
        "cut": if cuts.is_empty() { serde_json::Value::Null } else { serde_json::Value::String(cuts.join("; ")) },
        "invariants": invariants,
        "violations": violations,
        "coverage": {
            "rules_never_fired": never(runs.iter().map(|r| &r.rules_never_fired).collect()),
            "plan_steps_never_run": never(runs.iter().map(|r| &r.steps_never_run).collect()),
            "invariants_never_at_risk": first.checks.iter().enumerate()
                .filter(|(k, _)| status(runs, *k) == "vacuous")
                .map(|(_, c)| c.meta.name.clone()).collect::<Vec<_>>(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: VerifyArgs,
    }

    /// One run that panicked fails them all: the others' reports are not a proof of the
    /// bounds that run had.
    #[test]
    fn a_run_that_panicked_fails_the_whole_verify() {
        // The default suite's bounds, run through the pool: every run is given back at its
        // place in the suite (whatever order the pool took them in), a panicking one as a
        // panic, and the others still run.
        let runs = suite_of(&[]);
        let k = runs
            .iter()
            .position(|b| b.in_flight > 0)
            .expect("an in-flight run");
        let ran = std::sync::Mutex::new(Vec::new());
        let outcomes = run_all(&runs, |b, threads| {
            assert!(threads >= 1);
            let at = runs.iter().position(|r| r == b).expect("one of the suite");
            ran.lock().expect("lock").push(at);
            if at == k {
                panic!("run {at}");
            }
            at
        });
        assert_eq!(outcomes.len(), runs.len());
        let mut ran = ran.into_inner().expect("lock");
        // The runs with requests in flight (the largest) are taken first.
        assert!(runs[ran[0]].in_flight > 0, "{ran:?}");
        ran.sort_unstable();
        assert_eq!(ran, (0..runs.len()).collect::<Vec<_>>());
        for (at, o) in outcomes.iter().enumerate() {
            match o {
                Ok(v) => assert_eq!(*v, at),
                Err(_) => assert_eq!(at, k),
            }
        }
        assert_eq!(all_finished(outcomes), Err(k));
        let fine: Vec<std::thread::Result<u32>> = vec![Ok(4), Ok(5)];
        assert_eq!(all_finished(fine), Ok(vec![4, 5]));
    }

    fn suite_of(argv: &[&str]) -> Vec<Bounds> {
        let cli = Cli::try_parse_from(std::iter::once("verify").chain(argv.iter().copied()))
            .expect("parses");
        suite(&cli.args)
    }

    /// The default suite reaches every bound `verify` is specified with: 6 control-plane
    /// machines, 2 workers, a failure, 2 operations, a request in flight; and a small
    /// cluster under any number of requests.
    #[test]
    fn the_default_suite_covers_the_specified_bounds() {
        let runs = suite_of(&[]);
        let six: Vec<&Bounds> = runs.iter().filter(|b| b.max_control_planes == 6).collect();
        assert!(six.iter().any(|b| b.max_workers >= 2));
        assert!(six.iter().any(|b| b.max_failures >= 1));
        assert!(six.iter().any(|b| b.max_operations >= 2));
        assert!(six.iter().any(|b| b.in_flight >= 1));
        assert!(six.iter().all(|b| b.max_requests.is_some_and(|n| n >= 2)));
        // Count 5 with the two failures five members tolerate.
        assert!(
            runs.iter()
                .any(|b| b.max_control_planes >= 5 && b.max_failures >= 2)
        );
        // An operation among five members with two failures (`one-member-down`).
        assert!(
            runs.iter()
                .any(|b| b.max_control_planes >= 5 && b.max_failures >= 2 && b.max_operations >= 1)
        );
        assert!(runs.iter().any(|b| b.max_control_planes == 4
            && b.max_failures >= 1
            && b.max_requests.is_some_and(|n| n >= 3)));
        // A roll over the cluster, with a worker and a failure.
        assert!(runs.iter().any(|b| b.rolls
            && b.max_operations >= 1
            && b.max_workers >= 1
            && b.max_failures >= 1));
        let rolls = suite_of(&["--rolls"]);
        assert_eq!(rolls.len(), 1);
        assert!(rolls[0].rolls && rolls[0].max_operations == 1);
        let unbounded: Vec<&Bounds> = runs.iter().filter(|b| b.max_requests.is_none()).collect();
        assert!(unbounded.iter().any(|b| b.max_failures >= 1));
        assert!(unbounded.iter().any(|b| b.in_flight >= 1));
        assert!(runs.iter().all(|b| b.depth == 64));
        // Any bound given: one run, the rest from SINGLE.
        let one = suite_of(&["--max-control-planes", "6", "--max-requests", "4"]);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].max_requests, Some(4));
        assert_eq!(one[0].max_workers, SINGLE.max_workers);
        assert_eq!(suite_of(&["--max-workers", "0"])[0].max_requests, None);
    }
}
