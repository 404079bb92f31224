//! Kafka ingestion: the only way posts reach the store.
//!
//! Topic `innetwork_post` (configurable) carries one protobuf `InNetworkEvent` per record.
//! [`start`] discovers the topic's partitions, splits them into fixed slices over
//! `--kafka-num-threads` dedicated OS threads (each a librdkafka `BaseConsumer` with a manual
//! assignment, off the tokio workers) and applies every batch to the [`PostStore`]:
//! `insert_posts` with its creates, then `mark_as_deleted` with its deletes.
//!
//! # Start position and replicas
//! Every process reads every partition: the group id gets a uuid suffix and offsets are never
//! committed. Consumption starts at the beginning of the retained log, or with
//! `--start-from-time` at the first record not older than the store's retention.
//!
//! # Catch-up gate
//! [`KafkaIngest::caught_up`] is `CatchingUp` until every thread has seen the lag of its
//! partitions (high watermark − next offset) drop below partitions × batch size, then
//! `CaughtUp`. A thread that dies turns it into `Failed` instead of leaving start-up waiting.
//!
//! The threshold is the reference's: up to partitions × batch size records per thread may
//! still be unread at `CaughtUp`; they follow within moments. A thread whose buffer never
//! fills (a small backlog) still reports, because the lag is also checked whenever the
//! consumer has nothing more to hand out.
//!
//! # After catch-up
//! Batches of caught-up threads take one of `--kafka-live-batch-permits` permits (default 1,
//! as the reference), so store writes use at most one core and queries keep the rest.
//! Before catch-up every thread writes in parallel. The store itself needs no such lock.
//!
//! # Failures
//! Undecodable records are counted (`kafka_messages_failed_parse_total`), logged with their
//! partition and offset, and skipped. Poll errors are counted (`kafka_poll_errors_total`) and
//! retried; a broker that goes away is waited for, and ingestion resumes when it returns.
//!
//! # Ordering
//! Within one partition records are applied in offset order. Producers key creates by author
//! id, so one author's posts keep their order; the store's rules make the result independent
//! of the order across partitions (a delete that arrives before its create still wins).

mod config;
mod decode;
mod gate;
mod ingest;
mod metrics;
pub mod produce;
mod producer;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use thunder_engine::PostStore;
use tokio::sync::watch;

pub use config::{IN_NETWORK_EVENTS_TOPIC, KafkaArgs};
pub use decode::{
    BatchOutcome, DecodeError, EventBatch, IngestEvent, create_event, decode_event,
    delete_envelope, delete_event, light_post,
};
pub use producer::{EventProducer, ProducerStats};

use decode::BatchOutcome as Outcome;
use gate::CatchUpGate;
use ingest::{IngestThread, OwnedPartition, partition_lag};

/// Longest wait between two attempts to read the topic's metadata or start offsets.
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(10);

/// Errors of the Kafka ingestion and producer.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// `--kafka-brokers` is not set.
    #[error("no Kafka brokers configured (--kafka-brokers / THUNDER_KAFKA_BROKERS)")]
    NoBrokers,
    /// A flag has a value ingestion cannot work with.
    #[error("invalid Kafka configuration: {0}")]
    InvalidConfig(String),
    /// librdkafka refused the configuration or a request.
    #[error("Kafka client error: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    /// An ingest thread could not be started.
    #[error("could not start a Kafka thread: {0}")]
    Thread(#[from] std::io::Error),
}

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
    /// Batches applied.
    pub batches: u64,
}

#[derive(Debug, Default)]
struct Counters {
    records: AtomicU64,
    creates: AtomicU64,
    deletes: AtomicU64,
    failed: AtomicU64,
    batches: AtomicU64,
}

impl Counters {
    fn record(&self, outcome: &Outcome) {
        self.creates
            .fetch_add(outcome.creates as u64, Ordering::Relaxed);
        self.deletes
            .fetch_add(outcome.deletes as u64, Ordering::Relaxed);
        self.failed
            .fetch_add(outcome.failed as u64, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        // Release: pairs with the Acquire in `snapshot`, so whoever sees these records counted
        // also sees the store calls that applied them.
        self.records
            .fetch_add(outcome.records as u64, Ordering::Release);
    }

    fn snapshot(&self) -> IngestStats {
        // Acquire: pairs with the Release in `record`.
        let records = self.records.load(Ordering::Acquire);
        IngestStats {
            records,
            creates: self.creates.load(Ordering::Relaxed),
            deletes: self.deletes.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
        }
    }
}

/// A counting semaphore for OS threads: how many caught-up threads may apply a batch at once.
#[derive(Debug)]
struct LivePermits {
    available: Mutex<usize>,
    released: Condvar,
}

/// A held [`LivePermits`] permit; released on drop.
struct LivePermit<'a>(&'a LivePermits);

impl LivePermits {
    fn new(permits: usize) -> Self {
        Self {
            available: Mutex::new(permits),
            released: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, usize> {
        // A plain counter: consistent after any panic.
        self.available
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn acquire(&self) -> LivePermit<'_> {
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

/// State shared by the supervisor, the ingest threads and the [`KafkaIngest`] handle.
struct Shared {
    stop: AtomicBool,
    gate: CatchUpGate,
    counters: Counters,
    live_permits: Option<LivePermits>,
    /// Next offset to apply per partition slot (metadata order), once partitions are known.
    /// `-1`: from the low watermark; `i64::MAX`: from the end.
    offsets: OnceLock<Vec<(i32, AtomicI64)>>,
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Sleeps up to `duration`; false when shutdown was requested meanwhile.
    fn sleep(&self, duration: Duration) -> bool {
        let deadline = Instant::now() + duration;
        while !self.stopping() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        false
    }
}

/// Handle on running Kafka ingestion. Dropping it stops ingestion without waiting;
/// [`shutdown`](Self::shutdown) stops it and waits for the threads to finish their batch.
pub struct KafkaIngest {
    /// The catch-up gate (see [`CatchUpState`]).
    pub caught_up: watch::Receiver<CatchUpState>,
    shared: Arc<Shared>,
    supervisor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for KafkaIngest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaIngest")
            .field("caught_up", &*self.caught_up.borrow())
            .field("stats", &self.stats())
            .finish()
    }
}

impl KafkaIngest {
    /// Totals applied to the store so far. A store read made after observing `records == n`
    /// sees the effects of those `n` records.
    pub fn stats(&self) -> IngestStats {
        self.shared.counters.snapshot()
    }

    /// Stops ingestion: every thread applies what it has buffered and exits. Waits for them
    /// off the async workers.
    pub async fn shutdown(mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(supervisor) = self.supervisor.take() {
            let _ = tokio::task::spawn_blocking(move || supervisor.join()).await;
        }
    }

    /// [`shutdown`](Self::shutdown) for callers outside an async runtime.
    pub fn shutdown_blocking(mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(supervisor) = self.supervisor.take() {
            let _ = supervisor.join();
        }
    }
}

impl Drop for KafkaIngest {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts Kafka ingestion into `store` and returns at once; watch
/// [`KafkaIngest::caught_up`] for the catch-up gate.
///
/// Fails only on configuration errors (no brokers, a property librdkafka rejects). An
/// unreachable broker or a missing topic is retried in the background and keeps the gate in
/// `CatchingUp`.
pub fn start(args: &KafkaArgs, store: Arc<PostStore>) -> Result<KafkaIngest, KafkaError> {
    if args.kafka_num_threads == 0 {
        return Err(KafkaError::InvalidConfig(
            "--kafka-num-threads must be at least 1".into(),
        ));
    }
    if args.kafka_batch_size == 0 {
        return Err(KafkaError::InvalidConfig(
            "--kafka-batch-size must be at least 1".into(),
        ));
    }
    if args.kafka_topic.is_empty() {
        return Err(KafkaError::InvalidConfig(
            "--kafka-topic must not be empty".into(),
        ));
    }
    metrics::init();
    let group_id = format!("{}-{}", args.kafka_group_id, uuid::Uuid::new_v4());
    let consumer_config = args.consumer_config(&group_id)?;
    // Creating the metadata client validates every property now rather than in a thread.
    let metadata_client: BaseConsumer = consumer_config.create()?;
    tracing::info!(
        topic = %args.kafka_topic,
        group_id = %group_id,
        threads = args.kafka_num_threads,
        batch_size = args.kafka_batch_size,
        "starting Kafka ingestion"
    );

    let (gate, caught_up) = CatchUpGate::new();
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        gate,
        counters: Counters::default(),
        live_permits: (args.kafka_live_batch_permits > 0)
            .then(|| LivePermits::new(args.kafka_live_batch_permits)),
        offsets: OnceLock::new(),
    });
    let supervisor = Supervisor {
        args: args.clone(),
        consumer_config,
        metadata_client,
        store,
        shared: Arc::clone(&shared),
    };
    let supervisor = std::thread::Builder::new()
        .name("kafka-supervisor".into())
        .spawn(move || supervisor.run())?;
    Ok(KafkaIngest {
        caught_up,
        shared,
        supervisor: Some(supervisor),
    })
}

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
struct Supervisor {
    args: KafkaArgs,
    consumer_config: ClientConfig,
    metadata_client: BaseConsumer,
    store: Arc<PostStore>,
    shared: Arc<Shared>,
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

    fn run(self) {
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
fn start_marker(start: Offset) -> i64 {
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

    #[test]
    fn permits_limit_concurrency() {
        let permits = LivePermits::new(1);
        let held = permits.acquire();
        assert_eq!(*permits.lock(), 0);
        drop(held);
        assert_eq!(*permits.lock(), 1);
    }
}
