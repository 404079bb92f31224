//! thunder's Kafka clients, behind the `kafka` feature (it links librdkafka): the connection
//! flags and the client configuration they make ([`KafkaClientArgs`], `client.rs`), what the
//! security flags mean together and the checks of the TLS files (`security.rs`), the producer
//! of `InNetworkEvent` records ([`EventProducer`], `producer.rs`) and the one error type
//! ([`KafkaError`]). The server's ingestion flattens [`KafkaClientArgs`] into its own flags and
//! builds its consumers on [`KafkaClientArgs::client_config`].

mod client;
mod error;
mod producer;
mod security;

pub use client::{IN_NETWORK_EVENTS_TOPIC, KafkaClientArgs};
pub use error::KafkaError;
pub use producer::{EventProducer, ProducerStats};
pub use security::{
    EXPIRY_WARNING_DAYS, Findings, SecurityProtocol, builtin_features, certificate_dates, key_fits,
    read_certificates,
};
