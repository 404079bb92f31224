//! The engine's 2000-follow query against its physical floor, as `compare` measures it: per
//! viewer, the query in thread CPU per post returned, then random reads of as many lines as
//! it had to touch ([`LinesTouched`]) in an array as large as the arena ([`LineFloor`]);
//! medians over the viewers. [`walks_side_by_side`] does the same for several walks of the
//! query's merge ([`Walk`]) in alternating rounds, so that they share the machine's moments.

use crate::cpu_time;
use crate::line_floor::{LineFloor, LinesTouched};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use thunder_engine::bench_internals::{Walk, set_walk};
use thunder_engine::config::MAX_POSTS_TO_RETURN;
use thunder_engine::{FeedQuery, PostStore};
use thunder_workload::Viewer;

/// One measurement over a set of viewers (medians over them).
#[derive(Clone, Debug, Default)]
pub struct StoreFloor {
    /// Viewers with a non-empty answer, each measured once.
    pub viewers: usize,
    /// Bytes of the array the reads ran in.
    pub arena_bytes: usize,
    /// Followed authors (median).
    pub authors: f64,
    /// Posts returned (median).
    pub posts: f64,
    /// Lines the query had to touch (median).
    pub lines: f64,
    /// The query's thread CPU (median).
    pub query_us: f64,
    /// The query's thread CPU per post returned (median).
    pub query_ns_per_post: f64,
    /// The same query run again at once (every line it touches cached), per post (median).
    pub hot_ns_per_post: f64,
    /// Independent reads of the same lines, per post (median).
    pub independent_ns_per_post: f64,
    /// Dependent reads of the same lines, per post (median).
    pub dependent_ns_per_post: f64,
    /// Every query's wall time, in viewer order.
    pub wall_us: Vec<f64>,
}

impl StoreFloor {
    /// How many times the floor the query costs.
    pub fn ratio(&self) -> f64 {
        if self.independent_ns_per_post > 0.0 {
            self.query_ns_per_post / self.independent_ns_per_post
        } else {
            0.0
        }
    }

    /// The figures as `compare`'s JSON line has them.
    pub fn json(&self) -> Value {
        json!({"viewers": self.viewers, "arena_bytes": self.arena_bytes,
               "authors_p50": self.authors, "posts_p50": self.posts, "lines_p50": self.lines,
               "query_cpu_p50_us": self.query_us,
               "query_ns_per_post_p50": self.query_ns_per_post,
               "hot_query_ns_per_post_p50": self.hot_ns_per_post,
               "independent_reads_ns_per_post_p50": self.independent_ns_per_post,
               "dependent_reads_ns_per_post_p50": self.dependent_ns_per_post,
               "query_over_independent_reads": self.ratio()})
    }
}

/// Viewers the store floor is measured on, at most.
pub const FLOOR_VIEWERS: usize = 2000;

/// The viewers of `viewers` (with their exclude lists) that follow at most 2000 authors, at
/// most [`FLOOR_VIEWERS`] of them.
pub fn floor_viewers<'a>(
    viewers: &'a [Viewer],
    excludes: &'a [Vec<i64>],
) -> Vec<(&'a Viewer, &'a [i64])> {
    viewers
        .iter()
        .zip(excludes)
        .filter(|(v, _)| v.following.len() <= 2000)
        .take(FLOOR_VIEWERS)
        .map(|(v, e)| (v, e.as_slice()))
        .collect()
}

/// One viewer's query and the reads of its lines.
#[derive(Clone, Copy, Debug)]
struct Sample {
    authors: usize,
    posts: usize,
    lines: usize,
    query: Duration,
    /// The same query again at once, every line it touches still cached.
    hot: Duration,
    wall: Duration,
    independent: Duration,
    dependent: Duration,
}

/// Runs `viewer`'s query (with the walk this thread's queries take), then reads as many
/// lines as it touched in `floor`, independently and dependently. `None` for an empty
/// answer. `seed` picks the reads' addresses.
fn sample(
    engine: &PostStore,
    floor: &LineFloor,
    (viewer, exclude): (&Viewer, &[i64]),
    seed: u64,
) -> Option<Sample> {
    let thread_cpu = || cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
    let request = FeedQuery {
        exclude,
        max_results: MAX_POSTS_TO_RETURN,
        ..FeedQuery::new(viewer.user_id, &viewer.following)
    };
    let wall = Instant::now();
    let start = thread_cpu();
    let answer = engine.get_all_posts_by_users(&request).posts;
    let query = thread_cpu().saturating_sub(start);
    let wall = wall.elapsed();
    if answer.is_empty() {
        return None;
    }
    let start = thread_cpu();
    std::hint::black_box(engine.get_all_posts_by_users(&request));
    let hot = thread_cpu().saturating_sub(start);
    let lines = LinesTouched::of(viewer.following.len(), &answer).total();
    let start = thread_cpu();
    std::hint::black_box(floor.independent(lines, 2 * seed));
    let independent = thread_cpu().saturating_sub(start);
    let start = thread_cpu();
    std::hint::black_box(floor.dependent(lines, 2 * seed + 1));
    let dependent = thread_cpu().saturating_sub(start);
    Some(Sample {
        authors: viewer.following.len(),
        posts: answer.len(),
        lines,
        query,
        hot,
        wall,
        independent,
        dependent,
    })
}

impl StoreFloor {
    /// The medians of `samples`, read in `floor`.
    fn of(samples: &[Sample], floor: &LineFloor) -> Self {
        let medians =
            |f: &dyn Fn(&Sample) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
        let per_post = |d: Duration, s: &Sample| d.as_nanos() as f64 / s.posts as f64;
        Self {
            viewers: samples.len(),
            arena_bytes: floor.bytes(),
            authors: medians(&|s| s.authors as f64),
            posts: medians(&|s| s.posts as f64),
            lines: medians(&|s| s.lines as f64),
            query_us: medians(&|s| s.query.as_secs_f64() * 1e6),
            query_ns_per_post: medians(&|s| per_post(s.query, s)),
            hot_ns_per_post: medians(&|s| per_post(s.hot, s)),
            independent_ns_per_post: medians(&|s| per_post(s.independent, s)),
            dependent_ns_per_post: medians(&|s| per_post(s.dependent, s)),
            wall_us: samples.iter().map(|s| s.wall.as_secs_f64() * 1e6).collect(),
        }
    }
}

/// Measures [`StoreFloor`] on `engine` for `viewers`, the query and the reads alternating
/// viewer by viewer in `floor`, with the walk this thread's queries take.
pub fn measure(engine: &PostStore, floor: &LineFloor, viewers: &[(&Viewer, &[i64])]) -> StoreFloor {
    let samples: Vec<Sample> = viewers
        .iter()
        .enumerate()
        .filter_map(|(n, &viewer)| sample(engine, floor, viewer, n as u64))
        .collect();
    StoreFloor::of(&samples, floor)
}

/// One walk's rounds of [`walks_side_by_side`].
#[derive(Clone, Debug)]
pub struct WalkRounds {
    /// The walk.
    pub walk: Walk,
    /// One measurement per round, in round order.
    pub rounds: Vec<StoreFloor>,
}

impl WalkRounds {
    /// The median over the rounds of `figure`.
    pub fn median_of(&self, figure: impl Fn(&StoreFloor) -> f64) -> f64 {
        median(&self.rounds.iter().map(figure).collect::<Vec<_>>())
    }

    /// The `quantile` of every round's wall times together, in microseconds.
    pub fn wall_us(&self, quantile: f64) -> f64 {
        let mut all: Vec<f64> = self
            .rounds
            .iter()
            .flat_map(|r| r.wall_us.iter().copied())
            .collect();
        all.sort_by(f64::total_cmp);
        match all.len() {
            0 => 0.0,
            n => all[((n - 1) as f64 * quantile).round() as usize],
        }
    }

    /// The figures as `compare`'s JSON line has them: medians over the rounds, the pooled
    /// wall-time percentiles and every round's ratio and CPU per post.
    pub fn json(&self) -> Value {
        json!({
            "walk": walk_name(self.walk),
            "rounds": self.rounds.len(),
            "query_ns_per_post_median": self.median_of(|r| r.query_ns_per_post),
            "hot_query_ns_per_post_median": self.median_of(|r| r.hot_ns_per_post),
            "independent_reads_ns_per_post_median": self.median_of(|r| r.independent_ns_per_post),
            "query_over_independent_reads_median": self.median_of(StoreFloor::ratio),
            "query_cpu_p50_us_median": self.median_of(|r| r.query_us),
            "query_wall_p50_us": self.wall_us(0.5),
            "query_wall_p99_us": self.wall_us(0.99),
            "query_ns_per_post_rounds": self.rounds.iter().map(|r| r.query_ns_per_post).collect::<Vec<_>>(),
            "query_over_independent_reads_rounds": self.rounds.iter().map(StoreFloor::ratio).collect::<Vec<_>>(),
        })
    }
}

/// Measures each of `walks` over `viewers`, `rounds` times: in round `r` viewer `i`'s query
/// takes walk `(i + r) % walks.len()`, so the walks alternate query by query and share the
/// machine's moments, and every `walks.len()` rounds each viewer has taken every walk once.
/// A viewer's queries are separated by all the other viewers' queries and reads, so each
/// finds the caches cold. A walk's round is the median over the queries it took in that
/// round. Leaves this thread on [`Walk::SERVING`].
pub fn walks_side_by_side(
    engine: &PostStore,
    viewers: &[(&Viewer, &[i64])],
    walks: &[Walk],
    rounds: usize,
) -> Vec<WalkRounds> {
    let floor = LineFloor::new(engine.stats().arena_bytes_reserved);
    let mut out: Vec<WalkRounds> = walks
        .iter()
        .map(|&walk| WalkRounds {
            walk,
            rounds: Vec::with_capacity(rounds),
        })
        .collect();
    for round in 0..rounds {
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); walks.len()];
        for (i, &viewer) in viewers.iter().enumerate() {
            let w = (i + round) % walks.len();
            set_walk(walks[w]);
            let seed = (round * viewers.len() + i) as u64;
            samples[w].extend(sample(engine, &floor, viewer, seed));
        }
        for (walk, samples) in out.iter_mut().zip(&samples) {
            walk.rounds.push(StoreFloor::of(samples, &floor));
        }
    }
    set_walk(Walk::SERVING);
    out
}

/// One store's rounds of [`stores_side_by_side`].
#[derive(Clone, Debug)]
pub struct StoreRounds {
    /// What the store is (`head`, `base (mapped)`, ...).
    pub name: String,
    /// One measurement per round, in round order.
    pub rounds: Vec<StoreFloor>,
}

impl StoreRounds {
    /// The median over the rounds of `figure`.
    pub fn median_of(&self, figure: impl Fn(&StoreFloor) -> f64) -> f64 {
        median(&self.rounds.iter().map(figure).collect::<Vec<_>>())
    }

    /// The figures as `compare`'s JSON line has them: medians over the rounds and every
    /// round's ratio and CPU per post.
    pub fn json(&self) -> Value {
        json!({
            "store": self.name,
            "rounds": self.rounds.len(),
            "query_ns_per_post_median": self.median_of(|r| r.query_ns_per_post),
            "hot_query_ns_per_post_median": self.median_of(|r| r.hot_ns_per_post),
            "independent_reads_ns_per_post_median": self.median_of(|r| r.independent_ns_per_post),
            "query_over_independent_reads_median": self.median_of(StoreFloor::ratio),
            "hot_over_independent_reads_median": self.median_of(|r| r.hot_ns_per_post / r.independent_ns_per_post.max(f64::MIN_POSITIVE)),
            "query_cpu_p50_us_median": self.median_of(|r| r.query_us),
            "query_ns_per_post_rounds": self.rounds.iter().map(|r| r.query_ns_per_post).collect::<Vec<_>>(),
            "query_over_independent_reads_rounds": self.rounds.iter().map(StoreFloor::ratio).collect::<Vec<_>>(),
        })
    }
}

/// Measures [`StoreFloor`] on each of `stores` (which hold the same posts: they give the same
/// answers, so the same floor) over `viewers`, `rounds` times: in round `r` viewer `i` asks
/// store `(i + r) % stores.len()`, so the stores alternate query by query and share the
/// machine's moments, and each query finds the caches cold (the other viewers' queries and
/// reads ran since). The floor's array is `floor_bytes` (the head store's arena).
pub fn stores_side_by_side(
    stores: &[(String, &PostStore)],
    viewers: &[(&Viewer, &[i64])],
    rounds: usize,
    floor_bytes: usize,
) -> Vec<StoreRounds> {
    let floor = LineFloor::new(floor_bytes);
    let mut out: Vec<StoreRounds> = stores
        .iter()
        .map(|(name, _)| StoreRounds {
            name: name.clone(),
            rounds: Vec::with_capacity(rounds),
        })
        .collect();
    for round in 0..rounds {
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); stores.len()];
        for (i, &viewer) in viewers.iter().enumerate() {
            let s = (i + round) % stores.len();
            let seed = (round * viewers.len() + i) as u64;
            samples[s].extend(sample(stores[s].1, &floor, viewer, seed));
        }
        for (store, samples) in out.iter_mut().zip(&samples) {
            store.rounds.push(StoreFloor::of(samples, &floor));
        }
    }
    out
}

/// A walk's name on the command line and in the JSON: `distance`, or the group size.
pub fn walk_name(walk: Walk) -> String {
    match walk {
        Walk::Distance => "distance".to_owned(),
        Walk::Groups(n) => format!("groups-{n}"),
    }
}

/// Parses [`walk_name`]'s forms (`groups-N` or a bare `N`).
pub fn parse_walk(text: &str) -> Result<Walk, String> {
    if text == "distance" {
        return Ok(Walk::Distance);
    }
    let n = text.strip_prefix("groups-").unwrap_or(text);
    match n.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(Walk::Groups(n)),
        _ => Err(format!(
            "a walk is `distance` or a group size of at least 1, not `{text}`"
        )),
    }
}

/// The median of `values` (0 for none).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_read_back_from_their_names() {
        for walk in [
            Walk::Distance,
            Walk::Groups(1),
            Walk::Groups(16),
            Walk::SERVING,
        ] {
            assert_eq!(parse_walk(&walk_name(walk)), Ok(walk));
        }
        assert_eq!(parse_walk("32"), Ok(Walk::Groups(32)));
        assert!(parse_walk("0").is_err());
        assert!(parse_walk("groups").is_err());
        assert!(parse_walk("ahead").is_err());
    }

    #[test]
    fn medians_of_odd_even_and_empty_lists() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
