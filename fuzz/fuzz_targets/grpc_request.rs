//! Arbitrary `GetInNetworkPostsRequest` bytes through the server's decoder (which must give
//! prost's answer: the same request, or an error where prost errs), then request validation
//! and the store query against a small pre-filled store, without a network: either
//! `handle_request` or the service's answer (admission, `grpc-timeout`, follow-graph fallback,
//! blocking query task), encoded by the server's codec and read back with prost.
//!
//! Input: byte 0 selects the path and the service's situation, byte 1 is the length `n` of a
//! `grpc-timeout` header value (`n % 16` bytes; 0: no header), then the header bytes, then the
//! request. The status code must be the documented one for the situation:
//! `RESOURCE_EXHAUSTED` only when the QPS quota is spent, `INVALID_ARGUMENT` exactly when an
//! id that is used exceeds `i64` or an extension field is malformed (seen filter, cursor,
//! inverted time bounds), `INTERNAL` only when the follow-graph fallback fails,
//! `DEADLINE_EXCEEDED` only for a call with a valid `grpc-timeout` header (its deadline may
//! pass before the answer), and `OK` otherwise; an `OK` answer obeys the request (seen filter,
//! time bounds and cursor included) and its `next_cursor` is one the server accepts. Control
//! bit 0x40 replaces the request's cursor by a valid one derived from the input, bit 0x80 adds
//! a seen filter built from the request's exclude list, so both paths are reached.
//!
//! Control bit 0x08 reads the request bytes as an `ExplainPostRequest` instead, through
//! `handle_explain` or the service's `explain` in the same situations: the status code must be
//! the documented one (INVALID_ARGUMENT exactly for a missing request, no or more than 100
//! post ids, more than 10000 seen ids, an id 0 or above `i64` in either list, or what
//! GetInNetworkPosts refuses), every post gets a verdict, in order, and an `OK` explanation
//! agrees with the answer to the same request: a post is "returned at position k" exactly when
//! that answer holds it at k.
#![no_main]

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use thunder_engine::config::MAX_INPUT_LIST_SIZE;
use thunder_engine::seen::SEEN_FILTER_MAX_BYTES;
use thunder_engine::{LightPost, ManualClock, PagePosition, PostStore, SeenFilter};
use thunder_events::wire::post_from_proto;
use thunder_proto::{
    ExplainPostRequest, ExplainPostResponse, GetInNetworkPostsRequest, GetInNetworkPostsResponse,
    Reason,
};
use thunder_server::handle_request;
use thunder_server::serve::admission::Admission;
use thunder_server::serve::codec::{DecodedRequest, decode_request};
use thunder_server::serve::cursor::{Cursor, CursorKey};
use thunder_server::serve::explain::{MAX_EXPLAINED_POSTS, handle_explain};
use thunder_server::serve::following::{FollowingSource, StaticFollowing};
use thunder_server::serve::request::{BLACKLISTED_AUTHORS, ValidatedRequest};
use thunder_server::serve::service::{ThunderService, log_failure};
use tonic::Code;
use tonic::metadata::MetadataValue;

const NOW_SECS: i64 = 1_700_000_000;
/// The follow-graph fallback's answer for every viewer.
const FALLBACK_AUTHORS: [i64; 3] = [2, 3, BLACKLISTED_AUTHORS[0]];

/// A few authors (one of them blacklisted) with originals, replies, reposts (some of viewer 1's
/// and 2's posts) and videos; some posts are expired.
fn store() -> Arc<PostStore> {
    static STORE: OnceLock<Arc<PostStore>> = OnceLock::new();
    Arc::clone(STORE.get_or_init(|| {
        let clock = Arc::new(ManualClock::new(NOW_SECS - 60));
        let store = PostStore::with_clock(3600, clock.clone());
        let authors = [0, 1, 2, 3, 4, 5, BLACKLISTED_AUTHORS[0], i64::MAX];
        let mut posts = Vec::new();
        for (a, &author) in authors.iter().enumerate() {
            for i in 0..12i64 {
                let post_id = a as i64 * 100 + i;
                let mut post = LightPost::original(post_id, author, NOW_SECS - 4000 + i * 350);
                match i % 4 {
                    1 => {
                        post.is_reply = true;
                        post.in_reply_to_post_id = Some(post_id - 1);
                        post.in_reply_to_user_id = Some(author);
                        post.conversation_id = Some(post_id - 1);
                    }
                    2 => {
                        post.is_retweet = true;
                        post.source_post_id = Some((i % 3) * 100 + 3);
                        post.source_user_id = Some(i % 3);
                    }
                    3 => post.has_video = true,
                    _ => {}
                }
                posts.push(post);
            }
        }
        store.insert_posts(&posts);
        clock.set(NOW_SECS);
        Arc::new(store)
    }))
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime")
    })
}

#[derive(Debug)]
struct FailingFollowing;

#[tonic::async_trait]
impl FollowingSource for FailingFollowing {
    async fn fetch_following_list(&self, _user_id: i64, _limit: usize) -> Result<Vec<i64>, String> {
        Err("graph service unavailable".to_owned())
    }
}

/// The service's situation, from the control byte.
#[derive(Clone, Copy, Debug)]
struct Situation {
    via_service: bool,
    /// 0: no fallback, 1: a working one, 2: a failing one.
    fallback: u8,
    quota_spent: bool,
    zero_request_timeout: bool,
}

impl Situation {
    fn from_byte(b: u8) -> Self {
        Self {
            via_service: b & 1 != 0,
            fallback: (b >> 1) % 4 % 3,
            quota_spent: b & 0x10 != 0,
            zero_request_timeout: b & 0x20 != 0,
        }
    }
}

/// True when an extension field is malformed: a seen filter whose format, block count or
/// size is off, a cursor the server did not sign, or `min_created_at > max_created_at`.
fn has_invalid_extension(req: &GetInNetworkPostsRequest) -> bool {
    let bad_filter = req.seen_filter.as_ref().is_some_and(|f| {
        f.format != 1
            || f.num_blocks == 0
            || f.bits.len() > SEEN_FILTER_MAX_BYTES
            || f.bits.len() as u64 != u64::from(f.num_blocks) * 32
    });
    let bad_cursor = !req.cursor.is_empty() && CursorKey::global().open(&req.cursor).is_err();
    let inverted = matches!((req.min_created_at, req.max_created_at), (Some(a), Some(b)) if a > b);
    bad_filter || bad_cursor || inverted
}

/// True when an id that validation looks at exceeds `i64` or is 0 (a list entry 0, or viewer
/// 0 with no following list to serve instead of a follow graph).
fn has_invalid_id(req: &GetInNetworkPostsRequest) -> bool {
    let bad = |ids: &[u64]| {
        ids.iter()
            .take(MAX_INPUT_LIST_SIZE)
            .any(|&id| id == 0 || id > i64::MAX as u64)
    };
    req.user_id > i64::MAX as u64
        || (req.user_id == 0 && req.following_user_ids.is_empty())
        || bad(&req.following_user_ids)
        || bad(&req.exclude_tweet_ids)
}

fn serve(
    situation: Situation,
    timeout: Option<MetadataValue<tonic::metadata::Ascii>>,
    req: GetInNetworkPostsRequest,
) -> Result<(Vec<LightPost>, Vec<u8>), tonic::Status> {
    let unpack = |r: thunder_proto::GetInNetworkPostsResponse| {
        (r.posts.iter().map(post_from_proto).collect(), r.next_cursor)
    };
    if !situation.via_service {
        return handle_request(&store(), &req).map(unpack);
    }
    let service = service(situation, req.user_id);
    let mut request = tonic::Request::new(DecodedRequest::new(req));
    if let Some(value) = timeout {
        request.metadata_mut().insert("grpc-timeout", value);
    }
    // The server's one response path: the codec's bytes (what the client receives), read
    // back with prost.
    let answer = runtime()
        .block_on(service.answer(request))
        .map_err(log_failure)?;
    let mut bytes = Vec::with_capacity(answer.posts.encoded_len());
    answer.posts.encode_to(&mut bytes);
    let response = GetInNetworkPostsResponse::decode(bytes.as_slice())
        .expect("prost decodes the codec's response");
    Ok(unpack(response))
}

/// The request tweaks of control bits 0x40 (a valid cursor) and 0x80 (a seen filter).
fn tweak(control: u8, req: &mut GetInNetworkPostsRequest) {
    if control & 0x40 != 0 {
        let at = |x: u64| NOW_SECS - (x % 5000) as i64;
        req.cursor = CursorKey::global().seal(&Cursor {
            as_of_secs: at(u64::from(req.max_results)),
            after: (!req.debug).then(|| PagePosition {
                created_at: at(req.user_id),
                post_id: req.algorithm.len() as i64 * 37,
            }),
        });
    }
    if control & 0x80 != 0 && req.seen_filter.is_none() {
        let ids: Vec<i64> = req.exclude_tweet_ids.iter().map(|&id| id as i64).collect();
        let filter = SeenFilter::from_ids(&ids, req.user_id);
        req.seen_filter = Some(thunder_proto::SeenFilter {
            format: 1,
            seed: filter.seed(),
            num_blocks: filter.num_blocks(),
            bits: filter.to_bytes(),
        });
    }
}

/// The `grpc-timeout` header value of the input, if it is one metadata takes.
fn timeout_header(header: &[u8]) -> Option<MetadataValue<tonic::metadata::Ascii>> {
    (!header.is_empty())
        .then(|| MetadataValue::try_from(header).ok())
        .flatten()
}

/// True when `timeout` is a `grpc-timeout` the server reads as a deadline.
fn has_deadline(timeout: Option<&MetadataValue<tonic::metadata::Ascii>>) -> bool {
    timeout.is_some_and(|value| {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert("grpc-timeout", value.clone());
        thunder_server::serve::service::grpc_timeout(&metadata).is_some()
    })
}

/// The documented status code of a call in `situation`.
fn expected_code(situation: Situation, invalid: bool, uses_fallback: bool) -> Code {
    if situation.via_service && situation.quota_spent {
        Code::ResourceExhausted
    } else if invalid {
        Code::InvalidArgument
    } else if uses_fallback && situation.fallback == 2 {
        Code::Internal
    } else {
        Code::Ok
    }
}

/// The service of `situation` (its admission, follow-graph fallback and request timeout).
fn service(situation: Situation, user_id: u64) -> ThunderService {
    let admission = Admission::new(NonZeroU32::MIN);
    if situation.quota_spent {
        drop(admission.admit().expect("a fresh quota admits one call"));
    }
    let following: Option<Arc<dyn FollowingSource>> = match situation.fallback {
        1 => Some(Arc::new(StaticFollowing::new(HashMap::from([(
            i64::try_from(user_id).unwrap_or(0),
            FALLBACK_AUTHORS.to_vec(),
        )])))),
        2 => Some(Arc::new(FailingFollowing)),
        _ => None,
    };
    let request_timeout = situation.zero_request_timeout.then_some(Duration::ZERO);
    ThunderService::new(store(), admission, following, request_timeout)
}

/// An `ExplainPostRequest` (the input's request bytes) explained in `situation`.
fn explain_case(
    control: u8,
    situation: Situation,
    timeout: Option<MetadataValue<tonic::metadata::Ascii>>,
    body: &[u8],
) {
    let Ok(mut req) = ExplainPostRequest::decode(body) else {
        return;
    };
    if let Some(inner) = req.request.as_mut() {
        tweak(control, inner);
    }
    let bad_ids = |ids: &[u64]| ids.iter().any(|&id| id == 0 || id > i64::MAX as u64);
    let invalid = req
        .request
        .as_ref()
        .is_none_or(|r| has_invalid_id(r) || has_invalid_extension(r))
        || req.post_ids.is_empty()
        || req.post_ids.len() > MAX_EXPLAINED_POSTS
        || req.seen_post_ids.len() > MAX_INPUT_LIST_SIZE
        || bad_ids(&req.post_ids)
        || bad_ids(&req.seen_post_ids);
    let inner = req.request.clone().unwrap_or_default();
    let uses_fallback =
        situation.via_service && situation.fallback != 0 && inner.following_user_ids.is_empty();
    let expected = expected_code(situation, invalid, uses_fallback);
    let deadline_allowed = situation.via_service && has_deadline(timeout.as_ref());
    let result = if situation.via_service {
        let service = service(situation, inner.user_id);
        let mut request = tonic::Request::new(req.clone());
        if let Some(value) = timeout {
            request.metadata_mut().insert("grpc-timeout", value);
        }
        runtime()
            .block_on(service.explain(request))
            .map(|(response, _)| response)
            .map_err(log_failure)
    } else {
        handle_explain(&store(), req.clone())
    };
    let code = result
        .as_ref()
        .map_or_else(tonic::Status::code, |_| Code::Ok);
    if code == Code::DeadlineExceeded && deadline_allowed && expected == Code::Ok {
        return;
    }
    assert_eq!(code, expected, "{situation:?}: {result:?} for {req:?}");
    let Ok(explained) = result else { return };
    check_explanation(&req, &explained);
    // The answer to the same request (no fallback, no deadline) holds exactly the posts
    // explained as returned, at their positions.
    if uses_fallback || explained.timed_out {
        return;
    }
    let answer = handle_request(&store(), &inner).expect("valid when explained");
    assert_eq!(explained.returned as usize, answer.posts.len());
    for post in &explained.posts {
        let verdict = post.verdict.unwrap_or_default();
        let at = answer
            .posts
            .iter()
            .position(|p| p.post_id as u64 == post.post_id);
        if verdict.reason() == Reason::Returned {
            assert_eq!(at.map(|i| i as u32 + 1), verdict.position, "{post:?}");
        } else {
            assert_eq!(at, None, "in the answer but {post:?}");
        }
    }
}

/// Every asked post has an explanation, in order, with a verdict.
fn check_explanation(req: &ExplainPostRequest, explained: &ExplainPostResponse) {
    let ids: Vec<u64> = explained.posts.iter().map(|p| p.post_id).collect();
    assert_eq!(ids, req.post_ids, "not one explanation per post, in order");
    for post in &explained.posts {
        let reason = post.verdict.as_ref().map(|v| v.reason());
        assert!(
            reason.is_some_and(|r| r != Reason::Unspecified),
            "no verdict: {post:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let [control, header_len, rest @ ..] = data else {
        return;
    };
    let header_len = usize::from(header_len % 16).min(rest.len());
    let (header, body) = rest.split_at(header_len);
    let situation = Situation::from_byte(*control);
    if control & 0x08 != 0 {
        return explain_case(*control, situation, timeout_header(header), body);
    }
    // The server's codec decodes as prost does: the same request, or an error where prost
    // errs (tonic then answers INTERNAL itself, before the service runs).
    let decoded = decode_request(body);
    let Ok(mut req) = GetInNetworkPostsRequest::decode(body) else {
        assert!(
            decoded.is_err(),
            "prost refuses what the codec took: {decoded:?}"
        );
        return;
    };
    assert_eq!(
        decoded.as_ref(),
        Ok(&req),
        "the codec decoded otherwise than prost"
    );
    tweak(*control, &mut req);
    let timeout = timeout_header(header);
    let invalid = has_invalid_id(&req) || has_invalid_extension(&req);
    let uses_fallback =
        situation.via_service && situation.fallback != 0 && req.following_user_ids.is_empty();
    let expected = expected_code(situation, invalid, uses_fallback);
    let deadline_set = has_deadline(timeout.as_ref());
    let result = serve(situation, timeout, req.clone());
    let code = result
        .as_ref()
        .map_or_else(tonic::Status::code, |_| Code::Ok);
    if code == Code::DeadlineExceeded
        && situation.via_service
        && deadline_set
        && expected == Code::Ok
    {
        return;
    }
    assert_eq!(code, expected, "{situation:?}: {result:?} for {req:?}");
    let Ok((posts, next_cursor)) = result else {
        return;
    };

    let mut validated = ValidatedRequest::from_request(&req).expect("valid when answered OK");
    if uses_fallback {
        validated.set_authors(FALLBACK_AUTHORS.to_vec());
    }
    assert!(
        posts.len() <= validated.query.max_results,
        "{} posts for {validated:?}",
        posts.len()
    );
    assert!(
        posts
            .windows(2)
            .all(|w| (w[0].created_at, w[0].post_id) > (w[1].created_at, w[1].post_id)),
        "not in the answer order (newest first, larger id first): {posts:?}"
    );
    let query = &validated.query;
    if !next_cursor.is_empty() {
        let next = CursorKey::global()
            .open(&next_cursor)
            .expect("the server accepts its own next_cursor");
        if let Some(start) = validated.cursor {
            assert_eq!(
                next.as_of_secs, start.as_of_secs,
                "a later page moved as_of"
            );
        }
    }
    for post in &posts {
        assert!(
            query.authors.contains(&post.author_id),
            "{post:?} not asked for: {validated:?}"
        );
        assert!(
            !BLACKLISTED_AUTHORS.contains(&post.author_id),
            "blacklisted author served: {post:?}"
        );
        assert!(
            !query.exclude.contains(&post.post_id),
            "excluded post served: {post:?}"
        );
        assert!(
            !(post.is_retweet && post.source_user_id == Some(query.viewer_id)),
            "the viewer's own repost served: {post:?}"
        );
        assert!(
            NOW_SECS - post.created_at <= 3600,
            "expired post served: {post:?}"
        );
        assert!(
            query
                .seen
                .as_ref()
                .is_none_or(|f| !f.contains(post.post_id)),
            "a post in the seen filter served: {post:?}"
        );
        assert!(
            query
                .window
                .min_created_at
                .is_none_or(|min| post.created_at >= min)
                && query
                    .window
                    .max_created_at
                    .is_none_or(|max| post.created_at <= max),
            "outside the time bounds {:?}: {post:?}",
            query.window
        );
        assert!(
            query.window.admits(post.created_at, post.post_id),
            "not after the cursor {:?}: {post:?}",
            query.window.after
        );
        if query.videos {
            assert!(
                !post.is_reply && (post.has_video || post.is_retweet),
                "not a video: {post:?}"
            );
        }
    }
});
