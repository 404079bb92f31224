//! The reference rules and the reference bugs this store fixes, one rule each, run against the
//! three stores behind [`Store`]: the engine, the model (`SharedModel`) and the reference
//! baseline (`BaselineStore`).
//!
//! Every rule is written once, generic over [`Subject`], and [`rules!`] makes one test per store
//! (`<rule>::engine`, `<rule>::model`, `<rule>::baseline`). Where the reference has a documented
//! bug (the table at the end of `BEHAVIOUR.md`), the expectation is written as
//! `Expect { fixed, reference }`: the engine and the model are held to `fixed`, the baseline to
//! the reference's (buggy) `reference`, so each row shows the difference.
//!
//! Engine-only (at the end): batch indexes of drops (`insert_posts_with`) and deadlines.
//! Counts only the engine and the model keep (`StoreStats`) are checked through
//! [`Subject::stats`], which the baseline does not have.

use std::sync::Arc;
use std::time::{Duration, Instant};
use thunder_benches::BaselineStore;
use thunder_engine::config::{MAX_TINY_POSTS_PER_USER_SCAN, TRIM_FRACTION};
use thunder_engine::{
    DeleteEvent, DropReason, FeedQuery, InsertReport, LightPost, ManualClock, PostStore, Store,
    StoreConfig, StoreStats, TrimReport,
};
use thunder_testkit::model::SharedModel;

const NOW: i64 = 1_700_000_000;
const RETENTION: i64 = 1000;

/// Which rules a store follows on the rows of `BEHAVIOUR.md`'s table of reference bugs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rules {
    /// The reference's behaviour, bugs included (the baseline).
    Reference,
    /// `BEHAVIOUR.md`: the bugs fixed (the engine and the model).
    Fixed,
}

/// What a rule expects where the reference and the fixed store differ.
struct Expect<T> {
    /// The engine's and the model's behaviour.
    fixed: T,
    /// The reference's (the baseline's) behaviour.
    reference: T,
}

impl<T> Expect<T> {
    /// The expectation for store `S`.
    fn of<S: Subject>(self) -> T {
        match S::RULES {
            Rules::Fixed => self.fixed,
            Rules::Reference => self.reference,
        }
    }
}

/// A store the rule table runs against.
trait Subject: Store + Sized {
    /// Which behaviour it is held to.
    const RULES: Rules;
    /// A store with `RETENTION`, timelines capped at `cap`, reading time from `clock`.
    fn build(cap: usize, clock: Arc<ManualClock>) -> Self;
    /// Sizes, for the stores that keep them (not the baseline).
    fn stats(&self) -> Option<StoreStats>;
}

fn config(cap: usize, clock: Arc<ManualClock>) -> StoreConfig {
    StoreConfig {
        retention_secs: RETENTION,
        max_posting_list_size: cap,
        clock,
    }
}

impl Subject for PostStore {
    const RULES: Rules = Rules::Fixed;
    fn build(cap: usize, clock: Arc<ManualClock>) -> Self {
        PostStore::with_config(config(cap, clock))
    }
    fn stats(&self) -> Option<StoreStats> {
        Some(PostStore::stats(self))
    }
}

impl Subject for SharedModel {
    const RULES: Rules = Rules::Fixed;
    fn build(cap: usize, clock: Arc<ManualClock>) -> Self {
        SharedModel::new(config(cap, clock))
    }
    fn stats(&self) -> Option<StoreStats> {
        Some(self.lock().stats())
    }
}

impl Subject for BaselineStore {
    const RULES: Rules = Rules::Reference;
    fn build(cap: usize, clock: Arc<ManualClock>) -> Self {
        BaselineStore::with_cap(RETENTION as u64, clock, cap)
    }
    fn stats(&self) -> Option<StoreStats> {
        None
    }
}

/// One test per store for each rule.
macro_rules! rules {
    ($($rule:ident),* $(,)?) => {$(
        mod $rule {
            #[test]
            fn engine() {
                super::$rule::<thunder_engine::PostStore>();
            }
            #[test]
            fn model() {
                super::$rule::<thunder_testkit::model::SharedModel>();
            }
            #[test]
            fn baseline() {
                super::$rule::<thunder_benches::BaselineStore>();
            }
        }
    )*};
}

fn store_with_cap<S: Subject>(cap: usize) -> (S, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(NOW));
    (S::build(cap, clock.clone()), clock)
}

fn store<S: Subject>() -> (S, Arc<ManualClock>) {
    store_with_cap(5000)
}

fn original(id: i64, author: i64, at: i64) -> LightPost {
    LightPost::original(id, author, at)
}

fn reply(id: i64, author: i64, at: i64, parent: i64, parent_user: i64, conv: i64) -> LightPost {
    LightPost {
        is_reply: true,
        in_reply_to_post_id: Some(parent),
        in_reply_to_user_id: Some(parent_user),
        conversation_id: Some(conv),
        ..original(id, author, at)
    }
}

fn repost(id: i64, author: i64, at: i64, source: i64, source_user: i64) -> LightPost {
    LightPost {
        is_retweet: true,
        source_post_id: Some(source),
        source_user_id: Some(source_user),
        ..original(id, author, at)
    }
}

fn video(id: i64, author: i64, at: i64) -> LightPost {
    LightPost {
        has_video: true,
        ..original(id, author, at)
    }
}

fn ids(posts: &[LightPost]) -> Vec<i64> {
    posts.iter().map(|p| p.post_id).collect()
}

fn all(store: &impl Store, viewer: i64, authors: &[i64]) -> Vec<i64> {
    ids(&store
        .get_all_posts_by_users(&FeedQuery::new(viewer, authors))
        .posts)
}

fn videos(store: &impl Store, authors: &[i64]) -> Vec<i64> {
    ids(&store.get_videos_by_users(&FeedQuery::new(0, authors)).posts)
}

fn delete(id: i64, at: i64) -> DeleteEvent {
    DeleteEvent {
        post_id: id,
        deleted_at: at,
    }
}

rules!(
    reply_visibility_table_of_the_reference,
    answers_are_newest_first_and_truncated,
    a_small_answer_over_many_authors_reaches_past_filtered_newest_posts,
    retention_filter_keeps_the_current_second_and_drops_the_future,
    duplicates_keep_the_first_record,
    out_of_order_arrivals_stay_ordered,
    expired_posts_are_never_served_even_before_a_trim,
    deletes_use_their_own_tombstones_and_author_zero_is_real,
    a_create_after_its_delete_is_not_resurrected,
    deleted_entries_do_not_use_up_the_scan_window,
    excluded_ids_do_not_use_up_the_scan_window_either,
    the_scan_window_limits_filtered_entries,
    per_author_caps_and_clamps,
    video_eligibility_rules,
    a_repost_before_its_source_becomes_a_video_when_the_source_arrives,
    a_promoted_repost_leaves_video_answers_when_its_source_is_deleted,
    a_repost_indexed_at_insert_leaves_video_answers_when_its_source_is_deleted,
    a_repost_leaves_video_answers_when_its_source_expires,
    a_repost_whose_source_was_deleted_before_it_arrived_is_never_a_video,
    replicas_that_see_a_source_delete_in_different_orders_agree,
    reposts_that_lost_their_source_do_not_use_up_the_scan_window,
    cap_eviction_keeps_records_other_timelines_hold,
    cap_evicts_the_oldest_and_frees_its_record,
    future_deleted_at_does_not_wrap_and_counts_as_the_arrival,
    an_invalid_deleted_at_counts_as_now_and_still_blocks_its_create,
    a_delete_older_than_the_retention_still_blocks_its_create_when_it_arrives,
    a_dropped_create_raises_the_tombstone_basis_to_its_created_at,
    tombstones_outlive_the_entries_they_cover,
    tombstones_hold_across_rounds_of_expiry_and_trim,
    trim_counts_every_timeline_and_returns_memory,
    trim_only_touches_its_shard,
    repeated_authors_are_read_once_and_unknown_ones_are_fine,
    optional_zero_ids_read_back_as_none,
);

fn reply_visibility_table_of_the_reference<S: Subject>() {
    let (s, _) = store::<S>();
    let t = NOW - 100;
    s.insert_posts(&[
        LightPost {
            conversation_id: Some(1000),
            ..original(1000, 10, t)
        },
        reply(1001, 2, t + 1, 1000, 10, 1000),
        reply(1002, 3, t + 2, 1001, 2, 1000),
        reply(1003, 4, t + 3, 1001, 99, 1000),
        reply(1004, 5, t + 4, 1000, 10, 1000),
        repost(1005, 2, t + 5, 77, 1),
        reply(1006, 3, t + 6, 1002, 3, 1000),
    ]);
    let mut got = all(&s, 1, &[2, 3, 4, 5]);
    got.sort();
    assert_eq!(got, vec![1001, 1002, 1004]);
}

fn answers_are_newest_first_and_truncated<S: Subject>() {
    let (s, _) = store::<S>();
    s.insert_posts(&[
        original(1, 1, NOW - 30),
        original(2, 2, NOW - 10),
        original(3, 1, NOW - 20),
    ]);
    assert_eq!(all(&s, 0, &[1, 2]), vec![2, 3, 1]);
    let q = FeedQuery {
        max_results: 2,
        ..FeedQuery::new(0, &[1, 2])
    };
    assert_eq!(ids(&s.get_all_posts_by_users(&q).posts), vec![2, 3]);
}

/// Few results over many authors: the authors whose newest posts rank highest give nothing
/// (excluded, or a self-repost of the viewer), so the answer comes from authors ranked far
/// below them, and from the older posts of the filtered ones, still newest first.
fn a_small_answer_over_many_authors_reaches_past_filtered_newest_posts<S: Subject>() {
    let (s, _) = store::<S>();
    let viewer = 999;
    let mut posts = Vec::new();
    // Author a (1..=20) posts at NOW - a and, older, at NOW - 100 - a.
    for a in 1..=20i64 {
        posts.push(original(a, a, NOW - a));
        posts.push(original(100 + a, a, NOW - 100 - a));
    }
    // Author 3's newest is a repost of the viewer's own post: never shown to the viewer.
    posts[4] = repost(3, 3, NOW - 3, 5000, viewer);
    s.insert_posts(&posts);
    let authors: Vec<i64> = (1..=20).collect();
    let exclude: Vec<i64> = vec![1, 2, 4, 5, 6, 7, 8, 9, 10];
    let q = FeedQuery {
        max_results: 3,
        exclude: &exclude,
        ..FeedQuery::new(viewer, &authors)
    };
    assert_eq!(ids(&s.get_all_posts_by_users(&q).posts), vec![11, 12, 13]);
    let exclude: Vec<i64> = (1..=20).filter(|&id| id != 17).collect();
    let q = FeedQuery {
        max_results: 3,
        exclude: &exclude,
        ..FeedQuery::new(viewer, &authors)
    };
    assert_eq!(ids(&s.get_all_posts_by_users(&q).posts), vec![17, 101, 102]);
}

fn retention_filter_keeps_the_current_second_and_drops_the_future<S: Subject>() {
    // Bug 7: the reference dropped posts created in the current second. The baseline follows
    // the newest upstream revision, which keeps them; it has no `invalid_time` check (a
    // negative `created_at` wraps to the far future).
    let (s, _) = store::<S>();
    let r = s.insert_posts(&[
        original(1, 1, NOW),
        original(2, 1, NOW + 1),
        original(3, 1, NOW - RETENTION),
        original(4, 1, NOW - RETENTION - 1),
        original(5, 1, -5),
    ]);
    assert_eq!(
        (r.inserted, r.in_future, r.too_old, r.invalid_time),
        Expect {
            fixed: (2, 1, 1, 1),
            reference: (2, 2, 1, 0),
        }
        .of::<S>()
    );
    assert_eq!(all(&s, 0, &[1]), vec![1, 3]);
}

fn duplicates_keep_the_first_record<S: Subject>() {
    // Bug 12: the reference overwrote the record without re-indexing.
    let (s, _) = store::<S>();
    s.insert_posts(&[original(1, 1, NOW - 5)]);
    let r = s.insert_posts(&[reply(1, 1, NOW - 4, 9, 9, 9)]);
    assert_eq!(r.duplicate, 1);
    let got = s.get_all_posts_by_users(&FeedQuery::new(0, &[1])).posts;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].is_reply, got[0].created_at),
        Expect {
            fixed: (false, NOW - 5),
            reference: (true, NOW - 4),
        }
        .of::<S>(),
        "the stored record"
    );
}

fn out_of_order_arrivals_stay_ordered<S: Subject>() {
    // Bug 8: the reference only sorted at start-up.
    let (s, _) = store::<S>();
    s.insert_posts(&[original(1, 1, NOW - 10)]);
    s.insert_posts(&[original(2, 1, NOW - 30)]);
    s.insert_posts(&[original(3, 1, NOW - 20)]);
    let q = FeedQuery {
        max_originals_per_author: 2,
        ..FeedQuery::new(0, &[1])
    };
    assert_eq!(
        ids(&s.get_all_posts_by_users(&q).posts),
        Expect {
            fixed: vec![1, 3],
            reference: vec![3, 2],
        }
        .of::<S>(),
        "per-author newest two"
    );
}

fn expired_posts_are_never_served_even_before_a_trim<S: Subject>() {
    // Bug 9: the reference served posts until the trimmer came by.
    let (s, clock) = store::<S>();
    s.insert_posts(&[original(1, 1, NOW - 10), original(2, 1, NOW - 500)]);
    clock.advance(RETENTION - 100);
    assert_eq!(
        all(&s, 0, &[1]),
        Expect {
            fixed: vec![1],
            reference: vec![1, 2],
        }
        .of::<S>()
    );
    clock.advance(200);
    assert_eq!(
        all(&s, 0, &[1]),
        Expect {
            fixed: vec![],
            reference: vec![1, 2],
        }
        .of::<S>()
    );
}

fn deletes_use_their_own_tombstones_and_author_zero_is_real<S: Subject>() {
    // Bug 2: tombstones lived in a fake author 0, whose timeline they share.
    let (s, _) = store::<S>();
    s.insert_posts(&[original(1, 0, NOW - 10), original(2, 0, NOW - 9)]);
    let r = s.mark_as_deleted(&[delete(1, NOW - 1), delete(99, NOW - 1)]);
    assert_eq!((r.removed, r.tombstoned), (1, 2));
    let out = s.get_all_posts_by_users(&FeedQuery::new(0, &[0]));
    assert_eq!(ids(&out.posts), vec![2]);
    assert_eq!(
        out.eligible,
        Expect {
            fixed: 1,
            reference: 4,
        }
        .of::<S>(),
        "author 0's timeline: the reference's holds the deleted post and both tombstones"
    );
    if let Some(stats) = s.stats() {
        assert_eq!(stats.authors, 1, "no pseudo-author for tombstones");
        assert_eq!(stats.tombstones, 2);
    }
}

fn a_create_after_its_delete_is_not_resurrected<S: Subject>() {
    let (s, _) = store::<S>();
    s.mark_as_deleted(&[delete(5, NOW - 50)]);
    assert_eq!(s.insert_posts(&[original(5, 1, NOW - 60)]).tombstoned, 1);
    assert!(all(&s, 0, &[1]).is_empty());
}

fn deleted_entries_do_not_use_up_the_scan_window<S: Subject>() {
    // Bug 3: deleted ids stayed in the timeline and counted toward the 500 entries scanned.
    let (s, _) = store::<S>();
    let n = MAX_TINY_POSTS_PER_USER_SCAN as i64;
    let old: Vec<LightPost> = (0..10).map(|i| original(i, 1, NOW - 900 + i)).collect();
    let burst: Vec<LightPost> = (0..n).map(|i| original(1000 + i, 1, NOW - 100)).collect();
    s.insert_posts(&old);
    s.insert_posts(&burst);
    let deletes: Vec<DeleteEvent> = (0..n).map(|i| delete(1000 + i, NOW)).collect();
    s.mark_as_deleted(&deletes);
    assert_eq!(
        all(&s, 0, &[1]).len(),
        Expect {
            fixed: 10,
            reference: 0,
        }
        .of::<S>()
    );
}

fn excluded_ids_do_not_use_up_the_scan_window_either<S: Subject>() {
    let (s, _) = store::<S>();
    let n = MAX_TINY_POSTS_PER_USER_SCAN as i64;
    let posts: Vec<LightPost> = (0..n + 5).map(|i| original(i, 1, NOW - 900 + i)).collect();
    s.insert_posts(&posts);
    let exclude: Vec<i64> = (5..n + 5).collect();
    let q = FeedQuery {
        exclude: &exclude,
        ..FeedQuery::new(0, &[1])
    };
    assert_eq!(
        ids(&s.get_all_posts_by_users(&q).posts),
        vec![4, 3, 2, 1, 0]
    );
}

fn the_scan_window_limits_filtered_entries<S: Subject>() {
    let (s, _) = store::<S>();
    let n = MAX_TINY_POSTS_PER_USER_SCAN as i64;
    s.insert_posts(&[repost(1, 1, NOW - 999, 50, 2)]);
    let selfs: Vec<LightPost> = (0..n)
        .map(|i| repost(10 + i, 1, NOW - 500 + i, 50, 7))
        .collect();
    s.insert_posts(&selfs);
    // Viewer 7 filters all its own reposts; the older one is beyond the window.
    assert!(all(&s, 7, &[1]).is_empty());
    assert_eq!(all(&s, 8, &[1]).len(), 30, "secondary cap");
}

fn per_author_caps_and_clamps<S: Subject>() {
    let (s, _) = store::<S>();
    let mut batch: Vec<LightPost> = (0..80).map(|i| original(i, 1, NOW - 200 + i)).collect();
    batch.extend((0..40).map(|i| repost(100 + i, 1, NOW - 100 + i, 5000 + i, 3)));
    s.insert_posts(&batch);
    let got = s.get_all_posts_by_users(&FeedQuery::new(0, &[1])).posts;
    assert_eq!(got.iter().filter(|p| !p.is_retweet).count(), 50);
    assert_eq!(got.iter().filter(|p| p.is_retweet).count(), 30);
    let q = FeedQuery {
        max_originals_per_author: 500,
        max_secondary_per_author: 0,
        ..FeedQuery::new(0, &[1])
    };
    let got = s.get_all_posts_by_users(&q).posts;
    assert_eq!(
        got.len(),
        50,
        "clamped to 50, and 0 secondary skips the stage"
    );
    assert!(got.iter().all(|p| !p.is_retweet));
}

fn video_eligibility_rules<S: Subject>() {
    let (s, _) = store::<S>();
    s.insert_posts(&[
        video(1, 1, NOW - 50),
        LightPost {
            is_reply: true,
            in_reply_to_post_id: Some(1),
            ..video(2, 1, NOW - 49)
        },
        repost(3, 2, NOW - 48, 1, 1),
        original(4, 1, NOW - 47),
        repost(5, 2, NOW - 46, 4, 1),
    ]);
    assert_eq!(videos(&s, &[1, 2]), vec![3, 1]);
}

fn a_repost_before_its_source_becomes_a_video_when_the_source_arrives<S: Subject>() {
    // Bug 13: the reference never indexed such a repost as a video.
    let (s, _) = store::<S>();
    s.insert_posts(&[repost(3, 2, NOW - 40, 1, 1)]);
    assert!(videos(&s, &[2]).is_empty());
    s.insert_posts(&[video(1, 1, NOW - 50)]);
    assert_eq!(
        videos(&s, &[1, 2]),
        Expect {
            fixed: vec![3, 1],
            reference: vec![1],
        }
        .of::<S>()
    );
}

fn a_promoted_repost_leaves_video_answers_when_its_source_is_deleted<S: Subject>() {
    // Bug 13 (the reference never promotes the repost in the first place).
    let (s, _) = store::<S>();
    s.insert_posts(&[repost(3, 2, NOW - 40, 1, 1)]);
    s.insert_posts(&[video(1, 1, NOW - 50)]);
    assert_eq!(
        videos(&s, &[2]),
        Expect {
            fixed: vec![3],
            reference: vec![],
        }
        .of::<S>()
    );
    s.mark_as_deleted(&[delete(1, NOW)]);
    assert!(videos(&s, &[1, 2]).is_empty());
    // Still an ordinary repost in the feed.
    assert_eq!(all(&s, 0, &[2]), vec![3]);
}

fn a_repost_indexed_at_insert_leaves_video_answers_when_its_source_is_deleted<S: Subject>() {
    // The videos rule: the reference keeps such a repost a video after its source is deleted.
    let (s, _) = store::<S>();
    s.insert_posts(&[video(1, 1, NOW - 50)]);
    s.insert_posts(&[repost(3, 2, NOW - 40, 1, 1)]);
    assert_eq!(videos(&s, &[2]), vec![3]);
    s.mark_as_deleted(&[delete(1, NOW)]);
    assert_eq!(
        videos(&s, &[2]),
        Expect {
            fixed: vec![],
            reference: vec![3],
        }
        .of::<S>()
    );
}

fn a_repost_leaves_video_answers_when_its_source_expires<S: Subject>() {
    // The videos rule: the reference keeps such a repost a video after its source expires.
    let (s, clock) = store::<S>();
    s.insert_posts(&[video(1, 1, NOW - 500), repost(3, 2, NOW - 10, 1, 1)]);
    assert_eq!(videos(&s, &[2]), vec![3]);
    clock.advance(RETENTION - 500);
    assert_eq!(videos(&s, &[2]), vec![3]);
    clock.advance(1);
    // The repost itself is 491 s old, well inside the window; its source is not.
    assert_eq!(
        videos(&s, &[2]),
        Expect {
            fixed: vec![],
            reference: vec![3],
        }
        .of::<S>()
    );
    assert_eq!(all(&s, 0, &[2]), vec![3]);
}

fn a_repost_whose_source_was_deleted_before_it_arrived_is_never_a_video<S: Subject>() {
    let (s, _) = store::<S>();
    s.insert_posts(&[video(1, 1, NOW - 50)]);
    s.mark_as_deleted(&[delete(1, NOW)]);
    s.insert_posts(&[repost(3, 2, NOW - 40, 1, 1)]);
    // The source cannot come back while its tombstone lives.
    assert_eq!(s.insert_posts(&[video(1, 1, NOW - 50)]).tombstoned, 1);
    assert!(videos(&s, &[1, 2]).is_empty());
    // Delete before the source was ever stored: same.
    s.mark_as_deleted(&[delete(11, NOW)]);
    s.insert_posts(&[repost(13, 2, NOW - 30, 11, 1)]);
    s.insert_posts(&[video(11, 1, NOW - 35)]);
    assert!(videos(&s, &[1, 2]).is_empty());
}

fn replicas_that_see_a_source_delete_in_different_orders_agree<S: Subject>() {
    // Creates keyed by author, deletes by post id: the cross-partition order varies. Bug 13 and
    // the videos rule: the reference's video answers depend on that order.
    let orders: [&[u8]; 6] = [b"SRD", b"SDR", b"RSD", b"RDS", b"DSR", b"DRS"];
    let mut answers = Vec::new();
    for order in orders {
        let (s, _) = store::<S>();
        for event in order {
            match event {
                b'S' => {
                    s.insert_posts(&[video(1, 1, NOW - 50)]);
                }
                b'R' => {
                    s.insert_posts(&[repost(3, 2, NOW - 40, 1, 1), repost(4, 2, NOW - 30, 5, 1)]);
                }
                _ => {
                    s.mark_as_deleted(&[delete(1, NOW)]);
                }
            }
            s.insert_posts(&[video(5, 1, NOW - 45)]);
        }
        let order = std::str::from_utf8(order).unwrap();
        if S::RULES == Rules::Fixed {
            assert_eq!(videos(&s, &[1, 2]), vec![4, 5], "order {order}");
        }
        assert_eq!(all(&s, 0, &[1, 2]), vec![4, 3, 5], "order {order}");
        answers.push(videos(&s, &[1, 2]));
    }
    answers.sort();
    answers.dedup();
    assert_eq!(
        answers.len(),
        Expect {
            fixed: 1,
            reference: 3,
        }
        .of::<S>(),
        "distinct video answers over the six orders: {answers:?}"
    );
}

fn reposts_that_lost_their_source_do_not_use_up_the_scan_window<S: Subject>() {
    // An entry that one replica holds but may not return must behave like one it never
    // indexed: skipped, and not counted toward the 500 entries scanned. The reference keeps
    // returning the reposts (videos rule).
    let (s, _) = store::<S>();
    let n = MAX_TINY_POSTS_PER_USER_SCAN as i64;
    s.insert_posts(&[video(1, 1, NOW - 900), video(2, 9, NOW - 950)]);
    let reposts: Vec<LightPost> = (0..n + 10)
        .map(|i| repost(100 + i, 1, NOW - 800 + i, 2, 9))
        .collect();
    s.insert_posts(&reposts);
    assert_eq!(videos(&s, &[1]).len(), 100, "per-author video cap");
    s.mark_as_deleted(&[delete(2, NOW)]);
    assert_eq!(
        videos(&s, &[1]),
        Expect {
            fixed: vec![1],
            reference: (n + 10 - 100..n + 10).rev().map(|i| 100 + i).collect(),
        }
        .of::<S>()
    );
    let q = FeedQuery::new(0, &[1]);
    assert_eq!(
        s.get_videos_by_users(&q).eligible,
        n as usize + 11,
        "eligible still counts every entry of the videos timeline"
    );
}

fn cap_eviction_keeps_records_other_timelines_hold<S: Subject>() {
    // Bug 1: evicting an original video from the videos timeline dropped its record.
    let (s, _) = store_with_cap::<S>(3);
    s.insert_posts(&[video(50, 9, NOW - 95)]);
    s.insert_posts(&[video(1, 1, NOW - 100)]);
    s.insert_posts(&[repost(2, 1, NOW - 90, 50, 9), repost(3, 1, NOW - 80, 50, 9)]);
    // Author 1's videos timeline: 1, 2, 3 — now a fourth evicts the original video 1 from it.
    s.insert_posts(&[video(4, 1, NOW - 70)]);
    assert_eq!(videos(&s, &[1]), vec![4, 3, 2]);
    assert_eq!(
        all(&s, 0, &[1]).contains(&1),
        Expect {
            fixed: true,
            reference: false,
        }
        .of::<S>(),
        "still served from the originals timeline"
    );
    if let Some(stats) = s.stats() {
        assert_eq!(stats.video_entries, 4);
    }
}

fn cap_evicts_the_oldest_and_frees_its_record<S: Subject>() {
    let (s, _) = store_with_cap::<S>(3);
    s.insert_posts(
        &(0..5)
            .map(|i| original(i, 1, NOW - 100 + i))
            .collect::<Vec<_>>(),
    );
    assert_eq!(all(&s, 0, &[1]), vec![4, 3, 2]);
    assert_eq!(s.stored_posts(), 3);
    // Older than everything in a full timeline: evicted on arrival. The reference appends it
    // (bug 8) and evicts the oldest entry in its place.
    s.insert_posts(&[original(9, 1, NOW - 500)]);
    assert_eq!(s.stored_posts(), 3);
    assert_eq!(
        all(&s, 0, &[1]),
        Expect {
            fixed: vec![4, 3, 2],
            reference: vec![4, 3, 9],
        }
        .of::<S>()
    );
}

/// 3000-01-01, unix seconds.
const YEAR_3000: i64 = 32_503_680_000;

fn future_deleted_at_does_not_wrap_and_counts_as_the_arrival<S: Subject>() {
    // Bug 10: u64 arithmetic underflowed on a deleted_at in the future (the reference's
    // tombstones expire at the first trim). Here a tombstone lives at most the retention from
    // its arrival, whatever deleted_at says.
    let (s, clock) = store::<S>();
    s.mark_as_deleted(&[delete(7, YEAR_3000), delete(8, i64::MAX)]);
    assert_eq!(s.insert_posts(&[original(7, 1, NOW - 5)]).tombstoned, 1);
    clock.advance(RETENTION);
    assert_eq!(
        s.trim_all().tombstones_expired,
        Expect {
            fixed: 0,
            reference: 2,
        }
        .of::<S>()
    );
    if let Some(stats) = s.stats() {
        assert_eq!(stats.tombstones, 2);
    }
    clock.advance(1);
    assert_eq!(
        s.trim_all().tombstones_expired,
        Expect {
            fixed: 2,
            reference: 0,
        }
        .of::<S>()
    );
    if let Some(stats) = s.stats() {
        assert_eq!(stats.tombstones, 0);
    }
    assert_eq!(s.insert_posts(&[original(7, 1, NOW + 1)]).inserted, 1);
}

fn an_invalid_deleted_at_counts_as_now_and_still_blocks_its_create<S: Subject>() {
    // Bug 10: the reference expires tombstones with deleted_at <= 0 at the first trim.
    let (s, clock) = store::<S>();
    s.mark_as_deleted(&[delete(7, 0), delete(8, -1)]);
    let r = s.insert_posts(&[original(7, 1, NOW - 1), original(8, 1, NOW - 1)]);
    assert_eq!(r.tombstoned, 2);
    clock.advance(RETENTION);
    assert_eq!(
        s.trim_all().tombstones_expired,
        Expect {
            fixed: 0,
            reference: 2,
        }
        .of::<S>()
    );
    clock.advance(1);
    assert_eq!(
        s.trim_all().tombstones_expired,
        Expect {
            fixed: 2,
            reference: 0,
        }
        .of::<S>()
    );
}

fn a_delete_older_than_the_retention_still_blocks_its_create_when_it_arrives<S: Subject>() {
    // Order independence: had the create come first, the delete would have removed it. The
    // reference's tombstone expires by deleted_at alone (bug 10).
    let (s, clock) = store::<S>();
    s.mark_as_deleted(&[delete(7, NOW - 10 * RETENTION)]);
    assert_eq!(s.insert_posts(&[original(7, 1, NOW - 3)]).tombstoned, 1);
    assert!(all(&s, 0, &[1]).is_empty());
    // The dropped create raised the basis to its created_at: it lives as long as the post could.
    clock.advance(RETENTION - 3);
    assert_eq!(
        s.trim_all().tombstones_expired,
        Expect {
            fixed: 0,
            reference: 1,
        }
        .of::<S>()
    );
    assert_eq!(
        s.insert_posts(&[original(7, 1, NOW - 3)]).tombstoned,
        Expect {
            fixed: 1,
            reference: 0,
        }
        .of::<S>()
    );
    clock.advance(1);
    assert_eq!(
        s.trim_all().tombstones_expired,
        Expect {
            fixed: 1,
            reference: 0,
        }
        .of::<S>()
    );
}

fn a_dropped_create_raises_the_tombstone_basis_to_its_created_at<S: Subject>() {
    // The reference's basis is deleted_at alone (bug 10).
    let (s, clock) = store::<S>();
    s.mark_as_deleted(&[delete(7, NOW - 500), delete(8, NOW - 500)]);
    assert_eq!(s.insert_posts(&[original(7, 1, NOW - 100)]).tombstoned, 1);
    // 8's basis stays NOW - 500; 7's is now NOW - 100.
    clock.advance(RETENTION - 499);
    assert_eq!(
        s.trim_all().tombstones_expired,
        Expect {
            fixed: 1,
            reference: 2,
        }
        .of::<S>()
    );
    assert_eq!(s.insert_posts(&[original(8, 1, NOW)]).inserted, 1);
    let r = s.insert_posts(&[original(7, 1, NOW - 100)]);
    assert_eq!(
        (r.tombstoned, r.inserted),
        Expect {
            fixed: (1, 0),
            reference: (0, 1),
        }
        .of::<S>()
    );
    clock.advance(400);
    assert_eq!(
        s.trim_all().tombstones_expired,
        Expect {
            fixed: 1,
            reference: 0,
        }
        .of::<S>()
    );
    let r = s.insert_posts(&[original(7, 1, NOW)]);
    assert_eq!(
        (r.inserted, r.duplicate),
        Expect {
            fixed: (1, 0),
            reference: (0, 1),
        }
        .of::<S>()
    );
}

fn tombstones_outlive_the_entries_they_cover<S: Subject>() {
    // The reference's basis is deleted_at alone (bug 10): the post can come back.
    let (s, clock) = store::<S>();
    s.insert_posts(&[original(1, 1, NOW)]);
    // A delete stamped before the post's own creation (producer clock behind).
    s.mark_as_deleted(&[delete(1, NOW - RETENTION)]);
    clock.advance(RETENTION / 2);
    assert_eq!(
        s.trim_all().tombstones_expired,
        Expect {
            fixed: 0,
            reference: 1,
        }
        .of::<S>(),
        "basis is the post's created_at"
    );
    let r = s.insert_posts(&[original(1, 1, NOW)]);
    assert_eq!(
        (r.tombstoned, r.inserted),
        Expect {
            fixed: (1, 0),
            reference: (0, 1),
        }
        .of::<S>()
    );
}

fn tombstones_hold_across_rounds_of_expiry_and_trim<S: Subject>() {
    // Enough deletes for the engine's trims to renew its tombstone filter on the way (once
    // the ids added since the last renewal reach twice the live tombstones, and 65,536; see
    // `tombstone_filter.rs`): a tombstone live at a trim, or written after it, must still
    // block its create.
    let (s, clock) = store::<S>();
    let per_round = 70_000i64;
    let mut now = NOW;
    for round in 0..3 {
        let first = round * 1_000_000;
        let deletes: Vec<DeleteEvent> = (first..first + per_round)
            .map(|id| delete(id, now))
            .collect();
        for batch in deletes.chunks(1000) {
            s.mark_as_deleted(batch);
        }
        // This round's tombstones outlive the trim; the round before's expire at it.
        clock.advance(RETENTION * 3 / 4);
        now += RETENTION * 3 / 4;
        s.mark_as_deleted(&[delete(first + 900_000, now)]);
        let expired = s.trim_all().tombstones_expired;
        if round == 0 {
            assert_eq!(expired, 0);
        } else {
            assert!(
                expired >= per_round as usize - 4,
                "round {round}: {expired}"
            );
        }
        s.mark_as_deleted(&[delete(first + 900_001, now)]);
        let held = [
            first,
            first + per_round - 1,
            first + 900_000,
            first + 900_001,
        ];
        let creates: Vec<LightPost> = held.iter().map(|&id| original(id, 1, now - 1)).collect();
        let r = s.insert_posts(&creates);
        assert_eq!((r.tombstoned, r.inserted), (4, 0), "round {round}");
        if round > 0 {
            // The round before's tombstones expired: their creates go in.
            let before = first - 1_000_000;
            let r = s.insert_posts(&[
                original(before + 5, 1, now - 1),
                original(before + 6, 1, now - 1),
            ]);
            assert_eq!((r.tombstoned, r.inserted), (0, 2), "round {round}");
        }
    }
}

fn trim_counts_every_timeline_and_returns_memory<S: Subject>() {
    // Bug 11: video trims were not counted (the reference counts tombstone-list entries).
    let (s, clock) = store::<S>();
    s.insert_posts(&[
        video(1, 1, NOW - 10),
        video(4, 4, NOW - 10),
        original(2, 2, NOW - 10),
        reply(3, 3, NOW - 5, 2, 2, 2),
    ]);
    s.mark_as_deleted(&[delete(99, NOW)]);
    clock.advance(RETENTION + 20);
    let total: TrimReport = (0..TRIM_FRACTION).map(|shard| s.trim(shard)).sum();
    assert_eq!(
        total.entries_removed,
        Expect {
            fixed: 6,
            reference: 5,
        }
        .of::<S>(),
        "originals + videos + secondary entries (reference: + tombstones - videos)"
    );
    assert_eq!(
        (
            total.posts_freed,
            total.authors_dropped,
            total.tombstones_expired
        ),
        (4, 4, 1)
    );
    assert_eq!(s.stored_posts(), 0);
    if let Some(st) = s.stats() {
        assert_eq!(
            (st.posts, st.authors, st.tombstones, st.arena_bytes_used),
            (0, 0, 0, 0)
        );
        assert_eq!(
            st.original_entries + st.secondary_entries + st.video_entries,
            0
        );
    }
}

fn trim_only_touches_its_shard<S: Subject>() {
    let (s, clock) = store::<S>();
    s.insert_posts(&[original(1, 1, NOW - 10), original(2, 2, NOW - 10)]);
    clock.advance(RETENTION);
    let r = s.trim(1);
    assert_eq!(r.entries_removed, 1);
    assert_eq!(s.stored_posts(), 1);
}

fn repeated_authors_are_read_once_and_unknown_ones_are_fine<S: Subject>() {
    // The reference reads a repeated author again.
    let (s, _) = store::<S>();
    s.insert_posts(&[original(1, 1, NOW - 10)]);
    assert_eq!(
        all(&s, 0, &[1, 1, 42, 1]),
        Expect {
            fixed: vec![1],
            reference: vec![1, 1, 1],
        }
        .of::<S>()
    );
    assert_eq!(
        s.get_all_posts_by_users(&FeedQuery::new(0, &[1, 1]))
            .eligible,
        Expect {
            fixed: 1,
            reference: 2,
        }
        .of::<S>()
    );
}

fn optional_zero_ids_read_back_as_none<S: Subject>() {
    let (s, _) = store::<S>();
    s.insert_posts(&[LightPost {
        conversation_id: Some(0),
        source_user_id: Some(0),
        ..original(1, 1, NOW)
    }]);
    let got = s.get_all_posts_by_users(&FeedQuery::new(0, &[1])).posts;
    assert_eq!(got, vec![original(1, 1, NOW)]);
}

// ---- engine-only: batch indexes of drops, deadlines ----

fn engine_store() -> PostStore {
    store::<PostStore>().0
}

#[test]
fn drops_are_counted_by_reason_with_their_batch_index() {
    let s = engine_store();
    s.insert_posts(&[original(1, 1, NOW - 5)]);
    s.mark_as_deleted(&[delete(2, NOW)]);
    let mut drops = Vec::new();
    let batch = [
        original(3, 1, NOW),
        original(2, 1, NOW - 1),
        original(4, 1, NOW + 1),
        original(1, 1, NOW - 7),
        original(5, 1, NOW - RETENTION - 1),
        original(6, 1, 0),
        original(3, 1, NOW - 2),
        original(7, 1, i64::MAX),
        original(8, 1, i64::from(u32::MAX) + 1),
        original(9, 1, i64::MIN),
    ];
    let r = s.insert_posts_with(&batch, |index, reason| drops.push((index, reason)));
    assert_eq!(
        r,
        InsertReport {
            inserted: 1,
            invalid_time: 4,
            in_future: 1,
            too_old: 1,
            tombstoned: 1,
            duplicate: 2,
            no_slot: 0,
        }
    );
    assert_eq!(r.inserted + r.dropped(), batch.len());
    for reason in DropReason::ALL {
        assert_eq!(
            drops.iter().filter(|(_, why)| *why == reason).count(),
            r.dropped_for(reason),
            "{reason}"
        );
    }
    // Time checks in batch order (invalid first: i64::MAX is not "in the future"), then the
    // others in the order the batch is applied (created_at, then batch order).
    assert_eq!(
        drops,
        [
            (2, DropReason::InFuture),
            (4, DropReason::TooOld),
            (5, DropReason::InvalidTime),
            (7, DropReason::InvalidTime),
            (8, DropReason::InvalidTime),
            (9, DropReason::InvalidTime),
            (3, DropReason::Duplicate),
            (1, DropReason::Tombstoned),
            (0, DropReason::Duplicate),
        ]
    );
    let labels: Vec<&str> = DropReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        labels,
        [
            "too_old",
            "in_future",
            "invalid_time",
            "tombstoned",
            "duplicate",
            "no_slot"
        ]
    );
    // insert_posts is the same without the callback.
    assert_eq!(
        s.insert_posts(&batch),
        InsertReport {
            invalid_time: 4,
            in_future: 1,
            too_old: 1,
            tombstoned: 1,
            duplicate: 3,
            ..InsertReport::default()
        }
    );
}

#[test]
fn a_passed_deadline_returns_partial_results() {
    let s = engine_store();
    let posts: Vec<LightPost> = (0..2000).map(|i| original(i, i, NOW - 10)).collect();
    s.insert_posts(&posts);
    let authors: Vec<i64> = (0..2000).collect();
    let q = FeedQuery {
        deadline: Some(Instant::now() - Duration::from_secs(1)),
        ..FeedQuery::new(0, &authors)
    };
    let out = s.get_all_posts_by_users(&q);
    assert!(out.timed_out);
    assert!(out.posts.len() < 2000);
    let q = FeedQuery {
        deadline: Some(Instant::now() + Duration::from_secs(3600)),
        ..FeedQuery::new(0, &authors)
    };
    let out = s.get_all_posts_by_users(&q);
    assert!(!out.timed_out);
    assert_eq!(out.posts.len(), 1200);
}
