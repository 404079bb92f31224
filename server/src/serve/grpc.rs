//! The gRPC services as the server mounts them. `thunder.v1.InNetworkPostsService`: tonic's
//! unary machinery with [`PostsCodec`] (answers encoded straight from the store's posts), in
//! place of the generated `InNetworkPostsServiceServer`, plus the checks tonic leaves out:
//!
//! - a request whose `content-type` is not `application/grpc[+proto]` is refused with HTTP
//!   415 (and `grpc-status` INVALID_ARGUMENT), as the gRPC spec asks;
//! - a call that fails before reaching the handler (undecodable body, unsupported
//!   compression, message above the size limit) is counted in
//!   `get_in_network_posts_requests_total`; an oversized message is answered
//!   `RESOURCE_EXHAUSTED` (gRPC convention) instead of tonic's `OUT_OF_RANGE`.
//!
//! `thunder.v1.InNetworkPostsDebugService` ([`DebugService`]): the generated tonic server over
//! [`ThunderService::explain`], which shares the queries' admission and overload controller.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use thunder_proto::in_network_posts_debug_service_server::InNetworkPostsDebugService;
use thunder_proto::{ExplainPostRequest, ExplainPostResponse};
use tonic::body::Body;
use tonic::codec::CompressionEncoding;
use tonic::codegen::{BoxFuture, Service, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Code, Request, Response, Status};

use crate::error::ServiceError;
use crate::serve::arrival::Accepted;
use crate::serve::codec::{DecodedRequest, PostsAnswer, PostsCodec};
use crate::serve::listener::ConnInfo;
use crate::serve::metrics::{RequestSummary, ServeMetrics};
use crate::serve::service::{
    Answer, ThunderService, log_failure, log_failure_of, with_degrade_header,
};

/// Path of the one method.
pub const METHOD_PATH: &str = "/thunder.v1.InNetworkPostsService/GetInNetworkPosts";

/// What answers a decoded call behind [`PostsServer`]: the store's [`ThunderService`], or a
/// stand-in that shares everything else of the serving path (the benchmarks' floor server,
/// which answers from pre-built posts to measure what the transport and codec alone cost).
pub trait AnswerPosts: Send + Sync + 'static {
    /// The answer to one call, or the error its status is made from.
    fn answer(
        &self,
        request: tonic::Request<DecodedRequest>,
    ) -> impl Future<Output = Result<Answer, ServiceError>> + Send;
}

impl AnswerPosts for ThunderService {
    fn answer(
        &self,
        request: tonic::Request<DecodedRequest>,
    ) -> impl Future<Output = Result<Answer, ServiceError>> + Send {
        ThunderService::answer(self, request)
    }
}

/// The service, cheap to clone (one per connection).
#[derive(Debug)]
pub struct PostsServer<H = ThunderService> {
    inner: Arc<H>,
    max_decoding_message_bytes: usize,
}

impl<H> Clone for PostsServer<H> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            max_decoding_message_bytes: self.max_decoding_message_bytes,
        }
    }
}

impl<H> PostsServer<H> {
    /// Serves `inner`, refusing request messages above `max_decoding_message_bytes`.
    pub fn new(inner: Arc<H>, max_decoding_message_bytes: usize) -> Self {
        Self {
            inner,
            max_decoding_message_bytes,
        }
    }
}

impl<H> NamedService for PostsServer<H> {
    const NAME: &'static str = thunder_proto::SERVICE_NAME;
}

/// True for `application/grpc`, `application/grpc+proto` and `application/grpc;...`.
fn is_grpc_content_type(headers: &http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/grpc")
        || essence.eq_ignore_ascii_case("application/grpc+proto")
}

/// The connection a request came on (plaintext or TLS).
fn connection_of<B>(req: &http::Request<B>) -> Option<&ConnInfo> {
    ConnInfo::of(req.extensions())
}

/// Counts a call that never reached the handler.
fn count_unhandled(code: Code, started: Instant) {
    ServeMetrics::global().record_request(&RequestSummary {
        code,
        duration: started.elapsed(),
        ..RequestSummary::default()
    });
}

impl<H, B> Service<http::Request<B>> for PostsServer<H>
where
    H: AnswerPosts,
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        let max_decoding = self.max_decoding_message_bytes;
        // The connection is busy (not idle, not closed at shutdown) until the call is answered.
        let busy = connection_of(&req).map(|info| info.activity.begin());
        Box::pin(async move {
            let _busy = busy;
            let started = Accepted::of(req.extensions());
            if req.uri().path() != METHOD_PATH {
                return Ok(Status::unimplemented("unknown method").into_http());
            }
            if !is_grpc_content_type(req.headers()) {
                count_unhandled(Code::InvalidArgument, started);
                let mut response: http::Response<Body> =
                    Status::invalid_argument("content-type must be application/grpc").into_http();
                *response.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
                return Ok(response);
            }
            let entered = Arc::new(AtomicBool::new(false));
            let method = Method {
                inner,
                entered: Arc::clone(&entered),
            };
            let mut grpc = Grpc::new(PostsCodec)
                .accept_compressed(CompressionEncoding::Zstd)
                .accept_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Zstd)
                .send_compressed(CompressionEncoding::Gzip)
                .max_decoding_message_size(max_decoding);
            let response = grpc.unary(method, req).await;
            // Same task, after `unary` returned: the handler's store (if any) is visible.
            if entered.load(Ordering::Relaxed) {
                return Ok(response);
            }
            let code = response
                .extensions()
                .get::<Status>()
                .map_or(Code::Unknown, Status::code);
            if code == Code::OutOfRange {
                // tonic's answer to a message above the size limit.
                let message = response
                    .extensions()
                    .get::<Status>()
                    .map(|s| s.message().to_owned())
                    .unwrap_or_default();
                count_unhandled(Code::ResourceExhausted, started);
                return Ok(Status::resource_exhausted(message).into_http());
            }
            count_unhandled(code, started);
            Ok(response)
        })
    }
}

/// The unary method: marks that the handler was reached, then answers.
struct Method<H> {
    inner: Arc<H>,
    entered: Arc<AtomicBool>,
}

impl<H: AnswerPosts> UnaryService<DecodedRequest> for Method<H> {
    type Response = PostsAnswer;
    type Future = BoxFuture<tonic::Response<PostsAnswer>, Status>;

    fn call(&mut self, request: tonic::Request<DecodedRequest>) -> Self::Future {
        self.entered.store(true, Ordering::Relaxed);
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            match inner.answer(request).await {
                Ok(answer) => Ok(with_degrade_header(answer.posts, answer.level)),
                Err(error) => Err(log_failure(error)),
            }
        })
    }
}

/// `thunder.v1.InNetworkPostsDebugService` over the service that answers queries (sharing its
/// admission, overload controller and store).
#[derive(Debug)]
pub struct DebugService {
    service: Arc<ThunderService>,
}

impl DebugService {
    /// The debug service of `service`.
    pub fn new(service: Arc<ThunderService>) -> Self {
        Self { service }
    }
}

#[tonic::async_trait]
impl InNetworkPostsDebugService for DebugService {
    async fn explain_post(
        &self,
        request: Request<ExplainPostRequest>,
    ) -> Result<Response<ExplainPostResponse>, Status> {
        match self.service.explain(request).await {
            Ok((response, level)) => Ok(with_degrade_header(response, level)),
            Err(error) => Err(log_failure_of("ExplainPost", error)),
        }
    }
}
