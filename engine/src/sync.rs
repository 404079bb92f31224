//! The atomics the arena and timeline protocols are written against: `std`'s in every normal
//! build, loom's under `RUSTFLAGS="--cfg thunder_loom"`, so the loom models next to that code
//! explore every interleaving and every weak-memory outcome of the real functions (tokio's
//! `crate::loom` facade is the model for this). The cfg has the crate's own name, not `loom`,
//! because dependencies such as tokio change shape under a plain `--cfg loom`.
//!
//! Outside `cfg(thunder_loom)` this is a plain re-export: no wrapper, no cost. Under loom the
//! atomics only work inside `loom::model`, so a `--cfg thunder_loom` build is for running the
//! models alone:
//!
//! ```text
//! RUSTFLAGS="--cfg thunder_loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p thunder-engine --release --lib loom
//! ```

/// `std::sync::atomic`, or loom's model of it under `cfg(thunder_loom)`.
#[cfg(not(thunder_loom))]
pub(crate) mod atomic {
    pub(crate) use std::sync::atomic::*;
}

/// `std::sync::atomic`, or loom's model of it under `cfg(thunder_loom)`.
#[cfg(thunder_loom)]
pub(crate) mod atomic {
    pub(crate) use loom::sync::atomic::*;
}

/// `std::sync::Mutex`, or loom's model of it under `cfg(thunder_loom)`.
#[cfg(not(thunder_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// `std::sync::Mutex`, or loom's model of it under `cfg(thunder_loom)`.
#[cfg(thunder_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
