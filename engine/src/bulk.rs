//! The bulk build: a snapshot's posts loaded into a *fresh* store without the per-post insert
//! path, on several threads, giving the store the per-post path would give.
//!
//! The per-post load inserts every post in timeline order (ascending `created_at`, then post
//! id, file order among equal ids; a post's *rank* is its place in that order). Its result is a
//! function of that order:
//! - each author's originals and secondary timelines hold the last `cap` of their posts (an
//!   in-order insert into a full timeline evicts the oldest);
//! - a post with its own video (`has_video && !is_reply`) joins its author's videos timeline;
//!   a non-reply repost without one (source id set) joins it at its own rank if its source was
//!   stored by then and is a video source; if the source comes later (a higher rank) and is a
//!   video source, the repost is promoted then (inserted at its place in timeline order),
//!   provided the repost is still stored (not yet evicted from its timeline); otherwise the repost waits in the pending map for its source. On an author
//!   shard a repost whose source is not stored yet joins the videos timeline at once instead.
//! - a record lives while a timeline holds it.
//!
//! The bulk build computes that result directly, on `threads` threads:
//! 1. each thread takes a range of ranks and publishes and indexes those records in load order
//!    (dropping tombstoned ones), keeping each one's slot by rank and a key
//!    `author hash << 32 | rank` in the share of the thread that will build its author;
//! 2. each share's keys are radix-sorted by author hash (each author's posts together, in
//!    rank order), and no author may reach the videos cap (see below);
//! 3. each share's authors get their three timelines, each written whole in one buffer; the
//!    repost rules above decide from the ranks of a repost and of its source. What the build
//!    needs of a post is read back from the load's posts through its rank, a block of keys at
//!    a time, rather than kept per post by phase 1 and gathered into author order: those two
//!    copies took 40 bytes a post each, the largest fresh memory of the load after the posts
//!    and the store themselves (*A load with less fresh memory* in docs/performance-history.md);
//! 4. the records no timeline holds are freed, the pending reposts stored by source.
//!
//! It refuses (and leaves the store as it found it, apart from tombstone bases raised by the
//! posts they drop, which the per-post path raises again) when its shortcut would not be exact;
//! the caller then runs the per-post path:
//! - a post id appears twice (a snapshot holds each id once, but a fuzzy scan racing a cap
//!   eviction and a redelivered create could see two copies): the per-post path decides which
//!   one wins by the order of events;
//! - an author could hold more than `cap` video entries: evictions from the videos timeline
//!   would make a video source's presence depend on the time a repost of it arrives;
//! - on a shard, a post of an author the shard does not own (never written by a shard).
//!
//! One deliberate difference, in the pending map only: whether a repost waits for a source
//! that was evicted from its timeline before (or while) the per-post path would have inserted
//! the repost. Such a source is not a video source (a video source is never evicted here, see
//! above), and a post id carries one record, so no answer depends on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::arena::{CompactPost, IN_PRIMARY, IN_VIDEO, SlotId, slot_class_and_index};
use crate::authors::Kind;
use crate::guards::Guards;
use crate::parallel::join_all;
use crate::prefetch::prefetch;
use crate::report::{DropReason, InsertReport};
use crate::tables::StoreTables;
use crate::timeline::TinyPost;
use crate::waiting::PendingRepost;

/// Where a load reads its posts from: decoded in memory, or still in the records of a mapped
/// snapshot file (`snapshot/mapped.rs`, `MappedPosts`), decoded as they are read. By index, by value.
pub(crate) trait PostSource: Sync {
    /// How many posts.
    fn len(&self) -> usize;
    /// The post at `index` (< `len()`).
    fn post(&self, index: usize) -> CompactPost;
    /// Where the post at `index` lies, for a prefetch only.
    fn post_ptr(&self, index: usize) -> *const u8;
}

impl PostSource for [CompactPost] {
    #[inline]
    fn len(&self) -> usize {
        <[CompactPost]>::len(self)
    }

    #[inline]
    fn post(&self, index: usize) -> CompactPost {
        self[index]
    }

    #[inline]
    fn post_ptr(&self, index: usize) -> *const u8 {
        self.as_ptr().wrapping_add(index).cast()
    }
}

impl PostSource for Vec<CompactPost> {
    #[inline]
    fn len(&self) -> usize {
        self.as_slice().len()
    }

    #[inline]
    fn post(&self, index: usize) -> CompactPost {
        self[index]
    }

    #[inline]
    fn post_ptr(&self, index: usize) -> *const u8 {
        PostSource::post_ptr(self.as_slice(), index)
    }
}

/// Why the bulk build left the load to the per-post path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkRefusal {
    /// The caller asked for the per-post path.
    PerPostRequested,
    /// The store already held posts, authors, tombstones, pending reposts or facts.
    StoreNotEmpty,
    /// A post id appears more than once.
    DuplicatePostId,
    /// An author could hold more video entries than the timeline cap.
    VideosOverCap,
    /// On an author shard, a post of an author the shard does not own.
    ForeignAuthor,
}

impl BulkRefusal {
    /// A short reason for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkRefusal::PerPostRequested => "the per-post path was asked for",
            BulkRefusal::StoreNotEmpty => "the store was not empty",
            BulkRefusal::DuplicatePostId => "a post id appears twice",
            BulkRefusal::VideosOverCap => "an author could exceed the videos cap",
            BulkRefusal::ForeignAuthor => "a post of an author this shard does not own",
        }
    }
}

/// What the build reads back of a published post ([`Loaded::published`]).
#[derive(Clone, Copy)]
struct Published {
    post_id: i64,
    author_id: i64,
    source_post_id: i64,
    created_at: u32,
    /// The post's place in the load order.
    rank: u32,
    slot: SlotId,
    /// `Kind::primary_of` as an index (0 originals, 1 secondary).
    primary: u8,
    /// `has_own_video` / `is_video_repost` of the record.
    own_video: bool,
    video_repost: bool,
}

impl Published {
    fn entry(&self) -> TinyPost {
        TinyPost {
            post_id: self.post_id,
            created_at: self.created_at,
            slot: self.slot,
        }
    }
}

/// Phase 1 of one range of ranks: the posts it published, per share, and its drops.
struct Publishing {
    /// `author hash << 32 | rank` of each published post, per share.
    shares: Vec<Vec<u64>>,
    /// The slot of each post of the range, by rank (0 for one dropped, which no key names).
    slots: Vec<SlotId>,
    report: InsertReport,
    overflow_ranks: Vec<(SlotId, u32)>,
    refused: Option<BulkRefusal>,
}

/// One thread's share of the authors, grouped.
struct Share {
    /// `author hash << 32 | rank`, sorted: each author hash's posts together, in rank order.
    /// Authors sharing a hash are split apart when their posts are read ([`Loaded::block`]).
    keys: Vec<u64>,
    refused: Option<BulkRefusal>,
}

/// What the build reads a post back from: the load's posts, their load order and the slots
/// phase 1 gave them.
struct Loaded<'a, P: PostSource + ?Sized> {
    posts: &'a P,
    order: &'a [u32],
    /// Per phase-1 thread, the slots of its `per_thread` ranks.
    slots: Vec<Vec<SlotId>>,
    per_thread: usize,
}

impl<P: PostSource + ?Sized> Loaded<'_, P> {
    fn post(&self, rank: u32) -> CompactPost {
        self.posts.post(self.order[rank as usize] as usize)
    }

    fn slot(&self, rank: u32) -> SlotId {
        let rank = rank as usize;
        self.slots[rank / self.per_thread][rank % self.per_thread]
    }

    fn published(&self, key: u64) -> Published {
        let rank = key as u32;
        let post = self.post(rank);
        Published {
            post_id: post.post_id,
            author_id: post.author_id,
            source_post_id: post.source_post_id,
            created_at: post.created_at,
            rank,
            slot: self.slot(rank),
            primary: Kind::primary_of(&post) as u8,
            own_video: has_own_video(&post),
            video_repost: is_video_repost(&post),
        }
    }

    /// The posts `keys` name (sorted keys, whole author hashes), into `out` grouped by author:
    /// in key order, with the posts of authors sharing a hash put in author order (stably, so
    /// each author's stay in rank order). Reads ahead: the load order and slot of the key
    /// [`READ_AHEAD`] places on, the post of the key half as far.
    fn block(&self, keys: &[u64], out: &mut Vec<Published>) {
        out.clear();
        let rank_of = |i: usize| keys.get(i).map(|&key| key as u32);
        for (i, &key) in keys.iter().enumerate() {
            if let Some(rank) = rank_of(i + READ_AHEAD) {
                let rank = rank as usize;
                prefetch(self.order.as_ptr().wrapping_add(rank).cast());
                let slots = &self.slots[rank / self.per_thread];
                prefetch(slots.as_ptr().wrapping_add(rank % self.per_thread).cast());
            }
            if let Some(rank) = rank_of(i + READ_AHEAD / 2) {
                prefetch(self.posts.post_ptr(self.order[rank as usize] as usize));
            }
            out.push(self.published(key));
        }
        for group in out.chunk_by_mut(|a, b| author_hash(a.author_id) == author_hash(b.author_id)) {
            if group.iter().any(|p| p.author_id != group[0].author_id) {
                group.sort_by_key(|p| p.author_id);
            }
        }
    }
}

/// The keys of one block of the build: `size` keys from `start` (fewer at the end), extended
/// to the end of the author hash the block would otherwise cut.
fn next_block(keys: &[u64], start: usize, size: usize) -> &[u64] {
    let mut end = (start + size).min(keys.len());
    while end < keys.len() && keys[end] >> 32 == keys[end - 1] >> 32 {
        end += 1;
    }
    &keys[start..end]
}

/// What phase 2 of one share leaves for the end.
#[derive(Default)]
struct Built {
    pending: Vec<(i64, u32, PendingRepost)>,
    /// Records evicted from their primary timeline (freed unless a video entry holds them).
    release: Vec<(i64, SlotId)>,
    entries: [isize; 3],
}

/// The author hash the shares and the grouping use.
fn author_hash(author_id: i64) -> u32 {
    ((author_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
}

fn has_own_video(post: &CompactPost) -> bool {
    post.has_video && !post.is_reply
}

/// A non-reply repost without its own video: a video entry iff its source is a video source.
fn is_video_repost(post: &CompactPost) -> bool {
    !post.is_reply && !post.has_video && post.is_retweet && post.source_post_id != 0
}

/// Sorts `keys` by their upper 32 bits, stably (three 11-bit LSD radix passes).
fn sort_by_author_hash(keys: &mut Vec<u64>) {
    let mut scratch = vec![0u64; keys.len()];
    for shift in [32u32, 43, 54] {
        let mut starts = [0usize; 2048];
        for &key in keys.iter() {
            starts[((key >> shift) & 0x7FF) as usize] += 1;
        }
        let mut sum = 0;
        for start in starts.iter_mut() {
            let n = *start;
            *start = sum;
            sum += n;
        }
        for &key in keys.iter() {
            let digit = ((key >> shift) & 0x7FF) as usize;
            scratch[starts[digit]] = key;
            starts[digit] += 1;
        }
        std::mem::swap(keys, &mut scratch);
    }
}

/// The posts of one author each, in order (of a block read by [`Loaded::block`]).
fn authors(posts: &[Published]) -> impl Iterator<Item = &[Published]> {
    posts.chunk_by(|a, b| a.author_id == b.author_id)
}

/// Ranks of published slots: per slot class, a dense table (rank + 1; 0 for none) indexed by
/// the slot's index within its class, as long as the posts of that class (a fresh arena hands
/// out those indexes, plus the unused tails of the writer threads' runs), and a map for the
/// rest. Before both classes had their table, every small-class slot (an id above 2^31) went
/// to the map: one SipHash insert per original post on one thread, about 10% of the load.
struct Ranks {
    dense: [Vec<AtomicU32>; 2],
    sparse: HashMap<SlotId, u32>,
}

impl Ranks {
    /// Tables for loading `posts` into a fresh store on `workers` threads.
    fn for_posts<P: PostSource + ?Sized>(posts: &P, workers: usize) -> Self {
        let small = (0..posts.len())
            .filter(|&i| posts.post(i).fits_small())
            .count();
        // The indexes a writer thread's last run of each class may leave unused.
        let slack = 64 * workers;
        let table = |len: usize| (0..len + slack).map(|_| AtomicU32::new(0)).collect();
        Self {
            dense: [table(posts.len() - small), table(small)],
            sparse: HashMap::new(),
        }
    }

    /// The dense cell of `slot`, if it has one.
    fn cell(&self, slot: SlotId) -> Option<&AtomicU32> {
        let (class, index) = slot_class_and_index(slot);
        self.dense[class].get(index as usize)
    }

    fn get(&self, slot: SlotId) -> Option<u32> {
        match self.cell(slot) {
            // Relaxed: written before the phase-1 threads were joined.
            Some(rank) => rank.load(Ordering::Relaxed).checked_sub(1),
            None => self.sparse.get(&slot).copied(),
        }
    }
}

/// How many posts ahead phase 1 prefetches index buckets.
const LOOKAHEAD: usize = 8;
/// How many posts ahead phase 2 prefetches the index buckets of repost sources.
const SOURCE_LOOKAHEAD: usize = 32;
/// How many keys ahead the build reads a post's load order and slot (its post half as far).
const READ_AHEAD: usize = 16;
/// Keys the build reads back at a time (a block's posts stay in the core's own caches).
const BLOCK_KEYS: usize = 2048;

/// Builds the fresh store of `tables` from `posts` (all unexpired), `order` being their
/// indices in ascending `created_at` (stable), on `threads` threads (see the module docs).
/// Restore tombstones and facts first. On `Err` the store holds no post and the caller runs
/// the per-post path.
pub(crate) fn bulk_load<P: PostSource + ?Sized>(
    tables: &StoreTables,
    posts: &P,
    order: &[u32],
    threads: usize,
) -> Result<InsertReport, BulkRefusal> {
    let workers = threads.max(1);
    if tables.directory.is_shard()
        && (0..posts.len()).any(|i| tables.directory.is_foreign(posts.post(i).author_id))
    {
        return Err(BulkRefusal::ForeignAuthor);
    }
    let mut ranks = Ranks::for_posts(posts, workers);
    let refused = AtomicBool::new(false);
    // Phase 1, in load order (so records land in the arena in time order, as a replay
    // puts them): each thread publishes and indexes a range of ranks.
    let per_thread = order.len().div_ceil(workers).max(1);
    let publishing: Vec<Publishing> = std::thread::scope(|scope| {
        let handles = order
            .chunks(per_thread)
            .enumerate()
            .map(|(t, chunk)| {
                let (ranks, refused) = (&ranks, &refused);
                let first = (t * per_thread) as u32;
                scope.spawn(move || {
                    publish_ranks(tables, posts, chunk, first, workers, ranks, refused)
                })
            })
            .collect();
        join_all(handles)
    });
    let mut report = InsertReport::default();
    let mut refusal = None;
    let mut parts: Vec<Vec<Vec<u64>>> = vec![Vec::new(); workers];
    let mut slots = Vec::with_capacity(workers);
    for mut publishing in publishing {
        slots.push(std::mem::take(&mut publishing.slots));
        report.inserted += publishing.report.inserted;
        report.tombstoned += publishing.report.tombstoned;
        refusal = refusal.or(publishing.refused);
        ranks.sparse.extend(publishing.overflow_ranks);
        for (w, part) in publishing.shares.into_iter().enumerate() {
            parts[w].push(part);
        }
    }
    let loaded = Loaded {
        posts,
        order,
        slots,
        per_thread,
    };
    // Group each share by author, and check no author can exceed the videos cap.
    let shares: Vec<Share> = std::thread::scope(|scope| {
        let handles = parts
            .into_iter()
            .map(|parts| {
                let loaded = &loaded;
                scope.spawn(move || group_share(tables, loaded, parts))
            })
            .collect();
        join_all(handles)
    });
    if let Some(refusal) = refusal.or_else(|| shares.iter().find_map(|s| s.refused)) {
        unpublish(tables, &shares, &loaded);
        return Err(refusal);
    }
    let built: Vec<Built> = std::thread::scope(|scope| {
        let handles = shares
            .iter()
            .map(|share| {
                let (ranks, loaded) = (&ranks, &loaded);
                scope.spawn(move || build_share(tables, share, loaded, ranks))
            })
            .collect();
        join_all(handles)
    });
    finish(tables, built);
    Ok(report)
}

/// Phase 1 for the posts `chunk` names (ranks from `first` on): drops tombstoned posts,
/// publishes and indexes the others, sorted into the share of their author.
#[allow(clippy::too_many_arguments)]
fn publish_ranks<P: PostSource + ?Sized>(
    tables: &StoreTables,
    posts: &P,
    chunk: &[u32],
    first: u32,
    workers: usize,
    ranks: &Ranks,
    refused: &AtomicBool,
) -> Publishing {
    let g = tables.guards();
    let mut out = Publishing {
        shares: vec![Vec::with_capacity(chunk.len() / workers + 16); workers],
        slots: {
            let slots = vec![0; chunk.len()];
            crate::huge_memory::advise_huge(&slots);
            slots
        },
        report: InsertReport::default(),
        overflow_ranks: Vec::new(),
        refused: None,
    };
    for (offset, &index) in chunk.iter().enumerate() {
        if let Some(&ahead) = chunk.get(offset + LOOKAHEAD) {
            let ahead_id = posts.post(ahead as usize).post_id;
            tables.posts.prefetch_bucket(ahead_id, &g.epoch);
            tables.tombstones.prefetch_word(ahead_id, &g.epoch);
        }
        // Relaxed: a hint to stop early; the join orders the outcome.
        if offset % 4096 == 0 && refused.load(Ordering::Relaxed) {
            break;
        }
        let post = &posts.post(index as usize);
        let post_id = post.post_id;
        if tables
            .tombstones
            .drops_create(post_id, i64::from(post.created_at), &g)
        {
            out.report.count_drop(DropReason::Tombstoned);
            continue;
        }
        let own_video = has_own_video(post);
        let holders = IN_PRIMARY | if own_video { IN_VIDEO } else { 0 };
        let slot = match tables.posts.publish(post, holders, &g.epoch) {
            Ok(slot) => slot,
            // No slot (every id in use or memory exhausted): not stored, counted as in the
            // per-post path.
            Err(DropReason::NoSlot) => {
                out.report.count_drop(DropReason::NoSlot);
                continue;
            }
            Err(_) => {
                out.refused = Some(BulkRefusal::DuplicatePostId);
                refused.store(true, Ordering::Relaxed);
                break;
            }
        };
        out.report.inserted += 1;
        let rank = first + offset as u32;
        match ranks.cell(slot) {
            // Relaxed: read after this thread is joined.
            Some(cell) => cell.store(rank + 1, Ordering::Relaxed),
            None => out.overflow_ranks.push((slot, rank)),
        }
        let hash = author_hash(post.author_id);
        out.shares[hash as usize % workers].push(u64::from(hash) << 32 | u64::from(rank));
        out.slots[offset] = slot;
    }
    out
}

/// Sorts one share's keys (`parts`: in rank order) by author hash and checks that no
/// author could hold more than `cap` video entries (only an author hash with more than
/// `cap` posts can hold one that could: just those posts are read).
fn group_share<P: PostSource + ?Sized>(
    tables: &StoreTables,
    loaded: &Loaded<'_, P>,
    parts: Vec<Vec<u64>>,
) -> Share {
    let mut keys = parts.concat();
    drop(parts);
    sort_by_author_hash(&mut keys);
    let mut posts = Vec::new();
    let refused = keys
        .chunk_by(|a, b| a >> 32 == b >> 32)
        .filter(|hashed| hashed.len() > tables.authors.cap())
        .any(|hashed| {
            loaded.block(hashed, &mut posts);
            authors(&posts).any(|author| {
                author
                    .iter()
                    .filter(|p| p.own_video || p.video_repost)
                    .count()
                    > tables.authors.cap()
            })
        })
        .then_some(BulkRefusal::VideosOverCap);
    Share { keys, refused }
}

/// Undoes phase 1 after a refusal: every published record leaves the index and the arena.
fn unpublish<P: PostSource + ?Sized>(
    tables: &StoreTables,
    shares: &[Share],
    loaded: &Loaded<'_, P>,
) {
    let epoch = crossbeam_epoch::pin();
    let mut retired = Vec::new();
    for &key in shares.iter().flat_map(|s| &s.keys) {
        let (post_id, slot) = (loaded.post(key as u32).post_id, loaded.slot(key as u32));
        tables.posts.unpublish(post_id, slot, &epoch, &mut retired);
    }
    tables.posts.retire(retired, &epoch);
}

/// Phase 2 for one share: each author's timelines, built whole, a block of keys at a time.
fn build_share<P: PostSource + ?Sized>(
    tables: &StoreTables,
    share: &Share,
    loaded: &Loaded<'_, P>,
    ranks: &Ranks,
) -> Built {
    let g = tables.guards();
    let mut built = Built::default();
    let mut scratch = AuthorScratch::default();
    let mut posts = Vec::with_capacity(BLOCK_KEYS);
    let mut start = 0;
    while start < share.keys.len() {
        let keys = next_block(&share.keys, start, BLOCK_KEYS);
        start += keys.len();
        loaded.block(keys, &mut posts);
        let (mut done, mut prefetched) = (0, 0);
        for author in authors(&posts) {
            // The index buckets of the sources the next few dozen posts look up.
            let until = (done + author.len() + SOURCE_LOOKAHEAD).min(posts.len());
            for post in &posts[prefetched.max(done)..until] {
                if post.video_repost {
                    tables.posts.prefetch_bucket(post.source_post_id, &g.epoch);
                }
            }
            prefetched = until;
            build_author(tables, author, ranks, &g, &mut scratch, &mut built);
            done += author.len();
        }
    }
    built
}

/// Phase 2 for one author (`posts` in rank order).
fn build_author(
    tables: &StoreTables,
    posts: &[Published],
    ranks: &Ranks,
    g: &Guards<'_>,
    scratch: &mut AuthorScratch,
    built: &mut Built,
) {
    let cap = tables.authors.cap();
    let AuthorScratch {
        kind_ranks,
        timelines,
        videos,
    } = scratch;
    for list in kind_ranks.iter_mut() {
        list.clear();
    }
    for list in timelines.iter_mut() {
        list.clear();
    }
    videos.clear();
    for post in posts {
        kind_ranks[usize::from(post.primary)].push(post.rank);
    }
    let mut seen = [0usize; 2];
    for post in posts {
        let kind = usize::from(post.primary);
        let index = seen[kind];
        seen[kind] += 1;
        // The rank of the insert that evicts this post from its primary timeline, if any.
        let evicted_at = kind_ranks[kind].get(index + cap).copied();
        let entry = post.entry();
        match evicted_at {
            None => timelines[kind].push(entry),
            Some(_) => built.release.push((entry.post_id, entry.slot)),
        }
        let joins_videos = post.own_video
            || (post.video_repost
                && repost_joins_videos(tables, post, evicted_at, ranks, g, built)
                && tables.posts.hold_video(entry.slot, entry.post_id));
        if joins_videos {
            videos.push(entry);
        }
    }
    // In timeline order (a promoted repost is out of rank order).
    if !videos.is_sorted_by_key(TinyPost::key) {
        videos.sort_unstable_by_key(TinyPost::key);
    }
    timelines[Kind::Videos as usize].extend_from_slice(videos);
    // False when every author number is in use: the per-post path indexes nothing either.
    if tables.authors.fill(posts[0].author_id, timelines, &g.epoch) {
        for (kind, list) in timelines.iter().enumerate() {
            built.entries[kind] += list.len() as isize;
        }
    }
}

/// Whether the per-post path puts the video repost `post` into its author's videos
/// timeline (at its own insert or when its source arrives). Records in `built.pending` a
/// repost that waits for its source.
fn repost_joins_videos(
    tables: &StoreTables,
    post: &Published,
    evicted_at: Option<u32>,
    ranks: &Ranks,
    g: &Guards<'_>,
    built: &mut Built,
) -> bool {
    let (source_id, rank) = (post.source_post_id, post.rank);
    let source = tables
        .posts
        .lookup_with_slot(source_id, &g.epoch)
        .and_then(|(slot, record)| Some((ranks.get(slot)?, record)));
    let shard = tables.directory.is_shard();
    match source {
        // Stored before the repost: the videos rule decides at its insert.
        Some((source_rank, source)) if source_rank < rank => {
            tables.retention.is_video_source(&source, g.now)
        }
        // A shard indexes every repost whose source is not stored (yet).
        _ if shard => true,
        // Stored after the repost: promoted when it arrives, if it is a video source and
        // the repost was not evicted meanwhile.
        Some((source_rank, source)) if source_rank > rank && has_own_video(&source) => {
            evicted_at.is_none_or(|evicted| source_rank < evicted)
        }
        _ => {
            let waiting = PendingRepost {
                post_id: post.post_id,
                author_id: post.author_id,
                created_at: post.created_at,
            };
            built.pending.push((source_id, rank, waiting));
            false
        }
    }
}

/// The end of the build: pending reposts by source (in rank order), records held by no
/// timeline freed, entry counts.
fn finish(tables: &StoreTables, built: Vec<Built>) {
    let g = tables.guards();
    let mut pending = Vec::new();
    let mut retired = Vec::new();
    for share in built {
        pending.extend(share.pending);
        for (post_id, slot) in share.release {
            // Only primary timelines let go of posts here (never the videos one).
            tables
                .posts
                .release(post_id, slot, IN_PRIMARY, &g.epoch, &mut retired);
        }
        for (kind, n) in Kind::ALL.into_iter().zip(share.entries) {
            tables.authors.count_entries(kind, n);
        }
    }
    pending.sort_unstable_by_key(|&(source, rank, _)| (source, rank));
    for group in pending.chunk_by(|a, b| a.0 == b.0) {
        let waiting = group.iter().map(|&(_, _, repost)| repost).collect();
        tables.waiting.set(group[0].0, waiting, &g);
    }
    tables.posts.retire(retired, &g.epoch);
}

/// Per-thread buffers reused from one author to the next.
#[derive(Default)]
struct AuthorScratch {
    /// Ranks of the author's posts, per primary timeline, in rank order.
    kind_ranks: [Vec<u32>; 2],
    timelines: [Vec<TinyPost>; 3],
    /// The videos timeline's entries before they are put in order.
    videos: Vec<TinyPost>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::post::LightPost;
    use crate::snapshot::in_timeline_order;
    use crate::{FeedQuery, ManualClock, PostStore, StoreConfig};
    use std::sync::Arc;

    const NOW: i64 = 1_700_000_000;

    fn store() -> PostStore {
        PostStore::with_config(StoreConfig {
            retention_secs: 10_000,
            clock: Arc::new(ManualClock::new(NOW)),
            ..StoreConfig::default()
        })
    }

    fn records(posts: &[LightPost]) -> Vec<CompactPost> {
        posts.iter().map(CompactPost::from_light).collect()
    }

    fn feed(store: &PostStore, authors: &[i64]) -> Vec<i64> {
        let query = FeedQuery::new(-1, authors);
        store
            .get_all_posts_by_users(&query)
            .posts
            .iter()
            .map(|p| p.post_id)
            .collect()
    }

    /// A post whose id has a live tombstone is dropped and raises the tombstone's basis to
    /// its `created_at`, as the per-post path does.
    #[test]
    fn tombstoned_ids_are_dropped_and_raise_the_basis() {
        let posts = records(&[
            LightPost::original(1, 7, NOW - 50),
            LightPost::original(2, 7, NOW - 40),
            LightPost::original(3, 8, NOW - 30),
        ]);
        let (bulk, per_post) = (store(), store());
        for s in [&bulk, &per_post] {
            let g = s.tables().guards();
            assert!(s.tables().tombstones.restore(2, NOW - 500, &g));
        }
        let report = bulk_load(bulk.tables(), &posts, &in_timeline_order(&posts, 2), 2)
            .expect("built in bulk");
        let light: Vec<LightPost> = posts.iter().map(|p| p.to_light()).collect();
        assert_eq!(report, per_post.insert_posts(&light));
        assert_eq!(report.tombstoned, 1);
        for s in [&bulk, &per_post] {
            assert_eq!(feed(s, &[7, 8]), vec![3, 1]);
            let g = s.tables().guards();
            assert_eq!(s.tables().tombstones.live(2, &g), Some(NOW - 40));
        }
    }

    /// A post id twice (a snapshot never holds that, but a crafted one could): refused, and
    /// the store is left with no post, author or index entry.
    #[test]
    fn a_duplicate_post_id_is_refused_and_nothing_stays() {
        let mut posts: Vec<CompactPost> = (0..5_000)
            .map(|i| CompactPost::from_light(&LightPost::original(i, i % 13, NOW - i)))
            .collect();
        posts.push(CompactPost::from_light(&LightPost::original(
            77,
            999,
            NOW - 1,
        )));
        let bulk = store();
        assert_eq!(
            bulk_load(bulk.tables(), &posts, &in_timeline_order(&posts, 2), 2),
            Err(BulkRefusal::DuplicatePostId)
        );
        assert_eq!(bulk.stats().posts, 0);
        assert_eq!(bulk.stats().authors, 0);
        assert!(
            bulk.tables()
                .posts
                .lookup(77, &crossbeam_epoch::pin())
                .is_none()
        );
        assert!(feed(&bulk, &[1, 999]).is_empty());
    }

    /// On an author shard, a post of another shard's author is not built in bulk.
    #[test]
    fn a_post_of_a_foreign_author_on_a_shard_is_refused() {
        let shard = store().with_fact_directory(|author| author % 2 == 0);
        let posts = records(&[
            LightPost::original(1, 2, NOW - 5),
            LightPost::original(2, 3, NOW - 4),
        ]);
        assert_eq!(
            bulk_load(shard.tables(), &posts, &in_timeline_order(&posts, 2), 2),
            Err(BulkRefusal::ForeignAuthor)
        );
        assert_eq!(shard.stats().posts, 0);
    }

    /// Both slot classes of a fresh store get dense rank cells (none falls to the map), also
    /// with the indexes two writer threads take in runs.
    #[test]
    fn every_slot_of_a_fresh_store_has_a_dense_rank_cell() {
        let posts: Vec<CompactPost> = (0..20_000)
            .map(|i| {
                let mut post = LightPost::original(i + 1, i % 97, NOW - i);
                if i % 3 == 0 {
                    post.is_retweet = true;
                    post.source_post_id = Some(i + 100_000);
                }
                CompactPost::from_light(&post)
            })
            .collect();
        let small = posts.iter().filter(|p| p.fits_small()).count();
        assert!(small > 0 && small < posts.len(), "both classes");
        let store = store();
        let tables = store.tables();
        let ranks = Ranks::for_posts(&posts, 2);
        let slots: Vec<SlotId> = std::thread::scope(|scope| {
            let handles: Vec<_> = posts
                .chunks(posts.len() / 2)
                .map(|half| {
                    scope.spawn(move || {
                        let epoch = &crossbeam_epoch::pin();
                        half.iter()
                            .map(|p| tables.posts.publish(p, IN_PRIMARY, epoch).expect("a slot"))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("publisher"))
                .collect()
        });
        assert!(slots.iter().all(|&slot| ranks.cell(slot).is_some()));
    }

    /// Two authors with one author hash (their posts share a run of sorted keys, and here a
    /// block boundary): each gets its own timelines, as the per-post path gives them.
    #[test]
    fn authors_sharing_a_hash_are_built_apart() {
        const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
        // The inverse of GOLDEN mod 2^64 (Newton's iteration): b * GOLDEN = a * GOLDEN + 1.
        let mut inverse = GOLDEN;
        for _ in 0..6 {
            inverse = inverse.wrapping_mul(2u64.wrapping_sub(GOLDEN.wrapping_mul(inverse)));
        }
        let a = 7i64;
        let b = a.wrapping_add(inverse as i64);
        assert_ne!(a, b);
        assert_eq!(author_hash(a), author_hash(b));
        // Enough posts that the run of the shared hash is longer than a block, interleaved
        // in time, with replies, videos and reposts of each other's videos among them.
        let light: Vec<LightPost> = (0..(BLOCK_KEYS as i64 + 700))
            .map(|i| {
                let author = if i % 3 == 0 { a } else { b };
                let mut post = LightPost::original(i + 1, author, NOW - 5_000 + i);
                match i % 7 {
                    0 => post.has_video = true,
                    1 => {
                        post.is_reply = true;
                        post.in_reply_to_post_id = Some(i);
                    }
                    2 if i > 10 => {
                        post.is_retweet = true;
                        post.source_post_id = Some(i - 1);
                    }
                    _ => {}
                }
                post
            })
            .collect();
        let posts = records(&light);
        let (bulk, per_post) = (store(), store());
        let report = bulk_load(bulk.tables(), &posts, &in_timeline_order(&posts, 2), 2)
            .expect("built in bulk");
        assert_eq!(report, per_post.insert_posts(&light));
        for authors in [&[a][..], &[b], &[a, b]] {
            let all = feed(&per_post, authors);
            assert!(!all.is_empty());
            assert_eq!(feed(&bulk, authors), all, "authors {authors:?}");
            let videos = |s: &PostStore| -> Vec<i64> {
                let query = FeedQuery::new(-1, authors);
                s.get_videos_by_users(&query)
                    .posts
                    .iter()
                    .map(|p| p.post_id)
                    .collect()
            };
            assert!(!videos(&per_post).is_empty());
            assert_eq!(videos(&bulk), videos(&per_post), "videos of {authors:?}");
        }
    }

    #[test]
    fn sorting_by_author_hash_is_stable() {
        let mut keys: Vec<u64> = (0..10_000u64)
            .map(|i| ((i * 7919) % 97) << 32 | i)
            .collect();
        let mut expected = keys.clone();
        expected.sort_by_key(|k| k >> 32);
        sort_by_author_hash(&mut keys);
        assert_eq!(keys, expected);
    }
}
