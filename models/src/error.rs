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

    #[error("{file}: {source}")]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
