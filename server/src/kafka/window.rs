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
//! window together with its own; or when no partition is being caught up, so a backlog larger
//! than the window is read alone. A thread reads one such partition at a time (its consumer
//! would deliver a second one only after the first anyway), so the room goes to other threads.
//! Caught-up partitions cost nothing and stay assigned. The window never holds back a broker
//! that keeps to the limits: until one answers beyond them, every partition is read at once.
//!
//! The window is 1.5 times what the records not applied yet will take in the store
//! ([`STORE_BYTES_PER_POST`] each), at most `--kafka-catch-up-buffer-bytes`: widest at the
//! start, when the store is empty, it narrows as the store fills. What the process holds is then
//! the store so far (with its allocator's slack, about 1.2 times its own bytes) plus the window,
//! which stays within 1.5 times the store the whole backlog builds at every point of the replay:
//! 1.2 (N - R) + 1.5 R <= 1.5 N for the N posts of the backlog and the R not applied yet. Only a
//! single backlog larger than the window, read alone, goes over.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::gate::{partition_caught_up, partition_lag};
use super::partition::PartitionState;

/// Default `--kafka-catch-up-buffer-bytes` (1 GiB): the most the window holds whatever the
/// backlog, about two partitions of a 20M-post topic of eight.
pub(crate) const CATCH_UP_BUFFER_BYTES: u64 = 1 << 30;

/// What librdkafka holds for one fetched record besides its payload: the operation that
/// carries it (`rd_kafka_op_t` of a fetched message, 304 bytes, a 320-byte allocation) and
/// the record's own framing in the response buffer (length, attributes, deltas, key and
/// header counts).
pub(crate) const RECORD_OVERHEAD_BYTES: u64 = 320 + 24;

/// What one post takes in the store, for the window: the store's own bytes per post
/// (`post_store_*_bytes` over `post_store_total_posts`) are 87-95 at 1M-20M posts.
pub(crate) const STORE_BYTES_PER_POST: u64 = 90;

/// Payload bytes assumed per record before any was read.
const FIRST_PAYLOAD_GUESS_BYTES: u64 = 64;

/// The process-wide catch-up window (see the module docs).
#[derive(Debug)]
pub(super) struct CatchUpWindow {
    /// `--kafka-catch-up-buffer-bytes`.
    cap_bytes: u64,
    /// A consumer has seen an answer larger than it accepts.
    limits_ignored: AtomicBool,
    /// Payload bytes and records read so far: the average payload a record costs.
    payload_bytes: AtomicU64,
    payload_records: AtomicU64,
    /// Serialises admissions, so two threads cannot both take the last room.
    admitting: Mutex<()>,
}

impl CatchUpWindow {
    pub(super) fn new(cap_bytes: u64) -> Self {
        Self {
            cap_bytes,
            limits_ignored: AtomicBool::new(false),
            payload_bytes: AtomicU64::new(0),
            payload_records: AtomicU64::new(0),
            admitting: Mutex::new(()),
        }
    }

    /// `--kafka-catch-up-buffer-bytes`.
    pub(super) fn cap_bytes(&self) -> u64 {
        self.cap_bytes
    }

    /// Notes that a consumer saw an answer beyond the fetch limits; true the first time.
    pub(super) fn note_limits_ignored(&self) -> bool {
        !self.limits_ignored.swap(true, Ordering::Relaxed)
    }

    /// Whether partitions catching up are read within the window.
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
                self.window_bytes(partitions),
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

    /// The window now: 1.5 times what the records of every backlog not applied yet will take
    /// in the store, at most the cap.
    pub(super) fn window_bytes(&self, partitions: &[PartitionState]) -> u64 {
        let remaining: u64 = partitions.iter().map(backlog).sum();
        let ahead = remaining.saturating_mul(STORE_BYTES_PER_POST) / 2 * 3;
        self.cap_bytes.min(ahead)
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

/// True while `partition` has records of its catch-up backlog to apply.
pub(super) fn catching_up(partition: &PartitionState) -> bool {
    backlog(partition) > 0
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

/// Whether a partition with `candidate` records of backlog fits a window of `window_bytes` at
/// `record_bytes` a record, beside the backlogs of the partitions being read.
fn fits(
    window_bytes: u64,
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
            <= window_bytes
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
    fn backlogs_fit_the_window_together() {
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
        let record = RECORD_OVERHEAD_BYTES + 64;
        // Capped at 100 records: the fourth partition's million records to come would widen the
        // window far beyond that.
        let window = CatchUpWindow::new(100 * record);
        let partitions = [
            partition(0, 80, -1, false),
            partition(0, 80, -1, false),
            partition(0, 80, 80, false),
            partition(0, 1_000_000, -1, false),
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
        assert_eq!(window.in_flight_bytes(&partitions), 80 * record);
        // The first partition applies 30 records: 50 + 80 still do not fit...
        partitions[0].next.store(30, Ordering::Release);
        assert!(!window.admit(&partitions, &partitions[1]));
        // ...20 + 80 do.
        partitions[0].next.store(60, Ordering::Release);
        assert!(window.admit(&partitions, &partitions[1]));
        // A partition at its end (its watermark counts transaction markers) costs nothing.
        partitions[0].at_end.store(true, Ordering::Relaxed);
        assert!(!catching_up(&partitions[0]));
        assert_eq!(window.in_flight_bytes(&partitions), 80 * record);
    }

    #[test]
    fn the_window_narrows_as_the_backlogs_are_applied() {
        let window = CatchUpWindow::new(1 << 30);
        let partitions = [
            partition(0, 10_000, -1, false),
            partition(0, 10_000, 5_000, false),
        ];
        // 15000 records to apply: 1.5 times what they will take in the store.
        assert_eq!(
            window.window_bytes(&partitions),
            15_000 * STORE_BYTES_PER_POST * 3 / 2
        );
        partitions[0].next.store(9_999, Ordering::Release);
        partitions[1].next.store(10_000, Ordering::Release);
        assert_eq!(
            window.window_bytes(&partitions),
            STORE_BYTES_PER_POST * 3 / 2
        );
        // The cap binds whatever is left.
        let capped = CatchUpWindow::new(1000);
        partitions[0].next.store(0, Ordering::Release);
        assert_eq!(capped.window_bytes(&partitions), 1000);
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
