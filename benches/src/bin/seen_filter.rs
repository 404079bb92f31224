//! The seen filter against the exclude list, measured side by side in one run.
//!
//! ```text
//! cargo run --release -p thunder-benches --bin seen_filter -- --scale 100 --rounds 300
//! ```
//!
//! 1. False-positive rate against bits per id: filters of `--ids` random ids, probed with
//!    `--probes` other random ids.
//! 2. Request cost with 10,000 seen ids sent as `exclude_tweet_ids` vs as a `seen_filter`
//!    (10 bits per id): wire bytes, protobuf decode, filter read, and the engine query (a
//!    viewer of the feed-2d backlog), each as the median thread CPU time over `--rounds` rounds
//!    with the variants interleaved in every round (CPU time, so that other processes on a
//!    shared machine do not count). Two seen sets: the first page the viewer was served (1200
//!    posts) plus other ids, and the viewer's whole answer (every scanned post is seen: the
//!    worst case, where every entry is checked and skipped).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use prost::Message;
use thunder_benches::{DEFAULT_BATCH_EVENTS, batches, load};
use thunder_engine::config::{DEFAULT_RETENTION_SECS, MAX_POSTS_TO_RETURN};
use thunder_engine::seen::SEEN_FILTER_FORMAT_SBBF_XXH64;
use thunder_engine::{FeedQuery, ManualClock, PostStore, SeenFilter, Store};
use thunder_proto::GetInNetworkPostsRequest;
use thunder_workload::SynthConfig;

/// Flags.
#[derive(Parser, Debug)]
struct Args {
    /// Workload divisor (1: 1M authors, 20M posts).
    #[arg(long, default_value_t = 100)]
    scale: u32,
    /// Measurement rounds (each runs every variant once).
    #[arg(long, default_value_t = 300)]
    rounds: usize,
    /// Seen ids per request.
    #[arg(long, default_value_t = 10_000)]
    ids: usize,
    /// Probes per false-positive measurement.
    #[arg(long, default_value_t = 1_000_000)]
    probes: usize,
}

const NOW_SECS: i64 = 1_750_000_000;

/// xorshift64*: deterministic ids without a dependency.
struct Ids(u64);

impl Ids {
    fn next(&mut self) -> i64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 1) as i64
    }
}

fn false_positive_table(args: &Args) {
    println!(
        "false positives: {} ids, {} probes of other ids",
        args.ids, args.probes
    );
    println!(
        "{:>12} {:>10} {:>12} {:>14}",
        "bits per id", "bytes", "measured FP", "bytes per id"
    );
    let mut rng = Ids(0x9e37_79b9_7f4a_7c15);
    let ids: Vec<i64> = (0..args.ids).map(|_| rng.next()).collect();
    let inserted: std::collections::HashSet<i64> = ids.iter().copied().collect();
    for bits_per_id in [4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0] {
        let mut filter = SeenFilter::for_ids(ids.len(), bits_per_id, 0);
        ids.iter().for_each(|&id| filter.insert(id));
        let mut probes = 0usize;
        let mut hits = 0usize;
        while probes < args.probes {
            let id = rng.next();
            if inserted.contains(&id) {
                continue;
            }
            probes += 1;
            hits += usize::from(filter.contains(id));
        }
        let bytes = filter.to_bytes().len();
        println!(
            "{:>12} {:>10} {:>11.3}% {:>14.2}",
            bits_per_id,
            bytes,
            100.0 * hits as f64 / probes as f64,
            bytes as f64 / ids.len() as f64
        );
    }
}

/// CPU time this thread has used.
fn thread_cpu_time() -> Duration {
    thunder_benches::cpu_time(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rounds == 0 || args.ids == 0 {
        bail!("--rounds and --ids must be positive");
    }
    false_positive_table(&args);

    let config = SynthConfig::feed_2d(args.scale, NOW_SECS);
    let store = PostStore::with_clock(DEFAULT_RETENTION_SECS, Arc::new(ManualClock::new(NOW_SECS)));
    load(&store, &batches(config.backlog(), DEFAULT_BATCH_EVENTS), 1);
    store.finish_load();
    let viewer = (0..)
        .map(|i| config.viewer(i))
        .find(|v| v.following.len() == 2000 || v.following.len() as u64 * 2 >= config.authors)
        .ok_or_else(|| anyhow::anyhow!("no viewer"))?;

    for first_page_only in [true, false] {
        scenario(&args, &store, &viewer, first_page_only);
    }
    Ok(())
}

/// Measures one seen set: the viewer's first page (`first_page_only`) or whole answer, topped
/// up with other ids to `--ids`.
fn scenario(
    args: &Args,
    store: &PostStore,
    viewer: &thunder_workload::Viewer,
    first_page_only: bool,
) {
    // Seen: every post of the viewer's whole answer (what a client that read it all has
    // seen), topped up with other ids to `--ids`.
    let whole = FeedQuery {
        max_results: if first_page_only {
            MAX_POSTS_TO_RETURN
        } else {
            10_000
        },
        ..FeedQuery::new(viewer.user_id, &viewer.following)
    };
    let mut seen_ids: Vec<i64> = store
        .get_all_posts_by_users(&whole)
        .posts
        .iter()
        .map(|p| p.post_id)
        .take(args.ids)
        .collect();
    let from_answer = seen_ids.len();
    let mut rng = Ids(7);
    while seen_ids.len() < args.ids {
        seen_ids.push(rng.next());
    }
    let filter = SeenFilter::from_ids(&seen_ids, 0);
    let filter_bytes = filter.to_bytes();

    let base = GetInNetworkPostsRequest {
        user_id: viewer.user_id as u64,
        following_user_ids: viewer.following.iter().map(|&a| a as u64).collect(),
        ..Default::default()
    };
    let list_request = GetInNetworkPostsRequest {
        exclude_tweet_ids: seen_ids.iter().map(|&id| id as u64).collect(),
        ..base.clone()
    }
    .encode_to_vec();
    let filter_request = GetInNetworkPostsRequest {
        seen_filter: Some(thunder_proto::SeenFilter {
            format: SEEN_FILTER_FORMAT_SBBF_XXH64 as i32,
            seed: 0,
            num_blocks: filter.num_blocks(),
            bits: filter_bytes.clone(),
        }),
        ..base.clone()
    }
    .encode_to_vec();
    let base_request = base.encode_to_vec();

    let query = FeedQuery {
        max_results: MAX_POSTS_TO_RETURN,
        ..FeedQuery::new(viewer.user_id, &viewer.following)
    };
    let list_query = FeedQuery {
        exclude: &seen_ids,
        ..query.clone()
    };
    let filter_query = FeedQuery {
        seen: Some(&filter),
        ..query.clone()
    };
    let by_list = store.get_all_posts_by_users(&list_query).posts;
    let by_filter = store.get_all_posts_by_users(&filter_query).posts;
    let listed: std::collections::HashSet<i64> = by_list.iter().map(|p| p.post_id).collect();
    let only_in_list = by_list
        .iter()
        .filter(|p| !by_filter.iter().any(|q| q.post_id == p.post_id))
        .count();
    let only_in_filter = by_filter
        .iter()
        .filter(|p| !listed.contains(&p.post_id))
        .count();

    let names = [
        "query, nothing seen",
        "query, 10k exclude list",
        "query, 10k seen filter",
        "decode request, exclude list",
        "decode request, seen filter",
        "read seen filter bytes",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(args.rounds); names.len()];
    for round in 0..args.rounds {
        for k in 0..names.len() {
            // Rotate the order each round so no variant always runs first.
            let variant = (k + round) % names.len();
            let started = thread_cpu_time();
            match variant {
                0 => drop(black_box(store.get_all_posts_by_users(black_box(&query)))),
                1 => drop(black_box(
                    store.get_all_posts_by_users(black_box(&list_query)),
                )),
                2 => drop(black_box(
                    store.get_all_posts_by_users(black_box(&filter_query)),
                )),
                3 => drop(black_box(GetInNetworkPostsRequest::decode(black_box(
                    list_request.as_slice(),
                )))),
                4 => drop(black_box(GetInNetworkPostsRequest::decode(black_box(
                    filter_request.as_slice(),
                )))),
                _ => drop(black_box(SeenFilter::from_parts(
                    1,
                    0,
                    filter.num_blocks(),
                    black_box(&filter_bytes),
                ))),
            }
            samples[variant].push(thread_cpu_time().saturating_sub(started));
        }
    }
    let medians: Vec<Duration> = samples.iter_mut().map(|s| median(s)).collect();

    println!();
    println!(
        "request cost: scale {}, {} followed authors, {} seen ids ({} from the viewer's {}), \
         {} rounds, median thread CPU time",
        args.scale,
        viewer.following.len(),
        seen_ids.len(),
        from_answer,
        if first_page_only {
            "first page"
        } else {
            "whole answer"
        },
        args.rounds
    );
    println!(
        "wire: request without seen ids {} B, with the exclude list {} B, with the filter {} B",
        base_request.len(),
        list_request.len(),
        filter_request.len()
    );
    for (name, m) in names.iter().zip(&medians) {
        println!("{name:>30}: {:>9.1} us", micros(*m));
    }
    let list_total = medians[1] + medians[3];
    let filter_total = medians[2] + medians[4] + medians[5];
    println!(
        "query overhead over nothing seen: list {:+.1} us, filter {:+.1} us",
        micros(medians[1]) - micros(medians[0]),
        micros(medians[2]) - micros(medians[0])
    );
    println!(
        "decode + read + query: list {:.1} us, filter {:.1} us, list / filter = {:.2}x",
        micros(list_total),
        micros(filter_total),
        list_total.as_secs_f64() / filter_total.as_secs_f64()
    );
    println!(
        "answers ({} posts by list): {} only by the list (the filter's false positives), {} only by the filter",
        by_list.len(),
        only_in_list,
        only_in_filter
    );
}
