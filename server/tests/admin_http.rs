//! Admin HTTP: Prometheus metrics after a request, and both CPU profile endpoints.

use std::io::Read;
use std::time::Duration;

use pprof::protos::Message;
use thunder_server::ServerOptions;
use thunder_server::admin::routes::AdminAccess;
use thunder_testbed::{
    HttpResponse, TestServer, admin_post, eventually, http_request_with, original, request, store,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_the_counters_after_a_request() {
    let store = store();
    store.insert_posts(&[original(1, 5, 10), original(2, 5, 20)]);
    let options = ServerOptions {
        stats_interval: Duration::from_millis(50),
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store, None).await;
    server.running().readiness().set_ready().await;
    let mut client = server.client().await;
    client
        .get_in_network_posts(request(&[5]))
        .await
        .expect("served");

    let response = server.admin_get("/metrics").await;
    assert_eq!(response.status, 200);
    assert!(
        response
            .header("content-type")
            .is_some_and(|v| v.starts_with("text/plain"))
    );
    let text = response.text();
    let value = |name: &str| thunder_testbed::metrics::in_text(&text, name, &[]);
    for name in [
        "get_in_network_posts_duration_seconds_count",
        "get_in_network_posts_duration_without_strato_seconds_count",
        "get_in_network_posts_count_count",
        "get_in_network_posts_following_size_count",
        "get_in_network_posts_excluded_size_count",
        "get_in_network_posts_max_results_count",
        "get_in_network_posts_request_bytes_count",
        "get_in_network_posts_response_bytes_count",
        "post_store_requests_total",
        "post_store_posts_returned_count",
    ] {
        assert!(
            value(name).is_some_and(|v| v >= 1.0),
            "{name} missing or zero"
        );
    }
    assert!(text.contains("get_in_network_posts_requests_total{status=\"ok\"}"));
    assert!(text.contains("get_in_network_posts_found_freshness_seconds_count{stage=\"scored\"}"));
    for name in [
        "in_flight_requests",
        "rejected_requests_total",
        "post_store_request_timeouts_total",
    ] {
        assert!(value(name).is_some(), "{name} missing");
    }
    // The store gauges are refreshed in the background.
    let gauges_seen = eventually(|| async {
        let text = server.admin_get("/metrics").await.text();
        text.lines().any(|l| l == "post_store_total_posts 2")
            && text.contains("post_store_entity_count{type=\"original_posts\"} 2")
            && text.contains("post_store_arena_bytes{kind=\"reserved\"}")
            && text.contains("post_store_deleted_posts 0")
    })
    .await;
    assert!(gauges_seen, "{}", server.admin_get("/metrics").await.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_are_served_one_at_a_time() {
    let server = TestServer::ready(store()).await;
    // Something to sample.
    let busy = std::thread::spawn(|| {
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // Check the clock rarely: samples landing in the vdso are dropped by the blocklist.
        while started.elapsed() < Duration::from_secs(3) {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(
                    x.wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407),
                );
            }
        }
        x
    });

    let svg = server.admin_get("/debug/pprof/flamegraph?seconds=1").await;
    assert_eq!(svg.status, 200, "{}", svg.text());
    assert_eq!(svg.header("content-type"), Some("image/svg+xml"));
    assert!(
        svg.text().contains("<svg"),
        "not an SVG: {:?}",
        &svg.text()[..svg.text().len().min(300)]
    );

    let profile = server.admin_get("/debug/pprof/profile?seconds=1").await;
    assert_eq!(profile.status, 200, "{}", profile.text());
    let mut decoded = Vec::new();
    flate2::read::GzDecoder::new(profile.body.as_slice())
        .read_to_end(&mut decoded)
        .expect("gzip");
    let parsed = pprof::protos::Profile::decode(decoded.as_slice()).expect("profile.proto");
    assert!(!parsed.sample_type.is_empty());
    assert!(!parsed.string_table.is_empty());
    let _ = busy.join();

    // While a profile runs, a second one is refused with 409.
    let addr = server.running().admin_addr();
    let long = tokio::spawn(async move {
        thunder_testbed::http_get(addr, "/debug/pprof/profile?seconds=4").await
    });
    let mut conflict = false;
    while !long.is_finished() {
        let probe = server.admin_get("/debug/pprof/flamegraph?seconds=1").await;
        if probe.status == 409 {
            conflict = true;
            break;
        }
        assert_eq!(probe.status, 200);
    }
    let long = long.await.expect("joined");
    assert!(conflict || long.status == 409, "no 409 while a profile ran");
}

/// The profiler writes a sample file to the temp dir. With `$TMPDIR` unwritable (as `/tmp` is
/// under a read-only root filesystem) a server still profiles: the file goes to `/dev/shm`.
/// Where that is not writable either, the answer says what to mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_temp_dir_is_unwritable_still_profiles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_a_directory = dir.path().join("a-file");
    std::fs::write(&not_a_directory, b"x").expect("write");
    let server = thunder_testbed::server_process::ServerProcess::start_with(
        &["--demo-scale", "1000", "--demo-events-per-sec", "0"],
        thunder_testbed::PATIENCE,
        |command| {
            command.env("TMPDIR", &not_a_directory);
        },
    );
    let profile = thunder_testbed::http_get(server.admin, "/debug/pprof/profile?seconds=1").await;
    if tempfile::NamedTempFile::new_in("/dev/shm").is_ok() {
        assert_eq!(profile.status, 200, "{}", profile.text());
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(profile.body.as_slice())
            .read_to_end(&mut decoded)
            .expect("gzip");
        pprof::protos::Profile::decode(decoded.as_slice()).expect("profile.proto");
        let svg =
            thunder_testbed::http_get(server.admin, "/debug/pprof/flamegraph?seconds=1").await;
        assert_eq!(svg.status, 200, "{}", svg.text());
    } else {
        assert_eq!(profile.status, 503, "{}", profile.text());
        assert!(profile.text().contains("TMPDIR"), "{}", profile.text());
    }
}

/// `POST /admin/snapshot` to `addr` with `Host: host` and `headers`.
async fn post(addr: std::net::SocketAddr, host: &str, headers: &[(&str, &str)]) -> HttpResponse {
    http_request_with(addr, "POST", "/admin/snapshot", host, headers).await
}

/// The handler ran: without `--snapshot-dir` it answers 404 "snapshots are off".
fn reached_the_handler(response: &HttpResponse) -> bool {
    response.status == 404 && response.text().contains("snapshots are off")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_changing_requests_need_the_header_a_local_host_and_no_foreign_origin() {
    let server = TestServer::start(ServerOptions::default(), store(), None).await;
    let addr = server.running().admin_addr();
    let host = addr.to_string();
    const ADMIN: (&str, &str) = ("X-Thunder-Admin", "1");

    let accepted = admin_post(addr, "/admin/snapshot").await;
    assert!(reached_the_handler(&accepted), "{accepted:?}");
    for host in ["localhost:1234", "LocalHost", "127.0.0.1", "[::1]:8080"] {
        let response = post(addr, host, &[ADMIN]).await;
        assert!(reached_the_handler(&response), "{host}: {response:?}");
    }
    let same_origin = format!("http://{host}");
    let response = post(addr, &host, &[ADMIN, ("Origin", &same_origin)]).await;
    assert!(reached_the_handler(&response), "{response:?}");

    // What a page in a browser, or a DNS-rebinding page, can send is refused with a reason.
    // (Host, headers, what the 403 body says)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str);
    let refused: [Case; 8] = [
        (&host, vec![], "X-Thunder-Admin: 1"),
        (&host, vec![("X-Thunder-Admin", "0")], "X-Thunder-Admin: 1"),
        ("evil.example", vec![ADMIN], "Host \"evil.example\""),
        (
            "evil.example:8080",
            vec![ADMIN],
            "not an allowed admin host",
        ),
        (
            &host,
            vec![ADMIN, ("Origin", "http://evil.example")],
            "cross-origin",
        ),
        (&host, vec![ADMIN, ("Origin", "null")], "cross-origin"),
        (
            &host,
            vec![ADMIN, ("Content-Type", "text/plain;charset=UTF-8")],
            "text/plain",
        ),
        (
            &host,
            vec![ADMIN, ("Sec-Fetch-Site", "cross-site")],
            "cross-site",
        ),
    ];
    for (host, headers, reason) in refused {
        let response = post(addr, host, &headers).await;
        assert_eq!(response.status, 403, "{host} {headers:?}: {response:?}");
        assert!(
            response.text().starts_with("forbidden: ") && response.text().contains(reason),
            "{host} {headers:?}: {}",
            response.text()
        );
    }
    // Reads are not state-changing: probes and scrapes by any name still work.
    for path in ["/metrics", "/healthz"] {
        let response = http_request_with(addr, "GET", path, "10.1.2.3:8080", &[]).await;
        assert_eq!(response.status, 200, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_token_is_enforced_whatever_the_host() {
    let options = ServerOptions {
        admin_access: AdminAccess {
            token: Some("s3cret-token".into()),
            allowed_hosts: vec!["thunder-0.thunder".into()],
        },
        ..ServerOptions::default()
    };
    let server = TestServer::start(options, store(), None).await;
    let addr = server.running().admin_addr();
    let host = addr.to_string();
    const ADMIN: (&str, &str) = ("X-Thunder-Admin", "1");

    for headers in [
        vec![ADMIN],
        vec![ADMIN, ("Authorization", "Bearer wrong")],
        vec![ADMIN, ("Authorization", "s3cret-token")],
        vec![("Authorization", "Bearer s3cret-token")],
    ] {
        let response = post(addr, &host, &headers).await;
        assert_eq!(response.status, 403, "{headers:?}: {response:?}");
        assert!(!response.text().contains("s3cret"), "{}", response.text());
    }
    // The token authenticates, not the Host header: any name the caller used reaches it.
    let bearer = ("Authorization", "Bearer s3cret-token");
    for host in [
        host.as_str(),
        "thunder-0.thunder:8080",
        "thunder-1.thunder",
        "10.1.2.3",
    ] {
        let response = post(addr, host, &[ADMIN, bearer]).await;
        assert!(reached_the_handler(&response), "{host}: {response:?}");
    }
    // A profile needs the token too.
    let profile =
        http_request_with(addr, "GET", "/debug/pprof/profile?seconds=0", &host, &[]).await;
    assert_eq!(profile.status, 403, "{profile:?}");
}

/// A server whose admin listener is on every address (`0.0.0.0`), reached over loopback.
async fn on_every_address(
    token: Option<&str>,
) -> (thunder_server::RunningServer, std::net::SocketAddr) {
    let options = ServerOptions {
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        admin_addr: "0.0.0.0:0".parse().expect("addr"),
        admin_access: AdminAccess {
            token: token.map(str::to_owned),
            allowed_hosts: Vec::new(),
        },
        ..ServerOptions::default()
    };
    let server = thunder_server::start(options, store(), None)
        .await
        .expect("server starts");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], server.admin_addr().port()));
    (server, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_listener_on_every_address_without_a_token_is_read_only() {
    let (server, addr) = on_every_address(None).await;
    const ADMIN: (&str, &str) = ("X-Thunder-Admin", "1");
    // A spoofed Host, the admin header, a made-up token: nothing drives it.
    for host in [
        "localhost",
        "127.0.0.1",
        "localhost:8080",
        "thunder-0.thunder",
    ] {
        for headers in [vec![ADMIN], vec![ADMIN, ("Authorization", "Bearer guess")]] {
            let response = post(addr, host, &headers).await;
            assert_eq!(response.status, 403, "{host} {headers:?}: {response:?}");
            assert!(response.text().contains("read-only"), "{}", response.text());
        }
    }
    for path in [
        "/debug/pprof/profile?seconds=1",
        "/debug/pprof/flamegraph?seconds=1",
    ] {
        let response = http_request_with(addr, "GET", path, "localhost", &[]).await;
        assert_eq!(response.status, 403, "{path}: {response:?}");
    }
    // What the cluster reads stays open, and the status page says which mode this is.
    for path in ["/metrics", "/healthz", "/endpoints"] {
        let response = http_request_with(addr, "GET", path, "10.1.2.3:8080", &[]).await;
        assert_eq!(response.status, 200, "{path}");
    }
    assert_eq!(thunder_testbed::http_get(addr, "/readyz").await.status, 503);
    let page = thunder_testbed::http_get(addr, "/").await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("read-only"), "{}", page.text());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_listener_on_every_address_with_a_token_takes_the_token() {
    let (server, addr) = on_every_address(Some("t0ken")).await;
    const ADMIN: (&str, &str) = ("X-Thunder-Admin", "1");
    let refused = post(addr, "localhost", &[ADMIN]).await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(refused.text().contains("admin token"), "{}", refused.text());
    let accepted = post(
        addr,
        "10.1.2.3:8080",
        &[ADMIN, ("Authorization", "Bearer t0ken")],
    )
    .await;
    assert!(reached_the_handler(&accepted), "{accepted:?}");
    let page = thunder_testbed::http_get(addr, "/").await.text();
    assert!(page.contains("bearer token"), "{page}");
    server.shutdown().await;
}
