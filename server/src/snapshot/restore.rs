//! The start-up restore: the newest usable snapshot of the directory is loaded into the store,
//! and its offsets are where Kafka resumes (see the wing's docs for which snapshot is usable).
//! A base file (format 3) is mapped and served from at once, and every record of it checked on
//! a thread of its own meanwhile ([`check_in_background`]); a snapshot of format 2 (written by
//! an older build) is rebuilt into the store as before.

use std::fs::{self, File};
use std::io::BufReader;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use thunder_engine::PostStore;
use thunder_engine::base::{BASE_FORMAT_VERSION, BasePages};
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
    let pages = if args.snapshot_base_huge_pages {
        BasePages::HugeCopy
    } else {
        BasePages::Mapped
    };
    Some(Box::new(move |start: &TopicStart| {
        restore(&dir, &store, &topic, max_age_secs, start, pages)
    }))
}

fn restore(
    dir: &Path,
    store: &Arc<PostStore>,
    topic: &str,
    max_age_secs: i64,
    start: &TopicStart,
    pages: BasePages,
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
        let loaded = if header.format_version == BASE_FORMAT_VERSION {
            load_base(&path, store, age_secs, pages)
        } else {
            load_snapshot(&path, store, age_secs)
        };
        match loaded {
            Ok(offsets) => return Some(offsets),
            Err(error) => {
                tracing::error!(path = %shown, %error, "snapshot skipped: invalid (nothing of it was loaded)");
            }
        }
    }
    tracing::warn!(dir = %dir.display(), "no usable snapshot; replaying the topic in full");
    None
}

/// What a start would find in the snapshot directory `dir`, for `--check-config`: warnings
/// about the newest snapshot's format (none when a start maps it as a base, or when there is
/// none yet) and about files a start set aside. The records are not read.
pub fn check_dir(dir: &Path) -> Vec<String> {
    let mut warnings = Vec::new();
    let Ok(files) = list(dir) else {
        return warnings;
    };
    if let Some(newest) = files.first() {
        let header = File::open(newest).map_err(|e| e.to_string()).and_then(|f| {
            read_header(&mut BufReader::new(f))
                .map(|(header, _)| header)
                .map_err(|e| e.to_string())
        });
        match header {
            Ok(header) if header.format_version == BASE_FORMAT_VERSION => {}
            Ok(header) => warnings.push(format!(
                "the newest snapshot {} is of format {} (an older build's): a start rebuilds \
                 the store from it (seconds per 10M posts) instead of mapping it; the next \
                 snapshot written is a base (format {BASE_FORMAT_VERSION})",
                newest.display(),
                header.format_version
            )),
            Err(error) => warnings.push(format!(
                "the newest snapshot {} cannot be loaded ({error}): a start skips it and falls \
                 back to the one before, or replays the topic in full",
                newest.display()
            )),
        }
    }
    let rejected = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .ends_with(".thsnap.rejected")
        })
        .count();
    if rejected > 0 {
        warnings.push(format!(
            "{rejected} snapshot file(s) in {} were set aside by a start (*.thsnap.rejected: \
             their checksums held but their records did not); keep one to report, then delete \
             them",
            dir.display()
        ));
    }
    warnings
}

/// Sets the start-up load's gauges: it took `took` and brought `posts` posts.
fn record_load(took: std::time::Duration, posts: u64) {
    let metrics = SnapshotMetrics::global();
    metrics.load_duration.set(took.as_secs_f64());
    metrics
        .loaded_posts
        .set(i64::try_from(posts).unwrap_or(i64::MAX));
}

/// Threads a load (or a check) runs on: every core.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Maps the base file at `path` under `store` (checksums and structure checked first), starts
/// the check of its records, and sets the base's metrics: the offsets Kafka resumes from.
fn load_base(
    path: &Path,
    store: &Arc<PostStore>,
    age_secs: i64,
    pages: BasePages,
) -> Result<Vec<PartitionOffset>, String> {
    let started = Instant::now();
    let file = File::open(path).map_err(|e| e.to_string())?;
    let report = store
        .load_base_file(&file, threads(), pages)
        .map_err(|e| e.to_string())?;
    let took = started.elapsed();
    record_load(took, report.posts);
    SnapshotMetrics::global().set_base(&report.header, report.bytes);
    tracing::info!(
        path = %path.display(),
        posts = report.posts,
        authors = report.authors,
        tombstones = report.tombstones_loaded,
        waiting = report.waiting_loaded,
        facts = report.facts_loaded,
        bytes = report.bytes,
        anonymous_bytes = report.anonymous_bytes,
        age_secs,
        took_secs = took.as_secs_f64(),
        map_secs = report.map_duration.as_secs_f64(),
        verify_secs = report.verify_duration.as_secs_f64(),
        restore_secs = report.restore_duration.as_secs_f64(),
        offsets = %crate::kafka::snapshot_offsets_text(&report.header.meta.offsets),
        "base mapped; Kafka resumes from its offsets"
    );
    check_in_background(path, &file, store);
    Ok(report.header.meta.offsets)
}

/// Checks every record of the base the store serves from, on a thread of its own at lowered
/// priority (about a second of CPU at 20M posts). A base that fails was made to pass its
/// checksums on purpose: it is set aside (renamed `*.rejected`, which no start loads again)
/// and the process exits with code 1, so that the supervisor's restart falls back to the
/// previous snapshot or a full replay. The shutdown snapshot is not written then.
fn check_in_background(path: &Path, file: &File, store: &Arc<PostStore>) {
    let (path, store) = (path.to_owned(), Arc::clone(store));
    let mapped = file.metadata().ok().map(|m| (m.dev(), m.ino()));
    let spawned = std::thread::Builder::new()
        .name("base-check".into())
        .spawn(move || {
            super::pacing::lower_current_thread_priority();
            let started = Instant::now();
            match store.check_base(threads()) {
                Ok(()) => {
                    SnapshotMetrics::global().base_checked.set(1);
                    tracing::info!(
                        path = %path.display(),
                        took_secs = started.elapsed().as_secs_f64(),
                        "every record of the base checked"
                    );
                }
                Err(error) => {
                    let rejected = path.with_extension("thsnap.rejected");
                    // Only the file mapped: a snapshot written since under the same name is
                    // another file.
                    let same =
                        std::fs::metadata(&path).is_ok_and(|m| Some((m.dev(), m.ino())) == mapped);
                    let renamed = same && std::fs::rename(&path, &rejected).is_ok();
                    tracing::error!(
                        path = %path.display(),
                        %error,
                        set_aside = %rejected.display(),
                        renamed,
                        "the base failed the check of its records although its checksums hold; \
                         exiting so that a restart falls back to the snapshot before it"
                    );
                    std::process::exit(1);
                }
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "cannot start the check of the base's records");
    }
}

/// Loads the snapshot (format 2) at `path` into `store`, rebuilding it: the offsets Kafka
/// resumes from.
fn load_snapshot(
    path: &Path,
    store: &PostStore,
    age_secs: i64,
) -> Result<Vec<PartitionOffset>, String> {
    let started = Instant::now();
    // Read in place through a mapping of the file (the posts are not copied out first).
    let file = File::open(path).map_err(|e| e.to_string())?;
    let report = store
        .load_snapshot_file(&file, threads())
        .map_err(|e| e.to_string())?;
    let took = started.elapsed();
    record_load(took, report.posts_loaded);
    tracing::info!(
        path = %path.display(),
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
    Ok(report.header.meta.offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::PartitionWatermarks;
    use std::fs;
    use thunder_engine::base::BaseInfo;
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
        let offsets =
            restore(dir.path(), &target, "t", 1000, &topic(0), BasePages::Mapped).expect("loaded");
        assert_eq!(offsets[0].next_offset, 60);
        assert_eq!(target.stats().posts, 20);

        // The newest is corrupt: the previous one is loaded, nothing of the bad one.
        let newest = &listed[0];
        let mut bytes = fs::read(newest).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        fs::write(newest, bytes).expect("corrupt");
        let target = store(&clock);
        let offsets =
            restore(dir.path(), &target, "t", 1000, &topic(0), BasePages::Mapped).expect("loaded");
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
                restore(
                    dir.path(),
                    &target,
                    topic_name,
                    max_age,
                    &topic(low),
                    BasePages::Mapped
                ),
                None,
                "{name}"
            );
            assert_eq!(target.stats().posts, 0, "{name}");
        }
    }

    /// A base file (what this build writes) is mapped, not rebuilt; a damaged one falls back
    /// to the snapshot before it, of the older format too; a file set aside is not listed.
    #[test]
    fn restore_maps_a_base_and_falls_back_from_a_damaged_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(ManualClock::new(NOW));
        write(dir.path(), 1000, 10, 40, &clock);
        let source = store(&clock);
        source.insert_posts(
            &(0..20)
                .map(|i| LightPost::original(i, i % 3, NOW - i))
                .collect::<Vec<_>>(),
        );
        let meta = SnapshotMeta {
            source: "t".into(),
            offsets: vec![PartitionOffset {
                partition: 0,
                next_offset: 60,
            }],
        };
        let mut bytes = Vec::new();
        source.write_base(&meta, &mut bytes).expect("write");
        let base = dir.path().join("snapshot-0000000002000.thsnap");
        fs::write(&base, &bytes).expect("file");

        let target = store(&clock);
        let offsets =
            restore(dir.path(), &target, "t", 1000, &topic(0), BasePages::Mapped).expect("loaded");
        assert_eq!(offsets[0].next_offset, 60);
        assert_eq!(check_dir(dir.path()), Vec::<String>::new());
        let info = target.base_info().expect("served from the base");
        assert_eq!((info.posts, info.stored_posts), (20, 20));
        assert_eq!(target.stats().posts, 20);
        // --snapshot-base-huge-pages: the same base copied into huge-page memory (or mapped,
        // without huge pages to be had) serves the same store.
        let copied = store(&clock);
        let offsets = restore(
            dir.path(),
            &copied,
            "t",
            1000,
            &topic(0),
            BasePages::HugeCopy,
        )
        .expect("loaded");
        assert_eq!(offsets[0].next_offset, 60);
        let (copied_info, mapped_info) = (copied.base_info().expect("a base"), info.clone());
        assert!(
            copied_info.anonymous_bytes >= copied_info.bytes,
            "the file copied into anonymous memory: {copied_info:?}"
        );
        assert!(
            mapped_info.anonymous_bytes < mapped_info.bytes,
            "{mapped_info:?}"
        );
        assert_eq!(
            BaseInfo {
                anonymous_bytes: 0,
                ..copied_info
            },
            BaseInfo {
                anonymous_bytes: 0,
                ..mapped_info
            }
        );
        let same_but_memory = |store: &PostStore| thunder_engine::StoreStats {
            base_anonymous_bytes: 0,
            ..store.stats()
        };
        assert_eq!(same_but_memory(&copied), same_but_memory(&target));

        // Replaced (a new file renamed over it), never written in place: the store above
        // still maps it.
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        let damaged = dir.path().join("damaged.tmp");
        fs::write(&damaged, &bytes).expect("corrupt");
        fs::rename(&damaged, &base).expect("replace");
        let target = store(&clock);
        let offsets =
            restore(dir.path(), &target, "t", 1000, &topic(0), BasePages::Mapped).expect("loaded");
        assert_eq!(offsets[0].next_offset, 40);
        assert_eq!(target.base_info(), None, "the older snapshot is rebuilt");
        assert_eq!(target.stats().posts, 10);

        let garbage = dir.path().join("snapshot-0000000003000.thsnap");
        fs::write(&garbage, b"not a snapshot").expect("garbage");
        let warnings = check_dir(dir.path());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("cannot be loaded"), "{warnings:?}");
        fs::remove_file(&garbage).expect("remove");

        fs::rename(&base, base.with_extension("thsnap.rejected")).expect("set aside");
        assert_eq!(list(dir.path()).expect("list").len(), 1);
        let warnings = check_dir(dir.path());
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("of format 2"), "{warnings:?}");
        assert!(warnings[1].contains("set aside"), "{warnings:?}");
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
                restore(dir.path(), &target, "t", 1000, &topic(0), BasePages::Mapped),
                None,
                "{other:?}"
            );
            assert_eq!(target.stats().posts, 0, "{other:?}");
        }
        let target = on_clock(Some(spec));
        let offsets =
            restore(dir.path(), &target, "t", 1000, &topic(0), BasePages::Mapped).expect("loaded");
        assert_eq!(offsets[0].next_offset, 9);
        assert_eq!(target.stats().posts, source.stats().posts);
        assert!(target.stats().posts > 0 && target.stats().posts < 50);
        let facts = |store: &PostStore| store.directory_stats().map(|s| s.facts);
        assert_eq!(facts(&target), facts(&source));
        assert!(facts(&target) > Some(0));
    }
}
