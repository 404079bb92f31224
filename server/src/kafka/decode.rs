//! Kafka record → store event: the one decode path of ingestion (also the fuzzers' entry point).

use std::sync::atomic::{AtomicU64, Ordering};

use prost::Message;
use thunder_engine::{DeleteEvent, LightPost, PostStore};
use thunder_proto::in_network_event::EventVariant;
use thunder_proto::{InNetworkEvent, TweetCreateEvent, TweetDeleteEvent};

use super::metrics;

/// One decoded Kafka record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IngestEvent {
    /// A post was created.
    Create(LightPost),
    /// A post was deleted.
    Delete(DeleteEvent),
}

/// Why a record could not be turned into an [`IngestEvent`].
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
}

/// Decodes one record payload (a protobuf `InNetworkEvent`, no framing).
///
/// Never panics, whatever the bytes.
pub fn decode_event(payload: Option<&[u8]>) -> Result<IngestEvent, DecodeError> {
    let payload = payload.ok_or(DecodeError::NoPayload)?;
    let event = InNetworkEvent::decode(payload)?;
    match event.event_variant {
        Some(EventVariant::TweetCreateEvent(create)) => {
            Ok(IngestEvent::Create(light_post(&create)))
        }
        Some(EventVariant::TweetDeleteEvent(delete)) => {
            Ok(IngestEvent::Delete(delete_event(&delete)))
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

/// Decoded records waiting to be applied to the store as one batch.
#[derive(Debug, Default)]
pub struct EventBatch {
    creates: Vec<LightPost>,
    deletes: Vec<DeleteEvent>,
    records: usize,
    failed: usize,
}

/// What applying one [`EventBatch`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Records in the batch, decodable or not.
    pub records: usize,
    /// Create events handed to `insert_posts`.
    pub creates: usize,
    /// Delete events handed to `mark_as_deleted`.
    pub deletes: usize,
    /// Records skipped because they did not decode.
    pub failed: usize,
}

impl EventBatch {
    /// An empty batch with room for `capacity` records.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            creates: Vec::with_capacity(capacity),
            deletes: Vec::with_capacity(capacity / 8),
            records: 0,
            failed: 0,
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
    /// `kafka_messages_failed_parse_total`, logged with its partition and offset, and skipped.
    pub fn push_record(
        &mut self,
        partition: i32,
        offset: i64,
        payload: Option<&[u8]>,
    ) -> Result<(), DecodeError> {
        self.records += 1;
        match decode_event(payload) {
            Ok(IngestEvent::Create(post)) => self.creates.push(post),
            Ok(IngestEvent::Delete(delete)) => self.deletes.push(delete),
            Err(error) => {
                self.failed += 1;
                metrics::MESSAGES_FAILED_PARSE.inc();
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
    /// delete, and empties it. Times the store calls in `batch_processing_seconds`.
    pub fn apply(&mut self, store: &PostStore) -> BatchOutcome {
        let timer = metrics::BATCH_PROCESSING_SECONDS.start_timer();
        if !self.creates.is_empty() {
            store.insert_posts(&self.creates);
        }
        if !self.deletes.is_empty() {
            store.mark_as_deleted(&self.deletes);
        }
        timer.observe_duration();
        let outcome = BatchOutcome {
            records: self.records,
            creates: self.creates.len(),
            deletes: self.deletes.len(),
            failed: self.failed,
        };
        self.creates.clear();
        self.deletes.clear();
        self.records = 0;
        self.failed = 0;
        outcome
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
        assert_eq!(decoded, IngestEvent::Create(post));
    }

    #[test]
    fn delete_round_trips() {
        let delete = DeleteEvent {
            post_id: -5,
            deleted_at: 12,
        };
        let bytes = delete_envelope(&delete).encode_to_vec();
        assert_eq!(
            decode_event(Some(&bytes)).expect("decodes"),
            IngestEvent::Delete(delete)
        );
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
        let before = metrics::MESSAGES_FAILED_PARSE.get();
        let mut batch = EventBatch::with_capacity(4);
        assert!(batch.push_record(0, 1, Some(b"\x0a\x05abc")).is_err());
        assert_eq!(batch.len(), 1);
        assert!(metrics::MESSAGES_FAILED_PARSE.get() > before);
    }
}
