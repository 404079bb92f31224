//! Prometheus metrics, under the reference service's names, as one registry type.
//!
//! [`Metrics`] holds every metric of the process, the Kafka ingestion's in [`KafkaMetrics`].
//! Each field is named (prometheus name and help) once, in [`Metrics::new`], and registered as
//! it is built: there is no separate list to keep in sync. [`Metrics::global`] is the instance
//! the server uses, registered in [`prometheus::default_registry`] on first use (at start-up),
//! so a scrape lists every metric before the first request; [`render`] encodes that registry.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use thunder_engine::snapshot::SnapshotHeader;
use thunder_engine::{DropReason, LightPost, StoreStats};

use crate::telemetry::count_histogram::{CountHistogramVec, Stage};
use crate::telemetry::lag_refresh::LagRefreshAge;
use crate::telemetry::resources::{ResourceCollector, family_descs};

/// Every metric of the process.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// `get_in_network_posts_duration_seconds`: duration of a whole `GetInNetworkPosts` call.
    pub request_duration: Histogram,
    /// `get_in_network_posts_duration_without_strato_seconds`: duration of a call after the
    /// follow-graph fetch.
    pub request_duration_without_fetch: Histogram,
    /// `get_in_network_posts_count`: posts returned per call.
    pub posts_returned: Histogram,
    /// `get_in_network_posts_following_size`: length of `following_user_ids` as received
    /// (before truncation).
    pub following_size: Histogram,
    /// `get_in_network_posts_excluded_size`: length of `exclude_tweet_ids` as received (before
    /// truncation).
    pub excluded_size: Histogram,
    /// `get_in_network_posts_max_results`: effective `max_results` per call.
    pub max_results: Histogram,
    /// `get_in_network_posts_requests_total{status}`: calls by final gRPC status
    /// ([`status_label`]).
    pub requests: IntCounterVec,
    /// `explain_requests_total{status}`: `ExplainPost` calls by final gRPC status
    /// ([`status_label`]); not counted among the `GetInNetworkPosts` calls.
    pub explain_requests: IntCounterVec,
    /// `get_in_network_posts_request_bytes`: request message size (protobuf-encoded).
    pub request_bytes: Histogram,
    /// `get_in_network_posts_response_bytes`: response message size (protobuf-encoded, before
    /// compression).
    pub response_bytes: Histogram,
    /// `get_in_network_posts_found_freshness_seconds{stage}`: age of the newest post found.
    pub found_freshness: HistogramVec,
    /// `get_in_network_posts_found_time_range_seconds{stage}`: time between the newest and the
    /// oldest post found.
    pub found_time_range: HistogramVec,
    /// `get_in_network_posts_found_reply_ratio{stage}`: share of replies among the posts found.
    pub found_reply_ratio: HistogramVec,
    /// `get_in_network_posts_found_unique_authors{stage}`: distinct authors among the posts
    /// found.
    pub found_unique_authors: HistogramVec,
    /// `get_in_network_posts_found_posts_per_author{stage}`: posts per author among the posts
    /// found (every author of an answer observed at once).
    pub found_posts_per_author: CountHistogramVec,
    /// `post_store_requests_total`: store queries run.
    pub store_queries: IntCounter,
    /// `post_store_request_timeouts_total`: store queries cut short by their deadline (partial
    /// answers).
    pub store_query_timeouts: IntCounter,
    /// `post_store_posts_returned`: posts returned by the store per query (before the final
    /// cut).
    pub store_posts_returned: Histogram,
    /// `post_store_posts_returned_ratio`: returned posts over eligible timeline entries, per
    /// query.
    pub store_posts_returned_ratio: Histogram,
    /// `in_flight_requests`: calls being served now.
    pub in_flight_requests: IntGauge,
    /// `rejected_requests_total`: calls refused by the QPS limit or by overload control.
    pub rejected_requests: IntCounter,
    /// `get_in_network_posts_degrade_level_total{level}`: store queries run, by the degrade
    /// level they were answered at (`0`: full answer).
    pub degrade_levels: IntCounterVec,
    /// `get_in_network_posts_refusal_seconds`: time from a call's start to its overload
    /// refusal.
    pub refusal_duration: Histogram,
    /// `get_in_network_posts_queue_wait_seconds`: time from a call's acceptance to its store
    /// query starting (the follow-graph fetch left out): the queue wait the overload
    /// controller acts on, run queue included.
    pub queue_wait: Histogram,
    /// `get_in_network_posts_late_answers_total`: answers ready only after the client's
    /// deadline (answered `DEADLINE_EXCEEDED`).
    pub late_answers: IntCounter,
    /// `grpc_connections{port}`: open connections.
    pub connections: IntGaugeVec,
    /// `grpc_connections_refused_total{port}`: connections closed at accept (connection cap).
    pub connections_refused: IntCounterVec,
    /// `grpc_connections_evicted_total{port,reason}`: idle connections closed to admit a new
    /// one at a cap.
    pub connections_evicted: IntCounterVec,
    /// `grpc_tls_handshake_failures_total{reason}`: connections to the gRPC port closed because
    /// their TLS handshake failed, by [`TLS_FAILURE_REASONS`] (every reason
    /// exported at zero from the start).
    pub tls_handshake_failures: IntCounterVec,
    /// `thunder_build_info{version,git_sha,rustc,features}`: 1, labelled with what the binary
    /// is ([`crate::version`]).
    pub build_info: IntGaugeVec,
    /// `init_duration_seconds`: seconds from start-up to ready (store caught up).
    pub init_duration: Gauge,
    /// `server_ready`: 1 while readiness is SERVING (caught up, no partition stalled), else 0.
    pub ready: IntGauge,
    /// `strato_requests_total{endpoint,status}`: follow-graph fetches by endpoint and outcome.
    pub following_fetches: IntCounterVec,
    /// `post_store_user_count`: authors in the store.
    pub store_authors: IntGauge,
    /// `post_store_total_posts`: post records in the store.
    pub store_posts: IntGauge,
    /// `post_store_deleted_posts`: live tombstones (deleted post ids remembered).
    pub store_tombstones: IntGauge,
    /// `post_store_entity_count{type}`: store entities by type.
    pub store_entities: IntGaugeVec,
    /// `post_store_arena_bytes{kind}`: arena bytes by kind (`reserved`, `used`).
    pub store_arena_bytes: IntGaugeVec,
    /// `post_store_timeline_bytes`: bytes held by timeline buffers.
    pub store_timeline_bytes: IntGauge,
    /// `post_store_index_bytes`: bytes of the post and author indexes (tables and author
    /// records).
    pub store_index_bytes: IntGauge,
    /// `post_store_trimmed_posts_total`: posts removed by trimming.
    pub store_trimmed_posts: IntCounter,
    /// The Kafka ingestion's metrics.
    pub kafka: KafkaMetrics,
    /// The snapshots' metrics.
    pub snapshot: SnapshotMetrics,
    /// The standard `process_*` metrics (resident memory, CPU, start time, open files), read
    /// from `/proc/self` at each scrape.
    pub process: ProcessCollector,
    /// `memory_limit_bytes` and the snapshot volume's space (`snapshot_volume_*_bytes`).
    pub resources: ResourceCollector,
}

/// The Kafka ingestion's metrics (part of [`Metrics`]).
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
pub mod kafka_connection {
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

/// The `grpc_tls_handshake_failures_total` reasons, in the order the help lists them and of
/// `serve::tls_accept::TlsFailure`'s variants, whose labels they are.
pub const TLS_FAILURE_REASONS: [&str; 7] = [
    "no_client_certificate",
    "bad_client_certificate",
    "not_tls",
    "client_alert",
    "protocol",
    "timeout",
    "closed",
];

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

static GLOBAL: LazyLock<Metrics> = LazyLock::new(|| Metrics::new(prometheus::default_registry()));

impl Metrics {
    /// The process's metrics, registered in [`prometheus::default_registry`] by the first call.
    pub fn global() -> &'static Metrics {
        &GLOBAL
    }

    /// Builds every metric and registers it in `registry`. A name clash (something else
    /// registered the same name) is logged and that metric keeps working unexported, rather
    /// than failing start-up.
    pub fn new(registry: &Registry) -> Self {
        Self::build(&Registrar::new(registry))
    }

    /// Every metric family the process exports, with its type, label names and help, in the
    /// order they are built (process metrics first): the source of docs/metrics.md. Label names
    /// are known here even for label sets no sample has used yet.
    pub fn catalogue() -> Vec<MetricInfo> {
        let registry = Registry::new();
        let registrar = Registrar::new(&registry);
        Self::build(&registrar);
        registrar.catalogue.into_inner()
    }

    fn build(r: &Registrar<'_>) -> Self {
        let process = r.collector(ProcessCollector::new(), ProcessCollector::FAMILIES);
        let resources = r.collector(ResourceCollector::new(), ResourceCollector::FAMILIES);
        let metrics = Self {
            request_duration: r.histogram(
                "get_in_network_posts_duration_seconds",
                "Duration of GetInNetworkPosts calls",
                exp_buckets(0.001, 1.3, 40),
            ),
            request_duration_without_fetch: r.histogram(
                "get_in_network_posts_duration_without_strato_seconds",
                "Duration of GetInNetworkPosts calls without the following-list fetch",
                exp_buckets(0.001, 1.3, 40),
            ),
            posts_returned: r.histogram(
                "get_in_network_posts_count",
                "Posts returned per GetInNetworkPosts call",
                exp_buckets(1.0, 1.2, 55),
            ),
            following_size: r.histogram(
                "get_in_network_posts_following_size",
                "Length of following_user_ids as received",
                exp_buckets(1.0, 1.2, 55),
            ),
            excluded_size: r.histogram(
                "get_in_network_posts_excluded_size",
                "Length of exclude_tweet_ids as received",
                exp_buckets(1.0, 1.2, 55),
            ),
            max_results: r.histogram(
                "get_in_network_posts_max_results",
                "Effective max_results per GetInNetworkPosts call",
                exp_buckets(1.0, 1.2, 55),
            ),
            requests: r.counter_vec(
                "get_in_network_posts_requests_total",
                "GetInNetworkPosts calls by gRPC status",
                &["status"],
            ),
            explain_requests: r.counter_vec(
                "explain_requests_total",
                "ExplainPost calls by gRPC status",
                &["status"],
            ),
            request_bytes: r.histogram(
                "get_in_network_posts_request_bytes",
                "Encoded size of GetInNetworkPosts requests",
                exp_buckets(16.0, 2.0, 20),
            ),
            response_bytes: r.histogram(
                "get_in_network_posts_response_bytes",
                "Encoded size of GetInNetworkPosts responses",
                exp_buckets(16.0, 2.0, 20),
            ),
            found_freshness: r.histogram_vec(
                "get_in_network_posts_found_freshness_seconds",
                "Age of the newest post found",
                &["stage"],
                time_range_buckets(),
            ),
            found_time_range: r.histogram_vec(
                "get_in_network_posts_found_time_range_seconds",
                "Time between the newest and the oldest post found",
                &["stage"],
                time_range_buckets(),
            ),
            found_reply_ratio: r.histogram_vec(
                "get_in_network_posts_found_reply_ratio",
                "Share of replies among the posts found",
                &["stage"],
                ratio_buckets(),
            ),
            found_unique_authors: r.histogram_vec(
                "get_in_network_posts_found_unique_authors",
                "Distinct authors among the posts found",
                &["stage"],
                exp_buckets(1.0, 1.2, 55),
            ),
            found_posts_per_author: r.count_histogram(
                "get_in_network_posts_found_posts_per_author",
                "Posts per author among the posts found",
                vec![1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0],
            ),
            store_queries: r.counter("post_store_requests_total", "Store queries run"),
            store_query_timeouts: r.counter(
                "post_store_request_timeouts_total",
                "Store queries cut short by their deadline",
            ),
            store_posts_returned: r.histogram(
                "post_store_posts_returned",
                "Posts returned by the store per query",
                exp_buckets(1.0, 1.2, 55),
            ),
            store_posts_returned_ratio: r.histogram(
                "post_store_posts_returned_ratio",
                "Posts returned over eligible timeline entries",
                ratio_buckets(),
            ),
            in_flight_requests: r.gauge("in_flight_requests", "GetInNetworkPosts calls in flight"),
            rejected_requests: r.counter(
                "rejected_requests_total",
                "GetInNetworkPosts calls refused by the QPS limit or by overload control",
            ),
            degrade_levels: r.counter_vec(
                "get_in_network_posts_degrade_level_total",
                "Store queries run, by degrade level (0: full answer)",
                &["level"],
            ),
            refusal_duration: r.histogram(
                "get_in_network_posts_refusal_seconds",
                "Time from a GetInNetworkPosts call's start to its overload refusal",
                exp_buckets(0.000_025, 2.0, 14),
            ),
            queue_wait: r.histogram(
                "get_in_network_posts_queue_wait_seconds",
                "Time from a GetInNetworkPosts call's acceptance to its store query starting \
                 (follow-graph fetch excluded)",
                exp_buckets(0.000_025, 2.0, 14),
            ),
            late_answers: r.counter(
                "get_in_network_posts_late_answers_total",
                "Answers ready only after the client's deadline (answered DEADLINE_EXCEEDED)",
            ),
            connections: r.gauge_vec("grpc_connections", "Open connections by port", &["port"]),
            connections_refused: r.counter_vec(
                "grpc_connections_refused_total",
                "Connections closed at accept because a connection cap was reached and every \
                 connection that could give up its slot was busy",
                &["port"],
            ),
            connections_evicted: r.counter_vec(
                "grpc_connections_evicted_total",
                "Idle connections closed to admit a new one at a connection cap, by cap \
                 (max_connections, per_peer)",
                &["port", "reason"],
            ),
            tls_handshake_failures: r.counter_vec(
                "grpc_tls_handshake_failures_total",
                &format!(
                    "Connections to the gRPC port whose TLS handshake failed, by reason ({})",
                    TLS_FAILURE_REASONS.join(", ")
                ),
                &["reason"],
            ),
            build_info: r.gauge_vec(
                "thunder_build_info",
                "1, labelled with the version, git commit, compiler and cargo features of the binary",
                &["version", "git_sha", "rustc", "features"],
            ),
            init_duration: r.float_gauge("init_duration_seconds", "Seconds from start-up to ready"),
            ready: r.gauge(
                "server_ready",
                "1 while readiness is SERVING (store caught up, no Kafka partition stalled), else 0",
            ),
            following_fetches: r.counter_vec(
                "strato_requests_total",
                "Following-list fetches by outcome",
                &["endpoint", "status"],
            ),
            store_authors: r.gauge("post_store_user_count", "Authors in the store"),
            store_posts: r.gauge("post_store_total_posts", "Post records in the store"),
            store_tombstones: r.gauge("post_store_deleted_posts", "Live tombstones in the store"),
            store_entities: r.gauge_vec(
                "post_store_entity_count",
                "Store entities by type",
                &["type"],
            ),
            store_arena_bytes: r.gauge_vec(
                "post_store_arena_bytes",
                "Bytes of the post arena by kind",
                &["kind"],
            ),
            store_timeline_bytes: r.gauge(
                "post_store_timeline_bytes",
                "Bytes held by per-author timeline buffers",
            ),
            store_index_bytes: r.gauge(
                "post_store_index_bytes",
                "Bytes of the post and author indexes: their tables and the author records",
            ),
            store_trimmed_posts: r.counter(
                "post_store_trimmed_posts_total",
                "Post records freed by trimming",
            ),
            kafka: KafkaMetrics::new(r),
            snapshot: SnapshotMetrics::new(r),
            process,
            resources,
        };
        for level in DEGRADE_LEVEL_LABELS {
            metrics.degrade_levels.with_label_values(&[level]);
        }
        for reason in TLS_FAILURE_REASONS {
            metrics.tls_handshake_failures.with_label_values(&[reason]);
        }
        metrics
            .build_info
            .with_label_values(&[
                crate::version::VERSION,
                crate::version::GIT_SHA,
                crate::version::RUSTC,
                crate::version::FEATURES,
            ])
            .set(1);
        metrics
    }

    /// Counts one `ExplainPost` call with its final `code`.
    pub fn record_explain(&self, code: tonic::Code) {
        self.explain_requests
            .with_label_values(&[status_label(code)])
            .inc();
    }

    /// Observes everything one `GetInNetworkPosts` call did: its status and duration always,
    /// and each stage it reached (see [`RequestSummary`]). The shape of the answer's posts is
    /// observed apart, by [`Metrics::record_found_posts`], from the posts themselves.
    pub fn record_request(&self, summary: &RequestSummary) {
        if let Some(size) = &summary.request {
            self.request_bytes.observe(size.encoded_bytes as f64);
            self.following_size.observe(size.following as f64);
            self.excluded_size.observe(size.excluded as f64);
        }
        if let Some(success) = summary.following_fetch {
            let status = if success { "success" } else { "error" };
            self.following_fetches
                .with_label_values(&["fetch_following_list", status])
                .inc();
        }
        if let Some(level) = summary.degrade_level {
            self.degrade_levels
                .with_label_values(&[DEGRADE_LEVEL_LABELS[usize::from(level.min(3))]])
                .inc();
        }
        if let Some(max_results) = summary.max_results {
            self.max_results.observe(max_results as f64);
        }
        if let Some(query) = &summary.query {
            self.store_queries.inc();
            if query.timed_out {
                self.store_query_timeouts.inc();
            }
            let returned = query.returned;
            self.store_posts_returned.observe(returned as f64);
            if query.eligible > 0 {
                self.store_posts_returned_ratio
                    .observe(returned as f64 / query.eligible as f64);
            }
            self.posts_returned.observe(returned as f64);
        }
        if let Some(bytes) = summary.response_bytes {
            self.response_bytes.observe(bytes as f64);
        }
        if let Some(duration) = summary.duration_without_fetch {
            self.request_duration_without_fetch
                .observe(duration.as_secs_f64());
        }
        self.requests
            .with_label_values(&[status_label(summary.code)])
            .inc();
        self.request_duration
            .observe(summary.duration.as_secs_f64());
    }

    /// Publishes the store's statistics as the `post_store_*` gauges.
    pub fn record_store_stats(&self, stats: &StoreStats) {
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.store_authors.set(as_i64(stats.authors));
        self.store_posts.set(as_i64(stats.posts));
        self.store_tombstones.set(as_i64(stats.tombstones));
        for (kind, n) in [
            ("users", stats.authors),
            ("posts", stats.posts),
            ("original_posts", stats.original_entries),
            ("secondary_posts", stats.secondary_entries),
            ("video_posts", stats.video_entries),
            ("deleted_posts", stats.tombstones),
        ] {
            self.store_entities
                .with_label_values(&[kind])
                .set(as_i64(n));
        }
        self.store_arena_bytes
            .with_label_values(&["reserved"])
            .set(as_i64(stats.arena_bytes_reserved));
        self.store_arena_bytes
            .with_label_values(&["used"])
            .set(as_i64(stats.arena_bytes_used));
        self.store_timeline_bytes.set(as_i64(stats.timeline_bytes));
        self.store_index_bytes.set(as_i64(stats.index_bytes));
        self.snapshot.base_posts.set(as_i64(stats.base_posts));
    }

    /// Observes the `get_in_network_posts_found_*` histograms for `posts` at `stage`, like the
    /// reference's `analyze_and_report_post_statistics`.
    pub fn record_found_posts(&self, stage: Stage, posts: &[LightPost], now_secs: i64) {
        let (Some(newest), Some(oldest)) = (
            posts.iter().map(|p| p.created_at).max(),
            posts.iter().map(|p| p.created_at).min(),
        ) else {
            return;
        };
        let labels = [stage.label()];
        self.found_freshness
            .with_label_values(&labels)
            .observe((now_secs - newest).max(0) as f64);
        self.found_time_range
            .with_label_values(&labels)
            .observe((newest - oldest) as f64);
        let replies = posts.iter().filter(|p| p.is_reply).count();
        self.found_reply_ratio
            .with_label_values(&labels)
            .observe(replies as f64 / posts.len() as f64);
        // Posts per author without a per-call hash map or sort: counted in a reused
        // per-thread table, every author's count observed at once.
        AUTHOR_COUNTS.with(|counts| {
            let mut counts = counts.borrow_mut();
            counts.count(posts.iter().map(|p| p.author_id));
            self.found_posts_per_author
                .observe_all(stage, counts.posts_per_author());
            self.found_unique_authors
                .with_label_values(&labels)
                .observe(counts.authors() as f64);
        });
    }
}

thread_local! {
    /// Posts per author of one answer, for [`Metrics::record_found_posts`]; reused per thread.
    static AUTHOR_COUNTS: std::cell::RefCell<crate::telemetry::author_counts::AuthorCounts> =
        std::cell::RefCell::new(crate::telemetry::author_counts::AuthorCounts::default());
}

impl KafkaMetrics {
    fn new(r: &Registrar<'_>) -> Self {
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
        for reason in kafka_connection::REASONS {
            metrics.connection_errors.with_label_values(&[reason]);
        }
        metrics
    }
}

/// The snapshots' metrics (part of [`Metrics`]; see [`crate::snapshot`]).
#[derive(Clone, Debug)]
pub struct SnapshotMetrics {
    /// `snapshot_last_success_timestamp_seconds`: when the last snapshot was completed.
    pub last_success: Gauge,
    /// `snapshot_last_duration_seconds`: wall time of the last snapshot written.
    pub last_duration: Gauge,
    /// `snapshot_last_bytes`: size of the last snapshot written.
    pub last_bytes: IntGauge,
    /// `snapshot_last_posts`: posts in the last snapshot written.
    pub last_posts: IntGauge,
    /// `snapshot_failures_total`: snapshots that could not be written.
    pub failures: IntCounter,
    /// `snapshot_load_seconds`: time to load the start-up snapshot (0: none loaded).
    pub load_duration: Gauge,
    /// `snapshot_loaded_posts`: posts loaded from the start-up snapshot.
    pub loaded_posts: IntGauge,
    /// `snapshot_base_bytes`: size of the base file the store serves from (0: none).
    pub base_bytes: IntGauge,
    /// `snapshot_base_posts`: posts the base still stores (deleted, evicted and trimmed ones
    /// left out).
    pub base_posts: IntGauge,
    /// `snapshot_base_created_timestamp_seconds`: when the base was written (its age).
    pub base_created: Gauge,
    /// `snapshot_base_offset{partition}`: the Kafka offsets the base was written at (what the
    /// start resumed from).
    pub base_offsets: IntGaugeVec,
    /// `snapshot_base_checked`: 1 once every record of the base was checked.
    pub base_checked: IntGauge,
}

impl SnapshotMetrics {
    fn new(r: &Registrar<'_>) -> Self {
        Self {
            last_success: r.float_gauge(
                "snapshot_last_success_timestamp_seconds",
                "Unix time the last snapshot was completed",
            ),
            last_duration: r.float_gauge(
                "snapshot_last_duration_seconds",
                "Wall time of the last snapshot written",
            ),
            last_bytes: r.gauge("snapshot_last_bytes", "Size of the last snapshot written"),
            last_posts: r.gauge("snapshot_last_posts", "Posts in the last snapshot written"),
            failures: r.counter(
                "snapshot_failures_total",
                "Snapshots that could not be written",
            ),
            load_duration: r.float_gauge(
                "snapshot_load_seconds",
                "Time to load the start-up snapshot (0: none loaded)",
            ),
            loaded_posts: r.gauge(
                "snapshot_loaded_posts",
                "Posts loaded from the start-up snapshot",
            ),
            base_bytes: r.gauge(
                "snapshot_base_bytes",
                "Size of the base file the store serves from (0: none)",
            ),
            base_posts: r.gauge(
                "snapshot_base_posts",
                "Posts the base still stores (deleted, evicted and trimmed ones left out)",
            ),
            base_created: r.float_gauge(
                "snapshot_base_created_timestamp_seconds",
                "Unix time the base the store serves from was written (0: none)",
            ),
            base_offsets: r.gauge_vec(
                "snapshot_base_offset",
                "Kafka offset the base was written at, per partition (where the start resumed)",
                &["partition"],
            ),
            base_checked: r.gauge(
                "snapshot_base_checked",
                "1 once every record of the base was checked (0: not yet, or no base)",
            ),
        }
    }

    /// Sets the base's gauges for the base file of `bytes` bytes written with `header`.
    pub fn set_base(&self, header: &SnapshotHeader, bytes: u64) {
        self.base_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.base_created.set(header.created_at_secs as f64);
        for offset in &header.meta.offsets {
            self.base_offsets
                .with_label_values(&[&offset.partition.to_string()])
                .set(offset.next_offset);
        }
    }
}

/// What one `GetInNetworkPosts` call did, for [`Metrics::record_request`]. The stages the call
/// did not reach stay `None` and are not observed.
#[derive(Debug)]
pub struct RequestSummary {
    /// Final gRPC status; `Unknown` until the call ends.
    pub code: tonic::Code,
    /// The whole call, admission included.
    pub duration: Duration,
    /// The request as received; `None` when admission refused the call.
    pub request: Option<RequestSize>,
    /// Outcome of the follow-graph fetch (`true`: success), when the call ran one.
    pub following_fetch: Option<bool>,
    /// Effective `max_results`, once the call got past the follow-graph fetch.
    pub max_results: Option<usize>,
    /// The call from the end of the follow-graph fetch (or where it would run) to its end.
    pub duration_without_fetch: Option<Duration>,
    /// The store query's answer, when the query ran.
    pub query: Option<QuerySummary>,
    /// Encoded size of the response, for a successful call (the server's own codec observes
    /// it as it encodes, and leaves this `None`).
    pub response_bytes: Option<usize>,
    /// The degrade level the store query ran at, when it ran.
    pub degrade_level: Option<u8>,
}

/// Labels of `get_in_network_posts_degrade_level_total`, by level.
const DEGRADE_LEVEL_LABELS: [&str; 4] = ["0", "1", "2", "3"];

impl Default for RequestSummary {
    fn default() -> Self {
        Self {
            code: tonic::Code::Unknown,
            duration: Duration::ZERO,
            request: None,
            following_fetch: None,
            max_results: None,
            duration_without_fetch: None,
            query: None,
            response_bytes: None,
            degrade_level: None,
        }
    }
}

/// Sizes of a `GetInNetworkPostsRequest` as received (before validation and truncation).
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestSize {
    /// Protobuf-encoded size in bytes.
    pub encoded_bytes: usize,
    /// Length of `following_user_ids`.
    pub following: usize,
    /// Length of `exclude_tweet_ids`.
    pub excluded: usize,
}

/// The store query's answer, as far as the metrics go: its counts, not its posts (those go to
/// the encoder; [`Metrics::record_found_posts`] observes their shape).
#[derive(Clone, Copy, Debug, Default)]
pub struct QuerySummary {
    /// Posts the query returned.
    pub returned: usize,
    /// The deadline passed; the answer is partial.
    pub timed_out: bool,
    /// Summed timeline lengths of the requested authors.
    pub eligible: usize,
    /// The store's clock when the query ran (unix seconds), for the posts' ages.
    pub now_secs: i64,
}

/// Metric label (`status` of `get_in_network_posts_requests_total` and
/// `explain_requests_total`) of a gRPC status code.
pub fn status_label(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "ok",
        tonic::Code::ResourceExhausted => "resource_exhausted",
        tonic::Code::InvalidArgument => "invalid_argument",
        tonic::Code::Internal => "internal",
        tonic::Code::DeadlineExceeded => "deadline_exceeded",
        tonic::Code::Cancelled => "cancelled",
        tonic::Code::OutOfRange => "out_of_range",
        tonic::Code::Unimplemented => "unimplemented",
        _ => "other",
    }
}

/// Renders the default registry in the Prometheus text format.
pub fn render() -> String {
    let encoder = prometheus::TextEncoder::new();
    encoder
        .encode_to_string(&prometheus::gather())
        .unwrap_or_else(|e| format!("# encoding metrics failed: {e}\n"))
}

/// One exported metric family, as docs/metrics.md lists it ([`Metrics::catalogue`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricInfo {
    /// Family name (a histogram's series add `_bucket`, `_sum` and `_count`).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Label names (empty: one unlabelled series).
    pub labels: Vec<String>,
    /// The help text of the family.
    pub help: String,
}

/// Builds metrics and registers each in a registry as it is built, noting each family in a
/// catalogue.
struct Registrar<'a> {
    registry: &'a Registry,
    catalogue: std::cell::RefCell<Vec<MetricInfo>>,
}

impl<'a> Registrar<'a> {
    fn new(registry: &'a Registry) -> Self {
        Self {
            registry,
            catalogue: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// Registers `built`. Metric definitions are compile-time constants, so an invalid one is a
    /// bug in this file; a registration clash is logged and the metric kept, unexported.
    fn register<C: Collector + Clone + 'static>(&self, built: prometheus::Result<C>) -> C {
        let collector = built.unwrap_or_else(|e| panic!("invalid metric definition: {e}"));
        if let Err(e) = self.registry.register(Box::new(collector.clone())) {
            tracing::warn!(error = %e, "metric not registered");
        }
        collector
    }

    /// Notes the families of `collector` as `kind` in the catalogue.
    fn note<C: Collector>(&self, collector: &C, kind: &'static str) {
        let mut catalogue = self.catalogue.borrow_mut();
        for desc in collector.desc() {
            catalogue.push(MetricInfo {
                name: desc.fq_name.clone(),
                kind,
                labels: desc.variable_labels.clone(),
                help: desc.help.clone(),
            });
        }
    }

    /// Registers a hand-written collector and catalogues its `families` (name, type, help).
    fn collector<C: Collector + Clone + 'static>(
        &self,
        collector: C,
        families: &[(&str, &'static str, &str)],
    ) -> C {
        let collector = self.register(Ok(collector));
        let mut catalogue = self.catalogue.borrow_mut();
        for (name, kind, help) in families {
            catalogue.push(MetricInfo {
                name: (*name).to_owned(),
                kind,
                labels: Vec::new(),
                help: (*help).to_owned(),
            });
        }
        collector
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        let built = self.register(IntCounter::new(name, help));
        self.note(&built, "counter");
        built
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        let built = self.register(IntCounterVec::new(Opts::new(name, help), labels));
        self.note(&built, "counter");
        built
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        let built = self.register(IntGauge::new(name, help));
        self.note(&built, "gauge");
        built
    }

    fn float_gauge(&self, name: &str, help: &str) -> Gauge {
        let built = self.register(Gauge::new(name, help));
        self.note(&built, "gauge");
        built
    }

    /// Registers a hand-written collector whose descriptions name its families and labels.
    fn described<C: Collector + Clone + 'static>(&self, collector: C, kind: &'static str) -> C {
        let built = self.register(Ok(collector));
        self.note(&built, kind);
        built
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        let built = self.register(IntGaugeVec::new(Opts::new(name, help), labels));
        self.note(&built, "gauge");
        built
    }

    fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        let built = self.register(Histogram::with_opts(
            HistogramOpts::new(name, help).buckets(buckets),
        ));
        self.note(&built, "histogram");
        built
    }

    fn count_histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> CountHistogramVec {
        let built = CountHistogramVec::new(name, help, buckets)
            .unwrap_or_else(|| panic!("invalid metric definition: {name}"));
        let built = self.register(Ok(built));
        self.note(&built, "histogram");
        built
    }

    fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Vec<f64>,
    ) -> HistogramVec {
        let built = self.register(HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets),
            labels,
        ));
        self.note(&built, "histogram");
        built
    }
}

/// The standard `process_*` metrics of the Prometheus client libraries, read from
/// `/proc/self` at each scrape (the prometheus crate's own collector needs another procfs
/// major version than the workspace's). Where `/proc` cannot be read, nothing is exported.
#[derive(Clone, Debug)]
pub struct ProcessCollector {
    descs: Vec<prometheus::core::Desc>,
}

impl ProcessCollector {
    /// Name, type and help of each family.
    pub const FAMILIES: &[(&str, &str, &str)] = &[
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes",
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes",
        ),
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds",
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds",
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors",
        ),
    ];

    fn new() -> Self {
        Self {
            descs: family_descs(Self::FAMILIES),
        }
    }

    /// The current values, in [`Self::FAMILIES`] order, or `None` when `/proc` is unreadable.
    fn read() -> Option<[f64; 5]> {
        let me = procfs::process::Process::myself().ok()?;
        let stat = me.stat().ok()?;
        let ticks = procfs::ticks_per_second().max(1) as f64;
        let boot_secs = procfs::boot_time_secs().ok()? as f64;
        let open_fds = me.fd_count().unwrap_or(0) as f64;
        Some([
            (stat.rss * procfs::page_size()) as f64,
            stat.vsize as f64,
            (stat.utime + stat.stime) as f64 / ticks,
            boot_secs + stat.starttime as f64 / ticks,
            open_fds,
        ])
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        use prometheus::proto::{Counter, Gauge as GaugeValue, Metric, MetricFamily, MetricType};
        let Some(values) = Self::read() else {
            return Vec::new();
        };
        Self::FAMILIES
            .iter()
            .zip(values)
            .map(|((name, kind, help), value)| {
                let mut metric = Metric::default();
                let mut family = MetricFamily::default();
                if *kind == "counter" {
                    let mut counter = Counter::default();
                    counter.set_value(value);
                    metric.set_counter(counter);
                    family.set_field_type(MetricType::COUNTER);
                } else {
                    let mut gauge = GaugeValue::default();
                    gauge.set_value(value);
                    metric.set_gauge(gauge);
                    family.set_field_type(MetricType::GAUGE);
                }
                family.set_name((*name).to_owned());
                family.set_help((*help).to_owned());
                family.set_metric(vec![metric]);
                family
            })
            .collect()
    }
}

/// `count` bucket bounds from `start`, each `factor` times the one before, rounded to four
/// significant digits so that a scrape shows them as written (`le="0.0013"`, not the float
/// noise `le="0.0013000000000000002"`); the reference's `exp(start, factor, count)` buckets.
fn exp_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    prometheus::exponential_buckets(start, factor, count)
        .unwrap_or_default()
        .into_iter()
        .map(|bound| format!("{bound:.3e}").parse().unwrap_or(bound))
        .collect()
}

fn ratio_buckets() -> Vec<f64> {
    (0..=10).map(|i| f64::from(i) / 10.0).collect()
}

fn time_range_buckets() -> Vec<f64> {
    vec![
        60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0, 86400.0, 129600.0,
        172800.0,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh instance, so the counts do not depend on other tests.
    fn metrics() -> (Metrics, Registry) {
        let registry = Registry::new();
        (Metrics::new(&registry), registry)
    }

    fn family_names(registry: &Registry) -> Vec<String> {
        registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect()
    }

    #[test]
    fn every_drop_reason_is_exported_at_zero() {
        let (metrics, registry) = metrics();
        for reason in drop_reasons() {
            assert_eq!(
                metrics
                    .kafka
                    .events_dropped
                    .with_label_values(&[reason])
                    .get(),
                0
            );
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
        let catalogue = Metrics::catalogue();
        let dropped = catalogue
            .iter()
            .find(|m| m.name == "kafka_events_dropped_total")
            .expect("in the catalogue");
        for reason in drop_reasons() {
            assert!(dropped.help.contains(reason), "{reason}: {}", dropped.help);
        }
        assert!(dropped.help.contains("no_slot"), "{}", dropped.help);
    }

    #[test]
    fn build_info_is_one_with_the_version_and_commit() {
        let (_metrics, registry) = metrics();
        let families = registry.gather();
        let info = families
            .iter()
            .find(|f| f.name() == "thunder_build_info")
            .expect("exported");
        let sample = info.get_metric().first().expect("one sample");
        assert_eq!(sample.get_gauge().get_value(), 1.0);
        let label = |name: &str| {
            sample
                .get_label()
                .iter()
                .find(|l| l.name() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        assert_eq!(label("version"), crate::version::VERSION);
        assert_eq!(label("git_sha"), crate::version::GIT_SHA);
        assert!(!label("rustc").is_empty());
        assert!(!label("features").is_empty());
    }

    #[test]
    fn every_tls_handshake_failure_reason_is_exported_at_zero() {
        let (_metrics, registry) = metrics();
        let families = registry.gather();
        let failures = families
            .iter()
            .find(|f| f.name() == "grpc_tls_handshake_failures_total")
            .expect("exported");
        assert_eq!(failures.get_metric().len(), TLS_FAILURE_REASONS.len());
    }

    #[test]
    fn unlabelled_metrics_are_exported_from_the_start() {
        let (_metrics, registry) = metrics();
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
        let (_metrics, registry) = metrics();
        let catalogue = Metrics::catalogue();
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
    fn process_metrics_read_this_process() {
        let (_metrics, registry) = metrics();
        let families = registry.gather();
        let value = |name: &str| {
            let family = families
                .iter()
                .find(|f| f.name() == name)
                .unwrap_or_else(|| panic!("{name} missing"));
            let metric = &family.get_metric()[0];
            if family.get_field_type() == prometheus::proto::MetricType::COUNTER {
                metric.get_counter().get_value()
            } else {
                metric.get_gauge().get_value()
            }
        };
        assert!(value("process_resident_memory_bytes") > 1_000_000.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(
            started <= now + 2.0 && started > now - 86_400.0,
            "{started}"
        );
        assert!(value("process_open_fds") >= 3.0);
    }

    #[test]
    fn histogram_bounds_print_as_written() {
        let (metrics, registry) = metrics();
        // Every histogram family gets a sample, so each prints its buckets.
        metrics.record_request(&RequestSummary::default());
        let posts = [LightPost::original(1, 10, 1_000_000)];
        metrics.record_found_posts(Stage::Scored, &posts, 1_000_060);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encodes");
        let mut bounds = 0;
        for bound in text.split("le=\"").skip(1) {
            let bound = bound.split('"').next().unwrap_or_default();
            let digits = bound
                .chars()
                .filter(char::is_ascii_digit)
                .collect::<String>();
            let significant = digits.trim_start_matches('0').trim_end_matches('0');
            assert!(significant.len() <= 6, "le=\"{bound}\"");
            bounds += 1;
        }
        assert!(bounds > 100, "{bounds} bucket bounds");
    }

    #[test]
    fn a_refused_call_counts_only_its_status_and_duration() {
        let (metrics, _registry) = metrics();
        metrics.record_request(&RequestSummary {
            code: tonic::Code::ResourceExhausted,
            duration: Duration::from_millis(2),
            ..RequestSummary::default()
        });
        assert_eq!(
            metrics
                .requests
                .with_label_values(&["resource_exhausted"])
                .get(),
            1
        );
        assert_eq!(metrics.request_duration.get_sample_count(), 1);
        assert_eq!(metrics.request_bytes.get_sample_count(), 0);
        assert_eq!(metrics.request_duration_without_fetch.get_sample_count(), 0);
        assert_eq!(metrics.store_queries.get(), 0);
        assert_eq!(metrics.response_bytes.get_sample_count(), 0);
    }

    #[test]
    fn a_served_call_observes_every_stage() {
        let (metrics, _registry) = metrics();
        let now = 1_000_000;
        let posts = vec![
            LightPost::original(1, 10, now - 60),
            LightPost::original(2, 10, now - 120),
            LightPost::original(3, 11, now - 600),
        ];
        metrics.record_request(&RequestSummary {
            code: tonic::Code::Ok,
            duration: Duration::from_millis(5),
            request: Some(RequestSize {
                encoded_bytes: 40,
                following: 0,
                excluded: 1,
            }),
            following_fetch: Some(true),
            max_results: Some(1200),
            duration_without_fetch: Some(Duration::from_millis(3)),
            query: Some(QuerySummary {
                returned: posts.len(),
                timed_out: true,
                eligible: 6,
                now_secs: now,
            }),
            response_bytes: Some(120),
            degrade_level: Some(2),
        });
        metrics.record_found_posts(Stage::Scored, &posts, now);
        assert_eq!(metrics.degrade_levels.with_label_values(&["2"]).get(), 1);
        assert_eq!(metrics.requests.with_label_values(&["ok"]).get(), 1);
        assert_eq!(
            metrics
                .following_fetches
                .with_label_values(&["fetch_following_list", "success"])
                .get(),
            1
        );
        for histogram in [
            &metrics.request_duration,
            &metrics.request_duration_without_fetch,
            &metrics.request_bytes,
            &metrics.following_size,
            &metrics.excluded_size,
            &metrics.max_results,
            &metrics.store_posts_returned,
            &metrics.store_posts_returned_ratio,
            &metrics.posts_returned,
            &metrics.response_bytes,
        ] {
            assert_eq!(histogram.get_sample_count(), 1);
        }
        assert_eq!(metrics.posts_returned.get_sample_sum(), 3.0);
        assert_eq!(metrics.store_posts_returned_ratio.get_sample_sum(), 0.5);
        assert_eq!(metrics.store_queries.get(), 1);
        assert_eq!(metrics.store_query_timeouts.get(), 1);
        let scored = |h: &HistogramVec| h.with_label_values(&["scored"]);
        assert_eq!(scored(&metrics.found_freshness).get_sample_sum(), 60.0);
        assert_eq!(scored(&metrics.found_time_range).get_sample_sum(), 540.0);
        assert_eq!(scored(&metrics.found_unique_authors).get_sample_sum(), 2.0);
        assert_eq!(
            metrics.found_posts_per_author.sample_count(Stage::Scored),
            2
        );
        assert_eq!(
            metrics.found_posts_per_author.sample_sum(Stage::Scored),
            3.0
        );
    }
}
