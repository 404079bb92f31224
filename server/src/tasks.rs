//! Background maintenance of the store: incremental trimming and the statistics gauges.

use std::sync::Arc;
use std::time::Duration;

use thunder_engine::PostStore;
use thunder_engine::config::TRIM_FRACTION;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::metrics::Metrics;

/// How often one author shard is trimmed (the reference's `start_auto_trim(2)`).
pub const TRIM_INTERVAL: Duration = Duration::from_secs(120);
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
                Metrics::global()
                    .store_trimmed_posts
                    .inc_by(report.posts_freed as u64);
                if report.entries_removed > 0 || report.tombstones_expired > 0 {
                    tracing::info!(shard = current, ?report, "auto-trim");
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
            Ok(stats) => Metrics::global().record_store_stats(&stats),
            Err(e) => tracing::error!(error = %e, "store stats task failed"),
        }
    }
}
