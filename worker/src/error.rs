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
    #[error("CUDA engine: {0}")]
    Cuda(#[source] cuda_engine::CudaEngineError),
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

impl WorkerError {
    /// The process cannot go on: its CUDA context is poisoned (a sticky fault, or MPS dropped
    /// the client). The worker exits with [`EXIT_CUDA_FATAL`] so the supervisor restarts its
    /// GPU group.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::Cuda(e) if e.is_sticky())
    }
}

/// Exit status of a worker whose CUDA context hit a sticky fault.
pub const EXIT_CUDA_FATAL: i32 = 70;
