//! The CPU engines: the models crate's f32 reference Parakeet and Streaming Sortformer.

use std::path::Path;

use model_core::long_audio::LongAudio;
use model_core::speakers::SpeakerSegment;
use model_core::transcript::Hypothesis;
use models::sortformer::SortformerModel;
use models::ParakeetModel;
use worker_protocol::{EngineKind, ModelInfo};

use crate::diarization::DiarizationEngine;
use crate::error::EngineError;
use crate::model_info;
use crate::transcription::{one_per_clip, Engine};

pub struct CpuBackend {
    model: ParakeetModel,
    path: String,
}

/// `load(path)`, its error naming the path, and the path as the handshake reports it.
fn load_from<M>(
    path: &Path,
    load: impl FnOnce(&Path) -> Result<M, models::ModelError>,
) -> Result<(M, String), EngineError> {
    let model = load(path).map_err(|source| EngineError::Load {
        path: path.to_owned(),
        source,
    })?;
    Ok((model, path.display().to_string()))
}

impl CpuBackend {
    pub fn load(path: &Path, long_audio: LongAudio) -> Result<Self, EngineError> {
        let (model, path) = load_from(path, ParakeetModel::load)?;
        Ok(Self {
            model: model.with_long_audio(long_audio),
            path,
        })
    }
}

impl Engine for CpuBackend {
    fn name(&self) -> &'static str {
        EngineKind::Cpu.name()
    }

    fn model_info(&self) -> ModelInfo {
        model_info::parakeet(&self.path, self.model.vocabulary(), self.model.config())
    }

    fn transcribe(&mut self, batch: &[&[f32]]) -> Result<Vec<Hypothesis>, EngineError> {
        let hyps = self
            .model
            .transcribe_batch(batch)
            .map_err(EngineError::Inference)?;
        one_per_clip(batch, hyps)
    }

    fn hop_samples(&self) -> usize {
        self.model.config().features.hop_length_samples
    }
}

/// Streaming Sortformer on the CPU.
pub struct CpuDiarizer {
    model: SortformerModel,
    path: String,
}

impl CpuDiarizer {
    pub fn load(path: &Path) -> Result<Self, EngineError> {
        let (model, path) = load_from(path, SortformerModel::load)?;
        Ok(Self { model, path })
    }
}

impl DiarizationEngine for CpuDiarizer {
    fn name(&self) -> &'static str {
        EngineKind::Cpu.name()
    }

    fn model_info(&self) -> ModelInfo {
        model_info::sortformer(&self.path, self.model.config())
    }

    fn diarize(&mut self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>, EngineError> {
        self.model.diarize(pcm_16k).map_err(EngineError::Inference)
    }

    fn hop_samples(&self) -> usize {
        self.model.config().features.hop_length_samples
    }
}
