//! Streaming Sortformer with its network on the GPU: the FastConformer through the same
//! [`GpuEncoder`] as transcription (pre-encode and the layers called apart, as streaming needs),
//! then [`head::GpuSpeakerHead`]. Chunking, features, the speaker cache and FIFO and the
//! post-processing are the models crate's ([`Sortformer`]), shared with the CPU engine; per
//! chunk the host uploads `[spkcache; fifo; chunk]` embeddings and downloads the chunk's
//! pre-encoded frames and every frame's speaker probabilities (a few hundred KB).

mod head;

use std::path::Path;

use models::features::Features;
use models::sortformer::{Sortformer, SortformerCheckpoint, SpeakerNetwork};
use models::speakers::SpeakerSegment;

use crate::device::CudaEngine;
use crate::encoder::GpuEncoder;
use crate::error::Result;
use crate::CudaEngineError;
use head::GpuSpeakerHead;

/// The network of one streaming step on one GPU.
pub struct GpuSpeakerNetwork {
    engine: CudaEngine,
    encoder: GpuEncoder,
    head: GpuSpeakerHead,
}

impl SpeakerNetwork for GpuSpeakerNetwork {
    type Error = CudaEngineError;

    fn pre_encode(&self, features: &Features) -> Result<(Vec<f32>, usize)> {
        self.encoder.pre_encode(&self.engine, features)
    }

    fn speaker_probabilities(&self, pre_encoded: Vec<f32>, frames: usize) -> Result<Vec<f32>> {
        let encoded = self
            .encoder
            .forward_pre_encoded(&self.engine, &pre_encoded, frames)?;
        let mut probs = self.head.logits(&self.engine, &encoded)?;
        probs
            .iter_mut()
            .for_each(|v| *v = 1.0 / (1.0 + (-*v).exp()));
        Ok(probs)
    }
}

/// Streaming Sortformer on one GPU.
pub struct GpuSortformer {
    model: Sortformer<GpuSpeakerNetwork>,
}

impl GpuSortformer {
    /// Loads a Sortformer `.nemo` onto GPU `ordinal` (weights converted once).
    pub fn load(path: &Path, ordinal: usize) -> Result<Self> {
        let engine = CudaEngine::new(ordinal)?;
        Self::from_checkpoint(engine, &SortformerCheckpoint::load(path)?)
    }

    pub fn from_checkpoint(engine: CudaEngine, ckpt: &SortformerCheckpoint) -> Result<Self> {
        let model = Sortformer::with_network(ckpt, |config| {
            Ok(GpuSpeakerNetwork {
                encoder: GpuEncoder::load(&engine, &ckpt.tensors, &config.encoder)?,
                head: GpuSpeakerHead::load(&engine, &ckpt.tensors, config)?,
                engine,
            })
        })?;
        Ok(Self { model })
    }

    pub fn engine(&self) -> &CudaEngine {
        &self.model.network().engine
    }

    /// The streaming driver (settings, probabilities with per-chunk callbacks, segments).
    pub fn model(&self) -> &Sortformer<GpuSpeakerNetwork> {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut Sortformer<GpuSpeakerNetwork> {
        &mut self.model
    }

    /// Runs one full-size step (a whole chunk with its context after full cache and FIFO) so
    /// the kernels are loaded, cuBLASLt's choices cached and the steady-state buffers sized
    /// before the first recording. Call once, before serving.
    pub fn warm_up(&self) -> Result<()> {
        let cfg = self.model.config();
        let s = &cfg.streaming;
        let factor = cfg.encoder.subsampling_factor;
        let chunk_frames =
            (s.chunk_len_frames + s.chunk_left_context_frames + s.chunk_right_context_frames)
                * factor;
        let features = Features {
            n_mels: cfg.encoder.feat_in,
            n_frames: chunk_frames,
            data: vec![0.0; cfg.encoder.feat_in * chunk_frames],
        };
        let network = self.model.network();
        let (chunk, n_pre) = network.pre_encode(&features)?;
        let context = s.spkcache_len_frames + s.fifo_len_frames;
        let mut x = vec![0.0; context * cfg.encoder.d_model];
        x.extend_from_slice(&chunk);
        network.speaker_probabilities(x, context + n_pre)?;
        Ok(())
    }

    /// Speaker turns of a whole 16 kHz mono recording (streamed chunk by chunk).
    pub fn diarize(&self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>> {
        self.model.diarize(pcm_16k)
    }
}
