//! A plain model of [`PostStore`](thunder_engine::PostStore): the rules of `BEHAVIOUR.md` written over
//! std collections, with no concurrency and nothing clever, so that it is obviously right.
//!
//! Property tests and fuzzers run the same operations against both stores and compare the
//! answers with [`answers_agree`]. The model follows `BEHAVIOUR.md` literally; where the text
//! leaves room, the choice is written next to the code that makes it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use thunder_engine::config::{
    MAX_TINY_POSTS_PER_USER_SCAN, MAX_VIDEO_POSTS_PER_AUTHOR, TRIM_FRACTION,
};
use thunder_engine::{
    Clock, DeleteEvent, DeleteReport, DropReason, FeedQuery, InsertReport, LightPost, OwnedQuery,
    PostExplanation, PostState, QueryOutcome, ReplyRuleMiss, Store, StoreConfig, StoreStats,
    TimelineKind, TimelinePlace, TrimReport, Verdict, page::answer_order,
};

/// One timeline entry: which post, and when it was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    post_id: i64,
    created_at_secs: i64,
}

/// A per-author timeline, oldest first by `created_at`, then by post id.
#[derive(Clone, Debug, Default)]
struct Timeline {
    entries: Vec<Entry>,
}

impl Timeline {
    /// Inserts at its `(created_at, post_id)` place, then evicts from the front while the
    /// timeline is over `cap`. Returns the evicted post ids.
    fn insert(&mut self, entry: Entry, cap: usize) -> Vec<i64> {
        let key = |e: &Entry| (e.created_at_secs, e.post_id);
        let at = self.entries.partition_point(|e| key(e) <= key(&entry));
        self.entries.insert(at, entry);
        let mut evicted = Vec::new();
        while self.entries.len() > cap {
            evicted.push(self.entries.remove(0).post_id);
        }
        evicted
    }

    fn contains(&self, post_id: i64) -> bool {
        self.entries.iter().any(|e| e.post_id == post_id)
    }

    fn remove(&mut self, post_id: i64) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| e.post_id != post_id);
        before - self.entries.len()
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The three timelines of one author.
#[derive(Clone, Debug, Default)]
struct AuthorTimelines {
    originals: Timeline,
    secondary: Timeline,
    videos: Timeline,
}

impl AuthorTimelines {
    fn holds(&self, post_id: i64) -> bool {
        self.originals.contains(post_id)
            || self.secondary.contains(post_id)
            || self.videos.contains(post_id)
    }

    fn is_empty(&self) -> bool {
        self.originals.len() == 0 && self.secondary.len() == 0 && self.videos.len() == 0
    }

    fn primary_mut(&mut self, post: &LightPost) -> &mut Timeline {
        if post.is_original() {
            &mut self.originals
        } else {
            &mut self.secondary
        }
    }
}

/// A repost without its own video that arrived before its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RememberedRepost {
    repost_id: i64,
    created_at_secs: i64,
}

/// The plain model of [`PostStore`](thunder_engine::PostStore): same constructor, same operations,
/// same report types, built from `HashMap`/`BTreeMap`/`Vec` and single-threaded.
///
/// Query answers are candidates in the answer order (newest first, larger post id first).
/// Timelines are in `(created_at, post_id)` order, as in the engine, so which of several posts
/// with equal `created_at` survive a per-author limit or the scan window is defined too;
/// compare answers with [`answers_agree`].
#[derive(Debug)]
pub struct ModelStore {
    retention_secs: i64,
    max_posting_list_size: usize,
    clock: Arc<dyn Clock>,
    /// Stored records by post id, optional ids normalised (`Some(0)` is `None`).
    records: HashMap<i64, LightPost>,
    /// Timelines by author id.
    authors: BTreeMap<i64, AuthorTimelines>,
    /// Tombstone basis (unix seconds) by post id; present until a trim expires it.
    tombstones: HashMap<i64, i64>,
    /// Reposts that arrived before their source, by source post id.
    remembered_reposts: BTreeMap<i64, BTreeSet<RememberedRepost>>,
}

impl ModelStore {
    /// A model store with the engine's configuration (retention, timeline cap, clock).
    pub fn with_config(config: StoreConfig) -> Self {
        Self {
            retention_secs: config.retention_secs,
            max_posting_list_size: config.max_posting_list_size,
            clock: config.clock,
            records: HashMap::new(),
            authors: BTreeMap::new(),
            tombstones: HashMap::new(),
            remembered_reposts: BTreeMap::new(),
        }
    }

    /// A model store holding what the base file `contents` describes (its timelines, their
    /// records, its tombstones and waiting reposts), with the engine's configuration: what a
    /// store serving from that file must answer like.
    pub fn from_base(config: StoreConfig, contents: &thunder_engine::base::BaseContents) -> Self {
        let mut model = Self::with_config(config);
        for (author_id, kinds) in &contents.authors {
            let timelines = model.authors.entry(*author_id).or_default();
            let kinds_of = [
                &mut timelines.originals,
                &mut timelines.secondary,
                &mut timelines.videos,
            ];
            for (timeline, posts) in kinds_of.into_iter().zip(kinds) {
                // Newest first in the file, oldest first here.
                timeline.entries = posts
                    .iter()
                    .rev()
                    .map(|post| Entry {
                        post_id: post.post_id,
                        created_at_secs: post.created_at,
                    })
                    .collect();
            }
            for post in kinds.iter().flatten() {
                model.records.insert(post.post_id, post.normalised());
            }
        }
        // As a load restores them: the expired ones are left out, a repeated id keeps the
        // later basis.
        let now = model.now_secs();
        for &(post_id, basis) in &contents.tombstones {
            if !model.is_expired(now, basis) {
                let kept = model.tombstones.entry(post_id).or_insert(basis);
                *kept = (*kept).max(basis);
            }
        }
        for &(source, repost_id, created_at_secs) in &contents.waiting {
            model
                .remembered_reposts
                .entry(source)
                .or_default()
                .insert(RememberedRepost {
                    repost_id,
                    created_at_secs,
                });
        }
        model
    }

    /// The retention window, seconds.
    pub fn retention_secs(&self) -> i64 {
        self.retention_secs
    }

    /// Current time of the store's clock, unix seconds.
    pub fn now_secs(&self) -> i64 {
        self.clock.now_secs()
    }

    /// Leaves out what a load from a base or a snapshot leaves out of what it restores: the
    /// tombstones and the waiting reposts already past retention (which a trim would drop
    /// later). Applied to a model that stands for a store restarted from its own file, so that
    /// the trims after the restart report what that store's do.
    pub fn forget_expired_as_a_load_does(&mut self) {
        let now = self.now_secs();
        let retention = self.retention_secs;
        let expired = |basis: i64| i128::from(now) - i128::from(basis) > i128::from(retention);
        self.tombstones.retain(|_, basis| !expired(*basis));
        for remembered in self.remembered_reposts.values_mut() {
            remembered.retain(|r| !expired(r.created_at_secs));
        }
        self.remembered_reposts
            .retain(|_, remembered| !remembered.is_empty());
    }

    /// True when something created (or deleted) at `basis_secs` is past retention at `now`.
    fn is_expired(&self, now: i64, basis_secs: i64) -> bool {
        i128::from(now) - i128::from(basis_secs) > i128::from(self.retention_secs)
    }

    /// The basis of `post_id`'s tombstone, if it has one that is live at `now`.
    fn live_tombstone(&self, now: i64, post_id: i64) -> Option<i64> {
        // "Live" is read by time, not by presence: a due tombstone that no trim has removed yet
        // no longer blocks a create, so trim timing cannot change what gets stored.
        self.tombstones
            .get(&post_id)
            .copied()
            .filter(|&basis| !self.is_expired(now, basis))
    }

    /// Inserts a batch of posts (see `BEHAVIOUR.md`, `insert_posts`).
    pub fn insert_posts(&mut self, batch: &[LightPost]) -> InsertReport {
        self.insert_posts_with(batch, |_, _| {})
    }

    /// [`insert_posts`](Self::insert_posts), calling `on_drop(index in batch, reason)` for every
    /// post it drops: the time checks in batch order, then the others in application order.
    pub fn insert_posts_with(
        &mut self,
        batch: &[LightPost],
        mut on_drop: impl FnMut(usize, DropReason),
    ) -> InsertReport {
        let now = self.clock.now_secs();
        let mut report = InsertReport::default();
        let mut dropped = |report: &mut InsertReport, index: usize, reason: DropReason| {
            match reason {
                DropReason::InvalidTime => report.invalid_time += 1,
                DropReason::InFuture => report.in_future += 1,
                DropReason::TooOld => report.too_old += 1,
                DropReason::Tombstoned => report.tombstoned += 1,
                DropReason::Duplicate => report.duplicate += 1,
                DropReason::NoSlot => report.no_slot += 1,
            }
            on_drop(index, reason);
        };
        let mut kept = Vec::new();
        for (index, post) in batch.iter().enumerate() {
            let created_at = post.created_at;
            if created_at <= 0 || created_at > i64::from(u32::MAX) {
                dropped(&mut report, index, DropReason::InvalidTime);
            } else if created_at > now {
                dropped(&mut report, index, DropReason::InFuture);
            } else if self.is_expired(now, created_at) {
                dropped(&mut report, index, DropReason::TooOld);
            } else {
                kept.push((index, post.normalised()));
            }
        }
        // Stable: batch order among equal timestamps.
        kept.sort_by_key(|(_, p)| p.created_at);
        for (index, post) in kept {
            if let Some(basis) = self.live_tombstone(now, post.post_id) {
                // The tombstone now covers this post as if it had been stored, then deleted.
                self.tombstones
                    .insert(post.post_id, basis.max(post.created_at));
                dropped(&mut report, index, DropReason::Tombstoned);
            } else if self.records.contains_key(&post.post_id) {
                dropped(&mut report, index, DropReason::Duplicate);
            } else {
                self.store(now, post);
                report.inserted += 1;
            }
        }
        report
    }

    /// Stores and indexes one accepted post.
    fn store(&mut self, now: i64, post: LightPost) {
        let source = post
            .source_post_id
            .and_then(|id| self.records.get(&id).copied());
        let video_eligible = !post.is_reply
            && (post.has_video
                || (post.is_retweet
                    && source.is_some_and(|s| {
                        !self.is_expired(now, s.created_at) && s.has_video && !s.is_reply
                    })));
        let remember = !post.is_reply
            && post.is_retweet
            && !post.has_video
            && post.source_post_id.is_some()
            && source.is_none();

        self.records.insert(post.post_id, post);
        let entry = Entry {
            post_id: post.post_id,
            created_at_secs: post.created_at,
        };
        let cap = self.max_posting_list_size;
        let timelines = self.authors.entry(post.author_id).or_default();
        let mut evicted = timelines.primary_mut(&post).insert(entry, cap);
        if video_eligible {
            evicted.extend(timelines.videos.insert(entry, cap));
        }
        self.free_unheld(post.author_id, &evicted);

        if let (true, Some(source_id)) = (remember, post.source_post_id) {
            self.remembered_reposts
                .entry(source_id)
                .or_default()
                .insert(RememberedRepost {
                    repost_id: post.post_id,
                    created_at_secs: post.created_at,
                });
        }
        if post.has_video && !post.is_reply {
            self.add_remembered_reposts_of(now, post.post_id);
        }
    }

    /// A video source has just been stored: its remembered reposts that are still stored (and
    /// not expired) join their authors' videos timelines.
    fn add_remembered_reposts_of(&mut self, now: i64, source_id: i64) {
        // The source has arrived: its remembered reposts are resolved now, once.
        let Some(remembered) = self.remembered_reposts.remove(&source_id) else {
            return;
        };
        for r in remembered {
            if self.is_expired(now, r.created_at_secs) {
                continue;
            }
            let Some(repost) = self.records.get(&r.repost_id).copied() else {
                continue;
            };
            let still_that_repost = repost.is_retweet
                && !repost.is_reply
                && !repost.has_video
                && repost.source_post_id == Some(source_id)
                && repost.created_at == r.created_at_secs;
            if !still_that_repost {
                continue;
            }
            let cap = self.max_posting_list_size;
            let timelines = self.authors.entry(repost.author_id).or_default();
            if timelines.videos.contains(repost.post_id) {
                continue;
            }
            let entry = Entry {
                post_id: repost.post_id,
                created_at_secs: repost.created_at,
            };
            let evicted = timelines.videos.insert(entry, cap);
            self.free_unheld(repost.author_id, &evicted);
        }
    }

    /// Frees the records among `post_ids` that no timeline of `author_id` holds any more.
    fn free_unheld(&mut self, author_id: i64, post_ids: &[i64]) -> usize {
        let mut freed = 0;
        for &post_id in post_ids {
            let held = self
                .authors
                .get(&author_id)
                .is_some_and(|t| t.holds(post_id));
            if !held && self.records.remove(&post_id).is_some() {
                freed += 1;
            }
        }
        freed
    }

    /// Applies deletes (see `BEHAVIOUR.md`, `mark_as_deleted`).
    ///
    /// `removed` counts stored records removed; `tombstoned` counts the events (each remembers
    /// or refreshes a tombstone).
    pub fn mark_as_deleted(&mut self, events: &[DeleteEvent]) -> DeleteReport {
        let now = self.clock.now_secs();
        let mut report = DeleteReport::default();
        for event in events {
            // `deleted_at`, but not after now (`<= 0` counts as now), and not so early that the
            // tombstone would be born expired.
            let stamped = if event.deleted_at <= 0 {
                now
            } else {
                event.deleted_at.min(now)
            };
            let mut basis = stamped.max(now.saturating_sub(self.retention_secs));
            if let Some(record) = self.records.remove(&event.post_id) {
                if let Some(timelines) = self.authors.get_mut(&record.author_id) {
                    timelines.originals.remove(record.post_id);
                    timelines.secondary.remove(record.post_id);
                    timelines.videos.remove(record.post_id);
                }
                basis = basis.max(record.created_at);
                report.removed += 1;
            }
            let stored = self.tombstones.entry(event.post_id).or_insert(basis);
            *stored = (*stored).max(basis);
            report.tombstoned += 1;
        }
        report
    }

    /// Trims one author shard and expires every due tombstone and remembered repost (see
    /// `BEHAVIOUR.md`, `trim(shard)`). `shard` is taken modulo `TRIM_FRACTION`.
    pub fn trim(&mut self, shard: usize) -> TrimReport {
        let now = self.clock.now_secs();
        let retention = self.retention_secs;
        let expired =
            |created_at: i64| i128::from(now) - i128::from(created_at) > i128::from(retention);
        let mut report = TrimReport::default();
        let shard = (shard % TRIM_FRACTION) as i64;
        let shard_authors: Vec<i64> = self
            .authors
            .keys()
            .copied()
            .filter(|a| a.rem_euclid(TRIM_FRACTION as i64) == shard)
            .collect();
        for author_id in shard_authors {
            let mut removed_ids = Vec::new();
            let timelines = self
                .authors
                .get_mut(&author_id)
                .expect("author listed above");
            for timeline in [
                &mut timelines.originals,
                &mut timelines.secondary,
                &mut timelines.videos,
            ] {
                for e in &timeline.entries {
                    if expired(e.created_at_secs) {
                        removed_ids.push(e.post_id);
                    }
                }
                timeline.entries.retain(|e| !expired(e.created_at_secs));
            }
            report.entries_removed += removed_ids.len();
            removed_ids.sort_unstable();
            removed_ids.dedup();
            report.posts_freed += self.free_unheld(author_id, &removed_ids);
            if self
                .authors
                .get(&author_id)
                .is_some_and(AuthorTimelines::is_empty)
            {
                self.authors.remove(&author_id);
                report.authors_dropped += 1;
            }
        }
        let tombstones_before = self.tombstones.len();
        self.tombstones.retain(|_, basis| !expired(*basis));
        report.tombstones_expired = tombstones_before - self.tombstones.len();
        for remembered in self.remembered_reposts.values_mut() {
            remembered.retain(|r| !expired(r.created_at_secs));
        }
        self.remembered_reposts
            .retain(|_, remembered| !remembered.is_empty());
        report
    }

    /// Trims every shard in turn; the reports are summed.
    pub fn trim_all(&mut self) -> TrimReport {
        (0..TRIM_FRACTION).map(|shard| self.trim(shard)).sum()
    }

    /// Counts of what the model holds. The byte fields are always zero.
    pub fn stats(&self) -> StoreStats {
        let sum = |f: fn(&AuthorTimelines) -> usize| self.authors.values().map(f).sum::<usize>();
        StoreStats {
            authors: self.authors.len(),
            posts: self.records.len(),
            original_entries: sum(|t| t.originals.len()),
            secondary_entries: sum(|t| t.secondary.len()),
            video_entries: sum(|t| t.videos.len()),
            tombstones: self.tombstones.len(),
            ..StoreStats::default()
        }
    }

    /// Every stored post id, ascending (expired records stay until trimmed or evicted).
    pub fn post_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.records.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// The stored record of `post_id`, if any (expired records stay until trimmed or evicted).
    pub fn record(&self, post_id: i64) -> Option<LightPost> {
        self.records.get(&post_id).copied()
    }

    /// Newest originals and replies/reposts of the requested authors (deadline ignored).
    pub fn get_all_posts_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        self.query(query, false, &mut |_, _| {})
    }

    /// Newest video posts of the requested authors (deadline ignored).
    pub fn get_videos_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        self.query(query, true, &mut |_, _| {})
    }

    /// The answer to `query`'s question (as [`Store::answer`] gives it).
    pub fn answer(&self, query: &OwnedQuery) -> QueryOutcome {
        self.query(&query.feed(), query.videos, &mut |_, _| {})
    }

    /// What the model holds of each of `post_ids`, and the verdict of `query` on it: where
    /// the answer holds it, or the first rule (reading each timeline newest first, as the
    /// rules are listed in `BEHAVIOUR.md`) that kept it out.
    pub fn explain(&self, query: &OwnedQuery, post_ids: &[i64]) -> Vec<PostExplanation> {
        let now = self.clock.now_secs();
        let feed = query.feed();
        let mut verdicts: HashMap<i64, Verdict> = HashMap::new();
        self.query(&feed, query.videos, &mut |post_id, verdict| {
            verdicts.entry(post_id).or_insert(verdict);
        });
        post_ids
            .iter()
            .map(|&post_id| {
                let state = self.state_of(now, post_id);
                let verdict = match &state {
                    PostState::NeverSeen => Verdict::NeverSeen,
                    PostState::Deleted => Verdict::Deleted,
                    PostState::OtherShard => Verdict::OtherShard,
                    PostState::Stored { post, .. } => {
                        let timelines = self.authors.get(&post.author_id);
                        let read = match timelines {
                            Some(t) if query.videos => &t.videos,
                            Some(t) if post.is_original() => &t.originals,
                            Some(t) => &t.secondary,
                            None => &Timeline::default(),
                        };
                        if !query.authors.contains(&post.author_id) {
                            Verdict::AuthorNotFollowed
                        } else if !read.contains(post_id) {
                            Verdict::NotInTimeline
                        } else {
                            // Every entry of a timeline read gets a verdict.
                            verdicts
                                .get(&post_id)
                                .copied()
                                .unwrap_or(Verdict::RemovedMeanwhile)
                        }
                    }
                };
                PostExplanation {
                    post_id,
                    state,
                    verdict,
                }
            })
            .collect()
    }

    /// What the model holds of `post_id` at `now`.
    fn state_of(&self, now: i64, post_id: i64) -> PostState {
        let Some(post) = self.records.get(&post_id).copied() else {
            return if self.live_tombstone(now, post_id).is_some() {
                PostState::Deleted
            } else {
                PostState::NeverSeen
            };
        };
        let mut timelines = Vec::new();
        if let Some(t) = self.authors.get(&post.author_id) {
            for (timeline, kind) in [
                (&t.originals, TimelineKind::Originals),
                (&t.secondary, TimelineKind::RepliesAndReposts),
                (&t.videos, TimelineKind::Videos),
            ] {
                if let Some(at) = timeline.entries.iter().position(|e| e.post_id == post_id) {
                    timelines.push(TimelinePlace {
                        timeline: kind,
                        position: timeline.len() - at,
                        len: timeline.len(),
                    });
                }
            }
        }
        PostState::Stored {
            post,
            expired: self.is_expired(now, post.created_at),
            timelines,
        }
    }

    /// The answer to `query` (videos or the feed), telling `note` the verdict on every entry
    /// of every timeline it reads (deadline ignored).
    fn query(
        &self,
        query: &FeedQuery<'_>,
        videos: bool,
        note: &mut dyn FnMut(i64, Verdict),
    ) -> QueryOutcome {
        let now = self.clock.now_secs();
        let authors = dedup_in_order(query.authors);
        let followed: BTreeSet<i64> = authors.iter().copied().collect();
        let limits = query.per_author_limits();
        let mut outcome = QueryOutcome::default();
        for author_id in &authors {
            let Some(timelines) = self.authors.get(author_id) else {
                continue;
            };
            if videos {
                outcome.eligible += timelines.videos.len();
                let scan = Scan::new(&timelines.videos, MAX_VIDEO_POSTS_PER_AUTHOR);
                outcome
                    .posts
                    .extend(self.scan(now, scan, query, None, true, note));
            } else {
                outcome.eligible += timelines.originals.len() + timelines.secondary.len();
                let originals = Scan::new(&timelines.originals, limits.originals);
                outcome
                    .posts
                    .extend(self.scan(now, originals, query, None, false, note));
                let secondary = Scan::new(&timelines.secondary, limits.secondary);
                outcome.posts.extend(self.scan(
                    now,
                    secondary,
                    query,
                    Some(&followed),
                    false,
                    note,
                ));
            }
        }
        finish(&mut outcome, query, note);
        outcome.as_of_secs = now;
        outcome
    }

    /// Reads one timeline newest first and returns its first `limit` survivors, telling
    /// `note` why every other entry is not one. `followed` is `Some(F)` for the secondary
    /// timeline (the reply rule applies); `videos` for the videos timeline (the source rule
    /// applies).
    fn scan(
        &self,
        now: i64,
        scan: Scan<'_>,
        query: &FeedQuery<'_>,
        followed: Option<&BTreeSet<i64>>,
        videos: bool,
        note: &mut dyn FnMut(i64, Verdict),
    ) -> Vec<LightPost> {
        let Scan { timeline, limit } = scan;
        let mut survivors = Vec::new();
        let mut examined = 0;
        let newest_first: Vec<Entry> = timeline.entries.iter().rev().copied().collect();
        for (newer, entry) in newest_first.iter().enumerate() {
            // A reason to stop here holds for this entry and every older one.
            let stop = if survivors.len() >= limit {
                Some(Stop::Limit(limit))
            } else if examined == MAX_TINY_POSTS_PER_USER_SCAN {
                Some(Stop::ScanWindow)
            } else if self.is_expired(now, entry.created_at_secs) {
                Some(Stop::Expired)
            } else if entry.created_at_secs < query.window.lower_bound() {
                Some(Stop::BeforeMinCreatedAt(query.window.lower_bound()))
            } else {
                None
            };
            if let Some(stop) = stop {
                for (newer, older) in newest_first.iter().enumerate().skip(newer) {
                    note(older.post_id, stop.verdict(newer));
                }
                break;
            }
            let upper_bound = query.window.upper_bound(now);
            let skipped = if entry.created_at_secs > upper_bound {
                Some(Verdict::AfterUpperBound { upper_bound })
            } else if query.exclude.contains(&entry.post_id) {
                Some(Verdict::Excluded)
            } else if query.seen.is_some_and(|seen| seen.contains(entry.post_id)) {
                Some(Verdict::Seen)
            } else {
                None
            };
            if let Some(verdict) = skipped {
                note(entry.post_id, verdict);
                continue;
            }
            let post = self.records[&entry.post_id];
            if videos && !post.has_video && !self.source_is_video_now(now, &post) {
                // A repost whose source is no longer a video: as if it were not there.
                note(entry.post_id, Verdict::VideoRule);
                continue;
            }
            examined += 1;
            if post.is_retweet && post.source_user_id == Some(query.viewer_id) {
                note(entry.post_id, Verdict::ViewerOwnRepost);
                continue;
            }
            if let Some(followed) = followed
                && let Err(miss) = self.reply_rule(now, &post, followed)
            {
                note(entry.post_id, Verdict::ReplyRule(miss));
                continue;
            }
            survivors.push(post);
        }
        survivors
    }

    /// True while the source of repost `post` is stored, not expired, `has_video` and not a
    /// reply: the condition for a repost without its own video to be a video.
    fn source_is_video_now(&self, now: i64, post: &LightPost) -> bool {
        post.is_retweet
            && post
                .source_post_id
                .and_then(|id| self.records.get(&id))
                .is_some_and(|s| s.has_video && !s.is_reply && !self.is_expired(now, s.created_at))
    }

    /// The reply visibility rule of the secondary timeline: `Err` says which part `post`
    /// fails.
    fn reply_rule(
        &self,
        now: i64,
        post: &LightPost,
        followed: &BTreeSet<i64>,
    ) -> Result<(), ReplyRuleMiss> {
        let Some(parent_id) = post.in_reply_to_post_id else {
            return Ok(());
        };
        let Some(parent) = self.records.get(&parent_id) else {
            return Err(ReplyRuleMiss::ParentMissing);
        };
        if self.is_expired(now, parent.created_at) {
            return Err(ReplyRuleMiss::ParentExpired);
        }
        if parent.is_original() {
            return Ok(());
        }
        let same_conversation = post
            .conversation_id
            .is_some_and(|c| parent.in_reply_to_post_id.unwrap_or(0) == c);
        if !same_conversation {
            return Err(ReplyRuleMiss::ConversationMismatch);
        }
        if !post
            .in_reply_to_user_id
            .is_some_and(|u| followed.contains(&u))
        {
            return Err(ReplyRuleMiss::ReplyToUnfollowed);
        }
        Ok(())
    }
}

/// One timeline to scan and its per-author limit.
struct Scan<'t> {
    timeline: &'t Timeline,
    limit: usize,
}

impl<'t> Scan<'t> {
    fn new(timeline: &'t Timeline, limit: usize) -> Self {
        Self { timeline, limit }
    }
}

/// Why a scan stops before an entry.
#[derive(Clone, Copy)]
enum Stop {
    /// The per-author limit is reached.
    Limit(usize),
    /// `MAX_TINY_POSTS_PER_USER_SCAN` entries were examined.
    ScanWindow,
    /// The entry is past retention (and so is every older one).
    Expired,
    /// The entry is older than `min_created_at` (and so is every older one).
    BeforeMinCreatedAt(i64),
}

impl Stop {
    /// The verdict on an entry the scan stopped before, `newer_entries` from the newest.
    fn verdict(self, newer_entries: usize) -> Verdict {
        match self {
            Stop::Limit(limit) => Verdict::PerAuthorCap {
                limit,
                newer_entries,
            },
            Stop::ScanWindow => Verdict::ScanWindow { newer_entries },
            Stop::Expired => Verdict::Expired,
            Stop::BeforeMinCreatedAt(min_created_at) => {
                Verdict::BeforeMinCreatedAt { min_created_at }
            }
        }
    }
}

fn dedup_in_order(ids: &[i64]) -> Vec<i64> {
    let mut seen = BTreeSet::new();
    ids.iter().copied().filter(|id| seen.insert(*id)).collect()
}

/// Orders the candidates in the answer order (newest first, then larger id first), keeps
/// those after the page position and truncates to `max_results`, telling `note` where each
/// candidate went.
fn finish(outcome: &mut QueryOutcome, query: &FeedQuery<'_>, note: &mut dyn FnMut(i64, Verdict)) {
    outcome.posts.sort_by(answer_order);
    outcome.posts.retain(|p| {
        let admitted = query.window.admits(p.created_at, p.post_id);
        if !admitted {
            note(p.post_id, Verdict::BeforeCursor);
        }
        admitted
    });
    for (i, post) in outcome.posts.iter().enumerate() {
        let rank = i + 1;
        let verdict = if rank <= query.max_results {
            Verdict::Returned { position: rank }
        } else {
            Verdict::CutByMaxResults { rank }
        };
        note(post.post_id, verdict);
    }
    outcome.posts.truncate(query.max_results);
}

/// Checks that two answers to the same query agree: both at most `max_results` long, in the
/// answer order (newest first, larger id first) without a repeated post id, and equal post for
/// post. The contract leaves no freedom: timelines are in `(created_at, post_id)` order, so
/// even which posts of a tie survive a per-author limit, the scan window or the cut at
/// `max_results` is defined. The error names the first difference.
pub fn answers_agree(a: &[LightPost], b: &[LightPost], max_results: usize) -> Result<(), String> {
    for (name, answer) in [("first", a), ("second", b)] {
        if answer.len() > max_results {
            return Err(format!(
                "{name} answer has {} posts, more than max_results {max_results}",
                answer.len()
            ));
        }
        if let Some(w) = answer
            .windows(2)
            .find(|w| answer_order(&w[0], &w[1]).is_ge())
        {
            return Err(format!(
                "{name} answer is not in the answer order (newest first, larger id first): \
                 {} (at {}) before {} (at {})",
                w[0].post_id, w[0].created_at, w[1].post_id, w[1].created_at
            ));
        }
        let mut ids = BTreeSet::new();
        if let Some(p) = answer.iter().find(|p| !ids.insert(p.post_id)) {
            return Err(format!("{name} answer repeats post {}", p.post_id));
        }
    }
    if let Some(i) = (0..a.len().min(b.len())).find(|&i| a[i] != b[i]) {
        return Err(format!(
            "the answers differ at position {i} of {} / {}: {:?} vs {:?}",
            a.len(),
            b.len(),
            a[i],
            b[i]
        ));
    }
    if a.len() != b.len() {
        let (longer, name) = if a.len() > b.len() {
            (a, "first")
        } else {
            (b, "second")
        };
        return Err(format!(
            "lengths differ: {} vs {}; the {name} goes on with {:?}",
            a.len(),
            b.len(),
            longer[a.len().min(b.len())]
        ));
    }
    Ok(())
}

/// A [`ModelStore`] behind a mutex, so it implements the `&self` [`Store`] contract and runs
/// wherever the engine does (rule tables, benches). Every call takes the lock.
#[derive(Debug)]
pub struct SharedModel(Mutex<ModelStore>);

impl SharedModel {
    /// A shared model store with the engine's configuration (retention, timeline cap, clock).
    pub fn new(config: StoreConfig) -> Self {
        Self(Mutex::new(ModelStore::with_config(config)))
    }

    /// The model store inside.
    pub fn into_inner(self) -> ModelStore {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks the model store (for its inherent methods: `stats`, `record`, `insert_posts_with`).
    pub fn lock(&self) -> MutexGuard<'_, ModelStore> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Store for SharedModel {
    fn name(&self) -> &'static str {
        "model"
    }

    fn insert_posts(&self, posts: &[LightPost]) -> InsertReport {
        self.lock().insert_posts(posts)
    }

    fn mark_as_deleted(&self, deletes: &[DeleteEvent]) -> DeleteReport {
        self.lock().mark_as_deleted(deletes)
    }

    fn trim(&self, shard: usize) -> TrimReport {
        self.lock().trim(shard)
    }

    fn get_all_posts_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        self.lock().get_all_posts_by_users(query)
    }

    fn get_videos_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        self.lock().get_videos_by_users(query)
    }

    fn stored_posts(&self) -> usize {
        self.lock().stats().posts
    }
}

#[cfg(test)]
mod tests {
    //! Model-specific rules. The rules the engine shares are run against the model too, by the
    //! rule table in `engine/tests/store_rules.rs` (through [`SharedModel`]).
    use super::*;
    use thunder_engine::ManualClock;

    const NOW: i64 = 1_700_000_000;
    const RETENTION: i64 = 1000;

    fn store_with(retention_secs: i64, cap: usize) -> (ModelStore, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(NOW));
        let config = StoreConfig {
            retention_secs,
            max_posting_list_size: cap,
            clock: clock.clone(),
        };
        (ModelStore::with_config(config), clock)
    }

    fn store() -> (ModelStore, Arc<ManualClock>) {
        store_with(RETENTION, 5000)
    }

    fn query<'a>(viewer_id: i64, authors: &'a [i64], exclude: &'a [i64]) -> FeedQuery<'a> {
        FeedQuery {
            viewer_id,
            authors,
            exclude,
            seen: None,
            window: thunder_engine::AnswerWindow::ALL,
            max_results: 1200,
            max_originals_per_author: 50,
            max_secondary_per_author: 30,
            deadline: None,
        }
    }

    fn ids(outcome: &QueryOutcome) -> Vec<i64> {
        outcome.posts.iter().map(|p| p.post_id).collect()
    }

    fn all_ids(s: &ModelStore, authors: &[i64]) -> Vec<i64> {
        ids(&s.get_all_posts_by_users(&query(0, authors, &[])))
    }

    fn video_ids(s: &ModelStore, authors: &[i64]) -> Vec<i64> {
        ids(&s.get_videos_by_users(&query(0, authors, &[])))
    }

    fn original(post_id: i64, author_id: i64, created_at: i64) -> LightPost {
        LightPost::original(post_id, author_id, created_at)
    }

    fn video(post_id: i64, author_id: i64, created_at: i64) -> LightPost {
        LightPost {
            has_video: true,
            ..original(post_id, author_id, created_at)
        }
    }

    fn reply(
        post_id: i64,
        author_id: i64,
        created_at: i64,
        parent: (i64, i64),
        conversation_id: i64,
    ) -> LightPost {
        LightPost {
            is_reply: true,
            in_reply_to_post_id: Some(parent.0),
            in_reply_to_user_id: Some(parent.1),
            conversation_id: Some(conversation_id),
            ..original(post_id, author_id, created_at)
        }
    }

    fn repost(post_id: i64, author_id: i64, created_at: i64, source: (i64, i64)) -> LightPost {
        LightPost {
            is_retweet: true,
            source_post_id: Some(source.0),
            source_user_id: Some(source.1),
            ..original(post_id, author_id, created_at)
        }
    }

    fn delete(post_id: i64, deleted_at: i64) -> DeleteEvent {
        DeleteEvent {
            post_id,
            deleted_at,
        }
    }

    // ---- time and retention ----

    #[test]
    fn insert_rejects_created_at_outside_1_to_u32_max_first_and_without_overflow() {
        let (mut s, clock) = store_with(i64::MAX, 5000);
        clock.set(i64::from(u32::MAX) + 10);
        let mut drops = Vec::new();
        let report = s.insert_posts_with(
            &[
                original(1, 7, -1),
                original(2, 7, i64::from(u32::MAX) + 1),
                original(3, 7, i64::MIN),
                original(4, 7, i64::MAX),
                original(5, 7, 0),
                original(6, 7, i64::from(u32::MAX)),
                original(7, 7, 1),
            ],
            |index, reason| drops.push((index, reason)),
        );
        assert_eq!(
            report,
            InsertReport {
                inserted: 2,
                invalid_time: 5,
                ..InsertReport::default()
            }
        );
        assert_eq!(
            drops,
            (0..5)
                .map(|i| (i, DropReason::InvalidTime))
                .collect::<Vec<_>>()
        );
        assert_eq!(all_ids(&s, &[7]), [6, 7]);
    }

    #[test]
    fn drops_are_reported_by_reason_and_batch_index() {
        let (mut s, _) = store();
        s.insert_posts(&[original(1, 7, NOW - 5)]);
        s.mark_as_deleted(&[delete(2, NOW)]);
        let mut drops = Vec::new();
        let report = s.insert_posts_with(
            &[
                original(3, 7, NOW),
                original(2, 7, NOW - 1),
                original(4, 7, NOW + 1),
                original(1, 7, NOW - 7),
                original(5, 7, NOW - RETENTION - 1),
                original(6, 7, 0),
                original(3, 7, NOW - 2),
            ],
            |index, reason| drops.push((index, reason)),
        );
        assert_eq!(
            report,
            InsertReport {
                inserted: 1,
                invalid_time: 1,
                in_future: 1,
                too_old: 1,
                tombstoned: 1,
                duplicate: 2,
                no_slot: 0,
            }
        );
        assert_eq!(report.dropped(), 6);
        // Time checks in batch order, then the rest in created_at order.
        assert_eq!(
            drops,
            [
                (2, DropReason::InFuture),
                (4, DropReason::TooOld),
                (5, DropReason::InvalidTime),
                (3, DropReason::Duplicate),
                (1, DropReason::Tombstoned),
                (0, DropReason::Duplicate),
            ]
        );
        assert_eq!(s.record(3), Some(original(3, 7, NOW - 2)));
    }

    // ---- ids ----

    #[test]
    fn some_zero_ids_read_back_as_none_and_id_zero_is_ordinary() {
        let (mut s, _) = store();
        let post = LightPost {
            post_id: 0,
            author_id: 0,
            created_at: NOW,
            in_reply_to_post_id: Some(0),
            in_reply_to_user_id: Some(0),
            is_retweet: true,
            is_reply: false,
            source_post_id: Some(0),
            source_user_id: Some(0),
            has_video: false,
            conversation_id: Some(0),
        };
        s.insert_posts(&[post, original(-5, -3, NOW)]);
        // viewer 0: `source_user_id` is None, so the self-repost filter does not apply.
        let outcome = s.get_all_posts_by_users(&query(0, &[0, -3], &[]));
        let expected = LightPost {
            post_id: 0,
            author_id: 0,
            created_at: NOW,
            is_retweet: true,
            ..LightPost::default()
        };
        assert_eq!(outcome.posts.len(), 2);
        assert!(outcome.posts.contains(&expected));
        assert!(outcome.posts.contains(&original(-5, -3, NOW)));
    }

    // ---- insert order ----

    #[test]
    fn batch_is_applied_in_stable_created_at_order() {
        let (mut s, _) = store();
        s.insert_posts(&[
            original(1, 7, NOW),
            original(2, 7, NOW - 5),
            original(3, 7, NOW),
        ]);
        // Timeline: 2, 1, 3. Newest first reverses it: 3, 1, 2.
        let mut q = query(0, &[7], &[]);
        q.max_originals_per_author = 1;
        assert_eq!(ids(&s.get_all_posts_by_users(&q)), [3]);
        q.max_originals_per_author = 2;
        assert_eq!(ids(&s.get_all_posts_by_users(&q)), [3, 1]);
    }

    #[test]
    fn timelines_stay_ordered_whatever_the_arrival_order() {
        let (mut s, _) = store();
        s.insert_posts(&[original(3, 7, NOW)]);
        s.insert_posts(&[original(1, 7, NOW - 10)]);
        s.insert_posts(&[original(2, 7, NOW - 5)]);
        s.insert_posts(&[original(4, 7, NOW - 5)]);
        let mut q = query(0, &[7], &[]);
        q.max_originals_per_author = 3;
        // Equal timestamps: the later insert (4) is the newer one.
        assert_eq!(ids(&s.get_all_posts_by_users(&q)), [3, 4, 2]);
    }

    // ---- tombstones and duplicates ----

    #[test]
    fn delete_before_create_drops_the_create_while_the_tombstone_lives() {
        let (mut s, clock) = store();
        s.mark_as_deleted(&[delete(1, NOW - 100)]);
        let report = s.insert_posts(&[original(1, 7, NOW - 50)]);
        assert_eq!(
            report,
            InsertReport {
                tombstoned: 1,
                ..InsertReport::default()
            }
        );
        // The dropped create raised the basis from deleted_at (NOW - 100) to its created_at.
        clock.set(NOW - 50 + RETENTION);
        assert_eq!(s.insert_posts(&[original(1, 7, NOW - 50)]).tombstoned, 1);
        clock.advance(1);
        // Due but not trimmed: it no longer blocks.
        assert_eq!(s.insert_posts(&[original(1, 7, NOW)]).inserted, 1);
        // Without a dropped create the basis stays deleted_at.
        clock.set(NOW);
        s.mark_as_deleted(&[delete(2, NOW - 100)]);
        clock.set(NOW - 100 + RETENTION);
        assert_eq!(s.insert_posts(&[original(2, 7, NOW - 100)]).tombstoned, 1);
        clock.advance(1);
        assert_eq!(s.insert_posts(&[original(2, 7, NOW)]).inserted, 1);
    }

    #[test]
    fn tombstone_basis_is_the_later_of_deleted_at_and_created_at() {
        let (mut s, clock) = store();
        s.insert_posts(&[original(1, 7, NOW)]);
        let report = s.mark_as_deleted(&[delete(1, NOW - 500)]);
        assert_eq!(report.removed, 1);
        assert_eq!(all_ids(&s, &[7]), Vec::<i64>::new());
        clock.set(NOW + RETENTION);
        assert_eq!(s.insert_posts(&[original(1, 7, NOW)]).tombstoned, 1);
        clock.set(NOW + RETENTION + 1);
        assert_eq!(s.insert_posts(&[original(1, 7, NOW + 500)]).inserted, 1);
    }

    #[test]
    fn repeated_delete_keeps_the_larger_basis_and_future_deleted_at_counts_as_now() {
        let (mut s, clock) = store();
        s.mark_as_deleted(&[delete(1, NOW - 300), delete(1, NOW - 200)]);
        s.mark_as_deleted(&[delete(1, NOW - 250)]);
        clock.set(NOW - 200 + RETENTION);
        s.trim_all();
        assert_eq!(s.insert_posts(&[original(1, 7, NOW - 200)]).tombstoned, 1);
        clock.advance(1);
        assert_eq!(s.trim(3).tombstones_expired, 1);
        assert_eq!(s.insert_posts(&[original(1, 7, NOW)]).inserted, 1);
        // A deleted_at in the future (or <= 0) counts as the delete's arrival.
        clock.set(NOW);
        s.mark_as_deleted(&[delete(2, 32_503_680_000), delete(3, 0), delete(4, -5)]);
        clock.set(NOW + RETENTION);
        assert_eq!(s.trim_all().tombstones_expired, 0);
        clock.advance(1);
        assert_eq!(s.trim(0).tombstones_expired, 3);
    }

    #[test]
    fn delete_older_than_retention_still_blocks_its_create_at_arrival() {
        let (mut s, clock) = store();
        // Born due by deleted_at; it lives until its own arrival second at least.
        s.mark_as_deleted(&[delete(1, NOW - 5 * RETENTION)]);
        assert_eq!(s.insert_posts(&[original(1, 7, NOW - 10)]).tombstoned, 1);
        assert_eq!(s.stats().tombstones, 1);
        // The dropped create keeps it as long as that post could live.
        clock.set(NOW - 10 + RETENTION);
        assert_eq!(s.trim(0).tombstones_expired, 0);
        clock.advance(1);
        assert_eq!(s.trim(0).tombstones_expired, 1);
    }

    #[test]
    fn duplicate_create_keeps_the_first_record_unchanged() {
        let (mut s, _) = store();
        s.insert_posts(&[original(1, 7, NOW - 10)]);
        let report = s.insert_posts(&[video(1, 8, NOW), original(1, 7, NOW - 10)]);
        assert_eq!(
            report,
            InsertReport {
                duplicate: 2,
                ..InsertReport::default()
            }
        );
        assert_eq!(
            s.get_all_posts_by_users(&query(0, &[7, 8], &[])).posts,
            [original(1, 7, NOW - 10)]
        );
        assert_eq!(video_ids(&s, &[7, 8]), Vec::<i64>::new());
        // Within one batch too: the older copy is applied first and wins.
        let report = s.insert_posts(&[original(2, 7, NOW), original(2, 8, NOW - 1)]);
        assert_eq!((report.inserted, report.duplicate), (1, 1));
        assert_eq!(s.record(2), Some(original(2, 8, NOW - 1)));
    }

    #[test]
    fn expired_but_untrimmed_record_is_still_stored_for_duplicates() {
        let (mut s, clock) = store();
        s.insert_posts(&[original(1, 7, NOW)]);
        clock.advance(RETENTION + 1);
        assert_eq!(s.insert_posts(&[original(1, 7, NOW + 10)]).duplicate, 1);
        s.trim(2);
        assert_eq!(s.insert_posts(&[original(1, 7, NOW + 10)]).inserted, 1);
        assert_eq!(all_ids(&s, &[7]), [1]);
    }

    #[test]
    fn delete_removes_the_post_from_every_timeline() {
        let (mut s, _) = store();
        s.insert_posts(&[video(1, 7, NOW), video(2, 7, NOW - 1)]);
        assert_eq!(video_ids(&s, &[7]), [1, 2]);
        let report = s.mark_as_deleted(&[delete(1, NOW), delete(99, NOW)]);
        assert_eq!(
            report,
            DeleteReport {
                removed: 1,
                tombstoned: 2
            }
        );
        assert_eq!(all_ids(&s, &[7]), [2]);
        assert_eq!(video_ids(&s, &[7]), [2]);
        assert_eq!(s.stats().posts, 1);
    }

    // ---- video eligibility ----

    #[test]
    fn video_eligibility() {
        let (mut s, _) = store();
        let mut video_reply = reply(3, 7, NOW - 50, (1, 8), 1);
        video_reply.has_video = true;
        let mut video_reply_repost = repost(4, 7, NOW - 40, (1, 8));
        video_reply_repost.is_reply = true;
        video_reply_repost.has_video = true;
        s.insert_posts(&[
            video(1, 8, NOW - 100),
            original(2, 8, NOW - 99),
            video_reply,
            video_reply_repost,
            repost(5, 7, NOW - 30, (1, 8)), // source is a stored video original
            repost(6, 7, NOW - 20, (2, 8)), // source has no video
            repost(7, 7, NOW - 10, (3, 7)), // source is a reply
            LightPost {
                has_video: true,
                ..repost(8, 7, NOW - 5, (2, 8))
            }, // own video
        ]);
        assert_eq!(video_ids(&s, &[7, 8]), [8, 5, 1]);
    }

    #[test]
    fn repost_of_an_expired_source_is_not_a_video() {
        let (mut s, clock) = store();
        s.insert_posts(&[video(1, 8, NOW)]);
        clock.advance(RETENTION + 1);
        s.insert_posts(&[repost(2, 7, NOW + RETENTION, (1, 8))]);
        assert_eq!(video_ids(&s, &[7]), Vec::<i64>::new());
        // The source is stored (untrimmed), so the repost is not remembered either.
        s.mark_as_deleted(&[delete(1, NOW)]);
        clock.advance(1);
        assert_eq!(s.insert_posts(&[video(1, 8, NOW + RETENTION)]).inserted, 1);
        assert_eq!(video_ids(&s, &[7]), Vec::<i64>::new());
    }

    #[test]
    fn repost_before_its_source_joins_the_videos_timeline_at_its_position() {
        let (mut s, _) = store();
        s.insert_posts(&[
            repost(2, 7, NOW - 10, (1, 8)),
            video(3, 7, NOW - 20),
            video(4, 7, NOW),
            repost(5, 7, NOW - 10, (9, 8)), // its source never arrives
        ]);
        assert_eq!(video_ids(&s, &[7]), [4, 3]);
        s.insert_posts(&[video(1, 8, NOW - 30)]);
        assert_eq!(video_ids(&s, &[7]), [4, 2, 3]);
        assert_eq!(video_ids(&s, &[7, 8]), [4, 2, 3, 1]);
    }

    #[test]
    fn remembered_repost_needs_a_video_original_source_and_expires() {
        let (mut s, clock) = store();
        s.insert_posts(&[
            repost(2, 7, NOW - 500, (1, 8)),
            repost(3, 7, NOW - 10, (1, 8)),
        ]);
        s.insert_posts(&[repost(4, 7, NOW - 10, (11, 8))]);
        // A source that is a reply with video, or an original without video, does not trigger.
        let mut video_reply = reply(11, 8, NOW - 5, (1, 8), 1);
        video_reply.has_video = true;
        s.insert_posts(&[video_reply]);
        assert_eq!(video_ids(&s, &[7]), Vec::<i64>::new());
        clock.advance(RETENTION - 499);
        // Repost 2 expired: no longer remembered, whether or not a trim ran.
        s.insert_posts(&[video(1, 8, NOW)]);
        assert_eq!(video_ids(&s, &[7]), [3]);
    }

    #[test]
    fn remembered_repost_that_was_deleted_does_not_join() {
        let (mut s, _) = store();
        s.insert_posts(&[
            repost(2, 7, NOW - 10, (1, 8)),
            repost(3, 7, NOW - 9, (1, 8)),
        ]);
        s.mark_as_deleted(&[delete(2, NOW)]);
        s.insert_posts(&[video(1, 8, NOW - 30)]);
        assert_eq!(video_ids(&s, &[7]), [3]);
    }

    // ---- cap and record lifetime ----

    #[test]
    fn cap_evicts_the_oldest_entry_possibly_the_new_post() {
        let (mut s, _) = store_with(RETENTION, 3);
        s.insert_posts(&[
            original(1, 7, NOW - 3),
            original(2, 7, NOW - 2),
            original(3, 7, NOW - 1),
        ]);
        s.insert_posts(&[original(4, 7, NOW)]);
        assert_eq!(all_ids(&s, &[7]), [4, 3, 2]);
        assert_eq!(s.record(1), None);
        let report = s.insert_posts(&[original(5, 7, NOW - 10)]);
        assert_eq!(report.inserted, 1);
        assert_eq!(all_ids(&s, &[7]), [4, 3, 2]);
        assert_eq!(s.record(5), None);
        // Evicted records are gone: the same id can be stored again.
        assert_eq!(s.insert_posts(&[original(1, 7, NOW)]).inserted, 1);
        // Equal timestamps are answered by descending id.
        assert_eq!(all_ids(&s, &[7]), [4, 1, 3]);
        // Equal timestamps: the earlier insert is the older entry (3 is evicted, not 6).
        s.insert_posts(&[original(6, 7, NOW - 1)]);
        assert_eq!(all_ids(&s, &[7]), [4, 1, 6]);
    }

    #[test]
    fn record_lives_while_any_timeline_holds_it() {
        let (mut s, _) = store_with(RETENTION, 2);
        s.insert_posts(&[video(1, 7, NOW - 10)]);
        s.insert_posts(&[original(2, 7, NOW - 5), original(3, 7, NOW - 4)]);
        // 1 left the originals timeline but is still a video, and still a reply parent.
        assert_eq!(all_ids(&s, &[7]), [3, 2]);
        assert_eq!(video_ids(&s, &[7]), [1]);
        s.insert_posts(&[reply(4, 8, NOW, (1, 7), 1)]);
        assert_eq!(all_ids(&s, &[8]), [4]);
        assert_eq!(s.insert_posts(&[video(1, 9, NOW)]).duplicate, 1);
        // Leaving its last timeline frees it.
        s.insert_posts(&[video(5, 7, NOW - 3), video(6, 7, NOW - 2)]);
        assert_eq!(video_ids(&s, &[7]), [6, 5]);
        assert_eq!(s.record(1), None);
        assert_eq!(all_ids(&s, &[8]), Vec::<i64>::new());
        assert_eq!(s.insert_posts(&[video(1, 9, NOW)]).inserted, 1);
    }

    #[test]
    fn remembered_repost_joining_a_full_videos_timeline_evicts_the_oldest() {
        let (mut s, _) = store_with(RETENTION, 2);
        s.insert_posts(&[repost(2, 7, NOW - 10, (1, 8))]);
        s.insert_posts(&[video(3, 7, NOW - 20), video(4, 7, NOW - 5)]);
        s.insert_posts(&[video(1, 8, NOW - 30)]);
        assert_eq!(video_ids(&s, &[7]), [4, 2]);
        // 3 is still in the originals timeline.
        assert_eq!(all_ids(&s, &[7]), [4, 2, 3]);
    }

    // ---- trim ----

    #[test]
    fn trim_removes_expired_entries_of_one_shard_only() {
        let (mut s, clock) = store();
        s.insert_posts(&[
            video(1, 7, NOW - 10),
            original(2, -3, NOW - 10),
            original(3, 8, NOW - 10),
            original(4, 7, NOW),
        ]);
        clock.advance(RETENTION - 5);
        let before = all_ids(&s, &[7, -3, 8]);
        assert_eq!(before, [4]);
        // 7 and -3 are both in shard 2.
        let report = s.trim(2);
        assert_eq!(
            report,
            TrimReport {
                entries_removed: 3,
                posts_freed: 2,
                tombstones_expired: 0,
                authors_dropped: 1
            }
        );
        assert_eq!(all_ids(&s, &[7, -3, 8]), before);
        assert_eq!(s.record(3).map(|p| p.post_id), Some(3));
        assert_eq!(s.trim(3).posts_freed, 1);
        assert_eq!(s.stats().authors, 1);
    }

    #[test]
    fn every_trim_expires_all_due_tombstones() {
        let (mut s, clock) = store();
        s.mark_as_deleted(&[delete(1, NOW), delete(2, NOW + 5), delete(3, NOW - 5)]);
        clock.advance(5);
        s.mark_as_deleted(&[delete(4, NOW + 5)]);
        clock.set(NOW + RETENTION + 1);
        let report = s.trim(0);
        assert_eq!(report.tombstones_expired, 3);
        assert_eq!(s.stats().tombstones, 1);
    }

    #[test]
    fn a_load_forgets_the_due_tombstones_a_trim_would_have_expired() {
        let (mut s, clock) = store();
        s.mark_as_deleted(&[delete(1, NOW), delete(2, NOW + 5), delete(3, NOW - 5)]);
        clock.advance(5);
        s.mark_as_deleted(&[delete(4, NOW + 5)]);
        clock.set(NOW + RETENTION + 1);
        s.forget_expired_as_a_load_does();
        assert_eq!(s.stats().tombstones, 1);
        assert_eq!(s.trim(0).tombstones_expired, 0);
    }

    // ---- queries ----

    #[test]
    fn scan_window_is_500_entries() {
        let (mut s, _) = store();
        // The newest 500 are reposts of viewer 1's post: filtered for that viewer, but they
        // use up the window.
        let posts: Vec<_> = (0..600)
            .map(|i| repost(i, 7, NOW - 600 + i, (5000, if i < 100 { 2 } else { 1 })))
            .collect();
        s.insert_posts(&posts);
        let q = query(1, &[7], &[]);
        assert_eq!(ids(&s.get_all_posts_by_users(&q)), Vec::<i64>::new());
        let q = query(3, &[7], &[]);
        assert_eq!(s.get_all_posts_by_users(&q).posts.len(), 30);
        // Excluding one of them lets one more entry in.
        let q = query(1, &[7], &[550]);
        assert_eq!(ids(&s.get_all_posts_by_users(&q)), [99]);
    }

    #[test]
    fn per_author_limits_are_clamped() {
        let (mut s, _) = store();
        let mut posts: Vec<_> = (0..200).map(|i| original(i, 7, NOW - 1000 + i)).collect();
        posts.extend((200..400).map(|i| repost(i, 7, NOW - 1000 + i, (i + 1000, 8))));
        posts.extend((400..600).map(|i| video(i, 9, NOW - 1000 + i)));
        s.insert_posts(&posts);
        let mut q = query(0, &[7], &[]);
        q.max_originals_per_author = 1000;
        q.max_secondary_per_author = 1000;
        let got = s.get_all_posts_by_users(&q).posts;
        assert_eq!(got.iter().filter(|p| p.is_original()).count(), 50);
        assert_eq!(got.iter().filter(|p| !p.is_original()).count(), 30);
        q.max_originals_per_author = 3;
        q.max_secondary_per_author = 2;
        assert_eq!(
            ids(&s.get_all_posts_by_users(&q)),
            [399, 398, 199, 198, 197]
        );
        q.max_secondary_per_author = 0;
        assert_eq!(ids(&s.get_all_posts_by_users(&q)), [199, 198, 197]);
        q.authors = &[9];
        assert_eq!(s.get_videos_by_users(&q).posts.len(), 100);
    }

    #[test]
    fn self_repost_filter_applies_to_every_timeline() {
        let (mut s, _) = store();
        s.insert_posts(&[
            video(1, 1, NOW - 10),
            repost(2, 7, NOW, (1, 1)),
            repost(3, 7, NOW, (1, 2)),
        ]);
        assert_eq!(ids(&s.get_all_posts_by_users(&query(1, &[7], &[]))), [3]);
        assert_eq!(ids(&s.get_videos_by_users(&query(1, &[7], &[]))), [3]);
        assert_eq!(ids(&s.get_videos_by_users(&query(2, &[7], &[]))), [2]);
    }

    #[test]
    fn reply_rule_needs_a_stored_unexpired_parent() {
        let (mut s, clock) = store();
        s.insert_posts(&[original(1, 10, NOW - 100), reply(2, 7, NOW, (1, 10), 1)]);
        s.insert_posts(&[reply(3, 7, NOW, (50, 10), 50)]);
        let mut no_parent = reply(4, 7, NOW, (0, 10), 1);
        no_parent.in_reply_to_post_id = None;
        s.insert_posts(&[no_parent]);
        // Equal timestamps: the later insert is the newer one.
        assert_eq!(ids(&s.get_all_posts_by_users(&query(0, &[7], &[]))), [4, 2]);
        clock.advance(RETENTION - 99);
        assert_eq!(ids(&s.get_all_posts_by_users(&query(0, &[7], &[]))), [4]);
        clock.set(NOW);
        s.mark_as_deleted(&[delete(1, NOW)]);
        assert_eq!(ids(&s.get_all_posts_by_users(&query(0, &[7], &[]))), [4]);
    }

    #[test]
    fn reply_rule_reply_to_a_reply_needs_conversation_match_and_followed_user() {
        let (mut s, _) = store();
        s.insert_posts(&[
            reply(1, 2, NOW - 10, (100, 9), 100), // parent reply, replied to the root
            reply(2, 7, NOW - 5, (1, 2), 100),    // kept when 2 is followed
            reply(3, 7, NOW - 4, (1, 2), 101),    // wrong conversation
        ]);
        let mut no_user = reply(4, 7, NOW - 3, (1, 2), 100);
        no_user.in_reply_to_user_id = Some(0); // reads as None: never followed
        let mut no_conversation = reply(5, 7, NOW - 2, (1, 2), 100);
        no_conversation.conversation_id = None;
        s.insert_posts(&[no_user, no_conversation]);
        // 1 itself is dropped: its parent 100 is not stored.
        assert_eq!(
            ids(&s.get_all_posts_by_users(&query(0, &[7, 2, 0], &[]))),
            [2]
        );
        assert_eq!(
            ids(&s.get_all_posts_by_users(&query(0, &[7], &[]))),
            Vec::<i64>::new()
        );
        // The rule does not apply to the originals or videos timelines.
        let mut video_reply_to_nothing = reply(6, 7, NOW, (555, 2), 555);
        video_reply_to_nothing.is_reply = false;
        video_reply_to_nothing.has_video = true;
        s.insert_posts(&[video_reply_to_nothing]);
        assert_eq!(ids(&s.get_all_posts_by_users(&query(0, &[7], &[]))), [6]);
        assert_eq!(ids(&s.get_videos_by_users(&query(0, &[7], &[]))), [6]);
    }

    // ---- answers_agree ----

    #[test]
    fn answers_agree_leaves_ties_no_freedom() {
        let a = [
            original(1, 7, 10),
            original(4, 7, 9),
            original(3, 7, 9),
            original(2, 7, 9),
        ];
        assert_eq!(answers_agree(&a, &a, 4), Ok(()));
        assert_eq!(answers_agree(&a, &a, 10), Ok(()));
        // Ties are ordered by descending post id; any other order is refused.
        let b = [
            original(1, 7, 10),
            original(2, 7, 9),
            original(3, 7, 9),
            original(4, 7, 9),
        ];
        assert!(answers_agree(&a, &b, 10).is_err());
        // Cut at 3 inside the tie at 9: only the two largest ids of it.
        let c = [original(1, 7, 10), original(4, 7, 9), original(2, 7, 9)];
        assert!(answers_agree(&a[..3], &c, 3).is_err());
        assert_eq!(answers_agree(&a[..3], &a[..3], 3), Ok(()));
        assert_eq!(answers_agree(&[], &[], 0), Ok(()));
    }

    #[test]
    fn answers_agree_catches_real_differences() {
        let a = [original(1, 7, 10), original(2, 7, 9), original(3, 7, 8)];
        let other_record = [original(1, 8, 10), original(2, 7, 9), original(3, 7, 8)];
        let other_post = [original(1, 7, 10), original(2, 7, 9), original(5, 7, 8)];
        let unordered = [original(2, 7, 9), original(1, 7, 10), original(3, 7, 8)];
        let other_cut = [original(1, 7, 10), original(2, 7, 9), original(3, 7, 7)];
        let repeated = [original(1, 7, 10), original(1, 7, 10), original(3, 7, 8)];
        for max_results in [3, 4] {
            assert!(answers_agree(&a, &other_record, max_results).is_err());
            assert!(answers_agree(&a, &unordered, max_results).is_err());
            assert!(answers_agree(&a, &other_cut, max_results).is_err());
            assert!(answers_agree(&a, &repeated, max_results).is_err());
            assert!(answers_agree(&a, &a[..2], max_results).is_err());
        }
        // Not cut: the oldest post must match too.
        assert!(answers_agree(&a, &other_post, 4).is_err());
        // Cut at 8 with a different post there on each side: a difference too.
        assert!(answers_agree(&a, &other_post, 3).is_err());
        assert!(answers_agree(&a, &a, 2).is_err());
    }
}
