//! Accepted connections with bounds: a connection cap per port, idle and header timeouts, and
//! closing idle connections at once on shutdown.
//!
//! - **Cap**: beyond [`ConnLimits::max_connections`] open connections on a port, a new one is
//!   accepted and closed at once (counted in `grpc_connections_refused_total{port}`), so the
//!   process keeps file descriptors for the connections it serves and for the other port.
//! - **gRPC** ([`ConnKind::Grpc`]): a connection is idle while no `GetInNetworkPosts` call
//!   runs on it; idle for [`ConnLimits::idle_timeout`], it is closed. On shutdown a connection
//!   that never sent a byte is closed at once, one without calls [`STOP_GRACE`] after its
//!   last call ended (whether or not the peer answers the server's GOAWAY), a busy one once
//!   its calls end (HTTP/2 keepalive pings, configured on the tonic server, detect dead peers
//!   of busy connections).
//! - **Admin HTTP/1** ([`ConnKind::Http1`]): a request header must arrive within
//!   [`ConnLimits::header_timeout`] of its first byte, and a connection waiting for its next
//!   request for [`ConnLimits::idle_timeout`] is closed (a long profile request is not cut:
//!   once its header is complete no timer runs until the response is written).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use prometheus::IntGauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};

use crate::metrics::Metrics;
use crate::write_batch::WriteBatch;

/// On shutdown, a gRPC connection without calls is closed this long after its last call
/// ended (time for that call's answer to be flushed); the server's GOAWAY closes responsive
/// peers sooner, this closes the ones that do not answer it.
pub const STOP_GRACE: Duration = Duration::from_millis(500);

/// Bounds of one port's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// An idle connection is closed after this long.
    pub idle_timeout: Duration,
    /// An HTTP/1 request header must be complete this long after its first byte.
    pub header_timeout: Duration,
}

/// The protocol a port speaks, which decides what "idle" means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnKind {
    /// HTTP/2 gRPC: idle while no call runs.
    Grpc,
    /// HTTP/1 admin: idle while waiting for a request.
    Http1,
}

/// Calls running on one gRPC connection; shared between the connection and its calls.
#[derive(Debug, Default)]
pub struct Activity {
    calls: AtomicUsize,
    /// When the last call ended (or the connection was accepted).
    last_change: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Activity {
    /// Marks one call running until the guard drops.
    pub fn begin(self: &Arc<Self>) -> CallGuard {
        self.calls.fetch_add(1, Ordering::AcqRel);
        CallGuard(Arc::clone(self))
    }

    fn idle_since(&self) -> Option<std::time::Instant> {
        // Acquire pairs with the AcqRel updates in `begin` and `CallGuard::drop`, so a call
        // counted before the check is seen.
        if self.calls.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(
            self.last_change
                .lock()
                .ok()
                .and_then(|t| *t)
                .unwrap_or_else(std::time::Instant::now),
        )
    }
}

/// One running call (see [`Activity::begin`]).
#[derive(Debug)]
pub struct CallGuard(Arc<Activity>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Ok(mut t) = self.0.last_change.lock() {
            *t = Some(std::time::Instant::now());
        }
        self.0.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a request learns about its connection (a tonic request extension).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The connection's running calls.
    pub activity: Arc<Activity>,
    /// The peer.
    pub remote_addr: Option<SocketAddr>,
}

/// A bounded listener (see the module docs).
#[derive(Debug)]
pub struct BoundedListener {
    listener: TcpListener,
    kind: ConnKind,
    limits: ConnLimits,
    slots: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
    open: IntGauge,
    port_label: &'static str,
}

impl BoundedListener {
    /// Wraps `listener`; `port_label` names it in the connection metrics (`grpc`, `admin`).
    pub fn new(
        listener: TcpListener,
        kind: ConnKind,
        limits: ConnLimits,
        shutdown: watch::Receiver<bool>,
        port_label: &'static str,
    ) -> Self {
        Self {
            listener,
            kind,
            open: Metrics::global()
                .connections
                .with_label_values(&[port_label]),
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            shutdown,
            port_label,
        }
    }

    /// The next connection within the cap (connections above it are closed at accept).
    pub async fn accept_bounded(&mut self) -> (Conn, SocketAddr) {
        loop {
            let (stream, addr) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, port = self.port_label, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
                Metrics::global()
                    .connections_refused
                    .with_label_values(&[self.port_label])
                    .inc();
                drop(stream);
                continue;
            };
            // Best effort: a socket that refuses NODELAY still works.
            let _ = stream.set_nodelay(true);
            return (
                Conn::new(
                    stream,
                    addr,
                    self.kind,
                    self.limits,
                    slot,
                    self.shutdown.clone(),
                    self.open.clone(),
                ),
                addr,
            );
        }
    }

    /// The connections as a stream, for tonic's `serve_with_incoming_shutdown`.
    pub fn into_stream(self) -> impl tokio_stream::Stream<Item = io::Result<Conn>> {
        futures_unfold(self)
    }
}

/// `BoundedListener` as a stream of accepted connections.
fn futures_unfold(listener: BoundedListener) -> impl tokio_stream::Stream<Item = io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut listener = listener;
    tokio::spawn(async move {
        loop {
            let mut stop = listener.shutdown.clone();
            tokio::select! {
                (conn, _) = listener.accept_bounded() => {
                    if tx.send(Ok(conn)).await.is_err() {
                        return;
                    }
                }
                () = async move { let _ = stop.wait_for(|s| *s).await; } => return,
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

impl axum::serve::Listener for BoundedListener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        self.accept_bounded().await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An accepted connection under its port's bounds.
pub struct Conn {
    stream: TcpStream,
    info: ConnInfo,
    kind: ConnKind,
    limits: ConnLimits,
    timer: Pin<Box<Sleep>>,
    /// HTTP/1: when the current deadline (idle or header) ends; `None` while a request runs.
    deadline: Option<Instant>,
    /// HTTP/1: the last bytes read, to find the end of a header across reads.
    tail: [u8; 3],
    /// HTTP/1: a request header has started arriving.
    in_header: bool,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    stopping: bool,
    /// Some bytes were read.
    read_any: bool,
    /// gRPC: answers' frames are written with one socket write per HTTP/2 write pass.
    batch: Option<WriteBatch>,
    open: IntGauge,
    _slot: OwnedSemaphorePermit,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("remote_addr", &self.info.remote_addr)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Conn {
    fn new(
        stream: TcpStream,
        addr: SocketAddr,
        kind: ConnKind,
        limits: ConnLimits,
        slot: OwnedSemaphorePermit,
        mut shutdown: watch::Receiver<bool>,
        open: IntGauge,
    ) -> Self {
        open.inc();
        let now = Instant::now();
        // HTTP/1: waiting for the first request counts as idle; its header timer starts at its
        // first byte.
        let first_deadline = now + limits.idle_timeout;
        Self {
            stream,
            info: ConnInfo {
                activity: Arc::new(Activity {
                    calls: AtomicUsize::new(0),
                    last_change: std::sync::Mutex::new(Some(now.into_std())),
                }),
                remote_addr: Some(addr),
            },
            kind,
            limits,
            timer: Box::pin(tokio::time::sleep_until(first_deadline)),
            deadline: Some(first_deadline),
            tail: [0; 3],
            in_header: false,
            shutdown: Box::pin(async move {
                // A dropped sender also means stop.
                let _ = shutdown.wait_for(|s| *s).await;
            }),
            stopping: false,
            read_any: false,
            batch: (kind == ConnKind::Grpc).then(WriteBatch::default),
            open,
            _slot: slot,
        }
    }

    /// When the connection should be closed if nothing changes (None: not now).
    fn close_at(&self) -> Option<Instant> {
        match self.kind {
            ConnKind::Http1 => self.deadline,
            ConnKind::Grpc => {
                if self.stopping && !self.read_any {
                    return Some(Instant::now());
                }
                // Stopping: a short grace after the last call, so its answer is flushed.
                let grace = if self.stopping {
                    STOP_GRACE.min(self.limits.idle_timeout)
                } else {
                    self.limits.idle_timeout
                };
                self.info
                    .activity
                    .idle_since()
                    .map(|since| Instant::from_std(since) + grace)
            }
        }
    }

    /// True when the connection must close now (idle too long, or idle while stopping).
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.stopping && self.shutdown.as_mut().poll(cx).is_ready() {
            self.stopping = true;
        }
        if self.stopping
            && self.kind == ConnKind::Http1
            && !self.in_header
            && self.deadline.is_some()
        {
            return true;
        }
        loop {
            let Some(at) = self.close_at() else {
                return false;
            };
            if Instant::now() >= at {
                return true;
            }
            if self.timer.deadline() != at {
                self.timer.as_mut().reset(at);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
        }
    }

    /// HTTP/1 bookkeeping of bytes read.
    fn on_read(&mut self, bytes: &[u8]) {
        if self.kind != ConnKind::Http1 || bytes.is_empty() || self.deadline.is_none() {
            return;
        }
        if !self.in_header {
            self.in_header = true;
            let header_by = Instant::now() + self.limits.header_timeout;
            self.deadline = Some(self.deadline.map_or(header_by, |d| d.min(header_by)));
        }
        let mut window = Vec::with_capacity(3 + bytes.len().min(64));
        window.extend_from_slice(&self.tail);
        window.extend_from_slice(bytes);
        if window.windows(4).any(|w| w == b"\r\n\r\n") {
            // The header is complete: the request runs without a timer until it is answered.
            self.in_header = false;
            self.deadline = None;
        }
        let keep = window.len().min(3);
        self.tail = [0; 3];
        self.tail[3 - keep..].copy_from_slice(&window[window.len() - keep..]);
    }

    /// HTTP/1 bookkeeping of bytes written: waiting for the next request from now on.
    fn on_write(&mut self) {
        if self.kind == ConnKind::Http1 && !self.in_header {
            self.deadline = Some(Instant::now() + self.limits.idle_timeout);
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.open.dec();
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle or shutting down")
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(batch) = &mut this.batch
            && let Poll::Ready(Err(e)) = batch.poll_drain(Pin::new(&mut this.stream), cx)
        {
            // A full socket (Pending) does not stop reading; its waker is registered.
            return Poll::Ready(Err(e));
        }
        let filled = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.read_any |= buf.filled().len() > filled;
                if this.kind == ConnKind::Http1 {
                    this.on_read(&buf.filled()[filled..]);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if this.poll_expired(cx) {
                    Poll::Ready(Err(timed_out()))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = match &mut this.batch {
            Some(batch) => ready!(batch.poll_write_vectored(
                Pin::new(&mut this.stream),
                cx,
                &[io::IoSlice::new(data)]
            )),
            None => ready!(Pin::new(&mut this.stream).poll_write(cx, data)),
        }?;
        this.on_write();
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match &mut this.batch {
            Some(batch) => batch.poll_flush(Pin::new(&mut this.stream), cx),
            None => Pin::new(&mut this.stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match &mut this.batch {
            Some(batch) => batch.poll_shutdown(Pin::new(&mut this.stream), cx),
            None => Pin::new(&mut this.stream).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = match &mut this.batch {
            Some(batch) => ready!(batch.poll_write_vectored(Pin::new(&mut this.stream), cx, bufs)),
            None => ready!(Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)),
        }?;
        this.on_write();
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.batch.is_some() || self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}
