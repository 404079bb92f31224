//! thunder-benches: the side-by-side benchmark of thunder-engine against the reference store
//! design, shared by the `compare` binary, the criterion benches and the `loadgen` binary.
//!
//! - [`baseline`]: the reference store (`DashMap` records, `VecDeque` timelines), the yardstick.
//! - [`Store`] (thunder-engine's store contract, implemented by both stores) is what the
//!   benchmark drives them through, with [`FeedQuery`](thunder_engine::FeedQuery) requests.
//! - [`EventBatch`] and [`load`]: the synthetic stream cut into ingest batches and applied.
//! - [`floor`]: the serving floor, thunder's gRPC path answering pre-built answers.
//! - [`line_floor`]: the store query's floor, random reads of the lines a query must touch.
//! - [`store_floor`]: the engine's 2000-follow query against that floor, and walks of its
//!   merge side by side.
//! - [`memory`]: resident-set measurement; [`cpu_time`]: CPU time of a thread or the process.
#![deny(missing_docs)]

pub mod baseline;
pub mod floor;
pub mod line_floor;
pub mod memory;
pub mod store_floor;

use std::time::{Duration, Instant};
use thunder_engine::{EventBatch, PostEvent, Store};

pub use baseline::BaselineStore;

/// CPU time used so far on `clock` (`libc::CLOCK_THREAD_CPUTIME_ID` for the calling thread,
/// `libc::CLOCK_PROCESS_CPUTIME_ID` for every thread of the process); zero if unavailable.
pub fn cpu_time(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer to a local.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Events per ingest batch, as the reference's Kafka listener `batch_size`.
pub const DEFAULT_BATCH_EVENTS: usize = 1000;

/// Cuts `events` into consecutive batches of `batch_events` events.
pub fn batches(
    events: impl IntoIterator<Item = PostEvent>,
    batch_events: usize,
) -> Vec<EventBatch> {
    EventBatch::split(events, batch_events)
}

/// Applies `batches` to `store` with `writers` threads and returns the wall time. With more
/// than one writer, the batches are first split as [`partition`] does (before the clock
/// starts), and each writer applies its share.
pub fn load(store: &dyn Store, batches: &[EventBatch], writers: usize) -> Duration {
    if writers <= 1 {
        let start = Instant::now();
        for batch in batches {
            store.apply(batch);
        }
        return start.elapsed();
    }
    load_shares(store, &partition(batches, writers))
}

/// Splits `batches` the way Kafka partitions the topic for thunder (the producer keys creates
/// by author and deletes by post id): share `t` holds the creates of authors `≡ t (mod
/// writers)` and the deletes of post ids `≡ t (mod writers)`, each in stream order, so each
/// writer sees its authors' posts in order.
pub fn partition(batches: &[EventBatch], writers: usize) -> Vec<Vec<EventBatch>> {
    let writers = writers.max(1);
    (0..writers)
        .map(|t| {
            batches
                .iter()
                .map(|b| EventBatch {
                    creates: b
                        .creates
                        .iter()
                        .filter(|p| p.author_id.rem_euclid(writers as i64) == t as i64)
                        .copied()
                        .collect(),
                    deletes: b
                        .deletes
                        .iter()
                        .filter(|d| d.post_id.rem_euclid(writers as i64) == t as i64)
                        .copied()
                        .collect(),
                })
                .collect()
        })
        .collect()
}

/// Applies each share (from [`partition`]) on a thread of its own and returns the wall time.
pub fn load_shares(store: &dyn Store, shares: &[Vec<EventBatch>]) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for share in shares {
            scope.spawn(move || {
                for batch in share {
                    store.apply(batch);
                }
            });
        }
    });
    start.elapsed()
}
