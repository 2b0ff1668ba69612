//! [`ParakeetModel`]: the whole CPU reference pipeline (features → encoder → TDT greedy
//! decoding), weights converted once from a [`Checkpoint`].

use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::encoder::Encoder;
use crate::error::ModelError;
use crate::features::{FeatureExtractor, Features};
use crate::prediction::{CpuTransducer, Joint, PredictionNet};
use model_core::config::ParakeetConfig;
use model_core::long_audio::LongAudio;
use model_core::tdt::{greedy_decode, EncodedUtterance};
use model_core::transcript::Hypothesis;

/// Parakeet TDT on the CPU in f32. Immutable after loading, so one instance can serve many
/// threads (`Send + Sync`).
#[derive(Debug)]
pub struct ParakeetModel {
    config: ParakeetConfig,
    vocabulary: Vec<String>,
    features: FeatureExtractor,
    encoder: Encoder,
    prediction: PredictionNet,
    joint: Joint,
    long_audio: LongAudio,
}

impl ParakeetModel {
    /// Loads a `.nemo` checkpoint.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        Self::from_checkpoint(&Checkpoint::load(path)?)
    }

    /// Converts the checkpoint's tensors into the forward pass's layout (BatchNorm folded into
    /// the depthwise convolutions, per-head parameters split).
    pub fn from_checkpoint(ckpt: &Checkpoint) -> Result<Self, ModelError> {
        let cfg = &ckpt.config;
        let tensors = &ckpt.tensors;
        Ok(Self {
            config: cfg.clone(),
            vocabulary: ckpt.vocabulary.clone(),
            features: FeatureExtractor::from_checkpoint(ckpt)?,
            encoder: Encoder::load(tensors, &cfg.encoder)?,
            prediction: PredictionNet::load(tensors, &cfg.decoder)?,
            joint: Joint::load(tensors, &cfg.encoder, &cfg.decoder)?,
            long_audio: LongAudio::default(),
        })
    }

    /// Where long utterances leave full attention (NeMo's 24 minutes by default).
    pub fn with_long_audio(mut self, long_audio: LongAudio) -> Self {
        self.long_audio = long_audio;
        self
    }

    pub fn config(&self) -> &ParakeetConfig {
        &self.config
    }

    /// SentencePiece pieces by id (blank excluded).
    pub fn vocabulary(&self) -> &[String] {
        &self.vocabulary
    }

    pub fn features(&self, pcm_16k: &[f32]) -> Features {
        self.features.compute(pcm_16k)
    }

    /// Encoder output `[T_enc, d_model]` of one utterance: full attention, or local attention
    /// for an utterance longer than the [`LongAudio`] limit.
    pub fn encode(&self, features: &Features) -> Result<EncodedUtterance, ModelError> {
        self.encoder.forward(features, |frames| {
            self.long_audio.attention(&self.config, frames)
        })
    }

    /// Batched greedy TDT decoding; each utterance keeps its own length.
    pub fn decode(&self, encoded: &[EncodedUtterance]) -> Result<Vec<Hypothesis>, ModelError> {
        let mut net = CpuTransducer::new(&self.prediction, &self.joint);
        greedy_decode(&mut net, &self.config.decoder, encoded)
    }

    /// Features and encoder per clip, then one batched decode.
    pub fn transcribe_batch(&self, pcm: &[&[f32]]) -> Result<Vec<Hypothesis>, ModelError> {
        let encoded = pcm
            .iter()
            .map(|clip| self.encode(&self.features(clip)))
            .collect::<Result<Vec<_>, _>>()?;
        self.decode(&encoded)
    }
}

#[cfg(test)]
mod tests {
    use super::ParakeetModel;

    #[test]
    fn model_can_be_shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ParakeetModel>();
    }
}
