//! The store query of `scripts/serve-bench.sh`'s *full* request, alone: the demo store
//! (`feed_2d` at `--scale`, loaded as the demo server loads it) and the first demo viewer
//! following at least `--follows` authors, asked for its 1200 newest posts. Prints the thread
//! CPU time per query (median and quartiles over `--rounds` rounds of `--queries` queries),
//! so two builds can be run alternately and compared without the gRPC stack around them.
//!
//! `cargo run --release -p thunder-benches --bin full_query -- [--scale 100] [--rounds 15]
//! [--evict-mib 16] [--max-results 0] [--exclude-previous]` (0: the author step alone, no post
//! merged)

use clap::Parser;
use std::time::Duration;
use thunder_engine::{EventBatch, FeedQuery, PostStore, Store};
use thunder_workload::SynthConfig;

#[derive(Parser)]
struct Args {
    /// Demo scale (the demo server's default is 100).
    #[arg(long, default_value_t = 100)]
    scale: u32,
    /// Authors the viewer follows (the full request's 2000).
    #[arg(long, default_value_t = 2000)]
    follows: usize,
    /// Rounds; each prints nothing, the summary is over their per-query means.
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// Queries per round.
    #[arg(long, default_value_t = 500)]
    queries: usize,
    /// Ask for videos instead of the feed.
    #[arg(long)]
    videos: bool,
    /// Before each query, write over this many MiB (untimed), so the query finds the caches
    /// as a server does after encoding, writing and serving other calls (0: back to back,
    /// everything the query touched still cached).
    #[arg(long, default_value_t = 0)]
    evict_mib: usize,
    /// Posts asked for (the full request's 1200); 0 times the author resolution alone.
    #[arg(long, default_value_t = thunder_engine::config::MAX_POSTS_TO_RETURN)]
    max_results: usize,
    /// Exclude 500 posts of the viewer's previous answer, as `compare`'s queries do (a feed
    /// client excludes what it has shown).
    #[arg(long)]
    exclude_previous: bool,
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let store = PostStore::new(thunder_engine::config::DEFAULT_RETENTION_SECS);
    let config = SynthConfig::feed_2d(args.scale.max(1), store.now_secs());
    let mut batch = Vec::with_capacity(1000);
    for event in config.backlog() {
        batch.push(event);
        if batch.len() == 1000 {
            for b in EventBatch::split(batch.drain(..), 1000) {
                store.apply(&b);
            }
        }
    }
    for b in EventBatch::split(batch.drain(..), 1000) {
        store.apply(&b);
    }
    let viewer = (0..1000)
        .map(|i| config.viewer(i))
        .find(|v| v.following.len() >= args.follows)
        .ok_or_else(|| anyhow::anyhow!("no viewer follows {} authors", args.follows))?;
    let authors = &viewer.following[..args.follows];
    let exclude = if args.exclude_previous {
        let previous = store.get_all_posts_by_users(&FeedQuery::new(viewer.user_id, authors));
        thunder_workload::exclude_from_answer(&viewer, previous.posts.iter().map(|p| p.post_id))
    } else {
        Vec::new()
    };
    let query = FeedQuery {
        max_results: args.max_results,
        exclude: &exclude,
        ..FeedQuery::new(viewer.user_id, authors)
    };
    let run = || {
        if args.videos {
            store.get_videos_by_users(&query)
        } else {
            store.get_all_posts_by_users(&query)
        }
    };
    let posts = run().posts.len();
    let mut evict = vec![0u8; args.evict_mib << 20];
    let mut sweep = 0u8;
    let mut timed = || {
        sweep = sweep.wrapping_add(1);
        for line in evict.chunks_mut(64) {
            line[0] = sweep;
        }
        std::hint::black_box(&evict);
        let start = thread_cpu();
        std::hint::black_box(run());
        thread_cpu() - start
    };
    for _ in 0..args.queries {
        timed();
    }
    let mut means: Vec<f64> = (0..args.rounds)
        .map(|_| {
            let total: Duration = (0..args.queries).map(|_| timed()).sum();
            total.as_secs_f64() * 1e6 / args.queries as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((means.len() - 1) as f64 * q).round() as usize];
    println!(
        "scale {} follows {} evict {} MiB posts/answer {posts}: thread CPU per query p25 / median / p75 {:.1} / {:.1} / {:.1} us ({} rounds of {})",
        args.scale,
        args.follows,
        args.evict_mib,
        at(0.25),
        at(0.5),
        at(0.75),
        args.rounds,
        args.queries
    );
    Ok(())
}
