//! The Python snippet of `proto/SEEN_FILTER.md` builds the same bytes as the Rust builder.
//!
//! The snippet is taken from the document itself (its only `python` code block) and run with
//! `python3` (needed by the test suite anyway, for the Kafka test broker).

use std::io::Write;
use std::process::{Command, Stdio};

use thunder_engine::SeenFilter;
use thunder_engine::seen::DEFAULT_BITS_PER_ID;

const DOC: &str = include_str!("../../proto/SEEN_FILTER.md");

fn python_snippet() -> &'static str {
    let start = DOC.find("```python\n").expect("a python block") + "```python\n".len();
    let len = DOC[start..].find("```").expect("the block ends");
    &DOC[start..start + len]
}

/// Id sets and seeds covering negative ids, the i64 extremes, duplicates and sizes from one
/// block to several hundred.
fn cases() -> Vec<(Vec<i64>, u64)> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as i64
    };
    vec![
        (vec![], 0),
        (vec![0, 1, -1, i64::MAX, i64::MIN], 0),
        (vec![7, 7, 7], 42),
        ((1..=100).map(|i| 1_990_000_000_000_000 + i).collect(), 0),
        ((0..2000).map(|_| next()).collect(), u64::MAX),
        ((0..10_000).map(|_| next()).collect(), 0x5eed),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn python_snippet_builds_the_same_bytes_as_the_rust_builder() {
    let driver = format!(
        "{}\nimport sys\nfor line in sys.stdin:\n    seed, *ids = map(int, line.split())\n    \
         n, bits = seen_filter(ids, seed)\n    print(n, bits.hex())\n",
        python_snippet()
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(&driver)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs (it is needed by the test suite)");
    let mut input = String::new();
    for (ids, seed) in cases() {
        input.push_str(&seed.to_string());
        for id in &ids {
            input.push(' ');
            input.push_str(&id.to_string());
        }
        input.push('\n');
    }
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("ids written");
    let output = child.wait_with_output().expect("python3 finishes");
    assert!(output.status.success(), "the snippet failed");
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    let cases = cases();
    assert_eq!(lines.len(), cases.len());
    for ((ids, seed), line) in cases.iter().zip(lines) {
        let mut filter = SeenFilter::for_ids(ids.len(), DEFAULT_BITS_PER_ID, *seed);
        ids.iter().for_each(|&id| filter.insert(id));
        let expected = format!("{} {}", filter.num_blocks(), hex(&filter.to_bytes()));
        assert!(
            line == expected,
            "{} ids, seed {seed}: python and rust differ",
            ids.len()
        );
        assert!(ids.iter().all(|&id| filter.contains(id)));
    }
}
