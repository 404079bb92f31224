//! End to end through a real broker: produce creates, deletes (some before their create, some
//! repeated), duplicate creates, malformed records and a record with no variant to a
//! 4-partition topic; ingest it; the store must answer exactly as the model store fed the same
//! events does.

use prost::Message;

use thunder_engine::PostEvent;
use thunder_engine::{DeleteEvent, LightPost};
use thunder_events::DecodeError;
use thunder_server::kafka;
use thunder_testbed::kafka::*;
use thunder_testbed::metrics::in_registry;

/// Records that must be counted as parse failures, with the error each must give.
fn bad_payloads() -> Vec<(Option<Vec<u8>>, &'static str)> {
    vec![
        (Some(vec![0xff, 0xff, 0xff]), "malformed"),
        // Field 1 (create) claims 5 bytes, 3 follow.
        (Some(b"\x0a\x05abc".to_vec()), "malformed"),
        // Field 2 (delete) holds a truncated varint.
        (Some(vec![0x12, 0x02, 0x08, 0x80]), "malformed"),
        // A valid, empty InNetworkEvent: no variant.
        (Some(Vec::new()), "no variant"),
        // A null payload.
        (None, "no payload"),
        // Well-formed, but with ids the contract cannot ask for.
        (
            Some(thunder_events::create_event(&LightPost::original(5, -7, 1)).encode_to_vec()),
            "negative id",
        ),
        (
            Some(
                thunder_events::delete_envelope(&DeleteEvent {
                    post_id: -9,
                    deleted_at: 1,
                })
                .encode_to_vec(),
            ),
            "negative id",
        ),
        // A create with no post id decodes as post 0: refused like an out-of-contract id.
        (
            Some(thunder_events::create_event(&LightPost::original(0, 7, 1)).encode_to_vec()),
            "zero id",
        ),
    ]
}

#[test]
fn ingested_store_matches_the_model() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "innetwork_post_e2e";
    create_topic(&broker.bootstrap(), topic, 4);

    let (config, backlog) = order_free_backlog(4000, now);
    let creates: Vec<LightPost> = backlog
        .iter()
        .filter_map(|e| {
            if let PostEvent::Create(p) = e {
                Some(*p)
            } else {
                None
            }
        })
        .collect();
    let deletes: Vec<DeleteEvent> = backlog
        .iter()
        .filter_map(|e| {
            if let PostEvent::Delete(d) = e {
                Some(*d)
            } else {
                None
            }
        })
        .collect();
    assert!(
        creates.len() > 1000 && !deletes.is_empty(),
        "workload too small"
    );

    // Extra events on top of the synthetic backlog.
    let mut extra: Vec<PostEvent> = Vec::new();
    // Repeated creates (identical) and repeated deletes.
    extra.extend(creates.iter().step_by(97).map(|p| PostEvent::Create(*p)));
    extra.extend(deletes.iter().take(20).map(|d| PostEvent::Delete(*d)));
    // A second create of an existing post with other content: the first one wins.
    extra.extend(creates.iter().step_by(211).map(|p| {
        PostEvent::Create(LightPost {
            has_video: !p.has_video,
            ..*p
        })
    }));
    // Deletes before their create.
    let originals: Vec<LightPost> = creates
        .iter()
        .filter(|p| p.is_original())
        .copied()
        .collect();
    let deleted: std::collections::HashSet<i64> = deletes.iter().map(|d| d.post_id).collect();
    let mut next_id = creates.iter().map(|p| p.post_id).max().unwrap_or(0) + 1;
    for p in originals.iter().step_by(151).take(15) {
        let post = LightPost::original(next_id, p.author_id, now - 60);
        next_id += 1;
        extra.push(PostEvent::Delete(DeleteEvent {
            post_id: post.post_id,
            deleted_at: now - 30,
        }));
        extra.push(PostEvent::Create(post));
    }
    // Bad times the store drops and counts: milliseconds, zero, negative, in the future.
    for created_at in [now * 1000, 0, -5, now + 3600] {
        extra.push(PostEvent::Create(LightPost::original(
            next_id, 42, created_at,
        )));
        next_id += 1;
    }
    // Replies that name a parent but do not set `is_reply`: ingestion derives it.
    for p in originals
        .iter()
        .filter(|p| !deleted.contains(&p.post_id))
        .step_by(173)
        .take(15)
    {
        let reply = LightPost {
            in_reply_to_post_id: Some(p.post_id),
            in_reply_to_user_id: Some(p.author_id),
            conversation_id: Some(p.post_id),
            ..LightPost::original(next_id, p.author_id, now - 10)
        };
        next_id += 1;
        extra.push(PostEvent::Create(reply));
    }

    // Two thirds before ingestion starts (the backlog), the rest after catch-up (live).
    let mut events = backlog.clone();
    events.extend(extra);
    let split = events.len() * 2 / 3;
    let bad = bad_payloads();
    for (payload, what) in &bad {
        let error = thunder_events::decode_event(payload.as_deref()).expect_err("a bad payload");
        let matches = match error {
            DecodeError::Malformed(_) => *what == "malformed",
            DecodeError::NoVariant => *what == "no variant",
            DecodeError::NoPayload => *what == "no payload",
            DecodeError::OutOfContractId { .. } => *what == "negative id",
            DecodeError::ZeroId { .. } => *what == "zero id",
        };
        assert!(matches, "{what}: got {error}");
    }

    let producer = producer(&broker.bootstrap(), topic);
    for event in &events[..split] {
        send(&producer, event);
    }
    for (i, (payload, _)) in bad.iter().enumerate() {
        producer
            .send_record(Some(i as i32 % 4), b"bad", payload.as_deref(), None)
            .expect("queue bad record");
    }
    let before_start = (split + bad.len()) as u64;
    flush(&producer, before_start);

    let failed_before = in_registry("kafka_messages_failed_parse_total", &[]).unwrap_or(0.0);
    let (store, mut model) = store_and_model(now);
    let mut args = kafka_args(&broker.bootstrap(), topic);
    args.kafka_num_threads = 3;
    args.kafka_batch_size = 500;
    let ingest = kafka::start(&args, store.clone()).expect("start ingestion");
    let took = wait_caught_up(&ingest);
    eprintln!("caught up on {before_start} records in {took:?}");

    for event in &events[split..] {
        send(&producer, event);
    }
    let total = before_start + (events.len() - split) as u64;
    flush(&producer, total);
    wait_applied(&ingest, total);

    let stats = ingest.stats();
    let rejected = bad
        .iter()
        .filter(|(_, what)| matches!(*what, "negative id" | "zero id"))
        .count() as u64;
    assert_eq!(stats.failed, bad.len() as u64 - rejected, "{stats:?}");
    assert_eq!(stats.rejected, rejected, "{stats:?}");
    assert_eq!(
        stats.creates + stats.deletes + stats.failed + stats.rejected,
        total,
        "{stats:?}"
    );
    // At least the four bad times, the repeated creates and the deleted-first creates.
    assert!(stats.dropped >= 4 + 15, "{stats:?}");
    for reason in ["invalid_time", "in_future", "duplicate", "tombstoned"] {
        assert!(
            in_registry("kafka_events_dropped_total", &[("reason", reason)]).unwrap_or(0.0) >= 1.0,
            "no drop counted as {reason}"
        );
    }
    assert!(
        in_registry(
            "kafka_events_dropped_total",
            &[("reason", "out_of_contract_id")]
        )
        .unwrap_or(0.0)
            >= rejected as f64
    );
    let failed_after = in_registry("kafka_messages_failed_parse_total", &[]).unwrap_or(0.0);
    assert!(
        failed_after - failed_before >= (bad.len() as u64 - rejected) as f64,
        "parse failures not counted"
    );

    apply_to_model(&mut model, &events);
    let viewers = viewers_for(&config, 40, &events);
    assert_same_answers(&store, &model, &viewers);
    assert_eq!(store.stats().posts, model.stats().posts, "stored posts");

    // The lag gauge reaches zero for every partition.
    wait_until(
        "kafka_partition_lag to reach 0",
        || {
            (0..4).all(|p| {
                in_registry(
                    "kafka_partition_lag",
                    &[("topic", topic), ("partition", &p.to_string())],
                ) == Some(0.0)
            })
        },
        || "lag gauge not zero".to_owned(),
    );
    ingest.shutdown_blocking();
}
