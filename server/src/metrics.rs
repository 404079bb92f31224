//! Prometheus metrics, under the reference service's names, in the default registry.
//!
//! Everything registers into [`prometheus::default_registry`], so metrics of other modules (the
//! Kafka ingestion) show up on `/metrics` without wiring. [`init`] registers all of them eagerly
//! so a scrape lists them before the first request.

use std::sync::LazyLock;

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};
use thunder_engine::{LightPost, StoreStats};

/// Registers `collector` in the default registry. A name clash (another module registered the
/// same name) is logged and the collector keeps working unexported, rather than failing start-up.
fn registered<C: Collector + Clone + 'static>(collector: C) -> C {
    if let Err(e) = prometheus::default_registry().register(Box::new(collector.clone())) {
        tracing::warn!(error = %e, "metric not registered");
    }
    collector
}

fn exp_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    prometheus::exponential_buckets(start, factor, count).unwrap_or_default()
}

fn ratio_buckets() -> Vec<f64> {
    (0..=10).map(|i| f64::from(i) / 10.0).collect()
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    registered(Histogram::with_opts(opts).unwrap_or_else(|_| unreachable_metric(name)))
}

fn histogram_vec(name: &str, help: &str, labels: &[&str], buckets: Vec<f64>) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    registered(HistogramVec::new(opts, labels).unwrap_or_else(|_| unreachable_metric(name)))
}

fn counter(name: &str, help: &str) -> IntCounter {
    registered(IntCounter::new(name, help).unwrap_or_else(|_| unreachable_metric(name)))
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(
        IntCounterVec::new(Opts::new(name, help), labels)
            .unwrap_or_else(|_| unreachable_metric(name)),
    )
}

fn gauge(name: &str, help: &str) -> IntGauge {
    registered(IntGauge::new(name, help).unwrap_or_else(|_| unreachable_metric(name)))
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(
        IntGaugeVec::new(Opts::new(name, help), labels)
            .unwrap_or_else(|_| unreachable_metric(name)),
    )
}

/// Metric definitions are compile-time constants; an invalid one is a bug in this file.
fn unreachable_metric(name: &str) -> ! {
    panic!("invalid metric definition: {name}")
}

/// Duration of a whole `GetInNetworkPosts` call.
pub static GET_IN_NETWORK_POSTS_DURATION: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "get_in_network_posts_duration_seconds",
        "Duration of GetInNetworkPosts calls",
        exp_buckets(0.001, 1.3, 40),
    )
});
/// Duration of a call without the follow-graph fetch.
pub static GET_IN_NETWORK_POSTS_DURATION_WITHOUT_STRATO: LazyLock<Histogram> =
    LazyLock::new(|| {
        histogram(
            "get_in_network_posts_duration_without_strato_seconds",
            "Duration of GetInNetworkPosts calls without the following-list fetch",
            exp_buckets(0.001, 1.3, 40),
        )
    });
/// Posts returned per call.
pub static GET_IN_NETWORK_POSTS_COUNT: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "get_in_network_posts_count",
        "Posts returned per GetInNetworkPosts call",
        exp_buckets(1.0, 1.2, 55),
    )
});
/// Length of `following_user_ids` as received (before truncation).
pub static GET_IN_NETWORK_POSTS_FOLLOWING_SIZE: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "get_in_network_posts_following_size",
        "Length of following_user_ids as received",
        exp_buckets(1.0, 1.2, 55),
    )
});
/// Length of `exclude_tweet_ids` as received (before truncation).
pub static GET_IN_NETWORK_POSTS_EXCLUDED_SIZE: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "get_in_network_posts_excluded_size",
        "Length of exclude_tweet_ids as received",
        exp_buckets(1.0, 1.2, 55),
    )
});
/// Effective `max_results` per call.
pub static GET_IN_NETWORK_POSTS_MAX_RESULTS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "get_in_network_posts_max_results",
        "Effective max_results per GetInNetworkPosts call",
        exp_buckets(1.0, 1.2, 55),
    )
});
/// Calls by final gRPC status code name.
pub static GET_IN_NETWORK_POSTS_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "get_in_network_posts_requests_total",
        "GetInNetworkPosts calls by gRPC status",
        &["status"],
    )
});
/// Request message size in bytes (protobuf-encoded).
pub static GET_IN_NETWORK_POSTS_REQUEST_BYTES: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "get_in_network_posts_request_bytes",
        "Encoded size of GetInNetworkPosts requests",
        exp_buckets(16.0, 2.0, 20),
    )
});
/// Response message size in bytes (protobuf-encoded, before compression).
pub static GET_IN_NETWORK_POSTS_RESPONSE_BYTES: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "get_in_network_posts_response_bytes",
        "Encoded size of GetInNetworkPosts responses",
        exp_buckets(16.0, 2.0, 20),
    )
});
/// Age of the newest post found, by stage.
pub static FOUND_FRESHNESS: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram_vec(
        "get_in_network_posts_found_freshness_seconds",
        "Age of the newest post found",
        &["stage"],
        time_range_buckets(),
    )
});
/// Time between the newest and the oldest post found, by stage.
pub static FOUND_TIME_RANGE: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram_vec(
        "get_in_network_posts_found_time_range_seconds",
        "Time between the newest and the oldest post found",
        &["stage"],
        time_range_buckets(),
    )
});
/// Share of replies among the posts found, by stage.
pub static FOUND_REPLY_RATIO: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram_vec(
        "get_in_network_posts_found_reply_ratio",
        "Share of replies among the posts found",
        &["stage"],
        ratio_buckets(),
    )
});
/// Distinct authors among the posts found, by stage.
pub static FOUND_UNIQUE_AUTHORS: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram_vec(
        "get_in_network_posts_found_unique_authors",
        "Distinct authors among the posts found",
        &["stage"],
        exp_buckets(1.0, 1.2, 55),
    )
});
/// Posts per author among the posts found, by stage.
pub static FOUND_POSTS_PER_AUTHOR: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram_vec(
        "get_in_network_posts_found_posts_per_author",
        "Posts per author among the posts found",
        &["stage"],
        vec![1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0],
    )
});
/// Store queries run.
pub static POST_STORE_REQUESTS: LazyLock<IntCounter> =
    LazyLock::new(|| counter("post_store_requests_total", "Store queries run"));
/// Store queries cut short by their deadline (partial answers).
pub static POST_STORE_REQUEST_TIMEOUTS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "post_store_request_timeouts_total",
        "Store queries cut short by their deadline",
    )
});
/// Posts returned by the store per query (before the final cut).
pub static POST_STORE_POSTS_RETURNED: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "post_store_posts_returned",
        "Posts returned by the store per query",
        exp_buckets(1.0, 1.2, 55),
    )
});
/// Returned posts over eligible timeline entries, per query.
pub static POST_STORE_POSTS_RETURNED_RATIO: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "post_store_posts_returned_ratio",
        "Posts returned over eligible timeline entries",
        ratio_buckets(),
    )
});
/// Calls being served now.
pub static IN_FLIGHT_REQUESTS: LazyLock<IntGauge> =
    LazyLock::new(|| gauge("in_flight_requests", "GetInNetworkPosts calls in flight"));
/// Calls refused by the QPS limit.
pub static REJECTED_REQUESTS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "rejected_requests_total",
        "GetInNetworkPosts calls refused by the QPS limit",
    )
});
/// Seconds from start-up to ready (store caught up).
pub static INIT_DURATION_SECONDS: LazyLock<prometheus::Gauge> = LazyLock::new(|| {
    registered(
        prometheus::Gauge::new("init_duration_seconds", "Seconds from start-up to ready")
            .unwrap_or_else(|_| unreachable_metric("init_duration_seconds")),
    )
});
/// Follow-graph fetches by endpoint and outcome.
pub static STRATO_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "strato_requests_total",
        "Following-list fetches by outcome",
        &["endpoint", "status"],
    )
});
/// Authors in the store.
pub static POST_STORE_USER_COUNT: LazyLock<IntGauge> =
    LazyLock::new(|| gauge("post_store_user_count", "Authors in the store"));
/// Post records in the store.
pub static POST_STORE_TOTAL_POSTS: LazyLock<IntGauge> =
    LazyLock::new(|| gauge("post_store_total_posts", "Post records in the store"));
/// Live tombstones (deleted post ids remembered).
pub static POST_STORE_DELETED_POSTS: LazyLock<IntGauge> =
    LazyLock::new(|| gauge("post_store_deleted_posts", "Live tombstones in the store"));
/// Store entities by type.
pub static POST_STORE_ENTITY_COUNT: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    gauge_vec(
        "post_store_entity_count",
        "Store entities by type",
        &["type"],
    )
});
/// Arena bytes by kind (`reserved`, `used`).
pub static POST_STORE_ARENA_BYTES: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    gauge_vec(
        "post_store_arena_bytes",
        "Bytes of the post arena by kind",
        &["kind"],
    )
});
/// Bytes held by timeline buffers.
pub static POST_STORE_TIMELINE_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "post_store_timeline_bytes",
        "Bytes held by per-author timeline buffers",
    )
});
/// Posts removed by trimming.
pub static POST_STORE_TRIMMED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "post_store_trimmed_posts_total",
        "Post records freed by trimming",
    )
});

fn time_range_buckets() -> Vec<f64> {
    vec![
        60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0, 86400.0, 129600.0,
        172800.0,
    ]
}

/// Registers every metric of this module, so `/metrics` lists them from the start.
pub fn init() {
    LazyLock::force(&GET_IN_NETWORK_POSTS_DURATION);
    LazyLock::force(&GET_IN_NETWORK_POSTS_DURATION_WITHOUT_STRATO);
    LazyLock::force(&GET_IN_NETWORK_POSTS_COUNT);
    LazyLock::force(&GET_IN_NETWORK_POSTS_FOLLOWING_SIZE);
    LazyLock::force(&GET_IN_NETWORK_POSTS_EXCLUDED_SIZE);
    LazyLock::force(&GET_IN_NETWORK_POSTS_MAX_RESULTS);
    LazyLock::force(&GET_IN_NETWORK_POSTS_REQUESTS);
    LazyLock::force(&GET_IN_NETWORK_POSTS_REQUEST_BYTES);
    LazyLock::force(&GET_IN_NETWORK_POSTS_RESPONSE_BYTES);
    LazyLock::force(&FOUND_FRESHNESS);
    LazyLock::force(&FOUND_TIME_RANGE);
    LazyLock::force(&FOUND_REPLY_RATIO);
    LazyLock::force(&FOUND_UNIQUE_AUTHORS);
    LazyLock::force(&FOUND_POSTS_PER_AUTHOR);
    LazyLock::force(&POST_STORE_REQUESTS);
    LazyLock::force(&POST_STORE_REQUEST_TIMEOUTS);
    LazyLock::force(&POST_STORE_POSTS_RETURNED);
    LazyLock::force(&POST_STORE_POSTS_RETURNED_RATIO);
    LazyLock::force(&IN_FLIGHT_REQUESTS);
    LazyLock::force(&REJECTED_REQUESTS);
    LazyLock::force(&INIT_DURATION_SECONDS);
    LazyLock::force(&STRATO_REQUESTS);
    LazyLock::force(&POST_STORE_USER_COUNT);
    LazyLock::force(&POST_STORE_TOTAL_POSTS);
    LazyLock::force(&POST_STORE_DELETED_POSTS);
    LazyLock::force(&POST_STORE_ENTITY_COUNT);
    LazyLock::force(&POST_STORE_ARENA_BYTES);
    LazyLock::force(&POST_STORE_TIMELINE_BYTES);
    LazyLock::force(&POST_STORE_TRIMMED);
}

/// Publishes the store's statistics as the `post_store_*` gauges.
pub fn record_store_stats(stats: &StoreStats) {
    let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    POST_STORE_USER_COUNT.set(as_i64(stats.authors));
    POST_STORE_TOTAL_POSTS.set(as_i64(stats.posts));
    POST_STORE_DELETED_POSTS.set(as_i64(stats.tombstones));
    for (kind, n) in [
        ("users", stats.authors),
        ("posts", stats.posts),
        ("original_posts", stats.original_entries),
        ("secondary_posts", stats.secondary_entries),
        ("video_posts", stats.video_entries),
        ("deleted_posts", stats.tombstones),
    ] {
        POST_STORE_ENTITY_COUNT
            .with_label_values(&[kind])
            .set(as_i64(n));
    }
    POST_STORE_ARENA_BYTES
        .with_label_values(&["reserved"])
        .set(as_i64(stats.arena_bytes_reserved));
    POST_STORE_ARENA_BYTES
        .with_label_values(&["used"])
        .set(as_i64(stats.arena_bytes_used));
    POST_STORE_TIMELINE_BYTES.set(as_i64(stats.timeline_bytes));
}

/// Observes the `get_in_network_posts_found_*` histograms for `posts` at `stage`
/// (`retrieved` or `scored`), like the reference's `analyze_and_report_post_statistics`.
pub fn record_found_posts(stage: &str, posts: &[LightPost], now_secs: i64) {
    let (Some(newest), Some(oldest)) = (
        posts.iter().map(|p| p.created_at).max(),
        posts.iter().map(|p| p.created_at).min(),
    ) else {
        return;
    };
    let labels = [stage];
    FOUND_FRESHNESS
        .with_label_values(&labels)
        .observe((now_secs - newest).max(0) as f64);
    FOUND_TIME_RANGE
        .with_label_values(&labels)
        .observe((newest - oldest) as f64);
    let replies = posts.iter().filter(|p| p.is_reply).count();
    FOUND_REPLY_RATIO
        .with_label_values(&labels)
        .observe(replies as f64 / posts.len() as f64);
    let mut per_author: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    for post in posts {
        *per_author.entry(post.author_id).or_default() += 1;
    }
    FOUND_UNIQUE_AUTHORS
        .with_label_values(&labels)
        .observe(per_author.len() as f64);
    let posts_per_author = FOUND_POSTS_PER_AUTHOR.with_label_values(&labels);
    for count in per_author.values() {
        posts_per_author.observe(*count as f64);
    }
}

/// Renders the default registry in the Prometheus text format.
pub fn render() -> String {
    let encoder = prometheus::TextEncoder::new();
    encoder
        .encode_to_string(&prometheus::gather())
        .unwrap_or_else(|e| format!("# encoding metrics failed: {e}\n"))
}
