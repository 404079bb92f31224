//! thunder-engine: the in-memory store of recent posts per author behind the in-network feed.
//!
//! It keeps the last `retention` seconds (two days by default) of every author's posts and
//! answers one question fast: "the newest posts of these authors, minus those already seen".
//! No tokio, no networking: pure data structures and the reference service's rules.
//!
//! # Usage
//! ```
//! use thunder_engine::{DeleteEvent, FeedQuery, LightPost, PostStore};
//!
//! let store = PostStore::new(2 * 24 * 60 * 60);
//! let now = store.now_secs();
//! store.insert_posts(&[LightPost::original(1, 10, now - 60), LightPost::original(2, 11, now)]);
//! store.mark_as_deleted(&[DeleteEvent { post_id: 1, deleted_at: now }]);
//!
//! let answer = store.get_all_posts_by_users(&FeedQuery::new(42, &[10, 11]));
//! assert_eq!(answer.posts.iter().map(|p| p.post_id).collect::<Vec<_>>(), vec![2]);
//! ```
//! A server calls [`PostStore::trim`] every couple of minutes over the `TRIM_FRACTION` shards
//! to hand memory back; queries never depend on it.
//!
//! # Layout
//! - Post records ([`LightPost`] packed into a `CompactPost`) live in slots of a slab arena
//!   (32 bytes for a post without reply or source ids, 64 for the rest) allocated in 2 MiB
//!   chunks (huge pages where the kernel allows). A freed slot is retired through
//!   crossbeam-epoch and reused only after every reader pinned at the time has gone; each slot
//!   carries a sequence number and its post id, and every read is validated against both, so
//!   a reader can never return a different post than the one it looked up.
//! - `post_id -> slot` is a key-less tag index (`index.rs`: inline `tag | slot` words, verified
//!   against the record); `author -> timelines` is the same index over one-line author records
//!   (`authors.rs`). Tombstones and reposts awaiting their source are papaya maps.
//! - Each author has three timelines (originals, replies+reposts, videos): ring buffers of
//!   16-byte `TinyPost {post_id, created_at, slot}` ordered by `created_at`, growing from 4
//!   entries up to the cap (`MAX_POSTING_LIST_SIZE`) and shrinking after trims.
//!
//! # Files
//! [`PostStore`] (`store.rs`) is a thin public face over private tables: each of its methods
//! calls the part that does the work, and no part reads the face's field or calls it back.
//! - `store.rs`: [`PostStore`] and [`StoreConfig`], the face;
//! - `tables.rs`: `StoreTables`, the tables each behind its owner, and the orderings that span
//!   two of them (publish, then check the tombstones; tombstone, then remove; wait for a
//!   source, then look; entries out, then records released); the owners: `posts.rs` (the
//!   record arena and the post index), `authors.rs` (the authors and their timelines),
//!   `tombstones.rs` (the tombstones and their filter), `waiting.rs` (the reposts that wait
//!   for their source), `directory.rs` (below); `guards.rs` (the pins one call holds),
//!   `retention.rs` (the expiry rule);
//! - `write.rs`: the write path (insert, delete, trim and their reference rules);
//! - `query.rs`: the read path (the newest-first merge), generic over an observer
//!   (`observe.rs`: the hooks every rule's decision goes through; the serving path's are
//!   empty); `explain.rs`: [`PostStore::explain`], each post's [`Verdict`] from the query run
//!   with an observer that keeps them; `feed_query.rs`: what a query asks ([`FeedQuery`],
//!   [`OwnedQuery`], the one per-author clamp [`PerAuthorLimits`]) and what it answers
//!   ([`QueryOutcome`]);
//! - `snapshot/`, one concept a file: `mod.rs` the format's doc, `format.rs` constants,
//!   header, errors, record codec and CRC32C, `reader.rs` the streamed reader and verify,
//!   `mapped.rs` the in-place reader of a mapped file, `order.rs` timeline order and the thread
//!   fan-out, `write.rs` the writer, `load.rs` the load (verify everything, then restore and
//!   build); `bulk.rs`: the load's bulk build of a fresh store (equal to the insert path's);
//! - `directory.rs`: `FactDirectory`, an author shard's facts of other shards' posts, with its
//!   own methods (it knows nothing of the store; `tables.rs` calls it); `shard.rs`: [`ShardId`];
//! - `report.rs`: what the calls report ([`InsertReport`], [`StoreStats`], ...);
//! - `contract.rs`: the [`Store`] trait every store (engine, model, baseline) implements;
//! - leaves below them: `arena.rs` (record slots), `index.rs` (the tag index),
//!   `author_index.rs` (author records and their timelines), `timeline.rs` (the rings),
//!   `tombstone_filter.rs`, `counter.rs` (per-thread counters), `huge_memory.rs` (huge-page
//!   mappings), `prefetch.rs`, `sync.rs` (the atomics shim the loom models plug into);
//! - value types: `post.rs` ([`LightPost`] and the events), `page.rs` (answer order, page
//!   positions, time bounds), `seen.rs` ([`SeenFilter`]), `clock.rs`, `config.rs` (the
//!   reference's constants); `BEHAVIOUR.md`: the exact rules.
//!
//! # Consistency
//! Readers take no lock and never wait: they pin, read one consistent buffer per timeline and
//! validate every record they return. Writers serialise per author (a mutex per author), never
//! globally. A query that runs while posts are inserted or deleted may or may not see them;
//! it never sees a deleted post after the delete returned, a half-written record, or a post
//! older than the retention window.
//!
//! # Performance
//! A query merges the requested timelines newest first through a heap and stops at
//! `max_results`, so its work follows the size of the answer, not of the authors' histories;
//! timeline entries carry the record's slot (no hash lookup per entry), a timeline's ring is
//! read only when the merge reaches it (ranking uses the newest timestamp published next to
//! the buffer pointer), and buffers and records are prefetched ahead of use. Query scratch comes from a per-thread
//! bumpalo arena that is reset between queries.
//!
//! The exact rules, and every deliberate difference from the reference, are in [`behaviour`].
#![deny(missing_docs)]

/// The store's exact behaviour and its deliberate differences from the reference.
#[doc = include_str!("../BEHAVIOUR.md")]
pub mod behaviour {}

pub mod clock;
pub mod config;
mod contract;
pub mod page;
pub mod post;
pub mod seen;

mod arena;
mod author_index;
mod authors;
pub mod base;
pub mod base_io;
mod bulk;
mod counter;
mod directory;
mod explain;
mod feed_query;
mod file_header;
mod guards;
mod huge_memory;
mod index;
mod observe;
mod parallel;
mod posts;
mod prefetch;
mod query;
mod report;
mod retention;
mod shard;
pub mod snapshot;
mod store;
mod sync;
mod tables;
mod timeline;
mod tombstone_filter;
mod tombstones;
mod waiting;
mod write;

pub use clock::{Clock, ManualClock, SystemClock};
pub use contract::Store;
pub use directory::FACT_SHARDS;
pub use explain::{Explanation, PostExplanation, PostState, TimelineKind, TimelinePlace, Verdict};
pub use feed_query::{FeedQuery, OwnedQuery, PerAuthorLimits, QueryOutcome};
pub use observe::ReplyRuleMiss;
pub use page::{AnswerWindow, PagePosition};
pub use post::{DeleteEvent, EventBatch, LightPost, PostEvent};
pub use report::{DeleteReport, DirectoryStats, DropReason, InsertReport, StoreStats, TrimReport};
pub use seen::SeenFilter;
pub use shard::ShardId;
pub use store::{PostStore, StoreConfig};

/// The post index on its own, for `benches/src/bin/index_compare.rs`, which measures it
/// against general concurrent maps; and the query's walk switch, for `compare --walks`, which
/// measures the merge's walks side by side, and the model test, which checks they agree. Not
/// part of the store's interface.
#[doc(hidden)]
pub mod bench_internals {
    pub use crate::index::{Hashed, TagIndex};
    pub use crate::prefetch::prefetch;
    pub use crate::query::{Walk, set_walk};
    pub use crossbeam_epoch::{Guard, pin};
}
