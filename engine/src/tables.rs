//! [`StoreTables`]: the store's tables, each behind its owner, and the orderings that span
//! two of them.
//!
//! The owners, each with its own narrow methods in its own file:
//! - [`Posts`] (`posts.rs`): the record arena and the `post_id -> slot` index;
//! - [`Authors`] (`authors.rs`): the authors and their three timelines, with the entry counts;
//! - [`Tombstones`] (`tombstones.rs`): the tombstones and the filter in front of them;
//! - [`WaitingReposts`] (`waiting.rs`): the reposts that wait for their source;
//! - [`FactDirectory`] (`directory.rs`): on an author shard, the facts of other authors' posts.
//!
//! The write path (`write.rs`), the read path (`query.rs`), the bulk build (`bulk.rs`) and the
//! snapshot wing talk to the owners they need through the fields. What spans two tables, in
//! an order, is here and only here:
//! - **publish, then check**: an insert publishes `post_id -> slot`, then re-checks the
//!   tombstones ([`publish_checked`](StoreTables::publish_checked));
//! - **tombstone, then remove**: a delete writes the tombstone, then removes `post_id -> slot`
//!   or, on a shard, the fact ([`tombstone_and_remove`](StoreTables::tombstone_and_remove));
//! - **wait, then look; store, then take**: a repost without its source waits, then looks the
//!   source up ([`wait_for_source`](StoreTables::wait_for_source)); a video source, once
//!   stored, takes the reposts that wait for it ([`take_waiting`](StoreTables::take_waiting));
//! - **entry out, then record released**: an entry that leaves a timeline (a cap eviction, an
//!   expiry) releases its record ([`index`](StoreTables::index),
//!   [`expire_entries`](StoreTables::expire_entries));
//! - **a record, else its fact**: the reply and videos rules read a post stored here or, on a
//!   shard, its fact ([`fact`](StoreTables::fact), [`source_is_video`](StoreTables::source_is_video)),
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

use crate::arena::{CompactPost, SlotId};
use crate::authors::{Author, Authors, Kind};
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
use std::sync::Arc;

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
        self.tombstones.write(post_id, basis, g);
        // Pairs with the fence in `publish_checked` (store-load: tombstone, then check).
        fence(Ordering::SeqCst);
        let record = match self.posts.remove(post_id, &g.epoch, retired) {
            Removal::Freed(record) => record,
            Removal::FreedElsewhere => return None,
            Removal::NotStored => {
                // On a shard: the fact of another author's post, raised to as a record is.
                if let Some(created_at) = self.directory.remove(post_id) {
                    self.tombstones.raise(post_id, i64::from(created_at), g);
                }
                return None;
            }
        };
        self.tombstones
            .raise(post_id, i64::from(record.created_at), g);
        Some(record)
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
    /// cap eviction releases the evicted entry's record.
    pub(crate) fn index(
        &self,
        author: &Author,
        kind: Kind,
        entry: TinyPost,
        epoch: &Guard,
        retired: &mut Vec<SlotId>,
    ) {
        if let Some(evicted) = self.authors.insert_entry(author, kind, entry, epoch) {
            self.posts
                .release(evicted.post_id, evicted.slot, kind.holder(), epoch, retired);
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
            })
            .count();
        (popped.len(), freed)
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

    /// The facts of `post_id`: from its stored record, or from the directory on a shard that
    /// does not own its author.
    #[inline]
    pub(crate) fn fact(&self, post_id: i64, epoch: &Guard) -> Option<Fact> {
        match self.posts.lookup(post_id, epoch) {
            Some(record) => Some(Fact::of_record(&record)),
            None => self.directory.get(post_id),
        }
    }

    /// The videos rule for a repost's source ([`RetentionWindow::is_video_source`]),
    /// wherever it is stored.
    #[inline]
    pub(crate) fn source_is_video(&self, source_post_id: i64, epoch: &Guard, now: i64) -> bool {
        match self.posts.lookup(source_post_id, epoch) {
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
    }

    /// Current sizes (see [`StoreStats`]).
    pub(crate) fn stats(&self) -> StoreStats {
        let epoch = crossbeam_epoch::pin();
        let mut stats = StoreStats::default();
        self.posts.add_stats(&mut stats, &epoch);
        self.authors.add_stats(&mut stats, &epoch);
        stats.tombstones = self.tombstones.len();
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
