//! Readiness (gRPC health and /readyz), liveness (/healthz) and reflection.

use thunder_server::ServerOptions;
use thunder_server::telemetry::readiness::LIVENESS_SERVICE;
use thunder_testbed::{TestServer, store};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

async fn status_of(
    client: &mut HealthClient<tonic::transport::Channel>,
    service: &str,
) -> ServingStatus {
    let response = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health answers")
        .into_inner();
    ServingStatus::try_from(response.status).expect("known status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_serving_until_ready_then_serving() {
    let server = TestServer::start(ServerOptions::default(), store(), None).await;
    let mut health = HealthClient::new(server.channel().await);
    for service in ["", thunder_proto::SERVICE_NAME] {
        assert_eq!(
            status_of(&mut health, service).await,
            ServingStatus::NotServing,
            "{service:?}"
        );
    }
    assert_eq!(server.admin_get("/readyz").await.status, 503);
    assert_eq!(server.admin_get("/healthz").await.status, 200);

    server.running().readiness().set_ready().await;
    for service in ["", thunder_proto::SERVICE_NAME] {
        assert_eq!(
            status_of(&mut health, service).await,
            ServingStatus::Serving,
            "{service:?}"
        );
    }
    assert_eq!(server.admin_get("/readyz").await.status, 200);
    assert_eq!(server.admin_get("/healthz").await.status, 200);
    // The endpoint list, as text, at `/endpoints` and `/?format=text` (`/` is the status page).
    let index = server.admin_get("/endpoints").await;
    assert_eq!(index.status, 200);
    let index = index.text();
    assert_eq!(server.admin_get("/?format=text").await.text(), index);
    for path in [
        "/metrics",
        "/healthz",
        "/readyz",
        "/debug/pprof/profile",
        "/debug/pprof/flamegraph",
        "/admin/snapshot",
    ] {
        assert!(index.contains(path), "{path} missing from {index}");
        if !path.starts_with("/admin") && !path.starts_with("/debug") {
            assert_eq!(server.admin_get(path).await.status, 200, "{path}");
        }
    }
    let metrics = server.admin_get("/metrics").await.text();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("init_duration_seconds ")),
        "{metrics}"
    );
}

/// Liveness is not readiness: while the store is catching up (not ready) and while a stalled
/// partition turns readiness off, the liveness health service and `/healthz` stay healthy, so
/// a liveness probe does not kill a replica that is replaying; only shutdown ends liveness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_stays_serving_while_not_ready() {
    let server = TestServer::start(ServerOptions::default(), store(), None).await;
    let mut health = HealthClient::new(server.channel().await);
    let probes = |mut health: HealthClient<tonic::transport::Channel>| async move {
        let ready = status_of(&mut health, "").await;
        let service = status_of(&mut health, thunder_proto::SERVICE_NAME).await;
        let live = status_of(&mut health, LIVENESS_SERVICE).await;
        (ready, service, live)
    };
    // Catching up: not ready, alive.
    assert_eq!(
        probes(health.clone()).await,
        (
            ServingStatus::NotServing,
            ServingStatus::NotServing,
            ServingStatus::Serving
        )
    );
    assert_eq!(server.admin_get("/readyz").await.status, 503);
    assert_eq!(server.admin_get("/healthz").await.status, 200);

    let readiness = server.running().readiness().clone();
    readiness.set_ready().await;
    assert_eq!(
        probes(health.clone()).await,
        (
            ServingStatus::Serving,
            ServingStatus::Serving,
            ServingStatus::Serving
        )
    );
    // A stall after catch-up: not ready again, still alive.
    readiness
        .set_serving(false, "Kafka partitions [0] stalled")
        .await;
    assert_eq!(
        probes(health.clone()).await,
        (
            ServingStatus::NotServing,
            ServingStatus::NotServing,
            ServingStatus::Serving
        )
    );
    assert_eq!(server.admin_get("/readyz").await.status, 503);
    assert_eq!(server.admin_get("/healthz").await.status, 200);
    assert!(
        readiness.reason().contains("stalled"),
        "{}",
        readiness.reason()
    );

    // Shutdown (which starts with this call) turns liveness off as well.
    readiness.set_not_ready().await;
    assert_eq!(
        status_of(&mut health, LIVENESS_SERVICE).await,
        ServingStatus::NotServing
    );
    assert_eq!(readiness.reason(), "shutting down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_service() {
    let server = TestServer::ready(store()).await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([list]))
        .await
        .expect("reflection answers")
        .into_inner();
    let response = responses
        .message()
        .await
        .expect("a message")
        .expect("not the end");
    let Some(MessageResponse::ListServicesResponse(services)) = response.message_response else {
        panic!("unexpected answer: {response:?}");
    };
    let names: Vec<String> = services.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.iter().any(|n| n == thunder_proto::SERVICE_NAME),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n == "grpc.health.v1.Health"),
        "{names:?}"
    );
    // The explain service, in the same proto file.
    assert!(
        names.iter().any(|n| n == thunder_proto::DEBUG_SERVICE_NAME),
        "{names:?}"
    );

    // The service's file resolves, so grpcurl can describe and call it.
    let symbol = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            thunder_proto::SERVICE_NAME.into(),
        )),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([symbol]))
        .await
        .expect("reflection answers")
        .into_inner();
    let response = responses
        .message()
        .await
        .expect("a message")
        .expect("not the end");
    assert!(
        matches!(response.message_response, Some(MessageResponse::FileDescriptorResponse(ref f)) if !f.file_descriptor_proto.is_empty()),
        "{response:?}"
    );
}
