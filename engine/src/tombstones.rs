//! [`Tombstones`]: `post_id -> basis` for every deleted post whose tombstone has not expired,
//! with the filter in front of the map (`tombstone_filter.rs`) that lets an insert of a post
//! never deleted skip the map probe.
//!
//! A tombstone's basis follows `BEHAVIOUR.md` (`mark_as_deleted`): a repeated delete keeps
//! the larger basis, a create it drops raises it to that create's `created_at`, a record it
//! removes raises it to the record's. It expires a retention after its basis. The filter's
//! bits are set after the map entry is written; trim renews the filter from the map once
//! stale bits pile up. Which side of a racing create runs first is not decided here: see the
//! orderings of `tables.rs`.

use crate::guards::{Guards, IdMap, SmallMaps};
use crate::prefetch::prefetch;
use crate::retention::RetentionWindow;
use crate::tombstone_filter::TombstoneFilter;
use crossbeam_epoch::Guard;

/// The tombstones and their filter (see the module docs).
#[derive(Debug)]
pub(crate) struct Tombstones {
    retention: RetentionWindow,
    /// `post_id -> basis secs`: a tombstone expires a retention after its basis.
    map: IdMap<i64>,
    /// A one-sided filter in front of `map`: a clear bit among a post id's two bits proves
    /// "no tombstone".
    filter: TombstoneFilter,
}

impl Tombstones {
    /// No tombstones, in a map of `maps`' collector.
    pub(crate) fn new(maps: &SmallMaps, retention: RetentionWindow) -> Self {
        Self {
            retention,
            map: maps.map(),
            filter: TombstoneFilter::new(),
        }
    }

    /// The map, for pinning the small maps' guard ([`Guards::pin`]).
    pub(crate) fn map(&self) -> &IdMap<i64> {
        &self.map
    }

    /// Prefetches the filter word of `post_id`.
    #[inline]
    pub(crate) fn prefetch_word(&self, post_id: i64, epoch: &Guard) {
        prefetch(self.filter.word_ptr(post_id, epoch));
    }

    /// The basis of `post_id`'s tombstone if it has one that has not expired (trimmed or not).
    #[inline]
    pub(crate) fn live(&self, post_id: i64, g: &Guards<'_>) -> Option<i64> {
        if !self.filter.may_hold(post_id, &g.epoch) {
            return None;
        }
        self.map
            .get(&post_id, &g.maps)
            .copied()
            .filter(|basis| !self.retention.basis_expired(*basis, g.now))
    }

    /// True when a live tombstone drops a create of `post_id` created at `created_at`; the
    /// tombstone then lives at least as long as that post could (as if the create had come
    /// first and the delete had removed it), so its basis does not depend on the order.
    #[inline]
    pub(crate) fn drops_create(&self, post_id: i64, created_at: i64, g: &Guards<'_>) -> bool {
        let Some(basis) = self.live(post_id, g) else {
            return false;
        };
        if created_at > basis {
            self.map
                .update_or_insert(post_id, |old| (*old).max(created_at), created_at, &g.maps);
        }
        true
    }

    /// Tombstones `post_id` with `basis`, keeping a later basis it has; then sets its filter
    /// bits (after the map: a filter renewal either sees the entry or this add sees it
    /// running, `tombstone_filter.rs`).
    pub(crate) fn write(&self, post_id: i64, basis: i64, g: &Guards<'_>) {
        self.map
            .update_or_insert(post_id, |old| (*old).max(basis), basis, &g.maps);
        self.filter.add(post_id, &g.epoch);
    }

    /// Raises `post_id`'s tombstone (if it has one) to the `created_at` of the post it removed.
    pub(crate) fn raise(&self, post_id: i64, created_at: i64, g: &Guards<'_>) {
        self.map
            .update(post_id, |old| (*old).max(created_at), &g.maps);
    }

    /// Restores a tombstone read from a snapshot, keeping the larger basis if one exists.
    /// False (and nothing stored) if it has expired at `g.now`. Does not touch stored posts:
    /// restore tombstones before the records.
    pub(crate) fn restore(&self, post_id: i64, basis: i64, g: &Guards<'_>) -> bool {
        if self.retention.basis_expired(basis, g.now) {
            return false;
        }
        self.write(post_id, basis, g);
        true
    }

    /// Makes room for `additional` more tombstones at once (a load restores many), so the
    /// map does not grow step by step.
    pub(crate) fn reserve(&self, additional: usize, g: &Guards<'_>) {
        self.map.reserve(additional, &g.maps);
    }

    /// Every tombstone not expired at `now` as `(post_id, basis_secs)` (for snapshots).
    pub(crate) fn live_at(&self, now: i64) -> Vec<(i64, i64)> {
        let map = self.map.pin();
        map.iter()
            .filter(|(_, basis)| !self.retention.basis_expired(**basis, now))
            .map(|(&post_id, &basis)| (post_id, basis))
            .collect()
    }

    /// Forgets the tombstones expired at `g.now` (how many), and renews the filter once the
    /// stale bits pile up.
    pub(crate) fn expire(&self, g: &Guards<'_>) -> usize {
        let mut expired = 0;
        self.map.retain(
            |_, basis| {
                let keep = !self.retention.basis_expired(*basis, g.now);
                expired += usize::from(!keep);
                keep
            },
            &g.maps,
        );
        self.filter.renew_if_stale(
            self.map.len(),
            |set| {
                for (&post_id, _) in self.map.iter(&g.maps) {
                    set(post_id);
                }
            },
            &g.epoch,
        );
        expired
    }

    /// Tombstones held, expired or not (until a trim forgets them).
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// True if no tombstone is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Tombstones held, counted by walking the map.
    pub(crate) fn recount(&self) -> usize {
        self.map.pin().iter().count()
    }

    /// True while the filter lets `post_id` through to the map (tests).
    #[cfg(all(test, not(thunder_loom)))]
    pub(crate) fn filter_passes(&self, post_id: i64, epoch: &Guard) -> bool {
        self.filter.may_hold(post_id, epoch)
    }
}
