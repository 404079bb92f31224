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
//! into a store of the same shard ([`PostStore::with_author_shard`](crate::PostStore::with_author_shard)), and a full store's only
//! into a full store.
//!
//! # Loading
//! [`PostStore::load_snapshot`](crate::PostStore::load_snapshot) reads and verifies the whole stream *before* it touches the
//! store, so a corrupt or truncated file leaves the store empty and nothing partial is ever
//! served. Then it restores the live tombstones and the facts, and rebuilds the store from the
//! unexpired posts on several threads: a fresh store in bulk (`bulk.rs`: grouped by author,
//! each record published and indexed once, each timeline built whole), with the result the
//! ordinary insert path gives when it inserts the posts in `created_at` order; any other store,
//! or a snapshot the bulk build refuses, through that insert path, split by author.
//!
//! A stream's posts are decoded into one buffer before the build. A file is read in place
//! instead ([`PostStore::load_snapshot_file`](crate::PostStore::load_snapshot_file), through a read-only mapping): every chunk is
//! verified where it lies, and the build decodes each post from its record when it reads it,
//! so the load takes no memory for the posts beyond the store's own (the file's pages are the
//! kernel's page cache). That needs the posts in timeline order, as this build writes them
//! (the expired ones are then a prefix, skipped), in chunks of one power-of-two size; a file
//! written otherwise is decoded first, as a stream is.

mod format;
mod load;
mod mapped;
mod order;
mod reader;
#[cfg(test)]
mod tests;
mod write;

pub use crate::bulk::BulkRefusal;
pub use format::{
    FORMAT_VERSION, MAGIC, PartitionOffset, RECORD_LAYOUT, SnapshotCounts, SnapshotError,
    SnapshotHeader, SnapshotMeta, layout_hash, read_header,
};
pub use load::LoadReport;
pub(crate) use load::{check_loadable, check_shard, load_file, load_in_place, load_stream};
/// For `bulk.rs`'s tests, which build from posts in this order.
#[cfg(test)]
pub(crate) use order::in_timeline_order;
pub use reader::{SnapshotReader, verify};
pub use write::SnapshotSummary;
pub(crate) use write::{header_for, write_snapshot};
