//! Prometheus text exposition, served with `/health` on a small HTTP listener.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
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

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: f64) {
        if !value.is_finite() {
            return;
        }
        for (bound, count) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = |l: &str| {
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {}", braces(labels), self.sum);
        let _ = writeln!(out, "{name}_count{} {}", braces(labels), self.count);
    }
}

/// Everything the aggregator has seen.
#[derive(Debug, Clone)]
pub struct Registry {
    stages: BTreeMap<Stage, Histogram>,
    message_age: Histogram,
    rtfx: Histogram,
    audio_seconds_total: f64,
    jobs: BTreeMap<&'static str, u64>,
    failures: BTreeMap<&'static str, u64>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            stages: Stage::ALL
                .iter()
                .map(|s| (*s, Histogram::new(&SECONDS_BUCKETS)))
                .collect(),
            message_age: Histogram::new(&SECONDS_BUCKETS),
            rtfx: Histogram::new(&RTFX_BUCKETS),
            audio_seconds_total: 0.0,
            jobs: BTreeMap::new(),
            failures: BTreeMap::new(),
        }
    }
}

impl Registry {
    pub fn record(&mut self, event: &MetricEvent) {
        match *event {
            MetricEvent::StageSeconds { stage, seconds } => {
                if let Some(h) = self.stages.get_mut(&stage) {
                    h.observe(seconds);
                }
            }
            MetricEvent::AudioSeconds(s) if s.is_finite() => self.audio_seconds_total += s,
            MetricEvent::AudioSeconds(_) => {}
            MetricEvent::Rtfx(x) => self.rtfx.observe(x),
            MetricEvent::MessageAgeSeconds(s) => self.message_age.observe(s),
            MetricEvent::JobFinished { outcome } => *self.jobs.entry(outcome).or_default() += 1,
            MetricEvent::Failure { reason } => *self.failures.entry(reason).or_default() += 1,
        }
    }

    /// Per stage: observations and their total seconds (the `local` run's closing table).
    pub fn stage_totals(&self) -> Vec<(Stage, u64, f64)> {
        self.stages
            .iter()
            .map(|(stage, h)| (*stage, h.count, h.sum))
            .collect()
    }

    /// Audio seconds of every job that finished inference.
    pub fn audio_seconds_total(&self) -> f64 {
        self.audio_seconds_total
    }

    pub fn jobs(&self, outcome: &str) -> u64 {
        self.jobs.get(outcome).copied().unwrap_or(0)
    }

    pub fn render(&self, dropped: u64) -> String {
        let mut out = String::new();
        out.push_str("# HELP dispatcher_stage_seconds Latency of each pipeline stage.\n");
        out.push_str("# TYPE dispatcher_stage_seconds histogram\n");
        for (stage, h) in &self.stages {
            h.render(
                &mut out,
                "dispatcher_stage_seconds",
                &format!("stage=\"{}\"", stage.label()),
            );
        }
        out.push_str("# HELP dispatcher_message_age_seconds Time from send to receive.\n");
        out.push_str("# TYPE dispatcher_message_age_seconds histogram\n");
        self.message_age
            .render(&mut out, "dispatcher_message_age_seconds", "");
        out.push_str("# HELP dispatcher_rtfx Audio seconds per inference second, per job.\n");
        out.push_str("# TYPE dispatcher_rtfx histogram\n");
        self.rtfx.render(&mut out, "dispatcher_rtfx", "");
        out.push_str("# HELP dispatcher_audio_seconds_total Audio transcribed.\n");
        out.push_str("# TYPE dispatcher_audio_seconds_total counter\n");
        let _ = writeln!(
            out,
            "dispatcher_audio_seconds_total {}",
            self.audio_seconds_total
        );
        out.push_str("# HELP dispatcher_jobs_total Jobs finished, by outcome.\n");
        out.push_str("# TYPE dispatcher_jobs_total counter\n");
        for (outcome, n) in &self.jobs {
            let _ = writeln!(out, "dispatcher_jobs_total{{outcome=\"{outcome}\"}} {n}");
        }
        out.push_str("# HELP dispatcher_failures_total Permanent job failures, by reason.\n");
        out.push_str("# TYPE dispatcher_failures_total counter\n");
        for (reason, n) in &self.failures {
            let _ = writeln!(out, "dispatcher_failures_total{{reason=\"{reason}\"}} {n}");
        }
        out.push_str("# HELP dispatcher_metrics_dropped_total Metric events dropped.\n");
        out.push_str("# TYPE dispatcher_metrics_dropped_total counter\n");
        let _ = writeln!(out, "dispatcher_metrics_dropped_total {dropped}");
        out
    }
}

#[derive(Clone)]
struct HttpState {
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
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| DispatchError::Config(format!("metrics listener on {listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| DispatchError::Config(format!("metrics listener: {e}")))?;
    let app = axum::Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/health", get(health_handler))
        .with_state(HttpState { metrics, healthy });
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok(addr)
}

async fn metrics_handler(State(state): State<HttpState>) -> (StatusCode, String) {
    (StatusCode::OK, state.metrics.render_prometheus())
}

/// `ok` / `draining` as text; with sources (the worker fleet), JSON with each source's state,
/// and 503 also while a source cannot work.
async fn health_handler(State(state): State<HttpState>) -> (StatusCode, String) {
    let taking_work = state.healthy.load(Ordering::Relaxed);
    let sources = state.metrics.sources();
    if sources.is_empty() {
        return if taking_work {
            (StatusCode::OK, "ok\n".into())
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, "draining\n".into())
        };
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
    let code = if status == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, serde_json::Value::Object(body).to_string() + "\n")
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
        let text = r.render(4);
        assert!(text.contains("dispatcher_stage_seconds_bucket{stage=\"fetch\",le=\"0.25\"} 1"));
        assert!(text.contains("dispatcher_stage_seconds_bucket{stage=\"fetch\",le=\"0.1\"} 0"));
        assert!(text.contains("dispatcher_failures_total{reason=\"too_short\"} 1"));
        assert!(text.contains("dispatcher_rtfx_count 0"));
        assert!(text.contains("dispatcher_metrics_dropped_total 4"));
    }
}
