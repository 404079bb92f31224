//! [`Base`]: a verified base file with its mutable state, and what the store asks of it: a
//! post's record if it is still stored, an author's runs as they stand, and the changes the
//! write path makes (a delete, a cap eviction, a trim), each keeping the file's timelines and
//! the state consistent the way the head's timelines and arena are kept.

use super::file::{BaseBytes, BaseFile, BasePages, map_file};
use super::format::*;
use super::state::{BaseState, RunState};
use super::verify;
use crate::arena::CompactPost;
use crate::file_header::{SnapshotError, SnapshotHeader};
use crate::report::StoreStats;

/// The originals, secondary and videos runs, in a line's order (and the records only the
/// videos run holds, `VIDEO_ONLY`, which are no timeline of their own).
pub(crate) const ORIGINALS: usize = 0;
pub(crate) const SECONDARY: usize = 1;
pub(crate) const VIDEOS: usize = 2;
pub(crate) use super::format::VIDEO_ONLY;

/// A base: the file and its state.
#[derive(Debug)]
pub(crate) struct Base {
    pub(crate) file: BaseFile,
    pub(crate) state: BaseState,
    /// Entries the file holds in runs of each kind.
    entries: [usize; 3],
    /// Authors the file holds.
    authors: usize,
}

/// One run of one author as it stands: where its entries are and which are live.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    /// Entries `0..end` are in the timeline unless gone (the rest were cut).
    pub(crate) end: usize,
    /// Entries in the timeline: `end` minus the gone ones before it.
    pub(crate) live: usize,
    /// Whether any entry before `end` can be gone (else none is checked).
    pub(crate) dirty: bool,
}

/// What a loaded base holds (`PostStore::base_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseInfo {
    /// The header the file was written with: when, for which topic, from which offsets.
    pub header: SnapshotHeader,
    /// Bytes of the file.
    pub bytes: u64,
    /// Bytes of memory the base holds besides a mapping of the file (a copy in huge pages,
    /// and the pages of its state that were touched at most).
    pub anonymous_bytes: u64,
    /// Posts the file holds.
    pub posts: u64,
    /// Of those, the posts still stored (not deleted, evicted or trimmed since).
    pub stored_posts: u64,
    /// Authors the file holds.
    pub authors: u64,
    /// Entries of the videos timelines the file holds.
    pub video_entries: u64,
    /// Tombstones the file holds.
    pub tombstones: u64,
    /// Reposts waiting for their source.
    pub waiting: u64,
    /// Facts of other shards' posts (author shards only).
    pub facts: u64,
}

impl Base {
    /// What the base holds now.
    pub(crate) fn info(&self) -> BaseInfo {
        BaseInfo {
            header: self.file.header.clone(),
            bytes: self.file.bytes.len() as u64,
            anonymous_bytes: (self.file.bytes.anonymous_bytes() + self.state.bytes()) as u64,
            posts: self.file.posts(),
            stored_posts: self.stored_posts() as u64,
            authors: self.authors as u64,
            video_entries: self.entries[VIDEOS] as u64,
            tombstones: self.file.footer.span(Section::Tombstones).count,
            waiting: self.file.footer.span(Section::Waiting).count,
            facts: self.file.footer.span(Section::Facts).count,
        }
    }

    /// Opens the base file in `bytes` for a store whose timelines hold at most `cap` entries,
    /// checking its checksums and structure on `threads` threads (`verify.rs`): safe to
    /// read from at once; [`check_records`](Self::check_records) checks the rest.
    pub(crate) fn open(
        bytes: BaseBytes,
        threads: usize,
        cap: usize,
    ) -> Result<Self, SnapshotError> {
        let file = verify::open(bytes, threads, cap)?;
        let granules = file.section(Section::Records).len() / GRANULE_BYTES;
        let state = BaseState::new(granules, file.lines);
        let (mut entries, mut authors) = ([0; 3], 0);
        for line in 0..file.lines {
            let line = file.line(line);
            authors += usize::from(line.used);
            for (kind, entries) in entries.iter_mut().enumerate() {
                *entries += usize::from(line.lens[kind]);
            }
        }
        Ok(Self {
            file,
            state,
            entries,
            authors,
        })
    }

    /// Checks every record of the file (`verify::check_records`) on `threads` threads, and
    /// notes the referenced posts whose embedded facts it could not confirm (they are looked
    /// up from then on). An error says the file cannot be trusted: it was made so on purpose,
    /// since its checksums hold.
    pub(crate) fn check_records(&self, threads: usize) -> Result<(), SnapshotError> {
        let findings = verify::check_records(&self.file, threads)?;
        for post_id in findings.unconfirmed {
            self.state.note_changed(post_id);
        }
        Ok(())
    }

    /// Authors the file holds.
    pub(crate) fn authors(&self) -> usize {
        self.authors
    }

    /// Posts the base still stores.
    pub(crate) fn stored_posts(&self) -> usize {
        self.file.posts() as usize - self.state.gone_posts()
    }

    /// Entries of run `kind` still in the timelines, over every author.
    pub(crate) fn live_entries(&self, kind: usize) -> usize {
        self.entries[kind] - self.state.left(kind)
    }

    // Lookups.

    /// Prefetches what a lookup of `author_id` reads first: its home line and the line after
    /// it (at a directory's load of 3/4, four authors in five are found in one of the two),
    /// and the word of the home line's dirty bit.
    #[inline]
    pub(crate) fn prefetch_home(&self, author_id: i64) {
        let home = self.file.home(author_id);
        crate::prefetch::prefetch(self.file.line_ptr(home));
        crate::prefetch::prefetch(self.file.line_ptr(home + 1));
        crate::prefetch::prefetch(self.state.dirty_ptr(home));
    }

    /// The line of `author_id`, if the base holds the author.
    #[inline]
    pub(crate) fn line_of(&self, author_id: i64) -> Option<usize> {
        self.file.find_line(author_id)
    }

    /// The record at `granule` of line `line`'s author.
    #[inline]
    pub(crate) fn record(&self, line: &Line, granule: u64) -> BaseRecord {
        decode_checked_record(self.file.record_bytes_at(granule), line.author_id)
    }

    /// `post_id`'s granule and record if the base still stores it (its author looked up from
    /// the granule: for a delete or a lookup from the head, not for the query's streams).
    pub(crate) fn stored(&self, post_id: i64) -> Option<(u64, BaseRecord)> {
        let granule = self.file.find_post(post_id)?;
        if self.state.is_gone(granule) {
            return None;
        }
        let line = self.file.line(self.file.line_of_granule(granule));
        Some((granule, self.record(&line, granule)))
    }

    /// Whether the base holds a record of `post_id` and still stores it (`Some(false)`: it
    /// held one, gone since).
    #[inline]
    pub(crate) fn find(&self, post_id: i64) -> Option<bool> {
        let granule = self.file.find_post(post_id)?;
        Some(!self.state.is_gone(granule))
    }

    /// Notes that what records embed of `post_id` may no longer hold (it is stored again, in
    /// the head, after it left the base).
    pub(crate) fn note_changed(&self, post_id: i64) {
        self.state.note_changed(post_id);
    }

    /// What records embed of `post_id` (its facts, as a parent or a source) still holds,
    /// unless it was noted as changed (deleted, evicted, stored again in the head, or not
    /// confirmed when the file was checked).
    #[inline]
    pub(crate) fn embedded_holds(&self, post_id: i64) -> bool {
        !self.state.may_have_changed(post_id)
    }

    /// Run `kind` of line `line` as it stands.
    #[inline]
    pub(crate) fn run(&self, line: usize, lens: &[u16; 4], kind: usize) -> Run {
        let len = usize::from(lens[kind]);
        if !self.state.is_dirty(line) {
            return Run {
                end: len,
                live: len,
                dirty: false,
            };
        }
        let state = self.state.run(line, kind);
        let end = len.saturating_sub(usize::from(state.cut));
        Run {
            end,
            live: end.saturating_sub(usize::from(state.removed)),
            dirty: true,
        }
    }

    /// The granule of entry `index` of run `kind` of `line`.
    #[inline]
    pub(crate) fn entry_granule(&self, line: &Line, kind: usize, index: usize) -> u64 {
        match kind {
            VIDEOS => self.file.video_ref(line.videos as usize + index),
            run => line.run_start(run) + index as u64 * line.stride(run),
        }
    }

    /// The record run (`ORIGINALS`, `SECONDARY` or `VIDEO_ONLY`) and index of the record at
    /// `granule` of `line`.
    fn locate(line: &Line, granule: u64) -> (usize, usize) {
        let run = if granule >= line.run_start(VIDEO_ONLY) {
            VIDEO_ONLY
        } else if granule >= line.run_start(SECONDARY) {
            SECONDARY
        } else {
            ORIGINALS
        };
        let index = (granule - line.run_start(run)) / line.stride(run).max(1);
        (run, index as usize)
    }

    /// The index of the record at `granule` (of key `key`) in `line`'s videos run, if there.
    fn video_index(&self, line: &Line, key: (u32, i64), granule: u64) -> Option<usize> {
        let (mut low, mut high) = (0, usize::from(line.lens[VIDEOS]));
        while low < high {
            let mid = low + (high - low) / 2;
            let at = self.entry_granule(line, VIDEOS, mid);
            let found = record_key(self.file.record_bytes_at(at));
            match key.cmp(&found) {
                std::cmp::Ordering::Equal => return (at == granule).then_some(mid),
                // Newest first: a larger key is earlier.
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Less => low = mid + 1,
            }
        }
        None
    }

    /// Whether entry `index` of run `kind` is inside the run's live part.
    fn inside(&self, line: usize, lens: &[u16; 4], kind: usize, index: usize) -> bool {
        index < usize::from(lens[kind]).saturating_sub(usize::from(self.state.run(line, kind).cut))
    }

    /// Whether the record at `granule` of `line` (of `key`) is still held by a timeline other
    /// than `kind`'s, whose entry of it is being cut.
    fn held_elsewhere(&self, at: usize, line: &Line, kind: usize, granule: u64) -> bool {
        let key = record_key(self.file.record_bytes_at(granule));
        if kind == VIDEOS {
            match Self::locate(line, granule) {
                (VIDEO_ONLY, _) => false,
                (primary, index) => self.inside(at, &line.lens, primary, index),
            }
        } else {
            self.video_index(line, key, granule)
                .is_some_and(|index| self.inside(at, &line.lens, VIDEOS, index))
        }
    }

    // Changes (the write path's; each under the line's lock).

    /// Deletes `post_id` from the base if it still stores it: its record gone, its entries out
    /// of every timeline. The removed post (for the delete's report and its tombstone).
    pub(crate) fn delete(&self, post_id: i64) -> Option<CompactPost> {
        let granule = self.file.find_post(post_id)?;
        if self.state.is_gone(granule) {
            return None;
        }
        let at = self.file.line_of_granule(granule);
        let line = self.file.line(at);
        let _lock = self.state.lock(at);
        if self.state.is_gone(granule) {
            return None;
        }
        let record = self.record(&line, granule).post;
        self.state.mark_dirty(at);
        let (primary, index) = Self::locate(&line, granule);
        let mut runs = Vec::with_capacity(2);
        if primary != VIDEO_ONLY {
            runs.push((primary, index));
        }
        if let Some(index) = self.video_index(&line, (record.created_at, post_id), granule) {
            runs.push((VIDEOS, index));
        }
        for (kind, index) in runs {
            if self.inside(at, &line.lens, kind, index) {
                let mut state = self.state.run(at, kind);
                state.removed += 1;
                self.state.set_run(at, kind, state);
            }
        }
        self.state.note_changed(post_id);
        self.state.set_gone(granule);
        Some(record)
    }

    /// Entries of run `kind` of line `at` still in the timeline.
    #[inline]
    pub(crate) fn live_len(&self, at: usize, kind: usize) -> usize {
        self.run(at, &self.file.line(at).lens, kind).live
    }

    /// Calls `each(line)` for every author the base holds whose id falls in trim shard
    /// `shard` (`author_id mod TRIM_FRACTION`).
    pub(crate) fn for_each_author_in(&self, shard: i64, mut each: impl FnMut(usize)) {
        let fraction = crate::config::TRIM_FRACTION as i64;
        for at in 0..self.file.lines {
            let line = self.file.line(at);
            if line.used && line.author_id.rem_euclid(fraction) == shard {
                each(at);
            }
        }
    }

    /// Notes that line `at`'s author left the store (a trim found its timelines empty):
    /// true the first time only, so that it is counted once.
    pub(crate) fn drop_author(&self, at: usize) -> bool {
        let _lock = self.state.lock(at);
        self.state.set_dropped(at)
    }

    /// Whether line `at`'s author left the store ([`drop_author`](Self::drop_author)).
    pub(crate) fn author_dropped(&self, at: usize) -> bool {
        self.state.is_dropped(at)
    }

    /// Adds the base's posts and entries to `stats` (and its authors, those not dropped),
    /// from the running counters.
    pub(crate) fn add_stats(&self, stats: &mut StoreStats) {
        stats.base_posts = self.stored_posts();
        stats.posts += stats.base_posts;
        stats.original_entries += self.live_entries(ORIGINALS);
        stats.secondary_entries += self.live_entries(SECONDARY);
        stats.video_entries += self.live_entries(VIDEOS);
        stats.base_bytes = self.file.bytes.len();
        stats.base_anonymous_bytes = self.file.bytes.anonymous_bytes() + self.state.bytes();
    }

    /// Adds the base's posts and entries to `stats` (whose counts are the head's), recounted
    /// from the state's bits and runs.
    pub(crate) fn add_recount(&self, stats: &mut StoreStats) {
        let (mut posts, mut entries) = (0, [0usize; 3]);
        for at in 0..self.file.lines {
            let line = self.file.line(at);
            for (kind, entries) in entries.iter_mut().enumerate() {
                let run = self.run(at, &line.lens, kind);
                *entries += (0..run.end)
                    .filter(|&i| {
                        !(run.dirty && self.state.is_gone(self.entry_granule(&line, kind, i)))
                    })
                    .count();
            }
            for run in [ORIGINALS, SECONDARY, VIDEO_ONLY] {
                for i in 0..usize::from(line.lens[run]) {
                    let granule = line.run_start(run) + i as u64 * line.stride(run);
                    posts += usize::from(!self.state.is_gone(granule));
                }
            }
        }
        stats.posts += posts;
        stats.base_posts = posts;
        stats.original_entries += entries[0];
        stats.secondary_entries += entries[1];
        stats.video_entries += entries[2];
    }

    /// The key of the oldest entry of run `kind` of `line` still in its timeline.
    pub(crate) fn oldest_live(&self, at: usize, kind: usize) -> Option<(u32, i64)> {
        let line = self.file.line(at);
        let run = self.run(at, &line.lens, kind);
        (0..run.end).rev().find_map(|index| {
            let granule = self.entry_granule(&line, kind, index);
            (!(run.dirty && self.state.is_gone(granule)))
                .then(|| record_key(self.file.record_bytes_at(granule)))
        })
    }

    /// Cuts the oldest entries of run `kind` of line `at` while `cut(key)` says so (the cap's
    /// eviction of one entry, or a trim of the expired ones): gone entries on the way are
    /// passed over, a record no timeline holds any more becomes gone. `(entries cut, records
    /// freed)`, gone entries not counted, nor records `held_in_head` says the head still
    /// holds. Takes the line's lock.
    pub(crate) fn cut_oldest(
        &self,
        at: usize,
        kind: usize,
        mut cut: impl FnMut((u32, i64)) -> bool,
        held_in_head: impl Fn(i64) -> bool,
    ) -> (usize, usize) {
        let line = self.file.line(at);
        let _lock = self.state.lock(at);
        let mut state: RunState = self.state.run(at, kind);
        let (mut entries, mut freed) = (0, 0);
        let mut marked = false;
        loop {
            let end = usize::from(line.lens[kind]).saturating_sub(usize::from(state.cut));
            let Some(index) = end.checked_sub(1) else {
                break;
            };
            let granule = self.entry_granule(&line, kind, index);
            let gone = self.state.is_gone(granule);
            let key = record_key(self.file.record_bytes_at(granule));
            if !gone && !cut(key) {
                break;
            }
            if !marked {
                self.state.mark_dirty(at);
                marked = true;
            }
            state.cut += 1;
            if gone {
                state.removed = state.removed.saturating_sub(1);
                self.state.set_run(at, kind, state);
                continue;
            }
            self.state.set_run(at, kind, state);
            entries += 1;
            if !self.held_elsewhere(at, &line, kind, granule) {
                self.state.note_changed(key.1);
                self.state.set_gone(granule);
                freed += usize::from(!held_in_head(key.1));
            }
        }
        (entries, freed)
    }
}

/// Checks the base file `file` whole (checksums, structure, every record; mapped, on
/// `threads` threads), without a store: what it holds, or why it would be refused. Its runs are
/// checked against the largest timeline cap a store takes.
pub fn verify_file(file: &std::fs::File, threads: usize) -> Result<BaseInfo, SnapshotError> {
    let bytes = map_file(file, &BasePages::Mapped)?;
    let base = Base::open(bytes, threads, crate::timeline::MAX_CAPACITY)?;
    base.check_records(threads)?;
    Ok(base.info())
}

#[cfg(all(test, thunder_loom))]
mod loom_models {
    use super::*;
    use crate::base::file::BaseBytes;
    use crate::base::write::{AuthorRuns, BaseWriter};
    use crate::file_header::{SnapshotHeader, SnapshotMeta};
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering};

    const AUTHOR: i64 = 3;

    /// A base of one author with three originals (ids 1, 2, 3, newest last), 2 also a video.
    fn file() -> Vec<u8> {
        let record = |post_id: i64| BaseRecord {
            post: CompactPost {
                post_id,
                author_id: AUTHOR,
                created_at: 100 + post_id as u32,
                in_reply_to_post_id: 0,
                in_reply_to_user_id: 0,
                source_post_id: 0,
                source_user_id: 0,
                conversation_id: 0,
                is_retweet: false,
                is_reply: false,
                has_video: post_id == 2,
            },
            parent: None,
            source: None,
        };
        let header = SnapshotHeader {
            format_version: BASE_FORMAT_VERSION,
            layout_hash: base_layout_hash(),
            retention_secs: 1000,
            created_at_secs: 200,
            meta: SnapshotMeta::default(),
            shard: None,
        };
        let runs = AuthorRuns {
            originals: vec![record(3), record(2), record(1)],
            secondary: Vec::new(),
            videos: vec![record(2)],
        };
        let mut bytes = Vec::new();
        let mut writer = BaseWriter::start(&mut bytes, &header).unwrap();
        writer.tombstones(&[]).unwrap();
        writer.waiting(&[]).unwrap();
        writer.facts(|_| false).unwrap();
        writer.place_authors(&[AUTHOR], 3);
        for (line, _) in writer.author_order() {
            writer.author(line, &runs).unwrap();
        }
        writer.finish(16).unwrap();
        bytes
    }

    /// What a query reads of the author's run `kind`: the ids it meets, and the live count.
    fn read(base: &Base, kind: usize) -> (Vec<i64>, usize) {
        let at = base.line_of(AUTHOR).unwrap();
        let line = base.file.line(at);
        let (run, live, _) = base.open_run(at, &line, kind);
        let ids = (0..usize::from(run.end))
            .filter_map(|index| base.entry(&run, index))
            .map(|entry| entry.post_id)
            .collect();
        (ids, live)
    }

    /// A delete of a base post racing a query of its author: a query that starts after the
    /// delete returned (it sees the delete's flag) never meets the post, in either timeline,
    /// and counts one entry less; any query meets the other posts.
    #[test]
    fn loom_delete_racing_a_query() {
        let bytes = file();
        loom::model(move || {
            let base = Arc::new(Base::open(BaseBytes::copy_of(&bytes), 1, 16).unwrap());
            let deleted = Arc::new(AtomicBool::new(false));
            let delete = {
                let (base, deleted) = (base.clone(), deleted.clone());
                loom::thread::spawn(move || {
                    assert!(base.delete(2).is_some());
                    deleted.store(true, Ordering::Release);
                })
            };
            let after = deleted.load(Ordering::Acquire);
            let (originals, live) = read(&base, ORIGINALS);
            let (videos, videos_live) = read(&base, VIDEOS);
            assert!(originals.contains(&3) && originals.contains(&1));
            if after {
                assert_eq!((originals, live), (vec![3, 1], 2));
                assert_eq!((videos, videos_live), (vec![], 0));
            }
            delete.join().unwrap();
            assert_eq!(read(&base, ORIGINALS), (vec![3, 1], 2));
            assert_eq!(base.stored_posts(), 2);
        });
    }

    /// A delete and a cap eviction of the same author at once (each under the line's lock),
    /// with a query reading meanwhile: whatever the order, the oldest original (1) is evicted,
    /// the deleted post (2) is gone from both timelines, and the counts agree with the runs.
    #[test]
    fn loom_delete_racing_an_eviction() {
        let bytes = file();
        loom::model(move || {
            let base = Arc::new(Base::open(BaseBytes::copy_of(&bytes), 1, 16).unwrap());
            let at = base.line_of(AUTHOR).unwrap();
            let delete = {
                let base = base.clone();
                loom::thread::spawn(move || base.delete(2).is_some())
            };
            let evict = {
                let base = base.clone();
                loom::thread::spawn(move || {
                    let mut first = true;
                    base.cut_oldest(at, ORIGINALS, |_| std::mem::take(&mut first), |_| false)
                })
            };
            let (seen, _) = read(&base, ORIGINALS);
            assert!(seen.contains(&3), "{seen:?}");
            assert!(delete.join().unwrap());
            let (entries, _) = evict.join().unwrap();
            assert_eq!(entries, 1);
            assert_eq!(read(&base, ORIGINALS), (vec![3], 1));
            assert_eq!(read(&base, VIDEOS), (vec![], 0));
            assert_eq!(base.stored_posts(), 1);
        });
    }
}
