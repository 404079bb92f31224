//! The tombstone filter in front of the tombstone map: two bits in one 64-bit word per post id
//! (a blocked Bloom filter). A clear bit proves "no tombstone", so an insert of a post that was
//! never deleted (nearly all of them) skips the map probe; a set pair only costs that probe.
//!
//! Bits are only ever set while tombstones expire, so a filter kept for good fills up with the
//! bits of expired tombstones until every insert pays the map probe (with every bit set, the
//! scale-10 load ran 2.1x slower). So trim *renews* it: once the bits set since the last renewal
//! reach twice the live tombstones (and at least [`RENEW_MIN_ADDS`]), a fresh filter is built
//! from the map and swapped in, and the old one is retired through the epoch.
//!
//! Every pointer load and store here is SeqCst, and [`TombstoneFilter::add`] and the renewal
//! each begin with a SeqCst fence. The protocol:
//! - `add` (a delete or a restored tombstone, after the tombstone is in the map): fence; if
//!   `next` is set, set its bits; set the bits of `current`.
//! - renewal (one at a time): `next = fresh`; fence; set fresh's bits for every id in the map;
//!   `current = fresh`; `next = null`; retire the old filter.
//! - check (an insert, after the fence that follows its publication): test `current`.
//!
//! Why a renewal loses no tombstone (the current filter holds every id in the map once the
//! adds that put them there have returned): take an add and where its `next` load falls in the
//! SeqCst order.
//! 1. Before the renewal published `fresh`: then the add's fence precedes the renewal's (or
//!    its load would have seen `fresh`), so the renewal's scan sees the add's map entry.
//! 2. It saw `fresh`: the add sets fresh's bits itself.
//! 3. After the renewal cleared `next`: the add's later `current` load follows the swap, so it
//!    reads `fresh` (or a newer filter) and sets that.
//!
//! The store's insert/delete pairing (see `tables.rs`) holds across a renewal: a delete's bits go
//! into every filter its loads returned, before its second fence; an insert that loads an older
//! filter than the delete set did so before the swap the delete's `current` load had seen, so
//! the insert's fence precedes the delete's second fence and the delete finds the inserted post.
//! The loom model below runs the real functions through every interleaving of the three.

use crate::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::TryLockError;

use crossbeam_epoch::Guard;

use crate::counter::StripedCount;
use crate::huge_memory::ZeroedSlice;
use crate::sync::atomic::{AtomicPtr, AtomicU64, fence};
use crate::sync::{Mutex, Retirer};

/// log2 of the words per filter: 2^18 words, 2^24 bits (2 MiB). Loom's models use two words.
#[cfg(not(thunder_loom))]
const WORDS_LOG2: u32 = 18;
#[cfg(thunder_loom)]
const WORDS_LOG2: u32 = 1;

/// Bits set (by adds) since the last renewal below which a filter is never renewed.
const RENEW_MIN_ADDS: u64 = 1 << 16;

/// The filter word of a post id and the two bits of that word its tombstone sets (a
/// multiplicative hash; ids are often sequential). Two bits in one word cost the same single
/// load as one bit and, at 200k tombstones (the feed-2d workload's deletes at full scale), let
/// about 0.1% of never-deleted posts through to the exact lookup (about 5% with one bit in a
/// 2^22-bit filter).
fn filter_bits(post_id: i64) -> (usize, u64) {
    let h = (post_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let word = (h >> (64 - WORDS_LOG2)) as usize;
    let mask = (1 << (h & 63)) | (1 << ((h >> 6) & 63));
    (word, mask)
}

/// One filter's words: 2 MiB, one huge page of its own (also the base's filter of changed
/// posts, `base/state.rs`, which is never renewed). Every insert reads a random word of
/// it, and on 4 KiB pages the first delete into each page the reads had mapped as the shared
/// zero page took a copy-on-write fault and a TLB shootdown on every other core (1.8% of two
/// writers' samples at scale 10).
pub(crate) struct Words(ZeroedSlice<AtomicU64>);

impl Words {
    pub(crate) fn new() -> Self {
        Self(ZeroedSlice::new(1usize << WORDS_LOG2))
    }

    pub(crate) fn set(&self, post_id: i64) {
        let (word, bits) = filter_bits(post_id);
        // Relaxed: what orders it is the fences around it (module docs).
        self.0[word].fetch_or(bits, Relaxed);
    }

    pub(crate) fn holds(&self, post_id: i64) -> bool {
        let (word, bits) = filter_bits(post_id);
        self.0[word].load(Relaxed) & bits == bits
    }
}

/// The tombstone filter of one store (module docs).
pub(crate) struct TombstoneFilter {
    /// The filter checks read; never null. From `Box::into_raw`.
    current: AtomicPtr<Words>,
    /// The filter a renewal is filling, or null. From `Box::into_raw`; owned by the renewal.
    next: AtomicPtr<Words>,
    /// Adds since the store was made (striped: every writer's deletes count here).
    adds: StripedCount,
    /// `adds` when the current filter was built; held while renewing (one renewal at a time).
    renewed_at: Mutex<u64>,
    /// Frees replaced filters.
    retirer: Retirer<Words>,
}

impl std::fmt::Debug for TombstoneFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TombstoneFilter")
            .field("adds", &self.adds)
            .finish_non_exhaustive()
    }
}

impl TombstoneFilter {
    pub(crate) fn new() -> Self {
        Self {
            current: AtomicPtr::new(Box::into_raw(Box::new(Words::new()))),
            next: AtomicPtr::new(std::ptr::null_mut()),
            adds: StripedCount::default(),
            renewed_at: Mutex::new(0),
            retirer: Retirer::new(),
        }
    }

    /// The filter checks read now; valid while `_guard` is pinned.
    #[inline]
    fn current<'g>(&self, _guard: &'g Guard) -> &'g Words {
        // SAFETY: `current` is never null and points to a `Words` from `Box::into_raw`; a
        // replaced filter is freed only through the epoch (`renew`), after every guard pinned
        // before the replacement is gone. `_guard` was pinned before this load, and the
        // reference lives no longer than its borrow.
        unsafe { &*self.current.load(SeqCst) }
    }

    /// False if `post_id` has no tombstone; true if it may have one (ask the map).
    #[inline]
    pub(crate) fn may_hold(&self, post_id: i64, guard: &Guard) -> bool {
        self.current(guard).holds(post_id)
    }

    /// The address of `post_id`'s word in the current filter (for a prefetch).
    #[inline]
    pub(crate) fn word_ptr(&self, post_id: i64, guard: &Guard) -> *const u8 {
        let (word, _) = filter_bits(post_id);
        (&self.current(guard).0[word] as *const AtomicU64).cast()
    }

    /// Sets `post_id`'s bits. Call after its tombstone is in the map.
    pub(crate) fn add(&self, post_id: i64, guard: &Guard) {
        // Pairs with the renewal's fence (module docs, case 1).
        fence(SeqCst);
        let next = self.next.load(SeqCst);
        if !next.is_null() {
            // SAFETY: the filter `next` names becomes `current` and is freed only after a
            // later renewal replaces it, through the epoch; `guard` was pinned before this load.
            unsafe { &*next }.set(post_id);
        }
        self.current(guard).set(post_id);
        self.adds.add(1);
    }

    /// Renews the filter if the bits set since the last renewal reach twice the `live`
    /// tombstones (and at least [`RENEW_MIN_ADDS`]); `ids` calls its argument with the id of
    /// every tombstone in the map. Returns whether it renewed. Another renewal running makes
    /// this one a no-op.
    pub(crate) fn renew_if_stale(
        &self,
        live: usize,
        ids: impl FnOnce(&mut dyn FnMut(i64)),
        guard: &Guard,
    ) -> bool {
        let mut renewed_at = match self.renewed_at.try_lock() {
            Ok(held) => held,
            // A renewal that panicked left nothing half-done that matters here: the pointers
            // are swapped or not, and the next renewal starts over.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let adds = self.adds.sum_usize() as u64;
        if adds.saturating_sub(*renewed_at) < (2 * live as u64).max(RENEW_MIN_ADDS) {
            return false;
        }
        *renewed_at = adds;
        self.renew(ids, guard);
        true
    }

    /// Builds a fresh filter from `ids` and swaps it in (module docs). The caller holds
    /// `renewed_at`.
    fn renew(&self, ids: impl FnOnce(&mut dyn FnMut(i64)), guard: &Guard) {
        let fresh = Box::into_raw(Box::new(Words::new()));
        self.next.store(fresh, SeqCst);
        // Pairs with the fence in `add` (module docs, case 1).
        fence(SeqCst);
        // SAFETY: `fresh` is ours until retired below; adds only set its bits.
        let filling = unsafe { &*fresh };
        ids(&mut |id| filling.set(id));
        let old = self.current.swap(fresh, SeqCst);
        self.next.store(std::ptr::null_mut(), SeqCst);
        // SAFETY: `old` came from `Box::into_raw`; the swap made it unreachable for new
        // checks and adds, and only this renewal (one at a time) retires it.
        unsafe { self.retirer.retire(old, guard) };
    }
}

impl Drop for TombstoneFilter {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader or renewal is left; `current` came from
        // `Box::into_raw` and `next` is null outside a renewal.
        drop(unsafe { Box::from_raw(self.current.load(Relaxed)) });
    }
}

#[cfg(all(test, not(thunder_loom)))]
mod tests {
    use super::*;

    /// The filter lets few never-deleted ids through at the full-scale tombstone count, for
    /// sequential ids (as snowflake-like ids mostly are) and for scattered ones.
    #[test]
    fn the_tombstone_filter_passes_few_ids_that_were_never_deleted() {
        let filter = Words::new();
        assert!(
            filter.0.is_mapped(),
            "the filter has a huge page of its own"
        );
        let tombstones = 200_000i64;
        // Every 100th id of a sequential range is deleted (1% of posts, as in feed-2d).
        for id in (0..tombstones).map(|i| 1_000_000_000 + i * 100) {
            filter.set(id);
        }
        let passes = |ids: &mut dyn Iterator<Item = i64>| {
            let (mut passed, mut total) = (0usize, 0usize);
            for id in ids {
                passed += usize::from(filter.holds(id));
                total += 1;
            }
            passed as f64 / total as f64
        };
        for i in 0..tombstones {
            assert!(
                filter.holds(1_000_000_000 + i * 100),
                "a tombstoned id must pass"
            );
        }
        let sequential = passes(
            &mut (0..tombstones * 100)
                .map(|i| 1_000_000_000 + i)
                .filter(|id| id % 100 != 0),
        );
        let scattered =
            passes(&mut (1..1_000_000i64).map(|i| i.wrapping_mul(0x2545_F491_4F6C_DD1D)));
        assert!(sequential < 0.005, "sequential ids: {sequential}");
        assert!(scattered < 0.005, "scattered ids: {scattered}");
    }

    /// Share of `ids` the filter lets through.
    fn passed(filter: &TombstoneFilter, ids: impl Iterator<Item = i64>, guard: &Guard) -> f64 {
        let (mut passed, mut total) = (0usize, 0usize);
        for id in ids {
            passed += usize::from(filter.may_hold(id, guard));
            total += 1;
        }
        passed as f64 / total as f64
    }

    #[test]
    fn a_renewal_keeps_the_live_ids_and_drops_the_expired_ones() {
        let filter = TombstoneFilter::new();
        let guard = crossbeam_epoch::pin();
        // Eight "days" of 400k deletes each, two days live at a time (as after each trim).
        let day = 400_000i64;
        let mut renewals = 0;
        for d in 0..8 {
            for id in d * day..(d + 1) * day {
                filter.add(id, &guard);
            }
            let live = (d - 1).max(0) * day..(d + 1) * day;
            renewals += usize::from(filter.renew_if_stale(
                (live.end - live.start) as usize,
                |set| live.clone().for_each(set),
                &guard,
            ));
            for id in live.clone() {
                assert!(filter.may_hold(id, &guard), "live id {id} lost on day {d}");
            }
        }
        assert!(renewals >= 2, "{renewals} renewals");
        // The ids of days 0-5 expired: far fewer pass than the two live days' load would let
        // through if their bits had stayed (3.2M adds: about 30% of pairs set).
        let expired = passed(&filter, 0..6 * day, &guard);
        let never = passed(&filter, 100_000_000..101_000_000, &guard);
        assert!(never < 0.02, "never-deleted ids pass at {never}");
        assert!(expired < 0.02, "expired ids pass at {expired}");
    }

    #[test]
    fn a_filter_is_not_renewed_while_few_bits_are_stale() {
        let filter = TombstoneFilter::new();
        let guard = crossbeam_epoch::pin();
        for id in 0..(RENEW_MIN_ADDS as i64 - 1) {
            filter.add(id, &guard);
        }
        assert!(
            !filter.renew_if_stale(0, |_| {}, &guard),
            "under the minimum"
        );
        filter.add(-1, &guard);
        let live = RENEW_MIN_ADDS as usize;
        assert!(
            !filter.renew_if_stale(live, |_| {}, &guard),
            "under twice the live ones"
        );
        assert!(filter.renew_if_stale(0, |_| {}, &guard));
        assert!(
            !filter.may_hold(-1, &guard),
            "a renewal from an empty map clears the filter"
        );
    }

    /// Adds racing renewals on other threads: every id added is held once the adds and the
    /// renewals are done, the renewals' scans reading the "map" (the ids added so far).
    #[test]
    fn adds_racing_renewals_lose_no_id() {
        use std::sync::atomic::AtomicI64;
        let filter = TombstoneFilter::new();
        let added = AtomicI64::new(0);
        let total = 300_000i64;
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for id in 0..total {
                    let guard = crossbeam_epoch::pin();
                    // The map first (here: the count of ids added), then the filter.
                    added.store(id + 1, SeqCst);
                    filter.add(id, &guard);
                }
            });
            scope.spawn(|| {
                let mut renewals = 0;
                while added.load(SeqCst) < total || renewals == 0 {
                    let guard = crossbeam_epoch::pin();
                    let _lock = filter.renewed_at.lock().unwrap();
                    filter.renew(|set| (0..added.load(SeqCst)).for_each(set), &guard);
                    renewals += 1;
                }
            });
        });
        let guard = crossbeam_epoch::pin();
        let lost: Vec<i64> = (0..total)
            .filter(|&id| !filter.may_hold(id, &guard))
            .collect();
        assert!(
            lost.is_empty(),
            "{} ids lost, first {:?}",
            lost.len(),
            lost.first()
        );
    }
}

#[cfg(all(test, thunder_loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicBool;

    const ID: i64 = 7;

    fn guard() -> &'static Guard {
        // SAFETY: under loom the filter never defers anything through the guard (replaced
        // filters go to its graveyard and are freed on drop), so an unprotected guard only
        // stands in for the pin that loom does not model.
        unsafe { crossbeam_epoch::unprotected() }
    }

    /// A delete (tombstone into the "map", `add`, fence, look for the post), an insert
    /// (publish, fence, check the filter, then the map) and a renewal run at once: the delete
    /// finds the post or the insert finds the tombstone, and the filter holds the id after all.
    #[test]
    fn loom_add_check_and_renewal() {
        loom::model(|| {
            let filter = Arc::new(TombstoneFilter::new());
            let tombstone = Arc::new(AtomicBool::new(false));
            let published = Arc::new(AtomicBool::new(false));
            let delete = {
                let (filter, tombstone, published) =
                    (filter.clone(), tombstone.clone(), published.clone());
                loom::thread::spawn(move || {
                    tombstone.store(true, Relaxed);
                    filter.add(ID, guard());
                    fence(SeqCst);
                    published.load(Relaxed)
                })
            };
            let insert = {
                let (filter, tombstone, published) =
                    (filter.clone(), tombstone.clone(), published.clone());
                loom::thread::spawn(move || {
                    published.store(true, Relaxed);
                    fence(SeqCst);
                    filter.may_hold(ID, guard()) && tombstone.load(Relaxed)
                })
            };
            let renewal = {
                let (filter, tombstone) = (filter.clone(), tombstone.clone());
                loom::thread::spawn(move || {
                    let _lock = filter.renewed_at.lock().unwrap();
                    filter.renew(
                        |set| {
                            if tombstone.load(Relaxed) {
                                set(ID)
                            }
                        },
                        guard(),
                    );
                })
            };
            let delete_found_post = delete.join().unwrap();
            let insert_found_tombstone = insert.join().unwrap();
            renewal.join().unwrap();
            assert!(delete_found_post || insert_found_tombstone);
            assert!(filter.may_hold(ID, guard()));
        });
    }
}
