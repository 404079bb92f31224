//! A labelled histogram of whole numbers whose observations are added many at a time: what
//! `get_in_network_posts_found_posts_per_author` needs, where one answer observes the post
//! count of each of its authors (about 770 in a full answer). prometheus' `LocalHistogram`
//! takes them one call each (a bucket search and a sum per author); here the caller's numbers
//! are counted per bucket on the stack and each bucket's count is added once.
//!
//! A scrape shows exactly what a prometheus `HistogramVec` with the same name, help, label and
//! buckets would show after the same observations (`tests` compare the two texts).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Histogram, LabelPair, Metric, MetricFamily, MetricType};

/// The stage a shape metric describes (its `stage` label), as in the reference's
/// `analyze_and_report_post_statistics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The posts as retrieved.
    Retrieved,
    /// The posts as scored (what the service answers).
    Scored,
}

impl Stage {
    /// Every stage, in label order.
    pub const ALL: [Stage; 2] = [Stage::Retrieved, Stage::Scored];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Retrieved => "retrieved",
            Stage::Scored => "scored",
        }
    }
}

/// Most buckets a [`CountHistogramVec`] takes (its counts are kept on the stack per batch).
const MAX_BUCKETS: usize = 15;

/// A histogram of whole numbers with a `stage` label (see the module docs), cheap to clone (a
/// clone shares the counts). A stage is exported once something was observed at it, as a
/// `HistogramVec` exports a label set once it is used.
#[derive(Clone, Debug)]
pub struct CountHistogramVec {
    inner: Arc<Counts>,
}

#[derive(Debug)]
struct Counts {
    desc: Desc,
    /// Finite upper bounds, ascending.
    bounds: Vec<f64>,
    /// `bucket_of[n]`: the bucket of the number `n`, for `n` up to the largest finite bound
    /// (larger numbers go to the `+Inf` bucket, `bounds.len()`).
    bucket_of: Vec<u8>,
    stages: [StageCounts; 2],
}

/// One stage's counts: per bucket (not cumulative, `+Inf` last), their sum and number.
#[derive(Debug, Default)]
struct StageCounts {
    buckets: [AtomicU64; MAX_BUCKETS + 1],
    sum: AtomicU64,
    count: AtomicU64,
}

impl CountHistogramVec {
    /// A histogram named `name` with `help`, labelled `stage`, with the finite upper `bounds`
    /// (ascending, at most 15). `None` if the name or the bounds are not valid.
    pub fn new(name: &str, help: &str, bounds: Vec<f64>) -> Option<Self> {
        let ascending = bounds.windows(2).all(|w| w[0] < w[1]);
        if bounds.is_empty() || bounds.len() > MAX_BUCKETS || !ascending {
            return None;
        }
        let desc = Desc::new(
            name.to_owned(),
            help.to_owned(),
            vec!["stage".to_owned()],
            HashMap::new(),
        )
        .ok()?;
        let largest = bounds.last().copied().unwrap_or(0.0).max(0.0) as usize;
        let bucket_of = (0..=largest)
            .map(|n| bounds.partition_point(|&b| b < n as f64) as u8)
            .collect();
        Some(Self {
            inner: Arc::new(Counts {
                desc,
                bounds,
                bucket_of,
                stages: Default::default(),
            }),
        })
    }

    /// Observes every number of `values` at `stage`, adding each bucket's count once.
    pub fn observe_all(&self, stage: Stage, values: impl Iterator<Item = u32>) {
        let inner = &*self.inner;
        let mut buckets = [0u64; MAX_BUCKETS + 1];
        let (mut sum, mut count) = (0u64, 0u64);
        let overflow = inner.bounds.len();
        for n in values {
            let bucket = inner
                .bucket_of
                .get(n as usize)
                .map_or(overflow, |&b| usize::from(b));
            buckets[bucket] += 1;
            sum += u64::from(n);
            count += 1;
        }
        if count == 0 {
            return;
        }
        let counts = &inner.stages[stage as usize];
        for (total, &n) in counts.buckets.iter().zip(&buckets) {
            if n > 0 {
                total.fetch_add(n, Ordering::Relaxed);
            }
        }
        counts.sum.fetch_add(sum, Ordering::Relaxed);
        // Release pairs with the Acquire load in `collect`: a scrape that sees this count sees
        // the buckets and sum added before it (counts within a stage never run ahead of
        // their buckets).
        counts.count.fetch_add(count, Ordering::Release);
    }

    /// Observations at `stage` so far.
    pub fn sample_count(&self, stage: Stage) -> u64 {
        self.inner.stages[stage as usize]
            .count
            .load(Ordering::Acquire)
    }

    /// Sum of the observations at `stage` so far.
    pub fn sample_sum(&self, stage: Stage) -> f64 {
        self.inner.stages[stage as usize]
            .sum
            .load(Ordering::Relaxed) as f64
    }

    /// The exported sample of `stage`, or `None` before its first observation.
    fn metric(&self, stage: Stage) -> Option<Metric> {
        let counts = &self.inner.stages[stage as usize];
        let count = counts.count.load(Ordering::Acquire);
        if count == 0 {
            return None;
        }
        let mut cumulative = 0;
        let buckets = self
            .inner
            .bounds
            .iter()
            .zip(&counts.buckets)
            .map(|(&bound, n)| {
                cumulative += n.load(Ordering::Relaxed);
                let mut bucket = Bucket::default();
                bucket.set_cumulative_count(cumulative);
                bucket.set_upper_bound(bound);
                bucket
            })
            .collect();
        let mut histogram = Histogram::default();
        histogram.set_sample_count(count);
        histogram.set_sample_sum(counts.sum.load(Ordering::Relaxed) as f64);
        histogram.set_bucket(buckets);
        let mut label = LabelPair::default();
        label.set_name("stage".to_owned());
        label.set_value(stage.label().to_owned());
        let mut metric = Metric::default();
        metric.set_label(vec![label]);
        metric.set_histogram(histogram);
        Some(metric)
    }
}

impl Collector for CountHistogramVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.inner.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let metrics: Vec<Metric> = Stage::ALL
            .iter()
            .filter_map(|&stage| self.metric(stage))
            .collect();
        let mut family = MetricFamily::default();
        family.set_name(self.inner.desc.fq_name.clone());
        family.set_help(self.inner.desc.help.clone());
        family.set_field_type(MetricType::HISTOGRAM);
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{HistogramOpts, HistogramVec, Registry, TextEncoder};

    const BOUNDS: [f64; 9] = [1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0];

    fn text(registry: &Registry) -> String {
        TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encodes")
    }

    #[test]
    fn a_scrape_reads_as_a_histogram_vec_given_the_same_numbers() {
        let (ours, theirs) = (Registry::new(), Registry::new());
        let counts = CountHistogramVec::new("posts_per_author", "Posts per author", BOUNDS.into())
            .expect("valid");
        ours.register(Box::new(counts.clone())).expect("registers");
        let vec = HistogramVec::new(
            HistogramOpts::new("posts_per_author", "Posts per author").buckets(BOUNDS.into()),
            &["stage"],
        )
        .expect("valid");
        theirs.register(Box::new(vec.clone())).expect("registers");
        // Nothing observed: no sample, as with an unused label set.
        assert_eq!(text(&ours), text(&theirs));
        // Every bound, the numbers next to it, 0 and numbers past the last bound.
        let batches: [&[u32]; 4] = [
            &[1, 1, 2, 3, 4, 5, 6, 9, 10, 11],
            &[
                0,
                19,
                20,
                21,
                49,
                50,
                51,
                99,
                100,
                101,
                199,
                200,
                201,
                5000,
                u32::MAX,
            ],
            &[],
            &[3; 40],
        ];
        for (i, batch) in batches.iter().enumerate() {
            let stage = if i == 2 {
                Stage::Retrieved
            } else {
                Stage::Scored
            };
            counts.observe_all(stage, batch.iter().copied());
            let child = vec.with_label_values(&[stage.label()]);
            for &n in *batch {
                child.observe(f64::from(n));
            }
            if batch.is_empty() {
                // prometheus exports a label set once used; ours once observed. The service
                // never observes an empty batch; the text differs only there.
                vec.remove_label_values(&[stage.label()]).expect("was used");
            }
            assert_eq!(text(&ours), text(&theirs), "after batch {i}");
        }
        let scored: u64 = batches.iter().map(|b| b.len() as u64).sum();
        assert_eq!(counts.sample_count(Stage::Scored), scored);
        assert_eq!(counts.sample_count(Stage::Retrieved), 0);
        counts.observe_all(Stage::Retrieved, [7, 8].into_iter());
        vec.with_label_values(&["retrieved"]).observe(7.0);
        vec.with_label_values(&["retrieved"]).observe(8.0);
        assert_eq!(text(&ours), text(&theirs), "both stages");
        assert_eq!(counts.sample_sum(Stage::Retrieved), 15.0);
    }

    #[test]
    fn refuses_bounds_it_cannot_hold() {
        assert!(CountHistogramVec::new("h", "h", Vec::new()).is_none());
        assert!(CountHistogramVec::new("h", "h", vec![2.0, 1.0]).is_none());
        assert!(CountHistogramVec::new("h", "h", (1..=16).map(f64::from).collect()).is_none());
        assert!(CountHistogramVec::new("h", "h", (1..=15).map(f64::from).collect()).is_some());
    }
}
