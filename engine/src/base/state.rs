//! The base's mutable state, in memory beside its immutable file: what has happened to its
//! posts since it was written (deleted, evicted by the timeline cap, trimmed as expired).
//!
//! - `gone`: one bit per granule of the records section, set on the first granule of a record
//!   that is no longer stored (deleted, or no longer held by any timeline): queries skip it,
//!   lookups miss it.
//! - `runs`: per directory line and timeline kind, `cut` (entries removed from the run's old
//!   end: evicted by the cap or trimmed, gone or not) and `removed` (gone entries still inside
//!   the run's live part `0..len - cut`), so that the live length is `len - cut - removed` and
//!   the cap and `eligible` see the author's whole timeline.
//! - `dirty`: one bit per line, set before the line's state or any of its records change, so
//!   a query of an untouched author reads neither (most authors, most of the time).
//! - `changed`: a one-sided filter of the base post ids whose facts, embedded in the records
//!   of replies and reposts, may no longer say whether the post is stored (deleted, evicted,
//!   written again into the head after it left the base, or unconfirmed when the file was
//!   checked).
//!
//! Every change is made under the line's lock (`locks`, striped), by the write path. Readers
//! take no lock: they load `dirty` (Acquire), then the state words and bits (Acquire); a
//! writer sets `dirty` before what it changes, and publishes with Release, so a reader that
//! sees a change sees the dirty bit that announces it.

use crate::huge_memory::ZeroedSlice;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use crate::tombstone_filter::Words;

/// Lock stripes of the lines' state.
const LOCK_STRIPES: usize = 256;

/// The cut and removed counts of one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RunState {
    pub(crate) cut: u16,
    pub(crate) removed: u16,
}

impl RunState {
    fn pack(self) -> u32 {
        u32::from(self.cut) | u32::from(self.removed) << 16
    }

    fn unpack(word: u32) -> Self {
        Self {
            cut: word as u16,
            removed: (word >> 16) as u16,
        }
    }
}

/// The state of one base's posts and runs (module docs).
pub(crate) struct BaseState {
    gone: ZeroedSlice<AtomicU64>,
    runs: ZeroedSlice<AtomicU32>,
    dirty: ZeroedSlice<AtomicU64>,
    /// One bit per line: its author left the store (a trim found every timeline empty).
    dropped: ZeroedSlice<AtomicU64>,
    changed: Words,
    locks: Box<[Mutex<()>]>,
    /// Records no longer stored.
    gone_posts: AtomicUsize,
    /// Entries of each kind no longer in their timelines.
    left: [AtomicUsize; 3],
}

impl std::fmt::Debug for BaseState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaseState")
            .field("gone_posts", &self.gone_posts)
            .finish_non_exhaustive()
    }
}

impl BaseState {
    /// Untouched state for a base of `granules` record granules and `lines` directory lines.
    pub(crate) fn new(granules: usize, lines: usize) -> Self {
        Self {
            gone: ZeroedSlice::new(granules.div_ceil(64).max(1)),
            runs: ZeroedSlice::new(lines * 3),
            dirty: ZeroedSlice::new(lines.div_ceil(64).max(1)),
            dropped: ZeroedSlice::new(lines.div_ceil(64).max(1)),
            changed: Words::new(),
            locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            gone_posts: AtomicUsize::new(0),
            left: Default::default(),
        }
    }

    /// The lock of line `line`'s state.
    pub(crate) fn lock(&self, line: usize) -> crate::sync::MutexGuard<'_, ()> {
        self.locks[line % LOCK_STRIPES]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The address of the word that holds line `line`'s dirty bit (for a prefetch).
    #[inline]
    pub(crate) fn dirty_ptr(&self, line: usize) -> *const u8 {
        (&self.dirty[(line / 64).min(self.dirty.len() - 1)] as *const AtomicU64).cast()
    }

    /// Whether line `line` or any of its records changed since the file was written.
    #[inline]
    pub(crate) fn is_dirty(&self, line: usize) -> bool {
        // Acquire pairs with the Release in `mark_dirty`.
        self.dirty[line / 64].load(Ordering::Acquire) & (1 << (line % 64)) != 0
    }

    /// Announces a change to line `line` (before it is made). Holds its lock.
    pub(crate) fn mark_dirty(&self, line: usize) {
        // Release: a reader that sees a change made after this sees the bit (module docs).
        self.dirty[line / 64].fetch_or(1 << (line % 64), Ordering::Release);
    }

    /// Marks line `line`'s author as dropped: true if it was not. Holds the line's lock.
    pub(crate) fn set_dropped(&self, line: usize) -> bool {
        // Relaxed: read by the writers only, under the line's lock.
        let before = self.dropped[line / 64].fetch_or(1 << (line % 64), Ordering::Relaxed);
        before & (1 << (line % 64)) == 0
    }

    /// Whether line `line`'s author was dropped ([`set_dropped`](Self::set_dropped)).
    pub(crate) fn is_dropped(&self, line: usize) -> bool {
        // Relaxed: as in `set_dropped`.
        self.dropped[line / 64].load(Ordering::Relaxed) & (1 << (line % 64)) != 0
    }

    /// Whether the record at `granule` is no longer stored.
    #[inline]
    pub(crate) fn is_gone(&self, granule: u64) -> bool {
        let g = granule as usize;
        // Acquire pairs with the Release in `set_gone`.
        self.gone[g / 64].load(Ordering::Acquire) & (1 << (g % 64)) != 0
    }

    /// Marks the record at `granule` as no longer stored (once). Holds its line's lock,
    /// after `mark_dirty`.
    pub(crate) fn set_gone(&self, granule: u64) {
        let g = granule as usize;
        // Release: pairs with the Acquire in `is_gone`.
        let before = self.gone[g / 64].fetch_or(1 << (g % 64), Ordering::Release);
        if before & (1 << (g % 64)) == 0 {
            self.gone_posts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Run `kind` of line `line`.
    #[inline]
    pub(crate) fn run(&self, line: usize, kind: usize) -> RunState {
        // Acquire pairs with the Release in `set_run`.
        RunState::unpack(self.runs[line * 3 + kind].load(Ordering::Acquire))
    }

    /// Sets run `kind` of line `line` to `state`. Holds the line's lock, after `mark_dirty`.
    pub(crate) fn set_run(&self, line: usize, kind: usize, state: RunState) {
        let word = &self.runs[line * 3 + kind];
        // Relaxed: the lock holder is the only writer.
        let before = RunState::unpack(word.load(Ordering::Relaxed));
        // Release: pairs with the Acquire in `run`.
        word.store(state.pack(), Ordering::Release);
        let left = |s: RunState| usize::from(s.cut) + usize::from(s.removed);
        // Relaxed: a statistic.
        if left(state) >= left(before) {
            self.left[kind].fetch_add(left(state) - left(before), Ordering::Relaxed);
        } else {
            self.left[kind].fetch_sub(left(before) - left(state), Ordering::Relaxed);
        }
    }

    /// Notes that what other records embed of `post_id` may no longer hold.
    pub(crate) fn note_changed(&self, post_id: i64) {
        self.changed.set(post_id);
    }

    /// False when `post_id` certainly was not noted by [`note_changed`](Self::note_changed).
    #[inline]
    pub(crate) fn may_have_changed(&self, post_id: i64) -> bool {
        self.changed.holds(post_id)
    }

    /// Records no longer stored.
    pub(crate) fn gone_posts(&self) -> usize {
        self.gone_posts.load(Ordering::Relaxed)
    }

    /// Entries of `kind` no longer in their timelines.
    pub(crate) fn left(&self, kind: usize) -> usize {
        self.left[kind].load(Ordering::Relaxed)
    }

    /// Bytes of memory the state has touched at most (its pages are mapped as they are
    /// written).
    pub(crate) fn bytes(&self) -> usize {
        self.gone.len() * 8 + self.runs.len() * 4 + (self.dirty.len() + self.dropped.len()) * 8
    }
}
