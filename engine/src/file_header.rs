//! The header every snapshot and base file begins with: magic, format version, layout hash,
//! the writing store's retention and clock, the source and its Kafka offsets, the author shard,
//! under a checksum; and the error type of both formats. The formats themselves are
//! `crate::snapshot` (version 2) and `crate::base` (version 3), above this module: each tells
//! [`read_header_with`] the layout hash it reads.

use std::io::{self, Read};

use crate::shard::ShardId;

/// The first eight bytes of every snapshot and base file.
pub const MAGIC: [u8; 8] = *b"THUNDSNP";
/// The format version of a snapshot the bulk build loads (`crate::snapshot`).
pub const FORMAT_VERSION: u32 = 2;
/// The format version of a base file (`crate::base`), mapped and served as it lies.
pub const BASE_FORMAT_VERSION: u32 = 3;
/// Largest header body a file may claim.
const MAX_HEADER_BODY: u32 = 1 << 20;

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
    #[error(
        "format version {found}, this build reads versions {FORMAT_VERSION} and {}",
        BASE_FORMAT_VERSION
    )]
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
pub(crate) fn read_exact(
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

/// Encodes `header` as a file begins with it: magic, version, body length, body, CRC32C.
pub(crate) fn encode_header(header: &SnapshotHeader) -> Result<Vec<u8>, SnapshotError> {
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

/// Reads and checks a snapshot's or a base file's header: magic, version, checksum and the
/// layout hash `expected_layout` gives for that version (`None`: a version the caller does not
/// read). Leaves `input` after the header. Returns the header and its size in bytes.
pub(crate) fn read_header_with(
    input: &mut impl Read,
    expected_layout: impl Fn(u32) -> Option<u32>,
) -> Result<(SnapshotHeader, u64), SnapshotError> {
    let mut fixed = [0u8; 16];
    read_exact(input, &mut fixed, "the header")?;
    if fixed[..8] != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let mut word = [0u8; 4];
    word.copy_from_slice(&fixed[8..12]);
    let format_version = u32::from_le_bytes(word);
    let Some(expected_layout) = expected_layout(format_version) else {
        return Err(SnapshotError::UnsupportedVersion {
            found: format_version,
        });
    };
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
    if layout != expected_layout {
        return Err(SnapshotError::LayoutMismatch {
            found: layout,
            expected: expected_layout,
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
