//! Large zeroed regions that are never touched before they are used: arena chunks and big
//! index tables.
//!
//! On Linux a region is an anonymous mapping advised `MADV_HUGEPAGE` before any page is
//! touched, so each first touch maps a zero-filled 2 MiB huge page where the kernel has one.
//! `std::alloc::alloc_zeroed` at this alignment is an aligned `malloc` plus a `memset`, which
//! faults in every 4 KiB page before the advice can apply (a snapshot load's rebuild at
//! `--scale 4` went from 2.6-2.8 s to 1.6-1.8 s with this change). Callers pass a size and an
//! alignment that are multiples of the page size (2 MiB for huge pages).

#[cfg(target_os = "linux")]
mod imp {
    use std::alloc::Layout;

    /// A zeroed region of `layout` (size and alignment), or `None` when the system has no
    /// memory left.
    #[cfg_attr(thunder_loom, allow(dead_code))]
    pub(crate) fn allocate_zeroed(layout: Layout) -> Option<*mut u8> {
        let (size, align) = (layout.size(), layout.align());
        // Over-map by one alignment so an aligned start exists inside, then trim both ends.
        let mapped_len = size.checked_add(align)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(align);
        let (head, tail) = (aligned - start, start + mapped_len - (aligned + size));
        // SAFETY: both ranges lie inside the mapping made above, outside `aligned..+size`, and
        // are page-aligned (`align` and `size` are multiples of the page size, as is `start`).
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + size) as *mut libc::c_void, tail);
            }
            // A hint only: it does not change the (zero) contents.
            libc::madvise(aligned as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
        }
        Some(aligned as *mut u8)
    }

    /// Returns a region to the system.
    ///
    /// # Safety
    /// `ptr` came from [`allocate_zeroed`] with this `layout`, and nothing uses it any more.
    #[cfg_attr(thunder_loom, allow(dead_code))]
    pub(crate) unsafe fn free(ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller guarantees `ptr..+size` is a mapping of ours no one uses.
        unsafe {
            libc::munmap(ptr.cast(), layout.size());
        }
    }
    /// Hands the pages of `ptr..+len` back to the system, keeping the mapping: they read as
    /// zeroes from then on, and are faulted in afresh when touched. True if it was done.
    ///
    /// # Safety
    /// `ptr..+len` lies in a region from [`allocate_zeroed`] (`ptr` and `len` page-aligned),
    /// no one writes to it meanwhile, and whoever reads it accepts zeroes in place of the
    /// contents from any moment on.
    #[cfg_attr(thunder_loom, allow(dead_code))]
    pub(crate) unsafe fn discard(ptr: *mut u8, len: usize) -> bool {
        // SAFETY: as the caller guarantees; a private anonymous mapping reads as zero-fill
        // after MADV_DONTNEED.
        unsafe { libc::madvise(ptr.cast(), len, libc::MADV_DONTNEED) == 0 }
    }
}

/// Elsewhere: zeroed, aligned memory from the global allocator.
#[cfg(not(target_os = "linux"))]
mod imp {
    use std::alloc::Layout;

    /// A zeroed region of `layout`, or `None` when the allocator has no memory left.
    #[cfg_attr(thunder_loom, allow(dead_code))]
    pub(crate) fn allocate_zeroed(layout: Layout) -> Option<*mut u8> {
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(ptr)
    }

    /// Returns a region to the allocator.
    ///
    /// # Safety
    /// `ptr` came from [`allocate_zeroed`] with this `layout`, and nothing uses it any more.
    #[cfg_attr(thunder_loom, allow(dead_code))]
    pub(crate) unsafe fn free(ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller guarantees.
        unsafe { std::alloc::dealloc(ptr, layout) }
    }

    /// Nothing: the allocator's memory cannot be handed back in place. Always false.
    ///
    /// # Safety
    /// None needed; `unsafe` to match the Linux version.
    #[cfg_attr(thunder_loom, allow(dead_code))]
    pub(crate) unsafe fn discard(_ptr: *mut u8, _len: usize) -> bool {
        false
    }
}

// Loom builds box every chunk and table (their atomics cannot be zeroed memory) and leave chunk
// release out (engine/src/arena.rs): nothing there maps memory.
#[cfg(not(thunder_loom))]
pub(crate) use imp::{allocate_zeroed, discard, free};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A type whose all-zero bytes are a valid value, equal to [`Zeroable::zero`]: what a fresh
/// mapping holds.
///
/// # Safety
/// Outside loom builds (which never map a [`ZeroedSlice`]), a value of `size_of::<Self>()`
/// zero bytes must be a valid `Self`, equal to `zero()`, and `Self` must need no drop.
pub(crate) unsafe trait Zeroable: Sized {
    /// The zero value, for slices that are not mapped.
    fn zero() -> Self;
}

// SAFETY: a (non-loom) `AtomicU64` is a plain `u64` in memory; zero bytes are the value 0.
unsafe impl Zeroable for crate::sync::atomic::AtomicU64 {
    fn zero() -> Self {
        Self::new(0)
    }
}

// SAFETY: a (non-loom) `AtomicU32` is a plain `u32` in memory; zero bytes are the value 0.
unsafe impl Zeroable for crate::sync::atomic::AtomicU32 {
    fn zero() -> Self {
        Self::new(0)
    }
}

/// A slice of zero values that lives on an anonymous mapping of its own, advised
/// `MADV_HUGEPAGE`, once it is at least [`HUGE_BYTES`] long: random accesses across it then
/// miss the TLB far less, its first touches map zero pages instead of the allocator's
/// `memset`, and its first write into a page the reads mapped as the shared zero page costs
/// one fault for 2 MiB, not one fault (with a TLB shootdown on every other core) per 4 KiB.
/// Shorter slices (and every slice under loom, whose atomics are not plain words) are boxed.
pub(crate) enum ZeroedSlice<T: Zeroable> {
    Boxed(Box<[T]>),
    #[cfg(not(thunder_loom))]
    Mapped {
        first: std::ptr::NonNull<T>,
        len: usize,
        layout: std::alloc::Layout,
    },
}

/// Slices of at least this many bytes get their own mapping (one 2 MiB huge page).
#[cfg(not(thunder_loom))]
pub(crate) const HUGE_BYTES: usize = 2 << 20;

// SAFETY: `Mapped` owns its region exclusively (as `Boxed` owns its slice) and only hands out
// references to `T`s, so it is `Send`/`Sync` exactly when `T` is.
unsafe impl<T: Zeroable + Send> Send for ZeroedSlice<T> {}
// SAFETY: as above.
unsafe impl<T: Zeroable + Sync> Sync for ZeroedSlice<T> {}

impl<T: Zeroable> ZeroedSlice<T> {
    /// `len` zero values: mapped when that is at least [`HUGE_BYTES`] and the mapping
    /// succeeds, boxed otherwise.
    pub(crate) fn new(len: usize) -> Self {
        #[cfg(not(thunder_loom))]
        if let Some(mapped) = Self::mapped(len) {
            return mapped;
        }
        Self::Boxed((0..len).map(|_| T::zero()).collect())
    }

    #[cfg(not(thunder_loom))]
    fn mapped(len: usize) -> Option<Self> {
        let bytes = len.checked_mul(size_of::<T>())?;
        if bytes < HUGE_BYTES {
            return None;
        }
        let layout = std::alloc::Layout::from_size_align(
            bytes.checked_next_multiple_of(HUGE_BYTES)?,
            HUGE_BYTES.max(align_of::<T>()),
        )
        .ok()?;
        let first = std::ptr::NonNull::new(allocate_zeroed(layout)?)?;
        Some(Self::Mapped {
            first: first.cast(),
            len,
            layout,
        })
    }

    /// Whether the slice has a mapping of its own.
    #[cfg(all(test, not(thunder_loom)))]
    pub(crate) fn is_mapped(&self) -> bool {
        !matches!(self, Self::Boxed(_))
    }
}

impl<T: Zeroable> std::ops::Deref for ZeroedSlice<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Self::Boxed(values) => values,
            #[cfg(not(thunder_loom))]
            // SAFETY: the region holds at least `len * size_of::<T>()` bytes, aligned for `T`
            // (to 2 MiB), all zero until written through the `T`s handed out here, and zero
            // bytes are a valid `T` (`Zeroable`); it lives until `self` is dropped.
            Self::Mapped { first, len, .. } => unsafe {
                std::slice::from_raw_parts(first.as_ptr(), *len)
            },
        }
    }
}

impl<T: Zeroable> Drop for ZeroedSlice<T> {
    fn drop(&mut self) {
        #[cfg(not(thunder_loom))]
        if let Self::Mapped { first, layout, .. } = self {
            // SAFETY: the region came from `allocate_zeroed` with this layout, `&mut self`
            // means no reference into it is left, and `T` needs no drop (`Zeroable`).
            unsafe { free(first.as_ptr().cast(), *layout) };
        }
    }
}

/// Advises huge pages for the whole 2 MiB pages inside `vec`'s capacity, for a large vector
/// whose pages were not touched yet (one just reserved, or made by `vec![0; n]`, which maps
/// fresh zero pages) and that is read in random order: each first touch then maps a 2 MiB
/// page, and the reads miss the TLB far less. A hint: contents are unchanged, and nothing
/// happens elsewhere than on Linux.
pub(crate) fn advise_huge<T>(vec: &Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = vec.as_ptr() as usize;
        let end = start + vec.capacity() * size_of::<T>();
        let (from, to) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if to > from {
            // SAFETY: `from..to` lies inside the vector's allocation, which lives across the
            // call; the advice changes how its pages are backed, never their contents.
            unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = vec;
}

/// How far [`populate_ahead`] runs ahead of the writer it serves.
const POPULATE_AHEAD: usize = 64 << 20;
/// How much [`populate_ahead`] faults in per call.
const POPULATE_STEP: usize = 4 << 20;

/// Faults in, for writing, the pages of the region of `len` bytes at address `start` (spare
/// capacity another thread is filling in order) at most [`POPULATE_AHEAD`] bytes ahead of
/// `written` (the bytes that thread has filled so far), until the region is done or `stop` is
/// set; called on an otherwise idle core, so the kernel's page clearing runs there instead of
/// on the filling thread. Contents are never changed (`MADV_POPULATE_WRITE` only maps pages).
/// Stops at the first refusal (a kernel before 5.14, or no memory: the filling thread then
/// faults its pages in itself). Does nothing elsewhere than on Linux.
pub(crate) fn populate_ahead(start: usize, len: usize, written: &AtomicUsize, stop: &AtomicBool) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let (mut at, end) = (start.next_multiple_of(PAGE), start + len);
        // Relaxed: progress hints only; nothing is read through them.
        while at + PAGE <= end && !stop.load(Ordering::Relaxed) {
            let limit = (start + written.load(Ordering::Relaxed) + POPULATE_AHEAD).min(end);
            if at + PAGE > limit {
                std::thread::sleep(std::time::Duration::from_micros(100));
                continue;
            }
            let step = ((limit - at) / PAGE * PAGE).min(POPULATE_STEP);
            let addr = at as *mut libc::c_void;
            // SAFETY: the caller's region lies in an allocation it keeps alive until this
            // returns; populating maps its pages without changing any byte of them.
            let result = unsafe { libc::madvise(addr, step, libc::MADV_POPULATE_WRITE) };
            if result != 0 {
                return;
            }
            at += step;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len, written, stop);
}

#[cfg(not(thunder_loom))]
pub(crate) use ahead::Spare;

/// Regions made, and faulted in, ahead of need on a background thread.
///
/// The first touch of fresh memory is the kernel zeroing it (and, on a virtual machine, the
/// host backing it): up to a fifth of a one-writer load's time was `clear_page_erms` on the
/// arena's new chunks. A [`Spare`] holds the next region of one arena class, faulted in by
/// the `thunder-prefault` thread while the writer fills the current one, so that work runs on
/// a core the writers leave idle instead of on the writer.
#[cfg(not(thunder_loom))]
mod ahead {
    use std::alloc::Layout;
    use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
    use std::sync::mpsc::{Sender, channel};
    use std::sync::{Arc, OnceLock};

    /// At most one ready region of `layout`, and whether one is being made.
    pub(crate) struct Spare {
        ready: AtomicPtr<u8>,
        requested: AtomicBool,
        layout: Layout,
    }

    impl Spare {
        pub(crate) fn new(layout: Layout) -> Arc<Self> {
            Arc::new(Self {
                ready: AtomicPtr::new(std::ptr::null_mut()),
                requested: AtomicBool::new(false),
                layout,
            })
        }

        /// The ready region, if there is one: zeroed, of this spare's layout, faulted in, and
        /// the caller's alone from now on (to free with [`super::free`]).
        pub(crate) fn take(&self) -> Option<*mut u8> {
            // Acquire pairs with the background thread's Release install: its zeroing writes
            // and faults are done.
            let ptr = self.ready.swap(std::ptr::null_mut(), Ordering::Acquire);
            (!ptr.is_null()).then_some(ptr)
        }

        /// Asks the background thread for the next region, unless one is on its way (then
        /// this is a no-op). Lost requests only mean a region made on the caller's thread.
        pub(crate) fn refill(self: &Arc<Self>) {
            if self.requested.swap(true, Ordering::Relaxed) {
                return;
            }
            if prefaulter().send(Arc::clone(self)).is_err() {
                self.requested.store(false, Ordering::Relaxed);
            }
        }

        /// The ready region's address (null when none), without taking it.
        #[cfg(test)]
        pub(crate) fn ready_ptr(&self) -> *mut u8 {
            self.ready.load(Ordering::Acquire)
        }

        /// On the background thread: makes, faults in and installs one region.
        fn fill(&self) {
            self.requested.store(false, Ordering::Relaxed);
            if !self.ready.load(Ordering::Relaxed).is_null() {
                return;
            }
            let Some(ptr) = super::allocate_zeroed(self.layout) else {
                return;
            };
            const PAGE: usize = 4096;
            for offset in (0..self.layout.size()).step_by(PAGE) {
                // SAFETY: `ptr..+size` is a fresh mapping no other thread knows of yet; the
                // write stores the zero the byte already holds, only to fault the page in.
                unsafe { ptr.add(offset).write_volatile(0) };
            }
            // Release: the caller that takes it sees the zeroed, faulted-in region.
            if self
                .ready
                .compare_exchange(
                    std::ptr::null_mut(),
                    ptr,
                    Ordering::Release,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                // SAFETY: never shared; allocated above with this layout.
                unsafe { super::free(ptr, self.layout) };
            }
        }
    }

    impl Drop for Spare {
        fn drop(&mut self) {
            let ptr = *self.ready.get_mut();
            if !ptr.is_null() {
                // SAFETY: an installed region is owned by the spare until taken; no one took it.
                unsafe { super::free(ptr, self.layout) };
            }
        }
    }

    /// The background thread's queue, started on first use. Requests whose owner is gone
    /// (the spare's last other reference dropped) are skipped.
    fn prefaulter() -> &'static Sender<Arc<Spare>> {
        static TX: OnceLock<Sender<Arc<Spare>>> = OnceLock::new();
        TX.get_or_init(|| {
            let (tx, rx) = channel::<Arc<Spare>>();
            let spawned = std::thread::Builder::new()
                .name("thunder-prefault".into())
                .spawn(move || {
                    for spare in rx {
                        if Arc::strong_count(&spare) > 1 {
                            spare.fill();
                        }
                    }
                });
            // Without the thread the receiver is gone and every send fails: regions are then
            // made on the callers' threads, as without a spare.
            drop(spawned);
            tx
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_refilled_spare_hands_out_a_zeroed_region_once() {
            let layout = Layout::from_size_align(2 << 20, 2 << 20).expect("layout");
            let spare = Spare::new(layout);
            assert!(spare.take().is_none(), "nothing was asked for yet");
            spare.refill();
            let started = std::time::Instant::now();
            let ptr = loop {
                if let Some(ptr) = spare.take() {
                    break ptr;
                }
                assert!(
                    started.elapsed().as_secs() < 10,
                    "the background thread made nothing"
                );
                std::thread::yield_now();
            };
            assert_eq!(ptr as usize % layout.align(), 0);
            // SAFETY: the region is ours (taken), of `layout`, zeroed.
            let bytes = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
            assert!(bytes.iter().all(|&b| b == 0));
            assert!(spare.take().is_none(), "one region per request");
            // SAFETY: allocated by `allocate_zeroed` with this layout; no longer used.
            unsafe { super::super::free(ptr, layout) };
        }
    }
}

#[cfg(all(test, not(thunder_loom)))]
mod zeroed_slice_tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn a_zeroed_slice_is_mapped_from_one_huge_page_on_and_reads_zero_until_written() {
        let words = HUGE_BYTES / size_of::<AtomicU64>();
        for (len, mapped) in [(0, false), (1, false), (words - 1, false), (words, true)] {
            let slice = ZeroedSlice::<AtomicU64>::new(len);
            assert_eq!(
                (slice.len(), slice.is_mapped()),
                (len, mapped),
                "{len} words"
            );
        }
        // One word more than a huge page: two of them, the second mostly unused.
        let slice = ZeroedSlice::<AtomicU64>::new(words + 1);
        assert!(slice.is_mapped());
        if let ZeroedSlice::Mapped { first, layout, .. } = &slice {
            assert_eq!(
                first.as_ptr() as usize % HUGE_BYTES,
                0,
                "aligned to a huge page"
            );
            assert_eq!(layout.size(), 2 * HUGE_BYTES);
        }
        assert!(slice.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        for (i, w) in slice.iter().enumerate().step_by(4099) {
            w.store(i as u64 + 1, Ordering::Relaxed);
        }
        for (i, w) in slice.iter().enumerate() {
            let expected = if i % 4099 == 0 { i as u64 + 1 } else { 0 };
            assert_eq!(w.load(Ordering::Relaxed), expected, "word {i}");
        }
    }
}
