//! Write-path micro-benchmarks, engine vs baseline: a batch of 1000 new events (creates and
//! the deletes that come due) into a store already holding the feed-2d backlog.
//!
//! `cargo bench -p thunder-benches --bench insert` (`-- --profile-time 10` for a flamegraph).

mod common;

use criterion::{BatchSize, BenchmarkId, Throughput, criterion_group, criterion_main};
use thunder_benches::DEFAULT_BATCH_EVENTS;
use thunder_engine::{EventBatch, Store};

fn inserts(c: &mut criterion::Criterion) {
    let config = common::workload();
    let (engine, baseline) = common::loaded_stores(&config);
    let stores: [&dyn Store; 2] = [&engine, &baseline];
    let mut group = c.benchmark_group("insert_batch");
    group.throughput(Throughput::Elements(DEFAULT_BATCH_EVENTS as u64));
    for store in stores {
        // Each iteration gets fresh post ids, continuing after the backlog.
        let mut live = config.live();
        group.bench_function(BenchmarkId::from_parameter(store.name()), |b| {
            b.iter_batched(
                || {
                    let mut batch = EventBatch::default();
                    for _ in 0..DEFAULT_BATCH_EVENTS {
                        batch.push(live.next_event(common::NOW_SECS));
                    }
                    batch
                },
                |batch| store.apply(&batch),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = inserts
}
criterion_main!(benches);
