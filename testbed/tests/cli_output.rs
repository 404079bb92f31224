//! What `thunder-cli query` and `explain` write to standard output as a user's shell sees it:
//! the JSON of `query` is the answer in the proto3 JSON mapping (what grpcurl prints), read
//! back into the generated type; a reader that goes away early (`| head -1`) ends the command
//! quietly instead of a panic with exit status 101; `explain` names each rule and its figures,
//! in words and as the proto3 JSON.

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

/// Runs `thunder-cli ARGS` on a blocking thread; its standard output (the command must succeed).
async fn cli(args: Vec<String>) -> String {
    let output = tokio::task::spawn_blocking(move || {
        Command::new(binary("thunder-cli"))
            .args(&args)
            .output()
            .expect("run thunder-cli")
    })
    .await
    .expect("joined");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_the_rule_and_its_figures() {
    // Author 7 has 55 originals: the 5 oldest are past the cap of 50 per author.
    let store = store();
    let posts: Vec<_> = (1..=55).map(|i| original(i, 7, 1000 - i)).collect();
    store.insert_posts(&posts);
    store.insert_posts(&[original(100, 8, 10)]);
    store.mark_as_deleted(&[thunder_engine::DeleteEvent {
        post_id: 100,
        deleted_at: thunder_testbed::NOW,
    }]);
    let server = TestServer::ready(store).await;
    let args = |json: bool| {
        let mut args: Vec<String> = [
            "explain",
            "--addr",
            &server.grpc_url(),
            "--user",
            "1",
            "--follow",
            "7,8",
            "--post",
            "55",
            "--post",
            "2,999,100",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if json {
            args.push("--json".into());
        }
        args
    };
    let text = cli(args(false)).await;
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("viewer 1: 2 followed authors, max_results 1200, 50 returned"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("55  returned at position 1 of 50  [stored: author 7, original"),
        "{text}"
    );
    assert!(
        lines[2].starts_with(
            "2  per-author cap: 50 originals per author came first (53 newer entries)"
        ),
        "{text}"
    );
    assert!(lines[3].starts_with("999  never seen"), "{text}");
    assert!(lines[4].starts_with("100  deleted  [deleted]"), "{text}");

    // The JSON is the proto3 mapping (what grpcurl prints), and reads back as the message.
    let json = cli(args(true)).await;
    let response: thunder_proto::ExplainPostResponse =
        serde_json::from_str(&json).expect("the proto3 JSON of ExplainPostResponse");
    let reasons: Vec<_> = response
        .posts
        .iter()
        .map(|p| p.verdict.unwrap_or_default().reason())
        .collect();
    use thunder_proto::Reason;
    assert_eq!(
        reasons,
        [
            Reason::Returned,
            Reason::PerAuthorCap,
            Reason::NeverSeen,
            Reason::Deleted
        ]
    );
    assert!(
        json.contains("\"reason\": \"REASON_PER_AUTHOR_CAP\""),
        "{json}"
    );
    assert!(json.contains("\"postId\": \"55\""), "{json}");
}
