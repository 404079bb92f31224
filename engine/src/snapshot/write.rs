//! Writing a snapshot while the store serves: the header, the live tombstones, the fact
//! directory, then the posts in timeline order, each chunk checksummed (see the wing's doc).

use std::io::Write;
use std::time::{Duration, Instant};

use super::format::*;
use crate::arena::SlotId;
use crate::directory::FACT_SHARDS;
use crate::tables::StoreTables;

/// What writing a snapshot did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// The header written.
    pub header: SnapshotHeader,
    /// What was written.
    pub counts: SnapshotCounts,
    /// Wall time of the whole write.
    pub duration: Duration,
}

/// How many posts ahead of its reads the writer's second pass prefetches their slots.
const WRITE_READ_AHEAD: usize = 16;

/// Writes chunks to `out`, counting them.
pub(super) struct ChunkWriter<W: Write> {
    pub(super) out: W,
    pub(super) counts: SnapshotCounts,
    pub(super) buf: Vec<u8>,
}

impl<W: Write> ChunkWriter<W> {
    pub(super) fn write(&mut self, kind: u8, count: usize) -> Result<(), SnapshotError> {
        let count = u32::try_from(count)
            .map_err(|_| SnapshotError::Incompatible("chunk too large".into()))?;
        let len = u32::try_from(self.buf.len())
            .map_err(|_| SnapshotError::Incompatible("chunk too large".into()))?;
        let mut head = [0u8; CHUNK_HEADER_BYTES];
        head[0] = kind;
        head[4..8].copy_from_slice(&count.to_le_bytes());
        head[8..12].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head[..12]), &self.buf);
        head[12..16].copy_from_slice(&crc.to_le_bytes());
        self.out.write_all(&head)?;
        self.out.write_all(&self.buf)?;
        self.counts.bytes += (CHUNK_HEADER_BYTES + self.buf.len()) as u64;
        if kind != KIND_END {
            self.counts.chunks += 1;
        }
        self.buf.clear();
        Ok(())
    }
}

/// The header of a file of format `format_version` (layout hash `layout_hash`) the store of
/// `tables` writes at `now`; refused for an author shard that does not know its identity.
pub(crate) fn header_for(
    tables: &StoreTables,
    meta: &SnapshotMeta,
    now: i64,
    format_version: u32,
    layout_hash: u32,
) -> Result<SnapshotHeader, SnapshotError> {
    if tables.directory.is_shard() && tables.directory.id().is_none() {
        return Err(SnapshotError::Incompatible(
            "an author shard built without its shard id (with_author_shard) cannot be snapshotted"
                .into(),
        ));
    }
    Ok(SnapshotHeader {
        format_version,
        layout_hash,
        retention_secs: tables.retention.secs(),
        created_at_secs: now,
        meta: meta.clone(),
        shard: tables.directory.id(),
    })
}

/// Writes a snapshot of the store of `tables` to `out` while it keeps serving
/// (`PostStore::write_snapshot`).
pub(crate) fn write_snapshot(
    tables: &StoreTables,
    meta: &SnapshotMeta,
    out: impl Write,
) -> Result<SnapshotSummary, SnapshotError> {
    if tables.base().is_some() {
        return Err(SnapshotError::Incompatible(
            "this store serves from a base: a snapshot of it is a base file (`write_base`)".into(),
        ));
    }
    let started = Instant::now();
    let now = tables.now_secs();
    let header = header_for(tables, meta, now, FORMAT_VERSION, layout_hash())?;
    let encoded = encode_header(&header)?;
    let mut writer = ChunkWriter {
        out,
        counts: SnapshotCounts {
            bytes: encoded.len() as u64,
            ..SnapshotCounts::default()
        },
        buf: Vec::with_capacity(POST_BYTES * POSTS_PER_CHUNK),
    };
    writer.out.write_all(&encoded)?;
    // Tombstones first: a post deleted while the scan runs then either is in the scan and
    // has its tombstone after it in time (the replay deletes it again), or is not.
    let tombstones = tables.tombstones.live_at(now);
    for chunk in tombstones.chunks(TOMBSTONES_PER_CHUNK) {
        for &(post_id, basis) in chunk {
            writer.buf.extend_from_slice(&post_id.to_le_bytes());
            writer.buf.extend_from_slice(&basis.to_le_bytes());
        }
        writer.write(KIND_TOMBSTONES, chunk.len())?;
        writer.counts.tombstones += chunk.len() as u64;
    }
    // The fact directory, one table at a time (each copied under its read lock).
    let mut facts = Vec::new();
    for table in 0..FACT_SHARDS {
        facts.clear();
        let retention = tables.retention;
        tables.directory.copy(
            table,
            |created_at| retention.expired(created_at, now),
            &mut facts,
        );
        for chunk in facts.chunks(FACTS_PER_CHUNK) {
            for &(post_id, packed, parent) in chunk {
                writer.buf.extend_from_slice(&post_id.to_le_bytes());
                writer.buf.extend_from_slice(&packed.to_le_bytes());
                writer.buf.extend_from_slice(&parent.to_le_bytes());
            }
            writer.write(KIND_FACTS, chunk.len())?;
            writer.counts.facts += chunk.len() as u64;
        }
    }
    write_posts_in_timeline_order(tables, now, &mut writer)?;
    let counts = writer.counts;
    for n in [counts.tombstones, counts.posts, counts.chunks, counts.facts] {
        writer.buf.extend_from_slice(&n.to_le_bytes());
    }
    writer.write(KIND_END, 0)?;
    writer.out.flush()?;
    Ok(SnapshotSummary {
        header,
        counts: writer.counts,
        duration: started.elapsed(),
    })
}

/// The posts part of a snapshot: every post live and unexpired at `now`, in timeline order
/// (`created_at`, then post id), so that a load reads them in the order it builds them
/// and needs no sort of its own (see `in_timeline_order`).
///
/// Two passes over the arena, neither holding an epoch pin (arena chunks are never freed
/// while the store lives): the first scans it for each live post's second and slot (8
/// bytes a post, sorted), the second reads the slots back in that order, a second's posts
/// at a time, sorted by id. A slot whose post is gone by then (deleted after the recorded
/// offsets, so the replay from them deletes it again, or expired, which a load skips
/// anyway) is left out; if the slot holds a newer post by then, that one is written when
/// it is of the same second (the replay would bring it anyway) and left out otherwise.
/// A post is in one slot for its whole life, so none is written twice.
fn write_posts_in_timeline_order<W: Write>(
    tables: &StoreTables,
    now: i64,
    writer: &mut ChunkWriter<W>,
) -> Result<(), SnapshotError> {
    let posts = &tables.posts;
    let live = posts.live();
    let mut keys: Vec<u64> = Vec::with_capacity(live + live / 64 + 1024);
    for index in 0..posts.scan_chunks() {
        posts.scan_chunk(index, |slot, post| {
            if !tables.retention.expired(post.created_at, now) {
                keys.push(u64::from(post.created_at) << 32 | u64::from(slot));
            }
        });
    }
    keys.sort_unstable();
    let second_of = |key: u64| (key >> 32) as u32;
    let mut second = Vec::new();
    let mut in_chunk = 0;
    for (i, &key) in keys.iter().enumerate() {
        // The slots are read in no order the hardware can guess: ask for them ahead.
        if let Some(&ahead) = keys.get(i + WRITE_READ_AHEAD) {
            posts.prefetch_record(ahead as SlotId);
        }
        if let Some(post) = posts.read_live(key as SlotId)
            && post.created_at == second_of(key)
        {
            second.push(post);
        }
        let last_of_second = keys
            .get(i + 1)
            .is_none_or(|&next| second_of(next) != second_of(key));
        if !last_of_second {
            continue;
        }
        second.sort_unstable_by_key(|p| p.post_id);
        for post in second.drain(..) {
            encode_post(&post, &mut writer.buf);
            in_chunk += 1;
            if in_chunk == POSTS_PER_CHUNK {
                writer.write(KIND_POSTS, in_chunk)?;
                writer.counts.posts += in_chunk as u64;
                in_chunk = 0;
            }
        }
    }
    if in_chunk > 0 {
        writer.write(KIND_POSTS, in_chunk)?;
        writer.counts.posts += in_chunk as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PostStore;
    use crate::arena::CompactPost;
    use crate::post::LightPost;
    use crate::snapshot::tests::{delete_every, posts_of};
    use std::sync::Arc;

    /// Whatever order posts arrived in, and whichever arena class holds them, a snapshot's
    /// posts are written in timeline order, without the deleted and the expired ones.
    #[test]
    fn snapshots_are_written_in_timeline_order() {
        const NOW: i64 = 1_700_000_000;
        let clock = Arc::new(crate::ManualClock::new(NOW));
        let store = PostStore::with_clock(1_000, clock.clone());
        // Ids and times in scrambled orders; many posts share a second; every third post
        // is a reply (a large slot), the others originals (small slots).
        let batch: Vec<LightPost> = (0..6_000i64)
            .map(|n| {
                let (id, at) = ((n * 7_919) % 6_007 + 1, NOW - 990 + (n * 37) % 600);
                let mut post = LightPost::original(id, 1 + n % 50, at);
                if n % 3 == 0 {
                    post.is_reply = true;
                    post.in_reply_to_post_id = Some(id + 100_000);
                }
                post
            })
            .collect();
        assert_eq!(store.insert_posts(&batch).inserted, batch.len());
        delete_every(&store, 6_007, 11, NOW);
        // Posts created in the first 60 s of the batch's span are expired by now.
        clock.set(NOW + 70);
        let mut bytes = Vec::new();
        let summary = store
            .write_snapshot(&SnapshotMeta::default(), &mut bytes)
            .unwrap();
        let written = posts_of(&bytes);
        assert!(written.is_sorted_by_key(|p| (p.created_at, p.post_id)));
        let mut expected: Vec<i64> = batch
            .iter()
            .filter(|p| p.created_at >= NOW + 70 - 1_000 && (p.post_id - 1) % 11 != 0)
            .map(|p| p.post_id)
            .collect();
        let mut ids: Vec<i64> = written.iter().map(|p| p.post_id).collect();
        expected.sort_unstable();
        ids.sort_unstable();
        assert_eq!(ids, expected);
        assert_eq!(summary.counts.posts, expected.len() as u64);
        assert!(written.iter().any(|p| p.is_reply) && written.iter().any(|p| !p.is_reply));
        // Each post whole, as it went in.
        for post in &written {
            let sent = batch.iter().find(|p| p.post_id == post.post_id).unwrap();
            assert_eq!(*post, CompactPost::from_light(sent));
        }
    }
}
