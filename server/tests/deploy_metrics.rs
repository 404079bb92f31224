//! The alert rules (deploy/prometheus/thunder-alerts.yml) and the dashboard
//! (deploy/grafana/thunder.json) name only metrics and labels the server exports.
//!
//! A demo-mode `thunder-server` is started and served one call; its `/metrics` scrape is the
//! truth for every family it shows (names, and label names from the samples). Families that a
//! healthy demo server has no sample of (listed in [`DECLARED_ONLY`] with the reason) are
//! checked against the registry's catalogue ([`Metrics::catalogue`], the source of
//! docs/metrics.md) instead, label names included; anything else missing fails.

mod common;
mod server_process;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use server_process::ServerProcess;
use thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient;
use thunder_server::admin::metrics::Metrics;

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
];

/// Labels Prometheus adds to every scraped series (target labels), and a histogram's `le`.
const TARGET_LABELS: &[&str] = &["job", "instance"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

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

/// YAML documents as JSON, through Python's yaml module (the YAML must parse).
fn yaml_as_json(path: &std::path::Path) -> serde_json::Value {
    let output = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)",
        ])
        .arg(path)
        .output()
        .expect("python3 runs (with its yaml module: Debian python3-yaml or pip PyYAML)");
    assert!(
        output.status.success(),
        "{} does not parse as YAML: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("python printed JSON")
}

/// Every alert's name and expression.
fn alert_exprs() -> Vec<(String, String)> {
    let rules = yaml_as_json(&repo().join("deploy/prometheus/thunder-alerts.yml"));
    let mut out = Vec::new();
    for group in rules[0]["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            out.push((
                rule["alert"].as_str().expect("alert name").to_owned(),
                rule["expr"].as_str().expect("expr").to_owned(),
            ));
        }
    }
    out
}

/// Every dashboard panel's title and query expressions (and the template variables' queries).
fn dashboard_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/thunder.json"))
        .expect("read the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
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
fn the_tokenizer_finds_metrics_labels_and_skips_functions() {
    let named = promql_names(
        r#"sum by (job, instance) (rate(a_total{job="thunder", status!~"o\"k"}[5m])) / on (job) b > 2 and c"#,
    );
    let metrics: Vec<_> = named.metrics.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(metrics, ["a_total", "b", "c"]);
    assert_eq!(named.metrics[0].1, ["job", "status"]);
    assert_eq!(named.grouping_labels, ["job", "instance", "job"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_name_only_exported_metrics_and_labels() {
    let server =
        ServerProcess::demo(&["--demo-scale", "1000", "--demo-events-per-sec", "10"]).await;
    // One call, so the per-status and per-stage families have samples.
    let mut client = InNetworkPostsServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .expect("connect");
    client
        .get_in_network_posts(common::request(&[1, 2, 3]))
        .await
        .expect("a call");
    // The store statistics are published every few seconds.
    let mut live = BTreeMap::new();
    let until = Instant::now() + common::PATIENCE;
    while Instant::now() < until {
        let scrape = common::http_get(server.admin, "/metrics").await;
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
        common::http_get(server.admin, "/metrics")
            .await
            .text()
            .contains("\nserver_ready 1\n")
    );

    let catalogue: BTreeMap<String, (String, BTreeSet<String>)> = Metrics::catalogue()
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
    assert_eq!(alerts, 11, "the eleven alerts");
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
            let labels = if let Some(labels) = live.get(family) {
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
