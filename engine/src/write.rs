//! The write path: insert, delete and trim, following the reference rules (see
//! `BEHAVIOUR.md`), over the store's tables: each table's owner for what concerns one table,
//! `tables.rs` for the orderings that span two (those that make a create racing its delete
//! come out right among them).
//!
//! Each call pins the reclaimers once for its whole batch, gathers the slots it frees and
//! hands them back to the arena when it ends.

use crate::arena::{CompactPost, IN_PRIMARY, IN_VIDEO, SlotId};
use crate::authors::{Author, Kind};
use crate::config::TRIM_FRACTION;
use crate::guards::Guards;
use crate::post::{DeleteEvent, LightPost};
use crate::prefetch::prefetch;
use crate::report::{DeleteReport, DropReason, InsertReport, TrimReport};
use crate::tables::StoreTables;
use crate::timeline::TinyPost;
use crate::waiting::PendingRepost;
use crossbeam_epoch::Guard;
use std::sync::PoisonError;

/// How many posts ahead `insert_posts` prefetches index buckets; author records, timeline
/// headers and newest cells follow at 2/3, 1/3 and 1/6 of that distance.
const INGEST_LOOKAHEAD: usize = 12;

/// The source an insert of `post` looks up (a repost without its own video, not a reply):
/// the insert asks whether that source is a video.
#[inline]
fn looks_up_source(post: &LightPost) -> Option<i64> {
    let source = post.source_post_id.unwrap_or(0);
    (post.is_retweet && !post.is_reply && !post.has_video && source != 0).then_some(source)
}

/// Stores a batch of new posts, calling `on_drop(index in batch, reason)` for every post it
/// drops (time checks in batch order first, then the others in the order the batch is
/// applied). See `BEHAVIOUR.md` for the exact rules.
pub(crate) fn insert_posts(
    tables: &StoreTables,
    batch: &[LightPost],
    mut on_drop: impl FnMut(usize, DropReason),
) -> InsertReport {
    let mut report = InsertReport::default();
    let g = tables.guards();
    // Keys pack `created_at` above the index, so sorting them is a stable sort by time.
    // Batches longer than `u32::MAX` (never in practice) are applied in such chunks.
    const CHUNK: usize = u32::MAX as usize;
    let mut retired = Vec::new();
    for (c, chunk) in batch.chunks(CHUNK).enumerate() {
        let base = c * CHUNK;
        let mut kept: Vec<u64> = Vec::with_capacity(chunk.len());
        for (i, post) in chunk.iter().enumerate() {
            match time_check(tables.retention.secs(), post.created_at, g.now) {
                None => kept.push(((post.created_at as u64) << 32) | i as u64),
                Some(reason) => {
                    report.count_drop(reason);
                    on_drop(base + i, reason);
                }
            }
        }
        kept.sort_unstable();
        let post_at = |k: usize| {
            kept.get(k)
                .map(|key| &chunk[(key & u64::from(u32::MAX)) as usize])
        };
        // The author record candidate of each post from the author step on (unverified:
        // whoever uses one checks its id first), so the later steps and the insert itself
        // do not look the author up again. Indexed by position modulo the lookahead.
        let mut candidates: [Option<&Author>; INGEST_LOOKAHEAD] = [None; INGEST_LOOKAHEAD];
        for (k, key) in kept.iter().enumerate() {
            let i = (key & u64::from(u32::MAX)) as usize;
            // Overlap the next posts' cache misses with this one's work: their index
            // buckets (and tombstone filter word) first, their author records once those
            // buckets had time to arrive.
            if let Some(ahead) = post_at(k + INGEST_LOOKAHEAD) {
                prefetch_buckets(tables, ahead, &g.epoch);
            }
            let at = k + INGEST_LOOKAHEAD * 2 / 3;
            if let Some(ahead) = post_at(at) {
                candidates[at % INGEST_LOOKAHEAD] = prefetch_author(tables, ahead, &g.epoch);
            }
            // The timeline header first, its newest cell once the header is in.
            for (distance, newest) in [(INGEST_LOOKAHEAD / 3, false), (INGEST_LOOKAHEAD / 6, true)]
            {
                let at = k + distance;
                if let Some(ahead) = post_at(at) {
                    let candidate = candidates[at % INGEST_LOOKAHEAD];
                    prefetch_timeline(tables, ahead, candidate, newest, &g.epoch);
                }
            }
            // Posts near the start of a batch never passed the author step.
            let candidate = if k >= INGEST_LOOKAHEAD * 2 / 3 {
                candidates[k % INGEST_LOOKAHEAD]
            } else {
                None
            };
            let post = &chunk[i];
            let applied = if tables.directory.is_foreign(post.author_id) {
                tables
                    .insert_fact(&CompactPost::from_light(post), &g)
                    .map_or(Ok(()), Err)
            } else {
                insert_one(tables, post, candidate, &g, &mut retired)
            };
            match applied {
                Ok(()) => report.inserted += 1,
                Err(reason) => {
                    report.count_drop(reason);
                    on_drop(base + i, reason);
                }
            }
        }
    }
    tables.posts.retire(retired, &g.epoch);
    report
}

/// Prefetches the post index bucket, the author index bucket and the tombstone filter word
/// an insert of `post` will read, and the bucket of the source it looks up.
#[inline]
fn prefetch_buckets(tables: &StoreTables, post: &LightPost, epoch: &Guard) {
    tables.posts.prefetch_bucket(post.post_id, epoch);
    if let Some(source) = looks_up_source(post) {
        tables.posts.prefetch_bucket(source, epoch);
    }
    let authors = &tables.authors;
    authors.prefetch_bucket(authors.hash(post.author_id), epoch);
    tables.tombstones.prefetch_word(post.post_id, epoch);
}

/// Prefetches the record line of `post`'s author (its candidate in the author index) and,
/// for a repost whose insert looks up its source, the source's record (its candidate in the
/// post index). Returns the author candidate, not yet verified (its line is on the way).
#[inline]
fn prefetch_author<'t>(
    tables: &'t StoreTables,
    post: &LightPost,
    epoch: &Guard,
) -> Option<&'t Author> {
    // The repost's source record too: its bucket was prefetched with the post's.
    if let Some(source) = looks_up_source(post) {
        tables.posts.prefetch_stored_record(source, epoch);
    }
    let authors = &tables.authors;
    let author = authors.candidate(authors.hash(post.author_id), epoch)?;
    prefetch((author as *const Author).cast());
    Some(author)
}

/// Prefetches the header (`!newest`) or the newest cell (`newest`) of the timeline an
/// insert of `post` appends to. `candidate`: the author record found earlier, used when it
/// still is `post`'s author.
#[inline]
fn prefetch_timeline(
    tables: &StoreTables,
    post: &LightPost,
    candidate: Option<&Author>,
    newest: bool,
    epoch: &Guard,
) {
    let author = match candidate {
        Some(author) if author.author_id() == post.author_id => author,
        _ => match tables.authors.find(post.author_id, epoch) {
            Some(author) => author,
            None => return,
        },
    };
    let kind = if post.is_reply || post.is_retweet {
        Kind::Secondary
    } else {
        Kind::Originals
    };
    let timeline = author.timeline(kind);
    prefetch(if newest {
        timeline.newest_cell_ptr(epoch)
    } else {
        timeline.buffer_ptr(epoch)
    });
}

/// Why a post created at `created_at` is not kept at `now` under `retention_secs`, if it is
/// not.
#[inline]
fn time_check(retention_secs: i64, created_at: i64, now: i64) -> Option<DropReason> {
    if created_at <= 0 || created_at > i64::from(u32::MAX) {
        Some(DropReason::InvalidTime)
    } else if created_at > now {
        Some(DropReason::InFuture)
    } else if now - created_at > retention_secs {
        // No overflow: 0 < created_at <= now.
        Some(DropReason::TooOld)
    } else {
        None
    }
}

/// Inserts one post of an author this store owns, its time checks passed: `Err` says why it
/// was dropped.
fn insert_one(
    tables: &StoreTables,
    post: &LightPost,
    candidate: Option<&Author>,
    g: &Guards<'_>,
    retired: &mut Vec<SlotId>,
) -> Result<(), DropReason> {
    let post_id = post.post_id;
    if tables.tombstones.drops_create(post_id, post.created_at, g) {
        return Err(DropReason::Tombstoned);
    }
    // A post the base stores is a duplicate; one it held and no longer stores (evicted,
    // trimmed) may be stored again, in the head, and what records embed of it no longer
    // holds. A delete racing this create writes its tombstone before it takes the post out
    // of the base: the check after publishing below sees it.
    if let Some(base) = tables.base() {
        match base.find(post_id) {
            Some(true) => return Err(DropReason::Duplicate),
            Some(false) => base.note_changed(post_id),
            None => {}
        }
    }
    // No separate duplicate probe: publishing finds duplicates (a rare case that then costs
    // an unshared slot round trip) while the common new post pays one probe.
    let record = CompactPost::from_light(post);
    let mut video = false;
    let mut awaited_source = None;
    if !record.is_reply {
        if record.has_video {
            video = true;
        } else if record.is_retweet && record.source_post_id != 0 {
            match tables.lookup(record.source_post_id, &g.epoch) {
                Some(source) => video = tables.retention.is_video_source(&source, g.now),
                // A shard cannot see every source: the query-time videos rule decides.
                None if tables.directory.is_shard() => video = true,
                None => awaited_source = Some(record.source_post_id),
            }
        }
    }
    let holders = IN_PRIMARY | if video { IN_VIDEO } else { 0 };
    let slot = tables.publish_checked(&record, holders, g, retired)?;
    let entry = TinyPost {
        post_id,
        created_at: record.created_at,
        slot,
    };
    let kind = Kind::primary_of(&record);
    let authors = &tables.authors;
    authors.with_author_from(candidate, record.author_id, true, &g.epoch, |author| {
        // A delete that won the race already removed the record: index nothing then. The
        // delete removes timeline entries under this same lock, so no entry can outlive it.
        if tables.posts.read(slot, post_id).is_none() {
            return;
        }
        tables.index(author, kind, entry, &g.epoch, retired);
        if video {
            tables.index(author, Kind::Videos, entry, &g.epoch, retired);
        }
    });
    if let Some(source) = awaited_source {
        let repost = PendingRepost {
            post_id,
            author_id: record.author_id,
            created_at: record.created_at,
        };
        if let Some(stored) = tables.wait_for_source(source, repost, g)
            && tables.retention.is_video_source(&stored, g.now)
        {
            promote_to_video(tables, source, repost, g, retired);
        }
    }
    if record.has_video
        && !record.is_reply
        && let Some(waiting) = tables.take_waiting(post_id, g)
    {
        for repost in waiting {
            promote_to_video(tables, post_id, *repost, g, retired);
        }
    }
    Ok(())
}

/// Adds a remembered repost of `source` to its author's videos timeline (once), if that
/// very repost is still stored and not expired. A repost the base stores joins the head's
/// videos timeline as a copy of its record held by that timeline alone (the base's runs do
/// not change); lookups find the copy first, a delete removes both.
fn promote_to_video(
    tables: &StoreTables,
    source: i64,
    repost: PendingRepost,
    g: &Guards<'_>,
    retired: &mut Vec<SlotId>,
) {
    let in_base = tables
        .base()
        .is_some_and(|b| b.find(repost.post_id) == Some(true));
    tables
        .authors
        .with_author(repost.author_id, in_base, &g.epoch, |author| {
            let (slot, record) = match tables.posts.lookup_with_slot(repost.post_id, &g.epoch) {
                Some(found) => found,
                None => {
                    let Some((_, stored)) = tables.base().and_then(|b| b.stored(repost.post_id))
                    else {
                        return;
                    };
                    let copy = stored.post;
                    if !is_same_unexpired_repost(tables, &copy, source, repost, g.now) {
                        return;
                    }
                    let Ok(slot) = tables.publish_checked(&copy, IN_VIDEO, g, retired) else {
                        return;
                    };
                    let entry = TinyPost {
                        post_id: repost.post_id,
                        created_at: copy.created_at,
                        slot,
                    };
                    tables.index(author, Kind::Videos, entry, &g.epoch, retired);
                    return;
                }
            };
            if !is_same_unexpired_repost(tables, &record, source, repost, g.now) {
                return;
            }
            if tables.posts.hold_video(slot, repost.post_id) {
                let entry = TinyPost {
                    post_id: repost.post_id,
                    created_at: record.created_at,
                    slot,
                };
                tables.index(author, Kind::Videos, entry, &g.epoch, retired);
            }
        });
}

/// Whether `record` is still the repost of `source` that waited (same author, source and
/// `created_at`), a non-reply repost without its own video, not expired at `now`.
fn is_same_unexpired_repost(
    tables: &StoreTables,
    record: &CompactPost,
    source: i64,
    repost: PendingRepost,
    now: i64,
) -> bool {
    record.author_id == repost.author_id
        && record.source_post_id == source
        && record.created_at == repost.created_at
        && !record.is_reply
        && record.is_retweet
        && !record.has_video
        && !tables.retention.expired(record.created_at, now)
}

/// The basis a delete event gives its tombstone at `now` (before the removed record's
/// `created_at` is taken into account): `deleted_at`, but never later than now (a
/// `deleted_at <= 0` counts as now) and never so early that the tombstone is born expired.
/// So a tombstone lives at most the retention from its arrival, and at least until then.
fn delete_basis(retention_secs: i64, deleted_at: i64, now: i64) -> i64 {
    let stamped = if deleted_at <= 0 {
        now
    } else {
        deleted_at.min(now)
    };
    stamped.max(now.saturating_sub(retention_secs))
}

/// Deletes posts: tombstones them and removes their records and timeline entries.
pub(crate) fn mark_as_deleted(tables: &StoreTables, events: &[DeleteEvent]) -> DeleteReport {
    let mut report = DeleteReport::default();
    let g = tables.guards();
    let mut retired = Vec::new();
    for event in events {
        let post_id = event.post_id;
        let basis = delete_basis(tables.retention.secs(), event.deleted_at, g.now);
        report.tombstoned += 1;
        let Some(removed) = tables.tombstone_and_remove(post_id, basis, &g, &mut retired) else {
            continue;
        };
        report.removed += 1;
        if !removed.from_head {
            continue;
        }
        let record = removed.record;
        let authors = &tables.authors;
        authors.with_author(record.author_id, false, &g.epoch, |author| {
            for kind in [Kind::primary_of(&record), Kind::Videos] {
                authors.remove_entry(author, kind, post_id, record.created_at, &g.epoch);
            }
        });
    }
    tables.posts.retire(retired, &g.epoch);
    report
}

/// Trims one author shard (`shard mod TRIM_FRACTION`) and expires tombstones.
pub(crate) fn trim(tables: &StoreTables, shard: usize) -> TrimReport {
    let mut report = TrimReport::default();
    let g = tables.guards();
    let now = g.now;
    let shard = (shard % TRIM_FRACTION) as i64;
    let mut retired = Vec::new();
    let in_shard = |author: &Author| author.author_id().rem_euclid(TRIM_FRACTION as i64) == shard;
    // The base's expired entries first, so that the authors' emptiness below counts them.
    let (entries, freed) = tables.expire_base_entries(shard, now, &g.epoch);
    report.entries_removed += entries;
    report.posts_freed += freed;
    tables.authors.for_each(|author| {
        // Filter before locking (unused records keep a stale id; the lock re-checks).
        if !in_shard(author) {
            return;
        }
        let mut removed = author.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if *removed || !in_shard(author) {
            return;
        }
        let mut empty = true;
        for kind in Kind::ALL {
            let (entries, freed) = tables.expire_entries(author, kind, now, &g.epoch, &mut retired);
            report.entries_removed += entries;
            report.posts_freed += freed;
            empty &= author.timeline(kind).shrink(&g.epoch);
        }
        // An author with entries left in the base stays.
        if empty && !tables.in_base(author.author_id()) {
            *removed = true;
            tables.authors.drop_author(author, &g.epoch);
            report.authors_dropped += 1;
            if let Some((base, at)) = tables.base_line(author.author_id()) {
                base.drop_author(at);
            }
        }
    });
    // The base's authors with nothing left in either tier leave the store too (once); those
    // with a head record were decided above.
    if let Some(base) = tables.base() {
        base.for_each_author_in(shard, |at| {
            let author_id = base.file.line(at).author_id;
            if !base.author_dropped(at)
                && !tables.in_base(author_id)
                && tables.authors.find(author_id, &g.epoch).is_none()
                && base.drop_author(at)
            {
                report.authors_dropped += 1;
            }
        });
    }
    report.tombstones_expired = tables.tombstones.expire(&g);
    let retention = tables.retention;
    tables.directory.trim(shard as usize, |created_at| {
        retention.expired(created_at, now)
    });
    tables.waiting.expire(&g);
    tables.posts.retire(retired, &g.epoch);
    // The slots freed above reach the free list after their grace period: a later trim
    // releases what they empty.
    tables.posts.release_free_chunks();
    report
}
