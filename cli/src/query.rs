//! `thunder-cli query`: one GetInNetworkPosts call, printed as a table or as JSON: the answer
//! in the proto3 JSON mapping, as grpcurl prints it (thunder-proto's `serde` feature), a
//! page's `next_cursor` in base64 as that mapping writes bytes.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use thunder_client::{ClientConfig, ShardError, ThunderClient};
use thunder_engine::SeenFilter;
use thunder_engine::seen::DEFAULT_BITS_PER_ID;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_proto::{
    GetInNetworkPostsRequest, GetInNetworkPostsResponse, LightPost, PerAuthorLimits,
    SeenFilter as WireSeenFilter, SeenFilterFormat,
};
use tonic::codec::CompressionEncoding;
use tonic::transport::{Channel, Endpoint};

use crate::tls::TlsSettings;

/// Flags of `thunder-cli query`.
#[derive(clap::Args, Debug)]
pub struct QueryArgs {
    /// Server address (https:// for TLS).
    #[arg(long, env = "THUNDER_ADDR", default_value = "http://127.0.0.1:9090")]
    addr: String,
    /// Viewer user id.
    #[arg(long)]
    user: u64,
    /// Followed author ids, comma-separated. Empty uses the server's follow-graph fallback.
    #[arg(long, value_delimiter = ',')]
    follow: Vec<u64>,
    /// Post ids to exclude, comma-separated.
    #[arg(long, value_delimiter = ',')]
    exclude: Vec<u64>,
    /// Most posts to return (0: server default).
    #[arg(long, default_value_t = 0)]
    max_results: u32,
    /// Post ids already seen, comma-separated: sent as a seen filter (not as a list).
    #[arg(long, value_delimiter = ',')]
    seen_ids: Vec<i64>,
    /// Bits per seen id in the filter (10: about 1% false positives).
    #[arg(long, default_value_t = DEFAULT_BITS_PER_ID)]
    seen_bits_per_id: f64,
    /// Seed of the seen filter's hash.
    #[arg(long, default_value_t = 0)]
    seen_seed: u64,
    /// Only posts created at or after this time (unix seconds).
    #[arg(long)]
    min_created_at: Option<i64>,
    /// Only posts created at or before this time (unix seconds).
    #[arg(long)]
    max_created_at: Option<i64>,
    /// Posts per page (sets max_results); with --pages, follows next_cursor.
    #[arg(long)]
    page_size: Option<u32>,
    /// How many pages to fetch and print (stops early when the answer is complete).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pages: u32,
    /// Start after this cursor: a `next_cursor` as printed (base64; the hex of older
    /// versions is accepted too).
    #[arg(long)]
    cursor: Option<String>,
    /// Video posts only.
    #[arg(long)]
    video: bool,
    /// Per-author cap of originals.
    #[arg(long)]
    max_per_author: Option<u32>,
    /// Per-author cap of replies and reposts.
    #[arg(long)]
    max_replies_per_author: Option<u32>,
    /// Ranking algorithm.
    #[arg(long, default_value = "")]
    algorithm: String,
    /// Ask the server to log the request.
    #[arg(long)]
    debug: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Deadline of the call in ms.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    /// CA that signs the server certificate (PEM); enables TLS.
    #[arg(long, env = "THUNDER_CLI_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS.
    #[arg(long, env = "THUNDER_CLI_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Client private key (PEM) for mTLS.
    #[arg(long, env = "THUNDER_CLI_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Server name to verify (defaults to the host of --addr).
    #[arg(long)]
    tls_domain: Option<String>,
    /// Ask author shards instead of --addr, through thunder-client: shards separated by `;`
    /// in shard order (`--shard 0/N` first), the replicas of one shard by `,`, e.g.
    /// "10.0.0.1:9090,10.0.0.2:9090;10.0.0.3:9090". Plaintext only. Prints what the shards
    /// that answered returned, then fails if any shard did not answer.
    #[arg(long, conflicts_with_all = ["tls_ca", "tls_cert", "tls_key", "tls_domain"])]
    shards: Option<String>,
}

/// The TLS settings of `--tls-ca`, `--tls-cert`, `--tls-key` and `--tls-domain`, read; `None`
/// without `--tls-ca` (plaintext).
fn tls_settings(args: &QueryArgs) -> anyhow::Result<Option<TlsSettings>> {
    let read =
        |path: &PathBuf| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let Some(ca) = &args.tls_ca else {
        return Ok(None);
    };
    let identity = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
        _ => None,
    };
    Ok(Some(TlsSettings {
        ca: read(ca)?,
        identity,
        domain: args.tls_domain.clone(),
    }))
}

/// Connects to `--addr` (with TLS when asked); a refused TLS handshake says why.
async fn connect(
    args: &QueryArgs,
    tls: Option<&TlsSettings>,
) -> anyhow::Result<InNetworkPostsServiceClient<Channel>> {
    let mut endpoint = Endpoint::from_shared(args.addr.clone())
        .context("invalid --addr")?
        .timeout(Duration::from_millis(args.timeout_ms));
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.tonic())
            .context("TLS configuration")?;
    }
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(e) => {
            return Err(match crate::tls::failure(&e, endpoint.uri(), tls).await {
                Some(why) => anyhow::anyhow!("connecting to {}: {why}", args.addr),
                None => anyhow::Error::new(e).context(format!("connecting to {}", args.addr)),
            });
        }
    };
    Ok(InNetworkPostsServiceClient::new(channel)
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Zstd))
}

/// A failed call to `addr` (`--addr`) as an error: its status, and why the TLS handshake failed when a
/// transport failure (a status with a source) comes from it.
async fn call_failed(
    status: tonic::Status,
    addr: &str,
    tls: Option<&TlsSettings>,
) -> anyhow::Error {
    let why = match (std::error::Error::source(&status), addr.parse()) {
        (Some(_), Ok(addr)) => crate::tls::failure(&status, &addr, tls).await,
        _ => None,
    };
    let why = why.map(|why| format!(": {why}")).unwrap_or_default();
    anyhow::anyhow!("{:?}: {}{why}", status.code(), status.message())
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
    let timeout = Duration::from_millis(args.timeout_ms);
    let shards = args.shards.clone();
    let tls = tls_settings(&args)?;
    let client = match shards {
        Some(_) => None,
        None => Some(connect(&args, tls.as_ref()).await?),
    };
    let per_author_limits = (args.max_per_author.is_some()
        || args.max_replies_per_author.is_some())
    .then_some(PerAuthorLimits {
        max_posts_per_author: args.max_per_author,
        max_replies_reposts_per_author: args.max_replies_per_author,
    });
    let seen_filter = (!args.seen_ids.is_empty()).then(|| {
        let mut filter =
            SeenFilter::for_ids(args.seen_ids.len(), args.seen_bits_per_id, args.seen_seed);
        args.seen_ids.iter().for_each(|&id| filter.insert(id));
        WireSeenFilter {
            format: SeenFilterFormat::SplitBlockXxh64.into(),
            seed: filter.seed(),
            num_blocks: filter.num_blocks(),
            bits: filter.to_bytes(),
        }
    });
    let mut request = GetInNetworkPostsRequest {
        user_id: args.user,
        following_user_ids: args.follow,
        max_results: args.page_size.unwrap_or(args.max_results),
        exclude_tweet_ids: args.exclude,
        algorithm: args.algorithm,
        debug: args.debug,
        is_video_request: args.video,
        per_author_limits,
        seen_filter,
        cursor: match &args.cursor {
            Some(text) => cursor_bytes(text)?,
            None => Vec::new(),
        },
        min_created_at: args.min_created_at,
        max_created_at: args.max_created_at,
    };
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
                    Err(status) => return Err(call_failed(status, &args.addr, tls.as_ref()).await),
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
        outln!("next_cursor {}", BASE64.encode(&answer.next_cursor));
    }
}

/// The bytes of `--cursor`: base64 as the proto3 JSON mapping writes bytes (what `next_cursor`
/// prints), or the hex older versions printed.
fn cursor_bytes(text: &str) -> anyhow::Result<Vec<u8>> {
    let hex = text.len().is_multiple_of(2) && text.bytes().all(|b| b.is_ascii_hexdigit());
    if hex {
        return Ok((0..text.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
            .collect());
    }
    BASE64
        .decode(text)
        .context("--cursor is neither base64 (as next_cursor prints) nor hex")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_is_read_as_printed_or_as_the_older_hex() {
        let bytes = vec![0xde, 0xad, 0xbe, 0xef, 0x00, 0x7f];
        assert_eq!(cursor_bytes(&BASE64.encode(&bytes)).expect("base64"), bytes);
        assert_eq!(cursor_bytes("deadbeef007f").expect("hex"), bytes);
        let error = cursor_bytes("not a cursor!").expect_err("refused");
        assert!(error.to_string().contains("base64"), "{error}");
    }
}
