//! Writing a base file: the header, the small sections (tombstones, waiting reposts, facts),
//! then every author's runs streamed in directory order, then the videos references, the
//! directory and the post index held in memory until the end, and the footer with the block
//! checksums (see the wing's doc for the layout).

use std::io::Write;

use super::format::*;
use crate::directory::FactRecord;
use crate::file_header::{SnapshotError, SnapshotHeader};
use crate::waiting::PendingRepost;

/// One author's timelines as a base holds them, newest first: the records of the originals,
/// the secondary and the videos timelines (a post in two of them given in both).
#[derive(Debug, Default)]
pub(crate) struct AuthorRuns {
    pub(crate) originals: Vec<BaseRecord>,
    pub(crate) secondary: Vec<BaseRecord>,
    pub(crate) videos: Vec<BaseRecord>,
}

impl AuthorRuns {
    pub(crate) fn clear(&mut self) {
        self.originals.clear();
        self.secondary.clear();
        self.videos.clear();
    }
}

/// What a base file holds, as its writer counted it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BaseCounts {
    /// Post records.
    pub posts: u64,
    /// Authors with a directory line.
    pub authors: u64,
    /// Entries of the videos timelines.
    pub video_entries: u64,
    /// Tombstones.
    pub tombstones: u64,
    /// Reposts waiting for their source.
    pub waiting: u64,
    /// Facts of other shards' posts (author shards only).
    pub facts: u64,
    /// Bytes of the whole file.
    pub bytes: u64,
}

/// Bytes written so far, with a CRC32C for every finished `BLOCK_BYTES` block.
struct BlockOut<W: Write> {
    out: W,
    position: u64,
    blocks: Vec<u32>,
    /// CRC of the current block so far.
    crc: u32,
}

impl<W: Write> BlockOut<W> {
    fn write(&mut self, mut bytes: &[u8]) -> Result<(), SnapshotError> {
        self.out.write_all(bytes)?;
        while !bytes.is_empty() {
            let room = BLOCK_BYTES - (self.position as usize % BLOCK_BYTES);
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.crc = crc32c::crc32c_append(self.crc, now);
            self.position += now.len() as u64;
            if (self.position as usize).is_multiple_of(BLOCK_BYTES) {
                self.blocks.push(self.crc);
                self.crc = 0;
            }
            bytes = rest;
        }
        Ok(())
    }

    /// Zeroes up to the next section boundary.
    fn align(&mut self) -> Result<(), SnapshotError> {
        let pad = (self.position as usize).next_multiple_of(SECTION_ALIGN) - self.position as usize;
        self.write(&[0u8; SECTION_ALIGN][..pad])
    }

    /// The checksums of every block, the last partial one included.
    fn finish_blocks(&mut self) -> Vec<u32> {
        let mut blocks = std::mem::take(&mut self.blocks);
        if !(self.position as usize).is_multiple_of(BLOCK_BYTES) {
            blocks.push(self.crc);
        }
        blocks
    }
}

/// Writes one base file (see the module docs for the order of the calls).
pub(crate) struct BaseWriter<W: Write> {
    out: BlockOut<W>,
    footer: Footer,
    counts: BaseCounts,
    /// Directory lines, in table order (`author_id`, `used`); filled as authors are written.
    lines: Vec<Line>,
    /// The post index's words (`tag << 32 | granule`, 0 empty), `BUCKET_WORDS` a bucket.
    index: Vec<u64>,
    /// Words the index may hold before the write gives up (more posts than counted).
    index_room: usize,
    videos: Vec<u32>,
    /// Granules of records written so far.
    granules: u64,
    /// Lines before this one have their offsets.
    lines_done: usize,
    /// One author's video-only records (scratch).
    video_only: Vec<BaseRecord>,
    /// Encoding buffer of one author's records.
    buf: Vec<u8>,
    section_started: u64,
}

impl<W: Write> BaseWriter<W> {
    /// Writes `header` (version 3) and starts the file.
    pub(crate) fn start(out: W, header: &SnapshotHeader) -> Result<Self, SnapshotError> {
        let encoded = crate::file_header::encode_header(header)?;
        let mut out = BlockOut {
            out,
            position: 0,
            blocks: Vec::new(),
            crc: 0,
        };
        out.write(&encoded)?;
        out.align()?;
        Ok(Self {
            section_started: out.position,
            out,
            footer: Footer::default(),
            counts: BaseCounts::default(),
            lines: Vec::new(),
            index: Vec::new(),
            index_room: 0,
            videos: Vec::new(),
            granules: 0,
            lines_done: 0,
            video_only: Vec::new(),
            buf: Vec::with_capacity(1 << 16),
        })
    }

    /// Ends the section `section` whose `count` items were written since the last one ended.
    fn end_section(&mut self, section: Section, count: u64) -> Result<(), SnapshotError> {
        let offset = self.section_started;
        self.footer.sections[section as usize] = SectionSpan {
            offset,
            bytes: self.out.position - offset,
            count,
        };
        self.out.align()?;
        self.section_started = self.out.position;
        Ok(())
    }

    /// The tombstones section: `(post_id, basis_secs)`.
    pub(crate) fn tombstones(&mut self, tombstones: &[(i64, i64)]) -> Result<(), SnapshotError> {
        for chunk in tombstones.chunks(4096) {
            self.buf.clear();
            for &(post_id, basis) in chunk {
                self.buf.extend_from_slice(&post_id.to_le_bytes());
                self.buf.extend_from_slice(&basis.to_le_bytes());
            }
            self.out.write(&self.buf)?;
        }
        self.counts.tombstones = tombstones.len() as u64;
        self.end_section(Section::Tombstones, tombstones.len() as u64)
    }

    /// The waiting reposts section: `(source post_id, repost)`.
    pub(crate) fn waiting(
        &mut self,
        waiting: &[(i64, PendingRepost)],
    ) -> Result<(), SnapshotError> {
        for chunk in waiting.chunks(2048) {
            self.buf.clear();
            for (source, repost) in chunk {
                self.buf.extend_from_slice(&source.to_le_bytes());
                self.buf.extend_from_slice(&repost.post_id.to_le_bytes());
                self.buf.extend_from_slice(&repost.author_id.to_le_bytes());
                self.buf.extend_from_slice(&repost.created_at.to_le_bytes());
                self.buf.extend_from_slice(&[0; 4]);
            }
            self.out.write(&self.buf)?;
        }
        self.counts.waiting = waiting.len() as u64;
        self.end_section(Section::Waiting, waiting.len() as u64)
    }

    /// The facts section, filled by `fill` a batch at a time (it returns false when done).
    pub(crate) fn facts(
        &mut self,
        mut fill: impl FnMut(&mut Vec<FactRecord>) -> bool,
    ) -> Result<(), SnapshotError> {
        let mut batch = Vec::new();
        let mut count = 0u64;
        loop {
            batch.clear();
            let more = fill(&mut batch);
            self.buf.clear();
            for &(post_id, packed, parent) in &batch {
                self.buf.extend_from_slice(&post_id.to_le_bytes());
                self.buf.extend_from_slice(&packed.to_le_bytes());
                self.buf.extend_from_slice(&parent.to_le_bytes());
            }
            self.out.write(&self.buf)?;
            count += batch.len() as u64;
            if !more {
                break;
            }
        }
        self.counts.facts = count;
        self.end_section(Section::Facts, count)
    }

    /// Places `authors` (distinct ids) in the directory and sizes the post index for about
    /// `expected_posts` posts (room is left for those that arrive while the file is written).
    /// The authors' runs must then be written in the order [`author_order`](Self::author_order)
    /// gives.
    pub(crate) fn place_authors(&mut self, authors: &[i64], expected_posts: usize) {
        let n = directory_lines_for(authors.len());
        self.lines = vec![Line::default(); n];
        for &author_id in authors {
            let mut at = directory_home(author_id, n as u64) as usize;
            while self.lines[at].used {
                at = (at + 1) % n;
            }
            self.lines[at] = Line {
                author_id,
                used: true,
                ..Line::default()
            };
        }
        let room = expected_posts + expected_posts / 8 + 1024;
        let buckets = index_buckets_for(room);
        self.index = vec![0; buckets * BUCKET_WORDS];
        // Never fuller than 15/16: a lookup's probe then ends within a few buckets.
        self.index_room = self.index.len() - self.index.len() / 16;
    }

    /// The authors in the order their runs are written: `(line, author_id)`.
    pub(crate) fn author_order(&self) -> Vec<(usize, i64)> {
        self.lines
            .iter()
            .enumerate()
            .filter(|(_, line)| line.used)
            .map(|(at, line)| (at, line.author_id))
            .collect()
    }

    /// Writes the runs of the author placed at `line`, after every author before it in
    /// [`author_order`](Self::author_order).
    pub(crate) fn author(&mut self, line: usize, runs: &AuthorRuns) -> Result<(), SnapshotError> {
        if line < self.lines_done || !self.lines.get(line).is_some_and(|l| l.used) {
            return Err(SnapshotError::Incompatible(
                "authors written out of directory order".into(),
            ));
        }
        let too_long = |n: usize| n > usize::from(u16::MAX);
        if too_long(runs.originals.len())
            || too_long(runs.secondary.len())
            || too_long(runs.videos.len())
        {
            return Err(SnapshotError::Incompatible(
                "a timeline longer than 65535 entries".into(),
            ));
        }
        self.fill_lines_to(line)?;
        let key = |r: &BaseRecord| (r.post.created_at, r.post.post_id);
        let primary = |r: &BaseRecord| {
            [&runs.originals, &runs.secondary]
                .into_iter()
                .enumerate()
                .find_map(|(run, records)| {
                    records
                        .binary_search_by(|x| key(r).cmp(&key(x)))
                        .ok()
                        .map(|index| (run, index))
                })
        };
        // A videos entry is stored once: in its primary run, or (evicted from that timeline
        // by the cap) among the video-only records.
        self.video_only.clear();
        for record in &runs.videos {
            if primary(record).is_none() {
                self.video_only.push(*record);
            }
        }
        let video_only = std::mem::take(&mut self.video_only);
        self.buf.clear();
        let mut strides = [0u8; 3];
        let mut starts = [self.granules; 3];
        for (run, records) in [&runs.originals, &runs.secondary, &video_only]
            .into_iter()
            .enumerate()
        {
            let stride = stride_for(records.iter().map(record_bytes).max().unwrap_or(0));
            strides[run] = (stride / GRANULE_BYTES) as u8;
            starts[run] = self.granules;
            for record in records {
                self.index_post(record.post.post_id, self.granules)?;
                encode_record(record, stride, &mut self.buf);
                self.granules += (stride / GRANULE_BYTES) as u64;
            }
        }
        self.out.write(&self.buf)?;
        let mut extra = 0u64;
        for record in &runs.videos {
            let granule = match primary(record) {
                Some((run, index)) => starts[run] + index as u64 * u64::from(strides[run]),
                None => {
                    extra += 1;
                    starts[2] + (extra - 1) * u64::from(strides[2])
                }
            };
            self.videos.push(granule as u32);
        }
        let newest = |records: &[BaseRecord]| records.first().map_or((0, 0), key);
        let entry = &mut self.lines[line];
        entry.lens = [
            runs.originals.len() as u16,
            runs.secondary.len() as u16,
            runs.videos.len() as u16,
            video_only.len() as u16,
        ];
        entry.strides = strides;
        entry.newest = [
            newest(&runs.originals),
            newest(&runs.secondary),
            newest(&runs.videos),
        ];
        self.video_only = video_only;
        self.counts.authors += 1;
        self.counts.video_entries += runs.videos.len() as u64;
        self.lines_done = line + 1;
        Ok(())
    }

    /// Points the lines from the last one written up to `line` (included) at the records
    /// and videos references written so far: an author's runs start there, and a line
    /// without runs takes the offsets of the next one, so that the offsets never decrease
    /// along the directory.
    fn fill_lines_to(&mut self, line: usize) -> Result<(), SnapshotError> {
        let records = u32::try_from(self.granules).map_err(|_| {
            SnapshotError::Incompatible("more than 32 GiB of records in one base".into())
        })?;
        let videos = u32::try_from(self.videos.len())
            .map_err(|_| SnapshotError::Incompatible("too many videos entries".into()))?;
        for entry in &mut self.lines[self.lines_done..=line] {
            entry.records = records;
            entry.videos = videos;
        }
        Ok(())
    }

    /// Adds `post_id -> granule` to the post index.
    fn index_post(&mut self, post_id: i64, granule: u64) -> Result<(), SnapshotError> {
        if self.counts.posts as usize >= self.index_room {
            return Err(SnapshotError::Incompatible(
                "more posts than counted when the write started".into(),
            ));
        }
        let buckets = (self.index.len() / BUCKET_WORDS) as u64;
        let (home, tag) = post_home(post_id, buckets);
        let mut word = home as usize * BUCKET_WORDS;
        while self.index[word] != 0 {
            word = (word + 1) % self.index.len();
        }
        self.index[word] = u64::from(tag) << 32 | granule;
        self.counts.posts += 1;
        Ok(())
    }

    /// Writes the rest (videos references, directory, post index, footer) and flushes: what
    /// the file holds. `cap` is the writing store's timeline cap.
    pub(crate) fn finish(mut self, cap: usize) -> Result<BaseCounts, SnapshotError> {
        if let Some(last) = self.lines.len().checked_sub(1) {
            self.fill_lines_to(last)?;
        }
        let posts = self.counts.posts;
        self.end_section(Section::Records, posts)?;
        let mut bytes = Vec::with_capacity(self.videos.len() * 4);
        for granule in &self.videos {
            bytes.extend_from_slice(&granule.to_le_bytes());
        }
        self.out.write(&bytes)?;
        let videos = self.videos.len() as u64;
        self.end_section(Section::Videos, videos)?;
        for chunk in self.lines.chunks(4096) {
            self.buf.clear();
            for line in chunk {
                self.buf.extend_from_slice(&line.encode());
            }
            self.out.write(&self.buf)?;
        }
        self.end_section(Section::Directory, self.lines.len() as u64)?;
        for chunk in self.index.chunks(1 << 16) {
            self.buf.clear();
            for word in chunk {
                self.buf.extend_from_slice(&word.to_le_bytes());
            }
            self.out.write(&self.buf)?;
        }
        let buckets = (self.index.len() / BUCKET_WORDS) as u64;
        self.end_section(Section::Posts, buckets)?;
        self.footer.cap = u32::try_from(cap).unwrap_or(u32::MAX);
        self.footer.blocks = self.out.finish_blocks();
        let footer = self.footer.encode();
        self.out.out.write_all(&footer)?;
        self.out.out.flush()?;
        self.counts.bytes = self.out.position + footer.len() as u64;
        Ok(self.counts)
    }
}
