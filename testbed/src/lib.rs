//! thunder-testbed: what the integration tests of thunder-server and thunder-cli run against.
//! The CLI's own tests against a server live in this crate's `tests/` (`cli_*.rs`, running the
//! built `thunder-cli`), and so does the generator of the docs made from the code
//! (`tests/generated_docs.rs`), so that the CLI needs no server even among its
//! dev-dependencies.
//!
//! - [`in_process`]: a server started in the test's own process around a store with a manual
//!   clock ([`TestServer`]), and the requests and posts the tests build.
//! - [`server_process`]: `thunder-server` processes (demo mode, or fed by a broker), killed on
//!   drop, and their gRPC health as a balancer sees it.
//! - [`process`]: processes started on free 127.0.0.1 ports (again on new ports when a port was
//!   taken first), and the workspace's binaries.
//! - [`kafka`]: a real Kafka-protocol test broker on a free port, topics, producers, waiting on
//!   ingestion and comparing the store with the model; [`kafka::proxy`] puts a TLS and SASL
//!   endpoint in front of it.
//! - [`http`]: a minimal HTTP/1.1 client for the admin port; [`metrics`] reads one metric out
//!   of a scrape or the process's registry.
//! - [`pki`]: throw-away CAs and certificates (rcgen); [`repo`]: the repository's files (its
//!   root, YAML manifests as JSON).
//!
//! A dev-dependency only (of thunder-server). The plain model store the engine is checked against is in
//! thunder-testkit, which links none of the server (the engine's tests and the fuzzers use it).
#![deny(missing_docs)]

use std::time::Duration;

pub mod http;
pub mod in_process;
pub mod kafka;
pub mod metrics;
pub mod pki;
pub mod process;
pub mod repo;
pub mod server_process;

pub use http::{HttpResponse, admin_post, http_get, http_request, http_request_with};
pub use in_process::{NOW, TestServer, one_worker_server, original, request, store};

/// Generous bound for anything that waits; never a performance assertion.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `check` every 50 ms until it holds or [`PATIENCE`] runs out.
pub async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
