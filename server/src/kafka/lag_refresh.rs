//! `kafka_partition_lag_refresh_age_seconds{topic,partition}`: the seconds since each
//! partition's `kafka_partition_lag` was last refreshed from the broker, computed at each
//! scrape from when that was, so it grows between refreshes (a refresh that hangs on a dead
//! broker shows as an age that keeps growing, not as the age of the last pass).
//!
//! [`LagRefreshAge`] is part of [`KafkaMetrics`](super::metrics::KafkaMetrics); the
//! Kafka supervisor records each refresh.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Gauge, LabelPair, Metric, MetricFamily, MetricType};

/// The family's name.
pub const NAME: &str = "kafka_partition_lag_refresh_age_seconds";
/// The family's help.
pub const HELP: &str = "Seconds since kafka_partition_lag was last refreshed from the broker, \
                        at the time of the scrape (the lag sample is removed while refreshing fails)";

/// When each partition's lag was last refreshed, exported as its age at each scrape.
#[derive(Clone, Debug)]
pub struct LagRefreshAge {
    desc: Desc,
    /// `(topic, partition)` -> the instant of the last refresh.
    refreshed: Arc<Mutex<BTreeMap<(String, i32), Instant>>>,
}

impl LagRefreshAge {
    /// The family, without samples until a refresh is recorded.
    pub fn new() -> Self {
        let desc = Desc::new(
            NAME.to_owned(),
            HELP.to_owned(),
            vec!["topic".to_owned(), "partition".to_owned()],
            std::collections::HashMap::new(),
        )
        .unwrap_or_else(|e| panic!("invalid metric definition: {e}"));
        Self {
            desc,
            refreshed: Arc::default(),
        }
    }

    /// The lag of `partition` of `topic` was refreshed at `at`.
    pub fn refreshed_at(&self, topic: &str, partition: i32, at: Instant) {
        self.lock().insert((topic.to_owned(), partition), at);
    }

    /// Each partition's age at `now`, in seconds, by `(topic, partition)`.
    pub fn ages_at(&self, now: Instant) -> Vec<((String, i32), f64)> {
        self.lock()
            .iter()
            .map(|(key, at)| {
                (
                    key.clone(),
                    now.saturating_duration_since(*at).as_secs_f64(),
                )
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, i32), Instant>> {
        // A map of instants, whole after any panic.
        self.refreshed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for LagRefreshAge {
    fn default() -> Self {
        Self::new()
    }
}

impl Collector for LagRefreshAge {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let ages = self.ages_at(Instant::now());
        if ages.is_empty() {
            return Vec::new();
        }
        let label = |name: &str, value: String| {
            let mut pair = LabelPair::default();
            pair.set_name(name.to_owned());
            pair.set_value(value);
            pair
        };
        let metrics = ages
            .into_iter()
            .map(|((topic, partition), age)| {
                let mut gauge = Gauge::default();
                gauge.set_value(age);
                let mut metric = Metric::default();
                // Sorted by name, as the prometheus crate's own vectors write them.
                metric.set_label(vec![
                    label("partition", partition.to_string()),
                    label("topic", topic),
                ]);
                metric.set_gauge(gauge);
                metric
            })
            .collect();
        let mut family = MetricFamily::default();
        family.set_name(NAME.to_owned());
        family.set_help(HELP.to_owned());
        family.set_field_type(MetricType::GAUGE);
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_age_grows_between_refreshes_and_restarts_at_each() {
        let ages = LagRefreshAge::new();
        assert!(ages.collect().is_empty(), "no sample before a refresh");
        let start = Instant::now();
        ages.refreshed_at("t", 0, start);
        ages.refreshed_at("t", 1, start);
        let at = |secs: u64| {
            ages.ages_at(start + Duration::from_secs(secs))
                .into_iter()
                .map(|(key, age)| (key.1, age))
                .collect::<Vec<_>>()
        };
        assert_eq!(at(3), [(0, 3.0), (1, 3.0)]);
        assert_eq!(
            at(33),
            [(0, 33.0), (1, 33.0)],
            "no refresh: it keeps growing"
        );
        ages.refreshed_at("t", 1, start + Duration::from_secs(30));
        assert_eq!(at(33), [(0, 33.0), (1, 3.0)]);
        // The scrape: one sample a partition, labelled as the vectors are.
        let families = ages.collect();
        let samples = families[0].get_metric();
        assert_eq!(families[0].name(), NAME);
        assert_eq!(samples.len(), 2);
        let labels: Vec<(&str, &str)> = samples[0]
            .get_label()
            .iter()
            .map(|l| (l.name(), l.value()))
            .collect();
        assert_eq!(labels, [("partition", "0"), ("topic", "t")]);
    }
}
