//! The whole server process as one type: a [`Replica`] starts (the store, both listeners and
//! its event source), catches up with the source, serves until a stop is requested or its
//! source fails, and stops in order. `main` parses the flags and hands over to [`run`]; the
//! tests drive the same steps in-process.
//!
//! # The steps, in order
//! 1. [`Replica::start`]: the store, the listeners (NOT_SERVING), then the source: the demo
//!    workload, or Kafka ingestion (resuming from a snapshot when `--snapshot-dir` has one).
//! 2. [`Replica::catch_up`]: the demo backlog loaded, or Kafka's catch-up gate passed; a stop
//!    requested meanwhile ends the wait.
//! 3. [`Replica::serve`]: readiness SERVING, the snapshot schedule started; a Kafka partition
//!    that stalls turns readiness off until it moves. Returns when a stop is requested or
//!    ingestion fails after catch-up (the replica no longer follows the topic: exiting lets
//!    the process supervisor restart it).
//! 4. [`Replica::stop`]: after a catch-up, the lame duck (readiness off, calls still served,
//!    cut short by a further stop request), then the drain of in-flight calls, then the source
//!    stops (ingestion's consumers closed within a timeout), then the shutdown snapshot
//!    (only when ingestion stopped, so its offsets are exact).

use std::sync::Arc;
use std::time::Duration;

use thunder_engine::PostStore;
use thunder_proto::shard::ShardSpec;
use thunder_workload::SynthConfig;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::listeners::{RunningServer, ServerOptions, start};
use crate::error::ProcessError;
use crate::kafka::{self, CatchUpState, KafkaArgs, KafkaIngest};
use crate::serve::following::FollowingSource;
use crate::snapshot::{self, SnapshotArgs, SnapshotTask, Snapshots};
use crate::telemetry::metrics::ProcessMetrics;
use crate::telemetry::readiness::Readiness;

/// How long the stop waits for Kafka ingestion once the store is serving (the shutdown
/// snapshot waits for it); past it the process exits without it and without that snapshot (an
/// unreachable broker can hold the consumer's close for many seconds).
pub const INGEST_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The same before the store caught up: nothing waits for the stop then.
pub const CATCH_UP_INGEST_STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// What feeds the store.
#[derive(Clone, Debug)]
pub enum EventSource {
    /// The synthetic feed-2d workload, no Kafka.
    Demo {
        /// The workload divided by this (1 = 1M authors and 20M posts).
        scale: u32,
        /// Live events per second after the backlog (0: none).
        events_per_sec: u32,
    },
    /// Kafka ingestion, with snapshots when `snapshot.snapshot_dir` is set.
    Kafka {
        /// The topic, the brokers and the consumer's settings.
        kafka: Box<KafkaArgs>,
        /// Where snapshots go and how often.
        snapshot: SnapshotArgs,
    },
}

/// Everything a [`Replica`] needs.
#[derive(Clone, Debug)]
pub struct ReplicaOptions {
    /// The listeners.
    pub server: ServerOptions,
    /// What feeds the store.
    pub source: EventSource,
    /// Posts older than this are expired.
    pub retention_secs: i64,
    /// The author shard this replica holds (`None`: every author).
    pub shard: Option<ShardSpec>,
    /// `--memory-limit-bytes` (`None`: the cgroup's limit), exported for the memory alert.
    pub memory_limit_bytes: Option<u64>,
    /// The key page cursors are sealed with (`None`: a random one per process).
    pub cursor_secret: Option<String>,
    /// The lame duck before the drain (0: none).
    pub shutdown_delay: Duration,
}

/// Requests to stop a replica: SIGINT and SIGTERM in the process, a test's own calls
/// in-process. The first ends the wait it interrupts; a further one cuts the lame duck short.
#[derive(Clone, Debug)]
pub struct StopRequests {
    sender: Arc<watch::Sender<u32>>,
}

impl Default for StopRequests {
    fn default() -> Self {
        Self {
            sender: Arc::new(watch::channel(0).0),
        }
    }
}

impl StopRequests {
    /// Requests a stop.
    pub fn request(&self) {
        self.sender.send_modify(|requests| *requests += 1);
    }

    /// A listener that has seen no request yet: one made before the replica started (a
    /// SIGTERM while it creates its store) stops it at its first wait.
    fn listen(&self) -> StopListener {
        StopListener {
            requests: self.sender.subscribe(),
            seen: 0,
        }
    }
}

/// The requests one replica has seen.
#[derive(Debug)]
struct StopListener {
    requests: watch::Receiver<u32>,
    seen: u32,
}

impl StopListener {
    /// Resolves at the next request this listener has not seen.
    async fn next(&mut self) {
        let seen = self.seen;
        // The sender lives in the replica's own `StopRequests`: it is never dropped first.
        if let Ok(requests) = self.requests.wait_for(|&n| n > seen).await {
            self.seen = *requests;
        } else {
            std::future::pending::<()>().await;
        }
    }
}

/// What feeds a started replica's store, and how to stop it.
enum Feed {
    Demo {
        workload: SynthConfig,
        scale: u32,
        events_per_sec: u32,
        /// The live trickle, once the backlog is in.
        live: Option<JoinHandle<()>>,
        stop_live: watch::Sender<bool>,
    },
    Kafka {
        ingest: KafkaIngest,
        snapshots: Option<Arc<Snapshots>>,
        /// The snapshot schedule, once the store serves.
        schedule: Option<SnapshotTask>,
    },
}

/// How catching up ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatchUp {
    /// The store holds what the source held at start.
    Done,
    /// A stop was requested first.
    StopRequested,
}

/// Why serving ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// A stop was requested.
    StopRequested,
    /// Kafka ingestion failed after catch-up: the store no longer follows the topic.
    SourceFailed(String),
}

/// How the replica stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    /// The store had caught up (and served) before the stop.
    pub caught_up: bool,
    /// Every in-flight call finished within the drain timeout.
    pub drained: bool,
}

impl Stopped {
    /// The drain timeout cut calls of a serving replica (`thunder-server` then exits with
    /// [`EXIT_DRAIN_CUT`](super::EXIT_DRAIN_CUT)).
    pub fn drain_cut(&self) -> bool {
        self.caught_up && !self.drained
    }
}

/// A running server process: the store, its listeners and its source.
pub struct Replica {
    store: Arc<PostStore>,
    server: RunningServer,
    feed: Feed,
    stops: StopListener,
    shutdown_delay: Duration,
    caught_up: bool,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("grpc_addr", &self.server.grpc_addr())
            .field("admin_addr", &self.server.admin_addr())
            .field("caught_up", &self.caught_up)
            .finish_non_exhaustive()
    }
}

/// Runs a replica through every step until it stops: what `thunder-server` does.
pub async fn run(options: ReplicaOptions, stops: &StopRequests) -> Result<Stopped, ProcessError> {
    let mut replica = Replica::start(options, stops).await?;
    let failure = match replica.catch_up().await {
        Ok(CatchUp::Done) => match replica.serve().await {
            Served::StopRequested => None,
            Served::SourceFailed(message) => Some(ProcessError::IngestFailed(message)),
        },
        Ok(CatchUp::StopRequested) => None,
        Err(error) => Some(error),
    };
    let stopped = replica.stop().await;
    match failure {
        Some(error) => Err(error),
        None => Ok(stopped),
    }
}

impl Replica {
    /// Creates the store, binds both listeners (NOT_SERVING) and starts the source: the demo
    /// workload is built, Kafka ingestion starts reading (from a snapshot's offsets when
    /// `--snapshot-dir` holds a usable one). `stops` ends the waits of the later steps.
    pub async fn start(
        options: ReplicaOptions,
        stops: &StopRequests,
    ) -> Result<Self, ProcessError> {
        tracing::info!(
            version = crate::version::VERSION,
            git_sha = crate::version::GIT_SHA,
            rustc = crate::version::RUSTC,
            features = crate::version::FEATURES,
            "thunder-server starting"
        );
        let snapshot_dir = match &options.source {
            EventSource::Kafka { snapshot, .. } => snapshot.snapshot_dir.as_deref(),
            EventSource::Demo { .. } => None,
        };
        ProcessMetrics::global()
            .resources
            .install(options.memory_limit_bytes, snapshot_dir);
        if let Some(secret) = &options.cursor_secret {
            crate::serve::cursor::CursorKey::install(secret.as_bytes());
        }
        let store = Arc::new(crate::shard::new_store(
            options.retention_secs,
            options.shard,
        ));
        tracing::info!(
            retention_secs = options.retention_secs,
            retention_days = options.retention_secs as f64 / 86_400.0,
            "post store created"
        );
        let (following, prepared) = Prepared::new(options.source, &store);
        let server = start(options.server, Arc::clone(&store), following).await?;
        let feed = match prepared.start(server.readiness(), &store) {
            Ok(feed) => feed,
            Err(error) => {
                server.shutdown().await;
                return Err(error);
            }
        };
        Ok(Self {
            store,
            server,
            feed,
            stops: stops.listen(),
            shutdown_delay: options.shutdown_delay,
            caught_up: false,
        })
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> std::net::SocketAddr {
        self.server.grpc_addr()
    }

    /// The bound admin HTTP address.
    pub fn admin_addr(&self) -> std::net::SocketAddr {
        self.server.admin_addr()
    }

    /// The readiness the replica reports.
    pub fn readiness(&self) -> &Readiness {
        self.server.readiness()
    }

    /// The store served.
    pub fn store(&self) -> &Arc<PostStore> {
        &self.store
    }

    /// Waits until the store holds what the source held at start: the demo backlog loaded
    /// (then the live trickle starts), or every Kafka partition's backlog applied. A stop
    /// requested meanwhile ends the wait ([`CatchUp::StopRequested`]); a Kafka ingestion that
    /// fails or stops first is an error.
    pub async fn catch_up(&mut self) -> Result<CatchUp, ProcessError> {
        let caught_up = match &self.feed {
            Feed::Demo { .. } => self.load_demo_backlog().await?,
            Feed::Kafka { ingest, .. } => {
                let gate = ingest.caught_up.clone();
                wait_for_kafka_catch_up(gate, &mut self.stops).await?
            }
        };
        self.caught_up = caught_up == CatchUp::Done;
        Ok(caught_up)
    }

    /// The demo's backlog into the store, then its live trickle started.
    async fn load_demo_backlog(&mut self) -> Result<CatchUp, ProcessError> {
        let Feed::Demo {
            workload,
            events_per_sec,
            live,
            stop_live,
            ..
        } = &mut self.feed
        else {
            return Ok(CatchUp::Done);
        };
        tokio::select! {
            loaded = crate::demo::load_backlog(Arc::clone(&self.store), workload.clone()) => {
                loaded.map_err(ProcessError::DemoBacklog)?;
            }
            () = self.stops.next() => return Ok(CatchUp::StopRequested),
        }
        if let Some(viewer) = workload.viewers(1).first() {
            let tls = self.server.tls_enabled();
            tracing::info!(
                "demo: try `{}` (follow list from the demo graph) or --follow {}",
                crate::demo::try_command(self.server.grpc_addr(), tls, viewer.user_id),
                viewer
                    .following
                    .iter()
                    .take(5)
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        *live = Some(tokio::spawn(crate::demo::run_live(
            Arc::clone(&self.store),
            workload.clone(),
            *events_per_sec,
            stop_live.subscribe(),
        )));
        Ok(CatchUp::Done)
    }

    /// Turns readiness SERVING and serves until a stop is requested or Kafka ingestion fails;
    /// a stalled partition turns readiness off meanwhile, until it moves again.
    pub async fn serve(&mut self) -> Served {
        let readiness = self.server.readiness().clone();
        readiness.set_ready().await;
        let Feed::Kafka {
            ingest,
            snapshots,
            schedule,
        } = &mut self.feed
        else {
            self.stops.next().await;
            return Served::StopRequested;
        };
        *schedule = snapshots.take().map(SnapshotTask::start);
        let mut state = ingest.caught_up.clone();
        let mut stalled = ingest.stalled.clone();
        tokio::select! {
            () = self.stops.next() => Served::StopRequested,
            message = ingestion_failure(&mut state) => {
                tracing::error!(%message, "Kafka ingestion failed after catch-up; shutting down");
                Served::SourceFailed(message)
            }
            () = follow_stalls(&mut stalled, &readiness) => Served::StopRequested,
        }
    }

    /// Stops in order: after a catch-up the lame duck (cut short by a further stop request),
    /// then the drain of in-flight calls, then the source (Kafka's consumers closed within a
    /// timeout), then the shutdown snapshot when ingestion stopped in time.
    pub async fn stop(mut self) -> Stopped {
        if self.caught_up {
            let cut_short = self.stops.next();
            self.server.lame_duck(self.shutdown_delay, cut_short).await;
            tracing::info!("shutting down: draining in-flight requests");
        }
        let drained = self.server.shutdown().await;
        match self.feed {
            Feed::Demo {
                live, stop_live, ..
            } => {
                let _ = stop_live.send(true);
                if let Some(live) = live {
                    let _ = live.await;
                }
            }
            Feed::Kafka {
                ingest, schedule, ..
            } => {
                let timeout = if self.caught_up {
                    INGEST_STOP_TIMEOUT
                } else {
                    CATCH_UP_INGEST_STOP_TIMEOUT
                };
                let stopped = stop_ingest(ingest, timeout).await;
                if let Some(schedule) = schedule {
                    if stopped {
                        // After ingestion stopped, so the offsets it records are exact.
                        schedule.shutdown().await;
                    } else {
                        tracing::warn!(
                            "no shutdown snapshot: Kafka ingestion did not stop in time"
                        );
                    }
                }
            }
        }
        tracing::info!(drained, "stopped");
        Stopped {
            caught_up: self.caught_up,
            drained,
        }
    }
}

/// A source before the listeners are up: the demo's workload is built (its viewers back the
/// follow-graph fallback), Kafka waits for the listeners.
enum Prepared {
    Demo(Feed),
    Kafka(Box<KafkaArgs>, SnapshotArgs),
}

impl Prepared {
    /// `source` prepared for `store`, and the follow-graph fallback it brings.
    fn new(source: EventSource, store: &PostStore) -> (Option<Arc<dyn FollowingSource>>, Self) {
        match source {
            EventSource::Demo {
                scale,
                events_per_sec,
            } => {
                let workload = crate::demo::workload(scale, store.now_secs());
                let following = Arc::new(crate::demo::following(&workload));
                let feed = Feed::Demo {
                    workload,
                    scale,
                    events_per_sec,
                    live: None,
                    stop_live: watch::channel(false).0,
                };
                (Some(following), Self::Demo(feed))
            }
            EventSource::Kafka { kafka, snapshot } => (None, Self::Kafka(kafka, snapshot)),
        }
    }

    /// The source started, named on the status page (`readiness`): the demo as it is (its
    /// backlog is loaded by the catch-up), Kafka ingestion into `store` resumed from the newest
    /// usable snapshot, with the snapshot writer (scheduled once the store serves).
    fn start(self, readiness: &Readiness, store: &Arc<PostStore>) -> Result<Feed, ProcessError> {
        match self {
            Self::Demo(feed) => {
                if let Feed::Demo {
                    scale,
                    events_per_sec,
                    ..
                } = &feed
                {
                    readiness.set_source(format!(
                        "demo: synthetic feed-2d workload (scale {scale}, {events_per_sec} live events/s), no Kafka"
                    ));
                    tracing::info!(scale, "demo mode: synthetic event source (no Kafka)");
                }
                Ok(feed)
            }
            Self::Kafka(kafka, snapshot) => {
                let topic = &kafka.client.kafka_topic;
                readiness.set_source(format!(
                    "Kafka topic {topic} at {}",
                    kafka.client.kafka_brokers.as_deref().unwrap_or("-")
                ));
                let restore = snapshot::restorer(&snapshot, Arc::clone(store), topic);
                let ingest = kafka::start_with(&kafka, Arc::clone(store), restore)
                    .map_err(ProcessError::Kafka)?;
                let snapshots = Snapshots::new(
                    &snapshot,
                    Arc::clone(store),
                    topic,
                    ingest.applied_offsets(),
                )?;
                Ok(Feed::Kafka {
                    ingest,
                    snapshots,
                    schedule: None,
                })
            }
        }
    }
}

/// Waits for Kafka's catch-up gate, or for a stop request.
async fn wait_for_kafka_catch_up(
    mut caught_up: watch::Receiver<CatchUpState>,
    stops: &mut StopListener,
) -> Result<CatchUp, ProcessError> {
    loop {
        let state = caught_up.borrow_and_update().clone();
        match state {
            CatchUpState::CaughtUp { took } => {
                tracing::info!(took_secs = took.as_secs_f64(), "Kafka catch-up done");
                return Ok(CatchUp::Done);
            }
            CatchUpState::Failed(message) => return Err(ProcessError::CatchUpFailed(message)),
            CatchUpState::CatchingUp => {}
        }
        tokio::select! {
            changed = caught_up.changed() => {
                if changed.is_err() {
                    return Err(ProcessError::CatchUpStopped);
                }
            }
            () = stops.next() => return Ok(CatchUp::StopRequested),
        }
    }
}

/// Resolves with the reason when ingestion fails (or its gate goes away) after catch-up.
async fn ingestion_failure(state: &mut watch::Receiver<CatchUpState>) -> String {
    loop {
        if state.changed().await.is_err() {
            return "Kafka ingestion stopped".to_owned();
        }
        if let CatchUpState::Failed(message) = &*state.borrow_and_update() {
            return message.clone();
        }
    }
}

/// Turns readiness off while Kafka partitions are stalled and on again when every one moves;
/// never resolves.
async fn follow_stalls(stalled: &mut watch::Receiver<Vec<i32>>, readiness: &Readiness) {
    while stalled.changed().await.is_ok() {
        let partitions = stalled.borrow_and_update().clone();
        let reason = if partitions.is_empty() {
            "every Kafka partition moves again".to_owned()
        } else {
            format!("Kafka partitions {partitions:?} stalled")
        };
        readiness.set_serving(partitions.is_empty(), &reason).await;
    }
    std::future::pending::<()>().await;
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
