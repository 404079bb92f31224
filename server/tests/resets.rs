//! Stream resets: a client whose own deadlines expire while the server is busy keeps its
//! connection, while a connection that opens and resets thousands of streams at once (the
//! HTTP/2 "rapid reset" flood) is closed with GOAWAY ENHANCE_YOUR_CALM. The server runs in the
//! test process, on 127.0.0.1.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::ServerOptions;
use thunder_testbed::in_process::OneWorkerServer;
use thunder_testbed::{PATIENCE, one_worker_server, original, request, store};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tonic::Code;

fn store_with_posts() -> Arc<thunder_engine::PostStore> {
    let store = store();
    store.insert_posts(&[original(1, 1, 10), original(2, 2, 20)]);
    store
}

/// Outcomes of the hasty client's calls.
#[derive(Debug, Default)]
struct Outcomes {
    /// Ended by the deadline (the stream reset by the client, or answered DEADLINE_EXCEEDED).
    gave_up: AtomicUsize,
    /// Of those, while the server could not read.
    gave_up_while_stalled: AtomicUsize,
    answered: AtomicUsize,
    /// Answered RESOURCE_EXHAUSTED by the server.
    refused: AtomicUsize,
    /// Anything else: a broken connection.
    failed: AtomicUsize,
}

/// The client: 64 streams on one connection, each call with a 20 ms deadline (sent as
/// `grpc-timeout` and enforced by the client, which resets the stream when it gives up),
/// against a server that cannot read for 400 ms. That leaves over a thousand streams opened
/// and reset in the server's socket. With the old limit (twice the stream cap, 200) h2 closed
/// the connection with GOAWAY `too_many_resets`, failing every call on it.
#[test]
fn a_client_whose_deadlines_expire_keeps_its_connection() {
    const STREAMS: usize = 64;
    let deadline = Duration::from_millis(20);
    let OneWorkerServer {
        server_rt,
        server,
        url,
        client_rt,
    } = one_worker_server(ServerOptions::default(), store_with_posts());
    let outcomes = Arc::new(Outcomes::default());
    let patient = client_rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(url)
            .expect("url")
            .connect()
            .await
            .expect("connects");
        let mut client = InNetworkPostsServiceClient::new(channel);
        client
            .get_in_network_posts(request(&[1]))
            .await
            .expect("served before the stall");
        let stalled = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        // Keep the server's only worker busy: until it is free no frame is read.
        let (busy_tx, busy_rx) = tokio::sync::oneshot::channel();
        let stalled_flag = Arc::clone(&stalled);
        server_rt.spawn(async move {
            let _ = busy_tx.send(());
            std::thread::sleep(Duration::from_millis(400));
            stalled_flag.store(false, Ordering::Relaxed);
        });
        busy_rx.await.expect("the server's worker is busy");
        let mut patient_client = client.clone();
        let patient = tokio::spawn(async move {
            let mut call = tonic::Request::new(request(&[1]));
            call.set_timeout(Duration::from_secs(30));
            patient_client.get_in_network_posts(call).await
        });
        let hasty: Vec<_> = (0..STREAMS)
            .map(|_| {
                let mut c = client.clone();
                let outcomes = Arc::clone(&outcomes);
                let stalled = Arc::clone(&stalled);
                let stop = Arc::clone(&stop);
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let mut call = tonic::Request::new(request(&[1]));
                        call.set_timeout(deadline);
                        let outcome =
                            tokio::time::timeout(deadline, c.get_in_network_posts(call)).await;
                        // tonic's own deadline (Cancelled "Timeout expired") and ours both
                        // drop the call, which resets its stream.
                        let gave_up = match &outcome {
                            Err(_) => true,
                            Ok(Err(status)) => {
                                matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded)
                            }
                            Ok(Ok(_)) => false,
                        };
                        if gave_up {
                            outcomes.gave_up.fetch_add(1, Ordering::Relaxed);
                            if stalled.load(Ordering::Relaxed) {
                                outcomes
                                    .gave_up_while_stalled
                                    .fetch_add(1, Ordering::Relaxed);
                            }
                            continue;
                        }
                        match outcome {
                            Err(_) => {}
                            Ok(Ok(_)) => {
                                outcomes.answered.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Err(status)) if status.code() == Code::ResourceExhausted => {
                                outcomes.refused.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Err(status)) => {
                                eprintln!("call failed: {status:?}");
                                outcomes.failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        // The stall, then a while of the same load on a free server.
        while stalled.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        for task in hasty {
            task.await.expect("joins");
        }
        patient.await.expect("joins")
    });
    server_rt.block_on(server.shutdown());
    eprintln!("{outcomes:?}");
    // The test only shows something if the client reset more streams during the stall than
    // the old limit allowed.
    assert!(
        outcomes.gave_up_while_stalled.load(Ordering::Relaxed) > 200,
        "too few resets during the stall to matter: {outcomes:?}"
    );
    assert_eq!(
        outcomes.failed.load(Ordering::Relaxed),
        0,
        "calls failed with the connection: {outcomes:?}"
    );
    // The call that waited through it all on the same connection got the server's answer
    // (posts, or the overload controller's RESOURCE_EXHAUSTED), not a broken connection.
    match patient {
        Ok(answer) => assert!(!answer.into_inner().posts.is_empty()),
        Err(status) => assert_eq!(
            status.code(),
            Code::ResourceExhausted,
            "the patient call on the same connection: {status:?}"
        ),
    }
}

/// HEADERS (END_STREAM, END_HEADERS) of `POST /` over http on stream `id`, then RST_STREAM
/// CANCEL of it.
fn open_and_reset(id: u32, out: &mut Vec<u8>) {
    // HPACK static table: :method POST (3), :scheme http (6), :path / (4).
    out.extend_from_slice(&[0, 0, 3, 0x1, 0x5]);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0x83, 0x86, 0x84]);
    out.extend_from_slice(&[0, 0, 4, 0x3, 0]);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&8u32.to_be_bytes());
}

/// Reads HTTP/2 frames until a GOAWAY; its error code and debug data.
async fn read_goaway<R: AsyncRead + Unpin>(stream: &mut R) -> Option<(u32, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        while buf.len() >= 9 {
            let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            if buf[3] == 0x7 && len >= 8 {
                let payload = &buf[9..9 + len];
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                let debug = String::from_utf8_lossy(&payload[8..]).into_owned();
                return Some((code, debug));
            }
            buf.drain(..9 + len);
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A connection that opens and at once resets 50,000 streams (written in one go) gets GOAWAY
/// ENHANCE_YOUR_CALM `too_many_resets`, and the server goes on serving other clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_is_cut_off_with_goaway() {
    const STREAMS: u32 = 50_000;
    let server =
        thunder_testbed::TestServer::start(ServerOptions::default(), store_with_posts(), None)
            .await;
    server.running().readiness().set_ready().await;
    let mut flood = tokio::net::TcpStream::connect(server.running().grpc_addr())
        .await
        .expect("connects");
    let mut frames =
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00".to_vec();
    for i in 0..STREAMS {
        open_and_reset(2 * i + 1, &mut frames);
    }
    let (mut reader, mut writer) = flood.split();
    let write = async {
        // The server may close the connection before it has read everything.
        let _ = writer.write_all(&frames).await;
    };
    let (goaway, ()) = tokio::time::timeout(PATIENCE, async {
        tokio::join!(read_goaway(&mut reader), write)
    })
    .await
    .expect("an answer in time");
    let (code, debug) = goaway.expect("GOAWAY before the connection closed");
    assert_eq!(code, 11, "ENHANCE_YOUR_CALM expected, debug data {debug:?}");
    assert_eq!(debug, "too_many_resets");
    // Other clients are still served.
    let mut client = server.client().await;
    let answer = client
        .get_in_network_posts(request(&[1, 2]))
        .await
        .expect("served");
    assert_eq!(answer.into_inner().posts.len(), 2);
    drop(flood);
    drop(server);
}
