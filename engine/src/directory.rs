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
use crate::post::LightPost;
use crate::store::{DropReason, Guards, PostStore};
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
/// word says so, and never on an original (the shapes `insert_fact` writes).
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
    fn of_record(post: &CompactPost) -> Self {
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
}

#[derive(Default)]
struct FactTable {
    facts: FactMap<u64>,
    /// Parent ids of non-original facts that have one.
    parents: FactMap<i64>,
}

/// Sizes of a shard's fact directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectoryStats {
    /// Facts held (posts of authors this shard does not own).
    pub facts: usize,
    /// Parent ids held (non-original facts with a parent).
    pub parent_ids: usize,
    /// Bytes allocated by the hash tables (buckets and control bytes, at their capacity).
    pub table_bytes: usize,
}

/// Which shard of an author-sharded fleet a store is: shard `index` of `count`. Recorded in
/// snapshots, so a shard never loads another shard's (or a full store's) snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShardId {
    /// This shard, `0 ..count`.
    pub index: u32,
    /// Number of shards, at least 1.
    pub count: u32,
}

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// One fact as a snapshot stores it: `post_id`, the packed word (`created_at` and flags) and
/// the parent id (0 unless the packed word says it has one).
pub(crate) type FactRecord = (i64, u64, i64);

/// The facts of the posts a shard does not own, and which authors it owns.
pub(crate) struct FactDirectory {
    owns: Box<dyn Fn(i64) -> bool + Send + Sync>,
    /// Behind one thin pointer, so a store's `Option<FactDirectory>` stays three words.
    shared: Box<Shared>,
}

/// The identity and the fact tables of a shard.
struct Shared {
    /// The shard's identity, when it was given (needed to write snapshots).
    id: Option<ShardId>,
    tables: [RwLock<FactTable>; FACT_SHARDS],
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
    pub(crate) fn new(owns: Box<dyn Fn(i64) -> bool + Send + Sync>, id: Option<ShardId>) -> Self {
        Self {
            owns,
            shared: Box::new(Shared {
                id,
                tables: std::array::from_fn(|_| RwLock::new(FactTable::default())),
            }),
        }
    }

    pub(crate) fn owns(&self, author_id: i64) -> bool {
        (self.owns)(author_id)
    }

    fn get(&self, post_id: i64) -> Option<Fact> {
        let table = self.shared.tables[table_index(post_id)]
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let packed = *table.facts.get(&post_id)?;
        let in_reply_to_post_id = if packed & HAS_PARENT != 0 {
            table.parents.get(&post_id).copied().unwrap_or(0)
        } else {
            0
        };
        Some(Fact {
            created_at: packed as u32,
            original: packed & ORIGINAL != 0,
            video_shape: packed & VIDEO_SHAPE != 0,
            in_reply_to_post_id,
        })
    }

    pub(crate) fn stats(&self) -> DirectoryStats {
        let mut stats = DirectoryStats::default();
        for table in self.shared.tables.iter() {
            let table = table.read().unwrap_or_else(PoisonError::into_inner);
            stats.facts += table.facts.len();
            stats.parent_ids += table.parents.len();
            stats.table_bytes +=
                table_bytes(table.facts.capacity(), 16) + table_bytes(table.parents.capacity(), 16);
        }
        stats
    }
}

impl PostStore {
    /// Makes this store one author shard: it keeps the full records of the authors `owns`
    /// accepts and, for every other author's post, only the facts the query rules read (see
    /// the `directory` module docs). Its answers for queries about its own authors then equal a
    /// full replica's given the same events, whatever authors the query also names.
    pub fn with_fact_directory(
        mut self,
        owns: impl Fn(i64) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.directory = Some(FactDirectory::new(Box::new(owns), None));
        self
    }

    /// [`with_fact_directory`](Self::with_fact_directory) for shard `id` of a fleet: the same
    /// store, which also knows which shard it is, so it can write snapshots (their header
    /// records `id`) and refuses to load any snapshot not written by the same shard. `owns`
    /// must be the ownership rule of shard `id`.
    pub fn with_author_shard(
        mut self,
        id: ShardId,
        owns: impl Fn(i64) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.directory = Some(FactDirectory::new(Box::new(owns), Some(id)));
        self
    }

    /// The shard this store is, if it was built with
    /// [`with_author_shard`](Self::with_author_shard); `None` for a full store.
    pub fn shard_id(&self) -> Option<ShardId> {
        self.directory.as_ref().and_then(|d| d.shared.id)
    }

    /// The unexpired facts of fact table `table` (of [`FACT_SHARDS`]) at `now`, appended to
    /// `out`. Holds that table's read lock while it copies (no reader waits; a writer of that
    /// table waits for the copy).
    pub(crate) fn copy_facts(&self, table: usize, now: i64, out: &mut Vec<FactRecord>) {
        let Some(directory) = self.directory.as_ref() else {
            return;
        };
        let table = directory.shared.tables[table]
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        out.reserve(table.facts.len());
        for (&post_id, &packed) in &table.facts {
            if self.expired(packed as u32, now) {
                continue;
            }
            let parent = if packed & HAS_PARENT != 0 {
                table.parents.get(&post_id).copied().unwrap_or(0)
            } else {
                0
            };
            out.push((post_id, packed, parent));
        }
    }

    /// Restores facts read from a snapshot into this shard's directory, by the rules of
    /// [`insert_fact`](Self::insert_fact): an expired fact is skipped, a live tombstone drops
    /// it (raising the basis), the first fact of an id wins. Restore tombstones first. The
    /// number restored.
    pub(crate) fn restore_facts(&self, facts: &[FactRecord], g: &Guards<'_>) -> usize {
        let Some(directory) = self.directory.as_ref() else {
            return 0;
        };
        let mut by_table: Vec<Vec<FactRecord>> = vec![Vec::new(); FACT_SHARDS];
        for &fact in facts {
            if !self.expired(fact.1 as u32, g.now) {
                by_table[table_index(fact.0)].push(fact);
            }
        }
        let mut restored = 0;
        for (table, facts) in directory.shared.tables.iter().zip(by_table) {
            let mut table = table.write().unwrap_or_else(PoisonError::into_inner);
            table.facts.reserve(facts.len());
            for (post_id, packed, parent) in facts {
                let created_at = i64::from(packed as u32);
                if let Some(basis) = self.live_tombstone(post_id, g) {
                    self.tombstone_dropped_create(post_id, basis, created_at, g);
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

    /// Sizes of the fact directory; `None` for a full (unsharded) store.
    pub fn directory_stats(&self) -> Option<DirectoryStats> {
        self.directory.as_ref().map(FactDirectory::stats)
    }

    /// True when `post` goes to the fact directory rather than the store (a shard that does not
    /// own its author).
    #[inline]
    pub(crate) fn is_foreign(&self, post: &LightPost) -> bool {
        self.is_foreign_author(post.author_id)
    }

    /// True on a shard that does not own `author_id` (it then has no timeline of that author:
    /// a query skips it without probing the author map).
    #[inline]
    pub(crate) fn is_foreign_author(&self, author_id: i64) -> bool {
        self.directory.as_ref().is_some_and(|d| !d.owns(author_id))
    }

    /// Records the facts of a post of an author this shard does not own. The time checks have
    /// passed; the store's tombstone and first-create-wins rules apply.
    pub(crate) fn insert_fact(&self, post: &LightPost, g: &Guards<'_>) -> Option<DropReason> {
        let directory = self.directory.as_ref()?;
        let post_id = post.post_id;
        let record = CompactPost::from_light(post);
        let mut table = directory.shared.tables[table_index(post_id)]
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        // Under the write lock: a delete writes its tombstone before taking this lock.
        if let Some(basis) = self.live_tombstone(post_id, g) {
            self.tombstone_dropped_create(post_id, basis, post.created_at, g);
            return Some(DropReason::Tombstoned);
        }
        if table.facts.contains_key(&post_id) {
            return Some(DropReason::Duplicate);
        }
        let fact = Fact::of_record(&record);
        let mut packed = u64::from(fact.created_at);
        if fact.original {
            packed |= ORIGINAL;
        }
        if fact.video_shape {
            packed |= VIDEO_SHAPE;
        }
        if !fact.original && fact.in_reply_to_post_id != 0 {
            packed |= HAS_PARENT;
            table.parents.insert(post_id, fact.in_reply_to_post_id);
        }
        table.facts.insert(post_id, packed);
        None
    }

    /// Removes the fact of a deleted post (its tombstone is already written) and raises the
    /// tombstone's basis to the post's `created_at`, as removing a stored record does.
    pub(crate) fn forget_fact(&self, post_id: i64, g: &Guards<'_>) {
        let Some(directory) = self.directory.as_ref() else {
            return;
        };
        let removed = {
            let mut table = directory.shared.tables[table_index(post_id)]
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            table.parents.remove(&post_id);
            table.facts.remove(&post_id)
        };
        if let Some(packed) = removed {
            let created_at = i64::from(packed as u32);
            self.tombstones
                .update(post_id, |old| (*old).max(created_at), &g.maps);
        }
    }

    /// Frees the facts that expired, in the tables `shard` (mod `TRIM_FRACTION`) stands for.
    pub(crate) fn trim_facts(&self, shard: usize, now: i64) {
        let Some(directory) = self.directory.as_ref() else {
            return;
        };
        let fraction = crate::config::TRIM_FRACTION;
        for table in directory
            .shared
            .tables
            .iter()
            .skip(shard % fraction)
            .step_by(fraction)
        {
            let mut table = table.write().unwrap_or_else(PoisonError::into_inner);
            let FactTable { facts, parents } = &mut *table;
            facts.retain(|post_id, packed| {
                let keep = !self.expired(*packed as u32, now);
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

    /// The facts of `post_id`: from its stored record, or from the directory on a shard that
    /// does not own its author.
    #[inline]
    pub(crate) fn fact(&self, post_id: i64, epoch: &crossbeam_epoch::Guard) -> Option<Fact> {
        match self.lookup(post_id, epoch) {
            Some(record) => Some(Fact::of_record(&record)),
            None => self.directory.as_ref()?.get(post_id),
        }
    }

    /// The videos rule for a repost's source (see `is_video_source`), wherever it is stored.
    #[inline]
    pub(crate) fn source_is_video(&self, source_post_id: i64, g: &Guards<'_>, now: i64) -> bool {
        match self.lookup(source_post_id, &g.epoch) {
            Some(source) => self.is_video_source(&source, now),
            None => self
                .directory
                .as_ref()
                .and_then(|d| d.get(source_post_id))
                .is_some_and(|f| f.video_shape && !self.expired(f.created_at, now)),
        }
    }
}
