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
//! [`PostStore`] is one type whose `impl` blocks are split by concern; each file imports
//! `store.rs`, which imports none of them but `directory.rs` (a shard's fact directory is one
//! of its fields):
//! - `store.rs`: the type, its construction, inserts, deletes, trims and stats;
//! - `query.rs`: the read path (`get_all_posts_by_users`, `get_videos_by_users`);
//! - `directory.rs`: the author shard (`with_author_shard`) and its fact directory;
//! - `bulk.rs`: the bulk build of a fresh store from a snapshot's posts;
//! - `snapshot/write.rs` and `snapshot/load.rs`: writing a snapshot and loading one;
//! - `contract.rs`: the [`Store`] trait the tests run against every store.
//!
//! Helpers several of them need (`prefetch.rs`, `arena.rs`, `timeline.rs`, `index.rs`) are
//! leaves below them.
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
mod authors;
mod bulk;
mod counter;
mod directory;
mod huge_memory;
mod index;
mod prefetch;
mod query;
pub mod snapshot;
mod store;
mod sync;
mod timeline;
mod tombstone_filter;

pub use clock::{Clock, ManualClock, SystemClock};
pub use contract::Store;
pub use directory::{DirectoryStats, FACT_SHARDS, ShardId};
pub use page::{AnswerWindow, PagePosition};
pub use post::{DeleteEvent, EventBatch, LightPost, PostEvent};
pub use query::{FeedQuery, QueryOutcome};
pub use seen::SeenFilter;
pub use store::{
    DeleteReport, DropReason, InsertReport, PostStore, StoreConfig, StoreStats, TrimReport,
};

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
