//! The `thunder-server` process on SIGTERM: exit code 0 after a clean drain (idle
//! connections do not hold it up), [`EXIT_DRAIN_CUT`] when the drain timeout cut a call.

mod common;
mod server_process;

use std::pin::Pin;
use std::process::Command;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body::Frame;
use server_process::ServerProcess;
use thunder_server::lifecycle::EXIT_DRAIN_CUT;
use tonic::codegen::{Bytes, Service, http};

/// A demo-mode server (small scale) that drains for at most `drain_ms`, once ready.
async fn start(drain_ms: u64) -> ServerProcess {
    let drain_ms = drain_ms.to_string();
    ServerProcess::demo(&[
        "--demo-scale",
        "1000",
        "--demo-events-per-sec",
        "0",
        "--shutdown-timeout-ms",
        &drain_ms,
    ])
    .await
}

/// SIGTERM, then the exit code and how long the exit took.
fn terminate(server: &mut ServerProcess) -> (Option<i32>, Duration) {
    let started = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    while started.elapsed() < Duration::from_secs(30) {
        if let Some(exit) = server.child.try_wait().expect("wait") {
            return (exit.code(), started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no exit within 30 s of SIGTERM");
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
