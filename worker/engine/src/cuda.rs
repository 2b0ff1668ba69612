//! The native CUDA engine (`cuda-engine`'s [`GpuParakeet`]) behind the [`Engine`] trait. It warms up (decoder graph captured, one full batch run) before the worker reports
//! ready, and it never runs anywhere but its GPU.

use std::path::{Path, PathBuf};

use cuda_engine::{
    CudaSlice, DeviceProbe, EncoderPrecision, FeatureLocation, GpuParakeet, WeightShare,
    WeightSharing,
};
use model_core::long_audio::LongAudio;
use model_core::transcript::Hypothesis;
use worker_protocol::{DeviceReport, EngineKind, ModelInfo, MpsReport};

use crate::error::EngineError;
use crate::model_info;
use crate::transcription::{one_per_clip, Engine, Fault};

/// The GPU, the batch envelope the decoder's CUDA graph is captured for (larger batches run
/// eagerly), where features are computed, the encoder's storage type and its subsampling
/// scratch cap (`None`: none).
#[derive(Debug, Clone)]
pub struct CudaSettings {
    pub device: usize,
    pub graph_max_batch: usize,
    pub graph_max_s: f64,
    pub features: FeatureLocation,
    pub precision: EncoderPrecision,
    /// Cap of each subsampling scratch buffer (`usize::MAX`: none).
    pub subsampling_scratch_bytes: usize,
    /// Where the workers of this GPU share one copy of the encoder weights (`None`: private).
    pub weights_share_dir: Option<PathBuf>,
    /// Waits for the GPU sleep instead of spinning on a host core.
    pub blocking_sync: bool,
}

impl CudaSettings {
    /// Longest segment the decoder graph is captured for at warm-up (longer ones run eagerly).
    pub const DEFAULT_GRAPH_MAX_S: f64 = 30.0;
    /// Each subsampling scratch buffer's cap: groups of 5 x 30 s in bf16.
    pub const DEFAULT_SUBSAMPLING_SCRATCH_MIB: usize = 64;

    /// GPU `device` with `precision` and the defaults for everything else: graph captured for
    /// `graph_max_batch` x 30 s, features on the GPU, private weights, blocking sync.
    pub fn on_device(device: usize, precision: EncoderPrecision, graph_max_batch: usize) -> Self {
        Self {
            device,
            graph_max_batch,
            graph_max_s: Self::DEFAULT_GRAPH_MAX_S,
            features: FeatureLocation::Device,
            precision,
            subsampling_scratch_bytes: Self::DEFAULT_SUBSAMPLING_SCRATCH_MIB << 20,
            weights_share_dir: None,
            blocking_sync: true,
        }
    }
}

pub struct CudaBackend {
    model: GpuParakeet,
    path: String,
    probe: DeviceProbe,
    /// Device memory taken by an injected [`Fault::OutOfMemory`], held until the process ends.
    held: Vec<CudaSlice<u8>>,
}

impl CudaBackend {
    pub fn load(
        path: &Path,
        settings: CudaSettings,
        long_audio: LongAudio,
    ) -> Result<Self, EngineError> {
        let mut model = GpuParakeet::load_with(path, settings.device, settings.precision)
            .map_err(EngineError::Cuda)?;
        model.set_long_audio(long_audio);
        if settings.blocking_sync {
            model
                .engine()
                .set_blocking_sync()
                .map_err(EngineError::Cuda)?;
        }
        model.set_feature_location(settings.features);
        model.set_subsampling_scratch_limit_bytes(settings.subsampling_scratch_bytes);
        let probe = model.engine().probe().map_err(EngineError::Cuda)?;
        tracing::info!(device = %probe.summary(), "CUDA engine loaded");
        if let Some(dir) = &settings.weights_share_dir {
            share_weights(&mut model, path, dir, settings.precision)?;
        }
        model
            .warm_up(settings.graph_max_batch, settings.graph_max_s)
            .map_err(EngineError::Cuda)?;
        Ok(Self {
            model,
            path: path.display().to_string(),
            probe,
            held: Vec::new(),
        })
    }
}

/// Puts the encoder weights in the GPU's shared arena (before warm-up, so every pass and graph
/// uses them). A sibling's arena that differs from this worker's own copy is refused: the worker
/// then runs on its private weights and says so.
fn share_weights(
    model: &mut GpuParakeet,
    path: &Path,
    dir: &Path,
    precision: EncoderPrecision,
) -> Result<(), EngineError> {
    let share = WeightShare::for_model(dir, path, precision.name(), model.engine())
        .map_err(EngineError::Cuda)?;
    match model.share_weights(&share).map_err(EngineError::Cuda)? {
        WeightSharing::Created { bytes } => {
            tracing::info!(
                bytes,
                key = share.key(),
                "published this GPU's shared encoder weights"
            )
        }
        WeightSharing::Imported { bytes } => {
            tracing::info!(
                bytes,
                key = share.key(),
                "mapped this GPU's shared encoder weights"
            )
        }
        WeightSharing::Private { reason } => tracing::warn!(
            %reason,
            key = share.key(),
            "the shared encoder weights differ from this worker's: keeping a private copy"
        ),
    }
    Ok(())
}

/// The handshake's view of a probe.
pub fn device_report(probe: &DeviceProbe) -> DeviceReport {
    DeviceReport {
        ordinal: probe.ordinal,
        name: probe.name.clone(),
        sm_count: probe.context_sm_count,
        compute_capability: (
            probe.compute_capability.0 as u32,
            probe.compute_capability.1 as u32,
        ),
        memory_bytes: probe.total_memory_bytes,
        mps: probe.mps_enabled.then(|| MpsReport {
            // Without an explicit percentage an MPS client may use every SM.
            active_thread_percentage: probe.mps_thread_percentage.unwrap_or(100),
        }),
    }
}

impl Engine for CudaBackend {
    fn name(&self) -> &'static str {
        EngineKind::Cuda.name()
    }

    fn model_info(&self) -> ModelInfo {
        model_info::parakeet(&self.path, self.model.vocabulary(), self.model.config())
    }

    fn device(&self) -> Option<DeviceReport> {
        Some(device_report(&self.probe))
    }

    fn transcribe(&mut self, batch: &[&[f32]]) -> Result<Vec<Hypothesis>, EngineError> {
        let hyps = self
            .model
            .transcribe_batch(batch)
            .map_err(EngineError::Cuda)?;
        one_per_clip(batch, hyps)
    }

    fn hop_samples(&self) -> usize {
        self.model.config().features.hop_length_samples
    }

    fn inject_fault(&mut self, fault: Fault) -> Result<(), EngineError> {
        let engine = self.model.engine();
        match fault {
            Fault::IllegalAddress => engine.inject_illegal_address(),
            Fault::OutOfMemory => engine.hold_free_memory().map(|held| {
                let bytes: usize = held.iter().map(CudaSlice::len).sum();
                tracing::warn!(bytes, "fault injection: holding all free device memory");
                self.held.extend(held);
            }),
        }
        .map_err(EngineError::Cuda)
    }
}
