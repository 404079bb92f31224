//! Loading a snapshot into a store: read and verify everything first (streamed or in place),
//! then restore the tombstones and facts and build the store from the unexpired posts, in
//! bulk or through the per-post insert path (see the wing's doc, Loading).

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::format::*;
use super::mapped::{InPlace, MappedPosts, check_posts_chunks};
use super::order::{in_timeline_order, in_timeline_order_already};
use super::reader::{Chunk, PostsInto, SnapshotReader};
use crate::arena::CompactPost;
use crate::bulk::{BulkRefusal, PostSource, bulk_load};
use crate::directory::FactRecord;
use crate::report::InsertReport;
use crate::shard::ShardId;
use crate::tables::StoreTables;
use crate::write;

/// What loading a snapshot did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadReport {
    /// The header read.
    pub header: SnapshotHeader,
    /// What the file held.
    pub counts: SnapshotCounts,
    /// Posts stored.
    pub posts_loaded: u64,
    /// Posts skipped because they expired since the snapshot (or were dropped by the insert
    /// rules: see [`LoadReport::inserts`]).
    pub posts_skipped: u64,
    /// Tombstones restored.
    pub tombstones_loaded: u64,
    /// Tombstones skipped because they expired since the snapshot.
    pub tombstones_expired: u64,
    /// Facts restored into the fact directory (author shards).
    pub facts_loaded: u64,
    /// Facts skipped: expired since the snapshot (or dropped by a tombstone).
    pub facts_skipped: u64,
    /// The insert report of the posts handed to the store.
    pub inserts: InsertReport,
    /// `None` when the store was built in bulk, else why the per-post insert path rebuilt it.
    pub per_post_reason: Option<BulkRefusal>,
    /// Time spent reading and verifying the stream.
    pub read_duration: Duration,
    /// Time spent rebuilding the store from it.
    pub build_duration: Duration,
}

/// What a load read and verified, before it builds.
struct ReadSnapshot {
    header: SnapshotHeader,
    counts: SnapshotCounts,
    tombstones: Vec<(i64, i64)>,
    facts: Vec<FactRecord>,
    /// Whether the store was fresh before anything was restored into it.
    fresh: bool,
    read_duration: Duration,
}

impl ReadSnapshot {
    /// What `reader` read, since `started`.
    fn new<R: Read>(
        reader: SnapshotReader<R>,
        tombstones: Vec<(i64, i64)>,
        facts: Vec<FactRecord>,
        fresh: bool,
        started: Instant,
    ) -> Self {
        Self {
            header: reader.header,
            counts: reader.counts,
            tombstones,
            facts,
            fresh,
            read_duration: started.elapsed(),
        }
    }

    /// The load's report: `restored` tombstones and facts, the build's inserts and per-post
    /// reason, of `total_posts` posts read (expired ones included), built since `building`.
    fn report(
        self,
        restored: (u64, u64),
        (inserts, per_post_reason): (InsertReport, Option<BulkRefusal>),
        total_posts: u64,
        building: Instant,
    ) -> LoadReport {
        let (tombstones_loaded, facts_loaded) = restored;
        LoadReport {
            posts_loaded: inserts.inserted as u64,
            posts_skipped: total_posts - inserts.inserted as u64,
            tombstones_loaded,
            tombstones_expired: self.tombstones.len() as u64 - tombstones_loaded,
            facts_loaded,
            facts_skipped: self.facts.len() as u64 - facts_loaded,
            inserts,
            per_post_reason,
            read_duration: self.read_duration,
            build_duration: building.elapsed(),
            header: self.header,
            counts: self.counts,
        }
    }
}

/// Refuses more posts than the build's `u32` ranks can number.
fn check_post_count(posts: usize) -> Result<(), SnapshotError> {
    if posts > u32::MAX as usize {
        return Err(SnapshotError::Incompatible(
            "more than 2^32 posts in one snapshot".into(),
        ));
    }
    Ok(())
}

/// The number of posts at the front of `posts` (in timeline order) that are `expired`.
pub(super) fn first_unexpired<P: PostSource + ?Sized>(
    posts: &P,
    expired: impl Fn(u32) -> bool,
) -> usize {
    let (mut low, mut high) = (0, posts.len());
    while low < high {
        let mid = low + (high - low) / 2;
        if expired(posts.post(mid).created_at) {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    low
}

/// Loads a snapshot from a stream into the store of `tables` (`PostStore::load_snapshot_with`).
pub(crate) fn load_stream(
    tables: &StoreTables,
    input: impl Read,
    threads: usize,
    allow_bulk: bool,
    input_bytes: Option<u64>,
) -> Result<LoadReport, SnapshotError> {
    let started = Instant::now();
    let mut reader = SnapshotReader::new(input)?;
    check_loadable(tables, &reader.header)?;
    // Only a store nothing was ever put in can be built in bulk.
    let fresh = tables.is_fresh();
    let mut tombstones = Vec::new();
    let mut facts = Vec::new();
    // The posts go into one allocation of their final size: growing a vector of a
    // gigabyte by doubling copies it again and faults in fresh pages each time. With the
    // input's length the buffer is reserved up front for as many posts as the input could
    // hold (pages more than 64 MiB beyond the posts read are never touched) and each
    // chunk is appended as it is read, its buffer reused for the next; without it the
    // chunks are kept and copied once at the end (also when the reservation is refused:
    // a length is only a hint, and no allocation failure should abort the process here).
    //
    // With more than one thread, another faults the reserved pages in ahead of the
    // decoding (the kernel clearing them was about half of the read phase). The vector
    // does not move meanwhile: chunks are appended to it only within its capacity, and
    // the scope ends before anything else changes it.
    let mut posts = Vec::new();
    if let Some(bytes) = input_bytes {
        let most = usize::try_from(bytes).unwrap_or(usize::MAX) / POST_BYTES;
        let _ = posts.try_reserve_exact(most);
    }
    let mut post_chunks = Vec::new();
    let region = (
        posts.as_ptr() as usize,
        posts.capacity() * size_of::<CompactPost>(),
    );
    let (written, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
    std::thread::scope(|scope| {
        if threads > 1 && region.1 > 0 {
            let (written, stop) = (&written, &stop);
            scope.spawn(move || {
                crate::huge_memory::populate_ahead(region.0, region.1, written, stop)
            });
        }
        let read = (|| -> Result<(), SnapshotError> {
            loop {
                // In file order: once a chunk did not fit, every later one waits too.
                let into = post_chunks.is_empty().then_some(&mut posts);
                match reader.next_chunk(PostsInto::Decoded(into))? {
                    Chunk::Tombstones(chunk) => tombstones.extend(chunk),
                    Chunk::Facts(chunk) => facts.extend(chunk),
                    Chunk::PostsAppended => {
                        // Relaxed: a progress hint for the populating thread.
                        let bytes = posts.len() * size_of::<CompactPost>();
                        written.store(bytes, Ordering::Relaxed);
                    }
                    Chunk::Posts(chunk) => post_chunks.push(chunk),
                    Chunk::PostsChecked | Chunk::PostsUnchecked | Chunk::End => return Ok(()),
                }
            }
        })();
        stop.store(true, Ordering::Relaxed);
        read
    })?;
    if !post_chunks.is_empty() {
        posts.reserve_exact(post_chunks.iter().map(Vec::len).sum());
        for chunk in post_chunks {
            posts.extend(chunk);
        }
    }
    check_post_count(posts.len())?;
    let read = ReadSnapshot::new(reader, tombstones, facts, fresh, started);
    load_decoded(tables, read, posts, threads, allow_bulk, Instant::now())
}

/// Loads a snapshot file into the store of `tables`, in place through a read-only mapping
/// when it can be mapped, else as a stream (`PostStore::load_snapshot_file`, which says what
/// the file must do meanwhile).
pub(crate) fn load_file(
    tables: &StoreTables,
    file: &std::fs::File,
    threads: usize,
) -> Result<LoadReport, SnapshotError> {
    // SAFETY: the mapping is read-only and lives until this call returns, and nothing
    // borrowed from it outlives the call (the store copies what it keeps). Snapshot files
    // are never written in place (see above); that the file stays as it is while it
    // loads is this function's documented requirement.
    let mapped = unsafe { memmap2::MmapOptions::new().map(file) };
    match mapped {
        Ok(map) => {
            // The first pass reads it front to back.
            let _ = map.advise(memmap2::Advice::Sequential);
            load_in_place(tables, &map, threads, true)
        }
        Err(_) => {
            let bytes = file.metadata()?.len();
            let input = io::BufReader::with_capacity(1 << 20, file);
            load_stream(tables, input, threads, true, Some(bytes))
        }
    }
}

/// Loads a snapshot held whole in memory into the store of `tables`, verified and decoded
/// where it lies (`PostStore::load_snapshot_in_place`).
pub(crate) fn load_in_place(
    tables: &StoreTables,
    bytes: &[u8],
    threads: usize,
    allow_bulk: bool,
) -> Result<LoadReport, SnapshotError> {
    let started = Instant::now();
    let mut reader = SnapshotReader::new(bytes)?;
    check_loadable(tables, &reader.header)?;
    let fresh = tables.is_fresh();
    let (mut tombstones, mut facts, mut unchecked) = (Vec::new(), Vec::new(), Vec::new());
    let threads = threads.max(1);
    loop {
        match reader.next_chunk_in_place() {
            Ok(InPlace::Tombstones(chunk)) => tombstones.extend(chunk),
            Ok(InPlace::Facts(chunk)) => facts.extend(chunk),
            Ok(InPlace::Posts(chunk)) => unchecked.push(chunk),
            Ok(InPlace::End) => break,
            Err(error) => {
                // A bad posts chunk before this one is the first error, as in a stream.
                check_posts_chunks(&unchecked, threads)?;
                return Err(error);
            }
        }
    }
    check_posts_chunks(&unchecked, threads)?;
    let chunks: Vec<&[u8]> = unchecked.iter().map(|chunk| chunk.records).collect();
    let posts = MappedPosts::new(&chunks);
    check_post_count(
        chunks
            .iter()
            .map(|records| records.len() / POST_BYTES)
            .sum(),
    )?;
    let read = ReadSnapshot::new(reader, tombstones, facts, fresh, started);
    let building = Instant::now();
    match posts {
        Some(mut posts) if in_timeline_order_already(&posts, threads) => {
            let restored = restore_tombstones_and_facts(tables, &read, threads);
            // In timeline order the expired posts are the oldest: a prefix.
            let now = tables.now_secs();
            let total_posts = posts.len() as u64;
            posts.skip(first_unexpired(&posts, |t| {
                tables.retention.expired(t, now)
            }));
            let count = posts.len() as u32;
            let built = build_loaded(tables, &read, &posts, threads, allow_bulk, |_| {
                (0..count).collect()
            });
            Ok(read.report(restored, built, total_posts, building))
        }
        _ => {
            let posts = chunks
                .iter()
                .flat_map(|records| records.chunks_exact(POST_BYTES))
                .map(decode_checked_post)
                .collect();
            load_decoded(tables, read, posts, threads, allow_bulk, building)
        }
    }
}

/// Refuses a snapshot written with a shorter retention than this store's (it would lack
/// posts this store keeps) or for another author shard.
pub(crate) fn check_loadable(
    tables: &StoreTables,
    header: &SnapshotHeader,
) -> Result<(), SnapshotError> {
    if header.retention_secs < tables.retention.secs() {
        return Err(SnapshotError::Incompatible(format!(
            "written with a retention of {} s, shorter than this store's {} s",
            header.retention_secs,
            tables.retention.secs()
        )));
    }
    check_shard(tables, header.shard)
}

/// The build of a load whose posts were decoded into memory, which began at `building`:
/// the expired posts dropped, the rest put in timeline order.
fn load_decoded(
    tables: &StoreTables,
    read: ReadSnapshot,
    mut posts: Vec<CompactPost>,
    threads: usize,
    allow_bulk: bool,
    building: Instant,
) -> Result<LoadReport, SnapshotError> {
    let threads = threads.max(1);
    let restored = restore_tombstones_and_facts(tables, &read, threads);
    let now = tables.now_secs();
    let total_posts = posts.len() as u64;
    posts.retain(|p| !tables.retention.expired(p.created_at, now));
    let built = build_loaded(tables, &read, &posts, threads, allow_bulk, |posts| {
        in_timeline_order(posts, threads)
    });
    Ok(read.report(restored, built, total_posts, building))
}

/// Restores the snapshot's live tombstones and its facts: how many of each.
fn restore_tombstones_and_facts(
    tables: &StoreTables,
    read: &ReadSnapshot,
    threads: usize,
) -> (u64, u64) {
    let tombstones_loaded = tables.restore_tombstones(&read.tombstones, |&t| t, threads);
    let facts_loaded = tables.restore_facts(&read.facts, &tables.guards()) as u64;
    (tombstones_loaded, facts_loaded)
}

/// Builds the store from `posts` (all unexpired), in the order `order_of` gives them, in
/// bulk when the store was fresh, else (or when the bulk build refuses) through the
/// per-post path: its insert report, and why it took the per-post path.
fn build_loaded<P: PostSource + ?Sized>(
    tables: &StoreTables,
    read: &ReadSnapshot,
    posts: &P,
    threads: usize,
    allow_bulk: bool,
    order_of: impl FnOnce(&P) -> Vec<u32>,
) -> (InsertReport, Option<BulkRefusal>) {
    // Size the post index once for every post, rather than grow it ~20 times on the way
    // (each growth stops both loading threads to rehash); on another thread while this
    // one orders them, when there is one.
    let order = std::thread::scope(|scope| {
        let reserve = |posts: usize| tables.posts.reserve(posts);
        if threads == 1 {
            reserve(posts.len());
            return order_of(posts);
        }
        let count = posts.len();
        let reserving = scope.spawn(move || reserve(count));
        let order = order_of(posts);
        if let Err(panic) = reserving.join() {
            std::panic::resume_unwind(panic);
        }
        order
    });
    // With a loading thread on every core, a chunk made ahead only takes a core from them.
    let every_core = threads >= std::thread::available_parallelism().map_or(1, |n| n.get());
    if every_core {
        tables.posts.make_chunks_ahead(false);
    }
    let bulk = if !allow_bulk {
        Err(BulkRefusal::PerPostRequested)
    } else if read.fresh {
        bulk_load(tables, posts, &order, threads)
    } else {
        Err(BulkRefusal::StoreNotEmpty)
    };
    let built = match bulk {
        Ok(inserts) => (inserts, None),
        Err(reason) => (load_per_post(tables, posts, &order, threads), Some(reason)),
    };
    if every_core {
        tables.posts.make_chunks_ahead(true);
    }
    built
}

/// Inserts `posts` through the ordinary insert path on `threads` threads, split by author,
/// each in `order`.
fn load_per_post<P: PostSource + ?Sized>(
    tables: &StoreTables,
    posts: &P,
    order: &[u32],
    threads: usize,
) -> InsertReport {
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|worker| scope.spawn(move || load_share(tables, posts, order, worker, threads)))
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .fold(InsertReport::default(), |mut total, r| {
                add_report(&mut total, r);
                total
            })
    })
}

/// Inserts the posts of the authors that fall to `worker` (of `workers`), in `order`.
fn load_share<P: PostSource + ?Sized>(
    tables: &StoreTables,
    posts: &P,
    order: &[u32],
    worker: usize,
    workers: usize,
) -> InsertReport {
    const BATCH: usize = 4096;
    let mut report = InsertReport::default();
    let mut batch = Vec::with_capacity(BATCH);
    let mine = order
        .iter()
        .map(|&i| posts.post(i as usize))
        .filter(|p| author_share(p.author_id, workers) == worker);
    for post in mine {
        batch.push(post.to_light());
        if batch.len() == BATCH {
            add_report(&mut report, write::insert_posts(tables, &batch, |_, _| {}));
            batch.clear();
        }
    }
    if !batch.is_empty() {
        add_report(&mut report, write::insert_posts(tables, &batch, |_, _| {}));
    }
    report
}

/// Refuses a snapshot written by another shard (or by a shard for a full store, or the other
/// way round) than the store of `tables` is.
pub(crate) fn check_shard(
    tables: &StoreTables,
    written_by: Option<ShardId>,
) -> Result<(), SnapshotError> {
    let shown = |shard: Option<ShardId>| match shard {
        Some(shard) => format!("author shard {shard}"),
        None => "a full store".to_owned(),
    };
    let this = tables.directory.id();
    let unnamed_shard = this.is_none() && tables.directory.is_shard();
    if written_by != this || unnamed_shard {
        return Err(SnapshotError::Incompatible(format!(
            "written by {}, this store is {}",
            shown(written_by),
            if unnamed_shard {
                "an author shard without a shard id".to_owned()
            } else {
                shown(this)
            }
        )));
    }
    Ok(())
}

fn add_report(total: &mut InsertReport, r: InsertReport) {
    total.inserted += r.inserted;
    total.invalid_time += r.invalid_time;
    total.in_future += r.in_future;
    total.too_old += r.too_old;
    total.tombstoned += r.tombstoned;
    total.duplicate += r.duplicate;
    total.no_slot += r.no_slot;
}

/// Which of `workers` loads an author's posts (one worker per author keeps each timeline's
/// appends in order).
fn author_share(author_id: i64, workers: usize) -> usize {
    ((author_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % workers
}
