//! Kafka over TLS and SASL, end to end: a CA, broker and client certificates made here, and a
//! TLS (and SASL) endpoint in front of the test broker (`thunder_testbed::kafka::proxy`) whose
//! Metadata answers lead back through it. Against it:
//! - replicas reading over `ssl` (the CA verified), and over `ssl` with a client certificate
//!   the endpoint requires, become ready with the same answers as a plaintext replica of the
//!   same topic, which `thunder-cli produce` wrote over TLS;
//! - a wrong CA, a broker certificate for another host name, an expired client certificate
//!   and no client certificate each leave the replica NOT_SERVING, with the reason in its log
//!   (rate-limited), on the status page and in `kafka_connection_errors_total{reason="tls"}`;
//! - SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 logins succeed (over TLS with a client
//!   certificate, as in docs/kafka.md's example, and over plaintext), a wrong password leaves
//!   the replica NOT_SERVING with the reason shown;
//! - `thunder-cli produce` against an endpoint that refuses it exits non-zero with the reason.
//!
//! The test broker lists SaslHandshake and SaslAuthenticate but accepts any credentials, so
//! the endpoint is the SASL server (see `thunder_testbed::kafka::proxy`).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thunder_testbed::http_get;
use thunder_testbed::kafka::proxy::{Endpoint, KafkaProxy};
use thunder_testbed::kafka::{Broker, create_topic, now_secs};
use thunder_testbed::metrics::in_text;
use thunder_testbed::pki::{Ca, server_config};
use thunder_testbed::process::binary;
use thunder_testbed::server_process::{ServerProcess, answers, health};
use tonic_health::pb::health_check_response::ServingStatus;

/// How long a replica may take to become ready, or to report a refused connection.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Scale of the synthetic backlog: 20M / 4000 = 5000 posts.
const SCALE: &str = "4000";
const USER: &str = "thunder";
const PASSWORD: &str = "correct horse";

/// The certificates of one test, as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    /// PEM of every certificate and key, by file name.
    pem: std::collections::HashMap<&'static str, String>,
}

impl Pki {
    fn new() -> Self {
        let ca_right = Ca::new("thunder test CA");
        let ca_other = Ca::new("another CA");
        let broker = ca_right.leaf(&["localhost", "127.0.0.1"], false);
        let wrong_host = ca_right.leaf(&["broker.invalid"], false);
        let client = ca_right.leaf(&["thunder-client"], false);
        let expired = ca_right.leaf(&["thunder-client"], true);
        let dir = tempfile::tempdir().expect("tempdir");
        let pem = [
            ("ca.pem", ca_right.pem()),
            ("other-ca.pem", ca_other.pem()),
            ("broker.pem", broker.0),
            ("broker.key", broker.1),
            ("wrong-host.pem", wrong_host.0),
            ("wrong-host.key", wrong_host.1),
            ("client.pem", client.0),
            ("client.key", client.1),
            ("expired.pem", expired.0),
            ("expired.key", expired.1),
        ]
        .into_iter()
        .collect::<std::collections::HashMap<_, _>>();
        for (name, contents) in &pem {
            std::fs::write(dir.path().join(name), contents).expect("write");
        }
        Self { dir, pem }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The endpoint's TLS: certificate `name` (`broker` or `wrong-host`), requiring a client
    /// certificate signed by the CA when `client_auth`.
    fn tls(&self, name: &str, client_auth: bool) -> Arc<rustls::ServerConfig> {
        server_config(
            &self.pem[&*format!("{name}.pem")],
            &self.pem[&*format!("{name}.key")],
            client_auth.then(|| self.pem["ca.pem"].as_str()),
        )
    }
}

/// Runs `thunder-cli produce ARGS` and returns (success, stderr, seconds taken).
fn cli_produce(args: &[&str], env: &[(&str, &str)]) -> (bool, String, f64) {
    let started = Instant::now();
    let out = Command::new(binary("thunder-cli"))
        .arg("produce")
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run thunder-cli produce");
    let stderr = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    (
        out.status.success(),
        stderr,
        started.elapsed().as_secs_f64(),
    )
}

/// A replica of `topic` at `bootstrap` with `extra` flags and `env`, its log in a file.
struct Replica {
    server: ServerProcess,
    log: tempfile::NamedTempFile,
}

impl Replica {
    fn start(bootstrap: &str, topic: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut args = vec!["--kafka-brokers", bootstrap, "--kafka-topic", topic];
        args.extend(["--kafka-num-threads", "2", "--max-degrade-level", "0"]);
        args.extend(extra);
        let server = ServerProcess::start_with(&args, TIMEOUT, |command| {
            let out = log.reopen().expect("log");
            let err = out.try_clone().expect("log");
            command.envs(env.iter().copied()).stdout(out).stderr(err);
        });
        Self { server, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// The count of Kafka connection errors of `reason`.
    async fn connection_errors(&self, reason: &str) -> f64 {
        let scrape = http_get(self.server.admin, "/metrics").await.text();
        in_text(
            &scrape,
            "kafka_connection_errors_total",
            &[("reason", reason)],
        )
        .unwrap_or(0.0)
    }

    async fn wait_serving(&self) {
        let deadline = Instant::now() + TIMEOUT;
        while health(self.server.grpc).await != Some(ServingStatus::Serving as i32) {
            assert!(
                Instant::now() < deadline,
                "never SERVING; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the replica counts a connection error of `reason`, then checks that it is
    /// not serving and says why (`expected`: words of the cause) in its log and status page.
    async fn assert_refused(&self, reason: &str, expected: &str) {
        let deadline = Instant::now() + TIMEOUT;
        while self.connection_errors(reason).await < 1.0 {
            assert!(
                Instant::now() < deadline,
                "no {reason} connection error counted; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Another attempt or two, so repeats have had their chance to flood the log.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            health(self.server.grpc).await,
            Some(ServingStatus::NotServing as i32),
            "health while the brokers refuse the connection"
        );
        assert_eq!(http_get(self.server.admin, "/readyz").await.status, 503);
        let log = self.log();
        let lines = log.lines().filter(|l| l.contains(expected)).count();
        if let Some(line) = log.lines().find(|l| l.contains(expected)) {
            eprintln!("refused ({reason}), as logged: {line}");
        }
        assert!(
            (1..=3).contains(&lines),
            "`{expected}` in {lines} log lines (wanted 1 to 3, rate-limited):\n{log}"
        );
        let page =
            String::from_utf8_lossy(&http_get(self.server.admin, "/").await.body).into_owned();
        let reason_row = format!("Kafka brokers refuse the connection ({reason})");
        assert!(
            page.contains(&reason_row) && page.contains(expected),
            "the status page does not say `{reason_row}` and `{expected}`:\n{page}"
        );
    }
}

/// The posts each replica answers for `viewers` (feed and videos), in order.
fn viewers() -> Vec<(i64, Vec<i64>)> {
    let config = thunder_workload::SynthConfig::feed_2d(SCALE.parse().expect("scale"), now_secs());
    config
        .viewers(40)
        .into_iter()
        .map(|v| (v.user_id, v.following))
        .collect()
}

#[test]
fn replicas_over_tls_answer_like_a_plaintext_one() {
    let pki = Pki::new();
    let broker = Broker::start();
    let topic = "tls";
    create_topic(&broker.bootstrap(), topic, 2);
    let tls = KafkaProxy::start(
        &broker.bootstrap(),
        Endpoint {
            tls: Some(pki.tls("broker", false)),
            ..Endpoint::default()
        },
    );
    let mtls = KafkaProxy::start(
        &broker.bootstrap(),
        Endpoint {
            tls: Some(pki.tls("broker", true)),
            ..Endpoint::default()
        },
    );
    let ca = pki.path("ca.pem");
    let (ok, output, _) = cli_produce(
        &[
            "--kafka-brokers",
            &tls.bootstrap(),
            "--kafka-topic",
            topic,
            "--kafka-security-protocol",
            "ssl",
            "--kafka-ssl-ca-location",
            &ca,
            "--synth",
            "--synth-scale",
            SCALE,
            "--backlog",
        ],
        &[],
    );
    assert!(ok, "thunder-cli produce over TLS failed:\n{output}");
    assert!(output.contains("failed 0"), "{output}");

    let plain = Replica::start(&broker.bootstrap(), topic, &[], &[]);
    let over_tls = Replica::start(
        &tls.bootstrap(),
        topic,
        &[
            "--kafka-security-protocol",
            "ssl",
            "--kafka-ssl-ca-location",
            &ca,
        ],
        &[],
    );
    let (cert, key) = (pki.path("client.pem"), pki.path("client.key"));
    let over_mtls = Replica::start(
        &mtls.bootstrap(),
        topic,
        &[
            "--kafka-security-protocol",
            "ssl",
            "--kafka-ssl-ca-location",
            &ca,
            "--kafka-ssl-certificate-location",
            &cert,
            "--kafka-ssl-key-location",
            &key,
        ],
        &[],
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        for replica in [&plain, &over_tls, &over_mtls] {
            replica.wait_serving().await;
        }
        let viewers = viewers();
        let want = answers(plain.server.grpc, &viewers).await;
        let posts: usize = want.iter().map(Vec::len).sum();
        assert!(posts > 100, "the plaintext replica answers {posts} posts");
        assert!(want.iter().any(Vec::is_empty) || posts > 0);
        for replica in [&over_tls, &over_mtls] {
            assert!(
                answers(replica.server.grpc, &viewers).await == want,
                "a TLS replica answers differently"
            );
            let refused = replica.connection_errors("tls").await;
            assert_eq!(refused, 0.0, "log:\n{}", replica.log());
        }
    });
}

#[test]
fn refused_tls_leaves_the_replica_not_serving_and_says_why() {
    let pki = Pki::new();
    let broker = Broker::start();
    let topic = "tls_refused";
    create_topic(&broker.bootstrap(), topic, 1);
    let endpoint = |name: &str, client_auth: bool| {
        KafkaProxy::start(
            &broker.bootstrap(),
            Endpoint {
                tls: Some(pki.tls(name, client_auth)),
                ..Endpoint::default()
            },
        )
    };
    let tls = endpoint("broker", false);
    let wrong_host = endpoint("wrong-host", false);
    let mtls = endpoint("broker", true);
    let (ca, other_ca) = (pki.path("ca.pem"), pki.path("other-ca.pem"));
    let (expired, expired_key) = (pki.path("expired.pem"), pki.path("expired.key"));
    let ssl = |ca: &str| {
        vec![
            "--kafka-security-protocol",
            "ssl",
            "--kafka-ssl-ca-location",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([ca.to_owned()])
        .collect::<Vec<String>>()
    };
    let with = |mut args: Vec<String>, more: &[&str]| {
        args.extend(more.iter().map(|s| (*s).to_owned()));
        args
    };
    let cases = [
        (tls.bootstrap(), ssl(&other_ca), "certificate verify failed"),
        (
            wrong_host.bootstrap(),
            ssl(&ca),
            "certificate verify failed",
        ),
        (
            mtls.bootstrap(),
            with(
                ssl(&ca),
                &[
                    "--kafka-ssl-certificate-location",
                    &expired,
                    "--kafka-ssl-key-location",
                    &expired_key,
                ],
            ),
            "certificate expired",
        ),
        (mtls.bootstrap(), ssl(&ca), "certificate required"),
    ];
    let replicas: Vec<(Replica, &str)> = cases
        .iter()
        .map(|(bootstrap, args, expected)| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (Replica::start(bootstrap, topic, &args, &[]), *expected)
        })
        .collect();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        for (replica, expected) in &replicas {
            replica.assert_refused("tls", expected).await;
        }
    });
}

#[test]
fn sasl_logins_succeed_and_a_wrong_password_is_refused() {
    let pki = Pki::new();
    let broker = Broker::start();
    let topic = "sasl";
    create_topic(&broker.bootstrap(), topic, 1);
    let producer = thunder_testbed::kafka::producer(&broker.bootstrap(), topic);
    let (_, events) = thunder_testbed::kafka::order_free_backlog(20_000, now_secs());
    for event in &events {
        thunder_testbed::kafka::send(&producer, event);
    }
    thunder_testbed::kafka::flush(&producer, events.len() as u64);
    let users = Some(vec![(USER.to_owned(), PASSWORD.to_owned())]);
    // As docs/kafka.md's example: SASL over TLS with a client certificate.
    let sasl_ssl = KafkaProxy::start(
        &broker.bootstrap(),
        Endpoint {
            tls: Some(pki.tls("broker", true)),
            sasl_users: users.clone(),
        },
    );
    let sasl_plaintext = KafkaProxy::start(
        &broker.bootstrap(),
        Endpoint {
            tls: None,
            sasl_users: users,
        },
    );
    let login = |protocol: &'static str, mechanism: &'static str| {
        let mut args = vec![
            "--kafka-security-protocol".to_owned(),
            protocol.to_owned(),
            "--kafka-sasl-mechanism".to_owned(),
            mechanism.to_owned(),
            "--kafka-sasl-username".to_owned(),
            USER.to_owned(),
        ];
        if protocol == "sasl_ssl" {
            for (flag, file) in [
                ("--kafka-ssl-ca-location", "ca.pem"),
                ("--kafka-ssl-certificate-location", "client.pem"),
                ("--kafka-ssl-key-location", "client.key"),
            ] {
                args.extend([flag.to_owned(), pki.path(file)]);
            }
        }
        args
    };
    let start = |proxy: &KafkaProxy, args: Vec<String>, password: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Replica::start(
            &proxy.bootstrap(),
            topic,
            &args,
            &[("THUNDER_KAFKA_SASL_PASSWORD", password)],
        )
    };
    let plain = start(&sasl_ssl, login("sasl_ssl", "PLAIN"), PASSWORD);
    let scram256 = start(
        &sasl_plaintext,
        login("sasl_plaintext", "SCRAM-SHA-256"),
        PASSWORD,
    );
    let scram512 = start(&sasl_ssl, login("sasl_ssl", "SCRAM-SHA-512"), PASSWORD);
    let wrong = start(&sasl_ssl, login("sasl_ssl", "SCRAM-SHA-512"), "wrong");

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        wrong
            .assert_refused("authentication", "Authentication failed")
            .await;
        let viewers: Vec<(i64, Vec<i64>)> = {
            let mut authors: Vec<i64> = events
                .iter()
                .filter_map(|e| match e {
                    thunder_engine::PostEvent::Create(p) => Some(p.author_id),
                    thunder_engine::PostEvent::Delete(_) => None,
                })
                .collect();
            authors.sort_unstable();
            authors.dedup();
            authors.chunks(50).map(|c| (0, c.to_vec())).collect()
        };
        let mut first = None;
        for replica in [&plain, &scram256, &scram512] {
            replica.wait_serving().await;
            let got = answers(replica.server.grpc, &viewers).await;
            assert!(got.iter().map(Vec::len).sum::<usize>() > 0, "no posts");
            assert!(
                first.get_or_insert_with(|| got.clone()) == &got,
                "SASL replicas answer differently"
            );
        }
    });
}

#[test]
fn the_cli_says_why_an_endpoint_refuses_it() {
    let pki = Pki::new();
    let broker = Broker::start();
    let topic = "cli_refused";
    create_topic(&broker.bootstrap(), topic, 1);
    let sasl_ssl = KafkaProxy::start(
        &broker.bootstrap(),
        Endpoint {
            tls: Some(pki.tls("broker", false)),
            sasl_users: Some(vec![(USER.to_owned(), PASSWORD.to_owned())]),
        },
    );
    let common = |ca: &str| {
        vec![
            "--kafka-brokers".to_owned(),
            sasl_ssl.bootstrap(),
            "--kafka-topic".to_owned(),
            topic.to_owned(),
            "--kafka-security-protocol".to_owned(),
            "sasl_ssl".to_owned(),
            "--kafka-sasl-mechanism".to_owned(),
            "SCRAM-SHA-256".to_owned(),
            "--kafka-sasl-username".to_owned(),
            USER.to_owned(),
            "--kafka-ssl-ca-location".to_owned(),
            pki.path(ca),
            "--synth".to_owned(),
            "--live-events".to_owned(),
            "1".to_owned(),
            // Lean: the default 10 s is tested against a broker that is not there
            // (cli/tests/produce.rs).
            "--kafka-request-timeout-ms".to_owned(),
            "4000".to_owned(),
        ]
    };
    for (ca, password, expected) in [
        ("other-ca.pem", PASSWORD, "certificate verify failed"),
        ("ca.pem", "wrong", "Authentication failed"),
    ] {
        let args = common(ca);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, output, secs) = cli_produce(&args, &[("THUNDER_KAFKA_SASL_PASSWORD", password)]);
        assert!(
            !ok,
            "produce succeeded against a refusing endpoint:\n{output}"
        );
        assert!(output.contains(expected), "`{expected}` missing:\n{output}");
        assert!(secs < 15.0, "took {secs:.1} s:\n{output}");
    }
    // The right credentials pass.
    let args = common("ca.pem");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, output, _) = cli_produce(&args, &[("THUNDER_KAFKA_SASL_PASSWORD", PASSWORD)]);
    assert!(ok, "{output}");
}
