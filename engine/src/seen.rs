//! The seen filter: a compact, language-neutral set of post ids a viewer has already seen.
//!
//! Format 1 ([`SEEN_FILTER_FORMAT_SBBF_XXH64`]) is the split-block Bloom filter specified for
//! Apache Parquet, over the xxHash64 of each post id:
//! - `hash = xxh64(post_id as 8 little-endian bytes (two's complement), seed)`;
//! - the filter is `num_blocks` blocks of 256 bits, each eight little-endian `u32` words
//!   (`bits` is `num_blocks * 32` bytes);
//! - block index `((hash >> 32) * num_blocks) >> 32`;
//! - with `x = hash as u32` (the low 32 bits) and the eight Parquet salts, word `i` of the block
//!   gets bit `(x * SALT[i]) >> 27` (wrapping 32-bit multiply).
//!
//! An id is *in* the filter when all eight of its bits are set; ids never inserted are in it
//! with a small probability (the false-positive rate, about 1% at 10 bits per id). With seed 0
//! the bytes equal a Parquet bloom filter of an INT64 column holding the ids.
//!
//! [`SeenFilter`] both builds filters (for clients) and reads them (for the store).

use std::fmt;

use xxhash_rust::xxh64::xxh64;

/// Format id of the Parquet split-block Bloom filter over xxHash64 of the post id.
pub const SEEN_FILTER_FORMAT_SBBF_XXH64: u32 = 1;

/// Largest accepted filter, in bytes of `bits` (1 MiB: about 860k ids at 10 bits per id).
pub const SEEN_FILTER_MAX_BYTES: usize = 1 << 20;

/// Bytes per block (256 bits).
pub const SEEN_FILTER_BLOCK_BYTES: usize = 32;

/// Bits per id [`SeenFilter::for_ids`] sizes for: about 1% false positives.
pub const DEFAULT_BITS_PER_ID: f64 = 10.0;

/// The salts of the Parquet split-block Bloom filter.
const SALT: [u32; 8] = [
    0x47b6_137b,
    0x4497_4d91,
    0x8824_ad5b,
    0xa2b7_289d,
    0x7054_95c7,
    0x2df1_424b,
    0x9efc_4947,
    0x5c6b_fb31,
];

type Block = [u32; 8];

/// A split-block Bloom filter of post ids (format [`SEEN_FILTER_FORMAT_SBBF_XXH64`]).
#[derive(Clone, PartialEq, Eq)]
pub struct SeenFilter {
    seed: u64,
    blocks: Box<[Block]>,
}

impl fmt::Debug for SeenFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeenFilter")
            .field("seed", &self.seed)
            .field("num_blocks", &self.blocks.len())
            .finish()
    }
}

/// Why received filter parts are not a valid seen filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeenFilterError {
    /// The format id is not one this build reads.
    UnknownFormat(u32),
    /// `num_blocks` is 0.
    NoBlocks,
    /// `bits` is larger than [`SEEN_FILTER_MAX_BYTES`].
    TooLarge {
        /// Bytes received.
        bytes: usize,
    },
    /// `bits` is not `num_blocks * 32` bytes.
    LengthMismatch {
        /// Blocks announced.
        num_blocks: u32,
        /// Bytes received.
        bytes: usize,
    },
}

impl fmt::Display for SeenFilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownFormat(format) => write!(
                f,
                "format {format} is not supported (1 = split-block Bloom filter over xxHash64)"
            ),
            Self::NoBlocks => write!(f, "num_blocks must be at least 1"),
            Self::TooLarge { bytes } => write!(
                f,
                "bits has {bytes} bytes, more than the limit of {SEEN_FILTER_MAX_BYTES}"
            ),
            Self::LengthMismatch { num_blocks, bytes } => write!(
                f,
                "bits has {bytes} bytes, expected num_blocks * 32 = {}",
                u64::from(*num_blocks) * SEEN_FILTER_BLOCK_BYTES as u64
            ),
        }
    }
}

impl std::error::Error for SeenFilterError {}

impl SeenFilter {
    /// An empty filter of `num_blocks` blocks (at least 1, at most the 1 MiB limit).
    pub fn with_blocks(num_blocks: usize, seed: u64) -> Self {
        let num_blocks = num_blocks.clamp(1, SEEN_FILTER_MAX_BYTES / SEEN_FILTER_BLOCK_BYTES);
        Self {
            seed,
            blocks: vec![[0; 8]; num_blocks].into_boxed_slice(),
        }
    }

    /// An empty filter sized for `expected_ids` ids at `bits_per_id` bits each
    /// ([`DEFAULT_BITS_PER_ID`]: about 1% false positives), capped at the 1 MiB limit.
    pub fn for_ids(expected_ids: usize, bits_per_id: f64, seed: u64) -> Self {
        let bits = (expected_ids as f64 * bits_per_id.max(0.0)).ceil();
        let blocks = (bits / (SEEN_FILTER_BLOCK_BYTES * 8) as f64).ceil();
        // `as` saturates for floats: a huge request becomes the cap.
        Self::with_blocks(blocks as usize, seed)
    }

    /// A filter holding `post_ids`, sized at [`DEFAULT_BITS_PER_ID`] with `seed`.
    pub fn from_ids(post_ids: &[i64], seed: u64) -> Self {
        let mut filter = Self::for_ids(post_ids.len(), DEFAULT_BITS_PER_ID, seed);
        for &id in post_ids {
            filter.insert(id);
        }
        filter
    }

    /// Reads a received filter: `format`, `seed`, `num_blocks` and the `bits` (copied).
    pub fn from_parts(
        format: u32,
        seed: u64,
        num_blocks: u32,
        bits: &[u8],
    ) -> Result<Self, SeenFilterError> {
        if format != SEEN_FILTER_FORMAT_SBBF_XXH64 {
            return Err(SeenFilterError::UnknownFormat(format));
        }
        if bits.len() > SEEN_FILTER_MAX_BYTES {
            return Err(SeenFilterError::TooLarge { bytes: bits.len() });
        }
        if num_blocks == 0 {
            return Err(SeenFilterError::NoBlocks);
        }
        if u64::from(num_blocks) * SEEN_FILTER_BLOCK_BYTES as u64 != bits.len() as u64 {
            return Err(SeenFilterError::LengthMismatch {
                num_blocks,
                bytes: bits.len(),
            });
        }
        let blocks = bits
            .chunks_exact(SEEN_FILTER_BLOCK_BYTES)
            .map(|chunk| {
                let mut block = [0u32; 8];
                for (word, bytes) in block.iter_mut().zip(chunk.chunks_exact(4)) {
                    *word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                }
                block
            })
            .collect();
        Ok(Self { seed, blocks })
    }

    /// The format id ([`SEEN_FILTER_FORMAT_SBBF_XXH64`]).
    pub fn format(&self) -> u32 {
        SEEN_FILTER_FORMAT_SBBF_XXH64
    }

    /// The xxHash64 seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Number of 256-bit blocks.
    pub fn num_blocks(&self) -> u32 {
        // At most SEEN_FILTER_MAX_BYTES / 32 blocks, well inside u32.
        self.blocks.len() as u32
    }

    /// The `bits` to send: every block's eight words, little-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.blocks
            .iter()
            .flat_map(|block| block.iter().flat_map(|word| word.to_le_bytes()))
            .collect()
    }

    /// Adds `post_id`.
    pub fn insert(&mut self, post_id: i64) {
        self.insert_hash(self.hash(post_id));
    }

    /// True if `post_id` was inserted, or is a false positive.
    #[inline]
    pub fn contains(&self, post_id: i64) -> bool {
        self.contains_hash(self.hash(post_id))
    }

    #[inline]
    fn hash(&self, post_id: i64) -> u64 {
        xxh64(&post_id.to_le_bytes(), self.seed)
    }

    #[inline]
    fn block_index(&self, hash: u64) -> usize {
        (((hash >> 32) * self.blocks.len() as u64) >> 32) as usize
    }

    fn insert_hash(&mut self, hash: u64) {
        let index = self.block_index(hash);
        let block = &mut self.blocks[index];
        let x = hash as u32;
        for (word, salt) in block.iter_mut().zip(SALT) {
            *word |= 1 << (x.wrapping_mul(salt) >> 27);
        }
    }

    #[inline]
    fn contains_hash(&self, hash: u64) -> bool {
        let block = &self.blocks[self.block_index(hash)];
        let x = hash as u32;
        block
            .iter()
            .zip(SALT)
            .all(|(word, salt)| word & (1 << (x.wrapping_mul(salt) >> 27)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxh64_matches_the_reference_vector() {
        // xxHash64 of the empty input with seed 0 (the value Parquet implementations check).
        assert_eq!(xxh64(b"", 0), 0xef46_db37_51d8_e999);
    }

    #[test]
    fn equals_a_parquet_written_filter() {
        // A one-block filter written by parquet-mr for the strings "a0".."a9" (seed 0).
        let parquet: [u8; 32] = [
            200, 1, 80, 20, 64, 68, 8, 109, 6, 37, 4, 67, 144, 80, 96, 32, 8, 132, 43, 33, 0, 5,
            99, 65, 2, 0, 224, 44, 64, 78, 96, 4,
        ];
        let mut filter = SeenFilter::with_blocks(1, 0);
        for i in 0..10 {
            filter.insert_hash(xxh64(format!("a{i}").as_bytes(), 0));
        }
        assert_eq!(filter.to_bytes(), parquet);
    }

    #[test]
    fn inserted_ids_are_always_contained() {
        let ids: Vec<i64> = (0..5000).map(|i| i * 7919 - 20_000).collect();
        let filter = SeenFilter::from_ids(&ids, 42);
        assert!(ids.iter().all(|&id| filter.contains(id)));
        let false_positives = (1_000_000..1_100_000)
            .filter(|&id| filter.contains(id))
            .count();
        // 10 bits per id: about 1%; far above 3% would mean a broken hash or layout.
        assert!(
            false_positives < 3_000,
            "{false_positives} false positives in 100000"
        );
    }

    #[test]
    fn round_trips_through_bytes() {
        let filter = SeenFilter::from_ids(&[1, -1, i64::MAX, i64::MIN, 0], 7);
        let bytes = filter.to_bytes();
        assert_eq!(bytes.len(), filter.num_blocks() as usize * 32);
        let read = SeenFilter::from_parts(1, 7, filter.num_blocks(), &bytes).expect("valid");
        assert_eq!(read, filter);
        // Another seed is another filter.
        let other = SeenFilter::from_parts(1, 8, filter.num_blocks(), &bytes).expect("valid");
        assert!(
            ![1, -1, i64::MAX, i64::MIN, 0]
                .iter()
                .all(|&id| other.contains(id))
        );
    }

    #[test]
    fn malformed_parts_are_refused_with_a_reason() {
        let ok = vec![0u8; 64];
        assert_eq!(
            SeenFilter::from_parts(0, 0, 2, &ok),
            Err(SeenFilterError::UnknownFormat(0))
        );
        assert_eq!(
            SeenFilter::from_parts(1, 0, 0, &[]),
            Err(SeenFilterError::NoBlocks)
        );
        assert_eq!(
            SeenFilter::from_parts(1, 0, 3, &ok),
            Err(SeenFilterError::LengthMismatch {
                num_blocks: 3,
                bytes: 64
            })
        );
        assert_eq!(
            SeenFilter::from_parts(1, 0, u32::MAX, &ok),
            Err(SeenFilterError::LengthMismatch {
                num_blocks: u32::MAX,
                bytes: 64
            })
        );
        let huge = vec![0u8; SEEN_FILTER_MAX_BYTES + 32];
        assert_eq!(
            SeenFilter::from_parts(1, 0, (huge.len() / 32) as u32, &huge),
            Err(SeenFilterError::TooLarge { bytes: huge.len() })
        );
        let max = vec![0u8; SEEN_FILTER_MAX_BYTES];
        assert!(SeenFilter::from_parts(1, 0, (max.len() / 32) as u32, &max).is_ok());
        assert!(
            SeenFilterError::UnknownFormat(9)
                .to_string()
                .contains("format 9")
        );
    }

    #[test]
    fn sizing_is_bounded() {
        assert_eq!(SeenFilter::for_ids(0, 10.0, 0).num_blocks(), 1);
        assert_eq!(SeenFilter::for_ids(10_000, 10.0, 0).num_blocks(), 391);
        assert_eq!(
            SeenFilter::for_ids(usize::MAX, 10.0, 0).num_blocks() as usize,
            SEEN_FILTER_MAX_BYTES / 32
        );
    }
}
