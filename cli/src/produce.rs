//! `thunder-cli produce`: feed a topic with create/delete events, from JSON lines on stdin or
//! from the synthetic feed-2d workload.
//!
//! JSON lines, one event each: an `InNetworkEvent` in the proto3 JSON mapping, as grpcurl
//! prints it (the generated types' serde; the original field names and plain numbers are
//! accepted too), or the shorter `create` / `delete` wrappers of earlier versions around the
//! same events:
//! ```text
//! {"tweetCreateEvent": {"postId": "1", "authorId": "7", "createdAt": "1700000000"}}
//! {"tweetDeleteEvent": {"postId": "1", "deletedAt": "1700000100"}}
//! {"create": {"post_id": 1, "author_id": 7, "is_reply": false}}
//! {"delete": {"post_id": 1, "author_id": 7}}
//! ```
//! Absent fields take their proto3 defaults (`false`, absent, 0), except that a `createdAt` or
//! `deletedAt` of 0 (or absent) means now. A delete may carry `authorId` (or `author_id`),
//! used only as the record key. A line is refused, with its number and the reason, when it is
//! not such an event or when the server would drop it for an id the contract cannot express
//! (a negative id, a post or author id of 0).

use std::io::BufRead;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use prost::Message as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use thunder_engine::PostEvent;
use thunder_proto::InNetworkEvent;
use thunder_proto::in_network_event::EventVariant;
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

/// The event of one JSON line and its record key (a delete's `authorId`), checked as the
/// server's ingestion checks it (see the module docs for the forms a line takes).
fn parse_line(line: &str, now_secs: i64) -> anyhow::Result<(PostEvent, Option<i64>)> {
    let mut value: serde_json::Value = serde_json::from_str(line).context("not JSON")?;
    let mut key = None;
    if let Some(object) = value.as_object_mut() {
        // The earlier versions' wrappers name the same events.
        for (short, field) in [
            ("create", "tweetCreateEvent"),
            ("delete", "tweetDeleteEvent"),
        ] {
            if let Some(event) = object.remove(short) {
                object.insert(field.to_owned(), event);
            }
        }
        let field = ["tweetDeleteEvent", "tweet_delete_event"]
            .into_iter()
            .find(|field| object.contains_key(*field));
        if let Some(delete) = field.and_then(|f| object.get_mut(f)?.as_object_mut()) {
            let author = ["authorId", "author_id"]
                .iter()
                .find_map(|field| delete.remove(*field));
            key = author.map(|id| record_key(&id)).transpose()?;
        }
    }
    let mut event: InNetworkEvent = serde_json::from_value(value)
        .context("not an InNetworkEvent (tweetCreateEvent or tweetDeleteEvent)")?;
    match &mut event.event_variant {
        Some(EventVariant::TweetCreateEvent(create)) if create.created_at == 0 => {
            create.created_at = now_secs;
        }
        Some(EventVariant::TweetDeleteEvent(delete)) if delete.deleted_at == 0 => {
            delete.deleted_at = now_secs;
        }
        _ => {}
    }
    // The server's own decode path: what it would refuse, refused here, with the reason.
    let event = thunder_events::decode_event(Some(&event.encode_to_vec()))?;
    Ok((event, key))
}

/// A delete's record key: an author id as a JSON number or, as the proto3 JSON mapping writes
/// 64-bit integers, a string.
fn record_key(value: &serde_json::Value) -> anyhow::Result<i64> {
    let key = match value {
        serde_json::Value::String(text) => text.parse().ok(),
        other => other.as_i64(),
    };
    key.ok_or_else(|| anyhow::anyhow!("authorId {value} is not a 64-bit integer"))
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
            let (event, key) = parse_line(&line, now_secs())
                .with_context(|| format!("line {}: not a create/delete event", number + 1))?;
            pacer.wait();
            match event {
                PostEvent::Create(post) => {
                    producer.send_create(&post)?;
                    sent.creates += 1;
                }
                PostEvent::Delete(delete) => {
                    producer.send_delete(&delete, key)?;
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
    use thunder_engine::{DeleteEvent, LightPost};

    #[test]
    fn json_lines_parse_in_the_proto3_mapping_and_the_older_wrappers() {
        let now = 1_700_000_500;
        let (create, key) = parse_line(
            r#"{"tweetCreateEvent":{"postId":"1","authorId":"2","createdAt":"3","hasVideo":true}}"#,
            now,
        )
        .expect("create parses");
        let mut video = LightPost::original(1, 2, 3);
        video.has_video = true;
        assert_eq!((create, key), (PostEvent::Create(video), None));
        // The earlier wrapper, original names, numbers; createdAt absent: now.
        let (create, _) = parse_line(
            r#"{"create":{"post_id":1,"author_id":2,"in_reply_to_user_id":9}}"#,
            now,
        )
        .expect("create parses");
        let PostEvent::Create(reply) = create else {
            panic!("a create: {create:?}");
        };
        assert_eq!(reply.created_at, now);
        assert!(reply.is_reply, "the reply rule of ingestion applies");
        let (delete, key) =
            parse_line(r#"{"delete":{"post_id":1,"author_id":"7"}}"#, now).expect("delete parses");
        assert_eq!(
            (delete, key),
            (
                PostEvent::Delete(DeleteEvent {
                    post_id: 1,
                    deleted_at: now
                }),
                Some(7)
            )
        );
    }

    #[test]
    fn bad_lines_are_refused_with_the_reason() {
        let refused = |line: &str| {
            format!(
                "{:#}",
                parse_line(line, 1).expect_err("refused").context("line")
            )
        };
        assert!(refused(r#"{"update":{"postId":"1"}}"#).contains("not an InNetworkEvent"));
        assert!(refused(r#"{"tweetCreateEvent":{"postId":"1","typo":2}}"#).contains("typo"));
        assert!(refused(r#"{"tweetCreateEvent":{"authorId":"2"}}"#).contains("post_id is 0"));
        assert!(
            refused(r#"{"tweetCreateEvent":{"postId":"1","authorId":"-2"}}"#).contains("negative")
        );
        assert!(refused(r#"{"delete":{"postId":"1","authorId":"x"}}"#).contains("authorId"));
        assert!(refused("not json").contains("not JSON"));
    }
}
