//! The post index side by side: the engine's `TagIndex` against the concurrent maps it could
//! have been, on the feed-2d workload's post ids (`post_id -> slot`), in one run.
//!
//! ```text
//! cargo run --release -p thunder-benches --bin index_compare -- --scale 10 --rounds 3
//! ```
//!
//! Candidates, every one behind the same batched calls (a guard pinned per batch of
//! `BATCH` keys, as the engine pins per event batch and per query) and, for the maps, the
//! hasher the engine's small maps use (foldhash):
//! - `tag`: the engine's `TagIndex`. It stores no key: a candidate value is checked against
//!   the record it names, here `keys[value] == key` (one more memory access per lookup, as
//!   the engine's arena read). Inserts prefetch the bucket of the key `LOOKAHEAD` places on
//!   and lookups hash a window of keys and prefetch their buckets first, as the engine's
//!   insert pipeline and query do; `tag-plain` does neither.
//! - `scc-index`: `scc::HashIndex` (lock-free reads, entries inline in 32-entry buckets);
//! - `scc-map`: `scc::HashMap` (readers take a bucket's shared lock);
//! - `papaya`: `papaya::HashMap`, the engine's post index before the tag index;
//! - `dashmap`: `dashmap::DashMap` (sharded `RwLock`s: readers wait for writers; a reference
//!   point, not a candidate).
//!
//! Per candidate and round (candidates alternate within every round; medians printed):
//! 1. insert every key in arrival order into an index grown from empty (growth included),
//!    one writer;
//! 2. `--lookups` lookups of stored keys in random order, one thread, then two threads at once;
//! 3. removal of every hundredth key (the workload deletes 1% of posts);
//! 4. insert every key into an index presized for them, two writers (keys split by id parity,
//!    as Kafka partitions split them), wall time, and the resident-set growth of that index
//!    (after the previous index was dropped and freed memory given back).
//!
//! Memory is measured presized because after growth the resident set still holds the tables
//! a growth replaced until each candidate's own epoch scheme reclaims them, which made the
//! figure depend on timing (one round measured 0 B/key on memory the previous candidate's
//! retired tables gave back meanwhile). The tag index also prints its table's bytes after
//! growth by its own count.

use std::hint::black_box;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::{Parser, ValueEnum};
use thunder_benches::memory::{release_free_memory, rss_bytes, settle};
use thunder_engine::PostEvent;
use thunder_engine::bench_internals::{Guard, TagIndex, pin, prefetch};
use thunder_workload::SynthConfig;

/// Flags.
#[derive(Parser, Debug)]
#[command(about = "The engine's post index against scc, papaya and dashmap on feed-2d post ids")]
struct Args {
    /// Workload divisor: 1 = 20M posts, 10 = 2M, 100 = 200k.
    #[arg(long, default_value_t = 10)]
    scale: u32,
    /// Rounds (each runs every candidate once); medians are printed.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Lookups per lookup figure.
    #[arg(long, default_value_t = 2_000_000)]
    lookups: usize,
    /// Seconds to wait before each candidate, so freed memory has gone back to the host
    /// (faulting fresh memory in costs more on this virtual machine right after a free).
    #[arg(long, default_value_t = 2.0)]
    settle_secs: f64,
    /// Candidates to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Kind>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kind {
    Tag,
    TagPlain,
    SccIndex,
    SccMap,
    Papaya,
    Dashmap,
}

const ALL: [Kind; 6] = [
    Kind::Tag,
    Kind::TagPlain,
    Kind::SccIndex,
    Kind::SccMap,
    Kind::Papaya,
    Kind::Dashmap,
];

/// Keys per pinned batch.
const BATCH: usize = 1024;
/// How many keys ahead a `tag` insert prefetches a bucket (the engine's insert pipeline
/// prefetches the post index bucket 8 posts ahead).
const LOOKAHEAD: usize = 8;
/// Keys a batched `tag` lookup hashes and prefetches before it probes them.
const WINDOW: usize = 64;

type Hasher = foldhash::fast::RandomState;

/// What every candidate offers, a batch at a time.
trait Index: Sync {
    /// Inserts `keys[i] -> values[i]`; the number stored (a key already present is not).
    fn insert_batch(&self, keys: &[i64], values: &[u32]) -> usize;
    /// Looks up every key; the sum of the values found (so nothing is optimised away).
    fn get_batch(&self, keys: &[i64]) -> u64;
    /// Removes every key; the number removed.
    fn remove_batch(&self, keys: &[i64]) -> usize;
    /// Bytes the candidate knows it holds outside the heap (the tag index's mapped table).
    fn mapped_bytes(&self) -> usize {
        0
    }
}

/// The engine's index, checking candidates against the key array as the engine checks them
/// against the arena's records.
struct Tag<'k> {
    index: TagIndex,
    keys: &'k [i64],
    batched: bool,
}

impl Tag<'_> {
    fn verify(&self, key: i64) -> impl Fn(u32) -> Option<u32> + '_ {
        move |value| (self.keys.get(value as usize) == Some(&key)).then_some(value)
    }
}

impl Index for Tag<'_> {
    fn insert_batch(&self, keys: &[i64], values: &[u32]) -> usize {
        let guard = pin();
        let mut stored = 0;
        for (i, (&key, &value)) in keys.iter().zip(values).enumerate() {
            // As the engine's insert pipeline: the bucket of the key LOOKAHEAD places on.
            if let Some(&ahead) = keys.get(i + LOOKAHEAD).filter(|_| self.batched) {
                prefetch(self.index.bucket_ptr(self.index.hash(ahead), &guard));
            }
            let verify = self.verify(key);
            let inserted = self.index.insert_with(
                self.index.hash(key),
                &guard,
                |v| verify(v).is_some(),
                || Some(value),
            );
            stored += usize::from(inserted.is_ok());
        }
        stored
    }

    fn get_batch(&self, keys: &[i64]) -> u64 {
        let guard = pin();
        if !self.batched {
            return keys
                .iter()
                .filter_map(|&key| self.get(key, &guard))
                .map(u64::from)
                .sum();
        }
        let mut sum = 0;
        let mut hashed = Vec::with_capacity(WINDOW);
        for window in keys.chunks(WINDOW) {
            hashed.clear();
            hashed.extend(window.iter().map(|&key| self.index.hash(key)));
            for &h in &hashed {
                prefetch(self.index.bucket_ptr(h, &guard));
            }
            for (&key, &h) in window.iter().zip(&hashed) {
                sum += u64::from(self.index.get(h, &guard, self.verify(key)).unwrap_or(0));
            }
        }
        sum
    }

    fn remove_batch(&self, keys: &[i64]) -> usize {
        let guard = pin();
        keys.iter()
            .filter(|&&key| {
                let verify = self.verify(key);
                self.index
                    .remove_where(self.index.hash(key), &guard, |v| verify(v).is_some())
                    .is_some()
            })
            .count()
    }

    fn mapped_bytes(&self) -> usize {
        self.index.bytes(&pin())
    }
}

impl Tag<'_> {
    fn get(&self, key: i64, guard: &Guard) -> Option<u32> {
        self.index
            .get(self.index.hash(key), guard, self.verify(key))
    }
}

/// How many of `keys[i] -> values[i]` `insert` stored.
fn insert_each(keys: &[i64], values: &[u32], mut insert: impl FnMut(i64, u32) -> bool) -> usize {
    keys.iter()
        .zip(values)
        .filter(|&(&key, &value)| insert(key, value))
        .count()
}

struct SccIndex(scc::HashIndex<i64, u32, Hasher>);

impl Index for SccIndex {
    fn insert_batch(&self, keys: &[i64], values: &[u32]) -> usize {
        insert_each(keys, values, |key, value| {
            self.0.insert_sync(key, value).is_ok()
        })
    }

    fn get_batch(&self, keys: &[i64]) -> u64 {
        let guard = scc::Guard::new();
        keys.iter()
            .filter_map(|key| self.0.peek(key, &guard))
            .map(|&v| u64::from(v))
            .sum()
    }

    fn remove_batch(&self, keys: &[i64]) -> usize {
        keys.iter().filter(|key| self.0.remove_sync(*key)).count()
    }
}

struct SccMap(scc::HashMap<i64, u32, Hasher>);

impl Index for SccMap {
    fn insert_batch(&self, keys: &[i64], values: &[u32]) -> usize {
        insert_each(keys, values, |key, value| {
            self.0.insert_sync(key, value).is_ok()
        })
    }

    fn get_batch(&self, keys: &[i64]) -> u64 {
        keys.iter()
            .filter_map(|key| self.0.read_sync(key, |_, &v| u64::from(v)))
            .sum()
    }

    fn remove_batch(&self, keys: &[i64]) -> usize {
        keys.iter()
            .filter(|key| self.0.remove_sync(*key).is_some())
            .count()
    }
}

struct Papaya(papaya::HashMap<i64, u32, Hasher>);

impl Index for Papaya {
    fn insert_batch(&self, keys: &[i64], values: &[u32]) -> usize {
        let map = self.0.pin();
        insert_each(keys, values, |key, value| {
            map.try_insert(key, value).is_ok()
        })
    }

    fn get_batch(&self, keys: &[i64]) -> u64 {
        let map = self.0.pin();
        keys.iter()
            .filter_map(|key| map.get(key))
            .map(|&v| u64::from(v))
            .sum()
    }

    fn remove_batch(&self, keys: &[i64]) -> usize {
        let map = self.0.pin();
        keys.iter().filter(|key| map.remove(*key).is_some()).count()
    }
}

struct Dash(dashmap::DashMap<i64, u32, Hasher>);

impl Index for Dash {
    fn insert_batch(&self, keys: &[i64], values: &[u32]) -> usize {
        insert_each(keys, values, |key, value| match self.0.entry(key) {
            dashmap::Entry::Occupied(_) => false,
            dashmap::Entry::Vacant(slot) => {
                slot.insert(value);
                true
            }
        })
    }

    fn get_batch(&self, keys: &[i64]) -> u64 {
        keys.iter()
            .filter_map(|key| self.0.get(key).map(|v| u64::from(*v)))
            .sum()
    }

    fn remove_batch(&self, keys: &[i64]) -> usize {
        keys.iter()
            .filter(|key| self.0.remove(*key).is_some())
            .count()
    }
}

/// An index of `kind` sized for `capacity` keys (0: grown from empty).
fn make<'k>(kind: Kind, capacity: usize, keys: &'k [i64]) -> Box<dyn Index + 'k> {
    let hasher = Hasher::default;
    match kind {
        Kind::Tag | Kind::TagPlain => Box::new(Tag {
            // The engine's own initial capacity when grown from empty (1 << 16 keys).
            index: TagIndex::with_capacity(capacity.max(1 << 16)),
            keys,
            batched: kind == Kind::Tag,
        }),
        Kind::SccIndex => Box::new(SccIndex(scc::HashIndex::with_capacity_and_hasher(
            capacity,
            hasher(),
        ))),
        Kind::SccMap => Box::new(SccMap(scc::HashMap::with_capacity_and_hasher(
            capacity,
            hasher(),
        ))),
        Kind::Papaya => Box::new(Papaya(
            papaya::HashMap::builder()
                .capacity(capacity)
                .hasher(hasher())
                .build(),
        )),
        Kind::Dashmap => Box::new(Dash(dashmap::DashMap::with_capacity_and_hasher(
            capacity,
            hasher(),
        ))),
    }
}

/// One candidate's figures in one round.
#[derive(Clone, Copy, Default)]
struct Figures {
    insert_ns: f64,
    lookup_ns: f64,
    lookup_2t_ns: f64,
    remove_ns: f64,
    insert_2w_ns: f64,
    presized_bytes_per_key: f64,
}

fn per_key(started: Instant, keys: usize) -> f64 {
    started.elapsed().as_nanos() as f64 / keys.max(1) as f64
}

/// The keys, the positions to look up (a key's value is its position) and their keys.
struct Workload {
    keys: Vec<i64>,
    positions: Vec<u32>,
    probes: Vec<i64>,
}

impl Workload {
    fn expected(&self, positions: &[u32]) -> u64 {
        positions.iter().map(|&p| u64::from(p)).sum()
    }
}

fn run(kind: Kind, work: &Workload, settle_secs: f64) -> Result<Figures> {
    let (keys, probes) = (&work.keys[..], &work.probes[..]);
    let values: Vec<u32> = (0..keys.len() as u32).collect();
    let split = |parity: i64| -> (Vec<i64>, Vec<u32>) {
        keys.iter()
            .zip(&values)
            .filter(|&(&k, _)| k.rem_euclid(2) == parity)
            .map(|(&k, &v)| (k, v))
            .unzip()
    };
    let (even, odd) = (split(0), split(1));
    let mut figures = Figures::default();
    release_free_memory();
    settle(settle_secs);
    {
        let index = make(kind, 0, keys);
        let started = Instant::now();
        let mut stored = 0;
        for (batch, values) in keys.chunks(BATCH).zip(values.chunks(BATCH)) {
            stored += index.insert_batch(batch, values);
        }
        figures.insert_ns = per_key(started, keys.len());
        if stored != keys.len() {
            bail!("{kind:?} stored {stored} of {} distinct keys", keys.len());
        }
        if kind == Kind::Tag {
            let mapped = index.mapped_bytes() as f64 / keys.len() as f64;
            eprintln!("  [tag] table after growth: {mapped:.1} B/key by its own count");
        }

        let expected = work.expected(&work.positions);
        let started = Instant::now();
        let sum: u64 = probes.chunks(BATCH).map(|b| index.get_batch(b)).sum();
        figures.lookup_ns = per_key(started, probes.len());
        if sum != expected {
            bail!("{kind:?} lookups summed {sum}, expected {expected}");
        }
        let started = Instant::now();
        let (a, b) = probes.split_at(probes.len() / 2);
        let sum = std::thread::scope(|s| {
            let index = &index;
            let other = s.spawn(move || b.chunks(BATCH).map(|c| index.get_batch(c)).sum::<u64>());
            let mine: u64 = a.chunks(BATCH).map(|c| index.get_batch(c)).sum();
            mine + other.join().expect("lookup thread")
        });
        figures.lookup_2t_ns = per_key(started, probes.len());
        if sum != expected {
            bail!("{kind:?} two-thread lookups summed {sum}, expected {expected}");
        }

        let doomed: Vec<i64> = keys.iter().step_by(100).copied().collect();
        let started = Instant::now();
        let removed: usize = doomed.chunks(BATCH).map(|b| index.remove_batch(b)).sum();
        figures.remove_ns = per_key(started, doomed.len());
        if removed != doomed.len() {
            bail!("{kind:?} removed {removed} of {}", doomed.len());
        }
        if index.get_batch(&doomed[..doomed.len().min(BATCH)]) != 0 {
            bail!("{kind:?} still finds removed keys");
        }
        black_box(&index);
    }
    release_free_memory();
    settle(settle_secs);
    {
        let before = rss_bytes();
        let index = make(kind, keys.len(), keys);
        let index = &index;
        let writer = |(keys, values): &(Vec<i64>, Vec<u32>)| -> usize {
            keys.chunks(BATCH)
                .zip(values.chunks(BATCH))
                .map(|(k, v)| index.insert_batch(k, v))
                .sum()
        };
        let started = Instant::now();
        let stored: usize = std::thread::scope(|s| {
            let other = s.spawn(|| writer(&odd));
            writer(&even) + other.join().expect("writer thread")
        });
        figures.insert_2w_ns = per_key(started, keys.len());
        figures.presized_bytes_per_key =
            rss_bytes().saturating_sub(before) as f64 / keys.len() as f64;
        if stored != keys.len() {
            bail!("{kind:?} two writers stored {stored} of {}", keys.len());
        }
        let sample = probes.len().min(BATCH);
        if index.get_batch(&probes[..sample]) != work.expected(&work.positions[..sample]) {
            bail!("{kind:?} answers wrongly after two writers");
        }
    }
    Ok(figures)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let kinds: Vec<Kind> = if args.only.is_empty() {
        ALL.to_vec()
    } else {
        args.only.clone()
    };
    let config = SynthConfig::feed_2d(args.scale, 1_750_000_000);
    let mut keys: Vec<i64> = config
        .backlog()
        .filter_map(|event| match event {
            PostEvent::Create(post) => Some(post.post_id),
            PostEvent::Delete(_) => None,
        })
        .collect();
    // A redelivered create is not a new key.
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.retain(|&k| seen.insert(k));
    drop(seen);
    if keys.len() > u32::MAX as usize {
        bail!("too many keys for u32 values");
    }
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let positions: Vec<u32> = (0..args.lookups)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_F491_4F6C_DD1D) % keys.len() as u64) as u32
        })
        .collect();
    let probes = positions.iter().map(|&p| keys[p as usize]).collect();
    let work = Workload {
        keys,
        positions,
        probes,
    };
    println!(
        "scale {}: {} distinct post ids, {} lookups, {} rounds",
        args.scale,
        work.keys.len(),
        work.probes.len(),
        args.rounds
    );
    let mut results: Vec<Vec<Figures>> = vec![Vec::new(); kinds.len()];
    for round in 0..args.rounds {
        // Alternate the order too, so no candidate always runs right after the same one.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..kinds.len()).collect()
        } else {
            (0..kinds.len()).rev().collect()
        };
        for i in order {
            let figures = run(kinds[i], &work, args.settle_secs)?;
            eprintln!(
                "  round {round} {:?}: insert {:.0} ns, lookup {:.0} / {:.0} ns, \
                 remove {:.0} ns, 2 writers {:.0} ns, presized {:.1} B/key",
                kinds[i],
                figures.insert_ns,
                figures.lookup_ns,
                figures.lookup_2t_ns,
                figures.remove_ns,
                figures.insert_2w_ns,
                figures.presized_bytes_per_key
            );
            results[i].push(figures);
        }
    }
    println!(
        "| candidate | insert, 1 writer, grown (ns/key) | lookup, 1 thread (ns) \
         | lookup, 2 threads (ns/key, wall) | remove (ns) | insert, 2 writers, presized (ns/key, wall) \
         | resident B/key, presized |"
    );
    println!("|---|---|---|---|---|---|---|");
    let pick = |i: usize, f: fn(&Figures) -> f64| median(results[i].iter().map(f).collect());
    for (i, kind) in kinds.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} |",
            kind.to_possible_value()
                .map_or("?".into(), |v| v.get_name().to_string()),
            pick(i, |f| f.insert_ns),
            pick(i, |f| f.lookup_ns),
            pick(i, |f| f.lookup_2t_ns),
            pick(i, |f| f.remove_ns),
            pick(i, |f| f.insert_2w_ns),
            pick(i, |f| f.presized_bytes_per_key),
        );
    }
    Ok(())
}
