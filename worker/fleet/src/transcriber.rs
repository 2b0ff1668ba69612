//! [`FleetTranscriber`]: the fleet behind the dispatcher's `Transcriber` shape (model id, frame
//! duration, segments in, transcripts out).

use std::time::Duration;

use model_core::timestamps::Timestamper;
use model_core::transcript::Transcript;

use worker_protocol::SharedPcm;

use crate::error::FleetError;
use crate::fleet::{Fleet, Priority};

pub struct FleetTranscriber {
    fleet: Fleet,
    timestamper: Timestamper,
    model_id: String,
    frame_s: f64,
}

impl FleetTranscriber {
    /// Waits up to `ready_timeout` for a worker, whose handshake supplies the vocabulary and
    /// frame timing (so this process never loads the weights).
    pub fn new(
        fleet: Fleet,
        model_id: String,
        ready_timeout: Duration,
    ) -> Result<Self, FleetError> {
        let info = fleet.wait_ready(ready_timeout)?;
        Ok(Self {
            fleet,
            timestamper: info.timestamper(),
            model_id,
            frame_s: info.frame_timing().seconds(1),
        })
    }

    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    pub fn frame_duration_s(&self) -> f64 {
        self.frame_s
    }

    /// One transcript per segment; the first failed segment fails the call. Each segment is
    /// copied once; [`FleetTranscriber::transcribe_with`] takes segments that share their
    /// recording.
    pub fn transcribe(&self, segments: &[&[f32]]) -> Result<Vec<Transcript>, FleetError> {
        let segments: Vec<SharedPcm> = segments.iter().map(|s| s.to_vec().into()).collect();
        self.transcribe_with(&segments, Priority::Batch)
    }

    /// As [`FleetTranscriber::transcribe`], at `priority` ([`Fleet::transcribe_with`]).
    pub fn transcribe_with(
        &self,
        segments: &[SharedPcm],
        priority: Priority,
    ) -> Result<Vec<Transcript>, FleetError> {
        self.fleet
            .transcribe_with(segments, priority)
            .into_iter()
            .zip(segments)
            .map(|(response, pcm)| {
                Ok(self
                    .timestamper
                    .transcript(&response?.hypothesis, pcm.len())?)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    /// The dispatcher shares transcribers across threads (`Arc<dyn Transcriber>`).
    #[test]
    fn transcriber_is_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<super::FleetTranscriber>();
    }
}
