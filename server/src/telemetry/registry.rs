//! The metric registry every wing declares its metrics into: [`Registrar`] builds a metric,
//! registers it as it is built and notes it in a catalogue, so a metric is named (name, help,
//! labels, buckets) once, where its wing declares it.
//!
//! # How a wing declares its metrics
//! One file a wing (`serve/metrics.rs`, `kafka/metrics.rs`, `snapshot/metrics.rs`, ...), as
//! TiKV keeps one metrics file a component: a struct of the wing's metrics with a
//! `new(&Registrar)` that builds each field, and [`process_instance!`] for its one instance in
//! the process registry, reached through the struct's `global()`, the wing's one way to its
//! metrics:
//!
//! ```
//! # use prometheus::IntCounter;
//! # use thunder_server::process_instance;
//! # use thunder_server::telemetry::registry::Registrar;
//! /// The wing's metrics.
//! pub struct WingMetrics {
//!     /// `wing_events_total`: events seen.
//!     pub events: IntCounter,
//! }
//!
//! impl WingMetrics {
//!     /// Builds the metrics into `r`.
//!     pub fn new(r: &Registrar<'_>) -> Self {
//!         Self { events: r.counter("wing_events_total", "Events seen") }
//!     }
//! }
//!
//! process_instance!(WingMetrics);
//! WingMetrics::global().events.inc();
//! ```
//!
//! The process registry is [`prometheus::default_registry`]; [`render`] encodes it for
//! `/metrics`. Tests build a wing's metrics into a [`Registry`] of their own, so that their
//! counts do not depend on other tests of the same process. The list of every wing (registered
//! together at start-up, and catalogued for docs/metrics.md) is the lifecycle's.

use std::cell::RefCell;

use prometheus::core::Collector;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use crate::telemetry::count_histogram::CountHistogramVec;

/// One exported metric family, as docs/metrics.md lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricInfo {
    /// Family name (a histogram's series add `_bucket`, `_sum` and `_count`).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Label names (empty: one unlabelled series).
    pub labels: Vec<String>,
    /// The help text of the family.
    pub help: String,
}

/// Builds metrics and registers each in a registry as it is built, noting each family in a
/// catalogue.
pub struct Registrar<'a> {
    registry: &'a Registry,
    catalogue: RefCell<Vec<MetricInfo>>,
}

impl std::fmt::Debug for Registrar<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registrar")
            .field("catalogue", &self.catalogue.borrow().len())
            .finish_non_exhaustive()
    }
}

impl Registrar<'static> {
    /// Registers into the process registry ([`prometheus::default_registry`]), which `/metrics`
    /// serves.
    pub fn process() -> Self {
        Self::new(prometheus::default_registry())
    }
}

impl<'a> Registrar<'a> {
    /// Registers into `registry`.
    pub fn new(registry: &'a Registry) -> Self {
        Self {
            registry,
            catalogue: RefCell::new(Vec::new()),
        }
    }

    /// The families built so far, in the order they were built.
    pub fn into_catalogue(self) -> Vec<MetricInfo> {
        self.catalogue.into_inner()
    }

    /// Registers `built`. Metric definitions are compile-time constants, so an invalid one is a
    /// bug in the wing that declares it; a registration clash (something else registered the
    /// same name) is logged and the metric kept, unexported, rather than failing start-up.
    fn register<C: Collector + Clone + 'static>(&self, built: prometheus::Result<C>) -> C {
        let collector = built.unwrap_or_else(|e| panic!("invalid metric definition: {e}"));
        if let Err(e) = self.registry.register(Box::new(collector.clone())) {
            tracing::warn!(error = %e, "metric not registered");
        }
        collector
    }

    /// Notes the families of `collector` as `kind` in the catalogue.
    fn note<C: Collector>(&self, collector: &C, kind: &'static str) {
        let mut catalogue = self.catalogue.borrow_mut();
        for desc in collector.desc() {
            catalogue.push(MetricInfo {
                name: desc.fq_name.clone(),
                kind,
                labels: desc.variable_labels.clone(),
                help: desc.help.clone(),
            });
        }
    }

    /// Registers a hand-written collector and catalogues its unlabelled `families` (name,
    /// type, help).
    pub fn collector<C: Collector + Clone + 'static>(
        &self,
        collector: C,
        families: &[(&str, &'static str, &str)],
    ) -> C {
        let collector = self.register(Ok(collector));
        let mut catalogue = self.catalogue.borrow_mut();
        for (name, kind, help) in families {
            catalogue.push(MetricInfo {
                name: (*name).to_owned(),
                kind,
                labels: Vec::new(),
                help: (*help).to_owned(),
            });
        }
        collector
    }

    /// Registers a hand-written collector whose descriptions name its families and labels.
    pub fn described<C: Collector + Clone + 'static>(&self, collector: C, kind: &'static str) -> C {
        let built = self.register(Ok(collector));
        self.note(&built, kind);
        built
    }

    /// A counter.
    pub fn counter(&self, name: &str, help: &str) -> IntCounter {
        let built = self.register(IntCounter::new(name, help));
        self.note(&built, "counter");
        built
    }

    /// A counter with `labels`.
    pub fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        let built = self.register(IntCounterVec::new(Opts::new(name, help), labels));
        self.note(&built, "counter");
        built
    }

    /// A whole-number gauge.
    pub fn gauge(&self, name: &str, help: &str) -> IntGauge {
        let built = self.register(IntGauge::new(name, help));
        self.note(&built, "gauge");
        built
    }

    /// A gauge of fractional values (seconds, timestamps).
    pub fn float_gauge(&self, name: &str, help: &str) -> Gauge {
        let built = self.register(Gauge::new(name, help));
        self.note(&built, "gauge");
        built
    }

    /// A whole-number gauge with `labels`.
    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        let built = self.register(IntGaugeVec::new(Opts::new(name, help), labels));
        self.note(&built, "gauge");
        built
    }

    /// A histogram with the bucket bounds `buckets`.
    pub fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        let built = self.register(Histogram::with_opts(
            HistogramOpts::new(name, help).buckets(buckets),
        ));
        self.note(&built, "histogram");
        built
    }

    /// A histogram with `labels` and the bucket bounds `buckets`.
    pub fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Vec<f64>,
    ) -> HistogramVec {
        let built = self.register(HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets),
            labels,
        ));
        self.note(&built, "histogram");
        built
    }

    /// A histogram of whole numbers observed many at a time (see [`CountHistogramVec`]).
    pub fn count_histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> CountHistogramVec {
        let built = CountHistogramVec::new(name, help, buckets)
            .unwrap_or_else(|| panic!("invalid metric definition: {name}"));
        let built = self.register(Ok(built));
        self.note(&built, "histogram");
        built
    }
}

/// Gives a wing's metrics struct `$metrics` its `global()`: the process's one instance,
/// built by `$metrics::new` into the process registry on first use.
#[macro_export]
macro_rules! process_instance {
    ($metrics:ident) => {
        impl $metrics {
            /// The process's instance, registered in the process registry by the first call.
            pub fn global() -> &'static Self {
                static GLOBAL: ::std::sync::LazyLock<$metrics> = ::std::sync::LazyLock::new(|| {
                    $metrics::new(&$crate::telemetry::registry::Registrar::process())
                });
                &GLOBAL
            }
        }
    };
}

/// Renders the process registry in the Prometheus text format.
pub fn render() -> String {
    let encoder = prometheus::TextEncoder::new();
    encoder
        .encode_to_string(&prometheus::gather())
        .unwrap_or_else(|e| format!("# encoding metrics failed: {e}\n"))
}

/// `count` bucket bounds from `start`, each `factor` times the one before, rounded to four
/// significant digits so that a scrape shows them as written (`le="0.0013"`, not the float
/// noise `le="0.0013000000000000002"`); the reference's `exp(start, factor, count)` buckets.
pub fn exp_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    prometheus::exponential_buckets(start, factor, count)
        .unwrap_or_default()
        .into_iter()
        .map(|bound| format!("{bound:.3e}").parse().unwrap_or(bound))
        .collect()
}

/// Bounds of a share: 0, 0.1, ..., 1.
pub fn ratio_buckets() -> Vec<f64> {
    (0..=10).map(|i| f64::from(i) / 10.0).collect()
}

/// Bounds of an age or a time span of posts, 1 minute to the two-day retention.
pub fn time_range_buckets() -> Vec<f64> {
    vec![
        60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0, 86400.0, 129600.0,
        172800.0,
    ]
}

/// The descriptions of a hand-written collector's unlabelled `families` (name, type, help).
pub fn family_descs(families: &[(&str, &str, &str)]) -> Vec<prometheus::core::Desc> {
    families
        .iter()
        .filter_map(|(name, _, help)| {
            prometheus::core::Desc::new(
                (*name).to_owned(),
                (*help).to_owned(),
                Vec::new(),
                std::collections::HashMap::new(),
            )
            .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_bounds_print_as_written() {
        let bounds = exp_buckets(0.001, 1.3, 40);
        assert_eq!(bounds.len(), 40);
        for bound in bounds {
            let text = bound.to_string();
            let digits: String = text.chars().filter(char::is_ascii_digit).collect();
            let significant = digits.trim_start_matches('0').trim_end_matches('0');
            assert!(significant.len() <= 4, "{text}");
        }
    }

    #[test]
    fn a_clash_keeps_the_metric_and_catalogues_it() {
        let registry = Registry::new();
        let first = Registrar::new(&registry);
        first.counter("clash_total", "first");
        let second = Registrar::new(&registry);
        let kept = second.counter("clash_total", "second");
        kept.inc();
        assert_eq!(kept.get(), 1);
        assert_eq!(second.into_catalogue()[0].name, "clash_total");
    }
}
