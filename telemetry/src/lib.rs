//! Metrics and the `/health` + `/metrics` listener, shared by the dispatcher and the `fleet`
//! supervisor.
//!
//! - Metric types are prometheus-client's ([`Counter`], [`Gauge`], [`Family`]) plus
//!   [`Histogram`], a thin wrapper that drops non-finite observations and keeps its count and
//!   sum readable. Register them in a [`Registry`]; [`encode`] renders it.
//! - The exposition is Prometheus text 0.0.4 ([`CONTENT_TYPE`]): it has no closing `# EOF`,
//!   so the dispatcher may append another component's text to its own.
//! - Counters are registered without `_total` (the encoder appends it) and help texts without a
//!   final period (the registry appends one).
//! - [`serve`]: one axum listener for both endpoints; `/health` answers the caller's
//!   [`Health`] verdict.

mod histogram;
mod http;
pub mod logs;

use std::net::SocketAddr;

pub use histogram::{Buckets, Histogram, HistogramFamily};
pub use http::{router, serve, Endpoints, Health};
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::registry::{Metric, Registry};

/// A counter of a fractional quantity (seconds of audio).
pub type FloatCounter = Counter<f64, std::sync::atomic::AtomicU64>;

/// The `Content-Type` of `/metrics`.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("metrics listener on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Registers a clone of `metric` under `name` and hands `metric` back: clones share their
/// values, so the caller records into what the registry shows.
pub fn register<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The registry's metrics as Prometheus text.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing to a String cannot fail, and none of our metrics fails to encode; were one to,
    // the scrape still gets everything before it.
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut text, registry) {
        tracing::warn!(error = %e, "encoding metrics");
    }
    text
}

/// A gauge value from a count (saturating: a gauge holds an `i64`).
pub fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Fails unless every line is one of `text`'s lines.
#[cfg(test)]
pub(crate) fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            text.lines().any(|l| l == *line),
            "missing `{line}` in\n{text}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_help_and_values_come_out_as_prometheus_text() {
        let mut registry = Registry::default();
        let jobs = Family::<[(&'static str, &'static str); 1], Counter>::default();
        let jobs = register(&mut registry, "app_jobs", "Jobs finished, by outcome", jobs);
        let audio = FloatCounter::default();
        let audio = register(
            &mut registry,
            "app_audio_seconds",
            "Audio transcribed",
            audio,
        );
        let waiting: Gauge = register(&mut registry, "app_waiting", "Waiting", Gauge::default());
        jobs.get_or_create(&[("outcome", "done")]).inc();
        audio.inc_by(2.5);
        waiting.set(gauge_value(3));
        let text = encode(&registry);
        assert_lines(
            &text,
            &[
                "# HELP app_jobs_total Jobs finished, by outcome.",
                "# TYPE app_jobs_total counter",
                "app_jobs_total{outcome=\"done\"} 1",
                "app_audio_seconds_total 2.5",
                "# TYPE app_waiting gauge",
                "app_waiting 3",
            ],
        );
        assert!(!text.contains("# EOF"), "{text}");
    }
}
