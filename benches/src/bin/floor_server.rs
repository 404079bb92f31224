//! `floor_server`: thunder-server's gRPC serving path answering from pre-built answers, with no
//! store behind it (see `thunder_benches::floor`). Takes thunder-server's flags (the same
//! listeners, HTTP/2 settings and runtime workers; the demo flags say which store the answers
//! are taken from) plus `--answer-for FRAME`, once per request frame to answer.
//!
//! At start it loads the demo store, keeps its answers to the frames, drops the store, then
//! serves until SIGINT or SIGTERM; the admin port's `/readyz` turns 200 once it serves.
//!
//!   floor_server --grpc-addr 127.0.0.1:9090 --admin-addr 127.0.0.1:9091 --demo-scale 100 \
//!       --answer-for full.bin --answer-for small.bin --answer-for empty.bin

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use thunder_benches::floor::{Floor, parse_frame};
use thunder_server::{Args, demo, shard};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// thunder-server's flags and the frames to answer.
#[derive(Parser, Debug)]
#[command(name = "floor_server")]
struct Cli {
    #[command(flatten)]
    server: Args,
    /// A request frame (as `thunder-cli frame` writes it) whose demo-store answer is served to
    /// calls of its shape (number of followed ids, first followed id). Repeatable.
    #[arg(long = "answer-for")]
    answer_for: Vec<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.server.runtime_workers())
        .enable_all()
        .build()
        .context("building the tokio runtime")?
        .block_on(serve(cli))
}

async fn serve(cli: Cli) -> anyhow::Result<()> {
    let started = Instant::now();
    let options = cli.server.server_options()?;
    let mut requests = Vec::with_capacity(cli.answer_for.len());
    for path in &cli.answer_for {
        let frame = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        requests.push(parse_frame(&frame).with_context(|| format!("frame {}", path.display()))?);
    }

    let store = Arc::new(shard::new_store(
        cli.server.post_retention_seconds,
        cli.server.shard,
    ));
    let workload = demo::workload(cli.server.demo_scale, store.now_secs());
    demo::load_backlog(Arc::clone(&store), workload)
        .await
        .map_err(anyhow::Error::msg)?;
    let floor = Floor::build(&store, &requests).context("answering the frames")?;
    drop(store);
    for (path, (posts, bytes)) in cli.answer_for.iter().zip(floor.sizes()) {
        eprintln!(
            "floor: {}: {posts} posts, {bytes} bytes per answer",
            path.display()
        );
    }

    let server = thunder_server::lifecycle::start_with(options, floor, None, started).await?;
    server.readiness().set_ready().await;
    eprintln!(
        "floor: serving on {} (admin {})",
        server.grpc_addr(),
        server.admin_addr()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.shutdown().await;
    Ok(())
}
