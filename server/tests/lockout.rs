//! Connections that hold slots without using them cannot lock new clients out: a handshake
//! timer closes gRPC connections without a first request, a new connection at a cap takes the
//! slot of an idle one (never-spoke first, then least recently active), and one peer address
//! cannot take every slot. The server runs in the test process, on 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::serve::listener::ConnLimits;
use thunder_server::serve::metrics::ConnectionMetrics;
use thunder_server::{FollowingSource, ServerOptions};
use thunder_testbed::in_process::SlowFollowing;
use thunder_testbed::{PATIENCE, TestServer, original, request, store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The client connection preface of HTTP/2 and an empty SETTINGS frame.
const PREFACE_AND_SETTINGS: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
/// The start of a HEADERS frame on stream 1 that announces 20 bytes and sends 2 of them.
const HALF_A_HEADER: &[u8] = b"\x00\x00\x14\x01\x04\x00\x00\x00\x01\x83\x86";

/// Raises the soft limit on open files to at least `need` (up to the hard limit).
fn ensure_fd_limit(need: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the duration of the call.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(got, 0, "getrlimit");
    if limit.rlim_cur >= need {
        return;
    }
    assert!(
        limit.rlim_max >= need,
        "this test needs {need} open files; the hard limit is {}",
        limit.rlim_max
    );
    limit.rlim_cur = need;
    // SAFETY: `limit` is a valid rlimit with rlim_cur <= rlim_max.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(set, 0, "setrlimit");
}

/// A TCP connection to `to` from the loopback address `from`.
async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(IpAddr::V4(from), 0))
        .expect("bind");
    socket.connect(to).await.expect("connects")
}

/// True when the peer closes `stream` within `wait` (bytes it sends are read and ignored).
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// The connection metrics these tests read are the process's: under plain `cargo test` the
/// tests of this file share one process, so they run one at a time and count from where the
/// one before left the counters.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The connection counters when a test began, held with its turn.
struct Counters {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    evicted: [(&'static str, &'static str, u64); 3],
    refused: u64,
}

impl Counters {
    /// Waits for this test's turn, then notes the counters.
    async fn at_start() -> Self {
        let turn = ONE_AT_A_TIME.lock().await;
        let evicted = [
            ("grpc", "max_connections"),
            ("grpc", "per_peer"),
            ("admin", "per_peer"),
        ]
        .map(|(port, reason)| (port, reason, evicted_on(port, reason)));
        Self {
            _turn: turn,
            evicted,
            refused: refused_total(),
        }
    }

    /// Connections of `port` evicted for `reason` since the test began.
    fn evicted(&self, port: &str, reason: &str) -> u64 {
        let (_, _, start) = self
            .evicted
            .iter()
            .find(|(p, r, _)| *p == port && *r == reason)
            .expect("a counter noted at the start");
        evicted_on(port, reason) - start
    }

    /// gRPC connections refused since the test began.
    fn refused(&self) -> u64 {
        refused_total() - self.refused
    }
}

fn gauge(name: &str) -> i64 {
    ConnectionMetrics::global()
        .connections
        .with_label_values(&[name])
        .get()
}

fn evicted_on(port: &str, reason: &str) -> u64 {
    ConnectionMetrics::global()
        .connections_evicted
        .with_label_values(&[port, reason])
        .get()
}

fn refused_total() -> u64 {
    ConnectionMetrics::global()
        .connections_refused
        .with_label_values(&["grpc"])
        .get()
}

fn store_with_posts() -> Arc<thunder_engine::PostStore> {
    let store = store();
    store.insert_posts(&[original(1, 1, 10), original(2, 2, 20)]);
    store
}

/// A gRPC client on its own connection, from the loopback address `from`.
async fn client_from(
    from: Ipv4Addr,
    server: &TestServer,
) -> InNetworkPostsServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(server.grpc_url())
        .expect("url")
        .local_address(Some(IpAddr::V4(from)))
        .connect_timeout(PATIENCE)
        .timeout(PATIENCE)
        .connect()
        .await
        .expect("connects");
    InNetworkPostsServiceClient::new(channel)
}

fn limits(max_connections: usize, per_peer: usize, handshake: Duration) -> ConnLimits {
    ConnLimits {
        max_connections,
        max_connections_per_peer: per_peer,
        handshake_timeout: handshake,
        ..ServerOptions::default().grpc_connections
    }
}

/// The attack of the issue: 1500 sockets that never send a byte and a client that sends the
/// HTTP/2 preface and half a header, against a cap of 200. Before, every new client was
/// refused until the idle timer (120 s) freed slots; now each new connection takes the slot of
/// a silent one and the new clients are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_and_a_slow_header_client_do_not_lock_new_clients_out() {
    let counters = Counters::at_start().await;
    const CAP: usize = 200;
    const SILENT: usize = 1500;
    const NEW_CLIENTS: usize = 20;
    // Both ends run in this process: the silent sockets, the server's side of at most CAP
    // connections (plus ones being closed), the clients.
    ensure_fd_limit(2 * SILENT as u64 + 1024);
    let options = ServerOptions {
        // The handshake timer is long here: the slots are freed by eviction alone.
        grpc_connections: limits(CAP, 10 * CAP, Duration::from_secs(600)),
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store_with_posts(), None).await;
    server.running().readiness().set_ready().await;
    let addr = server.running().grpc_addr();

    let mut slow_header = TcpStream::connect(addr).await.expect("connects");
    slow_header
        .write_all(PREFACE_AND_SETTINGS)
        .await
        .expect("preface");
    slow_header.write_all(HALF_A_HEADER).await.expect("half");
    let mut silent = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        silent.push(TcpStream::connect(addr).await.expect("connects"));
    }
    // The server has taken them all (each beyond the cap in the place of an older one).
    assert!(
        thunder_testbed::eventually(|| async {
            counters.evicted("grpc", "max_connections") >= (SILENT + 1 - CAP) as u64
        })
        .await,
        "evicted {} of {SILENT} silent sockets",
        counters.evicted("grpc", "max_connections")
    );
    assert!(
        thunder_testbed::eventually(|| async { gauge("grpc") <= CAP as i64 }).await,
        "open: {}",
        gauge("grpc")
    );

    // New clients, each on its own connection, are answered; none is refused.
    let started = tokio::time::Instant::now();
    for i in 0..NEW_CLIENTS {
        let mut client = client_from(Ipv4Addr::LOCALHOST, &server).await;
        let answer = client
            .get_in_network_posts(request(&[1, 2]))
            .await
            .unwrap_or_else(|e| panic!("new client {i} not answered: {e:?}"));
        assert_eq!(answer.into_inner().posts.len(), 2);
    }
    eprintln!(
        "{NEW_CLIENTS} new clients answered in {:?} behind {SILENT} silent sockets",
        started.elapsed()
    );
    assert_eq!(counters.refused(), 0);
    drop(slow_header);
    drop(server);
}

/// At the cap a new connection takes the slot of the least recently active idle one; here a
/// client that sent the HTTP/2 preface and half a header (and so is not "silent"), while the
/// connections whose calls ended later keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_the_least_recently_active_idle_connection_makes_way() {
    let counters = Counters::at_start().await;
    let options = ServerOptions {
        grpc_connections: limits(3, 30, Duration::from_secs(600)),
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store_with_posts(), None).await;
    server.running().readiness().set_ready().await;
    let addr = server.running().grpc_addr();
    let mut slow_header = TcpStream::connect(addr).await.expect("connects");
    slow_header
        .write_all(PREFACE_AND_SETTINGS)
        .await
        .expect("preface");
    slow_header.write_all(HALF_A_HEADER).await.expect("half");
    let mut first = client_from(Ipv4Addr::LOCALHOST, &server).await;
    let mut second = client_from(Ipv4Addr::LOCALHOST, &server).await;
    for client in [&mut first, &mut second] {
        client
            .get_in_network_posts(request(&[1]))
            .await
            .expect("served");
    }
    assert!(!closed_within(&mut slow_header, Duration::from_millis(200)).await);
    let mut third = client_from(Ipv4Addr::LOCALHOST, &server).await;
    third
        .get_in_network_posts(request(&[1]))
        .await
        .expect("the fourth connection is served");
    assert!(
        closed_within(&mut slow_header, PATIENCE).await,
        "the slow-header client kept its slot"
    );
    assert_eq!(counters.evicted("grpc", "max_connections"), 1);
    assert_eq!(counters.refused(), 0);
    // The two earlier clients still have their connections.
    for client in [&mut first, &mut second] {
        client
            .get_in_network_posts(request(&[1]))
            .await
            .expect("served again");
    }
    assert!(thunder_testbed::eventually(|| async { gauge("grpc") == 3 }).await);
    assert_eq!(counters.evicted("grpc", "max_connections"), 1);
    drop(server);
}

/// A gRPC connection must bring the HTTP/2 preface and a first request within the handshake
/// timeout; one that did stays under the idle timer. Before, a silent socket held its slot for
/// the idle timeout (120 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_timeout_closes_connections_without_a_first_request() {
    let _turn = Counters::at_start().await;
    let handshake = Duration::from_millis(500);
    let options = ServerOptions {
        grpc_connections: ConnLimits {
            idle_timeout: Duration::from_secs(600),
            ..limits(100, 100, handshake)
        },
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store_with_posts(), None).await;
    server.running().readiness().set_ready().await;
    let addr = server.running().grpc_addr();

    let mut silent = TcpStream::connect(addr).await.expect("connects");
    let mut preface_only = TcpStream::connect(addr).await.expect("connects");
    preface_only
        .write_all(PREFACE_AND_SETTINGS)
        .await
        .expect("preface");
    let mut slow_header = TcpStream::connect(addr).await.expect("connects");
    slow_header
        .write_all(PREFACE_AND_SETTINGS)
        .await
        .expect("preface");
    slow_header.write_all(HALF_A_HEADER).await.expect("half");
    // Generous bound for a busy machine, far below the 600 s idle timer.
    let wait = Duration::from_secs(30);
    assert!(closed_within(&mut silent, wait).await, "silent socket kept");
    assert!(
        closed_within(&mut preface_only, wait).await,
        "preface without a request kept"
    );
    assert!(
        closed_within(&mut slow_header, wait).await,
        "half a header kept"
    );
    assert!(thunder_testbed::eventually(|| async { gauge("grpc") == 0 }).await);

    // A client that made its first request keeps its connection past the handshake timeout.
    let mut client = client_from(Ipv4Addr::LOCALHOST, &server).await;
    client
        .get_in_network_posts(request(&[1]))
        .await
        .expect("served");
    tokio::time::sleep(handshake * 4).await;
    assert_eq!(
        gauge("grpc"),
        1,
        "the connection after a request was closed"
    );
    client
        .get_in_network_posts(request(&[1]))
        .await
        .expect("served again");
    assert_eq!(gauge("grpc"), 1, "the second call needed a new connection");
    drop(server);
}

/// One address holds at most `max_connections_per_peer` connections: at its cap a new
/// connection of that address takes the slot of one of the same address's idle ones (other
/// addresses' connections are not touched), and is refused when all of that address's
/// connections are busy, while another address is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_slot() {
    let counters = Counters::at_start().await;
    const PER_PEER: usize = 4;
    let a = Ipv4Addr::new(127, 0, 0, 1);
    let b = Ipv4Addr::new(127, 0, 0, 2);
    let options = ServerOptions {
        grpc_connections: limits(100, PER_PEER, Duration::from_secs(600)),
        ..ServerOptions::default()
    };
    let slow: Arc<dyn FollowingSource> = Arc::new(SlowFollowing {
        delay: Duration::from_secs(5),
    });
    let server = TestServer::start(options, store_with_posts(), Some(slow)).await;
    server.running().readiness().set_ready().await;
    let addr = server.running().grpc_addr();

    let mut from_b = Vec::new();
    for _ in 0..3 {
        from_b.push(connect_from(b, addr).await);
    }
    let mut from_a = Vec::new();
    for _ in 0..10 {
        from_a.push(connect_from(a, addr).await);
    }
    // A's six oldest lost their slots to A's newer ones; B's three are untouched.
    assert!(
        thunder_testbed::eventually(|| async { counters.evicted("grpc", "per_peer") == 6 }).await,
        "per-peer evictions: {}",
        counters.evicted("grpc", "per_peer")
    );
    for (i, stream) in from_a.iter_mut().enumerate() {
        let closed = closed_within(stream, Duration::from_millis(200)).await;
        assert_eq!(closed, i < 6, "connection {i} of address A");
    }
    for stream in &mut from_b {
        assert!(!closed_within(stream, Duration::from_millis(200)).await);
    }
    assert_eq!(counters.evicted("grpc", "max_connections"), 0);

    // A's four slots all busy (each a call waiting 5 s on the follow graph): a fifth
    // connection of A is refused, B is served.
    let mut busy = Vec::new();
    for _ in 0..PER_PEER {
        let mut client = client_from(a, &server).await;
        busy.push(tokio::spawn(async move {
            client.get_in_network_posts(request(&[])).await
        }));
    }
    assert!(
        thunder_testbed::eventually(|| async { counters.evicted("grpc", "per_peer") == 10 }).await,
        "A's silent sockets make way for its clients: {}",
        counters.evicted("grpc", "per_peer")
    );
    // Give the four calls time to start (they hold their connections busy for 5 s).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused_before = counters.refused();
    let mut fifth = connect_from(a, addr).await;
    assert!(
        closed_within(&mut fifth, Duration::from_secs(4)).await,
        "a fifth connection of A was kept"
    );
    assert_eq!(counters.refused(), refused_before + 1);
    let mut client_b = client_from(b, &server).await;
    let answer = client_b
        .get_in_network_posts(request(&[1, 2]))
        .await
        .expect("address B is served");
    assert_eq!(answer.into_inner().posts.len(), 2);
    for call in busy {
        call.await
            .expect("joins")
            .expect("A's busy calls are answered");
    }
    drop(server);
}

/// The admin port does the same: clients stalled half-way through a request header do not
/// keep a scraper out at the cap (before, the scraper's connection was closed at accept until
/// the header timer freed a slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_header_clients_do_not_lock_the_admin_port() {
    let counters = Counters::at_start().await;
    let options = ServerOptions {
        admin_connections: ConnLimits {
            max_connections: 2,
            max_connections_per_peer: 2,
            header_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(600),
            ..ServerOptions::default().admin_connections
        },
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store_with_posts(), None).await;
    let admin = server.running().admin_addr();
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(admin).await.expect("connects");
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("half a header");
        stalled.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let response = server.admin_get("/healthz").await;
    assert_eq!(response.status, 200);
    assert_eq!(counters.evicted("admin", "per_peer"), 1);
    // A stalled client made way (the older one, unless the server read the two header halves
    // in the other order, as it may on a loaded machine): one of the two is closed.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut closed = false;
    while !closed && tokio::time::Instant::now() < deadline {
        for stream in &mut stalled {
            closed |= closed_within(stream, Duration::from_millis(50)).await;
        }
    }
    assert!(closed, "neither stalled client was closed");
    drop(server);
}
