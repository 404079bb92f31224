//! The `thunder.v1.InNetworkPostsService` implementation: admission, validation, the optional
//! follow-graph fallback, then the store query on a blocking thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use thunder_engine::PostStore;
use thunder_engine::config::MAX_INPUT_LIST_SIZE;
use thunder_proto::in_network_posts_service_server::InNetworkPostsService;
use thunder_proto::{GetInNetworkPostsRequest, GetInNetworkPostsResponse};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::admission::Admission;
use crate::error::ServiceError;
use crate::following::FollowingSource;
use crate::metrics;
use crate::request::{ValidatedRequest, response_from};

/// Share of the client's `grpc-timeout` given to the store query; the rest is left for
/// encoding and the trip back, so a partial answer arrives before the client gives up.
const CLIENT_BUDGET_PERCENT: u32 = 80;

/// The gRPC service over a [`PostStore`].
#[derive(Debug)]
pub struct ThunderService {
    store: Arc<PostStore>,
    admission: Admission,
    following: Option<Arc<dyn FollowingSource>>,
    request_timeout: Option<Duration>,
}

impl ThunderService {
    /// A service reading `store`, admitting calls through `admission`, falling back to
    /// `following` for empty following lists, and giving each store query at most
    /// `request_timeout` (`None`: only the client's deadline applies).
    pub fn new(
        store: Arc<PostStore>,
        admission: Admission,
        following: Option<Arc<dyn FollowingSource>>,
        request_timeout: Option<Duration>,
    ) -> Self {
        Self {
            store,
            admission,
            following,
            request_timeout,
        }
    }

    async fn serve(
        &self,
        request: Request<GetInNetworkPostsRequest>,
    ) -> Result<GetInNetworkPostsResponse, ServiceError> {
        let _in_flight = self.admission.admit()?;
        let arrival = Instant::now();
        let client_timeout = grpc_timeout(request.metadata());
        let req = request.into_inner();
        metrics::GET_IN_NETWORK_POSTS_REQUEST_BYTES.observe(req.encoded_len() as f64);
        metrics::GET_IN_NETWORK_POSTS_FOLLOWING_SIZE.observe(req.following_user_ids.len() as f64);
        metrics::GET_IN_NETWORK_POSTS_EXCLUDED_SIZE.observe(req.exclude_tweet_ids.len() as f64);
        let mut validated = ValidatedRequest::from_request(&req)?;
        if validated.debug {
            tracing::info!(
                user_id = validated.viewer_id,
                following = req.following_user_ids.len(),
                excluded = req.exclude_tweet_ids.len(),
                max_results = validated.max_results,
                video = validated.is_video,
                algorithm = %req.algorithm.escape_debug(),
                "GetInNetworkPosts"
            );
        }
        drop(req);

        if validated.following_was_empty
            && let Some(source) = &self.following
        {
            let fetched = source
                .fetch_following_list(validated.viewer_id, MAX_INPUT_LIST_SIZE)
                .await;
            let status = if fetched.is_ok() { "success" } else { "error" };
            metrics::STRATO_REQUESTS
                .with_label_values(&["fetch_following_list", status])
                .inc();
            validated.set_authors(fetched.map_err(ServiceError::FollowingFetch)?);
        }

        let _without_fetch = metrics::GET_IN_NETWORK_POSTS_DURATION_WITHOUT_STRATO.start_timer();
        metrics::GET_IN_NETWORK_POSTS_MAX_RESULTS.observe(validated.max_results as f64);
        let deadline = self.deadline(arrival, client_timeout);
        let store = Arc::clone(&self.store);
        let (outcome, validated, now_secs) = tokio::task::spawn_blocking(move || {
            let outcome = validated.execute(&store, deadline);
            (outcome, validated, store.now_secs())
        })
        .await
        .map_err(|e| ServiceError::QueryTask(e.to_string()))?;

        metrics::POST_STORE_REQUESTS.inc();
        if outcome.timed_out {
            metrics::POST_STORE_REQUEST_TIMEOUTS.inc();
        }
        let returned = outcome.posts.len();
        metrics::POST_STORE_POSTS_RETURNED.observe(returned as f64);
        if outcome.eligible > 0 {
            metrics::POST_STORE_POSTS_RETURNED_RATIO
                .observe(returned as f64 / outcome.eligible as f64);
        }
        metrics::record_found_posts("scored", &outcome.posts, now_secs);
        metrics::GET_IN_NETWORK_POSTS_COUNT.observe(returned as f64);
        if validated.debug {
            tracing::info!(
                user_id = validated.viewer_id,
                returned,
                timed_out = outcome.timed_out,
                "GetInNetworkPosts done"
            );
        }
        let response = response_from(&outcome);
        metrics::GET_IN_NETWORK_POSTS_RESPONSE_BYTES.observe(response.encoded_len() as f64);
        Ok(response)
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

#[tonic::async_trait]
impl InNetworkPostsService for ThunderService {
    async fn get_in_network_posts(
        &self,
        request: Request<GetInNetworkPostsRequest>,
    ) -> Result<Response<GetInNetworkPostsResponse>, Status> {
        let timer = metrics::GET_IN_NETWORK_POSTS_DURATION.start_timer();
        let result = self.serve(request).await;
        let code = result
            .as_ref()
            .map_or_else(ServiceError::code, |_| tonic::Code::Ok);
        metrics::GET_IN_NETWORK_POSTS_REQUESTS
            .with_label_values(&[code_label(code)])
            .inc();
        timer.observe_duration();
        match result {
            Ok(response) => Ok(Response::new(response)),
            Err(error) => {
                if !matches!(error, ServiceError::RateLimited) {
                    tracing::debug!(%error, "GetInNetworkPosts failed");
                }
                Err(error.into())
            }
        }
    }
}

/// Metric label of a gRPC status code.
fn code_label(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "ok",
        tonic::Code::ResourceExhausted => "resource_exhausted",
        tonic::Code::InvalidArgument => "invalid_argument",
        tonic::Code::Internal => "internal",
        _ => "other",
    }
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
