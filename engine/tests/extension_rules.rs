//! The rules of the contract extensions (`BEHAVIOUR.md`, "Answer order, paging, time bounds and
//! the seen filter"), one rule each, on the engine and on the model. (The reference baseline
//! has none of them.)

use std::sync::Arc;

use thunder_engine::{
    AnswerWindow, FeedQuery, LightPost, ManualClock, PagePosition, PostStore, SeenFilter, Store,
    StoreConfig,
};
use thunder_testkit::model::SharedModel;

const NOW: i64 = 1_700_000_000;
const RETENTION: i64 = 1000;

fn stores() -> Vec<(Box<dyn Store>, Arc<ManualClock>)> {
    let build = |model: bool| {
        let clock = Arc::new(ManualClock::new(NOW));
        let config = StoreConfig {
            retention_secs: RETENTION,
            max_posting_list_size: 5000,
            clock: clock.clone(),
        };
        let store: Box<dyn Store> = if model {
            Box::new(SharedModel::new(config))
        } else {
            Box::new(PostStore::with_config(config))
        };
        (store, clock)
    };
    vec![build(false), build(true)]
}

fn ids(posts: &[LightPost]) -> Vec<i64> {
    posts.iter().map(|p| p.post_id).collect()
}

fn original(id: i64, author: i64, at: i64) -> LightPost {
    LightPost::original(id, author, at)
}

#[test]
fn seen_posts_do_not_count_toward_per_author_limits() {
    for (store, _) in stores() {
        let posts: Vec<LightPost> = (1..=10).map(|i| original(i, 1, NOW - 100 + i)).collect();
        store.insert_posts(&posts);
        let mut seen = SeenFilter::with_blocks(4, 9);
        seen.insert(10);
        seen.insert(9);
        let q = FeedQuery {
            max_originals_per_author: 3,
            seen: Some(&seen),
            exclude: &[7],
            ..FeedQuery::new(0, &[1])
        };
        assert_eq!(
            ids(&store.get_all_posts_by_users(&q).posts),
            [8, 6, 5],
            "{}",
            store.name()
        );
    }
}

#[test]
fn ties_are_answered_by_descending_id_and_a_cut_follows_that_order() {
    for (store, _) in stores() {
        // Inserted in an order unrelated to their ids, across three authors.
        store.insert_posts(&[
            original(5, 1, NOW - 10),
            original(9, 2, NOW - 10),
            original(2, 3, NOW - 10),
            original(7, 1, NOW - 10),
            original(1, 2, NOW - 20),
        ]);
        let q = |max_results, after| FeedQuery {
            max_results,
            window: AnswerWindow {
                after,
                ..AnswerWindow::ALL
            },
            ..FeedQuery::new(0, &[1, 2, 3])
        };
        let name = store.name();
        assert_eq!(
            ids(&store.get_all_posts_by_users(&q(10, None)).posts),
            [9, 7, 5, 2, 1],
            "{name}"
        );
        assert_eq!(
            ids(&store.get_all_posts_by_users(&q(2, None)).posts),
            [9, 7],
            "{name}"
        );
        // Continue inside the tie group at NOW - 10.
        let after = Some(PagePosition {
            created_at: NOW - 10,
            post_id: 7,
        });
        assert_eq!(
            ids(&store.get_all_posts_by_users(&q(2, after)).posts),
            [5, 2],
            "{name}"
        );
        let after = Some(PagePosition {
            created_at: NOW - 10,
            post_id: 2,
        });
        assert_eq!(
            ids(&store.get_all_posts_by_users(&q(2, after)).posts),
            [1],
            "{name}"
        );
    }
}

#[test]
fn candidates_before_the_position_still_count_toward_their_authors_limit() {
    for (store, _) in stores() {
        let posts: Vec<LightPost> = (1..=10).map(|i| original(i, 1, NOW - 100 + i)).collect();
        store.insert_posts(&posts);
        let q = FeedQuery {
            max_originals_per_author: 4,
            max_results: 2,
            window: AnswerWindow {
                after: Some(PagePosition {
                    created_at: NOW - 100 + 9,
                    post_id: 9,
                }),
                ..AnswerWindow::ALL
            },
            ..FeedQuery::new(0, &[1])
        };
        // The whole answer is 10, 9, 8, 7: after 9 come 8 and 7, then nothing.
        assert_eq!(
            ids(&store.get_all_posts_by_users(&q).posts),
            [8, 7],
            "{}",
            store.name()
        );
        let q = FeedQuery {
            window: AnswerWindow {
                after: Some(PagePosition {
                    created_at: NOW - 100 + 7,
                    post_id: 7,
                }),
                ..AnswerWindow::ALL
            },
            ..q
        };
        assert!(
            store.get_all_posts_by_users(&q).posts.is_empty(),
            "{}",
            store.name()
        );
    }
}

#[test]
fn time_bounds_treat_posts_outside_as_absent() {
    for (store, _) in stores() {
        let posts: Vec<LightPost> = (1..=10).map(|i| original(i, 1, NOW - 100 + i)).collect();
        store.insert_posts(&posts);
        let q = FeedQuery {
            max_originals_per_author: 3,
            window: AnswerWindow {
                min_created_at: Some(NOW - 100 + 2),
                max_created_at: Some(NOW - 100 + 6),
                after: None,
            },
            ..FeedQuery::new(0, &[1])
        };
        // Newer posts do not use up the limit of 3; older ones end the scan.
        assert_eq!(
            ids(&store.get_all_posts_by_users(&q).posts),
            [6, 5, 4],
            "{}",
            store.name()
        );
        let q = FeedQuery {
            max_originals_per_author: 50,
            ..q
        };
        assert_eq!(
            ids(&store.get_all_posts_by_users(&q).posts),
            [6, 5, 4, 3, 2],
            "{}",
            store.name()
        );
    }
}

#[test]
fn a_query_answers_as_of_its_clock() {
    for (store, clock) in stores() {
        clock.set(NOW + 50);
        store.insert_posts(&[original(1, 1, NOW - 5), original(2, 1, NOW + 40)]);
        // A query that read an earlier clock (as one racing the insert would) does not see
        // the post created after it, and says which clock it read.
        clock.set(NOW);
        let answer = store.get_all_posts_by_users(&FeedQuery::new(0, &[1]));
        assert_eq!(ids(&answer.posts), [1], "{}", store.name());
        assert_eq!(answer.as_of_secs, NOW, "{}", store.name());
    }
}
