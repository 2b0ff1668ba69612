//! The models crate's one error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{file}: tensor `{name}` is missing")]
    MissingTensor { file: PathBuf, name: String },

    #[error("{file}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        file: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    #[error("decoding failed: {0}")]
    Decode(String),

    /// The `.nemo` tar (or its gzip wrapper) is unreadable: truncated, not a tar, bad member.
    #[error("{file}: bad archive: {problem}")]
    Archive { file: PathBuf, problem: String },

    #[error("{file}: archive member `{member}` is missing")]
    MissingMember { file: PathBuf, member: String },

    /// The torch checkpoint zip is corrupt or unsupported.
    #[error("{file}: bad zip: {problem}")]
    Zip { file: PathBuf, problem: String },

    /// `data.pkl` is corrupt or uses something outside the state-dict allowlist.
    #[error("{file}: bad pickle at byte {offset}: {problem}")]
    Pickle {
        file: PathBuf,
        offset: usize,
        problem: String,
    },

    /// A tensor's storage does not match its pickled description.
    #[error("{file}: tensor `{name}`: {problem}")]
    TensorData {
        file: PathBuf,
        name: String,
        problem: String,
    },

    /// A config value the model cannot run with (unknown option or unsupported variant).
    #[error("{file}: unsupported config `{key}` = {value}")]
    UnsupportedConfig {
        file: PathBuf,
        key: String,
        value: String,
    },

    /// A config value that is missing, of the wrong type, or inconsistent with another.
    #[error("{file}: invalid config `{key}`: {problem}")]
    InvalidConfig {
        file: PathBuf,
        key: String,
        problem: String,
    },

    #[error("{file}: bad vocabulary: {problem}")]
    Vocabulary { file: PathBuf, problem: String },

    /// The ONNX Runtime shared library could not be found or loaded.
    #[error(
        "ONNX Runtime unavailable: {problem}; install it with `pip install onnxruntime` and set \
         ORT_DYLIB_PATH to .../site-packages/onnxruntime/capi/libonnxruntime.so.<version>"
    )]
    OnnxRuntime { problem: String },

    /// A directory that matches none of the supported ONNX export layouts.
    #[error("{dir}: not a supported ONNX export: {problem} (found: {})", found.join(", "))]
    OnnxLayout {
        dir: PathBuf,
        problem: String,
        found: Vec<String>,
    },

    /// An ONNX model that cannot be loaded or run, or whose inputs/outputs are not as expected.
    #[error("{file}: {problem}")]
    Onnx { file: PathBuf, problem: String },

    /// A rule of the shared decoding loop or timestamps broken by an engine's output.
    #[error(transparent)]
    Core(#[from] model_core::CoreError),

    /// The path holds something other than the model kind expected (checkpoint::kind).
    #[error("{path}: this is {found}, not {expected}: {fix}")]
    WrongModel {
        path: PathBuf,
        found: String,
        expected: &'static str,
        fix: String,
    },

    #[error("{file}: {source}")]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
