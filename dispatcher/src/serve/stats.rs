//! The API's own metrics and health, shown by `/metrics` and `/health` beside the dispatcher's
//! and the fleet's: requests by status, a latency histogram, and latency quantiles over the
//! most recent requests (what an SLA of "mean and p99" reads directly).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use telemetry::{register, Counter, Family, Gauge, Histogram};

use crate::metrics::MetricsSource;

/// Latency buckets (seconds) around a one-second SLA.
const LATENCY_BUCKETS: [f64; 14] = [
    0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 1.5, 2.5, 5.0, 10.0,
];

/// Requests the quantiles are computed over: recent enough to show a change within seconds
/// at a few hundred requests per second.
const WINDOW_REQUESTS: usize = 2048;

const QUANTILES: [(&str, f64); 4] = [("0.5", 0.5), ("0.9", 0.9), ("0.99", 0.99), ("1", 1.0)];

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Where the API is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ApiState {
    /// The engine (or the fleet) is starting: requests get 503.
    Loading = 0,
    Ready = 1,
    /// Stopping: no new connections, accepted requests finish.
    Draining = 2,
}

impl ApiState {
    fn label(self) -> &'static str {
        match self {
            Self::Loading => "loading",
            Self::Ready => "ready",
            Self::Draining => "draining",
        }
    }
}

pub struct ApiStats {
    registry: telemetry::Registry,
    requests: Family<[(&'static str, &'static str); 1], Counter>,
    latency: Histogram,
    quantiles: Family<[(&'static str, &'static str); 1], FloatGauge>,
    window: Mutex<VecDeque<f64>>,
    state: AtomicU8,
    /// Requests accepted and not yet answered.
    pub(super) pending: AtomicUsize,
    max_pending: usize,
}

impl ApiStats {
    pub fn new(max_pending: usize) -> Self {
        let mut r = telemetry::Registry::default();
        Self {
            requests: register(
                &mut r,
                "dispatcher_api_requests",
                "Transcription API requests answered, by HTTP status",
                Family::default(),
            ),
            latency: register(
                &mut r,
                "dispatcher_api_request_seconds",
                "Transcription API request latency, from the request's start to its answer",
                Histogram::new(&LATENCY_BUCKETS),
            ),
            quantiles: register(
                &mut r,
                "dispatcher_api_request_seconds_recent",
                "Latency quantiles over the most recent 2048 answered requests",
                Family::default(),
            ),
            registry: r,
            window: Mutex::new(VecDeque::with_capacity(WINDOW_REQUESTS)),
            state: AtomicU8::new(ApiState::Loading as u8),
            pending: AtomicUsize::new(0),
            max_pending,
        }
    }

    pub fn state(&self) -> ApiState {
        match self.state.load(Ordering::Acquire) {
            1 => ApiState::Ready,
            2 => ApiState::Draining,
            _ => ApiState::Loading,
        }
    }

    pub fn set_state(&self, state: ApiState) {
        self.state.store(state as u8, Ordering::Release);
    }

    /// One answered request.
    pub fn observe(&self, status: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&[("status", status_label(status))])
            .inc();
        let seconds = elapsed.as_secs_f64();
        self.latency.observe(seconds);
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if window.len() == WINDOW_REQUESTS {
            window.pop_front();
        }
        window.push_back(seconds);
        let mut sorted: Vec<f64> = window.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        for (label, q) in QUANTILES {
            // Nearest rank, as the SLA sweep reports it.
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            self.quantiles
                .get_or_create(&[("quantile", label)])
                .set(sorted[rank - 1]);
        }
    }
}

/// Static label values for the statuses the API answers with.
fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        400 => "400",
        401 => "401",
        404 => "404",
        405 => "405",
        413 => "413",
        415 => "415",
        429 => "429",
        500 => "500",
        503 => "503",
        _ => "other",
    }
}

impl MetricsSource for ApiStats {
    fn name(&self) -> &'static str {
        "api"
    }

    fn render_prometheus(&self) -> String {
        telemetry::encode(&self.registry)
    }

    fn health(&self) -> (bool, serde_json::Value) {
        let state = self.state();
        let value = serde_json::json!({
            "state": state.label(),
            "pending_requests": self.pending.load(Ordering::Relaxed),
            "max_pending_requests": self.max_pending,
        });
        (state == ApiState::Ready, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_over_the_window() {
        let stats = ApiStats::new(4);
        for ms in 1..=100 {
            stats.observe(200, Duration::from_millis(ms));
        }
        stats.observe(429, Duration::from_millis(1));
        let text = stats.render_prometheus();
        assert!(
            text.contains("dispatcher_api_requests_total{status=\"200\"} 100"),
            "{text}"
        );
        assert!(text.contains("dispatcher_api_requests_total{status=\"429\"} 1"));
        // 101 values: 1 ms twice, then 2..=100 ms; p50 is the 51st, p99 the 100th.
        assert!(text.contains("dispatcher_api_request_seconds_recent{quantile=\"0.5\"} 0.05"));
        assert!(text.contains("dispatcher_api_request_seconds_recent{quantile=\"0.99\"} 0.099"));
        assert!(text.contains("dispatcher_api_request_seconds_recent{quantile=\"1\"} 0.1"));
        assert!(text.contains("dispatcher_api_request_seconds_count 101"));
        assert!(!stats.health().0, "loading until the engine is ready");
        stats.set_state(ApiState::Ready);
        assert!(stats.health().0);
    }
}
