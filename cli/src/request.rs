//! The flags that make one `GetInNetworkPostsRequest` and the connection that sends it: what
//! `thunder-cli query` and `thunder-cli explain` share.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use thunder_engine::SeenFilter;
use thunder_engine::seen::DEFAULT_BITS_PER_ID;
use thunder_proto::{
    GetInNetworkPostsRequest, PerAuthorLimits, SeenFilter as WireSeenFilter, SeenFilterFormat,
};
use tonic::transport::{Channel, Endpoint};

use crate::tls::TlsSettings;

/// Flags of one request and of the connection to the server.
#[derive(clap::Args, Debug)]
pub struct RequestArgs {
    /// Server address (https:// for TLS).
    #[arg(long, env = "THUNDER_ADDR", default_value = "http://127.0.0.1:9090")]
    pub addr: String,
    /// Viewer user id.
    #[arg(long)]
    pub user: u64,
    /// Followed author ids, comma-separated. Empty uses the server's follow-graph fallback.
    #[arg(long, value_delimiter = ',')]
    pub follow: Vec<u64>,
    /// Post ids to exclude, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub exclude: Vec<u64>,
    /// Most posts to return (0: server default).
    #[arg(long, default_value_t = 0)]
    pub max_results: u32,
    /// Post ids already seen, comma-separated: sent as a seen filter (not as a list).
    #[arg(long, value_delimiter = ',')]
    pub seen_ids: Vec<i64>,
    /// Bits per seen id in the filter (10: about 1% false positives).
    #[arg(long, default_value_t = DEFAULT_BITS_PER_ID)]
    pub seen_bits_per_id: f64,
    /// Seed of the seen filter's hash.
    #[arg(long, default_value_t = 0)]
    pub seen_seed: u64,
    /// Only posts created at or after this time (unix seconds).
    #[arg(long)]
    pub min_created_at: Option<i64>,
    /// Only posts created at or before this time (unix seconds).
    #[arg(long)]
    pub max_created_at: Option<i64>,
    /// Start after this cursor: a `next_cursor` as printed (base64; the hex of older
    /// versions is accepted too).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Video posts only.
    #[arg(long)]
    pub video: bool,
    /// Per-author cap of originals.
    #[arg(long)]
    pub max_per_author: Option<u32>,
    /// Per-author cap of replies and reposts.
    #[arg(long)]
    pub max_replies_per_author: Option<u32>,
    /// Deadline of the call in ms.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// CA that signs the server certificate (PEM); enables TLS.
    #[arg(long, env = "THUNDER_CLI_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS.
    #[arg(long, env = "THUNDER_CLI_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Client private key (PEM) for mTLS.
    #[arg(long, env = "THUNDER_CLI_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Server name to verify (defaults to the host of --addr).
    #[arg(long)]
    pub tls_domain: Option<String>,
}

impl RequestArgs {
    /// The call's deadline.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The request these flags make (`algorithm` and `debug` unset).
    pub fn request(&self) -> anyhow::Result<GetInNetworkPostsRequest> {
        let per_author_limits = (self.max_per_author.is_some()
            || self.max_replies_per_author.is_some())
        .then_some(PerAuthorLimits {
            max_posts_per_author: self.max_per_author,
            max_replies_reposts_per_author: self.max_replies_per_author,
        });
        let seen_filter = (!self.seen_ids.is_empty()).then(|| {
            let mut filter =
                SeenFilter::for_ids(self.seen_ids.len(), self.seen_bits_per_id, self.seen_seed);
            self.seen_ids.iter().for_each(|&id| filter.insert(id));
            WireSeenFilter {
                format: SeenFilterFormat::SplitBlockXxh64.into(),
                seed: filter.seed(),
                num_blocks: filter.num_blocks(),
                bits: filter.to_bytes(),
            }
        });
        Ok(GetInNetworkPostsRequest {
            user_id: self.user,
            following_user_ids: self.follow.clone(),
            max_results: self.max_results,
            exclude_tweet_ids: self.exclude.clone(),
            is_video_request: self.video,
            per_author_limits,
            seen_filter,
            cursor: match &self.cursor {
                Some(text) => cursor_bytes(text)?,
                None => Vec::new(),
            },
            min_created_at: self.min_created_at,
            max_created_at: self.max_created_at,
            ..GetInNetworkPostsRequest::default()
        })
    }

    /// The TLS settings of `--tls-ca`, `--tls-cert`, `--tls-key` and `--tls-domain`, read;
    /// `None` without `--tls-ca` (plaintext).
    pub fn tls_settings(&self) -> anyhow::Result<Option<TlsSettings>> {
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))
        };
        let Some(ca) = &self.tls_ca else {
            return Ok(None);
        };
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            _ => None,
        };
        Ok(Some(TlsSettings {
            ca: read(ca)?,
            identity,
            domain: self.tls_domain.clone(),
        }))
    }

    /// A channel to `--addr` (with `tls` when given); a refused TLS handshake says why.
    pub async fn connect(&self, tls: Option<&TlsSettings>) -> anyhow::Result<Channel> {
        let mut endpoint = Endpoint::from_shared(self.addr.clone())
            .context("invalid --addr")?
            .timeout(self.timeout());
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls.tonic())
                .context("TLS configuration")?;
        }
        match endpoint.connect().await {
            Ok(channel) => Ok(channel),
            Err(e) => Err(match crate::tls::failure(&e, endpoint.uri(), tls).await {
                Some(why) => anyhow::anyhow!("connecting to {}: {why}", self.addr),
                None => anyhow::Error::new(e).context(format!("connecting to {}", self.addr)),
            }),
        }
    }

    /// A failed call to `--addr` as an error: its status, and why the TLS handshake failed
    /// when a transport failure (a status with a source) comes from it.
    pub async fn call_failed(
        &self,
        status: tonic::Status,
        tls: Option<&TlsSettings>,
    ) -> anyhow::Error {
        let why = match (std::error::Error::source(&status), self.addr.parse()) {
            (Some(_), Ok(addr)) => crate::tls::failure(&status, &addr, tls).await,
            _ => None,
        };
        let why = why.map(|why| format!(": {why}")).unwrap_or_default();
        anyhow::anyhow!("{:?}: {}{why}", status.code(), status.message())
    }
}

/// A cursor as printed: base64, as the proto3 JSON mapping writes bytes (`nextCursor` of
/// `--json`).
pub fn cursor_text(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// The bytes of `--cursor`: base64 as printed (see [`cursor_text`]), or the hex older versions
/// printed.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_is_read_as_printed_or_as_the_older_hex() {
        let bytes = vec![0xde, 0xad, 0xbe, 0xef, 0x00, 0x7f];
        assert_eq!(cursor_bytes(&cursor_text(&bytes)).expect("base64"), bytes);
        assert_eq!(cursor_bytes("deadbeef007f").expect("hex"), bytes);
        let error = cursor_bytes("not a cursor!").expect_err("refused");
        assert!(error.to_string().contains("base64"), "{error}");
    }
}
