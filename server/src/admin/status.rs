//! The status page at `GET /` of the admin port: one server-rendered HTML page (no script; it
//! reloads itself every [`REFRESH_SECS`]) with readiness and why, the event source, the
//! process (version, git commit, resident memory, what the admin port allows), the Kafka
//! partitions, the store's sizes, the answers per second of the last [`RATE_WINDOW`], the last
//! minute's calls, latency and degrade levels, the snapshot's age and the base served from.
//! Every value is read from the metrics registry (what `/metrics` shows) and [`Readiness`];
//! every text is HTML-escaped.
//!
//! The recent figures come from [`StatusSampler`]: a background task samples the request
//! counters every [`SAMPLE_INTERVAL`], and the page compares now with the sample one window
//! ago (or the oldest, in a process younger than the window), so a rate is that of the
//! window, not an average over the idle time before it.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus::core::Collector;
use prometheus::proto::{MetricFamily, MetricType};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::serve::metrics::ServeMetrics;
use crate::telemetry::readiness::Readiness;

/// The endpoints, one a line (`/endpoints`, `/?format=text`, and on the status page).
pub const ENDPOINTS: &str = "thunder admin endpoints\n\
GET  /                                   status page (HTML; ?format=text: this list)\n\
GET  /endpoints                          this list\n\
GET  /metrics                            Prometheus text\n\
GET  /healthz                            the process is up (liveness)\n\
GET  /readyz                             200 once caught up, 503 before (readiness)\n\
GET  /debug/pprof/profile?seconds=N      CPU profile, gzipped pprof (N <= 60) [privileged]\n\
GET  /debug/pprof/flamegraph?seconds=N   the same as an SVG flamegraph [privileged]\n\
POST /admin/snapshot                     write a snapshot now (with --snapshot-dir; needs the\n\
                                         header X-Thunder-Admin: 1) [privileged]\n\
[privileged]: with --admin-token, send Authorization: Bearer <token>; without one, only a\n\
loopback admin listener serves them (a listener reachable from other hosts is read-only)\n";

/// How often the page reloads itself, in seconds.
pub const REFRESH_SECS: u32 = 5;
/// How often the request counters are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// The window of the "last minute" figures.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The window of the answers per second.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);
/// A Kafka connection error this recent is given as a reason when the server is not ready
/// (librdkafka repeats an unchanged error every 30 s).
const CONNECTION_ERROR_RECENT_SECS: f64 = 90.0;

/// The request counters at one instant.
#[derive(Clone, Debug)]
struct Sample {
    at: Instant,
    /// `get_in_network_posts_requests_total` by status.
    by_status: BTreeMap<String, u64>,
    /// Cumulative counts of `get_in_network_posts_duration_seconds`, by upper bound.
    latency: Vec<(f64, u64)>,
    latency_count: u64,
    /// `get_in_network_posts_degrade_level_total` by level.
    degrade: BTreeMap<String, u64>,
}

impl Sample {
    fn now(metrics: &ServeMetrics) -> Self {
        let histogram = metrics.request_duration.collect();
        let histogram = histogram
            .first()
            .and_then(|f| f.get_metric().first())
            .map(|m| m.get_histogram().clone())
            .unwrap_or_default();
        Self {
            at: Instant::now(),
            by_status: counters_by_label(&metrics.requests.collect(), "status"),
            latency: histogram
                .get_bucket()
                .iter()
                .map(|b| (b.upper_bound(), b.cumulative_count()))
                .collect(),
            latency_count: histogram.get_sample_count(),
            degrade: counters_by_label(&metrics.degrade_levels.collect(), "level"),
        }
    }
}

/// Counter values of `families` keyed by the value of `label`.
fn counters_by_label(families: &[MetricFamily], label: &str) -> BTreeMap<String, u64> {
    families
        .iter()
        .flat_map(|f| f.get_metric())
        .map(|m| {
            let key = m
                .get_label()
                .iter()
                .find(|l| l.name() == label)
                .map_or_else(String::new, |l| l.value().to_owned());
            (key, m.get_counter().get_value() as u64)
        })
        .collect()
}

/// The last minute's figures: the change of the counters between two samples.
#[derive(Debug, PartialEq)]
pub struct Window {
    /// Seconds between the samples.
    pub secs: f64,
    /// OK answers per second.
    pub answers_per_sec: f64,
    /// Calls by final status (non-zero ones).
    pub by_status: BTreeMap<String, u64>,
    /// Upper bound of the latency bucket holding the median, in seconds (`None` without
    /// calls; infinite beyond the largest bucket).
    pub p50: Option<f64>,
    /// The same for the 99th percentile.
    pub p99: Option<f64>,
    /// Store queries by degrade level (non-zero ones).
    pub degrade: BTreeMap<String, u64>,
}

impl Window {
    fn between(old: &Sample, new: &Sample) -> Self {
        let secs = new.at.saturating_duration_since(old.at).as_secs_f64();
        let delta = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
            b.iter()
                .map(|(k, v)| (k.clone(), v.saturating_sub(a.get(k).copied().unwrap_or(0))))
                .filter(|(_, v)| *v > 0)
                .collect::<BTreeMap<_, _>>()
        };
        let by_status = delta(&old.by_status, &new.by_status);
        let ok = by_status.get("ok").copied().unwrap_or(0);
        let calls = new.latency_count.saturating_sub(old.latency_count);
        let buckets: Vec<(f64, u64)> = new
            .latency
            .iter()
            .map(|&(bound, count)| {
                let before = old
                    .latency
                    .iter()
                    .find(|(b, _)| *b == bound)
                    .map_or(0, |(_, c)| *c);
                (bound, count.saturating_sub(before))
            })
            .collect();
        let quantile = |q: f64| {
            if calls == 0 {
                return None;
            }
            let rank = (q * calls as f64).ceil().max(1.0) as u64;
            Some(
                buckets
                    .iter()
                    .find(|(_, c)| *c >= rank)
                    .map_or(f64::INFINITY, |(b, _)| *b),
            )
        };
        Self {
            secs,
            answers_per_sec: if secs > 0.0 { ok as f64 / secs } else { 0.0 },
            by_status,
            p50: quantile(0.5),
            p99: quantile(0.99),
            degrade: delta(&old.degrade, &new.degrade),
        }
    }
}

/// Samples of the request counters over the last minute (see the module docs).
#[derive(Debug)]
pub struct StatusSampler {
    samples: Mutex<VecDeque<Sample>>,
}

impl Default for StatusSampler {
    fn default() -> Self {
        Self::new()
    }
}

impl StatusSampler {
    /// A sampler holding one sample, taken now.
    pub fn new() -> Self {
        Self {
            samples: Mutex::new(VecDeque::from([Sample::now(ServeMetrics::global())])),
        }
    }

    fn samples(&self) -> std::sync::MutexGuard<'_, VecDeque<Sample>> {
        // A panic while holding the lock leaves whole samples behind: keep using them.
        self.samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a sample now and forgets those older than the window.
    pub fn sample(&self) {
        let sample = Sample::now(ServeMetrics::global());
        let mut samples = self.samples();
        samples.push_back(sample);
        // Keep one sample at or beyond the window's start, so a window is a full minute.
        while samples.len() > 2 && samples.get(1).is_some_and(|s| s.at.elapsed() >= WINDOW) {
            samples.pop_front();
        }
    }

    /// The figures from the sample `span` ago to now: from the newest sample at least `span`
    /// old, or from the oldest one when the process is younger than `span`.
    pub fn window(&self, span: Duration) -> Window {
        let now = Sample::now(ServeMetrics::global());
        let start = window_start(&self.samples(), &now, span);
        Window::between(start.as_ref().unwrap_or(&now), &now)
    }

    /// Samples every [`SAMPLE_INTERVAL`] until `shutdown` turns true.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(SAMPLE_INTERVAL);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            self.sample();
        }
    }

    /// The status page; `admin_mode` says what the admin port allows.
    pub fn render(&self, readiness: &Readiness, admin_mode: &str) -> String {
        let minute = self.window(WINDOW);
        let recent = self.window(RATE_WINDOW);
        let families = prometheus::gather();
        Page::new(&families).render(readiness, admin_mode, &minute, &recent)
    }
}

/// The newest of `samples` at least `span` older than `now`, else the oldest.
fn window_start(samples: &VecDeque<Sample>, now: &Sample, span: Duration) -> Option<Sample> {
    samples
        .iter()
        .rev()
        .find(|s| now.at.saturating_duration_since(s.at) >= span)
        .or(samples.front())
        .cloned()
}

/// `text` with `&`, `<`, `>`, `"` and `'` replaced by their HTML entities.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One metric sample: its labels and value.
struct Value {
    labels: Vec<(String, String)>,
    value: f64,
}

/// The registry's gauges and counters by family name.
struct Page {
    values: BTreeMap<String, Vec<Value>>,
}

impl Page {
    fn new(families: &[MetricFamily]) -> Self {
        let mut values = BTreeMap::new();
        for family in families {
            let kind = family.get_field_type();
            let list: Vec<Value> = family
                .get_metric()
                .iter()
                .filter_map(|m| {
                    let value = match kind {
                        MetricType::GAUGE => m.get_gauge().get_value(),
                        MetricType::COUNTER => m.get_counter().get_value(),
                        _ => return None,
                    };
                    let labels = m
                        .get_label()
                        .iter()
                        .map(|l| (l.name().to_owned(), l.value().to_owned()))
                        .collect();
                    Some(Value { labels, value })
                })
                .collect();
            if !list.is_empty() {
                values.insert(family.name().to_owned(), list);
            }
        }
        Self { values }
    }

    /// The value of the unlabelled metric `name`.
    fn get(&self, name: &str) -> Option<f64> {
        self.values.get(name)?.first().map(|v| v.value)
    }

    /// The value of `name` with `label` = `value`.
    fn get_labelled(&self, name: &str, label: &str, value: &str) -> Option<f64> {
        self.values
            .get(name)?
            .iter()
            .find(|v| v.labels.iter().any(|(k, l)| k == label && l == value))
            .map(|v| v.value)
    }

    fn render(
        &self,
        readiness: &Readiness,
        admin_mode: &str,
        window: &Window,
        recent: &Window,
    ) -> String {
        let mut html = String::with_capacity(16 * 1024);
        let ready = readiness.is_ready();
        let _ = write!(
            html,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
             <title>thunder status</title><style>{STYLE}</style></head><body>\n\
             <h1>thunder status</h1>\n"
        );
        let (class, word) = if ready {
            ("ok", "READY")
        } else {
            ("bad", "NOT READY")
        };
        let connection = self.kafka_connection();
        let mut reason = readiness.reason();
        if let Some((age_secs, error)) = &connection
            && !ready
            && *age_secs < CONNECTION_ERROR_RECENT_SECS
        {
            let _ = write!(
                reason,
                "; Kafka brokers refuse the connection ({}): {}",
                error.reason, error.message
            );
        }
        let _ = write!(
            html,
            "<h2>Readiness</h2>\n<table>\
             <tr><th>state</th><td id=\"ready\" class=\"{class}\">{word}</td></tr>\
             <tr><th>why</th><td id=\"ready-reason\">{}</td></tr>\
             <tr><th>event source</th><td id=\"source\">{}</td></tr>\
             <tr><th>up for</th><td id=\"uptime\">{}</td></tr>\
             <tr><th>start-up to ready</th><td id=\"init-duration\">{}</td></tr>",
            escape(&reason),
            escape(&readiness.source()),
            duration(readiness.uptime_secs()),
            if ready {
                self.get("init_duration_seconds")
                    .map_or_else(|| "-".to_owned(), duration)
            } else {
                "not yet".to_owned()
            },
        );
        if let Some((age_secs, error)) = &connection {
            let _ = write!(
                html,
                "<tr><th>last Kafka connection error</th><td id=\"kafka-connection\">{} ago, \
                 {} ({} so far): {}</td></tr>",
                duration(*age_secs),
                escape(error.reason),
                self.connection_error_counts(),
                escape(&error.message),
            );
        }
        html.push_str("</table>\n");
        self.process(&mut html, admin_mode);
        self.partitions(&mut html);
        self.store(&mut html);
        last_minute(&mut html, window, recent);
        self.snapshot(&mut html);
        let _ = write!(
            html,
            "<h2>Links</h2>\n<ul>\
             <li><a id=\"link-metrics\" href=\"/metrics\">/metrics</a> (Prometheus text)</li>\
             <li><a id=\"link-flamegraph\" href=\"/debug/pprof/flamegraph?seconds=10\">\
             flamegraph</a> (10 s CPU profile, SVG)</li>\
             <li><a id=\"link-readyz\" href=\"/readyz\">/readyz</a></li>\
             <li><a id=\"link-healthz\" href=\"/healthz\">/healthz</a></li>\
             <li><a id=\"link-endpoints\" href=\"/endpoints\">/endpoints</a> (as text)</li>\
             </ul>\n<h2>Endpoints</h2>\n<pre id=\"endpoints\">{}</pre>\n</body></html>\n",
            escape(ENDPOINTS)
        );
        html
    }

    /// What runs: version, git commit and compiler, resident memory, the admin port's mode.
    fn process(&self, html: &mut String, admin_mode: &str) {
        use crate::version;
        let rss = self
            .get("process_resident_memory_bytes")
            .map_or_else(|| "-".to_owned(), bytes);
        let _ = write!(
            html,
            "<h2>Process</h2>\n<table>\
             <tr><th>version</th><td id=\"version\">{}</td></tr>\
             <tr><th>git commit</th><td id=\"git-sha\" title=\"{}\">{}</td></tr>\
             <tr><th>compiler</th><td id=\"rustc\">rustc {}</td></tr>\
             <tr><th>resident memory</th><td id=\"rss\">{}</td></tr>\
             <tr><th>admin port</th><td id=\"admin-mode\">{}</td></tr>\
             </table>\n",
            escape(version::VERSION),
            escape(version::GIT_SHA),
            escape(version::short_sha()),
            escape(version::RUSTC),
            rss,
            escape(admin_mode),
        );
    }

    /// The latest Kafka connection failure and its age in seconds, if any.
    fn kafka_connection(&self) -> Option<(f64, crate::kafka::ConnectionError)> {
        let error = crate::kafka::last_connection_error()?;
        let age = SystemTime::now()
            .duration_since(error.at)
            .unwrap_or_default()
            .as_secs_f64();
        Some((age, error))
    }

    /// `kafka_connection_errors_total` by reason, the non-zero ones: `tls 3, transport 1`.
    fn connection_error_counts(&self) -> String {
        let counts: Vec<String> = self
            .values
            .get("kafka_connection_errors_total")
            .into_iter()
            .flatten()
            .filter(|v| v.value > 0.0)
            .map(|v| {
                let reason = v.labels.iter().find(|(k, _)| k == "reason");
                format!(
                    "{} {}",
                    reason.map_or("", |(_, r)| r.as_str()),
                    number(v.value)
                )
            })
            .collect();
        escape(&counts.join(", "))
    }

    /// Every `kafka_partition_*` metric, one row per topic and partition.
    fn partitions(&self, html: &mut String) {
        html.push_str("<h2>Kafka partitions</h2>\n");
        let columns: Vec<&String> = self
            .values
            .keys()
            .filter(|name| name.starts_with("kafka_partition_"))
            .collect();
        let mut rows: BTreeMap<(String, i64), BTreeMap<&String, f64>> = BTreeMap::new();
        for name in &columns {
            for value in &self.values[*name] {
                let label = |key: &str| {
                    value
                        .labels
                        .iter()
                        .find(|(k, _)| k == key)
                        .map(|(_, v)| v.clone())
                };
                let topic = label("topic").unwrap_or_default();
                let partition = label("partition")
                    .and_then(|p| p.parse::<i64>().ok())
                    .unwrap_or(-1);
                rows.entry((topic, partition))
                    .or_default()
                    .insert(*name, value.value);
            }
        }
        if rows.is_empty() {
            html.push_str(
                "<p id=\"partitions\">no Kafka partitions (the store is fed by the source \
                 above)</p>\n",
            );
            return;
        }
        let _ = write!(
            html,
            "<table id=\"partitions\"><tr><th>topic</th><th>partition</th>"
        );
        for name in &columns {
            let short = name.trim_start_matches("kafka_partition_");
            let _ = write!(html, "<th>{}</th>", escape(short));
        }
        html.push_str("</tr>");
        for ((topic, partition), cells) in &rows {
            let stalled = cells
                .iter()
                .any(|(k, v)| k.as_str() == "kafka_partition_stalled" && *v > 0.0);
            let class = if stalled { " class=\"bad\"" } else { "" };
            let _ = write!(
                html,
                "<tr{class}><td>{}</td><td>{partition}</td>",
                escape(topic)
            );
            for name in &columns {
                match cells.get(*name) {
                    Some(v) => {
                        let _ = write!(html, "<td>{}</td>", number(*v));
                    }
                    None => html.push_str("<td>-</td>"),
                }
            }
            html.push_str("</tr>");
        }
        html.push_str("</table>\n");
    }

    /// Posts, authors and bytes per structure.
    fn store(&self, html: &mut String) {
        let posts = self.get("post_store_total_posts").unwrap_or(0.0);
        let _ = write!(
            html,
            "<h2>Store</h2>\n<table>\
             <tr><th>posts stored</th><td id=\"posts\">{}</td></tr>\
             <tr><th>authors stored</th><td id=\"authors\">{}</td></tr>\
             <tr><th>deleted ids remembered</th><td id=\"tombstones\">{}</td></tr>",
            number(posts),
            number(self.get("post_store_user_count").unwrap_or(0.0)),
            number(self.get("post_store_deleted_posts").unwrap_or(0.0)),
        );
        for kind in ["original_posts", "secondary_posts", "video_posts"] {
            if let Some(v) = self.get_labelled("post_store_entity_count", "type", kind) {
                let _ = write!(
                    html,
                    "<tr><th>{} timeline entries</th><td>{}</td></tr>",
                    kind.trim_end_matches("_posts"),
                    number(v)
                );
            }
        }
        html.push_str("</table>\n<h3>Bytes per structure</h3>\n<table id=\"bytes\">");
        let mut total = 0.0;
        for (name, list) in &self.values {
            if !(name.starts_with("post_store_") && name.contains("bytes")) {
                continue;
            }
            for value in list {
                let label = value
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",");
                let what = if label.is_empty() {
                    name.clone()
                } else {
                    format!("{name}{{{label}}}")
                };
                if !value.labels.iter().any(|(_, v)| v == "used") {
                    total += value.value;
                }
                let _ = write!(
                    html,
                    "<tr><th>{}</th><td>{}</td></tr>",
                    escape(&what),
                    bytes(value.value)
                );
            }
        }
        let per_post = if posts > 0.0 {
            bytes(total / posts)
        } else {
            "-".to_owned()
        };
        let _ = writeln!(
            html,
            "<tr><th>per post (reserved, all structures)</th><td id=\"bytes-per-post\">{per_post}\
             </td></tr></table>"
        );
    }

    /// Snapshot age and the last one's figures; the base the store serves from.
    fn snapshot(&self, html: &mut String) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let last = self
            .get("snapshot_last_success_timestamp_seconds")
            .unwrap_or(0.0);
        let age = if last > 0.0 {
            format!("{} ago", duration((now - last).max(0.0)))
        } else {
            "none written yet".to_owned()
        };
        let base_bytes = self.get("snapshot_base_bytes").unwrap_or(0.0);
        let base = if base_bytes > 0.0 {
            let created = self
                .get("snapshot_base_created_timestamp_seconds")
                .unwrap_or(0.0);
            let mut offsets: Vec<(i64, f64)> = self
                .values
                .get("snapshot_base_offset")
                .into_iter()
                .flatten()
                .filter_map(|v| {
                    let partition = v.labels.iter().find(|(k, _)| k == "partition")?;
                    Some((partition.1.parse().ok()?, v.value))
                })
                .collect();
            offsets.sort_by_key(|&(partition, _)| partition);
            let offsets: Vec<String> = offsets
                .iter()
                .map(|(partition, offset)| format!("{partition}: {offset}"))
                .collect();
            let checked = if self.get("snapshot_base_checked").unwrap_or(0.0) > 0.0 {
                "every record checked"
            } else {
                "records being checked"
            };
            format!(
                "{} posts / {} / written {} ago / offsets {} / {checked}",
                number(self.get("snapshot_base_posts").unwrap_or(0.0)),
                bytes(base_bytes),
                duration((now - created).max(0.0)),
                if offsets.is_empty() {
                    "none".to_owned()
                } else {
                    offsets.join(", ")
                },
            )
        } else {
            "none (the store was built by replay)".to_owned()
        };
        let _ = write!(
            html,
            "<h2>Snapshot</h2>\n<table>\
             <tr><th>age of the last snapshot</th><td id=\"snapshot-age\">{}</td></tr>\
             <tr><th>its posts / size / duration</th><td>{} / {} / {}</td></tr>\
             <tr><th>failures</th><td id=\"snapshot-failures\">{}</td></tr>\
             <tr><th>base served from: posts / size / age / offsets</th>\
             <td id=\"snapshot-base\">{}</td></tr>\
             </table>\n",
            escape(&age),
            number(self.get("snapshot_last_posts").unwrap_or(0.0)),
            bytes(self.get("snapshot_last_bytes").unwrap_or(0.0)),
            duration(self.get("snapshot_last_duration_seconds").unwrap_or(0.0)),
            number(self.get("snapshot_failures_total").unwrap_or(0.0)),
            escape(&base),
        );
    }
}

/// The answers per second of the last [`RATE_WINDOW`] (`recent`), and the last minute's
/// calls, latency and degrade levels (`window`).
fn last_minute(html: &mut String, window: &Window, recent: &Window) {
    let latency = |q: Option<f64>| match q {
        None => "- (no calls)".to_owned(),
        Some(s) if s.is_infinite() => "over the largest bucket".to_owned(),
        Some(s) => format!("&le; {:.1} ms", s * 1000.0),
    };
    let statuses = if window.by_status.is_empty() {
        "no calls".to_owned()
    } else {
        window
            .by_status
            .iter()
            .map(|(k, v)| format!("{}: {v}", escape(k)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let queries: u64 = window.degrade.values().sum();
    let degraded: u64 = window
        .degrade
        .iter()
        .filter(|(level, _)| level.as_str() != "0")
        .map(|(_, n)| n)
        .sum();
    let highest = window
        .degrade
        .keys()
        .filter_map(|level| level.parse::<u8>().ok())
        .max();
    let degrade = match highest {
        None => "0 (no store queries)".to_owned(),
        Some(level) => format!(
            "highest {level}; {degraded} of {queries} queries degraded ({})",
            window
                .degrade
                .iter()
                .map(|(k, v)| format!("level {}: {v}", escape(k)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let _ = write!(
        html,
        "<h2>Last minute</h2>\n<table>\
         <tr><th>answers/s (OK, last {})</th><td id=\"answers-per-sec\">{:.1}</td></tr>\
         <tr><th>window of the figures below</th><td id=\"window\">{}</td></tr>\
         <tr><th>calls by status</th><td id=\"statuses\">{statuses}</td></tr>\
         <tr><th>latency p50</th><td id=\"latency-p50\">{}</td></tr>\
         <tr><th>latency p99</th><td id=\"latency-p99\">{}</td></tr>\
         <tr><th>degrade level</th><td id=\"degrade\">{degrade}</td></tr>\
         </table>\n",
        duration(recent.secs),
        recent.answers_per_sec,
        duration(window.secs),
        latency(window.p50),
        latency(window.p99),
    );
}

/// A count with thousands separators (`1 234 567`); fractions are rounded.
fn number(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    if value < -0.5 {
        out.insert(0, '-');
    }
    out
}

/// Bytes in B, KiB, MiB or GiB.
fn bytes(value: f64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = value;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Seconds as `1h 02m 03s`, `2m 05s` or `4.2 s`.
fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "-".to_owned();
    }
    if secs < 60.0 {
        return format!("{secs:.1} s");
    }
    let whole = secs as u64;
    let (h, m, s) = (whole / 3600, whole / 60 % 60, whole % 60);
    if h > 0 {
        format!("{h}h {m:02}m {s:02}s")
    } else {
        format!("{m}m {s:02}s")
    }
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin-bottom:1em}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}\
th{background:#f4f4f4;font-weight:normal}\
.ok{background:#d9f2d9;font-weight:bold}.bad{background:#f8d7d7;font-weight:bold}\
pre{background:#f8f8f8;padding:8px}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_markup() {
        assert_eq!(
            escape("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn numbers_and_units() {
        assert_eq!(number(1_234_567.0), "1 234 567");
        assert_eq!(number(12.0), "12");
        assert_eq!(number(-1000.0), "-1 000");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
        assert_eq!(duration(4.25), "4.2 s");
        assert_eq!(duration(125.0), "2m 05s");
        assert_eq!(duration(3723.0), "1h 02m 03s");
    }

    fn sample(at: Instant, ok: u64, latency: &[(f64, u64)], degrade: &[(&str, u64)]) -> Sample {
        Sample {
            at,
            by_status: BTreeMap::from([("ok".to_owned(), ok)]),
            latency: latency.to_vec(),
            latency_count: latency.last().map_or(0, |l| l.1),
            degrade: degrade.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        }
    }

    #[test]
    fn window_is_the_change_between_samples() {
        let start = Instant::now();
        let old = sample(
            start,
            100,
            &[(0.001, 50), (0.01, 100), (f64::INFINITY, 100)],
            &[("0", 100), ("1", 0)],
        );
        // 60 calls later: 29 more under 1 ms, 30 more under 10 ms, one beyond the buckets.
        let new = sample(
            start + Duration::from_secs(30),
            160,
            &[(0.001, 79), (0.01, 159), (f64::INFINITY, 160)],
            &[("0", 150), ("1", 10)],
        );
        let w = Window::between(&old, &new);
        assert_eq!(w.secs, 30.0);
        assert_eq!(w.answers_per_sec, 2.0);
        assert_eq!(w.by_status, BTreeMap::from([("ok".to_owned(), 60)]));
        assert_eq!(w.p50, Some(0.01));
        assert_eq!(w.p99, Some(f64::INFINITY));
        assert_eq!(
            w.degrade,
            BTreeMap::from([("0".to_owned(), 50), ("1".to_owned(), 10)])
        );
        let idle = Window::between(&new, &new);
        assert_eq!(idle.answers_per_sec, 0.0);
        assert_eq!(idle.p50, None);
        assert!(idle.by_status.is_empty());
    }

    #[test]
    fn the_rate_is_that_of_the_last_ten_seconds_not_of_the_idle_minute() {
        let now_at = Instant::now();
        let ago = |secs: u64| {
            now_at
                .checked_sub(Duration::from_secs(secs))
                .expect("the clock has run a minute")
        };
        // Idle for 50 s, then 300 answers/s for the last 10 s.
        let samples = VecDeque::from([
            sample(ago(60), 0, &[], &[]),
            sample(ago(50), 0, &[], &[]),
            sample(ago(11), 0, &[], &[]),
            sample(ago(10), 0, &[], &[]),
            sample(ago(5), 1500, &[], &[]),
        ]);
        let now = sample(now_at, 3000, &[], &[]);
        let rate = |span: u64| {
            let start = window_start(&samples, &now, Duration::from_secs(span)).expect("a sample");
            Window::between(&start, &now)
        };
        assert_eq!(rate(10).answers_per_sec, 300.0);
        assert_eq!(rate(10).secs, 10.0);
        assert_eq!(rate(60).answers_per_sec, 50.0);
        // A process younger than the window: from its first sample.
        let young = VecDeque::from([sample(ago(4), 0, &[], &[])]);
        let start = window_start(&young, &now, RATE_WINDOW).expect("a sample");
        assert_eq!(Window::between(&start, &now).answers_per_sec, 750.0);
    }
}
