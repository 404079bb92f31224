//! The slab arena: fixed-size, cache-line-sized [`CompactPost`] slots in 2 MiB chunks.
//!
//! A slot is addressed by a [`SlotId`] (`u32`). Chunks are allocated as the store grows and are
//! never returned to the system; freed slots go back to a lock-free free list, but only after a
//! crossbeam-epoch grace period, so a reader that could still hold the id of a freed slot never
//! sees it rewritten under its feet while it is pinned.
//!
//! Every slot carries a `meta` word: a sequence number that changes whenever the slot is
//! published or freed, the `LIVE` bit, which timelines hold the post, and the post's flags.
//! Readers validate a read seqlock-style: `meta` before and after the field loads must carry the
//! same sequence, the slot must be live and hold the expected `post_id`. That makes a read
//! correct even for a reader that reached a slot after it was freed and reused.
//!
//! That protocol lives in `impl Slot` (`publish`, `read`, `free_if`, `release`, `hold`), written
//! against the `crate::sync` atomics; `loom_tests` models it.

use crate::post::LightPost;
use crate::sync::atomic::{AtomicI64, AtomicPtr, AtomicU32, AtomicUsize, Ordering, fence};
use crossbeam_epoch::Guard;
use crossbeam_queue::SegQueue;
use std::alloc::{Layout, alloc_zeroed};
use std::sync::Arc;

/// Index of a slot in the arena.
pub(crate) type SlotId = u32;

/// log2 of the slots per chunk: 32768 slots of 64 bytes = one 2 MiB huge page.
const CHUNK_SHIFT: u32 = 15;
const CHUNK_SLOTS: usize = 1 << CHUNK_SHIFT;
const CHUNK_BYTES: usize = CHUNK_SLOTS * std::mem::size_of::<Slot>();
/// Enough chunks for every `u32` slot id but the last (kept free as a sentinel).
const MAX_CHUNKS: usize = 1 << (32 - CHUNK_SHIFT);

/// `meta` bit: the slot holds a published post.
const LIVE: u32 = 1 << 0;
/// `meta` bit: the post's primary timeline (originals or secondary) holds it.
pub(crate) const IN_PRIMARY: u32 = 1 << 1;
/// `meta` bit: the post's videos timeline holds it.
pub(crate) const IN_VIDEO: u32 = 1 << 2;
const HOLDERS: u32 = IN_PRIMARY | IN_VIDEO;
const IS_RETWEET: u32 = 1 << 3;
const IS_REPLY: u32 = 1 << 4;
const HAS_VIDEO: u32 = 1 << 5;
/// The sequence number lives above the flag byte.
const SEQ_SHIFT: u32 = 8;
const SEQ_ONE: u32 = 1 << SEQ_SHIFT;

/// A post as stored: the 11 `LightPost` fields, optional ids as 0, in one 64-byte line.
#[repr(C, align(64))]
struct Slot {
    meta: AtomicU32,
    created_at: AtomicU32,
    post_id: AtomicI64,
    author_id: AtomicI64,
    in_reply_to_post_id: AtomicI64,
    in_reply_to_user_id: AtomicI64,
    source_post_id: AtomicI64,
    source_user_id: AtomicI64,
    conversation_id: AtomicI64,
}

// Loom's atomics are larger; the layout only matters (and only holds) for the real ones.
#[cfg(not(thunder_loom))]
const _: () = assert!(std::mem::size_of::<Slot>() == 64);

/// A consistent copy of one stored post (the reference's `CompactPost`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CompactPost {
    pub post_id: i64,
    pub author_id: i64,
    pub created_at: u32,
    pub in_reply_to_post_id: i64,
    pub in_reply_to_user_id: i64,
    pub source_post_id: i64,
    pub source_user_id: i64,
    pub conversation_id: i64,
    pub is_retweet: bool,
    pub is_reply: bool,
    pub has_video: bool,
}

fn none_if_zero(id: i64) -> Option<i64> {
    (id != 0).then_some(id)
}

impl CompactPost {
    /// Packs a post; `created_at` must already be known to fit in `u32`.
    pub fn from_light(post: &LightPost) -> Self {
        Self {
            post_id: post.post_id,
            author_id: post.author_id,
            created_at: post.created_at as u32,
            in_reply_to_post_id: post.in_reply_to_post_id.unwrap_or(0),
            in_reply_to_user_id: post.in_reply_to_user_id.unwrap_or(0),
            source_post_id: post.source_post_id.unwrap_or(0),
            source_user_id: post.source_user_id.unwrap_or(0),
            conversation_id: post.conversation_id.unwrap_or(0),
            is_retweet: post.is_retweet,
            is_reply: post.is_reply,
            has_video: post.has_video,
        }
    }

    /// Unpacks into the wire shape; stored zeros come back as `None`.
    pub fn to_light(self) -> LightPost {
        LightPost {
            post_id: self.post_id,
            author_id: self.author_id,
            created_at: i64::from(self.created_at),
            in_reply_to_post_id: none_if_zero(self.in_reply_to_post_id),
            in_reply_to_user_id: none_if_zero(self.in_reply_to_user_id),
            is_retweet: self.is_retweet,
            is_reply: self.is_reply,
            source_post_id: none_if_zero(self.source_post_id),
            source_user_id: none_if_zero(self.source_user_id),
            has_video: self.has_video,
            conversation_id: none_if_zero(self.conversation_id),
        }
    }

    /// Neither reply nor repost.
    pub fn is_original(&self) -> bool {
        !self.is_reply && !self.is_retweet
    }

    fn flag_bits(&self) -> u32 {
        (if self.is_retweet { IS_RETWEET } else { 0 })
            | (if self.is_reply { IS_REPLY } else { 0 })
            | (if self.has_video { HAS_VIDEO } else { 0 })
    }
}

/// What releasing one timeline's hold on a slot did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// Another timeline still holds the post.
    StillHeld,
    /// That was the last holder: the slot is now free and must be retired by the caller.
    Freed,
    /// The slot no longer holds that post (deleted or reused); nothing changed.
    Gone,
}

/// The slot protocol: a seqlock over one post, keyed by its `post_id` stamp. The arena only
/// maps ids to slots and recycles them; everything a reader relies on is here (and is what the
/// loom models in `loom_tests` exercise).
impl Slot {
    /// An unused slot, as a zeroed chunk holds it (the loom models cannot use zeroed memory).
    #[cfg(all(test, thunder_loom))]
    fn empty() -> Self {
        Self {
            meta: AtomicU32::new(0),
            created_at: AtomicU32::new(0),
            post_id: AtomicI64::new(0),
            author_id: AtomicI64::new(0),
            in_reply_to_post_id: AtomicI64::new(0),
            in_reply_to_user_id: AtomicI64::new(0),
            source_post_id: AtomicI64::new(0),
            source_user_id: AtomicI64::new(0),
            conversation_id: AtomicI64::new(0),
        }
    }

    /// Writes `post` into this free slot and makes it live, held by `holders`. Only the one
    /// owner of a free slot (fresh from the bump or popped off the free list) may call this.
    fn publish(&self, post: &CompactPost, holders: u32) {
        let seq = self.meta.load(Ordering::Relaxed) & !(SEQ_ONE - 1);
        // Release fence (seqlock write side), pairs with the Acquire fence in `read`: a reader
        // whose field loads see any store below also sees, when it re-loads meta, the free
        // that bumped the sequence before this reuse (it happened before this fence: in this
        // thread, or in the one that pushed the id onto the free list), so it rejects the read.
        // Without it a reader racing a reuse could return a mix of both posts (found by
        // `loom_tests`). Costs nothing on x86.
        fence(Ordering::Release);
        self.created_at.store(post.created_at, Ordering::Relaxed);
        self.post_id.store(post.post_id, Ordering::Relaxed);
        self.author_id.store(post.author_id, Ordering::Relaxed);
        self.in_reply_to_post_id
            .store(post.in_reply_to_post_id, Ordering::Relaxed);
        self.in_reply_to_user_id
            .store(post.in_reply_to_user_id, Ordering::Relaxed);
        self.source_post_id
            .store(post.source_post_id, Ordering::Relaxed);
        self.source_user_id
            .store(post.source_user_id, Ordering::Relaxed);
        self.conversation_id
            .store(post.conversation_id, Ordering::Relaxed);
        let meta = seq.wrapping_add(SEQ_ONE) | LIVE | (holders & HOLDERS) | post.flag_bits();
        // Release pairs with the Acquire load of meta in `read` (and in the CAS loops below): a
        // reader that sees this meta sees every field written above.
        self.meta.store(meta, Ordering::Release);
    }

    /// A consistent copy of the post if the slot is live and holds `post_id`; `None` if it was
    /// freed or reused before or during the read.
    #[inline]
    fn read(&self, post_id: i64) -> Option<CompactPost> {
        // Acquire pairs with the Release store of meta in `publish`.
        let before = self.meta.load(Ordering::Acquire);
        if before & LIVE == 0 || self.post_id.load(Ordering::Relaxed) != post_id {
            return None;
        }
        self.validated_fields(post_id, before)
    }

    /// A consistent copy of whatever post the slot holds, if it is live: for a scan that does
    /// not know the ids in advance. The same seqlock validation as `read`.
    fn read_live(&self) -> Option<CompactPost> {
        // Acquire pairs with the Release store of meta in `publish`.
        let before = self.meta.load(Ordering::Acquire);
        if before & LIVE == 0 {
            return None;
        }
        self.validated_fields(self.post_id.load(Ordering::Relaxed), before)
    }

    /// The fields read after `before` (an Acquire-loaded live meta), if meta still carries the
    /// same sequence afterwards.
    #[inline(always)]
    fn validated_fields(&self, post_id: i64, before: u32) -> Option<CompactPost> {
        let post = CompactPost {
            post_id,
            author_id: self.author_id.load(Ordering::Relaxed),
            created_at: self.created_at.load(Ordering::Relaxed),
            in_reply_to_post_id: self.in_reply_to_post_id.load(Ordering::Relaxed),
            in_reply_to_user_id: self.in_reply_to_user_id.load(Ordering::Relaxed),
            source_post_id: self.source_post_id.load(Ordering::Relaxed),
            source_user_id: self.source_user_id.load(Ordering::Relaxed),
            conversation_id: self.conversation_id.load(Ordering::Relaxed),
            is_retweet: before & IS_RETWEET != 0,
            is_reply: before & IS_REPLY != 0,
            has_video: before & HAS_VIDEO != 0,
        };
        // Seqlock check: the Acquire fence orders the field loads above before the re-load of
        // meta; a free or reuse in between changed the sequence.
        fence(Ordering::Acquire);
        let after = self.meta.load(Ordering::Relaxed);
        (after >> SEQ_SHIFT == before >> SEQ_SHIFT).then_some(post)
    }

    /// Atomically frees the slot if it is live, holds `post_id` and `pred(meta)` holds. True
    /// for the one caller that freed it.
    fn free_if(&self, post_id: i64, pred: impl Fn(u32) -> bool) -> bool {
        // Acquire pairs with the Release store in `publish`: the `post_id` checked below is the
        // one published with this meta (or newer).
        let mut meta = self.meta.load(Ordering::Acquire);
        loop {
            if meta & LIVE == 0 || self.post_id.load(Ordering::Relaxed) != post_id || !pred(meta) {
                return false;
            }
            let freed = (meta & !(SEQ_ONE - 1)).wrapping_add(SEQ_ONE);
            // AcqRel: Acquire as for the load above (also on failure, for the retry); Release
            // orders this thread's earlier accesses to the slot before the free, for whoever
            // reuses it.
            match self
                .meta
                .compare_exchange_weak(meta, freed, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => meta = now,
            }
        }
    }

    /// Drops one holder's bit; frees the slot with the last one.
    fn release(&self, post_id: i64, holder: u32) -> Release {
        // Acquire: as in `free_if`.
        let mut meta = self.meta.load(Ordering::Acquire);
        loop {
            if meta & LIVE == 0 || self.post_id.load(Ordering::Relaxed) != post_id {
                return Release::Gone;
            }
            let rest = meta & HOLDERS & !holder;
            let (next, outcome) = if rest == 0 {
                (
                    (meta & !(SEQ_ONE - 1)).wrapping_add(SEQ_ONE),
                    Release::Freed,
                )
            } else {
                (meta & !holder, Release::StillHeld)
            };
            // AcqRel / Acquire: see `free_if`.
            match self
                .meta
                .compare_exchange_weak(meta, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return outcome,
                Err(now) => meta = now,
            }
        }
    }

    /// Adds a holder bit to a live post; false if the post is gone or already held.
    fn hold(&self, post_id: i64, holder: u32) -> bool {
        // Acquire: as in `free_if`.
        let mut meta = self.meta.load(Ordering::Acquire);
        loop {
            if meta & LIVE == 0
                || meta & holder != 0
                || self.post_id.load(Ordering::Relaxed) != post_id
            {
                return false;
            }
            // AcqRel / Acquire: see `free_if` (the CAS also orders the holder bit with the
            // Acquire meta loads of a later `release`).
            match self.meta.compare_exchange_weak(
                meta,
                meta | holder,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => meta = now,
            }
        }
    }
}

/// The arena of post slots.
pub(crate) struct Arena {
    chunks: Box<[AtomicPtr<Slot>]>,
    /// Slots handed out so far by bumping; ids below this are in allocated chunks.
    bump: AtomicU32,
    /// Slots whose grace period has passed, ready for reuse.
    free: Arc<SegQueue<SlotId>>,
    live: AtomicUsize,
    chunk_count: AtomicUsize,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("live", &self.live.load(Ordering::Relaxed))
            .field("chunks", &self.chunk_count.load(Ordering::Relaxed))
            .finish()
    }
}

impl Arena {
    pub fn new() -> Self {
        Self {
            chunks: (0..MAX_CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            bump: AtomicU32::new(0),
            free: Arc::new(SegQueue::new()),
            live: AtomicUsize::new(0),
            chunk_count: AtomicUsize::new(0),
        }
    }

    /// Bytes reserved for slots (whole chunks).
    pub fn bytes_reserved(&self) -> usize {
        self.chunk_count.load(Ordering::Relaxed) * CHUNK_BYTES
    }

    /// Bytes of slots holding live posts.
    pub fn bytes_used(&self) -> usize {
        self.live.load(Ordering::Relaxed) * std::mem::size_of::<Slot>()
    }

    /// Number of live posts.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    fn slot(&self, id: SlotId) -> Option<&Slot> {
        let chunk = self.chunks.get((id >> CHUNK_SHIFT) as usize)?;
        // Acquire pairs with the Release CAS that installed the chunk.
        let base = chunk.load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: `base` points to a live chunk of CHUNK_SLOTS zero-initialised slots that is
        // never freed while the arena lives, and the offset is below CHUNK_SLOTS.
        Some(unsafe { &*base.add(id as usize & (CHUNK_SLOTS - 1)) })
    }

    /// Address of a slot, for prefetching.
    #[inline]
    pub fn slot_ptr(&self, id: SlotId) -> *const u8 {
        self.slot(id)
            .map_or(std::ptr::null(), |s| (s as *const Slot).cast())
    }

    fn ensure_chunk(&self, index: usize) -> Option<()> {
        let cell = self.chunks.get(index)?;
        // Acquire pairs with the Release CAS below (another writer's): its chunk is zeroed.
        if !cell.load(Ordering::Acquire).is_null() {
            return Some(());
        }
        let layout = Layout::from_size_align(CHUNK_BYTES, CHUNK_BYTES).ok()?;
        // SAFETY: the layout has non-zero size.
        let fresh = unsafe { alloc_zeroed(layout) }.cast::<Slot>();
        if fresh.is_null() {
            return None;
        }
        advise_huge_pages(fresh.cast(), CHUNK_BYTES);
        // Release publishes the zeroed chunk to readers that Acquire-load the pointer (`slot`);
        // Acquire on failure pairs with the winner's Release, whose chunk we then use.
        match cell.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.chunk_count.fetch_add(1, Ordering::Relaxed);
            }
            // SAFETY: another writer installed its chunk first; ours was never shared.
            Err(_) => unsafe { std::alloc::dealloc(fresh.cast(), layout) },
        }
        Some(())
    }

    /// Takes a free slot, or `None` when all `u32` ids are in use or memory ran out.
    fn take_slot(&self) -> Option<SlotId> {
        if let Some(id) = self.free.pop() {
            return Some(id);
        }
        let id = self.bump.fetch_add(1, Ordering::Relaxed);
        if id == u32::MAX {
            self.bump.store(u32::MAX, Ordering::Relaxed);
            return None;
        }
        self.ensure_chunk((id >> CHUNK_SHIFT) as usize)?;
        Some(id)
    }

    /// Stores `post` in a fresh slot held by the timelines in `holders`.
    pub fn publish(&self, post: &CompactPost, holders: u32) -> Option<SlotId> {
        let id = self.take_slot()?;
        self.slot(id)?.publish(post, holders);
        self.live.fetch_add(1, Ordering::Relaxed);
        Some(id)
    }

    /// Returns a slot that was published but never made reachable (no map, no timeline):
    /// nobody can hold its id, so it may be reused at once.
    pub fn unpublish_unshared(&self, id: SlotId, post_id: i64) {
        if self.free_if(id, post_id, |_| true) {
            self.free.push(id);
        }
    }

    /// Reads the post in slot `id` if it is live and is `post_id`.
    #[inline]
    pub fn read(&self, id: SlotId, post_id: i64) -> Option<CompactPost> {
        self.slot(id)?.read(post_id)
    }

    /// How many chunks a scan must visit: every slot id handed out so far lies below
    /// `scan_chunks() * CHUNK_SLOTS`.
    pub fn scan_chunks(&self) -> usize {
        let handed_out = self.bump.load(Ordering::Relaxed) as usize;
        handed_out.div_ceil(CHUNK_SLOTS).min(MAX_CHUNKS)
    }

    /// Appends a consistent copy of every post live in chunk `index` to `out` (a fuzzy scan:
    /// posts published or freed while it runs may or may not be seen, but each copy is one
    /// whole post). Needs no epoch pin: chunks are never freed while the arena lives, and
    /// every copy is validated seqlock-style like `read`.
    pub fn scan_chunk(&self, index: usize, out: &mut Vec<CompactPost>) {
        let first = index << CHUNK_SHIFT;
        for offset in 0..CHUNK_SLOTS {
            let Ok(id) = SlotId::try_from(first + offset) else {
                return;
            };
            match self.slot(id) {
                Some(slot) => out.extend(slot.read_live()),
                // The chunk is not allocated (yet): nothing is live in it.
                None => return,
            }
        }
    }

    /// Atomically frees the slot if it is live, holds `post_id` and `pred(meta)` holds.
    /// Returns true for the one caller that freed it; that caller must retire the id.
    fn free_if(&self, id: SlotId, post_id: i64, pred: impl Fn(u32) -> bool) -> bool {
        let freed = self
            .slot(id)
            .is_some_and(|slot| slot.free_if(post_id, pred));
        if freed {
            self.live.fetch_sub(1, Ordering::Relaxed);
        }
        freed
    }

    /// Frees the slot of `post_id` whoever holds it (a delete). True if this call freed it.
    pub fn free(&self, id: SlotId, post_id: i64) -> bool {
        self.free_if(id, post_id, |_| true)
    }

    /// Drops one timeline's hold (`IN_PRIMARY` or `IN_VIDEO`); frees the slot with the last one.
    pub fn release(&self, id: SlotId, post_id: i64, holder: u32) -> Release {
        let Some(slot) = self.slot(id) else {
            return Release::Gone;
        };
        let outcome = slot.release(post_id, holder);
        if outcome == Release::Freed {
            self.live.fetch_sub(1, Ordering::Relaxed);
        }
        outcome
    }

    /// Adds a holder (`IN_VIDEO`) to a live post; false if the post is gone or already held.
    pub fn hold(&self, id: SlotId, post_id: i64, holder: u32) -> bool {
        self.slot(id).is_some_and(|slot| slot.hold(post_id, holder))
    }

    /// Hands freed slots back for reuse once every reader pinned now has unpinned.
    pub fn retire(&self, ids: Vec<SlotId>, guard: &Guard) {
        if !ids.is_empty() {
            let free = Arc::clone(&self.free);
            guard.defer(move || {
                for id in ids {
                    free.push(id);
                }
            });
        }
        // Deferred work (these slots, and timeline buffers replaced during the batch) sits in
        // a thread-local bag until flushed; every write call flushes so garbage is collected
        // at the rate it is made instead of piling up behind the thread's bag.
        guard.flush();
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let Ok(layout) = Layout::from_size_align(CHUNK_BYTES, CHUNK_BYTES) else {
            return;
        };
        for chunk in self.chunks.iter() {
            let ptr = chunk.load(Ordering::Relaxed);
            if !ptr.is_null() {
                // SAFETY: the chunk was allocated in `ensure_chunk` with this layout, and
                // `&mut self` means no reader can still hold a slot reference.
                unsafe { std::alloc::dealloc(ptr.cast(), layout) };
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    // SAFETY: `ptr..ptr+len` is one allocation we own; MADV_HUGEPAGE is only a hint and does
    // not change its contents.
    unsafe {
        libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(id: i64) -> CompactPost {
        CompactPost::from_light(&LightPost {
            post_id: id,
            author_id: 7,
            created_at: 100,
            in_reply_to_post_id: Some(5),
            is_reply: true,
            has_video: true,
            ..LightPost::default()
        })
    }

    #[test]
    fn publish_read_round_trip() {
        let arena = Arena::new();
        let id = arena.publish(&post(42), IN_PRIMARY).unwrap();
        let read = arena.read(id, 42).unwrap();
        assert_eq!(read, post(42));
        assert_eq!(read.to_light().in_reply_to_post_id, Some(5));
        assert_eq!(read.to_light().source_post_id, None);
        assert!(
            arena.read(id, 43).is_none(),
            "wrong post id must not validate"
        );
        assert_eq!(arena.live(), 1);
    }

    #[test]
    fn last_holder_frees_the_slot() {
        let arena = Arena::new();
        let id = arena.publish(&post(1), IN_PRIMARY | IN_VIDEO).unwrap();
        assert_eq!(arena.release(id, 1, IN_VIDEO), Release::StillHeld);
        assert!(arena.read(id, 1).is_some());
        assert_eq!(arena.release(id, 1, IN_PRIMARY), Release::Freed);
        assert!(arena.read(id, 1).is_none());
        assert_eq!(arena.release(id, 1, IN_PRIMARY), Release::Gone);
        assert!(!arena.free(id, 1), "a freed slot cannot be freed twice");
        assert_eq!(arena.live(), 0);
    }

    #[test]
    fn reused_slot_does_not_validate_for_the_old_post() {
        let arena = Arena::new();
        let id = arena.publish(&post(1), IN_PRIMARY).unwrap();
        assert!(arena.free(id, 1));
        arena.free.push(id); // grace period over
        let again = arena.publish(&post(2), IN_PRIMARY).unwrap();
        assert_eq!(again, id, "the free list hands the slot out again");
        assert!(arena.read(id, 1).is_none());
        assert_eq!(arena.read(id, 2).unwrap().post_id, 2);
    }

    #[test]
    fn retired_slots_wait_for_pinned_readers() {
        let arena = Arena::new();
        let id = arena.publish(&post(1), IN_PRIMARY).unwrap();
        let reader = crossbeam_epoch::pin();
        assert!(arena.free(id, 1));
        arena.retire(vec![id], &crossbeam_epoch::pin());
        for _ in 0..256 {
            crossbeam_epoch::pin().flush();
        }
        assert!(
            arena.free.is_empty(),
            "slot reused while a reader was pinned"
        );
        drop(reader);
        for _ in 0..1024 {
            if !arena.free.is_empty() {
                break;
            }
            crossbeam_epoch::pin().flush();
        }
        assert_eq!(arena.free.pop(), Some(id));
    }

    #[test]
    fn scan_sees_live_posts_only() {
        let arena = Arena::new();
        let ids: Vec<SlotId> = (1..=5)
            .map(|n| arena.publish(&post(n), IN_PRIMARY).unwrap())
            .collect();
        assert!(arena.free(ids[1], 2));
        assert_eq!(arena.scan_chunks(), 1);
        let mut seen = Vec::new();
        arena.scan_chunk(0, &mut seen);
        let seen: Vec<i64> = seen.iter().map(|p| p.post_id).collect();
        assert_eq!(seen, vec![1, 3, 4, 5]);
        let mut beyond = Vec::new();
        arena.scan_chunk(1, &mut beyond);
        assert!(beyond.is_empty());
    }

    #[test]
    fn hold_adds_a_video_holder_once() {
        let arena = Arena::new();
        let id = arena.publish(&post(9), IN_PRIMARY).unwrap();
        assert!(arena.hold(id, 9, IN_VIDEO));
        assert!(!arena.hold(id, 9, IN_VIDEO));
        assert_eq!(arena.release(id, 9, IN_PRIMARY), Release::StillHeld);
        assert_eq!(arena.release(id, 9, IN_VIDEO), Release::Freed);
    }
}

/// Loom models of the slot protocol: `RUSTFLAGS="--cfg thunder_loom" cargo test --lib loom` (see
/// `crate::sync`). The epoch grace period in front of slot reuse is left out on purpose: a
/// read must validate on its own, even when it races the reuse of its slot.
#[cfg(all(test, thunder_loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Post `n`: every field and flag differs between posts 1 and 2, so a mix shows.
    fn post(n: i64) -> CompactPost {
        CompactPost {
            post_id: n,
            author_id: 10 + n,
            created_at: 100 + n as u32,
            in_reply_to_post_id: 20 + n,
            in_reply_to_user_id: 30 + n,
            source_post_id: 40 + n,
            source_user_id: 50 + n,
            conversation_id: 60 + n,
            is_retweet: n == 1,
            is_reply: n == 2,
            has_video: n == 1,
        }
    }

    /// A read of post 1 is either all of post 1 or `None`; a read of post 2 all of post 2 or
    /// `None`.
    fn check(read: Option<CompactPost>, n: i64) {
        assert!(
            read.is_none() || read == Some(post(n)),
            "read {n} returned {read:?}"
        );
    }

    /// A reader of post 1 races the delete of post 1 and the reuse of its slot for post 2
    /// by the same writer.
    #[test]
    fn loom_read_racing_free_and_reuse() {
        loom::model(|| {
            let slot = Arc::new(Slot::empty());
            slot.publish(&post(1), IN_PRIMARY);
            let reader = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || (slot.read(1), slot.read(2)))
            };
            assert!(slot.free_if(1, |_| true));
            slot.publish(&post(2), IN_PRIMARY);
            let (old, new) = reader.join().unwrap();
            check(old, 1);
            check(new, 2);
        });
    }

    /// As above, but the last holder's release frees the slot and another thread reuses it
    /// (it got the id through the free list, modelled by spawning it after the free).
    #[test]
    fn loom_read_racing_release_and_reuse_elsewhere() {
        loom::model(|| {
            let slot = Arc::new(Slot::empty());
            slot.publish(&post(1), IN_PRIMARY | IN_VIDEO);
            let reader = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || slot.read(1))
            };
            assert_eq!(slot.release(1, IN_VIDEO), Release::StillHeld);
            assert_eq!(slot.release(1, IN_PRIMARY), Release::Freed);
            let reuser = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || slot.publish(&post(2), IN_PRIMARY))
            };
            check(reader.join().unwrap(), 1);
            reuser.join().unwrap();
            assert_eq!(slot.read(2), Some(post(2)));
        });
    }

    /// A delete racing the last timeline releases: exactly one of them frees the slot.
    #[test]
    fn loom_delete_racing_release_frees_once() {
        loom::model(|| {
            let slot = Arc::new(Slot::empty());
            slot.publish(&post(1), IN_PRIMARY | IN_VIDEO);
            let deleter = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || slot.free_if(1, |_| true))
            };
            let released = [slot.release(1, IN_VIDEO), slot.release(1, IN_PRIMARY)];
            let deleted = deleter.join().unwrap();
            let frees =
                usize::from(deleted) + released.iter().filter(|r| **r == Release::Freed).count();
            assert_eq!(frees, 1, "deleted {deleted}, released {released:?}");
            assert_eq!(slot.read(1), None);
        });
    }
}
