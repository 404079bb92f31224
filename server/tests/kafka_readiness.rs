//! Readiness of a real `thunder-server` process fed by a real broker: at the instant gRPC
//! health first says SERVING, every event of the backlog is visible (normal and video
//! answers equal a model fed the same events); a partition stalled after catch-up turns health
//! NOT_SERVING and `/readyz` 503.

mod common;
mod kafka_support;

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kafka_support::*;
use std::sync::Arc;

use thunder_engine::{Clock, FeedQuery, ManualClock, StoreConfig};
use thunder_proto::GetInNetworkPostsRequest;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_testkit::model::{ModelStore, answers_agree};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Longer than the backlog's two days, so no post sits at the retention edge while the model
/// (fixed clock) and the server (system clock) look at it seconds apart.
const RETENTION_SECS: i64 = 3 * 24 * 3600;

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

/// The server process; killed on drop.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(
    broker: &Broker,
    topic: &str,
    grpc: SocketAddr,
    admin: SocketAddr,
) -> ServerProcess {
    let child = Command::new(env!("CARGO_BIN_EXE_thunder-server"))
        .args([
            "--kafka-brokers",
            &broker.bootstrap(),
            "--kafka-topic",
            topic,
        ])
        .args([
            "--grpc-addr",
            &grpc.to_string(),
            "--admin-addr",
            &admin.to_string(),
        ])
        .args([
            "--kafka-num-threads",
            "2",
            "--kafka-stall-timeout-secs",
            "2",
        ])
        .args(["--post-retention-seconds", &RETENTION_SECS.to_string()])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .expect("start thunder-server");
    ServerProcess(child)
}

async fn health(grpc: SocketAddr) -> Option<i32> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .ok()?
        .connect()
        .await
        .ok()?;
    let mut client = HealthClient::new(channel);
    let response = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .ok()?;
    Some(response.into_inner().status)
}

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

    let (grpc, admin) = (free_addr(), free_addr());
    let _server = start_server(&broker, topic, grpc, admin);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        // Poll health as a balancer would, but tightly.
        let deadline = Instant::now() + TIMEOUT;
        let mut saw_not_serving = false;
        loop {
            match health(grpc).await {
                Some(s) if s == ServingStatus::Serving as i32 => break,
                Some(_) => saw_not_serving = true,
                None => {}
            }
            assert!(Instant::now() < deadline, "never SERVING");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(saw_not_serving, "SERVING before the first health check");

        // The very first answers after SERVING are the complete ones.
        let mut client = InNetworkPostsServiceClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect");
        let mut compared = 0;
        for (viewer, following) in &viewers {
            for video in [false, true] {
                let request = GetInNetworkPostsRequest {
                    user_id: *viewer as u64,
                    following_user_ids: following.iter().map(|&a| a as u64).collect(),
                    is_video_request: video,
                    ..Default::default()
                };
                let got: Vec<thunder_engine::LightPost> = client
                    .get_in_network_posts(request)
                    .await
                    .expect("query")
                    .into_inner()
                    .posts
                    .iter()
                    .map(thunder_server::convert::post_from_proto)
                    .collect();
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
        let ready = common::http_get(admin, "/readyz").await;
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
            let ready = common::http_get(admin, "/readyz").await;
            if status == Some(ServingStatus::NotServing as i32) && ready.status == 503 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "never NOT_SERVING after the stall"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let metrics = common::http_get(admin, "/metrics").await.text();
        assert!(
            metrics.contains(&format!(
                "kafka_partition_stalled{{partition=\"0\",topic=\"{topic}\"}} 1"
            )),
            "stall metric missing"
        );
    });
}
