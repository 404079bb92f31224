//! Read-path micro-benchmarks, engine vs baseline on the feed-2d backlog:
//! one busy author (a timeline scan), a 2000-author feed query and a 2000-author video query.
//!
//! `cargo bench -p thunder-benches --bench query` (`THUNDER_BENCH_SCALE=10` for a larger store;
//! add `-- --profile-time 10` for a flamegraph per benchmark).

mod common;

use criterion::{BenchmarkId, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;
use thunder_benches::{BenchStore, Query};
use thunder_engine::config::{MAX_POSTS_TO_RETURN, MAX_VIDEOS_TO_RETURN};
use thunder_testkit::synth::exclude_from_answer;

fn queries(c: &mut criterion::Criterion) {
    let config = common::workload();
    let (engine, baseline) = common::loaded_stores(&config);
    let stores: [&dyn BenchStore; 2] = [&engine, &baseline];
    let viewer = (0..)
        .map(|i| config.viewer(i))
        .find(|v| v.following.len() == 2000 || v.following.len() as u64 * 2 >= config.authors)
        .expect("viewers exist");
    let busiest = [config.author_id(0)];
    let full = Query {
        viewer_id: viewer.user_id,
        authors: &viewer.following,
        exclude: &[],
        max_results: MAX_POSTS_TO_RETURN,
    };
    let previous = engine.query(&full);
    let exclude = exclude_from_answer(&viewer, previous.iter().map(|p| p.post_id));

    let mut group = c.benchmark_group("single_author");
    for store in stores {
        let q = Query {
            viewer_id: viewer.user_id,
            authors: &busiest,
            exclude: &[],
            max_results: MAX_POSTS_TO_RETURN,
        };
        group.bench_function(BenchmarkId::from_parameter(store.name()), |b| {
            b.iter(|| black_box(store.query(black_box(&q))))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("follow_2000");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for store in stores {
        let q = Query {
            exclude: &exclude,
            ..full
        };
        group.bench_function(BenchmarkId::from_parameter(store.name()), |b| {
            b.iter(|| black_box(store.query(black_box(&q))))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("video_2000");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for store in stores {
        let q = Query {
            exclude: &exclude,
            max_results: MAX_VIDEOS_TO_RETURN,
            ..full
        };
        group.bench_function(BenchmarkId::from_parameter(store.name()), |b| {
            b.iter(|| black_box(store.query_videos(black_box(&q))))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = queries
}
criterion_main!(benches);
