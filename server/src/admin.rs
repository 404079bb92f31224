//! Admin HTTP endpoints (axum), on their own port, 127.0.0.1 by default:
//! `/metrics`, `/healthz`, `/readyz`, `/debug/pprof/profile`, `/debug/pprof/flamegraph`,
//! `POST /admin/snapshot`, and `/`, which lists them.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};

use crate::metrics;
use crate::profiling;
use crate::readiness::Readiness;

/// The admin router.
pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/debug/pprof/profile", get(profiling::profile))
        .route("/debug/pprof/flamegraph", get(profiling::flamegraph))
        .route("/admin/snapshot", post(crate::snapshot::admin_snapshot))
        .with_state(readiness)
}

/// What a person who opens the admin port finds: the endpoints, one a line.
const INDEX: &str = "thunder admin endpoints\n\
GET  /metrics                            Prometheus text\n\
GET  /healthz                            the process is up\n\
GET  /readyz                             200 once caught up, 503 before\n\
GET  /debug/pprof/profile?seconds=N      CPU profile, gzipped pprof (N <= 60)\n\
GET  /debug/pprof/flamegraph?seconds=N   the same as an SVG flamegraph\n\
POST /admin/snapshot                     write a snapshot now (with --snapshot-dir)\n";

/// The list of endpoints.
async fn index() -> &'static str {
    INDEX
}

/// Prometheus text format of the default registry.
async fn serve_metrics() -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(),
    )
}

/// The process is up.
async fn healthz() -> &'static str {
    "ok\n"
}

/// 200 once the store has caught up, 503 before (and while shutting down).
async fn readyz(State(readiness): State<Readiness>) -> impl IntoResponse {
    if readiness.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
