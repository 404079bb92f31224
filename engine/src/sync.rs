//! The atomics, fences and locks the store's protocols are written against: `std`'s in every
//! normal build, loom's under `RUSTFLAGS="--cfg thunder_loom"`, so the loom models next to that
//! code explore every interleaving and every weak-memory outcome of the real functions (tokio's
//! `crate::loom` facade is the model for this).
//!
//! Those protocols: the arena, the indexes, the timelines, the tombstone filter, the author
//! writer locks and the orderings of `tables.rs`. What loom cannot model stays outside:
//! crossbeam-epoch (a ring's buffer pointer, the grace periods), the papaya maps (tombstones,
//! waiting reposts) and the lock-free free lists of slots and author numbers. The cfg has the
//! crate's own name, not `loom`, because dependencies such as tokio change shape under a plain
//! `--cfg loom`.
//!
//! Outside `cfg(thunder_loom)` this is a plain re-export: no wrapper, no cost. Under loom the
//! atomics only work inside `loom::model`, so a `--cfg thunder_loom` build is for running the
//! models alone:
//!
//! ```text
//! RUSTFLAGS="--cfg thunder_loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p thunder-engine --release --lib loom
//! ```

/// `std::sync::atomic`, or loom's model of it under `cfg(thunder_loom)`.
#[cfg(not(thunder_loom))]
pub(crate) mod atomic {
    pub(crate) use std::sync::atomic::*;
}

/// `std::sync::atomic`, or loom's model of it under `cfg(thunder_loom)`.
#[cfg(thunder_loom)]
pub(crate) mod atomic {
    pub(crate) use loom::sync::atomic::*;
}

/// `std::sync::Mutex`, or loom's model of it under `cfg(thunder_loom)`.
#[cfg(not(thunder_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// `std::sync::Mutex`, or loom's model of it under `cfg(thunder_loom)`.
#[cfg(thunder_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

/// Frees boxes that concurrent readers may still hold (a replaced index table, a renewed
/// tombstone filter) once they are gone: through crossbeam-epoch, or, under loom (which does
/// not model the epoch), in a graveyard freed with the owner.
pub(crate) struct Retirer<T> {
    #[cfg(thunder_loom)]
    graveyard: Mutex<Vec<usize>>,
    _boxes: std::marker::PhantomData<fn(Box<T>)>,
}

/// A retired box on its way to the epoch's deferred drop.
#[cfg(not(thunder_loom))]
struct RetiredBox<T>(*mut T);

// SAFETY: the pointer is owned (it came from `Box::into_raw` and is unreachable for new
// readers); moving it to the thread that runs the deferred drop moves a `Box<T>`, which is
// `Send` when `T` is.
#[cfg(not(thunder_loom))]
unsafe impl<T: Send> Send for RetiredBox<T> {}

impl<T: Send + 'static> Retirer<T> {
    pub(crate) fn new() -> Self {
        Self {
            #[cfg(thunder_loom)]
            graveyard: Mutex::new(Vec::new()),
            _boxes: std::marker::PhantomData,
        }
    }

    /// Frees `old` once every guard pinned before now (such as `guard`) is gone.
    ///
    /// # Safety
    /// `old` came from `Box::into_raw`, no new reader can reach it any more, and it is
    /// retired once.
    #[cfg(not(thunder_loom))]
    pub(crate) unsafe fn retire(&self, old: *mut T, guard: &crossbeam_epoch::Guard) {
        let old = RetiredBox(old);
        // SAFETY: readers that loaded `old` hold guards pinned before now (the caller's
        // contract), and the epoch runs this only after all of those are gone.
        unsafe {
            guard.defer_unchecked(move || {
                let old = old;
                drop(Box::from_raw(old.0));
            });
        }
    }

    /// Keeps `old` until this retirer is dropped (loom models take no epoch).
    ///
    /// # Safety
    /// As the non-loom `retire`.
    #[cfg(thunder_loom)]
    pub(crate) unsafe fn retire(&self, old: *mut T, _guard: &crossbeam_epoch::Guard) {
        self.graveyard
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(old as usize);
    }
}

#[cfg(thunder_loom)]
impl<T> Drop for Retirer<T> {
    fn drop(&mut self) {
        for old in self
            .graveyard
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
        {
            // SAFETY: each came from `Box::into_raw` and was put here once, by `retire`.
            drop(unsafe { Box::from_raw(old as *mut T) });
        }
    }
}

/// Advances crossbeam-epoch (pinning and flushing this thread) until `done` holds, for up to
/// 60 s: a test that waits for something retired to be reclaimed. Other tests in the same
/// process (the plain harness runs them on threads side by side) can hold pins for a while,
/// so a fixed number of flushes is not enough; the deadline only bounds a real failure.
#[cfg(test)]
pub(crate) fn flush_epoch_until(mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() && std::time::Instant::now() < deadline {
        for _ in 0..64 {
            crossbeam_epoch::pin().flush();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
