//! One ingest thread: a `BaseConsumer` on a dedicated OS thread that owns a fixed slice of the
//! topic's partitions, batches their records and applies them to the store.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use thunder_engine::PostStore;

use super::decode::RecordBatch;
use super::fetch_limits::{raised_receive_max_bytes, receive_max_bytes};
use super::gate::partition_caught_up;
use super::metrics;
use super::shared::{PartitionState, Shared};
use super::throttle::{LOG_INTERVAL, LogThrottle, ThrottledContext};

/// Longest single poll, so the thread notices shutdown and flushes idle batches promptly.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Pause after a poll error before polling again (as the reference).
const POLL_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// How long "unknown topic or partition" may last before start-up gives up on it: a topic that
/// was just created can briefly be unknown to the broker that leads it.
const UNKNOWN_PARTITION_GRACE: Duration = Duration::from_secs(15);

/// One partition owned by an ingest thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnedPartition {
    /// Index into `Shared::partitions`.
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
    /// `--kafka-max-response-bytes`: how far `receive.message.max.bytes` may be raised.
    pub max_response_bytes: u64,
    pub store: Arc<PostStore>,
    pub shared: Arc<Shared>,
}

/// Where one owned partition stands, as this thread has read it.
#[derive(Clone, Copy, Debug)]
struct Position {
    /// Next offset to read (`-1`: from the low watermark; `i64::MAX`: from the end).
    next: i64,
    /// The consumer reported the end of the partition after the last record read.
    at_end: bool,
}

/// Why an ingest thread stopped.
#[derive(Debug, thiserror::Error)]
enum IngestError {
    #[error(transparent)]
    Client(#[from] KafkaError),
    #[error("{0}")]
    Unrecoverable(String),
}

/// Errors that retrying cannot heal: the partition can never move past the record batch that
/// caused them. `None` for everything librdkafka retries by itself (broker outages, leader
/// changes, timeouts).
fn unrecoverable_cause(error: &KafkaError) -> Option<&'static str> {
    if let KafkaError::MessageConsumptionFatal(_) = error {
        return Some("librdkafka reported a fatal consumer error");
    }
    let KafkaError::MessageConsumption(code) = error else {
        return None;
    };
    Some(match code {
        RDKafkaErrorCode::NotImplemented | RDKafkaErrorCode::UnsupportedCompressionType => {
            "a record batch uses a compression codec this build cannot decode"
        }
        RDKafkaErrorCode::BadCompression => "a record batch does not decompress (corrupt batch)",
        RDKafkaErrorCode::BadMessage
        | RDKafkaErrorCode::InvalidMessage
        | RDKafkaErrorCode::InvalidRecord => "a record batch is corrupt",
        RDKafkaErrorCode::TopicAuthorizationFailed
        | RDKafkaErrorCode::GroupAuthorizationFailed
        | RDKafkaErrorCode::ClusterAuthorizationFailed => "not authorised to read the topic",
        RDKafkaErrorCode::SaslAuthenticationFailed | RDKafkaErrorCode::Authentication => {
            "authentication with the broker failed"
        }
        RDKafkaErrorCode::UnknownPartition
        | RDKafkaErrorCode::UnknownTopic
        | RDKafkaErrorCode::UnknownTopicOrPartition => "the topic or partition does not exist",
        _ => return None,
    })
}

/// True for causes that may still heal for a short while (a topic being created).
fn heals_briefly(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::MessageConsumption(
            RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
        )
    )
}

impl IngestThread {
    /// Runs until shutdown. A panic or an error is reported to the catch-up gate as a failure,
    /// so start-up never waits for a dead thread.
    pub(crate) fn run(self) {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.ingest()));
        let reason = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(IngestError::Unrecoverable(message))) => message,
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

    /// The shared state of an owned partition.
    fn state(&self, owned: &OwnedPartition) -> Option<&PartitionState> {
        self.shared.partitions.get()?.get(owned.slot)
    }

    /// A consumer of the owned partitions, each assigned where `positions` says it stands,
    /// with `receive.message.max.bytes` set to `receive_limit` when given.
    fn connect(
        &self,
        positions: &[Position],
        receive_limit: Option<u64>,
    ) -> Result<BaseConsumer<ThrottledContext>, IngestError> {
        let mut config = self.consumer_config.clone();
        if let Some(bytes) = receive_limit {
            config.set("receive.message.max.bytes", bytes.to_string());
        }
        let consumer: BaseConsumer<ThrottledContext> =
            config.create_with_context(ThrottledContext::default())?;
        let mut assignment = TopicPartitionList::with_capacity(self.partitions.len());
        for (owned, at) in self.partitions.iter().zip(positions) {
            // `-1` (nothing read yet) and `i64::MAX` (from the end) stand for the start.
            let offset = if (0..i64::MAX).contains(&at.next) {
                Offset::Offset(at.next)
            } else {
                owned.start
            };
            assignment.add_partition_offset(&self.topic, owned.partition, offset)?;
        }
        consumer.assign(&assignment)?;
        let limit = receive_limit.unwrap_or_else(|| receive_max_bytes(&self.consumer_config));
        metrics::kafka()
            .consumer_receive_max_bytes
            .with_label_values(&[&self.index.to_string()])
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        Ok(consumer)
    }

    fn ingest(&self) -> Result<(), IngestError> {
        let mut positions: Vec<Position> = self
            .partitions
            .iter()
            .map(|owned| Position {
                next: super::supervisor::start_marker(owned.start),
                at_end: false,
            })
            .collect();
        let mut consumer = self.connect(&positions, None)?;
        let mut receive_limit = receive_max_bytes(&self.consumer_config);
        tracing::info!(
            thread = self.index,
            partitions = ?self.partitions.iter().map(|p| p.partition).collect::<Vec<_>>(),
            receive_max_bytes = receive_limit,
            "Kafka ingest thread started"
        );

        let mut batch = RecordBatch::with_capacity(self.batch_size);
        let mut batch_started: Option<Instant> = None;
        let mut caught_up = false;
        let warnings = LogThrottle::new(LOG_INTERVAL);
        // Since when the current run of "unknown partition" errors lasts.
        let mut unknown_since: Option<Instant> = None;

        if self.all_caught_up(&positions) {
            caught_up = self.report_caught_up();
        }
        while !self.shared.stopping() {
            let wait = match batch_started {
                None => POLL_INTERVAL,
                Some(started) => self
                    .fetch_timeout
                    .saturating_sub(started.elapsed())
                    .min(POLL_INTERVAL),
            };
            let mut flush = false;
            match consumer.poll(wait) {
                Some(Ok(message)) => {
                    let partition = message.partition();
                    let offset = message.offset();
                    // A bad record is counted and logged inside; the rest of the batch goes on.
                    let _ = batch.push_record(partition, offset, message.payload());
                    if let Some(i) = self.index_of(partition) {
                        positions[i] = Position {
                            next: offset.saturating_add(1),
                            at_end: false,
                        };
                    }
                    batch_started.get_or_insert_with(Instant::now);
                    unknown_since = None;
                }
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    // Everything before the end was delivered before this event: apply it,
                    // then publish "at the end".
                    if let Some(i) = self.index_of(partition) {
                        positions[i].at_end = true;
                    }
                    flush = true;
                }
                Some(Err(error)) => {
                    metrics::kafka().poll_errors.inc();
                    // Consumer errors name no partition: none of ours counts as "at the end"
                    // any more (a batch that fails to decode sits past a reported end), until
                    // its consumer reports the end again.
                    if positions.iter().any(|at| at.at_end) {
                        for at in &mut positions {
                            at.at_end = false;
                        }
                        if batch.is_empty() {
                            self.publish(&positions);
                        }
                    }
                    let oversized = matches!(
                        error,
                        KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage)
                    )
                    .then(|| consumer.context().oversized_responses.take())
                    .flatten();
                    if let Some(response_bytes) = oversized {
                        metrics::kafka().oversized_fetch_responses.inc();
                        if let Some(raised) = raised_receive_max_bytes(
                            receive_limit,
                            response_bytes,
                            self.max_response_bytes,
                        ) {
                            tracing::warn!(
                                thread = self.index,
                                topic = %self.topic,
                                response_bytes,
                                receive_max_bytes = receive_limit,
                                raised_to = raised,
                                max_response_bytes = self.max_response_bytes,
                                "a Kafka fetch response exceeds receive.message.max.bytes (the broker does not bound its answers by fetch.max.bytes); reconnecting this consumer with a limit that fits"
                            );
                            // Resumes after the last record read; the batch keeps those.
                            consumer = self.connect(&positions, Some(raised))?;
                            receive_limit = raised;
                            continue;
                        }
                        let message = format!(
                            "Kafka topic {}: {}: a fetch response of {response_bytes} bytes exceeds --kafka-max-response-bytes {} (receive.message.max.bytes is {receive_limit}): raise --kafka-max-response-bytes (THUNDER_KAFKA_MAX_RESPONSE_BYTES) or have the broker honour fetch.max.bytes",
                            self.topic,
                            self.stuck_partitions(&positions),
                            self.max_response_bytes,
                        );
                        if !caught_up {
                            self.apply(&mut batch, caught_up, &positions);
                            return Err(IngestError::Unrecoverable(message));
                        }
                        // After catch-up the stall rule turns readiness off instead.
                        if let Some(suppressed) = warnings.admit("oversized") {
                            tracing::error!(thread = self.index, suppressed, "{message}");
                        }
                    } else if let Some(cause) = unrecoverable_cause(&error) {
                        let waited = *unknown_since.get_or_insert_with(Instant::now);
                        let give_up =
                            !heals_briefly(&error) || waited.elapsed() >= UNKNOWN_PARTITION_GRACE;
                        if !caught_up && give_up {
                            // Keep what was read: apply it before failing.
                            self.apply(&mut batch, caught_up, &positions);
                            return Err(IngestError::Unrecoverable(
                                self.unrecoverable_message(cause, &error, &positions),
                            ));
                        }
                        // After catch-up the stall rule turns readiness off instead.
                        if let Some(suppressed) = warnings.admit("unrecoverable") {
                            tracing::error!(
                                thread = self.index,
                                topic = %self.topic,
                                %error,
                                suppressed,
                                "{cause}; the partition cannot progress"
                            );
                        }
                    } else if let Some(suppressed) = warnings.admit("poll") {
                        tracing::warn!(thread = self.index, %error, suppressed, "Kafka poll failed; retrying");
                    }
                    std::thread::sleep(POLL_ERROR_BACKOFF);
                }
                None => flush = true,
            }

            let full = batch.len() >= self.batch_size;
            let lingered = batch_started.is_some_and(|t| t.elapsed() >= self.fetch_timeout);
            if flush || full || lingered {
                if !batch.is_empty() {
                    self.apply(&mut batch, caught_up, &positions);
                    batch_started = None;
                }
                self.publish(&positions);
                if !caught_up && self.all_caught_up(&positions) {
                    caught_up = self.report_caught_up();
                }
            }
        }
        if !batch.is_empty() {
            self.apply(&mut batch, caught_up, &positions);
        }
        Ok(())
    }

    fn index_of(&self, partition: i32) -> Option<usize> {
        self.partitions
            .iter()
            .position(|p| p.partition == partition)
    }

    /// True when every owned partition has applied its backlog recorded at start. Only valid
    /// for positions already applied (see `publish`).
    fn all_caught_up(&self, positions: &[Position]) -> bool {
        self.partitions.iter().zip(positions).all(|(owned, at)| {
            self.state(owned).is_some_and(|s| {
                partition_caught_up(s.low_at_start, s.end_at_start, at.next, at.at_end)
            })
        })
    }

    fn report_caught_up(&self) -> bool {
        tracing::info!(thread = self.index, "Kafka ingest thread caught up");
        self.shared.gate.thread_caught_up();
        true
    }

    /// Publishes the applied positions for the supervisor (lag gauge, stall rule).
    fn publish(&self, positions: &[Position]) {
        for (owned, at) in self.partitions.iter().zip(positions) {
            if let Some(state) = self.state(owned) {
                // Release pairs with the Acquire in `AppliedOffsets::get`: a snapshot that reads
                // this offset sees the store writes of every record before it.
                state.next.store(at.next, Ordering::Release);
                state.at_end.store(at.at_end, Ordering::Relaxed);
            }
        }
    }

    /// "topic T: partition P at offset O, ...: cause (error)": the partitions of this thread
    /// that have not reached their end, where they stand.
    fn unrecoverable_message(
        &self,
        cause: &str,
        error: &KafkaError,
        positions: &[Position],
    ) -> String {
        format!(
            "Kafka topic {}: {}: {cause} ({error}); retrying cannot heal this, so start-up stops here",
            self.topic,
            self.stuck_partitions(positions)
        )
    }

    /// "partition P at offset O, ...": the partitions of this thread that have not reached
    /// their end, where they stand.
    fn stuck_partitions(&self, positions: &[Position]) -> String {
        let stuck: Vec<String> = self
            .partitions
            .iter()
            .zip(positions)
            .filter_map(|(owned, at)| {
                let state = self.state(owned)?;
                if partition_caught_up(state.low_at_start, state.end_at_start, at.next, false) {
                    return None;
                }
                let offset = at.next.max(state.low_at_start);
                Some(format!("partition {} at offset {offset}", owned.partition))
            })
            .collect();
        if stuck.is_empty() {
            "its partitions".to_owned()
        } else {
            stuck.join(", ")
        }
    }

    /// Applies the batch, serialised with the other caught-up threads when configured so, and
    /// counts it.
    fn apply(&self, batch: &mut RecordBatch, caught_up: bool, positions: &[Position]) {
        let permit = if caught_up {
            self.shared.live_permits.as_ref().map(|p| p.acquire())
        } else {
            None
        };
        let outcome = batch.apply(&self.store);
        drop(permit);
        self.publish(positions);
        metrics::kafka()
            .messages_consumed
            .inc_by(outcome.records as u64);
        self.shared.counters.record(&outcome);
    }
}
