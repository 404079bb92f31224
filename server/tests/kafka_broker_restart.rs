//! The broker goes away mid-stream and comes back (same port, same data directory): ingestion
//! keeps running, resumes, and every event is applied exactly as the model says.

use std::time::Duration;

use thunder_server::kafka::{self, CatchUpState};
use thunder_testbed::kafka::*;
use thunder_testbed::metrics::in_registry;

#[test]
fn ingestion_survives_a_broker_restart() {
    let now = now_secs();
    let mut broker = Broker::start();
    let topic = "innetwork_post_restart";
    create_topic(&broker.bootstrap(), topic, 2);

    let (config, events) = order_free_backlog(4000, now);
    let (before, after) = events.split_at(events.len() * 3 / 5);

    let producer = producer(&broker.bootstrap(), topic);
    for event in before {
        send(&producer, event);
    }
    flush(&producer, before.len() as u64);
    let watermarks_before = broker.watermarks(topic, 2);

    let (store, mut model) = store_and_model(now);
    let mut args = kafka_args(&broker.bootstrap(), topic);
    args.kafka_num_threads = 2;
    args.kafka_batch_size = 300;
    let ingest = kafka::start(&args, store.clone()).expect("start ingestion");
    wait_caught_up(&ingest);
    wait_applied(&ingest, before.len() as u64);

    broker.stop();
    // Consumers see the broker gone for a while; that is not fatal.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        matches!(*ingest.caught_up.borrow(), CatchUpState::CaughtUp { .. }),
        "state changed while the broker was down: {ingest:?}"
    );
    broker.resume();
    let watermarks_after = broker.watermarks(topic, 2);
    assert_eq!(
        watermarks_after,
        watermarks_before,
        "the broker did not keep the log across a restart; log:\n{}",
        broker.log()
    );

    for event in after {
        send(&producer, event);
    }
    flush(&producer, events.len() as u64);
    wait_applied(&ingest, events.len() as u64);

    // The broker came back with its whole log: no truncation is counted.
    for partition in ["0", "1"] {
        let truncations = in_registry(
            "kafka_log_truncations_total",
            &[("topic", topic), ("partition", partition)],
        );
        assert_eq!(truncations, Some(0.0), "partition {partition}");
    }

    apply_to_model(&mut model, &events);
    assert_same_answers(&store, &model, &viewers_for(&config, 40, &events));
    assert_eq!(store.stats().posts, model.stats().posts, "stored posts");
    ingest.shutdown_blocking();
}
