//! thunder-engine: the in-memory store of recent posts per author behind the in-network feed.
//!
//! (Crate docs are completed with the implementation.)
#![deny(missing_docs)]

pub mod clock;
pub mod config;
pub mod post;
mod store;
#[cfg(feature = "synth")]
pub mod synth;

pub use clock::{Clock, ManualClock, SystemClock};
pub use post::{DeleteEvent, LightPost};
pub use store::{StoreConfig, DeleteReport, FeedQuery, InsertReport, PostStore, QueryOutcome, StoreStats, TrimReport};
