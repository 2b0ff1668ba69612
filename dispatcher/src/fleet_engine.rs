//! A fleet (`--gpus` or `--cpu-instances`): transcription through supervised `worker`
//! processes (per-GPU groups under CUDA MPS, or CPU workers) instead of the in-process model.
//! The fleet's worker states join `/health` and its metrics join `/metrics`. With a
//! diarization model, the fleet also runs a Sortformer pool in every group and
//! [`FleetDiarizer`] sends recordings there.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use engine::{EncoderPrecision, EngineKind, EngineSettings};
use model_core::long_audio::{LongAudio, DEFAULT_FULL_ATTENTION_MAX_S};
use model_core::speakers::SpeakerSegment;
use model_core::transcript::Transcript;
use worker_fleet::{Fleet, FleetError, FleetOptions, FleetTranscriber, WireErrorKind};

use crate::config::Settings;
use crate::diarizer::Diarizer;
use crate::error::{DispatchError, Result};
use crate::metrics::MetricsSource;
use crate::model_id::given_or_hashed;
use crate::transcriber::{Capacity, Priority, SharedPcm, Transcriber};

/// The CUDA engine's encoder storage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CudaPrecision {
    /// bf16 weights and activations, fp32 accumulation (fast).
    #[default]
    Bf16,
    /// f32 throughout: NeMo's fp32 results, about twice the weight memory.
    F32,
}

impl CudaPrecision {
    pub fn encoder(self) -> EncoderPrecision {
        match self {
            Self::Bf16 => EncoderPrecision::Bf16,
            Self::F32 => EncoderPrecision::F32,
        }
    }

    fn flag_value(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
        }
    }
}

/// Which engine transcribes, and where: in this process, or in a fleet of `worker` processes
/// when `--gpus` or `--cpu-instances` gives it a shape.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// The engine: `cpu` (the f32 reference model), `onnx` (ONNX Runtime; needs
    /// `ORT_DYLIB_PATH`) or `cuda` (the native GPU engine; without a usable GPU this is an
    /// error, never a CPU fallback). Default: `cuda` with `--gpus`, else `cpu`.
    #[arg(long, value_enum)]
    pub engine: Option<EngineKind>,
    /// The GPU of an in-process `--engine cuda` (ordinal after `CUDA_VISIBLE_DEVICES`); a
    /// fleet's workers take theirs from `--gpus`.
    #[arg(long, default_value_t = 0)]
    pub cuda_device: usize,
    /// The CUDA engine's encoder storage, in process or in every fleet worker.
    #[arg(long, value_enum, default_value_t)]
    pub cuda_encoder_precision: CudaPrecision,
    /// Utterances longer than this (seconds) run with local attention (128 encoder frames,
    /// 10.24 s, each side) instead of the checkpoint's full attention: NeMo's long-audio
    /// recipe. 1440 (24 minutes) is the model card's full-attention limit; every engine uses
    /// the same value, so a transcript does not depend on the engine.
    #[arg(long, default_value_t = DEFAULT_FULL_ATTENTION_MAX_S, value_parser = cli::positive_seconds)]
    pub full_attention_max_s: f64,
    /// A fleet: how long to wait for the first worker to be ready.
    #[arg(long, default_value_t = 600)]
    pub fleet_ready_timeout_s: u64,
    #[command(flatten)]
    pub fleet: FleetOptions,
}

/// The command line's defaults (for callers that build the arguments in code).
impl Default for EngineArgs {
    fn default() -> Self {
        Self {
            engine: None,
            cuda_device: 0,
            cuda_encoder_precision: CudaPrecision::default(),
            full_attention_max_s: DEFAULT_FULL_ATTENTION_MAX_S,
            fleet_ready_timeout_s: 600,
            fleet: FleetOptions::default(),
        }
    }
}

impl EngineArgs {
    /// The engine: as given, else the GPU engine on GPUs and the CPU one without.
    pub fn engine(&self) -> EngineKind {
        match self.engine {
            Some(engine) => engine,
            None if self.fleet.gpus.is_empty() => EngineKind::Cpu,
            None => EngineKind::Cuda,
        }
    }

    /// Whether workers run the engine (`--gpus` or `--cpu-instances` given).
    pub fn is_fleet(&self) -> bool {
        !self.fleet.gpus.is_empty() || self.fleet.cpu_instances.is_some()
    }

    /// The in-process engine's settings.
    pub fn engine_settings(&self, segments_per_call: usize) -> EngineSettings {
        let settings = match self.engine() {
            EngineKind::Cpu | EngineKind::Onnx => EngineSettings::cpu(),
            EngineKind::Cuda => EngineSettings::gpu(
                self.cuda_device,
                self.cuda_encoder_precision.encoder(),
                segments_per_call,
            ),
        };
        EngineSettings {
            long_audio: LongAudio {
                full_attention_max_s: self.full_attention_max_s,
            },
            ..settings
        }
    }
}

/// The engine and, for a fleet, what `/health` and `/metrics` should include.
pub struct LoadedEngine {
    pub transcriber: Arc<dyn Transcriber>,
    pub metrics_source: Option<Arc<dyn MetricsSource>>,
    /// Set by [`load_for`] when the settings name a diarization model.
    pub diarizer: Option<Arc<dyn Diarizer>>,
}

/// The engine and diarizer for `settings`: with a fleet and a diarization model
/// (`diar_model`), the fleet's diarization workers (unless `--diar-workers-per-gpu 0`);
/// otherwise the in-process Sortformer. Either way the diarizer's model id is the same (the
/// file name plus hash, or `diar_model_id`), so result keys do not depend on where it runs.
pub fn load_for(args: &EngineArgs, settings: &Settings, model: &Path) -> Result<LoadedEngine> {
    let model_id = settings.model_id.clone();
    let diar = settings.diar_model.as_deref();
    if args.is_fleet() && diar.is_some() && args.fleet.diar_workers_per_gpu > 0 {
        return load_fleet(args, model, model_id, diar, settings.diar_model_id.clone());
    }
    let segments_per_call = settings
        .segments_per_call
        .unwrap_or(Capacity::ONE_CALL_AT_A_TIME.segments_per_call);
    let mut engine = load(args, model, model_id, segments_per_call)?;
    engine.diarizer = crate::app::load_diarizer(settings)?;
    Ok(engine)
}

/// Loads the chosen engine. Result keys use the same model id either way (file name plus
/// hash), so a fleet and the in-process engine produce the same keys for the same model.
pub fn load(
    args: &EngineArgs,
    model: &Path,
    model_id: Option<String>,
    segments_per_call: usize,
) -> Result<LoadedEngine> {
    if !args.is_fleet() {
        return Ok(LoadedEngine {
            transcriber: crate::in_process::load_transcriber(
                args.engine(),
                model,
                &args.engine_settings(segments_per_call),
                model_id,
            )?,
            metrics_source: None,
            diarizer: None,
        });
    }
    load_fleet(args, model, model_id, None, None)
}

/// The fleet, with a diarization pool when `diar_model` is given.
fn load_fleet(
    args: &EngineArgs,
    model: &Path,
    model_id: Option<String>,
    diar_model: Option<&Path>,
    diar_model_id: Option<String>,
) -> Result<LoadedEngine> {
    let model_id = given_or_hashed(model_id, model)?;
    let diar_model_id = match diar_model {
        Some(path) => Some(given_or_hashed(diar_model_id, path)?),
        None => None,
    };
    let mut fleet = args.fleet.clone();
    fleet.worker_args.push(format!(
        "--full-attention-max-s={}",
        args.full_attention_max_s
    ));
    if args.engine() == EngineKind::Cuda {
        fleet.worker_args.push(format!(
            "--cuda-encoder-precision={}",
            args.cuda_encoder_precision.flag_value()
        ));
    }
    let config = fleet
        .to_config_with_diarization(args.engine(), model, diar_model)
        .map_err(|e| DispatchError::Config(e.to_string()))?;
    let layout: Vec<String> = config
        .groups
        .iter()
        .map(|g| match (&g.mps, g.instances) {
            (Some(mps), n) => format!(
                "{}: {n} x {} % SMs under MPS",
                g.name,
                mps.thread_percentage(n)
            ),
            (None, n) => format!("{}: {n} without MPS", g.name),
        })
        .collect();
    tracing::info!(groups = config.groups.len(), engine = %config.engine,
        layout = %layout.join("; "), diarization = ?config.diarization,
        worker = %config.worker_binary.display(), "starting the worker fleet");
    let fleet = Fleet::start(config).map_err(|e| DispatchError::Config(e.to_string()))?;
    let inner = FleetTranscriber::new(
        fleet,
        model_id,
        Duration::from_secs(args.fleet_ready_timeout_s),
    )
    .map_err(|e| DispatchError::Config(format!("worker fleet: {e}")))?;
    let engine = Arc::new(FleetEngine { inner });
    let diarizer = match diar_model_id {
        Some(model_id) => {
            engine
                .fleet()
                .wait_diarization_ready(Duration::from_secs(args.fleet_ready_timeout_s))
                .map_err(|e| DispatchError::Config(format!("worker fleet diarization: {e}")))?;
            let diarizer: Arc<dyn Diarizer> = Arc::new(FleetDiarizer {
                engine: engine.clone(),
                model_id,
            });
            Some(diarizer)
        }
        None => None,
    };
    Ok(LoadedEngine {
        transcriber: engine.clone(),
        metrics_source: Some(engine),
        diarizer,
    })
}

/// The fleet's diarization workers behind the dispatcher's [`Diarizer`]: each recording goes
/// whole to the least-loaded one (re-sent if its worker or group restarts). Holds the fleet
/// like the transcriber does.
pub struct FleetDiarizer {
    engine: Arc<FleetEngine>,
    model_id: String,
}

impl Diarizer for FleetDiarizer {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn diarize(&self, pcm_16k: &SharedPcm) -> Result<Vec<SpeakerSegment>> {
        self.engine
            .fleet()
            .diarize(pcm_16k.clone())
            .map(|response| response.segments)
            .map_err(classify)
    }
}

/// [`FleetTranscriber`] behind the dispatcher's [`Transcriber`]. Dropping the last handle
/// stops the workers (and the MPS daemons the fleet started).
pub struct FleetEngine {
    inner: FleetTranscriber,
}

impl FleetEngine {
    pub fn fleet(&self) -> &Fleet {
        self.inner.fleet()
    }
}

impl Transcriber for FleetEngine {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }

    fn frame_duration_s(&self) -> f64 {
        self.inner.frame_duration_s()
    }

    fn transcribe(&self, segments: &[&[f32]]) -> Result<Vec<Transcript>> {
        self.inner.transcribe(segments).map_err(classify)
    }

    fn transcribe_at(&self, segments: &[SharedPcm], priority: Priority) -> Result<Vec<Transcript>> {
        self.inner
            .transcribe_with(segments, priority)
            .map_err(classify)
    }

    fn ready(&self) -> Result<bool> {
        self.fleet()
            .ready_transcribers()
            .map(|ready| ready > 0)
            .map_err(classify)
    }

    /// Every transcription worker's outstanding requests: that many segments keep all their
    /// batches full, and one call never holds more than one worker's share.
    fn capacity(&self) -> Capacity {
        let config = self.fleet().config();
        let per_worker = config.max_outstanding_per_worker.max(1);
        let workers: usize = config.groups.iter().map(|g| g.instances).sum();
        Capacity {
            segments_in_flight: (workers * per_worker).max(1),
            segments_per_call: per_worker,
        }
    }
}

/// A segment that keeps killing workers, or that a worker refuses as malformed, fails its
/// job permanently (a failure record, not a retry storm); everything else means this node
/// cannot transcribe right now (infrastructure: release the message, stop taking work).
fn classify(error: FleetError) -> DispatchError {
    match error {
        FleetError::PoisonRequest { .. } => DispatchError::Audio {
            reason: "segment_kills_workers",
            message: error.to_string(),
        },
        FleetError::Rejected {
            kind: WireErrorKind::BadRequest,
            ..
        } => DispatchError::Audio {
            reason: "segment_rejected",
            message: error.to_string(),
        },
        FleetError::TooLong { .. } => DispatchError::Audio {
            reason: "too_long_for_worker",
            message: error.to_string(),
        },
        other => DispatchError::Inference(other.to_string()),
    }
}

impl MetricsSource for FleetEngine {
    fn name(&self) -> &'static str {
        "fleet"
    }

    fn render_prometheus(&self) -> String {
        self.fleet().render_prometheus()
    }

    /// Ready while any worker is: the dispatcher makes progress as long as one group serves
    /// (a GPU group restarting after an MPS fault is visible in the body, not fatal here).
    fn health(&self) -> (bool, serde_json::Value) {
        let health = self.fleet().health();
        let value = serde_json::to_value(&health).unwrap_or_else(|e| e.to_string().into());
        (health.any_ready, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatcher shares diarizers across threads (`Arc<dyn Diarizer>`).
    #[test]
    fn fleet_diarizer_is_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<FleetDiarizer>();
    }

    #[test]
    fn poison_and_bad_segments_are_permanent_the_rest_infrastructure() {
        use crate::error::ErrorClass;
        let poison = classify(FleetError::PoisonRequest { attempts: 3 });
        assert_eq!(poison.class(), ErrorClass::Permanent);
        assert_eq!(poison.reason_code(), "segment_kills_workers");
        let bad = classify(FleetError::Rejected {
            kind: WireErrorKind::BadRequest,
            message: "empty audio".into(),
        });
        assert_eq!(bad.class(), ErrorClass::Permanent);
        let busy = classify(FleetError::Overloaded { waited_ms: 5 });
        assert_eq!(busy.class(), ErrorClass::Infrastructure);
        assert_eq!(
            classify(FleetError::ShuttingDown).reason_code(),
            "inference_error"
        );
    }
}
