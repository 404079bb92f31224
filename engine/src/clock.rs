//! Where the store reads "now" from, so tests and fuzzers can move time.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current unix time in seconds.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Current unix time, seconds.
    fn now_secs(&self) -> i64;
}

/// The system wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_secs(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    }
}

/// A clock that only moves when told to; for tests, fuzzing and deterministic benchmarks.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `now_secs`.
    pub fn new(now_secs: i64) -> Self {
        Self(AtomicI64::new(now_secs))
    }

    /// Sets the time.
    pub fn set(&self, now_secs: i64) {
        self.0.store(now_secs, Ordering::Relaxed);
    }

    /// Moves the time forward (or back, with a negative `secs`).
    pub fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_secs(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}
