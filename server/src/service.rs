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
use crate::metrics::{Metrics, QuerySummary, RequestSize, RequestSummary};
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
    metrics: &'static Metrics,
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
            metrics: Metrics::global(),
        }
    }

    /// Serves one call and records it in the metrics with a single
    /// [`Metrics::record_request`] at its end.
    async fn serve(
        &self,
        request: Request<GetInNetworkPostsRequest>,
    ) -> Result<GetInNetworkPostsResponse, ServiceError> {
        let started = Instant::now();
        let mut summary = RequestSummary::default();
        let result = self.handle(request, &mut summary).await;
        summary.code = result
            .as_ref()
            .map_or_else(ServiceError::code, |_| tonic::Code::Ok);
        summary.duration = started.elapsed();
        self.metrics.record_request(&summary);
        result
    }

    /// Admission, validation and the follow-graph fallback; notes in `summary` what it did.
    async fn handle(
        &self,
        request: Request<GetInNetworkPostsRequest>,
        summary: &mut RequestSummary,
    ) -> Result<GetInNetworkPostsResponse, ServiceError> {
        let _in_flight = self.admission.admit()?;
        let arrival = Instant::now();
        let client_timeout = grpc_timeout(request.metadata());
        let req = request.into_inner();
        summary.request = Some(RequestSize {
            encoded_bytes: req.encoded_len(),
            following: req.following_user_ids.len(),
            excluded: req.exclude_tweet_ids.len(),
        });
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
            summary.following_fetch = Some(fetched.is_ok());
            validated.set_authors(fetched.map_err(ServiceError::FollowingFetch)?);
        }

        let after_fetch = Instant::now();
        summary.max_results = Some(validated.max_results);
        let deadline = self.deadline(arrival, client_timeout);
        let result = self.query(validated, deadline, summary).await;
        summary.duration_without_fetch = Some(after_fetch.elapsed());
        result
    }

    /// The store query on a blocking thread and the response; notes the answer in `summary`.
    async fn query(
        &self,
        validated: ValidatedRequest,
        deadline: Option<Instant>,
        summary: &mut RequestSummary,
    ) -> Result<GetInNetworkPostsResponse, ServiceError> {
        let store = Arc::clone(&self.store);
        let (outcome, validated, now_secs) = tokio::task::spawn_blocking(move || {
            let outcome = validated.execute(&store, deadline);
            (outcome, validated, store.now_secs())
        })
        .await
        .map_err(|e| ServiceError::QueryTask(e.to_string()))?;

        if validated.debug {
            tracing::info!(
                user_id = validated.viewer_id,
                returned = outcome.posts.len(),
                timed_out = outcome.timed_out,
                "GetInNetworkPosts done"
            );
        }
        let response = response_from(&validated, &outcome);
        summary.response_bytes = Some(response.encoded_len());
        summary.query = Some(QuerySummary {
            posts: outcome.posts,
            timed_out: outcome.timed_out,
            eligible: outcome.eligible,
            now_secs,
        });
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
        let result = self.serve(request).await;
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
