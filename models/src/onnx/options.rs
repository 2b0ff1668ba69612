//! What the caller decides when loading an ONNX export.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use model_core::config::{FeatureConfig, StftPadding};

/// Where ONNX Runtime runs the graphs. GPU providers fail hard when they cannot be registered
/// (missing CUDA libraries, CPU-only wheel): a silent CPU fallback would hide a broken deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ExecutionProvider {
    #[default]
    Cpu,
    Cuda {
        device_id: i32,
    },
    /// TensorRT for what it can compile, CUDA for the rest (both required).
    TensorRt {
        device_id: i32,
    },
}

/// How log-mel features are computed.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureSource {
    /// The export's own preprocessor graph (onnx-asr `nemo128.onnx`) when the directory has
    /// one, otherwise [`FeatureSource::Native`] with the derived configuration.
    #[default]
    Auto,
    /// The Rust extractor ([`crate::features::FeatureExtractor`]) with the derived
    /// configuration (see [`super::OnnxModel::load`]).
    Native,
    /// The Rust extractor with exactly this configuration.
    NativeWith(FeatureConfig),
    /// The export's preprocessor graph; an error if the layout has none.
    Preprocessor,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OnnxOptions {
    pub execution_provider: ExecutionProvider,
    /// The ONNX Runtime library; `None`: `ORT_DYLIB_PATH`.
    pub dylib_path: Option<PathBuf>,
    /// Intra-op threads per session; `None`: ONNX Runtime's default (one per core).
    pub intra_threads: Option<usize>,
    /// Prefer the int8 graphs (`*.int8.onnx`) when the export has them.
    pub prefer_int8: bool,
    pub features: FeatureSource,
    /// The `.nemo` the export was made from; `None`: the one `*.nemo` in the export directory,
    /// if there is exactly one. Its preprocessor settings, stored filterbank and window,
    /// durations and `max_symbols` then take precedence over the defaults (not over the
    /// explicit options here). Loading it reads the whole checkpoint.
    pub nemo_checkpoint: Option<PathBuf>,
    /// STFT centre padding of the Rust extractor. `None`: the checkpoint's (decided by its
    /// `nemo_version`), else zeros, which is what NeMo >= 2.5 applies to every model; exports
    /// of models trained before NeMo 2.5 (Parakeet TDT 0.6B v2) saw reflect padding in training.
    pub stft_padding: Option<StftPadding>,
    /// TDT durations; `None`: from the graph metadata (`tdt_durations`) or `0..n_durations`.
    pub durations: Option<Vec<usize>>,
    /// Labels per frame before the decoder is forced on; `None`: `config.json`'s
    /// `max_tokens_per_step`, else NeMo's default 10.
    pub max_symbols_per_step: Option<usize>,
}
