//! `thunder-cli query`: one GetInNetworkPosts call, printed as a table or as JSON.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use thunder_client::{ClientConfig, ShardError, ThunderClient};
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_proto::{GetInNetworkPostsRequest, LightPost, PerAuthorLimits};
use tonic::codec::CompressionEncoding;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

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

/// Connects to `--addr` (with TLS when asked).
async fn connect(args: &QueryArgs) -> anyhow::Result<InNetworkPostsServiceClient<Channel>> {
    let mut endpoint = Endpoint::from_shared(args.addr.clone())
        .context("invalid --addr")?
        .timeout(Duration::from_millis(args.timeout_ms));
    if let Some(ca) = &args.tls_ca {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(
            std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?,
        ));
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            tls = tls.identity(Identity::from_pem(
                std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?,
                std::fs::read(key).with_context(|| format!("reading {}", key.display()))?,
            ));
        }
        if let Some(domain) = &args.tls_domain {
            tls = tls.domain_name(domain.clone());
        }
        endpoint = endpoint.tls_config(tls).context("TLS configuration")?;
    }
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("connecting to {}", args.addr))?;
    Ok(InNetworkPostsServiceClient::new(channel)
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Zstd))
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
    let client = match shards {
        Some(_) => None,
        None => Some(connect(&args).await?),
    };
    let per_author_limits = (args.max_per_author.is_some()
        || args.max_replies_per_author.is_some())
    .then_some(PerAuthorLimits {
        max_posts_per_author: args.max_per_author,
        max_replies_reposts_per_author: args.max_replies_per_author,
    });
    let request = GetInNetworkPostsRequest {
        user_id: args.user,
        following_user_ids: args.follow,
        max_results: args.max_results,
        exclude_tweet_ids: args.exclude,
        algorithm: args.algorithm,
        debug: args.debug,
        is_video_request: args.video,
        per_author_limits,
    };
    let (posts, shard_errors) = match (client, &shards) {
        (Some(mut client), _) => {
            let posts = client
                .get_in_network_posts(request)
                .await
                .map_err(|status| anyhow::anyhow!("{:?}: {}", status.code(), status.message()))?
                .into_inner()
                .posts;
            (posts, Vec::new())
        }
        (None, Some(spec)) => ask_shards(spec, request, timeout).await?,
        (None, None) => anyhow::bail!("neither --addr nor --shards"),
    };
    let response = thunder_proto::GetInNetworkPostsResponse { posts };
    if args.json {
        let posts: Vec<serde_json::Value> = response.posts.iter().map(post_json).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "posts": posts }))?
        );
    } else {
        print_table(&response.posts);
    }
    if !shard_errors.is_empty() {
        let errors: Vec<String> = shard_errors.iter().map(ToString::to_string).collect();
        anyhow::bail!("incomplete answer: {}", errors.join("; "));
    }
    Ok(())
}

fn post_json(post: &LightPost) -> serde_json::Value {
    serde_json::json!({
        "post_id": post.post_id,
        "author_id": post.author_id,
        "created_at": post.created_at,
        "in_reply_to_post_id": post.in_reply_to_post_id,
        "in_reply_to_user_id": post.in_reply_to_user_id,
        "is_retweet": post.is_retweet,
        "is_reply": post.is_reply,
        "source_post_id": post.source_post_id,
        "source_user_id": post.source_user_id,
        "has_video": post.has_video,
        "conversation_id": post.conversation_id,
    })
}

fn print_table(posts: &[LightPost]) {
    let opt = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    println!(
        "{:>20} {:>20} {:>11} {:<6} {:>20} {:>20} {:>5}",
        "post_id", "author_id", "created_at", "kind", "in_reply_to", "source_post", "video"
    );
    for post in posts {
        let kind = match (post.is_reply, post.is_retweet) {
            (true, _) => "reply",
            (false, true) => "repost",
            (false, false) => "post",
        };
        println!(
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
    println!("{} posts", posts.len());
}
