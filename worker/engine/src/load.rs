//! Loads the requested engine or fails: there is no fallback between engines.

use std::path::Path;

use cuda_engine::EncoderPrecision;
use model_core::long_audio::LongAudio;
use worker_protocol::EngineKind;

use crate::cpu::{CpuBackend, CpuDiarizer};
use crate::cuda::{CudaBackend, CudaSettings};
use crate::cuda_diarizer::{CudaDiarSettings, CudaDiarizer};
use crate::diarization::DiarizationEngine;
use crate::error::EngineError;
use crate::onnx::{OnnxBackend, OnnxProvider};
use crate::transcription::Engine;

/// Per-engine choices, the device among them (each engine reads its own).
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub onnx: OnnxSettings,
    pub cuda: CudaSettings,
    pub cuda_diarizer: CudaDiarSettings,
    /// Where a long utterance leaves full attention (every transcription engine alike).
    pub long_audio: LongAudio,
}

impl EngineSettings {
    /// Settings for GPU `device`: the ONNX CUDA provider there, the CUDA engines in bf16
    /// (transcription, graphs for batches up to `graph_max_batch`) and f32 (diarization).
    pub fn gpu(device: usize, precision: EncoderPrecision, graph_max_batch: usize) -> Self {
        Self {
            onnx: OnnxSettings {
                provider: OnnxProvider::Cuda,
                device_id: device as i32,
            },
            cuda: CudaSettings::on_device(device, precision, graph_max_batch),
            cuda_diarizer: CudaDiarSettings {
                device,
                precision: EncoderPrecision::F32,
            },
            long_audio: LongAudio::default(),
        }
    }

    /// Settings for the CPU engines (ONNX on its CPU provider); a `cuda` kind given these runs
    /// on GPU 0.
    pub fn cpu() -> Self {
        Self {
            onnx: OnnxSettings {
                provider: OnnxProvider::Cpu,
                device_id: 0,
            },
            ..Self::gpu(0, EncoderPrecision::Bf16, 1)
        }
    }
}

/// ONNX Runtime choices (ignored by the other engines).
#[derive(Debug, Clone, Copy)]
pub struct OnnxSettings {
    pub provider: OnnxProvider,
    pub device_id: i32,
}

/// The transcription engine of `kind` for the model at `model`.
pub fn load(
    kind: EngineKind,
    model: &Path,
    settings: &EngineSettings,
) -> Result<Box<dyn Engine>, EngineError> {
    Ok(match kind {
        EngineKind::Cpu => Box::new(CpuBackend::load(model, settings.long_audio)?),
        EngineKind::Onnx => Box::new(OnnxBackend::load(
            model,
            settings.onnx.provider,
            settings.onnx.device_id,
            settings.long_audio,
        )?),
        EngineKind::Cuda => Box::new(CudaBackend::load(
            model,
            settings.cuda.clone(),
            settings.long_audio,
        )?),
    })
}

/// The diarization engine of `kind` for the Sortformer model at `model`.
pub fn load_diarizer(
    kind: EngineKind,
    model: &Path,
    settings: &EngineSettings,
) -> Result<Box<dyn DiarizationEngine>, EngineError> {
    match kind {
        EngineKind::Cpu => Ok(Box::new(CpuDiarizer::load(model)?)),
        EngineKind::Cuda => Ok(Box::new(CudaDiarizer::load(model, settings.cuda_diarizer)?)),
        EngineKind::Onnx => Err(EngineError::Unavailable {
            engine: kind.name().into(),
            reason: "diarization runs on the cpu or cuda engine only".into(),
        }),
    }
}
