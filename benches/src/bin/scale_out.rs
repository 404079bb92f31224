//! Replicas vs author shards, side by side in one process on the feed-2d workload: for a full
//! store and for shard 0 of N (for each N asked), the resident bytes of the loaded store, the
//! posts and directory facts it holds, and its single-thread query rate (answers per CPU
//! second of the querying thread, and wall p50/p99) for the same viewers.
//!
//! A shard is asked what `thunder-client` asks it: the viewer's whole following list (the
//! reply rule needs it), of which it owns about 1/N. The `own-only` rate asks only the owned
//! authors, what a request carrying the followed set separately would cost.
//!
//! ```sh
//! cargo run --release -p thunder-benches --bin scale_out -- --scale 10 --shards 2,4
//! ```

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Parser;
use hdrhistogram::Histogram;
use thunder_benches::memory::{release_free_memory, rss_bytes};
use thunder_benches::{DEFAULT_BATCH_EVENTS, batches, load};
use thunder_engine::config::DEFAULT_RETENTION_SECS;
use thunder_engine::{EventBatch, FeedQuery, ManualClock, PostStore};
use thunder_proto::shard::ShardSpec;
use thunder_workload::{SynthConfig, Viewer};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Full replica vs author shards: memory and query rate per node")]
struct Args {
    /// Workload divisor: 1 = 1M authors / 20M posts, 10 = 100k / 2M.
    #[arg(long, default_value_t = 10)]
    scale: u32,
    /// Shard counts to measure shard 0 of, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    shards: Vec<u32>,
    /// Viewers queried per store.
    #[arg(long, default_value_t = 2000)]
    queries: usize,
    /// Passes over the viewers per store (the first one warms up and is not counted).
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// The workload's "now" (unix seconds); the stores' clock stands still here.
    #[arg(long, default_value_t = 1_750_000_000)]
    now_secs: i64,
}

/// CPU time of the calling thread, in seconds.
fn thread_cpu_secs() -> f64 {
    thunder_benches::cpu_time(libc::CLOCK_THREAD_CPUTIME_ID).as_secs_f64()
}

/// Single-thread query rate of `store` over `viewers`.
struct Rate {
    answers_per_cpu_sec: f64,
    p50_us: u64,
    p99_us: u64,
    posts_returned: usize,
}

fn measure(
    store: &PostStore,
    viewers: &[Viewer],
    passes: usize,
    keep: impl Fn(i64) -> bool,
) -> Rate {
    let lists: Vec<Vec<i64>> = viewers
        .iter()
        .map(|v| v.following.iter().copied().filter(|&a| keep(a)).collect())
        .collect();
    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    let mut cpu = 0.0;
    let mut queries = 0;
    let mut posts_returned = 0;
    for pass in 0..passes.max(2) {
        let cpu_start = thread_cpu_secs();
        for (viewer, authors) in viewers.iter().zip(&lists) {
            let start = Instant::now();
            let answer = store.get_all_posts_by_users(&FeedQuery::new(viewer.user_id, authors));
            let took = start.elapsed();
            if pass > 0 {
                histogram.saturating_record(took.as_micros() as u64);
                queries += 1;
                posts_returned += answer.posts.len();
            }
        }
        if pass > 0 {
            cpu += thread_cpu_secs() - cpu_start;
        }
    }
    Rate {
        answers_per_cpu_sec: queries as f64 / cpu.max(1e-9),
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        posts_returned: posts_returned / queries.max(1),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.scale == 0 || args.shards.contains(&0) {
        bail!("--scale and every --shards value must be at least 1");
    }
    let config = SynthConfig::feed_2d(args.scale, args.now_secs);
    let batches: Vec<EventBatch> = batches(config.backlog(), DEFAULT_BATCH_EVENTS);
    let events: usize = batches.iter().map(EventBatch::len).sum();
    let viewers = config.viewers(args.queries);
    eprintln!(
        "feed-2d scale {}: {} authors, {} posts; {} viewers, {} passes",
        args.scale,
        config.authors,
        config.posts,
        viewers.len(),
        args.passes
    );
    let mut nodes: Vec<Option<ShardSpec>> = vec![None];
    nodes.extend(
        args.shards
            .iter()
            .map(|&count| Some(ShardSpec { index: 0, count })),
    );
    println!(
        "| node | ingest events/s (1 writer) | stored posts | facts | RSS MiB | RSS B / workload post | directory B / fact | answers/CPU-s | p50 / p99 us | own-only answers/CPU-s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut full_rate = None;
    for node in nodes {
        release_free_memory();
        let before = rss_bytes();
        let clock = std::sync::Arc::new(ManualClock::new(args.now_secs));
        let mut store = PostStore::with_clock(DEFAULT_RETENTION_SECS, clock);
        if let Some(spec) = node {
            store = store.with_fact_directory(move |a| spec.owns(a));
        }
        let ingest = load(&store, &batches, 1);
        let rss = rss_bytes().saturating_sub(before);
        let stored = store.stats().posts;
        let directory = store.directory_stats();
        let rate = measure(&store, &viewers, args.passes, |_| true);
        let own = node.map(|spec| measure(&store, &viewers, args.passes, |a| spec.owns(a)));
        let name = node.map_or("full replica".to_owned(), |s| format!("shard {s}"));
        let facts = directory.map_or(0, |d| d.facts);
        let per_fact = directory.map_or("-".to_owned(), |d| {
            format!("{:.1}", d.table_bytes as f64 / d.facts.max(1) as f64)
        });
        println!(
            "| {name} | {:.0} | {stored} | {facts} | {} | {:.1} | {per_fact} | {:.0} | {} / {} | {} |",
            events as f64 / ingest.as_secs_f64().max(1e-9),
            rss >> 20,
            rss as f64 / config.posts as f64,
            rate.answers_per_cpu_sec,
            rate.p50_us,
            rate.p99_us,
            own.map_or("-".to_owned(), |o| format!("{:.0}", o.answers_per_cpu_sec)),
        );
        let full = *full_rate.get_or_insert(rate.answers_per_cpu_sec);
        eprintln!(
            "{name}: {} posts per answer; rate vs full replica {:.2}x; directory {:?}",
            rate.posts_returned,
            rate.answers_per_cpu_sec / full,
            directory
        );
        drop(store);
    }
    Ok(())
}
