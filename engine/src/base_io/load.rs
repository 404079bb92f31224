//! Loading a base file under a fresh store: the file opened whole (`crate::base`'s `verify.rs`), then its
//! tombstones, waiting reposts and facts restored into the head's tables; the base itself is
//! used where it lies.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::base::{
    BASE_FORMAT_VERSION, Base, BaseBytes, BasePages, FACT_BYTES, Section, TOMBSTONE_BYTES,
    WAITING_BYTES, le_i64, le_u32, le_u64, map_file,
};
use crate::directory::FactRecord;
use crate::file_header::{SnapshotError, SnapshotHeader};
use crate::tables::StoreTables;
use crate::waiting::PendingRepost;

/// What loading a base file did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseLoadReport {
    /// The header read.
    pub header: SnapshotHeader,
    /// Bytes of the file.
    pub bytes: u64,
    /// Posts the base holds.
    pub posts: u64,
    /// Authors the base holds.
    pub authors: u64,
    /// Tombstones restored, and skipped because they expired since the file was written.
    pub tombstones_loaded: u64,
    /// Tombstones skipped as expired.
    pub tombstones_expired: u64,
    /// Reposts restored as waiting for their source (the unexpired ones).
    pub waiting_loaded: u64,
    /// Facts restored into the fact directory (author shards), and skipped.
    pub facts_loaded: u64,
    /// Facts skipped: expired since the file was written (or dropped by a tombstone).
    pub facts_skipped: u64,
    /// Bytes of anonymous memory the base's pages take (0 when mapped: page cache).
    pub anonymous_bytes: u64,
    /// Time spent mapping (or copying) the file.
    pub map_duration: Duration,
    /// Time spent checking it (checksums and structure).
    pub verify_duration: Duration,
    /// Time spent restoring tombstones, waiting reposts and facts.
    pub restore_duration: Duration,
}

/// Refuses a base for the store of `tables` before anything is read past its header: the
/// store must be fresh, and the file loadable as a snapshot would be (retention, shard).
pub(crate) fn check_loadable(
    tables: &StoreTables,
    header: &SnapshotHeader,
) -> Result<(), SnapshotError> {
    if header.format_version != BASE_FORMAT_VERSION {
        return Err(SnapshotError::Incompatible(format!(
            "format version {}, not a base file",
            header.format_version
        )));
    }
    if !tables.is_fresh() {
        return Err(SnapshotError::Incompatible(
            "a base loads only under a store nothing was put in".into(),
        ));
    }
    crate::snapshot::check_loadable(tables, header)
}

/// Opens the base file in `bytes` for the store of `tables` and restores its small sections
/// into the tables: the base, to be attached under them, and the report. On any error the
/// tables are untouched.
pub(crate) fn open_for(
    tables: &StoreTables,
    bytes: BaseBytes,
    threads: usize,
    map_duration: Duration,
) -> Result<(Base, BaseLoadReport), SnapshotError> {
    let started = Instant::now();
    check_loadable(tables, &crate::base::header_of(&bytes)?)?;
    let anonymous_bytes = bytes.anonymous_bytes() as u64;
    let base = Base::open(bytes, threads, tables.authors.cap())?;
    let verify_duration = started.elapsed();
    let restoring = Instant::now();
    let (tombstones, _) = base
        .file
        .section(Section::Tombstones)
        .as_chunks::<TOMBSTONE_BYTES>();
    let tombstones_loaded = tables.restore_tombstones(
        tombstones,
        |tombstone| (le_i64(tombstone, 0), le_i64(tombstone, 8)),
        threads,
    );
    let g = tables.guards();
    let mut waiting: HashMap<i64, Vec<PendingRepost>> = HashMap::new();
    let mut waiting_loaded = 0u64;
    for entry in base
        .file
        .section(Section::Waiting)
        .chunks_exact(WAITING_BYTES)
    {
        let repost = PendingRepost {
            post_id: le_i64(entry, 8),
            author_id: le_i64(entry, 16),
            created_at: le_u32(entry, 24),
        };
        if !tables.retention.expired(repost.created_at, g.now) {
            waiting.entry(le_i64(entry, 0)).or_default().push(repost);
            waiting_loaded += 1;
        }
    }
    for (source, reposts) in waiting {
        tables.waiting.set(source, reposts, &g);
    }
    let facts: Vec<FactRecord> = base
        .file
        .section(Section::Facts)
        .chunks_exact(FACT_BYTES)
        .map(|f| (le_i64(f, 0), le_u64(f, 8), le_i64(f, 16)))
        .collect();
    let facts_loaded = tables.restore_facts(&facts, &g) as u64;
    let footer = &base.file.footer;
    let report = BaseLoadReport {
        header: base.file.header.clone(),
        bytes: base.file.bytes.len() as u64,
        posts: base.file.posts(),
        authors: base.authors() as u64,
        tombstones_loaded,
        tombstones_expired: footer.span(Section::Tombstones).count - tombstones_loaded,
        waiting_loaded,
        facts_loaded,
        facts_skipped: facts.len() as u64 - facts_loaded,
        anonymous_bytes,
        map_duration,
        verify_duration,
        restore_duration: restoring.elapsed(),
    };
    Ok((base, report))
}

/// Loads the base file `file` under the fresh store of `tables` (`PostStore::load_base_file`).
pub(crate) fn load_file(
    tables: &StoreTables,
    file: &std::fs::File,
    threads: usize,
    pages: BasePages,
) -> Result<BaseLoadReport, SnapshotError> {
    let started = Instant::now();
    let bytes = map_file(file, &pages)?;
    attach(tables, bytes, threads, started.elapsed())
}

/// Loads the base file in `bytes` (copied) under the fresh store of `tables`.
pub(crate) fn load_bytes(
    tables: &StoreTables,
    bytes: &[u8],
    threads: usize,
) -> Result<BaseLoadReport, SnapshotError> {
    let started = Instant::now();
    let bytes = BaseBytes::copy_of(bytes);
    attach(tables, bytes, threads, started.elapsed())
}

/// Opens `bytes` for the store of `tables` ([`open_for`]) and puts the base under it.
fn attach(
    tables: &StoreTables,
    bytes: BaseBytes,
    threads: usize,
    map_duration: Duration,
) -> Result<BaseLoadReport, SnapshotError> {
    let (base, report) = open_for(tables, bytes, threads, map_duration)?;
    tables
        .base
        .set(base)
        .map_err(|_| SnapshotError::Incompatible("this store has a base already".into()))?;
    Ok(report)
}
