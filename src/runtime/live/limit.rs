//! The bound on the reads in flight toward the API server ([`ReadLimit`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A bound on the reads in flight toward the API server, shared by the readers of one
/// replica: a burst of admissions waits for a turn instead of becoming a burst of LISTs
/// (which API priority and fairness would throttle, or the API server would suffer).
#[derive(Clone, Debug)]
pub struct ReadLimit {
    permits: Arc<Semaphore>,
    max: usize,
    stats: Arc<LimitStats>,
}

#[derive(Debug, Default)]
pub(super) struct LimitStats {
    now: AtomicUsize,
    peak: AtomicUsize,
    started: AtomicU64,
}

/// Holds one of a [`ReadLimit`]'s turns.
pub(super) struct Turn {
    _permit: OwnedSemaphorePermit,
    stats: Arc<LimitStats>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.stats.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ReadLimit {
    /// Reads in flight at once by default (`serve --max-inflight-reads`).
    pub const DEFAULT: usize = 16;

    /// At most `max` reads at once (at least one).
    pub fn new(max: usize) -> ReadLimit {
        let max = max.max(1);
        ReadLimit {
            permits: Arc::new(Semaphore::new(max)),
            max,
            stats: Arc::default(),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// The most reads that were in flight at once.
    pub fn peak(&self) -> usize {
        self.stats.peak.load(Ordering::SeqCst)
    }

    /// Reads (LISTs to their end, or GETs) sent so far.
    pub fn reads_started(&self) -> u64 {
        self.stats.started.load(Ordering::SeqCst)
    }

    pub(super) async fn turn(&self) -> Option<Turn> {
        let permit = self.permits.clone().acquire_owned().await.ok()?;
        let now = self.stats.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.stats.peak.fetch_max(now, Ordering::SeqCst);
        self.stats.started.fetch_add(1, Ordering::SeqCst);
        Some(Turn {
            _permit: permit,
            stats: self.stats.clone(),
        })
    }
}
