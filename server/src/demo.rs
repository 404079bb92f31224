//! Demo mode: an in-process synthetic event source (the engine's deterministic `feed-2d`
//! workload) feeds the store: two days of backlog, then a live trickle of creates and deletes.
//! The synthetic viewers' follow lists back the follow-graph fallback, so a query with only a
//! user id returns a feed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use thunder_engine::{EventBatch, PostEvent, PostStore, Store};
use thunder_workload::SynthConfig;
use tokio::sync::watch;

use crate::serve::following::StaticFollowing;

/// Default workload scale ([`thunder_workload::DEMO_SCALE`]: 10 000 authors and 200 000 posts).
pub const DEFAULT_SCALE: u32 = thunder_workload::DEMO_SCALE;
/// Default live events per second after the backlog.
pub const DEFAULT_EVENTS_PER_SEC: u32 = 50;
/// Synthetic viewers whose follow lists back the fallback.
pub const DEMO_VIEWERS: usize = 100;
/// Events applied per store call while loading the backlog.
const BATCH: usize = 4096;
/// Live events are emitted in this many slices per second.
const LIVE_TICKS_PER_SEC: u32 = 10;

/// The demo workload ending at `now_secs`.
pub fn workload(scale: u32, now_secs: i64) -> SynthConfig {
    SynthConfig::feed_2d(scale.max(1), now_secs)
}

/// Follow lists of the first [`DEMO_VIEWERS`] synthetic viewers.
pub fn following(config: &SynthConfig) -> StaticFollowing {
    let graph: HashMap<i64, Vec<i64>> = config
        .viewers(DEMO_VIEWERS)
        .into_iter()
        .map(|v| (v.user_id, v.following))
        .collect();
    StaticFollowing::new(graph)
}

/// The command the start-up log suggests to try the demo: `thunder-cli query` against
/// `grpc_addr` (an unspecified address as localhost) for `viewer`, whose follow list the demo
/// graph knows. With TLS (`tls`), an `https://` address and the files mTLS asks for, which the
/// operator holds: the CA of the server's certificate and a client certificate of the CA of
/// `--tls-client-ca`.
pub fn try_command(grpc_addr: std::net::SocketAddr, tls: bool, viewer: i64) -> String {
    let port = grpc_addr.port();
    if tls {
        // TLS verifies a name: localhost, which a certificate for the machine usually names
        // (--tls-domain gives another).
        let host = if grpc_addr.ip().is_unspecified() || grpc_addr.ip().is_loopback() {
            "localhost".to_owned()
        } else {
            grpc_addr.ip().to_string()
        };
        format!(
            "thunder-cli query --addr https://{host}:{port} --tls-ca SERVER_CA.pem \
             --tls-cert CLIENT.pem --tls-key CLIENT.key --user {viewer}"
        )
    } else {
        let mut reachable = grpc_addr;
        if reachable.ip().is_unspecified() {
            reachable.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        format!("thunder-cli query --addr http://{reachable} --user {viewer}")
    }
}

/// Applies `events` in batches of 1000, creates then deletes per batch (the store's answers
/// do not depend on the order).
pub fn apply(store: &PostStore, events: &[PostEvent]) {
    for batch in EventBatch::split(events.iter().copied(), 1000) {
        store.apply(&batch);
    }
}

/// Loads the backlog into the store on a blocking thread; returns the number of events.
pub async fn load_backlog(store: Arc<PostStore>, config: SynthConfig) -> Result<u64, String> {
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut batch = Vec::with_capacity(BATCH);
        let mut total = 0u64;
        for event in config.backlog() {
            batch.push(event);
            if batch.len() == BATCH {
                apply(&store, &batch);
                total += batch.len() as u64;
                batch.clear();
            }
        }
        apply(&store, &batch);
        total += batch.len() as u64;
        tracing::info!(
            events = total,
            took_secs = started.elapsed().as_secs_f64(),
            "demo backlog loaded"
        );
        total
    })
    .await
    .map_err(|e| format!("demo backlog task failed: {e}"))
}

/// Emits `events_per_sec` live events (new posts and due deletes) at the store's clock until
/// `shutdown` turns true.
pub async fn run_live(
    store: Arc<PostStore>,
    config: SynthConfig,
    events_per_sec: u32,
    mut shutdown: watch::Receiver<bool>,
) {
    if events_per_sec == 0 {
        return;
    }
    let mut live = config.live();
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / LIVE_TICKS_PER_SEC);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tick = 0u64;
    let mut events = Vec::new();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        // Spread the rate evenly over the ticks of each second.
        let per_sec = u64::from(events_per_sec);
        let ticks = u64::from(LIVE_TICKS_PER_SEC);
        let due = per_sec * (tick % ticks + 1) / ticks - per_sec * (tick % ticks) / ticks;
        tick += 1;
        let now = store.now_secs();
        events.clear();
        events.extend((0..due).map(|_| live.next_event(now)));
        // A few lock-free store calls: cheap enough to run on the reactor.
        apply(&store, &events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suggested_command_speaks_the_ports_protocol() {
        let any: std::net::SocketAddr = "0.0.0.0:9090".parse().expect("addr");
        assert_eq!(
            try_command(any, false, 7),
            "thunder-cli query --addr http://127.0.0.1:9090 --user 7"
        );
        let tls = try_command(any, true, 7);
        assert!(
            tls.starts_with("thunder-cli query --addr https://localhost:9090 --tls-ca ")
                && tls.contains("--tls-cert")
                && tls.contains("--tls-key")
                && tls.contains("--user 7")
                && !tls.contains("http://"),
            "{tls}"
        );
    }
}
