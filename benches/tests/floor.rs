//! The floor server's answers: what the store answered at build time, sent through the
//! server's own serving path on every call, with the store gone.

use std::sync::Arc;
use std::time::Instant;

use thunder_benches::floor::Floor;
use thunder_engine::config::DEFAULT_RETENTION_SECS;
use thunder_proto::GetInNetworkPostsRequest;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::lifecycle::start_with;
use thunder_server::{ServerOptions, demo, handle_request, shard};

fn request(following: Vec<u64>) -> GetInNetworkPostsRequest {
    GetInNetworkPostsRequest {
        user_id: 1,
        following_user_ids: following,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_serves_the_stores_answers_by_shape_with_the_store_gone() {
    // A small demo store (1000 authors, 20 000 posts).
    let store = Arc::new(shard::new_store(DEFAULT_RETENTION_SECS, None));
    let workload = demo::workload(1000, store.now_secs());
    demo::load_backlog(Arc::clone(&store), workload.clone())
        .await
        .expect("backlog loads");
    let viewer = workload.viewers(1).remove(0);
    let ids = |ids: &[i64]| ids.iter().map(|&id| id as u64).collect::<Vec<_>>();
    let full = request(ids(&viewer.following));
    let small = request(ids(&[workload.author_id(0)]));
    // As many followed ids as the full request, none of them known.
    let empty = request(
        (0..full.following_user_ids.len() as u64)
            .map(|i| (1 << 62) + i)
            .collect(),
    );
    let expected_full = handle_request(&store, &full).expect("full answer");
    let expected_small = handle_request(&store, &small).expect("small answer");
    assert!(
        expected_full.posts.len() > expected_small.posts.len() && !expected_small.posts.is_empty(),
        "full {} posts, small {}",
        expected_full.posts.len(),
        expected_small.posts.len()
    );

    let floor =
        Floor::build(&store, &[full.clone(), small.clone(), empty.clone()]).expect("floor builds");
    let store = Arc::into_inner(store).expect("the floor keeps no reference to the store");
    drop(store);

    let server = start_with(ServerOptions::default(), floor, None, Instant::now())
        .await
        .expect("floor starts");
    server.readiness().set_ready().await;
    let mut client = InNetworkPostsServiceClient::connect(format!("http://{}", server.grpc_addr()))
        .await
        .expect("connects");
    for _ in 0..2 {
        // Every call gets the whole answer again (encoded per call, not used up).
        let got = client
            .get_in_network_posts(full.clone())
            .await
            .expect("full call")
            .into_inner();
        assert_eq!(got, expected_full);
    }
    let got = client
        .get_in_network_posts(small)
        .await
        .expect("small call")
        .into_inner();
    assert_eq!(got, expected_small);
    let got = client
        .get_in_network_posts(empty)
        .await
        .expect("empty call")
        .into_inner();
    assert!(got.posts.is_empty() && got.next_cursor.is_empty());
    // A shape no frame had: an empty answer.
    let mut other = full;
    other.following_user_ids.truncate(3);
    let got = client
        .get_in_network_posts(other)
        .await
        .expect("other call")
        .into_inner();
    assert!(got.posts.is_empty());
    assert!(server.shutdown().await, "drains");
}
