//! [`Store`]: the one contract every post store implements (the engine, the test model and the
//! benchmark's reference baseline), so that benches and rule tests drive them interchangeably.

use crate::feed_query::{FeedQuery, OwnedQuery, QueryOutcome};
use crate::post::{DeleteEvent, EventBatch, LightPost};
use crate::report::{DeleteReport, InsertReport, TrimReport};
use crate::store::PostStore;

/// A post store: ingest, delete, trim and the two feed queries, all through `&self` so one store
/// can be shared by concurrent writers and readers.
pub trait Store: Send + Sync {
    /// Short name for reports and test output (`"engine"`, `"model"`, `"baseline"`).
    fn name(&self) -> &'static str;

    /// Inserts a batch of created posts; the report counts every post once.
    fn insert_posts(&self, posts: &[LightPost]) -> InsertReport;

    /// Applies a batch of deletes (tombstoning each id, removing stored posts).
    fn mark_as_deleted(&self, deletes: &[DeleteEvent]) -> DeleteReport;

    /// Trims author shard `shard` (mod `TRIM_FRACTION`) and expires the tombstones that are due.
    fn trim(&self, shard: usize) -> TrimReport;

    /// The newest originals and replies+reposts of `query.authors`, newest first.
    fn get_all_posts_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome;

    /// The newest video-eligible posts of `query.authors`, newest first.
    fn get_videos_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome;

    /// Number of stored post records.
    fn stored_posts(&self) -> usize;

    /// The answer to `query`'s question (the feed or the videos).
    fn answer(&self, query: &OwnedQuery) -> QueryOutcome {
        if query.videos {
            self.get_videos_by_users(&query.feed())
        } else {
            self.get_all_posts_by_users(&query.feed())
        }
    }

    /// Applies `batch`: `insert_posts` with its creates, then `mark_as_deleted` with its deletes
    /// (an empty half is not called).
    fn apply(&self, batch: &EventBatch) -> (InsertReport, DeleteReport) {
        let inserted = if batch.creates.is_empty() {
            InsertReport::default()
        } else {
            self.insert_posts(&batch.creates)
        };
        let deleted = if batch.deletes.is_empty() {
            DeleteReport::default()
        } else {
            self.mark_as_deleted(&batch.deletes)
        };
        (inserted, deleted)
    }

    /// Trims every shard once, summing the reports.
    fn trim_all(&self) -> TrimReport {
        (0..crate::config::TRIM_FRACTION)
            .map(|shard| self.trim(shard))
            .sum()
    }

    /// Work a store does once after loading its backlog; a no-op unless overridden (the
    /// reference baseline runs its `finalize_init` sort here).
    fn finish_load(&self) {}
}

impl Store for PostStore {
    fn name(&self) -> &'static str {
        "engine"
    }

    fn insert_posts(&self, posts: &[LightPost]) -> InsertReport {
        PostStore::insert_posts(self, posts)
    }

    fn mark_as_deleted(&self, deletes: &[DeleteEvent]) -> DeleteReport {
        PostStore::mark_as_deleted(self, deletes)
    }

    fn trim(&self, shard: usize) -> TrimReport {
        PostStore::trim(self, shard)
    }

    fn get_all_posts_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        PostStore::get_all_posts_by_users(self, query)
    }

    fn get_videos_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        PostStore::get_videos_by_users(self, query)
    }

    fn stored_posts(&self) -> usize {
        self.stats().posts
    }

    fn trim_all(&self) -> TrimReport {
        PostStore::trim_all(self)
    }
}
