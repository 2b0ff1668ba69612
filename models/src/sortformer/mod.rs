//! Streaming Sortformer speaker diarization (NVIDIA Streaming Sortformer 4spk v2 and any model of
//! its family, every size read from the checkpoint config). [`Sortformer`] is the streaming
//! driver; its neural network is a [`SpeakerNetwork`]: the CPU f32 one here
//! ([`SortformerModel`]), the GPU one in `cuda-engine`.
//!
//! Pipeline per chunk of `chunk_len` 80 ms frames: log-mel features of the chunk plus its
//! left/right context → FastConformer subsampling (pre-encode) → `[spkcache; fifo; chunk]` →
//! conformer layers → `encoder_proj` → post-LN transformer → sigmoid speaker head; the chunk's
//! own rows are its speaker probabilities, and the chunk's pre-encoded frames update the
//! streaming state ([`StreamingState`]). Memory stays bounded by the chunk, FIFO and cache sizes
//! whatever the recording's length: features are computed per chunk, not for the whole file.
//!
//! Inference is always streaming. A checkpoint with `streaming_mode: false` (which NeMo would
//! run offline, over the whole recording at once) is streamed with its config's chunk settings;
//! only NeMo's offline peak normalisation of the waveform is kept for it.

mod config;
mod postprocess;
mod streaming;
mod torch_order;
mod transformer;

use std::path::Path;

pub use config::{SortformerConfig, StreamingParams, TransformerConfig};
pub use postprocess::PostProcessing;
pub use streaming::StreamingState;

use crate::checkpoint::kind::ModelKind;
use crate::checkpoint::TensorMap;
use crate::encoder::Encoder;
use crate::error::ModelError;
use crate::features::{FeatureExtractor, Features};
use model_core::config::FeatureNormalization;
use model_core::speakers::SpeakerSegment;
use transformer::SpeakerHead;

/// A loaded Sortformer `.nemo`: resolved config and named tensors.
#[derive(Debug, Clone)]
pub struct SortformerCheckpoint {
    pub config: SortformerConfig,
    pub tensors: TensorMap,
}

impl SortformerCheckpoint {
    /// Reads the config (fails fast on anything unsupported), then the weights.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let raw = crate::checkpoint::read_raw_nemo(path, ModelKind::Sortformer)?;
        let config = config::parse(&raw.config_yaml, &raw.config_path)?;
        Ok(Self {
            config,
            tensors: raw.tensors,
        })
    }
}

/// One streaming step's input span, in feature frames (10 ms) of the whole recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSpan {
    /// Feature frames `[first, last)` given to the model, context included.
    pub first_frame: usize,
    pub last_frame: usize,
    /// Left / right context in diarization frames (NeMo's `lc` / `rc`).
    pub left_context: usize,
    pub right_context: usize,
}

/// The neural network of one streaming step, apart from the streaming state: the CPU f32
/// reference here ([`CpuSpeakerNetwork`]), a GPU one in `cuda-engine`. Everything else (chunking,
/// features, the speaker cache and FIFO, post-processing) is [`Sortformer`]'s, written once.
pub trait SpeakerNetwork {
    type Error: From<ModelError>;

    /// Subsampling only (NeMo `encoder.pre_encode`): a chunk's `[n_mels, frames]` features
    /// (already checked against the encoder's `feat_in`) to `([frames', d_model], frames')`.
    fn pre_encode(&self, features: &Features) -> Result<(Vec<f32>, usize), Self::Error>;

    /// `[frames, d_model]` pre-encoded embeddings (`[spkcache; fifo; chunk]`) through the
    /// conformer layers, the projection, the transformer and the speaker head:
    /// `[frames, num_speakers]` probabilities.
    fn speaker_probabilities(
        &self,
        pre_encoded: Vec<f32>,
        frames: usize,
    ) -> Result<Vec<f32>, Self::Error>;
}

/// The f32 CPU network.
#[derive(Debug)]
pub struct CpuSpeakerNetwork {
    encoder: Encoder,
    head: SpeakerHead,
}

impl CpuSpeakerNetwork {
    pub fn load(tensors: &TensorMap, config: &SortformerConfig) -> Result<Self, ModelError> {
        Ok(Self {
            encoder: Encoder::load(tensors, &config.encoder)?,
            head: SpeakerHead::load(tensors, config)?,
        })
    }
}

impl SpeakerNetwork for CpuSpeakerNetwork {
    type Error = ModelError;

    fn pre_encode(&self, features: &Features) -> Result<(Vec<f32>, usize), ModelError> {
        Ok(self.encoder.pre_encode_frames(features))
    }

    fn speaker_probabilities(&self, x: Vec<f32>, frames: usize) -> Result<Vec<f32>, ModelError> {
        let encoded = self.encoder.forward_pre_encoded(x, frames);
        Ok(self.head.forward(encoded, frames))
    }
}

/// What a streaming step produced: the chunk's probabilities and the state after the update.
#[derive(Debug)]
pub struct StepOutput<'a> {
    pub index: usize,
    pub span: ChunkSpan,
    /// `[chunk_frames, num_speakers]`.
    pub chunk_probs: &'a [f32],
    pub state: &'a StreamingState,
}

/// Streaming Sortformer on the CPU.
pub type SortformerModel = Sortformer<CpuSpeakerNetwork>;

/// Streaming Sortformer with the network `N`.
#[derive(Debug)]
pub struct Sortformer<N> {
    config: SortformerConfig,
    features: FeatureExtractor,
    network: N,
    post_processing: PostProcessing,
}

impl SortformerModel {
    /// Loads a Sortformer `.nemo` file.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        Self::from_checkpoint(&SortformerCheckpoint::load(path)?)
    }

    pub fn from_checkpoint(ckpt: &SortformerCheckpoint) -> Result<Self, ModelError> {
        Self::with_network(ckpt, |config| {
            CpuSpeakerNetwork::load(&ckpt.tensors, config)
        })
    }
}

impl<N: SpeakerNetwork> Sortformer<N> {
    /// Resolves and checks the checkpoint's config and feature extractor, then builds the
    /// network from the resolved config.
    pub fn with_network(
        ckpt: &SortformerCheckpoint,
        network: impl FnOnce(&SortformerConfig) -> Result<N, N::Error>,
    ) -> Result<Self, N::Error> {
        let mut config = ckpt.config.clone();
        let tensors = &ckpt.tensors;
        if config.features.normalization != FeatureNormalization::None {
            tracing::warn!(
                source = %tensors.source.display(),
                "Sortformer checkpoint with per-feature normalisation; NeMo's streaming path \
                 normalises each chunk separately, which this engine does not reproduce"
            );
        }
        // Bias presence is what the weights say (as for Parakeet).
        if config.encoder.n_layers > 0 {
            config.encoder.use_bias =
                tensors.contains("encoder.layers.0.feed_forward1.linear1.bias");
        }
        check_no_extra_layers(
            tensors,
            "encoder.layers.",
            config.encoder.n_layers,
            "encoder.n_layers",
        )?;
        let f = &config.features;
        let fb = tensors.get_optional(
            "preprocessor.featurizer.fb",
            &[1, f.n_mels, f.n_fft / 2 + 1],
        )?;
        let window =
            tensors.get_optional("preprocessor.featurizer.window", &[f.win_length_samples])?;
        let features = FeatureExtractor::new(f, fb, window)?;
        let network = network(&config)?;
        Ok(Self {
            config,
            features,
            network,
            post_processing: PostProcessing::default(),
        })
    }

    pub fn network(&self) -> &N {
        &self.network
    }

    pub fn config(&self) -> &SortformerConfig {
        &self.config
    }

    pub fn num_speakers(&self) -> usize {
        self.config.num_speakers
    }

    pub fn streaming_params(&self) -> &StreamingParams {
        &self.config.streaming
    }

    /// Replaces the checkpoint's streaming settings (e.g. a latency preset).
    pub fn set_streaming_params(&mut self, params: StreamingParams) -> Result<(), ModelError> {
        params
            .check(self.config.num_speakers)
            .map_err(|(key, problem)| ModelError::InvalidConfig {
                file: "streaming parameters".into(),
                key: key.to_string(),
                problem,
            })?;
        self.config.streaming = params;
        Ok(())
    }

    pub fn post_processing(&self) -> &PostProcessing {
        &self.post_processing
    }

    pub fn set_post_processing(&mut self, params: PostProcessing) {
        self.post_processing = params;
    }

    /// Streaming diarization of a whole 16 kHz mono recording in bounded memory,
    /// post-processed with [`Self::post_processing`]; segments sorted by start, then speaker.
    pub fn diarize(&self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>, N::Error> {
        let probs = self.probabilities(pcm_16k)?;
        Ok(self.segments(&probs))
    }

    /// Like [`Self::diarize`] with other post-processing parameters (e.g. per job).
    pub fn diarize_with(
        &self,
        pcm_16k: &[f32],
        post_processing: &PostProcessing,
    ) -> Result<Vec<SpeakerSegment>, N::Error> {
        let probs = self.probabilities(pcm_16k)?;
        Ok(self.segments_with(&probs, post_processing))
    }

    /// Post-processes `[frames, num_speakers]` probabilities into segments.
    pub fn segments(&self, probs: &[f32]) -> Vec<SpeakerSegment> {
        self.segments_with(probs, &self.post_processing)
    }

    fn segments_with(
        &self,
        probs: &[f32],
        post_processing: &PostProcessing,
    ) -> Vec<SpeakerSegment> {
        let f = &self.config.features;
        post_processing.segments(
            probs,
            self.config.num_speakers,
            f.hop_length_samples as f64 / f.sample_rate_hz as f64,
            self.config.encoder.subsampling_factor,
        )
    }

    /// Streaming speaker probabilities of the whole recording, `[frames, num_speakers]`.
    pub fn probabilities(&self, pcm_16k: &[f32]) -> Result<Vec<f32>, N::Error> {
        self.probabilities_with(pcm_16k, |_| {})
    }

    /// Like [`Self::probabilities`], calling `on_step` after every chunk (tests, progress).
    pub fn probabilities_with(
        &self,
        pcm_16k: &[f32],
        mut on_step: impl FnMut(&StepOutput<'_>),
    ) -> Result<Vec<f32>, N::Error> {
        if let Some(i) = pcm_16k.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Decode(format!(
                "sample {i} of the recording is {} (not a finite number)",
                pcm_16k[i]
            ))
            .into());
        }
        let normalized;
        let pcm = if self.config.streaming_mode {
            pcm_16k
        } else {
            // NeMo's offline path divides by (max + eps) (the signed maximum, not |x|).
            let max = pcm_16k.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let gain = 1.0 / (max + self.config.peak_normalization_eps);
            normalized = pcm_16k.iter().map(|v| v * gain).collect::<Vec<_>>();
            &normalized
        };
        let total_frames = self.valid_feature_frames(pcm.len());
        let mut state = StreamingState::new(self.config.encoder.d_model, self.config.num_speakers);
        let mut probs = Vec::new();
        for (index, span) in self.chunk_spans(total_frames).into_iter().enumerate() {
            let features = self.feature_frames(pcm, span.first_frame, span.last_frame);
            let chunk_probs =
                self.step(&mut state, &features, span.left_context, span.right_context)?;
            on_step(&StepOutput {
                index,
                span,
                chunk_probs: &chunk_probs,
                state: &state,
            });
            probs.extend_from_slice(&chunk_probs);
        }
        Ok(probs)
    }

    /// Feature frames (10 ms) of a recording of `samples` samples.
    pub fn valid_feature_frames(&self, samples: usize) -> usize {
        self.features.valid_frames(samples)
    }

    /// NeMo's `streaming_feat_loader`: chunks of `chunk_len` diarization frames, each with up to
    /// `chunk_left_context` / `chunk_right_context` frames of context that exist.
    pub fn chunk_spans(&self, total_feature_frames: usize) -> Vec<ChunkSpan> {
        let s = &self.config.streaming;
        let factor = self.config.encoder.subsampling_factor;
        let mut spans = Vec::new();
        let (mut start, mut end) = (0, 0);
        while end < total_feature_frames {
            let left = (s.chunk_left_context_frames * factor).min(start);
            end = (start + s.chunk_len_frames * factor).min(total_feature_frames);
            let right = (s.chunk_right_context_frames * factor).min(total_feature_frames - end);
            spans.push(ChunkSpan {
                first_frame: start - left,
                last_frame: end + right,
                left_context: left / factor,
                right_context: right.div_ceil(factor),
            });
            start = end;
        }
        spans
    }

    /// One streaming step on a chunk's features (context included): returns the chunk's
    /// probabilities `[chunk_frames, num_speakers]` and updates `state`.
    pub fn step(
        &self,
        state: &mut StreamingState,
        chunk_features: &Features,
        left_context: usize,
        right_context: usize,
    ) -> Result<Vec<f32>, N::Error> {
        let e = &self.config.encoder;
        if chunk_features.n_mels != e.feat_in
            || chunk_features.data.len() != chunk_features.n_mels * chunk_features.n_frames
        {
            return Err(ModelError::Decode(format!(
                "chunk features of {} mels x {} frames do not fit an encoder with {} inputs",
                chunk_features.n_mels, chunk_features.n_frames, e.feat_in
            ))
            .into());
        }
        if state.dim != e.d_model
            || state.num_speakers != self.config.num_speakers
            || !state.is_consistent()
        {
            return Err(ModelError::Decode(format!(
                "streaming state of width {} for {} speakers (consistent: {}) does not fit this \
                 model ({}, {})",
                state.dim,
                state.num_speakers,
                state.is_consistent(),
                e.d_model,
                self.config.num_speakers
            ))
            .into());
        }
        let (chunk, n_pre) = self.network.pre_encode(chunk_features)?;
        if chunk.len() != n_pre * e.d_model {
            return Err(ModelError::Decode(format!(
                "the network pre-encoded {} values for {n_pre} frames of width {}",
                chunk.len(),
                e.d_model
            ))
            .into());
        }
        if left_context + right_context > n_pre {
            return Err(ModelError::Decode(format!(
                "{left_context} + {right_context} context frames exceed the chunk's {n_pre}"
            ))
            .into());
        }
        let mut x = state.context();
        x.extend_from_slice(&chunk);
        let t = state.spkcache_frames() + state.fifo_frames() + n_pre;
        let preds = self.network.speaker_probabilities(x, t)?;
        if preds.len() != t * self.config.num_speakers {
            return Err(ModelError::Decode(format!(
                "the network gave {} probabilities for {t} frames of {} speakers",
                preds.len(),
                self.config.num_speakers
            ))
            .into());
        }
        Ok(state.update(
            &self.config.streaming,
            &chunk,
            &preds,
            left_context,
            right_context,
        ))
    }

    /// Log-mel features of frames `[first, last)` of the whole recording, computed from the
    /// samples around them only. Every feature frame depends on at most `n_fft / 2` samples on
    /// each side (and preemphasis on one more), so a margin of whole frames beyond that makes
    /// the slice's inner frames equal to the whole recording's.
    pub fn feature_frames(&self, pcm: &[f32], first: usize, last: usize) -> Features {
        let f = &self.config.features;
        if last <= first {
            return Features {
                n_mels: f.n_mels,
                n_frames: 0,
                data: Vec::new(),
            };
        }
        let hop = f.hop_length_samples;
        let margin = f.n_fft.div_ceil(2 * hop) + 1;
        let start_frame = first.saturating_sub(margin);
        let a = start_frame.saturating_mul(hop).min(pcm.len());
        let b = last
            .saturating_add(margin)
            .saturating_mul(hop)
            .min(pcm.len());
        let slice = self.features.compute(&pcm[a..b]);
        let offset = first - start_frame;
        let n = last
            .saturating_sub(first)
            .min(slice.n_frames.saturating_sub(offset));
        let mut data = Vec::with_capacity(slice.n_mels * n);
        if n > 0 {
            for row in slice.data.chunks_exact(slice.n_frames) {
                data.extend_from_slice(&row[offset..offset + n]);
            }
        }
        Features {
            n_mels: slice.n_mels,
            n_frames: n,
            data,
        }
    }
}

fn check_no_extra_layers(
    tensors: &TensorMap,
    prefix: &str,
    n_layers: usize,
    key: &str,
) -> Result<(), ModelError> {
    let beyond = tensors.names().find_map(|name| {
        let index = name.strip_prefix(prefix)?.split('.').next()?;
        index.parse::<usize>().ok().filter(|&i| i >= n_layers)
    });
    match beyond {
        Some(i) => Err(ModelError::InvalidConfig {
            file: tensors.source.clone(),
            key: key.to_string(),
            problem: format!(
                "the state dict has {prefix}{i} but the config says {n_layers} layers"
            ),
        }),
        None => Ok(()),
    }
}
