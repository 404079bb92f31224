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

/// Sorts `posts`, already newest first by `created_at`, into the answer order by ordering
/// each run of equal `created_at` by descending post id.
pub fn order_ties(posts: &mut [LightPost]) {
    let len = posts.len();
    order_ties_within(posts, len);
}

/// [`order_ties`], then keeps the first `max_results` posts of the answer order.
///
/// A merge that reaches `max_results` inside a run of equal `created_at` takes the whole run
/// (the cut depends on the ids), so the last run can be long: only its `max_results - start`
/// largest ids are selected and sorted, and the rest are dropped unsorted.
pub fn order_ties_and_cut(posts: &mut Vec<LightPost>, max_results: usize) {
    order_ties_within(posts, max_results);
    posts.truncate(max_results);
}

/// Orders, by descending post id, every run of equal `created_at` that starts before `keep`,
/// so that `posts[..keep]` is the start of the answer order (the posts after `keep` are left
/// in no particular order). Runs are ordered through `(id, position)` keys rather than by
/// moving the posts themselves while sorting.
fn order_ties_within(posts: &mut [LightPost], keep: usize) {
    let keep = keep.min(posts.len());
    let mut keys: Vec<(i64, u32)> = Vec::new();
    let mut ordered: Vec<LightPost> = Vec::new();
    let mut start = 0;
    while start < keep {
        let created_at = posts[start].created_at;
        let mut end = start + 1;
        while end < posts.len() && posts[end].created_at == created_at {
            end += 1;
        }
        if end - start > 1 {
            let run = &mut posts[start..end];
            keys.clear();
            // Positions fit in u32: the answer is far smaller (a run of 2^32 posts would
            // only be ordered by its first 2^32).
            keys.extend(run.iter().enumerate().map(|(i, p)| (p.post_id, i as u32)));
            let by_id_desc = |a: &(i64, u32), b: &(i64, u32)| b.0.cmp(&a.0);
            let wanted = (keep - start).min(keys.len());
            if wanted < keys.len() {
                keys.select_nth_unstable_by(wanted, by_id_desc);
                keys.truncate(wanted);
            }
            keys.sort_unstable_by(by_id_desc);
            ordered.clear();
            ordered.extend(keys.iter().map(|&(_, i)| run[i as usize]));
            run[..ordered.len()].copy_from_slice(&ordered);
        }
        start = end;
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
    fn ties_are_ordered_by_descending_id() {
        let mut posts = vec![
            LightPost::original(1, 0, 9),
            LightPost::original(3, 0, 9),
            LightPost::original(2, 0, 9),
            LightPost::original(7, 0, 5),
            LightPost::original(8, 0, 4),
            LightPost::original(9, 0, 4),
        ];
        order_ties(&mut posts);
        let ids: Vec<i64> = posts.iter().map(|p| p.post_id).collect();
        assert_eq!(ids, [3, 2, 1, 7, 9, 8]);
        assert!(posts.is_sorted_by(|a, b| answer_order(a, b).is_le()));
    }

    #[test]
    fn a_cut_inside_a_run_keeps_its_largest_ids_in_order() {
        // Newest first by time; the run at time 5 straddles the cut at 4 posts.
        let mut posts = vec![
            LightPost::original(10, 0, 9),
            LightPost::original(4, 0, 5),
            LightPost::original(8, 0, 5),
            LightPost::original(1, 0, 5),
            LightPost::original(6, 0, 5),
            LightPost::original(7, 0, 5),
            LightPost::original(3, 0, 2),
        ];
        let mut expected = posts.clone();
        expected.sort_by(answer_order);
        expected.truncate(4);
        order_ties_and_cut(&mut posts, 4);
        let ids: Vec<i64> = posts.iter().map(|p| p.post_id).collect();
        assert_eq!(ids, [10, 8, 7, 6]);
        assert_eq!(posts, expected);
    }

    #[test]
    fn order_and_cut_equals_a_full_sort_then_cut() {
        // Deterministic pseudo-random answers with many ties, every cut position.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for _ in 0..200 {
            let len = next(40) as usize;
            let mut posts: Vec<LightPost> = (0..len)
                .map(|_| LightPost::original(next(1000) as i64 - 500, 0, next(4) as i64 + 1))
                .collect();
            // The merge hands runs over newest first by time, ids in any order.
            posts.sort_by_key(|p| std::cmp::Reverse(p.created_at));
            for cut in 0..=len + 1 {
                let mut expected = posts.clone();
                expected.sort_by(answer_order);
                expected.truncate(cut);
                let mut got = posts.clone();
                order_ties_and_cut(&mut got, cut);
                let key = |v: &[LightPost]| -> Vec<(i64, i64)> {
                    v.iter().map(|p| (p.created_at, p.post_id)).collect()
                };
                assert_eq!(key(&got), key(&expected), "cut {cut} of {posts:?}");
            }
        }
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
