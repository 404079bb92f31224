//! What a query asks and what it answers: [`FeedQuery`] (borrowed, as the store reads it),
//! [`OwnedQuery`] (the same question owning its lists, for callers that keep or generate
//! queries), the one clamp of the per-author limits ([`PerAuthorLimits`]) every store, model
//! and front end applies, and [`QueryOutcome`].

use std::time::Instant;

use crate::config::{
    MAX_ORIGINAL_POSTS_PER_AUTHOR, MAX_POSTS_TO_RETURN, MAX_REPLY_POSTS_PER_AUTHOR,
};
use crate::page::AnswerWindow;
use crate::post::LightPost;
use crate::seen::SeenFilter;

/// A "newest posts of these authors" request. Per-author limits above the reference caps are
/// clamped ([`PerAuthorLimits`]).
#[derive(Clone, Debug)]
pub struct FeedQuery<'a> {
    /// The viewer (for the self-repost filter).
    pub viewer_id: i64,
    /// The authors to read, in request order.
    pub authors: &'a [i64],
    /// Post ids never to return.
    pub exclude: &'a [i64],
    /// Post ids the viewer has seen, as a compact filter: skipped like `exclude` (false
    /// positives included).
    pub seen: Option<&'a SeenFilter>,
    /// Time bounds and the page position the answer continues after.
    pub window: AnswerWindow,
    /// Most posts in the answer.
    pub max_results: usize,
    /// Per-author originals limit (clamped to `MAX_ORIGINAL_POSTS_PER_AUTHOR`).
    pub max_originals_per_author: usize,
    /// Per-author replies+reposts limit (clamped to `MAX_REPLY_POSTS_PER_AUTHOR`; 0 reads
    /// none).
    pub max_secondary_per_author: usize,
    /// Stop and return what was found when this passes.
    pub deadline: Option<Instant>,
}

impl<'a> FeedQuery<'a> {
    /// A query with the reference defaults: no exclusions, 1200 results, 50 / 30 per author.
    pub fn new(viewer_id: i64, authors: &'a [i64]) -> Self {
        Self {
            viewer_id,
            authors,
            exclude: &[],
            seen: None,
            window: AnswerWindow::ALL,
            max_results: MAX_POSTS_TO_RETURN,
            max_originals_per_author: MAX_ORIGINAL_POSTS_PER_AUTHOR,
            max_secondary_per_author: MAX_REPLY_POSTS_PER_AUTHOR,
            deadline: None,
        }
    }

    /// The per-author limits this query is answered with (its own, clamped to the caps).
    #[inline]
    pub fn per_author_limits(&self) -> PerAuthorLimits {
        PerAuthorLimits::clamped(self.max_originals_per_author, self.max_secondary_per_author)
    }
}

/// A query's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryOutcome {
    /// The posts, newest first.
    pub posts: Vec<LightPost>,
    /// The deadline passed; `posts` is partial.
    pub timed_out: bool,
    /// Summed timeline lengths of the requested authors (the reference's `total_eligible`).
    pub eligible: usize,
    /// The store clock the query read (unix seconds): nothing created later is in `posts`.
    pub as_of_secs: i64,
}

/// How many posts of one author a feed answer holds at most, by timeline (video answers have
/// their own cap, `MAX_VIDEO_POSTS_PER_AUTHOR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerAuthorLimits {
    /// Originals (the reference's `max_posts_per_author`).
    pub originals: usize,
    /// Replies and reposts (`max_replies_reposts_per_author`; 0 reads none).
    pub secondary: usize,
}

impl PerAuthorLimits {
    /// The reference's caps (50 / 30): the most a query gets, and what it gets by default.
    pub const CAPS: Self = Self {
        originals: MAX_ORIGINAL_POSTS_PER_AUTHOR,
        secondary: MAX_REPLY_POSTS_PER_AUTHOR,
    };

    /// The limits a query that asks for `originals` and `secondary` gets: each clamped to its
    /// cap. The one place the clamp is written.
    #[inline]
    pub fn clamped(originals: usize, secondary: usize) -> Self {
        Self {
            originals: originals.min(Self::CAPS.originals),
            secondary: secondary.min(Self::CAPS.secondary),
        }
    }
}

/// A [`FeedQuery`] that owns its lists, plus which question it asks (feed or videos):
/// for callers that keep or generate queries. [`feed`](Self::feed) is the one conversion,
/// and [`Store::answer`](crate::Store::answer) answers it from any store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedQuery {
    /// Ask for videos (`get_videos_by_users`) instead of the feed.
    pub videos: bool,
    /// The viewer (for the self-repost filter).
    pub viewer_id: i64,
    /// The authors to read, in request order.
    pub authors: Vec<i64>,
    /// Post ids never to return.
    pub exclude: Vec<i64>,
    /// Post ids the viewer has seen, as a filter.
    pub seen: Option<SeenFilter>,
    /// Time bounds and page position.
    pub window: AnswerWindow,
    /// Most posts in the answer.
    pub max_results: usize,
    /// Per-author originals limit (clamped as [`FeedQuery`]'s).
    pub max_originals_per_author: usize,
    /// Per-author replies+reposts limit (clamped as [`FeedQuery`]'s).
    pub max_secondary_per_author: usize,
    /// Stop and return what was found when this passes.
    pub deadline: Option<Instant>,
}

impl OwnedQuery {
    /// The reference defaults (1200 results, 50 / 30 per author, nothing excluded, no
    /// deadline).
    pub fn new(videos: bool, viewer_id: i64, authors: Vec<i64>) -> Self {
        let defaults = FeedQuery::new(viewer_id, &[]);
        Self {
            videos,
            viewer_id,
            authors,
            exclude: Vec::new(),
            seen: None,
            window: defaults.window,
            max_results: defaults.max_results,
            max_originals_per_author: defaults.max_originals_per_author,
            max_secondary_per_author: defaults.max_secondary_per_author,
            deadline: defaults.deadline,
        }
    }

    /// The borrowed query.
    pub fn feed(&self) -> FeedQuery<'_> {
        FeedQuery {
            viewer_id: self.viewer_id,
            authors: &self.authors,
            exclude: &self.exclude,
            seen: self.seen.as_ref(),
            window: self.window,
            max_results: self.max_results,
            max_originals_per_author: self.max_originals_per_author,
            max_secondary_per_author: self.max_secondary_per_author,
            deadline: self.deadline,
        }
    }

    /// The per-author limits this query is answered with (see [`PerAuthorLimits::clamped`]).
    pub fn per_author_limits(&self) -> PerAuthorLimits {
        self.feed().per_author_limits()
    }
}
