//! Tests that span the wing: snapshots rewritten into other chunk layouts, or damaged, and
//! loaded in place against a streamed load; and the helpers other files' tests share.

use std::sync::Arc;

use super::format::*;
use super::load::first_unexpired;
use super::mapped::{InPlace, MappedPosts};
use super::order::in_timeline_order_already;
use super::reader::{Chunk, PostsInto, SnapshotReader};
use super::write::ChunkWriter;
use super::*;
use crate::arena::CompactPost;
use crate::bulk::PostSource;
use crate::post::LightPost;
use crate::store::PostStore;

/// Deletes every `step`-th id from 1 to `last`, at `at`.
pub(super) fn delete_every(store: &PostStore, last: i64, step: usize, at: i64) {
    let deleted: Vec<crate::DeleteEvent> = (1..=last)
        .step_by(step)
        .map(|post_id| crate::DeleteEvent {
            post_id,
            deleted_at: at,
        })
        .collect();
    store.mark_as_deleted(&deleted);
}

/// The posts of a snapshot, decoded, in file order.
pub(super) fn posts_of(bytes: &[u8]) -> Vec<CompactPost> {
    let mut reader = SnapshotReader::new(bytes).unwrap();
    let mut posts = Vec::new();
    loop {
        match reader.next_chunk(PostsInto::Decoded(None)).unwrap() {
            Chunk::Posts(chunk) => posts.extend(chunk),
            Chunk::End => return posts,
            _ => {}
        }
    }
}

/// `bytes` rewritten with the same header, tombstones and facts and its posts put into
/// posts chunks by `arrange` (each inner vector one chunk, in order).
fn rewritten(
    bytes: &[u8],
    arrange: impl FnOnce(Vec<CompactPost>) -> Vec<Vec<CompactPost>>,
) -> Vec<u8> {
    let mut reader = SnapshotReader::new(bytes).unwrap();
    let (mut tombstones, mut facts, mut posts) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        match reader.next_chunk(PostsInto::Decoded(None)).unwrap() {
            Chunk::Tombstones(chunk) => tombstones.extend(chunk),
            Chunk::Facts(chunk) => facts.extend(chunk),
            Chunk::Posts(chunk) => posts.extend(chunk),
            Chunk::End => break,
            Chunk::PostsAppended | Chunk::PostsChecked | Chunk::PostsUnchecked => {
                unreachable!()
            }
        }
    }
    let mut out = encode_header(&reader.header).unwrap();
    let mut writer = ChunkWriter {
        out: &mut out,
        counts: SnapshotCounts::default(),
        buf: Vec::new(),
    };
    for (post_id, basis) in tombstones {
        writer.buf.extend_from_slice(&post_id.to_le_bytes());
        writer.buf.extend_from_slice(&basis.to_le_bytes());
        writer.write(KIND_TOMBSTONES, 1).unwrap();
        writer.counts.tombstones += 1;
    }
    assert!(facts.is_empty(), "a full store's snapshot holds no facts");
    for chunk in arrange(posts) {
        for post in &chunk {
            encode_post(post, &mut writer.buf);
        }
        writer.write(KIND_POSTS, chunk.len()).unwrap();
        writer.counts.posts += chunk.len() as u64;
    }
    let counts = writer.counts;
    for n in [counts.tombstones, counts.posts, counts.chunks, counts.facts] {
        writer.buf.extend_from_slice(&n.to_le_bytes());
    }
    writer.write(KIND_END, 0).unwrap();
    out
}

/// The posts of `bytes` read in place, and whether they are in timeline order; `None`
/// when their chunks are not of one size (a load decodes them first).
fn in_place_posts(bytes: &[u8]) -> Option<(MappedPosts<'_>, bool)> {
    let mut reader = SnapshotReader::new(bytes).unwrap();
    let mut chunks = Vec::new();
    loop {
        match reader.next_chunk_in_place().unwrap() {
            InPlace::Posts(chunk) => chunks.push(chunk.records),
            InPlace::End => break,
            _ => {}
        }
    }
    let posts = MappedPosts::new(&chunks)?;
    let sorted = in_timeline_order_already(&posts, 2);
    Some((posts, sorted))
}

/// Every feed and videos answer of authors `1..=authors`, one author at a time.
fn answers(store: &PostStore, authors: i64) -> Vec<Vec<i64>> {
    (1..=authors)
        .flat_map(|author| {
            let followed = [author];
            let query = crate::FeedQuery::new(0, &followed);
            [
                store.get_all_posts_by_users(&query),
                store.get_videos_by_users(&query),
            ]
        })
        .map(|outcome| outcome.posts.iter().map(|p| p.post_id).collect())
        .collect()
}

/// Every chunk of `bytes`: its kind, the offset of its 16-byte header, its payload length.
fn chunk_spans(bytes: &[u8]) -> Vec<(u8, usize, usize)> {
    let reader = SnapshotReader::new(bytes).unwrap();
    let mut at = bytes.len() - reader.input.len();
    let mut spans = Vec::new();
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        spans.push((bytes[at], at, len));
        at += CHUNK_HEADER_BYTES + len;
    }
    spans
}

/// Rewrites the stored checksum of the chunk at `at` to match its contents.
fn reseal(bytes: &mut [u8], at: usize, len: usize) {
    let body = &bytes[at + CHUNK_HEADER_BYTES..at + CHUNK_HEADER_BYTES + len];
    let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[at..at + 12]), body);
    bytes[at + 12..at + 16].copy_from_slice(&crc.to_le_bytes());
}

/// A load in place checks its posts chunks on several threads, and still reports what a
/// check in file order reports: the first bad chunk, whichever thread found it, before
/// any error of a later chunk; a snapshot with no bad chunk loads.
#[test]
fn a_load_in_place_reports_the_first_bad_chunk_on_any_number_of_threads() {
    const NOW: i64 = 1_700_000_000;
    let clock = Arc::new(crate::ManualClock::new(NOW));
    let store = PostStore::with_clock(1_000, clock.clone());
    let batch: Vec<LightPost> = (1..=20_000i64)
        .map(|id| LightPost::original(id, 1 + id % 50, NOW - 500 + id % 400))
        .collect();
    store.insert_posts(&batch);
    let mut bytes = Vec::new();
    store
        .write_snapshot(&SnapshotMeta::default(), &mut bytes)
        .unwrap();
    let good = rewritten(&bytes, |posts| {
        posts.chunks(1_024).map(<[CompactPost]>::to_vec).collect()
    });
    let spans = chunk_spans(&good);
    let posts: Vec<usize> = (0..spans.len())
        .filter(|&i| spans[i].0 == KIND_POSTS)
        .collect();
    assert!(posts.len() >= 16, "{} posts chunks", posts.len());
    let payload_byte = |chunk: usize, offset: usize| spans[chunk].1 + CHUNK_HEADER_BYTES + offset;
    let (early, late) = (posts[3], posts[posts.len() - 2]);

    let mut flipped_late = good.clone();
    flipped_late[payload_byte(late, 9)] ^= 1;
    let mut flipped_both = flipped_late.clone();
    flipped_both[payload_byte(early, 100)] ^= 0x40;
    // A record with unknown flags, under a checksum that matches it.
    let mut bad_flags = good.clone();
    bad_flags[payload_byte(late, POST_BYTES + 60)] = 0x80;
    reseal(&mut bad_flags, spans[late].1, spans[late].2);
    let mut bad_flags_then_bad_end = bad_flags.clone();
    let end = spans.len() - 1;
    bad_flags_then_bad_end[payload_byte(end, 0)] ^= 1;
    reseal(&mut bad_flags_then_bad_end, spans[end].1, spans[end].2);
    let mut bad_end = good.clone();
    bad_end[payload_byte(end, 0)] ^= 1;
    reseal(&mut bad_end, spans[end].1, spans[end].2);

    let cases = [
        (flipped_late, format!("chunk {late}: checksum mismatch")),
        (flipped_both, format!("chunk {early}: checksum mismatch")),
        (bad_flags.clone(), "unknown flags 0x80".to_string()),
        (bad_flags_then_bad_end, "unknown flags 0x80".to_string()),
        (bad_end, "end chunk counts".to_string()),
    ];
    for (file, expected) in &cases {
        let in_order = verify(file.as_slice()).expect_err("a bad file").to_string();
        assert!(in_order.contains(expected.as_str()), "{in_order}");
        for threads in [1, 2, 3, 7] {
            let loaded = PostStore::with_clock(1_000, clock.clone());
            let error = loaded
                .load_snapshot_in_place(file, threads, true)
                .expect_err("a bad file");
            assert_eq!(error.to_string(), in_order, "{threads} threads");
            assert_eq!(loaded.stats().posts, 0, "nothing of a bad file is loaded");
        }
    }
    for threads in [1, 2, 3] {
        let loaded = PostStore::with_clock(1_000, clock.clone());
        let report = loaded.load_snapshot_in_place(&good, threads, true).unwrap();
        assert_eq!(report.posts_loaded, 20_000, "{threads} threads");
    }
}

/// A snapshot loaded in place (from memory, as from a mapped file) builds the store a
/// streamed load builds, with the same report: as written (several chunks, an expired
/// prefix, tombstones), in chunks of another power-of-two size, in chunks of uneven sizes
/// and out of timeline order (those two decoded first), into a store that is not empty
/// (the per-post path), and from a file.
#[test]
fn a_load_in_place_builds_what_a_streamed_load_builds() {
    use crate::Store;
    const NOW: i64 = 1_700_000_000;
    const AUTHORS: i64 = 40;
    let clock = Arc::new(crate::ManualClock::new(NOW));
    let store = PostStore::with_clock(1_000, clock.clone());
    let batch: Vec<LightPost> = (0..70_000i64)
        .map(|n| {
            let (id, at) = ((n * 7_919) % 70_001 + 1, NOW - 990 + (n * 37) % 900);
            let mut post = LightPost::original(id, 1 + n % AUTHORS, at);
            match n % 5 {
                0 => {
                    post.is_reply = true;
                    post.in_reply_to_post_id = Some(id + 1_000_000);
                }
                1 => post.has_video = true,
                2 => {
                    post.is_retweet = true;
                    post.source_post_id = Some(id - 1);
                }
                _ => {}
            }
            post
        })
        .collect();
    store.insert_posts(&batch);
    delete_every(&store, 70_001, 13, NOW);
    let mut bytes = Vec::new();
    store
        .write_snapshot(&SnapshotMeta::default(), &mut bytes)
        .unwrap();
    // The posts of the first 150 s of the batch's span expire before the loads.
    clock.set(NOW + 160);

    let uniform = rewritten(&bytes, |posts| {
        posts.chunks(4_096).map(<[CompactPost]>::to_vec).collect()
    });
    let uneven = rewritten(&bytes, |posts| {
        let (a, b) = posts.split_at(1_000);
        let (b, c) = b.split_at(5_000);
        vec![a.to_vec(), b.to_vec(), c.to_vec()]
    });
    let shuffled = rewritten(&bytes, |mut posts| {
        posts.reverse();
        posts
            .chunks(POSTS_PER_CHUNK)
            .map(<[CompactPost]>::to_vec)
            .collect()
    });
    let (written, sorted) = in_place_posts(&bytes).expect("one chunk size");
    assert!(sorted && written.chunks.len() >= 2 && written.shift == 15);
    let (four_k, sorted) = in_place_posts(&uniform).expect("one chunk size");
    assert!(sorted && four_k.shift == 12 && four_k.chunks.len() > 10);
    assert!(in_place_posts(&uneven).is_none());
    assert!(!in_place_posts(&shuffled).expect("one chunk size").1);
    // Read in place, the posts are the decoded ones, from any first post on.
    let decoded = posts_of(&bytes);
    let mut skipped = four_k;
    assert_eq!(skipped.len(), decoded.len());
    assert!((0..decoded.len()).all(|i| skipped.post(i) == decoded[i]));
    skipped.skip(5_000);
    assert_eq!(skipped.len(), decoded.len() - 5_000);
    assert!((0..skipped.len()).all(|i| skipped.post(i) == decoded[i + 5_000]));
    let expired = first_unexpired(&skipped, |t| store.tables().retention.expired(t, NOW + 160));
    assert!(expired > 0 && expired < skipped.len());

    let reference = PostStore::with_clock(1_000, clock.clone());
    let expected = reference
        .load_snapshot_with(bytes.as_slice(), 2, true, None)
        .unwrap();
    assert!(expected.per_post_reason.is_none());
    assert!(expected.posts_skipped > 0 && expected.tombstones_loaded > 0);
    let expected_answers = answers(&reference, AUTHORS);
    assert!(expected_answers.iter().filter(|a| !a.is_empty()).count() > AUTHORS as usize / 2);
    // What each post id holds, and each store's sizes.
    let records = |loaded: &PostStore| {
        let epoch = crossbeam_epoch::pin();
        let stats = loaded.stats();
        let sizes = (
            stats.posts,
            stats.original_entries,
            stats.secondary_entries,
            stats.video_entries,
            stats.authors,
        );
        let held: Vec<_> = (0..=70_001)
            .map(|id| loaded.tables().posts.lookup(id, &epoch))
            .collect();
        (sizes, held)
    };
    let expected_records = records(&reference);
    assert!(expected_records.1.iter().flatten().count() > 30_000);
    let same = |report: &LoadReport, loaded: &PostStore, what: &str| {
        assert_eq!(report.posts_loaded, expected.posts_loaded, "{what}");
        assert_eq!(report.posts_skipped, expected.posts_skipped, "{what}");
        assert_eq!(
            report.tombstones_loaded, expected.tombstones_loaded,
            "{what}"
        );
        assert_eq!(report.inserts, expected.inserts, "{what}");
        assert_eq!(loaded.stored_posts(), reference.stored_posts(), "{what}");
        assert!(
            answers(loaded, AUTHORS) == expected_answers,
            "{what}: answers differ"
        );
        assert!(
            records(loaded) == expected_records,
            "{what}: records differ"
        );
    };
    for (file, what) in [
        (&bytes, "as written"),
        (&uniform, "4096 a chunk"),
        (&uneven, "uneven chunks"),
        (&shuffled, "out of order"),
    ] {
        for threads in [1, 2, 3] {
            let loaded = PostStore::with_clock(1_000, clock.clone());
            let report = loaded.load_snapshot_in_place(file, threads, true).unwrap();
            assert!(report.per_post_reason.is_none(), "{what}");
            same(&report, &loaded, &format!("{what}, {threads} threads"));
        }
    }
    // The per-post path, asked for and as the fallback of a store that is not empty (a
    // post of an author no answer above names).
    let asked = PostStore::with_clock(1_000, clock.clone());
    let report = asked.load_snapshot_in_place(&bytes, 2, false).unwrap();
    assert_eq!(report.per_post_reason, Some(BulkRefusal::PerPostRequested));
    same(&report, &asked, "per-post path");
    let not_empty = PostStore::with_clock(1_000, clock.clone());
    not_empty.insert_posts(&[LightPost::original(9_000_000, 1_000, NOW)]);
    let report = not_empty.load_snapshot_in_place(&bytes, 2, true).unwrap();
    assert_eq!(report.per_post_reason, Some(BulkRefusal::StoreNotEmpty));
    assert_eq!(report.posts_loaded, expected.posts_loaded);
    assert!(answers(&not_empty, AUTHORS) == expected_answers);
    assert_eq!(records(&not_empty).1, expected_records.1);
    // From a file, through a mapping.
    let path = std::env::temp_dir().join(format!(
        "thunder-in-place-{}-{:?}.thsnap",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, &bytes).unwrap();
    let from_file = PostStore::with_clock(1_000, clock.clone());
    let loaded = std::fs::File::open(&path)
        .map_err(SnapshotError::from)
        .and_then(|file| from_file.load_snapshot_file(&file, 2));
    std::fs::remove_file(&path).unwrap();
    same(&loaded.unwrap(), &from_file, "from a file");
}
