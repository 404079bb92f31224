//! The read path: "the newest posts of these authors".
//!
//! The reference collects up to 50 + 30 candidates from every author (one hash lookup per
//! scanned entry), then sorts them all to keep the newest 1200. Here every requested timeline
//! becomes a *stream* read newest first, and the streams are merged in key order (`created_at`,
//! then `post_id`): posts come out globally newest first, each stream stops at its per-author
//! limit or scan window, and the whole query stops at `max_results`. The answer is the same as
//! the reference's (rules in `BEHAVIOUR.md`); the work is proportional to what is returned, not
//! to what the authors hold.
//!
//! The merge queue ([`Merge`]) is shaped by what a large request does: of a 2000-author
//! request's ~4000 streams about 1000 are reached and most give one post. So only the
//! `max_results` highest-ranked streams are queued (the rest join only if the merge falls
//! below them), sorted once and taken from the front, and only streams that go on after their
//! first post enter a 4-ary heap, where their older entries mostly stop at the bottom.
//!
//! Memory: ranking needs no timeline buffer. Each timeline keeps, next to its buffer pointer,
//! the entry count and newest `created_at` its writer last published; streams are ranked by
//! those, and a ring's view is taken only when the merge actually reaches that stream (most of
//! a 2000-author request's streams never are). The streams the merge reaches next are staged
//! sixteen at a time, each stage for the whole group before the next (their buffers, then
//! their newest cells, then their first entries, whose records are prefetched), so that the
//! misses of sixteen streams overlap instead of following one another stream by stream; and a
//! stream prefetches the record of its next entry as soon as it advances. Timeline entries
//! carry the record's slot, so no hash lookup happens per entry; only a reply's parent is
//! looked up.
//!
//! Scratch (sets, streams, heap) lives in a per-thread bumpalo arena that is reset, not freed,
//! between queries.
//!
//! The query is a few named steps: `rank_timelines` (resolve the authors, rank their
//! timelines), `merge` (the loop), and the rules the merge applies to the entry it takes
//! (`Reader::advance`: time bounds, exclusions, seen filter, retention; `Rules::take`: the
//! videos rule, the self-repost filter, the reply rule, the page position, `max_results`;
//! `Rules::go_on`: the per-author limit and scan window). Every step reports each decision to
//! a [`QueryObserver`]: the serving path's ([`Unobserved`]) does nothing and compiles away
//! (measured, docs/performance-history.md), the explain path's (`explain.rs`) keeps the
//! decisions about the posts it was asked about.

use crate::arena::CompactPost;
use crate::authors::{Author, Kind};
use crate::base::{Base, Embedded, Line, RunCursor};
use crate::config::{MAX_TINY_POSTS_PER_USER_SCAN, MAX_VIDEO_POSTS_PER_AUTHOR};
use crate::feed_query::{FeedQuery, QueryOutcome};
use crate::index::Hashed;
use crate::observe::{Decision, QueryObserver, Rejection, ReplyRuleMiss, StreamEnd, Unobserved};
use crate::page::AnswerWindow;
use crate::post::LightPost;
use crate::prefetch::prefetch;
use crate::seen::SeenFilter;
use crate::tables::StoreTables;
use crate::timeline::{RingView, Timeline, TinyPost};
use bumpalo::Bump;
use bumpalo::collections::Vec as BumpVec;
use crossbeam_epoch::Guard;
use std::cell::RefCell;
use std::time::Instant;

type ScratchSet<'b> = hashbrown::HashSet<i64, foldhash::fast::RandomState, &'b Bump>;

thread_local! {
    /// Per-thread query scratch; reset at the start of every query.
    static SCRATCH: RefCell<Bump> = RefCell::new(Bump::with_capacity(64 * 1024));
}

/// How often (in authors or popped entries) the deadline is looked at.
const DEADLINE_STRIDE: usize = 64;

/// How the merge works ahead of its top, so that the misses of the streams it reaches next
/// overlap. The serving path always uses [`Walk::SERVING`]; the other walks exist so that
/// `compare --walks` can measure them beside it in one process.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    /// One ranked stream per step of the merge, each stage a fixed number of places behind
    /// the top (materialized 2, its cell 4, its buffer 8, its record line 12 places ahead).
    Distance,
    /// The ranked streams staged `n` at a time, each stage for the whole group before the
    /// next (group prefetching): their buffers, then their newest cells, then their first
    /// entries, kept at least `n` places ahead of the top.
    Groups(usize),
}

impl Walk {
    /// The walk every query takes unless a benchmark chose another on its thread.
    pub const SERVING: Walk = Walk::Groups(16);
}

thread_local! {
    /// The walk of this thread's queries ([`set_walk`]).
    static WALK: std::cell::Cell<Walk> = const { std::cell::Cell::new(Walk::SERVING) };
}

/// Makes this thread's queries take `walk` (a benchmark's switch; see [`Walk`]).
#[doc(hidden)]
pub fn set_walk(walk: Walk) {
    WALK.with(|w| w.set(walk));
}

/// How far behind the merge's top a ranked stream is materialized.
const MATERIALIZE_AHEAD: usize = 2;

/// How far behind that a ranked stream's newest entry (its ring cell) is prefetched: the
/// buffer's header, prefetched further ahead, says where it is.
const CELL_AHEAD: usize = 2;

/// How far behind that a ranked stream's buffer is prefetched.
const PREFETCH_AHEAD: usize = 4;

/// How far behind that a ranked stream's timeline (in its author's record) is prefetched: the
/// record was read when the authors were resolved, but a large request's records have left
/// the cache by the time the merge reaches them, and the buffer's address is in the record.
const RECORD_AHEAD: usize = 4;

/// Which question is asked.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Originals and replies+reposts.
    AllPosts,
    /// Videos.
    Videos,
}

/// Where a stream's entries come from.
#[derive(Clone, Copy)]
enum Source<'g> {
    /// A head timeline. `view` is taken when the merge first reaches the stream; `seq` is the
    /// sequence number of the stream's current entry.
    Ring {
        timeline: &'g Timeline,
        view: Option<RingView<'g>>,
        seq: u64,
    },
    /// A run of the base. `next` is the run's next entry to read, `read` whether the merge
    /// reached the stream; the current entry's `slot` holds its record's granule.
    Base {
        run: RunCursor,
        author_id: i64,
        next: u16,
        read: bool,
    },
}

/// One timeline being read newest first: a head timeline or a base run. An author with both
/// for one kind has a stream of each, and the two share the per-author limit and the scan
/// window (`partner`), so that the merge reads them as the one timeline they are.
struct Stream<'g> {
    source: Source<'g>,
    /// Until the stream is reached, its rank: the newest entry's `created_at` and `post_id`
    /// as the writer published them (or the base's directory holds them), or an upper bound
    /// of them (its `slot` is meaningless).
    current: TinyPost,
    kind: Kind,
    taken: u16,
    limit: u16,
    examined: u16,
    /// The stream of the other tier for the same author and kind, or `NO_PARTNER`.
    partner: u32,
    /// Why the stream ended, not yet told to the observer (`end_stream`); or, for a stream
    /// with a partner that has not ended, kept for the timeline's end.
    ending: Option<End>,
    /// A stream with a partner stops at the entries it skips too (excluded, seen, past the
    /// upper bound): `current` is then one of them, and this what was decided of it, told to
    /// the observer when the merge takes it. So the decisions about one timeline come in its
    /// order even when two streams read it (had the partner filled the per-author limit with
    /// newer entries, the skipped entry is past that limit, as one timeline would say).
    skip: Option<Skip>,
    /// Materialized and found nothing readable at or below its rank.
    done: bool,
}

/// A stream's `partner` when it has none.
const NO_PARTNER: u32 = u32::MAX;

impl Stream<'_> {
    /// Whether the merge has reached the stream (taken its view, or started its run).
    #[inline]
    fn reached(&self) -> bool {
        match self.source {
            Source::Ring { view, .. } => view.is_some(),
            Source::Base { read, .. } => read,
        }
    }
}

/// Everything a stream needs to advance.
struct Reader<'q> {
    tables: &'q StoreTables,
    /// The store's base, if it has one.
    base: Option<&'q Base>,
    exclude: &'q ScratchSet<'q>,
    seen: Option<&'q SeenFilter>,
    now: i64,
    /// Entries created after this are skipped (the window's upper bound, at most `now`).
    newest: i64,
    /// Entries created before this end the scan (the window's lower bound).
    oldest: i64,
}

impl Reader<'_> {
    /// Takes a view of stream `index`'s timeline and moves to its newest readable entry no
    /// later in key order than the rank it was given (entries that arrived since are left for
    /// the next query, which keeps the answer in order). False when nothing is left.
    fn materialize<'g, O: QueryObserver>(
        &self,
        s: &mut Stream<'g>,
        index: usize,
        guard: &'g Guard,
        observer: &mut O,
    ) -> bool {
        match &mut s.source {
            Source::Ring {
                timeline,
                view,
                seq,
            } => {
                let Some(taken) = timeline.view(guard) else {
                    s.ending = Some(End::Exhausted);
                    return false;
                };
                *view = Some(taken);
                *seq = taken.head;
            }
            Source::Base { read, .. } => *read = true,
        }
        let hint = s.current.key();
        while self.advance(s, index, observer) {
            if s.current.key() <= hint {
                return true;
            }
            // Above the rank (past the window's upper bound, or arrived since): decided now,
            // before anything of the timeline can have been taken.
            if let Some(skipped) = s.skip.take() {
                let decision = skipped.decision(self.newest);
                observer.decided(index, s.current.post_id, s.current.created_at, decision);
            }
        }
        false
    }

    /// Materializes stream `index` the first time it is reached (at the top or working
    /// ahead); false when it has nothing readable at or below its rank.
    #[inline]
    fn reach<'g, O: QueryObserver>(
        &self,
        s: &mut Stream<'g>,
        index: usize,
        guard: &'g Guard,
        observer: &mut O,
    ) -> bool {
        if !s.reached() && !s.done {
            s.done = !self.materialize(s, index, guard, observer);
        }
        !s.done
    }

    /// Materializes the streams of `keys` a stage at a time, so that the misses of each stage
    /// overlap across the group instead of following one another stream by stream: every
    /// stream's buffer header, then (the headers having arrived) every newest cell, then each
    /// stream moves to its first readable entry, which prefetches that entry's record.
    fn stage<'g, O: QueryObserver>(
        &self,
        streams: &mut [Stream<'g>],
        keys: &[u128],
        guard: &'g Guard,
        observer: &mut O,
    ) {
        let unread = |s: &Stream<'_>| !s.reached() && !s.done;
        for &key in keys {
            let stream = &streams[stream_of(key)];
            if unread(stream) {
                match stream.source {
                    Source::Ring { timeline, .. } => prefetch(timeline.buffer_ptr(guard)),
                    // A base run's first entry: its record (or its reference).
                    Source::Base { run, .. } => {
                        if let Some(base) = self.base {
                            prefetch(base.first_ptr(&run));
                        }
                    }
                }
            }
        }
        for &key in keys {
            let stream = &streams[stream_of(key)];
            if unread(stream) {
                match stream.source {
                    Source::Ring { timeline, .. } => prefetch(timeline.newest_cell_ptr(guard)),
                    // The line after a base run's first: its next records (a record is under
                    // a line; the merge often takes two or three of a run).
                    Source::Base { run, .. } => {
                        if let Some(base) = self.base {
                            prefetch(base.first_ptr(&run).wrapping_add(64));
                        }
                    }
                }
            }
        }
        for &key in keys {
            let index = stream_of(key);
            if !self.reach(&mut streams[index], index, guard, observer) {
                end_stream(streams, index, self.oldest, observer);
            }
        }
    }

    /// Moves stream `index` to its next older entry that is neither skipped nor past its end;
    /// false (the end reported) when none. Runs once per post the merge takes: kept in the
    /// merge loop (left to the hint, the compiler called it out of line: 1.22x the CPU per
    /// post at scale 10, 2026-12-07 in docs/performance-history.md).
    #[inline(always)]
    fn advance<O: QueryObserver>(
        &self,
        s: &mut Stream<'_>,
        index: usize,
        observer: &mut O,
    ) -> bool {
        let partnered = s.partner != NO_PARTNER;
        if partnered {
            s.skip = None;
        }
        match &mut s.source {
            Source::Ring { view, seq, .. } => {
                let Some(view) = *view else { return false };
                while *seq > view.tail {
                    *seq -= 1;
                    // None: the writer evicted it meanwhile; everything older is gone too.
                    let Some(entry) = view.get(*seq) else {
                        s.ending = Some(End::Exhausted);
                        return false;
                    };
                    let on_read = || self.tables.posts.prefetch_record(entry.slot);
                    let at = (&mut s.current, &mut s.skip, &mut s.ending);
                    if let Some(stands) =
                        self.stop_at(entry, at, partnered, on_read, index, observer)
                    {
                        return stands;
                    }
                }
            }
            Source::Base { run, next, .. } => {
                // Base streams are only opened over a base.
                let Some(base) = self.base else { return false };
                while *next < run.end {
                    let at = usize::from(*next);
                    *next += 1;
                    // A gone entry (deleted, evicted, trimmed) is not in the timeline.
                    let Some(entry) = base.entry(run, at) else {
                        continue;
                    };
                    let entry = TinyPost {
                        post_id: entry.post_id,
                        created_at: entry.created_at,
                        // The granule: a base's references are `u32`.
                        slot: entry.granule as u32,
                    };
                    let at = (&mut s.current, &mut s.skip, &mut s.ending);
                    if let Some(stands) = self.stop_at(entry, at, partnered, || (), index, observer)
                    {
                        return stands;
                    }
                }
            }
        }
        s.ending = Some(End::Exhausted);
        false
    }

    /// What [`advance`](Self::advance) does with a stream's next entry, `entry`: `None` to go
    /// on to the one after it (skipped, and told to the observer), or `Some` to stop: `true`
    /// standing on it (`current`; read, after `on_read`, or, for a stream with a partner, a
    /// skip decided in the merge's order, see `Stream::skip`), `false` at the stream's end
    /// (`ending`). `at`: the stream's `current`, `skip` and `ending`.
    #[inline(always)]
    fn stop_at<O: QueryObserver>(
        &self,
        entry: TinyPost,
        at: (&mut TinyPost, &mut Option<Skip>, &mut Option<End>),
        partnered: bool,
        on_read: impl FnOnce(),
        index: usize,
        observer: &mut O,
    ) -> Option<bool> {
        let (current, skip, ending) = at;
        match self.screen(entry.created_at, entry.post_id) {
            Screen::Read => {
                on_read();
                *current = entry;
                Some(true)
            }
            Screen::Skip(skipped) if partnered => {
                *current = entry;
                *skip = Skip::of(skipped);
                Some(true)
            }
            Screen::Skip(skipped) => {
                observer.decided(index, entry.post_id, entry.created_at, skipped);
                None
            }
            Screen::End(end) => {
                *ending = Some(End::of(end));
                Some(false)
            }
        }
    }

    /// What a stream does with an entry created at `created_at`: read it, skip it, or end
    /// (an entry past retention or the window's lower bound: everything older is too).
    #[inline(always)]
    fn screen(&self, created_at: u32, post_id: i64) -> Screen {
        if self.tables.retention.expired(created_at, self.now) {
            return Screen::End(StreamEnd::Expired);
        }
        let created = i64::from(created_at);
        if created < self.oldest {
            return Screen::End(StreamEnd::BeforeMinCreatedAt {
                min_created_at: self.oldest,
            });
        }
        if created > self.newest {
            Screen::Skip(Decision::AfterUpperBound {
                upper_bound: self.newest,
            })
        } else if !self.exclude.is_empty() && self.exclude.contains(&post_id) {
            Screen::Skip(Decision::Excluded)
        } else if self.seen.is_some_and(|seen| seen.contains(post_id)) {
            Screen::Skip(Decision::Seen)
        } else {
            Screen::Read
        }
    }
}

/// Tells `observer` why stream `index` ended (its `ending`, once). A stream with a partner
/// reads part of a timeline: its end is kept until the partner's, and the timeline's end is
/// then the one that covers more of it (a per-author limit or the scan window, then the
/// window's lower bound, then retention, then running out of entries: an entry before the
/// lower bound and not expired is newer than any expired one).
#[inline]
fn end_stream<O: QueryObserver>(
    streams: &mut [Stream<'_>],
    index: usize,
    oldest: i64,
    observer: &mut O,
) {
    let Some(end) = streams[index].ending.take() else {
        return;
    };
    let limit = usize::from(streams[index].limit);
    let partner = streams[index].partner;
    if partner == NO_PARTNER {
        observer.ended(index, end.why(limit, oldest));
        return;
    }
    // A partner's `ending` is set only between its end and its partner's: it ended first.
    let Some(first) = streams[partner as usize].ending.take() else {
        streams[index].ending = Some(end);
        return;
    };
    let covers = |end: End| match end {
        End::Limit | End::ScanWindow => 3,
        End::BeforeMinCreatedAt => 2,
        End::Expired => 1,
        End::Exhausted => 0,
    };
    let timeline_end = if covers(first) > covers(end) {
        first
    } else {
        end
    };
    observer.ended(index, timeline_end.why(limit, oldest));
}

/// Why a stream ended, in a byte (a stream of every ranked timeline is in the query's
/// scratch): [`StreamEnd`] without the figures, which the stream and the query hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Limit,
    ScanWindow,
    Expired,
    BeforeMinCreatedAt,
    Exhausted,
}

impl End {
    fn of(end: StreamEnd) -> Self {
        match end {
            StreamEnd::Limit { .. } => End::Limit,
            StreamEnd::ScanWindow => End::ScanWindow,
            StreamEnd::Expired => End::Expired,
            StreamEnd::BeforeMinCreatedAt { .. } => End::BeforeMinCreatedAt,
            StreamEnd::Exhausted => End::Exhausted,
        }
    }

    /// The end with its figures: the stream's `limit`, the query's lower bound `oldest`.
    fn why(self, limit: usize, oldest: i64) -> StreamEnd {
        match self {
            End::Limit => StreamEnd::Limit { limit },
            End::ScanWindow => StreamEnd::ScanWindow,
            End::Expired => StreamEnd::Expired,
            End::BeforeMinCreatedAt => StreamEnd::BeforeMinCreatedAt {
                min_created_at: oldest,
            },
            End::Exhausted => StreamEnd::Exhausted,
        }
    }
}

/// What a stream skipped an entry for, in a byte (see `Stream::skip`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Skip {
    AfterUpperBound,
    Excluded,
    Seen,
}

impl Skip {
    fn of(decision: Decision) -> Option<Self> {
        match decision {
            Decision::AfterUpperBound { .. } => Some(Skip::AfterUpperBound),
            Decision::Excluded => Some(Skip::Excluded),
            Decision::Seen => Some(Skip::Seen),
            _ => None,
        }
    }

    /// The decision with its figures: the query's upper bound `newest`.
    fn decision(self, newest: i64) -> Decision {
        match self {
            Skip::AfterUpperBound => Decision::AfterUpperBound {
                upper_bound: newest,
            },
            Skip::Excluded => Decision::Excluded,
            Skip::Seen => Decision::Seen,
        }
    }
}

/// What [`Reader::screen`] says of an entry.
enum Screen {
    Read,
    Skip(Decision),
    End(StreamEnd),
}

/// A merge heap key: the stream's current entry in the answer order (`created_at`, then
/// `post_id`, both larger first), then the stream's index. Ids are mapped to `u64` in order.
#[inline]
fn heap_key(entry: TinyPost, index: usize) -> u128 {
    (u128::from(entry.created_at) << 96)
        | (u128::from((entry.post_id as u64) ^ (1 << 63)) << 32)
        | index as u128
}

/// The stream a heap key belongs to.
#[inline]
fn stream_of(key: u128) -> usize {
    (key & u128::from(u32::MAX)) as usize
}

/// Children per heap node. A 4-ary heap is half as deep as a binary one: a replaced root
/// that sinks (most do: a stream's next entry is usually far older than the other streams'
/// newest) takes half the dependent steps, and the four children of a node are 64
/// contiguous bytes.
const ARITY: usize = 4;

/// Moves the key at `i` down to its place: the largest child moves up into the hole until the
/// key is no smaller than all children (one write per level, no swaps). The largest child is
/// picked without branches (its position is data-dependent and would mispredict).
fn sift_down(heap: &mut [u128], mut i: usize) {
    let len = heap.len();
    let Some(&key) = heap.get(i) else { return };
    loop {
        let first = ARITY * i + 1;
        if first >= len {
            break;
        }
        let end = (first + ARITY).min(len);
        let mut child = first;
        let mut best = heap[first];
        for (c, &value) in heap.iter().enumerate().take(end).skip(first + 1) {
            let larger = value > best;
            child = if larger { c } else { child };
            best = if larger { value } else { best };
        }
        if best <= key {
            break;
        }
        heap[i] = best;
        i = child;
    }
    heap[i] = key;
}

/// Moves the key at `i` up to its place (a push).
fn sift_up(heap: &mut [u128], mut i: usize) {
    let Some(&key) = heap.get(i) else { return };
    while i > 0 {
        let parent = (i - 1) / ARITY;
        if heap[parent] >= key {
            break;
        }
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = key;
}

/// The merge's queue of stream keys, largest first, in three parts:
///
/// - `ranked`: the streams not read yet that rank highest, sorted, taken from the front.
///   Most streams of a large request give one post or none, so most keys leave from here at
///   the cost of a step.
/// - `heap`: the streams already read that go on (a 4-ary max-heap). Their next entries are
///   mostly older than everything queued, so a push usually stops at once.
/// - `reserve`: the streams ranked too low to matter while every reached stream gives a post
///   (`max_results` posts come from the `max_results` highest-ranked streams at most); they
///   join `ranked` only if the merge falls below the best of them (posts filtered out, ranks
///   that were upper bounds), ranked again with its rest, twice as many kept each time. A
///   2000-author request leaves about three in four here.
struct Merge<'b> {
    ranked: BumpVec<'b, u128>,
    next: usize,
    heap: BumpVec<'b, u128>,
    reserve: BumpVec<'b, u128>,
    reserve_best: Option<u128>,
    /// Whether the last `top` came from the heap.
    top_in_heap: bool,
    /// `ranked` positions below this were handed out by `next_ahead` or `group_ahead`.
    ahead: usize,
    /// How many keys the next ranking keeps sorted: the answer's size at first, doubled at
    /// each bring-in of the reserve.
    keep: usize,
    bump: &'b Bump,
}

impl<'b> Merge<'b> {
    /// The queue of `keys` (one per stream, in any order) for an answer of `max_results`.
    fn new(keys: BumpVec<'b, u128>, max_results: usize, bump: &'b Bump) -> Self {
        let keep = max_results.max(1);
        let (ranked, reserve, reserve_best) = rank(keys, keep, bump);
        Self {
            heap: BumpVec::with_capacity_in(ranked.len().min(4096), bump),
            ranked,
            next: 0,
            reserve_best,
            reserve,
            top_in_heap: false,
            ahead: 0,
            keep,
            bump,
        }
    }

    /// The largest key queued, or `None` when the queue is empty.
    // Always: the merge of every observer calls it; with two instantiations of the merge
    // (the serving path's and the explain path's) the compiler called it out of line.
    #[inline(always)]
    fn top(&mut self) -> Option<u128> {
        let mut ranked = self.ranked.get(self.next).copied();
        let heap = self.heap.first().copied();
        if let Some(best) = self.reserve_best
            && ranked.max(heap).is_none_or(|top| top < best)
        {
            // Bring the next streams in: `ranked`'s rest and the reserve, ranked again as at
            // the start (the largest sorted, the rest held back unsorted), which takes linear
            // time where sorting them all did not. A request whose exclusions or filters skip
            // many posts comes here: in `compare`, every 10000-follow query, with about 18,500
            // keys held back. Each time twice as many are kept as the time before, so a
            // request that filters out nearly everything ranks its keys a logarithmic number
            // of times, not once per `keep`.
            self.keep = self.keep.saturating_mul(2);
            let mut keys = BumpVec::with_capacity_in(
                self.ranked.len() - self.next + self.reserve.len(),
                self.bump,
            );
            keys.extend_from_slice(&self.ranked[self.next..]);
            keys.extend_from_slice(&self.reserve);
            (self.ranked, self.reserve, self.reserve_best) = rank(keys, self.keep, self.bump);
            self.next = 0;
            self.ahead = 0;
            ranked = self.ranked.first().copied();
        }
        // Keys are distinct (they end in the stream index).
        self.top_in_heap = heap > ranked;
        ranked.max(heap)
    }

    /// The next key of `ranked` after the top and at most `depth` places behind it that was
    /// not handed out yet, for work ahead of the merge.
    #[inline]
    fn next_ahead(&mut self, depth: usize) -> Option<u128> {
        self.ahead = self.ahead.max(self.next + 1);
        if self.ahead > self.next + depth {
            return None;
        }
        let key = self.ranked.get(self.ahead).copied()?;
        self.ahead += 1;
        Some(key)
    }

    /// The next `group` keys of `ranked` not handed out yet, when fewer than `group` keys
    /// behind the top have been: the streams to stage next, so that what was staged before
    /// has `group` steps of the merge to arrive.
    #[inline]
    fn group_ahead(&mut self, group: usize) -> Option<&[u128]> {
        self.ahead = self.ahead.max(self.next + 1);
        if self.ahead >= self.next + 1 + group || self.ahead >= self.ranked.len() {
            return None;
        }
        let from = self.ahead;
        self.ahead = (from + group).min(self.ranked.len());
        Some(&self.ranked[from..self.ahead])
    }

    /// The key of `ranked` `depth` places behind the top, if any.
    #[inline]
    fn ranked_behind(&self, depth: usize) -> Option<u128> {
        self.ranked.get(self.next + depth).copied()
    }

    /// Takes the top out (its stream is done).
    #[inline]
    fn pop(&mut self) {
        if self.top_in_heap {
            let last = self.heap.len() - 1;
            self.heap.swap(0, last);
            self.heap.pop();
            sift_down(&mut self.heap, 0);
        } else {
            self.next += 1;
        }
    }

    /// Replaces the top by `key` (its stream goes on, ranked lower).
    // Always: the merge of every observer calls it; with two instantiations of the merge
    // (the serving path's and the explain path's) the compiler called it out of line.
    #[inline(always)]
    fn replace(&mut self, key: u128) {
        if self.top_in_heap {
            self.heap[0] = key;
            sift_down(&mut self.heap, 0);
        } else {
            self.next += 1;
            self.heap.push(key);
            let last = self.heap.len() - 1;
            sift_up(&mut self.heap, last);
        }
    }
}

/// Seconds of `created_at` that [`rank`] counts one by one: the `keep` newest streams of a
/// 2000-author request span about an hour (3630 s at demo scale 100, 1064 s at scale 10).
const RANK_SPAN_SECS: usize = 4096;

/// The ranked keys (largest first), the reserve (in no order) and the reserve's largest key.
type Ranked<'b> = (BumpVec<'b, u128>, BumpVec<'b, u128>, Option<u128>);

/// Splits `keys` into the ranked part, sorted largest first, and the reserve (in no order)
/// with its largest key. With more than `2 * keep` keys the ranked part is the `keep`
/// largest; with fewer, every key is ranked.
///
/// Large requests are sorted by `created_at` first, the key's top 32 bits: a counting sort by
/// age (seconds behind the newest key) puts each key in its second, and only the seconds that
/// hold more than one key are then sorted (by the rest of the key). The counts also show the
/// second where the `keep` largest end, so the older keys go to the reserve unsorted. When
/// the `keep` largest span more than `RANK_SPAN_SECS`, a selection and a comparison sort do
/// it, as they do for every smaller request.
fn rank<'b>(keys: BumpVec<'b, u128>, keep: usize, bump: &'b Bump) -> Ranked<'b> {
    if keys.len() > keep.saturating_mul(2)
        && let Some(ranked) = rank_by_second(&keys, keep, bump)
    {
        return ranked;
    }
    rank_by_comparison(keys, keep, bump)
}

/// [`rank`] by selection and comparison sort.
fn rank_by_comparison<'b>(mut keys: BumpVec<'b, u128>, keep: usize, bump: &'b Bump) -> Ranked<'b> {
    let mut reserve = BumpVec::new_in(bump);
    if keys.len() > keep.saturating_mul(2) {
        // Largest first: the best of the rest lands at `keep`.
        keys.select_nth_unstable_by(keep, |a, b| b.cmp(a));
        reserve.extend_from_slice(&keys[keep..]);
        keys.truncate(keep);
    }
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let best = reserve.first().copied();
    (keys, reserve, best)
}

/// [`rank`] by counting seconds; `None` when the `keep` largest span more than
/// `RANK_SPAN_SECS`.
fn rank_by_second<'b>(keys: &[u128], keep: usize, bump: &'b Bump) -> Option<Ranked<'b>> {
    let created = |key: u128| (key >> 96) as u32;
    let newest = keys.iter().map(|&k| created(k)).max()?;
    let age = |key: u128| ((newest - created(key)) as usize).min(RANK_SPAN_SECS);
    // counts[a]: keys `a` seconds behind the newest; the older keys (most of a large request)
    // are counted over the last `OLDER_LANES` entries in turn, so that their increments do not
    // wait on one another.
    const OLDER_LANES: usize = 8;
    let counts: &mut [u32] = bump.alloc_slice_fill_copy(RANK_SPAN_SECS + OLDER_LANES, 0);
    for (i, &key) in keys.iter().enumerate() {
        let a = age(key);
        let lane = if a < RANK_SPAN_SECS {
            a
        } else {
            RANK_SPAN_SECS + i % OLDER_LANES
        };
        counts[lane] += 1;
    }
    // `cut`: the second where the `keep` largest end; `before`: the keys newer than it.
    let mut before = 0usize;
    let mut cut = 0usize;
    loop {
        if cut == RANK_SPAN_SECS {
            // The `keep` largest go on among the keys older than the span.
            return None;
        }
        let n = counts[cut] as usize;
        if before + n > keep {
            break;
        }
        before += n;
        cut += 1;
    }
    // Counting sort into one buffer: the seconds up to `cut`, then every older key, placed
    // without a branch per key (an older key goes to the next free place of its region, a
    // register; the count it bumps meanwhile is one of the older lanes, which are not used
    // again). `counts[a]` becomes second `a`'s start, then its end as its keys are placed.
    let mut start = 0u32;
    for count in counts.iter_mut().take(cut + 1) {
        let n = *count;
        *count = start;
        start += n;
    }
    let mut older_at = start as usize;
    let mut out = BumpVec::with_capacity_in(keys.len(), bump);
    out.resize(keys.len(), 0u128);
    for (i, &key) in keys.iter().enumerate() {
        let a = age(key);
        let in_span = a <= cut;
        let lane = if in_span {
            a
        } else {
            RANK_SPAN_SECS + i % OLDER_LANES
        };
        let counted = counts[lane] as usize;
        counts[lane] += 1;
        out[if in_span { counted } else { older_at }] = key;
        older_at += usize::from(!in_span);
    }
    // Within a second, by the rest of the key.
    let mut from = 0usize;
    for &end in counts.iter().take(cut + 1) {
        let end = end as usize;
        if end - from > 1 {
            out[from..end].sort_unstable_by(|a, b| b.cmp(a));
        }
        from = end;
    }
    // The cut second's largest fill the last places; the rest of it and the older keys are the
    // reserve, whose best is the cut second's first left over (the cut second holds more than
    // the places left, and is newer than every older key).
    let mut reserve = BumpVec::with_capacity_in(keys.len() - keep, bump);
    reserve.extend_from_slice(&out[keep..]);
    let best = reserve.first().copied();
    out.truncate(keep);
    Some((out, reserve, best))
}

/// [`Walk::Distance`]'s step: a stream `MATERIALIZE_AHEAD` places behind the top is
/// materialized (which reads its newest cell and prefetches the entry's record), one
/// `CELL_AHEAD` places further has that cell prefetched (reading the header), one
/// `PREFETCH_AHEAD` places further has its buffer's header prefetched, and one `RECORD_AHEAD`
/// places further still has its timeline (the line of its author's record that holds the
/// buffer's address) prefetched.
fn work_ahead<'g, O: QueryObserver>(
    reader: &Reader<'_>,
    queue: &mut Merge<'_>,
    streams: &mut [Stream<'g>],
    guard: &'g Guard,
    observer: &mut O,
) {
    while let Some(key) = queue.next_ahead(MATERIALIZE_AHEAD) {
        let index = stream_of(key);
        if !reader.reach(&mut streams[index], index, guard, observer) {
            end_stream(streams, index, reader.oldest, observer);
        }
    }
    // The ring of an unread head stream at `depth` places behind the top (a base stream's
    // first record is prefetched when it is staged or reached).
    let unread = |depth: usize| {
        queue
            .ranked_behind(depth)
            .map(|key| &streams[stream_of(key)])
            .filter(|stream| !stream.reached())
            .and_then(|stream| match stream.source {
                Source::Ring { timeline, .. } => Some(timeline),
                Source::Base { .. } => None,
            })
    };
    if let Some(timeline) = unread(MATERIALIZE_AHEAD + CELL_AHEAD) {
        prefetch(timeline.newest_cell_ptr(guard));
    }
    if let Some(timeline) = unread(MATERIALIZE_AHEAD + CELL_AHEAD + PREFETCH_AHEAD) {
        prefetch(timeline.buffer_ptr(guard));
    }
    if let Some(timeline) = unread(MATERIALIZE_AHEAD + CELL_AHEAD + PREFETCH_AHEAD + RECORD_AHEAD) {
        prefetch((timeline as *const Timeline).cast());
    }
}

fn timed_out(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Answers `query` from `tables` (`ask`: which of the two questions): the read path.
pub(crate) fn run(tables: &StoreTables, query: &FeedQuery<'_>, ask: Ask) -> QueryOutcome {
    run_observed(tables, query, ask, &mut Unobserved)
}

/// [`run`], telling `observer` what every rule decided.
pub(crate) fn run_observed<O: QueryObserver>(
    tables: &StoreTables,
    query: &FeedQuery<'_>,
    ask: Ask,
    observer: &mut O,
) -> QueryOutcome {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut bump) => {
            bump.reset();
            query_in(tables, query, ask, &bump, observer)
        }
        // Re-entered from inside a query on this thread (not done by this crate): use a
        // private arena rather than share.
        Err(_) => query_in(tables, query, ask, &Bump::new(), observer),
    })
}

/// The timelines a query reads, with their per-author limits (0: counted, not read),
/// and how many of the two rows are used.
fn stream_limits(query: &FeedQuery<'_>, ask: Ask) -> ([(Kind, usize); 2], usize) {
    match ask {
        Ask::AllPosts => {
            let limits = query.per_author_limits();
            (
                [
                    (Kind::Originals, limits.originals),
                    (Kind::Secondary, limits.secondary),
                ],
                2,
            )
        }
        Ask::Videos => (
            [
                (Kind::Videos, MAX_VIDEO_POSTS_PER_AUTHOR),
                (Kind::Videos, 0),
            ],
            1,
        ),
    }
}

/// The query, in named steps: the requested timelines are ranked ([`rank_timelines`]), then
/// merged newest first into the answer ([`merge`]), each entry the merge takes put through the
/// rules that need its record ([`Rules::take`]).
fn query_in<O: QueryObserver>(
    tables: &StoreTables,
    query: &FeedQuery<'_>,
    ask: Ask,
    bump: &Bump,
    observer: &mut O,
) -> QueryOutcome {
    let mut followed =
        ScratchSet::with_capacity_and_hasher_in(query.authors.len(), Default::default(), bump);
    let mut exclude =
        ScratchSet::with_capacity_and_hasher_in(query.exclude.len(), Default::default(), bump);
    exclude.extend(query.exclude.iter().copied());
    let g = tables.guards();
    let mut outcome = QueryOutcome {
        as_of_secs: g.now,
        ..QueryOutcome::default()
    };
    let reader = Reader {
        tables,
        base: tables.base(),
        exclude: &exclude,
        seen: query.seen,
        now: g.now,
        newest: query.window.upper_bound(g.now),
        oldest: query.window.lower_bound(),
    };
    let ranked = rank_timelines(
        &reader,
        query,
        ask,
        &mut followed,
        &g.epoch,
        bump,
        &mut outcome,
        observer,
    );
    let rules = Rules {
        reader: &reader,
        followed: &followed,
        viewer_id: query.viewer_id,
        epoch: &g.epoch,
    };
    outcome.posts = merge(
        &rules,
        query,
        ranked,
        bump,
        &mut outcome.timed_out,
        observer,
    );
    outcome
}

/// The streams of a query, one per requested timeline worth reading, and their merge keys.
struct Streams<'g, 'b> {
    streams: BumpVec<'b, Stream<'g>>,
    keys: BumpVec<'b, u128>,
}

/// What ranking reads of a timeline without touching its entries: its length and its newest
/// entry's key (for a head timeline as its writer published it; for a base run as its
/// directory line holds it, an upper bound once entries are gone).
#[derive(Clone, Copy)]
struct Newest {
    len: usize,
    created_at: u32,
    post_id: i64,
}

impl<'g> Streams<'g, '_> {
    /// Opens a stream on `source` (a timeline of `author_id` of `kind`, whose length and
    /// newest entry are `newest`), read up to `limit` posts: its index.
    #[allow(clippy::too_many_arguments)]
    fn push<O: QueryObserver>(
        &mut self,
        reader: &Reader<'_>,
        author_id: i64,
        source: Source<'g>,
        newest: Newest,
        kind: Kind,
        limit: usize,
        observer: &mut O,
    ) -> usize {
        // Ranked by the newest entry, or, past the window's upper bound, above every entry of
        // that second: materializing finds the entry at or below it.
        let bound = u32::try_from(reader.newest.max(0)).unwrap_or(u32::MAX);
        let rank = if newest.created_at <= bound {
            TinyPost {
                post_id: newest.post_id,
                created_at: newest.created_at,
                slot: 0,
            }
        } else {
            TinyPost {
                post_id: i64::MAX,
                created_at: bound,
                slot: 0,
            }
        };
        let index = self.streams.len();
        observer.opened(index, author_id, kind);
        self.keys.push(heap_key(rank, index));
        self.streams.push(Stream {
            source,
            current: rank,
            kind,
            taken: 0,
            limit: limit as u16,
            examined: 0,
            partner: NO_PARTNER,
            ending: None,
            skip: None,
            done: false,
        });
        index
    }

    /// Whether `author_id`'s timeline of `kind`, whose newest entry was created at `newest`,
    /// is read up to `limit` posts; if not, the observer is told why.
    #[inline(always)]
    fn readable<O: QueryObserver>(
        &self,
        reader: &Reader<'_>,
        author_id: i64,
        newest: u32,
        kind: Kind,
        limit: usize,
        observer: &mut O,
    ) -> bool {
        let unread = if limit == 0 {
            StreamEnd::Limit { limit }
        } else if reader.tables.retention.expired(newest, reader.now) {
            StreamEnd::Expired
        } else if i64::from(newest) < reader.oldest {
            StreamEnd::BeforeMinCreatedAt {
                min_created_at: reader.oldest,
            }
        } else {
            return true;
        };
        observer.unread(author_id, kind, unread);
        false
    }

    /// Opens the streams of `author_id`'s timeline of `kind`, read up to `limit` posts: one
    /// on its head timeline (`author`), one on its base run (line `line` of the base),
    /// partners when both hold entries; none when the timeline's newest entry (of either
    /// tier) says nothing of it can be read. The timeline's length (both tiers): the query's
    /// `eligible` counts it either way.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn open<O: QueryObserver>(
        &mut self,
        reader: &Reader<'_>,
        author_id: i64,
        author: Option<&'g Author>,
        line: Option<(&Base, usize, &Line)>,
        kind: Kind,
        limit: usize,
        max_results: usize,
        observer: &mut O,
    ) -> usize {
        let Some((base, at, line)) = line else {
            // The head alone (every author of a store without a base).
            let Some(author) = author else { return 0 };
            let timeline = author.timeline(kind);
            let summary = timeline.summary();
            let newest = Newest {
                len: summary.len as usize,
                created_at: summary.newest_created_at,
                post_id: summary.newest_post_id,
            };
            if newest.len == 0
                || !self.readable(reader, author_id, newest.created_at, kind, limit, observer)
                || (max_results == 0 && !O::RANKS_PAST_THE_ANSWER)
            {
                return newest.len;
            }
            let source = Source::Ring {
                timeline,
                view: None,
                seq: 0,
            };
            self.push(reader, author_id, source, newest, kind, limit, observer);
            return newest.len;
        };
        let line = Some((base, at, line));
        let head = author.map(|author| {
            let timeline = author.timeline(kind);
            let summary = timeline.summary();
            let source = Source::Ring {
                timeline,
                view: None,
                seq: 0,
            };
            let newest = Newest {
                len: summary.len as usize,
                created_at: summary.newest_created_at,
                post_id: summary.newest_post_id,
            };
            (source, newest)
        });
        let base = line.map(|(base, at, line)| {
            let (run, live, (created_at, post_id)) = base.open_run(at, line, kind as usize);
            let source = Source::Base {
                run,
                author_id,
                next: 0,
                read: false,
            };
            let newest = Newest {
                len: live,
                created_at,
                post_id,
            };
            (source, newest)
        });
        let tiers = [head, base];
        let held = || tiers.iter().flatten().filter(|(_, newest)| newest.len > 0);
        let len = held().map(|(_, newest)| newest.len).sum();
        let Some(newest) = held().map(|&(_, newest)| newest.created_at).max() else {
            return 0;
        };
        if !self.readable(reader, author_id, newest, kind, limit, observer)
            || (max_results == 0 && !O::RANKS_PAST_THE_ANSWER)
        {
            return len;
        }
        let mut opened = [None; 2];
        for (slot, &(source, newest)) in opened.iter_mut().zip(held()) {
            *slot = Some(self.push(reader, author_id, source, newest, kind, limit, observer));
        }
        if let [Some(first), Some(second)] = opened {
            self.streams[first].partner = second as u32;
            self.streams[second].partner = first as u32;
        }
        len
    }
}

/// Resolves the requested authors (deduplicated, in request order, into `followed`) and ranks
/// every timeline the question reads by the newest `created_at` its writer published, without
/// touching its buffer: a ring is read only when the merge reaches it. Authors are resolved a
/// window at a time ([`probe_authors`]), so that their cache misses overlap, then verified
/// and ranked.
#[allow(clippy::too_many_arguments)]
fn rank_timelines<'g, 'b, O: QueryObserver>(
    reader: &Reader<'g>,
    query: &FeedQuery<'_>,
    ask: Ask,
    followed: &mut ScratchSet<'_>,
    epoch: &'g Guard,
    bump: &'b Bump,
    outcome: &mut QueryOutcome,
    observer: &mut O,
) -> Streams<'g, 'b> {
    let tables = reader.tables;
    let (rows, used) = stream_limits(query, ask);
    let limits = &rows[..used];
    let capacity = query.authors.len() * limits.len();
    let mut ranked = Streams {
        streams: BumpVec::with_capacity_in(capacity, bump),
        keys: BumpVec::with_capacity_in(capacity, bump),
    };
    let mut probes: BumpVec<Probe<'g>> = BumpVec::with_capacity_in(DEADLINE_STRIDE, bump);
    for (w, batch) in query.authors.chunks(DEADLINE_STRIDE).enumerate() {
        if w > 0 && timed_out(query.deadline) {
            outcome.timed_out = true;
            break;
        }
        probe_authors(
            tables,
            reader.base,
            batch,
            ask,
            followed,
            &mut probes,
            epoch,
        );
        for &(author_id, hashed, candidate) in probes.iter() {
            let author =
                candidate.and_then(|c| tables.authors.verified(author_id, hashed, c, epoch));
            let line = reader.base.and_then(|base| {
                let at = base.line_of(author_id)?;
                Some((base, at, base.file.line(at)))
            });
            if author.is_none() && line.is_none() {
                continue;
            }
            for &(kind, limit) in limits {
                outcome.eligible += ranked.open(
                    reader,
                    author_id,
                    author,
                    line.as_ref().map(|(base, at, line)| (*base, *at, line)),
                    kind,
                    limit,
                    query.max_results,
                    observer,
                );
            }
        }
    }
    ranked
}

/// An author being resolved: its id, its hash and the record its index bucket names (not yet
/// verified).
type Probe<'g> = (i64, Hashed, Option<&'g Author>);

/// The first two passes over one window of `authors` (each new to `followed`, which takes it):
/// hash every id and prefetch its index bucket; probe the buckets and prefetch each
/// candidate's record line (which holds the timelines' summaries). Their misses overlap
/// instead of chaining two per author.
// Always: see `Merge::top`.
#[inline(always)]
fn probe_authors<'g>(
    tables: &'g StoreTables,
    base: Option<&Base>,
    authors: &[i64],
    ask: Ask,
    followed: &mut ScratchSet<'_>,
    probes: &mut BumpVec<'_, Probe<'g>>,
    epoch: &'g Guard,
) {
    probes.clear();
    for &author_id in authors {
        // A shard holds no timeline of a foreign author (it stays in `followed` for the reply
        // rule), so it is not probed.
        if followed.insert(author_id) && !tables.directory.is_foreign(author_id) {
            let hashed = tables.authors.hash(author_id);
            tables.authors.prefetch_bucket(hashed, epoch);
            if let Some(base) = base {
                // The author's home line in the base's directory, read when it is ranked.
                base.prefetch_home(author_id);
            }
            probes.push((author_id, hashed, None));
        }
    }
    for probe in probes.iter_mut() {
        probe.2 = tables.authors.candidate(probe.1, epoch);
        if let Some(author) = probe.2 {
            // The record's first line holds its id and the feed timelines; the videos
            // timeline is in the second.
            prefetch((author as *const Author).cast());
            if matches!(ask, Ask::Videos) {
                let videos = author.timeline(Kind::Videos);
                prefetch((videos as *const Timeline).cast());
            }
        }
    }
}

/// Merges the ranked streams in the answer order into the answer. Every timeline is in key
/// order (`created_at`, then `post_id`) and every stream is ranked by its newest entry's key
/// before it is read, so the pops come out in the answer order and the merge stops at
/// `max_results` exactly: a run of equal `created_at` (a busy second) is read only as far as
/// the cut. An observer that ranks past the answer keeps it going, with nothing more added to
/// the answer and no deadline, until it is satisfied.
fn merge<'g, O: QueryObserver>(
    rules: &Rules<'_, 'g>,
    query: &FeedQuery<'_>,
    ranked: Streams<'g, '_>,
    bump: &Bump,
    timed_out_flag: &mut bool,
    observer: &mut O,
) -> Vec<LightPost> {
    let Streams { mut streams, keys } = ranked;
    let (reader, epoch) = (rules.reader, rules.epoch);
    let mut queue = Merge::new(keys, query.max_results, bump);
    let walk = WALK.with(std::cell::Cell::get);
    let mut answer = Answer {
        posts: Vec::with_capacity(query.max_results.min(4096)),
        max_results: query.max_results,
        window: query.window,
        past: 0,
    };
    let mut pops = 0usize;
    loop {
        if answer.posts.len() >= query.max_results && observer.satisfied() {
            break;
        }
        let Some(top) = queue.top() else { break };
        pops += 1;
        if pops.is_multiple_of(DEADLINE_STRIDE)
            && (!O::RANKS_PAST_THE_ANSWER || answer.posts.len() < query.max_results)
            && timed_out(query.deadline)
        {
            *timed_out_flag = true;
            break;
        }
        let index = stream_of(top);
        // Work ahead on the ranked streams that leave the queue next, so that the misses
        // of a stream's first steps (its buffer's header, its newest entry's cell, then
        // that entry's record) overlap with the merge and with one another instead of
        // following one another. Without the cell step, a cold query spent three quarters
        // of `materialize` waiting on that cell.
        match walk {
            Walk::Groups(group) => {
                if let Some(keys) = queue.group_ahead(group) {
                    reader.stage(&mut streams, keys, epoch, observer);
                }
            }
            Walk::Distance => work_ahead(reader, &mut queue, &mut streams, epoch, observer),
        }
        let stream = &mut streams[index];
        if !reader.reach(stream, index, epoch, observer) {
            end_stream(&mut streams, index, reader.oldest, observer);
            queue.pop();
            continue;
        }
        let key = heap_key(stream.current, index);
        if key != top {
            // Materialized below its rank (an upper bound, or published before a delete
            // or an eviction): re-rank. A stream already read is always keyed by its
            // current entry.
            queue.replace(key);
            continue;
        }
        // An author read from both tiers: the other tier's stream has counted toward the same
        // per-author limit and scan window.
        let shared = match stream.partner {
            NO_PARTNER => (0, 0),
            partner => {
                let partner = &streams[partner as usize];
                let shared = (partner.taken, partner.examined);
                let stream = &mut streams[index];
                if let Some(end) = rules.end_of(stream, shared) {
                    // The partner filled the limit or the scan window.
                    stream.ending = Some(End::of(end));
                    end_stream(&mut streams, index, reader.oldest, observer);
                    queue.pop();
                    continue;
                }
                shared
            }
        };
        let stream = &mut streams[index];
        match stream.skip {
            Some(skipped) => observer.decided(
                index,
                stream.current.post_id,
                stream.current.created_at,
                skipped.decision(reader.newest),
            ),
            None => rules.take(stream, index, &mut answer, observer),
        }
        if rules.go_on(stream, shared, index, observer) {
            queue.replace(heap_key(stream.current, index));
        } else {
            end_stream(&mut streams, index, reader.oldest, observer);
            queue.pop();
        }
    }
    debug_assert!(
        answer
            .posts
            .is_sorted_by(|a, b| crate::page::answer_order(a, b).is_lt()),
        "the merge left the answer order"
    );
    answer.posts
}

/// The answer as the merge builds it.
struct Answer {
    posts: Vec<LightPost>,
    max_results: usize,
    window: AnswerWindow,
    /// Candidates ranked past `max_results` (only for an observer that ranks past the answer).
    past: usize,
}

impl Answer {
    /// Adds `record`, a candidate at `entry`, unless it comes at or before the page position
    /// (it is in an earlier page: it still counts toward its author's limit, it is just not
    /// returned again) or the answer is full. What became of it.
    #[inline(always)]
    fn offer<O: QueryObserver>(&mut self, record: &CompactPost, entry: TinyPost) -> Decision {
        if !self
            .window
            .admits(i64::from(entry.created_at), entry.post_id)
        {
            return Decision::BeforeCursor;
        }
        if O::RANKS_PAST_THE_ANSWER && self.posts.len() >= self.max_results {
            self.past += 1;
            return Decision::PastTheAnswer {
                rank: self.posts.len() + self.past,
            };
        }
        self.posts.push(record.to_light());
        Decision::Returned {
            position: self.posts.len(),
        }
    }
}

/// The rules the merge applies once it takes an entry, and what they read.
struct Rules<'q, 'g> {
    reader: &'q Reader<'g>,
    followed: &'q ScratchSet<'q>,
    viewer_id: i64,
    epoch: &'g Guard,
}

impl Rules<'_, '_> {
    /// Puts the entry stream `index` is at through the rules that read its record: the videos
    /// rule, then (the entry now examined) the self-repost filter and the reply rule, then (a
    /// candidate, counted toward the author's limit) the page position and `max_results`.
    #[inline(always)]
    fn take<O: QueryObserver>(
        &self,
        stream: &mut Stream<'_>,
        index: usize,
        answer: &mut Answer,
        observer: &mut O,
    ) {
        let tables = self.reader.tables;
        let entry = stream.current;
        // A head record (none if deleted or evicted meanwhile), or a base record with what it
        // embeds of its parent and source (a base record does not go away under a reader: a
        // gone one was passed over).
        let (read, parent, source) = match stream.source {
            Source::Ring { .. } => (tables.posts.read(entry.slot, entry.post_id), None, None),
            Source::Base { author_id, .. } => match self.reader.base {
                Some(base) => {
                    let record = base.read(author_id, u64::from(entry.slot));
                    (Some(record.post), record.parent, record.source)
                }
                None => (None, None, None),
            },
        };
        let decision = match read {
            None => Decision::Gone,
            Some(post)
                if stream.kind == Kind::Videos
                    && !post.has_video
                    && !self.source_is_video(&post, source) =>
            {
                Decision::NotAVideoNow
            }
            Some(post) => {
                stream.examined += 1;
                match self.visible(&post, parent, stream.kind) {
                    Err(rejection) => Decision::Rejected(rejection),
                    Ok(()) => {
                        stream.taken += 1;
                        answer.offer::<O>(&post, entry)
                    }
                }
            }
        };
        observer.decided(index, entry.post_id, entry.created_at, decision);
    }

    /// Why `stream` (whose partner took `shared`: posts taken, entries examined) reads no
    /// further, if it does not: its per-author limit or its scan window is used up.
    #[inline(always)]
    fn end_of(&self, stream: &Stream<'_>, shared: (u16, u16)) -> Option<StreamEnd> {
        if stream.taken + shared.0 >= stream.limit {
            Some(StreamEnd::Limit {
                limit: usize::from(stream.limit),
            })
        } else if usize::from(stream.examined + shared.1) >= MAX_TINY_POSTS_PER_USER_SCAN {
            Some(StreamEnd::ScanWindow)
        } else {
            None
        }
    }

    /// Whether stream `index` goes on after its current entry: while under its per-author
    /// limit and scan window (which its partner's `shared` counts share), to its next
    /// readable entry. When not, its end is reported.
    #[inline(always)]
    fn go_on<O: QueryObserver>(
        &self,
        stream: &mut Stream<'_>,
        shared: (u16, u16),
        index: usize,
        observer: &mut O,
    ) -> bool {
        match self.end_of(stream, shared) {
            Some(end) => {
                stream.ending = Some(End::of(end));
                false
            }
            None => self.reader.advance(stream, index, observer),
        }
    }

    /// What `record` embeds of post `id` (its parent or source), if that still holds: the
    /// post was stored in the base when the record was written, and has not been noted as
    /// changed since (deleted, evicted, stored again). Else the rules look the post up.
    #[inline(always)]
    fn trusted(&self, id: i64, embedded: Option<Embedded>) -> Option<Embedded> {
        let embedded = embedded?;
        self.reader.base?.embedded_holds(id).then_some(embedded)
    }

    /// For a videos-timeline entry without its own video (a repost that joined through its
    /// source): true while the source is stored, not expired, `has_video` and not a reply.
    /// When false the entry is treated as absent: skipped, and not counted toward the scan
    /// window, so a replica that holds it answers like one that never indexed it.
    #[inline]
    fn source_is_video(&self, repost: &CompactPost, source: Option<Embedded>) -> bool {
        let (tables, now) = (self.reader.tables, self.reader.now);
        if !repost.is_retweet || repost.source_post_id == 0 {
            return false;
        }
        match self.trusted(repost.source_post_id, source) {
            Some(source) => source.flag && !tables.retention.expired(source.created_at, now),
            None => tables.source_is_video(repost.source_post_id, self.epoch, now),
        }
    }

    /// The self-repost filter and, for the secondary timeline, the reply rule: `Err` names
    /// the one that drops `post` (whose record embeds `parent`, if from a base).
    // Always: see `Merge::top`.
    #[inline(always)]
    fn visible(
        &self,
        post: &CompactPost,
        parent: Option<Embedded>,
        kind: Kind,
    ) -> Result<(), Rejection> {
        if post.is_retweet && post.source_user_id != 0 && post.source_user_id == self.viewer_id {
            return Err(Rejection::ViewerOwnRepost);
        }
        if kind != Kind::Secondary || post.in_reply_to_post_id == 0 {
            return Ok(());
        }
        let parent = match self.trusted(post.in_reply_to_post_id, parent) {
            Some(embedded) => Some(ParentFacts {
                created_at: embedded.created_at,
                original: embedded.flag,
                continues: embedded.continues,
            }),
            None => self
                .reader
                .tables
                .fact(post.in_reply_to_post_id, self.epoch)
                .map(|fact| ParentFacts {
                    created_at: fact.created_at,
                    original: fact.is_original(),
                    continues: post.conversation_id != 0
                        && fact.in_reply_to_post_id == post.conversation_id,
                }),
        };
        reply_rule(post, parent, self.followed, self.reader)
    }
}

/// What the reply rule reads of a reply's parent.
struct ParentFacts {
    created_at: u32,
    original: bool,
    /// The parent's `in_reply_to_post_id` is the reply's (non-zero) `conversation_id`.
    continues: bool,
}

/// The reply rule for `post` (in the secondary timeline, with a parent id), whose parent, if
/// stored, has the facts `parent`: `Err` names the part that drops it.
#[inline(always)]
fn reply_rule(
    post: &CompactPost,
    parent: Option<ParentFacts>,
    followed: &ScratchSet<'_>,
    reader: &Reader<'_>,
) -> Result<(), Rejection> {
    let Some(parent) = parent else {
        return Err(Rejection::Reply(ReplyRuleMiss::ParentMissing));
    };
    if reader
        .tables
        .retention
        .expired(parent.created_at, reader.now)
    {
        return Err(Rejection::Reply(ReplyRuleMiss::ParentExpired));
    }
    if parent.original {
        return Ok(());
    }
    if !parent.continues {
        return Err(Rejection::Reply(ReplyRuleMiss::ConversationMismatch));
    }
    if post.in_reply_to_user_id == 0 || !followed.contains(&post.in_reply_to_user_id) {
        return Err(Rejection::Reply(ReplyRuleMiss::ReplyToUnfollowed));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `rank`'s answer, checked against a full sort of the same keys.
    fn check_rank(keys: &[u128], keep: usize) {
        let bump = Bump::new();
        let (ranked, reserve, best) = rank(
            BumpVec::from_iter_in(keys.iter().copied(), &bump),
            keep,
            &bump,
        );
        let mut sorted = keys.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let ranks = if keys.len() > keep * 2 {
            keep
        } else {
            keys.len()
        };
        assert_eq!(
            &ranked[..],
            &sorted[..ranks],
            "the ranked keys, largest first"
        );
        let mut rest = reserve.to_vec();
        rest.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(
            &rest[..],
            &sorted[ranks..],
            "the reserve holds every other key"
        );
        assert_eq!(best, sorted.get(ranks).copied(), "the reserve's best");
    }

    /// A key of a stream whose newest entry is `age` seconds older than `newest`.
    fn key(newest: u32, age: u32, post_id: i64, stream: usize) -> u128 {
        heap_key(
            TinyPost {
                post_id,
                created_at: newest - age,
                slot: 0,
            },
            stream,
        )
    }

    #[test]
    fn a_large_request_is_ranked_by_counting_seconds_and_its_ties_by_post_id() {
        let newest = 1_750_000_000;
        // 4000 streams: every fourth shares its second with the one before, ids either side.
        let keys: Vec<u128> = (0..4000)
            .map(|i| {
                key(
                    newest,
                    (i as u32 / 2) * 3 % 3000,
                    (i as i64 * 7919) % 5000 - 2500,
                    i,
                )
            })
            .collect();
        assert!(rank_by_second(&keys, 1200, &Bump::new()).is_some());
        check_rank(&keys, 1200);
        // The cut falls inside a second shared by many streams.
        let crowded: Vec<u128> = (0..4000)
            .map(|i| key(newest, (i as u32) % 7, i as i64, i))
            .collect();
        check_rank(&crowded, 1200);
    }

    /// Takes every key out of a merge queue of `keys` that keeps `keep` ranked, returning them
    /// in the order the queue gave them.
    fn drain(keys: &[u128], keep: usize) -> Vec<u128> {
        let bump = Bump::new();
        let mut queue = Merge::new(
            BumpVec::from_iter_in(keys.iter().copied(), &bump),
            keep,
            &bump,
        );
        let mut out = Vec::with_capacity(keys.len());
        while let Some(top) = queue.top() {
            out.push(top);
            queue.pop();
        }
        out
    }

    #[test]
    fn a_merge_past_its_ranked_streams_brings_the_reserve_in_a_ranking_at_a_time() {
        let newest = 1_750_000_000;
        // Within the counted seconds (ranked by counting) and spread far beyond them (ranked
        // by selection once the kept keys span more), many more keys than one ranking keeps.
        let near: Vec<u128> = (0..5_000)
            .map(|i| key(newest, (i as u32 * 7919) % 3000, (i as i64 * 31) % 97, i))
            .collect();
        let far: Vec<u128> = (0..5_000)
            .map(|i| key(newest, (i as u32 * 7919) % 170_000, i as i64, i))
            .collect();
        for keys in [&near, &far] {
            let mut sorted = keys.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            for keep in [1, 100, 1200] {
                assert_eq!(drain(keys, keep), sorted, "keep {keep}");
            }
        }
        // A stream that goes on is replaced lower while the reserve waits: every key still
        // comes out in order.
        let bump = Bump::new();
        let mut queue = Merge::new(
            BumpVec::from_iter_in(near.iter().copied(), &bump),
            100,
            &bump,
        );
        let (mut last, mut popped) = (u128::MAX, 0);
        while let Some(top) = queue.top() {
            assert!(top < last, "out of order");
            last = top;
            popped += 1;
            // A tenth of the streams go on once from an even second, one second older.
            let created = (top >> 96) as u32;
            if stream_of(top).is_multiple_of(10) && created.is_multiple_of(2) {
                queue.replace(top - (1u128 << 96));
            } else {
                queue.pop();
            }
        }
        assert!(popped > near.len(), "the replaced keys came out too");
    }

    #[test]
    fn groups_ahead_hand_out_every_ranked_key_behind_the_top_once_and_stay_a_group_ahead() {
        let newest = 1_750_000_000;
        let keys: Vec<u128> = (0..100)
            .map(|i| key(newest, (i as u32 * 37) % 90, i as i64, i))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        for group in [1, 3, 16, 200] {
            let bump = Bump::new();
            let mut queue = Merge::new(
                BumpVec::from_iter_in(keys.iter().copied(), &bump),
                100,
                &bump,
            );
            let mut handed: Vec<u128> = Vec::new();
            let mut position = 0;
            while let Some(top) = queue.top() {
                assert_eq!(top, sorted[position]);
                while let Some(keys) = queue.group_ahead(group) {
                    assert!(!keys.is_empty() && keys.len() <= group);
                    handed.extend_from_slice(keys);
                }
                // Everything up to `group` places behind the top is staged, and no more than
                // twice that (positions 1 to `staged_to` have been handed out).
                let staged_to = handed.len();
                assert!(
                    staged_to >= (position + group).min(sorted.len() - 1),
                    "group {group}"
                );
                assert!(staged_to <= position + 2 * group, "group {group}");
                queue.pop();
                position += 1;
            }
            // The first key is the top before any group is staged; every other key is handed
            // out once, in the merge's order.
            assert_eq!(handed, sorted[1..], "group {group}");
        }
    }

    #[test]
    fn keys_spanning_more_than_the_counted_seconds_are_ranked_by_comparison() {
        let newest = 1_750_000_000;
        let keys: Vec<u128> = (0..4000)
            .map(|i| key(newest, i as u32 * 37 % 170_000, i as i64, i))
            .collect();
        assert!(rank_by_second(&keys, 1200, &Bump::new()).is_none());
        check_rank(&keys, 1200);
    }

    proptest! {
        #[test]
        fn rank_agrees_with_a_full_sort(
            ages in proptest::collection::vec((0u32..6000, -50i64..50), 0..900),
            keep in 1usize..300,
        ) {
            let newest = 1_750_000_000;
            let keys: Vec<u128> = ages
                .iter()
                .enumerate()
                .map(|(i, &(age, id))| key(newest, age, id, i))
                .collect();
            check_rank(&keys, keep);
        }
    }
}
