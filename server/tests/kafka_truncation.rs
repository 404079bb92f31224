//! The broker loses the tail of a partition's log and gives the lost offsets to new records
//! (killed with -9 and restarted on an older copy of its data, as after an unclean leader
//! election): the running replica detects it, counts and logs it, and skips no new record. It
//! then holds every post a fresh replica (reading the topic from the start) holds.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use thunder_engine::{FeedQuery, LightPost, PostEvent, PostStore};
use thunder_server::kafka;
use thunder_testbed::kafka::*;
use thunder_testbed::metrics::in_registry;

const PARTITIONS: i32 = 2;
const AUTHORS: i64 = 40;

fn partition_metric(topic: &str, name: &str, partition: i32) -> Option<f64> {
    in_registry(
        name,
        &[("topic", topic), ("partition", &partition.to_string())],
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// Creates of posts `ids`, spread over the authors.
fn creates(ids: std::ops::Range<i64>, now: i64) -> Vec<PostEvent> {
    ids.map(|id| PostEvent::Create(LightPost::original(id, 1 + id % AUTHORS, now - 60)))
        .collect()
}

fn produce(broker: &Broker, topic: &str, events: &[PostEvent]) {
    let producer = producer(&broker.bootstrap(), topic);
    for event in events {
        send(&producer, event);
    }
    flush(&producer, events.len() as u64);
}

/// Every post id `store` serves for the test's authors.
fn served(store: &PostStore) -> HashSet<i64> {
    let mut ids = HashSet::new();
    for author in 1..=AUTHORS {
        let authors = [author];
        let query = FeedQuery {
            max_results: 100_000,
            max_originals_per_author: 100_000,
            max_secondary_per_author: 100_000,
            ..FeedQuery::new(AUTHORS + 1, &authors)
        };
        ids.extend(
            store
                .get_all_posts_by_users(&query)
                .posts
                .iter()
                .map(|p| p.post_id),
        );
    }
    ids
}

fn ids(events: &[PostEvent]) -> HashSet<i64> {
    events
        .iter()
        .filter_map(|e| match e {
            PostEvent::Create(p) => Some(p.post_id),
            PostEvent::Delete(_) => None,
        })
        .collect()
}

/// The log ends below the replica's position when it asks again.
#[test]
fn a_truncated_log_is_counted_and_no_new_record_is_skipped() {
    truncate_and_compare("innetwork_post_truncation", false);
}

/// The broker comes back without records it had acknowledged and, before the replica
/// reconnects, new records regrow the log past its position: only the record it had read last
/// tells (it is not there any more).
#[test]
fn a_log_regrown_past_the_position_during_an_outage_is_detected() {
    truncate_and_compare("innetwork_post_regrown", true);
}

/// `regrow_at_once`: produce past the old position right after the broker's return, while
/// the replica's consumer still waits to reconnect.
fn truncate_and_compare(topic: &str, regrow_at_once: bool) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("thunder_server=info")
        .with_test_writer()
        .try_init();
    let now = now_secs();
    let mut broker = Broker::start();
    create_topic(&broker.bootstrap(), topic, PARTITIONS);
    // `kept` survives; `lost` is applied, then lost by the broker; `fewer` takes part of the
    // lost offsets (the log still ends below our position); `regrown` grows the log past it.
    let kept = creates(1..401, now);
    let lost = creates(1_001..1_301, now);
    let fewer = creates(2_001..2_101, now);
    let regrown = creates(3_001..3_501, now);

    produce(&broker, topic, &kept);
    let store = Arc::new(PostStore::new(172_800));
    let mut args = kafka_args(&broker.bootstrap(), topic);
    args.kafka_num_threads = 2;
    args.kafka_batch_size = 100;
    let ingest = kafka::start(&args, Arc::clone(&store)).expect("start ingestion");
    wait_caught_up(&ingest);
    wait_applied(&ingest, kept.len() as u64);
    for p in 0..PARTITIONS {
        assert_eq!(
            partition_metric(topic, "kafka_log_truncations_total", p),
            Some(0.0),
            "the truncation counter of partition {p} is exported from start-up"
        );
        assert_eq!(
            partition_metric(topic, "kafka_partition_stalled", p),
            Some(0.0),
            "the stalled gauge of partition {p} is exported from start-up"
        );
    }

    // An older copy of the broker's data: the log as it was with `kept` only.
    broker.stop();
    let saved = tempfile::tempdir().expect("temp dir");
    copy_dir(&broker.data_dir(), saved.path());
    broker.resume();
    let ends_kept = broker.watermarks(topic, PARTITIONS);

    produce(&broker, topic, &lost);
    wait_applied(&ingest, (kept.len() + lost.len()) as u64);
    let ends_lost = broker.watermarks(topic, PARTITIONS);

    // The broker dies and comes back without the tail it had acknowledged.
    broker.kill();
    std::fs::remove_dir_all(broker.data_dir()).expect("remove data");
    copy_dir(saved.path(), &broker.data_dir());
    // While the broker is away the lag is not a stale sample: it is gone or visibly old.
    wait_until(
        "the lag gauge to show the failed refresh",
        || {
            (0..PARTITIONS).all(|p| {
                partition_metric(topic, "kafka_partition_lag", p).is_none()
                    || partition_metric(topic, "kafka_partition_lag_refresh_age_seconds", p)
                        .is_some_and(|age| age >= 3.0)
            })
        },
        || format!("{ingest:?}"),
    );
    broker.resume();
    let ends_truncated = broker.watermarks(topic, PARTITIONS);
    assert_eq!(
        ends_truncated,
        ends_kept,
        "the broker did not come back with the older log; log:\n{}",
        broker.log()
    );
    let truncated: Vec<i32> = (0..PARTITIONS)
        .filter(|&p| ends_truncated[p as usize].1 < ends_lost[p as usize].1)
        .collect();
    assert!(!truncated.is_empty(), "no partition lost records");

    if regrow_at_once {
        produce(&broker, topic, &regrown);
        let ends_regrown = broker.watermarks(topic, PARTITIONS);
        assert!(
            (0..PARTITIONS as usize).any(|p| ends_regrown[p].1 >= ends_lost[p].1),
            "the log did not regrow past the old position: {ends_regrown:?} vs {ends_lost:?}"
        );
    }
    produce(&broker, topic, &fewer);
    // Every new post is applied (they sit on offsets the replica had read before).
    let want_fewer = ids(&fewer);
    wait_until(
        "the posts written after the truncation",
        || want_fewer.is_subset(&served(&store)),
        || {
            let missing = want_fewer.difference(&served(&store)).count();
            format!("{missing} missing; {ingest:?}")
        },
    );
    for &p in &truncated {
        wait_until(
            "the truncation to be counted",
            || partition_metric(topic, "kafka_log_truncations_total", p).is_some_and(|n| n >= 1.0),
            || format!("partition {p}; {ingest:?}"),
        );
    }

    if !regrow_at_once {
        produce(&broker, topic, &regrown);
    }
    let want_regrown = ids(&regrown);
    wait_until(
        "the posts written past the old position",
        || want_regrown.is_subset(&served(&store)),
        || {
            let missing = want_regrown.difference(&served(&store)).count();
            format!("{missing} missing; {ingest:?}")
        },
    );

    // A fresh replica reads what the broker has now.
    let fresh = Arc::new(PostStore::new(172_800));
    let fresh_ingest = kafka::start(&args, Arc::clone(&fresh)).expect("start a fresh replica");
    wait_caught_up(&fresh_ingest);
    let total = ends_kept.iter().map(|(_, h)| *h).sum::<i64>() as u64
        + (fewer.len() + regrown.len()) as u64;
    wait_applied(&fresh_ingest, total);
    let fresh_posts = served(&fresh);
    let running_posts = served(&store);
    let missing: Vec<i64> = fresh_posts.difference(&running_posts).copied().collect();
    assert!(
        missing.is_empty(),
        "the running replica lacks {} posts a fresh one serves: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    // What only the running replica holds is what the broker lost after we applied it.
    let extra: HashSet<i64> = running_posts.difference(&fresh_posts).copied().collect();
    assert!(extra.is_subset(&ids(&lost)), "unexpected extra posts");
    assert_eq!(
        fresh_posts.len(),
        kept.len() + fewer.len() + regrown.len(),
        "the fresh replica's posts"
    );

    // One truncation, counted once per partition that lost records.
    for p in 0..PARTITIONS {
        let want = if truncated.contains(&p) { 1.0 } else { 0.0 };
        assert_eq!(
            partition_metric(topic, "kafka_log_truncations_total", p),
            Some(want),
            "truncations of partition {p}"
        );
    }

    // The lag gauges are back, fresh and at zero.
    wait_until(
        "every partition's lag to be refreshed at zero",
        || {
            (0..PARTITIONS).all(|p| {
                partition_metric(topic, "kafka_partition_lag", p) == Some(0.0)
                    && partition_metric(topic, "kafka_partition_lag_refresh_age_seconds", p)
                        .is_some_and(|age| age < 10.0)
            })
        },
        || format!("{ingest:?}"),
    );
    fresh_ingest.shutdown_blocking();
    ingest.shutdown_blocking();
}
