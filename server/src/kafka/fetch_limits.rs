//! How much one fetch may bring: the consumer's librdkafka fetch limits, kept consistent with
//! each other, and the recovery from a broker that answers with more than the consumer accepts.
//!
//! What a consumer holds matters more than the bytes on the wire: librdkafka turns every fetched
//! record into a 304-byte operation (a 320-byte allocation) that keeps the response buffer
//! alive until the record is polled, so a 50-byte record costs about seven times its size until
//! it is applied. The defaults keep that small: a fetch asks for at most 1 MiB
//! (`fetch.max.bytes`), and a consumer fetches again only once fewer than 10000 records or 2 MB
//! of payload wait in its queue (`queued.min.messages`, `queued.max.messages.kbytes`;
//! librdkafka's own defaults, 100000 records and 64 MiB, let four consumers hold over 500 MiB),
//! looking again every 10 ms (`fetch.queue.backoff.ms`) rather than every second.
//!
//! librdkafka reads a response's 4-byte size first and drops the connection when it exceeds
//! `receive.message.max.bytes` ("Invalid response size N (0..M): increase
//! receive.message.max.bytes"), then reports `Local: Bad message format` to the consumer, the
//! code of a corrupt batch, and fetches the same offsets again. A broker that honours the
//! request's limits never answers with more than `fetch.max.bytes` plus one record batch, but
//! some Kafka-protocol brokers ignore them and answer with everything from the requested
//! offset on (the local test broker does: 113 MB for two partitions of a 10M-event topic).
//! The ingest thread then reconnects its consumer with a limit that fits the response, up to
//! `--kafka-max-response-bytes` (see `ingest.rs`), and partitions still catching up are read
//! a few at a time from then on (`window.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use rdkafka::ClientConfig;

/// Default `max.partition.fetch.bytes`: Kafka's and librdkafka's own default (1 MiB).
pub(crate) const PARTITION_FETCH_BYTES: u64 = 1 << 20;
/// Default `fetch.max.bytes` (1 MiB): the records of one answer, shared by the consumer's
/// partitions. A consumer drains 1 MiB of records in a few milliseconds, far longer than a
/// fetch takes within a data centre, so a larger answer buys no speed, only memory.
pub(crate) const FETCH_MAX_BYTES: u64 = 1 << 20;
/// Room in `receive.message.max.bytes` above `fetch.max.bytes` (1 MiB + 64 KiB): a broker
/// returns the first record batch even when it alone exceeds `fetch.max.bytes` (up to the
/// topic's `max.message.bytes`, 1 MiB + 12 bytes by default), plus the protocol framing
/// (librdkafka needs 512). A topic with larger batches is recovered from like a broker that
/// ignores the limits.
pub(crate) const RESPONSE_ROOM_BYTES: u64 = (1 << 20) + (64 << 10);
/// Default `queued.min.messages`: a consumer fetches again once fewer records than this wait
/// in its queue (librdkafka: 100000).
pub(crate) const QUEUED_MIN_MESSAGES: u64 = 10_000;
/// Default `queued.max.messages.kbytes`: nor while this many kilobytes of payload wait
/// (librdkafka: 65536).
pub(crate) const QUEUED_MAX_KBYTES: u64 = 2_048;
/// Default `fetch.queue.backoff.ms`: how long a consumer whose queue was over those limits
/// waits before it looks again. librdkafka's 1000 ms fits its own large queues; with these a
/// consumer drains its queue in milliseconds and then sat idle for the rest of the second.
pub(crate) const FETCH_QUEUE_BACKOFF_MS: u64 = 10;
/// Default `--kafka-max-response-bytes` (1 GiB).
pub(crate) const MAX_RESPONSE_BYTES: u64 = 1 << 30;
/// librdkafka's largest `receive.message.max.bytes`.
pub(crate) const LIBRDKAFKA_MAX_RESPONSE_BYTES: u64 = i32::MAX as u64;

/// The value of `key` among the `-X` properties (the last one wins, as when applied).
fn property<'a>(properties: &'a [(String, String)], key: &str) -> Option<&'a str> {
    properties
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Sets `max.partition.fetch.bytes`, `fetch.max.bytes`, `receive.message.max.bytes`,
/// `queued.min.messages`, `queued.max.messages.kbytes` and `fetch.queue.backoff.ms` on a
/// consumer `config`, each unless
/// the `-X` `properties` set it, consistent with each other and with what the operator did set:
/// `fetch.max.bytes` at least the consumer's `message.max.bytes`, `receive.message.max.bytes`
/// [`RESPONSE_ROOM_BYTES`] above `fetch.max.bytes`. A value that does not parse is left to
/// librdkafka to reject.
pub(crate) fn set_consumer_defaults(config: &mut ClientConfig, properties: &[(String, String)]) {
    let number = |key| property(properties, key).map(|v| v.trim().parse::<u64>());
    for (key, value) in [
        ("queued.min.messages", QUEUED_MIN_MESSAGES),
        ("queued.max.messages.kbytes", QUEUED_MAX_KBYTES),
        ("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS),
    ] {
        if property(properties, key).is_none() {
            config.set(key, value.to_string());
        }
    }
    if number("max.partition.fetch.bytes").is_none() && number("fetch.message.max.bytes").is_none()
    {
        config.set(
            "max.partition.fetch.bytes",
            PARTITION_FETCH_BYTES.to_string(),
        );
    }
    let fetch = match number("fetch.max.bytes") {
        Some(Ok(bytes)) => bytes,
        Some(Err(_)) => return,
        None => {
            let message = match number("message.max.bytes") {
                Some(Ok(bytes)) => bytes,
                _ => 0,
            };
            let fetch = FETCH_MAX_BYTES.max(message);
            config.set("fetch.max.bytes", fetch.to_string());
            fetch
        }
    };
    if number("receive.message.max.bytes").is_none() {
        let receive = fetch
            .saturating_add(RESPONSE_ROOM_BYTES)
            .min(LIBRDKAFKA_MAX_RESPONSE_BYTES);
        config.set("receive.message.max.bytes", receive.to_string());
    }
}

/// The `receive.message.max.bytes` of a consumer `config` (librdkafka's default when unset).
pub(crate) fn receive_max_bytes(config: &ClientConfig) -> u64 {
    config
        .get("receive.message.max.bytes")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(100_000_000)
}

/// The size of the response a librdkafka log line reports as too large for
/// `receive.message.max.bytes`, if it is such a line.
pub(crate) fn oversized_response_bytes(log_message: &str) -> Option<u64> {
    const MARK: &str = "Invalid response size ";
    if !log_message.contains("receive.message.max.bytes") {
        return None;
    }
    let rest = &log_message[log_message.find(MARK)? + MARK.len()..];
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .map_or(rest, |end| &rest[..end]);
    digits.parse().ok()
}

/// The `receive.message.max.bytes` to reconnect with after a response of `response_bytes`
/// exceeded `current`: a quarter above the response (the next answer may carry what arrived
/// meanwhile) and at least twice `current`, capped at `ceiling`. `None` when the response
/// itself is larger than `ceiling`.
pub(crate) fn raised_receive_max_bytes(
    current: u64,
    response_bytes: u64,
    ceiling: u64,
) -> Option<u64> {
    let ceiling = ceiling.min(LIBRDKAFKA_MAX_RESPONSE_BYTES);
    if response_bytes > ceiling {
        return None;
    }
    let wanted = response_bytes
        .saturating_add(response_bytes / 4)
        .max(current.saturating_mul(2));
    Some(wanted.min(ceiling))
}

/// The largest oversized response one consumer's librdkafka reported since it was last taken;
/// written from librdkafka's log callback (a broker thread), taken by the ingest thread.
#[derive(Debug, Default)]
pub(crate) struct OversizedResponses {
    largest_bytes: AtomicU64,
}

impl OversizedResponses {
    /// Notes the response a librdkafka log line reports as too large, if it is such a line.
    pub(crate) fn observe_log(&self, log_message: &str) {
        if let Some(bytes) = oversized_response_bytes(log_message) {
            // Release pairs with the Acquire in `take`: librdkafka logs the line before it
            // queues the error the ingest thread then polls.
            self.largest_bytes.fetch_max(bytes, Ordering::Release);
        }
    }

    /// The largest oversized response reported since the last call, if any.
    pub(crate) fn take(&self) -> Option<u64> {
        // Acquire pairs with the Release in `observe_log`.
        match self.largest_bytes.swap(0, Ordering::Acquire) {
            0 => None,
            bytes => Some(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn properties(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn defaults(pairs: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        set_consumer_defaults(&mut config, &properties(pairs));
        config
    }

    #[test]
    fn defaults_are_consistent_and_below_librdkafkas() {
        let config = defaults(&[]);
        let get = |key| config.get(key).and_then(|v| v.parse::<u64>().ok());
        assert_eq!(get("max.partition.fetch.bytes"), Some(1 << 20));
        assert_eq!(get("fetch.max.bytes"), Some(1 << 20));
        assert_eq!(
            get("receive.message.max.bytes"),
            Some((2 << 20) + (64 << 10))
        );
        assert_eq!(get("queued.min.messages"), Some(10_000));
        assert_eq!(get("queued.max.messages.kbytes"), Some(2_048));
        assert_eq!(get("fetch.queue.backoff.ms"), Some(10));
        assert!(receive_max_bytes(&config) < 100_000_000);
        // The operator's queue sizes are kept.
        let config = defaults(&[("queued.min.messages", "100000")]);
        assert_eq!(
            config.get("queued.min.messages"),
            None,
            "-X applies it itself"
        );
        assert_eq!(config.get("queued.max.messages.kbytes"), Some("2048"));
    }

    #[test]
    fn operator_settings_are_kept_and_the_rest_follows_them() {
        let config = defaults(&[("fetch.max.bytes", "200000000")]);
        assert_eq!(config.get("fetch.max.bytes"), None, "-X applies it itself");
        assert_eq!(
            config.get("receive.message.max.bytes"),
            Some((200_000_000 + (1 << 20) + (64 << 10)).to_string().as_str())
        );
        let config = defaults(&[("message.max.bytes", "50000000")]);
        assert_eq!(config.get("fetch.max.bytes"), Some("50000000"));
        let config = defaults(&[
            ("receive.message.max.bytes", "5000000"),
            ("fetch.message.max.bytes", "4096"),
        ]);
        assert_eq!(config.get("receive.message.max.bytes"), None);
        assert_eq!(config.get("max.partition.fetch.bytes"), None);
        assert_eq!(config.get("fetch.max.bytes"), Some("1048576"));
        // Unparsable: librdkafka reports it; nothing derived from it.
        let config = defaults(&[("fetch.max.bytes", "lots")]);
        assert_eq!(config.get("receive.message.max.bytes"), None);
    }

    #[test]
    fn the_log_line_of_an_oversized_response_is_recognised() {
        let line = "127.0.0.1:9092/1: Receive failed: Invalid response size 113034528 \
                    (0..100000000): increase receive.message.max.bytes (after 2ms in state UP)";
        assert_eq!(oversized_response_bytes(line), Some(113_034_528));
        assert_eq!(
            oversized_response_bytes("Receive failed: Connection reset by peer"),
            None
        );
        assert_eq!(
            oversized_response_bytes(
                "Invalid response size -5 (0..100000000): increase receive.message.max.bytes"
            ),
            None
        );
        let seen = OversizedResponses::default();
        assert_eq!(seen.take(), None);
        seen.observe_log(line);
        seen.observe_log("Invalid response size 7 (0..5): increase receive.message.max.bytes");
        assert_eq!(seen.take(), Some(113_034_528));
        assert_eq!(seen.take(), None);
    }

    #[test]
    fn the_limit_rises_to_fit_up_to_the_ceiling() {
        assert_eq!(
            raised_receive_max_bytes(100, 1000, 10_000),
            Some(1250),
            "a quarter above the response"
        );
        assert_eq!(
            raised_receive_max_bytes(1000, 1100, 10_000),
            Some(2000),
            "at least doubled"
        );
        assert_eq!(raised_receive_max_bytes(1000, 9000, 10_000), Some(10_000));
        assert_eq!(raised_receive_max_bytes(1000, 10_001, 10_000), None);
        assert_eq!(
            raised_receive_max_bytes(1 << 30, 1 << 30, u64::MAX),
            Some(LIBRDKAFKA_MAX_RESPONSE_BYTES)
        );
    }
}
