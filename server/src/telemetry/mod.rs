//! What the process tells about itself, on the ground floor: every wing records into it, and
//! it imports no wing.
//!
//! # Files
//! - `registry.rs`: the metric registry every wing declares its metrics into
//!   ([`registry::Registrar`]: each metric named once, registered as it is built, noted in the
//!   catalogue docs/metrics.md is generated from), and [`registry::render`] for `/metrics`.
//!   Each wing keeps its metrics in a `metrics.rs` of its own (`serve`, `kafka`, `snapshot`;
//!   `maintenance` in its one file) and reaches them through that struct's `global()`.
//! - `metrics.rs`: the ground floor's own metrics: the process ([`metrics::ProcessMetrics`]:
//!   `process_*`, resources, build, readiness, start-up time) and the store's sizes
//!   ([`metrics::StoreMetrics`], refreshed by maintenance and as readiness turns on).
//! - `count_histogram.rs`: a histogram of whole numbers observed many at a time (the answers'
//!   posts per author).
//! - `reference_names.rs`: the metric names kept from the reference service, which
//!   docs/metrics.md marks.
//! - `readiness.rs`: the readiness and liveness state (`/readyz` and `/healthz` on the admin
//!   port, the gRPC health service), [`readiness::LIVENESS_SERVICE`].
//! - `resources.rs`: the memory limit (flag or cgroup) and the snapshot volume's space as
//!   metrics, for the alerts on memory and disk.

pub mod count_histogram;
pub mod metrics;
pub mod readiness;
pub mod reference_names;
pub mod registry;
pub mod resources;
