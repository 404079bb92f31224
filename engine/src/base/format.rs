//! The base file's byte layout: constants, the record, directory line and footer codecs, and
//! the fixed hashes that place authors and posts in the file's tables (see the wing's doc for
//! the whole format).

use crate::arena::CompactPost;
use crate::file_header::SnapshotError;

pub use crate::file_header::BASE_FORMAT_VERSION;

/// The base file's layouts; its CRC32C is the header's layout hash for version 3, so a build
/// whose layout differs refuses the file instead of misreading it. It names the hash
/// functions too: they place records in the file's tables.
pub const BASE_LAYOUT: &str = "base v3: little-endian; 8-byte granules; \
     record: post_id i64, created_at u32, flags u16 (1 retweet, 2 reply, 4 video, 8 irp, \
     16 iru, 32 src, 64 srcu, 128 conv, 256 conv=self, 512 parent in base, 1024 parent \
     original, 2048 parent irp=conv, 4096 source in base, 8192 source video shape), 2 zero, \
     ids i64 in order irp iru src srcu conv when flagged, parent created_at u32, source \
     created_at u32, zero to the run's stride; line(64): author i64, records granule u32, \
     videos ref u32, lens u16 x4 (originals, secondary, videos, video-only records), strides \
     u8 x3 (granules: originals, secondary, video-only), flags u8 (1 used), newest \
     created_at u32 x3, newest post_id i64 x3; bucket(64): 8 x (tag u32 << 32 | granule u32), \
     tag top bit set, 0 empty; hash fmix64(id ^ seed), directory seed 0x6a09e667f3bcc908, \
     posts seed 0xbb67ae8584caa73b, slot (hi32 * n) >> 32, tag lo32 | 1 << 31; tombstone(16): \
     post_id i64, basis i64; waiting(32): source i64, post_id i64, author i64, created_at \
     u32, 4 zero; fact(24): as snapshot v2; footer: sections x7 (offset u64, bytes u64, count \
     u64), cap u32, 4 zero, crc32c u32 per 1 MiB block of the file before the footer; tail: \
     footer bytes u64, footer crc32c u32, 4 zero, magic THUNDBAS";

/// The CRC32C of [`BASE_LAYOUT`].
pub fn base_layout_hash() -> u32 {
    crc32c::crc32c(BASE_LAYOUT.as_bytes())
}

/// The unit of a record reference: records start on 8-byte boundaries of the records section,
/// and a `u32` granule number reaches 32 GiB of records.
pub(crate) const GRANULE_BYTES: usize = 8;
/// A directory line and an index bucket: one cache line.
pub(crate) const LINE_BYTES: usize = 64;
/// Words of an index bucket.
pub(crate) const BUCKET_WORDS: usize = 8;
/// Bytes of the file each footer checksum covers.
pub(crate) const BLOCK_BYTES: usize = 1 << 20;
/// Every section starts on a cache line of the file (and so of its mapping).
pub(crate) const SECTION_ALIGN: usize = 64;
/// The fixed end of the file: footer length, footer checksum, 4 zero bytes, magic.
pub(crate) const TAIL_BYTES: usize = 24;
/// The last eight bytes of every base file.
pub(crate) const TAIL_MAGIC: [u8; 8] = *b"THUNDBAS";
/// Bytes of one section's entry in the footer.
const SECTION_ENTRY_BYTES: usize = 24;

pub(crate) const TOMBSTONE_BYTES: usize = 16;
pub(crate) const WAITING_BYTES: usize = 32;
pub(crate) const FACT_BYTES: usize = 24;
/// Largest record: the head, five ids and both embedded times.
pub(crate) const MAX_RECORD_BYTES: usize = 16 + 5 * 8 + 8;

/// The sections of a base file, in file order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Section {
    Tombstones = 0,
    Waiting = 1,
    Facts = 2,
    Records = 3,
    Videos = 4,
    Directory = 5,
    Posts = 6,
}

impl Section {
    pub(crate) const ALL: [Section; 7] = [
        Section::Tombstones,
        Section::Waiting,
        Section::Facts,
        Section::Records,
        Section::Videos,
        Section::Directory,
        Section::Posts,
    ];

    /// Bytes per counted item (records are counted as posts but vary in size).
    pub(crate) fn item_bytes(self) -> Option<usize> {
        match self {
            Section::Tombstones => Some(TOMBSTONE_BYTES),
            Section::Waiting => Some(WAITING_BYTES),
            Section::Facts => Some(FACT_BYTES),
            Section::Records => None,
            Section::Videos => Some(4),
            Section::Directory => Some(LINE_BYTES),
            Section::Posts => Some(LINE_BYTES),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Section::Tombstones => "tombstones",
            Section::Waiting => "waiting reposts",
            Section::Facts => "facts",
            Section::Records => "records",
            Section::Videos => "videos references",
            Section::Directory => "directory",
            Section::Posts => "post index",
        }
    }
}

/// Where a section lies and how many items it holds (records: posts; directory: lines;
/// post index: buckets).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SectionSpan {
    pub(crate) offset: u64,
    pub(crate) bytes: u64,
    pub(crate) count: u64,
}

impl SectionSpan {
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.bytes
    }
}

/// What the footer says besides the checksums.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Footer {
    pub(crate) sections: [SectionSpan; 7],
    /// The writing store's timeline cap (informational: the loader checks the runs against
    /// its own cap).
    pub(crate) cap: u32,
    /// CRC32C of every `BLOCK_BYTES` block of the file before the footer.
    pub(crate) blocks: Vec<u32>,
}

impl Footer {
    pub(crate) fn span(&self, section: Section) -> SectionSpan {
        self.sections[section as usize]
    }

    /// The footer body and tail, as they end the file.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(7 * SECTION_ENTRY_BYTES + 8 + 4 * self.blocks.len());
        for span in &self.sections {
            body.extend_from_slice(&span.offset.to_le_bytes());
            body.extend_from_slice(&span.bytes.to_le_bytes());
            body.extend_from_slice(&span.count.to_le_bytes());
        }
        body.extend_from_slice(&self.cap.to_le_bytes());
        body.extend_from_slice(&[0; 4]);
        for crc in &self.blocks {
            body.extend_from_slice(&crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&(body.len() as u64).to_le_bytes());
        body.extend_from_slice(&crc.to_le_bytes());
        body.extend_from_slice(&[0; 4]);
        body.extend_from_slice(&TAIL_MAGIC);
        body
    }

    /// The footer at the end of `file` (its checksum checked, its block count against the
    /// file's length) and where it starts.
    pub(crate) fn decode(file: &[u8]) -> Result<(Self, usize), SnapshotError> {
        let Some(tail_at) = file.len().checked_sub(TAIL_BYTES) else {
            return Err(SnapshotError::Truncated("the footer"));
        };
        let tail = &file[tail_at..];
        if tail[16..24] != TAIL_MAGIC {
            return Err(SnapshotError::Truncated("the footer (no end marker)"));
        }
        let body_len = le_u64(tail, 0);
        let stored_crc = le_u32(tail, 8);
        if le_u32(tail, 12) != 0 {
            return Err(corrupt("footer tail"));
        }
        let fixed = 7 * SECTION_ENTRY_BYTES + 8;
        let body_at = usize::try_from(body_len)
            .ok()
            .filter(|&len| len >= fixed)
            .and_then(|len| tail_at.checked_sub(len))
            .ok_or_else(|| corrupt("footer length"))?;
        let body = &file[body_at..tail_at];
        if crc32c::crc32c(body) != stored_crc {
            return Err(corrupt("footer checksum mismatch"));
        }
        if !(body.len() - fixed).is_multiple_of(4) {
            return Err(corrupt("footer length"));
        }
        let mut sections = [SectionSpan::default(); 7];
        for (i, span) in sections.iter_mut().enumerate() {
            let at = i * SECTION_ENTRY_BYTES;
            *span = SectionSpan {
                offset: le_u64(body, at),
                bytes: le_u64(body, at + 8),
                count: le_u64(body, at + 16),
            };
        }
        let cap = le_u32(body, 7 * SECTION_ENTRY_BYTES);
        if le_u32(body, 7 * SECTION_ENTRY_BYTES + 4) != 0 {
            return Err(corrupt("footer reserved bytes"));
        }
        let blocks: Vec<u32> = body[fixed..]
            .chunks_exact(4)
            .map(|word| le_u32(word, 0))
            .collect();
        if blocks.len() != body_at.div_ceil(BLOCK_BYTES) {
            return Err(corrupt("footer block count"));
        }
        Ok((
            Self {
                sections,
                cap,
                blocks,
            },
            body_at,
        ))
    }
}

pub(crate) fn corrupt(what: impl Into<String>) -> SnapshotError {
    SnapshotError::Corrupt(what.into())
}

#[inline]
pub(crate) fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

#[inline]
pub(crate) fn le_i64(bytes: &[u8], at: usize) -> i64 {
    le_u64(bytes, at) as i64
}

#[inline]
pub(crate) fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

#[inline]
pub(crate) fn le_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

// ---- hashes ----

const DIRECTORY_SEED: u64 = 0x6a09_e667_f3bc_c908;
const POSTS_SEED: u64 = 0xbb67_ae85_84ca_a73b;

/// MurmurHash3's 64-bit finalizer: a fixed mix, part of the file format.
#[inline]
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The slot `hash` picks among `n` (multiply-shift of its top half).
#[inline]
fn slot_of(hash: u64, n: u64) -> u64 {
    ((hash >> 32) * n) >> 32
}

/// The home line of `author_id` in a directory of `lines` lines.
#[inline]
pub(crate) fn directory_home(author_id: i64, lines: u64) -> u64 {
    slot_of(fmix64(author_id as u64 ^ DIRECTORY_SEED), lines)
}

/// The home bucket and the tag of `post_id` in a post index of `buckets` buckets.
#[inline]
pub(crate) fn post_home(post_id: i64, buckets: u64) -> (u64, u32) {
    let hash = fmix64(post_id as u64 ^ POSTS_SEED);
    (slot_of(hash, buckets), hash as u32 | 1 << 31)
}

/// Directory lines for `authors` authors (a load of at most 3/4, at least one line).
pub(crate) fn directory_lines_for(authors: usize) -> usize {
    (authors + authors / 3 + 1).max(1)
}

/// Index buckets for `posts` posts (a load of at most 0.8 over the buckets' words).
pub(crate) fn index_buckets_for(posts: usize) -> usize {
    (posts + posts / 4).div_ceil(BUCKET_WORDS).max(1)
}

// ---- records ----

pub(crate) const F_RETWEET: u16 = 1;
pub(crate) const F_REPLY: u16 = 2;
pub(crate) const F_VIDEO: u16 = 4;
const F_IRP: u16 = 8;
const F_IRU: u16 = 16;
const F_SRC: u16 = 32;
const F_SRCU: u16 = 64;
const F_CONV: u16 = 128;
const F_CONV_SELF: u16 = 256;
const F_PARENT: u16 = 512;
const F_PARENT_ORIGINAL: u16 = 1024;
const F_PARENT_CONTINUES: u16 = 2048;
const F_SOURCE: u16 = 4096;
const F_SOURCE_VIDEO: u16 = 8192;
const F_KNOWN: u16 = (1 << 14) - 1;
const F_IDS: u16 = F_IRP | F_IRU | F_SRC | F_SRCU | F_CONV;

/// What a reply carries of its parent, or a repost of its source, when that post was stored
/// in the same base when it was written: immutable facts the query rules read, so they need
/// no lookup while the post has not changed since (see `state.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Embedded {
    /// The referenced post's `created_at`.
    pub(crate) created_at: u32,
    /// Parent: an original. Source: `has_video && !is_reply` (a video source while unexpired).
    pub(crate) flag: bool,
    /// Parent only: its `in_reply_to_post_id` equals the reply's `conversation_id` (non-zero).
    pub(crate) continues: bool,
}

/// A record as the base holds it: the post (its author is the directory line's) and what it
/// embeds of its parent and source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BaseRecord {
    pub(crate) post: CompactPost,
    pub(crate) parent: Option<Embedded>,
    pub(crate) source: Option<Embedded>,
}

/// Bytes `post` takes as a record (before rounding to its run's stride).
pub(crate) fn record_bytes(record: &BaseRecord) -> usize {
    let post = &record.post;
    let ids = [
        post.in_reply_to_post_id,
        post.in_reply_to_user_id,
        post.source_post_id,
        post.source_user_id,
    ]
    .iter()
    .filter(|&&id| id != 0)
    .count()
        + usize::from(post.conversation_id != 0 && post.conversation_id != post.post_id);
    16 + 8 * ids
        + 4 * usize::from(record.parent.is_some())
        + 4 * usize::from(record.source.is_some())
}

/// The stride (bytes, a multiple of the granule) a run whose largest record takes `bytes`.
pub(crate) fn stride_for(bytes: usize) -> usize {
    bytes.next_multiple_of(GRANULE_BYTES)
}

/// Appends `record` to `out`, zero-padded to `stride` bytes. An embedded parent needs a
/// parent id, an embedded source a source id (the writer only embeds what it looked up).
pub(crate) fn encode_record(record: &BaseRecord, stride: usize, out: &mut Vec<u8>) {
    let start = out.len();
    let post = &record.post;
    let mut flags = 0u16;
    if post.is_retweet {
        flags |= F_RETWEET;
    }
    if post.is_reply {
        flags |= F_REPLY;
    }
    if post.has_video {
        flags |= F_VIDEO;
    }
    let ids = [
        (post.in_reply_to_post_id, F_IRP),
        (post.in_reply_to_user_id, F_IRU),
        (post.source_post_id, F_SRC),
        (post.source_user_id, F_SRCU),
        (post.conversation_id, F_CONV),
    ];
    for &(id, flag) in &ids {
        if id != 0 {
            flags |= flag;
        }
    }
    if post.conversation_id != 0 && post.conversation_id == post.post_id {
        flags = (flags & !F_CONV) | F_CONV_SELF;
    }
    if let Some(parent) = record.parent {
        debug_assert!(post.in_reply_to_post_id != 0);
        flags |= F_PARENT;
        if parent.flag {
            flags |= F_PARENT_ORIGINAL;
        }
        if parent.continues {
            flags |= F_PARENT_CONTINUES;
        }
    }
    if let Some(source) = record.source {
        debug_assert!(post.source_post_id != 0);
        flags |= F_SOURCE;
        if source.flag {
            flags |= F_SOURCE_VIDEO;
        }
    }
    out.extend_from_slice(&post.post_id.to_le_bytes());
    out.extend_from_slice(&post.created_at.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    for &(id, flag) in &ids {
        if flags & flag != 0 {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    for embedded in [record.parent, record.source].into_iter().flatten() {
        out.extend_from_slice(&embedded.created_at.to_le_bytes());
    }
    debug_assert!(out.len() - start <= stride);
    out.resize(start + stride, 0);
}

/// The key of the record at the start of `bytes`: `(created_at, post_id)`.
#[inline]
pub(crate) fn record_key(bytes: &[u8]) -> (u32, i64) {
    (le_u32(bytes, 8), le_i64(bytes, 0))
}

/// The flags of the record at the start of `bytes`.
#[inline]
pub(crate) fn record_flags(bytes: &[u8]) -> u16 {
    le_u16(bytes, 12)
}

/// Decodes a record of `author_id` from the start of `bytes` (at least the run's stride),
/// checking everything a writer could not have written: unknown flags, a conversation both
/// stored and implied, an embedded fact without its id, non-zero padding.
pub(crate) fn decode_record(
    bytes: &[u8],
    stride: usize,
    author_id: i64,
) -> Result<BaseRecord, SnapshotError> {
    let flags = record_flags(bytes);
    let embedded_flags_ok = (flags & (F_PARENT_ORIGINAL | F_PARENT_CONTINUES) == 0
        || flags & F_PARENT != 0)
        && (flags & F_PARENT == 0 || flags & F_IRP != 0)
        && (flags & F_SOURCE_VIDEO == 0 || flags & F_SOURCE != 0)
        && (flags & F_SOURCE == 0 || flags & F_SRC != 0)
        && !(flags & F_CONV != 0 && flags & F_CONV_SELF != 0);
    if flags & !F_KNOWN != 0 || le_u16(bytes, 14) != 0 || !embedded_flags_ok {
        return Err(corrupt(format!("record with bad flags {flags:#06x}")));
    }
    let used = used_bytes(flags);
    if used > stride || bytes[used..stride].iter().any(|&b| b != 0) {
        return Err(corrupt("record larger than its run's stride"));
    }
    let record = decode_checked_record(bytes, author_id);
    let post = &record.post;
    let nonzero = |id: i64, flag: u16| flags & flag == 0 || id != 0;
    if !(nonzero(post.in_reply_to_post_id, F_IRP)
        && nonzero(post.in_reply_to_user_id, F_IRU)
        && nonzero(post.source_post_id, F_SRC)
        && nonzero(post.source_user_id, F_SRCU)
        && (flags & F_CONV == 0
            || (post.conversation_id != 0 && post.conversation_id != post.post_id))
        && (flags & F_CONV_SELF == 0 || post.post_id != 0)
        && (flags & F_PARENT_CONTINUES == 0 || post.conversation_id != 0))
    {
        return Err(corrupt("record with a flagged id of 0"));
    }
    Ok(record)
}

/// The record at the start of `bytes` if they hold all of it (its checks aside): for reading
/// what an index word points at before the file is known to be whole.
pub(crate) fn decode_if_whole(bytes: &[u8]) -> Option<BaseRecord> {
    (bytes.len() >= 16 && used_bytes(record_flags(bytes)) <= bytes.len())
        .then(|| decode_checked_record(bytes, 0))
}

/// Bytes a record with `flags` uses.
#[inline]
fn used_bytes(flags: u16) -> usize {
    16 + 8 * (flags & F_IDS).count_ones() as usize
        + 4 * usize::from(flags & F_PARENT != 0)
        + 4 * usize::from(flags & F_SOURCE != 0)
}

/// Decodes a record [`decode_record`] accepted when the file was loaded.
#[inline]
pub(crate) fn decode_checked_record(bytes: &[u8], author_id: i64) -> BaseRecord {
    let flags = record_flags(bytes);
    let mut at = 16;
    let mut next = |flag: u16| {
        if flags & flag != 0 {
            let id = le_i64(bytes, at);
            at += 8;
            id
        } else {
            0
        }
    };
    let post_id = le_i64(bytes, 0);
    let in_reply_to_post_id = next(F_IRP);
    let in_reply_to_user_id = next(F_IRU);
    let source_post_id = next(F_SRC);
    let source_user_id = next(F_SRCU);
    let mut conversation_id = next(F_CONV);
    if flags & F_CONV_SELF != 0 {
        conversation_id = post_id;
    }
    let mut embedded = |present: u16, flag: u16, continues: u16| {
        (flags & present != 0).then(|| {
            let created_at = le_u32(bytes, at);
            at += 4;
            Embedded {
                created_at,
                flag: flags & flag != 0,
                continues: flags & continues != 0,
            }
        })
    };
    let parent = embedded(F_PARENT, F_PARENT_ORIGINAL, F_PARENT_CONTINUES);
    let source = embedded(F_SOURCE, F_SOURCE_VIDEO, 0);
    BaseRecord {
        post: CompactPost {
            post_id,
            author_id,
            created_at: le_u32(bytes, 8),
            in_reply_to_post_id,
            in_reply_to_user_id,
            source_post_id,
            source_user_id,
            conversation_id,
            is_retweet: flags & F_RETWEET != 0,
            is_reply: flags & F_REPLY != 0,
            has_video: flags & F_VIDEO != 0,
        },
        parent,
        source,
    }
}

// ---- directory lines ----

/// What a directory line says of one author.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Line {
    pub(crate) author_id: i64,
    /// The first granule of the author's records: the originals run, the secondary run, then
    /// the records only its videos timeline holds (evicted from their primary timeline by
    /// the cap).
    pub(crate) records: u32,
    /// The author's first entry in the videos references.
    pub(crate) videos: u32,
    /// Entries of the originals, secondary and videos runs, and the video-only records.
    pub(crate) lens: [u16; 4],
    /// Record strides of the originals, secondary and video-only runs, in granules.
    pub(crate) strides: [u8; 3],
    /// The newest `(created_at, post_id)` of the originals, secondary and videos runs; zero
    /// for an empty run.
    pub(crate) newest: [(u32, i64); 3],
    /// The line holds an author.
    pub(crate) used: bool,
}

/// Where `lens` and `strides` keep the video-only records.
pub(crate) const VIDEO_ONLY: usize = 3;

impl Line {
    pub(crate) fn encode(&self) -> [u8; LINE_BYTES] {
        let mut out = [0u8; LINE_BYTES];
        out[0..8].copy_from_slice(&self.author_id.to_le_bytes());
        out[8..12].copy_from_slice(&self.records.to_le_bytes());
        out[12..16].copy_from_slice(&self.videos.to_le_bytes());
        for (i, len) in self.lens.iter().enumerate() {
            out[16 + 2 * i..18 + 2 * i].copy_from_slice(&len.to_le_bytes());
        }
        out[24..27].copy_from_slice(&self.strides);
        out[27] = u8::from(self.used);
        for (i, (created_at, post_id)) in self.newest.iter().enumerate() {
            out[28 + 4 * i..32 + 4 * i].copy_from_slice(&created_at.to_le_bytes());
            out[40 + 8 * i..48 + 8 * i].copy_from_slice(&post_id.to_le_bytes());
        }
        out
    }

    #[inline]
    pub(crate) fn decode(bytes: &[u8]) -> Self {
        Self {
            author_id: le_i64(bytes, 0),
            records: le_u32(bytes, 8),
            videos: le_u32(bytes, 12),
            lens: [
                le_u16(bytes, 16),
                le_u16(bytes, 18),
                le_u16(bytes, 20),
                le_u16(bytes, 22),
            ],
            strides: [bytes[24], bytes[25], bytes[26]],
            newest: [
                (le_u32(bytes, 28), le_i64(bytes, 40)),
                (le_u32(bytes, 32), le_i64(bytes, 48)),
                (le_u32(bytes, 36), le_i64(bytes, 56)),
            ],
            used: bytes[27] & 1 != 0,
        }
    }

    /// The line's flag byte (only bit 0 is defined).
    #[inline]
    pub(crate) fn flag_byte(bytes: &[u8]) -> u8 {
        bytes[27]
    }

    /// The stride (in granules) of the record run `run` (0 originals, 1 secondary,
    /// [`VIDEO_ONLY`]).
    #[inline]
    pub(crate) fn stride(&self, run: usize) -> u64 {
        u64::from(self.strides[if run == VIDEO_ONLY { 2 } else { run }])
    }

    /// The first granule of record run `run` (0 originals, 1 secondary, [`VIDEO_ONLY`]).
    #[inline]
    pub(crate) fn run_start(&self, run: usize) -> u64 {
        let originals = u64::from(self.records);
        let secondary = originals + u64::from(self.lens[0]) * self.stride(0);
        match run {
            0 => originals,
            1 => secondary,
            _ => secondary + u64::from(self.lens[1]) * self.stride(1),
        }
    }

    /// Granules of the author's records.
    pub(crate) fn record_granules(&self) -> u64 {
        [0, 1, VIDEO_ONLY]
            .iter()
            .map(|&run| u64::from(self.lens[run]) * self.stride(run))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(post_id: i64) -> CompactPost {
        CompactPost {
            post_id,
            author_id: 7,
            created_at: 1_700_000_000,
            in_reply_to_post_id: 0,
            in_reply_to_user_id: 0,
            source_post_id: 0,
            source_user_id: 0,
            conversation_id: 0,
            is_retweet: false,
            is_reply: false,
            has_video: false,
        }
    }

    #[test]
    fn records_round_trip_in_the_bytes_their_fields_need() {
        let original = BaseRecord {
            post: CompactPost {
                conversation_id: 5,
                has_video: true,
                ..post(5)
            },
            parent: None,
            source: None,
        };
        let reply = BaseRecord {
            post: CompactPost {
                in_reply_to_post_id: 3,
                in_reply_to_user_id: -4,
                conversation_id: 1,
                is_reply: true,
                ..post(6)
            },
            parent: Some(Embedded {
                created_at: 1_600_000_000,
                flag: false,
                continues: true,
            }),
            source: None,
        };
        let repost = BaseRecord {
            post: CompactPost {
                source_post_id: 9,
                source_user_id: 10,
                is_retweet: true,
                ..post(-8)
            },
            parent: None,
            source: Some(Embedded {
                created_at: 1,
                flag: true,
                continues: false,
            }),
        };
        let everything = BaseRecord {
            post: CompactPost {
                in_reply_to_post_id: i64::MIN,
                in_reply_to_user_id: i64::MAX,
                source_post_id: 1,
                source_user_id: 2,
                conversation_id: 3,
                is_retweet: true,
                is_reply: true,
                has_video: true,
                ..post(0)
            },
            parent: Some(Embedded {
                created_at: u32::MAX,
                flag: true,
                continues: false,
            }),
            source: Some(Embedded {
                created_at: 0,
                flag: false,
                continues: false,
            }),
        };
        for (record, bytes) in [
            (original, 16),
            (reply, 44),
            (repost, 36),
            (everything, MAX_RECORD_BYTES),
        ] {
            assert_eq!(record_bytes(&record), bytes, "{record:?}");
            let stride = stride_for(bytes);
            let mut out = Vec::new();
            encode_record(&record, stride, &mut out);
            assert_eq!(out.len(), stride);
            assert_eq!(decode_record(&out, stride, 7).unwrap(), record);
            assert_eq!(
                record_key(&out),
                (record.post.created_at, record.post.post_id)
            );
        }
    }

    #[test]
    fn records_a_writer_could_not_write_are_refused() {
        let mut out = Vec::new();
        encode_record(
            &BaseRecord {
                post: post(1),
                parent: None,
                source: None,
            },
            24,
            &mut out,
        );
        let flip = |at: usize, value: u8| {
            let mut bad = out.clone();
            bad[at] = value;
            decode_record(&bad, 24, 7)
        };
        assert!(flip(13, 0x40).is_err(), "unknown flag");
        assert!(flip(14, 1).is_err(), "reserved byte");
        assert!(flip(20, 1).is_err(), "padding");
        // An id flagged but 0.
        assert!(flip(12, F_IRP as u8).is_err());
        assert!(decode_record(&out, 8, 7).is_err(), "wider than the stride");
    }

    #[test]
    fn lines_and_footers_round_trip() {
        let line = Line {
            author_id: -3,
            records: 77,
            videos: 5,
            lens: [1, 2, 3, 4],
            strides: [2, 6, 3],
            newest: [(10, 11), (12, -13), (14, 15)],
            used: true,
        };
        assert_eq!(Line::decode(&line.encode()), line);
        assert_eq!(line.record_granules(), 2 + 12 + 12);
        assert_eq!(line.run_start(1), 79);
        assert_eq!(line.run_start(VIDEO_ONLY), 91);

        let footer = Footer {
            sections: std::array::from_fn(|i| SectionSpan {
                offset: i as u64 * 64,
                bytes: 64,
                count: 1,
            }),
            cap: 5000,
            blocks: vec![1, 2, 3],
        };
        let mut file = vec![0u8; 2 * BLOCK_BYTES + 5];
        file.extend_from_slice(&footer.encode());
        let (read, at) = Footer::decode(&file).unwrap();
        assert_eq!((read, at), (footer, 2 * BLOCK_BYTES + 5));
        for cut in [1, TAIL_BYTES, file.len() - 2 * BLOCK_BYTES] {
            assert!(
                Footer::decode(&file[..file.len() - cut]).is_err(),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn hashes_spread_and_stay_in_range() {
        for n in [1u64, 7, 1 << 20, u32::MAX as u64] {
            for id in [i64::MIN, -1, 0, 1, i64::MAX] {
                assert!(directory_home(id, n) < n);
                let (bucket, tag) = post_home(id, n);
                assert!(bucket < n && tag >> 31 == 1);
            }
        }
        // Fixed values: the hashes are part of the file format.
        assert_eq!(post_home(42, 1 << 20), post_home(42, 1 << 20));
        assert_ne!(directory_home(1, 1 << 20), directory_home(2, 1 << 20));
    }
}
