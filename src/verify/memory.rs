//! `verify`'s memory budget: an exploration stops, saying how far it got, before the
//! process outgrows it, instead of being killed by the kernel (exit 137) or aborting on a
//! failed allocation (exit 134).
//!
//! Checked once per batch of states: the process's resident memory (`VmRSS` of
//! /proc/self/status; every run of a `verify` shares the one process, and so the budget),
//! plus what each run still needs before it finishes, reserved ahead: the next growth of
//! its big structures (a vector or table that doubles holds its old and its new buffer at
//! once) and the liveness check that follows the exploration. Where /proc cannot be read,
//! the explorer's own estimate of its structures stands in for the resident memory.

use std::sync::atomic::{AtomicU64, Ordering};

/// A budget shared by the runs of one `verify`.
pub struct Budget {
    /// Bytes at most (`u64::MAX`: no limit).
    limit: u64,
    /// What every run has reserved, together.
    reserved: AtomicU64,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget {
            limit,
            reserved: AtomicU64::new(0),
        }
    }

    pub fn unlimited() -> Budget {
        Budget::new(u64::MAX)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// One run's share of the budget.
    pub fn share(&self) -> Share<'_> {
        Share {
            budget: self,
            reserved: 0,
        }
    }
}

/// What one run has reserved of a [`Budget`] (given back when it is dropped).
pub struct Share<'a> {
    budget: &'a Budget,
    reserved: u64,
}

/// Memory in use when a run stopped: the process's, and what was reserved.
#[derive(Clone, Copy, Debug)]
pub struct Over {
    pub used: u64,
    pub reserved: u64,
    pub limit: u64,
}

impl Share<'_> {
    /// Reserves `reserve` bytes for this run (replacing what it reserved before) and checks
    /// the budget: `Err` when the memory in use (`estimate` of this run's structures where
    /// the process's resident memory cannot be read) and every run's reserve pass it.
    pub fn check(&mut self, estimate: u64, reserve: u64) -> Result<(), Over> {
        if self.budget.limit == u64::MAX {
            return Ok(());
        }
        if reserve >= self.reserved {
            self.budget
                .reserved
                .fetch_add(reserve - self.reserved, Ordering::Relaxed);
        } else {
            self.budget
                .reserved
                .fetch_sub(self.reserved - reserve, Ordering::Relaxed);
        }
        self.reserved = reserve;
        let used = resident().unwrap_or(estimate);
        let reserved = self.budget.reserved.load(Ordering::Relaxed);
        if used.saturating_add(reserved) > self.budget.limit {
            return Err(Over {
                used,
                reserved,
                limit: self.budget.limit,
            });
        }
        Ok(())
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        self.budget
            .reserved
            .fetch_sub(self.reserved, Ordering::Relaxed);
    }
}

/// The value of `key` (in kB) in a /proc file of `key:   N kB` lines, in bytes.
fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .map(|kb| kb.saturating_mul(1024))
}

/// The process's resident memory, in bytes (Linux).
pub fn resident() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kb_field(&status, "VmRSS")
}

/// The default budget: three quarters of the memory available when `verify` starts
/// (`MemAvailable` of /proc/meminfo, else `MemTotal`); `None` where neither can be read.
pub fn default_limit() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let available =
        kb_field(&meminfo, "MemAvailable").or_else(|| kb_field(&meminfo, "MemTotal"))?;
    Some(available / 4 * 3)
}

/// A size as `--max-memory` takes it: bytes, or a number with a unit (`K`, `M`, `G`, `T`,
/// powers of 1024, also written `KiB`, `MB`, ...), such as `512M`, `1.5G` or `4GiB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim();
    let scale: u64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?}; give bytes or a number with K, M, G or T \
                 (such as 512M or 4G)"
            ));
        }
    };
    let n: f64 = number.parse().map_err(|_| {
        format!(
            "{text:?} is not a size; give bytes or a number with K, M, G or T (such as 512M or 4G)"
        )
    })?;
    let bytes = n * scale as f64;
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!(
            "{text:?}: a memory budget is at least one byte (such as 512M or 4G)"
        ));
    }
    Ok(bytes as u64)
}

/// A size in words, for messages: `1.5 GiB`, `640 MiB`, `900 KiB`.
pub fn show(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if v < 10.0 {
                format!("{v:.1} {name}")
            } else {
                format!("{v:.0} {name}")
            };
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size(" 64 KB "), Ok(64 << 10));
        for bad in ["", "G", "12X", "0", "0.1", "-5M", "1e99T", "1..2G"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(show(3 << 29), "1.5 GiB");
        assert_eq!(show(640 << 20), "640 MiB");
        assert_eq!(show(12), "12 bytes");
    }

    #[test]
    fn proc_fields_in_bytes() {
        let meminfo =
            "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   22000000 kB\n";
        assert_eq!(kb_field(meminfo, "MemAvailable"), Some(22_000_000 * 1024));
        assert_eq!(kb_field(meminfo, "MemTotal"), Some(24_000_000 * 1024));
        assert_eq!(kb_field(meminfo, "Swap"), None);
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(resident().is_some_and(|r| r > 0));
        }
    }

    #[test]
    fn shares_reserve_together_and_give_back() {
        let budget = Budget::new(u64::MAX - 1);
        let mut a = budget.share();
        let mut b = budget.share();
        assert!(a.check(10, 100).is_ok());
        assert!(b.check(10, 50).is_ok());
        assert_eq!(budget.reserved.load(Ordering::Relaxed), 150);
        assert!(a.check(10, 20).is_ok());
        assert_eq!(budget.reserved.load(Ordering::Relaxed), 70);
        drop(a);
        assert_eq!(budget.reserved.load(Ordering::Relaxed), 50);
        // A reserve past the limit stops the run, whatever is resident.
        let Err(over) = b.check(10, u64::MAX - 1) else {
            panic!("over the budget");
        };
        assert_eq!(over.limit, u64::MAX - 1);
        let tiny = Budget::new(1);
        assert!(tiny.share().check(1 << 20, 0).is_err());
        assert!(
            Budget::unlimited()
                .share()
                .check(u64::MAX, u64::MAX)
                .is_ok()
        );
    }
}
