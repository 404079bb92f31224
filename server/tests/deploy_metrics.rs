//! The alert rules (deploy/prometheus/thunder-alerts.yml) and the dashboard
//! (deploy/grafana/thunder.json) name only metrics and labels the server exports (or, for
//! `up`, that Prometheus makes for every target), and every alert links its runbook entry and
//! has a promtool test.
//!
//! A demo-mode `thunder-server` is started and served one call; its `/metrics` scrape is the
//! truth for every family it shows (names, and label names from the samples). Families that a
//! healthy demo server has no sample of (listed in [`DECLARED_ONLY`] with the reason) are
//! checked against the registry's catalogue ([`catalogue`], the source of
//! docs/metrics.md) instead, label names included; anything else missing fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::lifecycle::metrics::catalogue;
use thunder_testbed::repo::{root, yaml_documents};
use thunder_testbed::server_process::ServerProcess;

/// Families the demo scrape cannot show, checked against the catalogue instead.
const DECLARED_ONLY: &[(&str, &str)] = &[
    (
        "kafka_partition_lag",
        "labelled by topic/partition: Kafka ingestion only",
    ),
    (
        "kafka_partition_stalled",
        "labelled by topic/partition: Kafka ingestion only",
    ),
    (
        "kafka_consumer_receive_max_bytes",
        "labelled by ingest thread: Kafka ingestion only",
    ),
    (
        "grpc_connections_refused_total",
        "labelled by port: first sample at the first refusal",
    ),
    (
        "snapshot_volume_free_bytes",
        "only with --snapshot-dir, which needs Kafka",
    ),
    (
        "snapshot_volume_size_bytes",
        "only with --snapshot-dir, which needs Kafka",
    ),
];

/// Series Prometheus itself makes for every target it scrapes (with the target labels only).
const PROMETHEUS_SERIES: &[&str] = &["up"];

/// Labels Prometheus adds to every scraped series (target labels), and a histogram's `le`.
const TARGET_LABELS: &[&str] = &["job", "instance"];

/// Family name -> label names seen in its samples, from a Prometheus text scrape.
fn scraped_families(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut families: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut histograms = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                families.entry(name.to_owned()).or_default();
                if kind == "histogram" {
                    histograms.insert(name.to_owned());
                }
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let series = &line[..name_end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                series
                    .strip_suffix(suffix)
                    .filter(|base| histograms.contains(*base))
            })
            .unwrap_or(series);
        let labels = families.entry(family.to_owned()).or_default();
        if let Some(body) = line[name_end..].strip_prefix('{') {
            for pair in body.split(',') {
                if let Some((label, _)) = pair.split_once('=') {
                    let label = label.trim();
                    if !label.is_empty() && label != "le" {
                        labels.insert(label.to_owned());
                    }
                }
            }
        }
    }
    families
}

/// What a PromQL expression names: metrics with the label names matched on each, and the
/// label names of `by`/`without`/`on`/`ignoring`/`group_*` lists.
#[derive(Debug, Default)]
struct Named {
    metrics: Vec<(String, Vec<String>)>,
    grouping_labels: Vec<String>,
}

const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
    // Aggregations: `sum by (l) (...)` puts the grouping between the name and its `(`.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// A small PromQL tokenizer: identifiers, `{...}` matchers, `(...)` label lists after the
/// grouping keywords; string literals, `[...]` ranges and numbers are skipped. An identifier
/// followed by `(` is a function or aggregation, not a metric.
fn promql_names(expr: &str) -> Named {
    let chars: Vec<char> = expr.chars().collect();
    let mut named = Named::default();
    let mut i = 0;
    let skip_spaces = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    let ident_at = |j: usize| {
        let mut k = j;
        while k < chars.len()
            && (chars[k].is_ascii_alphanumeric() || chars[k] == '_' || chars[k] == ':')
        {
            k += 1;
        }
        (chars[j..k].iter().collect::<String>(), k)
    };
    let mut pending_metric: Option<String> = None;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            let quote = c;
            i += 1;
            while i < chars.len() && chars[i] != quote {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            // Label matchers: `name op "value"` pairs.
            let mut labels = Vec::new();
            i += 1;
            loop {
                i = skip_spaces(i);
                if i >= chars.len() || chars[i] == '}' {
                    i += 1;
                    break;
                }
                if chars[i] == ',' {
                    i += 1;
                    continue;
                }
                let (label, end) = ident_at(i);
                assert!(!label.is_empty(), "cannot parse matchers of `{expr}`");
                labels.push(label);
                i = end;
                while i < chars.len() && "=!~ ".contains(chars[i]) {
                    i += 1;
                }
                // The value: a string literal.
                let quote = chars[i];
                i += 1;
                while i < chars.len() && chars[i] != quote {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            let metric = pending_metric
                .take()
                .unwrap_or_else(|| panic!("a matcher without a metric name in `{expr}`"));
            named.metrics.push((metric, labels));
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            if let Some(metric) = pending_metric.take() {
                named.metrics.push((metric, Vec::new()));
            }
            let (word, end) = ident_at(i);
            let next = skip_spaces(end);
            let followed_by = chars.get(next).copied();
            if GROUPING.contains(&word.as_str()) && followed_by == Some('(') {
                let close = chars[next..]
                    .iter()
                    .position(|&ch| ch == ')')
                    .map_or(chars.len(), |p| next + p);
                let list: String = chars[next + 1..close].iter().collect();
                named.grouping_labels.extend(
                    list.split(',')
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_owned),
                );
                i = close + 1;
                continue;
            }
            if followed_by != Some('(') && !KEYWORDS.contains(&word.as_str()) {
                pending_metric = Some(word);
            }
            i = end;
        } else if c.is_ascii_digit() || c == '.' || c == '$' {
            // Numbers, durations and dashboard variables.
            i += 1;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_')
            {
                i += 1;
            }
        } else {
            if let Some(metric) = pending_metric.take() {
                named.metrics.push((metric, Vec::new()));
            }
            i += 1;
        }
    }
    if let Some(metric) = pending_metric {
        named.metrics.push((metric, Vec::new()));
    }
    named
}

/// Every alert's name and expression.
fn alert_exprs() -> Vec<(String, String)> {
    alert_rules()
        .iter()
        .map(|rule| {
            (
                rule["alert"].as_str().expect("alert name").to_owned(),
                rule["expr"].as_str().expect("expr").to_owned(),
            )
        })
        .collect()
}

/// Every rule of the alert file.
fn alert_rules() -> Vec<serde_json::Value> {
    let rules = yaml_documents(&root().join("deploy/prometheus/thunder-alerts.yml"));
    rules[0]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("rules").clone())
        .collect()
}

/// deploy/grafana/thunder.json.
fn dashboard() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("deploy/grafana/thunder.json"))
        .expect("read the dashboard");
    serde_json::from_str(&text).expect("dashboard is JSON")
}

/// Every dashboard panel's title and query expressions (and the template variables' queries).
fn dashboard_exprs() -> Vec<(String, String)> {
    let dashboard = dashboard();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("panel title");
        for target in panel["targets"].as_array().expect("targets") {
            out.push((
                title.to_owned(),
                target["expr"].as_str().expect("expr").to_owned(),
            ));
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if let Some(definition) = variable["definition"].as_str() {
            // label_values(<selector>, <label>)
            let inner = definition
                .strip_prefix("label_values(")
                .and_then(|d| d.rsplit_once(','))
                .map_or(definition, |(selector, _)| selector);
            out.push((format!("variable {}", variable["name"]), inner.to_owned()));
        }
    }
    out
}

#[test]
fn every_alert_links_its_runbook_entry_absolutely_and_has_a_promtool_test() {
    let runbook = std::fs::read_to_string(root().join("docs/operating.md")).expect("runbook");
    let tests = yaml_documents(&root().join("deploy/prometheus/thunder-alerts.test.yml"));
    // Per alert: whether some promtool test expects it firing, and some expects it silent.
    let mut fired = BTreeSet::new();
    let mut silent = BTreeSet::new();
    // Without the label, the link is relative and the description says to set it.
    let unset_warning = "{{ if not $externalLabels.runbook_base }} (The runbook link is \
                         relative: set the external label runbook_base on the Prometheus \
                         server, docs/operating.md, Alerting.){{ end }}";
    let mut unset_tested = false;
    for group in tests[0]["tests"].as_array().expect("tests") {
        let Some(base) = group["external_labels"]["runbook_base"].as_str() else {
            for case in group["alert_rule_test"]
                .as_array()
                .expect("alert_rule_test")
            {
                let name = case["alertname"].as_str().expect("alertname");
                for alert in case["exp_alerts"].as_array().expect("exp_alerts") {
                    let annotations = &alert["exp_annotations"];
                    assert_eq!(
                        annotations["runbook_url"],
                        format!("docs/operating.md#runbook-{}", name.to_lowercase())
                    );
                    assert!(
                        annotations["description"]
                            .as_str()
                            .is_some_and(|d| d.ends_with("runbook_base on the Prometheus server, docs/operating.md, Alerting.)")),
                        "{annotations}"
                    );
                    unset_tested = true;
                }
            }
            continue;
        };
        assert!(base.starts_with("https://"), "{base}");
        for case in group["alert_rule_test"]
            .as_array()
            .expect("alert_rule_test")
        {
            let name = case["alertname"].as_str().expect("alertname").to_owned();
            let expected = case["exp_alerts"].as_array().expect("exp_alerts");
            for alert in expected {
                let url = alert["exp_annotations"]["runbook_url"]
                    .as_str()
                    .expect("url");
                assert_eq!(
                    url,
                    format!("{base}#runbook-{}", name.to_lowercase()),
                    "{name}"
                );
            }
            if expected.is_empty() {
                silent.insert(name);
            } else {
                fired.insert(name);
            }
        }
    }
    let rules = alert_rules();
    assert_eq!(rules.len(), 16);
    for rule in &rules {
        let name = rule["alert"].as_str().expect("alert name");
        let anchor = format!("runbook-{}", name.to_lowercase());
        // Absolute once Prometheus fills in its external label `runbook_base`, relative to
        // the repository without it, and then the description says so.
        assert_eq!(
            rule["annotations"]["runbook_url"],
            format!(
                "{{{{ with $externalLabels.runbook_base }}}}{{{{ . }}}}{{{{ else }}}}docs/operating.md{{{{ end }}}}#{anchor}"
            ),
            "{name}"
        );
        assert!(
            rule["annotations"]["description"]
                .as_str()
                .is_some_and(|d| d.ends_with(unset_warning)),
            "{name}: {}",
            rule["annotations"]["description"]
        );
        assert!(
            runbook.contains(&format!("<a id=\"{anchor}\"></a>\n### {name}\n")),
            "docs/operating.md has no runbook entry for {name}"
        );
        assert!(fired.contains(name), "no promtool test fires {name}");
        assert!(unset_tested, "no promtool test runs without runbook_base");
        assert!(
            silent.contains(name),
            "no promtool test keeps {name} silent"
        );
    }
}

#[test]
fn the_tokenizer_finds_metrics_labels_and_skips_functions() {
    let named = promql_names(
        r#"sum by (job, instance) (rate(a_total{job="thunder", status!~"o\"k"}[5m])) / on (job) b > 2 and c"#,
    );
    let metrics: Vec<_> = named.metrics.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(metrics, ["a_total", "b", "c"]);
    assert_eq!(named.metrics[0].1, ["job", "status"]);
    assert_eq!(named.grouping_labels, ["job", "instance", "job"]);
}

/// A small demo server with `--memory-limit-bytes memory_limit`.
async fn small_demo(memory_limit: &str) -> ServerProcess {
    ServerProcess::demo(&[
        "--demo-scale",
        "1000",
        "--demo-events-per-sec",
        "10",
        "--memory-limit-bytes",
        memory_limit,
    ])
    .await
}

/// A small demo server that has served one call, so the per-status and per-stage families
/// have samples; with a memory limit, so memory_limit_bytes is exported whatever this
/// machine's cgroup says.
async fn demo_after_one_call() -> ServerProcess {
    let server = small_demo("4294967296").await;
    let mut client = InNetworkPostsServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .expect("connect");
    client
        .get_in_network_posts(thunder_testbed::request(&[1, 2, 3]))
        .await
        .expect("a call");
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_name_only_exported_metrics_and_labels() {
    let server = demo_after_one_call().await;
    // The store statistics are published every few seconds.
    let mut live = BTreeMap::new();
    let until = Instant::now() + thunder_testbed::PATIENCE;
    while Instant::now() < until {
        let scrape = thunder_testbed::http_get(server.admin, "/metrics").await;
        assert_eq!(scrape.status, 200);
        live = scraped_families(&scrape.text());
        if live
            .get("post_store_entity_count")
            .is_some_and(|l| !l.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        live.get("server_ready").map(BTreeSet::len),
        Some(0),
        "server_ready exported"
    );
    assert!(
        thunder_testbed::http_get(server.admin, "/metrics")
            .await
            .text()
            .contains("\nserver_ready 1\n")
    );

    let catalogue: BTreeMap<String, (String, BTreeSet<String>)> = catalogue()
        .into_iter()
        .map(|m| (m.name, (m.kind.to_owned(), m.labels.into_iter().collect())))
        .collect();
    let declared_only: BTreeSet<&str> = DECLARED_ONLY.iter().map(|(name, _)| *name).collect();

    let mut problems = Vec::new();
    let mut checked = BTreeMap::<String, &str>::new();
    let mut sources = alert_exprs()
        .into_iter()
        .map(|(name, expr)| (format!("alert {name}"), expr))
        .collect::<Vec<_>>();
    let alerts = sources.len();
    sources.extend(
        dashboard_exprs()
            .into_iter()
            .map(|(title, expr)| (format!("dashboard panel `{title}`"), expr)),
    );
    assert_eq!(alerts, 16, "the sixteen alerts");
    assert!(sources.len() > alerts + 15, "the dashboard's queries");
    for (source, expr) in &sources {
        let named = promql_names(expr);
        assert!(!named.metrics.is_empty(), "{source}: no metric in `{expr}`");
        let mut labels_in_expr: BTreeSet<String> =
            TARGET_LABELS.iter().map(|l| (*l).to_owned()).collect();
        for (series, matchers) in &named.metrics {
            // A histogram's series name its family with a suffix.
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    series.strip_suffix(suffix).filter(|base| {
                        catalogue
                            .get(*base)
                            .is_some_and(|(kind, _)| kind == "histogram")
                    })
                })
                .unwrap_or(series);
            let labels = if PROMETHEUS_SERIES.contains(&family) {
                checked.insert(family.to_owned(), "series Prometheus makes");
                BTreeSet::new()
            } else if let Some(labels) = live.get(family) {
                checked.insert(family.to_owned(), "live scrape");
                // Label names from the samples; for a family whose label sets are not all
                // used yet, the catalogue's declaration.
                let mut labels = labels.clone();
                if let Some((_, declared)) = catalogue.get(family) {
                    labels.extend(declared.iter().cloned());
                }
                labels
            } else if declared_only.contains(family) {
                match catalogue.get(family) {
                    Some((_, declared)) => {
                        checked.insert(family.to_owned(), "catalogue (no demo sample)");
                        declared.clone()
                    }
                    None => {
                        problems.push(format!("{source}: `{family}` is not in the registry"));
                        continue;
                    }
                }
            } else {
                problems.push(format!(
                    "{source}: `{series}` is not exported by the server (scrape of a demo server)"
                ));
                continue;
            };
            let mut allowed = labels.clone();
            allowed.extend(TARGET_LABELS.iter().map(|l| (*l).to_owned()));
            if series.ends_with("_bucket") && family != series {
                allowed.insert("le".to_owned());
            }
            for label in matchers {
                if !allowed.contains(label) {
                    problems.push(format!(
                        "{source}: `{series}` has no label `{label}` (it has {labels:?})"
                    ));
                }
            }
            labels_in_expr.extend(allowed);
        }
        for label in &named.grouping_labels {
            if !labels_in_expr.contains(label) {
                problems.push(format!(
                    "{source}: groups by `{label}`, which none of its metrics has"
                ));
            }
        }
    }
    for (family, how) in &checked {
        eprintln!("{family}: checked against the {how}");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `promtool check metrics` on a scrape of a demo server that served a call objects only to
/// the reference's `_count` gauges, which docs/metrics.md names; histogram bounds and every
/// other name pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_objects_only_to_the_reference_count_gauges() {
    if !prometheus_installed() {
        return;
    }
    let server = demo_after_one_call().await;
    let scrape = thunder_testbed::http_get(server.admin, "/metrics")
        .await
        .text();
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool");
    {
        use std::io::Write as _;
        let mut stdin = check.stdin.take().expect("stdin");
        stdin
            .write_all(scrape.as_bytes())
            .expect("write the scrape");
    }
    let output = check.wait_with_output().expect("promtool ran");
    let complaints = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let named: BTreeSet<&str> = complaints
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    let expected: BTreeSet<&str> = thunder_server::telemetry::reference_names::PROMTOOL_OBJECTS_TO
        .into_iter()
        .collect();
    assert_eq!(named, expected, "{complaints}");
    let docs = std::fs::read_to_string(root().join("docs/metrics.md")).expect("metrics.md");
    for name in expected {
        assert!(
            docs.contains(&format!("| `{name}` (*reference*) | gauge |")),
            "docs/metrics.md does not mark {name} as the reference's"
        );
    }
}

/// The Prometheus binaries, or `None` (the test is skipped) when they are not installed and
/// `THUNDER_REQUIRE_PROMETHEUS=1` (scripts/test.sh, which installs them) is not set.
fn prometheus_installed() -> bool {
    let found = ["prometheus", "promtool"].iter().all(|binary| {
        Command::new(binary)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !found {
        assert!(
            std::env::var_os("THUNDER_REQUIRE_PROMETHEUS").is_none_or(|v| v != "1"),
            "prometheus and promtool are required (Debian's prometheus package)"
        );
        eprintln!("skipped: prometheus/promtool not installed (Debian's prometheus package)");
    }
    found
}

/// The labels Kubernetes service discovery (`role: pod`) gives one container port of a pod,
/// as a file_sd target group: what deploy/prometheus/scrape.yml's relabelling sees.
fn pod_port(
    address: std::net::SocketAddr,
    pod: &str,
    app: &str,
    port_name: &str,
    phase: &str,
) -> serde_json::Value {
    serde_json::json!({
        "targets": [address.to_string()],
        "labels": {
            "__meta_kubernetes_namespace": "feeds",
            "__meta_kubernetes_pod_name": pod,
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": app,
            "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name": "true",
            "__meta_kubernetes_pod_container_name": "thunder-server",
            "__meta_kubernetes_pod_container_port_name": port_name,
            "__meta_kubernetes_pod_container_port_number": address.port().to_string(),
            "__meta_kubernetes_pod_phase": phase,
            "__meta_kubernetes_pod_ready": "true",
        }
    })
}

/// A Prometheus server on a free 127.0.0.1 port; killed on drop.
struct PrometheusProcess {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl Drop for PrometheusProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PrometheusProcess {
    async fn start(config: &std::path::Path, data: &std::path::Path) -> Self {
        for _ in 0..5 {
            let addr = thunder_testbed::process::free_addr();
            let mut child = Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!("--storage.tsdb.path={}", data.display()))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn")
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("start prometheus");
            let until = Instant::now() + thunder_testbed::PATIENCE;
            while Instant::now() < until {
                if child.try_wait().expect("prometheus status").is_some() {
                    break; // the port was taken: again on another
                }
                if tokio::net::TcpStream::connect(addr).await.is_ok()
                    && thunder_testbed::http_get(addr, "/-/ready").await.status == 200
                {
                    return Self { child, addr };
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("prometheus did not start");
    }

    async fn api(&self, path: &str) -> serde_json::Value {
        let response = thunder_testbed::http_get(self.addr, path).await;
        assert_eq!(response.status, 200, "{path}: {}", response.text());
        let body: serde_json::Value = serde_json::from_slice(&response.body).expect("JSON");
        body["data"].clone()
    }
}

/// deploy/prometheus/scrape.yml in a real Prometheus with the alert rules: the pods that
/// Kubernetes discovery would list (here from a file, with the same meta labels) are kept or
/// dropped as meant, the targets get `job="thunder"`, `namespace` and `pod`, the rules see the
/// server's metrics through them, and a down target and memory over the limit raise alerts
/// whose runbook links are absolute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_config_feeds_the_rules_in_a_real_prometheus() {
    if !prometheus_installed() {
        return;
    }
    // A limit far below what the process uses: ThunderMemoryNearLimit's condition holds.
    let server = small_demo("1048576").await;
    let nobody = thunder_testbed::process::free_addr();
    let dir = tempfile::tempdir().expect("tempdir");
    let targets = dir.path().join("pods.json");
    let pods = serde_json::json!([
        pod_port(server.admin, "thunder-0", "thunder", "admin", "Running"),
        pod_port(server.grpc, "thunder-0", "thunder", "grpc", "Running"),
        // A replica whose admin port does not answer.
        pod_port(nobody, "thunder-1", "thunder", "admin", "Running"),
        // A finished pod, and another application's pod.
        pod_port(nobody, "thunder-old", "thunder", "admin", "Failed"),
        pod_port(nobody, "web-0", "web", "admin", "Running"),
    ]);
    std::fs::write(&targets, pods.to_string()).expect("write targets");

    // The shipped scrape job with discovery from the file instead of the Kubernetes API.
    let mut config = yaml_documents(&root().join("deploy/prometheus/scrape.yml"))[0].clone();
    let jobs = config["scrape_configs"]
        .as_array_mut()
        .expect("scrape_configs");
    assert_eq!(jobs.len(), 1);
    let job = jobs[0].as_object_mut().expect("a job");
    assert_eq!(
        job.remove("kubernetes_sd_configs"),
        Some(serde_json::json!([{"role": "pod"}]))
    );
    job.insert(
        "file_sd_configs".into(),
        serde_json::json!([{"files": [targets], "refresh_interval": "1s"}]),
    );
    config["global"] = serde_json::json!({
        "scrape_interval": "1s",
        "evaluation_interval": "1s",
        "external_labels": {"runbook_base": "https://runbooks.example.com/operating.md"},
    });
    config["rule_files"] = serde_json::json!([root().join("deploy/prometheus/thunder-alerts.yml")]);
    let config_path = dir.path().join("prometheus.yml");
    // JSON is YAML.
    std::fs::write(&config_path, config.to_string()).expect("write config");
    let check = Command::new("promtool")
        .args(["check", "config"])
        .arg(&config_path)
        .output()
        .expect("promtool");
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    let prometheus = PrometheusProcess::start(&config_path, &dir.path().join("data")).await;
    // The targets: thunder-0's and thunder-1's admin ports, nothing else.
    let mut health = BTreeMap::new();
    let until = Instant::now() + thunder_testbed::PATIENCE;
    while Instant::now() < until {
        let data = prometheus.api("/api/v1/targets?state=active").await;
        health = data["activeTargets"]
            .as_array()
            .expect("activeTargets")
            .iter()
            .map(|t| {
                let labels = &t["labels"];
                assert_eq!(labels["job"], "thunder", "{t}");
                assert_eq!(labels["namespace"], "feeds", "{t}");
                (
                    (
                        labels["pod"].as_str().expect("pod").to_owned(),
                        labels["instance"].as_str().expect("instance").to_owned(),
                    ),
                    t["health"].as_str().expect("health").to_owned(),
                )
            })
            .collect();
        if health.values().all(|h| h != "unknown") && !health.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let expected: BTreeMap<_, _> = [
        (("thunder-0".to_owned(), server.admin.to_string()), "up"),
        (("thunder-1".to_owned(), nobody.to_string()), "down"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect();
    assert_eq!(health, expected);

    // The rules evaluate on what was scraped: both conditions hold (the alerts are pending
    // for their `for:` duration, which a test does not wait out).
    let mut seen = BTreeMap::new();
    let until = Instant::now() + thunder_testbed::PATIENCE;
    let expected = ["ThunderTargetDown", "ThunderMemoryNearLimit"];
    while Instant::now() < until && !expected.iter().all(|name| seen.contains_key(*name)) {
        // The alerts of the latest evaluation (the first ones, before any scrape, see no
        // target at all).
        seen.clear();
        let data = prometheus.api("/api/v1/alerts").await;
        for alert in data["alerts"].as_array().expect("alerts") {
            let name = alert["labels"]["alertname"].as_str().expect("alertname");
            seen.insert(name.to_owned(), alert.clone());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let down = seen.get("ThunderTargetDown").expect("ThunderTargetDown");
    assert_eq!(down["labels"]["pod"], "thunder-1");
    assert_eq!(
        down["annotations"]["runbook_url"],
        "https://runbooks.example.com/operating.md#runbook-thundertargetdown"
    );
    let memory = seen
        .get("ThunderMemoryNearLimit")
        .expect("ThunderMemoryNearLimit");
    assert_eq!(memory["labels"]["pod"], "thunder-0");
    assert_eq!(memory["labels"]["job"], "thunder");
    assert!(
        !seen.contains_key("ThunderTargetAbsent"),
        "a target is there: {seen:?}"
    );
}

/// The grouping of each aggregation (`sum`, `avg`, `min`, `max`, `count`) in `expr`, written
/// `AGG [by|without (labels)] (...)`: whether its result keeps the `instance` label.
fn aggregations_keep_instance(expr: &str) -> Vec<bool> {
    let words: Vec<(usize, &str)> = expr
        .match_indices(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .scan(0, |start, (at, sep)| {
            let word = (*start, &expr[*start..at]);
            *start = at + sep.len();
            Some(word)
        })
        .filter(|(_, w)| !w.is_empty())
        .collect();
    let mut out = Vec::new();
    for (i, (at, word)) in words.iter().enumerate() {
        if !["sum", "avg", "min", "max", "count"].contains(word) {
            continue;
        }
        let rest = expr[at + word.len()..].trim_start();
        if !(rest.starts_with('(') || rest.starts_with("by") || rest.starts_with("without")) {
            continue; // a label or metric name that happens to be the word
        }
        let grouping = words.get(i + 1).map(|(_, w)| *w);
        let list = rest
            .split_once('(')
            .and_then(|(_, l)| l.split_once(')'))
            .map_or("", |(l, _)| l);
        let listed = list.split(',').any(|l| l.trim() == "instance");
        out.push(match grouping {
            Some("by") => listed,
            Some("without") => !listed,
            _ => false,
        });
    }
    out
}

#[test]
fn dashboard_panels_never_sum_per_replica_state_over_instances() {
    assert_eq!(
        aggregations_keep_instance(
            r#"sum by (instance, le) (rate(a[5m])) + sum(b) + max without (instance) (c) + avg without (kind) (d)"#
        ),
        [true, false, false, true]
    );
    let catalogue: BTreeMap<String, &str> =
        catalogue().into_iter().map(|m| (m.name, m.kind)).collect();
    let dashboard = dashboard();
    let mut problems = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("title");
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let legend = target["legendFormat"].as_str().unwrap_or("");
            let groupings = aggregations_keep_instance(expr);
            if groupings.iter().all(|keeps| *keeps) {
                // One line per instance: the legend must tell them apart.
                if !legend.contains("{{instance}}") {
                    problems.push(format!("`{title}`: `{legend}` does not name the instance"));
                }
                continue;
            }
            // Summed over the instances: only what adds up across replicas, the calls they
            // served. Gauges are each replica's state (its lag, posts, bytes, connections), and
            // every replica ingests the whole topic, so neither sums to anything true.
            for (series, _) in promql_names(expr).metrics {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| series.strip_suffix(s))
                    .filter(|base| catalogue.get(*base) == Some(&"histogram"))
                    .unwrap_or(&series);
                let kind = catalogue.get(family).copied().unwrap_or("unknown");
                if kind == "gauge" || family.starts_with("kafka_") || family.starts_with("batch_") {
                    problems.push(format!(
                        "`{title}`: `{family}` ({kind}) aggregated over instances in `{expr}`"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A memory cgroup of the test's own with a limit, under the test process's cgroup (cgroup v1's
/// memory controller, or v2's); removed on drop.
struct LimitedCgroup {
    dir: PathBuf,
}

impl LimitedCgroup {
    /// `None` where this machine does not let the test make one (it needs root and a writable
    /// cgroup filesystem with the memory controller).
    fn create(limit: u64) -> Option<Self> {
        let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let name = format!("thunder-test-{}", std::process::id());
        for line in membership.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let (mount, file) = if controllers.split(',').any(|c| c == "memory") {
                ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
            } else if id == "0" && controllers.is_empty() {
                ("/sys/fs/cgroup", "memory.max")
            } else {
                continue;
            };
            let dir = PathBuf::from(mount)
                .join(path.trim_start_matches('/'))
                .join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            if std::fs::write(dir.join(file), limit.to_string()).is_ok() {
                return Some(Self { dir });
            }
            let _ = std::fs::remove_dir(&dir);
        }
        None
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        // Empty once its process has been reaped; the kernel may take a moment to agree.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Without --memory-limit-bytes, a server in a memory cgroup with a limit exports that limit.
/// Skipped where the test cannot make a cgroup (not root, or no writable cgroup filesystem).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_bytes_is_the_cgroups_limit_without_the_flag() {
    let limit: u64 = 3 << 30;
    let Some(cgroup) = LimitedCgroup::create(limit) else {
        eprintln!("skipped: no memory cgroup can be made here (needs root)");
        return;
    };
    let procs = cgroup.dir.join("cgroup.procs");
    // The shell moves itself into the cgroup, then becomes the server.
    let started = thunder_testbed::process::spawn_listening(
        |grpc, admin| {
            let mut command = Command::new("sh");
            command
                .args(["-c", r#"echo $$ > "$0" && exec "$@""#])
                .arg(&procs)
                .arg(env!("CARGO_BIN_EXE_thunder-server"))
                .arg(format!("--grpc-addr={grpc}"))
                .arg(format!("--admin-addr={admin}"))
                .args(["--demo-scale", "1000"])
                .env("RUST_LOG", "warn")
                .stdin(std::process::Stdio::null());
            command
        },
        thunder_testbed::PATIENCE,
    );
    let server = ServerProcess {
        child: started.child,
        grpc: started.grpc,
        admin: started.admin,
    };
    let membership =
        std::fs::read_to_string(format!("/proc/{}/cgroup", server.child.id())).expect("cgroup");
    let name = cgroup.dir.file_name().expect("name").to_string_lossy();
    assert!(membership.contains(&*name), "{membership}");
    let expected = format!("\nmemory_limit_bytes {limit}\n");
    assert!(
        thunder_testbed::eventually(|| async {
            thunder_testbed::http_get(server.admin, "/metrics")
                .await
                .text()
                .contains(&expected)
        })
        .await,
        "{}",
        thunder_testbed::http_get(server.admin, "/metrics")
            .await
            .text()
    );
    drop(server);
}

/// With --snapshot-dir the volume's size and free space are exported (here from a server whose
/// broker does not answer: it serves /metrics while it waits to catch up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_volume_is_exported_with_a_snapshot_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshots = dir.path().join("snapshots");
    let nobody = thunder_testbed::process::free_addr().to_string();
    let server = ServerProcess::start(
        &[
            "--kafka-brokers",
            &nobody,
            "--snapshot-dir",
            snapshots.to_str().expect("UTF-8 path"),
        ],
        thunder_testbed::PATIENCE,
    );
    let scrape = thunder_testbed::http_get(server.admin, "/metrics")
        .await
        .text();
    let value = |name: &str| {
        thunder_testbed::metrics::in_text(&scrape, name, &[])
            .unwrap_or_else(|| panic!("{name} not in\n{scrape}"))
    };
    let stat = Command::new("stat")
        .args(["-f", "-c", "%b %S"])
        .arg(dir.path())
        .output()
        .expect("stat -f");
    let stat = String::from_utf8_lossy(&stat.stdout);
    let (blocks, block_size) = stat.trim().split_once(' ').expect("blocks and size");
    let size = blocks.parse::<f64>().expect("blocks") * block_size.parse::<f64>().expect("size");
    assert_eq!(value("snapshot_volume_size_bytes"), size);
    let free = value("snapshot_volume_free_bytes");
    assert!(free > 0.0 && free <= size, "{free} of {size}");
}
