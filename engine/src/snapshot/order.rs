//! Timeline order: the order a load builds a store in (ascending `created_at`, then post id),
//! found by a parallel counting sort, or only checked when the posts are in it already (as
//! `write_snapshot` writes them).

use std::sync::atomic::{AtomicU32, Ordering};

use crate::arena::CompactPost;
use crate::bulk::PostSource;
use crate::parallel::on_each;

/// Indices of `posts` in timeline order: ascending `created_at`, then post id, file order among
/// equal ids (a snapshot holds each id once, but a fuzzy scan can see two copies). A counting
/// sort by time when the time span is small (it is at most the retention), a comparison sort
/// otherwise; then each run of equal timestamps is put in id order.
///
/// The counting sort runs on `threads` threads (at least one), each over its own range of
/// `posts`: each counts its range per second, the counts give every range its own place in
/// each second (ranges in file order, so equal keys keep file order), each scatters its range,
/// and then each puts the runs of a range of seconds in id order. Posts already in timeline
/// order, as `write_snapshot` writes them, are only checked (on the same threads).
pub(crate) fn in_timeline_order(posts: &[CompactPost], threads: usize) -> Vec<u32> {
    // Snapshots are written in this order: then there is nothing to sort.
    if in_timeline_order_already(posts, threads) {
        return (0..posts.len() as u32).collect();
    }
    let parts = threads.clamp(1, MAX_ORDER_THREADS);
    let per_part = posts.len().div_ceil(parts).max(1);
    let ranges: Vec<&[CompactPost]> = posts.chunks(per_part).collect();
    let bounds = on_each(&ranges, |range| {
        let times = range.iter().map(|p| p.created_at);
        times.clone().min().zip(times.max())
    });
    let Some((min, max)) = bounds
        .into_iter()
        .flatten()
        .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
    else {
        return Vec::new();
    };
    let span = (max - min) as usize + 1;
    if span > 1 << 24 {
        let mut order: Vec<u32> = (0..posts.len() as u32).collect();
        order.sort_by_key(|&i| (posts[i as usize].created_at, posts[i as usize].post_id));
        return order;
    }
    let mut starts = on_each(&ranges, |range| {
        let mut counts = vec![0u32; span];
        for p in *range {
            counts[(p.created_at - min) as usize] += 1;
        }
        counts
    });
    // Each range's first place in each second: after the earlier seconds, and after the
    // earlier ranges' posts of the same second.
    let mut at = 0u32;
    for second in 0..span {
        for counts in starts.iter_mut() {
            let count = counts[second];
            counts[second] = at;
            at += count;
        }
    }
    let mut order = Vec::with_capacity(posts.len());
    // The bulk build reads it back in random order.
    crate::huge_memory::advise_huge(&order);
    order.extend((0..posts.len()).map(|_| AtomicU32::new(0)));
    let mut scattering: Vec<(usize, Vec<u32>)> = starts
        .into_iter()
        .enumerate()
        .map(|(part, starts)| (part * per_part, starts))
        .collect();
    on_each(&mut scattering, |(first, starts)| {
        let first = *first;
        let range = &posts[first..posts.len().min(first + per_part)];
        for (i, p) in range.iter().enumerate() {
            let at = &mut starts[(p.created_at - min) as usize];
            // Relaxed: every range writes its own places; the join orders them for the reads.
            order[*at as usize].store((first + i) as u32, Ordering::Relaxed);
            *at += 1;
        }
    });
    // In place (the same layout): no second buffer.
    let mut order: Vec<u32> = order.into_iter().map(AtomicU32::into_inner).collect();
    // The runs of equal seconds, in ranges cut between seconds.
    let second = |i: u32| posts[i as usize].created_at;
    let mut runs = Vec::with_capacity(parts);
    let mut rest = order.as_mut_slice();
    for part in (1..=parts).rev() {
        let mut cut = rest.len() / part;
        while cut > 0 && cut < rest.len() && second(rest[cut]) == second(rest[cut - 1]) {
            cut += 1;
        }
        let (head, tail) = rest.split_at_mut(cut);
        runs.push(head);
        rest = tail;
    }
    on_each(&mut runs, |range| {
        let id = |i: &u32| posts[*i as usize].post_id;
        for run in range.chunk_by_mut(|a, b| second(*a) == second(*b)) {
            if run.len() > 1 && !run.is_sorted_by_key(id) {
                run.sort_by_key(id);
            }
        }
    });
    order
}

/// True when `posts` are in timeline order already (ascending `created_at`, then post id),
/// checked on `threads` threads (at least one), each over its own range of them.
pub(super) fn in_timeline_order_already<P: PostSource + ?Sized>(posts: &P, threads: usize) -> bool {
    let len = posts.len();
    let parts = threads.clamp(1, MAX_ORDER_THREADS);
    let per_part = len.div_ceil(parts).max(1);
    let key = |i: usize| {
        let post = posts.post(i);
        (post.created_at, post.post_id)
    };
    // Each range checks each of its posts against the next one, the last against the first
    // of the next range.
    let ranges: Vec<std::ops::Range<usize>> = (0..len)
        .step_by(per_part)
        .map(|start| start..(start + per_part).min(len.saturating_sub(1)))
        .collect();
    on_each(ranges, |range| {
        if range.is_empty() {
            return true;
        }
        let mut previous = key(range.start);
        range.into_iter().all(|i| {
            let next = key(i + 1);
            let sorted = previous <= next;
            previous = next;
            sorted
        })
    })
    .into_iter()
    .all(|sorted| sorted)
}

/// At most this many threads order a load's posts.
const MAX_ORDER_THREADS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::post::LightPost;

    fn post(post_id: i64, created_at: i64) -> CompactPost {
        CompactPost::from_light(&LightPost::original(post_id, 1, created_at))
    }

    /// The reference order: a stable sort by (time, id), file order among equal ids.
    fn reference(posts: &[CompactPost]) -> Vec<u32> {
        let mut order: Vec<u32> = (0..posts.len() as u32).collect();
        order.sort_by_key(|&i| (posts[i as usize].created_at, posts[i as usize].post_id));
        order
    }

    /// On any number of threads, including more than there are posts: times repeated within
    /// and across the threads' ranges, ids out of order within a second and an id twice.
    #[test]
    fn timeline_order_is_the_same_on_any_number_of_threads() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut posts: Vec<CompactPost> = (0..5_000)
            .map(|_| {
                post(
                    (next() % 3_000) as i64,
                    1_700_000_000 + (next() % 40) as i64,
                )
            })
            .collect();
        posts.push(posts[17]);
        for threads in [1, 2, 3, 7, 16, 40] {
            assert_eq!(
                in_timeline_order(&posts, threads),
                reference(&posts),
                "{threads} threads"
            );
            assert_eq!(
                in_timeline_order(&posts[..3], threads),
                reference(&posts[..3])
            );
        }
        assert!(in_timeline_order(&[], 2).is_empty());
        // A span too wide for the counting sort.
        let wide = [post(5, 4_000_000_000), post(4, 1), post(3, 4_000_000_000)];
        assert_eq!(in_timeline_order(&wide, 2), vec![1, 2, 0]);
        // Already in order (as snapshots are written), a repeated key included: the identity,
        // whatever the threads; one pair out of order, at a range's edge or inside one, and
        // the sort runs again.
        let mut sorted: Vec<CompactPost> = reference(&posts)
            .into_iter()
            .map(|i| posts[i as usize])
            .collect();
        let identity: Vec<u32> = (0..sorted.len() as u32).collect();
        for threads in [1, 2, 3, 7, 16, 40] {
            assert_eq!(in_timeline_order(&sorted, threads), identity, "{threads}");
        }
        // (`div_ceil(2) - 1`: the pair across the two ranges of two threads.)
        for at in [
            0,
            sorted.len() / 2 - 1,
            sorted.len().div_ceil(2) - 1,
            sorted.len() / 3 + 5,
        ] {
            let mut swapped = sorted.clone();
            let (a, b) = (swapped[at], swapped[at + 1]);
            if (a.created_at, a.post_id) == (b.created_at, b.post_id) {
                continue;
            }
            swapped.swap(at, at + 1);
            for threads in [1, 2, 3] {
                assert_eq!(
                    in_timeline_order(&swapped, threads),
                    reference(&swapped),
                    "{at} {threads}"
                );
                assert_ne!(in_timeline_order(&swapped, threads), identity);
            }
        }
        sorted.clear();
        assert!(in_timeline_order(&sorted, 2).is_empty());
    }
}
