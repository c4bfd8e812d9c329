//! Prometheus metrics of the webhook, in the text exposition format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the decision latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Default)]
pub struct Metrics {
    /// (rule, verdict) -> count of decisions a rule matched in.
    decisions: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// (kind, allowed) -> requests answered.
    requests: Mutex<BTreeMap<(String, bool), u64>>,
    latency_buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
    /// reason -> live reads that failed.
    live_read_errors: Mutex<BTreeMap<&'static str, u64>>,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    bad_requests: AtomicU64,
    /// (kind, ok) -> reconciles, with the total seconds they took.
    reconciles: Mutex<BTreeMap<(&'static str, bool), Spent>>,
    /// 1 while this replica leads (reconciles), 0 otherwise.
    leading: AtomicU64,
}

/// How many, and how many seconds in all.
type Spent = (u64, f64);

fn bump<K: Ord>(m: &Mutex<BTreeMap<K, u64>>, k: K) {
    if let Ok(mut m) = m.lock() {
        *m.entry(k).or_insert(0) += 1;
    }
}

impl Metrics {
    pub fn decision(&self, rule: &str, verdict: &'static str) {
        bump(&self.decisions, (rule.to_string(), verdict));
    }

    pub fn request(&self, kind: &str, allowed: bool, took: Duration) {
        bump(&self.requests, (kind.to_string(), allowed));
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

    pub fn live_read_error(&self, reason: &'static str) {
        bump(&self.live_read_errors, reason);
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
            "# HELP ichor_rules_admission_requests_total Admission requests answered, by kind and outcome.\n# TYPE ichor_rules_admission_requests_total counter"
        );
        if let Ok(m) = self.requests.lock() {
            for ((kind, allowed), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "ichor_rules_admission_requests_total{{kind=\"{}\",allowed=\"{allowed}\"}} {n}",
                    escape(kind)
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
            "# HELP ichor_rules_rules_reloads_total Rule reloads, by result (a rejected reload keeps the old table).\n# TYPE ichor_rules_rules_reloads_total counter\nichor_rules_rules_reloads_total{{result=\"ok\"}} {}\nichor_rules_rules_reloads_total{{result=\"rejected\"}} {}",
            self.reloads_ok.load(Ordering::Relaxed),
            self.reloads_failed.load(Ordering::Relaxed)
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
