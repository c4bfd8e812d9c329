//! The decisions the instruction-count guard measures (`scripts/counts.sh`), one per run:
//! `decide-counts <case> <n>` decides `case` `n` times inside [`measured`], which the script
//! has callgrind count alone (`--toggle-collect`), so a count per decision is the total
//! over `n`, independent of the machine's load. `decide-counts list` names the cases.
//!
//! Each case first checks that it decides what its name says (allowed: no row fires;
//! refused: one does). Built with `--features counts` (language only, no runtime).

// Benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/fixed.rs"]
mod fixed;
#[path = "../support/generated.rs"]
mod generated;

use fixed::{APPROVE_CP, FIVE_OF_THREE, Fixed, REMOVE_CP, THREE_OF_THREE};
use ichor_rules::compile::Table;
use ichor_rules::interp::Session;
use ichor_rules::vocab::Event;
use std::hint::black_box;

/// (name, rules, flat, facts, event, rows that fire)
type Case = (
    &'static str,
    fn() -> Vec<ichor_rules::diagnostics::SourceFile>,
    bool,
    Fixed,
    Event,
    usize,
);

const CASES: &[Case] = &[
    (
        "shipped_allow",
        fixed::shipped,
        true,
        FIVE_OF_THREE,
        REMOVE_CP,
        0,
    ),
    (
        "shipped_refuse",
        fixed::shipped,
        true,
        THREE_OF_THREE,
        REMOVE_CP,
        1,
    ),
    (
        "shipped_allow_stack",
        fixed::shipped,
        false,
        FIVE_OF_THREE,
        REMOVE_CP,
        0,
    ),
    (
        "shipped_refuse_stack",
        fixed::shipped,
        false,
        THREE_OF_THREE,
        REMOVE_CP,
        1,
    ),
    (
        "two_approve_allow",
        fixed::two_rules,
        true,
        THREE_OF_THREE,
        APPROVE_CP,
        0,
    ),
    (
        "two_approve_refuse",
        fixed::two_rules,
        true,
        FIVE_OF_THREE,
        APPROVE_CP,
        1,
    ),
    (
        "two_remove_allow",
        fixed::two_rules,
        true,
        FIVE_OF_THREE,
        REMOVE_CP,
        0,
    ),
    (
        "two_remove_refuse",
        fixed::two_rules,
        true,
        THREE_OF_THREE,
        REMOVE_CP,
        1,
    ),
];

/// What callgrind counts: `n` decisions, each a new session and one event, as the
/// `decide/` benches time them.
#[inline(never)]
fn measured(table: &Table, facts: Fixed, event: Event, n: u64) -> usize {
    let mut fired = 0;
    for _ in 0..n {
        let hits = Session::new(black_box(table), black_box(facts)).matches(black_box(event));
        fired += black_box(hits).map_or(usize::MAX, |h| h.len());
    }
    fired
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("list") {
        for (name, ..) in CASES {
            println!("{name}");
        }
        return;
    }
    // `decide-counts text <rules>`: prints the generated file of `<rules>` rules (to time
    // `ichor-rules check` on it).
    if args.first().map(String::as_str) == Some("text") {
        let rules = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(1000);
        print!("{}", generated::generated(rules, false).text);
        return;
    }
    // `decide-counts build <file> <n>`: builds a rule file as `serve` does, `n` times (to
    // profile the front end: `valgrind --tool=callgrind decide-counts build ...`).
    if args.first().map(String::as_str) == Some("build") {
        let (Some(path), Some(n)) = (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok()))
        else {
            eprintln!("usage: decide-counts build <file> <n>");
            std::process::exit(2);
        };
        let files = match path.strip_prefix("generated:") {
            // `generated:1000`: the front end bench's generated file of 1,000 rules.
            Some(rules) => vec![generated::generated(
                rules.parse().expect("a number"),
                false,
            )],
            None => ichor_rules::ruleset::read_sources(&[path.into()]).expect("readable"),
        };
        for _ in 0..n {
            black_box(ichor_rules::ruleset::build_serving_here(black_box(
                files.clone(),
            )));
        }
        return;
    }
    let (Some(name), Some(n)) = (
        args.first(),
        args.get(1).and_then(|n| {
            if n == "dump" {
                Some(0)
            } else {
                n.parse::<u64>().ok()
            }
        }),
    ) else {
        eprintln!("usage: decide-counts list | decide-counts <case> <n>");
        std::process::exit(2);
    };
    let Some(&(_, rules, flat, facts, event, fires)) = CASES.iter().find(|c| c.0 == name) else {
        eprintln!("no case {name}; `decide-counts list` names them");
        std::process::exit(2);
    };
    let table = fixed::table(&rules(), flat);
    // `decide-counts <case> dump`: the group's flat program, one instruction a line.
    if args.get(1).map(String::as_str) == Some("dump") {
        if let Some((rows, program)) = table.group(event.0, event.1, event.2) {
            println!("{} rows, entries {:?}", rows.len(), program.entries);
            for (pc, i) in program.ins.iter().enumerate() {
                println!("{pc:3} {i:?}");
            }
        }
        return;
    }
    let (rows, on_stack) = table.rows_on_stack();
    assert_eq!(
        on_stack,
        if flat { 0 } else { rows },
        "{name}: rows where expected"
    );
    let once = Session::new(&table, facts).matches(event).map(|h| h.len());
    assert_eq!(once, Ok(fires), "{name} decides as named");
    let fired = measured(&table, facts, event, n);
    assert_eq!(fired as u64, fires as u64 * n, "{name} decides as named");
}
