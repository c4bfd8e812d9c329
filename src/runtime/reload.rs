//! Rules that reload when their files change. A new table replaces the serving one only
//! when `ichor-rules check` accepts the files (no errors, lints on) *and* every event the
//! runtime produces is covered by a rule or an `allow`: a broken, emptied or weakened edit
//! never opens the gate. A refused edit keeps the previous table serving and is reported.
//!
//! `serve` calls [`Rules::reload`] only on a thread of its own ([`Reloader`],
//! [`on_reload_thread`]) whose stack is [`RELOAD_STACK`], never on the async workers that
//! answer admission requests: a slow or deep rule file delays the reload, not the answers.
//! (The front end itself parses, checks and compiles on a thread with its own known stack,
//! `ruleset::FRONT_END_STACK`; the reload thread's stack is a margin in case it
//! ever does not.) A panic while checking is caught and refuses the edit; a rule set
//! larger than [`MAX_RULES_BYTES`] is refused before it is parsed.

use crate::compile::Table;
use crate::ruleset::{LoadError, build_serving_here, read_sources_within};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, mpsc};
use std::time::{Duration, SystemTime};

/// The stack of the thread that reloads rules (64 MiB of address space; only the pages
/// used are committed). Recursion in the front end is bounded by its nesting limit; this
/// leaves a wide margin over it, where a tokio worker (2 MiB) would not.
pub const RELOAD_STACK: usize = 64 * 1024 * 1024;

/// The most rule text a reload reads, all files together (8 MiB; a ConfigMap holds at
/// most 1 MiB). A larger set is refused without being parsed.
pub const MAX_RULES_BYTES: u64 = 8 * 1024 * 1024;

/// The lint that names an event the runtime produces and no rule or `allow` covers. A
/// warning for `check`; a refusal for a reload (the event would be allowed unguarded).
pub const UNCOVERED_EVENT: crate::diagnostics::Code = crate::diagnostics::Code::UncoveredEvent;

/// How many diagnostics a refusal lists (the count says how many there were).
const LISTED: usize = 20;

/// The serving table and where it comes from.
pub struct Rules {
    paths: Vec<PathBuf>,
    /// Rules the deployment switches to audit (`true`) or enforce (`false`) whatever their
    /// text says (`serve --audit-rule`, `--enforce-rule`).
    modes: Vec<(String, bool)>,
    table: RwLock<Option<Arc<Table>>>,
    /// The fingerprint of the files last looked at, accepted or not.
    fingerprint: Mutex<Option<u64>>,
    status: Mutex<Status>,
    /// The digests (`records::digest`) of the tables this process has served, the newest
    /// last, at most [`DIGESTS_KEPT`]: what an admission's digest must be one of to be
    /// linked (`step_records::Admission::check`).
    loaded: Mutex<std::collections::VecDeque<String>>,
}

/// How many digests of tables served are remembered ([`Rules::loaded_digests`]).
pub const DIGESTS_KEPT: usize = 16;

/// What serves, and whether the newest files were refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// The fingerprint of the files the serving table was built from.
    pub serving: Option<u64>,
    /// When the serving table was built.
    pub loaded_at: Option<SystemTime>,
    /// Rows of the serving table.
    pub rows: usize,
    /// The files as they are now were refused: an older table (or none) serves.
    pub refused: bool,
    /// The digest of the serving table's text (`records::digest`; empty: none serves).
    pub digest: String,
    /// The serving table's warnings (see [`Reload::Replaced`]).
    pub warnings: Vec<String>,
    /// The `refuse` rules on a destructive event that the serving table has in audit mode
    /// (written so, or switched by `--audit-rule`): safety rules that refuse nothing.
    pub audit_destructive: Vec<String>,
}

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files did not change.
    Unchanged,
    /// A new table serves. `warnings`: one line each (also logged at `warn`), what the
    /// operator must know of it: a `refuse` rule on a destructive event in audit mode (a
    /// safety rule switched to audit by `--audit-rule`, the chart's `rules.audit`, or
    /// written so), which refuses nothing.
    Replaced { rows: usize, warnings: Vec<String> },
    /// The files changed but are refused (they do not check, leave a runtime event
    /// uncovered, have no rule of a name switched to audit or enforce, cannot be read, are
    /// too large, or checking them panicked); the old table
    /// keeps serving. `reason` is one line naming the first findings; `diagnostics` lists
    /// them, one an entry (at most 20, then how many more).
    Rejected {
        reason: String,
        diagnostics: Vec<String>,
    },
}

impl Reload {
    fn refused(reason: impl Into<String>, diagnostics: Vec<String>) -> Reload {
        Reload::Rejected {
            reason: reason.into(),
            diagnostics,
        }
    }
}

impl Rules {
    pub fn new(paths: Vec<PathBuf>) -> Rules {
        Rules {
            paths,
            modes: Vec::new(),
            table: RwLock::new(None),
            fingerprint: Mutex::new(None),
            status: Mutex::new(Status::default()),
            loaded: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// Switches the named rules to audit (`true`) or enforce (`false`) in every table this
    /// loads, whatever their text says. Rules with no rule of a name switched are refused
    /// (at start, `serve` does not start; later, the old table keeps serving).
    pub fn with_modes(mut self, modes: Vec<(String, bool)>) -> Rules {
        self.modes = modes;
        self
    }

    /// The files or folders the rules are read from.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The table serving now, if one ever loaded.
    pub fn current(&self) -> Option<Arc<Table>> {
        self.table.read().ok().and_then(|t| t.clone())
    }

    /// The digests of the tables this process has served (the one serving now, then the
    /// ones it served before, newest first; at most [`DIGESTS_KEPT`]): the rule sets it
    /// knows. A restarted process knows only what it loaded since.
    pub fn loaded_digests(&self) -> Vec<String> {
        self.loaded
            .lock()
            .map(|l| l.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    /// What serves now, for metrics.
    pub fn status(&self) -> Status {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Reads the files; builds and swaps in a new table when they changed and are
    /// accepted (see the module comment). A refused version is remembered by its
    /// fingerprint, so it is reported once, not at every poll.
    pub fn reload(&self) -> Reload {
        let (fp, outcome) = match read_sources_within(&self.paths, MAX_RULES_BYTES) {
            Ok(files) => {
                let mut h = DefaultHasher::new();
                for f in &files {
                    f.path.hash(&mut h);
                    f.text.hash(&mut h);
                }
                let fp = h.finish();
                if self.seen(fp) {
                    return Reload::Unchanged;
                }
                (fp, self.accept(fp, files))
            }
            Err(e) => {
                let mut h = DefaultHasher::new();
                e.to_string().hash(&mut h);
                let fp = h.finish();
                if self.seen(fp) {
                    return Reload::Unchanged;
                }
                (fp, refused_to_read(&e))
            }
        };
        if let Ok(mut last) = self.fingerprint.lock() {
            *last = Some(fp);
        }
        if let Ok(mut s) = self.status.lock() {
            s.refused = matches!(outcome, Reload::Rejected { .. });
        }
        outcome
    }

    fn seen(&self, fp: u64) -> bool {
        self.fingerprint.lock().is_ok_and(|last| *last == Some(fp))
    }

    /// Checks (the lints serving needs: `ruleset::build_serving_here`, on this thread,
    /// which is the reload thread with its [`RELOAD_STACK`]) and compiles; swaps the table
    /// in when it is accepted.
    fn accept(&self, fp: u64, files: Vec<crate::diagnostics::SourceFile>) -> Reload {
        let digest = super::records::digest(&files);
        let set = match catch_unwind(AssertUnwindSafe(|| build_serving_here(files))) {
            Ok(set) => set,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                return Reload::refused(
                    format!("checking the rules panicked ({what}); this is a bug in ichor-rules"),
                    Vec::new(),
                );
            }
        };
        let blocking: Vec<&crate::diagnostics::Diagnostic> = set
            .diagnostics
            .iter()
            .filter(|d| d.is_error() || d.code == UNCOVERED_EVENT)
            .collect();
        if set.files.is_empty() {
            return Reload::refused("no rule files", Vec::new());
        }
        let mut table = match set.table {
            Some(table) if blocking.is_empty() => table,
            _ => {
                let errors = set.errors();
                let uncovered = blocking.len() - errors;
                let mut listed: Vec<String> = blocking
                    .iter()
                    .take(LISTED)
                    .map(|d| {
                        let file = set.files.get(d.file);
                        let path = file.map(|f| f.display_path()).unwrap_or_default();
                        let (line, col) = file.map(|f| f.line_col(d.span.start)).unwrap_or((0, 0));
                        if d.code == UNCOVERED_EVENT {
                            format!("{}: {}", d.code, d.message)
                        } else {
                            format!("{path}:{line}:{col}: {}: {}", d.code, d.message)
                        }
                    })
                    .collect();
                if blocking.len() > LISTED {
                    listed.push(format!("… and {} more", blocking.len() - LISTED));
                }
                let first = listed
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ");
                let reason = match (errors, uncovered) {
                    (0, n) => format!(
                        "{n} runtime event(s) no rule or `allow` covers (they would be allowed unguarded): {first}"
                    ),
                    (e, _) => format!("{e} error(s): {first}"),
                };
                return Reload::refused(reason, listed);
            }
        };
        let rows = table.row_count();
        table.digest.clone_from(&digest);
        // A switch naming no rule of these rules (a typo in the chart's `rules.audit`, a
        // rule renamed since) is refused like a rule that does not check: the deployment
        // asked for a mode these rules cannot give, and serving them would quietly do less
        // than it asked (an enforce switch lost leaves an `audit` rule refusing nothing).
        let unknown: Vec<String> = apply_modes(&mut table, &self.modes)
            .into_iter()
            .map(|(rule, audit)| unknown_rule(&rule, audit))
            .collect();
        if let Some(first) = unknown.first() {
            let reason = format!(
                "{first}{}: fix the rule's name in the chart's `rules.audit`/`rules.enforce` \
                 (`--audit-rule`/`--enforce-rule`) or restore the rule",
                match unknown.len() {
                    1 => String::new(),
                    n => format!(" (and {} more)", n - 1),
                }
            );
            return Reload::refused(reason, unknown);
        }
        let mut warnings = Vec::new();
        // A safety rule in audit mode refuses nothing: never silently (`check` warns of one
        // written so; one switched by the deployment is seen only here).
        let mut audit_destructive = Vec::new();
        for (rule, verb, subject) in table.audit_destructive() {
            let switched = self.modes.iter().any(|(n, a)| *a && *n == rule.name);
            let by = if switched {
                "switched to audit by the deployment (`--audit-rule`, the chart's `rules.audit`)"
            } else {
                "written `audit` in its text"
            };
            tracing::warn!(
                rule = %rule.name,
                event = %format!("{} {}", verb.name(), subject.name()),
                switched,
                "a safety rule is in audit mode: it refuses nothing, its refusals are only recorded"
            );
            warnings.push(format!(
                "rule `{}` refuses `{} {}` and is in audit mode, {by}: it refuses nothing; \
                 enforce it (`rules.enforce`, `--enforce-rule`) unless that is what you want",
                rule.name,
                verb.name(),
                subject.name()
            ));
            audit_destructive.push(rule.name.clone());
        }
        if let Ok(mut t) = self.table.write() {
            *t = Some(Arc::new(table));
        }
        if let Ok(mut loaded) = self.loaded.lock() {
            loaded.retain(|d| *d != digest);
            loaded.push_back(digest.clone());
            while loaded.len() > DIGESTS_KEPT {
                loaded.pop_front();
            }
        }
        if let Ok(mut s) = self.status.lock() {
            s.serving = Some(fp);
            s.loaded_at = Some(SystemTime::now());
            s.rows = rows;
            s.digest = digest;
            s.warnings.clone_from(&warnings);
            s.audit_destructive = audit_destructive;
        }
        Reload::Replaced { rows, warnings }
    }
}

/// The modes `serve` and `replay` switch rules to, from their `--audit-rule` and
/// `--enforce-rule` flags: each audit one, then each enforce one, so that a rule named by
/// both is enforced ([`apply_modes`] applies them in order).
pub fn rule_modes(audit: &[String], enforce: &[String]) -> Vec<(String, bool)> {
    audit
        .iter()
        .map(|r| (r.clone(), true))
        .chain(enforce.iter().map(|r| (r.clone(), false)))
        .collect()
}

/// Switches the named rules of `table` to audit (`true`) or enforce (`false`), in order,
/// whatever their text says. Returns the switches that name no rule of the table (their
/// name and mode), in order: `serve` logs them, `replay` refuses them.
pub fn apply_modes(table: &mut Table, modes: &[(String, bool)]) -> Vec<(String, bool)> {
    let mut unknown = Vec::new();
    for (rule, audit) in modes {
        if !table.set_audit(rule, *audit) {
            unknown.push((rule.clone(), *audit));
        }
    }
    unknown
}

fn mode_name(audit: bool) -> &'static str {
    if audit { "audit" } else { "enforce" }
}

/// What is wrong with a switch naming no rule: `--audit-rule NAME: no rule has this name`.
pub fn unknown_rule(rule: &str, audit: bool) -> String {
    format!("--{}-rule {rule}: no rule has this name", mode_name(audit))
}

fn refused_to_read(e: &LoadError) -> Reload {
    Reload::refused(e.to_string(), vec![e.to_string()])
}

/// Runs `f` on a fresh thread with a [`RELOAD_STACK`] stack and waits for it. `Err` when
/// the thread cannot be started or `f` panicked.
pub fn on_reload_thread<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, String> {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("ichor-rules-reload".into())
            .stack_size(RELOAD_STACK)
            .spawn_scoped(scope, f)
            .map_err(|e| format!("cannot start the reload thread: {e}"))?;
        handle
            .join()
            .map_err(|_| "the reload thread panicked".to_string())
    })
}

/// A thread that polls the rules (and whatever else `poll` looks at) every `interval`,
/// on a [`RELOAD_STACK`] stack; it stops when this is dropped (after the poll in
/// progress, which nothing waits for).
pub struct Reloader {
    _stop: mpsc::Sender<()>,
}

impl Reloader {
    /// Starts the thread; `poll` runs once per interval, first after one interval.
    pub fn start(
        interval: Duration,
        mut poll: impl FnMut() + Send + 'static,
    ) -> Result<Reloader, String> {
        let (stop, stopped) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("ichor-rules-reload".into())
            .stack_size(RELOAD_STACK)
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    // A panic is reported by the panic hook; the next poll tries again.
                    let _ = catch_unwind(AssertUnwindSafe(&mut poll));
                }
            })
            .map_err(|e| format!("cannot start the reload thread: {e}"))?;
        Ok(Reloader { _stop: stop })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_poll_that_panics_does_not_end_the_reloads() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let reloader = Reloader::start(Duration::from_millis(10), move || {
            if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("the first poll fails");
            }
        })
        .expect("starts");
        for _ in 0..500 {
            if calls.load(Ordering::SeqCst) >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(reloader);
        assert!(
            calls.load(Ordering::SeqCst) >= 3,
            "polls went on after a panic"
        );
    }

    /// The reload of `rules/` with `modes`, and what it logged.
    fn reload_logged(modes: Vec<(String, bool)>) -> (Reload, Status, String) {
        let logged = crate::runtime::logs::Logged::default();
        let subscriber = logged.subscriber();
        let rules = Rules::new(vec![
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules"),
        ])
        .with_modes(modes);
        let reload = tracing::subscriber::with_default(subscriber, || rules.reload());
        (reload, rules.status(), logged.text())
    }

    /// The chart's `rules.audit` naming a safety rule (a `refuse` of a control plane's
    /// removal) turns it into a rule that refuses nothing: the reload serves it (the chart
    /// asked for it), and says so in its warnings, its status and its log. Enforced again
    /// by `rules.enforce`, nothing is said; a staging of a rule that refuses nothing
    /// destructive is what audit mode is for.
    #[test]
    fn a_safety_rule_switched_to_audit_is_warned_at_reload() {
        let audit = |n: &str| (n.to_string(), true);
        let (reload, status, log) = reload_logged(vec![audit("declared-count")]);
        let Reload::Replaced { warnings, .. } = reload else {
            panic!("the rules serve: {reload:?}");
        };
        assert!(
            warnings.iter().any(|w| w
                .contains("rule `declared-count` refuses `remove controlplane`")
                && w.contains("switched to audit by the deployment")),
            "{warnings:#?}"
        );
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert_eq!(status.audit_destructive, vec!["declared-count".to_string()]);
        assert_eq!(status.warnings, warnings);
        assert!(
            log.contains("WARN")
                && log.contains("a safety rule is in audit mode")
                && log.contains("declared-count"),
            "{log}"
        );
        // Switched back by `rules.enforce` (which wins): nothing to warn of.
        let (reload, status, log) = reload_logged(vec![
            audit("declared-count"),
            ("declared-count".to_string(), false),
        ]);
        assert_eq!(
            reload,
            Reload::Replaced {
                rows: status.rows,
                warnings: Vec::new()
            }
        );
        assert!(status.audit_destructive.is_empty());
        assert!(!log.contains("audit mode"), "{log}");
    }

    /// A switch naming no rule (a typo in the chart's `rules.enforce`, a rule renamed
    /// since) refuses the rules: `serve` does not start on them, and a later reload keeps
    /// the old table, whose switches all took. Every unknown name is listed.
    #[test]
    fn a_switch_naming_no_rule_refuses_the_rules() {
        let (reload, status, _) = reload_logged(vec![
            ("declared-count".to_string(), true),
            ("no-such-rule".to_string(), true),
            ("declared-cuont".to_string(), false),
        ]);
        let Reload::Rejected {
            reason,
            diagnostics,
        } = reload
        else {
            panic!("refused: {reload:?}");
        };
        assert!(
            reason.starts_with("--audit-rule no-such-rule: no rule has this name (and 1 more)")
                && reason.contains("rules.audit"),
            "{reason}"
        );
        assert_eq!(
            diagnostics,
            vec![
                "--audit-rule no-such-rule: no rule has this name".to_string(),
                "--enforce-rule declared-cuont: no rule has this name".to_string(),
            ]
        );
        assert!(status.refused && status.serving.is_none(), "{status:?}");
    }

    #[test]
    fn the_reload_thread_has_its_stack() {
        // Deep enough to overflow a 2 MiB tokio worker, well within RELOAD_STACK.
        fn depth(n: u32) -> u32 {
            let pad = [n as u8; 4096];
            if n == 0 {
                0
            } else {
                std::hint::black_box(&pad);
                1 + depth(n - 1)
            }
        }
        assert_eq!(on_reload_thread(|| depth(4096)), Ok(4096));
    }
}
