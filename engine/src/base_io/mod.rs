//! A store and its base files: a store written as a base file, the head and the base under
//! it merged per author (`from_store.rs`), and a base file opened under a fresh store, its
//! tombstones, waiting reposts and facts restored into the head's tables (`load.rs`). The
//! file's format and the tier a query reads are `crate::base`, below the tables; these two
//! paths reach the tables, and sit above them.

mod from_store;
mod load;

pub use from_store::BaseSummary;
pub(crate) use from_store::write_base;
pub use load::BaseLoadReport;
pub(crate) use load::{load_bytes, load_file};
