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
mod error;
mod gate;
mod ingest;
mod metrics;
mod producer;
mod shared;
mod supervisor;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use rdkafka::consumer::BaseConsumer;
use thunder_engine::PostStore;
use tokio::sync::watch;

pub use config::{IN_NETWORK_EVENTS_TOPIC, KafkaArgs};
pub use decode::{
    BatchOutcome, DecodeError, EventBatch, IngestEvent, create_event, decode_event,
    delete_envelope, delete_event, light_post,
};
pub use error::KafkaError;
pub use gate::CatchUpState;
pub use producer::{EventProducer, ProducerStats};
pub use shared::IngestStats;
pub use supervisor::split_partitions;

use gate::CatchUpGate;
use shared::{Counters, LivePermits, Shared};
use supervisor::Supervisor;

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
