//! A count that several writer threads change on every post and few readers sum.
//!
//! One shared atomic counter bumped per post by two writers bounces its cache line between the
//! cores on every bump; in the ingest profile with two writers the arena's bump and live
//! counters alone took most of `Arena::publish`'s samples. Here each thread adds to its own
//! stripe (a line of its own), and a read sums the stripes. The sum is exact whenever no add is
//! in flight, and otherwise off by the adds in flight, as a single counter read with `Relaxed`
//! would be.
//!
//! Under `cfg(thunder_loom)` there is one stripe, so the models see the single counter they
//! were written for.

use crate::sync::atomic::{AtomicIsize, Ordering};

/// Stripes per counter: more than the writer threads this store runs with.
#[cfg(not(thunder_loom))]
const STRIPES: usize = 8;
#[cfg(thunder_loom)]
const STRIPES: usize = 1;

/// One stripe, alone on its pair of cache lines (the adjacent-line prefetcher fetches pairs).
#[derive(Default)]
#[repr(align(128))]
struct Stripe(AtomicIsize);

/// A striped signed count (see the module docs).
pub(crate) struct StripedCount {
    stripes: [Stripe; STRIPES],
}

impl Default for StripedCount {
    fn default() -> Self {
        Self {
            stripes: std::array::from_fn(|_| Stripe::default()),
        }
    }
}

impl std::fmt::Debug for StripedCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.sum())
    }
}

impl StripedCount {
    /// Adds `n` (negative to subtract) to the calling thread's stripe and returns that
    /// stripe's new value (a cheap, thread-local clock for "every k-th add" checks).
    #[inline]
    pub fn add(&self, n: isize) -> isize {
        // Relaxed: a pure count; nothing is published through it.
        self.stripes[stripe_index()]
            .0
            .fetch_add(n, Ordering::Relaxed)
            + n
    }

    /// The count: the sum of the stripes (see the module docs for its accuracy).
    pub fn sum(&self) -> isize {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }

    /// The count, never below zero (a remove counted before its add, across stripes).
    pub fn sum_usize(&self) -> usize {
        self.sum().max(0) as usize
    }
}

/// The calling thread's stripe: threads are dealt stripes in turn as they first count.
#[inline]
fn stripe_index() -> usize {
    #[cfg(not(thunder_loom))]
    {
        use crate::sync::atomic::AtomicUsize;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
        }
        STRIPE.with(|s| *s)
    }
    #[cfg(thunder_loom)]
    {
        0
    }
}

#[cfg(all(test, not(thunder_loom)))]
mod tests {
    use super::*;

    #[test]
    fn sums_adds_from_many_threads_exactly() {
        let count = StripedCount::default();
        std::thread::scope(|scope| {
            for t in 0..12_isize {
                let count = &count;
                scope.spawn(move || {
                    for _ in 0..10_000 {
                        count.add(1);
                    }
                    // Some threads remove what others added: stripes go negative.
                    if t % 3 == 0 {
                        for _ in 0..25_000 {
                            count.add(-1);
                        }
                    }
                });
            }
        });
        assert_eq!(count.sum(), 12 * 10_000 - 4 * 25_000);
        assert_eq!(count.sum_usize(), 20_000);
    }

    #[test]
    fn add_returns_the_threads_stripe_value() {
        let count = StripedCount::default();
        assert_eq!(count.add(5), 5);
        assert_eq!(count.add(-2), 3);
        std::thread::scope(|scope| {
            scope.spawn(|| count.add(7));
        });
        assert_eq!(count.sum(), 10);
        assert!(count.sum_usize() == 10 && StripedCount::default().sum_usize() == 0);
    }
}
