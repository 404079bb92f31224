//! `thunder-server`: serves the in-network post store over gRPC, fed by Kafka or, without
//! brokers, by the synthetic demo workload; parses the flags, sets up logging and the runtime,
//! and hands over to the replica's lifecycle (`thunder_server::lifecycle::replica`).

use std::io::IsTerminal as _;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use thunder_server::config::LogFormat;
use thunder_server::lifecycle::{EXIT_DRAIN_CUT, replica};
use thunder_server::{Args, lifecycle::replica::StopRequests};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_logging(args.log_format);
    if args.check_config {
        std::process::exit(thunder_server::config::check::run(&args, &matches));
    }
    // Queries run on the worker that serves the call (`--worker-threads`).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.runtime_workers())
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let options = args.replica_options()?;
    let stops = StopRequests::default();
    let stopped = runtime.block_on(async {
        tokio::spawn(forward_signals(stops.clone()));
        replica::run(options, &stops).await
    });
    runtime.shutdown_background(); // A blocking task may still wait on an unreachable broker.
    if stopped?.drain_cut() {
        tracing::error!("the drain timeout cut in-flight calls");
        std::process::exit(EXIT_DRAIN_CUT);
    }
    Ok(())
}

/// Logs go to standard output: text lines, coloured only on a terminal when `NO_COLOR` is
/// unset or empty (<https://no-color.org>), or one JSON object a line. `RUST_LOG` filters
/// them (default `info`).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => {
            let colour = std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            logs.with_ansi(colour).init();
        }
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// Turns every SIGINT and SIGTERM into a stop request: the first stops the replica, the next
/// cuts its lame duck short.
async fn forward_signals(stops: StopRequests) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut sigint), Ok(mut sigterm)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot listen for SIGINT and SIGTERM");
        return;
    };
    loop {
        tokio::select! {
            _ = sigint.recv() => tracing::info!("SIGINT received"),
            _ = sigterm.recv() => tracing::info!("SIGTERM received"),
        }
        stops.request();
    }
}
