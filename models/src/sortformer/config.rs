//! `model_config.yaml` of a Sortformer `.nemo` → [`SortformerConfig`]. The preprocessor and
//! FastConformer sections go through the shared Parakeet parser; the speaker head
//! (`sortformer_modules`), the transformer (`transformer_encoder`) and the streaming settings are
//! read here. Absent keys take the defaults of the NeMo class they configure.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::checkpoint::yaml::ConfigYaml;
use crate::error::ModelError;
use model_core::config::{EncoderConfig, FeatureConfig};

/// `transformer_encoder` (NeMo `TransformerEncoder`, post-LN, no positional encoding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransformerConfig {
    /// `num_layers`.
    pub n_layers: usize,
    /// `hidden_size` (also `model_defaults.tf_d_model`).
    pub hidden: usize,
    /// `inner_size`.
    pub inner: usize,
    /// `num_attention_heads`.
    pub n_heads: usize,
}

/// Streaming settings of `sortformer_modules`, all in 80 ms diarization frames (encoder frames).
/// NeMo keeps them in the checkpoint config; callers may override them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamingParams {
    /// `chunk_len`: frames predicted per step.
    pub chunk_len_frames: usize,
    /// `chunk_left_context` / `chunk_right_context`: extra frames of audio on each side of a
    /// chunk, run through the model but not predicted for.
    pub chunk_left_context_frames: usize,
    pub chunk_right_context_frames: usize,
    /// `fifo_len`: most recent pre-encoded frames kept verbatim.
    pub fifo_len_frames: usize,
    /// `spkcache_len`: frames kept by the speaker cache after compression.
    pub spkcache_len_frames: usize,
    /// `spkcache_update_period`: frames moved from the FIFO to the cache on an overflow.
    pub spkcache_update_period_frames: usize,
    /// `spkcache_sil_frames_per_spk`: slots per speaker filled with the mean silence embedding.
    pub spkcache_sil_frames_per_spk: usize,
    /// `pred_score_threshold`: probabilities are clamped to at least this before the log score.
    pub pred_score_threshold: f32,
    /// `scores_boost_latest`: score bonus of frames newly added to the cache.
    pub scores_boost_latest: f32,
    /// `sil_threshold`: a frame is silence when its speaker probabilities sum below this.
    pub sil_threshold: f32,
    /// `strong_boost_rate` / `weak_boost_rate` / `min_pos_scores_rate`: fractions of the per-speaker
    /// cache share that get the strong and weak score boosts, and the positive-score count that
    /// disables a speaker's non-positive scores.
    /// (f64: NeMo floors `share × rate` in Python floats.)
    pub strong_boost_rate: f64,
    pub weak_boost_rate: f64,
    pub min_pos_scores_rate: f64,
}

/// A whole Sortformer diarizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SortformerConfig {
    pub features: FeatureConfig,
    pub encoder: EncoderConfig,
    pub transformer: TransformerConfig,
    /// `sortformer_modules.num_spks` (`max_num_of_spks`).
    pub num_speakers: usize,
    pub streaming: StreamingParams,
    /// `streaming_mode`: streaming models do not peak-normalise the waveform.
    pub streaming_mode: bool,
    /// Added to the peak before offline peak normalisation (`eps`, NeMo default 1e-3).
    pub peak_normalization_eps: f32,
}

impl SortformerConfig {
    /// Seconds per diarization frame (0.08 s for a 10 ms hop and 8x subsampling).
    pub fn seconds_per_frame(&self) -> f64 {
        self.features.hop_length_samples as f64 * self.encoder.subsampling_factor as f64
            / self.features.sample_rate_hz as f64
    }

    /// Whether `encoder_proj` exists: NeMo drops it when the two widths agree.
    pub fn has_encoder_projection(&self) -> bool {
        self.encoder.d_model != self.transformer.hidden
    }
}

/// Parses a Sortformer `model_config.yaml`. `file` is the name used in errors.
pub(crate) fn parse(text: &str, file: &Path) -> Result<SortformerConfig, ModelError> {
    let y = ConfigYaml::parse(text, file)?;
    let (features, encoder, _nemo_version) = crate::checkpoint::parse_frontend(&y)?;
    y.target("sortformer_modules", "SortformerModules")?;
    y.target("transformer_encoder", "TransformerEncoder")?;

    let t = |k: &str| format!("transformer_encoder.{k}");
    let hidden = y.positive_or(&t("hidden_size"), 192)?;
    let n_heads = y.positive_or(&t("num_attention_heads"), 1)?;
    if !hidden.is_multiple_of(n_heads) {
        return Err(y.invalid(
            &t("num_attention_heads"),
            format!("{n_heads} heads do not divide hidden_size {hidden}"),
        ));
    }
    let act = y.str_opt(&t("hidden_act"))?.unwrap_or("relu");
    if act != "relu" {
        return Err(y.unsupported(&t("hidden_act"), act));
    }
    if y.bool_or(&t("pre_ln"), false)? {
        return Err(y.unsupported(&t("pre_ln"), true));
    }
    if y.bool_or(&t("mask_future"), false)? {
        return Err(y.unsupported(&t("mask_future"), true));
    }
    let transformer = TransformerConfig {
        n_layers: y.usize_or(&t("num_layers"), 0)?,
        hidden,
        inner: y.positive_or(&t("inner_size"), 4 * hidden)?,
        n_heads,
    };

    let m = |k: &str| format!("sortformer_modules.{k}");
    for (key, width) in [
        (m("tf_d_model"), hidden),
        ("model_defaults.tf_d_model".to_string(), hidden),
        (m("fc_d_model"), encoder.d_model),
        ("model_defaults.fc_d_model".to_string(), encoder.d_model),
        (m("subsampling_factor"), encoder.subsampling_factor),
    ] {
        if let Some(n) = y.u64_if_integer(&key) {
            if n as usize != width {
                return Err(y.invalid(&key, format!("{n} differs from the model's {width}")));
            }
        }
    }
    let num_speakers = y.positive_or(&m("num_spks"), 4)?;
    if let Some(n) = y.u64_if_integer("max_num_of_spks") {
        if n as usize != num_speakers {
            return Err(y.invalid(
                "max_num_of_spks",
                format!("{n} differs from sortformer_modules.num_spks = {num_speakers}"),
            ));
        }
    }
    let streaming = StreamingParams {
        chunk_len_frames: y.usize_or(&m("chunk_len"), 188)?,
        chunk_left_context_frames: y.usize_or(&m("chunk_left_context"), 1)?,
        chunk_right_context_frames: y.usize_or(&m("chunk_right_context"), 1)?,
        fifo_len_frames: y.usize_or(&m("fifo_len"), 0)?,
        spkcache_len_frames: y.usize_or(&m("spkcache_len"), 188)?,
        spkcache_update_period_frames: y.usize_or(&m("spkcache_update_period"), 188)?,
        spkcache_sil_frames_per_spk: y.usize_or(&m("spkcache_sil_frames_per_spk"), 3)?,
        pred_score_threshold: y.finite_f32_or(&m("pred_score_threshold"), 0.25)?,
        scores_boost_latest: y.finite_f32_or(&m("scores_boost_latest"), 0.05)?,
        sil_threshold: y.finite_f32_or(&m("sil_threshold"), 0.2)?,
        strong_boost_rate: y.finite_f64_or(&m("strong_boost_rate"), 0.75)?,
        weak_boost_rate: y.finite_f64_or(&m("weak_boost_rate"), 1.5)?,
        min_pos_scores_rate: y.finite_f64_or(&m("min_pos_scores_rate"), 0.5)?,
    };
    if y.bool_or("async_streaming", false)? {
        // NeMo's batched "async" update keeps fixed-size zero-padded buffers and treats the
        // cache's probabilities as zeros before its first compression; for one recording the
        // synchronous update (NeMo's default) is the reference this engine reproduces.
        tracing::warn!(
            file = %file.display(),
            "async_streaming: true in the config; running NeMo's synchronous streaming update, \
             whose cache choices can differ slightly from the asynchronous one"
        );
    }
    let config = SortformerConfig {
        features,
        encoder,
        transformer,
        num_speakers,
        streaming,
        streaming_mode: y.bool_or("streaming_mode", false)?,
        peak_normalization_eps: y.finite_f32_or("eps", 1e-3)?,
    };
    config
        .streaming
        .check(num_speakers)
        .map_err(|(key, problem)| y.invalid(&m(key), problem))?;
    Ok(config)
}

impl StreamingParams {
    /// NeMo's `_check_streaming_parameters`, as errors: `(sortformer_modules key, problem)`.
    pub fn check(&self, num_speakers: usize) -> Result<(), (&'static str, String)> {
        let min_cache = (1 + self.spkcache_sil_frames_per_spk) * num_speakers;
        if self.spkcache_len_frames < min_cache {
            return Err((
                "spkcache_len",
                format!(
                    "{} is below (1 + spkcache_sil_frames_per_spk) x speakers = {min_cache}",
                    self.spkcache_len_frames
                ),
            ));
        }
        if self.chunk_len_frames == 0 {
            return Err(("chunk_len", "must be positive".into()));
        }
        if self.spkcache_update_period_frames == 0 {
            return Err(("spkcache_update_period", "must be positive".into()));
        }
        Ok(())
    }
}
