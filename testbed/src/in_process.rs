//! A server in the test's own process: a store with a manual clock, the server on free
//! 127.0.0.1 ports ([`TestServer`], or [`one_worker_server`] on a runtime of its own), a gRPC
//! client, and the posts and requests the tests build.

use std::sync::Arc;
use std::time::Duration;
use thunder_engine::{LightPost, ManualClock, PostStore};
use thunder_proto::GetInNetworkPostsRequest;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;

use thunder_server::{FollowingSource, RunningServer, ServerOptions};
use tonic::transport::Channel;

use crate::PATIENCE;
use crate::http::{HttpResponse, http_get};

/// The store's "now" in every test.
pub const NOW: i64 = 1_700_000_000;

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
    /// The server (`None` once shut down).
    pub server: Option<RunningServer>,
    /// The store it serves.
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

    /// The running server.
    pub fn running(&self) -> &RunningServer {
        self.server.as_ref().expect("running")
    }

    /// `http://` and the gRPC address.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.running().grpc_addr())
    }

    /// A channel to the gRPC port.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.grpc_url())
            .expect("url")
            .connect_timeout(PATIENCE)
            .timeout(PATIENCE)
            .connect()
            .await
            .expect("connects")
    }

    /// A gRPC client on a new channel.
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

/// A ready server on a runtime of its own with one worker (so that a test can keep the server
/// from reading by occupying that worker), and a client runtime with two.
pub struct OneWorkerServer {
    /// The server's runtime (one worker).
    pub server_rt: tokio::runtime::Runtime,
    /// The server, ready.
    pub server: RunningServer,
    /// `http://` and the server's gRPC address.
    pub url: String,
    /// The clients' runtime (two workers).
    pub client_rt: tokio::runtime::Runtime,
}

/// Boots `store` with `options` on a one-worker runtime of its own and marks it ready.
pub fn one_worker_server(options: ServerOptions, store: Arc<PostStore>) -> OneWorkerServer {
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("one-worker-server")
        .enable_all()
        .build()
        .expect("server runtime");
    let server = server_rt.block_on(async {
        let server = thunder_server::start(options, store, None)
            .await
            .expect("server starts");
        server.readiness().set_ready().await;
        server
    });
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    OneWorkerServer {
        server_rt,
        url: format!("http://{}", server.grpc_addr()),
        server,
        client_rt,
    }
}

/// A follow-graph source that takes `delay` to answer (keeps a call, and its connection, busy)
/// and then answers author 1.
#[derive(Debug)]
pub struct SlowFollowing {
    /// How long each fetch takes.
    pub delay: Duration,
}

#[tonic::async_trait]
impl FollowingSource for SlowFollowing {
    async fn fetch_following_list(&self, _user_id: i64, _limit: usize) -> Result<Vec<i64>, String> {
        tokio::time::sleep(self.delay).await;
        Ok(vec![1])
    }
}
