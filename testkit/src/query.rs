//! An owned "newest posts of these authors" request, for tests that generate queries and keep
//! them ([`FeedQuery`] borrows its id lists).

use thunder_engine::{AnswerWindow, FeedQuery, QueryOutcome, SeenFilter, Store};

/// A [`FeedQuery`] that owns its lists, plus which question it asks (feed or videos).
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
    /// Per-author originals limit.
    pub max_originals_per_author: usize,
    /// Per-author replies+reposts limit.
    pub max_secondary_per_author: usize,
}

impl OwnedQuery {
    /// The reference defaults (1200 results, 50 / 30 per author, nothing excluded).
    pub fn new(videos: bool, viewer_id: i64, authors: Vec<i64>) -> Self {
        let defaults = FeedQuery::new(viewer_id, &[]);
        Self {
            videos,
            viewer_id,
            authors,
            exclude: Vec::new(),
            seen: None,
            window: AnswerWindow::ALL,
            max_results: defaults.max_results,
            max_originals_per_author: defaults.max_originals_per_author,
            max_secondary_per_author: defaults.max_secondary_per_author,
        }
    }

    /// The borrowed query, without a deadline.
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
            deadline: None,
        }
    }

    /// Asks `store` this question.
    pub fn ask(&self, store: &(impl Store + ?Sized)) -> QueryOutcome {
        if self.videos {
            store.get_videos_by_users(&self.feed())
        } else {
            store.get_all_posts_by_users(&self.feed())
        }
    }
}
