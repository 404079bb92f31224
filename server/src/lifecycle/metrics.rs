//! Every wing's metrics together: registered at start-up, so that a scrape lists every family
//! before the first call or event ([`register`]), and catalogued for docs/metrics.md
//! ([`catalogue`]). Each wing declares its own (see `telemetry::registry`); this is the one
//! list of them.

use prometheus::Registry;

use crate::kafka::metrics::KafkaMetrics;
use crate::maintenance::MaintenanceMetrics;
use crate::serve::metrics::{AnswerMetrics, ConnectionMetrics, ServeMetrics};
use crate::snapshot::metrics::SnapshotMetrics;
use crate::telemetry::metrics::{ProcessMetrics, StoreMetrics};
use crate::telemetry::registry::{MetricInfo, Registrar};

/// Builds every wing's metrics into `r`, in the order docs/metrics.md lists them.
fn build(r: &Registrar<'_>) {
    ProcessMetrics::new(r);
    ServeMetrics::new(r);
    AnswerMetrics::new(r);
    ConnectionMetrics::new(r);
    StoreMetrics::new(r);
    MaintenanceMetrics::new(r);
    KafkaMetrics::new(r);
    SnapshotMetrics::new(r);
}

/// Registers every wing's metrics in the process registry (each wing's `global()` instance),
/// so a scrape lists them all from the start. Idempotent.
pub fn register() {
    ProcessMetrics::global();
    ServeMetrics::global();
    AnswerMetrics::global();
    ConnectionMetrics::global();
    StoreMetrics::global();
    MaintenanceMetrics::global();
    KafkaMetrics::global();
    SnapshotMetrics::global();
}

/// Every metric family the process exports, with its type, label names and help, wing by
/// wing (the process first): the source of docs/metrics.md. Label names are known here even
/// for label sets no sample has used yet.
pub fn catalogue() -> Vec<MetricInfo> {
    let registry = Registry::new();
    let registrar = Registrar::new(&registry);
    build(&registrar);
    registrar.into_catalogue()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::reference_names::{PROMTOOL_OBJECTS_TO, REFERENCE_NAMES};

    fn family_names(registry: &Registry) -> Vec<String> {
        registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect()
    }

    #[test]
    fn unlabelled_metrics_are_exported_from_the_start() {
        let registry = Registry::new();
        build(&Registrar::new(&registry));
        let names = family_names(&registry);
        for name in [
            "get_in_network_posts_duration_seconds",
            "get_in_network_posts_count",
            "post_store_requests_total",
            "in_flight_requests",
            "init_duration_seconds",
            "post_store_trimmed_posts_total",
            "kafka_messages_failed_parse_total",
            "kafka_poll_errors_total",
            "kafka_oversized_fetch_responses_total",
            "kafka_messages_consumed_total",
            "batch_processing_seconds",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} missing");
        }
    }

    #[test]
    fn the_catalogue_knows_every_family_and_its_labels_before_any_sample() {
        let registry = Registry::new();
        build(&Registrar::new(&registry));
        let catalogue = catalogue();
        let find = |name: &str| {
            catalogue
                .iter()
                .find(|m| m.name == name)
                .unwrap_or_else(|| panic!("{name} not in the catalogue"))
        };
        assert_eq!(find("kafka_partition_lag").labels, ["topic", "partition"]);
        assert_eq!(find("kafka_partition_lag").kind, "gauge");
        assert_eq!(find("strato_requests_total").labels, ["endpoint", "status"]);
        assert_eq!(
            find("get_in_network_posts_duration_seconds").kind,
            "histogram"
        );
        assert_eq!(find("process_resident_memory_bytes").kind, "gauge");
        // Every family a scrape shows is catalogued, with the same type and help.
        for family in registry.gather() {
            let info = find(family.name());
            assert_eq!(info.help, family.help(), "{}", family.name());
            let kind = format!("{:?}", family.get_field_type()).to_ascii_lowercase();
            assert_eq!(info.kind, kind, "{}", family.name());
        }
        let mut names: Vec<_> = catalogue.iter().map(|m| &m.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), catalogue.len(), "a family is catalogued twice");
    }

    #[test]
    fn registering_registers_every_wing_in_the_process_registry() {
        register();
        register();
        // Only presence is read: no other test takes a family out of the process registry.
        let names = family_names(prometheus::default_registry());
        for name in [
            "server_ready",
            "get_in_network_posts_duration_seconds",
            "post_store_total_posts",
            "post_store_trimmed_posts_total",
            "kafka_messages_consumed_total",
            "snapshot_failures_total",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} missing");
        }
    }

    #[test]
    fn every_reference_name_is_exported_and_the_count_gauges_are_among_them() {
        let catalogue = catalogue();
        let kind = |name: &str| {
            catalogue
                .iter()
                .find(|m| m.name == name)
                .map(|m| m.kind)
                .unwrap_or_else(|| panic!("{name} is not exported"))
        };
        for name in REFERENCE_NAMES {
            kind(name);
        }
        for name in PROMTOOL_OBJECTS_TO {
            assert!(REFERENCE_NAMES.contains(&name), "{name}");
            assert_eq!(kind(name), "gauge", "{name}");
            assert!(name.ends_with("_count"), "{name}");
        }
        // No gauge of thunder's own ends in `_count`.
        for metric in &catalogue {
            if metric.kind == "gauge" && metric.name.ends_with("_count") {
                assert!(
                    PROMTOOL_OBJECTS_TO.contains(&metric.name.as_str()),
                    "{}",
                    metric.name
                );
            }
        }
    }
}
