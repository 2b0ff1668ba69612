//! The diarization engine trait: a whole recording in, speaker turns out. Streaming Sortformer
//! keeps per-recording state (speaker cache, FIFO), so an engine works on one recording at a
//! time; a diarization worker's batcher runs batches of one.

use model_core::speakers::SpeakerSegment;
use worker_protocol::{DeviceReport, ModelInfo};

use crate::error::EngineError;

pub trait DiarizationEngine: Send {
    fn name(&self) -> &'static str;
    fn model_info(&self) -> ModelInfo;
    /// The GPU this engine runs on (`None`: no GPU).
    fn device(&self) -> Option<DeviceReport> {
        None
    }
    /// Speaker turns of one whole 16 kHz mono recording, in seconds from its start.
    fn diarize(&mut self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>, EngineError>;
    /// Samples per feature frame (the queue's cost unit).
    fn hop_samples(&self) -> usize;
}
