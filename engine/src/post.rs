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

/// One event of the store's input stream: a post was created or deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostEvent {
    /// A new post.
    Create(LightPost),
    /// A delete of a post (possibly arriving before the post itself).
    Delete(DeleteEvent),
}

/// Events gathered for one pair of store calls: `insert_posts` with the creates, then
/// `mark_as_deleted` with the deletes, the order the reference's Kafka listener applies a batch
/// in (the store's answers do not depend on it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventBatch {
    /// Creates, in arrival order.
    pub creates: Vec<LightPost>,
    /// Deletes, in arrival order.
    pub deletes: Vec<DeleteEvent>,
}

impl EventBatch {
    /// An empty batch with room for `capacity` creates.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            creates: Vec::with_capacity(capacity),
            deletes: Vec::with_capacity(capacity / 8),
        }
    }

    /// Number of events in the batch.
    pub fn len(&self) -> usize {
        self.creates.len() + self.deletes.len()
    }

    /// True when the batch holds no event.
    pub fn is_empty(&self) -> bool {
        self.creates.is_empty() && self.deletes.is_empty()
    }

    /// Adds one event.
    pub fn push(&mut self, event: PostEvent) {
        match event {
            PostEvent::Create(post) => self.creates.push(post),
            PostEvent::Delete(delete) => self.deletes.push(delete),
        }
    }

    /// Empties the batch, keeping its buffers.
    pub fn clear(&mut self) {
        self.creates.clear();
        self.deletes.clear();
    }

    /// Cuts `events` into consecutive batches of `batch_events` events (at least 1).
    pub fn split(events: impl IntoIterator<Item = PostEvent>, batch_events: usize) -> Vec<Self> {
        let batch_events = batch_events.max(1);
        let mut out = Vec::new();
        let mut current = Self::default();
        for event in events {
            current.push(event);
            if current.len() == batch_events {
                out.push(std::mem::take(&mut current));
            }
        }
        if !current.is_empty() {
            out.push(current);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_every_event_creates_then_deletes() {
        let delete = |post_id| {
            PostEvent::Delete(DeleteEvent {
                post_id,
                deleted_at: 5,
            })
        };
        let events = vec![
            delete(1),
            PostEvent::Create(LightPost::original(1, 1, 1)),
            PostEvent::Create(LightPost::original(2, 1, 2)),
            delete(2),
            PostEvent::Create(LightPost::original(3, 1, 3)),
        ];
        let batches = EventBatch::split(events, 2);
        assert_eq!(
            batches.iter().map(EventBatch::len).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        assert_eq!(batches[0].creates.len(), 1);
        assert_eq!(batches[0].deletes.len(), 1);
        assert!(EventBatch::split(Vec::new(), 0).is_empty());
    }
}
