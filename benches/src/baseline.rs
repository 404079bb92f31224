//! The reference store design, written from its specification (§4), as the benchmark's yardstick.
//!
//! `DashMap<i64, Arc<CompactPost>>` for records, three `DashMap<i64, VecDeque<TinyPost>>`
//! timelines (originals, secondary, videos), a `DashMap<i64, bool>` tombstone set and the
//! tombstone list under the pseudo-author [`DELETE_EVENT_KEY`] of the originals map. Insert,
//! delete, trim and query follow the reference rules, bugs included (cross-list eviction,
//! dead entries using up the scan window, sorting only in [`BaselineStore::finalize_init`],
//! no age check at query time, repost video eligibility decided at insert time).
//!
//! The one version choice: posts created in the current second are kept (`created_at <= now`,
//! the newest upstream revision), so a benchmark whose clock stands at the workload's `now`
//! loads the same posts into both stores.
//!
//! Reasonably written and not tuned: no deliberate slowness, no optimisation beyond the design.

use dashmap::DashMap;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use thunder_engine::config::{
    MAX_ORIGINAL_POSTS_PER_AUTHOR, MAX_POSTING_LIST_SIZE, MAX_REPLY_POSTS_PER_AUTHOR,
    MAX_TINY_POSTS_PER_USER_SCAN, MAX_VIDEO_POSTS_PER_AUTHOR, TRIM_FRACTION,
};
use thunder_engine::{
    Clock, DeleteEvent, DeleteReport, FeedQuery, InsertReport, LightPost, QueryOutcome, Store,
    TrimReport,
};

/// Pseudo-author of the originals map whose timeline holds the tombstone list.
pub const DELETE_EVENT_KEY: i64 = 0;

/// A timeline entry: post id and creation time (`deleted_at` for tombstones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TinyPost {
    /// Id of the post.
    pub post_id: i64,
    /// Creation time, unix seconds (the delete time in the tombstone list).
    pub created_at: i64,
}

/// The stored record: the fields of [`LightPost`], optional ids stored as `0` meaning `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactPost {
    /// Id of the post.
    pub post_id: i64,
    /// Id of the author.
    pub author_id: i64,
    /// Creation time, unix seconds.
    pub created_at: i64,
    /// Parent post of a reply, `0` if none.
    pub in_reply_to_post_id: i64,
    /// Author of the parent post, `0` if none.
    pub in_reply_to_user_id: i64,
    /// The post is a repost.
    pub is_retweet: bool,
    /// The post is a reply.
    pub is_reply: bool,
    /// Reposted post, `0` if none.
    pub source_post_id: i64,
    /// Author of the reposted post, `0` if none.
    pub source_user_id: i64,
    /// The post carries video.
    pub has_video: bool,
    /// Conversation root, `0` if none.
    pub conversation_id: i64,
}

fn none_if_zero(id: i64) -> Option<i64> {
    (id != 0).then_some(id)
}

impl From<&LightPost> for CompactPost {
    fn from(p: &LightPost) -> Self {
        Self {
            post_id: p.post_id,
            author_id: p.author_id,
            created_at: p.created_at,
            in_reply_to_post_id: p.in_reply_to_post_id.unwrap_or(0),
            in_reply_to_user_id: p.in_reply_to_user_id.unwrap_or(0),
            is_retweet: p.is_retweet,
            is_reply: p.is_reply,
            source_post_id: p.source_post_id.unwrap_or(0),
            source_user_id: p.source_user_id.unwrap_or(0),
            has_video: p.has_video,
            conversation_id: p.conversation_id.unwrap_or(0),
        }
    }
}

impl From<&CompactPost> for LightPost {
    fn from(p: &CompactPost) -> Self {
        Self {
            post_id: p.post_id,
            author_id: p.author_id,
            created_at: p.created_at,
            in_reply_to_post_id: none_if_zero(p.in_reply_to_post_id),
            in_reply_to_user_id: none_if_zero(p.in_reply_to_user_id),
            is_retweet: p.is_retweet,
            is_reply: p.is_reply,
            source_post_id: none_if_zero(p.source_post_id),
            source_user_id: none_if_zero(p.source_user_id),
            has_video: p.has_video,
            conversation_id: none_if_zero(p.conversation_id),
        }
    }
}

type Timelines = DashMap<i64, VecDeque<TinyPost>>;

/// The reference post store.
#[derive(Debug)]
pub struct BaselineStore {
    posts: DashMap<i64, Arc<CompactPost>>,
    original_posts_by_user: Timelines,
    secondary_posts_by_user: Timelines,
    video_posts_by_user: Timelines,
    deleted_posts: DashMap<i64, bool>,
    retention_seconds: u64,
    max_posting_list_size: usize,
    clock: Arc<dyn Clock>,
}

/// Answer of one timeline-map query stage.
#[derive(Debug, Default)]
struct StageResult {
    posts: Vec<LightPost>,
    total_eligible: usize,
}

impl BaselineStore {
    /// An empty store keeping posts for `retention_seconds`, reading time from `clock`.
    pub fn new(retention_seconds: u64, clock: Arc<dyn Clock>) -> Self {
        Self::with_cap(retention_seconds, clock, MAX_POSTING_LIST_SIZE)
    }

    /// [`new`](Self::new) with timelines capped at `max_posting_list_size` entries instead of
    /// `MAX_POSTING_LIST_SIZE` (for rule tests that reach the cap with a few posts).
    pub fn with_cap(
        retention_seconds: u64,
        clock: Arc<dyn Clock>,
        max_posting_list_size: usize,
    ) -> Self {
        Self {
            posts: DashMap::new(),
            original_posts_by_user: DashMap::new(),
            secondary_posts_by_user: DashMap::new(),
            video_posts_by_user: DashMap::new(),
            deleted_posts: DashMap::new(),
            retention_seconds,
            max_posting_list_size: max_posting_list_size.max(1),
            clock,
        }
    }

    /// Number of stored records.
    pub fn post_count(&self) -> usize {
        self.posts.len()
    }

    /// Number of live tombstones.
    pub fn tombstone_count(&self) -> usize {
        self.deleted_posts.len()
    }

    /// The record of `post_id`, if stored.
    pub fn get(&self, post_id: i64) -> Option<LightPost> {
        self.posts.get(&post_id).map(|p| LightPost::from(&**p))
    }

    /// Timeline of `author_id` in the originals, secondary or videos map, oldest first.
    pub fn timeline(&self, kind: TimelineKind, author_id: i64) -> Vec<TinyPost> {
        self.map(kind)
            .get(&author_id)
            .map(|d| d.iter().copied().collect())
            .unwrap_or_default()
    }

    fn map(&self, kind: TimelineKind) -> &Timelines {
        match kind {
            TimelineKind::Originals => &self.original_posts_by_user,
            TimelineKind::Secondary => &self.secondary_posts_by_user,
            TimelineKind::Videos => &self.video_posts_by_user,
        }
    }

    fn now_secs(&self) -> u64 {
        self.clock.now_secs().max(0) as u64
    }

    /// Pushes `entry` at the back of `author`'s timeline in `map`, popping the front while the
    /// timeline holds `cap` entries; popped ids go to `evicted`.
    fn push_capped(
        map: &Timelines,
        cap: usize,
        author: i64,
        entry: TinyPost,
        evicted: &mut Vec<i64>,
    ) {
        let mut deque = map.entry(author).or_default();
        while deque.len() >= cap {
            if let Some(old) = deque.pop_front() {
                evicted.push(old.post_id);
            }
        }
        deque.push_back(entry);
    }

    /// Reference `insert_posts` (§4.2). The reference counts nothing; the report is what its
    /// rules did: a negative `created_at` wraps to the far future (`in_future`; `invalid_time`
    /// is never counted), and a `duplicate` has *overwritten* the stored record (bug 12).
    pub fn insert_posts(&self, batch: &[LightPost]) -> InsertReport {
        let now = self.now_secs();
        let mut report = InsertReport::default();
        let mut kept: Vec<&LightPost> = batch
            .iter()
            .filter(|p| {
                let created = p.created_at as u64;
                if created > now {
                    report.in_future += 1;
                    false
                } else if now - created > self.retention_seconds {
                    report.too_old += 1;
                    false
                } else {
                    true
                }
            })
            .collect();
        kept.sort_unstable_by_key(|p| p.created_at);
        let cap = self.max_posting_list_size;
        let mut evicted = Vec::new();
        for post in kept {
            if self.deleted_posts.contains_key(&post.post_id) {
                report.tombstoned += 1;
                continue;
            }
            let compact = Arc::new(CompactPost::from(post));
            if self.posts.insert(post.post_id, compact).is_some() {
                report.duplicate += 1;
                continue;
            }
            report.inserted += 1;
            let entry = TinyPost {
                post_id: post.post_id,
                created_at: post.created_at,
            };
            let primary = if !post.is_reply && !post.is_retweet {
                &self.original_posts_by_user
            } else {
                &self.secondary_posts_by_user
            };
            Self::push_capped(primary, cap, post.author_id, entry, &mut evicted);

            let mut video = post.has_video;
            if !video
                && post.is_retweet
                && let Some(source) = post.source_post_id.and_then(|id| self.posts.get(&id))
            {
                video = !source.is_reply && source.has_video;
            }
            if post.is_reply {
                video = false;
            }
            if video {
                Self::push_capped(
                    &self.video_posts_by_user,
                    cap,
                    post.author_id,
                    entry,
                    &mut evicted,
                );
            }
            for id in evicted.drain(..) {
                self.posts.remove(&id);
            }
        }
        report
    }

    /// Reference `mark_as_deleted` (§4.3): the author timelines are not touched.
    pub fn mark_as_deleted(&self, events: &[DeleteEvent]) -> DeleteReport {
        let mut report = DeleteReport {
            removed: 0,
            tombstoned: events.len(),
        };
        for event in events {
            report.removed += usize::from(self.posts.remove(&event.post_id).is_some());
            self.deleted_posts.insert(event.post_id, true);
            self.original_posts_by_user
                .entry(DELETE_EVENT_KEY)
                .or_default()
                .push_back(TinyPost {
                    post_id: event.post_id,
                    created_at: event.deleted_at,
                });
        }
        report
    }

    /// Reference `finalize_init` (§4.8): sort every timeline, trim every shard, drop
    /// tombstoned records. Runs once after the backlog has been loaded.
    pub fn finalize_init(&self) {
        for map in [
            &self.original_posts_by_user,
            &self.secondary_posts_by_user,
            &self.video_posts_by_user,
        ] {
            for mut deque in map.iter_mut() {
                deque
                    .make_contiguous()
                    .sort_unstable_by_key(|t| t.created_at);
            }
        }
        for shard in 0..TRIM_FRACTION {
            self.trim_old_posts(shard);
        }
        for tombstone in self.deleted_posts.iter() {
            self.posts.remove(tombstone.key());
        }
    }

    /// Reference `trim_old_posts` (§4.7); returns the count trimmed from originals and
    /// secondary (video trims are not counted, as in the reference).
    pub fn trim_old_posts(&self, trim_iter: usize) -> usize {
        self.trim_report(trim_iter).entries_removed
    }

    /// [`trim_old_posts`](Self::trim_old_posts) with what it did: `entries_removed` is the
    /// reference's count (originals and secondary entries plus tombstone-list entries; video
    /// trims not counted, bug 11), `posts_freed` the records removed, `tombstones_expired` the
    /// tombstones dropped, `authors_dropped` the authors left in none of the three maps.
    pub fn trim_report(&self, trim_iter: usize) -> TrimReport {
        let mut report = TrimReport::default();
        let mut emptied = Vec::new();
        report.entries_removed += self.trim_map(
            &self.original_posts_by_user,
            trim_iter,
            &mut report,
            &mut emptied,
        );
        report.entries_removed += self.trim_map(
            &self.secondary_posts_by_user,
            trim_iter,
            &mut report,
            &mut emptied,
        );
        self.trim_map(
            &self.video_posts_by_user,
            trim_iter,
            &mut report,
            &mut emptied,
        );
        emptied.sort_unstable();
        emptied.dedup();
        report.authors_dropped = emptied
            .into_iter()
            .filter(|author| {
                !self.original_posts_by_user.contains_key(author)
                    && !self.secondary_posts_by_user.contains_key(author)
                    && !self.video_posts_by_user.contains_key(author)
            })
            .count();
        report
    }

    /// Trims one map; returns the reference's count and adds freed records, expired tombstones
    /// and emptied authors to `report` / `emptied`.
    fn trim_map(
        &self,
        map: &Timelines,
        trim_iter: usize,
        report: &mut TrimReport,
        emptied: &mut Vec<i64>,
    ) -> usize {
        let now = self.now_secs();
        let expired =
            |created_at: i64| now.wrapping_sub(created_at as u64) > self.retention_seconds;
        let mut trimmed = 0;
        let cap = self.max_posting_list_size;
        let mut expired_tombstones = Vec::new();
        if let Some(mut deque) = map.get_mut(&DELETE_EVENT_KEY) {
            while deque.front().is_some_and(|t| expired(t.created_at)) {
                if let Some(t) = deque.pop_front() {
                    expired_tombstones.push(t.post_id);
                    trimmed += 1;
                }
            }
        }
        let mut removed_posts = Vec::new();
        let mut empty_authors = Vec::new();
        for mut entry in map.iter_mut() {
            let author = *entry.key();
            if author == DELETE_EVENT_KEY
                || (author as usize) % TRIM_FRACTION != trim_iter % TRIM_FRACTION
            {
                continue;
            }
            let deque = entry.value_mut();
            while deque
                .front()
                .is_some_and(|t| deque.len() > cap || expired(t.created_at))
            {
                if let Some(t) = deque.pop_front() {
                    removed_posts.push(t.post_id);
                }
            }
            if deque.capacity() > 2 * deque.len() {
                deque.shrink_to(deque.len() * 3 / 2);
            }
            if deque.is_empty() {
                empty_authors.push(author);
            }
        }
        for author in empty_authors {
            if map
                .remove_if(&author, |_, deque| deque.is_empty())
                .is_some()
            {
                emptied.push(author);
            }
        }
        trimmed += removed_posts.len();
        for id in removed_posts {
            report.posts_freed += usize::from(self.posts.remove(&id).is_some());
        }
        for id in expired_tombstones {
            report.posts_freed += usize::from(self.posts.remove(&id).is_some());
            report.tombstones_expired += usize::from(self.deleted_posts.remove(&id).is_some());
        }
        trimmed
    }

    /// Reference `get_posts_from_map` (§4.4) without the (disabled by default) request timeout.
    fn get_posts_from_map(
        &self,
        map: &Timelines,
        user_ids: &[i64],
        max_per_user: usize,
        exclude: &HashSet<i64>,
        following_users: &HashSet<i64>,
        request_user_id: i64,
    ) -> StageResult {
        let mut result = StageResult::default();
        for author in user_ids {
            let Some(deque) = map.get(author) else {
                continue;
            };
            result.total_eligible += deque.len();
            let candidates = deque
                .iter()
                .rev()
                .filter(|t| !exclude.contains(&t.post_id))
                .take(MAX_TINY_POSTS_PER_USER_SCAN)
                .filter_map(|t| self.posts.get(&t.post_id).map(|p| Arc::clone(&p)))
                .filter(|p| !(p.is_retweet && p.source_user_id == request_user_id))
                .filter(|p| following_users.is_empty() || self.reply_visible(p, following_users))
                .take(max_per_user);
            result
                .posts
                .extend(candidates.map(|p| LightPost::from(&*p)));
        }
        result
    }

    /// Reference reply visibility rule (§4.5).
    fn reply_visible(&self, p: &CompactPost, following_users: &HashSet<i64>) -> bool {
        if p.in_reply_to_post_id == 0 {
            return true;
        }
        let Some(parent) = self.posts.get(&p.in_reply_to_post_id) else {
            return false;
        };
        if !parent.is_retweet && !parent.is_reply {
            return true;
        }
        p.conversation_id != 0
            && parent.in_reply_to_post_id == p.conversation_id
            && p.in_reply_to_user_id != 0
            && following_users.contains(&p.in_reply_to_user_id)
    }

    /// Reference `get_all_posts_by_users` (§4.6) followed by the handler's `score_recent`
    /// (sort newest first, truncate to `max_results`).
    pub fn get_all_posts_by_users(
        &self,
        user_ids: &[i64],
        exclude: &HashSet<i64>,
        request_user_id: i64,
        max_results: usize,
    ) -> Vec<LightPost> {
        self.all_posts(
            user_ids,
            exclude,
            request_user_id,
            max_results,
            (MAX_ORIGINAL_POSTS_PER_AUTHOR, MAX_REPLY_POSTS_PER_AUTHOR),
        )
        .posts
    }

    /// Both stages with the given per-author `(originals, secondary)` limits.
    fn all_posts(
        &self,
        user_ids: &[i64],
        exclude: &HashSet<i64>,
        request_user_id: i64,
        max_results: usize,
        (max_originals, max_secondary): (usize, usize),
    ) -> StageResult {
        let following: HashSet<i64> = user_ids.iter().copied().collect();
        let no_following = HashSet::new();
        let mut result = self.get_posts_from_map(
            &self.original_posts_by_user,
            user_ids,
            max_originals,
            exclude,
            &no_following,
            request_user_id,
        );
        let secondary = self.get_posts_from_map(
            &self.secondary_posts_by_user,
            user_ids,
            max_secondary,
            exclude,
            &following,
            request_user_id,
        );
        result.posts.extend(secondary.posts);
        result.total_eligible += secondary.total_eligible;
        result.posts = score_recent(result.posts, max_results);
        result
    }

    /// Reference `get_videos_by_users` (§4.6) followed by `score_recent`.
    pub fn get_videos_by_users(
        &self,
        user_ids: &[i64],
        exclude: &HashSet<i64>,
        request_user_id: i64,
        max_results: usize,
    ) -> Vec<LightPost> {
        self.videos(user_ids, exclude, request_user_id, max_results)
            .posts
    }

    fn videos(
        &self,
        user_ids: &[i64],
        exclude: &HashSet<i64>,
        request_user_id: i64,
        max_results: usize,
    ) -> StageResult {
        let mut result = self.get_posts_from_map(
            &self.video_posts_by_user,
            user_ids,
            MAX_VIDEO_POSTS_PER_AUTHOR,
            exclude,
            &HashSet::new(),
            request_user_id,
        );
        result.posts = score_recent(result.posts, max_results);
        result
    }
}

/// The reference design behind the common contract. What it cannot do like the engine:
/// - queries ignore `deadline` (the reference's timeout is disabled by default) and never time
///   out; a repeated author is read again; `eligible` is the reference's `total_eligible`
///   (tombstone-list entries included for author 0, dead entries included);
/// - the per-author limits of the query are honoured (clamped to the reference caps);
/// - reports: see [`BaselineStore::insert_posts`] and [`BaselineStore::trim_report`];
/// - [`finish_load`](Store::finish_load) is the reference's `finalize_init`.
impl Store for BaselineStore {
    fn name(&self) -> &'static str {
        "baseline"
    }

    fn insert_posts(&self, posts: &[LightPost]) -> InsertReport {
        BaselineStore::insert_posts(self, posts)
    }

    fn mark_as_deleted(&self, deletes: &[DeleteEvent]) -> DeleteReport {
        BaselineStore::mark_as_deleted(self, deletes)
    }

    fn trim(&self, shard: usize) -> TrimReport {
        self.trim_report(shard)
    }

    fn get_all_posts_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        // The reference handler builds the exclude set per request.
        let exclude: HashSet<i64> = query.exclude.iter().copied().collect();
        let limits = query.per_author_limits();
        let limits = (limits.originals, limits.secondary);
        let result = self.all_posts(
            query.authors,
            &exclude,
            query.viewer_id,
            query.max_results,
            limits,
        );
        QueryOutcome {
            posts: result.posts,
            timed_out: false,
            eligible: result.total_eligible,
            ..QueryOutcome::default()
        }
    }

    fn get_videos_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        let exclude: HashSet<i64> = query.exclude.iter().copied().collect();
        let result = self.videos(query.authors, &exclude, query.viewer_id, query.max_results);
        QueryOutcome {
            posts: result.posts,
            timed_out: false,
            eligible: result.total_eligible,
            ..QueryOutcome::default()
        }
    }

    fn stored_posts(&self) -> usize {
        self.post_count()
    }

    fn finish_load(&self) {
        self.finalize_init();
    }
}

/// The handler's `score_recent`: newest first (unstable on ties), truncated.
fn score_recent(mut posts: Vec<LightPost>, max_results: usize) -> Vec<LightPost> {
    posts.sort_unstable_by_key(|p| std::cmp::Reverse(p.created_at));
    posts.truncate(max_results);
    posts
}

/// Which of the three timeline maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimelineKind {
    /// Originals (neither reply nor repost).
    Originals,
    /// Replies and reposts.
    Secondary,
    /// Video-eligible posts.
    Videos,
}

#[cfg(test)]
mod tests {
    use super::*;
    use thunder_engine::ManualClock;

    const NOW: i64 = 1_700_000_000;

    fn store() -> BaselineStore {
        BaselineStore::new(2 * 24 * 3600, Arc::new(ManualClock::new(NOW)))
    }

    fn reply(
        id: i64,
        author: i64,
        parent: i64,
        parent_author: i64,
        conversation: i64,
    ) -> LightPost {
        LightPost {
            is_reply: true,
            in_reply_to_post_id: Some(parent),
            in_reply_to_user_id: Some(parent_author),
            conversation_id: Some(conversation),
            ..LightPost::original(id, author, NOW - 100 + id % 100)
        }
    }

    #[test]
    fn reply_rule_matches_the_reference_table() {
        let s = store();
        let repost = LightPost {
            is_retweet: true,
            source_post_id: Some(1),
            source_user_id: Some(1),
            ..LightPost::original(1005, 2, NOW - 10)
        };
        s.insert_posts(&[
            LightPost::original(1000, 10, NOW - 99),
            reply(1001, 2, 1000, 10, 1000),
            reply(1002, 3, 1001, 2, 1000),
            reply(1003, 4, 1001, 99, 1000),
            reply(1004, 5, 1000, 10, 1000),
            repost,
            reply(1006, 3, 1002, 3, 1000),
        ]);
        let answer = s.get_all_posts_by_users(&[2, 3, 4, 5], &HashSet::new(), 1, 1200);
        let mut ids: Vec<i64> = answer.iter().map(|p| p.post_id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![1001, 1002, 1004]);
    }

    #[test]
    fn deleted_entries_use_up_the_scan_window_and_eviction_crosses_lists() {
        let s = store();
        let posts: Vec<LightPost> = (0..600)
            .map(|i| LightPost::original(i + 1, 7, NOW - 1000 + i))
            .collect();
        s.insert_posts(&posts);
        let deletes: Vec<DeleteEvent> = (100..600)
            .map(|i| DeleteEvent {
                post_id: i + 1,
                deleted_at: NOW,
            })
            .collect();
        s.mark_as_deleted(&deletes);
        // The newest 500 entries are dead, so the live older ones are never reached.
        assert!(
            s.get_all_posts_by_users(&[7], &HashSet::new(), 1, 1200)
                .is_empty()
        );

        let s = store();
        let video = LightPost {
            has_video: true,
            ..LightPost::original(1, 8, NOW - 5000)
        };
        s.insert_posts(&[video]);
        // Reposts of the video fill the author's videos timeline; the last one evicts it.
        let reposts: Vec<LightPost> = (0..MAX_POSTING_LIST_SIZE as i64)
            .map(|i| LightPost {
                is_retweet: true,
                source_post_id: Some(1),
                source_user_id: Some(8),
                ..LightPost::original(10 + i, 8, NOW - 4000 + i / 10)
            })
            .collect();
        s.insert_posts(&reposts);
        // Evicted from the full videos timeline, the original is gone from the records too.
        assert!(s.get(1).is_none());
        assert_eq!(
            s.timeline(TimelineKind::Originals, 8)
                .first()
                .map(|t| t.post_id),
            Some(1)
        );
    }

    #[test]
    fn tombstones_block_late_creates_and_expire_in_trim() {
        let s = store();
        s.mark_as_deleted(&[DeleteEvent {
            post_id: 5,
            deleted_at: NOW - 10,
        }]);
        s.insert_posts(&[LightPost::original(5, 3, NOW - 20)]);
        assert_eq!(s.post_count(), 0);
        assert_eq!(s.tombstone_count(), 1);
        let old = BaselineStore::new(5, Arc::new(ManualClock::new(NOW)));
        old.mark_as_deleted(&[DeleteEvent {
            post_id: 5,
            deleted_at: NOW - 10,
        }]);
        old.trim_old_posts(1);
        assert_eq!(old.tombstone_count(), 0);
    }
}
