//! Damaged snapshot files through both loaders: streamed (`load_snapshot`) and in place
//! (`load_snapshot_in_place`, which the server uses on a mapped file). Each input builds a
//! small store (posts of every kind, deletes), writes its snapshot, flips arbitrary bytes and
//! may cut the file short, then makes every checksum right again so that the damage reaches
//! the decoder instead of stopping at a CRC. Never a panic, and the two loaders agree:
//! - both refuse it with the same error, and both stores stay empty; or
//! - both load it, with the same report and the same store (sizes and answers).
//!
//! One loading thread each: with two, a file holding one post id twice (which a flipped byte
//! can make) is loaded through the per-post path on two threads, where which copy wins
//! depends on the interleaving.
#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use thunder_engine::snapshot::SnapshotMeta;
use thunder_engine::{DeleteEvent, FeedQuery, LightPost, ManualClock, PostStore, StoreConfig};

const NOW_SECS: i64 = 1_700_000_000;
const RETENTION_SECS: i64 = 200;

#[derive(Arbitrary, Debug)]
struct Input {
    /// (id, author, age in seconds, kind: original, reply, repost, video).
    posts: Vec<(u8, u8, u8, u8)>,
    deleted: Vec<u8>,
    /// Seconds the clock moves between the write and the loads (some posts expire).
    later: u8,
    /// (offset, xor) byte flips, offsets taken modulo the file's length.
    flips: Vec<(u16, u8)>,
    /// Keep only this many bytes (modulo the file's length plus one).
    cut: Option<u16>,
}

fn store(clock: &Arc<ManualClock>) -> PostStore {
    PostStore::with_config(StoreConfig {
        retention_secs: RETENTION_SECS,
        max_posting_list_size: 4,
        clock: clock.clone(),
    })
}

fn post(&(id, author, age, kind): &(u8, u8, u8, u8)) -> LightPost {
    let mut post = LightPost::original(
        i64::from(id) + 1,
        i64::from(author % 16) + 1,
        NOW_SECS - i64::from(age),
    );
    match kind % 4 {
        1 => {
            post.is_reply = true;
            post.in_reply_to_post_id = Some(i64::from(id / 2) + 1);
        }
        2 => {
            post.is_retweet = true;
            post.source_post_id = Some(i64::from(id / 3) + 1);
        }
        3 => post.has_video = true,
        _ => {}
    }
    post
}

/// Makes the header's and every chunk's CRC32C match their bytes again (as far as the file
/// holds them whole).
fn fix_checksums(bytes: &mut [u8]) {
    let word = |bytes: &[u8], at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let Some(mut at) = thunder_fuzz::fix_header_checksum(bytes) else {
        return;
    };
    while at + 16 <= bytes.len() {
        let end = at + 16 + word(bytes, at + 8) as usize;
        if end > bytes.len() {
            return;
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[at..at + 12]), &bytes[at + 16..end]);
        bytes[at + 12..at + 16].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}

/// Everything the loaded store answers: its sizes, and the feed and videos answers of every
/// author.
fn contents(store: &PostStore) -> impl PartialEq + std::fmt::Debug {
    let stats = store.stats();
    let authors: Vec<i64> = (1..=16).collect();
    let query = FeedQuery::new(0, &authors);
    let ids = |posts: &[LightPost]| posts.iter().map(|p| p.post_id).collect::<Vec<_>>();
    (
        (
            stats.posts,
            stats.original_entries,
            stats.secondary_entries,
            stats.video_entries,
            stats.authors,
            stats.tombstones,
        ),
        ids(&store.get_all_posts_by_users(&query).posts),
        ids(&store.get_videos_by_users(&query).posts),
    )
}

fuzz_target!(|input: Input| {
    let clock = Arc::new(ManualClock::new(NOW_SECS));
    let written = store(&clock);
    written.insert_posts(&input.posts.iter().map(post).collect::<Vec<_>>());
    let deletes: Vec<DeleteEvent> = input
        .deleted
        .iter()
        .map(|&id| DeleteEvent {
            post_id: i64::from(id) + 1,
            deleted_at: NOW_SECS,
        })
        .collect();
    written.mark_as_deleted(&deletes);
    let mut bytes = Vec::new();
    written
        .write_snapshot(&SnapshotMeta::default(), &mut bytes)
        .expect("a snapshot into memory");
    for &(offset, xor) in &input.flips {
        let at = usize::from(offset) % bytes.len();
        bytes[at] ^= xor;
    }
    if let Some(cut) = input.cut {
        bytes.truncate(usize::from(cut) % (bytes.len() + 1));
    }
    fix_checksums(&mut bytes);
    clock.advance(i64::from(input.later));

    let (streamed, in_place) = (store(&clock), store(&clock));
    match (
        streamed.load_snapshot(bytes.as_slice(), 1),
        in_place.load_snapshot_in_place(&bytes, 1, true),
    ) {
        (Ok(a), Ok(b)) => {
            assert_eq!(
                (a.posts_loaded, a.posts_skipped, a.tombstones_loaded),
                (b.posts_loaded, b.posts_skipped, b.tombstones_loaded)
            );
            assert_eq!(a.tombstones_expired, b.tombstones_expired);
            assert_eq!(
                (a.inserts, a.per_post_reason),
                (b.inserts, b.per_post_reason)
            );
            assert_eq!(contents(&streamed), contents(&in_place));
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string());
            for store in [&streamed, &in_place] {
                assert_eq!(store.stats().posts, 0, "a refused file loaded posts");
                assert_eq!(
                    store.stats().tombstones,
                    0,
                    "a refused file loaded tombstones"
                );
            }
        }
        (a, b) => panic!("the loaders disagree: streamed {a:?}, in place {b:?}"),
    }
});
