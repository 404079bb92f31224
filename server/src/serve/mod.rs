//! Serving `GetInNetworkPosts` (and explaining its answers, `ExplainPost`): everything between
//! an accepted connection and the encoded answer.
//!
//! # A call's way through
//! 1. `listener.rs` accepts the connection within its caps and timeouts ([`listener`]);
//!    `write_batch.rs` gathers h2's frame writes into one socket write per write pass.
//! 2. `arrival.rs` stamps the moment hyper accepts the call's stream (`arrival::Accepted`):
//!    every deadline and queue wait counts from there, not from the task's first poll.
//! 3. `grpc.rs` is the HTTP/2 service as mounted: tonic's unary machinery with
//!    [`codec::PostsCodec`], plus the checks tonic leaves out (content type, failures before the
//!    handler, oversized messages).
//! 4. `service.rs` runs the call ([`service::ThunderService`]): admission (`admission.rs`, the
//!    global QPS limit), validation (`request.rs`), the follow-graph fallback for an empty
//!    following list (`following.rs`), an executor slot and a degrade level from the overload
//!    controller (`overload.rs`), then the store query within the client's deadline.
//! 5. `request.rs` validates and clamps the request and runs it against the store
//!    ([`request::handle_request`]: the whole read path without a network, the fuzzers' entry);
//!    `extensions.rs` adds the fields beyond the reference contract (seen filter, time bounds,
//!    paging), whose page cursors are `cursor.rs`.
//! 6. `codec.rs` encodes the answer straight from the store's posts into tonic's buffer, byte
//!    for byte what prost would write.
//!
//! `ExplainPost` (`thunder.v1.InNetworkPostsDebugService`, mounted by `grpc.rs`) takes the same
//! way through `service.rs` (admission, validation, fallback, executor slot and degrade level),
//! then `explain.rs` runs the store's explain of the request and puts its verdicts on the wire.
//!
//! With mTLS on (the certificate, key and client CA of `tls.rs`, [`tls::TlsFiles`]),
//! `tls_accept.rs` runs each connection's TLS handshake ([`tls_accept`]), so that a failed one
//! is counted and logged with its reason.
//!
//! `log_limit.rs` keeps the per-request logs a client can trigger short and rate-limited.
//!
//! # Metrics
//! `metrics.rs` declares the serving path's metrics ([`metrics::ServeMetrics`]): every call is
//! recorded once from its summary, and the shape of its answer apart, counted per author by
//! `author_counts.rs`.
//!
//! # Errors
//! Every refusal is a [`crate::ServiceError`], mapped to its gRPC code in one place
//! (`error.rs` at the crate's top), and counted once in `get_in_network_posts_requests_total`.

pub mod admission;
pub(crate) mod arrival;
pub(crate) mod author_counts;
pub mod codec;
pub mod cursor;
pub mod explain;
pub(crate) mod extensions;
pub mod following;
pub mod grpc;
pub mod listener;
pub(crate) mod log_limit;
pub mod metrics;
pub mod overload;
pub mod request;
pub mod service;
pub mod tls;
pub mod tls_accept;
pub(crate) mod write_batch;
