//! Command-line / environment configuration of the Kafka ingestion and the librdkafka
//! consumer configuration built from it. The connection flags are
//! [`thunder_events::kafka::KafkaClientArgs`], shared with the producer.

use rdkafka::ClientConfig;
use thunder_events::kafka::{Findings, KafkaClientArgs, KafkaError};

/// Kafka ingestion flags; every flag also reads a `THUNDER_*` environment variable.
///
/// Without `--kafka-brokers` the server runs without Kafka. The connection flags are
/// [`KafkaClientArgs`]'s, defined once; the server's help of `--kafka-brokers` adds what its
/// absence means.
#[derive(clap::Args, Clone)]
#[command(mut_args(brokers_of_the_server))]
pub struct KafkaArgs {
    /// Connection: brokers, topic, security and `-X` properties (shared with producers).
    #[command(flatten)]
    pub client: KafkaClientArgs,

    /// Consumer group prefix; a random uuid is appended per process so every replica reads
    /// every partition (offsets are never committed).
    #[arg(long, env = "THUNDER_KAFKA_GROUP_ID", default_value = "thunder")]
    pub kafka_group_id: String,

    /// Ingest threads (at least 1); the topic's partitions are split into fixed, contiguous
    /// slices over them. Threads beyond the partition count are not started.
    #[arg(long, env = "THUNDER_KAFKA_NUM_THREADS", default_value_t = 4)]
    pub kafka_num_threads: usize,

    /// Records per batch applied to the store (at least 1).
    #[arg(long, env = "THUNDER_KAFKA_BATCH_SIZE", default_value_t = 1000)]
    pub kafka_batch_size: usize,

    /// Longest time a partially filled batch waits for more records before it is applied
    /// (at least 1). A batch is also applied as soon as the consumer has nothing more to hand
    /// out.
    #[arg(long, env = "THUNDER_KAFKA_FETCH_TIMEOUT_MS", default_value_t = 1000)]
    pub kafka_fetch_timeout_ms: u64,

    /// Timeout of broker requests (metadata, watermarks, offsets for times), at least 1.
    #[arg(
        long,
        env = "THUNDER_KAFKA_REQUEST_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub kafka_request_timeout_ms: u64,

    /// librdkafka `auto.offset.reset`: what happens when a position falls outside the log.
    /// `error` (the default): ingestion handles it, logs it and counts a truncation: above the
    /// log end (the broker lost records) it resumes at the new log end, below the log start
    /// (retention deleted unread records) at the log start. `earliest` or `latest` let
    /// librdkafka reset silently to the log start (reading everything again) or end
    /// (skipping every record written meanwhile).
    #[arg(long, env = "THUNDER_KAFKA_AUTO_OFFSET_RESET", default_value = "error")]
    pub kafka_auto_offset_reset: String,

    /// Start each partition at the first record not older than the store's retention
    /// (`offsets_for_times(now - retention)`) instead of the beginning of the retained log.
    #[arg(long, env = "THUNDER_KAFKA_START_FROM_TIME")]
    pub start_from_time: bool,

    /// How often the `kafka_partition_lag` gauge is refreshed (at least 1).
    #[arg(
        long,
        env = "THUNDER_KAFKA_LAG_MONITOR_INTERVAL_SECS",
        default_value_t = 30
    )]
    pub lag_monitor_interval_secs: u64,

    /// After catch-up, a partition that has records to read but applied none for this many
    /// seconds is stalled: readiness turns NOT_SERVING until it moves again (0 disables).
    #[arg(long, env = "THUNDER_KAFKA_STALL_TIMEOUT_SECS", default_value_t = 30)]
    pub kafka_stall_timeout_secs: u64,
    /// Ingest threads that may apply a batch at the same time once caught up (0 = no limit).
    /// Before catch-up all threads apply in parallel. The default 1 keeps a burst of live
    /// events from taking more than one core away from queries; one thread applies far more
    /// events per second than a live topic carries.
    #[arg(long, env = "THUNDER_KAFKA_LIVE_BATCH_PERMITS", default_value_t = 1)]
    pub kafka_live_batch_permits: usize,

    /// Largest fetch response a consumer accepts, in bytes. Consumers start with
    /// `receive.message.max.bytes` 2 MiB + 64 KiB (`fetch.max.bytes` 1 MiB plus room for one
    /// record batch; `-X` overrides both); a broker that answers with more (some ignore the
    /// fetch limits) gets the consumer reconnected with a limit that fits the answer, up to
    /// this ceiling (at most 2147483647, librdkafka's limit). A larger answer stops start-up
    /// (after catch-up its partition stalls instead).
    #[arg(
        long,
        env = "THUNDER_KAFKA_MAX_RESPONSE_BYTES",
        default_value_t = super::fetch_limits::MAX_RESPONSE_BYTES
    )]
    pub kafka_max_response_bytes: u64,

    /// The most memory the records fetched but not yet applied may take during catch-up, in
    /// bytes, once the broker has answered beyond the fetch limits (some send a partition's
    /// whole backlog at once): partitions still catching up are then read as many at a time as
    /// their backlogs fit in 1.5 times what the records left will take in the store (about 90
    /// bytes a post), at most this, each record counted at what librdkafka holds for it (about
    /// 350 bytes plus its payload); a backlog larger than that is read alone. A broker that
    /// honours the limits is read on every partition at once.
    #[arg(
        long,
        env = "THUNDER_KAFKA_CATCH_UP_BUFFER_BYTES",
        default_value_t = super::window::CATCH_UP_BUFFER_BYTES
    )]
    pub kafka_catch_up_buffer_bytes: u64,
}

/// Debug output hides the secrets of the connection flags (see [`KafkaClientArgs`]'s), so the
/// arguments can be logged.
impl std::fmt::Debug for KafkaArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaArgs")
            .field("client", &self.client)
            .field("kafka_group_id", &self.kafka_group_id)
            .field("kafka_num_threads", &self.kafka_num_threads)
            .field("kafka_batch_size", &self.kafka_batch_size)
            .field("kafka_fetch_timeout_ms", &self.kafka_fetch_timeout_ms)
            .field("kafka_request_timeout_ms", &self.kafka_request_timeout_ms)
            .field("kafka_auto_offset_reset", &self.kafka_auto_offset_reset)
            .field("start_from_time", &self.start_from_time)
            .field("lag_monitor_interval_secs", &self.lag_monitor_interval_secs)
            .field("kafka_stall_timeout_secs", &self.kafka_stall_timeout_secs)
            .field("kafka_live_batch_permits", &self.kafka_live_batch_permits)
            .field("kafka_max_response_bytes", &self.kafka_max_response_bytes)
            .field(
                "kafka_catch_up_buffer_bytes",
                &self.kafka_catch_up_buffer_bytes,
            )
            .finish()
    }
}

impl Default for KafkaArgs {
    fn default() -> Self {
        Self {
            client: KafkaClientArgs::default(),
            kafka_group_id: "thunder".to_owned(),
            kafka_num_threads: 4,
            kafka_batch_size: 1000,
            kafka_fetch_timeout_ms: 1000,
            kafka_request_timeout_ms: 10_000,
            kafka_auto_offset_reset: "error".to_owned(),
            start_from_time: false,
            lag_monitor_interval_secs: 30,
            kafka_stall_timeout_secs: 30,
            kafka_live_batch_permits: 1,
            kafka_max_response_bytes: super::fetch_limits::MAX_RESPONSE_BYTES,
            kafka_catch_up_buffer_bytes: super::window::CATCH_UP_BUFFER_BYTES,
        }
    }
}

impl KafkaArgs {
    /// Every value ingestion refuses: the ranges the flags' help states and the security
    /// settings ([`KafkaClientArgs::security_settings`]), all of them at once.
    pub fn validate(&self) -> Findings {
        let mut found = self.client.security_settings();
        let mut refuse = |bad: bool, problem: &str| {
            if bad {
                found.problems.push(problem.to_owned());
            }
        };
        refuse(
            self.client.kafka_topic.is_empty(),
            "--kafka-topic must not be empty",
        );
        refuse(
            self.kafka_num_threads == 0,
            "--kafka-num-threads must be at least 1",
        );
        refuse(
            self.kafka_batch_size == 0,
            "--kafka-batch-size must be at least 1",
        );
        refuse(
            self.kafka_fetch_timeout_ms == 0,
            "--kafka-fetch-timeout-ms must be at least 1",
        );
        refuse(
            self.kafka_request_timeout_ms == 0,
            "--kafka-request-timeout-ms must be at least 1",
        );
        refuse(
            self.lag_monitor_interval_secs == 0,
            "--lag-monitor-interval-secs must be at least 1",
        );
        refuse(
            !(1..=super::fetch_limits::LIBRDKAFKA_MAX_RESPONSE_BYTES)
                .contains(&self.kafka_max_response_bytes),
            "--kafka-max-response-bytes must be between 1 and 2147483647 (librdkafka's limit)",
        );
        found
    }

    /// Consumer configuration: no group management, no commits, the given group id, fetch
    /// limits consistent with each other (`fetch_limits.rs`).
    pub(crate) fn consumer_config(&self, group_id: &str) -> Result<ClientConfig, KafkaError> {
        let mut config = self.client.client_config()?;
        config
            .set("group.id", group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", &self.kafka_auto_offset_reset);
        super::fetch_limits::set_consumer_defaults(&mut config, &self.client.kafka_properties);
        // `-X` wins over our defaults too.
        for (key, value) in &self.client.kafka_properties {
            config.set(key, value);
        }
        // The catch-up and stall rules rely on end-of-partition events.
        config.set("enable.partition.eof", "true");
        Ok(config)
    }
}

/// `--kafka-brokers` as the server takes it: the help says what leaving it unset means. (Through
/// `mut_args`, which keeps the flags in place, where `mut_arg` would move it last.)
fn brokers_of_the_server(arg: clap::Arg) -> clap::Arg {
    if arg.get_id() != "kafka_brokers" {
        return arg;
    }
    let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
    arg.help(format!("{help}. Unset: no Kafka ingestion"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: KafkaArgs,
    }

    #[test]
    fn defaults_match_default_impl() {
        let cli = Cli::try_parse_from(["thunder"]).expect("parses");
        let d = KafkaArgs::default();
        assert_eq!(cli.kafka.client.kafka_brokers, d.client.kafka_brokers);
        assert_eq!(cli.kafka.client.kafka_topic, d.client.kafka_topic);
        assert_eq!(cli.kafka.kafka_batch_size, d.kafka_batch_size);
        assert_eq!(cli.kafka.kafka_num_threads, d.kafka_num_threads);
        assert_eq!(cli.kafka.kafka_fetch_timeout_ms, d.kafka_fetch_timeout_ms);
        assert_eq!(
            cli.kafka.kafka_live_batch_permits,
            d.kafka_live_batch_permits
        );
        assert_eq!(
            cli.kafka.lag_monitor_interval_secs,
            d.lag_monitor_interval_secs
        );
        assert!(!cli.kafka.start_from_time);
        assert_eq!(
            cli.kafka.kafka_max_response_bytes,
            d.kafka_max_response_bytes
        );
        assert_eq!(
            cli.kafka.kafka_catch_up_buffer_bytes,
            d.kafka_catch_up_buffer_bytes
        );
    }

    #[test]
    fn properties_parse_and_override() {
        let cli = Cli::try_parse_from([
            "thunder",
            "--kafka-brokers",
            "127.0.0.1:9092",
            "-X",
            "fetch.wait.max.ms=50",
            "--kafka-property",
            "security.protocol=ssl",
        ])
        .expect("parses");
        let config = cli.kafka.consumer_config("g").expect("config");
        assert_eq!(config.get("fetch.wait.max.ms"), Some("50"));
        assert_eq!(config.get("security.protocol"), Some("ssl"));
        assert_eq!(config.get("group.id"), Some("g"));
        assert_eq!(config.get("fetch.max.bytes"), Some("1048576"));
        assert_eq!(config.get("receive.message.max.bytes"), Some("2162688"));
    }

    /// The consumer's arguments print the connection flags through their redacting `Debug`.
    #[test]
    fn debug_hides_the_connection_secrets() {
        let mut args = KafkaArgs::default();
        args.client.kafka_sasl_password = Some("hunter2".into());
        let shown = format!("{args:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("<redacted>"),
            "{shown}"
        );
    }

    /// The producer's connection flags are the server's, word for word: same names, variables,
    /// defaults and help; and the server's consumer-only flags are not among them.
    #[test]
    fn client_flags_are_the_server_flags_of_the_same_name() {
        #[derive(Parser)]
        struct ClientCli {
            #[command(flatten)]
            kafka: KafkaClientArgs,
        }
        use clap::CommandFactory;
        let server = Cli::command();
        let client = ClientCli::command();
        let describe = |arg: &clap::Arg| {
            format!(
                "{:?} {:?} {:?} {:?} {:?}",
                arg.get_long(),
                arg.get_short(),
                arg.get_env(),
                arg.get_default_values(),
                arg.get_help().map(ToString::to_string),
            )
        };
        let mut shared = 0;
        for arg in client.get_arguments() {
            let twin = server
                .get_arguments()
                .find(|a| a.get_id() == arg.get_id())
                .unwrap_or_else(|| panic!("{} is not a server flag", arg.get_id()));
            let mut twin_text = describe(twin);
            let text = describe(arg);
            // The server's broker help adds what happens without it.
            twin_text = twin_text.replace(". Unset: no Kafka ingestion", "");
            assert_eq!(text, twin_text);
            shared += 1;
        }
        assert_eq!(shared, 11);
        for consumer_only in [
            "kafka_stall_timeout_secs",
            "kafka_live_batch_permits",
            "lag_monitor_interval_secs",
            "kafka_group_id",
            "kafka_num_threads",
            "kafka_request_timeout_ms",
        ] {
            assert!(
                client.get_arguments().all(|a| a.get_id() != consumer_only),
                "{consumer_only}"
            );
        }
        let parsed = ClientCli::try_parse_from([
            "p",
            "--kafka-brokers",
            "127.0.0.1:9092",
            "--kafka-topic",
            "t",
            "-X",
            "linger.ms=1",
        ])
        .expect("parses");
        assert_eq!(parsed.kafka.kafka_topic, "t");
        assert_eq!(
            parsed.kafka.kafka_properties,
            [("linger.ms".into(), "1".into())]
        );
    }
}
