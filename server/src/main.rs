//! `thunder-server`: serves the in-network post store over gRPC, fed by Kafka or, without
//! brokers, by the synthetic demo workload.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use thunder_server::config::LogFormat;
use thunder_server::kafka::{self, CatchUpState, KafkaIngest};
use thunder_server::{Args, FollowingSource, demo, snapshot, version};
use tokio::sync::watch;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long shutdown waits for Kafka ingestion to stop once the store is serving (the shutdown
/// snapshot waits for it); past it the process exits without it and without that snapshot (an
/// unreachable broker can hold the consumer's close for many seconds).
const INGEST_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The same before the store caught up: nothing waits for the stop then.
const CATCH_UP_INGEST_STOP_TIMEOUT: Duration = Duration::from_secs(3);

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
    let result = runtime.block_on(serve(args));
    // Not waiting for blocking tasks: one may still wait on an unreachable broker.
    runtime.shutdown_background();
    result
}

/// Logs go to standard output: text lines, coloured only on a terminal when `NO_COLOR` is
/// unset or empty (<https://no-color.org>), or one JSON object a line. `RUST_LOG` filters
/// them (default `info`).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match format {
        LogFormat::Text => {
            let colour = std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(colour)
                .init();
        }
        LogFormat::Json => {
            tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .with_env_filter(filter)
                .init();
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    tracing::info!(
        version = version::VERSION,
        git_sha = version::GIT_SHA,
        rustc = version::RUSTC,
        features = version::FEATURES,
        "thunder-server starting"
    );
    let options = args.server_options()?;
    snapshot::check_mode(args.snapshot.snapshot_dir.as_deref(), args.demo_mode())?;
    thunder_server::telemetry::metrics::ProcessMetrics::global()
        .resources
        .install(
            args.memory_limit_bytes,
            args.snapshot.snapshot_dir.as_deref(),
        );
    if let Some(secret) = &args.cursor_secret {
        thunder_server::serve::cursor::CursorKey::install(secret.as_bytes());
    }
    let store = Arc::new(thunder_server::shard::new_store(
        args.post_retention_seconds,
        args.shard,
    ));
    tracing::info!(
        retention_secs = args.post_retention_seconds,
        retention_days = args.post_retention_seconds as f64 / 86_400.0,
        "post store created"
    );

    let demo_workload = args
        .demo_mode()
        .then(|| demo::workload(args.demo_scale, store.now_secs()));
    let following = demo_workload
        .as_ref()
        .map(|w| Arc::new(demo::following(w)) as Arc<dyn FollowingSource>);
    let server = thunder_server::start(options, Arc::clone(&store), following).await?;
    let mut stop = std::pin::pin!(shutdown_signal());
    let (stop_feed, feed_stopped) = watch::channel(false);

    let mut ingest = None;
    let mut live = None;
    let mut snapshots = None;
    if let Some(workload) = demo_workload {
        server.readiness().set_source(format!(
            "demo: synthetic feed-2d workload (scale {}, {} live events/s), no Kafka",
            args.demo_scale, args.demo_events_per_sec
        ));
        tracing::info!(
            scale = args.demo_scale,
            "demo mode: synthetic event source (no Kafka)"
        );
        tokio::select! {
            loaded = demo::load_backlog(Arc::clone(&store), workload.clone()) => {
                loaded.map_err(anyhow::Error::msg)?;
            }
            () = &mut stop => {
                let drained = server.shutdown().await;
                tracing::info!(drained, "stopped");
                return Ok(());
            }
        }
        if let Some(viewer) = workload.viewers(1).first() {
            tracing::info!(
                "demo: try `{}` (follow list from the demo graph) or --follow {}",
                demo::try_command(server.grpc_addr(), args.tls_cert.is_some(), viewer.user_id),
                viewer
                    .following
                    .iter()
                    .take(5)
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        live = Some(tokio::spawn(demo::run_live(
            Arc::clone(&store),
            workload,
            args.demo_events_per_sec,
            feed_stopped,
        )));
    } else {
        server.readiness().set_source(format!(
            "Kafka topic {} at {}",
            args.kafka.client.kafka_topic,
            args.kafka.client.kafka_brokers.as_deref().unwrap_or("-")
        ));
        let restore = snapshot::restorer(
            &args.snapshot,
            Arc::clone(&store),
            &args.kafka.client.kafka_topic,
        );
        let started = kafka::start_with(&args.kafka, Arc::clone(&store), restore)
            .context("starting Kafka ingestion")?;
        snapshots = snapshot::Snapshots::new(
            &args.snapshot,
            Arc::clone(&store),
            &args.kafka.client.kafka_topic,
            started.applied_offsets(),
        )?;
        let mut caught_up = started.caught_up.clone();
        ingest = Some(started);
        loop {
            let state = caught_up.borrow_and_update().clone();
            match state {
                CatchUpState::CaughtUp { took } => {
                    tracing::info!(took_secs = took.as_secs_f64(), "Kafka catch-up done");
                    break;
                }
                CatchUpState::Failed(message) => {
                    server.shutdown().await;
                    anyhow::bail!("Kafka ingestion failed before catching up: {message}");
                }
                CatchUpState::CatchingUp => {}
            }
            tokio::select! {
                changed = caught_up.changed() => {
                    if changed.is_err() {
                        server.shutdown().await;
                        anyhow::bail!("Kafka ingestion stopped before catching up");
                    }
                }
                () = &mut stop => {
                    let drained = server.shutdown().await;
                    if let Some(ingest) = ingest {
                        stop_ingest(ingest, CATCH_UP_INGEST_STOP_TIMEOUT).await;
                    }
                    tracing::info!(drained, "stopped");
                    return Ok(());
                }
            }
        }
    }
    server.readiness().set_ready().await;
    let snapshot_task = snapshots.map(snapshot::SnapshotTask::start);

    // After catch-up, a dead ingest thread means the store silently stops following the topic:
    // exit (after draining) so the process supervisor restarts the replica. A stalled
    // partition turns readiness off until it moves again.
    let mut ingest_state = ingest.as_ref().map(|i| i.caught_up.clone());
    let mut stalled = ingest.as_ref().map(|i| i.stalled.clone());
    let readiness = server.readiness().clone();
    let follow_stalls = async {
        let Some(stalled) = stalled.as_mut() else {
            return std::future::pending::<()>().await;
        };
        while stalled.changed().await.is_ok() {
            let partitions = stalled.borrow_and_update().clone();
            let reason = if partitions.is_empty() {
                "every Kafka partition moves again".to_owned()
            } else {
                format!("Kafka partitions {partitions:?} stalled")
            };
            readiness.set_serving(partitions.is_empty(), &reason).await;
        }
        std::future::pending::<()>().await
    };
    let ingest_failed = async {
        let Some(state) = ingest_state.as_mut() else {
            return std::future::pending::<String>().await;
        };
        loop {
            if state.changed().await.is_err() {
                return "Kafka ingestion stopped".to_string();
            }
            if let CatchUpState::Failed(message) = &*state.borrow_and_update() {
                return message.clone();
            }
        }
    };
    let failure = tokio::select! {
        () = &mut stop => None,
        message = ingest_failed => Some(message),
        () = follow_stalls => None,
    };
    if let Some(message) = &failure {
        tracing::error!(%message, "Kafka ingestion failed after catch-up; shutting down");
    }
    server
        .lame_duck(
            Duration::from_secs(args.shutdown_delay_secs),
            shutdown_signal(),
        )
        .await;
    tracing::info!("shutting down: draining in-flight requests");
    let drained = server.shutdown().await;
    let _ = stop_feed.send(true);
    if let Some(live) = live {
        let _ = live.await;
    }
    let ingest_stopped = match ingest {
        Some(ingest) => stop_ingest(ingest, INGEST_STOP_TIMEOUT).await,
        None => true,
    };
    if let Some(task) = snapshot_task {
        if ingest_stopped {
            // After ingestion stopped, so the offsets it records are exact.
            task.shutdown().await;
        } else {
            tracing::warn!("no shutdown snapshot: Kafka ingestion did not stop in time");
        }
    }
    tracing::info!(drained, "stopped");
    match failure {
        Some(message) => anyhow::bail!("Kafka ingestion failed after catch-up: {message}"),
        None if !drained => {
            tracing::error!("the drain timeout cut in-flight calls");
            std::process::exit(thunder_server::lifecycle::EXIT_DRAIN_CUT)
        }
        None => Ok(()),
    }
}

/// Stops Kafka ingestion, waiting at most `timeout`; false when it did not stop in time (its
/// threads end with the process).
async fn stop_ingest(ingest: KafkaIngest, timeout: Duration) -> bool {
    let started = std::time::Instant::now();
    tracing::info!(
        timeout_secs = timeout.as_secs_f64(),
        "stopping Kafka ingestion: closing the consumers (an unreachable broker holds them up to the timeout)"
    );
    match tokio::time::timeout(timeout, ingest.shutdown()).await {
        Ok(()) => {
            let took_secs = started.elapsed().as_secs_f64();
            tracing::info!(took_secs, "Kafka ingestion stopped");
            true
        }
        Err(_) => {
            tracing::warn!(
                timeout_secs = timeout.as_secs_f64(),
                "Kafka ingestion did not stop in time (broker unreachable?); exiting without it"
            );
            false
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}
