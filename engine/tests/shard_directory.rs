//! Author shards with a fact directory answer exactly like one full store: the same events fed
//! to a full store and to N shard stores (each owning `author mod N`), the same queries asked of
//! all, and the shards' answers merged newest first and cut at `max_results` must equal the full
//! store's. Every post has its own `created_at`, so the order is total and the comparison exact.
//! The log is built to exercise what crosses shards: replies whose parents (originals, replies,
//! deleted, expired-at-query) live on other shards, reposts of other shards' videos arriving
//! before and after their sources, deletes before and after creates.

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use thunder_engine::snapshot::{SnapshotError, SnapshotMeta};
use thunder_engine::{
    DeleteEvent, FeedQuery, LightPost, ManualClock, OwnedQuery, PostEvent, PostStore, ShardId,
    Store,
};

const RETENTION_SECS: i64 = 100_000;
const NOW: i64 = 1_700_000_000;

fn generate(rng: &mut SmallRng, authors: i64, posts: usize) -> Vec<PostEvent> {
    let mut made: Vec<LightPost> = Vec::new();
    let mut events = Vec::new();
    for i in 0..posts {
        let author_id = rng.random_range(0..authors);
        // Unique times, spread over more than the retention so some parents expire.
        let created_at = NOW - (posts - i) as i64 * (RETENTION_SECS + 20_000) / posts as i64;
        let mut post = LightPost::original(10_000 + i as i64, author_id, created_at);
        post.has_video = rng.random_bool(0.3);
        match rng.random_range(0..10) {
            0..=3 if !made.is_empty() => {
                let parent = made[rng.random_range(0..made.len())];
                post.is_reply = true;
                post.in_reply_to_post_id = Some(parent.post_id);
                post.in_reply_to_user_id = Some(parent.author_id);
                post.conversation_id = if rng.random_bool(0.8) {
                    Some(parent.in_reply_to_post_id.unwrap_or(parent.post_id))
                } else {
                    Some(rng.random_range(1..20_000))
                };
                post.has_video = rng.random_bool(0.1);
            }
            4..=6 if !made.is_empty() => {
                let source = made[rng.random_range(0..made.len())];
                post.is_retweet = true;
                post.source_post_id = Some(source.post_id);
                post.source_user_id = Some(source.author_id);
                post.has_video = rng.random_bool(0.1);
                post.is_reply = rng.random_bool(0.05);
            }
            _ => {}
        }
        made.push(post);
        events.push(PostEvent::Create(post));
        if rng.random_bool(0.08) {
            let victim = made[rng.random_range(0..made.len())];
            events.push(PostEvent::Delete(DeleteEvent {
                post_id: victim.post_id,
                deleted_at: NOW - rng.random_range(0..1000),
            }));
        }
    }
    // Deliver out of order in part: sources after their reposts, deletes before creates.
    let len = events.len();
    for _ in 0..len / 5 {
        let a = rng.random_range(0..len);
        let b = rng.random_range(0..len);
        events.swap(a, b);
    }
    events
}

fn apply(store: &PostStore, events: &[PostEvent], rng: &mut SmallRng) {
    let mut rest = events;
    while !rest.is_empty() {
        let take = rng.random_range(1..=rest.len().min(64));
        let (batch, tail) = rest.split_at(take);
        rest = tail;
        let mut creates = Vec::new();
        let mut deletes = Vec::new();
        for event in batch {
            match event {
                PostEvent::Create(p) => creates.push(*p),
                PostEvent::Delete(d) => deletes.push(*d),
            }
        }
        store.insert_posts(&creates);
        store.mark_as_deleted(&deletes);
    }
}

fn newest_first_merge(answers: Vec<Vec<LightPost>>, max_results: usize) -> Vec<LightPost> {
    let mut all: Vec<LightPost> = answers.into_iter().flatten().collect();
    all.sort_by_key(|p| std::cmp::Reverse(p.created_at));
    all.truncate(max_results);
    all
}

fn check(shard_count: i64, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let authors = 60;
    let events = generate(&mut rng, authors, 6000);
    let clock = Arc::new(ManualClock::new(NOW));
    let full = PostStore::with_clock(RETENTION_SECS, clock.clone());
    let shards: Vec<PostStore> = (0..shard_count)
        .map(|i| {
            PostStore::with_clock(RETENTION_SECS, clock.clone())
                .with_fact_directory(move |author| author.rem_euclid(shard_count) == i)
        })
        .collect();
    apply(&full, &events, &mut rng);
    for shard in &shards {
        let mut order = events.clone();
        // Each shard sees its own interleaving.
        order.chunks_mut(7).for_each(|c| c.shuffle(&mut rng));
        apply(shard, &order, &mut rng);
    }
    // Let part of the window expire after ingestion: parents and sources age out at query.
    clock.advance(10_000);
    let stats = shards[0]
        .directory_stats()
        .expect("a shard has a directory");
    assert!(
        stats.facts > 0,
        "shard 0 holds facts of other shards' posts"
    );
    let mut compared_posts = 0;
    for round in 0..400 {
        let question = random_question(&mut rng, authors, round);
        let expected = full.answer(&question).posts;
        let merged = newest_first_merge(
            shards.iter().map(|s| s.answer(&question).posts).collect(),
            question.max_results,
        );
        compared_posts += expected.len();
        assert_eq!(
            merged, expected,
            "seed {seed} round {round} video {}",
            question.videos
        );
        if round == 0 {
            for shard in &shards {
                shard.trim_all();
            }
            full.trim_all();
        }
    }
    assert!(
        compared_posts > 1000,
        "queries returned posts: {compared_posts}"
    );
}

#[test]
fn two_shards_answer_like_a_full_store() {
    for seed in 0..4 {
        check(2, seed);
    }
}

#[test]
fn three_shards_answer_like_a_full_store() {
    for seed in 10..13 {
        check(3, seed);
    }
}

#[test]
fn a_full_store_has_no_directory() {
    assert_eq!(PostStore::new(RETENTION_SECS).directory_stats(), None);
}

/// Creates and deletes of other shards' posts racing on two threads: a fact whose delete ran
/// (before or after its create) must never be left behind. Checked through the reply rule: a
/// reply to a deleted parent is hidden, a reply to a live one shown.
#[test]
fn a_fact_racing_its_delete_is_never_left_live() {
    let clock = Arc::new(ManualClock::new(NOW));
    for round in 0..20 {
        let store = Arc::new(
            PostStore::with_clock(RETENTION_SECS, clock.clone())
                .with_fact_directory(|author| author >= 1000),
        );
        let base = 1_000_000 * (round + 1);
        let parents: Vec<LightPost> = (0..2000)
            .map(|i| LightPost::original(base + i, 2 + i % 50, NOW - 1000))
            .collect();
        // Every other parent is deleted, concurrently with the creates.
        let deletes: Vec<DeleteEvent> = parents
            .iter()
            .step_by(2)
            .map(|p| DeleteEvent {
                post_id: p.post_id,
                deleted_at: NOW,
            })
            .collect();
        std::thread::scope(|scope| {
            let creator = Arc::clone(&store);
            let parents = &parents;
            scope.spawn(move || {
                for chunk in parents.chunks(16) {
                    creator.insert_posts(chunk);
                }
            });
            let deleter = Arc::clone(&store);
            let deletes = &deletes;
            scope.spawn(move || {
                for chunk in deletes.chunks(16) {
                    deleter.mark_as_deleted(chunk);
                }
            });
        });
        // Owned authors 1000..1100 reply to every parent, 20 replies each.
        let replies: Vec<LightPost> = parents
            .iter()
            .enumerate()
            .map(|(i, p)| LightPost {
                is_reply: true,
                in_reply_to_post_id: Some(p.post_id),
                in_reply_to_user_id: Some(p.author_id),
                conversation_id: Some(p.post_id),
                ..LightPost::original(base + 10_000 + i as i64, 1000 + i as i64 % 100, NOW - 500)
            })
            .collect();
        store.insert_posts(&replies);
        let repliers: Vec<i64> = (1000..1100).collect();
        let answer = store.get_all_posts_by_users(&FeedQuery {
            max_results: 10_000,
            ..FeedQuery::new(0, &repliers)
        });
        let visible_parents: Vec<i64> = answer
            .posts
            .iter()
            .filter_map(|p| p.in_reply_to_post_id)
            .collect();
        for parent in &visible_parents {
            assert_eq!(
                (parent - base) % 2,
                1,
                "round {round}: reply to deleted {parent} shown"
            );
        }
        assert!(
            visible_parents.len() == 1000,
            "round {round}: {} replies to live parents shown, not 1000",
            visible_parents.len()
        );
    }
}

/// A random question, asked of several stores.
fn random_question(rng: &mut SmallRng, authors: i64, round: usize) -> OwnedQuery {
    let viewer_id = rng.random_range(0..authors);
    let follows = (0..authors).filter(|_| rng.random_bool(0.4)).collect();
    OwnedQuery {
        exclude: if round.is_multiple_of(2) {
            (0..20)
                .map(|_| 10_000 + rng.random_range(0..6000))
                .collect()
        } else {
            Vec::new()
        },
        max_results: rng.random_range(0..300),
        max_originals_per_author: rng.random_range(0..60),
        max_secondary_per_author: rng.random_range(0..40),
        ..OwnedQuery::new(round.is_multiple_of(3), viewer_id, follows)
    }
}

fn shard_store(clock: &Arc<ManualClock>, id: ShardId) -> PostStore {
    let (index, count) = (i64::from(id.index), i64::from(id.count));
    PostStore::with_clock(RETENTION_SECS, clock.clone())
        .with_author_shard(id, move |author| author.rem_euclid(count) == index)
}

fn snapshot_of(store: &PostStore) -> Vec<u8> {
    let mut bytes = Vec::new();
    store
        .write_snapshot(&SnapshotMeta::default(), &mut bytes)
        .expect("a shard with an id writes a snapshot");
    bytes
}

/// Every question: each loaded shard answers exactly like the shard it was written from, and
/// the loaded shards' merged answers equal the full store's.
fn assert_loaded_shards_agree(
    rng: &mut SmallRng,
    full: &PostStore,
    shards: &[PostStore],
    loaded: &[PostStore],
    when: &str,
) {
    let mut compared_posts = 0;
    for round in 0..300 {
        let question = random_question(rng, 60, round);
        for (i, (shard, restored)) in shards.iter().zip(loaded).enumerate() {
            assert_eq!(
                restored.answer(&question).posts,
                shard.answer(&question).posts,
                "{when}: shard {i} round {round}"
            );
        }
        let expected = full.answer(&question).posts;
        let merged = newest_first_merge(
            loaded.iter().map(|s| s.answer(&question).posts).collect(),
            question.max_results,
        );
        compared_posts += expected.len();
        assert_eq!(merged, expected, "{when}: merged round {round}");
    }
    assert!(
        compared_posts > 1000,
        "{when}: {compared_posts} posts compared"
    );
}

/// Author shards -> snapshot -> load into fresh shards of the same ids: the loaded shards
/// answer exactly like the shards they came from (the facts of other shards' posts included:
/// reply visibility and repost video eligibility read them), also after time passes and more
/// events (creates of posts deleted before the snapshot, deletes of restored facts) arrive.
#[test]
fn shard_snapshots_load_into_the_same_shard_and_answer_alike() {
    for (shard_count, seed) in [(2u32, 40u64), (3, 41), (2, 42)] {
        let mut rng = SmallRng::seed_from_u64(seed);
        let events = generate(&mut rng, 60, 6000);
        let (first, rest) = events.split_at(4500);
        let clock = Arc::new(ManualClock::new(NOW));
        let full = PostStore::with_clock(RETENTION_SECS, clock.clone());
        let ids: Vec<ShardId> = (0..shard_count)
            .map(|index| ShardId {
                index,
                count: shard_count,
            })
            .collect();
        let shards: Vec<PostStore> = ids.iter().map(|&id| shard_store(&clock, id)).collect();
        apply(&full, first, &mut rng);
        for shard in &shards {
            apply(shard, first, &mut rng);
        }
        let snapshots: Vec<Vec<u8>> = shards.iter().map(snapshot_of).collect();
        clock.advance(2_000);
        // Built in bulk (fresh stores), and through the per-post insert path.
        let load_all = |allow_bulk: bool| -> Vec<PostStore> {
            ids.iter()
                .zip(&snapshots)
                .zip(&shards)
                .map(|((&id, bytes), shard)| {
                    let store = shard_store(&clock, id);
                    let report = store
                        .load_snapshot_with(bytes.as_slice(), 2, allow_bulk, None)
                        .expect("load");
                    assert_eq!(
                        report.per_post_reason.is_none(),
                        allow_bulk,
                        "shard {id}: {:?}",
                        report.per_post_reason
                    );
                    assert_eq!(report.header.shard, Some(id));
                    let facts = shard.directory_stats().expect("a shard").facts as u64;
                    assert!(report.counts.facts > 0, "shard {id} wrote no facts");
                    assert_eq!(report.counts.facts, facts, "shard {id}: every fact written");
                    assert_eq!(
                        store.directory_stats().expect("a shard").facts,
                        shard.directory_stats().expect("a shard").facts
                            - report.facts_skipped as usize,
                        "shard {id}: facts restored"
                    );
                    store
                })
                .collect()
        };
        let loaded = load_all(true);
        let per_post = load_all(false);
        assert_loaded_shards_agree(&mut rng, &full, &shards, &loaded, "after loading");
        assert_loaded_shards_agree(&mut rng, &full, &shards, &per_post, "after a per-post load");
        apply(&full, rest, &mut rng);
        for shard in shards.iter().chain(&loaded).chain(&per_post) {
            apply(shard, rest, &mut rng);
        }
        clock.advance(5_000);
        assert_loaded_shards_agree(&mut rng, &full, &shards, &loaded, "after more events");
        assert_loaded_shards_agree(
            &mut rng,
            &full,
            &shards,
            &per_post,
            "per-post, after more events",
        );
    }
}

/// A snapshot loads only into a store of the same shard: another shard, another shard count,
/// a full store, or a shard without an id refuse it and load nothing; a full store's snapshot
/// is refused by a shard; a shard without an id cannot write one.
#[test]
fn a_snapshot_of_another_shard_is_refused() {
    let clock = Arc::new(ManualClock::new(NOW));
    let posts: Vec<LightPost> = (0..200)
        .map(|i| LightPost::original(i, i % 17, NOW - i))
        .collect();
    let shard = shard_store(&clock, ShardId { index: 0, count: 2 });
    shard.insert_posts(&posts);
    let bytes = snapshot_of(&shard);
    let full = PostStore::with_clock(RETENTION_SECS, clock.clone());
    full.insert_posts(&posts);
    let full_bytes = snapshot_of(&full);

    let unnamed =
        || PostStore::with_clock(RETENTION_SECS, clock.clone()).with_fact_directory(|a| a % 2 == 0);
    let targets = [
        (
            "shard 1/2",
            shard_store(&clock, ShardId { index: 1, count: 2 }),
        ),
        (
            "shard 0/3",
            shard_store(&clock, ShardId { index: 0, count: 3 }),
        ),
        (
            "a full store",
            PostStore::with_clock(RETENTION_SECS, clock.clone()),
        ),
        ("a shard without an id", unnamed()),
    ];
    for (name, target) in &targets {
        let error = target
            .load_snapshot(bytes.as_slice(), 2)
            .expect_err(&format!("{name} must refuse shard 0/2's snapshot"));
        assert!(
            matches!(&error, SnapshotError::Incompatible(m) if m.contains("0/2")),
            "{name}: {error}"
        );
        assert_eq!(target.stored_posts(), 0, "{name}: posts loaded");
    }
    let error = shard_store(&clock, ShardId { index: 0, count: 2 })
        .load_snapshot(full_bytes.as_slice(), 2)
        .expect_err("a shard refuses a full store's snapshot");
    assert!(
        matches!(&error, SnapshotError::Incompatible(m) if m.contains("a full store")),
        "{error}"
    );
    let error = unnamed()
        .write_snapshot(&SnapshotMeta::default(), &mut Vec::new())
        .expect_err("a shard without an id cannot write a snapshot");
    assert!(matches!(error, SnapshotError::Incompatible(_)), "{error}");

    let same = shard_store(&clock, ShardId { index: 0, count: 2 });
    let report = same.load_snapshot(bytes.as_slice(), 2).expect("same shard");
    assert_eq!(same.stored_posts(), shard.stored_posts());
    assert_eq!(report.facts_loaded, report.counts.facts);
    assert_eq!(
        same.directory_stats().map(|s| s.facts),
        shard.directory_stats().map(|s| s.facts)
    );
}
