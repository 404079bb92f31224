//! The snapshots' metrics: the last snapshot written (when, how long, how large, how many
//! posts), the failed writes, and the start-up load, declared into the process registry
//! ([`Registrar`]) and reached through [`SnapshotMetrics::global`].

use prometheus::{Gauge, IntCounter, IntGauge, IntGaugeVec};
use thunder_engine::snapshot::SnapshotHeader;

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
    /// `snapshot_base_bytes`: size of the base file the store serves from (0: none).
    pub base_bytes: IntGauge,
    /// `snapshot_base_created_timestamp_seconds`: when the base was written (its age).
    pub base_created: Gauge,
    /// `snapshot_base_offset{partition}`: the Kafka offsets the base was written at (what the
    /// start resumed from).
    pub base_offsets: IntGaugeVec,
    /// `snapshot_base_checked`: 1 once every record of the base was checked.
    pub base_checked: IntGauge,
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
            base_bytes: r.gauge(
                "snapshot_base_bytes",
                "Size of the base file the store serves from (0: none)",
            ),
            base_created: r.float_gauge(
                "snapshot_base_created_timestamp_seconds",
                "Unix time the base the store serves from was written (0: none)",
            ),
            base_offsets: r.gauge_vec(
                "snapshot_base_offset",
                "Kafka offset the base was written at, per partition (where the start resumed)",
                &["partition"],
            ),
            base_checked: r.gauge(
                "snapshot_base_checked",
                "1 once every record of the base was checked (0: not yet, or no base)",
            ),
        }
    }

    /// Sets the base's gauges for the base file of `bytes` bytes written with `header`.
    pub fn set_base(&self, header: &SnapshotHeader, bytes: u64) {
        self.base_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.base_created.set(header.created_at_secs as f64);
        for offset in &header.meta.offsets {
            self.base_offsets
                .with_label_values(&[&offset.partition.to_string()])
                .set(offset.next_offset);
        }
    }
}

crate::process_instance!(SnapshotMetrics);
