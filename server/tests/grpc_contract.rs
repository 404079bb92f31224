//! The RPC contract over real gRPC: field round trip, defaults and clamps, input rules,
//! INVALID_ARGUMENT paths, compression, the follow-graph fallback and deadlines.

use std::sync::Arc;
use std::time::Duration;

use thunder_engine::LightPost;
use thunder_events::wire as convert;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_proto::{GetInNetworkPostsRequest, PerAuthorLimits};
use thunder_server::ServerOptions;
use thunder_server::serve::following::{FollowingSource, StaticFollowing};
use thunder_server::serve::request::{BLACKLISTED_AUTHORS, MAX_RESULTS_LIMIT};
use thunder_testbed::{NOW, TestServer, original, request, store};
use tonic::codec::CompressionEncoding;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_round_trips() {
    let store = store();
    let parent = original(100, 10, 300);
    let reply = LightPost {
        post_id: 101,
        author_id: 10,
        created_at: NOW - 200,
        in_reply_to_post_id: Some(100),
        in_reply_to_user_id: Some(10),
        is_retweet: false,
        is_reply: true,
        source_post_id: None,
        source_user_id: None,
        has_video: true,
        conversation_id: Some(100),
    };
    let repost = LightPost {
        post_id: 102,
        author_id: 11,
        created_at: NOW - 100,
        is_retweet: true,
        source_post_id: Some(100),
        source_user_id: Some(10),
        ..LightPost::default()
    };
    let report = store.insert_posts(&[parent, reply, repost]);
    assert_eq!(report.inserted, 3, "{report:?}");
    let server = TestServer::ready(store).await;
    let mut client = server.client().await;

    let posts = client
        .get_in_network_posts(request(&[10, 11]))
        .await
        .expect("served")
        .into_inner()
        .posts;
    let expected: Vec<_> = [repost, reply, parent]
        .iter()
        .map(convert::post_to_proto)
        .collect();
    assert_eq!(posts, expected);
    let back: Vec<LightPost> = posts.iter().map(convert::post_from_proto).collect();
    assert_eq!(back, vec![repost, reply, parent]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_and_clamps() {
    let store = store();
    // Author 20: 60 originals; authors 1000..1250: 50 originals each (12 500 posts).
    let mut posts: Vec<LightPost> = (0..60).map(|i| original(20_000 + i, 20, 1 + i)).collect();
    for author in 1000..1250 {
        posts.extend((0..50).map(|i| original(author * 1000 + i, author, 10 + i)));
    }
    // Authors 30..40: 120 video originals each.
    for author in 30..40 {
        posts.extend((0..120).map(|i| LightPost {
            has_video: true,
            ..original(author * 1_000_000 + i, author, 5 + i)
        }));
    }
    let report = store.insert_posts(&posts);
    assert_eq!(report.inserted, posts.len(), "{report:?}");
    let server = TestServer::ready(store).await;
    let mut client = server.client().await;
    let mut count = async |req: GetInNetworkPostsRequest| -> usize {
        client
            .get_in_network_posts(req)
            .await
            .expect("served")
            .into_inner()
            .posts
            .len()
    };
    let limits = |originals: Option<u32>, secondary: Option<u32>| {
        Some(PerAuthorLimits {
            max_posts_per_author: originals,
            max_replies_reposts_per_author: secondary,
        })
    };

    // Per-author cap: 50 by default, requests above it are clamped, below it honoured.
    assert_eq!(count(request(&[20])).await, 50);
    let req = GetInNetworkPostsRequest {
        per_author_limits: limits(Some(100), None),
        ..request(&[20])
    };
    assert_eq!(count(req).await, 50);
    let req = GetInNetworkPostsRequest {
        per_author_limits: limits(Some(3), Some(100)),
        ..request(&[20])
    };
    assert_eq!(count(req).await, 3);
    let req = GetInNetworkPostsRequest {
        per_author_limits: limits(Some(0), Some(0)),
        ..request(&[20])
    };
    assert_eq!(count(req).await, 0);

    // max_results: 1200 by default, honoured up to the documented bound, clamped above it.
    let many: Vec<u64> = (1000..1250).collect();
    assert_eq!(count(request(&many)).await, 1200);
    let req = GetInNetworkPostsRequest {
        max_results: 7,
        ..request(&many)
    };
    assert_eq!(count(req).await, 7);
    let req = GetInNetworkPostsRequest {
        max_results: u32::MAX,
        ..request(&many)
    };
    assert_eq!(count(req).await, MAX_RESULTS_LIMIT);

    // Video: 600 by default, 100 per author whatever per_author_limits says.
    let video_authors: Vec<u64> = (30..40).collect();
    let req = GetInNetworkPostsRequest {
        is_video_request: true,
        ..request(&video_authors)
    };
    assert_eq!(count(req).await, 600);
    let req = GetInNetworkPostsRequest {
        is_video_request: true,
        per_author_limits: limits(Some(1), Some(0)),
        ..request(&[30])
    };
    assert_eq!(count(req).await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_rules() {
    let store = store();
    let blacklisted = BLACKLISTED_AUTHORS[0];
    let report = store.insert_posts(&[
        original(1, 5, 10),
        original(2, 5, 20),
        original(3, 6, 30),
        original(4, blacklisted, 5),
    ]);
    assert_eq!(report.inserted, 4);
    let server = TestServer::ready(store).await;
    let mut client = server.client().await;
    let mut ids = async |req: GetInNetworkPostsRequest| -> Vec<i64> {
        let posts = client
            .get_in_network_posts(req)
            .await
            .expect("served")
            .into_inner()
            .posts;
        posts.iter().map(|p| p.post_id).collect()
    };

    // Duplicated authors are read once; blacklisted authors never.
    assert_eq!(
        ids(request(&[5, 6, 5, blacklisted as u64, 6])).await,
        vec![1, 2, 3]
    );
    // Excluded ids are skipped.
    let req = GetInNetworkPostsRequest {
        exclude_tweet_ids: vec![2],
        ..request(&[5, 6])
    };
    assert_eq!(ids(req).await, vec![1, 3]);
    // Every algorithm name is served newest first; unknown ones too.
    for algorithm in ["", "recent", "default", "latest", "no-such-algorithm"] {
        let req = GetInNetworkPostsRequest {
            algorithm: algorithm.into(),
            ..request(&[5, 6])
        };
        assert_eq!(ids(req).await, vec![1, 2, 3], "algorithm {algorithm:?}");
    }
    // Debug requests are served the same way.
    let req = GetInNetworkPostsRequest {
        debug: true,
        ..request(&[6])
    };
    assert_eq!(ids(req).await, vec![3]);
    // No following list and no fallback: an empty answer.
    assert_eq!(ids(request(&[])).await, Vec::<i64>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_beyond_int64_are_invalid_arguments() {
    let server = TestServer::ready(store()).await;
    let mut client = server.client().await;
    let cases = [
        GetInNetworkPostsRequest {
            user_id: u64::MAX,
            ..request(&[1])
        },
        request(&[1, 1 << 63]),
        GetInNetworkPostsRequest {
            exclude_tweet_ids: vec![u64::MAX],
            ..request(&[1])
        },
    ];
    for req in cases {
        let status = client
            .get_in_network_posts(req.clone())
            .await
            .expect_err("refused");
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{req:?}: {status:?}"
        );
        assert!(status.message().contains("int64"), "{}", status.message());
    }
    // The largest valid id is accepted.
    let req = GetInNetworkPostsRequest {
        user_id: i64::MAX as u64,
        ..request(&[i64::MAX as u64])
    };
    assert!(client.get_in_network_posts(req).await.is_ok());
}

/// Id 0 is no id: a followed author 0 or an excluded post 0 is refused like an id out of range,
/// and so is viewer 0 without a following list (no one to look up). Viewer 0 with a following
/// list is the reference's popular-posts job and stays served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_0_are_invalid_arguments() {
    let store = store();
    store.insert_posts(&[original(1, 5, 10)]);
    let server = TestServer::ready(store).await;
    let mut client = server.client().await;
    let cases = [
        (request(&[5, 0]), "following_user_ids"),
        (
            GetInNetworkPostsRequest {
                exclude_tweet_ids: vec![0],
                ..request(&[5])
            },
            "exclude_tweet_ids",
        ),
        (
            GetInNetworkPostsRequest {
                user_id: 0,
                ..request(&[])
            },
            "user_id",
        ),
    ];
    for (req, field) in cases {
        let status = client
            .get_in_network_posts(req.clone())
            .await
            .expect_err("refused");
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{req:?}: {status:?}"
        );
        assert!(
            status.message().starts_with(field) && status.message().contains("id 0"),
            "{}",
            status.message()
        );
    }
    let popular = GetInNetworkPostsRequest {
        user_id: 0,
        ..request(&[5])
    };
    let posts = client
        .get_in_network_posts(popular)
        .await
        .expect("served")
        .into_inner()
        .posts;
    assert_eq!(posts.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_and_gzip_are_accepted_and_sent() {
    let store = store();
    let posts: Vec<LightPost> = (0..40).map(|i| original(500 + i, 7, 1 + i)).collect();
    store.insert_posts(&posts);
    let server = TestServer::ready(store).await;
    for encoding in [CompressionEncoding::Zstd, CompressionEncoding::Gzip] {
        let mut client = InNetworkPostsServiceClient::new(server.channel().await)
            .send_compressed(encoding)
            .accept_compressed(encoding);
        let response = client
            .get_in_network_posts(request(&[7]))
            .await
            .expect("served");
        let sent = response
            .metadata()
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        assert_eq!(sent.as_deref(), Some(encoding.to_string().as_str()));
        assert_eq!(response.into_inner().posts.len(), 40);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_refused() {
    let options = ServerOptions {
        max_decoding_message_bytes: 1024,
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store(), None).await;
    let mut client = server.client().await;
    let ids: Vec<u64> = (1_000_000..1_001_000).collect();
    let status = client
        .get_in_network_posts(request(&ids))
        .await
        .expect_err("too large");
    // gRPC convention for a message above the limit (tonic itself says OUT_OF_RANGE).
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(client.get_in_network_posts(request(&[1])).await.is_ok());
}

#[derive(Debug)]
struct FailingFollowing;

#[tonic::async_trait]
impl FollowingSource for FailingFollowing {
    async fn fetch_following_list(&self, _user_id: i64, _limit: usize) -> Result<Vec<i64>, String> {
        Err("graph service unavailable".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_following_uses_the_configured_fallback() {
    let store = store();
    store.insert_posts(&[original(1, 5, 10), original(2, 6, 20), original(3, 7, 5)]);
    let graph = StaticFollowing::new([(1, vec![5, 6])].into_iter().collect());
    let server = TestServer::start(
        ServerOptions::default(),
        Arc::clone(&store),
        Some(Arc::new(graph)),
    )
    .await;
    let mut client = server.client().await;
    for debug in [false, true] {
        let req = GetInNetworkPostsRequest {
            debug,
            ..request(&[])
        };
        let posts = client
            .get_in_network_posts(req)
            .await
            .expect("served")
            .into_inner()
            .posts;
        let ids: Vec<i64> = posts.iter().map(|p| p.post_id).collect();
        assert_eq!(ids, vec![1, 2], "debug={debug}");
    }
    // A non-empty following list does not consult the fallback.
    let posts = client
        .get_in_network_posts(request(&[7]))
        .await
        .expect("served")
        .into_inner()
        .posts;
    assert_eq!(posts.len(), 1);

    let failing = TestServer::start(
        ServerOptions::default(),
        store,
        Some(Arc::new(FailingFollowing)),
    )
    .await;
    let mut client = failing.client().await;
    let status = client
        .get_in_network_posts(request(&[]))
        .await
        .expect_err("fails");
    assert_eq!(status.code(), tonic::Code::Internal);
    assert_eq!(
        status.message(),
        "Failed to fetch following list: graph service unavailable"
    );
    assert!(client.get_in_network_posts(request(&[7])).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_deadline_returns_a_partial_answer() {
    let store = store();
    let mut posts = Vec::new();
    for author in 0..200 {
        posts.extend((0..20).map(|i| original(author * 100 + i + 1, author + 1, 1 + i)));
    }
    store.insert_posts(&posts);
    let authors: Vec<u64> = (1..=200).collect();
    let full = TestServer::ready(Arc::clone(&store)).await;
    let all = full
        .client()
        .await
        .get_in_network_posts(request(&authors))
        .await
        .expect("served");
    let all: Vec<i64> = all.into_inner().posts.iter().map(|p| p.post_id).collect();
    assert_eq!(all.len(), 1200);

    let options = ServerOptions {
        request_timeout: Some(Duration::from_nanos(1)),
        ..ServerOptions::default()
    };
    let hurried = TestServer::start(options, store, None).await;
    let mut client = hurried.client().await;
    let partial = client
        .get_in_network_posts(request(&authors))
        .await
        .expect("served, maybe partially");
    let posts = partial.into_inner().posts;
    assert!(
        posts.windows(2).all(|w| w[0].created_at >= w[1].created_at),
        "newest first"
    );
    let complete: std::collections::HashSet<i64> = (1..=200)
        .flat_map(|a| (0..20).map(move |i| (a - 1) * 100 + i + 1))
        .collect();
    assert!(posts.iter().all(|p| complete.contains(&p.post_id)));

    // The client's own grpc-timeout is honoured as well: a generous one is served in full.
    let mut req = tonic::Request::new(request(&authors));
    req.set_timeout(Duration::from_secs(60));
    let served = full
        .client()
        .await
        .get_in_network_posts(req)
        .await
        .expect("served");
    assert_eq!(served.into_inner().posts.len(), 1200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_qps_limit_is_refused_at_start() {
    let options = ServerOptions {
        qps_limit: 0,
        ..ServerOptions::default()
    };
    let err = thunder_server::start(options, store(), None)
        .await
        .expect_err("refused");
    assert!(
        err.to_string()
            .contains("--qps-limit must be greater than 0"),
        "{err}"
    );
}
