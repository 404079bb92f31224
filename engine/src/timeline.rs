//! Per-author timelines: ring buffers of 16-byte [`TinyPost`] entries, oldest first.
//!
//! One writer (the author's writer, serialised by the author's lock) and any number of readers. A
//! buffer is a crossbeam-epoch `[Cell]` whose first element is the [`RingHeader`] (the ring's
//! `head` and `tail` sequence numbers, in a cell's 16 bytes) and whose other cells are the ring
//! (any capacity: entry `seq` lives in cell `1 + seq % capacity`, and rings grow by a quarter,
//! see [`grown`]). Appends write the next cell and then
//! publish `head`; evicting the oldest entry advances `tail`. Everything else (inserting out of
//! order, removing a deleted post, growing, shrinking) builds a new buffer and swaps it in,
//! retiring the old one through the epoch: a reader therefore always scans one consistent buffer
//! and never waits.
//!
//! The only thing a reader must check is that the oldest cells it reads were not recycled by
//! an append after an eviction: it re-reads `tail` after reading a cell ([`RingView::get`]).
//!
//! The ring protocol itself (`fill`, `RingView::load`, `RingView::get`, `RingView::append`,
//! `RingView::set_tail`) uses the `crate::sync` atomics and has loom models in `loom_tests`.

use crate::arena::SlotId;
use crate::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(thunder_loom))]
use crossbeam_epoch::Pointer;
use crossbeam_epoch::{Atomic, Guard, Owned, Shared};
use std::mem::{MaybeUninit, align_of, size_of};
#[cfg(not(thunder_loom))]
use std::sync::Arc;

/// A timeline entry: which post, when, and where its record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TinyPost {
    pub post_id: i64,
    pub created_at: u32,
    pub slot: SlotId,
}

impl TinyPost {
    /// The timeline order: `created_at`, then `post_id`. Total for distinct ids, so a
    /// timeline's content and order do not depend on the order its posts arrived in, and a
    /// reader walking it newest first meets its entries in the answer order.
    #[inline]
    pub fn key(&self) -> (u32, i64) {
        (self.created_at, self.post_id)
    }
}

/// One 16-byte cell: `post_id`, then `created_at << 32 | slot`.
///
/// 8-byte aligned, not 16: crossbeam puts the slice length (8 bytes) before the first element,
/// and with 8-byte elements a buffer of `n` cells is a `24 + 16n` byte request, which glibc's
/// 8-byte chunk header rounds to exactly `32 + 16n`; 16-byte alignment padded the length to 16
/// and cost 16 more bytes per buffer. A cell may then straddle two cache lines (one in four);
/// readers walk cells in order and an insert prefetches the newest cell's `created_at` word,
/// the one it compares (the `post_id` word only on equal timestamps), so that costs little.
#[repr(C, align(8))]
pub(crate) struct Cell {
    post_id: AtomicU64,
    packed: AtomicU64,
}

/// The first element of every buffer, in place of cell 0: the ring's bounds as sequence
/// numbers. Entry `seq` lives in cell `1 + seq % capacity`; `tail <= seq < head` are held.
#[repr(C, align(8))]
struct RingHeader {
    /// One past the newest entry; stored (Release) after the newest entry's cell is written.
    head: AtomicU64,
    /// The oldest entry held; the cells of older sequence numbers may be recycled by appends.
    tail: AtomicU64,
}

// The header takes cell 0's place, so the buffer layout (and its cache lines) stay as they were.
const _: () = assert!(
    size_of::<RingHeader>() == size_of::<Cell>() && align_of::<RingHeader>() == align_of::<Cell>()
);
// Loom's atomics are larger; the 16-byte cell only matters (and only holds) for the real ones.
#[cfg(not(thunder_loom))]
const _: () = assert!(size_of::<Cell>() == 16);

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

    /// True if this cell's entry goes no later than `entry` in key order. Reads the `post_id`
    /// word only on equal timestamps: the in-order insert prefetched the `created_at` word.
    fn not_after(&self, entry: &TinyPost) -> bool {
        let created_at = (self.packed.load(Ordering::Relaxed) >> 32) as u32;
        if created_at != entry.created_at {
            return created_at < entry.created_at;
        }
        self.post_id.load(Ordering::Relaxed) as i64 <= entry.post_id
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

/// Largest ring capacity (and so the largest per-timeline cap the store accepts).
pub(crate) const MAX_CAPACITY: usize = 1 << 14;

/// A ring buffer: element 0 is a [`RingHeader`] (written by `fill`), the rest are cells.
type Buffer = [MaybeUninit<Cell>];

/// The header of a buffer initialised by `fill`.
#[inline]
fn header_of(cells: &Buffer) -> &RingHeader {
    debug_assert!(!cells.is_empty());
    // SAFETY: `fill` initialises element 0 of every buffer as a `RingHeader`, which has the
    // size and alignment of the `Cell` the slice is typed as (asserted above); element 0 is
    // never accessed as a `Cell`.
    unsafe { &*cells.as_ptr().cast::<RingHeader>() }
}

/// Retired rings whose grace period has passed, waiting for the thread that retired them to
/// free them (`retire_home`): a lock-free stack linked through the rings themselves (each
/// ring's header cell holds the next ring's `Owned::into_usize`, 0 ending the stack), so
/// handing a ring back allocates nothing.
#[cfg(not(thunder_loom))]
struct Returned {
    /// The top ring's `Owned::into_usize`, or 0.
    top: crate::sync::atomic::AtomicUsize,
}

#[cfg(not(thunder_loom))]
impl Returned {
    /// Pushes a retired ring, past its grace period, given as its `Owned::into_usize`.
    fn push(&self, raw: usize) {
        use Ordering::{Relaxed, Release};
        let mut top = self.top.load(Relaxed);
        loop {
            // SAFETY: `raw` is a retired ring past its grace period: no reader can reach it,
            // and until the exchange below publishes it this call is its only owner. It is
            // turned back into `raw` before anyone else can see it.
            let mut ring = unsafe { Owned::<Buffer>::from_usize(raw) };
            ring[0].write(Cell::new(TinyPost {
                post_id: top as i64,
                created_at: 0,
                slot: 0,
            }));
            let raw = ring.into_usize();
            // Release: the popping thread sees the link written above.
            match self.top.compare_exchange_weak(top, raw, Release, Relaxed) {
                Ok(_) => return,
                Err(now) => top = now,
            }
        }
    }

    /// Frees every ring on the stack; returns how many.
    fn free_all(&self) -> usize {
        // Acquire pairs with the pushes' Release: their links are written.
        let mut at = self.top.swap(0, Ordering::Acquire);
        let mut freed = 0;
        while at != 0 {
            // SAFETY: `at` is a ring pushed by `push` (a retired ring past its grace period);
            // the swap took the whole stack, so this thread alone converts it back, once.
            let ring = unsafe { Owned::<Buffer>::from_usize(at) };
            // SAFETY: `push` wrote the header cell as a `Cell` holding the link.
            at = unsafe { ring[0].assume_init_ref() }.load().post_id as usize;
            drop(ring);
            freed += 1;
        }
        freed
    }
}

#[cfg(not(thunder_loom))]
impl Drop for Returned {
    fn drop(&mut self) {
        self.free_all();
    }
}

#[cfg(not(thunder_loom))]
thread_local! {
    /// The rings this thread retired that have come back to it.
    static RETURNED: Arc<Returned> = Arc::new(Returned {
        top: crate::sync::atomic::AtomicUsize::new(0),
    });
}

/// Retires `old` through the epoch so that the thread calling this frees it, not whichever
/// thread happens to run the deferred function; frees the rings that came back to this thread
/// since its last call.
///
/// A writer retires the rings it built (each author's events go to one writer, as Kafka
/// partitions them). When the deferred free ran on the other writer, glibc (the benches'
/// allocator) took the allocating thread's arena lock for it: two writers at scale 10 slept
/// on that lock about 2,100 times each in a 0.47 s load. The deferred function now only hands
/// the ring back to its thread (lock-free, allocating nothing), which frees it at its next
/// retirement, into its own arena. A thread that exits leaves its stack to the last deferred
/// function holding it, which frees what is left; a thread that stops retiring keeps the
/// rings of its last grace periods until it exits. During thread teardown (no thread-local
/// left) the ring is freed through the epoch as before.
///
/// Returns how many rings it freed.
///
/// # Safety
/// As for `Guard::defer_destroy`: `old` is unreachable for anyone who pins after this call,
/// and is retired once.
#[cfg(not(thunder_loom))]
unsafe fn retire_home(old: Shared<'_, Buffer>, guard: &Guard) -> usize {
    let Ok(home) = RETURNED.try_with(Arc::clone) else {
        // SAFETY: as the caller guarantees.
        unsafe { guard.defer_destroy(old) };
        return 0;
    };
    let raw = old.into_usize();
    // The function runs once every thread pinned before it was deferred has unpinned.
    guard.defer(move || home.push(raw));
    RETURNED.with(|returned| returned.free_all())
}

/// Under loom, retires `old` straight through the epoch: a thread-local stack would outlive
/// the model's execution (loom runs its threads on one thread of the process).
///
/// # Safety
/// As the non-loom `retire_home`.
#[cfg(thunder_loom)]
unsafe fn retire_home(old: Shared<'_, Buffer>, guard: &Guard) -> usize {
    // SAFETY: as the caller guarantees.
    unsafe { guard.defer_destroy(old) };
    0
}

/// A ring of `TinyPost`s in [`TinyPost::key`] order (`created_at`, then `post_id`).
pub(crate) struct Timeline {
    buffer: Atomic<Buffer>,
    /// The length and newest entry, republished by the writer after every change, so a
    /// reader can rank this timeline without touching its buffer (a cache miss) until it
    /// actually needs an entry. A hint: the buffer is the truth.
    summary: Summary,
}

/// What a reader learns from a [`Summary`] without touching the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SummaryView {
    /// Entries held (0: never written, or empty).
    pub len: u32,
    /// The newest entry's `created_at` (meaningless when `len` is 0).
    pub newest_created_at: u32,
    /// The newest entry's `post_id`, or `i64::MAX` (above every id) when the read overlapped
    /// a republish and the id may belong to another entry than `newest_created_at`.
    pub newest_post_id: i64,
}

/// A timeline's summary: one word `created_at << 32 | len << 17 | version` and the newest
/// entry's id beside it, published as a sequence lock with one writer (the author's writer).
/// The version is odd while the writer changes the id; a reader that sees an odd or changed
/// version gets `i64::MAX` as the id, an upper bound, and never waits or retries.
pub(crate) struct Summary {
    word: AtomicU64,
    newest_post_id: AtomicU64,
}

const SUMMARY_VERSION_BITS: u32 = 17;
const SUMMARY_VERSION_MASK: u64 = (1 << SUMMARY_VERSION_BITS) - 1;
// `len` (at most `MAX_CAPACITY`) fits between the version and `created_at`.
const _: () = assert!(MAX_CAPACITY < 1 << (32 - SUMMARY_VERSION_BITS));

impl Summary {
    fn new() -> Self {
        Self {
            word: AtomicU64::new(0),
            newest_post_id: AtomicU64::new(0),
        }
    }

    /// Writer only (one writer at a time, serialised by the author's lock).
    fn publish(&self, len: usize, newest: Option<TinyPost>) {
        let (created_at, post_id) = newest.map_or((0, 0), |e| (e.created_at, e.post_id));
        // Relaxed: the writer's own earlier store.
        let old = self.word.load(Ordering::Relaxed);
        let version = old & SUMMARY_VERSION_MASK;
        // Odd: a republish is under way. The Release fence keeps this store before the id's,
        // so a reader that loads the new id and then this word (after its Acquire fence) sees
        // the odd version or a later one, never the version it started with.
        self.word.store(
            (old & !SUMMARY_VERSION_MASK) | ((version + 1) & SUMMARY_VERSION_MASK),
            Ordering::Relaxed,
        );
        fence(Ordering::Release);
        self.newest_post_id.store(post_id as u64, Ordering::Relaxed);
        // Release: a reader whose Acquire load sees this word sees the id stored above.
        self.word.store(
            (u64::from(created_at) << 32)
                | ((len as u64) << SUMMARY_VERSION_BITS)
                | ((version + 2) & SUMMARY_VERSION_MASK),
            Ordering::Release,
        );
    }

    /// Any thread; never waits.
    #[inline]
    fn read(&self) -> SummaryView {
        // Acquire pairs with the Release store that ends a republish: the id loaded next is
        // that republish's or a later one's.
        let word = self.word.load(Ordering::Acquire);
        let post_id = self.newest_post_id.load(Ordering::Relaxed) as i64;
        // Keeps the id's load before the second load of the word (the seqlock's read fence).
        fence(Ordering::Acquire);
        let again = self.word.load(Ordering::Relaxed);
        let whole = word == again && word & 1 == 0;
        SummaryView {
            len: ((word >> SUMMARY_VERSION_BITS) as u32) & ((1 << (32 - SUMMARY_VERSION_BITS)) - 1),
            newest_created_at: (word >> 32) as u32,
            newest_post_id: if whole { post_id } else { i64::MAX },
        }
    }
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline").finish_non_exhaustive()
    }
}

/// What a reader sees of one timeline: a consistent buffer and its bounds when it was loaded
/// (the name keeps the store's snapshots, `snapshot/`, apart).
#[derive(Clone, Copy)]
pub(crate) struct RingView<'g> {
    cells: &'g Buffer,
    capacity: u64,
    /// One past the newest entry.
    pub head: u64,
    /// The oldest entry when the view was taken.
    pub tail: u64,
}

impl<'g> RingView<'g> {
    /// Reads the bounds of `cells`, a buffer initialised by `fill`.
    #[inline]
    fn load(cells: &'g Buffer) -> Self {
        let header = header_of(cells);
        // Acquire pairs with the Release store of `head` in `append`: the cells below it are
        // written.
        let head = header.head.load(Ordering::Acquire);
        // Acquire pairs with the Release store of `tail` in `set_tail`. Not load-bearing:
        // `get` re-validates `tail` after every cell it reads.
        let tail = header.tail.load(Ordering::Acquire);
        Self {
            cells,
            capacity: (cells.len() - 1) as u64,
            head,
            tail,
        }
    }

    /// Entries in the view (writer side: a reader's `tail` may pass its `head` if an
    /// append and a pop ran between its two loads; readers walk `tail..head` instead).
    pub fn len(&self) -> usize {
        (self.head - self.tail) as usize
    }

    fn header(&self) -> &'g RingHeader {
        header_of(self.cells)
    }

    fn cell(&self, seq: u64) -> &'g Cell {
        // SAFETY: `fill` initialises every element after the header as a `Cell`;
        // `1 + seq % capacity` is between 1 and the buffer length `capacity + 1` (exclusive).
        unsafe { self.cells[1 + (seq % self.capacity) as usize].assume_init_ref() }
    }

    /// The entry at `seq` (`tail <= seq < head`), or `None` if the writer has since evicted it
    /// and may have recycled its cell.
    #[inline]
    pub fn get(&self, seq: u64) -> Option<TinyPost> {
        let entry = self.cell(seq).load();
        // Acquire fence, pairs with the Release fence in `append` between advancing `tail` and
        // recycling a cell: if the load above saw a recycled cell, this sees the advanced tail.
        fence(Ordering::Acquire);
        let tail = self.header().tail.load(Ordering::Relaxed);
        (seq >= tail).then_some(entry)
    }

    /// Appends `entry` at `head` in place, first evicting (and returning) the oldest entry if
    /// `evict`. Writer only: this must be the writer's current view, with a free cell
    /// at `head` unless evicting a full ring.
    fn append(&self, entry: TinyPost, evict: bool) -> Option<TinyPost> {
        let header = self.header();
        let evicted = evict.then(|| {
            let oldest = self.cell(self.tail).load();
            header.tail.store(self.tail + 1, Ordering::Relaxed);
            oldest
        });
        // Release fence, pairs with the Acquire fence in `get`: a reader whose cell load sees
        // the store below (recycling the cell of an evicted or popped entry) also sees the tail
        // that moved past that entry.
        fence(Ordering::Release);
        self.cell(self.head).store(entry);
        // Release pairs with the Acquire load of `head` in `load`: readers that see the new
        // head see the cell written above.
        header.head.store(self.head + 1, Ordering::Release);
        evicted
    }

    /// Drops the entries below `tail` (at most `head`). Writer only, on its current view.
    fn set_tail(&self, tail: u64) {
        debug_assert!(self.tail <= tail && tail <= self.head);
        // Release pairs with the Acquire load of `tail` in `load`. A reader is kept off a
        // recycled cell by the fence in `append`, which precedes every store to a cell.
        self.header().tail.store(tail, Ordering::Release);
    }
}

/// Builds a buffer holding the `len` `entries` (oldest first) with sequence numbers starting
/// at `tail`.
fn build(
    capacity: usize,
    tail: u64,
    len: usize,
    entries: impl Iterator<Item = TinyPost>,
) -> Owned<Buffer> {
    debug_assert!((1..=MAX_CAPACITY).contains(&capacity));
    let mut buffer = Owned::<Buffer>::init(capacity + 1);
    fill(&mut buffer, tail, len, entries);
    buffer
}

/// Initialises `buffer` (capacity plus one elements) as a ring holding the `len` `entries`
/// (oldest first) with sequence numbers starting at `tail`; the other cells are zeroed. Every
/// cell is written once, in address order. The buffer is not shared yet.
fn fill(buffer: &mut Buffer, tail: u64, len: usize, mut entries: impl Iterator<Item = TinyPost>) {
    let capacity = buffer.len() - 1;
    assert!(
        capacity > 0 && len <= capacity,
        "{len} entries in a ring of {capacity}"
    );
    let head = tail + len as u64;
    let header = RingHeader {
        head: AtomicU64::new(head),
        tail: AtomicU64::new(tail),
    };
    // SAFETY: element 0 is the header's place: a `RingHeader` has the size and alignment of
    // the `Cell` the element is typed as (asserted above), and `header_of` reads it back as a
    // `RingHeader`.
    unsafe { buffer[0].as_mut_ptr().cast::<RingHeader>().write(header) };
    // Cell `1 + (start + i) % capacity` gets the entry of sequence number `tail + i`.
    let start = (tail % capacity as u64) as usize;
    let (wrapped, first) = buffer[1..].split_at_mut(start);
    for (i, cell) in first.iter_mut().chain(wrapped).enumerate() {
        let entry = (i < len).then(|| entries.next()).flatten();
        cell.write(Cell::new(entry.unwrap_or(TinyPost {
            post_id: 0,
            created_at: 0,
            slot: 0,
        })));
    }
}

/// Entries a ring grows by at least: small rings grow four cells at a time.
///
/// Growing one cell at a time made a timeline of 20 posts rebuild its ring 12 times (each an
/// allocation, a copy and an epoch-deferred free); with 4 it rebuilds 5 times. Measured on
/// `compare --scale 10 --only engine --ingest-only --presize`, four alternating runs each on a
/// quiet machine: 1-writer ingest 0.59-0.82 s -> 0.53-0.56 s, 2-writer CPU 1.28-1.36 s ->
/// 1.15-1.17 s, for 2.8 more bytes of ring slack per post (timelines 22.6 -> 25.4 B/post);
/// at least 8 cost 5.3 bytes more again and measured the same as 4.
const GROW_AT_LEAST: usize = 4;

/// The capacity a ring holding `len` entries is (re)built with: a quarter more (at least
/// [`GROW_AT_LEAST`] more) than `len`, at most `cap` (the timeline's entry cap) but never
/// below `len`.
///
/// Rings grow by a quarter rather than doubling: most timelines hold a handful of entries
/// and the big ones sit at the cap, so power-of-two capacities left a third of the ring
/// memory empty.
fn grown(len: usize, cap: usize) -> usize {
    (len + (len / 4).max(GROW_AT_LEAST))
        .min(cap)
        .clamp(len.max(1), MAX_CAPACITY)
}

/// The capacity to shrink a ring of `capacity` holding `len` entries to, if it uses under
/// half of it (so a ring that shrinks is not grown again by the next few appends).
fn shrunk(len: usize, capacity: usize) -> Option<usize> {
    let fit = grown(len, MAX_CAPACITY);
    (fit * 2 <= capacity).then_some(fit)
}

impl Timeline {
    pub fn new() -> Self {
        Self {
            buffer: Atomic::null(),
            summary: Summary::new(),
        }
    }

    /// A consistent view for reading; `None` if the timeline never held anything.
    #[inline]
    pub fn view<'g>(&self, guard: &'g Guard) -> Option<RingView<'g>> {
        // Acquire pairs with the Release half of the swap in `replace`: the buffer is built.
        let shared = self.buffer.load(Ordering::Acquire, guard);
        // SAFETY: non-null buffers stay allocated while `guard` is pinned: replaced and
        // released ones are retired through the epoch, and the last one is freed only when the
        // owning author is reclaimed, which waits for every reader holding it.
        let cells = unsafe { shared.as_ref() }?;
        Some(RingView::load(cells))
    }

    /// Address of the buffer's first line (header and oldest cells), for prefetching.
    #[inline]
    pub fn buffer_ptr(&self, guard: &Guard) -> *const u8 {
        let shared = self.buffer.load(Ordering::Relaxed, guard);
        // SAFETY: the buffer stays allocated while `guard` is pinned (see `view`).
        unsafe { shared.as_ref() }.map_or(std::ptr::null(), |cells| cells.as_ptr().cast())
    }

    /// Address of the newest entry's `created_at` word (what an in-order insert compares;
    /// it appends next to it), for prefetching; null if there is no buffer. The word, not the
    /// cell: an 8-byte aligned cell may straddle two lines. Reads the header: prefetch that
    /// first ([`Timeline::buffer_ptr`]).
    #[inline]
    pub fn newest_cell_ptr(&self, guard: &Guard) -> *const u8 {
        self.view(guard).map_or(std::ptr::null(), |view| {
            (&view.cell(view.head.wrapping_sub(1)).packed as *const AtomicU64).cast()
        })
    }

    /// The number of entries (writer side; readers use a view).
    pub fn len(&self, guard: &Guard) -> usize {
        self.view(guard).map_or(0, |s| s.len())
    }

    /// The oldest entry (writer side: the author's writer holds its lock).
    pub fn oldest(&self, guard: &Guard) -> Option<TinyPost> {
        let view = self.view(guard)?;
        (view.head > view.tail)
            .then(|| view.get(view.tail))
            .flatten()
    }

    /// Bytes of buffer this timeline holds: its cells, header and crossbeam's length word
    /// (not the allocator's own 8-byte chunk header).
    pub fn buffer_bytes(&self, guard: &Guard) -> usize {
        let shared = self.buffer.load(Ordering::Relaxed, guard);
        // SAFETY: the buffer stays allocated while `guard` is pinned (see `view`).
        unsafe { shared.as_ref() }.map_or(0, |cells| size_of::<usize>() + size_of_val(cells))
    }

    fn entries<'g>(view: &RingView<'g>) -> impl ExactSizeIterator<Item = TinyPost> + 'g {
        let view = *view;
        (0..view.len()).map(move |i| view.cell(view.tail + i as u64).load())
    }

    fn replace(&self, fresh: Owned<Buffer>, guard: &Guard) {
        // Release pairs with the Acquire load in `view`: readers see the buffer fully built.
        // Acquire pairs with the previous swap's Release, for the old buffer retired below
        // (writers are already ordered by the author lock).
        let old = self.buffer.swap(fresh, Ordering::AcqRel, guard);
        if !old.is_null() {
            // SAFETY: `old` is no longer reachable from the timeline; readers that loaded it
            // before the swap are pinned, and the epoch hands it back only after they unpin.
            unsafe { retire_home(old, guard) };
        }
    }

    /// Inserts `entry` at its [`TinyPost::key`] position. If the timeline
    /// already holds `cap` entries, the oldest is evicted and returned; that may be `entry`
    /// itself when it is older than everything held, in which case nothing changes.
    ///
    /// Writer only (the caller holds the author's lock).
    fn insert_unsummarised(&self, entry: TinyPost, cap: usize, guard: &Guard) -> Option<TinyPost> {
        let Some(view) = self.view(guard) else {
            self.replace(build(grown(0, cap), 0, 1, std::iter::once(entry)), guard);
            return None;
        };
        let len = view.len();
        let full = len >= cap;
        let in_order = len == 0 || view.cell(view.head - 1).not_after(&entry);
        let capacity = view.capacity as usize;
        if full {
            let oldest = view.cell(view.tail).load();
            if entry.key() < oldest.key() {
                return Some(entry);
            }
        }
        if in_order && (full || len < capacity) {
            // Fast path: evict in place if needed, then append into a free cell.
            return view.append(entry, full);
        }
        // Slow path: rebuild with the entry at its place (and the oldest dropped if full).
        // Copied straight from the old buffer (no intermediate vector): the entries kept
        // (`from..head`), with `entry` before the first one newer than it.
        let evicted = full.then(|| view.cell(view.tail).load());
        let from = view.tail + u64::from(full);
        let at = if in_order {
            view.head
        } else {
            let (mut lo, mut hi) = (from, view.head);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if view.cell(mid).load().key() <= entry.key() {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        let len = (view.head - from) as usize + 1;
        let capacity = if len > capacity {
            grown(len, cap)
        } else {
            capacity
        };
        let copy = |seq: u64| view.cell(seq).load();
        let entries = (from..at)
            .map(copy)
            .chain(std::iter::once(entry))
            .chain((at..view.head).map(copy));
        self.replace(build(capacity, from, len, entries), guard);
        evicted
    }

    /// Removes the entry of `post_id` (created at `created_at`) if present. Writer only.
    fn remove_unsummarised(&self, post_id: i64, created_at: u32, guard: &Guard) -> bool {
        let Some(view) = self.view(guard) else {
            return false;
        };
        // Entries are in key order: binary search for the first one not below the key.
        // Straight from the buffer, no copy of it.
        let key = (created_at, post_id);
        let (mut lo, mut hi) = (view.tail, view.head);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if view.cell(mid).load().key() < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == view.head || view.cell(lo).load().key() != key {
            return false;
        }
        let at = lo;
        if at == view.tail {
            view.set_tail(view.tail + 1);
            return true;
        }
        let rest = view.len() - 1;
        let capacity = shrunk(rest, view.capacity as usize).unwrap_or(view.capacity as usize);
        let copy = |seq: u64| view.cell(seq).load();
        let kept = (view.tail..at)
            .map(copy)
            .chain((at + 1..view.head).map(copy));
        self.replace(build(capacity, view.tail, rest, kept), guard);
        true
    }

    /// Pops oldest entries while `expired(entry)` holds; returns them. Writer only.
    fn pop_expired_unsummarised(
        &self,
        mut expired: impl FnMut(&TinyPost) -> bool,
        guard: &Guard,
    ) -> Vec<TinyPost> {
        let mut popped = Vec::new();
        let Some(view) = self.view(guard) else {
            return popped;
        };
        let mut tail = view.tail;
        while tail < view.head {
            let entry = view.cell(tail).load();
            if !expired(&entry) {
                break;
            }
            popped.push(entry);
            tail += 1;
        }
        if tail != view.tail {
            view.set_tail(tail);
        }
        popped
    }

    /// Rebuilds into a smaller buffer when the entries use under half of it; drops the
    /// buffer altogether when empty. Returns true if the timeline is now empty. Writer only.
    fn shrink_unsummarised(&self, guard: &Guard) -> bool {
        let Some(view) = self.view(guard) else {
            return true;
        };
        let len = view.len();
        if len == 0 {
            // Keep the (small) buffer; the owner is dropped when all its timelines are empty.
            return true;
        }
        if let Some(capacity) = shrunk(len, view.capacity as usize) {
            self.replace(build(capacity, view.tail, len, Self::entries(&view)), guard);
        }
        false
    }
}

impl Timeline {
    /// Length and newest entry as last published by the writer. A hint: the newest entry
    /// was the newest when published (or the id is `i64::MAX`), the buffer is the truth.
    #[inline]
    pub fn summary(&self) -> SummaryView {
        self.summary.read()
    }

    fn publish_summary(&self, guard: &Guard) {
        let (len, newest) = self.view(guard).map_or((0, None), |view| {
            let len = view.len();
            (len, (len > 0).then(|| view.cell(view.head - 1).load()))
        });
        self.summary.publish(len, newest);
    }

    /// Fills a timeline that never held anything with `entries` (oldest first, at most `cap`)
    /// in one buffer, sized as a rebuild would size it: the bulk load's whole-timeline build.
    /// Nothing for no entries (the timeline stays without a buffer). Writer only.
    pub fn fill_fresh(&self, entries: &[TinyPost], cap: usize, guard: &Guard) {
        debug_assert!(self.view(guard).is_none(), "fill_fresh on a used timeline");
        if entries.is_empty() {
            return;
        }
        let capacity = grown(entries.len(), cap);
        self.replace(
            build(capacity, 0, entries.len(), entries.iter().copied()),
            guard,
        );
        self.publish_summary(guard);
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

    /// Drops the buffer of an empty timeline, as if it never held anything: for an author
    /// dropped from the index, whose record waits, bufferless, for reuse. Readers still pinned
    /// keep the old buffer until the epoch frees it. Writer only.
    pub fn release_buffer(&self, guard: &Guard) {
        debug_assert!(
            self.view(guard).is_none_or(|view| view.len() == 0),
            "release_buffer on a timeline with entries"
        );
        // AcqRel: as the swap in `replace` (a null buffer needs no publishing, the Acquire half
        // is for the old buffer retired below).
        let old = self.buffer.swap(Shared::null(), Ordering::AcqRel, guard);
        if !old.is_null() {
            // SAFETY: as in `replace`: `old` is unreachable from the timeline now, and readers
            // that loaded it are pinned until the epoch hands it back.
            unsafe { retire_home(old, guard) };
        }
        self.publish_summary(guard);
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

#[cfg(all(test, not(thunder_loom)))]
mod tests {
    use super::*;

    fn tp(post_id: i64, created_at: u32) -> TinyPost {
        TinyPost {
            post_id,
            created_at,
            slot: post_id as u32,
        }
    }

    #[test]
    fn a_summary_reads_back_what_was_published_through_the_version_wrap() {
        let summary = Summary::new();
        assert_eq!(summary.read().len, 0);
        // More republishes than the version counts (it wraps), with every field moving.
        for n in 0..(1u64 << SUMMARY_VERSION_BITS) + 5 {
            let len = (n as usize * 7) % (MAX_CAPACITY + 1);
            let entry = tp(
                i64::MIN + (n as i64) * 977,
                (n as u32).wrapping_mul(2_654_435_761),
            );
            summary.publish(len, Some(entry));
            let view = summary.read();
            assert_eq!(
                view,
                SummaryView {
                    len: len as u32,
                    newest_created_at: entry.created_at,
                    newest_post_id: entry.post_id,
                },
                "republish {n}"
            );
        }
        summary.publish(0, None);
        assert_eq!(summary.read().len, 0);
    }

    #[test]
    fn a_timeline_publishes_its_newest_entry_in_key_order() {
        let t = Timeline::new();
        let guard = crossbeam_epoch::pin();
        t.insert(tp(5, 10), 100, &guard);
        t.insert(tp(9, 10), 100, &guard);
        t.insert(tp(7, 10), 100, &guard); // out of order within its second
        let view = t.summary();
        assert_eq!(
            (view.len, view.newest_created_at, view.newest_post_id),
            (3, 10, 9)
        );
        assert_eq!(read_all(&t), vec![(5, 10), (7, 10), (9, 10)]);
        assert!(t.remove(9, 10, &guard));
        let view = t.summary();
        assert_eq!(
            (view.len, view.newest_created_at, view.newest_post_id),
            (2, 10, 7)
        );
    }

    fn read_all(t: &Timeline) -> Vec<(i64, u32)> {
        let guard = crossbeam_epoch::pin();
        let Some(s) = t.view(&guard) else {
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
        // Capacity stops at the cap (300, not a power of two) and the ring wraps in it.
        assert_eq!(t.buffer_bytes(&guard), 8 + (1 + 300) * 16);
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
        assert_eq!(
            t.buffer_bytes(&guard),
            8 + (1 + 8) * 16,
            "4 entries and GROW_AT_LEAST more"
        );
        assert_eq!(read_all(&t).len(), 4);
        t.pop_expired(|_| true, &guard);
        assert!(t.shrink(&guard));
    }

    #[test]
    fn capacity_grows_by_a_quarter_within_the_cap() {
        // A new ring has GROW_AT_LEAST cells; each growth adds a quarter, at least that many.
        const CAPACITIES: [usize; 10] = [4, 9, 14, 19, 25, 32, 41, 52, 66, 83];
        let mut capacities = vec![grown(0, 5000)];
        while let Some(&last) = capacities.last().filter(|&&c| c < 5000) {
            capacities.push(grown(last + 1, 5000));
        }
        assert_eq!(capacities[..10], CAPACITIES);
        assert_eq!(capacities.last(), Some(&5000), "never past the cap");
        for pair in capacities.windows(2) {
            assert!(pair[1] > pair[0] && pair[1] <= pair[0] + 2 + (pair[0] / 4).max(GROW_AT_LEAST));
        }
        assert_eq!(grown(7000, 5000), 7000, "never below what it must hold");
        assert_eq!(shrunk(4, 16), Some(8));
        assert_eq!(shrunk(5, 16), None, "keeps rings used over half");
    }

    #[test]
    fn out_of_order_inserts_and_evictions_wrap_a_ring_of_odd_capacity() {
        let t = Timeline::new();
        let guard = crossbeam_epoch::pin();
        let mut expected = Vec::new();
        for i in 0..200i64 {
            // Every fifth post arrives three seconds late; the cap (7) evicts the oldest.
            let at = if i % 5 == 4 { 10 * i - 30 } else { 10 * i } as u32;
            t.insert(tp(i, at), 7, &guard);
            expected.push((i, at));
            expected.sort_by_key(|e| e.1);
            if expected.len() > 7 {
                expected.remove(0);
            }
            assert_eq!(read_all(&t), expected, "after post {i}");
        }
        assert_eq!(t.buffer_bytes(&guard), 8 + (1 + 7) * 16);
    }

    /// Rings handed back by several threads at once are each freed once by the thread that
    /// empties the stack, with their cells intact up to the header the link overwrote.
    #[test]
    fn rings_handed_back_from_other_threads_are_freed_once() {
        let home = Returned {
            top: crate::sync::atomic::AtomicUsize::new(0),
        };
        let (threads, per_thread) = (4, 2000);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let home = &home;
                scope.spawn(move || {
                    for i in 0..per_thread {
                        let capacity = 1 + (t * per_thread + i) % 40;
                        let ring = build(capacity, 0, 1, std::iter::once(tp(i as i64, 100)));
                        home.push(ring.into_usize());
                    }
                });
            }
        });
        assert_eq!(home.free_all(), threads * per_thread);
        assert_eq!(home.free_all(), 0, "the stack is empty after it was freed");
    }

    /// Every ring a thread retires comes back to that thread once its grace period is over
    /// and is freed there, once.
    #[test]
    fn retired_rings_come_back_to_the_retiring_thread() {
        let retired = 1000;
        let mut freed = 0;
        for n in 0..retired {
            let guard = crossbeam_epoch::pin();
            let ring = build(4, 0, 1, std::iter::once(tp(n as i64, 100))).into_shared(&guard);
            // SAFETY: the ring was never reachable from anything but this local.
            freed += unsafe { retire_home(ring, &guard) };
        }
        // Other tests of this process may hold pins for a while: wait on a deadline.
        crate::sync::flush_epoch_until(|| {
            freed += RETURNED.with(|returned| returned.free_all());
            freed >= retired
        });
        assert_eq!(freed, retired);
    }

    #[test]
    fn a_view_stays_consistent_across_a_rebuild() {
        let t = Timeline::new();
        let guard = crossbeam_epoch::pin();
        for i in 0..8 {
            t.insert(tp(i, 10 * i as u32), 100, &guard);
        }
        let before = t.view(&guard).unwrap();
        t.insert(tp(100, 15), 100, &guard); // out of order: rebuilds
        let seen: Vec<i64> = (before.tail..before.head)
            .map(|q| before.get(q).unwrap().post_id)
            .collect();
        assert_eq!(seen, (0..8).collect::<Vec<_>>(), "old view unchanged");
        assert_eq!(read_all(&t).len(), 9);
    }
}

/// Loom models of the ring protocol: `RUSTFLAGS="--cfg thunder_loom" cargo test --lib loom` (see
/// `crate::sync`). One writer and one reader per model, as in the store (writers of a timeline
/// serialise on the author's lock). crossbeam-epoch cannot run under loom, so `Published`
/// stands in for `Timeline::buffer`, with the orderings of `Timeline::view` and
/// `Timeline::replace`; a replaced buffer is kept alive to the end, as the epoch would.
#[cfg(all(test, thunder_loom))]
mod loom_tests {
    use super::*;
    use crate::sync::atomic::AtomicPtr;
    use loom::sync::Arc;
    use loom::thread;

    /// Entry `n`: its `created_at` and `slot` are functions of `post_id`, so a torn read (one
    /// half of a cell from another entry) shows.
    fn entry(n: i64) -> TinyPost {
        TinyPost {
            post_id: n,
            created_at: 100 + n as u32,
            slot: 7 * n as u32,
        }
    }

    /// A buffer as `Timeline` holds one, without crossbeam.
    struct Ring {
        cells: Box<Buffer>,
    }

    impl Ring {
        fn new(capacity: usize, tail: u64, posts: &[i64]) -> Self {
            let mut cells = Box::<[Cell]>::new_uninit_slice(capacity + 1);
            fill(
                &mut cells,
                tail,
                posts.len(),
                posts.iter().map(|&n| entry(n)),
            );
            Self { cells }
        }

        fn view(&self) -> RingView<'_> {
            RingView::load(&self.cells)
        }
    }

    /// Stand-in for the timeline's buffer pointer: owns the current `Box<Ring>`.
    struct Published {
        current: AtomicPtr<Ring>,
    }

    impl Published {
        fn new(ring: Ring) -> Self {
            Self {
                current: AtomicPtr::new(Box::into_raw(Box::new(ring))),
            }
        }

        /// `Timeline::view`: the buffer (Acquire, as there) and its bounds.
        fn view(&self) -> (*const Ring, RingView<'_>) {
            let ring = self.current.load(Ordering::Acquire);
            // SAFETY: the current ring lives until `self` drops, a replaced one until the
            // model frees it after joining every reader.
            (ring, unsafe { &*ring }.view())
        }

        /// `Timeline::replace`: publishes a fully built buffer (AcqRel swap, as there) and
        /// hands back the old one, to be freed once no reader can hold it.
        fn replace(&self, ring: Ring) -> *mut Ring {
            self.current
                .swap(Box::into_raw(Box::new(ring)), Ordering::AcqRel)
        }
    }

    impl Drop for Published {
        fn drop(&mut self) {
            let current = self.current.with_mut(|ring| *ring);
            // SAFETY: the pointer came from `Box::into_raw` and `&mut self` is its last user.
            drop(unsafe { Box::from_raw(current) });
        }
    }

    /// Walks a view newest first the way the query does (`Reader::advance`): stops at the
    /// first evicted entry. Returns `(seq, entry)` pairs.
    fn read_newest_first(view: &RingView<'_>) -> Vec<(u64, TinyPost)> {
        let mut seen = Vec::new();
        let mut seq = view.head;
        while seq > view.tail {
            seq -= 1;
            let Some(entry) = view.get(seq) else { break };
            seen.push((seq, entry));
        }
        seen
    }

    /// Every entry read is whole and is the one `expected(seq)` names for its buffer.
    fn check(seen: &[(u64, TinyPost)], expected: impl Fn(u64) -> i64) {
        for &(seq, got) in seen {
            assert_eq!(got, entry(expected(seq)), "seq {seq}: read {seen:?}");
        }
    }

    /// The summary's sequence lock: while the writer republishes twice, a reader's view is
    /// one of the three published states, or one state's time and length with `i64::MAX`
    /// (an upper bound) as the id; never a time with another state's id.
    #[test]
    fn loom_summary_never_pairs_a_time_with_another_entrys_id() {
        loom::model(|| {
            let summary = Arc::new(Summary::new());
            summary.publish(1, Some(entry(1)));
            let reader = {
                let summary = Arc::clone(&summary);
                thread::spawn(move || summary.read())
            };
            summary.publish(2, Some(entry(2)));
            summary.publish(1, Some(entry(3)));
            let view = reader.join().unwrap();
            let states = [(1, entry(1)), (2, entry(2)), (1, entry(3))];
            assert!(
                states.iter().any(|&(len, e)| view.len == len
                    && view.newest_created_at == e.created_at
                    && (view.newest_post_id == e.post_id || view.newest_post_id == i64::MAX)),
                "read {view:?}"
            );
        });
    }

    /// A full ring of 4: the writer appends twice at the cap, each time evicting the oldest
    /// entry and recycling its cell, while a reader walks it.
    #[test]
    fn loom_ring_append_recycles_cells_under_a_reader() {
        loom::model(|| {
            let ring = Arc::new(Published::new(Ring::new(4, 0, &[1, 2, 3, 4])));
            let reader = {
                let ring = Arc::clone(&ring);
                thread::spawn(move || {
                    let (_, view) = ring.view();
                    assert!(view.tail <= view.head && view.head - view.tail <= 4);
                    read_newest_first(&view)
                })
            };
            for n in [5, 6] {
                let (_, view) = ring.view();
                assert_eq!(view.append(entry(n), true), Some(entry(n - 4)));
            }
            // Sequence `seq` holds post `seq + 1` whichever append the reader saw.
            check(&reader.join().unwrap(), |seq| seq as i64 + 1);
        });
    }

    /// The same on a full ring of 3 (not a power of two): the appends wrap through
    /// `seq % capacity` into the cells of the evicted entries.
    #[test]
    fn loom_ring_of_odd_capacity_recycles_cells_under_a_reader() {
        loom::model(|| {
            let ring = Arc::new(Published::new(Ring::new(3, 0, &[1, 2, 3])));
            let reader = {
                let ring = Arc::clone(&ring);
                thread::spawn(move || read_newest_first(&ring.view().1))
            };
            for n in [4, 5] {
                let (_, view) = ring.view();
                assert_eq!(view.append(entry(n), true), Some(entry(n - 3)));
            }
            check(&reader.join().unwrap(), |seq| seq as i64 + 1);
        });
    }

    /// Pops two entries, appends into the cell of a popped one (no eviction), then pops
    /// everything, while a reader walks the ring.
    #[test]
    fn loom_ring_pop_then_append_under_a_reader() {
        loom::model(|| {
            let ring = Arc::new(Published::new(Ring::new(4, 0, &[1, 2, 3, 4])));
            let reader = {
                let ring = Arc::clone(&ring);
                thread::spawn(move || read_newest_first(&ring.view().1))
            };
            ring.view().1.set_tail(2);
            assert_eq!(ring.view().1.append(entry(5), false), None);
            let view = ring.view().1;
            view.set_tail(view.head);
            check(&reader.join().unwrap(), |seq| seq as i64 + 1);
        });
    }

    /// The writer appends in place (evicting), then rebuilds (an out-of-order insert),
    /// publishes the new buffer and appends to it in place, while a reader walks whichever
    /// buffer it loaded: it sees the old one or the new one, never a mix or a torn entry.
    #[test]
    fn loom_ring_rebuild_publishes_a_whole_buffer() {
        loom::model(|| {
            let ring = Arc::new(Published::new(Ring::new(4, 0, &[1, 2, 3, 4])));
            let (old, _) = ring.view();
            let reader = {
                let ring = Arc::clone(&ring);
                thread::spawn(move || {
                    let (which, view) = ring.view();
                    (which == old, read_newest_first(&view))
                })
            };
            assert_eq!(ring.view().1.append(entry(5), true), Some(entry(1)));
            let replaced = ring.replace(Ring::new(8, 1, &[2, 3, 9, 4, 5]));
            assert_eq!(ring.view().1.append(entry(11), false), None);
            let (from_old, seen) = reader.join().unwrap();
            // SAFETY: from `Box::into_raw` in `Published`; the only reader has been joined.
            drop(unsafe { Box::from_raw(replaced) });
            if from_old {
                check(&seen, |seq| seq as i64 + 1);
            } else {
                check(&seen, |seq| [2, 3, 9, 4, 5, 11][seq as usize - 1]);
                // Nothing is evicted from the new buffer: all of it, with or without post 11.
                assert!(matches!(seen.len(), 5 | 6), "read {seen:?}");
            }
        });
    }
}
