//! The bulk build: a snapshot's posts loaded into a *fresh* store without the per-post insert
//! path, on several threads, giving the store the per-post path would give.
//!
//! The per-post load inserts every post in ascending `created_at` (file order among equals;
//! a post's *rank* is its place in that order). Its result is a function of that order:
//! - each author's originals and secondary timelines hold the last `cap` of their posts (an
//!   in-order insert into a full timeline evicts the oldest);
//! - a post with its own video (`has_video && !is_reply`) joins its author's videos timeline;
//!   a non-reply repost without one (source id set) joins it at its own rank if its source was
//!   stored by then and is a video source; if the source comes later (a higher rank) and is a
//!   video source, the repost is promoted then (inserted after the entries of equal
//!   `created_at` already there), provided the repost is still stored (not yet evicted from its
//!   timeline); otherwise the repost waits in the pending map for its source. On an author
//!   shard a repost whose source is not stored yet joins the videos timeline at once instead.
//! - a record lives while a timeline holds it.
//!
//! The bulk build computes that result directly: it groups the posts by author (a radix sort
//! by author hash, each thread taking the authors of its hash share), publishes each record
//! once and indexes it (phase 1), then builds each author's three timelines whole, each in one
//! buffer (phase 2), and finally drops the records evicted from every timeline.
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

use crate::arena::{CompactPost, IN_PRIMARY, IN_VIDEO, Release, SlotId};
use crate::store::{DropReason, Guards, InsertReport, Kind, PendingRepost, PostStore};
use crate::timeline::TinyPost;

/// Why the bulk build left the load to the per-post path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkRefusal {
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
            BulkRefusal::StoreNotEmpty => "the store was not empty",
            BulkRefusal::DuplicatePostId => "a post id appears twice",
            BulkRefusal::VideosOverCap => "an author could exceed the videos cap",
            BulkRefusal::ForeignAuthor => "a post of an author this shard does not own",
        }
    }
}

/// A post's fate after phase 1.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not stored: tombstoned, or no arena slot.
    Dropped,
    /// Inserted but evicted from its primary timeline and never a video entry: not published.
    Evicted,
    /// Published and indexed; `slots` holds its slot.
    Stored,
}

/// One thread's share of the posts: the authors whose hash falls to it.
struct Share {
    /// `author hash << 32 | rank`, grouped by author and in rank order within an author.
    keys: Vec<u64>,
    slots: Vec<SlotId>,
    states: Vec<State>,
    report: InsertReport,
    /// Ranks of published slots beyond the rank table.
    overflow_ranks: Vec<(SlotId, u32)>,
    refused: Option<BulkRefusal>,
}

/// What phase 2 of one share leaves for the end.
#[derive(Default)]
struct Built {
    pending: Vec<(i64, u32, PendingRepost)>,
    /// Records evicted from their primary timeline that may hold no other.
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

/// Ranks of published slots: a dense table for slot ids below the post count (a fresh arena
/// hands those out), a map for the rest.
struct Ranks {
    dense: Vec<AtomicU32>,
    sparse: HashMap<SlotId, u32>,
}

impl Ranks {
    fn get(&self, slot: SlotId) -> Option<u32> {
        match self.dense.get(slot as usize) {
            // Relaxed: written before the phase-1 threads were joined.
            Some(rank) => rank.load(Ordering::Relaxed).checked_sub(1),
            None => self.sparse.get(&slot).copied(),
        }
    }
}

impl PostStore {
    /// True if nothing was ever loaded or inserted: no posts, authors, tombstones, pending
    /// reposts or facts.
    pub(crate) fn is_fresh(&self) -> bool {
        self.arena.live() == 0
            && self.authors.live() == 0
            && self.tombstones.is_empty()
            && self.pending_videos.is_empty()
            && self.directory_stats().is_none_or(|d| d.facts == 0)
    }

    /// Builds this fresh store from `posts` (all unexpired), `order` being their indices in
    /// ascending `created_at` (stable), on `threads` threads (see the module docs). Restore
    /// tombstones and facts first. On `Err` the store holds no post and the caller runs the
    /// per-post path.
    pub(crate) fn bulk_load(
        &self,
        posts: &[CompactPost],
        order: &[u32],
        threads: usize,
    ) -> Result<InsertReport, BulkRefusal> {
        let workers = threads.max(1);
        if self.directory.is_some() && posts.iter().any(|p| self.is_foreign_author(p.author_id)) {
            return Err(BulkRefusal::ForeignAuthor);
        }
        // Group by author: each thread turns a range of ranks into keys for every share, then
        // each share's keys (ascending rank) are sorted stably by author hash.
        let per_thread = order.len().div_ceil(workers).max(1);
        let parts: Vec<Vec<Vec<u64>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = order
                .chunks(per_thread)
                .enumerate()
                .map(|(t, ranks)| {
                    scope.spawn(move || {
                        let mut out = vec![Vec::with_capacity(ranks.len() / workers + 16); workers];
                        let first = t * per_thread;
                        for (offset, &index) in ranks.iter().enumerate() {
                            let hash = author_hash(posts[index as usize].author_id);
                            let rank = (first + offset) as u64;
                            out[hash as usize % workers].push(u64::from(hash) << 32 | rank);
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let ranks = Ranks {
            dense: (0..posts.len()).map(|_| AtomicU32::new(0)).collect(),
            sparse: HashMap::new(),
        };
        let refused = AtomicBool::new(false);
        let mut shares: Vec<Share> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    let parts = &parts;
                    let (ranks, refused) = (&ranks, &refused);
                    scope.spawn(move || {
                        let mut keys = Vec::with_capacity(parts.iter().map(|p| p[w].len()).sum());
                        for part in parts {
                            keys.extend_from_slice(&part[w]);
                        }
                        sort_by_author_hash(&mut keys);
                        self.publish_share(posts, order, keys, ranks, refused)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        drop(parts);
        let refusal = shares.iter().find_map(|s| s.refused);
        if let Some(refusal) = refusal {
            self.unpublish(posts, order, &shares);
            return Err(refusal);
        }
        let mut ranks = ranks;
        for share in &mut shares {
            ranks.sparse.extend(share.overflow_ranks.drain(..));
        }
        let built: Vec<Built> = std::thread::scope(|scope| {
            let handles: Vec<_> = shares
                .iter()
                .map(|share| {
                    let ranks = &ranks;
                    scope.spawn(move || self.build_share(posts, order, share, ranks))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let mut report = InsertReport::default();
        for share in &shares {
            report.inserted += share.report.inserted;
            report.tombstoned += share.report.tombstoned;
        }
        self.finish(built);
        Ok(report)
    }

    /// Phase 1 for one share: drops tombstoned posts, decides which posts their primary
    /// timeline keeps, publishes and indexes every record that ends up held. Stops at the
    /// first reason to refuse (or when another share refused).
    fn publish_share(
        &self,
        posts: &[CompactPost],
        order: &[u32],
        mut keys: Vec<u64>,
        ranks: &Ranks,
        refused: &AtomicBool,
    ) -> Share {
        let g = self.guards();
        let post_of = |key: u64| &posts[order[key as u32 as usize] as usize];
        let mut share = Share {
            slots: vec![0; keys.len()],
            states: vec![State::Dropped; keys.len()],
            keys: Vec::new(),
            report: InsertReport::default(),
            overflow_ranks: Vec::new(),
            refused: None,
        };
        let mut start = 0;
        while start < keys.len() {
            // Relaxed: a hint to stop early; the join orders the outcome.
            if refused.load(Ordering::Relaxed) {
                break;
            }
            let hash = keys[start] >> 32;
            let end = start + keys[start..].partition_point(|k| k >> 32 == hash);
            let group = &mut keys[start..end];
            // Different authors with one hash: keep each author's posts together, in rank order.
            if group
                .iter()
                .any(|&k| post_of(k).author_id != post_of(group[0]).author_id)
            {
                group.sort_by_key(|&k| post_of(k).author_id);
            }
            let mut from = start;
            while from < end {
                let author_id = post_of(keys[from]).author_id;
                let to =
                    from + keys[from..end].partition_point(|&k| post_of(k).author_id == author_id);
                if let Err(refusal) =
                    self.publish_author(&keys[from..to], from, posts, order, ranks, &g, &mut share)
                {
                    share.refused = Some(refusal);
                    refused.store(true, Ordering::Relaxed);
                    share.keys = keys;
                    return share;
                }
                from = to;
            }
            start = end;
        }
        share.keys = keys;
        share
    }

    /// Phase 1 for one author's posts `keys` (at `base` in the share).
    #[allow(clippy::too_many_arguments)]
    fn publish_author(
        &self,
        keys: &[u64],
        base: usize,
        posts: &[CompactPost],
        order: &[u32],
        ranks: &Ranks,
        g: &Guards<'_>,
        share: &mut Share,
    ) -> Result<(), BulkRefusal> {
        let post_of = |key: u64| &posts[order[key as u32 as usize] as usize];
        let mut primary_len = [0usize; 2];
        let mut video_bound = 0;
        for (j, &key) in keys.iter().enumerate() {
            let post = post_of(key);
            if let Some(basis) = self.live_tombstone(post.post_id, g) {
                self.tombstone_dropped_create(post.post_id, basis, i64::from(post.created_at), g);
                share.report.count_drop(DropReason::Tombstoned);
                continue;
            }
            share.states[base + j] = State::Evicted;
            primary_len[Kind::primary_of(post) as usize] += 1;
            video_bound += usize::from(has_own_video(post) || is_video_repost(post));
        }
        if video_bound > self.cap {
            return Err(BulkRefusal::VideosOverCap);
        }
        let mut seen = [0usize; 2];
        for (j, &key) in keys.iter().enumerate() {
            let at = base + j;
            if share.states[at] == State::Dropped {
                continue;
            }
            let post = post_of(key);
            let kind = Kind::primary_of(post) as usize;
            let in_primary = seen[kind] + self.cap >= primary_len[kind];
            seen[kind] += 1;
            share.report.inserted += 1;
            let (own_video, video_repost) = (has_own_video(post), is_video_repost(post));
            if !(in_primary || own_video || video_repost) {
                continue;
            }
            // An evicted repost keeps its primary hold until phase 2 has decided whether it
            // is a video entry (and so whether it stays stored).
            let holders = if in_primary || video_repost {
                IN_PRIMARY
            } else {
                0
            } | if own_video { IN_VIDEO } else { 0 };
            let Some(slot) = self.arena.publish(post, holders) else {
                // No slot (every id in use or memory exhausted): neither stored nor counted,
                // as in the per-post path.
                share.report.inserted -= 1;
                share.states[at] = State::Dropped;
                continue;
            };
            let post_id = post.post_id;
            let is_stored = |s: SlotId| self.arena.read(s, post_id).is_some();
            if self
                .posts
                .insert_with(self.posts.hash(post_id), &g.epoch, is_stored, || Some(slot))
                .is_err()
            {
                self.arena.unpublish_unshared(slot, post_id);
                share.states[at] = State::Dropped;
                return Err(BulkRefusal::DuplicatePostId);
            }
            share.states[at] = State::Stored;
            share.slots[at] = slot;
            let rank = key as u32;
            match ranks.dense.get(slot as usize) {
                // Relaxed: read after this thread is joined.
                Some(cell) => cell.store(rank + 1, Ordering::Relaxed),
                None => share.overflow_ranks.push((slot, rank)),
            }
        }
        Ok(())
    }

    /// Undoes phase 1 after a refusal: every published record leaves the index and the arena.
    fn unpublish(&self, posts: &[CompactPost], order: &[u32], shares: &[Share]) {
        let epoch = crossbeam_epoch::pin();
        let mut retired = Vec::new();
        for share in shares {
            for ((&key, &state), &slot) in share.keys.iter().zip(&share.states).zip(&share.slots) {
                if state != State::Stored {
                    continue;
                }
                let post_id = posts[order[key as u32 as usize] as usize].post_id;
                self.posts
                    .remove_exact(self.posts.hash(post_id), slot, &epoch);
                if self.arena.free(slot, post_id) {
                    retired.push(slot);
                }
            }
        }
        self.arena.retire(retired, &epoch);
    }

    /// Phase 2 for one share: each author's timelines, built whole.
    fn build_share(
        &self,
        posts: &[CompactPost],
        order: &[u32],
        share: &Share,
        ranks: &Ranks,
    ) -> Built {
        let g = self.guards();
        let post_of = |key: u64| &posts[order[key as u32 as usize] as usize];
        let mut built = Built::default();
        let mut scratch = AuthorScratch::default();
        let mut from = 0;
        while from < share.keys.len() {
            let author_id = post_of(share.keys[from]).author_id;
            let to = from
                + share.keys[from..].partition_point(|&k| {
                    k >> 32 == share.keys[from] >> 32 && post_of(k).author_id == author_id
                });
            self.build_author(
                author_id,
                from..to,
                posts,
                order,
                share,
                ranks,
                &g,
                &mut scratch,
                &mut built,
            );
            from = to;
        }
        built
    }

    /// Phase 2 for one author (`range` of the share).
    #[allow(clippy::too_many_arguments)]
    fn build_author(
        &self,
        author_id: i64,
        range: std::ops::Range<usize>,
        posts: &[CompactPost],
        order: &[u32],
        share: &Share,
        ranks: &Ranks,
        g: &Guards<'_>,
        scratch: &mut AuthorScratch,
        built: &mut Built,
    ) {
        let post_of = |key: u64| &posts[order[key as u32 as usize] as usize];
        let cap = self.cap;
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
        for at in range.clone() {
            if share.states[at] != State::Dropped {
                let key = share.keys[at];
                kind_ranks[Kind::primary_of(post_of(key)) as usize].push(key as u32);
            }
        }
        let mut seen = [0usize; 2];
        for at in range {
            let state = share.states[at];
            if state == State::Dropped {
                continue;
            }
            let key = share.keys[at];
            let (post, rank) = (post_of(key), key as u32);
            let kind = Kind::primary_of(post) as usize;
            let index = seen[kind];
            seen[kind] += 1;
            // The rank of the insert that evicts this post from its primary timeline, if any.
            let evicted_at = kind_ranks[kind].get(index + cap).copied();
            if state != State::Stored {
                continue;
            }
            let entry = TinyPost {
                post_id: post.post_id,
                created_at: post.created_at,
                slot: share.slots[at],
            };
            if evicted_at.is_none() {
                timelines[kind].push(entry);
            }
            if has_own_video(post) {
                videos.push((entry.created_at, rank, 0, entry));
            } else if is_video_repost(post) {
                let video_at = self.repost_video_rank(post, rank, evicted_at, ranks, g, built);
                if let Some((inserted_at, after)) = video_at {
                    if self.arena.hold(entry.slot, entry.post_id, IN_VIDEO) {
                        videos.push((entry.created_at, inserted_at, after, entry));
                    }
                }
                if evicted_at.is_some() {
                    built.release.push((entry.post_id, entry.slot));
                }
            }
        }
        // Ascending `created_at`, then the order the per-post path inserted them in.
        if !videos.is_sorted_by_key(|v| (v.0, v.1, v.2)) {
            videos.sort_unstable_by_key(|v| (v.0, v.1, v.2));
        }
        timelines[Kind::Videos as usize].extend(videos.iter().map(|v| v.3));
        if timelines.iter().all(Vec::is_empty) {
            return;
        }
        let Some(author) = self.authors.get_or_create(author_id, &g.epoch) else {
            // Every author number in use: the per-post path indexes nothing either.
            return;
        };
        let _writer = author
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (kind, list) in timelines.iter().enumerate() {
            author.timelines[kind].fill_fresh(list, cap, &g.epoch);
            built.entries[kind] += list.len() as isize;
        }
    }

    /// Whether (and when) the per-post path puts the video repost `post` of rank `rank` into
    /// its author's videos timeline: `(rank of that insert, tie-break)` among entries of equal
    /// `created_at`, or `None`. Records in `built.pending` a repost that waits for its source.
    fn repost_video_rank(
        &self,
        post: &CompactPost,
        rank: u32,
        evicted_at: Option<u32>,
        ranks: &Ranks,
        g: &Guards<'_>,
        built: &mut Built,
    ) -> Option<(u32, u32)> {
        let source_id = post.source_post_id;
        let source = self
            .posts
            .get(self.posts.hash(source_id), &g.epoch, |slot| {
                self.arena
                    .read(slot, source_id)
                    .map(|record| (slot, record))
            })
            .and_then(|(slot, record)| Some((ranks.get(slot)?, record)));
        let shard = self.directory.is_some();
        match source {
            // Stored before the repost: the videos rule decides at its insert.
            Some((source_rank, source)) if source_rank < rank => {
                self.is_video_source(&source, g.now).then_some((rank, 0))
            }
            // A shard indexes every repost whose source is not stored (yet).
            _ if shard => Some((rank, 0)),
            // Stored after the repost: promoted when it arrives, if it is a video source and
            // the repost was not evicted meanwhile.
            Some((source_rank, source)) if source_rank > rank && has_own_video(&source) => {
                evicted_at
                    .is_none_or(|evicted| source_rank < evicted)
                    .then_some((source_rank, rank + 1))
            }
            _ => {
                let waiting = PendingRepost {
                    post_id: post.post_id,
                    author_id: post.author_id,
                    created_at: post.created_at,
                };
                built.pending.push((source_id, rank, waiting));
                None
            }
        }
    }

    /// The end of the build: pending reposts by source (in rank order), records held by no
    /// timeline freed, entry counts.
    fn finish(&self, built: Vec<Built>) {
        let g = self.guards();
        let mut pending = Vec::new();
        let mut retired = Vec::new();
        for share in built {
            pending.extend(share.pending);
            for (post_id, slot) in share.release {
                if self.arena.release(slot, post_id, IN_PRIMARY) == Release::Freed {
                    self.posts
                        .remove_exact(self.posts.hash(post_id), slot, &g.epoch);
                    retired.push(slot);
                }
            }
            for (kind, n) in share.entries.into_iter().enumerate() {
                self.entries[kind].fetch_add(n, Ordering::Relaxed);
            }
        }
        pending.sort_unstable_by_key(|&(source, rank, _)| (source, rank));
        for group in pending.chunk_by(|a, b| a.0 == b.0) {
            let waiting = group.iter().map(|&(_, _, repost)| repost).collect();
            self.pending_videos.insert(group[0].0, waiting, &g.maps);
        }
        self.arena.retire(retired, &g.epoch);
    }
}

/// Per-thread buffers reused from one author to the next.
#[derive(Default)]
struct AuthorScratch {
    /// Ranks of the author's stored-or-evicted posts, per primary timeline, in rank order.
    kind_ranks: [Vec<u32>; 2],
    timelines: [Vec<TinyPost>; 3],
    /// `(created_at, rank of the insert, tie-break, entry)`.
    videos: Vec<(u32, u32, u32, TinyPost)>,
}
