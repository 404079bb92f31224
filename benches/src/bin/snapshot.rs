//! Snapshot figures on the feed-2d workload: snapshot size and write time, load time (read +
//! verify, rebuild on both cores) against an in-process replay of the same events, and query
//! latency while a snapshot is being written against idle, measured in alternating rounds.
//!
//! `cargo run --release -p thunder-benches --bin snapshot -- --scale 1` (20M posts).

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::json;
use thunder_benches::memory::{release_free_memory, rss_bytes, settle};
use thunder_benches::{DEFAULT_BATCH_EVENTS, batches, load};
use thunder_engine::config::{DEFAULT_RETENTION_SECS, MAX_POSTS_TO_RETURN};
use thunder_engine::snapshot::{LoadReport, PartitionOffset, SnapshotMeta};
use thunder_engine::{FeedQuery, ManualClock, PostStore, Store};
use thunder_server::snapshot::pacing::{Paced, lower_current_thread_priority};
use thunder_testkit::model::answers_agree;
use thunder_workload::{DEFAULT_SEED, SynthConfig, Viewer};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Snapshot write / load / query-impact figures on the feed-2d workload")]
struct Args {
    /// Workload divisor: 1 = 1M authors / 20M posts, 10 = 100k / 2M, 100 = 10k / 200k.
    #[arg(long, default_value_t = 10)]
    scale: u32,
    /// The workload's "now" (unix seconds); the stores' clock stands still here.
    #[arg(long, default_value_t = 1_750_000_000)]
    now_secs: i64,
    /// Directory for the snapshot file (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Viewers queried per latency round.
    #[arg(long, default_value_t = 2000)]
    queries: usize,
    /// Alternating idle / during-snapshot latency rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Snapshot write pace during the latency rounds, MiB/s (0: as fast as possible), as the
    /// server's `--snapshot-max-mib-per-sec`.
    #[arg(long, default_value_t = 256)]
    pace_mib_per_sec: u64,
    /// Threads that rebuild the store on load.
    #[arg(long, default_value_t = 2)]
    load_threads: usize,
    /// Also load the snapshot through the per-post insert path (the fallback), for the
    /// side-by-side figure.
    #[arg(long)]
    per_post_too: bool,
    /// How the first load reads the file: `mapping` (in place, as the server loads) or
    /// `stream` (into a buffer of decoded posts, as loads did before).
    #[arg(long, value_enum, default_value_t = Via::Mapping)]
    load_via: Via,
    /// Then load the other way, then the first way again, for the side-by-side figure.
    #[arg(long)]
    both_ways: bool,
    /// Seconds to wait before each timed load, with the memory freed before it released
    /// (as `compare --settle-secs`): without the wait, a load that follows a freed store runs
    /// partly on pages that are cheap to fault in again, and the first load does not.
    #[arg(long, default_value_t = 5.0)]
    settle_secs: f64,
}

/// CPU time of the whole process (every thread), in seconds: on a shared machine the load's
/// wall time depends on what else runs, its CPU time much less.
fn process_cpu_secs() -> f64 {
    thunder_benches::cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID).as_secs_f64()
}

/// How a load reads the file.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Via {
    /// In place, through a mapping (`load_snapshot_file`, as the server loads).
    Mapping,
    /// Streamed into a buffer of decoded posts (`load_snapshot_sized`).
    Stream,
}

/// Loads the snapshot at `path` into a fresh store: the store, its report and the wall time.
fn load_file(
    path: &std::path::Path,
    clock: &Arc<ManualClock>,
    threads: usize,
    allow_bulk: bool,
    via: Via,
) -> Result<(PostStore, LoadReport, f64)> {
    let store = PostStore::with_clock(DEFAULT_RETENTION_SECS, clock.clone());
    let started = Instant::now();
    let cpu_before = process_cpu_secs();
    let file = File::open(path)?;
    let bytes = file.metadata()?.len();
    let report = match (via, allow_bulk) {
        (Via::Mapping, true) => store.load_snapshot_file(&file, threads)?,
        _ => {
            let input = BufReader::with_capacity(1 << 20, file);
            store.load_snapshot_with(input, threads, allow_bulk, Some(bytes))?
        }
    };
    let load_secs = started.elapsed().as_secs_f64();
    let cpu_secs = process_cpu_secs() - cpu_before;
    eprintln!(
        "load ({}, {}): {} posts in {load_secs:.2}s, {cpu_secs:.2}s of CPU (read+verify {:.2}s, rebuild {:.2}s on {threads} threads)",
        match report.per_post_reason {
            None => "bulk".to_owned(),
            Some(reason) => format!("per-post path: {}", reason.as_str()),
        },
        match (via, allow_bulk) {
            (Via::Mapping, true) => "in place",
            _ => "streamed",
        },
        report.posts_loaded,
        report.read_duration.as_secs_f64(),
        report.build_duration.as_secs_f64(),
    );
    Ok((store, report, load_secs))
}

/// Feed and videos answers of the first 500 viewers: how many differ between the stores, and
/// how many posts `a` answered.
fn disagreements(a: &PostStore, b: &PostStore, viewers: &[Viewer]) -> (usize, usize) {
    let mut differ = 0;
    let mut answered = 0;
    for viewer in viewers.iter().take(500) {
        let query = query_for(viewer);
        for (x, y) in [
            (
                a.get_all_posts_by_users(&query),
                b.get_all_posts_by_users(&query),
            ),
            (a.get_videos_by_users(&query), b.get_videos_by_users(&query)),
        ] {
            differ += usize::from(answers_agree(&x.posts, &y.posts, MAX_POSTS_TO_RETURN).is_err());
            answered += x.posts.len();
        }
    }
    (differ, answered)
}

fn query_for(viewer: &Viewer) -> FeedQuery<'_> {
    FeedQuery::new(viewer.user_id, &viewer.following)
}

/// Writes one snapshot to `path` (temp file, fsync, rename, as the server does).
fn write_file(
    store: &PostStore,
    path: &PathBuf,
    pace_bytes_per_sec: u64,
) -> Result<(u64, Duration)> {
    let started = Instant::now();
    let tmp = path.with_extension("tmp");
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut out = Paced::new(BufWriter::with_capacity(1 << 20, file), pace_bytes_per_sec);
    let meta = SnapshotMeta {
        source: "bench".into(),
        offsets: vec![PartitionOffset {
            partition: 0,
            next_offset: 0,
        }],
    };
    let summary = store.write_snapshot(&meta, &mut out)?;
    let file = out.into_inner().into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok((summary.counts.bytes, started.elapsed()))
}

/// One reader thread's latency over `viewers`, in microseconds.
fn latency_round(store: &PostStore, viewers: &[Viewer]) -> Histogram<u64> {
    let mut hist = histogram();
    for viewer in viewers {
        let t = Instant::now();
        std::hint::black_box(store.get_all_posts_by_users(&query_for(viewer)));
        hist.saturating_record(t.elapsed().as_nanos() as u64);
    }
    hist
}

/// Latency histogram in nanoseconds, up to a minute.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e6
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.scale == 0 {
        bail!("--scale must be at least 1");
    }
    let config = SynthConfig::feed_2d(args.scale, args.now_secs).with_seed(DEFAULT_SEED);
    let batches = batches(config.backlog(), DEFAULT_BATCH_EVENTS);
    let events: u64 = batches.iter().map(|b| b.len() as u64).sum();
    let viewers = config.viewers(args.queries);
    let clock = Arc::new(ManualClock::new(args.now_secs));

    release_free_memory();
    let rss_before = rss_bytes();
    let store = PostStore::with_clock(DEFAULT_RETENTION_SECS, clock.clone());
    let cpu_before = process_cpu_secs();
    let replay = load(&store, &batches, 2);
    let replay_cpu_secs = process_cpu_secs() - cpu_before;
    drop(batches);
    let posts = store.stored_posts();
    eprintln!(
        "scale {}: {events} events replayed in-process on 2 writers in {:.2}s, {replay_cpu_secs:.2}s of CPU ({posts} posts, RSS +{} MiB)",
        args.scale,
        replay.as_secs_f64(),
        rss_bytes().saturating_sub(rss_before) >> 20
    );

    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("thunder-bench-{}.thsnap", std::process::id()));
    let (bytes, write) = write_file(&store, &path, 0)?;
    eprintln!(
        "snapshot: {bytes} bytes ({:.1} B/post) written in {:.2}s",
        bytes as f64 / posts.max(1) as f64,
        write.as_secs_f64()
    );

    // Each timed load starts after the settling wait, with the memory freed before it released.
    let settled_load = |allow_bulk: bool, via: Via| {
        release_free_memory();
        settle(args.settle_secs);
        load_file(&path, &clock, args.load_threads, allow_bulk, via)
    };
    // A load of another path must build the store the first one built.
    let same_answers = |loaded: PostStore, what: &str| {
        let (differ, _) = disagreements(&store, &loaded, &viewers);
        if differ > 0 {
            bail!("the store loaded {what} differs: {differ} of 1000 answers");
        }
        Ok(())
    };
    let (loaded, report, load_secs) = settled_load(true, args.load_via)?;
    eprintln!(
        "load vs in-process replay of the same events: {load_secs:.2}s vs {:.2}s ({:.1}x faster)",
        replay.as_secs_f64(),
        replay.as_secs_f64() / load_secs
    );
    let (differ, answered) = disagreements(&store, &loaded, &viewers);
    if differ > 0 || report.posts_loaded != posts as u64 || answered == 0 {
        bail!(
            "the loaded store differs: {differ} of 1000 answers, {} vs {posts} posts, {answered} posts answered",
            report.posts_loaded
        );
    }
    drop(loaded);
    let mut per_post_secs = None;
    if args.per_post_too {
        // The per-post path, then the bulk build again, each after the settling wait; the
        // bulk build is measured both before and after the per-post load, so that what is
        // left of an order effect shows.
        let (per_post, _, secs) = settled_load(false, Via::Stream)?;
        same_answers(per_post, "through the per-post path")?;
        let (_, _, again) = settled_load(true, args.load_via)?;
        eprintln!(
            "bulk load vs per-post load: {load_secs:.2}s (again after it: {again:.2}s) vs {secs:.2}s ({:.1}x / {:.1}x faster)",
            secs / load_secs,
            secs / again
        );
        per_post_secs = Some(secs);
    }
    let mut other_way_secs = None;
    if args.both_ways {
        // The other way, then the first way again, each after the settling wait (so the
        // first way's two loads sit on either side of the other way's).
        let other = match args.load_via {
            Via::Mapping => Via::Stream,
            Via::Stream => Via::Mapping,
        };
        let (loaded_other, _, secs) = settled_load(true, other)?;
        same_answers(loaded_other, &format!("{other:?}"))?;
        let (_, _, again) = settled_load(true, args.load_via)?;
        eprintln!(
            "{:?} load vs {other:?} load: {load_secs:.2}s (again after it: {again:.2}s) vs {secs:.2}s",
            args.load_via
        );
        other_way_secs = Some(secs);
    }
    release_free_memory();

    // Latency: one reader thread, rounds alternating idle and with a snapshot writer running
    // back to back on another thread.
    let mut idle = histogram();
    let mut during = histogram();
    let written = AtomicU64::new(0);
    for _ in 0..args.rounds {
        idle.add(latency_round(&store, &viewers))?;
        let stop = AtomicBool::new(false);
        let round = std::thread::scope(|scope| {
            let writer = scope.spawn(|| -> Result<()> {
                // As the server's snapshot thread.
                lower_current_thread_priority();
                while !stop.load(Ordering::Relaxed) {
                    write_file(&store, &path, args.pace_mib_per_sec << 20)?;
                    written.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            });
            // Let the first snapshot get going.
            std::thread::sleep(Duration::from_millis(20));
            let round = latency_round(&store, &viewers);
            stop.store(true, Ordering::Relaxed);
            writer
                .join()
                .map_err(|_| anyhow::anyhow!("snapshot writer panicked"))??;
            Ok::<_, anyhow::Error>(round)
        })?;
        during.add(round)?;
    }
    let _ = std::fs::remove_file(&path);
    let ratio = ms(&during, 0.99) / ms(&idle, 0.99).max(1e-9);
    eprintln!(
        "query p50 / p99: idle {:.2} / {:.2} ms, during snapshot {:.2} / {:.2} ms ({} snapshots written at <= {} MiB/s); p99 ratio {ratio:.2}",
        ms(&idle, 0.5),
        ms(&idle, 0.99),
        ms(&during, 0.5),
        ms(&during, 0.99),
        written.load(Ordering::Relaxed),
        args.pace_mib_per_sec
    );
    println!(
        "{}",
        json!({
            "scale": args.scale, "events": events, "posts": posts,
            "replay_in_process_2w_secs": replay.as_secs_f64(),
            "snapshot_bytes": bytes, "snapshot_write_secs": write.as_secs_f64(),
            "load_secs": load_secs, "load_read_secs": report.read_duration.as_secs_f64(),
            "load_rebuild_secs": report.build_duration.as_secs_f64(),
            "load_bulk": report.per_post_reason.is_none(),
            "load_per_post_secs": per_post_secs,
            "load_via": format!("{:?}", args.load_via),
            "load_other_way_secs": other_way_secs,
            "query_idle_p50_ms": ms(&idle, 0.5), "query_idle_p99_ms": ms(&idle, 0.99),
            "query_during_snapshot_p50_ms": ms(&during, 0.5),
            "query_during_snapshot_p99_ms": ms(&during, 0.99),
            "p99_ratio": ratio, "pace_mib_per_sec": args.pace_mib_per_sec,
            "settle_secs": args.settle_secs,
        })
    );
    Ok(())
}
