//! [`Authors`]: every author's three timelines (originals, replies and reposts, videos),
//! reached through the author index (`author_index.rs`), with the per-kind entry counts and
//! the timeline cap.
//!
//! Readers take no lock: they find an author's record and read its rings (`timeline.rs`).
//! Writers serialise per author: every change to an author's timelines happens under the
//! author's writer lock ([`Authors::with_author`]), whose flag also says whether the record is
//! in use (a trim drops an author whose timelines are empty). What an entry's record does when
//! the entry leaves (released, freed) is the caller's: the methods that remove entries hand
//! them back.

pub(crate) use crate::author_index::{Author, Kind};

use crate::author_index::AuthorIndex;
use crate::counter::StripedCount;
use crate::index::Hashed;
use crate::prefetch::prefetch;
use crate::report::StoreStats;
use crate::timeline::{MAX_CAPACITY, TinyPost};
use crossbeam_epoch::Guard;
use std::sync::PoisonError;

/// The authors and their timelines (see the module docs).
#[derive(Debug)]
pub(crate) struct Authors {
    index: AuthorIndex,
    /// Entries per timeline before the oldest is evicted.
    cap: usize,
    /// Entries per timeline kind.
    entries: [StripedCount; 3],
}

impl Authors {
    /// No authors; at most `cap` (clamped to 1 ..= 16384) entries per timeline.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            index: AuthorIndex::new(),
            cap: cap.clamp(1, MAX_CAPACITY),
            entries: Default::default(),
        }
    }

    /// Entries per timeline before the oldest is evicted.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// `author_id`'s place in the author index.
    #[inline]
    pub(crate) fn hash(&self, author_id: i64) -> Hashed {
        self.index.hash(author_id)
    }

    /// Prefetches the author index bucket of `hashed`.
    #[inline]
    pub(crate) fn prefetch_bucket(&self, hashed: Hashed, epoch: &Guard) {
        prefetch(self.index.bucket_ptr(hashed, epoch));
    }

    /// The author record the index bucket of `hashed` names first, unverified (it may be
    /// another author's, or reused since): for prefetching, then [`verified`](Self::verified).
    #[inline]
    pub(crate) fn candidate(&self, hashed: Hashed, epoch: &Guard) -> Option<&Author> {
        self.index
            .probe(hashed, epoch)
            .and_then(|number| self.index.record(number))
    }

    /// `candidate` if it is `author_id`'s record, else the full lookup of `hashed`.
    #[inline]
    pub(crate) fn verified<'a>(
        &'a self,
        author_id: i64,
        hashed: Hashed,
        candidate: &'a Author,
        epoch: &Guard,
    ) -> Option<&'a Author> {
        if candidate.author_id() == author_id {
            return Some(candidate);
        }
        // A tag collision (or a record replaced meanwhile).
        self.index.get_hashed(author_id, hashed, epoch)
    }

    /// `author_id`'s record, if indexed.
    #[inline]
    pub(crate) fn find(&self, author_id: i64, epoch: &Guard) -> Option<&Author> {
        self.index.get(author_id, epoch)
    }

    /// Runs `f` on the author's timelines under the author's writer lock. With `create`, a
    /// missing author is added; without, a missing author means `None`.
    pub(crate) fn with_author<R>(
        &self,
        author_id: i64,
        create: bool,
        epoch: &Guard,
        f: impl FnOnce(&Author) -> R,
    ) -> Option<R> {
        self.with_author_from(None, author_id, create, epoch, f)
    }

    /// [`with_author`](Self::with_author), trying `candidate` (a record found earlier, perhaps
    /// reused for another author since) before the lookup. Records are never freed while the
    /// store lives, so a stale candidate is only a wrong one, and the checks under its lock
    /// reject it.
    pub(crate) fn with_author_from<R>(
        &self,
        candidate: Option<&Author>,
        author_id: i64,
        create: bool,
        epoch: &Guard,
        f: impl FnOnce(&Author) -> R,
    ) -> Option<R> {
        if let Some(author) = candidate
            && author.author_id() == author_id
        {
            let removed = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
            if !*removed && author.author_id() == author_id {
                return Some(f(author));
            }
        }
        loop {
            // A plain lookup first: most writes go to an existing author, and the index's
            // insert path is heavier than its read path.
            let author = match self.index.get(author_id, epoch) {
                Some(author) => author,
                None if create => self.index.get_or_create(author_id, epoch)?,
                None => return None,
            };
            let removed = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
            if *removed || author.author_id() != author_id {
                // Dropped by a trim after we found it; the map no longer holds it.
                continue;
            }
            return Some(f(author));
        }
    }

    /// Calls `f` on every author record that may be in use (check its writer flag under the
    /// lock).
    pub(crate) fn for_each(&self, f: impl FnMut(&Author)) {
        self.index.for_each(f);
    }

    /// Drops `author`, whose timelines are empty: out of the index, its rings released. The
    /// caller holds its writer lock and has marked it not in use.
    pub(crate) fn drop_author(&self, author: &Author, epoch: &Guard) {
        self.index.remove(author, epoch);
        // The record stays for reuse; its (empty) rings need not.
        for kind in Kind::ALL {
            author.timeline(kind).release_buffer(epoch);
        }
    }

    /// Inserts `entry` into `author`'s `kind` timeline, whose writer lock the caller holds,
    /// as a timeline of at most `cap` entries (at most the store's cap: less when the author's
    /// base holds the rest): the entry a cap eviction pushed out, whose record the caller
    /// releases.
    #[must_use]
    pub(crate) fn insert_entry(
        &self,
        author: &Author,
        kind: Kind,
        entry: TinyPost,
        cap: usize,
        epoch: &Guard,
    ) -> Option<TinyPost> {
        let evicted = author
            .timeline(kind)
            .insert(entry, cap.min(self.cap), epoch);
        if evicted.is_none() {
            self.entries[kind as usize].add(1);
        }
        evicted
    }

    /// Removes `post_id` (created at `created_at`) from `author`'s `kind` timeline, whose
    /// writer lock the caller holds. Does not release the record.
    pub(crate) fn remove_entry(
        &self,
        author: &Author,
        kind: Kind,
        post_id: i64,
        created_at: u32,
        epoch: &Guard,
    ) {
        if author.timeline(kind).remove(post_id, created_at, epoch) {
            self.entries[kind as usize].add(-1);
        }
    }

    /// Removes the entries `expired` selects from the old end of `author`'s `kind` timeline,
    /// whose writer lock the caller holds: the removed entries, whose records the caller
    /// releases.
    pub(crate) fn pop_expired(
        &self,
        author: &Author,
        kind: Kind,
        expired: impl Fn(&TinyPost) -> bool,
        epoch: &Guard,
    ) -> Vec<TinyPost> {
        let popped = author.timeline(kind).pop_expired(expired, epoch);
        self.entries[kind as usize].add(-(popped.len() as isize));
        popped
    }

    /// Gives `author_id` (added to the index) the three timelines `timelines`, each written
    /// whole into a fresh ring (`Timeline::fill_fresh`: the author's timelines are empty),
    /// under its writer lock. Counts nothing (see [`count_entries`](Self::count_entries));
    /// false, and nothing indexed, when no author record can be had.
    pub(crate) fn fill(
        &self,
        author_id: i64,
        timelines: &[Vec<TinyPost>; 3],
        epoch: &Guard,
    ) -> bool {
        let Some(author) = self.index.get_or_create(author_id, epoch) else {
            return false;
        };
        let _writer = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
        for kind in Kind::ALL {
            author
                .timeline(kind)
                .fill_fresh(&timelines[kind as usize], self.cap, epoch);
        }
        true
    }

    /// Adds `n` to the entry count of `kind` timelines (after [`fill`](Self::fill)).
    pub(crate) fn count_entries(&self, kind: Kind, n: isize) {
        self.entries[kind as usize].add(n);
    }

    /// True if no author is indexed.
    pub(crate) fn is_empty(&self) -> bool {
        self.index.live() == 0
    }

    /// Fills in the authors' share of `stats`: authors, entries per kind, ring bytes and the
    /// author index's bytes.
    pub(crate) fn add_stats(&self, stats: &mut StoreStats, epoch: &Guard) {
        let entries = |k: Kind| self.entries[k as usize].sum_usize();
        let mut timeline_bytes = 0;
        self.index.for_each(|a| {
            timeline_bytes += a
                .timelines
                .iter()
                .map(|t| t.buffer_bytes(epoch))
                .sum::<usize>();
        });
        stats.authors = self.index.live();
        stats.original_entries = entries(Kind::Originals);
        stats.secondary_entries = entries(Kind::Secondary);
        stats.video_entries = entries(Kind::Videos);
        stats.timeline_bytes = timeline_bytes;
        stats.index_bytes += self.index.bytes(epoch);
    }

    /// The authors in use and their entries per kind, counted from the timelines (each
    /// author read under its writer lock).
    pub(crate) fn recount(&self, epoch: &Guard) -> (usize, [usize; 3]) {
        let (mut authors, mut entries) = (0, [0usize; 3]);
        self.index.for_each(|author| {
            let removed = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
            if *removed {
                return;
            }
            authors += 1;
            for (kind, timeline) in author.timelines.iter().enumerate() {
                entries[kind] += timeline.view(epoch).map_or(0, |view| view.len());
            }
        });
        (authors, entries)
    }
}
