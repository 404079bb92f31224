//! Snapshots in the server: `--snapshot-dir` and friends, the writer (every
//! `--snapshot-interval-secs`, on `POST /admin/snapshot`, and once at graceful shutdown) and the
//! start-up restore that lets Kafka resume from the recorded offsets.
//!
//! A snapshot (format in `thunder_engine::snapshot`) is written to `snapshot-<unix ms>.thsnap.tmp`
//! in the directory, fsynced, renamed to `snapshot-<unix ms>.thsnap` and the directory fsynced;
//! then all but the two newest are deleted. The per-partition offsets are read *before* the
//! scan, so replaying from them makes the fuzzy snapshot exact. The writer runs on a thread of
//! its own at a lowered CPU priority, paced to `--snapshot-max-mib-per-sec`.
//!
//! At start-up ([`restorer`], run by the Kafka supervisor once the topic's watermarks are
//! known) the newest snapshot that is valid, compatible, not older than
//! `--snapshot-max-age-secs` and written for this topic and this `--shard` (or none) is
//! loaded; the others are reported and skipped. Loading verifies the whole file before it touches the store, so a bad file falls
//! back to the previous snapshot, or to a full replay, and partial data is never served. If the
//! retained log no longer reaches the recorded offsets, nothing is loaded and the topic is
//! replayed in full (with a warning).

use std::fs::{self, File};
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::IntoResponse;
use thunder_engine::PostStore;
use thunder_engine::snapshot::{
    PartitionOffset, SnapshotMeta, SnapshotSummary, check_shard, read_header,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::error::StartupError;
use crate::kafka::{AppliedOffsets, Restore, TopicStart};
use crate::metrics::Metrics;
use crate::snapshot_pacing::{Paced, lower_current_thread_priority};

/// Snapshots kept in the directory (the newest, and the one before in case it is bad).
pub const KEEP: usize = 2;
const EXTENSION: &str = "thsnap";

/// Snapshot flags; every flag also reads a `THUNDER_*` environment variable.
#[derive(clap::Args, Clone, Debug)]
pub struct SnapshotArgs {
    /// Directory of snapshots: one is written every --snapshot-interval-secs, one at graceful
    /// shutdown and one on `POST /admin/snapshot`; at start-up the newest valid one is loaded
    /// and Kafka resumes from its offsets. Needs Kafka (refused in demo mode).
    #[arg(long, env = "THUNDER_SNAPSHOT_DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// Seconds between two snapshots (0: only at shutdown and on demand).
    #[arg(long, env = "THUNDER_SNAPSHOT_INTERVAL_SECS", default_value_t = 300)]
    pub snapshot_interval_secs: u64,
    /// Write pace of the periodic and on-demand snapshots, MiB/s (0: no limit), so a snapshot
    /// never takes a whole core or the disk from serving. The shutdown snapshot is not paced.
    #[arg(long, env = "THUNDER_SNAPSHOT_MAX_MIB_PER_SEC", default_value_t = 256)]
    pub snapshot_max_mib_per_sec: u64,
    /// A snapshot older than this is not loaded (default: the post retention, beyond which it
    /// holds nothing alive).
    #[arg(long, env = "THUNDER_SNAPSHOT_MAX_AGE_SECS")]
    pub snapshot_max_age_secs: Option<u64>,
}

/// Refuses `--snapshot-dir` in demo mode: a snapshot resumes from Kafka offsets, and the demo
/// source has none.
pub fn check_mode(snapshot_dir: Option<&Path>, demo_mode: bool) -> Result<(), StartupError> {
    match snapshot_dir {
        Some(dir) if demo_mode => Err(StartupError::Config(format!(
            "--snapshot-dir {} needs Kafka (--kafka-brokers): a snapshot is resumed from the Kafka offsets it records, and demo mode has none",
            dir.display()
        ))),
        _ => Ok(()),
    }
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// The snapshot files in `dir`, newest first (by the time in their name).
pub fn list(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let path = entry.path();
            let name = path.file_name()?.to_str()?;
            let millis = name
                .strip_prefix("snapshot-")?
                .strip_suffix(&format!(".{EXTENSION}"))?
                .parse()
                .ok()?;
            Some((millis, path))
        })
        .collect();
    found.sort_unstable_by_key(|(millis, _)| std::cmp::Reverse(*millis));
    Ok(found.into_iter().map(|(_, path)| path).collect())
}

/// Why a snapshot was not written.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    /// Another snapshot is being written.
    #[error("a snapshot is already being written")]
    Busy,
    /// Ingestion has not started yet (no offsets to record).
    #[error("ingestion has not started: no offsets to record yet")]
    NotReady,
    /// Writing failed; the temporary file was removed.
    #[error("snapshot failed: {0}")]
    Failed(String),
}

/// Writes snapshots of one store into one directory.
#[derive(Debug)]
pub struct Snapshots {
    dir: PathBuf,
    store: Arc<PostStore>,
    source: String,
    offsets: AppliedOffsets,
    pace_bytes_per_sec: u64,
    interval: Duration,
    busy: Mutex<()>,
}

/// Where `POST /admin/snapshot` sends its requests (set once, when snapshots are on).
static ADMIN: OnceLock<Arc<Snapshots>> = OnceLock::new();

impl Snapshots {
    /// Snapshots of `store` fed from Kafka topic `source` into `args.snapshot_dir` (created if
    /// missing; leftover temporary files of an interrupted write are removed). Registers the
    /// admin endpoint's target. `None` without `--snapshot-dir`.
    pub fn new(
        args: &SnapshotArgs,
        store: Arc<PostStore>,
        source: &str,
        offsets: AppliedOffsets,
    ) -> Result<Option<Arc<Self>>, StartupError> {
        let Some(dir) = &args.snapshot_dir else {
            return Ok(None);
        };
        fs::create_dir_all(dir)
            .map_err(|e| StartupError::Config(format!("--snapshot-dir {}: {e}", dir.display())))?;
        if let Ok(entries) = fs::read_dir(dir) {
            for path in entries.filter_map(Result::ok).map(|e| e.path()) {
                if path.to_str().is_some_and(|p| p.ends_with(".thsnap.tmp")) {
                    tracing::info!(path = %path.display(), "removing an interrupted snapshot");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        let snapshots = Arc::new(Self {
            dir: dir.clone(),
            store,
            source: source.to_owned(),
            offsets,
            pace_bytes_per_sec: args.snapshot_max_mib_per_sec.saturating_mul(1 << 20),
            interval: Duration::from_secs(args.snapshot_interval_secs),
            busy: Mutex::new(()),
        });
        let _ = ADMIN.set(Arc::clone(&snapshots));
        Ok(Some(snapshots))
    }

    /// Writes one snapshot now, on the calling thread (blocking), paced unless `unpaced`.
    pub fn take(&self, unpaced: bool) -> Result<(PathBuf, SnapshotSummary), TakeError> {
        let _writing = match self.busy.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(TakeError::Busy),
        };
        // The offsets before the scan: replaying from them makes the snapshot exact.
        let offsets = self.offsets.get().ok_or(TakeError::NotReady)?;
        let metrics = &Metrics::global().snapshot;
        let name = format!("snapshot-{:013}.{EXTENSION}", unix_now().as_millis());
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let pace = if unpaced { 0 } else { self.pace_bytes_per_sec };
        match self.write(&tmp, &path, offsets, pace) {
            Ok(summary) => {
                metrics.last_success.set(unix_now().as_secs_f64());
                metrics.last_duration.set(summary.duration.as_secs_f64());
                metrics
                    .last_bytes
                    .set(i64::try_from(summary.counts.bytes).unwrap_or(i64::MAX));
                metrics
                    .last_posts
                    .set(i64::try_from(summary.counts.posts).unwrap_or(i64::MAX));
                tracing::info!(
                    path = %path.display(),
                    posts = summary.counts.posts,
                    tombstones = summary.counts.tombstones,
                    bytes = summary.counts.bytes,
                    took_secs = summary.duration.as_secs_f64(),
                    offsets = ?summary.header.meta.offsets,
                    "snapshot written"
                );
                self.prune();
                Ok((path, summary))
            }
            Err(error) => {
                metrics.failures.inc();
                let _ = fs::remove_file(&tmp);
                tracing::error!(dir = %self.dir.display(), %error, "snapshot failed");
                Err(TakeError::Failed(error))
            }
        }
    }

    fn write(
        &self,
        tmp: &Path,
        path: &Path,
        offsets: Vec<PartitionOffset>,
        pace: u64,
    ) -> Result<SnapshotSummary, String> {
        let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", tmp.display());
        let file = File::create(tmp).map_err(|e| io("creating", e))?;
        let mut out = Paced::new(BufWriter::with_capacity(1 << 20, file), pace);
        let meta = SnapshotMeta {
            source: self.source.clone(),
            offsets,
        };
        let summary = self
            .store
            .write_snapshot(&meta, &mut out)
            .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        let file = out
            .into_inner()
            .into_inner()
            .map_err(|e| io("flushing", e.into_error()))?;
        file.sync_all().map_err(|e| io("syncing", e))?;
        drop(file);
        fs::rename(tmp, path).map_err(|e| io("renaming", e))?;
        // The rename is durable once the directory is.
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("syncing {}: {e}", self.dir.display()))?;
        Ok(summary)
    }

    /// Deletes all but the [`KEEP`] newest snapshots.
    fn prune(&self) {
        match list(&self.dir) {
            Ok(files) => {
                for old in files.iter().skip(KEEP) {
                    if let Err(error) = fs::remove_file(old) {
                        tracing::warn!(path = %old.display(), %error, "cannot delete an old snapshot");
                    }
                }
            }
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "cannot list snapshots")
            }
        }
    }

    /// [`take`](Self::take) on a thread of its own at lowered CPU priority; waits for it.
    pub async fn take_in_background(
        self: &Arc<Self>,
        unpaced: bool,
    ) -> Result<(PathBuf, SnapshotSummary), TakeError> {
        let (done, result) = oneshot::channel();
        let snapshots = Arc::clone(self);
        std::thread::Builder::new()
            .name("snapshot".into())
            .spawn(move || {
                lower_current_thread_priority();
                let _ = done.send(snapshots.take(unpaced));
            })
            .map_err(|e| TakeError::Failed(format!("cannot start the snapshot thread: {e}")))?;
        result
            .await
            .map_err(|_| TakeError::Failed("the snapshot thread died".into()))?
    }

    /// Takes a snapshot every `--snapshot-interval-secs` until `stop` turns true (nothing with
    /// an interval of 0).
    pub fn schedule(self: &Arc<Self>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let snapshots = Arc::clone(self);
        tokio::spawn(async move {
            if snapshots.interval.is_zero() {
                return;
            }
            let mut ticks = tokio::time::interval(snapshots.interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                tokio::select! {
                    _ = ticks.tick() => {
                        // Failures are logged and counted inside.
                        let _ = snapshots.take_in_background(false).await;
                    }
                    changed = stop.changed() => {
                        if changed.is_err() || *stop.borrow() {
                            return;
                        }
                    }
                }
            }
        })
    }
}

/// `POST /admin/snapshot`: writes a snapshot now and answers with its path and counts (200),
/// or 404 without `--snapshot-dir`, 409 while another is being written, 503 before ingestion
/// has started, 500 if it failed.
pub async fn admin_snapshot() -> impl IntoResponse {
    let Some(snapshots) = ADMIN.get() else {
        return (
            StatusCode::NOT_FOUND,
            "snapshots are off (no --snapshot-dir)\n".to_owned(),
        );
    };
    match snapshots.take_in_background(false).await {
        Ok((path, summary)) => (
            StatusCode::OK,
            format!(
                "{}\n",
                serde_json::json!({
                    "path": path.display().to_string(),
                    "posts": summary.counts.posts,
                    "tombstones": summary.counts.tombstones,
                    "bytes": summary.counts.bytes,
                    "duration_secs": summary.duration.as_secs_f64(),
                    "offsets": summary.header.meta.offsets.iter()
                        .map(|o| (o.partition, o.next_offset)).collect::<Vec<_>>(),
                })
            ),
        ),
        Err(error @ TakeError::Busy) => (StatusCode::CONFLICT, format!("{error}\n")),
        Err(error @ TakeError::NotReady) => (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")),
    }
}

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
        if let Err(error) = check_shard(header.shard, store) {
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
                let metrics = &Metrics::global().snapshot;
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
                    offsets = ?report.header.meta.offsets,
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

/// Holds the running snapshot schedule; [`shutdown`](Self::shutdown) stops it and writes the
/// final snapshot.
#[derive(Debug)]
pub struct SnapshotTask {
    snapshots: Arc<Snapshots>,
    stop: watch::Sender<bool>,
    schedule: JoinHandle<()>,
}

impl SnapshotTask {
    /// Starts the periodic snapshots.
    pub fn start(snapshots: Arc<Snapshots>) -> Self {
        let (stop, stopped) = watch::channel(false);
        let schedule = snapshots.schedule(stopped);
        Self {
            snapshots,
            stop,
            schedule,
        }
    }

    /// Stops the schedule (letting a running snapshot finish) and writes the final snapshot,
    /// unpaced. Call it after ingestion has stopped, so its offsets are exact.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.schedule.await;
        // A snapshot on demand may still run: wait for it rather than skip the final one.
        loop {
            match self.snapshots.take_in_background(true).await {
                Err(TakeError::Busy) => tokio::time::sleep(Duration::from_millis(50)).await,
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::PartitionWatermarks;
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
    fn demo_mode_refuses_a_snapshot_dir() {
        let dir = PathBuf::from("/var/snapshots");
        let error = check_mode(Some(&dir), true).expect_err("refused");
        assert!(error.to_string().contains("needs Kafka"), "{error}");
        assert!(check_mode(Some(&dir), false).is_ok());
        assert!(check_mode(None, true).is_ok());
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

    #[test]
    fn take_writes_atomically_and_keeps_two() {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(ManualClock::new(NOW));
        let source = store(&clock);
        source.insert_posts(&[LightPost::original(1, 1, NOW)]);
        let offsets = crate::kafka::AppliedOffsets::fixed(vec![PartitionOffset {
            partition: 0,
            next_offset: 7,
        }]);
        let args = SnapshotArgs {
            snapshot_dir: Some(dir.path().to_owned()),
            snapshot_interval_secs: 0,
            snapshot_max_mib_per_sec: 0,
            snapshot_max_age_secs: None,
        };
        let snapshots = Snapshots::new(&args, source, "t", offsets)
            .expect("dir")
            .expect("on");
        for _ in 0..4 {
            let (path, summary) = snapshots.take(false).expect("taken");
            assert_eq!(summary.counts.posts, 1);
            assert!(path.exists());
            std::thread::sleep(Duration::from_millis(2));
        }
        let files: Vec<_> = fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(files.len(), KEEP, "{files:?}");
        let newest = &list(dir.path()).expect("list")[0];
        let (header, counts) =
            thunder_engine::snapshot::verify(File::open(newest).expect("open")).expect("valid");
        assert_eq!(header.meta.offsets[0].next_offset, 7);
        assert_eq!(counts.posts, 1);
    }
}
