//! The supervisor thread: discovers the partitions and start offsets, starts the ingest
//! threads, then keeps the lag gauge fresh until shutdown and reports partition logs that end
//! below the applied position (truncation) to the thread that owns them.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use thunder_engine::{PostStore, Store};

use super::config::KafkaArgs;
use super::gate::{CatchUpState, partition_lag};
use super::ingest::{IngestThread, OwnedPartition};
use super::metrics::KafkaMetrics;
use super::partition::{PartitionState, start_marker};
use super::progress::Shared;
use super::resume::{Restore, TopicStart};
use super::stall::{PartitionCheck, StallTracker};
use super::throttle::{LOG_INTERVAL, ThrottledContext};

/// Longest wait between two attempts to read the topic's metadata or start offsets.
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(10);

/// How long one poll of the metadata client's events waits.
const EVENT_POLL: Duration = Duration::from_millis(200);

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

/// Events a catch-up inserts at most: per partition, from the later of its start and its first
/// offset inside the retention (`retained`) to its end (`watermarks` are `(low, high)`).
fn backlog_events(starts: &[Offset], retained: &[Offset], watermarks: &[(i64, i64)]) -> usize {
    let first = |offset: &Offset, low: i64, high: i64| match offset {
        Offset::Offset(n) => (*n).clamp(low, high),
        Offset::End => high,
        _ => low,
    };
    starts
        .iter()
        .zip(retained)
        .zip(watermarks)
        .map(|((start, retained), &(low, high))| {
            let from = first(start, low, high).max(first(retained, low, high));
            usize::try_from(high.saturating_sub(from)).unwrap_or(0)
        })
        .sum()
}

/// Discovers the partitions, starts the ingest threads, then runs the lag monitor until
/// shutdown.
pub(super) struct Supervisor {
    pub(super) args: KafkaArgs,
    pub(super) consumer_config: ClientConfig,
    pub(super) metadata_client: BaseConsumer<ThrottledContext>,
    pub(super) store: Arc<PostStore>,
    pub(super) shared: Arc<Shared>,
    /// Loads a snapshot once the partitions' watermarks are known (see `resume.rs`).
    pub(super) restore: Option<Restore>,
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
                    tracing::warn!(topic = %self.args.client.kafka_topic, %error, "{what}; retrying");
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
            .fetch_metadata(Some(&self.args.client.kafka_topic), self.request_timeout())
            .map_err(|e| e.to_string())?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.args.client.kafka_topic)
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
                .add_partition_offset(&self.args.client.kafka_topic, p, Offset::Offset(since_ms))
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
                    .find_partition(&self.args.client.kafka_topic, p)
                    .ok_or_else(|| format!("no offset for partition {p}"))?;
                element.error().map_err(|e| format!("partition {p}: {e}"))?;
                match element.offset() {
                    offset @ (Offset::Offset(_) | Offset::End) => Ok(offset),
                    other => Err(format!("partition {p}: unexpected offset {other:?}")),
                }
            })
            .collect()
    }

    /// Sizes the store's post index once for the posts the catch-up is about to insert (the
    /// events between each partition's start and its end, counted from the first offset
    /// inside the retention), so the replay never stops to rehash the index on the way.
    /// `retained`: those first offsets if already looked up (`--start-from-time`); otherwise
    /// they are looked up here, and the sizing is skipped if that fails.
    fn presize_post_index(
        &self,
        partitions: &[i32],
        starts: &[Offset],
        retained: Option<Vec<Offset>>,
        watermarks: &[(i64, i64)],
    ) {
        let retained = match retained.map_or_else(|| self.offsets_from_time(partitions), Ok) {
            Ok(retained) => retained,
            Err(error) => {
                tracing::info!(%error, "post index not presized: no offsets by time");
                return;
            }
        };
        let backlog = backlog_events(starts, &retained, watermarks);
        let posts = self.store.stored_posts().saturating_add(backlog);
        self.store.reserve_posts(posts);
        tracing::info!(
            backlog_events = backlog,
            posts,
            "post index sized for the catch-up"
        );
    }

    pub(super) fn run(mut self) {
        let restore = self.restore.take();
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            // librdkafka hands a client's log lines (and so its broker connection failures,
            // `connection.rs`) to its event queue: serve the metadata client's while the
            // supervisor blocks in its requests, so a refused connection is reported at once.
            let poller = std::thread::Builder::new()
                .name("kafka-events".into())
                .spawn_scoped(scope, || {
                    // Relaxed: a stop flag, read again every poll.
                    while !done.load(Ordering::Relaxed) && !self.shared.stopping() {
                        let _ = self.metadata_client.poll(EVENT_POLL);
                    }
                });
            let outcome = catch_unwind(AssertUnwindSafe(|| self.supervise(restore)));
            done.store(true, Ordering::Relaxed);
            if outcome.is_err() {
                self.shared.gate.failed("Kafka supervisor panicked".into());
            }
            if let Ok(poller) = poller {
                let _ = poller.join();
            }
        });
    }

    fn supervise(&self, restore: Option<Restore>) {
        let Some(partitions) =
            self.retry("cannot read the topic's partitions", || self.partitions())
        else {
            return;
        };
        // The first offsets inside the retention, when they are where reading starts.
        let retained = if self.args.start_from_time {
            let lookup = || self.offsets_from_time(&partitions);
            match self.retry("cannot look up start offsets by time", lookup) {
                Some(retained) => Some(retained),
                None => return,
            }
        } else {
            None
        };
        let starts = retained
            .clone()
            .unwrap_or_else(|| vec![Offset::Beginning; partitions.len()]);
        tracing::info!(
            topic = %self.args.client.kafka_topic,
            partitions = partitions.len(),
            start_from_time = self.args.start_from_time,
            "Kafka partitions discovered"
        );
        // The goal of catch-up: each partition's end when we start (and its start, for
        // partitions that are empty from where we read).
        let Some(mut watermarks) = self.retry("cannot read the partitions' watermarks", || {
            self.watermarks(&partitions)
        }) else {
            return;
        };
        let mut starts = starts;
        if let Some(restore) = restore {
            let topic = TopicStart::new(&self.args.client.kafka_topic, &partitions, &watermarks);
            if let Some(resumed) = restore(&topic) {
                starts = topic.resume_starts(&starts, &resumed);
                // The catch-up goal is where the topic ends now, after the load.
                let Some(now) = self.retry("cannot read the partitions' watermarks", || {
                    self.watermarks(&partitions)
                }) else {
                    return;
                };
                watermarks = now;
            }
        }
        self.presize_post_index(&partitions, &starts, retained, &watermarks);
        let states = partitions
            .iter()
            .zip(&starts)
            .zip(&watermarks)
            .map(|((&partition, start), &(low, high))| PartitionState {
                partition,
                low_at_start: low,
                end_at_start: high,
                next: AtomicI64::new(start_marker(*start)),
                at_end: AtomicBool::new(false),
                truncation: Mutex::default(),
                reading: AtomicBool::new(false),
            })
            .collect();
        // Only the supervisor sets it, once, before any thread starts.
        let _ = self.shared.partitions.set(states);
        self.export_partition_gauges(&partitions, &starts, &watermarks);
        tracing::info!(
            topic = %self.args.client.kafka_topic,
            end_offsets = %super::offsets_text(partitions.iter().zip(&watermarks).map(|(p, (_, high))| (*p, *high))),
            "Kafka catch-up goal recorded"
        );

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
                topic: self.args.client.kafka_topic.clone(),
                partitions: owned,
                consumer_config: self.consumer_config.clone(),
                batch_size: self.args.kafka_batch_size,
                fetch_timeout: Duration::from_millis(self.args.kafka_fetch_timeout_ms.max(1)),
                max_response_bytes: self.args.kafka_max_response_bytes,
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

        self.monitor();
        for thread in threads {
            let _ = thread.join();
        }
    }

    /// Exports every per-partition metric from start-up: the lag from the watermarks just
    /// read, not stalled, no truncation, refreshed now.
    fn export_partition_gauges(
        &self,
        partitions: &[i32],
        starts: &[Offset],
        watermarks: &[(i64, i64)],
    ) {
        let topic = self.args.client.kafka_topic.as_str();
        let kafka = KafkaMetrics::global();
        for ((partition, start), &(low, high)) in partitions.iter().zip(starts).zip(watermarks) {
            let labels = [topic, &partition.to_string()];
            kafka
                .partition_lag
                .with_label_values(&labels)
                .set(partition_lag(low, high, start_marker(*start)));
            kafka.partition_stalled.with_label_values(&labels).set(0);
            kafka
                .partition_lag_refresh_age
                .refreshed_at(topic, *partition, Instant::now());
            kafka.log_truncations.with_label_values(&labels);
        }
    }

    /// Low and high watermark of every partition, in order.
    fn watermarks(&self, partitions: &[i32]) -> Result<Vec<(i64, i64)>, String> {
        partitions
            .iter()
            .map(|&p| {
                self.metadata_client
                    .fetch_watermarks(&self.args.client.kafka_topic, p, self.request_timeout())
                    .map_err(|e| format!("partition {p}: {e}"))
            })
            .collect()
    }

    /// Until shutdown: refreshes `kafka_partition_lag` and, once caught up, applies the stall
    /// rule (see `stall.rs`) and publishes the stalled partitions. Opens the catch-up gate
    /// after a whole refresh that started with every thread caught up, so readiness never
    /// turns on beside a lag gauge that still shows the backlog (see `gate.rs`).
    fn monitor(&self) {
        let Some(states) = self.shared.partitions.get() else {
            return;
        };
        let stall_timeout = Duration::from_secs(self.args.kafka_stall_timeout_secs);
        let lag_interval = Duration::from_secs(self.args.lag_monitor_interval_secs.max(1));
        let tick = if stall_timeout.is_zero() {
            lag_interval
        } else {
            (stall_timeout / 4)
                .clamp(Duration::from_millis(250), Duration::from_secs(5))
                .min(lag_interval)
        };
        let topic = self.args.client.kafka_topic.as_str();
        let mut tracker = StallTracker::new(states.len(), stall_timeout);
        let mut warned_at: Option<Instant> = None;
        loop {
            // Read before the pass: every lag it refreshes is read after the catch-up.
            let opening = self.shared.gate.ready_to_open();
            let caught_up = matches!(
                *self.shared.caught_up.borrow(),
                CatchUpState::CaughtUp { .. }
            );
            let mut changed = false;
            for (index, state) in states.iter().enumerate() {
                if self.shared.stopping() {
                    return;
                }
                // Read before `next`: a truncation seen against this `next` is reported for
                // this epoch only (see `TruncationReport`).
                let epoch = state.truncation().epoch;
                // Relaxed: the gauges are estimates, and `next` guards no other data.
                let next = state.next.load(Ordering::Relaxed);
                let at_end = state.at_end.load(Ordering::Relaxed);
                let label = state.partition.to_string();
                let lag = self.refresh_lag(state, next, epoch, &mut warned_at);
                if !caught_up {
                    continue;
                }
                let check = PartitionCheck { next, lag, at_end };
                if tracker.observe(index, check, Instant::now()) {
                    changed = true;
                    let stalled = tracker.stalled(index);
                    KafkaMetrics::global()
                        .partition_stalled
                        .with_label_values(&[topic, &label])
                        .set(i64::from(stalled));
                    if stalled {
                        tracing::error!(
                            topic,
                            partition = state.partition,
                            offset = next,
                            lag,
                            stall_timeout_secs = stall_timeout.as_secs(),
                            "Kafka partition stalled: records wait but none was applied within the stall timeout; readiness off until it moves"
                        );
                    } else {
                        tracing::info!(
                            topic,
                            partition = state.partition,
                            offset = next,
                            "Kafka partition moves again"
                        );
                    }
                }
            }
            if opening {
                self.shared.gate.open();
            }
            if changed {
                let stalled = states
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| tracker.stalled(*i))
                    .map(|(_, s)| s.partition)
                    .collect();
                self.shared.stalled.send_replace(stalled);
            }
            // The last thread's catch-up cuts the wait short: readiness waits for a pass.
            if !self
                .shared
                .sleep_unless(tick, || self.shared.gate.ready_to_open())
            {
                return;
            }
        }
    }

    /// Refreshes `state`'s lag gauge from the broker's watermarks against the applied `next`,
    /// and reports a log that ends below it (a truncation, for this `epoch` only). `None` when
    /// the watermarks cannot be read: the lag sample is removed meanwhile (warned at most once
    /// a `LOG_INTERVAL`, `warned_at`).
    fn refresh_lag(
        &self,
        state: &PartitionState,
        next: i64,
        epoch: u64,
        warned_at: &mut Option<Instant>,
    ) -> Option<i64> {
        let topic = self.args.client.kafka_topic.as_str();
        let label = state.partition.to_string();
        let labels = [topic, label.as_str()];
        match self
            .metadata_client
            .fetch_watermarks(topic, state.partition, self.request_timeout())
        {
            Ok((low, high)) => {
                let lag = partition_lag(low, high, next);
                let kafka = KafkaMetrics::global();
                kafka.partition_lag.with_label_values(&labels).set(lag);
                kafka.partition_lag_refresh_age.refreshed_at(
                    topic,
                    state.partition,
                    Instant::now(),
                );
                // The log ends below what was applied: the broker lost records.
                if (0..i64::MAX).contains(&next) && high < next {
                    let mut report = state.truncation();
                    if report.epoch == epoch {
                        report.log_end = Some(report.log_end.map_or(high, |end| end.min(high)));
                    }
                }
                Some(lag)
            }
            Err(error) => {
                if warned_at.is_none_or(|t| t.elapsed() >= LOG_INTERVAL) {
                    tracing::warn!(topic, partition = state.partition, %error, "cannot read Kafka watermarks for the lag gauge");
                    *warned_at = Some(Instant::now());
                }
                // No stale lag: the sample is gone until a refresh succeeds, and the refresh
                // age says for how long.
                let _ = KafkaMetrics::global()
                    .partition_lag
                    .remove_label_values(&labels);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_counts_from_the_later_of_start_and_retention() {
        let watermarks = [(0, 100), (50, 80), (10, 10), (0, 40)];
        let starts = [
            Offset::Beginning,
            Offset::Offset(70),
            Offset::Beginning,
            Offset::Offset(500),
        ];
        let retained = [
            Offset::Offset(60),
            Offset::Offset(55),
            Offset::End,
            Offset::End,
        ];
        // 100 - 60, 80 - 70, empty, start past the end.
        assert_eq!(backlog_events(&starts, &retained, &watermarks), 40 + 10);
        let everything = [Offset::Beginning; 4];
        assert_eq!(
            backlog_events(&everything, &everything, &watermarks),
            100 + 30 + 40
        );
    }

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
