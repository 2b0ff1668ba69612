//! Diarization engines: a whole recording in, speaker turns out. Streaming Sortformer keeps
//! per-recording state (speaker cache, FIFO), so an engine works on one recording at a time
//! on the engine thread; the batcher of a diarization worker runs batches of one.

use std::path::Path;

use model_core::speakers::SpeakerSegment;
use models::sortformer::{SortformerConfig, SortformerModel};
use worker_protocol::{DeviceReport, ModelInfo};

use crate::cuda_diarizer::{CudaDiarSettings, CudaDiarizer};
use crate::engine::EngineKind;
use crate::error::WorkerError;

pub trait DiarizationEngine: Send {
    fn name(&self) -> &'static str;
    fn model_info(&self) -> ModelInfo;
    /// The GPU this engine runs on (`None`: no GPU).
    fn device(&self) -> Option<DeviceReport> {
        None
    }
    /// Speaker turns of one whole 16 kHz mono recording, in seconds from its start.
    fn diarize(&mut self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>, WorkerError>;
    /// Samples per feature frame (the queue's cost unit).
    fn hop_samples(&self) -> usize;
}

/// Loads the requested diarization engine or fails (no fallback between engines).
pub fn load(
    kind: EngineKind,
    model: &Path,
    cuda: CudaDiarSettings,
) -> Result<Box<dyn DiarizationEngine>, WorkerError> {
    match kind {
        EngineKind::Cpu => Ok(Box::new(CpuDiarizer::load(model)?)),
        EngineKind::Cuda => Ok(Box::new(CudaDiarizer::load(model, cuda)?)),
        EngineKind::Onnx => Err(WorkerError::EngineUnavailable {
            engine: "onnx".into(),
            reason: "diarization runs on the cpu or cuda engine only".into(),
        }),
    }
}

/// The handshake's model description of a Sortformer checkpoint (no vocabulary).
pub(crate) fn model_info(path: &str, cfg: &SortformerConfig) -> ModelInfo {
    ModelInfo {
        path: path.to_owned(),
        vocabulary: Vec::new(),
        window_stride_s: cfg.features.hop_length_samples as f64
            / f64::from(cfg.features.sample_rate_hz),
        subsampling_factor: cfg.encoder.subsampling_factor as u32,
        sample_rate_hz: cfg.features.sample_rate_hz,
    }
}

/// Streaming Sortformer on the CPU (the models crate's f32 reference).
pub struct CpuDiarizer {
    model: SortformerModel,
    path: String,
}

impl CpuDiarizer {
    pub fn load(path: &Path) -> Result<Self, WorkerError> {
        let model = SortformerModel::load(path).map_err(|source| WorkerError::Load {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            model,
            path: path.display().to_string(),
        })
    }
}

impl DiarizationEngine for CpuDiarizer {
    fn name(&self) -> &'static str {
        EngineKind::Cpu.name()
    }

    fn model_info(&self) -> ModelInfo {
        model_info(&self.path, self.model.config())
    }

    fn diarize(&mut self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>, WorkerError> {
        self.model.diarize(pcm_16k).map_err(WorkerError::Inference)
    }

    fn hop_samples(&self) -> usize {
        self.model.config().features.hop_length_samples
    }
}
