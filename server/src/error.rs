//! Errors of the server and their one mapping to gRPC status codes.

use std::net::SocketAddr;

/// Why a `GetInNetworkPosts` call failed. [`From<ServiceError> for tonic::Status`] is the only
/// place where failures become gRPC codes.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The global QPS quota is spent.
    #[error("QPS rate limit exceeded, please retry")]
    RateLimited,
    /// The query queue is too long for the call to be answered in time (overload control).
    #[error("Server at capacity, please retry")]
    Overloaded,
    /// The client's deadline passed before the answer was ready.
    #[error("deadline exceeded before the answer was ready")]
    DeadlineExceeded,
    /// A request field is out of range.
    #[error("{0}")]
    InvalidArgument(String),
    /// The configured follow-graph source failed.
    #[error("Failed to fetch following list: {0}")]
    FollowingFetch(String),
    /// The blocking query task panicked or was cancelled.
    #[error("Failed to process posts: {0}")]
    QueryTask(String),
}

impl ServiceError {
    /// The gRPC code this error is answered with.
    pub fn code(&self) -> tonic::Code {
        match self {
            ServiceError::RateLimited | ServiceError::Overloaded => tonic::Code::ResourceExhausted,
            ServiceError::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            ServiceError::InvalidArgument(_) => tonic::Code::InvalidArgument,
            ServiceError::FollowingFetch(_) | ServiceError::QueryTask(_) => tonic::Code::Internal,
        }
    }
}

impl From<ServiceError> for tonic::Status {
    fn from(error: ServiceError) -> Self {
        tonic::Status::new(error.code(), error.to_string())
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// A flag has a value the server refuses.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A TLS file could not be read or used.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// The gRPC reflection service could not be built.
    #[error("reflection setup failed: {0}")]
    Reflection(String),
}

/// Why the server process stopped with a failure (`thunder-server` exits with status 1).
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// It could not start serving.
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// Kafka ingestion could not start (a configuration librdkafka refuses).
    #[error("starting Kafka ingestion: {0}")]
    Kafka(#[source] thunder_events::kafka::KafkaError),
    /// The demo backlog could not be loaded.
    #[error("loading the demo backlog: {0}")]
    DemoBacklog(String),
    /// Kafka ingestion failed before the store caught up.
    #[error("Kafka ingestion failed before catching up: {0}")]
    CatchUpFailed(String),
    /// Kafka ingestion went away before the store caught up.
    #[error("Kafka ingestion stopped before catching up")]
    CatchUpStopped,
    /// Kafka ingestion failed after the store caught up: it no longer follows the topic.
    #[error("Kafka ingestion failed after catch-up: {0}")]
    IngestFailed(String),
}
