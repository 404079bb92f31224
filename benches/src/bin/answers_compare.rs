//! Asks two running thunder servers the same queries and compares the answers post for post.
//!
//! ```text
//! cargo run --release -p thunder-benches --bin answers_compare -- \
//!     --reference http://127.0.0.1:9090 --candidate http://127.0.0.1:9091 --scale 100
//! ```
//!
//! The query shapes come from the synthetic feed-2d workload at `--scale` (the authors
//! `thunder-cli produce --synth` writes): the follow lists of `--viewers` viewers (as asked,
//! as video requests and with a per-author cap of 2) and `--authors` single-author queries
//! (half the most active authors, half spread over the whole activity range). With
//! `--retention-secs`, each shape is asked of both servers with `min_created_at` = now -
//! retention + `--margin-secs`, so a post that leaves the retention window between the two
//! calls does not count as a difference (the margin must exceed the time one shape takes). An
//! answer marked degraded (the `thunder-degraded` header: partial by design) or refused
//! (RESOURCE_EXHAUSTED) is asked again, up to 30 times 150 ms apart.
//!
//! Prints the differing shapes on stderr and one JSON line on stdout (shapes, shapes with a
//! non-empty answer, posts compared, differing shapes, retries); exits with 1 when any answer
//! differs or a shape got no full answer.

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::json;
use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_proto::{GetInNetworkPostsRequest, LightPost, PerAuthorLimits};
use thunder_workload::{DEFAULT_SEED, SynthConfig};
use tonic::transport::{Channel, Endpoint};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Compare the answers of two thunder servers to the same queries")]
struct Args {
    /// The server whose answers are taken as right (e.g. a fresh replica).
    #[arg(long)]
    reference: String,
    /// The server checked against it.
    #[arg(long)]
    candidate: String,
    /// Workload scale of the producer (`thunder-cli produce --synth-scale`).
    #[arg(long, default_value_t = 100)]
    scale: u32,
    /// Workload seed (the producer's default unless it was given `--synth-seed`).
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Viewers whose follow lists are asked (three shapes each).
    #[arg(long, default_value_t = 50)]
    viewers: usize,
    /// Single-author queries.
    #[arg(long, default_value_t = 200)]
    authors: u64,
    /// The servers' post retention, seconds: each shape asks only for posts that stay within
    /// it for `--margin-secs` more (unset: no time bound).
    #[arg(long)]
    retention_secs: Option<i64>,
    /// See `--retention-secs`.
    #[arg(long, default_value_t = 10)]
    margin_secs: i64,
    /// Per-call timeout, milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

/// Times a degraded answer or a refusal is asked again before the shape counts as not
/// comparable, and the pause before each.
const RETRIES: u32 = 30;
const RETRY_PAUSE: Duration = Duration::from_millis(150);
/// Response header of an answer computed at a degrade level above 0.
const DEGRADED_HEADER: &str = "thunder-degraded";
/// The viewer of the single-author queries (no author has this id).
const NEUTRAL_VIEWER: u64 = 1;

/// One query and a name for it in the report.
struct Shape {
    name: String,
    request: GetInNetworkPostsRequest,
}

/// The shapes described at the top.
fn shapes(args: &Args) -> Vec<Shape> {
    let config = SynthConfig::feed_2d(args.scale, 0).with_seed(args.seed);
    let base = GetInNetworkPostsRequest::default();
    let mut shapes = Vec::new();
    for (index, viewer) in config.viewers(args.viewers).into_iter().enumerate() {
        let follow = GetInNetworkPostsRequest {
            user_id: viewer.user_id as u64,
            following_user_ids: viewer.following.iter().map(|&a| a as u64).collect(),
            ..base.clone()
        };
        shapes.push(Shape {
            name: format!("viewer {index}: follow list"),
            request: follow.clone(),
        });
        shapes.push(Shape {
            name: format!("viewer {index}: video"),
            request: GetInNetworkPostsRequest {
                is_video_request: true,
                ..follow.clone()
            },
        });
        shapes.push(Shape {
            name: format!("viewer {index}: 2 per author"),
            request: GetInNetworkPostsRequest {
                per_author_limits: Some(PerAuthorLimits {
                    max_posts_per_author: Some(2),
                    max_replies_reposts_per_author: Some(2),
                }),
                ..follow
            },
        });
    }
    let top = args.authors.div_ceil(2).min(config.authors);
    let spread = (args.authors - top).min(config.authors);
    let mut ranks: Vec<u64> = (0..top).collect();
    ranks.extend((0..spread).map(|i| i * config.authors / spread.max(1)));
    let mut seen = HashSet::new();
    for rank in ranks.into_iter().filter(|&rank| seen.insert(rank)) {
        let author = config.author_id(rank);
        shapes.push(Shape {
            name: format!("author {author} (activity rank {rank})"),
            request: GetInNetworkPostsRequest {
                user_id: NEUTRAL_VIEWER,
                following_user_ids: vec![author as u64],
                ..base.clone()
            },
        });
    }
    shapes
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

async fn connect(addr: &str, timeout: Duration) -> Result<InNetworkPostsServiceClient<Channel>> {
    let channel = Endpoint::from_shared(addr.to_string())
        .with_context(|| format!("invalid address {addr}"))?
        .timeout(timeout)
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    Ok(InNetworkPostsServiceClient::new(channel).max_decoding_message_size(64 << 20))
}

/// The full (not degraded) answer to `request`, and how many degraded answers and refusals
/// (RESOURCE_EXHAUSTED: asked again as well) came first.
async fn full_answer(
    client: &mut InNetworkPostsServiceClient<Channel>,
    request: &GetInNetworkPostsRequest,
) -> Result<(Option<Vec<LightPost>>, Retries)> {
    let mut retries = Retries::default();
    for attempt in 0..=RETRIES {
        if attempt > 0 {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        match client.get_in_network_posts(request.clone()).await {
            Ok(response) if response.metadata().contains_key(DEGRADED_HEADER) => {
                retries.degraded += 1;
            }
            Ok(response) => return Ok((Some(response.into_inner().posts), retries)),
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                retries.refused += 1;
            }
            Err(status) => bail!("{:?}: {}", status.code(), status.message()),
        }
    }
    Ok((None, retries))
}

/// Answers asked again.
#[derive(Clone, Copy, Debug, Default)]
struct Retries {
    degraded: u64,
    refused: u64,
}

/// What differs between two answers, in a few words.
fn describe(reference: &[LightPost], candidate: &[LightPost]) -> String {
    let ids = |posts: &[LightPost]| posts.iter().map(|p| p.post_id).collect::<HashSet<_>>();
    let (r, c) = (ids(reference), ids(candidate));
    let missing: Vec<_> = r.difference(&c).take(3).collect();
    let extra: Vec<_> = c.difference(&r).take(3).collect();
    format!(
        "{} vs {} posts; {} missing (e.g. {missing:?}), {} extra (e.g. {extra:?}){}",
        reference.len(),
        candidate.len(),
        r.difference(&c).count(),
        c.difference(&r).count(),
        if r == c {
            ", same ids in another order or with other fields"
        } else {
            ""
        }
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.viewers == 0 && args.authors == 0 {
        bail!("nothing to compare: --viewers and --authors are both 0");
    }
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut reference = connect(&args.reference, timeout).await?;
    let mut candidate = connect(&args.candidate, timeout).await?;
    let mut shapes = shapes(&args);
    let (mut nonempty, mut posts_compared, mut differing, mut not_comparable) = (0, 0, 0, 0);
    let (mut degraded_retries, mut refused_retries) = (0, 0);
    for shape in &mut shapes {
        if let Some(retention) = args.retention_secs {
            shape.request.min_created_at = Some(now_secs() - retention + args.margin_secs);
        }
        let (want, d1) = full_answer(&mut reference, &shape.request)
            .await
            .with_context(|| format!("{}: reference", shape.name))?;
        let (got, d2) = full_answer(&mut candidate, &shape.request)
            .await
            .with_context(|| format!("{}: candidate", shape.name))?;
        degraded_retries += d1.degraded + d2.degraded;
        refused_retries += d1.refused + d2.refused;
        let (Some(want), Some(got)) = (want, got) else {
            not_comparable += 1;
            eprintln!("{}: only degraded answers or refusals", shape.name);
            continue;
        };
        if !want.is_empty() || !got.is_empty() {
            nonempty += 1;
        }
        posts_compared += want.len().max(got.len());
        if want != got {
            differing += 1;
            eprintln!("{}: {}", shape.name, describe(&want, &got));
        }
    }
    println!(
        "{}",
        json!({
            "shapes": shapes.len(), "nonempty": nonempty, "posts_compared": posts_compared,
            "differing": differing, "not_comparable": not_comparable,
            "degraded_retries": degraded_retries, "refused_retries": refused_retries,
            "retention_secs": args.retention_secs,
            "margin_secs": args.margin_secs,
        })
    );
    if differing > 0 || not_comparable > 0 {
        std::process::exit(1);
    }
    Ok(())
}
