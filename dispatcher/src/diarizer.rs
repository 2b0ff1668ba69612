//! The diarization side, behind a trait like [`crate::transcriber::Transcriber`]: the pipeline
//! hands over the whole recording's 16 kHz mono PCM and gets speaker turns back. The model
//! streams over the recording in bounded memory, so it sees the recording whole (speaker
//! identities stay consistent across the transcriber's segments). Implementations are
//! synchronous and run on a blocking thread: in this process ([`crate::in_process`]) or in the
//! fleet's workers ([`crate::fleet_engine`]).

use model_core::speakers::SpeakerSegment;

use crate::error::Result;
use crate::transcriber::SharedPcm;

pub trait Diarizer: Send + Sync {
    /// Identifies the model (and its weights) in result keys, next to the transcriber's id.
    fn model_id(&self) -> &str;

    /// Speaker turns of the whole recording, in seconds from its start. The samples are
    /// shared, so an engine in another process sends them without copying them first.
    fn diarize(&self, pcm_16k: &SharedPcm) -> Result<Vec<SpeakerSegment>>;
}
