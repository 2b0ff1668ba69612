//! The engine crate's one error type; every variant keeps its cause.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{}", load_message(path, source))]
    Load {
        path: PathBuf,
        #[source]
        source: models::ModelError,
    },
    /// A requested engine this build or machine cannot provide. Never answered by falling back
    /// to another engine.
    #[error("engine `{engine}` is not available: {reason}")]
    Unavailable { engine: String, reason: String },
    #[error("inference failed: {0}")]
    Inference(#[source] models::ModelError),
    #[error("CUDA engine: {0}")]
    Cuda(#[source] cuda_engine::CudaEngineError),
    /// An utterance the engine would have to run with local attention, which it cannot.
    #[error(
        "a {seconds:.0} s utterance is over full_attention_max_s ({full_attention_max_s} s), \
         beyond which NeMo switches to local attention, and the {engine} engine cannot (its \
         export fixes the attention): use the cpu or cuda engine, or cut recordings with \
         max_segment_s"
    )]
    LocalAttentionUnsupported {
        engine: &'static str,
        seconds: f64,
        full_attention_max_s: f64,
    },
    #[error("engine returned {got} hypotheses for a batch of {expected} (bug)")]
    Contract { expected: usize, got: usize },
}

impl EngineError {
    /// The process cannot go on: its CUDA context is poisoned (a sticky fault, or MPS dropped
    /// the client).
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::Cuda(e) if e.is_sticky())
    }

    /// The GPU had no memory for this batch (or this MPS client's share had none).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Self::Cuda(e) if e.is_out_of_memory())
    }
}

/// `loading model PATH: cause`, naming the path once when the cause starts with it.
fn load_message(path: &std::path::Path, source: &models::ModelError) -> String {
    let path = path.display().to_string();
    let cause = source.to_string();
    match cause.strip_prefix(&path) {
        Some(rest) => format!("loading model {path}{rest}"),
        None => format!("loading model {path}: {cause}"),
    }
}
