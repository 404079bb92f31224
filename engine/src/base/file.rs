//! A loaded base file: its bytes (a read-only mapping of the file, or a copy in huge-page
//! memory), where its sections lie, and the lookups the store makes in it: an author's
//! directory line, a post's record, a record's author. Everything here reads a file that
//! `verify.rs` accepted.

use super::format::*;
use crate::file_header::{SnapshotError, SnapshotHeader};

/// How a base file's bytes are held while the store uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BasePages {
    /// A read-only shared mapping of the file: its pages are the kernel's page cache (4 KiB
    /// pages), shared with any other process that maps it, and nothing is copied at load.
    Mapped,
    /// The file copied into anonymous memory advised onto 2 MiB huge pages: fewer TLB misses
    /// on the query's random reads, at the price of a copy (fresh memory) at load.
    HugeCopy,
}

/// The bytes of a base file.
pub(crate) enum BaseBytes {
    Mapped(memmap2::Mmap),
    /// A copy in anonymous memory from `huge_memory::allocate_zeroed` (`len` bytes used).
    #[cfg_attr(thunder_loom, allow(dead_code))]
    Anonymous {
        start: std::ptr::NonNull<u8>,
        len: usize,
        layout: std::alloc::Layout,
    },
    /// Held in a vector of words (8-byte aligned), for bytes given in memory.
    Owned(Vec<u64>, usize),
}

// SAFETY: `Anonymous` owns its region exclusively and only hands out shared byte slices of
// it (never written after the copy), as `Owned` owns its vector.
unsafe impl Send for BaseBytes {}
// SAFETY: as above: shared access is read-only.
unsafe impl Sync for BaseBytes {}

impl BaseBytes {
    /// `bytes` copied into an 8-byte aligned buffer of their own.
    pub(crate) fn copy_of(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut full = [0u8; 8];
            full[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(full);
        }
        Self::Owned(words, bytes.len())
    }

    /// `bytes` copied into fresh anonymous memory advised onto huge pages; `None` when no
    /// such memory can be had (always under loom, whose builds map no memory).
    #[cfg(thunder_loom)]
    pub(crate) fn huge_copy_of(_bytes: &[u8]) -> Option<Self> {
        None
    }

    /// `bytes` copied into fresh anonymous memory advised onto huge pages; `None` when no
    /// such memory can be had.
    #[cfg(not(thunder_loom))]
    pub(crate) fn huge_copy_of(bytes: &[u8]) -> Option<Self> {
        const HUGE: usize = 2 << 20;
        let layout =
            std::alloc::Layout::from_size_align(bytes.len().max(1).next_multiple_of(HUGE), HUGE)
                .ok()?;
        let start = std::ptr::NonNull::new(crate::huge_memory::allocate_zeroed(layout)?)?;
        // SAFETY: the region is `layout.size() >= bytes.len()` bytes, freshly mapped and ours
        // alone, and does not overlap `bytes`.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), start.as_ptr(), bytes.len());
        }
        Some(Self::Anonymous {
            start,
            len: bytes.len(),
            layout,
        })
    }

    /// Bytes of memory the process holds for this copy (0 for a mapping: those pages are
    /// the page cache's).
    pub(crate) fn anonymous_bytes(&self) -> usize {
        match self {
            Self::Mapped(_) => 0,
            Self::Anonymous { layout, .. } => layout.size(),
            Self::Owned(words, _) => words.len() * 8,
        }
    }
}

impl std::ops::Deref for BaseBytes {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            Self::Mapped(map) => map,
            // SAFETY: the region holds `len` initialised bytes (copied in at construction)
            // and lives until `self` is dropped.
            Self::Anonymous { start, len, .. } => unsafe {
                std::slice::from_raw_parts(start.as_ptr(), *len)
            },
            // SAFETY: the vector holds `words.len() * 8 >= len` initialised bytes; a `u64`
            // slice reads as bytes.
            Self::Owned(words, len) => unsafe {
                std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), *len)
            },
        }
    }
}

impl Drop for BaseBytes {
    fn drop(&mut self) {
        #[cfg(not(thunder_loom))]
        if let Self::Anonymous { start, layout, .. } = self {
            // SAFETY: the region came from `allocate_zeroed` with this layout, and `&mut self`
            // means no slice of it is left.
            unsafe { crate::huge_memory::free(start.as_ptr(), *layout) };
        }
    }
}

/// A verified base file and where its sections lie.
pub(crate) struct BaseFile {
    pub(crate) bytes: BaseBytes,
    /// `bytes`' address and length, read once: a query's every read of the file starts from
    /// them, rather than from `bytes`' variants.
    data: *const u8,
    len: usize,
    pub(crate) header: SnapshotHeader,
    pub(crate) footer: Footer,
    /// Byte ranges of the sections, as `(start, len)`.
    pub(crate) spans: [(usize, usize); 7],
    /// Directory lines and index buckets.
    pub(crate) lines: usize,
    pub(crate) buckets: usize,
}

impl std::fmt::Debug for BaseFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaseFile")
            .field("bytes", &self.bytes.len())
            .field("lines", &self.lines)
            .finish_non_exhaustive()
    }
}

// SAFETY: `data` points into `bytes`, which the file owns and never changes: shared access is
// read-only, as `BaseBytes`' own.
unsafe impl Send for BaseFile {}
// SAFETY: as above.
unsafe impl Sync for BaseFile {}

impl BaseFile {
    /// The file of `bytes`, its sections at `spans` (as verified), with `lines` directory
    /// lines and `buckets` index buckets.
    pub(crate) fn new(
        bytes: BaseBytes,
        header: SnapshotHeader,
        footer: Footer,
        spans: [(usize, usize); 7],
        lines: usize,
        buckets: usize,
    ) -> Self {
        let (data, len) = (bytes.as_ptr(), bytes.len());
        Self {
            bytes,
            data,
            len,
            header,
            footer,
            spans,
            lines,
            buckets,
        }
    }

    /// The whole file.
    #[inline(always)]
    fn all(&self) -> &[u8] {
        // SAFETY: `data` and `len` are `bytes`' own (see `new`), whose memory neither moves
        // (a mapping, a region or a vector's heap buffer, none of them touched again) nor
        // changes while `self` lives.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    /// The bytes of `section`.
    #[inline]
    pub(crate) fn section(&self, section: Section) -> &[u8] {
        let (start, len) = self.spans[section as usize];
        &self.all()[start..start + len]
    }

    /// Posts (records) the base holds.
    pub(crate) fn posts(&self) -> u64 {
        self.footer.span(Section::Records).count
    }

    /// The bytes of directory line `line`.
    #[inline]
    pub(crate) fn line_bytes(&self, line: usize) -> &[u8] {
        let at = self.spans[Section::Directory as usize].0 + line * LINE_BYTES;
        &self.all()[at..at + LINE_BYTES]
    }

    /// Directory line `line`.
    #[inline]
    pub(crate) fn line(&self, line: usize) -> Line {
        Line::decode(self.line_bytes(line))
    }

    /// `author_id`'s home line: where a lookup starts.
    #[inline]
    pub(crate) fn home(&self, author_id: i64) -> usize {
        directory_home(author_id, self.lines as u64) as usize
    }

    /// The address of directory line `line` (for a prefetch).
    #[inline]
    pub(crate) fn line_ptr(&self, line: usize) -> *const u8 {
        self.line_bytes(line.min(self.lines.saturating_sub(1)))
            .as_ptr()
    }

    /// The line of `author_id`, if the base holds the author.
    #[inline]
    pub(crate) fn find_line(&self, author_id: i64) -> Option<usize> {
        let mut at = directory_home(author_id, self.lines as u64) as usize;
        // Verified: every author is found before an unused line, so this ends.
        for _ in 0..self.lines {
            let bytes = self.line_bytes(at);
            if Line::flag_byte(bytes) & 1 == 0 {
                return None;
            }
            if le_i64(bytes, 0) == author_id {
                return Some(at);
            }
            at = if at + 1 == self.lines { 0 } else { at + 1 };
        }
        None
    }

    /// The bytes from granule `granule` of the records section (clamped to its end) to the
    /// end of the file: at least a whole record's worth (the footer follows the records), so
    /// that decoding whatever lies there stays in the file.
    #[inline]
    pub(crate) fn record_bytes_at(&self, granule: u64) -> &[u8] {
        let (start, len) = self.spans[Section::Records as usize];
        let at = (granule as usize).saturating_mul(GRANULE_BYTES).min(len);
        &self.all()[start + at..]
    }

    /// Entry `index` of the videos references (a granule).
    #[inline]
    pub(crate) fn video_ref(&self, index: usize) -> u64 {
        u64::from(le_u32(self.section(Section::Videos), index * 4))
    }

    /// The address of index bucket `bucket` (for a prefetch).
    #[inline]
    pub(crate) fn bucket_ptr(&self, post_id: i64) -> *const u8 {
        let (bucket, _) = post_home(post_id, self.buckets as u64);
        self.section(Section::Posts)[bucket as usize * LINE_BYTES..].as_ptr()
    }

    /// The granules of the words of `post_id`'s probe whose tag is `post_id`'s, in probe
    /// order, unverified: a lookup reads each one's record until one is `post_id`'s. Ends at
    /// an empty word (every probe meets one: the index is never full), or after every word.
    #[inline]
    fn candidates(&self, post_id: i64) -> impl Iterator<Item = u64> + '_ {
        let index = self.section(Section::Posts);
        let words = self.buckets * BUCKET_WORDS;
        let (bucket, tag) = post_home(post_id, self.buckets as u64);
        let mut word = bucket as usize * BUCKET_WORDS;
        (0..words)
            .map(move |_| {
                let value = le_u64(index, word * 8);
                word = if word + 1 == words { 0 } else { word + 1 };
                value
            })
            .take_while(|&value| value != 0)
            .filter(move |&value| (value >> 32) as u32 == tag)
            .map(|value| value & u64::from(u32::MAX))
    }

    /// The granule of `post_id`'s record, if the base holds it (whatever has happened to it
    /// since: see `state.rs`).
    #[inline]
    pub(crate) fn find_post(&self, post_id: i64) -> Option<u64> {
        self.candidates(post_id)
            .find(|&granule| record_key(self.record_bytes_at(granule)).1 == post_id)
    }

    /// The first of `post_id`'s [`candidates`](Self::candidates) (for a prefetch of the
    /// record a lookup is about to read).
    #[inline]
    pub(crate) fn first_candidate(&self, post_id: i64) -> Option<u64> {
        self.candidates(post_id).next()
    }

    /// The line whose records hold granule `granule` (of a record the base holds): the last
    /// line whose records start at or before it (the offsets never decrease along the
    /// directory, and a line's records end where the next line's start).
    pub(crate) fn line_of_granule(&self, granule: u64) -> usize {
        let (mut low, mut high) = (0, self.lines);
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if u64::from(le_u32(self.line_bytes(mid), 8)) <= granule {
                low = mid;
            } else {
                high = mid;
            }
        }
        low
    }
}

/// The bytes of a base file held as `pages` says: mapped read-only (populated at once), or
/// copied into huge-page memory (falling back to the mapping when that memory cannot be had).
pub(crate) fn map_file(
    file: &std::fs::File,
    pages: &BasePages,
) -> Result<BaseBytes, SnapshotError> {
    // SAFETY: the mapping is read-only; base files are written under a temporary name and
    // renamed, never written in place, and the store's documented requirement is that the
    // file is not truncated while it is in use (that would end the process with SIGBUS).
    let map = unsafe { memmap2::MmapOptions::new().populate().map(file)? };
    Ok(match pages {
        BasePages::Mapped => BaseBytes::Mapped(map),
        BasePages::HugeCopy => BaseBytes::huge_copy_of(&map).unwrap_or(BaseBytes::Mapped(map)),
    })
}
