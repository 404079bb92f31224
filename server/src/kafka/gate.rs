//! The catch-up gate: start-up waits until every ingest thread has read its backlog.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Progress of the start-up catch-up, published on [`KafkaIngest::caught_up`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatchUpState {
    /// Still reading the backlog (or waiting for the broker or the topic).
    CatchingUp,
    /// Every ingest thread has read its backlog; `took` is the time since [`start`].
    CaughtUp {
        /// Time from [`start`] to catch-up.
        took: Duration,
    },
    /// An ingest thread died; ingestion of its partitions has stopped.
    Failed(String),
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
        self.publish_if_done(&state);
    }

    /// One thread's partitions are caught up.
    pub(crate) fn thread_caught_up(&self) {
        let mut state = self.lock();
        state.caught_up += 1;
        self.publish_if_done(&state);
    }

    /// A thread (or the supervisor) died: start-up must not wait for it.
    pub(crate) fn failed(&self, reason: String) {
        let mut state = self.lock();
        state.failed = true;
        tracing::error!(%reason, "Kafka ingestion failed");
        self.tx.send_replace(CatchUpState::Failed(reason));
    }

    fn publish_if_done(&self, state: &GateState) {
        if state.failed {
            return;
        }
        if state
            .expected
            .is_some_and(|expected| state.caught_up >= expected)
        {
            let took = self.started.elapsed();
            tracing::info!(took_secs = took.as_secs_f64(), "Kafka catch-up complete");
            self.tx.send_replace(CatchUpState::CaughtUp { took });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caught_up_after_every_thread() {
        let (gate, rx) = CatchUpGate::new();
        gate.thread_caught_up();
        assert_eq!(*rx.borrow(), CatchUpState::CatchingUp);
        gate.expect(2);
        assert_eq!(*rx.borrow(), CatchUpState::CatchingUp);
        gate.thread_caught_up();
        assert!(matches!(*rx.borrow(), CatchUpState::CaughtUp { .. }));
    }

    #[test]
    fn failure_wins() {
        let (gate, rx) = CatchUpGate::new();
        gate.expect(2);
        gate.failed("boom".into());
        gate.thread_caught_up();
        gate.thread_caught_up();
        assert_eq!(*rx.borrow(), CatchUpState::Failed("boom".into()));
    }
}
