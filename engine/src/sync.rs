//! The atomics the arena and timeline protocols are written against: `std`'s in every normal
//! build, loom's under `RUSTFLAGS="--cfg loom"`, so the loom models next to that code explore
//! every interleaving and every weak-memory outcome of the real functions (tokio's
//! `crate::loom` facade is the model for this).
//!
//! Outside `cfg(loom)` this is a plain re-export: no wrapper, no cost. Under loom the atomics
//! only work inside `loom::model`, so a `--cfg loom` build is for running the models alone:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p thunder-engine --release --lib loom
//! ```

/// `std::sync::atomic`, or loom's model of it under `cfg(loom)`.
#[cfg(not(loom))]
pub(crate) mod atomic {
    pub(crate) use std::sync::atomic::*;
}

/// `std::sync::atomic`, or loom's model of it under `cfg(loom)`.
#[cfg(loom)]
pub(crate) mod atomic {
    pub(crate) use loom::sync::atomic::*;
}
