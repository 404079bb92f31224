//! What every query answer must satisfy, checked without the model: these hold for any
//! interleaving of writers, so they also apply to queries that race the writer threads.

use std::collections::{BTreeMap, HashMap, HashSet};

use thunder_engine::config::MAX_VIDEO_POSTS_PER_AUTHOR;
use thunder_engine::{LightPost, OwnedQuery};

/// When something happened: `(round, step within the round)`. Only compared for the same post
/// id, which one writer owns, so the order is that writer's program order.
pub type Seq = (usize, usize);

/// What was written so far, as far as the invariants need it.
#[derive(Debug, Default)]
pub struct History {
    /// Every record ever offered to `insert_posts`, optional ids normalised.
    offered: HashSet<LightPost>,
    /// Per post id: when it was last offered to `insert_posts`.
    last_insert: HashMap<i64, Seq>,
    /// Per post id: when it was last deleted.
    last_delete: HashMap<i64, Seq>,
}

impl History {
    /// Records that `batch` is offered at `seq` (before or while it is applied).
    pub fn offer(&mut self, seq: Seq, batch: &[LightPost]) {
        for post in batch {
            self.offered.insert(post.normalised());
            self.last_insert.insert(post.post_id, seq);
        }
    }

    /// Records that `post_id` is deleted at `seq` (once the delete has returned).
    pub fn delete(&mut self, seq: Seq, post_id: i64) {
        self.last_delete.insert(post_id, seq);
    }

    /// Checks one answer of the engine to `query` at time `now`. `cap` is the store's
    /// `max_posting_list_size`.
    pub fn check(
        &self,
        query: &OwnedQuery,
        posts: &[LightPost],
        now: i64,
        retention_secs: i64,
        cap: usize,
    ) -> Result<(), String> {
        if posts.len() > query.max_results {
            return Err(format!(
                "{} posts for max_results {}",
                posts.len(),
                query.max_results
            ));
        }
        if let Some(w) = posts.windows(2).find(|w| w[0].created_at < w[1].created_at) {
            return Err(format!(
                "not newest first: post {} (at {}) before post {} (at {})",
                w[0].post_id, w[0].created_at, w[1].post_id, w[1].created_at
            ));
        }
        let mut seen = HashSet::new();
        // Per author: (originals, secondary) for feeds, (videos, 0) for video queries.
        let mut per_author: BTreeMap<i64, (usize, usize)> = BTreeMap::new();
        for post in posts {
            let id = post.post_id;
            if !seen.insert(id) {
                return Err(format!("post {id} returned twice"));
            }
            if !query.authors.contains(&post.author_id) {
                return Err(format!(
                    "post {id} of author {} who was not asked for",
                    post.author_id
                ));
            }
            if query.exclude.contains(&id) {
                return Err(format!("excluded post {id} returned"));
            }
            // Only age counts: after the clock moves back, stored posts may be in its future.
            if now - post.created_at > retention_secs {
                return Err(format!(
                    "post {id} created at {} returned at {now} (retention {retention_secs})",
                    post.created_at
                ));
            }
            if !self.offered.contains(post) {
                return Err(format!("post {id} was never offered as {post:?}"));
            }
            if let Some(deleted) = self.last_delete.get(&id)
                && self
                    .last_insert
                    .get(&id)
                    .is_none_or(|inserted| inserted < deleted)
            {
                return Err(format!(
                    "post {id} returned after its delete at {deleted:?} (last offered at {:?})",
                    self.last_insert.get(&id)
                ));
            }
            if post.is_retweet && post.source_user_id == Some(query.viewer_id) {
                return Err(format!(
                    "post {id} reposts viewer {}'s own post",
                    query.viewer_id
                ));
            }
            let counts = per_author.entry(post.author_id).or_default();
            if query.videos {
                if post.is_reply || !(post.has_video || post.is_retweet) {
                    return Err(format!("post {id} is not video eligible: {post:?}"));
                }
                counts.0 += 1;
            } else if post.is_original() {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }
        let (first_cap, second_cap) = if query.videos {
            (MAX_VIDEO_POSTS_PER_AUTHOR, 0)
        } else {
            let limits = query.per_author_limits();
            (limits.originals, limits.secondary)
        };
        for (author, (first, second)) in per_author {
            if first > first_cap.min(cap) || second > second_cap.min(cap) {
                return Err(format!(
                    "author {author}: {first} + {second} posts, over the per-author caps \
                     {first_cap} / {second_cap} or the timeline cap {cap}"
                ));
            }
        }
        Ok(())
    }
}
