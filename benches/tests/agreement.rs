//! Differential check: on a small feed-2d workload the engine and the reference-design baseline
//! return the same feeds, except where the engine fixes a documented reference bug or follows
//! its videos rule (a repost is a video only while its source is stored); every differing post
//! must be explained by one of them.

use std::collections::HashSet;
use std::sync::Arc;
use thunder_benches::{BaselineStore, DEFAULT_BATCH_EVENTS, batches, load};
use thunder_engine::config::{DEFAULT_RETENTION_SECS, MAX_POSTS_TO_RETURN, MAX_VIDEOS_TO_RETURN};
use thunder_engine::{FeedQuery, LightPost, ManualClock, PostStore, Store};
use thunder_workload::{SynthConfig, exclude_from_answer};

const NOW: i64 = 1_750_000_000;

/// The cut (`created_at` of the last post of a full answer) and the posts strictly newer.
fn comparable(posts: &[LightPost], max_results: usize) -> (i64, HashSet<i64>) {
    let cut = if posts.len() >= max_results {
        posts.last().map_or(i64::MIN, |p| p.created_at)
    } else {
        i64::MIN
    };
    (
        cut,
        posts
            .iter()
            .filter(|p| p.created_at > cut)
            .map(|p| p.post_id)
            .collect(),
    )
}

#[test]
fn engine_and_baseline_agree_on_feed_2d() {
    let config = SynthConfig::feed_2d(200, NOW);
    let events = batches(config.backlog(), DEFAULT_BATCH_EVENTS);
    let engine = PostStore::with_clock(DEFAULT_RETENTION_SECS, Arc::new(ManualClock::new(NOW)));
    let baseline = BaselineStore::new(
        DEFAULT_RETENTION_SECS as u64,
        Arc::new(ManualClock::new(NOW)),
    );
    for store in [&engine as &dyn Store, &baseline] {
        load(store, &events, 1);
        store.finish_load();
    }
    assert_eq!(Store::stored_posts(&engine), Store::stored_posts(&baseline));

    let mut video_differences = 0;
    for viewer in config.viewers(40) {
        let full = FeedQuery {
            max_results: MAX_POSTS_TO_RETURN,
            ..FeedQuery::new(viewer.user_id, &viewer.following)
        };
        let previous = engine.get_all_posts_by_users(&full).posts;
        let exclude = exclude_from_answer(&viewer, previous.iter().map(|p| p.post_id));
        let q = FeedQuery {
            exclude: &exclude,
            ..full
        };
        let e = comparable(
            &engine.get_all_posts_by_users(&q).posts,
            MAX_POSTS_TO_RETURN,
        );
        let b = comparable(
            &Store::get_all_posts_by_users(&baseline, &q).posts,
            MAX_POSTS_TO_RETURN,
        );
        assert_eq!(e, b, "feed of viewer {}", viewer.user_id);

        let q = FeedQuery {
            max_results: MAX_VIDEOS_TO_RETURN,
            ..q
        };
        let e_posts = engine.get_videos_by_users(&q).posts;
        let b_posts = Store::get_videos_by_users(&baseline, &q).posts;
        let (e_cut, e_ids) = comparable(&e_posts, MAX_VIDEOS_TO_RETURN);
        let (b_cut, b_ids) = comparable(&b_posts, MAX_VIDEOS_TO_RETURN);
        let cut = e_cut.max(b_cut);
        let mut differs = false;
        // Bug 13: the baseline never indexes a repost that arrived before its source as video.
        for p in e_posts
            .iter()
            .filter(|p| p.created_at > cut && !b_ids.contains(&p.post_id))
        {
            differs = true;
            let source = p.source_post_id.and_then(|s| baseline.get(s));
            assert!(
                p.is_retweet && source.is_some_and(|s| s.has_video),
                "viewer {}: unexplained post only the engine returns {p:?}",
                viewer.user_id
            );
        }
        // The engine's videos rule: a repost is a video only while its source is stored and
        // not expired; the reference keeps it after its source is deleted.
        for p in b_posts
            .iter()
            .filter(|p| p.created_at > cut && !e_ids.contains(&p.post_id))
        {
            differs = true;
            let source = p.source_post_id.and_then(|s| baseline.get(s));
            assert!(
                p.is_retweet
                    && !p.has_video
                    && source.is_none_or(|s| NOW - s.created_at > DEFAULT_RETENTION_SECS),
                "viewer {}: unexplained post only the baseline returns {p:?}",
                viewer.user_id
            );
        }
        video_differences += usize::from(differs);
    }
    eprintln!("video answers that differ, every post explained: {video_differences} of 40");
}
