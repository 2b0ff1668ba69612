//! [`GpuParakeet`]: the whole transcription model on one GPU: the encoder (bf16 storage, or f32
//! for exact parity) and the label-looping decoder on the device, log-mel features on the host
//! or (opt-in) the device.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use model_core::config::ParakeetConfig;
use model_core::long_audio::LongAudio;
use model_core::tdt::EncodedUtterance;
use model_core::transcript::Hypothesis;
use models::checkpoint::Checkpoint;
use models::FeatureExtractor;

use crate::decoder::{DecoderEnvelope, GpuDecoder};
use crate::device::CudaEngine;
use crate::encoder::{EncoderInput, GpuEncoder};
use crate::error::Result;
use crate::features::GpuFeatures;
use crate::storage::StorageKind;
use crate::weight_arena::Adoption;
use crate::weight_share::{ShareServer, WeightShare};
use half::bf16;

/// Where log-mel features are computed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FeatureLocation {
    /// `models::FeatureExtractor` on the host (the reference), uploaded per batch.
    Host,
    /// [`GpuFeatures`]: the host only uploads PCM (`tests/features_parity.rs` holds it to the
    /// host path's results).
    #[default]
    Device,
}

/// The storage type of the encoder and of the decoder's products.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EncoderPrecision {
    /// bf16 weights and activations, fp32 accumulation and residual stream (the fast path);
    /// the decoder's products also take bf16 inputs on the tensor cores (f32 accumulation and
    /// cell state).
    #[default]
    Bf16,
    /// f32 throughout (fp32 matmuls, never TF32): NeMo's fp32 inference up to summation order,
    /// and the exact f32 decoder.
    F32,
}

impl EncoderPrecision {
    /// The storage type's name ("bf16", "f32").
    pub fn name(self) -> &'static str {
        self.storage().name()
    }

    /// The build of the storage-dependent kernels (the decoder's too) this precision runs.
    pub fn storage(self) -> StorageKind {
        match self {
            Self::Bf16 => StorageKind::Bf16,
            Self::F32 => StorageKind::F32,
        }
    }
}

/// Where the encoder's matmul weights live after [`GpuParakeet::share_weights`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightSharing {
    /// No other worker had them: this one made the GPU's arena (and serves it).
    Created { bytes: usize },
    /// Mapped from a sibling's arena after a byte-for-byte comparison with this worker's copy.
    Imported { bytes: usize },
    /// A sibling's arena did not match this worker's weights: they stay private.
    Private { reason: String },
}

/// The encoder in the chosen storage type.
enum Encoder {
    Bf16(GpuEncoder<bf16>),
    F32(GpuEncoder<f32>),
}

/// Calls the same method on whichever encoder is loaded.
macro_rules! with_encoder {
    ($encoder:expr, $e:ident => $call:expr) => {
        match $encoder {
            Encoder::Bf16($e) => $call,
            Encoder::F32($e) => $call,
        }
    };
}

pub struct GpuParakeet {
    engine: CudaEngine,
    config: ParakeetConfig,
    vocabulary: Vec<String>,
    feature_location: FeatureLocation,
    host_features: FeatureExtractor,
    features: GpuFeatures,
    encoder: Encoder,
    decoder: GpuDecoder,
    /// Publishes the shared weight arena to sibling workers while this model lives.
    weight_server: Option<ShareServer>,
}

impl GpuParakeet {
    /// Loads a `.nemo` onto GPU `ordinal` with the bf16 encoder (weights converted once).
    pub fn load(path: &Path, ordinal: usize) -> Result<Self> {
        Self::load_with(path, ordinal, EncoderPrecision::default())
    }

    /// Loads a `.nemo` onto GPU `ordinal` with the encoder in `precision`. The checkpoint is
    /// read on a second thread while the engine starts (NVRTC compiling the kernels): both are
    /// host work of a worker's start. A missing GPU is reported before a bad checkpoint.
    pub fn load_with(path: &Path, ordinal: usize, precision: EncoderPrecision) -> Result<Self> {
        let (engine, ckpt) = std::thread::scope(|scope| {
            let reading = scope.spawn(|| Checkpoint::load(path));
            let engine = CudaEngine::new(ordinal);
            let ckpt = reading
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (engine, ckpt)
        });
        Self::from_checkpoint(engine?, &ckpt?, precision)
    }

    pub fn from_checkpoint(
        engine: CudaEngine,
        ckpt: &Checkpoint,
        precision: EncoderPrecision,
    ) -> Result<Self> {
        let mut encoder = match precision {
            EncoderPrecision::Bf16 => Encoder::Bf16(GpuEncoder::from_checkpoint(&engine, ckpt)?),
            EncoderPrecision::F32 => Encoder::F32(GpuEncoder::from_checkpoint(&engine, ckpt)?),
        };
        let frame_s = ckpt.config.seconds_per_encoder_frame();
        with_encoder!(&mut encoder, e => e.set_long_audio(LongAudio::default(), frame_s));
        // One validated extractor: the host path itself, and the GPU path's config and arrays.
        let host_features = FeatureExtractor::from_checkpoint(ckpt)?;
        Ok(Self {
            feature_location: FeatureLocation::default(),
            features: GpuFeatures::from_extractor(&engine, &host_features)?,
            host_features,
            encoder,
            decoder: GpuDecoder::from_checkpoint(
                &engine,
                ckpt,
                GpuDecoder::storage_for(&ckpt.config.decoder, precision.storage()),
            )?,
            config: ckpt.config.clone(),
            vocabulary: ckpt.vocabulary.clone(),
            engine,
            weight_server: None,
        })
    }

    pub fn engine(&self) -> &CudaEngine {
        &self.engine
    }

    pub fn config(&self) -> &ParakeetConfig {
        &self.config
    }

    pub fn vocabulary(&self) -> &[String] {
        &self.vocabulary
    }

    /// Caps the encoder's subsampling scratch buffers (see
    /// [`GpuEncoder::set_subsampling_scratch_limit_bytes`]); call before `warm_up`.
    pub fn set_subsampling_scratch_limit_bytes(&mut self, bytes: usize) {
        with_encoder!(&mut self.encoder, e => e.set_subsampling_scratch_limit_bytes(bytes));
    }

    /// Moves the encoder's matmul weights (nearly all of the model's memory) into the GPU's
    /// shared arena named by `share`: mapped from a sibling worker's arena if one is published
    /// and holds exactly these bytes, else a new arena that this model then publishes. Call
    /// once, before `warm_up`.
    pub fn share_weights(&mut self, share: &WeightShare) -> Result<WeightSharing> {
        let _lock = share.lock()?;
        let engine = &self.engine;
        let (arena, created) = match share.find(engine)? {
            Some(found) => {
                let found = Arc::new(found);
                let adoption =
                    with_encoder!(&mut self.encoder, e => e.adopt_weight_arena(engine, &found))?;
                if let Adoption::Refused(reason) = adoption {
                    return Ok(WeightSharing::Private { reason });
                }
                (found, false)
            }
            None => (
                with_encoder!(&mut self.encoder, e => e.move_weights_into_arena(engine))?,
                true,
            ),
        };
        let bytes = arena.bytes();
        self.weight_server = Some(share.serve(arena)?);
        // What loading left free in the stream-ordered pool goes back to the device as well
        // (the private weight copies, in allocations of their own, already have).
        self.engine.release_pooled_memory()?;
        Ok(if created {
            WeightSharing::Created { bytes }
        } else {
            WeightSharing::Imported { bytes }
        })
    }

    /// Where long utterances leave full attention (NeMo's 24 minutes by default; see
    /// [`GpuEncoder::set_long_audio`]); call before `warm_up`.
    pub fn set_long_audio(&mut self, long_audio: LongAudio) {
        let frame_s = self.config.seconds_per_encoder_frame();
        with_encoder!(&mut self.encoder, e => e.set_long_audio(long_audio, frame_s));
    }

    /// Allows (default) or forbids the fused attention kernel (see
    /// [`GpuEncoder::set_fused_attention`]); call before `warm_up`.
    pub fn set_fused_attention(&mut self, allowed: bool) {
        with_encoder!(&mut self.encoder, e => e.set_fused_attention(allowed));
    }

    pub fn encoder_precision(&self) -> EncoderPrecision {
        match self.encoder {
            Encoder::Bf16(_) => EncoderPrecision::Bf16,
            Encoder::F32(_) => EncoderPrecision::F32,
        }
    }

    pub fn feature_location(&self) -> FeatureLocation {
        self.feature_location
    }

    /// Chooses where features are computed (before `warm_up`, so its workspace is sized).
    pub fn set_feature_location(&mut self, location: FeatureLocation) {
        self.feature_location = location;
    }

    /// The encoder's input for a batch of clips, with features computed where configured.
    fn encoder_input(&self, pcm: &[&[f32]]) -> Result<EncoderInput> {
        match self.feature_location {
            FeatureLocation::Host => {
                let features: Vec<_> = pcm.iter().map(|c| self.host_features.compute(c)).collect();
                let refs: Vec<_> = features.iter().collect();
                with_encoder!(&self.encoder, e => e.prepare(&self.engine, &refs))
            }
            FeatureLocation::Device => with_encoder!(&self.encoder, e => e
                .prepare_device(&self.engine, &self.features, pcm)),
        }
    }

    /// Hands a device-features buffer back for the next batch (a no-op for host features).
    fn recycle(&self, input: EncoderInput) {
        if self.feature_location == FeatureLocation::Device {
            // The pass that reads the features is queued; the next batch may reuse their buffer.
            self.features.recycle(input.into_feature_buffer());
        }
    }

    /// Sizes the decoder for batches of up to `max_batch` clips of up to `max_seconds` each,
    /// captures its graph, and runs one full-size batch through everything (kernels loaded,
    /// cuBLASLt heuristics cached, feature and encoder workspaces sized). Call once, before serving.
    pub fn warm_up(&self, max_batch: usize, max_seconds: f64) -> Result<()> {
        let rate = self.config.features.sample_rate_hz as f32;
        let samples = (max_seconds * f64::from(rate)).ceil() as usize;
        let clip: Vec<f32> = (0..samples)
            .map(|i| 0.05 * (i as f32 * 440.0 * std::f32::consts::TAU / rate).sin())
            .collect();
        let batch: Vec<&[f32]> = (0..max_batch.max(1)).map(|_| clip.as_slice()).collect();
        let input = self.encoder_input(&batch)?;
        let encoded = with_encoder!(&self.encoder, e => e.run(&self.engine, &input))?;
        self.recycle(input);
        let envelope = DecoderEnvelope {
            max_batch: batch.len(),
            max_frames: encoded.time,
        };
        self.decoder.warm_up(&self.engine, envelope)?;
        self.decoder.decode(&self.engine, &encoded)?;
        Ok(())
    }

    /// One hypothesis per clip (16 kHz mono), each equal to the clip's own result.
    pub fn transcribe_batch(&self, pcm: &[&[f32]]) -> Result<Vec<Hypothesis>> {
        let input = self.encoder_input(pcm)?;
        let encoded = with_encoder!(&self.encoder, e => e.run(&self.engine, &input))?;
        self.recycle(input);
        self.decoder.decode(&self.engine, &encoded)
    }

    /// The encoder output (valid frames) of each clip of a batch, on the host: what the
    /// decoder would see (for tests of batch invariance and parity).
    pub fn encode_batch(&self, pcm: &[&[f32]]) -> Result<Vec<EncodedUtterance>> {
        let input = self.encoder_input(pcm)?;
        let encoded = with_encoder!(&self.encoder, e => e.run(&self.engine, &input))?;
        self.recycle(input);
        with_encoder!(&self.encoder, e => e.download(&self.engine, &encoded))
    }

    /// [`Self::transcribe_batch`] with the stream drained after features and after the
    /// encoder, so each phase's wall time can be read (for benchmarks: the drains cost the
    /// overlap of host work with queued GPU work).
    pub fn transcribe_batch_timed(&self, pcm: &[&[f32]]) -> Result<(Vec<Hypothesis>, PhaseTimes)> {
        let started = Instant::now();
        let input = self.encoder_input(pcm)?;
        self.engine.synchronize()?;
        let features = started.elapsed();
        let encoded = with_encoder!(&self.encoder, e => e.run(&self.engine, &input))?;
        self.engine.synchronize()?;
        let encoder = started.elapsed() - features;
        self.recycle(input);
        let hyps = self.decoder.decode(&self.engine, &encoded)?;
        let decoder = started.elapsed() - features - encoder;
        Ok((
            hyps,
            PhaseTimes {
                features,
                encoder,
                decoder,
            },
        ))
    }
}

/// Wall time of each phase of one batch ([`GpuParakeet::transcribe_batch_timed`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseTimes {
    /// Log-mel features (on the host or the GPU) and their upload.
    pub features: Duration,
    pub encoder: Duration,
    /// Label-looping decoding, results downloaded.
    pub decoder: Duration,
}
