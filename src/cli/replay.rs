//! `ichor-rules replay LOG [--rules PATH] [--format human|json]`: decides every decision
//! record of a log again from the facts it holds.
//!
//! A record whose rule-set digest is the digest of `--rules` (default `rules/`) is
//! reproduced: the same rules in audit mode as when it was decided, and every verdict,
//! deciding rule, warning and match must come out the same (a difference is a bug: exit 1).
//! A record decided by other rules is an error without `--rules` (the log names rules that
//! are not at hand); with `--rules NEW` it is decided by NEW, and the decisions whose
//! verdict, or would-be verdict (what its rules in audit mode would have decided), would
//! change are reported, grouped by direction (refuse → allow first) and by rule.
//! `--audit-rule` / `--enforce-rule` switch rules of the rules given as `serve` switches
//! them ([`crate::runtime::reload::apply_modes`]): a record decided by the same text under
//! other modes is then compared, not reproduced. Records refused before the rules were
//! asked are counted and skipped, and so are the controller's step records (an effect, not
//! a decision: the controller decision each followed is a record of its own, replayed like
//! the webhook's).

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, Format, emit};
use crate::runtime::records::{self, Record, ReplayError, Replayed};
use clap::Args;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The decision log: NDJSON as `serve --decision-log` writes it (other lines, such as
    /// log lines on a shared stderr, are skipped).
    pub log: PathBuf,
    /// The rules to decide with (files or folders; default `rules/`). Records decided by
    /// these rules (the same digest) must reproduce exactly; records decided by other rules
    /// are an error unless this is given, and then report what would change.
    #[arg(long = "rules", value_name = "PATH")]
    pub rules: Vec<PathBuf>,
    /// Decide with this rule in audit mode whatever its text says, as `serve --audit-rule`
    /// runs it (the chart's `rules.audit`). Repeatable. A record decided by the same rules
    /// in other modes is compared, not reproduced.
    #[arg(long, value_name = "RULE")]
    pub audit_rule: Vec<String>,
    /// Decide with this rule enforced even when its text says `audit`, as `serve
    /// --enforce-rule` (the chart's `rules.enforce`). Repeatable; a rule named by both is
    /// enforced.
    #[arg(long, value_name = "RULE")]
    pub enforce_rule: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
}

/// A decision whose verdict, or would-be verdict, the proposed rules change.
#[derive(Clone, Debug, Serialize)]
struct Changed {
    id: String,
    /// `KIND NAMESPACE/NAME` and the request's uid, or the site.
    what: String,
    from: String,
    to: String,
    /// The would-be verdicts (the rules in audit mode enforced), recorded and replayed.
    would_from: String,
    would_to: String,
}

/// A record the same rules did not decide the same way.
#[derive(Clone, Debug, Serialize)]
struct Mismatch {
    id: String,
    recorded: Replayed,
    replayed: Replayed,
}

#[derive(Debug, Default, Serialize)]
struct Report {
    decisions: usize,
    digest: String,
    reproduced: usize,
    mismatches: Vec<Mismatch>,
    /// Decided by other rules, then by these: how many.
    compared: usize,
    /// Direction (`refuse -> allow`), then rule, then the decisions.
    changes: Vec<ChangeGroup>,
    unreplayable: Vec<Unreplayable>,
    skipped_without_rules: usize,
    /// The controller's step records (`"record": "step"`): effects, not decisions.
    skipped_steps: usize,
}

/// The decisions a rule changes in one direction: the enforced verdict `from` -> `to`,
/// the would-be verdict `would_from` -> `would_to` (equal to the enforced ones unless a
/// rule in audit mode decided more). A decision whose enforced verdict stays and whose
/// would-be verdict changes (a rule in audit mode that now would refuse it) is a group of
/// its own, after those whose enforced verdict changes.
#[derive(Debug, Serialize)]
struct ChangeGroup {
    from: String,
    to: String,
    would_from: String,
    would_to: String,
    rule: String,
    decisions: Vec<Changed>,
}

impl ChangeGroup {
    /// The direction in words: `refuse -> allow`, `refuse -> allow (would refuse)`,
    /// `allow -> allow (would refuse)`.
    fn direction(&self) -> String {
        let side = |verdict: &str, would: &str| {
            if verdict == would {
                verdict.to_string()
            } else {
                format!("{verdict} (would {would})")
            }
        };
        format!(
            "{} -> {}",
            side(&self.from, &self.would_from),
            side(&self.to, &self.would_to)
        )
    }
}

#[derive(Debug, Serialize)]
struct Unreplayable {
    id: String,
    why: String,
    /// Under the rules that decided it: it had to reproduce, so this is a failure (exit 1).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    own_rules: bool,
}

/// The order directions are reported in: what the change lets through first.
fn direction_rank(from: &str, to: &str) -> u8 {
    match (from, to) {
        ("refuse", "allow") => 0,
        ("hold", "allow") => 1,
        ("refuse", "hold") => 2,
        ("hold", "refuse") => 3,
        ("allow", "hold") => 4,
        ("allow", "refuse") => 5,
        _ => 6,
    }
}

/// Where a change is reported: first the changes of the enforced verdict (by
/// [`direction_rank`]; within one, a change the new rules would still not make when their
/// rules in audit mode were enforced after one they would), then the changes of the
/// would-be verdict alone (by [`direction_rank`] of the would-be verdicts).
fn group_rank(recorded: &Replayed, replayed: &Replayed) -> (u8, u8, bool) {
    if recorded.verdict == replayed.verdict {
        (
            1,
            direction_rank(&recorded.would_verdict, &replayed.would_verdict),
            false,
        )
    } else {
        (
            0,
            direction_rank(&recorded.verdict, &replayed.verdict),
            replayed.would_verdict != replayed.verdict
                || recorded.would_verdict != recorded.verdict,
        )
    }
}

/// The rules responsible for a change: for a change to `allow`, the rules that decided it
/// and no longer do; otherwise the rules that now decide. Of the enforced verdict when it
/// changes, else of the would-be verdict.
fn responsible(recorded: &Replayed, replayed: &Replayed) -> Vec<String> {
    let (to, old, new) = if recorded.verdict == replayed.verdict {
        (
            &replayed.would_verdict,
            &recorded.would_deciding,
            &replayed.would_deciding,
        )
    } else {
        (&replayed.verdict, &recorded.deciding, &replayed.deciding)
    };
    let rules = if to == "allow" { old } else { new };
    if rules.is_empty() {
        vec!["(none)".to_string()]
    } else {
        rules.clone()
    }
}

fn describe(r: &Record) -> String {
    match &r.request {
        Some(q) => format!(
            "{} {} {}/{} (uid {})",
            q.operation, q.kind, q.namespace, q.name, q.uid
        ),
        None => format!("at the {}", r.site),
    }
}

pub fn run(args: &ReplayArgs) -> u8 {
    let text = match std::fs::read_to_string(&args.log) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", args.log.display());
            return EXIT_BAD_INPUT;
        }
    };
    let log = match records::read_log(&text) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {}: {e}", args.log.display());
            return EXIT_BAD_INPUT;
        }
    };
    let explicit = !args.rules.is_empty();
    let paths = super::default_paths(args.rules.clone());
    let set = match crate::ruleset::load(&paths) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let digest = records::digest(&set.files);
    // The rules given, as errors name them.
    let named = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(mut table) = set
        .table
        .filter(|_| set.diagnostics.iter().all(|d| !d.is_error()))
    else {
        eprintln!(
            "error: the rules do not check ({} error(s)); `ichor-rules check` shows them",
            set.diagnostics.iter().filter(|d| d.is_error()).count()
        );
        return EXIT_BAD_INPUT;
    };
    table.digest.clone_from(&digest);
    // The switches, as `serve` applies them; one naming no rule is an error (a typo would
    // otherwise compare the rules unswitched).
    let switches = crate::runtime::reload::rule_modes(&args.audit_rule, &args.enforce_rule);
    let unknown = crate::runtime::reload::apply_modes(&mut table, &switches);
    if !unknown.is_empty() {
        for (rule, audit) in &unknown {
            eprintln!(
                "error: {} in {}",
                crate::runtime::reload::unknown_rule(rule, *audit),
                named
            );
        }
        return EXIT_BAD_INPUT;
    }
    // The modes the rules given decide in: their text's, switched.
    let written: Vec<(String, bool)> = table
        .rules
        .iter()
        .map(|r| (r.name.clone(), r.audit))
        .collect();
    let mut report = Report {
        decisions: log.len(),
        skipped_steps: crate::runtime::step_records::count_steps(&text),
        digest: digest.clone(),
        ..Report::default()
    };
    let proposed_audit: BTreeSet<&str> = written
        .iter()
        .filter(|(_, audit)| *audit)
        .map(|(name, _)| name.as_str())
        .collect();
    type Key = ((u8, u8, bool), [String; 4], String);
    let mut groups: BTreeMap<Key, Vec<Changed>> = BTreeMap::new();
    for record in &log {
        // Decided by these rules: reproduced in the modes it was decided in. With switches,
        // only when those are the modes the switches give; otherwise compared.
        let same = record.rules.digest == digest
            && (switches.is_empty()
                || record
                    .rules
                    .audit
                    .iter()
                    .map(String::as_str)
                    .collect::<BTreeSet<&str>>()
                    == proposed_audit);
        if record.rules.digest != digest && !explicit && record.refused_without_rules.is_none() {
            eprintln!(
                "error: decision {} was decided by rules {}, and {} are {digest}; pass the rules it \
                 names with --rules to reproduce it, or the rules to compare with (`--rules PATH` \
                 reports what they would decide differently)",
                record.id,
                if record.rules.digest.is_empty() {
                    "(unknown)"
                } else {
                    &record.rules.digest
                },
                named
            );
            return EXIT_BAD_INPUT;
        }
        // The modes it was decided with (same rules), or the proposal's: as the rules text
        // says, switched.
        for (name, audit) in &written {
            let audit = if same {
                record.rules.audit.contains(name)
            } else {
                *audit
            };
            table.set_audit(name, audit);
        }
        let replayed = match records::replay(&table, record) {
            Ok(r) => r,
            Err(ReplayError::WithoutRules(_)) => {
                report.skipped_without_rules += 1;
                continue;
            }
            Err(e) => {
                report.unreplayable.push(Unreplayable {
                    id: record.id.clone(),
                    why: e.to_string(),
                    own_rules: same,
                });
                continue;
            }
        };
        let recorded = Replayed::of_record(record);
        if same {
            if replayed == recorded {
                report.reproduced += 1;
            } else {
                report.mismatches.push(Mismatch {
                    id: record.id.clone(),
                    recorded,
                    replayed,
                });
            }
            continue;
        }
        report.compared += 1;
        if replayed.verdict == recorded.verdict && replayed.would_verdict == recorded.would_verdict
        {
            continue;
        }
        let changed = Changed {
            id: record.id.clone(),
            what: describe(record),
            from: recorded.verdict.clone(),
            to: replayed.verdict.clone(),
            would_from: recorded.would_verdict.clone(),
            would_to: replayed.would_verdict.clone(),
        };
        for rule in responsible(&recorded, &replayed) {
            let direction = [
                changed.from.clone(),
                changed.to.clone(),
                changed.would_from.clone(),
                changed.would_to.clone(),
            ];
            groups
                .entry((group_rank(&recorded, &replayed), direction, rule))
                .or_default()
                .push(changed.clone());
        }
    }
    report.changes = groups
        .into_iter()
        .map(
            |((_, [from, to, would_from, would_to], rule), decisions)| ChangeGroup {
                from,
                to,
                would_from,
                would_to,
                rule,
                decisions,
            },
        )
        .collect();
    let out = match args.format {
        Format::Json => serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
        Format::Human => human(&report),
    };
    if let Err(code) = emit(&out) {
        return code;
    }
    // Under the rules that decided them, every record reproduces: a difference, or a record
    // that cannot be decided again from what it holds, is a failure.
    if report.mismatches.is_empty() && !report.unreplayable.iter().any(|u| u.own_rules) {
        EXIT_OK
    } else {
        EXIT_FINDINGS
    }
}

fn human(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "replayed {} decision(s) with rules {}: {} reproduced, {} compared with other rules",
        r.decisions, r.digest, r.reproduced, r.compared
    );
    for m in &r.mismatches {
        let _ = writeln!(
            out,
            "MISMATCH {}: recorded {} {:?}, replayed {} {:?} (the same rules decided differently: a bug)",
            m.id, m.recorded.verdict, m.recorded.matched, m.replayed.verdict, m.replayed.matched
        );
    }
    let changed: std::collections::BTreeSet<&str> = r
        .changes
        .iter()
        .flat_map(|g| g.decisions.iter().map(|d| d.id.as_str()))
        .collect();
    if !r.changes.is_empty() {
        let _ = writeln!(out, "{} decision(s) would change:", changed.len());
    }
    let mut last: Option<String> = None;
    for g in &r.changes {
        let direction = g.direction();
        if last.as_deref() != Some(direction.as_str()) {
            let n: std::collections::BTreeSet<&str> = r
                .changes
                .iter()
                .filter(|x| x.direction() == direction)
                .flat_map(|x| x.decisions.iter().map(|d| d.id.as_str()))
                .collect();
            let _ = writeln!(out, "{direction} ({})", n.len());
            last = Some(direction);
        }
        let _ = writeln!(out, "  {} ({})", g.rule, g.decisions.len());
        for d in &g.decisions {
            let _ = writeln!(out, "    {} {}", d.id, d.what);
        }
    }
    if r.skipped_steps > 0 {
        let _ = writeln!(
            out,
            "skipped {} controller step record(s): a step is an effect, not a decision (the \
             decision it followed, named in its `decision`, is replayed)",
            r.skipped_steps
        );
    }
    for u in &r.unreplayable {
        if u.own_rules {
            let _ = writeln!(
                out,
                "MISMATCH {}: cannot be decided again by the rules that decided it: {} (a bug, \
                 or a record edited)",
                u.id, u.why
            );
        } else {
            let _ = writeln!(out, "cannot replay {}: {}", u.id, u.why);
        }
    }
    if r.skipped_without_rules > 0 {
        let _ = writeln!(
            out,
            "{} decision(s) refused before the rules were asked (nothing to replay)",
            r.skipped_without_rules
        );
    }
    out
}
