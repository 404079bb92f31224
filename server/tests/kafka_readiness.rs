//! Readiness of a real `thunder-server` process fed by a real broker: at the instant gRPC
//! health first says SERVING, every event of the backlog is visible (normal and video
//! answers equal a model fed the same events); a partition stalled after catch-up turns health
//! NOT_SERVING and `/readyz` 503, while liveness (gRPC health `liveness`, `/healthz`) stays
//! healthy and the status page says why and shows the stalled partition.

use std::time::{Duration, Instant};

use std::sync::Arc;
use thunder_testbed::kafka::*;
use thunder_testbed::server_process::{ask, health, health_of, start_server, wait_serving};

use thunder_engine::{Clock, FeedQuery, ManualClock, StoreConfig};
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_testkit::model::{ModelStore, answers_agree};
use tonic_health::pb::health_check_response::ServingStatus;

/// Longer than the backlog's two days, so no post sits at the retention edge while the model
/// (fixed clock) and the server (system clock) look at it seconds apart.
const RETENTION_SECS: i64 = 3 * 24 * 3600;

#[test]
fn a_small_backlog_is_entirely_visible_when_health_turns_serving_and_a_stall_turns_it_off() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "readiness";
    let partitions = 4;
    create_topic(&broker.bootstrap(), topic, partitions);
    // A few thousand events: far below partitions x batch size, the old gate's threshold.
    let (config, events) = order_free_backlog(8000, now);
    assert!(
        (1000..5000).contains(&events.len()),
        "{} events",
        events.len()
    );
    let producer = producer(&broker.bootstrap(), topic);
    for event in &events {
        send(&producer, event);
    }
    flush(&producer, events.len() as u64);
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(now));
    let mut model = ModelStore::with_config(StoreConfig {
        retention_secs: RETENTION_SECS,
        clock,
        ..StoreConfig::default()
    });
    apply_to_model(&mut model, &events);
    let viewers = viewers_for(&config, 30, &events);

    let server = start_server(&broker.bootstrap(), topic, RETENTION_SECS, &[]);
    let (grpc, admin) = (server.grpc, server.admin);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        // Poll health as a balancer would, but tightly.
        let saw_not_serving = wait_serving(grpc).await;
        assert!(saw_not_serving, "SERVING before the first health check");

        // The very first answers after SERVING are the complete ones.
        let mut client = InNetworkPostsServiceClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect");
        let mut compared = 0;
        for (viewer, following) in &viewers {
            for video in [false, true] {
                let got = ask(&mut client, *viewer, following, video).await;
                let query = FeedQuery::new(*viewer, following);
                let want = if video {
                    model.get_videos_by_users(&query)
                } else {
                    model.get_all_posts_by_users(&query)
                };
                if let Err(diff) = answers_agree(&got, &want.posts, query.max_results) {
                    panic!("viewer {viewer} (video {video}) at SERVING: {diff}");
                }
                compared += usize::from(!want.posts.is_empty());
            }
        }
        assert!(compared >= 20, "only {compared} non-empty answers compared");
        let ready = thunder_testbed::http_get(admin, "/readyz").await;
        assert_eq!(ready.status, 200);
    });

    // A batch that cannot be decoded lands after catch-up: after the 2 s stall timeout the
    // replica stops taking traffic.
    produce_raw_batch(
        &broker.bootstrap(),
        topic,
        0,
        4,
        b"\x28\xb5\x2f\xfd garbage",
    );
    runtime.block_on(async {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let status = health(grpc).await;
            let ready = thunder_testbed::http_get(admin, "/readyz").await;
            if status == Some(ServingStatus::NotServing as i32) && ready.status == 503 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "never NOT_SERVING after the stall"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let metrics = thunder_testbed::http_get(admin, "/metrics").await.text();
        assert!(
            metrics.contains(&format!(
                "kafka_partition_stalled{{partition=\"0\",topic=\"{topic}\"}} 1"
            )),
            "stall metric missing"
        );
        // Not ready, but alive: a liveness probe must not restart the replica.
        assert_eq!(
            health_of(grpc, thunder_server::telemetry::readiness::LIVENESS_SERVICE).await,
            Some(ServingStatus::Serving as i32)
        );
        assert_eq!(
            thunder_testbed::http_get(admin, "/healthz").await.status,
            200
        );
        let page = thunder_testbed::http_get(admin, "/").await.text();
        assert!(
            page.contains("id=\"ready\" class=\"bad\">NOT READY<"),
            "{page}"
        );
        assert!(page.contains("stalled"), "{page}");
        assert!(
            page.contains(&format!("Kafka topic {topic} at ")),
            "event source missing: {page}"
        );
        assert!(page.contains("<table id=\"partitions\">"), "{page}");
        assert!(
            page.contains(&format!("<tr class=\"bad\"><td>{topic}</td><td>0</td>")),
            "stalled partition row missing: {page}"
        );
    });
}
