//! Snapshots: a store written to a snapshot and loaded into a fresh store answers like the
//! model store fed the same events (also after more time and events); a fuzzy snapshot taken
//! while a writer runs, plus a replay from its recorded position, equals the full history; and
//! corrupt, truncated or incompatible files are refused without touching the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use thunder_engine::snapshot::{
    BulkRefusal, PartitionOffset, SnapshotError, SnapshotMeta, layout_hash, read_header, verify,
};
use thunder_engine::{
    Clock, DeleteEvent, EventBatch, LightPost, ManualClock, OwnedQuery, PostStore, Store,
    StoreConfig,
};
use thunder_testkit::model::{SharedModel, answers_agree};

const START_SECS: i64 = 1_700_000_000;
const RETENTION_SECS: i64 = 1000;
const AUTHORS: std::ops::RangeInclusive<i64> = -1..=5;

fn config(clock: &Arc<ManualClock>) -> StoreConfig {
    StoreConfig {
        retention_secs: RETENTION_SECS,
        clock: Arc::clone(clock) as _,
        ..StoreConfig::default()
    }
}

/// [`config`] with a timeline cap of `cap` entries.
fn capped(clock: &Arc<ManualClock>, cap: usize) -> StoreConfig {
    StoreConfig {
        max_posting_list_size: cap,
        ..config(clock)
    }
}

fn meta() -> SnapshotMeta {
    SnapshotMeta {
        source: "innetwork_post".into(),
        offsets: vec![
            PartitionOffset {
                partition: 0,
                next_offset: 42,
            },
            PartitionOffset {
                partition: 3,
                next_offset: -1,
            },
        ],
    }
}

fn snapshot_bytes(store: &PostStore) -> Vec<u8> {
    let mut bytes = Vec::new();
    let summary = store
        .write_snapshot(&meta(), &mut bytes)
        .expect("write to a Vec");
    assert_eq!(summary.counts.bytes, bytes.len() as u64);
    bytes
}

/// Every question over every author: all of them, then each alone; feed and videos; a few
/// viewers.
fn questions() -> Vec<OwnedQuery> {
    let everyone: Vec<i64> = AUTHORS.collect();
    let mut groups = vec![everyone.clone()];
    groups.extend(everyone.iter().map(|&a| vec![a]));
    let mut questions = Vec::new();
    for authors in groups {
        for videos in [false, true] {
            for viewer in [-1, 2, 1_000_000] {
                questions.push(OwnedQuery::new(videos, viewer, authors.clone()));
            }
        }
    }
    questions
}

/// Every question: the two stores agree.
fn assert_same_answers(a: &dyn Store, b: &dyn Store, when: &str) -> Result<(), TestCaseError> {
    for query in questions() {
        let (x, y) = (a.answer(&query), b.answer(&query));
        answers_agree(&x.posts, &y.posts, query.max_results).map_err(|e| {
            TestCaseError::fail(format!(
                "{when}: {} vs {} differ for {query:?}: {e}",
                a.name(),
                b.name()
            ))
        })?;
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    /// Creates (indices into the record table) and deletes `(post_id, deleted_at)`.
    Batch(Vec<usize>, Vec<DeleteEvent>),
    Advance(i64),
    Trim(usize),
}

/// Ids `-2..30`, each with one record (all creates of an id carry the same record, a
/// condition of convergence in `BEHAVIOUR.md`).
const IDS: usize = 32;

fn record_table() -> impl Strategy<Value = Vec<LightPost>> {
    let record = (
        AUTHORS,
        0u8..6,
        prop::option::of(-2i64..30),
        prop::option::of(AUTHORS),
        any::<bool>(),
        -5i64..RETENTION_SECS + 20,
    );
    prop::collection::vec(record, IDS).prop_map(|records| {
        records
            .into_iter()
            .enumerate()
            .map(|(i, (author_id, shape, other, user, video, ago))| {
                let mut post = LightPost::original(i as i64 - 2, author_id, START_SECS - ago);
                post.has_video = video;
                match shape {
                    0 | 1 => {}
                    2 => {
                        post.is_reply = true;
                        post.in_reply_to_post_id = other;
                        post.in_reply_to_user_id = user;
                        post.conversation_id = other;
                    }
                    _ => {
                        post.is_retweet = true;
                        post.source_post_id = other;
                        post.source_user_id = user;
                        post.has_video = video && shape == 5;
                    }
                }
                post
            })
            .collect()
    })
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let batch = (
        prop::collection::vec(0..IDS, 0..8),
        prop::collection::vec((-2i64..30, -5i64..RETENTION_SECS + 50), 0..3),
    )
        .prop_map(|(creates, deletes)| {
            let deletes = deletes
                .into_iter()
                .map(|(post_id, ago)| DeleteEvent {
                    post_id,
                    deleted_at: START_SECS - ago,
                })
                .collect();
            Op::Batch(creates, deletes)
        });
    let op = prop_oneof![
        8 => batch,
        1 => (0i64..300).prop_map(Op::Advance),
        1 => (0usize..5).prop_map(Op::Trim),
    ];
    prop::collection::vec(op, 1..25)
}

fn run(ops: &[Op], table: &[LightPost], clock: &ManualClock, stores: &[&dyn Store]) {
    for op in ops {
        match op {
            Op::Batch(creates, deletes) => {
                let batch = EventBatch {
                    creates: creates.iter().map(|&i| table[i]).collect(),
                    deletes: deletes.clone(),
                };
                for store in stores {
                    store.apply(&batch);
                }
            }
            Op::Advance(secs) => clock.advance(*secs),
            Op::Trim(shard) => {
                for store in stores {
                    store.trim(*shard);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// store -> snapshot -> load answers like the model; then both keep going (more time,
    /// more events, trims) and still agree, which checks the restored tombstones and the
    /// rebuilt pending reposts.
    #[test]
    fn loaded_store_answers_like_the_model(
        table in record_table(),
        before in ops(),
        gap_secs in 0i64..400,
        after in ops(),
    ) {
        let clock = Arc::new(ManualClock::new(START_SECS));
        let engine = PostStore::with_config(config(&clock));
        let model = SharedModel::new(config(&clock));
        run(&before, &table, &clock, &[&engine, &model]);
        let bytes = snapshot_bytes(&engine);

        clock.advance(gap_secs);
        // The three ways a load rebuilds: in bulk (a fresh store), through the per-post path
        // when asked, and through it as the fallback for a store that is not empty (here, a
        // post of an author no question names, in no relation to the others).
        let bulk = PostStore::with_config(config(&clock));
        let asked = PostStore::with_config(config(&clock));
        let not_empty = PostStore::with_config(config(&clock));
        not_empty.insert_posts(&[LightPost::original(1_000_000, 1_000, clock.now_secs())]);
        // And read in place (as from a mapped file), in bulk and not.
        let in_place = PostStore::with_config(config(&clock));
        let in_place_asked = PostStore::with_config(config(&clock));
        for (store, allow_bulk, path) in [
            (&in_place, true, None),
            (&in_place_asked, false, Some(BulkRefusal::PerPostRequested)),
        ] {
            let report = store
                .load_snapshot_in_place(&bytes, 2, allow_bulk)
                .expect("a valid snapshot loads in place");
            prop_assert_eq!(report.per_post_reason, path);
            prop_assert_eq!(report.posts_loaded + report.posts_skipped, report.counts.posts);
            let when = format!("right after loading in place ({path:?})");
            assert_same_answers(store, &model, &when)?;
            assert_counts_match(store, &when)?;
        }
        // With and without the input's length (`load_snapshot_sized`).
        let len = Some(bytes.len() as u64);
        for (store, allow_bulk, path, hint) in [
            (&bulk, true, None, len),
            (&asked, false, Some(BulkRefusal::PerPostRequested), None),
            (&not_empty, true, Some(BulkRefusal::StoreNotEmpty), len),
        ] {
            let report = store
                .load_snapshot_with(bytes.as_slice(), 2, allow_bulk, hint)
                .expect("a valid snapshot loads");
            prop_assert_eq!(report.per_post_reason, path);
            prop_assert_eq!(&report.header.meta, &meta());
            prop_assert_eq!(report.posts_loaded + report.posts_skipped, report.counts.posts);
            let when = format!("right after loading ({path:?})");
            assert_same_answers(store, &model, &when)?;
            assert_counts_match(store, &when)?;
        }
        // And as a base file under a fresh store (mapped at start-up, not rebuilt).
        let mut base_bytes = Vec::new();
        engine.write_base(&meta(), &mut base_bytes).expect("a base is written");
        let based = PostStore::with_config(config(&clock));
        let report = based.load_base_bytes(&base_bytes, 2).expect("a base loads");
        based.check_base(2).expect("a written base checks");
        prop_assert_eq!(&report.header.meta, &meta());
        assert_same_answers(&based, &model, "right after loading a base")?;
        assert_counts_match(&based, "right after loading a base")?;
        assert_counts_match(&engine, "the store snapshotted")?;
        let stores = [&bulk, &asked, &not_empty, &in_place, &in_place_asked, &based];
        let everyone: [&dyn Store; 7] =
            [&bulk, &asked, &not_empty, &in_place, &in_place_asked, &based, &model];
        run(&after, &table, &clock, &everyone);
        for store in stores {
            assert_same_answers(store, &model, "after more events")?;
            assert_counts_match(store, "after more events")?;
        }
    }

    /// At a tiny timeline cap (evictions everywhere), a bulk load builds exactly the store the
    /// per-post path builds when it inserts the posts in load order (one thread): the same
    /// answers post for post (ties included), the same timeline lengths and stored records;
    /// and both keep agreeing after more events (the rebuilt pending reposts). The bulk
    /// build may only refuse because an author could exceed the videos cap.
    #[test]
    fn bulk_load_builds_what_the_per_post_path_builds_at_a_small_cap(
        table in record_table(),
        before in ops(),
        cap in 1usize..5,
        gap_secs in 0i64..400,
        after in ops(),
    ) {
        let clock = Arc::new(ManualClock::new(START_SECS));
        let store_config = || capped(&clock, cap);
        let engine = PostStore::with_config(store_config());
        run(&before, &table, &clock, &[&engine]);
        let bytes = snapshot_bytes(&engine);
        clock.advance(gap_secs);
        let bulk = PostStore::with_config(store_config());
        let report = bulk.load_snapshot(bytes.as_slice(), 2).expect("loads");
        if report.per_post_reason.is_some() {
            // The fallback ran the per-post path on two threads, whose result at the cap
            // depends on how the threads interleave (BEHAVIOUR.md, Convergence): nothing
            // exact to compare. `an_author_over_the_videos_cap_falls_back_...` checks it.
            prop_assert_eq!(report.per_post_reason, Some(BulkRefusal::VideosOverCap));
            return Ok(());
        }
        let per_post = PostStore::with_config(store_config());
        let expected = per_post.load_snapshot_with(bytes.as_slice(), 1, false, None).expect("loads");
        prop_assert_eq!(report.inserts, expected.inserts);
        assert_identical(&bulk, &per_post, "right after loading")?;
        let in_place = PostStore::with_config(store_config());
        let report = in_place.load_snapshot_in_place(&bytes, 2, true).expect("loads");
        prop_assert_eq!(report.per_post_reason, None);
        prop_assert_eq!(report.inserts, expected.inserts);
        assert_identical(&in_place, &per_post, "right after loading in place")?;
        assert_counts_match(&bulk, "right after a bulk load at a small cap")?;
        assert_counts_match(&per_post, "right after a per-post load at a small cap")?;
        run(&after, &table, &clock, &[&bulk, &per_post]);
        assert_identical(&bulk, &per_post, "after more events")?;
        assert_counts_match(&bulk, "after more events at a small cap")?;
        assert_counts_match(&per_post, "after more events at a small cap")?;
    }
}

/// The store's counters (what the `post_store_*` gauges show) equal a recount of what it
/// holds.
fn assert_counts_match(store: &PostStore, when: &str) -> Result<(), TestCaseError> {
    let (stats, recount) = (store.stats(), store.recount());
    prop_assert_eq!(stats, recount, "counters vs recount {}", when);
    Ok(())
}

/// Every question over every author: exactly the same answers and timeline lengths, and the
/// same records stored.
fn assert_identical(a: &PostStore, b: &PostStore, when: &str) -> Result<(), TestCaseError> {
    for query in questions() {
        let (x, y) = (a.answer(&query), b.answer(&query));
        prop_assert_eq!(&x.posts, &y.posts, "{}: {:?}", when, query);
        prop_assert_eq!(x.eligible, y.eligible, "{}: {:?}", when, query);
    }
    let (x, y) = (a.stats(), b.stats());
    prop_assert_eq!(
        (
            x.posts,
            x.original_entries,
            x.secondary_entries,
            x.video_entries,
            x.authors
        ),
        (
            y.posts,
            y.original_entries,
            y.secondary_entries,
            y.video_entries,
            y.authors
        ),
        "{}: store sizes",
        when
    );
    Ok(())
}

/// A fuzzy snapshot written while a writer applies a numbered event log, plus a replay of the
/// log from the position recorded before the scan, answers like a store that applied the
/// whole log (inserts and deletes are idempotent by post id).
#[test]
fn fuzzy_snapshot_plus_replay_from_recorded_offset_is_exact() {
    let clock = Arc::new(ManualClock::new(START_SECS));
    // A log of 400 batches: creates over 60 authors with replies, reposts (some before their
    // source) and videos, and deletes of earlier and later posts.
    let log: Vec<EventBatch> = (0..400i64)
        .map(|b| EventBatch {
            creates: (0..50i64)
                .map(|i| {
                    let id = b * 50 + i;
                    let mut post = LightPost::original(id, id % 60, START_SECS - 900 + b);
                    match id % 7 {
                        0 => post.has_video = true,
                        1 | 2 => {
                            post.is_retweet = true;
                            post.source_post_id = Some((id + 40) % 20_000);
                            post.source_user_id = Some((id + 40) % 60);
                        }
                        3 => {
                            post.is_reply = true;
                            post.in_reply_to_post_id = Some(id - 3);
                            post.in_reply_to_user_id = Some((id - 3) % 60);
                            post.conversation_id = Some(id - 3);
                        }
                        _ => {}
                    }
                    post
                })
                .collect(),
            deletes: (0..5i64)
                .map(|i| DeleteEvent {
                    post_id: (b * 50 + i * 97) % 20_000,
                    deleted_at: START_SECS,
                })
                .collect(),
        })
        .collect();

    // At least 8 rounds, and more (up to 64) until one snapshot overlapped the writer: on a
    // busy machine the writer can sit descheduled through a whole short snapshot.
    let mut exercised_overlap = false;
    for round in 0..64 {
        if round >= 8 && exercised_overlap {
            break;
        }
        let source = PostStore::with_config(config(&clock));
        let applied = AtomicUsize::new(0);
        let (recorded, bytes) = std::thread::scope(|scope| {
            scope.spawn(|| {
                for batch in &log {
                    source.apply(batch);
                    // Release pairs with the Acquire below: a reader that sees `n` sees the
                    // effects of the first `n` batches.
                    applied.fetch_add(1, Ordering::Release);
                }
            });
            // Start the snapshot somewhere in the middle of the log.
            while applied.load(Ordering::Acquire) < 40 + (round % 8) * 30 {
                std::hint::spin_loop();
            }
            let recorded = applied.load(Ordering::Acquire);
            let mut bytes = Vec::new();
            let meta = SnapshotMeta {
                source: "log".into(),
                offsets: vec![PartitionOffset {
                    partition: 0,
                    next_offset: recorded as i64,
                }],
            };
            source.write_snapshot(&meta, &mut bytes).expect("write");
            exercised_overlap |= applied.load(Ordering::Acquire) > recorded;
            (recorded, bytes)
        });

        let restored = PostStore::with_config(config(&clock));
        let report = restored.load_snapshot(bytes.as_slice(), 2).expect("load");
        let from = usize::try_from(report.header.meta.offsets[0].next_offset).expect("offset");
        assert_eq!(from, recorded);
        for batch in &log[from..] {
            restored.apply(batch);
        }
        let full = SharedModel::new(config(&clock));
        for batch in &log {
            full.apply(batch);
        }
        let everyone: Vec<i64> = (0..60).collect();
        for videos in [false, true] {
            for authors in [everyone.clone(), everyone[..7].to_vec(), vec![13]] {
                let query = OwnedQuery::new(videos, 5, authors);
                let (got, want) = (restored.answer(&query), full.answer(&query));
                assert!(!want.posts.is_empty());
                if let Err(e) = answers_agree(&got.posts, &want.posts, query.max_results) {
                    panic!("round {round}, snapshot at batch {recorded}, {query:?}: {e}");
                }
            }
        }
        assert_eq!(restored.stored_posts(), full.stored_posts());
    }
    assert!(
        exercised_overlap,
        "no snapshot ran while the writer was still applying batches"
    );
}

fn sample_store() -> (Arc<ManualClock>, PostStore) {
    let clock = Arc::new(ManualClock::new(START_SECS));
    let store = PostStore::with_config(config(&clock));
    let posts: Vec<LightPost> = (0..300)
        .map(|i| LightPost::original(i, i % 9, START_SECS - i))
        .collect();
    store.insert_posts(&posts);
    store.mark_as_deleted(&[DeleteEvent {
        post_id: 5,
        deleted_at: START_SECS,
    }]);
    (clock, store)
}

fn assert_refused(bytes: &[u8], clock: &Arc<ManualClock>, what: &str) -> SnapshotError {
    let target = PostStore::with_config(config(clock));
    let error = target
        .load_snapshot(bytes, 2)
        .expect_err(&format!("{what} must be refused"));
    assert!(verify(bytes).is_err(), "{what}: verify accepted it");
    let in_place = PostStore::with_config(config(clock));
    let in_place_error = in_place
        .load_snapshot_in_place(bytes, 2, true)
        .expect_err(&format!("{what} must be refused in place"));
    assert_eq!(
        in_place_error.to_string(),
        error.to_string(),
        "{what}: the same error in place"
    );
    for target in [&target, &in_place] {
        assert_eq!(target.stored_posts(), 0, "{what}: posts were loaded");
        assert_eq!(
            target.stats().tombstones,
            0,
            "{what}: tombstones were loaded"
        );
    }
    error
}

#[test]
fn every_truncation_is_refused_and_loads_nothing() {
    let (clock, store) = sample_store();
    let bytes = snapshot_bytes(&store);
    let (_, counts) = verify(bytes.as_slice()).expect("the whole file verifies");
    assert_eq!((counts.posts, counts.tombstones), (299, 1));
    for len in (0..bytes.len())
        .step_by(37)
        .chain(0..40)
        .chain([bytes.len() - 1])
    {
        let error = assert_refused(&bytes[..len], &clock, &format!("cut at {len}"));
        assert!(
            matches!(error, SnapshotError::Truncated(_)),
            "cut at {len}: {error}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_refused(&longer, &clock, "trailing data");
}

#[test]
fn every_flipped_byte_is_refused_and_loads_nothing() {
    let (clock, store) = sample_store();
    let bytes = snapshot_bytes(&store);
    for at in (0..bytes.len()).step_by(23).chain(0..40) {
        let mut corrupt = bytes.clone();
        corrupt[at] ^= 0x10;
        assert_refused(&corrupt, &clock, &format!("byte {at} flipped"));
    }
}

#[test]
fn incompatible_snapshots_are_refused() {
    let (clock, store) = sample_store();
    let bytes = snapshot_bytes(&store);

    let mut other_version = bytes.clone();
    other_version[8] = 1;
    let error = assert_refused(&other_version, &clock, "version 1");
    assert!(matches!(
        error,
        SnapshotError::UnsupportedVersion { found: 1 }
    ));

    // A header with another layout hash and a valid checksum.
    let (_, header_len) = read_header(&mut bytes.as_slice()).expect("header");
    let header_len = header_len as usize;
    let mut other_layout = bytes.clone();
    other_layout[16..20].copy_from_slice(&(layout_hash() ^ 1).to_le_bytes());
    let crc = crc32c::crc32c(&other_layout[..header_len - 4]);
    other_layout[header_len - 4..header_len].copy_from_slice(&crc.to_le_bytes());
    let error = assert_refused(&other_layout, &clock, "another layout");
    assert!(
        matches!(error, SnapshotError::LayoutMismatch { .. }),
        "{error}"
    );

    assert!(matches!(
        assert_refused(b"not a snapshot at all", &clock, "junk"),
        SnapshotError::BadMagic
    ));

    let longer_retention = PostStore::with_config(StoreConfig {
        retention_secs: RETENTION_SECS + 1,
        ..config(&clock)
    });
    let error = longer_retention
        .load_snapshot(bytes.as_slice(), 1)
        .expect_err("a shorter retention than the store's is refused");
    assert!(matches!(error, SnapshotError::Incompatible(_)), "{error}");
    assert_eq!(longer_retention.stored_posts(), 0);
}

#[test]
fn expired_posts_and_tombstones_are_skipped_on_load() {
    let (clock, store) = sample_store();
    let bytes = snapshot_bytes(&store);
    clock.advance(RETENTION_SECS - 100);
    let loaded = PostStore::with_config(config(&clock));
    let report = loaded.load_snapshot(bytes.as_slice(), 2).expect("load");
    // Posts created at START - i are kept while i <= 100.
    assert_eq!(report.posts_loaded, 100);
    assert_eq!(report.posts_skipped, 199);
    assert_eq!(loaded.stored_posts(), 100);
    assert_eq!(report.tombstones_loaded, 1);
    // A post expired since the snapshot never reaches the store, not even for a moment.
    assert_eq!(report.inserts.too_old, 0);
}

/// Originals (kept in the arena's small record class, their conversation id in its spare
/// word) and replies and reposts (the large class) come back from a snapshot field for field:
/// the file's post records have one 64-byte layout whatever the class, so the layout hash
/// did not need to change with the two-class arena.
#[test]
fn both_record_classes_round_trip_through_a_snapshot() {
    let clock = Arc::new(ManualClock::new(START_SECS));
    let store = PostStore::with_config(config(&clock));
    let posts: Vec<LightPost> = (1..=100)
        .map(|i: i64| {
            let mut post = LightPost::original(i, i % 5, START_SECS - 200 + i);
            match i % 4 {
                0 => {
                    post.is_reply = true;
                    post.in_reply_to_post_id = Some(i - 1);
                    post.in_reply_to_user_id = Some((i - 1) % 5);
                    post.conversation_id = Some(i - 1);
                }
                1 => {
                    post.is_retweet = true;
                    post.source_post_id = Some(i - 2);
                    post.source_user_id = Some((i - 2) % 5);
                }
                _ => {
                    post.conversation_id = Some(i);
                    post.has_video = i % 3 == 0;
                }
            }
            post
        })
        .collect();
    assert_eq!(store.insert_posts(&posts).inserted, 100);
    let bytes = snapshot_bytes(&store);
    let loaded = PostStore::with_config(config(&clock));
    let report = loaded.load_snapshot(bytes.as_slice(), 2).expect("load");
    assert_eq!(report.posts_loaded, 100);

    let inserted: std::collections::HashMap<i64, LightPost> =
        posts.iter().map(|p| (p.post_id, p.normalised())).collect();
    for videos in [false, true] {
        let query = OwnedQuery::new(videos, -1, (0..5).collect());
        let (before, after) = (store.answer(&query), loaded.answer(&query));
        assert_eq!(before.posts, after.posts, "videos {videos}");
        for post in &after.posts {
            assert_eq!(Some(post), inserted.get(&post.post_id), "videos {videos}");
        }
    }
    let feed = loaded.answer(&OwnedQuery::new(false, -1, (0..5).collect()));
    let count = |kind: fn(&LightPost) -> bool| feed.posts.iter().filter(|p| kind(p)).count();
    assert_eq!(count(|p| p.conversation_id == Some(p.post_id)), 50);
    assert!(count(|p| p.is_reply && p.in_reply_to_post_id.is_some()) > 0);
    assert!(count(|p| p.is_retweet && p.source_post_id.is_some()) > 0);
}

/// Loads `store`'s snapshot in bulk and through the per-post path (one thread: the load
/// order), checks the bulk path was taken or refused as `expected`, and that both stores
/// are identical. Returns them.
fn bulk_and_per_post(
    store: &PostStore,
    config: impl Fn() -> StoreConfig,
    expected: Option<BulkRefusal>,
) -> (PostStore, PostStore) {
    let bytes = snapshot_bytes(store);
    let bulk = PostStore::with_config(config());
    let report = bulk.load_snapshot(bytes.as_slice(), 2).expect("loads");
    assert_eq!(report.per_post_reason, expected);
    let per_post = PostStore::with_config(config());
    let reference = per_post
        .load_snapshot_with(bytes.as_slice(), 1, false, None)
        .expect("loads");
    assert_eq!(report.inserts, reference.inserts);
    assert_identical(&bulk, &per_post, "after loading").expect("identical stores");
    (bulk, per_post)
}

fn videos_of(store: &PostStore, author: i64) -> Vec<i64> {
    store
        .answer(&OwnedQuery::new(true, 1_000_000, vec![author]))
        .posts
        .iter()
        .map(|p| p.post_id)
        .collect()
}

fn repost(post_id: i64, author_id: i64, source: i64, created_at: i64) -> LightPost {
    let mut post = LightPost::original(post_id, author_id, created_at);
    post.is_retweet = true;
    post.source_post_id = Some(source);
    post
}

fn reply(post_id: i64, author_id: i64, created_at: i64) -> LightPost {
    let mut post = LightPost::original(post_id, author_id, created_at);
    post.is_reply = true;
    post
}

fn video(post_id: i64, author_id: i64, created_at: i64) -> LightPost {
    let mut post = LightPost::original(post_id, author_id, created_at);
    post.has_video = true;
    post
}

/// A snapshot of several chunks loads the same whatever input length the load is given:
/// exact, too small (the first chunks appended as read, the rest after; two sizes), zero, too
/// large, one no allocator can reserve, or none. The loading stores have a smaller cap than the writer, so the load evicts.
#[test]
fn the_input_length_given_to_a_load_changes_nothing() {
    let clock = Arc::new(ManualClock::new(START_SECS));
    let store = PostStore::with_config(config(&clock));
    let posts: Vec<LightPost> = (0..120_000i64)
        .map(|i| {
            let (author, at) = (i % 7 - 1, START_SECS - i % 40);
            if i % 3 == 0 {
                reply(i, author, at)
            } else {
                LightPost::original(i, author, at)
            }
        })
        .collect();
    store.insert_posts(&posts);
    let bytes = snapshot_bytes(&store);
    let len = bytes.len() as u64;
    let reference = PostStore::with_config(capped(&clock, 50));
    let expected = reference
        .load_snapshot_with(bytes.as_slice(), 2, true, None)
        .expect("loads");
    assert!(
        expected.counts.posts > 2 * 32_768,
        "several chunks per class"
    );
    for hint in [
        Some(len),
        Some(len / 2),
        Some(len * 6 / 10),
        Some(0),
        Some(len * 4),
        Some(u64::MAX),
    ] {
        let loaded = PostStore::with_config(capped(&clock, 50));
        let report = loaded
            .load_snapshot_with(bytes.as_slice(), 2, true, hint)
            .expect("loads");
        assert_eq!(report.posts_loaded, expected.posts_loaded);
        assert_identical(&loaded, &reference, &format!("input length {hint:?}"))
            .expect("identical stores");
    }
}

/// One author past the default 5000 cap in both primary timelines, with reposts of video
/// sources that were and were not evicted: built in bulk, identical to the per-post path.
#[test]
fn an_author_over_the_cap_is_built_in_bulk_like_the_per_post_path() {
    let clock = Arc::new(ManualClock::new(START_SECS));
    let config = || StoreConfig {
        retention_secs: 100_000,
        ..config(&clock)
    };
    let store = PostStore::with_config(config());
    let base = START_SECS - 50_000;
    let mut posts: Vec<LightPost> = (0..6_000)
        .map(|i| {
            if i % 10 == 0 {
                video(i, 1, base + i)
            } else {
                LightPost::original(i, 1, base + i)
            }
        })
        .collect();
    // Author 2 reposts author 1's posts (evicted or not, videos or not) and more than the
    // cap of its own, some before their source.
    posts.extend((0..5_300).map(|i| {
        let mut post = repost(10_000 + i, 2, (i * 7) % 6_000, base + i + 3);
        // Quote replies are secondary posts but never video entries: the secondary timeline
        // passes the cap while the videos one stays below it.
        post.is_reply = i % 2 == 1;
        post
    }));
    posts.extend((0..40).map(|i| repost(20_000 + i, 3, 30_000 + i, base + 100 + i)));
    store.insert_posts(&posts);
    assert_eq!(store.stats().original_entries, 5_000);
    let (bulk, per_post) = bulk_and_per_post(&store, config, None);
    assert_eq!(videos_of(&bulk, 2), videos_of(&per_post, 2));
    assert!(!videos_of(&bulk, 2).is_empty());
    // Sources that were missing arrive after the load: their reposts become videos in both.
    let sources: Vec<LightPost> = (0..40)
        .map(|i| video(30_000 + i, 4, base + 50 + i))
        .collect();
    for store in [&bulk, &per_post] {
        assert!(videos_of(store, 3).is_empty());
        store.insert_posts(&sources);
        assert_eq!(videos_of(store, 3).len(), 40);
    }
    assert_identical(&bulk, &per_post, "after the sources arrived").expect("identical");
}

/// A repost whose (later) video source arrives after the repost was evicted from its
/// timeline is not promoted (its record is gone by then); one still held is.
#[test]
fn a_repost_evicted_before_its_source_arrives_is_not_promoted() {
    let clock = Arc::new(ManualClock::new(START_SECS));
    let config = || capped(&clock, 3);
    let store = PostStore::with_config(config());
    let t = START_SECS - 500;
    // In the store: the reposts first, then their sources (promoting them), then two
    // replies of author 1, which evict repost 1 from its secondary timeline (it stays a
    // video entry, so the snapshot holds it).
    store.insert_posts(&[repost(1, 1, 100, t), repost(2, 1, 101, t + 3)]);
    store.insert_posts(&[video(100, 2, t + 10), video(101, 2, t + 11)]);
    store.insert_posts(&[reply(3, 1, t + 4), reply(4, 1, t + 5)]);
    assert_eq!(videos_of(&store, 1), vec![2, 1]);
    // Loaded in time order, repost 1 is evicted (at t + 5) before its source arrives (t + 10):
    // gone; repost 2 is still held when its source arrives: promoted.
    let (bulk, _) = bulk_and_per_post(&store, config, None);
    assert_eq!(videos_of(&bulk, 1), vec![2]);
}

/// Among equal `created_at`, a repost promoted when its source arrives goes to its id's place,
/// whenever it arrives: with 500 video posts of the same second, the 500-entry scan window
/// reaches it first when its id is the largest of the second, and not at all when it is the
/// smallest.
#[test]
fn a_promoted_repost_goes_to_its_ids_place_among_the_entries_of_its_second() {
    for (repost_id, in_window) in [(10_000, true), (1, false)] {
        let clock = Arc::new(ManualClock::new(START_SECS));
        let store = PostStore::with_config(config(&clock));
        let t = START_SECS - 500;
        store.insert_posts(&[repost(repost_id, 1, 9_999, t)]);
        let own: Vec<LightPost> = (0..500).map(|i| video(10 + i, 1, t)).collect();
        store.insert_posts(&own);
        store.insert_posts(&[video(9_999, 2, t + 1)]);
        for store in [
            &store,
            &bulk_and_per_post(&store, || config(&clock), None).0,
        ] {
            assert_eq!(
                videos_of(store, 1).contains(&repost_id),
                in_window,
                "repost {repost_id}"
            );
        }
    }
}

/// More video entries possible for one author than the cap: the bulk build refuses and the
/// per-post path builds the store.
#[test]
fn an_author_over_the_videos_cap_falls_back_to_the_per_post_path() {
    let clock = Arc::new(ManualClock::new(START_SECS));
    let config = || capped(&clock, 3);
    let store = PostStore::with_config(config());
    let t = START_SECS - 500;
    store.insert_posts(&[video(1, 1, t), video(2, 1, t + 1), repost(3, 1, 2, t + 2)]);
    store.insert_posts(&[video(4, 1, t + 3), LightPost::original(5, 2, t)]);
    let (bulk, _) = bulk_and_per_post(&store, config, Some(BulkRefusal::VideosOverCap));
    assert_eq!(
        videos_of(&bulk, 1),
        vec![4, 3, 2],
        "post 1 was evicted from the videos"
    );
}
