use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("loading model {path}: {source}")]
    Load {
        path: PathBuf,
        #[source]
        source: models::ModelError,
    },
    /// A requested engine this build or machine cannot provide. Never answered by falling back
    /// to another engine: a GPU worker silently running on the CPU would be a wrong fleet.
    #[error("engine `{engine}` is not available: {reason}")]
    EngineUnavailable { engine: String, reason: String },
    #[error("inference failed: {0}")]
    Inference(#[source] models::ModelError),
    #[error("engine returned {got} hypotheses for a batch of {expected} (bug)")]
    EngineContract { expected: usize, got: usize },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
