//! Barrier-separated rounds of two concurrent writer threads (disjoint post ids and authors)
//! plus a racing reader against `PostStore`, checked against `ModelStore` applying writer 0's
//! round then writer 1's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use thunder_fuzz::differential::run_rounds;
use thunder_fuzz::ops::Rounds;

fuzz_target!(|input: Rounds| run_rounds(&input));
