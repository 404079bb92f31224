//! Side-by-side benchmark of thunder-engine and the reference store design on "feed-2d".
//!
//! ```text
//! cargo run --release -p thunder-benches --bin compare -- --scale 10
//! ```
//!
//! Both stores get the same events and the same requests. Printed for each store and as a
//! ratio (engine advantage, >1 = engine better): ingest events/s with one and two writer threads,
//! resident bytes per stored post (RSS delta), idle query latency (normal and video), query
//! latency while another thread ingests at a fixed rate, and how many answers agree.
//! A human table, then one JSON line.

use anyhow::{Result, bail};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use thunder_benches::baseline::TimelineKind;
use thunder_benches::line_floor::LineFloor;
use thunder_benches::memory::{self, peak_rss_bytes, release_free_memory, rss_bytes};
use thunder_benches::store_floor::{
    self, StoreFloor, StoreRounds, WalkRounds, floor_viewers, median, parse_walk,
    stores_side_by_side, walk_name, walks_side_by_side,
};
use thunder_benches::{
    BaselineStore, DEFAULT_BATCH_EVENTS, batches, cpu_time, load, load_shares, partition,
};
use thunder_engine::base::BasePages;
use thunder_engine::bench_internals::Walk;
use thunder_engine::config::{
    DEFAULT_RETENTION_SECS, MAX_POSTS_TO_RETURN, MAX_TINY_POSTS_PER_USER_SCAN, MAX_VIDEOS_TO_RETURN,
};
use thunder_engine::snapshot::SnapshotMeta;
use thunder_engine::{EventBatch, FeedQuery, LightPost, ManualClock, PostStore, Store};
use thunder_workload::{DEFAULT_SEED, POST_ID_BASE, SynthConfig, Viewer, exclude_from_answer};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Engine vs reference-design baseline on the feed-2d workload")]
struct Args {
    /// Workload divisor: 1 = 1M authors / 20M posts, 10 = 100k / 2M, 100 = 10k / 200k.
    #[arg(long, default_value_t = 10)]
    scale: u32,
    /// Workload seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// The workload's "now" (unix seconds); the stores' clock stands still here.
    #[arg(long, default_value_t = 1_750_000_000)]
    now_secs: i64,
    /// Viewers queried (default: 10000 at scale 1, 100000/scale at smaller scales, at most 10000).
    #[arg(long)]
    queries: Option<usize>,
    /// Wall-time budget per baseline query phase, seconds; its queries stop early past it
    /// (default: 300/scale, between 5 and 30).
    #[arg(long)]
    baseline_secs: Option<f64>,
    /// Events per ingest batch (creates applied, then deletes).
    #[arg(long, default_value_t = DEFAULT_BATCH_EVENTS)]
    batch_events: usize,
    /// Fixed ingest rate during the query-under-ingest phase, events/s.
    #[arg(long, default_value_t = 50_000)]
    ingest_rate: u64,
    /// Queries measured while ingesting (default: --queries, at most 2000).
    #[arg(long)]
    under_ingest_queries: Option<usize>,
    /// Where the under-ingest phase's live events go (a diagnostic of what slows the
    /// queries): the queried store (the measurement), another store, nowhere (only the clock
    /// moves), or the queried store *before* the queries (one second's worth at
    /// `--ingest-rate`, the writer stopped before the first query).
    #[arg(long, value_enum, default_value_t = LiveTarget::Store)]
    live_events_to: LiveTarget,
    /// Events per store call during the query-under-ingest phase.
    #[arg(long, default_value_t = 100)]
    ingest_batch: usize,
    /// Run only one store ("engine" or "baseline"). With "baseline" alone, the previous answers
    /// behind the exclude lists come from the baseline too (slow: keep --queries small).
    #[arg(long)]
    only: Option<String>,
    /// Measure ingest only (one writer, resident bytes, two writers): no query phases. For
    /// profiling the write path.
    #[arg(long)]
    ingest_only: bool,
    /// Size the engine's post index for the workload's events before each load, as the
    /// server does for the backlog it replays at start-up.
    #[arg(long)]
    presize: bool,
    /// Seconds to wait, with the previous store freed, before each timed load. This VM hands
    /// memory a process frees back to its host after a few seconds, and faulting such pages in
    /// again costs ~20x more than faulting pages freed just before; without the wait, a load
    /// that follows a freed store runs partly on cheap pages and the one before it does not.
    #[arg(long, default_value_t = 5.0)]
    settle_secs: f64,
    /// Times each store's one- and two-writer loads this many times in all, the stores
    /// alternating round by round (each load on a fresh store, after the settling wait); the
    /// ingest lines report the median, and every round is printed. The first round is the one
    /// the other phases run on.
    #[arg(long, default_value_t = 1)]
    ingest_rounds: usize,
    /// Walks of the engine's merge to measure side by side on the store floor's viewers:
    /// `distance` (a stream per step, each stage a fixed distance ahead) or a group size
    /// (streams staged that many at a time), comma-separated. Each gets a row; the idle
    /// phases keep the serving walk.
    #[arg(long, value_delimiter = ',', value_parser = parse_walk)]
    walks: Vec<Walk>,
    /// Rounds of `--walks` over the store floor's viewers, the walks taking turns query by
    /// query (a multiple of the walks' count gives each viewer every walk equally often).
    #[arg(long, default_value_t = 5)]
    walk_rounds: usize,
    /// After the one-writer load, measure only the store floor (and `--walks`): no idle,
    /// video or under-ingest phases, no two-writer load.
    #[arg(long)]
    floor_only: bool,
    /// After the engine's store floor, write the engine as a base file (in `--base-dir`),
    /// load it under a fresh store for each of `--base-pages`, and measure the store floor
    /// on the engine and on each base side by side (`--walk-rounds` rounds, the stores taking
    /// turns query by query): the 2000-follow query answered from a base against today's
    /// store. Prints the base's bytes per post and each load's time; removes the file after.
    #[arg(long)]
    base: bool,
    /// How each measured base holds its file: `mapped` (4 KiB page-cache pages) or `huge`
    /// (copied into huge-page memory at load), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("mapped"), String::from("huge")])]
    base_pages: Vec<String>,
    /// Directory of `--base`'s file (default: the system temp dir).
    #[arg(long)]
    base_dir: Option<std::path::PathBuf>,
}

/// See `Args::live_events_to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LiveTarget {
    Store,
    OtherStore,
    Nowhere,
    Before,
}

/// Which store a run builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Engine,
    Baseline,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Engine => "engine",
            Kind::Baseline => "baseline",
        }
    }
}

/// Latency histogram in nanoseconds.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

fn micros(h: &Histogram<u64>, quantile: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(quantile) as f64 / 1000.0
    }
}

/// Latency summary of one query phase.
#[derive(Clone, Debug, Default)]
struct Latency {
    count: u64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Self {
        Self {
            count: h.len(),
            p50_us: micros(h, 0.5),
            p99_us: micros(h, 0.99),
            p999_us: micros(h, 0.999),
            max_us: if h.is_empty() {
                0.0
            } else {
                h.max() as f64 / 1000.0
            },
        }
    }

    fn json(&self) -> Value {
        json!({"count": self.count, "p50_us": self.p50_us, "p99_us": self.p99_us,
               "p999_us": self.p999_us, "max_us": self.max_us})
    }
}

/// The part of an answer that must agree: the cut and the posts strictly newer than it.
#[derive(Clone, Debug, Default)]
struct Answer {
    /// `created_at` of the last post when the answer is full, else `i64::MIN`.
    cut: i64,
    posts: Vec<(i64, i64)>,
}

impl Answer {
    fn of(posts: &[LightPost], max_results: usize) -> Self {
        let cut = if posts.len() >= max_results {
            posts.last().map_or(i64::MIN, |p| p.created_at)
        } else {
            i64::MIN
        };
        Self {
            cut,
            posts: posts.iter().map(|p| (p.post_id, p.created_at)).collect(),
        }
    }

    fn newer_than(&self, cut: i64) -> HashSet<i64> {
        self.posts
            .iter()
            .filter(|(_, c)| *c > cut)
            .map(|(id, _)| *id)
            .collect()
    }
}

/// Everything measured on one store.
#[derive(Debug, Default)]
struct StoreRun {
    events: u64,
    /// The median of `ingest_1w_rounds` (the first round alone without `--ingest-rounds`).
    ingest_1w_secs: f64,
    ingest_2w_secs: f64,
    ingest_1w_rounds: Vec<f64>,
    ingest_2w_rounds: Vec<f64>,
    finish_load_secs: f64,
    stored_posts: usize,
    rss_delta_bytes: u64,
    idle_all: Latency,
    /// Idle queries of the viewers the under-ingest phase queries (the first ones).
    idle_same_viewers: Latency,
    idle_2000: Latency,
    idle_10000: Latency,
    idle_video: Latency,
    under_ingest: Latency,
    achieved_ingest_rate: f64,
    /// The engine's 2000-follow queries against random reads of the lines they must touch.
    line_floor: Option<StoreFloor>,
    /// `--walks`, side by side on the same viewers.
    walks: Vec<WalkRounds>,
    /// `--base`: the store floor of the engine and of its bases, side by side.
    base_floor: Vec<StoreRounds>,
    /// `--base`: the file's bytes, posts, write time, and each load's time and pages.
    base_file: Option<Value>,
    normal_answers: Vec<Answer>,
    video_answers: Vec<Answer>,
}

impl StoreRun {
    fn ingest_rate(&self, secs: f64) -> f64 {
        if secs > 0.0 {
            self.events as f64 / secs
        } else {
            0.0
        }
    }

    fn bytes_per_post(&self) -> f64 {
        if self.stored_posts == 0 {
            0.0
        } else {
            self.rss_delta_bytes as f64 / self.stored_posts as f64
        }
    }

    fn json(&self) -> Value {
        json!({
            "events": self.events,
            "ingest_1w_events_per_sec": self.ingest_rate(self.ingest_1w_secs),
            "ingest_2w_events_per_sec": self.ingest_rate(self.ingest_2w_secs),
            "ingest_1w_secs_rounds": self.ingest_1w_rounds,
            "ingest_2w_secs_rounds": self.ingest_2w_rounds,
            "finish_load_secs": self.finish_load_secs,
            "stored_posts": self.stored_posts,
            "rss_delta_bytes": self.rss_delta_bytes,
            "rss_bytes_per_post": self.bytes_per_post(),
            "query_idle": self.idle_all.json(),
            "query_idle_same_viewers_as_under_ingest": self.idle_same_viewers.json(),
            "query_idle_2000_follows": self.idle_2000.json(),
            "query_idle_10000_follows": self.idle_10000.json(),
            "query_idle_video": self.idle_video.json(),
            "query_under_ingest": self.under_ingest.json(),
            "under_ingest_events_per_sec": self.achieved_ingest_rate,
            "store_floor_2000_follows": self.line_floor.as_ref().map(StoreFloor::json),
            "store_floor_walks": self.walks.iter().map(WalkRounds::json).collect::<Vec<_>>(),
            "store_floor_base": self.base_floor.iter().map(StoreRounds::json).collect::<Vec<_>>(),
            "base_file": self.base_file,
        })
    }
}

/// Shared inputs of both runs.
struct Workload {
    config: SynthConfig,
    batches: Vec<EventBatch>,
    events: u64,
    viewers: Vec<Viewer>,
    /// Per viewer: ids from its previous answer (computed once, on the first store run).
    excludes: Vec<Vec<i64>>,
}

/// A store under test, keeping its concrete type for the agreement check (boxed: the two
/// differ in size by hundreds of bytes).
enum Built {
    Engine(Box<PostStore>),
    Baseline(Box<BaselineStore>),
}

impl Built {
    /// A fresh store of `kind` on `clock`.
    fn new(kind: Kind, clock: Arc<ManualClock>) -> Self {
        match kind {
            Kind::Engine => Built::Engine(Box::new(PostStore::with_clock(
                DEFAULT_RETENTION_SECS,
                clock,
            ))),
            Kind::Baseline => Built::Baseline(Box::new(BaselineStore::new(
                DEFAULT_RETENTION_SECS as u64,
                clock,
            ))),
        }
    }

    /// With `--presize`, sizes the engine's post index for `posts` posts (the baseline has no
    /// such step) and returns the time it took, counted in the load.
    fn presize(&self, args: &Args, posts: usize) -> Duration {
        let start = Instant::now();
        if let (true, Built::Engine(engine)) = (args.presize, self) {
            engine.reserve_posts(posts);
        }
        start.elapsed()
    }

    fn store(&self) -> &dyn Store {
        match self {
            Built::Engine(s) => s.as_ref(),
            Built::Baseline(s) => s.as_ref(),
        }
    }
}

fn query_for<'a>(viewer: &'a Viewer, exclude: &'a [i64], max_results: usize) -> FeedQuery<'a> {
    FeedQuery {
        exclude,
        max_results,
        ..FeedQuery::new(viewer.user_id, &viewer.following)
    }
}

/// Runs every measurement on one store kind. `budget` caps each query phase's wall time;
/// with `engine_run` given and a baseline store, the answers are compared before it is dropped.
fn run_store(
    kind: Kind,
    w: &mut Workload,
    args: &Args,
    budget: Option<Duration>,
    engine_run: Option<&StoreRun>,
) -> (StoreRun, Option<[Agreement; 2]>) {
    let name = kind.name();
    let mut run = StoreRun {
        events: w.events,
        ..StoreRun::default()
    };

    // One writer: ingest rate, then resident bytes of what stays.
    release_free_memory();
    memory::settle(args.settle_secs);
    let rss_before = rss_bytes();
    let clock = Arc::new(ManualClock::new(w.config.now_secs));
    let built = Built::new(kind, Arc::clone(&clock));
    let store = built.store();
    let cpu_before = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
    let process_cpu_before = cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID);
    let faults_before = memory::minor_faults();
    let presized = built.presize(args, w.events as usize);
    run.ingest_1w_secs = (presized + load(store, &w.batches, 1)).as_secs_f64();
    let ingest_1w_faults = memory::minor_faults().saturating_sub(faults_before);
    let ingest_1w_cpu = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(cpu_before);
    let ingest_1w_process_cpu =
        cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(process_cpu_before);
    let finish = Instant::now();
    store.finish_load();
    run.finish_load_secs = finish.elapsed().as_secs_f64();
    release_free_memory();
    run.rss_delta_bytes = rss_bytes().saturating_sub(rss_before);
    run.stored_posts = store.stored_posts();
    eprintln!(
        "[{name}] 1 writer: {} events in {:.2}s ({:.2}s of the writer's CPU, {:.2}s of all \
         threads, {} minor faults; +{:.2}s finish_load), {} posts, RSS +{} MiB ({} MiB on \
         huge pages)",
        w.events,
        run.ingest_1w_secs,
        ingest_1w_cpu.as_secs_f64(),
        ingest_1w_process_cpu.as_secs_f64(),
        ingest_1w_faults,
        run.finish_load_secs,
        run.stored_posts,
        run.rss_delta_bytes >> 20,
        memory::anon_huge_bytes() >> 20
    );
    if let Built::Engine(engine) = &built {
        let st = engine.stats();
        let per_post = |bytes: usize| bytes as f64 / st.posts.max(1) as f64;
        eprintln!(
            "[{name}] bytes per post by structure: arena {:.1} (used {:.1}), timelines {:.1} \
             ({} entries), indexes {:.1}; {} authors",
            per_post(st.arena_bytes_reserved),
            per_post(st.arena_bytes_used),
            per_post(st.timeline_bytes),
            st.original_entries + st.secondary_entries + st.video_entries,
            per_post(st.index_bytes),
            st.authors,
        );
    }

    let mut agreements = None;
    if !args.ingest_only {
        // Exclude lists come from each viewer's previous answer, computed once for both stores.
        if w.excludes.is_empty() {
            w.excludes = w
                .viewers
                .iter()
                .map(|v| {
                    let previous = store
                        .get_all_posts_by_users(&query_for(v, &[], MAX_POSTS_TO_RETURN))
                        .posts;
                    exclude_from_answer(v, previous.iter().map(|p| p.post_id))
                })
                .collect();
        }

        // Idle queries, one reader thread.
        let (mut all, mut f2000, mut f10000, mut video) =
            (histogram(), histogram(), histogram(), histogram());
        let mut same_viewers = histogram();
        let under_ingest_viewers = under_ingest_queries(args);
        let idle_viewers = if args.floor_only { 0 } else { w.viewers.len() };
        let started = Instant::now();
        for (n, (viewer, exclude)) in w
            .viewers
            .iter()
            .zip(&w.excludes)
            .enumerate()
            .take(idle_viewers)
        {
            if budget.is_some_and(|b| started.elapsed() > b) {
                break;
            }
            let t = Instant::now();
            let answer = store
                .get_all_posts_by_users(&query_for(viewer, exclude, MAX_POSTS_TO_RETURN))
                .posts;
            let ns = t.elapsed().as_nanos() as u64;
            all.saturating_record(ns);
            if n < under_ingest_viewers {
                same_viewers.saturating_record(ns);
            }
            let by_size = if viewer.following.len() > 2000 {
                &mut f10000
            } else {
                &mut f2000
            };
            by_size.saturating_record(ns);
            run.normal_answers
                .push(Answer::of(&answer, MAX_POSTS_TO_RETURN));
        }
        let started = Instant::now();
        for (viewer, exclude) in w.viewers.iter().zip(&w.excludes).take(idle_viewers) {
            if budget.is_some_and(|b| started.elapsed() > b) {
                break;
            }
            let t = Instant::now();
            let answer = store
                .get_videos_by_users(&query_for(viewer, exclude, MAX_VIDEOS_TO_RETURN))
                .posts;
            video.saturating_record(t.elapsed().as_nanos() as u64);
            run.video_answers
                .push(Answer::of(&answer, MAX_VIDEOS_TO_RETURN));
        }
        run.idle_all = Latency::of(&all);
        run.idle_same_viewers = Latency::of(&same_viewers);
        run.idle_2000 = Latency::of(&f2000);
        run.idle_10000 = Latency::of(&f10000);
        run.idle_video = Latency::of(&video);
        eprintln!(
            "[{name}] idle: {} queries p50 {:.1} us p99 {:.1} us; {} video queries p50 {:.1} us",
            all.len(),
            run.idle_all.p50_us,
            run.idle_all.p99_us,
            video.len(),
            run.idle_video.p50_us
        );

        if let Built::Engine(engine) = &built {
            let viewers = floor_viewers(&w.viewers, &w.excludes);
            let lines = LineFloor::new(engine.stats().arena_bytes_reserved);
            let floor = store_floor::measure(engine, &lines, &viewers);
            drop(lines);
            eprintln!(
                "[{name}] store floor, 2000 follows ({} viewers): query {:.1} ns per post \
                 (CPU p50 {:.1} us, {} posts, {} lines); independent reads of the same lines \
                 {:.1} ns per post ({:.2}x), dependent reads {:.1} ns per post; the same query \
                 again at once (every line cached) {:.1} ns per post",
                floor.viewers,
                floor.query_ns_per_post,
                floor.query_us,
                floor.posts,
                floor.lines,
                floor.independent_ns_per_post,
                floor.ratio(),
                floor.dependent_ns_per_post,
                floor.hot_ns_per_post,
            );
            run.line_floor = Some(floor);
            if !args.walks.is_empty() {
                run.walks = walks_side_by_side(engine, &viewers, &args.walks, args.walk_rounds);
                for walk in &run.walks {
                    eprintln!(
                        "[{name}] walk {}: query {:.1} ns per post (hot {:.1}), {:.2}x its floor \
                         (medians of {} rounds; per round {}), CPU p50 {:.1} us, wall p50 / p99 \
                         {:.1} / {:.1} us",
                        walk_name(walk.walk),
                        walk.median_of(|r| r.query_ns_per_post),
                        walk.median_of(|r| r.hot_ns_per_post),
                        walk.median_of(StoreFloor::ratio),
                        walk.rounds.len(),
                        walk.rounds
                            .iter()
                            .map(|r| format!("{:.1}", r.query_ns_per_post))
                            .collect::<Vec<_>>()
                            .join(" / "),
                        walk.median_of(|r| r.query_us),
                        walk.wall_us(0.5),
                        walk.wall_us(0.99),
                    );
                }
            }
        }
        if let (true, Built::Engine(engine)) = (args.base, &built) {
            let viewers = floor_viewers(&w.viewers, &w.excludes);
            match measure_bases(args, name, engine, &clock, &viewers) {
                Ok((rounds, file)) => {
                    run.base_floor = rounds;
                    run.base_file = Some(file);
                }
                Err(error) => eprintln!("[{name}] base: {error:#}"),
            }
        }
        if args.floor_only {
            drop(built);
            release_free_memory();
            return (run, None);
        }

        agreements = match (&built, engine_run) {
            (Built::Baseline(baseline), Some(engine)) => Some([
                agreement(
                    baseline,
                    w,
                    &engine.normal_answers,
                    &run.normal_answers,
                    false,
                ),
                agreement(baseline, w, &engine.video_answers, &run.video_answers, true),
            ]),
            _ => None,
        };

        // Queries while another thread ingests live events at a fixed rate.
        let (under, achieved) = query_under_ingest(store, &clock, w, args, budget);
        run.under_ingest = Latency::of(&under);
        run.achieved_ingest_rate = achieved;
        eprintln!(
            "[{name}] under ingest ({achieved:.0} events/s): {} queries p50 {:.1} us p99 {:.1} us; RSS {} MiB",
            under.len(),
            run.under_ingest.p50_us,
            run.under_ingest.p99_us,
            rss_bytes() >> 20
        );
    }
    drop(built);

    // Two writers, on a fresh store, last: a store freed before the one-writer load could
    // leave memory behind that the RSS delta would then miss.
    release_free_memory();
    memory::settle(args.settle_secs);
    let built = Built::new(kind, Arc::new(ManualClock::new(w.config.now_secs)));
    // Split outside the measured window (its copies fault in memory of their own).
    let shares = partition(&w.batches, 2);
    let cpu_before = cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID);
    let faults_before = memory::minor_faults();
    let presized = built.presize(args, w.events as usize);
    run.ingest_2w_secs = (presized + load_shares(built.store(), &shares)).as_secs_f64();
    let ingest_2w_cpu = cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(cpu_before);
    eprintln!(
        "[{name}] 2 writers: {} events in {:.2}s ({:.2}s of CPU, all threads, {} minor \
         faults); RSS {} MiB ({} MiB on huge pages)",
        w.events,
        run.ingest_2w_secs,
        ingest_2w_cpu.as_secs_f64(),
        memory::minor_faults().saturating_sub(faults_before),
        rss_bytes() >> 20,
        memory::anon_huge_bytes() >> 20
    );
    drop(built);
    release_free_memory();
    run.ingest_1w_rounds.push(run.ingest_1w_secs);
    run.ingest_2w_rounds.push(run.ingest_2w_secs);
    (run, agreements)
}

/// One more timed load of a fresh store of `kind`: by one writer (the batches in order), or by
/// one writer per share given, timed as `run_store` times its loads: after the settling
/// wait, the presizing counted in.
fn timed_load(kind: Kind, w: &Workload, args: &Args, shares: Option<&[Vec<EventBatch>]>) -> f64 {
    release_free_memory();
    memory::settle(args.settle_secs);
    let built = Built::new(kind, Arc::new(ManualClock::new(w.config.now_secs)));
    let presized = built.presize(args, w.events as usize);
    let took = match shares {
        None => load(built.store(), &w.batches, 1),
        Some(shares) => load_shares(built.store(), shares),
    };
    drop(built);
    release_free_memory();
    (presized + took).as_secs_f64()
}

/// The rounds after the first of `--ingest-rounds`: each round times every store's one-writer
/// load, then every store's two-writer load, the stores in the order they first ran; then
/// each run's ingest figures become the medians of its rounds.
fn more_ingest_rounds(w: &Workload, args: &Args, runs: &mut [(Kind, &mut StoreRun)]) {
    if args.ingest_rounds > 1 {
        let two = partition(&w.batches, 2);
        for round in 2..=args.ingest_rounds {
            for (shares, writers) in [(None, 1), (Some(&two[..]), 2)] {
                for (kind, run) in runs.iter_mut() {
                    let secs = timed_load(*kind, w, args, shares);
                    eprintln!(
                        "[{}] ingest round {round}, {writers} writer(s): {} events in {secs:.2}s",
                        kind.name(),
                        w.events
                    );
                    match writers {
                        1 => run.ingest_1w_rounds.push(secs),
                        _ => run.ingest_2w_rounds.push(secs),
                    }
                }
            }
        }
    }
    for (_, run) in runs.iter_mut() {
        run.ingest_1w_secs = median(&run.ingest_1w_rounds);
        run.ingest_2w_secs = median(&run.ingest_2w_rounds);
    }
}

/// How many viewers (the first ones) the query-under-ingest phase queries.
fn under_ingest_queries(args: &Args) -> usize {
    args.under_ingest_queries.unwrap_or(2000)
}

/// Queries while a writer thread ingests live events at `--ingest-rate`. The store clock runs
/// as in production: it moves on by a second for every second of the phase, and each live
/// event carries the clock's time (with a frozen clock every live post would share one
/// timestamp, one tie group that grows through the phase, which no deployment sees).
fn query_under_ingest(
    store: &dyn Store,
    clock: &ManualClock,
    w: &Workload,
    args: &Args,
    budget: Option<Duration>,
) -> (Histogram<u64>, f64) {
    let stop = AtomicBool::new(false);
    let ingested = AtomicU64::new(0);
    let mut hist = histogram();
    let mut elapsed = Duration::ZERO;
    let target = args.live_events_to;
    let other = (target == LiveTarget::OtherStore).then(|| {
        PostStore::with_clock(
            DEFAULT_RETENTION_SECS,
            Arc::new(ManualClock::new(w.config.now_secs)),
        )
    });
    // With `Before`, the writer stops after one second's worth of events, before any query.
    let before = (target == LiveTarget::Before).then_some(args.ingest_rate.max(1));
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut live = w.config.live();
            let rate = args.ingest_rate.max(1) as f64;
            let per_call = args.ingest_batch.max(1);
            let start = Instant::now();
            let mut sent = 0u64;
            let mut batch = EventBatch::default();
            while !stop.load(Ordering::Relaxed) && before.is_none_or(|n| sent < n) {
                let due = start + Duration::from_secs_f64(sent as f64 / rate);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                    continue;
                }
                let now_secs = w.config.now_secs + start.elapsed().as_secs() as i64;
                clock.set(now_secs);
                batch.creates.clear();
                batch.deletes.clear();
                for _ in 0..per_call {
                    batch.push(live.next_event(now_secs));
                }
                match (target, &other) {
                    (LiveTarget::OtherStore, Some(other)) => {
                        other.apply(&batch);
                    }
                    (LiveTarget::Nowhere, _) => {}
                    _ => {
                        store.apply(&batch);
                    }
                }
                sent += per_call as u64;
                ingested.store(sent, Ordering::Relaxed);
            }
        });
        if let Some(n) = before {
            while ingested.load(Ordering::Relaxed) < n {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let start = Instant::now();
        let count = under_ingest_queries(args);
        for (viewer, exclude) in w.viewers.iter().zip(&w.excludes).take(count) {
            if budget.is_some_and(|b| start.elapsed() > b) {
                break;
            }
            let t = Instant::now();
            std::hint::black_box(
                store
                    .get_all_posts_by_users(&query_for(viewer, exclude, MAX_POSTS_TO_RETURN))
                    .posts,
            );
            hist.saturating_record(t.elapsed().as_nanos() as u64);
        }
        elapsed = start.elapsed();
        stop.store(true, Ordering::Relaxed);
    });
    let rate = ingested.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64().max(1e-9);
    (hist, rate)
}

/// Agreement of the two stores' answers, with every difference classified.
#[derive(Debug, Default)]
struct Agreement {
    compared: usize,
    differing: usize,
    /// Differing answers by the first reason found.
    by_reason: HashMap<&'static str, usize>,
}

impl Agreement {
    fn json(&self) -> Value {
        json!({"compared": self.compared, "agreeing": self.compared - self.differing,
               "differing": self.differing, "by_reason": self.by_reason})
    }
}

const BUG_1: &str = "bug 1: record evicted through another timeline";
const BUG_1_PARENT: &str = "bug 1: reply's parent evicted through another timeline";
const BUG_3: &str = "bug 3: dead entries used up the 500-entry scan window";
const BUG_13: &str = "bug 13: repost stored before its source never joins videos";
const SOURCE_GONE: &str =
    "rule: a repost is a video only while its source is stored and unexpired (baseline keeps it)";
const UNEXPLAINED: &str = "unexplained";
const UNEXPLAINED_EXTRA: &str = "unexplained: baseline returned a post the engine did not";
const UNEXPLAINED_CUT: &str = "unexplained: only the cut differs";

/// True if `post_id` is a repost without its own video whose source is no longer a video source
/// (deleted, or expired at the workload's now): the engine does not return it as a video
/// (`BEHAVIOUR.md`, videos rule); the baseline keeps it in its videos timeline.
fn source_gone(baseline: &BaselineStore, w: &Workload, post_id: i64) -> bool {
    let record = w.config.post((post_id - POST_ID_BASE) as u64);
    record.is_retweet
        && !record.has_video
        && record.source_post_id.is_some_and(|source| {
            let created_at = w.config.post((source - POST_ID_BASE) as u64).created_at;
            baseline.get(source).is_none()
                || w.config.now_secs - created_at > DEFAULT_RETENTION_SECS
        })
}

/// Why the baseline's answer has `post_id`, which the engine did not return.
fn explain_extra(
    baseline: &BaselineStore,
    w: &Workload,
    post_id: i64,
    video: bool,
) -> &'static str {
    if video && source_gone(baseline, w, post_id) {
        SOURCE_GONE
    } else {
        UNEXPLAINED_EXTRA
    }
}

/// Why the baseline's answer lacks `post_id`, which the engine returned, read from the
/// baseline's state and the workload's record of the post.
fn explain_missing(
    baseline: &BaselineStore,
    w: &Workload,
    post_id: i64,
    video: bool,
    exclude: &HashSet<i64>,
) -> &'static str {
    let record = w.config.post((post_id - POST_ID_BASE) as u64);
    let kind = if video {
        TimelineKind::Videos
    } else if record.is_original() {
        TimelineKind::Originals
    } else {
        TimelineKind::Secondary
    };
    let timeline = baseline.timeline(kind, record.author_id);
    let indexed = timeline.iter().any(|t| t.post_id == post_id);
    if baseline.get(post_id).is_none() {
        let in_any = [
            TimelineKind::Originals,
            TimelineKind::Secondary,
            TimelineKind::Videos,
        ]
        .into_iter()
        .any(|k| {
            baseline
                .timeline(k, record.author_id)
                .iter()
                .any(|t| t.post_id == post_id)
        });
        return if in_any { BUG_1 } else { UNEXPLAINED };
    }
    if !indexed {
        let source_is_video = record.source_post_id.is_some_and(|source| {
            let source = w.config.post((source - POST_ID_BASE) as u64);
            source.has_video && !source.is_reply
        });
        return if video && record.is_retweet && source_is_video {
            BUG_13
        } else {
            UNEXPLAINED
        };
    }
    if let Some(parent) = record.in_reply_to_post_id
        && baseline.get(parent).is_none()
        && !video
    {
        return BUG_1_PARENT;
    }
    let newest_first = || {
        timeline
            .iter()
            .rev()
            .filter(|t| !exclude.contains(&t.post_id))
    };
    let position = newest_first()
        .position(|t| t.post_id == post_id)
        .unwrap_or(0);
    let dead_before = newest_first()
        .take(position)
        .any(|t| baseline.get(t.post_id).is_none());
    if position >= MAX_TINY_POSTS_PER_USER_SCAN || dead_before {
        return BUG_3;
    }
    // The baseline spent its per-author budget on reposts the engine no longer returns.
    if video
        && newest_first()
            .take(position)
            .any(|t| source_gone(baseline, w, t.post_id))
    {
        return SOURCE_GONE;
    }
    UNEXPLAINED
}

fn agreement(
    baseline: &BaselineStore,
    w: &Workload,
    engine: &[Answer],
    base: &[Answer],
    video: bool,
) -> Agreement {
    let mut result = Agreement::default();
    for (i, (e, b)) in engine.iter().zip(base).enumerate() {
        result.compared += 1;
        let threshold = e.cut.max(b.cut);
        if e.cut == b.cut && e.newer_than(threshold) == b.newer_than(threshold) {
            continue;
        }
        result.differing += 1;
        let b_all: HashSet<i64> = b.posts.iter().map(|(id, _)| *id).collect();
        let e_all: HashSet<i64> = e.posts.iter().map(|(id, _)| *id).collect();
        let only_engine: Vec<i64> = e
            .posts
            .iter()
            .filter(|(id, c)| *c > b.cut && !b_all.contains(id))
            .map(|(id, _)| *id)
            .collect();
        let only_baseline: Vec<i64> = b
            .posts
            .iter()
            .filter(|(id, c)| *c > e.cut && !e_all.contains(id))
            .map(|(id, _)| *id)
            .collect();
        let reason = if only_engine.is_empty() && only_baseline.is_empty() {
            UNEXPLAINED_CUT
        } else {
            // Every post only one side returned must be explained: the answer counts under the
            // first post's reason, or as unexplained if any post has no reason.
            let exclude: HashSet<i64> = w.excludes[i].iter().copied().collect();
            let reasons: Vec<&'static str> = only_baseline
                .iter()
                .map(|id| explain_extra(baseline, w, *id, video))
                .chain(
                    only_engine
                        .iter()
                        .map(|id| explain_missing(baseline, w, *id, video, &exclude)),
                )
                .collect();
            if reasons.contains(&UNEXPLAINED_EXTRA) {
                UNEXPLAINED_EXTRA
            } else if reasons.contains(&UNEXPLAINED) {
                UNEXPLAINED
            } else {
                reasons[0]
            }
        };
        *result.by_reason.entry(reason).or_default() += 1;
    }
    result
}

fn default_queries(scale: u32) -> usize {
    (100_000 / scale.max(1) as usize).clamp(100, 10_000)
}

/// Engine advantage: >1 means the engine is better.
fn advantage(engine: f64, baseline: f64, higher_is_better: bool) -> f64 {
    let (num, den) = if higher_is_better {
        (engine, baseline)
    } else {
        (baseline, engine)
    };
    if den > 0.0 { num / den } else { 0.0 }
}

/// `--base`: writes `engine` as a base file, loads it under a fresh store for each of
/// `--base-pages`, and measures the store floor of the engine and the bases side by side.
fn measure_bases(
    args: &Args,
    name: &str,
    engine: &PostStore,
    clock: &Arc<ManualClock>,
    viewers: &[(&Viewer, &[i64])],
) -> Result<(Vec<StoreRounds>, Value)> {
    let dir = args.base_dir.clone().unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("compare-{}.thsnap", std::process::id()));
    let started = Instant::now();
    let out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
    let written = engine.write_base(&SnapshotMeta::default(), out);
    let written = match written {
        Ok(summary) => summary,
        Err(error) => {
            let _ = std::fs::remove_file(&path);
            return Err(error.into());
        }
    };
    let write_secs = started.elapsed().as_secs_f64();
    let posts = written.counts.posts;
    let bytes = written.counts.bytes;
    eprintln!(
        "[{name}] base file: {bytes} bytes, {posts} posts ({:.1} bytes per post), written in {write_secs:.2}s",
        bytes as f64 / posts.max(1) as f64
    );
    let mut bases = Vec::new();
    let mut loads = Vec::new();
    for pages in &args.base_pages {
        let held = match pages.as_str() {
            "mapped" => BasePages::Mapped,
            "huge" => BasePages::HugeCopy,
            other => anyhow::bail!("--base-pages: `mapped` or `huge`, not `{other}`"),
        };
        release_free_memory();
        let store = PostStore::with_clock(DEFAULT_RETENTION_SECS, Arc::clone(clock) as _);
        let started = Instant::now();
        let report = store.load_base_file(&std::fs::File::open(&path)?, 2, held)?;
        let load_secs = started.elapsed().as_secs_f64();
        let started = Instant::now();
        store.check_base(2)?;
        let check_secs = started.elapsed().as_secs_f64();
        eprintln!(
            "[{name}] base ({pages}): loaded in {load_secs:.3}s (map {:.3}s, verify {:.3}s, restore {:.3}s), {} anonymous bytes; every record checked in {check_secs:.2}s",
            report.map_duration.as_secs_f64(),
            report.verify_duration.as_secs_f64(),
            report.restore_duration.as_secs_f64(),
            report.anonymous_bytes,
        );
        loads.push(
            json!({"pages": pages, "load_secs": load_secs, "check_secs": check_secs,
            "map_secs": report.map_duration.as_secs_f64(),
            "verify_secs": report.verify_duration.as_secs_f64(),
            "restore_secs": report.restore_duration.as_secs_f64(),
            "anonymous_bytes": report.anonymous_bytes}),
        );
        bases.push((format!("base ({pages})"), store));
    }
    let mut stores: Vec<(String, &PostStore)> = vec![("head".to_owned(), engine)];
    stores.extend(bases.iter().map(|(name, store)| (name.clone(), store)));
    let rounds = stores_side_by_side(
        &stores,
        viewers,
        args.walk_rounds,
        engine.stats().arena_bytes_reserved,
    );
    for store in &rounds {
        eprintln!(
            "[{name}] store floor, {}: query {:.1} ns per post (hot {:.1}), {:.2}x its floor, hot {:.2}x (medians of {} rounds; per round {})",
            store.name,
            store.median_of(|r| r.query_ns_per_post),
            store.median_of(|r| r.hot_ns_per_post),
            store.median_of(StoreFloor::ratio),
            store.median_of(|r| r.hot_ns_per_post / r.independent_ns_per_post.max(f64::MIN_POSITIVE)),
            store.rounds.len(),
            store
                .rounds
                .iter()
                .map(|r| format!("{:.2}", r.ratio()))
                .collect::<Vec<_>>()
                .join(" / "),
        );
    }
    drop(bases);
    let _ = std::fs::remove_file(&path);
    let file = json!({"bytes": bytes, "posts": posts, "bytes_per_post": bytes as f64 / posts.max(1) as f64,
        "write_secs": write_secs, "loads": loads});
    Ok((rounds, file))
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.scale == 0 {
        bail!("--scale must be at least 1");
    }
    let kinds: Vec<Kind> = match args.only.as_deref() {
        None => vec![Kind::Engine, Kind::Baseline],
        Some("engine") => vec![Kind::Engine],
        Some("baseline") => vec![Kind::Baseline],
        Some(other) => bail!("--only takes engine or baseline, not {other}"),
    };
    let config = SynthConfig::feed_2d(args.scale, args.now_secs).with_seed(args.seed);
    let queries = args.queries.unwrap_or_else(|| default_queries(args.scale));
    let started = Instant::now();
    let batches = batches(config.backlog(), args.batch_events);
    let events = batches.iter().map(|b| b.len() as u64).sum();
    let viewers = config.viewers(queries);
    eprintln!(
        "feed-2d scale {}: {} authors, {} posts, {} events, {} viewers; generated in {:.2}s",
        args.scale,
        config.authors,
        config.posts,
        events,
        viewers.len(),
        started.elapsed().as_secs_f64()
    );
    let mut w = Workload {
        config,
        batches,
        events,
        viewers,
        excludes: Vec::new(),
    };

    let budget_secs = args
        .baseline_secs
        .unwrap_or((300.0 / f64::from(args.scale)).clamp(5.0, 30.0));
    let budget = Duration::from_secs_f64(budget_secs.max(0.1));
    let mut engine = None;
    let mut baseline = None;
    let mut agreements = None;
    for &kind in &kinds {
        match kind {
            Kind::Engine => engine = Some(run_store(kind, &mut w, &args, None, None).0),
            Kind::Baseline => {
                let (run, agree) = run_store(kind, &mut w, &args, Some(budget), engine.as_ref());
                baseline = Some(run);
                agreements = agree;
            }
        }
    }
    let mut runs: Vec<(Kind, &mut StoreRun)> = Vec::new();
    runs.extend(engine.as_mut().map(|run| (Kind::Engine, run)));
    runs.extend(baseline.as_mut().map(|run| (Kind::Baseline, run)));
    more_ingest_rounds(&w, &args, &mut runs);
    report(
        &args,
        &w,
        engine.as_ref(),
        baseline.as_ref(),
        agreements.as_ref(),
    );
    Ok(())
}

fn report(
    args: &Args,
    w: &Workload,
    engine: Option<&StoreRun>,
    baseline: Option<&StoreRun>,
    agreements: Option<&[Agreement; 2]>,
) {
    let empty = StoreRun::default();
    let (e, b) = (engine.unwrap_or(&empty), baseline.unwrap_or(&empty));
    println!();
    println!(
        "feed-2d scale {} ({} authors, {} posts, {} events), one process, 2 cores shared",
        args.scale, w.config.authors, w.config.posts, w.events
    );
    println!(
        "{:<44} {:>14} {:>14} {:>9}",
        "metric", "engine", "baseline", "advantage"
    );
    let row = |label: &str, ev: f64, bv: f64, higher_is_better: bool, unit: &str| {
        println!(
            "{:<44} {:>14} {:>14} {:>8.1}x",
            label,
            format!("{ev:.1}{unit}"),
            format!("{bv:.1}{unit}"),
            advantage(ev, bv, higher_is_better)
        );
    };
    let kilo = |v: f64| v / 1000.0;
    row(
        "ingest, 1 writer (k events/s)",
        kilo(e.ingest_rate(e.ingest_1w_secs)),
        kilo(b.ingest_rate(b.ingest_1w_secs)),
        true,
        "k",
    );
    row(
        "ingest, 2 writers (k events/s)",
        kilo(e.ingest_rate(e.ingest_2w_secs)),
        kilo(b.ingest_rate(b.ingest_2w_secs)),
        true,
        "k",
    );
    row(
        "resident bytes per stored post (RSS delta)",
        e.bytes_per_post(),
        b.bytes_per_post(),
        false,
        "",
    );
    let lat = |label: &str, el: &Latency, bl: &Latency| {
        row(
            &format!("{label} p50 (us)"),
            el.p50_us,
            bl.p50_us,
            false,
            "",
        );
        row(
            &format!("{label} p99 (us)"),
            el.p99_us,
            bl.p99_us,
            false,
            "",
        );
        row(
            &format!("{label} p99.9 (us)"),
            el.p999_us,
            bl.p999_us,
            false,
            "",
        );
    };
    lat("query idle, all viewers", &e.idle_all, &b.idle_all);
    lat("query idle, 2000 follows", &e.idle_2000, &b.idle_2000);
    lat("query idle, 10000 follows", &e.idle_10000, &b.idle_10000);
    lat("video query idle", &e.idle_video, &b.idle_video);
    row(
        "query under ingest p50 (us)",
        e.under_ingest.p50_us,
        b.under_ingest.p50_us,
        false,
        "",
    );
    row(
        "query under ingest p99 (us)",
        e.under_ingest.p99_us,
        b.under_ingest.p99_us,
        false,
        "",
    );
    // Like with like: the idle p99 of the same viewers the under-ingest phase queried (the
    // bar's ratio), and, for comparison with earlier runs, the idle p99 of every viewer.
    let under_over_idle =
        |r: &StoreRun| ratio_or_zero(r.under_ingest.p99_us, r.idle_same_viewers.p99_us);
    let under_over_idle_all =
        |r: &StoreRun| ratio_or_zero(r.under_ingest.p99_us, r.idle_all.p99_us);
    println!(
        "{:<44} {:>14} {:>14}",
        "under-ingest p99 / idle p99, same viewers",
        format!("{:.2}", under_over_idle(e)),
        format!("{:.2}", under_over_idle(b))
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "under-ingest p99 / idle p99, all viewers",
        format!("{:.2}", under_over_idle_all(e)),
        format!("{:.2}", under_over_idle_all(b))
    );
    if let Some(floor) = &e.line_floor {
        println!(
            "{:<44} {:>14} {:>14} {:>8.2}x",
            "store floor, 2000 follows (CPU ns per post)",
            format!("{:.1}", floor.query_ns_per_post),
            format!("{:.1}", floor.independent_ns_per_post),
            floor.ratio()
        );
        println!(
            "  (the baseline column: independent random reads of the {} lines the query must \
             touch, in {} MiB: {} authors + ring + {} posts, p50 of {} viewers; dependent reads \
             {:.1} ns per post; the same query again with every line cached {:.1} ns per post; \
             the last column is query / floor, not an advantage)",
            floor.lines,
            floor.arena_bytes >> 20,
            floor.authors,
            floor.posts,
            floor.viewers,
            floor.dependent_ns_per_post,
            floor.hot_ns_per_post
        );
    }
    for walk in &e.walks {
        println!(
            "{:<44} {:>14} {:>14} {:>8.2}x",
            format!("  walk {} (medians of rounds)", walk_name(walk.walk)),
            format!("{:.1}", walk.median_of(|r| r.query_ns_per_post)),
            format!("{:.1}", walk.median_of(|r| r.independent_ns_per_post)),
            walk.median_of(StoreFloor::ratio)
        );
        println!(
            "{:<44} {:>14}",
            "    hot (ns per post), wall p50 / p99 (us)",
            format!(
                "{:.1}, {:.0} / {:.0}",
                walk.median_of(|r| r.hot_ns_per_post),
                walk.wall_us(0.5),
                walk.wall_us(0.99)
            )
        );
    }
    println!(
        "{:<44} {:>14} {:>14}",
        "achieved ingest rate while querying",
        format!("{:.0}/s", e.achieved_ingest_rate),
        format!("{:.0}/s", b.achieved_ingest_rate)
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "queries measured (normal / video / ingest)",
        format!(
            "{}/{}/{}",
            e.idle_all.count, e.idle_video.count, e.under_ingest.count
        ),
        format!(
            "{}/{}/{}",
            b.idle_all.count, b.idle_video.count, b.under_ingest.count
        )
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "stored posts / finish_load (s)",
        format!("{}/{:.1}", e.stored_posts, e.finish_load_secs),
        format!("{}/{:.1}", b.stored_posts, b.finish_load_secs)
    );
    if let Some([normal, video]) = agreements {
        for (label, a) in [("normal", normal), ("video", video)] {
            println!(
                "agreement ({label}): {}/{} answers agree",
                a.compared - a.differing,
                a.compared
            );
            let mut reasons: Vec<_> = a.by_reason.iter().collect();
            reasons.sort();
            for (reason, count) in reasons {
                println!("    {count:>6}  {reason}");
            }
        }
    }
    println!(
        "memory: RSS delta from /proc/self/statm around loading each store (loaded one after the other, \
         the previous freed and malloc_trim'd); ingest excludes finish_load (baseline: finalize_init)"
    );
    println!(
        "each timed load starts {:.1} s after the previous store was freed (--settle-secs)",
        args.settle_secs
    );
    if args.ingest_rounds > 1 {
        let secs = |rounds: &[f64]| {
            rounds
                .iter()
                .map(|secs| format!("{secs:.2}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "ingest lines: the median of {} rounds (--ingest-rounds), seconds per load: engine \
             1 writer {}, 2 writers {}; baseline 1 writer {}, 2 writers {}",
            args.ingest_rounds,
            secs(&e.ingest_1w_rounds),
            secs(&e.ingest_2w_rounds),
            secs(&b.ingest_1w_rounds),
            secs(&b.ingest_2w_rounds),
        );
    }
    if args.live_events_to != LiveTarget::Store {
        println!(
            "diagnostic: the under-ingest phase's live events went to {:?} (--live-events-to)",
            args.live_events_to
        );
    }
    println!("peak process RSS: {} MiB", peak_rss_bytes() >> 20);
    let json = json!({
        "workload": "feed-2d",
        "scale": args.scale,
        "seed": args.seed,
        "authors": w.config.authors,
        "posts": w.config.posts,
        "events": w.events,
        "memory_method": "rss_delta_proc_statm",
        "settle_secs": args.settle_secs,
        "live_events_to": format!("{:?}", args.live_events_to),
        "peak_rss_bytes": peak_rss_bytes(),
        "ingest_rate_events_per_sec_target": args.ingest_rate,
        "engine": engine.map(StoreRun::json),
        "baseline": baseline.map(StoreRun::json),
        "advantage": {
            "ingest_1w": advantage(e.ingest_rate(e.ingest_1w_secs), b.ingest_rate(b.ingest_1w_secs), true),
            "ingest_2w": advantage(e.ingest_rate(e.ingest_2w_secs), b.ingest_rate(b.ingest_2w_secs), true),
            "bytes_per_post": advantage(e.bytes_per_post(), b.bytes_per_post(), false),
            "query_idle_p50": advantage(e.idle_all.p50_us, b.idle_all.p50_us, false),
            "query_idle_p99": advantage(e.idle_all.p99_us, b.idle_all.p99_us, false),
            "query_idle_2000_p50": advantage(e.idle_2000.p50_us, b.idle_2000.p50_us, false),
            "query_idle_2000_p99": advantage(e.idle_2000.p99_us, b.idle_2000.p99_us, false),
            "video_idle_p50": advantage(e.idle_video.p50_us, b.idle_video.p50_us, false),
            "video_idle_p99": advantage(e.idle_video.p99_us, b.idle_video.p99_us, false),
            "query_under_ingest_p50": advantage(e.under_ingest.p50_us, b.under_ingest.p50_us, false),
            "query_under_ingest_p99": advantage(e.under_ingest.p99_us, b.under_ingest.p99_us, false),
        },
        "under_ingest_p99_over_idle_p99": {"engine": under_over_idle(e), "baseline": under_over_idle(b)},
        "under_ingest_p99_over_idle_p99_all_viewers": {"engine": under_over_idle_all(e), "baseline": under_over_idle_all(b)},
        "agreement": agreements.map(|[n, v]| json!({"normal": n.json(), "video": v.json()})),
    });
    println!("{json}");
}

/// `a / b`, or 0 when `b` is not positive (a phase that did not run).
fn ratio_or_zero(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}
