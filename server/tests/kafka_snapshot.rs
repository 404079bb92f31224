//! Snapshots of a real `thunder-server` process against a real broker: a server taking
//! snapshots every second is killed with SIGKILL during live ingestion; a server restarted
//! from its newest snapshot (the newest one corrupted on purpose, so the one before is used)
//! resumes Kafka from the recorded offsets instead of replaying the topic, and answers exactly
//! like a server that replayed the topic from scratch, video requests included. Also: the
//! on-demand endpoint, `thunder-cli snapshot inspect`, and the snapshot at graceful shutdown.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use thunder_engine::PostEvent;
use thunder_engine::config::{MAX_POSTS_TO_RETURN, MAX_VIDEOS_TO_RETURN};
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_testbed::kafka::*;
use thunder_testbed::metrics::in_text;
use thunder_testbed::process::binary;
use thunder_testbed::server_process::{ServerProcess, answers, ask, start_server, wait_serving};
use thunder_testkit::model::answers_agree;

/// Longer than the backlog's two days, so no post sits at the retention edge while the two
/// servers are asked seconds apart.
const RETENTION_SECS: i64 = 3 * 24 * 3600;

fn snapshots_in(dir: &Path) -> Vec<PathBuf> {
    thunder_server::snapshot::list(dir).expect("list the snapshot dir")
}

/// The value of an unlabelled metric in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    in_text(text, name, &[]).unwrap_or_else(|| panic!("metric {name} missing"))
}

fn inspect(file: &Path) -> (bool, String) {
    let out = Command::new(binary("thunder-cli"))
        .args(["snapshot", "inspect"])
        .arg(file)
        .output()
        .expect("run thunder-cli");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

async fn metrics_of(server: &ServerProcess) -> String {
    thunder_testbed::http_get(server.admin, "/metrics")
        .await
        .text()
}

#[test]
fn restart_from_a_snapshot_after_kill_9_answers_like_a_full_replay() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "snapshots";
    create_topic(&broker.bootstrap(), topic, 4);
    let (config, events) = order_free_backlog(3000, now);
    let total = events.len() as u64;
    assert!((3000..12_000).contains(&total), "{total} events");
    let (backlog, live) = events.split_at(events.len() / 2);
    let producer = producer(&broker.bootstrap(), topic);
    for event in backlog {
        send(&producer, event);
    }
    flush(&producer, backlog.len() as u64);

    let dir = tempfile::tempdir().expect("temp dir");
    let dir_arg = dir.path().to_str().expect("utf-8 temp dir").to_owned();
    let snapshot_flags = ["--snapshot-dir", &dir_arg, "--snapshot-interval-secs", "1"];
    let runtime = tokio::runtime::Runtime::new().expect("runtime");

    // 1. A server with snapshots every second, fed the backlog, then live events; killed with
    //    SIGKILL while the live events still arrive.
    let mut first = start_server(&broker.bootstrap(), topic, RETENTION_SECS, &snapshot_flags);
    runtime.block_on(async {
        wait_serving(first.grpc).await;
        let taken = thunder_testbed::admin_post(first.admin, "/admin/snapshot").await;
        assert_eq!(taken.status, 200, "{}", taken.text());
        assert!(taken.text().contains("\"posts\""), "{}", taken.text());
    });
    let sent = std::thread::scope(|scope| {
        let sender = scope.spawn(|| {
            for (i, event) in live.iter().enumerate() {
                send(&producer, event);
                if i % 20 == 0 {
                    producer.flush(Duration::from_secs(10)).expect("flush");
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        // Long enough for periodic snapshots during live ingestion, short of the whole stream.
        std::thread::sleep(Duration::from_millis(2500));
        first.child.kill().expect("SIGKILL");
        let _ = first.child.wait();
        sender.join().expect("sender");
        flush(&producer, total);
        total
    });
    assert_eq!(sent, total);

    // 2. The snapshots left behind: the newest is corrupted on purpose; inspect tells.
    // Two are kept; a SIGKILL between a new snapshot's rename and the pruning of the oldest
    // leaves a third (the next snapshot prunes it). Newest first.
    let files = snapshots_in(dir.path());
    assert!(
        (2..=3).contains(&files.len()),
        "two snapshots kept (three if killed while pruning): {files:?}"
    );
    let (ok, report) = inspect(&files[1]);
    assert!(ok, "{report}");
    assert!(report.contains("checksums:       OK"), "{report}");
    assert!(
        report.contains(&format!("source:          {topic}")),
        "{report}"
    );
    let mut bytes = std::fs::read(&files[0]).expect("read newest");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&files[0], bytes).expect("corrupt newest");
    let (ok, report) = inspect(&files[0]);
    assert!(!ok, "a corrupt file passed inspect: {report}");
    assert!(report.contains("INVALID"), "{report}");

    // 3. One server restarts from the snapshots, one replays the topic from scratch.
    // No periodic snapshots here, so the one at shutdown is the only new one.
    let restart_flags = ["--snapshot-dir", &dir_arg, "--snapshot-interval-secs", "0"];
    let restarted = start_server(&broker.bootstrap(), topic, RETENTION_SECS, &restart_flags);
    let replayed = start_server(&broker.bootstrap(), topic, RETENTION_SECS, &[]);
    let viewers = viewers_for(&config, 30, &events);
    runtime.block_on(async {
        wait_serving(restarted.grpc).await;
        wait_serving(replayed.grpc).await;
        let metrics = metrics_of(&restarted).await;
        let loaded = metric(&metrics, "snapshot_loaded_posts");
        assert!(loaded > 0.0, "nothing loaded from the snapshot");
        assert!(metric(&metrics, "snapshot_load_seconds") > 0.0);
        // Served from the base it mapped: its size, posts and offsets are shown.
        assert!(metric(&metrics, "snapshot_base_bytes") > 0.0);
        assert!(metric(&metrics, "snapshot_base_posts") > 0.0);
        assert!(in_text(&metrics, "snapshot_base_offset", &[("partition", "0")]).is_some());
        let status = thunder_testbed::http_get(restarted.admin, "/").await.text();
        assert!(status.contains("id=\"snapshot-base\">"), "{status}");
        assert!(!status.contains("built by replay"), "{status}");
        // Resumed at the recorded offsets: it read only what came after the snapshot.
        let consumed = metric(&metrics, "kafka_messages_consumed_total");
        assert!(
            consumed < total as f64,
            "the restarted server read {consumed} of {total} records: it replayed the topic"
        );
        assert_eq!(
            metric(
                &metrics_of(&replayed).await,
                "kafka_messages_consumed_total"
            ),
            total as f64
        );

        // Both have applied everything once SERVING (the catch-up rule); compare.
        let connect = |server: &ServerProcess| {
            InNetworkPostsServiceClient::connect(format!("http://{}", server.grpc))
        };
        let mut from_snapshot = connect(&restarted).await.expect("connect");
        let mut from_scratch = connect(&replayed).await.expect("connect");
        let mut compared = 0;
        for (viewer, following) in &viewers {
            for video in [false, true] {
                let got = ask(&mut from_snapshot, *viewer, following, video).await;
                let want = ask(&mut from_scratch, *viewer, following, video).await;
                let max_results = if video {
                    MAX_VIDEOS_TO_RETURN
                } else {
                    MAX_POSTS_TO_RETURN
                };
                if let Err(diff) = answers_agree(&got, &want, max_results) {
                    panic!("viewer {viewer} (video {video}): restarted vs replayed: {diff}");
                }
                compared += usize::from(!want.is_empty());
            }
        }
        assert!(compared >= 20, "only {compared} non-empty answers compared");
        let videos = events
            .iter()
            .filter(|e| matches!(e, PostEvent::Create(p) if p.has_video))
            .count();
        assert!(videos > 0, "the workload has no videos");
    });

    // 4. SIGTERM: the restarted server writes a final snapshot before it exits.
    let before = snapshots_in(dir.path());
    let mut restarted = restarted;
    let status = Command::new("kill")
        .args(["-TERM", &restarted.child.id().to_string()])
        .status()
        .expect("send SIGTERM");
    assert!(status.success());
    let deadline = Instant::now() + TIMEOUT;
    let exit = loop {
        if let Some(exit) = restarted.child.try_wait().expect("wait") {
            break exit;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "exit status {exit}");
    let after = snapshots_in(dir.path());
    assert_ne!(after[0], before[0], "no snapshot written at shutdown");
    let (ok, report) = inspect(&after[0]);
    assert!(ok, "{report}");
}

/// An author shard (`--shard 0/2`) restarted after SIGKILL from the snapshot it wrote answers
/// exactly as it did before (its authors' posts and its facts of the other shard's posts, which
/// decide reply visibility and repost video eligibility, are restored); a server of another
/// shard (`--shard 1/2`) pointed at the same directory skips that snapshot and replays.
#[test]
fn a_shard_restarts_from_its_own_snapshot_and_answers_like_before() {
    let now = now_secs();
    let broker = Broker::start();
    let topic = "shard_snapshots";
    create_topic(&broker.bootstrap(), topic, 2);
    let (config, events) = order_free_backlog(3000, now);
    let total = events.len() as u64;
    let producer = producer(&broker.bootstrap(), topic);
    for event in &events {
        send(&producer, event);
    }
    flush(&producer, total);

    let dir = tempfile::tempdir().expect("temp dir");
    let dir_arg = dir.path().to_str().expect("utf-8 temp dir").to_owned();
    let flags = |shard: &'static str| {
        [
            "--snapshot-dir",
            dir_arg.as_str(),
            "--snapshot-interval-secs",
            "0",
            "--shard",
            shard,
        ]
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let viewers = viewers_for(&config, 30, &events);

    let first = start_server(&broker.bootstrap(), topic, RETENTION_SECS, &flags("0/2"));
    let before = runtime.block_on(async {
        wait_serving(first.grpc).await;
        let taken = thunder_testbed::admin_post(first.admin, "/admin/snapshot").await;
        assert_eq!(taken.status, 200, "{}", taken.text());
        answers(first.grpc, &viewers).await
    });
    drop(first); // SIGKILL: no snapshot at shutdown.
    let files = snapshots_in(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let (ok, report) = inspect(&files[0]);
    assert!(ok, "{report}");
    assert!(report.contains("author shard:    0/2"), "{report}");

    let other = start_server(&broker.bootstrap(), topic, RETENTION_SECS, &flags("1/2"));
    runtime.block_on(async {
        wait_serving(other.grpc).await;
        let metrics = metrics_of(&other).await;
        assert_eq!(metric(&metrics, "snapshot_loaded_posts"), 0.0);
        assert_eq!(
            metric(&metrics, "kafka_messages_consumed_total"),
            total as f64,
            "shard 1/2 must replay the topic, not load shard 0/2's snapshot"
        );
    });
    drop(other);

    let restarted = start_server(&broker.bootstrap(), topic, RETENTION_SECS, &flags("0/2"));
    runtime.block_on(async {
        wait_serving(restarted.grpc).await;
        let metrics = metrics_of(&restarted).await;
        assert!(metric(&metrics, "snapshot_loaded_posts") > 0.0);
        assert!(
            metric(&metrics, "kafka_messages_consumed_total") < total as f64,
            "the restarted shard replayed the topic"
        );
        let after = answers(restarted.grpc, &viewers).await;
        let mut compared = 0;
        for (i, (got, want)) in after.iter().zip(&before).enumerate() {
            let max_results = if i % 2 == 1 {
                MAX_VIDEOS_TO_RETURN
            } else {
                MAX_POSTS_TO_RETURN
            };
            if let Err(diff) = answers_agree(got, want, max_results) {
                panic!("answer {i}: restarted shard vs before: {diff}");
            }
            compared += usize::from(!want.is_empty());
        }
        assert!(compared >= 20, "only {compared} non-empty answers compared");
    });
}
