//! Background maintenance of the store: incremental trimming and the statistics gauges.
//!
//! Its one metric of its own, `post_store_trimmed_posts_total`, is [`MaintenanceMetrics`]; the
//! gauges it refreshes are the store's (`telemetry::metrics::StoreMetrics`), which readiness
//! refreshes too.

use std::sync::Arc;
use std::time::Duration;

use thunder_engine::PostStore;
use thunder_engine::config::TRIM_FRACTION;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use prometheus::IntCounter;

use crate::telemetry::metrics::StoreMetrics;
use crate::telemetry::registry::Registrar;

/// The maintenance task's metrics.
#[derive(Clone, Debug)]
pub struct MaintenanceMetrics {
    /// `post_store_trimmed_posts_total`: posts removed by trimming.
    pub trimmed_posts: IntCounter,
}

impl MaintenanceMetrics {
    /// Builds the metrics into `r`.
    pub fn new(r: &Registrar<'_>) -> Self {
        Self {
            trimmed_posts: r.counter(
                "post_store_trimmed_posts_total",
                "Post records freed by trimming",
            ),
        }
    }
}

crate::process_instance!(MaintenanceMetrics);

/// How often one author shard is trimmed at the default retention (the reference's
/// `start_auto_trim(2)`), and at most at any retention ([`trim_interval_for`]).
pub const TRIM_INTERVAL: Duration = Duration::from_secs(120);
/// How often one author shard is trimmed at least, whatever the retention.
pub const MIN_TRIM_INTERVAL: Duration = Duration::from_secs(1);
/// Parts of the retention window a whole trim cycle (all `TRIM_FRACTION` shards) may take:
/// an expired post waits at most one cycle for its shard's turn, so it is freed within a
/// tenth of the retention after it expired.
const TRIM_CYCLES_PER_RETENTION: u32 = 10;

/// The trim interval for a retention of `retention_secs`: a whole cycle over the
/// `TRIM_FRACTION` shards takes a tenth of the retention, within [`MIN_TRIM_INTERVAL`] and
/// [`TRIM_INTERVAL`]. So no post is kept more than ~10% past the retention (at retentions
/// under 50 s, at most the 5 s of one cycle at the minimum interval), and at the default two
/// days the interval is the reference's 120 s.
pub fn trim_interval_for(retention_secs: i64) -> Duration {
    let retention = Duration::from_secs(u64::try_from(retention_secs).unwrap_or(0));
    (retention / (TRIM_CYCLES_PER_RETENTION * TRIM_FRACTION as u32))
        .clamp(MIN_TRIM_INTERVAL, TRIM_INTERVAL)
}
/// How often the `post_store_*` gauges are refreshed (the reference's stats logger period).
pub const STATS_INTERVAL: Duration = Duration::from_secs(5);

/// Every `interval` (first after one interval), trims the next of the `TRIM_FRACTION` author
/// shards on a blocking thread, until `shutdown` turns true.
pub async fn run_trim(
    store: Arc<PostStore>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut shard = 1usize;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let current = shard % TRIM_FRACTION;
        shard = shard.wrapping_add(1);
        let store = Arc::clone(&store);
        match tokio::task::spawn_blocking(move || store.trim(current)).await {
            Ok(report) => {
                MaintenanceMetrics::global()
                    .trimmed_posts
                    .inc_by(report.posts_freed as u64);
                if report.entries_removed > 0 || report.tombstones_expired > 0 {
                    tracing::info!(
                        shard = current,
                        entries_removed = report.entries_removed,
                        posts_freed = report.posts_freed,
                        tombstones_expired = report.tombstones_expired,
                        authors_dropped = report.authors_dropped,
                        "auto-trim"
                    );
                }
            }
            Err(e) => tracing::error!(shard = current, error = %e, "auto-trim task failed"),
        }
    }
}

/// Refreshes the `post_store_*` gauges from `store.stats()` every `interval` (first at once),
/// until `shutdown` turns true.
pub async fn run_stats(
    store: Arc<PostStore>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let store = Arc::clone(&store);
        match tokio::task::spawn_blocking(move || store.stats()).await {
            Ok(stats) => StoreMetrics::global().record(&stats),
            Err(e) => tracing::error!(error = %e, "store stats task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use thunder_engine::{LightPost, ManualClock};

    #[test]
    fn the_trim_interval_follows_the_retention_within_bounds() {
        let secs = |s: i64| trim_interval_for(s).as_secs_f64();
        assert_eq!(secs(thunder_engine::config::DEFAULT_RETENTION_SECS), 120.0);
        assert_eq!(secs(6000), 120.0);
        assert_eq!(secs(600), 12.0);
        assert_eq!(secs(120), 2.4);
        assert_eq!(secs(10), 1.0);
        assert_eq!(secs(0), 1.0);
        assert_eq!(secs(-5), 1.0);
        assert_eq!(secs(i64::MAX), 120.0);
    }

    /// The store under the schedule `run_trim` keeps (one shard per interval, in turn) holds
    /// no post much past the retention: at 120 s retention and one post a second, never
    /// more than the last ~132 s of posts (with the fixed 120 s interval it held up to 720).
    #[test]
    fn under_the_trim_schedule_no_post_outlives_the_retention_by_more_than_a_tenth() {
        for retention in [60i64, 120, 600, 6000] {
            let start = 1_700_000_000;
            let clock = Arc::new(ManualClock::new(start));
            let store = PostStore::with_clock(retention, clock.clone());
            let interval = trim_interval_for(retention).as_millis() as i64;
            let (mut next_trim_ms, mut shard) = (interval, 1usize);
            let mut most = 0;
            for second in 0..retention * 4 {
                let now = start + second;
                clock.set(now);
                // Authors spread over every shard.
                store.insert_posts(&[LightPost::original(second + 1, second % 17, now)]);
                while next_trim_ms <= second * 1000 {
                    store.trim(shard % TRIM_FRACTION);
                    shard += 1;
                    next_trim_ms += interval;
                }
                most = most.max(store.stats().posts as i64);
            }
            // Posts of the last `retention` seconds are all kept (one a second, the newest
            // included); any more are expired ones waiting for their shard's turn.
            let bound = retention + 1 + (retention / 10).max(5);
            assert!(
                most <= bound,
                "retention {retention} s: up to {most} posts stored (at most {bound})"
            );
            assert!(most >= retention, "retention {retention} s: {most}");
        }
    }
}
