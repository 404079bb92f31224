//! What the store's calls report: the outcome of an insert, a delete or a trim, and the sizes
//! of the store and of a shard's fact directory. Plain values, shared by the face
//! (`store.rs`), the paths that fill them and every other store (model, baseline).

/// What `insert_posts` did with a batch: every post is counted exactly once, as inserted or
/// under the [`DropReason`] it was dropped for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertReport {
    /// Posts stored and indexed.
    pub inserted: usize,
    /// Dropped: `created_at <= 0` or `created_at > u32::MAX` (checked first).
    pub invalid_time: usize,
    /// Dropped: `created_at` after now.
    pub in_future: usize,
    /// Dropped: older than the retention window.
    pub too_old: usize,
    /// Dropped: the post was deleted before (live tombstone).
    pub tombstoned: usize,
    /// Dropped: the post is already stored (the stored record is kept unchanged).
    pub duplicate: usize,
    /// Dropped: no arena slot could be had (every slot id of the post's class in use, or the
    /// system refused the memory for a new chunk).
    pub no_slot: usize,
}

impl InsertReport {
    /// Posts dropped for `reason`.
    pub fn dropped_for(&self, reason: DropReason) -> usize {
        match reason {
            DropReason::InvalidTime => self.invalid_time,
            DropReason::InFuture => self.in_future,
            DropReason::TooOld => self.too_old,
            DropReason::Tombstoned => self.tombstoned,
            DropReason::Duplicate => self.duplicate,
            DropReason::NoSlot => self.no_slot,
        }
    }

    /// Posts dropped, all reasons together.
    pub fn dropped(&self) -> usize {
        DropReason::ALL.iter().map(|&r| self.dropped_for(r)).sum()
    }

    /// Counts one post dropped for `reason`.
    pub(crate) fn count_drop(&mut self, reason: DropReason) {
        *match reason {
            DropReason::InvalidTime => &mut self.invalid_time,
            DropReason::InFuture => &mut self.in_future,
            DropReason::TooOld => &mut self.too_old,
            DropReason::Tombstoned => &mut self.tombstoned,
            DropReason::Duplicate => &mut self.duplicate,
            DropReason::NoSlot => &mut self.no_slot,
        } += 1;
    }
}

/// Why `insert_posts` dropped a post (see `BEHAVIOUR.md`, `insert_posts`). The time checks
/// run in the order `InvalidTime`, `InFuture`, `TooOld`, before anything is looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// `created_at` is older than the retention window.
    TooOld,
    /// `created_at` is after now.
    InFuture,
    /// `created_at <= 0` or `created_at > u32::MAX`.
    InvalidTime,
    /// The post id has a live tombstone (it was deleted).
    Tombstoned,
    /// The post id is already stored; the stored record is kept.
    Duplicate,
    /// No arena slot could be had: every slot id of the post's class is in use, or the system
    /// refused the memory for a new chunk. Nothing was stored.
    NoSlot,
}

impl DropReason {
    /// Every reason, for registering one metric per reason.
    pub const ALL: [DropReason; 6] = [
        DropReason::TooOld,
        DropReason::InFuture,
        DropReason::InvalidTime,
        DropReason::Tombstoned,
        DropReason::Duplicate,
        DropReason::NoSlot,
    ];

    /// A snake_case label for metrics and logs: `too_old`, `in_future`, `invalid_time`,
    /// `tombstoned`, `duplicate`, `no_slot`.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::TooOld => "too_old",
            DropReason::InFuture => "in_future",
            DropReason::InvalidTime => "invalid_time",
            DropReason::Tombstoned => "tombstoned",
            DropReason::Duplicate => "duplicate",
            DropReason::NoSlot => "no_slot",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `mark_as_deleted` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeleteReport {
    /// Stored posts removed.
    pub removed: usize,
    /// Tombstones written or refreshed (one per event).
    pub tombstoned: usize,
}

/// What a trim removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrimReport {
    /// Timeline entries removed (all three timelines).
    pub entries_removed: usize,
    /// Post records freed back to the arena.
    pub posts_freed: usize,
    /// Tombstones that expired.
    pub tombstones_expired: usize,
    /// Authors dropped because all their timelines became empty.
    pub authors_dropped: usize,
}

impl std::ops::AddAssign for TrimReport {
    fn add_assign(&mut self, r: Self) {
        self.entries_removed += r.entries_removed;
        self.posts_freed += r.posts_freed;
        self.tombstones_expired += r.tombstones_expired;
        self.authors_dropped += r.authors_dropped;
    }
}

impl std::iter::Sum for TrimReport {
    fn sum<I: Iterator<Item = Self>>(reports: I) -> Self {
        reports.fold(Self::default(), |mut total, r| {
            total += r;
            total
        })
    }
}

/// Sizes, for metrics. Cheap except `timeline_bytes`, which walks every author.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Authors with at least one timeline.
    pub authors: usize,
    /// Stored post records.
    pub posts: usize,
    /// Entries in originals timelines.
    pub original_entries: usize,
    /// Entries in secondary (replies + reposts) timelines.
    pub secondary_entries: usize,
    /// Entries in videos timelines.
    pub video_entries: usize,
    /// Live tombstones (deleted post ids remembered).
    pub tombstones: usize,
    /// Bytes of arena chunks allocated for post records.
    pub arena_bytes_reserved: usize,
    /// Bytes of arena slots holding live posts.
    pub arena_bytes_used: usize,
    /// Bytes of timeline ring buffers.
    pub timeline_bytes: usize,
    /// Bytes of the post and author indexes: their tables and the author records.
    pub index_bytes: usize,
    /// Of `posts`, those the base stores (0 without a base). A post of the base that joined
    /// a videos timeline in the head after the base was written is counted in both tiers.
    pub base_posts: usize,
    /// Bytes of the base file (0 without a base): mapped pages are the page cache's.
    pub base_bytes: usize,
    /// Bytes of memory the base holds besides a mapping of its file: a copy of the file in
    /// huge pages, and at most its state (touched pages only).
    pub base_anonymous_bytes: usize,
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
