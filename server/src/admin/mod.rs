//! The admin HTTP port: what operators and their tools read, on its own listener (127.0.0.1 by
//! default), apart from the gRPC port so that a flood of queries cannot lock them out. It sits
//! on the top floor: it reads the wings and [`crate::telemetry`], and no wing imports it.
//!
//! # Files
//! - `routes.rs`: the axum router ([`routes::router`]): reads open, privileged requests
//!   (profiles, snapshots, any mutation) allowed by the listener's [`routes::AdminMode`]
//!   (loopback, bearer token, or read-only) and the browser checks of [`routes::AdminAccess`].
//!   `/metrics`, `/readyz` and `/healthz` answer from [`crate::telemetry`].
//! - `profiling.rs`: CPU profiles with pprof-rs (`/debug/pprof/profile`,
//!   `/debug/pprof/flamegraph`).
//! - `status.rs`: the status page at `/`, rendered from the metrics registry and readiness, with
//!   the recent figures (answers per second over 10 s, the last minute's calls) from a
//!   background sampler, and the endpoint list.
//!
//! `POST /admin/snapshot` is routed here and handled by [`crate::snapshot`].

pub(crate) mod profiling;
pub mod routes;
pub(crate) mod status;
