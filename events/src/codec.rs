//! Kafka record payloads to store events and back: the one decode path of ingestion (also the
//! fuzzers' entry point) and the encoding the producer uses.
//!
//! A record's payload is one protobuf `InNetworkEvent`, no framing (the topic's only format).
//! [`decode_event`] turns it into a [`PostEvent`] and applies, once, what every event must
//! satisfy (ids the gRPC contract can express, no post or author id 0) and the reference's
//! `is_reply` rule; [`create_event`] and [`delete_envelope`] are the envelopes the producer
//! encodes.

use prost::Message;
use thunder_engine::{DeleteEvent, LightPost, PostEvent};
use thunder_proto::in_network_event::EventVariant;
use thunder_proto::{InNetworkEvent, TweetCreateEvent, TweetDeleteEvent};

use crate::wire;

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
    /// True for a well-formed event the contract refuses (an id negative or 0), false for a
    /// record that did not decode at all.
    pub fn is_out_of_contract(&self) -> bool {
        matches!(self, Self::OutOfContractId { .. } | Self::ZeroId { .. })
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

/// `post` with `is_reply` also set when it names a parent post or parent author.
fn with_reply_rule(post: LightPost) -> LightPost {
    LightPost {
        is_reply: post.is_reply
            || post.in_reply_to_post_id.is_some()
            || post.in_reply_to_user_id.is_some(),
        ..post
    }
}

/// Decodes one record's payload (`None`: a null payload) into the event the store gets.
/// Events with a negative id are refused ([`DecodeError::OutOfContractId`]), and so are creates
/// with post id or author id 0 and deletes with post id 0 ([`DecodeError::ZeroId`]); a create
/// that names a parent post or parent author is a reply (as the reference's v2 listener has
/// it).
///
/// Never panics, whatever the bytes.
pub fn decode_event(payload: Option<&[u8]>) -> Result<PostEvent, DecodeError> {
    let payload = payload.ok_or(DecodeError::NoPayload)?;
    match InNetworkEvent::decode(payload)?.event_variant {
        Some(EventVariant::TweetCreateEvent(create)) => {
            let post = wire::post_from_create_event(&create);
            check_ids(&[
                ("post_id", Some(post.post_id)),
                ("author_id", Some(post.author_id)),
                ("in_reply_to_post_id", post.in_reply_to_post_id),
                ("in_reply_to_user_id", post.in_reply_to_user_id),
                ("source_post_id", post.source_post_id),
                ("source_user_id", post.source_user_id),
                ("conversation_id", post.conversation_id),
            ])?;
            check_required_ids(&[("post_id", post.post_id), ("author_id", post.author_id)])?;
            Ok(PostEvent::Create(with_reply_rule(post)))
        }
        Some(EventVariant::TweetDeleteEvent(delete)) => {
            let delete = wire::delete_from_event(&delete);
            check_ids(&[("post_id", Some(delete.post_id))])?;
            check_required_ids(&[("post_id", delete.post_id)])?;
            Ok(PostEvent::Delete(delete))
        }
        None => Err(DecodeError::NoVariant),
    }
}

/// The store record of a create event: every field copied, except that `is_reply` is also set
/// when the post names a parent post or parent author (as the reference's v2 listener does).
pub fn light_post(event: &TweetCreateEvent) -> LightPost {
    with_reply_rule(wire::post_from_create_event(event))
}

/// The store event of a delete event.
pub fn delete_event(event: &TweetDeleteEvent) -> DeleteEvent {
    wire::delete_from_event(event)
}

/// The create event that carries `post` (the inverse of [`light_post`]).
pub fn create_event(post: &LightPost) -> InNetworkEvent {
    InNetworkEvent {
        event_variant: Some(EventVariant::TweetCreateEvent(
            wire::create_event_from_post(post),
        )),
    }
}

/// The delete event that carries `delete`.
pub fn delete_envelope(delete: &DeleteEvent) -> InNetworkEvent {
    InNetworkEvent {
        event_variant: Some(EventVariant::TweetDeleteEvent(wire::delete_to_event(
            delete,
        ))),
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
    fn ids_outside_the_contract_are_refused_with_the_field() {
        let mut post = LightPost::original(7, 3, 1);
        post.source_post_id = Some(-4);
        let bytes = create_event(&post).encode_to_vec();
        let error = decode_event(Some(&bytes)).expect_err("a negative id");
        assert!(error.is_out_of_contract());
        assert!(matches!(
            error,
            DecodeError::OutOfContractId {
                field: "source_post_id",
                value: -4
            }
        ));
        let bytes = create_event(&LightPost::original(7, 0, 1)).encode_to_vec();
        assert!(matches!(
            decode_event(Some(&bytes)),
            Err(DecodeError::ZeroId { field: "author_id" })
        ));
        let bytes = delete_envelope(&DeleteEvent {
            post_id: 0,
            deleted_at: 1,
        })
        .encode_to_vec();
        assert!(matches!(
            decode_event(Some(&bytes)),
            Err(DecodeError::ZeroId { field: "post_id" })
        ));
    }

    #[test]
    fn bad_records_are_errors_not_panics() {
        assert!(matches!(decode_event(None), Err(DecodeError::NoPayload)));
        assert!(matches!(
            decode_event(Some(&[])),
            Err(DecodeError::NoVariant)
        ));
        let malformed = decode_event(Some(&[0xff, 0xff, 0xff])).expect_err("malformed");
        assert!(matches!(malformed, DecodeError::Malformed(_)));
        assert!(!malformed.is_out_of_contract());
    }
}
