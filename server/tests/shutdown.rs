//! Graceful shutdown: an in-flight call finishes, new connections are refused afterwards.

use std::sync::Arc;
use std::time::Duration;

use thunder_server::ServerOptions;
use thunder_server::serve::following::FollowingSource;
use thunder_testbed::{PATIENCE, TestServer, original, request, store};
use tokio::sync::{Notify, Semaphore};

/// A follow graph that parks each fetch until the test releases it.
#[derive(Debug)]
struct GatedFollowing {
    entered: Notify,
    release: Semaphore,
}

#[tonic::async_trait]
impl FollowingSource for GatedFollowing {
    async fn fetch_following_list(&self, _user_id: i64, _limit: usize) -> Result<Vec<i64>, String> {
        self.entered.notify_one();
        let permit = self.release.acquire().await.map_err(|e| e.to_string())?;
        permit.forget();
        Ok(vec![5])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_call_finishes_during_shutdown() {
    let store = store();
    store.insert_posts(&[original(1, 5, 10)]);
    let gate = Arc::new(GatedFollowing {
        entered: Notify::new(),
        release: Semaphore::new(0),
    });
    let options = ServerOptions {
        drain_timeout: PATIENCE,
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store, Some(gate.clone())).await;
    server.running().readiness().set_ready().await;
    let addr = server.running().grpc_addr();
    let mut client = server.client().await;

    // An empty following list goes through the gated fallback, so the call stays in flight.
    let in_flight = tokio::spawn(async move { client.get_in_network_posts(request(&[])).await });
    tokio::time::timeout(PATIENCE, gate.entered.notified())
        .await
        .expect("call reached the server");

    let shutdown = tokio::spawn(server.shutdown());
    // Give the shutdown a moment to start draining before the call is released; the outcome
    // does not depend on this delay.
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.release.add_permits(1);

    let response = in_flight
        .await
        .expect("joined")
        .expect("in-flight call served");
    assert_eq!(response.into_inner().posts.len(), 1);
    let drained = tokio::time::timeout(PATIENCE, shutdown)
        .await
        .expect("shutdown ends")
        .expect("joined");
    assert!(drained, "drain timed out");

    let refused = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("url")
        .connect()
        .await;
    assert!(refused.is_err(), "still accepting after shutdown");
}
