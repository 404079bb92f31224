//! Opening a base file, in two steps.
//!
//! [`open`]: every byte checked against its block checksum on all the load's threads, then
//! every structure the store reads without checking again, so that no read can leave the file
//! or panic whatever the file holds: the sections' bounds, each directory line's lengths and
//! strides, the lines tiling the records and videos sections exactly, every videos reference
//! on a record of its own author. That reads the directory and the references, not the
//! records: a store can serve from the file at once.
//!
//! [`check_records`]: what a file whose checksums hold can only get wrong if it was made so on
//! purpose, read from every record: each record valid, of its run's kind, each run strictly
//! newest first and headed by its line's newest key, every author where a lookup finds it,
//! every record found by the post index at its own place and the index holding nothing else,
//! the videos runs in order and only of videos; and the facts records embed of their parent
//! or source compared with that record, those that cannot be confirmed noted (a file written
//! while the store changed can hold such). It reads everything, about a second of CPU at 20M
//! posts, so the server runs it beside the serving store (see `PostStore::check_base`).

use std::ops::Range;

use super::file::{BaseBytes, BaseFile};
use super::format::*;
use crate::file_header::{SnapshotError, SnapshotHeader, read_header_with};
use crate::parallel::on_each;
use crate::prefetch::prefetch;

/// The videos run's place in a line's lengths and newest keys.
const VIDEOS_RUN: usize = 2;

/// What checking the records found besides errors: the ids of referenced posts whose
/// embedded facts could not be confirmed (the referenced post is not in the base, or
/// differs), which the store must look up instead of trusting.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) unconfirmed: Vec<i64>,
}

/// Opens the base file in `bytes` for a store whose timelines hold at most `cap` entries:
/// checksums and structure (module docs), on `threads` threads.
pub(crate) fn open(
    bytes: BaseBytes,
    threads: usize,
    cap: usize,
) -> Result<BaseFile, SnapshotError> {
    let threads = threads.max(1);
    let (footer, footer_at) = Footer::decode(&bytes)?;
    check_blocks(&bytes[..footer_at], &footer.blocks, threads)?;
    let (header, header_len) = read_base_header(&mut &bytes[..footer_at])?;
    let spans = check_sections(&footer, header_len as usize, footer_at)?;
    let lines = footer.span(Section::Directory).count as usize;
    let buckets = footer.span(Section::Posts).count as usize;
    let file = BaseFile::new(bytes, header, footer, spans, lines, buckets);
    check_small_sections(&file)?;
    check_lines(&file, threads, cap)?;
    Ok(file)
}

/// The header of a base file, without checking the rest (a start-up choosing between files).
pub(crate) fn header_of(bytes: &[u8]) -> Result<SnapshotHeader, SnapshotError> {
    Ok(read_base_header(&mut &bytes[..])?.0)
}

/// Checks every block of `body` against `blocks`, on up to `threads` threads, each taking a
/// contiguous run of blocks: the first bad block in file order is the error.
fn check_blocks(body: &[u8], blocks: &[u32], threads: usize) -> Result<(), SnapshotError> {
    let check = |range: Range<usize>| -> Result<(), SnapshotError> {
        for block in range {
            let from = block * BLOCK_BYTES;
            let to = (from + BLOCK_BYTES).min(body.len());
            if crc32c::crc32c(&body[from..to]) != blocks[block] {
                return Err(corrupt(format!(
                    "checksum mismatch in bytes {from}..{to} of the file"
                )));
            }
        }
        Ok(())
    };
    on_ranges(blocks.len(), threads, check).map(drop)
}

/// Runs `work` on `0..n` cut into up to `threads` contiguous ranges, on scoped threads: the
/// first error in range order.
fn on_ranges<T: Send>(
    n: usize,
    threads: usize,
    work: impl Fn(Range<usize>) -> Result<T, SnapshotError> + Sync,
) -> Result<Vec<T>, SnapshotError> {
    let per = n.div_ceil(threads.max(1)).max(1);
    let ranges = (0..n.div_ceil(per).max(1)).map(|i| i * per..((i + 1) * per).min(n));
    on_each(ranges, work).into_iter().collect()
}

/// The sections' byte ranges: in file order, aligned, after the header and before the footer,
/// each as long as its items.
fn check_sections(
    footer: &Footer,
    header_len: usize,
    footer_at: usize,
) -> Result<[(usize, usize); 7], SnapshotError> {
    let mut spans = [(0, 0); 7];
    let mut end = header_len as u64;
    for section in Section::ALL {
        let span = footer.span(section);
        let bad = |what: &str| corrupt(format!("the {} section {what}", section.name()));
        if span.offset < end || !span.offset.is_multiple_of(SECTION_ALIGN as u64) {
            return Err(bad("is out of place"));
        }
        let fits = span
            .offset
            .checked_add(span.bytes)
            .is_some_and(|end| end <= footer_at as u64);
        if !fits {
            return Err(bad("runs past the footer"));
        }
        let sized = match section.item_bytes() {
            Some(item) => span.count.checked_mul(item as u64) == Some(span.bytes),
            None => span.bytes.is_multiple_of(GRANULE_BYTES as u64) && span.bytes <= (1u64 << 35),
        };
        if !sized {
            return Err(bad("does not hold its count"));
        }
        end = span.end();
        spans[section as usize] = (span.offset as usize, span.bytes as usize);
    }
    let lines = footer.span(Section::Directory).count;
    let buckets = footer.span(Section::Posts).count;
    let posts = footer.span(Section::Records).count;
    if lines == 0 || lines > u64::from(u32::MAX) || buckets == 0 || buckets > u64::from(u32::MAX) {
        return Err(corrupt("an empty or oversized directory or post index"));
    }
    // An empty word ends every lookup's probe.
    if posts >= buckets * BUCKET_WORDS as u64 {
        return Err(corrupt("a post index without room"));
    }
    Ok(spans)
}

/// The tombstones, waiting reposts and facts: fixed records whose every value a writer could
/// write, but for the waiting reposts' padding and the facts' flags.
fn check_small_sections(file: &BaseFile) -> Result<(), SnapshotError> {
    for waiting in file.section(Section::Waiting).chunks_exact(WAITING_BYTES) {
        if le_u32(waiting, 28) != 0 {
            return Err(corrupt("a waiting repost with non-zero padding"));
        }
    }
    for fact in file.section(Section::Facts).chunks_exact(FACT_BYTES) {
        let record = (le_i64(fact, 0), le_u64(fact, 8), le_i64(fact, 16));
        if !crate::directory::fact_record_is_valid(&record) {
            return Err(corrupt(format!(
                "the fact of post {} has bad flags",
                record.0
            )));
        }
    }
    Ok(())
}

/// Checks every directory line's structure on `threads` threads ([`check_line`]) and that
/// the lines tile the records and videos sections exactly.
fn check_lines(file: &BaseFile, threads: usize, cap: usize) -> Result<(), SnapshotError> {
    let total_granules = (file.section(Section::Records).len() / GRANULE_BYTES) as u64;
    let total_videos = file.footer.span(Section::Videos).count;
    let ends = on_ranges(file.lines, threads, |range| {
        let first = file.line(range.start);
        let mut offsets = (u64::from(first.records), u64::from(first.videos));
        let mut posts = 0u64;
        for at in range {
            let line = file.line(at);
            if (u64::from(line.records), u64::from(line.videos)) != offsets {
                return Err(corrupt(format!(
                    "directory line {at}: its runs are out of place"
                )));
            }
            offsets.0 += line.record_granules();
            offsets.1 += u64::from(line.lens[VIDEOS_RUN]);
            if offsets.0 > total_granules || offsets.1 > total_videos {
                return Err(corrupt(format!(
                    "directory line {at}: runs past their section"
                )));
            }
            check_line(file, at, &line, cap)?;
            posts += [0, 1, VIDEO_ONLY]
                .iter()
                .map(|&run| u64::from(line.lens[run]))
                .sum::<u64>();
        }
        Ok((offsets, posts))
    })?;
    // Each range starts where the one before ended, the first at 0, the last at the ends.
    let per = file.lines.div_ceil(threads.max(1)).max(1);
    let mut expected = (0u64, 0u64);
    let mut posts = 0u64;
    for (i, (end, range_posts)) in ends.into_iter().enumerate() {
        let line = file.line(i * per);
        if (u64::from(line.records), u64::from(line.videos)) != expected {
            return Err(corrupt(format!(
                "directory line {}: its runs are out of place",
                i * per
            )));
        }
        expected = end;
        posts += range_posts;
    }
    if expected != (total_granules, total_videos) {
        return Err(corrupt("the directory does not cover every record"));
    }
    if posts != file.posts() {
        return Err(corrupt("the records section holds another number of posts"));
    }
    Ok(())
}

/// Checks line `at`'s structure: an unused line is all zero but for its offsets; a used one
/// has runs within the cap, a stride of a whole record for each non-empty run, no more
/// video-only records than videos entries, and every videos reference on a record of one of
/// its runs.
fn check_line(file: &BaseFile, at: usize, line: &Line, cap: usize) -> Result<(), SnapshotError> {
    let bad = |what: &str| corrupt(format!("directory line {at}: {what}"));
    if Line::flag_byte(file.line_bytes(at)) > 1 {
        return Err(bad("unknown flags"));
    }
    if !line.used {
        let unused = Line {
            records: line.records,
            videos: line.videos,
            ..Line::default()
        };
        return if *line == unused {
            Ok(())
        } else {
            Err(bad("an unused line with content"))
        };
    }
    let videos = usize::from(line.lens[VIDEOS_RUN]);
    for run in [0, 1, VIDEOS_RUN, VIDEO_ONLY] {
        let len = usize::from(line.lens[run]);
        let most = if run == VIDEO_ONLY { videos } else { cap };
        if len > most {
            return Err(bad("a run longer than this store's timeline cap"));
        }
        if run == VIDEOS_RUN {
            continue;
        }
        let stride = line.stride(run) as usize;
        let stride_ok = if len == 0 {
            stride == 0
        } else {
            (2..=MAX_RECORD_BYTES / GRANULE_BYTES).contains(&stride)
        };
        if !stride_ok {
            return Err(bad("a bad record stride"));
        }
    }
    for i in 0..videos {
        let granule = file.video_ref(line.videos as usize + i);
        let on_a_record = [0, 1, VIDEO_ONLY].into_iter().any(|run| {
            let stride = line.stride(run);
            granule
                .checked_sub(line.run_start(run))
                .is_some_and(|offset| {
                    stride > 0
                        && offset.is_multiple_of(stride)
                        && offset / stride < u64::from(line.lens[run])
                })
        });
        if !on_a_record {
            return Err(bad("a videos entry that is not one of its records"));
        }
    }
    Ok(())
}

/// Checks every record (module docs) on `threads` threads: what it found, or why the file
/// cannot be trusted.
pub(crate) fn check_records(file: &BaseFile, threads: usize) -> Result<Findings, SnapshotError> {
    let per_range = on_ranges(file.lines, threads, |range| {
        let mut checked = RangeChecked::default();
        for at in range {
            check_line_records(file, at, &file.line(at), &mut checked)?;
        }
        checked.check_indexed(file)?;
        checked.check_claims(file);
        Ok(checked.unconfirmed)
    })?;
    let used_words = file
        .section(Section::Posts)
        .chunks_exact(8)
        .filter(|word| le_u64(word, 0) != 0)
        .count() as u64;
    // Every record was found through its own word, and there are no other words.
    if used_words != file.posts() {
        return Err(corrupt("the post index holds words for no record"));
    }
    Ok(Findings {
        unconfirmed: per_range.into_iter().flatten().collect(),
    })
}

/// What checking the records of a range of lines found.
#[derive(Default)]
struct RangeChecked {
    unconfirmed: Vec<i64>,
    /// Records whose index word is still to be checked: `(post_id, granule)`.
    indexed: Vec<(i64, u64)>,
    /// Embedded facts still to be compared: `(referenced id, conversation id, facts,
    /// is_parent)`.
    claims: Vec<(i64, i64, Embedded, bool)>,
}

/// Lookups checked together: their buckets (and then their records) prefetched for the whole
/// batch first, so that the misses of a batch overlap (a lookup at a time took about 200 ns a
/// record at 2M posts, most of the check).
const LOOKUP_BATCH: usize = 32;

impl RangeChecked {
    /// Checks the batched index words: each record found at its own granule by a lookup of
    /// its id, and no other record of that id before it.
    fn check_indexed(&mut self, file: &BaseFile) -> Result<(), SnapshotError> {
        for &(post_id, _) in &self.indexed {
            prefetch(file.bucket_ptr(post_id));
        }
        for &(post_id, granule) in &self.indexed {
            if file.find_post(post_id) != Some(granule) {
                return Err(corrupt(format!(
                    "post {post_id}: a record the post index does not find"
                )));
            }
        }
        self.indexed.clear();
        Ok(())
    }

    /// Compares the batched embedded facts with the records they describe.
    fn check_claims(&mut self, file: &BaseFile) {
        for &(id, ..) in &self.claims {
            prefetch(file.bucket_ptr(id));
        }
        let candidates: Vec<Option<u64>> = self
            .claims
            .iter()
            .map(|&(id, ..)| {
                let candidate = file.first_candidate(id);
                if let Some(granule) = candidate {
                    prefetch(file.record_bytes_at(granule).as_ptr());
                }
                candidate
            })
            .collect();
        for (&(id, conversation_id, embedded, is_parent), candidate) in
            self.claims.iter().zip(candidates)
        {
            if !confirmed(file, id, candidate, conversation_id, embedded, is_parent) {
                self.unconfirmed.push(id);
            }
        }
        self.claims.clear();
    }
}

/// Checks the records of line `at` (its structure checked by [`check_line`]).
fn check_line_records(
    file: &BaseFile,
    at: usize,
    line: &Line,
    checked: &mut RangeChecked,
) -> Result<(), SnapshotError> {
    let bad = |what: &str| corrupt(format!("directory line {at}: {what}"));
    if !line.used {
        return Ok(());
    }
    match file.find_line(line.author_id) {
        Some(found) if found == at => {}
        _ => return Err(bad("not where a lookup of its author finds it")),
    }
    // The keys of the originals, secondary and video-only runs.
    let mut keys: [Vec<(u32, i64)>; 3] = Default::default();
    for (slot, run) in [0, 1, VIDEO_ONLY].into_iter().enumerate() {
        let (len, stride) = (usize::from(line.lens[run]), line.stride(run) as usize);
        let start = line.run_start(run);
        let stride_bytes = stride * GRANULE_BYTES;
        let records = file.record_bytes_at(start);
        for i in 0..len {
            let bytes = &records[i * stride_bytes..(i + 1) * stride_bytes];
            let record = decode_record(bytes, stride_bytes, line.author_id)
                .map_err(|e| bad(&e.to_string()))?;
            let post = &record.post;
            if run != VIDEO_ONLY && post.is_original() != (run == 0) {
                return Err(bad("a record in the wrong timeline"));
            }
            if post.created_at == 0 {
                return Err(bad("a record created at 0"));
            }
            let key = (post.created_at, post.post_id);
            if keys[slot].last().is_some_and(|&newer| newer <= key) {
                return Err(bad("a run out of order"));
            }
            keys[slot].push(key);
            checked
                .indexed
                .push((post.post_id, start + (i * stride) as u64));
            if checked.indexed.len() == LOOKUP_BATCH {
                checked.check_indexed(file)?;
            }
            for (id, embedded, is_parent) in [
                (post.in_reply_to_post_id, record.parent, true),
                (post.source_post_id, record.source, false),
            ] {
                let Some(embedded) = embedded else { continue };
                checked
                    .claims
                    .push((id, post.conversation_id, embedded, is_parent));
                if checked.claims.len() == LOOKUP_BATCH {
                    checked.check_claims(file);
                }
            }
        }
        if run != VIDEO_ONLY && line.newest[run] != keys[slot].first().copied().unwrap_or((0, 0)) {
            return Err(bad("newest keys that are not its runs'"));
        }
    }
    // The videos run (its references are on its records): newest first, only of posts that
    // can be videos, every video-only record once.
    let mut last: Option<(u32, i64)> = None;
    let mut video_only = 0;
    for i in 0..usize::from(line.lens[VIDEOS_RUN]) {
        let granule = file.video_ref(line.videos as usize + i);
        video_only += usize::from(granule >= line.run_start(VIDEO_ONLY));
        let post = decode_checked_record(file.record_bytes_at(granule), line.author_id).post;
        let key = (post.created_at, post.post_id);
        if last.is_some_and(|newer| newer <= key) {
            return Err(bad("a videos run out of order"));
        }
        if last.is_none() && line.newest[VIDEOS_RUN] != key {
            return Err(bad("newest keys that are not its runs'"));
        }
        last = Some(key);
        let candidate =
            !post.is_reply && (post.has_video || (post.is_retweet && post.source_post_id != 0));
        if !candidate {
            return Err(bad("a videos entry that cannot be a video"));
        }
    }
    if last.is_none() && line.newest[VIDEOS_RUN] != (0, 0) {
        return Err(bad("newest keys that are not its runs'"));
    }
    if video_only != usize::from(line.lens[VIDEO_ONLY]) {
        return Err(bad("a video-only record its videos run does not hold"));
    }
    Ok(())
}

/// Whether the base's record of `id` (the parent of a reply whose conversation is
/// `conversation_id`, or a repost's source) has the facts `embedded` says; `candidate` is
/// the granule a lookup of `id` meets first, if any.
fn confirmed(
    file: &BaseFile,
    id: i64,
    candidate: Option<u64>,
    conversation_id: i64,
    embedded: Embedded,
    is_parent: bool,
) -> bool {
    let granule = match candidate {
        Some(granule)
            if decode_if_whole(file.record_bytes_at(granule))
                .is_some_and(|r| r.post.post_id == id) =>
        {
            granule
        }
        _ => match file.find_post(id) {
            Some(granule) => granule,
            None => return false,
        },
    };
    // The record is checked where its own line is; here only what the facts read, if the
    // bytes there hold a whole record at all (a bad granule is refused by that check).
    let Some(record) = decode_if_whole(file.record_bytes_at(granule)) else {
        return false;
    };
    let post = record.post;
    let facts = if is_parent {
        Embedded {
            created_at: post.created_at,
            flag: post.is_original(),
            continues: conversation_id != 0 && post.in_reply_to_post_id == conversation_id,
        }
    } else {
        Embedded {
            created_at: post.created_at,
            flag: post.has_video && !post.is_reply,
            continues: false,
        }
    };
    facts == embedded
}

/// Reads and checks a base file's header (that of another format version is refused).
fn read_base_header(input: &mut &[u8]) -> Result<(SnapshotHeader, u64), SnapshotError> {
    read_header_with(input, |version| {
        (version == BASE_FORMAT_VERSION).then(base_layout_hash)
    })
    .map_err(|error| match error {
        SnapshotError::UnsupportedVersion { found } => {
            corrupt(format!("a base footer after a version {found} header"))
        }
        error => error,
    })
}
