//! Read-path micro-benchmarks, engine vs baseline on the feed-2d backlog:
//! one busy author (a timeline scan), a 2000-author feed query and a 2000-author video query.
//!
//! `cargo bench -p thunder-benches --bench query` (`THUNDER_BENCH_SCALE=10` for a larger store;
//! add `-- --profile-time 10` for a flamegraph per benchmark).

mod common;

use criterion::{BenchmarkId, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;
use thunder_engine::config::{MAX_POSTS_TO_RETURN, MAX_VIDEOS_TO_RETURN};
use thunder_engine::{FeedQuery, Store};
use thunder_workload::exclude_from_answer;

fn queries(c: &mut criterion::Criterion) {
    let config = common::workload();
    let (engine, baseline) = common::loaded_stores(&config);
    let stores: [&dyn Store; 2] = [&engine, &baseline];
    let viewer = (0..)
        .map(|i| config.viewer(i))
        .find(|v| v.following.len() == 2000 || v.following.len() as u64 * 2 >= config.authors)
        .expect("viewers exist");
    let busiest = [config.author_id(0)];
    let full = FeedQuery {
        max_results: MAX_POSTS_TO_RETURN,
        ..FeedQuery::new(viewer.user_id, &viewer.following)
    };
    let previous = engine.get_all_posts_by_users(&full).posts;
    let exclude = exclude_from_answer(&viewer, previous.iter().map(|p| p.post_id));

    let mut group = c.benchmark_group("single_author");
    for store in stores {
        let q = FeedQuery {
            max_results: MAX_POSTS_TO_RETURN,
            ..FeedQuery::new(viewer.user_id, &busiest)
        };
        group.bench_function(BenchmarkId::from_parameter(store.name()), |b| {
            b.iter(|| black_box(store.get_all_posts_by_users(black_box(&q)).posts))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("follow_2000");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for store in stores {
        let q = FeedQuery {
            exclude: &exclude,
            ..full.clone()
        };
        group.bench_function(BenchmarkId::from_parameter(store.name()), |b| {
            b.iter(|| black_box(store.get_all_posts_by_users(black_box(&q)).posts))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("video_2000");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for store in stores {
        let q = FeedQuery {
            exclude: &exclude,
            max_results: MAX_VIDEOS_TO_RETURN,
            ..full.clone()
        };
        group.bench_function(BenchmarkId::from_parameter(store.name()), |b| {
            b.iter(|| black_box(store.get_videos_by_users(black_box(&q)).posts))
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
