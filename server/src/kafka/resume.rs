//! Resuming from a snapshot: the applied offsets a snapshot records, and the start positions
//! ingestion takes from a loaded one.
//!
//! A snapshot is taken with the per-partition offsets applied *before* its scan started
//! ([`AppliedOffsets`]). At start-up the supervisor reads the topic's partitions and
//! watermarks, hands them to a [`Restore`] (which loads a snapshot if one fits, see the
//! server's snapshot wing, [`crate::snapshot`]) and assigns every partition the snapshot covers
//! at its recorded offset; the others start as they would without a snapshot.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rdkafka::Offset;
use thunder_engine::snapshot::PartitionOffset;

use super::progress::Shared;

/// Per-partition offsets as a log field reads them: `partition:offset` pairs separated by
/// spaces, `0:1200 1:980` (the next offset to apply of a snapshot, the end of a catch-up).
pub fn offsets_text(offsets: impl IntoIterator<Item = (i32, i64)>) -> String {
    offsets
        .into_iter()
        .map(|(partition, offset)| format!("{partition}:{offset}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// [`offsets_text`] of the offsets a snapshot records.
pub fn snapshot_offsets_text(offsets: &[PartitionOffset]) -> String {
    offsets_text(offsets.iter().map(|o| (o.partition, o.next_offset)))
}

/// Called once by the supervisor with the topic's partitions and watermarks: loads a snapshot
/// into the store and returns its offsets, or returns `None` (nothing loaded: replay).
pub type Restore = Box<dyn FnOnce(&TopicStart) -> Option<Vec<PartitionOffset>> + Send>;

/// One partition's watermarks when ingestion starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionWatermarks {
    /// Kafka partition id.
    pub partition: i32,
    /// First offset still in the log.
    pub low: i64,
    /// Offset the next record will get.
    pub high: i64,
}

/// The topic as ingestion finds it at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicStart {
    /// The topic name.
    pub topic: String,
    /// Every partition, sorted by id.
    pub partitions: Vec<PartitionWatermarks>,
}

impl TopicStart {
    pub(super) fn new(topic: &str, partitions: &[i32], watermarks: &[(i64, i64)]) -> Self {
        Self {
            topic: topic.to_owned(),
            partitions: partitions
                .iter()
                .zip(watermarks)
                .map(|(&partition, &(low, high))| PartitionWatermarks {
                    partition,
                    low,
                    high,
                })
                .collect(),
        }
    }

    /// Why the log cannot continue a snapshot taken at `offsets`, if it cannot: a recorded
    /// partition the topic lacks, an offset the retained log no longer reaches (low watermark
    /// above it: records in between are gone), or one past the end (the topic was recreated).
    pub fn gap(&self, offsets: &[PartitionOffset]) -> Option<String> {
        offsets.iter().find_map(|recorded| {
            let Some(now) = self
                .partitions
                .iter()
                .find(|p| p.partition == recorded.partition)
            else {
                return Some(format!(
                    "partition {} is no longer in topic {}",
                    recorded.partition, self.topic
                ));
            };
            let next = recorded.next_offset.max(0);
            if recorded.next_offset >= 0 && now.low > next {
                Some(format!(
                    "partition {} starts at offset {} now, after the recorded offset {next}: the records in between were deleted",
                    recorded.partition, now.low
                ))
            } else if recorded.next_offset < 0 && now.low > 0 {
                Some(format!(
                    "partition {} had nothing applied when the snapshot was taken and its log now starts at offset {}",
                    recorded.partition, now.low
                ))
            } else if next > now.high {
                Some(format!(
                    "partition {} ends at offset {}, before the recorded offset {next} (was the topic recreated?)",
                    recorded.partition, now.high
                ))
            } else {
                None
            }
        })
    }

    /// The start positions with every recorded partition resumed at its offset.
    pub(super) fn resume_starts(
        &self,
        starts: &[Offset],
        offsets: &[PartitionOffset],
    ) -> Vec<Offset> {
        self.partitions
            .iter()
            .zip(starts)
            .map(
                |(p, &start)| match offsets.iter().find(|o| o.partition == p.partition) {
                    Some(o) if o.next_offset >= 0 => Offset::Offset(o.next_offset),
                    Some(_) => Offset::Beginning,
                    None => start,
                },
            )
            .collect()
    }
}

/// Reads the offsets ingestion has applied, for snapshots; stays usable after
/// [`KafkaIngest::shutdown`](super::KafkaIngest::shutdown).
#[derive(Clone)]
pub struct AppliedOffsets(Source);

#[derive(Clone)]
enum Source {
    Ingest(Arc<Shared>),
    Fixed(Vec<PartitionOffset>),
}

impl std::fmt::Debug for AppliedOffsets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AppliedOffsets").field(&self.get()).finish()
    }
}

impl AppliedOffsets {
    pub(super) fn of(shared: Arc<Shared>) -> Self {
        Self(Source::Ingest(shared))
    }

    /// Offsets that never move (for tests and tools that snapshot a store fed otherwise).
    pub fn fixed(offsets: Vec<PartitionOffset>) -> Self {
        Self(Source::Fixed(offsets))
    }

    /// Per partition, the next offset to apply: every record before it has been applied to the
    /// store and is visible to a scan started after this call. `None` until the partitions are
    /// known.
    pub fn get(&self) -> Option<Vec<PartitionOffset>> {
        let shared = match &self.0 {
            Source::Ingest(shared) => shared,
            Source::Fixed(offsets) => return Some(offsets.clone()),
        };
        let states = shared.partitions.get()?;
        Some(
            states
                .iter()
                .map(|state| {
                    // Acquire pairs with the Release store in the ingest thread's `publish`.
                    let next = state.next.load(Ordering::Acquire);
                    PartitionOffset {
                        partition: state.partition,
                        // Started "from the end" and read nothing yet: everything before the
                        // end at start was skipped on purpose.
                        next_offset: if next == i64::MAX {
                            state.end_at_start
                        } else {
                            next
                        },
                    }
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_read_as_partition_offset_pairs() {
        let recorded = [
            PartitionOffset {
                partition: 0,
                next_offset: 1200,
            },
            PartitionOffset {
                partition: 1,
                next_offset: -1,
            },
        ];
        assert_eq!(snapshot_offsets_text(&recorded), "0:1200 1:-1");
        assert_eq!(offsets_text([]), "");
    }

    fn topic() -> TopicStart {
        TopicStart::new("t", &[0, 1], &[(0, 100), (50, 80)])
    }

    fn at(partition: i32, next_offset: i64) -> PartitionOffset {
        PartitionOffset {
            partition,
            next_offset,
        }
    }

    #[test]
    fn reachable_offsets_resume_there() {
        let t = topic();
        let offsets = [at(0, 40), at(1, 50)];
        assert_eq!(t.gap(&offsets), None);
        assert_eq!(t.gap(&[at(0, -1), at(1, 80)]), None);
        assert_eq!(
            t.resume_starts(&[Offset::Beginning, Offset::Beginning], &[at(0, 40)]),
            vec![Offset::Offset(40), Offset::Beginning]
        );
        assert_eq!(
            t.resume_starts(&[Offset::End, Offset::End], &[at(0, -1), at(1, 60)]),
            vec![Offset::Beginning, Offset::Offset(60)]
        );
    }

    #[test]
    fn unreachable_offsets_are_a_gap() {
        let t = topic();
        let gap = t.gap(&[at(0, 10), at(1, 49)]).expect("49 was deleted");
        assert!(gap.contains("partition 1 starts at offset 50"), "{gap}");
        assert!(
            t.gap(&[at(1, -1)]).is_some(),
            "nothing applied, log truncated"
        );
        assert!(
            t.gap(&[at(0, 101)])
                .expect("past the end")
                .contains("recreated")
        );
        assert!(t.gap(&[at(7, 0)]).expect("gone").contains("no longer"));
    }
}
