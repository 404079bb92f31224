//! Validation of a decoded `GetInNetworkPostsRequest` and its execution against the store.
//!
//! [`handle_request`] is the whole read path without a network: decode errors aside, anything
//! a client can send goes through it (the fuzz target calls it directly).

use std::num::NonZeroU32;
use std::sync::LazyLock;

use thunder_engine::config::{MAX_INPUT_LIST_SIZE, MAX_POSTS_TO_RETURN, MAX_VIDEOS_TO_RETURN};
use thunder_engine::{Explanation, OwnedQuery, PerAuthorLimits, PostStore, QueryOutcome, Store};
use thunder_proto::{GetInNetworkPostsRequest, GetInNetworkPostsResponse};

use crate::error::ServiceError;
use crate::serve::cursor::Cursor;
use crate::serve::extensions::{Extensions, next_cursor};
use crate::serve::log_limit::{LogLimit, for_log};
use crate::serve::overload::{DEGRADED_MAX_AUTHORS, DegradeLevel};
use thunder_events::wire::post_to_proto;

/// Budget of the warnings a request can trigger (unknown algorithm, truncated lists).
static REQUEST_WARNINGS: LazyLock<LogLimit> =
    LazyLock::new(|| LogLimit::per_second(NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN)));

/// Upper bound of `max_results`; larger values are clamped to it. (The reference has none; at
/// most 80 posts per author and 10000 authors could otherwise ask for 800k posts.)
pub const MAX_RESULTS_LIMIT: usize = 10_000;

/// Authors never served (bot and experimentation accounts, as in the reference).
pub const BLACKLISTED_AUTHORS: [i64; 3] = [
    1_720_665_183_188_922_368, // @grok bot account
    1_909_390_269_533_011_968, // @gork bot account
    1_999_031_187_604_717_568, // @products experimentation account
];

/// Algorithms accepted silently; all of them rank newest first.
pub const KNOWN_ALGORITHMS: [&str; 4] = ["", "recent", "default", "latest"];

/// A request whose fields are checked, clamped and converted: the engine's question, built
/// once, and what the server needs besides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidatedRequest {
    /// The store's question, as the store answers it ([`Store::answer`] chooses the feed or
    /// the videos): the viewer; the authors in request order, blacklisted ones removed
    /// (duplicates are left to the store, which reads each author once); the post ids never
    /// to return; the seen filter; the time bounds and page position (the cursor's `as_of`
    /// folded into `max_created_at`); `max_results`; the per-author limits
    /// ([`PerAuthorLimits::CAPS`] for videos, which have their own per-author cap); and the
    /// deadline, set by the caller.
    pub query: OwnedQuery,
    /// Log the request and its outcome.
    pub debug: bool,
    /// `following_user_ids` was empty (the follow-graph fallback applies).
    pub following_was_empty: bool,
    /// The page cursor the request came with, if any.
    pub cursor: Option<Cursor>,
}

impl ValidatedRequest {
    /// Checks and normalises `req`:
    /// - `user_id` and every used id must fit in `i64` (else [`ServiceError::InvalidArgument`]);
    /// - id 0 is no id: a `following_user_ids` or `exclude_tweet_ids` entry 0 is
    ///   [`ServiceError::InvalidArgument`], and so is `user_id` 0 with an empty following list
    ///   (there is no one to look the follow graph up for). `user_id` 0 with a following list
    ///   stays valid: the reference's popular-posts job sends exactly that;
    /// - `following_user_ids` and `exclude_tweet_ids` are cut to their first
    ///   [`MAX_INPUT_LIST_SIZE`] entries (ids beyond are ignored unchecked), with a warning;
    /// - [`BLACKLISTED_AUTHORS`] are removed (duplicates are read once by the store query);
    /// - `max_results` 0 means 1200 (600 for video) and is clamped to [`MAX_RESULTS_LIMIT`];
    /// - per-author limits are clamped to 50 / 30 and ignored for video requests;
    /// - an unknown `algorithm` is logged and served as `recent`.
    pub fn from_request(req: &GetInNetworkPostsRequest) -> Result<Self, ServiceError> {
        Self::from_owned(req.clone())
    }

    /// [`ValidatedRequest::from_request`] taking the request: its id lists become the
    /// validated ones in place (the serving path's, with no second copy of 2000 ids).
    pub fn from_owned(mut req: GetInNetworkPostsRequest) -> Result<Self, ServiceError> {
        let viewer_id = to_i64("user_id", req.user_id)?;
        let following_was_empty = req.following_user_ids.is_empty();
        if viewer_id == 0 && following_was_empty {
            return Err(ServiceError::InvalidArgument(
                "user_id: id 0 is not an id, and following_user_ids is empty".into(),
            ));
        }
        let following = truncated(
            "following_user_ids",
            std::mem::take(&mut req.following_user_ids),
            viewer_id,
        );
        let excluded = truncated(
            "exclude_tweet_ids",
            std::mem::take(&mut req.exclude_tweet_ids),
            viewer_id,
        );
        let authors = checked_ids("following_user_ids", following)?;
        let exclude = checked_ids("exclude_tweet_ids", excluded)?;
        let Extensions {
            seen,
            window,
            cursor,
        } = Extensions::from_request(&req)?;
        if !KNOWN_ALGORITHMS.contains(&req.algorithm.as_str())
            && let Some(suppressed) = REQUEST_WARNINGS.allow()
        {
            tracing::warn!(
                algorithm = %for_log(&req.algorithm),
                suppressed,
                "unsupported algorithm, falling back to 'recent'"
            );
        }
        let mut query = OwnedQuery::new(req.is_video_request, viewer_id, Vec::new());
        let PerAuthorLimits {
            originals,
            secondary,
        } = per_author_limits(&req);
        query.max_originals_per_author = originals;
        query.max_secondary_per_author = secondary;
        query.max_results = max_results(&req);
        query.exclude = exclude;
        query.seen = seen;
        query.window = window;
        let mut validated = Self {
            query,
            debug: req.debug,
            following_was_empty,
            cursor,
        };
        validated.set_authors(authors);
        Ok(validated)
    }

    /// Replaces the authors (e.g. with a fetched following list): truncated to
    /// [`MAX_INPUT_LIST_SIZE`], blacklist removed. No per-request hash set: the store query
    /// already keeps one of the followed authors (for the reply rule) and reads each once.
    pub fn set_authors(&mut self, mut authors: Vec<i64>) {
        authors.truncate(MAX_INPUT_LIST_SIZE);
        // Most lists hold none: a pass with no branch per id compares the low 32 bits (which
        // the baseline x86-64 compares four at a time; it has no 64-bit vector compare), and
        // only a list with a match there goes through `retain`.
        let [a, b, c] = BLACKLISTED_AUTHORS.map(|id| id as u32);
        let maybe = authors.iter().fold(0u32, |maybe, &id| {
            let low = id as u32;
            maybe | u32::from(low == a) | u32::from(low == b) | u32::from(low == c)
        });
        if maybe != 0 {
            authors.retain(|id| !BLACKLISTED_AUTHORS.contains(id));
        }
        self.query.authors = authors;
    }

    /// Makes the request cheaper for degrade `level` (see [`DegradeLevel`]): level 1 halves
    /// `max_results`, 2 quarters it and halves the per-author limits, 3 keeps an eighth,
    /// quarters the per-author limits and reads only the first [`DEGRADED_MAX_AUTHORS`]
    /// authors. `max_results` stays at least 1 and a 0 per-author limit stays 0.
    pub fn degrade(&mut self, level: DegradeLevel) {
        if level == 0 {
            return;
        }
        let shift = level.min(3);
        let query = &mut self.query;
        query.max_results = (query.max_results >> shift).max(1);
        if level >= 2 {
            let per_author = |n: usize| if n == 0 { 0 } else { (n >> (shift - 1)).max(1) };
            query.max_originals_per_author = per_author(query.max_originals_per_author);
            query.max_secondary_per_author = per_author(query.max_secondary_per_author);
        }
        if level >= 3 {
            query.authors.truncate(DEGRADED_MAX_AUTHORS);
        }
    }

    /// Runs the store query (stopping at the query's deadline with the posts found so far).
    pub fn execute(&self, store: &PostStore) -> QueryOutcome {
        store.answer(&self.query)
    }

    /// Runs the store query as [`execute`](Self::execute) does, explaining its answer for
    /// each of `post_ids` (`PostStore::explain`).
    pub fn explain(&self, store: &PostStore, post_ids: &[i64]) -> Explanation {
        store.explain(&self.query.feed(), self.query.videos, post_ids)
    }

    /// The `next_cursor` of `outcome`, the store's answer to this request.
    pub fn next_cursor(&self, outcome: &QueryOutcome) -> Vec<u8> {
        next_cursor(
            self.cursor,
            &self.query.window,
            self.query.max_results,
            outcome,
        )
    }
}

/// `max_results` as the request asks it: 0 means 1200 (600 for videos), clamped to
/// [`MAX_RESULTS_LIMIT`].
fn max_results(req: &GetInNetworkPostsRequest) -> usize {
    match req.max_results {
        0 if req.is_video_request => MAX_VIDEOS_TO_RETURN,
        0 => MAX_POSTS_TO_RETURN,
        n => usize::try_from(n)
            .unwrap_or(MAX_RESULTS_LIMIT)
            .min(MAX_RESULTS_LIMIT),
    }
}

/// The per-author limits the request gets: its own, each clamped to its cap (an absent limit
/// asks for the cap); a video request's are the caps, which its answer does not use.
fn per_author_limits(req: &GetInNetworkPostsRequest) -> PerAuthorLimits {
    if req.is_video_request {
        return PerAuthorLimits::CAPS;
    }
    let limits = req.per_author_limits.unwrap_or_default();
    let asked =
        |limit: Option<u32>| limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    PerAuthorLimits::clamped(
        asked(limits.max_posts_per_author),
        asked(limits.max_replies_reposts_per_author),
    )
}

/// Validates `req` and runs it against `store` with no deadline and no follow-graph fallback.
pub fn handle_request(
    store: &PostStore,
    req: &GetInNetworkPostsRequest,
) -> Result<GetInNetworkPostsResponse, tonic::Status> {
    let validated = ValidatedRequest::from_request(req)?;
    let outcome = validated.execute(store);
    Ok(response_from(&validated, &outcome))
}

/// The wire response for the store's answer to `validated`.
pub fn response_from(
    validated: &ValidatedRequest,
    outcome: &QueryOutcome,
) -> GetInNetworkPostsResponse {
    GetInNetworkPostsResponse {
        posts: outcome.posts.iter().map(post_to_proto).collect(),
        next_cursor: validated.next_cursor(outcome),
    }
}

fn to_i64(field: &str, id: u64) -> Result<i64, ServiceError> {
    i64::try_from(id).map_err(|_| {
        ServiceError::InvalidArgument(format!("{field}: id {id} exceeds the int64 range"))
    })
}

/// `ids` as engine ids, converted in place: each must be in the `i64` range and not 0 (else
/// INVALID_ARGUMENT naming the first that is not).
pub(crate) fn checked_ids(field: &str, ids: Vec<u64>) -> Result<Vec<i64>, ServiceError> {
    // Valid ids are 1..=i64::MAX: neither an id nor the id before it has its top bit set (0
    // wraps around to `u64::MAX`). Or-ing them all is one pass with no branch per id.
    let bad = |id: u64| (id | id.wrapping_sub(1)) >> 63 != 0;
    if ids.iter().fold(0, |all, &id| all | id | id.wrapping_sub(1)) >> 63 != 0
        && let Some(&id) = ids.iter().find(|&&id| bad(id))
    {
        return Err(if id == 0 {
            ServiceError::InvalidArgument(format!("{field}: id 0 is not an id"))
        } else {
            ServiceError::InvalidArgument(format!("{field}: id {id} exceeds the int64 range"))
        });
    }
    // Same size and alignment: the vector is reused, not copied.
    Ok(ids.into_iter().map(|id| id as i64).collect())
}

/// `ids` cut to their first [`MAX_INPUT_LIST_SIZE`] (ids beyond are ignored unchecked), with
/// a warning.
fn truncated(field: &str, mut ids: Vec<u64>, viewer_id: i64) -> Vec<u64> {
    if ids.len() > MAX_INPUT_LIST_SIZE {
        if let Some(suppressed) = REQUEST_WARNINGS.allow() {
            tracing::warn!(
                field,
                len = ids.len(),
                limit = MAX_INPUT_LIST_SIZE,
                user_id = viewer_id,
                suppressed,
                "input list truncated"
            );
        }
        ids.truncate(MAX_INPUT_LIST_SIZE);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use thunder_engine::LightPost;
    use thunder_engine::config::{MAX_ORIGINAL_POSTS_PER_AUTHOR, MAX_REPLY_POSTS_PER_AUTHOR};
    use thunder_proto::PerAuthorLimits;

    fn request() -> GetInNetworkPostsRequest {
        GetInNetworkPostsRequest {
            user_id: 1,
            following_user_ids: vec![2, 3],
            ..Default::default()
        }
    }

    #[test]
    fn defaults() {
        let v = ValidatedRequest::from_request(&request()).expect("valid");
        assert_eq!(v.query.max_results, MAX_POSTS_TO_RETURN);
        assert_eq!(
            v.query.max_originals_per_author,
            MAX_ORIGINAL_POSTS_PER_AUTHOR
        );
        assert_eq!(v.query.max_secondary_per_author, MAX_REPLY_POSTS_PER_AUTHOR);
        let video = GetInNetworkPostsRequest {
            is_video_request: true,
            ..request()
        };
        let v = ValidatedRequest::from_request(&video).expect("valid");
        assert_eq!(v.query.max_results, MAX_VIDEOS_TO_RETURN);
    }

    #[test]
    fn clamps() {
        let req = GetInNetworkPostsRequest {
            max_results: u32::MAX,
            per_author_limits: Some(PerAuthorLimits {
                max_posts_per_author: Some(1000),
                max_replies_reposts_per_author: Some(7),
            }),
            ..request()
        };
        let v = ValidatedRequest::from_request(&req).expect("valid");
        assert_eq!(v.query.max_results, MAX_RESULTS_LIMIT);
        assert_eq!(
            v.query.max_originals_per_author,
            MAX_ORIGINAL_POSTS_PER_AUTHOR
        );
        assert_eq!(v.query.max_secondary_per_author, 7);
        let video = GetInNetworkPostsRequest {
            is_video_request: true,
            ..req
        };
        let v = ValidatedRequest::from_request(&video).expect("valid");
        assert_eq!(v.query.max_secondary_per_author, MAX_REPLY_POSTS_PER_AUTHOR);
    }

    #[test]
    fn authors_are_truncated_and_filtered() {
        let mut following: Vec<u64> = vec![5, 5, BLACKLISTED_AUTHORS[0] as u64, 6];
        following.extend((100..20_000).map(|i| i as u64));
        let req = GetInNetworkPostsRequest {
            following_user_ids: following,
            ..request()
        };
        let v = ValidatedRequest::from_request(&req).expect("valid");
        assert_eq!(&v.query.authors[..4], &[5, 5, 6, 100]);
        assert_eq!(v.query.authors.len(), MAX_INPUT_LIST_SIZE - 1);
        // Ids above the smallest blacklisted one stay unless blacklisted themselves.
        let mut large: Vec<u64> = BLACKLISTED_AUTHORS.iter().map(|&id| id as u64).collect();
        let next = BLACKLISTED_AUTHORS[0] + 1;
        large.extend([i64::MAX as u64, next as u64, 7]);
        let v = ValidatedRequest::from_request(&GetInNetworkPostsRequest {
            following_user_ids: large,
            ..request()
        })
        .expect("valid");
        assert_eq!(v.query.authors, [i64::MAX, next, 7]);
        // Ids sharing a blacklisted id's low 32 bits (what the first pass compares) stay.
        let twins: Vec<u64> = BLACKLISTED_AUTHORS
            .iter()
            .flat_map(|&id| [id ^ (1 << 40), id & 0xffff_ffff])
            .map(|id| id as u64)
            .collect();
        let v = ValidatedRequest::from_request(&GetInNetworkPostsRequest {
            following_user_ids: twins.clone(),
            ..request()
        })
        .expect("valid");
        assert_eq!(
            v.query.authors,
            twins.iter().map(|&id| id as i64).collect::<Vec<_>>()
        );
    }

    #[test]
    fn duplicate_authors_are_read_once() {
        let store = PostStore::new(thunder_engine::config::DEFAULT_RETENTION_SECS);
        let now = store.now_secs();
        store.insert_posts(&[
            thunder_engine::LightPost::original(1, 5, now - 10),
            thunder_engine::LightPost::original(2, 6, now - 5),
        ]);
        let once = GetInNetworkPostsRequest {
            following_user_ids: vec![5, 6],
            ..request()
        };
        let twice = GetInNetworkPostsRequest {
            following_user_ids: vec![5, 6, 5, 6, 6],
            ..request()
        };
        let posts = |req| handle_request(&store, &req).expect("valid").posts;
        assert_eq!(posts(once).len(), 2);
        assert_eq!(
            posts(twice.clone()),
            posts(GetInNetworkPostsRequest {
                following_user_ids: vec![5, 6],
                ..twice
            })
        );
    }

    #[test]
    fn each_degrade_level_is_cheaper() {
        let mut following: Vec<u64> = (1..=2000).collect();
        following.push(1);
        let req = GetInNetworkPostsRequest {
            following_user_ids: following,
            per_author_limits: Some(PerAuthorLimits {
                max_posts_per_author: Some(40),
                max_replies_reposts_per_author: Some(0),
            }),
            ..request()
        };
        let at = |level| {
            let mut v = ValidatedRequest::from_request(&req).expect("valid");
            v.degrade(level);
            (
                v.query.max_results,
                v.query.max_originals_per_author,
                v.query.max_secondary_per_author,
                v.query.authors.len(),
            )
        };
        assert_eq!(at(0), (MAX_POSTS_TO_RETURN, 40, 0, 2001));
        assert_eq!(at(1), (MAX_POSTS_TO_RETURN / 2, 40, 0, 2001));
        assert_eq!(at(2), (MAX_POSTS_TO_RETURN / 4, 20, 0, 2001));
        assert_eq!(
            at(3),
            (MAX_POSTS_TO_RETURN / 8, 10, 0, DEGRADED_MAX_AUTHORS)
        );
        let mut tiny = ValidatedRequest::from_request(&GetInNetworkPostsRequest {
            max_results: 1,
            ..request()
        })
        .expect("valid");
        tiny.degrade(3);
        assert_eq!(tiny.query.max_results, 1);
    }

    #[test]
    fn ids_beyond_i64_are_invalid() {
        for req in [
            GetInNetworkPostsRequest {
                user_id: u64::MAX,
                ..request()
            },
            GetInNetworkPostsRequest {
                following_user_ids: vec![1 << 63],
                ..request()
            },
            GetInNetworkPostsRequest {
                exclude_tweet_ids: vec![u64::MAX],
                ..request()
            },
        ] {
            let err = ValidatedRequest::from_request(&req).expect_err("invalid");
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
        }
    }

    #[test]
    fn ids_0_are_invalid() {
        for (req, field) in [
            (
                GetInNetworkPostsRequest {
                    following_user_ids: vec![2, 0, 3],
                    ..request()
                },
                "following_user_ids",
            ),
            (
                GetInNetworkPostsRequest {
                    exclude_tweet_ids: vec![7, 0],
                    ..request()
                },
                "exclude_tweet_ids",
            ),
            (
                GetInNetworkPostsRequest {
                    user_id: 0,
                    following_user_ids: Vec::new(),
                    ..request()
                },
                "user_id",
            ),
        ] {
            let err = ValidatedRequest::from_request(&req).expect_err("invalid");
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}");
            assert!(err.to_string().contains(field), "{err}");
        }
        // The popular-posts job's request: viewer 0 with an explicit author list.
        let popular = GetInNetworkPostsRequest {
            user_id: 0,
            following_user_ids: vec![2, 3],
            ..request()
        };
        let v = ValidatedRequest::from_request(&popular).expect("valid");
        assert_eq!((v.query.viewer_id, v.query.authors), (0, vec![2, 3]));
        // Past the first MAX_INPUT_LIST_SIZE entries ids are ignored unchecked, 0 included.
        let mut following: Vec<u64> = (1..=MAX_INPUT_LIST_SIZE as u64).collect();
        following.push(0);
        let long = GetInNetworkPostsRequest {
            following_user_ids: following,
            ..request()
        };
        assert!(ValidatedRequest::from_request(&long).is_ok());
    }

    #[test]
    fn the_validated_query_asks_the_feed_or_the_videos() {
        let store = PostStore::new(thunder_engine::config::DEFAULT_RETENTION_SECS);
        let now = store.now_secs();
        let mut video = LightPost::original(1, 5, now - 10);
        video.has_video = true;
        store.insert_posts(&[video, LightPost::original(2, 5, now - 5)]);
        let feed = ValidatedRequest::from_request(&GetInNetworkPostsRequest {
            following_user_ids: vec![5],
            ..request()
        })
        .expect("valid");
        assert!(!feed.query.videos);
        let ids = |v: &ValidatedRequest| -> Vec<i64> {
            v.execute(&store).posts.iter().map(|p| p.post_id).collect()
        };
        assert_eq!(ids(&feed), [2, 1]);
        let videos = ValidatedRequest::from_request(&GetInNetworkPostsRequest {
            following_user_ids: vec![5],
            is_video_request: true,
            per_author_limits: Some(PerAuthorLimits {
                max_posts_per_author: Some(1),
                max_replies_reposts_per_author: Some(0),
            }),
            ..request()
        })
        .expect("valid");
        assert!(videos.query.videos);
        assert_eq!(
            videos.query.per_author_limits(),
            thunder_engine::PerAuthorLimits::CAPS
        );
        assert_eq!(ids(&videos), [1]);
    }
}
