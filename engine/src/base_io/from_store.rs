//! Writing a store as a base file while it serves: the head (the live tables) and the base
//! under it, merged per author, streamed author by author (see `crate::base`'s `write.rs`
//! for the file's order).
//!
//! Fuzzy, like a snapshot: the caller takes the Kafka offsets *before* the write, and replaying
//! from them makes the file exact (creates and deletes are idempotent by post id). The
//! tombstones are copied first, so a post deleted while the write runs is either written and
//! deleted again by the replay, or not written. Each author's three timelines are read under
//! one epoch pin, without the author's lock: a videos entry whose record the primary timeline
//! no longer holds by the time it is read is left out (the replay brings back whatever it
//! should be).
//!
//! Memory: besides one author's runs at a time, the writer holds the directory (64 bytes per
//! line, 4/3 lines per author), the post index (about 10 bytes per post) and the videos
//! references (4 bytes per videos entry) until the end of the file, and the authors' ids (8
//! bytes each).

use std::io::Write;
use std::time::{Duration, Instant};

use crate::arena::CompactPost;
use crate::authors::Kind;
use crate::base::{
    AuthorRuns, BASE_FORMAT_VERSION, Base, BaseCounts, BaseRecord, BaseWriter, Embedded,
    base_layout_hash,
};
use crate::directory::FACT_SHARDS;
use crate::snapshot::{SnapshotError, SnapshotHeader, SnapshotMeta};
use crate::tables::StoreTables;
use crossbeam_epoch::Guard;

/// What writing a base file did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseSummary {
    /// The header written.
    pub header: SnapshotHeader,
    /// What the file holds.
    pub counts: BaseCounts,
    /// Wall time of the whole write.
    pub duration: Duration,
}

/// Writes the store of `tables` (the head and its base, if it has one) as a base file to
/// `out` (`PostStore::write_base`).
pub(crate) fn write_base(
    tables: &StoreTables,
    meta: &SnapshotMeta,
    out: impl Write,
) -> Result<BaseSummary, SnapshotError> {
    let base = tables.base();
    let started = Instant::now();
    let now = tables.now_secs();
    let header =
        crate::snapshot::header_for(tables, meta, now, BASE_FORMAT_VERSION, base_layout_hash())?;
    let mut writer = BaseWriter::start(out, &header)?;
    // Tombstones first (module docs).
    writer.tombstones(&tables.tombstones.live_at(now))?;
    writer.waiting(&tables.waiting.all())?;
    let mut table = 0;
    writer.facts(|batch| {
        let retention = tables.retention;
        tables.directory.copy(
            table,
            |created_at| retention.expired(created_at, now),
            batch,
        );
        table += 1;
        table < FACT_SHARDS
    })?;
    let authors = author_ids(tables, base);
    let expected = tables.posts.live() + base.map_or(0, Base::stored_posts);
    writer.place_authors(&authors, expected);
    drop(authors);
    let mut runs = AuthorRuns::default();
    let mut head = [Vec::new(), Vec::new(), Vec::new()];
    for (line, author_id) in writer.author_order() {
        runs.clear();
        let epoch = crossbeam_epoch::pin();
        gather(tables, base, author_id, &mut runs, &mut head, &epoch);
        drop(epoch);
        writer.author(line, &runs)?;
    }
    let counts = writer.finish(tables.authors.cap())?;
    Ok(BaseSummary {
        header,
        counts,
        duration: started.elapsed(),
    })
}

/// Every author of the store, in the head or in the base, once: not those a trim dropped (a
/// dropped head record stays in the table for reuse, under its old id; a dropped base line
/// stays in the file), which a store loaded from the file would otherwise hold, empty, and
/// drop again.
fn author_ids(tables: &StoreTables, base: Option<&Base>) -> Vec<i64> {
    let mut ids = Vec::new();
    tables.authors.for_each(|author| {
        let removed = author
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !*removed {
            ids.push(author.author_id());
        }
    });
    if let Some(base) = base {
        for at in 0..base.file.lines {
            let line = base.file.line(at);
            if line.used && !base.author_dropped(at) {
                ids.push(line.author_id);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Fills `runs` with `author_id`'s timelines: the head's and the base's live entries merged
/// newest first, replies and reposts with the facts of their parent or source when that post
/// is stored (and so written too). `head` is scratch.
fn gather(
    tables: &StoreTables,
    base: Option<&Base>,
    author_id: i64,
    runs: &mut AuthorRuns,
    head: &mut [Vec<CompactPost>; 3],
    epoch: &Guard,
) {
    for entries in head.iter_mut() {
        entries.clear();
    }
    // The head's timelines, newest first, each entry whose record is still there.
    if let Some(author) = tables.authors.find(author_id, epoch) {
        for kind in Kind::ALL {
            let Some(view) = author.timeline(kind).view(epoch) else {
                continue;
            };
            let mut seq = view.head;
            while seq > view.tail {
                seq -= 1;
                let Some(entry) = view.get(seq) else { break };
                if let Some(record) = tables.posts.read(entry.slot, entry.post_id) {
                    head[kind as usize].push(record);
                }
            }
        }
    }
    // The base's live entries, newest first.
    let mut from_base: [Vec<CompactPost>; 3] = Default::default();
    if let Some((base, at)) = base.and_then(|b| b.line_of(author_id).map(|at| (b, at))) {
        let line = base.file.line(at);
        for (kind, entries) in from_base.iter_mut().enumerate() {
            let run = base.run(at, &line.lens, kind);
            for index in 0..run.end {
                let granule = base.entry_granule(&line, kind, index);
                if run.dirty && base.state.is_gone(granule) {
                    continue;
                }
                entries.push(base.record(&line, granule).post);
            }
        }
    }
    let lookup = |post_id: i64| {
        tables
            .posts
            .lookup(post_id, epoch)
            .or_else(|| base.and_then(|b| b.stored(post_id)).map(|(_, r)| r.post))
    };
    for kind in 0..3 {
        let out = match kind {
            0 => &mut runs.originals,
            1 => &mut runs.secondary,
            _ => &mut runs.videos,
        };
        for post in merge_newest_first(&head[kind], &from_base[kind]) {
            out.push(with_embedded(post, kind != 0, &lookup));
        }
    }
}

/// `a` and `b` (each newest first) merged newest first; a post in both (a videos entry the
/// head holds for a record of the base) once.
fn merge_newest_first<'p>(
    a: &'p [CompactPost],
    b: &'p [CompactPost],
) -> impl Iterator<Item = CompactPost> + 'p {
    let key = |p: &CompactPost| (p.created_at, p.post_id);
    let (mut i, mut j) = (0, 0);
    std::iter::from_fn(move || {
        let next = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if key(x) == key(y) => {
                i += 1;
                j += 1;
                *x
            }
            (Some(x), Some(y)) if key(x) > key(y) => {
                i += 1;
                *x
            }
            (_, Some(y)) => {
                j += 1;
                *y
            }
            (Some(x), None) => {
                i += 1;
                *x
            }
            (None, None) => return None,
        };
        Some(next)
    })
}

/// `post` as a base record: in the secondary run, a reply with the facts of its parent and a
/// repost with those of its source, when `lookup` finds that post stored.
fn with_embedded(
    post: CompactPost,
    secondary: bool,
    lookup: &impl Fn(i64) -> Option<CompactPost>,
) -> BaseRecord {
    let mut record = BaseRecord {
        post,
        parent: None,
        source: None,
    };
    if !secondary {
        return record;
    }
    if post.in_reply_to_post_id != 0
        && let Some(parent) = lookup(post.in_reply_to_post_id)
    {
        record.parent = Some(Embedded {
            created_at: parent.created_at,
            flag: parent.is_original(),
            continues: post.conversation_id != 0
                && parent.in_reply_to_post_id == post.conversation_id,
        });
    }
    if post.is_retweet
        && post.source_post_id != 0
        && let Some(source) = lookup(post.source_post_id)
    {
        record.source = Some(Embedded {
            created_at: source.created_at,
            flag: source.has_video && !source.is_reply,
            continues: false,
        });
    }
    record
}
