//! CPU profiling over HTTP with pprof-rs: `/debug/pprof/profile` (gzipped profile.proto, as
//! `go tool pprof` expects) and `/debug/pprof/flamegraph` (SVG).
//!
//! The profiler drives a process-wide `SIGPROF` timer, so only one profile runs at a time (409
//! while busy), `seconds` is capped at [`MAX_PROFILE_SECONDS`] and the frequency at
//! [`MAX_FREQUENCY_HZ`] (the kernel's tick caps real sampling anyway). Frames of libc, libgcc,
//! pthread and the vdso are not unwound (signal-unsafe unwinding there can deadlock).
//!
//! pprof-rs keeps each distinct stack in a fixed in-memory table and writes the ones it evicts
//! to a temp file from the signal handler (a `write(2)` is safe there, an allocation is not).
//! It creates that file with `tempfile` in tempfile's default directory when the profiler is
//! first used, and a profiler whose file could not be created stays unusable for the life of
//! the process. So the directory is chosen before the first profile ([`spill_dir`]): the
//! process's temp dir (`$TMPDIR`, else `/tmp`) when a file can be created there, else
//! `/dev/shm`, so a read-only root filesystem without a writable `/tmp` still profiles.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::Query;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use pprof::protos::Message;

/// Longest profile one request may ask for.
pub const MAX_PROFILE_SECONDS: u64 = 60;
/// Default profile length (as Go's `/debug/pprof/profile`).
pub const DEFAULT_PROFILE_SECONDS: u64 = 30;
/// Highest sampling frequency accepted.
pub const MAX_FREQUENCY_HZ: i32 = 199;
/// Default sampling frequency.
pub const DEFAULT_FREQUENCY_HZ: i32 = 99;
/// Libraries whose frames are not unwound.
const BLOCKLIST: [&str; 4] = ["libc", "libgcc", "pthread", "vdso"];

/// Flame graph of a profile without samples.
const EMPTY_FLAMEGRAPH: &str = concat!(
    r#"<?xml version="1.0" standalone="no"?>"#,
    r#"<svg version="1.1" width="600" height="40" xmlns="http://www.w3.org/2000/svg">"#,
    r#"<text x="10" y="25">No CPU samples (the process was idle)</text></svg>"#,
    "\n"
);

/// Set while a profile runs; there is one profiler per process.
static BUSY: AtomicBool = AtomicBool::new(false);

/// Where a memory-backed filesystem usually is, the spill file's last resort.
const SHARED_MEMORY_DIR: &str = "/dev/shm";

/// The directory the profiler's spill file goes to, chosen once (see the module docs).
static SPILL_DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The directory pprof-rs creates its spill file in, chosen on the first call: the first of
/// the process's temp dir and [`SHARED_MEMORY_DIR`] where a temp file can be created. Another
/// than the temp dir becomes tempfile's default for the whole process (the server creates no
/// other temp files). `Err` says why profiling is impossible here.
fn spill_dir() -> Result<&'static Path, &'static str> {
    let chosen = SPILL_DIR.get_or_init(|| {
        let default = std::env::temp_dir();
        let dir = first_writable(&[default.clone(), PathBuf::from(SHARED_MEMORY_DIR)])?;
        if dir != default {
            // Only the first override counts; nothing set one before this first profile.
            let _ = tempfile::env::override_temp_dir(&dir);
            tracing::warn!(
                temp_dir = %default.display(),
                spill_dir = %dir.display(),
                "the temp dir is not writable: CPU profiles keep their sample file in the spill dir (mount a writable /tmp to change it)"
            );
        }
        Ok(dir)
    });
    chosen.as_deref().map_err(String::as_str)
}

/// The first of `candidates` in which a temp file can be created (and is removed again), or
/// why none can, naming each with its error and what to do.
fn first_writable(candidates: &[PathBuf]) -> Result<PathBuf, String> {
    let mut tried = Vec::with_capacity(candidates.len());
    for dir in candidates {
        match tempfile::NamedTempFile::new_in(dir) {
            Ok(_probe) => return Ok(dir.clone()),
            Err(e) => tried.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(format!(
        "CPU profiling needs a writable directory for the profiler's sample file and has none \
         ({}): mount a writable volume at /tmp (an emptyDir in Kubernetes) or set TMPDIR to a \
         writable directory",
        tried.join("; ")
    ))
}

/// Query parameters of both endpoints.
#[derive(Debug, Default, serde::Deserialize)]
pub struct ProfileParams {
    /// Profile length in seconds (1..=60, default 30).
    pub seconds: Option<u64>,
    /// Sampling frequency in Hz (1..=199, default 99).
    pub frequency: Option<i32>,
}

enum Output {
    Pprof,
    Flamegraph,
}

/// `GET /debug/pprof/profile?seconds=N`: gzipped pprof protobuf.
pub async fn profile(Query(params): Query<ProfileParams>) -> Response {
    run(params, Output::Pprof).await
}

/// `GET /debug/pprof/flamegraph?seconds=N`: SVG flame graph.
pub async fn flamegraph(Query(params): Query<ProfileParams>) -> Response {
    run(params, Output::Flamegraph).await
}

/// Holds the process-wide profiler slot; frees it when dropped.
struct Slot(());

impl Slot {
    fn take() -> Option<Self> {
        // Acquire pairs with the Release in drop: the previous profile is fully torn down.
        BUSY.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Slot(()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        BUSY.store(false, Ordering::Release);
    }
}

async fn run(params: ProfileParams, output: Output) -> Response {
    let Some(slot) = Slot::take() else {
        return (StatusCode::CONFLICT, "a profile is already running\n").into_response();
    };
    if let Err(why) = spill_dir() {
        tracing::warn!(%why, "profiling");
        return (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response();
    }
    let seconds = params
        .seconds
        .unwrap_or(DEFAULT_PROFILE_SECONDS)
        .clamp(1, MAX_PROFILE_SECONDS);
    let frequency = params
        .frequency
        .unwrap_or(DEFAULT_FREQUENCY_HZ)
        .clamp(1, MAX_FREQUENCY_HZ);
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(frequency)
        .blocklist(&BLOCKLIST)
        .build()
    {
        Ok(guard) => guard,
        Err(e) => return internal(format!("cannot start the profiler: {e}")),
    };
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    // Symbolising and encoding are CPU-heavy: keep them off the reactor.
    let rendered = tokio::task::spawn_blocking(move || {
        let report = guard.report().build().map_err(|e| e.to_string())?;
        drop(guard);
        match output {
            Output::Pprof => {
                let profile = report.pprof().map_err(|e| e.to_string())?;
                let mut encoded = Vec::new();
                profile.encode(&mut encoded).map_err(|e| e.to_string())?;
                let mut gz =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                gz.write_all(&encoded).map_err(|e| e.to_string())?;
                gz.finish()
                    .map(|b| (b, "application/octet-stream"))
                    .map_err(|e| e.to_string())
            }
            Output::Flamegraph => {
                let mut svg = Vec::new();
                if report.data.is_empty() {
                    // An idle process takes no CPU samples; still answer with a valid SVG.
                    svg.extend_from_slice(EMPTY_FLAMEGRAPH.as_bytes());
                } else {
                    report.flamegraph(&mut svg).map_err(|e| e.to_string())?;
                }
                Ok((svg, "image/svg+xml"))
            }
        }
    })
    .await;
    drop(slot);
    match rendered {
        Ok(Ok((body, content_type))) => {
            ([(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        Ok(Err(e)) => internal(format!("profile failed: {e}")),
        Err(e) => internal(format!("profile task failed: {e}")),
    }
}

fn internal(message: String) -> Response {
    tracing::warn!(%message, "profiling");
    (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spill_file_goes_to_the_first_writable_directory() {
        let writable = tempfile::tempdir().expect("tempdir");
        let file = writable.path().join("a-file");
        std::fs::write(&file, b"x").expect("write");
        let missing = writable.path().join("missing");
        // A path under a file and a missing directory are passed over.
        let chosen = first_writable(&[file.join("tmp"), missing.clone(), writable.path().into()]);
        assert_eq!(chosen.as_deref(), Ok(writable.path()));
        assert_eq!(
            std::fs::read_dir(writable.path()).expect("dir").count(),
            1,
            "the probe file is removed"
        );
        // None writable: every directory tried is named, with what to do.
        let why = first_writable(&[file.join("tmp"), missing]).expect_err("none writable");
        assert!(
            why.contains("a-file/tmp") && why.contains("missing") && why.contains("TMPDIR"),
            "{why}"
        );
    }
}
