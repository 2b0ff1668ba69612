//! Streaming Sortformer on the GPU (`cuda-engine`'s [`GpuSortformer`]) behind the
//! [`DiarizationEngine`] trait. Warmed up (one full-size streaming step) before the worker
//! reports ready; a sticky CUDA fault exits the worker with status 70 like the transcription
//! engine (`EngineError::Cuda` is fatal when sticky). Stored in f32 (`--cuda-diar-precision`,
//! the default: the CPU engine's results) or bf16 (faster, a few frame decisions differ).

use std::path::Path;

use cuda_engine::{DeviceProbe, EncoderPrecision, GpuSortformer};
use model_core::speakers::SpeakerSegment;
use worker_protocol::{DeviceReport, EngineKind, ModelInfo};

use crate::cuda::device_report;
use crate::diarization::DiarizationEngine;
use crate::error::EngineError;
use crate::model_info;

/// `worker serve --task diarize --engine cuda` options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaDiarSettings {
    /// GPU ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub device: usize,
    /// Storage of the whole network (conformer and head).
    pub precision: EncoderPrecision,
}

pub struct CudaDiarizer {
    model: GpuSortformer,
    path: String,
    probe: DeviceProbe,
}

impl CudaDiarizer {
    pub fn load(path: &Path, settings: CudaDiarSettings) -> Result<Self, EngineError> {
        let model = GpuSortformer::load_with(path, settings.device, settings.precision)
            .map_err(EngineError::Cuda)?;
        let probe = model.engine().probe().map_err(EngineError::Cuda)?;
        tracing::info!(
            device = %probe.summary(),
            precision = ?model.precision(),
            "CUDA diarization engine loaded"
        );
        model.warm_up().map_err(EngineError::Cuda)?;
        Ok(Self {
            model,
            path: path.display().to_string(),
            probe,
        })
    }
}

impl DiarizationEngine for CudaDiarizer {
    fn name(&self) -> &'static str {
        EngineKind::Cuda.name()
    }

    fn model_info(&self) -> ModelInfo {
        model_info::sortformer(&self.path, self.model.model().config())
    }

    fn device(&self) -> Option<DeviceReport> {
        Some(device_report(&self.probe))
    }

    fn diarize(&mut self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>, EngineError> {
        self.model.diarize(pcm_16k).map_err(EngineError::Cuda)
    }

    fn hop_samples(&self) -> usize {
        self.model.model().config().features.hop_length_samples
    }
}
