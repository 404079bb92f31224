//! The base: an immutable, read-optimized tier of the store, written as a file (snapshot
//! format version 3) and mapped read-only at start-up, under the live store (the *head*,
//! everything after the base's Kafka offsets). A restart maps the newest base instead of
//! rebuilding the store from it, and a query reads each author's base runs and head timelines
//! as one timeline per kind.
//!
//! # Format (version 3, little-endian)
//! - Header: the snapshot header (`snapshot/format.rs`: magic, version 3, the layout hash of
//!   [`BASE_LAYOUT`], retention, creation time, source, Kafka offsets, author shard), zero
//!   padding to a 64-byte boundary.
//! - Sections, each on a 64-byte boundary of the file, zero padding between them:
//!   1. tombstones (16 bytes each: `post_id`, basis secs);
//!   2. waiting reposts (32 bytes each: source id, repost id, author id, `created_at`, 4 zero);
//!   3. facts of other shards' posts (24 bytes each, as in version 2; author shards only);
//!   4. records: every author's originals run, then its secondary (replies and reposts) run,
//!      each newest first (`created_at`, then post id, descending) and of one stride per run
//!      (a multiple of 8 bytes, the granule a record is addressed by). A record holds what an
//!      answer and the query rules need: `post_id`, `created_at`, flags, the optional ids
//!      that are set (a conversation id equal to the post's own is a flag), and, for a reply
//!      whose parent or a repost whose source was stored when the file was written, that
//!      post's `created_at` and the one fact the rule reads (parent original; parent's
//!      `in_reply_to_post_id` equal to the reply's conversation; source a non-reply video),
//!      so that the reply and videos rules need no lookup while that post has not changed;
//!   5. videos references: per author, newest first, the granule of each of its videos
//!      timeline's records (a video post is stored once, in its primary run);
//!   6. directory: an open-addressing table (linear probing from a fixed hash of the author
//!      id) of 64-byte lines, one cache line per author: the id, where its runs start, each
//!      run's length, the strides, and each run's newest `(created_at, post_id)`, so that a
//!      query ranks the author's runs and counts `eligible` from that one line. Authors'
//!      records are written in line order, so a record's author is found by a binary search
//!      over the lines' record offsets;
//!   7. post index: 64-byte buckets of eight `tag << 32 | granule` words (linear probing from
//!      a fixed hash of the post id; the record's own id verifies a hit).
//! - Footer: each section's offset, bytes and count, the writer's timeline cap, a CRC32C of
//!   every 1 MiB block of the file before the footer, then a tail: the footer's length, its
//!   CRC32C and the magic `THUNDBAS`. Every byte of the file is covered by a checksum.
//!
//! The byte layout is [`BASE_LAYOUT`]; a change to it changes the header's layout hash, and a
//! build refuses a file of another layout.
//!
//! # Opening
//! In two steps (`verify.rs`). Opening checks every block against its checksum on all the
//! load's threads, then every structure the store reads without checking again (sections in
//! bounds, every directory line against its runs, the lines tiling the records), so that no
//! read leaves the file or panics whatever it holds; a file that fails is refused with the
//! reason, and nothing of it is used. That reads the directory, not the records: a store
//! serves from the file at once. Checking the records (`PostStore::check_base`, about a
//! second of CPU at 20M posts, which the server runs beside the serving store) reads every
//! record: each valid, of its run's kind and in order, every record found by the post index
//! and the index holding nothing else, and the facts a record embeds of its parent or source
//! compared with that record; a reference to a post the file does not hold (it left the store
//! while the file was written) is noted, and the store looks that post up instead. A file
//! whose checksums hold and whose records do not was made so on purpose.
//!
//! # Files
//! - `format.rs`: constants, the layout string, the record, line and footer codecs, hashes;
//! - `write.rs`: the writer (the sections in order, the runs streamed in directory order);
//! - `file.rs`: the loaded file's bytes (mapped, or copied into huge pages) and its lookups;
//! - `verify.rs`: opening a file: checksums and structure;
//! - `state.rs`: what changed since the file was written (gone records, cut runs);
//! - `read.rs`: what a query reads of a base (an author's runs as they stand, their entries);
//! - `tier.rs`: `Base`, file and state together, and the changes the write
//!   path makes; a file checked whole without a store;
//! - `contents.rs`: a file decoded whole into plain values (what a model store is built from).
//!
//! Writing a store as a base and loading one under a store reach the store's tables, a floor
//! below which this tier sits: they are `crate::base_io`.

mod contents;
mod file;
mod format;
mod read;
mod state;
mod tier;
mod verify;
mod write;

#[cfg(all(test, not(thunder_loom)))]
mod tests;

pub(crate) use format::{
    BaseRecord, Embedded, FACT_BYTES, Line, Section, TOMBSTONE_BYTES, WAITING_BYTES, le_i64,
    le_u32, le_u64,
};
pub(crate) use read::RunCursor;
pub(crate) use tier::Base;
pub(crate) use verify::header_of;
pub(crate) use write::{AuthorRuns, BaseWriter};

pub use contents::{BaseContents, decode_contents};
pub use file::BasePages;
pub(crate) use file::{BaseBytes, map_file};
pub use format::{BASE_FORMAT_VERSION, BASE_LAYOUT, base_layout_hash};
pub use tier::{BaseInfo, verify_file};

pub use write::BaseCounts;
