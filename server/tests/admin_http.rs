//! Admin HTTP: Prometheus metrics after a request, and both CPU profile endpoints.

mod common;

use std::io::Read;
use std::time::Duration;

use common::{TestServer, eventually, original, request, store};
use pprof::protos::Message;
use thunder_server::ServerOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_the_counters_after_a_request() {
    let store = store();
    store.insert_posts(&[original(1, 5, 10), original(2, 5, 20)]);
    let options = ServerOptions {
        stats_interval: Duration::from_millis(50),
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store, None).await;
    server.running().readiness().set_ready().await;
    let mut client = server.client().await;
    client
        .get_in_network_posts(request(&[5]))
        .await
        .expect("served");

    let response = server.admin_get("/metrics").await;
    assert_eq!(response.status, 200);
    assert!(
        response
            .header("content-type")
            .is_some_and(|v| v.starts_with("text/plain"))
    );
    let text = response.text();
    let value = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
    };
    for name in [
        "get_in_network_posts_duration_seconds_count",
        "get_in_network_posts_duration_without_strato_seconds_count",
        "get_in_network_posts_count_count",
        "get_in_network_posts_following_size_count",
        "get_in_network_posts_excluded_size_count",
        "get_in_network_posts_max_results_count",
        "get_in_network_posts_request_bytes_count",
        "get_in_network_posts_response_bytes_count",
        "post_store_requests_total",
        "post_store_posts_returned_count",
    ] {
        assert!(
            value(name).is_some_and(|v| v >= 1.0),
            "{name} missing or zero"
        );
    }
    assert!(text.contains("get_in_network_posts_requests_total{status=\"ok\"}"));
    assert!(text.contains("get_in_network_posts_found_freshness_seconds_count{stage=\"scored\"}"));
    for name in [
        "in_flight_requests",
        "rejected_requests_total",
        "post_store_request_timeouts_total",
    ] {
        assert!(value(name).is_some(), "{name} missing");
    }
    // The store gauges are refreshed in the background.
    let gauges_seen = eventually(|| async {
        let text = server.admin_get("/metrics").await.text();
        text.lines().any(|l| l == "post_store_total_posts 2")
            && text.contains("post_store_entity_count{type=\"original_posts\"} 2")
            && text.contains("post_store_arena_bytes{kind=\"reserved\"}")
            && text.contains("post_store_deleted_posts 0")
    })
    .await;
    assert!(gauges_seen, "{}", server.admin_get("/metrics").await.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_are_served_one_at_a_time() {
    let server = TestServer::ready(store()).await;
    // Something to sample.
    let busy = std::thread::spawn(|| {
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // Check the clock rarely: samples landing in the vdso are dropped by the blocklist.
        while started.elapsed() < Duration::from_secs(3) {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(
                    x.wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407),
                );
            }
        }
        x
    });

    let svg = server.admin_get("/debug/pprof/flamegraph?seconds=1").await;
    assert_eq!(svg.status, 200, "{}", svg.text());
    assert_eq!(svg.header("content-type"), Some("image/svg+xml"));
    assert!(
        svg.text().contains("<svg"),
        "not an SVG: {:?}",
        &svg.text()[..svg.text().len().min(300)]
    );

    let profile = server.admin_get("/debug/pprof/profile?seconds=1").await;
    assert_eq!(profile.status, 200, "{}", profile.text());
    let mut decoded = Vec::new();
    flate2::read::GzDecoder::new(profile.body.as_slice())
        .read_to_end(&mut decoded)
        .expect("gzip");
    let parsed = pprof::protos::Profile::decode(decoded.as_slice()).expect("profile.proto");
    assert!(!parsed.sample_type.is_empty());
    assert!(!parsed.string_table.is_empty());
    let _ = busy.join();

    // While a profile runs, a second one is refused with 409.
    let addr = server.running().admin_addr();
    let long =
        tokio::spawn(async move { common::http_get(addr, "/debug/pprof/profile?seconds=4").await });
    let mut conflict = false;
    while !long.is_finished() {
        let probe = server.admin_get("/debug/pprof/flamegraph?seconds=1").await;
        if probe.status == 409 {
            conflict = true;
            break;
        }
        assert_eq!(probe.status, 200);
    }
    let long = long.await.expect("joined");
    assert!(conflict || long.status == 409, "no 409 while a profile ran");
}
