//! `thunder-cli frame`: writes one `GetInNetworkPosts` request as a gRPC length-prefixed
//! message (1 byte "not compressed", 4-byte big-endian length, protobuf bytes), the body a
//! load tool such as h2load posts (`scripts/serve-bench.sh`).

use std::path::PathBuf;

use anyhow::Context;
use prost::Message;
use thunder_proto::GetInNetworkPostsRequest;
use thunder_workload::{DEMO_SCALE, SynthConfig};

/// Which request of the demo workload to write.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A demo viewer following 2000 demo authors: a full answer (1200 posts).
    Full,
    /// One demo author (its top activity rank): a small answer (at most 80 posts).
    Small,
    /// 2000 authors the demo store does not know: an empty answer.
    Empty,
}

/// Flags of `thunder-cli frame`.
#[derive(clap::Args, Debug)]
pub struct FrameArgs {
    /// The request to write.
    #[arg(long, value_enum)]
    kind: FrameKind,
    /// Demo workload scale of the server the request is for (`--demo-scale`).
    #[arg(long, default_value_t = DEMO_SCALE)]
    scale: u32,
    /// Followed authors of a full or empty request.
    #[arg(long, default_value_t = 2000)]
    follows: usize,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
}

/// The request `args` describe.
fn request(args: &FrameArgs) -> anyhow::Result<GetInNetworkPostsRequest> {
    // The demo's workload (the server's `demo::workload`); author ids do not depend on its
    // end time.
    let workload = SynthConfig::feed_2d(args.scale, 0);
    let to_u64 = |ids: &[i64]| -> anyhow::Result<Vec<u64>> {
        ids.iter()
            .map(|&id| u64::try_from(id).context("negative demo id"))
            .collect()
    };
    let (user_id, following) = match args.kind {
        FrameKind::Full => {
            let viewer = (0..1000)
                .map(|i| workload.viewer(i))
                .find(|v| v.following.len() >= args.follows)
                .context("no demo viewer follows that many authors at this scale")?;
            (viewer.user_id, to_u64(&viewer.following[..args.follows])?)
        }
        FrameKind::Small => (1, to_u64(&[workload.author_id(0)])?),
        FrameKind::Empty => {
            // Demo author ids are far below this range.
            let unknown: Vec<u64> = (0..args.follows as u64).map(|i| (1 << 62) + i).collect();
            (1, unknown)
        }
    };
    Ok(GetInNetworkPostsRequest {
        user_id: u64::try_from(user_id).context("negative demo id")?,
        following_user_ids: following,
        ..Default::default()
    })
}

/// Writes the frame.
pub async fn run(args: FrameArgs) -> anyhow::Result<()> {
    let message = request(&args)?.encode_to_vec();
    let len = u32::try_from(message.len()).context("request too large")?;
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&message);
    std::fs::write(&args.out, &frame).with_context(|| format!("writing {}", args.out.display()))?;
    outln!(
        "{}: {:?} request, {} bytes",
        args.out.display(),
        args.kind,
        frame.len()
    );
    Ok(())
}
