//! The slab arena: [`CompactPost`] slots of two size classes in 2 MiB chunks.
//!
//! A post that carries no reply or source ids (an original: about 60% of the workload) goes in
//! a 32-byte *small* slot (`meta`, `created_at`, `post_id`, `author_id`, `conversation_id`),
//! two to a cache line; every other post in a 64-byte *large* slot, one line. A slot is
//! addressed by a [`SlotId`] (`u32`) whose top bit names the class ([`SMALL_CLASS`]); the other
//! 31 bits index the slot within its class. Each class has its own chunks, bump counter and
//! free list, so a slot is only ever reused for a post of its own class. Chunks are 2 MiB
//! aligned and slots are naturally aligned, so no slot straddles a line. Chunks are allocated
//! as the store grows and stay mapped while the arena lives; freed slots go back to their
//! class's lock-free free list, but only after a crossbeam-epoch grace period, so a reader that
//! could still hold the id of a freed slot never sees it rewritten under its feet while it is
//! pinned. A chunk whose slots are all on the free list can give its pages back to the system
//! (`release_free_chunks`, after a trim that emptied much of the store); they read as zeroes,
//! like a fresh chunk's, until a slot of it is taken again.
//!
//! Every slot carries a `meta` word: a sequence number that changes whenever the slot is
//! published or freed, the `LIVE` bit, which timelines hold the post, and the post's flags.
//! Readers validate a read seqlock-style: `meta` before and after the field loads must carry the
//! same sequence, the slot must be live and hold the expected `post_id`. That makes a read
//! correct even for a reader that reached a slot after it was freed and reused.
//!
//! That protocol is written once, in the provided methods of [`PostSlot`] (`publish`, `read`,
//! `free_if`, `release`, `hold`), against the `crate::sync` atomics; each class only says how
//! its fields are stored and loaded (all `Relaxed`: the protocol's fences and `meta` orderings
//! cover them). `loom_tests` models the protocol for both classes.

use crate::counter::StripedCount;
use crate::post::LightPost;
use crate::sync::atomic::{AtomicI64, AtomicPtr, AtomicU32, AtomicUsize, Ordering, fence};
use crossbeam_epoch::Guard;
use crossbeam_queue::SegQueue;
#[cfg(not(thunder_loom))]
use std::alloc::Layout;
use std::sync::Arc;

/// Index of a slot in the arena: [`SMALL_CLASS`] set for a small slot, then the slot's index
/// within its class.
pub(crate) type SlotId = u32;

/// The [`SlotId`] bit of the small (32-byte) class.
const SMALL_CLASS: u32 = 1 << 31;

/// The class of `slot` (0 large, 1 small) and its index within the class.
pub(crate) fn slot_class_and_index(slot: SlotId) -> (usize, u32) {
    (usize::from(slot & SMALL_CLASS != 0), slot & !SMALL_CLASS)
}
/// Slots per class: every id below the class bit.
const CLASS_SLOTS: u32 = SMALL_CLASS;
/// Bytes (and alignment) of one chunk: a 2 MiB huge page.
const CHUNK_BYTES: usize = 2 << 20;
/// log2 of the slots of a chunk under loom, for both classes: four slots, built one by one
/// (`SlotClass::new_chunk`).
#[cfg(thunder_loom)]
const LOOM_CHUNK_SHIFT: u32 = 2;
/// log2 of the slots a scan unit covers (`scan_chunk`): one large chunk, half a small one, so
/// a snapshot chunk never holds more than 32768 posts (2 MiB).
const SCAN_UNIT_SHIFT: u32 = 15;

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

/// The fields every slot class starts with (24 bytes): the protocol's `meta` word and
/// `post_id` stamp, and the two fields every post has.
#[repr(C)]
struct SlotHead {
    meta: AtomicU32,
    created_at: AtomicU32,
    post_id: AtomicI64,
    author_id: AtomicI64,
}

/// A large slot: the 11 `LightPost` fields, optional ids as 0, in one 64-byte line.
#[repr(C, align(64))]
struct Slot {
    head: SlotHead,
    in_reply_to_post_id: AtomicI64,
    in_reply_to_user_id: AtomicI64,
    source_post_id: AtomicI64,
    source_user_id: AtomicI64,
    conversation_id: AtomicI64,
}

/// A small slot, for a post whose reply and source ids are all 0 ([`CompactPost::fits_small`]):
/// half a line; the flags live in `meta` as in the large class.
#[repr(C, align(32))]
struct SmallSlot {
    head: SlotHead,
    conversation_id: AtomicI64,
}

impl SlotHead {
    /// An unused head, as a zeroed chunk holds it (loom's atomics cannot be zeroed memory).
    #[cfg(thunder_loom)]
    fn empty() -> Self {
        Self {
            meta: AtomicU32::new(0),
            created_at: AtomicU32::new(0),
            post_id: AtomicI64::new(0),
            author_id: AtomicI64::new(0),
        }
    }

    /// Stores `created_at`, `post_id` and `author_id` (`Relaxed`; `publish` orders them).
    #[inline(always)]
    fn store(&self, post: &CompactPost) {
        self.created_at.store(post.created_at, Ordering::Relaxed);
        self.post_id.store(post.post_id, Ordering::Relaxed);
        self.author_id.store(post.author_id, Ordering::Relaxed);
    }

    /// The post as far as the head knows it, flags from `meta`, the other ids 0 (`Relaxed`;
    /// `validated_fields` validates the loads).
    #[inline(always)]
    fn load(&self, post_id: i64, meta: u32) -> CompactPost {
        CompactPost {
            post_id,
            author_id: self.author_id.load(Ordering::Relaxed),
            created_at: self.created_at.load(Ordering::Relaxed),
            in_reply_to_post_id: 0,
            in_reply_to_user_id: 0,
            source_post_id: 0,
            source_user_id: 0,
            conversation_id: 0,
            is_retweet: meta & IS_RETWEET != 0,
            is_reply: meta & IS_REPLY != 0,
            has_video: meta & HAS_VIDEO != 0,
        }
    }
}

// Loom's atomics are larger; the layout only matters (and only holds) for the real ones.
#[cfg(not(thunder_loom))]
const _: () = {
    assert!(std::mem::size_of::<Slot>() == 64);
    assert!(std::mem::size_of::<SmallSlot>() == 32);
    assert!(Slot::CHUNK_SLOTS * std::mem::size_of::<Slot>() == CHUNK_BYTES);
    assert!(SmallSlot::CHUNK_SLOTS * std::mem::size_of::<SmallSlot>() == CHUNK_BYTES);
};

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

    /// True if the post fits a small slot: its reply and source ids are all 0 (`None`).
    pub fn fits_small(&self) -> bool {
        self.in_reply_to_post_id == 0
            && self.in_reply_to_user_id == 0
            && self.source_post_id == 0
            && self.source_user_id == 0
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

/// One slot class. The required methods say where `meta` and `post_id` are and how the other
/// fields are stored and loaded (plain `Relaxed` accesses); the provided methods are the slot
/// protocol, a seqlock over one post keyed by its `post_id` stamp, the same for every class.
/// The arena only maps ids to slots and recycles them within a class; everything a reader
/// relies on is here (and is what the loom models in `loom_tests` exercise, for both classes).
trait PostSlot: Sized {
    /// log2 of the slots in one chunk.
    const CHUNK_SHIFT: u32;
    /// Slots in one chunk.
    const CHUNK_SLOTS: usize = 1 << Self::CHUNK_SHIFT;

    /// The slot's first 24 bytes: `meta`, `post_id` and the fields every post has.
    fn head(&self) -> &SlotHead;
    /// Stores the fields past the head (`Relaxed`; `publish` orders them).
    fn store_tail(&self, post: &CompactPost);
    /// Loads the fields past the head into `post` (`Relaxed`; the seqlock check in
    /// `validated_fields` validates them).
    fn load_tail(&self, post: &mut CompactPost);

    /// An unused slot, as a zeroed chunk holds it (loom's atomics cannot be zeroed memory).
    #[cfg(thunder_loom)]
    fn empty() -> Self;

    /// Writes `post` into this free slot and makes it live, held by `holders`. Only the one
    /// owner of a free slot (fresh from the bump or popped off its class's free list) may call
    /// this, and only with a post of the slot's class.
    fn publish(&self, post: &CompactPost, holders: u32) {
        let seq = self.head().meta.load(Ordering::Relaxed) & !(SEQ_ONE - 1);
        // Release fence (seqlock write side), pairs with the Acquire fence in
        // `validated_fields`: a reader whose field loads see any store below also sees, when it
        // re-loads meta, the free that bumped the sequence before this reuse (it happened
        // before this fence: in this thread, or in the one that pushed the id onto the free
        // list), so it rejects the read. Without it a reader racing a reuse could return a mix
        // of both posts (found by `loom_tests`). Costs nothing on x86.
        fence(Ordering::Release);
        self.head().store(post);
        self.store_tail(post);
        let meta = seq.wrapping_add(SEQ_ONE) | LIVE | (holders & HOLDERS) | post.flag_bits();
        // Release pairs with the Acquire load of meta in `read` (and in the CAS loops below): a
        // reader that sees this meta sees every field written above.
        self.head().meta.store(meta, Ordering::Release);
    }

    /// A consistent copy of the post if the slot is live and holds `post_id`; `None` if it was
    /// freed or reused before or during the read.
    #[inline]
    fn read(&self, post_id: i64) -> Option<CompactPost> {
        // Acquire pairs with the Release store of meta in `publish`.
        let before = self.head().meta.load(Ordering::Acquire);
        if before & LIVE == 0 || self.head().post_id.load(Ordering::Relaxed) != post_id {
            return None;
        }
        self.validated_fields(post_id, before)
    }

    /// A consistent copy of whatever post the slot holds, if it is live: for a scan that does
    /// not know the ids in advance. The same seqlock validation as `read`.
    fn read_live(&self) -> Option<CompactPost> {
        // Acquire pairs with the Release store of meta in `publish`.
        let before = self.head().meta.load(Ordering::Acquire);
        if before & LIVE == 0 {
            return None;
        }
        self.validated_fields(self.head().post_id.load(Ordering::Relaxed), before)
    }

    /// The fields read after `before` (an Acquire-loaded live meta), if meta still carries the
    /// same sequence afterwards.
    #[inline(always)]
    fn validated_fields(&self, post_id: i64, before: u32) -> Option<CompactPost> {
        let mut post = self.head().load(post_id, before);
        self.load_tail(&mut post);
        // Seqlock check: the Acquire fence orders the field loads above before the re-load of
        // meta (pairs with the Release fence in `publish`); a free or reuse in between changed
        // the sequence.
        fence(Ordering::Acquire);
        let after = self.head().meta.load(Ordering::Relaxed);
        (after >> SEQ_SHIFT == before >> SEQ_SHIFT).then_some(post)
    }

    /// Atomically frees the slot if it is live, holds `post_id` and `pred(meta)` holds. True
    /// for the one caller that freed it.
    fn free_if(&self, post_id: i64, pred: impl Fn(u32) -> bool) -> bool {
        // Acquire pairs with the Release store in `publish`: the `post_id` checked below is the
        // one published with this meta (or newer).
        let mut meta = self.head().meta.load(Ordering::Acquire);
        loop {
            if meta & LIVE == 0
                || self.head().post_id.load(Ordering::Relaxed) != post_id
                || !pred(meta)
            {
                return false;
            }
            let freed = (meta & !(SEQ_ONE - 1)).wrapping_add(SEQ_ONE);
            // AcqRel: Acquire as for the load above (also on failure, for the retry); Release
            // orders this thread's earlier accesses to the slot before the free, for whoever
            // reuses it.
            match self.head().meta.compare_exchange_weak(
                meta,
                freed,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => meta = now,
            }
        }
    }

    /// Drops one holder's bit; frees the slot with the last one.
    fn release(&self, post_id: i64, holder: u32) -> Release {
        // Acquire: as in `free_if`.
        let mut meta = self.head().meta.load(Ordering::Acquire);
        loop {
            if meta & LIVE == 0 || self.head().post_id.load(Ordering::Relaxed) != post_id {
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
            match self.head().meta.compare_exchange_weak(
                meta,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return outcome,
                Err(now) => meta = now,
            }
        }
    }

    /// Adds a holder bit to a live post; false if the post is gone or already held.
    fn hold(&self, post_id: i64, holder: u32) -> bool {
        // Acquire: as in `free_if`.
        let mut meta = self.head().meta.load(Ordering::Acquire);
        loop {
            if meta & LIVE == 0
                || meta & holder != 0
                || self.head().post_id.load(Ordering::Relaxed) != post_id
            {
                return false;
            }
            // AcqRel / Acquire: see `free_if` (the CAS also orders the holder bit with the
            // Acquire meta loads of a later `release`).
            match self.head().meta.compare_exchange_weak(
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

impl PostSlot for Slot {
    /// 32768 slots of 64 bytes = one 2 MiB chunk.
    #[cfg(not(thunder_loom))]
    const CHUNK_SHIFT: u32 = 15;
    #[cfg(thunder_loom)]
    const CHUNK_SHIFT: u32 = LOOM_CHUNK_SHIFT;

    #[inline(always)]
    fn head(&self) -> &SlotHead {
        &self.head
    }

    #[inline(always)]
    fn store_tail(&self, post: &CompactPost) {
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
    }

    #[inline(always)]
    fn load_tail(&self, post: &mut CompactPost) {
        post.in_reply_to_post_id = self.in_reply_to_post_id.load(Ordering::Relaxed);
        post.in_reply_to_user_id = self.in_reply_to_user_id.load(Ordering::Relaxed);
        post.source_post_id = self.source_post_id.load(Ordering::Relaxed);
        post.source_user_id = self.source_user_id.load(Ordering::Relaxed);
        post.conversation_id = self.conversation_id.load(Ordering::Relaxed);
    }

    #[cfg(thunder_loom)]
    fn empty() -> Self {
        Self {
            head: SlotHead::empty(),
            in_reply_to_post_id: AtomicI64::new(0),
            in_reply_to_user_id: AtomicI64::new(0),
            source_post_id: AtomicI64::new(0),
            source_user_id: AtomicI64::new(0),
            conversation_id: AtomicI64::new(0),
        }
    }
}

impl PostSlot for SmallSlot {
    /// 65536 slots of 32 bytes = one 2 MiB chunk.
    #[cfg(not(thunder_loom))]
    const CHUNK_SHIFT: u32 = 16;
    #[cfg(thunder_loom)]
    const CHUNK_SHIFT: u32 = LOOM_CHUNK_SHIFT;

    #[inline(always)]
    fn head(&self) -> &SlotHead {
        &self.head
    }

    /// `post` must fit the class ([`CompactPost::fits_small`]): its reply and source ids are
    /// not stored (and load as 0).
    #[inline(always)]
    fn store_tail(&self, post: &CompactPost) {
        debug_assert!(post.fits_small());
        self.conversation_id
            .store(post.conversation_id, Ordering::Relaxed);
    }

    #[inline(always)]
    fn load_tail(&self, post: &mut CompactPost) {
        post.conversation_id = self.conversation_id.load(Ordering::Relaxed);
    }

    #[cfg(thunder_loom)]
    fn empty() -> Self {
        Self {
            head: SlotHead::empty(),
            conversation_id: AtomicI64::new(0),
        }
    }
}

/// The chunks, bump counter and free list of one slot class. Indexes here are class-local
/// (a [`SlotId`] without its class bit).
struct SlotClass<S: PostSlot> {
    chunks: Box<[AtomicPtr<S>]>,
    /// Slots handed out so far by bumping; indexes below this are in allocated chunks.
    bump: AtomicU32,
    /// Slots whose grace period has passed, ready for reuse.
    free: Arc<SegQueue<u32>>,
    live: StripedCount,
    chunk_count: AtomicUsize,
    /// Never reused in the process, so a thread's bump run (`bump_run`) cannot be mistaken
    /// for one of a later class that happens to sit at the same address.
    #[cfg(not(thunder_loom))]
    id: u64,
    /// The next chunk, made and faulted in on a background thread once the class is large.
    #[cfg(not(thunder_loom))]
    spare: Option<Arc<crate::huge_memory::Spare>>,
    /// Whether chunks are made ahead (off while a load keeps every core busy).
    #[cfg(not(thunder_loom))]
    ahead: crate::sync::atomic::AtomicBool,
    /// Per chunk: its pages were handed back to the system (`release_free_chunks`) and none of
    /// its slots has been taken since. It is not in `chunk_count` meanwhile.
    #[cfg(not(thunder_loom))]
    released: Box<[crate::sync::atomic::AtomicBool]>,
    /// Held by the one `release_free_chunks` running.
    #[cfg(not(thunder_loom))]
    releasing: crate::sync::Mutex<()>,
    /// Tests only: refuse every new chunk, as when the system has no memory left.
    #[cfg(all(test, not(thunder_loom)))]
    refuse_chunks: crate::sync::atomic::AtomicBool,
}

/// Chunks a class holds before its next chunks are made ahead on a background thread (small
/// stores, as in tests, never start it).
#[cfg(not(thunder_loom))]
const SPARE_AFTER_CHUNKS: usize = 2;

/// Fresh indexes a writer thread takes from a class's bump counter at a time.
#[cfg(not(thunder_loom))]
const BUMP_RUN_SLOTS: u32 = 32;

/// Source of [`SlotClass`] ids; 0 is never handed out (an empty run names it).
#[cfg(not(thunder_loom))]
static NEXT_CLASS_ID: crate::sync::atomic::AtomicU64 = crate::sync::atomic::AtomicU64::new(1);

impl<S: PostSlot> SlotClass<S> {
    /// Enough chunks for every index of the class.
    #[cfg(not(thunder_loom))]
    const MAX_CHUNKS: usize = (CLASS_SLOTS as usize) >> S::CHUNK_SHIFT;
    /// Under loom, two chunks of four slots: the models hold a handful of posts.
    #[cfg(thunder_loom)]
    const MAX_CHUNKS: usize = 2;

    fn new() -> Self {
        Self {
            chunks: (0..Self::MAX_CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            bump: AtomicU32::new(0),
            free: Arc::new(SegQueue::new()),
            live: StripedCount::default(),
            chunk_count: AtomicUsize::new(0),
            #[cfg(not(thunder_loom))]
            id: NEXT_CLASS_ID.fetch_add(1, crate::sync::atomic::Ordering::Relaxed),
            #[cfg(not(thunder_loom))]
            spare: Self::chunk_layout().map(crate::huge_memory::Spare::new),
            #[cfg(not(thunder_loom))]
            ahead: crate::sync::atomic::AtomicBool::new(true),
            #[cfg(not(thunder_loom))]
            released: (0..Self::MAX_CHUNKS)
                .map(|_| crate::sync::atomic::AtomicBool::new(false))
                .collect(),
            #[cfg(not(thunder_loom))]
            releasing: crate::sync::Mutex::new(()),
            #[cfg(all(test, not(thunder_loom)))]
            refuse_chunks: crate::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A zeroed chunk: the spare made ahead when there is one, else a fresh mapping.
    #[cfg(not(thunder_loom))]
    fn new_chunk(&self) -> Option<*mut S> {
        if let Some(ptr) = self.spare.as_ref().and_then(|s| s.take()) {
            return Some(ptr.cast());
        }
        crate::huge_memory::allocate_zeroed(Self::chunk_layout()?).map(|p| p.cast())
    }

    /// A chunk of unused slots, boxed: loom's atomics cannot be zeroed memory.
    #[cfg(thunder_loom)]
    fn new_chunk(&self) -> Option<*mut S> {
        let slots: Box<[S]> = (0..S::CHUNK_SLOTS).map(|_| S::empty()).collect();
        Some(Box::into_raw(slots).cast())
    }

    /// Frees a chunk `new_chunk` made.
    ///
    /// # Safety
    /// `chunk` came from `new_chunk` of this class, is freed once, and no reference into it
    /// is left.
    unsafe fn free_chunk(chunk: *mut S) {
        #[cfg(not(thunder_loom))]
        if let Some(layout) = Self::chunk_layout() {
            // SAFETY: `new_chunk` mapped it with this layout (directly or through the spare);
            // the caller guarantees the rest.
            unsafe { crate::huge_memory::free(chunk.cast(), layout) };
        }
        #[cfg(thunder_loom)]
        // SAFETY: `new_chunk` leaked it as a boxed slice of `CHUNK_SLOTS` slots; the caller
        // guarantees the rest.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(chunk, S::CHUNK_SLOTS)) });
    }

    /// After a chunk was installed: once the class is large, asks for the next one ahead.
    fn chunk_installed(&self) {
        let _count = self.chunk_count.fetch_add(1, Ordering::Relaxed) + 1;
        #[cfg(not(thunder_loom))]
        if _count >= SPARE_AFTER_CHUNKS
            && self.ahead.load(crate::sync::atomic::Ordering::Relaxed)
            && let Some(spare) = &self.spare
        {
            spare.refill();
        }
    }

    #[cfg(not(thunder_loom))]
    fn chunk_layout() -> Option<Layout> {
        Layout::from_size_align(S::CHUNK_SLOTS * std::mem::size_of::<S>(), CHUNK_BYTES).ok()
    }

    #[inline(always)]
    fn slot(&self, index: u32) -> Option<&S> {
        let chunk = self.chunks.get((index >> S::CHUNK_SHIFT) as usize)?;
        // Acquire pairs with the Release CAS that installed the chunk.
        let base = chunk.load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: `base` points to a live chunk of CHUNK_SLOTS zero-initialised slots that is
        // never freed while the arena lives, and the offset is below CHUNK_SLOTS.
        Some(unsafe { &*base.add(index as usize & (S::CHUNK_SLOTS - 1)) })
    }

    fn ensure_chunk(&self, chunk: usize) -> Option<()> {
        let cell = self.chunks.get(chunk)?;
        // Acquire pairs with the Release CAS below (another writer's): its chunk is zeroed.
        if !cell.load(Ordering::Acquire).is_null() {
            return Some(());
        }
        #[cfg(all(test, not(thunder_loom)))]
        if self.refuse_chunks.load(Ordering::Relaxed) {
            return None;
        }
        let fresh = self.new_chunk()?;
        // Release publishes the zeroed chunk to readers that Acquire-load the pointer (`slot`);
        // Acquire on failure pairs with the winner's Release, whose chunk we then use.
        match cell.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => self.chunk_installed(),
            // SAFETY: another writer installed its chunk first; ours, from `new_chunk`, was
            // never shared.
            Err(_) => unsafe { Self::free_chunk(fresh) },
        }
        Some(())
    }

    /// Takes a free slot, or `None` when every index of the class is in use or memory ran out.
    fn take_slot(&self) -> Option<u32> {
        // `is_empty` is two plain loads; `pop` on an empty queue also runs a SeqCst fence,
        // which waits for this writer's pending stores (the last records, missing the cache).
        // A free slot pushed meanwhile is taken by a later post.
        if !self.free.is_empty()
            && let Some(index) = self.free.pop()
        {
            #[cfg(not(thunder_loom))]
            self.note_reused(index);
            return Some(index);
        }
        let index = self.bump_run()?;
        self.ensure_chunk((index >> S::CHUNK_SHIFT) as usize)?;
        Some(index)
    }

    /// A slot of a released chunk is taken again: the chunk counts as reserved from now on
    /// (its pages come back, zeroed, as they are touched).
    #[cfg(not(thunder_loom))]
    #[inline]
    fn note_reused(&self, index: u32) {
        use Ordering::Relaxed;
        // Relaxed: the flag was set before the index was pushed back onto the free list, and
        // the queue's push/pop order that before this load.
        if let Some(flag) = self.released.get((index >> S::CHUNK_SHIFT) as usize)
            && flag.load(Relaxed)
            && flag.swap(false, Relaxed)
        {
            self.chunk_count.fetch_add(1, Relaxed);
        }
    }

    /// Hands the pages of every chunk whose slots are all on the free list back to the system
    /// (they read as zeroes, a fresh chunk's contents, until a slot is taken again). Returns
    /// the chunks released. Does nothing unless at least half the handed-out slots and a whole
    /// chunk's worth are free: the free list is taken whole while it runs, and writers bump
    /// fresh slots meanwhile.
    ///
    /// Sound because every id on the free list is past its grace period: no pinned reader
    /// holds it, no writer owns it (the ids taken here are this call's until pushed back), and
    /// no slot is live. A reader that reads a slot anyway (a scan of every slot, or a stale id)
    /// validates it: a live `meta` (odd sequence) never equals the zero a discarded page reads,
    /// and the scans pin, so a slot live when they read it cannot reach the free list (and be
    /// discarded and reused) before they finish.
    #[cfg(not(thunder_loom))]
    fn release_free_chunks(&self) -> usize {
        let Ok(_one) = self.releasing.try_lock() else {
            return 0;
        };
        let handed_out = (self.bump.load(Ordering::Relaxed) as usize).min(CLASS_SLOTS as usize);
        let free = self.free.len();
        if free < S::CHUNK_SLOTS || free * 2 < handed_out {
            return 0;
        }
        let mut taken = Vec::with_capacity(free);
        while let Some(index) = self.free.pop() {
            taken.push(index);
        }
        taken.sort_unstable();
        let Some(layout) = Self::chunk_layout() else {
            return 0;
        };
        let mut released = 0;
        let mut resident = Vec::with_capacity(taken.len());
        let mut discarded = Vec::new();
        for run in taken.chunk_by(|a, b| a >> S::CHUNK_SHIFT == b >> S::CHUNK_SHIFT) {
            let chunk = (run[0] >> S::CHUNK_SHIFT) as usize;
            // Ids on the free list are distinct, so a full run is every slot of the chunk.
            let whole = run.len() == S::CHUNK_SLOTS;
            let flag = &self.released[chunk];
            if whole && flag.load(crate::sync::atomic::Ordering::Relaxed) {
                // Released before, and no slot of it taken since.
                discarded.extend_from_slice(run);
                continue;
            }
            // Acquire pairs with the Release CAS that installed the chunk.
            let base = self.chunks[chunk].load(Ordering::Acquire);
            let discard = || {
                // SAFETY: `base` is a chunk of `layout` from `allocate_zeroed`; no slot of it
                // is live or owned by anyone but this call (see above), and readers only ever
                // load from it and validate what they read.
                unsafe { crate::huge_memory::discard(base.cast(), layout.size()) }
            };
            if whole && !base.is_null() && discard() {
                flag.store(true, crate::sync::atomic::Ordering::Relaxed);
                self.chunk_count.fetch_sub(1, Ordering::Relaxed);
                released += 1;
                discarded.extend_from_slice(run);
            } else {
                resident.extend_from_slice(run);
            }
        }
        // Slots in resident chunks are reused first; the flags above are set before the pushes,
        // which order them before the pops that read them.
        for index in resident.into_iter().chain(discarded) {
            self.free.push(index);
        }
        released
    }

    /// Takes `n` fresh indexes from the bump counter: the first and the end of the run, or
    /// `None` when the class is full.
    fn bump_by(&self, n: u32) -> Option<(u32, u32)> {
        let first = self.bump.fetch_add(n, Ordering::Relaxed);
        if first >= CLASS_SLOTS {
            // Keeps the counter from wrapping back into handed-out indexes.
            self.bump.store(CLASS_SLOTS, Ordering::Relaxed);
            return None;
        }
        Some((first, first.saturating_add(n).min(CLASS_SLOTS)))
    }

    /// The next fresh index for the calling thread. Each writer thread takes runs of
    /// `BUMP_RUN_SLOTS` indexes from the shared counter and hands them out one by one, so two
    /// writers do not bounce the counter's line on every post. A run a thread leaves for
    /// another class (another store) stays unused: at most `BUMP_RUN_SLOTS - 1` zeroed, never
    /// live slots, which scans skip.
    #[cfg(not(thunder_loom))]
    fn bump_run(&self) -> Option<u32> {
        use std::cell::Cell;
        thread_local! {
            /// Per slot size (small, large): the class the run is from, next index, end.
            static RUNS: [Cell<(u64, u32, u32)>; 2] = const { [const { Cell::new((0, 0, 0)) }; 2] };
        }
        let size = usize::from(std::mem::size_of::<S>() == std::mem::size_of::<Slot>());
        RUNS.with(|runs| {
            let (owner, next, end) = runs[size].get();
            if owner == self.id && next < end {
                runs[size].set((owner, next + 1, end));
                return Some(next);
            }
            let (first, end) = self.bump_by(BUMP_RUN_SLOTS)?;
            runs[size].set((self.id, first + 1, end));
            Some(first)
        })
    }

    /// One index at a time under loom: the models check the slot protocol, not the runs.
    #[cfg(thunder_loom)]
    fn bump_run(&self) -> Option<u32> {
        self.bump_by(1).map(|(first, _)| first)
    }

    fn publish(&self, post: &CompactPost, holders: u32) -> Option<u32> {
        let index = self.take_slot()?;
        self.slot(index)?.publish(post, holders);
        self.live.add(1);
        Some(index)
    }

    fn free_if(&self, index: u32, post_id: i64, pred: impl Fn(u32) -> bool) -> bool {
        let freed = self
            .slot(index)
            .is_some_and(|slot| slot.free_if(post_id, pred));
        if freed {
            self.live.add(-1);
        }
        freed
    }

    fn release(&self, index: u32, post_id: i64, holder: u32) -> Release {
        let Some(slot) = self.slot(index) else {
            return Release::Gone;
        };
        let outcome = slot.release(post_id, holder);
        if outcome == Release::Freed {
            self.live.add(-1);
        }
        outcome
    }

    /// Scan units (of `1 << SCAN_UNIT_SHIFT` slots) holding every index handed out so far.
    fn scan_units(&self) -> usize {
        (self.bump.load(Ordering::Relaxed) as usize).div_ceil(1 << SCAN_UNIT_SHIFT)
    }

    /// Calls `each` with the index and a validated copy of every post live in scan unit
    /// `unit`.
    fn scan_unit(&self, unit: usize, mut each: impl FnMut(u32, CompactPost)) {
        // Pinned so that no slot live when read here is discarded and reused before the scan
        // unit is done (`release_free_chunks`).
        let _pinned = crossbeam_epoch::pin();
        let first = unit << SCAN_UNIT_SHIFT;
        for offset in 0..1 << SCAN_UNIT_SHIFT {
            let index = match u32::try_from(first + offset) {
                Ok(index) if index < CLASS_SLOTS => index,
                _ => return,
            };
            match self.slot(index) {
                Some(slot) => {
                    if let Some(post) = slot.read_live() {
                        each(index, post);
                    }
                }
                // The chunk is not allocated (yet): nothing is live in it.
                None => return,
            }
        }
    }
}

impl<S: PostSlot> Drop for SlotClass<S> {
    fn drop(&mut self) {
        for chunk in self.chunks.iter() {
            let ptr = chunk.load(Ordering::Relaxed);
            if !ptr.is_null() {
                // SAFETY: the chunk was installed by `ensure_chunk` from `new_chunk`, and
                // `&mut self` means no reader can still hold a slot reference.
                unsafe { Self::free_chunk(ptr) };
            }
        }
    }
}

/// Runs `$body` with `$class` bound to the class of slot id `$id` and `$index` to its index
/// within the class (each arm is compiled for its own slot type).
macro_rules! with_class {
    ($arena:expr, $id:expr, |$class:ident, $index:ident| $body:expr) => {{
        let id: SlotId = $id;
        if id & SMALL_CLASS != 0 {
            let $class = &$arena.small;
            let $index = id & !SMALL_CLASS;
            $body
        } else {
            let $class = &$arena.large;
            let $index = id;
            $body
        }
    }};
}

/// The arena of post slots: a large and a small class.
pub(crate) struct Arena {
    large: SlotClass<Slot>,
    small: SlotClass<SmallSlot>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("large_live", &self.large.live.sum_usize())
            .field("small_live", &self.small.live.sum_usize())
            .field(
                "large_chunks",
                &self.large.chunk_count.load(Ordering::Relaxed),
            )
            .field(
                "small_chunks",
                &self.small.chunk_count.load(Ordering::Relaxed),
            )
            .finish()
    }
}

impl Arena {
    /// Turns making chunks ahead on a background thread on or off. Off pays only where the
    /// writers already keep every core busy (a snapshot load on all cores: its rebuild took
    /// 6.9-7.6 s with it against 6.1-6.8 s without).
    pub(crate) fn make_chunks_ahead(&self, on: bool) {
        #[cfg(not(thunder_loom))]
        {
            self.large
                .ahead
                .store(on, crate::sync::atomic::Ordering::Relaxed);
            self.small
                .ahead
                .store(on, crate::sync::atomic::Ordering::Relaxed);
        }
        #[cfg(thunder_loom)]
        let _ = on;
    }

    pub fn new() -> Self {
        Self {
            large: SlotClass::new(),
            small: SlotClass::new(),
        }
    }

    /// Tests only: every new chunk is refused from now on, as when memory has run out.
    #[cfg(all(test, not(thunder_loom)))]
    pub fn refuse_new_chunks(&self) {
        for refuse in [&self.large.refuse_chunks, &self.small.refuse_chunks] {
            refuse.store(true, Ordering::Relaxed);
        }
    }

    /// Hands back to the system the memory of every chunk whose slots are all free (see
    /// `SlotClass::release_free_chunks`); the bytes released.
    pub fn release_free_chunks(&self) -> usize {
        #[cfg(not(thunder_loom))]
        {
            (self.large.release_free_chunks() + self.small.release_free_chunks()) * CHUNK_BYTES
        }
        #[cfg(thunder_loom)]
        0
    }

    /// Bytes reserved for slots (whole chunks of both classes, less those released).
    pub fn bytes_reserved(&self) -> usize {
        (self.large.chunk_count.load(Ordering::Relaxed)
            + self.small.chunk_count.load(Ordering::Relaxed))
            * CHUNK_BYTES
    }

    /// Bytes of slots holding live posts.
    pub fn bytes_used(&self) -> usize {
        self.large.live.sum_usize() * std::mem::size_of::<Slot>()
            + self.small.live.sum_usize() * std::mem::size_of::<SmallSlot>()
    }

    /// Number of live posts.
    pub fn live(&self) -> usize {
        self.large.live.sum_usize() + self.small.live.sum_usize()
    }

    /// Address of a slot, for prefetching: the one line that holds it (no slot straddles two).
    #[inline]
    pub fn slot_ptr(&self, id: SlotId) -> *const u8 {
        with_class!(self, id, |class, index| class
            .slot(index)
            .map_or(std::ptr::null(), |s| std::ptr::from_ref(s).cast()))
    }

    /// Stores `post` in a fresh slot of its class, held by the timelines in `holders`.
    pub fn publish(&self, post: &CompactPost, holders: u32) -> Option<SlotId> {
        if post.fits_small() {
            self.small
                .publish(post, holders)
                .map(|index| index | SMALL_CLASS)
        } else {
            self.large.publish(post, holders)
        }
    }

    /// Returns a slot that was published but never made reachable (no map, no timeline):
    /// nobody can hold its id, so it may be reused at once.
    pub fn unpublish_unshared(&self, id: SlotId, post_id: i64) {
        with_class!(
            self,
            id,
            |class, index| if class.free_if(index, post_id, |_| true) {
                class.free.push(index);
            }
        )
    }

    /// Reads the post in slot `id` if it is live and is `post_id`.
    #[inline]
    pub fn read(&self, id: SlotId, post_id: i64) -> Option<CompactPost> {
        with_class!(self, id, |class, index| class.slot(index)?.read(post_id))
    }

    /// How many scan units a scan must visit (`scan_chunk(0..scan_chunks())`): every slot id
    /// handed out so far lies in one of them. Even units are large-class chunks, odd units
    /// halves of small-class chunks, 32768 slots each.
    pub fn scan_chunks(&self) -> usize {
        2 * self.large.scan_units().max(self.small.scan_units())
    }

    /// Calls `each` with the slot id and a consistent copy of every post live in scan unit
    /// `index` (at most 32768 posts, all of one class), in slot order (a fuzzy scan: posts
    /// published or freed while it runs may or may not be seen, but each copy is one whole
    /// post). Needs no epoch pin: chunks are never freed while the arena lives, and every copy
    /// is validated seqlock-style like `read`.
    pub fn scan_chunk(&self, index: usize, mut each: impl FnMut(SlotId, CompactPost)) {
        if index.is_multiple_of(2) {
            self.large.scan_unit(index / 2, &mut each);
        } else {
            self.small
                .scan_unit(index / 2, |slot, post| each(slot | SMALL_CLASS, post));
        }
    }

    /// A consistent copy of whatever post slot `id` holds, if it is live (for a reader that
    /// knows the slot but not the post, as a scan's second pass). Needs no epoch pin, as
    /// `scan_chunk`.
    pub fn read_live(&self, id: SlotId) -> Option<CompactPost> {
        // Pinned as `scan_chunk` is.
        let _pinned = crossbeam_epoch::pin();
        with_class!(self, id, |class, index| class.slot(index)?.read_live())
    }

    /// Frees the slot of `post_id` whoever holds it (a delete). True if this call freed it;
    /// that caller must retire the id.
    pub fn free(&self, id: SlotId, post_id: i64) -> bool {
        with_class!(self, id, |class, index| class.free_if(
            index,
            post_id,
            |_| true
        ))
    }

    /// Drops one timeline's hold (`IN_PRIMARY` or `IN_VIDEO`); frees the slot with the last one.
    pub fn release(&self, id: SlotId, post_id: i64, holder: u32) -> Release {
        with_class!(self, id, |class, index| class
            .release(index, post_id, holder))
    }

    /// Adds a holder (`IN_VIDEO`) to a live post; false if the post is gone or already held.
    pub fn hold(&self, id: SlotId, post_id: i64, holder: u32) -> bool {
        with_class!(self, id, |class, index| class
            .slot(index)
            .is_some_and(|slot| slot.hold(post_id, holder)))
    }

    /// Hands freed slots back to their class's free list once every reader pinned now has
    /// unpinned.
    #[cfg(not(thunder_loom))]
    pub fn retire(&self, ids: Vec<SlotId>, guard: &Guard) {
        if !ids.is_empty() {
            let large = Arc::clone(&self.large.free);
            let small = Arc::clone(&self.small.free);
            guard.defer(move || {
                for id in ids {
                    if id & SMALL_CLASS != 0 {
                        small.push(id & !SMALL_CLASS);
                    } else {
                        large.push(id);
                    }
                }
            });
        }
        // Deferred work (these slots, and timeline buffers replaced during the batch) sits in
        // a thread-local bag until flushed; every write call flushes so garbage is collected
        // at the rate it is made instead of piling up behind the thread's bag.
        guard.flush();
    }

    /// Under loom, hands freed slots back at once: the models leave the grace period out, so
    /// that a reader racing the reuse of its slot is checked to validate on its own (and
    /// crossbeam-epoch, which loom does not model, stays out of the free lists).
    #[cfg(thunder_loom)]
    pub fn retire(&self, ids: Vec<SlotId>, _guard: &Guard) {
        for id in ids {
            with_class!(self, id, |class, index| class.free.push(index));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits up to 10 s for `class`'s spare chunk; its address.
    #[cfg(not(thunder_loom))]
    fn wait_for_spare<S: PostSlot>(class: &SlotClass<S>) -> *mut u8 {
        let spare = class.spare.as_ref().expect("a spare");
        let started = std::time::Instant::now();
        loop {
            let ptr = spare.ready_ptr();
            if !ptr.is_null() {
                return ptr;
            }
            assert!(started.elapsed().as_secs() < 10, "no chunk was made ahead");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[cfg(not(thunder_loom))]
    #[test]
    fn a_large_class_makes_its_next_chunk_ahead_and_uses_it() {
        let class = SlotClass::<Slot>::new();
        for chunk in 0..SPARE_AFTER_CHUNKS - 1 {
            class.ensure_chunk(chunk).expect("memory");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let spare = class.spare.as_ref().expect("a spare");
        assert!(
            spare.ready_ptr().is_null(),
            "a small class makes nothing ahead"
        );
        class.ensure_chunk(SPARE_AFTER_CHUNKS - 1).expect("memory");
        let ahead = wait_for_spare(&class);
        class.ensure_chunk(SPARE_AFTER_CHUNKS).expect("memory");
        assert_eq!(
            class.chunks[SPARE_AFTER_CHUNKS]
                .load(Ordering::Acquire)
                .cast::<u8>(),
            ahead,
            "the next chunk is the one made ahead"
        );
        // It asked for the one after, which is zeroed like any chunk.
        let next = wait_for_spare(&class);
        assert_ne!(next, ahead);
        class.ensure_chunk(SPARE_AFTER_CHUNKS + 1).expect("memory");
        let slot = class
            .slot(((SPARE_AFTER_CHUNKS + 1) << Slot::CHUNK_SHIFT) as u32)
            .expect("installed");
        assert_eq!(slot.head.post_id.load(Ordering::Relaxed), 0);
    }

    #[cfg(not(thunder_loom))]
    #[test]
    fn no_chunk_is_made_ahead_while_turned_off() {
        let arena = Arena::new();
        arena.make_chunks_ahead(false);
        for chunk in 0..=SPARE_AFTER_CHUNKS {
            arena.large.ensure_chunk(chunk).expect("memory");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let spare = arena.large.spare.as_ref().expect("a spare");
        assert!(spare.ready_ptr().is_null());
        arena.make_chunks_ahead(true);
        arena
            .large
            .ensure_chunk(SPARE_AFTER_CHUNKS + 1)
            .expect("memory");
        wait_for_spare(&arena.large);
    }

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
        arena.large.free.push(id); // grace period over
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
            arena.large.free.is_empty(),
            "slot reused while a reader was pinned"
        );
        drop(reader);
        crate::sync::flush_epoch_until(|| !arena.large.free.is_empty());
        assert_eq!(arena.large.free.pop(), Some(id));
    }

    #[test]
    fn scan_sees_live_posts_only() {
        let arena = Arena::new();
        let ids: Vec<SlotId> = (1..=5)
            .map(|n| arena.publish(&post(n), IN_PRIMARY).unwrap())
            .collect();
        assert!(arena.free(ids[1], 2));
        // One large unit (0) and its small partner (1), empty.
        assert_eq!(arena.scan_chunks(), 2);
        let mut seen = Vec::new();
        arena.scan_chunk(0, |slot, post| seen.push((slot, post)));
        let slots: Vec<SlotId> = seen.iter().map(|&(slot, _)| slot).collect();
        assert_eq!(slots, vec![ids[0], ids[2], ids[3], ids[4]]);
        let seen: Vec<i64> = seen.iter().map(|(_, p)| p.post_id).collect();
        assert_eq!(seen, vec![1, 3, 4, 5]);
        // Read back by slot alone: the live posts, and nothing from the freed slot.
        assert_eq!(arena.read_live(ids[2]).map(|p| p.post_id), Some(3));
        assert_eq!(arena.read_live(ids[1]), None);
        for unit in 1..4 {
            let mut beyond = 0;
            arena.scan_chunk(unit, |_, _| beyond += 1);
            assert_eq!(beyond, 0, "unit {unit}");
        }
    }

    /// An original: no reply or source ids, so it fits a small slot.
    fn original(id: i64) -> CompactPost {
        CompactPost::from_light(&LightPost {
            post_id: id,
            author_id: 7 + id,
            created_at: 100 + id,
            conversation_id: Some(id),
            has_video: id % 2 == 0,
            ..LightPost::default()
        })
    }

    /// Bump runs are per thread and per arena: writers interleaving on one arena, and one
    /// thread alternating between two arenas, never get one id twice, and every post reads
    /// back from the slot it was given.
    #[cfg(not(thunder_loom))]
    #[test]
    fn bump_runs_never_hand_out_an_id_twice() {
        fn ids(arena: &Arena, from: i64) -> Vec<(SlotId, i64)> {
            (from..from + 45)
                .map(|id| {
                    let p = if id % 3 == 0 { post(id) } else { original(id) };
                    (arena.publish(&p, IN_PRIMARY).expect("room"), id)
                })
                .collect()
        }
        let (a, b) = (Arena::new(), Arena::new());
        let mut in_a = Vec::new();
        std::thread::scope(|scope| {
            let writers: Vec<_> = (0..3_i64)
                .map(|w| {
                    let a = &a;
                    scope.spawn(move || ids(a, 1000 * (w + 1)))
                })
                .collect();
            // This thread alternates arenas while the others write to `a`.
            for round in 0..4 {
                in_a.extend(ids(&a, 10_000 + 100 * round));
                let in_b = ids(&b, 20_000 + 100 * round);
                for (slot, id) in in_b {
                    assert_eq!(b.read(slot, id).map(|p| p.post_id), Some(id));
                }
            }
            for w in writers {
                in_a.extend(w.join().expect("writer"));
            }
        });
        let mut seen = std::collections::HashSet::new();
        for &(slot, id) in &in_a {
            assert!(seen.insert(slot), "slot {slot:#x} handed out twice");
            assert_eq!(a.read(slot, id).map(|p| p.post_id), Some(id));
        }
        assert_eq!(a.live(), in_a.len());
        assert_eq!(b.live(), 4 * 45);
    }

    #[test]
    fn publish_picks_the_class_from_the_post() {
        let arena = Arena::new();
        let small = arena.publish(&original(1), IN_PRIMARY).unwrap();
        let large = arena.publish(&post(2), IN_PRIMARY).unwrap();
        assert_ne!(small & SMALL_CLASS, 0, "an original goes in a small slot");
        assert_eq!(large & SMALL_CLASS, 0, "a reply goes in a large slot");
        // Each id names its own class's slot: the same index in the other class is not it.
        assert_eq!(small & !SMALL_CLASS, 0);
        assert_eq!(large, 0);
        assert_eq!(arena.read(small, 1), Some(original(1)));
        assert_eq!(arena.read(large, 2), Some(post(2)));
        assert_eq!(arena.read(small & !SMALL_CLASS, 1), None);
        assert_eq!(arena.read(large | SMALL_CLASS, 2), None);
        assert_eq!(arena.live(), 2);
        assert_eq!(arena.bytes_used(), 64 + 32);
        assert_eq!(arena.bytes_reserved(), 2 * CHUNK_BYTES);
        // A post with any of the four ids set needs the large class, whatever its flags.
        for field in 0..4 {
            let mut p = original(3);
            *[
                &mut p.in_reply_to_post_id,
                &mut p.in_reply_to_user_id,
                &mut p.source_post_id,
                &mut p.source_user_id,
            ][field] = 9;
            let id = arena.publish(&p, IN_PRIMARY).unwrap();
            assert_eq!(id & SMALL_CLASS, 0, "field {field}");
            assert_eq!(arena.read(id, 3), Some(p));
        }
    }

    #[test]
    fn small_slots_round_trip_every_field_and_flag() {
        let arena = Arena::new();
        let mut flagged = original(5);
        flagged.is_reply = true; // a reply flag without a parent id still fits
        flagged.is_retweet = true;
        flagged.conversation_id = 0;
        for p in [original(1), original(2), flagged] {
            let id = arena.publish(&p, IN_PRIMARY).unwrap();
            assert_ne!(id & SMALL_CLASS, 0);
            let read = arena.read(id, p.post_id).unwrap();
            assert_eq!(read, p);
            assert_eq!(read.to_light(), p.to_light());
            assert!(arena.read(id, p.post_id + 1).is_none());
        }
    }

    #[test]
    fn small_slots_pack_two_per_line_without_straddling() {
        let arena = Arena::new();
        let ids: Vec<SlotId> = (1..=4)
            .map(|n| arena.publish(&original(n), IN_PRIMARY).unwrap())
            .collect();
        let addr = |id: SlotId| arena.slot_ptr(id) as usize;
        for &id in &ids {
            assert_eq!(addr(id) % 32, 0);
            assert_eq!(addr(id) / 64, (addr(id) + 31) / 64, "slot straddles a line");
        }
        assert_eq!(addr(ids[1]) - addr(ids[0]), 32);
        assert_eq!(
            addr(ids[0]) / 64,
            addr(ids[1]) / 64,
            "two small slots share a line"
        );
        assert_ne!(addr(ids[1]) / 64, addr(ids[2]) / 64);
        let large = arena.publish(&post(9), IN_PRIMARY).unwrap();
        assert_eq!(addr(large) % 64, 0);
        assert!(
            arena.slot_ptr(SMALL_CLASS | 70_000).is_null(),
            "chunk not allocated"
        );
    }

    #[test]
    fn small_slots_free_release_hold_and_reuse_within_their_class() {
        let arena = Arena::new();
        let id = arena.publish(&original(1), IN_PRIMARY).unwrap();
        assert!(arena.hold(id, 1, IN_VIDEO));
        assert!(!arena.hold(id, 1, IN_VIDEO));
        assert_eq!(arena.release(id, 1, IN_VIDEO), Release::StillHeld);
        assert_eq!(arena.release(id, 1, IN_PRIMARY), Release::Freed);
        assert_eq!(arena.read(id, 1), None);
        assert_eq!(arena.live(), 0);
        arena.retire(vec![id], &crossbeam_epoch::pin());
        crate::sync::flush_epoch_until(|| !arena.small.free.is_empty());
        assert!(arena.large.free.is_empty(), "retired to the wrong class");
        // The large class does not take the small slot; the small class does.
        assert_eq!(arena.publish(&post(2), IN_PRIMARY), Some(0));
        assert_eq!(arena.publish(&original(3), IN_PRIMARY), Some(id));
        assert_eq!(arena.read(id, 1), None, "the old post must not validate");
        assert_eq!(arena.read(id, 3), Some(original(3)));
        // A delete, and an unshared slot handed straight back.
        assert!(arena.free(id, 3));
        assert!(!arena.free(id, 3));
        let again = arena.publish(&original(4), IN_PRIMARY).unwrap();
        arena.unpublish_unshared(again, 4);
        assert_eq!(arena.small.free.pop(), Some(again & !SMALL_CLASS));
        assert_eq!(arena.live(), 1);
    }

    #[test]
    fn scan_visits_both_classes_in_units_of_32768() {
        let arena = Arena::new();
        let unit = 1usize << SCAN_UNIT_SHIFT;
        // Enough originals to spill into the second half of the first small chunk.
        let originals = unit + 3;
        for n in 0..originals {
            arena.publish(&original(n as i64 + 1), IN_PRIMARY).unwrap();
        }
        let reply_ids: Vec<SlotId> = (0..5)
            .map(|n| arena.publish(&post(1_000_000 + n), IN_PRIMARY).unwrap())
            .collect();
        assert!(arena.free(reply_ids[0], 1_000_000));
        assert_eq!(arena.scan_chunks(), 4);
        let mut per_unit = Vec::new();
        let mut all = Vec::new();
        for index in 0..arena.scan_chunks() {
            let mut out = Vec::new();
            arena.scan_chunk(index, |slot, post| {
                // Each slot id handed out names the slot the post is in, in either class.
                assert_eq!(arena.read_live(slot).as_ref(), Some(&post));
                assert_eq!(arena.read(slot, post.post_id).as_ref(), Some(&post));
                out.push(post);
            });
            assert!(out.len() <= unit);
            per_unit.push(out.len());
            all.extend(out);
        }
        assert_eq!(per_unit, vec![4, unit, 0, 3]);
        assert_eq!(all.len(), originals + 4);
        assert!(all.iter().all(|p| match p.post_id {
            id if id >= 1_000_000 => *p == post(id),
            id => *p == original(id),
        }));
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

/// Loom models of the slot protocol, for both slot classes: `RUSTFLAGS="--cfg thunder_loom"
/// cargo test --lib loom` (see `crate::sync`). The epoch grace period in front of slot reuse
/// is left out on purpose: a read must validate on its own, even when it races the reuse of
/// its slot. A slot is only ever reused within its class (the class is part of its id), so
/// each model runs on one slot of one class.
#[cfg(all(test, thunder_loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Post `n` for a slot of class `S`: every stored field and flag differs between posts 1
    /// and 2, so a mix shows; for the small class the reply and source ids are 0 (not stored).
    fn post<S: PostSlot + 'static>(n: i64) -> CompactPost {
        let large = std::any::TypeId::of::<S>() == std::any::TypeId::of::<Slot>();
        let id = |base: i64| if large { base + n } else { 0 };
        let post = CompactPost {
            post_id: n,
            author_id: 10 + n,
            created_at: 100 + n as u32,
            in_reply_to_post_id: id(20),
            in_reply_to_user_id: id(30),
            source_post_id: id(40),
            source_user_id: id(50),
            conversation_id: 60 + n,
            is_retweet: n == 1,
            is_reply: n == 2,
            has_video: n == 1,
        };
        assert_eq!(post.fits_small(), !large);
        post
    }

    /// A read of post 1 is either all of post 1 or `None`; a read of post 2 all of post 2 or
    /// `None`.
    fn check<S: PostSlot + 'static>(read: Option<CompactPost>, n: i64) {
        assert!(
            read.is_none() || read == Some(post::<S>(n)),
            "read {n} returned {read:?}"
        );
    }

    /// A reader of post 1 races the delete of post 1 and the reuse of its slot for post 2
    /// by the same writer.
    fn read_racing_free_and_reuse<S: PostSlot + Send + Sync + 'static>() {
        loom::model(|| {
            let slot = Arc::new(S::empty());
            slot.publish(&post::<S>(1), IN_PRIMARY);
            let reader = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || (slot.read(1), slot.read(2)))
            };
            assert!(slot.free_if(1, |_| true));
            slot.publish(&post::<S>(2), IN_PRIMARY);
            let (old, new) = reader.join().unwrap();
            check::<S>(old, 1);
            check::<S>(new, 2);
        });
    }

    /// As above, but the last holder's release frees the slot and another thread reuses it
    /// (it got the id through the free list, modelled by spawning it after the free).
    fn read_racing_release_and_reuse_elsewhere<S: PostSlot + Send + Sync + 'static>() {
        loom::model(|| {
            let slot = Arc::new(S::empty());
            slot.publish(&post::<S>(1), IN_PRIMARY | IN_VIDEO);
            let reader = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || slot.read(1))
            };
            assert_eq!(slot.release(1, IN_VIDEO), Release::StillHeld);
            assert_eq!(slot.release(1, IN_PRIMARY), Release::Freed);
            let reuser = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || slot.publish(&post::<S>(2), IN_PRIMARY))
            };
            check::<S>(reader.join().unwrap(), 1);
            reuser.join().unwrap();
            assert_eq!(slot.read(2), Some(post::<S>(2)));
        });
    }

    /// A delete racing the last timeline releases: exactly one of them frees the slot.
    fn delete_racing_release_frees_once<S: PostSlot + Send + Sync + 'static>() {
        loom::model(|| {
            let slot = Arc::new(S::empty());
            slot.publish(&post::<S>(1), IN_PRIMARY | IN_VIDEO);
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

    /// A scan (`read_live`, which does not know the id) racing a free and reuse returns one
    /// whole post or nothing; a `hold` racing the free either lands on the live post or
    /// reports it gone.
    fn scan_and_hold_racing_free_and_reuse<S: PostSlot + Send + Sync + 'static>() {
        loom::model(|| {
            let slot = Arc::new(S::empty());
            slot.publish(&post::<S>(1), IN_PRIMARY);
            let scanner = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || slot.read_live())
            };
            let holder = {
                let slot = Arc::clone(&slot);
                thread::spawn(move || slot.hold(1, IN_VIDEO))
            };
            assert!(slot.free_if(1, |_| true));
            slot.publish(&post::<S>(2), IN_PRIMARY);
            let seen = scanner.join().unwrap();
            assert!(
                seen.is_none() || seen == Some(post::<S>(1)) || seen == Some(post::<S>(2)),
                "scan returned {seen:?}"
            );
            holder.join().unwrap();
            // Whatever the hold did, it was to post 1, which is gone: post 2 is held by its
            // primary timeline alone, so one release frees it.
            assert_eq!(slot.release(2, IN_PRIMARY), Release::Freed);
        });
    }

    /// One `#[test]` per model and class: `$large` runs `$model` on a large slot, `$small` on
    /// a small one.
    macro_rules! on_both_classes {
        ($($model:ident => $large:ident, $small:ident;)*) => {$(
            #[test]
            fn $large() {
                $model::<Slot>();
            }

            #[test]
            fn $small() {
                $model::<SmallSlot>();
            }
        )*};
    }

    on_both_classes! {
        read_racing_free_and_reuse =>
            loom_read_racing_free_and_reuse, loom_small_read_racing_free_and_reuse;
        read_racing_release_and_reuse_elsewhere =>
            loom_read_racing_release_and_reuse_elsewhere,
            loom_small_read_racing_release_and_reuse_elsewhere;
        delete_racing_release_frees_once =>
            loom_delete_racing_release_frees_once, loom_small_delete_racing_release_frees_once;
        scan_and_hold_racing_free_and_reuse =>
            loom_scan_and_hold_racing_free_and_reuse,
            loom_small_scan_and_hold_racing_free_and_reuse;
    }
}
