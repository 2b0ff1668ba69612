//! The dispatcher's Prometheus metrics, served with `/health` by the telemetry listener.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use telemetry::{
    register, Buckets, Counter, Family, FloatCounter, Health, Histogram, HistogramFamily,
};
use tokio_util::sync::CancellationToken;

use super::{MetricEvent, Metrics, Stage};
use crate::error::{DispatchError, Result};

/// Latency buckets (seconds), from a short clip's fetch to an hour-long recording.
const SECONDS_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
const RTFX_BUCKETS: [f64; 10] = [
    1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0,
];

/// One label: `stage`, `outcome` or `reason`, with a value from the code.
type Label = [(&'static str, &'static str); 1];

/// Everything the aggregator has seen.
#[derive(Debug)]
pub struct Registry {
    registry: telemetry::Registry,
    /// Every stage's histogram (all shown from the start), by stage.
    stages: BTreeMap<Stage, Histogram>,
    message_age: Histogram,
    rtfx: Histogram,
    audio_seconds: FloatCounter,
    jobs: Family<Label, Counter>,
    failures: Family<Label, Counter>,
    /// Shared with [`Metrics`], which counts the events it drops.
    pub(super) dropped: Counter,
}

impl Default for Registry {
    fn default() -> Self {
        let mut r = telemetry::Registry::default();
        let stage_seconds =
            HistogramFamily::<Label>::new_with_constructor(Buckets(&SECONDS_BUCKETS));
        let stages = Stage::ALL
            .iter()
            .map(|s| {
                (
                    *s,
                    stage_seconds.get_or_create_owned(&[("stage", s.label())]),
                )
            })
            .collect();
        r.register(
            "dispatcher_stage_seconds",
            "Latency of each pipeline stage",
            stage_seconds,
        );
        // Fields initialise in this order: the registry lists its metrics in it.
        Self {
            stages,
            message_age: register(
                &mut r,
                "dispatcher_message_age_seconds",
                "Time from send to receive",
                Histogram::new(&SECONDS_BUCKETS),
            ),
            rtfx: register(
                &mut r,
                "dispatcher_rtfx",
                "Audio seconds per inference second, per job",
                Histogram::new(&RTFX_BUCKETS),
            ),
            audio_seconds: register(
                &mut r,
                "dispatcher_audio_seconds",
                "Audio transcribed",
                FloatCounter::default(),
            ),
            jobs: register(
                &mut r,
                "dispatcher_jobs",
                "Jobs finished, by outcome",
                Family::default(),
            ),
            failures: register(
                &mut r,
                "dispatcher_failures",
                "Permanent job failures, by reason",
                Family::default(),
            ),
            dropped: register(
                &mut r,
                "dispatcher_metrics_dropped",
                "Metric events dropped",
                Counter::default(),
            ),
            registry: r,
        }
    }
}

impl Registry {
    pub fn record(&mut self, event: &MetricEvent) {
        match *event {
            MetricEvent::StageSeconds { stage, seconds } => {
                if let Some(h) = self.stages.get(&stage) {
                    h.observe(seconds);
                }
            }
            MetricEvent::AudioSeconds(s) if s.is_finite() => {
                self.audio_seconds.inc_by(s);
            }
            MetricEvent::AudioSeconds(_) => {}
            MetricEvent::Rtfx(x) => self.rtfx.observe(x),
            MetricEvent::MessageAgeSeconds(s) => self.message_age.observe(s),
            MetricEvent::JobFinished { outcome } => {
                self.jobs.get_or_create(&[("outcome", outcome)]).inc();
            }
            MetricEvent::Failure { reason } => {
                self.failures.get_or_create(&[("reason", reason)]).inc();
            }
        }
    }

    /// Per stage: observations and their total seconds (the `local` run's closing table).
    pub fn stage_totals(&self) -> Vec<(Stage, u64, f64)> {
        self.stages
            .iter()
            .map(|(stage, h)| (*stage, h.count(), h.sum()))
            .collect()
    }

    /// Audio seconds of every job that finished inference.
    pub fn audio_seconds_total(&self) -> f64 {
        self.audio_seconds.get()
    }

    pub fn jobs(&self, outcome: &'static str) -> u64 {
        self.jobs
            .get(&[("outcome", outcome)])
            .map_or(0, |c| c.get())
    }

    /// Prometheus text of everything recorded, dropped events included.
    pub fn render(&self) -> String {
        telemetry::encode(&self.registry)
    }
}

/// What the listener asks: the metrics, and whether this dispatcher takes work.
struct Endpoints {
    metrics: Metrics,
    healthy: Arc<AtomicBool>,
}

/// Serves `/metrics` and `/health` (503 once `healthy` goes false) until `stop` fires.
/// Returns the bound address (useful with port 0).
pub async fn serve(
    listen: SocketAddr,
    metrics: Metrics,
    healthy: Arc<AtomicBool>,
    stop: CancellationToken,
) -> Result<SocketAddr> {
    let endpoints = Arc::new(Endpoints { metrics, healthy });
    telemetry::serve(listen, endpoints, stop.cancelled_owned())
        .await
        .map_err(|e| DispatchError::Config(e.to_string()))
}

/// `/metrics` and `/health` as routes of another server (`dispatcher serve`'s API listener).
pub fn router(metrics: Metrics, healthy: Arc<AtomicBool>) -> axum::Router {
    telemetry::router(Arc::new(Endpoints { metrics, healthy }))
}

impl telemetry::Endpoints for Endpoints {
    fn metrics(&self) -> String {
        self.metrics.render_prometheus()
    }

    /// `ok` / `draining` as text; with sources (the worker fleet), JSON with each source's
    /// state, and 503 also while a source cannot work.
    fn health(&self) -> Health {
        let taking_work = self.healthy.load(Ordering::Relaxed);
        let sources = self.metrics.sources();
        if sources.is_empty() {
            return Health::text(taking_work, if taking_work { "ok\n" } else { "draining\n" });
        }
        let mut body = serde_json::Map::new();
        let mut all_ready = true;
        for source in sources {
            let (ready, value) = source.health();
            all_ready &= ready;
            body.insert(source.name().into(), value);
        }
        let status = match (taking_work, all_ready) {
            (false, _) => "draining",
            (true, false) => "unavailable",
            (true, true) => "ok",
        };
        body.insert("status".into(), status.into());
        Health::json(status == "ok", &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let mut r = Registry::default();
        r.record(&MetricEvent::StageSeconds {
            stage: Stage::Fetch,
            seconds: 0.2,
        });
        r.record(&MetricEvent::Failure {
            reason: "too_short",
        });
        r.record(&MetricEvent::Rtfx(f64::NAN));
        r.dropped.inc_by(4);
        let text = r.render();
        assert!(text.contains("dispatcher_stage_seconds_bucket{stage=\"fetch\",le=\"0.25\"} 1"));
        assert!(text.contains("dispatcher_stage_seconds_bucket{stage=\"fetch\",le=\"0.1\"} 0"));
        assert!(text.contains("dispatcher_failures_total{reason=\"too_short\"} 1"));
        assert!(text.contains("dispatcher_rtfx_count 0"));
        assert!(text.contains("dispatcher_metrics_dropped_total 4"));
    }
}
