//! [`WaitingReposts`]: the reposts that wait for their source (bug 13 of the reference): a
//! non-reply repost without its own video whose source is not stored yet is remembered under
//! the source's id until the source arrives (and, if it is a video source, promotes it to its
//! author's videos timeline) or the repost expires. Which side of a repost racing its source
//! sees the other is not decided here: see the orderings of `tables.rs`.

use crate::guards::{Guards, IdMap, SmallMaps};
use crate::retention::RetentionWindow;

/// A repost remembered until its source arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingRepost {
    pub(crate) post_id: i64,
    pub(crate) author_id: i64,
    pub(crate) created_at: u32,
}

/// `source post_id ->` the reposts waiting for it.
#[derive(Debug)]
pub(crate) struct WaitingReposts {
    retention: RetentionWindow,
    map: IdMap<Vec<PendingRepost>>,
}

impl WaitingReposts {
    /// None waiting, in a map of `maps`' collector.
    pub(crate) fn new(maps: &SmallMaps, retention: RetentionWindow) -> Self {
        Self {
            retention,
            map: maps.map(),
        }
    }

    /// Remembers `repost` as waiting for `source`.
    pub(crate) fn add(&self, source: i64, repost: PendingRepost, g: &Guards<'_>) {
        self.map.update_or_insert_with(
            source,
            |waiting| {
                let mut more = waiting.clone();
                more.push(repost);
                more
            },
            || vec![repost],
            &g.maps,
        );
    }

    /// The reposts that waited for `source`, no longer waiting.
    pub(crate) fn take<'g>(&self, source: i64, g: &'g Guards<'_>) -> Option<&'g [PendingRepost]> {
        self.map.remove(&source, &g.maps).map(Vec::as_slice)
    }

    /// Sets the reposts waiting for `source` (a bulk build's, in rank order).
    pub(crate) fn set(&self, source: i64, waiting: Vec<PendingRepost>, g: &Guards<'_>) {
        self.map.insert(source, waiting, &g.maps);
    }

    /// Forgets the sources every waiting repost of which has expired at `g.now`.
    pub(crate) fn expire(&self, g: &Guards<'_>) {
        self.map.retain(
            |_, waiting| {
                waiting
                    .iter()
                    .any(|r| !self.retention.expired(r.created_at, g.now))
            },
            &g.maps,
        );
    }

    /// Every repost waiting, as `(source, repost)` (for base files).
    pub(crate) fn all(&self) -> Vec<(i64, PendingRepost)> {
        let map = self.map.pin();
        map.iter()
            .flat_map(|(&source, reposts)| reposts.iter().map(move |&r| (source, r)))
            .collect()
    }

    /// True if no repost waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
