//! The snapshot writer: [`Snapshots`] writes one store into the directory (see the wing's
//! docs for the steps), on the schedule that [`SnapshotTask`] runs, on `POST /admin/snapshot`
//! ([`admin_snapshot`]) and once at graceful shutdown.

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use thunder_engine::PostStore;
use thunder_engine::base_io::BaseSummary;
use thunder_engine::snapshot::{PartitionOffset, SnapshotMeta};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::pacing::{Paced, lower_current_thread_priority};
use super::{EXTENSION, KEEP, SnapshotArgs, list, unix_now};
use crate::error::StartupError;
use crate::kafka::AppliedOffsets;
use crate::snapshot::metrics::SnapshotMetrics;

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
    pub fn take(&self, unpaced: bool) -> Result<(PathBuf, BaseSummary), TakeError> {
        let _writing = match self.busy.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(TakeError::Busy),
        };
        // The offsets before the scan: replaying from them makes the snapshot exact.
        let offsets = self.offsets.get().ok_or(TakeError::NotReady)?;
        let metrics = SnapshotMetrics::global();
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
                    authors = summary.counts.authors,
                    tombstones = summary.counts.tombstones,
                    bytes = summary.counts.bytes,
                    took_secs = summary.duration.as_secs_f64(),
                    offsets = %crate::kafka::snapshot_offsets_text(&summary.header.meta.offsets),
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
    ) -> Result<BaseSummary, String> {
        let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", tmp.display());
        let file = File::create(tmp).map_err(|e| io("creating", e))?;
        let mut out = Paced::new(BufWriter::with_capacity(1 << 20, file), pace);
        let meta = SnapshotMeta {
            source: self.source.clone(),
            offsets,
        };
        let summary = self
            .store
            .write_base(&meta, &mut out)
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
    ) -> Result<(PathBuf, BaseSummary), TakeError> {
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
    use thunder_engine::{LightPost, ManualClock};

    const NOW: i64 = 1_700_000_000;

    fn store(clock: &Arc<ManualClock>) -> Arc<PostStore> {
        Arc::new(PostStore::with_clock(1000, Arc::clone(clock) as _))
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
            snapshot_base_huge_pages: false,
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
        let newest = fs::read(&list(dir.path()).expect("list")[0]).expect("read");
        let contents = thunder_engine::base::decode_contents(&newest, 5000).expect("valid");
        let header = contents.header.expect("a header");
        assert_eq!(header.meta.offsets[0].next_offset, 7);
        assert_eq!(contents.authors.len(), 1);
    }
}
