//! Ingestion's progress, shared by the supervisor, the ingest threads and the `KafkaIngest`
//! handle: the progress counters, the per-partition offsets, and the live-batch permits that
//! pace the writes after catch-up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::records::BatchOutcome as Outcome;
use tokio::sync::watch;

use super::gate::{CatchUpGate, CatchUpState};
use super::partition::PartitionState;
use super::window::CatchUpWindow;

/// Totals of what ingestion applied to the store so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IngestStats {
    /// Records consumed and applied (including skipped bad records).
    pub records: u64,
    /// Create events handed to the store.
    pub creates: u64,
    /// Delete events handed to the store.
    pub deletes: u64,
    /// Records skipped because they did not decode.
    pub failed: u64,
    /// Events skipped because an id is outside the contract (negative, or a post or author id
    /// of 0).
    pub rejected: u64,
    /// Creates the store dropped (too old, in the future, invalid time, duplicate, deleted),
    /// and creates a delete of the same batch removed again.
    pub dropped: u64,
    /// Batches applied.
    pub batches: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    records: AtomicU64,
    creates: AtomicU64,
    deletes: AtomicU64,
    failed: AtomicU64,
    rejected: AtomicU64,
    dropped: AtomicU64,
    batches: AtomicU64,
}

impl Counters {
    pub(super) fn record(&self, outcome: &Outcome) {
        self.creates
            .fetch_add(outcome.creates as u64, Ordering::Relaxed);
        self.deletes
            .fetch_add(outcome.deletes as u64, Ordering::Relaxed);
        self.failed
            .fetch_add(outcome.failed as u64, Ordering::Relaxed);
        self.rejected
            .fetch_add(outcome.rejected as u64, Ordering::Relaxed);
        self.dropped
            .fetch_add(outcome.dropped as u64, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        // Release: pairs with the Acquire in `snapshot`, so whoever sees these records counted
        // also sees the store calls that applied them.
        self.records
            .fetch_add(outcome.records as u64, Ordering::Release);
    }

    pub(super) fn snapshot(&self) -> IngestStats {
        // Acquire: pairs with the Release in `record`.
        let records = self.records.load(Ordering::Acquire);
        IngestStats {
            records,
            creates: self.creates.load(Ordering::Relaxed),
            deletes: self.deletes.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
        }
    }
}

/// A counting semaphore for OS threads: how many caught-up threads may apply a batch at once.
#[derive(Debug)]
pub(super) struct LivePermits {
    available: Mutex<usize>,
    released: Condvar,
}

/// A held [`LivePermits`] permit; released on drop.
pub(super) struct LivePermit<'a>(&'a LivePermits);

impl LivePermits {
    pub(super) fn new(permits: usize) -> Self {
        Self {
            available: Mutex::new(permits),
            released: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, usize> {
        // A plain counter: consistent after any panic.
        self.available
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn acquire(&self) -> LivePermit<'_> {
        let mut available = self.lock();
        while *available == 0 {
            available = self
                .released
                .wait(available)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *available -= 1;
        LivePermit(self)
    }
}

impl Drop for LivePermit<'_> {
    fn drop(&mut self) {
        *self.0.lock() += 1;
        self.0.released.notify_one();
    }
}

/// State shared by the supervisor, the ingest threads and the [`KafkaIngest`](super::KafkaIngest) handle.
pub(super) struct Shared {
    pub(super) stop: AtomicBool,
    pub(super) gate: CatchUpGate,
    pub(super) counters: Counters,
    pub(super) live_permits: Option<LivePermits>,
    /// The gate's published state, for the monitor.
    pub(super) caught_up: watch::Receiver<CatchUpState>,
    /// Partitions stalled after catch-up (see `stall.rs`), sorted.
    pub(super) stalled: watch::Sender<Vec<i32>>,
    /// Per partition (metadata order), once the partitions are known.
    pub(super) partitions: OnceLock<Vec<PartitionState>>,
    /// Which partitions catching up may be read at once (see `window.rs`).
    pub(super) window: CatchUpWindow,
}

impl Shared {
    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Sleeps up to `duration`; false when shutdown was requested meanwhile.
    pub(super) fn sleep(&self, duration: Duration) -> bool {
        self.sleep_unless(duration, || false)
    }

    /// Sleeps up to `duration`, or until `wake` turns true (checked every 50 ms); false when
    /// shutdown was requested meanwhile.
    pub(super) fn sleep_unless(&self, duration: Duration, wake: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + duration;
        while !self.stopping() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || wake() {
                return true;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_limit_concurrency() {
        let permits = LivePermits::new(1);
        let held = permits.acquire();
        assert_eq!(*permits.lock(), 0);
        drop(held);
        assert_eq!(*permits.lock(), 1);
    }
}
