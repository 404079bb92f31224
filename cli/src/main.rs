//! `thunder-cli`: command-line client of thunder. One module per subcommand.
//!
//! A crate of its own, so that the server links neither thunder-client (`query --shards`) nor
//! the CLI's commands; it does not link the server either: the Kafka connection flags and the
//! event producer (`produce`) are thunder-events', the demo's workload (`frame`) is
//! thunder-workload's, and `--version` is stamped by its own `build.rs` as the server's is.
//!
//! Commands print through `outln!` (`out.rs`), which exits quietly when standard output is a
//! closed pipe; `tls.rs` says why a TLS connection to the server failed.

#[macro_use]
mod out;

mod explain;
mod frame;
mod produce;
mod query;
mod request;
mod snapshot;
mod tls;

use clap::{Parser, Subcommand};

/// Command-line client of the in-network posts service.
#[derive(Parser, Debug)]
#[command(
    name = "thunder-cli",
    version = thunder_buildstamp::long_version!(),
    about = "Command-line client of thunder"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Ask the server for a feed and print the posts.
    Query(query::QueryArgs),
    /// Ask the server why a viewer's feed holds, or does not hold, some posts.
    Explain(explain::ExplainArgs),
    /// Send create/delete events to the Kafka topic (JSON lines on stdin, or `--synth`).
    Produce(produce::ProduceArgs),
    /// Write one request as a gRPC frame file (the body h2load posts; see scripts/serve-bench.sh).
    Frame(frame::FrameArgs),
    /// Look into snapshot files (`inspect FILE`).
    Snapshot(snapshot::SnapshotArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Query(args) => query::run(args).await,
        Command::Explain(args) => explain::run(args).await,
        Command::Produce(args) => produce::run(args).await,
        Command::Frame(args) => frame::run(args).await,
        Command::Snapshot(args) => snapshot::run(args),
    }
}
