//! thunder-benches: the side-by-side benchmark of thunder-engine against the reference store
//! design, shared by the `compare` binary, the criterion benches and the `loadgen` binary.
//!
//! - [`baseline`]: the reference store (`DashMap` records, `VecDeque` timelines), the yardstick.
//! - [`BenchStore`]: the small trait the benchmark drives both stores through.
//! - [`EventBatch`] and [`load`]: the synthetic stream cut into ingest batches and applied.
//! - [`memory`]: resident-set measurement.
#![deny(missing_docs)]

pub mod baseline;
pub mod memory;

use std::collections::HashSet;
use std::time::{Duration, Instant};
use thunder_engine::{DeleteEvent, EventBatch, FeedQuery, LightPost, PostEvent, PostStore};

pub use baseline::BaselineStore;

/// Events per ingest batch, as the reference's Kafka listener `batch_size`.
pub const DEFAULT_BATCH_EVENTS: usize = 1000;

/// One feed request as both stores receive it.
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    /// The requesting user (self-repost filter).
    pub viewer_id: i64,
    /// Followed authors, in request order.
    pub authors: &'a [i64],
    /// Post ids the client has already seen.
    pub exclude: &'a [i64],
    /// Answer length (`MAX_POSTS_TO_RETURN` or `MAX_VIDEOS_TO_RETURN` by default).
    pub max_results: usize,
}

/// What the benchmark needs from a store: ingest, trim and the two feed queries.
pub trait BenchStore: Send + Sync {
    /// Short name for reports.
    fn name(&self) -> &'static str;
    /// Applies a batch of creates.
    fn insert_batch(&self, posts: &[LightPost]);
    /// Applies a batch of deletes.
    fn delete_batch(&self, deletes: &[DeleteEvent]);
    /// Work a store does once after loading its backlog (the reference's `finalize_init`).
    fn finish_load(&self);
    /// Trims author shard `shard` (and the tombstones that are due).
    fn trim(&self, shard: usize);
    /// The newest posts of the followed authors, newest first.
    fn query(&self, q: &Query<'_>) -> Vec<LightPost>;
    /// The newest video-eligible posts of the followed authors, newest first.
    fn query_videos(&self, q: &Query<'_>) -> Vec<LightPost>;
    /// Number of stored records.
    fn stored_posts(&self) -> usize;
}

impl BenchStore for PostStore {
    fn name(&self) -> &'static str {
        "engine"
    }

    fn insert_batch(&self, posts: &[LightPost]) {
        self.insert_posts(posts);
    }

    fn delete_batch(&self, deletes: &[DeleteEvent]) {
        self.mark_as_deleted(deletes);
    }

    fn finish_load(&self) {}

    fn trim(&self, shard: usize) {
        PostStore::trim(self, shard);
    }

    fn query(&self, q: &Query<'_>) -> Vec<LightPost> {
        let mut feed = FeedQuery::new(q.viewer_id, q.authors);
        feed.exclude = q.exclude;
        feed.max_results = q.max_results;
        self.get_all_posts_by_users(&feed).posts
    }

    fn query_videos(&self, q: &Query<'_>) -> Vec<LightPost> {
        let mut feed = FeedQuery::new(q.viewer_id, q.authors);
        feed.exclude = q.exclude;
        feed.max_results = q.max_results;
        self.get_videos_by_users(&feed).posts
    }

    fn stored_posts(&self) -> usize {
        self.stats().posts
    }
}

impl BenchStore for BaselineStore {
    fn name(&self) -> &'static str {
        "baseline"
    }

    fn insert_batch(&self, posts: &[LightPost]) {
        self.insert_posts(posts);
    }

    fn delete_batch(&self, deletes: &[DeleteEvent]) {
        self.mark_as_deleted(deletes);
    }

    fn finish_load(&self) {
        self.finalize_init();
    }

    fn trim(&self, shard: usize) {
        self.trim_old_posts(shard);
    }

    fn query(&self, q: &Query<'_>) -> Vec<LightPost> {
        // The reference handler builds the exclude set per request.
        let exclude: HashSet<i64> = q.exclude.iter().copied().collect();
        self.get_all_posts_by_users(q.authors, &exclude, q.viewer_id, q.max_results)
    }

    fn query_videos(&self, q: &Query<'_>) -> Vec<LightPost> {
        let exclude: HashSet<i64> = q.exclude.iter().copied().collect();
        self.get_videos_by_users(q.authors, &exclude, q.viewer_id, q.max_results)
    }

    fn stored_posts(&self) -> usize {
        self.post_count()
    }
}

/// Applies `batch` to `store`: its creates, then its deletes.
pub fn apply(store: &dyn BenchStore, batch: &EventBatch) {
    if !batch.creates.is_empty() {
        store.insert_batch(&batch.creates);
    }
    if !batch.deletes.is_empty() {
        store.delete_batch(&batch.deletes);
    }
}

/// Cuts `events` into consecutive batches of `batch_events` events.
pub fn batches(
    events: impl IntoIterator<Item = PostEvent>,
    batch_events: usize,
) -> Vec<EventBatch> {
    EventBatch::split(events, batch_events)
}

/// Applies `batches` to `store` with `writers` threads and returns the wall time. With more
/// than one writer, thread `t` applies the creates of authors `≡ t (mod writers)` and the
/// deletes of post ids `≡ t (mod writers)`, like consumers of Kafka partitions keyed that way.
pub fn load(store: &dyn BenchStore, batches: &[EventBatch], writers: usize) -> Duration {
    let writers = writers.max(1);
    if writers == 1 {
        let start = Instant::now();
        for batch in batches {
            apply(store, batch);
        }
        return start.elapsed();
    }
    // Split the stream the way Kafka partitions it for thunder (the producer keys creates by
    // author and deletes by post id), so each writer sees its authors' posts in order; the
    // split happens before the clock starts.
    let shares: Vec<Vec<EventBatch>> = (0..writers)
        .map(|t| {
            batches
                .iter()
                .map(|b| EventBatch {
                    creates: b
                        .creates
                        .iter()
                        .filter(|p| p.author_id.rem_euclid(writers as i64) == t as i64)
                        .copied()
                        .collect(),
                    deletes: b
                        .deletes
                        .iter()
                        .filter(|d| d.post_id.rem_euclid(writers as i64) == t as i64)
                        .copied()
                        .collect(),
                })
                .collect()
        })
        .collect();
    let start = Instant::now();
    std::thread::scope(|scope| {
        for share in &shares {
            scope.spawn(move || {
                for batch in share {
                    apply(store, batch);
                }
            });
        }
    });
    start.elapsed()
}
