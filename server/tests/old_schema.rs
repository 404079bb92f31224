//! Backward compatibility of the contract extensions: a request encoded with the reference
//! schema (fields 1-8 only, none of `seen_filter`, `cursor`, `min_created_at`,
//! `max_created_at`) is answered exactly as before they existed.
//!
//! `tests/fixtures/old_schema_responses.txt` holds the encoded responses of the build before
//! the extensions (commit 95f33e7) to the requests below, over the same store. They were
//! written by running this file there with `THUNDER_WRITE_OLD_SCHEMA_GOLDEN=1`. Every post
//! in the store has its own `created_at`: the order among equal timestamps was unspecified
//! then (it is by descending post id now), so ties are left out of this comparison.

use std::fmt::Write as _;
use std::sync::Arc;

use prost::Message;
use thunder_engine::{DeleteEvent, LightPost, ManualClock, PostStore};

const NOW: i64 = 1_700_000_000;
const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/old_schema_responses.txt"
);

/// `GetInNetworkPostsRequest` as the reference contract declares it.
#[derive(Clone, PartialEq, prost::Message)]
struct OldRequest {
    #[prost(uint64, tag = "1")]
    user_id: u64,
    #[prost(uint64, repeated, tag = "2")]
    following_user_ids: Vec<u64>,
    #[prost(uint32, tag = "3")]
    max_results: u32,
    #[prost(uint64, repeated, tag = "4")]
    exclude_tweet_ids: Vec<u64>,
    #[prost(string, tag = "5")]
    algorithm: String,
    #[prost(bool, tag = "6")]
    debug: bool,
    #[prost(bool, tag = "7")]
    is_video_request: bool,
    #[prost(message, optional, tag = "8")]
    per_author_limits: Option<OldLimits>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OldLimits {
    #[prost(uint32, optional, tag = "1")]
    max_posts_per_author: Option<u32>,
    #[prost(uint32, optional, tag = "2")]
    max_replies_reposts_per_author: Option<u32>,
}

/// `GetInNetworkPostsResponse` as the reference contract declares it (posts kept encoded).
#[derive(Clone, PartialEq, prost::Message)]
struct OldResponse {
    #[prost(bytes = "vec", repeated, tag = "1")]
    posts: Vec<Vec<u8>>,
}

/// 30 authors, 80 posts each with distinct timestamps: originals, replies (to originals and
/// to replies), reposts, videos, and a few deletes.
fn fixture_store() -> Arc<PostStore> {
    let store = Arc::new(PostStore::with_clock(
        thunder_engine::config::DEFAULT_RETENTION_SECS,
        Arc::new(ManualClock::new(NOW)),
    ));
    let id = |author: i64, i: i64| author * 1000 + i;
    let mut posts = Vec::new();
    for author in 1..=30i64 {
        for i in 0..80i64 {
            let created_at = NOW - (i * 31 + author) * 60;
            let other = (author % 30) + 1;
            let mut post = LightPost::original(id(author, i), author, created_at);
            match i % 6 {
                1 => {
                    post.is_reply = true;
                    post.in_reply_to_post_id = Some(id(other, i + 1));
                    post.in_reply_to_user_id = Some(other);
                    post.conversation_id = Some(id(other, i + 1));
                }
                2 => {
                    post.is_reply = true;
                    post.in_reply_to_post_id = Some(id(other, i));
                    post.in_reply_to_user_id = Some(other);
                    post.conversation_id = Some(id(other, i + 2));
                }
                3 => {
                    post.is_retweet = true;
                    post.source_post_id = Some(id(other, i + 3));
                    post.source_user_id = Some(other);
                }
                _ => post.has_video = i % 4 == 0,
            }
            posts.push(post);
        }
    }
    store.insert_posts(&posts);
    let deletes: Vec<DeleteEvent> = (1..=30)
        .map(|author| DeleteEvent {
            post_id: id(author, author % 7),
            deleted_at: NOW,
        })
        .collect();
    store.mark_as_deleted(&deletes);
    store
}

fn cases() -> Vec<(&'static str, OldRequest)> {
    let all: Vec<u64> = (1..=30).collect();
    let base = OldRequest {
        user_id: 999,
        following_user_ids: all.clone(),
        ..OldRequest::default()
    };
    vec![
        ("default", base.clone()),
        (
            "exclude",
            OldRequest {
                exclude_tweet_ids: (0..40).map(|i| 1000 + i * 25).collect(),
                ..base.clone()
            },
        ),
        (
            "cut",
            OldRequest {
                max_results: 37,
                ..base.clone()
            },
        ),
        (
            "limits",
            OldRequest {
                per_author_limits: Some(OldLimits {
                    max_posts_per_author: Some(3),
                    max_replies_reposts_per_author: Some(0),
                }),
                ..base.clone()
            },
        ),
        (
            "replies_only",
            OldRequest {
                per_author_limits: Some(OldLimits {
                    max_posts_per_author: Some(0),
                    max_replies_reposts_per_author: Some(5),
                }),
                following_user_ids: all[..12].to_vec(),
                ..base.clone()
            },
        ),
        (
            "video",
            OldRequest {
                is_video_request: true,
                ..base.clone()
            },
        ),
        (
            "self_reposts",
            OldRequest {
                user_id: 7,
                algorithm: "latest".into(),
                ..base.clone()
            },
        ),
        (
            "empty_following",
            OldRequest {
                following_user_ids: Vec::new(),
                ..base
            },
        ),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The response to the old-schema encoding of `req`, re-encoded with the old schema (fields
/// an old client does not know are dropped, as its decoder drops them), and the raw bytes.
fn answer(store: &PostStore, req: &OldRequest) -> (Vec<u8>, Vec<u8>) {
    let wire = req.encode_to_vec();
    let decoded = thunder_proto::GetInNetworkPostsRequest::decode(wire.as_slice())
        .expect("an old request decodes");
    let response = thunder_server::handle_request(store, &decoded).expect("answered");
    let raw = response.encode_to_vec();
    let old = OldResponse::decode(raw.as_slice()).expect("an old client decodes it");
    (old.encode_to_vec(), raw)
}

#[test]
fn old_schema_requests_are_answered_exactly_as_before() {
    let store = fixture_store();
    let mut lines = Vec::new();
    for (name, req) in cases() {
        let (old, _) = answer(&store, &req);
        lines.push(format!("{name} {}", hex(&old)));
    }
    if std::env::var_os("THUNDER_WRITE_OLD_SCHEMA_GOLDEN").is_some() {
        std::fs::write(GOLDEN, lines.join("\n") + "\n").expect("golden written");
        return;
    }
    let golden = std::fs::read_to_string(GOLDEN).expect("golden file");
    let golden: Vec<&str> = golden.lines().collect();
    assert_eq!(golden.len(), lines.len(), "one golden line per case");
    for (line, expected) in lines.iter().zip(&golden) {
        let name = line.split(' ').next().unwrap_or_default();
        assert!(
            line == expected,
            "case {name}: the answer differs from the build before the extensions"
        );
    }
}

#[test]
fn old_schema_requests_leave_every_extension_unset() {
    let store = fixture_store();
    for (name, req) in cases() {
        let decoded =
            thunder_proto::GetInNetworkPostsRequest::decode(req.encode_to_vec().as_slice())
                .expect("decodes");
        assert!(decoded.seen_filter.is_none(), "{name}");
        assert!(decoded.cursor.is_empty(), "{name}");
        assert_eq!(decoded.min_created_at, None, "{name}");
        assert_eq!(decoded.max_created_at, None, "{name}");
        let (old, raw) = answer(&store, &req);
        let new =
            thunder_proto::GetInNetworkPostsResponse::decode(raw.as_slice()).expect("decodes");
        if new.next_cursor.is_empty() {
            assert_eq!(raw, old, "{name}: nothing beyond the old fields is sent");
        } else {
            // Only a full page offers a cursor (field 2), which old clients skip.
            let page = match (req.max_results, req.is_video_request) {
                (0, false) => 1200,
                (0, true) => 600,
                (n, _) => n as usize,
            };
            assert_eq!(new.posts.len(), page, "{name}: a cursor on a short page");
        }
    }
}
