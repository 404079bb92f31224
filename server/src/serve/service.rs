//! The `thunder.v1.InNetworkPostsService` implementation: admission, validation, the optional
//! follow-graph fallback, an executor slot from the overload controller
//! ([`crate::serve::overload`]), then the store query at the slot's degrade level.
//!
//! Deadlines: the store query gets 80% of the client's `grpc-timeout`
//! (it then returns the posts found so far); a call still waiting for its answer when
//! 90% of it has passed is answered `DEADLINE_EXCEEDED` (before tonic's
//! own timer would answer `CANCELLED`), and so is an answer that is ready only after the
//! deadline, or a call whose deadline passed while it queued (its query never runs). Every
//! outcome, including a call dropped because its client left, is counted once in
//! `get_in_network_posts_requests_total`.

use std::collections::HashSet;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use thunder_engine::config::MAX_INPUT_LIST_SIZE;
use thunder_engine::{LightPost, PostStore};
use thunder_proto::{ExplainPostRequest, ExplainPostResponse};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};

use crate::error::ServiceError;
use crate::serve::admission::Admission;
use crate::serve::arrival::Accepted;
use crate::serve::codec::{DecodedRequest, PostsAnswer};
use crate::serve::explain::{ExplainContext, ExplainRequest};
use crate::serve::following::FollowingSource;
use crate::serve::log_limit::{LogLimit, for_log};
use crate::serve::metrics::{
    AnswerMetrics, QuerySummary, RequestSize, RequestSummary, ServeMetrics,
};
use crate::serve::overload::{DegradeLevel, ExecutorPermit, Overload, OverloadConfig};
use crate::serve::request::ValidatedRequest;
use crate::telemetry::count_histogram::Stage;

/// Share of the client's `grpc-timeout` given to the store query; the rest is left for
/// encoding and the trip back, so a partial answer arrives before the client gives up.
const CLIENT_BUDGET_PERCENT: u32 = 80;
/// Share of the client's `grpc-timeout` after which a call not yet answered is answered
/// `DEADLINE_EXCEEDED` (tonic's timer, started slightly earlier, fires at 100%).
const ANSWER_BUDGET_PERCENT: u32 = 90;
/// Response metadata key saying at which degrade level the answer was computed.
pub const DEGRADED_HEADER: &str = "thunder-degraded";
/// `debug=true` request log lines written per second at most.
const DEBUG_LOGS_PER_SEC: u32 = 10;

/// An answer and the degrade level it was computed at (0: not degraded).
#[derive(Debug)]
pub struct Answer {
    /// The posts, newest first.
    pub posts: PostsAnswer,
    /// The degrade level.
    pub level: DegradeLevel,
}

/// The gRPC service over a [`PostStore`].
#[derive(Debug)]
pub struct ThunderService {
    store: Arc<PostStore>,
    admission: Admission,
    overload: Arc<Overload>,
    following: Option<Arc<dyn FollowingSource>>,
    request_timeout: Option<Duration>,
    inline_queries: bool,
    debug_logs: LogLimit,
}

impl ThunderService {
    /// A service reading `store`, admitting calls through `admission`, falling back to
    /// `following` for empty following lists, and giving each store query at most
    /// `request_timeout` (`None`: only the client's deadline applies). Overload control has
    /// its defaults ([`OverloadConfig::default`]); see [`ThunderService::with_overload`].
    pub fn new(
        store: Arc<PostStore>,
        admission: Admission,
        following: Option<Arc<dyn FollowingSource>>,
        request_timeout: Option<Duration>,
    ) -> Self {
        Self {
            store,
            admission,
            overload: Arc::new(Overload::new(OverloadConfig::default())),
            following,
            request_timeout,
            inline_queries: false,
            debug_logs: LogLimit::per_second(
                NonZeroU32::new(DEBUG_LOGS_PER_SEC).unwrap_or(NonZeroU32::MIN),
            ),
        }
    }

    /// The same service with `overload` as its controller; `inline_queries` runs store
    /// queries on the calling runtime thread instead of tokio's blocking pool.
    pub fn with_overload(mut self, overload: Arc<Overload>, inline_queries: bool) -> Self {
        self.overload = overload;
        self.inline_queries = inline_queries;
        self
    }

    /// Serves one call and records it in the metrics with a single
    /// [`ServeMetrics::record_request`] at its end (also when the call is dropped: its client
    /// left, or tonic's own timer fired), and the shape of the posts its query answered with
    /// [`AnswerMetrics::record`].
    pub async fn answer(&self, request: Request<DecodedRequest>) -> Result<Answer, ServiceError> {
        // From the stream's acceptance: the wait for this task to run counts.
        let started = Accepted::of_request(&request);
        let client_timeout = grpc_timeout(request.metadata());
        let client_deadline = client_timeout.and_then(|t| started.checked_add(t));
        let mut record = Recorder {
            started,
            client_deadline,
            summary: Some(RequestSummary::default()),
        };
        let summary = record.summary.get_or_insert_with(RequestSummary::default);
        let work = self.handle(request, started, client_timeout, summary);
        let result = answered_in_time(started, client_timeout, work).await;
        if matches!(result, Err(ServiceError::Overloaded)) {
            ServeMetrics::global()
                .refusal_duration
                .observe(started.elapsed().as_secs_f64());
        }
        let late = result.is_ok() && client_deadline.is_some_and(|d| Instant::now() > d);
        if late {
            ServeMetrics::global().late_answers.inc();
        }
        let code = match &result {
            Ok(_) if late => ServiceError::DeadlineExceeded.code(),
            Ok(_) => tonic::Code::Ok,
            Err(error) => error.code(),
        };
        // A late answer is still observed as the answer the query gave.
        record.finish(code, result.as_ref().ok().map(|a| &a.posts.posts[..]));
        if late {
            return Err(ServiceError::DeadlineExceeded);
        }
        result
    }

    /// Admission, validation, the follow-graph fallback and the query: returns the answer and
    /// notes in `summary` what the call did.
    async fn handle(
        &self,
        request: Request<DecodedRequest>,
        arrival: Instant,
        client_timeout: Option<Duration>,
        summary: &mut RequestSummary,
    ) -> Result<Answer, ServiceError> {
        let entered = Instant::now();
        let _in_flight = self.admission.admit()?;
        let DecodedRequest {
            message: req,
            encoded_bytes,
        } = request.into_inner();
        let size = RequestSize {
            encoded_bytes,
            following: req.following_user_ids.len(),
            excluded: req.exclude_tweet_ids.len(),
        };
        summary.request = Some(size);
        // Only a debug request's log line needs the algorithm once the request is validated.
        let algorithm = req.debug.then(|| req.algorithm.clone());
        let validated = ValidatedRequest::from_owned(req)?;
        if let Some(algorithm) = algorithm
            && let Some(suppressed) = self.debug_logs.allow()
        {
            tracing::info!(
                user_id = validated.query.viewer_id,
                following = size.following,
                excluded = size.excluded,
                max_results = validated.query.max_results,
                video = validated.query.videos,
                algorithm = %for_log(&algorithm),
                suppressed,
                "GetInNetworkPosts"
            );
        }
        let started = CallStart {
            arrival,
            entered,
            client_timeout,
        };
        let mut ready = self.prepare(validated, started, summary).await?;
        ready.validated.degrade(ready.level);
        summary.degrade_level = Some(ready.level);
        summary.max_results = Some(ready.validated.query.max_results);
        ready.validated.query.deadline = ready.deadline;
        let result = self.query(ready.validated, ready.permit, summary).await;
        summary.duration_without_fetch = Some(ready.after_fetch.elapsed());
        result.map(|posts| Answer {
            posts,
            level: ready.level,
        })
    }

    /// What a validated call does before its store query, a feed query's or an explain's:
    /// the follow-graph fallback for an empty following list, then an executor slot from the
    /// overload controller (which says the degrade level; the caller applies it), and the
    /// query's deadline. Notes the fetch in `summary`.
    async fn prepare(
        &self,
        mut validated: ValidatedRequest,
        start: CallStart,
        summary: &mut RequestSummary,
    ) -> Result<Prepared, ServiceError> {
        let mut following_from_graph = false;
        if validated.following_was_empty
            && let Some(source) = &self.following
        {
            let fetched = source
                .fetch_following_list(validated.query.viewer_id, MAX_INPUT_LIST_SIZE)
                .await;
            summary.following_fetch = Some(fetched.is_ok());
            validated.set_authors(fetched.map_err(ServiceError::FollowingFetch)?);
            following_from_graph = true;
        }

        let after_fetch = Instant::now();
        let client_deadline = start
            .client_timeout
            .and_then(|t| start.arrival.checked_add(t));
        // Queue wait: before the handler ran and for an executor, not the follow-graph fetch.
        let waited_before = start.entered.saturating_duration_since(start.arrival);
        let queued_since = after_fetch
            .checked_sub(waited_before)
            .unwrap_or(start.arrival);
        let slot = self
            .overload
            .acquire(queued_since, client_deadline)
            .await
            .map_err(|_| {
                ServeMetrics::global().rejected_requests.inc();
                ServiceError::Overloaded
            })?;
        if client_deadline.is_some_and(|d| Instant::now() >= d) {
            // Expired while it queued: not worth running.
            return Err(ServiceError::DeadlineExceeded);
        }
        ServeMetrics::global()
            .queue_wait
            .observe(slot.queue_wait.as_secs_f64());
        Ok(Prepared {
            validated,
            following_from_graph,
            level: slot.level,
            deadline: self.deadline(start.arrival, start.client_timeout),
            permit: slot.into_permit(),
            after_fetch,
        })
    }

    /// Serves one `ExplainPost` call: admitted, prepared and deadlined as a
    /// `GetInNetworkPosts` call is (the same QPS limit, follow-graph fallback, overload
    /// controller and degrade level), then the store's explain of the request at that level.
    /// Counted once in `explain_requests_total`, not among the `GetInNetworkPosts` calls. The
    /// answer and the degrade level it ran at.
    pub async fn explain(
        &self,
        request: Request<ExplainPostRequest>,
    ) -> Result<(ExplainPostResponse, DegradeLevel), ServiceError> {
        let arrival = Accepted::of_request(&request);
        let client_timeout = grpc_timeout(request.metadata());
        let count = ExplainCount {
            client_deadline: client_timeout.and_then(|t| arrival.checked_add(t)),
            counted: false,
        };
        let work = async {
            let entered = Instant::now();
            let _in_flight = self.admission.admit()?;
            let ExplainRequest {
                validated,
                post_ids,
                seen_post_ids,
            } = ExplainRequest::from_request(request.into_inner())?;
            let start = CallStart {
                arrival,
                entered,
                client_timeout,
            };
            // Its fetch is not a GetInNetworkPosts call's: not recorded.
            let mut unrecorded = RequestSummary::default();
            let ready = self.prepare(validated, start, &mut unrecorded).await?;
            self.run_explain(post_ids, seen_post_ids, ready).await
        };
        let result = answered_in_time(arrival, client_timeout, work).await;
        count.finish(match &result {
            Ok(_) => tonic::Code::Ok,
            Err(error) => error.code(),
        });
        result
    }

    /// The store's explain of `post_ids` in the answer to the request `ready` holds (at
    /// `ready.level`), inline or on a blocking thread like a query, holding the executor
    /// permit until it ends.
    async fn run_explain(
        &self,
        post_ids: Vec<i64>,
        seen_post_ids: HashSet<i64>,
        ready: Prepared,
    ) -> Result<(ExplainPostResponse, DegradeLevel), ServiceError> {
        let store = Arc::clone(&self.store);
        let overload = Arc::clone(&self.overload);
        let Prepared {
            validated: asked,
            following_from_graph,
            level,
            deadline,
            permit,
            ..
        } = ready;
        let run = move || {
            let mut ran = asked.clone();
            ran.degrade(level);
            let started = Instant::now();
            ran.query.deadline = deadline;
            let explanation = ran.explain(&store, &post_ids);
            overload.observe_service(started.elapsed());
            drop(permit);
            let context = ExplainContext {
                asked: &asked,
                ran: &ran,
                level,
                following_from_graph,
                seen_post_ids: &seen_post_ids,
                shard: store.shard_id(),
            };
            context.response(&explanation)
        };
        let response = if self.inline_queries {
            run()
        } else {
            tokio::task::spawn_blocking(run)
                .await
                .map_err(|e| ServiceError::QueryTask(e.to_string()))?
        };
        Ok((response, level))
    }

    /// The store query (inline or on a blocking thread, holding `permit` until it ends, and
    /// stopping at the query's deadline): returns its posts and `next_cursor`, and notes
    /// their counts in `summary`.
    async fn query(
        &self,
        validated: ValidatedRequest,
        permit: ExecutorPermit,
        summary: &mut RequestSummary,
    ) -> Result<PostsAnswer, ServiceError> {
        let store = Arc::clone(&self.store);
        let overload = Arc::clone(&self.overload);
        let run = move || {
            let started = Instant::now();
            let outcome = validated.execute(&store);
            overload.observe_service(started.elapsed());
            drop(permit);
            (outcome, validated, store.now_secs())
        };
        let (outcome, validated, now_secs) = if self.inline_queries {
            run()
        } else {
            tokio::task::spawn_blocking(run)
                .await
                .map_err(|e| ServiceError::QueryTask(e.to_string()))?
        };

        if validated.debug
            && let Some(suppressed) = self.debug_logs.allow()
        {
            tracing::info!(
                user_id = validated.query.viewer_id,
                returned = outcome.posts.len(),
                timed_out = outcome.timed_out,
                suppressed,
                "GetInNetworkPosts done"
            );
        }
        let next_cursor = validated.next_cursor(&outcome);
        summary.query = Some(QuerySummary {
            returned: outcome.posts.len(),
            timed_out: outcome.timed_out,
            eligible: outcome.eligible,
            now_secs,
        });
        Ok(PostsAnswer {
            posts: outcome.posts,
            next_cursor,
        })
    }

    /// The store query's deadline: the server's request timeout and a share of the client's
    /// `grpc-timeout`, whichever ends first.
    fn deadline(&self, arrival: Instant, client_timeout: Option<Duration>) -> Option<Instant> {
        let client_budget = client_timeout.map(|t| t * CLIENT_BUDGET_PERCENT / 100);
        let budget = match (self.request_timeout, client_budget) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        budget.and_then(|b| arrival.checked_add(b))
    }
}

/// `work`'s result, or `DEADLINE_EXCEEDED` once [`ANSWER_BUDGET_PERCENT`] of the client's
/// timeout (from `started`) has passed without it.
async fn answered_in_time<T>(
    started: Instant,
    client_timeout: Option<Duration>,
    work: impl Future<Output = Result<T, ServiceError>>,
) -> Result<T, ServiceError> {
    match client_timeout {
        Some(t) => {
            let answer_by = started + t * ANSWER_BUDGET_PERCENT / 100;
            tokio::time::timeout_at(answer_by.into(), work)
                .await
                .unwrap_or(Err(ServiceError::DeadlineExceeded))
        }
        None => work.await,
    }
}

/// When a call arrived, entered its handler, and the deadline its client gave.
#[derive(Clone, Copy)]
struct CallStart {
    arrival: Instant,
    entered: Instant,
    client_timeout: Option<Duration>,
}

/// A call ready for its store query: its request (with the follow graph's list if it asked
/// for it, not yet degraded), the degrade level and executor permit its slot gave, and the
/// query's deadline.
struct Prepared {
    validated: ValidatedRequest,
    following_from_graph: bool,
    level: DegradeLevel,
    deadline: Option<Instant>,
    permit: ExecutorPermit,
    /// When the follow-graph fetch (if any) ended.
    after_fetch: Instant,
}

/// Counts an `ExplainPost` call once in `explain_requests_total`: at
/// [`ExplainCount::finish`], or when dropped unfinished (its client left, or tonic's timer
/// fired: `DEADLINE_EXCEEDED` if its deadline has passed, else `CANCELLED`).
struct ExplainCount {
    client_deadline: Option<Instant>,
    counted: bool,
}

impl ExplainCount {
    fn finish(mut self, code: tonic::Code) {
        self.counted = true;
        ServeMetrics::global().record_explain(code);
    }
}

impl Drop for ExplainCount {
    fn drop(&mut self) {
        if !self.counted {
            let late = self.client_deadline.is_some_and(|d| Instant::now() >= d);
            ServeMetrics::global().record_explain(if late {
                tonic::Code::DeadlineExceeded
            } else {
                tonic::Code::Cancelled
            });
        }
    }
}

/// Records a call's [`RequestSummary`] exactly once: at [`Recorder::finish`], or when dropped
/// unfinished (the call's future was dropped: `DEADLINE_EXCEEDED` if its deadline has passed,
/// else `CANCELLED`).
struct Recorder {
    started: Instant,
    client_deadline: Option<Instant>,
    summary: Option<RequestSummary>,
}

impl Recorder {
    /// Records the call with its final `code`, and the shape of the posts it `answered` (the
    /// query's posts, when the query ran).
    fn finish(mut self, code: tonic::Code, answered: Option<&[LightPost]>) {
        let mut summary = self.summary.take().unwrap_or_default();
        summary.code = code;
        summary.duration = self.started.elapsed();
        ServeMetrics::global().record_request(&summary);
        if let (Some(query), Some(posts)) = (&summary.query, answered) {
            AnswerMetrics::global().record(Stage::Scored, posts, query.now_secs);
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(mut summary) = self.summary.take() {
            let now = Instant::now();
            summary.code = if self.client_deadline.is_some_and(|d| now >= d) {
                tonic::Code::DeadlineExceeded
            } else {
                tonic::Code::Cancelled
            };
            summary.duration = now.duration_since(self.started);
            summary.query = None;
            ServeMetrics::global().record_request(&summary);
        }
    }
}

/// `answer` as a tonic response: the posts, and the degrade level in [`DEGRADED_HEADER`]
/// when the answer was degraded.
pub fn with_degrade_header<T>(message: T, level: DegradeLevel) -> Response<T> {
    let mut response = Response::new(message);
    if level > 0 {
        response
            .metadata_mut()
            .insert(DEGRADED_HEADER, MetadataValue::from(u32::from(level)));
    }
    response
}

/// Logs a failed `GetInNetworkPosts` call at debug level (refusals under load are not
/// logged) and turns it into its status.
pub fn log_failure(error: ServiceError) -> Status {
    log_failure_of("GetInNetworkPosts", error)
}

/// [`log_failure`] of a call to `method`.
pub fn log_failure_of(method: &str, error: ServiceError) -> Status {
    if !matches!(
        error,
        ServiceError::RateLimited | ServiceError::Overloaded | ServiceError::DeadlineExceeded
    ) {
        tracing::debug!(%error, method, "call failed");
    }
    error.into()
}

/// The client's deadline from the `grpc-timeout` header (gRPC over HTTP/2: at most 8 digits
/// and a unit `H M S m u n`); absent or malformed means none.
pub fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout_of(value: &str) -> Option<Duration> {
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-timeout", value.parse().ok()?);
        grpc_timeout(&metadata)
    }

    #[test]
    fn parses_grpc_timeout() {
        assert_eq!(timeout_of("250m"), Some(Duration::from_millis(250)));
        assert_eq!(timeout_of("2S"), Some(Duration::from_secs(2)));
        assert_eq!(timeout_of("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            timeout_of("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(timeout_of("123456789m"), None);
        assert_eq!(timeout_of("m"), None);
        assert_eq!(timeout_of("10x"), None);
        assert_eq!(timeout_of("-1S"), None);
    }
}
