//! Paging and time bounds of a query: the answer's total order, the position a page ends at,
//! and the window of creation times a query reads.
//!
//! The answer is ordered newest first, ties broken by the larger post id first
//! ([`answer_order`]). A [`PagePosition`] is a place in that order; a query with
//! [`AnswerWindow::after`] returns only posts strictly after it. Per-author limits and the scan
//! window are still counted from the newest post inside the time bounds, so consecutive pages
//! concatenate to the answer one query with a larger `max_results` would give.

use std::cmp::Ordering;

use crate::post::LightPost;

/// A place in the answer order: the `created_at` and `post_id` of the last post of a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagePosition {
    /// Creation time of the last post returned, unix seconds.
    pub created_at: i64,
    /// Id of the last post returned.
    pub post_id: i64,
}

impl PagePosition {
    /// The position of `post`.
    pub fn of(post: &LightPost) -> Self {
        Self {
            created_at: post.created_at,
            post_id: post.post_id,
        }
    }

    /// True when a post with this `created_at` and `post_id` comes strictly after `self` in
    /// the answer order (older, or as old with a smaller id).
    #[inline]
    pub fn precedes(&self, created_at: i64, post_id: i64) -> bool {
        created_at < self.created_at || (created_at == self.created_at && post_id < self.post_id)
    }
}

/// The answer order: newest first, then the larger post id first. `Less` means `a` comes
/// before `b`.
pub fn answer_order(a: &LightPost, b: &LightPost) -> Ordering {
    (b.created_at, b.post_id).cmp(&(a.created_at, a.post_id))
}

/// Which part of the authors' timelines a query reads and from where its answer starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnswerWindow {
    /// Posts created before this (unix seconds) are treated as absent.
    pub min_created_at: Option<i64>,
    /// Posts created after this (unix seconds) are treated as absent: they are skipped
    /// without counting toward per-author limits or the scan window. A later page passes the
    /// clock its first page was answered at here, so posts that arrive meanwhile change
    /// nothing.
    pub max_created_at: Option<i64>,
    /// Return only posts strictly after this position (the previous page's last post).
    pub after: Option<PagePosition>,
}

impl AnswerWindow {
    /// No bounds, no position: the whole answer from its newest post.
    pub const ALL: Self = Self {
        min_created_at: None,
        max_created_at: None,
        after: None,
    };

    /// The newest `created_at` a query at clock `now` reads (`max_created_at` or `now`,
    /// whichever is earlier: posts created after the query's clock are never returned).
    pub fn upper_bound(&self, now: i64) -> i64 {
        self.max_created_at.map_or(now, |max| max.min(now))
    }

    /// The oldest `created_at` the query reads.
    pub fn lower_bound(&self) -> i64 {
        self.min_created_at.unwrap_or(i64::MIN)
    }

    /// True when `post` may be returned: after [`Self::after`].
    #[inline]
    pub fn admits(&self, created_at: i64, post_id: i64) -> bool {
        self.after.is_none_or(|p| p.precedes(created_at, post_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_order_is_newest_then_larger_id_first() {
        let p = PagePosition {
            created_at: 100,
            post_id: 50,
        };
        assert!(p.precedes(99, i64::MAX));
        assert!(p.precedes(100, 49));
        assert!(!p.precedes(100, 50));
        assert!(!p.precedes(100, 51));
        assert!(!p.precedes(101, i64::MIN));
    }

    #[test]
    fn bounds() {
        let w = AnswerWindow {
            max_created_at: Some(50),
            ..AnswerWindow::ALL
        };
        assert_eq!(w.upper_bound(100), 50);
        assert_eq!(w.upper_bound(40), 40);
        assert_eq!(AnswerWindow::ALL.upper_bound(7), 7);
        assert_eq!(AnswerWindow::ALL.lower_bound(), i64::MIN);
        assert!(AnswerWindow::ALL.admits(i64::MAX, i64::MAX));
    }
}
