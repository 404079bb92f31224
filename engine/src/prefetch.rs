//! A cache-line prefetch hint, used ahead of reads whose addresses the hardware cannot guess:
//! the query's merge (timeline buffers, records), inserts and the bulk build (records, index
//! words) and the snapshot writer (slots in time order). A leaf: it imports nothing of the
//! crate, so every module can use it.

/// Hints the CPU to load the line holding `ptr`.
#[inline(always)]
pub fn prefetch(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and never reads into the program,
    // whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ptr.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}
