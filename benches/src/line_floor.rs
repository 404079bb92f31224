//! The store query's physical floor: reading, at random, as many 64-byte lines of memory as a
//! query must touch, in an array as large as the store's arena, with nothing else to do.
//!
//! A 2000-author query must at least read each followed author's record, the ring lines that
//! hold the entries it returns and the record of every post it returns. Those reads do not
//! depend on one another (the addresses come from the author records and the rings, not from
//! the post records), so the honest floor is [`LineFloor::independent`]: a loop whose
//! addresses come from a generator, never from a loaded value, so the CPU overlaps as many
//! misses as it can. [`LineFloor::dependent`] feeds each loaded value into the next address,
//! one miss after another: what the query would cost if nothing overlapped.

use thunder_engine::LightPost;

/// Bytes of one cache line.
pub const LINE_BYTES: usize = 64;

/// Timeline entries per cache line (16-byte ring cells).
pub const RING_ENTRIES_PER_LINE: usize = 4;

/// The cache lines a query must read to give its answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinesTouched {
    /// One record per followed author (the record holds the timelines' summaries and buffers).
    pub authors: usize,
    /// The ring lines holding the returned entries: per author and timeline, the entries it
    /// gave, four to a line.
    pub ring: usize,
    /// One record per returned post.
    pub posts: usize,
}

impl LinesTouched {
    /// The lines behind `answer`, an answer to a request following `authors` distinct
    /// authors. A lower bound: a reply's parent lookup, the entries a filter skipped and the
    /// index probes are not counted.
    pub fn of(authors: usize, answer: &[LightPost]) -> Self {
        let mut streams: Vec<(i64, bool)> = answer
            .iter()
            .map(|p| (p.author_id, p.is_original()))
            .collect();
        streams.sort_unstable();
        let ring = streams
            .chunk_by(|a, b| a == b)
            .map(|run| run.len().div_ceil(RING_ENTRIES_PER_LINE))
            .sum();
        Self {
            authors,
            ring,
            posts: answer.len(),
        }
    }

    /// All the lines.
    pub fn total(&self) -> usize {
        self.authors + self.ring + self.posts
    }
}

/// An array of `bytes` (rounded up to whole lines), every page touched, to read lines of at
/// random. Advised onto huge pages as the engine's arena chunks are, so that both walk the
/// page tables alike.
pub struct LineFloor {
    words: Vec<u64>,
    lines: u64,
}

impl LineFloor {
    /// A faulted-in array of at least one line and about `bytes`.
    pub fn new(bytes: usize) -> Self {
        let lines = bytes.div_ceil(LINE_BYTES).max(1);
        let len = lines * LINE_BYTES / 8;
        let mut words: Vec<u64> = Vec::with_capacity(len);
        advise_huge_pages(words.as_mut_ptr().cast(), len * 8);
        // Non-zero words, so that every page is written and none stays a shared zero page.
        words.resize(len, 1);
        Self {
            words,
            lines: lines as u64,
        }
    }

    /// Bytes of the array.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// The line that the generator state `state` picks (a multiply-shift of its top half, so
    /// any array size is covered evenly).
    #[inline(always)]
    fn pick(&self, state: u64) -> usize {
        (((state >> 32) * self.lines) >> 32) as usize * (LINE_BYTES / 8)
    }

    /// Reads `count` random lines whose addresses do not depend on what is read; returns a
    /// sum of the words read (pass it to `black_box`).
    pub fn independent(&self, count: usize, seed: u64) -> u64 {
        let mut state = start(seed);
        let mut sum = 0u64;
        for _ in 0..count {
            state = xorshift(state);
            sum = sum.wrapping_add(self.words[self.pick(state)]);
        }
        sum
    }

    /// Reads `count` random lines, each address computed from the word read before it.
    pub fn dependent(&self, count: usize, seed: u64) -> u64 {
        let mut state = start(seed);
        let mut sum = 0u64;
        for _ in 0..count {
            // The word is 1: the state moves as in `independent`, but only once it has arrived.
            let word = self.words[self.pick(state)];
            sum = sum.wrapping_add(word);
            state = xorshift(state.wrapping_add(word - 1));
        }
        sum
    }
}

/// Advises the 2 MiB-aligned part of `len` bytes at `start` onto transparent huge pages,
/// before any of it is touched.
fn advise_huge_pages(start: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE_PAGE: usize = 2 << 20;
        let from = (start as usize).next_multiple_of(HUGE_PAGE);
        let to = (start as usize + len) / HUGE_PAGE * HUGE_PAGE;
        if to > from {
            // SAFETY: `from..to` lies inside the allocation of `len` bytes at `start`, and
            // MADV_HUGEPAGE is a hint that changes no contents.
            unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len);
}

/// The generator's first state for `seed` (never 0; nearby seeds far apart).
fn start(seed: u64) -> u64 {
    seed.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// One step of Marsaglia's xorshift64.
#[inline(always)]
fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(post_id: i64, author_id: i64, reply: bool) -> LightPost {
        LightPost {
            is_reply: reply,
            in_reply_to_post_id: reply.then_some(1),
            ..LightPost::original(post_id, author_id, 100)
        }
    }

    #[test]
    fn ring_lines_are_counted_per_author_and_timeline_four_entries_to_a_line() {
        // Author 1: five originals (two lines) and one reply (one line); author 2: four
        // originals (one line).
        let mut answer: Vec<LightPost> = (0..5).map(|i| post(i, 1, false)).collect();
        answer.push(post(10, 1, true));
        answer.extend((20..24).map(|i| post(i, 2, false)));
        let lines = LinesTouched::of(2000, &answer);
        assert_eq!(
            lines,
            LinesTouched {
                authors: 2000,
                ring: 4,
                posts: 10
            }
        );
        assert_eq!(lines.total(), 2014);
        assert_eq!(LinesTouched::of(3, &[]).total(), 3);
    }

    #[test]
    fn both_loops_read_every_line_they_are_asked_for() {
        let floor = LineFloor::new(100 * LINE_BYTES + 1);
        assert_eq!(floor.bytes(), 101 * LINE_BYTES);
        // Every word is 1: the sum counts the reads.
        assert_eq!(floor.independent(1234, 7), 1234);
        assert_eq!(floor.dependent(1234, 7), 1234);
        assert_eq!(floor.independent(0, 7), 0);
    }
}
