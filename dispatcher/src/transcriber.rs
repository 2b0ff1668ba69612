//! The inference side, behind a trait: the pipeline hands over 16 kHz mono segments and gets
//! one transcript per segment back. Implementations are synchronous and run on a blocking
//! thread: an engine in this process ([`crate::in_process`]) or the fleet's workers
//! ([`crate::fleet_engine`]).

use model_core::transcript::Transcript;
/// Whether a person waits for the result (the HTTP API) or a queue of jobs does.
pub use worker_fleet::Priority;
pub use worker_fleet::SharedPcm;

use crate::error::Result;

pub trait Transcriber: Send + Sync {
    /// Identifies the model (and its weights) in result keys: a new id means new results.
    fn model_id(&self) -> &str;

    /// Seconds per encoder frame (to shift frame-indexed token spans between segments).
    fn frame_duration_s(&self) -> f64;

    /// One transcript per segment, timestamps relative to the segment start.
    fn transcribe(&self, segments: &[&[f32]]) -> Result<Vec<Transcript>>;

    /// As `transcribe`, at `priority`: an engine with a queue (the fleet) serves interactive
    /// segments before waiting batch ones. One call at a time engines have no queue to reorder.
    /// The segments share their recording's samples, so an engine in another process sends
    /// them without copying them first.
    fn transcribe_at(&self, segments: &[SharedPcm], priority: Priority) -> Result<Vec<Transcript>> {
        let _ = priority;
        let segments: Vec<&[f32]> = segments.iter().map(SharedPcm::as_slice).collect();
        self.transcribe(&segments)
    }

    /// Whether the engine can take work now. `Ok(false)` while every worker restarts (a GPU
    /// group after a fault): the consumer receives nothing meanwhile, since a message taken now
    /// would only wait with its visibility running. An error once it never will (the fleet
    /// gave up): this node stops taking work.
    fn ready(&self) -> Result<bool> {
        Ok(true)
    }

    /// How much work keeps this engine busy: the pipeline sizes its defaults from it.
    fn capacity(&self) -> Capacity {
        Capacity::ONE_CALL_AT_A_TIME
    }
}

/// What an engine takes at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Segments it works on or queues near the device at once (all its workers' batches).
    pub segments_in_flight: usize,
    /// Segments per `transcribe` call: enough to fill its batches, few enough to bound memory.
    pub segments_per_call: usize,
}

impl Capacity {
    /// An in-process engine: one call at a time, eight segments each.
    pub const ONE_CALL_AT_A_TIME: Capacity = Capacity {
        segments_in_flight: 1,
        segments_per_call: 8,
    };
}
