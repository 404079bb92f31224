//! Kafka records and store events, both ways: the one decode path of ingestion (record → store
//! event, also the fuzzers' entry point) and the encoding of events into records for the producer.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use prost::Message;
use thunder_engine::{DeleteEvent, EventBatch, LightPost, PostEvent, PostStore};
use thunder_proto::in_network_event::EventVariant;
use thunder_proto::{InNetworkEvent, TweetCreateEvent, TweetDeleteEvent};

use super::metrics;
use super::throttle::{LOG_INTERVAL, LogThrottle};

/// Why a record could not be turned into an [`PostEvent`].
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The record has a null payload.
    #[error("record has no payload")]
    NoPayload,
    /// The payload is not a protobuf `InNetworkEvent`.
    #[error("malformed InNetworkEvent: {0}")]
    Malformed(#[from] prost::DecodeError),
    /// The `InNetworkEvent` has no `event_variant` set.
    #[error("InNetworkEvent has no event variant")]
    NoVariant,
    /// An id is negative: the gRPC contract (`uint64` ids) could never ask for it.
    #[error("{field} {value} is negative: the gRPC contract (uint64 ids) cannot express it")]
    OutOfContractId {
        /// The event field.
        field: &'static str,
        /// Its value.
        value: i64,
    },
    /// A post id or author id is 0: no post or author has it (a create whose id field is
    /// missing decodes as 0, and would shadow every later post 0 as a duplicate).
    #[error("{field} is 0 (missing?): no post or author has id 0")]
    ZeroId {
        /// The event field.
        field: &'static str,
    },
}

impl DecodeError {
    /// The `kafka_events_dropped_total` reason of an error that drops a well-formed event,
    /// `None` for records that did not decode at all.
    pub fn drop_reason(&self) -> Option<&'static str> {
        matches!(self, Self::OutOfContractId { .. } | Self::ZeroId { .. })
            .then_some(crate::admin::metrics::OUT_OF_CONTRACT_ID)
    }
}

/// Fails on the first negative id: every id the gRPC contract can name is an `uint64` that
/// fits an `i64`, so a negative one could be stored but never asked for.
fn check_ids(ids: &[(&'static str, Option<i64>)]) -> Result<(), DecodeError> {
    match ids.iter().find(|(_, id)| id.is_some_and(|id| id < 0)) {
        Some(&(field, Some(value))) => Err(DecodeError::OutOfContractId { field, value }),
        _ => Ok(()),
    }
}

/// Fails on the first id that is 0: the event's own post id and author id must be set.
fn check_required_ids(ids: &[(&'static str, i64)]) -> Result<(), DecodeError> {
    match ids.iter().find(|(_, id)| *id == 0) {
        Some(&(field, _)) => Err(DecodeError::ZeroId { field }),
        None => Ok(()),
    }
}

/// Decodes one record payload (a protobuf `InNetworkEvent`, no framing). Events with a
/// negative id are refused ([`DecodeError::OutOfContractId`]), and so are creates with post
/// id or author id 0 and deletes with post id 0 ([`DecodeError::ZeroId`]).
///
/// Never panics, whatever the bytes.
pub fn decode_event(payload: Option<&[u8]>) -> Result<PostEvent, DecodeError> {
    let payload = payload.ok_or(DecodeError::NoPayload)?;
    let event = InNetworkEvent::decode(payload)?;
    match event.event_variant {
        Some(EventVariant::TweetCreateEvent(create)) => {
            check_ids(&[
                ("post_id", Some(create.post_id)),
                ("author_id", Some(create.author_id)),
                ("in_reply_to_post_id", create.in_reply_to_post_id),
                ("in_reply_to_user_id", create.in_reply_to_user_id),
                ("source_post_id", create.source_post_id),
                ("source_user_id", create.source_user_id),
                ("conversation_id", create.conversation_id),
            ])?;
            check_required_ids(&[("post_id", create.post_id), ("author_id", create.author_id)])?;
            Ok(PostEvent::Create(light_post(&create)))
        }
        Some(EventVariant::TweetDeleteEvent(delete)) => {
            check_ids(&[("post_id", Some(delete.post_id))])?;
            check_required_ids(&[("post_id", delete.post_id)])?;
            Ok(PostEvent::Delete(delete_event(&delete)))
        }
        None => Err(DecodeError::NoVariant),
    }
}

/// The store record of a create event: every field copied, except that `is_reply` is also set
/// when the post names a parent post or parent author (as the reference's v2 listener does).
pub fn light_post(event: &TweetCreateEvent) -> LightPost {
    let post = crate::convert::post_from_create_event(event);
    LightPost {
        is_reply: post.is_reply
            || post.in_reply_to_post_id.is_some()
            || post.in_reply_to_user_id.is_some(),
        ..post
    }
}

/// The store event of a delete event.
pub fn delete_event(event: &TweetDeleteEvent) -> DeleteEvent {
    crate::convert::delete_from_event(event)
}

/// The create event that carries `post` (the inverse of [`light_post`]).
pub fn create_event(post: &LightPost) -> InNetworkEvent {
    InNetworkEvent {
        event_variant: Some(EventVariant::TweetCreateEvent(
            crate::convert::create_event_from_post(post),
        )),
    }
}

/// The delete event that carries `delete`.
pub fn delete_envelope(delete: &DeleteEvent) -> InNetworkEvent {
    InNetworkEvent {
        event_variant: Some(EventVariant::TweetDeleteEvent(TweetDeleteEvent {
            post_id: delete.post_id,
            deleted_at: delete.deleted_at,
        })),
    }
}

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
            Err(error @ (DecodeError::OutOfContractId { .. } | DecodeError::ZeroId { .. })) => {
                let reason = crate::admin::metrics::OUT_OF_CONTRACT_ID;
                self.rejected += 1;
                metrics::kafka()
                    .events_dropped
                    .with_label_values(&[reason])
                    .inc();
                log_drop(reason, partition, offset, &error);
                return Err(error);
            }
            Err(error) => {
                self.failed += 1;
                metrics::kafka().messages_failed_parse.inc();
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
        let timer = metrics::kafka().batch_processing.start_timer();
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
                metrics::kafka()
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
        let reason = crate::admin::metrics::DELETED_IN_BATCH;
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
            metrics::kafka()
                .events_dropped
                .with_label_values(&[reason])
                .inc_by(counted.len() as u64);
        }
        counted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_round_trips_and_derives_is_reply() {
        let mut post = LightPost::original(7, 3, 1_700_000_000);
        post.in_reply_to_user_id = Some(9);
        let bytes = create_event(&post).encode_to_vec();
        let decoded = decode_event(Some(&bytes)).expect("decodes");
        post.is_reply = true;
        assert_eq!(decoded, PostEvent::Create(post));
    }

    #[test]
    fn delete_round_trips() {
        let delete = DeleteEvent {
            post_id: 5,
            deleted_at: 12,
        };
        let bytes = delete_envelope(&delete).encode_to_vec();
        assert_eq!(
            decode_event(Some(&bytes)).expect("decodes"),
            PostEvent::Delete(delete)
        );
    }

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

        let counter = metrics::kafka()
            .events_dropped
            .with_label_values(&["out_of_contract_id"]);
        let before = counter.get();
        let parse_failures = metrics::kafka().messages_failed_parse.get();
        let mut batch = RecordBatch::with_capacity(4);
        assert!(batch.push_record(0, 9, Some(&bytes)).is_err());
        assert_eq!(counter.get(), before + 1);
        assert_eq!(metrics::kafka().messages_failed_parse.get(), parse_failures);
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
            metrics::kafka()
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
        metrics::kafka()
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

        let before = dropped_count(crate::admin::metrics::OUT_OF_CONTRACT_ID);
        let mut batch = RecordBatch::with_capacity(4);
        for (offset, bytes) in [&bytes, &zero_author, &zero_delete].into_iter().enumerate() {
            let error = batch
                .push_record(0, offset as i64, Some(bytes))
                .expect_err("refused");
            assert_eq!(
                error.drop_reason(),
                Some(crate::admin::metrics::OUT_OF_CONTRACT_ID)
            );
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
        assert!(dropped_count(crate::admin::metrics::OUT_OF_CONTRACT_ID) >= before + 3);
        assert_eq!(store.stats().posts, 1, "only post 9 is stored");
    }

    #[test]
    fn a_create_deleted_in_the_same_batch_is_counted() {
        let store = PostStore::new(172_800);
        let now = store.now_secs();
        let reason = crate::admin::metrics::DELETED_IN_BATCH;
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
    fn bad_records_are_errors_not_panics() {
        assert!(matches!(decode_event(None), Err(DecodeError::NoPayload)));
        assert!(matches!(
            decode_event(Some(&[])),
            Err(DecodeError::NoVariant)
        ));
        assert!(matches!(
            decode_event(Some(&[0xff, 0xff, 0xff])),
            Err(DecodeError::Malformed(_))
        ));
        let before = metrics::kafka().messages_failed_parse.get();
        let mut batch = RecordBatch::with_capacity(4);
        assert!(batch.push_record(0, 1, Some(b"\x0a\x05abc")).is_err());
        assert_eq!(batch.len(), 1);
        assert!(metrics::kafka().messages_failed_parse.get() > before);
    }
}
