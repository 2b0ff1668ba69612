//! `--engine fleet`: transcription through supervised `worker` processes (per-GPU groups under
//! CUDA MPS, or CPU workers) instead of the in-process model. The fleet's worker states join
//! `/health` and its metrics join `/metrics`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use models::transcript::Transcript;
use worker_fleet::{Fleet, FleetError, FleetOptions, FleetTranscriber, WireErrorKind};

use crate::error::{DispatchError, Result};
use crate::metrics::MetricsSource;
use crate::transcriber::Transcriber;

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
    /// `--engine fleet`: the engine of every worker (`cpu`, `onnx`, `cuda`).
    #[arg(long, env = "FLEET_WORKER_ENGINE", default_value = "cpu")]
    pub worker_engine: String,
    /// `--engine fleet`: how long to wait for the first worker to be ready.
    #[arg(long, env = "FLEET_READY_TIMEOUT_S", default_value_t = 600)]
    pub fleet_ready_timeout_s: u64,
    #[command(flatten)]
    pub fleet: FleetOptions,
}

/// The engine and, for a fleet, what `/health` and `/metrics` should include.
pub struct LoadedEngine {
    pub transcriber: Arc<dyn Transcriber>,
    pub metrics_source: Option<Arc<dyn MetricsSource>>,
}

/// Loads the chosen engine. Result keys use the same model id either way (file name plus
/// hash), so a fleet and the in-process engine produce the same keys for the same model.
pub fn load(args: &EngineArgs, model: &Path, model_id: Option<String>) -> Result<LoadedEngine> {
    if args.engine == EngineChoice::InProcess {
        return Ok(LoadedEngine {
            transcriber: crate::engine::load(model, model_id)?,
            metrics_source: None,
        });
    }
    let model_id = match model_id {
        Some(id) => id,
        None => crate::engine::model_id_for(model)?,
    };
    let config = args
        .fleet
        .to_config(&args.worker_engine, model)
        .map_err(|e| DispatchError::Config(e.to_string()))?;
    tracing::info!(groups = config.groups.len(), engine = %config.engine,
        worker = %config.worker_binary.display(), "starting the worker fleet");
    let fleet = Fleet::start(config).map_err(|e| DispatchError::Config(e.to_string()))?;
    let inner = FleetTranscriber::new(
        fleet,
        model_id,
        Duration::from_secs(args.fleet_ready_timeout_s),
    )
    .map_err(|e| DispatchError::Config(format!("worker fleet: {e}")))?;
    let engine = Arc::new(FleetEngine { inner });
    Ok(LoadedEngine {
        transcriber: engine.clone(),
        metrics_source: Some(engine),
    })
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
