//! [`AuthorIndex`]: `author_id -> Author` (the author's three timelines, one per [`Kind`]).
//!
//! The raw index: the owner of the authors' table (`authors.rs`) keeps the entry counts and
//! the writer-lock protocol over it.
//!
//! Authors live inline in fixed chunks of two-cache-line [`Author`] records addressed by a
//! dense `u32` number; a [`TagIndex`] maps the author id to that number and the record's own
//! `author_id` verifies a hit. A lookup is one bucket line plus the author's first line (its
//! id and the two timelines a feed query reads; the videos timeline is in the second), and
//! both addresses can be computed (and prefetched) ahead, which is what the batched query
//! does.
//!
//! A dropped author's number is removed from the index at once and reused only after a
//! crossbeam-epoch grace period, so a reader that found it while pinned never reads a
//! different author's timelines under that number.

use crate::arena::{CompactPost, IN_PRIMARY, IN_VIDEO};
use crate::index::{Hashed, TagIndex};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicI64, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use crate::timeline::Timeline;
use crossbeam_epoch::Guard;
use crossbeam_queue::SegQueue;
use std::sync::{Arc, PoisonError};

/// log2 of the authors per chunk: 16384 records of 128 bytes, one 2 MiB huge page (see
/// `ensure_chunk`). A fuzzing build's chunks are boxed and smaller: it makes a store per input
/// and would map and fill 2 MiB for each. Loom's are four records (each record is a dozen
/// modelled atomics).
#[cfg(not(any(thunder_loom, fuzzing)))]
const CHUNK_SHIFT: u32 = 14;
#[cfg(all(fuzzing, not(thunder_loom)))]
const CHUNK_SHIFT: u32 = 12;
#[cfg(thunder_loom)]
const CHUNK_SHIFT: u32 = 2;
const CHUNK_AUTHORS: usize = 1 << CHUNK_SHIFT;
/// Most authors at once: 2^26 (64 Mi), in 16384 chunks; eight under loom, in two.
#[cfg(not(thunder_loom))]
const MAX_CHUNKS: usize = 1 << (26 - CHUNK_SHIFT);
#[cfg(thunder_loom)]
const MAX_CHUNKS: usize = 2;

/// One author's timelines, in two cache lines: the id, the writer lock, originals and
/// secondary in the first (what a feed query ranks and reads by), videos in the second.
/// Readers use them freely; writers hold `writer`.
#[repr(C, align(64))]
pub(crate) struct Author {
    /// The author this record belongs to (set before the record is indexed).
    author_id: AtomicI64,
    /// True while the record is not in use (never used, or dropped); a writer that sees it
    /// looks the author up again.
    pub(crate) writer: Mutex<bool>,
    pub(crate) timelines: [Timeline; 3],
}

// Loom's atomics are larger; the layout only matters (and only holds) for the real ones.
#[cfg(not(thunder_loom))]
const _: () = assert!(std::mem::size_of::<Author>() == 128);
// The feed's timelines end with the first line.
#[cfg(not(thunder_loom))]
const _: () =
    assert!(std::mem::offset_of!(Author, timelines) + 2 * std::mem::size_of::<Timeline>() == 64);

impl Author {
    fn unused() -> Self {
        Self {
            author_id: AtomicI64::new(0),
            writer: Mutex::new(true),
            timelines: [Timeline::new(), Timeline::new(), Timeline::new()],
        }
    }

    /// The author id (meaningful while the record is in use).
    pub(crate) fn author_id(&self) -> i64 {
        // Relaxed: stored before the record is indexed (the index's Release claim publishes
        // it) and before the writer lock is released.
        self.author_id.load(Ordering::Relaxed)
    }
}

impl Author {
    /// The author's timeline of `kind`.
    #[inline]
    pub(crate) fn timeline(&self, kind: Kind) -> &Timeline {
        &self.timelines[kind as usize]
    }
}

/// Which of an author's timelines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Originals = 0,
    Secondary = 1,
    Videos = 2,
}

impl Kind {
    /// The three timelines, in their order in an author record.
    pub(crate) const ALL: [Kind; 3] = [Kind::Originals, Kind::Secondary, Kind::Videos];

    /// The timeline that holds `post` first: originals, or replies and reposts.
    pub(crate) fn primary_of(post: &CompactPost) -> Self {
        if post.is_original() {
            Kind::Originals
        } else {
            Kind::Secondary
        }
    }

    /// The arena holder bit of an entry in this timeline.
    pub(crate) fn holder(self) -> u32 {
        if self == Kind::Videos {
            IN_VIDEO
        } else {
            IN_PRIMARY
        }
    }
}

impl std::fmt::Debug for Author {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Author").finish_non_exhaustive()
    }
}

/// The author index (see the module docs).
pub(crate) struct AuthorIndex {
    index: TagIndex,
    chunks: Box<[AtomicPtr<Author>]>,
    /// Dense numbers handed out so far.
    next: AtomicU32,
    /// Numbers whose grace period has passed, ready for reuse.
    free: Arc<SegQueue<u32>>,
    live: AtomicUsize,
    /// Serialises chunk allocation.
    chunk_lock: Mutex<()>,
}

impl std::fmt::Debug for AuthorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorIndex")
            .field("live", &self.live())
            .finish_non_exhaustive()
    }
}

impl AuthorIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            index: TagIndex::with_capacity(CHUNK_AUTHORS),
            chunks: (0..MAX_CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            next: AtomicU32::new(0),
            free: Arc::new(SegQueue::new()),
            live: AtomicUsize::new(0),
            chunk_lock: Mutex::new(()),
        }
    }

    /// `author_id`'s place in the index.
    #[inline]
    pub fn hash(&self, author_id: i64) -> Hashed {
        self.index.hash(author_id)
    }

    /// The record numbered `number`, if its chunk exists.
    #[inline]
    pub fn record(&self, number: u32) -> Option<&Author> {
        let chunk = self.chunks.get((number >> CHUNK_SHIFT) as usize)?;
        // Acquire pairs with the Release store that installed the chunk: its records are
        // initialised.
        let base = chunk.load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: `base` is the first of CHUNK_AUTHORS initialised records of a chunk that is
        // freed only on drop, and the offset is below CHUNK_AUTHORS.
        Some(unsafe { &*base.add(number as usize & (CHUNK_AUTHORS - 1)) })
    }

    /// Address of the home bucket of `hashed`, for prefetching.
    #[inline]
    pub fn bucket_ptr(&self, hashed: Hashed, guard: &Guard) -> *const u8 {
        self.index.bucket_ptr(hashed, guard)
    }

    /// The first candidate record number of `hashed`, unverified (see [`TagIndex::probe`]).
    #[inline]
    pub fn probe(&self, hashed: Hashed, guard: &Guard) -> Option<u32> {
        self.index.probe(hashed, guard)
    }

    /// The author's record, if indexed.
    #[inline]
    pub fn get_hashed(&self, author_id: i64, hashed: Hashed, guard: &Guard) -> Option<&Author> {
        self.index.get(hashed, guard, |number| {
            self.record(number)
                .filter(|author| author.author_id() == author_id)
        })
    }

    /// The author's record, if indexed.
    #[inline]
    pub fn get(&self, author_id: i64, guard: &Guard) -> Option<&Author> {
        self.get_hashed(author_id, self.hash(author_id), guard)
    }

    /// The author's record, indexed now if it was not. `None` only when every number is in
    /// use or memory ran out.
    pub fn get_or_create(&self, author_id: i64, guard: &Guard) -> Option<&Author> {
        let number = match self.index.insert_with(
            self.hash(author_id),
            guard,
            |number| {
                self.record(number)
                    .is_some_and(|a| a.author_id() == author_id)
            },
            || self.take_record(author_id),
        ) {
            Ok(number) | Err(Some(number)) => number,
            Err(None) => return None,
        };
        self.record(number)
    }

    /// A free record, set up for `author_id` and marked in use. Runs under the author's index
    /// stripe lock; the record's writer lock is free (an unused record is locked only briefly
    /// by a trim that skips it), so the lock order stripe -> writer cannot cycle with a trim's
    /// writer -> stripe (that writer belongs to a record in use).
    fn take_record(&self, author_id: i64) -> Option<u32> {
        let number = match self.free.pop() {
            Some(number) => number,
            None => {
                let number = self.next.fetch_add(1, Ordering::Relaxed);
                if number as usize >= MAX_CHUNKS * CHUNK_AUTHORS {
                    self.next.store(number, Ordering::Relaxed);
                    return None;
                }
                self.ensure_chunk((number >> CHUNK_SHIFT) as usize);
                number
            }
        };
        let author = self.record(number)?;
        author.author_id.store(author_id, Ordering::Relaxed);
        *author.writer.lock().unwrap_or_else(PoisonError::into_inner) = false;
        self.live.fetch_add(1, Ordering::Relaxed);
        Some(number)
    }

    fn ensure_chunk(&self, chunk: usize) {
        let Some(cell) = self.chunks.get(chunk) else {
            return;
        };
        // Acquire: as in `record`.
        if !cell.load(Ordering::Acquire).is_null() {
            return;
        }
        let _alloc = self
            .chunk_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !cell.load(Ordering::Acquire).is_null() {
            return;
        }
        let records = Self::new_chunk();
        // Release pairs with the Acquire loads in `record`: the records are initialised.
        cell.store(records, Ordering::Release);
    }

    /// Where a chunk's records live: one 2 MiB region of its own, advised `MADV_HUGEPAGE`
    /// (`huge_memory`). A query probes thousands of records scattered over the chunks (128
    /// MiB at a million authors); on 4 KiB pages nearly every probe also missed the TLB and
    /// walked the page table.
    #[cfg(not(any(thunder_loom, fuzzing)))]
    fn chunk_layout() -> std::alloc::Layout {
        const HUGE_PAGE: usize = 2 << 20;
        let bytes = (CHUNK_AUTHORS * std::mem::size_of::<Author>()).next_multiple_of(HUGE_PAGE);
        std::alloc::Layout::from_size_align(bytes, HUGE_PAGE).expect("a valid constant layout")
    }

    /// A chunk of `CHUNK_AUTHORS` unused records.
    #[cfg(not(any(thunder_loom, fuzzing)))]
    fn new_chunk() -> *mut Author {
        let layout = Self::chunk_layout();
        let Some(base) = crate::huge_memory::allocate_zeroed(layout) else {
            // As a failed `Box` allocation would.
            std::alloc::handle_alloc_error(layout);
        };
        let base = base.cast::<Author>();
        for i in 0..CHUNK_AUTHORS {
            // SAFETY: the region is `layout.size()` >= CHUNK_AUTHORS records long, aligned to
            // 2 MiB (so to `Author`'s 64), and this thread's alone until it is published.
            unsafe { base.add(i).write(Author::unused()) };
        }
        base
    }

    #[cfg(any(thunder_loom, fuzzing))]
    fn new_chunk() -> *mut Author {
        let records: Box<[Author]> = (0..CHUNK_AUTHORS).map(|_| Author::unused()).collect();
        Box::into_raw(records).cast::<Author>()
    }

    /// Drops `author` (numbered by its index entry) from the index. The caller holds its
    /// writer lock and has set the flag to "not in use"; the number is reused after the grace
    /// period of `guard`'s epoch.
    pub fn remove(&self, author: &Author, guard: &Guard) {
        let author_id = author.author_id();
        let Some(number) = self
            .index
            .remove_where(self.hash(author_id), guard, |number| {
                self.record(number).is_some_and(|a| std::ptr::eq(a, author))
            })
        else {
            return;
        };
        self.live.fetch_sub(1, Ordering::Relaxed);
        let free = Arc::clone(&self.free);
        guard.defer(move || free.push(number));
    }

    /// Calls `f` on every record that may be in use (check its writer flag under the lock).
    pub fn for_each(&self, mut f: impl FnMut(&Author)) {
        let handed_out = self.next.load(Ordering::Relaxed);
        for number in 0..handed_out {
            if let Some(author) = self.record(number) {
                f(author);
            }
        }
    }

    /// Bytes of the index table and the allocated record chunks.
    pub fn bytes(&self, guard: &Guard) -> usize {
        let chunks = self
            .chunks
            .iter()
            .filter(|c| !c.load(Ordering::Relaxed).is_null())
            .count();
        self.index.bytes(guard) + chunks * CHUNK_AUTHORS * std::mem::size_of::<Author>()
    }

    /// Authors indexed.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

impl Drop for AuthorIndex {
    fn drop(&mut self) {
        for cell in self.chunks.iter() {
            let base = cell.load(Ordering::Relaxed);
            if !base.is_null() {
                let slice = std::ptr::slice_from_raw_parts_mut(base, CHUNK_AUTHORS);
                #[cfg(not(any(thunder_loom, fuzzing)))]
                // SAFETY: `&mut self`: no reader is left; `base` holds CHUNK_AUTHORS initialised
                // records that `new_chunk` wrote into a mapping of `chunk_layout`, dropped and
                // freed only here.
                unsafe {
                    std::ptr::drop_in_place(slice);
                    crate::huge_memory::free(base.cast(), Self::chunk_layout());
                }
                #[cfg(any(thunder_loom, fuzzing))]
                // SAFETY: as above, the records being a boxed slice that `new_chunk` leaked.
                drop(unsafe { Box::from_raw(slice) });
            }
        }
    }
}

#[cfg(all(test, not(any(thunder_loom, fuzzing))))]
mod tests {
    use super::*;

    #[test]
    fn authors_over_several_chunks_are_found_removed_and_their_numbers_reused() {
        let authors = AuthorIndex::new();
        let guard = crossbeam_epoch::pin();
        // Two full chunks and part of a third.
        let count = 2 * CHUNK_AUTHORS as i64 + 100;
        let id = |i: i64| i * 7919 + 3;
        for i in 0..count {
            let author = authors.get_or_create(id(i), &guard).expect("a record");
            assert_eq!(author.author_id(), id(i));
        }
        assert_eq!(authors.live(), count as usize);
        let chunk_bytes = AuthorIndex::chunk_layout().size();
        assert!(authors.bytes(&guard) >= 3 * chunk_bytes);
        let mut chunks = std::collections::HashSet::new();
        for i in 0..count {
            let author = authors.get(id(i), &guard).expect("indexed");
            assert_eq!(author.author_id(), id(i));
            let address = author as *const Author as usize;
            // Every record lies in its chunk's own 2 MiB-aligned region.
            chunks.insert(address & !(chunk_bytes - 1));
            assert!(std::ptr::eq(
                authors
                    .get_or_create(id(i), &guard)
                    .expect("the same record"),
                author
            ));
        }
        assert_eq!(chunks.len(), 3, "records spread over three chunks");

        // Drop every third author: gone from the index, the others untouched.
        for i in (0..count).step_by(3) {
            let author = authors.get(id(i), &guard).expect("indexed");
            let mut unused = author.writer.lock().unwrap();
            *unused = true;
            authors.remove(author, &guard);
        }
        for i in 0..count {
            assert_eq!(
                authors.get(id(i), &guard).is_some(),
                i % 3 != 0,
                "author {i}"
            );
        }
        drop(guard);
        // After the grace period the freed numbers are handed out again before new ones.
        crate::sync::flush_epoch_until(|| authors.free.len() == (count as usize).div_ceil(3));
        assert_eq!(authors.free.len(), (count as usize).div_ceil(3));
        let handed_out = authors.next.load(Ordering::Relaxed);
        let guard = crossbeam_epoch::pin();
        for i in 0..100 {
            let author = authors.get_or_create(-1 - i, &guard).expect("a record");
            assert_eq!(author.author_id(), -1 - i);
        }
        assert!(authors.next.load(Ordering::Relaxed) < handed_out + 100);
    }
}
