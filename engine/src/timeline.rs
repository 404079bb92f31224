//! Per-author timelines: ring buffers of 16-byte [`TinyPost`] entries, oldest first.
//!
//! One writer (the author's writer, serialised by the author's lock) and any number of readers.
//! A buffer is a crossbeam-epoch `[Cell]` whose first cell holds the ring's `head` and `tail`
//! sequence numbers and whose other cells are the ring (capacity a power of two, recorded in the
//! pointer's tag). Appends write the next cell and then publish `head`; evicting the oldest entry
//! advances `tail`. Everything else (inserting out of order, removing a deleted post, growing,
//! shrinking) builds a new buffer and swaps it in, retiring the old one through the epoch: a
//! reader therefore always scans one consistent buffer and never waits.
//!
//! The only thing a reader must check is that the oldest cells it reads were not recycled by
//! an append after an eviction: it re-reads `tail` after reading a cell ([`Snapshot::get`]).

use crate::arena::SlotId;
use crossbeam_epoch::{Atomic, Guard, Owned, Shared};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// A timeline entry: which post, when, and where its record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TinyPost {
    pub post_id: i64,
    pub created_at: u32,
    pub slot: SlotId,
}

/// One 16-byte cell: `post_id`, then `created_at << 32 | slot`.
#[repr(C, align(16))]
pub(crate) struct Cell {
    post_id: AtomicU64,
    packed: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Cell>() == 16);

impl Cell {
    fn new(entry: TinyPost) -> Self {
        Self {
            post_id: AtomicU64::new(entry.post_id as u64),
            packed: AtomicU64::new(pack(entry)),
        }
    }

    fn store(&self, entry: TinyPost) {
        self.post_id.store(entry.post_id as u64, Ordering::Relaxed);
        self.packed.store(pack(entry), Ordering::Relaxed);
    }

    fn load(&self) -> TinyPost {
        let packed = self.packed.load(Ordering::Relaxed);
        TinyPost {
            post_id: self.post_id.load(Ordering::Relaxed) as i64,
            created_at: (packed >> 32) as u32,
            slot: packed as u32,
        }
    }
}

fn pack(entry: TinyPost) -> u64 {
    (u64::from(entry.created_at) << 32) | u64::from(entry.slot)
}

/// Smallest ring allocated.
const MIN_CAPACITY: usize = 4;
/// Largest ring capacity the pointer tag can describe (4 tag bits from 16-byte alignment).
pub(crate) const MAX_CAPACITY: usize = 1 << 14;

type Buffer = [MaybeUninit<Cell>];

/// A ring of `TinyPost`s ordered by `created_at` (insertion order among equals).
pub(crate) struct Timeline {
    buffer: Atomic<Buffer>,
    /// `len << 32 | newest created_at`, republished by the writer after every change, so a
    /// reader can rank this timeline without touching its buffer (a cache miss) until it
    /// actually needs an entry. A hint: the buffer is the truth.
    summary: AtomicU64,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline").finish_non_exhaustive()
    }
}

/// What a reader sees of one timeline: a consistent buffer and its bounds at the time of the
/// snapshot.
#[derive(Clone, Copy)]
pub(crate) struct Snapshot<'g> {
    cells: &'g Buffer,
    mask: u64,
    /// One past the newest entry.
    pub head: u64,
    /// The oldest entry when the snapshot was taken.
    pub tail: u64,
}

impl<'g> Snapshot<'g> {
    /// Entries in the snapshot.
    pub fn len(&self) -> usize {
        (self.head - self.tail) as usize
    }

    fn header(&self) -> &'g Cell {
        // SAFETY: every cell of a buffer is initialised when the buffer is built.
        unsafe { self.cells[0].assume_init_ref() }
    }

    fn cell(&self, seq: u64) -> &'g Cell {
        // SAFETY: as in `header`; `1 + (seq & mask)` is below the buffer length `mask + 2`.
        unsafe { self.cells[1 + (seq & self.mask) as usize].assume_init_ref() }
    }

    /// The entry at `seq` (`tail <= seq < head`), or `None` if the writer has since evicted it
    /// and may have recycled its cell.
    #[inline]
    pub fn get(&self, seq: u64) -> Option<TinyPost> {
        let entry = self.cell(seq).load();
        // Pairs with the writer's Release fence between advancing `tail` and reusing a cell:
        // if the load above saw a recycled cell, this sees the advanced tail.
        fence(Ordering::Acquire);
        let tail = self.header().packed.load(Ordering::Relaxed);
        (seq >= tail).then_some(entry)
    }
}

fn capacity_of(tag: usize) -> usize {
    1 << tag
}

fn tag_of(capacity: usize) -> usize {
    capacity.trailing_zeros() as usize
}

/// Builds a buffer holding `entries` (oldest first) with sequence numbers starting at `tail`.
fn build(
    capacity: usize,
    tail: u64,
    entries: impl ExactSizeIterator<Item = TinyPost>,
) -> Owned<Buffer> {
    debug_assert!(capacity.is_power_of_two() && (MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity));
    debug_assert!(entries.len() <= capacity);
    let head = tail + entries.len() as u64;
    let mut buffer = Owned::<Buffer>::init(capacity + 1);
    let mask = (capacity - 1) as u64;
    buffer[0].write(Cell {
        post_id: AtomicU64::new(head),
        packed: AtomicU64::new(tail),
    });
    for cell in buffer[1..].iter_mut() {
        cell.write(Cell::new(TinyPost {
            post_id: 0,
            created_at: 0,
            slot: 0,
        }));
    }
    for (seq, entry) in (tail..).zip(entries) {
        // SAFETY: every cell was initialised by the loop above.
        unsafe { buffer[1 + (seq & mask) as usize].assume_init_ref() }.store(entry);
    }
    buffer.with_tag(tag_of(capacity))
}

fn capacity_for(len: usize) -> usize {
    len.next_power_of_two().clamp(MIN_CAPACITY, MAX_CAPACITY)
}

impl Timeline {
    pub fn new() -> Self {
        Self {
            buffer: Atomic::null(),
            summary: AtomicU64::new(0),
        }
    }

    /// A consistent view for reading; `None` if the timeline never held anything.
    #[inline]
    pub fn snapshot<'g>(&self, guard: &'g Guard) -> Option<Snapshot<'g>> {
        // Acquire pairs with the Release store that published the buffer.
        let shared = self.buffer.load(Ordering::Acquire, guard);
        // SAFETY: non-null buffers stay allocated while `guard` is pinned: replaced ones are
        // retired through the epoch, and the last one is freed only when the owning author is
        // reclaimed, which waits for every reader holding it.
        let cells = unsafe { shared.as_ref() }?;
        let mask = (capacity_of(shared.tag()) - 1) as u64;
        // SAFETY: cell 0 is initialised when the buffer is built.
        let header = unsafe { cells[0].assume_init_ref() };
        // Acquire pairs with the Release store of `head` after an append wrote its cell.
        let head = header.post_id.load(Ordering::Acquire);
        let tail = header.packed.load(Ordering::Acquire);
        Some(Snapshot {
            cells,
            mask,
            head,
            tail,
        })
    }

    /// Address of the buffer's first line (header and oldest cells), for prefetching.
    #[inline]
    pub fn buffer_ptr(&self, guard: &Guard) -> *const u8 {
        let shared = self.buffer.load(Ordering::Relaxed, guard);
        // SAFETY: the buffer stays allocated while `guard` is pinned (see `snapshot`).
        unsafe { shared.as_ref() }.map_or(std::ptr::null(), |cells| cells.as_ptr().cast())
    }

    /// The number of entries (writer side; readers use a snapshot).
    #[cfg(test)]
    pub fn len(&self, guard: &Guard) -> usize {
        self.snapshot(guard).map_or(0, |s| s.len())
    }

    /// Bytes of buffer this timeline holds.
    pub fn buffer_bytes(&self, guard: &Guard) -> usize {
        let shared = self.buffer.load(Ordering::Relaxed, guard);
        if shared.is_null() {
            0
        } else {
            (capacity_of(shared.tag()) + 1) * 16 + 16
        }
    }

    fn entries<'g>(snap: &Snapshot<'g>) -> impl ExactSizeIterator<Item = TinyPost> + 'g {
        let snap = *snap;
        (0..snap.len()).map(move |i| snap.cell(snap.tail + i as u64).load())
    }

    fn replace(&self, fresh: Owned<Buffer>, guard: &Guard) {
        // Release publishes the fully built buffer; AcqRel also orders the read of the old one.
        let old = self.buffer.swap(fresh, Ordering::AcqRel, guard);
        if !old.is_null() {
            // SAFETY: `old` is no longer reachable from the timeline; readers that loaded it
            // before the swap are pinned, and the epoch frees it only after they unpin.
            unsafe { guard.defer_destroy(old) };
        }
    }

    /// Inserts `entry` at its `created_at` position (after equal timestamps). If the timeline
    /// already holds `cap` entries, the oldest is evicted and returned; that may be `entry`
    /// itself when it is older than everything held, in which case nothing changes.
    ///
    /// Writer only (the caller holds the author's lock).
    fn insert_unsummarised(&self, entry: TinyPost, cap: usize, guard: &Guard) -> Option<TinyPost> {
        let Some(snap) = self.snapshot(guard) else {
            self.replace(build(MIN_CAPACITY, 0, std::iter::once(entry)), guard);
            return None;
        };
        let len = snap.len();
        let full = len >= cap;
        let newest = (len > 0).then(|| snap.cell(snap.head - 1).load());
        let in_order = newest.is_none_or(|n| n.created_at <= entry.created_at);
        let capacity = (snap.mask + 1) as usize;
        if full {
            let oldest = snap.cell(snap.tail).load();
            if entry.created_at < oldest.created_at {
                return Some(entry);
            }
        }
        if in_order && (full || len < capacity) {
            // Fast path: evict in place if needed, then append into a free cell.
            let header = snap.header();
            let evicted = full.then(|| {
                let oldest = snap.cell(snap.tail).load();
                header.packed.store(snap.tail + 1, Ordering::Relaxed);
                oldest
            });
            // Release fence: a reader that sees the recycled cell below also sees the new tail.
            fence(Ordering::Release);
            snap.cell(snap.head).store(entry);
            // Release: readers that Acquire `head` see the cell written above.
            header.post_id.store(snap.head + 1, Ordering::Release);
            return evicted;
        }
        // Slow path: rebuild with the entry at its place (and the oldest dropped if full).
        let skip = usize::from(full);
        let evicted = full.then(|| snap.cell(snap.tail).load());
        let mut merged: Vec<TinyPost> = Self::entries(&snap).skip(skip).collect();
        let at = merged.partition_point(|e| e.created_at <= entry.created_at);
        merged.insert(at, entry);
        let capacity = capacity_for(merged.len()).max(capacity);
        self.replace(
            build(capacity, snap.tail + skip as u64, merged.into_iter()),
            guard,
        );
        evicted
    }

    /// Removes the entry of `post_id` (created at `created_at`) if present. Writer only.
    fn remove_unsummarised(&self, post_id: i64, created_at: u32, guard: &Guard) -> bool {
        let Some(snap) = self.snapshot(guard) else {
            return false;
        };
        let all: Vec<TinyPost> = Self::entries(&snap).collect();
        let from = all.partition_point(|e| e.created_at < created_at);
        let Some(offset) = all[from..]
            .iter()
            .take_while(|e| e.created_at == created_at)
            .position(|e| e.post_id == post_id)
        else {
            return false;
        };
        let at = from + offset;
        if at == 0 {
            snap.header().packed.store(snap.tail + 1, Ordering::Release);
            return true;
        }
        let capacity = (snap.mask + 1) as usize;
        let rest = all.len() - 1;
        let capacity = if rest * 4 <= capacity {
            capacity_for(rest * 2)
        } else {
            capacity
        };
        let kept = all[..at]
            .iter()
            .chain(&all[at + 1..])
            .copied()
            .collect::<Vec<_>>();
        self.replace(build(capacity, snap.tail, kept.into_iter()), guard);
        true
    }

    /// Pops oldest entries while `expired(entry)` holds; returns them. Writer only.
    fn pop_expired_unsummarised(
        &self,
        mut expired: impl FnMut(&TinyPost) -> bool,
        guard: &Guard,
    ) -> Vec<TinyPost> {
        let mut popped = Vec::new();
        let Some(snap) = self.snapshot(guard) else {
            return popped;
        };
        let mut tail = snap.tail;
        while tail < snap.head {
            let entry = snap.cell(tail).load();
            if !expired(&entry) {
                break;
            }
            popped.push(entry);
            tail += 1;
        }
        if tail != snap.tail {
            snap.header().packed.store(tail, Ordering::Release);
        }
        popped
    }

    /// Rebuilds into a smaller buffer when the entries use under a quarter of it; drops the
    /// buffer altogether when empty. Returns true if the timeline is now empty. Writer only.
    fn shrink_unsummarised(&self, guard: &Guard) -> bool {
        let Some(snap) = self.snapshot(guard) else {
            return true;
        };
        let len = snap.len();
        let capacity = (snap.mask + 1) as usize;
        if len == 0 {
            // Keep the (small) buffer; the owner is dropped when all its timelines are empty.
            return true;
        }
        if capacity > MIN_CAPACITY && len * 4 <= capacity {
            let entries: Vec<TinyPost> = Self::entries(&snap).collect();
            self.replace(
                build(capacity_for(len * 2), snap.tail, entries.into_iter()),
                guard,
            );
        }
        false
    }
}

impl Timeline {
    /// Entries and newest `created_at` as last published by the writer (0 entries: never
    /// written or empty).
    #[inline]
    pub fn summary(&self) -> (u32, u32) {
        // Relaxed: a hint only; readers validate everything they use against the buffer.
        let packed = self.summary.load(Ordering::Relaxed);
        ((packed >> 32) as u32, packed as u32)
    }

    fn publish_summary(&self, guard: &Guard) {
        let packed = self.snapshot(guard).map_or(0, |snap| {
            let len = snap.len() as u64;
            let newest = if len == 0 {
                0
            } else {
                u64::from(snap.cell(snap.head - 1).load().created_at)
            };
            len << 32 | newest
        });
        self.summary.store(packed, Ordering::Relaxed);
    }

    /// See `insert_unsummarised`. Writer only.
    pub fn insert(&self, entry: TinyPost, cap: usize, guard: &Guard) -> Option<TinyPost> {
        let evicted = self.insert_unsummarised(entry, cap, guard);
        self.publish_summary(guard);
        evicted
    }

    /// See `remove_unsummarised`. Writer only.
    pub fn remove(&self, post_id: i64, created_at: u32, guard: &Guard) -> bool {
        let removed = self.remove_unsummarised(post_id, created_at, guard);
        self.publish_summary(guard);
        removed
    }

    /// See `pop_expired_unsummarised`. Writer only.
    pub fn pop_expired(
        &self,
        expired: impl FnMut(&TinyPost) -> bool,
        guard: &Guard,
    ) -> Vec<TinyPost> {
        let popped = self.pop_expired_unsummarised(expired, guard);
        self.publish_summary(guard);
        popped
    }

    /// See `shrink_unsummarised`. Writer only.
    pub fn shrink(&self, guard: &Guard) -> bool {
        let empty = self.shrink_unsummarised(guard);
        self.publish_summary(guard);
        empty
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: the owning author has been reclaimed, so no reader or writer
        // can reach this buffer any more.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let shared: Shared<'_, Buffer> = self.buffer.load(Ordering::Relaxed, guard);
            if !shared.is_null() {
                drop(shared.into_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(post_id: i64, created_at: u32) -> TinyPost {
        TinyPost {
            post_id,
            created_at,
            slot: post_id as u32,
        }
    }

    fn read_all(t: &Timeline) -> Vec<(i64, u32)> {
        let guard = crossbeam_epoch::pin();
        let Some(s) = t.snapshot(&guard) else {
            return vec![];
        };
        (s.tail..s.head)
            .map(|q| s.get(q).unwrap())
            .map(|e| (e.post_id, e.created_at))
            .collect()
    }

    #[test]
    fn keeps_created_at_order_whatever_the_arrival_order() {
        let t = Timeline::new();
        let guard = crossbeam_epoch::pin();
        for (id, at) in [(1, 10), (2, 30), (3, 20), (4, 5), (5, 30), (6, 25), (7, 40)] {
            assert_eq!(t.insert(tp(id, at), 100, &guard), None);
        }
        assert_eq!(
            read_all(&t),
            vec![(4, 5), (1, 10), (3, 20), (6, 25), (2, 30), (5, 30), (7, 40)]
        );
    }

    #[test]
    fn evicts_the_oldest_at_the_cap() {
        let t = Timeline::new();
        let guard = crossbeam_epoch::pin();
        for i in 0..5 {
            assert_eq!(t.insert(tp(i, 100 + i as u32), 5, &guard), None);
        }
        assert_eq!(t.insert(tp(10, 200), 5, &guard), Some(tp(0, 100)));
        assert_eq!(
            t.insert(tp(11, 102), 5, &guard),
            Some(tp(1, 101)),
            "out of order at the cap"
        );
        assert_eq!(
            t.insert(tp(12, 50), 5, &guard),
            Some(tp(12, 50)),
            "older than all: rejected"
        );
        assert_eq!(
            read_all(&t).iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![2, 11, 3, 4, 10]
        );
        assert_eq!(t.len(&guard), 5);
    }

    #[test]
    fn ring_wraps_and_grows() {
        let t = Timeline::new();
        let guard = crossbeam_epoch::pin();
        for i in 0..1000 {
            t.insert(tp(i, i as u32), 300, &guard);
        }
        let all = read_all(&t);
        assert_eq!(all.len(), 300);
        assert_eq!(all.first(), Some(&(700, 700)));
        assert_eq!(all.last(), Some(&(999, 999)));
        assert_eq!(t.buffer_bytes(&guard), (512 + 1) * 16 + 16);
    }

    #[test]
    fn remove_and_pop_expired_and_shrink() {
        let t = Timeline::new();
        let guard = crossbeam_epoch::pin();
        for i in 0..64 {
            t.insert(tp(i, i as u32), 100, &guard);
        }
        assert!(t.remove(10, 10, &guard));
        assert!(!t.remove(10, 10, &guard));
        assert!(!t.remove(11, 12, &guard), "wrong created_at does not match");
        assert!(t.remove(0, 0, &guard), "oldest");
        let popped = t.pop_expired(|e| e.created_at < 60, &guard);
        assert_eq!(popped.len(), 58);
        assert_eq!(read_all(&t), vec![(60, 60), (61, 61), (62, 62), (63, 63)]);
        assert!(!t.shrink(&guard));
        assert_eq!(t.buffer_bytes(&guard), (8 + 1) * 16 + 16);
        assert_eq!(read_all(&t).len(), 4);
        t.pop_expired(|_| true, &guard);
        assert!(t.shrink(&guard));
    }

    #[test]
    fn snapshot_stays_consistent_across_a_rebuild() {
        let t = Timeline::new();
        let guard = crossbeam_epoch::pin();
        for i in 0..8 {
            t.insert(tp(i, 10 * i as u32), 100, &guard);
        }
        let before = t.snapshot(&guard).unwrap();
        t.insert(tp(100, 15), 100, &guard); // out of order: rebuilds
        let seen: Vec<i64> = (before.tail..before.head)
            .map(|q| before.get(q).unwrap().post_id)
            .collect();
        assert_eq!(seen, (0..8).collect::<Vec<_>>(), "old snapshot unchanged");
        assert_eq!(read_all(&t).len(), 9);
    }
}
