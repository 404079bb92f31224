//! The streamed reader: a snapshot's chunks read one at a time from any `Read`, each checked
//! against its checksum and the format's limits, and [`verify`], which reads a whole stream.

use std::io::Read;

use super::format::*;
use crate::arena::CompactPost;
use crate::directory::{FactRecord, fact_record_is_valid};

/// One verified chunk.
pub(super) enum Chunk {
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
pub(super) enum PostsInto<'v> {
    /// Decodes them, onto the end of this vector when it has room for them without growing,
    /// else into a chunk of their own.
    Decoded(Option<&'v mut Vec<CompactPost>>),
    /// Checks them and leaves them where they are (a mapped file, or only verifying).
    Checked,
    /// Leaves them where they are, their checksum and records unchecked: the caller checks
    /// them with [`check_posts_chunk`](super::mapped::check_posts_chunk) before it uses them (a mapped file, checked in parallel).
    Unchecked,
}

/// Reads a snapshot's chunks one at a time, verifying each.
pub struct SnapshotReader<R: Read> {
    pub(super) input: R,
    pub(super) header: SnapshotHeader,
    pub(super) counts: SnapshotCounts,
    pub(super) ended: bool,
    /// The chunk being read, its buffer reused from one chunk to the next.
    pub(super) payload: Vec<u8>,
}

impl<R: Read> SnapshotReader<R> {
    /// Reads and checks the header (see [`read_header`]).
    pub fn new(mut input: R) -> Result<Self, SnapshotError> {
        let (header, bytes) = read_header(&mut input)?;
        if header.format_version != FORMAT_VERSION {
            return Err(SnapshotError::Incompatible(format!(
                "a base file (format version {}): it is mapped (`PostStore::load_base_file`), \
                 not read as chunks",
                header.format_version
            )));
        }
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
    pub(super) fn next_chunk(&mut self, posts_into: PostsInto<'_>) -> Result<Chunk, SnapshotError> {
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
    pub(super) fn chunk_head(
        &self,
        head: &[u8; CHUNK_HEADER_BYTES],
    ) -> Result<(u8, u32, u32), SnapshotError> {
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
    pub(super) fn decode_chunk(
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

/// Reads a snapshot and checks every checksum: its header and counts, or why it is invalid.
pub fn verify(input: impl Read) -> Result<(SnapshotHeader, SnapshotCounts), SnapshotError> {
    SnapshotReader::new(input)?.verify()
}
