//! Snapshots: the store's records and tombstones written to a byte stream while it serves, and
//! loaded back into an empty store at start-up.
//!
//! # Fuzzy, then exact
//! A snapshot is *fuzzy*: it is written while inserts, deletes and queries go on, chunk by
//! chunk, without stopping anyone. The caller records the input positions (Kafka offsets)
//! *before* the scan starts and stores them in the header ([`SnapshotMeta::offsets`]): every
//! event before them is in the snapshot, events after them may or may not be. Replaying the
//! input from those positions after loading makes the store exact again, because inserts and
//! deletes are idempotent by post id (a duplicate create is dropped, a delete re-tombstones;
//! see `BEHAVIOUR.md`, Convergence).
//!
//! # Format (version 2, little-endian)
//! - Header: magic `THUNDSNP`, format version (`u32`), body length (`u32`), body, CRC32C of
//!   everything before it (`u32`). The body: record-layout hash (`u32`, CRC32C of
//!   [`RECORD_LAYOUT`]), retention (`i64` secs), creation time (`i64` unix secs, the store's
//!   clock), source (`u16` length + UTF-8, e.g. the Kafka topic), then the offsets (`u32` count,
//!   then `i32` partition + `i64` next offset each), then the author shard (`u8` 0 for a full
//!   store, 1 for a shard, then `u32` index and `u32` count, both 0 for a full store).
//! - Chunks: kind (`u8`: 1 tombstones, 2 posts, 3 facts, 0xEE end), 3 zero bytes, record
//!   count (`u32`), payload length (`u32`), CRC32C of those 12 bytes and the payload (`u32`),
//!   payload. Tombstones first (16 bytes each: `post_id`, basis secs), then, on an author
//!   shard, the fact directory (24 bytes each: `post_id`, the packed `created_at` and flags,
//!   parent id; see `directory.rs`), then posts (64 bytes each whatever the arena's slot class,
//!   at most 32768 a chunk, 2 MiB), then one end chunk whose payload counts the tombstones,
//!   posts, chunks and facts before it. A file without its end chunk is truncated.
//!
//! The posts are written in timeline order (`created_at`, then post id), the order a load
//! builds them in: it then reads them front to back and sorts nothing. A loader takes posts in
//! any order (files written before this order was, for one), at the cost of that sort.
//!
//! A shard's snapshot holds its own authors' posts and its facts of the others'; it loads only
//! into a store of the same shard ([`PostStore::with_author_shard`]), and a full store's only
//! into a full store.
//!
//! # Loading
//! [`PostStore::load_snapshot`] reads and verifies the whole stream *before* it touches the
//! store, so a corrupt or truncated file leaves the store empty and nothing partial is ever
//! served. Then it restores the live tombstones and the facts, and rebuilds the store from the
//! unexpired posts on several threads: a fresh store in bulk (`bulk.rs`: grouped by author,
//! each record published and indexed once, each timeline built whole), with the result the
//! ordinary insert path gives when it inserts the posts in `created_at` order; any other store,
//! or a snapshot the bulk build refuses, through that insert path, split by author.
//!
//! A stream's posts are decoded into one buffer before the build. A file is read in place
//! instead ([`PostStore::load_snapshot_file`], through a read-only mapping): every chunk is
//! verified where it lies, and the build decodes each post from its record when it reads it,
//! so the load takes no memory for the posts beyond the store's own (the file's pages are the
//! kernel's page cache). That needs the posts in timeline order, as this build writes them
//! (the expired ones are then a prefix, skipped), in chunks of one power-of-two size; a file
//! written otherwise is decoded first, as a stream is.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::arena::{CompactPost, SlotId};
pub use crate::bulk::BulkRefusal;
use crate::bulk::PostSource;
use crate::directory::{FACT_SHARDS, FactRecord, ShardId, fact_record_is_valid};
use crate::store::{InsertReport, PostStore};

/// The first eight bytes of every snapshot.
pub const MAGIC: [u8; 8] = *b"THUNDSNP";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 2;
/// The record layouts of this format version; its CRC32C is the header's layout hash, so a
/// build whose records differ refuses the file instead of misreading it.
pub const RECORD_LAYOUT: &str = "post(64): post_id i64, author_id i64, in_reply_to_post_id i64, \
     in_reply_to_user_id i64, source_post_id i64, source_user_id i64, conversation_id i64, \
     created_at u32, flags u8 (1 retweet, 2 reply, 4 video), 3 zero bytes; \
     tombstone(16): post_id i64, basis_secs i64; \
     fact(24): post_id i64, packed u64 (created_at u32, 1<<32 original, 1<<33 video source, \
     1<<34 has parent), parent_post_id i64; little-endian";

const POST_BYTES: usize = 64;
const TOMBSTONE_BYTES: usize = 16;
const FACT_BYTES: usize = 24;
const CHUNK_HEADER_BYTES: usize = 16;
const END_PAYLOAD_BYTES: usize = 32;
/// Tombstones per chunk.
const TOMBSTONES_PER_CHUNK: usize = 1 << 16;
/// Facts per chunk (1.5 MiB).
const FACTS_PER_CHUNK: usize = 1 << 16;
/// Posts per posts chunk (2 MiB), the last one of a snapshot fewer.
const POSTS_PER_CHUNK: usize = 1 << 15;
/// How many posts ahead of its reads the writer's second pass prefetches their slots.
const WRITE_READ_AHEAD: usize = 16;
/// Largest record count a chunk may claim; bounds what a corrupt length can make us allocate.
const MAX_CHUNK_RECORDS: u32 = 1 << 20;
/// Largest header body a file may claim.
const MAX_HEADER_BODY: u32 = 1 << 20;

const KIND_TOMBSTONES: u8 = 1;
const KIND_POSTS: u8 = 2;
const KIND_FACTS: u8 = 3;
const KIND_END: u8 = 0xEE;

const FLAG_RETWEET: u8 = 1;
const FLAG_REPLY: u8 = 2;
const FLAG_VIDEO: u8 = 4;

/// The CRC32C of [`RECORD_LAYOUT`].
pub fn layout_hash() -> u32 {
    crc32c::crc32c(RECORD_LAYOUT.as_bytes())
}

/// Where the input stood when a snapshot's scan started: the next offset to apply, per
/// partition. Replaying from here makes the snapshot exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionOffset {
    /// Kafka partition id.
    pub partition: i32,
    /// Next offset to apply; `-1` when nothing was applied yet (start from the beginning).
    pub next_offset: i64,
}

/// What the caller records in a snapshot's header besides the store's own facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotMeta {
    /// Where the events came from (the Kafka topic); a loader checks it matches.
    pub source: String,
    /// Input positions taken *before* the scan started (see the module docs).
    pub offsets: Vec<PartitionOffset>,
}

/// A snapshot's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// Format version (always [`FORMAT_VERSION`] once read).
    pub format_version: u32,
    /// CRC32C of the record layout (always [`layout_hash`] once read).
    pub layout_hash: u32,
    /// The writing store's retention, seconds.
    pub retention_secs: i64,
    /// When the scan started, unix seconds (the writing store's clock).
    pub created_at_secs: i64,
    /// The source and offsets the writer recorded.
    pub meta: SnapshotMeta,
    /// The author shard the writing store was; `None` for a full store.
    pub shard: Option<ShardId>,
}

/// What a snapshot holds, as counted by its writer or verified by a reader.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Post records.
    pub posts: u64,
    /// Tombstones.
    pub tombstones: u64,
    /// Fact directory entries (author shards only).
    pub facts: u64,
    /// Data chunks (the end chunk not counted).
    pub chunks: u64,
    /// Bytes of the whole stream.
    pub bytes: u64,
}

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

/// What loading a snapshot did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadReport {
    /// The header read.
    pub header: SnapshotHeader,
    /// What the file held.
    pub counts: SnapshotCounts,
    /// Posts stored.
    pub posts_loaded: u64,
    /// Posts skipped because they expired since the snapshot (or were dropped by the insert
    /// rules: see [`LoadReport::inserts`]).
    pub posts_skipped: u64,
    /// Tombstones restored.
    pub tombstones_loaded: u64,
    /// Tombstones skipped because they expired since the snapshot.
    pub tombstones_expired: u64,
    /// Facts restored into the fact directory (author shards).
    pub facts_loaded: u64,
    /// Facts skipped: expired since the snapshot (or dropped by a tombstone).
    pub facts_skipped: u64,
    /// The insert report of the posts handed to the store.
    pub inserts: InsertReport,
    /// `None` when the store was built in bulk, else why the per-post insert path rebuilt it.
    pub per_post_reason: Option<BulkRefusal>,
    /// Time spent reading and verifying the stream.
    pub read_duration: Duration,
    /// Time spent rebuilding the store from it.
    pub build_duration: Duration,
}

/// Why a snapshot could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading or writing failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The stream ended early.
    #[error("truncated: the file ends inside {0}")]
    Truncated(&'static str),
    /// Not a snapshot.
    #[error("not a thunder snapshot (bad magic)")]
    BadMagic,
    /// Written by a build with another format version.
    #[error("format version {found}, this build reads version {FORMAT_VERSION}")]
    UnsupportedVersion {
        /// The file's version.
        found: u32,
    },
    /// Written by a build whose records are laid out differently.
    #[error("record layout hash {found:#010x}, this build's is {expected:#010x}")]
    LayoutMismatch {
        /// The file's layout hash.
        found: u32,
        /// This build's.
        expected: u32,
    },
    /// A checksum or a structural check failed.
    #[error("corrupt: {0}")]
    Corrupt(String),
    /// The file is valid but cannot serve this store.
    #[error("incompatible: {0}")]
    Incompatible(String),
}

/// Maps an early end of the stream to [`SnapshotError::Truncated`].
fn read_exact(
    input: &mut impl Read,
    buf: &mut [u8],
    what: &'static str,
) -> Result<(), SnapshotError> {
    input.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => SnapshotError::Truncated(what),
        _ => SnapshotError::Io(e),
    })
}

/// A little-endian cursor over a verified byte slice.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let Some((head, rest)) = self.0.split_first_chunk::<N>() else {
            return Err(SnapshotError::Corrupt("header body too short".into()));
        };
        self.0 = rest;
        Ok(*head)
    }
    fn u16(&mut self) -> Result<u16, SnapshotError> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        self.take().map(u32::from_le_bytes)
    }
    fn i32(&mut self) -> Result<i32, SnapshotError> {
        self.take().map(i32::from_le_bytes)
    }
    fn i64(&mut self) -> Result<i64, SnapshotError> {
        self.take().map(i64::from_le_bytes)
    }
}

fn le_i64(bytes: &[u8], at: usize) -> i64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    i64::from_le_bytes(word)
}

fn encode_header(header: &SnapshotHeader) -> Result<Vec<u8>, SnapshotError> {
    let source = header.meta.source.as_bytes();
    let source_len = u16::try_from(source.len())
        .map_err(|_| SnapshotError::Incompatible("source name longer than 65535 bytes".into()))?;
    let offsets = u32::try_from(header.meta.offsets.len())
        .map_err(|_| SnapshotError::Incompatible("too many partitions".into()))?;
    let mut body = Vec::with_capacity(32 + source.len() + 12 * header.meta.offsets.len());
    body.extend_from_slice(&header.layout_hash.to_le_bytes());
    body.extend_from_slice(&header.retention_secs.to_le_bytes());
    body.extend_from_slice(&header.created_at_secs.to_le_bytes());
    body.extend_from_slice(&source_len.to_le_bytes());
    body.extend_from_slice(source);
    body.extend_from_slice(&offsets.to_le_bytes());
    for offset in &header.meta.offsets {
        body.extend_from_slice(&offset.partition.to_le_bytes());
        body.extend_from_slice(&offset.next_offset.to_le_bytes());
    }
    let (sharded, shard) = match header.shard {
        None => (0u8, ShardId { index: 0, count: 0 }),
        Some(shard) => (1, shard),
    };
    body.push(sharded);
    body.extend_from_slice(&shard.index.to_le_bytes());
    body.extend_from_slice(&shard.count.to_le_bytes());
    let body_len = u32::try_from(body.len())
        .ok()
        .filter(|&len| len <= MAX_HEADER_BODY)
        .ok_or_else(|| SnapshotError::Incompatible("header too large".into()))?;
    let mut out = Vec::with_capacity(body.len() + 20);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&header.format_version.to_le_bytes());
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Reads and checks a snapshot's header: magic, version, checksum and layout hash. Leaves
/// `input` at the first chunk. Returns the header and its size in bytes.
pub fn read_header(input: &mut impl Read) -> Result<(SnapshotHeader, u64), SnapshotError> {
    let mut fixed = [0u8; 16];
    read_exact(input, &mut fixed, "the header")?;
    if fixed[..8] != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let mut word = [0u8; 4];
    word.copy_from_slice(&fixed[8..12]);
    let format_version = u32::from_le_bytes(word);
    if format_version != FORMAT_VERSION {
        return Err(SnapshotError::UnsupportedVersion {
            found: format_version,
        });
    }
    word.copy_from_slice(&fixed[12..16]);
    let body_len = u32::from_le_bytes(word);
    if body_len > MAX_HEADER_BODY {
        return Err(SnapshotError::Corrupt(format!(
            "header claims a {body_len}-byte body"
        )));
    }
    let mut body = vec![0u8; body_len as usize];
    read_exact(input, &mut body, "the header")?;
    let mut stored = [0u8; 4];
    read_exact(input, &mut stored, "the header")?;
    let crc = crc32c::crc32c_append(crc32c::crc32c(&fixed), &body);
    if crc != u32::from_le_bytes(stored) {
        return Err(SnapshotError::Corrupt("header checksum mismatch".into()));
    }
    let mut cursor = Cursor(&body);
    let layout = cursor.u32()?;
    if layout != layout_hash() {
        return Err(SnapshotError::LayoutMismatch {
            found: layout,
            expected: layout_hash(),
        });
    }
    let retention_secs = cursor.i64()?;
    let created_at_secs = cursor.i64()?;
    let source_len = usize::from(cursor.u16()?);
    if cursor.0.len() < source_len {
        return Err(SnapshotError::Corrupt("header body too short".into()));
    }
    let (source, rest) = cursor.0.split_at(source_len);
    let source = String::from_utf8(source.to_vec())
        .map_err(|_| SnapshotError::Corrupt("source name is not UTF-8".into()))?;
    cursor.0 = rest;
    let count = cursor.u32()?;
    let mut offsets = Vec::with_capacity((count as usize).min(cursor.0.len() / 12));
    for _ in 0..count {
        offsets.push(PartitionOffset {
            partition: cursor.i32()?,
            next_offset: cursor.i64()?,
        });
    }
    let sharded = cursor.take::<1>()?[0];
    let (index, count) = (cursor.u32()?, cursor.u32()?);
    let shard = match (sharded, index, count) {
        (0, 0, 0) => None,
        (1, index, count) if index < count => Some(ShardId { index, count }),
        _ => {
            return Err(SnapshotError::Corrupt(format!(
                "bad author shard in the header ({sharded}, {index}/{count})"
            )));
        }
    };
    if !cursor.0.is_empty() {
        return Err(SnapshotError::Corrupt("header body too long".into()));
    }
    let header = SnapshotHeader {
        format_version,
        layout_hash: layout,
        retention_secs,
        created_at_secs,
        meta: SnapshotMeta { source, offsets },
        shard,
    };
    Ok((header, 20 + u64::from(body_len)))
}

/// Writes chunks to `out`, counting them.
struct ChunkWriter<W: Write> {
    out: W,
    counts: SnapshotCounts,
    buf: Vec<u8>,
}

impl<W: Write> ChunkWriter<W> {
    fn write(&mut self, kind: u8, count: usize) -> Result<(), SnapshotError> {
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

fn encode_post(post: &CompactPost, buf: &mut Vec<u8>) {
    for id in [
        post.post_id,
        post.author_id,
        post.in_reply_to_post_id,
        post.in_reply_to_user_id,
        post.source_post_id,
        post.source_user_id,
        post.conversation_id,
    ] {
        buf.extend_from_slice(&id.to_le_bytes());
    }
    buf.extend_from_slice(&post.created_at.to_le_bytes());
    let flags = (if post.is_retweet { FLAG_RETWEET } else { 0 })
        | (if post.is_reply { FLAG_REPLY } else { 0 })
        | (if post.has_video { FLAG_VIDEO } else { 0 });
    buf.extend_from_slice(&[flags, 0, 0, 0]);
}

/// Checks what a post record can hold wrongly past its checksum: its flags.
fn check_post(bytes: &[u8]) -> Result<(), SnapshotError> {
    let flags = bytes[60];
    if flags & !(FLAG_RETWEET | FLAG_REPLY | FLAG_VIDEO) != 0 || bytes[61..64] != [0, 0, 0] {
        return Err(SnapshotError::Corrupt(format!(
            "post record with unknown flags {flags:#04x}"
        )));
    }
    Ok(())
}

fn decode_post(bytes: &[u8]) -> Result<CompactPost, SnapshotError> {
    check_post(bytes)?;
    Ok(decode_checked_post(bytes))
}

/// A post record [`check_post`] accepted.
#[inline]
fn decode_checked_post(bytes: &[u8]) -> CompactPost {
    let flags = bytes[60];
    let mut created = [0u8; 4];
    created.copy_from_slice(&bytes[56..60]);
    CompactPost {
        post_id: le_i64(bytes, 0),
        author_id: le_i64(bytes, 8),
        in_reply_to_post_id: le_i64(bytes, 16),
        in_reply_to_user_id: le_i64(bytes, 24),
        source_post_id: le_i64(bytes, 32),
        source_user_id: le_i64(bytes, 40),
        conversation_id: le_i64(bytes, 48),
        created_at: u32::from_le_bytes(created),
        is_retweet: flags & FLAG_RETWEET != 0,
        is_reply: flags & FLAG_REPLY != 0,
        has_video: flags & FLAG_VIDEO != 0,
    }
}

/// One verified chunk.
enum Chunk {
    Tombstones(Vec<(i64, i64)>),
    Facts(Vec<FactRecord>),
    Posts(Vec<CompactPost>),
    /// A posts chunk decoded straight onto the end of the caller's vector.
    PostsAppended,
    /// A posts chunk whose records were only checked (`PostsInto::Checked`).
    PostsChecked,
    /// A posts chunk left unchecked (`PostsInto::Unchecked`).
    PostsUnchecked,
    End,
}

/// What [`SnapshotReader`] does with the records of a posts chunk.
enum PostsInto<'v> {
    /// Decodes them, onto the end of this vector when it has room for them without growing,
    /// else into a chunk of their own.
    Decoded(Option<&'v mut Vec<CompactPost>>),
    /// Checks them and leaves them where they are (a mapped file, or only verifying).
    Checked,
    /// Leaves them where they are, their checksum and records unchecked: the caller checks
    /// them with [`check_posts_chunk`] before it uses them (a mapped file, checked in parallel).
    Unchecked,
}

/// Reads a snapshot's chunks one at a time, verifying each.
pub struct SnapshotReader<R: Read> {
    input: R,
    header: SnapshotHeader,
    counts: SnapshotCounts,
    ended: bool,
    /// The chunk being read, its buffer reused from one chunk to the next.
    payload: Vec<u8>,
}

impl<R: Read> SnapshotReader<R> {
    /// Reads and checks the header (see [`read_header`]).
    pub fn new(mut input: R) -> Result<Self, SnapshotError> {
        let (header, bytes) = read_header(&mut input)?;
        Ok(Self {
            input,
            header,
            counts: SnapshotCounts {
                bytes,
                ..SnapshotCounts::default()
            },
            ended: false,
            payload: Vec::new(),
        })
    }

    /// The header.
    pub fn header(&self) -> &SnapshotHeader {
        &self.header
    }

    /// Reads every remaining chunk, checking every checksum, the counts in the end chunk and
    /// that nothing follows it. The counts of the whole stream.
    pub fn verify(mut self) -> Result<(SnapshotHeader, SnapshotCounts), SnapshotError> {
        while !matches!(self.next_chunk(PostsInto::Checked)?, Chunk::End) {}
        Ok((self.header, self.counts))
    }

    /// The next chunk, verified. A posts chunk goes where `posts_into` says: decoded onto the
    /// end of a vector that has room for it without growing (no second copy, no allocation
    /// per chunk), or only checked.
    fn next_chunk(&mut self, posts_into: PostsInto<'_>) -> Result<Chunk, SnapshotError> {
        if self.ended {
            return Ok(Chunk::End);
        }
        let mut head = [0u8; CHUNK_HEADER_BYTES];
        read_exact(&mut self.input, &mut head, "a chunk header (no end chunk)")?;
        let (kind, count, len) = self.chunk_head(&head)?;
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        // At most 64 MiB (MAX_CHUNK_RECORDS records, checked above).
        payload.reserve(len as usize);
        // Reads into the buffer's spare room without zeroing it first.
        (&mut self.input)
            .take(u64::from(len))
            .read_to_end(&mut payload)?;
        if payload.len() != len as usize {
            return Err(SnapshotError::Truncated("a chunk"));
        }
        let chunk = self.decode_chunk(kind, count, &head, &payload, posts_into);
        self.payload = payload;
        chunk
    }

    /// The kind, record count and payload length of the chunk whose 16-byte header is `head`,
    /// checked against each other and against the limits.
    fn chunk_head(&self, head: &[u8; CHUNK_HEADER_BYTES]) -> Result<(u8, u32, u32), SnapshotError> {
        let index = self.counts.chunks;
        let kind = head[0];
        let mut word = [0u8; 4];
        word.copy_from_slice(&head[4..8]);
        let count = u32::from_le_bytes(word);
        word.copy_from_slice(&head[8..12]);
        let len = u32::from_le_bytes(word);
        let record_bytes = match kind {
            KIND_TOMBSTONES => TOMBSTONE_BYTES,
            KIND_POSTS => POST_BYTES,
            KIND_FACTS => FACT_BYTES,
            KIND_END => END_PAYLOAD_BYTES,
            other => {
                return Err(SnapshotError::Corrupt(format!(
                    "chunk {index}: unknown kind {other:#04x}"
                )));
            }
        };
        let expected_len = if kind == KIND_END {
            END_PAYLOAD_BYTES as u64
        } else {
            u64::from(count) * record_bytes as u64
        };
        if head[1..4] != [0, 0, 0] || count > MAX_CHUNK_RECORDS || u64::from(len) != expected_len {
            return Err(SnapshotError::Corrupt(format!(
                "chunk {index}: bad chunk header (kind {kind:#04x}, {count} records, {len} bytes)"
            )));
        }
        Ok((kind, count, len))
    }

    /// Checks and decodes the payload of a chunk whose header `next_chunk` read.
    fn decode_chunk(
        &mut self,
        kind: u8,
        count: u32,
        head: &[u8; CHUNK_HEADER_BYTES],
        payload: &[u8],
        posts_into: PostsInto<'_>,
    ) -> Result<Chunk, SnapshotError> {
        let index = self.counts.chunks;
        if !(kind == KIND_POSTS && matches!(posts_into, PostsInto::Unchecked)) {
            check_chunk_crc(index, head, payload)?;
        }
        self.counts.bytes += (CHUNK_HEADER_BYTES + payload.len()) as u64;
        match kind {
            KIND_TOMBSTONES => {
                self.counts.chunks += 1;
                self.counts.tombstones += u64::from(count);
                Ok(Chunk::Tombstones(
                    payload
                        .chunks_exact(TOMBSTONE_BYTES)
                        .map(|t| (le_i64(t, 0), le_i64(t, 8)))
                        .collect(),
                ))
            }
            KIND_POSTS => {
                self.counts.chunks += 1;
                self.counts.posts += u64::from(count);
                let records = payload.chunks_exact(POST_BYTES);
                match posts_into {
                    PostsInto::Checked => {
                        records.into_iter().try_for_each(check_post)?;
                        Ok(Chunk::PostsChecked)
                    }
                    PostsInto::Unchecked => Ok(Chunk::PostsUnchecked),
                    PostsInto::Decoded(Some(posts))
                        if posts.capacity() - posts.len() >= records.len() =>
                    {
                        for record in records {
                            posts.push(decode_post(record)?);
                        }
                        Ok(Chunk::PostsAppended)
                    }
                    _ => Ok(Chunk::Posts(
                        records.map(decode_post).collect::<Result<_, _>>()?,
                    )),
                }
            }
            KIND_FACTS => {
                self.counts.chunks += 1;
                self.counts.facts += u64::from(count);
                let facts: Vec<FactRecord> = payload
                    .chunks_exact(FACT_BYTES)
                    .map(|f| (le_i64(f, 0), le_i64(f, 8) as u64, le_i64(f, 16)))
                    .collect();
                if let Some(bad) = facts.iter().find(|f| !fact_record_is_valid(f)) {
                    return Err(SnapshotError::Corrupt(format!(
                        "chunk {index}: fact of post {} with bad flags {:#x}",
                        bad.0, bad.1
                    )));
                }
                Ok(Chunk::Facts(facts))
            }
            _ => {
                let claimed = [
                    le_i64(payload, 0),
                    le_i64(payload, 8),
                    le_i64(payload, 16),
                    le_i64(payload, 24),
                ];
                let seen = [
                    self.counts.tombstones,
                    self.counts.posts,
                    self.counts.chunks,
                    self.counts.facts,
                ]
                .map(|n| n as i64);
                if claimed != seen {
                    return Err(SnapshotError::Corrupt(format!(
                        "end chunk counts {claimed:?} (tombstones, posts, chunks, facts), the file holds {seen:?}"
                    )));
                }
                let mut extra = [0u8; 1];
                if self.input.read(&mut extra)? != 0 {
                    return Err(SnapshotError::Corrupt("data after the end chunk".into()));
                }
                self.ended = true;
                Ok(Chunk::End)
            }
        }
    }
}

/// Checks the CRC32C of the chunk `index` (its 16-byte header `head` and its payload).
fn check_chunk_crc(
    index: u64,
    head: &[u8; CHUNK_HEADER_BYTES],
    payload: &[u8],
) -> Result<(), SnapshotError> {
    let mut word = [0u8; 4];
    word.copy_from_slice(&head[12..16]);
    let stored_crc = u32::from_le_bytes(word);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head[..12]), payload);
    if crc != stored_crc {
        return Err(SnapshotError::Corrupt(format!(
            "chunk {index}: checksum mismatch"
        )));
    }
    Ok(())
}

/// A posts chunk of a snapshot held in memory, read but not yet checked.
struct UncheckedPosts<'a> {
    index: u64,
    head: [u8; CHUNK_HEADER_BYTES],
    records: &'a [u8],
}

/// Checks a posts chunk as [`PostsInto::Checked`] would have: its checksum, then its records.
fn check_posts_chunk(chunk: &UncheckedPosts<'_>) -> Result<(), SnapshotError> {
    check_chunk_crc(chunk.index, &chunk.head, chunk.records)?;
    chunk
        .records
        .chunks_exact(POST_BYTES)
        .try_for_each(check_post)
}

/// Checks `chunks` on up to `threads` threads, each taking a contiguous run of them (a mapped
/// file is then read front to back by each): the error of the first bad chunk in file order,
/// the one a check in order would have reported.
///
/// On a virtual machine whose host has taken back the pages of a file the guest still caches,
/// reading the file is the host faulting them back in: one thread checked a 1.27 GB snapshot
/// in 3.4 s that way, against 0.27 s when its pages were backed.
fn check_posts_chunks(chunks: &[UncheckedPosts<'_>], threads: usize) -> Result<(), SnapshotError> {
    let per_thread = chunks.len().div_ceil(threads.max(1)).max(1);
    if chunks.len() <= per_thread {
        return chunks.iter().try_for_each(check_posts_chunk);
    }
    let mut runs = chunks.chunks(per_thread);
    let first = runs.next().unwrap_or_default();
    let results: Vec<Result<(), SnapshotError>> = std::thread::scope(|scope| {
        let others: Vec<_> = runs
            .map(|run| scope.spawn(move || run.iter().try_for_each(check_posts_chunk)))
            .collect();
        let mut results = vec![first.iter().try_for_each(check_posts_chunk)];
        results.extend(others.into_iter().map(|handle| {
            handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        }));
        results
    });
    // The runs are in file order, so the first error is the first bad chunk's.
    results.into_iter().collect()
}

/// Reads a snapshot and checks every checksum: its header and counts, or why it is invalid.
pub fn verify(input: impl Read) -> Result<(SnapshotHeader, SnapshotCounts), SnapshotError> {
    SnapshotReader::new(input)?.verify()
}

/// One verified chunk of a snapshot held in memory.
enum InPlace<'a> {
    Tombstones(Vec<(i64, i64)>),
    Facts(Vec<FactRecord>),
    /// A posts chunk where it lies, for the caller to check.
    Posts(UncheckedPosts<'a>),
    End,
}

impl<'a> SnapshotReader<&'a [u8]> {
    /// The next chunk where it lies (no copy of its payload), verified, but for a posts
    /// chunk: its checksum and records are left to the caller ([`check_posts_chunks`]).
    fn next_chunk_in_place(&mut self) -> Result<InPlace<'a>, SnapshotError> {
        if self.ended {
            return Ok(InPlace::End);
        }
        let mut head = [0u8; CHUNK_HEADER_BYTES];
        read_exact(&mut self.input, &mut head, "a chunk header (no end chunk)")?;
        let (kind, count, len) = self.chunk_head(&head)?;
        let input: &'a [u8] = self.input;
        let Some((payload, rest)) = input.split_at_checked(len as usize) else {
            return Err(SnapshotError::Truncated("a chunk"));
        };
        self.input = rest;
        let index = self.counts.chunks;
        Ok(
            match self.decode_chunk(kind, count, &head, payload, PostsInto::Unchecked)? {
                Chunk::Tombstones(chunk) => InPlace::Tombstones(chunk),
                Chunk::Facts(chunk) => InPlace::Facts(chunk),
                Chunk::PostsUnchecked => InPlace::Posts(UncheckedPosts {
                    index,
                    head,
                    records: payload,
                }),
                Chunk::End => InPlace::End,
                Chunk::Posts(_) | Chunk::PostsAppended | Chunk::PostsChecked => {
                    unreachable!("records read with PostsInto::Unchecked are left as they are")
                }
            },
        )
    }
}

/// The posts of a snapshot held in memory, decoded as they are read: the records of its
/// posts chunks, each chunk but the last holding `1 << shift` of them (as `write_snapshot`
/// writes them), from the `first`-th on.
pub(crate) struct MappedPosts<'a> {
    chunks: Vec<&'a [u8]>,
    shift: u32,
    first: usize,
    len: usize,
}

impl<'a> MappedPosts<'a> {
    /// The posts of `chunks` (checked records), or `None` when the chunks are not of one
    /// power-of-two size.
    fn new(chunks: &[&'a [u8]]) -> Option<Self> {
        let count = |records: &[u8]| records.len() / POST_BYTES;
        let shift = match chunks {
            [] => 0,
            [only] => count(only).next_power_of_two().trailing_zeros(),
            [full, middle @ .., last] => {
                let full = count(full);
                if !full.is_power_of_two()
                    || middle.iter().any(|c| count(c) != full)
                    || count(last) > full
                {
                    return None;
                }
                full.trailing_zeros()
            }
        };
        Some(Self {
            chunks: chunks.to_vec(),
            shift,
            first: 0,
            len: chunks.iter().map(|c| count(c)).sum(),
        })
    }

    #[inline]
    fn record(&self, index: usize) -> &'a [u8] {
        let at = self.first + index;
        let within = (at & ((1 << self.shift) - 1)) * POST_BYTES;
        &self.chunks[at >> self.shift][within..within + POST_BYTES]
    }

    /// Leaves out the first `n` posts (at most `len()`).
    fn skip(&mut self, n: usize) {
        let n = n.min(self.len);
        self.first += n;
        self.len -= n;
    }
}

impl PostSource for MappedPosts<'_> {
    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn post(&self, index: usize) -> CompactPost {
        debug_assert!(index < self.len, "post {index} of {}", self.len);
        decode_checked_post(self.record(index))
    }

    #[inline]
    fn post_ptr(&self, index: usize) -> *const u8 {
        self.record(index).as_ptr()
    }
}

/// What a load read and verified, before it builds.
struct ReadSnapshot {
    header: SnapshotHeader,
    counts: SnapshotCounts,
    tombstones: Vec<(i64, i64)>,
    facts: Vec<FactRecord>,
    /// Whether the store was fresh before anything was restored into it.
    fresh: bool,
    read_duration: Duration,
}

impl ReadSnapshot {
    /// What `reader` read, since `started`.
    fn new<R: Read>(
        reader: SnapshotReader<R>,
        tombstones: Vec<(i64, i64)>,
        facts: Vec<FactRecord>,
        fresh: bool,
        started: Instant,
    ) -> Self {
        Self {
            header: reader.header,
            counts: reader.counts,
            tombstones,
            facts,
            fresh,
            read_duration: started.elapsed(),
        }
    }

    /// The load's report: `restored` tombstones and facts, the build's inserts and per-post
    /// reason, of `total_posts` posts read (expired ones included), built since `building`.
    fn report(
        self,
        restored: (u64, u64),
        (inserts, per_post_reason): (InsertReport, Option<BulkRefusal>),
        total_posts: u64,
        building: Instant,
    ) -> LoadReport {
        let (tombstones_loaded, facts_loaded) = restored;
        LoadReport {
            posts_loaded: inserts.inserted as u64,
            posts_skipped: total_posts - inserts.inserted as u64,
            tombstones_loaded,
            tombstones_expired: self.tombstones.len() as u64 - tombstones_loaded,
            facts_loaded,
            facts_skipped: self.facts.len() as u64 - facts_loaded,
            inserts,
            per_post_reason,
            read_duration: self.read_duration,
            build_duration: building.elapsed(),
            header: self.header,
            counts: self.counts,
        }
    }
}

/// Refuses more posts than the build's `u32` ranks can number.
fn check_post_count(posts: usize) -> Result<(), SnapshotError> {
    if posts > u32::MAX as usize {
        return Err(SnapshotError::Incompatible(
            "more than 2^32 posts in one snapshot".into(),
        ));
    }
    Ok(())
}

/// The number of posts at the front of `posts` (in timeline order) that are `expired`.
fn first_unexpired<P: PostSource + ?Sized>(posts: &P, expired: impl Fn(u32) -> bool) -> usize {
    let (mut low, mut high) = (0, posts.len());
    while low < high {
        let mid = low + (high - low) / 2;
        if expired(posts.post(mid).created_at) {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    low
}

impl PostStore {
    /// Writes a snapshot of this store to `out` while it keeps serving (see the module docs).
    ///
    /// `meta.offsets` must have been taken *before* this call: they are what a loader replays
    /// from. Posts expired at the start of the scan are left out. The scan holds no lock and no
    /// epoch pin (every slot read is validated): no reader or writer waits for it. Besides
    /// its 2 MiB chunk buffer it holds 8 bytes per post while it runs, to write the posts in
    /// timeline order. `out` is written in chunks of at most 2 MiB; the caller does the
    /// buffering, `fsync` and renaming.
    pub fn write_snapshot(
        &self,
        meta: &SnapshotMeta,
        out: impl Write,
    ) -> Result<SnapshotSummary, SnapshotError> {
        let started = Instant::now();
        let now = self.now_secs();
        if self.directory.is_some() && self.shard_id().is_none() {
            return Err(SnapshotError::Incompatible(
                "an author shard built without its shard id (with_author_shard) cannot be snapshotted".into(),
            ));
        }
        let header = SnapshotHeader {
            format_version: FORMAT_VERSION,
            layout_hash: layout_hash(),
            retention_secs: self.retention_secs(),
            created_at_secs: now,
            meta: meta.clone(),
            shard: self.shard_id(),
        };
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
        let tombstones = self.live_tombstones(now);
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
            self.copy_facts(table, now, &mut facts);
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
        self.write_posts_in_timeline_order(now, &mut writer)?;
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
        &self,
        now: i64,
        writer: &mut ChunkWriter<W>,
    ) -> Result<(), SnapshotError> {
        let live = self.arena.live();
        let mut keys: Vec<u64> = Vec::with_capacity(live + live / 64 + 1024);
        for index in 0..self.arena.scan_chunks() {
            self.arena.scan_chunk(index, |slot, post| {
                if !self.expired(post.created_at, now) {
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
                crate::query::prefetch(self.arena.slot_ptr(ahead as SlotId));
            }
            if let Some(post) = self.arena.read_live(key as SlotId)
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

    /// Loads a snapshot into this store, which should be empty, on `threads` threads (at least
    /// one). Reads and verifies the whole stream first: on any error the store is untouched.
    /// Refuses a snapshot written with a shorter retention than this store's (it would lack
    /// posts this store keeps), and one written by another author shard, or by a shard when
    /// this is a full store or the other way round (its posts and facts would be the wrong
    /// ones). Expired posts, facts and tombstones are skipped.
    ///
    /// A store nothing was ever put in is built in bulk (`bulk.rs`), with the result the
    /// per-post insert path would give; any other store, or a snapshot the bulk build
    /// refuses, goes through the per-post path ([`LoadReport::per_post_reason`] says why).
    pub fn load_snapshot(
        &self,
        input: impl Read,
        threads: usize,
    ) -> Result<LoadReport, SnapshotError> {
        self.load_snapshot_with(input, threads, true, None)
    }

    /// [`load_snapshot`](Self::load_snapshot) of an input of `input_bytes` bytes (a file's
    /// length): the posts are read into one buffer sized from it, with no second copy.
    pub fn load_snapshot_sized(
        &self,
        input: impl Read,
        threads: usize,
        input_bytes: u64,
    ) -> Result<LoadReport, SnapshotError> {
        self.load_snapshot_with(input, threads, true, Some(input_bytes))
    }

    /// [`load_snapshot`](Self::load_snapshot), with `allow_bulk = false` rebuilding through
    /// the per-post insert path even into a fresh store (to compare the two), and the input's
    /// length when known (see [`load_snapshot_sized`](Self::load_snapshot_sized)).
    pub fn load_snapshot_with(
        &self,
        input: impl Read,
        threads: usize,
        allow_bulk: bool,
        input_bytes: Option<u64>,
    ) -> Result<LoadReport, SnapshotError> {
        let started = Instant::now();
        let mut reader = SnapshotReader::new(input)?;
        self.check_loadable(&reader.header)?;
        // Only a store nothing was ever put in can be built in bulk.
        let fresh = self.is_fresh();
        let mut tombstones = Vec::new();
        let mut facts = Vec::new();
        // The posts go into one allocation of their final size: growing a vector of a
        // gigabyte by doubling copies it again and faults in fresh pages each time. With the
        // input's length the buffer is reserved up front for as many posts as the input could
        // hold (pages more than 64 MiB beyond the posts read are never touched) and each
        // chunk is appended as it is read, its buffer reused for the next; without it the
        // chunks are kept and copied once at the end (also when the reservation is refused:
        // a length is only a hint, and no allocation failure should abort the process here).
        //
        // With more than one thread, another faults the reserved pages in ahead of the
        // decoding (the kernel clearing them was about half of the read phase). The vector
        // does not move meanwhile: chunks are appended to it only within its capacity, and
        // the scope ends before anything else changes it.
        let mut posts = Vec::new();
        if let Some(bytes) = input_bytes {
            let most = usize::try_from(bytes).unwrap_or(usize::MAX) / POST_BYTES;
            let _ = posts.try_reserve_exact(most);
        }
        let mut post_chunks = Vec::new();
        let region = (
            posts.as_ptr() as usize,
            posts.capacity() * size_of::<CompactPost>(),
        );
        let (written, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
        std::thread::scope(|scope| {
            if threads > 1 && region.1 > 0 {
                let (written, stop) = (&written, &stop);
                scope.spawn(move || {
                    crate::huge_memory::populate_ahead(region.0, region.1, written, stop)
                });
            }
            let read = (|| -> Result<(), SnapshotError> {
                loop {
                    // In file order: once a chunk did not fit, every later one waits too.
                    let into = post_chunks.is_empty().then_some(&mut posts);
                    match reader.next_chunk(PostsInto::Decoded(into))? {
                        Chunk::Tombstones(chunk) => tombstones.extend(chunk),
                        Chunk::Facts(chunk) => facts.extend(chunk),
                        Chunk::PostsAppended => {
                            // Relaxed: a progress hint for the populating thread.
                            let bytes = posts.len() * size_of::<CompactPost>();
                            written.store(bytes, Ordering::Relaxed);
                        }
                        Chunk::Posts(chunk) => post_chunks.push(chunk),
                        Chunk::PostsChecked | Chunk::PostsUnchecked | Chunk::End => return Ok(()),
                    }
                }
            })();
            stop.store(true, Ordering::Relaxed);
            read
        })?;
        if !post_chunks.is_empty() {
            posts.reserve_exact(post_chunks.iter().map(Vec::len).sum());
            for chunk in post_chunks {
                posts.extend(chunk);
            }
        }
        check_post_count(posts.len())?;
        let read = ReadSnapshot::new(reader, tombstones, facts, fresh, started);
        self.load_decoded(read, posts, threads, allow_bulk, Instant::now())
    }

    /// [`load_snapshot`](Self::load_snapshot) of a snapshot file, read in place through a
    /// read-only mapping of it ([`load_snapshot_in_place`](Self::load_snapshot_in_place)):
    /// the posts are not copied out of the file first (at 20M posts, 1.27 GB of memory the
    /// load does not take). When the file cannot be mapped it is read as a stream
    /// ([`load_snapshot_sized`](Self::load_snapshot_sized)).
    ///
    /// The file must not change while it loads: a snapshot file is written under a temporary
    /// name and renamed, never written in place, and a file truncated by another process
    /// meanwhile would end the process (`SIGBUS`) rather than fail the load.
    pub fn load_snapshot_file(
        &self,
        file: &std::fs::File,
        threads: usize,
    ) -> Result<LoadReport, SnapshotError> {
        // SAFETY: the mapping is read-only and lives until this call returns, and nothing
        // borrowed from it outlives the call (the store copies what it keeps). Snapshot files
        // are never written in place (see above); that the file stays as it is while it
        // loads is this function's documented requirement.
        let mapped = unsafe { memmap2::MmapOptions::new().map(file) };
        match mapped {
            Ok(map) => {
                // The first pass reads it front to back.
                let _ = map.advise(memmap2::Advice::Sequential);
                self.load_snapshot_in_place(&map, threads, true)
            }
            Err(_) => {
                let bytes = file.metadata()?.len();
                let input = io::BufReader::with_capacity(1 << 20, file);
                self.load_snapshot_sized(input, threads, bytes)
            }
        }
    }

    /// [`load_snapshot_with`](Self::load_snapshot_with) of a snapshot held whole in memory (a
    /// mapped file): every chunk is verified where it lies, and the posts are decoded as the
    /// build reads them, with no copy of their own. A file whose posts are not in timeline
    /// order (written before they were) or whose posts chunks are not of one size is decoded
    /// first, as a stream would be.
    pub fn load_snapshot_in_place(
        &self,
        bytes: &[u8],
        threads: usize,
        allow_bulk: bool,
    ) -> Result<LoadReport, SnapshotError> {
        let started = Instant::now();
        let mut reader = SnapshotReader::new(bytes)?;
        self.check_loadable(&reader.header)?;
        let fresh = self.is_fresh();
        let (mut tombstones, mut facts, mut unchecked) = (Vec::new(), Vec::new(), Vec::new());
        let threads = threads.max(1);
        loop {
            match reader.next_chunk_in_place() {
                Ok(InPlace::Tombstones(chunk)) => tombstones.extend(chunk),
                Ok(InPlace::Facts(chunk)) => facts.extend(chunk),
                Ok(InPlace::Posts(chunk)) => unchecked.push(chunk),
                Ok(InPlace::End) => break,
                Err(error) => {
                    // A bad posts chunk before this one is the first error, as in a stream.
                    check_posts_chunks(&unchecked, threads)?;
                    return Err(error);
                }
            }
        }
        check_posts_chunks(&unchecked, threads)?;
        let chunks: Vec<&[u8]> = unchecked.iter().map(|chunk| chunk.records).collect();
        let posts = MappedPosts::new(&chunks);
        check_post_count(
            chunks
                .iter()
                .map(|records| records.len() / POST_BYTES)
                .sum(),
        )?;
        let read = ReadSnapshot::new(reader, tombstones, facts, fresh, started);
        let building = Instant::now();
        match posts {
            Some(mut posts) if in_timeline_order_already(&posts, threads) => {
                let restored = self.restore_tombstones_and_facts(&read);
                // In timeline order the expired posts are the oldest: a prefix.
                let now = self.now_secs();
                let total_posts = posts.len() as u64;
                posts.skip(first_unexpired(&posts, |t| self.expired(t, now)));
                let count = posts.len() as u32;
                let built =
                    self.build_loaded(&read, &posts, threads, allow_bulk, |_| (0..count).collect());
                Ok(read.report(restored, built, total_posts, building))
            }
            _ => {
                let posts = chunks
                    .iter()
                    .flat_map(|records| records.chunks_exact(POST_BYTES))
                    .map(decode_checked_post)
                    .collect();
                self.load_decoded(read, posts, threads, allow_bulk, building)
            }
        }
    }

    /// Refuses a snapshot written with a shorter retention than this store's (it would lack
    /// posts this store keeps) or for another author shard.
    fn check_loadable(&self, header: &SnapshotHeader) -> Result<(), SnapshotError> {
        if header.retention_secs < self.retention_secs() {
            return Err(SnapshotError::Incompatible(format!(
                "written with a retention of {} s, shorter than this store's {} s",
                header.retention_secs,
                self.retention_secs()
            )));
        }
        check_shard(header.shard, self)
    }

    /// The build of a load whose posts were decoded into memory, which began at `building`:
    /// the expired posts dropped, the rest put in timeline order.
    fn load_decoded(
        &self,
        read: ReadSnapshot,
        mut posts: Vec<CompactPost>,
        threads: usize,
        allow_bulk: bool,
        building: Instant,
    ) -> Result<LoadReport, SnapshotError> {
        let restored = self.restore_tombstones_and_facts(&read);
        let now = self.now_secs();
        let total_posts = posts.len() as u64;
        posts.retain(|p| !self.expired(p.created_at, now));
        let threads = threads.max(1);
        let built = self.build_loaded(&read, &posts, threads, allow_bulk, |posts| {
            in_timeline_order(posts, threads)
        });
        Ok(read.report(restored, built, total_posts, building))
    }

    /// Restores the snapshot's live tombstones and its facts: how many of each.
    fn restore_tombstones_and_facts(&self, read: &ReadSnapshot) -> (u64, u64) {
        let g = self.guards();
        let mut tombstones_loaded = 0;
        for &(post_id, basis) in &read.tombstones {
            tombstones_loaded += u64::from(self.restore_tombstone(post_id, basis, &g));
        }
        let facts_loaded = self.restore_facts(&read.facts, &g) as u64;
        (tombstones_loaded, facts_loaded)
    }

    /// Builds the store from `posts` (all unexpired), in the order `order_of` gives them, in
    /// bulk when the store was fresh, else (or when the bulk build refuses) through the
    /// per-post path: its insert report, and why it took the per-post path.
    fn build_loaded<P: PostSource + ?Sized>(
        &self,
        read: &ReadSnapshot,
        posts: &P,
        threads: usize,
        allow_bulk: bool,
        order_of: impl FnOnce(&P) -> Vec<u32>,
    ) -> (InsertReport, Option<BulkRefusal>) {
        // Size the post index once for every post, rather than grow it ~20 times on the way
        // (each growth stops both loading threads to rehash); on another thread while this
        // one orders them, when there is one.
        let order = std::thread::scope(|scope| {
            let reserve = |posts: usize| self.posts.reserve(posts, &crossbeam_epoch::pin());
            if threads == 1 {
                reserve(posts.len());
                return order_of(posts);
            }
            let count = posts.len();
            let reserving = scope.spawn(move || reserve(count));
            let order = order_of(posts);
            if let Err(panic) = reserving.join() {
                std::panic::resume_unwind(panic);
            }
            order
        });
        // With a loading thread on every core, a chunk made ahead only takes a core from them.
        let every_core = threads >= std::thread::available_parallelism().map_or(1, |n| n.get());
        if every_core {
            self.arena.make_chunks_ahead(false);
        }
        let bulk = if !allow_bulk {
            Err(BulkRefusal::PerPostRequested)
        } else if read.fresh {
            self.bulk_load(posts, &order, threads)
        } else {
            Err(BulkRefusal::StoreNotEmpty)
        };
        let built = match bulk {
            Ok(inserts) => (inserts, None),
            Err(reason) => (self.load_per_post(posts, &order, threads), Some(reason)),
        };
        if every_core {
            self.arena.make_chunks_ahead(true);
        }
        built
    }

    /// Inserts `posts` through the ordinary insert path on `threads` threads, split by author,
    /// each in `order`.
    fn load_per_post<P: PostSource + ?Sized>(
        &self,
        posts: &P,
        order: &[u32],
        threads: usize,
    ) -> InsertReport {
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|worker| scope.spawn(move || self.load_share(posts, order, worker, threads)))
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_default())
                .fold(InsertReport::default(), |mut total, r| {
                    add_report(&mut total, r);
                    total
                })
        })
    }

    /// Inserts the posts of the authors that fall to `worker` (of `workers`), in `order`.
    fn load_share<P: PostSource + ?Sized>(
        &self,
        posts: &P,
        order: &[u32],
        worker: usize,
        workers: usize,
    ) -> InsertReport {
        const BATCH: usize = 4096;
        let mut report = InsertReport::default();
        let mut batch = Vec::with_capacity(BATCH);
        let mine = order
            .iter()
            .map(|&i| posts.post(i as usize))
            .filter(|p| author_share(p.author_id, workers) == worker);
        for post in mine {
            batch.push(post.to_light());
            if batch.len() == BATCH {
                add_report(&mut report, self.insert_posts(&batch));
                batch.clear();
            }
        }
        if !batch.is_empty() {
            add_report(&mut report, self.insert_posts(&batch));
        }
        report
    }
}

/// Refuses a snapshot written by another shard (or by a shard for a full store, or the other
/// way round) than `store` is.
pub fn check_shard(written_by: Option<ShardId>, store: &PostStore) -> Result<(), SnapshotError> {
    let shown = |shard: Option<ShardId>| match shard {
        Some(shard) => format!("author shard {shard}"),
        None => "a full store".to_owned(),
    };
    let this = store.shard_id();
    if written_by != this || (this.is_none() && store.directory.is_some()) {
        return Err(SnapshotError::Incompatible(format!(
            "written by {}, this store is {}",
            shown(written_by),
            if this.is_none() && store.directory.is_some() {
                "an author shard without a shard id".to_owned()
            } else {
                shown(this)
            }
        )));
    }
    Ok(())
}

fn add_report(total: &mut InsertReport, r: InsertReport) {
    total.inserted += r.inserted;
    total.invalid_time += r.invalid_time;
    total.in_future += r.in_future;
    total.too_old += r.too_old;
    total.tombstoned += r.tombstoned;
    total.duplicate += r.duplicate;
    total.no_slot += r.no_slot;
}

/// Which of `workers` loads an author's posts (one worker per author keeps each timeline's
/// appends in order).
fn author_share(author_id: i64, workers: usize) -> usize {
    ((author_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % workers
}

/// Indices of `posts` in timeline order: ascending `created_at`, then post id, file order among
/// equal ids (a snapshot holds each id once, but a fuzzy scan can see two copies). A counting
/// sort by time when the time span is small (it is at most the retention), a comparison sort
/// otherwise; then each run of equal timestamps is put in id order.
///
/// The counting sort runs on `threads` threads (at least one), each over its own range of
/// `posts`: each counts its range per second, the counts give every range its own place in
/// each second (ranges in file order, so equal keys keep file order), each scatters its range,
/// and then each puts the runs of a range of seconds in id order. Posts already in timeline
/// order, as `write_snapshot` writes them, are only checked (on the same threads).
pub(crate) fn in_timeline_order(posts: &[CompactPost], threads: usize) -> Vec<u32> {
    // Snapshots are written in this order: then there is nothing to sort.
    if in_timeline_order_already(posts, threads) {
        return (0..posts.len() as u32).collect();
    }
    let parts = threads.clamp(1, MAX_ORDER_THREADS);
    let per_part = posts.len().div_ceil(parts).max(1);
    let ranges: Vec<&[CompactPost]> = posts.chunks(per_part).collect();
    let bounds = on_each(&ranges, |range| {
        let times = range.iter().map(|p| p.created_at);
        times.clone().min().zip(times.max())
    });
    let Some((min, max)) = bounds
        .into_iter()
        .flatten()
        .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
    else {
        return Vec::new();
    };
    let span = (max - min) as usize + 1;
    if span > 1 << 24 {
        let mut order: Vec<u32> = (0..posts.len() as u32).collect();
        order.sort_by_key(|&i| (posts[i as usize].created_at, posts[i as usize].post_id));
        return order;
    }
    let mut starts = on_each(&ranges, |range| {
        let mut counts = vec![0u32; span];
        for p in *range {
            counts[(p.created_at - min) as usize] += 1;
        }
        counts
    });
    // Each range's first place in each second: after the earlier seconds, and after the
    // earlier ranges' posts of the same second.
    let mut at = 0u32;
    for second in 0..span {
        for counts in starts.iter_mut() {
            let count = counts[second];
            counts[second] = at;
            at += count;
        }
    }
    let mut order = Vec::with_capacity(posts.len());
    // The bulk build reads it back in random order.
    crate::huge_memory::advise_huge(&order);
    order.extend((0..posts.len()).map(|_| AtomicU32::new(0)));
    let mut scattering: Vec<(usize, Vec<u32>)> = starts
        .into_iter()
        .enumerate()
        .map(|(part, starts)| (part * per_part, starts))
        .collect();
    on_each(&mut scattering, |(first, starts)| {
        let first = *first;
        let range = &posts[first..posts.len().min(first + per_part)];
        for (i, p) in range.iter().enumerate() {
            let at = &mut starts[(p.created_at - min) as usize];
            // Relaxed: every range writes its own places; the join orders them for the reads.
            order[*at as usize].store((first + i) as u32, Ordering::Relaxed);
            *at += 1;
        }
    });
    // In place (the same layout): no second buffer.
    let mut order: Vec<u32> = order.into_iter().map(AtomicU32::into_inner).collect();
    // The runs of equal seconds, in ranges cut between seconds.
    let second = |i: u32| posts[i as usize].created_at;
    let mut runs = Vec::with_capacity(parts);
    let mut rest = order.as_mut_slice();
    for part in (1..=parts).rev() {
        let mut cut = rest.len() / part;
        while cut > 0 && cut < rest.len() && second(rest[cut]) == second(rest[cut - 1]) {
            cut += 1;
        }
        let (head, tail) = rest.split_at_mut(cut);
        runs.push(head);
        rest = tail;
    }
    on_each(&mut runs, |range| {
        let id = |i: &u32| posts[*i as usize].post_id;
        for run in range.chunk_by_mut(|a, b| second(*a) == second(*b)) {
            if run.len() > 1 && !run.is_sorted_by_key(id) {
                run.sort_by_key(id);
            }
        }
    });
    order
}

/// True when `posts` are in timeline order already (ascending `created_at`, then post id),
/// checked on `threads` threads (at least one), each over its own range of them.
pub(crate) fn in_timeline_order_already<P: PostSource + ?Sized>(posts: &P, threads: usize) -> bool {
    let len = posts.len();
    let parts = threads.clamp(1, MAX_ORDER_THREADS);
    let per_part = len.div_ceil(parts).max(1);
    let key = |i: usize| {
        let post = posts.post(i);
        (post.created_at, post.post_id)
    };
    // Each range checks each of its posts against the next one, the last against the first
    // of the next range.
    let ranges: Vec<std::ops::Range<usize>> = (0..len)
        .step_by(per_part)
        .map(|start| start..(start + per_part).min(len.saturating_sub(1)))
        .collect();
    on_each(ranges, |range| {
        if range.is_empty() {
            return true;
        }
        let mut previous = key(range.start);
        range.into_iter().all(|i| {
            let next = key(i + 1);
            let sorted = previous <= next;
            previous = next;
            sorted
        })
    })
    .into_iter()
    .all(|sorted| sorted)
}

/// At most this many threads order a load's posts.
const MAX_ORDER_THREADS: usize = 16;

/// `work` of each of `items`, the first on this thread and each other on a thread of its own;
/// the results in the items' order.
fn on_each<I, R>(items: I, work: impl Fn(I::Item) -> R + Sync) -> Vec<R>
where
    I: IntoIterator,
    I::Item: Send,
    R: Send,
{
    let mut items = items.into_iter();
    let Some(first) = items.next() else {
        return Vec::new();
    };
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = items.map(|item| scope.spawn(move || work(item))).collect();
        let mut results = vec![work(first)];
        results.extend(crate::bulk::join_all(handles));
        results
    })
}

/// A writer that keeps to at most `bytes_per_sec` on average by sleeping when ahead, so a
/// snapshot takes a bounded share of a core and of the disk while the store serves. Wrap the
/// stream given to [`PostStore::write_snapshot`] in it: the scan runs at the pace of the writes.
#[derive(Debug)]
pub struct Paced<W> {
    inner: W,
    bytes_per_sec: u64,
    started: Instant,
    written: u64,
}

impl<W: Write> Paced<W> {
    /// Paces `inner` to `bytes_per_sec` (0: no limit).
    pub fn new(inner: W, bytes_per_sec: u64) -> Self {
        Self {
            inner,
            bytes_per_sec,
            started: Instant::now(),
            written: 0,
        }
    }

    /// The wrapped writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Paced<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        if self.bytes_per_sec > 0 {
            let due = Duration::from_secs_f64(self.written as f64 / self.bytes_per_sec as f64);
            if let Some(ahead) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Lowers the calling thread's CPU priority (Linux `nice` 10; elsewhere nothing), for a thread
/// that writes snapshots: when the cores are busy, the scheduler prefers the threads that serve
/// queries and apply events. A thread cannot raise its priority back without privileges, so
/// call it on a thread of its own.
pub fn lower_current_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions and returns this thread's id.
        let tid = unsafe { libc::gettid() };
        // SAFETY: setpriority only reads its integer arguments; on Linux PRIO_PROCESS with a
        // thread id changes that thread alone. A failure leaves the priority as it was.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::post::LightPost;
    use std::sync::Arc;

    fn post(post_id: i64, created_at: i64) -> CompactPost {
        CompactPost::from_light(&LightPost::original(post_id, 1, created_at))
    }

    /// Deletes every `step`-th id from 1 to `last`, at `at`.
    fn delete_every(store: &PostStore, last: i64, step: usize, at: i64) {
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
    fn posts_of(bytes: &[u8]) -> Vec<CompactPost> {
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

    /// The reference order: a stable sort by (time, id), file order among equal ids.
    fn reference(posts: &[CompactPost]) -> Vec<u32> {
        let mut order: Vec<u32> = (0..posts.len() as u32).collect();
        order.sort_by_key(|&i| (posts[i as usize].created_at, posts[i as usize].post_id));
        order
    }

    /// On any number of threads, including more than there are posts: times repeated within
    /// and across the threads' ranges, ids out of order within a second and an id twice.
    #[test]
    fn timeline_order_is_the_same_on_any_number_of_threads() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut posts: Vec<CompactPost> = (0..5_000)
            .map(|_| {
                post(
                    (next() % 3_000) as i64,
                    1_700_000_000 + (next() % 40) as i64,
                )
            })
            .collect();
        posts.push(posts[17]);
        for threads in [1, 2, 3, 7, 16, 40] {
            assert_eq!(
                in_timeline_order(&posts, threads),
                reference(&posts),
                "{threads} threads"
            );
            assert_eq!(
                in_timeline_order(&posts[..3], threads),
                reference(&posts[..3])
            );
        }
        assert!(in_timeline_order(&[], 2).is_empty());
        // A span too wide for the counting sort.
        let wide = [post(5, 4_000_000_000), post(4, 1), post(3, 4_000_000_000)];
        assert_eq!(in_timeline_order(&wide, 2), vec![1, 2, 0]);
        // Already in order (as snapshots are written), a repeated key included: the identity,
        // whatever the threads; one pair out of order, at a range's edge or inside one, and
        // the sort runs again.
        let mut sorted: Vec<CompactPost> = reference(&posts)
            .into_iter()
            .map(|i| posts[i as usize])
            .collect();
        let identity: Vec<u32> = (0..sorted.len() as u32).collect();
        for threads in [1, 2, 3, 7, 16, 40] {
            assert_eq!(in_timeline_order(&sorted, threads), identity, "{threads}");
        }
        // (`div_ceil(2) - 1`: the pair across the two ranges of two threads.)
        for at in [
            0,
            sorted.len() / 2 - 1,
            sorted.len().div_ceil(2) - 1,
            sorted.len() / 3 + 5,
        ] {
            let mut swapped = sorted.clone();
            let (a, b) = (swapped[at], swapped[at + 1]);
            if (a.created_at, a.post_id) == (b.created_at, b.post_id) {
                continue;
            }
            swapped.swap(at, at + 1);
            for threads in [1, 2, 3] {
                assert_eq!(
                    in_timeline_order(&swapped, threads),
                    reference(&swapped),
                    "{at} {threads}"
                );
                assert_ne!(in_timeline_order(&swapped, threads), identity);
            }
        }
        sorted.clear();
        assert!(in_timeline_order(&sorted, 2).is_empty());
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
        let payload_byte =
            |chunk: usize, offset: usize| spans[chunk].1 + CHUNK_HEADER_BYTES + offset;
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
        let expired = first_unexpired(&skipped, |t| store.expired(t, NOW + 160));
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
            let held: Vec<_> = (0..=70_001).map(|id| loaded.lookup(id, &epoch)).collect();
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
}
