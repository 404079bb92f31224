//! Handing the C heap's freed memory back to the system.
//!
//! librdkafka allocates with the C allocator (glibc's malloc; the Rust global allocator is
//! mimalloc), and each of its broker threads gets a malloc arena of its own. What a fetched
//! record costs there (`window.rs`) is freed by the ingest thread once the record is applied,
//! but glibc returns memory to the system only from the top of an arena: the holes a replay
//! leaves below stay resident. Measured on a cold replay of a 2M-post topic, 450-500 MiB stayed
//! resident once caught up, three times the store itself, and a later fetch into another
//! thread's arena could not use it. `malloc_trim(0)` releases every free page of every arena
//! (`MADV_DONTNEED`); it takes about a millisecond here, so the ingest threads call it at
//! most every [`TRIM_INTERVAL`] while they apply batches, and once at catch-up.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Least time between two trims while batches are applied.
pub(super) const TRIM_INTERVAL: Duration = Duration::from_millis(250);

/// When the process-wide trim clock started.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
/// Milliseconds after [`EPOCH`] of the last trim.
static LAST_TRIM_MS: AtomicU64 = AtomicU64::new(0);

/// Releases the C heap's free pages if no thread did in the last [`TRIM_INTERVAL`].
pub(super) fn release_freed_memory_if_due() {
    let now_ms = u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX);
    let last_ms = LAST_TRIM_MS.load(Ordering::Relaxed);
    if !due(now_ms, last_ms) {
        return;
    }
    // One thread per interval wins; the others go on applying.
    if LAST_TRIM_MS
        .compare_exchange(last_ms, now_ms, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        release_freed_memory();
    }
}

/// Whether a trim is due at `now_ms` after the last one at `last_ms`.
fn due(now_ms: u64, last_ms: u64) -> bool {
    now_ms.saturating_sub(last_ms) >= TRIM_INTERVAL.as_millis() as u64
}

/// Releases the C heap's free pages now.
pub(super) fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only walks glibc's own arenas under their locks; it has no
    // preconditions on the caller.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_due_once_per_interval() {
        assert!(!due(0, 0));
        assert!(!due(249, 0));
        assert!(due(250, 0));
        assert!(!due(400, 250));
        assert!(due(10_000, 250));
        // A clock read before another thread's trim is not due.
        assert!(!due(100, 300));
    }
}
