//! The `thunder-server` process on SIGTERM: the lame duck (readiness off while calls are still
//! served), exit code 0 after a clean drain (idle connections do not hold it up),
//! [`EXIT_DRAIN_CUT`] when the drain timeout cut a call, and a bounded stop that still logs
//! `stopped` when the broker is unreachable.

use std::pin::Pin;
use std::process::Command;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body::Frame;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::lifecycle::EXIT_DRAIN_CUT;
use thunder_testbed::server_process::ServerProcess;
use tonic::codegen::{Bytes, Service, http};

/// A demo-mode server (small scale) that drains for at most `drain_ms`, without a lame duck,
/// once ready.
async fn start(drain_ms: u64) -> ServerProcess {
    let drain_ms = drain_ms.to_string();
    ServerProcess::demo(&[
        "--demo-scale",
        "1000",
        "--demo-events-per-sec",
        "0",
        "--shutdown-timeout-ms",
        &drain_ms,
        "--shutdown-delay-secs",
        "0",
    ])
    .await
}

/// Sends SIGTERM to the server.
fn send_sigterm(server: &ServerProcess) {
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// Waits at most `within` for the server to exit: its exit code.
fn exit_code(server: &mut ServerProcess, within: Duration) -> Option<i32> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(exit) = server.child.try_wait().expect("wait") {
            return exit.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no exit within {within:?} of SIGTERM");
}

/// SIGTERM, then the exit code and how long the exit took.
fn terminate(server: &mut ServerProcess) -> (Option<i32>, Duration) {
    let started = Instant::now();
    send_sigterm(server);
    let code = exit_code(server, Duration::from_secs(30));
    (code, started.elapsed())
}

/// A request body that announces a 100-byte message, sends 2 bytes of it, then stalls: the
/// call stays in flight until the server gives up on it.
struct Stalled {
    sent: bool,
}

impl http_body::Body for Stalled {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.sent {
            return Poll::Pending;
        }
        self.sent = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&[
            0, 0, 0, 0, 100, 8, 1,
        ])))))
    }
}

#[tokio::test]
async fn sigterm_with_only_idle_connections_exits_0_at_once() {
    let mut server = start(20_000).await;
    let _silent = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connects");
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .expect("url")
        .connect()
        .await
        .expect("h2 connection");
    let (code, took) = terminate(&mut server);
    assert_eq!(code, Some(0));
    assert!(
        took < Duration::from_secs(10),
        "exit took {took:?} (drain timeout 20 s)"
    );
    drop(channel);
}

#[tokio::test]
async fn sigterm_exits_3_when_the_drain_cuts_a_call() {
    let mut server = start(300).await;
    let mut channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .expect("url")
        .connect()
        .await
        .expect("h2 connection");
    let request = http::Request::post(format!(
        "http://{}{}",
        server.grpc,
        thunder_server::serve::grpc::METHOD_PATH
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(tonic::body::Body::new(Stalled { sent: false }))
    .expect("request");
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .expect("ready");
    let in_flight = tokio::spawn(channel.call(request));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, _) = terminate(&mut server);
    assert_eq!(code, Some(EXIT_DRAIN_CUT));
    in_flight.abort();
}

/// The status of `GET /readyz` as a probe sees it; `None` once the port is closed.
async fn readyz(admin: std::net::SocketAddr) -> Option<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(admin).await.ok()?;
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        String::from_utf8_lossy(&raw)
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_readiness_is_off_while_calls_are_still_served_then_exit_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("server.log");
    let mut server = ServerProcess::start_logged(
        &[
            "--demo-scale",
            "1000",
            "--demo-events-per-sec",
            "0",
            "--shutdown-delay-secs",
            "3",
        ],
        thunder_testbed::PATIENCE,
        &log,
    );
    assert!(
        thunder_testbed::eventually(|| async {
            thunder_testbed::http_get(server.admin, "/readyz")
                .await
                .status
                == 200
        })
        .await,
        "never ready"
    );
    let url = format!("http://{}", server.grpc);
    let mut client = InNetworkPostsServiceClient::connect(url.clone())
        .await
        .expect("connect");
    client
        .get_in_network_posts(thunder_testbed::request(&[1, 2, 3]))
        .await
        .expect("served before SIGTERM");

    let signalled = Instant::now();
    send_sigterm(&server);
    // An independent probe (a new HTTP connection each time) and calls on the open
    // connection, side by side, until the calls stop.
    let mut lame_duck: Option<(Instant, Instant)> = None;
    let mut new_connection_served = false;
    while signalled.elapsed() < Duration::from_secs(10) {
        let probe = readyz(server.admin).await;
        let call = client
            .get_in_network_posts(thunder_testbed::request(&[1, 2, 3]))
            .await;
        if probe != Some(503) || call.is_err() {
            if lame_duck.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let now = Instant::now();
        lame_duck = Some(lame_duck.map_or((now, now), |(first, _)| (first, now)));
        if !new_connection_served
            && let Ok(mut fresh) = InNetworkPostsServiceClient::connect(url.clone()).await
        {
            new_connection_served = fresh
                .get_in_network_posts(thunder_testbed::request(&[1]))
                .await
                .is_ok();
        }
        let health =
            thunder_testbed::server_process::health_of(server.grpc, thunder_proto::SERVICE_NAME)
                .await;
        assert_ne!(
            health,
            Some(tonic_health::pb::health_check_response::ServingStatus::Serving as i32),
            "gRPC health still SERVING during the lame duck"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (first, last) = lame_duck.expect("/readyz never 503 while calls were served");
    assert!(
        last - first >= Duration::from_secs(1),
        "/readyz 503 with calls served for only {:?}",
        last - first
    );
    assert!(
        new_connection_served,
        "a new connection was refused in the lame duck"
    );
    assert_eq!(exit_code(&mut server, Duration::from_secs(30)), Some(0));
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("lame duck"), "{text}");
    assert!(text.contains("stopped"), "{text}");
}

#[test]
fn sigterm_with_the_broker_unreachable_stops_in_bounded_time_and_logs_stopped() {
    // A port nothing listens on: the broker is unreachable from the start.
    let unreachable = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("server.log");
    let mut server = ServerProcess::start_logged(
        &[
            "--kafka-brokers",
            &unreachable,
            "--shutdown-delay-secs",
            "5",
        ],
        thunder_testbed::PATIENCE,
        &log,
    );
    std::thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    send_sigterm(&server);
    assert_eq!(exit_code(&mut server, Duration::from_secs(20)), Some(0));
    let took = signalled.elapsed();
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("stopped"), "{text}");
    // The wait for the consumers is said, with its bound, not seconds of silence.
    assert!(
        text.contains("stopping Kafka ingestion") && text.contains("timeout_secs"),
        "{text}"
    );
    // Never ready, so no lame duck: the drain and the bounded Kafka stop only.
    assert!(!text.contains("lame duck"), "{text}");
    eprintln!("stopped {took:?} after SIGTERM");
}
