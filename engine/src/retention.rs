//! [`RetentionWindow`]: how long the store keeps a post or a tombstone, and the one expiry
//! test every table applies.

use crate::arena::CompactPost;

/// The retention window (`BEHAVIOUR.md`, Time and retention): a post is expired when
/// `now - created_at > secs`. A copy lives with each table that expires entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RetentionWindow {
    secs: i64,
}

impl RetentionWindow {
    /// A window of `secs` seconds (at least 0).
    pub(crate) fn new(secs: i64) -> Self {
        Self { secs: secs.max(0) }
    }

    /// The window in seconds.
    pub(crate) fn secs(self) -> i64 {
        self.secs
    }

    /// True when a post created at `created_at` is older than the window at `now`.
    #[inline]
    pub(crate) fn expired(self, created_at: u32, now: i64) -> bool {
        now - i64::from(created_at) > self.secs
    }

    /// True when a tombstone whose basis is `basis` has expired at `now` (signed, nothing
    /// wraps: a basis may be any `i64`).
    #[inline]
    pub(crate) fn basis_expired(self, basis: i64, now: i64) -> bool {
        now.saturating_sub(basis) > self.secs
    }

    /// True if `source` makes a repost of it video-eligible at `now`: an unexpired original or
    /// repost (not a reply) with its own video. The videos rule of `BEHAVIOUR.md`.
    #[inline]
    pub(crate) fn is_video_source(self, source: &CompactPost, now: i64) -> bool {
        source.has_video && !source.is_reply && !self.expired(source.created_at, now)
    }
}
