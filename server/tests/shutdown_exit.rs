//! The `thunder-server` process on SIGTERM: exit code 0 after a clean drain (idle
//! connections do not hold it up), [`EXIT_DRAIN_CUT`] when the drain timeout cut a call.

mod common;

use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body::Frame;
use thunder_server::lifecycle::EXIT_DRAIN_CUT;
use thunder_testkit::process::spawn_listening;
use tonic::codegen::{Bytes, Service, http};

/// A demo-mode server (small scale) that drains for at most `drain_ms`.
struct ServerProcess {
    child: Child,
    grpc: SocketAddr,
}

impl ServerProcess {
    async fn start(drain_ms: u64) -> Self {
        let started = spawn_listening(
            |grpc, admin| {
                let mut command = Command::new(env!("CARGO_BIN_EXE_thunder-server"));
                command
                    .args([
                        "--grpc-addr",
                        &grpc.to_string(),
                        "--admin-addr",
                        &admin.to_string(),
                    ])
                    .args(["--demo-scale", "1000", "--demo-events-per-sec", "0"])
                    .args(["--shutdown-timeout-ms", &drain_ms.to_string()])
                    .env("RUST_LOG", "warn")
                    .stdin(Stdio::null());
                command
            },
            Duration::from_secs(60),
        );
        let admin = started.admin;
        let server = Self {
            child: started.child,
            grpc: started.grpc,
        };
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if std::net::TcpStream::connect(admin).is_ok()
                && common::http_get(admin, "/readyz").await.status == 200
            {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("server not ready");
    }

    /// SIGTERM, then the exit code and how long the exit took.
    fn terminate(&mut self) -> (Option<i32>, Duration) {
        let started = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        while started.elapsed() < Duration::from_secs(30) {
            if let Some(exit) = self.child.try_wait().expect("wait") {
                return (exit.code(), started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no exit within 30 s of SIGTERM");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // Already gone after a clean terminate(); these only matter on a failed test.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let mut server = ServerProcess::start(20_000).await;
    let _silent = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connects");
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .expect("url")
        .connect()
        .await
        .expect("h2 connection");
    let (code, took) = server.terminate();
    assert_eq!(code, Some(0));
    assert!(
        took < Duration::from_secs(10),
        "exit took {took:?} (drain timeout 20 s)"
    );
    drop(channel);
}

#[tokio::test]
async fn sigterm_exits_3_when_the_drain_cuts_a_call() {
    let mut server = ServerProcess::start(300).await;
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
    let (code, _) = server.terminate();
    assert_eq!(code, Some(EXIT_DRAIN_CUT));
    in_flight.abort();
}
