//! Readiness: NOT_SERVING (gRPC health) and 503 (`/readyz`) until the store has caught up with
//! its event source, SERVING and 200 after.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::metrics::Metrics;

/// Shared readiness flag, mirrored into `grpc.health.v1.Health` for both the overall server
/// (service `""`) and `thunder.v1.InNetworkPostsService`.
#[derive(Clone, Debug)]
pub struct Readiness {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ready: AtomicBool,
    health: HealthReporter,
    started: Instant,
}

const HEALTH_SERVICES: [&str; 2] = ["", thunder_proto::SERVICE_NAME];

impl Readiness {
    /// Starts not ready; `started` is the start-up instant `init_duration_seconds` counts from.
    pub async fn new(health: HealthReporter, started: Instant) -> Self {
        for service in HEALTH_SERVICES {
            health
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
        Metrics::global().ready.set(0);
        Self {
            inner: Arc::new(Inner {
                ready: AtomicBool::new(false),
                health,
                started,
            }),
        }
    }

    /// True once [`Readiness::set_ready`] ran (and until [`Readiness::set_not_ready`]).
    pub fn is_ready(&self) -> bool {
        // Relaxed: the flag guards no other data; probes only need to see it eventually.
        self.inner.ready.load(Ordering::Relaxed)
    }

    /// Marks the server ready: health SERVING, `/readyz` 200, `init_duration_seconds` set.
    pub async fn set_ready(&self) {
        Metrics::global()
            .init_duration
            .set(self.inner.started.elapsed().as_secs_f64());
        for service in HEALTH_SERVICES {
            self.inner
                .health
                .set_service_status(service, ServingStatus::Serving)
                .await;
        }
        self.inner.ready.store(true, Ordering::Relaxed);
        Metrics::global().ready.set(1);
        tracing::info!(
            after_secs = self.inner.started.elapsed().as_secs_f64(),
            "ready: health SERVING"
        );
    }

    /// Turns serving off and on again after start-up (a stalled Kafka partition), without
    /// touching `init_duration_seconds`.
    pub async fn set_serving(&self, serving: bool, reason: &str) {
        if serving == self.is_ready() {
            return;
        }
        self.inner.ready.store(serving, Ordering::Relaxed);
        Metrics::global().ready.set(i64::from(serving));
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in HEALTH_SERVICES {
            self.inner.health.set_service_status(service, status).await;
        }
        if serving {
            tracing::info!(reason, "health SERVING again");
        } else {
            tracing::warn!(reason, "health NOT_SERVING");
        }
    }

    /// Marks the server not ready (during shutdown, so balancers stop sending traffic).
    pub async fn set_not_ready(&self) {
        self.inner.ready.store(false, Ordering::Relaxed);
        Metrics::global().ready.set(0);
        for service in HEALTH_SERVICES {
            self.inner
                .health
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
    }
}
