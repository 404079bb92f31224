//! thunder-server: the gRPC front of the in-network post store.
//!
//! A thin layer over [`thunder_engine::PostStore`]: it speaks `thunder.v1.InNetworkPostsService`
//! (see `thunder-proto`), admits calls through a global QPS limit, validates and clamps requests,
//! runs the store query within the client's deadline under overload control
//! ([`serve::overload`]: bounded executors, degrade before reject), encodes the answer straight
//! from the store's posts ([`serve::codec`]), bounds its connections ([`serve::listener`]), and
//! serves admin endpoints (Prometheus metrics, health/readiness, CPU profiles) on a separate
//! HTTP port.
//!
//! # Usage
//! - [`start`] binds both listeners around a store (port 0 picks free ports) and returns a
//!   [`RunningServer`] with the bound addresses, the readiness switch and a graceful shutdown.
//! - [`handle_request`] runs one decoded request against a store without a network.
//!
//! The store is fed by Kafka ([`kafka`]) or, without brokers, by the synthetic [`demo`] source.
//!
//! # Layout
//! One wing a concern, on floors: a module imports only from its own floor or below, and no
//! two modules import each other (`tests/module_graph.rs` checks both).
//! - [`config`] on top: the command-line flags (into every wing's options, the lifecycle's
//!   included) and `--check-config`.
//! - [`lifecycle`] (boot and graceful stop of both listeners, every wing's metrics registered
//!   at start-up), then [`admin`]: the admin HTTP
//!   port (routes, the status page, profiles).
//! - The wings, side by side:
//!   - [`serve`]: the `GetInNetworkPosts` path, from the accepted connection to the encoded
//!     answer (listener, gRPC service, admission, overload control, validation, codec,
//!     cursors, the TLS files).
//!   - [`kafka`]: ingestion, the only way posts reach the store in production.
//!   - [`snapshot`]: the server's snapshots: when they are written, the admin trigger, and the
//!     restore at start-up (the file format is `thunder_engine::snapshot`'s).
//!   - `maintenance` (the store's background trim and statistics gauges), [`demo`] (the
//!     synthetic event source), [`shard`] (the author shard of this process).
//! - [`telemetry`] on the ground floor: the metric registry, readiness and the resource
//!   collectors. Every wing declares its own metrics into that registry, in a `metrics.rs` of
//!   its own, and reaches them through the struct's `global()`; `lifecycle::metrics` lists
//!   them all.
//! - Under it all: [`version`] (what the binary is: version, git commit, compiler) and
//!   [`error`]. The wire types' conversions to the engine's records are `thunder_events::wire`'s,
//!   used directly: the server re-exports nothing of `thunder_events`.
#![deny(missing_docs)]

pub mod admin;
pub mod config;
pub mod demo;
pub mod error;
pub mod kafka;
pub mod lifecycle;
pub(crate) mod maintenance;
pub mod serve;
pub mod shard;
pub mod snapshot;
pub mod telemetry;
pub mod version;

pub use config::Args;
pub use error::{ServiceError, StartupError};
pub use lifecycle::{RunningServer, ServerOptions, start};
pub use serve::following::FollowingSource;
pub use serve::request::handle_request;
