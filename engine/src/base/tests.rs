//! Tests that span the wing: files written from hand-made runs, opened, looked up, changed;
//! and damaged files refused.

use super::file::BaseBytes;
use super::format::*;
use super::tier::{Base, ORIGINALS, SECONDARY, VIDEOS};
use super::write::{AuthorRuns, BaseWriter};
use crate::arena::CompactPost;
use crate::snapshot::{PartitionOffset, SnapshotHeader, SnapshotMeta};

const NOW: u32 = 1_700_000_000;

pub(crate) fn header() -> SnapshotHeader {
    SnapshotHeader {
        format_version: BASE_FORMAT_VERSION,
        layout_hash: base_layout_hash(),
        retention_secs: 1000,
        created_at_secs: i64::from(NOW),
        meta: SnapshotMeta {
            source: "topic".into(),
            offsets: vec![PartitionOffset {
                partition: 0,
                next_offset: 7,
            }],
        },
        shard: None,
    }
}

fn record(post_id: i64, author_id: i64, created_at: u32) -> BaseRecord {
    BaseRecord {
        post: CompactPost {
            post_id,
            author_id,
            created_at,
            in_reply_to_post_id: 0,
            in_reply_to_user_id: 0,
            source_post_id: 0,
            source_user_id: 0,
            conversation_id: post_id,
            is_retweet: false,
            is_reply: false,
            has_video: false,
        },
        parent: None,
        source: None,
    }
}

/// Author `a` (1..=authors): originals `a*100 + i` for i < a, one reply to the author's newest
/// original embedding its facts, and its originals with an even id in its videos run.
fn sample_runs(authors: i64) -> Vec<(i64, AuthorRuns)> {
    (1..=authors)
        .map(|a| {
            let mut runs = AuthorRuns::default();
            for i in (0..a).rev() {
                let mut r = record(a * 100 + i, a, NOW - 100 + i as u32);
                r.post.has_video = r.post.post_id % 2 == 0;
                runs.originals.push(r);
            }
            let parent = runs.originals[0].post;
            let mut reply = record(a * 100 + 99, a, NOW - 1);
            reply.post.is_reply = true;
            reply.post.in_reply_to_post_id = parent.post_id;
            reply.post.in_reply_to_user_id = a;
            reply.parent = Some(Embedded {
                created_at: parent.created_at,
                flag: true,
                continues: false,
            });
            runs.secondary.push(reply);
            runs.videos = runs
                .originals
                .iter()
                .filter(|r| r.post.has_video)
                .copied()
                .collect();
            (a, runs)
        })
        .collect()
}

/// A base file of `runs`.
pub(crate) fn write(runs: &[(i64, AuthorRuns)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut writer = BaseWriter::start(&mut bytes, &header()).unwrap();
    writer.tombstones(&[(5, i64::from(NOW))]).unwrap();
    writer.waiting(&[]).unwrap();
    writer.facts(|_| false).unwrap();
    let authors: Vec<i64> = runs.iter().map(|(a, _)| *a).collect();
    let posts = runs
        .iter()
        .map(|(_, r)| r.originals.len() + r.secondary.len())
        .sum();
    writer.place_authors(&authors, posts);
    for (line, author) in writer.author_order() {
        let (_, author_runs) = runs.iter().find(|(a, _)| *a == author).unwrap();
        writer.author(line, author_runs).unwrap();
    }
    let counts = writer.finish(5000).unwrap();
    assert_eq!(counts.bytes, bytes.len() as u64);
    assert_eq!(counts.posts, posts as u64);
    bytes
}

fn open(bytes: &[u8]) -> Base {
    checked(bytes, 5000).expect("opens")
}

/// Opens `bytes` and checks every record.
fn checked(bytes: &[u8], cap: usize) -> Result<Base, crate::snapshot::SnapshotError> {
    let base = Base::open(BaseBytes::copy_of(bytes), 2, cap)?;
    base.check_records(2)?;
    Ok(base)
}

#[test]
fn a_written_base_opens_and_finds_every_author_and_post() {
    let runs = sample_runs(40);
    let bytes = write(&runs);
    let base = open(&bytes);
    assert_eq!(base.info().header, header());
    assert_eq!(
        base.stored_posts(),
        runs.iter().map(|(a, _)| *a as usize + 1).sum::<usize>()
    );
    for (author, author_runs) in &runs {
        let at = base.line_of(*author).expect("author found");
        let line = base.file.line(at);
        assert_eq!(line.author_id, *author);
        for (kind, run) in [&author_runs.originals, &author_runs.secondary]
            .into_iter()
            .enumerate()
        {
            assert_eq!(usize::from(line.lens[kind]), run.len());
            for (index, expected) in run.iter().enumerate() {
                let granule = base.entry_granule(&line, kind, index);
                assert_eq!(&base.record(&line, granule), expected);
                let (found, stored) = base.stored(expected.post.post_id).expect("stored");
                assert_eq!((found, &stored), (granule, expected));
            }
        }
        let videos: Vec<(u32, i64)> = (0..usize::from(line.lens[VIDEOS]))
            .map(|i| {
                let post = base
                    .record(&line, base.entry_granule(&line, VIDEOS, i))
                    .post;
                (post.created_at, post.post_id)
            })
            .collect();
        let expected: Vec<(u32, i64)> = author_runs
            .videos
            .iter()
            .map(|r| (r.post.created_at, r.post.post_id))
            .collect();
        assert_eq!(videos, expected);
    }
    assert_eq!(base.line_of(1000), None);
    assert_eq!(base.stored(1), None);
    assert_eq!(base.live_entries(ORIGINALS), (1..=40).sum::<usize>());
}

#[test]
fn a_delete_leaves_every_run_and_an_eviction_frees_what_no_run_holds() {
    let bytes = write(&sample_runs(6));
    let base = open(&bytes);
    let at = base.line_of(6).unwrap();
    let lens = base.file.line(at).lens;
    // Author 6: originals 605..600 (newest first), videos 604, 602, 600.
    assert_eq!(lens, [6, 1, 3, 0]);
    let deleted = base.delete(604).expect("stored");
    assert_eq!(deleted.author_id, 6);
    assert_eq!(base.delete(604), None, "once");
    assert_eq!(base.stored(604), None);
    let run = |kind| base.run(at, &lens, kind);
    assert_eq!((run(ORIGINALS).live, run(VIDEOS).live), (5, 2));
    assert!(run(ORIGINALS).dirty);
    // The cap evicts the oldest original (600): the videos run still holds it.
    assert_eq!(
        base.cut_oldest(at, ORIGINALS, |_| true, |_| false),
        (5, 3),
        "604 gone: passed over"
    );
    assert_eq!(
        run(ORIGINALS).live,
        0,
        "a cut without a bound takes the whole run"
    );
    assert!(base.stored(600).is_some(), "held by the videos run");
    assert!(base.stored(601).is_none(), "held by no run");
    // Then the videos run's oldest: 600 leaves its last timeline.
    assert_eq!(
        base.cut_oldest(at, VIDEOS, |key| key.1 == 600, |_| false),
        (1, 1)
    );
    assert!(base.stored(600).is_none());
    assert!(!base.embedded_holds(600));
    assert_eq!(run(VIDEOS).live, 1);
    assert_eq!(base.oldest_live(at, VIDEOS).map(|k| k.1), Some(602));
    assert_eq!(base.oldest_live(at, SECONDARY).map(|k| k.1), Some(699));
    assert!(base.embedded_holds(699));
}

#[test]
fn every_damaged_byte_and_every_truncation_is_refused() {
    let bytes = write(&sample_runs(5));
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x20;
        // The checksums alone refuse it: the structure is never read.
        assert!(
            Base::open(BaseBytes::copy_of(&damaged), 1, 5000).is_err(),
            "byte {at} of {}",
            bytes.len()
        );
    }
    for len in 0..bytes.len() {
        assert!(checked(&bytes[..len], 5000).is_err(), "cut at {len}");
    }
}

#[test]
fn a_run_longer_than_the_cap_is_refused() {
    let bytes = write(&sample_runs(5));
    let error = checked(&bytes, 4).unwrap_err();
    assert!(error.to_string().contains("cap"), "{error}");
}

// ---- files written from a store ----

use crate::PostStore;
use crate::clock::ManualClock;
use crate::post::{DeleteEvent, LightPost};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Every author's timelines, newest first, as keys; and every stored record.
type Timelines = BTreeMap<i64, [Vec<(u32, i64)>; 3]>;

fn store_timelines(store: &PostStore) -> (Timelines, BTreeMap<i64, CompactPost>) {
    let tables = store.tables();
    let epoch = crossbeam_epoch::pin();
    let (mut timelines, mut records) = (Timelines::new(), BTreeMap::new());
    tables.authors.for_each(|author| {
        let mut kinds: [Vec<(u32, i64)>; 3] = Default::default();
        for kind in crate::authors::Kind::ALL {
            let Some(view) = author.timeline(kind).view(&epoch) else {
                continue;
            };
            for seq in (view.tail..view.head).rev() {
                let entry = view.get(seq).unwrap();
                let record = tables.posts.read(entry.slot, entry.post_id).unwrap();
                records.insert(record.post_id, record);
                kinds[kind as usize].push(entry.key());
            }
        }
        if kinds.iter().any(|k| !k.is_empty()) {
            timelines.insert(author.author_id(), kinds);
        }
    });
    (timelines, records)
}

fn base_timelines(base: &Base) -> (Timelines, BTreeMap<i64, CompactPost>) {
    let (mut timelines, mut records) = (Timelines::new(), BTreeMap::new());
    for at in 0..base.file.lines {
        let line = base.file.line(at);
        if !line.used {
            continue;
        }
        let mut kinds: [Vec<(u32, i64)>; 3] = Default::default();
        for (kind, keys) in kinds.iter_mut().enumerate() {
            let run = base.run(at, &line.lens, kind);
            for index in 0..run.end {
                let granule = base.entry_granule(&line, kind, index);
                if run.dirty && base.state.is_gone(granule) {
                    continue;
                }
                let post = base.record(&line, granule).post;
                records.insert(post.post_id, post);
                keys.push((post.created_at, post.post_id));
            }
        }
        if kinds.iter().any(|k| !k.is_empty()) {
            timelines.insert(line.author_id, kinds);
        }
    }
    (timelines, records)
}

/// A store of `posts` posts over `authors` authors (originals, replies to earlier posts,
/// reposts of earlier posts, videos; some deleted), at a cap of `cap`.
pub(crate) fn sample_store(
    posts: i64,
    authors: i64,
    cap: usize,
    seed: u64,
) -> (Arc<ManualClock>, PostStore) {
    use rand::{Rng, SeedableRng};
    let now = i64::from(NOW);
    let clock = Arc::new(ManualClock::new(now));
    let store = PostStore::with_config(crate::StoreConfig {
        retention_secs: 1000,
        max_posting_list_size: cap,
        clock: clock.clone(),
    });
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut batch = Vec::new();
    for id in 1..=posts {
        let mut post = LightPost::original(
            id,
            rng.random_range(0..authors),
            now - rng.random_range(0..900),
        );
        match rng.random_range(0..10) {
            0..=5 => {
                post.conversation_id = Some(id);
                post.has_video = rng.random_range(0..5) == 0;
            }
            6..=7 => {
                let parent = rng.random_range(1..=posts);
                post.is_reply = true;
                post.in_reply_to_post_id = Some(parent);
                post.in_reply_to_user_id = Some(rng.random_range(0..authors));
                post.conversation_id = Some(rng.random_range(1..=posts));
            }
            _ => {
                post.is_retweet = true;
                post.source_post_id = Some(rng.random_range(1..=posts + 10));
                post.source_user_id = Some(rng.random_range(0..authors));
                post.has_video = rng.random_range(0..8) == 0;
            }
        }
        batch.push(post);
    }
    store.insert_posts(&batch);
    let deletes: Vec<DeleteEvent> = (1..=posts)
        .filter(|id| id % 13 == 0)
        .map(|post_id| DeleteEvent {
            post_id,
            deleted_at: now,
        })
        .collect();
    store.mark_as_deleted(&deletes);
    (clock, store)
}

fn base_of(store: &PostStore) -> Vec<u8> {
    let mut bytes = Vec::new();
    crate::base_io::write_base(store.tables(), &header().meta, &mut bytes).unwrap();
    bytes
}

#[test]
fn a_store_written_as_a_base_holds_exactly_its_timelines_and_records() {
    for (cap, seed) in [(5000, 1), (3, 2), (1, 3)] {
        let (_, store) = sample_store(3000, 40, cap, seed);
        let bytes = base_of(&store);
        let base = checked(&bytes, cap).expect("opens");
        assert_eq!(base_timelines(&base), store_timelines(&store), "cap {cap}");
        assert_eq!(base.stored_posts(), store.stats().posts);
        // A base written from a store holding only that base (its small sections restored
        // into the store) holds the same records, directory and index, byte for byte, and
        // the same tombstones.
        let again = PostStore::with_config(crate::StoreConfig {
            retention_secs: 1000,
            max_posting_list_size: cap,
            clock: Arc::new(ManualClock::new(i64::from(NOW))),
        });
        let report = again.load_base_bytes(&bytes, 2).expect("loads");
        assert_eq!(report.tombstones_loaded, store.stats().tombstones as u64);
        let rewritten = base_of(&again);
        let reopened = checked(&rewritten, cap).expect("opens");
        for section in [
            Section::Records,
            Section::Videos,
            Section::Directory,
            Section::Posts,
        ] {
            assert!(
                reopened.file.section(section) == base.file.section(section),
                "cap {cap}: the {} differ",
                section.name()
            );
        }
        let sorted = |base: &Base, section: Section, size: usize| {
            let mut items: Vec<&[u8]> = base.file.section(section).chunks(size).collect();
            items.sort();
            items.concat()
        };
        for (section, size) in [
            (Section::Tombstones, TOMBSTONE_BYTES),
            (Section::Waiting, WAITING_BYTES),
        ] {
            assert!(
                sorted(&reopened, section, size) == sorted(&base, section, size),
                "cap {cap}"
            );
        }
    }
}
