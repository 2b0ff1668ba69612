//! Streaming Sortformer with its network on the GPU: the FastConformer through the same
//! [`GpuEncoder`] as transcription (pre-encode and the layers called apart, as streaming needs),
//! then [`head::GpuSpeakerHead`], both stored in bf16 (fast) or f32 (NeMo's fp32 results, for
//! parity), chosen at load with [`EncoderPrecision`]. Chunking, features, the speaker cache and
//! FIFO and the post-processing are the models crate's ([`Sortformer`]), shared with the CPU
//! engine; per chunk the host uploads `[spkcache; fifo; chunk]` embeddings and downloads the
//! chunk's pre-encoded frames and every frame's speaker probabilities (a few hundred KB).

mod head;

use std::path::Path;

use model_core::speakers::SpeakerSegment;
use models::features::Features;
use models::sortformer::{Sortformer, SortformerCheckpoint, SortformerConfig, SpeakerNetwork};

use crate::device::CudaEngine;
use crate::encoder::GpuEncoder;
use crate::error::Result;
use crate::parakeet::EncoderPrecision;
use crate::storage::Storage;
use crate::CudaEngineError;
use half::bf16;
use head::GpuSpeakerHead;

/// The conformer and the head in one storage type.
struct StoredNetwork<S: Storage = bf16> {
    encoder: GpuEncoder<S>,
    head: GpuSpeakerHead<S>,
}

impl<S: Storage> StoredNetwork<S> {
    fn load(
        engine: &CudaEngine,
        ckpt: &SortformerCheckpoint,
        config: &SortformerConfig,
    ) -> Result<Self> {
        Ok(Self {
            encoder: GpuEncoder::load(engine, &ckpt.tensors, &config.encoder)?,
            head: GpuSpeakerHead::load(engine, &ckpt.tensors, config)?,
        })
    }

    fn pre_encode(&self, engine: &CudaEngine, features: &Features) -> Result<(Vec<f32>, usize)> {
        self.encoder.pre_encode(engine, features)
    }

    fn logits(&self, engine: &CudaEngine, pre_encoded: &[f32], frames: usize) -> Result<Vec<f32>> {
        let encoded = self
            .encoder
            .forward_pre_encoded(engine, pre_encoded, frames)?;
        self.head.logits(engine, &encoded)
    }
}

/// The network in the storage type chosen at load time (one concrete type for the streaming
/// driver, so callers need not be generic).
enum Stored {
    Bf16(StoredNetwork<bf16>),
    F32(StoredNetwork<f32>),
}

/// The network of one streaming step on one GPU.
pub struct GpuSpeakerNetwork {
    engine: CudaEngine,
    stored: Stored,
}

impl GpuSpeakerNetwork {
    pub fn precision(&self) -> EncoderPrecision {
        match self.stored {
            Stored::Bf16(_) => EncoderPrecision::Bf16,
            Stored::F32(_) => EncoderPrecision::F32,
        }
    }
}

impl SpeakerNetwork for GpuSpeakerNetwork {
    type Error = CudaEngineError;

    fn pre_encode(&self, features: &Features) -> Result<(Vec<f32>, usize)> {
        match &self.stored {
            Stored::Bf16(n) => n.pre_encode(&self.engine, features),
            Stored::F32(n) => n.pre_encode(&self.engine, features),
        }
    }

    fn speaker_probabilities(&self, pre_encoded: Vec<f32>, frames: usize) -> Result<Vec<f32>> {
        let mut probs = match &self.stored {
            Stored::Bf16(n) => n.logits(&self.engine, &pre_encoded, frames),
            Stored::F32(n) => n.logits(&self.engine, &pre_encoded, frames),
        }?;
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
    /// Loads a Sortformer `.nemo` onto GPU `ordinal` in bf16 (weights converted once).
    pub fn load(path: &Path, ordinal: usize) -> Result<Self> {
        Self::load_with(path, ordinal, EncoderPrecision::default())
    }

    /// Loads a Sortformer `.nemo` onto GPU `ordinal` with the whole network (conformer and
    /// head) stored in `precision`.
    pub fn load_with(path: &Path, ordinal: usize, precision: EncoderPrecision) -> Result<Self> {
        let engine = CudaEngine::new(ordinal)?;
        Self::from_checkpoint(engine, &SortformerCheckpoint::load(path)?, precision)
    }

    pub fn from_checkpoint(
        engine: CudaEngine,
        ckpt: &SortformerCheckpoint,
        precision: EncoderPrecision,
    ) -> Result<Self> {
        let model = Sortformer::with_network(ckpt, |config| {
            let stored = match precision {
                EncoderPrecision::Bf16 => Stored::Bf16(StoredNetwork::load(&engine, ckpt, config)?),
                EncoderPrecision::F32 => Stored::F32(StoredNetwork::load(&engine, ckpt, config)?),
            };
            Ok(GpuSpeakerNetwork { engine, stored })
        })?;
        Ok(Self { model })
    }

    pub fn engine(&self) -> &CudaEngine {
        &self.model.network().engine
    }

    /// The storage type of the network's weights and activations.
    pub fn precision(&self) -> EncoderPrecision {
        self.model.network().precision()
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
