//! [`Posts`]: the post records (the slab arena, `arena.rs`) and the `post_id -> slot` index
//! over them (`index.rs`), kept so that a record is indexed exactly while it is live.
//!
//! Readers take no lock: a lookup probes the index and validates the record it names (a
//! record carries its own post id, so a recycled slot never answers). Writers lock one index
//! stripe briefly. Every method keeps the pair consistent on its own; what it does not know is
//! when a post may be stored or must go (tombstones, timelines): that is the caller's.

use crate::arena::{Arena, CompactPost, IN_VIDEO, Release, SlotId};
use crate::index::TagIndex;
use crate::prefetch::prefetch;
use crate::report::{DropReason, StoreStats};
use crossbeam_epoch::Guard;

/// Posts the post index holds before its first growth.
#[cfg(not(thunder_loom))]
const POST_INDEX_INITIAL_CAPACITY: usize = 4096;
/// Loom's models hold a handful of posts, in a table of one bucket.
#[cfg(thunder_loom)]
const POST_INDEX_INITIAL_CAPACITY: usize = 4;

/// The post records and their index (see the module docs).
#[derive(Debug)]
pub(crate) struct Posts {
    arena: Arena,
    /// `post_id -> slot`; the slot's record verifies a hit.
    index: TagIndex,
}

/// What [`Posts::remove`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    /// The post is not stored.
    NotStored,
    /// This call unindexed and freed the record (its slot pushed to `retired`).
    Freed(CompactPost),
    /// This call unindexed it, but another call freed its record first.
    FreedElsewhere,
}

impl Posts {
    pub(crate) fn new() -> Self {
        Self {
            arena: Arena::new(),
            index: TagIndex::with_capacity(POST_INDEX_INITIAL_CAPACITY),
        }
    }

    /// The live record of `post_id`, if stored.
    #[inline]
    pub(crate) fn lookup(&self, post_id: i64, epoch: &Guard) -> Option<CompactPost> {
        self.lookup_with_slot(post_id, epoch)
            .map(|(_, record)| record)
    }

    /// The slot and live record of `post_id`, if stored.
    #[inline]
    pub(crate) fn lookup_with_slot(
        &self,
        post_id: i64,
        epoch: &Guard,
    ) -> Option<(SlotId, CompactPost)> {
        self.index.get(self.index.hash(post_id), epoch, |slot| {
            self.arena.read(slot, post_id).map(|record| (slot, record))
        })
    }

    /// The live record of `post_id`, if stored, looked up under the post's index stripe lock:
    /// ordered with a concurrent publish of it by that lock as well (a lock-free reader could
    /// still be in a table replaced meanwhile).
    pub(crate) fn lookup_locked(&self, post_id: i64, epoch: &Guard) -> Option<CompactPost> {
        self.index
            .get_locked(self.index.hash(post_id), epoch, |slot| {
                self.arena.read(slot, post_id)
            })
    }

    /// The record in `slot` if it still is `post_id`'s (validated: never another post's).
    #[inline]
    pub(crate) fn read(&self, slot: SlotId, post_id: i64) -> Option<CompactPost> {
        self.arena.read(slot, post_id)
    }

    /// The record in `slot` if the slot is live, whichever post it holds.
    #[inline]
    pub(crate) fn read_live(&self, slot: SlotId) -> Option<CompactPost> {
        self.arena.read_live(slot)
    }

    /// Prefetches the record in `slot`.
    #[inline]
    pub(crate) fn prefetch_record(&self, slot: SlotId) {
        prefetch(self.arena.slot_ptr(slot));
    }

    /// Prefetches `post_id`'s index bucket.
    #[inline]
    pub(crate) fn prefetch_bucket(&self, post_id: i64, epoch: &Guard) {
        prefetch(self.index.bucket_ptr(self.index.hash(post_id), epoch));
    }

    /// Prefetches the record `post_id`'s index bucket names first (unverified); its bucket
    /// should have been prefetched before.
    #[inline]
    pub(crate) fn prefetch_stored_record(&self, post_id: i64, epoch: &Guard) {
        if let Some(slot) = self.index.probe(self.index.hash(post_id), epoch) {
            prefetch(self.arena.slot_ptr(slot));
        }
    }

    /// Publishes `record` to a fresh slot held by `holders` and indexes it. `NoSlot` when no
    /// slot can be had, `Duplicate` (and nothing kept) when the post is already stored.
    #[inline]
    pub(crate) fn publish(
        &self,
        record: &CompactPost,
        holders: u32,
        epoch: &Guard,
    ) -> Result<SlotId, DropReason> {
        let post_id = record.post_id;
        let Some(slot) = self.arena.publish(record, holders) else {
            // Only when every u32 slot id is in use or memory is exhausted.
            return Err(DropReason::NoSlot);
        };
        let is_stored = |s: SlotId| self.arena.read(s, post_id).is_some();
        if self
            .index
            .insert_with(self.index.hash(post_id), epoch, is_stored, || Some(slot))
            .is_err()
        {
            // A concurrent insert of the same post won.
            self.arena.unpublish_unshared(slot, post_id);
            return Err(DropReason::Duplicate);
        }
        Ok(slot)
    }

    /// Takes a published record back: out of the index, its slot freed (and pushed to
    /// `retired` when this call freed it).
    pub(crate) fn unpublish(
        &self,
        post_id: i64,
        slot: SlotId,
        epoch: &Guard,
        retired: &mut Vec<SlotId>,
    ) {
        self.index
            .remove_exact(self.index.hash(post_id), slot, epoch);
        if self.arena.free(slot, post_id) {
            retired.push(slot);
        }
    }

    /// Removes `post_id`'s record whoever holds it (a delete): out of the index, then freed.
    /// Its timeline entries are the caller's to remove.
    pub(crate) fn remove(&self, post_id: i64, epoch: &Guard, retired: &mut Vec<SlotId>) -> Removal {
        let Some(slot) = self
            .index
            .remove_where(self.index.hash(post_id), epoch, |s| {
                self.arena.read(s, post_id).is_some()
            })
        else {
            return Removal::NotStored;
        };
        let Some(record) = self.arena.read(slot, post_id) else {
            return Removal::FreedElsewhere;
        };
        if !self.arena.free(slot, post_id) {
            return Removal::FreedElsewhere;
        }
        retired.push(slot);
        Removal::Freed(record)
    }

    /// Drops the hold `holder` (`IN_PRIMARY` or `IN_VIDEO`) has on `post_id`'s record in
    /// `slot`; unindexes and frees the record if that was its last hold (true then, the slot
    /// pushed to `retired`).
    pub(crate) fn release(
        &self,
        post_id: i64,
        slot: SlotId,
        holder: u32,
        epoch: &Guard,
        retired: &mut Vec<SlotId>,
    ) -> bool {
        if self.arena.release(slot, post_id, holder) != Release::Freed {
            return false;
        }
        self.index
            .remove_exact(self.index.hash(post_id), slot, epoch);
        retired.push(slot);
        true
    }

    /// Adds the videos timeline's hold to `post_id`'s record in `slot`; false if the slot no
    /// longer holds it or it has that hold already.
    pub(crate) fn hold_video(&self, slot: SlotId, post_id: i64) -> bool {
        self.arena.hold(slot, post_id, IN_VIDEO)
    }

    /// Hands slots freed by one call back to the arena after the epoch's grace period.
    pub(crate) fn retire(&self, retired: Vec<SlotId>, epoch: &Guard) {
        self.arena.retire(retired, epoch);
    }

    /// Live post records.
    pub(crate) fn live(&self) -> usize {
        self.arena.live()
    }

    /// Units of work a scan of every record splits into (see [`scan_chunk`](Self::scan_chunk)).
    pub(crate) fn scan_chunks(&self) -> usize {
        self.arena.scan_chunks()
    }

    /// Calls `each(slot, record)` for every live record of scan unit `index`; takes no lock
    /// and no pin (every read is validated).
    pub(crate) fn scan_chunk(&self, index: usize, each: impl FnMut(SlotId, CompactPost)) {
        self.arena.scan_chunk(index, each);
    }

    /// Sizes the index at once for about `posts` posts.
    pub(crate) fn reserve(&self, posts: usize) {
        self.index.reserve(posts, &crossbeam_epoch::pin());
    }

    /// Whether the arena maps its next chunk ahead on a thread of its own.
    pub(crate) fn make_chunks_ahead(&self, on: bool) {
        self.arena.make_chunks_ahead(on);
    }

    /// Hands arena chunks whose slots are all free back to the system.
    pub(crate) fn release_free_chunks(&self) {
        self.arena.release_free_chunks();
    }

    /// The next arena chunk is refused, as if the system had no memory left (tests).
    #[cfg(all(test, not(thunder_loom)))]
    pub(crate) fn refuse_new_chunks(&self) {
        self.arena.refuse_new_chunks();
    }

    /// Fills in the posts' share of `stats`: live records, arena bytes and the index's bytes.
    pub(crate) fn add_stats(&self, stats: &mut StoreStats, epoch: &Guard) {
        stats.posts = self.arena.live();
        stats.arena_bytes_reserved = self.arena.bytes_reserved();
        stats.arena_bytes_used = self.arena.bytes_used();
        stats.index_bytes += self.index.bytes(epoch);
    }

    /// Live records counted by a scan of every slot.
    pub(crate) fn recount(&self) -> usize {
        let mut posts = 0;
        for unit in 0..self.arena.scan_chunks() {
            self.arena.scan_chunk(unit, |_, _| posts += 1);
        }
        posts
    }
}
