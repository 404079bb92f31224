//! The server's lifecycle: the gRPC and admin listeners around a store, booted and stopped
//! gracefully (`listeners.rs`: [`start`], [`RunningServer`]), and every wing's metrics
//! registered together at start-up and catalogued for docs/metrics.md (`metrics.rs`).

mod listeners;
pub mod metrics;

pub use listeners::{
    DEFAULT_ADMIN_CONNECTIONS, DEFAULT_GRPC_CONNECTIONS, DEFAULT_MAX_CONCURRENT_STREAMS,
    DEFAULT_MAX_DECODING_MESSAGE_BYTES, EXIT_DRAIN_CUT, PENDING_RESET_STREAMS_PER_STREAM,
    RunningServer, ServerOptions, start, start_with,
};
