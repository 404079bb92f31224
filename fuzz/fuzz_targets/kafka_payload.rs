//! Arbitrary Kafka record payloads through the consumer's decode path (`decode_event`, then
//! `RecordBatch::push_record` and `apply` to a store): never a panic; every record that does not
//! decode is an error, counted in the batch and in `kafka_messages_failed_parse_total`; a record
//! with an id outside the contract is rejected and counted apart; every record that decodes
//! survives a re-encode unchanged.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use thunder_engine::PostEvent;
use thunder_engine::{FeedQuery, ManualClock, PostStore, StoreConfig};
use thunder_events::{create_event, decode_event, delete_envelope};
use thunder_server::kafka::RecordBatch;

/// The store's clock; a create is stored when it is at most a day older than this.
const NOW_SECS: i64 = 1_700_000_000;
const RETENTION_SECS: i64 = 24 * 60 * 60;

fn failed_parse_total() -> u64 {
    prometheus::gather()
        .iter()
        .find(|family| family.name() == "kafka_messages_failed_parse_total")
        .and_then(|family| {
            family
                .get_metric()
                .first()
                .map(|m| m.get_counter().get_value() as u64)
        })
        .unwrap_or(0)
}

fuzz_target!(|payload: &[u8]| {
    let decoded = decode_event(Some(payload));

    let failed_before = failed_parse_total();
    let mut batch = RecordBatch::with_capacity(1);
    let pushed = batch.push_record(0, 0, Some(payload));
    assert_eq!(
        pushed.is_ok(),
        decoded.is_ok(),
        "push_record and decode_event disagree"
    );
    let store = PostStore::with_config(StoreConfig {
        retention_secs: RETENTION_SECS,
        max_posting_list_size: 4,
        clock: Arc::new(ManualClock::new(NOW_SECS)),
    });
    let outcome = batch.apply(&store);
    assert_eq!(outcome.records, 1);
    assert!(batch.is_empty(), "apply empties the batch");

    match decoded {
        Err(error) if error.is_out_of_contract() => {
            // Well-formed but outside the contract (a negative id, a post or author id of 0):
            // rejected and counted as a drop, not as a parse failure.
            assert_eq!(
                (
                    outcome.rejected,
                    outcome.failed,
                    outcome.creates,
                    outcome.deletes
                ),
                (1, 0, 0, 0)
            );
            assert_eq!(store.stats().posts, 0);
        }
        Err(_) => {
            assert_eq!(
                (outcome.failed, outcome.creates, outcome.deletes),
                (1, 0, 0)
            );
            // The counter is process-wide; it must at least have moved by this record.
            assert!(
                failed_parse_total() > failed_before,
                "decode failure not counted"
            );
        }
        Ok(PostEvent::Create(post)) => {
            assert_eq!(
                (outcome.failed, outcome.creates, outcome.deletes),
                (0, 1, 0)
            );
            let again = decode_event(Some(&create_event(&post).encode_to_vec()))
                .expect("a re-encoded create decodes");
            assert_eq!(again, PostEvent::Create(post));
            let in_window = post.created_at <= NOW_SECS
                && NOW_SECS - post.created_at <= RETENTION_SECS
                && (1..=i64::from(u32::MAX)).contains(&post.created_at);
            assert_eq!(store.stats().posts, usize::from(in_window));
            let authors = [post.author_id];
            let found = store
                .get_videos_by_users(&FeedQuery::new(0, &authors))
                .posts;
            assert!(found.len() <= 1 && found.iter().all(|p| p.post_id == post.post_id));
        }
        Ok(PostEvent::Delete(delete)) => {
            assert_eq!(
                (outcome.failed, outcome.creates, outcome.deletes),
                (0, 0, 1)
            );
            let again = decode_event(Some(&delete_envelope(&delete).encode_to_vec()))
                .expect("a re-encoded delete decodes");
            assert_eq!(again, PostEvent::Delete(delete));
            assert_eq!(store.stats().tombstones, 1);
        }
    }
});
