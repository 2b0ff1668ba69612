//! Speaker turns produced by diarization (the contract between the diarization model and the
//! transcript's speaker attribution and RTTM rendering), and the attribution itself.

use serde::{Deserialize, Serialize};

mod attribute;
mod timeline;

pub use attribute::{attribute_speakers, segment_word_ranges, AttributionOptions};
pub use timeline::SpeakerTimeline;

/// One speaker's active interval, after post-processing (onset/offset, padding, minimum
/// durations). Intervals of different speakers may overlap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeakerSegment {
    /// Speaker index as the model outputs it (0-based, `< max_speakers`).
    pub speaker: usize,
    pub start_s: f64,
    pub end_s: f64,
}

impl SpeakerSegment {
    /// The label written into transcripts and RTTM (`speaker_0`, `speaker_1`, ...).
    pub fn label(&self) -> String {
        speaker_label(self.speaker)
    }
}

/// The label of speaker index `speaker`.
pub fn speaker_label(speaker: usize) -> String {
    format!("speaker_{speaker}")
}
