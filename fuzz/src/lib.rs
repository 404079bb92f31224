//! Shared pieces of thunder's fuzz targets.
//!
//! - [`ops`]: the operation language of the `ingest_ordering*` targets (creates, deletes,
//!   duplicates, clock moves, trims, queries), decoded with `arbitrary` and mapped into small id
//!   ranges so that collisions, deletes before creates and reply/repost references are common.
//! - [`invariants`]: what every query answer must satisfy, whatever the interleaving.
//! - [`differential`]: runs operations against `PostStore` and `ModelStore` (one shared
//!   `ManualClock`), sequentially or with two writer threads, and panics on the first
//!   disagreement or broken invariant.
//!
//! A panic is how a target reports a finding: libFuzzer's panic hook aborts the process, which
//! records the input under `fuzz/artifacts/<target>/`.

pub mod differential;
pub mod invariants;
pub mod ops;

/// Makes the CRC32C of the header every snapshot and base file begins with (magic, version,
/// body length, body, then the CRC of all that) match its bytes again, as far as the file
/// holds it whole: the offset after it, where the rest of the file begins.
pub fn fix_header_checksum(bytes: &mut [u8]) -> Option<usize> {
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    if bytes.len() < 16 {
        return None;
    }
    let body_end = 16 + word(12) as usize;
    if body_end + 4 > bytes.len() {
        return None;
    }
    let crc = crc32c::crc32c(&bytes[..body_end]);
    bytes[body_end..body_end + 4].copy_from_slice(&crc.to_le_bytes());
    Some(body_end + 4)
}
