//! The admin HTTP port: what operators and their tools read, on its own listener (127.0.0.1 by
//! default), apart from the gRPC port so that a flood of queries cannot lock them out.
//!
//! # Files
//! - `routes.rs`: the axum router ([`routes::router`]): reads open, privileged requests
//!   (profiles, snapshots, any mutation) allowed by the listener's [`routes::AdminMode`]
//!   (loopback, bearer token, or read-only) and the browser checks of [`routes::AdminAccess`].
//! - `metrics.rs`: every Prometheus metric of the process in one registry type
//!   ([`metrics::Metrics`]), served at `/metrics`; the serving path, ingestion and the snapshot
//!   writer all record into it. `author_counts.rs` counts an answer's posts per author for the
//!   `found_*` metrics without sorting.
//! - `readiness.rs`: readiness (`/readyz`, the gRPC health service's default) and liveness
//!   (`/healthz`, [`readiness::LIVENESS_SERVICE`]).
//! - `resources.rs`: the memory limit (flag or cgroup) and the snapshot volume's space as
//!   metrics, for the alerts on memory and disk.
//! - `profiling.rs`: CPU profiles with pprof-rs (`/debug/pprof/profile`,
//!   `/debug/pprof/flamegraph`).
//! - `status.rs`: the status page at `/`, rendered from the metrics registry and readiness, with
//!   the recent figures (answers per second over 10 s, the last minute's calls) from a
//!   background sampler.
//!
//! `POST /admin/snapshot` is routed here and handled by [`crate::snapshot`].

pub(crate) mod author_counts;
pub mod count_histogram;
pub mod metrics;
pub(crate) mod profiling;
pub mod readiness;
pub mod resources;
pub mod routes;
pub(crate) mod status;
