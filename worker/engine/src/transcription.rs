//! The transcription engine trait. Engines are synchronous; the worker runs one on its own OS
//! thread, the dispatcher's in-process mode behind a lock.

use model_core::transcript::Hypothesis;
use worker_protocol::{DeviceReport, ModelInfo};

use crate::error::EngineError;

pub trait Engine: Send {
    fn name(&self) -> &'static str;
    fn model_info(&self) -> ModelInfo;
    /// The GPU this engine runs on (`None`: no GPU).
    fn device(&self) -> Option<DeviceReport> {
        None
    }
    /// One hypothesis per clip, in order. Must equal each clip's hypothesis alone.
    fn transcribe(&mut self, batch: &[&[f32]]) -> Result<Vec<Hypothesis>, EngineError>;
    /// Samples per feature frame (the batching cost unit).
    fn hop_samples(&self) -> usize;
}

/// An engine's answer for a batch: exactly one hypothesis per clip, or a contract error.
pub(crate) fn one_per_clip(
    batch: &[&[f32]],
    hyps: Vec<Hypothesis>,
) -> Result<Vec<Hypothesis>, EngineError> {
    if hyps.len() != batch.len() {
        return Err(EngineError::Contract {
            expected: batch.len(),
            got: hyps.len(),
        });
    }
    Ok(hyps)
}
