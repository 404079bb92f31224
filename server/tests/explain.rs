//! `thunder.v1.InNetworkPostsDebugService/ExplainPost` over gRPC (reflection lists it:
//! `health.rs`): the verdicts and figures of a small store, the server's own verdicts (blacklisted authors, the
//! seen filter's false positives), its refusals, and its admission (the queries' QPS limit) and
//! count (`explain_requests_total`, apart from the queries'). No test here calls
//! `GetInNetworkPosts` except the admission one, which counts on that.

use thunder_engine::{DeleteEvent, LightPost};
use thunder_proto::in_network_posts_debug_service_client::InNetworkPostsDebugServiceClient;
use thunder_proto::{
    ExplainPostRequest, ExplainPostResponse, GetInNetworkPostsRequest, PerAuthorLimits,
    PostExplanation, PostState, Reason, SeenFilter as WireSeenFilter, Timeline,
};
use thunder_server::ServerOptions;
use thunder_server::serve::request::BLACKLISTED_AUTHORS;
use thunder_testbed::{NOW, TestServer, original, request, store};
use tonic::transport::Channel;

const VIEWER: u64 = 1;

async fn explain(
    client: &mut InNetworkPostsDebugServiceClient<Channel>,
    request: GetInNetworkPostsRequest,
    post_ids: &[u64],
) -> Result<ExplainPostResponse, tonic::Status> {
    client
        .explain_post(ExplainPostRequest {
            request: Some(request),
            post_ids: post_ids.to_vec(),
            seen_post_ids: Vec::new(),
        })
        .await
        .map(tonic::Response::into_inner)
}

fn reason(post: &PostExplanation) -> Reason {
    post.verdict
        .as_ref()
        .map_or(Reason::Unspecified, |v| v.reason())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_and_their_figures() {
    let store = store();
    let mut posts: Vec<LightPost> = (1..=60).map(|i| original(i, 7, 1000 - i)).collect();
    posts.push(original(100, 8, 5));
    posts.push(original(200, BLACKLISTED_AUTHORS[0], 5));
    store.insert_posts(&posts);
    store.mark_as_deleted(&[DeleteEvent {
        post_id: 100,
        deleted_at: NOW,
    }]);
    let server = TestServer::ready(store).await;
    let mut client = InNetworkPostsDebugServiceClient::new(server.channel().await);
    let mut asked = request(&[7, 8, 7, BLACKLISTED_AUTHORS[0] as u64]);
    asked.user_id = VIEWER;
    asked.max_results = 30;
    asked.per_author_limits = Some(PerAuthorLimits {
        max_posts_per_author: Some(40),
        max_replies_reposts_per_author: None,
    });
    let response = explain(&mut client, asked, &[60, 25, 20, 5, 100, 200, 999])
        .await
        .expect("explained");
    assert_eq!(response.returned, 30);
    assert_eq!(response.max_results, 30);
    assert_eq!(
        response.following_count, 2,
        "the blacklisted author is not read"
    );
    let [
        newest,
        cut,
        capped_early,
        capped,
        deleted,
        blacklisted,
        unknown,
    ] = &response.posts[..]
    else {
        panic!("{response:?}");
    };
    let newest_verdict = newest.verdict.unwrap_or_default();
    assert_eq!(reason(newest), Reason::Returned);
    assert_eq!(
        (newest_verdict.position, newest_verdict.page_size),
        (Some(1), Some(30))
    );
    assert_eq!(newest.state(), PostState::Stored);
    assert_eq!(newest.timelines[0].timeline(), Timeline::Originals);
    assert_eq!(
        (newest.timelines[0].position, newest.timelines[0].length),
        (1, 60)
    );
    // Post 25: the 36th newest, a candidate past max_results.
    let cut_verdict = cut.verdict.unwrap_or_default();
    assert_eq!(reason(cut), Reason::CutByMaxResults);
    assert_eq!((cut_verdict.rank, cut_verdict.limit), (Some(36), Some(30)));
    // Posts 20 and 5: past the cap of 40 originals.
    for (post, newer) in [(capped_early, 40), (capped, 55)] {
        let verdict = post.verdict.unwrap_or_default();
        assert_eq!(reason(post), Reason::PerAuthorCap);
        assert_eq!(verdict.limit, Some(40));
        assert_eq!(verdict.newer_entries, Some(newer));
        assert_eq!(verdict.timeline(), Timeline::Originals);
        assert!(!verdict.degraded);
    }
    assert_eq!(
        (deleted.state(), reason(deleted)),
        (PostState::Deleted, Reason::Deleted)
    );
    assert_eq!(reason(blacklisted), Reason::AuthorBlacklisted);
    assert_eq!(
        (unknown.state(), reason(unknown)),
        (PostState::NeverSeen, Reason::NeverSeen)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seen_filter_hit_says_whether_it_is_a_false_positive() {
    let store = store();
    store.insert_posts(&(1..=3).map(|i| original(i, 7, 10 + i)).collect::<Vec<_>>());
    let server = TestServer::ready(store).await;
    let mut client = InNetworkPostsDebugServiceClient::new(server.channel().await);
    // One block with every bit set: the filter holds every id.
    let mut asked = request(&[7]);
    asked.seen_filter = Some(WireSeenFilter {
        format: 1,
        seed: 0,
        num_blocks: 1,
        bits: vec![0xff; 32],
    });
    let response = client
        .explain_post(ExplainPostRequest {
            request: Some(asked),
            post_ids: vec![1, 2],
            seen_post_ids: vec![2],
        })
        .await
        .expect("explained")
        .into_inner();
    let verdicts: Vec<_> = response
        .posts
        .iter()
        .map(|p| {
            let v = p.verdict.unwrap_or_default();
            (v.reason(), v.false_positive)
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            (Reason::SeenFilter, Some(true)),
            (Reason::SeenFilter, Some(false))
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_explain_requests_are_invalid_arguments() {
    let server = TestServer::ready(store()).await;
    let mut client = InNetworkPostsDebugServiceClient::new(server.channel().await);
    let cases: [(ExplainPostRequest, &str); 6] = [
        (
            ExplainPostRequest {
                request: None,
                post_ids: vec![1],
                seen_post_ids: vec![],
            },
            "request: missing",
        ),
        (
            ExplainPostRequest {
                request: Some(request(&[7])),
                post_ids: vec![],
                seen_post_ids: vec![],
            },
            "post_ids: empty",
        ),
        (
            ExplainPostRequest {
                request: Some(request(&[7])),
                post_ids: (1..=101).collect(),
                seen_post_ids: vec![],
            },
            "post_ids: 101 ids, more than the limit of 100",
        ),
        (
            ExplainPostRequest {
                request: Some(request(&[7])),
                post_ids: vec![1, 0],
                seen_post_ids: vec![],
            },
            "post_ids: id 0 is not an id",
        ),
        (
            ExplainPostRequest {
                request: Some(request(&[7])),
                post_ids: vec![1],
                seen_post_ids: vec![u64::MAX],
            },
            "seen_post_ids: id 18446744073709551615 exceeds the int64 range",
        ),
        (
            ExplainPostRequest {
                request: Some(GetInNetworkPostsRequest {
                    min_created_at: Some(10),
                    max_created_at: Some(9),
                    ..request(&[7])
                }),
                post_ids: vec![1],
                seen_post_ids: vec![],
            },
            "min_created_at: 10 is after max_created_at 9",
        ),
    ];
    for (asked, message) in cases {
        let status = client.explain_post(asked).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{message}");
        assert!(
            status.message().starts_with(message),
            "{message:?} vs {:?}",
            status.message()
        );
    }
    // At the limit: fine.
    explain(&mut client, request(&[7]), &(1..=100).collect::<Vec<_>>())
        .await
        .expect("100 ids are explained");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shares_the_qps_limit_and_is_counted_apart() {
    // One call per second, burst one: the query takes the quota, the explain after it is
    // refused.
    let options = ServerOptions {
        qps_limit: 1,
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store(), None).await;
    server.running().readiness().set_ready().await;
    let mut queries = server.client().await;
    let mut explains = InNetworkPostsDebugServiceClient::new(server.channel().await);
    let mut refused = None;
    let mut queries_made = 0;
    for _ in 0..50 {
        queries.get_in_network_posts(request(&[7])).await.ok();
        queries_made += 1;
        if let Err(status) = explain(&mut explains, request(&[7]), &[1]).await {
            refused = Some(status);
            break;
        }
    }
    let status = refused.expect("an explain was refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(status.message(), "QPS rate limit exceeded, please retry");

    let metrics = server.admin_get("/metrics").await.text();
    let count = |name: &str, status: &str| {
        thunder_testbed::metrics::in_text(&metrics, name, &[("status", status)]).unwrap_or(0.0)
    };
    let explains = count("explain_requests_total", "ok")
        + count("explain_requests_total", "resource_exhausted");
    assert!(explains >= f64::from(queries_made), "{metrics}");
    // No other test of this binary calls GetInNetworkPosts: every one counted is this test's
    // query, none an explain.
    let queries_counted = count("get_in_network_posts_requests_total", "ok")
        + count("get_in_network_posts_requests_total", "resource_exhausted");
    assert_eq!(queries_counted, f64::from(queries_made), "{metrics}");
}
