//! `thunder-client` against real thunder servers on loopback: a replica killed under the
//! client. (`thunder-cli query --shards` over two author shards is cli/tests/query_shards.rs.)

use std::time::Duration;

use thunder_client::{ClientConfig, ThunderClient};
use thunder_engine::LightPost;
use thunder_testbed::{TestServer, original, request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_costs_no_answer() {
    let posts: Vec<LightPost> = (0..50).map(|i| original(100 + i, 1 + i % 5, i)).collect();
    let a = TestServer::ready(thunder_testbed::store()).await;
    let b = TestServer::ready(thunder_testbed::store()).await;
    a.store.insert_posts(&posts);
    b.store.insert_posts(&posts);
    let config = ClientConfig {
        hedge_percentile: None,
        ..ClientConfig::default()
    };
    let addrs = [
        a.running().grpc_addr().to_string(),
        b.running().grpc_addr().to_string(),
    ];
    let client = ThunderClient::replicas(&addrs, &config).expect("client");
    let req = request(&[1, 2, 3, 4, 5]);
    let first = client
        .get_in_network_posts(req.clone(), Duration::from_secs(5))
        .await;
    assert!(first.complete, "{:?}", first.errors);
    assert_eq!(first.posts.len(), 50);
    assert!(a.shutdown().await);
    for _ in 0..30 {
        let answer = client
            .get_in_network_posts(req.clone(), Duration::from_secs(2))
            .await;
        assert!(answer.complete, "{:?}", answer.errors);
        assert_eq!(answer.posts, first.posts);
    }
    assert!(b.shutdown().await);
    let answer = client
        .get_in_network_posts(req, Duration::from_millis(300))
        .await;
    assert!(!answer.complete && answer.posts.is_empty());
}
