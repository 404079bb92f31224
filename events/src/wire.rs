//! Conversions between the wire types (`thunder-proto`) and the engine's records: a stored
//! post as the gRPC answer carries it, and a create or delete event as Kafka carries it.
//!
//! The engine's [`LightPost`], the answer's `pb::LightPost` and the event's
//! `pb::TweetCreateEvent` carry the same eleven fields under the same names; they are listed
//! once, in `copy_post!`, and every conversion between two of them is that copy.

use thunder_engine::{DeleteEvent, LightPost};
use thunder_proto as pb;

/// `$target { field: $source.field, ... }` over the eleven fields every post type carries.
macro_rules! copy_post {
    ($target:path, $source:expr) => {{
        let source = $source;
        $target {
            post_id: source.post_id,
            author_id: source.author_id,
            created_at: source.created_at,
            in_reply_to_post_id: source.in_reply_to_post_id,
            in_reply_to_user_id: source.in_reply_to_user_id,
            is_retweet: source.is_retweet,
            is_reply: source.is_reply,
            source_post_id: source.source_post_id,
            source_user_id: source.source_user_id,
            has_video: source.has_video,
            conversation_id: source.conversation_id,
        }
    }};
}

/// The wire form of a stored post.
pub fn post_to_proto(post: &LightPost) -> pb::LightPost {
    copy_post!(pb::LightPost, post)
}

/// The engine form of a wire post.
pub fn post_from_proto(post: &pb::LightPost) -> LightPost {
    copy_post!(LightPost, post)
}

/// The engine form of a create event, field for field (the codec's
/// [`light_post`](crate::codec::light_post) adds the reference's `is_reply` rule).
pub fn post_from_create_event(event: &pb::TweetCreateEvent) -> LightPost {
    copy_post!(LightPost, event)
}

/// The create event announcing `post`.
pub fn create_event_from_post(post: &LightPost) -> pb::TweetCreateEvent {
    copy_post!(pb::TweetCreateEvent, post)
}

/// The engine form of a delete event.
pub fn delete_from_event(event: &pb::TweetDeleteEvent) -> DeleteEvent {
    DeleteEvent {
        post_id: event.post_id,
        deleted_at: event.deleted_at,
    }
}

/// The wire form of a delete.
pub fn delete_to_event(delete: &DeleteEvent) -> pb::TweetDeleteEvent {
    pb::TweetDeleteEvent {
        post_id: delete.post_id,
        deleted_at: delete.deleted_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_field_set() -> LightPost {
        LightPost {
            post_id: 1,
            author_id: 2,
            created_at: 3,
            in_reply_to_post_id: Some(4),
            in_reply_to_user_id: Some(5),
            is_retweet: true,
            is_reply: true,
            source_post_id: Some(6),
            source_user_id: Some(7),
            has_video: true,
            conversation_id: Some(8),
        }
    }

    #[test]
    fn every_field_survives_the_answer_and_the_event_both_ways() {
        let post = every_field_set();
        assert_eq!(post_from_proto(&post_to_proto(&post)), post);
        assert_eq!(post_from_create_event(&create_event_from_post(&post)), post);
        let plain = LightPost::original(9, 10, 11);
        assert_eq!(post_from_proto(&post_to_proto(&plain)), plain);
        let delete = DeleteEvent {
            post_id: 12,
            deleted_at: 13,
        };
        assert_eq!(delete_from_event(&delete_to_event(&delete)), delete);
    }
}
