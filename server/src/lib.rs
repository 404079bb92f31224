//! thunder-server: the gRPC front of the in-network post store.
//!
//! A thin layer over [`thunder_engine::PostStore`]: it speaks `thunder.v1.InNetworkPostsService`
//! (see `thunder-proto`), admits calls through a global QPS limit, validates and clamps requests,
//! runs the store query within the client's deadline under overload control ([`overload`]:
//! bounded executors, degrade before reject), encodes the answer straight from the store's
//! posts ([`codec`]), bounds its connections ([`listener`]), and serves admin endpoints
//! (Prometheus metrics, health/readiness, CPU profiles) on a separate HTTP port.
//!
//! # Usage
//! - [`server::start`] binds both listeners around a store (port 0 picks free ports) and returns
//!   a [`RunningServer`] with the bound addresses, the readiness switch and a graceful shutdown.
//! - [`request::handle_request`] runs one decoded request against a store without a network.
//!
//! The store is fed by Kafka ([`kafka`]) or, without brokers, by the synthetic [`demo`] source.
#![deny(missing_docs)]

pub mod admin;
pub mod admission;
pub mod arrival;
pub mod author_counts;
pub mod codec;
pub mod config;
pub mod config_check;
pub mod convert;
pub mod cursor;
pub mod demo;
pub mod error;
pub mod extensions;
pub mod following;
pub mod grpc;
pub mod kafka;
pub mod listener;
pub mod log_limit;
pub mod metrics;
pub mod overload;
pub mod profiling;
pub mod readiness;
pub mod request;
pub mod server;
pub mod service;
pub mod shard;
pub mod snapshot;
pub mod snapshot_pacing;
pub mod status;
pub mod tasks;
pub mod tls;
pub mod write_batch;

pub use config::Args;
pub use error::{ServiceError, StartupError};
pub use following::FollowingSource;
pub use request::handle_request;
pub use server::{RunningServer, ServerOptions, start};
