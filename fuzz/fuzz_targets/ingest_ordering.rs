//! Operation sequences (creates with arbitrary fields, duplicate creates, out-of-order
//! timestamps, deletes, clock moves, trims, queries) against `PostStore` and the plain
//! `ModelStore`: every answer must agree and every invariant must hold after every step.
#![no_main]

use libfuzzer_sys::fuzz_target;
use thunder_fuzz::differential::run_sequence;
use thunder_fuzz::ops::Sequence;

fuzz_target!(|input: Sequence| run_sequence(&input));
