//! Wiring shared by the subcommands (and the tests): settings → pipeline, metrics, consumer.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use engine::{EngineKind, EngineSettings};

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
use crate::transcriber::{Capacity, Transcriber};

/// Connections or files one job in flight may hold at once: its input's (a connection to the
/// store, or the file) and a result being written.
pub const OPEN_FILES_PER_JOB: u64 = 2;
/// Open files kept for the rest of the process: the fleet's sockets and pipes, the queue's
/// receivers, the runtime, logs, the metrics and API listeners.
pub const OPEN_FILES_RESERVED: u64 = 256;

/// The pipeline's concurrency limits: each setting given wins, the rest are sized from what
/// the engine takes at once, the host's cores and its open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    pub receivers: usize,
    pub max_in_flight: usize,
    pub inference_slots: usize,
    pub segments_per_call: usize,
    pub decode_threads: usize,
}

impl Sizing {
    /// Rules, in order:
    /// 1. decode threads: the host's cores (decoding is CPU work that must not starve the
    ///    async runtime, and more threads than cores only add switching);
    /// 2. inference slots: the segments the engine takes at once (every job has at least one
    ///    segment, so this many jobs keep every worker's batches full);
    /// 3. segments per call: the engine's own figure;
    /// 4. jobs in flight: the inference slots plus two per decode thread, so the next
    ///    recordings are fetched and decoded while the engine works on the current ones, but
    ///    no more ahead than twice the inference slots (a slow engine does not hold messages
    ///    that another host could take);
    /// 5. receivers: one per 32 messages in flight, at least 2 and at most 8 (each receive
    ///    brings at most 10 messages);
    /// 6. jobs in flight, unless given, within the open-file limit: each may hold
    ///    [`OPEN_FILES_PER_JOB`] connections or files, beside [`OPEN_FILES_RESERVED`] for the
    ///    rest of the process (at least one job); rule 5 counts the jobs left after this cap.
    pub fn resolve(settings: &Settings, capacity: Capacity, cores: usize, open_files: u64) -> Self {
        let decode_threads = settings.decode_threads.unwrap_or(cores.max(1));
        let inference_slots = settings
            .inference_slots
            .unwrap_or(capacity.segments_in_flight.max(1));
        let segments_per_call = settings
            .segments_per_call
            .unwrap_or(capacity.segments_per_call.max(1));
        let max_in_flight = settings.max_in_flight.unwrap_or_else(|| {
            (inference_slots + (2 * decode_threads).min(2 * inference_slots))
                .min(Self::jobs_within(open_files))
        });
        let receivers = settings
            .receivers
            .unwrap_or(max_in_flight.div_ceil(32).clamp(2, 8));
        Self {
            receivers,
            max_in_flight,
            inference_slots,
            segments_per_call,
            decode_threads,
        }
    }

    /// The most jobs in flight whose connections and files fit `open_files` (rule 6).
    pub fn jobs_within(open_files: u64) -> usize {
        let jobs = open_files.saturating_sub(OPEN_FILES_RESERVED) / OPEN_FILES_PER_JOB;
        usize::try_from(jobs).unwrap_or(usize::MAX).max(1)
    }

    /// Sized for this host: [`Self::resolve`] with its available parallelism and open-file
    /// limit (raised at start: [`crate::open_files`]).
    pub fn for_host(settings: &Settings, capacity: Capacity) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::resolve(settings, capacity, cores, crate::open_files::limit())
    }
}

/// The audio limits and segmentation the settings ask for.
pub fn audio_settings(settings: &Settings) -> AudioSettings {
    AudioSettings {
        limits: audio::AudioLimits {
            max_input_bytes: settings.max_input_bytes,
            max_duration_s: settings.max_audio_duration_s,
            ..audio::AudioLimits::default()
        },
        segmenter: audio::SegmenterConfig {
            max_segment_s: settings.max_segment_s,
            ..audio::SegmenterConfig::default()
        },
    }
}

pub fn pipeline_settings(settings: &Settings, sizing: &Sizing) -> Result<PipelineSettings> {
    Ok(PipelineSettings {
        default_output: settings
            .output_uri
            .as_deref()
            .map(Prefix::parse_uri)
            .transpose()?,
        max_input_bytes: settings.max_input_bytes,
        audio: audio_settings(settings),
        retry: RetrySettings {
            max_retries: settings.retry_max,
            ..RetrySettings::default()
        },
        segments_per_call: sizing.segments_per_call,
        inference_slots: sizing.inference_slots,
        decode_threads: sizing.decode_threads,
        tenants: settings
            .tenants_file
            .as_deref()
            .map(crate::tenants::Tenants::load)
            .transpose()?,
        checkpoint_every_s: settings.checkpoint_every_s,
    })
}

pub fn consumer_settings(
    settings: &Settings,
    sizing: &Sizing,
    exit_when_idle: bool,
) -> ConsumerSettings {
    ConsumerSettings {
        receivers: sizing.receivers,
        max_messages_per_receive: settings.max_messages_per_receive,
        wait: Duration::from_secs(settings.wait_time_s),
        visibility: settings.visibility(),
        max_in_flight: sizing.max_in_flight,
        drain_grace: Duration::from_secs(settings.drain_grace_s),
        exit_when_idle,
        max_retry_delay: Duration::from_secs(settings.max_retry_delay_s),
        visibility_cap: crate::lifecycle::heartbeat::VISIBILITY_CAP,
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
        .map(|path| {
            crate::in_process::load_diarizer(
                EngineKind::Cpu,
                path,
                &EngineSettings::cpu(),
                settings.diar_model_id.clone(),
            )
        })
        .transpose()
}

/// What a consumer works with.
pub struct ConsumerParts {
    pub queue: Arc<dyn Queue>,
    pub store: Arc<dyn ObjectStore>,
    pub transcriber: Arc<dyn Transcriber>,
    /// Serves the jobs that ask for diarization (`None`: those fail permanently).
    pub diarizer: Option<Arc<dyn Diarizer>>,
}

/// A consumer over `parts`, sharing `metrics`' health flag; with `exit_when_idle` it stops once
/// the queue is empty and nothing is in flight.
pub fn consumer(
    settings: &Settings,
    parts: ConsumerParts,
    metrics: &MetricsRuntime,
    exit_when_idle: bool,
) -> Result<Arc<Consumer>> {
    consumer_with(
        settings,
        parts,
        &metrics.metrics,
        metrics.healthy.clone(),
        exit_when_idle,
    )
}

/// [`consumer`] with the metrics handle and health flag given apart (for a consumer started
/// from another thread, as `serve` does once its engine is loaded).
pub fn consumer_with(
    settings: &Settings,
    parts: ConsumerParts,
    metrics: &Metrics,
    healthy: Arc<AtomicBool>,
    exit_when_idle: bool,
) -> Result<Arc<Consumer>> {
    let ConsumerParts {
        queue,
        store,
        transcriber,
        diarizer,
    } = parts;
    let sizing = Sizing::for_host(settings, transcriber.capacity());
    let open_files = crate::open_files::limit();
    tracing::info!(
        receivers = sizing.receivers,
        max_in_flight = sizing.max_in_flight,
        inference_slots = sizing.inference_slots,
        segments_per_call = sizing.segments_per_call,
        decode_threads = sizing.decode_threads,
        open_files,
        "pipeline limits (unset ones sized from the engine's capacity, the host's cores and \
         its open-file limit)"
    );
    if sizing.max_in_flight > Sizing::jobs_within(open_files) {
        tracing::warn!(
            max_in_flight = sizing.max_in_flight,
            open_files,
            "--max-in-flight {} may need {} open files, over this process's limit of \
             {open_files}: connections and files will fail with \"Too many open files\"; raise \
             the hard limit (`ulimit -Hn`, systemd LimitNOFILE=, docker --ulimit nofile=) or \
             lower --max-in-flight",
            sizing.max_in_flight,
            sizing.max_in_flight as u64 * OPEN_FILES_PER_JOB + OPEN_FILES_RESERVED,
        );
    }
    let pipeline = Arc::new(
        Pipeline::new(
            store,
            transcriber,
            metrics.clone(),
            pipeline_settings(settings, &sizing)?,
        )?
        .with_diarizer(diarizer),
    );
    let mut consumer = Consumer::new(
        queue,
        pipeline,
        consumer_settings(settings, &sizing, exit_when_idle),
    );
    consumer.healthy = healthy;
    Ok(Arc::new(consumer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SettingsArgs;

    fn fleet_of(workers: usize) -> Capacity {
        Capacity {
            segments_in_flight: workers * 32,
            segments_per_call: 32,
        }
    }

    #[test]
    fn limits_follow_the_engine_and_the_cores() {
        let defaults = SettingsArgs::default().resolve().expect("defaults");
        let fleet = Sizing::resolve(&defaults, fleet_of(4), 16, 65_536);
        assert_eq!(
            fleet,
            Sizing {
                receivers: 5,
                max_in_flight: 128 + 32,
                inference_slots: 128,
                segments_per_call: 32,
                decode_threads: 16,
            }
        );
        let in_process = Sizing::resolve(&defaults, Capacity::ONE_CALL_AT_A_TIME, 2, 1_024);
        assert_eq!(
            (in_process.inference_slots, in_process.max_in_flight),
            (1, 3)
        );
        assert_eq!((in_process.segments_per_call, in_process.receivers), (8, 2));
    }

    #[test]
    fn jobs_in_flight_fit_the_open_file_limit() {
        let defaults = SettingsArgs::default().resolve().expect("defaults");
        // Eight CUDA workers' worth of slots on 64 cores: 1 024 + 128 jobs would want 2 560
        // open files; under a limit of 1 024, (1 024 - 256) / 2 = 384 jobs, and receivers
        // ceil(384 / 32) = 12, clamped to 8.
        let capped = Sizing::resolve(&defaults, fleet_of(32), 64, 1_024);
        assert_eq!((capped.max_in_flight, capped.receivers), (384, 8));
        assert_eq!(
            capped.inference_slots, 1_024,
            "only jobs in flight are capped"
        );
        let roomy = Sizing::resolve(&defaults, fleet_of(32), 64, 65_536);
        assert_eq!(roomy.max_in_flight, 1_024 + 128);
        // A given max_in_flight wins (a_given_setting_always_wins); a limit below the
        // reserve still lets one job through.
        assert_eq!(Sizing::jobs_within(100), 1);
        assert_eq!(Sizing::jobs_within(65_536), 32_640);
    }

    #[test]
    fn a_given_setting_always_wins() {
        let given = SettingsArgs {
            receivers: Some(1),
            max_in_flight: Some(3),
            inference_slots: Some(2),
            segments_per_call: Some(4),
            decode_threads: Some(1),
            ..SettingsArgs::default()
        }
        .resolve()
        .expect("settings");
        assert_eq!(
            Sizing::resolve(&given, fleet_of(8), 64, 100),
            Sizing {
                receivers: 1,
                max_in_flight: 3,
                inference_slots: 2,
                segments_per_call: 4,
                decode_threads: 1,
            }
        );
    }
}
