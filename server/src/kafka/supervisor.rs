//! The supervisor thread: discovers the partitions and start offsets, starts the ingest
//! threads, then keeps the lag gauge fresh until shutdown.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use thunder_engine::PostStore;

use super::config::KafkaArgs;
use super::ingest::{IngestThread, OwnedPartition, partition_lag};
use super::metrics;
use super::shared::Shared;

/// Longest wait between two attempts to read the topic's metadata or start offsets.
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(10);

/// Splits `partitions` into at most `threads` contiguous slices whose sizes differ by at most
/// one. Never returns an empty slice, so no thread is started without work.
pub fn split_partitions(partitions: &[i32], threads: usize) -> Vec<&[i32]> {
    let threads = threads.clamp(1, partitions.len().max(1));
    let base = partitions.len() / threads;
    let extra = partitions.len() % threads;
    let mut slices = Vec::with_capacity(threads);
    let mut rest = partitions;
    for t in 0..threads {
        let (slice, tail) = rest.split_at(base + usize::from(t < extra));
        if !slice.is_empty() {
            slices.push(slice);
        }
        rest = tail;
    }
    slices
}

/// Discovers the partitions, starts the ingest threads, then runs the lag monitor until
/// shutdown.
pub(super) struct Supervisor {
    pub(super) args: KafkaArgs,
    pub(super) consumer_config: ClientConfig,
    pub(super) metadata_client: BaseConsumer,
    pub(super) store: Arc<PostStore>,
    pub(super) shared: Arc<Shared>,
}

impl Supervisor {
    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.args.kafka_request_timeout_ms.max(1))
    }

    /// Retries `attempt` with backoff until it succeeds or shutdown is requested.
    fn retry<T>(&self, what: &str, mut attempt: impl FnMut() -> Result<T, String>) -> Option<T> {
        let mut backoff = Duration::from_millis(200);
        loop {
            if self.shared.stopping() {
                return None;
            }
            match attempt() {
                Ok(value) => return Some(value),
                Err(error) => {
                    tracing::warn!(topic = %self.args.kafka_topic, %error, "{what}; retrying");
                    if !self.shared.sleep(backoff) {
                        return None;
                    }
                    backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
                }
            }
        }
    }

    fn partitions(&self) -> Result<Vec<i32>, String> {
        let metadata = self
            .metadata_client
            .fetch_metadata(Some(&self.args.kafka_topic), self.request_timeout())
            .map_err(|e| e.to_string())?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.args.kafka_topic)
            .ok_or("topic missing from metadata")?;
        if let Some(error) = topic.error() {
            return Err(format!("topic metadata error: {error:?}"));
        }
        let mut partitions: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
        if partitions.is_empty() {
            return Err("topic has no partitions".into());
        }
        partitions.sort_unstable();
        Ok(partitions)
    }

    /// Per partition, the first offset whose timestamp is not older than the retention.
    fn offsets_from_time(&self, partitions: &[i32]) -> Result<Vec<Offset>, String> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let since_ms = now_ms.saturating_sub(self.store.retention_secs().saturating_mul(1000));
        let mut query = TopicPartitionList::with_capacity(partitions.len());
        for &p in partitions {
            query
                .add_partition_offset(&self.args.kafka_topic, p, Offset::Offset(since_ms))
                .map_err(|e| e.to_string())?;
        }
        let answer = self
            .metadata_client
            .offsets_for_times(query, self.request_timeout())
            .map_err(|e| e.to_string())?;
        partitions
            .iter()
            .map(|&p| {
                let element = answer
                    .find_partition(&self.args.kafka_topic, p)
                    .ok_or_else(|| format!("no offset for partition {p}"))?;
                element.error().map_err(|e| format!("partition {p}: {e}"))?;
                match element.offset() {
                    offset @ (Offset::Offset(_) | Offset::End) => Ok(offset),
                    other => Err(format!("partition {p}: unexpected offset {other:?}")),
                }
            })
            .collect()
    }

    pub(super) fn run(self) {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.supervise()));
        if outcome.is_err() {
            self.shared.gate.failed("Kafka supervisor panicked".into());
        }
    }

    fn supervise(&self) {
        let Some(partitions) =
            self.retry("cannot read the topic's partitions", || self.partitions())
        else {
            return;
        };
        let starts = if self.args.start_from_time {
            let lookup = || self.offsets_from_time(&partitions);
            match self.retry("cannot look up start offsets by time", lookup) {
                Some(starts) => starts,
                None => return,
            }
        } else {
            vec![Offset::Beginning; partitions.len()]
        };
        tracing::info!(
            topic = %self.args.kafka_topic,
            partitions = partitions.len(),
            start_from_time = self.args.start_from_time,
            "Kafka partitions discovered"
        );
        let offsets = partitions
            .iter()
            .zip(&starts)
            .map(|(&p, start)| (p, AtomicI64::new(start_marker(*start))))
            .collect();
        // Only the supervisor sets it, once.
        let _ = self.shared.offsets.set(offsets);

        let slices = split_partitions(&partitions, self.args.kafka_num_threads);
        self.shared.gate.expect(slices.len());
        let mut threads = Vec::with_capacity(slices.len());
        let mut slot = 0;
        for (index, slice) in slices.iter().enumerate() {
            let owned = slice
                .iter()
                .map(|&partition| {
                    let owned = OwnedPartition {
                        slot,
                        partition,
                        start: starts[slot],
                    };
                    slot += 1;
                    owned
                })
                .collect();
            let thread = IngestThread {
                index,
                topic: self.args.kafka_topic.clone(),
                partitions: owned,
                consumer_config: self.consumer_config.clone(),
                batch_size: self.args.kafka_batch_size,
                fetch_timeout: Duration::from_millis(self.args.kafka_fetch_timeout_ms.max(1)),
                request_timeout: self.request_timeout(),
                store: Arc::clone(&self.store),
                shared: Arc::clone(&self.shared),
            };
            match std::thread::Builder::new()
                .name(format!("kafka-ingest-{index}"))
                .spawn(move || thread.run())
            {
                Ok(handle) => threads.push(handle),
                Err(error) => {
                    self.shared
                        .gate
                        .failed(format!("cannot start Kafka ingest thread {index}: {error}"));
                }
            }
        }

        self.monitor_lag();
        for thread in threads {
            let _ = thread.join();
        }
    }

    /// Refreshes `kafka_partition_lag` every `--lag-monitor-interval-secs` until shutdown.
    fn monitor_lag(&self) {
        let Some(offsets) = self.shared.offsets.get() else {
            return;
        };
        let interval = Duration::from_secs(self.args.lag_monitor_interval_secs.max(1));
        let topic = self.args.kafka_topic.as_str();
        let mut warned_at: Option<Instant> = None;
        loop {
            for (partition, next) in offsets {
                if self.shared.stopping() {
                    return;
                }
                match self.metadata_client.fetch_watermarks(
                    topic,
                    *partition,
                    self.request_timeout(),
                ) {
                    Ok((low, high)) => {
                        let lag = partition_lag(low, high, next.load(Ordering::Relaxed));
                        metrics::PARTITION_LAG
                            .with_label_values(&[topic, &partition.to_string()])
                            .set(lag);
                    }
                    Err(error) => {
                        if warned_at
                            .is_none_or(|t| t.elapsed() >= interval.max(Duration::from_secs(60)))
                        {
                            tracing::warn!(topic, partition, %error, "cannot read Kafka watermarks for the lag gauge");
                            warned_at = Some(Instant::now());
                        }
                    }
                }
            }
            if !self.shared.sleep(interval) {
                return;
            }
        }
    }
}

/// The next-offset value that stands for a start position before anything was read.
pub(super) fn start_marker(start: Offset) -> i64 {
    match start {
        Offset::Offset(offset) => offset,
        Offset::End => i64::MAX,
        _ => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_balanced_and_never_empty() {
        let parts: Vec<i32> = (0..10).collect();
        let slices = split_partitions(&parts, 4);
        assert_eq!(
            slices.iter().map(|s| s.len()).collect::<Vec<_>>(),
            vec![3, 3, 2, 2]
        );
        assert_eq!(slices.concat(), parts);
        assert_eq!(split_partitions(&parts[..2], 8).len(), 2);
        assert_eq!(split_partitions(&parts[..1], 3), vec![&[0][..]]);
        assert!(split_partitions(&[], 3).is_empty());
        assert_eq!(split_partitions(&parts, 0).len(), 1);
    }
}
