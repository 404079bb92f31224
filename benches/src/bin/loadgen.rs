//! gRPC load generator for a running thunder server.
//!
//! ```text
//! cargo run --release -p thunder-benches --bin loadgen -- \
//!     --addr http://127.0.0.1:9090 --scale 100 --rate 10000 --duration-secs 20
//! ```
//!
//! Requests are 2000-author (10% 10000-author) feeds of the synthetic viewers of the feed-2d
//! workload at the same scale and seed as the server's demo mode, each excluding 500 ids of
//! that viewer's previous answer. `--concurrency` tasks share `--connections` HTTP/2
//! connections and together offer `--rate` requests/s (0 = as fast as answers come back).
//! Prints achieved QPS, latency percentiles of successful calls, the count of each gRPC
//! status (RESOURCE_EXHAUSTED separately) and of the OK answers the server marked degraded
//! (the `thunder-degraded` response header), then one JSON line.

use anyhow::{Context, Result, bail};
use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thunder_proto::GetInNetworkPostsRequest;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_workload::{DEFAULT_SEED, SynthConfig, Viewer, exclude_from_answer};
use tonic::transport::{Channel, Endpoint};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Load generator for the GetInNetworkPosts gRPC endpoint")]
struct Args {
    /// Server address.
    #[arg(long, default_value = "http://127.0.0.1:9090")]
    addr: String,
    /// Workload scale of the viewers (the server's demo default is 100).
    #[arg(long, default_value_t = 100)]
    scale: u32,
    /// Workload seed (the server's demo uses the default).
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Distinct synthetic viewers cycled through.
    #[arg(long, default_value_t = 1000)]
    viewers: usize,
    /// Concurrent request loops.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections shared by the loops.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Offered requests per second over all loops; 0 = closed loop, no pacing.
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// Stop after this many requests (0 = no bound).
    #[arg(long, default_value_t = 0)]
    requests: u64,
    /// Stop after this many seconds (0 = no bound; default 10 s when no bound is given).
    #[arg(long)]
    duration_secs: Option<f64>,
    /// Share of video requests.
    #[arg(long, default_value_t = 0.0)]
    video_share: f64,
    /// Do not send exclude lists.
    #[arg(long)]
    no_exclude: bool,
    /// Per-call timeout, milliseconds.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
}

/// What one request loop measured.
struct LoopResult {
    ok_latency: Histogram<u64>,
    statuses: BTreeMap<String, u64>,
    posts_returned: u64,
    /// OK answers carrying the `thunder-degraded` header (a cheaper, partial answer).
    degraded: u64,
}

/// Response header of an answer computed at a degrade level above 0.
const DEGRADED_HEADER: &str = "thunder-degraded";

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

fn status_name(code: tonic::Code) -> String {
    format!("{code:?}")
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.concurrency == 0 || args.connections == 0 || args.viewers == 0 {
        bail!("--concurrency, --connections and --viewers must be at least 1");
    }
    let duration = match (args.duration_secs, args.requests) {
        (Some(secs), _) if secs > 0.0 => Some(Duration::from_secs_f64(secs)),
        (None, 0) => Some(Duration::from_secs(10)),
        _ => None,
    };
    let config = SynthConfig::feed_2d(args.scale, 0).with_seed(args.seed);
    let viewers: Arc<Vec<Viewer>> = Arc::new(config.viewers(args.viewers));

    let endpoint = Endpoint::from_shared(args.addr.clone())
        .context("invalid --addr")?
        .tcp_nodelay(true)
        .timeout(Duration::from_millis(args.timeout_ms));
    let mut channels = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        channels.push(
            endpoint
                .connect()
                .await
                .with_context(|| format!("connecting to {}", args.addr))?,
        );
    }
    eprintln!(
        "{} viewers (scale {}), {} loops over {} connections, offered rate {}",
        viewers.len(),
        args.scale,
        args.concurrency,
        args.connections,
        if args.rate == 0 {
            "unbounded".to_string()
        } else {
            format!("{}/s", args.rate)
        }
    );

    let start = Instant::now();
    let deadline = duration.map(|d| start + d);
    let mut tasks = Vec::with_capacity(args.concurrency);
    for task in 0..args.concurrency {
        let client = InNetworkPostsServiceClient::new(channels[task % channels.len()].clone())
            .max_decoding_message_size(64 << 20);
        let budget = if args.requests == 0 {
            u64::MAX
        } else {
            args.requests / args.concurrency as u64
                + u64::from((task as u64) < args.requests % args.concurrency as u64)
        };
        let period = (args.rate > 0)
            .then(|| Duration::from_secs_f64(args.concurrency as f64 / args.rate as f64));
        tasks.push(tokio::spawn(request_loop(
            client,
            Arc::clone(&viewers),
            task,
            args.concurrency,
            budget,
            deadline,
            period,
            args.video_share,
            !args.no_exclude,
        )));
    }
    let mut ok_latency = histogram();
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    let mut posts_returned = 0;
    let mut degraded = 0;
    for task in tasks {
        let result = task.await.context("request loop panicked")?;
        ok_latency
            .add(&result.ok_latency)
            .context("merging histograms")?;
        for (status, count) in result.statuses {
            *statuses.entry(status).or_default() += count;
        }
        posts_returned += result.posts_returned;
        degraded += result.degraded;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let total: u64 = statuses.values().sum();
    let ok = statuses.get("Ok").copied().unwrap_or(0);
    let exhausted = statuses.get("ResourceExhausted").copied().unwrap_or(0);
    let us = |q: f64| {
        if ok_latency.is_empty() {
            0.0
        } else {
            ok_latency.value_at_quantile(q) as f64 / 1000.0
        }
    };

    println!("requests        {total} in {elapsed:.2}s");
    println!(
        "achieved QPS    {:.0} (OK: {:.0})",
        total as f64 / elapsed,
        ok as f64 / elapsed
    );
    println!(
        "latency OK      p50 {:.0} us  p99 {:.0} us  p99.9 {:.0} us  max {:.0} us",
        us(0.5),
        us(0.99),
        us(0.999),
        us(1.0)
    );
    println!("RESOURCE_EXHAUSTED {exhausted}");
    println!("degraded OK answers {degraded}");
    for (status, count) in &statuses {
        println!("status {status:<20} {count}");
    }
    if ok > 0 {
        println!(
            "posts per OK answer {:.0}",
            posts_returned as f64 / ok as f64
        );
    }
    println!(
        "{}",
        json!({
            "requests": total, "elapsed_secs": elapsed, "achieved_qps": total as f64 / elapsed,
            "ok_qps": ok as f64 / elapsed, "offered_rate": args.rate, "concurrency": args.concurrency,
            "connections": args.connections, "scale": args.scale,
            "ok_latency_us": {"p50": us(0.5), "p99": us(0.99), "p999": us(0.999), "max": us(1.0)},
            "resource_exhausted": exhausted, "degraded": degraded, "statuses": statuses,
        })
    );
    Ok(())
}

/// One request loop: viewers `task, task + loops, …` in turn, paced to `period` per request.
#[allow(clippy::too_many_arguments)]
async fn request_loop(
    mut client: InNetworkPostsServiceClient<Channel>,
    viewers: Arc<Vec<Viewer>>,
    task: usize,
    loops: usize,
    budget: u64,
    deadline: Option<Instant>,
    period: Option<Duration>,
    video_share: f64,
    send_exclude: bool,
) -> LoopResult {
    let mut result = LoopResult {
        ok_latency: histogram(),
        statuses: BTreeMap::new(),
        posts_returned: 0,
        degraded: 0,
    };
    let mut previous: HashMap<usize, Vec<i64>> = HashMap::new();
    // Loops start spread over one period so the offered load is smooth from the first second.
    let mut next_send = tokio::time::Instant::now()
        + period.map_or(Duration::ZERO, |p| p.mul_f64(task as f64 / loops as f64));
    let mut index = task;
    let mut sent = 0u64;
    while sent < budget && deadline.is_none_or(|d| Instant::now() < d) {
        if let Some(period) = period {
            let now = tokio::time::Instant::now();
            if next_send > now {
                tokio::time::sleep_until(next_send).await;
            } else if now - next_send > period * 10 {
                // Far behind (the server is slower than the offered rate): do not burst.
                next_send = now;
            }
            next_send += period;
        }
        let viewer_index = index % viewers.len();
        let viewer = &viewers[viewer_index];
        index += loops;
        sent += 1;
        let exclude = match previous.get(&viewer_index) {
            Some(answer) if send_exclude => exclude_from_answer(viewer, answer.iter().copied()),
            _ => Vec::new(),
        };
        // Deterministic video mix: the request count crosses a multiple of 1/share.
        let is_video =
            (sent as f64 * video_share).floor() != ((sent - 1) as f64 * video_share).floor();
        let request = GetInNetworkPostsRequest {
            user_id: viewer.user_id as u64,
            following_user_ids: viewer.following.iter().map(|&a| a as u64).collect(),
            max_results: 0,
            exclude_tweet_ids: exclude.iter().map(|&id| id as u64).collect(),
            algorithm: String::new(),
            debug: false,
            is_video_request: is_video,
            per_author_limits: None,
            ..Default::default()
        };
        let t = Instant::now();
        let outcome = client.get_in_network_posts(request).await;
        let ns = t.elapsed().as_nanos() as u64;
        match outcome {
            Ok(response) => {
                result.ok_latency.saturating_record(ns);
                if response.metadata().contains_key(DEGRADED_HEADER) {
                    result.degraded += 1;
                }
                let posts = response.into_inner().posts;
                result.posts_returned += posts.len() as u64;
                if !is_video {
                    previous.insert(viewer_index, posts.iter().map(|p| p.post_id).collect());
                }
                *result
                    .statuses
                    .entry(status_name(tonic::Code::Ok))
                    .or_default() += 1;
            }
            Err(status) => {
                *result
                    .statuses
                    .entry(status_name(status.code()))
                    .or_default() += 1
            }
        }
    }
    result
}
