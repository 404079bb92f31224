//! The ground floor's own metrics: what the process is and how it stands ([`ProcessMetrics`]:
//! the standard `process_*` metrics, the resources it is allowed, the build, readiness and
//! start-up time), and the sizes of the store it serves ([`StoreMetrics`], refreshed by the
//! maintenance task and as readiness turns on). Each wing declares its own metrics in its own
//! `metrics.rs` (see [`registry`](crate::telemetry::registry)).

use prometheus::core::Collector;
use prometheus::{Gauge, IntGauge, IntGaugeVec};
use thunder_engine::StoreStats;

use crate::telemetry::registry::{Registrar, family_descs};
use crate::telemetry::resources::ResourceCollector;

/// The process's own metrics.
#[derive(Clone, Debug)]
pub struct ProcessMetrics {
    /// The standard `process_*` metrics (resident memory, CPU, start time, open files), read
    /// from `/proc/self` at each scrape.
    pub process: ProcessCollector,
    /// `memory_limit_bytes` and the snapshot volume's space (`snapshot_volume_*_bytes`).
    pub resources: ResourceCollector,
    /// `thunder_build_info{version,git_sha,rustc,features}`: 1, labelled with what the binary
    /// is ([`crate::version`]).
    pub build_info: IntGaugeVec,
    /// `init_duration_seconds`: seconds from start-up to ready (store caught up).
    pub init_duration: Gauge,
    /// `server_ready`: 1 while readiness is SERVING (caught up, no partition stalled), else 0.
    pub ready: IntGauge,
}

impl ProcessMetrics {
    /// Builds the metrics into `r`.
    pub fn new(r: &Registrar<'_>) -> Self {
        let metrics = Self {
            process: r.collector(ProcessCollector::new(), ProcessCollector::FAMILIES),
            resources: r.collector(ResourceCollector::new(), ResourceCollector::FAMILIES),
            build_info: r.gauge_vec(
                "thunder_build_info",
                "1, labelled with the version, git commit, compiler and cargo features of the binary",
                &["version", "git_sha", "rustc", "features"],
            ),
            init_duration: r.float_gauge("init_duration_seconds", "Seconds from start-up to ready"),
            ready: r.gauge(
                "server_ready",
                "1 while readiness is SERVING (store caught up, no Kafka partition stalled), else 0",
            ),
        };
        metrics
            .build_info
            .with_label_values(&[
                crate::version::VERSION,
                crate::version::GIT_SHA,
                crate::version::RUSTC,
                crate::version::FEATURES,
            ])
            .set(1);
        metrics
    }
}

crate::process_instance!(ProcessMetrics);

/// The sizes of the store the process serves, as the `post_store_*` gauges.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    /// `post_store_user_count`: authors in the store.
    pub authors: IntGauge,
    /// `post_store_total_posts`: post records in the store.
    pub posts: IntGauge,
    /// `post_store_deleted_posts`: live tombstones (deleted post ids remembered).
    pub tombstones: IntGauge,
    /// `post_store_entity_count{type}`: store entities by type.
    pub entities: IntGaugeVec,
    /// `post_store_arena_bytes{kind}`: arena bytes by kind (`reserved`, `used`).
    pub arena_bytes: IntGaugeVec,
    /// `post_store_timeline_bytes`: bytes held by timeline buffers.
    pub timeline_bytes: IntGauge,
    /// `post_store_index_bytes`: bytes of the post and author indexes (tables and author
    /// records).
    pub index_bytes: IntGauge,
    /// `snapshot_base_posts`: posts the base the store serves from still stores (deleted,
    /// evicted and trimmed ones left out; 0: no base). A size of the store, refreshed with the
    /// others; the base's other gauges are the snapshot wing's.
    pub base_posts: IntGauge,
}

impl StoreMetrics {
    /// Builds the metrics into `r`.
    pub fn new(r: &Registrar<'_>) -> Self {
        Self {
            authors: r.gauge("post_store_user_count", "Authors in the store"),
            posts: r.gauge("post_store_total_posts", "Post records in the store"),
            tombstones: r.gauge("post_store_deleted_posts", "Live tombstones in the store"),
            entities: r.gauge_vec(
                "post_store_entity_count",
                "Store entities by type",
                &["type"],
            ),
            arena_bytes: r.gauge_vec(
                "post_store_arena_bytes",
                "Bytes of the post arena by kind",
                &["kind"],
            ),
            timeline_bytes: r.gauge(
                "post_store_timeline_bytes",
                "Bytes held by per-author timeline buffers",
            ),
            index_bytes: r.gauge(
                "post_store_index_bytes",
                "Bytes of the post and author indexes: their tables and the author records",
            ),
            base_posts: r.gauge(
                "snapshot_base_posts",
                "Posts the base still stores (deleted, evicted and trimmed ones left out)",
            ),
        }
    }

    /// Publishes the store's statistics as the gauges.
    pub fn record(&self, stats: &StoreStats) {
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.authors.set(as_i64(stats.authors));
        self.posts.set(as_i64(stats.posts));
        self.tombstones.set(as_i64(stats.tombstones));
        for (kind, n) in [
            ("users", stats.authors),
            ("posts", stats.posts),
            ("original_posts", stats.original_entries),
            ("secondary_posts", stats.secondary_entries),
            ("video_posts", stats.video_entries),
            ("deleted_posts", stats.tombstones),
        ] {
            self.entities.with_label_values(&[kind]).set(as_i64(n));
        }
        self.arena_bytes
            .with_label_values(&["reserved"])
            .set(as_i64(stats.arena_bytes_reserved));
        self.arena_bytes
            .with_label_values(&["used"])
            .set(as_i64(stats.arena_bytes_used));
        self.timeline_bytes.set(as_i64(stats.timeline_bytes));
        self.index_bytes.set(as_i64(stats.index_bytes));
        self.base_posts.set(as_i64(stats.base_posts));
    }
}

crate::process_instance!(StoreMetrics);

/// The standard `process_*` metrics of the Prometheus client libraries, read from
/// `/proc/self` at each scrape (the prometheus crate's own collector needs another procfs
/// major version than the workspace's). Where `/proc` cannot be read, nothing is exported.
#[derive(Clone, Debug)]
pub struct ProcessCollector {
    descs: Vec<prometheus::core::Desc>,
}

impl ProcessCollector {
    /// Name, type and help of each family.
    pub const FAMILIES: &[(&str, &str, &str)] = &[
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes",
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes",
        ),
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds",
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds",
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors",
        ),
    ];

    fn new() -> Self {
        Self {
            descs: family_descs(Self::FAMILIES),
        }
    }

    /// The current values, in [`Self::FAMILIES`] order, or `None` when `/proc` is unreadable.
    fn read() -> Option<[f64; 5]> {
        let me = procfs::process::Process::myself().ok()?;
        let stat = me.stat().ok()?;
        let ticks = procfs::ticks_per_second().max(1) as f64;
        let boot_secs = procfs::boot_time_secs().ok()? as f64;
        let open_fds = me.fd_count().unwrap_or(0) as f64;
        Some([
            (stat.rss * procfs::page_size()) as f64,
            stat.vsize as f64,
            (stat.utime + stat.stime) as f64 / ticks,
            boot_secs + stat.starttime as f64 / ticks,
            open_fds,
        ])
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        use prometheus::proto::{Counter, Gauge as GaugeValue, Metric, MetricFamily, MetricType};
        let Some(values) = Self::read() else {
            return Vec::new();
        };
        Self::FAMILIES
            .iter()
            .zip(values)
            .map(|((name, kind, help), value)| {
                let mut metric = Metric::default();
                let mut family = MetricFamily::default();
                if *kind == "counter" {
                    let mut counter = Counter::default();
                    counter.set_value(value);
                    metric.set_counter(counter);
                    family.set_field_type(MetricType::COUNTER);
                } else {
                    let mut gauge = GaugeValue::default();
                    gauge.set_value(value);
                    metric.set_gauge(gauge);
                    family.set_field_type(MetricType::GAUGE);
                }
                family.set_name((*name).to_owned());
                family.set_help((*help).to_owned());
                family.set_metric(vec![metric]);
                family
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use prometheus::Registry;

    use super::*;

    #[test]
    fn build_info_is_one_with_the_version_and_commit() {
        let registry = Registry::new();
        ProcessMetrics::new(&Registrar::new(&registry));
        let families = registry.gather();
        let info = families
            .iter()
            .find(|f| f.name() == "thunder_build_info")
            .expect("exported");
        let sample = info.get_metric().first().expect("one sample");
        assert_eq!(sample.get_gauge().get_value(), 1.0);
        let label = |name: &str| {
            sample
                .get_label()
                .iter()
                .find(|l| l.name() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        assert_eq!(label("version"), crate::version::VERSION);
        assert_eq!(label("git_sha"), crate::version::GIT_SHA);
        assert!(!label("rustc").is_empty());
        assert!(!label("features").is_empty());
    }

    #[test]
    fn process_metrics_read_this_process() {
        let registry = Registry::new();
        ProcessMetrics::new(&Registrar::new(&registry));
        let families = registry.gather();
        let value = |name: &str| {
            let family = families
                .iter()
                .find(|f| f.name() == name)
                .unwrap_or_else(|| panic!("{name} missing"));
            let metric = &family.get_metric()[0];
            if family.get_field_type() == prometheus::proto::MetricType::COUNTER {
                metric.get_counter().get_value()
            } else {
                metric.get_gauge().get_value()
            }
        };
        assert!(value("process_resident_memory_bytes") > 1_000_000.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(
            started <= now + 2.0 && started > now - 86_400.0,
            "{started}"
        );
        assert!(value("process_open_fds") >= 3.0);
    }

    #[test]
    fn store_stats_become_the_gauges() {
        let registry = Registry::new();
        let metrics = StoreMetrics::new(&Registrar::new(&registry));
        metrics.record(&StoreStats {
            authors: 3,
            posts: 7,
            tombstones: 2,
            arena_bytes_reserved: 4096,
            ..StoreStats::default()
        });
        assert_eq!(metrics.posts.get(), 7);
        assert_eq!(
            metrics.entities.with_label_values(&["deleted_posts"]).get(),
            2
        );
        assert_eq!(
            metrics.arena_bytes.with_label_values(&["reserved"]).get(),
            4096
        );
    }
}
