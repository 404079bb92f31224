//! Rate-limited logging: librdkafka's own log and error callbacks, and ingestion's repeated
//! warnings, so a partition that fails the same way every 250 ms cannot flood the log.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::fetch_limits::OversizedResponses;

/// Least time between two log lines of the same kind.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Lets one line per key through every `interval`; counts the ones it held back.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    interval: Duration,
    keys: Mutex<HashMap<String, (Instant, u64)>>,
}

impl LogThrottle {
    /// A throttle that lets one line per key through every `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(suppressed)` when a line of `key` may be logged now (`suppressed` lines were held
    /// back since the last one), `None` when it must be dropped.
    pub(crate) fn admit(&self, key: &str) -> Option<u64> {
        let now = Instant::now();
        // A map of timestamps: consistent after any panic.
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        match keys.get_mut(key) {
            Some((last, suppressed)) if now.duration_since(*last) < self.interval => {
                *suppressed += 1;
                None
            }
            Some((last, suppressed)) => {
                *last = now;
                Some(std::mem::take(suppressed))
            }
            None => {
                // Bounded: keys are librdkafka facilities, error codes and drop reasons.
                if keys.len() >= 1024 {
                    keys.clear();
                }
                keys.insert(key.to_owned(), (now, 0));
                Some(0)
            }
        }
    }
}

/// The librdkafka client context of every consumer: librdkafka's log lines and global errors
/// go to `tracing`, at most one line per facility (or error) every [`LOG_INTERVAL`]. It also
/// notes the fetch responses librdkafka refused as too large (see `fetch_limits.rs`).
#[derive(Debug)]
pub(crate) struct ThrottledContext {
    throttle: LogThrottle,
    /// Responses larger than `receive.message.max.bytes`, as librdkafka logged them.
    pub(crate) oversized_responses: OversizedResponses,
}

impl Default for ThrottledContext {
    fn default() -> Self {
        Self {
            throttle: LogThrottle::new(LOG_INTERVAL),
            oversized_responses: OversizedResponses::default(),
        }
    }
}

impl ClientContext for ThrottledContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        // Before the throttle: a refused response must be noted even when its line is not shown.
        self.oversized_responses.observe_log(log_message);
        // A broker connection failure is counted and kept for the status page, whether or not
        // its line is shown; each reason has its own line budget.
        let key = if fac == "FAIL" {
            let reason = super::connection::record(log_message);
            std::borrow::Cow::Owned(format!("FAIL:{reason}"))
        } else {
            std::borrow::Cow::Borrowed(fac)
        };
        let Some(suppressed) = self.throttle.admit(&key) else {
            return;
        };
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", fac, suppressed, "{log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", fac, suppressed, "{log_message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", fac, suppressed, "{log_message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", fac, suppressed, "{log_message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        let key = format!("error:{code:?}");
        if let Some(suppressed) = self.throttle.admit(&key) {
            if is_routine(code) {
                tracing::debug!(target: "librdkafka", %error, suppressed, "{reason}");
            } else {
                tracing::error!(target: "librdkafka", %error, suppressed, "{reason}");
            }
        }
    }
}

impl ConsumerContext for ThrottledContext {}

/// Events librdkafka passes to the error callback that need no line of their own: the end
/// of a partition (`enable.partition.eof` is on for the catch-up rule, and ingestion handles it
/// on the message stream) is not an error for an operator to act on, and a broker connection
/// failure was already logged (and counted) from librdkafka's `FAIL` log line.
fn is_routine(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::PartitionEOF
                | RDKafkaErrorCode::SSL
                | RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::Resolve
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_partition_is_routine_and_real_errors_are_not() {
        assert!(is_routine(Some(RDKafkaErrorCode::PartitionEOF)));
        assert!(is_routine(Some(RDKafkaErrorCode::SSL)));
        assert!(!is_routine(Some(RDKafkaErrorCode::AllBrokersDown)));
        assert!(!is_routine(None));
    }

    #[test]
    fn one_line_per_key_per_interval() {
        let throttle = LogThrottle::new(Duration::from_millis(200));
        assert_eq!(throttle.admit("a"), Some(0));
        assert_eq!(throttle.admit("a"), None);
        assert_eq!(throttle.admit("a"), None);
        assert_eq!(throttle.admit("b"), Some(0));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(throttle.admit("a"), Some(2));
        assert_eq!(throttle.admit("a"), None);
    }
}
