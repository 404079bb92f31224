//! The catch-up gate: start-up waits until every partition's backlog is applied.
//!
//! At start the supervisor records each partition's high watermark (also with
//! `--start-from-time`); a partition is caught up once the next offset to apply reaches it,
//! an ingest thread once all its partitions are, and the gate opens once every thread is.
//! Records appended meanwhile do not move the goal, so a busy topic cannot hold start-up back
//! forever, and nothing recorded at start is unread when the gate opens.
//!
//! The gate opens one step after the last thread: once the supervisor has refreshed every
//! partition's lag gauge from the broker ([`CatchUpGate::ready_to_open`], then
//! [`CatchUpGate::open`]), so the first scrape of a ready server shows the lag as it is, not
//! the backlog read at start.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Progress of the start-up catch-up, published on [`KafkaIngest::caught_up`](super::KafkaIngest::caught_up).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatchUpState {
    /// Still reading the backlog (or waiting for the broker or the topic).
    CatchingUp,
    /// Every ingest thread has read its backlog; `took` is the time since [`start`](super::start).
    CaughtUp {
        /// Time from [`start`](super::start) to catch-up.
        took: Duration,
    },
    /// An ingest thread died; ingestion of its partitions has stopped.
    Failed(String),
}

/// The catch-up rule of one partition: it is caught up once the next offset to apply has
/// reached the high watermark recorded at start (or the partition held nothing to read from
/// the start position), or once its consumer reported the end of the partition with every
/// record before it applied (which also covers transaction markers, which are never delivered
/// but count in the watermark).
pub(super) fn partition_caught_up(
    low_at_start: i64,
    end_at_start: i64,
    next: i64,
    at_end: bool,
) -> bool {
    at_end || partition_lag(low_at_start, end_at_start, next) == 0
}

/// Lag of one partition: records between the next offset to read (or the low watermark, when
/// that is later or nothing was read yet) and the high watermark. Never negative.
pub(crate) fn partition_lag(low: i64, high: i64, next: i64) -> i64 {
    let position = next.max(low);
    high.saturating_sub(position).max(0)
}

/// Collects per-thread catch-up and failure reports and publishes the overall state.
///
/// Published transitions: `CatchingUp` → `CaughtUp` once every started thread has reported,
/// and → `Failed` as soon as any thread dies (also after `CaughtUp`: a dead thread means its
/// partitions are no longer ingested).
#[derive(Debug)]
pub(crate) struct CatchUpGate {
    tx: watch::Sender<CatchUpState>,
    started: Instant,
    state: Mutex<GateState>,
}

#[derive(Debug, Default)]
struct GateState {
    /// Threads started; `None` until the partitions are known.
    expected: Option<usize>,
    caught_up: usize,
    failed: bool,
    /// Every thread has caught up, this long after start; the gate opens at [`CatchUpGate::open`].
    done: Option<Duration>,
    /// `CaughtUp` was published.
    opened: bool,
}

impl CatchUpGate {
    /// A gate in `CatchingUp`, timing from now.
    pub(crate) fn new() -> (Self, watch::Receiver<CatchUpState>) {
        let (tx, rx) = watch::channel(CatchUpState::CatchingUp);
        let gate = Self {
            tx,
            started: Instant::now(),
            state: Mutex::new(GateState::default()),
        };
        (gate, rx)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // The state is a pair of counters, consistent after any panic.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `threads` ingest threads were started; each will report once.
    pub(crate) fn expect(&self, threads: usize) {
        let mut state = self.lock();
        state.expected = Some(threads);
        self.note_if_done(&mut state);
    }

    /// One thread's partitions are caught up.
    pub(crate) fn thread_caught_up(&self) {
        let mut state = self.lock();
        state.caught_up += 1;
        self.note_if_done(&mut state);
    }

    /// Every thread has caught up and the gate is not open yet (nor failed): the supervisor
    /// refreshes the lag gauges, then calls [`CatchUpGate::open`].
    pub(crate) fn ready_to_open(&self) -> bool {
        let state = self.lock();
        state.done.is_some() && !state.opened && !state.failed
    }

    /// Publishes `CaughtUp` once every thread has caught up (once; never after a failure).
    pub(crate) fn open(&self) {
        let mut state = self.lock();
        if let Some(took) = state.done
            && !state.opened
            && !state.failed
        {
            state.opened = true;
            self.tx.send_replace(CatchUpState::CaughtUp { took });
        }
    }

    /// A thread (or the supervisor) died: start-up must not wait for it.
    pub(crate) fn failed(&self, reason: String) {
        let mut state = self.lock();
        state.failed = true;
        tracing::error!(%reason, "Kafka ingestion failed");
        self.tx.send_replace(CatchUpState::Failed(reason));
    }

    fn note_if_done(&self, state: &mut GateState) {
        if state.failed || state.done.is_some() {
            return;
        }
        if state
            .expected
            .is_some_and(|expected| state.caught_up >= expected)
        {
            let took = self.started.elapsed();
            tracing::info!(took_secs = took.as_secs_f64(), "Kafka catch-up complete");
            state.done = Some(took);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_clamped() {
        assert_eq!(partition_lag(0, 10, -1), 10);
        assert_eq!(partition_lag(4, 10, 2), 6);
        assert_eq!(partition_lag(0, 10, 10), 0);
        assert_eq!(partition_lag(0, 10, i64::MAX), 0);
        // The log was truncated or reset under us.
        assert_eq!(partition_lag(0, 3, 7), 0);
    }

    #[test]
    fn a_partition_is_caught_up_at_its_recorded_end() {
        // From the beginning (-1) of a log holding offsets 5..20.
        assert!(!partition_caught_up(5, 20, -1, false));
        assert!(!partition_caught_up(5, 20, 19, false));
        assert!(partition_caught_up(5, 20, 20, false));
        // Records appended after start do not move the goal.
        assert!(partition_caught_up(5, 20, 21, false));
        // An empty partition, or a start position at or past the end.
        assert!(partition_caught_up(7, 7, -1, false));
        assert!(partition_caught_up(0, 20, i64::MAX, false));
        // The consumer saw the end (a transaction marker holds the watermark above the last
        // record).
        assert!(partition_caught_up(0, 20, 19, true));
    }

    #[test]
    fn caught_up_after_every_thread_and_the_lag_refresh() {
        let (gate, rx) = CatchUpGate::new();
        gate.thread_caught_up();
        assert_eq!(*rx.borrow(), CatchUpState::CatchingUp);
        gate.expect(2);
        assert_eq!(*rx.borrow(), CatchUpState::CatchingUp);
        // Opening before every thread caught up does nothing.
        assert!(!gate.ready_to_open());
        gate.open();
        assert_eq!(*rx.borrow(), CatchUpState::CatchingUp);
        gate.thread_caught_up();
        // Every thread is caught up; the gate waits for the supervisor's lag refresh.
        assert!(gate.ready_to_open());
        assert_eq!(*rx.borrow(), CatchUpState::CatchingUp);
        gate.open();
        assert!(matches!(*rx.borrow(), CatchUpState::CaughtUp { .. }));
        assert!(!gate.ready_to_open());
    }

    #[test]
    fn failure_wins() {
        let (gate, rx) = CatchUpGate::new();
        gate.expect(2);
        gate.failed("boom".into());
        gate.thread_caught_up();
        gate.thread_caught_up();
        assert!(!gate.ready_to_open());
        gate.open();
        assert_eq!(*rx.borrow(), CatchUpState::Failed("boom".into()));
    }
}
