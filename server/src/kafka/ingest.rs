//! One ingest thread: a `BaseConsumer` on a dedicated OS thread that owns a fixed slice of the
//! topic's partitions, batches their records and applies them to the store.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use thunder_engine::PostStore;

use super::fetch_limits::{raised_receive_max_bytes, receive_max_bytes};
use super::gate::partition_caught_up;
use super::heap;
use super::metrics::KafkaMetrics;
use super::partition::PartitionState;
use super::progress::Shared;
use super::records::RecordBatch;
use super::throttle::{LOG_INTERVAL, LogThrottle, ThrottledContext};
use super::window;

/// Longest single poll, so the thread notices shutdown and flushes idle batches promptly.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Longest single poll while an owned partition waits for room in the catch-up window, so it is
/// assigned soon after another partition has caught up.
const WINDOW_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Pause after a poll error before polling again (as the reference).
const POLL_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// How long "unknown topic or partition" may last before start-up gives up on it: a topic that
/// was just created can briefly be unknown to the broker that leads it.
const UNKNOWN_PARTITION_GRACE: Duration = Duration::from_secs(15);

/// Longest wait for the watermarks when checking positions after an offset reset error.
const OFFSET_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two failed position checks.
const OFFSET_CHECK_RETRY: Duration = Duration::from_secs(1);
/// After a truncation, records not older than the last record read minus this margin are read
/// again: new records the broker put on the lost offsets were written after that record
/// (allowing for producers' clocks to differ by up to this much).
const TRUNCATION_TIME_MARGIN_MS: i64 = 5 * 60 * 1000;

/// Why a partition's position must move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Move {
    /// The log ends at `log_end`, below the position: the broker lost records and may give
    /// their offsets to new ones. Reading resumes at `log_end` (or the position, if lower).
    Truncated { log_end: i64 },
    /// The log starts at `log_start`, above the position: the records in between were deleted
    /// (retention) before they were read. Reading resumes at `log_start`.
    BelowStart { log_start: i64 },
    /// After a broker outage the last record read before it (at `mark.next - 1`) is not
    /// there any more: the broker lost it and new records took its offset and more. Reading
    /// resumes at the first record not older than it (less a margin).
    Rewritten { mark: Position },
}

/// Where partition reading must move, if anywhere, given its read position `next` and the
/// log's `(low, high)` watermarks. Positions that stand for a start marker never move here.
fn needed_move(next: i64, (low, high): (i64, i64)) -> Option<Move> {
    if !(0..i64::MAX).contains(&next) {
        return None;
    }
    if high < next {
        Some(Move::Truncated { log_end: high })
    } else if next < low {
        Some(Move::BelowStart { log_start: low })
    } else {
        None
    }
}

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Position {
    /// Next offset to read (`-1`: from the low watermark; `i64::MAX`: from the end).
    next: i64,
    /// The consumer reported the end of the partition after the last record read.
    at_end: bool,
    /// Timestamp (ms) of the last record read, if it had one.
    last_timestamp: Option<i64>,
    /// Payload length of the last record read.
    last_len: usize,
}

impl Position {
    /// Where `owned`'s consumer assignment starts: after the last record read, or the start
    /// (`-1`, nothing read yet, and `i64::MAX`, from the end, stand for it).
    fn offset(&self, owned: &OwnedPartition) -> Offset {
        if (0..i64::MAX).contains(&self.next) {
            Offset::Offset(self.next)
        } else {
            owned.start
        }
    }
}

/// What an ingest thread's loop keeps between polls, besides its consumer.
struct Reader {
    /// Where each owned partition stands, as read.
    positions: Vec<Position>,
    /// The records read and not yet applied.
    batch: RecordBatch,
    /// When the batch's first record was polled.
    batch_started: Option<Instant>,
    /// This thread has reported its catch-up.
    caught_up: bool,
    /// Every owned partition is assigned (the catch-up window let them all in).
    all_reading: bool,
    /// The consumer's `receive.message.max.bytes` now.
    receive_limit: u64,
    /// Owned partitions paused at their catch-up goal until every thread has caught up.
    held: Vec<bool>,
    /// Repeated warnings, rate-limited.
    warnings: LogThrottle,
    /// Since when the current run of "unknown partition" errors lasts.
    unknown_since: Option<Instant>,
    /// librdkafka reported a position outside the log (`auto.offset.reset=error`) and stopped
    /// fetching that partition, or the broker came back: when to check the positions next.
    check_offsets_at: Option<Instant>,
    /// The positions when the broker went away (while it is away), and when it came back
    /// (until checked): a broker may come back without records it had acknowledged.
    outage: Option<Vec<Position>>,
    verify: Option<Vec<Position>>,
}

impl Reader {
    /// How long the next poll may wait: at most the poll interval (shorter while partitions
    /// wait for the catch-up window), and no longer than the batch's fetch timeout allows.
    fn poll_wait(&self, fetch_timeout: Duration) -> Duration {
        let longest = if self.all_reading {
            POLL_INTERVAL
        } else {
            WINDOW_POLL_INTERVAL
        };
        match self.batch_started {
            None => longest,
            Some(started) => fetch_timeout.saturating_sub(started.elapsed()).min(longest),
        }
    }

    /// Something arrived from the broker: if it had gone away, check that it still holds
    /// what was read before.
    fn broker_back(&mut self) {
        if let Some(marks) = self.outage.take() {
            self.check_offsets_at.get_or_insert_with(Instant::now);
            self.verify = Some(marks);
        }
    }
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

    /// A consumer of the owned partitions being read (see `window.rs`), each assigned where
    /// `positions` says it stands, with `receive.message.max.bytes` set to `receive_limit`
    /// when given.
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
            if self.reading(owned) {
                assignment.add_partition_offset(&self.topic, owned.partition, at.offset(owned))?;
            }
        }
        consumer.assign(&assignment)?;
        let limit = receive_limit.unwrap_or_else(|| receive_max_bytes(&self.consumer_config));
        KafkaMetrics::global()
            .consumer_receive_max_bytes
            .with_label_values(&[&self.index.to_string()])
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        Ok(consumer)
    }

    /// The thread's loop: poll a record (or an event), note it, move positions the broker no
    /// longer holds, and apply the batch when it is due; until shutdown.
    fn ingest(&self) -> Result<(), IngestError> {
        let (mut consumer, mut reader) = self.open()?;
        while !self.shared.stopping() {
            let flush = match consumer.poll(reader.poll_wait(self.fetch_timeout)) {
                Some(Ok(message)) => {
                    self.note_record(&mut reader, &message);
                    false
                }
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    // Everything before the end was delivered before this event: apply it,
                    // then publish "at the end".
                    if let Some(i) = self.index_of(partition) {
                        reader.positions[i].at_end = true;
                    }
                    reader.broker_back();
                    true
                }
                Some(Err(error)) => {
                    if let Some(raised) = self.on_poll_error(&consumer, &mut reader, error)? {
                        // The refused answer brought nothing: the partitions not caught up go
                        // back through the window.
                        drop(consumer);
                        self.stop_reading_backlogs();
                        reader.all_reading = self.admit(None, &reader.positions)?;
                        // Resumes after the last record read; the batch keeps those.
                        consumer = self.connect(&reader.positions, Some(raised))?;
                        reader.held.fill(false);
                        reader.receive_limit = raised;
                        continue;
                    }
                    false
                }
                None => true,
            };
            if self.move_positions(&consumer, &mut reader) {
                // A fresh assignment at the new positions (librdkafka stopped fetching a
                // partition whose offset reset errored).
                consumer = self.connect(&reader.positions, Some(reader.receive_limit))?;
                reader.held.fill(false);
                continue;
            }
            self.flush_if_due(&consumer, &mut reader, flush)?;
        }
        self.apply_pending(&mut reader);
        Ok(())
    }

    /// The thread's consumer, assigned the owned partitions the catch-up window lets in from
    /// their start positions, and the loop's state; the catch-up reported at once when there
    /// was nothing to read.
    fn open(&self) -> Result<(BaseConsumer<ThrottledContext>, Reader), IngestError> {
        let positions: Vec<Position> = self
            .partitions
            .iter()
            .map(|owned| Position {
                next: super::partition::start_marker(owned.start),
                at_end: false,
                last_timestamp: None,
                last_len: 0,
            })
            .collect();
        let all_reading = self.admit(None, &positions)?;
        let consumer = self.connect(&positions, None)?;
        let receive_limit = receive_max_bytes(&self.consumer_config);
        tracing::info!(
            thread = self.index,
            partitions = ?self.partitions.iter().map(|p| p.partition).collect::<Vec<_>>(),
            receive_max_bytes = receive_limit,
            "Kafka ingest thread started"
        );
        let mut reader = Reader {
            batch: RecordBatch::with_capacity(self.batch_size),
            batch_started: None,
            caught_up: false,
            all_reading,
            receive_limit,
            held: vec![false; self.partitions.len()],
            warnings: LogThrottle::new(LOG_INTERVAL),
            unknown_since: None,
            check_offsets_at: None,
            outage: None,
            verify: None,
            positions,
        };
        if self.all_caught_up(&reader.positions) {
            reader.caught_up = self.report_caught_up();
        }
        Ok((consumer, reader))
    }

    /// Adds a polled record to the batch and moves its partition's position past it.
    fn note_record(&self, reader: &mut Reader, message: &BorrowedMessage<'_>) {
        let partition = message.partition();
        let offset = message.offset();
        // A bad record is counted and logged inside; the rest of the batch goes on.
        let _ = reader
            .batch
            .push_record(partition, offset, message.payload());
        if let Some(i) = self.index_of(partition) {
            let before = reader.positions[i];
            reader.positions[i] = Position {
                next: offset.saturating_add(1),
                at_end: false,
                last_timestamp: message.timestamp().to_millis().or(before.last_timestamp),
                last_len: message.payload().map_or(0, <[u8]>::len),
            };
        }
        reader.broker_back();
        reader.batch_started.get_or_insert_with(Instant::now);
        reader.unknown_since = None;
    }

    /// Counts and handles a poll error. `Some(limit)`: the consumer must be replaced by one
    /// with that larger `receive.message.max.bytes` (a fetch response was larger than the
    /// limit). An error that retrying cannot heal fails the thread before catch-up (after
    /// applying what was read); after catch-up it is logged and the stall rule acts.
    fn on_poll_error(
        &self,
        consumer: &BaseConsumer<ThrottledContext>,
        reader: &mut Reader,
        error: KafkaError,
    ) -> Result<Option<u64>, IngestError> {
        KafkaMetrics::global().poll_errors.inc();
        if let KafkaError::MessageConsumption(
            RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::LogTruncation,
        ) = error
        {
            tracing::warn!(thread = self.index, topic = %self.topic, %error, "a Kafka position is outside the partition's log; checking the positions");
            reader.check_offsets_at.get_or_insert_with(Instant::now);
            return Ok(None);
        }
        if matches!(
            error,
            KafkaError::MessageConsumption(
                RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure
            )
        ) && reader.outage.is_none()
        {
            reader.outage = Some(
                reader
                    .verify
                    .take()
                    .unwrap_or_else(|| reader.positions.clone()),
            );
        }
        // Consumer errors name no partition: none of ours counts as "at the end" any more (a
        // batch that fails to decode sits past a reported end), until its consumer reports
        // the end again.
        if reader.positions.iter().any(|at| at.at_end) {
            for at in &mut reader.positions {
                at.at_end = false;
            }
            if reader.batch.is_empty() {
                self.publish(&reader.positions);
            }
        }
        let oversized = matches!(
            error,
            KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage)
        )
        .then(|| consumer.context().oversized_responses.take())
        .flatten();
        if let Some(response_bytes) = oversized {
            if let Some(raised) = self.on_oversized_response(reader, response_bytes)? {
                return Ok(Some(raised));
            }
        } else if let Some(cause) = unrecoverable_cause(&error) {
            let waited = *reader.unknown_since.get_or_insert_with(Instant::now);
            let give_up = !heals_briefly(&error) || waited.elapsed() >= UNKNOWN_PARTITION_GRACE;
            if !reader.caught_up && give_up {
                // Keep what was read: apply it before failing.
                self.apply(&mut reader.batch, reader.caught_up, &reader.positions);
                return Err(IngestError::Unrecoverable(self.unrecoverable_message(
                    cause,
                    &error,
                    &reader.positions,
                )));
            }
            // After catch-up the stall rule turns readiness off instead.
            if let Some(suppressed) = reader.warnings.admit("unrecoverable") {
                tracing::error!(
                    thread = self.index,
                    topic = %self.topic,
                    %error,
                    suppressed,
                    "{cause}; the partition cannot progress"
                );
            }
        } else if let Some(suppressed) = reader.warnings.admit("poll") {
            tracing::warn!(thread = self.index, %error, suppressed, "Kafka poll failed; retrying");
        }
        std::thread::sleep(POLL_ERROR_BACKOFF);
        Ok(None)
    }

    /// A fetch response of `response_bytes` exceeded the consumer's limit: `Some(limit)` to
    /// reconnect with, up to `--kafka-max-response-bytes`; past that, a failure before catch-up
    /// and a logged error after.
    fn on_oversized_response(
        &self,
        reader: &mut Reader,
        response_bytes: u64,
    ) -> Result<Option<u64>, IngestError> {
        KafkaMetrics::global().oversized_fetch_responses.inc();
        let receive_limit = reader.receive_limit;
        if let Some(raised) =
            raised_receive_max_bytes(receive_limit, response_bytes, self.max_response_bytes)
        {
            tracing::warn!(
                thread = self.index,
                topic = %self.topic,
                response_bytes,
                receive_max_bytes = receive_limit,
                raised_to = raised,
                max_response_bytes = self.max_response_bytes,
                "a Kafka fetch response exceeds receive.message.max.bytes (the broker does not bound its answers by fetch.max.bytes); reconnecting this consumer with a limit that fits"
            );
            if self.shared.window.note_limits_ignored() {
                tracing::warn!(
                    topic = %self.topic,
                    catch_up_buffer_bytes = self.shared.window.cap_bytes(),
                    "the Kafka broker answers beyond the fetch limits: partitions still catching up are read a few at a time, as many as their backlogs fit in the catch-up window (at most --kafka-catch-up-buffer-bytes)"
                );
            }
            return Ok(Some(raised));
        }
        let message = format!(
            "Kafka topic {}: {}: a fetch response of {response_bytes} bytes exceeds --kafka-max-response-bytes {} (receive.message.max.bytes is {receive_limit}): raise --kafka-max-response-bytes (THUNDER_KAFKA_MAX_RESPONSE_BYTES) or have the broker honour fetch.max.bytes",
            self.topic,
            self.stuck_partitions(&reader.positions),
            self.max_response_bytes,
        );
        if !reader.caught_up {
            self.apply(&mut reader.batch, reader.caught_up, &reader.positions);
            return Err(IngestError::Unrecoverable(message));
        }
        // After catch-up the stall rule turns readiness off instead.
        if let Some(suppressed) = reader.warnings.admit("oversized") {
            tracing::error!(thread = self.index, suppressed, "{message}");
        }
        Ok(None)
    }

    /// Moves the positions the broker no longer holds (a truncation the monitor reported, or
    /// found by the watermark check that an offset reset error or a broker's return asked
    /// for), after applying what was read before. True when positions moved and the consumer
    /// must be assigned again.
    fn move_positions(
        &self,
        consumer: &BaseConsumer<ThrottledContext>,
        reader: &mut Reader,
    ) -> bool {
        let mut moves = self.reported_truncations(&reader.positions);
        let checked = reader
            .check_offsets_at
            .is_some_and(|at| at <= Instant::now());
        if checked {
            match self.positions_outside_the_log(
                consumer,
                &reader.positions,
                reader.verify.as_deref(),
            ) {
                Ok(found) => {
                    reader.check_offsets_at = None;
                    reader.verify = None;
                    moves.extend(found);
                }
                Err(error) => {
                    if let Some(suppressed) = reader.warnings.admit("offset check") {
                        tracing::warn!(thread = self.index, topic = %self.topic, %error, suppressed, "cannot read the watermarks to check the positions; retrying");
                    }
                    reader.check_offsets_at = Some(Instant::now() + OFFSET_CHECK_RETRY);
                }
            }
        }
        if moves.is_empty() && !(checked && reader.check_offsets_at.is_none()) {
            return false;
        }
        // Keep what was read before moving: those records were in the log.
        self.apply_pending(reader);
        self.reposition(consumer, &mut reader.positions, &moves);
        // A moved partition's record before an outage needs no check any more.
        for marks in [reader.outage.as_mut(), reader.verify.as_mut()]
            .into_iter()
            .flatten()
        {
            for (i, _) in &moves {
                if let Some(mark) = marks.get_mut(*i) {
                    mark.last_timestamp = None;
                }
            }
        }
        true
    }

    /// When the batch is due (`flush`: the poll came back empty or at a partition's end; or
    /// the batch is full, or has waited the fetch timeout): applies it, publishes the
    /// positions, lets more partitions in through the catch-up window, pauses the caught-up
    /// ones while others catch up, and reports this thread's catch-up.
    fn flush_if_due(
        &self,
        consumer: &BaseConsumer<ThrottledContext>,
        reader: &mut Reader,
        flush: bool,
    ) -> Result<(), KafkaError> {
        let full = reader.batch.len() >= self.batch_size;
        let lingered = reader
            .batch_started
            .is_some_and(|t| t.elapsed() >= self.fetch_timeout);
        if !(flush || full || lingered) {
            return Ok(());
        }
        self.apply_pending(reader);
        self.publish(&reader.positions);
        if !reader.all_reading {
            reader.all_reading = self.admit(Some(consumer), &reader.positions)?;
        }
        self.hold_caught_up(consumer, &reader.positions, &mut reader.held)?;
        if !reader.caught_up && self.all_caught_up(&reader.positions) {
            reader.caught_up = self.report_caught_up();
        }
        Ok(())
    }

    /// Applies the batch if it holds anything, and starts the next.
    fn apply_pending(&self, reader: &mut Reader) {
        if !reader.batch.is_empty() {
            self.apply(&mut reader.batch, reader.caught_up, &reader.positions);
            reader.batch_started = None;
        }
    }

    /// True when `owned` is assigned to this thread's consumer.
    fn reading(&self, owned: &OwnedPartition) -> bool {
        self.state(owned)
            .is_some_and(|state| state.reading.load(Ordering::Relaxed))
    }

    /// Starts reading the owned partitions the catch-up window has room for (all of them
    /// while the broker keeps to the fetch limits): marks them, and adds them to `consumer`'s
    /// assignment when given (otherwise the next [`connect`](Self::connect) assigns them).
    /// True when every owned partition is read.
    fn admit(
        &self,
        consumer: Option<&BaseConsumer<ThrottledContext>>,
        positions: &[Position],
    ) -> Result<bool, KafkaError> {
        let Some(all) = self.shared.partitions.get() else {
            return Ok(true);
        };
        let mut all_reading = true;
        let mut admitted = TopicPartitionList::new();
        // Against a broker that answers with whole backlogs, a consumer delivers its
        // partitions one after another (each answer queues behind the last): a thread takes
        // one at a time, and the window's room goes to the other threads.
        let one_at_a_time = self.shared.window.limits_ignored();
        let mut busy = one_at_a_time
            && self.partitions.iter().any(|owned| {
                self.state(owned)
                    .is_some_and(|s| s.reading.load(Ordering::Relaxed) && window::catching_up(s))
            });
        for (owned, at) in self.partitions.iter().zip(positions) {
            let Some(state) = all.get(owned.slot) else {
                continue;
            };
            if state.reading.load(Ordering::Relaxed) {
                continue;
            }
            if busy || !self.shared.window.admit(all, state) {
                // Admissions go in partition order: the rest wait for this one.
                all_reading = false;
                break;
            }
            tracing::debug!(
                thread = self.index,
                partition = owned.partition,
                in_flight_bytes = self.shared.window.in_flight_bytes(all),
                "reading Kafka partition"
            );
            admitted.add_partition_offset(&self.topic, owned.partition, at.offset(owned))?;
            busy = one_at_a_time && window::catching_up(state);
        }
        if let Some(consumer) = consumer
            && admitted.count() > 0
        {
            consumer.incremental_assign(&admitted)?;
        }
        Ok(all_reading)
    }

    /// While other partitions catch up, pauses the owned ones that reached their goal: a broker
    /// that answers an empty fetch at once (rather than waiting `fetch.wait.max.ms` for
    /// records) would otherwise be asked again and again, taking the CPU the catch-up needs.
    /// Once every thread has caught up, resumes them (librdkafka fetches again after the last
    /// record polled). `held` marks the paused ones.
    fn hold_caught_up(
        &self,
        consumer: &BaseConsumer<ThrottledContext>,
        positions: &[Position],
        held: &mut [bool],
    ) -> Result<(), KafkaError> {
        let catching_up = matches!(
            *self.shared.caught_up.borrow(),
            super::gate::CatchUpState::CatchingUp
        );
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        for ((owned, at), held) in self.partitions.iter().zip(positions).zip(held.iter_mut()) {
            let hold = catching_up
                && self.reading(owned)
                && self.state(owned).is_some_and(|s| {
                    partition_caught_up(s.low_at_start, s.end_at_start, at.next, at.at_end)
                });
            if hold != *held {
                *held = hold;
                let list = if hold { &mut pause } else { &mut resume };
                list.add_partition(&self.topic, owned.partition);
            }
        }
        if pause.count() > 0 {
            consumer.pause(&pause)?;
        }
        if resume.count() > 0 {
            consumer.resume(&resume)?;
        }
        Ok(())
    }

    /// Stops counting the owned partitions that have not caught up as read, before the
    /// consumer that read them is replaced: they go through the window again.
    fn stop_reading_backlogs(&self) {
        for owned in &self.partitions {
            if let Some(state) = self.state(owned) {
                let next = state.next.load(Ordering::Relaxed);
                let at_end = state.at_end.load(Ordering::Relaxed);
                if !partition_caught_up(state.low_at_start, state.end_at_start, next, at_end) {
                    state.reading.store(false, Ordering::Relaxed);
                }
            }
        }
    }

    /// The truncations the monitor reported for owned partitions since they last moved:
    /// `(index, move)`.
    fn reported_truncations(&self, positions: &[Position]) -> Vec<(usize, Move)> {
        let mut moves = Vec::new();
        for (i, owned) in self.partitions.iter().enumerate() {
            let Some(state) = self.state(owned) else {
                continue;
            };
            let Some(log_end) = state.truncation().log_end.take() else {
                continue;
            };
            // Reported against an applied offset of this epoch, which is at most `next`.
            if positions[i].next > log_end {
                moves.push((i, Move::Truncated { log_end }));
            }
        }
        moves
    }

    /// Asks the broker for the watermarks of every owned partition: `(index, move)` for those
    /// whose position is outside the log.
    /// With `marks` (the positions before a broker outage), also checks that the last record
    /// read before the outage is still there: a broker that lost it and gave its offset to a
    /// new record may have regrown its log past the position before we asked.
    fn positions_outside_the_log(
        &self,
        consumer: &BaseConsumer<ThrottledContext>,
        positions: &[Position],
        marks: Option<&[Position]>,
    ) -> Result<Vec<(usize, Move)>, KafkaError> {
        let mut moves = Vec::new();
        for (i, owned) in self.partitions.iter().enumerate() {
            let watermarks =
                consumer.fetch_watermarks(&self.topic, owned.partition, OFFSET_CHECK_TIMEOUT)?;
            if let Some(found) = needed_move(positions[i].next, watermarks) {
                moves.push((i, found));
                continue;
            }
            let Some(mark) = marks.and_then(|m| m.get(i)).copied() else {
                continue;
            };
            let Some(timestamp) = mark.last_timestamp else {
                continue;
            };
            // Retention may have deleted it meanwhile: nothing to compare, nothing lost.
            if !(1..i64::MAX).contains(&mark.next) || mark.next - 1 < watermarks.0 {
                continue;
            }
            if !self.record_matches(owned, mark.next - 1, timestamp, mark.last_len)? {
                moves.push((i, Move::Rewritten { mark }));
            }
        }
        Ok(moves)
    }

    /// True when the record at `offset` of `owned` has this timestamp and payload length.
    fn record_matches(
        &self,
        owned: &OwnedPartition,
        offset: i64,
        timestamp: i64,
        len: usize,
    ) -> Result<bool, KafkaError> {
        let probe: BaseConsumer<ThrottledContext> = self
            .consumer_config
            .create_with_context(ThrottledContext::default())?;
        let mut assignment = TopicPartitionList::with_capacity(1);
        assignment.add_partition_offset(&self.topic, owned.partition, Offset::Offset(offset))?;
        probe.assign(&assignment)?;
        let deadline = Instant::now() + OFFSET_CHECK_TIMEOUT;
        while Instant::now() < deadline {
            match probe.poll(POLL_INTERVAL) {
                Some(Ok(message)) => {
                    return Ok(message.offset() == offset
                        && message.timestamp().to_millis() == Some(timestamp)
                        && message.payload().map_or(0, <[u8]>::len) == len);
                }
                // The log ends before it, or it is out of range: gone.
                Some(Err(
                    KafkaError::PartitionEOF(_)
                    | KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset),
                )) => return Ok(false),
                Some(Err(error)) => return Err(error),
                None => {}
            }
        }
        Err(KafkaError::MessageConsumption(
            RDKafkaErrorCode::OperationTimedOut,
        ))
    }

    /// Moves the positions of `moves` (several moves of one partition: the lowest wins),
    /// counts and logs each, and publishes the positions. The caller reconnects.
    fn reposition(
        &self,
        consumer: &BaseConsumer<ThrottledContext>,
        positions: &mut [Position],
        moves: &[(usize, Move)],
    ) {
        let mut moved = Vec::new();
        for (i, owned) in self.partitions.iter().enumerate() {
            let mine = moves.iter().filter(|(at, _)| *at == i).map(|(_, m)| *m);
            let position = positions[i].next;
            // The lowest offset known lost: the log end, or the last record read before an
            // outage that is not there any more.
            let log_end = mine
                .clone()
                .filter_map(|m| match m {
                    Move::Truncated { log_end } => Some(log_end),
                    Move::Rewritten { mark } => Some(mark.next - 1),
                    Move::BelowStart { .. } => None,
                })
                .min();
            let log_start = mine
                .clone()
                .filter_map(|m| match m {
                    Move::BelowStart { log_start } => Some(log_start),
                    _ => None,
                })
                .max();
            // The last record known read from the old log.
            let last_read = mine
                .filter_map(|m| match m {
                    Move::Rewritten { mark } => Some(mark),
                    _ => None,
                })
                .next()
                .unwrap_or(positions[i]);
            let resume = match (log_end, log_start) {
                (Some(log_end), _) => {
                    // New records may already sit on offsets below `log_end` (written between
                    // the broker's return and this check): read again from the first record
                    // not older than the last one read (less a margin), which is at most the
                    // lowest offset the broker gave to a new record; failing that, from the
                    // log start. Records read again change nothing (creates of stored ids are
                    // duplicates, deletes only refresh their tombstones).
                    let since = self.first_offset_since(consumer, owned, last_read);
                    let resume = since.min(log_end).min(position).max(0);
                    KafkaMetrics::global()
                        .log_truncations
                        .with_label_values(&[&self.topic, &owned.partition.to_string()])
                        .inc();
                    tracing::warn!(
                        thread = self.index,
                        topic = %self.topic,
                        partition = owned.partition,
                        position,
                        log_end,
                        offsets_lost_or_reused = position.saturating_sub(log_end).max(0),
                        resume_at = resume,
                        "Kafka partition log truncated: it ends below the offset already read (the broker lost records it had acknowledged and gives their offsets to new records); posts read from the lost records stay in the store; reading resumes at or before the lowest offset a new record may have taken, so no new record is skipped"
                    );
                    resume
                }
                (None, Some(log_start)) => {
                    tracing::warn!(
                        thread = self.index,
                        topic = %self.topic,
                        partition = owned.partition,
                        position,
                        log_start,
                        offsets_skipped = log_start.saturating_sub(position),
                        "Kafka position below the partition's log start: the records in between were deleted before they were read; reading resumes at the log start"
                    );
                    log_start
                }
                (None, None) => continue,
            };
            positions[i] = Position {
                next: resume,
                at_end: false,
                ..positions[i]
            };
            moved.push(owned);
        }
        self.publish(positions);
        // After publishing: a monitor that sees the new epoch sees the new position too.
        for owned in moved {
            if let Some(state) = self.state(owned) {
                let mut report = state.truncation();
                report.epoch += 1;
                report.log_end = None;
            }
        }
    }

    /// The first offset of `owned` whose record is not older than `at`'s last record read
    /// less [`TRUNCATION_TIME_MARGIN_MS`]; the log start when that is unknown.
    fn first_offset_since(
        &self,
        consumer: &BaseConsumer<ThrottledContext>,
        owned: &OwnedPartition,
        at: Position,
    ) -> i64 {
        let by_time = at.last_timestamp.and_then(|ts| {
            let mut query = TopicPartitionList::with_capacity(1);
            let since = Offset::Offset(ts.saturating_sub(TRUNCATION_TIME_MARGIN_MS).max(0));
            query
                .add_partition_offset(&self.topic, owned.partition, since)
                .ok()?;
            let answer = consumer
                .offsets_for_times(query, OFFSET_CHECK_TIMEOUT)
                .ok()?;
            let element = answer.find_partition(&self.topic, owned.partition)?;
            element.error().ok()?;
            match element.offset() {
                Offset::Offset(offset) => Some(offset),
                // No record that recent: everything from the log end on is new.
                Offset::End => Some(i64::MAX),
                _ => None,
            }
        });
        by_time.unwrap_or_else(|| {
            consumer
                .fetch_watermarks(&self.topic, owned.partition, OFFSET_CHECK_TIMEOUT)
                .map_or(0, |(low, _)| low)
        })
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
        heap::release_freed_memory();
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
        KafkaMetrics::global()
            .messages_consumed
            .inc_by(outcome.records as u64);
        self.shared.counters.record(&outcome);
        self.shared
            .window
            .note_payloads(outcome.records as u64, outcome.payload_bytes as u64);
        // The records just applied are freed in librdkafka's arenas: hand them back.
        heap::release_freed_memory_if_due();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_outside_the_log_move() {
        // Inside the log, at its end, or a start marker: no move.
        assert_eq!(needed_move(5, (0, 10)), None);
        assert_eq!(needed_move(10, (0, 10)), None);
        assert_eq!(needed_move(-1, (3, 10)), None);
        assert_eq!(needed_move(i64::MAX, (3, 10)), None);
        // Past the log end: truncated.
        assert_eq!(
            needed_move(25, (0, 10)),
            Some(Move::Truncated { log_end: 10 })
        );
        // An emptied log (a re-created topic).
        assert_eq!(
            needed_move(25, (0, 0)),
            Some(Move::Truncated { log_end: 0 })
        );
        // Below the log start: retention deleted unread records.
        assert_eq!(
            needed_move(2, (7, 10)),
            Some(Move::BelowStart { log_start: 7 })
        );
    }
}
