//! `thunder-cli produce` against a real broker: JSON lines and the synthetic source reach the
//! topic, keyed by author, and ingestion applies them.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;
use thunder_testbed::process::binary;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use thunder_engine::FeedQuery;
use thunder_server::kafka;
use thunder_testbed::kafka::*;

fn produce(broker: &Broker, topic: &str, extra: &[&str], stdin: &str) {
    let mut child = Command::new(binary("thunder-cli"))
        .args([
            "produce",
            "--kafka-brokers",
            &broker.bootstrap(),
            "--kafka-topic",
            topic,
        ])
        .args(extra)
        .stdin(Stdio::piped())
        .spawn()
        .expect("run thunder-cli produce");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let status = child.wait().expect("wait for thunder-cli");
    assert!(status.success(), "thunder-cli produce failed: {status}");
}

#[test]
fn json_lines_are_produced_keyed_by_author_and_ingested() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "innetwork_post_cli";
    create_topic(&broker.bootstrap(), topic, 3);
    // The proto3 JSON mapping as grpcurl prints an `InNetworkEvent`, and the older wrappers.
    let lines = format!(
        "{{\"create\":{{\"post_id\":1,\"author_id\":42,\"created_at\":{a}}}}}\n\
         {{\"tweetCreateEvent\":{{\"postId\":\"2\",\"authorId\":\"42\",\"createdAt\":\"{b}\",\"hasVideo\":true}}}}\n\
         \n\
         {{\"create\":{{\"post_id\":3,\"author_id\":43,\"created_at\":{b},\"in_reply_to_post_id\":1}}}}\n\
         {{\"tweetDeleteEvent\":{{\"postId\":\"1\",\"deletedAt\":\"{now}\",\"authorId\":\"42\"}}}}\n",
        a = now - 20,
        b = now - 10,
    );
    produce(&broker, topic, &[], &lines);

    // Every record of author 42 sits in one partition, in order, keyed by the author id.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", "check")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..3 {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .expect("assignment");
    }
    consumer.assign(&assignment).expect("assign");
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + TIMEOUT;
    while seen.len() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "records missing: {seen:?}"
        );
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = message.expect("message");
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            seen.push((key, message.partition(), message.offset()));
        }
    }
    let of_42: Vec<_> = seen.iter().filter(|(key, _, _)| key == "42").collect();
    assert_eq!(of_42.len(), 3, "{seen:?}");
    assert!(
        of_42.iter().all(|(_, p, _)| *p == of_42[0].1),
        "author 42 split over partitions: {seen:?}"
    );

    let (store, _) = store_and_model(now);
    let ingest =
        kafka::start(&kafka_args(&broker.bootstrap(), topic), store.clone()).expect("start");
    wait_caught_up(&ingest);
    wait_applied(&ingest, 4);
    let answer = store.get_all_posts_by_users(&FeedQuery::new(0, &[42, 43]));
    let ids: Vec<i64> = answer.posts.iter().map(|p| p.post_id).collect();
    // Post 1 is deleted; post 3 is a reply (derived from its parent) whose parent is gone.
    assert_eq!(ids, vec![2], "{answer:?}");
    ingest.shutdown_blocking();
}

#[test]
fn synthetic_live_events_are_produced_at_a_rate() {
    let broker = Broker::start();
    let topic = "innetwork_post_synth";
    create_topic(&broker.bootstrap(), topic, 2);
    let started = std::time::Instant::now();
    produce(
        &broker,
        topic,
        &["--synth", "--live-events", "300", "--rate", "1000"],
        "",
    );
    // 300 events at 1000/s take at least 0.3 s.
    assert!(started.elapsed() >= Duration::from_millis(290));
    let (store, _) = store_and_model(now_secs());
    let ingest = kafka::start(&kafka_args(&broker.bootstrap(), topic), store).expect("start");
    wait_caught_up(&ingest);
    wait_applied(&ingest, 300);
    assert_eq!(ingest.stats().failed, 0);
    ingest.shutdown_blocking();
}

/// A broker that is not there: produce gives up within its request timeout, non-zero, saying
/// why, instead of waiting for the records' delivery timeout.
#[test]
fn an_unreachable_broker_fails_fast_with_the_reason() {
    let started = std::time::Instant::now();
    let out = Command::new(binary("thunder-cli"))
        .args([
            "produce",
            "--kafka-brokers",
            "127.0.0.1:1",
            "--synth",
            "--live-events",
            "1",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run thunder-cli produce");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit 0:\n{stderr}");
    assert!(took < Duration::from_secs(15), "took {took:?}:\n{stderr}");
    assert!(
        stderr.contains("no Kafka broker answered within 10000 ms")
            && stderr.contains("Connection refused"),
        "{stderr}"
    );
}

/// `--create-topic N` still creates N partitions now that produce first asks the brokers for
/// metadata (a request for the missing topic itself would auto-create it with one).
#[test]
fn create_topic_makes_the_partitions_asked_for() {
    let broker = Broker::start();
    let topic = "innetwork_post_created";
    produce(
        &broker,
        topic,
        &["--create-topic", "3", "--synth", "--live-events", "5"],
        "",
    );
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .expect("client");
    let metadata = client
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("metadata");
    let partitions = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len());
    assert_eq!(partitions, 3);
}
