//! Fetch responses larger than the consumer accepts, against a real broker.
//!
//! Some brokers (the local test broker among them) ignore the fetch request's `max_bytes` and
//! `partition_max_bytes` and answer with everything from the requested offset on. When such a
//! response exceeds librdkafka's `receive.message.max.bytes`, librdkafka drops the connection
//! and reports `Local: Bad message format`, the code of a corrupt batch; ingestion used to
//! stop start-up there. Once such an answer was seen, partitions still catching up are read
//! within the catch-up window, so a broker that sends every partition's whole backlog at once
//! cannot make a cold replay hold the topic several times over. The condition is made with
//! small limits (a few hundred kB against a backlog of a few MB) rather than with 100 MB of
//! data.

use thunder_server::kafka::metrics::KafkaMetrics;
use thunder_server::kafka::{self, KafkaArgs};
use thunder_testbed::kafka::*;

/// Limits far below what one fetch of the backlog returns from this broker.
fn small_limits(args: &mut KafkaArgs) {
    for (key, value) in [
        ("message.max.bytes", "65536"),
        ("fetch.max.bytes", "65536"),
        ("max.partition.fetch.bytes", "65536"),
        ("receive.message.max.bytes", "262144"),
    ] {
        args.client
            .kafka_properties
            .push((key.to_owned(), value.to_owned()));
    }
}

/// Produces the feed-2d backlog at `scale` into a `topic` of `partitions` partitions; returns
/// the events.
fn backlog(
    broker: &Broker,
    topic: &str,
    partitions: i32,
    scale: u32,
    now: i64,
) -> Vec<thunder_engine::PostEvent> {
    create_topic(&broker.bootstrap(), topic, partitions);
    let (_, events) = order_free_backlog(scale, now);
    let producer = producer(&broker.bootstrap(), topic);
    for event in &events {
        send(&producer, event);
    }
    flush(&producer, events.len() as u64);
    events
}

#[test]
fn an_oversized_fetch_response_raises_the_limit_and_ingestion_catches_up() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "oversized_fetch";
    // About 50k events: over 1 MB per partition, four times the limit.
    let events = backlog(&broker, topic, 2, 400, now);
    assert!(events.len() > 40_000, "{} events", events.len());
    let (store, mut model) = store_and_model(now);
    apply_to_model(&mut model, &events);

    let mut args = kafka_args(&broker.bootstrap(), topic);
    args.kafka_num_threads = 2;
    small_limits(&mut args);
    let oversized_before = KafkaMetrics::global().oversized_fetch_responses.get();
    let ingest = kafka::start(&args, store.clone()).expect("start");
    wait_caught_up(&ingest);
    wait_applied(&ingest, events.len() as u64);
    let oversized = KafkaMetrics::global().oversized_fetch_responses.get() - oversized_before;
    assert!(
        oversized >= 1,
        "the broker's answers never exceeded the limit: the test proves nothing"
    );
    eprintln!("{oversized} oversized fetch responses, recovered from");
    // Each thread now accepts the broker's answers: its gauge is above the configured limit.
    for thread in ["0", "1"] {
        let limit = KafkaMetrics::global()
            .consumer_receive_max_bytes
            .with_label_values(&[thread])
            .get();
        assert!(limit > 262_144, "thread {thread}: limit {limit}");
    }
    let config = thunder_workload::SynthConfig::feed_2d(400, now);
    assert_same_answers(&store, &model, &viewers_for(&config, 50, &events));
    ingest.shutdown_blocking();
}

#[test]
fn a_response_beyond_the_ceiling_fails_start_up_naming_the_flag() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "oversized_beyond_ceiling";
    let events = backlog(&broker, topic, 2, 400, now);
    let (store, _) = store_and_model(now);
    let mut args = kafka_args(&broker.bootstrap(), topic);
    small_limits(&mut args);
    args.kafka_max_response_bytes = 300_000;
    let ingest = kafka::start(&args, store.clone()).expect("start");
    let reason = wait_failed(&ingest, "beyond the ceiling");
    for part in [
        topic,
        "receive.message.max.bytes",
        "--kafka-max-response-bytes",
        "300000",
    ] {
        assert!(reason.contains(part), "`{part}` missing from: {reason}");
    }
    assert!(store.stats().posts < events.len());
    ingest.shutdown_blocking();
}

#[test]
fn partitions_catching_up_from_a_broker_that_ignores_the_limits_are_read_within_the_window() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "catch_up_window";
    let partitions = 4;
    // About 100k events: over 1 MB per partition, each answer beyond the limit, and tens of
    // milliseconds to read each partition.
    let scale = 200;
    let events = backlog(&broker, topic, partitions, scale, now);
    let ends: Vec<i64> = broker
        .watermarks(topic, partitions)
        .iter()
        .map(|&(_, high)| high)
        .collect();
    let (store, mut model) = store_and_model(now);
    apply_to_model(&mut model, &events);

    let mut args = kafka_args(&broker.bootstrap(), topic);
    // A thread per partition: without the window, all four would be read at once.
    args.kafka_num_threads = 4;
    small_limits(&mut args);
    // Every backlog exceeds the window: once the broker has shown that it ignores the limits,
    // the partitions are read one at a time.
    args.kafka_catch_up_buffer_bytes = 1;
    let ingest = kafka::start(&args, store.clone()).expect("start");
    let applied = ingest.applied_offsets();
    // Partitions read part of the way, sampled every millisecond until catch-up (a partition
    // takes tens of milliseconds to read).
    let mut samples = 0;
    let mut most_at_once = 0;
    let mut partly_read_seen = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        match &*ingest.caught_up.borrow() {
            kafka::CatchUpState::Failed(reason) => panic!("ingestion failed: {reason}"),
            kafka::CatchUpState::CaughtUp { .. } => break,
            kafka::CatchUpState::CatchingUp => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no catch-up: {ingest:?}"
        );
        let offsets = applied.get().unwrap_or_default();
        let partly_read = offsets
            .iter()
            .filter(|o| {
                let end = ends[usize::try_from(o.partition).expect("partition")];
                o.next_offset > 0 && o.next_offset < end
            })
            .count();
        samples += 1;
        most_at_once = most_at_once.max(partly_read);
        partly_read_seen += usize::from(partly_read > 0);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    eprintln!(
        "{samples} samples, {partly_read_seen} with a partition read part of the way, at most \
         {most_at_once} at once"
    );
    assert!(
        partly_read_seen > 0,
        "no sample saw a partition being read: the test proves nothing"
    );
    // A partition whose last batch is applied is caught up and frees the window before the
    // next one is assigned: never two part of the way. (With a window that holds them all, or
    // none at all because no answer was seen beyond the limits, the four threads read theirs at
    // the same time and this sees three or four.)
    assert_eq!(most_at_once, 1, "partitions read at once");
    wait_applied(&ingest, events.len() as u64);
    let config = thunder_workload::SynthConfig::feed_2d(scale, now);
    assert_same_answers(&store, &model, &viewers_for(&config, 10, &events));
    ingest.shutdown_blocking();
}
