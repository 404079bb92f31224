//! [`StoreTables`]: the store's tables, each behind its owner, and the orderings that span
//! two of them.
//!
//! The owners, each with its own narrow methods in its own file:
//! - [`Posts`] (`posts.rs`): the record arena and the `post_id -> slot` index;
//! - [`Authors`] (`authors.rs`): the authors and their three timelines, with the entry counts;
//! - [`Tombstones`] (`tombstones.rs`): the tombstones and the filter in front of them;
//! - [`WaitingReposts`] (`waiting.rs`): the reposts that wait for their source;
//! - [`FactDirectory`] (`directory.rs`): on an author shard, the facts of other authors' posts;
//! - [`Base`] (`base/`): once loaded, the base under the head: an immutable file of every
//!   author's timelines as they stood when it was written, and what changed since.
//!
//! The write path (`write.rs`), the read path (`query.rs`), the bulk build (`bulk.rs`) and the
//! snapshot wing talk to the owners they need through the fields. What spans two tables, in
//! an order, is here and only here:
//! - **publish, then check**: an insert publishes `post_id -> slot`, then re-checks the
//!   tombstones ([`publish_checked`](StoreTables::publish_checked));
//! - **tombstone, then remove**: a delete writes the tombstone, then removes `post_id -> slot`
//!   and the base's record, or, on a shard, the fact
//!   ([`tombstone_and_remove`](StoreTables::tombstone_and_remove));
//! - **wait, then look; store, then take**: a repost without its source waits, then looks the
//!   source up ([`wait_for_source`](StoreTables::wait_for_source)); a video source, once
//!   stored, takes the reposts that wait for it ([`take_waiting`](StoreTables::take_waiting));
//! - **entry out, then record released**: an entry that leaves a timeline (a cap eviction, an
//!   expiry) releases its record ([`index`](StoreTables::index),
//!   [`expire_entries`](StoreTables::expire_entries),
//!   [`expire_base_entries`](StoreTables::expire_base_entries)); an author's timeline is its
//!   head entries and its base entries together, and the cap counts both;
//! - **the head, else the base, else a fact**: the reply and videos rules read a post stored
//!   here (in the head, else in the base: [`lookup`](StoreTables::lookup)) or, on a shard, its
//!   fact ([`fact`](StoreTables::fact), [`source_is_video`](StoreTables::source_is_video)),
//!   and a fact is kept by the tombstone rule of a record ([`insert_fact`](StoreTables::insert_fact),
//!   [`restore_facts`](StoreTables::restore_facts)).
//!
//! The first two pairs keep concurrent inserts and deletes honest (bug 20 of the reference):
//! each side stores, then loads what the other stores, so whichever of a create and its
//! delete runs second sees the other's write: the create is either removed by the delete or
//! undone by itself, never left live. The repost pair is ordered the same way. Each pair is
//! ordered twice: by a SeqCst fence on each side, between its store and its load, and by the
//! post index's stripe lock, which the index write of one side and the index read of the
//! other both take (`TagIndex::insert_with`, `remove_where`, `get_locked`). Either alone
//! orders the pair; the fences keep it independent of how the index serialises its writers.
//! The loom models at the end of this file run these races on the real write and read paths.
//!
//! Concurrency: any number of threads may call any method at once. Readers take no lock.
//! Writers serialise per author only (the author's mutex guards its three timelines) and,
//! briefly, per index stripe.

use crate::arena::{CompactPost, IN_VIDEO, SlotId};
use crate::authors::{Author, Authors, Kind};
use crate::base::Base;
use crate::clock::Clock;
use crate::directory::{Fact, FactDirectory, FactRecord};
use crate::guards::{Guards, SmallMaps};
use crate::posts::{Posts, Removal};
use crate::report::{DropReason, StoreStats};
use crate::retention::RetentionWindow;
use crate::shard::ShardId;
use crate::sync::atomic::{Ordering, fence};
use crate::timeline::TinyPost;
use crate::tombstones::Tombstones;
use crate::waiting::{PendingRepost, WaitingReposts};
use crossbeam_epoch::Guard;
use std::sync::{Arc, OnceLock};

/// A post a delete removed: its record, and whether the head held it (its head timeline
/// entries are then the caller's to remove).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Removed {
    pub(crate) record: CompactPost,
    pub(crate) from_head: bool,
}

/// The store's tables (see the module docs).
#[derive(Debug)]
pub(crate) struct StoreTables {
    clock: Arc<dyn Clock>,
    /// How long posts and tombstones live.
    pub(crate) retention: RetentionWindow,
    pub(crate) posts: Posts,
    pub(crate) authors: Authors,
    pub(crate) tombstones: Tombstones,
    pub(crate) waiting: WaitingReposts,
    /// On an author shard: the facts of other authors' posts; empty on a full store.
    pub(crate) directory: FactDirectory,
    /// The base under the head, once one is loaded (into a fresh store, at most once).
    pub(crate) base: OnceLock<Base>,
}

impl StoreTables {
    /// Empty tables keeping `retention_secs` (at least 0) of posts, at most
    /// `max_posting_list_size` (clamped to 1 ..= 16384) entries per timeline, on `clock`.
    pub(crate) fn new(
        retention_secs: i64,
        max_posting_list_size: usize,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let retention = RetentionWindow::new(retention_secs);
        let maps = SmallMaps::new();
        Self {
            clock,
            retention,
            posts: Posts::new(),
            authors: Authors::new(max_posting_list_size),
            tombstones: Tombstones::new(&maps, retention),
            waiting: WaitingReposts::new(&maps, retention),
            directory: FactDirectory::unsharded(),
            base: OnceLock::new(),
        }
    }

    /// Makes these tables an author shard's: a fact directory for the authors `owns` rejects.
    pub(crate) fn make_shard(
        &mut self,
        owns: Box<dyn Fn(i64) -> bool + Send + Sync>,
        id: Option<ShardId>,
    ) {
        self.directory = FactDirectory::new(owns, id);
    }

    /// The store clock's current time.
    pub(crate) fn now_secs(&self) -> i64 {
        self.clock.now_secs()
    }

    /// Pins every table's reclaimer for one call, at the clock's time.
    pub(crate) fn guards(&self) -> Guards<'_> {
        Guards::pin(self.clock.now_secs(), self.tombstones.map())
    }

    /// Restores the tombstones of a snapshot being loaded, `entries` as `(post_id, basis)`
    /// through `decode`, into a map made large enough first, on up to `threads` threads: how
    /// many were live (the expired ones are skipped). Before the records, as for
    /// [`Tombstones::restore`].
    pub(crate) fn restore_tombstones<T: Sync>(
        &self,
        entries: &[T],
        decode: impl Fn(&T) -> (i64, i64) + Sync,
        threads: usize,
    ) -> u64 {
        /// Fewer tombstones than this a thread are restored on fewer threads.
        const MIN_PER_THREAD: usize = 16 * 1024;
        self.tombstones.reserve(entries.len(), &self.guards());
        let per_thread = entries.len().div_ceil(threads.max(1)).max(MIN_PER_THREAD);
        crate::parallel::on_each(entries.chunks(per_thread), |chunk| {
            let g = self.guards();
            chunk
                .iter()
                .map(|entry| {
                    let (post_id, basis) = decode(entry);
                    u64::from(self.tombstones.restore(post_id, basis, &g))
                })
                .sum::<u64>()
        })
        .into_iter()
        .sum()
    }

    /// Publishes `record` ([`Posts::publish`]), then checks the tombstones again (after the
    /// fence that pairs with [`tombstone_and_remove`](Self::tombstone_and_remove)): a post
    /// deleted meanwhile is taken back (`Tombstoned`, its tombstone's basis raised as for any
    /// dropped create). Check the tombstones once before: most deleted posts stop there.
    #[inline]
    pub(crate) fn publish_checked(
        &self,
        record: &CompactPost,
        holders: u32,
        g: &Guards<'_>,
        retired: &mut Vec<SlotId>,
    ) -> Result<SlotId, DropReason> {
        let post_id = record.post_id;
        let slot = self.posts.publish(record, holders, &g.epoch)?;
        // Pairs with the fence in `tombstone_and_remove` (store-load: publish, then check).
        fence(Ordering::SeqCst);
        if self
            .tombstones
            .drops_create(post_id, i64::from(record.created_at), g)
        {
            self.posts.unpublish(post_id, slot, &g.epoch, retired);
            return Err(DropReason::Tombstoned);
        }
        Ok(slot)
    }

    /// Tombstones `post_id` with `basis` (keeping a later basis it has), then removes its
    /// stored record (after the fence that pairs with
    /// [`publish_checked`](Self::publish_checked)) from the head and from the base, or on a
    /// shard its fact, and raises the basis to the removed post's `created_at`. The removed
    /// post, when this call removed it; its head timeline entries (`Removed::from_head`) are
    /// the caller's to remove, its base entries are gone already.
    pub(crate) fn tombstone_and_remove(
        &self,
        post_id: i64,
        basis: i64,
        g: &Guards<'_>,
        retired: &mut Vec<SlotId>,
    ) -> Option<Removed> {
        self.tombstones.write(post_id, basis, g);
        // Pairs with the fence in `publish_checked` (store-load: tombstone, then check).
        fence(Ordering::SeqCst);
        let head = self.posts.remove(post_id, &g.epoch, retired);
        // A post can be in both tiers: a repost of the base that joined its videos timeline
        // in the head after the base was written (`write.rs`, promotions).
        let in_base = self.base().and_then(|base| base.delete(post_id));
        let removed = match (head, in_base) {
            (Removal::Freed(record), _) => Removed {
                record,
                from_head: true,
            },
            (_, Some(record)) => Removed {
                record,
                from_head: false,
            },
            (Removal::FreedElsewhere, None) => return None,
            (Removal::NotStored, None) => {
                // On a shard: the fact of another author's post, raised to as a record is.
                if let Some(created_at) = self.directory.remove(post_id) {
                    self.tombstones.raise(post_id, i64::from(created_at), g);
                }
                return None;
            }
        };
        self.tombstones
            .raise(post_id, i64::from(removed.record.created_at), g);
        Some(removed)
    }

    /// Remembers `repost` as waiting for `source`, then (after the fence that pairs with
    /// [`take_waiting`](Self::take_waiting)) looks the source up: either its insert sees the
    /// repost waiting or this sees it stored. The source's record, if stored.
    pub(crate) fn wait_for_source(
        &self,
        source: i64,
        repost: PendingRepost,
        g: &Guards<'_>,
    ) -> Option<CompactPost> {
        self.waiting.add(source, repost, g);
        // Pairs with the fence in `take_waiting`.
        fence(Ordering::SeqCst);
        // A locked lookup: ordered with the source's publish by the stripe lock as well.
        self.posts.lookup_locked(source, &g.epoch)
    }

    /// The reposts that waited for `post_id` (a video source just stored), no longer waiting.
    pub(crate) fn take_waiting<'g>(
        &self,
        post_id: i64,
        g: &'g Guards<'_>,
    ) -> Option<&'g [PendingRepost]> {
        // Pairs with the fence in `wait_for_source`.
        fence(Ordering::SeqCst);
        self.waiting.take(post_id, g)
    }

    /// Inserts `entry` into `author`'s `kind` timeline, whose writer lock the caller holds; a
    /// cap eviction releases the evicted entry's record. With a base, the cap counts the
    /// author's base entries of that kind too, and evicts the oldest entry of either tier.
    pub(crate) fn index(
        &self,
        author: &Author,
        kind: Kind,
        entry: TinyPost,
        epoch: &Guard,
        retired: &mut Vec<SlotId>,
    ) {
        let cap = self.authors.cap();
        let mut head_cap = cap;
        if let Some(base) = self.base()
            && let Some(at) = base.line_of(author.author_id())
        {
            let in_base = base.live_len(at, kind as usize);
            let in_head = author.timeline(kind).len(epoch);
            head_cap = cap.saturating_sub(in_base);
            if in_base > 0 && in_head + in_base >= cap {
                // Full: the oldest entry of the whole timeline leaves, from either tier, or
                // the new entry itself when it is older than all of them.
                let base_oldest = base.oldest_live(at, kind as usize);
                let head_oldest = author.timeline(kind).oldest(epoch).map(|e| e.key());
                let older = |a: Option<(u32, i64)>, b: Option<(u32, i64)>| match (a, b) {
                    (Some(a), Some(b)) => a < b,
                    (a, _) => a.is_some(),
                };
                if older(base_oldest, head_oldest) && older(base_oldest, Some(entry.key())) {
                    let mut once = true;
                    base.cut_oldest(
                        at,
                        kind as usize,
                        |_| std::mem::take(&mut once),
                        |post_id| self.posts.lookup(post_id, epoch).is_some(),
                    );
                    head_cap += 1;
                } else if older(Some(entry.key()), head_oldest) {
                    // The new entry is the oldest: it leaves at once.
                    self.posts
                        .release(entry.post_id, entry.slot, kind.holder(), epoch, retired);
                    return;
                }
            }
        }
        if let Some(evicted) =
            self.authors
                .insert_entry(author, kind, entry, head_cap.max(1), epoch)
        {
            self.posts
                .release(evicted.post_id, evicted.slot, kind.holder(), epoch, retired);
        }
    }

    /// Removes the expired entries at `now` from `author`'s `kind` timeline, whose writer lock
    /// the caller holds, and releases their records: `(entries removed, records freed)`. A
    /// record the base still stores (a repost of the base that joined its videos timeline in
    /// the head) is not freed by losing its head entry.
    pub(crate) fn expire_entries(
        &self,
        author: &Author,
        kind: Kind,
        now: i64,
        epoch: &Guard,
        retired: &mut Vec<SlotId>,
    ) -> (usize, usize) {
        let retention = self.retention;
        let popped = self.authors.pop_expired(
            author,
            kind,
            |e| retention.expired(e.created_at, now),
            epoch,
        );
        let freed = popped
            .iter()
            .filter(|e| {
                self.posts
                    .release(e.post_id, e.slot, kind.holder(), epoch, retired)
                    && !(kind.holder() == IN_VIDEO
                        && self.base().is_some_and(|b| b.stored(e.post_id).is_some()))
            })
            .count();
        (popped.len(), freed)
    }

    /// Removes the expired entries at `now` of the base runs of the authors of trim shard
    /// `shard`: `(entries removed, records freed)`. A record the head still holds (a copy in
    /// its videos timeline) is not freed by losing its base entries.
    pub(crate) fn expire_base_entries(
        &self,
        shard: i64,
        now: i64,
        epoch: &Guard,
    ) -> (usize, usize) {
        let Some(base) = self.base() else {
            return (0, 0);
        };
        let retention = self.retention;
        let (mut entries, mut freed) = (0, 0);
        base.for_each_author_in(shard, |at| {
            for kind in Kind::ALL {
                let (cut, gone) = base.cut_oldest(
                    at,
                    kind as usize,
                    |(created_at, _)| retention.expired(created_at, now),
                    |post_id| self.posts.lookup(post_id, epoch).is_some(),
                );
                entries += cut;
                freed += gone;
            }
        });
        (entries, freed)
    }

    /// The base and `author_id`'s line in it, if the base holds the author.
    #[inline]
    pub(crate) fn base_line(&self, author_id: i64) -> Option<(&Base, usize)> {
        let base = self.base()?;
        Some((base, base.line_of(author_id)?))
    }

    /// Whether `author_id` still has entries in a base run.
    pub(crate) fn in_base(&self, author_id: i64) -> bool {
        self.base_line(author_id).is_some_and(|(base, at)| {
            Kind::ALL
                .iter()
                .any(|&kind| base.live_len(at, kind as usize) > 0)
        })
    }

    /// Records the facts of `post`, of an author this shard does not own (its time checks
    /// passed): the tombstone and first-create-wins rules of a record apply. `None` when kept,
    /// or on a full store.
    pub(crate) fn insert_fact(&self, post: &CompactPost, g: &Guards<'_>) -> Option<DropReason> {
        self.directory.insert(post, || {
            self.tombstones
                .drops_create(post.post_id, i64::from(post.created_at), g)
        })
    }

    /// Restores facts read from a snapshot by the rules of
    /// [`insert_fact`](Self::insert_fact): an expired fact is skipped, a live tombstone drops
    /// it (raising the basis), the first fact of an id wins. Restore tombstones first. The
    /// number restored.
    pub(crate) fn restore_facts(&self, facts: &[FactRecord], g: &Guards<'_>) -> usize {
        self.directory.restore(
            facts,
            |created_at| self.retention.expired(created_at, g.now),
            |post_id, created_at| self.tombstones.drops_create(post_id, created_at, g),
        )
    }

    /// The base under the head, if one is loaded.
    #[inline]
    pub(crate) fn base(&self) -> Option<&Base> {
        self.base.get()
    }

    /// `post_id`'s stored record: the head's, else the base's (a post in both tiers is the
    /// same record).
    #[inline]
    pub(crate) fn lookup(&self, post_id: i64, epoch: &Guard) -> Option<CompactPost> {
        self.posts
            .lookup(post_id, epoch)
            .or_else(|| Some(self.base()?.stored(post_id)?.1.post))
    }

    /// The facts of `post_id`: from its stored record (head, else base), or from the
    /// directory on a shard that does not own its author.
    #[inline]
    pub(crate) fn fact(&self, post_id: i64, epoch: &Guard) -> Option<Fact> {
        match self.lookup(post_id, epoch) {
            Some(record) => Some(Fact::of_record(&record)),
            None => self.directory.get(post_id),
        }
    }

    /// The videos rule for a repost's source ([`RetentionWindow::is_video_source`]),
    /// wherever it is stored.
    #[inline]
    pub(crate) fn source_is_video(&self, source_post_id: i64, epoch: &Guard, now: i64) -> bool {
        match self.lookup(source_post_id, epoch) {
            Some(source) => self.retention.is_video_source(&source, now),
            None => self.directory.get(source_post_id).is_some_and(|f| {
                f.has_video_source_shape() && !self.retention.expired(f.created_at, now)
            }),
        }
    }

    /// True if nothing was ever loaded or inserted: no posts, authors, tombstones, waiting
    /// reposts or facts.
    pub(crate) fn is_fresh(&self) -> bool {
        self.posts.live() == 0
            && self.authors.is_empty()
            && self.tombstones.is_empty()
            && self.waiting.is_empty()
            && self.directory.stats().is_none_or(|d| d.facts == 0)
            && self.base().is_none()
    }

    /// Current sizes (see [`StoreStats`]).
    pub(crate) fn stats(&self) -> StoreStats {
        let epoch = crossbeam_epoch::pin();
        let mut stats = StoreStats::default();
        self.posts.add_stats(&mut stats, &epoch);
        self.authors.add_stats(&mut stats, &epoch);
        stats.tombstones = self.tombstones.len();
        if let Some(base) = self.base() {
            base.add_stats(&mut stats);
        }
        stats
    }

    /// [`stats`](Self::stats) with the counts recounted from the data (see
    /// `PostStore::recount`).
    pub(crate) fn recount(&self) -> StoreStats {
        let mut stats = self.stats();
        let (authors, entries) = self.authors.recount(&crossbeam_epoch::pin());
        stats.authors = authors;
        stats.posts = self.posts.recount();
        stats.original_entries = entries[Kind::Originals as usize];
        stats.secondary_entries = entries[Kind::Secondary as usize];
        stats.video_entries = entries[Kind::Videos as usize];
        stats.tombstones = self.tombstones.recount();
        if let Some(base) = self.base() {
            base.add_recount(&mut stats);
        }
        stats
    }
}

/// Loom models of the orderings above, on the real write and read paths (`write.rs`,
/// `query.rs`) over real tables (`RUSTFLAGS="--cfg thunder_loom" cargo test --lib loom`, see
/// `crate::sync`): each explores the interleavings and weak-memory outcomes of two threads.
/// What loom sees: the arena, the post and author indexes, the timelines' rings and summaries,
/// the tombstone filter, the counters and every lock; what it does not: the papaya maps (the
/// tombstones and the waiting reposts, whose operations it runs as if atomic) and
/// crossbeam-epoch (a ring's buffer pointer). Under loom a freed slot is reused at once
/// (`Arena::retire`), so a reader that races a delete also races the reuse of its slot.
#[cfg(all(test, thunder_loom))]
mod loom_tests {
    use crate::clock::ManualClock;
    use crate::feed_query::FeedQuery;
    use crate::post::{DeleteEvent, LightPost};
    use crate::report::{DeleteReport, InsertReport};
    use crate::store::PostStore;
    use crate::sync::atomic::{AtomicBool, Ordering};
    use loom::sync::Arc;
    use loom::thread::{self, JoinHandle};

    const NOW: i64 = 1_000_000;
    const RETENTION: i64 = 1000;

    /// Runs `f` under loom. Each execution runs the write and read paths whole, some
    /// thousands of steps: more than loom's default bound on one execution's branches (1000),
    /// which `LOOM_MAX_BRANCHES` still overrides.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
            builder.max_branches = 20_000;
        }
        builder.check(f);
    }

    /// A store on a clock standing at `NOW`, and that clock.
    fn store() -> (Arc<PostStore>, std::sync::Arc<ManualClock>) {
        let clock = std::sync::Arc::new(ManualClock::new(NOW));
        let store = PostStore::with_clock(RETENTION, clock.clone());
        (Arc::new(store), clock)
    }

    fn delete(post_id: i64) -> DeleteEvent {
        DeleteEvent {
            post_id,
            deleted_at: NOW,
        }
    }

    /// Post 1 of author 10, a video, and post 2 of author 20, a repost of it without a video
    /// of its own.
    fn source_and_repost() -> (LightPost, LightPost) {
        let source = LightPost {
            has_video: true,
            ..LightPost::original(1, 10, NOW - 5)
        };
        let repost = LightPost {
            is_retweet: true,
            source_post_id: Some(1),
            source_user_id: Some(10),
            ..LightPost::original(2, 20, NOW - 4)
        };
        (source, repost)
    }

    /// A thread that inserts `post` into `store`.
    fn spawn_insert(store: &Arc<PostStore>, post: LightPost) -> JoinHandle<InsertReport> {
        let store = Arc::clone(store);
        thread::spawn(move || store.insert_posts(&[post]))
    }

    /// A thread that deletes `post_id` from `store`.
    fn spawn_delete(store: &Arc<PostStore>, post_id: i64) -> JoinHandle<DeleteReport> {
        let store = Arc::clone(store);
        thread::spawn(move || store.mark_as_deleted(&[delete(post_id)]))
    }

    /// True if `store` holds a record of `post_id`.
    fn is_stored(store: &PostStore, post_id: i64) -> bool {
        let epoch = crossbeam_epoch::pin();
        store.tables().posts.lookup(post_id, &epoch).is_some()
    }

    /// The posts the store answers for `author`'s feed (`videos`: its videos).
    fn answer(store: &PostStore, author: i64, videos: bool) -> Vec<LightPost> {
        let query = FeedQuery::new(0, std::slice::from_ref(&author));
        let outcome = if videos {
            store.get_videos_by_users(&query)
        } else {
            store.get_all_posts_by_users(&query)
        };
        outcome.posts
    }

    /// Every count the store keeps matches its contents, and once everything has expired and
    /// been trimmed nothing is left: no record held by a timeline entry that is gone, no entry
    /// whose record is gone.
    fn check_consistent_and_empty_after_expiry(store: &PostStore, clock: &ManualClock) {
        assert_eq!(store.stats(), store.recount());
        clock.advance(RETENTION + 1);
        store.trim_all();
        let stats = store.stats();
        assert_eq!(stats, store.recount());
        assert_eq!(
            (stats.posts, stats.authors, stats.tombstones),
            (0, 0, 0),
            "{stats:?}"
        );
    }

    /// A create racing its delete: whichever runs second sees the other (publish, then check;
    /// tombstone, then remove), so the post is never left live, in the index or in a
    /// timeline, and the tombstone still drops a later create.
    #[test]
    fn loom_a_create_racing_its_delete_is_never_left_live() {
        model(|| {
            let (store, clock) = store();
            let post = LightPost::original(1, 10, NOW - 5);
            let creator = spawn_insert(&store, post);
            let deleted = store.mark_as_deleted(&[delete(1)]);
            let created = creator.join().unwrap();
            assert_eq!(created.inserted + created.tombstoned, 1, "{created:?}");
            // A create that went through was removed by the delete.
            assert!(
                created.inserted <= deleted.removed,
                "{created:?} {deleted:?}"
            );
            assert!(answer(&store, 10, false).is_empty());
            assert!(!is_stored(&store, 1));
            assert_eq!(store.insert_posts(&[post]).tombstoned, 1);
            check_consistent_and_empty_after_expiry(&store, &clock);
        });
    }

    /// A query racing a delete and the reuse of the deleted post's slot by the next post
    /// (same slot class, every field different): it serves whole posts only, and once the
    /// delete has returned (as the query saw it) never the deleted one.
    #[test]
    fn loom_a_query_racing_a_delete_serves_whole_posts_and_never_a_deleted_one() {
        model(|| {
            let (store, clock) = store();
            let first = LightPost::original(1, 10, NOW - 5);
            let second = LightPost {
                conversation_id: Some(77),
                has_video: true,
                ..LightPost::original(2, 10, NOW - 4)
            };
            assert_eq!(store.insert_posts(&[first]).inserted, 1);
            let deleted = Arc::new(AtomicBool::new(false));
            let reader = {
                let (store, deleted) = (Arc::clone(&store), Arc::clone(&deleted));
                thread::spawn(move || {
                    // Acquire pairs with the Release store after the delete: a query that
                    // begins after the delete returned.
                    let after_delete = deleted.load(Ordering::Acquire);
                    (after_delete, answer(&store, 10, false))
                })
            };
            assert_eq!(store.mark_as_deleted(&[delete(1)]).removed, 1);
            deleted.store(true, Ordering::Release);
            // Takes post 1's slot: loom's `Arena::retire` hands it back at once.
            assert_eq!(store.insert_posts(&[second]).inserted, 1);
            let (after_delete, served) = reader.join().unwrap();
            for post in &served {
                assert!(*post == first || *post == second, "served {post:?}");
            }
            assert!(
                !(after_delete && served.contains(&first)),
                "served {served:?} after the delete"
            );
            assert_eq!(answer(&store, 10, false), [second]);
            check_consistent_and_empty_after_expiry(&store, &clock);
        });
    }

    /// A repost (without its own video) racing the arrival of its video source: either the
    /// repost finds the source stored or the source finds the repost waiting (wait, then
    /// look; store, then take), so the repost ends in its author's videos, once.
    #[test]
    fn loom_a_repost_racing_its_source_joins_the_videos_once() {
        model(|| {
            let (store, clock) = store();
            let (source, repost) = source_and_repost();
            let reposter = spawn_insert(&store, repost);
            assert_eq!(store.insert_posts(&[source]).inserted, 1);
            assert_eq!(reposter.join().unwrap().inserted, 1);
            assert_eq!(answer(&store, 20, true), [repost]);
            assert_eq!(store.stats().video_entries, 2);
            check_consistent_and_empty_after_expiry(&store, &clock);
        });
    }

    /// A repost racing its video source's arrival and the source's delete, three threads: the
    /// source's create and delete race as in the first model (its record is never left live),
    /// the repost ends in the feed but is no video, and every hold the repost's record took is
    /// released with the entry that took it.
    #[test]
    fn loom_a_repost_racing_its_source_and_the_source_delete_leaves_no_video() {
        model(|| {
            let (store, clock) = store();
            let (source, repost) = source_and_repost();
            let reposter = spawn_insert(&store, repost);
            let deleter = spawn_delete(&store, 1);
            let created = store.insert_posts(&[source]);
            let deleted = deleter.join().unwrap();
            assert!(
                created.inserted <= deleted.removed,
                "{created:?} {deleted:?}"
            );
            assert_eq!(reposter.join().unwrap().inserted, 1);
            assert!(!is_stored(&store, 1));
            assert!(answer(&store, 20, true).is_empty());
            assert_eq!(answer(&store, 20, false), [repost]);
            check_consistent_and_empty_after_expiry(&store, &clock);
        });
    }
}

#[cfg(all(test, not(thunder_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    /// A load's tombstones restored on several threads: the live ones all there with their
    /// basis, the expired ones skipped and counted out, as one thread restores them.
    #[test]
    fn tombstones_restored_on_several_threads_are_those_one_thread_restores() {
        const NOW: i64 = 1_700_000_000;
        const RETENTION: i64 = 1000;
        let tables = StoreTables::new(RETENTION, 100, Arc::new(ManualClock::new(NOW)));
        // Every third one expired; enough for four threads of at least 16k each.
        let entries: Vec<(i64, i64)> = (0..70_000i64)
            .map(|id| {
                let age = if id % 3 == 0 { RETENTION + 5 } else { id % 500 };
                (id * 7 + 1, NOW - age)
            })
            .collect();
        let live = tables.restore_tombstones(&entries, |&e| e, 4);
        assert_eq!(
            live,
            entries
                .iter()
                .filter(|(id, _)| (id - 1) / 7 % 3 != 0)
                .count() as u64
        );
        let g = tables.guards();
        for &(post_id, basis) in &entries {
            let want = ((post_id - 1) / 7 % 3 != 0).then_some(basis);
            assert_eq!(tables.tombstones.live(post_id, &g), want, "{post_id}");
        }
    }
}
