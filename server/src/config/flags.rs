//! Command-line flags of `thunder-server`; every flag also reads a `THUNDER_*` variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use thunder_engine::config::DEFAULT_RETENTION_SECS;

use crate::error::StartupError;
use crate::kafka::KafkaArgs;
use crate::lifecycle::replica::{EventSource, ReplicaOptions};
use crate::lifecycle::{DEFAULT_MAX_DECODING_MESSAGE_BYTES, ServerOptions};
use crate::serve::tls::TlsFiles;
use crate::{demo, maintenance};

/// Default of `--shutdown-delay-secs`: longer than the few seconds an endpoint removal takes to
/// reach kube-proxy, DNS and client-side balancers.
pub const DEFAULT_SHUTDOWN_DELAY_SECS: u64 = 5;

/// The format of the log lines on standard output (`--log-format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// Flags of the server binary.
#[derive(clap::Parser, Clone, Debug)]
#[command(
    name = "thunder-server",
    version = crate::version::LONG_VERSION,
    about = "In-network posts: serves the newest posts of followed accounts over gRPC"
)]
pub struct Args {
    /// gRPC listen address.
    #[arg(long, env = "THUNDER_GRPC_ADDR", default_value = "0.0.0.0:9090")]
    pub grpc_addr: SocketAddr,
    /// Admin HTTP listen address (/metrics, /healthz, /readyz, /debug/pprof/*).
    #[arg(long, env = "THUNDER_ADMIN_ADDR", default_value = "127.0.0.1:8080")]
    pub admin_addr: SocketAddr,
    /// Global GetInNetworkPosts calls per second (burst = one second's worth); must be > 0.
    #[arg(long, env = "THUNDER_QPS_LIMIT", default_value_t = 8000)]
    pub qps_limit: u32,
    /// Store query budget per call in ms; a query past it returns the posts found so far.
    /// 0 disables it (the client's grpc-timeout still applies).
    #[arg(long, env = "THUNDER_REQUEST_TIMEOUT_MS", default_value_t = 0)]
    pub request_timeout_ms: u64,
    /// How long posts are kept, in seconds. Trimming follows it: one of the 5 author shards
    /// every retention/50 seconds (1 to 120 s), so an expired post is freed within about a
    /// tenth of the retention.
    #[arg(long, env = "THUNDER_POST_RETENTION_SECONDS", default_value_t = DEFAULT_RETENTION_SECS)]
    pub post_retention_seconds: i64,
    /// Largest decoded gRPC request message, in bytes.
    #[arg(long, env = "THUNDER_MAX_DECODING_MESSAGE_BYTES", default_value_t = DEFAULT_MAX_DECODING_MESSAGE_BYTES)]
    pub max_decoding_message_bytes: usize,
    /// On SIGTERM/SIGINT, how long in-flight calls may finish before connections are cut, in ms.
    #[arg(long, env = "THUNDER_SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,
    /// Lame duck: on SIGTERM/SIGINT readiness turns NOT_SERVING at once (gRPC health, /readyz)
    /// and calls are still served for this many seconds, so that endpoints and client-side
    /// balancers stop sending before the connections are closed; then the drain. A second
    /// signal cuts it short. Keep it longer than endpoint propagation (a few seconds).
    #[arg(long, env = "THUNDER_SHUTDOWN_DELAY_SECS", default_value_t = DEFAULT_SHUTDOWN_DELAY_SECS)]
    pub shutdown_delay_secs: u64,
    /// Log format: `text` (one line an event; colour only on a terminal and without NO_COLOR)
    /// or `json` (one JSON object a line, the event's fields as keys, for log collectors).
    #[arg(long, env = "THUNDER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Server certificate chain (PEM). With --tls-key and --tls-client-ca: serve mTLS.
    #[arg(long, env = "THUNDER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long, env = "THUNDER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA bundle that client certificates must chain to (PEM); client certificates are required.
    #[arg(long, env = "THUNDER_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Feed the store from the in-process synthetic workload even if Kafka is configured.
    /// Without --kafka-brokers the server always runs in demo mode.
    #[arg(long, env = "THUNDER_DEMO")]
    pub demo: bool,
    /// Demo workload size: 1_000_000/scale authors and 20_000_000/scale posts over two days.
    #[arg(long, env = "THUNDER_DEMO_SCALE", default_value_t = demo::DEFAULT_SCALE,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub demo_scale: u32,
    /// Demo live events (creates and deletes) per second after the backlog.
    #[arg(long, env = "THUNDER_DEMO_EVENTS_PER_SEC", default_value_t = demo::DEFAULT_EVENTS_PER_SEC)]
    pub demo_events_per_sec: u32,
    /// Store queries running at once (0: one per runtime worker); more calls wait in a queue.
    #[arg(long, env = "THUNDER_MAX_QUERIES_IN_FLIGHT", default_value_t = 0)]
    pub max_queries_in_flight: usize,
    /// Refuse a call (RESOURCE_EXHAUSTED) when the query queue's expected wait exceeds this, in ms.
    #[arg(long, env = "THUNDER_MAX_QUEUE_WAIT_MS", default_value_t = 50)]
    pub max_queue_wait_ms: u64,
    /// Highest degrade level under a standing query queue (0: never degrade; at most 3).
    #[arg(long, env = "THUNDER_MAX_DEGRADE_LEVEL", default_value_t = crate::serve::overload::MAX_DEGRADE_LEVEL)]
    pub max_degrade_level: u8,
    /// Run store queries on tokio's blocking pool instead of the thread serving the call.
    #[arg(long, env = "THUNDER_BLOCKING_QUERIES")]
    pub blocking_queries: bool,
    /// Runtime worker threads: they serve the connections and run the store queries (0: one
    /// per core). Fewer workers than cores cost less CPU per answer when other busy threads
    /// share the machine; with a single worker the query queue is the runtime's own, and
    /// overload is seen through each call's acceptance time, but refusals come only after
    /// the call's wait in it (docs/architecture.md, "Overload design").
    #[arg(long, env = "THUNDER_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
    /// Concurrent HTTP/2 streams per gRPC connection (at least 1).
    #[arg(long, env = "THUNDER_MAX_CONCURRENT_STREAMS", default_value_t = crate::lifecycle::DEFAULT_MAX_CONCURRENT_STREAMS)]
    pub max_concurrent_streams: u32,
    /// Streams a client may open and reset before the server has taken them, waiting at once
    /// on one gRPC connection; past it the connection is closed (GOAWAY ENHANCE_YOUR_CALM
    /// "too_many_resets", the rapid-reset guard). 0: 20 x --max-concurrent-streams.
    #[arg(
        long,
        env = "THUNDER_HTTP2_MAX_PENDING_RESET_STREAMS",
        default_value_t = 0
    )]
    pub http2_max_pending_reset_streams: usize,
    /// Open gRPC connections at most (at least 1). At the cap a new connection takes the slot of an idle
    /// one (never sent a byte first, else least recently active); it is closed at accept only
    /// when every connection has a call running.
    #[arg(long, env = "THUNDER_MAX_CONNECTIONS", default_value_t = crate::lifecycle::DEFAULT_GRPC_CONNECTIONS.max_connections)]
    pub max_connections: usize,
    /// Open gRPC connections from one peer IP address at most (0: half of --max-connections).
    /// At this cap a new connection takes the slot of one of the same address's idle ones.
    #[arg(long, env = "THUNDER_MAX_CONNECTIONS_PER_PEER", default_value_t = 0)]
    pub max_connections_per_peer: usize,
    /// A new gRPC connection must send the HTTP/2 preface and a first request within this
    /// long, in ms (at least 1), or it is closed.
    #[arg(
        long,
        env = "THUNDER_GRPC_HANDSHAKE_TIMEOUT_MS",
        default_value_t = 5000
    )]
    pub grpc_handshake_timeout_ms: u64,
    /// A gRPC connection without a call for this long is closed, in seconds (at least 1).
    #[arg(long, env = "THUNDER_GRPC_IDLE_TIMEOUT_SECS", default_value_t = 120)]
    pub grpc_idle_timeout_secs: u64,
    /// Author shard `I/N`: keep only the posts of the authors the shard hash maps to `I`
    /// (plus the facts of the others' posts the query rules read). Unset: a full replica.
    #[arg(long, env = "THUNDER_SHARD")]
    pub shard: Option<thunder_proto::shard::ShardSpec>,
    /// Memory limit of the process in bytes, exported as `memory_limit_bytes` for the alert on
    /// resident memory. Unset: the memory cgroup's limit (memory.max; cgroup v1:
    /// memory.limit_in_bytes), read at start-up. 0: no limit (nothing exported).
    #[arg(long, env = "THUNDER_MEMORY_LIMIT_BYTES")]
    pub memory_limit_bytes: Option<u64>,
    /// Secret the page cursors are signed with; give every replica behind one address the
    /// same one. Unset: a built-in secret (cursors are still checked, but forgeable).
    #[arg(long, env = "THUNDER_CURSOR_SECRET", hide_env_values = true)]
    pub cursor_secret: Option<String>,
    /// Check the configuration and exit without serving: flag values in range, the gRPC and
    /// Kafka TLS files (readable, parseable, the key matching the certificate, certificates
    /// valid now; expiring within 30 days is a warning), the Kafka security settings (a
    /// mechanism for `sasl_*`, supported by this build; a password on the command line is a
    /// warning), the snapshot directory writable, the Kafka properties accepted by
    /// librdkafka. Prints the effective configuration (secrets masked) and every problem and
    /// warning; exits 0 when it is valid, 2 when not.
    #[arg(long, env = "THUNDER_CHECK_CONFIG")]
    pub check_config: bool,
    /// Bearer token of the privileged admin requests (CPU profiles, POST /admin/snapshot): they
    /// must send `Authorization: Bearer <token>`. Unset: they are served only on a loopback
    /// --admin-addr; an admin listener other hosts reach is then read-only.
    #[arg(long, env = "THUNDER_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// On a loopback --admin-addr without --admin-token: host names accepted in the Host header
    /// of privileged admin requests, comma-separated, besides localhost, 127.0.0.1, ::1 and the
    /// --admin-addr IP (`name` or `name:port`).
    #[arg(long, env = "THUNDER_ADMIN_ALLOWED_HOSTS", value_delimiter = ',')]
    pub admin_allowed_hosts: Vec<String>,
    /// Kafka ingestion.
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Snapshots.
    #[command(flatten)]
    pub snapshot: crate::snapshot::SnapshotArgs,
}

impl Args {
    /// True when the store is fed by the synthetic demo source rather than Kafka.
    pub fn demo_mode(&self) -> bool {
        self.demo || self.kafka.client.kafka_brokers.is_none()
    }

    /// The runtime's worker threads: `--worker-threads`, or one per core.
    pub fn runtime_workers(&self) -> usize {
        if self.worker_threads > 0 {
            self.worker_threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    /// Every server flag value the server refuses, all at once: the ranges their help states
    /// (values out of range are refused, never clamped) and flags that only work together.
    /// The Kafka flags are checked by [`crate::kafka::KafkaArgs::validate`].
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut refuse = |bad: bool, problem: &str| {
            if bad {
                problems.push(problem.to_owned());
            }
        };
        refuse(self.qps_limit == 0, "--qps-limit must be greater than 0");
        refuse(
            self.post_retention_seconds <= 0,
            "--post-retention-seconds must be greater than 0",
        );
        refuse(
            self.admin_token.as_deref().is_some_and(str::is_empty),
            "--admin-token must not be empty",
        );
        refuse(
            self.max_degrade_level > crate::serve::overload::MAX_DEGRADE_LEVEL,
            &format!(
                "--max-degrade-level {} is out of range: at most {}",
                self.max_degrade_level,
                crate::serve::overload::MAX_DEGRADE_LEVEL
            ),
        );
        refuse(
            self.max_concurrent_streams == 0,
            "--max-concurrent-streams must be at least 1",
        );
        refuse(
            self.max_connections == 0,
            "--max-connections must be at least 1",
        );
        refuse(
            self.grpc_handshake_timeout_ms == 0,
            "--grpc-handshake-timeout-ms must be at least 1",
        );
        refuse(
            self.grpc_idle_timeout_secs == 0,
            "--grpc-idle-timeout-secs must be at least 1",
        );
        if let Err(e) = TlsFiles::from_parts(
            self.tls_cert.clone(),
            self.tls_key.clone(),
            self.tls_client_ca.clone(),
        ) {
            problems.push(config_message(e));
        }
        problems
    }

    /// The server options these flags describe; fails with every [`Args::problems`].
    pub fn server_options(&self) -> Result<ServerOptions, StartupError> {
        let problems = self.problems();
        if !problems.is_empty() {
            return Err(StartupError::Config(problems.join("; ")));
        }
        Ok(ServerOptions {
            grpc_addr: self.grpc_addr,
            admin_addr: self.admin_addr,
            qps_limit: self.qps_limit,
            request_timeout: (self.request_timeout_ms > 0)
                .then(|| Duration::from_millis(self.request_timeout_ms)),
            max_decoding_message_bytes: self.max_decoding_message_bytes,
            tls: TlsFiles::from_parts(
                self.tls_cert.clone(),
                self.tls_key.clone(),
                self.tls_client_ca.clone(),
            )?,
            drain_timeout: Duration::from_millis(self.shutdown_timeout_ms),
            trim_interval: maintenance::trim_interval_for(self.post_retention_seconds),
            stats_interval: maintenance::STATS_INTERVAL,
            admin_access: crate::admin::routes::AdminAccess {
                token: self.admin_token.clone(),
                allowed_hosts: self.admin_allowed_hosts.clone(),
            },
            ..self.serving_options()
        })
    }

    /// The whole process these flags describe (a replica fed by Kafka or the demo source);
    /// fails with every [`Args::problems`], and on `--snapshot-dir` in demo mode.
    pub fn replica_options(&self) -> Result<ReplicaOptions, StartupError> {
        let server = self.server_options()?;
        crate::snapshot::check_mode(self.snapshot.snapshot_dir.as_deref(), self.demo_mode())?;
        let source = if self.demo_mode() {
            EventSource::Demo {
                scale: self.demo_scale,
                events_per_sec: self.demo_events_per_sec,
            }
        } else {
            EventSource::Kafka {
                kafka: Box::new(self.kafka.clone()),
                snapshot: self.snapshot.clone(),
            }
        };
        Ok(ReplicaOptions {
            server,
            source,
            retention_secs: self.post_retention_seconds,
            shard: self.shard,
            memory_limit_bytes: self.memory_limit_bytes,
            cursor_secret: self.cursor_secret.clone(),
            shutdown_delay: Duration::from_secs(self.shutdown_delay_secs),
        })
    }
}

impl Args {
    /// The serving-path part of [`ServerOptions`] (overload control and connection bounds).
    fn serving_options(&self) -> ServerOptions {
        let defaults = ServerOptions::default();
        let mut overload = crate::serve::overload::OverloadConfig {
            max_queue_wait: Duration::from_millis(self.max_queue_wait_ms),
            max_level: self.max_degrade_level,
            ..defaults.overload.clone()
        };
        overload.executors = if self.max_queries_in_flight > 0 {
            self.max_queries_in_flight
        } else {
            self.runtime_workers()
        };
        ServerOptions {
            overload,
            inline_queries: !self.blocking_queries,
            max_concurrent_streams: self.max_concurrent_streams,
            http2_max_pending_reset_streams: self.http2_max_pending_reset_streams,
            grpc_connections: crate::serve::listener::ConnLimits {
                max_connections: self.max_connections,
                max_connections_per_peer: if self.max_connections_per_peer > 0 {
                    self.max_connections_per_peer
                } else {
                    (self.max_connections / 2).max(1)
                },
                idle_timeout: Duration::from_secs(self.grpc_idle_timeout_secs),
                handshake_timeout: Duration::from_millis(self.grpc_handshake_timeout_ms),
                ..defaults.grpc_connections
            },
            ..defaults
        }
    }
}

/// The message of a configuration error, without the `invalid configuration: ` prefix.
fn config_message(error: StartupError) -> String {
    match error {
        StartupError::Config(message) => message,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults() {
        let args = Args::try_parse_from(["thunder-server"]).expect("defaults parse");
        assert!(args.demo_mode());
        let options = args.server_options().expect("valid");
        assert_eq!(options.qps_limit, 8000);
        assert_eq!(options.request_timeout, None);
        assert_eq!(options.tls, None);
        assert_eq!(options.admin_addr.ip().to_string(), "127.0.0.1");
    }

    #[test]
    fn the_flags_choose_the_replicas_source() {
        let demo = Args::try_parse_from(["thunder-server", "--demo-scale", "7"]).expect("parses");
        let options = demo.replica_options().expect("valid");
        assert!(matches!(options.source, EventSource::Demo { scale: 7, .. }));
        let kafka = Args::try_parse_from([
            "thunder-server",
            "--kafka-brokers",
            "localhost:9092",
            "--snapshot-dir",
            "/var/lib/thunder",
            "--shutdown-delay-secs",
            "2",
        ])
        .expect("parses");
        let options = kafka.replica_options().expect("valid");
        assert_eq!(options.shutdown_delay, Duration::from_secs(2));
        let EventSource::Kafka { kafka, snapshot } = options.source else {
            panic!("a Kafka source");
        };
        assert_eq!(
            kafka.client.kafka_brokers.as_deref(),
            Some("localhost:9092")
        );
        assert!(snapshot.snapshot_dir.is_some());
        let demo_with_snapshots =
            Args::try_parse_from(["thunder-server", "--snapshot-dir", "/var/lib/thunder"])
                .expect("parses");
        let error = demo_with_snapshots.replica_options().expect_err("refused");
        assert!(error.to_string().contains("needs Kafka"), "{error}");
    }

    #[test]
    fn runtime_workers_and_query_executors_default_to_one_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let args = Args::try_parse_from(["thunder-server"]).expect("defaults parse");
        assert_eq!(args.runtime_workers(), cores);
        assert_eq!(
            args.server_options().expect("valid").overload.executors,
            cores
        );
        // One executor per runtime worker unless set.
        let args =
            Args::try_parse_from(["thunder-server", "--worker-threads", "1"]).expect("parses");
        assert_eq!(args.runtime_workers(), 1);
        assert_eq!(args.server_options().expect("valid").overload.executors, 1);
        let args = Args::try_parse_from([
            "thunder-server",
            "--worker-threads",
            "1",
            "--max-queries-in-flight",
            "3",
        ])
        .expect("parses");
        assert_eq!(args.server_options().expect("valid").overload.executors, 3);
    }

    #[test]
    fn the_per_peer_cap_defaults_to_half_the_connection_cap() {
        let options = |argv: &[&str]| {
            let mut all = vec!["thunder-server"];
            all.extend_from_slice(argv);
            Args::try_parse_from(all)
                .expect("parses")
                .server_options()
                .expect("valid")
                .grpc_connections
        };
        assert_eq!(options(&[]).max_connections_per_peer, 500);
        assert_eq!(
            options(&["--max-connections", "10"]).max_connections_per_peer,
            5
        );
        let set = options(&[
            "--max-connections-per-peer",
            "7",
            "--grpc-handshake-timeout-ms",
            "250",
        ]);
        assert_eq!(set.max_connections_per_peer, 7);
        assert_eq!(set.handshake_timeout, Duration::from_millis(250));
    }

    #[test]
    fn the_pending_reset_stream_limit_is_passed_on() {
        let args =
            Args::try_parse_from(["thunder-server", "--http2-max-pending-reset-streams", "300"])
                .expect("parses");
        let options = args.server_options().expect("valid");
        assert_eq!(options.http2_max_pending_reset_streams, 300);
        let args = Args::try_parse_from(["thunder-server"]).expect("parses");
        assert_eq!(
            args.server_options()
                .expect("valid")
                .http2_max_pending_reset_streams,
            0,
            "0: derived from the stream cap"
        );
    }

    #[test]
    fn refuses_zero_qps_and_partial_tls() {
        let args = Args::try_parse_from(["thunder-server", "--qps-limit", "0"]).expect("parses");
        let err = args.server_options().expect_err("0 is refused");
        assert!(err.to_string().contains("--qps-limit"));
        let args = Args::try_parse_from(["thunder-server", "--tls-cert", "c.pem"]).expect("parses");
        assert!(args.server_options().is_err());
    }

    #[test]
    fn admin_access_flags() {
        let args = Args::try_parse_from([
            "thunder-server",
            "--admin-token",
            "t",
            "--admin-allowed-hosts",
            "a.example,b.example:8080",
        ])
        .expect("parses");
        let access = args.server_options().expect("valid").admin_access;
        assert_eq!(access.token.as_deref(), Some("t"));
        assert_eq!(access.allowed_hosts, ["a.example", "b.example:8080"]);
        let args = Args::try_parse_from(["thunder-server", "--admin-token", ""]).expect("parses");
        let err = args
            .server_options()
            .expect_err("an empty token is refused");
        assert!(err.to_string().contains("--admin-token"), "{err}");
    }
}
