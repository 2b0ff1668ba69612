//! Resolved model configuration: every architectural choice the forward pass needs, read from
//! the checkpoint's own `model_config.yaml` (see `checkpoint::config` for the YAML mapping).
//! Nothing here is hard-coded to Parakeet TDT 0.6B v2; NeMo's key names are in the comments.

use serde::{Deserialize, Serialize};

/// STFT centre padding. NeMo < 2.5 pads with `reflect` and counts `len / hop + 1` frames;
/// NeMo >= 2.5 (commit 0fd4de5; the 2.4.x wheels still reflect) pads with zeros, counts `len / hop` frames and zeroes the
/// signal past its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StftPadding {
    Reflect,
    Zeros,
}

/// Feature normalisation (`preprocessor.normalize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureNormalization {
    /// `per_feature`: per mel bin, mean and (N-1) std over the valid frames, std += 1e-5.
    PerFeature,
    /// `NA` (Sortformer): no normalisation.
    None,
}

/// `preprocessor` (`AudioToMelSpectrogramPreprocessor` -> `FilterbankFeatures`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureConfig {
    pub sample_rate_hz: u32,
    /// `window_size` * sample rate.
    pub win_length_samples: usize,
    /// `window_stride` * sample rate.
    pub hop_length_samples: usize,
    pub n_fft: usize,
    /// `features`.
    pub n_mels: usize,
    /// `preemph`; `None` disables preemphasis.
    pub preemphasis: Option<f32>,
    /// `mag_power`.
    pub mag_power: f32,
    /// `log_zero_guard_value` with guard type `add`.
    pub log_zero_guard: f32,
    pub normalization: FeatureNormalization,
    pub stft_padding: StftPadding,
    /// `lowfreq` / `highfreq` (Hz), used only when the checkpoint has no stored filterbank.
    pub low_freq_hz: f32,
    pub high_freq_hz: f32,
}

/// `encoder.self_attention_model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionModel {
    /// `rel_pos`: full relative-position attention.
    RelPos,
    /// `rel_pos_local_attn` with `att_context_size = [left, right]`.
    RelPosLocal { left: usize, right: usize },
}

/// `encoder` (`ConformerEncoder`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncoderConfig {
    /// `feat_in`.
    pub feat_in: usize,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    /// `d_model * ff_expansion_factor`.
    pub ff_hidden: usize,
    /// `subsampling_factor` (dw_striding: log2 of it stride-2 stages).
    pub subsampling_factor: usize,
    pub subsampling_conv_channels: usize,
    /// `xscaling`: multiply the subsampled input by sqrt(d_model).
    pub xscaling: bool,
    pub conv_kernel_size: usize,
    pub attention: AttentionModel,
    /// Whether the encoder's Linear/Conv layers carry biases (`use_bias`, confirmed against the
    /// state dict).
    pub use_bias: bool,
    /// LayerNorm and BatchNorm epsilon.
    pub layer_norm_eps: f32,
    pub batch_norm_eps: f32,
}

/// `decoder` (`RNNTDecoder`) and `joint` (`RNNTJoint`) plus the TDT decoding settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecoderConfig {
    /// Tokens excluding blank (`decoder.vocab_size`). Blank id == vocab_size.
    pub vocab_size: usize,
    /// `decoder.prednet.pred_hidden`.
    pub pred_hidden: usize,
    /// `decoder.prednet.pred_rnn_layers`.
    pub pred_rnn_layers: usize,
    /// `joint.jointnet.joint_hidden`.
    pub joint_hidden: usize,
    /// `model_defaults.tdt_durations` / `decoding.durations`, e.g. [0, 1, 2, 3, 4].
    pub durations: Vec<usize>,
    /// `decoding.greedy.max_symbols` (NeMo default 10).
    pub max_symbols_per_step: usize,
}

impl DecoderConfig {
    pub fn blank_id(&self) -> usize {
        self.vocab_size
    }
}

/// A whole Parakeet TDT model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParakeetConfig {
    pub features: FeatureConfig,
    pub encoder: EncoderConfig,
    pub decoder: DecoderConfig,
}

impl ParakeetConfig {
    /// Seconds per encoder frame (0.08 s for 10 ms hop and 8x subsampling).
    pub fn seconds_per_encoder_frame(&self) -> f64 {
        self.features.hop_length_samples as f64 * self.encoder.subsampling_factor as f64
            / self.features.sample_rate_hz as f64
    }
}
