//! The fact directory of an author-sharded store.
//!
//! A shard stores the full records of the authors it owns, but two query rules read a post of
//! *another* author: the reply rule reads a reply's parent (stored? expired? original? its
//! `in_reply_to_post_id`), and the videos rule reads a repost's source (stored, unexpired, a
//! non-reply video?). A shard keeps exactly those facts for every post of the authors it does
//! not own, so its answers equal a full replica's:
//!
//! - `post_id -> packed u64`: `created_at` (32 bits) and three flags (original, video source
//!   shape `has_video && !is_reply`, has a parent id), 16 bytes of table entry per post;
//! - `post_id -> in_reply_to_post_id`, only for non-original posts with a parent id (the one
//!   field the reply-to-a-reply rule compares).
//!
//! A fact follows the store's rules for a record: the same time checks, the first create wins
//! (`duplicate`), a live tombstone drops it (`tombstoned`, raising the tombstone's basis like a
//! dropped record), a delete removes it (raising the basis to its `created_at`, as a removed
//! record does), queries ignore it once expired and trims free it.
//!
//! Concurrency: facts live in [`FACT_SHARDS`] hash tables, each behind its own `RwLock`; a
//! query takes one read lock per foreign parent or source it looks at. A create checks the
//! tombstone *while holding the write lock* of the fact's table and a delete writes its
//! tombstone *before* taking that lock to remove the fact, so whichever takes the lock second
//! sees the other: a create racing its delete is never left live.
//!
//! Reposts: a shard indexes every non-reply repost without its own video into its author's
//! videos timeline at insert, whatever its source's state, since its source may be another
//! shard's. The query-time videos rule (the source must be a video source *now*) then decides
//! exactly as a full replica does: a repost whose source is not a video source is skipped and
//! not counted, which is how a replica that never indexed it behaves.

use crate::arena::CompactPost;
use crate::config::TRIM_FRACTION;
use crate::report::{DirectoryStats, DropReason};
use crate::shard::ShardId;
use std::sync::{PoisonError, RwLock};

/// Number of independently locked fact tables (a power of two).
pub const FACT_SHARDS: usize = 64;

type FactMap<V> = hashbrown::HashMap<i64, V, foldhash::fast::RandomState>;

const ORIGINAL: u64 = 1 << 32;
const VIDEO_SHAPE: u64 = 1 << 33;
const HAS_PARENT: u64 = 1 << 34;
/// Every bit a packed fact may use.
const PACKED_BITS: u64 = HAS_PARENT | VIDEO_SHAPE | ORIGINAL | u32::MAX as u64;

/// Checks a fact read from a snapshot: only known bits, a parent id exactly when the packed
/// word says so, and never on an original (the shapes `insert` writes).
pub(crate) fn fact_record_is_valid(&(_, packed, parent): &FactRecord) -> bool {
    let has_parent = packed & HAS_PARENT != 0;
    packed & !PACKED_BITS == 0
        && has_parent == (parent != 0)
        && !(has_parent && packed & ORIGINAL != 0)
}

/// What the query rules need to know about a post that may be stored elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fact {
    /// Creation time, unix seconds.
    pub(crate) created_at: u32,
    original: bool,
    /// `has_video && !is_reply`.
    video_shape: bool,
    /// Parent post id, 0 for none.
    pub(crate) in_reply_to_post_id: i64,
}

impl Fact {
    /// The facts of a stored record.
    pub(crate) fn of_record(post: &CompactPost) -> Self {
        Self {
            created_at: post.created_at,
            original: post.is_original(),
            video_shape: post.has_video && !post.is_reply,
            in_reply_to_post_id: post.in_reply_to_post_id,
        }
    }

    /// Neither reply nor repost.
    pub(crate) fn is_original(&self) -> bool {
        self.original
    }

    /// `has_video && !is_reply`: a video source while it has not expired.
    pub(crate) fn has_video_source_shape(&self) -> bool {
        self.video_shape
    }

    /// The packed word a table keeps for this fact.
    fn packed(&self) -> u64 {
        let mut packed = u64::from(self.created_at);
        if self.original {
            packed |= ORIGINAL;
        }
        if self.video_shape {
            packed |= VIDEO_SHAPE;
        }
        if self.has_parent() {
            packed |= HAS_PARENT;
        }
        packed
    }

    /// A parent id the table keeps beside the packed word (never for an original).
    fn has_parent(&self) -> bool {
        !self.original && self.in_reply_to_post_id != 0
    }
}

#[derive(Default)]
struct FactTable {
    facts: FactMap<u64>,
    /// Parent ids of non-original facts that have one.
    parents: FactMap<i64>,
}

impl FactTable {
    /// The parent id kept for `post_id`, whose packed word is `packed`; 0 for none.
    fn parent(&self, post_id: i64, packed: u64) -> i64 {
        if packed & HAS_PARENT != 0 {
            self.parents.get(&post_id).copied().unwrap_or(0)
        } else {
            0
        }
    }
}

/// One fact as a snapshot stores it: `post_id`, the packed word (`created_at` and flags) and
/// the parent id (0 unless the packed word says it has one).
pub(crate) type FactRecord = (i64, u64, i64);

/// The facts of the posts a shard does not own, and which authors it owns; on a full
/// (unsharded) store, nothing: every author is its own and every method finds no fact.
pub(crate) struct FactDirectory {
    /// `None` on a full store.
    owns: Option<Box<dyn Fn(i64) -> bool + Send + Sync>>,
    /// Behind one thin pointer, so a full store's directory costs three words. `None` on a
    /// full store.
    shared: Option<Box<Shared>>,
}

/// The identity and the fact tables of a shard.
struct Shared {
    /// The shard's identity, when it was given (needed to write snapshots).
    id: Option<ShardId>,
    tables: [RwLock<FactTable>; FACT_SHARDS],
}

impl Shared {
    fn read(&self, table: usize) -> std::sync::RwLockReadGuard<'_, FactTable> {
        self.tables[table]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self, table: usize) -> std::sync::RwLockWriteGuard<'_, FactTable> {
        self.tables[table]
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for FactDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FactDirectory").finish_non_exhaustive()
    }
}

fn table_index(post_id: i64) -> usize {
    ((post_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize & (FACT_SHARDS - 1)
}

/// Bytes a hashbrown table of `capacity` entries of `entry_bytes` allocates: buckets are the
/// next power of two holding `capacity` at 7/8 load, plus one control byte each.
fn table_bytes(capacity: usize, entry_bytes: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        if capacity < 4 { 4 } else { 8 }
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    buckets * (entry_bytes + 1) + 16
}

impl FactDirectory {
    /// The directory of a full store: it owns every author and holds no fact.
    pub(crate) fn unsharded() -> Self {
        Self {
            owns: None,
            shared: None,
        }
    }

    /// An empty directory of the shard that owns the authors `owns` accepts; `id` when the
    /// shard's place in its fleet is known.
    pub(crate) fn new(owns: Box<dyn Fn(i64) -> bool + Send + Sync>, id: Option<ShardId>) -> Self {
        Self {
            owns: Some(owns),
            shared: Some(Box::new(Shared {
                id,
                tables: std::array::from_fn(|_| RwLock::new(FactTable::default())),
            })),
        }
    }

    /// True on an author shard (with or without its identity).
    pub(crate) fn is_shard(&self) -> bool {
        self.owns.is_some()
    }

    /// True on a shard that does not own `author_id` (it then has no timeline of that author;
    /// its posts go to this directory).
    #[inline]
    pub(crate) fn is_foreign(&self, author_id: i64) -> bool {
        self.owns.as_ref().is_some_and(|owns| !owns(author_id))
    }

    /// The shard's identity, if it is a shard and was given one.
    pub(crate) fn id(&self) -> Option<ShardId> {
        self.shared.as_ref().and_then(|shared| shared.id)
    }

    /// The facts of `post_id`, if held (expired or not).
    pub(crate) fn get(&self, post_id: i64) -> Option<Fact> {
        let table = self.shared.as_ref()?.read(table_index(post_id));
        let packed = *table.facts.get(&post_id)?;
        Some(Fact {
            created_at: packed as u32,
            original: packed & ORIGINAL != 0,
            video_shape: packed & VIDEO_SHAPE != 0,
            in_reply_to_post_id: table.parent(post_id, packed),
        })
    }

    /// The directory's sizes; `None` on a full store.
    pub(crate) fn stats(&self) -> Option<DirectoryStats> {
        let shared = self.shared.as_ref()?;
        let mut stats = DirectoryStats::default();
        for table in 0..FACT_SHARDS {
            let table = shared.read(table);
            stats.facts += table.facts.len();
            stats.parent_ids += table.parents.len();
            stats.table_bytes +=
                table_bytes(table.facts.capacity(), 16) + table_bytes(table.parents.capacity(), 16);
        }
        Some(stats)
    }

    /// Records the facts of `post` (its time checks passed), unless the first create of its
    /// id won before (`Duplicate`) or `tombstoned` says a live tombstone drops it
    /// (`Tombstoned`). `tombstoned` runs under the write lock of the fact's table: a delete
    /// writes its tombstone before it takes that lock to remove the fact, so whichever takes
    /// the lock second sees the other. `None` (nothing kept) on a full store.
    pub(crate) fn insert(
        &self,
        post: &CompactPost,
        tombstoned: impl FnOnce() -> bool,
    ) -> Option<DropReason> {
        let post_id = post.post_id;
        let fact = Fact::of_record(post);
        let mut table = self.shared.as_ref()?.write(table_index(post_id));
        if tombstoned() {
            return Some(DropReason::Tombstoned);
        }
        if table.facts.contains_key(&post_id) {
            return Some(DropReason::Duplicate);
        }
        if fact.has_parent() {
            table.parents.insert(post_id, fact.in_reply_to_post_id);
        }
        table.facts.insert(post_id, fact.packed());
        None
    }

    /// Removes the fact of `post_id` (deleted: its tombstone is already written); the
    /// removed fact's `created_at`, if there was one.
    pub(crate) fn remove(&self, post_id: i64) -> Option<u32> {
        let mut table = self.shared.as_ref()?.write(table_index(post_id));
        table.parents.remove(&post_id);
        table.facts.remove(&post_id).map(|packed| packed as u32)
    }

    /// The facts of table `table` (of [`FACT_SHARDS`]) not `expired` (by `created_at`),
    /// appended to `out`. Holds that table's read lock while it copies (no reader waits; a
    /// writer of that table waits for the copy).
    pub(crate) fn copy(
        &self,
        table: usize,
        expired: impl Fn(u32) -> bool,
        out: &mut Vec<FactRecord>,
    ) {
        let Some(shared) = self.shared.as_ref() else {
            return;
        };
        let table = shared.read(table);
        out.reserve(table.facts.len());
        for (&post_id, &packed) in &table.facts {
            if !expired(packed as u32) {
                out.push((post_id, packed, table.parent(post_id, packed)));
            }
        }
    }

    /// Restores facts read from a snapshot, by the rules of [`insert`](Self::insert): an
    /// `expired` fact is skipped, one that `tombstoned(post_id, created_at)` drops too, the
    /// first fact of an id wins. The number restored.
    pub(crate) fn restore(
        &self,
        facts: &[FactRecord],
        expired: impl Fn(u32) -> bool,
        mut tombstoned: impl FnMut(i64, i64) -> bool,
    ) -> usize {
        let Some(shared) = self.shared.as_ref() else {
            return 0;
        };
        let mut by_table: Vec<Vec<FactRecord>> = vec![Vec::new(); FACT_SHARDS];
        for &fact in facts {
            if !expired(fact.1 as u32) {
                by_table[table_index(fact.0)].push(fact);
            }
        }
        let mut restored = 0;
        for (index, facts) in by_table.into_iter().enumerate() {
            let mut table = shared.write(index);
            table.facts.reserve(facts.len());
            for (post_id, packed, parent) in facts {
                if tombstoned(post_id, i64::from(packed as u32)) {
                    continue;
                }
                if table.facts.contains_key(&post_id) {
                    continue;
                }
                if packed & HAS_PARENT != 0 {
                    table.parents.insert(post_id, parent);
                }
                table.facts.insert(post_id, packed);
                restored += 1;
            }
        }
        restored
    }

    /// Frees the `expired` facts (by `created_at`), in the tables `shard` (mod
    /// `TRIM_FRACTION`) stands for.
    pub(crate) fn trim(&self, shard: usize, expired: impl Fn(u32) -> bool) {
        let Some(shared) = self.shared.as_ref() else {
            return;
        };
        for index in (shard % TRIM_FRACTION..FACT_SHARDS).step_by(TRIM_FRACTION) {
            let mut table = shared.write(index);
            let FactTable { facts, parents } = &mut *table;
            facts.retain(|post_id, packed| {
                let keep = !expired(*packed as u32);
                if !keep && *packed & HAS_PARENT != 0 {
                    parents.remove(post_id);
                }
                keep
            });
            if facts.capacity() > 4 * facts.len().max(16) {
                facts.shrink_to_fit();
                parents.shrink_to_fit();
            }
        }
    }
}
