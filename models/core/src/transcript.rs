//! What decoding produces and what renderers consume.

use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hypothesis {
    pub tokens: Vec<DecodedToken>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
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
