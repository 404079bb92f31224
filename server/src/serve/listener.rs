//! Accepted connections with bounds: a connection cap per port, idle and header timeouts, and
//! closing idle connections at once on shutdown. With mTLS on, the gRPC port's connections
//! are handshaken by [`BoundedListener::into_tls_stream`] (see [`crate::serve::tls_accept`]).
//!
//! - **Caps**: at most [`ConnLimits::max_connections`] open connections on a port, and at most
//!   [`ConnLimits::max_connections_per_peer`] from one peer address. A new connection beyond a
//!   cap takes the place of an idle one (no call or request running): the one that never sent a
//!   byte, else the least recently active, of the same peer when the peer is at its own cap
//!   (counted in `grpc_connections_evicted_total{port,reason}`). Only when every candidate is
//!   busy is the new one closed at once (`grpc_connections_refused_total{port}`). So sockets
//!   that hold slots without using them cannot lock new clients out, and the process keeps
//!   file descriptors for the connections it serves and for the other port.
//! - **gRPC** ([`ConnKind::Grpc`]): the HTTP/2 preface and a first request must arrive within
//!   [`ConnLimits::handshake_timeout`] of the accept. After that a connection is idle while no
//!   `GetInNetworkPosts` call runs on it; idle for [`ConnLimits::idle_timeout`], it is
//!   closed. On shutdown a connection
//!   that never sent a byte is closed at once, one without calls [`STOP_GRACE`] after its
//!   last call ended (whether or not the peer answers the server's GOAWAY), a busy one once
//!   its calls end (HTTP/2 keepalive pings, configured on the tonic server, detect dead peers
//!   of busy connections).
//! - **Admin HTTP/1** ([`ConnKind::Http1`]): a request header must arrive within
//!   [`ConnLimits::header_timeout`] of its first byte, and a connection waiting for its next
//!   request for [`ConnLimits::idle_timeout`] is closed (a long profile request is not cut:
//!   once its header is complete no timer runs until the response is written).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use prometheus::IntGauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, Sleep};

use crate::serve::metrics::ConnectionMetrics;
use crate::serve::write_batch::WriteBatch;

/// On shutdown, a gRPC connection without calls is closed this long after its last call
/// ended (time for that call's answer to be flushed); the server's GOAWAY closes responsive
/// peers sooner, this closes the ones that do not answer it.
pub const STOP_GRACE: Duration = Duration::from_millis(500);

/// Bounds of one port's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// Open connections from one peer IP address at most.
    pub max_connections_per_peer: usize,
    /// An idle connection is closed after this long.
    pub idle_timeout: Duration,
    /// An HTTP/1 request header must be complete this long after its first byte.
    pub header_timeout: Duration,
    /// gRPC: the HTTP/2 preface and a first request must arrive this long after the accept.
    pub handshake_timeout: Duration,
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
    /// A request (of any service) has arrived: the handshake is over.
    requested: AtomicBool,
}

impl Activity {
    /// Notes that a request arrived on the connection (ends its handshake timer).
    pub fn note_request(&self) {
        self.requested.store(true, Ordering::Relaxed);
    }

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

impl ConnInfo {
    /// The connection of a request's `extensions` (plaintext or TLS).
    pub fn of(extensions: &tonic::codegen::http::Extensions) -> Option<&ConnInfo> {
        extensions.get::<ConnInfo>().or_else(|| {
            extensions
                .get::<tonic::transport::server::TlsConnectInfo<ConnInfo>>()
                .map(tonic::transport::server::TlsConnectInfo::get_ref)
        })
    }
}

/// What a port's registry knows of one open connection (shared with its [`Conn`]).
#[derive(Debug)]
struct Tracked {
    id: u64,
    peer: IpAddr,
    kind: ConnKind,
    activity: Arc<Activity>,
    /// Some bytes were read.
    read_any: AtomicBool,
    /// HTTP/1: a request is running (its header is complete, its answer not yet written).
    http_busy: AtomicBool,
    /// HTTP/1: the last read or write.
    http_last_io: Mutex<std::time::Instant>,
    /// Set when the registry gave the connection's slot to a newer one.
    evicted: AtomicBool,
    /// Wakes the connection to close once evicted.
    wake: Arc<Notify>,
}

impl Tracked {
    /// Since when nothing runs on the connection (None: busy).
    fn idle_since(&self) -> Option<std::time::Instant> {
        match self.kind {
            ConnKind::Grpc => self.activity.idle_since(),
            ConnKind::Http1 => {
                if self.http_busy.load(Ordering::Relaxed) {
                    None
                } else {
                    self.http_last_io.lock().ok().map(|t| *t)
                }
            }
        }
    }

    fn touch(&self) {
        if let Ok(mut t) = self.http_last_io.lock() {
            *t = std::time::Instant::now();
        }
    }
}

/// Why a connection lost its slot to a newer one (the `reason` label of
/// `grpc_connections_evicted_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eviction {
    /// The port was at [`ConnLimits::max_connections`].
    MaxConnections,
    /// The new connection's peer was at [`ConnLimits::max_connections_per_peer`].
    PerPeer,
}

impl Eviction {
    fn label(self) -> &'static str {
        match self {
            Self::MaxConnections => "max_connections",
            Self::PerPeer => "per_peer",
        }
    }
}

/// The open connections of one port: the caps are counted here, not in a semaphore, so a
/// slot can be taken from an idle connection.
#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    conns: HashMap<u64, Arc<Tracked>>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Registry {
    /// Closes the idle connection (of `peer` when given) that never sent a byte, else the one
    /// idle the longest; false when every candidate is busy.
    fn evict(&mut self, peer: Option<IpAddr>) -> bool {
        let victim = self
            .conns
            .values()
            .filter(|t| peer.is_none_or(|p| t.peer == p))
            .filter_map(|t| {
                t.idle_since()
                    .map(|since| ((t.read_any.load(Ordering::Relaxed), since), t.id))
            })
            .min()
            .map(|(_, id)| id);
        let Some(tracked) = victim.and_then(|id| self.remove(id)) else {
            return false;
        };
        tracked.evicted.store(true, Ordering::Relaxed);
        // A stored permit if the connection is not waiting right now: it closes on its next poll.
        tracked.wake.notify_one();
        true
    }

    fn remove(&mut self, id: u64) -> Option<Arc<Tracked>> {
        let tracked = self.conns.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&tracked.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&tracked.peer);
            }
        }
        Some(tracked)
    }

    /// A slot for a connection from `peer`, taken from an idle connection at a cap; None when
    /// the connections it could take from are all busy.
    fn admit(
        &mut self,
        peer: IpAddr,
        kind: ConnKind,
        limits: &ConnLimits,
        port_label: &str,
    ) -> Option<Arc<Tracked>> {
        let from_peer = self.per_peer.get(&peer).copied().unwrap_or(0);
        let mut evicted = None;
        if from_peer >= limits.max_connections_per_peer.max(1) {
            if !self.evict(Some(peer)) {
                return None;
            }
            evicted = Some(Eviction::PerPeer);
        } else if self.conns.len() >= limits.max_connections.max(1) {
            if !self.evict(None) {
                return None;
            }
            evicted = Some(Eviction::MaxConnections);
        }
        if let Some(reason) = evicted {
            ConnectionMetrics::global()
                .connections_evicted
                .with_label_values(&[port_label, reason.label()])
                .inc();
        }
        self.next_id += 1;
        let activity = Arc::new(Activity {
            calls: AtomicUsize::new(0),
            last_change: std::sync::Mutex::new(Some(std::time::Instant::now())),
            requested: AtomicBool::new(false),
        });
        let tracked = Arc::new(Tracked {
            id: self.next_id,
            peer,
            kind,
            activity,
            read_any: AtomicBool::new(false),
            http_busy: AtomicBool::new(false),
            http_last_io: Mutex::new(std::time::Instant::now()),
            evicted: AtomicBool::new(false),
            wake: Arc::new(Notify::new()),
        });
        self.conns.insert(tracked.id, Arc::clone(&tracked));
        *self.per_peer.entry(peer).or_insert(0) += 1;
        Some(tracked)
    }
}

/// A connection's hold on its registry entry; leaves the registry when dropped.
#[derive(Debug)]
struct Slot {
    registry: Arc<Mutex<Registry>>,
    tracked: Arc<Tracked>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(self.tracked.id);
    }
}

/// A bounded listener (see the module docs).
#[derive(Debug)]
pub struct BoundedListener {
    listener: TcpListener,
    kind: ConnKind,
    limits: ConnLimits,
    registry: Arc<Mutex<Registry>>,
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
            open: ConnectionMetrics::global()
                .connections
                .with_label_values(&[port_label]),
            registry: Arc::new(Mutex::new(Registry::default())),
            limits,
            shutdown,
            port_label,
        }
    }

    /// The next connection within the caps (one that finds only busy connections to take a
    /// slot from is closed at accept).
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
            // The registry's updates cannot panic half-way: a poisoned lock still holds a
            // consistent registry.
            let admitted = self
                .registry
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .admit(addr.ip(), self.kind, &self.limits, self.port_label);
            let Some(tracked) = admitted else {
                ConnectionMetrics::global()
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
                    Slot {
                        registry: Arc::clone(&self.registry),
                        tracked,
                    },
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

    /// The connections whose TLS handshake with `acceptor` succeeded, as a stream for tonic.
    /// Each handshake runs in a task of its own within the handshake timeout; a failed one is
    /// counted and logged ([`crate::serve::tls_accept`]) and its connection closed.
    pub fn into_tls_stream(
        self,
        acceptor: tokio_rustls::TlsAcceptor,
    ) -> impl tokio_stream::Stream<Item = io::Result<tokio_rustls::server::TlsStream<Conn>>> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let timeout = self.limits.handshake_timeout;
        let mut plain = Box::pin(futures_unfold(self));
        tokio::spawn(async move {
            while let Some(Ok(conn)) = tokio_stream::StreamExt::next(&mut plain).await {
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                let peer = conn
                    .info
                    .remote_addr
                    .unwrap_or_else(|| ([0, 0, 0, 0], 0).into());
                tokio::spawn(async move {
                    if let Some(stream) =
                        crate::serve::tls_accept::handshake(&acceptor, conn, peer, timeout).await
                    {
                        // The server stopped accepting: the connection just closes.
                        let _ = tx.send(Ok(stream)).await;
                    }
                });
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
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
    /// gRPC: when the handshake timer ends.
    handshake_by: Instant,
    /// Resolves once the registry gave this connection's slot to a newer one.
    evict: Pin<Box<OwnedNotified>>,
    /// gRPC: answers' frames are written with one socket write per HTTP/2 write pass.
    batch: Option<WriteBatch>,
    open: IntGauge,
    slot: Slot,
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
        slot: Slot,
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
                activity: Arc::clone(&slot.tracked.activity),
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
            handshake_by: now + limits.handshake_timeout,
            evict: Box::pin(Arc::clone(&slot.tracked.wake).notified_owned()),
            batch: (kind == ConnKind::Grpc).then(WriteBatch::default),
            open,
            slot,
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
                let idle_until = self
                    .info
                    .activity
                    .idle_since()
                    .map(|since| Instant::from_std(since) + grace);
                if self.info.activity.requested.load(Ordering::Relaxed) {
                    idle_until
                } else {
                    // No request yet: the handshake timer (an HTTP/2 preface alone, or half
                    // a header, does not hold the connection open).
                    Some(idle_until.map_or(self.handshake_by, |at| at.min(self.handshake_by)))
                }
            }
        }
    }

    /// True when the connection must close now (idle too long, idle while stopping, or its
    /// slot given to a newer connection).
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.slot.tracked.evicted.load(Ordering::Relaxed)
            || self.evict.as_mut().poll(cx).is_ready()
        {
            return true;
        }
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
            self.slot.tracked.http_busy.store(true, Ordering::Relaxed);
        }
        let keep = window.len().min(3);
        self.tail = [0; 3];
        self.tail[3 - keep..].copy_from_slice(&window[window.len() - keep..]);
    }

    /// HTTP/1 bookkeeping of bytes written: waiting for the next request from now on.
    fn on_write(&mut self) {
        if self.kind == ConnKind::Http1 && !self.in_header {
            self.deadline = Some(Instant::now() + self.limits.idle_timeout);
            self.slot.tracked.http_busy.store(false, Ordering::Relaxed);
            self.slot.tracked.touch();
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
                if buf.filled().len() > filled && !this.read_any {
                    this.read_any = true;
                    this.slot.tracked.read_any.store(true, Ordering::Relaxed);
                }
                if this.kind == ConnKind::Http1 {
                    this.slot.tracked.touch();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, max_connections_per_peer: usize) -> ConnLimits {
        ConnLimits {
            max_connections,
            max_connections_per_peer,
            idle_timeout: Duration::from_secs(60),
            header_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(60),
        }
    }

    fn admit(registry: &mut Registry, peer: [u8; 4], limits: &ConnLimits) -> Option<Arc<Tracked>> {
        registry.admit(IpAddr::from(peer), ConnKind::Grpc, limits, "test")
    }

    #[test]
    fn the_silent_then_the_least_recently_active_idle_connection_makes_way_never_a_busy_one() {
        let limits = limits(3, 3);
        let mut registry = Registry::default();
        let spoke_early = admit(&mut registry, [10, 0, 0, 1], &limits).expect("admitted");
        spoke_early.read_any.store(true, Ordering::Relaxed);
        let busy = admit(&mut registry, [10, 0, 0, 1], &limits).expect("admitted");
        busy.read_any.store(true, Ordering::Relaxed);
        let _call = busy.activity.begin();
        std::thread::sleep(Duration::from_millis(2));
        let silent = admit(&mut registry, [10, 0, 0, 2], &limits).expect("admitted");

        // The silent one goes first although it is the newest.
        let fourth = admit(&mut registry, [10, 0, 0, 3], &limits).expect("admitted");
        assert!(silent.evicted.load(Ordering::Relaxed));
        assert!(!spoke_early.evicted.load(Ordering::Relaxed));
        fourth.read_any.store(true, Ordering::Relaxed);
        // Then the least recently active idle one; the busy one stays.
        admit(&mut registry, [10, 0, 0, 3], &limits).expect("admitted");
        assert!(spoke_early.evicted.load(Ordering::Relaxed));
        assert!(!busy.evicted.load(Ordering::Relaxed));
        assert_eq!(registry.conns.len(), 3);
    }

    #[test]
    fn at_its_cap_a_peer_takes_only_its_own_slots_and_is_refused_when_they_are_busy() {
        let limits = limits(10, 2);
        let mut registry = Registry::default();
        let other = admit(&mut registry, [10, 0, 0, 9], &limits).expect("admitted");
        let first = admit(&mut registry, [10, 0, 0, 1], &limits).expect("admitted");
        let second = admit(&mut registry, [10, 0, 0, 1], &limits).expect("admitted");
        let third = admit(&mut registry, [10, 0, 0, 1], &limits).expect("admitted");
        assert!(first.evicted.load(Ordering::Relaxed));
        assert!(!other.evicted.load(Ordering::Relaxed));
        let _busy = [second.activity.begin(), third.activity.begin()];
        assert!(admit(&mut registry, [10, 0, 0, 1], &limits).is_none());
        assert!(admit(&mut registry, [10, 0, 0, 2], &limits).is_some());
        assert_eq!(
            registry.per_peer.get(&IpAddr::from([10, 0, 0, 1])),
            Some(&2)
        );
    }
}
