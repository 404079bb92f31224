//! The snapshots' metrics: the last snapshot written (when, how long, how large, how many
//! posts), the failed writes, and the start-up load, declared into the process registry
//! ([`Registrar`]) and reached through [`SnapshotMetrics::global`].

use prometheus::{Gauge, IntCounter, IntGauge};

use crate::telemetry::registry::Registrar;

/// The snapshots' metrics.
#[derive(Clone, Debug)]
pub struct SnapshotMetrics {
    /// `snapshot_last_success_timestamp_seconds`: when the last snapshot was completed.
    pub last_success: Gauge,
    /// `snapshot_last_duration_seconds`: wall time of the last snapshot written.
    pub last_duration: Gauge,
    /// `snapshot_last_bytes`: size of the last snapshot written.
    pub last_bytes: IntGauge,
    /// `snapshot_last_posts`: posts in the last snapshot written.
    pub last_posts: IntGauge,
    /// `snapshot_failures_total`: snapshots that could not be written.
    pub failures: IntCounter,
    /// `snapshot_load_seconds`: time to load the start-up snapshot (0: none loaded).
    pub load_duration: Gauge,
    /// `snapshot_loaded_posts`: posts loaded from the start-up snapshot.
    pub loaded_posts: IntGauge,
}

impl SnapshotMetrics {
    /// Builds the metrics into `r`.
    pub fn new(r: &Registrar<'_>) -> Self {
        Self {
            last_success: r.float_gauge(
                "snapshot_last_success_timestamp_seconds",
                "Unix time the last snapshot was completed",
            ),
            last_duration: r.float_gauge(
                "snapshot_last_duration_seconds",
                "Wall time of the last snapshot written",
            ),
            last_bytes: r.gauge("snapshot_last_bytes", "Size of the last snapshot written"),
            last_posts: r.gauge("snapshot_last_posts", "Posts in the last snapshot written"),
            failures: r.counter(
                "snapshot_failures_total",
                "Snapshots that could not be written",
            ),
            load_duration: r.float_gauge(
                "snapshot_load_seconds",
                "Time to load the start-up snapshot (0: none loaded)",
            ),
            loaded_posts: r.gauge(
                "snapshot_loaded_posts",
                "Posts loaded from the start-up snapshot",
            ),
        }
    }
}

crate::process_instance!(SnapshotMetrics);
