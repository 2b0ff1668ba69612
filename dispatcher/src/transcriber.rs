//! The inference side, behind a trait: the pipeline hands over 16 kHz mono segments and gets
//! one transcript per segment back. Implementations are synchronous and run on a blocking
//! thread; the in-process CPU engine is the first one, GPU worker processes come later.

use model_core::transcript::{Segment, TimedToken, Transcript, Word};

use crate::error::Result;

pub trait Transcriber: Send + Sync {
    /// Identifies the model (and its weights) in result keys: a new id means new results.
    fn model_id(&self) -> &str;

    /// Seconds per encoder frame (to shift frame-indexed token spans between segments).
    fn frame_duration_s(&self) -> f64;

    /// One transcript per segment, timestamps relative to the segment start.
    fn transcribe(&self, segments: &[&[f32]]) -> Result<Vec<Transcript>>;

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

/// A segment's transcript and where the segment starts in the recording.
pub struct Piece {
    pub offset_s: f64,
    /// Encoder frames before this segment (for frame-indexed token spans).
    pub offset_frames: usize,
    pub transcript: Transcript,
}

/// Joins per-segment transcripts into one, shifting times (and frames) by each segment's
/// start and renumbering segments.
pub fn stitch(pieces: Vec<Piece>, duration_s: f64) -> Transcript {
    let mut out = Transcript {
        text: String::new(),
        duration_s,
        tokens: Vec::new(),
        words: Vec::new(),
        segments: Vec::new(),
    };
    let mut texts = Vec::new();
    for piece in pieces {
        let (dt, df) = (piece.offset_s, piece.offset_frames);
        let t = piece.transcript;
        let text = t.text.trim();
        if !text.is_empty() {
            texts.push(text.to_owned());
        }
        out.tokens
            .extend(t.tokens.into_iter().map(|tok| TimedToken {
                start_frame: tok.start_frame + df,
                end_frame: tok.end_frame + df,
                start_s: tok.start_s + dt,
                end_s: tok.end_s + dt,
                ..tok
            }));
        out.words.extend(t.words.into_iter().map(|w| Word {
            start_s: w.start_s + dt,
            end_s: w.end_s + dt,
            ..w
        }));
        for seg in t.segments {
            let id = out.segments.len();
            out.segments.push(Segment {
                id,
                start_s: seg.start_s + dt,
                end_s: seg.end_s + dt,
                ..seg
            });
        }
    }
    out.text = texts.join(" ");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(offset_s: f64, offset_frames: usize, word: &str) -> Piece {
        Piece {
            offset_s,
            offset_frames,
            transcript: Transcript {
                text: format!(" {word}"),
                duration_s: 2.0,
                tokens: vec![TimedToken {
                    id: 7,
                    piece: word.into(),
                    start_frame: 1,
                    end_frame: 3,
                    start_s: 0.08,
                    end_s: 0.24,
                }],
                words: vec![Word {
                    word: word.into(),
                    start_s: 0.08,
                    end_s: 0.24,
                    speaker: None,
                }],
                segments: vec![Segment {
                    id: 0,
                    start_s: 0.08,
                    end_s: 0.24,
                    text: word.into(),
                    tokens: vec![7],
                    speaker: None,
                }],
            },
        }
    }

    #[test]
    fn stitch_shifts_times_and_renumbers() {
        let t = stitch(
            vec![piece(0.0, 0, "hello"), piece(10.0, 125, "world")],
            12.0,
        );
        assert_eq!(t.text, "hello world");
        assert_eq!(t.duration_s, 12.0);
        assert_eq!(t.words[1].start_s, 10.08);
        assert_eq!(t.tokens[1].start_frame, 126);
        assert_eq!(
            t.segments.iter().map(|s| s.id).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(t.segments[1].end_s, 10.24);
    }
}
