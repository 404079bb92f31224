//! `thunder-cli query`: one GetInNetworkPosts call, printed as a table or as JSON: the answer
//! in the proto3 JSON mapping, as grpcurl prints it (the generated types' serde), a page's
//! `next_cursor` in base64 as that mapping writes bytes.

use std::time::Duration;

use anyhow::Context;
use thunder_client::{ClientConfig, ShardError, ThunderClient};
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_proto::{GetInNetworkPostsRequest, GetInNetworkPostsResponse, LightPost};
use tonic::codec::CompressionEncoding;

use crate::request::{RequestArgs, cursor_text};

/// Flags of `thunder-cli query`.
#[derive(clap::Args, Debug)]
pub struct QueryArgs {
    #[command(flatten)]
    request: RequestArgs,
    /// Posts per page (sets max_results); with --pages, follows next_cursor.
    #[arg(long)]
    page_size: Option<u32>,
    /// How many pages to fetch and print (stops early when the answer is complete).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pages: u32,
    /// Ranking algorithm.
    #[arg(long, default_value = "")]
    algorithm: String,
    /// Ask the server to log the request.
    #[arg(long)]
    debug: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Ask author shards instead of --addr, through thunder-client: shards separated by `;`
    /// in shard order (`--shard 0/N` first), the replicas of one shard by `,`, e.g.
    /// "10.0.0.1:9090,10.0.0.2:9090;10.0.0.3:9090". Plaintext only. Prints what the shards
    /// that answered returned, then fails if any shard did not answer.
    #[arg(long, conflicts_with_all = ["tls_ca", "tls_cert", "tls_key", "tls_domain"])]
    shards: Option<String>,
}

/// Asks the author shards of `--shards` through the fail-open client.
async fn ask_shards(
    spec: &str,
    request: GetInNetworkPostsRequest,
    timeout: Duration,
) -> anyhow::Result<(Vec<LightPost>, Vec<ShardError>)> {
    let groups = ThunderClient::parse_shards(spec).context("invalid --shards")?;
    let client = ThunderClient::sharded(&groups, &ClientConfig::default())?;
    let answer = client.get_in_network_posts(request, timeout).await;
    Ok((answer.posts, answer.errors))
}

/// Runs the query and prints the answer.
pub async fn run(args: QueryArgs) -> anyhow::Result<()> {
    let timeout = args.request.timeout();
    let shards = args.shards.clone();
    let tls = args.request.tls_settings()?;
    let client = match shards {
        Some(_) => None,
        None => Some(
            InNetworkPostsServiceClient::new(args.request.connect(tls.as_ref()).await?)
                .accept_compressed(CompressionEncoding::Zstd)
                .send_compressed(CompressionEncoding::Zstd),
        ),
    };
    let mut request = args.request.request()?;
    request.max_results = args.page_size.unwrap_or(args.request.max_results);
    request.algorithm = args.algorithm;
    request.debug = args.debug;
    let view = PageView {
        json: args.json,
        numbered: args.pages > 1,
    };
    let mut pages = Vec::new();
    let mut shard_errors = Vec::new();
    match (client, &shards) {
        (Some(mut client), _) => {
            for page in 1..=args.pages {
                let response = match client.get_in_network_posts(request.clone()).await {
                    Ok(response) => response.into_inner(),
                    Err(status) => {
                        return Err(args.request.call_failed(status, tls.as_ref()).await);
                    }
                };
                let next_cursor = response.next_cursor.clone();
                show_page(view, &mut pages, page, response);
                if next_cursor.is_empty() {
                    break;
                }
                request.cursor = next_cursor;
            }
        }
        (None, Some(spec)) => {
            // A cursor belongs to the server that issued it, not to a set of shards.
            anyhow::ensure!(
                args.pages <= 1 && request.cursor.is_empty(),
                "--pages and --cursor need --addr: cursors do not span shards"
            );
            let (posts, errors) = ask_shards(spec, request, timeout).await?;
            shard_errors = errors;
            let answer = GetInNetworkPostsResponse {
                posts,
                next_cursor: Vec::new(),
            };
            show_page(view, &mut pages, 1, answer);
        }
        (None, None) => anyhow::bail!("neither --addr nor --shards"),
    }
    if args.json {
        let out = match <[_; 1]>::try_from(pages) {
            Ok([one]) => serde_json::to_value(one)?,
            Err(pages) => serde_json::json!({ "pages": pages }),
        };
        outln!("{}", serde_json::to_string_pretty(&out)?);
    }
    if !shard_errors.is_empty() {
        let errors: Vec<String> = shard_errors.iter().map(ToString::to_string).collect();
        anyhow::bail!("incomplete answer: {}", errors.join("; "));
    }
    Ok(())
}

/// How pages are shown: as JSON (kept, printed at the end) or tables, numbered or not.
#[derive(Clone, Copy)]
struct PageView {
    json: bool,
    numbered: bool,
}

/// Prints one page (or keeps it for the JSON output).
fn show_page(
    view: PageView,
    pages: &mut Vec<GetInNetworkPostsResponse>,
    page: u32,
    answer: GetInNetworkPostsResponse,
) {
    if view.json {
        pages.push(answer);
        return;
    }
    if view.numbered {
        outln!("page {page}");
    }
    print_table(&answer.posts);
    if !answer.next_cursor.is_empty() {
        outln!("next_cursor {}", cursor_text(&answer.next_cursor));
    }
}

fn print_table(posts: &[LightPost]) {
    let opt = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    outln!(
        "{:>20} {:>20} {:>11} {:<6} {:>20} {:>20} {:>5}",
        "post_id",
        "author_id",
        "created_at",
        "kind",
        "in_reply_to",
        "source_post",
        "video"
    );
    for post in posts {
        let kind = match (post.is_reply, post.is_retweet) {
            (true, _) => "reply",
            (false, true) => "repost",
            (false, false) => "post",
        };
        outln!(
            "{:>20} {:>20} {:>11} {:<6} {:>20} {:>20} {:>5}",
            post.post_id,
            post.author_id,
            post.created_at,
            kind,
            opt(post.in_reply_to_post_id),
            opt(post.source_post_id),
            if post.has_video { "yes" } else { "" },
        );
    }
    outln!("{} posts", posts.len());
}
