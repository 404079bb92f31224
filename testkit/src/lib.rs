//! thunder-testkit: what tests, benchmarks and fuzzers need besides the store itself.
//!
//! - [`model`]: `ModelStore`, a plain, obviously-correct model of the engine's `PostStore`
//!   written from `engine/BEHAVIOUR.md`, and `answers_agree`, the comparison of two answers
//!   the property tests and fuzzers use.
//! - [`process`]: server processes started on free loopback ports (started again on new
//!   ports when a port was taken before the process bound it).
//!
//! The deterministic "feed-2d" workload generator is the crate thunder-workload: the demo
//! server and `thunder-cli produce` use it too, and link it without this crate.
//!
//! The engine crate holds the store alone; nothing here is on a query's or an insert's path.
#![deny(missing_docs)]

pub mod model;
pub mod process;
