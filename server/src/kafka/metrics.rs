//! Kafka ingestion's metrics: records consumed and skipped, poll and connection errors,
//! batches, partition lag, stalls and truncations, and the events dropped by reason,
//! declared into the process registry ([`Registrar`]) and reached through
//! [`KafkaMetrics::global`]. `lag_refresh.rs` is the age of each partition's lag gauge,
//! computed at each scrape.

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGaugeVec};
use thunder_engine::DropReason;

use super::lag_refresh::LagRefreshAge;
use crate::telemetry::registry::Registrar;

/// The Kafka ingestion's metrics.
#[derive(Clone, Debug)]
pub struct KafkaMetrics {
    /// `kafka_messages_failed_parse_total`: records skipped because they did not decode.
    pub messages_failed_parse: IntCounter,
    /// `kafka_poll_errors_total`: errors returned by consumer polls (the consumer retries).
    pub poll_errors: IntCounter,
    /// `kafka_oversized_fetch_responses_total`: fetch responses larger than the consumer's
    /// `receive.message.max.bytes` (the consumer is reconnected with a larger limit).
    pub oversized_fetch_responses: IntCounter,
    /// `kafka_consumer_receive_max_bytes{thread}`: the `receive.message.max.bytes` each ingest
    /// thread's consumer uses now.
    pub consumer_receive_max_bytes: IntGaugeVec,
    /// `kafka_messages_consumed_total`: records read from Kafka and applied (or skipped).
    pub messages_consumed: IntCounter,
    /// `batch_processing_seconds`: time to apply one batch to the store.
    pub batch_processing: Histogram,
    /// `kafka_partition_lag{topic,partition}`: high watermark minus the next offset to apply.
    pub partition_lag: IntGaugeVec,
    /// `kafka_partition_stalled{topic,partition}`: 1 while a partition is stalled after
    /// catch-up.
    pub partition_stalled: IntGaugeVec,
    /// `kafka_events_dropped_total{reason}`: decoded events that changed nothing, by reason
    /// ([`drop_reasons`]: `out_of_contract_id`, rejected at decode, and the store's drop
    /// reasons). Every reason is exported at zero from the start.
    pub events_dropped: IntCounterVec,
    /// `kafka_log_truncations_total{topic,partition}`: times the partition's log end was found
    /// below the position ingestion had read to (the broker lost records and may reuse their
    /// offsets); ingestion resumed at the new log end. Exported at zero for every partition.
    pub log_truncations: IntCounterVec,
    /// `kafka_partition_lag_refresh_age_seconds{topic,partition}`: seconds since
    /// `kafka_partition_lag` was last refreshed from the broker, at each scrape (the lag sample
    /// is removed while the refresh fails).
    pub partition_lag_refresh_age: LagRefreshAge,
    /// `kafka_connection_errors_total{reason}`: broker connection failures librdkafka
    /// reported, by reason (`tls`, `authentication`, `resolve`, `transport`); exported at zero.
    pub connection_errors: IntCounterVec,
}

/// The `kafka_connection_errors_total` reasons (librdkafka's reports are sorted into them by
/// `kafka/connection.rs`).
pub mod connection_reasons {
    /// `kafka_connection_errors_total` reason of a failed TLS handshake.
    pub const TLS: &str = "tls";
    /// ... of SASL authentication refused.
    pub const AUTHENTICATION: &str = "authentication";
    /// ... of a broker name that does not resolve.
    pub const RESOLVE: &str = "resolve";
    /// ... of a connection refused, reset, timed out or closed by the broker.
    pub const TRANSPORT: &str = "transport";

    /// Every reason, exported at zero from the start.
    pub const REASONS: [&str; 4] = [TLS, AUTHENTICATION, RESOLVE, TRANSPORT];
}

/// The `kafka_events_dropped_total` reason of events rejected at decode (an id the contract
/// cannot express: negative, or a post or author id of 0); the other reasons are
/// [`DELETED_IN_BATCH`] and the store's [`DropReason`]s.
pub const OUT_OF_CONTRACT_ID: &str = "out_of_contract_id";

/// The `kafka_events_dropped_total` reason of a create that a delete of the same batch removed
/// again, so it was never served.
pub const DELETED_IN_BATCH: &str = "deleted_in_batch";

/// Every label of `kafka_events_dropped_total`, exported at zero from the start.
pub fn drop_reasons() -> impl Iterator<Item = &'static str> {
    [OUT_OF_CONTRACT_ID, DELETED_IN_BATCH]
        .into_iter()
        .chain(DropReason::ALL.iter().map(|r| r.as_str()))
}

impl KafkaMetrics {
    /// Builds the metrics into `r`; every drop reason and connection error reason is exported
    /// at zero from the start.
    pub fn new(r: &Registrar<'_>) -> Self {
        let metrics = Self {
            messages_failed_parse: r.counter(
                "kafka_messages_failed_parse_total",
                "Kafka records skipped because they are not a decodable InNetworkEvent with a variant",
            ),
            poll_errors: r.counter(
                "kafka_poll_errors_total",
                "Errors returned by Kafka consumer polls",
            ),
            oversized_fetch_responses: r.counter(
                "kafka_oversized_fetch_responses_total",
                "Kafka fetch responses larger than the consumer's receive.message.max.bytes (the consumer reconnects with a larger limit, up to --kafka-max-response-bytes)",
            ),
            consumer_receive_max_bytes: r.gauge_vec(
                "kafka_consumer_receive_max_bytes",
                "receive.message.max.bytes of each Kafka ingest thread's consumer",
                &["thread"],
            ),
            messages_consumed: r.counter(
                "kafka_messages_consumed_total",
                "Kafka records consumed and applied to the store (including skipped bad records)",
            ),
            batch_processing: r.histogram(
                "batch_processing_seconds",
                "Time to apply one batch of Kafka events to the post store",
                vec![0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
            ),
            partition_lag: r.gauge_vec(
                "kafka_partition_lag",
                "Records in the partition not yet applied to the store",
                &["topic", "partition"],
            ),
            partition_stalled: r.gauge_vec(
                "kafka_partition_stalled",
                "1 while the partition has records to read but applied none within --kafka-stall-timeout-secs",
                &["topic", "partition"],
            ),
            events_dropped: r.counter_vec(
                "kafka_events_dropped_total",
                &format!(
                    "Kafka events dropped, by reason ({})",
                    drop_reasons().collect::<Vec<_>>().join(", ")
                ),
                &["reason"],
            ),
            log_truncations: r.counter_vec(
                "kafka_log_truncations_total",
                "Times the partition's log end was found below the offset ingestion had read to (records lost by the broker, their offsets possibly reused); ingestion resumed at the new log end",
                &["topic", "partition"],
            ),
            partition_lag_refresh_age: r.described(LagRefreshAge::new(), "gauge"),
            connection_errors: r.counter_vec(
                "kafka_connection_errors_total",
                "Kafka broker connection failures, by reason (tls: handshake refused, authentication: SASL refused, resolve: unknown host, transport: refused, reset or timed out); librdkafka reports a repeated failure once per 30 s per broker",
                &["reason"],
            ),
        };
        for reason in drop_reasons() {
            metrics.events_dropped.with_label_values(&[reason]);
        }
        for reason in connection_reasons::REASONS {
            metrics.connection_errors.with_label_values(&[reason]);
        }
        metrics
    }
}

crate::process_instance!(KafkaMetrics);

#[cfg(test)]
mod tests {
    use prometheus::Registry;

    use super::*;

    #[test]
    fn every_drop_reason_is_exported_at_zero() {
        let registry = Registry::new();
        let metrics = KafkaMetrics::new(&Registrar::new(&registry));
        for reason in drop_reasons() {
            assert_eq!(metrics.events_dropped.with_label_values(&[reason]).get(), 0);
        }
        let families = registry.gather();
        let dropped = families
            .iter()
            .find(|f| f.name() == "kafka_events_dropped_total")
            .expect("exported");
        assert_eq!(dropped.get_metric().len(), 2 + DropReason::ALL.len());
    }

    #[test]
    fn every_drop_reason_is_named_in_the_help() {
        let registry = Registry::new();
        let registrar = Registrar::new(&registry);
        KafkaMetrics::new(&registrar);
        let catalogue = registrar.into_catalogue();
        let dropped = catalogue
            .iter()
            .find(|m| m.name == "kafka_events_dropped_total")
            .expect("in the catalogue");
        for reason in drop_reasons() {
            assert!(dropped.help.contains(reason), "{reason}: {}", dropped.help);
        }
        assert!(dropped.help.contains("no_slot"), "{}", dropped.help);
    }
}
