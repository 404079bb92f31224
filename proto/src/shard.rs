//! Author sharding: which shard holds an author's posts. Servers started with `--shard I/N`
//! keep the authors that [`shard_of`] maps to `I`; clients route with the same function.

use std::fmt;
use std::str::FromStr;

/// The shard of `author_id` among `shard_count` shards (`shard_count` 0 counts as 1):
/// `splitmix64(author_id) mod shard_count`, where `splitmix64` is the finalizer of the
/// SplitMix64 generator applied to the id's two's-complement bits:
///
/// ```text
/// z = id + 0x9E3779B97F4A7C15             (wrapping)
/// z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 (wrapping)
/// z = (z ^ (z >> 27)) * 0x94D049BB133111EB (wrapping)
/// z = z ^ (z >> 31)
/// ```
///
/// Sequential ids spread evenly, and the mapping is fixed forever: changing it would move
/// every author. Changing the shard count also moves most authors (it is a modulus, not a
/// consistent hash): a new shard count means a new fleet fed from the topic.
pub fn shard_of(author_id: i64, shard_count: u32) -> u32 {
    let mut z = (author_id as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % u64::from(shard_count.max(1))) as u32
}

/// One shard of an author-sharded fleet: shard `index` of `count` (written `I/N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShardSpec {
    /// This shard, `0 ..count`.
    pub index: u32,
    /// Number of shards, at least 1.
    pub count: u32,
}

impl ShardSpec {
    /// True when this shard holds `author_id`'s posts.
    pub fn owns(&self, author_id: i64) -> bool {
        shard_of(author_id, self.count) == self.index
    }
}

impl FromStr for ShardSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("shard {text:?}: expected I/N with 0 <= I < N, e.g. 0/2");
        let (index, count) = text.trim().split_once('/').ok_or_else(bad)?;
        let index: u32 = index.trim().parse().map_err(|_| bad())?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Self { index, count })
    }
}

impl fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!(
            "1/3".parse::<ShardSpec>(),
            Ok(ShardSpec { index: 1, count: 3 })
        );
        for bad in ["3/3", "0/0", "1", "a/2", "-1/2", ""] {
            assert!(bad.parse::<ShardSpec>().is_err(), "{bad}");
        }
        assert_eq!(ShardSpec { index: 2, count: 5 }.to_string(), "2/5");
    }

    #[test]
    fn spreads_sequential_ids_evenly() {
        let mut counts = [0u32; 4];
        for id in 0..40_000 {
            counts[shard_of(id, 4) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
        assert_eq!(shard_of(12345, 1), 0);
        assert_eq!(shard_of(12345, 0), 0);
    }

    #[test]
    fn is_the_documented_function() {
        // Reference values of the SplitMix64 finalizer (the first outputs of SplitMix64
        // seeded with 0 are the finalizer of 0x9E37.., of twice that, ...).
        assert_eq!(
            shard_of(0, u32::MAX),
            (0xE220_A839_7B1D_CDAF_u64 % u64::from(u32::MAX)) as u32
        );
    }
}
