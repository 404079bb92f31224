//! The server's lifecycle: the whole process as a type the tests drive in-process
//! (`replica.rs`: [`replica::Replica`] starts, catches up with its event source, serves and
//! stops in order; [`replica::run`] is what `thunder-server` runs), the gRPC and admin
//! listeners it boots around its store and stops gracefully (`listeners.rs`: [`start`],
//! [`RunningServer`]), and every wing's metrics registered together at start-up and
//! catalogued for docs/metrics.md (`metrics.rs`).

mod listeners;
pub mod metrics;
pub mod replica;

pub use listeners::{
    DEFAULT_ADMIN_CONNECTIONS, DEFAULT_GRPC_CONNECTIONS, DEFAULT_MAX_CONCURRENT_STREAMS,
    DEFAULT_MAX_DECODING_MESSAGE_BYTES, EXIT_DRAIN_CUT, PENDING_RESET_STREAMS_PER_STREAM,
    RunningServer, ServerOptions, start, start_with,
};
