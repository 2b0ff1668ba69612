//! `--engine fleet`: transcription through supervised `worker` processes (per-GPU groups under
//! CUDA MPS, or CPU workers) instead of the in-process model. The fleet's worker states join
//! `/health` and its metrics join `/metrics`. With a diarization model, the fleet also runs a
//! Sortformer pool in every group and [`FleetDiarizer`] sends recordings there.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use engine::{EngineKind, EngineSettings};
use model_core::speakers::SpeakerSegment;
use model_core::transcript::Transcript;
use worker_fleet::{Fleet, FleetError, FleetOptions, FleetTranscriber, WireErrorKind};

use crate::config::Settings;
use crate::diarizer::Diarizer;
use crate::error::{DispatchError, Result};
use crate::metrics::MetricsSource;
use crate::model_id::given_or_hashed;
use crate::transcriber::{Capacity, Priority, Transcriber};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineChoice {
    /// The CPU model inside this process.
    #[default]
    InProcess,
    /// `worker` processes run by a supervisor inside this process (the `--gpus`,
    /// `--cpu-instances`, ... options).
    Fleet,
}

/// Which engine transcribes, and the fleet's shape when it is `fleet`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EngineArgs {
    #[arg(long, env = "DISPATCHER_ENGINE", value_enum, default_value_t)]
    pub engine: EngineChoice,
    /// `--engine fleet`: the engine of every worker (`cpu`, `onnx`, `cuda`). Default: `cuda`
    /// with `--gpus`, `cpu` with `--cpu-instances`.
    #[arg(long, env = "FLEET_WORKER_ENGINE", value_enum)]
    pub worker_engine: Option<EngineKind>,
    /// `--engine fleet`: how long to wait for the first worker to be ready.
    #[arg(long, env = "FLEET_READY_TIMEOUT_S", default_value_t = 600)]
    pub fleet_ready_timeout_s: u64,
    #[command(flatten)]
    pub fleet: FleetOptions,
}

impl EngineArgs {
    /// The workers' engine: as given, else the GPU engine on GPUs and the CPU one without.
    pub fn worker_engine(&self) -> EngineKind {
        match self.worker_engine {
            Some(engine) => engine,
            None if self.fleet.gpus.is_empty() => EngineKind::Cpu,
            None => EngineKind::Cuda,
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

/// The engine and diarizer for `settings`: with `--engine fleet` and a diarization model
/// (`diar_model`), the fleet's diarization workers (unless `--diar-workers-per-gpu 0`);
/// otherwise the in-process Sortformer. Either way the diarizer's model id is the same (the
/// file name plus hash, or `diar_model_id`), so result keys do not depend on where it runs.
pub fn load_for(args: &EngineArgs, settings: &Settings, model: &Path) -> Result<LoadedEngine> {
    let model_id = settings.model_id.clone();
    let diar = settings.diar_model.as_deref();
    if args.engine == EngineChoice::Fleet && diar.is_some() && args.fleet.diar_workers_per_gpu > 0 {
        return load_fleet(args, model, model_id, diar, settings.diar_model_id.clone());
    }
    let mut engine = load(args, model, model_id)?;
    engine.diarizer = crate::app::load_diarizer(settings)?;
    Ok(engine)
}

/// Loads the chosen engine. Result keys use the same model id either way (file name plus
/// hash), so a fleet and the in-process engine produce the same keys for the same model.
pub fn load(args: &EngineArgs, model: &Path, model_id: Option<String>) -> Result<LoadedEngine> {
    if args.engine == EngineChoice::InProcess {
        return Ok(LoadedEngine {
            transcriber: crate::in_process::load_transcriber(
                EngineKind::Cpu,
                model,
                &EngineSettings::cpu(),
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
    let worker_engine = args.worker_engine();
    let config = args
        .fleet
        .to_config_with_diarization(worker_engine, model, diar_model)
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

    fn diarize(&self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>> {
        self.engine
            .fleet()
            .diarize(pcm_16k)
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

    fn transcribe_at(&self, segments: &[&[f32]], priority: Priority) -> Result<Vec<Transcript>> {
        self.inner
            .transcribe_with(segments, priority)
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
