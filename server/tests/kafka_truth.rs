//! What ingestion reports is what the topic holds, against a real broker: every standard
//! compression codec is read (also mixed within one partition); a batch that no retry can
//! decode fails start-up with its topic, partition, offset and cause; after catch-up such a
//! batch marks its partition stalled while the other partitions go on.

use std::time::{Duration, Instant};

use thunder_engine::{FeedQuery, LightPost};
use thunder_events::kafka::EventProducer;
use thunder_server::kafka;
use thunder_testbed::kafka::*;

const CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];

/// A producer that compresses with `codec`, lingering so batches hold many records.
fn producer_with(bootstrap: &str, topic: &str, codec: &str) -> EventProducer {
    let mut args = kafka_args(bootstrap, topic);
    args.client.kafka_properties = vec![
        ("compression.type".into(), codec.into()),
        ("linger.ms".into(), "20".into()),
    ];
    EventProducer::new(&args.client).expect("producer")
}

/// Ingests `topic` from the start into a fresh store; returns it once `records` are applied.
fn ingest_all(
    bootstrap: &str,
    topic: &str,
    records: u64,
) -> std::sync::Arc<thunder_engine::PostStore> {
    let (store, _) = store_and_model(now_secs());
    let ingest = kafka::start(&kafka_args(bootstrap, topic), store.clone()).expect("start");
    wait_caught_up(&ingest);
    // Ready means caught up: nothing is left to wait for.
    assert_eq!(ingest.stats().records, records, "{ingest:?}");
    assert_eq!(ingest.stats().failed, 0, "{ingest:?}");
    ingest.shutdown_blocking();
    store
}

#[test]
fn every_codec_is_consumed() {
    let now = now_secs();
    let broker = Broker::start();
    let per_codec = 300;
    for (c, codec) in CODECS.iter().enumerate() {
        let topic = format!("codec_{codec}");
        create_topic(&broker.bootstrap(), &topic, 2);
        let producer = producer_with(&broker.bootstrap(), &topic, codec);
        for i in 0..per_codec {
            let id = (c * 10_000 + i + 1) as i64;
            producer
                .send_create(&LightPost::original(id, 1 + id % 17, now - 60))
                .expect("queue");
        }
        flush(&producer, per_codec as u64);
        let store = ingest_all(&broker.bootstrap(), &topic, per_codec as u64);
        assert_eq!(store.stats().posts, per_codec, "codec {codec}");
    }
}

#[test]
fn one_partition_mixing_every_codec_is_consumed() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "codec_mix";
    create_topic(&broker.bootstrap(), topic, 1);
    let producers: Vec<EventProducer> = CODECS
        .iter()
        .map(|codec| producer_with(&broker.bootstrap(), topic, codec))
        .collect();
    // Rounds of batches, each codec in turn, so the partition alternates codecs batch by batch.
    let mut sent = vec![0u64; producers.len()];
    let mut id = 0i64;
    for _round in 0..4 {
        for (p, producer) in producers.iter().enumerate() {
            for _ in 0..50 {
                producer
                    .send_create(&LightPost::original(id + 1, 3, now - 30))
                    .expect("queue");
                id += 1;
            }
            sent[p] += 50;
            flush(producer, sent[p]);
        }
    }
    let store = ingest_all(&broker.bootstrap(), topic, id as u64);
    assert_eq!(store.stats().posts, id as usize);
}

#[test]
fn a_batch_no_retry_can_decode_fails_start_up_with_where_and_why() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "undecodable_backlog";
    create_topic(&broker.bootstrap(), topic, 2);
    let producer = producer(&broker.bootstrap(), topic);
    // Author 1's records all land in one partition; find which.
    for id in 10..15 {
        producer
            .send_create(&LightPost::original(id, 1, now - 60))
            .expect("queue");
    }
    flush(&producer, 5);
    let watermarks = broker.watermarks(topic, 2);
    let partition = watermarks
        .iter()
        .position(|&(_, high)| high == 5)
        .expect("one partition holds author 1") as i32;
    // Codec 5 does not exist: librdkafka answers "Not implemented", as it does for zstd when
    // built without it.
    produce_raw_batch(
        &broker.bootstrap(),
        topic,
        partition,
        5,
        b"not a real batch body",
    );
    for id in 15..18 {
        producer
            .send_create(&LightPost::original(id, 1, now - 60))
            .expect("queue");
    }
    flush(&producer, 8);

    let (store, _) = store_and_model(now);
    let ingest =
        kafka::start(&kafka_args(&broker.bootstrap(), topic), store.clone()).expect("start");
    let reason = wait_failed(&ingest, "over an undecodable batch");
    for part in [
        topic.to_owned(),
        format!("partition {partition} at offset 5"),
        "compression codec".to_owned(),
    ] {
        assert!(reason.contains(&part), "`{part}` missing from: {reason}");
    }
    // What came before the bad batch was applied, nothing after it.
    assert_eq!(store.stats().posts, 5);
    ingest.shutdown_blocking();
}

#[test]
fn a_corrupt_batch_after_catch_up_stalls_only_its_partition() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "stall_after_catch_up";
    create_topic(&broker.bootstrap(), topic, 2);
    let producer = producer(&broker.bootstrap(), topic);
    producer
        .send_create(&LightPost::original(1, 1, now - 60))
        .expect("queue");
    flush(&producer, 1);
    let stuck = broker
        .watermarks(topic, 2)
        .iter()
        .position(|&(_, high)| high == 1)
        .expect("author 1's partition") as i32;

    let (store, _) = store_and_model(now);
    let mut args = kafka_args(&broker.bootstrap(), topic);
    args.kafka_stall_timeout_secs = 2;
    let ingest = kafka::start(&args, store.clone()).expect("start");
    wait_caught_up(&ingest);
    assert!(ingest.stalled.borrow().is_empty());

    // A zstd batch whose body is not zstd: "Bad compression", forever.
    produce_raw_batch(
        &broker.bootstrap(),
        topic,
        stuck,
        4,
        b"\x28\xb5\x2f\xfd garbage",
    );
    let stalled_at = Instant::now();
    wait_until(
        "the partition to be reported stalled",
        || *ingest.stalled.borrow() == vec![stuck],
        || format!("{ingest:?}"),
    );
    let after = stalled_at.elapsed();
    assert!(
        after >= Duration::from_secs(2),
        "stalled after {after:?}, before the timeout"
    );
    eprintln!("partition {stuck} reported stalled {after:?} after the corrupt batch");

    // The other partition keeps going: find an author that lands there.
    let mut sent = 1;
    let mut other_author = None;
    for author in 2..50 {
        producer
            .send_create(&LightPost::original(100 + author, author, now - 10))
            .expect("queue");
        sent += 1;
        flush(&producer, sent);
        let marks = broker.watermarks(topic, 2);
        if marks[(1 - stuck) as usize].1 > 0 {
            other_author = Some(author);
            break;
        }
    }
    let other_author = other_author.expect("an author of the other partition");
    wait_until(
        "the healthy partition to apply its record",
        || {
            let answer = store.get_all_posts_by_users(&FeedQuery::new(0, &[other_author]));
            answer.posts.iter().any(|p| p.post_id == 100 + other_author)
        },
        || format!("{ingest:?}"),
    );
    assert_eq!(
        *ingest.stalled.borrow(),
        vec![stuck],
        "only the corrupt partition stalls"
    );
    ingest.shutdown_blocking();
}
