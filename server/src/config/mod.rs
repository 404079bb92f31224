//! Configuration: the command-line flags and what is checked about them before serving. It
//! sits on the top floor: the flags become every wing's options, the lifecycle's included.
//!
//! # Files
//! - `flags.rs`: [`Args`], every flag of `thunder-server` (each also read from a `THUNDER_*`
//!   variable), and its translation into the [`crate::ServerOptions`] of a run. The Kafka flags
//!   are [`crate::kafka::KafkaArgs`], the snapshot flags [`crate::snapshot::SnapshotArgs`],
//!   flattened into it.
//! - `check.rs`: `thunder-server --check-config` ([`check::run`]): every problem a
//!   configuration has that can be found without serving, and the effective configuration with
//!   its secrets masked.

pub mod check;
pub(crate) mod flags;

pub use flags::{Args, LogFormat};
