//! `PostStore::explain`, one verdict at a time, with its figures: each case builds the store
//! that makes the rule decide, checks the engine's verdict (which its query gives) and the
//! model's (which names the rule by its own reading of `BEHAVIOUR.md`). The random stores and
//! queries of `model_equivalence.rs` check the same agreement at large.

use std::sync::Arc;
use std::time::Instant;

use thunder_engine::{
    AnswerWindow, Clock, DeleteEvent, LightPost, ManualClock, OwnedQuery, PagePosition, PostState,
    PostStore, ReplyRuleMiss, SeenFilter, ShardId, Store, StoreConfig, TimelineKind, TimelinePlace,
    Verdict,
};
use thunder_testkit::model::ModelStore;

const NOW: i64 = 1_700_000_000;
const RETENTION: i64 = 1000;
const VIEWER: i64 = 1;

/// An engine and a model fed the same posts, on one clock.
struct Pair {
    clock: Arc<ManualClock>,
    engine: PostStore,
    model: ModelStore,
}

impl Pair {
    fn new() -> Self {
        let clock = Arc::new(ManualClock::new(NOW));
        let config = || StoreConfig {
            retention_secs: RETENTION,
            max_posting_list_size: 5000,
            clock: clock.clone(),
        };
        Self {
            engine: PostStore::with_config(config()),
            model: ModelStore::with_config(config()),
            clock,
        }
    }

    fn insert(&mut self, posts: &[LightPost]) {
        assert_eq!(
            self.engine.insert_posts(posts),
            self.model.insert_posts(posts)
        );
    }

    fn delete(&mut self, post_id: i64) {
        let event = [DeleteEvent {
            post_id,
            deleted_at: self.clock.now_secs(),
        }];
        self.engine.mark_as_deleted(&event);
        self.model.mark_as_deleted(&event);
    }

    /// The verdicts on `post_ids`, the engine's and the model's being equal (whole
    /// explanations: states, timeline places and verdicts).
    fn verdicts(&self, query: &OwnedQuery, post_ids: &[i64]) -> Vec<Verdict> {
        let engine = self.engine.explain(&query.feed(), query.videos, post_ids);
        let model = self.model.explain(query, post_ids);
        assert_eq!(engine.posts, model);
        assert_eq!(engine.outcome.posts, self.engine.answer(query).posts);
        engine.posts.iter().map(|p| p.verdict).collect()
    }
}

fn feed(authors: &[i64]) -> OwnedQuery {
    OwnedQuery::new(false, VIEWER, authors.to_vec())
}

fn original(id: i64, author: i64, secs_ago: i64) -> LightPost {
    LightPost::original(id, author, NOW - secs_ago)
}

fn reply(id: i64, author: i64, secs_ago: i64, parent: (i64, i64), conversation: i64) -> LightPost {
    LightPost {
        is_reply: true,
        in_reply_to_post_id: Some(parent.0),
        in_reply_to_user_id: Some(parent.1),
        conversation_id: Some(conversation),
        ..original(id, author, secs_ago)
    }
}

fn repost(id: i64, author: i64, secs_ago: i64, source: (i64, i64)) -> LightPost {
    LightPost {
        is_retweet: true,
        source_post_id: Some(source.0),
        source_user_id: Some(source.1),
        ..original(id, author, secs_ago)
    }
}

#[test]
fn what_the_store_holds_and_where() {
    let mut pair = Pair::new();
    pair.insert(&[
        original(1, 7, 30),
        LightPost {
            has_video: true,
            ..original(2, 7, 20)
        },
        original(3, 7, 10),
    ]);
    pair.delete(3);
    let explained = pair.engine.explain(&feed(&[7]).feed(), false, &[2, 3, 99]);
    assert_eq!(
        explained.posts[0].state,
        PostState::Stored {
            post: LightPost {
                has_video: true,
                ..original(2, 7, 20)
            },
            expired: false,
            timelines: vec![
                TimelinePlace {
                    timeline: TimelineKind::Originals,
                    position: 1,
                    len: 2
                },
                TimelinePlace {
                    timeline: TimelineKind::Videos,
                    position: 1,
                    len: 1
                },
            ],
        }
    );
    assert_eq!(
        explained.posts[0].verdict,
        Verdict::Returned { position: 1 }
    );
    assert_eq!(explained.posts[1].state, PostState::Deleted);
    assert_eq!(explained.posts[1].verdict, Verdict::Deleted);
    assert_eq!(explained.posts[2].state, PostState::NeverSeen);
    assert_eq!(explained.posts[2].verdict, Verdict::NeverSeen);
    pair.verdicts(&feed(&[7]), &[1, 2, 3, 99]);
}

#[test]
fn returned_posts_carry_their_position_and_the_cut_its_rank() {
    let mut pair = Pair::new();
    pair.insert(&(1..=6).map(|i| original(i, 7, 100 - i)).collect::<Vec<_>>());
    let mut query = feed(&[7, 8]);
    query.max_results = 2;
    assert_eq!(
        pair.verdicts(&query, &[6, 5, 4, 1]),
        [
            Verdict::Returned { position: 1 },
            Verdict::Returned { position: 2 },
            Verdict::CutByMaxResults { rank: 3 },
            Verdict::CutByMaxResults { rank: 6 },
        ]
    );
    // The next page: what comes at or before its position was in an earlier page.
    query.window.after = Some(PagePosition {
        created_at: NOW - 95,
        post_id: 5,
    });
    assert_eq!(
        pair.verdicts(&query, &[6, 5, 4, 3, 2]),
        [
            Verdict::BeforeCursor,
            Verdict::BeforeCursor,
            Verdict::Returned { position: 1 },
            Verdict::Returned { position: 2 },
            Verdict::CutByMaxResults { rank: 3 },
        ]
    );
    // An answer of none still ranks what it leaves out.
    query.max_results = 0;
    query.window = AnswerWindow::ALL;
    assert_eq!(
        pair.verdicts(&query, &[6]),
        [Verdict::CutByMaxResults { rank: 1 }]
    );
}

#[test]
fn per_author_cap_and_the_stage_turned_off() {
    let mut pair = Pair::new();
    pair.insert(&(1..=5).map(|i| original(i, 7, 100 - i)).collect::<Vec<_>>());
    pair.insert(&[repost(10, 7, 50, (500, 9))]);
    let mut query = feed(&[7]);
    query.max_originals_per_author = 2;
    query.max_secondary_per_author = 0;
    assert_eq!(
        pair.verdicts(&query, &[5, 4, 3, 1, 10]),
        [
            Verdict::Returned { position: 1 },
            Verdict::Returned { position: 2 },
            Verdict::PerAuthorCap {
                limit: 2,
                newer_entries: 2
            },
            Verdict::PerAuthorCap {
                limit: 2,
                newer_entries: 4
            },
            Verdict::PerAuthorCap {
                limit: 0,
                newer_entries: 0
            },
        ]
    );
}

#[test]
fn skipped_entries_name_their_list_or_bound() {
    let mut pair = Pair::new();
    pair.insert(
        &(1..=6)
            .map(|i| original(i, 7, 100 - i * 10))
            .collect::<Vec<_>>(),
    );
    let mut query = feed(&[7]);
    query.exclude = vec![5];
    let mut seen = SeenFilter::with_blocks(4, 3);
    seen.insert(4);
    query.seen = Some(seen);
    query.window.max_created_at = Some(NOW - 45);
    query.window.min_created_at = Some(NOW - 75);
    assert_eq!(
        pair.verdicts(&query, &[6, 5, 4, 3, 2, 1]),
        [
            Verdict::AfterUpperBound {
                upper_bound: NOW - 45
            },
            Verdict::Excluded,
            Verdict::Seen,
            Verdict::Returned { position: 1 },
            Verdict::BeforeMinCreatedAt {
                min_created_at: NOW - 75
            },
            Verdict::BeforeMinCreatedAt {
                min_created_at: NOW - 75
            },
        ]
    );
}

#[test]
fn expired_posts_and_unfollowed_authors() {
    let mut pair = Pair::new();
    pair.insert(&[original(1, 7, 900), original(2, 7, 10), original(3, 8, 10)]);
    pair.clock.advance(200);
    assert_eq!(
        pair.verdicts(&feed(&[7]), &[2, 1, 3]),
        [
            Verdict::Returned { position: 1 },
            Verdict::Expired,
            Verdict::AuthorNotFollowed,
        ]
    );
    // A timeline whose newest entry has expired is not read at all.
    pair.clock.advance(RETENTION);
    assert_eq!(pair.verdicts(&feed(&[7]), &[2]), [Verdict::Expired]);
}

#[test]
fn reply_rule_misses_are_told_apart() {
    let mut pair = Pair::new();
    pair.insert(&[
        original(100, 9, 500),
        reply(101, 9, 400, (100, 9), 100),
        original(102, 9, RETENTION - 1),
    ]);
    pair.clock.advance(2);
    pair.insert(&[
        reply(1, 7, 50, (555, 9), 555), // parent never seen
        reply(2, 7, 40, (102, 9), 102), // parent expired
        reply(3, 7, 30, (101, 9), 999), // parent a reply, another conversation
        reply(4, 7, 20, (101, 5), 100), // replies to 5, not followed
        reply(5, 7, 10, (101, 9), 100), // replies to 9, followed
        repost(6, 7, 5, (777, VIEWER)), // the viewer's own post
    ]);
    assert_eq!(
        pair.verdicts(&feed(&[7, 9]), &[1, 2, 3, 4, 5, 6]),
        [
            Verdict::ReplyRule(ReplyRuleMiss::ParentMissing),
            Verdict::ReplyRule(ReplyRuleMiss::ParentExpired),
            Verdict::ReplyRule(ReplyRuleMiss::ConversationMismatch),
            Verdict::ReplyRule(ReplyRuleMiss::ReplyToUnfollowed),
            Verdict::Returned { position: 1 },
            Verdict::ViewerOwnRepost,
        ]
    );
}

#[test]
fn videos_rule_and_posts_no_video_timeline_holds() {
    let mut pair = Pair::new();
    pair.insert(&[
        LightPost {
            has_video: true,
            ..original(1, 8, 100)
        },
        original(2, 7, 90),
        repost(3, 7, 80, (1, 8)),
    ]);
    let mut query = feed(&[7]);
    query.videos = true;
    assert_eq!(
        pair.verdicts(&query, &[3, 2]),
        [Verdict::Returned { position: 1 }, Verdict::NotInTimeline]
    );
    // The source deleted: the repost stays in the videos timeline, but is no video now.
    pair.delete(1);
    assert_eq!(pair.verdicts(&query, &[3]), [Verdict::VideoRule]);
}

#[test]
fn the_scan_window_counts_what_it_examined() {
    let mut pair = Pair::new();
    // The newest 500 repost the viewer's post: examined, dropped, and the window is used up.
    let posts: Vec<LightPost> = (0..600)
        .map(|i| repost(i, 3, 600 - i, (5000, if i < 100 { 2 } else { VIEWER })))
        .collect();
    pair.insert(&posts);
    let mut query = feed(&[3]);
    assert_eq!(
        pair.verdicts(&query, &[599, 99, 0]),
        [
            Verdict::ViewerOwnRepost,
            Verdict::ScanWindow { newer_entries: 500 },
            Verdict::ScanWindow { newer_entries: 599 },
        ]
    );
    // An excluded entry does not count: one more is examined.
    query.exclude = vec![550];
    assert_eq!(
        pair.verdicts(&query, &[550, 99, 98]),
        [
            Verdict::Excluded,
            Verdict::Returned { position: 1 },
            Verdict::ScanWindow { newer_entries: 501 },
        ]
    );
}

#[test]
fn a_query_out_of_time_leaves_the_rest_unreached() {
    let store = PostStore::with_clock(RETENTION, Arc::new(ManualClock::new(NOW)));
    // Authors are resolved 64 at a time, the deadline looked at between windows.
    let authors: Vec<i64> = (1..=200).collect();
    let posts: Vec<LightPost> = authors.iter().map(|&a| original(a, a, 10)).collect();
    store.insert_posts(&posts);
    let mut query = feed(&authors);
    query.deadline = Some(Instant::now());
    let explained = store.explain(&query.feed(), false, &[64, 200]);
    assert!(explained.outcome.timed_out);
    // Equal times: the larger id first, so 64 is the first of the first window's posts.
    assert_eq!(
        explained.posts[0].verdict,
        Verdict::Returned { position: 1 }
    );
    assert_eq!(explained.posts[1].verdict, Verdict::OutOfTime);
}

#[test]
fn a_shard_names_the_posts_of_other_shards() {
    let store = PostStore::with_clock(RETENTION, Arc::new(ManualClock::new(NOW)))
        .with_author_shard(ShardId { index: 0, count: 2 }, |author| author % 2 == 0);
    store.insert_posts(&[original(1, 2, 10), original(2, 3, 10)]);
    let explained = store.explain(&feed(&[2, 3]).feed(), false, &[1, 2]);
    assert_eq!(
        explained.posts[0].verdict,
        Verdict::Returned { position: 1 }
    );
    assert_eq!(explained.posts[1].state, PostState::OtherShard);
    assert_eq!(explained.posts[1].verdict, Verdict::OtherShard);
}
