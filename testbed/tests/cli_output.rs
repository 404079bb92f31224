//! What `thunder-cli query` writes to standard output as a user's shell sees it: its JSON is
//! the answer in the proto3 JSON mapping (what grpcurl prints), read back into the generated
//! type; a reader that goes away early (`| head -1`) ends the command quietly instead of a
//! panic with exit status 101.

use std::process::Command;

use thunder_proto::GetInNetworkPostsResponse;
use thunder_testbed::process::binary;
use thunder_testbed::{TestServer, original, request, store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_is_the_answer_in_the_proto3_mapping() {
    let store = store();
    let mut reply = original(11, 2, 30);
    reply.is_reply = true;
    reply.in_reply_to_post_id = Some(10);
    reply.in_reply_to_user_id = Some(1);
    store.insert_posts(&[original(10, 1, 60), reply]);
    let server = TestServer::ready(store).await;
    let command = binary("thunder-cli");
    let addr = server.grpc_url();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(command)
            .args([
                "query", "--addr", &addr, "--user", "1", "--follow", "1,2", "--json",
            ])
            .output()
            .expect("run thunder-cli")
    })
    .await
    .expect("joined");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    // 64-bit integers as strings, lowerCamelCase names, defaults left out.
    assert!(text.contains("\"postId\": \"11\""), "{text}");
    assert!(text.contains("\"inReplyToPostId\": \"10\""), "{text}");
    assert!(!text.contains("isRetweet"), "{text}");
    let printed: GetInNetworkPostsResponse = serde_json::from_str(&text).expect("the mapping");
    let mut client = server.client().await;
    let answer = client
        .get_in_network_posts(request(&[1, 2]))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(printed.posts, answer.posts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_the_query_quietly() {
    // 1000 authors with a post each: the JSON answer is several hundred KiB, far more than a
    // pipe holds, so the command is still writing when `head` exits.
    let store = store();
    let posts: Vec<_> = (1..=1000).map(|a| original(a, a, 60 + a)).collect();
    store.insert_posts(&posts);
    let server = TestServer::ready(store).await;
    let follow: Vec<String> = (1..=1000).map(|a: i64| a.to_string()).collect();
    let command = format!(
        "set -o pipefail; '{}' query --addr {} --user 1 --max-results 1000 --json --follow {} | head -1",
        binary("thunder-cli").display(),
        server.grpc_url(),
        follow.join(",")
    );
    let output = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .args(["-c", &command])
            .output()
            .expect("run bash")
    })
    .await
    .expect("joined");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "{\n");
}
