//! Writers, a deleter, a trimmer and readers at once. Every answer is checked: each post is
//! intact (all fields as inserted, so a torn read or a reused slot shows), belongs to an
//! author that was asked for, was not deleted before the query started, is not expired, and the
//! answer is in the answer order (newest first, the larger id first among equal times: the
//! merge ranks streams by the newest entry their writers are republishing meanwhile). Afterwards no deleted post is left (no resurrection, bug 20).
//!
//! Sized to finish in a few seconds; `THUNDER_STRESS_SCALE=10` runs ten times longer.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::thread;
use thunder_engine::{
    Clock, DeleteEvent, FeedQuery, LightPost, ManualClock, PostStore, StoreConfig,
};

const START: i64 = 1_700_000_000;
const RETENTION: i64 = 600;
const AUTHORS: i64 = 40;

/// Every field is a function of the id, so a reader can check a post it got back.
fn post(id: i64, now: i64) -> LightPost {
    let kind = id % 5;
    LightPost {
        post_id: id,
        author_id: id % AUTHORS,
        created_at: now - (id * 7919) % 50,
        in_reply_to_post_id: (kind == 1).then_some(id + 1_000_000),
        in_reply_to_user_id: (kind == 1).then_some((id - 1) % AUTHORS + 1000),
        is_retweet: kind == 2,
        is_reply: kind == 1,
        source_post_id: (kind == 2).then_some(id + 2_000_000),
        source_user_id: (kind == 2).then_some((id - 2) % AUTHORS + 1000),
        has_video: kind == 3,
        conversation_id: (kind == 1).then_some(id + 1_000_000),
    }
}

fn intact(p: &LightPost) -> bool {
    let expected = post(p.post_id, 0);
    LightPost {
        created_at: 0,
        ..*p
    } == LightPost {
        created_at: 0,
        ..expected
    } && (START..START + 1_000_000).contains(&(p.created_at + (p.post_id * 7919) % 50))
}

fn scale() -> i64 {
    std::env::var("THUNDER_STRESS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

#[test]
fn writers_deleter_trimmer_and_readers() {
    let clock = Arc::new(ManualClock::new(START));
    let store = Arc::new(PostStore::with_config(StoreConfig {
        retention_secs: RETENTION,
        max_posting_list_size: 32,
        clock: clock.clone(),
    }));
    let per_writer = 20_000 * scale();
    let done = Arc::new(AtomicBool::new(false));
    // Ids below this are deleted and the delete has returned.
    let deleted_upto = Arc::new(AtomicI64::new(0));

    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (store, clock) = (store.clone(), clock.clone());
            thread::spawn(move || {
                let mut batch = Vec::new();
                for i in 0..per_writer {
                    let id = i * 2 + w + 1;
                    if id % 4000 == 0 {
                        clock.advance(10);
                    }
                    batch.push(post(id, clock.now_secs()));
                    if batch.len() == 64 {
                        store.insert_posts(&batch);
                        batch.clear();
                    }
                }
                store.insert_posts(&batch);
            })
        })
        .collect();

    let deleter = {
        let (store, clock, deleted_upto, done) = (
            store.clone(),
            clock.clone(),
            deleted_upto.clone(),
            done.clone(),
        );
        thread::spawn(move || {
            let mut deleted = Vec::new();
            let mut next = 1;
            while !done.load(Ordering::Relaxed) && next < per_writer * 2 {
                // Every 13th id, racing the writers that may not have inserted it yet.
                let batch: Vec<DeleteEvent> = (next..next + 13 * 16)
                    .filter(|id| id % 13 == 0)
                    .map(|post_id| DeleteEvent {
                        post_id,
                        deleted_at: clock.now_secs(),
                    })
                    .collect();
                store.mark_as_deleted(&batch);
                deleted.extend(batch.iter().map(|d| d.post_id));
                next += 13 * 16;
                deleted_upto.store(next, Ordering::Release);
                thread::yield_now();
            }
            deleted
        })
    };

    let trimmer = {
        let (store, done) = (store.clone(), done.clone());
        thread::spawn(move || {
            let mut shard = 0;
            while !done.load(Ordering::Relaxed) {
                store.trim(shard);
                shard += 1;
                thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };

    let readers: Vec<_> =
        (0..2)
            .map(|r| {
                let (store, clock, deleted_upto, done) = (
                    store.clone(),
                    clock.clone(),
                    deleted_upto.clone(),
                    done.clone(),
                );
                thread::spawn(move || {
                    let mut checked = 0usize;
                    let mut round = 0i64;
                    while !done.load(Ordering::Relaxed) {
                        round += 1;
                        let authors: Vec<i64> =
                            (0..AUTHORS).filter(|a| (a + round + r) % 3 != 0).collect();
                        let asked: HashSet<i64> = authors.iter().copied().collect();
                        let gone_below = deleted_upto.load(Ordering::Acquire);
                        let now = clock.now_secs();
                        let q = FeedQuery {
                            max_results: 500,
                            ..FeedQuery::new(7, &authors)
                        };
                        let answer = if round % 4 == 0 {
                            store.get_videos_by_users(&q)
                        } else {
                            store.get_all_posts_by_users(&q)
                        };
                        let posts = answer.posts;
                        for p in &posts {
                            assert!(intact(p), "torn or reused record: {p:?}");
                            assert!(asked.contains(&p.author_id), "author not asked for: {p:?}");
                            assert!(
                                !(p.post_id % 13 == 0 && p.post_id < gone_below - 13 * 16),
                                "deleted post returned: {p:?}"
                            );
                            assert!(
                                now - p.created_at <= RETENTION,
                                "expired post returned: {p:?}"
                            );
                            assert!(
                                !(p.is_retweet && p.source_user_id == Some(7)),
                                "self-repost returned"
                            );
                        }
                        assert!(
                            posts.windows(2).all(|w| (w[0].created_at, w[0].post_id)
                                > (w[1].created_at, w[1].post_id)),
                            "not in the answer order (newest first, larger id first)"
                        );
                        checked += posts.len();
                    }
                    checked
                })
            })
            .collect();

    for w in writers {
        w.join().expect("writer panicked");
    }
    done.store(true, Ordering::Relaxed);
    let deleted: HashSet<i64> = deleter
        .join()
        .expect("deleter panicked")
        .into_iter()
        .collect();
    trimmer.join().expect("trimmer panicked");
    let checked: usize = readers
        .into_iter()
        .map(|r| r.join().expect("reader panicked"))
        .sum();
    assert!(checked > 0, "readers saw nothing");

    // No deleted post survived, whatever the interleaving with its insert.
    let authors: Vec<i64> = (0..AUTHORS).collect();
    let q = FeedQuery {
        max_results: usize::MAX,
        ..FeedQuery::new(-1, &authors)
    };
    for p in store
        .get_all_posts_by_users(&q)
        .posts
        .iter()
        .chain(&store.get_videos_by_users(&q).posts)
    {
        assert!(!deleted.contains(&p.post_id), "resurrected {}", p.post_id);
        assert!(intact(p));
    }
    // Accounting is consistent once quiet.
    let stats = store.stats();
    assert!(
        stats.original_entries + stats.secondary_entries
            >= stats.posts.saturating_sub(stats.video_entries)
    );
    assert!(stats.posts <= (AUTHORS as usize) * 32 * 3);
}
