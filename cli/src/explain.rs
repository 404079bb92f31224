//! `thunder-cli explain`: one ExplainPost call ("why did, or didn't, this viewer get these
//! posts?"), printed one line per post (the verdict, then its figures, then what the store
//! holds of the post) or as the proto3 JSON grpcurl prints.

use tonic::codec::CompressionEncoding;

use thunder_proto::in_network_posts_debug_service_client::InNetworkPostsDebugServiceClient;
use thunder_proto::{
    ExplainPostRequest, ExplainPostResponse, LightPost, PostExplanation, PostState, Reason,
    Timeline, TimelinePlace, Verdict,
};

use crate::request::RequestArgs;

/// Flags of `thunder-cli explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    request: RequestArgs,
    /// Post ids to explain, comma-separated or repeated (at most 100).
    #[arg(long = "post", value_delimiter = ',', required = true)]
    posts: Vec<u64>,
    /// Print the response as JSON (the proto3 JSON mapping, as grpcurl prints it).
    #[arg(long)]
    json: bool,
}

/// Asks the server and prints the explanation.
pub async fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let tls = args.request.tls_settings()?;
    let mut client =
        InNetworkPostsDebugServiceClient::new(args.request.connect(tls.as_ref()).await?)
            .accept_compressed(CompressionEncoding::Zstd)
            .send_compressed(CompressionEncoding::Zstd);
    let request = ExplainPostRequest {
        request: Some(args.request.request()?),
        post_ids: args.posts,
        // The ids the seen filter is built from: a hit on another id is a false positive.
        seen_post_ids: args.request.seen_ids.iter().map(|&id| id as u64).collect(),
    };
    let response = match client.explain_post(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return Err(args.request.call_failed(status, tls.as_ref()).await),
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&response)?);
    } else {
        print_explanation(args.request.user, &response);
    }
    Ok(())
}

/// The header line, then one line per post.
fn print_explanation(viewer: u64, response: &ExplainPostResponse) {
    let source = if response.following_from_graph {
        " (from the follow graph)"
    } else {
        ""
    };
    let timed_out = if response.timed_out {
        ", out of time"
    } else {
        ""
    };
    outln!(
        "viewer {viewer}: {} followed authors{source}, max_results {}, {} returned{timed_out}, \
         degrade level {}, as of {}",
        response.following_count,
        response.max_results,
        response.returned,
        response.degrade_level,
        response.as_of,
    );
    for post in &response.posts {
        outln!(
            "{}  {}  [{}]",
            post.post_id,
            verdict_text(post, response.degrade_level),
            state_text(post)
        );
    }
}

/// The verdict and its figures, in words.
fn verdict_text(post: &PostExplanation, degrade_level: u32) -> String {
    let default = Verdict::default();
    let v = post.verdict.as_ref().unwrap_or(&default);
    let n = |x: Option<u32>| x.map_or_else(|| "?".to_owned(), |x| x.to_string());
    let id = |x: Option<i64>| x.map_or_else(|| "?".to_owned(), |x| x.to_string());
    let author = post.post.as_ref().map_or(0, |p| p.author_id);
    let timeline = timeline_name(v.timeline());
    let text = match v.reason() {
        Reason::Returned => format!(
            "returned at position {} of {}",
            n(v.position),
            n(v.page_size)
        ),
        Reason::NeverSeen => {
            "never seen: not stored (never created, or gone past retention)".into()
        }
        Reason::Deleted => "deleted".into(),
        Reason::OtherShard => format!(
            "another author shard's post (this server is shard {})",
            post.shard
        ),
        Reason::AuthorNotFollowed => format!("author {author} is not in the following list"),
        Reason::AuthorBlacklisted => format!("author {author} is never served (blacklisted)"),
        Reason::AuthorDroppedByDegrade => format!(
            "author {author} is past the first {} authors read",
            n(v.limit)
        ),
        Reason::NotInTimeline => "in no timeline this question reads".into(),
        Reason::Expired => "expired (past retention)".into(),
        Reason::BeforeMinCreatedAt => format!("created before min_created_at {}", id(v.bound)),
        Reason::AfterMaxCreatedAt => format!(
            "created after {} (max_created_at, the cursor's clock or now)",
            id(v.bound)
        ),
        Reason::Excluded => "in exclude_tweet_ids".into(),
        Reason::SeenFilter => match v.false_positive {
            Some(true) => "in the seen filter: a false positive (not among --seen-ids)".into(),
            Some(false) => "in the seen filter (among --seen-ids)".into(),
            None => "in the seen filter".into(),
        },
        Reason::VideoRule => format!(
            "a repost whose source {} is no longer a video",
            id(v.source_post_id)
        ),
        Reason::ScanWindow => format!(
            "past the scan window: {} entries examined, {} newer entries in its {timeline} timeline",
            n(v.limit),
            n(v.newer_entries)
        ),
        Reason::ViewerOwnRepost => "a repost of the viewer's own post".into(),
        Reason::ReplyParentMissing => format!(
            "reply rule: its parent {} is not stored",
            id(v.parent_post_id)
        ),
        Reason::ReplyParentExpired => format!(
            "reply rule: its parent {} has expired",
            id(v.parent_post_id)
        ),
        Reason::ReplyConversationMismatch => format!(
            "reply rule: its parent {} is a reply in another conversation",
            id(v.parent_post_id)
        ),
        Reason::ReplyToUnfollowed => format!(
            "reply rule: it replies to {}, who is not in the following list",
            id(v.in_reply_to_user_id)
        ),
        Reason::PerAuthorCap => format!(
            "per-author cap: {} {timeline} per author came first ({} newer entries)",
            n(v.limit),
            n(v.newer_entries)
        ),
        Reason::BeforeCursor => "before the cursor: in an earlier page".into(),
        Reason::CutByMaxResults => format!(
            "cut by max_results: ranked {}, past {}",
            n(v.rank),
            n(v.limit)
        ),
        Reason::OutOfTime => "not reached: the query ran out of time".into(),
        Reason::RemovedDuringQuery => "removed while the query ran".into(),
        Reason::Unspecified => "no verdict".into(),
    };
    if v.degraded {
        format!("{text} (lowered by degrade level {degrade_level})")
    } else {
        text
    }
}

/// What the store holds of the post, in words.
fn state_text(post: &PostExplanation) -> String {
    let state = match post.state() {
        PostState::Stored => "stored",
        PostState::Expired => "stored, expired",
        PostState::Deleted => return "deleted".into(),
        PostState::NeverSeen => return "not stored".into(),
        PostState::OtherShard => return format!("another shard's (this is {})", post.shard),
        PostState::Unspecified => return "?".into(),
    };
    let Some(record) = &post.post else {
        return state.into();
    };
    let places: Vec<String> = post.timelines.iter().map(place_text).collect();
    format!(
        "{state}: author {}, {}, created_at {}; {}",
        record.author_id,
        kind(record),
        record.created_at,
        places.join(", ")
    )
}

fn kind(post: &LightPost) -> &'static str {
    match (post.is_reply, post.is_retweet, post.has_video) {
        (true, _, _) => "reply",
        (false, true, _) => "repost",
        (false, false, true) => "original with video",
        (false, false, false) => "original",
    }
}

fn place_text(place: &TimelinePlace) -> String {
    format!(
        "{} #{} of {}",
        timeline_name(place.timeline()),
        place.position,
        place.length
    )
}

fn timeline_name(timeline: Timeline) -> &'static str {
    match timeline {
        Timeline::Originals => "originals",
        Timeline::RepliesAndReposts => "replies+reposts",
        Timeline::Videos => "videos",
        Timeline::Unspecified => "?",
    }
}
