//! The metric names thunder keeps from the reference service (X's Thunder, its `metrics.rs`):
//! a dashboard or an alert written for the reference reads the same series here.
//!
//! Two of them are gauges whose names end in `_count`, a suffix Prometheus reserves for the
//! sample count of a histogram or a summary, so `promtool check metrics` objects to them
//! ([`PROMTOOL_OBJECTS_TO`]); they keep the reference's names all the same.

/// Every metric thunder exports under the reference's name and meaning.
pub const REFERENCE_NAMES: [&str; 27] = [
    "get_in_network_posts_duration_seconds",
    "get_in_network_posts_duration_without_strato_seconds",
    "get_in_network_posts_count",
    "get_in_network_posts_following_size",
    "get_in_network_posts_excluded_size",
    "get_in_network_posts_max_results",
    "get_in_network_posts_found_freshness_seconds",
    "get_in_network_posts_found_time_range_seconds",
    "get_in_network_posts_found_reply_ratio",
    "get_in_network_posts_found_unique_authors",
    "get_in_network_posts_found_posts_per_author",
    "post_store_requests_total",
    "post_store_request_timeouts_total",
    "post_store_posts_returned",
    "post_store_posts_returned_ratio",
    "in_flight_requests",
    "rejected_requests_total",
    "init_duration_seconds",
    "strato_requests_total",
    "post_store_user_count",
    "post_store_total_posts",
    "post_store_deleted_posts",
    "post_store_entity_count",
    "kafka_messages_failed_parse_total",
    "kafka_poll_errors_total",
    "batch_processing_seconds",
    "kafka_partition_lag",
];

/// The reference names `promtool check metrics` objects to: gauges ending in `_count`.
pub const PROMTOOL_OBJECTS_TO: [&str; 2] = ["post_store_user_count", "post_store_entity_count"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::Metrics;

    #[test]
    fn every_reference_name_is_exported_and_the_count_gauges_are_among_them() {
        let catalogue = Metrics::catalogue();
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
