//! The Kafka side of the tests: a real Kafka-protocol broker (noida-db) on a free 127.0.0.1
//! port, stopped on drop; topic creation; producing; waiting on ingestion; the store compared
//! with a model fed the same events; a raw record batch no client library would write.
//! [`proxy`] puts a TLS and SASL endpoint in front of the broker.
//!
//! The broker binary comes from `THUNDER_TEST_KAFKA_BIN` (set by
//! `eval "$(scripts/kafka-broker.sh env)"`); without it the tests run
//! `scripts/kafka-broker.sh install`, and fail with a clear message if that does not work.

pub mod proxy;

use std::collections::HashSet;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use thunder_engine::PostEvent;
use thunder_engine::{Clock, FeedQuery, ManualClock, PostStore, StoreConfig};
use thunder_events::kafka::{EventProducer, KafkaClientArgs};
use thunder_server::kafka::{CatchUpState, KafkaArgs, KafkaIngest};
use thunder_testkit::model::ModelStore;
use thunder_workload::SynthConfig;

/// Generous: the machine may be small and busy with other builds.
pub const TIMEOUT: Duration = Duration::from_secs(180);

/// The broker binary: `THUNDER_TEST_KAFKA_BIN`, else installed by `scripts/kafka-broker.sh`.
pub fn broker_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("THUNDER_TEST_KAFKA_BIN") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "THUNDER_TEST_KAFKA_BIN={} is not a file",
            bin.display()
        );
        return bin;
    }
    let script = crate::repo::root().join("scripts/kafka-broker.sh");
    let output = Command::new("bash")
        .arg(&script)
        .arg("install")
        .stderr(Stdio::inherit())
        .output();
    match output {
        Ok(out) if out.status.success() => {
            let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            assert!(
                bin.is_file(),
                "{} install printed `{}`, not a file",
                script.display(),
                bin.display()
            );
            bin
        }
        other => panic!(
            "the Kafka tests need a real broker and found none: set THUNDER_TEST_KAFKA_BIN \
             (eval \"$(scripts/kafka-broker.sh env)\") or make `scripts/kafka-broker.sh install` \
             work (python3 + PyPI access); got {other:?}"
        ),
    }
}

/// A broker process on 127.0.0.1 with its own data directory; stopped (and the data
/// removed) on drop.
pub struct Broker {
    bin: PathBuf,
    port: u16,
    data: tempfile::TempDir,
    child: Option<Child>,
}

impl Broker {
    /// Starts a broker on a free port.
    pub fn start() -> Self {
        let data = tempfile::Builder::new()
            .prefix("thunder-kafka-test")
            .tempdir()
            .expect("temp dir");
        let mut broker = Self {
            bin: broker_binary(),
            port: crate::process::free_addr().port(),
            data,
            child: None,
        };
        broker.spawn();
        broker
    }

    /// `host:port` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data.path().join("broker.log"))
            .expect("broker log");
        let child = Command::new(&self.bin)
            .args([
                "start",
                "--only",
                "kafka",
                "--host",
                "127.0.0.1",
                "--kafka-port",
            ])
            .arg(self.port.to_string())
            .arg("--data-dir")
            .arg(self.data.path().join("data"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("spawn the broker");
        self.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("broker exited with {status}; log:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "broker did not listen on {addr}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("broker.log")).unwrap_or_default()
    }

    /// Stops the broker (SIGTERM, then SIGKILL after 10 s), keeping its data directory.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the broker (SIGKILL: it saves nothing more), keeping its data directory.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The directory the broker persists its topics in (noida-db: `kafka.json`).
    pub fn data_dir(&self) -> PathBuf {
        self.data.path().join("data")
    }

    /// Starts a stopped broker again on the same port with the same data directory.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "broker still running");
        self.spawn();
    }

    /// `(low, high)` watermarks of every partition of `topic`.
    pub fn watermarks(&self, topic: &str, partitions: i32) -> Vec<(i64, i64)> {
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .expect("client");
        (0..partitions)
            .map(|p| {
                client
                    .fetch_watermarks(topic, p, Duration::from_secs(30))
                    .expect("watermarks")
            })
            .collect()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// Creates `topic` with `partitions` partitions.
pub fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = block_on(admin.create_topics(
        &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
        &options,
    ))
    .expect("create_topics request");
    for result in results {
        result.unwrap_or_else(|(name, code)| panic!("creating topic {name}: {code:?}"));
    }
}

/// Connection flags for `topic` on `bootstrap`, ingestion defaults otherwise.
pub fn kafka_args(bootstrap: &str, topic: &str) -> KafkaArgs {
    KafkaArgs {
        client: KafkaClientArgs {
            kafka_brokers: Some(bootstrap.to_owned()),
            kafka_topic: topic.to_owned(),
            ..KafkaClientArgs::default()
        },
        kafka_group_id: "thunder-test".to_owned(),
        kafka_request_timeout_ms: 5_000,
        lag_monitor_interval_secs: 1,
        ..KafkaArgs::default()
    }
}

/// A producer to `topic` on `bootstrap`.
pub fn producer(bootstrap: &str, topic: &str) -> EventProducer {
    EventProducer::new(&kafka_args(bootstrap, topic).client).expect("producer")
}

/// Unix seconds now.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The synthetic feed-2d backlog at `scale`, ending at `now_secs`, without the deletes whose
/// outcome depends on the order across partitions.
///
/// Records of different partitions reach the store in an unspecified order. The store's
/// answers do not depend on it, with one exception: a repost is a video if its source is a
/// stored video *when the repost is inserted*, so a delete of a repost's source racing the
/// repost may go either way. Those deletes are left out, so the model's answer is the only one.
pub fn order_free_backlog(scale: u32, now_secs: i64) -> (SynthConfig, Vec<PostEvent>) {
    let config = SynthConfig::feed_2d(scale, now_secs);
    let sources: HashSet<i64> = config
        .backlog()
        .filter_map(|e| match e {
            PostEvent::Create(p) if p.is_retweet => p.source_post_id,
            _ => None,
        })
        .collect();
    let backlog = config
        .backlog()
        .filter(|e| !matches!(e, PostEvent::Delete(d) if sources.contains(&d.post_id)))
        .collect();
    (config, backlog)
}

/// Viewers to compare answers for: `count` synthetic viewers plus one per 20 authors of
/// `events`, so every author is read at least once.
pub fn viewers_for(
    config: &SynthConfig,
    count: usize,
    events: &[PostEvent],
) -> Vec<(i64, Vec<i64>)> {
    let mut viewers: Vec<(i64, Vec<i64>)> = config
        .viewers(count)
        .into_iter()
        .map(|v| (v.user_id, v.following))
        .collect();
    let mut authors: Vec<i64> = events
        .iter()
        .filter_map(|e| {
            if let PostEvent::Create(p) = e {
                Some(p.author_id)
            } else {
                None
            }
        })
        .collect();
    authors.sort_unstable();
    authors.dedup();
    viewers.extend(authors.chunks(20).map(|chunk| (0, chunk.to_vec())));
    viewers
}

/// Sends `event` (creates keyed by author, deletes by post id).
pub fn send(producer: &EventProducer, event: &PostEvent) {
    match event {
        PostEvent::Create(post) => producer.send_create(post),
        PostEvent::Delete(delete) => producer.send_delete(delete, None),
    }
    .expect("queue record");
}

/// Flushes and checks that every record was delivered.
pub fn flush(producer: &EventProducer, expected_delivered: u64) {
    producer.flush(Duration::from_secs(60)).expect("flush");
    let stats = producer.stats();
    assert_eq!(stats.failed, 0, "records not delivered");
    assert_eq!(stats.delivered, expected_delivered, "delivered records");
}

/// Polls `done` every 20 ms until it holds; panics with `what` and `state()` after `TIMEOUT`.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool, state: impl Fn() -> String) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; {}",
            state()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `CaughtUp`; panics on `Failed` or timeout.
pub fn wait_caught_up(ingest: &KafkaIngest) -> Duration {
    let mut took = Duration::ZERO;
    wait_until(
        "catch-up",
        || match &*ingest.caught_up.borrow() {
            CatchUpState::CaughtUp { took: t } => {
                took = *t;
                true
            }
            CatchUpState::Failed(reason) => panic!("ingestion failed: {reason}"),
            CatchUpState::CatchingUp => false,
        },
        || format!("{ingest:?}"),
    );
    took
}

/// Waits for `Failed` and returns its reason; panics on `CaughtUp` (`what` says what should
/// have prevented it) or timeout.
pub fn wait_failed(ingest: &KafkaIngest, what: &str) -> String {
    let deadline = Instant::now() + TIMEOUT;
    let reason = loop {
        match ingest.caught_up.borrow().clone() {
            CatchUpState::Failed(reason) => break reason,
            CatchUpState::CaughtUp { .. } => panic!("caught up {what}"),
            CatchUpState::CatchingUp => {}
        }
        assert!(
            Instant::now() < deadline,
            "start-up neither failed nor finished"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("start-up failed as expected: {reason}");
    reason
}

/// Waits until ingestion has applied `records` records.
pub fn wait_applied(ingest: &KafkaIngest, records: u64) {
    wait_until(
        "every record applied",
        || ingest.stats().records >= records,
        || format!("{ingest:?}"),
    );
    assert_eq!(
        ingest.stats().records,
        records,
        "more records applied than produced"
    );
}

/// A store and a model store sharing one fixed clock at `now_secs`.
pub fn store_and_model(now_secs: i64) -> (Arc<PostStore>, ModelStore) {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(now_secs));
    let config = || StoreConfig {
        clock: Arc::clone(&clock),
        ..StoreConfig::default()
    };
    (
        Arc::new(PostStore::with_config(config())),
        ModelStore::with_config(config()),
    )
}

/// Applies `events` to the model the way ingestion does (create events through the same
/// decode path, so `is_reply` is derived the same way).
pub fn apply_to_model(model: &mut ModelStore, events: &[PostEvent]) {
    for event in events {
        match event {
            PostEvent::Create(post) => {
                let create = thunder_events::create_event(post);
                let bytes = prost::Message::encode_to_vec(&create);
                match thunder_events::decode_event(Some(&bytes)).expect("round trip") {
                    thunder_engine::PostEvent::Create(post) => {
                        model.insert_posts(&[post]);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            PostEvent::Delete(delete) => {
                model.mark_as_deleted(&[*delete]);
            }
        }
    }
}

/// Asserts that the store answers every feed and video query of `viewers` as the model does.
pub fn assert_same_answers(store: &PostStore, model: &ModelStore, viewers: &[(i64, Vec<i64>)]) {
    let mut compared = 0;
    for (viewer, following) in viewers {
        let query = FeedQuery::new(*viewer, following);
        let got = store.get_all_posts_by_users(&query);
        let want = model.get_all_posts_by_users(&query);
        if let Err(diff) =
            thunder_testkit::model::answers_agree(&got.posts, &want.posts, query.max_results)
        {
            panic!("feed of viewer {viewer} differs from the model: {diff}");
        }
        let got = store.get_videos_by_users(&query);
        let want = model.get_videos_by_users(&query);
        if let Err(diff) =
            thunder_testkit::model::answers_agree(&got.posts, &want.posts, query.max_results)
        {
            panic!("videos of viewer {viewer} differ from the model: {diff}");
        }
        compared += want.posts.len();
    }
    assert!(compared > 0, "the comparison saw no posts at all");
}

/// Appends one raw Kafka record batch (magic 2) with the given compression `codec` bits and
/// `body` as its (compressed) records section, bypassing any client library, so a test can put
/// a batch on a partition that no consumer can decode (an unknown codec, a corrupt body).
/// Panics unless the broker acknowledges it.
pub fn produce_raw_batch(bootstrap: &str, topic: &str, partition: i32, codec: i16, body: &[u8]) {
    use std::io::{Read, Write};
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    // From `attributes` to the end: the part the batch CRC covers.
    let mut tail = Vec::new();
    tail.extend_from_slice(&codec.to_be_bytes()); // attributes
    tail.extend_from_slice(&0i32.to_be_bytes()); // last offset delta: one record
    tail.extend_from_slice(&now_ms.to_be_bytes()); // base timestamp
    tail.extend_from_slice(&now_ms.to_be_bytes()); // max timestamp
    tail.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    tail.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    tail.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    tail.extend_from_slice(&1i32.to_be_bytes()); // records
    tail.extend_from_slice(body);
    let mut batch = Vec::new();
    batch.extend_from_slice(&0i64.to_be_bytes()); // base offset (the broker assigns it)
    batch.extend_from_slice(&((4 + 1 + 4 + tail.len()) as i32).to_be_bytes()); // batch length
    batch.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    batch.push(2); // magic
    batch.extend_from_slice(&crc32c::crc32c(&tail).to_be_bytes());
    batch.extend_from_slice(&tail);

    // ProduceRequest v3, request header v1.
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&(s.len() as i16).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    let mut request = Vec::new();
    request.extend_from_slice(&0i16.to_be_bytes()); // api key: Produce
    request.extend_from_slice(&3i16.to_be_bytes()); // api version
    request.extend_from_slice(&7i32.to_be_bytes()); // correlation id
    string(&mut request, "thunder-test-raw");
    request.extend_from_slice(&(-1i16).to_be_bytes()); // transactional id: null
    request.extend_from_slice(&1i16.to_be_bytes()); // acks
    request.extend_from_slice(&10_000i32.to_be_bytes()); // timeout
    request.extend_from_slice(&1i32.to_be_bytes()); // topics
    string(&mut request, topic);
    request.extend_from_slice(&1i32.to_be_bytes()); // partitions
    request.extend_from_slice(&partition.to_be_bytes());
    request.extend_from_slice(&(batch.len() as i32).to_be_bytes());
    request.extend_from_slice(&batch);

    let mut stream = TcpStream::connect(bootstrap).expect("connect to the broker");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    stream
        .write_all(&(request.len() as i32).to_be_bytes())
        .expect("send");
    stream.write_all(&request).expect("send");
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).expect("response size");
    let mut response = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
    stream.read_exact(&mut response).expect("response");
    // correlation id, topics (1), name, partitions (1), index, error code.
    let name_len = i16::from_be_bytes([response[8], response[9]]) as usize;
    let at = 10 + name_len + 4 + 4;
    let error = i16::from_be_bytes([response[at], response[at + 1]]);
    assert_eq!(
        error, 0,
        "the broker refused the raw batch (error code {error})"
    );
}
