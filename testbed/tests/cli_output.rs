//! What `thunder-cli query` writes to standard output as a user's shell sees it: a reader that
//! goes away early (`| head -1`) ends the command quietly instead of a panic with exit status
//! 101.

use std::process::Command;

use thunder_testbed::process::binary;
use thunder_testbed::{TestServer, original, store};

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
