//! [`StoreTables`]: the tables behind the store's face (`store.rs`), and the narrow methods
//! through which everything else reads and changes them.
//!
//! The tables: the record arena (`arena.rs`), the `post_id -> slot` index (`index.rs`), the
//! authors and their three timelines (`authors.rs`, `timeline.rs`) with the entry counters,
//! the tombstones and the filter in front of them (`tombstone_filter.rs`), the reposts that
//! wait for their source and, on an author shard, the fact directory (`directory.rs`). The
//! fields are this module's own: the write path (`write.rs`), the read path (`query.rs`), the
//! bulk build (`bulk.rs`) and the snapshot wing call methods that each keep the tables
//! consistent with one another (a record is indexed while a timeline holds it, the entry
//! counters follow the timelines, a tombstone's filter bit is set once it is written).
//!
//! Concurrency: any number of threads may call any method at once. Readers take no lock.
//! Writers serialise per author only (the author's mutex guards its three timelines) and,
//! briefly, per index stripe; the post and author indexes never make a reader wait, the small
//! maps are lock-free (papaya) and the arena is lock-free.
//!
//! Two orderings keep concurrent inserts and deletes honest (bug 20 of the reference), both
//! kept here:
//! - an insert publishes `post_id -> slot`, then (after a SeqCst fence) re-checks the
//!   tombstones ([`StoreTables::publish_checked`]);
//! - a delete writes the tombstone, then (after a SeqCst fence) removes `post_id -> slot`
//!   ([`StoreTables::tombstone_and_remove`]).
//!
//! Whichever runs second sees the other's write, so a create racing its delete is either
//! removed by the delete or undone by itself: it is never left live. A third pair orders a
//! repost that waits for its source with the source's arrival ([`StoreTables::wait_for_source`]
//! and [`StoreTables::take_waiting`]).

use crate::arena::{Arena, CompactPost, IN_VIDEO, Release, SlotId};
use crate::authors::{Author, AuthorIndex, Kind};
use crate::clock::Clock;
use crate::counter::StripedCount;
use crate::directory::{Fact, FactDirectory, FactRecord};
use crate::index::{Hashed, TagIndex};
use crate::prefetch::prefetch;
use crate::report::{DirectoryStats, DropReason, StoreStats};
use crate::shard::ShardId;
use crate::timeline::{MAX_CAPACITY, TinyPost};
use crate::tombstone_filter::TombstoneFilter;
use crossbeam_epoch::Guard;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, PoisonError};

type IdHasher = foldhash::fast::RandomState;

type IdMap<V> = papaya::HashMap<i64, V, IdHasher>;

/// Posts the post index holds before its first growth.
const POST_INDEX_INITIAL_CAPACITY: usize = 4096;

/// Retired entries of the small maps a thread gathers before it tries to reclaim them
/// (seize's batch size; its default is 32). Each attempt issues a `membarrier` system call,
/// which interrupts every other core running a thread of the process; with the default, the
/// tombstone updates of a delete-heavy load made one every 32 deletes, 2.7% of two writers'
/// samples at scale 10. A batch holds at most this many small entries (or a replaced table)
/// per thread a little longer.
const RETIRE_BATCH: usize = 1024;

/// A repost remembered until its source arrives (bug 13 of the reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingRepost {
    pub(crate) post_id: i64,
    pub(crate) author_id: i64,
    pub(crate) created_at: u32,
}

/// The guards one call (a query, or an insert, delete or trim of a batch) holds while it runs,
/// and the time it runs at.
pub(crate) struct Guards<'s> {
    /// The store clock when the call began.
    pub(crate) now: i64,
    /// The epoch pin that keeps records, rings and index tables read meanwhile alive.
    pub(crate) epoch: Guard,
    /// The small maps' guard (tombstones and waiting reposts share one collector).
    maps: papaya::LocalGuard<'s>,
}

/// The store's tables (see the module docs).
#[derive(Debug)]
pub(crate) struct StoreTables {
    retention_secs: i64,
    /// Entries per timeline before the oldest is evicted.
    cap: usize,
    clock: Arc<dyn Clock>,
    arena: Arena,
    /// `post_id -> slot`; the slot's record verifies a hit.
    posts: TagIndex,
    authors: AuthorIndex,
    /// `post_id -> basis secs`: a tombstone expires a retention after its basis.
    tombstones: IdMap<i64>,
    /// A one-sided filter in front of `tombstones`: a clear bit among a post id's two bits
    /// proves "no tombstone", so the common insert (never deleted) skips the map probe. Bits
    /// are set after the tombstone is written; trim renews the filter from the map once stale
    /// bits pile up (`tombstone_filter.rs`).
    tombstone_filter: TombstoneFilter,
    /// `source post_id ->` the reposts waiting for it.
    pending_videos: IdMap<Vec<PendingRepost>>,
    /// Entries per timeline kind.
    entries: [StripedCount; 3],
    /// On an author shard: the facts of other authors' posts.
    directory: Option<FactDirectory>,
}

impl StoreTables {
    /// Empty tables keeping `retention_secs` (at least 0) of posts, at most
    /// `max_posting_list_size` (clamped to 1 ..= 16384) entries per timeline, on `clock`.
    pub(crate) fn new(
        retention_secs: i64,
        max_posting_list_size: usize,
        clock: Arc<dyn Clock>,
    ) -> Self {
        // One collector for every map, so one guard covers them all.
        let collector = Arc::new(seize::Collector::new().batch_size(RETIRE_BATCH));
        fn map<V: Send + 'static>(collector: &Arc<seize::Collector>) -> IdMap<V> {
            papaya::HashMap::builder()
                .hasher(IdHasher::default())
                .shared_collector(Arc::clone(collector))
                .build()
        }
        Self {
            retention_secs: retention_secs.max(0),
            cap: max_posting_list_size.clamp(1, MAX_CAPACITY),
            clock,
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

    /// Makes these tables an author shard's: a fact directory for the authors `owns` rejects.
    pub(crate) fn make_shard(
        &mut self,
        owns: Box<dyn Fn(i64) -> bool + Send + Sync>,
        id: Option<ShardId>,
    ) {
        self.directory = Some(FactDirectory::new(owns, id));
    }

    // Time.

    /// The retention window in seconds.
    pub(crate) fn retention_secs(&self) -> i64 {
        self.retention_secs
    }

    /// Entries per timeline before the oldest is evicted.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// The store clock's current time.
    pub(crate) fn now_secs(&self) -> i64 {
        self.clock.now_secs()
    }

    /// True when a post created at `created_at` is older than the retention at `now`.
    #[inline]
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

    // The author shard.

    /// The shard these tables are, if they were given its identity.
    pub(crate) fn shard_id(&self) -> Option<ShardId> {
        self.directory.as_ref().and_then(FactDirectory::id)
    }

    /// True on an author shard (with or without its identity).
    pub(crate) fn is_shard(&self) -> bool {
        self.directory.is_some()
    }

    /// True on a shard that does not own `author_id` (it then has no timeline of that author;
    /// its posts go to the fact directory).
    #[inline]
    pub(crate) fn is_foreign_author(&self, author_id: i64) -> bool {
        self.directory.as_ref().is_some_and(|d| !d.owns(author_id))
    }

    /// Sizes of the fact directory; `None` for a full (unsharded) store.
    pub(crate) fn directory_stats(&self) -> Option<DirectoryStats> {
        self.directory.as_ref().map(FactDirectory::stats)
    }

    // Records and the post index.

    /// The live record of `post_id`, if stored.
    #[inline]
    pub(crate) fn lookup(&self, post_id: i64, epoch: &Guard) -> Option<CompactPost> {
        self.lookup_with_slot(post_id, epoch)
            .map(|(_, record)| record)
    }

    /// The slot and live record of `post_id`, if stored.
    #[inline]
    pub(crate) fn lookup_with_slot(
        &self,
        post_id: i64,
        epoch: &Guard,
    ) -> Option<(SlotId, CompactPost)> {
        self.posts.get(self.posts.hash(post_id), epoch, |slot| {
            self.arena.read(slot, post_id).map(|record| (slot, record))
        })
    }

    /// The live record of `post_id`, if stored, looked up under the post's index stripe lock.
    fn lookup_locked(&self, post_id: i64, epoch: &Guard) -> Option<CompactPost> {
        self.posts
            .get_locked(self.posts.hash(post_id), epoch, |slot| {
                self.arena.read(slot, post_id)
            })
    }

    /// The record in `slot` if it still is `post_id`'s (validated: never another post's).
    #[inline]
    pub(crate) fn read(&self, slot: SlotId, post_id: i64) -> Option<CompactPost> {
        self.arena.read(slot, post_id)
    }

    /// The record in `slot` if the slot is live, whichever post it holds.
    #[inline]
    pub(crate) fn read_live(&self, slot: SlotId) -> Option<CompactPost> {
        self.arena.read_live(slot)
    }

    /// Prefetches the record in `slot`.
    #[inline]
    pub(crate) fn prefetch_record(&self, slot: SlotId) {
        prefetch(self.arena.slot_ptr(slot));
    }

    /// Prefetches `post_id`'s post index bucket.
    #[inline]
    pub(crate) fn prefetch_post_bucket(&self, post_id: i64, epoch: &Guard) {
        prefetch(self.posts.bucket_ptr(self.posts.hash(post_id), epoch));
    }

    /// Prefetches the record `post_id`'s index bucket names first (unverified); its bucket
    /// should have been prefetched before.
    #[inline]
    pub(crate) fn prefetch_stored_record(&self, post_id: i64, epoch: &Guard) {
        if let Some(slot) = self.posts.probe(self.posts.hash(post_id), epoch) {
            prefetch(self.arena.slot_ptr(slot));
        }
    }

    /// Publishes `record` to a fresh slot held by `holders` and indexes it. `NoSlot` when no
    /// slot can be had, `Duplicate` (and nothing kept) when the post is already stored.
    #[inline]
    pub(crate) fn publish(
        &self,
        record: &CompactPost,
        holders: u32,
        epoch: &Guard,
    ) -> Result<SlotId, DropReason> {
        let post_id = record.post_id;
        let Some(slot) = self.arena.publish(record, holders) else {
            // Only when every u32 slot id is in use or memory is exhausted.
            return Err(DropReason::NoSlot);
        };
        let is_stored = |s: SlotId| self.arena.read(s, post_id).is_some();
        if self
            .posts
            .insert_with(self.posts.hash(post_id), epoch, is_stored, || Some(slot))
            .is_err()
        {
            // A concurrent insert of the same post won.
            self.arena.unpublish_unshared(slot, post_id);
            return Err(DropReason::Duplicate);
        }
        Ok(slot)
    }

    /// [`publish`](Self::publish), then the tombstones checked again (after the fence that
    /// pairs with [`tombstone_and_remove`](Self::tombstone_and_remove)): a post deleted
    /// meanwhile is taken back (`Tombstoned`, its tombstone's basis raised as for any dropped
    /// create). Check the tombstones once before: most deleted posts stop there.
    #[inline]
    pub(crate) fn publish_checked(
        &self,
        record: &CompactPost,
        holders: u32,
        g: &Guards<'_>,
        retired: &mut Vec<SlotId>,
    ) -> Result<SlotId, DropReason> {
        let post_id = record.post_id;
        let slot = self.publish(record, holders, &g.epoch)?;
        // Pairs with the fence in `tombstone_and_remove` (store-load: publish, then check).
        fence(Ordering::SeqCst);
        if self.drops_create(post_id, i64::from(record.created_at), g) {
            self.unpublish(post_id, slot, &g.epoch, retired);
            return Err(DropReason::Tombstoned);
        }
        Ok(slot)
    }

    /// Takes a published record back: out of the index, its slot freed (and pushed to
    /// `retired` when this call freed it).
    pub(crate) fn unpublish(
        &self,
        post_id: i64,
        slot: SlotId,
        epoch: &Guard,
        retired: &mut Vec<SlotId>,
    ) {
        self.posts
            .remove_exact(self.posts.hash(post_id), slot, epoch);
        if self.arena.free(slot, post_id) {
            retired.push(slot);
        }
    }

    /// Drops a `kind` timeline's hold on `post_id`'s record in `slot`; unindexes and frees
    /// the record if that was its last hold (true then, the slot pushed to `retired`).
    pub(crate) fn release(
        &self,
        post_id: i64,
        slot: SlotId,
        kind: Kind,
        epoch: &Guard,
        retired: &mut Vec<SlotId>,
    ) -> bool {
        if self.arena.release(slot, post_id, kind.holder()) != Release::Freed {
            return false;
        }
        self.posts
            .remove_exact(self.posts.hash(post_id), slot, epoch);
        retired.push(slot);
        true
    }

    /// Adds the videos timeline's hold to `post_id`'s record in `slot`; false if the slot no
    /// longer holds it or it has that hold already.
    pub(crate) fn hold_video(&self, slot: SlotId, post_id: i64) -> bool {
        self.arena.hold(slot, post_id, IN_VIDEO)
    }

    /// Hands slots freed by one call back to the arena after the epoch's grace period.
    pub(crate) fn retire(&self, retired: Vec<SlotId>, epoch: &Guard) {
        self.arena.retire(retired, epoch);
    }

    /// Live post records.
    pub(crate) fn live_posts(&self) -> usize {
        self.arena.live()
    }

    /// Units of work a scan of every record splits into (see [`scan_chunk`](Self::scan_chunk)).
    pub(crate) fn scan_chunks(&self) -> usize {
        self.arena.scan_chunks()
    }

    /// Calls `each(slot, record)` for every live record of scan unit `index`; takes no lock
    /// and no pin (every read is validated).
    pub(crate) fn scan_chunk(&self, index: usize, each: impl FnMut(SlotId, CompactPost)) {
        self.arena.scan_chunk(index, each);
    }

    /// Sizes the post index at once for about `posts` posts.
    pub(crate) fn reserve_posts(&self, posts: usize) {
        self.posts.reserve(posts, &crossbeam_epoch::pin());
    }

    /// Whether the arena maps its next chunk ahead on a thread of its own.
    pub(crate) fn make_chunks_ahead(&self, on: bool) {
        self.arena.make_chunks_ahead(on);
    }

    /// Hands arena chunks whose slots are all free back to the system.
    pub(crate) fn release_free_chunks(&self) {
        self.arena.release_free_chunks();
    }

    /// The next arena chunk is refused, as if the system had no memory left (tests).
    #[cfg(all(test, not(thunder_loom)))]
    pub(crate) fn refuse_new_chunks(&self) {
        self.arena.refuse_new_chunks();
    }

    // Authors and their timelines.

    /// `author_id`'s place in the author index.
    #[inline]
    pub(crate) fn author_hash(&self, author_id: i64) -> Hashed {
        self.authors.hash(author_id)
    }

    /// Prefetches the author index bucket of `hashed`.
    #[inline]
    pub(crate) fn prefetch_author_bucket(&self, hashed: Hashed, epoch: &Guard) {
        prefetch(self.authors.bucket_ptr(hashed, epoch));
    }

    /// The author record the index bucket of `hashed` names first, unverified (it may be
    /// another author's, or reused since): for prefetching, then
    /// [`verified_author`](Self::verified_author).
    #[inline]
    pub(crate) fn author_candidate(&self, hashed: Hashed, epoch: &Guard) -> Option<&Author> {
        self.authors
            .probe(hashed, epoch)
            .and_then(|number| self.authors.record(number))
    }

    /// `candidate` if it is `author_id`'s record, else the full lookup of `hashed`.
    #[inline]
    pub(crate) fn verified_author<'a>(
        &'a self,
        author_id: i64,
        hashed: Hashed,
        candidate: &'a Author,
        epoch: &Guard,
    ) -> Option<&'a Author> {
        if candidate.author_id() == author_id {
            return Some(candidate);
        }
        // A tag collision (or a record replaced meanwhile).
        self.authors.get_hashed(author_id, hashed, epoch)
    }

    /// `author_id`'s record, if indexed.
    #[inline]
    pub(crate) fn find_author(&self, author_id: i64, epoch: &Guard) -> Option<&Author> {
        self.authors.get(author_id, epoch)
    }

    /// Runs `f` on the author's timelines under the author's writer lock. With `create`, a
    /// missing author is added; without, a missing author means `None`.
    pub(crate) fn with_author<R>(
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
    pub(crate) fn with_author_from<R>(
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
            // A plain lookup first: most writes go to an existing author, and the index's
            // insert path is heavier than its read path.
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

    /// Calls `f` on every author record that may be in use (check its writer flag under the
    /// lock).
    pub(crate) fn for_each_author(&self, f: impl FnMut(&Author)) {
        self.authors.for_each(f);
    }

    /// Drops `author`, whose timelines are empty: out of the index, its rings released. The
    /// caller holds its writer lock and has marked it not in use.
    pub(crate) fn drop_author(&self, author: &Author, epoch: &Guard) {
        self.authors.remove(author, epoch);
        // The record stays for reuse; its (empty) rings need not.
        for kind in Kind::ALL {
            author.timeline(kind).release_buffer(epoch);
        }
    }

    /// Inserts `entry` into `author`'s `kind` timeline, whose writer lock the caller holds; a
    /// cap eviction releases the evicted entry's record.
    pub(crate) fn index(
        &self,
        author: &Author,
        kind: Kind,
        entry: TinyPost,
        epoch: &Guard,
        retired: &mut Vec<SlotId>,
    ) {
        match author.timeline(kind).insert(entry, self.cap, epoch) {
            Some(evicted) => {
                self.release(evicted.post_id, evicted.slot, kind, epoch, retired);
            }
            None => {
                self.entries[kind as usize].add(1);
            }
        }
    }

    /// Removes `post_id` (created at `created_at`) from `author`'s `kind` timeline, whose
    /// writer lock the caller holds. Does not release the record.
    pub(crate) fn unindex(
        &self,
        author: &Author,
        kind: Kind,
        post_id: i64,
        created_at: u32,
        epoch: &Guard,
    ) {
        if author.timeline(kind).remove(post_id, created_at, epoch) {
            self.entries[kind as usize].add(-1);
        }
    }

    /// Removes the expired entries at `now` from `author`'s `kind` timeline, whose writer lock
    /// the caller holds, and releases their records: `(entries removed, records freed)`.
    pub(crate) fn expire_entries(
        &self,
        author: &Author,
        kind: Kind,
        now: i64,
        epoch: &Guard,
        retired: &mut Vec<SlotId>,
    ) -> (usize, usize) {
        let popped = author
            .timeline(kind)
            .pop_expired(|e| self.expired(e.created_at, now), epoch);
        self.entries[kind as usize].add(-(popped.len() as isize));
        let mut freed = 0;
        for entry in &popped {
            if self.release(entry.post_id, entry.slot, kind, epoch, retired) {
                freed += 1;
            }
        }
        (popped.len(), freed)
    }

    /// Gives `author_id` (added to the index) the three timelines `timelines`, each written
    /// whole into a fresh ring (`Timeline::fill_fresh`: the author's timelines are empty),
    /// under its writer lock. Counts nothing (see [`count_entries`](Self::count_entries));
    /// false, and nothing indexed, when no author record can be had.
    pub(crate) fn fill_author(
        &self,
        author_id: i64,
        timelines: &[Vec<TinyPost>; 3],
        epoch: &Guard,
    ) -> bool {
        let Some(author) = self.authors.get_or_create(author_id, epoch) else {
            return false;
        };
        let _writer = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
        for kind in Kind::ALL {
            author
                .timeline(kind)
                .fill_fresh(&timelines[kind as usize], self.cap, epoch);
        }
        true
    }

    /// Adds `n` to the entry count of `kind` timelines (after [`fill_author`](Self::fill_author)).
    pub(crate) fn count_entries(&self, kind: Kind, n: isize) {
        self.entries[kind as usize].add(n);
    }

    // Tombstones.

    /// Prefetches the tombstone filter word of `post_id`.
    #[inline]
    pub(crate) fn prefetch_tombstone_word(&self, post_id: i64, epoch: &Guard) {
        prefetch(self.tombstone_filter.word_ptr(post_id, epoch));
    }

    /// The basis of `post_id`'s tombstone if it has one that has not expired (trimmed or not).
    #[inline]
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

    /// True when a live tombstone drops a create of `post_id` created at `created_at`; the
    /// tombstone then lives at least as long as that post could (as if the create had come
    /// first and the delete had removed it), so its basis does not depend on the order.
    #[inline]
    pub(crate) fn drops_create(&self, post_id: i64, created_at: i64, g: &Guards<'_>) -> bool {
        let Some(basis) = self.live_tombstone(post_id, g) else {
            return false;
        };
        if created_at > basis {
            self.tombstones.update_or_insert(
                post_id,
                |old| (*old).max(created_at),
                created_at,
                &g.maps,
            );
        }
        true
    }

    fn tombstone_expired(&self, basis: i64, now: i64) -> bool {
        now.saturating_sub(basis) > self.retention_secs
    }

    /// Tombstones `post_id` with `basis` (keeping a later basis it has), then removes its
    /// stored record (after the fence that pairs with
    /// [`publish_checked`](Self::publish_checked)), or on a shard its fact, and raises the
    /// basis to the removed post's `created_at`. The removed record, when this call freed it
    /// (its slot then pushed to `retired`); its timeline entries are the caller's to remove.
    pub(crate) fn tombstone_and_remove(
        &self,
        post_id: i64,
        basis: i64,
        g: &Guards<'_>,
        retired: &mut Vec<SlotId>,
    ) -> Option<CompactPost> {
        self.tombstones
            .update_or_insert(post_id, |old| (*old).max(basis), basis, &g.maps);
        // After the map: a filter renewal either sees the entry or this add sees it running
        // (`tombstone_filter.rs`).
        self.tombstone_filter.add(post_id, &g.epoch);
        // Pairs with the fence in `publish_checked` (store-load: tombstone, then check).
        fence(Ordering::SeqCst);
        let Some(slot) = self
            .posts
            .remove_where(self.posts.hash(post_id), &g.epoch, |s| {
                self.arena.read(s, post_id).is_some()
            })
        else {
            self.forget_fact(post_id, g);
            return None;
        };
        let record = self.arena.read(slot, post_id)?;
        if !self.arena.free(slot, post_id) {
            return None;
        }
        retired.push(slot);
        self.raise_tombstone(post_id, i64::from(record.created_at), g);
        Some(record)
    }

    /// Raises `post_id`'s tombstone (if it has one) to the `created_at` of the post it removed.
    fn raise_tombstone(&self, post_id: i64, created_at: i64, g: &Guards<'_>) {
        self.tombstones
            .update(post_id, |old| (*old).max(created_at), &g.maps);
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

    /// Forgets the tombstones expired at `g.now` (how many), and renews the filter once the
    /// stale bits pile up.
    pub(crate) fn expire_tombstones(&self, g: &Guards<'_>) -> usize {
        let mut expired = 0;
        self.tombstones.retain(
            |_, basis| {
                let keep = !self.tombstone_expired(*basis, g.now);
                expired += usize::from(!keep);
                keep
            },
            &g.maps,
        );
        self.tombstone_filter.renew_if_stale(
            self.tombstones.len(),
            |set| {
                for (&post_id, _) in self.tombstones.iter(&g.maps) {
                    set(post_id);
                }
            },
            &g.epoch,
        );
        expired
    }

    /// True while the filter lets `post_id` through to the tombstone map (tests).
    #[cfg(all(test, not(thunder_loom)))]
    pub(crate) fn tombstone_filter_passes(&self, post_id: i64, epoch: &Guard) -> bool {
        self.tombstone_filter.may_hold(post_id, epoch)
    }

    // Reposts waiting for their source.

    /// Remembers `repost` as waiting for `source`, then (after the fence that pairs with
    /// [`take_waiting`](Self::take_waiting)) looks the source up: either its insert sees the
    /// repost waiting or this sees it stored. The source's record, if stored.
    pub(crate) fn wait_for_source(
        &self,
        source: i64,
        repost: PendingRepost,
        g: &Guards<'_>,
    ) -> Option<CompactPost> {
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
        // Pairs with the fence in `take_waiting`.
        fence(Ordering::SeqCst);
        // A locked lookup: it is ordered with the source's insert by the stripe lock as well as
        // by the fences (a lock-free reader could still be in a table replaced meanwhile).
        self.lookup_locked(source, &g.epoch)
    }

    /// The reposts that waited for `post_id` (a video source just stored), no longer waiting.
    pub(crate) fn take_waiting<'g>(
        &self,
        post_id: i64,
        g: &'g Guards<'_>,
    ) -> Option<&'g [PendingRepost]> {
        // Pairs with the fence in `wait_for_source`.
        fence(Ordering::SeqCst);
        self.pending_videos
            .remove(&post_id, &g.maps)
            .map(Vec::as_slice)
    }

    /// Sets the reposts waiting for `source` (a bulk build's, in rank order).
    pub(crate) fn set_waiting(&self, source: i64, waiting: Vec<PendingRepost>, g: &Guards<'_>) {
        self.pending_videos.insert(source, waiting, &g.maps);
    }

    /// Every repost waiting for its source, as `(source, repost)` (for base files).
    pub(crate) fn waiting_reposts(&self) -> Vec<(i64, PendingRepost)> {
        let waiting = self.pending_videos.pin();
        waiting
            .iter()
            .flat_map(|(&source, reposts)| reposts.iter().map(move |&r| (source, r)))
            .collect()
    }

    /// Forgets the sources every waiting repost of which has expired at `g.now`.
    pub(crate) fn expire_waiting(&self, g: &Guards<'_>) {
        self.pending_videos.retain(
            |_, waiting| waiting.iter().any(|r| !self.expired(r.created_at, g.now)),
            &g.maps,
        );
    }

    // The fact directory of an author shard.

    /// Records the facts of `post`, of an author this shard does not own (its time checks
    /// passed): the tombstone and first-create-wins rules of a record apply. `None` when kept,
    /// or on a full store.
    pub(crate) fn insert_fact(&self, post: &CompactPost, g: &Guards<'_>) -> Option<DropReason> {
        let directory = self.directory.as_ref()?;
        directory.insert(post, || {
            self.drops_create(post.post_id, i64::from(post.created_at), g)
        })
    }

    /// Removes the fact of a deleted post (its tombstone is already written) and raises the
    /// tombstone's basis to the post's `created_at`, as removing a stored record does.
    fn forget_fact(&self, post_id: i64, g: &Guards<'_>) {
        if let Some(created_at) = self.directory.as_ref().and_then(|d| d.remove(post_id)) {
            self.raise_tombstone(post_id, i64::from(created_at), g);
        }
    }

    /// The unexpired facts at `now` of fact table `table` (of `FACT_SHARDS`), appended to
    /// `out` (for snapshots).
    pub(crate) fn copy_facts(&self, table: usize, now: i64, out: &mut Vec<FactRecord>) {
        if let Some(directory) = self.directory.as_ref() {
            directory.copy(table, |created_at| self.expired(created_at, now), out);
        }
    }

    /// Restores facts read from a snapshot by the rules of
    /// [`insert_fact`](Self::insert_fact): an expired fact is skipped, a live tombstone drops
    /// it (raising the basis), the first fact of an id wins. Restore tombstones first. The
    /// number restored.
    pub(crate) fn restore_facts(&self, facts: &[FactRecord], g: &Guards<'_>) -> usize {
        let Some(directory) = self.directory.as_ref() else {
            return 0;
        };
        directory.restore(
            facts,
            |created_at| self.expired(created_at, g.now),
            |post_id, created_at| self.drops_create(post_id, created_at, g),
        )
    }

    /// Frees the facts expired at `now`, in the fact tables `shard` (mod `TRIM_FRACTION`)
    /// stands for.
    pub(crate) fn trim_facts(&self, shard: usize, now: i64) {
        if let Some(directory) = self.directory.as_ref() {
            directory.trim(shard, |created_at| self.expired(created_at, now));
        }
    }

    /// The facts of `post_id`: from its stored record, or from the directory on a shard that
    /// does not own its author.
    #[inline]
    pub(crate) fn fact(&self, post_id: i64, epoch: &Guard) -> Option<Fact> {
        match self.lookup(post_id, epoch) {
            Some(record) => Some(Fact::of_record(&record)),
            None => self.directory.as_ref()?.get(post_id),
        }
    }

    /// True if `source` makes a repost of it video-eligible at `now`: an unexpired original or
    /// repost (not a reply) with its own video. The videos rule of `BEHAVIOUR.md`.
    #[inline]
    pub(crate) fn is_video_source(&self, source: &CompactPost, now: i64) -> bool {
        source.has_video && !source.is_reply && !self.expired(source.created_at, now)
    }

    /// The videos rule for a repost's source (see
    /// [`is_video_source`](Self::is_video_source)), wherever it is stored.
    #[inline]
    pub(crate) fn source_is_video(&self, source_post_id: i64, epoch: &Guard, now: i64) -> bool {
        match self.lookup(source_post_id, epoch) {
            Some(source) => self.is_video_source(&source, now),
            None => self
                .directory
                .as_ref()
                .and_then(|d| d.get(source_post_id))
                .is_some_and(|f| f.has_video_source_shape() && !self.expired(f.created_at, now)),
        }
    }

    // Sizes.

    /// True if nothing was ever loaded or inserted: no posts, authors, tombstones, waiting
    /// reposts or facts.
    pub(crate) fn is_fresh(&self) -> bool {
        self.arena.live() == 0
            && self.authors.live() == 0
            && self.tombstones.is_empty()
            && self.pending_videos.is_empty()
            && self.directory_stats().is_none_or(|d| d.facts == 0)
    }

    /// Current sizes (see [`StoreStats`]).
    pub(crate) fn stats(&self) -> StoreStats {
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

    /// [`stats`](Self::stats) with the counts recounted from the data (see
    /// `PostStore::recount`).
    pub(crate) fn recount(&self) -> StoreStats {
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
