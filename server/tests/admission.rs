//! The global QPS limit: RESOURCE_EXHAUSTED once the quota is spent.

use thunder_server::ServerOptions;
use thunder_testbed::{TestServer, request, store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_quota_are_rejected() {
    // One call per second, burst one: the second of any quick pair is refused.
    let options = ServerOptions {
        qps_limit: 1,
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store(), None).await;
    server.running().readiness().set_ready().await;
    let mut client = server.client().await;
    let mut rejected = None;
    for _ in 0..50 {
        match client.get_in_network_posts(request(&[1])).await {
            Ok(_) => {}
            Err(status) => {
                rejected = Some(status);
                break;
            }
        }
    }
    let status = rejected.expect("a call was rejected");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(status.message(), "QPS rate limit exceeded, please retry");

    let metrics = server.admin_get("/metrics").await.text();
    let rejected_total =
        thunder_testbed::metrics::in_text(&metrics, "rejected_requests_total", &[])
            .expect("rejected_requests_total exported");
    assert!(rejected_total >= 1.0);
}
