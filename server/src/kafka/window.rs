//! The catch-up window: how many fetched records the ingest threads may hold at once while
//! they catch up, against a broker that answers beyond the fetch limits.
//!
//! librdkafka turns every fetched record into a 304-byte operation (a 320-byte allocation)
//! that keeps its response buffer alive until the ingest thread polls the record. A broker that
//! honours the fetch limits sends at most `fetch.max.bytes` plus one record batch per request,
//! and a consumer asks again only when few records wait (`fetch_limits.rs`): what a consumer
//! holds stays around a megabyte of records. A broker that ignores the limits (the local test
//! broker) answers a fetch with the partition's whole backlog: a cold replay that reads every
//! partition at once then holds the topic seven times over before it has applied much of it.
//!
//! Such a broker shows itself by an answer larger than the consumer accepts
//! (`receive.message.max.bytes`, which librdkafka refuses before reading it). From then on a
//! partition still catching up is assigned to its consumer only while the backlogs of the
//! partitions being caught up, each record counted at what librdkafka holds for it, fit the
//! budget (`--kafka-catch-up-buffer-bytes`) together with its own; or when no partition is
//! being caught up, so a backlog larger than the budget is read alone. Caught-up partitions
//! cost nothing and stay assigned. The window never holds back a broker that keeps to the
//! limits: until one answers beyond them, every partition is read at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::gate::{partition_caught_up, partition_lag};
use super::shared::PartitionState;

/// Default `--kafka-catch-up-buffer-bytes` (64 MiB): about 170k records of 50-byte events in
/// flight, so backlogs larger than that are read one at a time. A replay of 1M or 2M posts
/// through the test broker stays within 1.5 times the store + 128 MiB with it, where 160 MiB
/// went over at 1M (docs/performance-history.md, *A cold replay's memory*).
pub(crate) const CATCH_UP_BUFFER_BYTES: u64 = 64 << 20;

/// What librdkafka holds for one fetched record besides its payload: the operation that
/// carries it (`rd_kafka_op_t` of a fetched message, 304 bytes, a 320-byte allocation) and
/// the record's own framing in the response buffer (length, attributes, deltas, key and
/// header counts).
pub(crate) const RECORD_OVERHEAD_BYTES: u64 = 320 + 24;

/// Payload bytes assumed per record before any was read.
const FIRST_PAYLOAD_GUESS_BYTES: u64 = 64;

/// The process-wide catch-up window (see the module docs).
#[derive(Debug)]
pub(super) struct CatchUpWindow {
    budget_bytes: u64,
    /// A consumer has seen an answer larger than it accepts.
    limits_ignored: AtomicBool,
    /// Payload bytes and records read so far: the average payload a record costs.
    payload_bytes: AtomicU64,
    payload_records: AtomicU64,
    /// Serialises admissions, so two threads cannot both take the last room.
    admitting: Mutex<()>,
}

impl CatchUpWindow {
    pub(super) fn new(budget_bytes: u64) -> Self {
        Self {
            budget_bytes,
            limits_ignored: AtomicBool::new(false),
            payload_bytes: AtomicU64::new(0),
            payload_records: AtomicU64::new(0),
            admitting: Mutex::new(()),
        }
    }

    /// `--kafka-catch-up-buffer-bytes`.
    pub(super) fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Notes that a consumer saw an answer beyond the fetch limits; true the first time.
    pub(super) fn note_limits_ignored(&self) -> bool {
        !self.limits_ignored.swap(true, Ordering::Relaxed)
    }

    /// Whether partitions catching up are read within the budget.
    pub(super) fn limits_ignored(&self) -> bool {
        self.limits_ignored.load(Ordering::Relaxed)
    }

    /// Counts `records` read with `bytes` of payload in all.
    pub(super) fn note_payloads(&self, records: u64, bytes: u64) {
        self.payload_records.fetch_add(records, Ordering::Relaxed);
        self.payload_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// What one fetched record costs in memory until it is applied.
    pub(super) fn record_bytes(&self) -> u64 {
        let records = self.payload_records.load(Ordering::Relaxed);
        let payload = match records {
            0 => FIRST_PAYLOAD_GUESS_BYTES,
            n => self.payload_bytes.load(Ordering::Relaxed) / n,
        };
        RECORD_OVERHEAD_BYTES + payload
    }

    /// Marks `candidate` (one of `partitions`) as read if the window has room for its backlog;
    /// true when it is (or already was) read.
    pub(super) fn admit(&self, partitions: &[PartitionState], candidate: &PartitionState) -> bool {
        // A unit: consistent after any panic.
        let _admitting = self
            .admitting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if candidate.reading.load(Ordering::Relaxed) {
            return true;
        }
        let admitted = !self.limits_ignored()
            || fits(
                self.budget_bytes,
                self.record_bytes(),
                partitions
                    .iter()
                    .filter(|p| p.reading.load(Ordering::Relaxed))
                    .map(backlog),
                backlog(candidate),
            );
        if admitted {
            candidate.reading.store(true, Ordering::Relaxed);
        }
        admitted
    }

    /// The bytes the partitions being read may still bring, at [`record_bytes`](Self::record_bytes)
    /// a record (for the gauge).
    pub(super) fn in_flight_bytes(&self, partitions: &[PartitionState]) -> u64 {
        let records: u64 = partitions
            .iter()
            .filter(|p| p.reading.load(Ordering::Relaxed))
            .map(backlog)
            .sum();
        records.saturating_mul(self.record_bytes())
    }
}

/// Records of `partition`'s catch-up backlog not applied yet: 0 once it is caught up.
fn backlog(partition: &PartitionState) -> u64 {
    // Acquire pairs with the Release of the thread that published the position.
    let next = partition.next.load(Ordering::Acquire);
    let at_end = partition.at_end.load(Ordering::Relaxed);
    if partition_caught_up(partition.low_at_start, partition.end_at_start, next, at_end) {
        return 0;
    }
    u64::try_from(partition_lag(
        partition.low_at_start,
        partition.end_at_start,
        next,
    ))
    .unwrap_or(0)
}

/// Whether a partition with `candidate` records of backlog fits the window of `budget_bytes`
/// at `record_bytes` a record, beside the backlogs of the partitions being read.
fn fits(
    budget_bytes: u64,
    record_bytes: u64,
    reading: impl Iterator<Item = u64>,
    candidate: u64,
) -> bool {
    let reading: u64 = reading.sum();
    candidate == 0
        || reading == 0
        || reading
            .saturating_add(candidate)
            .saturating_mul(record_bytes)
            <= budget_bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    fn partition(low: i64, end: i64, next: i64, reading: bool) -> PartitionState {
        PartitionState {
            partition: 0,
            low_at_start: low,
            end_at_start: end,
            next: AtomicI64::new(next),
            at_end: AtomicBool::new(false),
            truncation: Mutex::default(),
            reading: AtomicBool::new(reading),
        }
    }

    #[test]
    fn backlogs_fit_the_budget_together() {
        // 100 records of 10 bytes fit 1000 bytes; 101 do not.
        assert!(fits(1000, 10, [40, 20].into_iter(), 40));
        assert!(!fits(1000, 10, [40, 20].into_iter(), 41));
        // Nothing being read: any backlog is read, alone.
        assert!(fits(1000, 10, std::iter::empty(), 1_000_000));
        assert!(fits(1000, 10, [0, 0].into_iter(), 1_000_000));
        // A caught-up partition costs nothing.
        assert!(fits(1000, 10, [1_000_000].into_iter(), 0));
        // Products beyond u64 saturate rather than wrap to a small number.
        assert!(!fits(1 << 40, 1 << 40, [1 << 40].into_iter(), 1));
    }

    #[test]
    fn a_window_admits_everything_until_the_limits_are_ignored() {
        let window = CatchUpWindow::new(100 * (RECORD_OVERHEAD_BYTES + 64));
        let partitions = [
            partition(0, 80, -1, false),
            partition(0, 80, -1, false),
            partition(0, 80, 80, false),
        ];
        assert!(window.admit(&partitions, &partitions[0]));
        assert!(window.admit(&partitions, &partitions[1]));
        assert!(window.note_limits_ignored());
        assert!(!window.note_limits_ignored());
        for p in &partitions[..2] {
            p.reading.store(false, Ordering::Relaxed);
        }
        // 80 records fit a window of 100, 160 do not; a caught-up partition always fits.
        assert!(window.admit(&partitions, &partitions[0]));
        assert!(!window.admit(&partitions, &partitions[1]));
        assert!(window.admit(&partitions, &partitions[2]));
        assert_eq!(
            window.in_flight_bytes(&partitions),
            80 * (RECORD_OVERHEAD_BYTES + 64)
        );
        // The first partition applies 30 records: 50 + 80 still do not fit...
        partitions[0].next.store(30, Ordering::Release);
        assert!(!window.admit(&partitions, &partitions[1]));
        // ...20 + 80 do.
        partitions[0].next.store(60, Ordering::Release);
        assert!(window.admit(&partitions, &partitions[1]));
        // A partition at its end (its watermark counts transaction markers) costs nothing.
        partitions[0].at_end.store(true, Ordering::Relaxed);
        assert_eq!(
            window.in_flight_bytes(&partitions),
            80 * (RECORD_OVERHEAD_BYTES + 64)
        );
    }

    #[test]
    fn a_record_costs_its_average_payload_above_the_overhead() {
        let window = CatchUpWindow::new(1 << 20);
        assert_eq!(window.record_bytes(), RECORD_OVERHEAD_BYTES + 64);
        window.note_payloads(4, 200);
        window.note_payloads(6, 300);
        assert_eq!(window.record_bytes(), RECORD_OVERHEAD_BYTES + 50);
    }
}
