//! `thunder-cli query --shards` against real thunder servers on loopback: a query over two
//! author shards, and the answer of the shard left when the other is gone.

use std::process::Command;
use std::sync::Arc;
use thunder_testbed::process::binary;

use thunder_engine::{ManualClock, PostStore};
use thunder_proto::shard::{ShardSpec, shard_of};
use thunder_testbed::{NOW, TestServer, original};

fn shard_store(spec: ShardSpec) -> Arc<PostStore> {
    Arc::new(
        PostStore::with_clock(
            thunder_engine::config::DEFAULT_RETENTION_SECS,
            Arc::new(ManualClock::new(NOW)),
        )
        .with_fact_directory(move |author| spec.owns(author)),
    )
}

/// The first `n` author ids (from 1) that shard `index` of 2 owns.
fn authors_of(index: u32, n: usize) -> Vec<i64> {
    (1..).filter(|&a| shard_of(a, 2) == index).take(n).collect()
}

fn cli_query(shards: &str, follow: &[i64]) -> std::process::Output {
    let follow: Vec<String> = follow.iter().map(i64::to_string).collect();
    Command::new(binary("thunder-cli"))
        .args(["query", "--user", "1", "--json", "--timeout-ms", "2000"])
        .args(["--follow", &follow.join(",")])
        .args(["--shards", shards])
        .output()
        .expect("run thunder-cli")
}

fn post_ids(stdout: &[u8]) -> Vec<i64> {
    let json: serde_json::Value = serde_json::from_slice(stdout).expect("JSON output");
    json["posts"]
        .as_array()
        .expect("posts")
        .iter()
        // The proto3 JSON mapping: lowerCamelCase, 64-bit integers as strings.
        .filter_map(|p| p["postId"].as_str()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_queries_author_shards_and_reports_a_missing_one() {
    let (on0, on1) = (authors_of(0, 2), authors_of(1, 2));
    // Shard 1's author replies to shard 0's post: shown only if the parent's facts are known.
    let parent = original(1, on0[0], 100);
    let mut reply = original(2, on1[0], 50);
    reply.is_reply = true;
    reply.in_reply_to_post_id = Some(1);
    reply.in_reply_to_user_id = Some(on0[0]);
    reply.conversation_id = Some(1);
    let events = [
        parent,
        reply,
        original(3, on0[1], 10),
        original(4, on1[1], 70),
    ];
    let s0 = TestServer::ready(shard_store(ShardSpec { index: 0, count: 2 })).await;
    let s1 = TestServer::ready(shard_store(ShardSpec { index: 1, count: 2 })).await;
    s0.store.insert_posts(&events);
    s1.store.insert_posts(&events);
    let follow = [on0[0], on0[1], on1[0], on1[1]];
    let shards = format!("{};{}", s0.running().grpc_addr(), s1.running().grpc_addr());
    let out = tokio::task::spawn_blocking(move || cli_query(&shards, &follow))
        .await
        .expect("cli");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(post_ids(&out.stdout), [3, 2, 4, 1]);

    // Shard 1 gone: shard 0's posts are printed, and the exit status says incomplete.
    let shards = format!("{};{}", s0.running().grpc_addr(), s1.running().grpc_addr());
    assert!(s1.shutdown().await);
    let out = tokio::task::spawn_blocking(move || cli_query(&shards, &follow))
        .await
        .expect("cli");
    assert!(!out.status.success());
    assert_eq!(post_ids(&out.stdout), [3, 1]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("incomplete answer: shard 1"), "{stderr}");
}
