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
