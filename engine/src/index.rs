//! [`TagIndex`]: a compact concurrent hash index from an `i64` key to a `u32` value (an arena
//! slot, a dense author number) that stores no key.
//!
//! Layout: 64-byte buckets of eight `AtomicU64` words, each `tag:32 | value:32` (0 = empty),
//! plus one "overflowed" bit per bucket. A key's 64-bit hash gives a 32-bit tag (never 0), its
//! home bucket (multiply-shift of the tag, so any bucket count works and a resize can rehash
//! from the tag alone) and its writer stripe (the low bits). A lookup scans the home bucket and
//! follows the chain of buckets while their overflow bit is set; every word whose tag matches is
//! a *candidate*, and the caller's `verify(value)` decides (the record a slot points to carries
//! its own `post_id`, a dense author carries its `author_id`). A candidate whose record was
//! freed and reused fails that check, so the index never returns a stale value as a hit.
//! At 8 B a word and a load between 0.57 and 0.85 it costs 9.4–14 B per key.
//!
//! Concurrency:
//! - Readers ([`TagIndex::get`], [`TagIndex::probe`]) take no lock and never wait: they pin a
//!   crossbeam-epoch guard, load the current table and read words.
//! - Writers (insert, remove) lock the key's stripe (one of `STRIPES` mutexes): two writers of
//!   one key are serialised, so a duplicate check and the claim that follows it are exact. Words
//!   are claimed and cleared by CAS, since different stripes share buckets.
//! - Growth locks every stripe (writers wait, readers do not), copies the frozen table into one
//!   1.5x larger, publishes it, and retires the old one through the epoch: readers still in it
//!   see a complete table. A writer always loads the table pointer under its stripe lock, so
//!   it writes into the newest table.
//!
//! Overflow bits are sticky until the next growth rebuilds them; removal just clears a word.

use crate::counter::StripedCount;
use crate::huge_memory::{Zeroable, ZeroedSlice};
use crate::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use crate::sync::{Mutex, Retirer};
use crossbeam_epoch::Guard;

/// Words per bucket: one 64-byte cache line.
const BUCKET_WORDS: usize = 8;
/// Writer stripes (a power of two).
#[cfg(not(thunder_loom))]
const STRIPES: usize = 1024;
#[cfg(thunder_loom)]
const STRIPES: usize = 2;
/// Grow when more than this share (in percent) of the words is in use.
const MAX_LOAD_PERCENT: usize = 85;
/// Below this many words a table checks its load after every insert (see `insert_with`).
const EXACT_LOAD_BELOW_WORDS: usize = 1 << 16;

/// One cache line of words.
#[repr(C, align(64))]
struct Bucket {
    words: [AtomicU64; BUCKET_WORDS],
}

// SAFETY: a (non-loom) bucket is eight plain `u64`s in memory; zero bytes are eight zeros,
// and it needs no drop.
unsafe impl Zeroable for Bucket {
    fn zero() -> Self {
        Self {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The buckets of a table. A large table lives on its own anonymous mapping advised
/// `MADV_HUGEPAGE` (`ZeroedSlice`): random probes into hundreds of megabytes of 4 KiB pages
/// would miss the TLB on nearly every access, and its first touches map zero pages instead of
/// the allocator's `memset` of the whole table.
type Buckets = ZeroedSlice<Bucket>;

/// One generation of the index.
struct Table {
    buckets: Buckets,
    /// Bit `b`: an insert whose chain starts at or before bucket `b` placed its word past `b`,
    /// so a lookup must go on to bucket `b + 1`.
    overflow: Box<[AtomicU64]>,
}

impl Table {
    fn with_buckets(count: usize) -> Self {
        let count = count.max(1);
        Self {
            buckets: Buckets::new(count),
            overflow: (0..count.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn words(&self) -> usize {
        self.buckets.len() * BUCKET_WORDS
    }

    fn bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>() + self.overflow.len() * 8
    }

    /// The home bucket of `tag` (multiply-shift: any bucket count, no modulo).
    #[inline]
    fn home(&self, tag: u32) -> usize {
        ((u64::from(tag) * self.buckets.len() as u64) >> 32) as usize
    }

    #[inline]
    fn next(&self, bucket: usize) -> usize {
        if bucket + 1 == self.buckets.len() {
            0
        } else {
            bucket + 1
        }
    }

    #[inline]
    fn overflowed(&self, bucket: usize) -> bool {
        // Relaxed: the bit is set before the word it covers is claimed (in program order of
        // the writer); a reader that must find that word is ordered after the claim by some
        // other synchronisation (see the module docs), which orders the bit too.
        self.overflow[bucket / 64].load(Ordering::Relaxed) & (1 << (bucket % 64)) != 0
    }

    fn mark_overflowed(&self, bucket: usize) {
        if !self.overflowed(bucket) {
            // Relaxed: see `overflowed`; the claim that follows is a Release CAS.
            self.overflow[bucket / 64].fetch_or(1 << (bucket % 64), Ordering::Relaxed);
        }
    }

    /// Calls `f(bucket, word index, word)` on every word of `tag`'s chain, in order, until it
    /// returns `Some`.
    #[inline]
    fn scan<R>(&self, tag: u32, mut f: impl FnMut(usize, usize, u64) -> Option<R>) -> Option<R> {
        let mut bucket = self.home(tag);
        for _ in 0..self.buckets.len() {
            for (i, word) in self.buckets[bucket].words.iter().enumerate() {
                // Acquire pairs with the Release CAS that claimed the word: the record the value
                // names was published before it (the caller's `verify` reads it).
                let w = word.load(Ordering::Acquire);
                if let Some(r) = f(bucket, i, w) {
                    return Some(r);
                }
            }
            if !self.overflowed(bucket) {
                return None;
            }
            bucket = self.next(bucket);
        }
        None
    }

    /// Places `word` into the first free word at or after `tag`'s home bucket, marking the
    /// buckets it passes. Only for a table no one else writes (growth).
    fn place_unshared(&self, tag: u32, word: u64) {
        let mut bucket = self.home(tag);
        loop {
            for w in &self.buckets[bucket].words {
                if w.load(Ordering::Relaxed) == 0 {
                    w.store(word, Ordering::Relaxed);
                    return;
                }
            }
            self.mark_overflowed(bucket);
            bucket = self.next(bucket);
        }
    }
}

/// A key's hash, split into what the index uses.
#[derive(Clone, Copy, Debug)]
pub struct Hashed {
    tag: u32,
    stripe: usize,
}

fn word_of(tag: u32, value: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(value)
}

fn tag_of(word: u64) -> u32 {
    (word >> 32) as u32
}

fn value_of(word: u64) -> u32 {
    word as u32
}

/// The key-less concurrent index (see the module docs).
pub struct TagIndex {
    table: AtomicPtr<Table>,
    stripes: Box<[Mutex<()>]>,
    /// Keys stored (approximate between a claim and its count), striped: every post insert
    /// counts here, from every writer.
    len: StripedCount,
    /// Serialises growth.
    grow_lock: Mutex<()>,
    seed: u64,
    /// Frees replaced tables.
    retirer: Retirer<Table>,
}

impl std::fmt::Debug for TagIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TagIndex")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl TagIndex {
    /// An empty index with room for about `capacity` keys before its first growth.
    pub fn with_capacity(capacity: usize) -> Self {
        let buckets = (capacity * 100 / MAX_LOAD_PERCENT).div_ceil(BUCKET_WORDS);
        // Seeded per index, so crafted ids cannot aim at one chain across stores; fixed under
        // loom, whose models must run the same way every time.
        #[cfg(not(thunder_loom))]
        let seed = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            0x0074_6875_6e64_6572_u64,
        );
        #[cfg(thunder_loom)]
        let seed = 0x0074_6875_6e64_6572_u64;
        Self {
            table: AtomicPtr::new(Box::into_raw(Box::new(Table::with_buckets(buckets)))),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            len: StripedCount::default(),
            grow_lock: Mutex::new(()),
            seed,
            retirer: Retirer::new(),
        }
    }

    /// Splits `key`'s hash (a seeded 64-bit finaliser: ids are often sequential).
    #[inline]
    pub fn hash(&self, key: i64) -> Hashed {
        let mut h = (key as u64) ^ self.seed;
        h = (h ^ (h >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        h = (h ^ (h >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        h ^= h >> 32;
        let tag = (h >> 32) as u32;
        Hashed {
            tag: if tag == 0 { 1 } else { tag },
            stripe: h as usize & (STRIPES - 1),
        }
    }

    /// The current table. The guard keeps it alive: a replaced table is freed only after
    /// every guard pinned before the replacement is gone.
    #[inline]
    fn current<'g>(&self, _guard: &'g Guard) -> &'g Table {
        // Acquire pairs with the Release store in `grow` (and the initial publication): the
        // table's words and bits are visible.
        let table = self.table.load(Ordering::Acquire);
        // SAFETY: `table` came from `Box::into_raw` and is freed only by `grow` through
        // `defer_unchecked` on an epoch guard (after every guard pinned before it was replaced,
        // `_guard` included, is gone) or on drop (no borrow of `self` left).
        unsafe { &*table }
    }

    /// Address of `hashed`'s home bucket in the current table, for prefetching.
    #[inline]
    pub fn bucket_ptr(&self, hashed: Hashed, guard: &Guard) -> *const u8 {
        let table = self.current(guard);
        (&table.buckets[table.home(hashed.tag)] as *const Bucket).cast()
    }

    /// The first candidate value of `hashed` (a word with its tag), unverified. For batched
    /// lookups: prefetch what it names, then confirm with `verify`, and fall back to
    /// [`TagIndex::get`] when the candidate fails.
    #[inline]
    pub fn probe(&self, hashed: Hashed, guard: &Guard) -> Option<u32> {
        self.current(guard).scan(hashed.tag, |_, _, w| {
            (tag_of(w) == hashed.tag).then(|| value_of(w))
        })
    }

    /// The first value of `hashed` that `verify` accepts, with what it returned.
    #[inline]
    pub fn get<R>(
        &self,
        hashed: Hashed,
        guard: &Guard,
        mut verify: impl FnMut(u32) -> Option<R>,
    ) -> Option<R> {
        self.current(guard).scan(hashed.tag, |_, _, w| {
            if tag_of(w) == hashed.tag {
                verify(value_of(w))
            } else {
                None
            }
        })
    }

    /// As [`TagIndex::get`], under the key's writer lock: ordered with the key's inserts and
    /// removals by that lock, and always in the newest table.
    pub fn get_locked<R>(
        &self,
        hashed: Hashed,
        guard: &Guard,
        verify: impl FnMut(u32) -> Option<R>,
    ) -> Option<R> {
        let _stripe = self.lock_stripe(hashed);
        self.get(hashed, guard, verify)
    }

    fn lock_stripe(&self, hashed: Hashed) -> crate::sync::MutexGuard<'_, ()> {
        self.stripes[hashed.stripe]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a value for `hashed` unless a value of it already passes `is_present` (then
    /// `Err(Some(that value))`). `make` gives the value; it runs under the key's writer lock, at
    /// most once, and may refuse (`None`: nothing stored, `Err(None)`).
    pub fn insert_with(
        &self,
        hashed: Hashed,
        guard: &Guard,
        mut is_present: impl FnMut(u32) -> bool,
        make: impl FnOnce() -> Option<u32>,
    ) -> Result<u32, Option<u32>> {
        let tag = hashed.tag;
        let mut make = Some(make);
        let mut made = None;
        loop {
            let stripe = self.lock_stripe(hashed);
            // Under the stripe lock the table cannot be replaced (growth holds every stripe).
            let table = self.current(guard);
            let present = table.scan(tag, |_, _, w| {
                (tag_of(w) == tag && is_present(value_of(w))).then(|| value_of(w))
            });
            if present.is_some() {
                return Err(present);
            }
            let value = match made.or_else(|| make.take().and_then(|make| make())) {
                Some(value) => value,
                None => return Err(None),
            };
            made = Some(value);
            if Self::claim(table, tag, word_of(tag, value)) {
                drop(stripe);
                // Summing the stripes reads other writers' lines, so a big table checks its
                // load every 64th insert of a thread: at most 64 x the stripes (512) keys late,
                // under 1% of the load of a table of `EXACT_LOAD_BELOW_WORDS` or more.
                let thread_count = self.len.add(1);
                if (table.words() < EXACT_LOAD_BELOW_WORDS || thread_count % 64 == 0)
                    && self.len.sum_usize() * 100 > table.words() * MAX_LOAD_PERCENT
                {
                    self.grow(table, false, guard);
                }
                return Ok(value);
            }
            // Only if the load check was outrun and every word is taken: grow, then look again
            // (another writer of this key may have come in meanwhile).
            drop(stripe);
            self.grow(table, true, guard);
        }
    }

    /// Claims the first free word from `tag`'s home bucket on for `word`, marking the full
    /// buckets it passes; false if every word is taken.
    fn claim(table: &Table, tag: u32, word: u64) -> bool {
        let mut bucket = table.home(tag);
        for _ in 0..table.buckets.len() {
            for w in &table.buckets[bucket].words {
                if w.load(Ordering::Relaxed) != 0 {
                    continue;
                }
                // Release pairs with the Acquire word loads of readers (`scan`): the record the
                // value names, and the overflow bits set on the way here, happen before the
                // claim. Relaxed on failure: another stripe took the word; move on.
                if w.compare_exchange(0, word, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
                {
                    return true;
                }
            }
            // Every word of this bucket is taken: the key's chain goes on past it.
            table.mark_overflowed(bucket);
            bucket = table.next(bucket);
        }
        false
    }

    /// Removes the word `hashed -> value` if present (the exact pair); true if it was.
    pub fn remove_exact(&self, hashed: Hashed, value: u32, guard: &Guard) -> bool {
        self.remove_where(hashed, guard, |v| v == value).is_some()
    }

    /// Removes the first word of `hashed` whose value passes `verify`; returns that value.
    pub fn remove_where(
        &self,
        hashed: Hashed,
        guard: &Guard,
        mut verify: impl FnMut(u32) -> bool,
    ) -> Option<u32> {
        let _stripe = self.lock_stripe(hashed);
        let table = self.current(guard);
        let removed = table.scan(hashed.tag, |bucket, i, w| {
            if tag_of(w) != hashed.tag || !verify(value_of(w)) {
                return None;
            }
            // Relaxed: clearing publishes nothing; a reader that still sees the word verifies
            // the record it names. A CAS, not a store: an insert of another stripe may own the
            // neighbouring words, never this one (it only claims empty words).
            table.buckets[bucket].words[i]
                .compare_exchange(w, 0, Ordering::Relaxed, Ordering::Relaxed)
                .ok()
                .map(|_| value_of(w))
        });
        if removed.is_some() {
            self.len.add(-1);
        }
        removed
    }

    /// Bytes of the current table.
    pub fn bytes(&self, guard: &Guard) -> usize {
        self.current(guard).bytes()
    }

    /// Grows the table at once to hold about `capacity` keys below the growth load, so that
    /// many inserts (a snapshot load) never stop to rehash. Nothing if it is that large already.
    pub fn reserve(&self, capacity: usize, guard: &Guard) {
        let buckets = (capacity * 100 / MAX_LOAD_PERCENT).div_ceil(BUCKET_WORDS);
        let _growing = self
            .grow_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seen = self.current(guard);
        if seen.buckets.len() < buckets {
            self.replace(seen, buckets, guard);
        }
    }

    /// Replaces `seen` by a table 1.5x larger, unless it was replaced already. `wait`: wait
    /// for a concurrent grower rather than leave the growth to it.
    fn grow(&self, seen: &Table, wait: bool, guard: &Guard) {
        let _growing = if wait {
            self.grow_lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        } else {
            match self.grow_lock.try_lock() {
                Ok(growing) => growing,
                // Someone else is growing: our key is in and they see the load.
                Err(_) => return,
            }
        };
        self.replace(
            seen,
            seen.buckets.len() + seen.buckets.len().div_ceil(2),
            guard,
        );
    }

    /// Under the grow lock: replaces `seen` by a table of `buckets` buckets holding the same
    /// words, unless it was replaced already.
    fn replace(&self, seen: &Table, buckets: usize, guard: &Guard) {
        let _frozen: Vec<_> = self
            .stripes
            .iter()
            .map(|s| s.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
            .collect();
        let old = self.current(guard);
        if !std::ptr::eq(old, seen) {
            return;
        }
        let new = Table::with_buckets(buckets);
        for bucket in old.buckets.iter() {
            for w in &bucket.words {
                // Relaxed: every writer is locked out, and their writes happen before our
                // stripe locks were taken.
                let w = w.load(Ordering::Relaxed);
                if w != 0 {
                    new.place_unshared(tag_of(w), w);
                }
            }
        }
        // Release pairs with the Acquire load in `current`: a reader of the new table sees
        // every word placed above. (Acquire half unused.)
        let old_ptr = self
            .table
            .swap(Box::into_raw(Box::new(new)), Ordering::AcqRel);
        // SAFETY: `old_ptr` came from `Box::into_raw` and the swap above made it unreachable
        // for new readers; it is retired here once.
        unsafe { self.retirer.retire(old_ptr, guard) };
    }
}

impl Drop for TagIndex {
    fn drop(&mut self) {
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: `&mut self`: no reader or writer is left; the table came from `Box::into_raw`
        // and is freed only here (replaced ones were handed to `retire`).
        drop(unsafe { Box::from_raw(table) });
    }
}

#[cfg(all(test, not(thunder_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    /// The tests' "records": value `v` holds key `v`, so `verify` is a comparison.
    fn holds(key: i64) -> impl FnMut(u32) -> Option<u32> {
        move |v| (i64::from(v) == key).then_some(v)
    }

    fn insert(index: &TagIndex, key: i64, guard: &Guard) -> Result<u32, Option<u32>> {
        index.insert_with(
            index.hash(key),
            guard,
            |v| i64::from(v) == key,
            || Some(key as u32),
        )
    }

    #[test]
    fn grows_from_one_bucket_and_keeps_every_key() {
        let index = TagIndex::with_capacity(1);
        let guard = crossbeam_epoch::pin();
        let first_bytes = index.bytes(&guard);
        for key in 0..20_000 {
            assert_eq!(insert(&index, key, &guard), Ok(key as u32));
        }
        assert!(index.bytes(&guard) > 100 * first_bytes, "it grew");
        // At most 16 bytes per key, slack included.
        assert!(
            index.bytes(&guard) <= 16 * 20_000,
            "{} bytes",
            index.bytes(&guard)
        );
        for key in 0..20_000 {
            assert_eq!(
                index.get(index.hash(key), &guard, holds(key)),
                Some(key as u32)
            );
        }
        assert_eq!(index.get(index.hash(20_001), &guard, holds(20_001)), None);
    }

    #[test]
    fn reserve_sizes_the_table_once_and_keeps_every_key() {
        let index = TagIndex::with_capacity(1);
        let guard = crossbeam_epoch::pin();
        for key in 0..100 {
            insert(&index, key, &guard).expect("new key");
        }
        index.reserve(20_000, &guard);
        let reserved = index.bytes(&guard);
        assert!(reserved >= 20_000 * 8, "{reserved} bytes");
        for key in 100..20_000 {
            assert_eq!(insert(&index, key, &guard), Ok(key as u32));
        }
        assert_eq!(index.bytes(&guard), reserved, "it grew after reserving");
        for key in 0..20_000 {
            assert_eq!(
                index.get(index.hash(key), &guard, holds(key)),
                Some(key as u32)
            );
        }
        // Reserving less than it holds changes nothing.
        index.reserve(10, &guard);
        assert_eq!(index.bytes(&guard), reserved);
    }

    /// A table of at least `HUGE_BYTES` sits on its own mapping, reads as zeroed words, keeps
    /// every key through a growth out of it and into another one, and is unmapped on drop.
    #[test]
    fn large_tables_are_mapped_and_keep_every_key() {
        let index = TagIndex::with_capacity(1);
        let guard = crossbeam_epoch::pin();
        let keys = 600_000i64;
        index.reserve(keys as usize / 2, &guard);
        assert!(index.current(&guard).buckets.is_mapped());
        for key in 0..keys {
            assert_eq!(insert(&index, key, &guard), Ok(key as u32));
        }
        // It grew (from one mapped table into another) on the way.
        assert!(index.bytes(&guard) >= keys as usize * 8);
        assert!(index.current(&guard).buckets.is_mapped());
        for key in 0..keys {
            assert_eq!(
                index.get(index.hash(key), &guard, holds(key)),
                Some(key as u32)
            );
        }
        assert_eq!(index.get(index.hash(keys), &guard, holds(keys)), None);
        let small = TagIndex::with_capacity(16);
        assert!(!small.current(&guard).buckets.is_mapped());
    }

    #[test]
    fn a_duplicate_returns_the_stored_value_and_make_does_not_run() {
        let index = TagIndex::with_capacity(16);
        let guard = crossbeam_epoch::pin();
        assert_eq!(insert(&index, 7, &guard), Ok(7));
        let again = index.insert_with(index.hash(7), &guard, |v| v == 7, || panic!("made twice"));
        assert_eq!(again, Err(Some(7)));
        // A refusing `make` stores nothing.
        assert_eq!(
            index.insert_with(index.hash(8), &guard, |_| true, || None),
            Err(None)
        );
        assert_eq!(index.get(index.hash(8), &guard, holds(8)), None);
    }

    #[test]
    fn removals_leave_overflowed_chains_readable() {
        // One bucket's worth of room: later keys overflow into neighbours, then growth.
        let index = TagIndex::with_capacity(8);
        let guard = crossbeam_epoch::pin();
        for key in 0..2_000 {
            insert(&index, key, &guard).unwrap();
        }
        for key in (0..2_000).step_by(2) {
            assert!(index.remove_exact(index.hash(key), key as u32, &guard));
            assert!(!index.remove_exact(index.hash(key), key as u32, &guard));
        }
        for key in (1..2_000).step_by(4) {
            let removed = index.remove_where(index.hash(key), &guard, |v| i64::from(v) == key);
            assert_eq!(removed, Some(key as u32));
        }
        for key in 0..2_000 {
            let kept = key % 4 == 3;
            let found = index.get(index.hash(key), &guard, holds(key));
            assert_eq!(found.is_some(), kept, "key {key}");
        }
        // Freed words are reused.
        for key in (0..2_000).step_by(2) {
            insert(&index, key, &guard).unwrap();
            assert_eq!(
                index.get(index.hash(key), &guard, holds(key)),
                Some(key as u32)
            );
        }
    }

    /// Two writers insert and remove while a reader checks that every key a writer reported
    /// inserted (and did not remove) is found, through many growths.
    #[test]
    fn readers_find_published_keys_while_writers_grow_the_index() {
        const KEYS: i64 = 30_000;
        let index = TagIndex::with_capacity(8);
        let done = [AtomicI64::new(-1), AtomicI64::new(-1)];
        std::thread::scope(|scope| {
            for (w, done) in done.iter().enumerate() {
                let index = &index;
                scope.spawn(move || {
                    for n in 0..KEYS {
                        let key = n * 2 + w as i64;
                        let guard = crossbeam_epoch::pin();
                        insert(index, key, &guard).unwrap();
                        if n % 3 == 0 {
                            assert!(index.remove_exact(index.hash(key), key as u32, &guard));
                        }
                        // Release: a reader that sees `n` sees the insert and the removal.
                        done.store(n, Ordering::Release);
                    }
                });
            }
            let (index, done) = (&index, &done);
            scope.spawn(move || {
                let mut checked = 0;
                loop {
                    // Acquire pairs with the writers' Release stores.
                    let upto = [0, 1].map(|w| done[w].load(Ordering::Acquire));
                    let guard = crossbeam_epoch::pin();
                    for (w, &upto) in upto.iter().enumerate() {
                        for n in (0..=upto).rev().take(200) {
                            let key = n * 2 + w as i64;
                            let found = index.get(index.hash(key), &guard, holds(key));
                            assert_eq!(found.is_some(), n % 3 != 0, "key {key}");
                            checked += 1;
                        }
                    }
                    if upto.iter().all(|&n| n == KEYS - 1) {
                        break;
                    }
                }
                assert!(checked > 0);
            });
        });
    }
}

/// Loom models of the index: concurrent insert / remove / lookup across a growth. A one-bucket
/// index holding six keys grows when a seventh comes in.
#[cfg(all(test, thunder_loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    fn guard() -> &'static Guard {
        // SAFETY: under loom the index never defers anything through the guard (replaced
        // tables go to its graveyard and are freed on drop), so an unprotected guard only
        // stands in for the pin that loom does not model.
        unsafe { crossbeam_epoch::unprotected() }
    }

    fn insert(index: &TagIndex, key: i64) -> Result<u32, Option<u32>> {
        index.insert_with(
            index.hash(key),
            guard(),
            |v| i64::from(v) == key,
            || Some(key as u32),
        )
    }

    fn found(index: &TagIndex, key: i64) -> bool {
        index
            .get(index.hash(key), guard(), |v| {
                (i64::from(v) == key).then_some(())
            })
            .is_some()
    }

    fn six_keys() -> Arc<TagIndex> {
        let index = Arc::new(TagIndex::with_capacity(6));
        for key in 1..=6 {
            insert(&index, key).unwrap();
        }
        index
    }

    /// Two writers of one key: exactly one stores it.
    #[test]
    fn loom_one_of_two_inserts_of_a_key_wins() {
        loom::model(|| {
            let index = Arc::new(TagIndex::with_capacity(6));
            let other = {
                let index = Arc::clone(&index);
                thread::spawn(move || insert(&index, 9))
            };
            let mine = insert(&index, 9);
            let theirs = other.join().unwrap();
            assert_eq!(usize::from(mine.is_ok()) + usize::from(theirs.is_ok()), 1);
            assert!(found(&index, 9));
        });
    }

    /// A reader racing an insert that grows the table always finds the keys stored before.
    #[test]
    fn loom_lookup_racing_growth() {
        loom::model(|| {
            let index = six_keys();
            let reader = {
                let index = Arc::clone(&index);
                thread::spawn(move || (found(&index, 1), found(&index, 6)))
            };
            insert(&index, 7).unwrap();
            assert!(found(&index, 7));
            assert_eq!(reader.join().unwrap(), (true, true));
            for key in 1..=7 {
                assert!(found(&index, key), "key {key}");
            }
        });
    }

    /// An insert racing a reserve: both the old keys and the new one are found after.
    #[test]
    fn loom_insert_racing_reserve() {
        loom::model(|| {
            let index = six_keys();
            let reserver = {
                let index = Arc::clone(&index);
                thread::spawn(move || index.reserve(40, guard()))
            };
            insert(&index, 7).unwrap();
            reserver.join().unwrap();
            for key in 1..=7 {
                assert!(found(&index, key), "key {key}");
            }
        });
    }

    /// A removal and an insert of another key racing a growth: neither is lost.
    #[test]
    fn loom_remove_racing_insert_and_growth() {
        loom::model(|| {
            let index = six_keys();
            let remover = {
                let index = Arc::clone(&index);
                thread::spawn(move || {
                    let removed = index.remove_exact(index.hash(2), 2, guard());
                    (removed, found(&index, 1))
                })
            };
            insert(&index, 7).unwrap();
            assert_eq!(remover.join().unwrap(), (true, true));
            assert!(!found(&index, 2));
            for key in [1, 3, 4, 5, 6, 7] {
                assert!(found(&index, key), "key {key}");
            }
        });
    }
}
