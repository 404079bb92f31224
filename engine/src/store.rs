//! API skeleton; the implementation lands in the next commit.
#![allow(missing_docs, unused)]
use crate::{Clock, DeleteEvent, LightPost};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug)]
pub struct PostStore;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertReport { pub inserted: usize, pub too_old: usize, pub in_future: usize, pub tombstoned: usize, pub duplicate: usize }
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeleteReport { pub removed: usize, pub tombstoned: usize }
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrimReport { pub entries_removed: usize, pub posts_freed: usize, pub tombstones_expired: usize, pub authors_dropped: usize }
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats { pub authors: usize, pub posts: usize, pub original_entries: usize, pub secondary_entries: usize, pub video_entries: usize, pub tombstones: usize, pub arena_bytes_reserved: usize, pub arena_bytes_used: usize, pub timeline_bytes: usize }

#[derive(Clone, Debug)]
pub struct FeedQuery<'a> { pub viewer_id: i64, pub authors: &'a [i64], pub exclude: &'a [i64], pub max_results: usize, pub max_originals_per_author: usize, pub max_secondary_per_author: usize, pub deadline: Option<Instant> }

#[derive(Clone, Debug, Default)]
pub struct QueryOutcome { pub posts: Vec<LightPost>, pub timed_out: bool, pub eligible: usize }

#[derive(Clone, Debug)]
pub struct StoreConfig { pub retention_secs: i64, pub max_posting_list_size: usize, pub clock: Arc<dyn Clock> }
impl Default for StoreConfig { fn default() -> Self { unimplemented!() } }

impl PostStore {
    pub fn with_config(config: StoreConfig) -> Self { unimplemented!() }
    pub fn new(retention_secs: i64) -> Self { unimplemented!() }
    pub fn with_clock(retention_secs: i64, clock: Arc<dyn Clock>) -> Self { unimplemented!() }
    pub fn retention_secs(&self) -> i64 { unimplemented!() }
    pub fn now_secs(&self) -> i64 { unimplemented!() }
    pub fn insert_posts(&self, batch: &[LightPost]) -> InsertReport { unimplemented!() }
    pub fn mark_as_deleted(&self, events: &[DeleteEvent]) -> DeleteReport { unimplemented!() }
    pub fn trim(&self, shard: usize) -> TrimReport { unimplemented!() }
    pub fn trim_all(&self) -> TrimReport { unimplemented!() }
    pub fn get_all_posts_by_users(&self, q: &FeedQuery<'_>) -> QueryOutcome { unimplemented!() }
    pub fn get_videos_by_users(&self, q: &FeedQuery<'_>) -> QueryOutcome { unimplemented!() }
    pub fn stats(&self) -> StoreStats { unimplemented!() }
}
impl<'a> FeedQuery<'a> {
    pub fn new(viewer_id: i64, authors: &'a [i64]) -> Self { unimplemented!() }
}
