//! Shared helpers of the server's integration tests: a store with a manual clock, a server on
//! free 127.0.0.1 ports, a gRPC client and a minimal HTTP/1.1 client for the admin port.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use thunder_engine::{LightPost, ManualClock, PostStore};
use thunder_proto::GetInNetworkPostsRequest;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::{FollowingSource, RunningServer, ServerOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

/// The store's "now" in every test.
pub const NOW: i64 = 1_700_000_000;
/// Generous bound for anything that waits; never a performance assertion.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A store whose clock stands at [`NOW`].
pub fn store() -> Arc<PostStore> {
    Arc::new(PostStore::with_clock(
        thunder_engine::config::DEFAULT_RETENTION_SECS,
        Arc::new(ManualClock::new(NOW)),
    ))
}

/// An original post.
pub fn original(post_id: i64, author_id: i64, age_secs: i64) -> LightPost {
    LightPost::original(post_id, author_id, NOW - age_secs)
}

/// A server under test; stops (without waiting) when dropped.
pub struct TestServer {
    pub server: Option<RunningServer>,
    pub store: Arc<PostStore>,
}

impl TestServer {
    /// Boots on free ports with `options` (addresses are forced to 127.0.0.1:0).
    pub async fn start(
        mut options: ServerOptions,
        store: Arc<PostStore>,
        following: Option<Arc<dyn FollowingSource>>,
    ) -> Self {
        options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
        options.admin_addr = "127.0.0.1:0".parse().expect("addr");
        let server = thunder_server::start(options, Arc::clone(&store), following)
            .await
            .expect("server starts");
        Self {
            server: Some(server),
            store,
        }
    }

    /// Boots with default options and marks the server ready.
    pub async fn ready(store: Arc<PostStore>) -> Self {
        let server = Self::start(ServerOptions::default(), store, None).await;
        server.running().readiness().set_ready().await;
        server
    }

    pub fn running(&self) -> &RunningServer {
        self.server.as_ref().expect("running")
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.running().grpc_addr())
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.grpc_url())
            .expect("url")
            .connect_timeout(PATIENCE)
            .timeout(PATIENCE)
            .connect()
            .await
            .expect("connects")
    }

    pub async fn client(&self) -> InNetworkPostsServiceClient<Channel> {
        InNetworkPostsServiceClient::new(self.channel().await)
    }

    /// `GET path` on the admin port.
    pub async fn admin_get(&self, path: &str) -> HttpResponse {
        http_get(self.running().admin_addr(), path).await
    }

    /// Graceful shutdown; true when in-flight calls drained in time.
    pub async fn shutdown(mut self) -> bool {
        match self.server.take() {
            Some(server) => server.shutdown().await,
            None => true,
        }
    }
}

/// A request for `authors` by viewer 1.
pub fn request(authors: &[u64]) -> GetInNetworkPostsRequest {
    GetInNetworkPostsRequest {
        user_id: 1,
        following_user_ids: authors.to_vec(),
        ..Default::default()
    }
}

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Minimal HTTP/1.1 GET with `Connection: close` (handles chunked bodies).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> HttpResponse {
    http_request(addr, "GET", path).await
}

/// Minimal HTTP/1.1 request without a body, `Connection: close` (handles chunked bodies).
pub async fn http_request(addr: std::net::SocketAddr, method: &str, path: &str) -> HttpResponse {
    http_request_with(addr, method, path, &addr.to_string(), &[]).await
}

/// A state-changing admin request as an operator sends it: POST with `X-Thunder-Admin: 1`.
pub async fn admin_post(addr: std::net::SocketAddr, path: &str) -> HttpResponse {
    http_request_with(
        addr,
        "POST",
        path,
        &addr.to_string(),
        &[("X-Thunder-Admin", "1")],
    )
    .await
}

/// [`http_request`] with the given `Host` and extra headers.
pub async fn http_request_with(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
) -> HttpResponse {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("admin connects");
        let extra: String = headers
            .iter()
            .map(|(name, value)| format!("{name}: {value}\r\n"))
            .collect();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream
            .write_all(head.as_bytes())
            .await
            .expect("request written");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("response read");
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(120), exchange)
        .await
        .expect("HTTP answer in time");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&data[..line_end]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16)
            .expect("chunk size");
        data = &data[line_end + 2..];
        if size == 0 {
            break;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
    out
}

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
