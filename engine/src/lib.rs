//! thunder-engine: the in-memory store of recent posts per author behind the in-network feed.
#![deny(missing_docs)]

pub mod clock;
pub mod config;
pub mod model;
pub mod post;

mod arena;
mod query;
mod store;
#[cfg(feature = "synth")]
pub mod synth;
mod timeline;

pub use clock::{Clock, ManualClock, SystemClock};
pub use post::{DeleteEvent, LightPost};
pub use store::{
    DeleteReport, FeedQuery, InsertReport, PostStore, QueryOutcome, StoreConfig, StoreStats,
    TrimReport,
};
