//! The records that flow into and out of the store.

/// A post as the store receives and returns it (the reference's `LightPost`).
///
/// `created_at` is in unix seconds. Optional ids that are `Some(0)` come back as `None`,
/// as in the reference's `CompactPost` round trip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LightPost {
    /// Id of the post.
    pub post_id: i64,
    /// Id of the author.
    pub author_id: i64,
    /// Creation time, unix seconds.
    pub created_at: i64,
    /// Parent post of a reply.
    pub in_reply_to_post_id: Option<i64>,
    /// Author of the parent post of a reply.
    pub in_reply_to_user_id: Option<i64>,
    /// The post is a repost ("retweet") of `source_post_id`.
    pub is_retweet: bool,
    /// The post is a reply.
    pub is_reply: bool,
    /// Reposted post.
    pub source_post_id: Option<i64>,
    /// Author of the reposted post.
    pub source_user_id: Option<i64>,
    /// The post carries an eligible video.
    pub has_video: bool,
    /// Root post of the conversation.
    pub conversation_id: Option<i64>,
}

impl LightPost {
    /// An original post (neither reply nor repost) by `author_id`.
    pub fn original(post_id: i64, author_id: i64, created_at: i64) -> Self {
        Self {
            post_id,
            author_id,
            created_at,
            ..Self::default()
        }
    }

    /// The post as the store returns it: optional ids that are `Some(0)` become `None`
    /// (the store keeps optional ids as 0 meaning `None`, as the reference's `CompactPost`).
    pub fn normalised(&self) -> Self {
        let none_if_zero = |id: Option<i64>| id.filter(|&v| v != 0);
        Self {
            in_reply_to_post_id: none_if_zero(self.in_reply_to_post_id),
            in_reply_to_user_id: none_if_zero(self.in_reply_to_user_id),
            source_post_id: none_if_zero(self.source_post_id),
            source_user_id: none_if_zero(self.source_user_id),
            conversation_id: none_if_zero(self.conversation_id),
            ..*self
        }
    }

    /// True when the post belongs in the originals timeline (neither reply nor repost).
    pub fn is_original(&self) -> bool {
        !self.is_reply && !self.is_retweet
    }
}

/// A delete of `post_id` (the reference's `TweetDeleteEvent`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeleteEvent {
    /// Id of the deleted post.
    pub post_id: i64,
    /// Time of the delete, unix seconds (the producer's clock).
    pub deleted_at: i64,
}
