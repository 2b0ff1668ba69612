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
    /// Causes `fault` on purpose, for fault drills (the worker's `--fault-injection`).
    /// Engines without a GPU have nothing to inject.
    fn inject_fault(&mut self, fault: Fault) -> Result<(), EngineError> {
        Err(EngineError::Unavailable {
            engine: self.name().to_owned(),
            reason: format!("fault injection ({fault:?}) needs a GPU engine"),
        })
    }
}

/// A GPU failure a fault drill causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A kernel stores to an unmapped address: the context's sticky illegal-address fault
    /// (under MPS, every client of the GPU's server sees it).
    IllegalAddress,
    /// The process takes all free device memory and holds it: its own and its MPS siblings'
    /// next allocations fail.
    OutOfMemory,
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
