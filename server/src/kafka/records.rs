//! Decoded records applied to the store as one batch: what ingestion counts and logs about
//! each record (the payload codec itself is `thunder_events::codec`).

use std::collections::HashSet;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use thunder_engine::{EventBatch, PostEvent, PostStore};
use thunder_events::{DecodeError, decode_event};

use super::metrics::KafkaMetrics;
use super::throttle::{LOG_INTERVAL, LogThrottle};

/// Decode failures logged so far in this process; past the first few only every 1000th is
/// logged, so a flood of bad records cannot flood the log (the counter still counts each).
static FAILURES_LOGGED: AtomicU64 = AtomicU64::new(0);

/// One sampled log line per drop reason every [`LOG_INTERVAL`].
static DROPS_LOGGED: LazyLock<LogThrottle> = LazyLock::new(|| LogThrottle::new(LOG_INTERVAL));

/// Logs a dropped event with where it came from, rate-limited per reason.
fn log_drop(reason: &str, partition: i32, offset: i64, detail: &dyn std::fmt::Display) {
    if let Some(suppressed) = DROPS_LOGGED.admit(reason) {
        tracing::warn!(
            reason,
            partition,
            offset,
            suppressed,
            "dropping Kafka event: {detail}"
        );
    }
}

/// Decoded records waiting to be applied to the store as one batch.
#[derive(Debug, Default)]
pub struct RecordBatch {
    events: EventBatch,
    /// (partition, offset) of each create, for the drop log.
    create_origins: Vec<(i32, i64)>,
    records: usize,
    payload_bytes: usize,
    failed: usize,
    rejected: usize,
}

/// What applying one [`EventBatch`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Records in the batch, decodable or not.
    pub records: usize,
    /// Payload bytes of those records.
    pub payload_bytes: usize,
    /// Create events handed to `insert_posts`.
    pub creates: usize,
    /// Delete events handed to `mark_as_deleted`.
    pub deletes: usize,
    /// Records skipped because they did not decode.
    pub failed: usize,
    /// Events skipped because an id is outside the contract.
    pub rejected: usize,
    /// Creates the store dropped (too old, in the future, invalid time, duplicate, deleted),
    /// and creates a delete of the same batch removed again (`deleted_in_batch`).
    pub dropped: usize,
}

impl RecordBatch {
    /// An empty batch with room for `capacity` records.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            events: EventBatch::with_capacity(capacity),
            create_origins: Vec::with_capacity(capacity),
            records: 0,
            payload_bytes: 0,
            failed: 0,
            rejected: 0,
        }
    }

    /// Records pushed since the last [`apply`](Self::apply).
    pub fn len(&self) -> usize {
        self.records
    }

    /// True when nothing was pushed since the last [`apply`](Self::apply).
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Decodes one record into the batch. A record that does not decode is counted in
    /// `kafka_messages_failed_parse_total`, logged with its partition and offset, and skipped;
    /// an event with an id outside the contract is counted in `kafka_events_dropped_total`,
    /// sampled in the log and skipped.
    pub fn push_record(
        &mut self,
        partition: i32,
        offset: i64,
        payload: Option<&[u8]>,
    ) -> Result<(), DecodeError> {
        self.records += 1;
        self.payload_bytes += payload.map_or(0, <[u8]>::len);
        match decode_event(payload) {
            Ok(PostEvent::Create(post)) => {
                self.events.creates.push(post);
                self.create_origins.push((partition, offset));
            }
            Ok(PostEvent::Delete(delete)) => self.events.deletes.push(delete),
            Err(error) if error.is_out_of_contract() => {
                let reason = super::metrics::OUT_OF_CONTRACT_ID;
                self.rejected += 1;
                KafkaMetrics::global()
                    .events_dropped
                    .with_label_values(&[reason])
                    .inc();
                log_drop(reason, partition, offset, &error);
                return Err(error);
            }
            Err(error) => {
                self.failed += 1;
                KafkaMetrics::global().messages_failed_parse.inc();
                let logged = FAILURES_LOGGED.fetch_add(1, Ordering::Relaxed);
                if logged < 100 || logged.is_multiple_of(1000) {
                    tracing::warn!(partition, offset, %error, "skipping Kafka record that failed to parse");
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Applies the batch: `insert_posts` with every create, then `mark_as_deleted` with every
    /// delete, and empties it. Times the store calls in `batch_processing_seconds`; counts the
    /// creates the store drops by reason and logs a sample of them with partition and offset.
    pub fn apply(&mut self, store: &PostStore) -> BatchOutcome {
        let timer = KafkaMetrics::global().batch_processing.start_timer();
        let mut dropped = 0;
        // Per create: the store dropped it (only tracked when the batch also deletes).
        let mut store_dropped = Vec::new();
        if !self.events.creates.is_empty() {
            let creates = &self.events.creates;
            let origins = &self.create_origins;
            if !self.events.deletes.is_empty() {
                store_dropped.resize(creates.len(), false);
            }
            store.insert_posts_with(creates, |index, reason| {
                dropped += 1;
                if let Some(flag) = store_dropped.get_mut(index) {
                    *flag = true;
                }
                let reason = reason.as_str();
                KafkaMetrics::global()
                    .events_dropped
                    .with_label_values(&[reason])
                    .inc();
                if let (Some(post), Some(&(partition, offset))) =
                    (creates.get(index), origins.get(index))
                {
                    let detail = format_args!(
                        "post {} by {} created_at {}",
                        post.post_id, post.author_id, post.created_at
                    );
                    log_drop(reason, partition, offset, &detail);
                }
            });
        }
        if !self.events.deletes.is_empty() {
            store.mark_as_deleted(&self.events.deletes);
            dropped += self.count_deleted_in_batch(&store_dropped);
        }
        timer.observe_duration();
        let outcome = BatchOutcome {
            records: self.records,
            payload_bytes: self.payload_bytes,
            creates: self.events.creates.len(),
            deletes: self.events.deletes.len(),
            failed: self.failed,
            rejected: self.rejected,
            dropped,
        };
        self.events.clear();
        self.create_origins.clear();
        self.rejected = 0;
        self.records = 0;
        self.payload_bytes = 0;
        self.failed = 0;
        outcome
    }

    /// Counts (`deleted_in_batch`) and logs the creates of this batch that the store inserted
    /// and a delete of the same batch removed again: whatever their order in the partition,
    /// they were never served. `store_dropped` flags the creates the store dropped itself
    /// (already counted by their reason). Each post id counts once.
    fn count_deleted_in_batch(&self, store_dropped: &[bool]) -> usize {
        let deleted: HashSet<i64> = self.events.deletes.iter().map(|d| d.post_id).collect();
        let mut counted = HashSet::new();
        let reason = super::metrics::DELETED_IN_BATCH;
        for (index, post) in self.events.creates.iter().enumerate() {
            if store_dropped.get(index).copied().unwrap_or(false)
                || !deleted.contains(&post.post_id)
                || !counted.insert(post.post_id)
            {
                continue;
            }
            if let Some(&(partition, offset)) = self.create_origins.get(index) {
                let detail = format_args!(
                    "post {} by {}: a delete in the same batch removed it",
                    post.post_id, post.author_id
                );
                log_drop(reason, partition, offset, &detail);
            }
        }
        if !counted.is_empty() {
            KafkaMetrics::global()
                .events_dropped
                .with_label_values(&[reason])
                .inc_by(counted.len() as u64);
        }
        counted.len()
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use thunder_engine::{DeleteEvent, LightPost};
    use thunder_events::{create_event, delete_envelope};
    use thunder_proto::in_network_event::EventVariant;
    use thunder_proto::{InNetworkEvent, TweetCreateEvent};

    use super::*;

    #[test]
    fn negative_ids_are_rejected_and_counted() {
        let mut post = LightPost::original(7, 3, 1_700_000_000);
        post.author_id = -3;
        let bytes = create_event(&post).encode_to_vec();
        assert!(matches!(
            decode_event(Some(&bytes)),
            Err(DecodeError::OutOfContractId {
                field: "author_id",
                value: -3
            })
        ));
        let mut repost = LightPost::original(8, 3, 1_700_000_000);
        repost.source_post_id = Some(-1);
        let bytes = create_event(&repost).encode_to_vec();
        assert!(matches!(
            decode_event(Some(&bytes)),
            Err(DecodeError::OutOfContractId {
                field: "source_post_id",
                ..
            })
        ));
        let delete = DeleteEvent {
            post_id: -5,
            deleted_at: 12,
        };
        let bytes = delete_envelope(&delete).encode_to_vec();
        assert!(matches!(
            decode_event(Some(&bytes)),
            Err(DecodeError::OutOfContractId {
                field: "post_id",
                ..
            })
        ));

        let counter = KafkaMetrics::global()
            .events_dropped
            .with_label_values(&["out_of_contract_id"]);
        let before = counter.get();
        let parse_failures = KafkaMetrics::global().messages_failed_parse.get();
        let mut batch = RecordBatch::with_capacity(4);
        assert!(batch.push_record(0, 9, Some(&bytes)).is_err());
        assert_eq!(counter.get(), before + 1);
        assert_eq!(
            KafkaMetrics::global().messages_failed_parse.get(),
            parse_failures
        );
        let store = PostStore::new(172_800);
        let outcome = batch.apply(&store);
        assert_eq!(
            (outcome.records, outcome.rejected, outcome.deletes),
            (1, 1, 0)
        );
    }

    #[test]
    fn store_drops_are_counted_by_reason() {
        let store = PostStore::new(172_800);
        let now = store.now_secs();
        let count = |reason: &str| {
            KafkaMetrics::global()
                .events_dropped
                .with_label_values(&[reason])
                .get()
        };
        let before: Vec<u64> = ["in_future", "invalid_time", "too_old", "duplicate"]
            .iter()
            .map(|r| count(r))
            .collect();
        let mut batch = RecordBatch::with_capacity(8);
        for (offset, post) in [
            LightPost::original(1, 1, now),
            LightPost::original(1, 1, now),
            LightPost::original(2, 1, now + 3600),
            LightPost::original(3, 1, now * 1000),
            LightPost::original(4, 1, 0),
            LightPost::original(5, 1, now - 172_801),
        ]
        .iter()
        .enumerate()
        {
            let bytes = create_event(post).encode_to_vec();
            batch
                .push_record(0, offset as i64, Some(&bytes))
                .expect("decodes");
        }
        let outcome = batch.apply(&store);
        assert_eq!(outcome.dropped, 5);
        let after: Vec<u64> = ["in_future", "invalid_time", "too_old", "duplicate"]
            .iter()
            .map(|r| count(r))
            .collect();
        // One in the future, two invalid times (milliseconds, zero), one too old, one duplicate.
        assert_eq!(
            after
                .iter()
                .zip(&before)
                .map(|(a, b)| a - b)
                .collect::<Vec<_>>(),
            vec![1, 2, 1, 1]
        );
    }

    fn dropped_count(reason: &str) -> u64 {
        KafkaMetrics::global()
            .events_dropped
            .with_label_values(&[reason])
            .get()
    }

    fn push(batch: &mut RecordBatch, offset: i64, event: &InNetworkEvent) {
        batch
            .push_record(0, offset, Some(&event.encode_to_vec()))
            .expect("decodes");
    }

    #[test]
    fn zero_post_and_author_ids_are_dropped_as_out_of_contract() {
        let store = PostStore::new(172_800);
        let now = store.now_secs();
        // A create whose post id field is missing decodes as post 0.
        let no_post_id = InNetworkEvent {
            event_variant: Some(EventVariant::TweetCreateEvent(TweetCreateEvent {
                author_id: 5,
                created_at: now,
                ..TweetCreateEvent::default()
            })),
        };
        let bytes = no_post_id.encode_to_vec();
        assert!(matches!(
            decode_event(Some(&bytes)),
            Err(DecodeError::ZeroId { field: "post_id" })
        ));
        let zero_author = create_event(&LightPost::original(7, 0, now)).encode_to_vec();
        assert!(matches!(
            decode_event(Some(&zero_author)),
            Err(DecodeError::ZeroId { field: "author_id" })
        ));
        let zero_delete = delete_envelope(&DeleteEvent {
            post_id: 0,
            deleted_at: now,
        })
        .encode_to_vec();
        assert!(matches!(
            decode_event(Some(&zero_delete)),
            Err(DecodeError::ZeroId { field: "post_id" })
        ));
        // An optional id of 0 is "not set" and stays accepted.
        let mut reply = LightPost::original(8, 5, now);
        reply.in_reply_to_post_id = Some(0);
        let bytes_reply = create_event(&reply).encode_to_vec();
        assert!(decode_event(Some(&bytes_reply)).is_ok());

        let before = dropped_count(crate::kafka::metrics::OUT_OF_CONTRACT_ID);
        let mut batch = RecordBatch::with_capacity(4);
        for (offset, bytes) in [&bytes, &zero_author, &zero_delete].into_iter().enumerate() {
            let error = batch
                .push_record(0, offset as i64, Some(bytes))
                .expect_err("refused");
            assert!(error.is_out_of_contract(), "{error}");
        }
        // A well-formed post beside them is stored.
        push(
            &mut batch,
            3,
            &create_event(&LightPost::original(9, 5, now)),
        );
        let outcome = batch.apply(&store);
        assert_eq!(
            (outcome.records, outcome.rejected, outcome.creates),
            (4, 3, 1)
        );
        assert!(dropped_count(crate::kafka::metrics::OUT_OF_CONTRACT_ID) >= before + 3);
        assert_eq!(store.stats().posts, 1, "only post 9 is stored");
    }

    #[test]
    fn a_create_deleted_in_the_same_batch_is_counted() {
        let store = PostStore::new(172_800);
        let now = store.now_secs();
        let reason = crate::kafka::metrics::DELETED_IN_BATCH;
        let before = dropped_count(reason);
        let tombstoned_before = dropped_count("tombstoned");
        let delete = |post_id| {
            delete_envelope(&DeleteEvent {
                post_id,
                deleted_at: now,
            })
        };
        // Post 30 is stored by an earlier batch: deleting it later is no drop.
        let mut batch = RecordBatch::with_capacity(16);
        push(
            &mut batch,
            0,
            &create_event(&LightPost::original(30, 1, now)),
        );
        assert_eq!(batch.apply(&store).dropped, 0);

        // Create then delete (11), delete then create (12), a create deleted twice (13):
        // each one create cancelled. 14 stays; 30 is an ordinary delete. (No duplicates here:
        // another test counts those exactly.)
        push(
            &mut batch,
            1,
            &create_event(&LightPost::original(11, 1, now)),
        );
        push(&mut batch, 2, &delete(11));
        push(&mut batch, 3, &delete(12));
        push(
            &mut batch,
            4,
            &create_event(&LightPost::original(12, 1, now)),
        );
        push(
            &mut batch,
            5,
            &create_event(&LightPost::original(13, 2, now)),
        );
        push(&mut batch, 6, &delete(13));
        push(&mut batch, 7, &delete(13));
        push(
            &mut batch,
            8,
            &create_event(&LightPost::original(14, 2, now)),
        );
        push(&mut batch, 9, &delete(30));
        let outcome = batch.apply(&store);
        assert_eq!(outcome.dropped, 3, "{outcome:?}");
        // Only this test drops for this reason.
        assert_eq!(dropped_count(reason), before + 3);
        assert_eq!(dropped_count("tombstoned"), tombstoned_before);
        assert_eq!(store.stats().posts, 1, "only post 14 is stored");

        // Across batches the same create is counted as tombstoned, not as deleted_in_batch.
        push(
            &mut batch,
            10,
            &create_event(&LightPost::original(11, 1, now)),
        );
        assert_eq!(batch.apply(&store).dropped, 1);
        assert!(dropped_count("tombstoned") > tombstoned_before);
    }

    #[test]
    fn a_record_that_does_not_decode_is_counted_and_skipped() {
        let before = KafkaMetrics::global().messages_failed_parse.get();
        let mut batch = RecordBatch::with_capacity(4);
        assert!(batch.push_record(0, 1, Some(b"\x0a\x05abc")).is_err());
        assert_eq!(batch.len(), 1);
        assert!(KafkaMetrics::global().messages_failed_parse.get() > before);
    }
}
