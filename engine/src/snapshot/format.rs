//! The snapshot format's constants, header, errors and byte codec: how a header, a post
//! record and a chunk's checksum are laid out (see the wing's doc for the whole format).

use std::io::Read;

use crate::arena::CompactPost;
pub use crate::file_header::{
    FORMAT_VERSION, MAGIC, PartitionOffset, SnapshotError, SnapshotHeader, SnapshotMeta,
};
pub(crate) use crate::file_header::{encode_header, read_exact};

/// Reads and checks a snapshot's or a base file's header: magic, version (2 or 3), checksum and
/// the layout hash of that version. Leaves `input` after the header. Returns the header and
/// its size in bytes.
pub fn read_header(input: &mut impl Read) -> Result<(SnapshotHeader, u64), SnapshotError> {
    crate::file_header::read_header_with(input, |version| match version {
        FORMAT_VERSION => Some(layout_hash()),
        crate::base::BASE_FORMAT_VERSION => Some(crate::base::base_layout_hash()),
        _ => None,
    })
}

/// The record layouts of this format version; its CRC32C is the header's layout hash, so a
/// build whose records differ refuses the file instead of misreading it.
pub const RECORD_LAYOUT: &str = "post(64): post_id i64, author_id i64, in_reply_to_post_id i64, \
     in_reply_to_user_id i64, source_post_id i64, source_user_id i64, conversation_id i64, \
     created_at u32, flags u8 (1 retweet, 2 reply, 4 video), 3 zero bytes; \
     tombstone(16): post_id i64, basis_secs i64; \
     fact(24): post_id i64, packed u64 (created_at u32, 1<<32 original, 1<<33 video source, \
     1<<34 has parent), parent_post_id i64; little-endian";

pub(super) const POST_BYTES: usize = 64;
pub(super) const TOMBSTONE_BYTES: usize = 16;
pub(super) const FACT_BYTES: usize = 24;
pub(super) const CHUNK_HEADER_BYTES: usize = 16;
pub(super) const END_PAYLOAD_BYTES: usize = 32;
/// Tombstones per chunk.
pub(super) const TOMBSTONES_PER_CHUNK: usize = 1 << 16;
/// Facts per chunk (1.5 MiB).
pub(super) const FACTS_PER_CHUNK: usize = 1 << 16;
/// Posts per posts chunk (2 MiB), the last one of a snapshot fewer.
pub(super) const POSTS_PER_CHUNK: usize = 1 << 15;
/// Largest record count a chunk may claim; bounds what a corrupt length can make us allocate.
pub(super) const MAX_CHUNK_RECORDS: u32 = 1 << 20;

pub(super) const KIND_TOMBSTONES: u8 = 1;
pub(super) const KIND_POSTS: u8 = 2;
pub(super) const KIND_FACTS: u8 = 3;
pub(super) const KIND_END: u8 = 0xEE;

const FLAG_RETWEET: u8 = 1;
const FLAG_REPLY: u8 = 2;
const FLAG_VIDEO: u8 = 4;

/// The CRC32C of [`RECORD_LAYOUT`].
pub fn layout_hash() -> u32 {
    crc32c::crc32c(RECORD_LAYOUT.as_bytes())
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

pub(super) fn le_i64(bytes: &[u8], at: usize) -> i64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    i64::from_le_bytes(word)
}

pub(super) fn encode_post(post: &CompactPost, buf: &mut Vec<u8>) {
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
pub(super) fn check_post(bytes: &[u8]) -> Result<(), SnapshotError> {
    let flags = bytes[60];
    if flags & !(FLAG_RETWEET | FLAG_REPLY | FLAG_VIDEO) != 0 || bytes[61..64] != [0, 0, 0] {
        return Err(SnapshotError::Corrupt(format!(
            "post record with unknown flags {flags:#04x}"
        )));
    }
    Ok(())
}

pub(super) fn decode_post(bytes: &[u8]) -> Result<CompactPost, SnapshotError> {
    check_post(bytes)?;
    Ok(decode_checked_post(bytes))
}

/// A post record [`check_post`] accepted.
#[inline]
pub(super) fn decode_checked_post(bytes: &[u8]) -> CompactPost {
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

/// Checks the CRC32C of the chunk `index` (its 16-byte header `head` and its payload).
pub(super) fn check_chunk_crc(
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
