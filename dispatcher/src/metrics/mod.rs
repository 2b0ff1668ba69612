//! Job metrics. Jobs `emit` typed events into a bounded channel and never wait: when the
//! channel is full the event is dropped and counted. One task folds events into the
//! Prometheus registry and batches them for CloudWatch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub mod cloudwatch;
pub mod prometheus;

pub use cloudwatch::CloudWatchSink;
pub use prometheus::Registry;

/// Pipeline stages timed per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    Fetch,
    /// Waiting for a thread of the bounded decode pool.
    DecodeWait,
    /// Demux, codec, downmix and resampling (resampling is also reported alone).
    Decode,
    /// The downmix and resampling part of `Decode`.
    Resample,
    /// Waiting for a free inference slot.
    QueueWait,
    /// The engine's round trip: for a fleet, waiting for a worker, features, encoder and
    /// decoder.
    Inference,
    /// Speaker diarization (runs alongside inference).
    Diarization,
    /// Stitching, timestamps and every output format.
    Render,
    /// Writing outputs and manifest to the store.
    Upload,
    EndToEnd,
}

impl Stage {
    pub const ALL: [Stage; 10] = [
        Self::Fetch,
        Self::DecodeWait,
        Self::Decode,
        Self::Resample,
        Self::QueueWait,
        Self::Inference,
        Self::Diarization,
        Self::Render,
        Self::Upload,
        Self::EndToEnd,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Fetch => "fetch",
            Self::DecodeWait => "decode_wait",
            Self::Decode => "decode",
            Self::Resample => "resample",
            Self::QueueWait => "queue_wait",
            Self::Inference => "inference",
            Self::Diarization => "diarization",
            Self::Render => "render",
            Self::Upload => "upload",
            Self::EndToEnd => "end_to_end",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum MetricEvent {
    StageSeconds {
        stage: Stage,
        seconds: f64,
    },
    /// Audio transcribed by one job.
    AudioSeconds(f64),
    /// Real-time factor of one job's inference (audio seconds per inference second).
    Rtfx(f64),
    /// Time from the message being sent to its receive.
    MessageAgeSeconds(f64),
    /// A job ended: "done", "already_done", "failed", "released".
    JobFinished {
        outcome: &'static str,
    },
    /// A job failed permanently with this reason code.
    Failure {
        reason: &'static str,
    },
}

/// A CloudWatch-shaped data point (CloudWatch's unit names).
#[derive(Debug, Clone, PartialEq)]
pub struct Datum {
    pub name: &'static str,
    pub unit: &'static str,
    pub dimensions: Vec<(&'static str, &'static str)>,
    pub value: f64,
}

impl MetricEvent {
    /// The CloudWatch data point for this event; `None` for values CloudWatch rejects.
    pub fn datum(&self) -> Option<Datum> {
        let (name, unit, dimensions, value) = match *self {
            Self::StageSeconds { stage, seconds } => (
                "StageLatency",
                "Seconds",
                vec![("Stage", stage.label())],
                seconds,
            ),
            Self::AudioSeconds(s) => ("AudioSeconds", "Seconds", vec![], s),
            Self::Rtfx(x) => ("RTFx", "None", vec![], x),
            Self::MessageAgeSeconds(s) => ("MessageAge", "Seconds", vec![], s),
            Self::JobFinished { outcome } => ("Jobs", "Count", vec![("Outcome", outcome)], 1.0),
            Self::Failure { reason } => ("Failures", "Count", vec![("Reason", reason)], 1.0),
        };
        value.is_finite().then_some(Datum {
            name,
            unit,
            dimensions,
            value,
        })
    }
}

/// Where batches of data points go (CloudWatch in production).
#[async_trait::async_trait]
pub trait Sink: Send + Sync {
    async fn publish(&self, datums: Vec<Datum>) -> crate::error::Result<()>;
}

/// Another component's metrics and health, shown by `/metrics` and `/health` next to the
/// dispatcher's own (the worker fleet of `--gpus`/`--cpu-instances`).
pub trait MetricsSource: Send + Sync {
    /// Its key in `/health`'s JSON.
    fn name(&self) -> &'static str;
    /// Prometheus text, appended to `/metrics`.
    fn render_prometheus(&self) -> String;
    /// Whether it can do work now, and its state for `/health`.
    fn health(&self) -> (bool, serde_json::Value);
}

/// The cheap, cloneable handle jobs use.
#[derive(Clone)]
pub struct Metrics {
    tx: mpsc::Sender<MetricEvent>,
    /// The registry's `dispatcher_metrics_dropped_total`.
    dropped: telemetry::Counter,
    registry: Arc<Mutex<Registry>>,
    sources: Arc<Mutex<Vec<Arc<dyn MetricsSource>>>>,
}

impl Metrics {
    /// A handle plus the receiving end for [`run_aggregator`].
    pub fn new(capacity: usize) -> (Self, mpsc::Receiver<MetricEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let registry = Registry::default();
        let metrics = Self {
            tx,
            dropped: registry.dropped.clone(),
            registry: Arc::new(Mutex::new(registry)),
            sources: Arc::new(Mutex::new(Vec::new())),
        };
        (metrics, rx)
    }

    /// Never blocks: a full channel drops the event and counts the drop.
    pub fn emit(&self, event: MetricEvent) {
        if self.tx.try_send(event).is_err() {
            self.dropped.inc();
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Prometheus text exposition of everything aggregated so far, then each source's.
    pub fn render_prometheus(&self) -> String {
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let mut text = registry.render();
        for source in self.sources() {
            text.push_str(&source.render_prometheus());
        }
        text
    }

    /// Adds a component to `/metrics` and `/health`.
    pub fn add_source(&self, source: Arc<dyn MetricsSource>) {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(source);
    }

    pub fn sources(&self) -> Vec<Arc<dyn MetricsSource>> {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn registry(&self) -> Arc<Mutex<Registry>> {
        self.registry.clone()
    }
}

/// How the aggregator batches for the sink.
#[derive(Debug, Clone)]
pub struct AggregatorSettings {
    pub flush_interval: Duration,
    /// CloudWatch takes at most 1000 data points per request.
    pub max_batch: usize,
}

impl Default for AggregatorSettings {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_secs(10),
            max_batch: 1000,
        }
    }
}

/// Folds events into the registry and publishes batches to `sink` until `stop` fires and the
/// channel is drained. Publishing failures are logged and counted, never retried into a job.
pub async fn run_aggregator(
    metrics: Metrics,
    mut rx: mpsc::Receiver<MetricEvent>,
    sink: Option<Arc<dyn Sink>>,
    settings: AggregatorSettings,
    stop: CancellationToken,
) {
    let mut pending: Vec<Datum> = Vec::new();
    let mut tick = tokio::time::interval(settings.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let max_batch = settings.max_batch.clamp(1, 1000);
    loop {
        let event = tokio::select! {
            event = rx.recv() => event,
            _ = tick.tick() => {
                flush(&metrics, sink.as_deref(), &mut pending, max_batch).await;
                continue;
            }
            _ = stop.cancelled() => None,
        };
        let Some(event) = event else { break };
        metrics
            .registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(&event);
        if sink.is_some() {
            pending.extend(event.datum());
            if pending.len() >= max_batch {
                flush(&metrics, sink.as_deref(), &mut pending, max_batch).await;
            }
        }
    }
    // Whatever is already queued still counts.
    while let Ok(event) = rx.try_recv() {
        metrics
            .registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(&event);
        if sink.is_some() {
            pending.extend(event.datum());
        }
    }
    flush(&metrics, sink.as_deref(), &mut pending, max_batch).await;
}

async fn flush(metrics: &Metrics, sink: Option<&dyn Sink>, pending: &mut Vec<Datum>, max: usize) {
    let Some(sink) = sink else {
        pending.clear();
        return;
    };
    while !pending.is_empty() {
        let batch: Vec<Datum> = pending.drain(..pending.len().min(max)).collect();
        let n = batch.len() as u64;
        if let Err(e) = sink.publish(batch).await {
            tracing::warn!(error = %e, datums = n, "metrics: publishing failed; data points dropped");
            metrics.dropped.inc_by(n);
        }
    }
}

/// Groups data points by (name, unit, dimensions) with all their values, so one CloudWatch
/// datum can carry many values (`Values`, at most 150 each).
pub fn group_values(datums: Vec<Datum>) -> Vec<(Datum, Vec<f64>)> {
    type GroupKey = (
        &'static str,
        &'static str,
        Vec<(&'static str, &'static str)>,
    );
    let mut groups: BTreeMap<GroupKey, Vec<f64>> = BTreeMap::new();
    for d in datums.into_iter().filter(|d| d.value.is_finite()) {
        groups
            .entry((d.name, d.unit, d.dimensions))
            .or_default()
            .push(d.value);
    }
    let mut out = Vec::new();
    for ((name, unit, dimensions), values) in groups {
        for chunk in values.chunks(150) {
            out.push((
                Datum {
                    name,
                    unit,
                    dimensions: dimensions.clone(),
                    value: chunk[0],
                },
                chunk.to_vec(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_values_never_become_datums() {
        assert!(MetricEvent::Rtfx(f64::NAN).datum().is_none());
        assert!(MetricEvent::Rtfx(f64::INFINITY).datum().is_none());
        assert!(MetricEvent::Rtfx(12.5).datum().is_some());
    }

    #[test]
    fn emit_drops_instead_of_blocking() {
        let (metrics, _rx) = Metrics::new(2);
        for _ in 0..5 {
            metrics.emit(MetricEvent::AudioSeconds(1.0));
        }
        assert_eq!(metrics.dropped(), 3);
    }

    #[test]
    fn grouping_caps_values_per_datum() {
        let datums = (0..400)
            .map(|i| MetricEvent::AudioSeconds(i as f64).datum().expect("finite"))
            .collect();
        let grouped = group_values(datums);
        assert_eq!(
            grouped.iter().map(|(_, v)| v.len()).collect::<Vec<_>>(),
            vec![150, 150, 100]
        );
    }
}
