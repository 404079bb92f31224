//! `thunder-cli produce`: feed a topic with create/delete events, from JSON lines on stdin or
//! from the synthetic feed-2d workload.
//!
//! JSON lines, one event each:
//! ```text
//! {"create": {"post_id": 1, "author_id": 7, "created_at": 1700000000, "is_reply": false}}
//! {"delete": {"post_id": 1, "deleted_at": 1700000100}}
//! ```
//! Absent fields of a create default to `false` / `null`; `created_at` defaults to now,
//! `deleted_at` too. A delete may carry `"author_id"`, used only as the record key.

use std::io::BufRead;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use serde::Deserialize;
use thunder_engine::PostEvent;
use thunder_engine::{DeleteEvent, LightPost};
use thunder_workload::SynthConfig;

use thunder_events::kafka::{EventProducer, KafkaClientArgs};

/// Arguments of `thunder-cli produce`.
#[derive(clap::Args, Clone, Debug)]
pub struct ProduceArgs {
    /// Connection (`--kafka-brokers`, `--kafka-topic`, security, `-X`); the server's consumer
    /// settings do not apply to a producer.
    #[command(flatten)]
    pub kafka: KafkaClientArgs,

    /// Generate the synthetic feed-2d workload instead of reading JSON lines from stdin.
    #[arg(long)]
    pub synth: bool,

    /// With `--synth`: the workload divided by this (1 = 1M authors and 20M posts over two days).
    #[arg(long, default_value_t = 1000)]
    pub synth_scale: u32,

    /// With `--synth`: the generator's seed (default: the benchmark's).
    #[arg(long)]
    pub synth_seed: Option<u64>,

    /// With `--synth`: first send the whole backlog (the two-day window ending now).
    #[arg(long)]
    pub backlog: bool,

    /// With `--synth`: live events to send after the backlog, stamped with the current time.
    /// Default: none after `--backlog`, otherwise until interrupted.
    #[arg(long)]
    pub live_events: Option<u64>,

    /// First create the topic with this many partitions (replication 1) unless it exists.
    /// Brokers may auto-create a missing topic with a single partition; create it explicitly.
    #[arg(long, value_name = "PARTITIONS")]
    pub create_topic: Option<i32>,

    /// Events per second (0: as fast as the producer takes them).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,

    /// The brokers must answer a first metadata request within this long, in ms, or produce
    /// stops with the reason (a connection, TLS handshake or SASL login refused).
    #[arg(
        long,
        env = "THUNDER_KAFKA_REQUEST_TIMEOUT_MS",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub kafka_request_timeout_ms: u64,
}

/// One JSON input line.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum JsonEvent {
    Create(JsonCreate),
    Delete(JsonDelete),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonCreate {
    post_id: i64,
    author_id: i64,
    created_at: Option<i64>,
    in_reply_to_post_id: Option<i64>,
    in_reply_to_user_id: Option<i64>,
    #[serde(default)]
    is_retweet: bool,
    #[serde(default)]
    is_reply: bool,
    source_post_id: Option<i64>,
    source_user_id: Option<i64>,
    #[serde(default)]
    has_video: bool,
    conversation_id: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDelete {
    post_id: i64,
    deleted_at: Option<i64>,
    author_id: Option<i64>,
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Spaces events `1 / rate` seconds apart (no pacing when `rate <= 0`).
struct Pacer {
    interval: Option<Duration>,
    next: Instant,
}

impl Pacer {
    fn new(rate: f64) -> Self {
        let interval =
            (rate > 0.0 && rate.is_finite()).then(|| Duration::from_secs_f64(1.0 / rate));
        Self {
            interval,
            next: Instant::now(),
        }
    }

    fn wait(&mut self) {
        if let Some(interval) = self.interval {
            let now = Instant::now();
            if self.next > now {
                std::thread::sleep(self.next - now);
            }
            self.next += interval;
        }
    }
}

/// Counts of what was sent, for the summary line.
#[derive(Debug, Default)]
struct Sent {
    creates: u64,
    deletes: u64,
}

impl Sent {
    fn send(&mut self, producer: &EventProducer, event: &PostEvent) -> anyhow::Result<()> {
        match event {
            PostEvent::Create(post) => {
                producer.send_create(post)?;
                self.creates += 1;
            }
            PostEvent::Delete(delete) => {
                producer.send_delete(delete, None)?;
                self.deletes += 1;
            }
        }
        Ok(())
    }
}

/// Creates `args.kafka_topic` with `partitions` partitions; an existing topic is left as is.
fn create_topic(args: &KafkaClientArgs, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = args
        .client_config()?
        .create()
        .context("creating the Kafka admin client")?;
    let topic = NewTopic::new(&args.kafka_topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let request = admin.create_topics([&topic], &options);
    // The admin futures are completed by librdkafka's own thread: any executor drives them.
    let results = match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle.block_on(request),
        Err(_) => tokio::runtime::Builder::new_current_thread()
            .build()?
            .block_on(request),
    }
    .context("creating the topic")?;
    for result in results {
        match result {
            Ok(name) => eprintln!("created topic {name} with {partitions} partitions"),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                eprintln!("topic {name} exists; left as is");
            }
            Err((name, code)) => anyhow::bail!("creating topic {name}: {code}"),
        }
    }
    Ok(())
}

/// Runs the producer on a blocking thread (it paces with sleeps and flushes synchronously).
pub async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || produce(&args)).await?
}

/// Runs `thunder-cli produce` on the calling thread.
fn produce(args: &ProduceArgs) -> anyhow::Result<()> {
    let producer = EventProducer::new(&args.kafka).context("creating the Kafka producer")?;
    // Fail now, with the reason, rather than after the records' delivery timeout.
    producer
        .check_connection(Duration::from_millis(args.kafka_request_timeout_ms))
        .context("connecting to Kafka")?;
    if let Some(partitions) = args.create_topic {
        create_topic(&args.kafka, partitions)?;
    }
    let started = Instant::now();
    let mut pacer = Pacer::new(args.rate);
    let mut sent = Sent::default();
    if args.synth {
        let mut config = SynthConfig::feed_2d(args.synth_scale, now_secs());
        if let Some(seed) = args.synth_seed {
            config = config.with_seed(seed);
        }
        if args.backlog {
            for event in config.backlog() {
                pacer.wait();
                sent.send(&producer, &event)?;
            }
        }
        let live = args
            .live_events
            .unwrap_or(if args.backlog { 0 } else { u64::MAX });
        let mut source = config.live();
        for _ in 0..live {
            pacer.wait();
            let event = source.next_event(now_secs());
            sent.send(&producer, &event)?;
        }
    } else {
        let stdin = std::io::stdin();
        for (number, line) in stdin.lock().lines().enumerate() {
            let line = line.context("reading stdin")?;
            if line.trim().is_empty() {
                continue;
            }
            let event: JsonEvent = serde_json::from_str(&line)
                .with_context(|| format!("line {}: not a create/delete event", number + 1))?;
            pacer.wait();
            match event {
                JsonEvent::Create(c) => {
                    let post = LightPost {
                        post_id: c.post_id,
                        author_id: c.author_id,
                        created_at: c.created_at.unwrap_or_else(now_secs),
                        in_reply_to_post_id: c.in_reply_to_post_id,
                        in_reply_to_user_id: c.in_reply_to_user_id,
                        is_retweet: c.is_retweet,
                        is_reply: c.is_reply,
                        source_post_id: c.source_post_id,
                        source_user_id: c.source_user_id,
                        has_video: c.has_video,
                        conversation_id: c.conversation_id,
                    };
                    producer.send_create(&post)?;
                    sent.creates += 1;
                }
                JsonEvent::Delete(d) => {
                    let delete = DeleteEvent {
                        post_id: d.post_id,
                        deleted_at: d.deleted_at.unwrap_or_else(now_secs),
                    };
                    producer.send_delete(&delete, d.author_id)?;
                    sent.deletes += 1;
                }
            }
        }
    }
    producer
        .flush(Duration::from_secs(60))
        .context("flushing the Kafka producer")?;
    let stats = producer.stats();
    let secs = started.elapsed().as_secs_f64();
    let total = sent.creates + sent.deletes;
    eprintln!(
        "produced {total} events ({} creates, {} deletes) to {} in {secs:.2}s ({:.0} events/s); delivered {}, failed {}",
        sent.creates,
        sent.deletes,
        producer.topic(),
        total as f64 / secs.max(1e-9),
        stats.delivered,
        stats.failed,
    );
    anyhow::ensure!(
        stats.failed == 0,
        "{} events were not delivered",
        stats.failed
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_parse() {
        let create: JsonEvent = serde_json::from_str(
            r#"{"create":{"post_id":1,"author_id":2,"created_at":3,"has_video":true}}"#,
        )
        .expect("create parses");
        assert!(matches!(
            create,
            JsonEvent::Create(JsonCreate {
                post_id: 1,
                has_video: true,
                ..
            })
        ));
        let delete: JsonEvent =
            serde_json::from_str(r#"{"delete":{"post_id":1}}"#).expect("delete parses");
        assert!(matches!(
            delete,
            JsonEvent::Delete(JsonDelete {
                post_id: 1,
                deleted_at: None,
                ..
            })
        ));
        assert!(serde_json::from_str::<JsonEvent>(r#"{"update":{"post_id":1}}"#).is_err());
    }
}
