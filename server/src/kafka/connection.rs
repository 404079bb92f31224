//! Broker connection failures: a TLS handshake refused (unknown CA, a host name the
//! certificate does not name, an expired client certificate), SASL authentication refused, a
//! name that does not resolve, a connection refused or dropped.
//!
//! librdkafka reports each through its log (facility `FAIL`, from its broker threads, so also
//! for clients nobody polls yet, like the metadata client during start-up); it suppresses
//! repeats of the same error for 30 s itself. Each report is counted by reason in
//! `kafka_connection_errors_total{reason}` and the latest is kept for the status page.

use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use super::metrics::KafkaMetrics;
use super::metrics::connection_reasons::{AUTHENTICATION, RESOLVE, TLS, TRANSPORT};

/// The latest connection failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionError {
    /// Its `kafka_connection_errors_total` reason.
    pub reason: &'static str,
    /// librdkafka's message (broker, cause, connection state).
    pub message: String,
    /// When it was reported.
    pub at: SystemTime,
}

static LAST: Mutex<Option<ConnectionError>> = Mutex::new(None);

/// The reason of a librdkafka `FAIL` log line. librdkafka words these messages the same way
/// since 1.x (`SSL handshake failed: ...`, OpenSSL's `SSL routines::...`, `SASL
/// authentication error: ...`, `Failed to resolve ...`; the protocol in the broker's name is
/// lower case, `ssl://`); anything else is a transport failure.
pub fn classify(message: &str) -> &'static str {
    if message.contains("SSL") {
        TLS
    } else if message.contains("SASL") || message.contains("Authentication failed") {
        AUTHENTICATION
    } else if message.contains("Failed to resolve") {
        RESOLVE
    } else {
        TRANSPORT
    }
}

/// Counts a librdkafka `FAIL` log line and keeps it as the latest; returns its reason.
pub(crate) fn record(message: &str) -> &'static str {
    let reason = classify(message);
    KafkaMetrics::global()
        .connection_errors
        .with_label_values(&[reason])
        .inc();
    // librdkafka prefixes its thread (`[thrd:ssl://host:port/bootstrap]: `), which the
    // message repeats.
    let message = message
        .strip_prefix("[thrd:")
        .and_then(|rest| rest.split_once("]: "))
        .map_or(message, |(_, rest)| rest);
    let error = ConnectionError {
        reason,
        message: message.to_owned(),
        at: SystemTime::now(),
    };
    // An `Option` replaced whole: consistent after any panic.
    *LAST.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
    reason
}

/// The latest broker connection failure of this process, if any.
pub fn last_error() -> Option<ConnectionError> {
    LAST.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn librdkafka_failures_are_classified() {
        for (message, reason) in [
            (
                "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL \
                 routines::certificate verify failed: broker certificate could not be verified \
                 (after 4ms in state SSL_HANDSHAKE)",
                TLS,
            ),
            (
                "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: Disconnected: \
                 connecting to a PLAINTEXT broker listener? (after 1ms in state SSL_HANDSHAKE)",
                TLS,
            ),
            (
                "ssl://127.0.0.1:9093/bootstrap: error:0A000086:SSL routines::certificate \
                 verify failed (after 2ms in state SSL_HANDSHAKE)",
                TLS,
            ),
            (
                "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: \
                 Authentication failed (after 12ms in state AUTH_REQ)",
                AUTHENTICATION,
            ),
            (
                "kafka.invalid:9092/bootstrap: Failed to resolve 'kafka.invalid:9092': Name \
                 or service not known (after 2ms in state CONNECT)",
                RESOLVE,
            ),
            (
                "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused \
                 (after 0ms in state CONNECT)",
                TRANSPORT,
            ),
        ] {
            assert_eq!(classify(message), reason, "{message}");
        }
    }
}
