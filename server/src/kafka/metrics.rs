//! Kafka ingestion metrics, registered in the prometheus default registry under the
//! reference's names.

use std::sync::LazyLock;

use prometheus::core::Collector;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGaugeVec, Opts};

/// Registers `metric` in the default registry. A clash (same name registered elsewhere) is
/// logged and the metric keeps working unexported rather than taking the process down.
fn register<M: Collector + Clone + 'static>(metric: M) -> M {
    if let Err(error) = prometheus::default_registry().register(Box::new(metric.clone())) {
        tracing::warn!(%error, "could not register a Kafka metric");
    }
    metric
}

/// `kafka_messages_failed_parse_total`: records skipped because they did not decode.
pub static MESSAGES_FAILED_PARSE: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "kafka_messages_failed_parse_total",
            "Kafka records skipped because they are not a decodable InNetworkEvent with a variant",
        )
        .expect("valid metric"),
    )
});

/// `kafka_poll_errors_total`: errors returned by consumer polls (the consumer retries).
pub static POLL_ERRORS: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "kafka_poll_errors_total",
            "Errors returned by Kafka consumer polls",
        )
        .expect("valid metric"),
    )
});

/// `kafka_messages_consumed_total`: records read from Kafka and applied (or skipped).
pub static MESSAGES_CONSUMED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "kafka_messages_consumed_total",
            "Kafka records consumed and applied to the store (including skipped bad records)",
        )
        .expect("valid metric"),
    )
});

/// `batch_processing_seconds`: time to apply one batch to the store.
pub static BATCH_PROCESSING_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        Histogram::with_opts(
            HistogramOpts::new(
                "batch_processing_seconds",
                "Time to apply one batch of Kafka events to the post store",
            )
            .buckets(vec![
                0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
            ]),
        )
        .expect("valid metric"),
    )
});

/// `kafka_partition_lag{topic,partition}`: high watermark minus the next offset to apply.
pub static PARTITION_LAG: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "kafka_partition_lag",
                "Records in the partition not yet applied to the store",
            ),
            &["topic", "partition"],
        )
        .expect("valid metric"),
    )
});

/// Registers every Kafka metric now, so they are exported (at zero) before the first event.
pub fn init() {
    LazyLock::force(&MESSAGES_FAILED_PARSE);
    LazyLock::force(&POLL_ERRORS);
    LazyLock::force(&MESSAGES_CONSUMED);
    LazyLock::force(&BATCH_PROCESSING_SECONDS);
    LazyLock::force(&PARTITION_LAG);
}
