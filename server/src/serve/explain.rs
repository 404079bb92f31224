//! `thunder.v1.InNetworkPostsDebugService/ExplainPost`: a `GetInNetworkPostsRequest` run
//! through the store's explain (`PostStore::explain`: the query that serves answers, with an
//! observer that keeps each rule's decision), and the verdicts put on the wire with what only
//! the server knows: blacklisted authors, what the degrade level in force cut, the seen
//! filter's false positives.
//!
//! [`ThunderService::explain`](crate::serve::service::ThunderService::explain) admits the call
//! like a query (the same QPS limit, follow-graph fallback and overload controller) and counts
//! it apart, in `explain_requests_total`; [`DebugService`](crate::serve::grpc::DebugService)
//! is the gRPC service over it; [`handle_explain`] is the same without a network (the fuzzers'
//! entry).

use std::collections::HashSet;

use thunder_engine::config::{MAX_INPUT_LIST_SIZE, MAX_TINY_POSTS_PER_USER_SCAN};
use thunder_engine::{
    Explanation, LightPost, PostExplanation, PostState, PostStore, ReplyRuleMiss, ShardId,
    TimelineKind, TimelinePlace, Verdict,
};
use thunder_proto as pb;
use thunder_proto::{ExplainPostRequest, ExplainPostResponse, Reason};
use tonic::Status;

use crate::error::ServiceError;
use crate::serve::overload::{DEGRADED_MAX_AUTHORS, DegradeLevel};
use crate::serve::request::{BLACKLISTED_AUTHORS, ValidatedRequest, checked_ids};
use thunder_events::wire::post_to_proto;

/// Most post ids one `ExplainPost` call explains.
pub const MAX_EXPLAINED_POSTS: usize = 100;

/// A checked `ExplainPostRequest`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExplainRequest {
    /// The request to explain, validated as `GetInNetworkPosts` validates it.
    pub validated: ValidatedRequest,
    /// The posts to explain, in the order asked.
    pub post_ids: Vec<i64>,
    /// The ids the seen filter was built from (empty: not sent).
    pub seen_post_ids: HashSet<i64>,
}

impl ExplainRequest {
    /// Checks `req`: the request is required and validated as `GetInNetworkPosts` validates
    /// it; `post_ids` holds 1 to [`MAX_EXPLAINED_POSTS`] ids and `seen_post_ids` at most
    /// `MAX_INPUT_LIST_SIZE`, each in the `i64` range and not 0. Anything else is
    /// INVALID_ARGUMENT naming the field.
    pub fn from_request(req: ExplainPostRequest) -> Result<Self, ServiceError> {
        let invalid = |message: String| Err(ServiceError::InvalidArgument(message));
        let Some(request) = req.request else {
            return invalid("request: missing: the GetInNetworkPostsRequest to explain".into());
        };
        if req.post_ids.is_empty() {
            return invalid(format!(
                "post_ids: empty: name 1 to {MAX_EXPLAINED_POSTS} posts to explain"
            ));
        }
        if req.post_ids.len() > MAX_EXPLAINED_POSTS {
            return invalid(format!(
                "post_ids: {} ids, more than the limit of {MAX_EXPLAINED_POSTS}",
                req.post_ids.len()
            ));
        }
        if req.seen_post_ids.len() > MAX_INPUT_LIST_SIZE {
            return invalid(format!(
                "seen_post_ids: {} ids, more than the limit of {MAX_INPUT_LIST_SIZE}",
                req.seen_post_ids.len()
            ));
        }
        let post_ids = checked_ids("post_ids", req.post_ids)?;
        let seen_post_ids = checked_ids("seen_post_ids", req.seen_post_ids)?;
        Ok(Self {
            validated: ValidatedRequest::from_owned(request)?,
            post_ids,
            seen_post_ids: seen_post_ids.into_iter().collect(),
        })
    }
}

/// What the wire explanation says beyond the store's: the request as asked and as it ran
/// (degraded), and what the server knows of the call.
pub(crate) struct ExplainContext<'a> {
    /// The request as asked (with the follow graph's list, if it came from there).
    pub(crate) asked: &'a ValidatedRequest,
    /// The request as it ran, at `level`.
    pub(crate) ran: &'a ValidatedRequest,
    /// The degrade level it ran at.
    pub(crate) level: DegradeLevel,
    /// The following list came from the follow-graph fallback.
    pub(crate) following_from_graph: bool,
    /// The ids the seen filter was built from (empty: not sent).
    pub(crate) seen_post_ids: &'a HashSet<i64>,
    /// This store's author shard, if it is one.
    pub(crate) shard: Option<ShardId>,
}

impl ExplainContext<'_> {
    /// The wire response for `explanation`.
    pub(crate) fn response(&self, explanation: &Explanation) -> ExplainPostResponse {
        let outcome = &explanation.outcome;
        ExplainPostResponse {
            posts: explanation
                .posts
                .iter()
                .map(|post| self.post(post, outcome.posts.len()))
                .collect(),
            degrade_level: u32::from(self.level),
            following_count: wire_count(
                self.ran.query.authors.iter().collect::<HashSet<_>>().len(),
            ),
            following_from_graph: self.following_from_graph,
            max_results: wire_count(self.ran.query.max_results),
            returned: wire_count(outcome.posts.len()),
            timed_out: outcome.timed_out,
            as_of: outcome.as_of_secs,
        }
    }

    /// One post's explanation (`returned`: posts in the answer).
    fn post(&self, explained: &PostExplanation, returned: usize) -> pb::PostExplanation {
        let (state, post, timelines) = match &explained.state {
            PostState::Stored {
                post,
                expired,
                timelines,
            } => {
                let state = if *expired {
                    pb::PostState::Expired
                } else {
                    pb::PostState::Stored
                };
                (state, Some(post), timelines.as_slice())
            }
            PostState::Deleted => (pb::PostState::Deleted, None, &[][..]),
            PostState::OtherShard => (pb::PostState::OtherShard, None, &[][..]),
            PostState::NeverSeen => (pb::PostState::NeverSeen, None, &[][..]),
        };
        pb::PostExplanation {
            post_id: explained.post_id as u64,
            state: state.into(),
            post: post.map(post_to_proto),
            timelines: timelines.iter().map(wire_place).collect(),
            shard: self.shard.map(|s| s.to_string()).unwrap_or_default(),
            verdict: Some(self.verdict(explained, post, returned)),
        }
    }

    /// The verdict on the wire: the store's, its figures, and what the server adds.
    fn verdict(
        &self,
        explained: &PostExplanation,
        post: Option<&LightPost>,
        returned: usize,
    ) -> pb::Verdict {
        let mut wire = pb::Verdict::default();
        let reason = match explained.verdict {
            Verdict::Returned { position } => {
                wire.position = Some(wire_count(position));
                wire.page_size = Some(wire_count(returned));
                Reason::Returned
            }
            Verdict::NeverSeen => Reason::NeverSeen,
            Verdict::Deleted => Reason::Deleted,
            Verdict::OtherShard => Reason::OtherShard,
            Verdict::AuthorNotFollowed => self.not_followed(post, &mut wire),
            Verdict::NotInTimeline => Reason::NotInTimeline,
            Verdict::Expired => Reason::Expired,
            Verdict::BeforeMinCreatedAt { min_created_at } => {
                wire.bound = Some(min_created_at);
                Reason::BeforeMinCreatedAt
            }
            Verdict::AfterUpperBound { upper_bound } => {
                wire.bound = Some(upper_bound);
                Reason::AfterMaxCreatedAt
            }
            Verdict::Excluded => Reason::Excluded,
            Verdict::Seen => {
                wire.false_positive = (!self.seen_post_ids.is_empty())
                    .then(|| !self.seen_post_ids.contains(&explained.post_id));
                Reason::SeenFilter
            }
            Verdict::VideoRule => {
                wire.source_post_id = post.and_then(|p| p.source_post_id);
                Reason::VideoRule
            }
            Verdict::ScanWindow { newer_entries } => {
                wire.limit = Some(wire_count(MAX_TINY_POSTS_PER_USER_SCAN));
                wire.newer_entries = Some(wire_count(newer_entries));
                wire.timeline = self.timeline_read(post).into();
                Reason::ScanWindow
            }
            Verdict::ViewerOwnRepost => Reason::ViewerOwnRepost,
            Verdict::ReplyRule(miss) => {
                wire.parent_post_id = post.and_then(|p| p.in_reply_to_post_id);
                match miss {
                    ReplyRuleMiss::ParentMissing => Reason::ReplyParentMissing,
                    ReplyRuleMiss::ParentExpired => Reason::ReplyParentExpired,
                    ReplyRuleMiss::ConversationMismatch => Reason::ReplyConversationMismatch,
                    ReplyRuleMiss::ReplyToUnfollowed => {
                        wire.in_reply_to_user_id = post.and_then(|p| p.in_reply_to_user_id);
                        Reason::ReplyToUnfollowed
                    }
                }
            }
            Verdict::PerAuthorCap {
                limit,
                newer_entries,
            } => {
                let timeline = self.timeline_read(post);
                wire.limit = Some(wire_count(limit));
                wire.newer_entries = Some(wire_count(newer_entries));
                wire.timeline = timeline.into();
                wire.degraded = self.asked_limit(timeline) > limit;
                Reason::PerAuthorCap
            }
            Verdict::BeforeCursor => Reason::BeforeCursor,
            Verdict::CutByMaxResults { rank } => {
                wire.rank = Some(wire_count(rank));
                wire.limit = Some(wire_count(self.ran.query.max_results));
                wire.degraded = self.asked.query.max_results > self.ran.query.max_results;
                Reason::CutByMaxResults
            }
            Verdict::OutOfTime => Reason::OutOfTime,
            Verdict::RemovedMeanwhile => Reason::RemovedDuringQuery,
        };
        wire.reason = reason.into();
        wire
    }

    /// Why the store found `post`'s author not requested: never served, cut by the degrade
    /// level, or really not followed.
    fn not_followed(&self, post: Option<&LightPost>, wire: &mut pb::Verdict) -> Reason {
        let Some(author_id) = post.map(|p| p.author_id) else {
            return Reason::AuthorNotFollowed;
        };
        if BLACKLISTED_AUTHORS.contains(&author_id) {
            Reason::AuthorBlacklisted
        } else if self.asked.query.authors.contains(&author_id) {
            // Asked for, and not read: only the degrade level's cut of the authors does that.
            wire.limit = Some(wire_count(DEGRADED_MAX_AUTHORS));
            wire.degraded = true;
            Reason::AuthorDroppedByDegrade
        } else {
            Reason::AuthorNotFollowed
        }
    }

    /// The timeline the question reads `post` from.
    fn timeline_read(&self, post: Option<&LightPost>) -> pb::Timeline {
        match post {
            _ if self.ran.query.videos => pb::Timeline::Videos,
            Some(post) if post.is_original() => pb::Timeline::Originals,
            Some(_) => pb::Timeline::RepliesAndReposts,
            None => pb::Timeline::Unspecified,
        }
    }

    /// The per-author limit of `timeline` the request asked for, before any degrading.
    fn asked_limit(&self, timeline: pb::Timeline) -> usize {
        match timeline {
            pb::Timeline::Originals => self.asked.query.max_originals_per_author,
            pb::Timeline::RepliesAndReposts => self.asked.query.max_secondary_per_author,
            pb::Timeline::Videos | pb::Timeline::Unspecified => 0,
        }
    }
}

/// A count or place on the wire (`uint32`, saturating).
fn wire_count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn wire_place(place: &TimelinePlace) -> pb::TimelinePlace {
    let timeline = match place.timeline {
        TimelineKind::Originals => pb::Timeline::Originals,
        TimelineKind::RepliesAndReposts => pb::Timeline::RepliesAndReposts,
        TimelineKind::Videos => pb::Timeline::Videos,
    };
    pb::TimelinePlace {
        timeline: timeline.into(),
        position: wire_count(place.position),
        length: wire_count(place.len),
    }
}

/// Validates `req` and explains it against `store` with no deadline, no follow-graph fallback
/// and no degrading (as [`handle_request`](crate::serve::request::handle_request) answers).
pub fn handle_explain(
    store: &PostStore,
    req: ExplainPostRequest,
) -> Result<ExplainPostResponse, Status> {
    let request = ExplainRequest::from_request(req)?;
    let explanation = request.validated.explain(store, &request.post_ids);
    let context = ExplainContext {
        asked: &request.validated,
        ran: &request.validated,
        level: 0,
        following_from_graph: false,
        seen_post_ids: &request.seen_post_ids,
        shard: store.shard_id(),
    };
    Ok(context.response(&explanation))
}
