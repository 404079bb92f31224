//! thunder-testkit: what tests, benchmarks, fuzzers, the demo and the CLI producer need besides
//! the store itself.
//!
//! - [`model`]: `ModelStore`, a plain, obviously-correct model of the engine's `PostStore`
//!   written from `engine/BEHAVIOUR.md`, and `answers_agree`, the comparison of two answers
//!   the property tests and fuzzers use.
//! - [`process`]: server processes started on free loopback ports (started again on new
//!   ports when a port was taken before the process bound it).
//! - [`query`]: `OwnedQuery`, a generated query that owns its lists and asks any `Store`.
//! - [`synth`]: the deterministic "feed-2d" workload (authors, posts, replies, reposts,
//!   videos, deletes, viewers) that drives the demo server, the producer and the benchmarks.
//!
//! The engine crate holds the store alone; nothing here is on a query's or an insert's path.
#![deny(missing_docs)]

pub mod model;
pub mod process;
pub mod query;
pub mod synth;
