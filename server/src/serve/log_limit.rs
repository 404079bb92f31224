//! Hygiene of per-request logs: client strings are cut to a short prefix, and log lines a
//! client can trigger per request are rate-limited (with the count of suppressed ones).

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// Characters of a client string kept in a log line.
pub const MAX_LOGGED_CHARS: usize = 64;

/// `value` escaped and cut to [`MAX_LOGGED_CHARS`] characters, noting the full length.
pub fn for_log(value: &str) -> String {
    let mut out: String = value
        .chars()
        .take(MAX_LOGGED_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if value.chars().nth(MAX_LOGGED_CHARS).is_some() {
        out.push_str(&format!("... ({} bytes)", value.len()));
    }
    out
}

/// A log-line budget: [`LogLimit::allow`] is true at most `per_sec` times per second.
#[derive(Debug)]
pub struct LogLimit {
    limiter: DefaultDirectRateLimiter,
    suppressed: AtomicU64,
}

impl LogLimit {
    /// A budget of `per_sec` lines per second (burst: the same).
    pub fn per_second(per_sec: NonZeroU32) -> Self {
        Self {
            limiter: RateLimiter::direct(Quota::per_second(per_sec)),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines suppressed since the last allowed one)` when a line may be written now.
    pub fn allow(&self) -> Option<u64> {
        if self.limiter.check().is_ok() {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_client_strings_are_cut() {
        assert_eq!(for_log("recent"), "recent");
        assert_eq!(for_log("a\nb"), "a\\nb");
        let huge = "x".repeat(4 << 20);
        let logged = for_log(&huge);
        assert!(logged.len() < 100, "{logged}");
        assert!(logged.ends_with("... (4194304 bytes)"), "{logged}");
    }

    #[test]
    fn lines_beyond_the_budget_are_counted_not_written() {
        let limit = LogLimit::per_second(NonZeroU32::new(3).expect("non-zero"));
        let allowed: Vec<_> = (0..10).map(|_| limit.allow()).collect();
        assert_eq!(allowed.iter().filter(|a| a.is_some()).count(), 3);
        assert_eq!(limit.suppressed.load(Ordering::Relaxed), 7);
    }
}
