//! The server process's lifecycle driven in-process, step by step
//! (`thunder_server::lifecycle::replica`): start (listeners up, NOT_SERVING), catch up with
//! the source, serve, and stop in order (the lame duck: readiness off while calls are still
//! served, then the drain, then the source stops); a stop requested during the catch-up ends
//! it at once, with no lame duck. Against the demo source and against a Kafka broker.

use std::time::{Duration, Instant};

use thunder_engine::{LightPost, PostEvent};
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::ServerOptions;
use thunder_server::lifecycle::replica::{
    CatchUp, EventSource, Replica, ReplicaOptions, Served, StopRequests, Stopped,
};
use thunder_testbed::kafka::{Broker, create_topic, flush, kafka_args, now_secs, producer, send};
use thunder_testbed::{eventually, http_get, request};

fn options(source: EventSource, shutdown_delay: Duration) -> ReplicaOptions {
    ReplicaOptions {
        server: ServerOptions::default(),
        source,
        retention_secs: thunder_engine::config::DEFAULT_RETENTION_SECS,
        shard: None,
        memory_limit_bytes: None,
        cursor_secret: None,
        shutdown_delay,
    }
}

/// `/readyz`'s status code.
async fn readyz(replica_admin: std::net::SocketAddr) -> u16 {
    http_get(replica_admin, "/readyz").await.status
}

/// Posts the replica answers for `authors`, over gRPC.
async fn posts_for(grpc: std::net::SocketAddr, authors: &[u64]) -> Result<usize, tonic::Status> {
    let mut client = InNetworkPostsServiceClient::connect(format!("http://{grpc}"))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let answer = client.get_in_network_posts(request(authors)).await?;
    Ok(answer.into_inner().posts.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demo_replica_starts_catches_up_serves_and_stops_in_order() {
    let stops = StopRequests::default();
    let source = EventSource::Demo {
        scale: 2000,
        events_per_sec: 200,
    };
    let mut replica = Replica::start(options(source, Duration::from_secs(30)), &stops)
        .await
        .expect("starts");
    let (grpc, admin) = (replica.grpc_addr(), replica.admin_addr());
    // Started: both ports up, not ready, nothing loaded yet.
    assert_eq!(readyz(admin).await, 503);
    assert_eq!(replica.store().stats().posts, 0);

    assert_eq!(replica.catch_up().await.expect("catches up"), CatchUp::Done);
    let loaded = replica.store().stats().posts;
    assert!(loaded > 1000, "{loaded} posts after the backlog");
    assert_eq!(readyz(admin).await, 503, "ready only once it serves");

    let store = std::sync::Arc::clone(replica.store());
    let serving = tokio::spawn(async move {
        let served = replica.serve().await;
        (replica, served)
    });
    assert!(eventually(|| async { readyz(admin).await == 200 }).await);
    // A viewer of the demo graph gets a feed.
    let viewer = thunder_server::demo::workload(2000, store.now_secs()).viewers(1)[0].clone();
    let authors: Vec<u64> = viewer.following.iter().map(|&a| a as u64).collect();
    assert!(posts_for(grpc, &authors).await.expect("answered") > 0);
    // The live trickle adds posts.
    assert!(eventually(|| async { store.stats().posts > loaded }).await);

    stops.request();
    let (replica, served) = serving.await.expect("serve joined");
    assert_eq!(served, Served::StopRequested);
    let started_stop = Instant::now();
    let stopping = tokio::spawn(replica.stop());
    // The lame duck: readiness off at once, calls still served.
    assert!(eventually(|| async { readyz(admin).await == 503 }).await);
    assert!(
        posts_for(grpc, &authors)
            .await
            .expect("answered in the lame duck")
            > 0
    );
    assert!(!stopping.is_finished(), "the lame duck lasts 30 s");
    // A further request cuts it short; the drain and the feed's stop follow.
    stops.request();
    let stopped = stopping.await.expect("stop joined");
    assert_eq!(
        stopped,
        Stopped {
            caught_up: true,
            drained: true
        }
    );
    assert!(started_stop.elapsed() < Duration::from_secs(30));
    assert!(!stopped.drain_cut());
    // Stopped: the port is closed and the live feed writes no more.
    assert!(posts_for(grpc, &authors).await.is_err());
    let after = store.stats().posts;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.stats().posts, after, "the live feed stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_the_catch_up_ends_it_without_a_lame_duck() {
    let stops = StopRequests::default();
    let source = EventSource::Demo {
        scale: 100,
        events_per_sec: 0,
    };
    // Requested while the replica starts (a SIGTERM during start-up): it is not lost.
    stops.request();
    let mut replica = Replica::start(options(source, Duration::from_secs(30)), &stops)
        .await
        .expect("starts");
    assert_eq!(
        replica.catch_up().await.expect("no failure"),
        CatchUp::StopRequested
    );
    let started_stop = Instant::now();
    let stopped = replica.stop().await;
    assert_eq!(
        stopped,
        Stopped {
            caught_up: false,
            drained: true
        }
    );
    assert!(!stopped.drain_cut());
    assert!(
        started_stop.elapsed() < Duration::from_secs(10),
        "no 30 s lame duck before the catch-up"
    );
}

#[test]
fn a_kafka_replica_catches_up_with_the_topic_then_serves_what_follows() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = "replica";
    create_topic(&bootstrap, topic, 2);
    let now = now_secs();
    let sender = producer(&bootstrap, topic);
    for i in 1..=40 {
        let post = LightPost::original(i, 1 + i % 4, now - 100 + i);
        send(&sender, &PostEvent::Create(post));
    }
    flush(&sender, 40);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let stops = StopRequests::default();
    let source = EventSource::Kafka {
        kafka: Box::new(kafka_args(&bootstrap, topic)),
        // No snapshots: the flags' defaults.
        snapshot: <thunder_server::Args as clap::Parser>::parse_from(["thunder-server"]).snapshot,
    };
    let mut replica = runtime
        .block_on(Replica::start(options(source, Duration::ZERO), &stops))
        .expect("starts");
    let (grpc, admin) = (replica.grpc_addr(), replica.admin_addr());
    let caught_up = runtime.block_on(replica.catch_up()).expect("catches up");
    assert_eq!(caught_up, CatchUp::Done);
    // Everything the topic held at start is in the store before it serves.
    assert_eq!(replica.store().stats().posts, 40);
    assert_eq!(runtime.block_on(readyz(admin)), 503);
    let store = std::sync::Arc::clone(replica.store());
    let serving = runtime.spawn(async move {
        let served = replica.serve().await;
        (replica, served)
    });
    runtime.block_on(async {
        assert!(eventually(|| async { readyz(admin).await == 200 }).await);
        assert_eq!(posts_for(grpc, &[1, 2, 3, 4]).await.expect("answered"), 40);
    });
    // What follows the catch-up reaches the store while it serves.
    send(&sender, &PostEvent::Create(LightPost::original(41, 1, now)));
    flush(&sender, 41);
    runtime.block_on(async {
        assert!(eventually(|| async { store.stats().posts == 41 }).await);
        stops.request();
        let (replica, served) = serving.await.expect("serve joined");
        assert_eq!(served, Served::StopRequested);
        let stopped = replica.stop().await;
        assert_eq!(
            stopped,
            Stopped {
                caught_up: true,
                drained: true
            }
        );
        assert!(posts_for(grpc, &[1]).await.is_err(), "the port is closed");
    });
}
