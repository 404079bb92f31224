//! thunder-testkit: what tests, benchmarks and fuzzers need besides the store itself.
//!
//! - [`model`]: `ModelStore`, a plain, obviously-correct model of the engine's `PostStore`
//!   written from `engine/BEHAVIOUR.md`, and `answers_agree`, the comparison of two answers
//!   the property tests and fuzzers use.
//!
//! The deterministic "feed-2d" workload generator is the crate thunder-workload: the demo
//! server and `thunder-cli produce` use it too, and link it without this crate.
//!
//! The engine crate holds the store alone; nothing here is on a query's or an insert's path.
//! What the server's tests run against (servers, the Kafka test broker) is thunder-testbed.
#![deny(missing_docs)]

pub mod model;
