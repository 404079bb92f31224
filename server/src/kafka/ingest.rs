//! One ingest thread: a `BaseConsumer` on a dedicated OS thread that owns a fixed slice of the
//! topic's partitions, batches their records and applies them to the store.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use thunder_engine::PostStore;

use super::decode::EventBatch;
use super::metrics;
use super::shared::Shared;

/// Longest single poll, so the thread notices shutdown and flushes idle batches promptly.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Pause after a poll error before polling again (as the reference).
const POLL_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// Least time between two watermark queries while catching up.
const LAG_CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// Least time between two warnings of the same kind from one thread.
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// One partition owned by an ingest thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnedPartition {
    /// Index into `Shared::offsets`.
    pub slot: usize,
    /// Kafka partition id.
    pub partition: i32,
    /// Where consumption starts.
    pub start: Offset,
}

/// Everything one ingest thread needs.
pub(crate) struct IngestThread {
    pub index: usize,
    pub topic: String,
    pub partitions: Vec<OwnedPartition>,
    pub consumer_config: ClientConfig,
    pub batch_size: usize,
    pub fetch_timeout: Duration,
    pub request_timeout: Duration,
    pub store: Arc<PostStore>,
    pub shared: Arc<Shared>,
}

/// Logs a repeated warning at most once per [`WARN_INTERVAL`].
#[derive(Default)]
struct WarnThrottle {
    last: Option<Instant>,
    suppressed: u64,
}

impl WarnThrottle {
    fn warn(&mut self, thread: usize, what: &str, error: &dyn std::fmt::Display) {
        if self.last.is_some_and(|t| t.elapsed() < WARN_INTERVAL) {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(thread, suppressed = self.suppressed, %error, "{what}");
        self.last = Some(Instant::now());
        self.suppressed = 0;
    }
}

impl IngestThread {
    /// Runs until shutdown. A panic or an error is reported to the catch-up gate as a failure,
    /// so start-up never waits for a dead thread.
    pub(crate) fn run(self) {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.ingest()));
        let reason = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(error)) => format!("Kafka ingest thread {} stopped: {error}", self.index),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                format!("Kafka ingest thread {} panicked: {message}", self.index)
            }
        };
        self.shared.gate.failed(reason);
    }

    fn ingest(&self) -> KafkaResult<()> {
        let consumer: BaseConsumer = self.consumer_config.create()?;
        let mut assignment = TopicPartitionList::with_capacity(self.partitions.len());
        for owned in &self.partitions {
            assignment.add_partition_offset(&self.topic, owned.partition, owned.start)?;
        }
        consumer.assign(&assignment)?;
        tracing::info!(
            thread = self.index,
            partitions = ?self.partitions.iter().map(|p| p.partition).collect::<Vec<_>>(),
            "Kafka ingest thread started"
        );

        // Next offset to read per owned partition, as far as this thread has consumed.
        // `-1`: nothing read yet and starting at the beginning (the low watermark);
        // `i64::MAX`: starting at the end.
        let mut next_offsets: Vec<i64> = self
            .partitions
            .iter()
            .map(|owned| super::supervisor::start_marker(owned.start))
            .collect();
        let threshold = i64::try_from(self.partitions.len().saturating_mul(self.batch_size))
            .unwrap_or(i64::MAX);

        let mut batch = EventBatch::with_capacity(self.batch_size);
        let mut batch_started: Option<Instant> = None;
        let mut caught_up = false;
        let mut last_lag_check: Option<Instant> = None;
        let mut poll_warnings = WarnThrottle::default();
        let mut lag_warnings = WarnThrottle::default();

        while !self.shared.stop.load(Ordering::Relaxed) {
            let wait = match batch_started {
                None => POLL_INTERVAL,
                Some(started) => self
                    .fetch_timeout
                    .saturating_sub(started.elapsed())
                    .min(POLL_INTERVAL),
            };
            let mut idle = false;
            match consumer.poll(wait) {
                Some(Ok(message)) => {
                    let partition = message.partition();
                    let offset = message.offset();
                    // A bad record is counted and logged inside; the rest of the batch goes on.
                    let _ = batch.push_record(partition, offset, message.payload());
                    if let Some(i) = self
                        .partitions
                        .iter()
                        .position(|p| p.partition == partition)
                    {
                        next_offsets[i] = offset.saturating_add(1);
                    }
                    batch_started.get_or_insert_with(Instant::now);
                }
                Some(Err(error)) => {
                    metrics::POLL_ERRORS.inc();
                    poll_warnings.warn(self.index, "Kafka poll failed; retrying", &error);
                    std::thread::sleep(POLL_ERROR_BACKOFF);
                }
                None => idle = true,
            }

            let full = batch.len() >= self.batch_size;
            let lingered = batch_started.is_some_and(|t| t.elapsed() >= self.fetch_timeout);
            if !batch.is_empty() && (full || idle || lingered) {
                self.apply(&mut batch, caught_up, &next_offsets);
                batch_started = None;
            }

            if !caught_up
                && (idle || full)
                && last_lag_check.is_none_or(|t| t.elapsed() >= LAG_CHECK_INTERVAL)
            {
                last_lag_check = Some(Instant::now());
                match self.lag(&consumer, &next_offsets) {
                    Ok(lag) if lag < threshold => {
                        // Apply what is buffered first, so "caught up" covers it, whether or not
                        // the buffer is full (the reference lost the signal otherwise).
                        if !batch.is_empty() {
                            self.apply(&mut batch, caught_up, &next_offsets);
                            batch_started = None;
                        }
                        caught_up = true;
                        tracing::info!(thread = self.index, lag, "Kafka ingest thread caught up");
                        self.shared.gate.thread_caught_up();
                    }
                    Ok(_) => {}
                    Err(error) => lag_warnings.warn(
                        self.index,
                        "Kafka lag query failed; not caught up yet",
                        &error,
                    ),
                }
            }
        }
        if !batch.is_empty() {
            self.apply(&mut batch, caught_up, &next_offsets);
        }
        Ok(())
    }

    /// Records of the owned partitions not consumed yet: Σ high watermark − next offset.
    fn lag(&self, consumer: &BaseConsumer, next_offsets: &[i64]) -> KafkaResult<i64> {
        let mut total = 0i64;
        for (owned, &next) in self.partitions.iter().zip(next_offsets) {
            let (low, high) =
                consumer.fetch_watermarks(&self.topic, owned.partition, self.request_timeout)?;
            total = total.saturating_add(partition_lag(low, high, next));
        }
        Ok(total)
    }

    /// Applies the batch, serialised with the other caught-up threads when configured so, and
    /// publishes the progress.
    fn apply(&self, batch: &mut EventBatch, caught_up: bool, next_offsets: &[i64]) {
        let permit = if caught_up {
            self.shared.live_permits.as_ref().map(|p| p.acquire())
        } else {
            None
        };
        let outcome = batch.apply(&self.store);
        drop(permit);
        if let Some(offsets) = self.shared.offsets.get() {
            for (owned, &next) in self.partitions.iter().zip(next_offsets) {
                if let Some((_, slot)) = offsets.get(owned.slot) {
                    slot.store(next, Ordering::Relaxed);
                }
            }
        }
        metrics::MESSAGES_CONSUMED.inc_by(outcome.records as u64);
        self.shared.counters.record(&outcome);
    }
}

/// Lag of one partition: records between the next offset to read (or the low watermark, when
/// that is later or nothing was read yet) and the high watermark. Never negative.
pub(crate) fn partition_lag(low: i64, high: i64, next: i64) -> i64 {
    let position = next.max(low);
    high.saturating_sub(position).max(0)
}

#[cfg(test)]
mod tests {
    use super::partition_lag;

    #[test]
    fn lag_is_clamped() {
        assert_eq!(partition_lag(0, 10, -1), 10);
        assert_eq!(partition_lag(4, 10, 2), 6);
        assert_eq!(partition_lag(0, 10, 10), 0);
        assert_eq!(partition_lag(0, 10, i64::MAX), 0);
        // The log was truncated or reset under us.
        assert_eq!(partition_lag(0, 3, 7), 0);
    }
}
