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
//! `--start-from-time` at the first record not older than the store's retention. With a
//! snapshot loaded ([`start_with`], `resume.rs`), the partitions it covers resume at the
//! offsets it recorded.
//!
//! # Catch-up gate (`gate.rs`)
//! At start the supervisor records every partition's high watermark. [`KafkaIngest::caught_up`]
//! is `CatchingUp` until every partition has applied everything up to that offset (or its
//! consumer reported the end of the partition), then `CaughtUp`: nothing that was in the topic
//! at start is unread when readiness turns SERVING. A thread that dies, or an error that
//! retrying cannot heal (a codec this build cannot decode, a corrupt batch, no authorisation,
//! an unknown partition), turns it into `Failed` with the topic, partition, offset and cause.
//!
//! # Stalls (`stall.rs`)
//! After catch-up, a partition with records to read that has not moved for
//! `--kafka-stall-timeout-secs` is published on [`KafkaIngest::stalled`] (and in
//! `kafka_partition_stalled`) until it moves again; the server turns readiness off meanwhile.
//!
//! # Log truncation (`ingest.rs`, `supervisor.rs`)
//! A broker that loses records it had acknowledged (a restart without them, unclean leader
//! election, a re-created topic) ends the partition's log below the offset we have read, and
//! gives the lost offsets to new records. Three checks find it: the lag monitor sees a high
//! watermark below the applied position; librdkafka reports a fetch position outside the log
//! (`auto.offset.reset=error`, the default); and after a broker outage each ingest thread
//! reads the last record it had read before the outage again (same offset, timestamp and
//! payload length), which catches a log that new records regrew past our position before we
//! reconnected. Each truncation is counted once in `kafka_log_truncations_total`, logged
//! (position, new log end, offsets lost or reused, where reading resumes), and the partition
//! is read again from the first record not older than the last one read before it, less five
//! minutes (the log start if that lookup fails), which is at or before the lowest offset a new
//! record may have taken: no new record is skipped. Posts applied from the lost records stay
//! (until retention or a delete removes them); records read twice change nothing (creates of
//! stored ids are counted as `duplicate` drops, deletes refresh their tombstones). A position
//! below the log start (retention deleted records before they were read) resumes at the log
//! start, logged, not counted as a truncation.
//!
//! # After catch-up
//! Batches of caught-up threads take one of `--kafka-live-batch-permits` permits (default 1,
//! as the reference), so store writes use at most one core and queries keep the rest.
//! Before catch-up every thread writes in parallel. The store itself needs no such lock.
//!
//! # Failures
//! Undecodable records (`records.rs`, over the one decode path, `thunder_events::codec`) are
//! counted (`kafka_messages_failed_parse_total`), logged with their partition and offset, and
//! skipped; records with ids the gRPC contract cannot express (negative, or a post or author
//! id of 0) and events the store drops are counted by reason (`kafka_events_dropped_total`)
//! and sampled in the log. Poll errors are counted (`kafka_poll_errors_total`) and retried; a
//! broker that goes away is waited for, and ingestion resumes when it returns. librdkafka's
//! own log lines and ingestion's warnings are rate-limited (`throttle.rs`). A fetch response
//! larger than `receive.message.max.bytes` (from a broker that ignores the fetch limits) is
//! counted (`kafka_oversized_fetch_responses_total`) and the thread reconnects its consumer
//! with a limit that fits, up to `--kafka-max-response-bytes` (`fetch_limits.rs`).
//!
//! # Metrics (`metrics.rs`, `lag_refresh.rs`)
//! [`metrics::KafkaMetrics`] declares ingestion's metrics (every drop and connection-error
//! reason exported at zero); `kafka_partition_lag_refresh_age_seconds` is computed at each
//! scrape from when each partition's lag was last refreshed.
//!
//! # Memory (`fetch_limits.rs`, `window.rs`, `heap.rs`)
//! librdkafka holds every fetched record as a 320-byte operation until it is applied. Small
//! fetch and queue limits keep that to a few megabytes per consumer against a broker that
//! honours them; against one that answers with whole backlogs, partitions still catching up
//! are read a few at a time, within a window that narrows as the store fills. The ingest
//! threads hand librdkafka's freed heap back to the system as they apply batches.
//!
//! # Ordering
//! Within one partition records are applied in offset order. Producers key creates by author
//! id, so one author's posts keep their order; the store's rules make the result independent
//! of the order across partitions (a delete that arrives before its create still wins).

mod config;
mod connection;
mod fetch_limits;
mod gate;
mod heap;
mod ingest;
mod lag_refresh;
pub mod metrics;
mod partition;
mod progress;
mod records;
mod resume;
mod stall;
mod supervisor;
mod throttle;
mod window;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use rdkafka::consumer::BaseConsumer;
use thunder_engine::PostStore;
use thunder_events::kafka::KafkaError;
use tokio::sync::watch;

pub use config::KafkaArgs;
pub use connection::{ConnectionError, last_error as last_connection_error};
pub use gate::CatchUpState;
pub use progress::IngestStats;
pub use records::{BatchOutcome, RecordBatch};
pub use resume::{
    AppliedOffsets, PartitionWatermarks, Restore, TopicStart, offsets_text, snapshot_offsets_text,
};
pub use supervisor::split_partitions;

use gate::CatchUpGate;
use progress::{Counters, LivePermits, Shared};
use supervisor::Supervisor;
use throttle::ThrottledContext;

/// Handle on running Kafka ingestion. Dropping it stops ingestion without waiting;
/// [`shutdown`](Self::shutdown) stops it and waits for the threads to finish their batch.
pub struct KafkaIngest {
    /// The catch-up gate (see [`CatchUpState`]).
    pub caught_up: watch::Receiver<CatchUpState>,
    /// Partitions stalled after catch-up, sorted; empty while every partition keeps up.
    pub stalled: watch::Receiver<Vec<i32>>,
    shared: Arc<Shared>,
    supervisor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for KafkaIngest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaIngest")
            .field("caught_up", &*self.caught_up.borrow())
            .field("stalled", &*self.stalled.borrow())
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

    /// The offsets applied so far, for snapshots (usable after shutdown).
    pub fn applied_offsets(&self) -> AppliedOffsets {
        AppliedOffsets::of(Arc::clone(&self.shared))
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
    start_with(args, store, None)
}

/// [`start`], first handing the topic's partitions and watermarks to `restore` (on the
/// supervisor thread): the partitions it returns offsets for resume there (see `resume.rs`).
pub fn start_with(
    args: &KafkaArgs,
    store: Arc<PostStore>,
    restore: Option<Restore>,
) -> Result<KafkaIngest, KafkaError> {
    let found = args.validate();
    if !found.problems.is_empty() {
        return Err(KafkaError::InvalidConfig(found.problems.join("; ")));
    }
    // What --check-config refuses in the TLS files (an expired certificate, say) is only
    // warned about here: the broker has the last word, and a refused connection is reported
    // as it happens (`kafka_connection_errors_total`).
    let now_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let files = args.client.security_files(now_secs);
    for warning in found
        .warnings
        .iter()
        .chain(&files.warnings)
        .chain(&files.problems)
    {
        tracing::warn!("Kafka security settings: {warning}");
    }
    // Every metric registered now, so the Kafka ones are exported, at zero, before the first
    // event.
    metrics::KafkaMetrics::global();
    let group_id = format!("{}-{}", args.kafka_group_id, uuid::Uuid::new_v4());
    let consumer_config = args.consumer_config(&group_id)?;
    // Creating the metadata client validates every property now rather than in a thread.
    let metadata_client: BaseConsumer<ThrottledContext> =
        consumer_config.create_with_context(ThrottledContext::default())?;
    tracing::info!(
        topic = %args.client.kafka_topic,
        group_id = %group_id,
        threads = args.kafka_num_threads,
        batch_size = args.kafka_batch_size,
        "starting Kafka ingestion"
    );

    let (gate, caught_up) = CatchUpGate::new();
    let (stalled_tx, stalled) = watch::channel(Vec::new());
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        gate,
        counters: Counters::default(),
        live_permits: (args.kafka_live_batch_permits > 0)
            .then(|| LivePermits::new(args.kafka_live_batch_permits)),
        caught_up: caught_up.clone(),
        stalled: stalled_tx,
        partitions: OnceLock::new(),
        window: window::CatchUpWindow::new(args.kafka_catch_up_buffer_bytes),
    });
    let supervisor = Supervisor {
        args: args.clone(),
        consumer_config,
        metadata_client,
        store,
        shared: Arc::clone(&shared),
        restore,
    };
    let supervisor = std::thread::Builder::new()
        .name("kafka-supervisor".into())
        .spawn(move || supervisor.run())?;
    Ok(KafkaIngest {
        caught_up,
        stalled,
        shared,
        supervisor: Some(supervisor),
    })
}
