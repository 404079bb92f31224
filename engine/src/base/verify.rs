//! Opening a base file: every byte checked against its block checksum on all the load's
//! threads, then every structure the store will read without checking again (the sections'
//! bounds, each directory line against its runs, each record, each run's order, the post
//! index against every record), so that a damaged or hostile file is refused with the reason
//! and never read out of bounds or answered from wrongly.

use std::ops::Range;

use super::file::{BaseBytes, BaseFile};
use super::format::*;

/// The videos run's place in a line's lengths and newest keys.
const VIDEOS_RUN: usize = 2;
use crate::snapshot::{SnapshotError, SnapshotHeader, on_each, read_header};

/// What opening a file found besides the file itself: the ids of referenced posts whose
/// embedded facts could not be confirmed (the referenced post is not in the base, or differs;
/// a file written while the store changed can hold such references), which the store must
/// look up instead of trusting.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) unconfirmed: Vec<i64>,
}

/// Opens the base file in `bytes` for a store whose timelines hold at most `cap` entries,
/// checking everything on `threads` threads.
pub(crate) fn open(
    bytes: BaseBytes,
    threads: usize,
    cap: usize,
) -> Result<(BaseFile, Findings), SnapshotError> {
    let threads = threads.max(1);
    let (footer, footer_at) = Footer::decode(&bytes)?;
    check_blocks(&bytes[..footer_at], &footer.blocks, threads)?;
    let (header, header_len) = read_header(&mut &bytes[..footer_at])?;
    if header.format_version != BASE_FORMAT_VERSION {
        return Err(corrupt("a base footer after a version 2 header"));
    }
    let spans = check_sections(&footer, header_len as usize, footer_at)?;
    let lines = footer.span(Section::Directory).count as usize;
    let buckets = footer.span(Section::Posts).count as usize;
    let file = BaseFile {
        bytes,
        header,
        footer,
        spans,
        lines,
        buckets,
    };
    check_small_sections(&file)?;
    let findings = check_authors(&file, threads, cap)?;
    Ok((file, findings))
}

/// The header of a base file, without checking the rest (a start-up choosing between files).
pub(crate) fn header_of(bytes: &[u8]) -> Result<SnapshotHeader, SnapshotError> {
    Ok(read_header(&mut &bytes[..])?.0)
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

/// Checks every directory line with its runs and records on `threads` threads (see
/// [`check_line`]), then that the lines tile the records and videos sections exactly and hold
/// as many posts as the post index.
fn check_authors(file: &BaseFile, threads: usize, cap: usize) -> Result<Findings, SnapshotError> {
    let records = file.section(Section::Records);
    let total_granules = (records.len() / GRANULE_BYTES) as u64;
    let total_videos = file.footer.span(Section::Videos).count;
    let per_range = on_ranges(file.lines, threads, |range| {
        let mut checked = RangeChecked::default();
        let first = file.line(range.start);
        let mut offsets = (u64::from(first.records), u64::from(first.videos));
        for at in range {
            let line = file.line(at);
            if (u64::from(line.records), u64::from(line.videos)) != offsets {
                return Err(corrupt(format!(
                    "directory line {at}: its runs are out of place"
                )));
            }
            check_line(file, at, &line, cap, &mut checked)?;
            offsets.0 += line.record_granules();
            offsets.1 += u64::from(line.lens[2]);
            if offsets.0 > total_granules || offsets.1 > total_videos {
                return Err(corrupt(format!(
                    "directory line {at}: runs past their section"
                )));
            }
        }
        checked.ends = offsets;
        Ok(checked)
    })?;
    let mut expected = (0u64, 0u64);
    let mut findings = Findings::default();
    let mut posts = 0u64;
    let mut first_line = 0;
    for checked in per_range {
        let line = file.line(first_line);
        if (u64::from(line.records), u64::from(line.videos)) != expected {
            return Err(corrupt(format!(
                "directory line {first_line}: its runs are out of place"
            )));
        }
        expected = checked.ends;
        posts += checked.posts;
        first_line += checked.lines;
        findings.unconfirmed.extend(checked.unconfirmed);
    }
    if expected != (total_granules, total_videos) {
        return Err(corrupt("the directory does not cover every record"));
    }
    if posts != file.posts() {
        return Err(corrupt("the records section holds another number of posts"));
    }
    let used_words = file
        .section(Section::Posts)
        .chunks_exact(8)
        .filter(|word| le_u64(word, 0) != 0)
        .count() as u64;
    // Every record was found through its own word, and there are no other words.
    if used_words != posts {
        return Err(corrupt("the post index holds words for no record"));
    }
    Ok(findings)
}

/// What checking a range of lines found.
#[derive(Default)]
struct RangeChecked {
    lines: usize,
    posts: u64,
    /// The records and videos offsets after the range.
    ends: (u64, u64),
    unconfirmed: Vec<i64>,
}

/// Checks line `at`: an unused line is all zero but for its offsets; a used one is where a
/// lookup finds it (no unused line and no other line of its author between its home and it),
/// and its runs are within the cap, of valid strides, their records valid, of the right kind,
/// strictly newest first, headed by the line's newest keys, each found by the post index; its
/// videos references point at its own records, eligible, strictly newest first. Embedded facts
/// are compared with the referenced record; those that cannot be confirmed are noted.
fn check_line(
    file: &BaseFile,
    at: usize,
    line: &Line,
    cap: usize,
    checked: &mut RangeChecked,
) -> Result<(), SnapshotError> {
    let bad = |what: &str| corrupt(format!("directory line {at}: {what}"));
    checked.lines += 1;
    let flags = Line::flag_byte(file.line_bytes(at));
    if flags > 1 {
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
    // Found by a lookup of its author.
    match file.find_line(line.author_id) {
        Some(found) if found == at => {}
        _ => return Err(bad("not where a lookup of its author finds it")),
    }
    let videos = usize::from(line.lens[VIDEOS_RUN]);
    // The keys of the originals, secondary and video-only runs.
    let mut keys: [Vec<(u32, i64)>; 3] = Default::default();
    for (slot, run) in [0, 1, VIDEO_ONLY].into_iter().enumerate() {
        let (len, stride) = (usize::from(line.lens[run]), line.stride(run) as usize);
        let most = if run == VIDEO_ONLY { videos } else { cap };
        if len > most {
            return Err(bad("a run longer than this store's timeline cap"));
        }
        let stride_ok = if len == 0 {
            stride == 0
        } else {
            (2..=MAX_RECORD_BYTES / GRANULE_BYTES).contains(&stride)
        };
        if !stride_ok {
            return Err(bad("a bad record stride"));
        }
        let start = line.run_start(run);
        let stride_bytes = stride * GRANULE_BYTES;
        let records = file.record_bytes_at(start);
        if records.len() < len * stride_bytes {
            return Err(bad("a run past the records section"));
        }
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
            let granule = start + (i * stride) as u64;
            if file.find_post(post.post_id) != Some(granule) {
                return Err(bad("a record the post index does not find"));
            }
            for (id, embedded, is_parent) in [
                (post.in_reply_to_post_id, record.parent, true),
                (post.source_post_id, record.source, false),
            ] {
                let Some(embedded) = embedded else { continue };
                if !confirmed(file, id, post.conversation_id, embedded, is_parent)? {
                    checked.unconfirmed.push(id);
                }
            }
        }
        if run != VIDEO_ONLY && line.newest[run] != keys[slot].first().copied().unwrap_or((0, 0)) {
            return Err(bad("newest keys that are not its runs'"));
        }
        checked.posts += len as u64;
    }
    // The videos run: references to its own records, every video-only record once.
    if videos > cap {
        return Err(bad("a run longer than this store's timeline cap"));
    }
    if line.videos as usize + videos > file.footer.span(Section::Videos).count as usize {
        return Err(bad("a videos run past its section"));
    }
    let mut last: Option<(u32, i64)> = None;
    let mut video_only = 0;
    for i in 0..videos {
        let granule = file.video_ref(line.videos as usize + i);
        let found = [0, 1, VIDEO_ONLY]
            .into_iter()
            .enumerate()
            .find_map(|(slot, run)| {
                let stride = line.stride(run);
                let offset = granule.checked_sub(line.run_start(run))?;
                let index = offset / stride.max(1);
                (stride > 0 && offset.is_multiple_of(stride) && (index as usize) < keys[slot].len())
                    .then_some((slot, index as usize))
            });
        let Some((slot, index)) = found else {
            return Err(bad("a videos entry that is not one of its records"));
        };
        video_only += usize::from(slot == 2);
        let key = keys[slot][index];
        if last.is_some_and(|newer| newer <= key) {
            return Err(bad("a videos run out of order"));
        }
        if last.is_none() && line.newest[VIDEOS_RUN] != key {
            return Err(bad("newest keys that are not its runs'"));
        }
        last = Some(key);
        let post = decode_checked_record(file.record_bytes_at(granule), line.author_id).post;
        let candidate =
            !post.is_reply && (post.has_video || (post.is_retweet && post.source_post_id != 0));
        if !candidate {
            return Err(bad("a videos entry that cannot be a video"));
        }
    }
    if videos == 0 && line.newest[VIDEOS_RUN] != (0, 0) {
        return Err(bad("newest keys that are not its runs'"));
    }
    if video_only != usize::from(line.lens[VIDEO_ONLY]) {
        return Err(bad("a video-only record its videos run does not hold"));
    }
    Ok(())
}

/// Whether the base's record of `id` (the parent of a reply whose conversation is
/// `conversation_id`, or a repost's source) has the facts `embedded` says.
fn confirmed(
    file: &BaseFile,
    id: i64,
    conversation_id: i64,
    embedded: Embedded,
    is_parent: bool,
) -> Result<bool, SnapshotError> {
    let Some(granule) = file.find_post(id) else {
        return Ok(false);
    };
    // Its record is checked where its own line is; here only what the facts read, if the
    // bytes there hold a whole record at all (a bad granule is refused by that check).
    let bytes = file.record_bytes_at(granule);
    let Some(record) = decode_if_whole(bytes) else {
        return Ok(false);
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
    Ok(facts == embedded)
}
