//! The Kafka ingestion's metrics: the [`KafkaMetrics`] part of the process-wide [`Metrics`],
//! where each is defined (name, help, labels) and registered.

use crate::admin::metrics::{KafkaMetrics, Metrics};

/// The Kafka metrics of [`Metrics::global`].
pub(super) fn kafka() -> &'static KafkaMetrics {
    &Metrics::global().kafka
}

/// Registers every metric now (if the server has not yet), so the Kafka ones are exported, at
/// zero, before the first event.
pub(super) fn init() {
    Metrics::global();
}
