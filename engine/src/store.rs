//! [`PostStore`]: the store's public face. Every method is a call into the part that does
//! the work, over the store's tables (`tables.rs`, private):
//! - the write path (`write.rs`): `insert_posts`, `mark_as_deleted`, `trim`;
//! - the read path (`query.rs`): `get_all_posts_by_users`, `get_videos_by_users`;
//! - the snapshot wing (`snapshot/`, with the bulk build of `bulk.rs`): `write_snapshot` and
//!   the `load_snapshot` family;
//! - an author shard's fact directory (`directory.rs`): `with_author_shard`,
//!   `directory_stats`.
//!
//! Any number of threads may call any method at once (see the crate docs, Consistency).

use crate::base::{BaseInfo, BasePages};
use crate::base_io::{self, BaseLoadReport, BaseSummary};
use crate::clock::{Clock, SystemClock};
use crate::config::{DEFAULT_RETENTION_SECS, MAX_POSTING_LIST_SIZE, TRIM_FRACTION};
use crate::explain::{self, Explanation};
use crate::feed_query::{FeedQuery, QueryOutcome};
use crate::post::{DeleteEvent, LightPost};
use crate::query::{self, Ask};
use crate::report::{
    DeleteReport, DirectoryStats, DropReason, InsertReport, StoreStats, TrimReport,
};
use crate::shard::ShardId;
use crate::snapshot::{self, LoadReport, SnapshotError, SnapshotMeta, SnapshotSummary};
use crate::tables::StoreTables;
use crate::write;
use std::io::{Read, Write};
use std::sync::Arc;

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

/// The post store: the newest posts of every author over the retention window, and the
/// reference's two questions about them.
#[derive(Debug)]
pub struct PostStore {
    tables: StoreTables,
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
        Self {
            tables: StoreTables::new(
                config.retention_secs,
                config.max_posting_list_size,
                config.clock,
            ),
        }
    }

    /// Makes this store one author shard: it keeps the full records of the authors `owns`
    /// accepts and, for every other author's post, only the facts the query rules read (see
    /// the `directory` module docs). Its answers for queries about its own authors then equal a
    /// full replica's given the same events, whatever authors the query also names.
    pub fn with_fact_directory(
        mut self,
        owns: impl Fn(i64) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.tables.make_shard(Box::new(owns), None);
        self
    }

    /// [`with_fact_directory`](Self::with_fact_directory) for shard `id` of a fleet: the same
    /// store, which also knows which shard it is, so it can write snapshots (their header
    /// records `id`) and refuses to load any snapshot not written by the same shard. `owns`
    /// must be the ownership rule of shard `id`.
    pub fn with_author_shard(
        mut self,
        id: ShardId,
        owns: impl Fn(i64) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.tables.make_shard(Box::new(owns), Some(id));
        self
    }

    /// The retention window in seconds.
    pub fn retention_secs(&self) -> i64 {
        self.tables.retention.secs()
    }

    /// The store clock's current time.
    pub fn now_secs(&self) -> i64 {
        self.tables.now_secs()
    }

    /// The shard this store is, if it was built with
    /// [`with_author_shard`](Self::with_author_shard); `None` for a full store.
    pub fn shard_id(&self) -> Option<ShardId> {
        self.tables.directory.id()
    }

    /// Sizes of the fact directory; `None` for a full (unsharded) store.
    pub fn directory_stats(&self) -> Option<DirectoryStats> {
        self.tables.directory.stats()
    }

    /// Stores a batch of new posts. See `BEHAVIOUR.md` for the exact rules.
    pub fn insert_posts(&self, batch: &[LightPost]) -> InsertReport {
        write::insert_posts(&self.tables, batch, |_, _| {})
    }

    /// [`insert_posts`](Self::insert_posts), calling `on_drop(index in batch, reason)` for
    /// every post it drops (time checks in batch order first, then the others in the order the
    /// batch is applied).
    pub fn insert_posts_with(
        &self,
        batch: &[LightPost],
        on_drop: impl FnMut(usize, DropReason),
    ) -> InsertReport {
        write::insert_posts(&self.tables, batch, on_drop)
    }

    /// Deletes posts: tombstones them and removes their records and timeline entries.
    pub fn mark_as_deleted(&self, events: &[DeleteEvent]) -> DeleteReport {
        write::mark_as_deleted(&self.tables, events)
    }

    /// Trims one author shard (`shard mod TRIM_FRACTION`) and expires tombstones.
    pub fn trim(&self, shard: usize) -> TrimReport {
        write::trim(&self.tables, shard)
    }

    /// Trims every shard once.
    pub fn trim_all(&self) -> TrimReport {
        (0..TRIM_FRACTION).map(|shard| self.trim(shard)).sum()
    }

    /// Sizes the post index at once for about `posts` posts, so that filling the store (a
    /// replay of a known backlog) never stops its writers to rehash the index on the way.
    /// Nothing if the index is that large already; the index still grows past it if needed.
    pub fn reserve_posts(&self, posts: usize) {
        self.tables.posts.reserve(posts);
    }

    /// The newest originals and replies+reposts of `query.authors` (reference rules §4.4–4.6).
    pub fn get_all_posts_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        query::run(&self.tables, query, Ask::AllPosts)
    }

    /// The newest video-eligible posts of `query.authors`, at most 100 per author; the
    /// per-author limits of `query` do not apply.
    pub fn get_videos_by_users(&self, query: &FeedQuery<'_>) -> QueryOutcome {
        query::run(&self.tables, query, Ask::Videos)
    }

    /// Explains the answer to `query` (a videos query with `videos`, as
    /// [`get_videos_by_users`](Self::get_videos_by_users) answers it) for each of `post_ids`:
    /// what the store holds of the post and where the answer holds it, or the first rule that
    /// kept it out, from the same query code that answers. It costs a query and, when a post
    /// is past `max_results`, the rest of the merge up to it (no deadline applies to that
    /// part); a caller bounds `post_ids`.
    pub fn explain(&self, query: &FeedQuery<'_>, videos: bool, post_ids: &[i64]) -> Explanation {
        let ask = if videos { Ask::Videos } else { Ask::AllPosts };
        explain::explain(&self.tables, query, ask, post_ids)
    }

    /// Current sizes (see [`StoreStats`]).
    pub fn stats(&self) -> StoreStats {
        self.tables.stats()
    }

    /// [`stats`](Self::stats) with the counts recounted from the data instead of read from
    /// the running counters: authors in use, live post records (a scan of every arena slot)
    /// and the entries of every in-use author's timelines. Walks the whole store; for checks
    /// and tests that the counters (and so the gauges) match what the store serves. Exact
    /// when nothing writes meanwhile.
    pub fn recount(&self) -> StoreStats {
        self.tables.recount()
    }

    /// Writes a snapshot of this store to `out` while it keeps serving (see the `snapshot`
    /// module docs). An author shard must know its identity
    /// ([`with_author_shard`](Self::with_author_shard)).
    ///
    /// `meta.offsets` must have been taken *before* this call: they are what a loader replays
    /// from. Posts expired at the start of the scan are left out. The scan holds no lock and no
    /// epoch pin (every slot read is validated): no reader or writer waits for it. Besides
    /// its 2 MiB chunk buffer it holds 8 bytes per post while it runs, to write the posts in
    /// timeline order. `out` is written in chunks of at most 2 MiB; the caller does the
    /// buffering, `fsync` and renaming.
    pub fn write_snapshot(
        &self,
        meta: &SnapshotMeta,
        out: impl Write,
    ) -> Result<SnapshotSummary, SnapshotError> {
        snapshot::write_snapshot(&self.tables, meta, out)
    }

    /// Writes this store as a base file (snapshot format version 3, see the `base` module
    /// docs) to `out` while it keeps serving: the head and the base under it merged per
    /// author, streamed author by author. As for [`write_snapshot`](Self::write_snapshot),
    /// `meta.offsets` must have been taken before this call, and the caller does the
    /// buffering, `fsync` and renaming. Besides one author's timelines at a time it holds the
    /// file's directory (about 85 bytes per author), its post index (about 11 bytes per post)
    /// and its videos references until the end.
    pub fn write_base(
        &self,
        meta: &SnapshotMeta,
        out: impl Write,
    ) -> Result<BaseSummary, SnapshotError> {
        base_io::write_base(&self.tables, meta, out)
    }

    /// Loads the base file `file` under this store, which must be fresh: the file is mapped
    /// (or copied, as `pages` says) and used where it lies, its tombstones, waiting reposts and
    /// facts restored into the store. Checks every checksum and the file's structure first
    /// (on `threads` threads): on any error nothing is loaded. The records themselves are
    /// checked by [`check_base`](Self::check_base), which a caller runs beside the serving
    /// store (it reads the whole file) or before it serves.
    ///
    /// The file must not change while the store uses it (until the store is dropped): a base
    /// file is written under a temporary name and renamed, never written in place, and a file
    /// truncated meanwhile would end the process (`SIGBUS`).
    pub fn load_base_file(
        &self,
        file: &std::fs::File,
        threads: usize,
        pages: BasePages,
    ) -> Result<BaseLoadReport, SnapshotError> {
        base_io::load_file(&self.tables, file, threads, pages)
    }

    /// [`load_base_file`](Self::load_base_file) of a base file held in memory (copied).
    pub fn load_base_bytes(
        &self,
        bytes: &[u8],
        threads: usize,
    ) -> Result<BaseLoadReport, SnapshotError> {
        base_io::load_bytes(&self.tables, bytes, threads)
    }

    /// Checks every record of the loaded base, on `threads` threads: each record and run,
    /// the post index, and the facts records embed of their parent or source (those it
    /// cannot confirm are looked up from then on). An error means the file cannot be trusted:
    /// its checksums held, so it was made so on purpose. Nothing to check without a base.
    pub fn check_base(&self, threads: usize) -> Result<(), SnapshotError> {
        match self.tables.base() {
            Some(base) => base.check_records(threads),
            None => Ok(()),
        }
    }

    /// What the loaded base holds; `None` without one.
    pub fn base_info(&self) -> Option<BaseInfo> {
        self.tables.base().map(crate::base::Base::info)
    }

    /// Loads a snapshot into this store, which should be empty, on `threads` threads (at least
    /// one). Reads and verifies the whole stream first: on any error the store is untouched.
    /// Refuses a snapshot written with a shorter retention than this store's (it would lack
    /// posts this store keeps), and one written by another author shard, or by a shard when
    /// this is a full store or the other way round (its posts and facts would be the wrong
    /// ones). Expired posts, facts and tombstones are skipped.
    ///
    /// A store nothing was ever put in is built in bulk (`bulk.rs`), with the result the
    /// per-post insert path would give; any other store, or a snapshot the bulk build
    /// refuses, goes through the per-post path ([`LoadReport::per_post_reason`] says why).
    pub fn load_snapshot(
        &self,
        input: impl Read,
        threads: usize,
    ) -> Result<LoadReport, SnapshotError> {
        snapshot::load_stream(&self.tables, input, threads, true, None)
    }

    /// [`load_snapshot`](Self::load_snapshot) of an input of `input_bytes` bytes (a file's
    /// length): the posts are read into one buffer sized from it, with no second copy.
    pub fn load_snapshot_sized(
        &self,
        input: impl Read,
        threads: usize,
        input_bytes: u64,
    ) -> Result<LoadReport, SnapshotError> {
        snapshot::load_stream(&self.tables, input, threads, true, Some(input_bytes))
    }

    /// [`load_snapshot`](Self::load_snapshot), with `allow_bulk = false` rebuilding through
    /// the per-post insert path even into a fresh store (to compare the two), and the input's
    /// length when known (see [`load_snapshot_sized`](Self::load_snapshot_sized)).
    pub fn load_snapshot_with(
        &self,
        input: impl Read,
        threads: usize,
        allow_bulk: bool,
        input_bytes: Option<u64>,
    ) -> Result<LoadReport, SnapshotError> {
        snapshot::load_stream(&self.tables, input, threads, allow_bulk, input_bytes)
    }

    /// [`load_snapshot`](Self::load_snapshot) of a snapshot file, read in place through a
    /// read-only mapping of it ([`load_snapshot_in_place`](Self::load_snapshot_in_place)):
    /// the posts are not copied out of the file first (at 20M posts, 1.27 GB of memory the
    /// load does not take). When the file cannot be mapped it is read as a stream
    /// ([`load_snapshot_sized`](Self::load_snapshot_sized)).
    ///
    /// The file must not change while it loads: a snapshot file is written under a temporary
    /// name and renamed, never written in place, and a file truncated by another process
    /// meanwhile would end the process (`SIGBUS`) rather than fail the load.
    pub fn load_snapshot_file(
        &self,
        file: &std::fs::File,
        threads: usize,
    ) -> Result<LoadReport, SnapshotError> {
        snapshot::load_file(&self.tables, file, threads)
    }

    /// [`load_snapshot_with`](Self::load_snapshot_with) of a snapshot held whole in memory (a
    /// mapped file): every chunk is verified where it lies, and the posts are decoded as the
    /// build reads them, with no copy of their own. A file whose posts are not in timeline
    /// order (written before they were) or whose posts chunks are not of one size is decoded
    /// first, as a stream would be.
    pub fn load_snapshot_in_place(
        &self,
        bytes: &[u8],
        threads: usize,
        allow_bulk: bool,
    ) -> Result<LoadReport, SnapshotError> {
        snapshot::load_in_place(&self.tables, bytes, threads, allow_bulk)
    }

    /// Refuses a snapshot written by another author shard than this store is (`written_by`,
    /// from its header), or by a shard when this is a full store or the other way round; a
    /// shard built without its identity loads none.
    pub fn check_snapshot_shard(&self, written_by: Option<ShardId>) -> Result<(), SnapshotError> {
        snapshot::check_shard(&self.tables, written_by)
    }

    /// The tables, for unit tests of the parts behind the face.
    #[cfg(test)]
    pub(crate) fn tables(&self) -> &StoreTables {
        &self.tables
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
            let g = store.tables.guards();
            deleted
                .clone()
                .filter(|&id| store.tables.tombstones.filter_passes(id, &g.epoch))
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
    use std::sync::atomic::{AtomicBool, Ordering};

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
        store.tables.posts.refuse_new_chunks();
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
                        for unit in 0..store.tables.posts.scan_chunks() {
                            store.tables.posts.scan_chunk(unit, |_, record| {
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
                    let record = store.tables.posts.lookup(id, &epoch).expect("stored");
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
