//! Damaged and hostile base files (`PostStore::load_base_bytes`, then `check_base`). Each
//! input builds a store with arbitrary operations, writes its base file, flips arbitrary bytes
//! and may make every checksum right again, so that the damage reaches the structure and
//! record checks instead of stopping at a CRC. Never a panic, and:
//! - a file the load refuses loads nothing, and decoding it (`decode_contents`, which checks
//!   it whole) refuses it too;
//! - a file the load accepts but `check_base` refuses is refused by decoding too;
//! - a file both accept is answered as it says: a model store built from its decoded contents
//!   (`ModelStore::from_base`) and the store serving from it then take the same further
//!   operations with equal reports, answers and invariants.
#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use thunder_engine::base::decode_contents;
use thunder_engine::{PostStore, StoreConfig};
use thunder_fuzz::differential::{Pair, run_ops};
use thunder_fuzz::ops::{Op, Setup};
use thunder_testkit::model::ModelStore;

#[derive(Arbitrary, Debug)]
struct Input {
    setup: Setup,
    /// What the store holds when its base is written.
    before: Vec<Op>,
    /// (offset, xor) byte flips, offsets taken modulo the file's length.
    flips: Vec<(u32, u8)>,
    /// Make every checksum right after the flips.
    fix: bool,
    /// What both stores take after the load.
    after: Vec<Op>,
}

/// Makes the header's, every block's and the footer's CRC32C match their bytes again (as far
/// as the file still has the shape to say where they are): the layout of `BASE_LAYOUT`.
fn fix_checksums(bytes: &mut [u8]) {
    const TAIL: usize = 24;
    const BLOCK: usize = 1 << 20;
    let dword = |bytes: &[u8], at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    if thunder_fuzz::fix_header_checksum(bytes).is_none() {
        return;
    }
    // The footer: its body (sections, cap, block CRCs), then the tail (its length and CRC).
    let Some(tail_at) = bytes.len().checked_sub(TAIL) else {
        return;
    };
    let footer_len = dword(bytes, tail_at) as usize;
    let Some(footer_at) = tail_at.checked_sub(footer_len) else {
        return;
    };
    let blocks_at = footer_at + 7 * 24 + 8;
    if blocks_at > tail_at {
        return;
    }
    for (block, at) in (blocks_at..tail_at).step_by(4).enumerate() {
        let from = block * BLOCK;
        if from >= footer_at || at + 4 > tail_at {
            break;
        }
        let crc = crc32c::crc32c(&bytes[from..(from + BLOCK).min(footer_at)]);
        bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32c::crc32c(&bytes[footer_at..tail_at]);
    bytes[tail_at + 8..tail_at + 12].copy_from_slice(&crc.to_le_bytes());
}

fuzz_target!(|input: Input| {
    let setup = &input.setup;
    let mut pair = Pair::new(setup);
    let mut offered = Vec::new();
    run_ops(&mut pair, setup, &input.before, 0, &mut offered);
    let mut bytes = Vec::new();
    pair.engine
        .write_base(&Default::default(), &mut bytes)
        .expect("a base is written");
    for &(at, xor) in input.flips.iter().take(16) {
        let at = at as usize % bytes.len();
        bytes[at] ^= xor;
    }
    if input.fix {
        fix_checksums(&mut bytes);
    }
    let config = || StoreConfig {
        retention_secs: setup.retention_secs(),
        max_posting_list_size: setup.max_posting_list_size(),
        clock: pair.clock.clone(),
    };
    let loaded = PostStore::with_config(config());
    let decoded = decode_contents(&bytes, setup.max_posting_list_size());
    if loaded.load_base_bytes(&bytes, 1).is_err() {
        assert!(decoded.is_err(), "the load refused what decoding accepts");
        assert_eq!(loaded.base_info(), None);
        assert_eq!(loaded.stats(), PostStore::with_config(config()).stats());
        return;
    }
    if loaded.check_base(1).is_err() {
        assert!(decoded.is_err(), "the check refused what decoding accepts");
        return;
    }
    let contents = decoded.expect("decoding accepts what the load and the check accept");
    pair.engine = Arc::new(loaded);
    pair.model = ModelStore::from_base(config(), &contents);
    for (_, kinds) in &contents.authors {
        for posts in kinds {
            pair.history.offer((1, 0), posts);
            offered.extend_from_slice(posts);
        }
    }
    pair.audit((1, 0));
    run_ops(&mut pair, setup, &input.after, 2, &mut offered);
});
