//! Admission control: a global QPS limit and the in-flight gauge.

use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::error::ServiceError;
use crate::serve::metrics::ServeMetrics;

/// Global rate limit of `GetInNetworkPosts` calls (GCRA, burst = one second's quota), as in
/// the reference: not per caller.
#[derive(Debug)]
pub struct Admission {
    limiter: DefaultDirectRateLimiter,
}

impl Admission {
    /// A limiter admitting `qps_limit` calls per second.
    pub fn new(qps_limit: NonZeroU32) -> Self {
        Self {
            limiter: RateLimiter::direct(Quota::per_second(qps_limit)),
        }
    }

    /// Admits one call or refuses it with [`ServiceError::RateLimited`] (counted in
    /// `rejected_requests_total`). The returned guard keeps the call in `in_flight_requests`
    /// until dropped.
    pub fn admit(&self) -> Result<InFlight, ServiceError> {
        if self.limiter.check().is_err() {
            ServeMetrics::global().rejected_requests.inc();
            return Err(ServiceError::RateLimited);
        }
        ServeMetrics::global().in_flight_requests.inc();
        Ok(InFlight(()))
    }
}

/// One admitted call; leaves the in-flight gauge when dropped.
#[derive(Debug)]
pub struct InFlight(());

impl Drop for InFlight {
    fn drop(&mut self) {
        ServeMetrics::global().in_flight_requests.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_once_the_quota_is_spent() {
        let admission = Admission::new(NonZeroU32::new(3).expect("non-zero"));
        let admitted: Vec<_> = (0..3).map(|_| admission.admit()).collect();
        assert!(admitted.iter().all(Result::is_ok));
        assert!(matches!(admission.admit(), Err(ServiceError::RateLimited)));
    }
}
