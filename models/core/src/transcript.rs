//! What decoding produces and what renderers consume.

use serde::{Deserialize, Serialize};

pub use crate::scores::DecoderScores;

/// One emitted (non-blank) token, in encoder frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodedToken {
    /// Vocabulary id (never blank).
    pub id: u32,
    /// Encoder frame at which it was emitted.
    pub frame: usize,
    /// Predicted duration (encoder frames) that followed it.
    pub duration: usize,
}

/// The decoder's output for one utterance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hypothesis {
    pub tokens: Vec<DecodedToken>,
    /// How sure the decoder was (`None`: the engine did not score this utterance).
    pub scores: Option<DecoderScores>,
}

impl Hypothesis {
    /// What an utterance without encoder frames decodes to: no tokens, and scores with nothing
    /// in them (scored, as every engine's are).
    pub fn without_frames() -> Self {
        Self {
            tokens: Vec::new(),
            scores: Some(DecoderScores::default()),
        }
    }
}

/// A token with its text piece and time span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimedToken {
    pub id: u32,
    pub piece: String,
    /// Span in encoder frames, after punctuation snapping.
    pub start_frame: usize,
    pub end_frame: usize,
    pub start_s: f64,
    pub end_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Word {
    pub word: String,
    pub start_s: f64,
    pub end_s: f64,
    /// Speaker label when diarization ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub id: usize,
    pub start_s: f64,
    pub end_s: f64,
    pub text: String,
    pub tokens: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
    /// Mean natural log-probability of the segment's tokens ([`DecoderScores`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_logprob: Option<f64>,
    /// Mean probability of blank over the frames the segment spans ([`DecoderScores`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_speech_prob: Option<f64>,
}

/// A finished transcript of one recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    pub text: String,
    pub duration_s: f64,
    pub tokens: Vec<TimedToken>,
    pub words: Vec<Word>,
    pub segments: Vec<Segment>,
}

impl Transcript {
    /// `start_s..end_s` within the recording, `[0, duration_s]`, with start ≤ end.
    ///
    /// NeMo's times may end after the audio (a TDT duration runs past the last encoder frame,
    /// and encoder frames cover the padded tail), so documents clamp them; the transcript
    /// itself keeps NeMo's values. A NaN becomes 0; a non-finite duration bounds nothing.
    pub fn clamp_span(&self, start_s: f64, end_s: f64) -> (f64, f64) {
        let last = if self.duration_s.is_finite() {
            self.duration_s.max(0.0)
        } else {
            f64::INFINITY
        };
        let within = |t: f64| t.max(0.0).min(last);
        let end = within(end_s);
        (within(start_s).min(end), end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_span_keeps_times_in_the_recording() {
        let mut t = Transcript {
            text: String::new(),
            duration_s: 2.0,
            tokens: Vec::new(),
            words: Vec::new(),
            segments: Vec::new(),
        };
        assert_eq!(t.clamp_span(1.52, 2.08), (1.52, 2.0));
        assert_eq!(t.clamp_span(2.04, 2.08), (2.0, 2.0));
        assert_eq!(t.clamp_span(-0.1, 0.5), (0.0, 0.5));
        assert_eq!(t.clamp_span(0.7, 0.5), (0.5, 0.5), "start never after end");
        assert_eq!(t.clamp_span(f64::NAN, f64::NAN), (0.0, 0.0));
        t.duration_s = f64::NAN;
        assert_eq!(t.clamp_span(1.0, 9.0), (1.0, 9.0));
    }
}
