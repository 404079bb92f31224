//! What a query reads of a base: an author's run as it stands now ([`RunCursor`], a few words
//! the query keeps per stream), its entries newest first with the gone ones passed over, and
//! what the reply and videos rules can take from a record's embedded facts without a lookup.

use super::format::*;
use super::tier::{Base, VIDEOS};

/// One run of one author as a query reads it: copied out of the directory line and the run's
/// state when the query ranks the author, so that reading on needs neither again.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RunCursor {
    /// The run's first granule (records), or its first videos reference.
    start: u32,
    /// Stride in granules; 0 for the videos run (its entries are references).
    stride: u8,
    /// Entries `0..end` may be in the timeline (the rest were cut).
    pub(crate) end: u16,
    /// Some entry before `end` may be gone: each is checked.
    dirty: bool,
}

/// A base entry a query reads: its key and where its record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BaseEntry {
    pub(crate) created_at: u32,
    pub(crate) post_id: i64,
    pub(crate) granule: u64,
}

impl Base {
    /// Run `kind` (`ORIGINALS`, `SECONDARY` or `VIDEOS`) of line `at` (`line`) as it stands:
    /// its cursor, how many entries its timeline holds (for `eligible` and the cap) and its
    /// newest entry's key (the line's, unless entries are gone or cut: then the newest left).
    #[inline]
    pub(crate) fn open_run(
        &self,
        at: usize,
        line: &Line,
        kind: usize,
    ) -> (RunCursor, usize, (u32, i64)) {
        let run = self.run(at, &line.lens, kind);
        let (start, stride) = if kind == VIDEOS {
            (line.videos, 0)
        } else {
            (line.run_start(kind) as u32, line.stride(kind) as u8)
        };
        let cursor = RunCursor {
            start,
            stride,
            end: run.end as u16,
            dirty: run.dirty,
        };
        let newest = if run.dirty {
            (0..run.end)
                .find_map(|index| self.entry(&cursor, index))
                .map_or((0, 0), |entry| (entry.created_at, entry.post_id))
        } else {
            line.newest[kind]
        };
        (cursor, run.live, newest)
    }

    /// The granule of entry `index` of `run`.
    #[inline]
    fn run_granule(&self, run: &RunCursor, index: usize) -> u64 {
        if run.stride == 0 {
            self.file.video_ref(run.start as usize + index)
        } else {
            u64::from(run.start) + index as u64 * u64::from(run.stride)
        }
    }

    /// Entry `index` of `run` (below `run.end`), unless it is gone.
    #[inline]
    pub(crate) fn entry(&self, run: &RunCursor, index: usize) -> Option<BaseEntry> {
        let granule = self.run_granule(run, index);
        if run.dirty && self.state.is_gone(granule) {
            return None;
        }
        let (created_at, post_id) = record_key(self.file.record_bytes_at(granule));
        Some(BaseEntry {
            created_at,
            post_id,
            granule,
        })
    }

    /// The address of the record at `granule` (for a prefetch).
    #[inline]
    pub(crate) fn record_ptr(&self, granule: u64) -> *const u8 {
        self.file.record_bytes_at(granule).as_ptr()
    }

    /// The address of `run`'s first entry: its record, or its videos reference (for a
    /// prefetch).
    #[inline]
    pub(crate) fn first_ptr(&self, run: &RunCursor) -> *const u8 {
        if run.stride == 0 {
            self.file.section(Section::Videos)[run.start as usize * 4..].as_ptr()
        } else {
            self.record_ptr(u64::from(run.start))
        }
    }

    /// The record of `author_id` at `granule`, answer-ready.
    #[inline]
    pub(crate) fn read(&self, author_id: i64, granule: u64) -> BaseRecord {
        decode_checked_record(self.file.record_bytes_at(granule), author_id)
    }
}
