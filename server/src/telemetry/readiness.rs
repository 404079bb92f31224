//! Readiness: NOT_SERVING (gRPC health) and 503 (`/readyz`) until the store has caught up with
//! its event source, SERVING and 200 after. Liveness is separate: the gRPC health service
//! [`LIVENESS_SERVICE`] and `/healthz` say the process is up, SERVING from start-up (during
//! catch-up too) until shutdown, so a probe does not kill a replica that is still replaying.
//! At shutdown readiness turns off first ([`Readiness::set_lame_duck`]) while calls are still
//! served, then liveness with the drain ([`Readiness::set_not_ready`]).
//!
//! Whenever readiness turns on, the `post_store_*` gauges are refreshed first, so the first
//! scrape of a ready server shows the store it serves, not the one of the last periodic
//! refresh (up to `maintenance::STATS_INTERVAL` earlier).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use thunder_engine::PostStore;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::telemetry::metrics::{ProcessMetrics, StoreMetrics};

/// gRPC health service name of liveness: SERVING from start-up until shutdown, whatever the
/// catch-up state (the readiness names are `""` and `thunder.v1.InNetworkPostsService`).
pub const LIVENESS_SERVICE: &str = "liveness";

/// Shared readiness flag, mirrored into `grpc.health.v1.Health` for both the overall server
/// (service `""`) and `thunder.v1.InNetworkPostsService`, with the reason of its last change
/// and the event source, for the status page.
#[derive(Clone, Debug)]
pub struct Readiness {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ready: AtomicBool,
    health: HealthReporter,
    started: Instant,
    /// Why the server is (not) ready, for the status page.
    reason: Mutex<String>,
    /// What feeds the store (demo workload or Kafka topic), for the status page.
    source: Mutex<String>,
    /// The store whose gauges are refreshed as readiness turns on (`None`: a server without
    /// one, in tests).
    store: Option<Arc<PostStore>>,
}

const HEALTH_SERVICES: [&str; 2] = ["", thunder_proto::SERVICE_NAME];

impl Readiness {
    /// Starts not ready; `started` is the start-up instant `init_duration_seconds` counts from,
    /// `store` the store served (its gauges are refreshed as readiness turns on).
    pub async fn new(
        health: HealthReporter,
        started: Instant,
        store: Option<Arc<PostStore>>,
    ) -> Self {
        for service in HEALTH_SERVICES {
            health
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
        ProcessMetrics::global().ready.set(0);
        health
            .set_service_status(LIVENESS_SERVICE, ServingStatus::Serving)
            .await;
        Self {
            inner: Arc::new(Inner {
                ready: AtomicBool::new(false),
                health,
                started,
                reason: Mutex::new("starting: catching up with the event source".to_owned()),
                source: Mutex::new("not set".to_owned()),
                store,
            }),
        }
    }

    /// Why the server is ready or not (the reason of the last change).
    pub fn reason(&self) -> String {
        lock(&self.inner.reason).clone()
    }

    /// What feeds the store, as set by [`Readiness::set_source`].
    pub fn source(&self) -> String {
        lock(&self.inner.source).clone()
    }

    /// Records what feeds the store (shown on the status page).
    pub fn set_source(&self, source: impl Into<String>) {
        *lock(&self.inner.source) = source.into();
    }

    fn set_reason(&self, reason: &str) {
        *lock(&self.inner.reason) = reason.to_owned();
    }

    /// Seconds since start-up.
    pub fn uptime_secs(&self) -> f64 {
        self.inner.started.elapsed().as_secs_f64()
    }

    /// True once [`Readiness::set_ready`] ran (and until [`Readiness::set_not_ready`]).
    pub fn is_ready(&self) -> bool {
        // Relaxed: the flag guards no other data; probes only need to see it eventually.
        self.inner.ready.load(Ordering::Relaxed)
    }

    /// Publishes the store's statistics as the `post_store_*` gauges now.
    fn refresh_store_gauges(&self) {
        if let Some(store) = &self.inner.store {
            StoreMetrics::global().record(&store.stats());
        }
    }

    /// Marks the server ready: the store's gauges refreshed, then health SERVING, `/readyz`
    /// 200, `init_duration_seconds` set.
    pub async fn set_ready(&self) {
        self.refresh_store_gauges();
        ProcessMetrics::global()
            .init_duration
            .set(self.inner.started.elapsed().as_secs_f64());
        for service in HEALTH_SERVICES {
            self.inner
                .health
                .set_service_status(service, ServingStatus::Serving)
                .await;
        }
        self.set_reason("caught up with the event source");
        self.inner.ready.store(true, Ordering::Relaxed);
        ProcessMetrics::global().ready.set(1);
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
        if serving {
            self.refresh_store_gauges();
        }
        self.set_reason(reason);
        self.inner.ready.store(serving, Ordering::Relaxed);
        ProcessMetrics::global().ready.set(i64::from(serving));
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

    /// Turns readiness NOT_SERVING for the lame duck at shutdown: calls are still served (and
    /// liveness stays SERVING) while balancers take the replica out of rotation.
    pub async fn set_lame_duck(&self, reason: &str) {
        self.set_reason(reason);
        self.inner.ready.store(false, Ordering::Relaxed);
        ProcessMetrics::global().ready.set(0);
        for service in HEALTH_SERVICES {
            self.inner
                .health
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
    }

    /// Marks the server not ready (during shutdown, so balancers stop sending traffic); the
    /// liveness service turns NOT_SERVING too, as the process is going away.
    pub async fn set_not_ready(&self) {
        self.set_reason("shutting down");
        self.inner.ready.store(false, Ordering::Relaxed);
        ProcessMetrics::global().ready.set(0);
        for service in HEALTH_SERVICES.into_iter().chain([LIVENESS_SERVICE]) {
            self.inner
                .health
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
    }
}

/// Locks a status string; a poisoned lock (a panic while holding it) still holds a whole
/// string, so it is used as is.
fn lock(mutex: &Mutex<String>) -> std::sync::MutexGuard<'_, String> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
