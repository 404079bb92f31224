//! When a call arrived: stamped when the connection accepts its HTTP/2 stream, not when its
//! task first runs.
//!
//! Under load a call's task can wait in the runtime's run queue long before the handler sees
//! it (with one runtime worker, the run queue *is* the queue: every query runs inline on that
//! worker). Deadlines, the overload controller's queue wait and the request duration must
//! count that wait, so the call needs a time taken earlier than its first poll.
//!
//! tonic serves each connection through hyper-util's `TowerToHyperService`, whose `call`
//! clones the connection's service stack *synchronously*, in the connection task, when hyper
//! accepts a stream, and only polls the clone later, in the stream's own task. [`Arrival`] is
//! a layer of that stack whose `Clone` takes the time: the clone made for a stream carries
//! the moment the stream was accepted, and its `call` puts it in the request's extensions as
//! [`Accepted`]. A service that is called without a fresh clone (other hosting, or a tonic
//! that stops cloning per stream) stamps the call when it is called: never earlier than the
//! stream, so a deadline is never shortened by it. `server/tests/serving.rs` checks, with one
//! runtime worker, that the wait in the run queue is seen.
//!
//! The stamp is taken when the request's headers are processed; a body that arrives slowly
//! after them counts as waiting too (as it does for the client's own deadline).

use std::task::{Context, Poll};
use std::time::Instant;

use tonic::codegen::{Service, http};

/// The moment the call's stream was accepted (in the request's extensions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted(pub Instant);

impl Accepted {
    /// The stamp of `extensions`, or now when it has none.
    pub fn of(extensions: &http::Extensions) -> Instant {
        extensions
            .get::<Accepted>()
            .map_or_else(Instant::now, |a| a.0)
    }

    /// The stamp of a decoded tonic request, or now when it has none.
    pub fn of_request<T>(request: &tonic::Request<T>) -> Instant {
        request
            .extensions()
            .get::<Accepted>()
            .map_or_else(Instant::now, |a| a.0)
    }
}

/// The layer that wraps a service in [`Arrival`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ArrivalLayer;

impl<S> tower::Layer<S> for ArrivalLayer {
    type Service = Arrival<S>;

    fn layer(&self, inner: S) -> Arrival<S> {
        Arrival {
            inner,
            stamped: None,
        }
    }
}

/// Stamps each call with the moment its per-stream clone was made (see the module docs).
#[derive(Debug)]
pub struct Arrival<S> {
    inner: S,
    stamped: Option<Instant>,
}

impl<S: Clone> Clone for Arrival<S> {
    /// A copy stamped now: hyper-util clones the stack once per accepted stream.
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            stamped: Some(Instant::now()),
        }
    }
}

impl<S, B> Service<http::Request<B>> for Arrival<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        // One stamp per clone: a service called twice stamps its later calls when called.
        let accepted = self.stamped.take().unwrap_or_else(Instant::now);
        req.extensions_mut().insert(Accepted(accepted));
        // The connection's handshake is over (any service's request counts).
        if let Some(info) = crate::serve::listener::ConnInfo::of(req.extensions()) {
            info.activity.note_request();
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Ready, ready};
    use std::time::Duration;

    use tower::Layer;

    use super::*;

    /// Answers with the request's stamp.
    #[derive(Clone)]
    struct Echo;

    impl Service<http::Request<()>> for Echo {
        type Response = Instant;
        type Error = Infallible;
        type Future = Ready<Result<Instant, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<()>) -> Self::Future {
            ready(Ok(Accepted::of(req.extensions())))
        }
    }

    async fn stamp_of(service: &mut Arrival<Echo>) -> Instant {
        match service.call(http::Request::new(())).await {
            Ok(at) => at,
            Err(never) => match never {},
        }
    }

    #[tokio::test]
    async fn a_clone_carries_the_moment_it_was_made_into_its_first_call() {
        let connection = ArrivalLayer.layer(Echo);
        let before = Instant::now();
        let mut stream = connection.clone();
        let after_clone = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let stamp = stamp_of(&mut stream).await;
        assert!(
            stamp >= before && stamp <= after_clone,
            "stamped at the clone"
        );
        // A second call on the same clone is stamped when called.
        let called = Instant::now();
        assert!(stamp_of(&mut stream).await >= called);
    }

    #[tokio::test]
    async fn a_service_never_cloned_stamps_when_called() {
        let mut service = ArrivalLayer.layer(Echo);
        std::thread::sleep(Duration::from_millis(5));
        let called = Instant::now();
        assert!(stamp_of(&mut service).await >= called);
    }

    #[test]
    fn a_request_without_a_stamp_reads_as_now() {
        let before = Instant::now();
        assert!(Accepted::of(&http::Extensions::new()) >= before);
    }
}
