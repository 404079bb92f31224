//! The contract extensions over real gRPC: cursor paging, time bounds, the seen filter and
//! their INVALID_ARGUMENT paths.

use std::sync::Arc;

use thunder_engine::{LightPost, ManualClock, PostStore, SeenFilter};
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_proto::{
    GetInNetworkPostsRequest, PerAuthorLimits, SeenFilter as WireSeenFilter, SeenFilterFormat,
};
use thunder_testbed::{NOW, TestServer, original, request, store};
use tonic::transport::Channel;

/// 40 authors with 0..60 posts each, many sharing a `created_at` (ties across authors and
/// within one author), replies and reposts among them.
fn posts() -> Vec<LightPost> {
    let mut posts = Vec::new();
    for author in 1..=40i64 {
        for i in 0..(author * 7 % 61) {
            let mut post = original(author * 1000 + i, author, (i / 3) * 60 + author % 4);
            if i % 5 == 4 {
                post.is_retweet = true;
                post.source_post_id = Some(author * 1000);
                post.source_user_id = Some(author);
            }
            posts.push(post);
        }
    }
    posts
}

fn authors() -> Vec<u64> {
    (1..=40).collect()
}

async fn all_pages(
    client: &mut InNetworkPostsServiceClient<Channel>,
    mut req: GetInNetworkPostsRequest,
) -> Vec<Vec<i64>> {
    let mut pages = Vec::new();
    loop {
        let response = client
            .get_in_network_posts(req.clone())
            .await
            .expect("served")
            .into_inner();
        pages.push(response.posts.iter().map(|p| p.post_id).collect());
        if response.next_cursor.is_empty() {
            return pages;
        }
        assert!(pages.len() < 10_000, "paging does not end");
        req.cursor = response.next_cursor;
    }
}

async fn ids(
    client: &mut InNetworkPostsServiceClient<Channel>,
    req: GetInNetworkPostsRequest,
) -> Vec<i64> {
    let response = client
        .get_in_network_posts(req)
        .await
        .expect("served")
        .into_inner();
    response.posts.iter().map(|p| p.post_id).collect()
}

fn limits(originals: u32, secondary: u32) -> Option<PerAuthorLimits> {
    Some(PerAuthorLimits {
        max_posts_per_author: Some(originals),
        max_replies_reposts_per_author: Some(secondary),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_concatenate_to_the_one_big_answer() {
    let store = store();
    store.insert_posts(&posts());
    let server = TestServer::ready(store).await;
    let mut client = server.client().await;
    for (per_author, video) in [(None, false), (limits(7, 2), false), (None, true)] {
        let whole = GetInNetworkPostsRequest {
            max_results: 10_000,
            per_author_limits: per_author,
            is_video_request: video,
            ..request(&authors())
        };
        let whole_ids = ids(&mut client, whole.clone()).await;
        assert!(whole_ids.len() > 20 || video, "{}", whole_ids.len());
        for page_size in [1u32, 7, 50] {
            let pages = all_pages(
                &mut client,
                GetInNetworkPostsRequest {
                    max_results: page_size,
                    ..whole.clone()
                },
            )
            .await;
            assert!(pages.iter().all(|p| p.len() <= page_size as usize));
            assert!(
                pages[..pages.len() - 1]
                    .iter()
                    .all(|p| p.len() == page_size as usize)
            );
            assert_eq!(pages.concat(), whole_ids, "page size {page_size}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_arrivals_never_shift_or_repeat_later_pages() {
    let clock = Arc::new(ManualClock::new(NOW));
    let store = Arc::new(PostStore::with_clock(
        thunder_engine::config::DEFAULT_RETENTION_SECS,
        clock.clone(),
    ));
    store.insert_posts(&posts());
    let quiet = Arc::new(PostStore::with_clock(
        thunder_engine::config::DEFAULT_RETENTION_SECS,
        clock.clone(),
    ));
    quiet.insert_posts(&posts());
    let busy_server = TestServer::ready(Arc::clone(&store)).await;
    let quiet_server = TestServer::ready(quiet).await;
    let mut busy = busy_server.client().await;
    let mut calm = quiet_server.client().await;
    let first = GetInNetworkPostsRequest {
        max_results: 25,
        per_author_limits: limits(10, 3),
        ..request(&authors())
    };
    let page1 = busy
        .get_in_network_posts(first.clone())
        .await
        .expect("served")
        .into_inner();
    // Meanwhile time passes and every author posts again, which would push their oldest post
    // out of the 10-per-author window.
    clock.advance(120);
    let mut arrivals: Vec<LightPost> = (1..=40)
        .map(|a| LightPost::original(900_000 + a, a, NOW + 60))
        .collect();
    arrivals.push(LightPost::original(999_999, 3, NOW + 120));
    assert_eq!(store.insert_posts(&arrivals).inserted, arrivals.len());

    let rest_busy = all_pages(
        &mut busy,
        GetInNetworkPostsRequest {
            cursor: page1.next_cursor.clone(),
            ..first.clone()
        },
    )
    .await;
    let rest_calm = all_pages(
        &mut calm,
        GetInNetworkPostsRequest {
            cursor: page1.next_cursor.clone(),
            ..first.clone()
        },
    )
    .await;
    assert_eq!(rest_busy, rest_calm);
    let mut seen: Vec<i64> = page1.posts.iter().map(|p| p.post_id).collect();
    seen.extend(rest_busy.concat());
    let unique: std::collections::HashSet<i64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "a post was repeated");
    assert!(
        seen.iter().all(|&id| id < 900_000),
        "an arrival leaked into a later page"
    );
    // A new first page does see the arrivals.
    assert!(ids(&mut busy, first).await.contains(&999_999));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_bounds_treat_posts_outside_as_absent() {
    let store = store();
    // Author 1: posts aged 0..100 minutes, one a minute.
    let posts: Vec<LightPost> = (0..100).map(|i| original(100 + i, 1, i * 60)).collect();
    store.insert_posts(&posts);
    let server = TestServer::ready(store).await;
    let mut client = server.client().await;
    let bounded = GetInNetworkPostsRequest {
        min_created_at: Some(NOW - 50 * 60),
        max_created_at: Some(NOW - 10 * 60),
        ..request(&[1])
    };
    // 50 originals per author, counted inside the window: ages 10..=50 minutes.
    let got = ids(&mut client, bounded.clone()).await;
    assert_eq!(got, (110..=150).collect::<Vec<_>>());
    let capped = GetInNetworkPostsRequest {
        max_created_at: Some(NOW - 30 * 60),
        ..request(&[1])
    };
    assert_eq!(
        ids(&mut client, capped).await,
        (130..180).collect::<Vec<_>>()
    );
    let inverted = GetInNetworkPostsRequest {
        min_created_at: Some(NOW),
        max_created_at: Some(NOW - 1),
        ..request(&[1])
    };
    let status = client
        .get_in_network_posts(inverted)
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("min_created_at"),
        "{}",
        status.message()
    );
}

fn wire(filter: &SeenFilter) -> WireSeenFilter {
    WireSeenFilter {
        format: SeenFilterFormat::SplitBlockXxh64.into(),
        seed: filter.seed(),
        num_blocks: filter.num_blocks(),
        bits: filter.to_bytes(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seen_filter_skips_like_exclude_and_combines_with_it() {
    let store = store();
    let all = posts();
    store.insert_posts(&all);
    let server = TestServer::ready(store).await;
    let mut client = server.client().await;
    let base = GetInNetworkPostsRequest {
        max_results: 10_000,
        ..request(&authors())
    };
    let before = ids(&mut client, base.clone()).await;
    let seen_ids: Vec<i64> = before.iter().copied().step_by(3).collect();
    let excluded: Vec<u64> = before
        .iter()
        .skip(1)
        .step_by(7)
        .map(|&id| id as u64)
        .collect();
    let filter = SeenFilter::from_ids(&seen_ids, 0x5eed);
    // The filter answers for every stored post: seen ones, and a false positive or two.
    let skipped: Vec<i64> = all
        .iter()
        .map(|p| p.post_id)
        .filter(|&id| filter.contains(id) || excluded.contains(&(id as u64)))
        .collect();
    let with_filter = ids(
        &mut client,
        GetInNetworkPostsRequest {
            seen_filter: Some(wire(&filter)),
            exclude_tweet_ids: excluded.clone(),
            ..base.clone()
        },
    )
    .await;
    let as_list = ids(
        &mut client,
        GetInNetworkPostsRequest {
            exclude_tweet_ids: skipped.iter().map(|&id| id as u64).collect(),
            ..base
        },
    )
    .await;
    assert_eq!(with_filter, as_list);
    assert!(with_filter.iter().all(|id| !seen_ids.contains(id)));
    assert!(with_filter.iter().all(|id| !skipped.contains(id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_filters_and_cursors_are_invalid_arguments() {
    let store = store();
    store.insert_posts(&posts());
    let server = TestServer::ready(store).await;
    let mut client = server.client().await;
    let page = client
        .get_in_network_posts(GetInNetworkPostsRequest {
            max_results: 5,
            ..request(&authors())
        })
        .await
        .expect("served")
        .into_inner();
    assert!(!page.next_cursor.is_empty());
    let mut altered = page.next_cursor.clone();
    altered[12] ^= 0x40;
    let bad_filter = |format: i32, num_blocks: u32, bytes: usize| WireSeenFilter {
        format,
        seed: 1,
        num_blocks,
        bits: vec![0; bytes],
    };
    let cases = [
        (
            "cursor",
            GetInNetworkPostsRequest {
                cursor: altered,
                ..request(&[1])
            },
        ),
        (
            "cursor",
            GetInNetworkPostsRequest {
                cursor: page.next_cursor[..20].to_vec(),
                ..request(&[1])
            },
        ),
        (
            "seen_filter",
            GetInNetworkPostsRequest {
                seen_filter: Some(bad_filter(7, 1, 32)),
                ..request(&[1])
            },
        ),
        (
            "seen_filter",
            GetInNetworkPostsRequest {
                seen_filter: Some(bad_filter(1, 2, 32)),
                ..request(&[1])
            },
        ),
        (
            "seen_filter",
            GetInNetworkPostsRequest {
                seen_filter: Some(bad_filter(1, 0, 0)),
                ..request(&[1])
            },
        ),
        (
            "seen_filter",
            GetInNetworkPostsRequest {
                seen_filter: Some(bad_filter(1, 32_769, 32_769 * 32)),
                ..request(&[1])
            },
        ),
    ];
    for (field, req) in cases {
        let status = client.get_in_network_posts(req).await.expect_err("refused");
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{}",
            status.message()
        );
        assert!(status.message().starts_with(field), "{}", status.message());
    }
    // The untouched cursor is still good.
    let next = client
        .get_in_network_posts(GetInNetworkPostsRequest {
            max_results: 5,
            cursor: page.next_cursor,
            ..request(&authors())
        })
        .await
        .expect("served")
        .into_inner();
    assert_eq!(next.posts.len(), 5);
}
