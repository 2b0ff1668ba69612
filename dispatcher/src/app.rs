//! Wiring shared by the subcommands (and the tests): settings → pipeline, metrics, consumer.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::decode::AudioSettings;
use crate::diarizer::Diarizer;
use crate::error::Result;
use crate::job::Prefix;
use crate::lifecycle::retry::RetrySettings;
use crate::lifecycle::{Consumer, ConsumerSettings};
use crate::metrics::{self, AggregatorSettings, Metrics, Sink};
use crate::pipeline::{Pipeline, PipelineSettings};
use crate::queue::Queue;
use crate::store::ObjectStore;
use crate::transcriber::Transcriber;

pub fn pipeline_settings(settings: &Settings) -> Result<PipelineSettings> {
    Ok(PipelineSettings {
        default_output: settings
            .output_uri
            .as_deref()
            .map(Prefix::parse_uri)
            .transpose()?,
        max_input_bytes: settings.max_input_bytes,
        audio: AudioSettings {
            limits: audio::AudioLimits {
                max_input_bytes: settings.max_input_bytes,
                max_duration_secs: settings.max_audio_duration_s,
                ..audio::AudioLimits::default()
            },
            segmenter: audio::SegmenterConfig {
                max_segment_secs: settings.max_segment_s,
                ..audio::SegmenterConfig::default()
            },
        },
        retry: RetrySettings {
            max_retries: settings.retry_max,
            ..RetrySettings::default()
        },
        segments_per_call: settings.segments_per_call,
        inference_slots: settings.inference_slots,
    })
}

pub fn consumer_settings(settings: &Settings, exit_when_idle: bool) -> ConsumerSettings {
    ConsumerSettings {
        receivers: settings.receivers,
        max_messages_per_receive: settings.max_messages_per_receive,
        wait: Duration::from_secs(settings.wait_time_s),
        visibility: settings.visibility(),
        max_in_flight: settings.max_in_flight,
        drain_grace: Duration::from_secs(settings.drain_grace_s),
        exit_when_idle,
        max_retry_delay: Duration::from_secs(settings.max_retry_delay_s),
    }
}

/// Metrics running in the background: the aggregator (and CloudWatch sink) plus the optional
/// HTTP endpoint. `shutdown` flushes what is left.
pub struct MetricsRuntime {
    pub metrics: Metrics,
    pub healthy: Arc<AtomicBool>,
    pub http_addr: Option<std::net::SocketAddr>,
    stop: CancellationToken,
    aggregator: JoinHandle<()>,
}

impl MetricsRuntime {
    pub async fn start(settings: &Settings, sink: Option<Arc<dyn Sink>>) -> Result<Self> {
        let (metrics, rx) = Metrics::new(10_000);
        let stop = CancellationToken::new();
        let healthy = Arc::new(AtomicBool::new(true));
        let aggregator = tokio::spawn(metrics::run_aggregator(
            metrics.clone(),
            rx,
            sink,
            AggregatorSettings {
                flush_interval: Duration::from_secs(settings.metrics_flush_s.max(1)),
                max_batch: 1000,
            },
            stop.clone(),
        ));
        let http_addr = match settings.metrics_listen {
            Some(addr) => Some(
                metrics::prometheus::serve(addr, metrics.clone(), healthy.clone(), stop.clone())
                    .await?,
            ),
            None => None,
        };
        if let Some(addr) = http_addr {
            tracing::info!(%addr, "serving /metrics and /health");
        }
        Ok(Self {
            metrics,
            healthy,
            http_addr,
            stop,
            aggregator,
        })
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.aggregator.await;
    }
}

/// The diarization model named by the settings (`diar_model`), if any.
pub fn load_diarizer(settings: &Settings) -> Result<Option<Arc<dyn Diarizer>>> {
    settings
        .diar_model
        .as_deref()
        .map(|path| crate::diarizer::load(path, settings.diar_model_id.clone()))
        .transpose()
}

/// A consumer over `queue` and `store` with the given engine, sharing `metrics`' health flag.
pub fn consumer(
    settings: &Settings,
    queue: Arc<dyn Queue>,
    store: Arc<dyn ObjectStore>,
    transcriber: Arc<dyn Transcriber>,
    metrics: &MetricsRuntime,
    exit_when_idle: bool,
) -> Result<Arc<Consumer>> {
    consumer_with_diarizer(
        settings,
        queue,
        store,
        transcriber,
        None,
        metrics,
        exit_when_idle,
    )
}

/// Like [`consumer`], serving diarization requests with `diarizer`.
pub fn consumer_with_diarizer(
    settings: &Settings,
    queue: Arc<dyn Queue>,
    store: Arc<dyn ObjectStore>,
    transcriber: Arc<dyn Transcriber>,
    diarizer: Option<Arc<dyn Diarizer>>,
    metrics: &MetricsRuntime,
    exit_when_idle: bool,
) -> Result<Arc<Consumer>> {
    let pipeline = Arc::new(
        Pipeline::new(
            store,
            transcriber,
            metrics.metrics.clone(),
            pipeline_settings(settings)?,
        )
        .with_diarizer(diarizer),
    );
    let mut consumer = Consumer::new(queue, pipeline, consumer_settings(settings, exit_when_idle));
    consumer.healthy = metrics.healthy.clone();
    Ok(Arc::new(consumer))
}
