//! Settings an ONNX export does not carry in its graphs: read from onnx-asr's `config.json`
//! and the graphs' metadata, with NeMo's defaults for the rest.

use std::path::Path;

use serde::Deserialize;

use crate::error::ModelError;
use model_core::config::{FeatureConfig, FeatureNormalization, StftPadding};

/// NeMo's `max_symbols` default for greedy TDT decoding.
pub(crate) const DEFAULT_MAX_SYMBOLS: usize = 10;
/// FastConformer's subsampling in every Parakeet model.
pub(crate) const DEFAULT_SUBSAMPLING: usize = 8;

/// onnx-asr's `config.json` (`{"model_type": "nemo-conformer-tdt", "features_size": 128,
/// "subsampling_factor": 8, "max_tokens_per_step": 10}`); unknown keys are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct OnnxAsrConfig {
    pub(crate) model_type: Option<String>,
    pub(crate) features_size: Option<usize>,
    pub(crate) subsampling_factor: Option<usize>,
    pub(crate) max_tokens_per_step: Option<usize>,
}

impl OnnxAsrConfig {
    pub(crate) fn read(file: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(file).map_err(|source| ModelError::Io {
            file: file.to_path_buf(),
            source,
        })?;
        let cfg: Self = serde_json::from_str(&text).map_err(|e| ModelError::InvalidConfig {
            file: file.to_path_buf(),
            key: "<document>".into(),
            problem: e.to_string(),
        })?;
        if let Some(t) = cfg.model_type.as_deref() {
            if !t.contains("tdt") {
                return Err(ModelError::UnsupportedConfig {
                    file: file.to_path_buf(),
                    key: "model_type".into(),
                    value: t.into(),
                });
            }
        }
        Ok(cfg)
    }
}

/// NeMo's default Parakeet preprocessor (`AudioToMelSpectrogramPreprocessor` as configured
/// for Parakeet TDT): 16 kHz, 25 ms Hann window, 10 ms hop, 512-point FFT, preemphasis 0.97,
/// power spectrum, `log(x + 2^-24)`, zero STFT padding (NeMo >= 2.4).
pub(crate) fn default_feature_config(
    n_mels: usize,
    normalization: FeatureNormalization,
) -> FeatureConfig {
    let sample_rate_hz = 16_000;
    FeatureConfig {
        sample_rate_hz,
        win_length_samples: 400,
        hop_length_samples: 160,
        n_fft: 512,
        n_mels,
        preemphasis: Some(0.97),
        mag_power: 2.0,
        log_zero_guard: 2f32.powi(-24),
        normalization,
        stft_padding: StftPadding::Zeros,
        low_freq_hz: 0.0,
        high_freq_hz: sample_rate_hz as f32 / 2.0,
    }
}

/// sherpa-onnx's `normalize_type` metadata.
pub(crate) fn normalization_from_metadata(
    file: &Path,
    value: Option<&str>,
) -> Result<FeatureNormalization, ModelError> {
    match value {
        None | Some("per_feature") => Ok(FeatureNormalization::PerFeature),
        Some("" | "NA" | "None") => Ok(FeatureNormalization::None),
        Some(other) => Err(ModelError::UnsupportedConfig {
            file: file.to_path_buf(),
            key: "normalize_type".into(),
            value: other.into(),
        }),
    }
}

/// A comma- or space-separated list of durations, e.g. `0,1,2,3,4` or `[0, 1, 2]`.
pub(crate) fn parse_durations(
    file: &Path,
    key: &str,
    text: &str,
) -> Result<Vec<usize>, ModelError> {
    text.trim_matches(|c| c == '[' || c == ']')
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse().map_err(|_| ModelError::InvalidConfig {
                file: file.to_path_buf(),
                key: key.into(),
                problem: format!("{text:?} is not a list of durations"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_duration_lists() {
        let f = Path::new("m.onnx");
        assert_eq!(
            parse_durations(f, "k", "0,1,2,3,4").expect("ok"),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(parse_durations(f, "k", "[0, 2, 4]").expect("ok"), [0, 2, 4]);
        assert!(parse_durations(f, "k", "0,x").is_err());
    }

    #[test]
    fn reads_onnx_asr_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.json");
        std::fs::write(
            &file,
            r#"{"model_type":"nemo-conformer-tdt","features_size":128,"subsampling_factor":8,"max_tokens_per_step":10}"#,
        )
        .expect("write");
        let cfg = OnnxAsrConfig::read(&file).expect("read");
        assert_eq!(cfg.features_size, Some(128));
        assert_eq!(cfg.max_tokens_per_step, Some(10));
        std::fs::write(&file, r#"{"model_type":"nemo-conformer-ctc"}"#).expect("write");
        assert!(matches!(
            OnnxAsrConfig::read(&file),
            Err(ModelError::UnsupportedConfig { .. })
        ));
    }
}
