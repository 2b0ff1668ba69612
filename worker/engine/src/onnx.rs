//! The ONNX Runtime engine (models::onnx) behind the [`Engine`] trait. Its execution
//! provider is chosen at startup; a GPU provider that cannot be registered fails the start
//! (the models crate never falls back to the CPU provider).

use std::path::Path;

use clap::ValueEnum;
use model_core::long_audio::LongAudio;
use model_core::transcript::Hypothesis;
use models::onnx::{ExecutionProvider, OnnxModel, OnnxOptions};
use worker_protocol::{EngineKind, ModelInfo};

use crate::error::EngineError;
use crate::transcription::{one_per_clip, Engine};

/// Parakeet's feature hop (10 ms at 16 kHz), assumed when the export computes its own features.
const DEFAULT_HOP_SAMPLES: usize = 160;
const DEFAULT_SAMPLE_RATE_HZ: u32 = 16_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnnxProvider {
    Cpu,
    Cuda,
    Tensorrt,
}

impl OnnxProvider {
    fn execution_provider(self, device_id: i32) -> ExecutionProvider {
        match self {
            Self::Cpu => ExecutionProvider::Cpu,
            Self::Cuda => ExecutionProvider::Cuda { device_id },
            Self::Tensorrt => ExecutionProvider::TensorRt { device_id },
        }
    }
}

pub struct OnnxBackend {
    model: OnnxModel,
    path: String,
    long_audio: LongAudio,
}

impl OnnxBackend {
    /// `dir`: an ONNX export directory (NeMo/onnx-asr or sherpa layout).
    pub fn load(
        dir: &Path,
        provider: OnnxProvider,
        device_id: i32,
        long_audio: LongAudio,
    ) -> Result<Self, EngineError> {
        let options = OnnxOptions {
            execution_provider: provider.execution_provider(device_id),
            ..OnnxOptions::default()
        };
        let model = OnnxModel::load(dir, &options).map_err(|source| EngineError::Load {
            path: dir.to_owned(),
            source,
        })?;
        Ok(Self {
            model,
            path: dir.display().to_string(),
            long_audio,
        })
    }

    fn hop_and_rate(&self) -> (usize, u32) {
        self.model
            .feature_config()
            .map_or((DEFAULT_HOP_SAMPLES, DEFAULT_SAMPLE_RATE_HZ), |f| {
                (f.hop_length_samples, f.sample_rate_hz)
            })
    }
}

impl Engine for OnnxBackend {
    fn name(&self) -> &'static str {
        EngineKind::Onnx.name()
    }

    fn model_info(&self) -> ModelInfo {
        let (hop, rate) = self.hop_and_rate();
        let window_stride_s = hop as f64 / f64::from(rate);
        let subsampling = (self.model.seconds_per_encoder_frame() / window_stride_s).round();
        ModelInfo {
            path: self.path.clone(),
            vocabulary: self.model.vocabulary().to_vec(),
            window_stride_s,
            subsampling_factor: subsampling as u32,
            sample_rate_hz: rate,
        }
    }

    fn transcribe(&mut self, batch: &[&[f32]]) -> Result<Vec<Hypothesis>, EngineError> {
        let rate = f64::from(self.hop_and_rate().1);
        let limit = self.long_audio.full_attention_max_s;
        if let Some(clip) = batch.iter().find(|c| c.len() as f64 / rate > limit) {
            return Err(EngineError::LocalAttentionUnsupported {
                engine: EngineKind::Onnx.name(),
                seconds: clip.len() as f64 / rate,
                full_attention_max_s: limit,
            });
        }
        let hyps = self
            .model
            .transcribe_batch(batch)
            .map_err(EngineError::Inference)?;
        one_per_clip(batch, hyps)
    }

    fn hop_samples(&self) -> usize {
        self.hop_and_rate().0
    }
}
