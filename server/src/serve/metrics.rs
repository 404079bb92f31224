//! The serving path's metrics: the `GetInNetworkPosts` calls (the reference's
//! `get_in_network_posts_*` and `post_store_*` query metrics, the degrade levels, refusals,
//! queue waits and late answers) and the follow-graph fetches ([`ServeMetrics`]), and the
//! connections of both ports with the gRPC port's failed TLS handshakes
//! ([`ConnectionMetrics`]), declared into the process registry ([`Registrar`]) and reached
//! through each struct's `global()`.
//!
//! A call is recorded once, from a [`RequestSummary`] of the stages it reached
//! ([`ServeMetrics::record_request`]); the shape of its answer's posts is observed apart
//! ([`AnswerMetrics::record`]), counted per author in a reused per-thread table
//! (`author_counts.rs`).

use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};
use thunder_engine::LightPost;

use crate::telemetry::count_histogram::{CountHistogramVec, Stage};
use crate::telemetry::registry::{Registrar, exp_buckets, ratio_buckets, time_range_buckets};

/// The serving path's metrics.
#[derive(Clone, Debug)]
pub struct ServeMetrics {
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
    /// `strato_requests_total{endpoint,status}`: follow-graph fetches by endpoint and outcome.
    pub following_fetches: IntCounterVec,
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

/// Labels of `get_in_network_posts_degrade_level_total`, by level.
const DEGRADE_LEVEL_LABELS: [&str; 4] = ["0", "1", "2", "3"];

impl ServeMetrics {
    /// Builds the metrics into `r`; every degrade level is exported at zero from the start.
    pub fn new(r: &Registrar<'_>) -> Self {
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
            following_fetches: r.counter_vec(
                "strato_requests_total",
                "Following-list fetches by outcome",
                &["endpoint", "status"],
            ),
        };
        for level in DEGRADE_LEVEL_LABELS {
            metrics.degrade_levels.with_label_values(&[level]);
        }
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
    /// observed apart, by [`AnswerMetrics::record`], from the posts themselves.
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
}

crate::process_instance!(ServeMetrics);

/// The shape of the answers' posts: the reference's `get_in_network_posts_found_*`
/// histograms, observed per answer apart from the call ([`AnswerMetrics::record`]).
#[derive(Clone, Debug)]
pub struct AnswerMetrics {
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
}

impl AnswerMetrics {
    /// Builds the metrics into `r`.
    pub fn new(r: &Registrar<'_>) -> Self {
        Self {
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
        }
    }

    /// Observes the `get_in_network_posts_found_*` histograms for `posts` at `stage`, like the
    /// reference's `analyze_and_report_post_statistics`.
    pub fn record(&self, stage: Stage, posts: &[LightPost], now_secs: i64) {
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

crate::process_instance!(AnswerMetrics);

thread_local! {
    /// Posts per author of one answer, for [`AnswerMetrics::record`]; reused per thread.
    static AUTHOR_COUNTS: std::cell::RefCell<crate::serve::author_counts::AuthorCounts> =
        std::cell::RefCell::new(crate::serve::author_counts::AuthorCounts::default());
}

/// The connections of both ports (`listener.rs`) and the gRPC port's TLS handshakes
/// (`tls_accept.rs`).
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
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
}

impl ConnectionMetrics {
    /// Builds the metrics into `r`; every TLS failure reason is exported at zero from the
    /// start.
    pub fn new(r: &Registrar<'_>) -> Self {
        let metrics = Self {
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
        };
        for reason in TLS_FAILURE_REASONS {
            metrics.tls_handshake_failures.with_label_values(&[reason]);
        }
        metrics
    }
}

crate::process_instance!(ConnectionMetrics);

/// What one `GetInNetworkPosts` call did, for [`ServeMetrics::record_request`]. The stages the call
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
/// the encoder; [`AnswerMetrics::record`] observes their shape).
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

#[cfg(test)]
mod tests {
    use prometheus::Registry;

    use super::*;

    /// Fresh instances, so the counts do not depend on other tests.
    fn metrics() -> (ServeMetrics, AnswerMetrics, Registry) {
        let registry = Registry::new();
        let r = Registrar::new(&registry);
        (ServeMetrics::new(&r), AnswerMetrics::new(&r), registry)
    }

    #[test]
    fn every_tls_handshake_failure_reason_is_exported_at_zero() {
        let registry = Registry::new();
        ConnectionMetrics::new(&Registrar::new(&registry));
        let families = registry.gather();
        let failures = families
            .iter()
            .find(|f| f.name() == "grpc_tls_handshake_failures_total")
            .expect("exported");
        assert_eq!(failures.get_metric().len(), TLS_FAILURE_REASONS.len());
    }

    #[test]
    fn histogram_bounds_print_as_written() {
        let (metrics, answers, registry) = metrics();
        // Every histogram family gets a sample, so each prints its buckets.
        metrics.record_request(&RequestSummary::default());
        let posts = [LightPost::original(1, 10, 1_000_000)];
        answers.record(Stage::Scored, &posts, 1_000_060);
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
        let (metrics, _answers, _registry) = metrics();
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
        let (metrics, answers, _registry) = metrics();
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
        answers.record(Stage::Scored, &posts, now);
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
        assert_eq!(scored(&answers.found_freshness).get_sample_sum(), 60.0);
        assert_eq!(scored(&answers.found_time_range).get_sample_sum(), 540.0);
        assert_eq!(scored(&answers.found_unique_authors).get_sample_sum(), 2.0);
        assert_eq!(
            answers.found_posts_per_author.sample_count(Stage::Scored),
            2
        );
        assert_eq!(
            answers.found_posts_per_author.sample_sum(Stage::Scored),
            3.0
        );
    }
}
