//! The status page at `GET /` of the admin port: a `thunder-server --demo` process is asked
//! for it after it served some queries, as HTML (fields checked in the markup) and in a real
//! headless Chromium (fields checked in the rendered DOM, and a screenshot taken). The
//! Chromium test needs Debian's `chromium`; without it, it is skipped with a loud message,
//! unless `THUNDER_REQUIRE_CHROMIUM` is set (scripts/test.sh installs it and sets that).
//! `THUNDER_STATUS_SCREENSHOT=path` keeps the screenshot there (docs/status-page.png).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use thunder_proto::GetInNetworkPostsRequest;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::ServerOptions;
use thunder_testbed::server_process::ServerProcess;
use thunder_testbed::{TestServer, store};

/// Demo scale of the process: 1000 authors, 20 000 posts.
const SCALE: u32 = 1000;

/// A `thunder-server --demo` process, ready, that answered `queries` feed queries.
async fn demo_server(queries: usize) -> ServerProcess {
    let server = ServerProcess::demo(&["--demo-scale", &SCALE.to_string()]).await;
    let mut client = InNetworkPostsServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .expect("connect");
    let viewers = thunder_server::demo::workload(SCALE, 0).viewers(queries.max(1));
    for viewer in viewers.iter().cycle().take(queries) {
        let request = GetInNetworkPostsRequest {
            user_id: viewer.user_id as u64,
            following_user_ids: viewer.following.iter().map(|&a| a as u64).collect(),
            ..Default::default()
        };
        client.get_in_network_posts(request).await.expect("served");
    }
    // The page's answers per second are those of the last 10 s: keep a trickle of calls
    // going while the tests read it (the task ends with the test's runtime).
    let trickle = viewers.first().cloned();
    tokio::spawn(async move {
        let Some(viewer) = trickle else { return };
        loop {
            let request = GetInNetworkPostsRequest {
                user_id: viewer.user_id as u64,
                following_user_ids: viewer.following.iter().map(|&a| a as u64).collect(),
                ..Default::default()
            };
            // The server may be gone at the end of the test.
            let _ = client.get_in_network_posts(request).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // The store gauges the page reads are refreshed every few seconds (one refresh may
    // have run while the backlog was loading).
    let refreshed = thunder_testbed::eventually(|| async {
        let page = thunder_testbed::http_get(server.admin, "/").await.text();
        count(&page, "posts") >= 10_000
    })
    .await;
    assert!(refreshed, "the store gauges never showed the backlog");
    server
}

/// The status page's address.
fn url(server: &ServerProcess) -> String {
    format!("http://{}/", server.admin)
}

/// The text of the element with `id` in `html` (tags inside it removed).
fn field(html: &str, id: &str) -> String {
    let marker = format!("id=\"{id}\"");
    let start = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no element {id} in {html}"));
    let open_end = start + html[start..].find('>').expect("tag end") + 1;
    let mut depth = 0usize;
    let mut text = String::new();
    let mut rest = &html[open_end..];
    while let Some(lt) = rest.find('<') {
        text.push_str(&rest[..lt]);
        let gt = rest[lt..].find('>').expect("tag end") + lt;
        let tag = &rest[lt + 1..gt];
        if tag.starts_with('/') {
            if depth == 0 {
                break;
            }
            depth -= 1;
        } else if !tag.ends_with('/') && !tag.starts_with("br") {
            depth += 1;
        }
        rest = &rest[gt + 1..];
    }
    text.trim().to_owned()
}

/// A count as the page prints it (`12 345`).
fn count(html: &str, id: &str) -> u64 {
    let text = field(html, id);
    text.replace([' ', '\u{a0}'], "")
        .parse()
        .unwrap_or_else(|_| panic!("{id}: {text:?} is not a count"))
}

/// What both tests check in the page (server markup or Chromium's DOM).
fn assert_demo_fields(html: &str, queries: u64) {
    assert_eq!(field(html, "ready"), "READY");
    assert!(
        field(html, "ready-reason").contains("caught up"),
        "{}",
        field(html, "ready-reason")
    );
    assert!(
        field(html, "source").contains("demo: synthetic feed-2d workload (scale 1000"),
        "{}",
        field(html, "source")
    );
    // 20 000 posts were loaded; live creates and deletes and trimming move it a little.
    let posts = count(html, "posts");
    assert!((10_000..=40_000).contains(&posts), "{posts} posts");
    assert!(count(html, "authors") >= 100, "{}", field(html, "authors"));
    let bytes = field(html, "bytes");
    for structure in [
        "post_store_arena_bytes{kind=reserved}",
        "post_store_arena_bytes{kind=used}",
        "post_store_timeline_bytes",
    ] {
        assert!(
            bytes.contains(structure),
            "{structure} missing from {bytes}"
        );
    }
    assert!(
        field(html, "bytes-per-post").ends_with('B'),
        "{}",
        field(html, "bytes-per-post")
    );
    // The queries above were answered within the last minute.
    let statuses = field(html, "statuses");
    let ok: u64 = statuses
        .split(", ")
        .find_map(|s| s.strip_prefix("ok: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no ok count in {statuses:?}"));
    assert!(ok >= queries, "{ok} ok answers, {queries} asked");
    let per_sec: f64 = field(html, "answers-per-sec").parse().expect("a rate");
    assert!(per_sec > 0.0, "{per_sec}");
    // What runs: the version and commit, its resident memory, what the admin port allows.
    assert_eq!(field(html, "version"), thunder_server::version::VERSION);
    assert_eq!(field(html, "git-sha"), thunder_server::version::short_sha());
    let rss = field(html, "rss");
    assert!(rss.ends_with("MiB") || rss.ends_with("GiB"), "{rss}");
    assert!(
        field(html, "admin-mode").contains("loopback"),
        "{}",
        field(html, "admin-mode")
    );
    for id in ["latency-p50", "latency-p99"] {
        assert!(field(html, id).ends_with("ms"), "{id}: {}", field(html, id));
    }
    assert!(
        field(html, "degrade").starts_with("highest "),
        "{}",
        field(html, "degrade")
    );
    assert_eq!(field(html, "snapshot-age"), "none written yet");
    assert_eq!(
        field(html, "snapshot-base"),
        "none (the store was built by replay)"
    );
    assert!(field(html, "partitions").starts_with("no Kafka partitions"));
    for (id, href) in [
        ("link-metrics", "/metrics"),
        ("link-flamegraph", "/debug/pprof/flamegraph"),
        ("link-readyz", "/readyz"),
    ] {
        let at = html.find(&format!("id=\"{id}\"")).expect(id);
        let tag_end = at + html[at..].find('>').expect("tag end");
        assert!(
            html[at..tag_end].contains(&format!("href=\"{href}")),
            "{id}: {}",
            &html[at..tag_end]
        );
    }
    let endpoints = field(html, "endpoints");
    for path in ["/metrics", "/healthz", "/readyz", "/admin/snapshot"] {
        assert!(endpoints.contains(path), "{path} missing from {endpoints}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_demo_server() {
    let server = demo_server(20).await;
    let page = thunder_testbed::http_get(server.admin, "/").await;
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .is_some_and(|v| v.starts_with("text/html")),
        "{:?}",
        page.header("content-type")
    );
    let html = page.text();
    assert!(html.contains("<meta http-equiv=\"refresh\""), "{html}");
    assert_demo_fields(&html, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_says_why_it_is_not_ready_and_escapes_what_it_shows() {
    let server = TestServer::start(ServerOptions::default(), store(), None).await;
    let readiness = server.running().readiness().clone();
    readiness.set_source("<script>alert('x')</script> & co");
    let html = server.admin_get("/").await.text();
    assert_eq!(field(&html, "ready"), "NOT READY");
    assert!(
        field(&html, "ready-reason").contains("catching up"),
        "{}",
        field(&html, "ready-reason")
    );
    assert!(!html.contains("<script>"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co"),
        "{html}"
    );
    readiness.set_ready().await;
    readiness
        .set_serving(false, "Kafka partitions [3] stalled")
        .await;
    let html = server.admin_get("/").await.text();
    assert_eq!(field(&html, "ready"), "NOT READY");
    assert_eq!(field(&html, "ready-reason"), "Kafka partitions [3] stalled");
}

/// The `chromium` binary, if installed.
fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|path| path.is_file())
        })
    })
}

/// Runs headless Chromium with `args` then `url`; its stdout. Killed after the patience bound.
fn run_chromium(binary: &Path, profile: &Path, args: &[String], url: &str) -> String {
    let output = tempfile::NamedTempFile::new().expect("temp file");
    let mut child = Command::new(binary)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(output.reopen().expect("reopen"))
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let until = Instant::now() + thunder_testbed::PATIENCE;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(status.success(), "chromium exited with {status}");
            break;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish within {:?}",
                thunder_testbed::PATIENCE
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::read_to_string(output.path()).expect("chromium output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_in_headless_chromium() {
    let Some(binary) = chromium() else {
        if std::env::var_os("THUNDER_REQUIRE_CHROMIUM").is_some() {
            panic!("THUNDER_REQUIRE_CHROMIUM is set but no chromium is on PATH");
        }
        eprintln!(
            "\n!!!!!!!! SKIPPED: the_status_page_renders_in_headless_chromium: no `chromium` on \
             PATH (apt-get install -y chromium; scripts/test.sh installs it) !!!!!!!!\n"
        );
        return;
    };
    let server = demo_server(20).await;
    let url = url(&server);
    let profile = tempfile::tempdir().expect("temp dir");
    let dom = tokio::task::spawn_blocking({
        let (binary, profile, url) = (binary.clone(), profile.path().to_owned(), url.clone());
        move || run_chromium(&binary, &profile, &["--dump-dom".into()], &url)
    })
    .await
    .expect("chromium task");
    assert!(dom.contains("<title>thunder status</title>"), "{dom}");
    // What Chromium parsed and laid out has every field, with the same values.
    assert_demo_fields(&dom, 20);

    let shots = tempfile::tempdir().expect("temp dir");
    let shot = shots.path().join("status-page.png");
    tokio::task::spawn_blocking({
        let (profile, url, shot) = (profile.path().to_owned(), url.clone(), shot.clone());
        move || {
            run_chromium(
                &binary,
                &profile,
                &[
                    format!("--screenshot={}", shot.display()),
                    "--window-size=1100,1500".into(),
                ],
                &url,
            )
        }
    })
    .await
    .expect("chromium task");
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 10_000, "screenshot of {} bytes", png.len());
    if let Some(keep) = std::env::var_os("THUNDER_STATUS_SCREENSHOT") {
        std::fs::copy(&shot, &keep).expect("screenshot copied");
    }
}
