//! `thunder-server` processes: started on free 127.0.0.1 ports (again on new ports when one was
//! taken first: [`crate::process`]), killed (SIGKILL) on drop; a demo-mode server waited for
//! until ready, a server fed by a broker, and their gRPC health as a balancer sees it.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use thunder_engine::LightPost;
use thunder_proto::GetInNetworkPostsRequest;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::PATIENCE;
use crate::http::http_get;
use crate::process::{binary, spawn_listening};

/// How long a server fed by a broker may take to start, and to turn SERVING.
pub const TIMEOUT: Duration = Duration::from_secs(180);

/// The server process and its addresses; killed on drop.
pub struct ServerProcess {
    /// The process.
    pub child: Child,
    /// Its gRPC address.
    pub grpc: SocketAddr,
    /// Its admin HTTP address.
    pub admin: SocketAddr,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ServerProcess {
    /// Starts `thunder-server --grpc-addr G --admin-addr A args` (`RUST_LOG=warn`, no stdin) on
    /// free ports and waits, at most `within`, until it listens on both.
    pub fn start(args: &[&str], within: Duration) -> Self {
        Self::start_with(args, within, |_| {})
    }

    /// [`ServerProcess::start`] with `RUST_LOG=info` and the log (standard output) written to
    /// the file `log`, as a log collector reads it (not a terminal).
    pub fn start_logged(args: &[&str], within: Duration, log: &std::path::Path) -> Self {
        Self::start_with(args, within, |command| {
            let file = std::fs::File::create(log).expect("create the log file");
            command.env("RUST_LOG", "info").stdout(file);
        })
    }

    /// [`ServerProcess::start`], the command adjusted by `configure` before each spawn.
    pub fn start_with(args: &[&str], within: Duration, configure: impl Fn(&mut Command)) -> Self {
        let started = spawn_listening(
            |grpc, admin| {
                let mut command = Command::new(binary("thunder-server"));
                command
                    .args([
                        "--grpc-addr",
                        &grpc.to_string(),
                        "--admin-addr",
                        &admin.to_string(),
                    ])
                    .args(args)
                    .env("RUST_LOG", "warn")
                    .stdin(Stdio::null());
                configure(&mut command);
                command
            },
            within,
        );
        Self {
            child: started.child,
            grpc: started.grpc,
            admin: started.admin,
        }
    }

    /// A demo-mode server (`--demo-scale` and the rest in `args`), once `/readyz` answers 200.
    pub async fn demo(args: &[&str]) -> Self {
        let server = Self::start(args, PATIENCE);
        let until = Instant::now() + PATIENCE;
        while http_get(server.admin, "/readyz").await.status != 200 {
            assert!(Instant::now() < until, "demo server not ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }
}

/// Starts `thunder-server` on free ports, reading `topic` from the broker at `bootstrap` with 2
/// ingest threads, a 2 s stall timeout and a retention of `retention_secs`, plus `extra` flags.
pub fn start_server(
    bootstrap: &str,
    topic: &str,
    retention_secs: i64,
    extra: &[&str],
) -> ServerProcess {
    let retention = retention_secs.to_string();
    let mut args = vec![
        "--kafka-brokers",
        bootstrap,
        "--kafka-topic",
        topic,
        "--kafka-num-threads",
        "2",
        "--kafka-stall-timeout-secs",
        "2",
        "--post-retention-seconds",
        &retention,
        // Answers are compared exactly: a busy test machine must not degrade them.
        "--max-degrade-level",
        "0",
    ];
    args.extend_from_slice(extra);
    ServerProcess::start(&args, TIMEOUT)
}

/// One feed call (authors 1, 2 and 3) to the server at `grpc`, which must answer OK.
pub async fn one_call(grpc: SocketAddr) {
    let mut client = InNetworkPostsServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    client
        .get_in_network_posts(crate::in_process::request(&[1, 2, 3]))
        .await
        .expect("a call");
}

/// The gRPC health status, `None` while the server does not answer.
pub async fn health(grpc: SocketAddr) -> Option<i32> {
    health_of(grpc, "").await
}

/// The gRPC health status of `service`, `None` while the server does not answer.
pub async fn health_of(grpc: SocketAddr, service: &str) -> Option<i32> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .ok()?
        .connect()
        .await
        .ok()?;
    let mut client = HealthClient::new(channel);
    let response = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .ok()?;
    Some(response.into_inner().status)
}

/// Polls health every 2 ms until SERVING; true if it was seen NOT_SERVING first.
pub async fn wait_serving(grpc: SocketAddr) -> bool {
    let deadline = Instant::now() + TIMEOUT;
    let mut saw_not_serving = false;
    loop {
        match health(grpc).await {
            Some(s) if s == ServingStatus::Serving as i32 => return saw_not_serving,
            Some(_) => saw_not_serving = true,
            None => {}
        }
        assert!(Instant::now() < deadline, "never SERVING");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Every viewer's feed and videos from the server at `grpc`, in the order of `viewers`: what
/// two replicas are compared on.
pub async fn answers(grpc: SocketAddr, viewers: &[(i64, Vec<i64>)]) -> Vec<Vec<LightPost>> {
    let mut client = InNetworkPostsServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let mut all = Vec::new();
    for (viewer, following) in viewers {
        for video in [false, true] {
            all.push(ask(&mut client, *viewer, following, video).await);
        }
    }
    all
}

/// Asks the server for `viewer`'s feed (or videos) of `following`.
pub async fn ask(
    client: &mut InNetworkPostsServiceClient<tonic::transport::Channel>,
    viewer: i64,
    following: &[i64],
    video: bool,
) -> Vec<LightPost> {
    let request = GetInNetworkPostsRequest {
        user_id: viewer as u64,
        following_user_ids: following.iter().map(|&a| a as u64).collect(),
        is_video_request: video,
        ..Default::default()
    };
    client
        .get_in_network_posts(request)
        .await
        .expect("query")
        .into_inner()
        .posts
        .iter()
        .map(thunder_events::wire::post_from_proto)
        .collect()
}
