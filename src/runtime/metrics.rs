//! Prometheus metrics of the webhook, in the text exposition format.
//!
//! Every label value comes from a fixed set: nothing a caller sends can add a time series
//! (a request's kind is one of our three kinds or `other`; rule names come from the loaded
//! tables and are capped at [`MAX_RULE_SERIES`]).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the decision latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The kinds a request is counted under; any other kind is counted as `other`.
pub const KINDS: [&str; 3] = ["TalosMachine", "TalosCluster", "TalosOperation"];

/// The most distinct rule names counted (reloads that rename rules add names); further
/// names are counted as `other`.
pub const MAX_RULE_SERIES: usize = 1000;

/// The label of a request's kind: one of [`KINDS`] or `other`.
pub fn kind_label(kind: &str) -> &'static str {
    KINDS
        .iter()
        .find(|k| **k == kind)
        .copied()
        .unwrap_or("other")
}

/// Why the server closed a connection it had accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Closed {
    /// The TLS handshake did not finish in time.
    Handshake,
    /// A request head did not arrive in time once it began.
    Header,
    /// A request body did not arrive in time.
    Body,
    /// No request began in time on an open connection.
    Idle,
}

impl Closed {
    pub fn label(self) -> &'static str {
        match self {
            Closed::Handshake => "handshake",
            Closed::Header => "header",
            Closed::Body => "body",
            Closed::Idle => "idle",
        }
    }
}

#[derive(Default)]
pub struct Metrics {
    /// (rule, verdict) -> count of decisions a rule matched in.
    decisions: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// (kind, allowed) -> requests answered.
    requests: Mutex<BTreeMap<(&'static str, bool), u64>>,
    latency_buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
    /// reason -> live reads that failed.
    live_read_errors: Mutex<BTreeMap<&'static str, u64>>,
    /// reason (`runtime::admission_link::REASONS`) -> lookups of an admission at the
    /// webhook's `/admissions` that failed.
    admission_lookup_failures: Mutex<BTreeMap<&'static str, u64>>,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    bad_requests: AtomicU64,
    /// (kind, ok) -> reconciles, with the total seconds they took.
    reconciles: Mutex<BTreeMap<(&'static str, bool), Spent>>,
    /// (operation kind, result) -> operations that ended.
    operations: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// plan action -> operation steps finished, with the seconds they took.
    operation_steps: Mutex<BTreeMap<&'static str, Spent>>,
    /// 1 while this replica leads (reconciles), 0 otherwise.
    leading: AtomicU64,
    /// The serving rules: Unix time they were built, rows, fingerprint, and 1 when the
    /// files as they are now were refused.
    rules_loaded_at: AtomicU64,
    rules_rows: AtomicU64,
    rules_fingerprint: AtomicU64,
    /// The digest of the serving rules' text (`runtime::records::digest`).
    rules_digest: Mutex<String>,
    /// Decision records written, failed to write, and dropped because the sink was behind.
    records_written: AtomicU64,
    records_failed: AtomicU64,
    records_dropped: AtomicU64,
    /// rule (from the serving table) -> decisions an audit-mode rule would have refused.
    would_refuse: Mutex<BTreeMap<String, u64>>,
    rules_refused: AtomicU64,
    /// Safety rules (a `refuse` on a destructive event) the serving table has in audit mode.
    rules_audit_destructive: AtomicU64,
    /// Connections open now; refused over the cap; closed by a timeout, by reason.
    connections_open: AtomicU64,
    connections_refused: AtomicU64,
    connections_timed_out: Mutex<BTreeMap<Closed, u64>>,
    /// `namespace/name` of a TalosEtcdBackup -> its snapshots.
    backups: Mutex<BTreeMap<String, BackupSeries>>,
}

/// What the metrics keep of one backup's snapshots.
#[derive(Clone, Default)]
struct BackupSeries {
    verified: u64,
    failed: u64,
    /// Unix time of the last verified snapshot (0: none since this replica started).
    last_success: u64,
    last_duration: f64,
    last_size: u64,
}

/// How many, and how many seconds in all.
type Spent = (u64, f64);

fn bump<K: Ord>(m: &Mutex<BTreeMap<K, u64>>, k: K) {
    if let Ok(mut m) = m.lock() {
        *m.entry(k).or_insert(0) += 1;
    }
}

impl Metrics {
    /// A rule of the serving table matched (`rule` is its name in the table).
    pub fn decision(&self, rule: &str, verdict: &'static str) {
        let Ok(mut m) = self.decisions.lock() else {
            return;
        };
        let key = (rule.to_string(), verdict);
        if let Some(n) = m.get_mut(&key) {
            *n += 1;
            return;
        }
        let mut names: Vec<&str> = m.keys().map(|(r, _)| r.as_str()).collect();
        names.dedup();
        let key = if names.len() < MAX_RULE_SERIES || names.contains(&rule) {
            key
        } else {
            ("other".to_string(), verdict)
        };
        *m.entry(key).or_insert(0) += 1;
    }

    /// A request answered; `kind` is what the caller sent (counted as [`kind_label`]).
    pub fn request(&self, kind: &str, allowed: bool, took: Duration) {
        bump(&self.requests, (kind_label(kind), allowed));
        let secs = took.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_micros.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// An operation ended (`result`: `succeeded` or `failed`); `kind` is its spec.kind,
    /// counted as one of the kinds the rules name, else `other`.
    pub fn operation(&self, kind: &str, result: &'static str) {
        let kind = crate::vocab::OPERATION_KINDS
            .iter()
            .find(|k| **k == kind)
            .copied()
            .unwrap_or("other");
        bump(&self.operations, (kind, result));
    }

    /// A step of an operation's plan finished after `took`.
    pub fn operation_step(&self, action: crate::vocab::Action, took: Duration) {
        use crate::vocab::Action as A;
        let label = match action {
            A::LockCluster => "lock-cluster",
            A::DrainNode => "drain-node",
            A::EtcdForfeitLeadership => "etcd-forfeit-leadership",
            A::EtcdLeave => "etcd-leave",
            A::EtcdRemoveMember => "etcd-remove-member",
            A::TalosReset => "talos-reset",
            A::TalosWipe => "talos-wipe",
            A::EventWarning => "event-warning",
            A::EventNormal => "event-normal",
            A::ReleaseFinalizer => "release-finalizer",
            A::EtcdHealthy => "etcd-healthy",
            A::CordonNode => "cordon-node",
            A::UncordonNode => "uncordon-node",
            A::TalosReboot => "talos-reboot",
            A::TalosShutdown => "talos-shutdown",
            A::TalosUpgrade => "talos-upgrade",
            A::TalosRollback => "talos-rollback",
            A::WaitNodeBack => "wait-node-back",
            A::TalosInstall => "talos-install",
            A::ConfigRender => "config-render",
            A::TalosDryRun => "talos-dry-run",
            A::TalosApplyConfig => "talos-apply-config",
            A::TalosBootstrap => "talos-bootstrap",
            A::EtcdSnapshot => "etcd-snapshot",
            A::SnapshotsPrune => "snapshots-prune",
        };
        if let Ok(mut m) = self.operation_steps.lock() {
            let e = m.entry(label).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += took.as_secs_f64();
        }
    }

    pub fn live_read_error(&self, reason: &'static str) {
        bump(&self.live_read_errors, reason);
    }

    /// A lookup of an admission at the webhook failed (`reason`: a fixed word).
    pub fn admission_lookup_failed(&self, reason: &'static str) {
        bump(&self.admission_lookup_failures, reason);
    }

    pub fn reload(&self, ok: bool) {
        if ok {
            self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.reloads_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn reconcile(&self, kind: &'static str, ok: bool, took: Duration) {
        if let Ok(mut m) = self.reconciles.lock() {
            let e = m.entry((kind, ok)).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += took.as_secs_f64();
        }
    }

    pub fn set_leading(&self, leading: bool) {
        self.leading.store(u64::from(leading), Ordering::Relaxed);
    }

    pub fn bad_request(&self) {
        self.bad_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// What serves now (after a reload or a refused one).
    pub fn rules_status(&self, status: &super::reload::Status) {
        let at = status
            .loaded_at
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        self.rules_loaded_at.store(at, Ordering::Relaxed);
        self.rules_rows.store(status.rows as u64, Ordering::Relaxed);
        self.rules_fingerprint
            .store(status.serving.unwrap_or(0), Ordering::Relaxed);
        self.rules_refused
            .store(u64::from(status.refused), Ordering::Relaxed);
        self.rules_audit_destructive
            .store(status.audit_destructive.len() as u64, Ordering::Relaxed);
        if let Ok(mut d) = self.rules_digest.lock() {
            d.clone_from(&status.digest);
        }
    }

    /// A decision record was written (`true`) or could not be (`false`).
    pub fn record_written(&self, ok: bool) {
        let n = if ok {
            &self.records_written
        } else {
            &self.records_failed
        };
        n.fetch_add(1, Ordering::Relaxed);
    }

    /// A decision record was dropped: its sink was behind.
    pub fn record_dropped(&self) {
        self.records_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// A rule in audit mode would have refused (`rule` is its name in the serving table).
    pub fn would_refuse(&self, rule: &str) {
        let Ok(mut m) = self.would_refuse.lock() else {
            return;
        };
        if let Some(n) = m.get_mut(rule) {
            *n += 1;
            return;
        }
        let key = if m.len() < MAX_RULE_SERIES {
            rule.to_string()
        } else {
            "other".to_string()
        };
        *m.entry(key).or_insert(0) += 1;
    }

    /// A backup's snapshot ended after `took`: verified (`Ok(size in bytes)`) or not
    /// (`Err(reason)`).
    pub fn snapshot(&self, backup: &str, result: Result<u64, &str>, took: Duration) {
        let Ok(mut m) = self.backups.lock() else {
            return;
        };
        let e = m.entry(backup.to_string()).or_default();
        e.last_duration = took.as_secs_f64();
        match result {
            Ok(size) => {
                e.verified += 1;
                e.last_size = size;
                e.last_success = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
            }
            Err(_) => e.failed += 1,
        }
    }

    /// A connection was accepted (`true`) or closed (`false`).
    pub fn connection(&self, open: bool) {
        if open {
            self.connections_open.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self
                .connections_open
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// A connection over the cap was closed as soon as it was accepted.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection was closed by a timeout.
    pub fn connection_timed_out(&self, why: Closed) {
        bump(&self.connections_timed_out, why);
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP ichor_rules_decisions_total Decisions a rule matched in, by rule and verdict.\n# TYPE ichor_rules_decisions_total counter"
        );
        if let Ok(m) = self.decisions.lock() {
            for ((rule, verdict), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "ichor_rules_decisions_total{{rule=\"{}\",verdict=\"{verdict}\"}} {n}",
                    escape(rule)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_admission_requests_total Admission requests answered, by kind (TalosMachine, TalosCluster, TalosOperation or other) and outcome.\n# TYPE ichor_rules_admission_requests_total counter"
        );
        if let Ok(m) = self.requests.lock() {
            for ((kind, allowed), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "ichor_rules_admission_requests_total{{kind=\"{kind}\",allowed=\"{allowed}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_decision_duration_seconds Time from request to answer, live reads included.\n# TYPE ichor_rules_decision_duration_seconds histogram"
        );
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "ichor_rules_decision_duration_seconds_bucket{{le=\"{b}\"}} {}",
                self.latency_buckets[i].load(Ordering::Relaxed)
            );
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "ichor_rules_decision_duration_seconds_bucket{{le=\"+Inf\"}} {count}\nichor_rules_decision_duration_seconds_sum {}\nichor_rules_decision_duration_seconds_count {count}",
            self.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_live_read_errors_total Live reads that failed (the request was refused).\n# TYPE ichor_rules_live_read_errors_total counter"
        );
        if let Ok(m) = self.live_read_errors.lock() {
            for (reason, n) in m.iter() {
                let _ = writeln!(
                    out,
                    "ichor_rules_live_read_errors_total{{reason=\"{reason}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_admission_lookup_failures_total Lookups of an admission at the webhook's /admissions that failed (the record says why, without the link).\n# TYPE ichor_rules_admission_lookup_failures_total counter"
        );
        if let Ok(m) = self.admission_lookup_failures.lock() {
            for (reason, n) in m.iter() {
                let _ = writeln!(
                    out,
                    "ichor_rules_admission_lookup_failures_total{{reason=\"{reason}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_rules_reloads_total Rule reloads, by result (a rejected reload keeps the old table).\n# TYPE ichor_rules_rules_reloads_total counter\nichor_rules_rules_reloads_total{{result=\"ok\"}} {}\nichor_rules_rules_reloads_total{{result=\"rejected\"}} {}",
            self.reloads_ok.load(Ordering::Relaxed),
            self.reloads_failed.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_rules_loaded_timestamp_seconds When the serving table was built (Unix time; 0: none).\n# TYPE ichor_rules_rules_loaded_timestamp_seconds gauge\nichor_rules_rules_loaded_timestamp_seconds {}",
            self.rules_loaded_at.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_rules_rows Rows of the serving table.\n# TYPE ichor_rules_rules_rows gauge\nichor_rules_rules_rows {}",
            self.rules_rows.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_rules_info The fingerprint of the rule files the serving table was built from, and the digest of their text (what decision records name).\n# TYPE ichor_rules_rules_info gauge\nichor_rules_rules_info{{fingerprint=\"{:016x}\",digest=\"{}\"}} 1",
            self.rules_fingerprint.load(Ordering::Relaxed),
            self.rules_digest
                .lock()
                .map(|d| escape(&d))
                .unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_would_refuse_total Decisions a rule in audit mode would have refused, by rule.\n# TYPE ichor_rules_would_refuse_total counter"
        );
        if let Ok(m) = self.would_refuse.lock() {
            for (rule, n) in m.iter() {
                let _ = writeln!(
                    out,
                    "ichor_rules_would_refuse_total{{rule=\"{}\"}} {n}",
                    escape(rule)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_decision_records_total Decision records by outcome: written to the sink, failed to write, or dropped because the sink was behind.\n# TYPE ichor_rules_decision_records_total counter\nichor_rules_decision_records_total{{outcome=\"written\"}} {}\nichor_rules_decision_records_total{{outcome=\"failed\"}} {}\nichor_rules_decision_records_total{{outcome=\"dropped\"}} {}",
            self.records_written.load(Ordering::Relaxed),
            self.records_failed.load(Ordering::Relaxed),
            self.records_dropped.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_rules_refused 1 when the rule files as they are now were refused and an older table serves.\n# TYPE ichor_rules_rules_refused gauge\nichor_rules_rules_refused {}",
            self.rules_refused.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_rules_audit_destructive Rules of the serving table that refuse a destructive event (a control plane removed or leaving, a reset) and are in audit mode: they refuse nothing (the reload logs each by name).\n# TYPE ichor_rules_rules_audit_destructive gauge\nichor_rules_rules_audit_destructive {}",
            self.rules_audit_destructive.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_connections_open HTTPS connections open now.\n# TYPE ichor_rules_connections_open gauge\nichor_rules_connections_open {}",
            self.connections_open.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_connections_refused_total Connections closed on arrival because --max-connections were open.\n# TYPE ichor_rules_connections_refused_total counter\nichor_rules_connections_refused_total {}",
            self.connections_refused.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_connections_timed_out_total Connections closed by a timeout, by phase (handshake, header, body, idle).\n# TYPE ichor_rules_connections_timed_out_total counter"
        );
        let timed_out = self
            .connections_timed_out
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        for why in [
            Closed::Handshake,
            Closed::Header,
            Closed::Body,
            Closed::Idle,
        ] {
            let _ = writeln!(
                out,
                "ichor_rules_connections_timed_out_total{{phase=\"{}\"}} {}",
                why.label(),
                timed_out.get(&why).copied().unwrap_or(0)
            );
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_log_lines_dropped_total Log lines dropped because stderr did not keep up (the answers did not wait for it).\n# TYPE ichor_rules_log_lines_dropped_total counter\nichor_rules_log_lines_dropped_total {}",
            super::logs::DROPPED.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ichor_rules_bad_requests_total Requests answered 400 (malformed AdmissionReview, wrong content type, oversized body).\n# TYPE ichor_rules_bad_requests_total counter\nichor_rules_bad_requests_total {}",
            self.bad_requests.load(Ordering::Relaxed)
        );
        let reconciles = self
            .reconciles
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "# HELP ichor_rules_reconciles_total Controller reconciles, by kind and result.\n# TYPE ichor_rules_reconciles_total counter"
        );
        for ((kind, ok), (n, _)) in &reconciles {
            let result = if *ok { "ok" } else { "error" };
            let _ = writeln!(
                out,
                "ichor_rules_reconciles_total{{kind=\"{kind}\",result=\"{result}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_reconcile_seconds_total Time spent reconciling, by kind and result.\n# TYPE ichor_rules_reconcile_seconds_total counter"
        );
        for ((kind, ok), (_, secs)) in &reconciles {
            let result = if *ok { "ok" } else { "error" };
            let _ = writeln!(
                out,
                "ichor_rules_reconcile_seconds_total{{kind=\"{kind}\",result=\"{result}\"}} {secs}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_operations_total TalosOperations that ended, by kind and result (succeeded, failed).\n# TYPE ichor_rules_operations_total counter"
        );
        if let Ok(m) = self.operations.lock() {
            for ((kind, result), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "ichor_rules_operations_total{{kind=\"{kind}\",result=\"{result}\"}} {n}"
                );
            }
        }
        let steps = self
            .operation_steps
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "# HELP ichor_rules_operation_steps_total Operation plan steps finished, by action.\n# TYPE ichor_rules_operation_steps_total counter"
        );
        for (action, (n, _)) in &steps {
            let _ = writeln!(
                out,
                "ichor_rules_operation_steps_total{{action=\"{action}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_operation_step_seconds_total Time operation steps took, from start to done (a gate's wait included), by action.\n# TYPE ichor_rules_operation_step_seconds_total counter"
        );
        for (action, (_, secs)) in &steps {
            let _ = writeln!(
                out,
                "ichor_rules_operation_step_seconds_total{{action=\"{action}\"}} {secs}"
            );
        }
        let backups = self.backups.lock().map(|m| m.clone()).unwrap_or_default();
        for (name, help, kind, value) in [
            (
                "ichor_rules_backup_last_success_timestamp_seconds",
                "When the backup's last verified etcd snapshot was taken (Unix time).",
                "gauge",
                (|b: &BackupSeries| b.last_success.to_string()) as fn(&BackupSeries) -> String,
            ),
            (
                "ichor_rules_backup_last_duration_seconds",
                "How long the backup's last snapshot took, from the node to the store, verified or not.",
                "gauge",
                |b| b.last_duration.to_string(),
            ),
            (
                "ichor_rules_backup_last_size_bytes",
                "The size in the store of the backup's last verified snapshot.",
                "gauge",
                |b| b.last_size.to_string(),
            ),
            (
                "ichor_rules_backup_snapshots_verified_total",
                "Snapshots taken and verified, by backup.",
                "counter",
                |b| b.verified.to_string(),
            ),
            (
                "ichor_rules_backup_snapshots_failed_total",
                "Snapshots that failed (not taken, or deleted for failing verification), by backup.",
                "counter",
                |b| b.failed.to_string(),
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (backup, b) in &backups {
                let _ = writeln!(out, "{name}{{backup=\"{}\"}} {}", escape(backup), value(b));
            }
        }
        let _ = writeln!(
            out,
            "# HELP ichor_rules_leader Whether this replica runs the controller (1) or only serves the webhook (0).\n# TYPE ichor_rules_leader gauge\nichor_rules_leader {}",
            self.leading.load(Ordering::Relaxed)
        );
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
