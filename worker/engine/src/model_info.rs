//! The handshake's model description ([`ModelInfo`]) of a loaded checkpoint.

use model_core::config::ParakeetConfig;
use models::sortformer::SortformerConfig;
use worker_protocol::ModelInfo;

/// A Parakeet checkpoint's description: vocabulary and frame timing.
pub fn parakeet(path: &str, vocabulary: &[String], cfg: &ParakeetConfig) -> ModelInfo {
    ModelInfo {
        path: path.to_owned(),
        vocabulary: vocabulary.to_vec(),
        window_stride_s: cfg.features.hop_length_samples as f64
            / f64::from(cfg.features.sample_rate_hz),
        subsampling_factor: cfg.encoder.subsampling_factor as u32,
        sample_rate_hz: cfg.features.sample_rate_hz,
    }
}

/// A Sortformer checkpoint's description (no vocabulary).
pub fn sortformer(path: &str, cfg: &SortformerConfig) -> ModelInfo {
    ModelInfo {
        path: path.to_owned(),
        vocabulary: Vec::new(),
        window_stride_s: cfg.features.hop_length_samples as f64
            / f64::from(cfg.features.sample_rate_hz),
        subsampling_factor: cfg.encoder.subsampling_factor as u32,
        sample_rate_hz: cfg.features.sample_rate_hz,
    }
}
