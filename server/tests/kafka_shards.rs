//! Author shards against a real broker: one full `thunder-server` and two `--shard I/2`
//! servers read the same topic; through `thunder-client`, the two shards give the full
//! server's answers (normal and video, with limits and exclusions, including the replies and
//! reposts whose parents and sources live on the other shard). With one shard killed, the
//! client returns the other shard's posts within the deadline, marked incomplete.

use std::time::{Duration, Instant};

use thunder_client::{ClientConfig, FeedAnswer, ThunderClient};
use thunder_engine::LightPost;
use thunder_proto::shard::shard_of;
use thunder_proto::{GetInNetworkPostsRequest, PerAuthorLimits};
use thunder_testbed::kafka::*;
use thunder_testbed::server_process::{ServerProcess, start_server, wait_serving};
use thunder_testkit::model::answers_agree;
use thunder_workload::SynthConfig;

/// Longer than the backlog's two days: nothing sits at the retention edge during the test.
const RETENTION_SECS: i64 = 3 * 24 * 3600;

/// A `thunder-server` reading `topic`, as a full replica (`shard: None`) or one author shard.
fn start_node(broker: &Broker, topic: &str, shard: Option<&str>) -> ServerProcess {
    let flags: &[&str] = match shard {
        Some(shard) => &["--shard", shard],
        None => &[],
    };
    start_server(&broker.bootstrap(), topic, RETENTION_SECS, flags)
}

fn posts(answer: &FeedAnswer) -> Vec<LightPost> {
    answer
        .posts
        .iter()
        .map(thunder_events::wire::post_from_proto)
        .collect()
}

/// The requests compared: every viewer, normal and video, with default and small limits.
fn requests(
    viewers: &[(i64, Vec<i64>)],
    events: &[thunder_engine::PostEvent],
) -> Vec<GetInNetworkPostsRequest> {
    let some_posts: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            thunder_engine::PostEvent::Create(p) => Some(p.post_id as u64),
            _ => None,
        })
        .step_by(7)
        .collect();
    let mut requests = Vec::new();
    for (i, (viewer, following)) in viewers.iter().enumerate() {
        let base = GetInNetworkPostsRequest {
            user_id: *viewer as u64,
            following_user_ids: following.iter().map(|&a| a as u64).collect(),
            ..Default::default()
        };
        requests.push(base.clone());
        requests.push(GetInNetworkPostsRequest {
            is_video_request: true,
            ..base.clone()
        });
        requests.push(GetInNetworkPostsRequest {
            max_results: 40 + i as u32 % 60,
            exclude_tweet_ids: some_posts.clone(),
            per_author_limits: Some(PerAuthorLimits {
                max_posts_per_author: Some(i as u32 % 4),
                max_replies_reposts_per_author: Some(1 + i as u32 % 3),
            }),
            ..base
        });
    }
    requests
}

#[test]
fn two_shards_answer_like_a_full_server_and_fail_open_without_one() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "sharded";
    create_topic(&broker.bootstrap(), topic, 4);
    let config = SynthConfig::feed_2d(2000, now);
    let events: Vec<_> = config.backlog().collect();
    let producer = producer(&broker.bootstrap(), topic);
    for event in &events {
        send(&producer, event);
    }
    flush(&producer, events.len() as u64);
    let viewers = viewers_for(&config, 40, &events);

    let full = start_node(&broker, topic, None);
    let shard0 = start_node(&broker, topic, Some("0/2"));
    let mut shard1 = start_node(&broker, topic, Some("1/2"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        for node in [&full, &shard0, &shard1] {
            wait_serving(node.grpc).await;
        }
        let client_config = ClientConfig {
            hedge_percentile: None,
            ..ClientConfig::default()
        };
        let replica =
            ThunderClient::replicas(&[full.grpc.to_string()], &client_config).expect("client");
        let sharded = ThunderClient::sharded(
            &[vec![shard0.grpc.to_string()], vec![shard1.grpc.to_string()]],
            &client_config,
        )
        .expect("client");
        let deadline = Duration::from_secs(10);
        let mut compared = 0;
        let mut cross_shard = 0;
        for request in requests(&viewers, &events) {
            let want = replica
                .get_in_network_posts(request.clone(), deadline)
                .await;
            let got = sharded
                .get_in_network_posts(request.clone(), deadline)
                .await;
            assert!(
                want.complete && got.complete,
                "{:?} {:?}",
                want.errors,
                got.errors
            );
            let max_results = thunder_client::effective_max_results(&request) as usize;
            if let Err(diff) = answers_agree(&posts(&got), &posts(&want), max_results) {
                panic!("request {request:?}: {diff}");
            }
            // The merge breaks ties as the store does (the larger post id first), and every
            // timeline is in `(created_at, post_id)` order on a shard as on a full replica
            // (which promotes a repost into videos when its source arrives, a shard at once):
            // the very same sequence, video answers included.
            assert_eq!(got.posts, want.posts, "request {request:?}: order");
            compared += usize::from(!want.posts.is_empty());
            // Replies and reposts whose parent or source author lives on the other shard.
            cross_shard += want
                .posts
                .iter()
                .filter(|p| {
                    let other = p.in_reply_to_user_id.or(p.source_user_id);
                    other.is_some_and(|o| shard_of(o, 2) != shard_of(p.author_id, 2))
                })
                .count();
        }
        assert!(compared >= 60, "only {compared} non-empty answers compared");
        assert!(
            cross_shard >= 50,
            "only {cross_shard} cross-shard posts returned"
        );

        // Shard 1 dies: shard 0's posts, within the deadline, marked incomplete.
        let _ = shard1.child.kill();
        let _ = shard1.child.wait();
        let only_shard0 =
            ThunderClient::replicas(&[shard0.grpc.to_string()], &client_config).expect("client");
        let budget = Duration::from_millis(500);
        let mut partial = 0;
        for request in requests(&viewers, &events).into_iter().take(30) {
            if sharded.shards_for(&request) != [0, 1] {
                continue;
            }
            let start = Instant::now();
            let got = sharded.get_in_network_posts(request.clone(), budget).await;
            let took = start.elapsed();
            assert!(took < budget + Duration::from_millis(300), "took {took:?}");
            assert!(!got.complete);
            assert_eq!(got.errors.len(), 1, "{:?}", got.errors);
            assert_eq!(got.errors[0].shard, 1);
            let want = only_shard0
                .get_in_network_posts(request.clone(), deadline)
                .await;
            assert!(want.complete);
            let max_results = thunder_client::effective_max_results(&request) as usize;
            if let Err(diff) = answers_agree(&posts(&got), &posts(&want), max_results) {
                panic!("request {request:?} without shard 1: {diff}");
            }
            assert!(got.posts.iter().all(|p| shard_of(p.author_id, 2) == 0));
            partial += usize::from(!got.posts.is_empty());
        }
        assert!(partial >= 10, "only {partial} partial answers with posts");
    });
}
