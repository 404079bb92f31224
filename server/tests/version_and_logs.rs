//! What a replica says about itself: `--version` and `thunder_build_info` name the version and
//! the git commit, the start-up log line too; the log written to a file (what `kubectl logs`
//! shows) has no terminal escape codes, and `--log-format json` writes one JSON object a line
//! with the event's fields as keys.

use std::process::Command;

use thunder_server::version;
use thunder_testbed::server_process::ServerProcess;

/// The lines of a demo server's log up to its readiness, with `extra` flags.
async fn demo_log(extra: &[&str]) -> (String, ServerProcess) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("server.log");
    let mut args = vec!["--demo-scale", "1000", "--demo-events-per-sec", "0"];
    args.extend_from_slice(extra);
    let server = ServerProcess::start_logged(&args, thunder_testbed::PATIENCE, &log);
    let ready = thunder_testbed::eventually(|| async {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("ready: health SERVING"))
    })
    .await;
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(ready, "{text}");
    (text, server)
}

#[test]
fn version_prints_the_version_and_the_git_commit() {
    let output = Command::new(env!("CARGO_BIN_EXE_thunder-server"))
        .arg("--version")
        .output()
        .expect("run thunder-server");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.starts_with(&format!(
            "thunder-server {} (git {}",
            version::VERSION,
            version::GIT_SHA
        )),
        "{text}"
    );
    assert!(!version::GIT_SHA.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_written_to_a_file_has_no_escape_codes_and_names_the_build() {
    let (text, server) = demo_log(&[]).await;
    assert!(!text.contains('\u{1b}'), "escape codes in the log:\n{text}");
    let starting = text
        .lines()
        .find(|l| l.contains("thunder-server starting"))
        .unwrap_or_else(|| panic!("no start-up line in\n{text}"));
    assert!(
        starting.contains(&format!("git_sha=\"{}\"", version::GIT_SHA)),
        "{starting}"
    );
    assert!(
        starting.contains(&format!("version=\"{}\"", version::VERSION)),
        "{starting}"
    );

    let metrics = thunder_testbed::http_get(server.admin, "/metrics")
        .await
        .text();
    let info = metrics
        .lines()
        .find(|l| l.starts_with("thunder_build_info{"))
        .unwrap_or_else(|| panic!("no thunder_build_info in\n{metrics}"));
    assert!(info.ends_with("} 1"), "{info}");
    assert!(
        info.contains(&format!("git_sha=\"{}\"", version::GIT_SHA))
            && !info.contains("git_sha=\"\""),
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_a_line_with_the_fields_as_keys() {
    let (text, _server) = demo_log(&["--log-format", "json"]).await;
    let mut starting = None;
    for line in text.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: not JSON: {line}"));
        assert!(event.is_object(), "{line}");
        assert!(
            event["level"].is_string() && event["timestamp"].is_string(),
            "{line}"
        );
        if event["message"] == "thunder-server starting" {
            starting = Some(event);
        }
    }
    let starting = starting.unwrap_or_else(|| panic!("no start-up event in\n{text}"));
    assert_eq!(starting["git_sha"], version::GIT_SHA);
    assert_eq!(starting["version"], version::VERSION);
}
