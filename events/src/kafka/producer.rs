//! Producing `InNetworkEvent` records: what `thunder-cli produce` and the tests use to feed a
//! topic.
//!
//! Creates are keyed by author id (decimal), so the default partitioner keeps one author's
//! posts in one partition, in order. A delete carries no author; it is keyed by the author when
//! the caller knows it, else by the post id. Order across partitions does not matter to the
//! store: a delete that arrives before its create still wins.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prost::Message;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message as _};
use thunder_engine::{DeleteEvent, LightPost};

use super::client::KafkaClientArgs;
use super::error::KafkaError;
use crate::codec::{create_event, delete_envelope};

/// Delivery reports of an [`EventProducer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Records the broker acknowledged.
    pub delivered: u64,
    /// Records that could not be delivered (after librdkafka's retries).
    pub failed: u64,
}

#[derive(Debug, Default)]
struct DeliveryCounts {
    delivered: AtomicU64,
    failed: AtomicU64,
    /// librdkafka's latest broker connection failure (its `FAIL` log line).
    connection_failure: Mutex<Option<String>>,
}

/// Counts delivery reports and keeps the latest broker connection failure.
#[derive(Clone, Debug, Default)]
struct CountingContext(Arc<DeliveryCounts>);

impl ClientContext for CountingContext {
    fn log(&self, _: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if fac == "FAIL" {
            // An `Option` replaced whole: consistent after any panic.
            *self
                .0
                .connection_failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(log_message.to_owned());
        }
        tracing::debug!(target: "librdkafka", fac, "{log_message}");
    }
}

impl ProducerContext for CountingContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        match result {
            Ok(_) => {
                self.0.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((error, message)) => {
                self.0.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, partition = message.partition(), "Kafka record not delivered");
            }
        }
    }
}

/// A producer of `InNetworkEvent` records to one topic (librdkafka's threaded producer).
pub struct EventProducer {
    producer: ThreadedProducer<CountingContext>,
    counts: Arc<DeliveryCounts>,
    topic: String,
}

impl std::fmt::Debug for EventProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventProducer")
            .field("topic", &self.topic)
            .field("stats", &self.stats())
            .finish()
    }
}

impl EventProducer {
    /// A producer to `args.kafka_topic` with the connection settings of `args` (brokers,
    /// security, `-X` properties).
    pub fn new(args: &KafkaClientArgs) -> Result<Self, KafkaError> {
        let mut config = args.client_config()?;
        // Batch a little for throughput; `-X` still overrides.
        config.set("linger.ms", "5");
        for (key, value) in &args.kafka_properties {
            config.set(key, value);
        }
        let counts = Arc::new(DeliveryCounts::default());
        let producer = config.create_with_context(CountingContext(Arc::clone(&counts)))?;
        Ok(Self {
            producer,
            counts,
            topic: args.kafka_topic.clone(),
        })
    }

    /// Topic the records go to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Asks the brokers for metadata, waiting at most `timeout`: fails, with the broker's
    /// refusal when librdkafka reported one (a TLS handshake or SASL login refused, a
    /// connection refused), when no broker answers in time. (The cluster's metadata, not the
    /// topic's: asking for a missing topic would have the broker auto-create it with one
    /// partition.)
    pub fn check_connection(&self, timeout: Duration) -> Result<(), KafkaError> {
        let answer = self.producer.client().fetch_metadata(None, timeout);
        let failure = self
            .counts
            .connection_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match (answer, failure) {
            (Ok(_), _) => Ok(()),
            (Err(error), failure) => Err(KafkaError::Unreachable {
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                cause: failure.unwrap_or_else(|| error.to_string()),
            }),
        }
    }

    /// Queues a create event, keyed by its author id.
    pub fn send_create(&self, post: &LightPost) -> Result<(), KafkaError> {
        let payload = create_event(post).encode_to_vec();
        self.send_record(
            None,
            post.author_id.to_string().as_bytes(),
            Some(&payload),
            None,
        )
    }

    /// Queues a delete event, keyed by `key_id` (the author, when known; else the post id).
    pub fn send_delete(&self, delete: &DeleteEvent, key_id: Option<i64>) -> Result<(), KafkaError> {
        let payload = delete_envelope(delete).encode_to_vec();
        let key = key_id.unwrap_or(delete.post_id).to_string();
        self.send_record(None, key.as_bytes(), Some(&payload), None)
    }

    /// Queues a raw record (any payload, or none), to `partition` or to the key's partition,
    /// stamped `timestamp_ms` (unix milliseconds) or now. Waits while librdkafka's local queue
    /// is full.
    pub fn send_record(
        &self,
        partition: Option<i32>,
        key: &[u8],
        payload: Option<&[u8]>,
        timestamp_ms: Option<i64>,
    ) -> Result<(), KafkaError> {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.topic).key(key);
        if let Some(payload) = payload {
            record = record.payload(payload);
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        if let Some(timestamp_ms) = timestamp_ms {
            record = record.timestamp(timestamp_ms);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((
                    rdkafka::error::KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                    back,
                )) => {
                    record = back;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((error, _)) => return Err(error.into()),
            }
        }
    }

    /// Waits until every queued record is delivered or failed, up to `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer.flush(timeout)?;
        Ok(())
    }

    /// Delivery reports so far.
    pub fn stats(&self) -> ProducerStats {
        ProducerStats {
            delivered: self.counts.delivered.load(Ordering::Relaxed),
            failed: self.counts.failed.load(Ordering::Relaxed),
        }
    }
}
