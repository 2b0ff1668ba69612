//! A histogram over prometheus-client's, for observations that may be NaN or infinite.

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::{histogram, MetricType, TypedMetric};

/// Observations of a value, in fixed buckets. A non-finite observation is dropped: one NaN
/// would make `_sum` NaN for good. Count and sum are readable (prometheus-client shows them
/// only to its own tests); clones share the same data.
#[derive(Debug, Clone)]
pub struct Histogram {
    inner: histogram::Histogram,
    /// Count and sum, as exposed.
    totals: Arc<Mutex<(u64, f64)>>,
}

impl Histogram {
    /// Buckets by upper bound (the `+Inf` bucket is implicit).
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            inner: histogram::Histogram::new(bounds.iter().copied()),
            totals: Arc::default(),
        }
    }

    pub fn observe(&self, value: f64) {
        if !value.is_finite() {
            return;
        }
        let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        self.inner.observe(value);
        totals.0 += 1;
        totals.1 += value;
    }

    pub fn count(&self) -> u64 {
        self.totals.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    pub fn sum(&self) -> f64 {
        self.totals.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.inner.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The bucket bounds every histogram of a [`HistogramFamily`] gets.
#[derive(Debug, Clone, Copy)]
pub struct Buckets(pub &'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0)
    }
}

/// Histograms by label set, all with the same buckets.
pub type HistogramFamily<S> = Family<S, Histogram, Buckets>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{assert_lines, encode, Metric, Registry};

    const BOUNDS: [f64; 3] = [0.001, 0.0025, 2.0];

    /// The text of a registry with only `metric`, as `name`.
    fn alone(name: &str, metric: impl Metric) -> String {
        let mut registry = Registry::default();
        registry.register(name, "Help", metric);
        encode(&registry)
    }

    #[test]
    fn non_finite_observations_are_dropped() {
        let h = Histogram::new(&BOUNDS);
        h.observe(f64::NAN);
        h.observe(f64::INFINITY);
        h.observe(0.002);
        assert_eq!((h.count(), h.sum()), (1, 0.002));
        assert_lines(
            &alone("x_seconds", h),
            &[
                "x_seconds_bucket{le=\"0.001\"} 0",
                "x_seconds_bucket{le=\"0.0025\"} 1",
                "x_seconds_bucket{le=\"2\"} 1",
                "x_seconds_bucket{le=\"+Inf\"} 1",
                "x_seconds_count 1",
            ],
        );
    }

    #[test]
    fn a_family_gives_each_label_set_the_buckets_and_labels_come_before_le() {
        let family = HistogramFamily::<[(&'static str, &'static str); 1]>::new_with_constructor(
            Buckets(&BOUNDS),
        );
        family.get_or_create(&[("stage", "fetch")]).observe(1.5);
        assert_lines(
            &alone("stage_seconds", family),
            &[
                "stage_seconds_bucket{stage=\"fetch\",le=\"2\"} 1",
                "stage_seconds_sum{stage=\"fetch\"} 1.5",
            ],
        );
    }
}
