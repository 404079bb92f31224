//! Convergence (`BEHAVIOUR.md`, "Convergence"): the same create and delete events, applied at
//! one fixed clock in different orders, give the same answers.
//!
//! The events are split like a Kafka topic: creates keyed by author (`author_id mod P`),
//! deletes keyed by post id (`post_id mod P`). Each run keeps every partition's order but
//! interleaves the partitions at random, cuts random batches (applied as the server does:
//! creates, then deletes; or the other way round) and trims now and then; one run applies the
//! partitions from two threads at once. Every run must answer every query like the first, and
//! the plain `ModelStore` must converge the same way and agree with the engine.
//!
//! The timeline cap is never reached (the one documented exception), and a post id's creates
//! all carry the same record (a redelivery), as in the topic.
//!
//! `PROPTEST_CASES` raises the number of cases (default 96).

use std::sync::{Arc, Barrier};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use thunder_engine::{
    DeleteEvent, LightPost, ManualClock, OwnedQuery, PostEvent, PostStore, QueryOutcome, Store,
    StoreConfig,
};
use thunder_testkit::model::{SharedModel, answers_agree};

const NOW: i64 = 1_700_000_000;
const RETENTION_SECS: i64 = 1000;
/// Kafka partitions of the simulated topic.
const PARTITIONS: i64 = 4;
/// Post ids, including 0 and negative ones. Every id has one record.
const POST_IDS: std::ops::RangeInclusive<i64> = -3..=36;
/// Author ids, including 0 and a negative one.
const AUTHOR_IDS: std::ops::RangeInclusive<i64> = -1..=5;
/// A viewer that follows nobody and reposted nothing.
const OUTSIDE_VIEWER: i64 = 1_000_000;
/// 3000-01-01, unix seconds.
const YEAR_3000: i64 = 32_503_680_000;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

/// The partition a producer keyed like ours sends `event` to: creates by author, deletes by
/// post id.
fn partition(event: &PostEvent) -> usize {
    match event {
        PostEvent::Create(post) => post.author_id.rem_euclid(PARTITIONS) as usize,
        PostEvent::Delete(event) => event.post_id.rem_euclid(PARTITIONS) as usize,
    }
}

/// One author (or all), reference defaults, a viewer nobody reposts.
fn plain(videos: bool, authors: Vec<i64>) -> OwnedQuery {
    OwnedQuery::new(videos, OUTSIDE_VIEWER, authors)
}

#[derive(Clone, Debug)]
struct Case {
    /// The events in producer order.
    events: Vec<PostEvent>,
    queries: Vec<OwnedQuery>,
    /// Seeds of the shuffled runs.
    seeds: Vec<u64>,
}

// ---- strategies ----

/// `created_at` of a record: mostly inside the window, a few dropped for their time.
fn created_at() -> impl Strategy<Value = i64> {
    prop_oneof![
        24 => (0..=RETENTION_SECS).prop_map(|ago| NOW - ago),
        // Ties, within one author and across authors.
        6 => (0..=3i64).prop_map(|ago| NOW - 100 - ago),
        1 => (1..=5i64).prop_map(|ahead| NOW + ahead),
        1 => (1..=5i64).prop_map(|late| NOW - RETENTION_SECS - late),
        1 => prop::sample::select(vec![0, -1, i64::from(u32::MAX) + 1]),
    ]
}

/// The one record of `post_id`.
fn record(post_id: i64) -> impl Strategy<Value = LightPost> {
    let id = || POST_IDS;
    let user = || prop_oneof![4 => AUTHOR_IDS, 1 => Just(7i64)];
    (
        AUTHOR_IDS,
        created_at(),
        // 0 original, 1 video original, 2 repost, 3 repost with its own video, 4 reply,
        // 5 video reply, 6 reply and repost.
        prop_oneof![
            3 => Just(0u8), 4 => Just(1u8), 5 => Just(2u8), 1 => Just(3u8),
            2 => Just(4u8), 1 => Just(5u8), 1 => Just(6u8),
        ],
        (id(), user(), id(), id(), user()),
    )
        .prop_map(
            move |(
                author_id,
                created_at,
                kind,
                (source, source_user, parent, conversation, parent_user),
            )| {
                let mut post = LightPost::original(post_id, author_id, created_at);
                post.has_video = matches!(kind, 1 | 3 | 5);
                if matches!(kind, 2 | 3 | 6) {
                    post.is_retweet = true;
                    post.source_post_id = Some(source);
                    post.source_user_id = Some(source_user);
                }
                if matches!(kind, 4..=6) {
                    post.is_reply = true;
                    post.in_reply_to_post_id = Some(parent);
                    post.in_reply_to_user_id = Some(parent_user);
                    post.conversation_id = Some(conversation);
                }
                post
            },
        )
}

fn deleted_at() -> impl Strategy<Value = i64> {
    prop_oneof![
        8 => (0..=RETENTION_SECS).prop_map(|ago| NOW - ago),
        1 => Just(NOW - 10 * RETENTION_SECS),
        1 => prop::sample::select(vec![NOW + 60, YEAR_3000, i64::MAX]),
        1 => prop::sample::select(vec![0, -1]),
    ]
}

fn query_spec() -> impl Strategy<Value = OwnedQuery> {
    (
        prop::bool::ANY,
        prop_oneof![3 => AUTHOR_IDS, 1 => Just(7i64), 1 => Just(OUTSIDE_VIEWER)],
        prop::collection::vec(AUTHOR_IDS, 1..=5),
        prop::collection::vec(POST_IDS, 0..=5),
        prop_oneof![2 => 0..=8usize, 1 => Just(1200usize)],
        prop_oneof![1 => 0..=3usize, 1 => Just(50usize)],
        prop_oneof![1 => 0..=3usize, 1 => Just(30usize)],
    )
        .prop_map(
            |(videos, viewer_id, authors, exclude, max_results, originals, secondary)| OwnedQuery {
                videos,
                viewer_id,
                authors,
                exclude,
                max_results,
                max_originals_per_author: originals,
                max_secondary_per_author: secondary,
                seen: None,
                window: thunder_engine::AnswerWindow::ALL,
                deadline: None,
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    let records = POST_IDS.map(|id| record(id).boxed()).collect::<Vec<_>>();
    (
        records,
        // Creates: each id 0..=3 times (0: never arrives; 2 or 3: redelivered).
        prop::collection::vec(
            prop_oneof![1 => Just(0usize), 4 => Just(1usize), 2 => 2..=3usize],
            POST_IDS.count(),
        ),
        // Deletes: of any id, sources included; some repeated.
        prop::collection::vec((POST_IDS, deleted_at()), 0..=14),
        prop::collection::vec(query_spec(), 1..=6),
        prop::collection::vec(any::<u64>(), 4),
    )
        .prop_flat_map(|(records, copies, deletes, queries, seeds)| {
            let mut events = Vec::new();
            for (post, n) in records.iter().zip(copies) {
                events.extend(std::iter::repeat_n(PostEvent::Create(*post), n));
            }
            events.extend(deletes.into_iter().map(|(post_id, deleted_at)| {
                PostEvent::Delete(DeleteEvent {
                    post_id,
                    deleted_at,
                })
            }));
            (Just(events).prop_shuffle(), Just(queries), Just(seeds))
        })
        .prop_map(|(events, queries, seeds)| Case {
            events,
            queries,
            seeds,
        })
}

// ---- applying events in some order ----

fn config() -> StoreConfig {
    StoreConfig {
        retention_secs: RETENTION_SECS,
        // Never reached: fewer events than this per author.
        max_posting_list_size: 5000,
        clock: Arc::new(ManualClock::new(NOW)),
    }
}

/// The events of each partition, in producer order.
fn partitions(events: &[PostEvent]) -> Vec<Vec<PostEvent>> {
    let mut parts = vec![Vec::new(); PARTITIONS as usize];
    for event in events {
        parts[partition(event)].push(*event);
    }
    parts
}

/// A random interleaving of `parts` (each kept in order) cut into random batches.
fn shuffled_batches(parts: &[Vec<PostEvent>], rng: &mut SmallRng) -> Vec<Vec<PostEvent>> {
    let mut next = vec![0usize; parts.len()];
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    loop {
        let open: Vec<usize> = (0..parts.len())
            .filter(|&p| next[p] < parts[p].len())
            .collect();
        if open.is_empty() {
            break;
        }
        // A run of a few events from one partition, as a consumer poll returns them.
        let p = open[rng.random_range(0..open.len())];
        let run = rng.random_range(1..=4usize).min(parts[p].len() - next[p]);
        batch.extend_from_slice(&parts[p][next[p]..next[p] + run]);
        next[p] += run;
        if rng.random_bool(0.4) {
            batches.push(std::mem::take(&mut batch));
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// Applies one batch: its creates and its deletes, in either order, maybe then a trim.
fn apply_batch(store: &impl Store, batch: &[PostEvent], rng: &mut SmallRng) {
    let creates: Vec<LightPost> = batch
        .iter()
        .filter_map(|e| match e {
            PostEvent::Create(post) => Some(*post),
            PostEvent::Delete(_) => None,
        })
        .collect();
    let deletes: Vec<DeleteEvent> = batch
        .iter()
        .filter_map(|e| match e {
            PostEvent::Delete(event) => Some(*event),
            PostEvent::Create(_) => None,
        })
        .collect();
    if rng.random_bool(0.75) {
        store.insert_posts(&creates);
        store.mark_as_deleted(&deletes);
    } else {
        store.mark_as_deleted(&deletes);
        store.insert_posts(&creates);
    }
    if rng.random_bool(0.1) {
        store.trim(rng.random_range(0..thunder_engine::config::TRIM_FRACTION));
    }
}

/// Every event in producer order, one at a time.
fn in_order(store: &impl Store, events: &[PostEvent]) {
    for event in events {
        match event {
            PostEvent::Create(post) => {
                store.insert_posts(std::slice::from_ref(post));
            }
            PostEvent::Delete(delete) => {
                store.mark_as_deleted(std::slice::from_ref(delete));
            }
        }
    }
}

fn shuffled(store: &impl Store, events: &[PostEvent], seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    for batch in shuffled_batches(&partitions(events), &mut rng) {
        apply_batch(store, &batch, &mut rng);
    }
}

/// [`shuffled`], the store written as a base file at a random batch and replaced by a fresh
/// store loaded from it, which takes the rest: what a replica restarted from its base does.
fn shuffled_through_a_base(events: &[PostEvent], seed: u64) -> PostStore {
    let mut rng = SmallRng::seed_from_u64(seed);
    let batches = shuffled_batches(&partitions(events), &mut rng);
    let split = rng.random_range(0..=batches.len());
    let before = PostStore::with_config(config());
    for batch in &batches[..split] {
        apply_batch(&before, batch, &mut rng);
    }
    let mut bytes = Vec::new();
    before
        .write_base(&Default::default(), &mut bytes)
        .expect("a base is written");
    let after = PostStore::with_config(config());
    after.load_base_bytes(&bytes, 2).expect("a base loads");
    for batch in &batches[split..] {
        apply_batch(&after, batch, &mut rng);
    }
    after
}

/// Two threads, each owning half the partitions, apply them concurrently.
fn two_threads(events: &[PostEvent], seed: u64) -> PostStore {
    let store = PostStore::with_config(config());
    let parts = partitions(events);
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        for t in 0..2u64 {
            let (store, parts, barrier) = (&store, &parts, &barrier);
            scope.spawn(move || {
                let mine: Vec<Vec<PostEvent>> = parts
                    .iter()
                    .enumerate()
                    .map(|(p, events)| {
                        if p as u64 % 2 == t {
                            events.clone()
                        } else {
                            Vec::new()
                        }
                    })
                    .collect();
                let mut rng = SmallRng::seed_from_u64(seed ^ t);
                let batches = shuffled_batches(&mine, &mut rng);
                barrier.wait();
                for batch in batches {
                    apply_batch(store, &batch, &mut rng);
                }
            });
        }
    });
    store
}

// ---- comparing ----

/// Every author alone and all together, normal and video, plus the case's own queries.
fn all_queries(extra: &[OwnedQuery]) -> Vec<OwnedQuery> {
    let mut queries = Vec::new();
    for videos in [false, true] {
        for author in AUTHOR_IDS {
            queries.push(plain(videos, vec![author]));
        }
        queries.push(plain(videos, AUTHOR_IDS.collect()));
    }
    queries.extend_from_slice(extra);
    queries
}

fn answers(store: &impl Store, queries: &[OwnedQuery]) -> Vec<QueryOutcome> {
    queries.iter().map(|q| store.answer(q)).collect()
}

fn ids(outcome: &QueryOutcome) -> Vec<(i64, i64)> {
    outcome
        .posts
        .iter()
        .map(|p| (p.post_id, p.created_at))
        .collect()
}

fn agree(
    what: &str,
    queries: &[OwnedQuery],
    expected: &[QueryOutcome],
    got: &[QueryOutcome],
) -> Result<(), TestCaseError> {
    for ((query, a), b) in queries.iter().zip(expected).zip(got) {
        prop_assert!(!a.timed_out && !b.timed_out, "{}: timed out", what);
        if let Err(why) = answers_agree(&a.posts, &b.posts, query.max_results) {
            return Err(TestCaseError::fail(format!(
                "{what} answers {query:?} differently ({why})\n first: {:?}\n this:  {:?}",
                ids(a),
                ids(b)
            )));
        }
    }
    Ok(())
}

fn check(case: &Case) -> Result<(), TestCaseError> {
    let queries = all_queries(&case.queries);

    let first = PostStore::with_config(config());
    in_order(&first, &case.events);
    let expected = answers(&first, &queries);

    for (i, &seed) in case.seeds.iter().enumerate() {
        let store = PostStore::with_config(config());
        shuffled(&store, &case.events, seed);
        agree(
            &format!("engine run {i}"),
            &queries,
            &expected,
            &answers(&store, &queries),
        )?;
    }
    let rebased = shuffled_through_a_base(&case.events, case.seeds[1]);
    agree(
        "engine through a base",
        &queries,
        &expected,
        &answers(&rebased, &queries),
    )?;
    let threaded = two_threads(&case.events, case.seeds[0]);
    agree(
        "engine, two threads",
        &queries,
        &expected,
        &answers(&threaded, &queries),
    )?;

    let model = SharedModel::new(config());
    in_order(&model, &case.events);
    let model_answers = answers(&model, &queries);
    agree("model in order", &queries, &expected, &model_answers)?;
    for (i, &seed) in case.seeds.iter().enumerate().take(2) {
        let model = SharedModel::new(config());
        shuffled(&model, &case.events, seed.rotate_left(17));
        agree(
            &format!("model run {i}"),
            &queries,
            &expected,
            &answers(&model, &queries),
        )?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Kafka-like interleavings of the same events agree, in the engine and in the model.
    #[test]
    fn every_interleaving_gives_the_same_answers(case in case()) {
        check(&case)?;
    }
}

// ---- every order of a small event set ----

fn video(post_id: i64, author_id: i64, created_at: i64) -> LightPost {
    LightPost {
        has_video: true,
        ..LightPost::original(post_id, author_id, created_at)
    }
}

fn repost(post_id: i64, author_id: i64, created_at: i64, source: i64) -> LightPost {
    LightPost {
        is_retweet: true,
        source_post_id: Some(source),
        source_user_id: Some(1),
        ..LightPost::original(post_id, author_id, created_at)
    }
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for rest in permutations(n - 1) {
        for at in 0..=rest.len() {
            let mut p = rest.clone();
            p.insert(at, n - 1);
            all.push(p);
        }
    }
    all
}

/// The case and its neighbours: a video source, two reposts of it (one promoted, one
/// indexed at insert, depending on the order), the source's delete, a redelivery of the
/// source, and an ancient delete of a post that is created too. All 6! orders agree.
#[test]
fn every_order_of_a_small_event_set_agrees() {
    let events = [
        PostEvent::Create(video(1, 1, NOW - 50)),
        PostEvent::Create(repost(2, 2, NOW - 40, 1)),
        PostEvent::Create(repost(3, 3, NOW - 30, 1)),
        PostEvent::Delete(DeleteEvent {
            post_id: 1,
            deleted_at: NOW,
        }),
        PostEvent::Create(video(1, 1, NOW - 50)),
        PostEvent::Delete(DeleteEvent {
            post_id: 3,
            deleted_at: NOW - 10 * RETENTION_SECS,
        }),
    ];
    let queries = all_queries(&[plain(true, vec![1, 2, 3])]);
    let mut expected: Option<Vec<QueryOutcome>> = None;
    for order in permutations(events.len()) {
        let ordered: Vec<PostEvent> = order.iter().map(|&i| events[i]).collect();
        let engine = PostStore::with_config(config());
        in_order(&engine, &ordered);
        let model = SharedModel::new(config());
        in_order(&model, &ordered);
        let got = answers(&engine, &queries);
        let what = format!("order {order:?}");
        let reference = expected.get_or_insert_with(|| got.clone());
        agree(&what, &queries, reference, &got).unwrap();
        agree(&what, &queries, reference, &answers(&model, &queries)).unwrap();
    }
    // Nothing is a video: the source is deleted; repost 3 is deleted too. Repost 2 is served
    // as a repost.
    let expected = expected.unwrap();
    assert!(
        expected
            .iter()
            .filter(|o| !o.posts.is_empty())
            .all(|o| { o.posts.iter().all(|p| p.post_id == 2) })
    );
}

/// One author's 80 originals of one second, beyond the 50-post per-author limit, arriving in
/// ascending or descending id order, in one batch or one by one: every timeline is in
/// `(created_at, post_id)` order, so every store keeps the 50 largest ids (before, the
/// arrival order decided which 50 of the second were candidates, and replicas disagreed).
#[test]
fn a_per_author_limit_inside_one_second_keeps_the_largest_ids_whatever_the_arrival_order() {
    let posts: Vec<LightPost> = (1..=80)
        .map(|id| LightPost::original(id, 1, NOW - 5))
        .collect();
    let query = plain(false, vec![1]);
    let expected: Vec<i64> = (31..=80).rev().collect();
    for (name, order) in [
        ("ascending", posts.clone()),
        ("descending", posts.iter().rev().copied().collect()),
        ("interleaved", {
            let mut p: Vec<LightPost> = posts.iter().step_by(2).copied().collect();
            p.extend(posts.iter().skip(1).step_by(2).rev().copied());
            p
        }),
    ] {
        let batched = PostStore::with_config(config());
        batched.insert_posts(&order);
        let one_by_one = PostStore::with_config(config());
        for post in &order {
            one_by_one.insert_posts(std::slice::from_ref(post));
        }
        let model = SharedModel::new(config());
        for post in &order {
            model.insert_posts(std::slice::from_ref(post));
        }
        for (store, kind) in [
            (&batched as &dyn Store, "batched"),
            (&one_by_one, "one by one"),
            (&model, "model"),
        ] {
            let got: Vec<i64> = store
                .answer(&query)
                .posts
                .iter()
                .map(|p| p.post_id)
                .collect();
            assert_eq!(got, expected, "{name}, {kind}");
        }
    }
}

/// A busy second with more posts than the answer holds (300 authors, 5 posts each, in one
/// second, ids scattered): the merge stops inside the second, and the answer is the second's
/// largest ids, in the answer order, as the model gives it.
#[test]
fn a_busy_second_larger_than_the_answer_is_cut_at_its_largest_ids() {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut posts: Vec<LightPost> = (0..1500)
        .map(|i| LightPost::original(1_000 + i * 13 % 1500, i % 300, NOW - 3))
        .collect();
    // An older second every author also posted in, which no cut below reaches.
    posts.extend((0..300).map(|a| LightPost::original(5_000 + a, a, NOW - 4)));
    for i in (1..posts.len()).rev() {
        posts.swap(i, rng.random_range(0..=i));
    }
    let engine = PostStore::with_config(config());
    let model = SharedModel::new(config());
    for chunk in posts.chunks(97) {
        engine.insert_posts(chunk);
        model.insert_posts(chunk);
    }
    let mut busy: Vec<i64> = posts
        .iter()
        .filter(|p| p.created_at == NOW - 3)
        .map(|p| p.post_id)
        .collect();
    busy.sort_unstable_by(|a, b| b.cmp(a));
    for max_results in [1, 100, 1200, 1499] {
        let mut query = plain(false, (0..300).collect());
        query.max_results = max_results;
        let got = engine.answer(&query);
        let ids: Vec<i64> = got.posts.iter().map(|p| p.post_id).collect();
        assert_eq!(ids, busy[..max_results], "max_results {max_results}");
        assert_eq!(
            got.posts,
            model.answer(&query).posts,
            "max_results {max_results}"
        );
    }
}
