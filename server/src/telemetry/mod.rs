//! What the process tells about itself, on the ground floor: every wing records into it, and
//! it imports no wing.
//!
//! # Files
//! - `metrics.rs`: every Prometheus metric of the process in one registry type
//!   ([`metrics::Metrics`]), served by the admin port at `/metrics`; the serving path,
//!   ingestion and the snapshot writer all record into it. `author_counts.rs` counts an
//!   answer's posts per author for the `found_*` metrics without sorting, and
//!   `count_histogram.rs` is the histogram they are observed in.
//! - `lag_refresh.rs`: the age of each Kafka partition's lag gauge, computed at each scrape.
//! - `reference_names.rs`: the metric names kept from the reference service, which
//!   docs/metrics.md marks.
//! - `readiness.rs`: the readiness and liveness state (`/readyz` and `/healthz` on the admin
//!   port, the gRPC health service), [`readiness::LIVENESS_SERVICE`].
//! - `resources.rs`: the memory limit (flag or cgroup) and the snapshot volume's space as
//!   metrics, for the alerts on memory and disk.

pub(crate) mod author_counts;
pub mod count_histogram;
pub mod lag_refresh;
pub mod metrics;
pub mod readiness;
pub mod reference_names;
pub mod resources;
