//! Snapshots in the server: `--snapshot-dir` and friends, when snapshots are written (every
//! `--snapshot-interval-secs`, on `POST /admin/snapshot`, and once at graceful shutdown) and the
//! start-up restore that lets Kafka resume from the recorded offsets. The file format, its
//! writer and its reader are the engine's (`thunder_engine::snapshot`).
//!
//! # Files
//! - `mod.rs` (this file): the flags ([`SnapshotArgs`]) and the snapshot directory's names
//!   ([`list`], [`KEEP`]).
//! - `schedule.rs`: the writer. A snapshot is written to `snapshot-<unix ms>.thsnap.tmp` in the
//!   directory, fsynced, renamed to `snapshot-<unix ms>.thsnap` and the directory fsynced; then
//!   all but the [`KEEP`] newest are deleted. The per-partition offsets are read *before* the
//!   scan, so replaying from them makes the fuzzy snapshot exact. The writer runs on a thread
//!   of its own at a lowered CPU priority, paced to `--snapshot-max-mib-per-sec`.
//!   [`Snapshots`] writes, [`SnapshotTask`] runs the schedule and the final snapshot at
//!   shutdown, [`admin_snapshot`] answers `POST /admin/snapshot`. Each snapshot is a base
//!   file: the store's base and live head merged per author.
//! - `restore.rs`: the start-up restore ([`restorer`], run by the Kafka supervisor once the
//!   topic's watermarks are known). The newest snapshot that is valid, compatible, not older
//!   than `--snapshot-max-age-secs` and written for this topic and this `--shard` (or none) is
//!   loaded; the others are reported and skipped. A base file (format 3, what this build
//!   writes: `thunder_engine::base`) is mapped and served from as it stands, its checksums and
//!   structure verified first and every record checked meanwhile on a thread of its own; a
//!   snapshot of format 2 (an older build's) is verified whole and rebuilt into the store.
//!   Either way a bad file falls back to the previous snapshot, or to a full replay, and
//!   partial data is never served. If the retained log no longer reaches the recorded offsets,
//!   nothing is loaded and the topic is replayed in full (with a warning). [`check_dir`] tells
//!   `--check-config` what a start would find.
//! - `metrics.rs`: the snapshots' metrics ([`metrics::SnapshotMetrics`]).
//! - `pacing.rs`: [`pacing::Paced`], the rate-limited `Write` the writer goes through, and
//!   [`pacing::lower_current_thread_priority`] for the writer's thread.

pub mod metrics;
pub mod pacing;
mod restore;
mod schedule;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::StartupError;

pub use restore::{check_dir, restorer};
pub use schedule::{SnapshotTask, Snapshots, TakeError, admin_snapshot};

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
    /// Copy the base loaded at start-up into huge-page memory instead of serving it from the
    /// file's mapped pages: the query reads it in about 0.85x the CPU per post, for about 1.5 s
    /// more per start at 20M posts and the base's size in anonymous memory (where the mapping
    /// uses page cache the kernel can reclaim). Without huge pages to be had, the mapping.
    #[arg(long, env = "THUNDER_SNAPSHOT_BASE_HUGE_PAGES")]
    pub snapshot_base_huge_pages: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_mode_refuses_a_snapshot_dir() {
        let dir = PathBuf::from("/var/snapshots");
        let error = check_mode(Some(&dir), true).expect_err("refused");
        assert!(error.to_string().contains("needs Kafka"), "{error}");
        assert!(check_mode(Some(&dir), false).is_ok());
        assert!(check_mode(None, true).is_ok());
    }
}
