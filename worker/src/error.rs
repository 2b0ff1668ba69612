use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum WorkerError {
    /// Loading or running the engine failed (the cause is kept).
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
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
        matches!(self, Self::Engine(e) if e.is_fatal())
    }
}

/// Exit status of a worker whose CUDA context hit a sticky fault.
pub const EXIT_CUDA_FATAL: i32 = 70;
/// Exit status of a worker that ran out of device memory: a restart frees what it (and, under
/// MPS, its group) held; a batch too large for the GPU fails at the supervisor's retry limit.
pub const EXIT_CUDA_OUT_OF_MEMORY: i32 = 71;
