//! One metric read out of a Prometheus text scrape (a server process's `/metrics`) or out of
//! this process's default registry (a server or ingestion running in the test).
//!
//! The default registry is the process's: a test that reads it from there shares it with the
//! other tests of its binary under plain `cargo test`, so it reads series of its own (its
//! topic's labels) or counts only a change it caused.

/// The value of the series of `name` whose labels include `labels`, in Prometheus text
/// (`name{k="v",...} value`, or `name value` without labels); `None` when there is none.
pub fn in_text(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (series_labels, value) = match rest.strip_prefix('{') {
            Some(labelled) => labelled.split_once('}')?,
            None => ("", rest),
        };
        if !value.starts_with(' ') {
            // Another metric whose name starts with this one.
            return None;
        }
        let all = labels.iter().all(|(k, v)| {
            series_labels
                .split(',')
                .any(|pair| pair == format!("{k}=\"{v}\""))
        });
        all.then(|| value.trim().parse().ok()).flatten()
    })
}

/// The value of the series of `name` whose labels include `labels`, in this process's default
/// registry (counters and gauges); `None` when there is none.
pub fn in_registry(name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    prometheus::gather()
        .iter()
        .filter(|f| f.name() == name)
        .find_map(|family| {
            family.get_metric().iter().find_map(|m| {
                let matches = labels.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                });
                matches.then(|| match family.get_field_type() {
                    prometheus::proto::MetricType::COUNTER => m.get_counter().get_value(),
                    _ => m.get_gauge().get_value(),
                })
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "\
# HELP kafka_partition_lag Records behind.
# TYPE kafka_partition_lag gauge
kafka_partition_lag{partition=\"0\",topic=\"t\"} 3
kafka_partition_lag{partition=\"1\",topic=\"t\"} 5
kafka_partition_lag_refresh_age_seconds{partition=\"1\",topic=\"t\"} 7
snapshot_loaded_posts 42
snapshot_loaded_posts_total 9
";

    #[test]
    fn a_series_is_found_by_its_name_and_some_of_its_labels() {
        assert_eq!(in_text(SCRAPE, "snapshot_loaded_posts", &[]), Some(42.0));
        assert_eq!(
            in_text(SCRAPE, "kafka_partition_lag", &[("partition", "1")]),
            Some(5.0)
        );
        assert_eq!(in_text(SCRAPE, "kafka_partition_lag", &[]), Some(3.0));
        assert_eq!(
            in_text(
                SCRAPE,
                "kafka_partition_lag_refresh_age_seconds",
                &[("topic", "t")]
            ),
            Some(7.0)
        );
        assert_eq!(
            in_text(SCRAPE, "kafka_partition_lag", &[("partition", "2")]),
            None
        );
        assert_eq!(in_text(SCRAPE, "snapshot_loaded", &[]), None);
        assert_eq!(in_text(SCRAPE, "kafka_partition", &[]), None);
    }
}
