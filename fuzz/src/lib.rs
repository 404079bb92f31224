//! Shared pieces of thunder's fuzz targets.
//!
//! - [`ops`]: the operation language of the `ingest_ordering*` targets (creates, deletes,
//!   duplicates, clock moves, trims, queries), decoded with `arbitrary` and mapped into small id
//!   ranges so that collisions, deletes before creates and reply/repost references are common.
//! - [`invariants`]: what every query answer must satisfy, whatever the interleaving.
//! - [`differential`]: runs operations against `PostStore` and `ModelStore` (one shared
//!   `ManualClock`), sequentially or with two writer threads, and panics on the first
//!   disagreement or broken invariant.
//!
//! A panic is how a target reports a finding: libFuzzer's panic hook aborts the process, which
//! records the input under `fuzz/artifacts/<target>/`.

pub mod differential;
pub mod invariants;
pub mod ops;
