//! The catch-up gate against a real broker: not caught up while a large backlog is still being
//! read, caught up exactly when all of it is applied; topics with fewer partitions than
//! threads, empty topics and a topic
//! created late still become ready; bad configuration fails at start.

use std::time::{Duration, Instant};

use thunder_engine::LightPost;
use thunder_server::kafka::{self, CatchUpState};
use thunder_testbed::kafka::*;

#[test]
fn caught_up_only_once_the_backlog_is_read() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "innetwork_post_backlog";
    let partitions = 4;
    create_topic(&broker.bootstrap(), topic, partitions);
    let (_, events) = order_free_backlog(400, now);
    let producer = producer(&broker.bootstrap(), topic);
    for event in &events {
        send(&producer, event);
    }
    let total = events.len() as u64;
    flush(&producer, total);

    let (store, _) = store_and_model(now);
    let mut args = kafka_args(&broker.bootstrap(), topic);
    args.kafka_num_threads = 2;
    args.kafka_batch_size = 100;
    // Ready means caught up: everything produced before start is applied at `CaughtUp`.
    let slack = 0;
    let ingest = kafka::start(&args, store).expect("start ingestion");

    let deadline = Instant::now() + TIMEOUT;
    let mut saw_partial_progress = false;
    let took = loop {
        let state = ingest.caught_up.borrow().clone();
        let records = ingest.stats().records;
        match state {
            CatchUpState::CaughtUp { took } => {
                assert!(
                    records + slack >= total,
                    "caught up with {records} of {total} records applied"
                );
                break took;
            }
            CatchUpState::Failed(reason) => panic!("ingestion failed: {reason}"),
            CatchUpState::CatchingUp => {
                if records > 0 && records + slack < total {
                    saw_partial_progress = true;
                }
            }
        }
        assert!(Instant::now() < deadline, "no catch-up: {ingest:?}");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert!(
        saw_partial_progress,
        "never saw the backlog half read while catching up (caught up in {took:?})"
    );
    wait_applied(&ingest, total);
    eprintln!("caught up on {total} records in {took:?}");
    ingest.shutdown_blocking();
}

#[test]
fn fewer_partitions_than_threads_and_empty_topics_become_ready() {
    let now = now_secs();
    let broker = Broker::start();
    create_topic(&broker.bootstrap(), "one_partition", 1);
    create_topic(&broker.bootstrap(), "empty", 2);
    let producer = producer(&broker.bootstrap(), "one_partition");
    for id in 1..=3 {
        producer
            .send_create(&LightPost::original(id, 7, now - id))
            .expect("queue");
    }
    // Far fewer records than a batch: the buffer never fills.
    flush(&producer, 3);

    for (topic, records) in [("one_partition", 3), ("empty", 0)] {
        let (store, _) = store_and_model(now);
        let mut args = kafka_args(&broker.bootstrap(), topic);
        args.kafka_num_threads = 4;
        args.kafka_batch_size = 1000;
        let ingest = kafka::start(&args, store.clone()).expect("start ingestion");
        wait_caught_up(&ingest);
        wait_applied(&ingest, records);
        assert_eq!(store.stats().posts, records as usize, "{topic}");
        ingest.shutdown_blocking();
    }
}

#[test]
fn a_missing_topic_is_waited_for() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "created_later";
    let (store, _) = store_and_model(now);
    let ingest = kafka::start(&kafka_args(&broker.bootstrap(), topic), store.clone())
        .expect("start ingestion");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        *ingest.caught_up.borrow(),
        CatchUpState::CatchingUp,
        "{ingest:?}"
    );

    create_topic(&broker.bootstrap(), topic, 2);
    let producer = producer(&broker.bootstrap(), topic);
    for id in 1..=5 {
        producer
            .send_create(&LightPost::original(id, id, now))
            .expect("queue");
    }
    flush(&producer, 5);
    wait_caught_up(&ingest);
    wait_applied(&ingest, 5);
    assert_eq!(store.stats().posts, 5);
    ingest.shutdown_blocking();
}

#[test]
fn start_from_time_skips_records_older_than_the_retention() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "innetwork_post_by_time";
    create_topic(&broker.bootstrap(), topic, 2);
    let producer = producer(&broker.bootstrap(), topic);
    let retention_secs = 3600;
    // Records written two retentions ago (by their Kafka timestamp), then recent ones. The
    // posts themselves are recent, so only the start position decides what is applied.
    for (id, age_secs) in (1..=20)
        .map(|id| (id, 2 * retention_secs))
        .chain((21..=25).map(|id| (id, 0)))
    {
        let payload = prost::Message::encode_to_vec(&thunder_events::create_event(
            &LightPost::original(id, 1 + id % 3, now),
        ));
        let timestamp_ms = (now - age_secs) * 1000;
        producer
            .send_record(
                Some((id % 2) as i32),
                b"k",
                Some(&payload),
                Some(timestamp_ms),
            )
            .expect("queue");
    }
    flush(&producer, 25);

    for (start_from_time, expected) in [(true, 5), (false, 25)] {
        let clock: std::sync::Arc<dyn thunder_engine::Clock> =
            std::sync::Arc::new(thunder_engine::ManualClock::new(now));
        let store =
            std::sync::Arc::new(thunder_engine::PostStore::with_clock(retention_secs, clock));
        let mut args = kafka_args(&broker.bootstrap(), topic);
        args.start_from_time = start_from_time;
        let ingest = kafka::start(&args, store.clone()).expect("start ingestion");
        wait_caught_up(&ingest);
        wait_applied(&ingest, expected);
        assert_eq!(
            store.stats().posts,
            expected as usize,
            "start_from_time={start_from_time}"
        );
        ingest.shutdown_blocking();
    }
}

#[test]
fn bad_configuration_fails_at_start() {
    let (store, _) = store_and_model(now_secs());
    let mut args = kafka_args("127.0.0.1:1", "t");
    args.client.kafka_properties = vec![("no.such.property".into(), "1".into())];
    assert!(kafka::start(&args, store.clone()).is_err());
    let mut args = kafka_args("127.0.0.1:1", "t");
    args.kafka_num_threads = 0;
    assert!(kafka::start(&args, store.clone()).is_err());
    let mut args = kafka_args("127.0.0.1:1", "t");
    args.client.kafka_brokers = None;
    assert!(kafka::start(&args, store).is_err());
}

#[test]
fn an_unreachable_broker_keeps_catching_up_without_failing() {
    let (store, _) = store_and_model(now_secs());
    // Nothing listens on port 1.
    let ingest = kafka::start(&kafka_args("127.0.0.1:1", "t"), store).expect("start ingestion");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(*ingest.caught_up.borrow(), CatchUpState::CatchingUp);
    let started = Instant::now();
    ingest.shutdown_blocking();
    assert!(started.elapsed() < Duration::from_secs(30), "shutdown hung");
}
