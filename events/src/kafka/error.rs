//! The one error type of thunder's Kafka clients: the server's ingestion and the producer.

/// Errors of the Kafka clients.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// `--kafka-brokers` is not set.
    #[error("no Kafka brokers configured (--kafka-brokers / THUNDER_KAFKA_BROKERS)")]
    NoBrokers,
    /// A flag has a value ingestion cannot work with.
    #[error("invalid Kafka configuration: {0}")]
    InvalidConfig(String),
    /// librdkafka refused the configuration or a request.
    #[error("Kafka client error: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    /// No broker answered within the timeout; `cause` is librdkafka's latest connection
    /// failure (a TLS handshake or SASL login refused, a connection refused) or its error.
    #[error("no Kafka broker answered within {timeout_ms} ms: {cause}")]
    Unreachable {
        /// How long it waited.
        timeout_ms: u64,
        /// Why, as librdkafka reported it.
        cause: String,
    },
    /// An ingest thread could not be started.
    #[error("could not start a Kafka thread: {0}")]
    Thread(#[from] std::io::Error),
}
