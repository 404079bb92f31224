//! The stall rule after catch-up: a partition that has records to read but has not moved for
//! `--kafka-stall-timeout-secs` is stalled, and readiness turns NOT_SERVING until it moves.
//!
//! "Has records to read" needs a known lag: while the broker cannot be asked (an outage, which
//! is retried), a partition keeps its last verdict, so a broker outage alone never takes every
//! replica out of serving at once. A partition whose consumer reported its end (with no consumer
//! error since) is never stalled: transaction markers can keep the high watermark above the
//! last record forever. Consumer errors name no partition, so an error clears that report for
//! every partition of its thread; an idle transactional partition that shares a thread with a
//! broken one can then be reported stalled with it.

use std::time::{Duration, Instant};

/// What the monitor knows of one partition at one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PartitionCheck {
    /// Next offset to apply (as published by its ingest thread).
    pub next: i64,
    /// Records between `next` and the high watermark; `None` when the broker did not answer.
    pub lag: Option<i64>,
    /// The consumer reported the end of the partition after its last record.
    pub at_end: bool,
}

#[derive(Clone, Copy, Debug)]
struct Progress {
    next: i64,
    /// When `next` last changed, or when the partition last had nothing to read.
    moved_at: Instant,
    stalled: bool,
}

/// Per-partition stall verdicts, fed by periodic checks.
#[derive(Debug)]
pub(crate) struct StallTracker {
    timeout: Duration,
    partitions: Vec<Option<Progress>>,
}

impl StallTracker {
    /// A tracker of `partitions` partitions; `timeout` zero disables the rule.
    pub(crate) fn new(partitions: usize, timeout: Duration) -> Self {
        Self {
            timeout,
            partitions: vec![None; partitions],
        }
    }

    /// Feeds one check of partition `index` made at `now`; true when its verdict changed.
    pub(crate) fn observe(&mut self, index: usize, check: PartitionCheck, now: Instant) -> bool {
        let Some(slot) = self.partitions.get_mut(index) else {
            return false;
        };
        let progress = slot.get_or_insert(Progress {
            next: check.next,
            moved_at: now,
            stalled: false,
        });
        let idle = check.at_end || check.lag == Some(0);
        if check.next != progress.next || idle {
            progress.next = check.next;
            progress.moved_at = now;
        }
        let stalled = match check.lag {
            // Unknown lag: keep the verdict.
            None if !check.at_end => progress.stalled,
            _ => {
                !self.timeout.is_zero()
                    && !idle
                    && now.duration_since(progress.moved_at) >= self.timeout
            }
        };
        let changed = stalled != progress.stalled;
        progress.stalled = stalled;
        changed
    }

    /// True when partition `index` is stalled.
    pub(crate) fn stalled(&self, index: usize) -> bool {
        self.partitions
            .get(index)
            .copied()
            .flatten()
            .is_some_and(|p| p.stalled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(next: i64, lag: Option<i64>) -> PartitionCheck {
        PartitionCheck {
            next,
            lag,
            at_end: false,
        }
    }

    #[test]
    fn stalled_after_the_timeout_until_it_moves() {
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let mut tracker = StallTracker::new(2, Duration::from_secs(30));
        assert!(!tracker.observe(0, check(10, Some(5)), s(0)));
        assert!(!tracker.observe(0, check(10, Some(5)), s(29)));
        assert!(!tracker.stalled(0));
        assert!(tracker.observe(0, check(10, Some(7)), s(30)));
        assert!(tracker.stalled(0));
        assert!(!tracker.stalled(1));
        // The broker stops answering: the verdict holds.
        assert!(!tracker.observe(0, check(10, None), s(40)));
        assert!(tracker.stalled(0));
        // It moves again: not stalled, and the clock restarts.
        assert!(tracker.observe(0, check(11, Some(6)), s(41)));
        assert!(!tracker.stalled(0));
        assert!(!tracker.observe(0, check(11, Some(6)), s(70)));
        assert!(tracker.observe(0, check(11, Some(6)), s(71)));
    }

    #[test]
    fn nothing_to_read_is_never_stalled() {
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let mut tracker = StallTracker::new(1, Duration::from_secs(1));
        tracker.observe(0, check(10, Some(0)), s(0));
        assert!(!tracker.observe(0, check(10, Some(0)), s(100)));
        // Records arrive and are not read: the timeout counts from when they appeared.
        assert!(!tracker.observe(0, check(10, Some(3)), s(100)));
        assert!(tracker.observe(0, check(10, Some(3)), s(101)));
        // The consumer says it is at the end (a transaction marker above the last record).
        let at_end = PartitionCheck {
            at_end: true,
            ..check(10, Some(1))
        };
        assert!(tracker.observe(0, at_end, s(102)));
        assert!(!tracker.stalled(0));
    }

    #[test]
    fn a_zero_timeout_disables_the_rule() {
        let t0 = Instant::now();
        let mut tracker = StallTracker::new(1, Duration::ZERO);
        tracker.observe(0, check(1, Some(9)), t0);
        assert!(!tracker.observe(0, check(1, Some(9)), t0 + Duration::from_secs(3600)));
    }
}
