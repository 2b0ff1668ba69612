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

use std::net::SocketAddr;

pub use histogram::{Buckets, Histogram, HistogramFamily};
pub use http::{serve, Endpoints, Health};
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::registry::Registry;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_help_and_values_come_out_as_prometheus_text() {
        let mut registry = Registry::default();
        let jobs = Family::<[(&'static str, &'static str); 1], Counter>::default();
        registry.register("app_jobs", "Jobs finished, by outcome", jobs.clone());
        let audio = FloatCounter::default();
        registry.register("app_audio_seconds", "Audio transcribed", audio.clone());
        let waiting: Gauge = Gauge::default();
        registry.register("app_waiting", "Waiting requests", waiting.clone());
        jobs.get_or_create(&[("outcome", "done")]).inc();
        audio.inc_by(2.5);
        waiting.set(gauge_value(3));
        let text = encode(&registry);
        for line in [
            "# HELP app_jobs_total Jobs finished, by outcome.",
            "# TYPE app_jobs_total counter",
            "app_jobs_total{outcome=\"done\"} 1",
            "app_audio_seconds_total 2.5",
            "# TYPE app_waiting gauge",
            "app_waiting 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
        assert!(!text.contains("# EOF"), "{text}");
    }
}
