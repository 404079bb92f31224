//! What ingestion knows of one partition ([`PartitionState`]): published by the thread that
//! owns it, read by the supervisor (lag, stalls, truncation) and the catch-up window.

use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rdkafka::Offset;

/// What ingestion knows of one partition, published by the thread that owns it.
#[derive(Debug)]
pub(super) struct PartitionState {
    /// Kafka partition id.
    pub(super) partition: i32,
    /// The low watermark when ingestion started.
    pub(super) low_at_start: i64,
    /// The high watermark when ingestion started: catch-up means reading up to here.
    pub(super) end_at_start: i64,
    /// Next offset to apply. `-1`: from the low watermark; `i64::MAX`: from the end.
    pub(super) next: AtomicI64,
    /// The consumer reported the end of the partition after the last applied record.
    pub(super) at_end: AtomicBool,
    /// A log end the monitor saw below `next` (see [`TruncationReport`]).
    pub(super) truncation: Mutex<TruncationReport>,
    /// Assigned to its thread's consumer: being read (see `window.rs`).
    pub(super) reading: AtomicBool,
}

/// The monitor's report of a truncated partition log to the thread that owns the partition.
///
/// `epoch` counts the thread's repositionings: a report made against `next` of an earlier
/// epoch (before the thread moved back) is stale and ignored.
#[derive(Debug, Default)]
pub(super) struct TruncationReport {
    /// Times the owning thread moved the partition's position back.
    pub(super) epoch: u64,
    /// The lowest log end seen below `next` during this epoch.
    pub(super) log_end: Option<i64>,
}

impl PartitionState {
    /// The truncation report, consistent after any panic (two plain fields).
    pub(super) fn truncation(&self) -> MutexGuard<'_, TruncationReport> {
        self.truncation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The next-offset value that stands for a start position before anything was read.
pub(super) fn start_marker(start: Offset) -> i64 {
    match start {
        Offset::Offset(offset) => offset,
        Offset::End => i64::MAX,
        _ => -1,
    }
}
