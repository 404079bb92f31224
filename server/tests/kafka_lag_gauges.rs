//! The gauges beside readiness tell the truth from its first moment: in the first scrape after
//! `/readyz` turns 200, `kafka_partition_lag` shows the caught-up lag (not the backlog read at
//! start) and the `post_store_*` gauges the store being served; and
//! `kafka_partition_lag_refresh_age_seconds` grows between refreshes, so a broker that stops
//! answering shows as an age that keeps growing.

use std::time::{Duration, Instant};

use thunder_engine::PostEvent;
use thunder_testbed::kafka::*;
use thunder_testbed::metrics::in_text;
use thunder_testbed::server_process::ServerProcess;

const PARTITIONS: i32 = 4;

#[test]
fn the_first_scrape_after_ready_shows_the_caught_up_lag_and_store_and_the_refresh_age_grows() {
    let now = now_secs();
    let mut broker = Broker::start();
    let topic = "lag-gauges";
    create_topic(&broker.bootstrap(), topic, PARTITIONS);
    let (_, events) = order_free_backlog(8000, now);
    let producer = producer(&broker.bootstrap(), topic);
    for event in &events {
        send(&producer, event);
    }
    flush(&producer, events.len() as u64);
    drop(producer);
    let creates = events
        .iter()
        .filter(|e| matches!(e, PostEvent::Create(_)))
        .count();

    // No stall rule, and the default 30 s lag interval: the monitor's own schedule refreshes
    // the gauges at start (the whole backlog) and 30 s later, nothing in between.
    let server = ServerProcess::start(
        &[
            "--kafka-brokers",
            &broker.bootstrap(),
            "--kafka-topic",
            topic,
            "--kafka-num-threads",
            "2",
            "--kafka-stall-timeout-secs",
            "0",
            "--kafka-request-timeout-ms",
            "4000",
            "--post-retention-seconds",
            &(3 * 24 * 3600).to_string(),
        ],
        TIMEOUT,
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let scrape = || {
        runtime
            .block_on(thunder_testbed::http_get(server.admin, "/metrics"))
            .text()
    };
    let deadline = Instant::now() + TIMEOUT;
    while runtime
        .block_on(thunder_testbed::http_get(server.admin, "/readyz"))
        .status
        != 200
    {
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let first = scrape();
    let partition = |text: &str, name: &str, p: i32| {
        in_text(
            text,
            name,
            &[("topic", topic), ("partition", &p.to_string())],
        )
    };
    assert_eq!(in_text(&first, "server_ready", &[]), Some(1.0));
    for p in 0..PARTITIONS {
        assert_eq!(
            partition(&first, "kafka_partition_lag", p),
            Some(0.0),
            "partition {p} in the first scrape after ready:\n{}",
            kafka_lines(&first)
        );
    }
    let posts = in_text(&first, "post_store_total_posts", &[]).unwrap_or(0.0);
    assert!(
        posts > 0.0 && posts <= creates as f64,
        "post_store_total_posts {posts} in the first scrape after ready ({creates} creates)"
    );

    // The broker goes away: the lag cannot be refreshed, and its age keeps growing.
    broker.kill();
    let ages = |text: &str| -> Vec<f64> {
        (0..PARTITIONS)
            .map(|p| {
                partition(text, "kafka_partition_lag_refresh_age_seconds", p)
                    .unwrap_or_else(|| panic!("no refresh age of {p}:\n{}", kafka_lines(text)))
            })
            .collect()
    };
    let before = ages(&scrape());
    std::thread::sleep(Duration::from_secs(2));
    let after = ages(&scrape());
    for (p, (before, after)) in before.iter().zip(&after).enumerate() {
        assert!(
            after - before >= 1.5,
            "partition {p}: refresh age {before} then {after} two seconds later"
        );
    }
}

/// The `kafka_` lines of a scrape, for failure messages.
fn kafka_lines(text: &str) -> String {
    text.lines()
        .filter(|l| l.starts_with("kafka_partition"))
        .collect::<Vec<_>>()
        .join("\n")
}
