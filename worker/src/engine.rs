//! Engines behind one synchronous trait; each runs on its own OS thread
//! ([`crate::engine_thread`]). The CPU engine is the models crate's f32 reference model; the
//! ONNX engine is in [`crate::onnx_engine`], the native CUDA engine in [`crate::cuda_engine`].

use std::path::Path;

use clap::ValueEnum;
use model_core::config::ParakeetConfig;
use model_core::transcript::Hypothesis;
use models::ParakeetModel;
use worker_protocol::{DeviceReport, ModelInfo};

use crate::cuda_engine::{CudaEngine, CudaSettings};
use crate::error::WorkerError;
use crate::onnx_engine::{OnnxEngine, OnnxProvider};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineKind {
    /// The models crate's CPU f32 reference model (`.nemo`).
    Cpu,
    /// ONNX Runtime on an export directory (`--onnx-provider` picks CPU/CUDA/TensorRT).
    Onnx,
    /// The native CUDA engine (bf16 encoder, GPU decoder in CUDA graphs). Without a usable GPU
    /// the worker fails to start: it is never replaced by the CPU.
    Cuda,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Onnx => "onnx",
            Self::Cuda => "cuda",
        }
    }
}

pub trait Engine: Send {
    fn name(&self) -> &'static str;
    fn model_info(&self) -> ModelInfo;
    /// The GPU this engine runs on (`None`: no GPU).
    fn device(&self) -> Option<DeviceReport> {
        None
    }
    /// One hypothesis per clip, in order. Must equal each clip's hypothesis alone.
    fn transcribe(&mut self, batch: &[&[f32]]) -> Result<Vec<Hypothesis>, WorkerError>;
    /// Samples per feature frame (the batching cost unit).
    fn hop_samples(&self) -> usize;
}

/// Loads the requested engine or fails: there is no fallback between engines.
pub fn load(
    kind: EngineKind,
    model: &Path,
    settings: EngineSettings,
) -> Result<Box<dyn Engine>, WorkerError> {
    let onnx = settings.onnx;
    match kind {
        EngineKind::Cpu => Ok(Box::new(CpuEngine::load(model)?)),
        EngineKind::Onnx => Ok(Box::new(OnnxEngine::load(
            model,
            onnx.provider,
            onnx.device_id,
        )?)),
        EngineKind::Cuda => Ok(Box::new(CudaEngine::load(model, settings.cuda)?)),
    }
}

/// An engine's answer for a batch: exactly one hypothesis per clip, or a contract error.
pub(crate) fn one_per_clip(
    batch: &[&[f32]],
    hyps: Vec<Hypothesis>,
) -> Result<Vec<Hypothesis>, WorkerError> {
    if hyps.len() != batch.len() {
        return Err(WorkerError::EngineContract {
            expected: batch.len(),
            got: hyps.len(),
        });
    }
    Ok(hyps)
}

/// Per-engine choices (each engine reads its own).
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub onnx: OnnxSettings,
    pub cuda: CudaSettings,
}

/// The handshake's model description for a checkpoint's config.
pub(crate) fn model_info(path: &str, vocabulary: &[String], cfg: &ParakeetConfig) -> ModelInfo {
    ModelInfo {
        path: path.to_owned(),
        vocabulary: vocabulary.to_vec(),
        window_stride_s: cfg.features.hop_length_samples as f64
            / f64::from(cfg.features.sample_rate_hz),
        subsampling_factor: cfg.encoder.subsampling_factor as u32,
        sample_rate_hz: cfg.features.sample_rate_hz,
    }
}

/// ONNX Runtime choices (ignored by the other engines).
#[derive(Debug, Clone, Copy)]
pub struct OnnxSettings {
    pub provider: OnnxProvider,
    pub device_id: i32,
}

pub struct CpuEngine {
    model: ParakeetModel,
    path: String,
}

impl CpuEngine {
    pub fn load(path: &Path) -> Result<Self, WorkerError> {
        let model = ParakeetModel::load(path).map_err(|source| WorkerError::Load {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            model,
            path: path.display().to_string(),
        })
    }
}

impl Engine for CpuEngine {
    fn name(&self) -> &'static str {
        EngineKind::Cpu.name()
    }

    fn model_info(&self) -> ModelInfo {
        model_info(&self.path, self.model.vocabulary(), self.model.config())
    }

    fn transcribe(&mut self, batch: &[&[f32]]) -> Result<Vec<Hypothesis>, WorkerError> {
        let hyps = self
            .model
            .transcribe_batch(batch)
            .map_err(WorkerError::Inference)?;
        one_per_clip(batch, hyps)
    }

    fn hop_samples(&self) -> usize {
        self.model.config().features.hop_length_samples
    }
}
