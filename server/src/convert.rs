//! Conversions between the wire types (`thunder-proto`) and the engine's records.

use thunder_engine::{DeleteEvent, LightPost};
use thunder_proto as pb;

/// The wire form of a stored post.
pub fn post_to_proto(post: &LightPost) -> pb::LightPost {
    pb::LightPost {
        post_id: post.post_id,
        author_id: post.author_id,
        created_at: post.created_at,
        in_reply_to_post_id: post.in_reply_to_post_id,
        in_reply_to_user_id: post.in_reply_to_user_id,
        is_retweet: post.is_retweet,
        is_reply: post.is_reply,
        source_post_id: post.source_post_id,
        source_user_id: post.source_user_id,
        has_video: post.has_video,
        conversation_id: post.conversation_id,
    }
}

/// The engine form of a wire post.
pub fn post_from_proto(post: &pb::LightPost) -> LightPost {
    LightPost {
        post_id: post.post_id,
        author_id: post.author_id,
        created_at: post.created_at,
        in_reply_to_post_id: post.in_reply_to_post_id,
        in_reply_to_user_id: post.in_reply_to_user_id,
        is_retweet: post.is_retweet,
        is_reply: post.is_reply,
        source_post_id: post.source_post_id,
        source_user_id: post.source_user_id,
        has_video: post.has_video,
        conversation_id: post.conversation_id,
    }
}

/// The engine form of a create event (field for field, like the reference's listeners).
pub fn post_from_create_event(event: &pb::TweetCreateEvent) -> LightPost {
    LightPost {
        post_id: event.post_id,
        author_id: event.author_id,
        created_at: event.created_at,
        in_reply_to_post_id: event.in_reply_to_post_id,
        in_reply_to_user_id: event.in_reply_to_user_id,
        is_retweet: event.is_retweet,
        is_reply: event.is_reply,
        source_post_id: event.source_post_id,
        source_user_id: event.source_user_id,
        has_video: event.has_video,
        conversation_id: event.conversation_id,
    }
}

/// The create event announcing `post`.
pub fn create_event_from_post(post: &LightPost) -> pb::TweetCreateEvent {
    pb::TweetCreateEvent {
        post_id: post.post_id,
        author_id: post.author_id,
        created_at: post.created_at,
        in_reply_to_post_id: post.in_reply_to_post_id,
        in_reply_to_user_id: post.in_reply_to_user_id,
        is_retweet: post.is_retweet,
        is_reply: post.is_reply,
        source_post_id: post.source_post_id,
        source_user_id: post.source_user_id,
        has_video: post.has_video,
        conversation_id: post.conversation_id,
    }
}

/// The engine form of a delete event.
pub fn delete_from_event(event: &pb::TweetDeleteEvent) -> DeleteEvent {
    DeleteEvent {
        post_id: event.post_id,
        deleted_at: event.deleted_at,
    }
}
