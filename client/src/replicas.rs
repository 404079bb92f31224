//! The innermost layer: one call to one replica of a shard, chosen by power of two choices over
//! pending requests, skipping replicas that just failed to connect.
//!
//! tonic's `Channel` balances with a load of 0 for every endpoint (its `Connection` reports no
//! load), which amounts to random choice. Here every replica counts its requests in flight; a
//! call picks two distinct replicas at random and takes the one with fewer, so a slow replica,
//! whose requests pile up, gets fewer new ones. A replica whose call fails with UNAVAILABLE (a
//! refused or broken connection, a server shutting down) is left out of the choice for
//! `eject_for`, so retries go elsewhere; when every replica is left out, all are candidates.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use rand::Rng;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_proto::{GetInNetworkPostsRequest, GetInNetworkPostsResponse};
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use crate::ClientError;

/// One try of a request against one shard: the typed request and the caller's deadline.
#[derive(Clone, Debug)]
pub(crate) struct Attempt {
    pub(crate) request: GetInNetworkPostsRequest,
    pub(crate) deadline: Instant,
}

struct Replica {
    client: InNetworkPostsServiceClient<Channel>,
    /// Requests in flight.
    pending: AtomicUsize,
    /// Left out of the choice until this many ms after `Inner::epoch`.
    ejected_until_ms: AtomicU64,
    /// Calls answered (any status), for tests and reports.
    answered: AtomicU64,
}

struct Inner {
    replicas: Vec<Replica>,
    epoch: Instant,
    eject_for: Duration,
}

/// The replicas of one shard, as a `tower::Service` of [`Attempt`]s (cheap to clone).
#[derive(Clone)]
pub(crate) struct ReplicaSet {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ReplicaSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaSet")
            .field("replicas", &self.inner.replicas.len())
            .finish()
    }
}

/// Decrements a replica's in-flight count when the call ends, however it ends.
struct InFlight {
    inner: Arc<Inner>,
    index: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.inner.replicas[self.index]
            .pending
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// The URI of a replica address: `host:port` gets `http://`, a full URI is kept.
fn endpoint(addr: &str, connect_timeout: Duration) -> Result<Endpoint, ClientError> {
    let addr = addr.trim();
    let uri = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let endpoint = Endpoint::from_shared(uri).map_err(|e| ClientError::Address {
        address: addr.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(endpoint
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30)))
}

impl ReplicaSet {
    /// Lazily connecting channels to `addrs` (connections are made on first use and remade
    /// after failures).
    pub(crate) fn new(
        addrs: &[String],
        connect_timeout: Duration,
        eject_for: Duration,
    ) -> Result<Self, ClientError> {
        if addrs.is_empty() {
            return Err(ClientError::NoReplicas);
        }
        let replicas = addrs
            .iter()
            .map(|addr| {
                let channel = endpoint(addr, connect_timeout)?.connect_lazy();
                Ok(Replica {
                    client: InNetworkPostsServiceClient::new(channel)
                        .max_decoding_message_size(64 << 20),
                    pending: AtomicUsize::new(0),
                    ejected_until_ms: AtomicU64::new(0),
                    answered: AtomicU64::new(0),
                })
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        Ok(Self {
            inner: Arc::new(Inner {
                replicas,
                epoch: Instant::now(),
                eject_for,
            }),
        })
    }

    /// Calls answered per replica, in address order.
    pub(crate) fn answered(&self) -> Vec<u64> {
        self.inner
            .replicas
            .iter()
            .map(|r| r.answered.load(Ordering::Relaxed))
            .collect()
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Power of two choices over pending requests among the replicas not ejected.
    fn pick(&self) -> usize {
        let n = self.replicas.len();
        if n == 1 {
            return 0;
        }
        let now = self.now_ms();
        let healthy = |i: &usize| self.replicas[*i].ejected_until_ms.load(Ordering::Relaxed) <= now;
        let mut candidates: Vec<usize> = (0..n).filter(healthy).collect();
        if candidates.is_empty() {
            candidates = (0..n).collect();
        }
        let mut rng = rand::rng();
        match candidates.len() {
            1 => candidates[0],
            len => {
                let a = rng.random_range(0..len);
                let mut b = rng.random_range(0..len - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (candidates[a], candidates[b]);
                let load = |i: usize| self.replicas[i].pending.load(Ordering::Relaxed);
                if load(b) < load(a) { b } else { a }
            }
        }
    }
}

impl tower::Service<Attempt> for ReplicaSet {
    type Response = GetInNetworkPostsResponse;
    type Error = Status;
    type Future =
        Pin<Box<dyn Future<Output = Result<GetInNetworkPostsResponse, Status>> + Send + 'static>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        // tonic channels buffer; a call is always accepted.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, attempt: Attempt) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let remaining = attempt.deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Status::deadline_exceeded("deadline passed before the call"));
            }
            let index = inner.pick();
            let replica = &inner.replicas[index];
            replica.pending.fetch_add(1, Ordering::Relaxed);
            let _in_flight = InFlight {
                inner: Arc::clone(&inner),
                index,
            };
            let mut request = tonic::Request::new(attempt.request);
            // Sent as `grpc-timeout`: the server bounds its query by the caller's budget.
            request.set_timeout(remaining);
            let mut client = replica.client.clone();
            let result = client
                .get_in_network_posts(request)
                .await
                .map(tonic::Response::into_inner);
            replica.answered.fetch_add(1, Ordering::Relaxed);
            if let Err(status) = &result
                && crate::replica_gone(status)
            {
                let until = inner.now_ms() + inner.eject_for.as_millis() as u64;
                replica.ejected_until_ms.store(until, Ordering::Relaxed);
            }
            result
        })
    }
}
