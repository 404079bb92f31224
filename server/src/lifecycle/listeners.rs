//! Boots the gRPC and admin listeners around a store and stops them gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use thunder_engine::PostStore;
use thunder_proto::in_network_posts_debug_service_server::InNetworkPostsDebugServiceServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::codec::CompressionEncoding;
use tonic::transport::Server;

use crate::admin::routes::{self, AdminAccess};
use crate::admin::status::StatusSampler;
use crate::error::StartupError;
use crate::maintenance;
use crate::serve::admission::Admission;
use crate::serve::arrival::ArrivalLayer;
use crate::serve::following::FollowingSource;
use crate::serve::grpc::{AnswerPosts, DebugService, PostsServer};
use crate::serve::listener::{BoundedListener, ConnKind, ConnLimits};
use crate::serve::overload::{Overload, OverloadConfig};
use crate::serve::service::ThunderService;
use crate::serve::tls::TlsFiles;
use crate::telemetry::readiness::Readiness;

/// Default largest accepted (decoded) request message: 4 MiB, far above the ~200 KB of two
/// full 10000-id lists.
pub const DEFAULT_MAX_DECODING_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Everything [`start`] needs besides the store.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// gRPC listen address (port 0 picks a free port).
    pub grpc_addr: SocketAddr,
    /// Admin HTTP listen address (port 0 picks a free port).
    pub admin_addr: SocketAddr,
    /// Global `GetInNetworkPosts` calls per second; must be > 0.
    pub qps_limit: u32,
    /// Store query budget per call; `None` leaves only the client's `grpc-timeout`.
    pub request_timeout: Option<Duration>,
    /// Largest decoded request message accepted.
    pub max_decoding_message_bytes: usize,
    /// TLS files; `None` serves plaintext h2c.
    pub tls: Option<TlsFiles>,
    /// How long shutdown waits for in-flight calls.
    pub drain_timeout: Duration,
    /// Period of the incremental trim.
    pub trim_interval: Duration,
    /// Period of the `post_store_*` gauge refresh.
    pub stats_interval: Duration,
    /// Overload control of the query path (executors, queue limit, degrade ladder).
    pub overload: OverloadConfig,
    /// Run store queries on the runtime thread that serves the call instead of tokio's
    /// blocking pool (the executor cap bounds them either way).
    pub inline_queries: bool,
    /// Concurrent HTTP/2 streams per gRPC connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 keepalive ping interval and ack timeout on the gRPC port.
    pub http2_keepalive: (Duration, Duration),
    /// Connection bounds of the gRPC port.
    pub grpc_connections: ConnLimits,
    /// Connection bounds of the admin port.
    pub admin_connections: ConnLimits,
    /// Who may send state-changing admin requests (token, extra allowed hosts).
    pub admin_access: AdminAccess,
    /// Streams a client may reset before the server has accepted them, waiting at once on
    /// one connection, before the connection is closed (GOAWAY `too_many_resets`); 0:
    /// [`PENDING_RESET_STREAMS_PER_STREAM`] x `max_concurrent_streams`.
    pub http2_max_pending_reset_streams: usize,
}

/// Exit code of `thunder-server` when the shutdown drain timed out and cut in-flight calls.
pub const EXIT_DRAIN_CUT: i32 = 3;

/// Default concurrent streams per gRPC connection.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;
/// Default pending-reset streams allowed per connection, per stream of the stream cap: a
/// client at the cap whose calls each give up after 20 ms can wait out a 400 ms stall.
pub const PENDING_RESET_STREAMS_PER_STREAM: usize = 20;
/// Default gRPC connection bounds: 1000 connections, half of them from one address at most,
/// 5 s for the HTTP/2 preface and a first request, closed after 120 s without a call.
pub const DEFAULT_GRPC_CONNECTIONS: ConnLimits = ConnLimits {
    max_connections: 1000,
    max_connections_per_peer: 500,
    idle_timeout: Duration::from_secs(120),
    header_timeout: Duration::from_secs(10),
    handshake_timeout: Duration::from_secs(5),
};
/// Default admin connection bounds: 32 connections (no cap per address: the port is meant
/// for local scrapers), 10 s for a request header, closed after 30 s waiting for a request.
pub const DEFAULT_ADMIN_CONNECTIONS: ConnLimits = ConnLimits {
    max_connections: 32,
    max_connections_per_peer: 32,
    idle_timeout: Duration::from_secs(30),
    header_timeout: Duration::from_secs(10),
    handshake_timeout: Duration::from_secs(30),
};

impl Default for ServerOptions {
    /// Loopback, free ports, the reference's limits, plaintext.
    fn default() -> Self {
        Self {
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            qps_limit: 8000,
            request_timeout: None,
            max_decoding_message_bytes: DEFAULT_MAX_DECODING_MESSAGE_BYTES,
            tls: None,
            drain_timeout: Duration::from_secs(10),
            trim_interval: maintenance::TRIM_INTERVAL,
            stats_interval: maintenance::STATS_INTERVAL,
            overload: OverloadConfig::default(),
            inline_queries: true,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            http2_keepalive: (Duration::from_secs(30), Duration::from_secs(10)),
            grpc_connections: DEFAULT_GRPC_CONNECTIONS,
            admin_connections: DEFAULT_ADMIN_CONNECTIONS,
            admin_access: AdminAccess::default(),
            http2_max_pending_reset_streams: 0,
        }
    }
}

/// The pending-reset stream limit `options` ask for (see [`ServerOptions`]).
fn pending_reset_streams(options: &ServerOptions) -> usize {
    if options.http2_max_pending_reset_streams > 0 {
        return options.http2_max_pending_reset_streams;
    }
    usize::try_from(options.max_concurrent_streams)
        .unwrap_or(usize::MAX)
        .saturating_mul(PENDING_RESET_STREAMS_PER_STREAM)
        .max(20)
}

/// A running server. Dropping it without [`RunningServer::shutdown`] leaves the tasks running
/// until the runtime stops.
#[derive(Debug)]
pub struct RunningServer {
    grpc_addr: SocketAddr,
    admin_addr: SocketAddr,
    readiness: Readiness,
    shutdown: watch::Sender<bool>,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    admin: JoinHandle<std::io::Result<()>>,
    background: Vec<JoinHandle<()>>,
    drain_timeout: Duration,
    tls: bool,
}

impl RunningServer {
    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound admin HTTP address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// True when the gRPC port speaks TLS.
    pub fn tls_enabled(&self) -> bool {
        self.tls
    }

    /// The readiness switch (flip it once the store has caught up).
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The lame duck before [`RunningServer::shutdown`]: readiness turns NOT_SERVING at once
    /// (gRPC health, `/readyz`) while calls and new connections are still served, for `delay`
    /// or until `cut_short` resolves (a second signal), so that endpoints and client-side
    /// balancers stop sending before the connections close.
    pub async fn lame_duck(&self, delay: Duration, cut_short: impl Future<Output = ()>) {
        if delay.is_zero() {
            return;
        }
        let reason = format!(
            "shutting down: lame duck for {:.1} s (calls still served)",
            delay.as_secs_f64()
        );
        self.readiness.set_lame_duck(&reason).await;
        tracing::info!(
            delay_secs = delay.as_secs_f64(),
            "lame duck: readiness NOT_SERVING, calls still served"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = cut_short => tracing::info!("lame duck cut short"),
        }
    }

    /// Stops accepting, lets in-flight calls finish for at most the drain timeout, then stops
    /// everything. Returns false if the drain timed out (connections were cut).
    pub async fn shutdown(self) -> bool {
        self.readiness.set_not_ready().await;
        // Receivers may all be gone already; nothing is left to notify then.
        let _ = self.shutdown.send(true);
        let started = tokio::time::Instant::now();
        let mut grpc = self.grpc;
        let drained = match tokio::time::timeout(self.drain_timeout, &mut grpc).await {
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "gRPC server stopped with an error");
                true
            }
            Ok(_) => true,
            Err(_) => {
                tracing::warn!(
                    timeout_secs = self.drain_timeout.as_secs_f64(),
                    "drain timed out; closing connections"
                );
                grpc.abort();
                false
            }
        };
        // The admin port may be busy with a long profile: give it what is left of the budget.
        let mut admin = self.admin;
        let left = self.drain_timeout.saturating_sub(started.elapsed());
        if tokio::time::timeout(left, &mut admin).await.is_err() {
            admin.abort();
        }
        for task in self.background {
            task.abort();
        }
        drained
    }
}

/// Binds both listeners and serves `store`. The server starts NOT_SERVING; call
/// `readiness().set_ready()` once the store has caught up.
pub async fn start(
    options: ServerOptions,
    store: Arc<PostStore>,
    following: Option<Arc<dyn FollowingSource>>,
) -> Result<RunningServer, StartupError> {
    let started = Instant::now();
    let qps_limit = NonZeroU32::new(options.qps_limit)
        .ok_or_else(|| StartupError::Config("--qps-limit must be greater than 0".into()))?;
    let service = Arc::new(
        ThunderService::new(
            Arc::clone(&store),
            Admission::new(qps_limit),
            following,
            options.request_timeout,
        )
        .with_overload(
            Arc::new(Overload::new(options.overload.clone())),
            options.inline_queries,
        ),
    );
    let debug = DebugService::new(Arc::clone(&service));
    serve(options, service, Some(debug), Some(store), started).await
}

/// [`start`] with `handler` answering the calls: the same listeners, HTTP/2 settings, layers,
/// health, reflection and admin port. The trim and stats tasks run over `store` if given.
/// The options' QPS limit, request timeout, overload control and inline queries are the
/// handler's business and not read here. `started` is the instant `init_duration_seconds`
/// counts from.
pub async fn start_with<H: AnswerPosts>(
    options: ServerOptions,
    handler: H,
    store: Option<Arc<PostStore>>,
    started: Instant,
) -> Result<RunningServer, StartupError> {
    serve(options, Arc::new(handler), None, store, started).await
}

/// [`start_with`], with `debug` (the explain service over the same handler) mounted beside
/// it when given.
async fn serve<H: AnswerPosts>(
    options: ServerOptions,
    handler: Arc<H>,
    debug: Option<DebugService>,
    store: Option<Arc<PostStore>>,
    started: Instant,
) -> Result<RunningServer, StartupError> {
    // Registers every metric, so a scrape lists them before the first request.
    super::metrics::register();

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let readiness = Readiness::new(health_reporter, started, store.clone()).await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(thunder_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| StartupError::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| StartupError::Reflection(e.to_string()))?;

    let service = PostsServer::new(handler, options.max_decoding_message_bytes);
    let debug = debug.map(|debug| debug_server(debug, &options));
    let builder = http2_server(&options);
    // TLS is handshaken by the listener (counted and logged failures), not by tonic.
    let tls_acceptor = options
        .tls
        .as_ref()
        .map(crate::serve::tls_accept::acceptor)
        .transpose()?;
    // Stamps each call when its stream is accepted (deadlines and queue wait count from it).
    let mut builder = builder.layer(ArrivalLayer);

    let grpc_listener = bind(options.grpc_addr).await?;
    let grpc_addr = local_addr(&grpc_listener, options.grpc_addr)?;
    let admin_listener = bind(options.admin_addr).await?;
    let admin_addr = local_addr(&admin_listener, options.admin_addr)?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    // serve_with_incoming ignores the builder's TCP options: the listener sets NODELAY.
    let incoming = BoundedListener::new(
        grpc_listener,
        ConnKind::Grpc,
        options.grpc_connections,
        shutdown_rx.clone(),
        "grpc",
    );
    let admin_listener = BoundedListener::new(
        admin_listener,
        ConnKind::Http1,
        options.admin_connections,
        shutdown_rx.clone(),
        "admin",
    );
    let router = builder
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .add_optional_service(debug);
    let grpc = match tls_acceptor {
        Some(acceptor) => tokio::spawn(router.serve_with_incoming_shutdown(
            incoming.into_tls_stream(acceptor),
            stopped(shutdown_rx.clone()),
        )),
        None => tokio::spawn(
            router
                .serve_with_incoming_shutdown(incoming.into_stream(), stopped(shutdown_rx.clone())),
        ),
    };
    let status = Arc::new(StatusSampler::new());
    let admin_router = routes::router(
        readiness.clone(),
        Arc::clone(&status),
        &options.admin_access,
        admin_addr,
    );
    let admin = tokio::spawn(
        axum::serve(admin_listener, admin_router)
            .with_graceful_shutdown(stopped(shutdown_rx.clone()))
            .into_future(),
    );
    let background = spawn_background(status, store, &options, shutdown_rx);
    match &options.tls {
        Some(tls) => {
            tracing::info!(%grpc_addr, cert = %tls.cert.display(), "gRPC server mTLS enabled (client certificates required)")
        }
        None => tracing::info!(%grpc_addr, "gRPC server mTLS disabled (plaintext h2c)"),
    }
    tracing::info!("metrics at http://{admin_addr}/metrics");
    Ok(RunningServer {
        grpc_addr,
        admin_addr,
        readiness,
        shutdown,
        grpc,
        admin,
        background,
        drain_timeout: options.drain_timeout,
        tls: options.tls.is_some(),
    })
}

/// The explain service as mounted: it decodes with prost, and takes the same message size and
/// codecs as the queries.
fn debug_server(
    debug: DebugService,
    options: &ServerOptions,
) -> InNetworkPostsDebugServiceServer<DebugService> {
    InNetworkPostsDebugServiceServer::new(debug)
        .max_decoding_message_size(options.max_decoding_message_bytes)
        .accept_compressed(CompressionEncoding::Zstd)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Gzip)
}

/// The gRPC port's HTTP/2 settings: the stream cap, the pending-reset limit and keepalive.
fn http2_server(options: &ServerOptions) -> Server {
    Server::builder()
        .max_concurrent_streams(options.max_concurrent_streams)
        // Streams the client resets before the server has taken them are counted by h2 while
        // they wait to be accepted; past the limit h2 closes the connection with GOAWAY
        // ENHANCE_YOUR_CALM `too_many_resets` (its guard against "rapid reset" floods). h2
        // reads every frame the socket holds before it accepts a stream, so a client whose
        // own deadlines expire while the server's runtime is busy arrives as a batch of
        // opened-and-reset streams too: a client keeping to the stream cap with deadlines of
        // 20 ms leaves about (stream cap) x (stall / 20 ms) of them. The limit
        // (`pending_reset_streams`) covers a stall of that client of several hundred ms and
        // still cuts off a connection that opens and resets thousands of streams at once.
        .http2_max_pending_accept_reset_streams(Some(pending_reset_streams(options)))
        .http2_keepalive_interval(Some(options.http2_keepalive.0))
        .http2_keepalive_timeout(Some(options.http2_keepalive.1))
}

/// The status page's sampler and, over `store` when given, the trim and the stats refresh,
/// until `shutdown` turns true.
fn spawn_background(
    status: Arc<StatusSampler>,
    store: Option<Arc<PostStore>>,
    options: &ServerOptions,
    shutdown: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut background = vec![tokio::spawn(status.run(shutdown.clone()))];
    if let Some(store) = store {
        background.push(tokio::spawn(maintenance::run_trim(
            Arc::clone(&store),
            options.trim_interval,
            shutdown.clone(),
        )));
        background.push(tokio::spawn(maintenance::run_stats(
            store,
            options.stats_interval,
            shutdown,
        )));
    }
    background
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, StartupError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartupError::Bind { addr, source })
}

fn local_addr(
    listener: &tokio::net::TcpListener,
    addr: SocketAddr,
) -> Result<SocketAddr, StartupError> {
    listener
        .local_addr()
        .map_err(|source| StartupError::Bind { addr, source })
}

/// Resolves once `shutdown` turns true (or its sender is gone).
async fn stopped(mut shutdown: watch::Receiver<bool>) {
    // An error means the sender was dropped: treat it as a stop as well.
    let _ = shutdown.wait_for(|stop| *stop).await;
}
