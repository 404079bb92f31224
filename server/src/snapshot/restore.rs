//! The start-up restore: the newest usable snapshot of the directory is loaded into the store,
//! and its offsets are where Kafka resumes (see the wing's docs for which snapshot is usable).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use thunder_engine::PostStore;
use thunder_engine::snapshot::{PartitionOffset, read_header};

use super::{SnapshotArgs, list};
use crate::kafka::{Restore, TopicStart};
use crate::snapshot::metrics::SnapshotMetrics;

/// The start-up restore handed to the Kafka supervisor (see the module docs). `None` without
/// `--snapshot-dir`.
pub fn restorer(args: &SnapshotArgs, store: Arc<PostStore>, topic: &str) -> Option<Restore> {
    let dir = args.snapshot_dir.clone()?;
    let max_age_secs = args
        .snapshot_max_age_secs
        .map_or(store.retention_secs(), |secs| {
            i64::try_from(secs).unwrap_or(i64::MAX)
        });
    let topic = topic.to_owned();
    Some(Box::new(move |start: &TopicStart| {
        restore(&dir, &store, &topic, max_age_secs, start)
    }))
}

fn restore(
    dir: &Path,
    store: &PostStore,
    topic: &str,
    max_age_secs: i64,
    start: &TopicStart,
) -> Option<Vec<PartitionOffset>> {
    let files = match list(dir) {
        Ok(files) => files,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot list snapshots; replaying the topic in full");
            return None;
        }
    };
    if files.is_empty() {
        tracing::info!(dir = %dir.display(), "no snapshot yet; replaying the topic in full");
        return None;
    }
    for path in files {
        let shown = path.display().to_string();
        let header = File::open(&path).map_err(|e| e.to_string()).and_then(|f| {
            read_header(&mut BufReader::new(f))
                .map(|(header, _)| header)
                .map_err(|e| e.to_string())
        });
        let header = match header {
            Ok(header) => header,
            Err(error) => {
                tracing::error!(path = %shown, %error, "snapshot skipped: unreadable");
                continue;
            }
        };
        if header.meta.source != topic {
            tracing::error!(path = %shown, written_for = %header.meta.source, topic, "snapshot skipped: written for another topic");
            continue;
        }
        if let Err(error) = store.check_snapshot_shard(header.shard) {
            tracing::error!(path = %shown, %error, "snapshot skipped: written for another author shard (--shard)");
            continue;
        }
        let age_secs = store.now_secs().saturating_sub(header.created_at_secs);
        if age_secs > max_age_secs {
            tracing::warn!(path = %shown, age_secs, max_age_secs, "snapshot skipped: too old");
            continue;
        }
        if let Some(gap) = start.gap(&header.meta.offsets) {
            tracing::warn!(path = %shown, %gap, "the retained log no longer continues the snapshot; replaying the topic in full");
            return None;
        }
        let started = Instant::now();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        // Read in place through a mapping of the file (the posts are not copied out first).
        let loaded = File::open(&path).map_err(|e| e.to_string()).and_then(|f| {
            store
                .load_snapshot_file(&f, threads)
                .map_err(|e| e.to_string())
        });
        match loaded {
            Ok(report) => {
                let took = started.elapsed();
                let metrics = SnapshotMetrics::global();
                metrics.load_duration.set(took.as_secs_f64());
                metrics
                    .loaded_posts
                    .set(i64::try_from(report.posts_loaded).unwrap_or(i64::MAX));
                tracing::info!(
                    path = %shown,
                    posts = report.posts_loaded,
                    posts_skipped = report.posts_skipped,
                    tombstones = report.tombstones_loaded,
                    facts = report.facts_loaded,
                    age_secs,
                    took_secs = took.as_secs_f64(),
                    read_secs = report.read_duration.as_secs_f64(),
                    rebuilt = report
                        .per_post_reason
                        .map_or("in bulk", |reason| reason.as_str()),
                    offsets = %crate::kafka::snapshot_offsets_text(&report.header.meta.offsets),
                    "snapshot loaded; Kafka resumes from its offsets"
                );
                return Some(report.header.meta.offsets);
            }
            Err(error) => {
                tracing::error!(path = %shown, %error, "snapshot skipped: invalid (nothing of it was loaded)");
            }
        }
    }
    tracing::warn!(dir = %dir.display(), "no usable snapshot; replaying the topic in full");
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::PartitionWatermarks;
    use std::fs;
    use thunder_engine::snapshot::SnapshotMeta;
    use thunder_engine::{LightPost, ManualClock};

    const NOW: i64 = 1_700_000_000;

    fn store(clock: &Arc<ManualClock>) -> Arc<PostStore> {
        Arc::new(PostStore::with_clock(1000, Arc::clone(clock) as _))
    }

    fn topic(low: i64) -> TopicStart {
        TopicStart {
            topic: "t".into(),
            partitions: vec![PartitionWatermarks {
                partition: 0,
                low,
                high: 100,
            }],
        }
    }

    /// Writes a snapshot of `posts` posts recorded at offset `offset` as `snapshot-<millis>`.
    fn write(dir: &Path, millis: u64, posts: i64, offset: i64, clock: &Arc<ManualClock>) {
        write_from(dir, millis, &store(clock), (posts, 3), offset);
    }

    /// [`write`] from `source`, after inserting `posts.0` posts of `posts.1` authors into it.
    fn write_from(dir: &Path, millis: u64, source: &PostStore, posts: (i64, i64), offset: i64) {
        let (posts, authors) = posts;
        let batch: Vec<LightPost> = (0..posts)
            .map(|i| LightPost::original(i, i % authors, NOW - i))
            .collect();
        source.insert_posts(&batch);
        let meta = SnapshotMeta {
            source: "t".into(),
            offsets: vec![PartitionOffset {
                partition: 0,
                next_offset: offset,
            }],
        };
        let mut bytes = Vec::new();
        source.write_snapshot(&meta, &mut bytes).expect("write");
        fs::write(dir.join(format!("snapshot-{millis:013}.thsnap")), bytes).expect("file");
    }

    #[test]
    fn restore_loads_the_newest_valid_snapshot_and_skips_bad_ones() {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(ManualClock::new(NOW));
        write(dir.path(), 1000, 10, 40, &clock);
        write(dir.path(), 2000, 20, 60, &clock);
        let listed = list(dir.path()).expect("list");
        assert!(listed[0].ends_with("snapshot-0000000002000.thsnap"));

        let target = store(&clock);
        let offsets = restore(dir.path(), &target, "t", 1000, &topic(0)).expect("loaded");
        assert_eq!(offsets[0].next_offset, 60);
        assert_eq!(target.stats().posts, 20);

        // The newest is corrupt: the previous one is loaded, nothing of the bad one.
        let newest = &listed[0];
        let mut bytes = fs::read(newest).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        fs::write(newest, bytes).expect("corrupt");
        let target = store(&clock);
        let offsets = restore(dir.path(), &target, "t", 1000, &topic(0)).expect("loaded");
        assert_eq!(offsets[0].next_offset, 40);
        assert_eq!(target.stats().posts, 10);

        // Another topic, too old, or a log that no longer reaches the offsets: nothing loaded.
        for (name, topic_name, max_age, low) in [
            ("topic", "other", 1000, 0),
            ("age", "t", 0, 0),
            ("gap", "t", 1000, 41),
        ] {
            clock.set(NOW + 1);
            let target = store(&clock);
            assert_eq!(
                restore(dir.path(), &target, topic_name, max_age, &topic(low)),
                None,
                "{name}"
            );
            assert_eq!(target.stats().posts, 0, "{name}");
        }
    }

    /// A shard restores only a snapshot its own `--shard` wrote: its posts and its facts of
    /// the other shards' posts come back; another shard, or a full replica, skips it.
    #[test]
    fn restore_skips_a_snapshot_of_another_shard() {
        use thunder_proto::shard::ShardSpec;
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(ManualClock::new(NOW));
        let on_clock = |shard: Option<ShardSpec>| {
            let store = PostStore::with_clock(1000, Arc::clone(&clock) as _);
            Arc::new(match shard {
                None => store,
                Some(spec) => store.with_author_shard(
                    thunder_engine::ShardId {
                        index: spec.index,
                        count: spec.count,
                    },
                    move |author| spec.owns(author),
                ),
            })
        };
        let spec = ShardSpec { index: 0, count: 2 };
        let source = on_clock(Some(spec));
        write_from(dir.path(), 1000, &source, (50, 50), 9);

        for other in [Some(ShardSpec { index: 1, count: 2 }), None] {
            let target = on_clock(other);
            assert_eq!(
                restore(dir.path(), &target, "t", 1000, &topic(0)),
                None,
                "{other:?}"
            );
            assert_eq!(target.stats().posts, 0, "{other:?}");
        }
        let target = on_clock(Some(spec));
        let offsets = restore(dir.path(), &target, "t", 1000, &topic(0)).expect("loaded");
        assert_eq!(offsets[0].next_offset, 9);
        assert_eq!(target.stats().posts, source.stats().posts);
        assert!(target.stats().posts > 0 && target.stats().posts < 50);
        let facts = |store: &PostStore| store.directory_stats().map(|s| s.facts);
        assert_eq!(facts(&target), facts(&source));
        assert!(facts(&target) > Some(0));
    }
}
