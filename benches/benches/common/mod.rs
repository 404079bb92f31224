//! Shared setup of the criterion benches: the workload, loaded stores and the profiler hook.

use criterion::Criterion;
use criterion::profiler::Profiler;
use pprof::ProfilerGuard;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use thunder_benches::{BaselineStore, DEFAULT_BATCH_EVENTS, batches, load};
use thunder_engine::config::DEFAULT_RETENTION_SECS;
use thunder_engine::{ManualClock, PostStore, Store};
use thunder_workload::SynthConfig;

/// The workload's "now"; the stores' clocks stand still here.
pub const NOW_SECS: i64 = 1_750_000_000;

/// Workload divisor, `THUNDER_BENCH_SCALE` (default 100: 10k authors, 200k posts).
pub fn scale() -> u32 {
    std::env::var("THUNDER_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// The feed-2d workload at [`scale`].
pub fn workload() -> SynthConfig {
    SynthConfig::feed_2d(scale(), NOW_SECS)
}

/// An engine store and a baseline store, both loaded with the workload's backlog.
pub fn loaded_stores(config: &SynthConfig) -> (PostStore, BaselineStore) {
    let batches = batches(config.backlog(), DEFAULT_BATCH_EVENTS);
    let engine =
        PostStore::with_clock(DEFAULT_RETENTION_SECS, Arc::new(ManualClock::new(NOW_SECS)));
    let baseline = BaselineStore::new(
        DEFAULT_RETENTION_SECS as u64,
        Arc::new(ManualClock::new(NOW_SECS)),
    );
    for store in [&engine as &dyn Store, &baseline] {
        load(store, &batches, 1);
        store.finish_load();
    }
    (engine, baseline)
}

/// Criterion with the flamegraph profiler: `cargo bench -p thunder-benches --bench query --
/// --profile-time 10` writes `target/criterion/<bench>/profile/flamegraph.svg`.
pub fn criterion() -> Criterion {
    Criterion::default().with_profiler(FlamegraphProfiler::new(100))
}

/// pprof-rs sampling profiler behind criterion's `--profile-time`, writing a flamegraph.
///
/// pprof 0.15's own criterion hook targets criterion 0.5; this is the same hook for the
/// workspace's criterion.
pub struct FlamegraphProfiler {
    frequency_hz: i32,
    active: Option<ProfilerGuard<'static>>,
}

impl FlamegraphProfiler {
    /// A profiler sampling at `frequency_hz` (the kernel caps the effective rate near HZ).
    pub fn new(frequency_hz: i32) -> Self {
        Self {
            frequency_hz,
            active: None,
        }
    }
}

impl Profiler for FlamegraphProfiler {
    fn start_profiling(&mut self, _benchmark_id: &str, _benchmark_dir: &Path) {
        match pprof::ProfilerGuardBuilder::default()
            .frequency(self.frequency_hz)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
        {
            Ok(guard) => self.active = Some(guard),
            Err(e) => eprintln!("profiler not started: {e}"),
        }
    }

    fn stop_profiling(&mut self, _benchmark_id: &str, benchmark_dir: &Path) {
        let Some(guard) = self.active.take() else {
            return;
        };
        let written = std::fs::create_dir_all(benchmark_dir)
            .map_err(|e| e.to_string())
            .and_then(|()| guard.report().build().map_err(|e| e.to_string()))
            .and_then(|report| {
                let path = benchmark_dir.join("flamegraph.svg");
                let file = File::create(&path).map_err(|e| e.to_string())?;
                report.flamegraph(file).map_err(|e| e.to_string())?;
                Ok(path)
            });
        match written {
            Ok(path) => eprintln!("flamegraph: {}", path.display()),
            Err(e) => eprintln!("flamegraph not written: {e}"),
        }
    }
}
