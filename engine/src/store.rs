//! [`PostStore`]: insert, delete and trim, following the reference rules (see `BEHAVIOUR.md`).
//! The read path and its types (`FeedQuery`, `QueryOutcome`) live in `query.rs`.
//!
//! Concurrency: any number of threads may call any method at once. Readers (queries) take no
//! lock. Writers serialise per author only (the author's mutex guards its three timelines) and,
//! briefly, per index stripe; the post and author indexes (`index.rs`, `authors.rs`) never make
//! a reader wait, the small maps are lock-free (papaya) and the arena is lock-free.
//!
//! Two orderings keep concurrent inserts and deletes honest (bug 20 of the reference):
//! - insert publishes `post_id -> slot`, then (after a SeqCst fence) re-checks the tombstones;
//! - delete writes the tombstone, then (after a SeqCst fence) removes `post_id -> slot`.
//!
//! Whichever runs second sees the other's write, so a create racing its delete is either
//! removed by the delete or undone by itself: it is never left live.

use crate::arena::{Arena, CompactPost, IN_PRIMARY, IN_VIDEO, Release, SlotId};
pub(crate) use crate::authors::Author;
use crate::authors::AuthorIndex;
use crate::clock::{Clock, SystemClock};
use crate::config::{DEFAULT_RETENTION_SECS, MAX_POSTING_LIST_SIZE, TRIM_FRACTION};
use crate::counter::StripedCount;
use crate::index::TagIndex;
use crate::post::{DeleteEvent, LightPost};
use crate::prefetch::prefetch;
use crate::timeline::{MAX_CAPACITY, TinyPost};
use crate::tombstone_filter::TombstoneFilter;
use crossbeam_epoch::Guard;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, PoisonError};

pub(crate) type IdHasher = foldhash::fast::RandomState;

/// How many posts ahead `insert_posts` prefetches index buckets; author records, timeline
/// headers and newest cells follow at 2/3, 1/3 and 1/6 of that distance.
const INGEST_LOOKAHEAD: usize = 12;

/// Posts the post index holds before its first growth.
const POST_INDEX_INITIAL_CAPACITY: usize = 4096;

/// The source an insert of `post` looks up (a repost without its own video, not a reply):
/// the insert asks whether that source is a video.
#[inline]
fn looks_up_source(post: &LightPost) -> Option<i64> {
    let source = post.source_post_id.unwrap_or(0);
    (post.is_retweet && !post.is_reply && !post.has_video && source != 0).then_some(source)
}

/// Retired entries of the small maps a thread gathers before it tries to reclaim them
/// (seize's batch size; its default is 32). Each attempt issues a `membarrier` system call,
/// which interrupts every other core running a thread of the process; with the default, the
/// tombstone updates of a delete-heavy load made one every 32 deletes, 2.7% of two writers'
/// samples at scale 10. A batch holds at most this many small entries (or a replaced table)
/// per thread a little longer.
const RETIRE_BATCH: usize = 1024;

pub(crate) type IdMap<V> = papaya::HashMap<i64, V, IdHasher>;

/// How a store is set up.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Posts older than this many seconds are expired (never returned, trimmed away).
    pub retention_secs: i64,
    /// Entries per timeline before the oldest is evicted; 1 ..= 16384.
    pub max_posting_list_size: usize,
    /// Where "now" comes from.
    pub clock: Arc<dyn Clock>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            retention_secs: DEFAULT_RETENTION_SECS,
            max_posting_list_size: MAX_POSTING_LIST_SIZE,
            clock: Arc::new(SystemClock),
        }
    }
}

/// What `insert_posts` did with a batch: every post is counted exactly once, as inserted or
/// under the [`DropReason`] it was dropped for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertReport {
    /// Posts stored and indexed.
    pub inserted: usize,
    /// Dropped: `created_at <= 0` or `created_at > u32::MAX` (checked first).
    pub invalid_time: usize,
    /// Dropped: `created_at` after now.
    pub in_future: usize,
    /// Dropped: older than the retention window.
    pub too_old: usize,
    /// Dropped: the post was deleted before (live tombstone).
    pub tombstoned: usize,
    /// Dropped: the post is already stored (the stored record is kept unchanged).
    pub duplicate: usize,
    /// Dropped: no arena slot could be had (every slot id of the post's class in use, or the
    /// system refused the memory for a new chunk).
    pub no_slot: usize,
}

impl InsertReport {
    /// Posts dropped for `reason`.
    pub fn dropped_for(&self, reason: DropReason) -> usize {
        match reason {
            DropReason::InvalidTime => self.invalid_time,
            DropReason::InFuture => self.in_future,
            DropReason::TooOld => self.too_old,
            DropReason::Tombstoned => self.tombstoned,
            DropReason::Duplicate => self.duplicate,
            DropReason::NoSlot => self.no_slot,
        }
    }

    /// Posts dropped, all reasons together.
    pub fn dropped(&self) -> usize {
        DropReason::ALL.iter().map(|&r| self.dropped_for(r)).sum()
    }

    /// Counts one post dropped for `reason`.
    pub(crate) fn count_drop(&mut self, reason: DropReason) {
        *match reason {
            DropReason::InvalidTime => &mut self.invalid_time,
            DropReason::InFuture => &mut self.in_future,
            DropReason::TooOld => &mut self.too_old,
            DropReason::Tombstoned => &mut self.tombstoned,
            DropReason::Duplicate => &mut self.duplicate,
            DropReason::NoSlot => &mut self.no_slot,
        } += 1;
    }
}

/// Why `insert_posts` dropped a post (see `BEHAVIOUR.md`, `insert_posts`). The time checks
/// run in the order `InvalidTime`, `InFuture`, `TooOld`, before anything is looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// `created_at` is older than the retention window.
    TooOld,
    /// `created_at` is after now.
    InFuture,
    /// `created_at <= 0` or `created_at > u32::MAX`.
    InvalidTime,
    /// The post id has a live tombstone (it was deleted).
    Tombstoned,
    /// The post id is already stored; the stored record is kept.
    Duplicate,
    /// No arena slot could be had: every slot id of the post's class is in use, or the system
    /// refused the memory for a new chunk. Nothing was stored.
    NoSlot,
}

impl DropReason {
    /// Every reason, for registering one metric per reason.
    pub const ALL: [DropReason; 6] = [
        DropReason::TooOld,
        DropReason::InFuture,
        DropReason::InvalidTime,
        DropReason::Tombstoned,
        DropReason::Duplicate,
        DropReason::NoSlot,
    ];

    /// A snake_case label for metrics and logs: `too_old`, `in_future`, `invalid_time`,
    /// `tombstoned`, `duplicate`, `no_slot`.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::TooOld => "too_old",
            DropReason::InFuture => "in_future",
            DropReason::InvalidTime => "invalid_time",
            DropReason::Tombstoned => "tombstoned",
            DropReason::Duplicate => "duplicate",
            DropReason::NoSlot => "no_slot",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `mark_as_deleted` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeleteReport {
    /// Stored posts removed.
    pub removed: usize,
    /// Tombstones written or refreshed (one per event).
    pub tombstoned: usize,
}

/// What a trim removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrimReport {
    /// Timeline entries removed (all three timelines).
    pub entries_removed: usize,
    /// Post records freed back to the arena.
    pub posts_freed: usize,
    /// Tombstones that expired.
    pub tombstones_expired: usize,
    /// Authors dropped because all their timelines became empty.
    pub authors_dropped: usize,
}

impl std::ops::AddAssign for TrimReport {
    fn add_assign(&mut self, r: Self) {
        self.entries_removed += r.entries_removed;
        self.posts_freed += r.posts_freed;
        self.tombstones_expired += r.tombstones_expired;
        self.authors_dropped += r.authors_dropped;
    }
}

impl std::iter::Sum for TrimReport {
    fn sum<I: Iterator<Item = Self>>(reports: I) -> Self {
        reports.fold(Self::default(), |mut total, r| {
            total += r;
            total
        })
    }
}

/// Sizes, for metrics. Cheap except `timeline_bytes`, which walks every author.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Authors with at least one timeline.
    pub authors: usize,
    /// Stored post records.
    pub posts: usize,
    /// Entries in originals timelines.
    pub original_entries: usize,
    /// Entries in secondary (replies + reposts) timelines.
    pub secondary_entries: usize,
    /// Entries in videos timelines.
    pub video_entries: usize,
    /// Live tombstones (deleted post ids remembered).
    pub tombstones: usize,
    /// Bytes of arena chunks allocated for post records.
    pub arena_bytes_reserved: usize,
    /// Bytes of arena slots holding live posts.
    pub arena_bytes_used: usize,
    /// Bytes of timeline ring buffers.
    pub timeline_bytes: usize,
    /// Bytes of the post and author indexes: their tables and the author records.
    pub index_bytes: usize,
}

/// Which of an author's timelines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Originals = 0,
    Secondary = 1,
    Videos = 2,
}

impl Kind {
    pub(crate) fn primary_of(post: &CompactPost) -> Self {
        if post.is_original() {
            Kind::Originals
        } else {
            Kind::Secondary
        }
    }

    fn holder(self) -> u32 {
        if self == Kind::Videos {
            IN_VIDEO
        } else {
            IN_PRIMARY
        }
    }
}

/// A repost remembered until its source arrives (bug 13 of the reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingRepost {
    pub(crate) post_id: i64,
    pub(crate) author_id: i64,
    pub(crate) created_at: u32,
}

/// What `insert_one` did with a post that passed the time checks.
enum Applied {
    Inserted,
    Dropped(DropReason),
}

/// The post store.
#[derive(Debug)]
pub struct PostStore {
    pub(crate) retention_secs: i64,
    pub(crate) cap: usize,
    clock: Arc<dyn Clock>,
    pub(crate) arena: Arena,
    /// `post_id -> slot`; the slot's record verifies a hit.
    pub(crate) posts: TagIndex,
    pub(crate) authors: AuthorIndex,
    pub(crate) tombstones: IdMap<i64>,
    /// A one-sided filter in front of `tombstones`: a clear bit among a post id's two bits
    /// proves "no tombstone", so the common insert (never deleted) skips the map probe. Bits
    /// are set after the tombstone is written; trim renews the filter from the map once stale
    /// bits pile up (`tombstone_filter.rs`).
    pub(crate) tombstone_filter: TombstoneFilter,
    pub(crate) pending_videos: IdMap<Vec<PendingRepost>>,
    pub(crate) entries: [StripedCount; 3],
    /// On an author shard: the facts of other authors' posts (`directory.rs`).
    pub(crate) directory: Option<crate::directory::FactDirectory>,
}

/// The guards one insert/delete/trim call holds while it runs.
pub(crate) struct Guards<'s> {
    pub(crate) now: i64,
    pub(crate) epoch: Guard,
    pub(crate) maps: papaya::LocalGuard<'s>,
}

impl PostStore {
    /// A store with the default config and the given retention, on the system clock.
    pub fn new(retention_secs: i64) -> Self {
        Self::with_config(StoreConfig {
            retention_secs,
            ..StoreConfig::default()
        })
    }

    /// A store with the given retention and clock.
    pub fn with_clock(retention_secs: i64, clock: Arc<dyn Clock>) -> Self {
        Self::with_config(StoreConfig {
            retention_secs,
            clock,
            ..StoreConfig::default()
        })
    }

    /// A store from a full config. `max_posting_list_size` is clamped to 1 ..= 16384.
    pub fn with_config(config: StoreConfig) -> Self {
        // One collector for every map, so one guard covers them all.
        let collector = Arc::new(seize::Collector::new().batch_size(RETIRE_BATCH));
        fn map<V: Send + 'static>(collector: &Arc<seize::Collector>) -> IdMap<V> {
            papaya::HashMap::builder()
                .hasher(IdHasher::default())
                .shared_collector(Arc::clone(collector))
                .build()
        }
        Self {
            retention_secs: config.retention_secs.max(0),
            cap: config.max_posting_list_size.clamp(1, MAX_CAPACITY),
            clock: config.clock,
            arena: Arena::new(),
            posts: TagIndex::with_capacity(POST_INDEX_INITIAL_CAPACITY),
            authors: AuthorIndex::new(),
            tombstones: map(&collector),
            tombstone_filter: TombstoneFilter::new(),
            pending_videos: map(&collector),
            entries: Default::default(),
            directory: None,
        }
    }

    /// The retention window in seconds.
    pub fn retention_secs(&self) -> i64 {
        self.retention_secs
    }

    /// The store clock's current time.
    pub fn now_secs(&self) -> i64 {
        self.clock.now_secs()
    }

    pub(crate) fn expired(&self, created_at: u32, now: i64) -> bool {
        now - i64::from(created_at) > self.retention_secs
    }

    /// Pins both reclaimers for one call. Pin the epoch first so it is released last.
    pub(crate) fn guards(&self) -> Guards<'_> {
        Guards {
            now: self.clock.now_secs(),
            epoch: crossbeam_epoch::pin(),
            maps: self.tombstones.guard(),
        }
    }

    /// The live record of `post_id`, if stored.
    #[inline]
    pub(crate) fn lookup(&self, post_id: i64, epoch: &Guard) -> Option<CompactPost> {
        self.lookup_with_slot(post_id, epoch)
            .map(|(_, record)| record)
    }

    /// The live record of `post_id`, if stored, looked up under the post's index stripe lock.
    fn lookup_locked(&self, post_id: i64, epoch: &Guard) -> Option<CompactPost> {
        self.posts
            .get_locked(self.posts.hash(post_id), epoch, |slot| {
                self.arena.read(slot, post_id)
            })
    }

    /// The slot and live record of `post_id`, if stored.
    #[inline]
    fn lookup_with_slot(&self, post_id: i64, epoch: &Guard) -> Option<(SlotId, CompactPost)> {
        self.posts.get(self.posts.hash(post_id), epoch, |slot| {
            self.arena.read(slot, post_id).map(|record| (slot, record))
        })
    }

    /// Runs `f` on the author's timelines under the author's writer lock. With `create`, a
    /// missing author is added; without, a missing author means `None`.
    fn with_author<R>(
        &self,
        author_id: i64,
        create: bool,
        g: &Guards<'_>,
        f: impl FnOnce(&Author) -> R,
    ) -> Option<R> {
        self.with_author_from(None, author_id, create, g, f)
    }

    /// [`with_author`](Self::with_author), trying `candidate` (a record found earlier, perhaps
    /// reused for another author since) before the lookup. Records are never freed while the
    /// store lives, so a stale candidate is only a wrong one, and the checks under its lock
    /// reject it.
    fn with_author_from<R>(
        &self,
        candidate: Option<&Author>,
        author_id: i64,
        create: bool,
        g: &Guards<'_>,
        f: impl FnOnce(&Author) -> R,
    ) -> Option<R> {
        if let Some(author) = candidate
            && author.author_id() == author_id
        {
            let removed = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
            if !*removed && author.author_id() == author_id {
                return Some(f(author));
            }
        }
        loop {
            // A plain lookup first: most writes go to an existing author, and papaya's
            // insert path is much heavier than its read path.
            let author = match self.authors.get(author_id, &g.epoch) {
                Some(author) => author,
                None if create => self.authors.get_or_create(author_id, &g.epoch)?,
                None => return None,
            };
            let removed = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
            if *removed || author.author_id() != author_id {
                // Dropped by a trim after we found it; the map no longer holds it.
                continue;
            }
            return Some(f(author));
        }
    }

    /// Drops a timeline's hold on an entry; frees the record if that was the last hold.
    fn release(
        &self,
        entry: TinyPost,
        kind: Kind,
        g: &Guards<'_>,
        retired: &mut Vec<SlotId>,
    ) -> bool {
        if self.arena.release(entry.slot, entry.post_id, kind.holder()) != Release::Freed {
            return false;
        }
        self.posts
            .remove_exact(self.posts.hash(entry.post_id), entry.slot, &g.epoch);
        retired.push(entry.slot);
        true
    }

    /// Inserts `entry` into one timeline, handling a cap eviction.
    fn index(
        &self,
        author: &Author,
        kind: Kind,
        entry: TinyPost,
        g: &Guards<'_>,
        retired: &mut Vec<SlotId>,
    ) {
        match author.timelines[kind as usize].insert(entry, self.cap, &g.epoch) {
            Some(evicted) => {
                self.release(evicted, kind, g, retired);
            }
            None => {
                self.entries[kind as usize].add(1);
            }
        }
    }

    /// Stores a batch of new posts. See `BEHAVIOUR.md` for the exact rules.
    pub fn insert_posts(&self, batch: &[LightPost]) -> InsertReport {
        self.insert_posts_with(batch, |_, _| {})
    }

    /// [`insert_posts`](Self::insert_posts), calling `on_drop(index in batch, reason)` for
    /// every post it drops (time checks in batch order first, then the others in the order the
    /// batch is applied).
    pub fn insert_posts_with(
        &self,
        batch: &[LightPost],
        mut on_drop: impl FnMut(usize, DropReason),
    ) -> InsertReport {
        let mut report = InsertReport::default();
        let g = self.guards();
        // Keys pack `created_at` above the index, so sorting them is a stable sort by time.
        // Batches longer than `u32::MAX` (never in practice) are applied in such chunks.
        const CHUNK: usize = u32::MAX as usize;
        let mut retired = Vec::new();
        for (c, chunk) in batch.chunks(CHUNK).enumerate() {
            let base = c * CHUNK;
            let mut kept: Vec<u64> = Vec::with_capacity(chunk.len());
            for (i, post) in chunk.iter().enumerate() {
                match self.time_check(post.created_at, g.now) {
                    None => kept.push(((post.created_at as u64) << 32) | i as u64),
                    Some(reason) => {
                        report.count_drop(reason);
                        on_drop(base + i, reason);
                    }
                }
            }
            kept.sort_unstable();
            let post_at = |k: usize| {
                kept.get(k)
                    .map(|key| &chunk[(key & u64::from(u32::MAX)) as usize])
            };
            // The author record candidate of each post from the author step on (unverified:
            // whoever uses one checks its id first), so the later steps and the insert itself
            // do not look the author up again. Indexed by position modulo the lookahead.
            let mut candidates: [Option<&Author>; INGEST_LOOKAHEAD] = [None; INGEST_LOOKAHEAD];
            for (k, key) in kept.iter().enumerate() {
                let i = (key & u64::from(u32::MAX)) as usize;
                // Overlap the next posts' cache misses with this one's work: their index
                // buckets (and tombstone filter word) first, their author records once those
                // buckets had time to arrive.
                if let Some(ahead) = post_at(k + INGEST_LOOKAHEAD) {
                    self.prefetch_buckets(ahead, &g.epoch);
                }
                let at = k + INGEST_LOOKAHEAD * 2 / 3;
                if let Some(ahead) = post_at(at) {
                    candidates[at % INGEST_LOOKAHEAD] = self.prefetch_author(ahead, &g.epoch);
                }
                // The timeline header first, its newest cell once the header is in.
                for (distance, newest) in
                    [(INGEST_LOOKAHEAD / 3, false), (INGEST_LOOKAHEAD / 6, true)]
                {
                    let at = k + distance;
                    if let Some(ahead) = post_at(at) {
                        let candidate = candidates[at % INGEST_LOOKAHEAD];
                        self.prefetch_timeline(ahead, candidate, newest, &g.epoch);
                    }
                }
                // Posts near the start of a batch never passed the author step.
                let candidate = if k >= INGEST_LOOKAHEAD * 2 / 3 {
                    candidates[k % INGEST_LOOKAHEAD]
                } else {
                    None
                };
                let applied = if self.is_foreign(&chunk[i]) {
                    self.insert_fact(&chunk[i], &g)
                        .map_or(Applied::Inserted, Applied::Dropped)
                } else {
                    self.insert_one(&chunk[i], candidate, &g, &mut retired)
                };
                match applied {
                    Applied::Inserted => report.inserted += 1,
                    Applied::Dropped(reason) => {
                        report.count_drop(reason);
                        on_drop(base + i, reason);
                    }
                }
            }
        }
        self.arena.retire(retired, &g.epoch);
        report
    }

    /// Prefetches the post index bucket, the author index bucket and the tombstone filter
    /// word an insert of `post` will read, and the bucket of the source it looks up.
    #[inline]
    fn prefetch_buckets(&self, post: &LightPost, epoch: &Guard) {
        prefetch(self.posts.bucket_ptr(self.posts.hash(post.post_id), epoch));
        if let Some(source) = looks_up_source(post) {
            prefetch(self.posts.bucket_ptr(self.posts.hash(source), epoch));
        }
        let author = self.authors.hash(post.author_id);
        prefetch(self.authors.bucket_ptr(author, epoch));
        prefetch(self.tombstone_filter.word_ptr(post.post_id, epoch));
    }

    /// Prefetches the record line of `post`'s author (its candidate in the author index) and,
    /// for a repost whose insert looks up its source, the source's record (its candidate in the
    /// post index). Returns the author candidate, not yet verified (its line is on the way).
    #[inline]
    fn prefetch_author(&self, post: &LightPost, epoch: &Guard) -> Option<&Author> {
        // The repost's source record too: its bucket was prefetched with the post's.
        if let Some(source) = looks_up_source(post)
            && let Some(slot) = self.posts.probe(self.posts.hash(source), epoch)
        {
            prefetch(self.arena.slot_ptr(slot));
        }
        let author_id = post.author_id;
        let hashed = self.authors.hash(author_id);
        let author = self
            .authors
            .probe(hashed, epoch)
            .and_then(|n| self.authors.record(n))?;
        prefetch((author as *const Author).cast());
        Some(author)
    }

    /// Prefetches the header (`!newest`) or the newest cell (`newest`) of the timeline an
    /// insert of `post` appends to. `candidate`: the author record found earlier, used when it
    /// still is `post`'s author.
    #[inline]
    fn prefetch_timeline(
        &self,
        post: &LightPost,
        candidate: Option<&Author>,
        newest: bool,
        epoch: &Guard,
    ) {
        let author = match candidate {
            Some(author) if author.author_id() == post.author_id => author,
            _ => match self.authors.get(post.author_id, epoch) {
                Some(author) => author,
                None => return,
            },
        };
        let kind = if post.is_reply || post.is_retweet {
            Kind::Secondary
        } else {
            Kind::Originals
        };
        let timeline = &author.timelines[kind as usize];
        prefetch(if newest {
            timeline.newest_cell_ptr(epoch)
        } else {
            timeline.buffer_ptr(epoch)
        });
    }

    /// Why a post created at `created_at` is not kept at `now`, if it is not.
    #[inline]
    fn time_check(&self, created_at: i64, now: i64) -> Option<DropReason> {
        if created_at <= 0 || created_at > i64::from(u32::MAX) {
            Some(DropReason::InvalidTime)
        } else if created_at > now {
            Some(DropReason::InFuture)
        } else if now - created_at > self.retention_secs {
            // No overflow: 0 < created_at <= now.
            Some(DropReason::TooOld)
        } else {
            None
        }
    }

    fn insert_one(
        &self,
        post: &LightPost,
        candidate: Option<&Author>,
        g: &Guards<'_>,
        retired: &mut Vec<SlotId>,
    ) -> Applied {
        let post_id = post.post_id;
        if let Some(basis) = self.live_tombstone(post_id, g) {
            self.tombstone_dropped_create(post_id, basis, post.created_at, g);
            return Applied::Dropped(DropReason::Tombstoned);
        }
        // No separate duplicate probe: `try_insert` below finds duplicates (a rare case that
        // then costs an unshared slot round trip) while the common new post pays one probe.
        let record = CompactPost::from_light(post);
        let mut video = false;
        let mut awaited_source = None;
        if !record.is_reply {
            if record.has_video {
                video = true;
            } else if record.is_retweet && record.source_post_id != 0 {
                match self.lookup(record.source_post_id, &g.epoch) {
                    Some(source) => video = self.is_video_source(&source, g.now),
                    // A shard cannot see every source: the query-time videos rule decides.
                    None if self.directory.is_some() => video = true,
                    None => awaited_source = Some(record.source_post_id),
                }
            }
        }
        let holders = IN_PRIMARY | if video { IN_VIDEO } else { 0 };
        let Some(slot) = self.arena.publish(&record, holders) else {
            // Only when every u32 slot id is in use or memory is exhausted.
            return Applied::Dropped(DropReason::NoSlot);
        };
        let hashed = self.posts.hash(post_id);
        let is_stored = |s: SlotId| self.arena.read(s, post_id).is_some();
        if self
            .posts
            .insert_with(hashed, &g.epoch, is_stored, || Some(slot))
            .is_err()
        {
            // A concurrent insert of the same post won.
            self.arena.unpublish_unshared(slot, post_id);
            return Applied::Dropped(DropReason::Duplicate);
        }
        // Pairs with the fence in `mark_as_deleted` (store-load: publish, then check).
        fence(Ordering::SeqCst);
        if let Some(basis) = self.live_tombstone(post_id, g) {
            self.posts.remove_exact(hashed, slot, &g.epoch);
            if self.arena.free(slot, post_id) {
                retired.push(slot);
            }
            self.tombstone_dropped_create(post_id, basis, post.created_at, g);
            return Applied::Dropped(DropReason::Tombstoned);
        }
        let entry = TinyPost {
            post_id,
            created_at: record.created_at,
            slot,
        };
        let kind = Kind::primary_of(&record);
        self.with_author_from(candidate, record.author_id, true, g, |author| {
            // A delete that won the race already removed the record: index nothing then. The
            // delete removes timeline entries under this same lock, so no entry can outlive it.
            if self.arena.read(slot, post_id).is_none() {
                return;
            }
            self.index(author, kind, entry, g, retired);
            if video {
                self.index(author, Kind::Videos, entry, g, retired);
            }
        });
        if let Some(source) = awaited_source {
            let repost = PendingRepost {
                post_id,
                author_id: record.author_id,
                created_at: record.created_at,
            };
            self.await_source(source, repost, g, retired);
        }
        if record.has_video && !record.is_reply {
            // Pairs with the fence in `await_source`.
            fence(Ordering::SeqCst);
            if let Some(waiting) = self.pending_videos.remove(&post_id, &g.maps) {
                for repost in waiting.iter() {
                    self.promote_to_video(post_id, *repost, g, retired);
                }
            }
        }
        Applied::Inserted
    }

    /// True if `source` makes a repost of it video-eligible at `now`: an unexpired original or
    /// repost (not a reply) with its own video. The videos rule of `BEHAVIOUR.md`.
    #[inline]
    pub(crate) fn is_video_source(&self, source: &CompactPost, now: i64) -> bool {
        source.has_video && !source.is_reply && !self.expired(source.created_at, now)
    }

    /// Remembers a repost whose source is not stored yet, then re-checks the source.
    fn await_source(
        &self,
        source: i64,
        repost: PendingRepost,
        g: &Guards<'_>,
        retired: &mut Vec<SlotId>,
    ) {
        self.pending_videos.update_or_insert_with(
            source,
            |waiting| {
                let mut more = waiting.clone();
                more.push(repost);
                more
            },
            || vec![repost],
            &g.maps,
        );
        // Pairs with the fence after a video source is published: either it sees us waiting
        // or we see it stored.
        fence(Ordering::SeqCst);
        // A locked lookup: it is ordered with the source's insert by the stripe lock as well as
        // by the fences (a lock-free reader could still be in a table replaced meanwhile).
        if let Some(src) = self.lookup_locked(source, &g.epoch)
            && self.is_video_source(&src, g.now)
        {
            self.promote_to_video(source, repost, g, retired);
        }
    }

    /// The basis of `post_id`'s tombstone if it has one that has not expired (trimmed or not).
    pub(crate) fn live_tombstone(&self, post_id: i64, g: &Guards<'_>) -> Option<i64> {
        // The SeqCst fence before the check orders it (see the module docs).
        if !self.tombstone_filter.may_hold(post_id, &g.epoch) {
            return None;
        }
        self.tombstones
            .get(&post_id, &g.maps)
            .copied()
            .filter(|basis| !self.tombstone_expired(*basis, g.now))
    }

    fn tombstone_expired(&self, basis: i64, now: i64) -> bool {
        now.saturating_sub(basis) > self.retention_secs
    }

    /// Every tombstone not expired at `now` as `(post_id, basis_secs)` (for snapshots).
    pub(crate) fn live_tombstones(&self, now: i64) -> Vec<(i64, i64)> {
        let tombstones = self.tombstones.pin();
        tombstones
            .iter()
            .filter(|(_, basis)| !self.tombstone_expired(**basis, now))
            .map(|(&post_id, &basis)| (post_id, basis))
            .collect()
    }

    /// Restores a tombstone read from a snapshot, keeping the larger basis if one exists.
    /// False (and nothing stored) if it has expired at `g.now`. Does not touch stored posts:
    /// restore tombstones before the records.
    pub(crate) fn restore_tombstone(&self, post_id: i64, basis: i64, g: &Guards<'_>) -> bool {
        if self.tombstone_expired(basis, g.now) {
            return false;
        }
        self.tombstones
            .update_or_insert(post_id, |old| (*old).max(basis), basis, &g.maps);
        self.tombstone_filter.add(post_id, &g.epoch);
        true
    }

    /// The basis a delete event gives its tombstone at `now` (before the removed record's
    /// `created_at` is taken into account): `deleted_at`, but never later than now (a
    /// `deleted_at <= 0` counts as now) and never so early that the tombstone is born expired.
    /// So a tombstone lives at most the retention from its arrival, and at least until then.
    fn delete_basis(&self, deleted_at: i64, now: i64) -> i64 {
        let stamped = if deleted_at <= 0 {
            now
        } else {
            deleted_at.min(now)
        };
        stamped.max(now.saturating_sub(self.retention_secs))
    }

    /// A create of `post_id` created at `created_at` was dropped by its tombstone (of `basis`):
    /// the tombstone lives at least as long as that post could (as if the create had come first
    /// and the delete had removed it), so the basis does not depend on the order.
    pub(crate) fn tombstone_dropped_create(
        &self,
        post_id: i64,
        basis: i64,
        created_at: i64,
        g: &Guards<'_>,
    ) {
        if created_at > basis {
            self.tombstones.update_or_insert(
                post_id,
                |old| (*old).max(created_at),
                created_at,
                &g.maps,
            );
        }
    }

    /// Adds a remembered repost of `source` to its author's videos timeline (once), if that
    /// very repost is still stored and not expired.
    fn promote_to_video(
        &self,
        source: i64,
        repost: PendingRepost,
        g: &Guards<'_>,
        retired: &mut Vec<SlotId>,
    ) {
        self.with_author(repost.author_id, false, g, |author| {
            let Some((slot, record)) = self.lookup_with_slot(repost.post_id, &g.epoch) else {
                return;
            };
            let same_repost = record.author_id == repost.author_id
                && record.source_post_id == source
                && record.created_at == repost.created_at;
            if !same_repost
                || record.is_reply
                || !record.is_retweet
                || record.has_video
                || self.expired(record.created_at, g.now)
            {
                return;
            }
            if self.arena.hold(slot, repost.post_id, IN_VIDEO) {
                let entry = TinyPost {
                    post_id: repost.post_id,
                    created_at: record.created_at,
                    slot,
                };
                self.index(author, Kind::Videos, entry, g, retired);
            }
        });
    }

    /// Deletes posts: tombstones them and removes their records and timeline entries.
    pub fn mark_as_deleted(&self, events: &[DeleteEvent]) -> DeleteReport {
        let mut report = DeleteReport::default();
        let g = self.guards();
        let mut retired = Vec::new();
        for event in events {
            let post_id = event.post_id;
            let basis = self.delete_basis(event.deleted_at, g.now);
            self.tombstones
                .update_or_insert(post_id, |old| (*old).max(basis), basis, &g.maps);
            // After the map: a filter renewal either sees the entry or this add sees it
            // running (`tombstone_filter.rs`).
            self.tombstone_filter.add(post_id, &g.epoch);
            report.tombstoned += 1;
            // Pairs with the fence in `insert_one` (store-load: tombstone, then check).
            fence(Ordering::SeqCst);
            let Some(slot) = self
                .posts
                .remove_where(self.posts.hash(post_id), &g.epoch, |s| {
                    self.arena.read(s, post_id).is_some()
                })
            else {
                self.forget_fact(post_id, &g);
                continue;
            };
            let Some(record) = self.arena.read(slot, post_id) else {
                continue;
            };
            if !self.arena.free(slot, post_id) {
                continue;
            }
            retired.push(slot);
            report.removed += 1;
            let created_at = i64::from(record.created_at);
            self.tombstones
                .update(post_id, |old| (*old).max(created_at), &g.maps);
            self.with_author(record.author_id, false, &g, |author| {
                for kind in [Kind::primary_of(&record), Kind::Videos] {
                    if author.timelines[kind as usize].remove(post_id, record.created_at, &g.epoch)
                    {
                        self.entries[kind as usize].add(-1);
                    }
                }
            });
        }
        self.arena.retire(retired, &g.epoch);
        report
    }

    /// Trims one author shard (`shard mod TRIM_FRACTION`) and expires tombstones.
    pub fn trim(&self, shard: usize) -> TrimReport {
        let mut report = TrimReport::default();
        let g = self.guards();
        let now = g.now;
        let shard = (shard % TRIM_FRACTION) as i64;
        let mut retired = Vec::new();
        let in_shard =
            |author: &Author| author.author_id().rem_euclid(TRIM_FRACTION as i64) == shard;
        self.authors.for_each(|author| {
            // Filter before locking (unused records keep a stale id; the lock re-checks).
            if !in_shard(author) {
                return;
            }
            let mut removed = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
            if *removed || !in_shard(author) {
                return;
            }
            let mut empty = true;
            for kind in [Kind::Originals, Kind::Secondary, Kind::Videos] {
                let timeline = &author.timelines[kind as usize];
                let popped = timeline.pop_expired(|e| self.expired(e.created_at, now), &g.epoch);
                report.entries_removed += popped.len();
                self.entries[kind as usize].add(-(popped.len() as isize));
                for entry in popped {
                    if self.release(entry, kind, &g, &mut retired) {
                        report.posts_freed += 1;
                    }
                }
                empty &= timeline.shrink(&g.epoch);
            }
            if empty {
                *removed = true;
                self.authors.remove(author, &g.epoch);
                // The record stays for reuse; its (empty) rings need not.
                for timeline in &author.timelines {
                    timeline.release_buffer(&g.epoch);
                }
                report.authors_dropped += 1;
            }
        });
        let mut expired = 0;
        self.tombstones.retain(
            |_, basis| {
                let keep = !self.tombstone_expired(*basis, now);
                expired += usize::from(!keep);
                keep
            },
            &g.maps,
        );
        report.tombstones_expired = expired;
        self.tombstone_filter.renew_if_stale(
            self.tombstones.len(),
            |set| {
                for (&post_id, _) in self.tombstones.iter(&g.maps) {
                    set(post_id);
                }
            },
            &g.epoch,
        );
        self.trim_facts(shard as usize, now);
        self.pending_videos.retain(
            |_, waiting| waiting.iter().any(|r| !self.expired(r.created_at, now)),
            &g.maps,
        );
        self.arena.retire(retired, &g.epoch);
        // The slots freed above reach the free list after their grace period: a later trim
        // releases what they empty.
        self.arena.release_free_chunks();
        report
    }

    /// Trims every shard once.
    pub fn trim_all(&self) -> TrimReport {
        (0..TRIM_FRACTION).map(|shard| self.trim(shard)).sum()
    }

    /// Sizes the post index at once for about `posts` posts, so that filling the store (a
    /// replay of a known backlog) never stops its writers to rehash the index on the way.
    /// Nothing if the index is that large already; the index still grows past it if needed.
    pub fn reserve_posts(&self, posts: usize) {
        self.posts.reserve(posts, &crossbeam_epoch::pin());
    }

    /// Current sizes (see [`StoreStats`]).
    pub fn stats(&self) -> StoreStats {
        let entries = |k: Kind| self.entries[k as usize].sum_usize();
        let g = self.guards();
        let mut timeline_bytes = 0;
        self.authors.for_each(|a| {
            timeline_bytes += a
                .timelines
                .iter()
                .map(|t| t.buffer_bytes(&g.epoch))
                .sum::<usize>();
        });
        StoreStats {
            authors: self.authors.live(),
            posts: self.arena.live(),
            original_entries: entries(Kind::Originals),
            secondary_entries: entries(Kind::Secondary),
            video_entries: entries(Kind::Videos),
            tombstones: self.tombstones.len(),
            arena_bytes_reserved: self.arena.bytes_reserved(),
            arena_bytes_used: self.arena.bytes_used(),
            timeline_bytes,
            index_bytes: self.posts.bytes(&g.epoch) + self.authors.bytes(&g.epoch),
        }
    }

    /// [`stats`](Self::stats) with the counts recounted from the data instead of read from
    /// the running counters: authors in use, live post records (a scan of every arena slot)
    /// and the entries of every in-use author's timelines. Walks the whole store; for checks
    /// and tests that the counters (and so the gauges) match what the store serves. Exact
    /// when nothing writes meanwhile.
    pub fn recount(&self) -> StoreStats {
        let mut stats = self.stats();
        let g = self.guards();
        let (mut authors, mut entries) = (0, [0usize; 3]);
        self.authors.for_each(|author| {
            let removed = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
            if *removed {
                return;
            }
            authors += 1;
            for (kind, timeline) in author.timelines.iter().enumerate() {
                entries[kind] += timeline.view(&g.epoch).map_or(0, |view| view.len());
            }
        });
        let mut posts = 0;
        for unit in 0..self.arena.scan_chunks() {
            self.arena.scan_chunk(unit, |_, _| posts += 1);
        }
        stats.authors = authors;
        stats.posts = posts;
        stats.original_entries = entries[Kind::Originals as usize];
        stats.secondary_entries = entries[Kind::Secondary as usize];
        stats.video_entries = entries[Kind::Videos as usize];
        stats.tombstones = self.tombstones.pin().iter().count();
        stats
    }
}

#[cfg(all(test, not(thunder_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn trim_renews_a_tombstone_filter_full_of_expired_ids() {
        let now = 1_700_000_000;
        let clock = Arc::new(ManualClock::new(now));
        let store = PostStore::with_clock(1000, clock.clone());
        let deleted = 0..200_000i64;
        let deletes: Vec<DeleteEvent> = deleted
            .clone()
            .map(|post_id| DeleteEvent {
                post_id,
                deleted_at: now,
            })
            .collect();
        store.mark_as_deleted(&deletes);
        let passing = |store: &PostStore| {
            let g = store.guards();
            deleted
                .clone()
                .filter(|&id| store.tombstone_filter.may_hold(id, &g.epoch))
                .count()
        };
        assert_eq!(passing(&store), 200_000);
        clock.advance(1001);
        assert_eq!(store.trim_all().tombstones_expired, 200_000);
        assert_eq!(passing(&store), 0, "the renewed filter holds no expired id");
    }
}

#[cfg(all(test, not(thunder_loom), target_os = "linux"))]
mod memory_tests {
    use super::*;
    use crate::FeedQuery;
    use crate::clock::ManualClock;
    use std::sync::atomic::AtomicBool;

    const NOW: i64 = 1_700_000_000;
    const RETENTION: i64 = 1000;
    const AUTHORS: i64 = 500;

    /// Post `id`: its author, time and kind follow from the id, so a reader can check that
    /// whatever it is served is whole.
    fn post(id: i64, now: i64) -> LightPost {
        let author_id = 1 + id % AUTHORS;
        let created_at = now - id % 7;
        if id % 3 == 0 {
            LightPost {
                in_reply_to_post_id: Some(id + 1),
                in_reply_to_user_id: Some(author_id + 1),
                is_reply: true,
                conversation_id: Some(id + 2),
                ..LightPost::original(id, author_id, created_at)
            }
        } else {
            LightPost {
                has_video: id % 5 == 0,
                ..LightPost::original(id, author_id, created_at)
            }
        }
    }

    fn assert_whole(served: &LightPost, now: i64) {
        let mut expected = post(served.post_id, now);
        // The store answers with the post's reply-to ids; it only keeps what it stores.
        expected.created_at = served.created_at;
        assert_eq!(served.author_id, expected.author_id, "{served:?}");
        assert_eq!(served.is_reply, expected.is_reply, "{served:?}");
        assert_eq!(
            served.in_reply_to_post_id, expected.in_reply_to_post_id,
            "{served:?}"
        );
        assert_eq!(served.has_video, expected.has_video, "{served:?}");
        assert!(served.created_at <= now && now - served.created_at < 7);
    }

    fn fill(store: &PostStore, ids: std::ops::Range<i64>, now: i64) {
        let posts: Vec<LightPost> = ids.map(|id| post(id, now)).collect();
        for batch in posts.chunks(4096) {
            assert_eq!(store.insert_posts(batch).inserted, batch.len());
        }
    }

    /// Bytes of one arena chunk.
    const CHUNK: usize = 2 << 20;

    /// Trims everything expired, and again while the freed slots pass their grace period,
    /// until at most two chunks (one per slot class) stay reserved (10 s at most).
    fn trim_until_released(store: &PostStore) {
        store.trim_all();
        crate::sync::flush_epoch_until(|| {
            store.trim_all();
            store.stats().arena_bytes_reserved <= 2 * CHUNK
        });
    }

    #[test]
    fn a_post_without_a_slot_is_dropped_and_counted() {
        let store = PostStore::with_clock(RETENTION, Arc::new(ManualClock::new(NOW)));
        store.arena.refuse_new_chunks();
        let mut drops = Vec::new();
        let report = store.insert_posts_with(&[post(1, NOW), post(3, NOW)], |i, reason| {
            drops.push((i, reason))
        });
        drops.sort_unstable();
        assert_eq!(report.no_slot, 2);
        assert_eq!(report.inserted + report.dropped(), 2);
        assert_eq!(drops, [(0, DropReason::NoSlot), (1, DropReason::NoSlot)]);
        assert_eq!(DropReason::NoSlot.as_str(), "no_slot");
        assert_eq!(store.stats().posts, 0);
        assert_eq!(store.recount(), store.stats());
    }

    #[test]
    fn an_emptied_store_hands_its_arena_chunks_and_rings_back() {
        let clock = Arc::new(ManualClock::new(NOW));
        let store = PostStore::with_clock(RETENTION, clock.clone());
        let posts = 400_000;
        fill(&store, 0..posts, NOW);
        let full = store.stats();
        assert_eq!(full.posts, posts as usize);
        assert_eq!(store.recount(), full);
        assert!(full.arena_bytes_reserved >= 8 << 20, "{full:?}");
        assert!(full.timeline_bytes > 0);

        clock.advance(RETENTION + 10);
        trim_until_released(&store);
        let empty = store.stats();
        assert_eq!((empty.posts, empty.authors), (0, 0), "{empty:?}");
        assert_eq!(empty.timeline_bytes, 0, "no authors, no rings: {empty:?}");
        // At most the chunk each class is still bumping into stays.
        assert!(
            empty.arena_bytes_reserved <= 2 * CHUNK,
            "{} of {} bytes still reserved",
            empty.arena_bytes_reserved,
            full.arena_bytes_reserved
        );
        assert_eq!(store.recount(), empty);

        // The released chunks are taken again before any new one.
        let now = clock.now_secs();
        fill(&store, posts..2 * posts, now);
        let refilled = store.stats();
        assert_eq!(refilled.posts, posts as usize);
        assert!(
            refilled.arena_bytes_reserved <= full.arena_bytes_reserved,
            "{refilled:?} vs {full:?}"
        );
        assert_eq!(store.recount(), refilled);
        let authors: Vec<i64> = (1..=AUTHORS).collect();
        let mut query = FeedQuery::new(0, &authors);
        query.max_results = usize::MAX;
        query.max_originals_per_author = usize::MAX;
        query.max_secondary_per_author = usize::MAX;
        for served in store.get_all_posts_by_users(&query).posts {
            assert!(served.post_id >= posts);
            assert_whole(&served, now);
        }
    }

    /// Chunks are released and reused while readers query (pinned) and scan (snapshot)
    /// throughout: every post served is whole, and every post of the current round is served.
    #[test]
    fn releasing_chunks_under_concurrent_readers_serves_only_whole_posts() {
        let clock = Arc::new(ManualClock::new(NOW));
        let store = PostStore::with_clock(RETENTION, clock.clone());
        let stop = AtomicBool::new(false);
        let released = std::sync::atomic::AtomicUsize::new(0);
        let per_round = 100_000;
        /// Stops the readers however the writer's part ends (a failed assertion included).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        std::thread::scope(|scope| {
            let _stop_readers = StopOnDrop(&stop);
            for reader in 0..2i64 {
                let (store, stop) = (&store, &stop);
                scope.spawn(move || {
                    let authors: Vec<i64> = (1..=AUTHORS).filter(|a| a % 2 == reader).collect();
                    while !stop.load(Ordering::Relaxed) {
                        let outcome = store.get_all_posts_by_users(&FeedQuery::new(0, &authors));
                        for served in &outcome.posts {
                            assert_whole(served, outcome.as_of_secs);
                        }
                        // A scan of every slot, as a snapshot makes.
                        for unit in 0..store.arena.scan_chunks() {
                            store.arena.scan_chunk(unit, |_, record| {
                                let light = record.to_light();
                                assert_eq!(light.author_id, 1 + light.post_id % AUTHORS);
                                assert_eq!(light.is_reply, light.post_id % 3 == 0);
                            });
                        }
                    }
                });
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            for round in 0..3i64 {
                let now = clock.now_secs();
                let first = round * per_round;
                fill(&store, first..first + per_round, now);
                assert_eq!(store.recount().posts, per_round as usize);
                // Every post of the round is there, whole.
                let epoch = crossbeam_epoch::pin();
                for id in first..first + per_round {
                    let record = store.lookup(id, &epoch).expect("stored");
                    assert_whole(&record.to_light(), now);
                }
                drop(epoch);
                clock.advance(RETENTION + 10);
                let reserved = store.stats().arena_bytes_reserved;
                trim_until_released(&store);
                let after = store.stats().arena_bytes_reserved;
                if after < reserved {
                    released.fetch_add(1, Ordering::Relaxed);
                }
                if std::time::Instant::now() > deadline {
                    break;
                }
            }
        });
        assert!(
            released.load(Ordering::Relaxed) > 0,
            "no chunk was released"
        );
    }
}
